"""Schedules: the pipeline bubble, step time and peak activation memory against the number
of micro-batches, for each schedule train runs, measured on a 2-stage pipeline beside the
simulator's prediction for the measured stage times and the balanced-stage formula; and,
for 4 and 8 stages, the simulator alone (unit costs, and costs profiled on this machine by
`plan`) against the published bubble and memory of each schedule (issue 26's table)."""
import json
import os
import re
import subprocess
import time

from . import common

TITLE = 'Schedules'
CANDIDATES = ['gpipe', '1f1b', 'interleaved', 'zb-h1', 'zb-h2', 'zb-v', 'v-half', 'v-min',
              'dualpipev', 'search']
QUICK = ['1f1b', 'interleaved', 'zb-h1', 'zb-v', 'search']
# what each schedule needs beyond its name: interleaved runs 2 model chunks per rank (the V
# schedules take 2 by default)
EXTRA = {'interleaved': ['--virtual', 2]}
# the V schedules: two model chunks per rank
VEE = ('interleaved', 'zb-v', 'v-half', 'v-min', 'dualpipev')


def min_micro(s, K):
    """The fewest micro-batches schedule s runs with on K stages (DualPipeV: 2K)."""
    return 2 * K if s == 'dualpipev' else 1


def runnable(ctx):
    """The schedules this build's train accepts (later issues add some)."""
    ok = []
    for s in CANDIDATES:
        r = subprocess.run([ctx.pipetrain, 'train', '--model', 'models/seed-mlp.cfg', '--stages',
                            '1', '--schedule', s, '--steps', '1', '--batch', '32', '--train-samples', '64',
                            '--test-samples', '0', '--microbatches', '2', '--json'], cwd=common.ROOT,
                           capture_output=True, text=True)
        if r.returncode == 0:
            ok.append(s)
    return ok


def run(ctx):
    steps, warmup, samples = common.sizes(ctx.quick, (40, 5, 60000), (1, 1, 512))
    micro = [4] if ctx.quick else [2, 4, 8, 16]
    scheds = runnable(ctx)
    rows, lines = [], {}
    # --quick (the tests run it): one schedule of each family measured, every one simulated
    measured = [s for s in scheds if not ctx.quick or s in QUICK]
    for s in measured:
        for m in micro:
            if m < min_micro(s, 2):
                continue
            args = ['--model', 'models/seed-cnn.cfg', '--batch', 128, '--stages', 2,
                    '--schedule', s, *EXTRA.get(s, []), '--microbatches', m, '--threads', 1,
                    '--steps',
                    steps + warmup, '--untimed-steps', warmup, '--train-samples', samples,
                    '--test-samples', 0, '--optimizer', 'adam', '--lr', '0.001']
            r = ctx.train('seed-cnn K=2 %s M=%d' % (s, m), args, 2)
            act = [b / 1e6 for b in r['stage_peak_act_bytes']]
            rows.append([s, m, r.get('bubble'), r.get('bubble_simulated'), r.get('bubble_theory'),
                         common.step_ms(r), 1e3 * r['step_predicted_s'] if r.get('step_predicted_s') else None,
                         ' / '.join('%.1f' % a for a in act)])
            lines.setdefault(s, []).append((m, r.get('bubble'), r.get('bubble_simulated'),
                                            r.get('bubble_theory'), max(act)))
    skipped = [s for s in CANDIDATES if s not in scheds]
    md = common.table(['schedule', 'M', 'bubble measured', 'bubble simulated',
                       'formula for balanced stages (share of the step)',
                       'step ms', 'step ms simulated', 'peak activations MB per stage'], rows)
    if skipped:
        md += '\nNot measured (train does not run them in this build): %s.\n' % ', '.join(skipped)
    md += ('\nMeasured on a machine shared with other jobs (2 cores, 2 ranks): the step times '
           'and measured bubbles above are not trustworthy to better than tens of per cent; '
           'the simulated columns and the peak activations are.\n')
    md += simulated(ctx, scheds)
    if ctx.plot:
        md += '\n![bubble and memory against micro-batches](%s)\n' % draw(ctx, lines)
        same = coincident(lines, 3, 'the formula') + coincident(lines, 4, 'the peak activations')
        if same:
            md += ('\nLines that coincide in the figure (equal at every M; their markers are '
                   'set a little apart sideways, and each schedule has its own marker): %s.\n'
                   % '; '.join(same))
    return md


MARKERS = {'gpipe': 'o', '1f1b': 's', 'interleaved': '^', 'zb-h1': 'D', 'zb-h2': 'v',
           'zb-v': 'P', 'v-half': 'X', 'v-min': '<', 'dualpipev': '>', 'search': '*'}


