/* The executor (src/runtime/exec.h): its setup and the training step, which runs this
 * rank's schedule list one instruction at a time. Messages and waits are in exec_msg.c,
 * evaluation in exec_eval.c, the gathers in exec_gather.c and the trace in exec_trace.c. */
#include "src/runtime/exec.h"

#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "src/runtime/engine_create.h"
#include "src/runtime/exec_impl.h"

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
    exec_record_tensor(e, t0, n * sizeof(float));
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
    exec_record_tensor(e, t0, (total - count[e->cfg.tensor_rank]) * sizeof(float));
    return 0;
}

/* Sequence parallelism's reduce-scatter: rank r receives the sum of block r. */
static int tensor_reduce_scatter(void *ctx, const float *send, float *recv, const size_t *count)
{
    exec_t *e = ctx;
    int T = e->cfg.shard->T, counts[T];
    size_t total = 0;
    for (int r = 0; r < T; r++) {
        if (total + count[r] > INT_MAX)
            return pt_error_set("a tensor reduce-scatter of %zu floats is too large for MPI",
                                total + count[r]);
        counts[r] = (int)count[r];
        total += count[r];
    }
    MPI_Request req;
    double t0 = pt_now();
    if (PT_MPI_CALL(MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, e->cfg.tensor,
                                        &req)) ||
        mpi_wait_collective(&req, e->cfg.tensor, e->cfg.timeout_s))
        return -1;
    exec_record_tensor(e, t0, (total - count[e->cfg.tensor_rank]) * sizeof(float));
    return 0;
}

/* The layout's checks: the pipeline's ranks, the schedule, the partition, the net and the
 * batch agree. */
static int check_layout(int size, int V, const net_desc *net, const partition *part,
                        const schedule *sched, const exec_config *cfg)
{
    int R = cfg->rep.replicas > 1 ? cfg->rep.replicas : 1;
    if (sched->stages != size || part->stages != size * V)
        return pt_error_set("the pipeline has %d rank%s but the layout has %d stage%s: run "
                            "with mpiexec -n %d", size, size == 1 ? "" : "s", sched->stages,
                            sched->stages == 1 ? "" : "s", sched->stages * R);
    if (V > 1 && size < 2 && sched->placement != SCHED_PLACE_V)
        return pt_error_set("interleaved schedules (--virtual %d) need at least 2 stages", V);
    if (sched->microbatches != cfg->microbatches || part->n_layers != net->n_layers)
        return pt_error_set("the schedule has %d micro-batches and the partition %d layers; "
                            "expected %d and %d", sched->microbatches, part->n_layers,
                            cfg->microbatches, net->n_layers);
    if (cfg->microbatches < 1 || cfg->batch % (R * cfg->microbatches))
        return pt_error_set("%d replicas × %d micro-batches do not divide the batch of %d", R,
                            cfg->microbatches, cfg->batch);
    return 0;
}

/* Verifies the schedule and reads, for each of the rank's V chunks, the most micro-batches
 * whose activations it holds at once (slots) and the most inputs it keeps (kept), and the
 * most it holds over all its chunks at once (*rank_slots). */
static int schedule_peaks(const schedule *sched, int rank, int V, int *slots, int *kept,
                          int *rank_slots)
{
    schedule_report rep;
    if (schedule_verify(sched, &rep)) return -1;
    *rank_slots = rep.peak_inflight[rank];
    for (int v = 0; v < V; v++) {
        slots[v] = rep.peak_inflight_chunk[rank * V + v];
        kept[v] = rep.peak_inputs_chunk[rank * V + v];
    }
    schedule_report_free(&rep);
    return 0;
}

/* The executor of rank `rank` of the pipeline comm, with its place in the world; NULL with
 * a message. */
