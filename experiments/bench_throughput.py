#!/usr/bin/env python3
"""Training throughput of pipetrain beside PyTorch (../shared/peers), in one run.

Each configuration runs as a fresh process, pipetrain and PyTorch alternating, under the
same environment (the peers' tuned one: OPENBLAS_CORETYPE unset, glibc malloc thresholds
raised). Prints a table with the median and min-max of --repeats runs and writes JSON.

    python3 experiments/bench_throughput.py --repeats 3 --json results/throughput.json
"""
import argparse, json, os, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--pipetrain', default=os.path.join(ROOT, 'build', 'pipetrain'))
p.add_argument('--peers', default=os.path.join(ROOT, '..', 'shared', 'peers'))
p.add_argument('--repeats', type=int, default=3)
p.add_argument('--steps', type=int, default=150, help='timed steps per run')
p.add_argument('--warmup', type=int, default=20)
p.add_argument('--only', default='', help='comma list of configuration names')
p.add_argument('--no-peer', action='store_true')
p.add_argument('--env', choices=['tuned', 'default'], default='tuned')
p.add_argument('--json', default='')
args = p.parse_args()

ENV = dict(os.environ)
if args.env == 'tuned':
    ENV.pop('OPENBLAS_CORETYPE', None)
    ENV['MALLOC_MMAP_THRESHOLD_'] = '33554432'
    ENV['MALLOC_TRIM_THRESHOLD_'] = '17179869184'

# name, pipetrain arguments, peer script and arguments
CONFIGS = [
    ('cnn_b128_t1', ['--model', 'models/seed-cnn.cfg', '--batch', '128', '--optimizer', 'adam',
                     '--lr', '0.001', '--threads', '1'],
     ['bench_cnn.py', '--threads', '1', '--batch', '128']),
    ('cnn_b128_t2', ['--model', 'models/seed-cnn.cfg', '--batch', '128', '--optimizer', 'adam',
                     '--lr', '0.001', '--threads', '2'],
     ['bench_cnn.py', '--threads', '2', '--blas-threads', '1', '--batch', '128']),
    ('mlp_sigmoid_sgd_b64_t1', ['--model', 'models/seed-mlp.cfg', '--batch', '64',
                                '--optimizer', 'sgd', '--lr', '0.01', '--threads', '1'],
     ['bench_mlp.py', '--threads', '1', '--act', 'sigmoid', '--opt', 'sgd', '--batch', '64']),
    ('mlp_sigmoid_sgd_b64_t2', ['--model', 'models/seed-mlp.cfg', '--batch', '64',
                                '--optimizer', 'sgd', '--lr', '0.01', '--threads', '2'],
     ['bench_mlp.py', '--threads', '2', '--blas-threads', '1', '--act', 'sigmoid', '--opt', 'sgd',
      '--batch', '64']),
]
if args.only:
    keep = set(args.only.split(','))
    CONFIGS = [c for c in CONFIGS if c[0] in keep]


def last_json(out):
    for line in reversed(out.strip().splitlines()):
        if line.startswith('{'):
            return json.loads(line)
    raise RuntimeError('no JSON line in output:\n' + out[-2000:])


def run_pipetrain(a):
    cmd = [args.pipetrain, 'train', *a, '--steps', str(args.warmup + args.steps), '--warmup',
           str(args.warmup), '--test-samples', '0', '--json']
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(' '.join(cmd) + '\n' + r.stderr)
    return last_json(r.stdout)['samples_per_s']


def run_peer(a):
    cmd = ['/usr/bin/python3', os.path.join(args.peers, a[0]), *a[1:], '--steps', str(args.steps),
           '--warmup', str(args.warmup)]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(' '.join(cmd) + '\n' + r.stderr[-2000:])
    j = last_json(r.stdout)
    for k in ('samples_per_s', 'throughput', 'samples_per_sec'):
        if k in j:
            return j[k]
    raise RuntimeError('peer JSON has no throughput field: %s' % sorted(j))


def summary(v):
    return {'median': statistics.median(v), 'min': min(v), 'max': max(v), 'runs': v}


results = []
for name, pt_args, peer_args in CONFIGS:
    pt, peer = [], []
    for _ in range(args.repeats):
        pt.append(run_pipetrain(pt_args))
        if not args.no_peer:
            peer.append(run_peer(peer_args))
        print('.', end='', file=sys.stderr, flush=True)
    row = {'name': name, 'pipetrain': summary(pt)}
    if peer:
        row['pytorch'] = summary(peer)
        row['ratio'] = row['pipetrain']['median'] / row['pytorch']['median']
    results.append(row)
print(file=sys.stderr)

print('%-24s %26s %26s %7s' % ('configuration', 'pipetrain samples/s', 'PyTorch samples/s', 'ratio'))
for r in results:
    a = r['pipetrain']
    s = '%-24s %12.0f (%5.0f-%5.0f)' % (r['name'], a['median'], a['min'], a['max'])
    if 'pytorch' in r:
        b = r['pytorch']
        s += ' %12.0f (%5.0f-%5.0f) %6.2fx' % (b['median'], b['min'], b['max'], r['ratio'])
    print(s)
meta = {'env': args.env, 'repeats': args.repeats, 'steps': args.steps, 'warmup': args.warmup,
        'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'results': results}
if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    json.dump(meta, open(args.json, 'w'), indent=1)
