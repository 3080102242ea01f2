#!/usr/bin/env python3
"""PyTorch peer of `pipetrain train`: the same network, built from the same models/*.cfg
file, trained on the same files (Fashion-MNIST's, or a user's named by --train-images and
--train-labels, IDX3 or IDX4 as pipetrain reads them) with the same optimizer, batch and
threads, so that pipetrain's figures can be compared with PyTorch's in one run on one
machine.

Modes
  throughput  --warmup steps, then --steps timed training steps. The data set is read,
              converted and shuffled before; each batch is a slice of it, so the timed
              steps hold no data loading.
  accuracy    --epochs epochs, reshuffled each epoch (full batches only, as pipetrain),
              test accuracy after the epochs listed in --eval-at.

The last line of stdout is one JSON object (samples_per_s, params, the BLAS core and thread
counts, the environment, and other_cpu_frac: the share of the machine other processes used
during the timed window; above 0.05 the figure is suspect). Progress goes to stderr.

Threads: OMP_NUM_THREADS (PyTorch's pool, oneDNN) and OPENBLAS_NUM_THREADS are set before
torch is imported, because torch.set_num_threads does not limit OpenBLAS. With 2 threads
on 2 cores give --blas-threads 1: two spinning pools fight over the cores.

Needs PyTorch: on Debian `apt-get install python3-torch`, which installs it for
/usr/bin/python3 (this script re-runs itself there when the python3 running it lacks torch).

    /usr/bin/python3 experiments/torch_peer.py --model models/seed-cnn.cfg --threads 2 --blas-threads 1
"""
import argparse
import gzip
import json
import os
import resource
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interpreter  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = '/usr/share/datasets/fashion-mnist'
# environment variables that change the speed of either side; recorded with every result
ENV_KEYS = ('OPENBLAS_CORETYPE', 'OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS',
            'MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_',
            'GLIBC_TUNABLES', 'LD_PRELOAD', 'OMP_WAIT_POLICY', 'OMP_PROC_BIND')


# ---------------------------------------------------------------- model files (models/*.cfg)
def read_cfg(path):
    """[(section, {key: value}, line)] of a pipetrain model file. pipetrain's own reader
    (src/model/net.c) checks the file; this one only reads what a checked file holds."""
    sections = []
    with open(path, encoding='utf-8') as f:
        for n, raw in enumerate(f, 1):
            line = raw.split(';', 1)[0].strip()
            if not line or line.startswith('#'):
                continue
            if line.startswith('[') and line.endswith(']'):
                sections.append((line[1:-1].strip(), {}, n))
            elif '=' in line and sections:
                k, v = line.split('=', 1)
                sections[-1][1][k.strip()] = v.strip()
            else:
                raise SystemExit('%s:%d: cannot read %r' % (path, n, raw.rstrip()))
    if not sections or sections[0][0] != 'net':
        raise SystemExit('%s: the first section must be [net]' % path)
    return sections


