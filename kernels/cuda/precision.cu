/* The matrix products of the dense and conv kernels in the context's precision (issue 25,
 * kernels_cuda.h's kernel_cuda_precision):
 *   FP32  the cublasSgemm calls the kernels always made (bit for bit what they gave);
 *   TF32  cublasGemmEx on the same float32 buffers, CUBLAS_COMPUTE_32F_FAST_TF32;
 *   BF16  each operand converted to bfloat16 (round to nearest even) into the context's
 *         scratch, then cublasGemmEx with CUDA_R_16BF inputs, a CUDA_R_32F output and
 *         CUBLAS_COMPUTE_32F (float32 accumulation): what torch.autocast does to a matmul.
 * C, alpha and beta stay float32 in every precision, so a product that accumulates into C
 * (beta = 1: a bias broadcast first, or a gradient summed over micro-batches) adds in
 * float32 as before. */
#include <cuda_bf16.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

/* dst[c·rows + r] = bf16(src[c·ld + r]) for r < rows, c < cols: a column-major matrix (as
 * cuBLAS reads it) packed to leading dimension rows, or with cols = 1 a span as it is. */
__global__ static void to_bf16(__nv_bfloat16 *dst, const float *src, size_t rows, size_t cols,
                               size_t ld)
{
    const size_t total = rows * cols;
    CUDA_GRID_STRIDE(i, total)
        dst[i] = __float2bfloat16_rn(src[(i / rows) * ld + i % rows]);
}

/* An operand as cuBLAS reads it: `rows` × `cols` column-major with leading dimension ld,
 * and for a batched product `batch` such matrices `stride` floats apart (stride 0: one
 * matrix shared by all). */
typedef struct {
    const float *src;
    int rows, cols, ld;
    long long stride;
    int batch;
} gemm_operand;

/* op(X) is r × c: X itself is that (N) or its transpose (T). A's op is m × k, B's k × n. */
static gemm_operand operand_of(const float *src, cublasOperation_t op, int r, int c, int ld,
                               long long stride, int batch)
{
    const int rows = op == CUBLAS_OP_N ? r : c, cols = op == CUBLAS_OP_N ? c : r;
    return (gemm_operand){src, rows, cols, ld, stride, batch};
}

/* Floats the bf16 copy holds: a single matrix is packed (leading dimension rows, so a
 * slice of a wider buffer costs only its own elements); a batch keeps its layout and the
 * whole span it covers is converted (the conv's batches tile their buffer: no waste). */
static size_t operand_floats(const gemm_operand *o)
{
    if (o->rows <= 0 || o->cols <= 0) return 0;
    if (o->batch <= 1 || o->stride == 0) {
        if (o->batch <= 1) return (size_t)o->rows * o->cols;
        return (size_t)o->ld * (o->cols - 1) + o->rows;
    }
    return (size_t)o->stride * (o->batch - 1) + (size_t)o->ld * (o->cols - 1) + o->rows;
}

