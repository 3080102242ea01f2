"""What every study shares: running pipetrain (train under mpiexec, plan), recording each
run with its command and the machine, and writing figures and tables.

A study is a module of this package with TITLE and run(ctx) -> markdown. run() calls
ctx.train / ctx.plan for its measurements (each one is recorded in results/NAME/runs.jsonl
as it completes), draws its figures with ctx.figure(), and returns the markdown that
study.py puts into docs/STUDIES.md (full runs) or prints (--quick).

Measured figures and predicted ones are never mixed: a run of `plan` is recorded with
"kind": "predicted", a run of `train` with "kind": "measured", and figures draw predicted
points as open markers on dashed lines.

Runs measured on another machine (a GPU this one lacks) are kept in git under
results/recorded/STUDY/*.jsonl, one file per session, in the same record format with
"measured_elsewhere": true and "recorded": {"machine", "date", "by", "source"}; recorded()
reads them, and a study that draws them says on which machine and date they were measured.
"""
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
ROOT = os.path.dirname(EXPERIMENTS)
sys.path.insert(0, EXPERIMENTS)
import benchlib  # noqa: E402  (the environment of fair measurements, noise)


class StudyError(Exception):
    pass


def machine():
    """The machine the runs ran on, as recorded with every run."""
    model = ''
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'):
                model = line.split(':', 1)[1].strip()
                break
    except OSError:
        pass
    return {'host': platform.node(), 'cpu': model, 'cores': len(os.sched_getaffinity(0)),
            'kernel': platform.release()}


class Context:
    def __init__(self, name, args):
        self.name = name
        self.quick = args.quick
        self.pipetrain = os.path.abspath(args.pipetrain)
        self.mpiexec = args.mpiexec
        self.results = os.path.join(os.path.abspath(args.results), name)
        self.figures = os.path.abspath(args.figures)
        self.plot = not args.no_plot
        self.recorded_dir = os.path.abspath(args.recorded)
        self.env = benchlib.environment('tuned', OPENBLAS_NUM_THREADS='1')
        self.cores = len(os.sched_getaffinity(0))
        self.machine = machine()
        self.runs = []
        for d in (self.results, self.figures):
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise StudyError('cannot create %s: %s' % (d, e.strerror))
        self.log_path = os.path.join(self.results, 'runs.jsonl')
        for f in os.listdir(self.results):  # a profile of an earlier run is not reused
            if f.startswith('costs-') and f.endswith('.txt'):
                os.remove(os.path.join(self.results, f))
        try:
            self.log = open(self.log_path, 'w')
        except OSError as e:
            raise StudyError('cannot write %s: %s' % (self.log_path, e.strerror))

    # ---- runs --------------------------------------------------------------------------

    def _record(self, kind, label, cmd, result, ranks, wall):
        rec = {'study': self.name, 'label': label, 'kind': kind, 'ranks': ranks,
               'oversubscribed': ranks > self.cores, 'quick': self.quick,
               'cmd': ' '.join(shlex.quote(c) for c in cmd), 'wall_s': round(wall, 3),
               'when': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
               'machine': self.machine, 'result': result}
        self.log.write(json.dumps(rec) + '\n')
        self.log.flush()
        self.runs.append(rec)
        return rec

    def train(self, label, args, ranks=1):
        """One `pipetrain train ... --json` (under mpiexec -n RANKS when ranks > 1); returns
        its JSON object with 'noise' (other processes' share of the machine meanwhile)."""
        cmd = [self.pipetrain, 'train', *[str(a) for a in args], '--json']
        if ranks > 1:
            cmd = [self.mpiexec, '-n', str(ranks), *cmd]
        t0 = time.perf_counter()
        try:
            res = benchlib.run(cmd, self.env, label)
        except RuntimeError as e:
            raise StudyError(str(e))
        self._record('measured', label, cmd, res, ranks, time.perf_counter() - t0)
        print('  %-40s %9.0f samples/s%s' % (label, res.get('samples_per_s') or 0,
                                            '  (oversubscribed)' if ranks > self.cores else ''),
              flush=True)
        return res

    def plan(self, label, args):
        """One `pipetrain plan ... --json`: a prediction, not a measurement."""
        args = [str(a) for a in args]
        if '--model' in args and '--costs-file' not in args:
            # one profile of each model and micro-batch per study run, kept beside its runs:
            # every plan of the study prices from the same figures (and the seconds each
            # profile takes are spent once)
            stem = os.path.basename(args[args.index('--model') + 1]).rsplit('.', 1)[0]
            args += ['--costs-file', os.path.join(self.results, 'costs-%s.txt' % stem)]
        cmd = [self.pipetrain, 'plan', *args, '--json']
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True)
        if r.returncode:
            raise StudyError('%s failed (exit %d):\n  %s\n%s' % (label, r.returncode, ' '.join(cmd),
                                                               r.stderr[-2000:]))
        res = json.loads(r.stdout)
        self._record('predicted', label, cmd, res, res.get('ranks', 1), time.perf_counter() - t0)
        return res

    # ---- outputs -----------------------------------------------------------------------

    def figure(self, fig, stem):
        """Saves a matplotlib figure as PNG; returns its path relative to docs/."""
        path = os.path.join(self.figures, '%s.png' % stem)
        fig.savefig(path, dpi=90, bbox_inches='tight')
        import matplotlib.pyplot as plt
        plt.close(fig)
        return os.path.relpath(path, os.path.join(ROOT, 'docs'))

    def close(self):
        self.log.close()


