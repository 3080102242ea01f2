# Checkpoints to resume from (--checkpoint-dir, --checkpoint-every, --keep, --resume): a run
# interrupted at step n and resumed ends bit-identical to the uninterrupted run (Adam with
# dropout across an epoch boundary; momentum; a 2-stage pipeline; replicas), also when it
# resumes into another layout that is bit-identical to the first; a corrupt newest
# checkpoint falls back to the previous one; bad resumes are refused with the reason.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
CNN=(--model "$MODELS/seed-cnn.cfg" --batch 32 --train-samples 256 --test-samples 0 --threads 1
     --seed 5 --optimizer adam --lr 0.001)   # 8 steps per epoch; seed-cnn has dropout
MLP=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 256 --test-samples 0 --threads 1
     --seed 5 --optimizer momentum --lr 0.05)
same() { "$PIPETRAIN" diff "$1" "$2" >/dev/null && pass "$3" || failed "$3: differs"; }

# one process, Adam + dropout, interrupted at step 5, resumed to 12 (past the epoch's end)
"$PIPETRAIN" train "${CNN[@]}" --steps 12 --save "$WORK/cnn_full.st" >/dev/null
"$PIPETRAIN" train "${CNN[@]}" --steps 5 --checkpoint-dir "$WORK/c1" --checkpoint-every 2 \
    --keep 2 >/dev/null
ls "$WORK/c1" | tr '\n' ' ' | grep -qx "ckpt-0000000004.safetensors ckpt-0000000005.safetensors " \
    && pass "--checkpoint-every 2 --keep 2 over 5 steps: steps 4 and 5 kept" \
    || failed "checkpoints kept: $(ls "$WORK/c1" | tr '\n' ' ')"
"$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/c1" --save "$WORK/cnn_res.st" --json \
    --metrics "$WORK/res.jsonl" >"$WORK/res.json"
same "$WORK/cnn_res.st" "$WORK/cnn_full.st" "Adam + dropout, stopped at 5, resumed to 12: bit-identical"
python3 -c "import json,sys
for d in (json.loads(open(sys.argv[1]).read().splitlines()[-1]),
          json.loads(open(sys.argv[2]).readline())):
    assert d['resumed_from_step'] == 5 and d['resumed_from'].endswith('ckpt-0000000005.safetensors')" \
    "$WORK/res.json" "$WORK/res.jsonl" && pass "--json and the metrics' run line: resumed_from_step 5" \
    || failed "--json or --metrics lacks resumed_from_step"

# resuming says so and counts on from the checkpoint's step everywhere (issue 23 item 13):
# progress lines, the epoch line, the end report, metrics intervals and --json; the untimed
# steps are this process's first ones
"$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/c1" --progress 0.000001 \
    --metrics "$WORK/res3.jsonl" --log-every 3 >"$WORK/res3.txt" || failed "resume: exit $?"
grep -q "^resuming from .*ckpt-0000000005.safetensors at step 5$" "$WORK/res3.txt" \
    && pass "resuming says so: $(grep -m1 '^resuming' "$WORK/res3.txt")" \
    || { failed "no 'resuming from FILE at step 5' line"; cat "$WORK/res3.txt"; }
first=$(grep -m1 -o "step [0-9]*/[0-9]*" "$WORK/res3.txt" || true)
[ "$first" = "step 6/12" ] && ! grep -q "step [1-5]/12" "$WORK/res3.txt" \
    && pass "progress counts on from the checkpoint: first line '$first'" \
    || { failed "progress after resuming at 5: first '$first'"; cat "$WORK/res3.txt"; }
grep -q "^epoch 1/2 (steps 6-8 only) " "$WORK/res3.txt" \
    && grep -q "^done: steps 6-12 of 12 (resumed at 5) in " "$WORK/res3.txt" \
    && pass "epoch and end report name the steps run: $(grep '^done' "$WORK/res3.txt" | cut -c1-40)" \
    || { failed "epoch line or end report after resuming"; cat "$WORK/res3.txt"; }
python3 -c "import json,sys
steps = [(l['step'], l['steps']) for l in map(json.loads, open(sys.argv[1])) if l['type'] == 'step']
assert steps == [(6, 1), (9, 3), (12, 3)], steps" "$WORK/res3.jsonl" \
    && pass "metrics intervals after resuming at 5: steps 6 (1), 9 (3), 12 (3)" \
    || failed "metrics intervals after resuming"
"$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/c1" --untimed-steps 2 --json \
    >"$WORK/res4.json" || failed "resume with --untimed-steps 2: exit $?"