static exec_t *alloc_exec(MPI_Comm comm, int rank, int size, int V, const exec_config *cfg)
{
    exec_t *e = calloc(1, sizeof *e);
    if (!e) {
        pt_error_set("out of memory");
        return NULL;
    }
    e->V = V;
    e->comm = comm;
    e->rank = rank;
    e->size = size;
    e->world = cfg->world;
    e->replica = cfg->replica;
    e->replicas = cfg->rep.replicas > 1 ? cfg->rep.replicas : 1;
    e->pipe_world = malloc((size_t)size * sizeof *e->pipe_world);
    if (!e->pipe_world || PT_MPI_CALL(MPI_Comm_rank(e->world, &e->world_rank)) ||
        PT_MPI_CALL(MPI_Comm_size(e->world, &e->world_size)) || world_ranks(e)) {
        if (!e->pipe_world) pt_error_set("out of memory");
        free(e->pipe_world);
        free(e);
        return NULL;
    }
    gethostname(e->host, sizeof e->host - 1);
    e->cfg = *cfg;
    e->mb = cfg->batch / (e->replicas * cfg->microbatches);
    return e;
}

/* The per-chunk arrays, and every model chunk's parameter count (whose messages must fit
 * one MPI message of a micro-batch). */
static int alloc_chunks(exec_t *e, const partition *part)
{
    int K = e->size, V = e->V;
    e->engs = calloc((size_t)V, sizeof *e->engs);
    e->chunk_params = calloc((size_t)(K * V), sizeof *e->chunk_params);
    e->chunk_s = calloc((size_t)V * EXEC_TIMES, sizeof *e->chunk_s);
    if (!e->engs || !e->chunk_params || !e->chunk_s) return pt_error_set("out of memory");
    for (int c = 0; c < K * V; c++) {
        size_t in_count, out_count;
        engine_stage_sizes(e->net, part->first[c], part->first[c + 1], &in_count, &out_count,
                           &e->chunk_params[c]);
        if ((double)e->mb * (double)(in_count > out_count ? in_count : out_count) >
            (double)INT_MAX)
            return pt_error_set("a micro-batch of %d samples is too large for one MPI "
                                "message", e->mb);
    }
    return 0;
}

/* One engine per chunk on the configured device, its activation slots and kept inputs
 * sized from the schedule's peaks (on the CPU the chunks' slots shared within the rank's
 * peak, engine_create_chunks). */
static int create_engines(exec_t *e, const partition *part, const int *slots, const int *kept,
                          int rank_slots)
{
    const exec_config *cfg = &e->cfg;
    const schedule_list *list = &e->sched->lists[e->rank];
    int M = cfg->microbatches, split = 0, n_recv[2 * e->V];
    for (int i = 0; i < list->n_ops; i++) split |= list->ops[i].kind == SCHED_OP_BACKWARD_INPUT;
    if (exec_plan_receives(e, part, n_recv) || exec_plan_sends(e)) return -1;
    engine_config ecs[e->V];
    for (int v = 0; v < e->V; v++) {
        int c = schedule_model_chunk(e->sched, e->rank, v);
        ecs[v] = (engine_config){
            .net = e->net, .first = part->first[c], .last = part->first[c + 1],
            /* two halves, see exec.half; evaluation cycles through 0, 1 and 2 */
            .buffers = 2 * M > EVAL_BUFFERS ? 2 * M : EVAL_BUFFERS,
            /* a step's messages are over by its end: one buffer per micro-batch (the
             * CPU's gradients sent and messages received: as few as liveness allows) */
            .message_buffers = M > EVAL_BUFFERS ? M : EVAL_BUFFERS,
            .receive_buffers = n_recv[2 * v], .receive_grad_buffers = n_recv[2 * v + 1],
            .send_buffers = e->send_n[v],
            .max_batch = e->mb, .n_slots = slots[v] > 0 ? slots[v] : 1, .batch = cfg->batch,
            .threads = cfg->threads > 0 ? cfg->threads : 1, .device = cfg->gpu,
            .device_messages = cfg->device_messages, .precision = cfg->precision,
            .max_ticks = list->n_ops, .debug_ready_delay = cfg->debug_ready_delay,
            .grad_pieces = replicas_grad_pieces(&cfg->rep),
            .microbatches = M, .split_backward = split,
            .wgrad_rows = cfg->wgrad_batched ? e->mb * M : 0, .recompute = list->recompute,
            .kept_outputs = kept[v],
            .shard = cfg->shard, .shard_rank = cfg->tensor_rank,
            .tensor_comm = {.ctx = e, .allreduce = tensor_allreduce,
                            .allgather = tensor_allgather,
                            .reduce_scatter = tensor_reduce_scatter},
        };
    }
    if (engine_create_chunks(e->engs, e->V, cfg->device, ecs, rank_slots)) return -1;
    e->eng = e->engs[0];
    e->in_count = e->eng->in_count;
    e->out_count = e->eng->out_count;
    return 0;
}

