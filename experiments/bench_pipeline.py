#!/usr/bin/env python3
"""Pipeline measurements on this machine (seed-cnn, batch 128), beside PyTorch's 2-stage pipe.

1. bubble: K = 2 stages (one core each), M = 1..16, 1F1B and GPipe: measured idle fraction
   against the simulator's prediction from the measured per-stage forward/backward times
   (which accounts for unbalanced stages) and against (K-1)/(M+K-1) (balanced stages).
2. memory: K = 4 (4 ranks on 2 cores is fine for counting), M = 8: peak micro-batches and
   activation bytes held per stage, GPipe against 1F1B.
3. speedup: 2 stages x 1 thread, `time` partition, M = 8 and 16, against sequential
   training on one core with the same micro-batching; the speedup the partition and the
   schedule allow is (sum of stage compute / slowest stage compute) * M / (M + K - 1).
4. peer: experiments/torch_pipe.py, PyTorch's 2-stage GPipe (convolutions | dense layers,
   gloo messages, one thread per stage) for M = 1, 2, 4, 8.

Every run is a fresh process (mpiexec for pipetrain), under the `tuned` environment of
benchlib.py with one BLAS thread per rank. The peer needs PyTorch (Debian: apt-get install
python3-torch, for /usr/bin/python3); it runs with the interpreter that has torch (this
one, else /usr/bin/python3, or --python).

    python3 experiments/bench_pipeline.py --json results/pipeline.json
    python3 experiments/bench_pipeline.py --quick          # smoke test, about a minute
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
benchlib.add_common_args(p, warmup=8, steps=40, repeats=3)
p.add_argument('--parts', default='bubble,memory,speedup,peer')
p.add_argument('--mpiexec', default='mpiexec')
args = p.parse_args()
parts = set(args.parts.split(','))
unknown = parts - {'bubble', 'memory', 'speedup', 'peer'}
if unknown:
    benchlib.fail('unknown part %s (bubble, memory, speedup, peer)' % ', '.join(sorted(unknown)))
BUBBLE_M, SPEEDUP_M, PEER_M = (1, 2, 4, 8, 16), (8, 16), '1,2,4,8'
if args.quick:
    args.repeats, args.warmup, args.steps = 1, 2, 6
    BUBBLE_M, SPEEDUP_M, PEER_M = (1, 4), (8,), '1,4'
if args.no_peer:
    parts.discard('peer')
args.no_peer = 'peer' not in parts  # PyTorch is needed only for the peer part
benchlib.check_setup(args)

ENV = benchlib.environment(args.env, OPENBLAS_NUM_THREADS='1')
BASE = ['--model', 'models/seed-cnn.cfg', '--batch', '128', '--test-samples', '0', '--threads', '1',
        '--json', '--optimizer', 'adam', '--lr', '0.001']
noise = []


def run(cmd, what):
    try:
        j = benchlib.run(cmd, ENV, what)
    except RuntimeError as e:
        benchlib.fail(e)
    noise.append(j['noise'])
    return j


def train(k, extra, steps=None):
    steps = steps or args.steps
    cmd = [args.pipetrain, 'train', *BASE, '--steps', str(args.warmup + steps), '--untimed-steps',
           str(args.warmup), '--stages', str(k), *extra]
    if k > 1:
        cmd = [args.mpiexec, '-n', str(k), *cmd]
    return run(cmd, 'pipetrain')


def median_run(k, extra, key='samples_per_s'):
    runs = [train(k, extra) for _ in range(args.repeats)]
    runs.sort(key=lambda r: r[key])
    return runs[len(runs) // 2], [r[key] for r in runs]


out = {'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'env': args.env, 'steps': args.steps,
       'warmup': args.warmup, 'repeats': args.repeats, 'quick': args.quick,
       'peer_python': args.python}

if 'bubble' in parts:
    rows = []
    print('1. bubble, K = 2, time partition, 1 thread per stage')
    print('%-6s %4s %9s %10s %9s %8s %9s %12s' % ('sched', 'M', 'measured', 'simulated', 'diff pp',
          'formula', 'diff pp', 'samples/s'))
    for sched in ('1f1b', 'gpipe'):
        for m in BUBBLE_M:
            r, _ = median_run(2, ['--microbatches', str(m), '--schedule', sched, '--partition', 'time'])
            row = {'schedule': sched, 'M': m, 'bubble': r['bubble'], 'theory': r['bubble_theory'],
                   'simulated': r['bubble_simulated'],
                   'samples_per_s': r['samples_per_s'], 'stage_compute_s': r['stage_compute_s'],
                   'stage_wall_s': r['stage_wall_s']}
            rows.append(row)
            print('%-6s %4d %9.3f %10.3f %+9.1f %8.3f %+9.1f %12.0f' % (
                sched, m, r['bubble'], r['bubble_simulated'], 100 * (r['bubble'] - r['bubble_simulated']),
                r['bubble_theory'], 100 * (r['bubble'] - r['bubble_theory']), r['samples_per_s']), flush=True)
    out['bubble'] = rows

if 'memory' in parts:
    rows = []
    print('\n2. activation memory, K = 4, M = 8')
    print('%-6s %-28s %-40s' % ('sched', 'peak micro-batches per stage', 'peak activation MB per stage'))
    for sched in ('gpipe', '1f1b'):
        r = train(4, ['--microbatches', '8', '--schedule', sched, '--partition', 'uniform'],
                  steps=min(4, args.steps))
        rows.append({'schedule': sched, 'peak_microbatches': r['stage_peak_microbatches'],
                     'peak_bytes': r['stage_peak_act_bytes']})
        print('%-6s %-28s %-40s' % (sched, r['stage_peak_microbatches'],
              ['%.2f' % (b / 1e6) for b in r['stage_peak_act_bytes']]), flush=True)
    out['memory'] = rows

if 'speedup' in parts:
    rows = []
    print('\n3. speedup of 2 stages (1 core each) over sequential on 1 core, 1F1B, time partition')
    print('%4s %12s %12s %9s %9s %9s' % ('M', 'seq s/s', 'pipe s/s', 'speedup', 'allowed', 'fraction'))
    for m in SPEEDUP_M:
        seq, _ = median_run(1, ['--microbatches', str(m)])
        pipe, _ = median_run(2, ['--microbatches', str(m), '--schedule', '1f1b', '--partition', 'time'])
        c = pipe['stage_compute_s']
        allowed = sum(c) / max(c) * m / (m + 1)
        speedup = pipe['samples_per_s'] / seq['samples_per_s']
        rows.append({'M': m, 'sequential': seq['samples_per_s'], 'pipeline': pipe['samples_per_s'],
                     'speedup': speedup, 'allowed': allowed, 'fraction': speedup / allowed,
                     'stage_compute_s': c})
        print('%4d %12.0f %12.0f %9.2f %9.2f %9.2f' % (m, seq['samples_per_s'], pipe['samples_per_s'],
              speedup, allowed, speedup / allowed), flush=True)
    out['speedup'] = rows

if 'peer' in parts:
    print('\n4. PyTorch 2-stage GPipe (convolutions | dense layers, gloo), 1 thread per stage')
    j = run([args.python, os.path.join(benchlib.HERE, 'torch_pipe.py'), '--model', 'models/seed-cnn.cfg',
             '--batch', '128', '--optimizer', 'adam', '--lr', '0.001', '--threads', '1',
             '--micro', PEER_M, '--steps', str(args.steps), '--warmup', str(args.warmup)],
            'PyTorch pipeline peer')
    out['peer'] = j
    for m, v in j['throughput'].items():
        print('M=%-3s %10.0f samples/s  stage0 compute %.1f ms, stage1 compute %.1f ms per step' % (
            m, v['samples_per_s'], v['stage0_compute_ms_per_step'], v['stage1_compute_ms_per_step']))

out['noise_max'] = max(noise) if noise else None
if noise and max(noise) > benchlib.NOISY:
    print('\nnoise up to %.2f: other processes used the machine during some runs; rerun on an '
          'idle machine for figures to report' % max(noise))
if args.quick:
    print('(--quick: a smoke test of %d timed steps; not figures to report)' % args.steps)
benchlib.write_json(args.json, out)
