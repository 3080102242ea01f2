#include "src/runtime/exec.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/runtime/engine_create.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "src/runtime/trace.h"

/* Message tags name the micro-batch and the direction. They wrap below 32767, the least
 * MPI_TAG_UB the standard allows: two messages with one tag between one pair of ranks are
 * matched in the order they were sent, and both sides go through micro-batches in order. */
enum { TAG_ACT = 0, TAG_GRAD = 1, TAG_EVAL = 2, TAG_CLOCK = 3, TAG_WRAP = 8192 };
enum { EVAL_BUFFERS = 3 }; /* micro-batch buffers evaluation cycles through */
static int tag_of(int kind, int m) { return (m % TAG_WRAP) * 4 + kind; }
/* With V model chunks per rank (interleaved schedules), a message also names the chunk that
 * receives it: between two ranks, each direction carries one chunk's messages per (m, v). */
static int chunk_tag(int kind, int m, int v, int V) { return tag_of(kind, m * V + v); }

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
    MPI_Request eval_send, eval_recv[3];
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
    long steps;
    int inflight, peak_inflight;
    trace_log trace;
};


static int progress_sends(exec_t *e);
static int reps_progress(exec_t *e);

/* What a waiting rank keeps doing (mpi_wait_progress_fn): it posts its pending sends, for
 * a peer may be waiting for one of them before it can answer, and moves its replicas'
 * reductions on. */
static int keep_progressing(void *ctx)
{
    exec_t *e = ctx;
    if (e->n_pending && progress_sends(e)) return -1;
    return reps_progress(e);
}

static int wait_request(exec_t *e, MPI_Request *req, const char *what, int m, int peer)
{
    if (*req == MPI_REQUEST_NULL) return 0;
    int timed_out = 0;
    if (mpi_wait_test(req, e->cfg.timeout_s, keep_progressing, e, &timed_out)) return -1;
    if (timed_out)
        return pt_error_set("rank %d (%s, stage %d): no progress for %.0f s waiting for %s "
                                "of micro-batch %d %s stage %d (--timeout); a peer has died or "
                                "stalled", e->world_rank, e->host, e->rank, e->cfg.timeout_s,
                                what, m, strncmp(what, "send", 4) ? "from" : "to", peer);
    return 0;
}

/* The world rank of every stage of this pipeline (messages in the trace are named by
 * world ranks, unique across replicas). */
static int world_ranks(exec_t *e)
{
    MPI_Group pipe, world;
    PT_MPI_CHECK(MPI_Comm_group(e->comm, &pipe));
    PT_MPI_CHECK(MPI_Comm_group(e->world, &world));
    int *stages = malloc((size_t)e->size * sizeof *stages);
    int rc = stages ? 0 : pt_error_set("out of memory");
    for (int s = 0; s < e->size && stages; s++) stages[s] = s;
    if (!rc) rc = PT_MPI_CALL(MPI_Group_translate_ranks(pipe, e->size, stages, world,
                                                        e->pipe_world));
    free(stages);
    MPI_Group_free(&pipe);
    MPI_Group_free(&world);
    return rc;
}

/* The stage's tensor collectives (stage_tensor_comm): non-blocking, waited for politely
 * under --timeout, as every wait of the executor. */
static void record_tensor(exec_t *e, double t0, size_t bytes);

static int tensor_allreduce(void *ctx, float *buf, size_t n)
{
    exec_t *e = ctx;
    if (n > INT_MAX)
        return pt_error_set("a tensor all-reduce of %zu floats is too large for MPI", n);
    MPI_Request req;
    double t0 = pt_now();
    if (PT_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, e->cfg.tensor,
                                   &req)) ||
        mpi_wait_collective(&req, e->cfg.tensor, e->cfg.timeout_s))
        return -1;
    record_tensor(e, t0, n * sizeof(float));
    return 0;
}

static int tensor_allgather(void *ctx, const float *send, float *recv, const size_t *count)
{
    exec_t *e = ctx;
    int T = e->cfg.shard->T, counts[T], displs[T];
    size_t total = 0;
    for (int r = 0; r < T; r++) {
        if (total + count[r] > INT_MAX)
            return pt_error_set("a tensor all-gather of %zu floats is too large for MPI",
                                total + count[r]);
        counts[r] = (int)count[r];
        displs[r] = (int)total;
        total += count[r];
    }
    MPI_Request req;
    double t0 = pt_now();
    if (PT_MPI_CALL(MPI_Iallgatherv(send, counts[e->cfg.tensor_rank], MPI_FLOAT, recv, counts,
                                    displs, MPI_FLOAT, e->cfg.tensor, &req)) ||
        mpi_wait_collective(&req, e->cfg.tensor, e->cfg.timeout_s))
        return -1;
    record_tensor(e, t0, (total - count[e->cfg.tensor_rank]) * sizeof(float));
    return 0;
}

/* Every rank of a tensor group computes the same loss: tensor rank 0 counts it. */
static void counted_once(const exec_t *e, engine_result *r)
{
    if (e->cfg.tensor_rank == 0) return;
    r->loss_sum = 0;
    r->correct = 0;
}

