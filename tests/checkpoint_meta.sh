# Every count in a checkpoint's metadata is checked on --resume (issue 23 item 5): a step,
# epoch or updates that is not a whole number, negative, zero where it cannot be, or at
# odds with the others or the file's name, is refused naming the field and the file, and
# the previous checkpoint is used, as for any corrupt one. The edits keep the metadata's
# checksum valid (tests/lib/st_edit_meta.py), so only the field check can catch them.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
RUN=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 256 --test-samples 0 --threads 1
     --seed 5 --optimizer adam --lr 0.001)   # 8 steps per epoch
"$PIPETRAIN" train "${RUN[@]}" --steps 10 --checkpoint-dir "$WORK/c" --checkpoint-every 2 \
    --keep 3 >/dev/null
NEWEST=ckpt-0000000010.safetensors
# edited FIELD VALUE: ckpt 10 (epoch 1, updates 10) edited, then resumed: falls back to 8
edited() {
    local field=$1 value=$2 rc=0
    rm -rf "$WORK/e" && cp -r "$WORK/c" "$WORK/e"
    python3 "$PT_SOURCE_DIR/tests/lib/st_edit_meta.py" "$WORK/e/$NEWEST" "$field" "$value"
    timeout 60 "$PIPETRAIN" train "${RUN[@]}" --steps 12 --resume "$WORK/e" --json \
        >"$WORK/out" 2>"$WORK/err" || rc=$?
    local from
    from=$(json_field resumed_from_step <"$WORK/out" 2>/dev/null || echo none)
    if [ $rc -ne 0 ]; then
        failed "$field '$value': exit $rc"; cat "$WORK/err"
    elif ! grep -q "refusing $WORK/e/$NEWEST: bad $field '$value'" "$WORK/err"; then
        failed "$field '$value': not refused by name"; cat "$WORK/err"
    elif [ "$from" != 8 ]; then
        failed "$field '$value': resumed from step $from, not 8"
    else
        pass "$field '$value': $(grep -m1 refusing "$WORK/err" | sed 's|.*/||')"
    fi
}
for v in 0 x -9 12 ""; do edited step "$v"; done
for v in 0 x -9 2; do edited epoch "$v"; done
for v in 0 x -9 9 1e3; do edited updates "$v"; done
# a file named directly is checked alone (no name to compare, no previous one): exit 2
for v in 0 x -9; do
    rm -rf "$WORK/e" && cp -r "$WORK/c" "$WORK/e"
    python3 "$PT_SOURCE_DIR/tests/lib/st_edit_meta.py" "$WORK/e/$NEWEST" step "$v"
    expect_fail "--resume FILE with step '$v'" "bad step '$v' in its metadata" \
        "$PIPETRAIN" train "${RUN[@]}" --steps 12 --resume "$WORK/e/$NEWEST"
done
finish