python3 -c "import json,sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
want = dict(steps=12, steps_run=7, total_steps=12, untimed_steps=2, timed_steps=5, resumed_from_step=5)
assert all(d[k] == v for k, v in want.items()), {k: d[k] for k in want}" "$WORK/res4.json" \
    && pass "--json after resuming at 5 to 12: steps 12, steps_run 7, timed_steps 5 of --untimed-steps 2" \
    || { failed "--json counts after resuming"; tail -n 1 "$WORK/res4.json"; }

# under launch, a restart counts on too (it printed "step 1/12" again): a rank killed at
# step 5 after the checkpoint of step 4 (killed again there: one restart is enough to see)
timeout 120 "$PIPETRAIN" launch --max-restarts 1 --log "$WORK/l.jsonl" -- "$MPIEXEC" -n 1 \
    "$PIPETRAIN" train "${MLP[@]}" --steps 12 --checkpoint-dir "$WORK/cl" --checkpoint-every 2 \
    --checkpoint-write sync --debug-kill 0:5 --progress 0.000001 >"$WORK/l.out" 2>&1 || true
after=$(sed -n '/^resuming from /,$p' "$WORK/l.out")
grep -q "^resuming from .*ckpt-0000000004.safetensors at step 4$" <<<"$after" \
    && grep -q "^  step 5/12 " <<<"$after" && ! grep -q "step [1-4]/12" <<<"$after" \
    && pass "launch's restart: $(head -n 2 <<<"$after" | tr '\n' ' ' | cut -c1-110)" \
    || { failed "launch's restart does not count on from step 4"; cat "$WORK/l.out"; }

# momentum, 2-stage pipeline interrupted at 6 then resumed as one process and as 2 replicas
"$PIPETRAIN" train "${MLP[@]}" --steps 12 --microbatches 2 --save "$WORK/mlp_full.st" >/dev/null
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${MLP[@]}" --stages 2 --microbatches 2 --steps 6 \
    --checkpoint-dir "$WORK/c2" >/dev/null
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${MLP[@]}" --stages 2 --microbatches 2 --steps 12 \
    --resume "$WORK/c2" --save "$WORK/mlp_k2.st" >/dev/null
same "$WORK/mlp_k2.st" "$WORK/mlp_full.st" "momentum, 2 stages, resumed in the same layout: bit-identical"
"$PIPETRAIN" train "${MLP[@]}" --microbatches 2 --steps 12 --resume "$WORK/c2" \
    --save "$WORK/mlp_k1.st" >/dev/null
same "$WORK/mlp_k1.st" "$WORK/mlp_full.st" "2 stages -> 1 process: bit-identical"
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${MLP[@]}" --replicas 2 --reduce ordered --steps 12 \
    --resume "$WORK/c2" --save "$WORK/mlp_r2.st" >/dev/null
same "$WORK/mlp_r2.st" "$WORK/mlp_full.st" "2 stages -> 2 replicas (ordered, M=1): bit-identical"

# the comparisons can fail: resuming from the older checkpoint of c1 with one step less
"$PIPETRAIN" train "${CNN[@]}" --steps 11 --resume "$WORK/c1" --save "$WORK/short.st" >/dev/null
"$PIPETRAIN" diff "$WORK/short.st" "$WORK/cnn_full.st" >/dev/null \
    && failed "11 steps equal 12" || pass "a run one step short differs"

# a corrupt newest checkpoint: refused with the reason, the previous one is used
cp -r "$WORK/c1" "$WORK/c3"
printf 'garbage' | dd of="$WORK/c3/ckpt-0000000005.safetensors" bs=1 seek=100 conv=notrunc 2>/dev/null
truncate -s 2000 "$WORK/c3/ckpt-0000000005.safetensors"
"$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/c3" --save "$WORK/cnn_fb.st" \
    --json >"$WORK/fb.json" 2>"$WORK/fb.err"
grep -q "refusing .*ckpt-0000000005.safetensors" "$WORK/fb.err" \
    && grep -q '"resumed_from_step":4' "$WORK/fb.json" \
    && pass "corrupt newest checkpoint refused ($(head -c 120 "$WORK/fb.err")...), step 4 used" \
    || { failed "fallback to the previous checkpoint"; cat "$WORK/fb.err"; }
same "$WORK/cnn_fb.st" "$WORK/cnn_full.st" "resumed from the previous checkpoint: bit-identical"

