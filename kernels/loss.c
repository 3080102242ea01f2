/* Softmax cross-entropy, as F.cross_entropy with the batch mean expressed by grad_scale. */
#include "kernels/kernels.h"
#include "kernels/fastmath.h"

#include <math.h>

double kernel_softmax_xent_cpu(float *dlogits, int *correct, const float *logits,
                               const int32_t *labels, int n, int classes, float grad_scale)
{
    double loss = 0.0;
    int right = 0;
    for (int i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * classes;
        const int32_t label = labels[i];
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (x[j] > x[best])
                best = j;
        const float mx = x[best];
        const int valid = label >= 0 && label < classes;
        /* Read before dlogits is written, so dlogits may be the logits' own storage. */
        const double x_label = valid ? (double)x[label] : 0.0;
        right += best == label;
        /* Subtracting the row maximum keeps every exponent ≤ 0: no overflow, and the largest
         * term is exactly 1, so the sum is ≥ 1 and its logarithm well conditioned. The terms
         * go through dlogits (when given) so exp is evaluated once per logit. */
        double sum = 0.0;
        if (dlogits) {
            float *d = dlogits + (size_t)i * classes;
            for (int j = 0; j < classes; j++)
                d[j] = fastmath_expf(x[j] - mx);
            for (int j = 0; j < classes; j++)
                sum += d[j];
            const float inv = (float)(1.0 / sum);
            for (int j = 0; j < classes; j++)
                d[j] = (d[j] * inv - (j == label ? 1.0f : 0.0f)) * grad_scale;
        } else {
            for (int j = 0; j < classes; j++)
                sum += fastmath_expf(x[j] - mx);
        }
        /* A label outside [0, classes) has no loss: report NaN rather than read out of
         * bounds (kernels have no error channel; the data loader validates labels). */
        if (!valid)
            loss = NAN;
        else
            loss += log(sum) - (x_label - (double)mx);
    }
    if (correct)
        *correct = right;
    return loss;
}

/* ---- the vocabulary-parallel cross-entropy's three phases (kernels.h) ---- */

void kernel_xent_shard_max_cpu(float *mine, const float *logits, int rows, int Vr, int first)
{
    for (int i = 0; i < rows; i++) {
        const float *x = logits + (size_t)i * Vr;
        int best = 0;
        for (int j = 1; j < Vr; j++)
            if (x[j] > x[best]) best = j;
        mine[2 * i] = x[best];
        mine[2 * i + 1] = (float)(first + best); /* exact: V ≤ 2^24 */
    }
}

void kernel_xent_shard_sums_cpu(float *mine, float *dlogits, float *ma, const float *all,
                                const float *logits, const int32_t *labels, int rows, int Vr,
                                int first, int T)
{
    for (int i = 0; i < rows; i++) {
        float M = all[2 * i], A = all[2 * i + 1];
        for (int r = 1; r < T; r++)
            if (all[(size_t)r * 2 * rows + 2 * i] > M) {
                M = all[(size_t)r * 2 * rows + 2 * i];
                A = all[(size_t)r * 2 * rows + 2 * i + 1];
            }
        ma[2 * i] = M;
        ma[2 * i + 1] = A;
        const float *x = logits + (size_t)i * Vr;
        float *d = dlogits ? dlogits + (size_t)i * Vr : NULL;
        /* read before dlogits is written, so dlogits may be the logits' own storage */
        int32_t k = labels[i] - first;
        mine[3 * i + 2] = k >= 0 && k < Vr ? x[k] : 0.0f;
        double sum = 0.0;
        for (int j = 0; j < Vr; j++) {
            float e = fastmath_expf(x[j] - M);
            if (d) d[j] = e;
            sum += e;
        }
        mine[3 * i] = (float)sum;
        mine[3 * i + 1] = (float)(sum - (double)(float)sum);
    }
}

double kernel_xent_shard_finish_cpu(float *dlogits, int *correct, const float *all,
                                    const float *ma, const int32_t *labels, int rows, int Vr,
                                    int first, int V, int T, float grad_scale)
{
    double loss = 0.0;
    int right = 0;
    for (int i = 0; i < rows; i++) {
        double sum = 0.0, target = 0.0;
        for (int r = 0; r < T; r++) {
            const float *q = all + (size_t)r * 3 * rows + 3 * i;
            sum += (double)q[0] + (double)q[1];
            target += (double)q[2];
        }
        int32_t label = labels[i];
        right += (float)label == ma[2 * i + 1];
        if (dlogits) {
            float *d = dlogits + (size_t)i * Vr;
            const float inv = (float)(1.0 / sum);
            for (int j = 0; j < Vr; j++)
                d[j] = (d[j] * inv - (first + j == label ? 1.0f : 0.0f)) * grad_scale;
        }
        /* a label outside [0, V) has no loss: NaN, as the whole kernel */
        if (label < 0 || label >= V) loss = NAN;
        else loss += log(sum) - (target - (double)ma[2 * i]);
    }
    if (correct) *correct = right;
    return loss;
}
