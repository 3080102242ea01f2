#!/usr/bin/env bash
# Dropout inside transformer blocks end to end (issue 24): gpt-nano with dropout=0.1 in its
# two blocks (a temporary copy of the model file) trained for 6 steps on the built-in text.
# A mask depends only on (seed, step, sample id, layer, site, element), so every layout
# ends with parameters bit-identical to one process's: 2 stages under gpipe, 1f1b, zb-h1
# and interleaved (2 chunks per rank), 1f1b recomputing every stage's forward (the same
# masks again), 2 replicas with --reduce ordered; 2 tensor shards
# (blocks cut by heads: each rank draws its heads' attention masks at their places among
# all heads, the residual masks whole) within 1e-5, as tests/gpt_tensor.sh compares
# shards without dropout. dropout=0 is bit-identical to no key; dropout=0.1 differs from
# none (the comparison can fail), and its validation (no dropout) is reported. PyTorch
# parity with dropout is not tested: torch's generator cannot draw these masks.
# Skipped (77) where train reads no text.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
help=$("$PIPETRAIN" train --help 2>&1 || true)
grep -q -- "--data text" <<<"$help" || { echo "train reads no text here: skipped"; exit 77; }
NANO=$MODELS/gpt-nano.cfg
# dropout=P after each block's heads line
with_dropout() { sed "s/^heads=2\$/heads=2\ndropout=$1/" "$NANO"; }
with_dropout 0.1 >"$WORK/drop.cfg"
with_dropout 0 >"$WORK/zero.cfg"
[ "$(grep -c '^dropout=0.1$' "$WORK/drop.cfg")" -eq 2 ] || { failed "no dropout in the copy"; finish; }
COMMON=(--data text --batch 16 --seed 5 --threads 1 --optimizer sgd --lr 0.5 --steps 6
        --json --log-every 1)

# run NAME RANKS MODEL ARGS...: $WORK/NAME.st (parameters), .jsonl (metrics), .out, .err
run() {
    local name=$1 n=$2 model=$3
    shift 3
    local cmd=("$PIPETRAIN" train --model "$model" "${COMMON[@]}" --metrics "$WORK/$name.jsonl"
               --save "$WORK/$name.st" "$@")
    [ "$n" -gt 1 ] && cmd=("$MPIEXEC" -n "$n" "${cmd[@]}")
    if ! timeout 120 "${cmd[@]}" >"$WORK/$name.out" 2>"$WORK/$name.err"; then
        failed "$name: exit non-zero: $(tail -n 3 "$WORK/$name.err")"
        return 1
    fi
}

run one 1 "$WORK/drop.cfg" --microbatches 2 || true
run one4 1 "$WORK/drop.cfg" --microbatches 4 || true
run plain 1 "$NANO" --microbatches 2 || true
run zero 1 "$WORK/zero.cfg" --microbatches 2 || true

# NAME:RANKS:REFERENCE:ARGS, bit for bit
for layout in "gpipe:2:one:--stages 2 --schedule gpipe --microbatches 2" \
              "1f1b:2:one4:--stages 2 --schedule 1f1b --microbatches 4" \
              "zbh1:2:one4:--stages 2 --schedule zb-h1 --microbatches 4" \
              "inter:2:one4:--stages 2 --schedule interleaved --virtual 2 --microbatches 4" \
              "recomp:2:one4:--stages 2 --schedule 1f1b --recompute all --microbatches 4" \
              "r2:2:one:--replicas 2 --reduce ordered --microbatches 1"; do
    IFS=: read -r name ranks ref args <<<"$layout"
    read -r -a words <<<"$args"
    run "$name" "$ranks" "$WORK/drop.cfg" "${words[@]}" || continue
    if "$PIPETRAIN" diff "$WORK/$name.st" "$WORK/$ref.st" >"$WORK/diff" 2>&1; then
        pass "dropout 0.1, $args: parameters bit-identical to one process's"
    else
        failed "dropout 0.1, $args: parameters differ from one process's"; tail -n 2 "$WORK/diff"
    fi
done

# 2 tensor shards: within 1e-5 (the shards sum in another order)
if run t2 2 "$WORK/drop.cfg" --tensor 2 --microbatches 2; then
    if "$PIPETRAIN" diff "$WORK/t2.st" "$WORK/one.st" --rtol 1e-5 >"$WORK/diff" 2>&1; then
        pass "dropout 0.1, --tensor 2: parameters within 1e-5 of one process's ($(tail -n 1 "$WORK/diff" | grep -o 'difference [^ ]*' || true))"
    else
        failed "dropout 0.1, --tensor 2: parameters differ from one process's"; tail -n 1 "$WORK/diff"
    fi
fi

# dropout=0 is no key; dropout=0.1 is not
if "$PIPETRAIN" diff "$WORK/zero.st" "$WORK/plain.st" >"$WORK/diff" 2>&1; then
    pass "dropout=0: bit-identical to no key"
else
    failed "dropout=0 differs from no key"; tail -n 2 "$WORK/diff"
fi
if "$PIPETRAIN" diff "$WORK/one.st" "$WORK/plain.st" --rtol 1e-3 >/dev/null 2>&1; then
    failed "dropout 0.1 within 1e-3 of no dropout: the masks drop nothing"
else
    pass "dropout 0.1 differs from no dropout"
fi
# the tensor comparison can fail too: 2 shards of another seed are far from one process
run t2s6 2 "$WORK/drop.cfg" --tensor 2 --microbatches 2 --seed 6 &&
    { "$PIPETRAIN" diff "$WORK/t2s6.st" "$WORK/one.st" --rtol 1e-5 >/dev/null 2>&1 &&
          failed "another seed within 1e-5: the tensor comparison is blind" ||
          pass "2 shards of another seed differ"; }
# the summary names the dropout; the losses of training went down and validation is finite
summary=$("$PIPETRAIN" summary --model "$WORK/drop.cfg" 2>&1 || true)
if grep -q "dropout 0.1" <<<"$summary"; then
    pass "summary: block (2 heads, hidden 128, dropout 0.1)"
else
    failed "summary does not name the dropout"
fi
val=$(json_field val_loss <"$WORK/one.out" 2>/dev/null || echo nan)
python3 -c "import math,sys; v=float(sys.argv[1]); sys.exit(0 if math.isfinite(v) and v < math.log(256) else 1)" "$val" &&
    pass "validation (no dropout) loss $val" || failed "validation loss $val"
finish
