#!/usr/bin/env bash
# fuzz/run.sh BUILD SECONDS [TARGET...]: runs each libFuzzer harness built in BUILD (a
# -DPT_FUZZ=ON build, see fuzz/README.md) for SECONDS, from a copy of its seed corpus in
# fuzz/corpus/TARGET (the repository stays as it is), as many at once as the machine has
# cores (PT_FUZZ_JOBS): each harness is one process on one core. Exits non-zero when a
# harness finds a crash, a leak, a timeout or an out-of-memory; the input that did it is
# kept in $PT_FUZZ_ARTIFACTS (default: BUILD/fuzz-artifacts) and printed as base64.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: fuzz/run.sh BUILD SECONDS [TARGET...]}
secs=${2:?usage: fuzz/run.sh BUILD SECONDS [TARGET...]}
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(model idx safetensors topo options text)
artifacts=${PT_FUZZ_ARTIFACTS:-$build/fuzz-artifacts}
jobs=${PT_FUZZ_JOBS:-$(nproc)}
mkdir -p "$artifacts"
for t in "${targets[@]}"; do
    [ -x "$build/fuzz_$t" ] || { echo "fuzz/run.sh: no harness $build/fuzz_$t (build with -DPT_FUZZ=ON)" >&2; exit 2; }
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# one harness: its exit status in $logs/$t.rc, its output in $logs/$t.log
fuzz_one() {
    local t=$1 work
    work=$(mktemp -d -p "$logs")
    cp "$here/corpus/$t/"* "$work/"
    # -rss_limit_mb: a parser that allocates what a header claims is a finding, not the
    # machine's problem; -timeout: one input taking 10 s is a hang
    "$build/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$work" >"$logs/$t.log" 2>&1 \
        && echo 0 >"$logs/$t.rc" || echo $? >"$logs/$t.rc"
}

running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait

failed=0
for t in "${targets[@]}"; do
    echo "== fuzz_$t for ${secs} s"
    if [ "$(cat "$logs/$t.rc" 2>/dev/null || echo missing)" != 0 ]; then
        failed=1
        grep -E "ERROR|SUMMARY|==[0-9]+==" "$logs/$t.log" | head -20
        for a in "$artifacts/$t-"*; do
            [ -f "$a" ] && { echo "input $a:"; base64 -w 76 "$a" | head -40; }
        done
    fi
    grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb|cov:" "$logs/$t.log" | tail -3
done
exit $failed
