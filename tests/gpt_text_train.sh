#!/usr/bin/env bash
# A language model trained on text end to end (issue 24): gpt-nano on the built-in corpus
# (--data text, Debian's fortunes) for 30 steps, whose loss goes down; the same run as a
# 2-stage pipeline and as 2 replicas (--reduce ordered) has the same loss at every step and
# bit-identical parameters (each layout takes the same windows: sample i of a step is
# text_sample_offset(seed, step, i)); a run resumed from a checkpoint in another layout ends
# bit-identical too; `sample` writes the prompt and N bytes, the same for the same seed.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
NANO=$MODELS/gpt-nano.cfg
COMMON=(--model "$NANO" --data text --batch 16 --microbatches 2 --steps 30 --lr 0.003 --seed 5
        --threads 1 --json --log-every 1)

run() { # run NAME RANKS ARGS...: metrics, parameters and the JSON line in $WORK/NAME.*
    local name=$1 n=$2
    shift 2
    local cmd=("$PIPETRAIN" train "${COMMON[@]}" --metrics "$WORK/$name.jsonl"
               --save "$WORK/$name.st" "$@")
    [ "$n" -gt 1 ] && cmd=("$MPIEXEC" -n "$n" "${cmd[@]}")
    if ! timeout 200 "${cmd[@]}" >"$WORK/$name.out" 2>"$WORK/$name.err"; then
        failed "$name: exit non-zero: $(tail -n 3 "$WORK/$name.err")"
        return 1
    fi
}
# the loss of every step, one a line
losses() { python3 -c "
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d['type'] == 'step': print(d['loss'])" "$1"; }

run one 1 || true
losses "$WORK/one.jsonl" >"$WORK/one.losses"
n=$(wc -l <"$WORK/one.losses")
if python3 - "$WORK/one.losses" "$WORK/one.out" <<'PY'
import json, math, sys
l = [float(x) for x in open(sys.argv[1])]
res = json.loads(open(sys.argv[2]).read().splitlines()[-1])
first, last = sum(l[:5]) / 5, sum(l[-5:]) / 5
print('first 5 steps %.4f, last 5 %.4f, ln 256 = %.4f; validation %.4f (%.3f bits per byte), '
      'next-token accuracy %.3f' % (first, last, math.log(256), res['val_loss'],
                                    res['val_bits_per_byte'], res['val_acc']))
ok = (len(l) == 30 and abs(l[0] - math.log(256)) < 0.05 and last < first - 1.0
      and res['val_loss'] < math.log(256) - 1.0
      and abs(res['val_bits_per_byte'] - res['val_loss'] / math.log(2)) < 1e-6
      and res['accuracy'] == 'next-token' and res['context'] == 32)
sys.exit(0 if ok else 1)
PY
then pass "30 steps on the fortunes: the loss goes down ($n steps)"
else failed "30 steps on the fortunes: the loss does not go down as it should"; fi

# the same run in other layouts: the same losses, the same parameters
for layout in "stages2:2:--stages 2" "zbh1:2:--stages 2 --schedule zb-h1" \
              "replicas2:2:--replicas 2 --reduce ordered --microbatches 1"; do
    IFS=: read -r name ranks args <<<"$layout"
    read -r -a words <<<"$args"
    run "$name" "$ranks" "${words[@]}" || continue
    losses "$WORK/$name.jsonl" >"$WORK/$name.losses"
    if cmp -s "$WORK/one.losses" "$WORK/$name.losses"; then
        pass "$args: the same loss at each of the 30 steps"
    else
        failed "$args: losses differ from one process's"; diff "$WORK/one.losses" "$WORK/$name.losses" | head -4
    fi
    if "$PIPETRAIN" diff "$WORK/$name.st" "$WORK/one.st" >"$WORK/diff" 2>&1; then
        pass "$args: parameters bit-identical to one process's"
    else
        failed "$args: parameters differ"; tail -n 2 "$WORK/diff"
    fi
done

# resumed at step 15 in another layout: bit-identical to the uninterrupted run
"$PIPETRAIN" train "${COMMON[@]}" --steps 15 --checkpoint-dir "$WORK/ck" >/dev/null 2>&1
if run resumed 2 --stages 2 --resume "$WORK/ck" &&
    "$PIPETRAIN" diff "$WORK/resumed.st" "$WORK/one.st" >"$WORK/diff" 2>&1; then
    pass "resumed at step 15 as 2 stages: bit-identical to the uninterrupted run"
else
    failed "resumed run differs: $(tail -n 2 "$WORK/diff")"
fi

# sample: the prompt, then N bytes; the same seed, the same text
S=(--model "$NANO" --load "$WORK/one.st")
"$PIPETRAIN" sample "${S[@]}" --prompt "Q: " --tokens 64 --seed 3 >"$WORK/s1"
"$PIPETRAIN" sample "${S[@]}" --prompt "Q: " --tokens 64 --seed 3 >"$WORK/s2"
"$PIPETRAIN" sample "${S[@]}" --prompt "Q: " --tokens 64 --seed 4 >"$WORK/s3"
if [ "$(wc -c <"$WORK/s1")" -eq 67 ] && [ "$(head -c 3 "$WORK/s1")" = "Q: " ] &&
    cmp -s "$WORK/s1" "$WORK/s2" && ! cmp -s "$WORK/s1" "$WORK/s3"; then
    pass "sample: prompt + 64 bytes, the same for seed 3, other text for seed 4"
else
    failed "sample: $(wc -c <"$WORK/s1") bytes; seed 3 twice $(cmp -s "$WORK/s1" "$WORK/s2" && echo same || echo different)"
fi
# from a checkpoint directory, a prompt longer than the context, greedy, top-k
long=$(head -c 100 /usr/share/games/fortunes/riddles | tr -d '\000')
"$PIPETRAIN" sample --model "$NANO" --load "$WORK/ck" --prompt "$long" --tokens 20 \
    --temperature 0 >"$WORK/g1"
"$PIPETRAIN" sample --model "$NANO" --load "$WORK/ck" --prompt "$long" --tokens 20 \
    --top-k 1 --seed 9 >"$WORK/g2"
if [ "$(wc -c <"$WORK/g1")" -eq $((${#long} + 20)) ] && cmp -s "$WORK/g1" "$WORK/g2"; then
    pass "sample: a 100-byte prompt (context 32), greedy = top-k 1"
else
    failed "sample: greedy $(wc -c <"$WORK/g1") bytes, top-k 1 $(wc -c <"$WORK/g2")"
fi
finish
