/* Gradient reduction inside a data-parallel group: the replicas of one pipeline stage sum
 * their float32 gradients (host memory) bucket by bucket, with one of four methods, while
 * the executor goes on computing. Waits are polite (MPI_Test + short sleep, through
 * mpi_wait_collective: ranks may outnumber cores) and give up after a timeout with a
 * message naming the bucket, its size and the group.
 *
 * Gradient scaling: each replica's gradients are already scaled by 1/(global batch) (the
 * loss gradient is), so every method computes a plain SUM of the replicas' arrays, never
 * a mean. This is what keeps REDUCE_ORDERED bit-identical to a one-process sum.
 *
 * Use, per optimizer step (every rank of the group in the same order):
 *   reduce_start(r, grads, b)   for each bucket b, as soon as its gradients are final
 *   reduce_test(r)              between instructions: moves every reduction along
 *   reduce_wait(r, b)           before the optimizer needs bucket b (or reduce_wait_all)
 *   methods with reduce_method_root_steps(): the group's first rank (rank 0 of the group
 *   communicator) alone takes the optimizer step, then reduce_broadcast(r, params).
 * Every rank of the group must start the buckets in the same order (MPI matches
 * collectives in the order they are started: a mismatch sums the wrong buckets or hangs);
 * the order may be any, and need not be the bucket order. */
#ifndef PT_REDUCE_H
#define PT_REDUCE_H

#include <mpi.h>
#include <stddef.h>

/* the methods, bucket plans and communicators the reductions run on */
#include "src/reduce/reduce_plan.h"

/* ---- reductions ----------------------------------------------------------------------- */

typedef struct reduce reduce_t; /* opaque: MPI communicators, requests and scratch */

typedef struct {
    reduce_method method;
    double timeout_s; /* a wait without progress for this long fails (--timeout) */
    const char *name; /* names the group in messages, e.g. "stage 1" (copied; may be NULL) */
    int pieces;       /* REDUCE_ORDERED only: gradient arrays per rank that the reduction sums
                         (0 or 1: one, the caller's flat array; P > 1: reduce_start_pieces) */
    int zero;         /* ZeRO (allreduce, ordered): each rank keeps only its shard of each
                         bucket's sum (shard j = [n·j/R, n·(j+1)/R) of the bucket, as the
                         ordered reduce-scatter's): ordered skips the gradients' all-gather,
                         allreduce runs MPI_Ireduce_scatter; the rest of the bucket is left
                         unspecified. Buckets marked by reduce_keep_whole are summed whole.
                         2 or more (ZeRO-2): the caller starts a bucket only after the
                         one before has completed, so the ordered method's buckets share
                         one scratch of the largest bucket's exchange, kept resident
                         (given back and faulted in again per bucket, it cost a trap and a
                         kernel clear per 4 KiB of every bucket, every step); a start
                         while another bucket's exchange is in flight fails. */
} reduce_config;

/* Collective over `group` (the replicas of one stage, the first rank being the root of the
 * -bcast methods): duplicates it (two communicators, so the reduction's collectives never
 * meet the caller's) and allocates the scratch: gather-bcast R × total floats on the root,
 * ordered about one total of floats on every rank. The plan is copied. */
int reduce_init(reduce_t **r, MPI_Comm group, const reduce_plan *plan,
                const reduce_config *cfg);
/* After a failure reductions may still be in flight: their scratch and communicators are
 * then left allocated (MPI may still write into them; the job is ending). */
void reduce_free(reduce_t *r);

/* Starts bucket b's reduction on grads (the stage's whole flat array: the bucket's range
 * is read and, where the method puts the sum, written; leave it alone until reduce_wait).
 * −1 if b is out of range or already in flight. */
int reduce_start(reduce_t *r, float *grads, int bucket);
/* The same from the bucket's elements in each of this rank's cfg.pieces gradient arrays:
 * pieces[p] points at the bucket's first element in piece p (its count floats are read;
 * leave them alone until reduce_wait); the sum lands in pieces[0]. For the methods other
 * than REDUCE_ORDERED there is one piece. */
