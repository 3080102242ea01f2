#!/usr/bin/env bash
# The rounding envelope of validate.sh's step 3 (envelope_lib.sh, envelope_check.py) on the
# CPU alone, the CPU playing the GPU's part (README.md, "Tolerances of step 3"):
#
#   bash experiments/cuda/envelope_selftest.sh [--quick]       (about 3 minutes on 2 cores)
#
# For each kind (sgd1, adam1, sgd5, adam5), batch (64, 128) and seed (1-4), the same
# protocol as validate.sh, with these in place of the device's run:
#   perturbed  a CPU run from the start perturbed with a third seed (another device's
#              rounding, as far as the CPU can play it)                      must pass
#   threads2   a CPU run with --threads 2                                    must pass
#   mock       --device cuda through the CUDA plugin built over the mock runtime
#              (tests/cuda/mock_cuda.c: the CPU kernels, a micro-batch in one call, so
#              other sums than the CPU stage's above 16 samples), when it is built:
#              the GPU's code path of validate.sh with another order of sums  must pass
#   lr         lr 0.1% high (1-step kinds: what 3d and 3f refuse)            must fail
#   seed       another seed's batches and dropout masks (5-step kinds)       must fail
#   planted    the perturbed run with 1e-3 of the update's norm added to one element of
#              the largest tensor (1-step kinds)                            must fail
# Prints a table (the envelope, each variant's figures and verdict; README.md keeps one) and
# exits 1 when any outcome is not the expected one. --quick: batch 64, seed 1 only.
# Environment: PIPETRAIN (default build/pipetrain), PT_DATA (the Fashion-MNIST directory),
# SELFTEST_KINDS, SELFTEST_BATCHES, SELFTEST_SEEDS (space-separated lists), SELFTEST_JOBS
# (runs at once, default the number of cores), SELFTEST_KEEP=DIR (keep the files there),
# SELFTEST_MOCK (the mock plugin; default build/tests/libpipetrain-cuda-mock.so; empty: none).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
PT=${PIPETRAIN:-$ROOT/build/pipetrain}
KINDS=${SELFTEST_KINDS:-sgd1 adam1 sgd5 adam5}
BATCHES=${SELFTEST_BATCHES:-64 128}
SEEDS=${SELFTEST_SEEDS:-1 2 3 4}
if [ "${1:-}" = --quick ]; then BATCHES=64 SEEDS=1; fi
[ -x "$PT" ] || { echo "no pipetrain at $PT (build first, or set PIPETRAIN)" >&2; exit 2; }
PYNP=""
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import numpy' 2>/dev/null; then PYNP=$p; break; fi
done
[ -n "$PYNP" ] || { echo "no python3 with numpy" >&2; exit 2; }
if [ -n "${SELFTEST_KEEP:-}" ]; then
    ENV_DIR=$SELFTEST_KEEP
    mkdir -p "$ENV_DIR" && rm -f "$ENV_DIR/results.tsv" || exit 1
else
    ENV_DIR=$(mktemp -d /tmp/pt-envelope.XXXXXX) || exit 1
    trap 'rm -rf --one-file-system "$ENV_DIR"' EXIT
