# The gradient reduction module (src/reduce/reduce.h) through tests/reduce_mpi.c: every method
# against the rank-order sum, bucket plans, layouts, at 1 to 4 ranks (more ranks than this
# machine's cores: the module waits politely); then a rank that never joins a reduction
# must end the job within seconds, naming the bucket it was waiting in.
source "$(dirname "$0")/lib/common.bash"
: "${REDUCE_MPI:?set by ctest (tests/CMakeLists.txt)}"

for n in 1 2 3 4; do
    rc=0
    timeout 120 "$MPIEXEC" -n "$n" "$REDUCE_MPI" check >"$WORK/out" 2>"$WORK/err" || rc=$?
    if [ "$rc" -eq 0 ] && grep -q "^reduce_mpi: all [0-9]* checks passed on $n ranks" "$WORK/out"
    then
        pass "$n ranks: $(cat "$WORK/out")"
    else
        failed "$n ranks: exit $rc"; cat "$WORK/out"; head -n 40 "$WORK/err"
    fi
done

# The last rank stalls before bucket 1 (of 3); the timeout is 1 s. With the -bcast methods a
# rank whose own part of the reduction completed waits in the broadcast instead.
for n in 2 3 4; do
    for method in allreduce ordered reduce-bcast gather-bcast; do
        case $method in
            allreduce) what="bucket 1 of 3 (layer 4, 300 floats, 1.2 KiB): the allreduce" ;;
            ordered) what="bucket 1 of 3 (layer 4, 300 floats, 1.2 KiB): the reduce-scatter" ;;
            *) what="bucket [01] of 3 .*: the \(reduce\|gather\|broadcast\)" ;;
        esac
        [ "$n" -ne 3 ] && [ "${method%-bcast}" != "$method" ] && continue
        start=$(date +%s)
        expect_fail "$method, $n ranks, the last one stalled" \
            "no progress for 1 s in $what.* in the replica group of stage 0 ($n ranks" \
            "$MPIEXEC" -n "$n" "$REDUCE_MPI" timeout "$method"
        elapsed=$(( $(date +%s) - start ))
        [ "$elapsed" -lt 20 ] && pass "ended after ${elapsed} s" || failed "took ${elapsed} s"
    done
done
finish
