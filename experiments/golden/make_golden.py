#!/usr/bin/python3
"""Writes tests/golden/*.bin: PyTorch 1.13 reference values for the CPU kernels.

Needs PyTorch (Debian: apt-get install python3-torch, for /usr/bin/python3; run under another
python3 it runs itself again under /usr/bin/python3):  python3 experiments/golden/make_golden.py
The files are committed; the tests (tests/test_golden.c) read them and never need torch.

File format (little-endian):
    magic   4 bytes  b"PTGD"
    version u32      1
    count   u32      number of arrays
    count × { name_len u32, name (UTF-8, no NUL), dtype u32 (0 float32, 1 int32),
              ndim u32, dims u32 × ndim, data (4 bytes × product of dims) }
    check   u32      FNV-1a (32-bit) of every byte before it
"""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import interpreter  # noqa: E402  (experiments/interpreter.py)

interpreter.ensure_modules(["torch", "numpy"])
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MAGIC = b"PTGD"
VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "..", "..", "tests", "golden")


def fnv1a32(data):
    h = 0x811C9DC5
    for byte in data:
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def write_golden(name, arrays):
    """arrays: list of (name, tensor); float tensors are stored as float32, integer as int32."""
    body = bytearray(MAGIC + struct.pack("<II", VERSION, len(arrays)))
    for key, t in arrays:
        t = t.detach().contiguous()
        if t.is_floating_point():
            dtype, data = 0, t.to(torch.float32).numpy().astype("<f4").tobytes()
        else:
            dtype, data = 1, t.to(torch.int32).numpy().astype("<i4").tobytes()
        kb = key.encode()
        body += struct.pack("<I", len(kb)) + kb
        body += struct.pack("<II", dtype, t.dim()) + struct.pack("<%dI" % t.dim(), *t.shape)
        body += data
    body += struct.pack("<I", fnv1a32(body))
    path = os.path.join(OUT_DIR, name)
    with open(path, "wb") as f:
        f.write(body)
    print("%-12s %6d bytes, %d arrays" % (name, len(body), len(arrays)))


def leaf(t):
    return t.clone().requires_grad_(True)


def golden_dense():
    n, in_f, out_f = 6, 9, 5
    x, w, b = leaf(torch.randn(n, in_f)), leaf(torch.randn(out_f, in_f) * 0.3), leaf(torch.randn(out_f))
    y = F.linear(x, w, b)
    r = torch.randn(n, out_f)
    (y * r).sum().backward()
    write_golden("dense.bin", [
        ("dims", torch.tensor([n, in_f, out_f])), ("in", x), ("w", w), ("b", b), ("out", y),
        ("dout", r), ("din", x.grad), ("dw", w.grad), ("db", b.grad)])


CONV_CASES = [
    # name, n, c, h, w, filters, size, stride, pad
    ("a", 2, 3, 7, 6, 4, 3, 1, 0),
    ("b", 2, 2, 9, 8, 3, 3, 2, 1),
    ("c", 1, 4, 6, 5, 5, 5, 1, 2),
]


def golden_conv():
    arrays = []
    for name, n, c, h, w, f, k, s, p in CONV_CASES:
        x = leaf(torch.randn(n, c, h, w))
        wt = leaf(torch.randn(f, c, k, k) * 0.2)
        b = leaf(torch.randn(f))
        y = F.conv2d(x, wt, b, stride=s, padding=p)
        r = torch.randn(y.shape)
        (y * r).sum().backward()
        arrays += [(name + ".dims", torch.tensor([n, c, h, w, f, k, s, p])), (name + ".in", x),
                   (name + ".w", wt), (name + ".b", b), (name + ".out", y), (name + ".dout", r),
                   (name + ".din", x.grad), (name + ".dw", wt.grad), (name + ".db", b.grad)]
    write_golden("conv.bin", arrays)


POOL_CASES = [
    # name, kind, n, c, h, w, size, stride
    ("max2", "max", 2, 3, 7, 6, 2, 2),
    ("max3", "max", 2, 2, 9, 8, 3, 2),
    ("avg2", "avg", 2, 3, 7, 6, 2, 2),
    ("avg3", "avg", 1, 2, 9, 7, 3, 2),
]


def golden_pool():
    arrays = []
    for name, kind, n, c, h, w, k, s in POOL_CASES:
        # Quarter-integers in a small range: many exact ties, so "first maximum wins" is tested.
        x = leaf(torch.randint(-4, 5, (n, c, h, w)).float() / 4)
        if kind == "max":
            y, idx = F.max_pool2d(x, k, s, return_indices=True)
        else:
            y, idx = F.avg_pool2d(x, k, s), None
        r = torch.randn(y.shape)
        (y * r).sum().backward()
        arrays += [(name + ".dims", torch.tensor([n, c, h, w, k, s])), (name + ".in", x),
                   (name + ".out", y), (name + ".dout", r), (name + ".din", x.grad)]
        if idx is not None:
            arrays.append((name + ".argmax", idx))
    write_golden("pool.bin", arrays)


