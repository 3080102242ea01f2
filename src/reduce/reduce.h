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

typedef enum {
    /* MPI_Iallreduce(MPI_IN_PLACE, SUM) per bucket: the sum on every rank, in the order
     * MPI chooses (within float32 rounding of the rank-order sum; the same from run to run
     * for the same ranks and buckets). */
    REDUCE_ALLREDUCE = 0,
    /* As the classic study: MPI_Ireduce (SUM) per bucket to the group's first rank, which
     * steps and broadcasts the parameters (reduce_broadcast). Other ranks' gradients are
     * left as they were. */
    REDUCE_REDUCE_BCAST,
    /* As the other classic studies: MPI_Igather per bucket to the group's first rank, which
     * sums the replicas in rank order (acc = g0; acc += g1; ...), steps and broadcasts.
     * Bit-identical to the rank-order sum on the first rank. */
    REDUCE_GATHER_BCAST,
    /* A deterministic reduce-scatter + all-gather: each rank owns a contiguous shard of
     * each bucket (shard j = [n·j/R, n·(j+1)/R)), receives the other ranks' pieces of it
     * (MPI_Ialltoallv), sums them in rank order 0..R−1 in float32 (acc = g_0; acc += g_1;
     * ...), then MPI_Iallgatherv shares the shards. Every rank ends with exactly the bits
     * of summing the R arrays in rank order on one process, whatever R and the buckets.
     * Bytes on the wire per rank: 2(R−1)/R × bucket bytes, as a ring all-reduce.
     * With P pieces per rank (reduce_config.pieces, reduce_start_pieces) the R·P arrays are
     * summed in (rank, piece) order: acc = g_{0,0}; acc += g_{0,1}; ... acc += g_{1,0}; ...;
     * the reduce-scatter then carries P times the bytes. */
    REDUCE_ORDERED,
    REDUCE_METHOD_COUNT
} reduce_method;

/* "allreduce", "reduce-bcast", "gather-bcast", "ordered". */
const char *reduce_method_name(reduce_method m);
/* 0, or −1 with a message that lists the known names. */
int reduce_method_parse(const char *name, reduce_method *out);
/* 1 when only the group's first rank has the sum (it steps, then reduce_broadcast). */
int reduce_method_root_steps(reduce_method m);

/* ---- bucket plan ---------------------------------------------------------------------- */

/* One layer's parameters in the stage's flat gradient array (layers in forward order,
 * stored one after the other from offset 0; a layer without parameters has count 0 and
 * any offset). */
typedef struct {
    size_t offset, count;
} reduce_layer;

typedef struct {
    size_t offset, count;        /* elements [offset, offset + count) of the flat array */
    /* The layers with parameters it holds, first_layer ≤ last_layer (indices into the
     * layers given to reduce_plan_buckets; layers without parameters between them are
     * inside the range, those between two buckets belong to neither). Its gradients are
     * final once the backward pass of the last micro-batch has gone through first_layer. */
    int first_layer, last_layer;
} reduce_bucket;

typedef struct {
    int n_buckets;
    reduce_bucket *buckets; /* owned; bucket 0 holds the last layers */
    size_t total_count;     /* parameters of every layer; the buckets tile [0, total_count) */
} reduce_plan;

/* Cuts the layers into buckets of at most bucket_bytes (float32), in REVERSE layer order:
 * bucket 0 holds the last layers, whose gradients are final first in the backward pass.
 * A bucket never splits a layer: a layer larger than bucket_bytes is a bucket of its own
 * (splitting it would not start anything earlier: all its gradients are final at once).
 * A bucket never exceeds INT_MAX elements (one MPI message). No layer with parameters:
 * no bucket. −1 with a message for bucket_bytes = 0, a layout that is not contiguous from
 * 0 in layer order, or a layer of more than INT_MAX parameters. */
int reduce_plan_buckets(reduce_plan *plan, const reduce_layer *layers, int n_layers,
                        size_t bucket_bytes);
void reduce_plan_free(reduce_plan *plan);

/* ---- reductions ----------------------------------------------------------------------- */

typedef struct reduce reduce_t; /* opaque: MPI communicators, requests and scratch */

typedef struct {
    reduce_method method;
    double timeout_s; /* a wait without progress for this long fails (--timeout) */
    const char *name; /* names the group in messages, e.g. "stage 1" (copied; may be NULL) */
    int pieces;       /* REDUCE_ORDERED only: gradient arrays per rank that the reduction sums
                         (0 or 1: one, the caller's flat array; P > 1: reduce_start_pieces) */
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

/* ---- layout: world rank ↔ (stage, replica), communicators ----------------------------- */

/* Default placement without binding: rank = stage × replicas + replica, i.e. each stage's
 * replicas on consecutive ranks (ranks 0..R−1 are stage 0's replicas), stages outermost:
 * the inverse of topologies/topo.h's topo_grid_rank. −1 with a message when rank is
 * outside [0, stages × replicas). A placement may choose any other one-to-one mapping and
 * pass it to reduce_comms_init. */
int reduce_layout_default(int rank, int stages, int replicas, int *stage_of,
                          int *replica_of);

typedef struct {
    int stages, replicas;
    int stage, replica;    /* this rank's */
    MPI_Comm pipeline;     /* the ranks of this replica, rank = stage (the executor's comm) */
    MPI_Comm group;        /* the replicas of this stage, rank = replica (reduce_init's) */
} reduce_comms;

/* Collective over world: checks that world has stages × replicas ranks (else a message
 * saying which mpiexec -n is needed, the same on every rank) and that the ranks' (stage,
 * replica) pairs are valid and distinct (a polite all-gather with timeout_s), then builds
 * both communicators with MPI_Comm_split. reduce_comms_free frees them. */
int reduce_comms_init(reduce_comms *c, MPI_Comm world, int stages, int replicas,
                      int my_stage, int my_replica, double timeout_s);
void reduce_comms_free(reduce_comms *c);

#endif
