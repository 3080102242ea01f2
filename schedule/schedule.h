/* Schedules as data: for each pipeline stage, the ordered list of instructions it runs in
 * one optimizer step. The executor runs these lists, the simulator prices them and the
 * printer draws them; a new schedule is a new generator, not a new executor.
 *
 * Stage s receives activations from s−1 and gradients from s+1. Stage 0 reads its input
 * from the data set; the last stage computes the loss, so it has no RECV_GRAD/SEND_ACT.
 *
 * Reductions (hybrid mode: R replicas of the pipeline, each stage's gradients summed among
 * its R replicas; each replica's are already scaled by 1/(global batch), so the sum is
 * never divided: src/reduce/reduce.h). A stage's parameters are cut into B buckets in
 * reverse layer order: bucket 0 holds the stage's last layers, whose gradients are final
 * first in the backward pass; buckets hold whole layers. ALLREDUCE b starts the
 * non-blocking reduction of bucket b, REDUCE_WAIT b waits until it has completed. So that
 * reductions can overlap the backward pass, a micro-batch's backward may be split into B
 * parts: BACKWARD with bucket b runs the backward through the layers of bucket b only
 * (layers without parameters belong to a part too; the executor decides which). The parts
 * of one micro-batch run in order 0..B−1 and together are its backward: the gradient of the
 * input (SEND_GRAD) is ready after part B−1. Every replica of a stage runs the same list,
 * so the collectives of a stage's group are issued in the same order everywhere (see
 * schedule_verify_replicas for lists that differ).
 *
 * Virtual stages (interleaved schedules): the model is cut into K·V chunks and rank
 * (stage) s holds V of them; op.chunk = v in [0, V) names which, and rank s, chunk v runs
 * model chunk c = v·K + s. Activations go from (s, v) to (s+1, v), and from (K−1, v) to
 * (0, v+1); gradients the reverse way (schedule_next_chunk / schedule_prev_chunk). Model
 * chunk 0 reads the data, model chunk K·V−1 computes the loss. `peer` is always a rank. A
 * message is identified by (direction, micro-batch, receiving model chunk). V = 1 and
 * chunk 0 everywhere is the plain pipeline above.
 *
 * Zero bubble: a micro-batch's backward on a (stage, chunk) is either BACKWARD (whole or in
 * bucket parts) or BACKWARD_INPUT (the gradient of its input only: SEND_GRAD may follow)
 * and later BACKWARD_WEIGHT (its parameter gradients; whole, or in bucket parts like
 * BACKWARD). The ops that add parameter gradients (BACKWARD, BACKWARD_WEIGHT) run in
 * micro-batch order per (stage, chunk), and so do BACKWARD / BACKWARD_INPUT, so gradients
 * accumulate in the order of sequential training.
 *
 * Recomputation: a list with `recompute` set keeps only each micro-batch's input after its
 * FORWARD and runs RECOMPUTE m (once per micro-batch and chunk) between FORWARD m and m's
 * first backward op to rebuild the activations.
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
    SCHED_OP_BACKWARD_INPUT,  /* "B" of zero bubble: gradient of m's input only; SEND_GRAD
                               * of m may follow it */
    SCHED_OP_BACKWARD_WEIGHT, /* "W": m's parameter gradients (or part b), after its
                               * BACKWARD_INPUT */
    SCHED_OP_COUNT
} schedule_op_kind;

typedef struct {
    schedule_op_kind kind;
    int microbatch; /* −1 for ALLREDUCE, REDUCE_WAIT and OPTIMIZER_STEP */
    int peer;       /* stage sent to or received from; −1 when none */
    int bucket;     /* ALLREDUCE, REDUCE_WAIT: bucket b in [0, buckets); BACKWARD and
                     * BACKWARD_WEIGHT: −1 for the whole stage, b for part b only; −1 for
                     * every other op */
    int chunk;      /* virtual chunk v in [0, V) of this rank (model chunk v·K + s, or as the
                     * schedule's placement says: schedule_model_chunk); 0 for
                     * reductions, the step and every schedule with V = 1 */
} schedule_op;

