#!/usr/bin/env python3
"""PyTorch peer on the GPU: the seed-cnn (690,590 parameters) trained on Fashion-MNIST, or
any model file of conv, pool, dense, dropout and flatten layers (--model, built by
experiments/torch_peer.py as its CPU peer builds it; e.g. models/wide-dense.cfg).

The model is models/seed-cnn.cfg written out in PyTorch (the same layers as
experiments/torch_peer.py builds from the file; kept standalone so that the GPU bundle
needs no other script), Adam lr 1e-3, dropout 0.5 in
training mode. The whole training set sits in GPU memory as float32 (N, 1, 28, 28); each
step draws a random batch with indices generated and applied on the GPU, so no host data
path is timed. Eager mode by default; --compile times torch.compile's graph as a second
figure (compilation happens during the warm-up and is reported separately).

Float32 throughout, with TF32 OFF for matrix products and cuDNN convolutions: pipetrain
computes in full float32, and TF32 (PyTorch's default for cuDNN convolutions) would run
on the tensor cores with 10-bit mantissas. The JSON reports the settings in force;
--tf32 turns it on for a look at what that costs.

Timing: --warmup steps, then --steps timed steps split into --chunks equal chunks; the
GPU is synchronised before and after each chunk (torch.cuda.synchronize) and the chunk
timed with the host clock. samples_per_s is the whole timed window; the chunks give
median, min and max. No per-step synchronisation (a PyTorch loop does not need one).

Prints one JSON line last on stdout (progress on stderr). Runs on the CPU too, for a dry
run on a machine without a GPU:  python3 bench_torch_gpu.py --device cpu --steps 4
"""
import argparse, gzip, json, os, statistics, struct, sys, time

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--device', default='cuda', help='cuda, cuda:N or cpu (default cuda)')
p.add_argument('--batch', type=int, default=128)
p.add_argument('--warmup', type=int, default=20)
p.add_argument('--steps', type=int, default=200, help='timed steps')
p.add_argument('--chunks', type=int, default=5, help='timed chunks for median/min/max')
p.add_argument('--lr', type=float, default=1e-3)
p.add_argument('--dropout', type=float, default=0.5)
p.add_argument('--seed', type=int, default=0)
p.add_argument('--data-dir', default='/usr/share/datasets/fashion-mnist')
p.add_argument('--train-samples', type=int, default=0, help='use the first N (0: all)')
p.add_argument('--compile', action='store_true', help='torch.compile the model (torch >= 2)')
p.add_argument('--tf32', action='store_true', help='allow TF32 (default: off, full float32)')
p.add_argument('--cudnn-benchmark', action='store_true',
               help='let cuDNN time its algorithms (default off, as in PyTorch)')
p.add_argument('--model', default='',
               help='a model file to build (default: the seed-cnn written out below)')
p.add_argument('--optimizer', choices=('adam', 'sgd'), default='adam')
p.add_argument('--bf16', action='store_true',
               help='torch.autocast(bfloat16) around the forward and the loss (fp32 master '
                    'weights and optimizer), the peer of pipetrain --precision bf16')
p.add_argument('--tag', default='')
args = p.parse_args()
if args.steps < 1 or args.warmup < 0 or args.batch < 1 or not 1 <= args.chunks <= args.steps:
    p.error('need --steps >= 1, --warmup >= 0, --batch >= 1 and 1 <= --chunks <= --steps')

import torch
import torch.nn as nn
import torch.nn.functional as F


