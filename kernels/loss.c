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
