/* What a layout would cost, before running it: the step time and each rank's memory.
 *
 * Time: the schedule's simulator fed with per-layer times (a profile measured on this
 * machine), the pipeline messages priced by the links between neighbouring model chunks and
 * each stage's reductions among its replicas by the α–β figures of the link its group's
 * ring crosses. Zero-bubble schedules' input and weight gradients (B, W) are priced by the
 * profile's split backward where it was measured (else half of the backward each), and
 * recomputation by the forward. `plan` prints it; `train --json` reports the same
 * simulation from measured stage times (src/train/train_report.c).
 *
 * Memory: what train's CPU engine allocates on each rank (plan_memory). */
#ifndef PT_PLAN_PREDICT_H
#define PT_PLAN_PREDICT_H

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/model/net.h"
#include "src/model/shard.h"
#include "src/runtime/profile.h"
#include "src/runtime/replicas.h"

/* The schedule a layout runs, built as train builds it: generator `name` (any of
 * schedule_init_named's; "search" at unit costs: plan_predict searches at the profile's) for `stages` ranks with `virtual_stages` chunks each (V > 1
 * only with "interleaved") and `microbatches` micro-batches, then recomputation on the
 * ranks with recompute[s] != 0 (NULL: none). No reductions. −1 with a message. */
int plan_schedule(schedule *s, const char *name, int stages, int virtual_stages,
                  int microbatches, const int *recompute);

typedef struct {
    const char *schedule;      /* generator name, as plan_schedule */
    int virtual_stages;        /* V chunks per rank (0 or 1: one); the partition then has
                                * K·V stages, model chunk c = v·K + s on rank s */
    const int *recompute;      /* per rank: recomputation there; NULL: none */
    int microbatch;            /* samples per micro-batch */
    replicas_config rep;       /* replicas, method, buckets, overlap, micro-batches (M) */
    const double *alpha, *beta; /* per rank: the group's link (R > 1), seconds / bytes/s */
    const double *message_s;   /* per boundary between model chunks c and c+1: one
                                * activation or gradient message (K·V − 1 entries; may be
                                * NULL: free) */
    /* tensor shards (NULL or T = 1: none): every rank of a stage is one of T, each layer's
     * profiled times are taken as they are with shard_profile (a profile of the shards),
     * else divided by T where the layer is cut or works on a sharded vector (perfect
     * scaling of the kernels), and each model chunk's collectives
     * (shard_stage_traffic) are priced on its rank's tensor link (plan_tensor_cost) and
     * added to its forward (forward ones) and backward (backward ones; B of a split
     * backward). The replicas' buckets shrink to the largest rank's share of the stage's
     * parameters. */
    const shard_plan *shard;
    int shard_profile;         /* the profile measured the layers as a tensor rank runs them
                                * (profile_shards): their times are taken as they are */
    const double *tensor_alpha, *tensor_beta; /* per rank (stage): the tensor group's link */
    int zero;                  /* train --zero (R > 1): with 3 each layer's parameters are
                                * all-gathered before each of its passes, priced on the
                                * group's link (alpha, beta) and added to the passes where
                                * the previous layers' compute does not hide them
                                * (plan_zero3_pass_s) */
    int zero3_prefetch;        /* --zero3-prefetch on: a layer's compute may hide the next
                                * layer's gather; off: every gather is waited for */
    int reduce_in_waits;       /* CPU ranks: reductions progress only while a rank waits
                                * for them (schedule_costs.reduce_in_waits) */
    /* schedule "search": schedule_search at these chunks' costs (F, B, W; the slowest
     * message) with this limit (micro-batches per rank, 0: none) and at most search_runs
     * greedy orders (0: the search's default) */
    double schedule_memory;
    int search_runs;
} plan_predict_config;

typedef struct {
    double step_s;                    /* makespan of one optimizer step */
    double bubble;                    /* mean over ranks of idle / step */
    double *busy_s, *reduce_s, *exposed_s; /* per rank, one block (owned) */
    double *tensor_s;                 /* per rank: seconds per step in tensor collectives
                                       * (inside busy_s; 0 without shards) */
    double *zero3_s;                  /* per rank: seconds per step waiting for ZeRO-3's
                                       * gathers (inside busy_s; 0 without; the split
                                       * backward's are in B and W, not counted here) */
    schedule sched;                   /* the schedule simulated (owned; with the replicas'
                                       * reductions): a search's result, origin set */
} plan_prediction;

/* Tensor collectives of one micro-batch of `microbatch` samples through a model chunk with
 * traffic tr, on a ring of T ranks whose slowest link has latency alpha (s) and bandwidth
 * beta (bytes/s), 4 bytes a value: an all-reduce of n bytes costs 2(T−1)/T·n/β + 2(T−1)·α,
 * an all-gather of n bytes (the whole vector) (T−1)/T·n/β + (T−1)·α, each counted as many
 * times as the traffic has collectives. *fwd: the forward ones, *bwd: the backward ones. */
