#!/usr/bin/env python3
"""PyTorch peer of a 2-stage `pipetrain train --stages 2 --schedule gpipe`: the network of a
models/*.cfg file cut in two, one process per stage, activations and their gradients sent
with torch.distributed (gloo) point-to-point messages.

By default stage 0 holds the layers up to the first one that is not a convolution or a
pooling (for seed-cnn: the convolutions) and stage 1 the rest (the dense layers and the
loss); --split K puts layers K.. on stage 1. Each global batch is cut into M micro-batches:
all M forwards (activations sent 0 -> 1), then the M backwards in reverse order (gradients
sent 1 -> 0), gradients accumulated with each micro-batch's loss weighted by its share of
the batch, then one optimizer step per stage: GPipe's fill and drain.

For every M of --micro: a freshly seeded model, --warmup steps, a barrier, --steps timed
steps, a barrier. The last line of stdout is one JSON object with samples/s and each stage's
compute and wait time per step for every M, and other_cpu_frac (the share of the machine
other processes used during the timed window).

The two stages run as two fresh processes of this script (--rank 0 and 1), started by the
first; threads per process as for torch_peer.py (set before torch is imported).

    /usr/bin/python3 experiments/torch_pipe.py --model models/seed-cnn.cfg --micro 1,2,4,8
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interpreter  # noqa: E402
import torch_peer  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    torch_peer.common_args(p)
    p.set_defaults(warmup=8, steps=40)
    p.add_argument('--micro', default='1,2,4,8', help='comma list of micro-batch counts M')
    p.add_argument('--threads', type=int, default=1, help='threads per stage (OpenMP and BLAS)')
    p.add_argument('--split', type=int, default=None, help='first layer of stage 1 (0-based)')
    p.add_argument('--timeout', type=float, default=300, help='seconds before giving up')
    p.add_argument('--rank', type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def launch(args):
    """Starts the two stages as fresh processes and relays rank 0's JSON line. When one
    stage fails, the other is stopped rather than left waiting for its messages."""
    import tempfile
    env = dict(os.environ, MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()),
               GLOO_SOCKET_IFNAME=os.environ.get('GLOO_SOCKET_IFNAME', 'lo'))
    with tempfile.TemporaryFile('w+') as out:
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                                   '--rank', str(r)], env=env,
                                  stdout=out if r == 0 else subprocess.DEVNULL)
                 for r in (0, 1)]
        end = time.monotonic() + args.timeout
        while any(q.poll() is None for q in procs) and time.monotonic() < end:
            if any(q.poll() not in (None, 0) for q in procs):
                break
            time.sleep(0.05)
        rc = [q.poll() for q in procs]
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
        if rc != [0, 0]:
            why = 'did not finish within %g s' % args.timeout if None in rc and \
                all(r in (None, 0) for r in rc) else 'failed (exit status %s)' % rc
            sys.exit('%s: the pipeline %s' % (sys.argv[0], why))
        out.seek(0)
        sys.stdout.write(out.read())


def stage_step(rank, stage, opt, xb, yb, M, B, act_shape, tm):
    """One GPipe step on this rank; returns the batch loss on rank 1."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    opt.zero_grad(set_to_none=True)
    reqs, keep = [], []
    loss_val = None
    if rank == 0:
        outs = []
        for m, x in enumerate(xb.chunk(M)):
            a = time.perf_counter()
            y = stage(x)
            tm['compute'] += time.perf_counter() - a
            send = y.detach().contiguous()
            reqs.append(dist.isend(send, dst=1, tag=m))
            keep.append(send)
            outs.append(y)
        for m in reversed(range(M)):
            g = torch.empty_like(outs[m])
            a = time.perf_counter()
            dist.recv(g, src=1, tag=m)
            b = time.perf_counter()
            outs[m].backward(g)
            tm['compute'] += time.perf_counter() - b
            tm['wait'] += b - a
    else:
        acts, losses = [], []
        for m, y in enumerate(yb.chunk(M)):
            act = torch.empty((y.shape[0], *act_shape))
            a = time.perf_counter()
            dist.recv(act, src=0, tag=m)
            b = time.perf_counter()
            act.requires_grad_()
            loss = F.cross_entropy(stage(act), y) * (y.shape[0] / B)
            tm['compute'] += time.perf_counter() - b
            tm['wait'] += b - a
            acts.append(act)
            losses.append(loss)
        for m in reversed(range(M)):
            a = time.perf_counter()
            losses[m].backward()
            tm['compute'] += time.perf_counter() - a
            reqs.append(dist.isend(acts[m].grad, dst=0, tag=m))
        loss_val = sum(v.item() for v in losses)
    a = time.perf_counter()
    for r in reqs:
        r.wait()
    tm['wait'] += time.perf_counter() - a
    a = time.perf_counter()
    opt.step()
    tm['compute'] += time.perf_counter() - a
    return loss_val


