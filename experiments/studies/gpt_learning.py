"""GPT learning check: pipetrain trains gpt-mini on the built-in corpus (Debian's fortunes,
10% held out) with AdamW, a cosine schedule with warm-up and gradient clipping, and the
PyTorch peer (experiments/learn_gpt.py) trains the same GPT in float32 from the same
initial parameters on the same windows; the two loss curves and validation losses, per
seed, and a text pipetrain's seed-0 model writes (`pipetrain sample`).

Before each seed's training the study checks what makes the two runs the same run: a
one-step SGD run with lr 0 writes pipetrain's initial parameters into a checkpoint (with
its corpus digest), and the peer compares its own initialisation with it bit for bit and
its corpus's digest with the checkpoint's; a difference stops the study."""
import json
import os
import shutil
import subprocess
import sys
import time

from . import common
from .transformer import svg_figure

TITLE = 'GPT learning check'
MODEL = 'models/gpt-mini.cfg'
BATCH, LR, CLIP, THREADS = 4, 1e-3, 1.0, 2
PROMPT, TEMPERATURE, TOP_K = 'The ', 0.8, 40


def hyper(quick):
    """(seeds, steps, warm-up steps, validation windows, sample tokens, threads): 5 steps,
    one seed, 8 windows and one thread each with --quick (./test.sh runs it beside other
    tests: two threads each would oversubscribe the cores)."""
    return ([0], 5, 2, 8, 40, 1) if quick else ([0, 1, 2], 200, 20, 64, 400, THREADS)


def train_args(seed, steps, warmup, windows, threads):
    return ['--model', MODEL, '--data', 'text', '--steps', steps, '--batch', BATCH,
            '--optimizer', 'adamw', '--lr', LR, '--lr-schedule', 'cosine', '--lr-warmup', warmup,
            '--clip-grad-norm', CLIP, '--threads', threads, '--seed', seed,
            '--eval-windows', windows]


def fresh(path):
    """Removes what a previous run of the study left at path."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    return path


def metrics(path):
    """Training loss per step (steps 1..S) and validation loss per epoch end {step: loss}
    from a --metrics file written with --log-every 1."""
    losses, val = {}, {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get('type') == 'step':
                losses[rec['step']] = rec['loss']
            elif rec.get('type') == 'epoch' and rec.get('val_loss') is not None:
                val[rec['step']] = rec['val_loss']
    return [losses[s] for s in sorted(losses)], val


def peer(ctx, python, seed, steps, warmup, windows, threads, eval_at, init_ck):
    """One run of experiments/learn_gpt.py, recorded as a measured run of the peer."""
    cmd = [python, os.path.join(common.EXPERIMENTS, 'learn_gpt.py'), '--model', MODEL,
           '--seed', str(seed), '--steps', str(steps), '--batch', str(BATCH), '--lr', repr(LR),
           '--lr-schedule', 'cosine', '--lr-warmup', str(warmup), '--clip-grad-norm', repr(CLIP),
           '--threads', str(threads), '--eval-windows', str(windows),
           '--eval-at', ','.join(map(str, eval_at)),
           '--check-init', init_ck]
    label = 'seed %d: PyTorch peer, %d steps' % (seed, steps)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=common.ROOT, env=ctx.env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise common.StudyError('%s failed (exit %d):\n  %s\n%s' % (label, r.returncode,
                                                                  ' '.join(cmd), r.stderr[-3000:]))
    res = json.loads(r.stdout.strip().splitlines()[-1])
    ctx._record('measured', label, cmd, res, 1, wall)
    print('  %-40s %9.1f s' % (label, res['train_s']), flush=True)
    return res


def check_same_start(seed, p):
    """The peer started where pipetrain did: the same bits and the same corpus."""
    i = p['init']
    why = ('%d of %d initial parameters differ from pipetrain\'s' % (i['differ'], i['compared'])
           if i['differ'] else
           'pipetrain\'s checkpoint lacks %s' % ', '.join(i['missing']) if i['missing'] else
           'corpus digest %s, pipetrain\'s %s' % (i['corpus_digest'], i['checkpoint_corpus_digest'])
           if i['corpus_digest'] != i['checkpoint_corpus_digest'] else
           'the checkpoint is of seed %s' % i['checkpoint_seed']
           if i['checkpoint_seed'] != str(seed) else None)
    if why:
        raise common.StudyError('seed %d: the peer does not start from pipetrain\'s state: %s'
                                % (seed, why))


def sample(ctx, ck, tokens):
    """What pipetrain's model writes after PROMPT (the text, and the command)."""
    cmd = [ctx.pipetrain, 'sample', '--model', MODEL, '--load', ck, '--prompt', PROMPT,
           '--tokens', str(tokens), '--temperature', str(TEMPERATURE), '--top-k', str(TOP_K),
           '--seed', '0']
    r = subprocess.run(cmd, cwd=common.ROOT, env=ctx.env, capture_output=True)
    if r.returncode:
        raise common.StudyError('pipetrain sample failed (exit %d):\n  %s\n%s'
                                % (r.returncode, ' '.join(cmd), r.stderr.decode()[-2000:]))
    return r.stdout.decode('utf-8', errors='replace'), cmd


