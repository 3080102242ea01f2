#!/usr/bin/python3
"""The PyTorch side of the GPT learning check (the study `gpt-learning`,
experiments/studies/gpt_learning.py): trains the GPT of a pipetrain model file in float32
as `pipetrain train --data text --optimizer adamw --lr-schedule cosine --clip-grad-norm X`
trains it, from the same initial parameters and on the same windows, and evaluates the
same validation windows, so that the two loss curves can be laid side by side.

What is reproduced (README "Text (language models)", "Optimizer, learning-rate schedule,
gradient clipping"; docs/DESIGN.md "Text corpora"):
  - the corpus: Debian's fortunes as `--data text` reads it (experiments/gpt_peer.py's
    corpus_bytes), its last --val-fraction held out (gpt_torch.split_corpus);
  - the initial parameters of `train --seed N`: the engine seeds its generator with --seed
    itself (src/train/train_setup.c: engine_init_params(eng, o->seed) →
    stage_init_params), element i of tensor k of layer l being Box–Muller on Philox block i
    of stream rng_stream_init_tensor(l, k). gpt_torch.init_values computes that in pure
    Python (about 100 s for gpt-mini's 10.8 M parameters); init_values_np below computes
    the same Philox blocks with numpy's integer arithmetic (exact) and the same double
    Box–Muller, and is checked against gpt_torch.normal_value at sampled elements of
    every tensor on every run. With --check-init CK, the whole vector is compared bit for
    bit with a checkpoint pipetrain wrote before any update (SGD, lr 0, one step);
  - the windows of step s: gpt_torch.text_batch(training part, T, --seed, s, batch), as
    src/train/train_text.c draws them (data_text_batch(..., o->seed, step), step from 0);
  - the optimizer: torch.optim.AdamW with nanoGPT's two groups (gpt_torch's
    decay_groups: decay on the blocks' matrices and an untied head only), betas, eps and
    decay as given; the learning rate of update s set before it from the README's formula
    in double, rounded to float32 once and handed to torch as its shortest decimal;
    torch.nn.utils.clip_grad_norm_ over the distinct parameters;
  - validation: the mean cross-entropy per token over gpt_torch.eval_batch's --eval-windows
    windows of the held-out part, after the steps --eval-at names (pipetrain evaluates at
    the end of each epoch: every floor(train tokens / (batch·T)) steps, and after the last).

The last line of stdout is one JSON object: every step's loss, gradient norm (before
clipping) and learning rate, the validation losses by step, the init checks, the corpus
and the wall time.

    /usr/bin/python3 experiments/learn_gpt.py --model models/gpt-mini.cfg --seed 0 --steps 200
"""
import argparse
import json
import math
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import interpreter  # noqa: E402

MASK32 = 0xFFFFFFFF


# ------------------------------------------------------------------ the initial parameters
def philox_np(np, seed, stream, count):
    """Lanes 0 and 1 of Philox4x32-10 blocks 0..count−1 of (seed, stream), as uint64
    arrays: gpt_torch.philox4x32_10 vectorised (32×32-bit products fit in uint64)."""
    u64 = np.uint64
    idx = np.arange(count, dtype=u64)
    c0, c1 = idx & u64(MASK32), idx >> u64(32)
    c2 = np.full(count, stream & MASK32, dtype=u64)
    c3 = np.full(count, (stream >> 32) & MASK32, dtype=u64)
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    m0, m1, mask, sh = u64(0xD2511F53), u64(0xCD9E8D57), u64(MASK32), u64(32)
    for _ in range(10):
        p0 = m0 * c0
        p1 = m1 * c2
        c0, c1, c2, c3 = ((p1 >> sh) ^ c1 ^ u64(k0), p1 & mask, (p0 >> sh) ^ c3 ^ u64(k1),
                          p0 & mask)
        k0 = (k0 + 0x9E3779B9) & MASK32
        k1 = (k1 + 0xBB67AE85) & MASK32
    return c0, c1


def normals_np(np, seed, stream, count, std):
    """gpt_torch.normal_values as a float32 array: Box–Muller in double, std·z rounded to
    float32 once."""
    r0, r1 = philox_np(np, seed, stream, count)
    u1 = (r0.astype(np.float64) + 1.0) / 4294967296.0
    u2 = r1.astype(np.float64) / 4294967296.0
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
    return (std * z).astype(np.float32)


