"""autocast_check.py GOLDEN.json RUN GOT.safetensors GOT.jsonl [--within | --beyond] [--perturb]
(tests/gpt_autocast.sh, tests/cpu_bf16.sh): a run of pipetrain against a torch golden run of
tests/golden/gpt_autocast.json.
--within: exit 0 when every step loss and every tensor is within the run's tolerance;
--beyond: exit 0 when some tensor is beyond it. --perturb moves one golden element of
layers.1.mlp.c_fc.weight by 10× the tolerance first."""
import json, os, sys

sys.path.insert(0, os.path.join(os.environ['PT_SOURCE_DIR'], 'tests', 'lib'))
from safetensors_f32 import read_f32  # noqa: E402


def read_st(path):  # the values only
    return {name: values for name, (_, values) in read_f32(path).items()}

gold_path, run, got_st, got_jsonl, mode = sys.argv[1:6]
doc = json.load(open(gold_path))
ref, tol = doc['runs'][run], doc['tolerance'][run]
gold = read_st(os.path.join(os.path.dirname(gold_path), ref['params']))
got = read_st(got_st)
if '--perturb' in sys.argv[6:]:
    vals = gold['layers.1.mlp.c_fc.weight']
    vals[len(vals) // 3] += 10 * tol['params'] * max(abs(v) for v in vals)
recs = [json.loads(l) for l in open(got_jsonl)]
losses = [r['loss'] for r in recs if r.get('type') == 'step']
problems = []
if len(losses) != len(ref['losses']):
    problems.append('%d step losses, golden %d' % (len(losses), len(ref['losses'])))
loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref['losses']))
if not loss_err <= tol['loss']:
    problems.append('step losses %.3g apart (tolerance %.2g)' % (loss_err, tol['loss']))
worst = (0.0, '')
for name in sorted(gold):
    if name not in got or len(got[name]) != len(gold[name]):
        problems.append('%s: missing or of another size' % name)
        continue
    rel = (max(abs(a - b) for a, b in zip(got[name], gold[name])) /
           max(abs(b) for b in gold[name]))
    worst = max(worst, (rel, name))
if not worst[0] <= tol['params']:
    problems.append('%s: max|got − golden| is %.3g of max|golden| (tolerance %.2g)'
                    % (worst[1], worst[0], tol['params']))
summary = ('losses %.2g apart, parameters %.3g (%s; tolerances %.2g, %.2g)'
           % (loss_err, worst[0], worst[1], tol['loss'], tol['params']))
print(summary if not problems else '; '.join(problems[:4]))
sys.exit(0 if (not problems) == (mode == '--within') else 1)
