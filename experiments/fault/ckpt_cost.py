#!/usr/bin/env python3
"""What checkpoints cost a training run: step time without them, with --checkpoint-every N
written in the background (the default) and in the foreground (--checkpoint-write sync),
alternating, R runs each; the time one checkpoint holds training and the time its write
takes; and the cost of the default interval (--checkpoint-minutes 10) extrapolated from
the hold per checkpoint.

    python3 experiments/fault/ckpt_cost.py [--pipetrain build/pipetrain] [--ranks 2]
        [--model models/seed-cnn.cfg] [--steps 80] [--every 10] [--repeats 3] [--json FILE]

Prints a table (median [min-max] of the runs); --json writes the runs and the summary.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile

def run(args, extra, tmp):
    cmd = (['mpiexec', '-n', str(args.ranks)] if args.ranks > 1 else []) + [
        args.pipetrain, 'train', '--model', args.model, '--batch', str(args.batch),
        '--steps', str(args.steps), '--untimed-steps', '5', '--test-samples', '0', '--threads', '1',
        '--optimizer', 'adam', '--lr', '0.001', '--json']
    if args.ranks > 1:
        cmd += ['--stages', str(args.ranks), '--microbatches', '8']
    d = os.path.join(tmp, 'ck')
    shutil.rmtree(d, ignore_errors=True)
    if extra:
        cmd += ['--checkpoint-dir', d] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    j['step_s'] = j['train_s'] / j['steps']
    return j

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--pipetrain', default='build/pipetrain')
    ap.add_argument('--model', default='models/seed-cnn.cfg')
    ap.add_argument('--ranks', type=int, default=2)
    ap.add_argument('--batch', type=int, default=128)
    ap.add_argument('--steps', type=int, default=80)
    ap.add_argument('--every', type=int, default=10)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--json')
    args = ap.parse_args()
    variants = {'none': [],
                f'every {args.every}, background': ['--checkpoint-every', str(args.every)],
                f'every {args.every}, sync': ['--checkpoint-every', str(args.every),
                                              '--checkpoint-write', 'sync']}
    runs = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for k, extra in variants.items():
                runs[k].append(run(args, extra, tmp))
    def med(xs):
        return statistics.median(xs), min(xs), max(xs)
    base = med([r['step_s'] for r in runs['none']])[0]
    print(f'{args.model}, {args.ranks} rank(s), batch {args.batch}, {args.steps} steps, '
          f'{args.repeats} alternating runs each (median [min-max])')
    print(f'{"variant":<24}{"ms/step":>9}  {"[min - max]":<16}{"cost":>7}'
          f'{"hold ms/ckpt":>14}{"write ms/ckpt":>15}')
    summary = {}
    for k, rs in runs.items():
        m, lo, hi = med([1e3 * r['step_s'] for r in rs])
        n = [r['checkpoints_written'] for r in rs]
        hold = med([1e3 * r['checkpoint_hold_s'] / max(1, r['checkpoints_written']) for r in rs])[0]
        write = med([1e3 * r['checkpoint_write_s'] / max(1, r['checkpoints_written']) for r in rs])[0]
        cost = m / (1e3 * base) - 1
        summary[k] = {'ms_per_step': m, 'min': lo, 'max': hi, 'cost': cost,
                      'checkpoints': n[0], 'hold_ms': hold, 'write_ms': write}
        print(f'{k:<24}{m:9.2f}  [{lo:.2f} - {hi:.2f}]{"":<3}{100 * cost:6.1f}%'
              f'{hold if n[0] else float("nan"):14.1f}{write if n[0] else float("nan"):15.1f}')
    bg = summary[f'every {args.every}, background']
    default_cost = bg['hold_ms'] / 1e3 / 600
    print(f'default interval (--checkpoint-minutes 10): {bg["hold_ms"]:.1f} ms held per '
          f'600 s = {100 * default_cost:.4f}% of training time')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'args': vars(args), 'summary': summary,
                       'default_interval_cost': default_cost,
                       'runs': {k: [{x: r[x] for x in ('step_s', 'checkpoints_written',
                                                       'checkpoint_hold_s', 'checkpoint_write_s')}
                                    for r in rs] for k, rs in runs.items()}}, f, indent=1)

if __name__ == '__main__':
    sys.exit(main())
