# `pipetrain train`'s run logic on tiny runs (seconds): --json is valid JSON for any model
# path, has null where a figure does not exist and the run's metadata; --steps crosses
# epochs; progress lines appear when stdout is no terminal; a failed output (trace,
# checkpoint) does not stop the others from being written, and the exit status says so.
source "$(dirname "$0")/lib/common.bash"
T=(--train-samples 256 --batch 32 --threads 1)   # 8 steps per epoch
MLP=$MODELS/seed-mlp.cfg

# ok_run CMD...: a run that must succeed (a failure is counted, the script goes on).
ok_run() { "$@" || { local rc=$?; failed "exit $rc from: $*" >&2; }; }

# check NAME FILE PYTHON: runs PYTHON with r = the JSON object on FILE's last line.
check() {
    local name=$1 file=$2 code=$3
    if python3 - "$file" >"$WORK/check" 2>&1 <<PY
import json, sys
lines = open(sys.argv[1]).read().splitlines()
r = json.loads(lines[-1])
$code
PY
    then pass "$name"; else failed "$name"; cat "$WORK/check"; tail -n 1 "$file"; fi
}

# --- JSON for any model path: a double quote and a backslash in it ---
dir="$WORK/my \"models\"\\x"
mkdir -p "$dir"
cp "$MLP" "$dir/mlp.cfg"
ok_run "$PIPETRAIN" train --model "$dir/mlp.cfg" "${T[@]}" --steps 3 --test-samples 0 --json \
    >"$WORK/quote.json"
MODEL="$dir/mlp.cfg" check "JSON valid with a quote and a backslash in --model" \
    "$WORK/quote.json" 'import os
assert r["model"] == os.environ["MODEL"], r["model"]'

# --- what does not exist is null; what does, is a number ---
check "--test-samples 0, no --val, one stage: those figures are null" "$WORK/quote.json" '
for k in ("test_loss", "test_acc", "val_loss", "val_acc", "bubble", "bubble_theory",
          "bubble_simulated", "gpu", "gpu_name", "checkpoint", "trace"):
    assert r[k] is None, (k, r[k])
for k in ("samples_per_s", "train_loss", "train_acc", "wall_s", "train_s"):
    assert isinstance(r[k], float) and r[k] >= 0, (k, r[k])'

ok_run "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 3 --test-samples 100 --val 64 \
    --seed 5 --optimizer sgd --lr 0.05 --json >"$WORK/meta.json"
VERSION=$(sed -n 's/^project(pipetrain.*VERSION \([0-9.]*\).*/\1/p' "$PT_SOURCE_DIR/CMakeLists.txt")
GIT=0; git -C "$PT_SOURCE_DIR" rev-parse --short HEAD >/dev/null 2>&1 && GIT=1
VERSION=$VERSION GIT=$GIT check "test and validation figures are numbers" "$WORK/meta.json" '
for k in ("test_loss", "test_acc", "val_loss", "val_acc"):
    assert isinstance(r[k], float) and r[k] >= 0, (k, r[k])
assert r["test_samples"] == 100 and r["val_samples"] == 64, r'

# --- run metadata ---
VERSION=$VERSION GIT=$GIT check "metadata: version, commit, host, time, seed, optimizer, layout" \
    "$WORK/meta.json" '
import datetime, os, re, socket
old = ["model", "samples_per_s", "train_loss", "train_acc", "test_loss", "test_acc", "val_acc",
       "steps", "epochs", "params", "wall_s", "train_s", "batch", "threads", "device",
       "optimizer", "stages", "microbatches", "schedule", "partition", "bubble",
       "bubble_theory", "bubble_simulated", "stage_compute_s", "stage_wall_s",
       "stage_forward_s", "stage_backward_s", "stage_peak_act_bytes",
       "stage_peak_microbatches"]
