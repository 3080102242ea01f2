/* Fully connected layer through cuBLAS, every product in the context's precision
 * (kernel_cuda_gemm, precision.cu; FP32 is plain cublasSgemm).
 *
 * cuBLAS is column-major; a row-major matrix X[r][c] is, to cuBLAS, the column-major
 * matrix Xᵀ (c × r) with the same leading dimension. Each row-major product C = A·B is
 * therefore issued as Cᵀ = Bᵀ·Aᵀ, with the operands swapped and the transposes read off
 * which buffers already hold the transposed matrix. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

/* out[i][j] = b[j]: the product then accumulates onto it (beta = 1), as the CPU kernel does. */
__global__ static void dense_bias_broadcast(float *out, const float *b, size_t rows,
                                            size_t cols)
{
    const size_t total = rows * cols;
    CUDA_GRID_STRIDE(i, total)
        out[i] = b[i % cols];
}

/* db[j] += Σ_i dout[i][j] (add = 0: db[j] = the sum), over `cols` columns of rows `ld`
 * floats apart. A block owns 32 columns (one per lane, so the reads of a row are
 * coalesced) and DENSE_SUM_ROWS row phases; the partial sums meet in shared memory and are
 * added in a fixed order, so the result does not vary between runs. */
enum { DENSE_SUM_ROWS = 8 };
__global__ static void dense_column_sum(float *db, const float *dout, int rows, int cols,
                                        int ld, int add)
{
    __shared__ double part[DENSE_SUM_ROWS][32];
    const int j = blockIdx.x * 32 + threadIdx.x;
    double s = 0.0;
    if (j < cols)
        for (int i = threadIdx.y; i < rows; i += DENSE_SUM_ROWS)
            s += dout[(size_t)i * ld + j];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
        for (int r = 1; r < DENSE_SUM_ROWS; r++)
            s += part[r][threadIdx.x];
        db[j] = add ? db[j] + (float)s : (float)s;
    }
}

static int dense_check_dims(int n, int in_f, int out_f)
{
    if (n < 0 || in_f <= 0 || out_f <= 0)
        return pt_error_set("dense: invalid sizes n=%d in=%d out=%d", n, in_f, out_f);
    return 0;
}

extern "C" int kernel_dense_forward_cuda(float *out, const float *in, const float *w,
                                         const float *b, int n, int in_f, int out_f,
                                         const kernel_cuda_ctx *ctx)
{
    if (dense_check_dims(n, in_f, out_f) != 0)
        return -1;
    if (n == 0)
        return 0;
    if (b) {
        const size_t total = (size_t)n * out_f;
        dense_bias_broadcast<<<cuda_grid(total), CUDA_THREADS, 0, ctx->stream>>>(
            out, b, (size_t)n, (size_t)out_f);
        CUDA_CHECK_LAUNCH("dense_bias_broadcast");
    }
    const float one = 1.0f, beta = b ? 1.0f : 0.0f;
    /* outᵀ[out_f × n] = w[out_f × in_f] · inᵀ[in_f × n]; the buffer of w is wᵀ to cuBLAS. */
    return kernel_cuda_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, out_f, n, in_f, &one, w, in_f, in,
                            in_f, &beta, out, out_f);
}

/* The backward's halves (kernels.h): the fused call is the weight half then the input
 * half, the very calls it always made, so splitting changes no bit. */
extern "C" int kernel_dense_backward_weight_cuda(float *dw, float *db, const float *dout,
                                                 const float *in, int n, int in_f, int out_f,
                                                 const kernel_cuda_ctx *ctx)
{
    if (dense_check_dims(n, in_f, out_f) != 0)
        return -1;
    if (n == 0)
        return 0; /* nothing to accumulate */
    const float one = 1.0f;
    /* dwᵀ[in_f × out_f] += inᵀ[in_f × n] · dout[n × out_f]. */
    if (kernel_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, in_f, out_f, n, &one, in, in_f, dout,
                         out_f, &one, dw, in_f) != 0)
        return -1;
    if (db) {
        const dim3 block(32, DENSE_SUM_ROWS);
        dense_column_sum<<<(out_f + 31) / 32, block, 0, ctx->stream>>>(db, dout, n, out_f,
                                                                       out_f, 1);
        CUDA_CHECK_LAUNCH("dense_column_sum");
    }
    return 0;
}

extern "C" int kernel_dense_backward_input_cuda(float *din, const float *dout, const float *w,
                                                int n, int in_f, int out_f,
                                                const kernel_cuda_ctx *ctx)
{
    if (dense_check_dims(n, in_f, out_f) != 0)
        return -1;
    if (n == 0 || !din)
        return 0; /* din has no elements */
    const float one = 1.0f, zero = 0.0f;
    /* dinᵀ[in_f × n] = wᵀ[in_f × out_f] · doutᵀ[out_f × n]. */
    return kernel_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, in_f, n, out_f, &one, w, in_f, dout,
                            out_f, &zero, din, in_f);
}

extern "C" int kernel_dense_backward_cuda(float *din, float *dw, float *db, const float *dout,
                                          const float *in, const float *w, int n, int in_f,
                                          int out_f, const kernel_cuda_ctx *ctx)
{
    if (kernel_dense_backward_weight_cuda(dw, db, dout, in, n, in_f, out_f, ctx) != 0)
        return -1;
    return din ? kernel_dense_backward_input_cuda(din, dout, w, n, in_f, out_f, ctx) : 0;
}

/* Output units [u0, u0 + units) of the weight gradient, written: one product, beta = 0, over
 * the units' columns of dout (leading dimension out_f), and their column sums. */
extern "C" int kernel_dense_weight_grad_units_cuda(float *dw, float *db, const float *dout,
                                                   const float *in, int n, int in_f, int out_f,
                                                   int u0, int units,
                                                   const kernel_cuda_ctx *ctx)
{
    if (dense_check_dims(n, in_f, out_f) != 0)
        return -1;
    if (u0 < 0 || units < 0 || units > out_f - u0)
        return pt_error_set("dense: weight gradient of units [%d, %d), outside the layer's %d",
                            u0, u0 + units, out_f);
    if (units == 0)
        return 0;
    float *dwu = dw + (size_t)u0 * in_f;
    if (n == 0) { /* an empty sum: zeros, as the CPU's beta = 0 product */
        CUDA_CHECK(cudaMemsetAsync(dwu, 0, (size_t)units * in_f * sizeof(float), ctx->stream));
        if (db)
            CUDA_CHECK(cudaMemsetAsync(db + u0, 0, (size_t)units * sizeof(float), ctx->stream));
        return 0;
    }
    const float one = 1.0f, zero = 0.0f;
    /* dwuᵀ[in_f × units] = inᵀ[in_f × n] · dout[n × u0..u0+units). */
    if (kernel_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, in_f, units, n, &one, in, in_f,
                         dout + u0, out_f, &zero, dwu, in_f) != 0)
        return -1;
    if (db) {
        const dim3 block(32, DENSE_SUM_ROWS);
        dense_column_sum<<<(units + 31) / 32, block, 0, ctx->stream>>>(db + u0, dout + u0, n,
                                                                       units, out_f, 0);
        CUDA_CHECK_LAUNCH("dense_column_sum");
    }
    return 0;
}
