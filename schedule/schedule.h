/* Schedules as data: for each pipeline stage, the ordered list of instructions it runs in
 * one optimizer step. The executor runs these lists, the simulator prices them and the
 * printer draws them; a new schedule is a new generator, not a new executor.
 *
 * Stage s receives activations from s−1 and gradients from s+1. Stage 0 reads its input
 * from the data set; the last stage computes the loss, so it has no RECV_GRAD/SEND_ACT.
 *
 * Reductions (hybrid mode: R replicas of the pipeline, each stage's gradients averaged
 * among its R replicas). A stage's parameters are cut into B buckets in reverse layer
 * order: bucket 0 holds the stage's last layers, whose gradients are final first in the
 * backward pass; buckets hold whole layers. ALLREDUCE b starts the non-blocking reduction
 * of bucket b, REDUCE_WAIT b waits until it has completed. So that reductions can overlap
 * the backward pass, a micro-batch's backward may be split into B parts: BACKWARD with
 * bucket b runs the backward through the layers of bucket b only (layers without
 * parameters belong to a part too; the executor decides which). The parts of one
 * micro-batch run in order 0..B−1 and together are its backward: the gradient of the input
 * (SEND_GRAD) is ready after part B−1. Every replica of a stage runs the same list, so the
 * collectives of a stage's group are issued in the same order everywhere (see
 * schedule_verify_replicas for lists that differ).
 */
#ifndef PT_SCHEDULE_H
#define PT_SCHEDULE_H

#include <stdio.h>

typedef enum {
    SCHED_OP_RECV_ACT = 0,  /* wait for micro-batch m's input activation from stage s−1 */
    SCHED_OP_FORWARD,       /* forward micro-batch m (last stage: also loss and its gradient) */
    SCHED_OP_SEND_ACT,      /* send micro-batch m's output activation to stage s+1 */
    SCHED_OP_RECV_GRAD,     /* wait for the gradient of m's output from stage s+1 */
    SCHED_OP_BACKWARD,      /* backward micro-batch m (or its part b), accumulate gradients */
    SCHED_OP_SEND_GRAD,     /* send the gradient of m's input to stage s−1 */
    SCHED_OP_ALLREDUCE,     /* start reducing bucket b's gradients among the stage's replicas */
    SCHED_OP_RECOMPUTE,     /* re-run m's forward to rebuild dropped activations */
    SCHED_OP_OPTIMIZER_STEP,
    SCHED_OP_REDUCE_WAIT,   /* wait until bucket b's reduction has completed */
    SCHED_OP_COUNT
} schedule_op_kind;

typedef struct {
    schedule_op_kind kind;
    int microbatch; /* −1 for ALLREDUCE, REDUCE_WAIT and OPTIMIZER_STEP */
    int peer;       /* stage sent to or received from; −1 when none */
    int bucket;     /* ALLREDUCE, REDUCE_WAIT: bucket b in [0, buckets); BACKWARD: −1 for
                     * the whole stage, b for part b only; −1 for every other op */
} schedule_op;

typedef struct {
    int n_ops, cap;
    schedule_op *ops; /* owned */
    int buckets;      /* B, buckets this stage reduces among its replicas; 0: none (no
                       * replicas, or a stage without parameters) */
} schedule_list;

typedef struct {
    char name[32];
    int stages, microbatches;
    schedule_list *lists; /* owned, one per stage */
} schedule;

/* Generators. Every stage's list ends with OPTIMIZER_STEP. Backwards run in micro-batch
 * order 0..M−1 on every stage, so gradients accumulate in the same order as sequential
 * training with the same micro-batching. Return −1 with a message for stages < 1 or
 * microbatches < 1. */
int schedule_init_gpipe(schedule *s, int stages, int microbatches);
int schedule_init_1f1b(schedule *s, int stages, int microbatches);
/* name: "gpipe" or "1f1b"; an unknown name is an error listing the known ones. */
int schedule_init_by_name(schedule *s, const char *name, int stages, int microbatches);
/* Empty schedule, for building lists by hand (tests, future generators). */
int schedule_init_empty(schedule *s, const char *name, int stages, int microbatches);
/* Appends an op with bucket −1; schedule_append_op appends any op as given. */
int schedule_append(schedule *s, int stage, schedule_op_kind kind, int microbatch, int peer);
int schedule_append_op(schedule *s, int stage, schedule_op op);
void schedule_free(schedule *s);

/* Adds the reductions of `buckets` buckets per stage to a generated schedule (one without
 * reductions or split backwards) and sets every list's `buckets`. With overlap, each
 * stage's last BACKWARD in list order (the last micro-batch's) is split into parts
 * 0..B−1 (B = 1: kept whole) with ALLREDUCE b right after part b, except that the
 * SEND_GRAD following the last part comes before ALLREDUCE B−1 (the previous stage waits
 * for that gradient; the last bucket is needed only at the step); then the rest of the
 * list, then REDUCE_WAIT 0..B−1 just before OPTIMIZER_STEP. Without overlap,
 * ALLREDUCE 0..B−1 then REDUCE_WAIT 0..B−1 just before OPTIMIZER_STEP.
 * buckets >= 1. The _per_stage form takes buckets[stage] >= 0; 0 leaves a stage without
 * reductions (it has no parameters). On error the schedule is unchanged. */
int schedule_add_reductions(schedule *s, int buckets, int overlap);
int schedule_add_reductions_per_stage(schedule *s, const int *buckets, int overlap);

const char *schedule_op_name(schedule_op_kind kind); /* "F", "B", "send_act", ... */

/* What the verifier found. peak_inflight[s]: the most micro-batches whose activations
 * stage s holds at once (forwarded, not yet backwarded). Arrays owned, freed by
 * schedule_report_free. */
