#!/usr/bin/python3
"""Writes tests/golden/*.bin: PyTorch 1.13 reference values for the CPU kernels.

Needs PyTorch (Debian: apt-get install python3-torch, for /usr/bin/python3; run under another
python3 it runs itself again under /usr/bin/python3):
    python3 experiments/golden/make_golden.py [FILE.bin ...]   (default: every file)
The files are committed; the tests (tests/test_golden.c, tests/test_golden_transformer.c)
read them and never need torch. Each file comes out the same whether it is written alone or
with the others (transformer.bin seeds its own generator; the older files share one
sequence, so they are always written together).

File format (little-endian):
    magic   4 bytes  b"PTGD"
    version u32      1
    count   u32      number of arrays
    count × { name_len u32, name (UTF-8, no NUL), dtype u32 (0 float32, 1 int32),
              ndim u32, dims u32 × ndim, data (4 bytes × product of dims) }
    check   u32      FNV-1a (32-bit) of every byte before it
"""
import math
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


def f64(t):
    """Rounded to float32 first, then double: the stored inputs are exactly what torch used."""
    return t.float().double()


def golden_layernorm():
    rows, width = 5, 37  # 37: two blocks of 16 partial sums and a tail
    x = leaf(f64(torch.randn(rows, width) * 2 + 1.5))
    gamma, beta = leaf(f64(1 + 0.3 * torch.randn(width))), leaf(f64(0.5 * torch.randn(width)))
    y, mean, rstd = torch.native_layer_norm(x, [width], gamma, beta, 1e-5)
    dy = f64(torch.randn(rows, width))
    (y * dy).sum().backward()
    return [("ln.dims", torch.tensor([rows, width])), ("ln.x", x), ("ln.gamma", gamma),
            ("ln.beta", beta), ("ln.out", y), ("ln.mean", mean.reshape(rows)),
            ("ln.rstd", rstd.reshape(rows)), ("ln.dout", dy), ("ln.dx", x.grad),
            ("ln.dgamma", gamma.grad), ("ln.dbeta", beta.grad)]


def golden_gelu():
    special = torch.tensor([0.0, -0.0, 1e-6, -1e-6, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 5.0, -5.0,
                            10.0, -10.0, 30.0, -30.0])
    x = leaf(f64(torch.cat([special, torch.randn(100) * 3, torch.linspace(-8, 8, 65)])))
    y = F.gelu(x, approximate="tanh")
    dy = f64(torch.randn(x.shape))
    (y * dy).sum().backward()
    return [("gelu.x", x), ("gelu.out", y), ("gelu.dout", dy), ("gelu.din", x.grad)]


ATTENTION_CASES = [("a", 2, 5, 3, 4), ("b", 1, 70, 2, 8)]  # name, batch, seq, heads, head_dim


def golden_attention():
    """GPT-2's explicit causal attention (torch 1.13 has no scaled_dot_product_attention)."""
    arrays = []
    for name, b, t, h, d in ATTENTION_CASES:
        q, k, v = (leaf(f64(torch.randn(b * t, h * d))) for _ in range(3))
        heads = lambda z: z.view(b, t, h, d).transpose(1, 2)  # noqa: E731
        att = (heads(q) @ heads(k).transpose(-2, -1)) * (1.0 / math.sqrt(d))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ heads(v)).transpose(1, 2).contiguous().view(b * t, h * d)
        dy = f64(torch.randn(y.shape))
        (y * dy).sum().backward()
        arrays += [("attn.%s.%s" % (name, key), val) for key, val in (
            ("dims", torch.tensor([b, t, h, d])), ("q", q), ("k", k), ("v", v), ("out", y),
            ("dout", dy), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))]
        if t < 10:  # the probabilities of the small case only (the file stays small)
            arrays.append(("attn.%s.probs" % name, att))
    return arrays


