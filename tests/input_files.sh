# A FIFO, a directory or a device given where pipetrain reads a file (model, data,
# checkpoint, topology) is refused at once with a message that says what it is; none
# blocks (a FIFO with no writer used to block the open forever) and none says only
# "read error". expect_fail's timeout turns a hang into a failure.
source "$(dirname "$0")/lib/common.bash"
MLP=$MODELS/seed-mlp.cfg
T=(--train-samples 128 --test-samples 0 --steps 1 --batch 32 --threads 1)
mkfifo "$WORK/fifo"
mkdir "$WORK/dir"
FIFO="is a FIFO (named pipe)"
DIR="is a directory"

# model files
expect_fail "model: FIFO (summary)" "fifo: $FIFO" "$PIPETRAIN" summary --model "$WORK/fifo"
expect_fail "model: directory (summary)" "dir: $DIR" "$PIPETRAIN" summary --model "$WORK/dir"
expect_fail "model: character device" "/dev/null: is a character device" \
    "$PIPETRAIN" summary --model /dev/null
expect_fail "model: FIFO (train)" "fifo: $FIFO" "$PIPETRAIN" train --model "$WORK/fifo" "${T[@]}"
expect_fail "model: FIFO (2-stage train)" "fifo: $FIFO" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train --model "$WORK/fifo" --stages 2 "${T[@]}"
expect_fail "model: directory (partition)" "dir: $DIR" \
    "$PIPETRAIN" partition --model "$WORK/dir" --stages 2
expect_fail "model: FIFO (plan)" "fifo: $FIFO" "$PIPETRAIN" plan --model "$WORK/fifo" --stages 2

# data files: the real data set with one file replaced
data_with() { # data_with KIND: a data directory whose training images are a KIND
    local d="$WORK/data-$1"
    mkdir -p "$d"
    for f in train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        ln -sf "/usr/share/datasets/fashion-mnist/$f.gz" "$d/$f.gz"
    done
    case $1 in
        fifo) mkfifo "$d/train-images-idx3-ubyte.gz" ;;
        dir) mkdir "$d/train-images-idx3-ubyte.gz" ;;
    esac
    echo "$d"
}
expect_fail "data file: FIFO" "train-images-idx3-ubyte.gz: $FIFO" \
    "$PIPETRAIN" train --model "$MLP" "${T[@]}" --data "$(data_with fifo)"
expect_fail "data file: directory" "train-images-idx3-ubyte.gz: $DIR" \
    "$PIPETRAIN" train --model "$MLP" "${T[@]}" --data "$(data_with dir)"

# checkpoints
expect_fail "checkpoint: FIFO (--load)" "fifo: $FIFO" \
    "$PIPETRAIN" train --model "$MLP" "${T[@]}" --load "$WORK/fifo"
expect_fail "checkpoint: directory (--load)" "dir: $DIR" \
    "$PIPETRAIN" train --model "$MLP" "${T[@]}" --load "$WORK/dir"
expect_fail "checkpoint: FIFO (diff)" "fifo: $FIFO" "$PIPETRAIN" diff "$WORK/fifo" "$WORK/fifo"
expect_fail "checkpoint: directory (diff)" "dir: $DIR" "$PIPETRAIN" diff "$WORK/dir" "$WORK/dir"

# topologies
expect_fail "topology: FIFO (topo)" "fifo: $FIFO" "$PIPETRAIN" topo --topology "$WORK/fifo"
expect_fail "topology: directory (topo)" "dir: $DIR" "$PIPETRAIN" topo --topology "$WORK/dir"
expect_fail "topology: FIFO (plan)" "fifo: $FIFO" \
    "$PIPETRAIN" plan --model "$MLP" --stages 2 --partition params --topology "$WORK/fifo"

# plan's --costs-file (read, then written): the FIFO blocked the open
expect_fail "costs file: FIFO (plan)" "fifo: $FIFO" \
    "$PIPETRAIN" plan --model "$MLP" --stages 2 --costs-file "$WORK/fifo"
expect_fail "costs file: directory (plan)" "dir: $DIR" \
    "$PIPETRAIN" plan --model "$MLP" --stages 2 --costs-file "$WORK/dir"

# a key beyond int: refused (%d wrapped micro-batch 4294967424 to 128, and the profile
# was taken for that key's)
"$PIPETRAIN" plan --model "$MLP" --stages 2 --costs-file "$WORK/mlp.costs" >/dev/null
sed 's/^profile microbatch 128 /profile microbatch 4294967424 /' "$WORK/mlp.costs" >"$WORK/wrap.costs"
expect_fail "costs file: a micro-batch of 2^32 + 128" "wrap.costs:2: expected 'profile microbatch" \
    "$PIPETRAIN" plan --model "$MLP" --stages 2 --costs-file "$WORK/wrap.costs"

# a profile's precision other than fp32|bf16, or words after it: refused by line
sed '2s/$/ precision bf17/' "$WORK/mlp.costs" >"$WORK/prec.costs"
expect_fail "costs file: precision bf17" "prec.costs:2: expected 'profile microbatch" \
    "$PIPETRAIN" plan --model "$MLP" --stages 2 --costs-file "$WORK/prec.costs"
sed '2s/$/ precision bf16 more/' "$WORK/mlp.costs" >"$WORK/prec2.costs"
expect_fail "costs file: words after the precision" "prec2.costs:2: expected 'profile microbatch" \
    "$PIPETRAIN" plan --model "$MLP" --stages 2 --costs-file "$WORK/prec2.costs"

# what still works: a regular file through a symbolic link
ln -s "$MLP" "$WORK/link.cfg"
if timeout 60 "$PIPETRAIN" summary --model "$WORK/link.cfg" >"$WORK/out" 2>&1; then
    pass "a model file through a symbolic link"
else failed "a model file through a symbolic link:"; cat "$WORK/out"; fi
finish