/* The message requests of every (chunk, micro-batch) and the queue of pending sends. */
static int alloc_requests(exec_t *e)
{
    int M = e->cfg.microbatches;
    size_t VM = (size_t)e->V * (size_t)M;
    e->req_act = malloc(VM * sizeof *e->req_act);
    e->req_grad = malloc(VM * sizeof *e->req_grad);
    e->req_send_act = malloc(VM * sizeof *e->req_send_act);
    e->req_send_grad = malloc(VM * sizeof *e->req_send_grad);
    e->pending_cap = 2 * (int)VM + 2;
    e->pending = malloc((size_t)e->pending_cap * sizeof *e->pending);
    if (!e->req_act || !e->req_grad || !e->req_send_act || !e->req_send_grad || !e->pending)
        return pt_error_set("out of memory for %d micro-batches", M);
    for (size_t k = 0; k < VM; k++)
        e->req_act[k] = e->req_grad[k] = e->req_send_act[k] = e->req_send_grad[k] =
            MPI_REQUEST_NULL;
    e->eval_send = MPI_REQUEST_NULL;
    for (int b = 0; b < EVAL_BUFFERS; b++) e->eval_recv[b] = MPI_REQUEST_NULL;
    return 0;
}

int exec_init(exec_t **out, MPI_Comm comm, const net_desc *net, const partition *part,
              const schedule *sched, const exec_config *cfg)
{
    *out = NULL;
    int rank, size;
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    int V = sched->virtual_stages > 1 ? sched->virtual_stages : 1;
    int slots[V], kept[V], rank_slots;
    if (check_layout(size, V, net, part, sched, cfg) ||
        schedule_peaks(sched, rank, V, slots, kept, &rank_slots))
        return -1;
    exec_t *e = alloc_exec(comm, rank, size, V, cfg);
    if (!e) return -1;
    e->net = net;
    e->sched = sched;
    if (alloc_chunks(e, part) || create_engines(e, part, slots, kept, rank_slots) ||
        alloc_requests(e)) {
        exec_free(e);
        return -1;
    }
    /* the default 50 µs timer slack would double every polite pause */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    e->t_origin = pt_now();
    *out = e;
    return 0;
}

/* Hybrid mode: each chunk's reductions among the stage's replicas, checked against the
 * schedule's buckets, and their α–β figures. */
static int start_reductions(exec_t *e)
{
    const exec_config *c = &e->cfg;
    e->reps = calloc((size_t)e->V, sizeof *e->reps);
    e->rep_base = calloc((size_t)e->V + 1, sizeof *e->rep_base);
    if (!e->reps || !e->rep_base) return pt_error_set("out of memory");
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        if (replicas_init(&e->reps[v], c->group, g, c->local_net ? c->local_net : e->net,
                          g->cfg.first, g->cfg.last, e->rank, &c->rep))
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
        if (e->reps[v])
            return replicas_calibrate(e->reps[v], c->group, CALIBRATION_ROUNDS, &e->rep_cal);
    return 0;
}

int exec_start(exec_t *e)
{
    if (e->cfg.rep.replicas > 1 && start_reductions(e)) return -1;
    if (exec_finish_start(e)) return -1;
    /* every rank has its stage */
    if (mpi_wait_allreduce(&(int){0}, 1, MPI_INT, MPI_SUM, e->world, e->cfg.timeout_s)) return -1;
    return e->cfg.trace ? exec_start_trace(e) : 0;
}

