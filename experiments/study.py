#!/usr/bin/env python3
"""Runs pipetrain's studies: the classic comparisons, reproducible with one command.

    python3 experiments/study.py NAME|all [--quick]

Each study runs real pipetrain jobs (and `plan` for predictions, which are always drawn and
labelled as predictions), records every run with its command and the machine in
results/NAME/runs.jsonl, draws its figures into docs/figures/ and writes its table into
docs/STUDIES.md between the markers <!-- study:NAME --> and <!-- /study:NAME -->, leaving
the prose around them alone. --quick runs a few steps per run, writes into results/quick/
(figures included) and leaves docs/ untouched: ./test.sh runs it so the scripts cannot rot;
its numbers mean nothing. Runs measured on another machine (the cpu-gpu study's GPU runs)
are kept in git under results/recorded/STUDY/*.jsonl and drawn, labelled with the machine
and date they were measured on (experiments/studies/common.py).

Studies: layouts, scaling, batch, schedules, partition, cpu-gpu, transformer, gpt-learning
(see docs/STUDIES.md).
"""
import argparse
import importlib
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import interpreter  # noqa: E402

STUDIES = ['layouts', 'scaling', 'batch', 'schedules', 'partition', 'cpu-gpu', 'transformer',
           'gpt-learning', 'zero']
DOC = os.path.join(ROOT, 'docs', 'STUDIES.md')


def parse():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('study', help='one of: %s, or all' % ', '.join(STUDIES))
    p.add_argument('--quick', action='store_true',
                   help='a few steps per run, outputs under results/quick (a smoke test)')
    p.add_argument('--pipetrain', default=os.path.join(ROOT, 'build', 'pipetrain'))
    p.add_argument('--mpiexec', default='mpiexec')
    p.add_argument('--results', default=None, help='default: results/ (results/quick/ with --quick)')
    p.add_argument('--figures', default=None,
                   help='default: docs/figures/ (results/quick/figures/ with --quick)')
    p.add_argument('--recorded', default=os.path.join(ROOT, 'results', 'recorded'),
                   help='runs recorded on other machines, STUDY/*.jsonl (default: %(default)s)')
    p.add_argument('--no-plot', action='store_true', help='tables only (no matplotlib needed)')
    a = p.parse_args()
    names = STUDIES if a.study == 'all' else [a.study]
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        p.error('unknown study %r (known: %s, all)' % (unknown[0], ', '.join(STUDIES)))
    base = os.path.join(ROOT, 'results', 'quick') if a.quick else os.path.join(ROOT, 'results')
    a.results = a.results or base
    a.figures = a.figures or (os.path.join(base, 'figures') if a.quick
                              else os.path.join(ROOT, 'docs', 'figures'))
    if not (os.path.isfile(a.pipetrain) and os.access(a.pipetrain, os.X_OK)):
        p.error('no pipetrain binary at %s: build it first (./run.sh), or give --pipetrain'
                % a.pipetrain)
    return a, names


def put_in_doc(name, title, md):
    """Replaces the study's block in docs/STUDIES.md (appending a section if it has none)."""
    text = open(DOC).read() if os.path.exists(DOC) else '# Studies\n'
    begin, end = '<!-- study:%s -->' % name, '<!-- /study:%s -->' % name
    block = '%s\n%s%s' % (begin, md, end)
    pat = re.compile(re.escape(begin) + '.*?' + re.escape(end), re.S)
    if pat.search(text):
        text = pat.sub(lambda _: block, text)
    else:
        text = text.rstrip('\n') + '\n\n## %s\n\n%s\n' % (title, block)
    with open(DOC, 'w') as f:
        f.write(text)


def main():
    args, names = parse()
    if not args.no_plot:
        interpreter.ensure_modules(['matplotlib'])
    from studies import common
    failed = 0
    for name in names:
        mod = importlib.import_module('studies.' + name.replace('-', '_'))
        print('== %s%s' % (mod.TITLE, ' (quick)' if args.quick else ''), flush=True)
        t0 = time.time()
        try:
            ctx = common.Context(name, args)
            md = mod.run(ctx)
            ctx.close()
        except common.StudyError as e:
            print('study %s failed: %s' % (name, e), file=sys.stderr)
            failed += 1
            continue
        if args.quick:
            print(md)
        else:
            put_in_doc(name, mod.TITLE, md)
        print('== %s: %d runs in %.0f s, recorded in %s' % (name, len(ctx.runs), time.time() - t0,
                                                         os.path.relpath(ctx.log_path, ROOT)))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
