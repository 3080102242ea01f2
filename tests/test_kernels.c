/* The CPU layer kernels by their own properties: dense, conv, pooling and softmax
 * cross-entropy, every backward against central finite differences of L = Σ r·out (r random,
 * L summed in double from the float forward), forwards against direct double-precision
 * loops, and gradient accumulation. Activations, dropout, optimizers and initialisation:
 * tests/test_kernels_elementwise.c. (tests/test_golden.c compares the same kernels with
 * PyTorch.) */
#include "kernels/kernels.h"
#include "tests/check.h"
#include "tests/kernels_fd.h"

#include <stdio.h>
#include <stdint.h>
#include <string.h>

/* ---- dense ---- */

typedef struct {
    float *in, *w, *b, *r, *out;
    int n, in_f, out_f;
} dense_ctx;

static double dense_loss(void *p)
{
    dense_ctx *c = p;
    kernel_dense_forward_cpu(c->out, c->in, c->w, c->b, c->n, c->in_f, c->out_f);
    return weighted_sum(c->r, c->out, (size_t)c->n * c->out_f);
}

Test(kernels, dense_forward_backward)
{
    const int n = 5, in_f = 7, out_f = 4;
    const size_t ni = (size_t)n * in_f, nw = (size_t)out_f * in_f, no = (size_t)n * out_f;
    dense_ctx c = {rand_array(ni, 1, 1), rand_array(nw, 1, 2), rand_array(out_f, 1, 3),
                   rand_array(no, 1, 4), malloc(no * sizeof(float)), n, in_f, out_f};
    /* Forward against a direct loop. */
    double ref[5 * 4];
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out_f; o++) {
            ref[i * out_f + o] = c.b[o];
            for (int k = 0; k < in_f; k++)
                ref[i * out_f + o] += (double)c.in[i * in_f + k] * c.w[o * in_f + k];
        }
    kernel_dense_forward_cpu(c.out, c.in, c.w, c.b, n, in_f, out_f);
    CHECK_CLOSE("dense out", c.out, ref, no, 1e-6, 1e-5);

    float *din = malloc(ni * sizeof *din), *dw = calloc(nw, sizeof *dw);
    float *db = calloc(out_f, sizeof *db);
    kernel_dense_backward_cpu(din, dw, db, c.r, c.in, c.w, n, in_f, out_f);
    /* L is linear in each argument, so any step is exact up to rounding: a large one. */
    CHECK_FD("dense din", din, c.in, ni, 0.25f, dense_loss, &c, 2e-4, 1e-3);
    CHECK_FD("dense dw", dw, c.w, nw, 0.25f, dense_loss, &c, 2e-4, 1e-3);
    CHECK_FD("dense db", db, c.b, out_f, 0.25f, dense_loss, &c, 2e-4, 1e-3);

    /* Parameter gradients accumulate; din NULL is allowed and changes nothing else. */
    float *dw2 = copy_array(dw, nw), *db2 = copy_array(db, out_f);
    kernel_dense_backward_cpu(NULL, dw2, db2, c.r, c.in, c.w, n, in_f, out_f);
    for (size_t i = 0; i < nw; i++)
        dw[i] *= 2.0f;
    for (int i = 0; i < out_f; i++)
        db[i] *= 2.0f;
    CHECK_CLOSE("dense dw twice", dw2, dw, nw, 1e-6, 1e-6);
    CHECK_CLOSE("dense db twice", db2, db, out_f, 1e-6, 1e-6);
    free(c.in); free(c.w); free(c.b); free(c.r); free(c.out);
    free(din); free(dw); free(db); free(dw2); free(db2);
}

/* ---- conv2d ---- */

typedef struct {
    kernel_conv2d_dims d;
    float *in, *w, *b, *r, *out, *work;
} conv_ctx;

static double conv_loss(void *p)
{
    conv_ctx *c = p;
    kernel_conv2d_forward_cpu(c->out, c->work, c->in, c->w, c->b, &c->d);
    return weighted_sum(c->r, c->out,
                        (size_t)c->d.n * c->d.filters * kernel_conv2d_out_h(&c->d) *
                            kernel_conv2d_out_w(&c->d));
}

