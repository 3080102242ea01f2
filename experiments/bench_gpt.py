#!/usr/bin/env python3
"""Language-model training throughput: pipetrain beside PyTorch on gpt-mini, in one run on
one machine, and gpt-mini as a 2-stage pipeline beside one process.

Configurations (batch 8 windows of 256 tokens, AdamW, lr 1e-3):
  t1      pipetrain --threads 1              vs the peer, 1 thread (OpenBLAS 1)
  t2      pipetrain --threads 2              vs the peer's best of 2 threads with OpenBLAS 1
                                                and 1 thread with OpenBLAS 2
  stages2 mpiexec -n 2 pipetrain --stages 2 --threads 1 --microbatches 8 (1f1b)
                                             vs pipetrain in one process with 1 thread

Each run is a fresh process, the sides alternating (their order swapped every repeat),
under one environment (`tuned`, see benchlib.py); the median (min-max) of --repeats runs in
tokens/s, the ratio, and the largest share of the machine other processes used during a
run (noise; above 0.05 the figures are suspect). The peer is experiments/gpt_peer.py
(PyTorch; Debian: apt-get install python3-torch).

    python3 experiments/bench_gpt.py --repeats 3 --json results/gpt.json
    python3 experiments/bench_gpt.py --quick        # smoke test of the set-up
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

MODEL = 'models/gpt-mini.cfg'
CONTEXT = 256
BATCH = 8


def pipetrain_cmd(args, threads, ranks=1, extra=()):
    cmd = [args.pipetrain, 'train', '--model', MODEL, '--data', 'text', '--batch', str(BATCH),
           '--optimizer', args.optimizer, '--lr', '1e-3', '--threads', str(threads),
           '--untimed-steps', str(args.warmup), '--steps', str(args.warmup + args.steps),
           '--eval-windows', '1', '--json', *extra]
    return [args.mpiexec, '-n', str(ranks), *cmd] if ranks > 1 else cmd


def peer_cmd(args, threads, blas):
    return [args.python or sys.executable, os.path.join(benchlib.HERE, 'gpt_peer.py'),
            '--model', MODEL, '--batch', str(BATCH), '--optimizer', args.optimizer,
            '--lr', '1e-3', '--threads', str(threads), '--blas-threads', str(blas),
            '--untimed-steps', str(args.warmup), '--steps', str(args.steps)]


def tokens_per_s(j):
    return j['samples_per_s'] * CONTEXT


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    benchlib.add_common_args(p, warmup=2, steps=6, repeats=3)
    p.add_argument('--mpiexec', default='mpiexec')
    p.add_argument('--optimizer', default='adamw', help='adamw (default) or sgd')
    p.add_argument('--only', default='', help='comma list of: t1, t2, stages2')
    args = p.parse_args()
    if args.quick:
        args.repeats, args.warmup, args.steps = 1, 1, 2
    benchlib.check_setup(args)
    env = benchlib.environment(args.env)
    only = set(args.only.split(',')) if args.only else {'t1', 't2', 'stages2'}

    # name: [(side, command)], the first side is pipetrain, the others its references
    configs = []
    if 't1' in only:
        configs.append(('t1', [('pipetrain 1 thread', pipetrain_cmd(args, 1))] +
                        ([] if args.no_peer else [('PyTorch 1 thread', peer_cmd(args, 1, 1))])))
    if 't2' in only:
        configs.append(('t2', [('pipetrain 2 threads', pipetrain_cmd(args, 2))] +
                        ([] if args.no_peer else
                         [('PyTorch 2 threads, OpenBLAS 1', peer_cmd(args, 2, 1)),
                          ('PyTorch 1 thread, OpenBLAS 2', peer_cmd(args, 1, 2))])))
    if 'stages2' in only:
        configs.append(('stages2', [
            ('pipetrain 2 stages × 1 thread',
             pipetrain_cmd(args, 1, 2, ['--stages', '2', '--microbatches', '8',
                                        '--schedule', '1f1b'])),
            ('pipetrain 1 process, 1 thread', pipetrain_cmd(args, 1))]))

    results = []
    for name, sides in configs:
        runs = {what: [] for what, _ in sides}
        noise = []
        for rep in range(args.repeats):
            order = sides if rep % 2 == 0 else list(reversed(sides))
            for what, cmd in order:
                try:
                    j = benchlib.run(cmd, env, what)
                except RuntimeError as e:
                    benchlib.fail(e)
                runs[what].append(tokens_per_s(j))
                noise.append(j['noise'])
            print('.', end='', file=sys.stderr, flush=True)
        first = sides[0][0]
        row = {'name': name, 'sides': {w: benchlib.summary(v) for w, v in runs.items()},
               'noise_max': max(noise)}
        if len(sides) > 1:
            best = max((w for w, _ in sides[1:]), key=lambda w: row['sides'][w]['median'])
            row['reference'] = best
            row['ratio'] = row['sides'][first]['median'] / row['sides'][best]['median']
        results.append(row)
    print(file=sys.stderr)
    print('%-8s %-32s %26s %7s %6s' % ('config', 'side', 'tokens/s median (min-max)', 'ratio',
                                      'noise'))
    for r in results:
        for k, (w, s) in enumerate(r['sides'].items()):
            ratio = ('%6.2fx' % r['ratio']) if k == 0 and 'ratio' in r else ''
            print('%-8s %-32s %12.0f (%5.0f-%5.0f) %7s %6s' % (
                r['name'] if k == 0 else '', w, s['median'], s['min'], s['max'], ratio,
                '%.2f' % r['noise_max'] if k == 0 else ''))
    if any(r['noise_max'] > benchlib.NOISY for r in results):
        print('noise above %.2f: other processes used the machine during some runs; rerun on '
              'an idle machine for figures to report' % benchlib.NOISY)
    if args.quick:
        print('(--quick: a smoke test of %d timed steps; not figures to report)' % args.steps)
    benchlib.write_json(args.json, {
        'model': MODEL, 'batch': BATCH, 'context': CONTEXT, 'optimizer': args.optimizer,
        'env': args.env, 'repeats': args.repeats, 'steps': args.steps, 'warmup': args.warmup,
        'quick': args.quick, 'peer_python': args.python,
        'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'results': results})


if __name__ == '__main__':
    main()