void exec_free(exec_t *e)
{
    if (!e) return;
    exec_finish_free(e);
    exec_postval_free(e);
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
    free(e->recv_at);
    free(e->recv_ops);
    free(e->send_n);
    free(e->pending);
    trace_free(&e->trace);
    free(e);
}

engine *exec_engine(exec_t *e) { return e->eng; }
int exec_chunks(const exec_t *e) { return e->V; }
engine *exec_chunk_engine(exec_t *e, int v) { return v >= 0 && v < e->V ? e->engs[v] : NULL; }
int exec_rank(const exec_t *e) { return e->rank; }
int exec_stages(const exec_t *e) { return e->size; }

/* A training step as its instructions see it. */
typedef struct {
    const schedule_list *list; /* this rank's */
    int base;                  /* the first micro-batch buffer of this step's half */
    uint64_t seed, step;       /* the dropout stream */
    const optimizer_config *opt;
    double t0;                 /* when the current instruction began (its trace slice) */
} step_run;

static void stall_forever(int die)
{
    if (die) raise(SIGKILL);
    for (;;) pause();
}

/* Testing: with $PT_TEST_FAULT_ONCE naming a file, a --debug-* fault fires only while that
 * file exists, and the faulting rank removes it: a job restarted from a checkpoint before
 * the fault's step (tests/launch_restart.sh) does not meet it again. */
static int fault_armed(void)
{
    const char *once = getenv("PT_TEST_FAULT_ONCE");
    return !once || !*once || unlink(once) == 0;
}

/* Testing: an invalid MPI call in the middle of a step, which MPI refuses. */
static int post_invalid_send(exec_t *e)
{
    MPI_Request req;
    PT_MPI_CHECK(MPI_Isend(e->pending, -1, MPI_FLOAT, e->rank, TAG_ACT, e->comm, &req));
    return pt_error_set("rank %d: MPI accepted a send of -1 floats", e->rank);
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
            exec_record(e, kind, t0, t1, op->kind == SCHED_OP_OPTIMIZER_STEP ? -1 : op->microbatch,
                        v);
            g->tick_t1[i] = t0 - 1; /* used */
        }
    }
    return compute;
}

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
    if (exec_wait_send(e, &e->req_send_act[v * e->cfg.microbatches + m],
                       "send of the activation", m, e->rank + 1))
        return -1;
    if (engine_release(e->engs[v], b)) return -1;
    hold(e, v, -1);
    return 0;
}

/* A whole backward of chunk v (buffer m) begins: every bucket's part at once
 * (replicas_part_begins). */
static int whole_begins(exec_t *e, int v, int m)
{
    return e->reps && e->reps[v] ? replicas_part_begins(e->reps[v], -1, m) : 0;
}

/* A backward part's local layers: bucket b's (replicas), or the whole chunk; the part of
 * buffer m's micro-batch begins (ZeRO-2's gradient memory, replicas_part_begins). */
static int part_range(exec_t *e, int v, int bucket, int m, int *lo, int *hi)
{
    if (bucket < 0) {
        *lo = 0;
        *hi = e->engs[v]->cfg.last - e->engs[v]->cfg.first;
        return whole_begins(e, v, m);
    }
    int local;
    replicas_t *r = bucket_of(e, v, bucket, &local);
    if (!r) return -1;
    replicas_part_range(r, local, lo, hi);
    return replicas_part_begins(r, local, m); /* ZeRO-2: the part's gradient memory back */
}

/* This replica's micro-batches of the step whose samples are data's `indices` (the whole
 * batch's: global sample ids index it), into the buffers from `base` of every chunk: pixels
 * or token ids on stage 0, labels on the last stage. */
