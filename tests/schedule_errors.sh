# Bad inputs for the schedules beyond 1F1B: a message and a non-zero exit on every rank,
# never a hang (expect_fail allows 60 s).
source "$(dirname "$0")/lib/common.bash"
A=(train --model "$MODELS/seed-cnn.cfg" --batch 16 --steps 1 --train-samples 64
   --test-samples 0 --threads 1)
MLP=(train --model "$MODELS/seed-mlp.cfg" --batch 16 --steps 1 --train-samples 64
     --test-samples 0 --threads 1)
expect_fail "unknown schedule" "known" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${A[@]}" --stages 2 --schedule zb-h9
expect_fail "--virtual with a schedule that does not use it" "interleaved" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${A[@]}" --stages 2 --schedule 1f1b --virtual 2
# checked before the cut: it read "cannot cut 3 layers into 4 stages"
expect_fail "--virtual with 1f1b on a model too small for K·V chunks" "needs --schedule interleaved" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${MLP[@]}" --stages 2 --schedule 1f1b --virtual 2
# the message counts model chunks, not stages (it read "3 layers into 4 stages" of --stages 2)
expect_fail "K·V chunks beyond the layers" "3 layers into 4 model chunks (--stages 2 x 2 chunks" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${MLP[@]}" --stages 2 --schedule interleaved --virtual 2 --microbatches 2
expect_fail "micro-batches interleaved does not take" "multiple" \
    "$MPIEXEC" -n 3 "$PIPETRAIN" "${A[@]}" --stages 3 --schedule interleaved --virtual 2 --microbatches 4
expect_fail "interleaved on one stage" "2 stages" \
    "$PIPETRAIN" "${A[@]}" --schedule interleaved --virtual 2 --microbatches 2
expect_fail "--recompute names a stage that does not exist" "stage 5" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${A[@]}" --stages 2 --recompute 5
expect_fail "--recompute that is not a list" "recompute" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${A[@]}" --stages 2 --recompute some
expect_fail "--wgrad unknown" "wgrad" "$PIPETRAIN" "${A[@]}" --wgrad sometimes
expect_fail "--wgrad batched with --reduce ordered" "ordered" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" "${A[@]}" --replicas 2 --microbatches 2 --wgrad batched --reduce ordered
expect_fail "interleaved x replicas, M not a multiple of K" "multiple" \
    "$MPIEXEC" -n 4 "$PIPETRAIN" "${A[@]}" --stages 2 --replicas 2 --schedule interleaved --virtual 2 --microbatches 1
expect_fail "zb-h1 --device cuda without the CUDA plugin" "CUDA plugin" \
    env PIPETRAIN_CUDA_PLUGIN=/nonexistent "$PIPETRAIN" "${A[@]}" --schedule zb-h1 --device cuda
# --schedule-file: a FIFO is refused (reading it blocked forever), and so is a line longer
# than the reader's buffer (its tail was read as an instruction of its own)
mkfifo "$WORK/fifo"
expect_fail "--schedule-file a FIFO (schedule)" "fifo: is a FIFO" \
    "$PIPETRAIN" schedule --schedule-file "$WORK/fifo"
expect_fail "--schedule-file a FIFO (train)" "fifo: is a FIFO" \
    "$PIPETRAIN" "${A[@]}" --schedule-file "$WORK/fifo"
"$PIPETRAIN" schedule --stages 2 --microbatches 2 --save-schedule "$WORK/s.txt" >/dev/null
# line 4: two instructions 600 blanks apart, which the old reader took as two lines
{ head -n 3 "$WORK/s.txt"; printf '0 send_act 0 0 1 -1%600s0 F 1 0 -1 -1\n' ''
  tail -n +6 "$WORK/s.txt"; } >"$WORK/long.txt"
expect_fail "--schedule-file with a line of 632 characters" "long.txt line 4: longer than" \
    "$PIPETRAIN" schedule --schedule-file "$WORK/long.txt"
# a number beyond int: refused (sscanf wrapped 4294967296 to 0, a valid micro-batch, and the
# file ran as if it said 0)
sed 's/^0 F 0 0 -1 -1$/0 F 4294967296 0 -1 -1/' "$WORK/s.txt" >"$WORK/wrap.txt"
expect_fail "--schedule-file with a micro-batch of 2^32" "wrap.txt line 3: the number 4294967296 is out of range" \
    "$PIPETRAIN" schedule --schedule-file "$WORK/wrap.txt"
# a header whose counts its lists cannot hold: refused before they size the verifier's tables
# (it asked for 3298534883328 positions: an ASan abort, or gigabytes touched at lower counts)
printf 'schedule x stages 4096 microbatches 1048576 virtual 64 placement interleaved\n0 F 0 0 -1 -1\n' \
    >"$WORK/huge.txt"
expect_fail "--schedule-file whose header's counts its lists cannot hold" \
    "huge.txt: stage 0 has 1 instructions, fewer than the forward passes of its 1048576" \
    "$PIPETRAIN" schedule --schedule-file "$WORK/huge.txt"
# --save-schedule writes as train's outputs do (src/base/output.h): a FIFO there is refused
# (the write blocked forever), a link there is replaced, never followed
expect_fail "--save-schedule to a FIFO" "fifo: is a FIFO" \
    "$PIPETRAIN" schedule --stages 2 --save-schedule "$WORK/fifo"
ln -s "$WORK/elsewhere.txt" "$WORK/link.txt"
if timeout 60 "$PIPETRAIN" schedule --stages 2 --save-schedule "$WORK/link.txt" >/dev/null &&
    [ ! -e "$WORK/elsewhere.txt" ] && [ -f "$WORK/link.txt" ] && [ ! -L "$WORK/link.txt" ]; then
    pass "--save-schedule over a link replaces the link"
else failed "--save-schedule over a link: $(ls -l "$WORK" | grep -E 'link|elsewhere')"; fi
# --virtual 1 given with a V schedule: refused (it was read as the default, 2, silently)
expect_fail "schedule: zb-v --virtual 1" "even number of chunks per rank.*not --virtual 1" \
    "$PIPETRAIN" schedule --stages 2 --microbatches 4 --schedule zb-v --virtual 1
expect_fail "plan: v-half --virtual 1" "even number of chunks per rank.*not --virtual 1" \
    "$PIPETRAIN" plan --model "$MODELS/seed-cnn.cfg" --stages 2 --microbatches 4 \
    --schedule v-half --virtual 1
# a malformed cost named as such (it read "2 model chunks need 2 costs")
expect_fail "--costs with four numbers for a chunk" "chunk 0: expected F or F/B/W" \
    "$PIPETRAIN" schedule --stages 2 --microbatches 4 --schedule search --costs 1/2/3/4,1
# a bound in full (it read 1.04858e+06)
expect_fail "--schedule-memory above its bound" "between 0 and 1048576" \
    "$PIPETRAIN" schedule --stages 2 --schedule search --schedule-memory 2000000
expect_fail "train: dualpipev --virtual 1" "not --virtual 1" \
    "$PIPETRAIN" "${A[@]}" --stages 2 --microbatches 4 --schedule dualpipev --virtual 1
finish