static void conv_reference(double *out, const float *in, const float *w, const float *b,
                           const kernel_conv2d_dims *d)
{
    const int oh_n = kernel_conv2d_out_h(d), ow_n = kernel_conv2d_out_w(d);
    for (int s = 0; s < d->n; s++)
        for (int f = 0; f < d->filters; f++)
            for (int oh = 0; oh < oh_n; oh++)
                for (int ow = 0; ow < ow_n; ow++) {
                    double acc = b[f];
                    for (int c = 0; c < d->c; c++)
                        for (int ki = 0; ki < d->size; ki++)
                            for (int kj = 0; kj < d->size; kj++) {
                                int ih = oh * d->stride + ki - d->pad;
                                int iw = ow * d->stride + kj - d->pad;
                                if (ih < 0 || ih >= d->h || iw < 0 || iw >= d->w)
                                    continue;
                                acc += (double)in[((s * d->c + c) * d->h + ih) * d->w + iw] *
                                       w[((f * d->c + c) * d->size + ki) * d->size + kj];
                            }
                    out[((s * d->filters + f) * oh_n + oh) * ow_n + ow] = acc;
                }
}

enum { CONV_GUARD = 64 };

static void conv_check_shape(kernel_conv2d_dims d, uint64_t seed)
{
    const size_t ni = (size_t)d.n * d.c * d.h * d.w;
    const size_t nw = (size_t)d.filters * d.c * d.size * d.size;
    const size_t no = (size_t)d.n * d.filters * kernel_conv2d_out_h(&d) * kernel_conv2d_out_w(&d);
    const size_t nwork = kernel_conv2d_workspace_floats(&d);
    char what[128];
    snprintf(what, sizeof what, "conv n%d c%d %dx%d f%d k%d s%d p%d", d.n, d.c, d.h, d.w,
             d.filters, d.size, d.stride, d.pad);
    conv_ctx c = {d, rand_array(ni, 1, seed), rand_array(nw, 0.5f, seed + 1),
                  rand_array(d.filters, 1, seed + 2), rand_array(no, 1, seed + 3),
                  malloc(no * sizeof(float)), malloc((nwork + CONV_GUARD) * sizeof(float))};
    /* A guard after the workspace catches a size function that promises too little. */
    for (int i = 0; i < CONV_GUARD; i++)
        c.work[nwork + i] = 12345.0f;

    double *ref = malloc(no * sizeof *ref);
    conv_reference(ref, c.in, c.w, c.b, &d);
    kernel_conv2d_forward_cpu(c.out, c.work, c.in, c.w, c.b, &d);
    CHECK_CLOSE(what, c.out, ref, no, 1e-5, 1e-5);

    float *din = malloc(ni * sizeof *din), *dw = calloc(nw, sizeof *dw);
    float *db = calloc(d.filters, sizeof *db);
    kernel_conv2d_backward_cpu(din, dw, db, c.work, c.r, c.in, c.w, &d);
    CHECK_FD(what, din, c.in, ni, 0.25f, conv_loss, &c, 2e-4, 1e-3);
    CHECK_FD(what, dw, c.w, nw, 0.25f, conv_loss, &c, 2e-4, 1e-3);
    CHECK_FD(what, db, c.b, d.filters, 0.25f, conv_loss, &c, 2e-4, 1e-3);

    float *dw2 = copy_array(dw, nw), *db2 = copy_array(db, d.filters);
    kernel_conv2d_backward_cpu(NULL, dw2, db2, c.work, c.r, c.in, c.w, &d);
    for (size_t i = 0; i < nw; i++)
        dw[i] *= 2.0f;
    for (int i = 0; i < d.filters; i++)
        db[i] *= 2.0f;
    CHECK_CLOSE(what, dw2, dw, nw, 1e-5, 1e-5);
    CHECK_CLOSE(what, db2, db, d.filters, 1e-5, 1e-5);
    for (int i = 0; i < CONV_GUARD; i++)
        cr_assert(c.work[nwork + i] == 12345.0f, "%s: wrote past the workspace", what);
    free(c.in); free(c.w); free(c.b); free(c.r); free(c.out); free(c.work);
    free(ref); free(din); free(dw); free(db); free(dw2); free(db2);
}

