# pipetrain launch: a job that fails is run again from its newest complete checkpoint and
# ends bit-identical to the run that never failed: a rank killed (SIGKILL from outside), a
# rank stopped (SIGSTOP) until the watchdog ends the job, a rank killed while a checkpoint is
# being written, a node lost (fewer ranks: re-planned), a language model killed and resumed
# (tied head across stages, AdamW, schedule); a full disk ends with the message
# and the previous checkpoint intact; a job whose input is at fault is not restarted; bad
# launch commands are refused.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
MLP=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 2048 --test-samples 0
     --threads 1 --seed 5 --optimizer momentum --lr 0.01)
# The faults come at fixed steps, so the jobs can be short: rank 1 stops responding at step
# FAULT_STEP (--debug-stall, after the checkpoint of step 400), once (PT_TEST_FAULT_ONCE: the
# restart passes that step again), and is then killed from outside or left to the watchdog
STEPS=800 EVERY=200 FAULT_STEP=500
same() { "$PIPETRAIN" diff "$1" "$2" >/dev/null && pass "$3" || failed "$3: differs"; }
events() { python3 -c "import json, sys
print(' '.join(json.loads(l)['event'] for l in open(sys.argv[1])))" "$1"; }

# the reference: one process, the same 2 micro-batches per step
"$PIPETRAIN" train "${MLP[@]}" --microbatches 2 --steps $STEPS --save "$WORK/full.st" >/dev/null

# launch_job NAME [LAUNCH-OPTIONS...] -- [TRAIN-OPTIONS...]: in the background; $JOB_PID
launch_job() {
    local name=$1; shift
    local lopts=()
    while [ "$1" != -- ]; do lopts+=("$1"); shift; done
    shift
    touch "$WORK/$name.once"
    PT_TEST_FAULT_ONCE=$WORK/$name.once "$PIPETRAIN" launch --log "$WORK/$name.jsonl" "${lopts[@]}" -- \
        "$MPIEXEC" "${LAUNCHER_ARGS[@]}" "$PIPETRAIN" train "${MLP[@]}" --microbatches 2 \
        --steps $STEPS --checkpoint-dir "$WORK/$name" --checkpoint-every $EVERY \
        --save "$WORK/$name.st" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    JOB_PID=$!
}
wait_for_stall() { # NAME: until rank 1 waits at FAULT_STEP (it removed NAME.once; 30 s at most)
    for _ in $(seq 600); do
        [ -e "$WORK/$1.once" ] || return 0
        sleep 0.05
    done
    return 1
}
rank_pid() { pgrep -n -f -- "--checkpoint-dir $1 " || pgrep -n -f -- "--checkpoint-dir $1\$"; }

# 1. a rank killed mid-run (from outside, while rank 1 waits at FAULT_STEP)
LAUNCHER_ARGS=(-n 2)
launch_job kill -- --stages 2 --debug-stall 1:$FAULT_STEP
wait_for_stall kill && kill -KILL "$(rank_pid "$WORK/kill")"
wait $JOB_PID && rc=0 || rc=$?
[ $rc = 0 ] && [ "$(events "$WORK/kill.jsonl")" = "start failed restart start done" ] \
    && pass "rank killed: failed, restarted from its checkpoint, done ($(events "$WORK/kill.jsonl"))" \
    || { failed "rank killed: exit $rc, events $(events "$WORK/kill.jsonl")"; cat "$WORK/kill.err"; }
same "$WORK/kill.st" "$WORK/full.st" "rank killed and restarted: bit-identical to the uninterrupted run"
grep -q -- "--resume $WORK/kill" "$WORK/kill.jsonl" && pass "the restart resumed (--resume DIR)" \
    || failed "the restart did not resume"

# 2. a rank stopped until the watchdog ends the job
launch_job stop -- --stages 2 --timeout 2 --debug-stall 1:$FAULT_STEP
wait $JOB_PID && rc=0 || rc=$?
[ $rc = 0 ] && [ "$(events "$WORK/stop.jsonl")" = "start failed restart start done" ] \
    && pass "rank stopped: the watchdog ended the job, restarted, done" \
    || { failed "rank stopped: exit $rc, events $(events "$WORK/stop.jsonl")"; cat "$WORK/stop.err"; }
same "$WORK/stop.st" "$WORK/full.st" "rank stopped and restarted: bit-identical"

# 3. killed while writing the checkpoint of step 400 (the temporary complete, not renamed):
# the restart resumes from step 200's, the temporary is never taken for a checkpoint
echo ckpt-0000000400 >"$WORK/kill_flag"
PT_TEST_KILL_BEFORE_RENAME=$WORK/kill_flag launch_job inwrite -- --stages 2
wait $JOB_PID && rc=0 || rc=$?
[ $rc = 0 ] && [ ! -e "$WORK/kill_flag" ] \
    && [ "$(events "$WORK/inwrite.jsonl")" = "start failed restart start done" ] \
    && pass "killed while writing a checkpoint: restarted, done" \
    || { failed "killed while writing: exit $rc, events $(events "$WORK/inwrite.jsonl")"; cat "$WORK/inwrite.err"; }
same "$WORK/inwrite.st" "$WORK/full.st" "killed while writing, restarted: bit-identical"
ls "$WORK/inwrite" | grep -q tmp && failed "a temporary was left: $(ls "$WORK/inwrite")" \
    || pass "no temporary left behind ($(ls "$WORK/inwrite" | tr '\n' ' '))"

# 4. a node lost: 4 slots, 2 stages × 2 replicas (ordered reduction, ZeRO-1); the host file
# shrinks to 2 slots before the kill, the restart runs 2 ranks as 2 stages × 1 replica with 4
# micro-batches, and without ZeRO (it needs two replicas): the same arithmetic, bit for bit
"$PIPETRAIN" train "${MLP[@]}" --microbatches 4 --steps $STEPS --save "$WORK/full4.st" >/dev/null
echo "localhost:4" >"$WORK/hosts"
LAUNCHER_ARGS=(-n 4 -f "$WORK/hosts")
launch_job lost --min-ranks 2 --hostfile "$WORK/hosts" -- --stages 2 --replicas 2 --reduce ordered \
    --zero 1 --debug-stall 1:$FAULT_STEP
wait_for_stall lost && echo "localhost:2" >"$WORK/hosts" && kill -KILL "$(rank_pid "$WORK/lost")"
wait $JOB_PID && rc=0 || rc=$?
[ $rc = 0 ] && grep -q '"event":"replan","ranks":2,"stages":2,"replicas":1,"microbatches":4' "$WORK/lost.jsonl" \
    && pass "node lost: re-planned on 2 ranks (2 stages × 1 replica, 4 micro-batches), done" \
    || { failed "node lost: exit $rc, $(cat "$WORK/lost.jsonl")"; cat "$WORK/lost.err"; }
same "$WORK/lost.st" "$WORK/full4.st" "node lost, resumed in the new layout: bit-identical"
LAUNCHER_ARGS=(-n 2)

# 5. a full disk (a 2 MiB tmpfs holds one checkpoint of about 1.1 MB, not two): the run ends
# with the message, the restart fails the same way, and the first checkpoint stays readable
if [ "$(id -u)" = 0 ] && mkdir -p "$WORK/small" && mount -t tmpfs -o size=2m tmpfs "$WORK/small" 2>/dev/null; then
    "$PIPETRAIN" launch --max-restarts 1 --log "$WORK/full.jsonl" -- "$MPIEXEC" -n 2 \
        "$PIPETRAIN" train "${MLP[@]}" --microbatches 2 --steps $STEPS --stages 2 \
        --checkpoint-dir "$WORK/small/ck" --checkpoint-every $EVERY --keep 2 \
        >/dev/null 2>"$WORK/full.err" && rc=0 || rc=$?
    first=$(ls "$WORK/small/ck" | head -1)
    [ $rc = 1 ] && grep -q "No space left on device" "$WORK/full.err" \
        && [ "$(events "$WORK/full.jsonl")" = "start failed restart start failed gave_up" ] \
        && pass "disk full: the message, one restart, then given up (exit 1)" \
        || { failed "disk full: exit $rc, events $(events "$WORK/full.jsonl")"; tail -5 "$WORK/full.err"; }
    "$PIPETRAIN" train "${MLP[@]}" --microbatches 2 --steps 300 --resume "$WORK/small/ck/$first" \
        >/dev/null 2>&1 && [ "$first" = ckpt-0000000200.safetensors ] \
        && pass "the checkpoint before the full disk is intact and resumes ($first)" \
        || failed "the checkpoint before the full disk ($first) does not resume"
    umount "$WORK/small"
else
    echo "skip: the full-disk check needs root to mount a small tmpfs"
fi

# 6. the job's input at fault: not restarted
"$PIPETRAIN" launch --log "$WORK/bad.jsonl" -- "$MPIEXEC" -n 2 "$PIPETRAIN" train \
    --model "$WORK/missing.cfg" --stages 2 --checkpoint-dir "$WORK/bad" >/dev/null 2>"$WORK/bad.err" \
    && rc=0 || rc=$?
[ $rc = 2 ] && [ "$(events "$WORK/bad.jsonl")" = "start failed not_restarted" ] \
    && grep -q "missing.cfg" "$WORK/bad.err" \
    && grep '"not_restarted"' "$WORK/bad.jsonl" | grep -q "missing.cfg" \
    && grep -q "not restarted: the job's input is at fault: .*missing.cfg" "$WORK/bad.err" \
    && pass "a missing model file: exit 2, not restarted, launch repeats the job's message" \
    || { failed "missing model under launch: exit $rc, $(events "$WORK/bad.jsonl")"; cat "$WORK/bad.err"; }

# 8. a language model: gpt-nano with its head tied to the embedding across 2 stages, on
# the built-in corpus, AdamW with a cosine schedule and clipping; a rank killed after the
# checkpoint of step 400 (rank 1 waiting at FAULT_STEP). The resumed run (parameters, AdamW's moments, the data position and the
# schedule's step from the checkpoint) ends bit-identical to one process
sed 's/^\[lm_head\].*/[lm_head]\ntied=1/' "$MODELS/gpt-nano.cfg" >"$WORK/nano-tied.cfg"
GPT=(--model "$WORK/nano-tied.cfg" --batch 8 --threads 1 --seed 3 --optimizer adamw --lr 1e-3
     --lr-schedule cosine --lr-warmup 100 --clip-grad-norm 1 --microbatches 2 --steps $STEPS
     --eval-windows 4)
"$PIPETRAIN" train "${GPT[@]}" --save "$WORK/gpt-full.st" >/dev/null
touch "$WORK/gpt.once"
PT_TEST_FAULT_ONCE=$WORK/gpt.once "$PIPETRAIN" launch --log "$WORK/gpt.jsonl" -- \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${GPT[@]}" \
    --stages 2 --checkpoint-dir "$WORK/gpt" --checkpoint-every $EVERY --save "$WORK/gpt.st" \
    --debug-stall 1:$FAULT_STEP >"$WORK/gpt.out" 2>"$WORK/gpt.err" &
JOB_PID=$!
wait_for_stall gpt && kill -KILL "$(rank_pid "$WORK/gpt")"
wait $JOB_PID && rc=0 || rc=$?
[ $rc = 0 ] && [ "$(events "$WORK/gpt.jsonl")" = "start failed restart start done" ] \
    && pass "gpt-nano (tied head, 2 stages, AdamW, cosine): killed, restarted, done" \
    || { failed "gpt-nano under launch: exit $rc, events $(events "$WORK/gpt.jsonl")"; cat "$WORK/gpt.err"; }
same "$WORK/gpt.st" "$WORK/gpt-full.st" "gpt-nano killed and restarted: bit-identical to one process"

# 7. bad launch commands
expect_fail "no command" "no job to run" "$PIPETRAIN" launch --max-restarts 3
expect_fail "no command after --" "no job to run" "$PIPETRAIN" launch --max-restarts 3 --
expect_fail "not a pipetrain job" "not a pipetrain training job" "$PIPETRAIN" launch -- ls -l
expect_fail "pipetrain but not train" "not a pipetrain training job" \
    "$PIPETRAIN" launch -- "$PIPETRAIN" plan --model x --ranks 2
expect_fail "no --checkpoint-dir" "has no --checkpoint-dir" \
    "$PIPETRAIN" launch -- "$MPIEXEC" -n 2 "$PIPETRAIN" train "${MLP[@]}" --stages 2
expect_fail "--max-restarts -1" "max-restarts" \
    "$PIPETRAIN" launch --max-restarts -1 -- "$PIPETRAIN" train "${MLP[@]}" --checkpoint-dir "$WORK/x"
expect_fail "--min-ranks without a rank count" "needs a launcher with a rank count" \
    "$PIPETRAIN" launch --min-ranks 1 -- "$PIPETRAIN" train "${MLP[@]}" --checkpoint-dir "$WORK/x"
expect_fail "unreadable --hostfile" "cannot read" \
    "$PIPETRAIN" launch --hostfile "$WORK/nohosts" -- "$MPIEXEC" -n 2 "$PIPETRAIN" train \
    "${MLP[@]}" --checkpoint-dir "$WORK/x"
# --log naming the job's status record: refused (the record replaced the log, then was removed)
expect_fail "--log the job's status record" "a file of the job's checkpoint directory" \
    "$PIPETRAIN" launch --log "$WORK/x/.pipetrain-launch-status" -- "$PIPETRAIN" train \
    "${MLP[@]}" --checkpoint-dir "$WORK/x"
# a FIFO blocked launch; bad slots counted 1 each; a file of no host read as "nothing says"
mkfifo "$WORK/hostfifo"
printf 'localhost:0\n' >"$WORK/hosts0"
printf '# none\n' >"$WORK/hostsnone"
for hf in "hostfifo:is a FIFO" "hosts0:hosts0 line 1: expected 'host' or 'host:slots'" \
          "hostsnone:names no host"; do
    expect_fail "--hostfile ${hf%%:*}" "${hf#*:}" \
        "$PIPETRAIN" launch --hostfile "$WORK/${hf%%:*}" --min-ranks 1 -- "$MPIEXEC" -n 2 \
        "$PIPETRAIN" train "${MLP[@]}" --checkpoint-dir "$WORK/x"
done
finish
