/* 2-D convolution on the GPU: im2col + cuBLAS, as the CPU kernel's sample-major order. The
 * products go through kernel_cuda_gemm* (precision.cu) in the context's precision; FP32 is
 * the plain sgemm calls named below.
 *
 * col[c·k·k][n·P] (P = oh·ow) holds one column per (sample, output pixel). Then
 *   forward:  out[s] = w[F × ckk] · col[:, s·P .. s·P+P)   one strided-batched sgemm whose
 *             batch entry s writes the NCHW plane block of sample s directly (no transpose);
 *   backward: dy[F][n·P] = dout rearranged (one pass), db += row sums of dy,
 *             dw[F × ckk] += dy · colᵀ                    one sgemm over all n·P columns,
 *             dcol = wᵀ · dy → col2im gathers it into din.
 * Row-major to column-major as in dense.cu: a row-major buffer X[r][c] is Xᵀ to cuBLAS.
 * col2im gathers (one thread per input element, no atomics), adding the kernel positions
 * in the CPU's order, so din does not vary between runs. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

#include <limits.h>

typedef struct {
    int n, c, h, w, f, k, stride, pad;
    int oh, ow;
    long long plane; /* oh·ow */
    long long cols;  /* n·oh·ow */
    int kk;          /* c·k·k */
} conv_geom;

static int conv_geom_init(conv_geom *g, const kernel_conv2d_dims *d)
{
    g->n = d->n;
    g->c = d->c;
    g->h = d->h;
    g->w = d->w;
    g->f = d->filters;
    g->k = d->size;
    g->stride = d->stride;
    g->pad = d->pad;
    if (d->n < 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->filters <= 0 || d->size <= 0 ||
        d->stride <= 0 || d->pad < 0)
        return pt_error_set("conv2d: invalid dims n=%d c=%d h=%d w=%d filters=%d size=%d "
                            "stride=%d pad=%d", d->n, d->c, d->h, d->w, d->filters, d->size,
                            d->stride, d->pad);
    if (d->h + 2 * d->pad < d->size || d->w + 2 * d->pad < d->size)
        return pt_error_set("conv2d: kernel %d larger than the padded input %dx%d", d->size,
                            d->h + 2 * d->pad, d->w + 2 * d->pad);
    g->oh = kernel_conv2d_out_h(d);
    g->ow = kernel_conv2d_out_w(d);
    g->plane = (long long)g->oh * g->ow;
    g->cols = (long long)d->n * g->plane;
    const long long kk = (long long)d->c * d->size * d->size;
    /* cuBLAS takes int sizes and leading dimensions. */
    if (g->cols > INT_MAX || kk > INT_MAX || (long long)d->filters * g->plane > INT_MAX)
        return pt_error_set("conv2d: %lld columns or %lld rows exceed cuBLAS's int sizes",
                            g->cols, kk);
    g->kk = (int)kk;
    return 0;
}

extern "C" size_t kernel_conv2d_workspace_floats_cuda(const kernel_conv2d_dims *d)
{
    const size_t cols = (size_t)d->n * kernel_conv2d_out_h(d) * kernel_conv2d_out_w(d);
    return ((size_t)d->c * d->size * d->size + (size_t)d->filters) * cols;
}

/* col[(ci·k + ki)·k + kj][s·P + oh·OW + ow] = in[s][ci][oh·stride + ki − pad][ow·stride + kj
 * − pad], 0 in the padding. Consecutive threads write consecutive columns. */
__global__ static void conv_im2col(float *col, const float *in, conv_geom g)
{
    const size_t total = (size_t)g.kk * g.cols;
    CUDA_GRID_STRIDE(i, total) {
        const size_t r = i / g.cols, q = i % g.cols;
        const int s = (int)(q / g.plane), pix = (int)(q % g.plane);
        const int oh = pix / g.ow, ow = pix % g.ow;
        const int ci = (int)r / (g.k * g.k), kij = (int)r % (g.k * g.k);
        const int ih = oh * g.stride + kij / g.k - g.pad;
        const int iw = ow * g.stride + kij % g.k - g.pad;
        float v = 0.0f;
        if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
            v = in[(((size_t)s * g.c + ci) * g.h + ih) * g.w + iw];
        col[i] = v;
    }
}