def golden_embedding():
    b, t, width, vocab, ctx = 2, 5, 6, 11, 8
    tokens = torch.randint(0, vocab, (b * t,), dtype=torch.int32)
    tokens[7] = tokens[2]  # a repeated token (its gradient rows add)
    wte, wpe = leaf(f64(torch.randn(vocab, width))), leaf(f64(torch.randn(ctx, width)))
    pos = torch.arange(t).repeat(b)
    y = F.embedding(tokens.long(), wte) + F.embedding(pos, wpe)
    dy = f64(torch.randn(y.shape))
    (y * dy).sum().backward()
    return [("emb.dims", torch.tensor([b, t, width, vocab, ctx])), ("emb.tokens", tokens),
            ("emb.wte", wte), ("emb.wpe", wpe), ("emb.out", y), ("emb.dout", dy),
            ("emb.dwte", wte.grad), ("emb.dwpe", wpe.grad)]


def golden_lm_xent():
    n, vocab = 6, 300  # batch 2 × seq 3 positions
    logits = torch.randn(n, vocab) * 3
    logits[1] += 50.0
    lg = leaf(f64(logits))
    targets = torch.randint(0, vocab, (n,), dtype=torch.int32)
    loss = F.cross_entropy(lg, targets.long())  # the mean over positions
    loss.backward()
    return [("xent.dims", torch.tensor([n, vocab])), ("xent.logits", lg),
            ("xent.targets", targets), ("xent.loss_hi_lo", split_double(loss.item())),
            ("xent.dlogits", lg.grad)]


ADAMW_STEPS = 3


def golden_adamw():
    """In float32, as training runs it: the optimizer's own roundings are what is reproduced."""
    count = 37
    p0 = torch.randn(count)
    grads = torch.randn(ADAMW_STEPS, count) * torch.logspace(-4, 1, count)
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([p], **hp)
    history = []
    for step in range(ADAMW_STEPS):
        p.grad = grads[step].clone()
        opt.step()
        history.append(p.detach().clone())
    state = opt.state[p]
    hyper = [hp["lr"], hp["betas"][0], hp["betas"][1], hp["eps"], hp["weight_decay"]]
    return [("adamw.p0", p0), ("adamw.grads", grads),
            ("adamw.hyper", torch.tensor(hyper, dtype=torch.float32)),
            ("adamw.params", torch.stack(history)), ("adamw.m", state["exp_avg"]),
            ("adamw.v", state["exp_avg_sq"])]


def golden_transformer():
    """GPT-2's kernels, computed in float64 from float32 inputs (AdamW in float32)."""
    torch.manual_seed(20240624)
    write_golden("transformer.bin", golden_layernorm() + golden_gelu() + golden_attention() +
                 golden_embedding() + golden_lm_xent() + golden_adamw())


def write_original():
    """The first six files, from one generator sequence in this order."""
    torch.manual_seed(20240601)
    golden_dense()
    golden_conv()
    golden_pool()
    golden_activation()
    golden_xent()
    golden_optim()


WRITERS = {"original": write_original, "transformer.bin": golden_transformer}
ORIGINAL = ("dense.bin", "conv.bin", "pool.bin", "act.bin", "xent.bin", "optim.bin")


def main():
    if not torch.__version__.startswith("1.13"):
        print("warning: torch %s, the golden values are defined by 1.13" % torch.__version__,
              file=sys.stderr)
    torch.set_num_threads(1)
    os.makedirs(OUT_DIR, exist_ok=True)
    wanted = sys.argv[1:] or ["original", "transformer.bin"]
    for name in wanted:
        if name in ORIGINAL:
            name = "original"
        if name not in WRITERS:
            sys.exit("make_golden.py: unknown file %s (known: %s)" %
                     (name, ", ".join(ORIGINAL + ("transformer.bin",))))
    for name in dict.fromkeys("original" if n in ORIGINAL else n for n in wanted):
        WRITERS[name]()


if __name__ == "__main__":
    main()
