#!/usr/bin/env python3
"""Two builds of pipetrain against each other (a change's before and after): the same
configurations on the same machine, runs alternating A, B, A, B, ... so that a slow phase of
a shared machine hits both; per configuration the median samples/s of each with min and
max, the ratio B/A of the medians, and the median of the ratios of neighbouring runs
(paired: it cancels the machine's slow phases). For a change that must not move speed.

Configurations (batch 128, 4,096 training samples, no test pass):
  seed-cnn, 1 process, 2 threads (Adam)      wide-mlp, 1 process, 2 threads (SGD)
  seed-cnn --stages 2 (1f1b, M 8), 2 ranks x 1 thread
  seed-cnn --replicas 2 (allreduce), 2 ranks x 1 thread

    python3 experiments/bench_ab.py --a before/build/pipetrain --b build/pipetrain \\
        --json results/ab.json
    python3 experiments/bench_ab.py --a X --b Y --quick     # smoke test
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
benchlib.add_common_args(p, warmup=3, steps=20, repeats=7)
p.add_argument('--a', required=True, help='the first binary (before)')
p.add_argument('--b', required=True, help='the second binary (after)')
p.add_argument('--mpiexec', default='mpiexec')
args = p.parse_args()
args.no_peer = True
if args.quick:
    args.repeats, args.warmup, args.steps = 1, 1, 3
binaries, untimed = {}, {}
for side in ('a', 'b'):
    args.pipetrain = getattr(args, side)
    benchlib.check_setup(args)
    binaries[side] = args.pipetrain
    # builds before --untimed-steps existed call it --warmup
    helptext = subprocess.run([args.pipetrain, 'train', '--help'], capture_output=True,
                              text=True).stdout
    untimed[side] = '--untimed-steps' if '--untimed-steps' in helptext else '--warmup'

SEED_CNN = ['--model', 'models/seed-cnn.cfg', '--optimizer', 'adam', '--lr', '0.001']
WIDE_MLP = ['--model', 'models/wide-mlp.cfg', '--optimizer', 'sgd', '--lr', '0.01']
COMMON = ['--batch', '128', '--test-samples', '0', '--json', '--train-samples', '4096']
CONFIGS = (
    ('seed-cnn, 2 threads', 1, 2, SEED_CNN + ['--threads', '2']),
    ('wide-mlp, 2 threads', 1, 2, WIDE_MLP + ['--threads', '2']),
    ('seed-cnn --stages 2', 2, 1, SEED_CNN + ['--threads', '1', '--stages', '2',
                                              '--microbatches', '8']),
    ('seed-cnn --replicas 2', 2, 1, SEED_CNN + ['--threads', '1', '--replicas', '2',
                                                '--reduce', 'allreduce']),
)
noise = []
out = {'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'a': binaries['a'], 'b': binaries['b'],
       'steps': args.steps, 'warmup': args.warmup, 'repeats': args.repeats, 'configs': {}}
print('%-24s %22s %22s %7s %7s' % ('configuration', 'A samples/s', 'B samples/s', 'B/A',
                                   'paired'))
for name, ranks, threads, extra in CONFIGS:
    env = benchlib.environment(args.env, OPENBLAS_NUM_THREADS=str(threads))
    runs = {'a': [], 'b': []}
    for i in range(args.repeats):
        for side in (('a', 'b') if i % 2 == 0 else ('b', 'a')):
            args.pipetrain = binaries[side]
            j = benchlib.train(args, env, ranks, [*extra, *COMMON, '--steps',
                                                  args.warmup + args.steps, untimed[side],
                                                  args.warmup], noise)
            runs[side].append(j['samples_per_s'])
    c = out['configs'][name] = benchlib.ab_compare(runs['a'], runs['b'])
    fmt = lambda s: '%.0f (%.0f-%.0f)' % (s['median'], s['min'], s['max'])
    print('%-24s %22s %22s %7.3f %7.3f' % (name, fmt(c['a']), fmt(c['b']), c['ratio'],
                                            c['paired_ratio']))
benchlib.noise_report(out, noise)
benchlib.write_json(args.json, out)
