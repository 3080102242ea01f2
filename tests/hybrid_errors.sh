# Hybrid mode's bad inputs end every rank with a clear message and a non-zero exit, never a
# hang: --replicas 0, a world that is not stages × replicas, a batch that replicas ×
# micro-batches do not divide, an unknown --reduce, --bucket-mb 0, ranks started with
# different options (mpiexec's MPMD syntax); and a replica that stalls ends the job through
# the watchdog (--timeout), naming the bucket its peers were reducing.
source "$(dirname "$0")/lib/common.bash"
T=(--model "$MODELS/seed-mlp.cfg" --train-samples 256 --test-samples 0 --steps 3 --batch 32
   --threads 1)
P=("$PIPETRAIN" train "${T[@]}")

# count_in_err PATTERN N: the message is printed exactly N times (once: by one rank)
once() {
    local n
    n=$(grep -c -- "$1" "$WORK/err" || true)
    [ "$n" -eq 1 ] && pass "  printed once" || failed "  printed $n times: $(cat "$WORK/err")"
}

expect_fail "--replicas 0" "--replicas 0: must be between 1" \
    "$MPIEXEC" -n 2 "${P[@]}" --replicas 0
once "--replicas 0"
expect_fail "--replicas -2" "--replicas -2: must be between 1" \
    "$MPIEXEC" -n 2 "${P[@]}" --replicas -2
expect_fail "world 3 != 1 x 2" "needs exactly 2 MPI ranks, the job has 3 (run: mpiexec -n 2 " \
    "$MPIEXEC" -n 3 "${P[@]}" --replicas 2
once "needs exactly"
expect_fail "world 2 != 2 x 2" "--stages 2 × --replicas 2 needs exactly 4 MPI ranks.*mpiexec -n 4" \
    "$MPIEXEC" -n 2 "${P[@]}" --stages 2 --replicas 2
expect_fail "replicas without mpiexec" "mpiexec -n 2" "${P[@]}" --replicas 2
expect_fail "batch not divisible by replicas x micro-batches" \
    "--batch 36 is not divisible by --replicas 2 × --microbatches 4 = 8" \
    "$MPIEXEC" -n 2 "${P[@]}" --replicas 2 --microbatches 4 --batch 36
once "is not divisible"
expect_fail "batch not divisible by replicas" "--batch 33 is not divisible by --replicas 2" \
    "$MPIEXEC" -n 2 "${P[@]}" --replicas 2 --batch 33
expect_fail "unknown --reduce" "--reduce ring: expected allreduce, reduce-bcast, gather-bcast or ordered" \
    "$MPIEXEC" -n 2 "${P[@]}" --replicas 2 --reduce ring
expect_fail "--bucket-mb 0" "--bucket-mb 0: must be positive" \
    "$MPIEXEC" -n 2 "${P[@]}" --replicas 2 --bucket-mb 0
expect_fail "--bucket-mb -1" "--bucket-mb -1: must be between" \
    "$MPIEXEC" -n 2 "${P[@]}" --replicas 2 --bucket-mb -1
expect_fail "--overlap maybe" "--overlap maybe" "$MPIEXEC" -n 2 "${P[@]}" --replicas 2 --overlap maybe

# MPMD: each rank its own command line
expect_fail "options differ between ranks" "started with different options" \
    "$MPIEXEC" -n 1 "${P[@]}" --replicas 2 --lr 0.1 : -n 1 "${P[@]}" --replicas 2 --lr 0.2
once "different options"
expect_fail "an option only one rank refuses" "rank 1: --lr x: not a number" \
    "$MPIEXEC" -n 1 "${P[@]}" --replicas 2 --lr 0.1 : -n 1 "${P[@]}" --replicas 2 --lr x
expect_fail "--replicas differs between ranks" "different options" \
    "$MPIEXEC" -n 1 "${P[@]}" --replicas 2 : -n 1 "${P[@]}" --replicas 1

# A replica stalls at step 1: its peers wait in a bucket's reduction and the watchdog ends
# the job within seconds of the 2 s timeout, naming the bucket, the method and the group.
for red in allreduce ordered reduce-bcast; do
    SECONDS=0
    expect_fail "replica 1 stalls ($red)" \
        "no progress for 2 s in bucket 0 of 1 (layers 0-2, 235146 floats, 918.5 KiB): the .* in the replica group of stage 0 (2 ranks: world 0, 1) (--timeout)" \
        "$MPIEXEC" -n 2 "${P[@]}" --replicas 2 --reduce $red --timeout 2 --debug-stall 1:1
    [ "$SECONDS" -le 20 ] && pass "  ended in $SECONDS s" || failed "  took $SECONDS s"
done
# In a hybrid job: stage 1 of replica 1 (world rank 3) stalls; stage 1 of replica 0 is left
# waiting in its reduction of bucket 0 (seed-mlp's last two layers).
expect_fail "stage 1 of replica 1 stalls (K=2 R=2)" \
    "no progress for 2 s .*waiting for\|no progress for 2 s in bucket 0 of 1" \
    "$MPIEXEC" -n 4 "${P[@]}" --stages 2 --replicas 2 --timeout 2 --debug-stall 3:1
finish
