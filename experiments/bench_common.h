/* What the C benchmarks share: a median with its range over repeats, and buffers of
 * reproducible values in [−0.5, 0.5). Header-only: each benchmark is one program. */
#ifndef PT_BENCH_COMMON_H
#define PT_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>

#include "src/base/clock.h"

#define BENCH_MAX_REPEATS 1000

typedef struct {
    double median, min, max;
} bench_stats;

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts t[0..n) and returns its median, min and max. */
static inline bench_stats bench_summarise(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp);
    bench_stats s = {n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]), t[0], t[n - 1]};
    return s;
}

/* `count` floats from a linear congruential sequence; exits naming `who` when out of
 * memory. */
static inline float *bench_alloc(const char *who, size_t count, unsigned seed)
{
    float *a = malloc((count ? count : 1) * sizeof *a);
    if (!a) {
        fprintf(stderr, "%s: out of memory (%zu floats)\n", who, count);
        exit(1);
    }
    for (size_t i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        a[i] = (float)(seed >> 8) * 0x1p-24f - 0.5f;
    }
    return a;
}

#endif