missing = [k for k in old if k not in r]
assert not missing, ("keys lost", missing)
assert r["version"] == os.environ["VERSION"], r["version"]
if os.environ["GIT"] == "1":
    assert re.fullmatch("[0-9a-f]{4,40}", r["commit"]), r["commit"]
else:
    assert r["commit"] is None, r["commit"]
assert r["host"] == socket.gethostname(), r["host"]
t = datetime.datetime.strptime(r["start_time"], "%Y-%m-%dT%H:%M:%SZ")
age = datetime.datetime.utcnow() - t
assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=10), r["start_time"]
assert r["seed"] == 5 and r["optimizer"] == "sgd" and r["lr"] == 0.05, r
assert r["batch"] == 32 and r["threads"] == 1 and r["device"] == "cpu", r
assert r["stages"] == 1 and r["microbatches"] == 1 and r["schedule"] == "1f1b", r
assert r["partition"] == "time" and r["stage_layers"] == [3], r'

ok_run "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 4 --test-samples 0 \
    --stages 2 --microbatches 2 --partition 1,2 --json >"$WORK/pipe.json"
check "two stages: partition per stage, bubble figures are numbers" "$WORK/pipe.json" '
assert r["stages"] == 2 and r["stage_layers"] == [1, 2] and r["partition"] == "1,2", r
for k in ("bubble", "bubble_theory", "bubble_simulated"):
    assert isinstance(r[k], float), (k, r[k])
assert len(r["stage_compute_s"]) == 2 and len(r["stage_peak_act_bytes"]) == 2, r'

# --- bubbles in one unit (issue 23 item 14): the idle share of the step, named in the text;
# the balanced-stage figure is the simulator's for unit costs at K=4 M=8 ---
CNN=(--model "$MODELS/seed-cnn.cfg" --train-samples 64 --batch 32 --threads 1 --steps 1
     --test-samples 0 --stages 4 --partition uniform)
while read -r want formula m sched; do
    # shellcheck disable=SC2086 # $sched: the schedule and its --virtual
    ok_run "$MPIEXEC" -n 4 "$PIPETRAIN" train "${CNN[@]}" --microbatches "$m" --schedule $sched \
        >"$WORK/bubble.txt" </dev/null # mpiexec would read the cases
    line=$(grep '^done:' "$WORK/bubble.txt")
    case "$line" in
        *"; bubble (idle share of the step) "*" measured, "*" simulated from the measured stage"*", $want for balanced stages ($formula)")
            pass "train text, $sched M=$m: $want for balanced stages ($formula), unit named" ;;
        *) failed "train text, $sched M=$m: '$line'" ;;
    esac
    # shellcheck disable=SC2086
    ok_run "$MPIEXEC" -n 4 "$PIPETRAIN" train "${CNN[@]}" --microbatches "$m" --schedule $sched \
        --json >"$WORK/bubble.json" </dev/null
    WANT=$want check "train --json, $sched M=$m: bubble_theory $want" "$WORK/bubble.json" '
import os
assert abs(r["bubble_theory"] - float(os.environ["WANT"])) < 5e-4, r["bubble_theory"]
assert 0 <= r["bubble"] < 1 and 0 <= r["bubble_simulated"] < 1, r'
done <<'EOF2'
0.273 (K-1)/(M+K-1) 8 gpipe
0.273 (K-1)/(M+K-1) 8 1f1b
0.273 (K-1)/(V*M+K-1) 8 interleaved --virtual 1
0.158 (K-1)/(V*M+K-1) 8 interleaved --virtual 2
0.111 (K-1)/(3M+K-1) 8 zb-h1
0.455 (2K-M-1)/(2M+2K-1) 2 zb-h1
EOF2