def build_layers(path):
    """One torch module per layer of the model file, and each layer's output shape (C, H, W)
    or (F,). Same shapes and parameter count as pipetrain's network; PyTorch's own
    initialisation (speed does not depend on it)."""
    import torch.nn as nn
    acts = {'linear': None, 'relu': nn.ReLU, 'sigmoid': nn.Sigmoid, 'tanh': nn.Tanh}
    sections = read_cfg(path)
    shape = tuple(int(x) for x in sections[0][1]['input'].split(','))
    layers, shapes, kinds = [], [], []
    for kind, kv, line in sections[1:]:
        parts = []
        if kind == 'conv':
            c, h, w = shape
            k, s, p = int(kv['size']), int(kv.get('stride', 1)), int(kv.get('pad', 0))
            f = int(kv['filters'])
            parts.append(nn.Conv2d(c, f, k, stride=s, padding=p))
            shape = (f, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)
        elif kind in ('maxpool', 'avgpool'):
            c, h, w = shape
            k = int(kv.get('size', 2))
            s = int(kv.get('stride', k))
            parts.append((nn.MaxPool2d if kind == 'maxpool' else nn.AvgPool2d)(k, stride=s))
            shape = (c, (h - k) // s + 1, (w - k) // s + 1)
        elif kind == 'dense':
            n_in = 1
            for d in shape:
                n_in *= d
            # a dense layer after a spatial one flattens implicitly (a view; free when flat)
            parts += [nn.Flatten(), nn.Linear(n_in, int(kv['units']))]
            shape = (int(kv['units']),)
        elif kind == 'dropout':
            parts.append(nn.Dropout(float(kv['p'])))
        elif kind == 'flatten':
            n = 1
            for d in shape:
                n *= d
            parts.append(nn.Flatten())
            shape = (n,)
        else:
            raise SystemExit('%s:%d: layer [%s] is not supported by this peer' % (path, line, kind))
        act = kv.get('activation', 'linear')
        if kind in ('conv', 'dense') and acts.get(act):
            parts.append(acts[act]())
        elif act not in acts:
            raise SystemExit('%s:%d: activation %s is not supported' % (path, line, act))
        layers.append(parts[0] if len(parts) == 1 else nn.Sequential(*parts))
        shapes.append(shape)
        kinds.append(kind)
    return layers, shapes, kinds


def make_optimizer(params, name, lr, momentum):
    import torch
    if name == 'sgd':
        return torch.optim.SGD(params, lr=lr)
    if name == 'momentum':
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    return torch.optim.Adam(params, lr=lr)


# ---------------------------------------------------------------- data
def read_idx(path, ranks):
    """An IDX file of unsigned bytes (gzip or plain) with one of `ranks` dimensions, as a
    uint8 tensor. pipetrain's reader (src/io/data.c) checks more; this one refuses what
    would otherwise train on the wrong data."""
    import torch
    try:
        with open(path, 'rb') as f:
            raw = f.read()
    except OSError as e:
        sys.exit('%s: cannot open: %s' % (path, e.strerror))
    if raw[:2] == b'\x1f\x8b':
        raw = gzip.decompress(raw)
    magic = struct.unpack('>I', raw[:4])[0] if len(raw) >= 4 else -1
    if magic >> 8 != 0x08 or magic & 0xFF not in ranks:
        sys.exit('%s: bad magic 0x%08x (expected %s)' % (
            path, magic & 0xFFFFFFFF, ' or '.join('0x%08x' % (0x800 + r) for r in ranks)))
    ndim = magic & 0xFF
    if len(raw) < 4 + 4 * ndim:
        sys.exit('%s: truncated: a %d-byte header, expected %d' % (path, len(raw), 4 + 4 * ndim))
    dims = struct.unpack('>%dI' % ndim, raw[4:4 + 4 * ndim])
    n = 1
    for d in dims:
        n *= d
    if len(raw) != 4 + 4 * ndim + n:
        sys.exit('%s: %d bytes after the header, expected %d' % (path, len(raw) - 4 - 4 * ndim, n))
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def check_data_args(args):
    """pipetrain train's rules: images and labels named in pairs, each pair instead of
    --data-dir's files; training files without test files leave no test set."""
    for split in ('train', 'test'):
        img, lab = getattr(args, split + '_images'), getattr(args, split + '_labels')
        if (img is None) != (lab is None):
            sys.exit('%s: --%s-images and --%s-labels go together' % (sys.argv[0], split, split))
        if img is not None and args.data_dir is not None:
            sys.exit('%s: --%s-images and --data-dir %s both name the %s data: give one'
                     % (sys.argv[0], split, args.data_dir,
                        'training' if split == 'train' else 'test'))
    if args.data_dir is None:
        args.data_dir = DATA_DIR
    if args.train_images is None and not os.path.isdir(args.data_dir):
        sys.exit('%s: no Fashion-MNIST at %s (Debian: apt-get install dataset-fashion-mnist)'
                 % (sys.argv[0], args.data_dir))


def data_paths(args, split):
    """The split's image and label files, or None when there is no such set."""
    img, lab = getattr(args, split + '_images'), getattr(args, split + '_labels')
    if img is not None:
        return img, lab
    if split == 'test' and args.train_images is not None:
        return None
    prefix = 'train' if split == 'train' else 't10k'
    # as pipetrain: NAME.gz when it exists, else NAME
    found = [(p + '.gz' if os.path.exists(p + '.gz') else p)
             for p in ('%s/%s-%s-ubyte' % (args.data_dir, prefix, kind)
                       for kind in ('images-idx3', 'labels-idx1'))]
    return found[0], found[1]


def load_data(args, split='train', images=True):
    """Images as float32 N×C×H×W in [0, 1] (as pipetrain reads them; IDX3 is one channel),
    labels as int64; (None, None) for a test set that is not there. Checked against the
    model file's input=C,H,W."""
    paths = data_paths(args, split)
    if paths is None:
        return None, None
    y = read_idx(paths[1], (1,)).long()
    if not images:
        return None, y
    x = read_idx(paths[0], (3, 4))
    if x.dim() == 3:
        x = x.unsqueeze(1)
    want = tuple(int(v) for v in read_cfg(args.model)[0][1]['input'].split(','))
    if tuple(x.shape[1:]) != want:
        sys.exit('%s: images are %s, the model takes %s' % (
            paths[0], '×'.join(map(str, x.shape[1:])), '×'.join(map(str, want))))
    if x.shape[0] != y.shape[0]:
        sys.exit('%s has %d samples but %s has %d' % (paths[0], x.shape[0], paths[1], y.shape[0]))
    return x.float().div_(255.0), y


# ---------------------------------------------------------------- measurement
def machine_busy_s():
    """CPU seconds the whole machine spent busy so far (/proc/stat)."""
    f = [int(x) for x in open('/proc/stat').readline().split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return (sum(f[:8]) - idle) / os.sysconf('SC_CLK_TCK')


def own_cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Window:
    """Wall time of a timed window, this process's CPU time in it, and the CPU time the
    rest of the machine used meanwhile (noise from other processes on a shared machine)."""

    def start(self):
        self.busy0, self.own0 = machine_busy_s(), own_cpu_s()
        self.faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.t0 = time.perf_counter()

    def stop(self):
        self.wall = time.perf_counter() - self.t0
        self.busy = machine_busy_s() - self.busy0
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults0
        self.set_own(own_cpu_s() - self.own0)
        return self.wall

    def set_own(self, own):
        """CPU seconds of the run itself: this process's, or all ranks' together."""
        self.own = own
        self.other = max(0.0, self.busy - own)

    def stats(self):
        return {'window_s': round(self.wall, 3), 'cpu_util': round(self.own / self.wall, 3),
                'other_cpu_frac': round(self.other / (os.cpu_count() * self.wall), 3),
                'minor_faults': self.faults}


def set_thread_env(threads, blas_threads):
    """Before torch is imported: OpenBLAS reads its thread count when it loads."""
    os.environ['OMP_NUM_THREADS'] = str(threads)
    os.environ['OPENBLAS_NUM_THREADS'] = str(blas_threads)
    os.environ['MKL_NUM_THREADS'] = str(blas_threads)


def runtime_info(threads):
    """PyTorch and the OpenBLAS it loaded: version, kernel set (core), thread counts."""
    import ctypes
    import torch
    torch.set_num_threads(threads)
    info = {'torch': torch.__version__, 'torch_threads': torch.get_num_threads(),
            'python': sys.executable}
    lib = next((ln.split()[-1] for ln in open('/proc/self/maps') if 'libopenblas' in ln), None)
    if lib:
        ob = ctypes.CDLL(lib)
        ob.openblas_get_corename.restype = ctypes.c_char_p
        info.update({'openblas': lib, 'openblas_core': ob.openblas_get_corename().decode(),
                     'openblas_threads': ob.openblas_get_num_threads()})
    info['env'] = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}
    return info


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def common_args(p):
    """Options shared with torch_pipe.py; names and defaults as pipetrain train's."""
    p.add_argument('--model', default=os.path.join(ROOT, 'models', 'seed-cnn.cfg'))
    p.add_argument('--batch', type=int, default=128, help='samples per optimizer step')
    p.add_argument('--optimizer', choices=['sgd', 'momentum', 'adam'], default='adam')
    p.add_argument('--lr', type=float, default=0.001)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--warmup', type=int, default=20, help='untimed steps first')
    p.add_argument('--steps', type=int, default=150, help='timed steps')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--data-dir', default=None,
                   help="Fashion-MNIST's files (default %s)" % DATA_DIR)
    p.add_argument('--train-images', metavar='FILE',
                   help='training images by name, IDX3 or IDX4, instead of --data-dir\'s')
    p.add_argument('--train-labels', metavar='FILE')
    p.add_argument('--test-images', metavar='FILE',
                   help='test images by name (--train-images without them: no test set)')
    p.add_argument('--test-labels', metavar='FILE')


