#!/usr/bin/env python3
"""Data parallelism on this machine: pipetrain's replicas beside PyTorch's
DistributedDataParallel and beside pipetrain's own one-process run, in one run.

For each model (seed-cnn and seed-mlp), the same global batch, model and optimizer on every
side:
1. pipetrain data parallel, `mpiexec -n R pipetrain train --replicas R --threads 1`, with
   every --reduce method: allreduce with --overlap on (the default) and off, reduce-bcast,
   gather-bcast, ordered. From its --json, per step: the step time and the simulator's
   prediction of it for the measured stage times (sim.), the reductions' summed durations
   (reduce; they overlap the backward pass and each other), the part of them the step
   waited for (exposed), the gradient bytes reduced and the bus bandwidth (nccl-tests'
   convention, 2(R-1)/R x bytes / reduce time: low where reductions overlap computation).
2. experiments/torch_ddp.py: PyTorch DistributedDataParallel over gloo, R processes x 1
   thread, each training on batch/R samples of every batch (same model file, optimizer).
3. pipetrain in one process with R threads on the same batch: what R cores give without
   replicas, the ideal the data-parallel run is measured against.
Targets printed as ratios: pipetrain DP / PyTorch DDP (target >= 1, goal 1.5) and
pipetrain DP / pipetrain 1 x R threads (goal >= 0.95), for the default allreduce with
overlap.

Every run is a fresh process (mpiexec for pipetrain's replicas), the runs of a repeat in a
fixed order that is reversed every other repeat, all under one environment (`tuned` by
default, one BLAS thread per process; see benchlib.py). Prints the median (min-max) of
--repeats runs, and the largest share of the machine other processes used during a run
(noise; above 0.05 the figures are suspect). On a shared machine --wait-idle S waits
before each run for the others to leave it idle, and --retry-noisy N repeats a noisy run up
to N times, keeping the cleanest (on every side alike). The PyTorch side needs PyTorch (Debian:
apt-get install python3-torch, for /usr/bin/python3); this script needs only the standard
library.

    python3 experiments/bench_data_parallel.py --wait-idle 120 --retry-noisy 3 --json dp.json
    python3 experiments/bench_data_parallel.py --quick       # smoke test, under a minute
"""
import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

