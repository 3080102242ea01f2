/* Hybrid mode: R data-parallel replicas of a K-stage pipeline. This module holds what the
 * executor (src/runtime/exec.c) needs beyond one pipeline: each stage's gradient buckets and the
 * backward parts that let their reductions overlap the backward pass, the reductions added
 * to the schedule, and at run time the reductions of this rank's stage among its replicas
 * (src/reduce/reduce.h) with the engine's host view of the gradients (src/engine/engine.h).
 *
 * Layout (the convention of topologies/topo.h's job grid): stage s of replica r is world
 * rank s·R + r. Each replica trains on its contiguous share of every batch; the engine's
 * loss gradient is scaled by 1/(global batch), so the replicas' gradients are summed, never
 * averaged. Method "ordered" with M > 1 micro-batches keeps each micro-batch's gradient
 * apart (engine grad_pieces = M) and sums the R·M pieces in (replica, micro-batch) order:
 * bit for bit the gradient of the one-process run with R·M micro-batches of the same
 * global batch. */
#ifndef PT_REPLICAS_H
#define PT_REPLICAS_H

#include <mpi.h>
#include <stddef.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/engine/engine.h"
#include "src/model/net.h"
#include "src/reduce/reduce.h"

typedef struct {
    int replicas;         /* R ≥ 1; 1: nothing to reduce */
    reduce_method method;
    size_t bucket_bytes;  /* allreduce, ordered: the most bytes of a bucket (--bucket-mb) */
    int overlap;          /* allreduce, ordered: reductions start inside the last backward */
    int microbatches;     /* M, per replica */
    int skip_bucket;      /* testing: bucket never reduced on any stage that has it (ZeRO-3:
                             reduced, but its layers' parameters never gathered); −1 */
    double timeout_s;
    int zero;             /* ZeRO stage (--zero): 0 none; 1 each replica keeps the optimizer
                             state of its shard only (the ordered reduce-scatter's pieces of
                             each bucket), steps it, then the parameters are all-gathered;
                             2 also gives back the memory of each bucket's gradients outside
                             its shard (with pieces, the last piece's bucket: the others are
                             formed by whole backwards and keep their pages) as soon as the
                             bucket's reduction has completed (replicas_progress,
                             replicas_wait), and zeroes them by giving their pages back
                             (engine grads_shard, grads_release);
                             3 also keeps only its shard of the parameters: each layer's are
                             all-gathered before each pass and given back after
                             (src/runtime/replicas_zero3.h), none after the step */
    int zero3_prefetch;   /* ZeRO-3: the next layer's gather starts as a layer begins */
    int zero_serial;      /* ZeRO-2 and 3 (--zero-overlap off): each bucket's reduction is
                             waited for, its memory given back, as it starts (one bucket
                             whole at most); 0: it runs while the backward forms the next */
} replicas_config;

/* The -bcast methods reduce a stage's gradients at once after the backward pass, as the
 * classic studies did: one bucket (more only past INT_MAX floats), no overlap. */
int replicas_overlap(const replicas_config *cfg);

/* The bucket plan of layers [first, last) as a stage lays out its gradients (per layer its
 * weight then its bias, layers one after the other); layer indices in the plan are local
 * (0 = first). No layer with parameters: no bucket. */
int replicas_plan(reduce_plan *plan, const net_desc *net, int first, int last,
                  const replicas_config *cfg);

/* The local layers [lo, hi) of backward part b of a stage of n_layers layers cut by
 * `plan`: bucket b's layers and the layers without parameters above them; the last part
 * goes down to layer 0. */
void replicas_plan_part_range(const reduce_plan *plan, int n_layers, int b, int *lo, int *hi);

/* Gradient pieces the engine keeps apart (engine_config.grad_pieces): M for "ordered" with
 * M > 1 and R > 1, else 0. */
int replicas_grad_pieces(const replicas_config *cfg);

/* The bytes of rank k's buckets (float32 counts × 4) in the order replicas_schedule numbers
 * them: chunk by chunk (model chunk schedule_model_chunk(s, k, v) for v = 0, 1, ...), each
 * chunk's as replicas_plan cuts it. *bytes: malloc'd, *n entries (0: none, *bytes may still
 * be set); *chunk_of (where chunk_of is not NULL; malloc'd as *bytes): each bucket's chunk
 * v. −1 with a message. */
int replicas_rank_bucket_bytes(const schedule *s, const net_desc *net, const partition *part,
                               const replicas_config *cfg, int k, double **bytes, int *n,
                               int **chunk_of);

/* With R > 1: adds each stage's reductions (its bucket count from replicas_plan, the same
 * on every rank) to a generated schedule, then checks that every replica of every stage
 * issues its collectives in the same order. Nothing to do for R = 1. */
int replicas_schedule(schedule *s, const net_desc *net, const partition *part,
                      const replicas_config *cfg);

/* ---- run time: this rank's stage among its replicas ----------------------------------- */