def worker(args):
    rank = args.rank
    torch_peer.set_thread_env(args.threads, args.threads)
    import datetime
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    info = torch_peer.runtime_info(args.threads)
    dist.init_process_group('gloo', rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=args.timeout))
    B = args.batch
    micro = [int(m) for m in args.micro.split(',') if m]
    for M in micro:
        if B % M:
            sys.exit('--micro %d does not divide --batch %d' % (M, B))
    _, shapes, kinds = torch_peer.build_layers(args.model)
    split = args.split
    if split is None:
        split = next((i for i, k in enumerate(kinds) if k not in ('conv', 'maxpool', 'avgpool')),
                     len(kinds))
    if not 0 < split < len(kinds):
        sys.exit('--split %d: each stage needs a layer (the model has %d)' % (split, len(kinds)))
    xtr, ytr = torch_peer.load_data(args, 'train', images=rank == 0)
    perm = torch.randperm(ytr.shape[0], generator=torch.Generator().manual_seed(args.seed))
    ys = ytr[perm].contiguous()
    xs = xtr[perm].contiguous() if rank == 0 else None
    nb = ys.shape[0] // B
    res = {'peer': 'pytorch-gpipe', 'model': os.path.relpath(args.model, torch_peer.ROOT),
           'split': split, 'batch': B, 'optimizer': args.optimizer, 'lr': args.lr,
           'threads_per_stage': args.threads, 'warmup': args.warmup, 'steps': args.steps, **info}
    results = {}
    for M in micro:
        torch.manual_seed(args.seed)  # the same whole model on both ranks; each keeps its part
        layers, _, _ = torch_peer.build_layers(args.model)
        stage = nn.Sequential(*(layers[:split] if rank == 0 else layers[split:]))
        stage.train()
        opt = torch_peer.make_optimizer(stage.parameters(), args.optimizer, args.lr, args.momentum)
        win = torch_peer.Window()
        tm = {'compute': 0.0, 'wait': 0.0}
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                dist.barrier()
                win.start()
                tm = {'compute': 0.0, 'wait': 0.0}
            j = i % nb
            stage_step(rank, stage, opt, xs[j * B:(j + 1) * B] if rank == 0 else None,
                       ys[j * B:(j + 1) * B], M, B, shapes[split - 1], tm)
        dist.barrier()
        wall = win.stop()
        t = torch.zeros(5, dtype=torch.float64)
        t[0] = win.own
        t[1 + 2 * rank], t[2 + 2 * rank] = tm['compute'], tm['wait']
        dist.all_reduce(t)
        win.set_own(t[0].item())
        S = args.steps
        results[str(M)] = {
            'samples_per_s': round(S * B / wall, 2), **win.stats(),
            'stage0_compute_ms_per_step': round(1e3 * t[1].item() / S, 2),
            'stage0_wait_ms_per_step': round(1e3 * t[2].item() / S, 2),
            'stage1_compute_ms_per_step': round(1e3 * t[3].item() / S, 2),
            'stage1_wait_ms_per_step': round(1e3 * t[4].item() / S, 2)}
        if rank == 0:
            print(json.dumps({'M': M, **results[str(M)]}), file=sys.stderr, flush=True)
    res['throughput'] = results
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(res), flush=True)


def main():
    args = parse_args()
    torch_peer.check_data_args(args)
    interpreter.ensure_modules(['torch'])
    if args.rank is None:
        launch(args)
    else:
        worker(args)


if __name__ == '__main__':
    main()
