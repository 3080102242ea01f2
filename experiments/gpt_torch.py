#!/usr/bin/python3
"""The GPT of a pipetrain model file, in PyTorch, with pipetrain's parameter layout, its
initialisation and its text windows reproduced exactly, so that pipetrain's training of a
language model can be checked number for number (experiments/golden/make_golden_gpt.py,
tests/gpt_parity.sh).

What is reproduced (docs/DESIGN.md, "Transformer kernels" and "Text corpora"):
  - the model: [embedding] (token matrix wte V×C, positions wpe T×C), GPT-2's pre-norm
    [block]s (ln_1, causal attention softmax(q·kᵀ/√d) over `heads` heads, c_proj, residual;
    ln_2, c_fc, GELU (tanh), c_proj, residual), [layernorm] (ln_f, eps 1e-5), [dropout],
    [lm_head] (C→V, no bias; tied=1 shares wte);
  - the flat parameter vector, layer by layer: weights, then vectors, in the order of the
    engine (LAYOUT below). A tied head keeps its own copy of wte in pipetrain (V·C
    parameters, equal to wte); params_to_flat writes it and flat_to_params checks it;
  - the initial parameters, from Philox4x32-10 (kernels/rng.h) in Python integers:
    normal_value(), init_stream();
  - the training windows of a step (src/io/text_data.c, text_sample_offset).

Pure Python for the generator (one Philox block per parameter: about 0.1 s per 10⁴
parameters); torch only for the model (build, params_to_flat, flat_to_params, init_params).
Self-test: /usr/bin/python3 experiments/gpt_torch.py --self-test
"""
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import read_cfg  # noqa: E402  (pipetrain's model-file reader, in Python)

MASK32 = 0xFFFFFFFF
LN_EPS = 1e-5
INIT_STD = 0.02

# ------------------------------------------------------------------ the generator
def philox4x32_10(seed, stream, index):
    """kernels/rng.h's rng_philox4x32_10: four uint32 lanes of block `index` of (seed, stream)."""
    c0, c1 = index & MASK32, (index >> 32) & MASK32
    c2, c3 = stream & MASK32, (stream >> 32) & MASK32
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1,
                          p0 & MASK32)
        k0 = (k0 + 0x9E3779B9) & MASK32
        k1 = (k1 + 0xBB67AE85) & MASK32
    return c0, c1, c2, c3


def init_stream(layer, k):
    """kernels/rng.h's rng_stream_init_tensor: the stream of tensor k (its index in the
    layer's tensor list, layer_tensors) of layer `layer` (its index after [net])."""
    return (1 << 62) | (1 << 59) | (layer << 8) | k


def float32(x):
    """x (a Python float, i.e. double) rounded once to the nearest float32, as a float."""
    return struct.unpack('<f', struct.pack('<f', x))[0]


def normal_value(seed, stream, i, std):
    """Element i of the normal sequence (seed, stream) times std: Box–Muller on lanes 0 and
    1 of Philox block i, in double, rounded once to float32. u1 = (r0 + 1)/2³² ∈ (0, 1] so
    that the logarithm is finite."""
    r = philox4x32_10(seed, stream, i)
    u1 = (r[0] + 1.0) / 4294967296.0
    u2 = r[1] / 4294967296.0
    z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return float32(std * z)


def normal_values(seed, stream, count, std):
    return [normal_value(seed, stream, i, std) for i in range(count)]


# ------------------------------------------------------------------ text windows
def text_stream(step):
    """kernels/rng.h's rng_stream_text."""
    return (1 << 61) | (step & ((1 << 61) - 1))


def text_sample_offset(count, T, seed, step, i):
    """src/io/text_data.c: the offset of sample i of `step`'s window of T+1 tokens in a
    corpus of `count` tokens (64 random bits mod count − T)."""
    if T < 1 or count < T + 1:
        raise ValueError('a corpus of %d tokens holds no window of %d + 1 tokens' % (count, T))
    r = philox4x32_10(seed, text_stream(step), i)
    return (r[0] | r[1] << 32) % (count - T)


def text_batch(tokens, T, seed, step, batch):
    """Inputs and targets of samples 0..batch−1 of `step`: two lists of `batch` lists of T."""
    xs, ys = [], []
    for i in range(batch):
        o = text_sample_offset(len(tokens), T, seed, step, i)
        xs.append(list(tokens[o:o + T]))
        ys.append(list(tokens[o + 1:o + T + 1]))
    return xs, ys


def text_tail_count(count, fraction):
    """src/io/text_data.c's text_tail_count: the tokens a validation fraction holds."""
    if not 0 < fraction < 1:
        return 0
    return max(1, int(count * fraction))


