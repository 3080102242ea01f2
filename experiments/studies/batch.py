"""Batch-size regimes: the optimizer steps, and the time, that seed-mlp needs to reach a
target test accuracy, against the global batch. With perfect scaling doubling the batch
halves the steps; past some batch it stops doing so (diminishing returns), and then the
steps stop falling at all (maximal data parallelism).

Learning-rate rule (stated with the results): Adam, lr = 1e-3 × sqrt(B / 128), the
square-root scaling commonly used with Adam; every other option fixed. A run with --steps S
is the first S steps of any longer run with the same options (training is deterministic),
so the steps to target are found by evaluating the test set after S steps for growing S,
then narrowing the bracket; the table gives the first grid point at or above the target."""
import math

from . import common

TITLE = 'Batch-size regimes'
MODEL = 'models/seed-mlp.cfg'


def lr_for(b):
    return 1e-3 * math.sqrt(b / 128)


def run(ctx):
    if ctx.quick:
        batches, target, samples, max_epochs = [64, 256], 0.5, 4096, 4
    else:
        batches, target, samples, max_epochs = [32, 64, 128, 256, 512, 1024, 2048], 0.84, 60000, 40
    rows, pts = [], []
    for b in batches:
        per_epoch = samples // b
        cap = max_epochs * per_epoch

        def acc_at(steps):
            r = ctx.train('batch %d, %d steps' % (b, steps),
                          ['--model', MODEL, '--batch', b, '--optimizer', 'adam', '--lr',
                           '%.6g' % lr_for(b), '--steps', steps, '--untimed-steps', 0,
                           '--train-samples', samples, '--threads', 1, '--seed', 1], 1)
            return r['test_acc'], r['train_s']

        lo, hi, hi_time = 0, None, None
        s = 8
        while s <= cap:  # grow geometrically until the target is reached
            acc, t = acc_at(s)
            if acc >= target:
                hi, hi_time = s, t
                break
            lo = s
            s *= 2
        if hi is None:
            rows.append([b, '%.4g' % lr_for(b), None, None, None, 'not within %d epochs' % max_epochs])
            continue
        while hi - lo > max(1, hi // 8):  # narrow to about 1/8 of the steps
            mid = (lo + hi) // 2
            acc, t = acc_at(mid)
            if acc >= target:
                hi, hi_time = mid, t
            else:
                lo = mid
        rows.append([b, '%.4g' % lr_for(b), hi, hi * b / samples, hi_time, ''])
        pts.append((b, hi, hi_time))
    md = ('Target: test accuracy ≥ %.2f on %d test samples; Adam, lr = 1e-3 × sqrt(B/128); '
          'one process, one thread.\n\n' % (target, 10000))
    md += common.table(['global batch', 'lr', 'steps to target', 'epochs to target',
                        'time to target s', ''], rows)
    if ctx.plot and pts:
        md += '\n![steps and time to target against the batch](%s)\n' % draw(ctx, pts, target)
    return md


def draw(ctx, pts, target):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (plain tick labels)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    bs = [p[0] for p in pts]
    a.loglog(bs, [p[1] for p in pts], 'o-', base=2, label='measured')
    a.loglog(bs, [pts[0][1] * pts[0][0] / x for x in bs], 'k:', base=2,
             label='perfect scaling from the smallest batch (steps ∝ 1/B)')
    a.set_ylabel('steps to test accuracy %.2f' % target)
    b.semilogx(bs, [p[2] for p in pts], 'o-', base=2, label='measured')
    b.set_ylabel('training time to target, s (1 thread)')
    b.set_ylim(bottom=0)
    for ax in (a, b):
        ax.set_xticks(bs)
        ax.set_xticklabels([str(x) for x in bs])
        ax.minorticks_off()
        ax.set_xlabel('global batch B')
        ax.grid(alpha=0.3)
    a.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    h, lab = a.get_legend_handles_labels()
    common.legend_below(fig, h, lab, ncol=2)
    return ctx.figure(fig, 'batch')
