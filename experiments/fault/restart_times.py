#!/usr/bin/env python3
"""How fast `pipetrain launch` notices a failure and trains again: for a killed rank
(SIGKILL from outside) and a stalled one (SIGSTOP; the watchdog's --timeout ends the job),
R runs each of a 2-stage seed-cnn job under launch:

  detection   the signal sent -> launch logs the attempt as failed (its JSON log)
  restart     the failure logged -> the restarted job's first completed step
  first step  the first attempt's start -> its first step (a cold start, for comparison)

    python3 experiments/fault/restart_times.py [--pipetrain build/pipetrain] [--repeats 3]
        [--timeout 5] [--json FILE]

Prints a table (median [min-max], seconds).
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time

def rank_pid(ckdir):
    out = subprocess.run(['pgrep', '-n', '-f', '--', f'--checkpoint-dir {ckdir} '],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None

def one(args, tmp, kind, i):
    ck = os.path.join(tmp, f'{kind}{i}')
    log = os.path.join(tmp, f'{kind}{i}.jsonl')
    # --backoff 0: the figures are of noticing and restarting, not of launch's chosen wait
    cmd = [args.pipetrain, 'launch', '--backoff', '0', '--log', log, '--', 'mpiexec', '-n', '2',
           args.pipetrain,
           'train', '--model', args.model, '--batch', '64', '--stages', '2',
           '--microbatches', '4', '--steps', str(args.steps), '--test-samples', '0',
           '--threads', '1', '--timeout', str(args.timeout), '--checkpoint-dir', ck,
           '--checkpoint-every', str(args.every)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (os.path.isdir(ck) and any(f.startswith('ckpt-') and f.endswith('.safetensors')
                                         for f in os.listdir(ck))):
        if p.poll() is not None:
            raise SystemExit(f'{kind}: the job ended before its first checkpoint')
        time.sleep(0.02)
    pid = rank_pid(ck)
    t_sig = time.time()
    os.kill(pid, signal.SIGKILL if kind == 'kill' else signal.SIGSTOP)
    rc = p.wait()
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    ev = [json.loads(l) for l in open(log)]
    if rc != 0 or [e['event'] for e in ev] != ['start', 'failed', 'restart', 'start', 'done']:
        raise SystemExit(f'{kind}: exit {rc}, events {[e["event"] for e in ev]}')
    failed, start2, done = ev[1], ev[3], ev[4]
    first = ev[1].get('first_step_s')
    return {'detection_s': failed['unix_time'] - t_sig,
            'restart_to_first_step_s': start2['unix_time'] + done['first_step_s'] - failed['unix_time'],
            'cold_first_step_s': first}

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--pipetrain', default='build/pipetrain')
    ap.add_argument('--model', default='models/seed-cnn.cfg')
    ap.add_argument('--steps', type=int, default=300)
    ap.add_argument('--every', type=int, default=20)
    ap.add_argument('--timeout', type=float, default=5)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--json')
    args = ap.parse_args()
    res = {'kill': [], 'stall': []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for kind in res:
                res[kind].append(one(args, tmp, kind, i))
    print(f'{args.model}, 2 stages under pipetrain launch, --timeout {args.timeout} s, '
          f'{args.repeats} runs each: median [min-max] in seconds')
    print(f'{"failure":<8}{"detection":>22}{"restart to first step":>28}{"cold first step":>22}')
    def f(xs):
        return f'{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]'
    for kind, rs in res.items():
        print(f'{kind:<8}{f([r["detection_s"] for r in rs]):>22}'
              f'{f([r["restart_to_first_step_s"] for r in rs]):>28}'
              f'{f([r["cold_first_step_s"] for r in rs]):>22}')
    if args.json:
        with open(args.json, 'w') as fh:
            json.dump({'args': vars(args), 'runs': res}, fh, indent=1)

if __name__ == '__main__':
    sys.exit(main())