def coincident(lines, idx, what):
    """Groups of schedules whose series idx is the same at every M (within 0.5%)."""
    groups, seen = [], set()
    names = list(lines)
    for i, a in enumerate(names):
        if a in seen:
            continue
        same = [a]
        for b in names[i + 1:]:
            pa, pb = lines[a], lines[b]
            if len(pa) == len(pb) and all(
                    x[0] == y[0] and x[idx] is not None and y[idx] is not None
                    and abs(x[idx] - y[idx]) <= 0.005 * max(abs(x[idx]), abs(y[idx]), 1e-12)
                    for x, y in zip(pa, pb)):
                same.append(b)
        if len(same) > 1:
            seen.update(same)
            groups.append('%s: %s' % (what, ' and '.join(same)))
    return groups


def draw(ctx, lines):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    n = len(lines)
    for i, (s, pts) in enumerate(lines.items()):
        c, mk = 'C%d' % i, MARKERS.get(s, 'o')
        # set each schedule's points a little apart sideways (up to ±6% of M), so
        # that schedules with equal values stay visible; later schedules are drawn on top
        m = [p[0] * 2 ** (0.055 * (i - (n - 1) / 2)) for p in pts]
        z = 2 + i
        a.plot(m, [p[1] for p in pts], '-', marker=mk, color=c, zorder=z)
        a.plot(m, [p[2] for p in pts], '--', marker=mk, mfc='white', color=c, zorder=z)
        a.plot(m, [p[3] for p in pts], ':', color=c, lw=1.5, zorder=z)
        # measured; markers shrink from the first schedule to the last, drawn on top
        b.plot(m, [p[4] for p in pts], '-', marker=mk, color=c, zorder=z,
               ms=max(3.5, 9 - 0.6 * i))
    ms = sorted({p[0] for pts in lines.values() for p in pts})
    for ax in (a, b):
        ax.set_xscale('log', base=2)
        ax.set_xticks(ms)
        ax.set_xticklabels([str(x) for x in ms])
        ax.minorticks_off()
        ax.set_xlabel('micro-batches M (K = 2 stages, batch 128)')
        ax.grid(alpha=0.3)
    a.set_ylabel('bubble (idle share of the step)')
    a.set_ylim(bottom=0)
    a.set_title('bubble', fontsize=10)
    b.set_ylabel('peak activation MB (largest stage)')
    b.set_ylim(bottom=0)
    b.set_title('activation memory (measured)', fontsize=10)
    sched = [Line2D([], [], color='C%d' % i, marker=MARKERS.get(s, 'o'), label=s)
             for i, s in enumerate(lines)]
    kinds = [Line2D([], [], color='gray', ls='-', marker='o', label='measured'),
             Line2D([], [], color='gray', ls='--', marker='o', mfc='white',
                    label='simulated (measured stage times)'),
             Line2D([], [], color='gray', ls=':', label='formula, balanced stages')]
    leg = fig.legend(handles=sched, loc='upper center', bbox_to_anchor=(0.3, 0.0),
                     ncol=(len(sched) + 1) // 2,
                     fontsize=8, frameon=False, title='schedule', title_fontsize=8)
    fig.add_artist(leg)
    fig.legend(handles=kinds, loc='upper center', bbox_to_anchor=(0.75, 0.0), ncol=1, fontsize=8,
               frameon=False, title='bubble panel: line style', title_fontsize=8)
    return ctx.figure(fig, 'schedules')


# ---- 4 and 8 stages: the simulator against the published figures ----------------------

DEEP = '; the study\'s deep MLP: 17 dense layers, enough for 8 stages x 2 chunks\n[net]\ninput=1,28,28\n' + \
    ''.join('\n[dense]\nunits=512\nactivation=relu\n' for _ in range(16)) + \
    '\n[dense]\nunits=10\nactivation=linear\n'


