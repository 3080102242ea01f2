#!/usr/bin/env python3
"""Exports a pipetrain checkpoint of a GPT-2-style language model to the layout Hugging
Face's `GPT2LMHeadModel` loads: a directory with `config.json` and `model.safetensors`
under GPT-2's tensor names (transformer.wte.weight, transformer.h.N.attn.c_attn.weight, ...,
transformer.ln_f.*, lm_head.weight when untied).

pipetrain stores a checkpoint's tensors as layers.<i>.<GPT-2's name> (docs/DESIGN.md) with
PyTorch's linear layout [out, in]; GPT-2's Conv1D keeps [in, out], so the four matrices of
each block are transposed. A tied head's matrix is the token matrix (stored once, as
layers.0.wte.weight) and config.json says tie_word_embeddings. The model file must be
[embedding], [block]…, [layernorm], [lm_head] (GPT-2's shape); anything else is refused.

Standard library only:

    python3 experiments/export_gpt2.py --model models/gpt-mini.cfg --load ck.st --out hf-gpt/
    # then, where `transformers` is installed:
    #   GPT2LMHeadModel.from_pretrained('hf-gpt/')
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import read_cfg  # noqa: E402  (the model-file reader, standard library only)

BLOCK_MATRICES = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight',
                  'mlp.c_proj.weight')
BLOCK_VECTORS = ('ln_1.weight', 'ln_1.bias', 'attn.c_attn.bias', 'attn.c_proj.bias',
                 'ln_2.weight', 'ln_2.bias', 'mlp.c_fc.bias', 'mlp.c_proj.bias')


def fail(msg):
    sys.exit('export_gpt2: %s' % msg)


def read_st(path):
    """{name: (shape, raw little-endian float32 bytes)} of a safetensors file."""
    try:
        with open(path, 'rb') as f:
            raw = f.read()
    except OSError as e:
        fail('%s: %s' % (path, e.strerror))
    if len(raw) < 8:
        fail('%s: not a safetensors file' % path)
    (n,) = struct.unpack('<Q', raw[:8])
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError:
        fail('%s: not a safetensors file (its header is not JSON)' % path)
    data, out = raw[8 + n:], {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        if info.get('dtype') != 'F32':
            fail('%s: tensor %s is %s, not F32' % (path, name, info.get('dtype')))
        b, e = info['data_offsets']
        out[name] = (tuple(info['shape']), data[b:e])
    return out


def transpose(shape, raw):
    rows, cols = shape
    vals = struct.unpack('<%df' % (rows * cols), raw)
    t = [vals[r * cols + c] for c in range(cols) for r in range(rows)]
    return (cols, rows), struct.pack('<%df' % (rows * cols), *t)


def write_st(path, tensors):
    header, offset = {'__metadata__': {'format': 'pt'}}, 0
    for name, (shape, raw) in tensors:
        header[name] = {'dtype': 'F32', 'shape': list(shape),
                        'data_offsets': [offset, offset + len(raw)]}
        offset += len(raw)
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h)
        for _, (_, raw) in tensors:
            f.write(raw)


def model_shape(cfg_path):
    """(V, T, C, heads, hidden, blocks, tied) of a GPT-2-shaped model file."""
    secs = [(k, kv) for k, kv, _ in read_cfg(cfg_path)[1:]]
    kinds = [k for k, _ in secs]
    n = len(kinds)
    if n < 3 or kinds[0] != 'embedding' or kinds[-1] != 'lm_head' or kinds[-2] != 'layernorm' \
            or any(k != 'block' for k in kinds[1:-2]):
        fail('%s: GPT2LMHeadModel needs [embedding], [block]…, [layernorm], [lm_head]; '
             'this model has %s' % (cfg_path, ', '.join(kinds)))
    emb = secs[0][1]
    V, T, C = int(emb['vocab']), int(emb['context']), int(emb['width'])
    blocks = [kv for k, kv in secs[1:-2]]
    heads = {int(kv['heads']) for kv in blocks}
    hidden = {int(kv.get('hidden', 4 * C)) for kv in blocks}
    if len(heads) > 1 or len(hidden) > 1:
        fail('%s: GPT2LMHeadModel needs every block alike (heads %s, hidden %s)'
             % (cfg_path, sorted(heads), sorted(hidden)))
    if any(float(kv.get('dropout', 0)) for kv in blocks):
        fail('%s: dropout inside blocks is not exported' % cfg_path)
    tied = int(secs[-1][1].get('tied', 0))
    return V, T, C, heads.pop(), hidden.pop(), len(blocks), tied


def export(cfg_path, ck_path, out_dir):
    V, T, C, heads, hidden, L, tied = model_shape(cfg_path)
    st = read_st(ck_path)

    def get(name, shape):
        if name not in st:
            fail('%s: no tensor %s: is it a checkpoint of %s?' % (ck_path, name, cfg_path))
        if st[name][0] != shape:
            fail('%s: %s has shape %s, the model needs %s'
                 % (ck_path, name, list(st[name][0]), list(shape)))
        return st[name]

    out = [('transformer.wte.weight', get('layers.0.wte.weight', (V, C))),
           ('transformer.wpe.weight', get('layers.0.wpe.weight', (T, C)))]
    shapes = {'attn.c_attn.weight': (3 * C, C), 'attn.c_proj.weight': (C, C),
              'mlp.c_fc.weight': (hidden, C), 'mlp.c_proj.weight': (C, hidden),
              'ln_1.weight': (C,), 'ln_1.bias': (C,), 'attn.c_attn.bias': (3 * C,),
              'attn.c_proj.bias': (C,), 'ln_2.weight': (C,), 'ln_2.bias': (C,),
              'mlp.c_fc.bias': (hidden,), 'mlp.c_proj.bias': (C,)}
    for i in range(L):
        for name in BLOCK_VECTORS + BLOCK_MATRICES:
            t = get('layers.%d.%s' % (i + 1, name), shapes[name])
            if name in BLOCK_MATRICES:  # Conv1D keeps [in, out]
                t = transpose(*t)
            out.append(('transformer.h.%d.%s' % (i, name), t))
    out.append(('transformer.ln_f.weight', get('layers.%d.weight' % (L + 1), (C,))))
    out.append(('transformer.ln_f.bias', get('layers.%d.bias' % (L + 1), (C,))))
    if not tied:
        out.append(('lm_head.weight', get('layers.%d.weight' % (L + 2), (V, C))))
    config = {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2', 'vocab_size': V,
              'n_positions': T, 'n_ctx': T, 'n_embd': C, 'n_layer': L, 'n_head': heads,
              'n_inner': hidden, 'activation_function': 'gelu_new',
              'layer_norm_epsilon': 1e-5, 'resid_pdrop': 0.0, 'embd_pdrop': 0.0,
              'attn_pdrop': 0.0, 'tie_word_embeddings': bool(tied),
              'bos_token_id': V - 1, 'eos_token_id': V - 1}
    try:
        os.makedirs(out_dir, exist_ok=True)
        write_st(os.path.join(out_dir, 'model.safetensors'), out)
        with open(os.path.join(out_dir, 'config.json'), 'w') as f:
            json.dump(config, f, indent=1)
    except OSError as e:
        fail('%s: %s' % (out_dir, e.strerror))
    return len(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', required=True, help='the model file the checkpoint belongs to')
    p.add_argument('--load', required=True, help="pipetrain's checkpoint (.safetensors)")
    p.add_argument('--out', required=True, help='directory for config.json and model.safetensors')
    a = p.parse_args()
    n = export(a.model, a.load, a.out)
    print('wrote %s: %d tensors under GPT-2\'s names, and config.json' % (a.out, n))


if __name__ == '__main__':
    main()
