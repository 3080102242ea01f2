/* Softmax cross-entropy on the GPU: one warp per sample, one block for the whole batch.
 *
 * The loss sum is a double reduced in a fixed order (each warp adds its samples in order,
 * then warp 0's thread 0 adds the warps' sums in order), so the same logits give the same
 * bits on every run; no atomics, and no scratch memory. A single block is enough for the
 * batches this is for (n·classes of a few thousand to a few hundred thousand floats): the
 * kernel is a small fraction of a training step either way. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

#include <math.h>

enum { XENT_WARPS = 16 };

/* The CPU's argmax: best starts at 0 and moves to j only when x[j] > x[best]. That is the
 * first index of the largest non-NaN value, unless x[0] is NaN (then it stays 0). Each lane
 * keeps the first largest non-NaN value of its strided subset (idx −1: none yet); lanes
 * combine by larger value, then smaller index. */
__device__ static inline void xent_better(float *v, int *idx, float ov, int oidx)
{
    if (oidx < 0)
        return;
    if (*idx < 0 || ov > *v || (ov == *v && oidx < *idx)) {
        *v = ov;
        *idx = oidx;
    }
}

__global__ static void xent_kernel(float *dlogits, int *correct, double *loss_sum,
                                   const float *logits, const int32_t *labels, int n,
                                   int classes, float grad_scale)
{
    __shared__ double warp_loss[XENT_WARPS];
    __shared__ int warp_right[XENT_WARPS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double loss = 0.0;
    int right = 0;
    for (int i = blockIdx.x * XENT_WARPS + warp; i < n; i += gridDim.x * XENT_WARPS) {
        const float *x = logits + (size_t)i * classes;
        const int label = labels[i];
        const bool valid = label >= 0 && label < classes;
        /* Everything read from x before any lane writes dlogits, which may alias it. */
        const float x0 = x[0];
        const float x_label = valid ? x[label] : 0.0f;
        float best_v = 0.0f;
        int best = -1;
        for (int j = lane; j < classes; j += 32) {
            const float v = x[j];
            if (v == v)
                xent_better(&best_v, &best, v, j);
        }
        for (int off = 16; off > 0; off /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
            const int oidx = __shfl_xor_sync(0xffffffffu, best, off);
            xent_better(&best_v, &best, ov, oidx);
        }
        if (x0 != x0 || best < 0) {
            best = 0;
            best_v = x0;
        }
        const float mx = best_v;
        /* Orders every lane's reads of x above before the writes to dlogits below. */
        __syncwarp();
        /* The largest term is exp(0) = 1: no overflow, and log(sum) is well conditioned. */
        double sum = 0.0;
        float *d = dlogits ? dlogits + (size_t)i * classes : NULL;
        for (int j = lane; j < classes; j += 32) {
            const float e = expf(__fsub_rn(x[j], mx));
            if (d)
                d[j] = e; /* each lane rewrites only the logits it has read */
            sum += e;
        }
        for (int off = 16; off > 0; off /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (d) {
            const float inv = (float)(1.0 / sum);
            for (int j = lane; j < classes; j += 32)
                d[j] = __fmul_rn(__fsub_rn(__fmul_rn(d[j], inv), j == label ? 1.0f : 0.0f),
                                 grad_scale);
        }
        if (lane == 0) {
            /* An out-of-range label has no loss: NaN, as the CPU kernel reports it. */
            loss += valid ? log(sum) - ((double)x_label - (double)mx) : (double)NAN;
            right += best == label;
        }
    }
    if (lane == 0) {
        warp_loss[warp] = loss;
        warp_right[warp] = right;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        int total_right = 0;
        for (int k = 0; k < XENT_WARPS; k++) {
            total += warp_loss[k];
            total_right += warp_right[k];
        }
        /* one block: the results; several: block b's part, summed by xent_parts */
        if (gridDim.x > 1) {
            loss_sum[blockIdx.x] = total;
            correct[blockIdx.x] = total_right;
            return;
        }
        if (loss_sum)
            *loss_sum = total;
        if (correct)
            *correct = total_right;
    }
}

/* The blocks' parts in block order: a fixed order, so the same bits on every run. */
__global__ static void xent_parts(int *correct, double *loss_sum, const int *part_right,
                                  const double *part_loss, int parts)
{
    double total = 0.0;
    int right = 0;
    for (int b = 0; b < parts; b++) {
        total += part_loss[b];
        right += part_right[b];
    }
    if (loss_sum)
        *loss_sum = total;
    if (correct)
        *correct = right;
}

extern "C" int kernel_softmax_xent_cuda(float *dlogits, int *correct, double *loss_sum,
                                        const float *logits, const int32_t *labels, int n,
                                        int classes, float grad_scale,
                                        const kernel_cuda_ctx *ctx)
{
    if (n < 0 || classes <= 0)
        return pt_error_set("softmax_xent: invalid sizes n=%d classes=%d", n, classes);
    /* Launched for n = 0 too: the outputs are then written as 0. */
    xent_kernel<<<1, 32 * XENT_WARPS, 0, ctx->stream>>>(dlogits, correct, loss_sum, logits,
                                                        labels, n, classes, grad_scale);
    CUDA_CHECK_LAUNCH("xent_kernel");
    return 0;
}

extern "C" int kernel_softmax_xent_rows_cuda(float *dlogits, int *correct, double *loss_sum,
                                             const float *logits, const int32_t *labels, int n,
                                             int classes, float grad_scale, double *part_loss,
                                             int *part_right, const kernel_cuda_ctx *ctx)
{
    if (n < 0 || classes <= 0)
        return pt_error_set("softmax_xent: invalid sizes n=%d classes=%d", n, classes);
    /* Fewer rows than a handful of blocks would fill: the one-block kernel. */
    const int blocks = (n + XENT_WARPS - 1) / XENT_WARPS;
    const int parts = blocks < KERNEL_XENT_PARTS ? blocks : KERNEL_XENT_PARTS;
    if (parts < 2)
        return kernel_softmax_xent_cuda(dlogits, correct, loss_sum, logits, labels, n, classes,
                                        grad_scale, ctx);
    xent_kernel<<<parts, 32 * XENT_WARPS, 0, ctx->stream>>>(dlogits, part_right, part_loss,
                                                            logits, labels, n, classes,
                                                            grad_scale);
    CUDA_CHECK_LAUNCH("xent_kernel (rows)");
    xent_parts<<<1, 1, 0, ctx->stream>>>(correct, loss_sum, part_right, part_loss, parts);
    CUDA_CHECK_LAUNCH("xent_parts");
    return 0;
}