fi
ENV_LOG=$ENV_DIR/selftest.log
: >"$ENV_LOG"
ENV_JOBS=${SELFTEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
ENV_TRAIN=(--model "$ROOT/models/seed-cnn.cfg" --data "${PT_DATA:-/usr/share/datasets/fashion-mnist}"
           --test-samples 0 --train-samples 1024 --progress 0 --timeout 120)
# shellcheck source=experiments/cuda/envelope_lib.sh
source "$ROOT/experiments/cuda/envelope_lib.sh"
MOCK=${SELFTEST_MOCK-$(dirname "$PT")/tests/libpipetrain-cuda-mock.so}
mock=()
if [ -n "$MOCK" ] && [ -f "$MOCK" ]; then
    export PIPETRAIN_CUDA_PLUGIN=$MOCK PT_MOCK_CUDA_MODE=2
    mock=("mock|ref|none|pass|--device cuda")
else
    echo "(no mock CUDA plugin at '${MOCK}': no mock rows)"
fi

start=$SECONDS
for seed in $SEEDS; do
    for batch in $BATCHES; do
        for kind in $KINDS; do
            case $kind in
                sgd1|adam1) control="lr|ref|lr|fail|" ;;
                *) control="seed|ref|seed|fail|" ;;
            esac
            env_case "$kind" "$batch" "$seed" "perturbed|p3|none|pass|" \
                "threads2|ref|none|pass|--threads 2" "${mock[@]}" "$control"
            dir=$ENV_DIR/$kind-b$batch-s$seed
            if [[ $kind == *1 ]] && [ -f "$dir/v-perturbed.st" ]; then
                "$PYNP" "$ENV_CHECK" plant "$dir/v-perturbed.st" "$dir/P3.st" "$dir/planted.st" \
                    --size 1e-3 >>"$ENV_LOG" 2>&1
                env_kind "$kind"
                env_check "$dir" check-planted.json planted fail "$dir/planted.st" "$dir/P3.st"
            fi
            printf '%-6s batch %3d seed %d: %s (%d s)\n' "$kind" "$batch" "$seed" \
                "$(awk -F'\t' -v k="$kind" -v b="$batch" -v s="$seed" \
                    '$1 == k && $2 == b && $3 == s { printf "%s %s  ", $4, ($7 == 1 ? "as expected" : "WRONG") }' \
                    "$ENV_DIR/results.tsv")" $((SECONDS - start))
        done
    done
done

echo
echo "envelope self-test: $(echo "$BATCHES" | wc -w) batch sizes x $(echo "$SEEDS" | wc -w) seeds," \
    "$((SECONDS - start)) s; log $ENV_LOG"
"$PYNP" - "$ENV_DIR" <<'EOF'
import json, os, sys
d = sys.argv[1]
rows = [l.rstrip('\n').split('\t') for l in open(os.path.join(d, 'results.tsv'))]
def fig(case, name):
    for f in ('check.json', f'check-{name}.json'):
        try:
            j = json.load(open(os.path.join(d, case, f)))
        except (OSError, ValueError):
            continue
        for r in j['runs']:
            if r['name'] == name:
                return r
    return None
cases = []
for r in rows:
    key = (r[0], int(r[1]), int(r[2]))
    if key not in cases:
        cases.append(key)
print('| kind | batch | seed | envelope bulk / norm | perturbed bulk / norm | threads2 | '
      'mock device | control (must fail) | planted (must fail) |')
print('| --- | --- | --- | --- | --- | --- | --- | --- | --- |')
bad = 0
for kind, b, s in cases:
    case = f'{kind}-b{b}-s{s}'
    res = {r[3]: r for r in rows if (r[0], int(r[1]), int(r[2])) == (kind, b, s)}
    bad += sum(1 for r in res.values() if r[6] != '1')
    def cell(name, figs=True):
        r = res.get(name)
        if r is None:
            return '-'
        j = fig(case, name)
        verdict = {('pass', '0'): 'pass', ('fail', '1'): 'refused'}.get((r[4], r[5]), 'WRONG')
        f = (f'{max(x["bulk"] for x in j["rows"]):.1e} / {max(x["norm"] for x in j["rows"]):.1e} '
             if j and figs else '')
        return f'{f}{verdict} ({r[7]})'
    j = fig(case, 'perturbed') or fig(case, 'threads2')
    env = (f'{max(x["bulk_envelope"] for x in j["rows"]):.1e} / '
           f'{max(x["norm_envelope"] for x in j["rows"]):.1e}' if j else '-')
    ctrl = 'lr' if 'lr' in res else 'seed'
    print(f'| {kind} | {b} | {s} | {env} | {cell("perturbed")} | {cell("threads2")} | '
          f'{cell("mock")} | {ctrl}: {cell(ctrl, False)} | {cell("planted", False)} |')
print()
print('figures: the largest over the tensors; in brackets, the largest value/limit of the '
      'check (above 1: outside)')
n = len(rows)
print(f'envelope self-test: {"PASS" if not bad else "FAIL"}: {n - bad} of {n} outcomes as expected')
sys.exit(1 if bad else 0)
EOF
