/* 2-D convolution (cross-correlation with zero padding and stride, as F.conv2d).
 *
 * The whole batch goes through one sgemm per product: im2col lays the input out as a matrix
 * col[c·k·k, pixels] with one column per (sample, output pixel), so that
 *   forward:  y[f, pixels]     = w[f, c·k·k] · col
 *   backward: dw[f, c·k·k]    += dy[f, pixels] · col^T
 *             dcol[c·k·k, ·]   = w^T · dy          → col2im adds it back into din.
 * One large product keeps OpenBLAS's threads busy where a product per sample (c·k·k × oh·ow,
 * tiny for the later layers) would be dominated by call and packing overhead.
 *
 * Two orders of the pixel columns, chosen from the shapes (conv_geom_init):
 * - sample-major (n, oh, ow): im2col copies rows of ow floats out of each NCHW plane, and
 *   y[f, n, ·] → out[n, f, ·] is a contiguous copy per (n, f). Good for wide planes.
 * - batch-minor (oh, ow, n): the input is first repacked as [c][h+2p][w+2p][n] with the
 *   padding written out, after which every im2col row is a few long contiguous copies
 *   (ow·n floats per output row at stride 1) and col2im a few long vector adds. For small
 *   planes (the CNN's 11×11 and 3×3 outputs) the sample-major rows are only 3–11 floats,
 *   and copying them one by one cost as much as the sgemm itself. The price is transposing
 *   the input and output between NCHW and n-innermost order, which is cheap by comparison.
 *
 * Workspace: col (c·k·k · n·oh·ow floats), then y/dy (filters · n·oh·ow floats), then for the
 * batch-minor order the repacked input c·(h+2p)·(w+2p)·n. In the backward, dcol reuses col
 * once dw has been formed, and the repacked input's space receives the padded din. */
#include "kernels/kernels.h"

#include "kernels/bf16.h"

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

typedef struct {
    int oh, ow;           /* output height and width */
    int hp, wp;           /* padded input height and width */
    size_t plane;         /* oh·ow */
    size_t cols;          /* n·oh·ow: columns of col, y and dy */
    int kk;               /* c·k·k: rows of col */
    int batch_minor;      /* column order (oh, ow, n) rather than (n, oh, ow) */
} conv_geom;

static void conv_geom_init(conv_geom *g, const kernel_conv2d_dims *d)
{
    g->oh = kernel_conv2d_out_h(d);
    g->ow = kernel_conv2d_out_w(d);
    g->hp = d->h + 2 * d->pad;
    g->wp = d->w + 2 * d->pad;
    g->plane = (size_t)g->oh * g->ow;
    g->cols = (size_t)d->n * g->plane;
    g->kk = d->c * d->size * d->size;
    /* Sample-major rows are ow floats long, batch-minor runs are n floats (and ow·n at
     * stride 1): take the batch-minor order when output rows are shorter than one 64-byte
     * vector and the batch is longer than a row. */
    g->batch_minor = g->ow < 16 && d->n > g->ow;
}

