/* The CPU kernels by their own properties: every backward against central finite
 * differences of L = Σ r·out (r random, L summed in double from the float forward),
 * forwards against direct double-precision loops, gradient accumulation, dropout and
 * initialisation statistics, and the accuracy of the vectorised exp/sigmoid/tanh.
 * (tests/test_golden.c compares the same kernels with PyTorch.) */
#include "kernels/fastmath.h"
#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "tests/check.h"

#include <float.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

/* ---- helpers ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* count floats uniform in [−scale, scale), reproducible from seed; the caller frees. */
static float *rand_array(size_t count, float scale, uint64_t seed)
{
    float *a = malloc((count ? count : 1) * sizeof *a);
    for (size_t i = 0; i < count; i++)
        a[i] = ((float)(splitmix64(&seed) >> 40) * 0x1p-24f * 2.0f - 1.0f) * scale;
    return a;
}

static float *copy_array(const float *src, size_t count)
{
    float *a = malloc((count ? count : 1) * sizeof *a);
    memcpy(a, src, count * sizeof *a);
    return a;
}

static double weighted_sum(const float *r, const float *y, size_t count)
{
    double s = 0.0;
    for (size_t i = 0; i < count; i++)
        s += (double)r[i] * (double)y[i];
    return s;
}

typedef double (*loss_fn)(void *ctx);

/* g[i] = (L(x + h e_i) − L(x − h e_i)) / (actual step), with x restored afterwards. */
static double *fd_gradient(float *x, size_t count, float h, loss_fn loss, void *ctx)
{
    double *g = malloc((count ? count : 1) * sizeof *g);
    for (size_t i = 0; i < count; i++) {
        const float save = x[i];
        const float up = save + h, down = save - h;
        x[i] = up;
        const double lp = loss(ctx);
        x[i] = down;
        const double lm = loss(ctx);
        x[i] = save;
        g[i] = (lp - lm) / ((double)up - (double)down);
    }
    return g;
}

/* Analytic gradient a (float) against finite differences of the same parameter. */
#define CHECK_FD(what, a, x, count, h, loss, ctx, atol, rtol)                  \
    do {                                                                      \
        double *fd_ = fd_gradient((x), (count), (h), (loss), (ctx));          \
        CHECK_CLOSE((what), (a), fd_, (count), (atol), (rtol));               \
        free(fd_);                                                            \
    } while (0)

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

/* ---- activations ---- */

typedef struct {
    float *in, *r, *out;
    size_t count;
    kernel_act act;
} act_ctx;

static double act_loss(void *p)
{
    act_ctx *c = p;
    kernel_activation_forward_cpu(c->out, c->in, c->count, c->act);
    return weighted_sum(c->r, c->out, c->count);
}

Test(kernels, activation_backward)
{
    const char *names[] = {"linear", "relu", "sigmoid", "tanh"};
    const kernel_act acts[] = {KERNEL_ACT_LINEAR, KERNEL_ACT_RELU, KERNEL_ACT_SIGMOID,
                               KERNEL_ACT_TANH};
    const size_t n = 67;
    for (int k = 0; k < 4; k++) {
        act_ctx c = {rand_array(n, 4, 40 + k), rand_array(n, 1, 50 + k), malloc(n * sizeof(float)),
                     n, acts[k]};
        /* Keep relu's inputs away from its kink, where no difference quotient converges. */
        for (size_t i = 0; i < n; i++)
            if (fabsf(c.in[i]) < 0.05f)
                c.in[i] = 0.5f;
        act_loss(&c);
        float *din = malloc(n * sizeof *din);
        kernel_activation_backward_cpu(din, c.r, c.out, n, acts[k]);
        CHECK_FD(names[k], din, c.in, n, 1e-2f, act_loss, &c, 1e-4, 1e-3);
        act_loss(&c); /* c.out again at the unperturbed input */

        /* In place (out = in, din = dout) gives the same values. */
        float *y = copy_array(c.in, n), *g = copy_array(c.r, n);
        kernel_activation_forward_cpu(y, y, n, acts[k]);
        CHECK_CLOSE(names[k], y, c.out, n, 0, 0);
        kernel_activation_backward_cpu(g, g, y, n, acts[k]);
        CHECK_CLOSE(names[k], g, din, n, 0, 0);
        free(c.in); free(c.r); free(c.out); free(din); free(y); free(g);
    }
}

/* ---- vectorised exp, sigmoid, tanh ---- */

