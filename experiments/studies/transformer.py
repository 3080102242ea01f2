"""Transformers: how a GPT cuts into pipeline stages (parameters and time per stage under the
uniform, params and time partitions), what the schedules cost it (bubble and peak activation
memory per stage against their formulas), the layouts' speed (measured here on 2 ranks;
beyond, the simulator for GPT-2 124M on an 8-GPU node's topology) and the activation
memory of a block, pipetrain's formula against Megatron's and against the measured peak.

Runs: gpt-mini (measured here, ranks × threads ≤ 2 cores) and gpt2-small (`pipetrain plan`
only: a step takes tens of seconds here). --quick: gpt-nano measured, gpt-mini planned."""
import os
import sys

from . import common

TITLE = 'Transformers: partition, schedules, layouts, activation memory'
MACHINE = 'topologies/node-2s-8gpu.xml'
METHODS = ['uniform', 'params', 'time']
SCHEDULES = [('gpipe', []), ('1f1b', []), ('zb-h1', []), ('interleaved', ['--virtual', 2])]
BATCH = 8            # the measured model's batch (sequences)
BIG_BATCH = 8        # the planned model's batch: micro-batches of one sequence
OPT = ['--optimizer', 'adamw', '--lr', '0.001']
TEXT = ['--data', 'text', '--val-fraction', 0]  # no evaluation: speed and memory only

sys.path.insert(0, common.EXPERIMENTS)
import gpt_torch  # noqa: E402  (the model file's layers, without torch)


def models(quick):
    """(measured here, planned): tiny ones with --quick."""
    if quick:
        return 'models/gpt-nano.cfg', 'models/gpt-mini.cfg'
    return 'models/gpt-mini.cfg', 'models/gpt2-small.cfg'


def spec_of(model):
    """The layers of a model file named relative to the repository (where the runs start)."""
    return gpt_torch.model_spec(os.path.join(common.ROOT, model))


def short(path):
    return os.path.basename(path)[:-len('.cfg')]


def steps(quick):
    """(timed steps, untimed steps) of a measured run."""
    return (1, 1) if quick else (8, 2)


# ---- the activation formulas (docs/DESIGN.md, "Transformer layers in the engine") ---------

def layer_act_bytes(kind, kv, E):
    """Bytes a layer keeps per sample for its backward, its output included (float32):
    embedding T·C; block (8·C + 2·hidden + 4)·T + heads·T²; final layer norm T·C + 2·T
    (its mean and rstd); head T·V (the logits)."""
    V, T, C = E['vocab'], E['context'], E['width']
    if kind == 'embedding':
        return 4 * T * C
    if kind == 'block':
        return 4 * ((8 * C + 2 * kv['hidden'] + 4) * T + kv['heads'] * T * T)
    if kind == 'layernorm':
        return 4 * (T * C + 2 * T)
    if kind == 'lm_head':
        return 4 * T * V
    raise common.StudyError('no activation formula for a [%s] layer' % kind)


def stage_act_bytes(spec, counts):
    """Per stage, the bytes per sample of its layers (counts: layers per stage, in order)."""
    out, first = [], 0
    for n in counts:
        out.append(sum(layer_act_bytes(k, kv, spec[0][1]) for k, kv in spec[first:first + n]))
        first += n
    return out


def in_flight(schedule, K, M, k):
    """Micro-batches stage k holds at its peak: GPipe all M; 1F1B at most K − k; zb-h1 as
    pipetrain runs it (each W deferred after its B) min(M, K) on every stage (`pipetrain
    schedule --schedule zb-h1` prints the same). None: no closed form here (interleaved)."""
    if schedule == 'gpipe':
        return M
    if schedule == '1f1b':
        return min(M, K - k)
    if schedule == 'zb-h1':
        return min(M, K)
    return None


def bubble_formula(schedule, K, M, V=1):
    """The idle share of a step of balanced stages, unit costs."""
    if schedule == 'zb-h1':
        return (K - 1) / (3 * M + K - 1)
    if schedule == 'interleaved':
        return (K - 1) / (V * M + K - 1)
    return (K - 1) / (M + K - 1)


def megatron_bytes(T, C, heads):
    """Megatron-LM's activation memory per layer and sequence (Korthikanti et al. 2022, no
    recomputation, no sequence parallelism): 34·s·b·h + 5·a·s²·b bytes, b = 1 — fp16
    activations, one-byte dropout masks."""
    return 34 * T * C + 5 * heads * T * T


