"""ZeRO inside a replica group: each rank's bytes of parameters, gradients and optimizer
state (measured by train: the engine's arrays, the gradient arrays' peak backed bytes)
against the number of replicas for --zero 0, 1, 2 and 3, beside the ZeRO paper's formulas
(fp32 Adam: 4Ψ parameters + 4Ψ gradients + 8Ψ moments, each stage dividing its part by R),
and the step time against unsharded replicas. PyTorch FSDP is not the peer here: Debian 12's
python3-torch 1.13.1 cannot import torch.distributed.fsdp under Python 3.11 (a dataclass of
torch.distributed._shard has a mutable default: ValueError at import)."""
import os

from . import common

TITLE = 'ZeRO: memory per rank against replicas'


def deep_mlp(path, layers):
    """An MLP of `layers` 512-wide dense layers on 28×28 inputs: one bucket per layer at
    --bucket-mb 1, so ZeRO-2 can give each back as its reduce-scatter ends."""
    with open(path, 'w') as f:
        f.write('[net]\ninput=1,28,28\n')
        for _ in range(layers):
            f.write('[dense]\nunits=512\nactivation=relu\n')
        f.write('[dense]\nunits=10\nactivation=linear\n')
    return path


def gpt(path, blocks):
    """gpt-deep's kind of language model (bytes, context 128, width 256, 4 heads) with
    `blocks` blocks: the share of one block in Ψ, what ZeRO-2 and 3 hold whole in flight,
    falls as 1/blocks."""
    with open(path, 'w') as f:
        f.write('[net]\n\n[embedding]\nvocab=256\ncontext=128\nwidth=256\n\n')
        f.write('[block]\nheads=4\n' * blocks)
        f.write('\n[layernorm]\n\n[lm_head]\ntied=1\n')
    return path


def formula(psi, r, zero):
    """The paper's bytes per rank (fp32 Adam), without buckets or layers in flight."""
    params = 4 * psi / (r if zero >= 3 else 1)
    grads = 4 * psi / (r if zero >= 2 else 1)
    moments = 8 * psi / (r if zero >= 1 else 1)
    return params + grads + moments


def run(ctx):
    layers = 2 if ctx.quick else 8
    model = deep_mlp(os.path.join(ctx.results, 'deep-mlp.cfg'), layers)
    steps, warmup, samples = common.sizes(ctx.quick, (20, 3, 4096), (2, 1, 64))
    replicas = [1, 2] if ctx.quick else [1, 2, 4]
    rows, base = [], {}
    for r in replicas:
        for zero in ([0] if r == 1 else [0, 1, 2, 3]):
            args = ['--model', model, '--batch', 16 * r, '--replicas', r, '--microbatches', 1,
                    '--steps', steps + warmup, '--untimed-steps', warmup,
                    '--train-samples', samples, '--test-samples', 0, '--seed', 5,
                    '--threads', 1, '--optimizer', 'adam', '--lr', '0.001',
                    '--reduce', 'ordered', '--bucket-mb', 1, '--overlap', 'on']
            if r > 1:
                args += ['--zero', zero]
            res = ctx.train('deep-mlp R=%d zero %d' % (r, zero), args, r)
            mb = lambda k: max(res[k]) / 2**20 if res.get(k) else None  # noqa: E731
            psi = res.get('params')
            total = sum(mb(k) or 0 for k in ('rank_params_bytes', 'rank_grads_bytes',
                                             'rank_optimizer_bytes'))
            want = formula(psi, r, zero) / 2**20 if psi else None
            step = common.step_ms(res)
            if zero == 0:
                base[r] = step
            rows.append([r, zero, mb('rank_params_bytes'), mb('rank_grads_bytes'),
                         mb('rank_optimizer_bytes'), total, want,
                         total / want if want else None, mb('rank_peak_rss_bytes'), step,
                         step / base[r] if step and base.get(r) else None])
    md = ('An MLP of %d dense layers of 512 (one bucket each at `--bucket-mb 1`), fp32 Adam, '
          'one micro-batch of 16 per replica, `--reduce ordered --overlap on`, one thread per '
          'rank; the largest rank\'s bytes from `train --json`. The formula leaves out the '
          'buckets ZeRO-2 holds whole while they are reduced (two at most) and the layers '
          'ZeRO-3 holds whole around a pass (two at most: the one running and the one '
          'prefetched). Step times count only on an idle machine with a core per rank '
          '(R = 4 runs 4 ranks on this 2-core machine). PyTorch FSDP: not run (Debian 12\'s '
          'torch 1.13.1 cannot import torch.distributed.fsdp under Python 3.11).\n\n' % layers)
    md += common.table(['R', '--zero', 'params MB', 'grads MB', 'optimizer MB', 'sum MB',
                        'formula MB', 'sum / formula', 'peak RSS MB', 'step ms',
                        'step / unsharded'], rows)
    if not ctx.quick:
        md += '\n\n' + transformers(ctx)
    return md


def transformers(ctx):
    """Memory only (2 steps): language models of 6, 12 and 24 blocks at R = 2."""
    rows = []
    for blocks in (6, 12, 24):
        model = gpt(os.path.join(ctx.results, 'gpt-%d.cfg' % blocks), blocks)
        for zero, prefetch, overlap in ((0, 1, 1), (1, 1, 1), (2, 1, 1), (2, 1, 0), (3, 1, 1),
                                        (3, 0, 1), (3, 0, 0)):
            args = ['--model', model, '--data', 'text', '--val-fraction', 0, '--batch', 16,
                    '--replicas', 2, '--microbatches', 1, '--steps', 2, '--seed', 5,
                    '--threads', 1, '--optimizer', 'adamw', '--reduce', 'ordered',
                    '--zero', zero] + ([] if prefetch else ['--zero3-prefetch', 'off']) + \
                ([] if overlap else ['--zero-overlap', 'off'])
            label = '%d' % zero + ('' if prefetch else ', no prefetch') + \
                ('' if overlap else ', no overlap')
            res = ctx.train('gpt-%d R=2 zero %s' % (blocks, label), args, 2)
            mb = lambda k: max(res[k]) / 2**20 if res.get(k) else None  # noqa: E731
            psi = res.get('params')
            total = sum(mb(k) or 0 for k in ('rank_params_bytes', 'rank_grads_bytes',
                                             'rank_optimizer_bytes'))
            want = formula(psi, 2, zero) / 2**20 if psi else None
            rows.append([blocks, label, mb('rank_params_bytes'), mb('rank_grads_bytes'),
                         mb('rank_optimizer_bytes'), total, want,
                         total / want if want else None, mb('rank_peak_rss_bytes')])
    md = ('Language models of gpt-deep\'s kind (context 128, width 256, 4 heads; a block is '
          '0.79 M parameters) with 6, 12 and 24 blocks, batch 16 windows (8 per replica: 4 '
          'gradient groups of 2, folded into group 0 a product at a time), AdamW, R = 2, '
          '`--reduce ordered`, 2 steps (memory only). Beyond the formula every `--zero` holds '
          'the part the groups are folded in (the largest product, c_fc\'s: a third of a '
          'block), ZeRO-2 two buckets (a block each) whole, ZeRO-3 also the running block\'s '
          'and the prefetched one\'s parameters beyond their shards (one block; half of it '
          'with `--zero3-prefetch off`; with `--zero-overlap off` one bucket whole, not two): '
          'a constant, so its share falls as 1/blocks.\n\n')
    md += common.table(['blocks', '--zero', 'params MB', 'grads MB', 'optimizer MB',
                        'sum MB', 'formula MB', 'sum / formula', 'peak RSS MB'], rows)
    return md