def run(ctx):
    python = interpreter_with_torch(ctx.quick)
    if python is None:  # --quick on a machine without PyTorch (./test.sh on a fresh one)
        return ('\nSkipped: no Python interpreter with torch and numpy here (Debian: '
                'apt-get install python3-torch python3-numpy).\n')
    seeds, steps, warmup, windows, n_sample, threads = hyper(ctx.quick)
    per_seed = {}
    for seed in seeds:
        d = os.path.join(ctx.results, 'seed%d' % seed)
        os.makedirs(d, exist_ok=True)
        init_dir = fresh(os.path.join(d, 'init'))
        # pipetrain's initial parameters and corpus digest: one SGD step with lr 0
        ctx.train('seed %d: initial parameters (sgd, lr 0)' % seed,
                  ['--model', MODEL, '--data', 'text', '--steps', 1, '--batch', BATCH,
                   '--optimizer', 'sgd', '--lr', 0, '--eval-windows', 1, '--threads', threads,
                   '--seed', seed, '--checkpoint-dir', init_dir])
        init_ck = os.path.join(init_dir, 'ckpt-0000000001.safetensors')
        m_path, ck = fresh(os.path.join(d, 'metrics.jsonl')), fresh(os.path.join(d, 'final.st'))
        pt = ctx.train('seed %d: pipetrain, %d steps' % (seed, steps),
                       train_args(seed, steps, warmup, windows, threads)
                       + ['--metrics', m_path, '--log-every', 1, '--save', ck])
        losses, val = metrics(m_path)
        if len(losses) != steps or pt['val_loss'] is None:
            raise common.StudyError('seed %d: %s holds %d step losses for %d steps'
                                    % (seed, m_path, len(losses), steps))
        p = peer(ctx, python, seed, steps, warmup, windows, threads, sorted(val), init_ck)
        check_same_start(seed, p)
        per_seed[seed] = {'pt': pt, 'pt_losses': losses, 'pt_val': val, 'peer': p, 'ck': ck}
    text, cmd = sample(ctx, per_seed[seeds[0]]['ck'], n_sample)
    with open(os.path.join(ctx.results, 'sample_seed%d.txt' % seeds[0]), 'w') as f:
        f.write(text)
    md = table(per_seed, steps, warmup)
    md += sample_md(text, cmd, seeds[0])
    if ctx.plot:
        md += '\n![loss curves of pipetrain and PyTorch, per seed](%s)\n' % draw(ctx, per_seed)
    return md


def interpreter_with_torch(quick):
    """An interpreter with torch and numpy for the peer (this one, else /usr/bin/python3).
    Without one, the study stops with an install hint; --quick (a smoke test of the
    scripts) returns None instead, so a machine without PyTorch can run every study."""
    sys.path.insert(0, common.EXPERIMENTS)
    import interpreter
    if quick:
        for p in (sys.executable, interpreter.DEBIAN_PYTHON):
            if interpreter.has_modules(p, ['torch', 'numpy']):
                return p
        return None
    return interpreter.find_python(['torch', 'numpy'])


