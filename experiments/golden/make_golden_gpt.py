#!/usr/bin/python3
"""Writes the golden values of tests/gpt_parity.sh: a tiny GPT trained by PyTorch 1.13 in
float64, from pipetrain's initial parameters, on pipetrain's text windows of
tests/golden/corpus.txt, under several optimizers, so that `pipetrain train` (float32) can
be compared with it step by step in every layout.

    /usr/bin/python3 experiments/golden/make_golden_gpt.py [--dry-run]

(run under another python3 it runs itself again under /usr/bin/python3, which has torch).
The files are committed; the test needs neither torch nor numpy.

Writes, in tests/golden/:
  gpt_parity.json             every run: its name, model file, hyper-parameters, the
                              `pipetrain train` options that ask for the same training, the
                              loss of every step (mean cross-entropy over the batch's B·T
                              tokens, before that step's update), the gradient norm of every
                              step (before clipping), the learning rate of every step, the
                              validation loss after the last step, its parameter file, and
                              the tolerances of each (below);
  gpt_<run>.safetensors       the parameters after the last step, float32, under pipetrain's
                              checkpoint names (layers.<i>.<tensor>).

What the reference does (gpt-spec.md):
  - model: experiments/gpt_torch.py (pipetrain's layout; a tied head shares wte, so torch
    adds both gradients into one tensor, which is what pipetrain's summed copies are);
  - initial parameters: gpt_torch.init_params (Philox normals as pipetrain draws them);
  - data: the corpus's bytes less the last 10% (train's default --val-fraction 0.1); the
    batch of step s: samples 0..B−1 of step s (gpt_torch.text_batch), windows of T+1 bytes
    drawn from that training part;
  - validation loss after the last step: the mean cross-entropy over every position of
    the 64 evenly spaced windows of the held-out 10% (--eval-windows 64, the default);
  - loss: F.cross_entropy over all B·T positions (mean);
  - clipping: torch.nn.utils.clip_grad_norm_ over every distinct parameter;
  - learning rate of update s (0-based) of `steps`: s < warmup: lr·(s+1)/warmup; else
    p = (s − warmup)/max(1, steps − warmup), cosine: min + ½(1 + cos πp)(lr − min),
    linear: lr − p(lr − min); constant: lr;
  - optimizers: torch.optim.SGD; torch.optim.AdamW with two groups, weight decay on the
    block matrices and an untied head only (gpt_torch.GPT.decay_groups).
The hyper-parameters pipetrain holds as float32 (lr, betas, eps, weight decay, the clip
norm) are rounded to float32 here first, so that both sides start from the same numbers.

Tolerances (written per run): every run is also trained in float32 four ways that round
differently, as pipetrain's layouts do (VARIANTS: batched, samples reversed, 2 and 4
micro-batches); each tolerance is MARGIN (10) times the largest error they show against
float64, at least 1e-5 (losses, gradient norms: relative) and 1e-4 (parameters: of each
tensor's max|p|). The key third of each block's c_attn bias is compared apart under AdamW
(loose_slices). Changed the corpus, a model file or a run? Run this again, then
tests/gpt_parity.sh; a run added here needs no change in the test.
"""
import argparse
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..'))
import interpreter  # noqa: E402  (experiments/interpreter.py)

interpreter.ensure_modules(['torch'])
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpt_torch  # noqa: E402

GOLDEN = os.path.normpath(os.path.join(HERE, '..', '..', 'tests', 'golden'))
CORPUS = 'corpus.txt'
SEED = 11
BATCH = 8
STEPS = 4
# train's defaults for text: the last 10% held out, the validation loss over 64 windows
VAL_FRACTION = 0.1
EVAL_WINDOWS = 64