static int load_samples(exec_t *e, int base, const dataset *data, const int64_t *indices)
{
    int M = e->cfg.microbatches;
    for (int v = 0; v < e->V; v++)
        for (int m = 0; m < M; m++) {
            size_t first = exec_first_sample(e->cfg.batch, e->replicas, e->replica, M, m);
            if (engine_load(e->engs[v], base + m, data, indices + first, e->mb)) return -1;
        }
    return 0;
}

/* RECV_ACT, RECV_GRAD: waits for the message exec_post_receives posted; the engine takes it. */
static int op_receive(exec_t *e, const step_run *s, const schedule_op *op)
{
    int grad = op->kind == SCHED_OP_RECV_GRAD;
    int m = op->microbatch, v = op->chunk, k = v * e->cfg.microbatches + m;
    MPI_Request *req = grad ? &e->req_grad[k] : &e->req_act[k];
    if (exec_wait_request(e, req, grad ? "the gradient" : "the activation", m, op->peer)) return -1;
    if (engine_msg_received(e->engs[v], grad ? ENGINE_MSG_GRAD_IN : ENGINE_MSG_ACT_IN,
                            s->base + m))
        return -1;
    exec_record_message(e, grad ? TRACE_WAIT_GRAD : TRACE_WAIT_ACT, s->t0, pt_now(), m, v,
                        op->peer, v);
    return 0;
}

static int op_forward(exec_t *e, const step_run *s, const schedule_op *op, int i)
{
    int v = op->chunk;
    if (engine_forward(e->engs[v], s->base + op->microbatch, e->mb, s->seed, s->step, 1, i))
        return -1;
    hold(e, v, 1);
    /* with recomputation the activations are dropped at once (recompute holds them again
     * before the backward) */
    if (s->list->recompute) hold(e, v, -1);
    return 0;
}

static int op_recompute(exec_t *e, const step_run *s, const schedule_op *op, int i)
{
    engine *g = e->engs[op->chunk];
    if (!g->ops->recompute)
        return pt_error_set("rank %d: the %s engine cannot recompute activations",
                            e->world_rank, g->ops->name);
    if (engine_recompute(g, s->base + op->microbatch, s->seed, s->step, i)) return -1;
    hold(e, op->chunk, 1);
    return 0;
}

/* SEND_ACT, SEND_GRAD: to the peer's chunk that receives it, as soon as the engine has
 * filled the buffer. */
static int op_send(exec_t *e, const step_run *s, const schedule_op *op)
{
    int grad = op->kind == SCHED_OP_SEND_GRAD;
    int m = op->microbatch, v = op->chunk, k = v * e->cfg.microbatches + m;
    engine *g = e->engs[v];
    int to = grad ? grad_receiver_chunk(e, v) : act_receiver_chunk(e, v);
    int count = (int)(e->mb * (grad ? g->in_count : g->out_count));
    if (exec_start_send(e, g, grad ? ENGINE_MSG_GRAD_OUT : ENGINE_MSG_ACT_OUT, s->base + m,
                        count, op->peer, chunk_tag(grad ? TAG_GRAD : TAG_ACT, m, to, e->V),
                        grad ? &e->req_send_grad[k] : &e->req_send_act[k]))
        return -1;
    exec_record_message(e, grad ? TRACE_SEND_GRAD : TRACE_SEND_ACT, s->t0, pt_now(), m, v,
                        op->peer, to);
    return 0;
}

/* The whole backward of m, or its part for bucket b (the layers of bucket b and those
 * without parameters above); after the last part the micro-batch's slot goes back. */
static int op_backward(exec_t *e, const step_run *s, const schedule_op *op, int i)
{
    int m = op->microbatch, b = s->base + m, v = op->chunk, lo, hi;
    engine *g = e->engs[v];
    if (exec_wait_send_buffer(e, v, m)) return -1;
    if (op->bucket >= 0) {
        if (part_range(e, v, op->bucket, b, &lo, &hi) || engine_backward_range(g, b, lo, hi, i))
            return -1;
        if (part_not_last(e, v, op->bucket)) return 0;
    } else if (whole_begins(e, v, b) || engine_backward(g, b, i)) {
        return -1;
    }
    return end_backward(e, v, m, b);
}