# ---- (a) partition ----------------------------------------------------------------------

def partition(ctx, small, big):
    rows, bars = [], {}
    for model, batch, micro in ((small, BATCH, 4), (big, BIG_BATCH, BIG_BATCH)):
        spec = spec_of(model)
        for k in (2, 4):
            for m in METHODS:
                p = ctx.plan('%s K=%d %s' % (short(model), k, m),
                             ['--model', model, '--stages', k, '--partition', m, '--batch', batch,
                              '--microbatches', micro, '--topology', MACHINE])
                pr = p['predicted']
                first = p['partition']['first']
                params = [b / 4 for b in pr['stage_param_bytes']]
                comp = pr['stage_compute_s']
                rows.append([short(model), k, m, 'predicted', layer_names(spec, first),
                             ' / '.join('%.2f' % (x / 1e6) for x in params),
                             ' / '.join('%.0f' % (x * 1e3) for x in comp),
                             max(comp) / (sum(comp) / len(comp)), pr['step_s'] * 1e3])
                bars.setdefault(short(model), []).append(('%s\nK=%d' % (m, k), params, comp))
    ts, tu = steps(ctx.quick)
    for m in METHODS:  # the measured model on 2 ranks: the stages' measured compute
        r = ctx.train('%s K=2 %s, 1f1b M=4' % (short(small), m),
                      ['--model', small, *TEXT, '--stages', 2, '--partition', m, '--batch', BATCH,
                       '--microbatches', 4, '--threads', 1, '--steps', ts + tu, '--untimed-steps',
                       tu, *OPT], 2)
        spec = spec_of(small)
        first = [0]
        for n in r['stage_layers']:
            first.append(first[-1] + n)
        comp = [c / r['timed_steps'] for c in r['stage_compute_s']]
        rows.append([short(small), 2, m, 'measured here', layer_names(spec, first),
                     ' / '.join('%.2f' % (x / 1e6) for x in r['stage_params']),
                     ' / '.join('%.0f' % (x * 1e3) for x in comp),
                     max(comp) / (sum(comp) / len(comp)), common.step_ms(r)])
    md = common.table(['model', 'K', 'partition', 'kind', 'layers per stage',
                       'parameters per stage (M)', 'compute per stage, ms per step',
                       'imbalance (slowest / mean compute)', 'step ms'], rows)
    md += ('\nPredicted: `pipetrain plan` (layer times profiled on this machine, one thread '
           'per rank; the step on %s), %s batch %d in 4 micro-batches, %s batch %d in %d '
           '(one sequence each). Measured: 2 ranks × 1 thread here. Layers: E embedding, '
           'b block, n final layer norm, H head; the head of a tied model counts its own copy '
           'of the token matrix (as `pipetrain partition` does).\n'
           % (MACHINE, short(small), BATCH, short(big), BIG_BATCH, BIG_BATCH))
    fig = draw_partition(ctx, bars) if ctx.plot else None
    return md, fig


def layer_names(spec, first):
    """'E b b | b n H': each stage's layers by letter."""
    letter = {'embedding': 'E', 'block': 'b', 'layernorm': 'n', 'lm_head': 'H', 'dropout': 'd'}
    return ' \\| '.join(' '.join(letter[spec[i][0]] for i in range(a, b))
                        for a, b in zip(first, first[1:]))


