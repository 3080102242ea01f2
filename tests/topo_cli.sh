#!/usr/bin/env bash
# ctest script: `pipetrain topo` and `pipetrain plan` end to end. Runs the summary and JSON
# of this machine and of every machine description in topologies/, plans on the 8-GPU
# node (one and two nodes), and checks that impossible requests fail with a clear message
# and the right exit status (1 error, 2 usage). Needs PIPETRAIN (the built binary) and
# PT_SOURCE_DIR; exits non-zero on any failure.
set -euo pipefail

: "${PIPETRAIN:?set PIPETRAIN to the built pipetrain binary}"
SRC=${PT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
MODEL=$SRC/models/seed-cnn.cfg
GPU8=$SRC/topologies/node-2s-8gpu.xml
TWO=$SRC/topologies/local-2core.xml
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/lib/debian_python.bash"
debian_python "$TMP"

checks=0
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# expect STATUS REGEX COMMAND...: the command exits with STATUS and its stdout or stderr
# matches the extended regular expression.
expect() {
    local want=$1 pattern=$2 got=0
    shift 2
    checks=$((checks + 1))
    "$@" >"$TMP/out" 2>"$TMP/err" || got=$?
    if [[ $got -ne $want ]]; then
        fail "$* exited with $got, expected $want"
        sed 's/^/    /' "$TMP/err" >&2
        return 0
    fi
    if ! grep -q -E -e "$pattern" "$TMP/out" "$TMP/err"; then
        fail "$*: output does not match /$pattern/"
        sed 's/^/    /' "$TMP/out" "$TMP/err" | head -20 >&2
    fi
}

# json_check FILE PYTHON_EXPR: the file is JSON and the expression (over `d`) is true.
json_check() {
    checks=$((checks + 1))
    if ! python3 -m json.tool "$1" >/dev/null; then
        fail "$1 is not valid JSON"
        return 0
    fi
    if ! python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"; then
        fail "$1: JSON check failed: $2"
    fi
}

# ---- topo ---------------------------------------------------------------------------
expect 0 "Topology: this machine" "$PIPETRAIN" topo
expect 0 "cores [0-9]+, hardware threads" "$PIPETRAIN" topo
expect 0 "usage: pipetrain topo" "$PIPETRAIN" topo --help
"$PIPETRAIN" topo --json >"$TMP/this.json"
json_check "$TMP/this.json" "d['this_system'] is True and d['cores'] >= 1 and len(d['core_list']) == d['cores']"

n_xml=0
for xml in "$SRC"/topologies/*.xml; do
    n_xml=$((n_xml + 1))
    expect 0 "Topology: .*$(basename "$xml")" "$PIPETRAIN" topo --topology "$xml"
    expect 0 "a described machine" "$PIPETRAIN" topo --topology "$xml"
    "$PIPETRAIN" topo --topology "$xml" --json >"$TMP/x.json"
    json_check "$TMP/x.json" "d['this_system'] is False and d['cores'] > 0 and d['pus'] >= d['cores']"
    if command -v lstopo-no-graphics >/dev/null; then
        checks=$((checks + 1))
        lstopo-no-graphics -i "$xml" >/dev/null 2>&1 || fail "lstopo-no-graphics -i $xml failed"
    fi
done
[[ $n_xml -ge 4 ]] || fail "expected at least 4 machine descriptions, found $n_xml"

# 8 GPUs: the BMC's ASPEED VGA is a display adapter, not a compute device
expect 0 "GPUs: 8 \(8 NVIDIA\)" "$PIPETRAIN" topo --topology "$GPU8"
expect 0 "NVLinkBandwidth" "$PIPETRAIN" topo --topology "$GPU8"
expect 0 "NUMALatency" "$PIPETRAIN" topo --topology "$GPU8"
"$PIPETRAIN" topo --topology "$GPU8" --json >"$TMP/gpu8.json"
json_check "$TMP/gpu8.json" "len(d['gpus']) == 8 and sum(g['nvidia'] for g in d['gpus']) == 8 and \
d['packages'] == 2 and \
d['gpu_bandwidth']['matrix'][0][3] == 50e9 and d['numa_distance']['matrix'] == [[10, 21], [21, 10]]"
expect 0 "GPUs: 1 \(1 NVIDIA\)" "$PIPETRAIN" topo --topology "$SRC/topologies/node-16c-1gpu.xml"
expect 0 "GPUs: 4 \(4 NVIDIA\)" "$PIPETRAIN" topo --topology "$SRC/topologies/ws-4gpu.xml"

# ---- plan ---------------------------------------------------------------------------
# the layers profiled once (the first plan), every later plan priced from the same figures
PLAN=("$PIPETRAIN" plan --model "$MODEL" --costs-file "$TMP/cnn.costs")
expect 0 "usage: pipetrain plan" "$PIPETRAIN" plan --help
expect 0 "Stage boundaries by link: gpu-link 7" \
    "${PLAN[@]}" --stages 8 --device cuda --topology "$GPU8"
expect 0 "better\)" "${PLAN[@]}" --stages 8 --device cuda --topology "$GPU8"
expect 0 "rank order" "${PLAN[@]}" --stages 8 --nodes 2 --topology "$GPU8"
# --partition params: the cut, and so the links crossed, must not depend on timings
expect 0 "cross-node 1" "${PLAN[@]}" --stages 4 --nodes 2 --topology "$GPU8" \
    --partition params
expect 0 "msg/ubatch" "${PLAN[@]}" --stages 2 --microbatches 4 \
    --bandwidth same-package=20e9,cross-package=10e9,cross-node=12.5e9 --topology "$GPU8"

"${PLAN[@]}" --stages 8 --nodes 2 --device cuda --topology "$GPU8" --json \
    >"$TMP/plan.json"
json_check "$TMP/plan.json" "len(d['placement']) == 8 and d['cost_s'] <= d['rank_order_cost_s'] and \
len({(p['node'], p['gpu']) for p in d['placement']}) == 8 and \
all(p['next_link'] in ('gpu-link', None) for p in d['placement'])"
"${PLAN[@]}" --stages 4 --gpus-per-stage 2 --topology "$GPU8" --json \
    >"$TMP/dp.json"
json_check "$TMP/dp.json" "d['ranks'] == 8 and d['replicas'] == 2 and \
{p['replica'] for p in d['placement']} == {0, 1}"
# bytes per step do not depend on the number of micro-batches; the message size does (a
# cut by parameters: a cut by measured time may move between two runs on a busy machine)
"${PLAN[@]}" --stages 2 --microbatches 1 --partition params \
    --topology "$TWO" --json >"$TMP/m1.json"
"${PLAN[@]}" --stages 2 --microbatches 8 --partition params \
    --topology "$TWO" --json >"$TMP/m8.json"
checks=$((checks + 1))
python3 - "$TMP/m1.json" "$TMP/m8.json" <<'EOF' || fail "micro-batches changed the bytes per step"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
pa, pb = a["placement"][0], b["placement"][0]
assert pa["bytes_sent_per_step"] == pb["bytes_sent_per_step"] > 0
assert abs(pa["message_bytes"] - 8 * pb["message_bytes"]) < 1e-6 * pa["message_bytes"]
EOF

# --batch is samples per optimizer step, as in train: with R replicas each gets batch / R,
# so 2 replicas of batch 128 send the messages of one replica of batch 64.
"${PLAN[@]}" --stages 2 --replicas 2 --batch 128 --partition params \
    --topology "$GPU8" --json >"$TMP/r2.json"
"${PLAN[@]}" --stages 2 --batch 64 --partition params \
    --topology "$GPU8" --json >"$TMP/r1.json"
json_check "$TMP/r2.json" "d['batch'] == 128 and d['replicas'] == 2"
checks=$((checks + 1))
python3 - "$TMP/r2.json" "$TMP/r1.json" <<'EOF' || fail "plan --batch is not per optimizer step"
import json, sys
r2, r1 = (json.load(open(f)) for f in sys.argv[1:3])
# ranks are stage-major (a stage's replicas consecutive): stage 0's two replicas send
m2 = [p["message_bytes"] for p in r2["placement"]]
m1 = [p["message_bytes"] for p in r1["placement"]]
assert m2 == [m1[0], m1[0], m1[1], m1[1]] and m1[0] > 0, (m2, m1)
EOF
expect 0 "Batch 128 per step \(64 per replica\) in 1 micro-batches" \
    "${PLAN[@]}" --stages 2 --replicas 2 --partition params --topology "$GPU8"
# The predicted step: a slower link between the replicas (--bandwidth) makes their
# reductions slower; one replica reduces nothing.
SLOW=same-core=1e8,same-l3=1e8,same-numa=1e8,same-package=1e8,cross-package=1e8
for bw in "" "--bandwidth $SLOW"; do
    "${PLAN[@]}" --stages 1 --replicas 2 --microbatches 2 \
        --overlap off --topology "$TWO" $bw --json >"$TMP/pred${bw:+_slow}.json"
done
json_check "$TMP/r1.json" "d['predicted']['step_s'] > 0 and d['predicted']['stage_reduce_s'] == [0, 0]"
checks=$((checks + 1))
python3 - "$TMP/pred.json" "$TMP/pred_slow.json" <<'EOF' || fail "plan's prediction ignores the reductions' link"
import json, sys
fast, slow = (json.load(open(f))["predicted"] for f in sys.argv[1:3])
assert fast["schedule"] == "1f1b" and fast["reduce"] == "allreduce", fast
# seed-cnn holds more than 1 MB of gradients: over 1e8 B/s that is more than 10 ms
assert slow["stage_reduce_s"][0] > 10e-3 > fast["stage_reduce_s"][0] > 0, (fast, slow)
# and with --overlap off the step waits for all of it (the layer times are measured anew
# by each run: no comparison of step times across the two runs)
assert slow["stage_reduce_exposed_s"][0] > 5e-3 > fast["stage_reduce_exposed_s"][0], (fast, slow)
assert slow["step_s"] >= slow["stage_compute_s"][0] + slow["stage_reduce_exposed_s"][0] - 1e-9
EOF
expect 2 "--bucket-mb 0: must be positive" \
    "${PLAN[@]}" --stages 2 --replicas 2 --bucket-mb 0
expect 2 "unknown schedule" "${PLAN[@]}" --stages 2 --schedule nope
# --partition defaults to time, as in train
"${PLAN[@]}" --stages 2 --topology "$GPU8" --json >"$TMP/default.json"
json_check "$TMP/default.json" "d['partition']['method'] == 'time' and d['microbatches'] == 1"

# ---- JSON of odd paths ----------------------------------------------------------------
# Paths may hold any byte: quotes, backslashes and tabs must be escaped, and bytes that are
# not UTF-8 (JSON must be UTF-8) replaced by U+FFFD.
# json_path FILE KEY PATH: FILE is JSON for json.load(sys.stdin) and as strict UTF-8 bytes,
# and d[KEY] is PATH (its bytes decoded as UTF-8, each bad byte as U+FFFD).
json_path() {
    checks=$((checks + 1))
    if ! python3 -c 'import json,sys; json.load(sys.stdin)' <"$1" ||
        ! python3 - "$@" <<'EOF'
import json, os, sys
f, key, path = sys.argv[1], sys.argv[2], os.fsencode(sys.argv[3])
d = json.loads(open(f, "rb").read())  # bytes: strict UTF-8, no surrogate escapes
want = path.decode("utf-8", "replace")
assert d[key] == want, f"{key}: {d[key]!r}, expected {want!r}"
EOF
    then
        fail "$1: not valid JSON, or $2 is not the path given:"
        head -c 300 "$1" >&2
        echo >&2
    fi
}
for name in 'my "models"\x	tab' $'bad utf-8 \xff\xc3(\xed\xa0\x80 "q"\\'; do
    dir="$TMP/$name"
    mkdir -p "$dir"
    cp "$SRC/models/seed-mlp.cfg" "$dir/mlp.cfg"
    cp "$TWO" "$dir/two.xml"
    "$PIPETRAIN" plan --model "$dir/mlp.cfg" --stages 2 --topology "$dir/two.xml" --json \
        >"$TMP/odd.json"
    json_path "$TMP/odd.json" model "$dir/mlp.cfg"
    json_path "$TMP/odd.json" topology "$dir/two.xml"
    "$PIPETRAIN" topo --topology "$dir/two.xml" --json >"$TMP/odd.json"
    json_path "$TMP/odd.json" source "$dir/two.xml"
done
# a value that does not exist is null: the last stage sends no message
json_check "$TMP/m1.json" "d['placement'][-1]['message_bytes'] is None and \
d['placement'][-1]['next_link'] is None and d['placement'][0]['message_bytes'] > 0"

# ---- errors -------------------------------------------------------------------------
printf '<?xml version="1.0"?>\n<topology version="2.0">\n<object type="Machine"\n' >"$TMP/bad.xml"
expect 2 "^pipetrain: .*bad.xml: not a valid hwloc XML topology" \
    "$PIPETRAIN" topo --topology "$TMP/bad.xml"
expect 2 "not a valid hwloc XML topology" \
    "${PLAN[@]}" --stages 2 --topology "$TMP/bad.xml"
# hwloc without its libxml2 reader (Debian's libhwloc-plugins) rejects every hand-written
# file: the message must name the package, not blame the file.
mkdir -p "$TMP/no-plugins"
expect 2 "hwloc cannot read XML topologies on this machine.*apt-get install libhwloc-plugins" \
    env HWLOC_PLUGINS_PATH="$TMP/no-plugins" "$PIPETRAIN" topo --topology "$TWO"
expect 2 "missing.xml: cannot open: No such file" "$PIPETRAIN" topo --topology "$TMP/missing.xml"
expect 2 "no NVIDIA GPU in .*local-2core.xml" \
    "${PLAN[@]}" --stages 2 --device cuda --topology "$TWO"
expect 2 "9 ranks need a GPU each, but 1 node of .* has 8 NVIDIA GPUs" \
    "${PLAN[@]}" --stages 9 --device cuda --topology "$GPU8"
expect 2 "11 layers into 12 stages" "${PLAN[@]}" --stages 12 --topology "$GPU8"
expect 2 "exclusive" "${PLAN[@]}" --stages 3 --exclusive --topology "$TWO"
expect 0 "oversubscribed" "${PLAN[@]}" --stages 3 --topology "$TWO"
expect 2 "unknown link \"fast\"" "${PLAN[@]}" --stages 2 --bandwidth fast=1e9
expect 2 "--model FILE is required" "$PIPETRAIN" plan --stages 2
expect 2 "--stages 0: must be between 1 and 4096" "${PLAN[@]}" --stages 0
expect 2 "give --stages K" "${PLAN[@]}"
expect 2 "--batch 128 does not split evenly over 3 replicas" \
    "${PLAN[@]}" --stages 2 --replicas 3 --topology "$GPU8"
expect 2 "--microbatches 3 does not divide the 64 samples per replica" \
    "${PLAN[@]}" --stages 2 --replicas 2 --microbatches 3 --topology "$GPU8"
expect 2 "unknown option --frobnicate" "$PIPETRAIN" topo --frobnicate

if [[ $failures -ne 0 ]]; then
    echo "topo_cli: $failures of $checks checks failed" >&2
    exit 1
fi
echo "topo_cli: all $checks checks passed"