int exec_init(exec_t **out, MPI_Comm comm, const net_desc *net, const partition *part,
              const schedule *sched, const exec_config *cfg)
{
    *out = NULL;
    int rank, size;
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    int R = cfg->rep.replicas > 1 ? cfg->rep.replicas : 1;
    int V = sched->virtual_stages > 1 ? sched->virtual_stages : 1;
    if (sched->stages != size || part->stages != size * V)
        return pt_error_set("the pipeline has %d ranks but the layout has %d stages: run with "
                            "mpiexec -n %d", size, sched->stages, sched->stages * R);
    if (V > 1 && size < 2)
        return pt_error_set("interleaved schedules (--virtual %d) need at least 2 stages", V);
    if (sched->microbatches != cfg->microbatches || part->n_layers != net->n_layers)
        return pt_error_set("the schedule has %d micro-batches and the partition %d layers; "
                            "expected %d and %d", sched->microbatches, part->n_layers,
                            cfg->microbatches, net->n_layers);
    if (cfg->microbatches < 1 || cfg->batch % (R * cfg->microbatches))
        return pt_error_set("%d replicas × %d micro-batches do not divide the batch of %d", R,
                            cfg->microbatches, cfg->batch);
    schedule_report rep;
    if (schedule_verify(sched, &rep)) return -1;
    int slots[V];
    int kept[V];
    for (int v = 0; v < V; v++) {
        slots[v] = rep.peak_inflight_chunk[rank * V + v];
        kept[v] = rep.peak_inputs_chunk[rank * V + v];
    }
    schedule_report_free(&rep);
    const schedule_list *list = &sched->lists[rank];
    int split = 0;
    for (int i = 0; i < list->n_ops; i++) split |= list->ops[i].kind == SCHED_OP_BACKWARD_INPUT;

    exec_t *e = calloc(1, sizeof *e);
    if (!e) return pt_error_set("out of memory");
    e->V = V;
    e->comm = comm;
    e->rank = rank;
    e->size = size;
    e->world = cfg->world;
    e->replica = cfg->replica;
    e->replicas = R;
    e->pipe_world = malloc((size_t)size * sizeof *e->pipe_world);
    if (!e->pipe_world || PT_MPI_CALL(MPI_Comm_rank(e->world, &e->world_rank)) ||
        PT_MPI_CALL(MPI_Comm_size(e->world, &e->world_size)) || world_ranks(e)) {
        if (!e->pipe_world) pt_error_set("out of memory");
        free(e->pipe_world);
        free(e);
        return -1;
    }
    gethostname(e->host, sizeof e->host - 1);
    e->net = net;
    e->sched = sched;
    e->cfg = *cfg;
    int M = cfg->microbatches;
    e->mb = cfg->batch / (R * M);
    e->engs = calloc((size_t)V, sizeof *e->engs);
    e->chunk_params = calloc((size_t)(size * V), sizeof *e->chunk_params);
    e->chunk_s = calloc((size_t)V * EXEC_TIMES, sizeof *e->chunk_s);
    if (!e->engs || !e->chunk_params || !e->chunk_s) {
        exec_free(e);
        return pt_error_set("out of memory");
    }
    for (int c = 0; c < size * V; c++) {
        size_t in_count, out_count;
        engine_stage_sizes(net, part->first[c], part->first[c + 1], &in_count, &out_count,
                           &e->chunk_params[c]);
        if ((double)e->mb * (double)(in_count > out_count ? in_count : out_count) >
            (double)INT_MAX) {
            exec_free(e);
            return pt_error_set("a micro-batch of %d samples is too large for one MPI "
                                "message", cfg->batch / (R * M));
        }
    }
    for (int v = 0; v < V; v++) {
        int c = v * size + rank;
        engine_config ec = {
            .net = net, .first = part->first[c], .last = part->first[c + 1],
            /* two halves, see exec.half; evaluation cycles through 0, 1 and 2 */
            .buffers = 2 * M > EVAL_BUFFERS ? 2 * M : EVAL_BUFFERS,
            .max_batch = e->mb, .n_slots = slots[v] > 0 ? slots[v] : 1, .batch = cfg->batch,
            .threads = cfg->threads > 0 ? cfg->threads : 1, .device = cfg->gpu,
            .device_messages = cfg->device_messages,
            .max_ticks = list->n_ops, .debug_ready_delay = cfg->debug_ready_delay,
            .grad_pieces = replicas_grad_pieces(&cfg->rep),
            .microbatches = M, .split_backward = split,
            .wgrad_rows = cfg->wgrad_batched ? e->mb * M : 0, .recompute = list->recompute,
            .kept_outputs = kept[v],
            .shard = cfg->shard, .shard_rank = cfg->tensor_rank,
            .tensor_comm = {.ctx = e, .allreduce = tensor_allreduce,
                            .allgather = tensor_allgather},
        };
        if (engine_create(&e->engs[v], cfg->device, &ec)) {
            exec_free(e);
            return -1;
        }
    }
    e->eng = e->engs[0];
    e->in_count = e->eng->in_count;
    e->out_count = e->eng->out_count;
    size_t VM = (size_t)V * (size_t)M;
    e->req_act = malloc(VM * sizeof *e->req_act);
    e->req_grad = malloc(VM * sizeof *e->req_grad);
    e->req_send_act = malloc(VM * sizeof *e->req_send_act);
    e->req_send_grad = malloc(VM * sizeof *e->req_send_grad);
    e->pending_cap = 2 * (int)VM + 2;
    e->pending = malloc((size_t)e->pending_cap * sizeof *e->pending);
    if (!e->req_act || !e->req_grad || !e->req_send_act || !e->req_send_grad || !e->pending) {
        exec_free(e);
        return pt_error_set("out of memory for %d micro-batches", M);
    }
    for (size_t k = 0; k < VM; k++)
        e->req_act[k] = e->req_grad[k] = e->req_send_act[k] = e->req_send_grad[k] =
            MPI_REQUEST_NULL;
    e->eval_send = e->eval_recv[0] = e->eval_recv[1] = e->eval_recv[2] = MPI_REQUEST_NULL;
    /* the default 50 µs timer slack would double every polite pause */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    e->t_origin = pt_now();
    *out = e;
    return 0;
}

/* The clock of the trace: pt_now() (the engines stamp their events with it), moved when
 * testing by PIPETRAIN_DEBUG_CLOCK_SKEW. */
static double trace_time(const exec_t *e, double t) { return trace_skew_apply(&e->skew, t); }
static double trace_now(void *e) { return trace_time(e, pt_now()); }

/* This rank's trace clock against world rank 0's (collective over the world). */
static int sync_clock(exec_t *e)
{
    return trace_clock_measure(&e->clock, e->world, tag_of(TAG_CLOCK, 0), trace_now, e,
                               e->cfg.timeout_s);
}

int exec_start(exec_t *e)
{
    const exec_config *c = &e->cfg;
    if (c->rep.replicas > 1) {
        e->reps = calloc((size_t)e->V, sizeof *e->reps);
        e->rep_base = calloc((size_t)e->V + 1, sizeof *e->rep_base);
        if (!e->reps || !e->rep_base) return pt_error_set("out of memory");
        for (int v = 0; v < e->V; v++) {
            engine *g = e->engs[v];
            if (replicas_init(&e->reps[v], c->group, g,
                              c->local_net ? c->local_net : e->net, g->cfg.first, g->cfg.last,
                              e->rank, &c->rep))
                return -1;
            e->rep_base[v + 1] = e->rep_base[v] + replicas_buckets(e->reps[v]);
        }
        e->rep = e->reps[0];
        int want = e->sched->lists[e->rank].buckets, have = e->rep_base[e->V];
        if (want != have)
            return pt_error_set("rank %d, stage %d: the schedule reduces %d buckets, the "
                                "stage's plan has %d", e->world_rank, e->rank, want, have);
        /* the α–β figures of the group, measured on its first chunk with parameters (every
         * replica of the stage has the same chunks, so they all calibrate the same one) */
        enum { CALIBRATION_ROUNDS = 9 };
        for (int v = 0; v < e->V; v++)
            if (e->reps[v]) {
                if (replicas_calibrate(e->reps[v], c->group, CALIBRATION_ROUNDS, &e->rep_cal))
                    return -1;
                break;
            }
    }
    /* every rank has its stage */
    if (mpi_wait_allreduce(&(int){0}, 1, MPI_INT, MPI_SUM, e->world, e->cfg.timeout_s)) return -1;
    if (!e->cfg.trace) return 0;
    /* The ranks' clocks may differ (other hosts), and no two ranks leave a barrier at the
     * same moment: each rank's trace times count from its own origin, and the writer puts
     * them on world rank 0's clock with the offsets measured now and at the end. */
    if (trace_skew_from_env(e->world_rank, &e->skew)) return -1;
    e->clock = (trace_clock){.n = 0};
    if (sync_clock(e)) return -1;
    e->t_origin = trace_time(e, pt_now());
    return 0;
}

