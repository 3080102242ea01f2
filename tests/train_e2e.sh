# End to end on a slice of Fashion-MNIST: the loss must fall and accuracy must rise well
# above chance, sequentially and as a 2-stage pipeline; JSON has the promised fields.
source "$(dirname "$0")/lib/common.bash"
T=(--train-samples 4096 --test-samples 1000 --batch 64 --threads 1 --seed 3)
"$PIPETRAIN" train --model "$MODELS/seed-cnn.cfg" "${T[@]}" --epochs 3 >"$WORK/seq.txt"
cat "$WORK/seq.txt"
first=$(grep -m1 '^epoch 1/' "$WORK/seq.txt" | sed 's/.*train loss \([0-9.]*\).*/\1/')
last=$(grep '^epoch 3/' "$WORK/seq.txt" | sed 's/.*train loss \([0-9.]*\).*/\1/')
acc=$(grep '^epoch 3/' "$WORK/seq.txt" | sed 's/.*test loss [0-9.]* acc \([0-9.]*\).*/\1/')
python3 -c "import sys; sys.exit(0 if $last < 0.8 * $first else 1)" \
    && pass "loss fell: $first -> $last" || failed "loss did not fall: $first -> $last"
python3 -c "import sys; sys.exit(0 if $acc > 0.6 else 1)" \
    && pass "test accuracy $acc > 0.6" || failed "test accuracy $acc"

"$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" "${T[@]}" --epochs 2 \
    --stages 2 --microbatches 4 --optimizer adam --lr 0.002 --json --trace "$WORK/trace.json" \
    >"$WORK/pipe.txt"
tail -n 1 "$WORK/pipe.txt" >"$WORK/pipe.json"
if python3 - "$WORK/pipe.json" "$WORK/trace.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
need = ["samples_per_s", "train_loss", "test_loss", "test_acc", "steps", "params", "wall_s",
        "stages", "microbatches", "schedule", "bubble", "bubble_theory", "stage_compute_s",
        "stage_peak_act_bytes"]
missing = [k for k in need if k not in r]
assert not missing, missing
assert r["stages"] == 2 and len(r["stage_compute_s"]) == 2, r
assert r["test_acc"] > 0.5, r["test_acc"]
t = json.load(open(sys.argv[2]))["traceEvents"]
pids = {e.get("pid") for e in t if e.get("ph") == "X"}
names = {e["cat"] for e in t if e.get("ph") == "X"}
assert pids == {0, 1}, pids
assert {"forward", "backward", "send_act", "wait_act", "optimizer"} <= names, names
print("json and trace ok:", r["samples_per_s"], "samples/s, test acc", r["test_acc"])
PY
then pass "pipeline JSON and Chrome trace"; else failed "pipeline JSON or trace"; fi
finish
