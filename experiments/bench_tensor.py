#!/usr/bin/env python3
"""Tensor shards (train --tensor) on this machine: 2 ranks x 1 thread against the other ways
of using the same 2 cores.

For models/wide-dense.cfg (784-4096-4096-10, batch 128, SGD) and models/seed-cnn.cfg (batch
128, Adam): one process with 1 thread (the baseline) and with 2 threads (the ideal use of 2
cores by one rank), --tensor 2 in both modes, --replicas 2 (data parallel, allreduce) and
--stages 2 (1f1b, M = 8). Reported per layout: samples/s and its ratio to 2 threads, time in
tensor collectives per step (measured, and priced from the group's measured alpha-beta),
parameters per rank (whole model / T expected, plus the biases kept whole by input-split
layers), and train's simulator prediction of the step (step_predicted_s, from measured
per-op times) against the measured step.

Every run is a fresh process under benchlib's `tuned` environment with one BLAS thread per
rank; the median of --repeats runs by samples/s is reported.

    python3 experiments/bench_tensor.py --json results/tensor.json
    python3 experiments/bench_tensor.py --quick          # smoke test
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
benchlib.add_common_args(p, warmup=3, steps=15, repeats=3)
p.add_argument('--models', default='wide-dense,seed-cnn')
p.add_argument('--mpiexec', default='mpiexec')
args = p.parse_args()
args.no_peer = True  # pipetrain against itself
if args.quick:
    args.repeats, args.warmup, args.steps = 1, 1, 3
benchlib.check_setup(args)

ENV = benchlib.environment(args.env, OPENBLAS_NUM_THREADS='1')
MODELS = {
    'wide-dense': ['--model', 'models/wide-dense.cfg', '--optimizer', 'sgd', '--lr', '0.01'],
    'seed-cnn': ['--model', 'models/seed-cnn.cfg', '--optimizer', 'adam', '--lr', '0.001'],
}
COMMON = ['--batch', '128', '--test-samples', '0', '--json', '--train-samples', '4096']
LAYOUTS = (
    ('1 process, 1 thread', 1, ['--threads', '1']),
    ('1 process, 2 threads', 1, ['--threads', '2']),
    ('--tensor 2 megatron', 2, ['--threads', '1', '--tensor', '2', '--tensor-mode', 'megatron']),
    ('--tensor 2 gather', 2, ['--threads', '1', '--tensor', '2', '--tensor-mode', 'gather']),
    ('--replicas 2', 2, ['--threads', '1', '--replicas', '2', '--reduce', 'allreduce']),
    ('--stages 2 (1f1b, M 8)', 2, ['--threads', '1', '--stages', '2', '--microbatches', '8']),
)
noise = []


def plan_step(model, extra):
    """pipetrain plan's prediction of the step for the layout (its profile of this machine's
    CPU, one thread per rank), or None."""
    keep = {'--stages', '--replicas', '--tensor', '--tensor-mode', '--microbatches', '--reduce'}
    opts = [] if '--stages' in extra else ['--stages', '1']
    for k, v in zip(extra[::2], extra[1::2]):
        if k in keep:
            opts += [k, v]
    cmd = [args.pipetrain, 'plan', '--model', MODELS[model][1], '--batch', '128', '--json', *opts]
    try:
        out = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
        return json.loads(out.stdout)['predicted']['step_s']
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return None


def median_run(n, base, extra):
    return benchlib.median_train(args, ENV, n, [*base, *COMMON, '--steps',
                                                args.warmup + args.steps, '--untimed-steps',
                                                args.warmup, *extra], noise)


out = {'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'env': args.env, 'steps': args.steps,
       'warmup': args.warmup, 'repeats': args.repeats, 'quick': args.quick, 'models': {}}
for model in args.models.split(','):
    if model not in MODELS:
        benchlib.fail('unknown model %s (%s)' % (model, ', '.join(MODELS)))
    print('\n%s, batch 128' % model)
    print('%-24s %10s %7s %10s %10s %12s %9s %9s %6s %9s %6s' % (
        'layout', 'samples/s', 'vs 2thr', 'coll ms/st', 'pred ms/st', 'params/rank', 'step ms',
        'sim ms', 'err', 'plan ms', 'err'))
    rows = []
    ideal = None
    for label, n, extra in LAYOUTS:
        r, runs = median_run(n, MODELS[model], extra)
        if label.startswith('1 process, 2'):
            ideal = r['samples_per_s']
        step = max(r['stage_wall_s']) / args.steps
        pred = r.get('step_predicted_s')
        tens = r.get('stage_tensor_s') or [0]
        tpred = r.get('stage_tensor_predicted_s') or [None]
        coll = max(t or 0 for t in tens) / args.steps
        cpred = (max(t for t in tpred) / args.steps) if tpred[0] is not None else None
        params = max(r.get('stage_params') or [0])
        # plan prices one thread per rank
        planned = plan_step(model, extra) if extra[extra.index('--threads') + 1] == '1' else None
        row = {'layout': label, 'ranks': n, 'samples_per_s': r['samples_per_s'], 'runs': runs,
               'tensor_s_per_step': coll, 'tensor_predicted_s_per_step': cpred,
               'params_per_rank': params, 'step_s': step, 'step_predicted_s': pred,
               'tensor_alpha_s': r.get('tensor_alpha_s'), 'tensor_beta_Bps': r.get('tensor_beta_Bps'),
               'plan_step_s': planned}
        rows.append(row)
        print('%-24s %10.0f %7s %10.2f %10s %12.0f %9.1f %9s %6s %9s %6s' % (
            label, r['samples_per_s'], '%.2f' % (r['samples_per_s'] / ideal) if ideal else '-',
            1e3 * coll, '%.2f' % (1e3 * cpred) if cpred is not None else '-', params, 1e3 * step,
            '%.1f' % (1e3 * pred) if pred else '-',
            '%+.0f%%' % (100 * (pred - step) / step) if pred else '-',
            '%.1f' % (1e3 * planned) if planned else '-',
            '%+.0f%%' % (100 * (planned - step) / step) if planned else '-'), flush=True)
    out['models'][model] = rows
out['noise'] = noise
if args.json:
    benchlib.write_json(args.json, out)
