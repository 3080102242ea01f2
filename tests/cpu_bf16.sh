#!/usr/bin/env bash
# bf16 products on the CPU (train --precision bf16 --device cpu; kernels/bf16.h): the dense,
# conv and blocks' products with operands rounded to bfloat16 and float32 sums, through
# oneDNN. gpt-nano for 6 steps of SGD: within 2e-2 of fp32 but not its bits (the products
# rounded: the comparison can fail); with the same micro-batches 2 stages (1f1b, zb-h1),
# 2 replicas (--reduce ordered) and 2 threads are bit-identical to one process in bf16, as
# in fp32; --wgrad batched within 1e-4 of per-micro-batch (but not its bits) and, as 2
# stages under zb-h1, bit-identical to one process; seed-cnn within 2e-2 of fp32, as 2
# stages bit-identical to one process; a seed MLP learns in bf16 as in fp32 (losses within
# 2%); after 4 SGD steps bf16 is within the tolerance of torch's bf16-operand products
# (tests/golden/gpt_autocast.json's "operands" run) and fp32 is not; plan --precision bf16
# keeps its own profile in a costs file. tf32 on the CPU (no
# such unit): exit 2 and the reason (every rank ends). Skipped (77) where the CPU has no
# AVX512_BF16.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
NANO=$MODELS/gpt-nano.cfg
if ! "$PIPETRAIN" train --model "$NANO" --data text --batch 4 --steps 1 --threads 1 \
        --precision bf16 >"$WORK/probe.out" 2>&1; then
    grep -q "AVX512_BF16" "$WORK/probe.out" && { cat "$WORK/probe.out"; exit 77; }
    failed "--precision bf16 on the CPU: $(tail -n 2 "$WORK/probe.out")"
    finish
fi
COMMON=(--data text --batch 16 --seed 5 --optimizer sgd --lr 0.5 --steps 6 --eval-windows 1)

# run NAME RANKS ARGS...: $WORK/NAME.st (parameters), .out, .err
run() {
    local name=$1 n=$2
    shift 2
    local cmd=("$PIPETRAIN" train --model "$NANO" "${COMMON[@]}" --save "$WORK/$name.st" "$@")
    [ "$n" -gt 1 ] && cmd=("$MPIEXEC" -n "$n" "${cmd[@]}")
    if ! timeout 120 "${cmd[@]}" >"$WORK/$name.out" 2>"$WORK/$name.err"; then
        failed "$name: exit non-zero: $(tail -n 3 "$WORK/$name.err")"
        return 1
    fi
}

run fp32 1 --microbatches 2 --threads 1
run bf16 1 --microbatches 2 --threads 1 --precision bf16
same_params "bf16 within 2e-2 of fp32" bf16 fp32 2e-2
if "$PIPETRAIN" diff "$WORK/bf16.st" "$WORK/fp32.st" >/dev/null 2>&1; then
    failed "bf16 is fp32 bit for bit: nothing was rounded"
else
    pass "bf16 rounds otherwise than fp32 (the products in bf16)"
fi
run bf16-t2 1 --microbatches 2 --threads 2 --precision bf16 &&
    same_params "2 threads: the bits of one" bf16-t2 bf16
for s in 1f1b zb-h1; do
    run "bf16-$s" 2 --microbatches 2 --threads 1 --precision bf16 --stages 2 --schedule "$s" &&
        same_params "2 stages, $s: the bits of one process" "bf16-$s" bf16
done
run bf16-r2 2 --microbatches 1 --threads 1 --precision bf16 --replicas 2 --reduce ordered &&
    same_params "2 replicas, ordered: the bits of one process" bf16-r2 bf16

# --wgrad batched: the step's weight gradients in one bf16 product per tile of units; close
# to per-micro-batch but not its bits (the rows summed in one product), and 2 stages under
# zb-h1 give one process's bits. Closeness: 1e-4 (measured 3.2e-5; fp32 4.6e-7: a last-bit
# difference in a weight can move an operand by a bf16 step, 2^-9, in the next product)
run bf16-wb 1 --microbatches 2 --threads 1 --precision bf16 --wgrad batched &&
    same_params "--wgrad batched within 1e-4 of per-micro-batch" bf16-wb bf16 1e-4
"$PIPETRAIN" diff "$WORK/bf16-wb.st" "$WORK/bf16.st" >/dev/null 2>&1 &&
    failed "--wgrad batched: per-micro-batch's bits (nothing batched)" ||
    pass "--wgrad batched rounds otherwise than per-micro-batch"
run bf16-wb-zb 2 --microbatches 2 --threads 1 --precision bf16 --wgrad batched --stages 2 \
    --schedule zb-h1 && same_params "--wgrad batched, 2 stages zb-h1: the bits of one process" \
    bf16-wb-zb bf16-wb

# seed-cnn: its convolutions' products in bf16 too; 2 stages give one process's bits
CNN=(--model "$MODELS/seed-cnn.cfg" --train-samples 256 --test-samples 0 --batch 32 --steps 4
     --threads 1 --seed 4 --microbatches 2 --optimizer sgd --lr 0.1)
