#!/usr/bin/env bash
# experiments/export_gpt2.py: a pipetrain checkpoint of a GPT-2-shaped model exported under
# GPT-2's tensor names for Hugging Face's GPT2LMHeadModel. Checks, with the standard
# library: every name and shape GPT-2 has, the four matrices of each block transposed to
# Conv1D's [in, out], the values otherwise unchanged, a tied head written as
# tie_word_embeddings without lm_head.weight, and a model of another shape refused. Where
# /usr/bin/python3 has `transformers` and torch, GPT2LMHeadModel loads the export with no
# missing or unexpected tensor and gives the logits of the PyTorch peer
# (experiments/gpt_torch.py) loaded from the same checkpoint; elsewhere that part is skipped.
source "$(dirname "$0")/lib/common.bash"
EXPORT=$PT_SOURCE_DIR/experiments/export_gpt2.py

for tied in 0 1; do
    sed "s/^\[lm_head\].*/[lm_head]\ntied=$tied/" "$MODELS/gpt-nano.cfg" >"$WORK/nano$tied.cfg"
    "$PIPETRAIN" train --model "$WORK/nano$tied.cfg" --steps 2 --batch 4 --threads 1 \
        --save "$WORK/ck$tied.st" >"$WORK/train.out" 2>&1 || {
        failed "train tied=$tied: $(tail -c 300 "$WORK/train.out")"
        continue
    }
    rc=0
    python3 "$EXPORT" --model "$WORK/nano$tied.cfg" --load "$WORK/ck$tied.st" \
        --out "$WORK/hf$tied" >"$WORK/out" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        failed "export tied=$tied: exit $rc: $(head -c 300 "$WORK/out")"
        continue
    fi
    rc=0
    python3 - "$WORK/ck$tied.st" "$WORK/hf$tied" "$tied" >"$WORK/check" 2>&1 <<'EOF' || rc=$?
