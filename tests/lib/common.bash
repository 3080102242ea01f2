# Sourced by the tests/*.sh scripts that ctest runs (PIPETRAIN, MPIEXEC, PT_SOURCE_DIR set).
set -euo pipefail
: "${PIPETRAIN:?set by ctest}" "${PT_SOURCE_DIR:?set by ctest}"
MPIEXEC=${MPIEXEC:-mpiexec}
MODELS=$PT_SOURCE_DIR/models
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/debian_python.bash"
debian_python "$WORK"
FAILURES=0
CHECKS=0

pass() { CHECKS=$((CHECKS + 1)); echo "ok: $*"; }
failed() { CHECKS=$((CHECKS + 1)); FAILURES=$((FAILURES + 1)); echo "FAIL: $*"; }

# expect_fail NAME PATTERN CMD...: the command must exit non-zero within 60 s (no hang)
# and its stderr must contain PATTERN.
expect_fail() {
    local name=$1 pattern=$2
    shift 2
    local rc=0
    timeout 60 "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 0 ]; then
        failed "$name: exited 0"
    elif [ "$rc" -eq 124 ]; then
        failed "$name: hung (killed after 60 s)"
    elif ! grep -q -- "$pattern" "$WORK/err"; then
        failed "$name: exit $rc but stderr lacks '$pattern':"; cat "$WORK/err"
    else
        pass "$name (exit $rc): $(grep -m1 -- "$pattern" "$WORK/err")"
    fi
}

# refused NAME PATTERN CMD...: the command must exit 2 (bad input) with PATTERN on stderr.
refused() {
    local name=$1 pat=$2
    shift 2
    local rc=0
    "$@" >/dev/null 2>"$WORK/err" || rc=$?
    if [ $rc = 2 ] && grep -q -- "$pat" "$WORK/err"; then pass "$name: refused (exit 2)"
    else failed "$name: exit $rc"; cat "$WORK/err"; fi
}

finish() {
    echo "$((CHECKS - FAILURES)) passed, $FAILURES failed"
    [ "$FAILURES" -eq 0 ]
}

# json_field KEY <FILE: a top-level field of the JSON object on the input's last line.
json_field() {
    tail -n 1 | python3 -c "import json, sys; print(json.loads(sys.stdin.read())[sys.argv[1]])" "$1"
}

# require_cuda_mock: the tests of --device cuda over the mock CUDA runtime. Without a CUDA
# toolkit at configure time there is no mock plugin (CUDA_MOCK_PLUGIN empty): exit 77,
# which ctest reports as skipped (SKIP_RETURN_CODE), never as passed. Then `cuda CMD...`
# runs CMD with the mock plugin, its streams progressing in a random order.
require_cuda_mock() {
    if [ -z "${CUDA_MOCK_PLUGIN:-}" ]; then
        echo "SKIP: no CUDA toolkit at configure time, so no mock CUDA plugin to test"
        exit 77
    fi
    [ -f "$CUDA_MOCK_PLUGIN" ] ||
        { echo "FAIL: the mock CUDA plugin $CUDA_MOCK_PLUGIN was configured but is not built"; exit 1; }
}
cuda() { PIPETRAIN_CUDA_PLUGIN=$CUDA_MOCK_PLUGIN PT_MOCK_CUDA_MODE=2 "$@"; }

# readme_corpus: the path of a snapshot of README.md, the text the language-model tests train
# on: every run of a test then reads the same text, even while the README is being edited.
readme_corpus() {
    [ -f "$WORK/readme-corpus.txt" ] || cp "$PT_SOURCE_DIR/README.md" "$WORK/readme-corpus.txt"
    echo "$WORK/readme-corpus.txt"
}

# same_params WHAT A B [RTOL]: $WORK/A.st's parameters bit-identical to $WORK/B.st's (or within
# RTOL, pipetrain diff's relative tolerance), the largest difference shown.
same_params() {
    local what=$1 a=$2 b=$3 rtol=${4:-}
    local args=("$WORK/$a.st" "$WORK/$b.st")
    [ -n "$rtol" ] && args+=(--rtol "$rtol")
    if "$PIPETRAIN" diff "${args[@]}" >"$WORK/diff" 2>&1; then
        pass "$what ($(tail -n 1 "$WORK/diff" | grep -o 'difference [^ ]*' || true))"
    else
        failed "$what"; tail -n 1 "$WORK/diff"
    fi
}