# name: model file, global batch, optimizer, lr, warm-up steps, timed steps (one epoch of
# 60,000 samples holds warm-up and timed steps, so no epoch boundary falls in the window)
CONFIGS = [
    ('cnn', 'models/seed-cnn.cfg', 256, 'adam', 0.001, 10, 100),
    ('mlp', 'models/seed-mlp.cfg', 128, 'sgd', 0.01, 40, 400),
]
# pipetrain's data-parallel variants: name, options
METHODS = [
    ('allreduce', ['--reduce', 'allreduce', '--overlap', 'on']),
    ('allreduce-no-overlap', ['--reduce', 'allreduce', '--overlap', 'off']),
    ('reduce-bcast', ['--reduce', 'reduce-bcast']),
    ('gather-bcast', ['--reduce', 'gather-bcast']),
    ('ordered', ['--reduce', 'ordered']),
]
BUCKETED = ('allreduce', 'allreduce-no-overlap', 'ordered')  # the -bcast methods reduce whole
HEADLINE = 'allreduce'  # the method the targets are checked on (pipetrain's default)
# pipetrain --json keys (per-stage lists; totals over the timed steps) -> our names
REDUCE_KEYS = {'reduce_s': 'stage_reduce_s', 'exposed_s': 'stage_reduce_exposed_s',
               'bytes': 'stage_reduce_bytes', 'bus_bw': 'stage_bus_bw'}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    benchlib.add_common_args(p, warmup=None, steps=None, repeats=3)
    for a in p._actions:
        if a.dest in ('warmup', 'steps'):
            a.help += ' (default: per model, %s)' % ', '.join(
                '%s %d' % (c[0], c[5 if a.dest == 'warmup' else 6]) for c in CONFIGS)
    p.add_argument('--only', default='', help='comma list of models: ' +
                   ', '.join(c[0] for c in CONFIGS))
    p.add_argument('--methods', default=','.join(m[0] for m in METHODS),
                   help='comma list of pipetrain --reduce variants (default: all)')
    p.add_argument('--replicas', type=int, default=2,
                   help='replicas (processes) on both sides, one thread each; the '
                        'one-process run gets this many threads (default 2)')
    p.add_argument('--bucket-mb', type=float, default=None,
                   help="gradient bucket size in MiB for both pipetrain (--bucket-mb; allreduce, "
                        "ordered) and DDP (bucket_cap_mb) (default: each side's own, 1 and 25)")
    p.add_argument('--mpiexec', default='mpiexec')
    p.add_argument('--wait-idle', type=float, default=0, metavar='S',
                   help='before each run, wait up to S seconds until other processes have '
                        'left the machine idle for 2 s (a shared machine; default 0: do not)')
    p.add_argument('--retry-noisy', type=int, default=0, metavar='N',
                   help='run a measurement again, up to N times, while its noise is above '
                        '%g; the cleanest run counts (default 0)' % benchlib.NOISY)
    p.add_argument('--csv', default='', help='also write one row per run kind to this file')
    args = p.parse_args()
    if args.replicas < 1:
        p.error('--replicas must be at least 1')
    if args.bucket_mb is not None and args.bucket_mb <= 0:
        p.error('--bucket-mb must be positive')
    if (args.steps is not None and args.steps < 1) or (args.warmup is not None and args.warmup < 0):
        p.error('--steps must be at least 1 and --warmup at least 0')
    if args.quick:
        args.repeats, args.retry_noisy, args.wait_idle = 1, 0, 0
    if args.retry_noisy < 0:
        p.error('--retry-noisy must be at least 0')
    for opt in ('only', 'methods'):
        known = [c[0] for c in CONFIGS] if opt == 'only' else [m[0] for m in METHODS]
        want = [x for x in getattr(args, opt).split(',') if x]
        unknown = sorted(set(want) - set(known))
        if unknown:
            benchlib.fail('--%s: unknown %s (known: %s)' % (opt, ', '.join(unknown), ', '.join(known)))
        setattr(args, opt, want)
    return args


def wait_idle(limit_s, share=benchlib.NOISY, quiet_s=2.0, tick=0.5):
    """Waits until the machine has been busy less than `share` of its CPUs for quiet_s in
    a row, or limit_s have passed; returns the seconds waited (None on giving up)."""
    t_start = t0 = time.monotonic()
    b0, quiet = benchlib.machine_busy_s(), 0.0
    while True:
        time.sleep(tick)
        b1, t1 = benchlib.machine_busy_s(), time.monotonic()
        quiet = quiet + (t1 - t0) if (b1 - b0) / (os.cpu_count() * (t1 - t0)) < share else 0.0
        if quiet >= quiet_s:
            return t1 - t_start
        if t1 - t_start >= limit_s:
            return None
        b0, t0 = b1, t1


def run_clean(args, cmd, env, label):
    """One measurement; with --retry-noisy, run again (up to that many times) while other
    processes used more than benchlib.NOISY of the machine, keeping the cleanest run."""
    best = None
    for _ in range(1 + args.retry_noisy):
        if args.wait_idle > 0 and wait_idle(args.wait_idle) is None:
            print('(the machine was not idle within %g s: measuring anyway)' % args.wait_idle,
                  file=sys.stderr, flush=True)
        try:
            j = benchlib.run(cmd, env, label)
        except RuntimeError as e:
            benchlib.fail(e)
        if best is None or j['noise'] < best['noise']:
            best = j
        if best['noise'] <= benchlib.NOISY:
            break
    return best


