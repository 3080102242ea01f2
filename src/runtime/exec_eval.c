/* Evaluation: forward only, dropout off, over a data set in micro-batch chunks through the
 * pipeline, with the loss and accuracy of the whole set on every rank (per label: a
 * language model's per token). */
#include "src/runtime/exec_impl.h"

#include <stdint.h>

#include "src/base/clock.h"
#include "src/base/mpi_wait.h"

/* Samples in data chunk c of a share of `count` in chunks of mb: 0 past its end (ZeRO-3's
 * empty chunks, see exec_evaluate). */
static int chunk_size(int count, int mb, int c)
{
    int rest = count - c * mb;
    return rest < 0 ? 0 : rest < mb ? rest : mb;
}

/* Evaluation through V > 1 model chunks per rank: each data chunk goes through the rank's
 * chunks in order, receiving from the previous model chunk and sending to the next. Each
 * rank works through (data chunk, chunk) in that order and waits for a send only where
 * that needs nothing later in the order, so it cannot deadlock. A send to this rank itself
 * (a V placement's hand-over between its chunks) is waited for once its receive has been
 * posted, by the next chunk: MPI need not finish a send to oneself before that. */
static int evaluate_chunked(exec_t *e, const dataset *data, int64_t lo, int count,
                            int chunks, engine_result *r)
{
    int mb = e->mb, V = e->V;
    int64_t ids[mb];
    for (int c = 0; c < chunks; c++) {
        int n = chunk_size(count, mb, c), b = c % EVAL_BUFFERS;
        for (int j = 0; j < n; j++) ids[j] = lo + (int64_t)c * mb + j;
        for (int v = 0; v < V; v++) {
            engine *g = e->engs[v];
            int prev, next;
            if (engine_load(g, b, data, ids, n)) return -1;
            if (schedule_route_prev(e->sched, e->rank, v, &prev, NULL)) {
                if (exec_post_recv(e, g, ENGINE_MSG_ACT_IN, b, (int)(n * g->in_count), prev,
                                   chunk_tag(TAG_EVAL, c, v, V), &e->eval_recv[0]) ||
                    (prev == e->rank &&
                     exec_wait_send(e, &e->eval_send, "send of the evaluation activation", c,
                                    prev)) ||
                    exec_wait_request(e, &e->eval_recv[0], "the evaluation activation", c,
                                      prev) ||
                    engine_msg_received(g, ENGINE_MSG_ACT_IN, b))
                    return -1;
            }
            if (engine_forward(g, b, n, 0, 0, 0, -1)) return -1;
            if (schedule_route_next(e->sched, e->rank, v, &next, NULL)) {
                if (exec_start_send(e, g, ENGINE_MSG_ACT_OUT, b, (int)(n * g->out_count), next,
                                    chunk_tag(TAG_EVAL, c, act_receiver_chunk(e, v), V),
                                    &e->eval_send) ||
                    (next != e->rank &&
                     exec_wait_send(e, &e->eval_send, "send of the evaluation activation", c,
                                    next)))
                    return -1;
            }
            if (engine_release(g, b)) return -1;
        }
    }
    *r = (engine_result){0};
    for (int v = 0; v < V; v++) {
        engine_result rv;
        if (engine_finish(e->engs[v], &rv)) return -1;
        exec_counted_once(e, &rv);
        r->loss_sum += rv.loss_sum;
        r->correct += rv.correct;
    }
    return 0;
}

/* Evaluation through one model chunk per rank: chunk c of the data in buffer c mod 3. The
 * next chunk's receive is posted before this chunk's compute, into a buffer whose forward
 * (c − 2) a GPU has most likely finished, so the host need not wait for it. */
