# pipetrain launch judges the job by the status record rank 0 of train writes, not by exit
# codes alone (issue 23 item 7), and reads the job's options with train's own table
# (item 8): an exit 0 without completing is no success; an unrunnable command is not
# retried; a rank killed by SIGINT (mpiexec exits 2) is restarted; a stray
# ckpt-best.safetensors is not taken for a checkpoint; restarts back off; attached short
# options, abbreviations and repeated options re-plan as train reads them. --log refuses a
# device and follows no link.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
MLP=(--model "$MODELS/seed-mlp.cfg" --train-samples 2048 --test-samples 0
     --threads 1 --seed 5 --optimizer momentum --lr 0.01)
events() { python3 -c "import json, sys
print(' '.join(json.loads(l)['event'] for l in open(sys.argv[1])))" "$1"; }
wait_for_checkpoint() { # DIR: until its first complete checkpoint exists (30 s at most)
    for _ in $(seq 600); do
        ls "$1"/ckpt-0*.safetensors >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    return 1
}
rank_pid() { pgrep -n -f -- "train .*--checkpoint-dir $1( |\$)"; }

# 1. a job that exits 0 without completing (no status record) is no success
printf '#!/bin/sh\nexit 0\n' >"$WORK/pipetrain-quits"
chmod +x "$WORK/pipetrain-quits"
"$PIPETRAIN" launch --max-restarts 1 --backoff 0 --log "$WORK/quit.jsonl" -- \
    "$WORK/pipetrain-quits" train "${MLP[@]}" --checkpoint-dir "$WORK/quit" \
    >/dev/null 2>"$WORK/quit.err" && rc=0 || rc=$?
[ $rc = 1 ] && [ "$(events "$WORK/quit.jsonl")" = "start failed restart start failed gave_up" ] \
    && grep -q "no status record" "$WORK/quit.err" \
    && pass "exit 0 without a status record: not a success, restarted, given up (exit 1)" \
    || { failed "exit 0 without completing: exit $rc, events $(events "$WORK/quit.jsonl")"; cat "$WORK/quit.err"; }

# 2. a command that cannot be run (127) is not retried
"$PIPETRAIN" launch --max-restarts 3 --log "$WORK/none.jsonl" -- \
    "$WORK/nowhere/pipetrain" train "${MLP[@]}" --checkpoint-dir "$WORK/none" \
    >/dev/null 2>"$WORK/none.err" && rc=0 || rc=$?
[ $rc = 127 ] && [ "$(events "$WORK/none.jsonl")" = "start failed not_restarted" ] \
    && pass "an unrunnable command: exit 127, not retried" \
    || { failed "unrunnable command: exit $rc, events $(events "$WORK/none.jsonl")"; cat "$WORK/none.err"; }

# 3. a rank killed by SIGINT (mpiexec exits 2, as for input at fault): restarted, done
"$PIPETRAIN" launch --backoff 0 --log "$WORK/int.jsonl" -- "$MPIEXEC" -n 2 "$PIPETRAIN" train \
    "${MLP[@]}" --batch 32 --stages 2 --microbatches 2 --steps 3000 --checkpoint-dir "$WORK/int" \
    --checkpoint-every 500 >/dev/null 2>"$WORK/int.err" &
pid=$!
wait_for_checkpoint "$WORK/int" && kill -INT "$(rank_pid "$WORK/int")"
wait $pid && rc=0 || rc=$?
[ $rc = 0 ] && [ "$(events "$WORK/int.jsonl")" = "start failed restart start done" ] \
    && grep -q "pipetrain: rank [01] (.*): stopped by signal 2 (Interrupt)" "$WORK/int.err" \
    && pass "a rank killed by SIGINT: says so, restarted from the checkpoint, done" \
    || { failed "rank killed by SIGINT: exit $rc, events $(events "$WORK/int.jsonl")"; tail -5 "$WORK/int.err"; }

# 4. a stray ckpt-best.safetensors is no checkpoint: a job killed before its first
# checkpoint restarts from the start (no --resume), twice, after 1 s and then 2 s
mkdir -p "$WORK/best"
echo "not a checkpoint of this run" >"$WORK/best/ckpt-best.safetensors"
"$PIPETRAIN" launch --max-restarts 2 --log "$WORK/best.jsonl" -- "$MPIEXEC" -n 2 \
    "$PIPETRAIN" train "${MLP[@]}" --batch 32 --stages 2 --steps 3000 --checkpoint-dir "$WORK/best" \
    --debug-kill 1:5 >/dev/null 2>"$WORK/best.err" && rc=0 || rc=$?
[ $rc != 0 ] && [ $rc != 2 ] \
    && [ "$(events "$WORK/best.jsonl")" = "start failed restart start failed restart start failed gave_up" ] \
    && ! grep -q -- "--resume" "$WORK/best.jsonl" \
    && pass "a stray ckpt-best.safetensors: restarted from the start, not resumed (exit $rc)" \
    || { failed "stray ckpt-best: exit $rc, events $(events "$WORK/best.jsonl")"; tail -5 "$WORK/best.err"; }
python3 - "$WORK/best.jsonl" <<'PY' && pass "restarts back off: 1 s, then 2 s" || failed "no back-off"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
delays = [e['delay_s'] for e in ev if e['event'] == 'restart']
gaps = [b['unix_time'] - a['unix_time'] for a, b in zip(ev, ev[1:])
        if a['event'] == 'restart' and b['event'] == 'start']
print('delays', delays, 'gaps', ['%.2f' % g for g in gaps])
sys.exit(0 if delays == [1, 2] and all(g >= d - 0.01 for g, d in zip(gaps, delays)) else 1)
PY

# 5. the job's options as train reads them: -k2 (attached), --rep 2 (an abbreviation),
# -M1 --micro 2 (repeated: the last counts), -b32. A node lost: re-planned from 2 stages × 2
# replicas × 2 micro-batches to 2 × 1 × 4, bit-identical to the run that never failed
"$PIPETRAIN" train "${MLP[@]}" --batch 32 --microbatches 4 --steps 1500 --save "$WORK/full4.st" >/dev/null
echo "localhost:4" >"$WORK/hosts"
"$PIPETRAIN" launch --backoff 0 --min-ranks 2 --hostfile "$WORK/hosts" --log "$WORK/lost.jsonl" -- \
    "$MPIEXEC" -n 4 -f "$WORK/hosts" "$PIPETRAIN" train "${MLP[@]}" -b32 -k2 --rep 2 -M1 \
    --micro 2 --reduce ordered --steps 1500 --checkpoint-dir "$WORK/lost" --checkpoint-every 300 \
    --save "$WORK/lost.st" >/dev/null 2>"$WORK/lost.err" &
pid=$!
wait_for_checkpoint "$WORK/lost" && echo "localhost:2" >"$WORK/hosts" && kill -KILL "$(rank_pid "$WORK/lost")"
wait $pid && rc=0 || rc=$?
[ $rc = 0 ] && grep -q '"event":"replan","ranks":2,"stages":2,"replicas":1,"microbatches":4' "$WORK/lost.jsonl" \
    && pass "-k2 --rep 2 -M1 --micro 2 read as train reads them: re-planned as 2 stages × 1 replica × 4" \
    || { failed "options as train reads them: exit $rc, $(cat "$WORK/lost.jsonl")"; tail -5 "$WORK/lost.err"; }
"$PIPETRAIN" diff "$WORK/lost.st" "$WORK/full4.st" >/dev/null \
    && pass "re-planned from the attached options: bit-identical" || failed "re-planned run differs"

# 6. options train refuses are refused by launch before any attempt
expect_fail "the job's bad options" "the job's options: " "$PIPETRAIN" launch --log "$WORK/opt.jsonl" \
    -- "$PIPETRAIN" train "${MLP[@]}" -kx --checkpoint-dir "$WORK/opt"
[ ! -s "$WORK/opt.jsonl" ] && pass "no attempt for options train refuses" || failed "an attempt ran"

# 7. --log: a device is refused at start (events written to /dev/full were lost silently),
# and a planted link is not followed
expect_fail "--log /dev/full" "is a character device" "$PIPETRAIN" launch --log /dev/full -- \
    "$PIPETRAIN" train "${MLP[@]}" --steps 2 --checkpoint-dir "$WORK/devfull"
ln -s "$WORK/elsewhere" "$WORK/link.jsonl"
expect_fail "--log through a symbolic link" "cannot open" "$PIPETRAIN" launch --log "$WORK/link.jsonl" \
    -- "$PIPETRAIN" train "${MLP[@]}" --steps 2 --checkpoint-dir "$WORK/link"
[ ! -e "$WORK/elsewhere" ] && pass "the link's target was not written" || failed "--log followed a link"
finish
