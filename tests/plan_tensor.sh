# plan --tensor T [--tensor-mode M]: tensor shards priced by the planner (src/plan/print.c,
# src/plan/predict.c): parameters per rank from the shard plan, the tensor collectives
# (shard_stage_traffic) priced α–β on the tensor group's link, 0 without shards; the bad
# inputs; and plan --ranks trying tensor factors. seed-mlp (784 → 256 → 128 → 10) with the
# "params" cut, so that everything checked here but the compute is independent of timing.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
X=$PT_SOURCE_DIR/topologies/node-2s-8gpu.xml
# every link 1 GB/s and 10 µs: the collectives' price is known exactly
LINKS=same-core,same-l3,same-numa,same-package,cross-package,gpu-link,pcie,cross-node
BW=$(echo "$LINKS" | sed 's/\([a-z0-9-]*\)/\1=1e9/g')
LAT=$(echo "$LINKS" | sed 's/\([a-z0-9-]*\)/\1=1e-5/g')
P=(--model "$MODELS/seed-mlp.cfg" --topology "$X" --partition params --stages 1 --batch 128
   --bandwidth "$BW" --latency "$LAT")
for t in 1 2; do
    for mode in megatron gather; do
        "$PIPETRAIN" plan "${P[@]}" --tensor $t --tensor-mode $mode --json >"$WORK/t$t-$mode.json"
    done
done
"$PIPETRAIN" plan "${P[@]}" --tensor 2 >"$WORK/t2.txt"

# the shards, counted here from the model: megatron cuts 256 by outputs, 128 by inputs
# (whole bias), 10 by outputs; gather cuts every layer by its outputs
python3 - "$WORK" <<'PYEOF' && pass "parameters per rank: the shard plan's, about half of --tensor 1's" || failed "parameters per rank"
import json, sys
w = sys.argv[1]
d = {k: json.load(open(f'{w}/t{k}.json')) for k in ('1-megatron', '2-megatron', '2-gather')}
whole = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
one = d['1-megatron']['predicted']
assert one['stage_param_bytes'] == [whole] and one['stage_param_bytes_per_rank'] == [whole], one
meg = 4 * ((128 * 784 + 128) + (128 * 128 + 128) + (5 * 128 + 5))
gat = 4 * ((128 * 784 + 128) + (64 * 256 + 64) + (5 * 128 + 5))
for k, want in (('2-megatron', meg), ('2-gather', gat)):
    p = d[k]['predicted']
    assert p['stage_param_bytes'] == [whole], (k, p['stage_param_bytes'])
    assert p['stage_param_bytes_per_rank'] == [want], (k, p['stage_param_bytes_per_rank'], want)
    assert abs(want - whole / 2) < 0.02 * whole, (want, whole)
    # memory per rank shrinks with the parameters (and their gradients and moments)
    assert p['stage_memory_bytes'][0] < one['stage_memory_bytes'][0], (k, p, one)
    assert d[k]['tensor'] == 2 and d[k]['ranks'] == 2, d[k]
    assert [x['tensor'] for x in d[k]['placement']] == [0, 1]
PYEOF
# the text: params/rank against params/stage of the same row (kB)
python3 - "$WORK/t2.txt" <<'PYEOF' && pass "text: each stage's params/rank about half its params/stage" || { failed "text: tensor table"; cat "$WORK/t2.txt"; }
import re, sys
t = open(sys.argv[1]).read()
assert 'tensor shards: 2, mode megatron' in t, t
assert re.search(r'^\s+2\s+dense\s+inputs\s+sharded\s+whole \(all-reduced\)', t, re.M), t
rows = re.findall(r'^\s+0\s+([\d.]+) kB\s+([\d.]+) kB\s+1AG 1AR\s+1AR 0AG', t, re.M)
assert len(rows) == 1, rows
rank, stage = map(float, rows[0])
assert abs(rank - stage / 2) < 0.02 * stage, (rank, stage)
assert re.search(r'^Tensor group ring edges by link: \S+ 2$', t, re.M), t
PYEOF

# the collectives: what shard_stage_traffic says per sample (megatron: one all-reduce of
# 128 each way and the output's all-gather of 10; gather: all-gathers of 256, 128 and 10
# forward, all-reduces of 256 and 128 backward), priced 2(T-1)/T·n/β + 2(T-1)·α per
# all-reduce and (T-1)/T·n/β + (T-1)·α per all-gather, n = values · 128 samples · 4 bytes
python3 - "$WORK" <<'PYEOF' && pass "tensor collectives: 0 for T = 1, the ring's α–β price for T = 2, gather more than megatron" || failed "tensor collectives"
import json, sys
w = sys.argv[1]
d = {k: json.load(open(f'{w}/t{k}.json')) for k in ('1-megatron', '1-gather', '2-megatron', '2-gather')}
for k in ('1-megatron', '1-gather'):
    p = d[k]['predicted']
    assert p['tensor_collective_s'] == [0], p
    assert d[k]['tensor_link'] is None
tr = {k: d[k]['predicted']['tensor_traffic_per_sample'][0] for k in ('2-megatron', '2-gather')}
assert tr['2-megatron'] == dict(fwd_gather=10, fwd_reduce=128, bwd_reduce=128, bwd_gather=0,
                                fwd_gathers=1, fwd_reduces=1, bwd_reduces=1, bwd_gathers=0), tr
assert tr['2-gather'] == dict(fwd_gather=394, fwd_reduce=0, bwd_reduce=384, bwd_gather=0,
                              fwd_gathers=3, fwd_reduces=0, bwd_reduces=2, bwd_gathers=0), tr
