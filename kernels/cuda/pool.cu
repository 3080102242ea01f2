/* Max and average pooling without padding, floor mode: one thread per output element in
 * the forward, one per input element in the backward. The backward gathers (sums over the
 * windows that cover its input) rather than scattering with atomics, and visits the windows
 * in the order the CPU kernel adds them, so the results equal the CPU's bit for bit. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

#include <math.h>

typedef struct {
    int h, w, size, stride, oh, ow;
    size_t planes; /* n·c */
} pool_geom;

static int pool_geom_init(pool_geom *g, int n, int c, int h, int w, int size, int stride)
{
    if (n < 0 || c <= 0 || size <= 0 || stride <= 0 || h < size || w < size)
        return pt_error_set("pool2d: invalid shape n=%d c=%d h=%d w=%d size=%d stride=%d", n,
                            c, h, w, size, stride);
    g->h = h;
    g->w = w;
    g->size = size;
    g->stride = stride;
    g->oh = (h - size) / stride + 1;
    g->ow = (w - size) / stride + 1;
    g->planes = (size_t)n * c;
    return 0;
}

/* Range of window indices o with o·stride ≤ x < o·stride + size, clipped to [0, on). */
__device__ static inline void pool_cover(int *lo, int *hi, int x, int size, int stride, int on)
{
    const int a = x - size + 1;
    *lo = a <= 0 ? 0 : (a + stride - 1) / stride;
    const int b = x / stride;
    *hi = b < on - 1 ? b : on - 1;
}

/* Windows in row-major order; replace on a strictly larger value or on NaN, starting
 * below every value so that an all −inf window names its first element (as torch, and
 * as the CPU kernel). */
__global__ static void pool_max_forward(float *out, int32_t *argmax, const float *in,
                                        pool_geom g)
{
    const size_t total = g.planes * g.oh * g.ow;
    CUDA_GRID_STRIDE(i, total) {
        const int ow = (int)(i % g.ow), oh = (int)(i / g.ow % g.oh);
        const float *src = in + i / ((size_t)g.oh * g.ow) * g.h * g.w;
        const int ih0 = oh * g.stride, iw0 = ow * g.stride;
        float m = -INFINITY;
        int32_t at = ih0 * g.w + iw0;
        for (int a = 0; a < g.size; a++) {
            for (int b = 0; b < g.size; b++) {
                const int idx = (ih0 + a) * g.w + iw0 + b;
                const float v = src[idx];
                if (v > m || v != v) {
                    m = v;
                    at = idx;
                }
            }
        }
        out[i] = m;
        argmax[i] = at;
    }
}

/* din[x] = Σ dout[o] over the windows o that cover x and chose x, in increasing o: the
 * order in which the CPU kernel adds them. */
__global__ static void pool_max_backward(float *din, const float *dout, const int32_t *argmax,
                                         pool_geom g)
{
    const size_t total = g.planes * g.h * g.w;
    CUDA_GRID_STRIDE(i, total) {
        const int iw = (int)(i % g.w), ih = (int)(i / g.w % g.h);
        const size_t base = i / ((size_t)g.h * g.w) * g.oh * g.ow;
        const int32_t self = ih * g.w + iw;
        int oh_lo, oh_hi, ow_lo, ow_hi;
        pool_cover(&oh_lo, &oh_hi, ih, g.size, g.stride, g.oh);
        pool_cover(&ow_lo, &ow_hi, iw, g.size, g.stride, g.ow);
        float sum = 0.0f;
        for (int oh = oh_lo; oh <= oh_hi; oh++)
            for (int ow = ow_lo; ow <= ow_hi; ow++) {
                const size_t o = base + (size_t)oh * g.ow + ow;
                if (argmax[o] == self)
                    sum += dout[o];
            }
        din[i] = sum;
    }
}

/* Window summed in row-major order from 0, then divided (not multiplied by 1/area). */
__global__ static void pool_avg_forward(float *out, const float *in, pool_geom g)
{
    const size_t total = g.planes * g.oh * g.ow;
    const float area = (float)(g.size * g.size);
    CUDA_GRID_STRIDE(i, total) {
        const int ow = (int)(i % g.ow), oh = (int)(i / g.ow % g.oh);
        const float *src = in + i / ((size_t)g.oh * g.ow) * g.h * g.w +
                           (size_t)oh * g.stride * g.w + (size_t)ow * g.stride;
        float sum = 0.0f;
        for (int a = 0; a < g.size; a++)
            for (int b = 0; b < g.size; b++)
                sum = __fadd_rn(sum, src[a * g.w + b]);
        out[i] = __fdiv_rn(sum, area);
    }
}

