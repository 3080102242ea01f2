#!/usr/bin/env python3
"""PyTorch peer of `pipetrain train` for language models, for throughput: the GPT of the
same model file (experiments/gpt_torch.py builds it with pipetrain's layout), trained with
the same optimizer, batch and threads on byte windows of the same corpus, so that
experiments/bench_gpt.py can compare the two in one run on one machine.

Windows are drawn as pipetrain draws them (gpt_torch.text_batch) before the timed steps,
so the timed loop holds no data work. The last line of stdout is one JSON object:
samples_per_s (sequences), tokens_per_s, params (distinct), threads, BLAS threads, and
other_cpu_frac (the share of the machine other processes used while timing).

Threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are set before torch is imported
(torch.set_num_threads does not limit OpenBLAS).

    /usr/bin/python3 experiments/gpt_peer.py --model models/gpt-mini.cfg --batch 8 --threads 1
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import interpreter  # noqa: E402

FORTUNES = ['/usr/share/games/fortunes/%s' % f for f in ('fortunes', 'literature', 'riddles')]


def corpus_bytes():
    """Debian's fortunes as pipetrain's built-in corpus reads them (entries without their
    '%' lines), or random bytes when the package is missing (speed does not depend on it)."""
    data = bytearray()
    for path in FORTUNES:
        try:
            with open(path, 'rb') as f:
                for line in f:
                    if line.rstrip(b'\n') != b'%':
                        data += line
        except OSError:
            return None
    return bytes(data)


def busy_s():
    f = [int(x) for x in open('/proc/stat').readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf('SC_CLK_TCK')


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', required=True)
    p.add_argument('--batch', type=int, default=8, help='sequences per step')
    p.add_argument('--optimizer', choices=['sgd', 'adamw'], default='adamw')
    p.add_argument('--lr', type=float, default=1e-3)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--blas-threads', type=int, default=1)
    p.add_argument('--untimed-steps', type=int, default=2)
    p.add_argument('--steps', type=int, default=5, help='timed steps')
    p.add_argument('--seed', type=int, default=1)
    a = p.parse_args()
    os.environ['OMP_NUM_THREADS'] = str(a.threads)
    os.environ['OPENBLAS_NUM_THREADS'] = str(a.blas_threads)
    interpreter.ensure_modules(['torch'])
    import torch
    import torch.nn.functional as F
    import gpt_torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    model = gpt_torch.build(a.model)
    spec = gpt_torch.model_spec(a.model)
    T, V = spec[0][1]['context'], spec[0][1]['vocab']
    with torch.no_grad():  # GPT-2's σ; speed does not depend on the values
        for q in model.parameters():
            q.normal_(0.0, 0.02) if q.dim() > 1 else q.zero_()
    decay, no_decay = model.decay_groups()
    if a.optimizer == 'adamw':
        opt = torch.optim.AdamW([{'params': decay, 'weight_decay': 0.01},
                                 {'params': no_decay, 'weight_decay': 0.0}], lr=a.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    text = corpus_bytes()
    steps = a.untimed_steps + a.steps
    batches, toks = [], list(text) if text is not None else None
    for s in range(steps):
        if toks is None:
            w = torch.randint(0, V, (a.batch, T + 1))
            batches.append((w[:, :T].contiguous(), w[:, 1:].contiguous()))
        else:
            xs, ys = gpt_torch.text_batch(toks, T, a.seed, s, a.batch)
            batches.append((torch.tensor(xs), torch.tensor(ys)))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    for s in range(a.untimed_steps):
        step(*batches[s])
    b0, t0 = busy_s(), time.perf_counter()
    r0 = os.times()
    for s in range(a.untimed_steps, steps):
        loss = step(*batches[s])
    wall = time.perf_counter() - t0
    r1 = os.times()
    own = (r1.user - r0.user) + (r1.system - r0.system)
    other = max(0.0, busy_s() - b0 - own) / (os.cpu_count() * wall)
    print(json.dumps({
        'samples_per_s': a.steps * a.batch / wall, 'tokens_per_s': a.steps * a.batch * T / wall,
        'params': sum(q.numel() for q in {id(q): q for q in model.parameters()}.values()),
        'threads': a.threads, 'blas_threads': a.blas_threads, 'loss': float(loss),
        'other_cpu_frac': round(other, 3), 'torch': torch.__version__}))


if __name__ == '__main__':
    main()