Test(kernels, conv2d_shapes)
{
    /* kernels/conv.c orders the pixel columns sample-major when output rows are ≥ 16 wide
     * or the batch is no longer than a row, batch-minor otherwise; both appear here. */
    const kernel_conv2d_dims shapes[] = {
        /* sample-major */
        {.n = 2, .c = 3, .h = 6, .w = 5, .filters = 4, .size = 3, .stride = 1, .pad = 0},
        {.n = 2, .c = 2, .h = 7, .w = 6, .filters = 3, .size = 3, .stride = 2, .pad = 1},
        {.n = 1, .c = 2, .h = 5, .w = 8, .filters = 2, .size = 2, .stride = 2, .pad = 0},
        {.n = 2, .c = 1, .h = 4, .w = 5, .filters = 3, .size = 1, .stride = 1, .pad = 0},
        {.n = 1, .c = 2, .h = 6, .w = 7, .filters = 2, .size = 5, .stride = 1, .pad = 2},
        {.n = 2, .c = 2, .h = 3, .w = 9, .filters = 2, .size = 3, .stride = 1, .pad = 1},
        {.n = 20, .c = 1, .h = 4, .w = 18, .filters = 2, .size = 3, .stride = 1, .pad = 1},
        /* batch-minor */
        {.n = 3, .c = 3, .h = 5, .w = 5, .filters = 2, .size = 3, .stride = 3, .pad = 1},
        {.n = 6, .c = 2, .h = 5, .w = 6, .filters = 3, .size = 3, .stride = 1, .pad = 0},
        {.n = 5, .c = 2, .h = 7, .w = 6, .filters = 2, .size = 3, .stride = 2, .pad = 1},
        {.n = 6, .c = 1, .h = 6, .w = 5, .filters = 2, .size = 5, .stride = 1, .pad = 2},
        {.n = 17, .c = 1, .h = 4, .w = 17, .filters = 2, .size = 3, .stride = 1, .pad = 0},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        conv_check_shape(shapes[k], 100 + 10 * k);
}

Test(kernels, conv2d_output_size)
{
    kernel_conv2d_dims d = {.n = 1, .c = 1, .h = 28, .w = 13, .filters = 1, .size = 3,
                            .stride = 2, .pad = 1};
    cr_expect_eq(kernel_conv2d_out_h(&d), 14);
    cr_expect_eq(kernel_conv2d_out_w(&d), 7);
    d.stride = 1;
    d.pad = 0;
    cr_expect_eq(kernel_conv2d_out_h(&d), 26);
    cr_expect_eq(kernel_conv2d_out_w(&d), 11);
}

/* ---- pooling ---- */

typedef struct {
    float *in, *r, *out;
    int32_t *argmax;
    int n, c, h, w, size, stride, is_max;
} pool_ctx;

static size_t pool_out_count(const pool_ctx *c)
{
    return (size_t)c->n * c->c * ((c->h - c->size) / c->stride + 1) *
           ((c->w - c->size) / c->stride + 1);
}

static double pool_loss(void *p)
{
    pool_ctx *c = p;
    if (c->is_max)
        kernel_maxpool2d_forward_cpu(c->out, c->argmax, c->in, c->n, c->c, c->h, c->w,
                                     c->size, c->stride);
    else
        kernel_avgpool2d_forward_cpu(c->out, c->in, c->n, c->c, c->h, c->w, c->size,
                                     c->stride);
    return weighted_sum(c->r, c->out, pool_out_count(c));
}

static void pool_check(int is_max, int n, int ch, int h, int w, int size, int stride,
                       uint64_t seed)
{
    pool_ctx c = {NULL, NULL, NULL, NULL, n, ch, h, w, size, stride, is_max};
    const size_t ni = (size_t)n * ch * h * w, no = pool_out_count(&c);
    const int oh_n = (h - size) / stride + 1, ow_n = (w - size) / stride + 1;
    char what[96];
    snprintf(what, sizeof what, "%s pool %dx%d size %d stride %d", is_max ? "max" : "avg", h,
             w, size, stride);
    /* Distinct values 0.05 apart, so the ±0.01 steps never change which element is largest. */
    c.in = malloc(ni * sizeof *c.in);
    for (size_t i = 0; i < ni; i++)
        c.in[i] = (float)(i * 7919 % ni) * 0.05f - 3.0f;
    c.r = rand_array(no, 1, seed);
    c.out = malloc(no * sizeof *c.out);
    c.argmax = malloc(no * sizeof *c.argmax);
    pool_loss(&c);

    /* Forward against a direct loop (first maximum, strict >). */
    double *ref = malloc(no * sizeof *ref);
    for (int pl = 0; pl < n * ch; pl++)
        for (int oh = 0; oh < oh_n; oh++)
            for (int ow = 0; ow < ow_n; ow++) {
                double best = -INFINITY, sum = 0.0;
                int at = -1;
                for (int i = 0; i < size; i++)
                    for (int j = 0; j < size; j++) {
                        int idx = (oh * stride + i) * w + ow * stride + j;
                        double v = c.in[(size_t)pl * h * w + idx];
                        sum += v;
                        if (v > best) {
                            best = v;
                            at = idx;
                        }
                    }
                size_t o = ((size_t)pl * oh_n + oh) * ow_n + ow;
                ref[o] = is_max ? best : sum / (size * size);
                if (is_max)
                    cr_assert(c.argmax[o] == at, "%s: argmax[%zu] %d, expected %d", what, o,
                              c.argmax[o], at);
            }
    CHECK_CLOSE(what, c.out, ref, no, 1e-6, 1e-6);

    float *din = malloc(ni * sizeof *din);
    if (is_max)
        kernel_maxpool2d_backward_cpu(din, c.r, c.argmax, n, ch, h, w, size, stride);
    else
        kernel_avgpool2d_backward_cpu(din, c.r, n, ch, h, w, size, stride);
    CHECK_FD(what, din, c.in, ni, 0.01f, pool_loss, &c, 1e-3, 1e-3);
    free(c.in); free(c.r); free(c.out); free(c.argmax); free(ref); free(din);
}

Test(kernels, maxpool)
{
    pool_check(1, 2, 3, 6, 6, 2, 2, 1);
    pool_check(1, 2, 2, 7, 9, 2, 2, 2);  /* odd sizes: floor drops the last row/column */
    pool_check(1, 1, 3, 9, 8, 3, 2, 3);  /* overlapping windows accumulate in backward */
    pool_check(1, 2, 1, 5, 7, 3, 1, 4);
}

Test(kernels, maxpool_ties_and_specials)
{
    /* 2×2 stride 2 (kernels/pool.c's dedicated path): equal values pick the first in
     * row-major order, all −inf still names the window's first element, NaN wins and
     * propagates wherever it sits in the window. */
    float in[4 * 6] = {1, 1, 2, 0, 5, -1,
                       1, 1, 2, 2, 4, NAN,
                       -INFINITY, -INFINITY, 0, NAN, 1, 1,
                       -INFINITY, -INFINITY, 3, 1, 7, 7};
    float out[6];
    int32_t idx[6];
    const int32_t want[6] = {0, 2, 11, 12, 15, 22};
    kernel_maxpool2d_forward_cpu(out, idx, in, 1, 1, 4, 6, 2, 2);
    for (int i = 0; i < 6; i++)
        cr_expect(idx[i] == want[i], "2x2 window %d: argmax %d, expected %d", i, idx[i], want[i]);
    cr_expect(out[0] == 1.0f && out[1] == 2.0f && out[3] == -INFINITY && out[5] == 7.0f);
    cr_expect(isnan(out[2]) && isnan(out[4]), "NaN must propagate");

    /* The general path (3×3, stride 2, overlapping): ties and NaN the same way. */
    float flat[5 * 5];
    for (int i = 0; i < 25; i++)
        flat[i] = 0.5f;
    float o2[4];
    int32_t i2[4];
    kernel_maxpool2d_forward_cpu(o2, i2, flat, 1, 1, 5, 5, 3, 2);
    const int32_t first[4] = {0, 2, 10, 12};
    for (int i = 0; i < 4; i++)
        cr_expect(i2[i] == first[i] && o2[i] == 0.5f, "3x3 window %d: argmax %d, expected %d",
                  i, i2[i], first[i]);
    flat[13] = NAN; /* in the windows of outputs 1 and 3 */
    kernel_maxpool2d_forward_cpu(o2, i2, flat, 1, 1, 5, 5, 3, 2);
    cr_expect(isnan(o2[1]) && i2[1] == 13 && isnan(o2[3]) && i2[3] == 13);
    cr_expect(o2[0] == 0.5f && i2[0] == 0, "NaN leaked into a window without it");
}

/* The 2×2 stride-2 path against the general one (3 passes over the window), on rows wide
 * enough for the 16-wide vector path and with a ragged tail, quantised values so that ties
 * are common, and NaN / −inf sprinkled in. */
Test(kernels, maxpool_2x2_vector_path)
{
    const int n = 2, c = 3, h = 9, w = 70; /* 35 outputs a row: two vectors and a tail */
    const int oh = 4, ow = 35;
    size_t in_count = (size_t)n * c * h * w, out_count = (size_t)n * c * oh * ow;
    float *in = malloc(in_count * sizeof *in), *fast = malloc(out_count * sizeof *fast);
    float *ref = malloc(out_count * sizeof *ref);
    int32_t *fi = malloc(out_count * sizeof *fi), *ri = malloc(out_count * sizeof *ri);
    for (size_t i = 0; i < in_count; i++) {
        in[i] = (float)((i * 2654435761u >> 7) % 5); /* few distinct values: many ties */
        if (i % 97 == 5) in[i] = NAN;
        if (i % 89 == 3) in[i] = -INFINITY;
    }
    kernel_maxpool2d_forward_cpu(fast, fi, in, n, c, h, w, 2, 2);
    /* reference: the plain definition, first maximum in row-major order, NaN replaces */
    for (int p = 0; p < n * c; p++)
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++) {
                float best = -INFINITY;
                int32_t at = 2 * y * w + 2 * x;
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++) {
                        int32_t k = (2 * y + i) * w + 2 * x + j;
                        float v = in[(size_t)p * h * w + k];
                        if (v > best || v != v) { best = v; at = k; }
                    }
                ref[(size_t)(p * oh + y) * ow + x] = best;
                ri[(size_t)(p * oh + y) * ow + x] = at;
            }
    for (size_t i = 0; i < out_count; i++) {
        cr_assert(fi[i] == ri[i], "output %zu: argmax %d, expected %d", i, fi[i], ri[i]);
        cr_assert((isnan(fast[i]) && isnan(ref[i])) || fast[i] == ref[i],
                  "output %zu: %g, expected %g", i, fast[i], ref[i]);
    }
    free(in), free(fast), free(ref), free(fi), free(ri);
}