/* din[s][ci][ih][iw] = Σ over the kernel positions (ki, kj) whose window reads this input
 * of dcol[(ci·k + ki)·k + kj][s·P + oh·OW + ow]; (ki, kj) in increasing order, as the
 * CPU's col2im adds them. Every element is written (overwrite contract). */
__global__ static void conv_col2im(float *din, const float *dcol, conv_geom g)
{
    const size_t total = (size_t)g.n * g.c * g.h * g.w;
    CUDA_GRID_STRIDE(i, total) {
        const int iw = (int)(i % g.w);
        const int ih = (int)(i / g.w % g.h);
        const int ci = (int)(i / ((size_t)g.w * g.h) % g.c);
        const int s = (int)(i / ((size_t)g.w * g.h * g.c));
        float sum = 0.0f;
        for (int ki = 0; ki < g.k; ki++) {
            const int y = ih + g.pad - ki; /* = oh·stride */
            if (y < 0 || y % g.stride != 0 || y / g.stride >= g.oh)
                continue;
            const int oh = y / g.stride;
            for (int kj = 0; kj < g.k; kj++) {
                const int x = iw + g.pad - kj;
                if (x < 0 || x % g.stride != 0 || x / g.stride >= g.ow)
                    continue;
                const int ow = x / g.stride;
                const size_t r = ((size_t)ci * g.k + ki) * g.k + kj;
                sum += dcol[r * g.cols + (size_t)s * g.plane + (size_t)oh * g.ow + ow];
            }
        }
        din[i] = sum;
    }
}

/* out[s][f][p] = b[f]: the batched sgemm then accumulates onto it (beta = 1). */
__global__ static void conv_bias_broadcast(float *out, const float *b, conv_geom g)
{
    const size_t total = (size_t)g.n * g.f * g.plane;
    CUDA_GRID_STRIDE(i, total)
        out[i] = b[i / g.plane % g.f];
}

/* dy[f][s·P + p] = dout[s][f][p]. */
__global__ static void conv_gather_dy(float *dy, const float *dout, conv_geom g)
{
    const size_t total = (size_t)g.n * g.f * g.plane;
    CUDA_GRID_STRIDE(i, total) {
        const size_t p = i % g.plane, f = i / g.plane % g.f, s = i / ((size_t)g.plane * g.f);
        dy[f * g.cols + s * g.plane + p] = dout[i];
    }
}

/* db[f] += Σ dy[f][·]: one block per filter, a fixed-shape tree, so the same bits on every
 * run. Partial sums in double: a plane of n·P terms added in float would lose digits that
 * the CPU's 16-way partial sums keep. */
enum { CONV_SUM_THREADS = 256 };
__global__ static void conv_bias_grad(float *db, const float *dy, conv_geom g)
{
    __shared__ double part[CONV_SUM_THREADS];
    const float *row = dy + (size_t)blockIdx.x * g.cols;
    double s = 0.0;
    for (long long i = threadIdx.x; i < g.cols; i += CONV_SUM_THREADS)
        s += row[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int half = CONV_SUM_THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half)
            part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        db[blockIdx.x] += (float)part[0];
}

extern "C" int kernel_conv2d_forward_cuda(float *out, float *work, const float *in,
                                          const float *w, const float *b,
                                          const kernel_conv2d_dims *d,
                                          const kernel_cuda_ctx *ctx)
{
    conv_geom g;
    if (conv_geom_init(&g, d) != 0)
        return -1;
    if (g.cols == 0)
        return 0;
    float *col = work;
    conv_im2col<<<cuda_grid((size_t)g.kk * g.cols), CUDA_THREADS, 0, ctx->stream>>>(col, in,
                                                                                   g);
    CUDA_CHECK_LAUNCH("conv_im2col");
    if (b) {
        conv_bias_broadcast<<<cuda_grid((size_t)g.f * g.cols), CUDA_THREADS, 0,
                              ctx->stream>>>(out, b, g);
        CUDA_CHECK_LAUNCH("conv_bias_broadcast");
    }
    /* Per sample s: out[s]ᵀ[P × F] = col_sᵀ[P × kk] · wᵀ[kk × F]. col_sᵀ is the column-major
     * view of col starting at column s·P with leading dimension n·P; wᵀ is w's buffer. */
    const float one = 1.0f, beta = b ? 1.0f : 0.0f;
    return kernel_cuda_gemm_strided_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, (int)g.plane, g.f,
                                            g.kk, &one, col, (int)g.cols, g.plane, w, g.kk, 0,
                                            &beta, out, (int)g.plane,
                                            (long long)g.f * g.plane, g.n);
}

