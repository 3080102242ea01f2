"""Partitioners and placement: for K = 2..8 stages, the balance of each partition method
(the slowest stage's compute over the mean) and the predicted step time of the placement
`plan` chooses on a described machine; measured where it can run here (K = 2)."""
from . import common

TITLE = 'Partitioners and placement'
MODEL = 'models/seed-cnn.cfg'
METHODS = ['uniform', 'params', 'time']
MACHINE = 'topologies/node-2s-8gpu.xml'
BATCH, MICRO = 128, 8


def run(ctx):
    ks = [2, 4] if ctx.quick else [2, 3, 4, 5, 6, 7, 8]
    rows, pts = [], {}
    for m in METHODS:
        for k in ks:
            p = ctx.plan('%s K=%d' % (m, k), ['--model', MODEL, '--stages', k, '--partition', m,
                                               '--batch', BATCH, '--microbatches', MICRO,
                                               '--topology', MACHINE])
            pr = p['predicted']
            comp = pr['stage_compute_s']
            imb = max(comp) / (sum(comp) / len(comp))
            first = p['partition']['first']
            per_stage = ' '.join(str(b - a) for a, b in zip(first, first[1:]))
            rows.append([m, k, 'predicted', per_stage, imb,
                         pr['step_s'] * 1e3, p['cost_s'] * 1e6, p['rank_order_cost_s'] * 1e6])
            pts.setdefault(m, []).append((k, imb, pr['step_s']))
    steps, warmup, samples = common.sizes(ctx.quick, (30, 5, 60000), (1, 1, 512))
    measured = {}
    for m in METHODS:
        r = ctx.train('%s K=2 measured' % m, ['--model', MODEL, '--stages', 2, '--partition', m,
                                               '--batch', BATCH, '--microbatches', MICRO,
                                               '--threads', 1, '--steps', steps + warmup,
                                               '--untimed-steps', warmup, '--train-samples', samples,
                                               '--test-samples', 0], 2)
        comp = r['stage_compute_s']
        imb = max(comp) / (sum(comp) / len(comp)) if sum(comp) > 0 else None
        rows.append([m, 2, 'measured here', ' '.join(map(str, r['stage_layers'])), imb,
                     common.step_ms(r), None, None])
        measured.setdefault(m, []).append((2, imb, common.step_ms(r) / 1e3))
    md = common.table(['method', 'K', 'kind', 'layers per stage',
                       'imbalance (slowest / mean compute)', 'step ms',
                       'placement comm µs/step', 'rank order comm µs/step'], rows)
    md += ('\nPredicted: `pipetrain plan` on %s (CPU ranks), batch %d in %d micro-batches, '
           'layer times profiled on this machine; measured: 2 ranks × 1 thread here.\n'
           % (MACHINE, BATCH, MICRO))
    if ctx.plot:
        md += '\n![partitioners](%s)\n' % draw(ctx, pts, measured)
    return md


def draw(ctx, pts, measured):
    """Predicted lines (open markers, dashed) per method, and the K = 2 runs measured here as
    filled markers of the same colour beside them."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    for i, (m, p) in enumerate(pts.items()):
        c = 'C%d' % i
        a.plot([x[0] for x in p], [x[1] for x in p], 'o--', mfc='none', color=c)
        b.plot([x[0] for x in p], [x[2] * 1e3 for x in p], 'o--', mfc='none', color=c)
        for k, imb, step in measured.get(m, []):
            if imb is not None:
                a.plot([k + 0.08], [imb], 'o', color=c, ms=7, zorder=3)
            if step is not None:
                b.plot([k + 0.08], [step * 1e3], 'o', color=c, ms=7, zorder=3)
    ks = sorted({x[0] for p in pts.values() for x in p})
    a.set_ylabel('imbalance (slowest / mean stage compute)')
    b.set_ylabel('step ms (batch %d, M = %d)' % (BATCH, MICRO))
    for ax in (a, b):
        ax.set_xticks(ks)
        ax.set_xlabel('stages K')
        ax.grid(alpha=0.3)
    a.set_ylim(bottom=1)
    b.set_ylim(bottom=0)
    handles = [Line2D([], [], color='C%d' % i, ls='--', marker='o', mfc='none', label=m)
               for i, m in enumerate(pts)]
    handles += [Line2D([], [], color='gray', ls='--', marker='o', mfc='none',
                       label='predicted (plan on %s)' % MACHINE.split('/')[-1]),
                Line2D([], [], color='gray', ls='', marker='o', ms=7,
                       label='measured here (2 ranks; set a little right of K = 2)')]
    common.legend_below(fig, handles, [h.get_label() for h in handles], ncol=len(handles))
    return ctx.figure(fig, 'partition')
