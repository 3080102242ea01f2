# A real Slurm cluster on this machine (experiments/slurm/local-cluster.sh: munged,
# slurmctld and two slurmd as fake nodes n1 and n2): experiments/slurm/train.sbatch trains a
# 2-stage pipeline across the two nodes, launched by srun and by mpiexec inside the
# allocation, and both end bit-identical to the one-process run; a layout that does not fit
# the allocation fails with a message. Then the same pipeline with MPICH's network path
# forced (UCX over TCP on loopback) is bit-identical too. Needs root and Debian's Slurm
# packages (cmake/setup.sh installs them): otherwise a skip with the reason.
source "$(dirname "$0")/lib/common.bash"
SLURM_DIR=$PT_SOURCE_DIR/experiments/slurm
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root (slurmd runs the jobs)"; exit 77; fi
for b in slurmctld slurmd sbatch munged; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || { echo "SKIP: $b is not installed"; exit 77; }
done
export PT_SLURM_PORT=$((17100 + $$ % 400 * 2))   # 2 ports above it for the nodes
export PT_SLURM_CPUS=2                            # as topologies/local-2core.xml
CLUSTER=$WORK/cluster
trap '"$SLURM_DIR/local-cluster.sh" stop "$CLUSTER"; rm -rf "$WORK"' EXIT
if ! "$SLURM_DIR/local-cluster.sh" start "$CLUSTER" 2 >"$WORK/start.out" 2>&1; then
    cat "$WORK/start.out"; failed "the local Slurm cluster did not start"; finish; exit 1
fi
export SLURM_CONF=$CLUSTER/slurm.conf
pass "local Slurm cluster up: $(sinfo -h -o '%D nodes %t' | head -1)"

ARGS=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 256 --test-samples 0 --steps 4
      --microbatches 2 --threads 1 --seed 7)
"$PIPETRAIN" train "${ARGS[@]}" --save "$WORK/ref.st" >/dev/null
cd "$WORK"
for launch in srun mpiexec; do
    if timeout 120 env LAUNCH=$launch PIPETRAIN="$PIPETRAIN" sbatch --wait --nodes=2 --ntasks-per-node=1 \
            -o "$WORK/$launch.out" "$SLURM_DIR/train.sbatch" "${ARGS[@]}" --save "$WORK/$launch.st" \
            >/dev/null 2>&1 \
        && grep -q "2 tasks on 2 nodes (n\[1-2\]): 2 stages x 1 replicas, launched by $launch" "$WORK/$launch.out" \
        && "$PIPETRAIN" diff "$WORK/$launch.st" "$WORK/ref.st" >/dev/null; then
        pass "sbatch: 2-stage pipeline over nodes n1 and n2 ($launch): bit-identical to one process"
    else
        failed "sbatch with $launch"; cat "$WORK/$launch.out" 2>/dev/null | tail -n 20
    fi
done
if timeout 60 env STAGES=3 PIPETRAIN="$PIPETRAIN" sbatch --wait --nodes=2 --ntasks-per-node=1 \
        -o "$WORK/bad.out" "$SLURM_DIR/train.sbatch" "${ARGS[@]}" >/dev/null 2>&1; then
    failed "STAGES=3 on 2 tasks: the job succeeded"
elif grep -q "the allocation has 2 tasks, not a multiple of STAGES=3" "$WORK/bad.out"; then
    pass "STAGES=3 on 2 tasks: $(cat "$WORK/bad.out")"
else
    failed "STAGES=3 on 2 tasks: no message"; cat "$WORK/bad.out"
fi

# plan --emit slurm: a 2 x 2 hybrid placed by the plan on two nodes of this machine's kind
"$PIPETRAIN" plan --model "$MODELS/seed-mlp.cfg" --batch 32 --microbatches 2 --stages 2 \
    --replicas 2 --nodes 2 --reduce ordered --partition params \
    --topology "$PT_SOURCE_DIR/topologies/local-2core.xml" --emit slurm >"$WORK/plan.sbatch"
