/* Part of tests/cuda/mock_cuda.c (#included before its dense and conv twins, whose ops and
 * die() it uses): --precision's model, the rounding of the products' operands. */
#include <stdint.h>

/* ---- --precision (kernels/cuda/precision.cu): the products' operands as the GPU takes
 * them. tf32: tensor cores read each float32 element with a 10-bit mantissa; bf16: the
 * engine converts each to bfloat16 first; both round to nearest even here, then the CPU
 * kernel multiplies in float32 (the GPU accumulates in float32 too). The bias, the bias
 * gradient (sums of the unrounded dout) and every other kernel stay float32. So a mock
 * run models the GPU's rounding of operands, not its order of additions. The op keeps the
 * precision in i[PREC] (the dense and conv ops use i[0..4]). ---- */
enum { PREC = 7 };
static float round_mantissa(float x, int drop) /* drop the low `drop` bits, to nearest even */
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* infinities and NaNs as they are */
    u += ((1u << (drop - 1)) - 1) + ((u >> drop) & 1);
    u &= ~((1u << drop) - 1);
    memcpy(&x, &u, sizeof x);
    return x;
}
/* src itself in fp32, else a rounded copy (free it with unround) */
static float *rounded(const void *src, size_t count, int precision)
{
    if (precision == KERNEL_CUDA_FP32) return (float *)src;
    const int drop = precision == KERNEL_CUDA_TF32 ? 13 : 16; /* 23 − 10, 23 − 7 */
    float *c = malloc(count * sizeof *c);
    if (!c) die("out of memory for a rounded operand");
    for (size_t k = 0; k < count; k++) c[k] = round_mantissa(((const float *)src)[k], drop);
    return c;
}
static void unround(float *copy, const void *src)
{
    if (copy != src) free(copy);
}
static float *zeros(size_t count)
{
    float *z = calloc(count ? count : 1, sizeof *z);
    if (!z) die("out of memory");
    return z;
}
static int ctx_precision(const kernel_cuda_ctx *ctx)
{
    if (!kernel_cuda_precision_name(ctx->precision)) die("unknown precision in the context");
    return (int)ctx->precision;
}
/* The dense weight half: dw from rounded operands; db (summed from the unrounded dout) from
 * a second call into a throw-away dw, so that its bits are the CPU kernel's. */
static void dense_weight(float *dw, float *db, const float *dout, const float *in, int n,
                         int in_f, int out_f, int prec)
{
    if (prec == KERNEL_CUDA_FP32) {
        kernel_dense_backward_weight_cpu(dw, db, dout, in, n, in_f, out_f);
        return;
    }
    float *rd = rounded(dout, (size_t)n * out_f, prec), *ri = rounded(in, (size_t)n * in_f, prec);
    kernel_dense_backward_weight_cpu(dw, NULL, rd, ri, n, in_f, out_f);
    unround(rd, dout); unround(ri, in);
    if (!db) return;
    float *spare = zeros((size_t)out_f * in_f);
    kernel_dense_backward_weight_cpu(spare, db, dout, in, n, in_f, out_f);
    free(spare);
}
static void dense_input(float *din, const float *dout, const float *w, int n, int in_f,
                        int out_f, int prec)
{
    float *rd = rounded(dout, (size_t)n * out_f, prec), *rw = rounded(w, (size_t)out_f * in_f, prec);
    kernel_dense_backward_input_cpu(din, rd, rw, n, in_f, out_f);
    unround(rd, dout); unround(rw, w);
}
static size_t conv_in_count(const kernel_conv2d_dims *d) { return (size_t)d->n * d->c * d->h * d->w; }
static size_t conv_w_count(const kernel_conv2d_dims *d) { return (size_t)d->filters * d->c * d->size * d->size; }
static size_t conv_out_count(const kernel_conv2d_dims *d)
{
    return (size_t)d->n * d->filters * kernel_conv2d_out_h(d) * kernel_conv2d_out_w(d);
}
static void conv_weight(float *dw, float *db, float *work, const float *dout, const float *in,
                        const kernel_conv2d_dims *d, int prec)
{
    if (prec == KERNEL_CUDA_FP32) {
        kernel_conv2d_backward_weight_cpu(dw, db, work, dout, in, d);
        return;
    }
    float *rd = rounded(dout, conv_out_count(d), prec), *ri = rounded(in, conv_in_count(d), prec);
    kernel_conv2d_backward_weight_cpu(dw, NULL, work, rd, ri, d);
    unround(rd, dout); unround(ri, in);
    if (!db) return;
    float *spare = zeros(conv_w_count(d));
    kernel_conv2d_backward_weight_cpu(spare, db, work, dout, in, d);
    free(spare);
}
static void conv_input(float *din, float *work, const float *dout, const float *w,
                       const kernel_conv2d_dims *d, int prec)
{
    float *rd = rounded(dout, conv_out_count(d), prec), *rw = rounded(w, conv_w_count(d), prec);
    kernel_conv2d_backward_input_cpu(din, work, rd, rw, d);
    unround(rd, dout); unround(rw, w);
}
