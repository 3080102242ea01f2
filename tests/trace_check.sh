# The Chrome trace of `train --trace`: valid JSON, the schedule named (a search's winner
# too), one process per rank named after its rank, stage (replica and tensor shard where
# the job has them) and host, one flow from the
# start of every send to the end of its receive, and no receive that ends before its send
# began, also when one rank's clock runs ahead and drifts
# (PIPETRAIN_DEBUG_CLOCK_SKEW, testing only). An unwritable trace fails on every rank with
# the path and the reason, and leaves no file behind.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
COMMON=(--model "$MODELS/seed-mlp.cfg" --batch 32 --steps 3 --train-samples 128
        --test-samples 0 --threads 1 --seed 3)

cat >"$WORK/check.py" <<'PY'
"""check.py TRACE RANKS MICROBATCHES STEPS [--shift-rank R SECONDS]: checks a trace; with
--shift-rank it first moves rank R's events by SECONDS, as an unaligned clock would."""
import json, sys

path, ranks, M, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
shift = {}
if len(sys.argv) > 5:
    shift[int(sys.argv[6])] = float(sys.argv[7]) * 1e6
doc = json.load(open(path))
ev = doc["traceEvents"]
for e in ev:
    if e.get("ph") != "M" and e["pid"] in shift:
        e["ts"] += shift[e["pid"]]

# one process per rank, named, sorted by rank; two named threads
meta = [e for e in ev if e.get("ph") == "M"]
slices = [e for e in ev if e.get("ph") == "X"]
pids = {e["pid"] for e in slices}
assert pids == set(range(ranks)), f"pids {sorted(pids)}, expected one per rank"
for r in range(ranks):
    names = [e["args"]["name"] for e in meta if e["name"] == "process_name" and e["pid"] == r]
    assert len(names) == 1, f"rank {r}: process names {names}"
    assert f"rank {r} " in names[0] and f"stage {r} " in names[0] and "host " in names[0], names
    sort = [e["args"]["sort_index"] for e in meta
            if e["name"] == "process_sort_index" and e["pid"] == r]
    assert sort == [r], f"rank {r}: process_sort_index {sort}"
    tids = {e["tid"] for e in slices if e["pid"] == r}
    named = {e["tid"] for e in meta if e["name"] == "thread_name" and e["pid"] == r}
    assert tids <= named, f"rank {r}: threads {tids} without names ({named})"
cats = {e["cat"] for e in slices}
need = {"forward", "backward", "send_act", "wait_act", "send_grad", "wait_grad", "optimizer",
        "sync"}
assert need <= cats, f"categories {cats} lack {need - cats}"

# the trace names the schedule it shows (train's default here)
sched = doc["otherData"]["schedule"]
assert sched == {"name": "1f1b", "origin": None, "microbatches": M, "chunks_per_rank": 1}, sched

# every flow: one start inside its send slice, one end inside its wait slice
err = {k["rank"]: k["clock_error_us"] for k in doc["otherData"]["ranks"]}
starts, ends = {}, {}
for e in ev:
    if e.get("ph") == "s":
        assert e["id"] not in starts, f"flow id {e['id']} starts twice"
        starts[e["id"]] = e
    elif e.get("ph") == "f":
        assert e["id"] not in ends, f"flow id {e['id']} ends twice"
        assert e.get("bp") == "e", f"flow end without bp=e: {e}"
        ends[e["id"]] = e
assert set(starts) == set(ends), \
    f"flows without an end: {sorted(set(starts) - set(ends))[:5]}, " \
    f"ends without a start: {sorted(set(ends) - set(starts))[:5]}"
expect = 2 * (ranks - 1) * M * steps
assert len(starts) == expect, f"{len(starts)} flows, expected {expect}"
by_flow = {}
for e in slices:
    if "flow" in e["args"]:
        by_flow.setdefault(e["args"]["flow"], []).append(e)

worst = None
late = []
least_on = {}  # rank: its receives' least send-start-to-receive-end (µs)
for fid, s in starts.items():
    f = ends[fid]
    assert s["name"] == f["name"] and s["cat"] == f["cat"], (s, f)
    pair = by_flow.get(fid, [])
    send = [e for e in pair if e["cat"].startswith("send_")]
    wait = [e for e in pair if e["cat"].startswith("wait_")]
    assert len(send) == 1 and len(wait) == 1, f"flow {fid}: slices {pair}"
    send, wait = send[0], wait[0]
    assert send["cat"][5:] == wait["cat"][5:], (send, wait)
    assert abs(send["pid"] - wait["pid"]) == 1, (send, wait)
    assert send["args"]["microbatch"] == wait["args"]["microbatch"], (send, wait)
    assert send["args"]["step"] == wait["args"]["step"], (send, wait)
    for point, sl in ((s, send), (f, wait)):
        assert point["pid"] == sl["pid"] and point["tid"] == sl["tid"], (point, sl)
        assert sl["ts"] - 0.0015 <= point["ts"] <= sl["ts"] + sl["dur"] + 0.0015, \
            f"flow outside its slice: {point} {sl}"
    # the arrow runs from where the send began to where the wait ended (never back in time:
    # a midpoint would, whenever the send came in the second half of the wait)
    assert abs(s["ts"] - send["ts"]) < 0.003, f"flow {fid} starts inside its send: {s} {send}"
    assert abs(f["ts"] - (wait["ts"] + wait["dur"])) < 0.003, f"flow {fid} ends inside its wait: {f} {wait}"
    # the receive cannot end before the send began: allow 1 µs and the clocks' error bounds
    margin = wait["ts"] + wait["dur"] - send["ts"]
    tol = 1.0 + err[send["pid"]] + err[wait["pid"]]
    if worst is None or margin < worst[0]:
        worst = (margin, wait["name"], wait["pid"], send["pid"])
    least_on[wait["pid"]] = min(margin, least_on.get(wait["pid"], margin))
    if margin < -tol:
        late.append((round(margin, 3), wait["name"], wait["args"]["step"], wait["pid"]))