typedef struct {
    int n_ops, cap;
    schedule_op *ops; /* owned */
    int buckets;      /* B, buckets this stage reduces among its replicas; 0: none (no
                       * replicas, or a stage without parameters) */
    int recompute;    /* 1: this stage keeps only inputs after FORWARD and runs RECOMPUTE m
                       * once per micro-batch and chunk before m's backward; 0 by default */
} schedule_list;

/* Where model chunk c of the K·V runs (see the top of this file).
 * INTERLEAVED: rank s, chunk v runs model chunk v·K + s (Megatron-LM's interleaving).
 * V (a zig-zag; V even): chunk v runs model chunk v·K + s for even v and v·K + K−1−s for odd
 * v, so that with V = 2 rank k holds model chunks k and 2K−1−k (Zero Bubble's ZB-V,
 * DualPipeV). Activations go down the ranks on even chunks and back up on odd ones; the
 * hand-over from chunk v to v+1 stays on one rank (rank K−1 after an even chunk, rank 0
 * after an odd one): a message to itself, which the verifier, the simulator (free) and the
 * executor (an MPI message to its own rank, a copy) treat like any other. Rank 0 reads the
 * data and computes the loss. */
typedef enum { SCHED_PLACE_INTERLEAVED = 0, SCHED_PLACE_V = 1 } schedule_placement;

typedef struct {
    char name[32];
    int stages, microbatches;
    int virtual_stages;   /* V >= 1 chunks per rank */
    int placement;        /* schedule_placement; INTERLEAVED (0) unless a V generator set it */
    schedule_list *lists; /* owned, one per stage */
    char origin[64];      /* what a search ("search") chose: a hand-written schedule's name
                           * ("zb-v") or the greedy order's ("greedy-v p3 cap 6": placement,
                           * policy flags, per-rank cap in chunk activations); "" otherwise */
} schedule;

/* The model chunk that (stage, chunk) runs under `placement`, and the inverse. */
int schedule_model_chunk_of(int stages, int virtual_stages, int placement, int stage,
                            int chunk);
void schedule_chunk_place(int stages, int virtual_stages, int placement, int model_chunk,
                          int *stage, int *chunk);
/* The same for a schedule's own K, V and placement. */
int schedule_model_chunk(const schedule *s, int stage, int chunk);
/* Chunk routing under the schedule's placement: as schedule_next_chunk / _prev_chunk
 * below (which are the interleaved placement's); the peer may be the stage itself. */
int schedule_route_next(const schedule *s, int stage, int chunk, int *next_stage,
                        int *next_chunk);
int schedule_route_prev(const schedule *s, int stage, int chunk, int *prev_stage,
                        int *prev_chunk);

/* Generators. Every stage's list ends with OPTIMIZER_STEP. Backwards run in micro-batch
 * order 0..M−1 on every stage, so gradients accumulate in the same order as sequential
 * training with the same micro-batching. Return −1 with a message for stages < 1 or
 * microbatches < 1. */
int schedule_init_gpipe(schedule *s, int stages, int microbatches);
int schedule_init_1f1b(schedule *s, int stages, int microbatches);
/* Megatron-LM's interleaved 1F1B over V chunks per rank: micro-batches go through the
 * chunks in groups of K, with a warm-up of 2(K−1−s) + (V−1)·K forwards on rank s, then one
 * forward and one backward in turn, then the cool-down. V > 1 needs K >= 2 (a rank does not
 * send to itself) and M a multiple of K (as Megatron-LM: a smaller last group deadlocks
 * that warm-up); with unit costs (1/V per chunk op) the idle time is then (K−1)/(V·M) of the
 * ideal time, (K−1)/(V·M+K−1) of the step. V = 1 gives 1F1B's lists, for any M. Named
 * "interleaved". */
