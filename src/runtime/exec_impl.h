/* The executor's private header: only src/runtime/exec*.c include it. struct exec and what
 * its files share: exec.c (setup and the training step), exec_msg.c (point-to-point
 * messages and the polite waits), exec_eval.c (evaluation), exec_gather.c (parameters and
 * checkpoint state on stage 0) and exec_trace.c (trace events and the trace writer). */
#ifndef PT_EXEC_IMPL_H
#define PT_EXEC_IMPL_H

#include <mpi.h>
#include <stddef.h>

#include "src/runtime/exec.h"
#include "src/runtime/replicas.h"
#include "src/runtime/trace.h"

/* Message tags name the micro-batch and the direction. They wrap below 32767, the least
 * MPI_TAG_UB the standard allows: two messages with one tag between one pair of ranks are
 * matched in the order they were sent, and both sides go through micro-batches in order. */
enum { TAG_ACT = 0, TAG_GRAD = 1, TAG_EVAL = 2, TAG_CLOCK = 3, TAG_WRAP = 8192 };
enum { EVAL_BUFFERS = 3 }; /* micro-batch buffers evaluation cycles through */
static inline int tag_of(int kind, int m) { return (m % TAG_WRAP) * 4 + kind; }
/* With V model chunks per rank (interleaved schedules), a message also names the chunk that
 * receives it: between two ranks, each direction carries one chunk's messages per (m, v). */
static inline int chunk_tag(int kind, int m, int v, int V) { return tag_of(kind, m * V + v); }

/* An outgoing message waiting for its bytes (a GPU copy) before MPI_Isend. */
typedef struct {
    engine *eng;
    engine_msg kind;
    int m, count, peer, tag;
    MPI_Request *req;
} pending_send;

struct exec {
    MPI_Comm comm;   /* this replica's pipeline: rank = stage */
    int rank, size;
    MPI_Comm world;  /* every rank of the job */
    int world_rank, world_size;
    int replica, replicas;
    replicas_t *rep; /* the first chunk's reductions among its replicas (NULL: none) */
    replicas_t **reps; /* [V]: each chunk's (reps[0] = rep; NULL where a chunk has none) */
    int *rep_base;   /* [V + 1]: chunk v's buckets are the list's rep_base[v] .. [v+1] − 1 */
    replicas_calibration rep_cal; /* their α–β figures, measured by exec_start */
    int *pipe_world; /* [size]: the world rank of each stage of this pipeline */
    char host[64];
    const net_desc *net;
    const schedule *sched;
    exec_config cfg;
    int mb; /* micro-batch size */
    size_t in_count, out_count;
    engine *eng;     /* engs[0] */
    /* Interleaved schedules: this rank holds V model chunks, chunk v being model chunk
     * v·K + rank of the partition's K·V (V = 1 otherwise). */
    int V;
    engine **engs;         /* [V] */
    size_t *chunk_params;  /* [K·V]: parameters of each model chunk, in model order */
    size_t held_bytes, peak_bytes; /* activation bytes the rank's slots hold (peak) */
    double *chunk_s;       /* [V · EXEC_TIMES]: compute time per chunk and kind of op */
    MPI_Request *req_act, *req_grad, *req_send_act, *req_send_grad; /* [V·M], v·M + m */
    MPI_Request eval_send, eval_recv[EVAL_BUFFERS];
    /* the step's receives, each posted once its buffer is free (exec_plan_receives): the
     * RECV ops at recv_ops[recv_at[0] .. recv_at[1]) at the step's start, those at
     * [recv_at[i + 1] .. recv_at[i + 2]) right after op i */
    int *recv_at, *recv_ops;
    /* [V] each chunk's gradient send buffers (schedule_send_buffers; M on a GPU): m's
     * backward first waits for the send of m − send_n[v] from its buffer */
    int *send_n;
    /* sends whose buffers are not filled yet, posted in order as they become ready */
    pending_send *pending;
    int n_pending, pending_cap;
    /* Steps alternate between two halves of the engine's micro-batch buffers, so that the
     * next step's samples can be loaded (copied to a GPU) while this step computes. */
    int half, prefetched;
    /* statistics */
    double t_origin;     /* where this rank's trace times count from, on its trace clock */
    trace_clock clock;   /* its trace clock against rank 0's */
    long trace_step;     /* the step being run, for the trace and its message ids */
    trace_skew skew;     /* testing: PIPETRAIN_DEBUG_CLOCK_SKEW */
    double compute_s, wall_s, forward_s, backward_s, optimizer_s;
    double tensor_s0;      /* the engines' tensor_s at the last exec_reset_stats */
    long steps, rollbacks; /* rollbacks: steps post-validation took again (clipped) */
    int inflight, peak_inflight;
    trace_log trace;
    struct exec_finish *fin; /* the step's gradient finish (exec_finish.c) */
    struct exec_postval *pv; /* post-validation's copies (exec_postval.c; NULL: none yet) */
};

/* Chunk routing of schedules with several chunks per rank, under the schedule's placement
 * (schedule/schedule.h): the chunk of the peer rank that receives what chunk v sends
 * forward or backward (in a V, the peer may be this rank: an MPI message to itself). */
static inline int act_receiver_chunk(const exec_t *e, int v)
{
    int nc = v;
    schedule_route_next(e->sched, e->rank, v, NULL, &nc);
    return nc;
}
static inline int grad_receiver_chunk(const exec_t *e, int v)
{
    int pc = v;
    schedule_route_prev(e->sched, e->rank, v, NULL, &pc);
    return pc;
}