def split_corpus(tokens, val_fraction):
    """(training tokens, validation tokens): the last text_tail_count tokens held out, as
    `train --val-fraction` does."""
    n = text_tail_count(len(tokens), val_fraction)
    return (tokens[:len(tokens) - n], tokens[len(tokens) - n:]) if n else (tokens, [])


def eval_offsets(count, T, n):
    """src/io/data_text.c's data_text_eval: n windows evenly spaced over a part of `count`
    tokens, the first at 0 and the last ending at its end (n cut to the distinct ones)."""
    if T < 1 or count < T + 1:
        raise ValueError('%d tokens hold no window of %d + 1 tokens' % (count, T))
    last = count - T - 1
    n = min(n, last + 1)
    return [k * last // (n - 1) if n > 1 else 0 for k in range(n)]


def eval_batch(tokens, T, n):
    """Inputs and targets of the evaluation windows of a part (eval_offsets)."""
    offs = eval_offsets(len(tokens), T, n)
    return ([list(tokens[o:o + T]) for o in offs], [list(tokens[o + 1:o + T + 1]) for o in offs])


def read_corpus(path):
    """A UTF-8 text file as byte tokens (vocabulary 256), as text_load_utf8 reads it."""
    with open(path, 'rb') as f:
        raw = f.read()
    raw.decode('utf-8')  # refuses what pipetrain refuses (Python's decoder is as strict)
    if not raw:
        raise ValueError('%s: empty file' % path)
    return list(raw)


# ------------------------------------------------------------------ the model
def model_spec(cfg):
    """The layers of a language model file as [(kind, dict)], with every default applied:
    embedding {vocab, context, width}; block {heads, hidden, dropout}; layernorm {};
    dropout {p}; lm_head {vocab, tied}. `cfg`: a path or read_cfg's list."""
    sections = read_cfg(cfg) if isinstance(cfg, str) else cfg
    if len(sections) < 2 or sections[1][0] != 'embedding':
        raise ValueError('not a language model: the first layer must be [embedding]')
    layers, C, V, T = [], None, None, None
    for kind, kv, line in sections[1:]:
        if kind == 'embedding':
            V, T, C = int(kv['vocab']), int(kv['context']), int(kv['width'])
            layers.append((kind, dict(vocab=V, context=T, width=C)))
        elif kind == 'block':
            heads = int(kv['heads'])
            if C % heads:
                raise ValueError('line %d: heads=%d does not divide %d' % (line, heads, C))
            layers.append((kind, dict(heads=heads, hidden=int(kv.get('hidden', 4 * C)),
                                      dropout=float(kv.get('dropout', 0)))))
        elif kind == 'layernorm':
            layers.append((kind, {}))
        elif kind == 'dropout':
            layers.append((kind, dict(p=float(kv['p']))))
        elif kind == 'lm_head':
            if int(kv.get('vocab', V)) != V:
                raise ValueError('line %d: [lm_head] vocab differs from the embedding\'s' % line)
            layers.append((kind, dict(vocab=V, tied=int(kv.get('tied', 0)))))
        else:
            raise ValueError('line %d: [%s] is not a language-model layer' % (line, kind))
    if layers[-1][0] != 'lm_head':
        raise ValueError('the last layer must be [lm_head]')
    return layers


# The engine's order of each layer's tensors: weights (the matrices), then vectors.
LAYOUT = {
    'embedding': ('wte.weight', 'wpe.weight'),
    'block': ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight',
              'mlp.c_proj.weight',
              'ln_1.weight', 'ln_1.bias', 'attn.c_attn.bias', 'attn.c_proj.bias',
              'ln_2.weight', 'ln_2.bias', 'mlp.c_fc.bias', 'mlp.c_proj.bias'),
    'layernorm': ('weight', 'bias'),
    'lm_head': ('weight',),
    'dropout': (),
}
# How many leading tensors of LAYOUT are weights (the rest are vectors).
WEIGHT_TENSORS = {'embedding': 2, 'block': 4, 'layernorm': 1, 'lm_head': 1, 'dropout': 0}