int schedule_init_interleaved(schedule *s, int stages, int virtual_stages, int microbatches);
/* Zero Bubble H1 (Qi et al. 2023): backward split into BACKWARD_INPUT (b) and
 * BACKWARD_WEIGHT (w). Each stage runs 1F1B's order of F and b, and stage s delays each w
 * by s micro-batches so that the w's fill the bubbles of the cool-down. Every stage holds at
 * most min(K, M) micro-batches (FORWARD to w): 1F1B's peak (its stage 0), but more than
 * 1F1B holds on its later stages, which no schedule with this bubble can avoid (the last
 * stage must run ~K forwards and b's ahead of its w's). Unit costs F = b = w = 1: makespan
 * 3M + K − 1 for M >= K, idle (K−1)/(3M) of the ideal 3M, (K−1)/(3M+K−1) of the step; for
 * M < K the makespan is 2M + 2K − 1 (the least possible: the last micro-batch's F and b
 * cross every stage), idle (2K − M − 1)/(2M + 2K − 1) of the step. Any M >= 1. Named "zb-h1". */
int schedule_init_zb_h1(schedule *s, int stages, int microbatches);
/* The same with any per-stage memory cap max_inflight[s] >= min(K−s, M) (1F1B's own):
 * stage s delays its w's by max_inflight[s] − min(K−s, M) micro-batches. zb-h1 is cap
 * min(K, M) everywhere; 1F1B's caps keep every stage's memory at 1F1B's, and the idle time
 * is then 2(K−1)/(3M) of the ideal, 2(K−1)/(3M+2K−2) of the step, for M >= K (only the b on the critical path is shorter than 1F1B's
 * backward). Named "zb". */
int schedule_init_zb(schedule *s, int stages, int microbatches, const int *max_inflight);
/* Greedy list scheduling of split backwards (generate_v.c): the rank with the earliest
 * clock runs, of what it can run now, a b of the chunk nearest the loss, else a forward of
 * the chunk nearest the loss that its cap allows, else its oldest pending w; with nothing
 * to run it waits for its first message. Costs per model chunk (NULL: 1 each); cap[s]:
 * most chunk activations (FORWARD to its w) rank s holds, >= V (NULL: no limit). */
enum {
    SCHED_GREEDY_F_LOW = 1,  /* policy: forwards of the chunk nearest the input first */
    SCHED_GREEDY_B_LOW = 2,  /* b's of the chunk nearest the input first */
    SCHED_GREEDY_LAZY_F = 4, /* a pending w before a micro-batch new to the rank */
    SCHED_GREEDY_POLICIES = 8
};
typedef struct {
    const double *fwd, *bwd_input, *bwd_weight;
    double comm;    /* per message between two ranks (a rank's own hand-over is free) */
    const int *cap;
    int policy;     /* SCHED_GREEDY_* flags; 0: the rules above */
} schedule_greedy_config;
int schedule_init_greedy(schedule *s, const char *name, int stages, int virtual_stages,
                         int placement, int microbatches, const schedule_greedy_config *cfg);
/* The greedy order under every policy; keeps the one whose simulated step (at cfg's costs)
 * is shortest, then whose stages idle least within their spans. */
int schedule_init_greedy_best(schedule *s, const char *name, int stages, int virtual_stages,
                              int placement, int microbatches,
                              const schedule_greedy_config *cfg);
/* The named greedy schedules at unit costs. "zb-h2" (Zero Bubble H2): one chunk per rank,
 * each rank holding up to 2K − 1 micro-batches; with F = b = w no rank idles between its
 * first op and its step once M >= 2K − 1 (interior_idle 0: Qi et al.'s bubble of 0; the
 * step still spans 3M + K − 1 because the ranks start one after another, which
 * post-validation would overlap with the next step). "zb-v": V placement, V (even) chunks
 * per rank, each rank capped at 1F1B's peak (2K chunk activations at V = 2, K whole
 * micro-batches). "v-half" and "v-min": the same under about ½ and ⅓ of that (K + 1 and
 * ⌈2K/3⌉ + 1 chunk activations). Any M >= 1. */
int schedule_init_zb_v_family(schedule *s, const char *name, int stages, int virtual_stages,
                              int microbatches);
/* DualPipeV (DeepSeek): V placement, 2 chunks per rank, M >= 2K; its eight phases, with
 * whole backwards where DualPipe runs them whole and b/w where it defers W. DualPipe's
 * overlapped "F&B" is a forward and a whole backward of two micro-batches run back to back,
 * the forward's activation sent before the backward computes (so it travels meanwhile);
 * the two computations are not overlapped. Named "dualpipev". */