# --- --steps crosses epochs; with --epochs, the first limit wins ---
steps_of() {
    "$PIPETRAIN" train --model "$MLP" "${T[@]}" --test-samples 0 --json "$@" \
        >"$WORK/steps.json" 2>&1 || { echo "exit $?"; return; }
    tail -n 1 "$WORK/steps.json" | python3 -c \
        'import json, sys; r = json.load(sys.stdin); print(r["steps"], r["epochs"])' || true
}
expect_steps() {
    local want=$1; shift
    local got
    got=$(steps_of "$@")
    [ "$got" = "$want" ] && pass "${*:-no --steps, no --epochs}: $want (steps epochs)" \
        || failed "${*:-no --steps, no --epochs}: '$got' (steps epochs), expected $want"
}
expect_steps "20 3" --steps 20
expect_steps "16 2" --epochs 2
expect_steps "16 2" --steps 20 --epochs 2
expect_steps "5 1" --steps 5 --epochs 2
expect_steps "8 1"

# --- progress when stdout is no terminal ---
ok_run "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 20 --test-samples 0 >"$WORK/plain.txt"
if grep -Eq '^  step 1/20  epoch 1/3  loss [0-9.]+  [0-9]+ samples/s  ETA [0-9:]+$' \
        "$WORK/plain.txt"; then
    pass "a progress line at the first step: $(grep -m1 'step 1/20' "$WORK/plain.txt")"
else
    failed "no progress line at the first step"; cat "$WORK/plain.txt"
fi
ok_run "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 20 --test-samples 0 --progress 1e-9 \
    >"$WORK/every.txt"
n=$(grep -c '^  step [0-9]*/20 ' "$WORK/every.txt" || true)
[ "$n" -eq 20 ] && grep -q '^  step 20/20  epoch 3/3 ' "$WORK/every.txt" \
    && pass "--progress 1e-9: a line for each of the 20 steps" \
    || { failed "--progress 1e-9: $n progress lines, expected 20"; cat "$WORK/every.txt"; }
ok_run "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 20 --test-samples 0 --progress 0 \
    >"$WORK/none.txt"
! grep -q '^  step ' "$WORK/none.txt" && pass "--progress 0: no progress lines" \
    || failed "--progress 0 printed progress"
ok_run "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 20 --test-samples 0 --json >"$WORK/j.txt"
[ "$(wc -l <"$WORK/j.txt")" -eq 1 ] && pass "--json: one line, no progress" \
    || { failed "--json printed more than its line"; cat "$WORK/j.txt"; }

# --- a failed output costs no other output ---
# outputs that fail only when written, after training: on a full disk (a 4 KiB tmpfs at
# $FULL in a private mount namespace, where one can be made; a file that cannot be created
# at all is refused at start: tests/output_start_checks.sh)
FULL=$WORK/full
mkdir "$FULL"
IN_FULL=(unshare -m sh -c "mount -t tmpfs -o size=4k tmpfs '$FULL' && exec \"\$@\"" sh)
# run_outputs NAME STAGES ARGS...: must exit non-zero (no hang) and write what it can.
run_outputs() {
    local name=$1 k=$2 rc=0
    shift 2
    local launch=("$PIPETRAIN")
    [ "$k" -gt 1 ] && launch=("$MPIEXEC" -n "$k" "$PIPETRAIN")
    rm -f "$WORK"/keep*.st
    timeout 120 "${IN_FULL[@]}" "${launch[@]}" train --model "$MLP" "${T[@]}" --steps 20 \
        --test-samples 0 --stages "$k" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
        failed "$name: exit $rc"; cat "$WORK/err"; return 1
    fi
    pass "$name: exit $rc"
}
if ! "${IN_FULL[@]}" true 2>/dev/null; then
    echo "skip: outputs that fail when written (cannot mount a tmpfs in a private mount namespace)"
else
if run_outputs "unwritable --trace" 1 --trace "$FULL/pipetrain-trace.json" --save "$WORK/keep.st"; then
    grep -q "trace.*$FULL/pipetrain-trace" "$WORK/err" && pass "the trace failure is reported" \
        || { failed "the trace failure is not reported"; cat "$WORK/err"; }
    [ -s "$WORK/keep.st" ] && "$PIPETRAIN" diff "$WORK/keep.st" "$WORK/keep.st" >/dev/null \
        && pass "the checkpoint is still written" || failed "no checkpoint after a failed trace"
    grep -q "^saved $WORK/keep.st" "$WORK/out" && ! grep -q "^trace " "$WORK/out" \
        && pass "the report names the checkpoint, not the trace" \
        || { failed "the report claims the wrong outputs"; cat "$WORK/out"; }
