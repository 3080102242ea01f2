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
# the learning check needs PyTorch (the peer); without it, --quick skips that study
HAS_TORCH=0
/usr/bin/python3 -c "import torch, numpy" 2>/dev/null && HAS_TORCH=1
python3 - "$WORK/res" "$WORK/fig" "$HAS_TORCH" <<'PY' && pass "runs recorded (command, machine, kind) and figures drawn" \
    || failed "runs or figures missing"
import json, os, sys
res, fig, has_torch = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
studies = ["layouts", "scaling", "batch", "schedules", "partition", "cpu-gpu", "transformer", "zero"]
if has_torch:
    studies.append("gpt-learning")
for s in studies:
    lines = open(os.path.join(res, s, "runs.jsonl")).read().splitlines()
    recs = [json.loads(l) for l in lines]
    if s != "cpu-gpu" or recs:  # cpu-gpu runs only where a GPU is
        assert recs, s
    for r in recs:
        assert r["study"] == s and r["kind"] in ("measured", "predicted") and r["quick"], r
        assert r["cmd"] and r["machine"]["cores"] >= 1 and isinstance(r["result"], dict), r
        # measured: pipetrain's train, or the learning check's PyTorch peer
        assert (r["kind"] == "measured") == (" train " in r["cmd"] or
                                             "/learn_gpt.py " in r["cmd"]), r["cmd"]
for f in ("layouts", "scaling", "batch", "schedules", "partition", "cpu_gpu"):
    p = os.path.join(fig, f + ".png")
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n", p
for f in ("transformer_partition", "transformer_schedules", "transformer_layouts",
          "transformer_memory") + (("gpt_learning",) if has_torch else ()):
    p = os.path.join(fig, f + ".svg")
    assert b"<svg" in open(p, "rb").read(2000), p
if not has_torch:
    sys.exit(0)
# the learning check: the peer started from pipetrain's bits, on the same corpus
peer = [r for r in map(json.loads, open(os.path.join(res, "gpt-learning", "runs.jsonl")))
        if "/learn_gpt.py " in r["cmd"]]
assert peer, "no PyTorch peer run recorded"
for r in peer:
    i = r["result"]["init"]
    assert i["differ"] == 0 and i["compared"] > 0, i
    assert i["corpus_digest"] == i["checkpoint_corpus_digest"], i
first = [json.loads(l) for l in open(os.path.join(res, "gpt-learning", "seed0", "metrics.jsonl"))
         if '"step"' in l][0]["loss"]
for r in peer:  # the same parameters on the same windows: the same first loss
    assert abs(r["result"]["losses"][0] - first) < 1e-5 * first, (r["result"]["losses"][0], first)
PY
# the comparison of the initial parameters can fail: seed 1 against seed 0's checkpoint
if [ "$HAS_TORCH" = 0 ]; then
    echo "skip: no PyTorch for /usr/bin/python3: the learning check's peer is not run"
else
python3 "$PT_SOURCE_DIR/experiments/learn_gpt.py" --model "$PT_SOURCE_DIR/models/gpt-mini.cfg" \
    --seed 1 --steps 1 --lr-warmup 0 --eval-windows 1 --threads 1 \
    --check-init "$WORK/res/gpt-learning/seed0/init/ckpt-0000000001.safetensors" >"$WORK/peer1" \
    2>&1 && tail -n 1 "$WORK/peer1" | python3 -c '
import json, sys
i = json.loads(sys.stdin.read())["init"]
sys.exit(not (i["differ"] > 0.99 * i["compared"] and i["checkpoint_seed"] == "0"))' &&
    pass "learn_gpt.py: another seed's initial parameters differ from the checkpoint's" ||
    { failed "learn_gpt.py: a checkpoint of another seed was not told apart"
      tail -n 5 "$WORK/peer1"; }
fi
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
