# The V schedules (zb-v, v-half, v-min, dualpipev: model chunks k and 2K-1-k on rank k, a
# rank's own hand-over between its chunks) and zb-h2 must give parameters and a test loss
# bit-identical to one process with the same micro-batches, hold exactly the micro-batches
# the verifier bounds, and write checkpoints in the model's order (resumed under 1f1b); bad
# V input exits 2 on every rank with a message. Each comparison can fail: another seed
# differs.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
source "$(dirname "$0")/lib/schedule_runs.bash"

for M in 4 8; do run "$WORK/ref_$M.st" 1 --microbatches $M; done

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
    local held bound
    held=$(json_field stage_peak_microbatches <"$out.json")
    bound=$(json_field stage_peak_microbatches_bound <"$out.json")
    if [ "$held" != "$bound" ]; then
        failed "$name: peak chunk activations held $held, the verifier's bound $bound"; return
    fi
    pass "$name: bit-identical to one process (parameters and test loss), held $held = bound"
}

for s in zb-v v-half v-min; do
    check "$s K=2 M=4" "$WORK/ref_4.st" 2 --stages 2 --schedule $s --microbatches 4
    check "$s K=4 M=8" "$WORK/ref_8.st" 4 --stages 4 --schedule $s --microbatches 8
done
check "dualpipev K=2 M=4" "$WORK/ref_4.st" 2 --stages 2 --schedule dualpipev --microbatches 4
check "dualpipev K=4 M=8" "$WORK/ref_8.st" 4 --stages 4 --schedule dualpipev --microbatches 8
check "zb-h2 K=2 M=4" "$WORK/ref_4.st" 2 --stages 2 --schedule zb-h2 --microbatches 4
check "zb-h2 K=4 M=8" "$WORK/ref_8.st" 4 --stages 4 --schedule zb-h2 --microbatches 8
check "zb-v K=2 M=8 recompute all" "$WORK/ref_8.st" 2 --stages 2 --schedule zb-v --microbatches 8 --recompute all
check "zb-v K=2 x R=2 M=2 ordered" "$WORK/ref_4.st" 4 --stages 2 --replicas 2 --schedule zb-v --microbatches 2 --reduce ordered

# a zb-v checkpoint holds the model's order: resumed under 1f1b it continues bit for bit
R=(--model "$MODELS/seed-cnn.cfg" --batch 16 --train-samples 256 --test-samples 0 --seed 7
   --threads 1 --json --optimizer adam --lr 0.001 --microbatches 4)
"$PIPETRAIN" train "${R[@]}" --load "$WORK/init.st" --steps 6 --save "$WORK/full6.st" >/dev/null
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${R[@]}" --load "$WORK/init.st" --steps 3 --stages 2 \
    --schedule zb-v --checkpoint-dir "$WORK/ck" --checkpoint-every 3 >/dev/null
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${R[@]}" --steps 6 --stages 2 --schedule 1f1b \
    --resume "$WORK/ck" --save "$WORK/res.st" >/dev/null 2>"$WORK/res.err" \
    && "$PIPETRAIN" diff "$WORK/res.st" "$WORK/full6.st" >/dev/null \
    && pass "zb-v checkpoint at step 3 resumed as 1f1b: bit-identical to 6 steps" \
    || { failed "zb-v checkpoint resumed as 1f1b"; tail -n 3 "$WORK/res.err"; }

# bad input: exit 2 on every rank, with the reason
bad() { # bad NAME PATTERN ARGS...
    local name=$1 pat=$2
    shift 2
    local rc=0
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" "$@" >"$WORK/bad.out" 2>"$WORK/bad.err" ||
        rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pat" "$WORK/bad.err"; then
        pass "$name: exit 2, \"$(grep -m1 -o -- "$pat.*" "$WORK/bad.err" | cut -c1-80)\""
    else
        failed "$name: exit $rc"; cat "$WORK/bad.err"
    fi
}
bad "zb-v with 3 chunks per rank" "even number of chunks" --stages 2 --schedule zb-v --virtual 3 --microbatches 4
bad "dualpipev with M < 2K" "at least 2 micro-batches per stage" --stages 2 --schedule dualpipev --microbatches 2 --batch 16

