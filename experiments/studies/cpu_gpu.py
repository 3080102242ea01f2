"""CPU against GPU: the same model and batches on a machine's cores and on its GPU.

Where this machine has a usable CUDA GPU, the study measures here (seed-cnn and seed-mlp,
batches 32, 128 and 1024, pipetrain on every core and on the GPU) and records the runs as
every study does. Runs measured on other machines are kept in git under
results/recorded/cpu-gpu/, one file per session (experiments/cuda/validate.sh writes them
on a lent GPU machine: experiments/cuda/README.md); the study tabulates and draws them
too, always labelled with the machine and the date they were measured on. On a machine
without a GPU they are all it has."""
import json
import os
import statistics
import subprocess

from . import common

TITLE = 'CPU against GPU'
BATCHES = [32, 128, 1024]
# a recorded run's tool: how the table and the figure name it
TOOLS = {'pipetrain': 'pipetrain', 'torch': 'PyTorch eager', 'torch_compile': 'torch.compile'}
COLORS = {('pipetrain', 'cuda'): 'C0', ('torch', 'cuda'): 'C1', ('torch_compile', 'cuda'): 'C2',
          ('pipetrain', 'cpu'): 'C3'}


def gpu_here(ctx):
    """(None, GPU name) when a CUDA GPU is usable here, else (why not, None)."""
    r = subprocess.run([ctx.pipetrain, 'devices', '--json'], capture_output=True, text=True)
    try:
        cuda = json.loads(r.stdout)['cuda']
    except (ValueError, KeyError):
        return 'pipetrain devices failed: %s' % r.stderr.strip()[-300:], None
    if not cuda.get('available'):
        return cuda.get('reason') or 'no CUDA device', None
    return None, ((cuda.get('devices') or [{}])[0].get('name') or 'a CUDA GPU')


def measure(ctx, gpu):
    """pipetrain on every core and on the GPU of this machine; the table and the points."""
    steps, warmup, samples = common.sizes(ctx.quick, (40, 5, 60000), (1, 1, 2048))
    rows, pts = [], []
    source = ('measured on this machine: %s, %s (%d cores)' % (gpu, ctx.machine['cpu'] or 'CPU',
                                                               ctx.cores),
              None)
    for model in ('models/seed-cnn.cfg', 'models/seed-mlp.cfg'):
        name = model.split('/')[-1][:-len('.cfg')]
        for b in BATCHES:
            rate = {}
            for dev in ('cpu', 'cuda'):
                r = ctx.train('%s batch %d %s' % (name, b, dev),
                              ['--model', model, '--batch', b, '--device', dev, '--steps',
                               steps + warmup, '--untimed-steps', warmup, '--train-samples', samples,
                               '--test-samples', 0], 1)
                rate[dev] = r['samples_per_s']
                pts.append({'source': source, 'model': name, 'batch': b, 'tool': 'pipetrain',
                            'device': dev, 'series': series_name('pipetrain', dev, ctx.cores),
                            'median': rate[dev], 'min': None, 'max': None, 'runs': 1})
            rows.append([name, b, rate['cpu'], rate['cuda'],
                         rate['cuda'] / rate['cpu'] if rate['cpu'] else None])
    md = ('Measured on this machine: %s, %s, %d cores; one run each, %d timed steps after %d.\n\n'
          % (gpu, ctx.machine['cpu'] or 'CPU', ctx.cores, steps, warmup))
    md += common.table(['model', 'batch', 'CPU samples/s (all cores)', 'GPU samples/s',
                        'GPU / CPU'], rows)
    return md, pts


def series_name(tool, device, cores=None):
    where = 'GPU' if device == 'cuda' else ('CPU, %d cores' % cores if cores else 'CPU')
    return '%s, %s' % (TOOLS.get(tool, tool), where)


