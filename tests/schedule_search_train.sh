# train --schedule search (issue 26): the searched order at the profiled costs trains
# bit-identical to one process, and --json names what won; train --schedule-file: zb-v
# saved by `pipetrain schedule --save-schedule` runs bit-identical to --schedule zb-v, and
# an edited file (two instructions swapped, an op misspelt, another layout) is refused
# with the line named and exit 2; a --schedule-memory no schedule meets names the
# smallest. Each comparison can fail: another seed differs.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
COMMON=(--model "$MODELS/seed-cnn.cfg" --batch 16 --steps 2 --train-samples 128
        --test-samples 100 --seed 7 --threads 1 --json --optimizer adam --lr 0.001)
source "$(dirname "$0")/lib/schedule_runs.bash"

same() { # same NAME OUT REF: parameters and test loss bit-identical
    if ! "$PIPETRAIN" diff "$2" "$3" >"$WORK/diff" 2>&1; then
        failed "$1: parameters differ"; tail -n 2 "$WORK/diff"; return 1
    fi
    if [ "$(test_loss "$2")" != "$(test_loss "$3")" ]; then
        failed "$1: test loss $(test_loss "$2") != $(test_loss "$3")"; return 1
    fi
}

run "$WORK/ref.st" 1 --microbatches 4

# --- the search ---
for V in 1 2; do
    out="$WORK/search$V.st"
    if ! run "$out" 2 --stages 2 --microbatches 4 --schedule search --virtual $V; then
        failed "search V=$V: run failed"; tail -n 3 "$out.err"; continue
    fi
    same "search V=$V" "$out" "$WORK/ref.st" || continue
    name=$(json_field schedule <"$out.json")
    origin=$(json_field schedule_origin <"$out.json")
    virt=$(json_field virtual <"$out.json")
    if [ "$name" = search ] && [ "$origin" != None ] && [ "$virt" = $V ]; then
        pass "search V=$V: bit-identical to one process; --json: schedule $name, chose $origin"
    else
        failed "search V=$V: --json schedule '$name' origin '$origin' virtual '$virt'"
    fi
done
out="$WORK/search_mem.st"
if run "$out" 2 --stages 2 --microbatches 4 --schedule search --schedule-memory 1; then
    held=$(json_field stage_peak_microbatches <"$out.json")
    if same "search --schedule-memory 1" "$out" "$WORK/ref.st" && [ "$held" = "[1, 1]" ]; then
        pass "search --schedule-memory 1: bit-identical, holds $held"
    else
        failed "search --schedule-memory 1: holds $held"
    fi
else
    failed "search --schedule-memory 1: run failed"; tail -n 3 "$out.err"
fi

# --- schedule files ---
"$PIPETRAIN" schedule --stages 2 --microbatches 4 --schedule zb-v \
    --save-schedule "$WORK/zbv.txt" >/dev/null
run "$WORK/zbv.st" 2 --stages 2 --microbatches 4 --schedule zb-v
if run "$WORK/file.st" 2 --stages 2 --microbatches 4 --schedule-file "$WORK/zbv.txt"; then
    same "--schedule-file zb-v" "$WORK/file.st" "$WORK/zbv.st" &&
        same "--schedule-file zb-v against one process" "$WORK/file.st" "$WORK/ref.st" &&
        pass "--schedule-file (zb-v saved by pipetrain schedule): bit-identical to --schedule zb-v and one process"
else
    failed "--schedule-file: run failed"; tail -n 3 "$WORK/file.st.err"
fi

expect2() { # expect2 NAME PATTERN COMMAND...: exit 2 and PATTERN on stderr
    local name=$1 pattern=$2 rc=0
    shift 2
    timeout 60 "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 2 ] && grep -q -- "$pattern" "$WORK/err"; then
        pass "$name (exit 2): $(grep -m1 -- "$pattern" "$WORK/err")"
    else
        failed "$name: exit $rc, stderr:"; cat "$WORK/err"
    fi
}
# stage 0's first forward and its send swapped: the send of an activation not computed yet
awk '!done && $1 == "0" && $2 == "F" { held = $0; getline; print; print held; done = 1; next } { print }' \
    "$WORK/zbv.txt" >"$WORK/swapped.txt"
line=$(grep -n "^0 send_act" "$WORK/swapped.txt" | head -n 1 | cut -d: -f1)
expect2 "--schedule-file with two ops swapped" "swapped.txt line $line" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --stages 2 --microbatches 4 \
    --schedule-file "$WORK/swapped.txt"
sed '5s/ F / Q /' "$WORK/zbv.txt" >"$WORK/broken.txt"
expect2 "--schedule-file with an unknown op" "broken.txt line 5" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --stages 2 --microbatches 4 \
    --schedule-file "$WORK/broken.txt"
expect2 "--schedule-file of another layout" "zbv.txt line 2: a schedule of 2 stages and 4" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --stages 2 --microbatches 8 \
    --schedule-file "$WORK/zbv.txt"
expect2 "--schedule-file with --schedule" "not with --schedule" \
    "$PIPETRAIN" train "${COMMON[@]}" --schedule-file "$WORK/zbv.txt" --schedule 1f1b
expect2 "--schedule-memory below one micro-batch" "the smallest, .* holds 1" \
    "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --stages 2 --microbatches 4 \
    --schedule search --schedule-memory 0.5
expect2 "--schedule-memory without search" "is the limit of --schedule search" \
    "$PIPETRAIN" train "${COMMON[@]}" --schedule-memory 2
finish