void exec_free(exec_t *e)
{
    if (!e) return;
    for (int v = 0; e->reps && v < e->V; v++) replicas_free(e->reps[v]);
    free(e->reps);
    free(e->rep_base);
    free(e->pipe_world);
    for (int v = 0; e->engs && v < e->V; v++) engine_destroy(e->engs[v]);
    free(e->engs);
    free(e->chunk_params);
    free(e->chunk_s);
    free(e->req_act);
    free(e->req_grad);
    free(e->req_send_act);
    free(e->req_send_grad);
    free(e->pending);
    trace_free(&e->trace);
    free(e);
}

engine *exec_engine(exec_t *e) { return e->eng; }
int exec_chunks(const exec_t *e) { return e->V; }
engine *exec_chunk_engine(exec_t *e, int v) { return v >= 0 && v < e->V ? e->engs[v] : NULL; }
int exec_rank(const exec_t *e) { return e->rank; }
int exec_stages(const exec_t *e) { return e->size; }

/* An event of chunk v between pt_now() times t0 and t1; a send or receive (peer ≥ 0) also
 * gets the id of its message, which the other end computes alike: keyed by the chunk that
 * receives it (recv_v), since one micro-batch may cross between two ranks once per chunk. */
static void record_message(exec_t *e, trace_kind kind, double t0, double t1, int m, int v,
                           int peer, int recv_v)
{
    if (!e->cfg.trace) return;
    int grad = kind == TRACE_SEND_GRAD || kind == TRACE_WAIT_GRAD;
    int sender = kind == TRACE_SEND_ACT || kind == TRACE_SEND_GRAD ? e->rank : peer;
    int M = e->cfg.microbatches;
    trace_event ev = {
        .t0 = trace_time(e, t0) - e->t_origin, .t1 = trace_time(e, t1) - e->t_origin,
        .kind = (int)kind, .microbatch = m, .chunk = m < 0 ? -1 : v, .rank = e->world_rank,
        .step = e->trace_step,
        .flow = peer < 0 ? -1 : trace_flow_id(e->trace_step, grad, recv_v * M + m, e->V * M,
                                              e->pipe_world[sender], e->world_size),
    };
    trace_add(&e->trace, &ev);
}

/* A bucket's reduction among the stage's replicas, with its size. */
static void record_reduction(exec_t *e, double t0, double t1, int bucket, size_t bytes)
{
    trace_event ev = {
        .t0 = trace_time(e, t0) - e->t_origin, .t1 = trace_time(e, t1) - e->t_origin,
        .kind = TRACE_REDUCE, .microbatch = bucket, .chunk = -1, .rank = e->world_rank,
        .step = e->trace_step, .flow = -1, .bytes = (long long)bytes,
    };
    trace_add(&e->trace, &ev);
}

/* A tensor collective that began at t0 and just ended (with --trace). */
static void record_tensor(exec_t *e, double t0, size_t bytes)
{
    if (!e->cfg.trace) return;
    double t1 = pt_now();
    trace_event ev = {
        .t0 = trace_time(e, t0) - e->t_origin, .t1 = trace_time(e, t1) - e->t_origin,
        .kind = TRACE_TENSOR, .microbatch = -1, .chunk = -1, .rank = e->world_rank,
        .step = e->trace_step, .flow = -1, .bytes = (long long)bytes,
    };
    trace_add(&e->trace, &ev);
}

static void record(exec_t *e, trace_kind kind, double t0, double t1, int m, int v)
{
    record_message(e, kind, t0, t1, m, v, -1, v);
}

/* Posts, in order, the pending sends whose buffers are ready (at once on the CPU; when
 * the device-to-host copy has landed on a GPU). */
static int progress_sends(exec_t *e)
{
    int done = 0;
    int rc = 0;
    while (done < e->n_pending) {
        pending_send *p = &e->pending[done];
        int ready = 0;
        if (engine_msg_ready(p->eng, p->kind, p->m, &ready)) {
            rc = -1;
            break;
        }
        if (!ready) break;
        void *buf = engine_msg_buffer(p->eng, p->kind, p->m);
        if (!buf) {
            rc = -1;
            break;
        }
        if (PT_MPI_CALL(MPI_Isend(buf, p->count, MPI_FLOAT, p->peer, p->tag, e->comm,
                                  p->req))) {
            rc = -1;
            break;
        }
        done++;
    }
    if (done) {
        e->n_pending -= done;
        memmove(e->pending, e->pending + done, (size_t)e->n_pending * sizeof *e->pending);
    }
    return rc;
}

/* MPI_Irecv into the engine's buffer for message `kind` of buffer b (NULL: the engine
 * failed, its message is set). */
static int post_recv(exec_t *e, engine *g, engine_msg kind, int b, int count, int peer,
                     int tag, MPI_Request *req)
{
    void *buf = engine_msg_buffer(g, kind, b);
    if (!buf) return -1;
    PT_MPI_CHECK(MPI_Irecv(buf, count, MPI_FLOAT, peer, tag, e->comm, req));
    return 0;
}

/* Starts the send of outgoing message `kind` of m: the engine fills its buffer, MPI_Isend
 * follows as soon as it is full (into *req). */
static int start_send(exec_t *e, engine *g, engine_msg kind, int m, int count, int peer,
                      int tag, MPI_Request *req)
{
    if (engine_msg_prepare(g, kind, m)) return -1;
    if (e->n_pending == e->pending_cap)
        return pt_error_set("rank %d: more than %d sends pending", e->rank, e->pending_cap);
    e->pending[e->n_pending++] = (pending_send){g, kind, m, count, peer, tag, req};
    return progress_sends(e);
}

static int is_pending(const exec_t *e, const MPI_Request *req)
{
    for (int i = 0; i < e->n_pending; i++)
        if (e->pending[i].req == req) return 1;
    return 0;
}

/* Waits until the send into *req has been posted and has completed. */
static int wait_send(exec_t *e, MPI_Request *req, const char *what, int m, int peer)
{
    double t0 = pt_now();
    while (is_pending(e, req)) {
        if (progress_sends(e)) return -1;
        if (!is_pending(e, req)) break;
        if (pt_now() - t0 > e->cfg.timeout_s)
            return pt_error_set("rank %d (%s, stage %d): no progress for %.0f s: the %s of "
                                "micro-batch %d never became ready (--timeout)", e->world_rank,
                                e->host, e->rank, e->cfg.timeout_s, what, m);
        mpi_wait_pause();
    }
    return wait_request(e, req, what, m, peer);
}

