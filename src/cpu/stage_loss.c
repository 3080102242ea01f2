/* The loss at the net's last layer (src/cpu/stage.h, stage_loss): softmax cross-entropy of
 * whole logits (kernel_softmax_xent_cpu), or of logits sharded by vocabulary over the
 * tensor group (Megatron's vocabulary-parallel cross-entropy). */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/cpu/stage.h"

/* An all-gather of `each` floats from every rank of the group into all, rank by rank. */
static int gather_rows(stage *s, const float *mine, float *all, size_t each)
{
    int T = s->plan.tp->T;
    size_t count[T];
    for (int r = 0; r < T; r++) count[r] = each;
    double t0 = pt_now();
    int rc = s->tp_comm.allgather(s->tp_comm.ctx, mine, all, count);
    s->tp_s += pt_now() - t0;
    if (rc) s->tp_failed = 1;
    return rc;
}

/* Each rank holds columns [first, first + V_r) of every row: the phases of
 * kernel_xent_shard_*_cpu around two all-gathers (each row's maximum and its first index on
 * each rank; then each rank's sum of exponentials against the row's and the target's
 * logit). Every rank computes the same loss, and its columns of the gradient. */
static double sharded_loss(stage *s, const float *y, float *dlogits, int *correct,
                           const int32_t *labels, int rows, float grad_scale)
{
    const stage_plan *p = &s->plan;
    int T = p->tp->T, V = p->net->classes, first, Vr;
    shard_cut(V, T, p->tp_rank, &first, &Vr);
    size_t R = (size_t)rows;
    float *mine = s->tp_loss, *all = mine + 3 * R, *ma = all + 3 * R * (size_t)T;
    kernel_xent_shard_max_cpu(mine, y, rows, Vr, first);
    if (gather_rows(s, mine, all, 2 * R)) return NAN;
    kernel_xent_shard_sums_cpu(mine, dlogits, ma, all, y, labels, rows, Vr, first, T);
    if (gather_rows(s, mine, all, 3 * R)) return NAN;
    return kernel_xent_shard_finish_cpu(dlogits, correct, all, ma, labels, rows, Vr, first, V,
                                        T, grad_scale);
}

int stage_loss_sharded(const stage *s)
{
    const stage_plan *p = &s->plan;
    return p->tp && p->tp->loss_sharded && p->last == p->net->n_layers;
}

size_t stage_loss_floats(const net_desc *net, int last, int max_batch, const shard_plan *tp)
{
    if (!tp || tp->T < 2 || !tp->loss_sharded || last != net->n_layers) return 0;
    /* per row: 3 of this rank's, 3 of each rank's, the maximum and its index */
    return (size_t)max_batch * (size_t)net->input.c * (5 + 3 * (size_t)tp->T);
}

double stage_loss(stage *s, const float *y, float *dlogits, int *correct,
                  const int32_t *labels, int rows, float grad_scale)
{
    if (!stage_loss_sharded(s))
        return kernel_softmax_xent_cpu(dlogits, correct, y, labels, rows, s->plan.net->classes,
                                       grad_scale);
    return sharded_loss(s, y, dlogits, correct, labels, rows, grad_scale);
}
