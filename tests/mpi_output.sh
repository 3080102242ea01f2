# Under mpiexec stdout is a pipe, and MPICH's MPI_Init makes it unbuffered: a line printed
# in pieces left the process in pieces (72 one-byte writes for one table row), and
# `mpiexec -prepend-rank` then prefixed the fragments ("[0] stage  [0] layers[0]  ...").
# pipetrain must write whole lines.
source "$(dirname "$0")/lib/common.bash"
T=(--train-samples 256 --test-samples 64 --batch 64 --threads 1 --stages 2 --microbatches 2)

# 1. Every write(2) to stdout ends a line. A SOCK_SEQPACKET socket as stdout keeps the
# boundaries of the writes, so this does not depend on when mpiexec reads the pipe.
cat >"$WORK/writes.py" <<'PY'
import os, socket, subprocess, sys
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
keep = [int(os.environ["PMI_FD"])] if "PMI_FD" in os.environ else []  # the rank's link to mpiexec
child = subprocess.Popen(sys.argv[1:], stdout=theirs.fileno(), pass_fds=keep)
theirs.close()
writes = []
while True:
    w = ours.recv(1 << 20)
    if not w:
        break
    writes.append(w)
rc = child.wait()
rank = os.environ.get("PMI_RANK", "-")
pieces = [w for w in writes if not w.endswith(b"\n")]
print(f"rank {rank}: exit {rc}, {len(writes)} writes, {len(pieces)} of them not ending a line")
for w in pieces[:8]:
    print(f"rank {rank}:   piece {w[:70]!r}")
sys.exit(1 if rc or pieces else 0)
PY
if "$MPIEXEC" -n 2 python3 "$WORK/writes.py" "$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" \
    "${T[@]}" --verbose --bind auto >"$WORK/writes" 2>&1; then
    pass "every write ends a line: $(tr '\n' ';' <"$WORK/writes")"
else
    failed "lines written in pieces:"; cat "$WORK/writes"
fi
if "$MPIEXEC" -n 2 python3 "$WORK/writes.py" "$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" \
    "${T[@]}" --json >"$WORK/writes" 2>&1; then
    pass "--json: every write ends a line: $(tr '\n' ';' <"$WORK/writes")"
else
    failed "--json: lines written in pieces:"; cat "$WORK/writes"
fi

# 2. What a user sees: with -prepend-rank every line starts with exactly one [0] or [1].
"$MPIEXEC" -n 2 -prepend-rank "$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" "${T[@]}" \
    --verbose --bind auto >"$WORK/out" 2>&1
lines=$(wc -l <"$WORK/out")
[ "$lines" -ge 20 ] && pass "$lines lines of output" || failed "only $lines lines:"
bad=$(grep -Evc '^\[[01]\] ' "$WORK/out" || true)
[ "$bad" -eq 0 ] && pass "every line starts with [0] or [1]" \
    || { failed "$bad lines without a rank prefix:"; grep -Ev '^\[[01]\] ' "$WORK/out" | head; }
split=$(grep -Ec '.\[[01]\] ' "$WORK/out" || true)
[ "$split" -eq 0 ] && pass "no line holds a second prefix" \
    || { failed "$split lines were written in pieces:"; grep -E '.\[[01]\] ' "$WORK/out" | head; }
grep -q '^\[0\] stage  *layers  *parameters' "$WORK/out" && pass "the partition table is whole" \
    || failed "no whole header line of the partition table"
# the JSON results line, the longest pipetrain writes, arrives as one line too
"$MPIEXEC" -n 2 -prepend-rank "$PIPETRAIN" train --model "$MODELS/seed-mlp.cfg" "${T[@]}" \
    --json >"$WORK/json" 2>&1
if tail -n 1 "$WORK/json" | sed 's/^\[0\] //' | python3 -c 'import json, sys; json.load(sys.stdin)'
then pass "the --json line is one line"; else failed "the --json line:"; tail -n 2 "$WORK/json"; fi
finish
