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
4. peer: ../shared/peers/bench_pipe.py (conv/dense cut, gloo) for M = 1, 2, 4, 8.

    python3 experiments/bench_pipeline.py --json results/pipeline.json
"""
import argparse, json, os, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--pipetrain', default=os.path.join(ROOT, 'build', 'pipetrain'))
p.add_argument('--peers', default=os.path.join(ROOT, '..', 'shared', 'peers'))
p.add_argument('--steps', type=int, default=40)
p.add_argument('--warmup', type=int, default=8)
p.add_argument('--repeats', type=int, default=3)
p.add_argument('--parts', default='bubble,memory,speedup,peer')
p.add_argument('--json', default='')
args = p.parse_args()
parts = set(args.parts.split(','))

ENV = dict(os.environ)
ENV.pop('OPENBLAS_CORETYPE', None)
ENV['MALLOC_MMAP_THRESHOLD_'] = '33554432'
ENV['MALLOC_TRIM_THRESHOLD_'] = '17179869184'
ENV['OPENBLAS_NUM_THREADS'] = '1'
BASE = ['--model', 'models/seed-cnn.cfg', '--batch', '128', '--test-samples', '0', '--threads', '1',
        '--json', '--optimizer', 'adam']


def train(k, extra, steps=None):
    steps = steps or args.steps
    cmd = [args.pipetrain, 'train', *BASE, '--steps', str(args.warmup + steps), '--warmup',
           str(args.warmup), '--stages', str(k), *extra]
    if k > 1:
        cmd = ['mpiexec', '-n', str(k), *cmd]
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(' '.join(cmd) + '\n' + r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def median_run(k, extra, key='samples_per_s'):
    runs = [train(k, extra) for _ in range(args.repeats)]
    runs.sort(key=lambda r: r[key])
    return runs[len(runs) // 2], [r[key] for r in runs]


out = {'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'steps': args.steps, 'warmup': args.warmup}

if 'bubble' in parts:
    rows = []
    print('1. bubble, K = 2, time partition, 1 thread per stage')
    print('%-6s %4s %9s %10s %9s %8s %9s %12s' % ('sched', 'M', 'measured', 'simulated', 'diff pp',
          'formula', 'diff pp', 'samples/s'))
    for sched in ('1f1b', 'gpipe'):
        for m in (1, 2, 4, 8, 16):
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
        r = train(4, ['--microbatches', '8', '--schedule', sched, '--partition', 'uniform'], steps=4)
        rows.append({'schedule': sched, 'peak_microbatches': r['stage_peak_microbatches'],
                     'peak_bytes': r['stage_peak_act_bytes']})
        print('%-6s %-28s %-40s' % (sched, r['stage_peak_microbatches'],
              ['%.2f' % (b / 1e6) for b in r['stage_peak_act_bytes']]), flush=True)
    out['memory'] = rows

if 'speedup' in parts:
    rows = []
    print('\n3. speedup of 2 stages (1 core each) over sequential on 1 core, 1F1B, time partition')
    print('%4s %12s %12s %9s %9s %9s' % ('M', 'seq s/s', 'pipe s/s', 'speedup', 'allowed', 'fraction'))
    for m in (8, 16):
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
    print('\n4. PyTorch 2-stage GPipe (conv | dense cut, gloo), 1 thread per stage')
    cmd = ['/usr/bin/python3', os.path.join(args.peers, 'bench_pipe.py'), '--micro', '1,2,4,8',
           '--threads', '1', '--no-check', '--steps', str(args.steps), '--warmup', str(args.warmup)]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if r.returncode:
        print('peer failed:', r.stderr[-1000:])
    else:
        j = json.loads(r.stdout.strip().splitlines()[-1])
        out['peer'] = j
        tp = j.get('throughput', {})
        for m, v in tp.items():
            print('M=%-3s %10.0f samples/s  stage0 compute %.1f ms, stage1 compute %.1f ms per step' % (
                m, v['samples_per_s'], v.get('stage0_compute_ms_per_step', float('nan')),
                v.get('stage1_compute_ms_per_step', float('nan'))))

if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    json.dump(out, open(args.json, 'w'), indent=1)