# name, model file, hyper-parameters (steps: STEPS unless given). The same batch for all.
RUNS = [
    ('sgd', 'gpt_tiny.cfg', dict(optimizer='sgd', lr=0.5)),
    ('sgd_tied', 'gpt_tiny_tied.cfg', dict(optimizer='sgd', lr=0.5)),
    # 5 steps, warmup 2: the cosine is sampled at p = 0, 1/3, 2/3 (at p = 1/2 alone it
    # would equal the linear schedule)
    ('adamw_cosine', 'gpt_tiny.cfg',
     dict(optimizer='adamw', lr=1e-2, weight_decay=0.1, schedule='cosine', warmup=2,
          lr_min=1e-3, steps=5)),
    ('adamw_tied_clip', 'gpt_tiny_tied.cfg',
     dict(optimizer='adamw', lr=1e-2, weight_decay=0.1, schedule='linear', warmup=1,
          lr_min=2e-3, clip=0.3)),
]
# Tolerances: MARGIN times the float32 spread, at least the floors (relative to |loss| and
# to each tensor's max|p|)
MARGIN = 10
LOSS_RTOL = 1e-5
PARAM_RTOL = 1e-4
# pipetrain's AdamW constants (train_options.c: beta1 0.9, beta2 0.999, eps 1e-8)
BETAS = (0.9, 0.999)
EPS = 1e-8


def f32(x):
    return gpt_torch.float32(float(x))


def pipetrain_args(hp):
    """The `pipetrain train` options of a run but --model and --text (the test adds them:
    paths depend on where it runs)."""
    args = ['--seed', str(SEED), '--batch', str(BATCH), '--steps', str(steps_of(hp)),
            '--optimizer', hp['optimizer'], '--lr', repr(hp['lr'])]
    if 'weight_decay' in hp:
        args += ['--weight-decay', repr(hp['weight_decay'])]
    if 'schedule' in hp:
        args += ['--lr-schedule', hp['schedule'], '--lr-warmup', str(hp['warmup']),
                 '--lr-min', repr(hp['lr_min'])]
    if 'clip' in hp:
        args += ['--clip-grad-norm', repr(hp['clip'])]
    return args


def steps_of(hp):
    return hp.get('steps', STEPS)


def lr_at(hp, s, steps):
    """The learning rate of update s (0-based) of `steps`, in double."""
    lr = f32(hp['lr'])
    kind = hp.get('schedule', 'constant')
    if kind == 'constant':
        return lr
    warmup, lo = hp['warmup'], f32(hp['lr_min'])
    if s < warmup:
        return lr * (s + 1) / warmup
    p = (s - warmup) / max(1, steps - warmup)
    if kind == 'cosine':
        return lo + 0.5 * (1 + math.cos(math.pi * p)) * (lr - lo)
    if kind == 'linear':
        return lr - p * (lr - lo)
    raise ValueError('schedule %s' % kind)


def make_optimizer(model, hp):
    if hp['optimizer'] == 'sgd':
        return torch.optim.SGD(model.parameters(), lr=f32(hp['lr']))
    decay, no_decay = model.decay_groups()
    return torch.optim.AdamW(
        [dict(params=decay, weight_decay=f32(hp['weight_decay'])),
         dict(params=no_decay, weight_decay=0.0)],
        lr=f32(hp['lr']), betas=tuple(f32(b) for b in BETAS), eps=f32(EPS))


def val_loss(model, tokens):
    """The mean cross-entropy over every position of the evaluation windows."""
    xs, ys = gpt_torch.eval_batch(tokens, model.context, EVAL_WINDOWS)
    with torch.no_grad():
        logits = model(torch.tensor(xs))
        return F.cross_entropy(logits.reshape(-1, model.vocab), torch.tensor(ys).reshape(-1)).item()


# Ways of computing the same step in float32 that round differently, as pipetrain's
# layouts do: the samples in another order, gradients accumulated over micro-batches.
# name: (micro-batches, reversed sample order)
VARIANTS = {'batch': (1, False), 'reversed': (1, True), 'micro2': (2, False),
            'micro4-reversed': (4, True)}


