/* The CPU stage's side of the tensor runs' collectives (stage_tensor_ops,
 * src/engine/stage_plan.h): the all-reduce, the all-gather into whole rows, slices, an
 * input-split layer's bias and activation after its all-reduce, and the carried gradient's
 * all-reduce. Sequence parallelism's are stage_seq.c's. */
#include <string.h>

#include "src/base/clock.h"
#include "src/cpu/pool.h"
#include "src/cpu/stage.h"
#include "src/cpu/stage_impl.h"
#include "src/engine/layer_ops.h"

int stage_tp_allreduce(void *self, float *buf, size_t n)
{
    stage *s = ((stage_pass *)self)->s;
    double t0 = pt_now();
    int rc = s->tp_comm.allreduce(s->tp_comm.ctx, buf, n);
    s->tp_s += pt_now() - t0;
    if (rc) s->tp_failed = 1;
    return rc;
}

int stage_tp_gather(void *self, const shard_state *st, size_t whole, const float *local,
                    float *out, int n)
{
    stage *s = ((stage_pass *)self)->s;
    int T = s->plan.tp->T;
    size_t count[T], off[T], len[T];
    stage_tensor_counts(&s->plan, st, whole, n, count, off, len);
    double t0 = pt_now();
    int rc = s->tp_comm.allgather(s->tp_comm.ctx, local, s->tp_buf, count);
    s->tp_s += pt_now() - t0;
    if (rc) {
        s->tp_failed = 1;
        return rc;
    }
    const float *blk = s->tp_buf;
    for (int r = 0; r < T; blk += count[r], r++)
        for (int j = 0; j < n; j++)
            memcpy(out + (size_t)j * whole + off[r], blk + (size_t)j * len[r],
                   len[r] * sizeof(float));
    return 0;
}

int stage_tp_slice(void *self, const float *in, size_t whole, size_t from, size_t keep,
                    float *out, int n)
{
    for (int j = 0; j < n; j++)
        memcpy(out + (size_t)j * keep, in + (size_t)j * whole + from, keep * sizeof(float));
    return 0;
}

/* A layer split by inputs after its all-reduce: bias, then activation, sample by sample
 * (each sample's row stays in cache between the two), the samples dealt to the threads. */
typedef struct {
    const stage *s;
    int i, n;
    float *y;
} finish_job;

static void finish_worker(void *arg, int t)
{
    const finish_job *j = arg;
    const stage *s = j->s;
    const layer_desc *L = &s->plan.loc[j->i];
    size_t count = layer_shape_count(L->out);
    size_t per = L->type == LAYER_CONV ? (size_t)L->out.h * L->out.w : 1;
    const float *b = s->params + s->plan.param_off[j->i] + L->weight_count;
    int lo = (int)((long)j->n * t / s->threads), hi = (int)((long)j->n * (t + 1) / s->threads);
    for (int m = lo; m < hi; m++) {
        float *row = j->y + (size_t)m * count;
        for (size_t u = 0; u < count / per; u++) {
            float *v = row + u * per;
            for (size_t k = 0; k < per; k++) v[k] += b[u];
        }
        kernel_activation_forward_cpu(row, row, count, L->activation);
    }
}

int stage_tp_finish(void *self, int i, float *y, int n)
{
    stage *s = ((stage_pass *)self)->s;
    finish_job j = {.s = s, .i = i, .n = n, .y = y};
    pool_run(s->pool, finish_worker, &j);
    return 0;
}

/* The carried gradient at a layer's input (chunks at off · widest, each its rows of
 * `count`) packed into tp_buf's n contiguous rows, all-reduced, and back: rows of `keep`
 * values from `from` of each packed row (a slice, or the whole row). */
int stage_tp_reduce_carry(void *self, int b, size_t count, size_t from, size_t keep, int n)
{
    stage *s = ((stage_pass *)self)->s;
    int chunk = stage_chunk(s, n);
    size_t wide = s->plan.widest;
    for (int off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        memcpy(s->tp_buf + (size_t)off * count, s->carry + (size_t)off * wide,
               (size_t)m * count * sizeof(float));
    }
    if (stage_tp_allreduce(self, s->tp_buf, (size_t)n * count)) return -1;
    for (int j = 0; j < n; j++) {
        int off = j / chunk * chunk;
        memcpy(s->carry + (size_t)off * wide + (size_t)(j - off) * keep,
               s->tp_buf + (size_t)j * count + from, keep * sizeof(float));
    }
    return 0;
}
