#!/usr/bin/env python3
"""The schedules beyond 1F1B on this machine: 2 stages, one core each.

1. schedules: seed-cnn, batch 128, K = 2, M = 4, 8, 16, for gpipe, 1f1b, interleaved
   (V = 2) and zb-h1: measured bubble (mean idle fraction of the step), the simulator's
   from the measured per-chunk F, B, W times, and the schedule's formula for balanced
   stages (train's bubble_theory), all as the idle share of the step; step time measured against the
   simulator's prediction; peak activation memory per stage against the verifier's bound.
2. wgrad: models/wide-mlp.cfg (784-2048x4-10, batch 128) cut in two, M = 8, 2 ranks x 1
   thread, per-micro-batch and batched weight gradients (1f1b and zb-h1), against one
   process with one thread and the whole batch (M = 1). Also the stash's memory.
3. recompute: seed-cnn, K = 2, M = 8, 1f1b and zb-h1 with and without --recompute all:
   peak activation memory saved and time added per stage, against the prediction (memory:
   the verifier's bound times the slot; time: one more forward per micro-batch).

Every run is a fresh process (mpiexec for pipetrain) under benchlib's `tuned` environment
with one BLAS thread per rank; the median of --repeats runs by samples/s is reported.

    python3 experiments/bench_schedules.py --json results/schedules.json
    python3 experiments/bench_schedules.py --quick          # smoke test
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
benchlib.add_common_args(p, warmup=5, steps=30, repeats=3)
p.add_argument('--parts', default='schedules,wgrad,recompute')
p.add_argument('--mpiexec', default='mpiexec')
args = p.parse_args()
args.no_peer = True  # pipetrain against itself: no PyTorch needed
parts = set(args.parts.split(','))
unknown = parts - {'schedules', 'wgrad', 'recompute'}
if unknown:
    benchlib.fail('unknown part %s (schedules, wgrad, recompute)' % ', '.join(sorted(unknown)))
SCHED_M = (4, 8, 16)
if args.quick:
    args.repeats, args.warmup, args.steps = 1, 1, 3
    SCHED_M = (4,)
benchlib.check_setup(args)

ENV = benchlib.environment(args.env, OPENBLAS_NUM_THREADS='1')
CNN = ['--model', 'models/seed-cnn.cfg', '--batch', '128', '--test-samples', '0', '--threads', '1',
       '--json', '--optimizer', 'adam', '--lr', '0.001', '--train-samples', '8192']
MLP = ['--model', 'models/wide-mlp.cfg', '--batch', '128', '--test-samples', '0', '--threads', '1',
       '--json', '--optimizer', 'sgd', '--lr', '0.01', '--train-samples', '8192']
SCHEDULES = (('gpipe', []), ('1f1b', []), ('interleaved', ['--virtual', '2']), ('zb-h1', []))
noise = []


def median_run(k, base, extra):
    return benchlib.median_train(args, ENV, k, [*base, '--steps', args.warmup + args.steps,
                                                '--untimed-steps', args.warmup, '--stages', k, *extra],
                                 noise)


def step_s(r):
    """Measured seconds per step: the slowest stage's time inside the timed steps."""
    return max(r['stage_wall_s']) / args.steps


out = {'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'env': args.env, 'steps': args.steps,
       'warmup': args.warmup, 'repeats': args.repeats, 'quick': args.quick}

if 'schedules' in parts:
    rows = []
    print('1. schedules: seed-cnn, K = 2, 1 thread per stage, time partition')
    print('%-12s %3s %8s %9s %8s %9s %9s %6s %10s %-14s %-10s' % (
        'schedule', 'M', 'bubble', 'simulated', 'formula', 'step ms', 'pred ms', 'err', 'samples/s',
        'peak MB/stage', 'held/bound'))
    for name, extra in SCHEDULES:
        for m in SCHED_M:
            r, runs = median_run(2, CNN, ['--schedule', name, '--microbatches', str(m), *extra])
            meas, pred = step_s(r), r['step_predicted_s']
            row = {'schedule': name, 'M': m, 'bubble': r['bubble'], 'simulated': r['bubble_simulated'],
                   'formula': r['bubble_theory'], 'step_s': meas, 'step_predicted_s': pred,
                   'samples_per_s': r['samples_per_s'], 'runs': runs,
                   'peak_bytes': r['stage_peak_act_bytes'], 'peak_mb': r['stage_peak_microbatches'],
                   'bound': r['stage_peak_microbatches_bound'], 'stage_compute_s': r['stage_compute_s']}
            rows.append(row)
            print('%-12s %3d %8.3f %9.3f %8.3f %9.1f %9.1f %+5.0f%% %10.0f %-14s %-10s' % (
                name, m, r['bubble'], r['bubble_simulated'], r['bubble_theory'], 1e3 * meas, 1e3 * pred,
                100 * (pred - meas) / meas, r['samples_per_s'],
                ','.join('%.1f' % (b / 1e6) for b in r['stage_peak_act_bytes']),
                '%s/%s' % (','.join(map(str, r['stage_peak_microbatches'])),
                           ','.join(map(str, r['stage_peak_microbatches_bound'])))), flush=True)
    out['schedules'] = rows

