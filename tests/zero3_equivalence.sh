# ZeRO-3 (train --zero 3): each replica keeps only its shard of the parameters backed; each
# layer's parameters are all-gathered from their owners before each of its passes (forward,
# backward, evaluation) and given back after, the next layer's gather prefetched. With
# --reduce ordered every run must be bit-identical to one process with R·M micro-batches and
# to --zero 2 (seed-mlp and gpt-nano, R = 2 and 4, 2 stages × 2 replicas under 1f1b, zb-h1,
# interleaved, zb-v and recomputation, adamw with --clip-grad-norm; with --tensor 2 against
# one replica of the same shards); allreduce within 1e-6. Checkpoints keep whole tensors
# and resume in another layout. The comparison can fail: a bucket's layers never gathered
# must differ. Memory, measured (mincore of the parameter array at the end of each layer's
# pass): the shards plus the layers held whole at once, within 5%, and below --zero 2's 4Ψ.
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
MLP=$MODELS/seed-mlp.cfg
source "$(dirname "$0")/lib/zero_runs.bash"
i=0
check() { # check K R M OPT REDUCE ARGS...: --zero 3 against one process and --zero 2
    local k=$1 r=$2 m=$3 opt=$4 red=$5
    shift 5
    local label="K=$k R=$r M=$m $opt $red $*" rtol=0 z=$WORK/z$i.st u=$WORK/u$i.st
    i=$((i + 1))
    [ "$red" != ordered ] && rtol=1e-6
    local run=("$MPIEXEC" -n $((k * r)) "$PIPETRAIN" train "${COMMON[@]}" --load "$WORK/init.st"
               --stages "$k" --replicas "$r" --microbatches "$m" --optimizer "$opt"
               --lr "$(lr_of "$opt")" --reduce "$red" "$@")
    if ! "${run[@]}" --zero 3 --save "$z" >"$z.json" || ! "${run[@]}" --zero 2 --save "$u" >"$u.json"; then
        failed "$label: run failed"
        return
    fi
    same "$label, zero 3 vs one process" "$z" "$(ref "$opt" $((r * m)))" $rtol
    same "$label, zero 3 vs zero 2" "$z" "$u" $rtol
}
check 1 2 1 adamw ordered
check 1 2 2 adamw ordered --schedule gpipe --overlap off
check 1 4 2 momentum ordered
check 2 2 2 adamw ordered --schedule 1f1b
check 2 2 2 adamw ordered --schedule zb-h1
check 1 2 2 sgd allreduce

# evaluation gathers too: the test loss of --zero 3 is --zero 0's
E=("$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" --test-samples 64 --load "$WORK/init.st"
   --replicas 2 --optimizer adamw --lr 0.001 --reduce ordered)