# a stale temporary of a killed writer is removed at the next start
touch "$WORK/c1/ckpt-0000000009.safetensors.tmp-123-0"
"$PIPETRAIN" train "${CNN[@]}" --steps 6 --resume "$WORK/c1" --checkpoint-dir "$WORK/c1" >/dev/null
[ ! -e "$WORK/c1/ckpt-0000000009.safetensors.tmp-123-0" ] \
    && pass "a killed writer's temporary is removed" || failed "stale temporary left"

mkdir -p "$WORK/empty"
expect_fail "--resume an empty directory" "no checkpoint in this directory" \
    "$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/empty"
expect_fail "--resume with another optimizer" "written with --optimizer adam, this run has sgd" \
    "$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/c1/ckpt-0000000005.safetensors" --optimizer sgd
# the learning rates as written (they read 0.00100000005 and 0.00200000009)
expect_fail "--resume with another --lr" "written with --lr 0.001, this run has 0.002:" \
    "$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/c1/ckpt-0000000005.safetensors" --lr 0.002
expect_fail "--resume into another model" "written for another model" \
    "$PIPETRAIN" train "${MLP[@]}" --optimizer adam --lr 0.001 --steps 12 \
    --resume "$WORK/c1/ckpt-0000000005.safetensors"
expect_fail "--resume a --save file" "not a pipetrain checkpoint to resume from" \
    "$PIPETRAIN" train "${CNN[@]}" --steps 12 --resume "$WORK/cnn_full.st"
expect_fail "--resume past the run's end" "past this run's last step" \
    "$PIPETRAIN" train "${CNN[@]}" --steps 3 --resume "$WORK/c1/ckpt-0000000005.safetensors"
expect_fail "--checkpoint-every without a directory" "needs --checkpoint-dir" \
    "$PIPETRAIN" train "${CNN[@]}" --steps 3 --checkpoint-every 2
expect_fail "--checkpoint-minutes without a directory" "needs --checkpoint-dir" \
    "$PIPETRAIN" train "${CNN[@]}" --steps 3 --checkpoint-minutes 5

# written from a snapshot in the background (the default) or in the foreground: same files
for w in background sync; do
    "$PIPETRAIN" train "${CNN[@]}" --steps 7 --checkpoint-dir "$WORK/w_$w" --checkpoint-every 3 \
        --keep 3 --checkpoint-write $w --json >"$WORK/w_$w.json"
done
ok=1
for f in ckpt-0000000003 ckpt-0000000006 ckpt-0000000007; do
    "$PIPETRAIN" diff "$WORK/w_background/$f.safetensors" "$WORK/w_sync/$f.safetensors" \
        >/dev/null || ok=0
done
[ $ok = 1 ] && [ "$(json_field checkpoints_written <"$WORK/w_background.json")" = 3 ] \
    && pass "--checkpoint-write background and sync write the same checkpoints (3, 6, 7)" \
    || failed "background and sync checkpoints differ"

# by time: rank 0's clock decides, the other ranks learn it a step later (2 stages, so the
# decision really travels). With an interval of 6 µs every verdict is "due", so the
# checkpoints fall on every second step (the verdict of step s is acted on at s + 1, which
# restarts the clock): 2, 4, ..., 14, and 16 at the end. Each must resume to the same end.
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${MLP[@]}" --stages 2 --microbatches 2 --steps 16 \
    --checkpoint-dir "$WORK/tm" --checkpoint-minutes 0.0000001 --keep 100 --json >"$WORK/tm.json"
got=$(ls "$WORK/tm" | sed 's/ckpt-0*\([0-9]*\).safetensors/\1/' | sort -n | tr '\n' ' ')
[ "$got" = "2 4 6 8 10 12 14 16 " ] && [ "$(json_field checkpoints_written <"$WORK/tm.json")" = 8 ] \
    && pass "--checkpoint-minutes 1e-7 on 2 ranks: checkpoints at steps $got" \
    || failed "--checkpoint-minutes: checkpoints at steps $got"
mid=ckpt-0000000006.safetensors
"$PIPETRAIN" train "${MLP[@]}" --microbatches 2 --steps 16 --resume "$WORK/tm/$mid" \
    --save "$WORK/tm_res.st" >/dev/null
"$PIPETRAIN" train "${MLP[@]}" --microbatches 2 --steps 16 --save "$WORK/tm_full.st" >/dev/null
same "$WORK/tm_res.st" "$WORK/tm_full.st" "resumed from a time-based checkpoint ($mid): bit-identical"
touch "$WORK/afile"
expect_fail "--checkpoint-dir that is a file" "cannot create" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${CNN[@]}" --stages 2 --steps 3 --checkpoint-dir "$WORK/afile/x"
finish
