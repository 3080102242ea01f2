# Tensor shards' bad inputs end every rank with a message naming the problem and a
# non-zero exit, never a hang (expect_fail: mpiexec's exit status, which is non-zero when
# any rank fails, within 60 s): --tensor 0, an unknown --tensor-mode, a world that is not
# stages × replicas × tensor, and a layer with fewer units than T (both modes). Errors
# found while parsing are printed once, by one rank.
source "$(dirname "$0")/lib/common.bash"
T=(train --model "$MODELS/seed-mlp.cfg" --train-samples 64 --test-samples 0 --steps 1
   --batch 16 --threads 1)

once() {
    local n
    n=$(grep -c -- "$1" "$WORK/err" || true)
    [ "$n" -eq 1 ] && pass "  printed once" || failed "  printed $n times: $(cat "$WORK/err")"
}

expect_fail "--tensor 0" "--tensor 0: must be between 1" "$MPIEXEC" -n 2 "$PIPETRAIN" "${T[@]}" --tensor 0
once "--tensor 0"
expect_fail "--tensor -2" "--tensor -2: must be between 1" "$MPIEXEC" -n 2 "$PIPETRAIN" "${T[@]}" --tensor -2
expect_fail "--tensor-mode foo" "--tensor-mode foo: expected megatron or gather" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${T[@]}" --tensor 2 --tensor-mode foo
once "--tensor-mode foo"
expect_fail "world 3 != 1 x 1 x 2" \
    "--stages 1 × --replicas 1 × --tensor 2 needs exactly 2 MPI ranks, the job has 3 (run: mpiexec -n 2 " \
    "$MPIEXEC" -n 3 "$PIPETRAIN" "${T[@]}" --tensor 2
once "needs exactly"
expect_fail "world 4 != 2 x 1 x 4" "--tensor 4 needs exactly 8 MPI ranks, the job has 4" \
    "$MPIEXEC" -n 4 "$PIPETRAIN" "${T[@]}" --stages 2 --tensor 4
expect_fail "--tensor 2 without mpiexec" "needs exactly 2 MPI ranks, the job has 1" \
    "$PIPETRAIN" "${T[@]}" --tensor 2

# A dense layer of 3 units cannot be cut 4 ways: the message names the file, the layer and
# its line. In both modes the first layer with parameters is split by its outputs.
cat >"$WORK/tiny.cfg" <<'EOF'
[net]
input=1,4,4

[dense]
units=3
activation=relu

[dense]
units=8
activation=linear
EOF
TINY=(train --model "$WORK/tiny.cfg" --train-samples 64 --test-samples 0 --steps 1 --batch 16
      --threads 1)
for mode in megatron gather; do
    expect_fail "3 units into 4 shards ($mode)" \
        "tiny.cfg: layer 1 (dense, line 4) has 3 units: it cannot be cut into 4 tensor shards" \
        "$MPIEXEC" -n 4 "$PIPETRAIN" "${TINY[@]}" --tensor 4 --tensor-mode $mode
done
once "cannot be cut"

finish
