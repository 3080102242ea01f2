"""Strong and weak scaling in the classic study's form: data-parallel training of seed-cnn
with 1..P processes, tabulated as read time, per-batch update time, time per epoch, test
loss and accuracy; then its three figures (strong scaling, weak scaling, the effect of the
number of nodes). Real runs for the process counts this machine's cores allow; beyond
that, `plan`'s simulator on described machines (topologies/), drawn as predictions."""
from . import common

TITLE = 'Strong and weak scaling'
MODEL = 'models/seed-cnn.cfg'
STRONG_BATCH = 256   # global batch, fixed (strong scaling)
WEAK_BATCH = 128     # per process (weak scaling)
MACHINE = 'topologies/node-16c-1gpu.xml'  # 16 cores: the predicted process counts


def measured(ctx, label, procs, batch, epochs_args):
    args = ['--model', MODEL, '--batch', batch, '--threads', 1, '--optimizer', 'adam',
            '--lr', '0.001', '--seed', 1, *epochs_args]
    if procs > 1:
        args += ['--replicas', procs]
    return ctx.train(label, args, procs)


def predicted(ctx, label, procs, batch, nodes=1):
    args = ['--model', MODEL, '--stages', 1, '--replicas', procs, '--batch', batch,
            '--topology', MACHINE, '--nodes', nodes, '--partition', 'params']
    return ctx.plan(label, args)['predicted']['step_s']


def run(ctx):
    if ctx.quick:
        epochs_args = ['--steps', 2, '--untimed-steps', 1, '--train-samples', 1024,
                       '--test-samples', 256]
    else:
        epochs_args = ['--epochs', 1, '--untimed-steps', 5]
    max_real = max(1, ctx.cores)
    real = [p for p in (1, 2, 4, 8, 16) if p <= max_real]
    pred = [1, 2, 4, 8] if ctx.quick else [1, 2, 4, 8, 16]
    rows, strong, weak = [], [], []
    for kind, batch_of in (('strong', lambda p: STRONG_BATCH), ('weak', lambda p: WEAK_BATCH * p)):
        for p in real:
            r = measured(ctx, '%s scaling, %d process%s' % (kind, p, 'es' if p > 1 else ''), p,
                         batch_of(p), epochs_args)
            # a whole epoch as run (quick: steps per epoch × the measured update)
            epoch_s = (r['steps_per_epoch'] * common.step_ms(r) / 1e3 if ctx.quick
                       else r['train_s'] / r['epochs'])
            rows.append([kind, p, 1, batch_of(p), r.get('data_read_s'), common.step_ms(r), epoch_s,
                         r.get('test_loss'), r.get('test_acc')])
            (strong if kind == 'strong' else weak).append(('measured', p, common.step_ms(r) / 1e3))
        for p in pred:
            s = predicted(ctx, '%s scaling predicted, %d processes' % (kind, p), p, batch_of(p))
            (strong if kind == 'strong' else weak).append(('predicted', p, s))
    # the classic study's nodes figure: 8 processes on 1, 2 and 4 nodes of the described
    # machine (its `#SBATCH --nodes=2 --ntasks-per-node=4`), and 4 per node
    nodes = []
    for n in (1, 2, 4):
        nodes.append(('8 processes', n, 8,
                      predicted(ctx, '8 processes on %d nodes' % n, 8, STRONG_BATCH, n)))
        nodes.append(('4 per node', n, 4 * n,
                      predicted(ctx, '4 per node on %d nodes' % n, 4 * n, STRONG_BATCH, n)))
    md = common.table(['scaling', 'processes', 'nodes', 'global batch', 'read time s',
                       'per-batch update ms', 'time per epoch s',
                       'test loss', 'test accuracy'], rows)
    md += ('\nMeasured: data parallel with `--replicas P --threads 1` on this machine (%d cores). '
           'Predicted (not measured): `pipetrain plan` on %s, layer times profiled on this '
           'machine\'s CPU, the optimizer\'s update left out.\n' % (ctx.cores, MACHINE))
    md += common.table(['series', 'nodes', 'processes', 'predicted step ms (batch %d)' % STRONG_BATCH],
                       [[t, n, p, s * 1e3] for t, n, p, s in nodes])
    if ctx.plot:
        md += '\n![scaling](%s)\n' % draw(ctx, strong, weak, nodes)
    return md


def draw(ctx, strong, weak, nodes):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), constrained_layout=True)

    def below(ax):  # the legend under the panel, where it covers no point
        ax.legend(fontsize=8, loc='upper center', bbox_to_anchor=(0.5, -0.17), ncol=3,
                  frameon=False)

    def series(ax, pts, f, ideal, ylabel, title):
        for kind, style in (('measured', 'o-'), ('predicted', 'o--')):
            xs = [p for k, p, _ in pts if k == kind]
            ys = [f(p, t, pts, kind) for k, p, t in pts if k == kind]
            if xs:
                ax.plot(xs, ys, style, mfc='none' if kind == 'predicted' else None,
                        label=kind if kind == 'measured' else 'predicted (plan, not measured)',
                        zorder=3 if kind == 'measured' else 2)
        procs = sorted({p for _, p, _ in pts})
        ax.plot(procs, [ideal(p) for p in procs], 'k:', lw=1, label='ideal', zorder=1)
        ax.set_xscale('log', base=2)
        ax.set_xticks(procs)
        ax.set_xticklabels([str(p) for p in procs])
        ax.minorticks_off()
        ax.set_xlabel('processes')
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        below(ax)

    def speedup(p, t, pts, kind):
        base = [tt for k, pp, tt in pts if k == kind and pp == 1][0]
        return base / t

    def efficiency(p, t, pts, kind):
        base = [tt for k, pp, tt in pts if k == kind and pp == 1][0]
        return base / t  # same work per process: ideal is a flat 1

    series(axes[0], strong, speedup, lambda p: p, 'speed-up over 1 process (batch %d)'
           % STRONG_BATCH, 'strong scaling')
    series(axes[1], weak, efficiency, lambda p: 1.0, 'efficiency (%d samples per process)'
           % WEAK_BATCH, 'weak scaling')
    axes[1].set_ylim(bottom=0)
    for tag, style in (('8 processes', 'o--'), ('4 per node', 's--')):
        pts = [(n, s) for t, n, _, s in nodes if t == tag]
        axes[2].plot([n for n, _ in pts], [s * 1e3 for _, s in pts], style, mfc='none',
                     label=tag + ' (predicted)')
    ns = sorted({n for _, n, _, _ in nodes})
    axes[2].set_xticks(ns)
    axes[2].set_xlabel('nodes of %s (predicted)' % MACHINE.split('/')[-1])
    axes[2].set_ylabel('step ms (batch %d)' % STRONG_BATCH)
    axes[2].set_ylim(bottom=0)
    axes[2].set_title('effect of the number of nodes', fontsize=10)
    axes[2].grid(alpha=0.3)
    below(axes[2])
    return ctx.figure(fig, 'scaling')