Test(kernels, avgpool)
{
    pool_check(0, 2, 3, 6, 6, 2, 2, 5);
    pool_check(0, 1, 2, 7, 9, 3, 2, 6);
    pool_check(0, 2, 1, 5, 5, 2, 1, 7);
}

/* ---- softmax cross-entropy ---- */

typedef struct {
    float *logits, *dl;
    const int32_t *labels;
    int n, classes;
    float scale;
} xent_ctx;

static double xent_loss(void *p)
{
    xent_ctx *c = p;
    return c->scale * kernel_softmax_xent_cpu(NULL, NULL, c->logits, c->labels, c->n,
                                              c->classes, c->scale);
}

Test(kernels, softmax_xent)
{
    const int n = 5, classes = 7;
    const int32_t labels[5] = {0, 6, 3, 3, 1};
    xent_ctx c = {rand_array(n * classes, 3, 80), malloc(n * classes * 4), labels, n, classes,
                  1.0f / 8};
    c.logits[2 * classes + 4] += 500.0f; /* a huge logit: fine once the max is subtracted */
    int correct = -1;
    double loss = kernel_softmax_xent_cpu(c.dl, &correct, c.logits, labels, n, classes, c.scale);
    double ref = 0.0;
    int ref_correct = 0;
    for (int i = 0; i < n; i++) {
        const float *x = c.logits + i * classes;
        double mx = x[0], sum = 0.0;
        int best = 0;
        for (int j = 1; j < classes; j++)
            if (x[j] > mx) {
                mx = x[j];
                best = j;
            }
        for (int j = 0; j < classes; j++)
            sum += exp((double)x[j] - mx);
        ref += log(sum) + mx - x[labels[i]];
        ref_correct += best == labels[i];
    }
    cr_expect(fabs(loss - ref) <= 1e-6 * fabs(ref), "loss %.10g, expected %.10g", loss, ref);
    cr_expect(correct == ref_correct, "correct %d, expected %d", correct, ref_correct);
    double nodl = kernel_softmax_xent_cpu(NULL, NULL, c.logits, labels, n, classes, c.scale);
    cr_expect(nodl == loss, "loss differs without dlogits");
    CHECK_FD("dlogits", c.dl, c.logits, (size_t)n * classes, 1e-2f, xent_loss, &c, 2e-5, 1e-3);
    free(c.logits); free(c.dl);
}

Test(kernels, softmax_xent_first_argmax)
{
    const float logits[2 * 3] = {1, 5, 5, 2, 2, 0};
    const int32_t labels[2] = {2, 0};
    int correct = -1;
    kernel_softmax_xent_cpu(NULL, &correct, logits, labels, 2, 3, 1.0f);
    cr_expect(correct == 1, "ties must go to the first maximum: correct %d", correct);
    const int32_t bad[2] = {2, 3}; /* 3 is not a class of 3 */
    cr_expect(isnan(kernel_softmax_xent_cpu(NULL, NULL, logits, bad, 2, 3, 1.0f)));
}
