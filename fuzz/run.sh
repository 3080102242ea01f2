#!/usr/bin/env bash
# fuzz/run.sh BUILD SECONDS [TARGET...]: runs each libFuzzer harness built in BUILD (a
# -DPT_FUZZ=ON build, see fuzz/README.md) for SECONDS, from a copy of its seed corpus in
# fuzz/corpus/TARGET (the repository stays as it is). Exits non-zero when a harness finds
# a crash, a leak, a timeout or an out-of-memory; the input that did it is kept in
# $PT_FUZZ_ARTIFACTS (default: BUILD/fuzz-artifacts) and printed as base64.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: fuzz/run.sh BUILD SECONDS [TARGET...]}
secs=${2:?usage: fuzz/run.sh BUILD SECONDS [TARGET...]}
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(model idx safetensors topo options)
artifacts=${PT_FUZZ_ARTIFACTS:-$build/fuzz-artifacts}
mkdir -p "$artifacts"
failed=0
for t in "${targets[@]}"; do
    bin=$build/fuzz_$t
    [ -x "$bin" ] || { echo "fuzz/run.sh: no harness $bin (build with -DPT_FUZZ=ON)" >&2; exit 2; }
    work=$(mktemp -d)
    cp "$here/corpus/$t/"* "$work/"
    echo "== fuzz_$t for ${secs} s"
    # -rss_limit_mb: a parser that allocates what a header claims is a finding, not the
    # machine's problem; -timeout: one input taking 10 s is a hang
    if ! "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
            -artifact_prefix="$artifacts/$t-" "$work" >"$work.log" 2>&1; then
        failed=1
        grep -E "ERROR|SUMMARY|==[0-9]+==" "$work.log" | head -20
        for a in "$artifacts/$t-"*; do
            [ -f "$a" ] && { echo "input $a:"; base64 -w 76 "$a" | head -20; }
        done
    fi
    grep -E "^#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb|cov:" "$work.log" | tail -3
    rm -rf "$work" "$work.log"
done
exit $failed