"${E[@]}" --zero 3 >"$WORK/e3.json" && "${E[@]}" >"$WORK/e0.json" || failed "evaluation: run failed"
if msg=$(python3 -c '
import json, sys
a, b = (json.loads(open(f).read().splitlines()[-1]) for f in sys.argv[1:3])
k = [k for k in a if k.startswith("test_") and isinstance(a[k], (int, float))]
print(", ".join(f"{x} {a[x]}" for x in k))
sys.exit(0 if k and all(a[x] == b[x] for x in k) else 1)' "$WORK/e3.json" "$WORK/e0.json"); then
    pass "evaluation, zero 3 = zero 0: $msg"
else failed "evaluation, zero 3 vs zero 0: $msg"; fi

# train prices the gathers at the calibration's time of one pass's (reported, not added to
# the simulator, whose measured passes hold them): 2 passes per micro-batch here
if msg=$(python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
g, one = d["stage_zero3_gather_predicted_s"][0], d["stage_reduce_bcast_s"][0]
print(f"{g} s per step = 2 passes × {one} s")
sys.exit(0 if g and one and one > 0 and abs(g - 2 * one) <= 1e-6 * g else 1)' "$WORK/e3.json"); then
    pass "train --zero 3: gathers priced at $msg"
else failed "train --zero 3: gathers priced at $msg"; fi

# replicas with shares of different sizes (33 and 32 samples: 3 and 2 micro-batch chunks of
# 16) gather as many times: the shorter ends on an empty chunk (it hung in its last gather
# before; --timeout makes a regression fail, not hang)
if ! "${E[@]}" --zero 3 --test-samples 65 --timeout 20 >"$WORK/u3.json" ||
    ! "${E[@]}" --test-samples 65 >"$WORK/u0.json"; then
    failed "uneven evaluation shares: run failed"
elif [ "$(json_field test_loss <"$WORK/u3.json")" = "$(json_field test_loss <"$WORK/u0.json")" ]; then
    pass "uneven evaluation shares, zero 3 = zero 0: test loss $(json_field test_loss <"$WORK/u3.json")"
else failed "uneven evaluation shares: zero 3 $(json_field test_loss <"$WORK/u3.json") vs zero 0"; fi

# can fail: bucket 1's layers never gathered (their reductions still run)
skip_differs 3 1 adamw "a bucket never gathered"

# checkpoints in another layout: a --zero 3 run's (1 stage × 2 replicas) resumed by one
# process, an unsharded one's resumed by --zero 3 on 2 stages × 2 replicas
CK=(--optimizer adamw --lr 0.001 --checkpoint-every 2 --steps 2 --load "$WORK/init.st")
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${COMMON[@]}" "${CK[@]}" --replicas 2 --microbatches 1 \
    --reduce ordered --zero 3 --checkpoint-dir "$WORK/ckz" >/dev/null
"$PIPETRAIN" train "${COMMON[@]}" "${CK[@]}" --microbatches 2 --checkpoint-dir "$WORK/cku" >/dev/null
R3=(--optimizer adamw --lr 0.001 --steps 3)
"$PIPETRAIN" train "${COMMON[@]}" "${R3[@]}" --microbatches 2 --resume "$WORK/ckz" \
    --save "$WORK/res1.st" >/dev/null
same "zero 3 checkpoint resumed by one process" "$WORK/res1.st" "$(ref adamw 2)" 0
"$MPIEXEC" -n 4 "$PIPETRAIN" train "${COMMON[@]}" "${R3[@]}" --stages 2 --replicas 2 \
    --microbatches 1 --reduce ordered --zero 3 --resume "$WORK/cku" --save "$WORK/res2.st" >/dev/null
same "one process's checkpoint resumed by zero 3 on 2 stages × 2 replicas" "$WORK/res2.st" \
    "$(ref adamw 2)" 0

# gpt-nano: adamw, a cosine schedule, --clip-grad-norm, the tied head
GPT=(--model "$MODELS/gpt-nano.cfg" --text "$(readme_corpus)" --batch 8 --steps 3
     --seed 5 --threads 1 --json --optimizer adamw --lr 0.003 --lr-schedule cosine
     --lr-warmup 1 --clip-grad-norm 0.5 --reduce ordered --bucket-mb 0.02)
"$PIPETRAIN" train "${GPT[@]}" --microbatches 4 --save "$WORK/gref.st" >/dev/null
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${GPT[@]}" --microbatches 2 --replicas 2 --zero 3 \
    --save "$WORK/gz2.st" >/dev/null
same "gpt-nano, adamw + clip, R=2 zero 3 vs one process" "$WORK/gz2.st" "$WORK/gref.st" 0
"$MPIEXEC" -n 4 "$PIPETRAIN" train "${GPT[@]}" --microbatches 1 --replicas 4 --zero 3 \
    --save "$WORK/gz4.st" >/dev/null
same "gpt-nano, adamw + clip, R=4 zero 3 vs one process" "$WORK/gz4.st" "$WORK/gref.st" 0
# every schedule: the gathers follow each chunk's passes (interleaved and V: two chunks per
# rank, each with its own gathers), recomputation gathers again
for s in 1f1b zb-h1 "interleaved --virtual 2" zb-v "1f1b --recompute all"; do
    "$MPIEXEC" -n 4 "$PIPETRAIN" train "${GPT[@]}" --microbatches 2 --replicas 2 --stages 2 \
        --schedule $s --zero 3 --save "$WORK/gk2.st" >/dev/null
    same "gpt-nano, K=2 × R=2 $s zero 3 vs one process" "$WORK/gk2.st" "$WORK/gref.st" 0
done

# tensor shards: a layer cut by --tensor runs in phases between the tensor collectives; the
# hook gathers its shard-local parameters before its first phase and gives them back after
# its last (after an input-split layer's bias, read once its partial sums are all-reduced).
# Bit-identical to --zero 2 with the same --tensor and to one replica of the same shards with
# R·M micro-batches (tensor shards themselves are not one process's bits: tensor_equivalence.sh)
TREF=$WORK/tref.st
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${GPT[@]}" --microbatches 4 --tensor 2 --save "$TREF" >/dev/null
for z in 3 2; do
    "$MPIEXEC" -n 4 "$PIPETRAIN" train "${GPT[@]}" --microbatches 2 --replicas 2 --tensor 2 \
        --zero $z --save "$WORK/gt$z.st" >/dev/null || failed "gpt-nano T=2 × R=2 zero $z: run failed"
done
same "gpt-nano, T=2 × R=2 zero 3 vs one replica of the shards" "$WORK/gt3.st" "$TREF" 0
same "gpt-nano, T=2 × R=2 zero 3 vs zero 2" "$WORK/gt3.st" "$WORK/gt2.st" 0
"$MPIEXEC" -n 8 "$PIPETRAIN" train "${GPT[@]}" --microbatches 2 --replicas 2 --tensor 2 \
    --stages 2 --schedule zb-h1 --zero 3 --save "$WORK/gkt.st" >/dev/null
same "gpt-nano, K=2 × T=2 × R=2 zb-h1 zero 3 vs one replica of the shards" "$WORK/gkt.st" "$TREF" 0
# seed-mlp: dense layers cut by outputs, then by inputs (bias and activation after the
# all-reduce), and the evaluation's passes
MT=("${COMMON[@]}" --load "$WORK/init.st" --test-samples 64 --optimizer adamw --lr 0.001
    --reduce ordered --tensor 2)
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${MT[@]}" --microbatches 4 --save "$WORK/mref.st" >"$WORK/mref.json"
"$MPIEXEC" -n 4 "$PIPETRAIN" train "${MT[@]}" --microbatches 2 --replicas 2 --zero 3 \
    --save "$WORK/mt3.st" >"$WORK/mt3.json" || failed "seed-mlp T=2 × R=2 zero 3: run failed"
same "seed-mlp, T=2 × R=2 zero 3 vs one replica of the shards" "$WORK/mt3.st" "$WORK/mref.st" 0
if [ "$(json_field test_loss <"$WORK/mt3.json")" = "$(json_field test_loss <"$WORK/mref.json")" ]; then
    pass "seed-mlp, T=2 × R=2 zero 3: test loss $(json_field test_loss <"$WORK/mt3.json") as one replica's"
else failed "seed-mlp, T=2 × R=2 zero 3: test loss differs"; fi
# plan prices the tensor rank's shards: 2·M·(R−1)/R·4Ψ_rank gathered per step (M = 1, R = 2)
if msg=$("$PIPETRAIN" plan --model "$MODELS/gpt-nano.cfg" --stages 1 --replicas 2 --tensor 2 \
        --batch 8 --microbatches 1 --zero 3 --json | tail -n 1 | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())["predicted"]
g, r = p["stage_zero3_gather_bytes"][0], p["stage_param_bytes_per_rank"][0]
print(f"gathers {g:.0f} B/step vs 4Ψ_rank = {r:.0f}")
sys.exit(0 if abs(g - r) < 1 else 1)'); then
    pass "plan --zero 3 --tensor 2: $msg"
else failed "plan --zero 3 --tensor 2: $msg"; fi

# memory per rank, measured: the parameters' peak backed bytes (mincore of the array and the
# engine's page pool at the end of each layer's pass, before it goes back) of an MLP of nine
# layers (each its own bucket): the shards 4Ψ/R plus two adjacent layers whole (the one that
# ran, the next one's prefetched gather; the pool keeps what the next gather takes), within
# 5%, and below --zero 2's 4Ψ; with --zero3-prefetch off one layer whole (the same bits)
deep_mlp # $WORK/deep.cfg and its runs' options W (lib/zero_runs.bash)
for r in 2 4; do
    for z in 2 3 "3 --zero3-prefetch off"; do
        # shellcheck disable=SC2086 # z carries the prefetch option
        "$MPIEXEC" -n $r "$PIPETRAIN" train "${W[@]}" --replicas $r --zero $z \
            --save "$WORK/mem$r${z// /}.st" >"$WORK/mem$r${z// /}.json"
    done
    if msg=$(python3 -c '
import json, sys
R = int(sys.argv[1])
z2, z3, z3n = (json.loads(open(f).read().splitlines()[-1]) for f in sys.argv[2:5])
L = [4 * (784 * 512 + 512)] + [4 * (512 * 512 + 512)] * 7 + [4 * (512 * 10 + 10)]
psi = z3["stage_params"][0]
assert sum(L) == 4 * psi, (sum(L), psi)
want = 4 * psi / R + max(L[i] - L[i] / R + (L[i + 1] - L[i + 1] / R if i + 1 < len(L) else 0)
                         for i in range(len(L)))
one = 4 * psi / R + max(l - l / R for l in L)
p3, p2, p3n = z3["rank_params_bytes"], z2["rank_params_bytes"], z3n["rank_params_bytes"]
ok = all(abs(p - want) <= 0.05 * want and p < q for p, q in zip(p3, p2))
ok = ok and all(abs(p - one) <= 0.05 * one and p < q for p, q in zip(p3n, p3))
print(f"parameters {p3} vs 4Ψ/R + two layers whole {want:.0f}, without prefetch {p3n} vs "
      f"one layer {one:.0f} (4Ψ/R = {4 * psi / R:.0f}; zero 2: {p2})")
sys.exit(0 if ok else 1)' $r "$WORK/mem${r}2.json" "$WORK/mem${r}3.json" \
            "$WORK/mem${r}3--zero3-prefetchoff.json"); then
        pass "memory R=$r zero 3: $msg"
    else failed "memory R=$r zero 3: $msg"; fi
    same "R=$r zero 3 without prefetch vs with" "$WORK/mem${r}3--zero3-prefetchoff.st" \
        "$WORK/mem${r}3.st" 0
done
rc=0
"$MPIEXEC" -n 2 "$PIPETRAIN" train "${W[@]}" --replicas 2 --zero 2 --zero3-prefetch off \
    >/dev/null 2>"$WORK/pf.err" || rc=$?
if [ $rc -eq 2 ] && grep -q 'zero3-prefetch is how --zero 3' "$WORK/pf.err"; then
    pass "--zero3-prefetch without --zero 3: exit 2, $(head -n 1 "$WORK/pf.err")"
else failed "--zero3-prefetch with --zero 2: exit $rc, $(head -c 300 "$WORK/pf.err")"; fi

# plan --zero 3 prices the same: memory per rank drops by 4Ψ less the shards and two layers
# whole (zero3_param_bytes), and the gathers' bytes per step are 2·M·(R−1)/R·4Ψ; on links of
# 1 GB/s without latency the CPU waits for all of them (plan_zero3_pass_s): 4Ψ / 1e9 s
LINKS=same-core,same-l3,same-numa,same-package,cross-package
if msg=$(for z in 2 3 "3 --zero3-prefetch off"; do
        # shellcheck disable=SC2086 # z carries the prefetch option
        "$PIPETRAIN" plan --model "$WORK/deep.cfg" --stages 1 --replicas 2 \
            --batch 16 --microbatches 1 --bucket-mb 1 --zero $z --json \
            --bandwidth "$(sed 's/,/=1e9,/g; s/$/=1e9/' <<<"$LINKS")" \
            --latency "$(sed 's/,/=0,/g; s/$/=0/' <<<"$LINKS")" | tail -n 1; done | python3 -c '
import json, sys
z2, z3, z3n = (json.loads(l)["predicted"] for l in sys.stdin.read().splitlines())
L = [4 * (784 * 512 + 512)] + [4 * (512 * 512 + 512)] * 7 + [4 * (512 * 10 + 10)]
psi4 = sum(L)
drop = psi4 - (psi4 / 2 + L[0] / 2 + L[1] / 2)
m2, m3, m3n = (z["stage_memory_bytes"][0] for z in (z2, z3, z3n))
got, g = m2 - m3, z3["stage_zero3_gather_bytes"][0]
w, w2 = z3["stage_zero3_gather_s"][0], z2["stage_zero3_gather_s"][0]
print(f"memory {m3:.0f} (zero 2 {m2:.0f}, drop {got:.0f} vs {drop:.0f}; without prefetch "
      f"{m3n:.0f}, {m3 - m3n:.0f} less vs L1/2 = {L[1] / 2:.0f}), "
      f"gathers {g:.0f} B/step vs 2·M·(R−1)/R·4Ψ = {psi4:.0f}, waited {w:.6f} s vs {psi4 / 1e9:.6f}")
sys.exit(0 if abs(got - drop) < 1e-5 * psi4 and abs(g - psi4) < 1 and
         z2["stage_zero3_gather_bytes"][0] == 0 and abs(w - psi4 / 1e9) < 1e-9 and
         w2 == 0 and abs(m3 - m3n - L[1] / 2) < 1e-5 * psi4 else 1)'); then
    pass "plan --zero 3: $msg"
else failed "plan --zero 3: $msg"; fi
finish
