#!/usr/bin/env python3
"""Training throughput of pipetrain beside PyTorch, in one run on one machine.

Each configuration trains the same model file with the same optimizer, batch and threads
on both sides: `pipetrain train` and experiments/torch_peer.py, each run a fresh process,
the two alternating (their order swapped every repeat), under one environment (`tuned` by
default: OPENBLAS_CORETYPE unset, glibc malloc thresholds raised; see benchlib.py). Prints
the median (min-max) of --repeats runs in samples/s, the ratio, and the largest share of
the machine other processes used during a run (noise; above 0.05 the figures are suspect).

The peer needs PyTorch (Debian: apt-get install python3-torch, for /usr/bin/python3); this
script itself needs only the standard library, and runs the peer with the interpreter that
has torch (this one, else /usr/bin/python3, or --python).

    python3 experiments/bench_throughput.py --repeats 3 --json results/throughput.json
    python3 experiments/bench_throughput.py --quick         # smoke test, under a minute
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

# name: model, batch, optimizer, lr, threads, BLAS threads of the peer (one when PyTorch's
# own pool has two: two spinning pools on 2 cores fight)
CONFIGS = [
    ('cnn_b128_t1', 'models/seed-cnn.cfg', 128, 'adam', 0.001, 1, 1),
    ('cnn_b128_t2', 'models/seed-cnn.cfg', 128, 'adam', 0.001, 2, 1),
    ('mlp_sigmoid_sgd_b64_t1', 'models/seed-mlp.cfg', 64, 'sgd', 0.01, 1, 1),
    ('mlp_sigmoid_sgd_b64_t2', 'models/seed-mlp.cfg', 64, 'sgd', 0.01, 2, 1),
]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    benchlib.add_common_args(p, warmup=20, steps=150, repeats=3)
    p.add_argument('--only', default='', help='comma list of configuration names: ' +
                   ', '.join(c[0] for c in CONFIGS))
    args = p.parse_args()
    if args.quick:
        args.repeats, args.warmup, args.steps = 1, 3, 10
    configs = CONFIGS
    if args.only:
        keep = set(args.only.split(','))
        unknown = keep - {c[0] for c in CONFIGS}
        if unknown:
            benchlib.fail('unknown configuration %s' % ', '.join(sorted(unknown)))
        configs = [c for c in CONFIGS if c[0] in keep]
    benchlib.check_setup(args)
    env = benchlib.environment(args.env)

    results = []
    for name, model, batch, opt, lr, threads, blas in configs:
        common = ['--model', model, '--batch', str(batch), '--optimizer', opt, '--lr', str(lr),
                  '--untimed-steps', str(args.warmup)]
        pt_cmd = [args.pipetrain, 'train', *common, '--threads', str(threads),
                  '--steps', str(args.warmup + args.steps), '--test-samples', '0', '--json']
        peer_cmd = [args.python or sys.executable, os.path.join(benchlib.HERE, 'torch_peer.py'),
                    *common, '--threads', str(threads), '--blas-threads', str(blas),
                    '--steps', str(args.steps)]
        pt, peer, noise, params = [], [], [], set()
        for rep in range(args.repeats):
            sides = [('pipetrain', pt_cmd, pt)]
            if not args.no_peer:
                sides.append(('PyTorch peer', peer_cmd, peer))
            if rep % 2:
                sides.reverse()
            for what, cmd, out in sides:
                try:
                    j = benchlib.run(cmd, env, what)
                except RuntimeError as e:
                    benchlib.fail(e)
                out.append(j['samples_per_s'])
                noise.append(j['noise'])
                if j.get('params') is not None:
                    params.add(j['params'])
            print('.', end='', file=sys.stderr, flush=True)
        if len(params) > 1:
            benchlib.fail('%s: pipetrain and the peer built different models (%s parameters)'
                          % (name, ' vs '.join(str(n) for n in sorted(params))))
        row = {'name': name, 'model': model, 'batch': batch, 'optimizer': opt, 'lr': lr,
               'threads': threads, 'pipetrain': benchlib.summary(pt), 'noise_max': max(noise)}
        if peer:
            row['pytorch'] = benchlib.summary(peer)
            row['ratio'] = row['pipetrain']['median'] / row['pytorch']['median']
        results.append(row)
    print(file=sys.stderr)

    print('%-24s %26s %26s %7s %6s' % ('configuration', 'pipetrain samples/s',
                                       'PyTorch samples/s', 'ratio', 'noise'))
    for r in results:
        a = r['pipetrain']
        line = '%-24s %12.0f (%5.0f-%5.0f)' % (r['name'], a['median'], a['min'], a['max'])
        if 'pytorch' in r:
            b = r['pytorch']
            line += ' %12.0f (%5.0f-%5.0f) %6.2fx' % (b['median'], b['min'], b['max'], r['ratio'])
        else:
            line += ' %26s %7s' % ('-', '-')
        print(line + ' %6.2f' % r['noise_max'])
    if any(r['noise_max'] > benchlib.NOISY for r in results):
        print('noise above %.2f: other processes used the machine during some runs; '
              'rerun on an idle machine for figures to report' % benchlib.NOISY)
    if args.quick:
        print('(--quick: a smoke test of %d timed steps; not figures to report)' % args.steps)
    benchlib.write_json(args.json, {
        'env': args.env, 'repeats': args.repeats, 'steps': args.steps, 'warmup': args.warmup,
        'quick': args.quick, 'peer_python': args.python,
        'time': time.strftime('%Y-%m-%d %H:%M:%S'), 'results': results})


if __name__ == '__main__':
    main()