# ---------------------------------------------------------------- main
def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p)
    p.add_argument('--mode', choices=['throughput', 'accuracy'], default='throughput')
    p.add_argument('--threads', type=int, default=1, help='PyTorch (OpenMP) threads')
    p.add_argument('--blas-threads', type=int, default=None,
                   help='OpenBLAS threads (default: --threads)')
    p.add_argument('--epochs', type=int, default=5, help='accuracy mode')
    p.add_argument('--eval-at', default='1,3,5', help='accuracy mode: epochs to evaluate after')
    args = p.parse_args()
    check_data_args(args)

    interpreter.ensure_modules(['torch'])
    set_thread_env(args.threads, args.blas_threads or args.threads)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    info = runtime_info(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    xtr, ytr = load_data(args, 'train')
    load_s = time.perf_counter() - t0
    layers, _, _ = build_layers(args.model)
    model = nn.Sequential(*layers)
    n_params = sum(q.numel() for q in model.parameters())
    opt = make_optimizer(model.parameters(), args.optimizer, args.lr, args.momentum)
    B = args.batch
    res = {'peer': 'pytorch', 'mode': args.mode, 'model': os.path.relpath(args.model, ROOT),
           'params': n_params, 'batch': B, 'optimizer': args.optimizer, 'lr': args.lr,
           'threads': args.threads, 'blas_threads': args.blas_threads or args.threads,
           'data_load_s': round(load_s, 3), **info}

    def step(xb, yb):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    model.train()
    if args.mode == 'throughput':
        g = torch.Generator().manual_seed(args.seed)
        perm = torch.randperm(xtr.shape[0], generator=g)
        xs, ys = xtr[perm].contiguous(), ytr[perm].contiguous()
        nb = xs.shape[0] // B
        win, times = Window(), []
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                win.start()
            j = i % nb
            a = time.perf_counter()
            loss = step(xs[j * B:(j + 1) * B], ys[j * B:(j + 1) * B])
            if i >= args.warmup:
                times.append(time.perf_counter() - a)
        wall = win.stop()
        res.update({'warmup': args.warmup, 'steps': args.steps, **win.stats(),
                    'samples_per_s': round(args.steps * B / wall, 2),
                    'step_ms_median': round(1e3 * median(times), 3),
                    'train_loss': round(loss.item(), 5)})
    else:
        xte, yte = load_data(args, 'test')
        eval_at = {int(e) for e in args.eval_at.split(',') if e} if xte is not None else set()
        g = torch.Generator().manual_seed(args.seed)
        N = xtr.shape[0]
        epochs = []
        for ep in range(1, args.epochs + 1):
            win = Window()
            win.start()
            perm = torch.randperm(N, generator=g)
            total = 0.0
            for k in range(0, N - B + 1, B):
                idx = perm[k:k + B]
                total += step(xtr[idx], ytr[idx]).item()
            wall = win.stop()
            e = {'epoch': ep, 'wall_s': round(wall, 2), 'samples_per_s': round(N // B * B / wall, 1),
                 'train_loss': round(total / (N // B), 5), 'other_cpu_frac': win.stats()['other_cpu_frac']}
            if ep in eval_at:
                model.eval()
                with torch.no_grad():
                    correct = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                                  for i in range(0, xte.shape[0], 1000))
                model.train()
                e['test_acc'] = round(correct / xte.shape[0], 4)
            epochs.append(e)
            print(json.dumps(e), file=sys.stderr, flush=True)
        res['epochs'] = epochs
        res['test_acc'] = {str(e['epoch']): e['test_acc'] for e in epochs if 'test_acc' in e}
    res['peak_rss_mb'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(res), flush=True)


if __name__ == '__main__':
    main()
