/* The executor's point-to-point messages: receives posted into the engines' buffers, sends
 * posted in order once the engine has filled their buffers, and the polite waits for both,
 * during which the rank keeps its own sends and its replicas' reductions moving. */
#include "src/runtime/exec_impl.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"

int exec_progress_reductions(exec_t *e)
{
    for (int v = 0; e->reps && v < e->V; v++)
        if (e->reps[v] && replicas_progress(e->reps[v])) return -1;
    return 0;
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

/* What a waiting rank keeps doing (mpi_wait_progress_fn): it posts its pending sends, for
 * a peer may be waiting for one of them before it can answer, and moves its replicas'
 * reductions on. */
static int keep_progressing(void *ctx)
{
    exec_t *e = ctx;
    if (e->n_pending && progress_sends(e)) return -1;
    return exec_progress_reductions(e);
}

int exec_wait_request(exec_t *e, MPI_Request *req, const char *what, int m, int peer)
{
    if (*req == MPI_REQUEST_NULL) return 0;
    int timed_out = 0;
    if (mpi_wait_test(req, e->cfg.timeout_s, keep_progressing, e, &timed_out)) return -1;
    if (timed_out)
        return pt_error_set("rank %d (%s, stage %d): no progress for %g s waiting for %s "
                                "of micro-batch %d %s stage %d (--timeout); a peer has died or "
                                "stalled", e->world_rank, e->host, e->rank, e->cfg.timeout_s,
                                what, m, strncmp(what, "send", 4) ? "from" : "to", peer);
    return 0;
}

int exec_post_recv(exec_t *e, engine *g, engine_msg kind, int b, int count, int peer, int tag,
                   MPI_Request *req)
{
    void *buf = engine_msg_buffer(g, kind, b);
    if (!buf) return -1;
    PT_MPI_CHECK(MPI_Irecv(buf, count, MPI_FLOAT, peer, tag, e->comm, req));
    return 0;
}

static int is_receive(schedule_op_kind k)
{
    return k == SCHED_OP_RECV_ACT || k == SCHED_OP_RECV_GRAD;
}

_Static_assert(SCHED_W_READS_ACT == 1 && SCHED_W_READS_GRAD == 2,
               "layer_stage_w_reads returns schedule_receive_buffers' w_reads bits");

/* The op after which receive op is posted: after[v][act | grad][m] (−1: the step's start). */
static int posted_after(const schedule_op *op, const int *after, int M)
{
    return after[(op->chunk * 2 + (op->kind == SCHED_OP_RECV_GRAD)) * M + op->microbatch];
}

int exec_plan_receives(exec_t *e, const partition *part, int *n_recv)
{
    const schedule_list *l = &e->sched->lists[e->rank];
    int M = e->cfg.microbatches, V = e->V, n = l->n_ops;
    int lazy = e->cfg.device != ENGINE_CUDA;
    int sharded = e->cfg.shard && e->cfg.shard->T > 1;
    int *after = malloc((size_t)V * 2 * M * sizeof *after); /* [v][act | grad][m] */
    e->recv_at = calloc((size_t)n + 2, sizeof *e->recv_at);
    e->recv_ops = malloc(((size_t)n + 1) * sizeof *e->recv_ops);
    if (!after || !e->recv_at || !e->recv_ops) {
        free(after);
        return pt_error_set("out of memory");
    }
    for (int v = 0; v < V; v++) {
        int c = schedule_model_chunk(e->sched, e->rank, v);
        int w_reads = layer_stage_w_reads(e->net, part->first[c], part->first[c + 1], sharded);
        n_recv[2 * v] = n_recv[2 * v + 1] = 0;
        for (int m = 0; m < 2 * M; m++) after[v * 2 * M + m] = -1;
        if (lazy && schedule_receive_buffers(e->sched, e->rank, v,
                                             schedule_least_receive_buffers(e->sched), w_reads,
                                             n_recv + 2 * v, after + v * 2 * M)) {
            free(after);
            return -1;
        }
    }
    /* counting sort of the RECV ops by the slot they are posted in */
    for (int i = 0; i < n; i++)
        if (is_receive(l->ops[i].kind)) e->recv_at[posted_after(&l->ops[i], after, M) + 2]++;
    for (int k = 1; k < n + 2; k++) e->recv_at[k] += e->recv_at[k - 1];
    for (int i = 0; i < n; i++)
        if (is_receive(l->ops[i].kind))
            e->recv_ops[e->recv_at[posted_after(&l->ops[i], after, M) + 1]++] = i;
    /* the fill advanced each slot's start to the next one's: back by one slot */
    for (int k = n + 1; k > 0; k--) e->recv_at[k] = e->recv_at[k - 1];
    e->recv_at[0] = 0;
    free(after);
    return 0;
}

int exec_plan_sends(exec_t *e)
{
    int K = e->sched->stages, V = e->V, M = e->cfg.microbatches;
    e->send_n = malloc((size_t)V * sizeof *e->send_n);
    int *all = malloc((size_t)K * V * sizeof *all);
    int rc = e->send_n && all ? 0 : pt_error_set("out of memory");
    if (!rc && e->cfg.device != ENGINE_CUDA) rc = schedule_send_buffers(e->sched, 1, all);
    for (int v = 0; !rc && v < V; v++)
        e->send_n[v] = e->cfg.device == ENGINE_CUDA ? M : all[e->rank * V + v];
    free(all);
    return rc;
}

int exec_wait_send_buffer(exec_t *e, int v, int m)
{
    int n = e->send_n[v], to;
    if (m < n || !schedule_route_prev(e->sched, e->rank, v, &to, NULL)) return 0;
    return exec_wait_send(e, &e->req_send_grad[v * e->cfg.microbatches + m - n],
                          "send of the gradient", m - n, to);
}

int exec_post_receives(exec_t *e, int base, int slot)
{
    const schedule_list *l = &e->sched->lists[e->rank];
    int M = e->cfg.microbatches, V = e->V;
    for (int k = e->recv_at[slot]; k < e->recv_at[slot + 1]; k++) {
        const schedule_op *op = &l->ops[e->recv_ops[k]];
        int m = op->microbatch, v = op->chunk, grad = op->kind == SCHED_OP_RECV_GRAD;
        engine *g = e->engs[v];
        if (exec_post_recv(e, g, grad ? ENGINE_MSG_GRAD_IN : ENGINE_MSG_ACT_IN, base + m,
                           (int)(e->mb * (grad ? g->out_count : g->in_count)), op->peer,
                           chunk_tag(grad ? TAG_GRAD : TAG_ACT, m, v, V),
                           grad ? &e->req_grad[v * M + m] : &e->req_act[v * M + m]))
            return -1;
    }
    return 0;
}

int exec_start_send(exec_t *e, engine *g, engine_msg kind, int m, int count, int peer, int tag,
                    MPI_Request *req)
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

int exec_wait_send(exec_t *e, MPI_Request *req, const char *what, int m, int peer)
{
    double t0 = pt_now();
    while (is_pending(e, req)) {
        if (progress_sends(e)) return -1;
        if (!is_pending(e, req)) break;
        if (pt_now() - t0 > e->cfg.timeout_s)
            return pt_error_set("rank %d (%s, stage %d): no progress for %g s: the %s of "
                                "micro-batch %d never became ready (--timeout)", e->world_rank,
                                e->host, e->rank, e->cfg.timeout_s, what, m);
        mpi_wait_pause();
    }
    return exec_wait_request(e, req, what, m, peer);
}

int exec_flush_sends(exec_t *e)
{
    double t0 = pt_now();
    while (e->n_pending) {
        if (progress_sends(e) || exec_progress_reductions(e)) return -1;
        if (!e->n_pending) break;
        if (pt_now() - t0 > e->cfg.timeout_s)
            return pt_error_set("rank %d (%s, stage %d): no progress for %g s: a send never "
                                "became ready (--timeout)", e->world_rank, e->host, e->rank,
                                e->cfg.timeout_s);
        mpi_wait_pause();
    }
    return 0;
}