/* |f − ref| in units of the float ulp at ref (subnormal spacing below FLT_MIN). */
static double ulp_error(float f, double ref)
{
    if (f == (float)ref)
        return 0.0; /* also overflow to ±inf where the float reference overflows */
    double a = fabs(ref);
    double ulp = a < FLT_MIN ? 0x1p-149 : ldexp(1.0, ilogb(a) - 23);
    return fabs((double)f - ref) / ulp;
}

static float fastmath_pick(int which, float x)
{
    return which == 0 ? fastmath_expf(x) : which == 1 ? fastmath_sigmoidf(x) : fastmath_tanhf(x);
}

static double fastmath_reference(int which, double x)
{
    return which == 0 ? exp(x) : which == 1 ? 1.0 / (1.0 + exp(-x)) : tanh(x);
}

/* Worst ulp error over every 4099th float of sign·[0, hi] (the bit patterns of non-negative
 * floats grow with their value, so stepping the pattern sweeps every binade evenly). */
static double fastmath_sweep(int which, float sign, float hi, float *where)
{
    double worst = 0.0;
    for (uint32_t b = 0; b <= fastmath_bits(hi); b += 4099) {
        float x = sign * fastmath_from_bits(b);
        double e = ulp_error(fastmath_pick(which, x), fastmath_reference(which, x));
        if (!(e <= worst)) {
            worst = e;
            *where = x;
        }
    }
    return worst;
}

Test(kernels, fastmath_accuracy)
{
    const char *names[] = {"expf", "sigmoid", "tanh"};
    const double limits[] = {2.0, 3.0, 3.0};
    for (int k = 0; k < 3; k++) {
        /* exp over [−104, 89] covers overflow to inf and the whole subnormal range. */
        float w1 = 0, w2 = 0;
        double e1 = fastmath_sweep(k, 1.0f, k == 0 ? 89.0f : 120.0f, &w1);
        double e2 = fastmath_sweep(k, -1.0f, k == 0 ? 104.0f : 120.0f, &w2);
        cr_expect(e1 <= limits[k], "%s: %.3f ulp at x = %.9g", names[k], e1, (double)w1);
        cr_expect(e2 <= limits[k], "%s: %.3f ulp at x = %.9g", names[k], e2, (double)w2);
    }
}

Test(kernels, fastmath_special_values)
{
    cr_expect(fastmath_expf(0.0f) == 1.0f);
    cr_expect(fastmath_expf(INFINITY) == INFINITY);
    cr_expect(fastmath_expf(89.0f) == INFINITY);
    cr_expect(fastmath_expf(88.7f) < INFINITY);
    cr_expect(fastmath_expf(-INFINITY) == 0.0f);
    cr_expect(fastmath_expf(-200.0f) == 0.0f);
    cr_expect(fastmath_expf(-100.0f) > 0.0f); /* 3.7e−44: a subnormal, not flushed */
    cr_expect(isnan(fastmath_expf(NAN)));
    cr_expect(fastmath_sigmoidf(INFINITY) == 1.0f);
    cr_expect(fastmath_sigmoidf(-INFINITY) == 0.0f);
    cr_expect(fastmath_sigmoidf(0.0f) == 0.5f);
    cr_expect(fastmath_sigmoidf(100.0f) == 1.0f);
    float s = fastmath_sigmoidf(-80.0f); /* e^−80 = 1.8e−35, still a normal float */
    cr_expect(fabs(s - exp(-80.0)) <= 4e-7 * exp(-80.0), "sigmoid(-80) = %g", (double)s);
    cr_expect(isnan(fastmath_sigmoidf(NAN)));
    cr_expect(fastmath_tanhf(INFINITY) == 1.0f);
    cr_expect(fastmath_tanhf(-INFINITY) == -1.0f);
    cr_expect(fastmath_tanhf(30.0f) == 1.0f);
    cr_expect(fastmath_tanhf(1e-30f) == 1e-30f);
    cr_expect(signbit(fastmath_tanhf(-0.0f)));
    cr_expect(isnan(fastmath_tanhf(NAN)));
}

/* ---- dropout ---- */

typedef struct {
    float *in, *r, *out;
    uint8_t *mask;
    int n;
    size_t per;
    float p;
    const int64_t *ids;
} drop_ctx;