/* Every rank of a tensor group computes the same loss: tensor rank 0 counts it. */
static inline void exec_counted_once(const exec_t *e, engine_result *r)
{
    if (e->cfg.tensor_rank == 0) return;
    r->loss_sum = 0;
    r->correct = 0;
}

/* exec_finish.c: the step's gradients between the replicas' reduction and the update. */
/* Collective over the world (exec_start): the tied head's runs and communicator, and what
 * this rank's part of the gradient norm counts. */
int exec_finish_start(exec_t *e);
void exec_finish_free(exec_t *e);
/* Before the optimizer step, collective as the step's settings say (every rank the same):
 * a tied head's two gradients summed into both, then with opt->clip_norm > 0 the whole
 * model's gradient scaled to at most that norm. */
int exec_finish_grads(exec_t *e, const optimizer_config *opt);
/* The last step's gradient norm before clipping; NAN when it was not computed. */
double exec_finish_norm(const exec_t *e);
/* Post-validation (exec_postval.c): exec_finish_grads with the norm's all-gather started,
 * not waited for, whether or not opt clips; then, after the optimistic step, the wait:
 * *scale is what the step should have scaled the gradients by (1: the step stands; below
 * 1: clipping; NAN: a non-finite norm); exec_finish_scale scales the (restored) gradients. */
int exec_finish_grads_post(exec_t *e);
int exec_finish_validate(exec_t *e, const optimizer_config *opt, float *scale);
int exec_finish_scale(exec_t *e, float scale);

/* Each chunk's optimizer step (through its replicas' reductions in hybrid mode). */
int exec_step_engines(exec_t *e, const optimizer_config *opt, int tick);

/* exec_postval.c: optimizer post-validation (--post-validation). Collective as the
 * decision is (every rank the same). */
int exec_postval_step(exec_t *e, const optimizer_config *opt, int tick);
/* In finish_step: the wait for the norm, and the rollback and the step again where it must
 * (EXEC_FAILED_EVERYWHERE, the step rolled back, for a non-finite norm). */
int exec_postval_settle(exec_t *e, const optimizer_config *opt, uint64_t step);
void exec_postval_free(exec_t *e);

/* exec_msg.c. Every wait is polite and gives up after --timeout with a message that names
 * what it waited for. */
/* Moves the replicas' reductions of every chunk on. */
int exec_progress_reductions(exec_t *e);
/* Waits for *req (a receive, or a send already posted); MPI_REQUEST_NULL is done. */
int exec_wait_request(exec_t *e, MPI_Request *req, const char *what, int m, int peer);
/* Where each receive of the step is posted, and each chunk's receive buffers (n_recv[2V]:
 * chunk v's of activations at 2v, of gradients at 2v + 1; 0: one per micro-batch): on the
 * CPU engine a receive is posted once its buffer is free (schedule_receive_buffers, with
 * what the chunk's W reads); on a GPU all at the step's start. */
int exec_plan_receives(exec_t *e, const partition *part, int *n_recv);
/* Each chunk's gradient send buffers (e->send_n): on the CPU engine as few as
 * schedule_send_buffers proves free in time; on a GPU one per micro-batch. */
int exec_plan_sends(exec_t *e);
/* Before chunk v's backward of m writes its gradient to send: the send of m − send_n[v]
 * from the same buffer is over (it is by then: schedule_send_buffers; the wait makes
 * sure). */
int exec_wait_send_buffer(exec_t *e, int v, int m);
/* Posts the receives of slot 0 (the step's start) or i + 1 (after op i), into the buffers
 * from `base`. */
int exec_post_receives(exec_t *e, int base, int slot);
/* MPI_Irecv into the engine's buffer for message `kind` of buffer b (NULL: the engine
 * failed, its message is set). */
int exec_post_recv(exec_t *e, engine *g, engine_msg kind, int b, int count, int peer, int tag,
                   MPI_Request *req);
/* Starts the send of outgoing message `kind` of m: the engine fills its buffer, MPI_Isend
 * follows as soon as it is full (into *req). */
int exec_start_send(exec_t *e, engine *g, engine_msg kind, int m, int count, int peer, int tag,
                    MPI_Request *req);
/* Waits until the send into *req has been posted and has completed. */
int exec_wait_send(exec_t *e, MPI_Request *req, const char *what, int m, int peer);
/* Before REDUCE_WAIT: the sends waiting for their bytes (a GPU copy) are posted first, so
 * that the neighbours are not kept waiting while this rank waits for its replicas. */
int exec_flush_sends(exec_t *e);

/* exec_trace.c. Every exec_record* is a no-op without --trace. */
/* Collective over the world (exec_start, with --trace): the testing clock skew, this
 * rank's clock against world rank 0's and the origin of its trace times. */
int exec_start_trace(exec_t *e);
/* An event of chunk v between pt_now() times t0 and t1; a send or receive (peer ≥ 0) also
 * gets the id of its message, which the other end computes alike: keyed by the chunk that
 * receives it (recv_v), since one micro-batch may cross between two ranks once per chunk. */
void exec_record_message(exec_t *e, trace_kind kind, double t0, double t1, int m, int v,
                         int peer, int recv_v);
/* An event that is not a message (m < 0: of no micro-batch). */
void exec_record(exec_t *e, trace_kind kind, double t0, double t1, int m, int v);
/* A tensor collective that began at t0 and just ended. */
void exec_record_tensor(exec_t *e, double t0, size_t bytes);
/* The trace's slice of each bucket reduction of the step that just ended. */
void exec_record_reductions(exec_t *e);

#endif
