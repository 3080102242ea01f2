"""What bench_throughput.py and bench_pipeline.py share: the environment both sides run
under, running one measurement as a fresh process, and finding pipetrain and PyTorch.

A fair comparison (see docs/PERFORMANCE.md):
- the same environment for pipetrain and PyTorch, set before each process starts (OpenBLAS
  and glibc read it when they load). `tuned` unsets OPENBLAS_CORETYPE, which these machines
  set to Haswell (AVX2 kernels; unset, OpenBLAS picks its AVX-512 ones) and then names the
  kernels pipetrain itself would choose where OpenBLAS falls back to old ones on a CPU it
  does not know (kernels/blas_core.c), so that both sides load the same; it raises glibc's
  malloc thresholds, without which PyTorch gives large activations back to the kernel every
  step and spends its time in page faults. `default` is the environment as inherited.
- every measurement in a fresh process, pipetrain and PyTorch alternating, so slow phases
  of a shared machine hit both; the median of several runs with min and max.
- the share of the machine other processes used during each run is recorded (noise).
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import interpreter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
NOISY = 0.05  # other processes' share of the machine above which a figure is suspect


def blas_core_chosen(env):
    """The OpenBLAS kernels pipetrain chooses in env where OpenBLAS's own choice was an old
    fallback (`pipetrain devices --json`), else None."""
    exe = os.path.join(ROOT, 'build', 'pipetrain')
    try:
        out = subprocess.run([exe, 'devices', '--json'], env=env, capture_output=True,
                             text=True, timeout=60).stdout
        blas = json.loads(out)['blas']
    except (OSError, ValueError, KeyError, subprocess.SubprocessError):
        return None
    return blas['core'] if blas.get('core_detected') else None


def environment(kind, **extra):
    env = dict(os.environ)
    if kind == 'tuned':
        env.pop('OPENBLAS_CORETYPE', None)
        core = blas_core_chosen(env)
        if core:
            env['OPENBLAS_CORETYPE'] = core
        env['MALLOC_MMAP_THRESHOLD_'] = '33554432'
        env['MALLOC_TRIM_THRESHOLD_'] = '17179869184'
    env.update(extra)
    return env


def add_common_args(p, warmup, steps, repeats):
    p.add_argument('--pipetrain', default=os.path.join(ROOT, 'build', 'pipetrain'),
                   help='the built binary (default: build/pipetrain)')
    p.add_argument('--python', default=None,
                   help='interpreter with PyTorch for the peer (default: this one if it has '
                        'torch, else /usr/bin/python3)')
    p.add_argument('--no-peer', action='store_true', help='measure pipetrain only')
    p.add_argument('--env', choices=['tuned', 'default'], default='tuned')
    p.add_argument('--warmup', type=int, default=warmup, help='untimed steps per run')
    p.add_argument('--steps', type=int, default=steps, help='timed steps per run')
    p.add_argument('--repeats', type=int, default=repeats, help='runs per configuration')
    p.add_argument('--quick', action='store_true',
                   help='smoke test: 1 run of a few steps each (checks the set-up, not speed)')
    p.add_argument('--json', default='', help='also write the results to this file')


def check_setup(args):
    """Exits with a clear message when pipetrain is not built or PyTorch is missing; sets
    args.python to the peer's interpreter."""
    args.pipetrain = os.path.abspath(args.pipetrain)  # the runs start in the repository root
    if not (os.path.isfile(args.pipetrain) and os.access(args.pipetrain, os.X_OK)):
        sys.exit('%s: no pipetrain binary at %s: build it first (./run.sh, or: source '
                 'cmake/setup.sh; pt_build build), or give --pipetrain PATH'
                 % (os.path.basename(sys.argv[0]), args.pipetrain))
    if not args.no_peer:
        args.python = interpreter.find_python(['torch'], args.python)


def last_json(text, what):
    for line in reversed(text.strip().splitlines()):
        if line.startswith('{'):
            try:
                return json.loads(line)
            except ValueError:
                break
    raise RuntimeError('%s printed no JSON line:\n%s' % (what, text[-2000:]))


def machine_busy_s():
    f = [int(x) for x in open('/proc/stat').readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf('SC_CLK_TCK')


def run(cmd, env, what=None):
    """Runs one measurement as a fresh process; returns its last JSON line with
    'noise' added: the share of the machine other processes used meanwhile."""
    what = what or os.path.basename(cmd[0])
    busy0 = machine_busy_s()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if r.returncode:
        raise RuntimeError('%s failed (exit %d):\n  %s\n%s' % (what, r.returncode, ' '.join(cmd),
                                                            r.stderr[-3000:]))
    j = last_json(r.stdout, what)
    j['noise'] = round(max(0.0, machine_busy_s() - busy0 - own) / (os.cpu_count() * wall), 3)
    return j


def train(args, env, ranks, train_args, noise):
    """One `pipetrain train` run (under args.mpiexec for ranks > 1) with train_args; its
    JSON, whose noise figure is appended to `noise`. Stops the script on failure."""
    cmd = [args.pipetrain, 'train', *map(str, train_args)]
    if ranks > 1:
        cmd = [args.mpiexec, '-n', str(ranks), *cmd]
    try:
        j = run(cmd, env, 'pipetrain')
    except RuntimeError as e:
        fail(e)
    noise.append(j['noise'])
    return j


def median_train(args, env, ranks, train_args, noise):
    """args.repeats runs of train(): the median one by samples/s, and every run's figure."""
    runs = sorted((train(args, env, ranks, train_args, noise) for _ in range(args.repeats)),
                  key=lambda r: r['samples_per_s'])
    return runs[len(runs) // 2], [r['samples_per_s'] for r in runs]


def summary(values):
    return {'median': statistics.median(values), 'min': min(values), 'max': max(values),
            'runs': values}


def ab_compare(runs_a, runs_b):
    """Two sides measured in alternating rounds: each side's summary, the ratio B/A of the
    medians and the median of the ratios of neighbouring runs (paired: it cancels the
    machine's slow phases, which move both alike)."""
    a, b = summary(runs_a), summary(runs_b)
    paired = statistics.median(y / x for x, y in zip(runs_a, runs_b))
    return {'a': a, 'b': b, 'ratio': b['median'] / a['median'], 'paired_ratio': paired}


def noise_report(out, noise):
    """Records the largest noise figure in out and prints it."""
    out['noise_max'] = max(noise) if noise else 0
    print('other processes used up to %.0f%% of the machine during a run%s'
          % (100 * out['noise_max'], ' (suspect)' if out['noise_max'] > NOISY else ''))


def write_json(path, data):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            json.dump(data, f, indent=1)
        print('wrote', path)


def fail(e):
    sys.exit('%s: %s' % (os.path.basename(sys.argv[0]), e))