static double drop_loss(void *q)
{
    drop_ctx *c = q;
    kernel_dropout_forward_cpu(c->out, c->mask, c->in, c->n, c->per, c->p, 7, 11, c->ids);
    return weighted_sum(c->r, c->out, (size_t)c->n * c->per);
}

Test(kernels, dropout_definition_and_backward)
{
    const int n = 3;
    const size_t per = 13; /* not a multiple of 4: the tail of each Philox block */
    const int64_t ids[3] = {5, 0, 4000000000};
    const size_t count = n * per;
    drop_ctx c = {rand_array(count, 1, 60), rand_array(count, 1, 61), malloc(count * 4),
                  malloc(count), n, per, 0.4f, ids};
    drop_loss(&c);
    const float scale = 1.0f / (1.0f - c.p);
    for (int i = 0; i < n; i++)
        for (size_t e = 0; e < per; e++) {
            size_t k = i * per + e;
            int keep = rng_uniform_at(7, 11, ((uint64_t)ids[i] << 32) | e) < 1.0f - c.p;
            cr_assert(c.mask[k] == keep, "mask[%zu] = %d, expected %d", k, c.mask[k], keep);
            cr_assert(c.out[k] == (keep ? c.in[k] * scale : 0.0f), "out[%zu]", k);
        }
    float *din = malloc(count * sizeof *din);
    kernel_dropout_backward_cpu(din, c.r, c.mask, count, c.p);
    CHECK_FD("dropout din", din, c.in, count, 0.25f, drop_loss, &c, 1e-5, 1e-4);
    free(c.in); free(c.r); free(c.out); free(c.mask); free(din);
}

Test(kernels, dropout_statistics_and_batch_split)
{
    const int n = 50;
    const size_t per = 1001, count = n * per;
    const float p = 0.3f;
    int64_t ids[50];
    for (int i = 0; i < n; i++)
        ids[i] = 1000 + 37 * i;
    float *in = rand_array(count, 1, 70), *out = malloc(count * 4), *out2 = malloc(count * 4);
    uint8_t *mask = malloc(count), *mask2 = malloc(count);
    kernel_dropout_forward_cpu(out, mask, in, n, per, p, 3, 9, ids);
    size_t kept = 0;
    for (size_t i = 0; i < count; i++)
        kept += mask[i];
    /* Binomial: the kept fraction's standard deviation is 0.002; allow 5 of them. */
    double frac = (double)kept / count;
    cr_expect(fabs(frac - 0.7) < 0.01, "kept fraction %.4f, expected 0.7", frac);

    /* The same samples split into two micro-batches get the same masks. */
    kernel_dropout_forward_cpu(out2, mask2, in, 20, per, p, 3, 9, ids);
    kernel_dropout_forward_cpu(out2 + 20 * per, mask2 + 20 * per, in + 20 * per, n - 20, per, p,
                               3, 9, ids + 20);
    cr_expect(memcmp(mask, mask2, count) == 0, "masks depend on the batch split");
    cr_expect(memcmp(out, out2, count * 4) == 0, "outputs depend on the batch split");
    /* A different sample or seed gives a different mask. */
    cr_expect(memcmp(mask, mask + per, per) != 0, "two samples share a mask");
    kernel_dropout_forward_cpu(out2, mask2, in, n, per, p, 4, 9, ids);
    cr_expect(memcmp(mask, mask2, count) != 0, "the seed is ignored");

    /* p = 0 copies and keeps everything. */
    kernel_dropout_forward_cpu(out2, mask2, in, n, per, 0.0f, 3, 9, ids);
    cr_expect(memcmp(out2, in, count * 4) == 0);
    for (size_t i = 0; i < count; i++)
        cr_assert(mask2[i] == 1);
    kernel_dropout_backward_cpu(out2, in, mask2, count, 0.0f);
    cr_expect(memcmp(out2, in, count * 4) == 0);
    free(in); free(out); free(out2); free(mask); free(mask2);
}

/* Rows holding elements [off, off + len) of each sample equal those columns of the
 * whole-row result, for offsets inside and across the 64-element chunks the kernel draws. */
