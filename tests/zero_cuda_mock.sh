# ZeRO-1 on the CUDA engine (issue 27), through the mock CUDA plugin (tests/cuda/mock_cuda.c:
# streams as queues run in a random order, kernels by their CPU twins): each replica keeps
# the optimizer moments of its runs on the device (engine optim_shard), steps them, copies
# its runs to a pinned mirror (params_host), the all-gather fills the rest and the mirror
# goes back to the device (params_commit). With --reduce ordered, 2 replicas must be
# bit-identical to the unsharded replicas on the same device and to one CPU process with
# the same micro-batches (seed-cnn with Adam and momentum, gpt-nano with AdamW and
# --clip-grad-norm); --json's optimizer bytes halve; a checkpoint saved under --zero 1 on
# the (mock) GPU holds the unsharded run's bits and resumes on the CPU with --zero 0 to the
# uninterrupted run's parameters. --zero 2 and 3 are refused on CUDA (exit 2, a message).
# The comparisons can fail: a bucket left unreduced differs. Without a CUDA toolkit at
# configure time there is no mock plugin: exit 77 (skipped).
source "$(dirname "$0")/lib/common.bash"
if [ -z "${CUDA_MOCK_PLUGIN:-}" ]; then
    echo "SKIP: no CUDA toolkit at configure time, so no mock CUDA plugin to test"
    exit 77
fi
[ -f "$CUDA_MOCK_PLUGIN" ] || { echo "FAIL: $CUDA_MOCK_PLUGIN is not built"; exit 1; }
export OPENBLAS_NUM_THREADS=1
cuda() { PIPETRAIN_CUDA_PLUGIN=$CUDA_MOCK_PLUGIN PT_MOCK_CUDA_MODE=2 "$@"; }
# micro-batches of ≤ 16 samples: the CPU stage runs each as one chunk, as the GPU does;
# --bucket-mb 0.01: seed-cnn's layers in several buckets, each cut in 2 shards
CNN=(--model "$MODELS/seed-cnn.cfg" --batch 16 --steps 3 --train-samples 256 --test-samples 0
     --seed 3 --threads 1 --json --reduce ordered --bucket-mb 0.01)
GPT=(--model "$MODELS/gpt-nano.cfg" --text "$PT_SOURCE_DIR/README.md" --batch 8 --steps 3
     --seed 5 --threads 1 --json --optimizer adamw --lr 0.003 --clip-grad-norm 0.5
     --reduce ordered)
R2=(timeout 120 "$MPIEXEC" -n 2 "$PIPETRAIN" train --replicas 2 --microbatches 2)

same() { # same LABEL A B
    if "$PIPETRAIN" diff "$2" "$3" >"$WORK/diff" 2>&1; then
        pass "$1: $(tail -n 1 "$WORK/diff" | cut -d: -f1)"
    else
        failed "$1: differs"; tail -n 2 "$WORK/diff"
    fi
}
opt_bytes() { python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["rank_optimizer_bytes"][0])' "$1"; }

# check NAME MODEL-ARGS...: --zero 1 and --zero 0 on the mock GPU against one CPU process
check() {
    local name=$1 w=$WORK/${1// /_}
    shift
    "$PIPETRAIN" train "$@" --microbatches 4 --save "$w.one.st" >/dev/null 2>"$WORK/err" ||
        { failed "$name: one CPU process failed"; cat "$WORK/err"; return; }
    for z in 0 1; do
        cuda "${R2[@]}" "$@" --device cuda --zero $z --save "$w.z$z.st" >"$w.z$z.json" \
            2>"$WORK/err" || { failed "$name: --zero $z on the mock GPU failed"; cat "$WORK/err"; return; }
    done
    same "$name, --zero 1 vs --zero 0 on the mock GPU" "$w.z1.st" "$w.z0.st"
    same "$name, --zero 1 on the mock GPU vs one CPU process" "$w.z1.st" "$w.one.st"
    local b0 b1
    b0=$(opt_bytes "$w.z0.json") b1=$(opt_bytes "$w.z1.json")
    # the shards are rounded to 64 bytes each: within 1% of half
    if python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if a > 0 and abs(b - a / 2) < 0.01 * a else 1)' "$b0" "$b1"; then
        pass "$name: optimizer bytes on the device $b0 -> $b1 (halved)"
    else
        failed "$name: optimizer bytes $b0 -> $b1, not halved"
    fi
}
check "seed-cnn adam" "${CNN[@]}" --optimizer adam --lr 0.001 --overlap off
check "seed-cnn momentum overlap" "${CNN[@]}" --optimizer momentum --lr 0.05 --overlap on
check "gpt-nano adamw clip" "${GPT[@]}"

