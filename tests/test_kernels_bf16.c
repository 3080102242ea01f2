/* The CPU's bf16 products (kernels/bf16.h) against double-precision sums of the operands
 * rounded to bfloat16 (to nearest even): each element within the float32 accumulation's
 * bound (k + 2)·2⁻²⁴·Σ|a·b| (+ 2⁻²⁴ of a bias or an accumulated old value), on shapes that
 * are not multiples of any tile; the same check against unrounded operands fails (the
 * operands are rounded); both backward halves at once give the bits of each alone; every
 * call and every thread gives the same bits. Convolutions in bf16 against fp32 ones of the
 * rounded operands and of the unrounded ones. Skipped where the CPU has no AVX512_BF16. */
#include "kernels/bf16.h"
#include "tests/check.h"
#include "tests/kernels_fd.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

static void need_bf16(void)
{
    if (!kernel_bf16_available()) cr_skip_test("no bf16 products here: %s", pt_error_get());
}

static float bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* ref[i, j] = Σ_k a(i, k)·b(k, j) in double, a(i, k) = A[i·sa + k·ka], b likewise; abs the
 * same sum of magnitudes. round: the operands rounded to bf16 first. */
typedef struct {
    const float *A, *B;
    size_t sa, ka, kb, sb; /* a(i, k) = A[i·sa + k·ka], b(k, j) = B[k·kb + j·sb] */
} operands;

static void reference(const operands *o, int m, int n, int k, int round, double *ref,
                      double *abs)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0, t = 0;
            for (int q = 0; q < k; q++) {
                float a = o->A[i * o->sa + q * o->ka], b = o->B[q * o->kb + j * o->sb];
                if (round) a = bf16_round(a), b = bf16_round(b);
                s += (double)a * b;
                t += fabs((double)a * b);
            }
            ref[(size_t)i * n + j] = s;
            abs[(size_t)i * n + j] = t;
        }
}

/* The largest |got − (ref + base)| over its bound, ≤ 0 where every element is within. */
static double excess(const float *got, const double *ref, const double *abs, const float *base,
                     int base_row, int m, int n, int k)
{
    double worst = -INFINITY, u = ldexp(1, -24);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            size_t e = (size_t)i * n + j;
            double b = base ? base[base_row ? (size_t)j : e] : 0;
            double d = fabs(got[e] - (ref[e] + b)) - ((k + 2) * u * abs[e] + u * fabs(b));
            if (d > worst) worst = d;
        }
    return worst;
}

static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 100, 10},
                                {129, 37, 300}, {256, 96, 384}};

Test(kernels_bf16, products_within_float32_sums_of_rounded_operands)
{
    need_bf16();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int n = shapes[s][0], in_f = shapes[s][1], out_f = shapes[s][2];
        size_t ni = (size_t)n * in_f, nw = (size_t)out_f * in_f, no = (size_t)n * out_f;
        float *in = rand_array(ni, 1, 1 + s), *w = rand_array(nw, 0.5f, 2 + s),
              *b = rand_array(out_f, 1, 3 + s), *dout = rand_array(no, 1, 4 + s),
              *dw0 = rand_array(nw, 1, 5 + s), *db0 = rand_array(out_f, 1, 6 + s);
        float *out = malloc(no * 4), *din = malloc(ni * 4), *dw = malloc(nw * 4),
              *db = malloc(out_f * 4);
        size_t most = ni > nw ? (ni > no ? ni : no) : (nw > no ? nw : no);
        double *ref = malloc(most * 8), *abs = malloc(most * 8);
        /* forward: out = in · wᵀ (+ b) */
        operands f = {in, w, in_f, 1, 1, in_f};
        reference(&f, n, out_f, in_f, 1, ref, abs);
        cr_assert(!kernel_dense_forward_bf16(out, in, w, b, n, in_f, out_f), "%s", pt_error_get());
        cr_assert(excess(out, ref, abs, b, 1, n, out_f, in_f) <= 0, "forward %d×%d×%d", n, in_f,
                  out_f);
        cr_assert(!kernel_dense_forward_bf16(out, in, w, NULL, n, in_f, out_f));
        cr_assert(excess(out, ref, abs, NULL, 0, n, out_f, in_f) <= 0, "forward, no bias");
        /* input half: din = dout · w */
        operands bi = {dout, w, out_f, 1, in_f, 1};
        reference(&bi, n, in_f, out_f, 1, ref, abs);
        cr_assert(!kernel_dense_backward_input_bf16(din, dout, w, n, in_f, out_f));
        cr_assert(excess(din, ref, abs, NULL, 0, n, in_f, out_f) <= 0, "input half %d×%d×%d", n,
                  in_f, out_f);
        /* weight half: dw = dw0 + doutᵀ · in, db = db0 + Σ dout (float32, in row order) */
        operands bw = {dout, in, 1, out_f, in_f, 1};
        reference(&bw, out_f, in_f, n, 1, ref, abs);
        memcpy(dw, dw0, nw * 4);
        memcpy(db, db0, out_f * 4);
        cr_assert(!kernel_dense_backward_weight_bf16(dw, db, dout, in, n, in_f, out_f));
        cr_assert(excess(dw, ref, abs, dw0, 0, out_f, in_f, n) <= 0, "weight half %d×%d×%d", n,
                  in_f, out_f);
        for (int j = 0; j < out_f; j++) {
            float sum = db0[j];
            for (int i = 0; i < n; i++) sum += dout[(size_t)i * out_f + j];
            cr_assert(sum == db[j], "db[%d] is %.9g, float32 row sums %.9g", j, db[j], sum);
        }
        /* both halves at once: the bits of each alone */
        float *dw2 = malloc(nw * 4), *db2 = malloc(out_f * 4), *din2 = malloc(ni * 4);
        memcpy(dw2, dw0, nw * 4);
        memcpy(db2, db0, out_f * 4);
        cr_assert(!kernel_dense_backward_bf16(din2, dw2, db2, dout, in, w, n, in_f, out_f));
        cr_assert(!memcmp(dw2, dw, nw * 4) && !memcmp(db2, db, out_f * 4) &&
                  !memcmp(din2, din, ni * 4), "both halves differ from each alone");
        free(dw2), free(db2), free(din2);
        free(in), free(w), free(b), free(dout), free(dw0), free(db0);
        free(out), free(din), free(dw), free(db), free(ref), free(abs);
    }
}