/* "B" of a split backward: the gradient of m's input only. */
static int op_backward_input(exec_t *e, const step_run *s, const schedule_op *op, int i)
{
    engine *g = e->engs[op->chunk];
    if (!g->ops->backward_input)
        return pt_error_set("rank %d: the %s engine has no split backward", e->world_rank,
                            g->ops->name);
    return exec_wait_send_buffer(e, op->chunk, op->microbatch) ||
           engine_backward_input(g, s->base + op->microbatch, i);
}

/* "W" of a split backward: m's parameter gradients (or bucket b's part of them). */
static int op_backward_weight(exec_t *e, const step_run *s, const schedule_op *op, int i)
{
    int m = op->microbatch, b = s->base + m, v = op->chunk, lo, hi;
    if (part_range(e, v, op->bucket, b, &lo, &hi) ||
        engine_backward_weight(e->engs[v], b, lo, hi, i))
        return -1;
    if (part_not_last(e, v, op->bucket)) return 0;
    return end_backward(e, v, m, b);
}

/* Once every gradient sent has left, the gradients' finish (the tied head, clipping:
 * exec_finish.c), then each chunk's optimizer step (through its replicas' reductions in
 * hybrid mode); each engine has ticks of its own. */
static int op_optimizer_step(exec_t *e, const step_run *s, int i)
{
    int M = e->cfg.microbatches;
    for (int q = 0; q < e->V * M; q++)
        if (exec_wait_send(e, &e->req_send_grad[q], "send of the gradient", q % M, e->rank - 1))
            return -1;
    if (e->cfg.post_validation) return exec_postval_step(e, s->opt, i);
    if (exec_finish_grads(e, s->opt)) return -1;
    return exec_step_engines(e, s->opt, i);
}

int exec_step_engines(exec_t *e, const optimizer_config *opt, int tick)
{
    for (int w = 0; w < e->V; w++) {
        replicas_t *r = e->reps ? e->reps[w] : NULL;
        if (r ? replicas_step(r, opt, tick) : engine_step(e->engs[w], opt, tick)) return -1;
    }
    return 0;
}

/* ALLREDUCE starts bucket b's reduction among the stage's replicas; REDUCE_WAIT posts the
 * pending sends first, then waits for it. */
static int op_reduce(exec_t *e, const schedule_op *op)
{
    int local;
    replicas_t *r = bucket_of(e, op->chunk, op->bucket, &local);
    if (!r) return -1;
    if (op->kind == SCHED_OP_ALLREDUCE) return replicas_start(r, local);
    if (exec_flush_sends(e) || replicas_wait(r, local)) return -1;
    return 0;
}

/* Instruction i of the list. */
static int run_op(exec_t *e, const step_run *s, const schedule_op *op, int i)
{
    switch (op->kind) {
    case SCHED_OP_RECV_ACT:
    case SCHED_OP_RECV_GRAD: return op_receive(e, s, op);
    case SCHED_OP_FORWARD: return op_forward(e, s, op, i);
    case SCHED_OP_RECOMPUTE: return op_recompute(e, s, op, i);
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_SEND_GRAD: return op_send(e, s, op);
    case SCHED_OP_BACKWARD: return op_backward(e, s, op, i);
    case SCHED_OP_BACKWARD_INPUT: return op_backward_input(e, s, op, i);
    case SCHED_OP_BACKWARD_WEIGHT: return op_backward_weight(e, s, op, i);
    case SCHED_OP_OPTIMIZER_STEP: return op_optimizer_step(e, s, i);
    case SCHED_OP_ALLREDUCE:
    case SCHED_OP_REDUCE_WAIT: return op_reduce(e, op);
    case SCHED_OP_COUNT:
        return pt_error_set("rank %d: instruction %s is not supported by this executor",
                            e->rank, schedule_op_name(op->kind));
    }
    return 0;
}

/* After the last instruction: the engines' results, the step's figures and trace, and the
 * loss shared by every rank (it lives on the last stages); a non-finite one stops everyone. */