int schedule_init_dualpipev(schedule *s, int stages, int microbatches);
/* 1 for the names of schedules in a V (zb-v, v-half, v-min, dualpipev). */
int schedule_is_v(const char *name);
/* 1 for the names of schedules that split backwards into B and W (zb-h1, zb-h2, the V
 * schedules, search): their costs are priced with the split. */
int schedule_splits_backward(const char *name);

/* Schedule search (schedule/search.c): the order of least simulated step at the stages'
 * own costs within a memory limit. Candidates: every hand-written schedule with V chunks
 * per rank (V = 1: gpipe, 1f1b, zb-h1, zb-h2; V > 1: interleaved, and for an even V zb-v,
 * v-half, v-min, dualpipev (V = 2)), then the greedy scheduler at these costs over its
 * policies, both placements (V even) and a ladder of memory caps (uniform, and shaped as
 * 1F1B's (K − k)·V), at most max_runs greedy orders. Each is verified and kept only if
 * every rank holds at most `memory` micro-batches (the verifier's peak chunk activations
 * / V); the shortest simulated step wins (a tie: the earlier, hand-written first, or the
 * one holding less). So the result is never slower, at these costs, than any hand-written
 * schedule within the same limit. Named "search", origin set. −1 with a message when no
 * order keeps to the limit (naming the smallest) or the costs are not finite and > 0. */
typedef struct {
    int stages, microbatches;
    int virtual_stages;   /* V >= 1 chunks per rank (the partition's K·V model chunks) */
    const double *fwd, *bwd_input, *bwd_weight; /* per model chunk, K·V in model order
                                                 * (seconds or units); NULL: 1/V each */
    const double *bwd;    /* a whole backward per model chunk (a profile's fused one may
                           * differ from B + W); NULL: bwd_input + bwd_weight */
    double comm;          /* one message between two ranks (a rank's own hand-over: free) */
    double memory;        /* most micro-batches a rank may hold; 0: no limit */
    int max_runs;         /* greedy orders tried at most; 0: 128 */
    const int *recompute; /* K flags (NULL: none): every candidate gets schedule_add_recompute
                           * on these ranks before it is verified and priced (RECOMPUTE
                           * costs a forward), so the result has it too */
} schedule_search_config;
typedef struct {
    char how[64];              /* the winner, as schedule.origin */
    double step, peak;         /* its simulated step, and the most micro-batches it holds */
    double best_named;         /* the fastest hand-written schedule within the limit
                                * (INFINITY: none keeps to it) */
    char best_named_name[32];
    int tried, kept;           /* candidates verified, and those within the limit */
} schedule_search_result;
int schedule_search(schedule *s, const schedule_search_config *cfg,
                    schedule_search_result *res);

/* name: "gpipe" or "1f1b"; an unknown name is an error listing the known ones. V = 1. */
int schedule_init_by_name(schedule *s, const char *name, int stages, int microbatches);
/* name: "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min",
 * "dualpipev" or "search" (schedule_search at unit costs, no memory limit, V as given);
 * virtual_stages > 1 only with "interleaved", "search" and the V schedules (even there;
 * 1 means their default, 2). Errors name the known schedules. */
int schedule_init_named(schedule *s, const char *name, int stages, int virtual_stages,
                        int microbatches);
/* Empty schedule (V = 1), for building lists by hand (tests, future generators). */
int schedule_init_empty(schedule *s, const char *name, int stages, int microbatches);
/* Where the activations of (stage, chunk) go: returns 1 and sets *next_stage and *next_chunk,
 * or 0 for the last model chunk (it computes the loss). Gradients come back from there. */
int schedule_next_chunk(int stages, int virtual_stages, int stage, int chunk,
                        int *next_stage, int *next_chunk);
/* Where the activations of (stage, chunk) come from: 1 and the previous (stage, chunk), or 0
 * for model chunk 0 (it reads the data). Gradients go back there. */
int schedule_prev_chunk(int stages, int virtual_stages, int stage, int chunk,
                        int *prev_stage, int *prev_chunk);