Test(kernels_bf16, operands_are_rounded)
{
    need_bf16();
    const int n = 17, in_f = 33, out_f = 65;
    float *in = rand_array((size_t)n * in_f, 1, 11), *w = rand_array((size_t)out_f * in_f, 1, 12);
    float *out = malloc((size_t)n * out_f * 4);
    double *ref = malloc((size_t)n * out_f * 8), *abs = malloc((size_t)n * out_f * 8);
    operands f = {in, w, in_f, 1, 1, in_f};
    reference(&f, n, out_f, in_f, 0, ref, abs);
    cr_assert(!kernel_dense_forward_bf16(out, in, w, NULL, n, in_f, out_f));
    cr_assert(excess(out, ref, abs, NULL, 0, n, out_f, in_f) > 0,
              "the product is within float32's bound of unrounded operands: not bf16");
    free(in), free(w), free(out), free(ref), free(abs);
}

typedef struct {
    const float *in, *w;
    float *out;
    int rc;
} call;

static void *forward_call(void *arg)
{
    call *c = arg;
    c->rc = kernel_dense_forward_bf16(c->out, c->in, c->w, NULL, 129, 37, 300);
    return NULL;
}

Test(kernels_bf16, same_bits_every_call_and_thread)
{
    need_bf16();
    size_t no = 129 * 300;
    float *in = rand_array(129 * 37, 1, 21), *w = rand_array(300 * 37, 1, 22);
    call c[3];
    for (int i = 0; i < 3; i++) c[i] = (call){in, w, malloc(no * 4), -1};
    forward_call(&c[0]);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) cr_assert(!pthread_create(&t[i], NULL, forward_call, &c[i + 1]));
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++) cr_assert(!c[i].rc);
    for (int i = 1; i < 3; i++) cr_assert(!memcmp(c[i].out, c[0].out, no * 4), "thread %d", i);
    forward_call(&c[1]);
    cr_assert(!memcmp(c[1].out, c[0].out, no * 4), "a second call");
    for (int i = 0; i < 3; i++) free(c[i].out);
    free(in), free(w);
}

/* ---- convolutions (kernel_conv2d_dims.bf16): their three products in bf16 ---- */

static void round_all(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

static double max_abs_diff(const float *a, const float *b, size_t n, double *scale)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    *scale = s;
    return d;
}

/* got (bf16) against fp32 of the rounded operands: within float32's summation differences
 * (1e-5 of the largest element; measured at most 3.8e-7 on the shapes below); against fp32
 * of the unrounded operands: beyond them (1e-4; measured at least 1.6e-3). */
static void conv_pair(const char *what, const float *got, const float *rounded_ref,
                      const float *plain_ref, size_t n)
{
    double scale, near = max_abs_diff(got, rounded_ref, n, &scale);
    cr_assert(near <= 1e-5 * scale, "%s: %.3g of max|ref| from fp32 of rounded operands", what,
              near / scale);
    double far = max_abs_diff(got, plain_ref, n, &scale);
    cr_assert(far > 1e-4 * scale, "%s: only %.3g of max|ref| from unrounded fp32: not bf16",
              what, far / scale);
}

