# plan --emit mpiexec: the printed command runs the plan (its cut, layout and binding) and
# ends bit-identical to the one-process run with the same micro-batches; bad combinations
# are refused. (--emit slurm is run on a real local Slurm cluster by slurm_cluster.sh.)
source "$(dirname "$0")/lib/common.bash"
export OPENBLAS_NUM_THREADS=1
P=(--model "$MODELS/seed-mlp.cfg" --batch 32 --microbatches 2 --partition params)
RUN=(--steps 3 --train-samples 256 --test-samples 0 --seed 4)

cmd=$("$PIPETRAIN" plan "${P[@]}" --stages 2 --emit mpiexec)
case $cmd in
    "mpiexec -n 2 -bind-to user:"*"--stages 2 --replicas 1 --batch 32 --microbatches 2 --schedule 1f1b --partition "*)
        pass "plan --emit mpiexec: $cmd" ;;
    *) failed "plan --emit mpiexec printed: $cmd" ;;
esac
cut=$(sed -n 's/.*--partition \([0-9,]*\).*/\1/p' <<<"$cmd")
"$PIPETRAIN" train "${P[@]}" "${RUN[@]}" --threads 1 --save "$WORK/ref.st" >/dev/null
if PIPETRAIN=$PIPETRAIN eval "${cmd/mpiexec/$MPIEXEC} ${RUN[*]} --save $WORK/emit.st" >/dev/null \
    && "$PIPETRAIN" diff "$WORK/emit.st" "$WORK/ref.st" >/dev/null; then
    pass "the emitted command runs (cut $cut): bit-identical to one process"
else
    failed "the emitted command failed or differs"
fi
"$PIPETRAIN" plan "${P[@]}" --stages 2 --replicas 2 --nodes 2 --reduce ordered --emit slurm \
    >"$WORK/job.sh"
bash -n "$WORK/job.sh" && grep -q "^#SBATCH --nodes=2" "$WORK/job.sh" \
    && grep -q "^#SBATCH --ntasks=4" "$WORK/job.sh" && grep -q -- "--reduce ordered" "$WORK/job.sh" \
    && pass "plan --emit slurm: a valid job script for 4 ranks on 2 nodes" \
    || { failed "plan --emit slurm"; cat "$WORK/job.sh"; }
expect_fail "--emit with --json" "give one of them" "$PIPETRAIN" plan "${P[@]}" --stages 2 \
    --emit slurm --json
expect_fail "--emit with an unknown launcher" "--emit" "$PIPETRAIN" plan "${P[@]}" --stages 2 \
    --emit qsub
finish
