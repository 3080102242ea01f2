/* What the CPU kernel suites share (tests/test_kernels.c, tests/test_kernels_elementwise.c):
 * reproducible random arrays, the loss L = Σ r·out, and the check of an analytic gradient
 * against central finite differences of L. Static inline, so a suite that does not use one
 * does not warn. */
#ifndef PT_TESTS_KERNELS_FD_H
#define PT_TESTS_KERNELS_FD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* count floats uniform in [−scale, scale), reproducible from seed; the caller frees. */
static inline float *rand_array(size_t count, float scale, uint64_t seed)
{
    float *a = malloc((count ? count : 1) * sizeof *a);
    for (size_t i = 0; i < count; i++)
        a[i] = ((float)(splitmix64(&seed) >> 40) * 0x1p-24f * 2.0f - 1.0f) * scale;
    return a;
}

static inline float *copy_array(const float *src, size_t count)
{
    float *a = malloc((count ? count : 1) * sizeof *a);
    memcpy(a, src, count * sizeof *a);
    return a;
}

static inline double weighted_sum(const float *r, const float *y, size_t count)
{
    double s = 0.0;
    for (size_t i = 0; i < count; i++)
        s += (double)r[i] * (double)y[i];
    return s;
}

typedef double (*loss_fn)(void *ctx);

/* g[i] = (L(x + h e_i) − L(x − h e_i)) / (actual step), with x restored afterwards. */
static inline double *fd_gradient(float *x, size_t count, float h, loss_fn loss, void *ctx)
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

#endif
