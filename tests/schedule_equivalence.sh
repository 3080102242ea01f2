# The schedules beyond 1F1B must give parameters bit-identical to one process with the same
# micro-batches: interleaved (virtual stages), zb-h1 (split backward), recomputation, and
# with replicas; batched weight gradients (--wgrad batched) identical between layouts and
# within 1e-4 of per-micro-batch ones after 3 Adam steps; and evaluation through
# interleaved chunks equal to the one-process evaluation. seed-cnn has dropout, so the
# recomputed masks must agree too. Each comparison can fail: a different seed must differ.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
source "$(dirname "$0")/lib/schedule_runs.bash"

for M in 4 8; do run "$WORK/ref_$M.st" 1 --microbatches $M; done
# interleaved takes M a multiple of K: for K = 3, batch 12 in 6 micro-batches
run "$WORK/ref_b12_6.st" 1 --batch 12 --microbatches 6
run "$WORK/wb_4.st" 1 --microbatches 4 --wgrad batched

check() { # check NAME REF RANKS ARGS...
    local name=$1 ref=$2 k=$3
    shift 3
    local out="$WORK/$(echo "$name" | tr -c 'a-zA-Z0-9' _).st"
    if ! run "$out" "$k" "$@"; then
        failed "$name: run failed"; tail -n 3 "$out.err"; return
    fi
    if ! "$PIPETRAIN" diff "$out" "$ref" >"$WORK/diff" 2>&1; then
        failed "$name: differs from one process"; tail -n 2 "$WORK/diff"; return
    fi
    if [ "$(test_loss "$out")" != "$(test_loss "${ref}")" ]; then
        failed "$name: test loss $(test_loss "$out") != $(test_loss "$ref")"; return
    fi
    # the micro-batches each stage held at most: what the verifier bounds, exactly
    local held bound
    held=$(json_field stage_peak_microbatches <"$out.json")
    bound=$(json_field stage_peak_microbatches_bound <"$out.json")
    if [ "$held" != "$bound" ]; then
        failed "$name: peak micro-batches held $held, the verifier's bound $bound"; return
    fi
    pass "$name: bit-identical to one process (parameters and test loss), held $held = bound"
}

# interleaved: K stages x V chunks (seed-cnn has 11 layers: K·V <= 11)
check "interleaved K=2 V=2 M=4" "$WORK/ref_4.st" 2 --stages 2 --schedule interleaved --virtual 2 --microbatches 4
check "interleaved K=3 V=2 M=6" "$WORK/ref_b12_6.st" 3 --stages 3 --schedule interleaved --virtual 2 --batch 12 --microbatches 6
check "interleaved K=2 V=3 M=8" "$WORK/ref_8.st" 2 --stages 2 --schedule interleaved --virtual 3 --microbatches 8
check "interleaved K=4 V=2 M=8" "$WORK/ref_8.st" 4 --stages 4 --schedule interleaved --virtual 2 --microbatches 8
# zero bubble
check "zb-h1 K=2 M=4" "$WORK/ref_4.st" 2 --stages 2 --schedule zb-h1 --microbatches 4
check "zb-h1 K=3 M=8" "$WORK/ref_8.st" 3 --stages 3 --schedule zb-h1 --microbatches 8
check "zb-h1 K=4 M=8" "$WORK/ref_8.st" 4 --stages 4 --schedule zb-h1 --microbatches 8
# recomputation (dropout masks rebuilt)
check "1f1b K=2 M=4 recompute all" "$WORK/ref_4.st" 2 --stages 2 --microbatches 4 --recompute all
check "gpipe K=3 M=8 recompute 1" "$WORK/ref_8.st" 3 --stages 3 --schedule gpipe --microbatches 8 --recompute 1
check "zb-h1 K=2 M=8 recompute all" "$WORK/ref_8.st" 2 --stages 2 --schedule zb-h1 --microbatches 8 --recompute all
check "interleaved K=3 V=2 M=6 recompute 0,2" "$WORK/ref_b12_6.st" 3 --stages 3 --schedule interleaved --virtual 2 --batch 12 --microbatches 6 --recompute 0,2
# with replicas: the fixed-order reduction reproduces one process with R·M micro-batches
check "zb-h1 K=2 x R=2 M=2 ordered" "$WORK/ref_4.st" 4 --stages 2 --replicas 2 --schedule zb-h1 --microbatches 2 --reduce ordered
check "zb-h1 K=2 x R=2 M=2 ordered overlap off" "$WORK/ref_4.st" 4 --stages 2 --replicas 2 --schedule zb-h1 --microbatches 2 --reduce ordered --overlap off
check "zb-h1 K=2 x R=2 M=2 ordered recompute" "$WORK/ref_4.st" 4 --stages 2 --replicas 2 --schedule zb-h1 --microbatches 2 --reduce ordered --recompute all
check "interleaved K=2 V=2 x R=2 M=2 ordered" "$WORK/ref_4.st" 4 --stages 2 --replicas 2 --schedule interleaved --virtual 2 --microbatches 2 --reduce ordered
check "interleaved K=2 V=2 x R=2 M=2 ordered overlap off" "$WORK/ref_4.st" 4 --stages 2 --replicas 2 --schedule interleaved --virtual 2 --microbatches 2 --reduce ordered --overlap off
# the other reduction methods sum in another order: within 1e-6 after 3 SGD steps
SGD=(--optimizer sgd --lr 0.05 --test-samples 0)
run "$WORK/sgd_4.st" 1 --microbatches 4 "${SGD[@]}"
for method in allreduce reduce-bcast gather-bcast; do
    out="$WORK/il_$method.st"
    if run "$out" 4 --stages 2 --replicas 2 --schedule interleaved --virtual 2 --microbatches 2 \
            --reduce $method "${SGD[@]}" \
        && "$PIPETRAIN" diff "$out" "$WORK/sgd_4.st" --rtol 1e-6 >"$WORK/diff" 2>&1; then
        pass "interleaved K=2 V=2 x R=2 --reduce $method: within 1e-6 of one process (SGD)"
    else
        failed "interleaved x replicas --reduce $method"; tail -n 3 "$out.err" "$WORK/diff"
    fi
