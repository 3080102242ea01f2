# Shared by the ZeRO tests (zero_equivalence.sh, zero2_equivalence.sh, zero3_equivalence.sh): seed-mlp from one
# saved start, the one-process references and a comparison. Needs lib/common.bash and MLP.
# --bucket-mb 0.1: seed-mlp's three layers in three buckets, each cut in R shards
COMMON=(--model "$MLP" --batch 32 --steps 3 --train-samples 256 --test-samples 0 --seed 5
        --threads 1 --json --bucket-mb 0.1)
"$PIPETRAIN" train "${COMMON[@]}" --steps 1 --optimizer sgd --lr 0 --save "$WORK/init.st" >/dev/null

lr_of() { [ "$1" = sgd ] || [ "$1" = momentum ] && echo 0.05 || echo 0.001; }

# ref OPT MTOTAL: one process with MTOTAL micro-batches
ref() {
    local f="$WORK/ref_$1_$2.st"
    [ -f "$f" ] || "$PIPETRAIN" train "${COMMON[@]}" --load "$WORK/init.st" --save "$f" \
        --optimizer "$1" --lr "$(lr_of "$1")" --microbatches "$2" >/dev/null
    echo "$f"
}

# same LABEL A B RTOL
same() {
    if "$PIPETRAIN" diff "$2" "$3" --rtol "$4" >"$WORK/diff" 2>&1; then
        pass "$1: $(tail -n 1 "$WORK/diff" | cut -d: -f1)"
    else
        failed "$1: differs"
        tail -n 2 "$WORK/diff"
    fi
}

# skip_differs ZERO M OPT WHAT: the comparison can fail. 2 replicas with --zero ZERO, M
# micro-batches each, bucket 1 skipped (--debug-skip-bucket: left unreduced, or for ZeRO-3
# never gathered) must differ from one process with 2·M micro-batches.
skip_differs() {
    local out=$WORK/skip$1.st
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --load "$WORK/init.st" --replicas 2 \
        --microbatches "$2" --optimizer "$3" --lr "$(lr_of "$3")" --reduce ordered --zero "$1" \
        --debug-skip-bucket 1 --save "$out" >/dev/null
    if "$PIPETRAIN" diff "$out" "$(ref "$3" $((2 * $2)))" >/dev/null 2>&1; then
        failed "$4 matched one process: the comparison cannot fail"
    else
        pass "$4 differs"
    fi
}

# deep_mlp: the memory checks' model, nine dense layers of ~1 MB each (784 → 512 ×8 → 10,
# each its own bucket at --bucket-mb 1), in $WORK/deep.cfg, and W: its runs' options
deep_mlp() {
    { echo "[net]"; echo "input=1,28,28"
      for _ in 1 2 3 4 5 6 7 8; do printf '[dense]\nunits=512\nactivation=relu\n'; done
      printf '[dense]\nunits=10\nactivation=linear\n'; } >"$WORK/deep.cfg"
    W=(--model "$WORK/deep.cfg" --batch 16 --steps 2 --train-samples 64 --test-samples 0
       --seed 5 --threads 1 --json --optimizer adam --reduce ordered --bucket-mb 1
       --microbatches 1)
}