if 'wgrad' in parts:
    print('\n2. batched weight gradients: wide-mlp, batch 128, M = 8, 2 ranks x 1 thread, time partition')
    seq, seq_runs = median_run(1, MLP, ['--microbatches', '1'])
    print('%-34s %10s %8s  %s' % ('layout', 'samples/s', 'vs seq', 'runs'))
    print('%-34s %10.0f %8.2f  %s' % ('1 process, 1 thread, whole batch', seq['samples_per_s'], 1.0,
                                     ' '.join('%.0f' % x for x in seq_runs)), flush=True)
    rows = [{'layout': 'sequential', 'samples_per_s': seq['samples_per_s'], 'runs': seq_runs}]
    for name in ('1f1b', 'zb-h1'):
        for wgrad in ('per-microbatch', 'batched'):
            r, runs = median_run(2, MLP, ['--schedule', name, '--microbatches', '8', '--wgrad', wgrad])
            label = '%s, --wgrad %s' % (name, wgrad)
            ratio = r['samples_per_s'] / seq['samples_per_s']
            rows.append({'layout': label, 'samples_per_s': r['samples_per_s'], 'runs': runs,
                         'ratio': ratio, 'stage_compute_s': r['stage_compute_s'],
                         'peak_bytes': r['stage_peak_act_bytes']})
            print('%-34s %10.0f %8.2f  %s' % (label, r['samples_per_s'], ratio,
                                             ' '.join('%.0f' % x for x in runs)), flush=True)
    # the stash: every dense layer's input and output-gradient rows of the step
    stash = 4 * 128 * ((784 + 2048) + 3 * (2048 + 2048) + (2048 + 10))
    print('batched stash: %.1f MB for the whole model (each stage holds its layers\' share)' % (stash / 1e6))
    out['wgrad'] = {'rows': rows, 'stash_bytes_model': stash}

if 'recompute' in parts:
    rows = []
    print('\n3. recomputation: seed-cnn, K = 2, M = 8, 1 thread per stage, time partition')
    print('%-6s %-9s %-16s %-16s %-16s %-16s' % ('sched', 'recompute', 'peak MB/stage', 'saved MB',
                                              'compute s/stage', 'added s (pred)'))
    for name in ('1f1b', 'zb-h1'):
        base, _ = median_run(2, CNN, ['--schedule', name, '--microbatches', '8'])
        rc, _ = median_run(2, CNN, ['--schedule', name, '--microbatches', '8', '--recompute', 'all'])
        saved = [(a - b) / 1e6 for a, b in zip(base['stage_peak_act_bytes'], rc['stage_peak_act_bytes'])]
        added = [b - a for a, b in zip(base['stage_compute_s'], rc['stage_compute_s'])]
        predicted = rc['stage_recompute_s']  # one more forward per micro-batch
        rows.append({'schedule': name, 'peak_bytes': base['stage_peak_act_bytes'],
                     'peak_bytes_recompute': rc['stage_peak_act_bytes'], 'saved_mb': saved,
                     'compute_s': base['stage_compute_s'], 'compute_s_recompute': rc['stage_compute_s'],
                     'added_s': added, 'predicted_added_s': predicted,
                     'bound': base['stage_peak_microbatches_bound'],
                     'bound_recompute': rc['stage_peak_microbatches_bound']})
        for label, r in (('off', base), ('all', rc)):
            print('%-6s %-9s %-16s %-16s %-16s %-16s' % (
                name, label, ','.join('%.2f' % (b / 1e6) for b in r['stage_peak_act_bytes']),
                ','.join('%.2f' % x for x in saved) if r is rc else '',
                ','.join('%.2f' % x for x in r['stage_compute_s']),
                ','.join('%.2f (%.2f)' % (a, p_) for a, p_ in zip(added, predicted)) if r is rc else ''),
                flush=True)
    out['recompute'] = rows

out['noise_max'] = max(noise) if noise else None
if noise and max(noise) > benchlib.NOISY:
    print('\nnoise up to %.2f: other processes used the machine during some runs; rerun on an '
          'idle machine for figures to report' % max(noise))
if args.quick:
    print('(--quick: a smoke test of %d timed steps; not figures to report)' % args.steps)
benchlib.write_json(args.json, out)