def _modules():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Embedding(nn.Module):
        def __init__(self, V, T, C, dtype):
            super().__init__()
            self.wte = nn.Embedding(V, C, dtype=dtype)
            self.wpe = nn.Embedding(T, C, dtype=dtype)

        def forward(self, idx):  # idx [B, t] long
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.wte(idx) + self.wpe(pos)

    class Attention(nn.Module):
        def __init__(self, C, heads, dtype):
            super().__init__()
            self.heads = heads
            self.c_attn = nn.Linear(C, 3 * C, dtype=dtype)
            self.c_proj = nn.Linear(C, C, dtype=dtype)

        def forward(self, x):
            B, T, C = x.shape
            h, d = self.heads, C // self.heads
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (z.view(B, T, h, d).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
            att = F.softmax(att.masked_fill(~mask, float('-inf')), dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self, C, H, dtype):
            super().__init__()
            self.c_fc = nn.Linear(C, H, dtype=dtype)
            self.c_proj = nn.Linear(H, C, dtype=dtype)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate='tanh'))

    class Block(nn.Module):
        def __init__(self, C, heads, H, p, dtype):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=LN_EPS, dtype=dtype)
            self.attn = Attention(C, heads, dtype)
            self.ln_2 = nn.LayerNorm(C, eps=LN_EPS, dtype=dtype)
            self.mlp = MLP(C, H, dtype)
            # where pipetrain applies a block's dropout is its own business: this peer
            # reproduces dropout-free blocks only (the masks could not match anyway)
            self.p = p

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class LayerNorm(nn.LayerNorm):
        def __init__(self, C, dtype):
            super().__init__(C, eps=LN_EPS, dtype=dtype)

    class LMHead(nn.Module):
        def __init__(self, V, C, tied_to, dtype):
            super().__init__()
            if tied_to is None:
                self.weight = nn.Parameter(torch.empty(V, C, dtype=dtype))
            else:  # the same Parameter: torch adds both gradients into it
                self.weight = tied_to
            self.tied = tied_to is not None

        def forward(self, x):
            return F.linear(x, self.weight)

    class GPT(nn.Module):
        """layers[i] is pipetrain's layer i (the i-th section after [net])."""

        def __init__(self, spec, dtype):
            super().__init__()
            self.spec = spec
            mods = []
            E = spec[0][1]
            C, V = E['width'], E['vocab']
            self.vocab, self.context, self.width = V, E['context'], C
            for kind, kv in spec:
                if kind == 'embedding':
                    mods.append(Embedding(V, E['context'], C, dtype))
                elif kind == 'block':
                    mods.append(Block(C, kv['heads'], kv['hidden'], kv['dropout'], dtype))
                elif kind == 'layernorm':
                    mods.append(LayerNorm(C, dtype))
                elif kind == 'dropout':
                    mods.append(nn.Dropout(kv['p']))
                elif kind == 'lm_head':
                    mods.append(LMHead(V, C, mods[0].wte.weight if kv['tied'] else None,
                                       dtype))
            self.layers = nn.ModuleList(mods)

        def forward(self, idx):
            """idx [B, t] (t ≤ context) long: logits [B, t, V]."""
            x = idx
            for m in self.layers:
                x = m(x)
            return x

        def blocks(self):
            return sum(1 for kind, _ in self.spec if kind == 'block')

        def tensors(self, l):
            """[(name, Parameter)] of layer l in the engine's order (a tied head: wte)."""
            m = self.layers[l]
            return [(name, m.get_parameter(name)) for name in LAYOUT[self.spec[l][0]]]

        def flat_count(self):
            return sum(p.numel() for l in range(len(self.layers)) for _, p in self.tensors(l))

        def decay_groups(self):
            """nanoGPT's AdamW groups as gpt-spec.md fixes them: (decayed, not decayed)
            lists of distinct Parameters. Decayed: the four matrices of every block and an
            untied head's matrix; never biases, norms, embeddings (nor a tied head)."""
            decay, no_decay, seen = [], [], set()
            for l, (kind, kv) in enumerate(self.spec):
                for k, (_, p) in enumerate(self.tensors(l)):
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                    matrix = k < WEIGHT_TENSORS[kind]
                    dec = (kind == 'block' and matrix) or (kind == 'lm_head' and not kv['tied'])
                    (decay if dec else no_decay).append(p)
            return decay, no_decay

    return GPT


def build(cfg, dtype=None):
    """The GPT of a model file (path or read_cfg's list) in `dtype` (torch.float32 unless
    given), its parameters uninitialised: see init_params."""
    import torch
    return _modules()(model_spec(cfg), dtype or torch.float32)


def params_to_flat(model):
    """pipetrain's flat parameter vector (a 1-D tensor of the model's dtype): every layer's
    tensors in the engine's order; a tied head holds a copy of wte."""
    import torch
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for l in range(len(model.layers))
                          for _, p in model.tensors(l)])


def layer_slices(model):
    """[(layer, name, offset, shape)] of every tensor in the flat vector."""
    out, off = [], 0
    for l in range(len(model.layers)):
        for name, p in model.tensors(l):
            out.append((l, name, off, tuple(p.shape)))
            off += p.numel()
    return out


def flat_to_params(model, flat):
    """Loads a flat vector (anything torch.as_tensor takes) into the model. A tied head's
    copy must equal wte: ValueError otherwise (the engine keeps them bit-identical)."""
    import torch
    flat = torch.as_tensor(flat).reshape(-1)
    if flat.numel() != model.flat_count():
        raise ValueError('%d values for a model of %d' % (flat.numel(), model.flat_count()))
    loaded = {}
    with torch.no_grad():
        for l, name, off, shape in layer_slices(model):
            p = model.layers[l].get_parameter(name)
            v = flat[off:off + p.numel()].reshape(shape).to(p.dtype)
            if id(p) in loaded:
                if not torch.equal(loaded[id(p)], v):
                    raise ValueError('layer %d: the tied head\'s copy differs from wte' % l)
                continue
            p.copy_(v)
            loaded[id(p)] = v