def steps_for(args, warmup, steps):
    if args.quick:
        return 2, max(5, steps // 20)
    return (warmup if args.warmup is None else args.warmup,
            steps if args.steps is None else args.steps)


def per_step(j, key, steps):
    """A pipetrain per-stage total as a per-step figure (stage 0; None when absent)."""
    v = j.get(REDUCE_KEYS[key])
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None:
        return None
    return v if key == 'bus_bw' else v / steps


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measure(args, env, name, model, batch, opt, lr, warmup, steps):
    R = args.replicas
    common = ['--model', model, '--batch', str(batch), '--optimizer', opt, '--lr', str(lr)]
    pt = [args.pipetrain, 'train', *common, '--steps', str(warmup + steps), '--untimed-steps',
          str(warmup), '--test-samples', '0', '--json']
    bucket = ['--bucket-mb', '%g' % args.bucket_mb] if args.bucket_mb else []
    runs = []  # (kind, label, command)
    for m, extra in METHODS:
        if m in args.methods:
            cmd = [*pt, '--replicas', str(R), '--threads', '1', *extra]
            if m in BUCKETED:
                cmd += bucket
            runs.append((m, 'pipetrain DP %s' % m, [args.mpiexec, '-n', str(R), *cmd]))
    if not args.no_peer:
        runs.append(('ddp', 'PyTorch DDP (gloo)',
                     [args.python, os.path.join(benchlib.HERE, 'torch_ddp.py'), *common,
                      '--nproc', str(R), '--threads', '1', '--warmup', str(warmup), '--steps',
                      str(steps)] + (['--bucket-cap-mb', '%g' % args.bucket_mb] if args.bucket_mb
                                     else [])))
    runs.append(('one-process', 'pipetrain 1 process x %d threads' % R,
                 [*pt, '--threads', str(R)]))

    got = {kind: [] for kind, _, _ in runs}
    for rep in range(args.repeats):
        order = runs if rep % 2 == 0 else runs[::-1]
        for kind, label, cmd in order:
            got[kind].append(run_clean(args, cmd, env, label))
            print('.', end='', file=sys.stderr, flush=True)

    params = {j['params'] for js in got.values() for j in js if j.get('params') is not None}
    if len(params) > 1:
        benchlib.fail('%s: pipetrain and the peer built different models (%s parameters)'
                      % (name, ' vs '.join(str(n) for n in sorted(params))))
    rows = []
    for kind, label, cmd in runs:
        js = got[kind]
        rate = [j['samples_per_s'] for j in js]
        row = {'model': name, 'kind': kind, 'label': label, 'batch': batch,
               'samples_per_s': benchlib.summary(rate),
               'step_ms': 1e3 * batch / statistics.median(rate),
               'noise_max': max(j['noise'] for j in js), 'noise': [j['noise'] for j in js],
               'command': ' '.join(cmd)}
        if kind in dict(METHODS):
            for key in REDUCE_KEYS:
                row[key] = med([per_step(j, key, steps) for j in js])
            # the simulator's step time for the measured stage times, against the measured one
            pred = med([j.get('step_predicted_s') for j in js])
            row['predicted_step_ms'] = None if pred is None else 1e3 * pred
        if kind == 'ddp':
            row['replica_max_abs_diff'] = max(j['replica_max_abs_diff'] for j in js)
        rows.append(row)
    by = {r['kind']: r for r in rows}
    for r in rows:
        v = r['samples_per_s']['median']
        r['vs_ddp'] = v / by['ddp']['samples_per_s']['median'] if 'ddp' in by else None
        r['vs_one_process'] = v / by['one-process']['samples_per_s']['median']
    return {'model': name, 'file': model, 'batch': batch, 'optimizer': opt, 'lr': lr,
            'warmup': warmup, 'steps': steps, 'replicas': R, 'params': min(params, default=None),
            'rows': rows}


def scaled(row, key, k):
    return None if row.get(key) is None else row[key] * k


def fmt(v, spec, width):
    return ('%' + spec) % v if v is not None else '%*s' % (width, '-')


def print_table(res, R):
    print('\n%s (%s), global batch %d (%d per replica), %s lr %g; %d replicas x 1 thread, '
          '%d warm-up + %d timed steps' % (res['model'], res['file'], res['batch'],
                                            res['batch'] // R, res['optimizer'], res['lr'], R,
                                            res['warmup'], res['steps']))
    print('%-34s %8s %8s %24s %7s %7s %9s %9s %8s %8s %6s' % (
        'run', 'step ms', 'sim. ms', 'samples/s (min-max)', 'xDDP', 'x1proc', 'reduce ms',
        'exposed', 'MB/step', 'bus GB/s', 'noise'))
    for r in res['rows']:
        s = r['samples_per_s']
        print('%-34s %8.2f %8s %10.0f (%5.0f-%5.0f) %7s %7s %9s %9s %8s %8s %6.2f' % (
            r['label'], r['step_ms'], fmt(r.get('predicted_step_ms'), '8.2f', 8), s['median'], s['min'], s['max'],
            fmt(r['vs_ddp'], '7.2f', 7), fmt(r['vs_one_process'], '7.2f', 7),
            fmt(scaled(r, 'reduce_s', 1e3), '9.2f', 9), fmt(scaled(r, 'exposed_s', 1e3), '9.2f', 9),
            fmt(scaled(r, 'bytes', 1e-6), '8.2f', 8), fmt(scaled(r, 'bus_bw', 1e-9), '8.2f', 8),
            r['noise_max']))
    by = {r['kind']: r for r in res['rows']}
    dp = by.get(HEADLINE)
    if dp:
        if dp['vs_ddp'] is not None:
            v = dp['vs_ddp']
            print('  pipetrain DP (%s) / PyTorch DDP: %.2f  (target >= 1: %s; goal 1.5: %s)' % (
                HEADLINE, v, 'met' if v >= 1 else 'NOT met', 'met' if v >= 1.5 else 'not met'))
        v = dp['vs_one_process']
        print('  pipetrain DP (%s) / pipetrain 1 process x %d threads: %.2f  (goal >= 0.95: %s)'
              % (HEADLINE, R, v, 'met' if v >= 0.95 else 'NOT met'))
    ddp = by.get('ddp')
    if ddp and ddp['replica_max_abs_diff'] != 0:
        print('  warning: the DDP replicas ended with different parameters (max |diff| %g)'
              % ddp['replica_max_abs_diff'])


def write_csv(path, results):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    cols = ['model', 'kind', 'batch', 'samples_per_s_median', 'samples_per_s_min',
            'samples_per_s_max', 'step_ms', 'predicted_step_ms', 'vs_ddp', 'vs_one_process', 'reduce_ms_per_step',
            'exposed_ms_per_step', 'bytes_per_step', 'bus_bw_gb_s', 'noise_max']
    with open(path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(cols)
        for res in results:
            for r in res['rows']:
                s = r['samples_per_s']
                w.writerow([res['model'], r['kind'], r['batch'], s['median'], s['min'], s['max'],
                            round(r['step_ms'], 4), r.get('predicted_step_ms'), r['vs_ddp'], r['vs_one_process'],
                            scaled(r, 'reduce_s', 1e3), scaled(r, 'exposed_s', 1e3),
                            r.get('bytes'), scaled(r, 'bus_bw', 1e-9), r['noise_max']])
    print('wrote', path)


def main():
    args = parse_args()
    benchlib.check_setup(args)
    env = benchlib.environment(args.env, OPENBLAS_NUM_THREADS='1')
    configs = [c for c in CONFIGS if not args.only or c[0] in args.only]
    load0 = os.getloadavg()[0]
    results = []
    for name, model, batch, opt, lr, warmup, steps in configs:
        if batch % args.replicas:
            benchlib.fail('%s: --replicas %d does not divide the batch %d'
                          % (name, args.replicas, batch))
        warmup, steps = steps_for(args, warmup, steps)
        results.append(measure(args, env, name, model, batch, opt, lr, warmup, steps))
    print(file=sys.stderr)
    for res in results:
        print_table(res, args.replicas)
    noise = max(r['noise_max'] for res in results for r in res['rows'])
    if noise > benchlib.NOISY:
        print('\nnoise up to %.2f: other processes used the machine during some runs; rerun on '
              'an idle machine for figures to report' % noise)
    if args.quick:
        print('(--quick: a smoke test of a few timed steps; not figures to report)')
    benchlib.write_json(args.json, {
        'env': args.env, 'repeats': args.repeats, 'quick': args.quick, 'replicas': args.replicas,
        'bucket_mb': args.bucket_mb, 'wait_idle': args.wait_idle,
        'retry_noisy': args.retry_noisy, 'peer_python': args.python, 'noise_max': noise,
        'loadavg_start': load0, 'loadavg_end': os.getloadavg()[0],
        'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'results': results})
    write_csv(args.csv, results)


if __name__ == '__main__':
    main()
