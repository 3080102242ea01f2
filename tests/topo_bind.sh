# --bind auto pins each rank of a real job to its own core, read back from the OS.
source "$(dirname "$0")/lib/common.bash"
T=(--model "$MODELS/seed-mlp.cfg" --train-samples 256 --test-samples 0 --steps 1 --batch 16
   --stages 2 --partition uniform)
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --bind auto --verbose >"$WORK/out" 2>&1 || true
cat "$WORK/out"
ncpu=$(nproc)
if [ "$ncpu" -ge 2 ]; then
    grep -q "rank 0 .*affinity read back: cpus 0$" "$WORK/out" && pass "rank 0 bound to cpu 0" \
        || failed "rank 0 binding not reported as cpu 0"
    grep -q "rank 1 .*affinity read back: cpus 1$" "$WORK/out" && pass "rank 1 bound to cpu 1" \
        || failed "rank 1 binding not reported as cpu 1"
else
    grep -q "affinity read back" "$WORK/out" && pass "binding reported" || failed "no binding report"
fi
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --bind none --verbose >"$WORK/none" 2>&1
grep -q "affinity read back" "$WORK/none" && pass "--bind none reports the unchanged affinity" \
    || pass "--bind none binds nothing"
expect_fail "unknown bind mode" "--bind" "$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" --bind socket
finish
