#!/usr/bin/env bash
# Every command answers input at fault (a model, topology or checkpoint it cannot use, a
# layout that cannot be) with its message and exit status 2, as train does, and a failure or
# a difference found with 1; diff of files with no tensor in common says so instead of
# printing a difference of 0.
source "$(dirname "$0")/lib/common.bash"
SEED=(--model "$MODELS/seed-mlp.cfg")

# expect_status NAME STATUS PATTERN CMD...: exit STATUS (no hang) and PATTERN on stderr.
expect_status() {
    local name=$1 want=$2 pattern=$3
    shift 3
    local rc=0
    timeout 60 "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -ne "$want" ]; then
        failed "$name: exit $rc, expected $want: $(head -c 300 "$WORK/err")"
    elif ! grep -q -- "$pattern" "$WORK/err"; then
        failed "$name: stderr lacks '$pattern': $(head -c 300 "$WORK/err")"
    else
        pass "$name (exit $rc): $(grep -m1 -- "$pattern" "$WORK/err" | cut -c1-150)"
    fi
}

printf '[net]\n[dense]\nunits=\n' >"$WORK/bad.cfg"
sed 's/ complete_cpuset=/ complete_cpusetx=/' "$PT_SOURCE_DIR/topologies/ws-4gpu.xml" >"$WORK/bad.xml"
printf 'not a checkpoint' >"$WORK/bad.st"

expect_status "summary: a malformed model" 2 "bad.cfg" "$PIPETRAIN" summary --model "$WORK/bad.cfg"
expect_status "summary: a missing model" 2 "missing.cfg" "$PIPETRAIN" summary --model "$WORK/missing.cfg"
expect_status "partition: more stages than layers" 2 "stages" \
    "$PIPETRAIN" partition "${SEED[@]}" --stages 40
expect_status "partition: counts that do not add up" 2 "add up\|layers" \
    "$PIPETRAIN" partition "${SEED[@]}" --stages 2 --partition 1,1
expect_status "schedule: more chunks than micro-batches allow" 2 "" \
    "$PIPETRAIN" schedule --schedule interleaved --stages 2 --virtual 2 --microbatches 3
expect_status "plan: a topology hwloc crashes on" 2 "crashed" \
    "$PIPETRAIN" plan "${SEED[@]}" --stages 2 --topology "$WORK/bad.xml"
expect_status "plan: a model that cannot be cut" 2 "cannot cut" \
    "$PIPETRAIN" plan "${SEED[@]}" --stages 40
expect_status "plan --ranks: no layout fits --memory-mb (it exited 1)" 2 "no layout of 2 ranks fits" \
    "$PIPETRAIN" plan "${SEED[@]}" --ranks 2 --memory-mb 0.001
expect_status "topo: a topology hwloc crashes on" 2 "crashed" \
    "$PIPETRAIN" topo --topology "$WORK/bad.xml"
expect_status "diff: a file that is no checkpoint" 2 "bad.st" \
    "$PIPETRAIN" diff "$WORK/bad.st" "$WORK/bad.st"
expect_status "train: a malformed model" 2 "bad.cfg" \
    "$PIPETRAIN" train --model "$WORK/bad.cfg" --steps 1

# two checkpoints with no tensor of one name and shape in common
T=(--train-samples 64 --test-samples 0 --steps 1 --batch 32 --threads 1 --optimizer sgd)
printf '[net]\n[dense]\nunits=12\n[dense]\nunits=16\n[dense]\nunits=10\n' >"$WORK/a.cfg"
printf '[net]\n[dense]\nunits=14\n[dense]\nunits=10\n' >"$WORK/b.cfg"
"$PIPETRAIN" train --model "$WORK/a.cfg" "${T[@]}" --save "$WORK/a.st" >/dev/null
"$PIPETRAIN" train --model "$WORK/b.cfg" "${T[@]}" --save "$WORK/b.st" >/dev/null
# a --save file carries its CRC-32s as a checkpoint does: a flipped bit is refused at --load
# (it loaded silently when --save wrote no metadata)
cp "$WORK/a.st" "$WORK/flip.st"
printf '\x5a' | dd of="$WORK/flip.st" bs=1 seek=$(($(stat -c %s "$WORK/a.st") - 20)) \
    conv=notrunc 2>/dev/null
expect_status "train --load: a --save file with a flipped bit" 2 "flip.st: corrupt: tensor 'layers.2" \
    "$PIPETRAIN" train --model "$WORK/a.cfg" "${T[@]}" --load "$WORK/flip.st"
rc=0
"$PIPETRAIN" diff "$WORK/a.st" "$WORK/b.st" >"$WORK/out" 2>&1 || rc=$?
if [ "$rc" -eq 1 ] && grep -q "^DIFFERENT: no tensor of the same name and shape" "$WORK/out" &&
    ! grep -q "largest relative difference" "$WORK/out"; then
    pass "diff of unrelated files: exit 1, no difference figure ($(tail -n 1 "$WORK/out"))"
else
    failed "diff of unrelated files: exit $rc"; cat "$WORK/out"
fi
finish
