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
    return md


def draw(ctx, lines):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (s, pts) in enumerate(lines.items()):
        c = 'C%d' % i
        m = [p[0] for p in pts]
        a.plot(m, [p[1] for p in pts], 'o-', color=c, label='%s measured' % s)
        a.plot(m, [p[2] for p in pts], 'o--', mfc='none', color=c, label='%s simulated' % s)
        a.plot(m, [p[3] for p in pts], ':', color=c, label='%s formula' % s)
        b.plot(m, [p[4] for p in pts], 'o-', color=c, label=s)
    for ax in (a, b):
        ax.set_xscale('log', base=2)
        ax.set_xlabel('micro-batches M (K = 2 stages, batch 128)')
    a.set_ylabel('bubble (idle share of the step)')
    b.set_ylabel('peak activation MB (largest stage)')
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    return ctx.figure(fig, 'schedules')