static void conv_check(kernel_conv2d_dims d, uint64_t seed)
{
    const size_t ni = (size_t)d.n * d.c * d.h * d.w, nw = (size_t)d.filters * d.c * d.size * d.size;
    const size_t no = (size_t)d.n * d.filters * kernel_conv2d_out_h(&d) * kernel_conv2d_out_w(&d);
    float *work = malloc(kernel_conv2d_workspace_floats(&d) * sizeof(float));
    float *in = rand_array(ni, 1, seed), *w = rand_array(nw, 0.5f, seed + 1),
          *dout = rand_array(no, 1, seed + 2), *b = rand_array(d.filters, 1, seed + 3);
    float *in_r = malloc(ni * 4), *w_r = malloc(nw * 4), *dout_r = malloc(no * 4);
    memcpy(in_r, in, ni * 4), memcpy(w_r, w, nw * 4), memcpy(dout_r, dout, no * 4);
    round_all(in_r, ni), round_all(w_r, nw), round_all(dout_r, no);
    float *out[3], *dw[3], *din[3], *db[3];
    for (int v = 0; v < 3; v++) { /* 0: bf16, 1: fp32 of rounded operands, 2: fp32 */
        out[v] = malloc(no * 4), din[v] = malloc(ni * 4);
        dw[v] = calloc(nw, 4), db[v] = calloc(d.filters, 4);
        kernel_conv2d_dims e = d;
        e.bf16 = v == 0;
        const float *x = v == 1 ? in_r : in, *k = v == 1 ? w_r : w, *g = v == 1 ? dout_r : dout;
        cr_assert(!kernel_conv2d_forward_cpu(out[v], work, x, k, b, &e));
        cr_assert(!kernel_conv2d_backward_cpu(din[v], dw[v], db[v], work, g, x, k, &e));
    }
    conv_pair("conv forward", out[0], out[1], out[2], no);
    conv_pair("conv weight half", dw[0], dw[1], dw[2], nw);
    conv_pair("conv input half", din[0], din[1], din[2], ni);
    /* the bias gradient sums the unrounded dout in float32 */
    cr_assert(!memcmp(db[0], db[2], d.filters * 4), "the bias gradient differs from fp32's");
    for (int v = 0; v < 3; v++) free(out[v]), free(din[v]), free(dw[v]), free(db[v]);
    free(work), free(in), free(w), free(dout), free(b), free(in_r), free(w_r), free(dout_r);
}

Test(kernels_bf16, convolutions_round_their_products)
{
    need_bf16();
    conv_check((kernel_conv2d_dims){.n = 16, .c = 32, .h = 13, .w = 13, .filters = 128,
                                    .size = 3, .stride = 1}, 31);
    conv_check((kernel_conv2d_dims){.n = 3, .c = 3, .h = 11, .w = 9, .filters = 5, .size = 3,
                                    .stride = 2, .pad = 1}, 41);
}

/* The batched weight gradient's tiles (--wgrad batched): units [u0, u0 + units) written, the
 * rest untouched; no rows: zeros. */
Test(kernels_bf16, weight_gradient_tiles)
{
    need_bf16();
    const int n = 37, in_f = 65, out_f = 300, u0 = 128, units = 100;
    size_t nw = (size_t)out_f * in_f;
    float *in = rand_array((size_t)n * in_f, 1, 51), *dout = rand_array((size_t)n * out_f, 1, 52);
    float *dw = malloc(nw * 4), *db = malloc(out_f * 4);
    for (size_t i = 0; i < nw; i++) dw[i] = 7;
    for (int j = 0; j < out_f; j++) db[j] = 7;
    double *ref = malloc((size_t)units * in_f * 8), *abs = malloc((size_t)units * in_f * 8);
    operands o = {dout + u0, in, 1, out_f, in_f, 1};
    reference(&o, units, in_f, n, 1, ref, abs);
    cr_assert(!kernel_dense_weight_grad_units_bf16(dw, db, dout, in, n, in_f, out_f, u0, units),
              "%s", pt_error_get());
    cr_assert(excess(dw + (size_t)u0 * in_f, ref, abs, NULL, 0, units, in_f, n) <= 0, "tile");
    for (size_t i = 0; i < nw; i++)
        if (i < (size_t)u0 * in_f || i >= (size_t)(u0 + units) * in_f)
            cr_assert(dw[i] == 7, "dw[%zu] outside the tile was written", i);
    for (int j = 0; j < out_f; j++) {
        float sum = 0;
        for (int i = 0; i < n && j >= u0 && j < u0 + units; i++) sum += dout[(size_t)i * out_f + j];
        cr_assert(db[j] == (j >= u0 && j < u0 + units ? sum : 7), "db[%d]", j);
    }
    cr_assert(!kernel_dense_weight_grad_units_bf16(dw, db, dout, in, 0, in_f, out_f, u0, units));
    for (int j = u0; j < u0 + units; j++) cr_assert(db[j] == 0 && dw[(size_t)j * in_f] == 0);
    free(in), free(dout), free(dw), free(db), free(ref), free(abs);
}
