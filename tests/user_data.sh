# A user's own IDX files by any name (issue 23 item 20): --train-images/--train-labels and
# --test-images/--test-labels, one channel (IDX3) and three (IDX4, gzip), train in one
# process and as a 2-stage pipeline to bit-identical parameters; each bad input ends every
# rank with exit 2 and a message naming the file.
source "$(dirname "$0")/lib/common.bash"
MLP=$MODELS/seed-mlp.cfg
CNN=$WORK/rgb.cfg
cat >"$CNN" <<'EOF'
[net]
input=3,8,8

[conv]
filters=4
size=3
pad=1
activation=relu

[maxpool]
size=2

[dense]
units=16
activation=relu

[dense]
units=4
activation=linear
EOF

# the files, under names nothing else uses; labels of the CNN's data are below its 4 classes
python3 - "$WORK" <<'PY'
import gzip, random, struct, sys
w, r = sys.argv[1], random.Random(20)
def idx(name, magic, dims, values, gz=False):
    raw = struct.pack('>%dI' % (len(dims) + 1), magic, *dims) + bytes(values)
    (gzip.open if gz else open)('%s/%s' % (w, name), 'wb').write(raw)
def some(n, below=256):
    return [r.randrange(below) for _ in range(n)]
idx('my-imgs.bin', 0x803, [64, 28, 28], some(64 * 784))
idx('my-labels.bin', 0x801, [64], some(64, 10))
idx('rgb-train.idx.gz', 0x804, [64, 3, 8, 8], some(64 * 192), gz=True)
idx('rgb-train-lab.idx', 0x801, [64], some(64, 4))
idx('rgb-test.idx', 0x804, [32, 3, 8, 8], some(32 * 192))
idx('rgb-test-lab.idx.gz', 0x801, [32], some(32, 4), gz=True)
# bad ones
idx('63-labels.bin', 0x801, [63], some(63, 10))
idx('big-labels.bin', 0x801, [64], some(63, 4) + [9])
idx('flat-imgs.bin', 0x802, [64, 784], some(64 * 784))
PY
T=(--batch 16 --microbatches 2 --steps 6 --threads 1 --seed 5)
MINE=(--train-images "$WORK/my-imgs.bin" --train-labels "$WORK/my-labels.bin")
RGB=(--train-images "$WORK/rgb-train.idx.gz" --train-labels "$WORK/rgb-train-lab.idx"
     --test-images "$WORK/rgb-test.idx" --test-labels "$WORK/rgb-test-lab.idx.gz")

# same_run ID NAME ARGS...: one process and a 2-stage pipeline train to identical
# parameters; their output in $WORK/ID-1.txt and ID-2.txt
same_run() {
    local id=$WORK/$1 name=$2
    shift 2
    if ! "$PIPETRAIN" train "${T[@]}" "$@" --save "$id-1.st" >"$id-1.txt" ||
       ! "$MPIEXEC" -n 2 "$PIPETRAIN" train "${T[@]}" "$@" --stages 2 --save "$id-2.st" \
           >"$id-2.txt"; then
        failed "$name: training failed"; cat "$id-1.txt" "$id-2.txt"
    elif "$PIPETRAIN" diff "$id-1.st" "$id-2.st" >"$WORK/out"; then
        pass "$name: one process and 2 stages, bit-identical;" \
             "$(grep '^epoch' "$id-2.txt" | tail -n 1)"
    else failed "$name: the 2-stage parameters differ:"; cat "$WORK/out"; fi
}
same_run grey "1 channel (IDX3, --train-images)" --model "$MLP" "${MINE[@]}"
grep -q "^data: 64 training, 0 validation, 0 test samples" "$WORK/grey-1.txt" \
    && pass "training files alone: no test set" || failed "training files alone: a test set"
same_run rgb "3 channels (IDX4, gzip, test files)" --model "$CNN" "${RGB[@]}"
grep -q "^data: 64 training, 0 validation, 32 test samples" "$WORK/rgb-1.txt" \
    && grep -q "test loss" "$WORK/rgb-2.txt" \
    && pass "the named test set is evaluated" || failed "the named test set is not evaluated"
# test files alone replace only --data's test set
if [ -d /usr/share/datasets/fashion-mnist ] &&
   "$PIPETRAIN" train --model "$MLP" "${T[@]}" --train-samples 64 --steps 1 \
       --test-images "$WORK/my-imgs.bin" --test-labels "$WORK/my-labels.bin" >"$WORK/out" &&
   grep -q "^data: 64 training, 0 validation, 64 test samples" "$WORK/out"; then
    pass "test files alone: training data from --data, the named test set"
elif [ -d /usr/share/datasets/fashion-mnist ]; then
    failed "test files alone:"; cat "$WORK/out"