Test(kernels, dropout_range_equals_columns)
{
    const int n = 3;
    const size_t per = 300; /* not a multiple of 64: a partial last chunk */
    const int64_t ids[3] = {7, 1000, 5};
    const size_t ranges[][2] = {{0, 300}, {3, 61}, {3, 1}, {61, 70}, {65, 130}, {130, 170},
                                {64, 64}, {63, 2}, {299, 1}, {1, 299}, {128, 0}};
    const size_t nr = sizeof ranges / sizeof ranges[0];
    const float ps[2] = {0.5f, 0.0f};
    float *in = rand_array(n * per, 1, 80), *whole = malloc(n * per * sizeof *whole);
    uint8_t *wmask = malloc(n * per);
    float *rin = malloc(n * per * sizeof *rin), *rout = malloc((n * per + 1) * sizeof *rout);
    float *rout2 = malloc(n * per * sizeof *rout2);
    uint8_t *rmask = malloc(n * per + 1);
    for (int pi = 0; pi < 2; pi++) {
        const float p = ps[pi];
        kernel_dropout_forward_cpu(whole, wmask, in, n, per, p, 3, 9, ids);
        for (size_t k = 0; k < nr; k++) {
            const size_t off = ranges[k][0], len = ranges[k][1];
            for (int i = 0; i < n; i++)
                memcpy(rin + i * len, in + i * per + off, len * sizeof *rin);
            rout[n * len] = -7.0f; /* guards: nothing is written past the rows */
            rmask[n * len] = 9;
            kernel_dropout_forward_range_cpu(rout, rmask, rin, n, len, off, p, 3, 9, ids);
            cr_assert(rout[n * len] == -7.0f && rmask[n * len] == 9,
                      "p %g [%zu, +%zu): wrote past the rows", (double)p, off, len);
            for (int i = 0; i < n; i++)
                for (size_t e = 0; e < len; e++) {
                    const size_t w = i * per + off + e, r = i * len + e;
                    cr_assert(rout[r] == whole[w] && rmask[r] == wmask[w],
                              "p %g [%zu, +%zu): sample %d element %zu: %g/%d, whole %g/%d",
                              (double)p, off, len, i, off + e, (double)rout[r], rmask[r],
                              (double)whole[w], wmask[w]);
                }
            /* Without a mask, the same values. */
            kernel_dropout_forward_range_cpu(rout2, NULL, rin, n, len, off, p, 3, 9, ids);
            cr_assert(memcmp(rout, rout2, n * len * sizeof *rout) == 0,
                      "p %g [%zu, +%zu): the mask changes the output", (double)p, off, len);
            /* A wrong offset draws other numbers (p = 0 keeps everything whatever the
             * offset, so only p = 0.5 can tell). */
            if (p > 0.0f && len >= 32) {
                kernel_dropout_forward_range_cpu(rout2, rmask, rin, n, len, off + 1, p, 3, 9,
                                                 ids);
                int same = 1;
                for (int i = 0; i < n; i++)
                    same &= memcmp(rmask + i * len, wmask + i * per + off, len) == 0;
                cr_assert(!same, "p %g [%zu, +%zu): offset + 1 gave the same masks", (double)p,
                          off, len);
            }
        }
    }
    free(in); free(whole); free(wmask); free(rin); free(rout); free(rout2); free(rmask);
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

/* ---- optimizers: hand-computed steps (tests/test_golden.c checks torch's bits) ---- */

Test(kernels, optimizer_steps)
{
    float p[2] = {1.0f, -2.0f};
    const float g[2] = {0.5f, 0.25f};
    kernel_sgd_update_cpu(p, g, 2, 0.1f, 0.0f);
    cr_expect(fabsf(p[0] - 0.95f) < 1e-7f && fabsf(p[1] + 2.025f) < 1e-7f);
    kernel_sgd_update_cpu(p, g, 2, 0.1f, 0.5f); /* g + 0.5·p */
    cr_expect(fabsf(p[0] - (0.95f - 0.1f * (0.5f + 0.475f))) < 1e-6f, "%g", (double)p[0]);

    float q[1] = {1.0f}, buf[1] = {0.0f};
    kernel_momentum_update_cpu(q, buf, g, 1, 0.1f, 0.9f, 0.0f);
    kernel_momentum_update_cpu(q, buf, g, 1, 0.1f, 0.9f, 0.0f);
    cr_expect(fabsf(buf[0] - 0.95f) < 1e-6f, "buf %g", (double)buf[0]);
    cr_expect(fabsf(q[0] - (1.0f - 0.05f - 0.095f)) < 1e-6f, "q %g", (double)q[0]);

    /* Adam's first step moves every parameter by lr against the gradient's sign. */
    float a[2] = {1.0f, -2.0f}, m[2] = {0}, v[2] = {0};
    const float ga[2] = {3.0f, -0.01f};
    kernel_adam_update_cpu(a, m, v, ga, 2, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    cr_expect(fabsf(a[0] - 0.999f) < 1e-6f && fabsf(a[1] + 1.999f) < 1e-6f, "%g %g",
              (double)a[0], (double)a[1]);
}

/* ---- initialisation and input conversion ---- */

Test(kernels, init_uniform)
{
    const size_t n = 100003;
    const float bound = 0.3f;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    kernel_init_uniform_cpu(a, n, bound, 42, rng_stream_init(2, 0));
    double sum = 0.0, sq = 0.0;
    for (size_t i = 0; i < n; i++) {
        float expect = (2.0f * rng_uniform_at(42, rng_stream_init(2, 0), i) - 1.0f) * bound;
        cr_assert(a[i] == expect, "out[%zu] = %g, expected %g", i, (double)a[i], (double)expect);
        cr_assert(a[i] >= -bound && a[i] < bound);
        sum += a[i];
        sq += (double)a[i] * a[i];
    }
    /* Mean 0 (standard error 0.0005) and variance bound²/3 = 0.03. */
    cr_expect(fabs(sum / n) < 0.003, "mean %g", sum / n);
    cr_expect(fabs(sq / n - 0.03) < 0.0006, "variance %g", sq / n);
    kernel_init_uniform_cpu(b, n, bound, 42, rng_stream_init(2, 1));
    cr_expect(memcmp(a, b, n * sizeof *a) != 0, "two streams gave the same numbers");
    free(a);
    free(b);
}

/* A slice [first, first + count) equals that slice of the whole tensor, for offsets inside
 * and across the 64-element chunks the kernel draws. */
Test(kernels, init_uniform_range_equals_slice)
{
    const size_t n = 400;
    const float bound = 0.7f;
    const uint64_t stream = rng_stream_init(3, 0);
    const size_t ranges[][2] = {{0, 400}, {0, 63}, {3, 1}, {3, 61}, {3, 200}, {61, 3},
                                {61, 70}, {63, 2}, {64, 64}, {65, 63}, {65, 130}, {127, 1},
                                {130, 191}, {130, 0}, {1, 399}, {399, 1}};
    const size_t nr = sizeof ranges / sizeof ranges[0];
    float *whole = malloc(n * sizeof *whole), *part = malloc((n + 1) * sizeof *part);
    kernel_init_uniform_cpu(whole, n, bound, 42, stream);
    for (size_t k = 0; k < nr; k++) {
        const size_t first = ranges[k][0], count = ranges[k][1];
        part[count] = -7.0f; /* guard: nothing is written past the slice */
        kernel_init_uniform_range_cpu(part, first, count, bound, 42, stream);
        cr_assert(part[count] == -7.0f, "[%zu, +%zu): wrote past the slice", first, count);
        for (size_t i = 0; i < count; i++)
            cr_assert(part[i] == whole[first + i], "[%zu, +%zu): out[%zu] = %g, whole %g", first,
                      count, i, (double)part[i], (double)whole[first + i]);
        /* A wrong offset gives other values. */
        if (count >= 2 && first + 1 + count <= n) {
            kernel_init_uniform_range_cpu(part, first + 1, count, bound, 42, stream);
            cr_assert(memcmp(part, whole + first, count * sizeof *part) != 0,
                      "[%zu, +%zu): first + 1 gave the same values", first, count);
        }
    }
    /* Offsets past 2^32 (the counter is 64-bit), against the definition. */
    const size_t far = ((size_t)1 << 32) + 61;
    kernel_init_uniform_range_cpu(part, far, 70, bound, 42, stream);
    for (size_t i = 0; i < 70; i++) {
        float expect = (2.0f * rng_uniform_at(42, stream, far + i) - 1.0f) * bound;
        cr_assert(part[i] == expect, "far out[%zu] = %g, expected %g", i, (double)part[i],
                  (double)expect);
    }
    free(whole);
    free(part);
}

Test(kernels, bytes_to_float)
{
    uint8_t in[256];
    float out[256];
    for (int i = 0; i < 256; i++)
        in[i] = (uint8_t)i;
    kernel_bytes_to_float_cpu(out, in, 256);
    for (int i = 0; i < 256; i++)
        cr_assert(out[i] == (float)i / 255.0f, "byte %d gave %g", i, (double)out[i]);
    cr_expect(out[0] == 0.0f && out[255] == 1.0f);
}
