#!/usr/bin/env python3
"""PyTorch peer on the GPU for language models: ANY model file of pipetrain's transformer
layers (models/gpt-nano.cfg, models/gpt2-small.cfg, ...), built by experiments/gpt_torch.py
(the project's own PyTorch form of the file: the same layers, layout and initialisation),
trained with AdamW on random token windows of the model's context held in GPU memory, so no
host data path is timed. The sibling of bench_torch_gpu.py (the seed CNN) for issue 25.

--precision fp32 (default: full float32, TF32 off, as pipetrain computes), tf32 (matrix
products on the tensor cores with TF32), bf16 (autocast to bfloat16, fp32 master weights);
--compile times torch.compile's graph (compilation in the warm-up, reported apart).

Timing: --warmup steps, then --steps timed steps in --chunks chunks, the GPU synchronised
around each chunk; tokens_per_s over the whole timed window, chunks for median/min/max.
Prints one JSON line last on stdout. NOT YET RUN ON A GPU (written without one); a dry run
on the CPU:  /usr/bin/python3 experiments/cuda/bench_gpt_torch_gpu.py models/gpt-nano.cfg \
    --device cpu --batch 2 --warmup 1 --steps 2 --chunks 1
"""
import argparse, json, os, statistics, sys, time

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('model', help='a model file of transformer layers')
p.add_argument('--device', default='cuda')
p.add_argument('--batch', type=int, default=16, help='sequences a step (each the context)')
p.add_argument('--warmup', type=int, default=5)
p.add_argument('--steps', type=int, default=30)
p.add_argument('--chunks', type=int, default=3)
p.add_argument('--lr', type=float, default=3e-4)
p.add_argument('--seed', type=int, default=0)
p.add_argument('--precision', choices=('fp32', 'tf32', 'bf16'), default='fp32')
p.add_argument('--compile', action='store_true')
p.add_argument('--init', choices=('pipetrain', 'torch'), default='torch',
               help="pipetrain's initial parameters (its Philox draws in pure Python: "
                    "minutes for GPT-2 124M) or PyTorch's (default; the timing does not care)")
p.add_argument('--tag', default='')
args = p.parse_args()
if args.steps < 1 or args.warmup < 0 or args.batch < 1 or not 1 <= args.chunks <= args.steps:
    p.error('need --steps >= 1, --warmup >= 0, --batch >= 1 and 1 <= --chunks <= --steps')

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import torch
import torch.nn.functional as F
import gpt_torch


def log(*a):
    print('bench_gpt_torch_gpu:', *a, file=sys.stderr, flush=True)


dev = torch.device(args.device)
cuda = dev.type == 'cuda'
if cuda:
    torch.backends.cuda.matmul.allow_tf32 = args.precision == 'tf32'
    torch.backends.cudnn.allow_tf32 = args.precision == 'tf32'
torch.manual_seed(args.seed)
model = gpt_torch.build(args.model)
if args.init == "pipetrain":
    gpt_torch.init_params(model, args.seed)  # pipetrain's initial parameters (pure Python)
model = model.to(dev)
spec = gpt_torch.model_spec(args.model)
V, T = spec[0][1]['vocab'], spec[0][1]['context']
params = sum(p.numel() for p in model.parameters())
log(f'{args.model}: {params} parameters, V={V} T={T}, batch {args.batch}, {args.precision}')
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
fwd = torch.compile(model) if args.compile else model
data = torch.randint(0, V, (max(64, args.batch), T + 1), device=dev)


def step():
    i = torch.randint(0, data.shape[0], (args.batch,), device=dev)
    win = data[i]
    x, y = win[:, :-1], win[:, 1:]
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16,
                        enabled=args.precision == 'bf16'):
        logits = fwd(x)
        loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def sync():
    if cuda:
        torch.cuda.synchronize(dev)


t0 = time.perf_counter()
for _ in range(args.warmup):
    loss = step()
sync()
warm_s = time.perf_counter() - t0
per = args.steps // args.chunks
chunks, total_steps, t_all = [], 0, time.perf_counter()
for c in range(args.chunks):
    n = per if c < args.chunks - 1 else args.steps - per * (args.chunks - 1)
    sync()
    t = time.perf_counter()
    for _ in range(n):
        loss = step()
    sync()
    chunks.append(n * args.batch * T / (time.perf_counter() - t))
    total_steps += n
elapsed = time.perf_counter() - t_all
res = {'bench': 'gpt_torch_gpu', 'model': os.path.basename(args.model), 'params': params,
       'device': torch.cuda.get_device_name(dev) if cuda else 'cpu', 'torch': torch.__version__,
       'precision': args.precision, 'compile': args.compile, 'batch': args.batch, 'context': T,
       'steps': total_steps, 'warmup_s': round(warm_s, 3),
       'tokens_per_s': total_steps * args.batch * T / elapsed,
       'tokens_per_s_median': statistics.median(chunks), 'tokens_per_s_min': min(chunks),
       'tokens_per_s_max': max(chunks), 'final_loss': float(loss), 'tag': args.tag}
print(json.dumps(res))
