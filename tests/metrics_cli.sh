# train --metrics FILE.jsonl: every line a whole JSON object (also after a rank is killed
# mid-run), the run's line first, a step line every --log-every steps, an epoch line per
# epoch and a final line equal to --json's object; bad paths end the job on every rank.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
T=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 256 --test-samples 64 --threads 1
   --seed 3)   # 8 steps per epoch

"$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --stages 2 --microbatches 2 --epochs 2 \
    --metrics "$WORK/p.jsonl" --log-every 3 --json >"$WORK/p.json" \
    && pass "pipeline run with --metrics" || failed "pipeline run with --metrics"
python3 - "$WORK/p.jsonl" "$WORK/p.json" <<'PY' && pass "pipeline: run, step, epoch and final lines" || failed "pipeline metrics lines"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
final_json = json.loads(open(sys.argv[2]).read().splitlines()[-1])
types = [l["type"] for l in lines]
assert types[0] == "run" and types[-1] == "final", types
run = lines[0]
assert run["stages"] == 2 and run["microbatches"] == 2 and run["batch"] == 32, run
steps = [l for l in lines if l["type"] == "step"]
assert [l["step"] for l in steps] == [3, 6, 9, 12, 15], [l["step"] for l in steps]
assert all(l["steps"] == 3 and len(l["stage_compute_s"]) == 2 and len(l["stage_wait_s"]) == 2
           and all(x >= 0 for x in l["stage_compute_s"] + l["stage_wait_s"]) for l in steps), steps
assert all(0 < l["loss"] < 10 and l["samples_per_s"] > 0 for l in steps), steps
epochs = [l for l in lines if l["type"] == "epoch"]
assert [e["epoch"] for e in epochs] == [1, 2] and [e["step"] for e in epochs] == [8, 16], epochs
assert epochs[-1]["test_acc"] == final_json["test_acc"] and epochs[-1]["val_acc"] is None
final = lines[-1]
for k in ("train_loss", "test_loss", "steps", "stages", "stage_layers", "params"):
    assert final[k] == final_json[k], (k, final[k], final_json[k])
PY

# hybrid: the exposed reductions per stage
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --replicas 2 --steps 4 --metrics "$WORK/h.jsonl" \
    --log-every 2 >/dev/null
python3 - "$WORK/h.jsonl" <<'PY' && pass "hybrid: step lines carry the exposed reductions" || failed "hybrid metrics"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
steps = [l for l in lines if l["type"] == "step"]
assert len(steps) == 2 and all(len(l["stage_reduce_exposed_s"]) == 1 for l in steps), steps
assert lines[0]["replicas"] == 2
PY

# a rank killed mid-run: what was written is whole lines (at most the last one missing)
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --stages 2 --epochs 3 --metrics "$WORK/k.jsonl" \
    --log-every 1 --debug-kill 1:12 >/dev/null 2>&1 && failed "killed run exited 0"
python3 - "$WORK/k.jsonl" <<'PY' && pass "killed at step 12: every line whole" || failed "a torn line after a kill"
import json, sys
text = open(sys.argv[1]).read()
assert text.endswith("\n"), "last line torn"
lines = [json.loads(l) for l in text.splitlines()]
assert lines[0]["type"] == "run" and lines[-1]["type"] != "final", [l["type"] for l in lines]
assert 1 <= sum(l["type"] == "step" for l in lines) <= 12
PY

expect_fail "--metrics in a missing directory" "--metrics $WORK/none/m.jsonl: cannot write in $WORK/none" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --stages 2 --steps 2 --metrics "$WORK/none/m.jsonl"
expect_fail "--log-every 0" "--log-every 0" "$PIPETRAIN" train "${T[@]}" --steps 2 \
    --metrics "$WORK/x.jsonl" --log-every 0
finish