/* Appends an op with bucket −1 and chunk 0; schedule_append_op appends any op as given. */
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
/* (Zero bubble lists: the last op adding parameter gradients is a BACKWARD_WEIGHT; with
 * overlap it is the one split, with ALLREDUCE b right after part b. Schedules with V > 1
 * take schedule_add_reductions_chunks.) */
/* The same for any V: buckets[s·V + v] per stage and chunk (V = 1: _per_stage). With
 * V > 1 a rank's buckets are numbered chunk by chunk (chunk v's follow chunk v−1's), its
 * reduction ops name their bucket's chunk, and backwards stay whole: with overlap, chunk
 * v's buckets start right after its last gradient op (and that op's SEND_GRAD), else at
 * the step; every wait comes just before the step. */
int schedule_add_reductions_chunks(schedule *s, const int *buckets, int overlap);

/* Recomputation on the stages with stages[s] != 0 (K flags): RECOMPUTE m of every chunk
 * just before m's first backward op, and before the RECV_GRAD that precedes it so that it
 * can run while the gradient is on its way; sets those lists' `recompute`. Works before or
 * after schedule_add_reductions. Error on a schedule that has recomputation already; on
 * error the schedule is unchanged. */
int schedule_add_recompute(schedule *s, const int *stages);
/* Parses "none", "all" or a comma list of stage numbers ("0,2") into K flags. */
int schedule_parse_recompute(const char *spec, int stages, int *flags);

const char *schedule_op_name(schedule_op_kind kind); /* "F", "B", "send_act", ... */

/* What W reads of a chunk's received buffers (schedule_receive_buffers' w_reads; the
 * values layer_stage_w_reads in src/model/layer_table.h returns). */
enum { SCHED_W_READS_ACT = 1, SCHED_W_READS_GRAD = 2 };
/* The least activation receive buffers of a chunk: the executor's evaluation through one
 * chunk per rank cycles through 3 (the next input's receive posted before this forward);
 * through V > 1 chunks it receives each input just before the forward that reads it. */
static inline int schedule_least_receive_buffers(const schedule *s)
{
    return s->virtual_stages > 1 ? 1 : 3;
}
/* Receive buffers by liveness (schedule/buffers.c). Chunk `chunk` of `stage` receives
 * micro-batch m's activation into buffer m mod n[0] and its gradient into m mod n[1]; each
 * holds m from its receive (on the net's last chunk the gradient from m's forward, which
 * writes the loss gradient there) to m's last op that reads it: F, R and B read the
 * activation (the stage's input), B the gradient, and W each only where w_reads says (the
 * CPU stage's W reads its input unless its first layer is a whole block, its output
 * gradient where its last layer's W takes it where it came in: layer_w_reads_input,
 * layer_w_reads_dout). Each chunk runs F, B and W in micro-batch order (schedule_verify),
 * so n buffers of a kind suffice when, for every m ≥ n, m − n's last read precedes m's
 * receive: n[0] the smallest such n ≥ least, n[1] ≥ 1 (each at most M). post_after (2M
 * entries, may be NULL): [m] the op after which m's activation receive may be posted,
 * [M + m] its gradient's (−1: at the step's start). A message may arrive before it is
 * posted; its send completes once it is. 0, or −1 with a message. */
int schedule_receive_buffers(const schedule *s, int stage, int chunk, int least, int w_reads,
                             int *n, int *post_after);
/* Gradient send buffers by liveness (schedule/buffers.c): a chunk that sends gradients (to
 * another rank, or to its rank's chunk before it: a message too) writes micro-batch m's
 * into buffer m mod n in its first backward of m, and waits first for the send of m − n
 * from that buffer to complete. n_out[stage·V + chunk] (V = virtual stages): for each
 * chunk the smallest n ≥ least (at most M) for which that wait never waits: the receiving
 * chunk's RECV of m − n happens before (program order and messages) the sender's first
 * backward of m, so that receive, and with it the send, is over by then; no rank then
 * waits on a peer's progress that it did not wait on before (no deadlock, no stall).
 * least where the chunk sends no gradient. 0, or −1 with a message. */
int schedule_send_buffers(const schedule *s, int least, int *n_out);

