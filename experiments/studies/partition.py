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
    steps, warmup, samples = common.sizes(ctx.quick, (30, 5, 60000), (3, 1, 512))
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
    md = common.table(['method', 'K', 'kind', 'layers per stage',
                       'imbalance (slowest / mean compute)', 'step ms',
                       'placement comm µs/step', 'rank order comm µs/step'], rows)
    md += ('\nPredicted: `pipetrain plan` on %s (CPU ranks), batch %d in %d micro-batches, '
           'layer times profiled on this machine; measured: 2 ranks × 1 thread here.\n'
           % (MACHINE, BATCH, MICRO))
    if ctx.plot:
        md += '\n![partitioners](%s)\n' % draw(ctx, pts)
    return md


def draw(ctx, pts):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for m, p in pts.items():
        a.plot([x[0] for x in p], [x[1] for x in p], 'o--', mfc='none', label=m)
        b.plot([x[0] for x in p], [x[2] * 1e3 for x in p], 'o--', mfc='none', label=m)
    a.set_ylabel('imbalance (predicted)')
    b.set_ylabel('step ms (predicted)')
    for ax in (a, b):
        ax.set_xlabel('stages K')
        ax.legend(fontsize=8)
    return ctx.figure(fig, 'partition')
