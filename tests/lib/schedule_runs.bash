# Shared by the schedule tests (schedule_equivalence.sh, schedule_v_equivalence.sh,
# schedule_search_train.sh): seed-cnn, 3 Adam steps from one saved start, and a run of it
# in one process or K ranks. Needs lib/common.bash.
# (a test may set COMMON before sourcing this: its runs then use it)
[ -n "${COMMON+set}" ] ||
    COMMON=(--model "$MODELS/seed-cnn.cfg" --batch 16 --steps 3 --train-samples 256
            --test-samples 200 --seed 7 --threads 1 --json --optimizer adam --lr 0.001)
"$PIPETRAIN" train "${COMMON[@]}" --steps 1 --optimizer sgd --lr 0 --test-samples 0 \
    --save "$WORK/init.st" >/dev/null

run() { # run OUT K ARGS...
    local out=$1 k=$2
    shift 2
    if [ "$k" -eq 1 ]; then
        "$PIPETRAIN" train "${COMMON[@]}" --load "$WORK/init.st" --save "$out" "$@" \
            >"$out.json" 2>"$out.err"
    else
        "$MPIEXEC" -n "$k" "$PIPETRAIN" train "${COMMON[@]}" --load "$WORK/init.st" \
            --save "$out" "$@" >"$out.json" 2>"$out.err"
    fi
}
test_loss() { tail -n 1 "$1.json" | python3 -c 'import json,sys; print(json.load(sys.stdin)["test_loss"])'; }
