# The step's finish and the optimizer options (train --optimizer adamw, --lr-schedule,
# --lr-warmup, --lr-min, --clip-grad-norm): AdamW with a cosine schedule, warm-up and
# gradient clipping gives parameters bit-identical to one process as a 2-stage pipeline and
# as 2 replicas (--reduce ordered), and the same per-step learning rates and gradient norms
# (metrics file); with tensor shards the norm agrees within rounding; on the (mock) CUDA
# engine it is bit-identical to the CPU. Clipping to a tiny norm changes the result, to a
# huge one does not; bad values end every rank with exit 2.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
B=32
COMMON=(--model "$MODELS/seed-mlp.cfg" --batch $B --steps 5 --train-samples 256 --test-samples 0
        --seed 5 --threads 1 --json)
OPT=(--optimizer adamw --lr 0.01 --lr-schedule cosine --lr-warmup 2 --clip-grad-norm 0.5)
"$PIPETRAIN" train "${COMMON[@]}" --steps 1 --optimizer sgd --lr 0 --save "$WORK/init.st" >/dev/null

# run NAME RANKS ARGS...: NAME.st, NAME.jsonl (a metrics line per step)
run() {
    local name=$1 n=$2
    shift 2
    local args=("${COMMON[@]}" --load "$WORK/init.st" --save "$WORK/$name.st"
                --metrics "$WORK/$name.jsonl" --log-every 1 "$@")
    if [ "$n" -eq 1 ]; then "$PIPETRAIN" train "${args[@]}" >"$WORK/$name.json"
    else "$MPIEXEC" -n "$n" "$PIPETRAIN" train "${args[@]}" >"$WORK/$name.json"; fi
}

# steps NAME: "lr norm" of every step line
steps() {
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("type") == "step": print(d["step"], repr(d["lr"]), repr(d["grad_norm"]))
' "$WORK/$1.jsonl"
}

# same LABEL A B: bit-identical parameters and the same learning rates and norms
same() {
    if "$PIPETRAIN" diff "$WORK/$2.st" "$WORK/$3.st" >"$WORK/diff" 2>&1 &&
        [ "$(steps "$2")" = "$(steps "$3")" ]; then
        pass "$1: bit-identical parameters, learning rates and gradient norms"
    else
        failed "$1 differs"; tail -n 2 "$WORK/diff"; paste <(steps "$2") <(steps "$3")
    fi
}

run ref 1 "${OPT[@]}" --microbatches 2
# the schedule: warm-up 0.005, 0.01, then cosine over the 3 remaining steps; every step's
# norm reported
want="1 0.005 2 0.01 3 0.01 4 0.0075 5 0.0025"
got=$(steps ref | awk '{printf "%s %.4g ", $1, $2}')
[ "$got" = "$want " ] && pass "learning rates per step: $got" \
    || failed "learning rates per step: '$got', expected '$want'"
steps ref | awk '$3 == "None" || $3 <= 0 {bad = 1} END {exit bad}' \
    && pass "a gradient norm on every step line" || { failed "missing norms"; steps ref; }

run pipe 2 "${OPT[@]}" --microbatches 2 --stages 2
same "2 stages (1f1b)" pipe ref
run pipe_zb 2 "${OPT[@]}" --microbatches 2 --stages 2 --schedule zb-h1
same "2 stages (zb-h1)" pipe_zb ref
# replica r's micro-batch is the one-process run's micro-batch r (hybrid_equivalence.sh)
run rep 2 "${OPT[@]}" --microbatches 1 --replicas 2 --reduce ordered
same "2 replicas, reduce ordered" rep ref
# reduce-bcast: one replica steps and broadcasts; the norm is replica 0's, within rounding
run bcast 2 "${OPT[@]}" --microbatches 1 --replicas 2 --reduce reduce-bcast
"$PIPETRAIN" diff "$WORK/bcast.st" "$WORK/ref.st" --rtol 1e-3 >"$WORK/diff" 2>&1 \
    && pass "2 replicas, reduce-bcast: within 1e-3 ($(tail -n 1 "$WORK/diff" | grep -o 'difference [^ ]*'))" \
    || { failed "2 replicas, reduce-bcast"; tail -n 2 "$WORK/diff"; }