def draw_partition(ctx, bars):
    """Per model, each stage's parameters and compute over the stages' mean (1: balanced)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(bars), 2, figsize=(12, 3.3 * len(bars)), squeeze=False,
                             constrained_layout=True)
    for row, (model, items) in zip(axes, bars.items()):
        for ax, idx, what in ((row[0], 1, 'parameters'), (row[1], 2, 'compute (predicted)')):
            for g, item in enumerate(items):
                v = item[idx]
                mean = sum(v) / len(v)
                w = 0.8 / len(v)
                for s, x in enumerate(v):
                    ax.bar(g - 0.4 + w * (s + 0.5), x / mean if mean else 0, w * 0.92,
                           color='C%d' % s, label='stage %d' % s if g == len(items) - 1 else None)
            ax.axhline(1, color='gray', lw=0.8, ls='--')
            ax.set_xticks(range(len(items)))
            ax.set_xticklabels([i[0] for i in items], fontsize=8)
            ax.set_ylabel('stage / mean of stages')
            ax.set_title('%s: %s per stage' % (model, what), fontsize=10)
            ax.grid(alpha=0.3, axis='y')
    h, lab = axes[0][0].get_legend_handles_labels()
    seen = {}
    for hh, ll in zip(h, lab):
        seen.setdefault(ll, hh)
    common.legend_below(fig, list(seen.values()), list(seen), ncol=len(seen))
    return svg_figure(ctx, fig, 'transformer_partition')


# ---- (b) schedules ----------------------------------------------------------------------

def schedules(ctx, small):
    spec = spec_of(small)
    ts, tu = steps(ctx.quick)
    micro = [4] if ctx.quick else [2, 4, 8]
    rows, lines = [], {}
    K = 2
    for s, extra in SCHEDULES:
        for m in micro:
            r = ctx.train('%s K=2 %s M=%d' % (short(small), s, m),
                          ['--model', small, *TEXT, '--stages', K, '--schedule', s, *extra,
                           '--microbatches', m, '--batch', BATCH, '--threads', 1, '--steps',
                           ts + tu, '--untimed-steps', tu, *OPT], 2)
            act = r['stage_peak_act_bytes']
            mb = BATCH // m
            if s == 'interleaved':
                want = [None] * K
            else:
                per = stage_act_bytes(spec, r['stage_layers'])
                want = [in_flight(s, K, m, k) * mb * per[k] for k in range(K)]
            held = r.get('stage_peak_microbatches') or [None] * K
            formula = bubble_formula(s, K, m, 2 if s == 'interleaved' else 1)
            rows.append([s, m, r.get('bubble'), r.get('bubble_simulated'), formula,
                         common.step_ms(r),
                         ' / '.join(str(h) for h in held),
                         ' / '.join('–' if in_flight(s, K, m, k) is None
                                    else str(in_flight(s, K, m, k)) for k in range(K)),
                         ' / '.join('%.1f' % (a / 1e6) for a in act),
                         ' / '.join('–' if w is None else '%.1f' % (w / 1e6) for w in want)])
            lines.setdefault(s, []).append((m, r.get('bubble'), r.get('bubble_simulated'), formula,
                                            [a / 1e6 for a in act],
                                            [None if w is None else w / 1e6 for w in want]))
    md = common.table(['schedule', 'M', 'bubble measured', 'bubble simulated',
                       'bubble formula', 'step ms', 'micro-batches held per stage (measured)',
                       'held, formula', 'peak activations MB per stage (measured)',
                       'peak activations MB, formula'], rows)
    md += ('\n%s, 2 stages (the `time` partition), batch %d, 2 ranks × 1 thread. Bubble '
           'formulas (balanced stages, unit costs): (K−1)/(M+K−1) for gpipe and 1f1b, '
           '(K−1)/(3M+K−1) for zb-h1, (K−1)/(V·M+K−1) for interleaved (V = 2). Held: GPipe '
           'keeps all M micro-batches, 1F1B at most K − k on stage k, zb-h1 min(M, K) on every '
           'stage (its W runs after the B of the next micro-batch); the activation formula is '
           'held × batch/M × the stage\'s layers\' bytes per sequence (section (d)).\n'
           % (short(small), BATCH))
    fig = draw_schedules(ctx, lines) if ctx.plot else None
    return md, fig


def draw_schedules(ctx, lines):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4), constrained_layout=True)
    marks = {'gpipe': 'o', '1f1b': 's', 'zb-h1': 'D', 'interleaved': '^'}
    n = len(lines)
    for i, (s, pts) in enumerate(lines.items()):
        c, mk = 'C%d' % i, marks.get(s, 'o')
        m = [p[0] * 2 ** (0.05 * (i - (n - 1) / 2)) for p in pts]  # set apart sideways
        a.plot(m, [p[1] for p in pts], '-', marker=mk, color=c)
        a.plot(m, [p[3] for p in pts], ':', marker=mk, mfc='white', color=c)
        for k, ls in ((0, '-'), (1, '--')):
            b.plot(m, [p[4][k] for p in pts], ls, marker=mk, color=c,
                   mfc=c if k == 0 else 'white')
            f = [p[5][k] for p in pts]
            if all(x is not None for x in f):
                b.plot(m, f, 'x', color='k', ms=6, zorder=5)
    ms = sorted({p[0] for pts in lines.values() for p in pts})
    for ax in (a, b):
        ax.set_xscale('log', base=2)
        ax.set_xticks(ms)
        ax.set_xticklabels([str(x) for x in ms])
        ax.minorticks_off()
        ax.set_xlabel('micro-batches M (K = 2 stages, batch %d)' % BATCH)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    a.set_ylabel('bubble (idle share of the step)')
    a.set_title('bubble: measured (solid) and formula (dotted)', fontsize=10)
    b.set_ylabel('peak activation MB')
    b.set_title('peak activations: stage 0 (filled), stage 1 (open); × formula', fontsize=10)
    handles = [Line2D([], [], color='C%d' % i, marker=marks.get(s, 'o'), label=s)
               for i, s in enumerate(lines)]
    handles.append(Line2D([], [], color='k', marker='x', ls='', label='formula (held × bytes)'))
    common.legend_below(fig, handles, [h.get_label() for h in handles], ncol=len(handles))
    return svg_figure(ctx, fig, 'transformer_schedules')


# ---- (c) layouts ------------------------------------------------------------------------

LAYOUTS = [  # (label, ranks, options): measured here, ranks × threads ≤ 2
    ('1 process, 1 thread', 1, ['--threads', 1]),
    ('1 process, 2 threads', 1, ['--threads', 2]),
    ('2 stages, 1f1b M=4', 2, ['--stages', 2, '--microbatches', 4, '--threads', 1]),
    ('2 replicas', 2, ['--replicas', 2, '--threads', 1]),
    ('2 tensor shards', 2, ['--tensor', 2, '--threads', 1]),
]
BIG_LAYOUTS = [  # 8 ranks of the topology, every micro-batch one sequence
    ('1 rank', ['--stages', 1, '--microbatches', BIG_BATCH]),
    ('8 replicas', ['--replicas', 8, '--microbatches', 1]),
    ('8 stages, 1f1b M=8', ['--stages', 8, '--microbatches', 8]),
    ('8 stages, zb-h1 M=8', ['--stages', 8, '--microbatches', 8, '--schedule', 'zb-h1']),
    ('4 stages × 2 replicas, M=4', ['--stages', 4, '--replicas', 2, '--microbatches', 4]),
    ('2 stages × 4 replicas, M=2', ['--stages', 2, '--replicas', 4, '--microbatches', 2]),
    ('4 tensor × 2 replicas', ['--tensor', 4, '--replicas', 2, '--microbatches', 4]),
    ('2 tensor × 4 stages, M=8', ['--tensor', 2, '--stages', 4, '--microbatches', 8]),
]


def layouts(ctx, small, big):
    spec = spec_of(small)
    T = spec[0][1]['context']
    ts, tu = steps(ctx.quick)
    rows, measured, whole = [], [], None
    for label, ranks, extra in LAYOUTS:
        r = ctx.train('%s: %s' % (short(small), label),
                      ['--model', small, *TEXT, '--batch', BATCH, '--steps', ts + tu,
                       '--untimed-steps', tu, *OPT, *extra], ranks)
        tok = r['samples_per_s'] * T
        act = max(r['stage_peak_act_bytes']) / 1e6
        params = max(r['stage_params'])
        rows.append([label, '%d×%d' % (ranks, r['threads']), tok, common.step_ms(r), act,
                     params / 1e6, params * 4 * 4 / 1e6])
        measured.append((label, tok))
        if ranks == 1 and whole is None:
            whole = (r['stage_peak_act_bytes'][0], BATCH * sum(stage_act_bytes(
                spec, [len(spec)])))
    md = common.table(['layout (%s, batch %d)' % (short(small), BATCH), 'ranks×threads',
                       'tokens/s', 'step ms', 'peak activations MB (largest rank)',
                       'parameters per rank (M)', 'params+grads+AdamW state MB per rank'], rows)
    md += ('\nMeasured here (%d timed steps after %d), AdamW; a token is one position of a '
           'sequence of %d.\n\n' % (ts, tu, T))
    big_rows, predicted, skipped = [], [], []
    big_spec = spec_of(big)
    Tb = big_spec[0][1]['context']
    for label, extra in BIG_LAYOUTS:
        why = tensor_refusal(big_spec, int(extra[extra.index('--tensor') + 1])
                             if '--tensor' in extra else 1)
        if why:
            skipped.append('%s (%s)' % (label, why))
            continue
        if '--stages' not in extra:  # plan asks for the stages, 1 included
            extra = ['--stages', 1, *extra]
        p = ctx.plan('%s: %s' % (short(big), label),
                     ['--model', big, '--batch', BIG_BATCH, '--topology', MACHINE, *extra])
        pr = p['predicted']
        tok = BIG_BATCH * Tb / pr['step_s']
        mem = max(pr['stage_memory_bytes']) / 2 ** 30
        big_rows.append([label, p['ranks'], tok, pr['step_s'] * 1e3, pr.get('bubble'),
                         max(pr.get('tensor_collective_s') or [0]) * 1e3 or None,
                         max(pr['stage_param_bytes_per_rank']) / 4e6, mem])
        predicted.append((label, tok))
    md += common.table(['layout (%s, batch %d, predicted)' % (short(big), BIG_BATCH), 'ranks',
                        'tokens/s', 'step ms', 'bubble', 'tensor collectives ms',
                        'parameters per rank (M)', 'memory per rank GiB'], big_rows)
    if skipped:
        md += '\nNot planned: %s.\n' % '; '.join(skipped)
    md += ('\nPredicted, not measured: `pipetrain plan --topology %s` (CPU ranks of its two '
           'sockets; layer times profiled here on one core, links from the topology\'s cost '
           'model, the optimizer\'s update left out). Memory: parameters, gradients, optimizer '
           'state and peak activations of the largest rank.\n' % MACHINE)
    fig = draw_layouts(ctx, small, big, measured, predicted) if ctx.plot else None
    return md, fig, whole


def draw_layouts(ctx, small, big, measured, predicted):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 0.9 + 0.42 * max(len(measured),
                                                                 len(predicted))),
                               constrained_layout=True)
    for ax, items, title, style in (
            (a, measured, '%s, measured here (2 cores)' % short(small), dict(color='C0')),
            (b, predicted, '%s, predicted on %s' % (short(big), os.path.basename(MACHINE)),
             dict(facecolor='white', edgecolor='C1', hatch='//'))):
        y = list(range(len(items)))
        ax.barh(y, [t for _, t in items], height=0.65, **style)
        for yy, (_, t) in zip(y, items):
            ax.annotate('{:,.0f}'.format(t), (t, yy), xytext=(3, 0), textcoords='offset points',
                        va='center', fontsize=7)
        ax.set_yticks(y)
        ax.set_yticklabels([lab for lab, _ in items], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max([t for _, t in items] + [1]) * 1.18)
        ax.set_xlabel('tokens/s')
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis='x')
    return svg_figure(ctx, fig, 'transformer_layouts')


def tensor_refusal(spec, T):
    """Why the model's blocks cannot be cut into T tensor shards (None: they can): heads
    and hidden must be multiples of T."""
    for kind, kv in spec:
        if kind == 'block' and (kv['heads'] % T or kv['hidden'] % T):
            return '%d heads and hidden %d do not divide into %d shards' % (kv['heads'],
                                                                          kv['hidden'], T)
    return None


# ---- (d) activation memory of a block ----------------------------------------------------

def variant(ctx, model, blocks):
    """A copy of the model file with its first `blocks` blocks only, in the results."""
    out, seen = [], 0
    sections = gpt_torch.read_cfg(os.path.join(common.ROOT, model))
    for kind, kv, _ in sections:
        if kind == 'block':
            seen += 1
            if seen > blocks:
                continue
        out.append('[%s]\n%s' % (kind, ''.join('%s=%s\n' % kv_ for kv_ in kv.items())))
    path = os.path.join(ctx.results, '%s-%dblock.cfg' % (short(model), blocks))
    with open(path, 'w') as f:
        f.write('; %s with %d block(s): the activation study (experiments/studies/'
                'transformer.py)\n' % (short(model), blocks) + '\n'.join(out))
    return path


def block_memory(ctx, names, whole):
    rows, bars = [], []
    for model in names:
        spec = spec_of(model)
        E = spec[0][1]
        blk = next(kv for k, kv in spec if k == 'block')
        T, C, a, H = E['context'], E['width'], blk['heads'], blk['hidden']
        peaks = []
        for n in (1, 2):  # one sequence, one process: the difference is one block
            r = ctx.train('%s with %d block(s), batch 1' % (short(model), n),
                          ['--model', variant(ctx, model, n), *TEXT, '--batch', 1, '--steps', 1,
                           '--optimizer', 'sgd', '--lr', 0.001, '--threads', 1])
            peaks.append(r['stage_peak_act_bytes'][0])
        measured = peaks[1] - peaks[0]
        ours = layer_act_bytes('block', blk, E)
        probs = 4 * a * T * T
        mega = megatron_bytes(T, C, a)
        rows.append([short(model), T, C, a, H, '%.2f' % (ours / 1e6), '%.2f' % (probs / 1e6),
                     '%.2f' % (measured / 1e6), '%.0f' % ((ours - probs) / T),
                     '%.0f' % (34 * C), '%.2f' % (mega / 1e6), '%.2f' % (ours / mega)])
        bars.append((short(model), ours - probs, probs, measured, 34 * T * C, 5 * a * T * T))
    md = common.table(['model', 'T', 'C', 'heads', 'hidden', 'pipetrain formula MB per '
                       'sequence', 'of which attention probabilities MB', 'measured MB',
                       'pipetrain bytes per token (beside the probabilities)',
                       'Megatron bytes per token (34·h)', 'Megatron MB per sequence',
                       'pipetrain / Megatron'], rows)
    md += ('\nOne block\'s activations per sequence: pipetrain\'s formula 4·(8·C + 2·hidden '
           '+ 4)·T + 4·heads·T² bytes (float32: ln_1 and ln_2 outputs, q·k·v, the attention '
           'output, the residual after attention, c_fc\'s output and GELU\'s, the output, four '
           'floats of norm statistics per token, and the probabilities); measured: the peak '
           'activations of `train` with 2 blocks minus with 1 (one sequence, one process); '
           'Megatron-LM\'s 34·T·h + 5·heads·T² bytes (fp16 activations with one-byte dropout '
           'masks, no recomputation).\n')
    if whole:
        md += ('\nThe whole model in one process (section (c), batch %d): %.2f MB measured, '
               '%.2f MB by the per-layer formulas (embedding T·C, blocks, final norm T·C + 2T, '
               'logits T·V floats per sequence).\n' % (BATCH, whole[0] / 1e6, whole[1] / 1e6))
    fig = draw_memory(ctx, bars) if ctx.plot else None
    return md, fig


def draw_memory(ctx, bars):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(bars), figsize=(5.2 * len(bars), 3.8), squeeze=False,
                             constrained_layout=True)
    for ax, (model, tok, probs, measured, m_tok, m_att) in zip(axes[0], bars):
        ax.bar(0, tok / 1e6, 0.6, color='C0', label='per-token part')
        ax.bar(0, probs / 1e6, 0.6, bottom=tok / 1e6, color='C9', label='attention (heads·T²)')
        ax.bar(1, measured / 1e6, 0.6, color='C2', label='measured (2 blocks − 1)')
        ax.bar(2, m_tok / 1e6, 0.6, color='C0', hatch='//', edgecolor='white')
        ax.bar(2, m_att / 1e6, 0.6, bottom=m_tok / 1e6, color='C9', hatch='//',
               edgecolor='white')
        ax.set_xticks([0, 1, 2])
        ax.set_xticklabels(['pipetrain formula\n(fp32)', 'pipetrain measured',
                            'Megatron formula\n(fp16 + masks)'], fontsize=8)
        ax.set_ylabel('MB per block and sequence')
        ax.set_title(model, fontsize=10)
        ax.grid(alpha=0.3, axis='y')
    h, lab = axes[0][0].get_legend_handles_labels()
    common.legend_below(fig, h, lab, ncol=3)
    return svg_figure(ctx, fig, 'transformer_memory')


# ---- the study ---------------------------------------------------------------------------

def svg_figure(ctx, fig, stem):
    """Saves a matplotlib figure as SVG (text as paths, no date, fixed ids: the same figure
    gives the same file); returns its path relative to docs/."""
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.rcParams['svg.hashsalt'] = 'pipetrain'
    path = os.path.join(ctx.figures, '%s.svg' % stem)
    fig.savefig(path, bbox_inches='tight', metadata={'Date': None})
    plt.close(fig)
    return os.path.relpath(path, os.path.join(common.ROOT, 'docs'))


def run(ctx):
    small, big = models(ctx.quick)
    out = []
    for title, (md, fig) in (('(a) Partition', partition(ctx, small, big)),
                             ('(b) Schedules on 2 stages', schedules(ctx, small))):
        out.append('**%s.**\n\n%s' % (title, md) + ('\n![%s](%s)\n' % (title, fig) if fig else ''))
    md, fig, whole = layouts(ctx, small, big)
    out.append('**(c) Layouts.**\n\n%s' % md + ('\n![layouts](%s)\n' % fig if fig else ''))
    md, fig = block_memory(ctx, [small] if ctx.quick else [small, big], whole)
    out.append('**(d) Activation memory of a block.**\n\n%s' % md
               + ('\n![activation memory of a block](%s)\n' % fig if fig else ''))
    return '\n'.join(out)
