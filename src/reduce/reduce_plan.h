/* The plan of a data-parallel group's gradient reduction, fixed before training starts:
 * which method sums the replicas' gradients, how a stage's parameters are cut into
 * buckets, and which world ranks form each stage's group and each replica's pipeline
 * (with their communicators). src/reduce/reduce.h runs the reductions on such a plan. */
#ifndef PT_REDUCE_PLAN_H
#define PT_REDUCE_PLAN_H

#include <mpi.h>
#include <stddef.h>

/* ---- methods -------------------------------------------------------------------------- */

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
