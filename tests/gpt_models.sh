#!/usr/bin/env bash
# The GPT-2-style model files (issue 24, the model-file half): summary prints the parameter
# count each file's header comment states (124,439,808 for gpt2-small), partition by params
# and uniform cut between the embedding, the blocks and the head (a tied head's copy
# counted where it lives), partition by time and plan profile the layers, and plan cuts
# the blocks by heads over tensor shards (refused with exit 2 where the heads are not a
# multiple of --tensor).
source "$(dirname "$0")/lib/common.bash"

for m in gpt-nano gpt-mini gpt2-small; do
    cfg=$MODELS/$m.cfg
    stated=$(sed -n 's/^;.*total.*= *\([0-9,]*\) parameters\..*/\1/p' "$cfg")
    printed=$("$PIPETRAIN" summary --model "$cfg" | sed -n 's/^Total params: //p')
    if [ -n "$stated" ] && [ "$stated" = "$printed" ]; then
        pass "summary $m: $printed parameters, as its header states"
    else
        failed "summary $m: prints '$printed', header states '$stated'"
    fi
done
if [ "$("$PIPETRAIN" summary --model "$MODELS/gpt2-small.cfg" | sed -n 's/^Total params: //p')" \
    = 124,439,808 ]; then
    pass "gpt2-small is GPT-2 124M: 124,439,808 parameters"
else
    failed "gpt2-small does not print 124,439,808 parameters"
fi

for method in params uniform; do
    rc=0
    "$PIPETRAIN" partition --model "$MODELS/gpt2-small.cfg" --stages 4 --partition "$method" \
        >"$WORK/out" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^total  0–14 *163037184" "$WORK/out" &&
        grep -q "124439808 distinct parameters" "$WORK/out"; then
        pass "partition gpt2-small by $method into 4 stages"
    else
        failed "partition gpt2-small by $method: exit $rc"; cat "$WORK/out"
    fi
done

NANO=(--model "$MODELS/gpt-nano.cfg")
# partition by time and plan profile the transformer layers
for cmd in "partition --stages 2 --partition time" "plan --stages 2"; do
    read -r -a words <<<"$cmd"
    rc=0
    timeout 120 "$PIPETRAIN" "${words[0]}" "${NANO[@]}" "${words[@]:1}" >"$WORK/out" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ] && grep -q "block" "$WORK/out"; then
        pass "$cmd gpt-nano"
    else
        failed "$cmd gpt-nano: exit $rc: $(head -c 300 "$WORK/out")"
    fi
done

# Tensor shards of a transformer: each block cut by heads; gpt-nano's 2 heads do not cut 4 ways.
rc=0
timeout 120 "$PIPETRAIN" plan "${NANO[@]}" --stages 1 --tensor 2 >"$WORK/out" 2>"$WORK/err" || rc=$?
if [ "$rc" -eq 0 ] && grep -q "block *heads *whole *whole" "$WORK/out"; then
    pass "plan --tensor 2 gpt-nano: blocks cut by heads"
else
    failed "plan --tensor 2 gpt-nano: exit $rc: $(head -c 300 "$WORK/err")"
fi
rc=0
timeout 60 "$PIPETRAIN" plan "${NANO[@]}" --stages 1 --tensor 4 >"$WORK/out" 2>"$WORK/err" || rc=$?
if [ "$rc" -eq 2 ] && grep -q "layer 2 (block, line 18) has 2 heads and hidden 128: it cannot be cut into 4 tensor shards" \
    "$WORK/err"; then
    pass "plan --tensor 4 gpt-nano: exit 2, $(head -n 1 "$WORK/err")"
else
    failed "plan --tensor 4 gpt-nano: exit $rc: $(head -c 300 "$WORK/err")"
fi
finish