assert not late, f"{len(late)} of {len(starts)} receives end before their send began " \
    f"(µs, slice, step, rank): {late[:5]}"
with open(sys.argv[1] + ".least", "w") as out:
    out.write(" ".join(f"{r}:{least_on[r]:.1f}" for r in sorted(least_on)) + "\n")
print(f"{len(slices)} slices, {len(starts)} flows, clock error bounds (µs) "
      f"{[round(err[r], 2) for r in range(ranks)]}, least send-start-to-receive-end "
      f"{worst[0]:.1f} µs ({worst[1]} on rank {worst[2]})")
PY

# run NAME K OUT [VAR=VALUE...]: a K-stage run writing the trace OUT.
run() {
    local name=$1 k=$2 out=$3
    shift 3
    if env "$@" timeout 120 "$MPIEXEC" -n "$k" "$PIPETRAIN" train "${COMMON[@]}" --stages "$k" \
        --microbatches 4 --trace "$out" >"$WORK/out" 2>"$WORK/err"; then
        return 0
    fi
    failed "$name: run failed"
    cat "$WORK/err"
    return 1
}

# check NAME K TRACE [--shift-rank R S]
check() {
    local name=$1 k=$2 trace=$3
    shift 3
    if python3 "$WORK/check.py" "$trace" "$k" 4 3 "$@" >"$WORK/check" 2>&1; then
        pass "$name: $(tail -n 1 "$WORK/check")"
    else
        failed "$name"
        tail -n 3 "$WORK/check"
    fi
}

for k in 2 3; do
    t="$WORK/k$k.json"
    run "K=$k" "$k" "$t" && check "K=$k" "$k" "$t"
    # one rank's clock 50 ms ahead and gaining 5%: the trace must still put every receive
    # after its send
    last=$((k - 1))
    t="$WORK/k${k}_skew.json"
    run "K=$k, rank $last's clock +50 ms, drifting" "$k" "$t" \
        PIPETRAIN_DEBUG_CLOCK_SKEW="$last:0.05:0.05" &&
        check "K=$k, rank $last's clock +50 ms and drifting 5%, aligned" "$k" "$t"
    t="$WORK/k${k}_back.json"
    run "K=$k, rank 1's clock -50 ms" "$k" "$t" PIPETRAIN_DEBUG_CLOCK_SKEW="1:-0.05" &&
        check "K=$k, rank 1's clock 50 ms behind, aligned" "$k" "$t"
done

# The check can fail: with rank 1's events early by more than its receives' least margin
# (at least 0.5 ms: the old barrier-based origin was off by up to 562 µs; more where a
# loaded machine ran rank 1 late), its first receive of each step, which waits for stage
# 0's forward, ends before the send began.
if [ -s "$WORK/k2.json.least" ]; then
    us=$(python3 -c 'import sys; m = dict(x.split(":") for x in open(sys.argv[1]).read().split())
print(round(max(500.0, float(m["1"]) + 200.0)))' "$WORK/k2.json.least")
    if python3 "$WORK/check.py" "$WORK/k2.json" 2 4 3 --shift-rank 1 "-${us}e-6" >"$WORK/check" 2>&1
    then
        failed "the check accepts a trace with rank 1 shifted by -$us µs"
    else
        pass "the check rejects rank 1 shifted by -$us µs: $(tail -n 1 "$WORK/check" | cut -c1-150)"
    fi
fi

# Processes name the stage, replica and tensor shard of their rank (world rank =
# t + T·(s·R + r)): 2 stages × 2 replicas × 2 shards on 8 ranks.
t="$WORK/grid.json"
if timeout 120 "$MPIEXEC" -n 8 "$PIPETRAIN" train "${COMMON[@]}" --stages 2 --replicas 2 \
        --tensor 2 --microbatches 2 --trace "$t" >"$WORK/out" 2>"$WORK/err"; then
    if python3 - "$t" >"$WORK/check" 2>&1 <<'PY'
import json, sys
meta = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("name") == "process_name"]
names = {e["pid"]: e["args"]["name"] for e in meta}
assert sorted(names) == list(range(8)), names
for w, name in names.items():
    t, r, s = w % 2, w // 2 % 2, w // 4
    want = f"rank {w} \u00b7 stage {s} \u00b7 replica {r} \u00b7 tensor {t} \u00b7 host "
    assert name.startswith(want), (name, want)