size_t kernel_conv2d_workspace_floats(const kernel_conv2d_dims *d)
{
    conv_geom g;
    conv_geom_init(&g, d);
    size_t floats = (size_t)g.kk * g.cols + (size_t)d->filters * g.cols;
    if (g.batch_minor)
        floats += (size_t)d->c * g.hp * g.wp * d->n;
    return floats;
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

/* ---------------- sample-major order: columns (n, oh, ow) ---------------- */

/* First and one-past-last output column whose input column ow·stride + off lies inside
 * [0, w): outside that range the column reads padding. */
static void conv_valid_range(int *lo, int *hi, int off, int stride, int w, int ow)
{
    int a = off >= 0 ? 0 : (-off + stride - 1) / stride;
    int b = w - off <= 0 ? 0 : (w - off + stride - 1) / stride; /* first ow reading ≥ w */
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
static void conv_im2col(float *col, const float *in, const kernel_conv2d_dims *d,
                        const conv_geom *g)
{
    const int k = d->size, s = d->stride, p = d->pad;
    for (int c = 0; c < d->c; c++) {
        for (int smp = 0; smp < d->n; smp++) {
            const float *src = in + ((size_t)smp * d->c + c) * d->h * d->w;
            for (int ki = 0; ki < k; ki++) {
                for (int kj = 0; kj < k; kj++) {
                    float *dst = col + ((size_t)(c * k + ki) * k + kj) * g->cols +
                                 smp * g->plane;
                    const int off = kj - p;
                    int lo, hi;
                    conv_valid_range(&lo, &hi, off, s, d->w, g->ow);
                    for (int oh = 0; oh < g->oh; oh++) {
                        float *row = dst + (size_t)oh * g->ow;
                        const int ih = oh * s + ki - p;
                        if (ih < 0 || ih >= d->h) {
                            memset(row, 0, (size_t)g->ow * sizeof *row);
                            continue;
                        }
                        const float *srow = src + (size_t)ih * d->w;
                        for (int ow = 0; ow < lo; ow++)
                            row[ow] = 0.0f;
                        if (s == 1) {
                            memcpy(row + lo, srow + lo + off, (size_t)(hi - lo) * sizeof *row);
                        } else {
                            for (int ow = lo; ow < hi; ow++)
                                row[ow] = srow[ow * s + off];
                        }
                        for (int ow = hi; ow < g->ow; ow++)
                            row[ow] = 0.0f;
                    }
                }
            }
        }
    }
}

/* The adjoint of conv_im2col: din (zeroed first) += every col entry at its input position. */
static void conv_col2im(float *din, const float *col, const kernel_conv2d_dims *d,
                        const conv_geom *g)
{
    const int k = d->size, s = d->stride, p = d->pad;
    memset(din, 0, (size_t)d->n * d->c * d->h * d->w * sizeof *din);
    for (int c = 0; c < d->c; c++) {
        for (int smp = 0; smp < d->n; smp++) {
            float *dst = din + ((size_t)smp * d->c + c) * d->h * d->w;
            for (int ki = 0; ki < k; ki++) {
                for (int kj = 0; kj < k; kj++) {
                    const float *src = col + ((size_t)(c * k + ki) * k + kj) * g->cols +
                                       smp * g->plane;
                    const int off = kj - p;
                    int lo, hi;
                    conv_valid_range(&lo, &hi, off, s, d->w, g->ow);
                    for (int oh = 0; oh < g->oh; oh++) {
                        const int ih = oh * s + ki - p;
                        if (ih < 0 || ih >= d->h)
                            continue;
                        const float *row = src + (size_t)oh * g->ow;
                        float *drow = dst + (size_t)ih * d->w;
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

/* ---------------- batch-minor order: columns (oh, ow, n) ---------------- */

/* dst[j·ldd + i] = src[i·lds + j] + add for i < rows, j < cols. In 16×16 tiles, so that
 * both the reads and the writes of a tile stay within 16 cache lines each: 3–4× faster
 * than an element-wise transpose whose writes stride across memory. */
static void conv_transpose_add(float *restrict dst, size_t ldd, const float *restrict src,
                               size_t lds, size_t rows, size_t cols, float add)
{
    enum { TILE = 16 };
    for (size_t i0 = 0; i0 < rows; i0 += TILE) {
        const size_t i1 = i0 + TILE < rows ? i0 + TILE : rows;
        for (size_t j0 = 0; j0 < cols; j0 += TILE) {
            const size_t j1 = j0 + TILE < cols ? j0 + TILE : cols;
            if (i1 - i0 == TILE && j1 - j0 == TILE) {
                /* Constant trip counts: the compiler unrolls and vectorises this tile. */
                for (size_t j = 0; j < TILE; j++)
                    for (size_t i = 0; i < TILE; i++)
                        dst[(j0 + j) * ldd + i0 + i] = src[(i0 + i) * lds + j0 + j] + add;
            } else {
                for (size_t j = j0; j < j1; j++)
                    for (size_t i = i0; i < i1; i++)
                        dst[j * ldd + i] = src[i * lds + j] + add;
            }
        }
    }
}

/* The same without the addition (x + 0 would turn −0 into +0). */
static void conv_transpose(float *restrict dst, size_t ldd, const float *restrict src,
                           size_t lds, size_t rows, size_t cols)
{
    enum { TILE = 16 };
    for (size_t i0 = 0; i0 < rows; i0 += TILE) {
        const size_t i1 = i0 + TILE < rows ? i0 + TILE : rows;
        for (size_t j0 = 0; j0 < cols; j0 += TILE) {
            const size_t j1 = j0 + TILE < cols ? j0 + TILE : cols;
            if (i1 - i0 == TILE && j1 - j0 == TILE) {
                for (size_t j = 0; j < TILE; j++)
                    for (size_t i = 0; i < TILE; i++)
                        dst[(j0 + j) * ldd + i0 + i] = src[(i0 + i) * lds + j0 + j];
            } else {
                for (size_t j = j0; j < j1; j++)
                    for (size_t i = i0; i < i1; i++)
                        dst[j * ldd + i] = src[i * lds + j];
            }
        }
    }
}

/* in[n][c][h][w] → xp[c][h + 2p][w + 2p][n], the padding written as zeros. */
static void conv_pack_input(float *xp, const float *in, const kernel_conv2d_dims *d,
                            const conv_geom *g)
{
    const size_t n = (size_t)d->n, hw = (size_t)d->h * d->w, ld_in = (size_t)d->c * hw;
    const int p = d->pad;
    if (p > 0)
        memset(xp, 0, (size_t)d->c * g->hp * g->wp * n * sizeof *xp);
    for (int c = 0; c < d->c; c++) {
        float *dst_c = xp + (size_t)c * g->hp * g->wp * n;
        const float *src_c = in + (size_t)c * hw;
        if (p == 0) {
            conv_transpose(dst_c, n, src_c, ld_in, n, hw);
            continue;
        }
        for (int ih = 0; ih < d->h; ih++)
            conv_transpose(dst_c + ((size_t)(ih + p) * g->wp + p) * n, n,
                           src_c + (size_t)ih * d->w, ld_in, n, (size_t)d->w);
    }
}

/* The inverse for gradients: din[n][c][h][w] = dxp[c][h + p][w + p][n] (padding dropped). */
static void conv_unpack_input(float *din, const float *dxp, const kernel_conv2d_dims *d,
                              const conv_geom *g)
{
    const size_t n = (size_t)d->n, hw = (size_t)d->h * d->w, ld_in = (size_t)d->c * hw;
    const int p = d->pad;
    for (int c = 0; c < d->c; c++) {
        const float *src_c = dxp + (size_t)c * g->hp * g->wp * n;
        float *dst_c = din + (size_t)c * hw;
        if (p == 0) {
            conv_transpose(dst_c, ld_in, src_c, n, hw, n);
            continue;
        }
        for (int ih = 0; ih < d->h; ih++)
            conv_transpose(dst_c + (size_t)ih * d->w, ld_in,
                           src_c + ((size_t)(ih + p) * g->wp + p) * n, n, (size_t)d->w, n);
    }
}

/* col[(c·k + ki)·k + kj][(oh·OW + ow)·n + s] = xp[c][oh·stride + ki][ow·stride + kj][s].
 * At stride 1 the ow·n floats of one output row are contiguous in xp too. */
static void conv_im2col_bm(float *col, const float *xp, const kernel_conv2d_dims *d,
                           const conv_geom *g)
{
    const int k = d->size, s = d->stride;
    const size_t n = (size_t)d->n;
    for (int c = 0; c < d->c; c++) {
        const float *src_c = xp + (size_t)c * g->hp * g->wp * n;
        for (int ki = 0; ki < k; ki++) {
            for (int kj = 0; kj < k; kj++) {
                float *row = col + ((size_t)(c * k + ki) * k + kj) * g->cols;
                for (int oh = 0; oh < g->oh; oh++) {
                    float *dst = row + (size_t)oh * g->ow * n;
                    const float *src = src_c + ((size_t)(oh * s + ki) * g->wp + kj) * n;
                    if (s == 1) {
                        memcpy(dst, src, (size_t)g->ow * n * sizeof *dst);
                    } else {
                        for (int ow = 0; ow < g->ow; ow++)
                            memcpy(dst + ow * n, src + (size_t)ow * s * n, n * sizeof *dst);
                    }
                }
            }
        }
    }
}

/* The adjoint: dxp (zeroed first) += col at the positions conv_im2col_bm read from. */
static void conv_col2im_bm(float *dxp, const float *col, const kernel_conv2d_dims *d,
                           const conv_geom *g)
{
    const int k = d->size, s = d->stride;
    const size_t n = (size_t)d->n;
    memset(dxp, 0, (size_t)d->c * g->hp * g->wp * n * sizeof *dxp);
    for (int c = 0; c < d->c; c++) {
        float *dst_c = dxp + (size_t)c * g->hp * g->wp * n;
        for (int ki = 0; ki < k; ki++) {
            for (int kj = 0; kj < k; kj++) {
                const float *row = col + ((size_t)(c * k + ki) * k + kj) * g->cols;
                for (int oh = 0; oh < g->oh; oh++) {
                    const float *src = row + (size_t)oh * g->ow * n;
                    float *dst = dst_c + ((size_t)(oh * s + ki) * g->wp + kj) * n;
                    if (s == 1) {
                        const size_t len = (size_t)g->ow * n;
                        for (size_t i = 0; i < len; i++)
                            dst[i] += src[i];
                    } else {
                        for (int ow = 0; ow < g->ow; ow++) {
                            float *dd = dst + (size_t)ow * s * n;
                            const float *ss = src + (size_t)ow * n;
                            for (size_t i = 0; i < n; i++)
                                dd[i] += ss[i];
                        }
                    }
                }
            }
        }
    }
}

/* ---------------- the kernels ---------------- */

/* C[m, n] = A · B (+ C where acc), A stored transposed (k rows of m) where ta and B (n rows
 * of k) where tb, all contiguous: sgemm in fp32, or bf16 operands (kernels/bf16.h). */
static int conv_gemm(const kernel_conv2d_dims *d, int ta, int tb, int m, int n, int k,
                     const float *A, const float *B, float *C, int acc)
{
    if (d->bf16) return kernel_gemm_bf16(ta, tb, m, n, k, A, B, C, NULL, acc);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                m, n, k, 1.0f, A, ta ? m : k, B, tb ? k : n, acc ? 1.0f : 0.0f, C, n);
    return 0;
}

int kernel_conv2d_forward_cpu(float *out, float *work, const float *in, const float *w,
                              const float *b, const kernel_conv2d_dims *d)
{
    conv_geom g;
    conv_geom_init(&g, d);
    float *col = work;
    float *y = col + (size_t)g.kk * g.cols;
    const size_t plane = g.plane, n = (size_t)d->n;

    if (g.batch_minor) {
        float *xp = y + (size_t)d->filters * g.cols;
        conv_pack_input(xp, in, d, &g);
        conv_im2col_bm(col, xp, d, &g);
    } else {
        conv_im2col(col, in, d, &g);
    }
    if (conv_gemm(d, 0, 0, d->filters, (int)g.cols, g.kk, w, col, y, 0)) return -1;
    /* y[f][columns] → out[n][f][pixel], adding the bias on the way. */
    for (int f = 0; f < d->filters; f++) {
        const float bias = b ? b[f] : 0.0f;
        const float *src_f = y + (size_t)f * g.cols;
        if (g.batch_minor) {
            conv_transpose_add(out + f * plane, (size_t)d->filters * plane, src_f, n, plane, n,
                               bias);
            continue;
        }
        for (size_t smp = 0; smp < n; smp++) {
            float *dst = out + (smp * d->filters + f) * plane;
            const float *src = src_f + smp * plane;
            for (size_t i = 0; i < plane; i++)
                dst[i] = src[i] + bias;
        }
    }
    return 0;
}

/* The backward's two halves share the dout → dy transpose; each computes exactly what the
 * fused call does for its outputs, so B and W apart give the fused call's bits. */
enum { CONV_WEIGHT = 1, CONV_INPUT = 2 };

static int conv_backward(float *din, float *dw, float *db, float *work, const float *dout,
                          const float *in, const float *w, const kernel_conv2d_dims *d,
                          int parts)
{
    conv_geom g;
    conv_geom_init(&g, d);
    float *col = work;
    float *dy = col + (size_t)g.kk * g.cols;
    float *xp = dy + (size_t)d->filters * g.cols; /* batch-minor only */
    const size_t plane = g.plane, n = (size_t)d->n;

    /* dout[n][f][pixel] → dy[f][columns]; the bias gradient sums each plane. */
    for (int f = 0; f < d->filters; f++) {
        float *dst_f = dy + (size_t)f * g.cols;
        if (g.batch_minor)
            conv_transpose(dst_f, n, dout + f * plane, (size_t)d->filters * plane, n, plane);
        for (size_t smp = 0; smp < n; smp++) {
            const float *src = dout + (smp * d->filters + f) * plane;
            if (!g.batch_minor)
                memcpy(dst_f + smp * plane, src, plane * sizeof *dst_f);
            if (db && (parts & CONV_WEIGHT))
                db[f] += conv_sum(src, plane);
        }
    }
    if (parts & CONV_WEIGHT) {
        /* The forward's col is not kept (the workspace may have served other layers since),
         * so it is rebuilt here. */
        if (g.batch_minor) {
            conv_pack_input(xp, in, d, &g);
            conv_im2col_bm(col, xp, d, &g);
        } else {
            conv_im2col(col, in, d, &g);
        }
        if (conv_gemm(d, 0, 1, d->filters, g.kk, (int)g.cols, dy, col, dw, 1)) return -1;
    }
    if (!din || !(parts & CONV_INPUT))
        return 0;
    if (conv_gemm(d, 1, 0, g.kk, (int)g.cols, d->filters, w, dy, col, 0)) return -1;
    if (g.batch_minor) {
        conv_col2im_bm(xp, col, d, &g);
        conv_unpack_input(din, xp, d, &g);
    } else {
        conv_col2im(din, col, d, &g);
    }
    return 0;
}

int kernel_conv2d_backward_cpu(float *din, float *dw, float *db, float *work,
                               const float *dout, const float *in, const float *w,
                               const kernel_conv2d_dims *d)
{
    return conv_backward(din, dw, db, work, dout, in, w, d, CONV_WEIGHT | CONV_INPUT);
}

int kernel_conv2d_backward_weight_cpu(float *dw, float *db, float *work, const float *dout,
                                      const float *in, const kernel_conv2d_dims *d)
{
    return conv_backward(NULL, dw, db, work, dout, in, NULL, d, CONV_WEIGHT);
}

int kernel_conv2d_backward_input_cpu(float *din, float *work, const float *dout,
                                     const float *w, const kernel_conv2d_dims *d)
{
    return conv_backward(din, NULL, NULL, work, dout, NULL, w, d, CONV_INPUT);
}
