/* The harness of test_cuda_kernels (tests/cuda/kernel_check.h): bookkeeping of the checks
 * per kernel, device and host buffers freed after each case, transfers on the kernels'
 * stream, random inputs, and the comparisons of GPU results with the CPU's. */
#include "tests/cuda/kernel_check.h"

#include "kernels/cuda/check.h"
#include "kernels/rng.h"
#include "src/base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- bookkeeping ---------------- */

typedef struct {
    const char *name;
    int checks, fails;
    double worst;
    int exact; /* compared bit for bit */
} kernel_stat;

static kernel_stat stats[64];
static int n_stats;
int passed, failed;
kernel_cuda_ctx ctx;

static kernel_stat *stat_for(const char *name, int exact)
{
    for (int i = 0; i < n_stats; i++)
        if (strcmp(stats[i].name, name) == 0)
            return &stats[i];
    if (n_stats == (int)(sizeof stats / sizeof stats[0]))
        return &stats[n_stats - 1];
    stats[n_stats] = (kernel_stat){.name = name, .exact = exact};
    return &stats[n_stats++];
}

void record(const char *kernel, const char *shape, int ok, double err, int exact,
            const char *detail)
{
    kernel_stat *k = stat_for(kernel, exact);
    k->checks++;
    k->fails += !ok;
    if (!(err <= k->worst))
        k->worst = err != err ? INFINITY : err;
    ok ? passed++ : failed++;
    printf("%s %-24s %-36s rel err %.2e%s%s\n", ok ? "ok  " : "FAIL", kernel, shape, err,
           detail[0] ? "  " : "", detail);
}

void finish_and_exit(int code)
{
    printf("%d passed, %d failed\n", passed, failed);
    if (ctx.stream)
        kernel_cuda_ctx_free(&ctx);
    exit(code);
}

/* Infrastructure failures (allocation, copies, a kernel fault at synchronisation) end the
 * run: a faulted CUDA context cannot run the remaining checks. */
void fatal(const char *what)
{
    printf("FATAL: %s\n", what);
    failed++;
    finish_and_exit(1);
}

void must(int rc)
{
    if (rc != 0)
        fatal(pt_error_get());
}

/* A kernel call that returns −1 is a failed check of that kernel. */
int call_ok(const char *kernel, const char *shape, int rc)
{
    if (rc == 0)
        return 1;
    record(kernel, shape, 0, INFINITY, 0, pt_error_get());
    return 0;
}

/* ---------------- memory ---------------- */

static void *dev_bufs[64], *host_bufs[64];
static int n_dev, n_host;

static int dev_alloc_(void **p, size_t bytes)
{
    CUDA_CHECK(cudaMalloc(p, bytes ? bytes : 1));
    return 0;
}

void *dmalloc(size_t bytes)
{
    void *p = NULL;
    if (n_dev == 64)
        fatal("too many device buffers in one case");
    must(dev_alloc_(&p, bytes));
    return dev_bufs[n_dev++] = p;
}

void *hmalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || n_host == 64)
        fatal("host allocation");
    return host_bufs[n_host++] = p;
}

void free_case(void)
{
    while (n_dev)
        cudaFree(dev_bufs[--n_dev]);
    while (n_host)
        free(host_bufs[--n_host]);
}

/* Transfers are queued on the kernels' stream: it is non-blocking, so plain cudaMemcpy
 * (legacy default stream) would not be ordered with the kernels. */
static int upload_(void *dev, const void *host, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    return 0;
}

static int download_(void *host, const void *dev, size_t bytes)
{
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    return 0;
}

/* 0xFF bytes: NaN as float, −1 as int32, 255 as a mask byte. */
static int poison_(void *dev, size_t bytes)
{
    CUDA_CHECK(cudaMemsetAsync(dev, 0xFF, bytes, ctx.stream));
    return 0;
}