print(names[5])
PY
    then pass "8 ranks as 2 stages × 2 replicas × 2 shards: $(tail -n 1 "$WORK/check")"
    else failed "process names of a 2 × 2 × 2 layout: $(tail -n 2 "$WORK/check")"; fi
else
    failed "2 × 2 × 2 traced run failed"
    cat "$WORK/err"
fi

# The trace names the schedule: a V schedule with its two chunks per rank, and a searched
# one with what the search chose, as train's --json reports it (schedule_origin).
for s in zb-v search; do
    t="$WORK/sched_$s.json" model=seed-mlp.cfg
    [ "$s" = zb-v ] && model=seed-cnn.cfg  # 4 model chunks: seed-mlp has 3 layers
    if timeout 120 "$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --stages 2 --microbatches 4 \
            --schedule "$s" --trace "$t" --json --model "$MODELS/$model" >"$WORK/out" \
            2>"$WORK/err"; then
        if python3 - "$t" "$s" "$WORK/out" >"$WORK/check" 2>&1 <<'PY'
import json, sys
sched = json.load(open(sys.argv[1]))["otherData"]["schedule"]
want = sys.argv[2]
run = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
assert sched["name"] == want and sched["microbatches"] == 4, sched
assert sched["chunks_per_rank"] == (2 if want == "zb-v" else run.get("virtual", 1)), sched
# a hand-written schedule has no origin; a search names its winner, as train reports it
assert sched["origin"] == run.get("schedule_origin"), (sched, run.get("schedule_origin"))
assert (sched["origin"] is None) == (want != "search"), sched
print(sched)
PY
        then pass "trace names the schedule $s: $(tail -n 1 "$WORK/check")"
        else failed "trace of $s: $(tail -n 2 "$WORK/check")"; fi
    else
        failed "$s traced run failed"
        cat "$WORK/err"
    fi
done

# An unwritable trace: the message names the path and the reason, every rank exits
# non-zero, and nothing is left where the trace would have gone.
# bad_trace NAME PATTERN PATH [launcher prefix...]: the prefix runs the job and the
# listing after it (in the mount namespace of the full disk below).
bad_trace() {
    local name=$1 pattern=$2 path=$3
    shift 3
    local rc=0 dir base
    dir=$(dirname "$path") base=$(basename "$path")
    # what bears the trace's name in its directory (the trace, a temporary beside it)
    listing() { ls -A "$1" 2>/dev/null | grep -F -- "$2" | sort || true; }
    listing "$dir" "$base" >"$WORK/before"
    "$@" bash -c 'dir=$1 base=$2 after=$3; shift 3
        timeout 120 "$@"; rc=$?
        ls -A "$dir" 2>/dev/null | grep -F -- "$base" | sort >"$after"
        exit $rc' bash "$dir" "$base" "$WORK/after" \
        "$MPIEXEC" -n 2 bash -c '"$@"; rc=$?; echo "rank $PMI_RANK exit $rc"; exit $rc' \
        bash "$PIPETRAIN" train "${COMMON[@]}" --stages 2 --microbatches 4 --trace "$path" \
        >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
        failed "$name: exit $rc"
    elif [ "$(grep -c "^rank [0-9]* exit [1-9]" "$WORK/out")" -ne 2 ]; then
        failed "$name: not every rank failed: $(grep "^rank" "$WORK/out" | tr '\n' ' ')"
    elif ! grep -q -- "$pattern" "$WORK/err"; then
        failed "$name: stderr lacks '$pattern':"; cat "$WORK/err"
    elif ! cmp -s "$WORK/before" "$WORK/after"; then
        failed "$name: left files behind in $dir: $(comm -13 "$WORK/before" "$WORK/after" | tr '\n' ' ')"
    else
        pass "$name: $(grep -m1 -- "$pattern" "$WORK/err")"
    fi
}
bad_trace "trace in a missing directory" \
    "--trace $WORK/missing/t.json: cannot write in $WORK/missing: No such file or directory" "$WORK/missing/t.json"
bad_trace "trace under /proc (no new files, whatever the permission bits say)" \
    "--trace /proc/pipetrain-trace.json: cannot create files in /proc" /proc/pipetrain-trace.json
mkdir "$WORK/adir"
bad_trace "trace onto a directory" "--trace $WORK/adir: is a directory" "$WORK/adir"
# A full disk (a 4 KiB tmpfs in a private mount namespace, where one can be made): the
# trace fails halfway, and neither it nor its temporary file may remain.
mkdir "$WORK/full"
if unshare -m sh -c "mount -t tmpfs -o size=4k tmpfs '$WORK/full'" 2>/dev/null; then
    bad_trace "trace on a full disk" "cannot write trace $WORK/full/t.json: No space left on device" \
        "$WORK/full/t.json" unshare -m sh -c \
        "mount -t tmpfs -o size=4k tmpfs '$WORK/full' && exec \"\$@\"" sh
else
    echo "skip: trace on a full disk (cannot mount a tmpfs in a private mount namespace)"
fi
finish