for v in "fp32 1" "bf16 1" "bf16 2"; do
    read -r pr n <<<"$v"
    cmd=("$PIPETRAIN" train "${CNN[@]}" --precision "$pr" --stages "$n"
         --save "$WORK/cnn-$pr-$n.st")
    [ "$n" -gt 1 ] && cmd=("$MPIEXEC" -n "$n" "${cmd[@]}")
    timeout 120 "${cmd[@]}" >"$WORK/cnn.out" 2>&1 ||
        failed "seed-cnn $pr on $n: $(tail -n 2 "$WORK/cnn.out")"
done
same_params "seed-cnn bf16 within 2e-2 of fp32" cnn-bf16-1 cnn-fp32-1 2e-2
"$PIPETRAIN" diff "$WORK/cnn-bf16-1.st" "$WORK/cnn-fp32-1.st" >/dev/null 2>&1 &&
    failed "seed-cnn: bf16 is fp32 bit for bit" || pass "seed-cnn: bf16 rounds otherwise than fp32"
same_params "seed-cnn bf16, 2 stages: the bits of one process" cnn-bf16-2 cnn-bf16-1

# a seed MLP learns the same in bf16
for pr in fp32 bf16; do
    "$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" --train-samples 2048 --test-samples 0 \
        --batch 64 --steps 32 --threads 1 --seed 2 --precision "$pr" --json \
        >"$WORK/mlp-$pr.json" 2>"$WORK/mlp-$pr.err" ||
        failed "seed-mlp $pr: $(tail -n 2 "$WORK/mlp-$pr.err")"
done
if python3 - "$WORK/mlp-fp32.json" "$WORK/mlp-bf16.json" <<'PY'
import json, sys
a, b = (json.loads(open(f).read().splitlines()[-1]) for f in sys.argv[1:])
assert b["precision"] == "bf16" and a["precision"] == "fp32", (a["precision"], b["precision"])
la, lb = a["train_loss"], b["train_loss"]
assert abs(la - lb) <= 0.02 * la, (la, lb)
assert a["train_loss"] != b["train_loss"]
PY
then pass "seed-mlp: bf16's loss within 2% of fp32's"; else failed "seed-mlp: bf16's loss"; fi

# against PyTorch: the golden runs of tests/gpt_autocast.sh (torch 1.13 from pipetrain's
# initial parameters), 4 SGD steps; bf16 within the "operands" reference (torch with every
# linear's operands rounded to bf16 and float32 sums) at its tolerance, fp32 beyond it
G=$PT_SOURCE_DIR/tests/golden
read -r model seed batch steps optimizer lr < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(d["model"], d["seed"], d["batch"], d["steps"], d["optimizer"], d["lr"])' "$G/gpt_autocast.json")
for pr in bf16 fp32; do
    "$PIPETRAIN" train --model "$PT_SOURCE_DIR/$model" --text "$G/corpus.txt" --seed "$seed" \
        --batch "$batch" --steps "$steps" --optimizer "$optimizer" --lr "$lr" --threads 1 \
        --eval-windows 1 --metrics "$WORK/torch-$pr.jsonl" --log-every 1 \
        --save "$WORK/torch-$pr.st" --precision "$pr" >"$WORK/torch-$pr.log" 2>&1 ||
        failed "the golden's run in $pr: $(tail -n 2 "$WORK/torch-$pr.log")"
done
mode() { [ "$1" = bf16 ] && echo --within || echo --beyond; }
for pr in bf16 fp32; do
    if python3 "$PT_SOURCE_DIR/tests/lib/autocast_check.py" "$G/gpt_autocast.json" operands \
        "$WORK/torch-$pr.st" "$WORK/torch-$pr.jsonl" "$(mode $pr)" >"$WORK/check.out" 2>&1; then
        pass "$pr against torch's bf16-operand products ($(mode $pr)): $(cat "$WORK/check.out")"
    else
        failed "$pr against torch's bf16-operand products ($(mode $pr)): $(cat "$WORK/check.out")"
    fi
done

# plan --precision bf16 profiles in bf16: its own block in a costs file, read back the next
# time (and fp32's apart)
for pr in bf16 bf16 fp32; do
    "$PIPETRAIN" plan --model "$NANO" --stages 2 --batch 16 --microbatches 2 --precision "$pr" \
        --costs-file "$WORK/nano.costs" >"$WORK/plan.out" 2>&1 ||
        failed "plan --precision $pr: $(tail -n 2 "$WORK/plan.out")"
done
if [ "$(grep -c '^profile .* precision bf16$' "$WORK/nano.costs")" = 1 ] &&
   [ "$(grep -c '^profile ' "$WORK/nano.costs")" = 2 ]; then
    pass "plan --precision bf16: one bf16 profile, read again, beside fp32's"
else
    failed "plan --precision bf16's costs file:"; grep '^profile' "$WORK/nano.costs"
fi

# refused: every rank ends with 2 (option errors are said once)
refused() {
    local what=$1 want=$2
    shift 2
    local rc=0
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$NANO" --data text --batch 8 --steps 1 \
        --stages 2 "$@" >"$WORK/bad.out" 2>"$WORK/bad.err" || rc=$?
    if [ "$rc" -eq 2 ] && grep -q -- "$want" "$WORK/bad.err"; then
        pass "$what: exit 2 with the reason"
    else
        failed "$what: exit $rc"; cat "$WORK/bad.err"
    fi
}
refused "tf32 on the CPU" "a CPU has no TF32 unit" --precision tf32
finish
