# experiments/study.py all --quick: every study runs end to end on tiny runs (its numbers
# mean nothing), records every run with its command and machine, draws its figures (cpu-gpu
# from the runs recorded on a GPU machine, results/recorded/cpu-gpu/, where this one has
# none), and leaves docs/ alone; bad input gets a message and a non-zero exit.
source "$(dirname "$0")/lib/common.bash"
STUDY=(python3 "$PT_SOURCE_DIR/experiments/study.py" --pipetrain "$PIPETRAIN" --mpiexec "$MPIEXEC")
before=$(cd "$PT_SOURCE_DIR" && git status --porcelain docs 2>/dev/null || true)

if "${STUDY[@]}" all --quick --results "$WORK/res" --figures "$WORK/fig" >"$WORK/out" 2>&1; then
    pass "study.py all --quick ($(grep -c '^== .*runs in' "$WORK/out") studies)"
else
    failed "study.py all --quick"; tail -n 30 "$WORK/out"
fi
python3 - "$WORK/res" "$WORK/fig" <<'PY' && pass "runs recorded (command, machine, kind) and figures drawn" \
    || failed "runs or figures missing"
import json, os, sys
res, fig = sys.argv[1:3]
studies = ["layouts", "scaling", "batch", "schedules", "partition", "cpu-gpu"]
for s in studies:
    lines = open(os.path.join(res, s, "runs.jsonl")).read().splitlines()
    recs = [json.loads(l) for l in lines]
    if s != "cpu-gpu" or recs:  # cpu-gpu runs only where a GPU is
        assert recs, s
    for r in recs:
        assert r["study"] == s and r["kind"] in ("measured", "predicted") and r["quick"], r
        assert r["cmd"] and r["machine"]["cores"] >= 1 and isinstance(r["result"], dict), r
        assert (r["kind"] == "measured") == (" train " in r["cmd"]), r["cmd"]
for f in ("layouts", "scaling", "batch", "schedules", "partition", "cpu_gpu"):
    p = os.path.join(fig, f + ".png")
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n", p
PY
# the recorded GPU session is tabulated, named by its machine and date, as measured elsewhere
grep -q "Measured elsewhere, not on this machine:.* nvidia-h100-x1 .* on 2026-11-24" "$WORK/out" &&
    grep -q "^| seed-cnn | 128 | 118,495 \[113,870–127,172\], 3 runs" "$WORK/out" &&
    pass "cpu-gpu: the H100 runs recorded in results/recorded/ are tabulated and marked" ||
    failed "cpu-gpu: no table of the recorded H100 runs"
after=$(cd "$PT_SOURCE_DIR" && git status --porcelain docs 2>/dev/null || true)
[ "$before" = "$after" ] && pass "--quick leaves docs/ alone" || failed "--quick changed docs/"

# bad input
expect_fail "unknown study" "unknown study 'nope'" "${STUDY[@]}" nope --quick
touch "$WORK/file"
expect_fail "results directory that cannot be made" "cannot create $WORK/file/x" \
    "${STUDY[@]}" schedules --quick --results "$WORK/file/x" --no-plot
mkdir -p "$WORK/rec/cpu-gpu"
{ head -n 1 "$PT_SOURCE_DIR/results/recorded/cpu-gpu/h100-2026-11-24.jsonl"; echo '{"study": '; } \
    >"$WORK/rec/cpu-gpu/h100.jsonl"
expect_fail "a malformed recorded run, named by file and line" "h100.jsonl:2: not JSON" \
    "${STUDY[@]}" cpu-gpu --quick --results "$WORK/res2" --recorded "$WORK/rec" --no-plot
sed -n 1p "$PT_SOURCE_DIR/results/recorded/cpu-gpu/h100-2026-11-24.jsonl" |
    sed 's/"measured_elsewhere": true/"measured_elsewhere": false/' >"$WORK/rec/cpu-gpu/h100.jsonl"
expect_fail "a recorded run not marked as measured elsewhere" 'h100.jsonl:1: not a recorded run' \
    "${STUDY[@]}" cpu-gpu --quick --results "$WORK/res2" --recorded "$WORK/rec" --no-plot
expect_fail "no pipetrain binary" "no pipetrain binary" \
    python3 "$PT_SOURCE_DIR/experiments/study.py" schedules --quick --pipetrain "$WORK/none"
finish
