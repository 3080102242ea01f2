/* Schedules as data: for each pipeline stage, the ordered list of instructions it runs in
 * one optimizer step. The executor runs these lists, the simulator prices them and the
 * printer draws them; a new schedule is a new generator, not a new executor.
 *
 * Stage s receives activations from s−1 and gradients from s+1. Stage 0 reads its input
 * from the data set; the last stage computes the loss, so it has no RECV_GRAD/SEND_ACT.
 */
#ifndef PT_SCHEDULE_H
#define PT_SCHEDULE_H

#include <stdio.h>

typedef enum {
    SCHED_OP_RECV_ACT = 0,  /* wait for micro-batch m's input activation from stage s−1 */
    SCHED_OP_FORWARD,       /* forward micro-batch m (last stage: also loss and its gradient) */
    SCHED_OP_SEND_ACT,      /* send micro-batch m's output activation to stage s+1 */
    SCHED_OP_RECV_GRAD,     /* wait for the gradient of m's output from stage s+1 */
    SCHED_OP_BACKWARD,      /* backward micro-batch m, accumulate parameter gradients */
    SCHED_OP_SEND_GRAD,     /* send the gradient of m's input to stage s−1 */
    SCHED_OP_ALLREDUCE,     /* average gradients inside the stage's data-parallel group */
    SCHED_OP_RECOMPUTE,     /* re-run m's forward to rebuild dropped activations */
    SCHED_OP_OPTIMIZER_STEP,
    SCHED_OP_COUNT
} schedule_op_kind;

typedef struct {
    schedule_op_kind kind;
    int microbatch; /* −1 for ALLREDUCE and OPTIMIZER_STEP */
    int peer;       /* stage sent to or received from; −1 when none */
} schedule_op;

typedef struct {
    int n_ops, cap;
    schedule_op *ops; /* owned */
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
int schedule_append(schedule *s, int stage, schedule_op_kind kind, int microbatch, int peer);
void schedule_free(schedule *s);

const char *schedule_op_name(schedule_op_kind kind); /* "F", "B", "send_act", ... */

/* What the verifier found. peak_inflight[s]: the most micro-batches whose activations
 * stage s holds at once (forwarded, not yet backwarded). Arrays owned, freed by
 * schedule_report_free. */
typedef struct {
    int stages;
    int *peak_inflight;
} schedule_report;

/* Checks, returning −1 with a message naming stage, instruction index and reason:
 * - every micro-batch is forwarded exactly once and backwarded exactly once per stage,
 *   forward before backward, and the list ends with one OPTIMIZER_STEP;
 * - on stage s > 0, RECV_ACT m precedes FORWARD m; on s < K−1, FORWARD m precedes SEND_ACT m,
 *   RECV_GRAD m precedes BACKWARD m; BACKWARD m precedes SEND_GRAD m on s > 0;
 * - each send has exactly one matching receive on the peer, with matching peers;
 * - the whole schedule cannot deadlock, assuming sends complete without waiting for
 *   the receiver (buffered/non-blocking) and receives block: simulated to completion.
 * report may be NULL. */
int schedule_verify(const schedule *s, schedule_report *report);
void schedule_report_free(schedule_report *r);

/* Event-driven simulation with per-stage costs (seconds or units) for one forward and one
 * backward of one micro-batch and a per-message latency; communication ops take
 * `comm_cost` and the optimizer step `step_cost`. Fills, per stage, busy time and the
 * step's makespan. fwd/bwd may be NULL for unit costs (1 and 1). */
typedef struct {
    double makespan;
    double *busy;         /* per stage, owned */
    double bubble;        /* mean over stages of idle / makespan */
    double *start, *end;  /* per stage × op, index lists[s] offset; owned */
    int *offset;          /* offset[s]: index of stage s's first op in start/end */
} schedule_sim;
int schedule_simulate(const schedule *s, const double *fwd, const double *bwd,
                      double comm_cost, double step_cost, schedule_sim *out);
void schedule_sim_free(schedule_sim *sim);

/* Bubble fraction of the unit-cost simulation (F = B = 1, messages free) and the GPipe
 * formula (K−1)/(M+K−1). */
double schedule_bubble_theory(int stages, int microbatches);

/* Prints each stage's instruction list, then a text timeline (one row per stage, one
 * column per unit slot: "F3" forward of micro-batch 3, "B3" backward, "." idle) and the
 * bubble fraction. */
void schedule_print(const schedule *s, FILE *out);

#endif