# the CPU engine's message buffers by liveness, as `schedule` prints them (ZB-V at K = 4,
# M = 8: schedule_send_buffers' counts, which test_schedule_v checks against the events)
if "$PIPETRAIN" schedule --schedule zb-v --stages 4 --microbatches 8 >"$WORK/buf.out" &&
    grep -q "gradients are sent from per stage (per chunk): 2 (0+2) 6 (4+2) 5 (3+2) 3 (2+1)$" \
        "$WORK/buf.out" &&
    grep -q "activations are received into per stage (per chunk): 4 (0+4) 9 (5+4) " \
        "$WORK/buf.out" &&
    grep -q "gradients are received into per stage (per chunk): 4 (4+0) 8 (4+4) " \
        "$WORK/buf.out"
then pass "schedule: zb-v's message buffers per chunk (received into, gradients sent from)"
else failed "schedule: zb-v's buffers: $(grep 'buffers' "$WORK/buf.out")"; fi

# schedules as text: saved, loaded back identical; a broken line is named
"$PIPETRAIN" schedule --schedule zb-v --stages 2 --microbatches 4 --save-schedule "$WORK/zbv.txt" >"$WORK/a.out"
"$PIPETRAIN" schedule --schedule-file "$WORK/zbv.txt" --save-schedule "$WORK/zbv2.txt" >"$WORK/b.out"
cmp -s "$WORK/zbv.txt" "$WORK/zbv2.txt" && cmp -s "$WORK/a.out" "$WORK/b.out" \
    && pass "schedule --save-schedule / --schedule-file: the same lists and timeline" || failed "schedule --save/--load"
sed '5s/.*/0 F 9 0 -1 -1/' "$WORK/zbv.txt" >"$WORK/bad.txt"
rc=0; "$PIPETRAIN" schedule --schedule-file "$WORK/bad.txt" >/dev/null 2>"$WORK/bad.err" || rc=$?
[ $rc -eq 2 ] && grep -q "bad.txt line 5: the verifier rejects" "$WORK/bad.err" \
    && pass "a schedule file the verifier rejects: exit 2, its line named" \
    || { failed "bad schedule file: exit $rc"; cat "$WORK/bad.err"; }

# a rank's chunks share their gradient groups' pages and part (stage_rank_pool): gpt-deep's
# zb-v over 2 ranks forms each micro-batch in 4 groups on one thread, each group folded into
# group 0 a product at a time (the largest, c_fc's, a third of a block of 3,159,040 bytes);
# the gradient arrays beyond the rank's own hold that part and one chunk's mb_grads (1.33
# blocks and a few pages), not a group buffer as well (2 blocks) nor each chunk's (4)
"$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$MODELS/gpt-deep.cfg" --text "$PT_SOURCE_DIR/README.md" \
    --batch 8 --steps 1 --eval-windows 1 --stages 2 --microbatches 2 --threads 1 \
    --schedule zb-v --json >"$WORK/zbv-mem.json" 2>"$WORK/zbv-mem.err"
python3 - "$WORK/zbv-mem.json" <<'PY' && pass "zb-v: each rank's gradient groups hold one chunk's at a time" || failed "zb-v: gradient group memory"
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
block = 789760 * 4
for r, (p, g) in enumerate(zip(d["rank_params_bytes"], d["rank_grads_bytes"])):
    print(f"  rank {r}: gradients {g} bytes, parameters {p}, beyond them {(g - p) / block:.2f} blocks")
    if g - p > 1.5 * block:
        sys.exit(1)
PY

run "$WORK/other.st" 2 --stages 2 --schedule zb-v --microbatches 4 --seed 8
if "$PIPETRAIN" diff "$WORK/other.st" "$WORK/ref_4.st" >/dev/null 2>&1; then
    failed "a different seed gave the same parameters: the comparison cannot fail"
else
    pass "a different seed differs"
fi
finish