/* din[x] = Σ dout[o]/area over the covering windows. The CPU adds, per output row oh in
 * increasing order, the kernel columns j in increasing order, i.e. the windows ow of that
 * row in DECREASING order: the same order here. */
__global__ static void pool_avg_backward(float *din, const float *dout, pool_geom g)
{
    const size_t total = g.planes * g.h * g.w;
    const float area = (float)(g.size * g.size);
    CUDA_GRID_STRIDE(i, total) {
        const int iw = (int)(i % g.w), ih = (int)(i / g.w % g.h);
        const float *gp = dout + i / ((size_t)g.h * g.w) * g.oh * g.ow;
        int oh_lo, oh_hi, ow_lo, ow_hi;
        pool_cover(&oh_lo, &oh_hi, ih, g.size, g.stride, g.oh);
        pool_cover(&ow_lo, &ow_hi, iw, g.size, g.stride, g.ow);
        float sum = 0.0f;
        for (int oh = oh_lo; oh <= oh_hi; oh++)
            for (int ow = ow_hi; ow >= ow_lo; ow--)
                sum = __fadd_rn(sum, __fdiv_rn(gp[(size_t)oh * g.ow + ow], area));
        din[i] = sum;
    }
}

extern "C" int kernel_maxpool2d_forward_cuda(float *out, int32_t *argmax, const float *in,
                                             int n, int c, int h, int w, int size, int stride,
                                             const kernel_cuda_ctx *ctx)
{
    pool_geom g;
    if (pool_geom_init(&g, n, c, h, w, size, stride) != 0)
        return -1;
    const size_t total = g.planes * g.oh * g.ow;
    if (total == 0)
        return 0;
    pool_max_forward<<<cuda_grid(total), CUDA_THREADS, 0, ctx->stream>>>(out, argmax, in, g);
    CUDA_CHECK_LAUNCH("pool_max_forward");
    return 0;
}

extern "C" int kernel_maxpool2d_backward_cuda(float *din, const float *dout,
                                              const int32_t *argmax, int n, int c, int h,
                                              int w, int size, int stride,
                                              const kernel_cuda_ctx *ctx)
{
    pool_geom g;
    if (pool_geom_init(&g, n, c, h, w, size, stride) != 0)
        return -1;
    const size_t total = g.planes * g.h * g.w;
    if (total == 0)
        return 0;
    pool_max_backward<<<cuda_grid(total), CUDA_THREADS, 0, ctx->stream>>>(din, dout, argmax,
                                                                          g);
    CUDA_CHECK_LAUNCH("pool_max_backward");
    return 0;
}

extern "C" int kernel_avgpool2d_forward_cuda(float *out, const float *in, int n, int c, int h,
                                             int w, int size, int stride,
                                             const kernel_cuda_ctx *ctx)
{
    pool_geom g;
    if (pool_geom_init(&g, n, c, h, w, size, stride) != 0)
        return -1;
    const size_t total = g.planes * g.oh * g.ow;
    if (total == 0)
        return 0;
    pool_avg_forward<<<cuda_grid(total), CUDA_THREADS, 0, ctx->stream>>>(out, in, g);
    CUDA_CHECK_LAUNCH("pool_avg_forward");
    return 0;
}

extern "C" int kernel_avgpool2d_backward_cuda(float *din, const float *dout, int n, int c,
                                              int h, int w, int size, int stride,
                                              const kernel_cuda_ctx *ctx)
{
    pool_geom g;
    if (pool_geom_init(&g, n, c, h, w, size, stride) != 0)
        return -1;
    const size_t total = g.planes * g.h * g.w;
    if (total == 0)
        return 0;
    pool_avg_backward<<<cuda_grid(total), CUDA_THREADS, 0, ctx->stream>>>(din, dout, g);
    CUDA_CHECK_LAUNCH("pool_avg_backward");
    return 0;
}