/* The backward's parts (CONV_WEIGHT, CONV_INPUT), as the CPU's conv_backward: each half
 * makes exactly the calls the fused backward makes for its outputs (the weight half
 * rebuilds im2col, as the fused call does), so the halves and the fused call agree bit for
 * bit. */
enum { CONV_WEIGHT = 1, CONV_INPUT = 2 };

static int conv_backward(float *din, float *dw, float *db, float *work, const float *dout,
                         const float *in, const float *w, const kernel_conv2d_dims *d,
                         int parts, const kernel_cuda_ctx *ctx)
{
    conv_geom g;
    if (conv_geom_init(&g, d) != 0)
        return -1;
    if (g.cols == 0)
        return 0;
    float *col = work;
    float *dy = col + (size_t)g.kk * g.cols;
    const size_t ycount = (size_t)g.f * g.cols;
    conv_gather_dy<<<cuda_grid(ycount), CUDA_THREADS, 0, ctx->stream>>>(dy, dout, g);
    CUDA_CHECK_LAUNCH("conv_gather_dy");
    const float one = 1.0f, zero = 0.0f;
    if (parts & CONV_WEIGHT) {
        if (db) {
            conv_bias_grad<<<g.f, CONV_SUM_THREADS, 0, ctx->stream>>>(db, dy, g);
            CUDA_CHECK_LAUNCH("conv_bias_grad");
        }
        /* The forward's col is not kept (the workspace may have served other layers since). */
        conv_im2col<<<cuda_grid((size_t)g.kk * g.cols), CUDA_THREADS, 0, ctx->stream>>>(col,
                                                                                       in, g);
        CUDA_CHECK_LAUNCH("conv_im2col");
        /* dwᵀ[kk × F] += col[kk × nP] · dyᵀ[nP × F]; col's buffer is colᵀ to cuBLAS (op T),
         * dy's buffer is dyᵀ (op N). */
        if (kernel_cuda_gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, g.kk, g.f, (int)g.cols, &one, col,
                             (int)g.cols, dy, (int)g.cols, &one, dw, g.kk) != 0)
            return -1;
    }
    if (!(parts & CONV_INPUT) || !din)
        return 0;
    /* dcolᵀ[nP × kk] = dyᵀ[nP × F] · w[F × kk], written over col (dw no longer needs it). */
    if (kernel_cuda_gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, (int)g.cols, g.kk, g.f, &one, dy,
                         (int)g.cols, w, g.kk, &zero, col, (int)g.cols) != 0)
        return -1;
    const size_t icount = (size_t)g.n * g.c * g.h * g.w;
    conv_col2im<<<cuda_grid(icount), CUDA_THREADS, 0, ctx->stream>>>(din, col, g);
    CUDA_CHECK_LAUNCH("conv_col2im");
    return 0;
}

extern "C" int kernel_conv2d_backward_cuda(float *din, float *dw, float *db, float *work,
                                           const float *dout, const float *in,
                                           const float *w, const kernel_conv2d_dims *d,
                                           const kernel_cuda_ctx *ctx)
{
    return conv_backward(din, dw, db, work, dout, in, w, d, CONV_WEIGHT | CONV_INPUT, ctx);
}

extern "C" int kernel_conv2d_backward_weight_cuda(float *dw, float *db, float *work,
                                                  const float *dout, const float *in,
                                                  const kernel_conv2d_dims *d,
                                                  const kernel_cuda_ctx *ctx)
{
    return conv_backward(NULL, dw, db, work, dout, in, NULL, d, CONV_WEIGHT, ctx);
}

extern "C" int kernel_conv2d_backward_input_cuda(float *din, float *work, const float *dout,
                                                 const float *w, const kernel_conv2d_dims *d,
                                                 const kernel_cuda_ctx *ctx)
{
    if (!din) {
        conv_geom g; /* nothing to write, but the sizes are still checked */
        return conv_geom_init(&g, d);
    }
    return conv_backward(din, NULL, NULL, work, dout, NULL, w, d, CONV_INPUT, ctx);
}