import json, os, struct, sys
def read(path):
    raw = open(path, 'rb').read()
    (n,) = struct.unpack('<Q', raw[:8])
    h = json.loads(raw[8:8 + n]); d = raw[8 + n:]
    return {k: (tuple(v['shape']), struct.unpack('<%df' % ((v['data_offsets'][1] - v['data_offsets'][0]) // 4),
                                                 d[v['data_offsets'][0]:v['data_offsets'][1]]))
            for k, v in h.items() if k != '__metadata__'}
ck, hf, tied = read(sys.argv[1]), read(os.path.join(sys.argv[2], 'model.safetensors')), int(sys.argv[3])
cfg = json.load(open(os.path.join(sys.argv[2], 'config.json')))
V, T, C, H, L = 256, 32, 32, 128, 2
want = {'transformer.wte.weight': (V, C), 'transformer.wpe.weight': (T, C),
        'transformer.ln_f.weight': (C,), 'transformer.ln_f.bias': (C,)}
for i in range(L):
    p = 'transformer.h.%d.' % i
    want.update({p + 'ln_1.weight': (C,), p + 'ln_1.bias': (C,), p + 'ln_2.weight': (C,),
                 p + 'ln_2.bias': (C,), p + 'attn.c_attn.weight': (C, 3 * C),
                 p + 'attn.c_attn.bias': (3 * C,), p + 'attn.c_proj.weight': (C, C),
                 p + 'attn.c_proj.bias': (C,), p + 'mlp.c_fc.weight': (C, H),
                 p + 'mlp.c_fc.bias': (H,), p + 'mlp.c_proj.weight': (H, C),
                 p + 'mlp.c_proj.bias': (C,)})
if not tied:
    want['lm_head.weight'] = (V, C)
bad = [k for k in want if k not in hf or hf[k][0] != want[k]] + [k for k in hf if k not in want]
assert not bad, 'names or shapes: %s' % bad
assert cfg['tie_word_embeddings'] == bool(tied) and cfg['n_layer'] == L and cfg['n_head'] == 2
# Conv1D's [in, out]: element [j][i] of the export is [i][j] of pipetrain's [out, in]
a, b = ck['layers.1.attn.c_attn.weight'][1], hf['transformer.h.0.attn.c_attn.weight'][1]
assert all(b[j * 3 * C + i] == a[i * C + j] for i in range(3 * C) for j in range(C)), 'c_attn transpose'
a, b = ck['layers.2.mlp.c_proj.weight'][1], hf['transformer.h.1.mlp.c_proj.weight'][1]
assert all(b[j * C + i] == a[i * H + j] for i in range(C) for j in range(H)), 'c_proj transpose'
assert hf['transformer.wte.weight'][1] == ck['layers.0.wte.weight'][1]
assert hf['transformer.h.1.ln_2.bias'][1] == ck['layers.2.ln_2.bias'][1]
print('ok: %d tensors' % len(hf))
EOF
    if [ "$rc" -eq 0 ]; then
        pass "export tied=$tied: GPT-2's names and shapes, Conv1D transposed ($(cat "$WORK/check"))"
    else
        failed "export tied=$tied: $(tail -c 400 "$WORK/check")"
    fi
done

# A model that is not GPT-2's shape is refused with a message.
rc=0
python3 "$EXPORT" --model "$MODELS/seed-mlp.cfg" --load "$WORK/ck0.st" --out "$WORK/hfx" \
    >"$WORK/out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] && grep -q "GPT2LMHeadModel needs" "$WORK/out"; then
    pass "an image model is refused: $(head -n 1 "$WORK/out")"
else
    failed "image model: exit $rc: $(head -c 300 "$WORK/out")"
fi

# GPT2LMHeadModel itself, where it is installed (PT_HF_PYTHON: a Python that has transformers
# and torch, e.g. a virtual environment made with --system-site-packages)
HF_PY=${PT_HF_PYTHON:-/usr/bin/python3}
if "$HF_PY" -c "import transformers, torch" 2>/dev/null; then
    rc=0
    "$HF_PY" - "$PT_SOURCE_DIR" "$WORK" >"$WORK/hf.out" 2>&1 <<'EOF' || rc=$?
import json, os, struct, sys
import torch
sys.path.insert(0, os.path.join(sys.argv[1], 'experiments'))
import gpt_torch
from transformers import GPT2LMHeadModel
work = sys.argv[2]
for tied in (0, 1):
    hf, info = GPT2LMHeadModel.from_pretrained(os.path.join(work, 'hf%d' % tied),
                                               output_loading_info=True)
    assert not info['missing_keys'] and not info['unexpected_keys'], info
    raw = open(os.path.join(work, 'ck%d.st' % tied), 'rb').read()
    (n,) = struct.unpack('<Q', raw[:8]); h = json.loads(raw[8:8 + n]); d = raw[8 + n:]
    def tensor(name):
        b, e = h[name]['data_offsets']
        return torch.tensor(struct.unpack('<%df' % ((e - b) // 4), d[b:e]))
    model = gpt_torch.build(os.path.join(work, 'nano%d.cfg' % tied))
    flat = []
    for l, _ in enumerate(model.spec):
        for name, _ in model.tensors(l):
            key = 'layers.0.wte.weight' if model.spec[l][0] == 'lm_head' and tied else 'layers.%d.%s' % (l, name)
            flat.append(tensor(key))
    gpt_torch.flat_to_params(model, torch.cat(flat))
    idx = torch.arange(32).reshape(1, 32) % 256
    with torch.no_grad():
        a, b = model(idx), hf(idx).logits
    err = (a - b).abs().max().item()
    assert err < 1e-4, 'tied=%d: logits differ by %g' % (tied, err)
    print('tied=%d: logits within %.2g' % (tied, err))
EOF
    if [ "$rc" -eq 0 ]; then
        pass "GPT2LMHeadModel loads the exports: $(tr '\n' ' ' <"$WORK/hf.out")"
    else
        failed "GPT2LMHeadModel: $(tail -c 500 "$WORK/hf.out")"
    fi
else
    echo "skip: transformers is not installed for $HF_PY (GPT2LMHeadModel not loaded; set PT_HF_PYTHON)"
fi
finish