static int evaluate_pipeline(exec_t *e, const dataset *data, int64_t lo, int count,
                             int chunks, engine_result *r)
{
    int mb = e->mb, last = e->rank == e->size - 1, first = e->rank == 0;
    engine *g = e->eng;
    int64_t ids[mb];
    int in_floats = (int)(mb * e->in_count);
    if (!first && chunks > 0 &&
        exec_post_recv(e, g, ENGINE_MSG_ACT_IN, 0, in_floats, e->rank - 1, tag_of(TAG_EVAL, 0),
                       &e->eval_recv[0]))
        return -1;
    for (int c = 0; c < chunks; c++) {
        int n = chunk_size(count, mb, c);
        int m = c % EVAL_BUFFERS, next = (c + 1) % EVAL_BUFFERS,
            prev = (c + EVAL_BUFFERS - 1) % EVAL_BUFFERS;
        for (int j = 0; j < n; j++) ids[j] = lo + (int64_t)c * mb + j;
        /* the previous chunk's output (which may alias its input buffer, when every layer
         * of the stage is the identity) must be gone before its buffers are reused */
        if (c > 0 && !last) {
            if (exec_wait_send(e, &e->eval_send, "send of the evaluation activation", c - 1,
                               e->rank + 1))
                return -1;
            if (engine_release(g, prev)) return -1;
        }
        if (engine_load(g, m, data, ids, n)) return -1;
        if (!first) {
            if (exec_wait_request(e, &e->eval_recv[m], "the evaluation activation", c,
                                  e->rank - 1))
                return -1;
            if (engine_msg_received(g, ENGINE_MSG_ACT_IN, m)) return -1;
            if (c + 1 < chunks &&
                exec_post_recv(e, g, ENGINE_MSG_ACT_IN, next, in_floats, e->rank - 1,
                               tag_of(TAG_EVAL, c + 1), &e->eval_recv[next]))
                return -1;
        }
        if (engine_forward(g, m, n, 0, 0, 0, -1)) return -1;
        if (last) {
            if (engine_release(g, m)) return -1;
        } else if (exec_start_send(e, g, ENGINE_MSG_ACT_OUT, m, (int)(n * e->out_count),
                                   e->rank + 1, tag_of(TAG_EVAL, c), &e->eval_send)) {
            return -1;
        }
    }
    if (!last && chunks > 0) {
        if (exec_wait_send(e, &e->eval_send, "send of the evaluation activation", chunks - 1,
                           e->rank + 1))
            return -1;
        if (engine_release(g, (chunks - 1) % EVAL_BUFFERS)) return -1;
    }
    if (engine_finish(g, r)) return -1;
    exec_counted_once(e, r);
    return 0;
}

int exec_evaluate(exec_t *e, const dataset *data, double *loss, double *accuracy)
{
    /* this replica's share of the set */
    int64_t lo = (int64_t)data->count * e->replica / e->replicas,
            hi = (int64_t)data->count * (e->replica + 1) / e->replicas;
    int count = (int)(hi - lo), chunks = (count + e->mb - 1) / e->mb;
    /* ZeRO-3 gathers each layer's parameters before its forward, a collective of the
     * stage's replicas: every replica runs as many forwards as the one with the largest
     * share (ceil(count / R) samples), the others ending on empty chunks */
    if (e->cfg.rep.zero >= 3) {
        int most = (int)((data->count + e->replicas - 1) / e->replicas);
        chunks = (most + e->mb - 1) / e->mb;
    }
    double t_start = pt_now();
    e->prefetched = 0; /* evaluation reuses the first buffers */
    /* the tensor collectives of evaluation are no training time: left out of the stats */
    double tensor_before = 0, tensor_after = 0;
    for (int v = 0; v < e->V; v++) tensor_before += e->engs[v]->tensor_s;
    engine_result r;
    int rc = e->V > 1 ? evaluate_chunked(e, data, lo, count, chunks, &r)
                      : evaluate_pipeline(e, data, lo, count, chunks, &r);
    for (int v = 0; v < e->V; v++) tensor_after += e->engs[v]->tensor_s;
    e->tensor_s0 += tensor_after - tensor_before;
    if (rc) return -1;
    exec_record(e, TRACE_EVAL, t_start, pt_now(), -1, 0);
    double sums[2] = {r.loss_sum, (double)r.correct};
    if (mpi_wait_allreduce(sums, 2, MPI_DOUBLE, MPI_SUM, e->world, e->cfg.timeout_s)) return -1;
    /* per label: a language model's mean is over its windows' every token */
    double labels = (double)data->count * data_model_labels(e->net);
    *loss = data->count ? sums[0] / labels : 0;
    *accuracy = data->count ? sums[1] / labels : 0;
    return 0;
}