typedef struct replicas replicas_t; /* opaque: the reduction, the plan, scratch */

/* Collective over `group` (the replicas of this rank's stage, rank = replica). *r is NULL
 * when there is nothing to reduce (R = 1, or a stage without parameters): the executor then
 * runs the stage as in one pipeline. `eng` must outlive r; stage_index names the group in
 * messages. */
int replicas_init(replicas_t **r, MPI_Comm group, engine *eng, const net_desc *net, int first,
                  int last, int stage_index, const replicas_config *cfg);
void replicas_free(replicas_t *r);

/* replicas_plan_part_range of this rank's stage. */
void replicas_part_range(const replicas_t *r, int b, int *lo, int *hi);
/* ZeRO-2: a backward of bucket b's part begins for buffer m's micro-batch: the gradient
 * memory of its piece that the bucket's last reduction gave back is asked back from the
 * engine (grads_fill), once per give back, before anything writes it. b < 0: a whole
 * backward begins (with pieces, one before the last, whose piece kept its pages; nothing
 * is asked back for its piece this step). */
int replicas_part_begins(replicas_t *r, int b, int m);
/* ALLREDUCE b: bucket b's gradients (every piece) are final; start their reduction. */
int replicas_start(replicas_t *r, int b);
/* REDUCE_WAIT b: waits for bucket b's reduction (timeout: a message naming the bucket) and
 * hands the sum back to the engine (engine_grads_commit). */
int replicas_wait(replicas_t *r, int b);
/* Moves the reductions in flight along; never blocks. −1 with a message on an MPI error. */
int replicas_progress(replicas_t *r);
/* OPTIMIZER_STEP: the engine's step; with a -bcast method the group's first rank steps and
 * broadcasts the parameters, and the others zero their gradients and take them. */
int replicas_step(replicas_t *r, const optimizer_config *opt, int tick);
/* ZeRO: this replica's shard runs (one per bucket, in bucket order; NULL and 0 without
 * ZeRO), the runs whose optimizer state the engine keeps. */
const engine_run *replicas_shard_runs(const replicas_t *r, int *n);
/* The optimizer's whole state for a checkpoint: the engine's read_state, and with ZeRO the
 * group's shards gathered on the group's first rank (collective over the group: every
 * replica calls it, m and v whole arrays there, ignored elsewhere). */
int replicas_read_state(replicas_t *r, float *m, float *v, long *updates);
/* ZeRO-3: collective over the group: every parameter gathered whole for a read (a
 * checkpoint), then given back again with replicas_params_done. Nothing to do otherwise. */
int replicas_params_whole(replicas_t *r);
int replicas_params_done(replicas_t *r);
/* After the step: adds this step's reductions to the figures. */
void replicas_end_step(replicas_t *r);

/* Bucket b's reduction of the last step, for the trace: 1 with its pt_now() interval and
 * bytes when it ran in that step, else 0. */
int replicas_bucket_event(const replicas_t *r, int b, double *t0, double *t1, size_t *bytes);
int replicas_buckets(const replicas_t *r);

/* The α–β figures of this group's reductions, measured (replicas_calibrate), for the
 * simulator's prediction: a reduction of n bytes among R replicas is priced
 * 2(R−1)·alpha + 2(R−1)/R · n/beta (schedule_allreduce_time), and a -bcast method's
 * broadcast of the parameters after the step takes bcast_s. */
typedef struct {
    double alpha, beta;  /* seconds per ring step; bytes per second (may be INFINITY) */
    double reduce_s;     /* the stage's whole reduction, every bucket back to back */
    double latency_s;    /* one reduction of a single value */
    double bcast_s;      /* -bcast methods: the parameters' broadcast; ZeRO-1 and 2: the
                            parameters' all-gather after the step; ZeRO-3: every layer's
                            gather (what one pass of the stage gathers; none after the
                            step); else 0 */
} replicas_calibration;

/* Collective over the group, before the first step: times up to `reps` reductions (at
 * least 3, within about half a second, after 3 untimed ones) of the stage's
 * gradients (all buckets started at once, as with --overlap off, through the run's own
 * method and engine views) and of a single value, the slowest rank of each counting, and
 * fits alpha and beta to the medians. The gradients must hold no step's contributions (they
 * are zeroed after). Every rank of the group gets the same figures. */
int replicas_calibrate(replicas_t *r, MPI_Comm group, int reps, replicas_calibration *out);

/* Since replicas_init or the last replicas_reset_stats. */
typedef struct {
    double reduce_s;   /* time with at least one reduction (or broadcast) of the stage in
                          flight, per step, summed */
    double exposed_s;  /* the part of it compute waited for (reduce waits, broadcasts) */
    size_t bytes;      /* gradient bytes reduced */
    long steps;
} replicas_stats;
void replicas_get_stats(const replicas_t *r, replicas_stats *st);
void replicas_reset_stats(replicas_t *r);

#endif
