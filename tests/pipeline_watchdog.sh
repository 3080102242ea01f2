# A stage that stops responding must not hang the job: the others give up after --timeout
# and the whole job ends non-zero, naming the stuck instruction.
source "$(dirname "$0")/lib/common.bash"
T=(--model "$MODELS/seed-cnn.cfg" --train-samples 512 --test-samples 0 --steps 6 --batch 16
   --threads 1 --stages 2 --microbatches 4 --partition uniform)
start=$(date +%s)
expect_fail "stalled stage 1 at step 2" "no progress for 5 s waiting for the gradient" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --timeout 5 --debug-stall 1:2
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -lt 45 ] && pass "ended after ${elapsed} s" || failed "took ${elapsed} s"
# a timeout that is not a whole number is named as given (it read "4 s" for 3.5)
expect_fail "stalled stage 0 at step 1 (3 stages)" "no progress for 3.5 s waiting for the activation" \
    "$MPIEXEC" -n 3 "$PIPETRAIN" train "${T[@]}" --stages 3 --timeout 3.5 --debug-stall 0:1
# A rank that dies (SIGKILL) must take the job down too, not leave the others waiting.
start=$(date +%s)
rc=0
timeout 60 "$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --timeout 30 --debug-kill 1:2 \
    >"$WORK/out" 2>"$WORK/err" || rc=$?
elapsed=$(( $(date +%s) - start ))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$elapsed" -lt 40 ]; then
    pass "killed stage 1: job ended with exit $rc after ${elapsed} s"
else
    failed "killed stage 1: exit $rc after ${elapsed} s"; tail -n 5 "$WORK/err"
fi
finish