def recorded_points(recs):
    """The recorded runs summed up per session, model, tool, device and batch: the median
    with min and max over single runs, or a record's own summary_of_runs."""
    groups = {}
    for r in recs:
        src = (r['recorded']['machine'], r['recorded']['date'])
        res = r['result']
        try:
            int(res['batch']), float(res['samples_per_s'])
        except (KeyError, TypeError, ValueError):
            raise common.StudyError('%s: a recorded run (%s) without its batch and samples_per_s'
                                    % (r['file'], r['label']))
        dev = r.get('device') or res.get('device', 'cuda')
        model = r.get('model') or res.get('model', '?').split('/')[-1].replace('.cfg', '')
        key = (src, model, r.get('tool', 'pipetrain'), dev, int(res['batch']))
        groups.setdefault(key, []).append(r)
    pts = []
    for (src, model, tool, dev, batch), rs in sorted(groups.items(), key=lambda kv: kv[0]):
        if len(rs) == 1 and rs[0].get('summary_of_runs'):
            s = rs[0]['summary_of_runs']
            med, lo, hi, n = s['median'], s.get('min'), s.get('max'), s.get('runs', 1)
        else:
            v = [float(r['result']['samples_per_s']) for r in rs]
            med, lo, hi, n = statistics.median(v), min(v), max(v), len(v)
        cores = rs[0]['machine'].get('cores') if dev == 'cpu' else None
        pts.append({'source': src, 'model': model, 'batch': batch, 'tool': tool, 'device': dev,
                    'series': series_name(tool, dev, cores), 'median': med,
                    'min': lo if n > 1 else None, 'max': hi if n > 1 else None, 'runs': n,
                    'record': rs[0]})
    return pts


def recorded_table(src, pts):
    """The markdown of one recorded session: where and when, then one row per model and
    batch with each run's samples/s, and the ratios the session allows."""
    first = pts[0]['record']
    m, rec = first['machine'], first['recorded']
    md = ('**Measured elsewhere, not on this machine:** %s — %s, %s, %s cores — on %s, by %s; '
          'recorded in `%s`.%s\n\n'
          % (rec['machine'], m.get('gpu') or 'GPU not recorded', m.get('cpu') or 'CPU not recorded',
             m.get('cores', '?'), rec['date'], rec.get('by', '?'), first['file'],
             ' ' + rec['note'] if rec.get('note') else ''))
    order = list(COLORS)
    kinds = sorted({(p['tool'], p['device']) for p in pts},
                   key=lambda k: order.index(k) if k in order else len(order))
    names = {k: [p['series'] for p in pts if (p['tool'], p['device']) == k][0] for k in kinds}
    ratios = [('pipetrain / PyTorch eager (GPU)', ('pipetrain', 'cuda'), ('torch', 'cuda')),
              ('pipetrain GPU / CPU', ('pipetrain', 'cuda'), ('pipetrain', 'cpu'))]
    ratios = [r for r in ratios if r[1] in kinds and r[2] in kinds]
    rows = []
    for model, batch in sorted({(p['model'], p['batch']) for p in pts}):
        at = {(p['tool'], p['device']): p for p in pts
              if p['model'] == model and p['batch'] == batch}
        row = [model, batch]
        for k in kinds:
            p = at.get(k)
            row.append(cell(p) if p else None)
        for _, a, b in ratios:
            row.append(at[a]['median'] / at[b]['median'] if a in at and b in at else None)
        rows.append(row)
    md += common.table(['model', 'batch'] + ['%s, samples/s' % names[k] for k in kinds]
                       + [r[0] for r in ratios], rows)
    md += ('\nsamples/s: the median [min–max] of the runs, with their number; ratios of the '
           'medians.\n')
    if ('pipetrain', 'cpu') not in kinds:
        md += ('No CPU run was recorded in this session, so it compares pipetrain on the GPU '
               'with PyTorch on the same GPU, not the CPU with the GPU; this machine\'s CPU '
               'figures are not comparable with another machine\'s GPU.\n')
    return md


def cell(p):
    """118,495 [113,870–127,172], 3 runs"""
    if p['min'] is None:
        return '{:,.0f}, {} run{}'.format(p['median'], p['runs'], '' if p['runs'] == 1 else 's')
    return '{:,.0f} [{:,.0f}–{:,.0f}], {} runs'.format(p['median'], p['min'], p['max'], p['runs'])


