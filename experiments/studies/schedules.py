"""Schedules: the pipeline bubble, step time and peak activation memory against the number
of micro-batches, for each schedule train runs, measured on a 2-stage pipeline beside the
simulator's prediction for the measured stage times and the balanced-stage formula."""
import subprocess

from . import common

TITLE = 'Schedules'
CANDIDATES = ['gpipe', '1f1b', 'interleaved', 'zb-h1']
# what each schedule needs beyond its name: interleaved runs 2 model chunks per rank
EXTRA = {'interleaved': ['--virtual', 2]}


def runnable(ctx):
    """The schedules this build's train accepts (later issues add some)."""
    ok = []
    for s in CANDIDATES:
        r = subprocess.run([ctx.pipetrain, 'train', '--model', 'models/seed-mlp.cfg', '--stages',
                            '1', '--schedule', s, '--steps', '1', '--batch', '32', '--train-samples', '64',
                            '--test-samples', '0', '--json'], cwd=common.ROOT,
                           capture_output=True, text=True)
        if r.returncode == 0:
            ok.append(s)
    return ok


def run(ctx):
    steps, warmup, samples = common.sizes(ctx.quick, (40, 5, 60000), (3, 1, 512))
    micro = [2, 4] if ctx.quick else [2, 4, 8, 16]
    scheds = runnable(ctx)
    rows, lines = [], {}
    for s in scheds:
        for m in micro:
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
    if ctx.plot:
        md += '\n![bubble and memory against micro-batches](%s)\n' % draw(ctx, lines)
        same = coincident(lines, 3, 'the formula') + coincident(lines, 4, 'the peak activations')
        if same:
            md += ('\nLines that coincide in the figure (equal at every M; their markers are '
                   'set a little apart sideways, and each schedule has its own marker): %s.\n'
                   % '; '.join(same))
    return md


MARKERS = {'gpipe': 'o', '1f1b': 's', 'interleaved': '^', 'zb-h1': 'D'}


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
        b.plot(m, [p[4] for p in pts], '-', marker=mk, color=c, zorder=z, ms=9 - 1.5 * i)
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
    leg = fig.legend(handles=sched, loc='upper center', bbox_to_anchor=(0.3, 0.0), ncol=len(sched),
                     fontsize=8, frameon=False, title='schedule', title_fontsize=8)
    fig.add_artist(leg)
    fig.legend(handles=kinds, loc='upper center', bbox_to_anchor=(0.75, 0.0), ncol=1, fontsize=8,
               frameon=False, title='bubble panel: line style', title_fontsize=8)
    return ctx.figure(fig, 'schedules')