fi
if run_outputs "unwritable --trace and --save" 1 --trace "$FULL/pipetrain-trace.json" \
        --save "$FULL/pipetrain-save.st" --json; then
    [ "$(grep -c "$FULL/pipetrain-" "$WORK/err")" -ge 2 ] && pass "both failures are reported" \
        || { failed "not every failure is reported"; cat "$WORK/err"; }
    check "the results are still printed, with no outputs" "$WORK/out" '
assert r["steps"] == 20 and r["checkpoint"] is None and r["trace"] is None, r'
fi
if run_outputs "unwritable --save, writable --trace" 1 --save "$FULL/pipetrain-save.st" \
        --trace "$WORK/t.json"; then
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$WORK/t.json" \
        && pass "the trace is still written" || failed "no trace after a failed checkpoint"
fi
if run_outputs "two stages, unwritable --trace" 2 --microbatches 2 \
        --trace "$FULL/pipetrain-trace.json" --save "$WORK/keep2.st"; then
    [ -s "$WORK/keep2.st" ] && pass "two stages: the checkpoint is still written" \
        || failed "two stages: no checkpoint after a failed trace"
fi
fi
# a missing directory is found before training, not after it
rc=0
timeout 60 "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 100000 --test-samples 0 \
    --save "$WORK/nodir/x.st" >"$WORK/out" 2>"$WORK/err" || rc=$?
[ $rc = 2 ] && grep -q "cannot write in $WORK/nodir" "$WORK/err" && ! grep -q "step" "$WORK/out" \
    && pass "--save into a missing directory: exit 2 before training" \
    || { failed "--save into a missing directory: exit $rc"; cat "$WORK/err"; }
# --- OpenBLAS's kernels: a fallback to pre-AVX2 ones on a CPU with AVX2 is replaced (OpenBLAS
# 0.3.21 takes an Emerald Rapids Xeon for a Prescott); a user's OPENBLAS_CORETYPE stands ---
env -u OPENBLAS_CORETYPE -u PIPETRAIN_BLAS_DETECTED "$PIPETRAIN" train --model "$MLP" "${T[@]}" \
    --steps 1 --test-samples 0 --json >"$WORK/blas.json" || failed "run without OPENBLAS_CORETYPE"
check "AVX2 or AVX-512 kernels where the CPU has them" "$WORK/blas.json" '
flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
old = {"Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2",
       "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron(SSE3)", "Barcelona",
       "Nano", "Sandybridge", "Bobcat", "Bulldozer", "Piledriver", "Steamroller"}
if "avx2" in flags and "fma" in flags:
    assert r["blas_core"] not in old, r["blas_core"]
assert (r["blas_core_detected"] is None) == (r["blas_core_detected"] not in old), r'
env -u PIPETRAIN_BLAS_DETECTED OPENBLAS_CORETYPE=PRESCOTT "$PIPETRAIN" train --model "$MLP" \
    "${T[@]}" --steps 1 --test-samples 0 --json >"$WORK/blas_user.json" \
    || failed "run with OPENBLAS_CORETYPE=PRESCOTT"
check "OPENBLAS_CORETYPE=PRESCOTT stands" "$WORK/blas_user.json" '
assert r["blas_core"] == "Prescott" and r["blas_core_detected"] is None, r'

# --- issue 23 items 16, 17, 10: the layout line, untimed steps, checks before profiling ---
layout() { grep -m1 "^layout:" "$WORK/lay.out" || true; }
"$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 1 --test-samples 0 \
    --tensor 2 >"$WORK/lay.out" 2>&1 || true