/* Schedules as text (schedule/file.c): a header "schedule NAME stages K microbatches M
 * virtual V placement interleaved|v", "list S buckets B recompute 0|1" where not 0, then one
 * line "STAGE OP MICROBATCH CHUNK PEER BUCKET" per instruction ('#' comments). Reading
 * verifies; every error names the file's line (for the verifier's, the instruction's). */
int schedule_write(const schedule *s, FILE *out);
int schedule_read(schedule *s, const char *path);

/* What the verifier found. Arrays owned, freed by schedule_report_free. */
typedef struct {
    int stages;
    int virtual_stages;
    int *peak_inflight;       /* [s]: the most micro-batches whose activations rank s holds
                               * at once, summed over its chunks (as peak_inflight_chunk) */
    int *peak_inflight_chunk; /* [s·V + v]: most micro-batches (s, v) holds activations for
                               * at once: from FORWARD until its last backward op (W, or the
                               * whole/last-part BACKWARD); with recomputation from RECOMPUTE
                               * instead of FORWARD (the forward's own activations are
                               * dropped right after it, but count while it runs) */
    int *peak_inputs_chunk;   /* [s·V + v]: most micro-batches whose INPUT (s, v) keeps at
                               * once, FORWARD to last backward op (= peak_inflight_chunk
                               * without recomputation) */
    int *peak_inputs;         /* [s]: the same summed over the rank's chunks at each moment */
} schedule_report;

/* Checks, returning −1 with a message naming stage, instruction index and reason:
 * - every op's chunk is in [0, V) (0 for reductions and the step);
 * - every micro-batch is forwarded exactly once and backwarded exactly once per (stage,
 *   chunk): BACKWARD (whole, or in parts 0..B−1 in this order), or BACKWARD_INPUT then
 *   BACKWARD_WEIGHT (whole or in parts); forward before backward; BACKWARD/BACKWARD_INPUT
 *   and the gradient-adding ops (BACKWARD, BACKWARD_WEIGHT, per bucket) in micro-batch
 *   order; the list ends with one OPTIMIZER_STEP;
 * - RECV_ACT m precedes FORWARD m (except on model chunk 0), FORWARD m precedes SEND_ACT m
 *   and RECV_GRAD m precedes m's first backward op (except on the last model chunk), the
 *   op producing the input gradient (BACKWARD, its last part, BACKWARD_INPUT) precedes
 *   SEND_GRAD m; RECOMPUTE m lies between FORWARD m and m's first backward op, once per
 *   micro-batch and chunk on a list with `recompute` (at most once elsewhere);
 * - each send has exactly one matching receive on the peer (chunk routing above);
 * - on a stage with B = buckets > 0, every bucket b is reduced exactly once: one
 *   ALLREDUCE b after its last gradient contribution (every micro-batch's whole backward
 *   or BACKWARD_WEIGHT, or their part b) and one REDUCE_WAIT b after it and before OPTIMIZER_STEP; a stage with
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
 * holds compute until it has finished. With reduce_in_waits, the reductions a stage has
 * started run, in order, only from the REDUCE_WAIT that needs them. A reduction of n bytes among R replicas costs a
 * ring all-reduce in the α–β model: 2(R−1)·α + 2(R−1)/R · n/β. */
/* Costs are per stage when V = 1 and per model chunk c (K·V entries, in model order; c =
 * schedule_model_chunk(s, stage, v)) when V > 1.
 * NULL arrays mean unit costs: 1 per op for V = 1, and 1/V per chunk op for V > 1, so that a
 * rank's work is the same whatever V (F = B = 1 per rank and micro-batch). */