def log(*a):
    print('bench_torch_gpu:', *a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- model
class CNN(nn.Module):
    """models/seed-cnn.cfg: 690,590 parameters, as pipetrain builds it."""
    def __init__(self, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),      # 28->26->13
            nn.Conv2d(32, 128, 3), nn.ReLU(), nn.MaxPool2d(2),    # 13->11->5
            nn.Conv2d(128, 256, 3), nn.ReLU(), nn.MaxPool2d(2))   # 5->3->1
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout),
            nn.Linear(256, 1000), nn.ReLU(),
            nn.Linear(1000, 100), nn.ReLU(),
            nn.Linear(100, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


# ----------------------------------------------------------------------------- data
def load_idx(path):
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rb') as f:
        data = f.read()
    magic, = struct.unpack('>I', data[:4])
    if magic >> 8 != 0x08:  # unsigned bytes
        raise ValueError(f'{path}: not an IDX file of unsigned bytes (magic {magic:#x})')
    ndim = magic & 0xFF
    dims = struct.unpack('>' + 'I' * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def find(d, name):
    for cand in (f'{d}/{name}.gz', f'{d}/{name}'):
        if os.path.exists(cand):
            return cand
    raise FileNotFoundError(f'{d}/{name}(.gz)')


# ----------------------------------------------------------------------------- precision
def set_tf32(enabled):
    """TF32 on or off through whichever API this torch has. PyTorch 2.9 and later have
    per-backend fp32_precision ('ieee' or 'tf32') and deprecate allow_tf32; mixing the two
    APIs can raise, so only one is written."""
    mode = 'tf32' if enabled else 'ieee'
    if hasattr(torch.backends, 'fp32_precision'):
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
        return
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    if hasattr(torch, 'set_float32_matmul_precision'):
        torch.set_float32_matmul_precision('high' if enabled else 'highest')


def precision_report():
    """The settings in force, read back (a getter that objects is reported, not fatal)."""
    r = {}
    def read(key, getter):
        try:
            r[key] = getter()
        except Exception as e:  # noqa: BLE001 - any API complaint is worth reporting
            r[key] = f'unreadable: {e!r}'[:120]
    if hasattr(torch.backends, 'fp32_precision'):
        read('fp32_precision_matmul', lambda: torch.backends.cuda.matmul.fp32_precision)
        read('fp32_precision_cudnn_conv', lambda: torch.backends.cudnn.conv.fp32_precision)
        r['tf32_matmul'] = r['fp32_precision_matmul'] == 'tf32'
        r['tf32_cudnn'] = r['fp32_precision_cudnn_conv'] == 'tf32'
    else:
        read('tf32_matmul', lambda: bool(torch.backends.cuda.matmul.allow_tf32))
        read('tf32_cudnn', lambda: bool(torch.backends.cudnn.allow_tf32))
        if hasattr(torch, 'get_float32_matmul_precision'):
            read('float32_matmul_precision', torch.get_float32_matmul_precision)
    return r


# ----------------------------------------------------------------------------- main
def main():
    dev = torch.device(args.device)
    if dev.type == 'cuda' and not torch.cuda.is_available():
        log(f'FAIL: --device {args.device} but torch {torch.__version__} sees no CUDA GPU '
            f'(torch.version.cuda = {torch.version.cuda})')
        return 2
    if args.compile and not hasattr(torch, 'compile'):
        log(f'FAIL: --compile needs torch >= 2 (this is {torch.__version__})')
        return 2
    set_tf32(args.tf32)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    d = args.data_dir
    x = load_idx(find(d, 'train-images-idx3-ubyte'))
    y = load_idx(find(d, 'train-labels-idx1-ubyte'))
    if args.train_samples:
        x, y = x[:args.train_samples], y[:args.train_samples]
    n = x.shape[0]
    if n < args.batch:
        log(f'FAIL: {n} training samples, fewer than a batch of {args.batch}')
        return 2
    # on the device once: float32 in [0, 1], the layout the model takes
    xs = x.to(dev).float().div_(255.0).unsqueeze(1).contiguous()
    ys = y.to(dev).long()
    load_s = time.perf_counter() - t0

    if args.model:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import torch_peer  # experiments/torch_peer.py: the same layers as pipetrain builds
        layers, _, _ = torch_peer.build_layers(args.model)
        model = nn.Sequential(*layers).to(dev)
    else:
        model = CNN(args.dropout).to(dev)
    nparams = sum(q.numel() for q in model.parameters())
    assert args.model or nparams == 690590, nparams
    model.train()
    opt = (torch.optim.Adam(model.parameters(), lr=args.lr) if args.optimizer == 'adam'
           else torch.optim.SGD(model.parameters(), lr=args.lr))
    step_model = torch.compile(model) if args.compile else model
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    def sync():
        if dev.type == 'cuda':
            torch.cuda.synchronize(dev)

    def train_step():
        idx = torch.randint(0, n, (args.batch,), device=dev, generator=gen)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = F.cross_entropy(step_model(xs[idx]), ys[idx])
        loss.backward()
        opt.step()
        return loss

    log(f'{args.device}: {n} samples loaded in {load_s:.2f} s; warm-up {args.warmup} steps')
    tw = time.perf_counter()
    loss = None
    for _ in range(args.warmup):
        loss = train_step()
    sync()
    warm_s = time.perf_counter() - tw

    # equal chunks; the remainder goes to the last
    sizes = [args.steps // args.chunks] * args.chunks
    sizes[-1] += args.steps - sum(sizes)
    chunk_sps = []
    sync()
    t_start = time.perf_counter()
    for size in sizes:
        a = time.perf_counter()
        for _ in range(size):
            loss = train_step()
        sync()
        chunk_sps.append(size * args.batch / (time.perf_counter() - a))
    wall = time.perf_counter() - t_start
    final_loss = float(loss.item())
    if final_loss != final_loss or final_loss in (float('inf'), float('-inf')):
        log(f'FAIL: the loss is {final_loss}')
        return 3

    res = {'bench': 'torch_cnn_gpu' if not args.model else 'torch_model_gpu', 'tag': args.tag, 'device': str(dev),
           'device_name': (torch.cuda.get_device_name(dev) if dev.type == 'cuda'
                           else 'cpu'),
           'torch': torch.__version__, 'cuda': torch.version.cuda,
           'cudnn': (torch.backends.cudnn.version() if dev.type == 'cuda' else None),
           'batch': args.batch, 'warmup': args.warmup, 'steps': args.steps,
           'train_samples': n, 'params': nparams, 'lr': args.lr,
           'model': args.model or 'seed-cnn (built in)',
           'precision': 'bf16' if args.bf16 else 'tf32' if args.tf32 else 'fp32',
           'optimizer': args.optimizer, 'mode': 'compile' if args.compile else 'eager',
           'cudnn_benchmark': bool(torch.backends.cudnn.benchmark),
           **precision_report(),
           'samples_per_s': round(args.steps * args.batch / wall, 2),
           'samples_per_s_median': round(statistics.median(chunk_sps), 2),
           'samples_per_s_min': round(min(chunk_sps), 2),
           'samples_per_s_max': round(max(chunk_sps), 2),
           'step_ms_mean': round(1e3 * wall / args.steps, 4),
           'window_s': round(wall, 4), 'warmup_s': round(warm_s, 3),
           'data_load_s': round(load_s, 3), 'final_loss': round(final_loss, 5)}
    if dev.type == 'cuda':
        prop = torch.cuda.get_device_properties(dev)
        res.update({'multiprocessors': prop.multi_processor_count,
                    'capability': f'{prop.major}.{prop.minor}',
                    'gpu_memory_bytes': prop.total_memory,
                    'max_memory_allocated_bytes': torch.cuda.max_memory_allocated(dev)})
    print(json.dumps(res), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