# tensor shards: the norm counts each shard once and a bias that both ranks hold once (the
# megatron pair's second layer): the first step's norm (same parameters) agrees with one
# process's within rounding; SGD with clipping then stays within 1e-5
run tref 1 --optimizer sgd --lr 0.5 --clip-grad-norm 0.5
run tp 2 --optimizer sgd --lr 0.5 --clip-grad-norm 0.5 --tensor 2
a=$(steps tref | awk 'NR == 1 {print $3}'); b=$(steps tp | awk 'NR == 1 {print $3}')
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * a)' "$a" "$b" \
    && pass "--tensor 2: first gradient norm $b, one process $a" \
    || failed "--tensor 2: first gradient norm $b, one process $a"
"$PIPETRAIN" diff "$WORK/tp.st" "$WORK/tref.st" --rtol 1e-5 >"$WORK/diff" 2>&1 \
    && pass "--tensor 2, SGD clipped: within 1e-5 of one process" \
    || { failed "--tensor 2, SGD clipped"; tail -n 2 "$WORK/diff"; }

# a checkpoint of step 3 of the 5-step run, resumed: the schedule continues from step 3
# (the run's step counter), so the result is the uninterrupted run's
args=("${COMMON[@]}" --load "$WORK/init.st" "${OPT[@]}" --microbatches 2)
"$PIPETRAIN" train "${args[@]}" --checkpoint-dir "$WORK/ck" --checkpoint-every 3 >/dev/null
rm "$WORK/ck/ckpt-0000000005.safetensors"
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" "${OPT[@]}" --microbatches 2 --stages 2 \
    --resume "$WORK/ck" --save "$WORK/resumed.st" >"$WORK/resumed.json"
from=$(json_field resumed_from_step <"$WORK/resumed.json")
"$PIPETRAIN" diff "$WORK/resumed.st" "$WORK/ref.st" >"$WORK/diff" 2>&1 && [ "$from" = 3 ] \
    && pass "resumed at step $from on 2 stages: bit-identical to the uninterrupted run" \
    || { failed "resumed at step '$from'"; tail -n 2 "$WORK/diff"; }
expect_fail "resuming with another schedule" "written with --lr_schedule cosine" \
    "$PIPETRAIN" train "${COMMON[@]}" --optimizer adamw --lr 0.01 --lr-schedule linear \
    --lr-warmup 2 --clip-grad-norm 0.5 --resume "$WORK/ck"

# clipping acts: to a tiny norm it changes the result; to a huge one nothing (the factor
# is 1), so the run equals the one without clipping
NOCLIP=(--optimizer adamw --lr 0.01 --lr-schedule cosine --lr-warmup 2)
run noclip 1 "${NOCLIP[@]}" --microbatches 2
run tiny 1 "${NOCLIP[@]}" --microbatches 2 --clip-grad-norm 1e-4
run huge 1 "${NOCLIP[@]}" --microbatches 2 --clip-grad-norm 1e6
"$PIPETRAIN" diff "$WORK/huge.st" "$WORK/noclip.st" >/dev/null \
    && pass "--clip-grad-norm 1e6: identical to no clipping" \
    || failed "--clip-grad-norm 1e6 changed the parameters"
if "$PIPETRAIN" diff "$WORK/tiny.st" "$WORK/noclip.st" >/dev/null; then
    failed "--clip-grad-norm 1e-4: identical to no clipping (the clip did nothing)"
else
    pass "--clip-grad-norm 1e-4 changes the parameters"
fi
grep -q '"grad_norm":null' "$WORK/noclip.jsonl" && pass "no clipping: grad_norm null" \
    || failed "no clipping: grad_norm not null"
# AdamW's default decay is torch's 0.01, and it is not Adam
run adamw_wd 1 "${NOCLIP[@]}" --microbatches 2 --weight-decay 0.01
"$PIPETRAIN" diff "$WORK/adamw_wd.st" "$WORK/noclip.st" >/dev/null \
    && pass "adamw: default --weight-decay 0.01" || failed "adamw: the default decay is not 0.01"
run adam 1 --optimizer adam --lr 0.01 --lr-schedule cosine --lr-warmup 2 --microbatches 2
"$PIPETRAIN" diff "$WORK/adam.st" "$WORK/noclip.st" >/dev/null \
    && failed "adamw gave Adam's parameters" || pass "adamw differs from adam"

