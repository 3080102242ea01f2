#!/usr/bin/env python3
"""PyTorch peer of `mpiexec -n R pipetrain train --replicas R`: the network of a models/*.cfg
file trained data-parallel with torch.nn.parallel.DistributedDataParallel over gloo, R
processes on this machine (loopback only).

The same global batch as pipetrain's: --batch samples per optimizer step for the whole job,
each rank training on its own contiguous share (batch / R samples) of every batch of one
shuffled order. Each rank's loss is the mean over its share and DDP averages the gradients
(bucketed, overlapped with the backward pass: --bucket-cap-mb, PyTorch's default 25 MB), so
a step is the step of the whole batch. Model (torch_peer.build_layers, the same seed on
every rank, as DDP requires), optimizer, data and thread settings as torch_peer.py.

--warmup steps, a barrier, --steps timed steps, a barrier. The last line of stdout is one
JSON object from rank 0: samples_per_s (the whole job's), the median step time of rank 0,
the largest difference between the ranks' parameters at the end (0 when the replicas stayed
identical), and other_cpu_frac (the share of the machine other processes used during the
timed window; above 0.05 the figure is suspect).

The ranks run as R fresh processes of this script (--rank 0..R-1), started by the first with
MASTER_ADDR=127.0.0.1 and a free port; threads per process as torch_peer.py (set before torch
is imported). Needs PyTorch (Debian: apt-get install python3-torch, for /usr/bin/python3).

    /usr/bin/python3 experiments/torch_ddp.py --model models/seed-cnn.cfg --batch 256 --nproc 2
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interpreter  # noqa: E402
import torch_peer  # noqa: E402
import torch_pipe  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    torch_peer.common_args(p)
    p.add_argument('--nproc', type=int, default=2, help='processes (replicas)')
    p.add_argument('--threads', type=int, default=1, help='threads per process (OpenMP and BLAS)')
    p.add_argument('--bucket-cap-mb', type=float, default=25.0,
                   help="DDP's gradient bucket size in MB (PyTorch's default 25)")
    p.add_argument('--timeout', type=float, default=300, help='seconds before giving up')
    p.add_argument('--rank', type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.nproc < 1:
        p.error('--nproc must be at least 1')
    if args.batch < 1 or args.batch % args.nproc:
        p.error('--batch %d: must be a positive multiple of --nproc %d' % (args.batch, args.nproc))
    if args.threads < 1 or args.steps < 1 or args.warmup < 0:
        p.error('--threads and --steps must be at least 1, --warmup at least 0')
    return args


def launch(args):
    """Starts the ranks as fresh processes and relays rank 0's JSON line. When one fails,
    the others are stopped rather than left waiting in a collective."""
    env = dict(os.environ, MASTER_ADDR='127.0.0.1', MASTER_PORT=str(torch_pipe.free_port()),
               GLOO_SOCKET_IFNAME=os.environ.get('GLOO_SOCKET_IFNAME', 'lo'))
    with tempfile.TemporaryFile('w+') as out:
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                                   '--rank', str(r)], env=env,
                                  stdout=out if r == 0 else subprocess.DEVNULL)
                 for r in range(args.nproc)]
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
        if any(r != 0 for r in rc):
            why = 'did not finish within %g s' % args.timeout if all(r in (None, 0) for r in rc) \
                else 'failed (exit status %s)' % rc
            sys.exit('%s: the data-parallel run %s' % (sys.argv[0], why))
        out.seek(0)
        sys.stdout.write(out.read())


def worker(args):
    rank, world = args.rank, args.nproc
    torch_peer.set_thread_env(args.threads, args.threads)
    import datetime
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    info = torch_peer.runtime_info(args.threads)
    dist.init_process_group('gloo', rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    B, b = args.batch, args.batch // world
    xtr, ytr = torch_peer.load_data(args, 'train')
    # one shuffled order on every rank; this rank keeps its contiguous share of each batch,
    # laid out so that its share of batch j is rows j*b .. (j+1)*b (zero-copy slices)
    perm = torch.randperm(ytr.shape[0], generator=torch.Generator().manual_seed(args.seed))
    nb = perm.shape[0] // B
    mine = perm[:nb * B].view(nb, B)[:, rank * b:(rank + 1) * b].reshape(-1)
    xs, ys = xtr[mine].contiguous(), ytr[mine].contiguous()
    del xtr, ytr, perm

    torch.manual_seed(args.seed)  # the same initial model on every rank
    layers, _, _ = torch_peer.build_layers(args.model)
    model = nn.Sequential(*layers)
    n_params = sum(q.numel() for q in model.parameters())
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch_peer.make_optimizer(ddp.parameters(), args.optimizer, args.lr, args.momentum)
    ddp.train()

    win, times = torch_peer.Window(), []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            dist.barrier()
            win.start()
        j = i % nb
        a = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(xs[j * b:(j + 1) * b]), ys[j * b:(j + 1) * b])
        loss.backward()
        opt.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - a)
    dist.barrier()
    wall = win.stop()

    # CPU of all ranks (for the noise figure), the batch loss, and whether replicas agree
    t = torch.tensor([win.own, loss.item() / world], dtype=torch.float64)
    dist.all_reduce(t)
    win.set_own(t[0].item())
    flat = nn.utils.parameters_to_vector(model.parameters()).detach()
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = torch.tensor([(flat - ref).abs().max().item()])
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        res = {'peer': 'pytorch-ddp', 'model': os.path.relpath(args.model, torch_peer.ROOT),
               'params': n_params, 'nproc': world, 'backend': 'gloo', 'batch': B,
               'batch_per_proc': b, 'optimizer': args.optimizer, 'lr': args.lr,
               'threads_per_proc': args.threads, 'bucket_cap_mb': args.bucket_cap_mb,
               'warmup': args.warmup, 'steps': args.steps, **info, **win.stats(),
               'samples_per_s': round(args.steps * B / wall, 2),
               'step_ms_median': round(1e3 * torch_peer.median(times), 3),
               'train_loss': round(t[1].item(), 5),
               'replica_max_abs_diff': diff.item(),
               'peak_rss_mb': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
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