def init_tensors(np, gpt_torch, spec, seed, samples=64):
    """pipetrain's initial parameters for `seed` as {(layer, name): float32 array, shaped},
    in the engine's order (gpt_torch.init_values, tensor by tensor). Each drawn tensor is
    checked at `samples` elements (the first, the last, and spread between) against
    gpt_torch.normal_value, the pure-Python reference: AssertionError if one differs.
    Returns (tensors, elements checked)."""
    blocks = sum(1 for kind, _ in spec if kind == 'block')
    resid = gpt_torch.INIT_STD / math.sqrt(2 * blocks) if blocks else gpt_torch.INIT_STD
    E = spec[0][1]
    V, T, C = E['vocab'], E['context'], E['width']
    out, checked = {}, 0

    def drawn(l, k, name, shape, std):
        nonlocal checked
        n = int(np.prod(shape))
        v = normals_np(np, seed, gpt_torch.init_stream(l, k), n, std)
        for i in sorted({0, n - 1, *range(0, n, max(1, n // samples))}):
            want = gpt_torch.normal_value(seed, gpt_torch.init_stream(l, k), i, std)
            assert float(v[i]) == want, ('layer %d %s element %d: numpy %r, reference %r'
                                         % (l, name, i, float(v[i]), want))
            checked += 1
        out[(l, name)] = v.reshape(shape)

    for l, (kind, kv) in enumerate(spec):
        if kind == 'embedding':
            drawn(l, 0, 'wte.weight', (V, C), gpt_torch.INIT_STD)
            drawn(l, 1, 'wpe.weight', (T, C), gpt_torch.INIT_STD)
        elif kind == 'block':
            H = kv['hidden']
            drawn(l, 0, 'attn.c_attn.weight', (3 * C, C), gpt_torch.INIT_STD)
            drawn(l, 1, 'attn.c_proj.weight', (C, C), resid)
            drawn(l, 2, 'mlp.c_fc.weight', (H, C), gpt_torch.INIT_STD)
            drawn(l, 3, 'mlp.c_proj.weight', (C, H), resid)
            for name, n, one in (('ln_1.weight', C, 1), ('ln_1.bias', C, 0),
                                 ('attn.c_attn.bias', 3 * C, 0), ('attn.c_proj.bias', C, 0),
                                 ('ln_2.weight', C, 1), ('ln_2.bias', C, 0),
                                 ('mlp.c_fc.bias', H, 0), ('mlp.c_proj.bias', C, 0)):
                out[(l, name)] = np.full(n, float(one), dtype=np.float32)
        elif kind == 'layernorm':
            out[(l, 'weight')] = np.ones(C, dtype=np.float32)
            out[(l, 'bias')] = np.zeros(C, dtype=np.float32)
        elif kind == 'lm_head':
            if kv['tied']:
                out[(l, 'weight')] = out[(0, 'wte.weight')]
            else:
                drawn(l, 0, 'weight', (V, C), gpt_torch.INIT_STD)
    return out, checked


def read_safetensors(np, path):
    """{name: float32 array} and the metadata of a safetensors file."""
    with open(path, 'rb') as f:
        raw = f.read()
    (n,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop('__metadata__', None) or {}
    data, out = raw[8 + n:], {}
    for name, info in header.items():
        if info['dtype'] != 'F32':
            raise ValueError('%s: %s is %s, not F32' % (path, name, info['dtype']))
        b, e = info['data_offsets']
        out[name] = np.frombuffer(data[b:e], dtype='<f4').reshape(info['shape'])
    return out, meta


def compare_init(np, tensors, spec, path):
    """Every tensor of pipetrain's checkpoint `path` (layers.<l>.<name>; a tied head's copy
    is stored once, as wte, and not looked for) against ours, bit for bit: (values
    compared, values that differ, tensors missing from the file, the file's metadata)."""
    got, meta = read_safetensors(np, path)
    compared = differ = 0
    missing = []
    for (l, name), v in tensors.items():
        if spec[l][0] == 'lm_head' and spec[l][1]['tied']:
            continue
        key = 'layers.%d.%s' % (l, name)
        if key not in got:
            missing.append(key)
            continue
        g = got[key].reshape(v.shape)
        compared += v.size
        differ += int(np.count_nonzero(g.view(np.uint32) != v.view(np.uint32)))
    return compared, differ, missing, meta


def fnv1a_digest(tokens):
    """src/io/text_data.c's text_digest: FNV-1a over the count and the vocabulary (uint64,
    little-endian), then every token as a little-endian int32; hex as checkpoints write it."""
    h = 0xcbf29ce484222325
    prime, mask = 0x100000001b3, (1 << 64) - 1
    data = struct.pack('<QQ', len(tokens), 256) + struct.pack('<%di' % len(tokens), *tokens)
    for b in data:
        h = ((h ^ b) * prime) & mask
    return '%016x' % h


# ------------------------------------------------------------------ the schedule
def lr_at(lr, kind, warmup, lr_min, s, steps):
    """src/train/lr_schedule.c's rate of update s (from 0) of `steps`, in double."""
    if warmup > 0 and s < warmup:
        return lr * (s + 1) / warmup
    p = min(1.0, max(0.0, (s - warmup) / max(1, steps - warmup)))
    if kind == 'cosine':
        return lr_min + 0.5 * (1.0 + math.cos(math.pi * p)) * (lr - lr_min)
    if kind == 'linear':
        return lr - p * (lr - lr_min)
    return lr


def parse():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', required=True)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--steps', type=int, default=200)
    p.add_argument('--batch', type=int, default=4)
    p.add_argument('--lr', type=float, default=1e-3)
    p.add_argument('--lr-schedule', choices=['constant', 'cosine', 'linear'], default='cosine')
    p.add_argument('--lr-warmup', type=int, default=20)
    p.add_argument('--lr-min', type=float, default=0.0)
    p.add_argument('--weight-decay', type=float, default=0.01)
    p.add_argument('--clip-grad-norm', type=float, default=1.0, help='0: none')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--val-fraction', type=float, default=0.1)
    p.add_argument('--eval-windows', type=int, default=64)
    p.add_argument('--eval-at', default='',
                   help='steps after which to evaluate, comma-separated (default: the epoch '
                        'ends as pipetrain has them, and the last step)')
    p.add_argument('--check-init', default=None, metavar='CK',
                   help="a checkpoint pipetrain wrote before any update (train --optimizer sgd "
                        "--lr 0 --steps 1 --checkpoint-dir): compared bit for bit with our "
                        "initial parameters, and its corpus digest with our corpus's")
    a = p.parse_args()
    if a.lr_warmup > a.steps:
        p.error('--lr-warmup %d is longer than the run (%d steps)' % (a.lr_warmup, a.steps))
    return a


def main():
    a = parse()
    os.environ['OMP_NUM_THREADS'] = str(a.threads)
    os.environ['OPENBLAS_NUM_THREADS'] = '1'
    interpreter.ensure_modules(['torch', 'numpy'])
    import numpy as np
    import torch
    import torch.nn.functional as F
    import gpt_peer
    import gpt_torch
    torch.set_num_threads(a.threads)
    t_start = time.perf_counter()

    text = gpt_peer.corpus_bytes()
    if text is None:
        sys.exit('learn_gpt.py: no built-in corpus (apt-get install fortunes-min)')
    tokens = list(text)
    train_toks, val_toks = gpt_torch.split_corpus(tokens, a.val_fraction)
    model = gpt_torch.build(a.model, torch.float32)
    spec = model.spec
    T, V = model.context, model.vocab
    steps_per_epoch = len(train_toks) // (a.batch * T)
    if a.eval_at:
        eval_at = sorted({int(s) for s in a.eval_at.split(',')})
    else:
        eval_at = sorted({s for s in range(steps_per_epoch, a.steps + 1, steps_per_epoch)}
                         | {a.steps})

    # the initial parameters: numpy's Philox, checked against gpt_torch's at samples
    t0 = time.perf_counter()
    tensors, sampled = init_tensors(np, gpt_torch, spec, a.seed)
    flat = np.concatenate([tensors[(l, name)].reshape(-1)
                           for l in range(len(spec)) for name, _ in model.tensors(l)])
    gpt_torch.flat_to_params(model, torch.from_numpy(flat))
    init = {'elements_checked_against_gpt_torch': sampled, 'init_s': time.perf_counter() - t0,
            'params': sum(p.numel() for p in model.parameters())}
    if a.check_init:
        compared, differ, missing, meta = compare_init(np, tensors, spec, a.check_init)
        digest = fnv1a_digest(tokens)
        init.update({'checkpoint': a.check_init, 'compared': compared, 'differ': differ,
                     'missing': missing, 'checkpoint_seed': meta.get('seed'),
                     'corpus_digest': digest,
                     'checkpoint_corpus_digest': meta.get('corpus_digest')})

    decay, no_decay = model.decay_groups()
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': a.weight_decay},
                             {'params': no_decay, 'weight_decay': 0.0}], lr=a.lr)
    params = list(model.parameters())  # distinct: a tied wte once

    def validate():
        xs, ys = gpt_torch.eval_batch(val_toks, T, a.eval_windows)
        total, n = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(xs), 8):  # 8 windows at a time: bounded memory
                x, y = torch.tensor(xs[i:i + 8]), torch.tensor(ys[i:i + 8])
                total += F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1),
                                         reduction='sum').item()
                n += y.numel()
        return total / n

    losses, norms, lrs, val = [], [], [], {}
    t0 = time.perf_counter()
    for s in range(a.steps):
        xs, ys = gpt_torch.text_batch(train_toks, T, a.seed, s, a.batch)
        x, y = torch.tensor(xs), torch.tensor(ys)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        if a.clip_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, a.clip_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        # pipetrain's float32 rate, handed to torch as its shortest decimal (README)
        lr = float(str(np.float32(lr_at(a.lr, a.lr_schedule, a.lr_warmup, a.lr_min, s,
                                        a.steps))))
        for g in opt.param_groups:
            g['lr'] = lr
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
        lrs.append(lr)
        if s + 1 in eval_at:
            val[s + 1] = validate()
    train_s = time.perf_counter() - t0
    print(json.dumps({
        'model': a.model, 'seed': a.seed, 'steps': a.steps, 'batch': a.batch, 'context': T,
        'threads': a.threads, 'corpus_tokens': len(tokens), 'train_tokens': len(train_toks),
        'val_tokens': len(val_toks), 'steps_per_epoch': steps_per_epoch,
        'losses': losses, 'grad_norms': norms, 'lrs': lrs,
        'val_losses': {str(k): v for k, v in sorted(val.items())},
        'val_loss': val.get(a.steps), 'init': init, 'train_s': train_s,
        'wall_s': time.perf_counter() - t_start, 'torch': torch.__version__}))


if __name__ == '__main__':
    main()