int reduce_start_pieces(reduce_t *r, int bucket, float *const *pieces);
/* Never blocks: tests every reduction in flight, does the local work of those that moved
 * on (sums, next phase). Returns how many are still in flight, or −1 with a message. */
int reduce_test(reduce_t *r);
/* 1 when bucket b's last reduction has completed (as of the last test or wait). */
int reduce_done(const reduce_t *r, int bucket);
/* Waits politely until bucket b's reduction has completed. 0 at once when it has; −1 for
 * a bucket never started; on no progress for timeout_s, −1 with a message naming this rank
 * and host, the method, the bucket (its layers and size) and the group. */
int reduce_wait(reduce_t *r, int bucket);
/* Waits for every reduction in flight (each wait with its own timeout). */
int reduce_wait_all(reduce_t *r);
/* Every bucket in bucket order, then reduce_wait_all: the reduction after the backward
 * pass (--overlap off). */
int reduce_run(reduce_t *r, float *grads);
/* Broadcasts params (the stage's flat array, total_count floats) from the group's first
 * rank, bucket by bucket, and waits politely. Collective; no reduction may be in flight. */
int reduce_broadcast(reduce_t *r, float *params);

/* ---- ZeRO (reduce_config.zero) ----------------------------------------------------------- */

/* Bucket b's sum stays whole on every rank (a tied head's gradients, summed across stages
 * after the reduction). Before its first start; every rank of the group alike. */
int reduce_keep_whole(reduce_t *r, int bucket);
/* Group rank `rank`'s shard of bucket b, as [off, off + count) of the flat array. */
int reduce_shard(const reduce_t *r, int bucket, int rank, size_t *off, size_t *count);
/* Collective, no reduction in flight: every rank's shard of params (the flat array) to
 * every rank (MPI_Iallgatherv per bucket, in place), waited for politely. */
int reduce_allgather_params(reduce_t *r, float *params);
/* Collective: each rank's `compact` values of its shards (bucket after bucket) gathered on
 * the group's first rank into `whole` (total_count floats; NULL elsewhere) at their places. */
int reduce_gather_shards(reduce_t *r, const float *compact, float *whole);

int reduce_group_size(const reduce_t *r);
int reduce_group_rank(const reduce_t *r);
const reduce_plan *reduce_get_plan(const reduce_t *r);

/* ---- statistics ----------------------------------------------------------------------- */

/* Since reduce_init or the last reduce_reset_stats. Completion is seen in reduce_test or
 * reduce_wait, so reduce_s is as fine as the caller's calls to them. */
typedef struct {
    long reductions;  /* bucket reductions completed */
    size_t bytes;     /* gradient bytes they reduced (bucket bytes each, whatever the pieces) */
    double reduce_s;  /* their durations, start to completion, summed (may overlap) */
    double exposed_s; /* time spent inside reduce_wait, reduce_wait_all, reduce_broadcast */
    long broadcasts;
    size_t broadcast_bytes;
    double broadcast_s;
    long gathers;         /* ZeRO: the parameters' all-gathers */
    size_t gather_bytes;  /* the parameter bytes they gathered (the whole stage each) */
    double gather_s;
} reduce_stats;

typedef struct {
    long reductions;
    double reduce_s;       /* summed */
    double t_start, t_end; /* the last completed reduction, on pt_now()'s clock (trace) */
} reduce_bucket_stats;

void reduce_get_stats(const reduce_t *r, reduce_stats *st);
void reduce_get_bucket_stats(const reduce_t *r, int bucket, reduce_bucket_stats *st);
void reduce_reset_stats(reduce_t *r);
/* nccl-tests' bus bandwidth of an all-reduce, in bytes/s: 2(R−1)/R × bytes / seconds
 * (0 for R ≤ 1 or no time). Applied to every method, so they compare on one scale. */
double reduce_bus_bandwidth(size_t bytes, double seconds, int ranks);

#endif