typedef struct {
    int stages;
    int *peak_inflight;
} schedule_report;

/* Checks, returning −1 with a message naming stage, instruction index and reason:
 * - every micro-batch is forwarded exactly once and backwarded exactly once per stage
 *   (whole, or in parts 0..B−1 in this order), forward before backward, and the list ends
 *   with one OPTIMIZER_STEP;
 * - on stage s > 0, RECV_ACT m precedes FORWARD m; on s < K−1, FORWARD m precedes SEND_ACT m,
 *   RECV_GRAD m precedes BACKWARD m; BACKWARD m precedes SEND_GRAD m on s > 0;
 * - each send has exactly one matching receive on the peer, with matching peers;
 * - on a stage with B = buckets > 0, every bucket b is reduced exactly once: one
 *   ALLREDUCE b after its last gradient contribution (every micro-batch's whole backward
 *   or its part b) and one REDUCE_WAIT b after it and before OPTIMIZER_STEP; a stage with
 *   B = 0 has no reductions and no split backward;
 * - the whole schedule cannot deadlock, assuming sends complete without waiting for
 *   the receiver (buffered/non-blocking) and receives block: simulated to completion.
 *   ALLREDUCE never blocks; REDUCE_WAIT b waits only for the other replicas of its stage
 *   to start bucket b, and they run this same list: it passes once the stage itself has.
 * report may be NULL. */
int schedule_verify(const schedule *s, schedule_report *report);

/* Checks the schedules that the R replicas of a pipeline will run (per_replica[r], all with
 * the same stages): each verifies on its own, and for every stage the replicas declare the
 * same number of buckets and start their reductions (ALLREDUCE) in the same bucket order:
 * MPI matches non-blocking collectives by the order they are started in, so a mismatch
 * reduces the wrong buckets together or hangs. Waits may come in any order and place; a
 * wait needs only the other replicas' start of its bucket. (Not checked: a deadlock that
 * lists differing between replicas could create only together; none is known, and a
 * random search over 1.8 million pairs of perturbed valid lists found none.) Messages
 * name replica, stage, op index and reason. */
int schedule_verify_replicas(const schedule *const *per_replica, int replicas);
void schedule_report_free(schedule_report *r);

/* Event-driven simulation. Each stage runs its list in order; a receive waits for the
 * matching send. Per-stage costs (seconds or units) of one forward and one backward of one
 * micro-batch; a backward part b costs its share of the stage's backward; each send takes
 * `comm_cost` on the sender and the optimizer step `step_cost`.
 *
 * Reductions run on a separate network resource per stage, concurrently with compute:
 * ALLREDUCE b takes no compute time, and bucket b's reduction starts then, or when the
 * stage's previous reduction finishes (a stage's reductions are serialised); REDUCE_WAIT b
 * holds compute until it has finished. A reduction of n bytes among R replicas costs a
 * ring all-reduce in the α–β model: 2(R−1)·α + 2(R−1)/R · n/β. */
typedef struct {
    const double *fwd, *bwd; /* per stage; NULL: 1 each */
    double comm_cost, step_cost;
    int replicas;            /* R; 0 or 1: one replica, reductions are free */
    double alpha;            /* latency per ring step, >= 0 */
    double beta;             /* bandwidth in bytes per unit time, > 0 (INFINITY allowed) */
    const double *alpha_stage, *beta_stage; /* per stage, replacing alpha and beta where
                                             * not NULL (e.g. measured on each group) */
    const double *const *bucket_bytes; /* [stage][b], b < buckets; NULL or a NULL row: 0 */
    const double *const *part_share;   /* [stage][b]: share of bwd[stage] that part b
                                        * costs, >= 0, summing to 1 per stage; NULL or a
                                        * NULL row: 1/B each */
} schedule_costs;

/* Fills, per stage, busy time and the reductions' figures, and the step's makespan. */
typedef struct {
    double makespan;
    double *busy;         /* per stage: compute time (waits excluded), owned */
    double bubble;        /* mean over stages of idle / makespan */
    double *start, *end;  /* per stage × op, index lists[s] offset; owned */
    int *offset;          /* offset[s]: index of stage s's first op in start/end */
    double *reduce;       /* per stage: time its reductions occupy its network, owned */
    double *exposed;      /* per stage: time compute waited in REDUCE_WAIT, owned */
    double *net_start, *net_end; /* per op like start/end: for an ALLREDUCE, when its
                                  * reduction ran on the network; −1 for other ops */
} schedule_sim;
int schedule_simulate_costs(const schedule *s, const schedule_costs *costs,
                            schedule_sim *out);
/* The same with no replicas (reductions free); fwd/bwd may be NULL for unit costs. */
int schedule_simulate(const schedule *s, const double *fwd, const double *bwd,
                      double comm_cost, double step_cost, schedule_sim *out);
void schedule_sim_free(schedule_sim *sim);

/* The α–β cost of a ring all-reduce of `bytes` among `replicas` (0 for one replica). */
double schedule_allreduce_time(double bytes, int replicas, double alpha, double beta);

/* Bubble fraction of the unit-cost simulation (F = B = 1, messages free) and the GPipe
 * formula (K−1)/(M+K−1). */
double schedule_bubble_theory(int stages, int microbatches);

/* Prints each stage's instruction list, then a text timeline (one row per stage, one
 * column per unit slot: "F3" forward of micro-batch 3, "B3" backward, "W" waiting for a
 * reduction, "." idle; below a stage with buckets, a row of its network: "A0" or "A0-2",
 * the buckets being reduced) and the bubble fraction. Unit costs: F = B = R = 1 slot, a
 * stage's whole reduction 1 slot (1/B per bucket), messages and the step free. */
void schedule_print(const schedule *s, FILE *out);

#endif
