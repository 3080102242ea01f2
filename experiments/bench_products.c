/* Benchmark: the fp32 FMA peak of one core, measured, and the share of it that a
 * transformer block's products reach through the engine's dense kernels (the calls a
 * [block] makes: c_attn, attention c_proj, c_fc and MLP c_proj, forward, input gradient
 * and weight gradient) at a model's width and a chunk's rows.
 *
 *   OPENBLAS_NUM_THREADS=1 ./bench_products [--width 384] [--hidden 1536] [--rows 2048]
 *                                           [--repeats 9]
 *
 * The peak is timed, not taken from a data sheet: 12 independent chains of vector FMAs
 * (8 lanes with AVX2 and FMA, 16 with AVX-512 where the core has it; the faster counts),
 * so the figure holds the clock the core really runs at under load. Prints the peak, then
 * per product and pass the median milliseconds, GFLOP/s and share of the peak, and the
 * block's total. Run it with one thread per core, on an otherwise idle machine. */
#include "experiments/bench_common.h"
#include "kernels/kernels.h"

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CHAINS = 12 };

/* GFLOP/s of `iters` rounds of CHAINS dependent-free FMAs on 8-lane vectors. */
__attribute__((target("avx2,fma"))) static double fma_peak_avx2(long iters)
{
    __m256 a[CHAINS];
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps((float)i);
    double t0 = pt_now();
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    double t = pt_now() - t0;
    float sink = 0, v[8];
    for (int i = 0; i < CHAINS; i++) _mm256_storeu_ps(v, a[i]), sink += v[0];
    if (sink == 12345.f) puts(""); /* keeps the chains alive */
    return (double)iters * CHAINS * 8 * 2 / t / 1e9;
}

__attribute__((target("avx512f"))) static double fma_peak_avx512(long iters)
{
    __m512 a[CHAINS];
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps((float)i);
    double t0 = pt_now();
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    double t = pt_now() - t0;
    float sink = 0;
    for (int i = 0; i < CHAINS; i++) sink += _mm512_reduce_add_ps(a[i]);
    if (sink == 12345.f) puts("");
    return (double)iters * CHAINS * 16 * 2 / t / 1e9;
}

/* The best of 5 timings of about 0.3 s each, per vector width the core has. */
static double fma_peak(const char **isa)
{
    double best = 0;
    *isa = "none";
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        for (int r = 0; r < 5; r++) {
            double g = fma_peak_avx2(100000000L / 4);
            if (g > best) best = g, *isa = "AVX2+FMA (8 lanes)";
        }
    if (__builtin_cpu_supports("avx512f"))
        for (int r = 0; r < 5; r++) {
            double g = fma_peak_avx512(100000000L / 8);
            if (g > best) best = g, *isa = "AVX-512 (16 lanes)";
        }
    return best;
}

typedef struct {
    const char *name;
    int in, out; /* the product maps rows of `in` features to `out` */
} product;

int main(int argc, char **argv)
{
    int C = 384, H = 0, rows = 2048, repeats = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--width")) C = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_products: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!H) H = 4 * C;
    if (C < 1 || H < 1 || rows < 1 || repeats < 1 || repeats > BENCH_MAX_REPEATS) {
        fprintf(stderr, "bench_products: width, hidden, rows and repeats must be positive "
                        "(repeats at most %d)\n", BENCH_MAX_REPEATS);
        return 2;
    }
    const char *isa;
    double peak = fma_peak(&isa);
    printf("fp32 FMA peak of one core, measured: %.1f GFLOP/s (%s)\n", peak, isa);
    printf("block products: width %d, hidden %d, %d rows per call, median of %d\n\n", C, H,
           rows, repeats);
    const product ps[] = {{"c_attn", C, 3 * C}, {"attn c_proj", C, C},
                          {"c_fc", C, H}, {"mlp c_proj", H, C}};
    const char *pass[] = {"forward", "input grad", "weight grad"};
    printf("%-12s %-12s %9s %9s %7s\n", "product", "pass", "ms", "GFLOP/s", "of peak");
    double total_flop = 0, total_s = 0;
    for (size_t p = 0; p < sizeof ps / sizeof *ps; p++) {
        int in = ps[p].in, out = ps[p].out;
        float *x = bench_alloc("bench_products", (size_t)rows * in, 1);
        float *w = bench_alloc("bench_products", (size_t)out * in, 2);
        float *b = bench_alloc("bench_products", (size_t)out, 3);
        float *y = bench_alloc("bench_products", (size_t)rows * out, 4);
        float *dx = bench_alloc("bench_products", (size_t)rows * in, 5);
        float *dw = bench_alloc("bench_products", (size_t)out * in, 6);
        float *db = bench_alloc("bench_products", (size_t)out, 7);
        double flop = 2.0 * rows * in * out;
        for (int ps_i = 0; ps_i < 3; ps_i++) {
            double t[BENCH_MAX_REPEATS];
            for (int r = -1; r < repeats; r++) {
                double t0 = pt_now();
                if (ps_i == 0) kernel_dense_forward_cpu(y, x, w, b, rows, in, out);
                else if (ps_i == 1) kernel_dense_backward_input_cpu(dx, y, w, rows, in, out);
                else kernel_dense_backward_weight_cpu(dw, db, y, x, rows, in, out);
                if (r >= 0) t[r] = pt_now() - t0;
            }
            bench_stats s = bench_summarise(t, repeats);
            printf("%-12s %-12s %9.3f %9.1f %6.0f%%\n", ps[p].name, pass[ps_i],
                   s.median * 1e3, flop / s.median / 1e9, 100 * flop / s.median / 1e9 / peak);
            total_flop += flop;
            total_s += s.median;
        }
        free(x), free(w), free(b), free(y), free(dx), free(dw), free(db);
    }
    printf("%-25s %9.3f %9.1f %6.0f%%\n", "block (all 12)", total_s * 1e3,
           total_flop / total_s / 1e9, 100 * total_flop / total_s / 1e9 / peak);
    return 0;
}