def init_values(spec, seed):
    """pipetrain's initial flat vector as a list of floats (float32 values): matrices and
    embeddings normal(0, 0.02), the residual projections normal(0, 0.02/√(2·blocks)),
    biases 0, layer-norm weights 1, a tied head a copy of wte."""
    blocks = sum(1 for kind, _ in spec if kind == 'block')
    resid_std = INIT_STD / math.sqrt(2 * blocks) if blocks else INIT_STD
    out, wte = [], None
    E = spec[0][1]
    V, T, C = E['vocab'], E['context'], E['width']
    for l, (kind, kv) in enumerate(spec):
        if kind == 'embedding':
            wte = normal_values(seed, init_stream(l, 0), V * C, INIT_STD)
            out += wte + normal_values(seed, init_stream(l, 1), T * C, INIT_STD)
        elif kind == 'block':
            H = kv['hidden']
            out += normal_values(seed, init_stream(l, 0), 3 * C * C, INIT_STD)
            out += normal_values(seed, init_stream(l, 1), C * C, resid_std)
            out += normal_values(seed, init_stream(l, 2), H * C, INIT_STD)
            out += normal_values(seed, init_stream(l, 3), C * H, resid_std)
            # ln_1 (1, 0), c_attn, c_proj, ln_2 (1, 0), c_fc, c_proj biases
            out += [1.0] * C + [0.0] * C + [0.0] * (4 * C) + [1.0] * C + [0.0] * C
            out += [0.0] * (H + C)
        elif kind == 'layernorm':
            out += [1.0] * C + [0.0] * C
        elif kind == 'lm_head':
            out += list(wte) if kv['tied'] else normal_values(seed, init_stream(l, 0), V * C,
                                                              INIT_STD)
    return out


def init_params(model, seed):
    """Sets the model's parameters to pipetrain's initialisation for `seed`."""
    import torch
    flat_to_params(model, torch.tensor(init_values(model.spec, seed), dtype=torch.float64))


# ------------------------------------------------------------------ self-test
def _self_test():
    """Properties that need no C: Philox's published known-answer vectors (Random123's
    kat_vectors, philox4x32_10), the normals' moments, the tied copy, the layout, and a
    float32 model against a float64 one from the same parameters."""
    # Random123 kat_vectors: philox4x32 10 rounds, counter/key all zero, all ones, and pi
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((MASK32,) * 4, (MASK32,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        got = philox4x32_10(key[0] | key[1] << 32, ctr[2] | ctr[3] << 32,
                            ctr[0] | ctr[1] << 32)
        assert got == want, ('philox KAT', [hex(x) for x in got], [hex(x) for x in want])
    z = normal_values(1, init_stream(0, 0), 20000, 1.0)
    mean = sum(z) / len(z)
    var = sum((v - mean) ** 2 for v in z) / len(z)
    assert abs(mean) < 0.03 and abs(var - 1) < 0.05, (mean, var)
    import torch
    here = os.path.dirname(os.path.abspath(__file__))
    cfgs = [os.path.join(here, '..', 'tests', 'golden', n) for n in
            ('gpt_tiny.cfg', 'gpt_tiny_tied.cfg')]
    for cfg in cfgs:
        m64 = build(cfg, torch.float64)
        init_params(m64, 5)
        flat = params_to_flat(m64)
        m32 = build(cfg, torch.float32)
        flat_to_params(m32, flat)
        assert torch.equal(params_to_flat(m32).double(), flat)
        if m64.spec[-1][1]['tied']:
            E = m64.spec[0][1]
            vc = E['vocab'] * E['width']
            assert torch.equal(flat[:vc], flat[-vc:]), 'tied copy'
            bad = flat.clone()
            bad[-1] += 1
            try:
                flat_to_params(m32, bad)
                raise AssertionError('a tied copy that differs was accepted')
            except ValueError:
                pass
        idx = torch.randint(0, m64.vocab, (3, m64.context))
        l64, l32 = m64(idx), m32(idx)
        err = (l64 - l32.double()).abs().max().item()
        assert err < 1e-5, err
        print('%s: %d parameters, float32 vs float64 logits %.2g' %
              (os.path.basename(cfg), flat.numel(), err))
    print('self-test: OK')


if __name__ == '__main__':
    if sys.argv[1:] == ['--self-test']:
        _self_test()
    else:
        print(__doc__)
        sys.exit(2)
