#!/usr/bin/env python3
"""Rounding envelope of a training run: is another device's run as close to the CPU's as
the CPU's own rounding allows? (experiments/cuda/README.md, "Tolerances of step 3")

  envelope_check.py perturb IN OUT SEED [OUT SEED]...
      OUT = IN with every float32 value multiplied by (1 + u * 2^-23), u uniform in [-1, 1]
      drawn from SEED: each moves by about one unit in the last place, as rounding moves
      it. A pipetrain checkpoint (parameters and optimizer state) stays one: its checksums
      are made anew.
  envelope_check.py set-meta IN OUT KEY=VALUE...
      OUT = IN with those metadata values (checksums made anew): a checkpoint that resumes
      with another --lr, for a negative control.
  envelope_check.py check START REF [RUN] --envelope START_i RUN_i [--envelope ...] [options]
      the update of each of REF's tensors (trained - START) in RUN against REF, measured
      against the spread of the envelope runs (REF's training from a perturbed start, each
      update taken from its own start). One line per tensor, then a verdict line; exit 0
      within the envelope, 1 outside it, 2 on an input error. --run-start: RUN's own start
      when not START; --also NAME RUN RUN_START (repeated): more runs checked in the same
      pass, each with its block and verdict line "NAME: ...".
  envelope_check.py plant RUN START OUT [--tensor NAME] [--size X]
      OUT = RUN with X * ||update|| (default 1e-3) added to one element of one tensor
      (default: the one with most elements; the element in its middle): a localised error,
      for the self-test.

Two statistics per tensor, U the update, U_ref REF's, d = U - U_ref:
  bulk  ||d|| / ||U_ref|| over the elements left when the TRIM (5%) with the largest |d|
        are set aside. Rounding decides a few discrete things: a pre-activation within
        rounding of zero goes to one side of a ReLU or the other, a near-tie of a max-pool,
        the sign of a near-zero gradient that Adam turns into a full-size step. Each sends
        a few elements far, and after several steps the whole trajectory elsewhere; one step
        from a common start, those are a few elements. Any systematic error (a kernel 0.1%
        off) moves every element, so the bulk sees it whatever the few do.
  norm  ||d|| / ||U_ref||: a large localised error (a wrong tile) shows here.
E, the envelope of a statistic, is its largest value over the envelope runs. RUN passes a
tensor when bulk <= max(k_bulk * E_bulk, floor_bulk) and norm <= max(k_norm * E_norm,
floor_norm, floor_norm_size / sqrt(n)), n the tensor's size: one discrete rounding event
moves a handful of elements, a share of a tensor's norm that falls as 1/sqrt(n). The
defaults hold for one step from a common start; README.md ("Tolerances of step 3") gives
the measurements behind them and the looser options envelope_lib.sh passes for five steps;
envelope_selftest.sh measures them again. The verdict line ends with the largest ratio of a
statistic to its limit over the tensors (above 1: outside).
"""
import argparse
import json
import struct
import sys
import zlib

import numpy as np

# The defaults: one step from a common start (validate.sh 3c, 3e; README.md, "Tolerances of
# step 3"). Measured on the CPU over batch 64 and 128, seeds 1-4: rounding moved the bulk by
# 2.8e-6 at most, the norm by 3.9e-4 in layers.0.weight (one max-pool decision, 9 of 288
# elements) and 2.4e-5 in the tensors over 1000 elements; lr 0.1% high moves both by 1e-3
# in every tensor. FLOOR_BULK is 36 times the one and a tenth of the other; the norm's
# floors are 7 times the largest event (5e-2/sqrt(288) = 2.9e-3), and 8 times 2.4e-5.
# K: where this case's own envelope runs show more than the floors assume, 10 times that.
K_BULK = 10.0
FLOOR_BULK = 1e-4
K_NORM = 10.0
FLOOR_NORM = 2e-4
FLOOR_NORM_SIZE = 5e-2  # the norm's floor is max(FLOOR_NORM, FLOOR_NORM_SIZE / sqrt(n))
TRIM = 0.05  # the fraction of elements (largest |d|) the bulk statistic sets aside
CRC = 'crc32:'


class InputError(Exception):
    pass


