/* The CPU stage's side of sequence parallelism (src/model/shard.h): the reduce-scatters of
 * the tensor runs (stage_tensor_ops, src/engine/stage_plan.h), and the carried gradient's
 * rows all-gathered or reduce-scattered between a block's backward phases. */
#include <string.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/cpu/stage.h"
#include "src/cpu/stage_impl.h"

/* n rows of `whole` partial sums at in, packed rank block by rank block into tp_buf (rank
 * r's values of every row, rows in order), reduce-scattered: this rank's summed block, n
 * rows of its slice, at out (which may be in, packed already). */
int stage_tp_reduce_scatter(void *self, const shard_state *st, size_t whole, const float *in,
                            float *out, int n)
{
    stage *s = ((stage_pass *)self)->s;
    int T = s->plan.tp->T;
    size_t count[T], off[T], len[T];
    stage_tensor_counts(&s->plan, st, whole, n, count, off, len);
    float *blk = s->tp_buf;
    for (int r = 0; r < T; blk += count[r], r++)
        for (int j = 0; j < n; j++)
            memcpy(blk + (size_t)j * len[r], in + (size_t)j * whole + off[r],
                   len[r] * sizeof(float));
    double t0 = pt_now();
    int rc = s->tp_comm.reduce_scatter
                 ? s->tp_comm.reduce_scatter(s->tp_comm.ctx, s->tp_buf, out, count)
                 : pt_error_set("stage: no reduce-scatter for sequence parallelism");
    s->tp_s += pt_now() - t0;
    if (rc) s->tp_failed = 1;
    return rc;
}

/* Row j of `width` values of the carry: chunks of the micro-batch keep their rows at
 * off · widest. */
static float *carry_row(const stage *s, int chunk, int j, size_t width)
{
    int off = j / chunk * chunk;
    return s->carry + (size_t)off * s->plan.widest + (size_t)(j - off) * width;
}

int stage_tp_seq_carry(void *self, const shard_state *st, size_t whole, int n, int gather)
{
    stage *s = ((stage_pass *)self)->s;
    int chunk = stage_chunk(s, n);
    size_t off, mine;
    shard_values(st, whole, s->plan.tp->T, s->plan.tp_rank, &off, &mine);
    if (gather) { /* slices packed, all-gathered, whole rows back */
        for (int j = 0; j < n; j++)
            memcpy(s->tp_seq + (size_t)j * mine, carry_row(s, chunk, j, mine), mine * sizeof(float));
        if (stage_tp_gather(self, st, whole, s->tp_seq, s->tp_din, n)) return -1;
        for (int j = 0; j < n; j++)
            memcpy(carry_row(s, chunk, j, whole), s->tp_din + (size_t)j * whole,
                   whole * sizeof(float));
        return 0;
    }
    for (int j = 0; j < n; j++)
        memcpy(s->tp_seq + (size_t)j * whole, carry_row(s, chunk, j, whole), whole * sizeof(float));
    if (stage_tp_reduce_scatter(self, st, whole, s->tp_seq, s->tp_seq, n)) return -1;
    for (int j = 0; j < n; j++)
        memcpy(carry_row(s, chunk, j, mine), s->tp_seq + (size_t)j * mine, mine * sizeof(float));
    return 0;
}