layout | grep -q "^layout: 1 stage × 2 tensor shards (megatron), 1 micro-batch of 32," \
    && pass "--tensor 2 in the layout line: $(layout)" || { failed "--tensor 2 layout: $(layout)"; }
"$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MODELS/seed-cnn.cfg" "${T[@]}" --steps 1 \
    --test-samples 0 --stages 2 --virtual 2 --schedule interleaved --microbatches 2 \
    --recompute all --partition uniform >"$WORK/lay.out" 2>&1 || true
layout | grep -q "^layout: 2 stages × 2 virtual (4 model chunks), .*schedule interleaved, recompute all," \
    && pass "V and --recompute in the layout line: $(layout)" || failed "V layout: $(layout)"
"$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 1 --test-samples 0 \
    --stages 2 --schedule zb-h1 --microbatches 2 --wgrad batched >"$WORK/lay.out" 2>&1 || true
layout | grep -q "schedule zb-h1, wgrad batched," \
    && pass "--wgrad batched in the layout line: $(layout)" || failed "wgrad layout: $(layout)"
"$PIPETRAIN" train --model "$MLP" --batch 32 --train-samples 32 --threads 1 --steps 1 \
    --test-samples 0 >"$WORK/lay.out"
grep -q "batch 32, 1 step per epoch; 1 step over 1 epoch$" "$WORK/lay.out" \
    && pass "singular: $(grep -m1 '^data:' "$WORK/lay.out")" \
    || failed "plural of one step: $(grep -m1 '^data:' "$WORK/lay.out")"

# the tensor collectives' time is the training steps' (2 steps here), not evaluation's (10000
# test samples, many times longer)
"$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 2 --test-samples 10000 \
    --tensor 2 --json >"$WORK/tev.json"
check "stage_tensor_s leaves evaluation out (at most train_s)" "$WORK/tev.json" '
assert 0 < r["stage_tensor_s"][0] <= r["train_s"], (r["stage_tensor_s"], r["train_s"])'

# --untimed-steps (the old --warmup: an alias that says it is deprecated)
ok_run "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 3 --test-samples 0 \
    --untimed-steps 1 --json >"$WORK/ut.json"
check "--untimed-steps 1 of 3: 2 timed steps" "$WORK/ut.json" '
assert r["untimed_steps"] == 1 and r["warmup"] == 1 and r["timed_steps"] == 2, r'
ok_run "$PIPETRAIN" train --model "$MLP" "${T[@]}" --steps 3 --test-samples 0 --warmup 1 \
    --json >"$WORK/wu.json" 2>"$WORK/wu.err"
grep -q "warmup is deprecated.*--untimed-steps" "$WORK/wu.err" \
    && pass "--warmup still works and says it is deprecated: $(cut -c1-70 "$WORK/wu.err")" \
    || { failed "--warmup alias"; cat "$WORK/wu.err"; }
check "--warmup 1 reads as --untimed-steps 1" "$WORK/wu.json" '
assert r["untimed_steps"] == 1 and r["timed_steps"] == 2, r'
"$PIPETRAIN" train --help >"$WORK/help"
grep -q -- "--untimed-steps N" "$WORK/help" && ! grep -q -- "--warmup" "$WORK/help" \
    && pass "the help names --untimed-steps, not --warmup" || failed "help and --warmup"

# a batch the data cannot fill is refused before the layers are profiled at it (it took
# 36 s and 3.5 GB, then said "out of memory")
t0=$(date +%s.%N)
expect_fail "--stages 2 --batch 1048576: refused before profiling" \
    "fewer than one batch of 1048576" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MLP" --stages 2 --batch 1048576 --threads 1
secs=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" \
    "$t0" "$(date +%s.%N)")
python3 -c "import sys; sys.exit(float(sys.argv[1]) >= 8)" "$secs" \
    && pass "refused in $secs s" || failed "--batch 1048576 took $secs s to refuse"
finish