def run(ctx):
    why, gpu = gpu_here(ctx)
    md, panels = '', []
    if why is None:
        here, pts = measure(ctx, gpu)
        md += here
        panels.append(pts)
    else:
        md += ('Not measured on this machine: %s. `python3 experiments/study.py cpu-gpu` measures '
               'on a machine with an NVIDIA GPU; the runs below were measured on another machine '
               'and recorded (experiments/cuda/README.md says how a GPU run is recorded).\n'
               % why)
    rec = recorded_points(common.recorded('cpu-gpu', ctx.recorded_dir))
    for src in sorted({p['source'] for p in rec}, key=lambda s: (s[1], s[0])):
        pts = [p for p in rec if p['source'] == src]
        md += '\n' + recorded_table(src, pts)
        panels.append(pts)
    if not panels:
        return md + ('\nNo runs were recorded from another machine either (%s).\n'
                     % os.path.join(ctx.recorded_dir, 'cpu-gpu'))
    if ctx.plot:
        md += ('\n![samples/s on the CPU and the GPU; each panel names the machine and date it '
               'was measured on](%s)\n' % draw(ctx, panels))
    return md


def panel_title(p):
    if p['source'][1] is None:
        return '%s\n%s' % (p['model'], p['source'][0])
    m = p['record']['machine']
    return ('%s — measured elsewhere, not on this machine:\n%s (%s), %s'
            % (p['model'], p['source'][0].split(' (')[0], m.get('gpu') or 'GPU', p['source'][1]))


def draw(ctx, panels):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (the axis formatter)
    # one panel per session and model
    axes_pts = []
    for pts in panels:
        for model in sorted({p['model'] for p in pts}):
            axes_pts.append([p for p in pts if p['model'] == model])
    n = len(axes_pts)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.6 * rows), squeeze=False,
                             constrained_layout=True)
    handles = {}
    for ax, pts in zip(axes.flat, axes_pts):
        batches = sorted({p['batch'] for p in pts})
        order = list(COLORS)  # pipetrain GPU, PyTorch eager, torch.compile, pipetrain CPU
        series = sorted(dict.fromkeys(p['series'] for p in pts), key=lambda s: min(
            order.index((p['tool'], p['device'])) if (p['tool'], p['device']) in order
            else len(order) for p in pts if p['series'] == s))
        width = 0.8 / len(series)
        for i, s in enumerate(series):
            xs, ys, tops = [], [], []
            for j, b in enumerate(batches):
                q = [p for p in pts if p['series'] == s and p['batch'] == b]
                if not q:
                    continue
                q = q[0]
                x = j - 0.4 + width * (i + 0.5)
                xs.append(x)
                ys.append(q['median'])
                tops.append(q['max'] if q['max'] is not None else q['median'])
                if q['min'] is not None:  # the spread of the runs, where there were several
                    ax.errorbar([x], [q['median']], yerr=[[q['median'] - q['min']],
                                                          [q['max'] - q['median']]],
                                fmt='none', ecolor='black', elinewidth=1, capsize=3)
            first = [p for p in pts if p['series'] == s][0]
            color = COLORS.get((first['tool'], first['device']), 'C%d' % (4 + i))
            bars = ax.bar(xs, ys, width * 0.92, color=color, label=s)
            handles.setdefault(s, bars)
            for x, y, top in zip(xs, ys, tops):
                ax.annotate('{:,.0f}'.format(y), (x, top), xytext=(0, 3),
                            textcoords='offset points', ha='center', va='bottom', fontsize=7)
        ax.set_xticks(range(len(batches)))
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel('batch (samples per optimizer step)')
        ax.set_ylabel('samples/s (median; whiskers: min–max of the runs)')
        vals = [p['median'] for p in pts if p['median']]
        top = max(p['max'] or p['median'] for p in pts)
        if vals and max(vals) / min(vals) > 30:  # the CPU beside the GPU
            ax.set_yscale('log')
            ax.set_ylim(min(vals) / 2, top * 2)
            ax.set_ylabel('samples/s, log scale (median; whiskers: min–max of the runs)')
        else:
            ax.set_ylim(0, top * 1.12)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: '{:,.0f}'.format(v)))
        ax.set_title(panel_title(pts[0]), fontsize=9)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    common.legend_below(fig, list(handles.values()), list(handles.keys()))
    return ctx.figure(fig, 'cpu_gpu')
