"""Layouts compared: one global batch trained sequentially, data-parallel, as a pipeline
(each schedule train runs, with recomputation and batched weight gradients), hybrid, and
tensor-parallel (both modes), with the step time cut into compute, the tensor collectives
inside it, the exposed part of the gradient reductions and the rest (bubble, messages), and
the memory each rank holds."""
from . import common

TITLE = 'Layouts compared'

# (name, file, options, layers): a layout needs at least as many layers as model chunks
MODELS = [('seed-cnn', 'models/seed-cnn.cfg', ['--optimizer', 'adam', '--lr', '0.001'], 11),
          ('seed-mlp', 'models/seed-mlp.cfg', ['--optimizer', 'sgd', '--lr', '0.01'], 3)]
BATCH = 128

# (label, ranks, options): ranks × threads never exceeds the cores for the speed figures;
# the 4-rank hybrid is oversubscribed on a 2-core machine and says so (ctx.cores decides).
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
    ('pipeline K=2 zb-h1 M=4, wgrad batched', 2, ['--stages', '2', '--schedule', 'zb-h1',
                                                  '--microbatches', '4', '--wgrad', 'batched',
                                                  '--threads', '1']),
    ('pipeline K=2 1f1b M=4, recompute all', 2, ['--stages', '2', '--schedule', '1f1b',
                                                 '--microbatches', '4', '--recompute', 'all',
                                                 '--threads', '1']),
    ('hybrid K=2 x R=2 1f1b M=2', 4, ['--stages', '2', '--replicas', '2', '--microbatches', '2',
                                       '--threads', '1']),
    ('tensor T=2 megatron', 2, ['--tensor', '2', '--tensor-mode', 'megatron', '--threads', '1']),
    ('tensor T=2 gather (classic model parallel)', 2, ['--tensor', '2', '--tensor-mode', 'gather',
                                                       '--threads', '1']),
]


def run(ctx):
    steps, warmup, samples = common.sizes(ctx.quick, (60, 10, 60000), (1, 1, 512))
    layouts = list(LAYOUTS)
    rows, bars, skipped = [], {}, []
    # --quick (a smoke test): seed-cnn only, whose 11 layers take every layout
    for mname, path, opt, n_layers in (MODELS[:1] if ctx.quick else MODELS):
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
            # a tensor group's collectives run inside the forward and backward: part of compute
            tensor = common.per_step(r, 'stage_tensor_s', max) or 0.0
            exposed = common.per_step(r, 'stage_reduce_exposed_s', max) or 0.0
            act = max(r.get('stage_peak_act_bytes') or [0]) / 1e6
            # parameters, gradients and optimizer state (Adam: 2 more) of the largest stage
            copies = {'adam': 4, 'momentum': 3}.get(r['optimizer'], 2)
            if r.get('stage_params'):  # what each rank holds (tensor shards: its slices)
                params_mb = max(r['stage_params']) * 4 * copies / 1e6
            else:
                params_mb = r['params'] * 4 * copies / r['stages'] / 1e6
            over = ranks * r['threads'] > ctx.cores
            rows.append([mname, label, '%d×%d' % (ranks, r['threads']), r['samples_per_s'], step,
                         compute * 1e3 if compute else None,
                         tensor * 1e3 if r.get('tensor', 1) > 1 else None, r.get('bubble'),
                         exposed * 1e3, act, params_mb, 'yes' if over else ''])
            bars[mname].append({'label': label, 'step': step, 'compute': compute or 0.0,
                                'tensor': tensor, 'exposed': exposed, 'over': over})
    md = common.table(['model', 'layout', 'ranks×threads', 'samples/s', 'step ms',
                       'compute ms (slowest stage)', 'of which tensor collectives ms',
                       'bubble (share of the step)', 'exposed reduction ms',
                       'peak activations MB (largest stage)', 'params+grads+state MB per rank',
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
    """One panel per model, stacked (their step times differ by 50×, and the layout names
    need the width), bars cut into compute, exposed reduction and the rest; the legend under
    the panels, where it covers no bar."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    n = [len(items) for items in bars.values()]
    fig, axes = plt.subplots(len(bars), 1, figsize=(9, 1.2 + 0.34 * sum(n) + 0.9 * len(bars)),
                             squeeze=False, constrained_layout=True,
                             gridspec_kw={'height_ratios': [max(1, k) for k in n]})
    parts = [('compute (slowest stage)', 'C0'),
             ('tensor collectives (inside the forward and backward)', 'C4'),
             ('exposed reduction', 'C1'), ('bubble, messages, rest', 'C2')]
    for ax, (mname, items) in zip(axes[:, 0], bars.items()):
        labels = [i['label'] + (' *' if i['over'] else '') for i in items]
        step = [i['step'] or 0 for i in items]
        tens = [i['tensor'] * 1e3 for i in items]
        comp = [max(0.0, i['compute'] * 1e3 - t) for i, t in zip(items, tens)]
        exp = [i['exposed'] * 1e3 for i in items]
        other = [max(0.0, s - c - t - e) for s, c, t, e in zip(step, comp, tens, exp)]
        y = list(range(len(items)))
        left = [0.0] * len(items)
        for (name, color), width in zip(parts, (comp, tens, exp, other)):
            ax.barh(y, width, left=left, color=color, label=name, height=0.7)
            left = [a + b for a, b in zip(left, width)]
        for yy, total in zip(y, step):  # the step time at the end of each bar
            ax.annotate('%.3g' % total, (total, yy), xytext=(3, 0), textcoords='offset points',
                        va='center', fontsize=7)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(step + [1e-9]) * 1.12)
        ax.set_xlabel('ms per optimizer step (batch %d)' % BATCH)
        ax.set_title(mname + ('  (* oversubscribed: ranks × threads > cores, speed not a '
                              'figure of the layout)' if any(i['over'] for i in items) else ''),
                     fontsize=9)
    h, lab = axes[0, 0].get_legend_handles_labels()
    common.legend_below(fig, h, lab, ncol=2)
    return ctx.figure(fig, 'layouts')