fi

# bad [-n RANKS] NAME PATTERN ARGS...: train exits 2 on every rank, and stderr says PATTERN
bad() {
    local n=1
    [ "$1" = -n ] && { n=$2; shift 2; }
    local name=$1 pattern=$2
    shift 2
    local rcs rc=0
    if [ "$n" -eq 1 ]; then
        timeout 60 "$PIPETRAIN" train "${T[@]}" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
        rcs="$rc "
    else # each rank's own status: mpiexec reports only one
        rm -f "$WORK"/rc.*
        timeout 60 "$MPIEXEC" -n "$n" bash -c '"$0" "$@"; rc=$?; echo $rc >"'"$WORK"'/rc.$PMI_RANK"
            exit $rc' "$PIPETRAIN" train "${T[@]}" --stages "$n" "$@" >"$WORK/out" 2>"$WORK/err" ||
            true
        rcs=$(cat "$WORK"/rc.* 2>/dev/null | sort -u | tr '\n' ' ')
        [ "$(ls "$WORK"/rc.* 2>/dev/null | wc -l)" -eq "$n" ] || rcs="$rcs(not every rank ended) "
    fi
    if [ "$rcs" != "2 " ]; then
        failed "$name: exit status of the ranks '$rcs', expected 2 on each:"; cat "$WORK/err"
    elif ! grep -qF -- "$pattern" "$WORK/err"; then
        failed "$name: stderr lacks '$pattern':"; cat "$WORK/err"
    else pass "$name ($n rank(s), exit 2): $(grep -m1 -F -- "$pattern" "$WORK/err")"; fi
}
W=$WORK
bad "missing file" "$W/nothing.bin: cannot open: No such file or directory" \
    --model "$MLP" --train-images "$W/nothing.bin" --train-labels "$W/my-labels.bin"
bad "images without labels" "--train-images $W/my-imgs.bin needs --train-labels FILE too" \
    --model "$MLP" --train-images "$W/my-imgs.bin"
bad -n 2 "test labels without images" \
    "--test-labels $W/my-labels.bin needs --test-images FILE too" \
    --model "$MLP" --test-labels "$W/my-labels.bin"
bad "training files and --data" \
    "--train-images and --data /usr both name the training data: give one" \
    --model "$MLP" "${MINE[@]}" --data /usr
bad "test files and --data" "--test-images and --data /usr both name the test data: give one" \
    --model "$CNN" "${RGB[@]:4}" --data /usr
bad "labels given as images" \
    "$W/my-labels.bin: bad magic 0x00000801 (expected 0x00000803 or 0x00000804 for images)" \
    --model "$MLP" --train-images "$W/my-labels.bin" --train-labels "$W/my-labels.bin"
bad "images of the wrong rank" "flat-imgs.bin: bad magic 0x00000802 (expected 0x00000803 or \
0x00000804 for images): it is IDX of unsigned bytes in 2 dimensions" \
    --model "$MLP" --train-images "$W/flat-imgs.bin" --train-labels "$W/my-labels.bin"
bad "images given as labels" "my-imgs.bin: bad magic 0x00000803 (expected 0x00000801 for labels)" \
    --model "$MLP" --train-images "$W/my-imgs.bin" --train-labels "$W/my-imgs.bin"
bad -n 2 "3 channels for a 1-channel model" \
    "$W/rgb-train.idx.gz: images are 3×8×8, the model takes 1×28×28" --model "$MLP" "${RGB[@]}"
bad "1 channel for a 3-channel model" \
    "my-imgs.bin: images are 1×28×28, the model takes 3×8×8 (IDX3 holds one channel" \
    --model "$CNN" "${MINE[@]}"
if [ -d /usr/share/datasets/fashion-mnist ]; then
    bad "--data's files for a 3-channel model" \
        "train-images-idx3-ubyte.gz: images are 1×28×28, the model takes 3×8×8" --model "$CNN"
fi
bad "63 labels for 64 images" "$W/my-imgs.bin has 64 samples but $W/63-labels.bin has 63" \
    --model "$MLP" --train-images "$W/my-imgs.bin" --train-labels "$W/63-labels.bin"
bad -n 2 "a label past the classes" "$W/big-labels.bin: label 9 at index 63 is out of range 0..3" \
    --model "$CNN" --train-images "$W/rgb-train.idx.gz" --train-labels "$W/big-labels.bin"
bad "a bad test file" \
    "$W/rgb-train-lab.idx: bad magic 0x00000801 (expected 0x00000803 or 0x00000804 for images)" \
    --model "$CNN" "${RGB[@]:0:4}" --test-images "$W/rgb-train-lab.idx" \
    --test-labels "$W/rgb-test-lab.idx.gz"
finish
