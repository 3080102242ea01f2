/* Receive buffers by liveness (schedule_receive_buffers in schedule.h). */
#include <stdlib.h>

#include "schedule/schedule.h"
#include "src/base/error.h"

/* Whether op reads the buffer an activation (act) or a gradient (!act) was received into:
 * its receive, and what computes with it; W only where w_reads says so. */
static int reads_buffer(schedule_op_kind k, int act, int w_reads)
{
    switch (k) {
    case SCHED_OP_RECV_ACT: return act;
    case SCHED_OP_RECV_GRAD: return !act;
    case SCHED_OP_FORWARD:
    case SCHED_OP_RECOMPUTE: return act;
    case SCHED_OP_BACKWARD:
    case SCHED_OP_BACKWARD_INPUT: return 1;
    case SCHED_OP_BACKWARD_WEIGHT:
        return (w_reads & (act ? SCHED_W_READS_ACT : SCHED_W_READS_GRAD)) != 0;
    default: return 0;
    }
}

/* Whether n buffers of kind k suffice: for every m ≥ n, m − n's last read comes before m's
 * receive. */
static int enough(const int *last, const int *recv, int M, int n)
{
    for (int m = n; m < M; m++)
        if (recv[m] >= 0 && last[m - n] >= recv[m]) return 0;
    return 1;
}

int schedule_receive_buffers(const schedule *s, int stage, int chunk, int least, int w_reads,
                             int *n, int *post_after)
{
    const schedule_list *l = &s->lists[stage];
    int M = s->microbatches;
    int *last = malloc((size_t)M * 4 * sizeof *last); /* [act | grad] each */
    if (!last) return pt_error_set("out of memory");
    int *recv = last + 2 * M;
    for (int m = 0; m < 2 * M; m++) last[m] = recv[m] = -1;
    /* the net's last chunk: its forward writes the loss gradient where a gradient is received */
    int V = s->virtual_stages > 1 ? s->virtual_stages : 1;
    int ends = schedule_model_chunk(s, stage, chunk) == s->stages * V - 1;
    for (int i = 0; i < l->n_ops; i++) {
        const schedule_op *op = &l->ops[i];
        if (op->chunk != chunk || op->microbatch < 0 || op->microbatch >= M) continue;
        for (int k = 0; k < 2; k++) {
            int m = k * M + op->microbatch;
            if (reads_buffer(op->kind, !k, w_reads) && i > last[m]) last[m] = i;
        }
        if (op->kind == SCHED_OP_RECV_ACT) recv[op->microbatch] = i;
        if (op->kind == SCHED_OP_RECV_GRAD || (op->kind == SCHED_OP_FORWARD && ends &&
                                               recv[M + op->microbatch] < 0))
            recv[M + op->microbatch] = i;
    }
    for (int k = 0; k < 2; k++) {
        int nk = k == 0 && least > 1 ? least : 1;
        while (nk < M && !enough(last + k * M, recv + k * M, M, nk)) nk++;
        n[k] = nk;
        for (int m = 0; post_after && m < M; m++)
            post_after[k * M + m] = m < nk ? -1 : last[k * M + m - nk];
    }
    free(last);
    return 0;
}

/* ---- gradient send buffers (schedule_send_buffers) ---- */

typedef struct {
    const schedule *s;
    int K, V, M;
    int *first;  /* [kind][K][V][M] index of the first SEND_ACT, SEND_GRAD, RECV_GRAD and
                    backward (whole or B) of (stage, chunk, m); −1: none */
    int **hb;    /* [K] per op, K entries: the last op of each stage that happens before it
                    (program order, and each receive after its send); −1: none */
} send_ctx;

enum { SEND_ACT_AT, SEND_GRAD_AT, RECV_GRAD_AT, BACKWARD_AT, N_AT };

static int *first_at(const send_ctx *c, int what, int st, int v, int m)
{
    return c->first + (((size_t)what * c->K + st) * c->V + v) * c->M + m;
}

static void index_ops(send_ctx *c)
{
    for (int st = 0; st < c->K; st++) {
        const schedule_list *l = &c->s->lists[st];
        for (int i = l->n_ops - 1; i >= 0; i--) {
            const schedule_op *op = &l->ops[i];
            int m = op->microbatch, v = op->chunk, what = -1;
            if (m < 0 || m >= c->M || v < 0 || v >= c->V) continue;
            switch (op->kind) {
            case SCHED_OP_SEND_ACT: what = SEND_ACT_AT; break;
            case SCHED_OP_SEND_GRAD: what = SEND_GRAD_AT; break;
            case SCHED_OP_RECV_GRAD: what = RECV_GRAD_AT; break;
            case SCHED_OP_BACKWARD:
            case SCHED_OP_BACKWARD_INPUT: what = BACKWARD_AT; break;
            default: break;
            }
            if (what >= 0) *first_at(c, what, st, v, m) = i;
        }
    }
}

