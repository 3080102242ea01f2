"""CPU against GPU: the same model and batches on this machine's cores and on its GPU,
where it has one (a GPU machine: see experiments/cuda/)."""
import json
import subprocess

from . import common

TITLE = 'CPU against GPU'
BATCHES = [32, 128, 1024]


def gpu_reason(ctx):
    """None when a CUDA GPU is usable here, else why not (pipetrain devices)."""
    r = subprocess.run([ctx.pipetrain, 'devices', '--json'], capture_output=True, text=True)
    try:
        cuda = json.loads(r.stdout)['cuda']
    except (ValueError, KeyError):
        return 'pipetrain devices failed: %s' % r.stderr.strip()[-300:]
    return None if cuda.get('available') else cuda.get('reason') or 'no CUDA device'


def run(ctx):
    why = gpu_reason(ctx)
    if why:
        return ('Not measured on this machine: %s. Run `python3 experiments/study.py cpu-gpu` '
                'on a machine with an NVIDIA GPU (experiments/cuda/README.md).\n' % why)
    steps, warmup, samples = common.sizes(ctx.quick, (40, 5, 60000), (3, 1, 2048))
    rows = []
    for model in ('models/seed-cnn.cfg', 'models/seed-mlp.cfg'):
        for b in BATCHES:
            rate = {}
            for dev in ('cpu', 'cuda'):
                r = ctx.train('%s batch %d %s' % (model, b, dev),
                              ['--model', model, '--batch', b, '--device', dev, '--steps',
                               steps + warmup, '--untimed-steps', warmup, '--train-samples', samples,
                               '--test-samples', 0], 1)
                rate[dev] = r['samples_per_s']
            rows.append([model, b, rate['cpu'], rate['cuda'], rate['cuda'] / rate['cpu']])
    return common.table(['model', 'batch', 'CPU samples/s (all cores)', 'GPU samples/s',
                         'GPU / CPU'], rows)