static int finish_step(exec_t *e, const step_run *s, double t_step, exec_step_result *res)
{
    int rc = exec_postval_settle(e, s->opt, s->step);
    if (rc) return rc;
    engine_result r = {0};
    for (int v = 0; v < e->V; v++) {
        engine_result rv;
        if (engine_finish(e->engs[v], &rv)) return -1;
        exec_counted_once(e, &rv);
        r.loss_sum += rv.loss_sum;
        r.correct += rv.correct;
        r.nonfinite |= rv.nonfinite;
    }
    e->compute_s += account_ticks(e, s->list);
    for (int w = 0; e->reps && w < e->V; w++)
        if (e->reps[w]) replicas_end_step(e->reps[w]);
    exec_record_reductions(e);
    double t0 = pt_now();
    double sums[3] = {r.loss_sum, (double)r.correct, (double)r.nonfinite};
    if (mpi_wait_allreduce(sums, 3, MPI_DOUBLE, MPI_SUM, e->world, e->cfg.timeout_s)) return -1;
    exec_record(e, TRACE_SYNC, t0, pt_now(), -1, 0);
    e->wall_s += pt_now() - t_step;
    e->steps++;
    res->loss_sum = sums[0];
    res->correct = (long)sums[1];
    res->grad_norm = exec_finish_norm(e);
    if (sums[2] > 0) {
        pt_error_set("the loss is not finite (NaN or infinite) at step %llu: lower the "
                     "learning rate", (unsigned long long)s->step + 1);
        return EXEC_FAILED_EVERYWHERE;
    }
    return 0;
}

int exec_train_step(exec_t *e, const dataset *data, const int64_t *indices,
                    const dataset *next_data, const int64_t *next_indices, uint64_t seed,
                    uint64_t step, const optimizer_config *opt, exec_step_result *res)
{
    step_run s = {.list = &e->sched->lists[e->rank], .base = e->half * e->cfg.microbatches,
                  .seed = seed, .step = step, .opt = opt};
    double t_step = pt_now();
    e->trace_step = (long)step;
    int fault = e->cfg.stall_rank == e->world_rank && (long)step == e->cfg.stall_step &&
                fault_armed();
    if (fault && e->cfg.stall_kills != EXEC_STALL_MPI_ERROR)
        stall_forever(e->cfg.stall_kills == EXEC_STALL_KILL);
    if (exec_post_receives(e, s.base, 0)) return -1;
    if (fault && post_invalid_send(e)) return -1;
    /* this step's samples, unless the previous step loaded them (below) */
    if (!e->prefetched && load_samples(e, s.base, data, indices)) return -1;
    for (int i = 0; i < s.list->n_ops; i++) {
        s.t0 = pt_now();
        if (exec_progress_reductions(e) || run_op(e, &s, &s.list->ops[i], i) ||
            exec_post_receives(e, s.base, i + 1))
            return -1;
    }
    /* Everything of this step is queued (on a GPU it is still running): load the next
     * step's samples into the other half now. */
    e->half = 1 - e->half;
    e->prefetched = next_indices != NULL;
    if (next_indices &&
        load_samples(e, e->half * e->cfg.microbatches, next_data ? next_data : data,
                     next_indices))
        return -1;
    return finish_step(e, &s, t_step, res);
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
    st->rollbacks = e->rollbacks;
}

void exec_reset_stats(exec_t *e)
{
    e->compute_s = e->wall_s = e->forward_s = e->backward_s = e->optimizer_s = 0;
    e->tensor_s0 = 0;
    for (int v = 0; v < e->V; v++) e->tensor_s0 += e->engs[v]->tensor_s;
    e->steps = 0;
    e->rollbacks = 0;
    e->peak_inflight = 0;
    e->peak_bytes = e->held_bytes;
    memset(e->chunk_s, 0, (size_t)e->V * EXEC_TIMES * sizeof *e->chunk_s);
    for (int v = 0; e->reps && v < e->V; v++) replicas_reset_stats(e->reps[v]);
}