def golden_activation():
    special = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6, 1e-3, -1e-3, 0.5, -0.5, 0.625,
                            -0.625, 1.0, -1.0, 9.0, -9.0, 15.0, -15.0, 20.0, -20.0, 40.0, -40.0,
                            87.0, -87.0, 90.0, -90.0, 200.0, -200.0, 1e30, -1e30])
    x = torch.cat([special, torch.randn(120) * 4, torch.linspace(-12, 12, 97)])
    arrays = [("x", x)]
    r = torch.randn(x.shape)
    arrays.append(("dout", r))
    for name, fn in (("relu", torch.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh)):
        xl = leaf(x)
        y = fn(xl)
        (y * r).sum().backward()
        arrays += [(name + ".out", y), (name + ".din", xl.grad)]
    write_golden("act.bin", arrays)


def golden_xent():
    n, classes, whole_batch = 6, 10, 16
    logits = torch.randn(n, classes) * 3
    logits[1] += 80.0  # large logits: only a max-subtracting softmax survives them
    logits[2, 4] = 60.0
    labels = torch.tensor([3, 0, 4, 9, 4, 1])
    lg = leaf(logits)
    loss = F.cross_entropy(lg, labels, reduction="sum")
    # grad_scale 1/16: these 6 samples are a micro-batch of a batch of 16 averaged over.
    (loss / whole_batch).backward()
    loss64 = F.cross_entropy(logits.double(), labels, reduction="sum")
    correct = (logits.argmax(1) == labels).sum()
    write_golden("xent.bin", [
        ("dims", torch.tensor([n, classes, whole_batch])), ("logits", logits), ("labels", labels),
        ("loss", loss.detach().reshape(1)), ("loss64_hi_lo", split_double(loss64.item())),
        ("dlogits", lg.grad), ("correct", correct.reshape(1))])


def split_double(v):
    """A double as two float32s (hi + lo) so the file format stays float32-only."""
    hi = torch.tensor([v], dtype=torch.float32)
    lo = torch.tensor([v - hi.double().item()], dtype=torch.float32)
    return torch.cat([hi, lo])


OPTIM_CASES = [
    # name, kind, hyper-parameters (stored as float32 in this order)
    ("sgd", "sgd", dict(lr=0.1)),
    ("sgd_wd", "sgd", dict(lr=0.05, weight_decay=0.01)),
    ("momentum", "sgd", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("adam", "adam", dict(lr=1e-3)),
    ("adam_wd", "adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
]
STEPS = 5


def golden_optim():
    count = 37
    p0 = torch.randn(count)
    # Gradients of mixed scales, so that Adam's sqrt(v) and eps both matter.
    grads = torch.randn(STEPS, count) * torch.logspace(-4, 1, count)
    arrays = [("p0", p0), ("grads", grads)]
    for name, kind, hp in OPTIM_CASES:
        p = torch.nn.Parameter(p0.clone())
        if kind == "sgd":
            opt = torch.optim.SGD([p], **hp)
            hyper = [hp["lr"], hp.get("momentum", 0.0), hp.get("weight_decay", 0.0)]
        else:
            opt = torch.optim.Adam([p], **hp)
            b1, b2 = hp.get("betas", (0.9, 0.999))
            hyper = [hp["lr"], b1, b2, hp.get("eps", 1e-8), hp.get("weight_decay", 0.0)]
        history = []
        for t in range(STEPS):
            p.grad = grads[t].clone()
            opt.step()
            history.append(p.detach().clone())
        arrays += [(name + ".hyper", torch.tensor(hyper, dtype=torch.float32)),
                   (name + ".params", torch.stack(history))]
        state = opt.state[p]
        if kind == "sgd" and hp.get("momentum", 0.0) != 0.0:
            arrays.append((name + ".buf", state["momentum_buffer"]))
        if kind == "adam":
            arrays += [(name + ".m", state["exp_avg"]), (name + ".v", state["exp_avg_sq"])]
    write_golden("optim.bin", arrays)


def main():
    if not torch.__version__.startswith("1.13"):
        print("warning: torch %s, the golden values are defined by 1.13" % torch.__version__,
              file=sys.stderr)
    torch.manual_seed(20240601)
    torch.set_num_threads(1)
    os.makedirs(OUT_DIR, exist_ok=True)
    golden_dense()
    golden_conv()
    golden_pool()
    golden_activation()
    golden_xent()
    golden_optim()


if __name__ == "__main__":
    main()