def train(cfg, hp, dtype, tokens, variant='batch'):
    """Trains one run on the training tokens: (losses, grad_norms, model)."""
    micro, rev = VARIANTS[variant]
    model = gpt_torch.build(cfg, dtype)
    gpt_torch.init_params(model, SEED)
    opt = make_optimizer(model, hp)
    params = list(model.parameters())  # distinct: a tied wte once
    V, T = model.vocab, model.context
    losses, norms = [], []
    steps = steps_of(hp)
    for s in range(steps):
        xs, ys = gpt_torch.text_batch(tokens, T, SEED, s, BATCH)
        x, y = torch.tensor(xs), torch.tensor(ys)
        if rev:
            x, y = x.flip(0), y.flip(0)
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            # the batch's mean: each micro-batch's sum over its tokens / (B·T)
            part = F.cross_entropy(model(xm).reshape(-1, V), ym.reshape(-1), reduction='sum')
            (part / (BATCH * T)).backward()
            loss += part.item() / (BATCH * T)
        losses.append(loss)
        if 'clip' in hp:
            norm = torch.nn.utils.clip_grad_norm_(params, f32(hp['clip']))
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        norms.append(float(norm))
        for g in opt.param_groups:
            g['lr'] = lr_at(hp, s, steps)
        opt.step()
    return losses, norms, model


def tight_tensors(model, loose):
    """st_tensors(model) as float64, the loose slices cut out (they are compared apart)."""
    out = {k: v.double() for k, v in st_tensors(model).items()}
    for sl in loose:
        t = out[sl['tensor']]
        out[sl['tensor']] = torch.cat([t[:sl['begin']], t[sl['end']:]])
    return out


def float32_spread(cfg, hp, tokens, held_out, losses, norms, val, model, loose):
    """How far float32 computations of the run land from the float64 one, the largest
    over the VARIANTS: relative errors of the step losses, the gradient norms and the
    validation loss, and per tensor max|p32 − p64| as a fraction of max|p64|."""
    ref = tight_tensors(model, loose)
    loss_err, norm_err, val_err, spread = 0.0, 0.0, 0.0, {k: 0.0 for k in ref}
    for variant in VARIANTS:
        l32, n32, m32 = train(cfg, hp, torch.float32, tokens, variant)
        loss_err = max(loss_err, max(abs(a - b) / abs(b) for a, b in zip(l32, losses)))
        norm_err = max(norm_err, max(abs(a - b) / abs(b) for a, b in zip(n32, norms)))
        val_err = max(val_err, abs(val_loss(m32, held_out) - val) / val)
        got = tight_tensors(m32, loose)
        for k in ref:
            spread[k] = max(spread[k], ((got[k] - ref[k]).abs().max() /
                                        ref[k].abs().max()).item())
    return loss_err, norm_err, val_err, spread


def loose_slices(model, hp):
    """The parameters whose golden value is rounding noise, and how far they may be off.

    The key third of every block's c_attn bias has an exact gradient of zero: it adds
    q_i·b_k to every score of query i, which the softmax ignores, so the loss does not
    depend on it. Computed gradients are rounding residue (about 1e-18 in float64, 1e-12
    in float32, more or less in pipetrain's order of sums). SGD moves it by lr times that,
    nothing; Adam divides by √v + eps and moves it by up to about lr per step whatever the
    residue's size, so after Adam its value is noise of that size in any implementation.
    Those C values are checked against the bound Σ lr_s instead of the golden values."""
    if hp['optimizer'] == 'sgd':
        return []
    C = model.width
    bound = sum(lr_at(hp, s, steps_of(hp)) for s in range(steps_of(hp)))
    return [dict(tensor='layers.%d.attn.c_attn.bias' % l, begin=C, end=2 * C, atol=bound,
                 why='key bias: exact gradient 0, Adam moves it by rounding noise')
            for l, (kind, _) in enumerate(model.spec) if kind == 'block']


def st_tensors(model):
    """{name: float32 tensor} under pipetrain's checkpoint names; a tied head keeps its
    copy of wte (pipetrain holds V·C parameters for it)."""
    out = {}
    for l in range(len(model.layers)):
        for name, p in model.tensors(l):
            out['layers.%d.%s' % (l, name)] = p.detach().to(torch.float32).contiguous()
    return out


