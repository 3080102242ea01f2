# Shared by the transformer layout tests (gpt_tensor.sh, gpt_seqpar.sh): a run of `train`
# with the test's COMMON options and its comparisons. Needs lib/common.bash and COMMON.

# run NAME RANKS ARGS...: $WORK/NAME.st (parameters), .jsonl (metrics), .out, .err
run() {
    local name=$1 n=$2
    shift 2
    local cmd=("$PIPETRAIN" train "${COMMON[@]}" --metrics "$WORK/$name.jsonl"
               --save "$WORK/$name.st" "$@")
    [ "$n" -gt 1 ] && cmd=("$MPIEXEC" -n "$n" "${cmd[@]}")
    if ! timeout 120 "${cmd[@]}" >"$WORK/$name.out" 2>"$WORK/$name.err"; then
        failed "$name: exit non-zero: $(tail -n 3 "$WORK/$name.err")"
        return 1
    fi
}

# same_losses A B: every step's loss of run A within 1e-5 relative of run B's (6 steps each)
same_losses() {
    python3 - "$WORK/$1.jsonl" "$WORK/$2.jsonl" <<'PY'
import json, sys
def losses(f):
    return [json.loads(l)['loss'] for l in open(f) if json.loads(l)['type'] == 'step']
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=1)
print('%d steps, largest relative difference %.2e' % (len(a), worst))
sys.exit(0 if len(a) == len(b) == 6 and worst <= 1e-5 else 1)
PY
}

# close WHAT A B: the parameters of A within 1e-5 relative of B's
close() {
    if "$PIPETRAIN" diff "$WORK/$2.st" "$WORK/$3.st" --rtol 1e-5 >"$WORK/diff" 2>&1; then
        pass "$1: parameters within 1e-5 ($(tail -n 1 "$WORK/diff" | grep -o 'difference [^ ]*'))"
    else
        failed "$1: parameters differ beyond 1e-5"; tail -n 1 "$WORK/diff"
    fi
}
