#!/usr/bin/env bash
# Batched weight gradients of a language model (train --wgrad batched, issue 24): the four
# products of every [block] (c_attn, attention c_proj, c_fc, MLP c_proj) and the [lm_head]
# stash each micro-batch's rows and form dW = Σ G^T X, db = Σ G in one product per weight at
# the step's end. gpt-nano (no dense layer: without the blocks and the head nothing would
# batch) for 6 steps of SGD at lr 0.5: batched within 1e-5 of per-micro-batch but not the
# same bits (rows summed in one product round otherwise: the comparison can fail); with
# the same micro-batches, 2 stages under gpipe, 1f1b, zb-h1 (B then W: a block stashes in
# W) and interleaved are bit-identical to one process batched, for an untied head, a tied
# one and blocks with dropout; 2 tensor shards (each stashes its slices) and 2 replicas
# (--reduce allreduce: each replica's product over its rows) within 1e-5; --reduce ordered
# is refused (exit 2, it needs each micro-batch's gradient apart). The planner counts the
# stash: (8·C + 2·hidden)·T floats per sample and block, (C + V)·T for the head.
# Skipped (77) where train reads no text.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
help=$("$PIPETRAIN" train --help 2>&1 || true)
grep -q -- "--data text" <<<"$help" || { echo "train reads no text here: skipped"; exit 77; }
NANO=$MODELS/gpt-nano.cfg
sed 's/^\[lm_head\].*/[lm_head]\ntied=1/' "$NANO" >"$WORK/tied.cfg"
sed "s/^heads=2\$/heads=2\ndropout=0.1/" "$NANO" >"$WORK/drop.cfg"
COMMON=(--data text --batch 16 --seed 5 --threads 1 --optimizer sgd --lr 0.5 --steps 6)

# run NAME RANKS MODEL ARGS...: $WORK/NAME.st (parameters), .out, .err
run() {
    local name=$1 n=$2 model=$3
    shift 3
    local cmd=("$PIPETRAIN" train --model "$model" "${COMMON[@]}" --save "$WORK/$name.st" "$@")
    [ "$n" -gt 1 ] && cmd=("$MPIEXEC" -n "$n" "${cmd[@]}")
    if ! timeout 120 "${cmd[@]}" >"$WORK/$name.out" 2>"$WORK/$name.err"; then
        failed "$name: exit non-zero: $(tail -n 3 "$WORK/$name.err")"
        return 1
    fi
}

for m in nano:"$NANO" tied:"$WORK/tied.cfg" drop:"$WORK/drop.cfg"; do
    IFS=: read -r tag model <<<"$m"
    run "$tag-pm" 1 "$model" --microbatches 4 || continue
    run "$tag-b1" 1 "$model" --microbatches 4 --wgrad batched || continue
    same_params "$tag: batched within 1e-5 of per-micro-batch" "$tag-b1" "$tag-pm" 1e-5
    if "$PIPETRAIN" diff "$WORK/$tag-b1.st" "$WORK/$tag-pm.st" >/dev/null 2>&1; then
        failed "$tag: batched is per-micro-batch bit for bit: nothing was batched"
    else
        pass "$tag: batched rounds otherwise than per-micro-batch (the products batched)"
    fi
    for s in gpipe 1f1b zb-h1 "interleaved --virtual 2"; do
        read -r -a words <<<"$s"
        name=$tag-${words[0]}
        run "$name" 2 "$model" --microbatches 4 --wgrad batched --stages 2 --schedule "${words[@]}" &&
            same_params "$tag: 2 stages $s batched bit-identical to one process batched" "$name" "$tag-b1"
    done
done
run t2 2 "$NANO" --microbatches 4 --wgrad batched --tensor 2 &&
    same_params "2 tensor shards batched within 1e-5 of one process batched" t2 nano-b1 1e-5
run dt2 4 "$WORK/drop.cfg" --microbatches 4 --wgrad batched --tensor 2 --stages 2 --schedule zb-h1 &&
    same_params "dropout: 2 stages x 2 shards zb-h1 batched within 1e-5 of one process batched" dt2 drop-b1 1e-5
run r2 2 "$NANO" --microbatches 2 --wgrad batched --replicas 2 --reduce allreduce &&
    same_params "2 replicas batched (allreduce) within 1e-5 of one process batched" r2 nano-b1 1e-5
expect_fail "2 replicas, --reduce ordered, batched" "--reduce ordered needs each micro-batch's" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$NANO" "${COMMON[@]}" --microbatches 2 \
    --wgrad batched --replicas 2 --reduce ordered
rc=0
timeout 60 "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$NANO" "${COMMON[@]}" --microbatches 2 \
    --wgrad batched --replicas 2 --reduce ordered >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] && pass "  exit 2" || failed "  exit $rc, not 2"

# the planner's memory: the stash of 16 samples, 2 blocks (C = 32, hidden 128, T = 32) and
# the head (V = 256): 16 · 4 · 32 · (2 · (8·32 + 2·128) + 32 + 256) bytes
mem() {
    timeout 120 "$PIPETRAIN" plan --model "$NANO" --stages 1 --batch 16 --microbatches 4 --json \
        --wgrad "$1" 2>/dev/null | tail -n 1 |
        python3 -c "import json, sys; print(json.loads(sys.stdin.read())['predicted']['stage_memory_bytes'][0])"
}
a=$(mem per-microbatch || echo 0)
b=$(mem batched || echo 0)
want=$((16 * 4 * 32 * (2 * (8 * 32 + 2 * 128) + 32 + 256)))
[ $((b - a)) -eq "$want" ] && pass "plan: the stash counted, $((b - a)) bytes" ||
    failed "plan: batched $b - per-micro-batch $a bytes, $want expected"
finish