def write_safetensors(path, tensors):
    """A safetensors file (F32 only) with the standard library: 8-byte header length, JSON
    header padded with spaces to a multiple of 8, the tensors back to back in name order."""
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name]
        b = struct.pack('<%df' % t.numel(), *t.reshape(-1).tolist())
        header[name] = dict(dtype='F32', shape=list(t.shape), data_offsets=[off, off + len(b)])
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * (-(8 + len(h)) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + b''.join(blobs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--dry-run', action='store_true', help='write nothing')
    args = ap.parse_args()
    if not torch.__version__.startswith('1.13'):
        print('warning: torch %s, the golden values are defined by 1.13' % torch.__version__,
              file=sys.stderr)
    torch.set_num_threads(1)
    corpus = gpt_torch.read_corpus(os.path.join(GOLDEN, CORPUS))
    tokens, held_out = gpt_torch.split_corpus(corpus, VAL_FRACTION)
    doc = dict(version=1, generator='experiments/golden/make_golden_gpt.py',
               torch=torch.__version__, corpus=CORPUS, corpus_bytes=len(corpus),
               train_tokens=len(tokens), val_fraction=VAL_FRACTION,
               eval_windows=EVAL_WINDOWS, seed=SEED,
               batch=BATCH, betas=list(BETAS), eps=EPS, runs=[])
    for name, model_file, hp in RUNS:
        cfg = os.path.join(GOLDEN, model_file)
        losses, norms, model = train(cfg, hp, torch.float64, tokens)
        if 'clip' in hp and not all(n > hp['clip'] for n in norms):
            sys.exit('%s: the clip norm %g does not bind at every step (norms %s)'
                     % (name, hp['clip'], norms))
        st = 'gpt_%s.safetensors' % name
        tensors = st_tensors(model)
        doc['runs'].append(dict(name=name, model=model_file, hyper=hp,
                                args=pipetrain_args(hp), losses=losses, grad_norms=norms,
                                lrs=[lr_at(hp, s, steps_of(hp)) for s in range(steps_of(hp))],
                                val_loss=val_loss(model, held_out),
                                params=st, loose=loose_slices(model, hp)))
        run = doc['runs'][-1]
        loss_err, norm_err, val_err, spread = float32_spread(
            cfg, hp, tokens, held_out, losses, norms, run['val_loss'], model, run['loose'])
        run['float32_loss_err'] = loss_err
        run['float32_grad_norm_err'] = norm_err
        run['float32_val_loss_err'] = val_err
        run['float32_spread'] = spread
        run['loss_rtol'] = max(LOSS_RTOL, MARGIN * loss_err)
        run['val_loss_rtol'] = max(LOSS_RTOL, MARGIN * val_err)
        run['grad_norm_rtol'] = max(LOSS_RTOL, MARGIN * norm_err)
        run['param_rtol'] = {k: max(PARAM_RTOL, MARGIN * v) for k, v in sorted(spread.items())}
        worst = max((v, k) for k, v in spread.items())
        line = ('%-16s losses %s  norms %s  val %.5f\n%16s float32: losses within %.2g, '
                'validation %.2g, parameters %.2g of max|p| (%s); %d tensors above the '
                'floor %g' % (
                    name, ' '.join('%.5f' % v for v in losses),
                    ' '.join('%.3f' % v for v in norms), run['val_loss'], '', loss_err, val_err,
                    worst[0], worst[1], sum(v > PARAM_RTOL for v in run['param_rtol'].values()),
                    PARAM_RTOL))
        print(line)
        if not args.dry_run:
            write_safetensors(os.path.join(GOLDEN, st), tensors)
    if not args.dry_run:
        with open(os.path.join(GOLDEN, 'gpt_parity.json'), 'w') as f:
            json.dump(doc, f, indent=1)
            f.write('\n')


if __name__ == '__main__':
    main()