done
# batched weight gradients: the same in every layout and thread count
check "wgrad batched, 2 threads" "$WORK/wb_4.st" 1 --microbatches 4 --wgrad batched --threads 2
check "wgrad batched 1f1b K=2" "$WORK/wb_4.st" 2 --stages 2 --microbatches 4 --wgrad batched
check "wgrad batched zb-h1 K=3" "$WORK/wb_4.st" 3 --stages 3 --schedule zb-h1 --microbatches 4 --wgrad batched
check "wgrad batched interleaved K=2 V=2" "$WORK/wb_4.st" 2 --stages 2 --schedule interleaved --virtual 2 --microbatches 4 --wgrad batched
check "wgrad batched gpipe K=2 recompute" "$WORK/wb_4.st" 2 --stages 2 --schedule gpipe --microbatches 4 --wgrad batched --recompute all
if "$PIPETRAIN" diff "$WORK/wb_4.st" "$WORK/ref_4.st" --rtol 1e-4 >"$WORK/diff" 2>&1; then
    pass "wgrad batched within 1e-4 of per-micro-batch gradients after 3 Adam steps ($(tail -n 1 "$WORK/diff" | grep -o 'difference [^ ]*'))"
else
    failed "wgrad batched vs per-micro-batch"; tail -n 2 "$WORK/diff"
fi
# checkpoints of an interleaved run (chunks gathered into the model's order) resume
# bit-identical, in the same layout and in another schedule
R=(--model "$MODELS/seed-cnn.cfg" --batch 16 --train-samples 256 --test-samples 0 --seed 7
   --threads 1 --json --optimizer adam --lr 0.001 --microbatches 4)
"$PIPETRAIN" train "${R[@]}" --load "$WORK/init.st" --steps 6 --save "$WORK/full6.st" >/dev/null
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${R[@]}" --load "$WORK/init.st" --steps 3 --stages 2 \
    --schedule interleaved --virtual 2 --checkpoint-dir "$WORK/ck" --checkpoint-every 3 >/dev/null
for to in "interleaved --virtual 2" "zb-h1"; do
    # shellcheck disable=SC2086
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${R[@]}" --steps 6 --stages 2 --schedule $to \
        --resume "$WORK/ck" --save "$WORK/res.st" >/dev/null 2>"$WORK/res.err" \
        && "$PIPETRAIN" diff "$WORK/res.st" "$WORK/full6.st" >/dev/null \
        && pass "interleaved checkpoint at step 3 resumed as $to: bit-identical to 6 steps" \
        || { failed "interleaved checkpoint resumed as $to"; tail -n 3 "$WORK/res.err"; }
done
# the comparisons can fail
run "$WORK/other.st" 2 --stages 2 --schedule zb-h1 --microbatches 4 --seed 8
if "$PIPETRAIN" diff "$WORK/other.st" "$WORK/ref_4.st" >/dev/null 2>&1; then
    failed "a different seed gave the same parameters: the comparison cannot fail"
else
    pass "a different seed differs"
fi
if "$PIPETRAIN" diff "$WORK/wb_4.st" "$WORK/ref_4.st" >/dev/null 2>&1; then
    failed "batched and per-micro-batch weight gradients bit-identical: the comparison is void"
else
    pass "batched weight gradients differ in the last bits from per-micro-batch ones"
fi
finish