static void stall_forever(int die)
{
    if (die) raise(SIGKILL);
    for (;;) pause();
}

/* Testing: an invalid MPI call in the middle of a step, which MPI refuses. */
static int post_invalid_send(exec_t *e)
{
    MPI_Request req;
    PT_MPI_CHECK(MPI_Isend(e->pending, -1, MPI_FLOAT, e->rank, TAG_ACT, e->comm, &req));
    return pt_error_set("rank %d: MPI accepted a send of -1 floats", e->rank);
}

/* Before REDUCE_WAIT: the sends waiting for their bytes (a GPU copy) are posted first, so
 * that the neighbours are not kept waiting while this rank waits for its replicas. */
static int flush_sends(exec_t *e)
{
    double t0 = pt_now();
    while (e->n_pending) {
        if (progress_sends(e) || reps_progress(e)) return -1;
        if (!e->n_pending) break;
        if (pt_now() - t0 > e->cfg.timeout_s)
            return pt_error_set("rank %d (%s, stage %d): no progress for %.0f s: a send never "
                                "became ready (--timeout)", e->world_rank, e->host, e->rank,
                                e->cfg.timeout_s);
        mpi_wait_pause();
    }
    return 0;
}

/* The trace's slice of each bucket reduction of the step that just ended. */
static void record_reductions(exec_t *e)
{
    for (int v = 0; e->cfg.trace && e->reps && v < e->V; v++)
        for (int b = 0; b < replicas_buckets(e->reps[v]); b++) {
            double t0, t1;
            size_t bytes;
            if (replicas_bucket_event(e->reps[v], b, &t0, &t1, &bytes))
                record_reduction(e, t0, t1, e->rep_base[v] + b, bytes);
        }
}

static int reps_progress(exec_t *e)
{
    for (int v = 0; e->reps && v < e->V; v++)
        if (e->reps[v] && replicas_progress(e->reps[v])) return -1;
    return 0;
}

/* The chunk's reductions and the local index of the rank's bucket b (−1 with a message
 * when the chunk has none). */
static replicas_t *bucket_of(exec_t *e, int v, int b, int *local)
{
    replicas_t *r = e->reps ? e->reps[v] : NULL;
    if (!r || b < e->rep_base[v] || b >= e->rep_base[v + 1]) {
        pt_error_set("rank %d: bucket %d is not one of chunk %d's", e->world_rank, b, v);
        return NULL;
    }
    *local = b - e->rep_base[v];
    return r;
}

/* A backward part (bucket b ≥ 0) that is not its micro-batch's last. */
static int part_not_last(exec_t *e, int v, int b)
{
    return b >= 0 && e->reps && b < e->rep_base[v + 1] - 1;
}

/* After the engine has finished the step: its timed operations into the figures and the
 * trace. */
static double account_ticks(exec_t *e, const schedule_list *list)
{
    double compute = 0;
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        for (int i = 0; i < list->n_ops; i++) {
            const schedule_op *op = &list->ops[i];
            double t0 = g->tick_t0[i], t1 = g->tick_t1[i];
            if (t1 < t0) continue;
            double dt = t1 - t0;
            trace_kind kind;
            exec_time what;
            switch (op->kind) {
            case SCHED_OP_FORWARD: kind = TRACE_FORWARD, what = EXEC_TIME_FORWARD; break;
            case SCHED_OP_RECOMPUTE: kind = TRACE_RECOMPUTE, what = EXEC_TIME_RECOMPUTE; break;
            case SCHED_OP_BACKWARD: kind = TRACE_BACKWARD, what = EXEC_TIME_BACKWARD; break;
            case SCHED_OP_BACKWARD_INPUT:
                kind = TRACE_BACKWARD_INPUT, what = EXEC_TIME_BACKWARD_INPUT;
                break;
            case SCHED_OP_BACKWARD_WEIGHT:
                kind = TRACE_BACKWARD_WEIGHT, what = EXEC_TIME_BACKWARD_WEIGHT;
                break;
            case SCHED_OP_OPTIMIZER_STEP: kind = TRACE_OPTIMIZER, what = EXEC_TIMES; break;
            default: continue;
            }
            if (what == EXEC_TIMES) e->optimizer_s += dt;
            else if (what == EXEC_TIME_FORWARD || what == EXEC_TIME_RECOMPUTE) e->forward_s += dt;
            else e->backward_s += dt;
            if (what < EXEC_TIMES) e->chunk_s[v * EXEC_TIMES + what] += dt;
            compute += dt;
            record(e, kind, t0, t1, op->kind == SCHED_OP_OPTIMIZER_STEP ? -1 : op->microbatch, v);
            g->tick_t1[i] = t0 - 1; /* used */
        }
    }
    return compute;
}

/* Chunk routing of interleaved schedules (schedule/schedule.h): the chunk of the peer
 * rank that receives what chunk v sends forward or backward. */
static int act_receiver_chunk(const exec_t *e, int v) { return e->rank < e->size - 1 ? v : v + 1; }
static int grad_receiver_chunk(const exec_t *e, int v) { return e->rank > 0 ? v : v - 1; }

/* Activation bytes the rank holds: a slot taken (forward, recompute) or given back. */
static void hold(exec_t *e, int v, int sign)
{
    size_t b = e->engs[v]->slot_bytes;
    if (sign > 0) {
        e->held_bytes += b;
        if (e->held_bytes > e->peak_bytes) e->peak_bytes = e->held_bytes;
        if (++e->inflight > e->peak_inflight) e->peak_inflight = e->inflight;
    } else {
        e->held_bytes -= b;
        e->inflight--;
    }
}

/* The end of micro-batch m's backward on chunk v: its output may still be on its way to the
 * next stage; then its slot goes back. */
static int end_backward(exec_t *e, int v, int m, int b)
{
    if (wait_send(e, &e->req_send_act[v * e->cfg.microbatches + m], "send of the activation",
                  m, e->rank + 1))
        return -1;
    if (engine_release(e->engs[v], b)) return -1;
    hold(e, v, -1);
    return 0;
}

/* A backward part's local layers: bucket b's (replicas), or the whole chunk. */
static int part_range(exec_t *e, int v, int bucket, int *lo, int *hi)
{
    if (bucket < 0) {
        *lo = 0;
        *hi = e->engs[v]->cfg.last - e->engs[v]->cfg.first;
        return 0;
    }
    int local;
    replicas_t *r = bucket_of(e, v, bucket, &local);
    if (!r) return -1;
    replicas_part_range(r, local, lo, hi);
    return 0;
}

