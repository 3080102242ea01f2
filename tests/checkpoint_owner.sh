# The checkpoint directory belongs to one job at a time and --keep prunes only this run's
# checkpoints (issue 23 item 6): a second job on a directory in use is refused at start
# (exit 2), naming the holder's pid and host; a new run in a directory holding an older
# run's higher-numbered checkpoints keeps its own newest --keep and the older run's all;
# a resumed run prunes the checkpoints of the run it continues.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
RUN=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 256 --test-samples 0 --threads 1
     --seed 5 --optimizer adam --lr 0.001)
D=$WORK/ck
names() { ls "$D" | grep '^ckpt-' | sed 's/ckpt-0*//; s/.safetensors//' | sort -n | tr '\n' ' '; }

# an older run's checkpoints at steps 20, 30
"$PIPETRAIN" train "${RUN[@]}" --steps 30 --checkpoint-dir "$D" --checkpoint-every 10 \
    --keep 2 >/dev/null || failed "the first run failed"
[ "$(names)" = "20 30 " ] && pass "the first run keeps its newest 2: $(names)" \
    || failed "first run left: $(names)"
# a new run (another seed) with lower steps: its own 2 newest stay, the older run's too
"$PIPETRAIN" train "${RUN[@]}" --seed 6 --steps 8 --checkpoint-dir "$D" --checkpoint-every 2 \
    --keep 2 >/dev/null || failed "the new run failed"
[ "$(names)" = "6 8 20 30 " ] && pass "a new run keeps its own 6, 8 and the other's 20, 30" \
    || failed "after a new run: $(names) (wanted 6 8 20 30)"
# resuming the new run continues its run: it prunes its 6 and 8, not 20 or 30
"$PIPETRAIN" train "${RUN[@]}" --seed 6 --steps 14 --resume "$D/ckpt-0000000008.safetensors" \
    --checkpoint-dir "$D" --checkpoint-every 2 --keep 2 >/dev/null 2>&1 \
    || failed "the resumed run failed"
[ "$(names)" = "12 14 20 30 " ] && pass "a resumed run prunes its own: $(names)" \
    || failed "after resuming: $(names) (wanted 12 14 20 30)"

# a second job on the directory while one runs: refused, naming the holder
"$PIPETRAIN" train "${RUN[@]}" --steps 100000 --checkpoint-dir "$D" --checkpoint-every 1000 \
    >"$WORK/first" 2>&1 &
first=$!
for _ in $(seq 100); do grep -qs "^$first " "$D/.pipetrain-lock" && break; sleep 0.1; done
expect_fail "a second job on the directory" "in use by another job (pid $first on $(hostname)" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${RUN[@]}" --stages 2 --steps 2 --checkpoint-dir "$D"
rc=0
timeout 60 "$MPIEXEC" -n 2 "$PIPETRAIN" train "${RUN[@]}" --stages 2 --steps 2 \
    --checkpoint-dir "$D" >/dev/null 2>&1 || rc=$?
[ $rc = 2 ] && pass "refused with exit 2" || failed "the second job exits $rc, not 2"
kill "$first"
wait "$first" 2>/dev/null || true
# the holder gone (however it ended), the directory is free again
"$PIPETRAIN" train "${RUN[@]}" --steps 2 --checkpoint-dir "$D" >/dev/null 2>"$WORK/err" \
    && pass "free again once the holder is gone" || { failed "still locked"; cat "$WORK/err"; }
finish
