/* The CPU elementwise kernels by their own properties: activation backwards against
 * central finite differences (tests/kernels_fd.h), the accuracy of the vectorised
 * exp/sigmoid/tanh, dropout's definition and statistics, hand-computed optimizer steps,
 * initialisation statistics and input conversion. The layer kernels:
 * tests/test_kernels.c. */
#include "kernels/fastmath.h"
#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "tests/check.h"
#include "tests/kernels_fd.h"

#include <float.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

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
