# Bad inputs and impossible layouts end every rank with a clear message and a non-zero
# exit, never a hang.
source "$(dirname "$0")/lib/common.bash"
CNN=$MODELS/seed-cnn.cfg
T=(--train-samples 256 --test-samples 0 --steps 1 --batch 16 --threads 1)

expect_fail "world size != stages" "needs exactly 2 MPI ranks" \
    "$MPIEXEC" -n 3 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}"
expect_fail "stages without mpiexec" "needs exactly 2 MPI ranks" \
    "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}"
expect_fail "M does not divide batch" "does not divide" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --microbatches 3
cat >"$WORK/tiny.cfg" <<'CFG'
[net]
input=1,28,28
[dense]
units=10
CFG
expect_fail "more stages than layers" "stage would be empty" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$WORK/tiny.cfg" --stages 2 "${T[@]}"
expect_fail "partition list does not add up" "covers 10 layers but the model has 11" \
    "$MPIEXEC" -n 3 "$PIPETRAIN" train --model "$CNN" --stages 3 "${T[@]}" --partition 4,3,3
expect_fail "partition list with an empty stage" "partition" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --partition 0,11
expect_fail "partition list of the wrong length" "partition" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --partition 4,3,4
expect_fail "unknown partition method" "unknown" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --partition best
expect_fail "unknown schedule" "gpipe" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --schedule zigzag
printf '[net]\ninput=1,28,28\n[conv]\nfilters=4\nsize=3\ncolour=red\n' >"$WORK/bad.cfg"
expect_fail "malformed model file (2 ranks)" "bad.cfg:6" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$WORK/bad.cfg" --stages 2 "${T[@]}"
expect_fail "missing data directory" "nonexistent" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --data "$WORK/nonexistent"
head -c 100 /dev/urandom >"$WORK/junk.st"
expect_fail "corrupt checkpoint" "junk.st" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --load "$WORK/junk.st"
"$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" "${T[@]}" --optimizer sgd --save "$WORK/mlp.st" >/dev/null
expect_fail "checkpoint of another model" "layers.0.weight" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --load "$WORK/mlp.st"
expect_fail "non-finite loss names the step" "not finite" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --steps 5 \
    --optimizer sgd --lr 1e6
expect_fail "bad option value" "--batch" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 --batch 12x
# An MPI call that fails in the middle of a step (an invalid send, on rank 1 at step 2)
# ends every rank within seconds, with the rank, pipetrain's line and MPI's own text.
SECONDS=0
expect_fail "MPI error in a step" "rank 1 (.*): MPI_Isend failed at src/runtime/exec.c:[0-9]*: Invalid count" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$CNN" --stages 2 "${T[@]}" --steps 5 \
    --partition params --debug-mpi-error 1:2
if [ "$SECONDS" -le 20 ]; then pass "MPI error ends the job in $SECONDS s"
else failed "MPI error: the job took $SECONDS s to end"; fi
finish