static size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The scratch holds at least `bytes`. Grown rarely (a run's first products; 1 MiB steps),
 * and only after the stream has finished with the old buffer: queued products may still
 * read it. */
static int scratch_reserve(const kernel_cuda_ctx *ctx, size_t bytes)
{
    kernel_cuda_scratch *s = ctx->bf16;
    if (!s)
        return pt_error_set("bf16 product: the CUDA context has no scratch (not made by "
                            "kernel_cuda_ctx_init)");
    if (s->bytes >= bytes) return 0;
    CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    if (s->p) CUDA_CHECK(cudaFree(s->p));
    s->p = NULL;
    s->bytes = 0;
    const size_t want = (bytes + ((size_t)1 << 20) - 1) >> 20 << 20;
    const cudaError_t e = cudaMalloc(&s->p, want);
    if (e != cudaSuccess) {
        s->p = NULL;
        return pt_error_set("bf16 product: %zu bytes of device scratch for the operands' "
                            "bfloat16 copies: cudaMalloc: %s", want, cudaGetErrorString(e));
    }
    s->bytes = want;
    return 0;
}

/* o converted into dst (as operand_floats lays it out); *ld: its leading dimension there. */
static int operand_convert(__nv_bfloat16 *dst, const gemm_operand *o, int *ld,
                           const kernel_cuda_ctx *ctx)
{
    const size_t count = operand_floats(o);
    const int packed = o->batch <= 1;
    *ld = packed ? (o->rows > 0 ? o->rows : 1) : o->ld;
    if (count == 0) return 0; /* an empty grid is a launch error */
    if (packed)
        to_bf16<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(dst, o->src, o->rows,
                                                                    o->cols, o->ld);
    else
        to_bf16<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(dst, o->src, count, 1,
                                                                    count);
    CUDA_CHECK_LAUNCH("to_bf16");
    return 0;
}

/* Both operands into the scratch: *pa at its start, *pb at the next 256-byte boundary. */
static int operands_bf16(const gemm_operand *a, const gemm_operand *b, const void **pa,
                         int *lda, const void **pb, int *ldb, const kernel_cuda_ctx *ctx)
{
    const size_t a_bytes = align256(operand_floats(a) * sizeof(__nv_bfloat16));
    const size_t b_bytes = align256(operand_floats(b) * sizeof(__nv_bfloat16));
    if (scratch_reserve(ctx, a_bytes + b_bytes + 256) != 0) return -1;
    __nv_bfloat16 *da = (__nv_bfloat16 *)ctx->bf16->p;
    __nv_bfloat16 *db = (__nv_bfloat16 *)((char *)ctx->bf16->p + a_bytes);
    if (operand_convert(da, a, lda, ctx) != 0 || operand_convert(db, b, ldb, ctx) != 0)
        return -1;
    *pa = da;
    *pb = db;
    return 0;
}

static int precision_check(const kernel_cuda_ctx *ctx)
{
    if (!kernel_cuda_precision_name(ctx->precision))
        return pt_error_set("CUDA context: unknown precision %d", (int)ctx->precision);
    return 0;
}

extern "C" int kernel_cuda_gemm(const kernel_cuda_ctx *ctx, cublasOperation_t ta,
                                cublasOperation_t tb, int m, int n, int k, const float *alpha,
                                const float *a, int lda, const float *b, int ldb,
                                const float *beta, float *c, int ldc)
{
    if (precision_check(ctx) != 0) return -1;
    if (ctx->precision == KERNEL_CUDA_FP32) {
        CUBLAS_CHECK(cublasSgemm(ctx->blas, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                 ldc));
        return 0;
    }
    if (ctx->precision == KERNEL_CUDA_TF32) {
        CUBLAS_CHECK(cublasGemmEx(ctx->blas, ta, tb, m, n, k, alpha, a, CUDA_R_32F, lda, b,
                                  CUDA_R_32F, ldb, beta, c, CUDA_R_32F, ldc,
                                  CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    const gemm_operand oa = operand_of(a, ta, m, k, lda, 0, 1);
    const gemm_operand ob = operand_of(b, tb, k, n, ldb, 0, 1);
    const void *ha, *hb;
    int la, lb;
    if (operands_bf16(&oa, &ob, &ha, &la, &hb, &lb, ctx) != 0) return -1;
    CUBLAS_CHECK(cublasGemmEx(ctx->blas, ta, tb, m, n, k, alpha, ha, CUDA_R_16BF, la, hb,
                              CUDA_R_16BF, lb, beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    return 0;
}

extern "C" int kernel_cuda_gemm_strided_batched(const kernel_cuda_ctx *ctx,
                                                cublasOperation_t ta, cublasOperation_t tb,
                                                int m, int n, int k, const float *alpha,
                                                const float *a, int lda, long long stride_a,
                                                const float *b, int ldb, long long stride_b,
                                                const float *beta, float *c, int ldc,
                                                long long stride_c, int batch)
{
    if (precision_check(ctx) != 0) return -1;
    if (ctx->precision == KERNEL_CUDA_FP32) {
        CUBLAS_CHECK(cublasSgemmStridedBatched(ctx->blas, ta, tb, m, n, k, alpha, a, lda,
                                               stride_a, b, ldb, stride_b, beta, c, ldc,
                                               stride_c, batch));
        return 0;
    }
    if (ctx->precision == KERNEL_CUDA_TF32) {
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx->blas, ta, tb, m, n, k, alpha, a,
                                                CUDA_R_32F, lda, stride_a, b, CUDA_R_32F, ldb,
                                                stride_b, beta, c, CUDA_R_32F, ldc, stride_c,
                                                batch, CUBLAS_COMPUTE_32F_FAST_TF32,
                                                CUBLAS_GEMM_DEFAULT));
        return 0;
    }
    if (stride_a < 0 || stride_b < 0)
        return pt_error_set("bf16 batched product: negative strides %lld, %lld", stride_a,
                            stride_b);
    /* Batches keep their layout in the copy, so the strides stay (one batch is packed,
     * and its strides are not read). */
    const gemm_operand oa = operand_of(a, ta, m, k, lda, stride_a, batch);
    const gemm_operand ob = operand_of(b, tb, k, n, ldb, stride_b, batch);
    const void *ha, *hb;
    int la, lb;
    if (operands_bf16(&oa, &ob, &ha, &la, &hb, &lb, ctx) != 0) return -1;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx->blas, ta, tb, m, n, k, alpha, ha,
                                            CUDA_R_16BF, la, stride_a, hb, CUDA_R_16BF, lb,
                                            stride_b, beta, c, CUDA_R_32F, ldc, stride_c,
                                            batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}
