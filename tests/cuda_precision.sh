# --precision fp32|tf32|bf16 (issue 25) through the mock CUDA plugin, whose dense and conv
# kernels round each product operand as the GPU does (tf32: 10-bit mantissa, bf16: 7-bit,
# to nearest even, tests/cuda/mock_cuda.c) and then multiply in float32 on the CPU:
#   - fp32 stays bit-identical to the CPU engine;
#   - tf32 and bf16 differ from fp32 (the rounding is applied) and from each other, and
#     stay within the relative tolerances measured below (pipetrain diff --rtol);
#   - bf16 as a 2-stage pipeline and as 2 replicas (--reduce ordered) is bit-identical to
#     one rank with the same micro-batches (the rounding is per product, so layouts agree);
#   - --device cpu with tf32 (bf16 on the CPU: tests/cpu_bf16.sh), and a bad value, exit 2
#     with their message.
# Tolerances: SGD (Adam's update is about lr whatever the gradient's size, so a gradient
# near 0 turns tiny differences into lr-sized ones: no measure of rounding), the largest
# relative difference of any tensor, measured here (2026-11): gpt-nano 3 steps tf32
# 5.2e-4, bf16 4.9e-3; seed-cnn 4 steps tf32 8.0e-4, bf16 9.3e-3 (other seeds: seed-cnn
# up to 1.1e-2 and 2.3e-2, where a ReLU or max-pool flips). Checked at 2e-3 and 2e-2;
# experiments/cuda/validate.sh step 11 allows ten times the figures on a GPU (an H200 gave
# gpt-nano 5.2e-4 and 4.9e-3, seed-cnn 7.1e-4 and 6.2e-3 for these options).
source "$(dirname "$0")/lib/common.bash"
require_cuda_mock
RTOL_TF32=2e-3
RTOL_BF16=2e-2
LM=(--model "$MODELS/gpt-nano.cfg" --text "$(readme_corpus)" --batch 8 --steps 3
    --seed 5 --threads 1 --eval-windows 4 --optimizer sgd --lr 0.5 --json)
CNN=(--model "$MODELS/seed-cnn.cfg" --batch 16 --steps 4 --train-samples 256
     --test-samples 64 --seed 3 --threads 1 --optimizer sgd --lr 0.05 --json)

# run NAME ARGS...: pipetrain train ARGS on the mock GPU, parameters to $WORK/NAME.st
run() {
    local name=$1; shift
    if ! cuda "$@" --save "$WORK/$name.st" >"$WORK/$name.json" 2>"$WORK/err"; then
        failed "$name: run failed"; cat "$WORK/err"; return 1
    fi
}
differs() { ! "$PIPETRAIN" diff "$1" "$2" >/dev/null 2>&1; }

for model in LM CNN; do
    declare -n args=$model
    name=$([ $model = LM ] && echo gpt-nano || echo seed-cnn)
    "$PIPETRAIN" train "${args[@]}" --microbatches 2 --save "$WORK/$model.cpu.st" \
        >/dev/null || failed "$name on the CPU: run failed"
    for p in fp32 tf32 bf16; do
        run "$model.$p" "$PIPETRAIN" train "${args[@]}" --microbatches 2 --device cuda \
            --precision $p || continue
        got=$(json_field precision <"$WORK/$model.$p.json")
        [ "$got" = $p ] && pass "$name $p: --json reports precision $p" \
            || failed "$name $p: --json reports precision '$got'"
    done
    "$PIPETRAIN" diff "$WORK/$model.fp32.st" "$WORK/$model.cpu.st" >/dev/null \
        && pass "$name fp32 on the mock GPU: bit-identical to the CPU engine" \
        || failed "$name fp32 on the mock GPU differs from the CPU engine"
    for p in tf32 bf16; do
        differs "$WORK/$model.$p.st" "$WORK/$model.fp32.st" \
            && pass "$name $p: not identical to fp32 (the rounding is applied)" \
            || failed "$name $p: identical to fp32: the operands were not rounded"
        tol=$([ $p = tf32 ] && echo $RTOL_TF32 || echo $RTOL_BF16)
        if "$PIPETRAIN" diff "$WORK/$model.$p.st" "$WORK/$model.fp32.st" --rtol "$tol" \
            >"$WORK/diff"; then
            pass "$name $p within $tol of fp32: $(tail -n 1 "$WORK/diff")"
        else
            failed "$name $p beyond $tol of fp32:"; grep EXCEEDS "$WORK/diff" | head -n 5
        fi
    done
    differs "$WORK/$model.tf32.st" "$WORK/$model.bf16.st" \
        && pass "$name: tf32 and bf16 differ" || failed "$name: tf32 and bf16 are identical"
    unset -n args
done

# bf16 layouts: the same micro-batches give the same bits.
for layout in "2 stages:--stages 2 --microbatches 2" \
    "2 replicas, ordered:--replicas 2 --reduce ordered --microbatches 1"; do
    IFS=: read -r name extra <<<"$layout"
    # shellcheck disable=SC2086
    run "lm_bf16_${name// /_}" timeout 120 "$MPIEXEC" -n 2 "$PIPETRAIN" train "${LM[@]}" \
        --device cuda --precision bf16 $extra || continue
    "$PIPETRAIN" diff "$WORK/lm_bf16_${name// /_}.st" "$WORK/LM.bf16.st" >"$WORK/diff" \
        && pass "gpt-nano bf16, $name: bit-identical to one rank" \
        || { failed "gpt-nano bf16, $name: differs from one rank"; tail -n 3 "$WORK/diff"; }
done
run cnn_bf16_2stages timeout 120 "$MPIEXEC" -n 2 "$PIPETRAIN" train "${CNN[@]}" \
    --device cuda --precision bf16 --stages 2 --microbatches 2 &&
    { "$PIPETRAIN" diff "$WORK/cnn_bf16_2stages.st" "$WORK/CNN.bf16.st" >/dev/null \
        && pass "seed-cnn bf16, 2 stages: bit-identical to one rank" \
        || failed "seed-cnn bf16, 2 stages: differs from one rank"; }

refused "--device cpu --precision tf32" "tf32 is for --device cuda" \
    "$PIPETRAIN" train "${CNN[@]}" --precision tf32
refused "--precision fp16" "expected fp32, tf32 or bf16" \
    cuda "$PIPETRAIN" train "${LM[@]}" --device cuda --precision fp16
finish