# can fail: a bucket left unreduced on the mock GPU differs from one process
cuda "${R2[@]}" "${CNN[@]}" --optimizer adam --lr 0.001 --overlap off --device cuda --zero 1 \
    --debug-skip-bucket 1 --save "$WORK/skip.st" >/dev/null 2>&1
if "$PIPETRAIN" diff "$WORK/skip.st" "$WORK/seed-cnn_adam.one.st" >/dev/null 2>&1; then
    failed "a bucket left unreduced matched one process: the comparison cannot fail"
else
    pass "a bucket left unreduced differs (the comparison can fail)"
fi

# checkpoints keep whole tensors: saved under --zero 1 on the mock GPU, the moments are the
# unsharded CUDA run's bits; resumed by one CPU process (--zero 0) to the uninterrupted run
CK=("${CNN[@]}" --optimizer adam --lr 0.001 --checkpoint-every 2 --steps 2)
cuda "${R2[@]}" "${CK[@]}" --device cuda --zero 1 --checkpoint-dir "$WORK/ckz" >/dev/null 2>&1 ||
    failed "checkpointed --zero 1 run on the mock GPU failed"
cuda "${R2[@]}" "${CK[@]}" --device cuda --checkpoint-dir "$WORK/cku" >/dev/null 2>&1 ||
    failed "checkpointed --zero 0 run on the mock GPU failed"
if python3 - "$WORK/ckz/ckpt-0000000002.safetensors" "$WORK/cku/ckpt-0000000002.safetensors" \
    >"$WORK/tensors" <<'PY'
import json, struct, sys
def load(f): # the tensors' bytes by name (the metadata holds each run's own id)
    b = open(f, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]]
            for k, v in h.items() if k != '__metadata__'}
a, b = load(sys.argv[1]), load(sys.argv[2])
moments = [k for k in a if k.startswith('optimizer.')]
print(len(a), 'tensors,', len(moments), 'moments')
sys.exit(0 if a.keys() == b.keys() and moments and all(a[k] == b[k] for k in a) else 1)
PY
then
    pass "a --zero 1 checkpoint on the mock GPU: $(cat "$WORK/tensors") bit-identical to unsharded"
else
    failed "a --zero 1 checkpoint on the mock GPU differs from the unsharded one"
fi
"$PIPETRAIN" train "${CNN[@]}" --optimizer adam --lr 0.001 --microbatches 4 \
    --resume "$WORK/ckz" --save "$WORK/resumed.st" >/dev/null 2>"$WORK/err" ||
    { failed "resuming the GPU checkpoint on the CPU failed"; cat "$WORK/err"; }
same "--zero 1 GPU checkpoint resumed on the CPU (--zero 0) vs uninterrupted" \
    "$WORK/resumed.st" "$WORK/seed-cnn_adam.one.st"

# ZeRO-2 and 3 give memory back, which the CUDA engine does not: refused, exit 2, a message
for z in 2 3; do
    rc=0
    cuda "${R2[@]}" "${CNN[@]}" --device cuda --zero $z >/dev/null 2>"$WORK/err" || rc=$?
    if [ $rc = 2 ] && grep -q -- "--zero $z with --device cuda: .*use --zero 1" "$WORK/err"; then
        pass "--zero $z on the mock GPU: refused (exit 2): $(head -c 90 "$WORK/err")..."
    else
        failed "--zero $z on the mock GPU: exit $rc"; cat "$WORK/err"
    fi
done
finish