def published_bubble(s, K, M):
    """The published bubble of s at F = B = W (issue 26's table and the papers): a share of
    the step, or ('span', slots) where the paper counts the idle inside one stage's span
    (first op to step) in chunk-op slots, or None where none is published."""
    one = (K - 1) / (M + K - 1)
    return {'gpipe': one, '1f1b': one, 'interleaved': (K - 1) / (2 * M + K - 1),
            'zb-h1': (K - 1) / (3 * M + K - 1), 'zb-h2': ('span', 0), 'zb-v': ('span', 0),
            # the table, B/2 and 2B/3 (+ O(n)), read as shares of 1F1B's bubble B
            'v-half': one / 2, 'v-min': 2 * one / 3,
            # DualPipeV: (K/2 - 1)(F&B + B - 3W) with F&B = F + B run back to back here,
            # B the whole backward (b + w = 2 slots), F = W = 1
            'dualpipev': ('span', (K // 2 - 1) * (3 + 2 - 3))}.get(s)


def published_peak(s, K, M):
    """Micro-batches of activations the largest stage holds, published (1F1B holds K)."""
    return {'gpipe': M, '1f1b': K, 'zb-h1': K, 'zb-h2': 2 * K - 1, 'zb-v': K,
            'v-half': K / 2, 'v-min': K / 3, 'dualpipev': K + 1}.get(s)


def schedule_report(ctx, K, M, s):
    """`pipetrain schedule` at unit costs: its bubble, the idle inside a stage's span and
    the verifier's peak per stage, parsed from its report (recorded as a prediction)."""
    cmd = [ctx.pipetrain, 'schedule', '--stages', str(K), '--microbatches', str(M),
           '--schedule', s] + [str(a) for a in EXTRA.get(s, [])]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True)
    if r.returncode:
        raise common.StudyError('%s failed (exit %d):\n%s' % (' '.join(cmd), r.returncode,
                                                               r.stderr[-2000:]))
    out = r.stdout
    bub = re.search(r'^bubble \(idle share of the step\): ([0-9.]+) simulated', out, re.M)
    span = re.search(r'^most idle inside one stage\'s span[^:]*: ([0-9.]+) slots', out, re.M)
    peak = re.search(r'^verified: .*peak micro-batches held per stage( \(per chunk\))?: (.*)$',
                     out, re.M)
    if not (bub and peak):
        raise common.StudyError('cannot read the report of %s' % ' '.join(cmd))
    per_chunk = peak.group(1) is not None
    held = [int(x) for x in re.findall(r'(?:^|\s)(\d+)(?= \(|\s|$)', peak.group(2))]
    # V schedules count chunk activations, half a micro-batch's each at 2 chunks per rank
    res = {'schedule': s, 'stages': K, 'microbatches': M, 'bubble': float(bub.group(1)),
           'idle_in_span_slots': float(span.group(1)) if span else None,
           'held_per_stage': held, 'peak_microbatches': max(held) / (2 if per_chunk else 1)}
    ctx._record('predicted', 'schedule K=%d M=%d %s' % (K, M, s), cmd, res, K,
                time.perf_counter() - t0)
    return res


def fmt_bubble(p):
    if p is None:
        return '—'
    if isinstance(p, tuple):
        return '%g slots in span' % p[1]
    return '%.3f' % p


def simulated(ctx, scheds):
    """The table for K = 4 and 8 (quick: K = 4, profiled costs for three schedules)."""
    deep = os.path.join(ctx.results, 'deep-mlp.cfg')
    with open(deep, 'w') as f:
        f.write(DEEP)
    rows, kept = [], {}
    for K in ([4] if ctx.quick else [4, 8]):
        M = 2 * K
        for s in scheds:
            u = schedule_report(ctx, K, M, s)
            prof = None
            if not ctx.quick or s in ('1f1b', 'zb-v', 'search'):
                prof = ctx.plan('plan deep-mlp K=%d M=%d %s' % (K, M, s),
                                ['--model', deep, '--stages', K, '--microbatches', M,
                                 '--schedule', s, *EXTRA.get(s, [])])['predicted']
            kept[(K, s)] = (u, prof)
            pb = published_bubble(s, K, M)
            rows.append([K, M, s, '%.3f' % u['bubble'],
                         '%g' % u['idle_in_span_slots'] if u['idle_in_span_slots'] is not None else '—',
                         fmt_bubble(pb), '%g' % u['peak_microbatches'],
                         '%g' % published_peak(s, K, M) if published_peak(s, K, M) is not None else '—',
                         '%.3f' % prof['bubble'] if prof else '—',
                         '%.2f' % (1e3 * prof['step_s']) if prof else '—',
                         (prof.get('schedule_origin') or '') if prof and s == 'search' else ''])
    md = ('\n### 4 and 8 stages, simulated (M = 2K)\n\nNot measured: `pipetrain schedule` at unit '
          'costs (F = b = w = 1 slot per chunk op, messages free) and `pipetrain plan` with the '
          'layer times profiled on this machine (a 17-layer MLP, %s written beside the runs, partitioned by time; '
          'messages priced by plan) against the published figures (issue 26\'s table: ZB-H2 and '
          'ZB-V a bubble of 0 inside each stage\'s span, V-Half and V-Min ½ and ⅔ of 1F1B\'s '
          'bubble + O(n), DualPipeV (K/2−1)(F&B + B − 3W) slots; memory in micro-batches of '
          'activations on the largest stage, V schedules\' chunk activations counted as half '
          'a micro-batch each).\n\n' % os.path.basename(deep))
    md += common.table(['K', 'M', 'schedule', 'bubble, unit costs', 'idle in span (slots)',
                        'bubble published', 'peak micro-batches', 'published peak',
                        'bubble, profiled costs', 'step ms, profiled', 'search picked'], rows)
    for K in ([4] if ctx.quick else [4, 8]):
        a, b = kept.get((K, 'zb-v')), kept.get((K, '1f1b'))
        if a and b:
            md += ('\nK = %d: zb-v\'s unit-cost bubble is %.2f× 1F1B\'s (target ≤ 0.5) at a peak '
                   'of %g micro-batches against %g' % (K, a[0]['bubble'] / b[0]['bubble'],
                                                       a[0]['peak_microbatches'],
                                                       b[0]['peak_microbatches']))
            if a[1] and b[1]:
                md += '; at profiled costs its step is %.2f× 1F1B\'s speed' % (
                    b[1]['step_s'] / a[1]['step_s'])
            md += '.\n'
    return md