def table(per_seed, steps, warmup):
    rows = []
    for seed, r in per_seed.items():
        pt, p = r['pt'], r['peer']
        a, b = pt['val_loss'], p['val_loss']
        dl = [x - y for x, y in zip(r['pt_losses'], p['losses'])]
        rows.append([seed, '%.5f' % a, '%.5f' % b, '%+.2e' % (a - b), '%.1e' % (abs(a - b) / b),
                     '%.3f' % (a / 0.6931471805599453),
                     '%.6f / %.6f' % (r['pt_losses'][0], p['losses'][0]),
                     '%.1e' % max(abs(x) for x in dl), '%.1e' % abs(dl[-1]),
                     '%d of %d' % (p['init']['compared'] - p['init']['differ'],
                                   p['init']['compared']),
                     '%.0f / %.0f' % (pt['train_s'], p['train_s'])])
    md = common.table(['seed', 'val loss pipetrain', 'val loss PyTorch', 'difference',
                       'relative', 'val bits per byte (pipetrain)',
                       'loss of step 1 (pipetrain / PyTorch)',
                       'largest difference of a step\'s training loss (absolute)',
                       'at the last step', 'initial parameters bit-identical',
                       'training s (pipetrain / PyTorch)'], rows)
    first = next(iter(per_seed.values()))
    md += ('\n%s, %d steps of %d windows of %d bytes (%s training bytes, %s held out; the '
           'validation loss is the mean over %d windows of the held-out part), AdamW lr %g '
           '(decay 0.01 on the blocks\' matrices), cosine schedule after %d warm-up steps, '
           'gradients clipped to norm %g, %s each; pipetrain in its float32 engine, '
           'PyTorch %s in float32 (`experiments/learn_gpt.py`). Both sides start from the same '
           'bits (compared with a checkpoint pipetrain wrote before its first update) and draw '
           'the same windows; the corpus digests agree.\n'
           % (MODEL, steps, BATCH, first['pt']['context'],
              '{:,}'.format(first['pt']['train_tokens']), '{:,}'.format(first['pt']['val_tokens']),
              first['pt']['val_samples'], LR, warmup, CLIP,
              '%d thread%s' % (first['pt']['threads'], 's' if first['pt']['threads'] > 1 else ''),
              first['peer']['torch']))
    return md


def sample_md(text, cmd, seed):
    shown = text.replace('```', "'''")
    return ('\nA text the seed-%d model writes (`pipetrain sample --prompt "%s" --tokens %s '
            '--temperature %g --top-k %d --seed 0`):\n\n```text\n%s\n```\n'
            % (seed, PROMPT, cmd[cmd.index('--tokens') + 1], TEMPERATURE, TOP_K,
               shown.rstrip('\n')))


def draw(ctx, per_seed):
    """Per seed, both training-loss curves and the validation losses at the epoch ends; under
    them, pipetrain's loss minus PyTorch's at every step, per seed."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    n = len(per_seed)
    fig = plt.figure(figsize=(4.2 * n + 0.6, 7.2), constrained_layout=True)
    gs = fig.add_gridspec(2, n, height_ratios=[3, 2])
    top = [fig.add_subplot(gs[0, i]) for i in range(n)]
    diff = fig.add_subplot(gs[1, :])
    for ax, (seed, r) in zip(top, per_seed.items()):
        p = r['peer']
        s = range(1, len(r['pt_losses']) + 1)
        ax.plot(s, r['pt_losses'], '-', color='C0', lw=1.2, label='pipetrain, training')
        ax.plot(s, p['losses'], '--', color='C1', lw=1.2, label='PyTorch, training')
        vs = sorted(r['pt_val'])
        ax.plot(vs, [r['pt_val'][k] for k in vs], 'o', color='C0', ms=7, mfc='none', mew=1.5,
                label='pipetrain, validation')
        ax.plot([int(k) for k in p['val_losses']], list(p['val_losses'].values()), 'x',
                color='C1', ms=7, mew=1.5, label='PyTorch, validation')
        ax.set_title('seed %d' % seed, fontsize=10)
        ax.set_xlabel('step')
        ax.grid(alpha=0.3)
    top[0].set_ylabel('cross-entropy per byte (nats)')
    for i, (seed, r) in enumerate(per_seed.items()):
        d = [a - b for a, b in zip(r['pt_losses'], r['peer']['losses'])]
        diff.plot(range(1, len(d) + 1), d, '-', color='C%d' % (i + 2), lw=1, label='seed %d' % seed)
    diff.axhline(0, color='gray', lw=0.8)
    diff.set_xlabel('step')
    diff.set_ylabel('training loss: pipetrain − PyTorch')
    diff.grid(alpha=0.3)
    diff.legend(fontsize=8, ncol=n, loc='upper left')
    h, lab = top[0].get_legend_handles_labels()
    common.legend_below(fig, h, lab, ncol=4)
    return svg_figure(ctx, fig, 'gpt_learning')
