"""Layouts compared: one global batch trained sequentially, data-parallel, as a pipeline
(each schedule), and hybrid, with the step time cut into compute, pipeline bubble and the
exposed part of the gradient reductions, and the memory each rank holds."""
from . import common

TITLE = 'Layouts compared'

# (name, file, options, layers): a layout needs at least as many layers as model chunks
MODELS = [('seed-cnn', 'models/seed-cnn.cfg', ['--optimizer', 'adam', '--lr', '0.001'], 11),
          ('seed-mlp', 'models/seed-mlp.cfg', ['--optimizer', 'sgd', '--lr', '0.01'], 3)]
BATCH = 128

# (label, ranks, options): ranks × threads never exceeds the cores for the speed figures;
# the 4-rank hybrid is oversubscribed on a 2-core machine and says so.
LAYOUTS = [
    ('sequential, 1 thread', 1, ['--threads', '1']),
    ('sequential, 2 threads', 1, ['--threads', '2']),
    ('data parallel R=2', 2, ['--replicas', '2', '--threads', '1']),
    ('pipeline K=2 gpipe M=4', 2, ['--stages', '2', '--schedule', 'gpipe', '--microbatches', '4',
                                    '--threads', '1']),
    ('pipeline K=2 1f1b M=4', 2, ['--stages', '2', '--schedule', '1f1b', '--microbatches', '4',
                                   '--threads', '1']),
    ('pipeline K=2 interleaved V=2 M=4', 2, ['--stages', '2', '--schedule', 'interleaved',
                                              '--virtual', '2', '--microbatches', '4',
                                              '--threads', '1']),
    ('pipeline K=2 zb-h1 M=4', 2, ['--stages', '2', '--schedule', 'zb-h1', '--microbatches', '4',
                                    '--threads', '1']),
    ('hybrid K=2 x R=2 1f1b M=2', 4, ['--stages', '2', '--replicas', '2', '--microbatches', '2',
                                       '--threads', '1']),
]


def run(ctx):
    steps, warmup, samples = common.sizes(ctx.quick, (60, 10, 60000), (3, 1, 512))
    layouts = list(LAYOUTS)
    if ctx.supports('tensor'):
        layouts.append(('tensor T=2 megatron', 2, ['--tensor', '2', '--tensor-mode', 'megatron',
                                                   '--threads', '1']))
        layouts.append(('tensor T=2 gather (classic model parallel)', 2,
                        ['--tensor', '2', '--tensor-mode', 'gather', '--threads', '1']))
    rows, bars, skipped = [], {}, []
    for mname, path, opt, n_layers in MODELS:
        bars[mname] = []
        for label, ranks, extra in layouts:
            if chunks(extra) > n_layers:
                skipped.append('%s: %s (%d model chunks, %d layers)' % (mname, label,
                                                                        chunks(extra), n_layers))
                continue
            args = ['--model', path, '--batch', BATCH, '--steps', steps + warmup, '--untimed-steps',
                    warmup, '--train-samples', samples, '--test-samples', 0, '--seed', 1,
                    *opt, *extra]
            r = ctx.train('%s: %s' % (mname, label), args, ranks)
            step = common.step_ms(r)
            compute = common.per_step(r, 'stage_compute_s', max)
            exposed = common.per_step(r, 'stage_reduce_exposed_s', max) or 0.0
            act = max(r.get('stage_peak_act_bytes') or [0]) / 1e6
            # parameters, gradients and optimizer state (Adam: 2 more) of the largest stage
            copies = {'adam': 4, 'momentum': 3}.get(r['optimizer'], 2)
            if r.get('stage_params'):  # what each rank holds (tensor shards: its slices)
                params_mb = max(r['stage_params']) * 4 * copies / 1e6
            else:
                params_mb = r['params'] * 4 * copies / r['stages'] / 1e6
            rows.append([mname, label, '%d×%d' % (ranks, r['threads']), r['samples_per_s'], step,
                         compute * 1e3 if compute else None, r.get('bubble'), exposed * 1e3,
                         act, params_mb, 'yes' if ranks * r['threads'] > ctx.cores else ''])
            bars[mname].append((label, step, compute, exposed, ranks * r['threads'] > ctx.cores))
    md = common.table(['model', 'layout', 'ranks×threads', 'samples/s', 'step ms',
                       'compute ms (slowest stage)', 'bubble (share of the step)',
                       'exposed reduction ms', 'peak activations MB', 'params+grads+state MB per rank',
                       'oversubscribed'], rows)
    if skipped:
        md += '\nNot run (more model chunks than layers): %s.\n' % '; '.join(skipped)
    if ctx.plot:
        md += '\n![step time by layout](%s)\n' % draw(ctx, bars)
    return md


def chunks(extra):
    """The model chunks a layout cuts: stages × virtual stages."""
    def opt(name, default):
        return int(extra[extra.index(name) + 1]) if name in extra else default
    return opt('--stages', 1) * opt('--virtual', 1)


def draw(ctx, bars):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(bars), figsize=(6 * len(bars), 4))
    for ax, (mname, items) in zip(axes, bars.items()):
        labels = [i[0] + (' *' if i[4] else '') for i in items]
        step = [i[1] or 0 for i in items]
        comp = [(i[2] or 0) * 1e3 for i in items]
        exp = [i[3] * 1e3 for i in items]
        other = [max(0.0, s - c - e) for s, c, e in zip(step, comp, exp)]
        y = range(len(items))
        ax.barh(y, comp, label='compute (slowest stage)')
        ax.barh(y, exp, left=comp, label='exposed reduction')
        ax.barh(y, other, left=[c + e for c, e in zip(comp, exp)],
                label='bubble, messages, rest')
        ax.set_yticks(list(y))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel('ms per optimizer step (batch %d)' % BATCH)
        ax.set_title(mname + ('  (* oversubscribed)' if any(i[4] for i in items) else ''))
    axes[0].legend(fontsize=8, loc='lower right')
    return ctx.figure(fig, 'layouts')