typedef struct {
    const double *fwd, *bwd; /* per stage or model chunk; NULL: unit */
    const double *bwd_input, *bwd_weight; /* BACKWARD_INPUT / BACKWARD_WEIGHT per stage or
                                           * model chunk; NULL: half of bwd each */
    const double *recompute; /* RECOMPUTE per stage or model chunk; NULL: = fwd */
    double comm_cost, step_cost;
    int replicas;            /* R; 0 or 1: one replica, reductions are free */
    double alpha;            /* latency per ring step, >= 0 */
    double beta;             /* bandwidth in bytes per unit time, > 0 (INFINITY allowed) */
    const double *alpha_stage, *beta_stage; /* per stage, replacing alpha and beta where
                                             * not NULL (e.g. measured on each group) */
    const double *const *bucket_bytes; /* [stage][b], b < buckets; NULL or a NULL row: 0 */
    const double *const *part_share;   /* [stage][b]: share of bwd[stage] (of the W cost
                                        * for BACKWARD_WEIGHT parts) that part b costs,
                                        * >= 0, summing to 1 per stage; NULL or a NULL
                                        * row: 1/B each */
    int reduce_in_waits;     /* reductions progress only while the stage waits for them
                              * (REDUCE_WAIT), not beside its compute: a CPU engine under
                              * an MPI library without a progress thread, whose cores both
                              * compute and move the data; 0: beside the compute */
} schedule_costs;

/* Fills, per stage, busy time and the reductions' figures, and the step's makespan. */
typedef struct {
    double makespan;
    double *busy;         /* per stage: compute time (waits excluded), owned */
    double bubble;        /* mean over stages of idle / makespan: the share of the step
                           * that is idle, what a trace shows; the one unit of every
                           * bubble pipetrain prints */
    double *start, *end;  /* per stage × op, index lists[s] offset; owned */
    int *offset;          /* offset[s]: index of stage s's first op in start/end */
    double *reduce;       /* per stage: time its reductions occupy its network, owned */
    double *exposed;      /* per stage: time compute waited in REDUCE_WAIT, owned */
    double *span;         /* per stage: from the start of its first compute op to the end
                           * of its last op, owned */
    double interior_idle; /* the most any stage idles within its span: the bubble as the
                           * Zero Bubble and DualPipe papers count it (a stage's ramp up
                           * before its first op and after its last is not counted: with
                           * post-validation the next step's fills it) */
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
/* zb-h2 (M >= 2K − 1): (K−1)/(3M+K−1), as zb-h1, but no stage idles inside its span (the
 * papers' bubble of 0; schedule_sim.interior_idle). dualpipev (M >= 2K) and zb-v (K = 4,
 * where its greedy order reaches it): (K−1)/(6M+K−1) with F = b = w = 1 per chunk op, the
 * least any V reaches (the last rank waits K − 1 forwards); elsewhere zb-v, v-half and v-min
 * have none (tests/test_schedule_v.c gives their figures).
 * The unit-cost bubble of a generated schedule for balanced stages, as a share of the step
 * (what schedule_sim.bubble gives): (K−1)/(M+K−1) for gpipe and 1f1b, (K−1)/(V·M+K−1) for
 * interleaved (K dividing M), (K−1)/(3M+K−1) for zb-h1 (F = B = W = 1; M >= K, else
 * (2K−M−1)/(2M+2K−1)). The published figures (K−1)/M, (K−1)/(V·M), (K−1)/(3M) are the
 * same idle time relative to the ideal (busy) time instead. *formula (may be NULL) gets the
 * text. −1 for a schedule without one (hand-built). */
double schedule_bubble_formula(const schedule *s, const char **formula);
/* The same from the schedule's name ("gpipe", "1f1b", "interleaved", "zb-h1"), K, V, M. */
double schedule_bubble_share(const char *name, int stages, int virtual_stages,
                             int microbatches, const char **formula);

/* Prints each stage's instruction list, then a text timeline (one row per stage, one
 * column per unit slot: "F3" forward of micro-batch 3, "B3" backward, "b3"/"w3" zero
 * bubble's input/weight gradient backward, "R3" recompute, "W" waiting for a reduction,
 * "." idle; ops of chunk v > 0 carry ".v": "F3.1"; below a stage with buckets, a row of
 * its network: "A0" or "A0-2", the buckets being reduced) and the bubble as the idle share
 * of the step, simulated and by the schedule's formula. Unit
 * costs: every F, B, b, w, R of any chunk = 1 slot, a stage's whole reduction 1 slot (1/B
 * per bucket), messages and the step free. */
void schedule_print(const schedule *s, FILE *out);

#endif