T, a, b, n = 2, 1e-5, 1e9, 128 * 4
def price(x):
    f = (T - 1) / T
    return (f * (x['fwd_gather'] + x['bwd_gather']) * n / b
            + (x['fwd_gathers'] + x['bwd_gathers']) * (T - 1) * a
            + 2 * f * (x['fwd_reduce'] + x['bwd_reduce']) * n / b
            + (x['fwd_reduces'] + x['bwd_reduces']) * 2 * (T - 1) * a)
got = {k: d[k]['predicted']['tensor_collective_s'][0] for k in tr}
for k in tr:
    assert abs(got[k] - price(tr[k])) < 1e-9 + 1e-6 * price(tr[k]), (k, got[k], price(tr[k]))
assert got['2-gather'] > got['2-megatron'] > 0, got
# the collectives are inside the stage's compute: never less than them
for k in tr:
    assert d[k]['predicted']['stage_compute_s'][0] >= got[k], d[k]['predicted']
PYEOF
grep -q "^  stage     compute  reductions     exposed    memory/rank      tensor$" "$WORK/t2.txt" \
    && pass "text: the predicted step's tensor column" || failed "text: the tensor column"

# replicas and stages: rank = t + T·(stage·R + replica); --emit passes the shards on
"$PIPETRAIN" plan --model "$MODELS/seed-mlp.cfg" --topology "$X" --partition params \
    --stages 2 --replicas 2 --tensor 2 --json >"$WORK/grid.json"
python3 - "$WORK/grid.json" <<'PYEOF' && pass "2 stages × 2 replicas × 2 shards: 8 ranks, tensor index innermost, then replicas, stages outermost; groups inside a socket" || failed "the rank grid"
import json, sys
d = json.load(open(sys.argv[1]))
pl = d['placement']
assert d['ranks'] == 8 and len(pl) == 8, d
assert [(x['tensor'], x['stage'], x['replica']) for x in pl] == \
    [(i % 2, i // 4, (i // 2) % 2) for i in range(8)], pl
assert d['tensor_link'] in ('same-core', 'same-l3', 'same-numa', 'same-package'), d['tensor_link']
assert all(x > 0 for x in d['predicted']['tensor_collective_s']), d['predicted']
PYEOF
cmd=$("$PIPETRAIN" plan --model "$MODELS/seed-mlp.cfg" --topology "$X" --partition params \
      --stages 2 --replicas 2 --tensor 2 --tensor-mode gather --emit mpiexec)
case "$cmd" in
    "mpiexec -n 8 "*"--tensor 2 --tensor-mode gather"*) pass "--emit: 8 ranks, --tensor 2 --tensor-mode gather" ;;
    *) failed "--emit with --tensor printed: $cmd" ;;
esac

# bad inputs
expect_fail "--tensor 0" "--tensor 0: must be between 1" \
    "$PIPETRAIN" plan "${P[@]}" --tensor 0
expect_fail "unknown --tensor-mode" "--tensor-mode zigzag: expected megatron or gather" \
    "$PIPETRAIN" plan "${P[@]}" --tensor 2 --tensor-mode zigzag
expect_fail "a layer that cannot be cut 16 ways" \
    "layer 3 (dense, line .*) has 10 units: it cannot be cut into 16 tensor shards" \
    "$PIPETRAIN" plan "${P[@]}" --tensor 16
expect_fail "--ranks with --tensor 16" "cannot be cut into 16 tensor shards" \
    "$PIPETRAIN" plan --model "$MODELS/seed-mlp.cfg" --ranks 16 --tensor 16 --batch 32

# the search: tensor factors of 8 in both modes, a layout printed with its reason
"$PIPETRAIN" plan --model "$MODELS/seed-mlp.cfg" --topology "$X" --partition params --batch 32 \
    --ranks 8 >"$WORK/search.txt"
grep -q "^Choice: --stages [0-9]* --replicas [0-9]*.* --recompute \(none\|all\)$" "$WORK/search.txt" \
    && grep -qE "^  1 +[0-9]+ +[0-9]+ +(1|[248]:(megatron|gather)) " "$WORK/search.txt" \
    && grep -qE "^(Tensor: [248] shards \((megatron|gather)\) .* per step \(of .*\) on the [a-z0-9-]+ links|Tensor shards: the best layout with them \(--stages .* --tensor [248] .*)$" "$WORK/search.txt" \
    && pass "--ranks 8: a layout, and what tensor shards cost or bring" \
    || { failed "--ranks 8"; cat "$WORK/search.txt"; }
"$PIPETRAIN" plan --model "$MODELS/seed-mlp.cfg" --topology "$X" --partition params --batch 32 \
    --ranks 8 --top 1000 --json >"$WORK/search.json"
python3 - "$WORK/search.json" <<'PYEOF' && pass "--ranks 8: T = 1, 2, 4, 8, both modes; T = 2 groups inside a socket where they can be" || failed "--ranks 8 --json"
import json, sys
c = json.load(open(sys.argv[1]))['choices']
assert {(x['tensor'], x['tensor_mode']) for x in c if x['tensor'] > 1} == \
    {(t, m) for t in (2, 4, 8) for m in ('megatron', 'gather')}, c
assert all(x['stages'] * x['replicas'] * x['tensor'] == 8 for x in c)
assert all(x['virtual'] == 1 for x in c if x['tensor'] > 1)
assert all((x['tensor_collective_s'] > 0) == (x['tensor'] > 1) for x in c)
# 2 sockets of 4 ranks: a group of 2 or 4 fits in one, a group of 8 cannot
inside = ('same-core', 'same-l3', 'same-numa', 'same-package')
assert any(x['tensor_link'] in inside for x in c if x['tensor'] == 2), c
assert all(x['tensor_link'] not in inside for x in c if x['tensor'] == 8)
PYEOF
finish