int exec_train_step(exec_t *e, const dataset *data, const int64_t *indices,
                    const int64_t *next_indices, uint64_t seed, uint64_t step,
                    const optimizer_config *opt, exec_step_result *res)
{
    const schedule_list *list = &e->sched->lists[e->rank];
    int mb = e->mb, M = e->cfg.microbatches, base = e->half * M;
    double t_step = pt_now();
    e->trace_step = (long)step;
    /* this replica's share of the batch */
    size_t share = (size_t)e->replica * (size_t)(e->cfg.batch / e->replicas);
    indices += share;
    if (next_indices) next_indices += share;
    int fault = e->cfg.stall_rank == e->world_rank && (long)step == e->cfg.stall_step;
    if (fault && e->cfg.stall_kills != EXEC_STALL_MPI_ERROR)
        stall_forever(e->cfg.stall_kills == EXEC_STALL_KILL);

    /* Post every receive of the step up front: a message may arrive before we wait. */
    int V = e->V;
    for (int i = 0; i < list->n_ops; i++) {
        const schedule_op *op = &list->ops[i];
        int m = op->microbatch, b = base + m, v = op->chunk, k = v * M + m;
        engine *gv = e->engs[v];
        if (op->kind == SCHED_OP_RECV_ACT &&
            post_recv(e, gv, ENGINE_MSG_ACT_IN, b, (int)(mb * gv->in_count), op->peer,
                      chunk_tag(TAG_ACT, m, v, V), &e->req_act[k]))
            return -1;
        if (op->kind == SCHED_OP_RECV_GRAD &&
            post_recv(e, gv, ENGINE_MSG_GRAD_IN, b, (int)(mb * gv->out_count), op->peer,
                      chunk_tag(TAG_GRAD, m, v, V), &e->req_grad[k]))
            return -1;
    }
    if (fault && post_invalid_send(e)) return -1;
    /* Every micro-batch's samples: pixels on stage 0, labels on the last stage; already
     * there when the previous step loaded them. */
    for (int v = 0; v < V; v++)
        for (int m = 0; m < M && !e->prefetched; m++)
            if (engine_load(e->engs[v], base + m, data, indices + (size_t)m * mb, mb)) return -1;
    for (int i = 0; i < list->n_ops; i++) {
        const schedule_op *op = &list->ops[i];
        int m = op->microbatch, b = base + m, v = op->chunk, k = v * M + m, lo, hi;
        engine *g = e->engs[v];
        double t0 = pt_now();
        if (reps_progress(e)) return -1;
        switch (op->kind) {
        case SCHED_OP_RECV_ACT:
            if (wait_request(e, &e->req_act[k], "the activation", m, op->peer)) return -1;
            if (engine_msg_received(g, ENGINE_MSG_ACT_IN, b)) return -1;
            record_message(e, TRACE_WAIT_ACT, t0, pt_now(), m, v, op->peer, v);
            break;
        case SCHED_OP_RECV_GRAD:
            if (wait_request(e, &e->req_grad[k], "the gradient", m, op->peer)) return -1;
            if (engine_msg_received(g, ENGINE_MSG_GRAD_IN, b)) return -1;
            record_message(e, TRACE_WAIT_GRAD, t0, pt_now(), m, v, op->peer, v);
            break;
        case SCHED_OP_FORWARD:
            if (engine_forward(g, b, mb, seed, step, 1, i)) return -1;
            hold(e, v, 1);
            /* with recomputation the activations are dropped at once (recompute holds
             * them again before the backward) */
            if (list->recompute) hold(e, v, -1);
            break;
        case SCHED_OP_RECOMPUTE:
            if (!g->ops->recompute)
                return pt_error_set("rank %d: the %s engine cannot recompute activations",
                                    e->world_rank, g->ops->name);
            if (engine_recompute(g, b, seed, step, i)) return -1;
            hold(e, v, 1);
            break;
        case SCHED_OP_SEND_ACT:
            if (start_send(e, g, ENGINE_MSG_ACT_OUT, b, (int)(mb * g->out_count), op->peer,
                           chunk_tag(TAG_ACT, m, act_receiver_chunk(e, v), V),
                           &e->req_send_act[k]))
                return -1;
            record_message(e, TRACE_SEND_ACT, t0, pt_now(), m, v, op->peer,
                           act_receiver_chunk(e, v));
            break;
        case SCHED_OP_BACKWARD:
            if (op->bucket >= 0) {
                /* part b: the layers of bucket b (and those without parameters above) */
                if (part_range(e, v, op->bucket, &lo, &hi) ||
                    engine_backward_range(g, b, lo, hi, i))
                    return -1;
                if (part_not_last(e, v, op->bucket)) break;
            } else if (engine_backward(g, b, i)) {
                return -1;
            }
            if (end_backward(e, v, m, b)) return -1;
            break;
        case SCHED_OP_BACKWARD_INPUT:
            if (!g->ops->backward_input)
                return pt_error_set("rank %d: the %s engine has no split backward",
                                    e->world_rank, g->ops->name);
            if (engine_backward_input(g, b, i)) return -1;
            break;
        case SCHED_OP_BACKWARD_WEIGHT:
            if (part_range(e, v, op->bucket, &lo, &hi) || engine_backward_weight(g, b, lo, hi, i))
                return -1;
            if (part_not_last(e, v, op->bucket)) break;
            if (end_backward(e, v, m, b)) return -1;
            break;
        case SCHED_OP_SEND_GRAD:
            if (start_send(e, g, ENGINE_MSG_GRAD_OUT, b, (int)(mb * g->in_count), op->peer,
                           chunk_tag(TAG_GRAD, m, grad_receiver_chunk(e, v), V),
                           &e->req_send_grad[k]))
                return -1;
            record_message(e, TRACE_SEND_GRAD, t0, pt_now(), m, v, op->peer,
                           grad_receiver_chunk(e, v));
            break;
        case SCHED_OP_OPTIMIZER_STEP:
            for (int q = 0; q < V * M; q++)
                if (wait_send(e, &e->req_send_grad[q], "send of the gradient", q % M,
                              e->rank - 1))
                    return -1;
            for (int w = 0; w < V; w++) { /* each engine has ticks of its own */
                replicas_t *r = e->reps ? e->reps[w] : NULL;
                if (r ? replicas_step(r, opt, i) : engine_step(e->engs[w], opt, i)) return -1;
            }
            break;
        case SCHED_OP_ALLREDUCE:
        case SCHED_OP_REDUCE_WAIT: {
            int local;
            replicas_t *r = bucket_of(e, v, op->bucket, &local);
            if (!r) return -1;
            if (op->kind == SCHED_OP_ALLREDUCE) {
                if (replicas_start(r, local)) return -1;
            } else if (flush_sends(e) || replicas_wait(r, local)) {
                return -1;
            }
            break;
        }
        case SCHED_OP_COUNT:
            return pt_error_set("rank %d: instruction %s is not supported by this executor",
                                e->rank, schedule_op_name(op->kind));
        }
    }
    /* Everything of this step is queued (on a GPU it is still running): load the next
     * step's samples into the other half now. */
    e->half = 1 - e->half;
    e->prefetched = next_indices != NULL;
    for (int v = 0; v < V; v++)
        for (int m = 0; m < M && next_indices; m++)
            if (engine_load(e->engs[v], e->half * M + m, data, next_indices + (size_t)m * mb, mb))
                return -1;
    engine_result r = {0};
    for (int v = 0; v < V; v++) {
        engine_result rv;
        if (engine_finish(e->engs[v], &rv)) return -1;
        counted_once(e, &rv);
        r.loss_sum += rv.loss_sum;
        r.correct += rv.correct;
        r.nonfinite |= rv.nonfinite;
    }
    e->compute_s += account_ticks(e, list);
    for (int w = 0; e->reps && w < V; w++)
        if (e->reps[w]) replicas_end_step(e->reps[w]);
    record_reductions(e);
    /* Share the loss (it lives on the last stages) and stop everyone on a non-finite one. */
    double t0 = pt_now();
    double sums[3] = {r.loss_sum, (double)r.correct, (double)r.nonfinite};
    if (mpi_wait_allreduce(sums, 3, MPI_DOUBLE, MPI_SUM, e->world, e->cfg.timeout_s)) return -1;
    record(e, TRACE_SYNC, t0, pt_now(), -1, 0);
    e->wall_s += pt_now() - t_step;
    e->steps++;
    res->loss_sum = sums[0];
    res->correct = (long)sums[1];
    if (sums[2] > 0) {
        pt_error_set("the loss is not finite (NaN or infinite) at step %llu: lower the "
                     "learning rate", (unsigned long long)step + 1);
        return EXEC_FAILED_EVERYWHERE;
    }
    return 0;
}

