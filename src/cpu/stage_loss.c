/* The loss at the net's last layer (src/cpu/stage.h, stage_loss): softmax cross-entropy of
 * whole logits (kernel_softmax_xent_cpu), or of logits sharded by vocabulary over the
 * tensor group (Megatron's vocabulary-parallel cross-entropy). */
#include <math.h>
#include <string.h>

#include "kernels/fastmath.h"
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

/* Each rank holds columns [first, first + V_r) of every row. Two all-gathers: each row's
 * maximum and its first index on each rank (the whole row's are the largest, the first
 * rank's on a tie: the whole kernel's first argmax); then, against that maximum, each
 * rank's sum of exponentials in double (sent as two floats, summed again in double in
 * rank order) and the target's logit (0 where another rank holds it). Every rank then
 * computes the same loss, and its columns of the gradient, as kernel_softmax_xent_cpu
 * does for a whole row (the sums of exponentials are cut, so not bit for bit). */
static double sharded_loss(stage *s, const float *y, float *dlogits, int *correct,
                           const int32_t *labels, int rows, float grad_scale)
{
    const stage_plan *p = &s->plan;
    int T = p->tp->T, V = p->net->classes, first, Vr;
    shard_cut(V, T, p->tp_rank, &first, &Vr);
    size_t R = (size_t)rows;
    float *mine = s->tp_loss, *all = mine + 3 * R, *M = all + 3 * R * (size_t)T, *A = M + R;
    for (size_t i = 0; i < R; i++) {
        const float *x = y + i * (size_t)Vr;
        int best = 0;
        for (int j = 1; j < Vr; j++)
            if (x[j] > x[best]) best = j;
        mine[2 * i] = x[best];
        mine[2 * i + 1] = (float)(first + best); /* exact: V ≤ 2^24 */
    }
    if (gather_rows(s, mine, all, 2 * R)) return NAN;
    for (size_t i = 0; i < R; i++) {
        M[i] = all[2 * i];
        A[i] = all[2 * i + 1];
        for (int r = 1; r < T; r++)
            if (all[r * 2 * R + 2 * i] > M[i]) {
                M[i] = all[r * 2 * R + 2 * i];
                A[i] = all[r * 2 * R + 2 * i + 1];
            }
    }
    for (size_t i = 0; i < R; i++) {
        const float *x = y + i * (size_t)Vr;
        float *d = dlogits ? dlogits + i * (size_t)Vr : NULL;
        double sum = 0.0;
        for (int j = 0; j < Vr; j++) {
            float e = fastmath_expf(x[j] - M[i]);
            if (d) d[j] = e;
            sum += e;
        }
        int32_t k = labels[i] - first;
        mine[3 * i] = (float)sum;
        mine[3 * i + 1] = (float)(sum - (double)(float)sum);
        mine[3 * i + 2] = k >= 0 && k < Vr ? x[k] : 0.0f;
    }
    if (gather_rows(s, mine, all, 3 * R)) return NAN;
    double loss = 0.0;
    int right = 0;
    for (size_t i = 0; i < R; i++) {
        double sum = 0.0, target = 0.0;
        for (int r = 0; r < T; r++) {
            const float *q = all + (size_t)r * 3 * R + 3 * i;
            sum += (double)q[0] + (double)q[1];
            target += (double)q[2];
        }
        int32_t label = labels[i];
        right += (float)label == A[i];
        if (dlogits) {
            float *d = dlogits + i * (size_t)Vr;
            const float inv = (float)(1.0 / sum);
            for (int j = 0; j < Vr; j++)
                d[j] = (d[j] * inv - (first + j == label ? 1.0f : 0.0f)) * grad_scale;
        }
        /* a label outside [0, V) has no loss: NaN, as the whole kernel */
        if (label < 0 || label >= V) loss = NAN;
        else loss += log(sum) - (target - (double)M[i]);
    }
    if (correct) *correct = right;
    return loss;
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