void plan_tensor_cost(const shard_traffic *tr, int T, double microbatch, double alpha,
                      double beta, double *fwd, double *bwd);
/* Bytes one rank of the ring sends per micro-batch for that traffic (the same ring
 * algorithms: (T−1)/T·n per all-gather, 2(T−1)/T·n per all-reduce), and its messages. */
void plan_tensor_sent(const shard_traffic *tr, int T, double microbatch, double *bytes,
                      double *messages);
/* The share of a layer's profiled time one tensor rank does: 1/T where the layer is cut or
 * works on a sharded vector, else 1 (p NULL: 1). */
double plan_tensor_share(const shard_plan *p, int l);
/* The profile of tensor rank T − 1's layers (the largest shards: ⌊·⌋ cuts give the last
 * rank the most), each layer alone as its shard runs (shard_local_net): what a rank of the
 * group computes, with the small products' lower efficiency, not the whole layer's / T. */
int plan_profile_shards(partition_profile *prof, const net_desc *net, const shard_plan *sp,
                        const profile_options *po);

/* ZeRO-3: the seconds one pass (forward, or backward) of layers [first, last) waits for its
 * layers' all-gathers among R replicas on a link of latency alpha and bandwidth beta: a
 * layer of n parameters (times `share`, a tensor rank's part) costs (R−1)·alpha +
 * (R−1)/R·4n/beta, started when the layer with parameters before it in the pass begins
 * (prefetch), so hidden by the compute since then (compute[l]: layer l's seconds in the
 * pass) unless in_waits (the CPU engine: MPI moves the bytes only inside its waits); the
 * pass's first layer with parameters waits for all of its own. */
double plan_zero3_pass_s(const net_desc *net, int first, int last, const double *compute,
                         double scale, double share, int R, double alpha, double beta,
                         int in_waits, int backward);

/* Simulates one step. The optimizer's update is left out (not in the profile). −1 with a
 * message for an unknown schedule, a profile of another model, a partition that is not
 * K·V chunks, or replicas with V > 1 (train does not run them). */
int plan_predict(plan_prediction *out, const net_desc *net, const partition *part,
                 const partition_profile *prof, const plan_predict_config *cfg);
void plan_prediction_free(plan_prediction *p);

typedef struct {
    int microbatch;    /* samples per micro-batch */
    int wgrad_batched; /* train --wgrad batched */
    int grad_pieces;   /* the engine's gradient pieces (replicas_grad_pieces), 0 or 1: none */
    int zero, replicas; /* train --zero: with 1, each replica holds 1/replicas of the
                           optimizer's moments (the rest of the state whole); with 2 also of
                           the gradients, plus the whole buckets in flight */
    int zero3_prefetch; /* --zero 3: two layers whole beyond the shards (the running one and
                           the next one's gather), else one */
    replicas_config rep; /* --zero 2: the bucket plan (method, bucket bytes) */
    const shard_plan *shard; /* tensor shards: the largest over the T ranks of a stage
                              * (NULL or T = 1: none) */
    int cuda_engine;   /* the CUDA engine's sizes: the chunks of a V schedule keep their own
                          slots, every message buffer two per micro-batch; 0: the CPU
                          engine's (the chunks share the rank's peak of slots, messages
                          one buffer per micro-batch) */
} plan_memory_config;

/* Peak bytes each rank allocates (out: sched->stages entries), summed over its model
 * chunks c (part has K·V stages; each chunk is an engine of its own; with V > 1 their
 * slots, split backward's gradients included, are the rank's peak over its chunks of units
 * the size of the largest chunk's, where that is fewer: src/runtime/engine_create.h):
 * - stage_estimate (stage_estimate_shard per tensor rank): parameters, gradients, both
 *   moment buffers, gradient groups, one thread's workspaces, and one activation slot per
 *   micro-batch the verifier finds the chunk holding at once (peak_inflight_chunk, at
 *   least 1; with recomputation it counts the forward's moment and the recomputed
 *   micro-batches, as train sizes the slots);
 * - split backward (lists with BACKWARD_INPUT): a slot's output gradients per slot
 *   (stage_split_slot_bytes);
 * - the engine's micro-batch buffers, max(2M, 3) of them: inputs, gradients in, gradients
 *   out (not on model chunk 0), labels and ids;
 * - recomputation (not on the last model chunk): the forward's output kept to send, one
 *   per buffer (the kept inputs are the input buffers above, counted already);
 * - batched weight gradients: stage_wgrad_row_bytes per row, micro-batch × M rows;
 * - gradient pieces: grad_pieces − 1 more gradient arrays.
 * With tensor shards the micro-batch buffers stay whole (a stage receives and sends whole
 * vectors), and the split backward's and batched weight gradients' extra bytes are the
 * whole layers' (an overestimate: those helpers know no shards).
 * Not counted: MPI's own buffers, the allocator's slack, the reductions' scratch. −1 with a
 * message. */
int plan_memory(double *out, const net_desc *net, const partition *part, const schedule *sched,
                const plan_memory_config *cfg);

#endif