/* Evaluation through V > 1 model chunks per rank: each data chunk goes through the rank's
 * chunks in order, receiving from the previous model chunk and sending to the next. Each
 * rank works through (data chunk, chunk) in that order and waits for a send only where
 * that needs nothing later in the order, so it cannot deadlock. */
static int evaluate_chunked(exec_t *e, const dataset *data, int64_t lo, int count,
                            engine_result *r)
{
    int mb = e->mb, K = e->size, V = e->V, chunks = (count + mb - 1) / mb;
    int64_t ids[mb];
    for (int c = 0; c < chunks; c++) {
        int n = c == chunks - 1 ? count - c * mb : mb, b = c % EVAL_BUFFERS;
        for (int j = 0; j < n; j++) ids[j] = lo + (int64_t)c * mb + j;
        for (int v = 0; v < V; v++) {
            engine *g = e->engs[v];
            int model = v * K + e->rank;
            if (engine_load(g, b, data, ids, n)) return -1;
            if (model > 0) {
                int prev = e->rank > 0 ? e->rank - 1 : K - 1;
                if (post_recv(e, g, ENGINE_MSG_ACT_IN, b, (int)(n * g->in_count), prev,
                              chunk_tag(TAG_EVAL, c, v, V), &e->eval_recv[0]) ||
                    wait_request(e, &e->eval_recv[0], "the evaluation activation", c, prev) ||
                    engine_msg_received(g, ENGINE_MSG_ACT_IN, b))
                    return -1;
            }
            if (engine_forward(g, b, n, 0, 0, 0, -1)) return -1;
            if (model < K * V - 1) {
                int next = e->rank < K - 1 ? e->rank + 1 : 0;
                if (start_send(e, g, ENGINE_MSG_ACT_OUT, b, (int)(n * g->out_count), next,
                               chunk_tag(TAG_EVAL, c, act_receiver_chunk(e, v), V),
                               &e->eval_send) ||
                    wait_send(e, &e->eval_send, "send of the evaluation activation", c, next))
                    return -1;
            }
            if (engine_release(g, b)) return -1;
        }
    }
    *r = (engine_result){0};
    for (int v = 0; v < V; v++) {
        engine_result rv;
        if (engine_finish(e->engs[v], &rv)) return -1;
        counted_once(e, &rv);
        r->loss_sum += rv.loss_sum;
        r->correct += rv.correct;
    }
    return 0;
}

int exec_evaluate(exec_t *e, const dataset *data, double *loss, double *accuracy)
{
    int mb = e->mb, last = e->rank == e->size - 1, first = e->rank == 0;
    /* this replica's share of the set */
    int64_t lo = (int64_t)data->count * e->replica / e->replicas,
            hi = (int64_t)data->count * (e->replica + 1) / e->replicas;
    int count = (int)(hi - lo);
    int chunks = (count + mb - 1) / mb;
    engine *g = e->eng;
    double t_start = pt_now();
    if (e->V > 1) {
        engine_result r;
        e->prefetched = 0;
        if (evaluate_chunked(e, data, lo, count, &r)) return -1;
        record(e, TRACE_EVAL, t_start, pt_now(), -1, 0);
        double sums[2] = {r.loss_sum, (double)r.correct};
        if (mpi_wait_allreduce(sums, 2, MPI_DOUBLE, MPI_SUM, e->world, e->cfg.timeout_s)) return -1;
        *loss = data->count ? sums[0] / data->count : 0;
        *accuracy = data->count ? sums[1] / data->count : 0;
        return 0;
    }
    int64_t ids[mb];
    e->prefetched = 0; /* evaluation reuses the first buffers */
    /* Chunk c in buffer c mod 3: the next chunk's receive is posted before this chunk's
     * compute, into a buffer whose forward (c − 2) a GPU has most likely finished, so the
     * host need not wait for it. */
    int in_floats = (int)(mb * e->in_count);
    if (!first && chunks > 0 &&
        post_recv(e, g, ENGINE_MSG_ACT_IN, 0, in_floats, e->rank - 1, tag_of(TAG_EVAL, 0),
                  &e->eval_recv[0]))
        return -1;
    for (int c = 0; c < chunks; c++) {
        int n = c == chunks - 1 ? count - c * mb : mb;
        int m = c % EVAL_BUFFERS, next = (c + 1) % EVAL_BUFFERS,
            prev = (c + EVAL_BUFFERS - 1) % EVAL_BUFFERS;
        for (int j = 0; j < n; j++) ids[j] = lo + (int64_t)c * mb + j;
        /* the previous chunk's output (which may alias its input buffer, when every layer
         * of the stage is the identity) must be gone before its buffers are reused */
        if (c > 0 && !last) {
            if (wait_send(e, &e->eval_send, "send of the evaluation activation", c - 1,
                          e->rank + 1))
                return -1;
            if (engine_release(g, prev)) return -1;
        }
        if (engine_load(g, m, data, ids, n)) return -1;
        if (!first) {
            if (wait_request(e, &e->eval_recv[m], "the evaluation activation", c, e->rank - 1))
                return -1;
            if (engine_msg_received(g, ENGINE_MSG_ACT_IN, m)) return -1;
            if (c + 1 < chunks &&
                post_recv(e, g, ENGINE_MSG_ACT_IN, next, in_floats, e->rank - 1,
                          tag_of(TAG_EVAL, c + 1), &e->eval_recv[next]))
                return -1;
        }
        if (engine_forward(g, m, n, 0, 0, 0, -1)) return -1;
        if (last) {
            if (engine_release(g, m)) return -1;
        } else if (start_send(e, g, ENGINE_MSG_ACT_OUT, m, (int)(n * e->out_count), e->rank + 1,
                              tag_of(TAG_EVAL, c), &e->eval_send)) {
            return -1;
        }
    }
    if (!last && chunks > 0) {
        if (wait_send(e, &e->eval_send, "send of the evaluation activation", chunks - 1,
                      e->rank + 1))
            return -1;
        if (engine_release(g, (chunks - 1) % EVAL_BUFFERS)) return -1;
    }
    engine_result r;
    if (engine_finish(g, &r)) return -1;
    counted_once(e, &r);
    record(e, TRACE_EVAL, t_start, pt_now(), -1, 0);
    double sums[2] = {r.loss_sum, (double)r.correct};
    if (mpi_wait_allreduce(sums, 2, MPI_DOUBLE, MPI_SUM, e->world, e->cfg.timeout_s)) return -1;
    *loss = data->count ? sums[0] / data->count : 0;
    *accuracy = data->count ? sums[1] / data->count : 0;
    return 0;
}

