#!/usr/bin/env python3
"""The CPU's products two ways on the same configurations, runs alternating A, B, B, A, ...
so that a slow phase of a shared machine hits both; per configuration the median samples/s
of each with min and max, the ratio B/A of the medians and the median of the ratios of
neighbouring runs (docs/PERFORMANCE.md, "OpenBLAS's kernels and bf16 products on the CPU"):

  --compare precision   A: --precision fp32, B: --precision bf16 (oneDNN, AMX/AVX512_BF16)
  --compare blas        A: OPENBLAS_CORETYPE=PRESCOTT (OpenBLAS's fallback kernels), B: the
                        kernels pipetrain picks (kernels/blas_core.c)

Configurations: gpt-mini on 1 and 2 threads (batch 16), gpt-deep as 2 stages (1f1b,
M = 8, batch 32, 2 ranks x 1 thread), wide-mlp and seed-cnn on 2 threads (batch 256).

    python3 experiments/bench_precision.py --compare precision --json results/precision.json
    python3 experiments/bench_precision.py --compare blas --quick     # smoke test
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
benchlib.add_common_args(p, warmup=1, steps=5, repeats=3)
p.add_argument('--compare', choices=['precision', 'blas'], default='precision')
p.add_argument('--mpiexec', default='mpiexec')
args = p.parse_args()
args.no_peer = True
if args.quick:
    args.repeats, args.warmup, args.steps = 1, 1, 2
benchlib.check_setup(args)

TEXT = ['--text', 'README.md', '--eval-windows', '1']
GPT_MINI = ['--model', 'models/gpt-mini.cfg', *TEXT, '--batch', '16']
IMAGES = ['--batch', '256', '--train-samples', '4096', '--test-samples', '0', '--threads', '2']
CONFIGS = (  # name, ranks, threads, train's arguments
    ('gpt-mini, 1 thread', 1, 1, GPT_MINI + ['--threads', '1']),
    ('gpt-mini, 2 threads', 1, 2, GPT_MINI + ['--threads', '2']),
    ('gpt-deep, 2 stages', 2, 1, ['--model', 'models/gpt-deep.cfg', *TEXT, '--batch', '32',
                                  '--stages', '2', '--microbatches', '8', '--schedule',
                                  '1f1b', '--threads', '1']),
    ('wide-mlp, 2 threads', 1, 2, ['--model', 'models/wide-mlp.cfg', *IMAGES]),
    ('seed-cnn, 2 threads', 1, 2, ['--model', 'models/seed-cnn.cfg', *IMAGES]),
)


def side(name, threads):
    """train's extra arguments and environment of side A or B."""
    env = benchlib.environment(args.env, OPENBLAS_NUM_THREADS=str(threads))
    if args.compare == 'precision':
        return ['--precision', 'fp32' if name == 'a' else 'bf16'], env
    if name == 'a':
        env['OPENBLAS_CORETYPE'] = 'PRESCOTT'
    else:
        env.pop('OPENBLAS_CORETYPE', None)
    return [], env


noise = []
out = {'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'compare': args.compare,
       'steps': args.steps, 'warmup': args.warmup, 'repeats': args.repeats, 'configs': {}}
print('%-22s %22s %22s %7s %7s' % ('configuration', 'A samples/s', 'B samples/s', 'B/A',
                                   'paired'))
for name, ranks, threads, extra in CONFIGS:
    runs, losses = {'a': [], 'b': []}, {}
    for i in range(args.repeats):
        for s in (('a', 'b') if i % 2 == 0 else ('b', 'a')):
            more, env = side(s, threads)
            j = benchlib.train(args, env, ranks, [*extra, *more, '--json', '--steps',
                                                  args.warmup + args.steps, '--untimed-steps',
                                                  args.warmup], noise)
            runs[s].append(j['samples_per_s'])
            losses[s] = j['train_loss']
    c = benchlib.ab_compare(runs['a'], runs['b'])
    out['configs'][name] = dict(c, train_loss=losses)
    fmt = lambda v: '%.1f (%.1f-%.1f)' % (v['median'], v['min'], v['max'])
    print('%-22s %22s %22s %7.2f %7.2f' % (name, fmt(c['a']), fmt(c['b']), c['ratio'],
                                            c['paired_ratio']))
benchlib.noise_report(out, noise)
benchlib.write_json(args.json, out)