"$PIPETRAIN" train "${ARGS[@]}" --microbatches 4 --save "$WORK/ref4.st" >/dev/null
if timeout 120 env PIPETRAIN="$PIPETRAIN" sbatch --wait -o "$WORK/plan.out" "$WORK/plan.sbatch" \
        --steps 4 --train-samples 256 --test-samples 0 --seed 7 --save "$WORK/plan.st" \
        >/dev/null 2>&1 \
    && "$PIPETRAIN" diff "$WORK/plan.st" "$WORK/ref4.st" >/dev/null; then
    pass "plan --emit slurm: 2 x 2 ordered on 2 nodes ($(grep -o 'node_of=([0-9 ]*)' "$WORK/plan.sbatch")): bit-identical to one process, M=4"
else
    failed "plan --emit slurm job"; tail -n 20 "$WORK/plan.out" 2>/dev/null; cat "$WORK/plan.sbatch"
fi

# pipetrain launch inside an allocation: a task killed from outside, srun ends the step,
# launch runs it again from the newest checkpoint; bit-identical to one process
LARGS=(--model "$MODELS/seed-mlp.cfg" --batch 32 --train-samples 2048 --test-samples 0
       --threads 1 --seed 5 --optimizer momentum --lr 0.01 --microbatches 2 --steps 3000)
"$PIPETRAIN" train "${LARGS[@]}" --save "$WORK/lref.st" >/dev/null
cat >"$WORK/launch.sbatch" <<SB
#!/bin/bash
exec "$PIPETRAIN" launch --max-restarts 2 --log "$WORK/launch.jsonl" -- srun --mpi=pmi2 \\
    -n \$SLURM_NTASKS "$PIPETRAIN" train ${LARGS[*]} --stages 2 --checkpoint-dir "$WORK/lck" \\
    --checkpoint-every 500 --save "$WORK/launch.st"
SB
timeout 120 sbatch --wait --nodes=2 --ntasks-per-node=1 -o "$WORK/launch.out" \
    "$WORK/launch.sbatch" >/dev/null 2>&1 &
job=$!
for _ in $(seq 600); do ls "$WORK"/lck/ckpt-*.safetensors >/dev/null 2>&1 && break; sleep 0.05; done
pkill -KILL -n -f -- "--checkpoint-dir $WORK/lck " || true
wait $job && rc=0 || rc=$?
if [ $rc = 0 ] && grep -q '"event":"restart"' "$WORK/launch.jsonl" \
    && "$PIPETRAIN" diff "$WORK/launch.st" "$WORK/lref.st" >/dev/null; then
    pass "launch -- srun in an allocation: a task killed, restarted, bit-identical to one process"
else
    failed "launch under srun: exit $rc"; tail -n 20 "$WORK/launch.out"; cat "$WORK/launch.jsonl"
fi

# MPICH's network path: UCX over TCP on loopback instead of shared memory. Under load about
# one run in 75 ends with both ranks stuck in MPI_Finalize, MPICH 4.0.2's finalize race over
# UCX 1.13's tcp transport (the stacks in docs/PERFORMANCE.md), after pipetrain's work is done
# and saved: a run still going after 60 s is tried once more, and a run whose parameters were
# saved, bit-identical, before it hung passes with a note saying so (a hang before the save
# leaves no file: each try starts without one).
tcp_run() {
    rm -f "$WORK/tcp.st"
    timeout 60 env UCX_TLS=tcp,self UCX_NET_DEVICES=lo "$MPIEXEC" -n 2 "$PIPETRAIN" train \
        "${ARGS[@]}" --stages 2 --save "$WORK/tcp.st" >/dev/null 2>"$WORK/tcp.err"
}
tcp_done() { [ -s "$WORK/tcp.st" ] && "$PIPETRAIN" diff "$WORK/tcp.st" "$WORK/ref.st" >/dev/null; }
tcp_rc=0
tcp_run || tcp_rc=$?
if [ "$tcp_rc" = 124 ] && ! tcp_done; then
    echo "note: the UCX tcp run hung for 60 s before its save; trying once more"
    tcp_rc=0; tcp_run || tcp_rc=$?
fi
[ "$tcp_rc" = 124 ] && tcp_done && tcp_rc=0 &&
    echo "note: the UCX tcp run saved its parameters, then did not end (MPICH's tcp finalize race)"
if [ "$tcp_rc" = 0 ] && tcp_done; then
    pass "2-stage pipeline over UCX tcp (loopback): bit-identical to one process"
else
    failed "pipeline over UCX tcp"; tail -n 5 "$WORK/tcp.err"
fi
finish