/* One array of every stage gathered on the pipeline's rank 0, politely (under --timeout).
 * `mine` floats from this rank, −1 when it could not read them (rank 0 then fails). */
static int gather_array(exec_t *e, const float *local, int mine, float *all, const char *what)
{
    int *counts = calloc((size_t)e->size, sizeof *counts), *displs = calloc((size_t)e->size, sizeof *displs);
    if (!counts || !displs) {
        free(counts);
        free(displs);
        return pt_error_set("out of memory");
    }
    int ok = mine >= 0, n = ok ? mine : 0;
    MPI_Request req;
    int rc = PT_MPI_CALL(MPI_Igather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, e->comm, &req)) ||
             mpi_wait_collective(&req, e->comm, e->cfg.timeout_s);
    long total = 0;
    if (!rc && e->rank == 0)
        for (int r = 0; r < e->size; r++) {
            displs[r] = (int)total;
            total += counts[r];
        }
    /* stages hold consecutive layers, so their blocks concatenate into the whole model */
    if (!rc)
        rc = PT_MPI_CALL(MPI_Igatherv(local, n, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0,
                                      e->comm, &req)) ||
             mpi_wait_collective(&req, e->comm, e->cfg.timeout_s);
    free(counts);
    free(displs);
    if (rc) return -1;
    if (!ok) return -1;
    if (e->rank == 0 && (size_t)total != e->net->param_count)
        return pt_error_set("gathering the %s: another stage could not read its own", what);
    return 0;
}

/* Rank 0 (V > 1): the gathered blocks come rank by rank, each its chunks v = 0..V−1 in
 * turn; the model's order is model chunk c = v·K + rank. */
static int reorder_chunks(const exec_t *e, float *all)
{
    int K = e->size, V = e->V;
    size_t total = e->net->param_count;
    float *tmp = malloc((total ? total : 1) * sizeof *tmp);
    if (!tmp) return pt_error_set("out of memory for the parameters");
    memcpy(tmp, all, total * sizeof *tmp);
    size_t dst = 0;
    for (int c = 0; c < K * V; c++) {
        int rank = c % K, v = c / K;
        size_t src = 0;
        for (int q = 0; q < K * V; q++)
            if (q % K < rank || (q % K == rank && q / K < v)) src += e->chunk_params[q];
        memcpy(all + dst, tmp + src, e->chunk_params[c] * sizeof *all);
        dst += e->chunk_params[c];
    }
    free(tmp);
    return 0;
}

/* This rank's parameters (and optimizer moments) of its chunks in turn; 0 or −1. */
static int read_local(exec_t *e, float *local, size_t P, int state, long *upd)
{
    size_t off = 0;
    for (int q = 0; q < e->V; q++) {
        engine *g = e->engs[q];
        if (engine_read_params(g, local + off)) return -1;
        if (state && engine_read_state(g, local + P + off, local + 2 * P + off, upd)) return -1;
        off += g->param_count;
    }
    return 0;
}

/* Tensor shards: this rank's arrays (`arrays` of P floats each, one after the other) to
 * tensor rank 0, which makes the whole tensors of its stage's layers of them (`whole`,
 * arrays of W floats). Collective over the tensor group; ok = 0: this rank sends nothing
 * (rank 0 then fails, and every rank still takes part). */
static int tensor_whole(exec_t *e, const float *local, size_t P, int arrays, int ok,
                        float *whole, size_t W)
{
    const shard_plan *sp = e->cfg.shard;
    MPI_Comm tc = e->cfg.tensor;
    double to = e->cfg.timeout_s;
    int T = sp->T, me = e->cfg.tensor_rank, counts[T], displs[T];
    long n = ok ? (long)P * arrays : 0;
    if (n > INT_MAX) n = 0, ok = pt_error_set("a stage's parameters are too many for MPI") == 0;
    int mine = (int)n;
    MPI_Request req;
    if (PT_MPI_CALL(MPI_Iallgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, tc, &req)) ||
        mpi_wait_collective(&req, tc, to))
        return -1;
    long total = 0;
    for (int r = 0; r < T; r++) {
        displs[r] = (int)total;
        total += counts[r];
    }
    float *all = me == 0 ? malloc((size_t)(total ? total : 1) * sizeof *all) : NULL;
    int root_ok = me != 0 || (all && total <= INT_MAX);
    if (PT_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, &root_ok, 1, MPI_INT, MPI_MIN, tc, &req)) ||
        mpi_wait_collective(&req, tc, to) || !root_ok) {
        free(all);
        return root_ok ? -1 : pt_error_set("tensor rank 0: out of memory for the shards");
    }
    int rc = PT_MPI_CALL(MPI_Igatherv(local, mine, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0,
                                      tc, &req)) ||
             mpi_wait_collective(&req, tc, to);
    for (int t = 0; !rc && me == 0 && t < T; t++) {
        size_t Pt = 0;
        for (int q = 0; q < e->V; q++)
            Pt += shard_param_count(sp, e->net, e->engs[q]->cfg.first, e->engs[q]->cfg.last, t);
        if ((long)Pt * arrays != counts[t]) {
            rc = pt_error_set("gathering the tensor shards: tensor rank %d could not read its "
                              "own", t);
            break;
        }
        for (int a = 0; a < arrays; a++) {
            float *src = all + displs[t] + (size_t)a * Pt;
            size_t lo = 0, wo = 0;
            for (int q = 0; q < e->V; q++) {
                int f = e->engs[q]->cfg.first, l = e->engs[q]->cfg.last;
                shard_copy_layers(sp, e->net, f, l, t, src + lo, whole + (size_t)a * W + wo, 0);
                lo += shard_param_count(sp, e->net, f, l, t);
                for (int k = f; k < l; k++)
                    wo += e->net->layers[k].weight_count + e->net->layers[k].bias_count;
            }
        }
    }
    free(all);
    return rc || !ok ? -1 : 0;
}

