/* 2-D convolution (cross-correlation with zero padding and stride, as F.conv2d).
 *
 * The whole batch goes through one sgemm per product: im2col lays the input out as
 * col[c·k·k, n·oh·ow] (row (c, ki, kj), column (sample, output pixel)), so that
 *   forward:  y[f, n·oh·ow]   = w[f, c·k·k] · col
 *   backward: dw[f, c·k·k]   += dy[f, n·oh·ow] · col^T
 *             dcol[c·k·k, ·] = w^T · dy            → col2im adds it back into din.
 * One large product keeps OpenBLAS's threads busy where a product per sample (k·k·c × oh·ow,
 * tiny for the later layers) would be dominated by call and packing overhead. The price is
 * the reorder between y[f, n, pixel] and NCHW out[n, f, pixel], a contiguous copy of oh·ow
 * floats per (n, f).
 *
 * Workspace: col (c·k·k · n·oh·ow floats), then y/dy (filters · n·oh·ow floats). In the
 * backward, dcol reuses col once dw has been formed. */
#include "kernels/kernels.h"

#include <cblas.h>
#include <string.h>

int kernel_conv2d_out_h(const kernel_conv2d_dims *d)
{
    return (d->h + 2 * d->pad - d->size) / d->stride + 1;
}

int kernel_conv2d_out_w(const kernel_conv2d_dims *d)
{
    return (d->w + 2 * d->pad - d->size) / d->stride + 1;
}

size_t kernel_conv2d_workspace_floats(const kernel_conv2d_dims *d)
{
    size_t cols = (size_t)d->n * (size_t)kernel_conv2d_out_h(d) *
                  (size_t)kernel_conv2d_out_w(d);
    size_t rows = (size_t)d->c * (size_t)d->size * (size_t)d->size;
    return rows * cols + (size_t)d->filters * cols;
}

/* First and one-past-last output column whose input column ow·stride + off lies inside
 * [0, w): outside that range the column reads padding. */
static void conv_valid_range(int *lo, int *hi, int off, int stride, int w, int ow)
{
    int a = off >= 0 ? 0 : (-off + stride - 1) / stride;
    int b = (w - off + stride - 1) / stride; /* first ow with ow·stride + off ≥ w */
    if (w - off <= 0)
        b = 0;
    if (b > ow)
        b = ow;
    if (a > b)
        a = b;
    *lo = a;
    *hi = b;
}

/* col[(c·k + ki)·k + kj][s·P + oh·OW + ow] = in[s, c, oh·stride + ki − pad, ow·stride + kj − pad].
 * Loop order (c, sample) outside and (ki, kj) inside keeps one input plane in L1 while its
 * k·k rows are written. */
static void conv_im2col(float *col, const float *in, const kernel_conv2d_dims *d, int oh_n,
                        int ow_n)
{
    const int k = d->size, s = d->stride, p = d->pad;
    const size_t plane_out = (size_t)oh_n * ow_n;
    const size_t ld = (size_t)d->n * plane_out;
    for (int c = 0; c < d->c; c++) {
        for (int smp = 0; smp < d->n; smp++) {
            const float *src = in + ((size_t)smp * d->c + c) * d->h * d->w;
            for (int ki = 0; ki < k; ki++) {
                for (int kj = 0; kj < k; kj++) {
                    float *dst = col + ((size_t)(c * k + ki) * k + kj) * ld + smp * plane_out;
                    int lo, hi;
                    conv_valid_range(&lo, &hi, kj - p, s, d->w, ow_n);
                    for (int oh = 0; oh < oh_n; oh++) {
                        float *row = dst + (size_t)oh * ow_n;
                        int ih = oh * s + ki - p;
                        if (ih < 0 || ih >= d->h) {
                            memset(row, 0, (size_t)ow_n * sizeof *row);
                            continue;
                        }
                        const float *srow = src + (size_t)ih * d->w;
                        const int off = kj - p;
                        for (int ow = 0; ow < lo; ow++)
                            row[ow] = 0.0f;
                        if (s == 1) {
                            memcpy(row + lo, srow + lo + off, (size_t)(hi - lo) * sizeof *row);
                        } else {
                            for (int ow = lo; ow < hi; ow++)
                                row[ow] = srow[ow * s + off];
                        }
                        for (int ow = hi; ow < ow_n; ow++)
                            row[ow] = 0.0f;
                    }
                }
            }
        }
    }
}