def legend_below(fig, handles, labels, ncol=None, title=None):
    """A legend under the figure's axes, outside every one of them (bbox_inches='tight'
    keeps it in the saved image; matplotlib 3.6 has no loc='outside ...')."""
    return fig.legend(handles, labels, loc='upper center', bbox_to_anchor=(0.5, 0.0),
                      ncol=ncol or min(4, len(labels)), fontsize=8, frameon=False, title=title,
                      title_fontsize=8)


def table(header, rows):
    """A markdown table; None cells print as '–'."""
    def cell(v):
        if v is None:
            return '–'
        if isinstance(v, float):
            return '%.3g' % v if abs(v) < 100 else '{:,.0f}'.format(v)
        return str(v)
    out = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    out += ['| ' + ' | '.join(cell(c) for c in r) + ' |' for r in rows]
    return '\n'.join(out) + '\n'


def per_step(res, key, reduce=max):
    """A per-stage figure summed over the timed steps, per step (reduce over stages)."""
    v = [x for x in (res.get(key) or []) if x is not None]
    n = res.get('steps', 0) - res.get('warmup', 0)
    return reduce(v) / n if v and n > 0 else None


def step_ms(res):
    rate = res.get('samples_per_s')
    return 1e3 * res['batch'] / rate if rate else None


def recorded(study, where):
    """The runs of STUDY recorded on other machines: every record of WHERE/STUDY/*.jsonl
    (WHERE: results/recorded by default; files in name order), each checked for the fields
    a study draws from. A malformed one is refused naming its file and line."""
    d = os.path.join(where, study)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith('.jsonl'))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StudyError('cannot read %s: %s' % (d, e.strerror))
    out = []
    for n in names:
        path = os.path.join(d, n)
        with open(path) as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where_ = '%s:%d' % (os.path.relpath(path, ROOT), i)
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise StudyError('%s: not JSON (%s)' % (where_, e))
                if not isinstance(rec, dict):
                    raise StudyError('%s: not a JSON object' % where_)
                bad = [k for k in ('study', 'label', 'kind', 'cmd', 'machine', 'result', 'recorded')
                       if k not in rec]
                why = ('no ' + ', '.join(bad) if bad
                       else 'a record of %s' % rec['study'] if rec['study'] != study
                       else 'not marked "measured_elsewhere": true'
                       if rec.get('measured_elsewhere') is not True else None)
                if why:
                    raise StudyError('%s: not a recorded run of %s: %s' % (where_, study, why))
                if not (isinstance(rec['recorded'], dict) and isinstance(rec['machine'], dict)
                        and isinstance(rec['result'], dict)
                        and all(rec['recorded'].get(k) for k in ('machine', 'date'))):
                    raise StudyError('%s: "machine" and "result" must be objects and "recorded" '
                                     'must name the machine and the date' % where_)
                rec['file'] = os.path.relpath(path, ROOT)
                out.append(rec)
    return out


def sizes(quick, full, small):
    """Steps (timed, warm-up) and training samples: tiny with --quick."""
    return small if quick else full