def read_raw(path):
    """The header as a dict and the data bytes of a safetensors file."""
    try:
        with open(path, 'rb') as f:
            blob = f.read()
    except OSError as e:
        raise InputError(f'{path}: {e.strerror}')
    if len(blob) < 8:
        raise InputError(f'{path}: not a safetensors file (too short)')
    n, = struct.unpack('<Q', blob[:8])
    if n > len(blob) - 8:
        raise InputError(f'{path}: not a safetensors file (header of {n} bytes)')
    try:
        head = json.loads(blob[8:8 + n])
    except ValueError:
        raise InputError(f'{path}: not a safetensors file (its header is not JSON)')
    if not isinstance(head, dict):
        raise InputError(f'{path}: not a safetensors file (its header is not an object)')
    return head, blob[8 + n:]


def tensors(head, data, path):
    """name -> float32 array (a view of DATA), for every tensor; every one must be F32."""
    out = {}
    for k, v in head.items():
        if k == '__metadata__':
            continue
        if v.get('dtype') != 'F32':
            raise InputError(f'{path}: {k} is {v.get("dtype")}, expected F32')
        a, b = v['data_offsets']
        if not 0 <= a <= b <= len(data) or b - a != 4 * int(np.prod(v['shape'], dtype=np.int64)):
            raise InputError(f'{path}: {k}: bad data offsets {a}..{b}')
        out[k] = np.frombuffer(data, dtype='<f4', count=(b - a) // 4, offset=a).reshape(v['shape'])
    return out


def load(path):
    head, data = read_raw(path)
    return {k: t.astype(np.float64) for k, t in tensors(head, data, path).items()}


def crc_hex(b):
    return f'{zlib.crc32(b) & 0xffffffff:08x}'


def write_like(path, head, data, new, meta=None):
    """Writes HEAD and DATA with the tensors of NEW and the metadata values of META put in.
    pipetrain's checksums ("crc32:NAME" of each tensor's bytes, "crc32:__metadata__" of the
    other metadata pairs in key order, src/io/safetensors.c) are made anew where the file
    has them."""
    buf = bytearray(data)
    for k, t in new.items():
        a, b = head[k]['data_offsets']
        buf[a:b] = np.ascontiguousarray(t, dtype='<f4').tobytes()
    head = json.loads(json.dumps(head))
    md = head.get('__metadata__')
    if meta:
        if md is None:
            md = head['__metadata__'] = {}
        md.update(meta)
    if md is not None and any(key.startswith(CRC) for key in md):
        for k, v in head.items():
            if k != '__metadata__' and CRC + k in md:
                a, b = v['data_offsets']
                md[CRC + k] = crc_hex(bytes(buf[a:b]))
        pairs = sorted((key.encode(), val.encode()) for key, val in md.items()
                       if key != CRC + '__metadata__')
        md[CRC + '__metadata__'] = crc_hex(b''.join(key + b'\0' + val + b'\0'
                                                    for key, val in pairs))
    raw = json.dumps(head, separators=(',', ':')).encode()
    raw += b' ' * (-len(raw) % 8)  # the header padded to 8 bytes, as the format suggests
    try:
        with open(path, 'wb') as f:
            f.write(struct.pack('<Q', len(raw)))
            f.write(raw)
            f.write(bytes(buf))
    except OSError as e:
        raise InputError(f'{path}: {e.strerror}')


def perturb(args):
    head, data = read_raw(args.input)
    ts = tensors(head, data, args.input)
    if len(args.pairs) % 2:
        raise InputError('perturb: give OUT SEED pairs')
    for out, seed in zip(args.pairs[::2], args.pairs[1::2]):
        try:
            seed = int(seed)
        except ValueError:
            raise InputError(f'perturb: seed {seed!r} is not a whole number')
        rng = np.random.default_rng(seed)
        new, moved, total = {}, 0, 0
        for k in sorted(ts):  # sorted: the draw does not depend on the header's order
            t = ts[k].astype(np.float64)
            p = (t * (1.0 + rng.uniform(-1.0, 1.0, size=t.shape) * 2.0 ** -23)).astype(np.float32)
            new[k] = p
            moved += int((p != ts[k]).sum())
            total += t.size
        write_like(out, head, data, new)
        print(f'perturbed {args.input} -> {out} (seed {seed}): {moved} of {total} values moved '
              f'by one unit in the last place')
    return 0


def set_meta(args):
    head, data = read_raw(args.input)
    meta = {}
    for kv in args.pairs:
        key, eq, val = kv.partition('=')
        if not eq or not key:
            raise InputError(f'set-meta: {kv!r} is not KEY=VALUE')
        if key.startswith(CRC):
            raise InputError(f'set-meta: {key} is a checksum, made anew anyway')
        meta[key] = val
    write_like(args.output, head, data, {}, meta)
    print(f'{args.input} -> {args.output}: ' + ', '.join(f'{k}={v}' for k, v in meta.items()))
    return 0


def plant(args):
    head, data = read_raw(args.run)
    run = tensors(head, data, args.run)
    start = load(args.start)
    name = args.tensor or max(sorted(run), key=lambda k: run[k].size)
    if name not in run or name not in start:
        raise InputError(f'no tensor {name} in both {args.run} and {args.start}')
    t = run[name].astype(np.float64)
    u = t - start[name]
    add = args.size * float(np.sqrt((u * u).sum()))
    flat = t.ravel().copy()
    i = flat.size // 2
    flat[i] += add
    write_like(args.output, head, data, {name: flat.reshape(t.shape)})
    print(f'planted {add:.3e} ({args.size:g} of the update\'s norm) in {name}[{i}] -> '
          f'{args.output}')
    return 0


def stats(u, u_ref, trim=TRIM):
    """(bulk, norm) of update U against U_REF, float64 arrays of one tensor."""
    d = (u - u_ref).ravel()
    r = u_ref.ravel()
    ref_norm = float(np.sqrt(r @ r))
    dn = float(np.sqrt(d @ d))
    if ref_norm == 0.0:  # a tensor the reference left alone: any move is a difference
        return (0.0, 0.0) if dn == 0.0 else (float('inf'), float('inf'))
    keep = np.argsort(np.abs(d), kind='stable')[:d.size - int(trim * d.size)]
    dk, rk = d[keep], r[keep]
    rkn = float(np.sqrt(rk @ rk))
    bulk = float(np.sqrt(dk @ dk)) / rkn if rkn > 0 else (0.0 if not dk.any() else float('inf'))
    return bulk, dn / ref_norm


def check_one(name, run, run_start, start, ref, env, args):
    """The per-tensor lines and the verdict of one run; returns (ok, the JSON record)."""
    names = sorted(ref)
    rows = []
    for k in names:
        u_ref = ref[k] - start[k]
        b, n = stats(run[k] - run_start[k], u_ref)
        eb = en = 0.0
        for s_i, r_i in env:
            bi, ni = stats(r_i[k] - s_i[k], u_ref)
            eb, en = max(eb, bi), max(en, ni)
        lb = float(max(args.k_bulk * eb, args.floor_bulk))
        ln = float(max(args.k_norm * en, args.floor_norm,
                       args.floor_norm_size / np.sqrt(u_ref.size)))
        ok = bool(b <= lb and n <= ln)
        rows.append({'tensor': k, 'size': int(u_ref.size),
                     'update_norm': float(np.sqrt((u_ref * u_ref).sum())),
                     'bulk': b, 'bulk_envelope': eb, 'bulk_limit': lb,
                     'norm': n, 'norm_envelope': en, 'norm_limit': ln, 'ok': ok})
        print(f'{k:18s} {u_ref.size:8d}  bulk {b:.2e} (envelope {eb:.2e}, limit {lb:.2e})'
              f'  norm {n:.2e} (envelope {en:.2e}, limit {ln:.2e})  {"ok" if ok else "OUTSIDE"}')
    bad = [r['tensor'] for r in rows if not r['ok']]
    # the verdict names, for each statistic, the tensor nearest its limit (or furthest past)
    rb = max(rows, key=lambda r: r['bulk'] / r['bulk_limit'])
    rn = max(rows, key=lambda r: r['norm'] / r['norm_limit'])
    worst = max(rb['bulk'] / rb['bulk_limit'], rn['norm'] / rn['norm_limit'])
    verdict = ('WITHIN ENVELOPE' if not bad else
               f'OUTSIDE ENVELOPE in {len(bad)} of {len(rows)} tensors')
    print(f'{name + ": " if name else ""}{verdict}: bulk {rb["bulk"]:.1e} (limit '
          f'{rb["bulk_limit"]:.1e}, envelope {rb["bulk_envelope"]:.1e}) in {rb["tensor"]}; norm '
          f'{rn["norm"]:.1e} (limit {rn["norm_limit"]:.1e}, envelope {rn["norm_envelope"]:.1e}) '
          f'in {rn["tensor"]}; largest value/limit {worst:.3g}')
    return not bad, {'name': name, 'ok': not bad, 'largest_ratio': worst, 'rows': rows}


def check(args):
    start, ref = load(args.start), load(args.ref)
    env = [(load(s), load(r)) for s, r in args.envelope]
    runs = []
    if args.run:
        runs.append(('', args.run, args.run_start or args.start))
    elif args.run_start:
        raise InputError('--run-start goes with RUN')
    runs += [tuple(r) for r in args.also]
    if not runs:
        raise InputError('check needs RUN or --also NAME RUN RUN_START')
    loaded = [(name, load(r), load(rs)) for name, r, rs in runs]
    names = sorted(ref)
    need = [('start', start, False)]
    for name, r, rs in loaded:
        need += [(f'run {name}'.strip(), r, True), (f'start of run {name}'.strip(), rs, False)]
    for i, (s_i, r_i) in enumerate(env):
        need += [(f'envelope start {i + 1}', s_i, False), (f'envelope run {i + 1}', r_i, True)]
    for what, d, exact in need:  # a start may hold more (a checkpoint's optimizer state)
        missing = [k for k in names if k not in d]
        if missing or (exact and set(d) != set(names)):
            raise InputError(f'the {what} holds other tensors than the reference'
                             f'{" (lacks " + missing[0] + ")" if missing else ""}')
        for k in names:
            if d[k].shape != ref[k].shape:
                raise InputError(f'{what}: {k} has shape {d[k].shape}, the reference '
                                 f'{ref[k].shape}')
    all_ok, records = True, []
    for name, r, rs in loaded:
        if name:
            print(f'== {name}')
        ok, rec = check_one(name, r, rs, start, ref, env, args)
        all_ok &= ok
        records.append(rec)
    if args.json:
        try:
            with open(args.json, 'w') as f:
                json.dump({'ok': all_ok, 'runs': records, 'k_bulk': args.k_bulk,
                           'floor_bulk': args.floor_bulk, 'k_norm': args.k_norm,
                           'floor_norm': args.floor_norm,
                           'floor_norm_size': args.floor_norm_size, 'trim': TRIM,
                           'envelope_runs': len(env)}, f, indent=1)
        except OSError as e:
            raise InputError(f'{args.json}: {e.strerror}')
    return 0 if all_ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split('\n', 1)[1])
    sub = ap.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('perturb', help='a start perturbed by rounding')
    p.add_argument('input')
    p.add_argument('pairs', nargs='+', metavar='OUT SEED')
    p = sub.add_parser('set-meta', help='a checkpoint with other metadata values')
    p.add_argument('input')
    p.add_argument('output')
    p.add_argument('pairs', nargs='+', metavar='KEY=VALUE')
    p = sub.add_parser('check', help='a run against the reference and its envelope')
    p.add_argument('start')
    p.add_argument('ref')
    p.add_argument('run', nargs='?')
    p.add_argument('--also', nargs=3, action='append', default=[],
                   metavar=('NAME', 'RUN', 'RUN_START'),
                   help='one more run to check, with its name and start (its own verdict line, '
                        '"NAME: ..."; the exit status says whether every run was within)')
    p.add_argument('--run-start', help="RUN's own start, when not START (the self-test's "
                   'stand-in for another device starts from a perturbed copy)')
    p.add_argument('--envelope', nargs=2, action='append', default=[],
                   metavar=('START_I', 'RUN_I'), help='an envelope run and its start')
    p.add_argument('--k-bulk', type=float, default=K_BULK)
    p.add_argument('--floor-bulk', type=float, default=FLOOR_BULK)
    p.add_argument('--k-norm', type=float, default=K_NORM)
    p.add_argument('--floor-norm', type=float, default=FLOOR_NORM)
    p.add_argument('--floor-norm-size', type=float, default=FLOOR_NORM_SIZE,
                   help='the norm limit is at least this over the square root of the '
                        "tensor's size (0: off)")
    p.add_argument('--json', help='also write the figures as JSON here')
    p = sub.add_parser('plant', help='a localised error planted in a run')
    p.add_argument('run')
    p.add_argument('start')
    p.add_argument('output')
    p.add_argument('--tensor')
    p.add_argument('--size', type=float, default=1e-3)
    args = ap.parse_args()
    try:
        if args.cmd == 'check' and not args.envelope:
            raise InputError('check needs at least one --envelope START_I RUN_I')
        return {'perturb': perturb, 'set-meta': set_meta, 'check': check,
                'plant': plant}[args.cmd](args)
    except InputError as e:
        print(f'envelope_check.py: {e}', file=sys.stderr)
        return 2
    except Exception:  # a crash must not read as a verdict (1: outside the envelope)
        import traceback
        traceback.print_exc()
        return 2


if __name__ == '__main__':
    sys.exit(main())