int exec_gather_state(exec_t *e, float *params, float *m, float *v, int with_m, int with_v,
                      long *updates)
{
    size_t P = 0;
    for (int q = 0; q < e->V; q++) P += e->engs[q]->param_count;
    float *local = malloc(3 * (P ? P : 1) * sizeof *local);
    long upd = 0;
    int ok = local ? read_local(e, local, P, with_m || with_v, &upd) == 0
                   : pt_error_set("out of memory for the parameters") == 0;
    if (e->cfg.shard && e->cfg.shard->T > 1) {
        /* whole tensors on tensor rank 0, whose pipeline then gathers them as below */
        size_t W = 0;
        for (int c = 0; c < e->V; c++) W += e->chunk_params[c * e->size + e->rank];
        float *whole = e->cfg.tensor_rank == 0 ? malloc(3 * (W ? W : 1) * sizeof *whole) : NULL;
        if (e->cfg.tensor_rank == 0 && !whole) ok = pt_error_set("out of memory") == 0;
        int rc = tensor_whole(e, local, P, with_m || with_v ? 3 : 1, ok, whole, W);
        free(local);
        if (e->cfg.tensor_rank != 0) {
            if (updates) *updates = upd;
            return rc;
        }
        local = whole;
        P = W;
        ok = ok && !rc && whole;
    }
    /* A rank whose copy failed sends nothing: rank 0 then sees a short model, and every
     * rank still takes part in every gather. */
    int mine = ok ? (int)P : -1;
    int rc = gather_array(e, local, mine, params, "parameters");
    /* every rank takes part in the same gathers (m and v matter on rank 0 only) */
    if (with_m && gather_array(e, local + P, mine, m, "optimizer's first moments")) rc = -1;
    if (with_v && gather_array(e, local + 2 * P, mine, v, "optimizer's second moments")) rc = -1;
    free(local);
    if (!rc && e->V > 1 && e->rank == 0) {
        if (reorder_chunks(e, params)) rc = -1;
        if (!rc && with_m && reorder_chunks(e, m)) rc = -1;
        if (!rc && with_v && reorder_chunks(e, v)) rc = -1;
    }
    if (updates) *updates = upd; /* every stage takes the same number of updates */
    return rc;
}

int exec_gather_params(exec_t *e, float *all)
{
    return exec_gather_state(e, all, NULL, NULL, 0, 0, NULL);
}

void exec_get_stats(const exec_t *e, exec_stats *st)
{
    st->compute_s = e->compute_s;
    st->forward_s = e->forward_s;
    st->backward_s = e->backward_s;
    st->optimizer_s = e->optimizer_s;
    st->wall_s = e->wall_s;
    st->steps = e->steps;
    st->peak_act_bytes = e->peak_bytes;
    st->chunks = e->V;
    st->chunk_s = e->chunk_s;
    st->peak_microbatches = e->peak_inflight;
    st->tensor_s = -e->tensor_s0;
    for (int v = 0; v < e->V; v++) st->tensor_s += e->engs[v]->tensor_s;
    st->reduce = (replicas_stats){0};
    for (int v = 0; e->reps && v < e->V; v++) {
        replicas_stats rs;
        replicas_get_stats(e->reps[v], &rs);
        st->reduce.reduce_s += rs.reduce_s;
        st->reduce.exposed_s += rs.exposed_s;
        st->reduce.bytes += rs.bytes;
        st->reduce.steps = rs.steps > st->reduce.steps ? rs.steps : st->reduce.steps;
    }
    st->reduce_cal = e->rep_cal;
}

void exec_reset_stats(exec_t *e)
{
    e->compute_s = e->wall_s = e->forward_s = e->backward_s = e->optimizer_s = 0;
    e->tensor_s0 = 0;
    for (int v = 0; v < e->V; v++) e->tensor_s0 += e->engs[v]->tensor_s;
    e->steps = 0;
    e->peak_inflight = 0;
    e->peak_bytes = e->held_bytes;
    memset(e->chunk_s, 0, (size_t)e->V * EXEC_TIMES * sizeof *e->chunk_s);
    for (int v = 0; e->reps && v < e->V; v++) replicas_reset_stats(e->reps[v]);
}

int exec_write_trace(exec_t *e, const char *path)
{
    /* the clocks again: with the start's figures, they give each rank's drift */
    if (sync_clock(e)) return -1;
    trace_rank me = {.rank = e->world_rank, .stage = e->rank, .origin = e->t_origin,
                     .clock = e->clock};
    snprintf(me.host, sizeof me.host, "%s", e->host);
    trace_rank ranks[e->world_size];
    PT_MPI_CHECK(MPI_Gather(&me, (int)sizeof me, MPI_BYTE, ranks, (int)sizeof me, MPI_BYTE, 0,
                            e->world));
    /* Events travel as raw bytes: every rank runs the same binary on one architecture. */
    int bytes = (int)(e->trace.n * sizeof(trace_event));
    int counts[e->world_size], displs[e->world_size];
    PT_MPI_CHECK(MPI_Gather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, 0, e->world));
    char *all = NULL;
    long total = 0;
    if (e->world_rank == 0) {
        for (int r = 0; r < e->world_size; r++) {
            displs[r] = (int)total;
            total += counts[r];
        }
        all = malloc(total ? (size_t)total : 1);
    }
    int ok = e->world_rank != 0 || all != NULL;
    if (PT_MPI_CALL(MPI_Bcast(&ok, 1, MPI_INT, 0, e->world))) {
        free(all);
        return -1;
    }
    if (!ok) return pt_error_set("out of memory for the trace (%ld bytes)", total);
    if (PT_MPI_CALL(MPI_Gatherv(e->trace.events, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE,
                                0, e->world))) {
        free(all);
        return -1;
    }
    /* rank 0's verdict, and its message, on every rank */
    char msg[512] = "";
    if (e->world_rank == 0) {
        if (trace_write_json(path, (trace_event *)all, (int)(total / sizeof(trace_event)),
                             ranks, e->world_size))
            snprintf(msg, sizeof msg, "%s", pt_error_get());
        free(all);
    }
    PT_MPI_CHECK(MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, 0, e->world));
    return msg[0] ? pt_error_set("%s", msg) : 0;
}
