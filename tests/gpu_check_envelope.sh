#!/usr/bin/env bash
# The rounding envelope of validate.sh's step 3 (experiments/cuda/envelope_lib.sh and
# envelope_check.py), reduced: batch 64, seed 1, one SGD step and one Adam step from a
# checkpoint, the CPU playing the GPU's part. A run from a start perturbed by rounding must
# pass, and so must --device cuda through the mock CUDA plugin where it is built (the start
# loaded, the Adam checkpoint resumed onto the device, as validate.sh does); lr 0.1% high
# (what validate.sh's 3d and 3f refuse) and a planted error of 1e-3 of the update's norm in
# one element must not; envelope_check.py refuses bad input with exit 2.
# The full self-test, with the table README.md keeps: experiments/cuda/envelope_selftest.sh.
# shellcheck source=tests/lib/common.bash
source "$(dirname "$0")/lib/common.bash"
PYNP=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null; then PYNP=$p; break; fi
done
[ -n "$PYNP" ] || { echo "SKIP: no python3 with numpy"; exit 77; }
PT=$PIPETRAIN
ENV_DIR=$WORK ENV_LOG=$WORK/envelope.log ENV_JOBS=$(nproc 2>/dev/null || echo 2)
ENV_TRAIN=(--model "$MODELS/seed-cnn.cfg" --test-samples 0 --train-samples 256 --progress 0
           --timeout 60)
: >"$ENV_LOG"
# shellcheck source=experiments/cuda/envelope_lib.sh
source "$PT_SOURCE_DIR/experiments/cuda/envelope_lib.sh"

mock=()
if [ -n "${CUDA_MOCK_PLUGIN:-}" ] && [ -f "$CUDA_MOCK_PLUGIN" ]; then
    export PIPETRAIN_CUDA_PLUGIN=$CUDA_MOCK_PLUGIN PT_MOCK_CUDA_MODE=2
    mock=("mock|ref|none|pass|--device cuda")
else
    echo "(no mock CUDA plugin: no --device cuda run)"
fi
for kind in sgd1 adam1; do
    set +e
    env_case "$kind" 64 1 "perturbed|p3|none|pass|" "${mock[@]}" "lr|ref|lr|fail|"
    dir=$WORK/$kind-b64-s1
    "$PYNP" "$ENV_CHECK" plant "$dir/v-perturbed.st" "$dir/P3.st" "$dir/planted.st" \
        >>"$ENV_LOG" 2>&1
    env_check "$dir" check-planted.json planted fail "$dir/planted.st" "$dir/P3.st"
    set -e
    while IFS=$'\t' read -r k _ _ name expect rc ok _ verdict; do
        if [ "$ok" = 1 ]; then pass "$k $name (must $expect): $verdict"
        else failed "$k $name (must $expect, exit $rc): $verdict"; fi
    done < <(grep "^$kind	" "$WORK/results.tsv")
done

# input errors: exit 2, not a verdict
rc=0
"$PYNP" "$ENV_CHECK" check "$WORK/sgd1-b64-s1/S.st" "$WORK/sgd1-b64-s1/C.st" \
    "$WORK/adam1-b64-s1/S.st" --envelope "$WORK/sgd1-b64-s1/P1.st" "$WORK/sgd1-b64-s1/C1.st" \
    >"$WORK/out" 2>&1 || rc=$?
if [ $rc = 2 ] && grep -q 'holds other tensors' "$WORK/out"; then
    pass "a run with other tensors: exit 2 ($(tail -1 "$WORK/out"))"
else failed "a run with other tensors: exit $rc: $(tail -1 "$WORK/out")"; fi
rc=0
"$PYNP" "$ENV_CHECK" check "$WORK/sgd1-b64-s1/S.st" "$WORK/sgd1-b64-s1/C.st" "$MODELS/seed-cnn.cfg" \
    --envelope "$WORK/sgd1-b64-s1/P1.st" "$WORK/sgd1-b64-s1/C1.st" >"$WORK/out" 2>&1 || rc=$?
if [ $rc = 2 ]; then pass "not a safetensors file: exit 2 ($(tail -1 "$WORK/out"))"
else failed "not a safetensors file: exit $rc: $(tail -1 "$WORK/out")"; fi
[ "$FAILURES" = 0 ] || { echo "log:"; tail -60 "$ENV_LOG"; }
finish
