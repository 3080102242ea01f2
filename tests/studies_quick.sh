# experiments/study.py all --quick: every study runs end to end on tiny runs (its numbers
# mean nothing), records every run with its command and machine, draws its figures, and
# leaves docs/ alone; bad input gets a message and a non-zero exit.
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
for f in ("layouts", "scaling", "batch", "schedules", "partition"):
    p = os.path.join(fig, f + ".png")
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n", p
PY
after=$(cd "$PT_SOURCE_DIR" && git status --porcelain docs 2>/dev/null || true)
[ "$before" = "$after" ] && pass "--quick leaves docs/ alone" || failed "--quick changed docs/"

# bad input
expect_fail "unknown study" "unknown study 'nope'" "${STUDY[@]}" nope --quick
touch "$WORK/file"
expect_fail "results directory that cannot be made" "cannot create $WORK/file/x" \
    "${STUDY[@]}" schedules --quick --results "$WORK/file/x" --no-plot
expect_fail "no pipetrain binary" "no pipetrain binary" \
    python3 "$PT_SOURCE_DIR/experiments/study.py" schedules --quick --pipetrain "$WORK/none"
finish
