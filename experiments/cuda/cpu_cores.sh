#!/bin/bash
# CPU pipelines and replicas on a GPU machine's cores (issues 26 and 27), with the binaries
# of the GPU bundle (experiments/cuda/bundle.sh): timings that need more cores than the
# 2-core development VM has (ranks ≤ cores). Every run prints train's measured step beside
# the step its simulator predicts from the run's own measured per-op times
# (`step_predicted_s`), and the pipelines their measured bubble and peak micro-batches.
#   bash experiments/cuda/cpu_cores.sh [SECONDS]   (default 150: runs that no longer fit
#   are skipped; after validate.sh has unpacked the bundle, or it unpacks it itself)
# 1. replicas: seed-cnn, batch 256, one thread per rank, --bind auto, --reduce ordered and
#    allreduce, R = 2, 4, 8, 16 (the issue measured train's prediction 10.7-18.9% short).
# 2. pipelines: gpt-mini on README.md as bytes, K = 4, M = 8, batch 32: 1f1b, zb-h1, zb-v,
#    search; measured step and bubble against the simulator's.
set -u
BUDGET=${1:-150}
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${PT_BUNDLE:-}" ]; then
    w=$(mktemp -d)
    xz -dc "$root/.gpu-bundle/bundle.tar.xz" | tar -C "$w" -xf - || exit 1
    # shellcheck disable=SC1091
    source "$w/pipetrain-gpu/env.sh"
fi
PT=$PT_BUNDLE/bin/pipetrain MPI=$PT_BUNDLE/bin/mpiexec
cores=$(nproc)
out=${OUT:-/tmp}/cpu_cores.jsonl
: >"$out"
start=$SECONDS
fits() { [ $((BUDGET - (SECONDS - start))) -ge "$1" ]; }
run() { # LABEL N ARGS...: one run, its JSON line kept, a summary printed
    local label=$1 n=$2
    shift 2
    [ "$n" -le "$cores" ] || { echo "$label: $n ranks > $cores cores, skipped"; return; }
    fits 20 || { echo "$label: skipped (time)"; return; }
    local j
    j=$(timeout 90 "$MPI" -launcher fork -n "$n" "$PT" train "$@" --json --threads 1 \
        --bind auto --progress 0 2>/dev/null | grep '^{' | tail -1)
    [ -n "$j" ] || { echo "$label: failed"; return; }
    echo "{\"label\": \"$label\", \"result\": $j}" >>"$out"
    python3 - "$label" "$j" <<'PY'
import json, sys
label, r = sys.argv[1], json.loads(sys.argv[2])
step = r['batch'] / r['samples_per_s']
pred = r.get('step_predicted_s')
b = r.get('bubble'); bs = r.get('bubble_simulated')
line = f"{label:<34} step {step*1e3:8.1f} ms  predicted {pred*1e3 if pred else float('nan'):8.1f} ms"
if pred: line += f" ({(pred - step) / step * 100:+.1f}%)"
if b is not None: line += f"  bubble {b:.3f} (sim {bs if bs is None else round(bs, 3)})"
pk = r.get('stage_peak_microbatches')
if pk and len(pk) > 1: line += f"  peak mb {pk}"
print(line)
PY
}
echo "== $cores cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "== 1. replicas, seed-cnn, batch 256, 1 thread a rank"
D=(--model "$PT_BUNDLE_MODEL" --data "$PT_BUNDLE_DATA" --test-samples 0 --train-samples 8448
   --batch 256 --seed 1 --steps 25 --warmup 3)
for R in 1 2 4 8 16; do
    for red in ordered allreduce; do
        [ "$R" = 1 ] && [ $red = allreduce ] && continue
        run "replicas R=$R --reduce $red" "$R" "${D[@]}" --replicas "$R" --reduce $red
    done
done
echo "== 2. pipelines, gpt-mini, K = 4, M = 8, batch 32"
G=(--model "$root/models/gpt-mini.cfg" --text "$root/README.md" --batch 32 --seed 1
   --steps 12 --warmup 2 --eval-windows 1 --stages 4 --microbatches 8)
for s in 1f1b zb-h1 zb-v search; do
    run "pipeline K=4 M=8 $s" 4 "${G[@]}" --schedule $s
done
echo "records: $out"