/* The adjoint of conv_im2col: din (zeroed first) += every col entry at its input position. */
static void conv_col2im(float *din, const float *col, const kernel_conv2d_dims *d, int oh_n,
                        int ow_n)
{
    const int k = d->size, s = d->stride, p = d->pad;
    const size_t plane_out = (size_t)oh_n * ow_n;
    const size_t ld = (size_t)d->n * plane_out;
    memset(din, 0, (size_t)d->n * d->c * d->h * d->w * sizeof *din);
    for (int c = 0; c < d->c; c++) {
        for (int smp = 0; smp < d->n; smp++) {
            float *dst = din + ((size_t)smp * d->c + c) * d->h * d->w;
            for (int ki = 0; ki < k; ki++) {
                for (int kj = 0; kj < k; kj++) {
                    const float *src =
                        col + ((size_t)(c * k + ki) * k + kj) * ld + smp * plane_out;
                    int lo, hi;
                    conv_valid_range(&lo, &hi, kj - p, s, d->w, ow_n);
                    for (int oh = 0; oh < oh_n; oh++) {
                        int ih = oh * s + ki - p;
                        if (ih < 0 || ih >= d->h)
                            continue;
                        const float *row = src + (size_t)oh * ow_n;
                        float *drow = dst + (size_t)ih * d->w;
                        const int off = kj - p;
                        if (s == 1) {
                            for (int ow = lo; ow < hi; ow++)
                                drow[ow + off] += row[ow];
                        } else {
                            for (int ow = lo; ow < hi; ow++)
                                drow[ow * s + off] += row[ow];
                        }
                    }
                }
            }
        }
    }
}

void kernel_conv2d_forward_cpu(float *out, float *work, const float *in, const float *w,
                               const float *b, const kernel_conv2d_dims *d)
{
    const int oh_n = kernel_conv2d_out_h(d), ow_n = kernel_conv2d_out_w(d);
    const int kk = d->c * d->size * d->size;
    const size_t plane = (size_t)oh_n * ow_n;
    const size_t cols = (size_t)d->n * plane;
    float *col = work;
    float *y = work + (size_t)kk * cols;

    conv_im2col(col, in, d, oh_n, ow_n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d->filters, (int)cols, kk, 1.0f, w,
                kk, col, (int)cols, 0.0f, y, (int)cols);
    /* y[f][smp][pixel] → out[smp][f][pixel], adding the bias on the way. */
    for (int smp = 0; smp < d->n; smp++) {
        for (int f = 0; f < d->filters; f++) {
            const float *src = y + (size_t)f * cols + (size_t)smp * plane;
            float *dst = out + ((size_t)smp * d->filters + f) * plane;
            const float bias = b ? b[f] : 0.0f;
            for (size_t i = 0; i < plane; i++)
                dst[i] = src[i] + bias;
        }
    }
}

/* Σ x[i] with 16 independent partial sums: a plain float reduction does not vectorise
 * (the compiler may not reassociate), this one does. */
static float conv_sum(const float *x, size_t count)
{
    float acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= count; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += x[i + j];
    float s = 0.0f;
    for (; i < count; i++)
        s += x[i];
    for (int j = 0; j < 16; j++)
        s += acc[j];
    return s;
}

void kernel_conv2d_backward_cpu(float *din, float *dw, float *db, float *work,
                                const float *dout, const float *in, const float *w,
                                const kernel_conv2d_dims *d)
{
    const int oh_n = kernel_conv2d_out_h(d), ow_n = kernel_conv2d_out_w(d);
    const int kk = d->c * d->size * d->size;
    const size_t plane = (size_t)oh_n * ow_n;
    const size_t cols = (size_t)d->n * plane;
    float *col = work;
    float *dy = work + (size_t)kk * cols;

    /* dout[smp][f][pixel] → dy[f][smp][pixel]; the bias gradient sums each plane on the way. */
    for (int smp = 0; smp < d->n; smp++) {
        for (int f = 0; f < d->filters; f++) {
            const float *src = dout + ((size_t)smp * d->filters + f) * plane;
            memcpy(dy + (size_t)f * cols + (size_t)smp * plane, src, plane * sizeof *dy);
            if (db)
                db[f] += conv_sum(src, plane);
        }
    }
    /* The forward's col is not kept (the workspace may have served other layers since), so
     * it is rebuilt here. */
    conv_im2col(col, in, d, oh_n, ow_n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d->filters, kk, (int)cols, 1.0f, dy,
                (int)cols, col, (int)cols, 1.0f, dw, kk);
    if (din) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kk, (int)cols, d->filters, 1.0f, w,
                    kk, dy, (int)cols, 0.0f, col, (int)cols);
        conv_col2im(din, col, d, oh_n, ow_n);
    }
}
