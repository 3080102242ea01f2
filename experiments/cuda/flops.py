#!/usr/bin/env python3
"""Floating-point operations per sample of a pipetrain model file, forward and training.

    python3 experiments/cuda/flops.py models/seed-cnn.cfg [--json] [--pipetrain BIN]

Counts the multiply-adds of the convolution and dense layers (one multiply-add = 2 FLOPs),
the work that dominates and that a GPU's FP32 peak is quoted for:
  forward   2 · MACs of every conv and dense layer;
  backward  the weight gradient (2 · MACs) of every layer with parameters, plus the input
            gradient (2 · MACs) of every such layer that has a layer with parameters before
            it: nothing needs the gradient of the data, so the first conv skips it;
  training  forward + backward.
The usual rule "training = 3 × forward" is printed beside it; it differs only by the
first layer's input gradient. Bias adds, activations, pooling, dropout, the loss and the
optimizer update are elementwise (under 1% here) and are left out, as FLOP counts of
networks usually do.

Parses the model file the way src/model/net.c does ([net] input=C,H,W, default 1,28,28; [conv]
filters, size, stride 1, pad 0; [maxpool]/[avgpool] size 2, stride = size; [dense] units,
flattening a spatial input; [dropout]; [flatten]; ';' and '#' start comments). With
--pipetrain it also runs `pipetrain summary` and fails if the parameter counts disagree,
so a parser drift shows. Exits 1 on a malformed file.
"""
import argparse, json, re, subprocess, sys

LAYER_SECTIONS = ('conv', 'maxpool', 'avgpool', 'dense', 'dropout', 'flatten')


def parse_model(path):
    """[(section, {key: value}, line)] in file order, [net] first."""
    sections = []
    with open(path, encoding='utf-8') as f:
        for lineno, raw in enumerate(f, 1):
            line = re.split(r'[;#]', raw, maxsplit=1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r'\[\s*([A-Za-z0-9_]+)\s*\]', line)
            if m:
                sections.append((m.group(1), {}, lineno))
                continue
            if '=' not in line or not sections:
                raise ValueError(f'{path}:{lineno}: expected [section] or key=value')
            key, value = (s.strip() for s in line.split('=', 1))
            sections[-1][1][key] = value
    if not sections or sections[0][0] != 'net':
        raise ValueError(f'{path}: the first section must be [net]')
    return sections


def layer_table(path):
    """Per layer: type, output shape, parameters, MACs, forward and backward FLOPs."""
    sections = parse_model(path)
    net = sections[0][1]
    c, h, w = (int(x) for x in net.get('input', '1,28,28').split(','))
    layers, seen_params = [], False
    for name, keys, lineno in sections[1:]:
        if name not in LAYER_SECTIONS:
            raise ValueError(f'{path}:{lineno}: unknown section [{name}]')
        params = macs = 0
        if name == 'conv':
            k = int(keys['size'])
            stride, pad = int(keys.get('stride', 1)), int(keys.get('pad', 0))
            filters = int(keys['filters'])
            oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
            params = filters * c * k * k + filters
            macs = filters * oh * ow * c * k * k
            c, h, w = filters, oh, ow
        elif name in ('maxpool', 'avgpool'):
            k = int(keys.get('size', 2))
            stride = int(keys.get('stride', k))
            h, w = (h - k) // stride + 1, (w - k) // stride + 1
        elif name == 'dense':
            units = int(keys['units'])
            n_in = c * h * w
            params = n_in * units + units
            macs = n_in * units
            c, h, w = units, 1, 1
        elif name == 'flatten':
            c, h, w = c * h * w, 1, 1
        fwd = 2 * macs
        # weight gradient always; input gradient only when an earlier layer learns
        bwd = 2 * macs + (2 * macs if seen_params else 0) if params else 0
        seen_params = seen_params or params > 0
        layers.append({'layer': name, 'line': lineno, 'out': [c, h, w], 'params': params,
                       'macs': macs, 'forward_flops': fwd, 'backward_flops': bwd})
    return layers


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('model', help='model file, e.g. models/seed-cnn.cfg')
    ap.add_argument('--json', action='store_true', help='print one JSON object instead')
    ap.add_argument('--pipetrain', help='cross-check the parameter count with this binary')
    args = ap.parse_args()
    try:
        layers = layer_table(args.model)
    except (OSError, ValueError, KeyError) as e:
        print(f'flops.py: {args.model}: {e!r}', file=sys.stderr)
        return 1
    params = sum(L['params'] for L in layers)
    fwd = sum(L['forward_flops'] for L in layers)
    bwd = sum(L['backward_flops'] for L in layers)
    res = {'model': args.model, 'params': params, 'macs_per_sample': fwd // 2,
           'forward_flops_per_sample': fwd, 'backward_flops_per_sample': bwd,
           'train_flops_per_sample': fwd + bwd, 'train_flops_3x_forward': 3 * fwd,
           'layers': layers}

    if args.pipetrain:
        out = subprocess.run([args.pipetrain, 'summary', '--model', args.model],
                             capture_output=True, text=True)
        m = re.search(r'Total params:\s*([\d,]+)', out.stdout)
        if out.returncode != 0 or not m:
            print(f'flops.py: `pipetrain summary` failed: {out.stderr.strip()}', file=sys.stderr)
            return 1
        theirs = int(m.group(1).replace(',', ''))
        res['params_pipetrain'] = theirs
        if theirs != params:
            print(f'flops.py: {params} parameters here, {theirs} by pipetrain summary: the '
                  'parser here is out of date', file=sys.stderr)
            return 1

    if args.json:
        print(json.dumps(res))
        return 0
    print(f'{args.model}: FLOPs per sample (1 multiply-add = 2 FLOPs; conv and dense only)')
    print(f'{"layer":<9}{"output":>16}{"params":>12}{"MACs":>14}{"forward":>14}{"backward":>14}')
    for L in layers:
        shape = '×'.join(str(x) for x in L['out'])
        print(f'{L["layer"]:<9}{shape:>16}{L["params"]:>12,}{L["macs"]:>14,}'
              f'{L["forward_flops"]:>14,}{L["backward_flops"]:>14,}')
    print(f'{"total":<9}{"":>16}{params:>12,}{fwd // 2:>14,}{fwd:>14,}{bwd:>14,}')
    print(f'forward  {fwd / 1e6:9.3f} MFLOP per sample')
    print(f'backward {bwd / 1e6:9.3f} MFLOP per sample (no gradient for the input data)')
    print(f'training {(fwd + bwd) / 1e6:9.3f} MFLOP per sample '
          f'(3 × forward would be {3 * fwd / 1e6:.3f})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