void upload(void *dev, const void *host, size_t bytes) { must(upload_(dev, host, bytes)); }
            void download(void *host, const void *dev, size_t bytes)
{
    must(download_(host, dev, bytes));
}
void poison(void *dev, size_t bytes) { must(poison_(dev, bytes)); }
            
            /* A device copy of a host array. */
            void *dcopy(const void *host, size_t bytes)
{
    void *d = dmalloc(bytes);
    upload(d, host, bytes);
    return d;
}

/* Host buffer holding a device array. */
float *fetch_f(const float *dev, size_t count)
{
    float *h = hmalloc(count * sizeof *h);
    download(h, dev, count * sizeof *h);
    return h;
}

/* ---------------- data ---------------- */

static uint64_t data_stream = 1;

/* Fresh uniform numbers in [lo, hi) for every call (deterministic: no clock). */
float *rand_f(size_t count, float lo, float hi)
{
    float *x = hmalloc(count * sizeof *x);
    const uint64_t s = data_stream++;
    for (size_t i = 0; i < count; i++)
        x[i] = lo + (hi - lo) * rng_uniform_at(2024, s, i);
    return x;
}

/* ---------------- comparisons ---------------- */

static int same_float(float a, float b)
{
    return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0;
}

/* max|a − r| / max|r| over the finite elements (absolute when r is all zero); NaN or an
 * infinity in one array but not the other gives INFINITY. *worst: the element to show. */
static double rel_err(const float *a, const float *r, size_t n, size_t *worst)
{
    double max_ref = 0.0, max_diff = 0.0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(r[i])) {
            if (!same_float(a[i], r[i]) && !(a[i] == r[i])) {
                *worst = i;
                return INFINITY;
            }
            continue;
        }
        const double d = fabs((double)a[i] - (double)r[i]);
        if (d > max_diff) {
            max_diff = d;
            *worst = i;
        }
        if (fabs((double)r[i]) > max_ref)
            max_ref = fabs((double)r[i]);
    }
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

void check_close(const char *kernel, const char *shape, const float *gpu,
                 const float *cpu, size_t n)
{
    size_t w;
    const double e = rel_err(gpu, cpu, n, &w);
    char detail[160] = "";
    if (!(e <= REL_TOL))
        snprintf(detail, sizeof detail, "worst element %zu: GPU %.9g, CPU %.9g", w,
                 n ? gpu[w] : 0.0f, n ? cpu[w] : 0.0f);
    record(kernel, shape, e <= REL_TOL, e, 0, detail);
}

void check_exact(const char *kernel, const char *shape, const float *gpu,
                 const float *cpu, size_t n)
{
    size_t bad = 0, first = 0, w;
    for (size_t i = 0; i < n; i++)
        if (!same_float(gpu[i], cpu[i]) && bad++ == 0)
            first = i;
    const double e = rel_err(gpu, cpu, n, &w);
    char detail[160] = "";
    if (bad)
        snprintf(detail, sizeof detail, "%zu of %zu differ in bits; first %zu: GPU %.9g, CPU %.9g",
                 bad, n, first, gpu[first], cpu[first]);
    record(kernel, shape, bad == 0, e, 1, detail);
}

/* Integer arrays (argmax, masks, counts): every element equal. */
void check_exact_bytes(const char *kernel, const char *shape, const void *gpu,
                       const void *cpu, size_t n, size_t elem)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)gpu + i * elem, (const char *)cpu + i * elem, elem) != 0 &&
            bad++ == 0)
            first = i;
    char detail[120] = "";
    if (bad)
        snprintf(detail, sizeof detail, "%zu of %zu elements differ; first %zu", bad, n, first);
    record(kernel, shape, bad == 0, bad ? INFINITY : 0.0, 1, detail);
}

void print_summary(void)
{
    printf("\n%-26s %6s %6s %14s  %s\n", "kernel", "checks", "failed", "max rel err",
           "criterion");
    for (int i = 0; i < n_stats; i++)
        printf("%-26s %6d %6d %14.2e  %s\n", stats[i].name, stats[i].checks, stats[i].fails,
               stats[i].worst, stats[i].exact ? "bit-identical" : "rel err <= 1e-4");
}