/* The send a receive op waits for: its index on the sending stage, −1 when none. */
static int send_of(const send_ctx *c, int st, const schedule_op *op, int *from)
{
    int grad = op->kind == SCHED_OP_RECV_GRAD, pv = -1;
    *from = -1;
    if (grad ? !schedule_route_next(c->s, st, op->chunk, from, &pv)
             : !schedule_route_prev(c->s, st, op->chunk, from, &pv))
        return -1;
    return *from < 0 ? -1 : *first_at(c, grad ? SEND_GRAD_AT : SEND_ACT_AT, *from, pv,
                                      op->microbatch);
}

/* Fills c->hb by running the lists as the verifier does (a receive passes once its send
 * has run). */
static int happens_before(send_ctx *c)
{
    int K = c->K, rc = 0;
    int *pc = K > 0 ? calloc((size_t)K, sizeof *pc) : NULL;
    if (!pc) return pt_error_set("schedule: out of memory (or no stages)");
    for (int st = 0; st < K && !rc; st++)
        if (!(c->hb[st] = malloc(((size_t)c->s->lists[st].n_ops + 1) * K * sizeof **c->hb)))
            rc = pt_error_set("out of memory");
    for (int progress = 1; progress && !rc;) {
        progress = 0;
        for (int st = 0; st < K; st++) {
            const schedule_list *l = &c->s->lists[st];
            while (pc[st] < l->n_ops) {
                int i = pc[st], *v = c->hb[st] + (size_t)i * K, from = -1, sent = -1;
                const schedule_op *op = &l->ops[i];
                if (op->kind == SCHED_OP_RECV_ACT || op->kind == SCHED_OP_RECV_GRAD) {
                    sent = send_of(c, st, op, &from);
                    if (sent >= 0 && pc[from] <= sent) break;
                }
                for (int q = 0; q < K; q++) v[q] = i ? v[q - K] : -1;
                for (int q = 0; sent >= 0 && q < K; q++) {
                    int w = c->hb[from][(size_t)sent * K + q];
                    if (w > v[q]) v[q] = w;
                }
                v[st] = i;
                pc[st]++;
                progress = 1;
            }
        }
    }
    for (int st = 0; st < K && !rc; st++)
        if (pc[st] < c->s->lists[st].n_ops)
            rc = pt_error_set("schedule '%s': stage %d cannot run past op %d", c->s->name, st,
                              pc[st]);
    free(pc);
    return rc;
}

/* Whether chunk v of stage st may send its gradients from n buffers: for every m ≥ n the
 * receiver's RECV of m − n happens before st's first backward of m. */
static int sends_fit(const send_ctx *c, int st, int v, int to, int tv, int n)
{
    for (int m = n; m < c->M; m++) {
        int b = *first_at(c, BACKWARD_AT, st, v, m);
        int r = *first_at(c, RECV_GRAD_AT, to, tv, m - n);
        if (b >= 0 && r >= 0 && c->hb[st][(size_t)b * c->K + to] < r) return 0;
    }
    return 1;
}

int schedule_send_buffers(const schedule *s, int least, int *n_out)
{
    int K = s->stages, V = s->virtual_stages > 1 ? s->virtual_stages : 1, M = s->microbatches;
    send_ctx c = {.s = s, .K = K, .V = V, .M = M};
    size_t n_first = (size_t)N_AT * K * V * M;
    c.first = malloc(n_first * sizeof *c.first);
    c.hb = calloc((size_t)K, sizeof *c.hb);
    int rc = c.first && c.hb ? 0 : pt_error_set("out of memory");
    for (size_t k = 0; !rc && k < n_first; k++) c.first[k] = -1;
    if (!rc) index_ops(&c);
    rc = rc || happens_before(&c);
    for (int st = 0; st < K && !rc; st++)
        for (int v = 0; v < V; v++) {
            int to, tv, n = least < 1 ? 1 : least;
            /* (a chunk's gradient to the chunk before on the same rank is a message too:
             * its receive must then come earlier in the rank's own list) */
            if (schedule_route_prev(s, st, v, &to, &tv))
                while (n < M && !sends_fit(&c, st, v, to, tv, n)) n++;
            n_out[st * V + v] = n < M ? n : M;
        }
    for (int st = 0; c.hb && st < K; st++) free(c.hb[st]);
    free(c.hb);
    free(c.first);
    return rc ? -1 : 0;
}