# a language model with a tied head (the head keeps a copy of wte; the step sums the two
# gradients into both): one stage adds them locally, 2 stages all-reduce them between the
# first and last rank, 2 replicas do it after their reduction; all bit-identical. A
# checkpoint stores the matrix once (the head loads wte's), so a run resumed from step 2
# ends bit-identical to the uninterrupted one only if the copies were equal at step 2.
cat >"$WORK/tied.cfg" <<'CFG'
[net]
[embedding]
vocab=256
context=16
width=32
[block]
heads=2
[block]
heads=2
[layernorm]
[lm_head]
tied=1
CFG
GPT=(--model "$WORK/tied.cfg" --text "$(readme_corpus)" --batch 8 --steps 3 --seed 5
     --threads 1 --json --optimizer adamw --lr 0.003 --lr-schedule cosine --lr-warmup 1
     --clip-grad-norm 0.5)
gpt() { # gpt NAME RANKS ARGS...
    local name=$1 n=$2
    shift 2
    local cmd=("$PIPETRAIN" train "${GPT[@]}" --save "$WORK/$name.st" "$@")
    [ "$n" -gt 1 ] && cmd=("$MPIEXEC" -n "$n" "${cmd[@]}")
    "${cmd[@]}" >"$WORK/$name.json"
}
gpt_same() { # gpt_same LABEL A B
    "$PIPETRAIN" diff "$WORK/$2.st" "$WORK/$3.st" >"$WORK/diff" 2>&1 \
        && pass "tied GPT, $1: bit-identical" || { failed "tied GPT, $1"; tail -n 2 "$WORK/diff"; }
}
gpt gref 1 --microbatches 2 --checkpoint-dir "$WORK/gck" --checkpoint-every 2
gpt gpipe 2 --microbatches 2 --stages 2
gpt_same "2 stages (the tie between ranks)" gpipe gref
gpt grep 2 --microbatches 1 --replicas 2 --reduce ordered
gpt_same "2 replicas" grep gref
rm "$WORK/gck/ckpt-0000000003.safetensors"
gpt gres 1 --microbatches 2 --resume "$WORK/gck"
gpt_same "resumed at step 2 from a checkpoint holding wte once" gres gref
gpt gres2 2 --microbatches 2 --stages 2 --resume "$WORK/gck"
gpt_same "resumed at step 2 on 2 stages" gres2 gref

# the (mock) CUDA engine: the same bits as the CPU (micro-batches of 16, one chunk each)
if [ -n "${CUDA_MOCK_PLUGIN:-}" ] && [ -f "$CUDA_MOCK_PLUGIN" ]; then
    export PIPETRAIN_CUDA_PLUGIN=$CUDA_MOCK_PLUGIN PT_MOCK_CUDA_MODE=2
    run cuda 1 "${OPT[@]}" --microbatches 2 --device cuda
    same "--device cuda (mock)" cuda ref
    run cuda_pipe 2 "${OPT[@]}" --microbatches 2 --device cuda --stages 2
    same "--device cuda (mock), 2 stages" cuda_pipe ref
    unset PIPETRAIN_CUDA_PLUGIN PT_MOCK_CUDA_MODE
else
    echo "note: no mock CUDA plugin built here; the CUDA engine's AdamW is not run"
fi

# bad values: a message and exit 2, on every rank
bad() { # bad LABEL PATTERN ARGS...
    local label=$1 pattern=$2 rc=0
    shift 2
    timeout 60 "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --stages 2 "$@" \
        >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 2 ] && grep -q -- "$pattern" "$WORK/err"; then
        pass "$label: exit 2, $(grep -m1 -- "$pattern" "$WORK/err")"
    else
        failed "$label: exit $rc"; cat "$WORK/err"
    fi
}
bad "negative clip" "clip-grad-norm" --clip-grad-norm -1
bad "zero clip" "must be positive" --clip-grad-norm 0
bad "unknown schedule" "lr-schedule" --lr-schedule step
bad "warm-up longer than the run" "longer than the run's 5 steps" --lr-warmup 6
bad "floor above the peak" "is above --lr" --lr-schedule cosine --lr 0.01 --lr-min 0.1
bad "floor of a constant schedule" "not of constant" --lr-min 0.001
bad "beta2 of 1" "below 1" --optimizer adamw --beta2 1
finish
