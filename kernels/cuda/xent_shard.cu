/* The vocabulary-parallel cross-entropy of a language model's head in tensor shards
 * (kernels_cuda.h, kernel_xent_shard_*): the three per-row steps of
 * kernels/cuda/transformer_math.cuh (tfc_xs_*), one thread a row, between which the engine
 * all-gathers each step's output over the tensor group. The rows' losses and hits are then
 * added in a fixed order (one block: each thread its rows in order, then thread 0 the
 * threads' sums in order), so the same logits give the same bits on every run; no atomics.
 * Correctness first: a thread walks its row's Vr columns alone. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/transformer_math.cuh"

enum { XS_SUM_THREADS = 256 };

__global__ static void xs_max(float *mine, const float *logits, int rows, int Vr, int first)
{
    CUDA_GRID_STRIDE(i, (size_t)rows)
    tfc_xs_max(mine + 2 * i, logits + i * (size_t)Vr, Vr, first);
}

__global__ static void xs_sums(float *mine, float *dlogits, float *ma, const float *all,
                               const float *logits, const int32_t *labels, int rows, int Vr,
                               int first, int T)
{
    CUDA_GRID_STRIDE(i, (size_t)rows)
    {
        float M, A;
        tfc_xs_argmax(&M, &A, all, (size_t)rows, i, T);
        ma[2 * i] = M;
        ma[2 * i + 1] = A;
        tfc_xs_sums(mine + 3 * i, dlogits ? dlogits + i * (size_t)Vr : NULL,
                    logits + i * (size_t)Vr, Vr, first, M, labels[i]);
    }
}

__global__ static void xs_finish(float *dlogits, double *row_loss, int *row_right,
                                 const float *all, const float *ma, const int32_t *labels,
                                 int rows, int Vr, int first, int V, int T, float grad_scale)
{
    CUDA_GRID_STRIDE(i, (size_t)rows)
    row_loss[i] = tfc_xs_finish(dlogits ? dlogits + i * (size_t)Vr : NULL, &row_right[i], all,
                                (size_t)rows, i, T, ma[2 * i], ma[2 * i + 1], labels[i], first,
                                Vr, V, grad_scale);
}

__global__ static void __launch_bounds__(XS_SUM_THREADS)
    xs_total(double *loss_sum, int *correct, const double *row_loss, const int *row_right,
             int rows)
{
    __shared__ double part[XS_SUM_THREADS];
    __shared__ int hits[XS_SUM_THREADS];
    double s = 0.0;
    int h = 0;
    for (int i = threadIdx.x; i < rows; i += XS_SUM_THREADS) {
        s += row_loss[i];
        h += row_right[i];
    }
    part[threadIdx.x] = s;
    hits[threadIdx.x] = h;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        int right = 0;
        for (int t = 0; t < XS_SUM_THREADS; t++) {
            total += part[t];
            right += hits[t];
        }
        if (loss_sum)
            *loss_sum = total;
        if (correct)
            *correct = right;
    }
}

static int xs_check(const char *what, int rows, int Vr, int first, int T)
{
    if (rows < 0 || Vr < 1 || first < 0 || T < 1 || first + Vr > (1 << 24))
        return pt_error_set("%s: invalid sizes rows=%d columns=%d from %d of %d ranks", what,
                            rows, Vr, first, T);
    return 0;
}

extern "C" int kernel_xent_shard_max_cuda(float *mine, const float *logits, int rows, int Vr,
                                          int first, const kernel_cuda_ctx *ctx)
{
    if (xs_check("vocabulary-parallel loss", rows, Vr, first, 1))
        return -1;
    if (rows == 0)
        return 0;
    xs_max<<<cuda_grid((size_t)rows), CUDA_THREADS, 0, ctx->stream>>>(mine, logits, rows, Vr,
                                                                       first);
    CUDA_CHECK_LAUNCH("vocabulary-parallel loss (maxima)");
    return 0;
}

extern "C" int kernel_xent_shard_sums_cuda(float *mine, float *dlogits, float *ma,
                                           const float *all, const float *logits,
                                           const int32_t *labels, int rows, int Vr, int first,
                                           int T, const kernel_cuda_ctx *ctx)
{
    if (xs_check("vocabulary-parallel loss", rows, Vr, first, T))
        return -1;
    if (dlogits && dlogits == logits)
        return pt_error_set("vocabulary-parallel loss: dlogits may not alias the logits");
    if (rows == 0)
        return 0;
    xs_sums<<<cuda_grid((size_t)rows), CUDA_THREADS, 0, ctx->stream>>>(
        mine, dlogits, ma, all, logits, labels, rows, Vr, first, T);
    CUDA_CHECK_LAUNCH("vocabulary-parallel loss (sums)");
    return 0;
}

extern "C" int kernel_xent_shard_finish_cuda(float *dlogits, int *correct, double *loss_sum,
                                             const float *all, const float *ma,
                                             const int32_t *labels, int rows, int Vr,
                                             int first, int V, int T, float grad_scale,
                                             double *row_loss, int *row_right,
                                             const kernel_cuda_ctx *ctx)
{
    if (xs_check("vocabulary-parallel loss", rows, Vr, first, T))
        return -1;
    if (first + Vr > V)
        return pt_error_set("vocabulary-parallel loss: columns [%d, %d) outside a vocabulary "
                            "of %d", first, first + Vr, V);
    if (rows > 0) {
        xs_finish<<<cuda_grid((size_t)rows), CUDA_THREADS, 0, ctx->stream>>>(
            dlogits, row_loss, row_right, all, ma, labels, rows, Vr, first, V, T, grad_scale);
        CUDA_CHECK_LAUNCH("vocabulary-parallel loss (finish)");
    }
    xs_total<<<1, XS_SUM_THREADS, 0, ctx->stream>>>(loss_sum, correct, row_loss, row_right,
                                                     rows);
    CUDA_CHECK_LAUNCH("vocabulary-parallel loss (total)");
    return 0;
}
