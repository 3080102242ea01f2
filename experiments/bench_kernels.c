/* Benchmark: forward and backward of the three convolutions of the reference CNN
 * (1×28×28 → conv 32 3×3 → relu, maxpool 2 → conv 128 3×3 → maxpool 2 → conv 256 3×3) at
 * batch 128, next to the same sgemm calls alone, to show how close the CPU conv kernels are
 * to being bound by the BLAS.
 *
 *   OPENBLAS_NUM_THREADS=2 env -u OPENBLAS_CORETYPE ./bench_kernels [--batch N] [--repeats N]
 *
 * Prints one table: per layer and pass, the median, min and max milliseconds over the
 * repeats (after a warm-up), the GFLOP/s of the median, and the median of the bare sgemm
 * products the pass contains. The first layer's backward skips din, as training does. */
#include "kernels/kernels.h"
#include "experiments/bench_common.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PASS_FORWARD, PASS_BACKWARD };

/* One timed call of a pass: the kernel itself, or only its sgemm products. */
static void bench_run(int pass, int gemm_only, int need_din, const kernel_conv2d_dims *d,
                      float *out, float *work, const float *in, const float *w, const float *b,
                      float *din, float *dw, float *db, const float *dout)
{
    const int kk = d->c * d->size * d->size;
    const int cols = d->n * kernel_conv2d_out_h(d) * kernel_conv2d_out_w(d);
    float *col = work, *y = work + (size_t)kk * cols;
    if (!gemm_only) {
        if (pass == PASS_FORWARD)
            kernel_conv2d_forward_cpu(out, work, in, w, b, d);
        else
            kernel_conv2d_backward_cpu(need_din ? din : NULL, dw, db, work, dout, in, w, d);
        return;
    }
    if (pass == PASS_FORWARD) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d->filters, cols, kk, 1.0f, w,
                    kk, col, cols, 0.0f, y, cols);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d->filters, kk, cols, 1.0f, y,
                    cols, col, cols, 1.0f, dw, kk);
        if (need_din)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kk, cols, d->filters, 1.0f, w,
                        kk, y, cols, 0.0f, col, cols);
    }
}

int main(int argc, char **argv)
{
    int batch = 128, repeats = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--batch N] [--repeats N]\n", argv[0]);
            return 2;
        }
    }
    if (batch < 1 || repeats < 1 || repeats > BENCH_MAX_REPEATS) {
        fprintf(stderr, "bench_kernels: need batch >= 1 and 1 <= repeats <= %d\n",
                BENCH_MAX_REPEATS);
        return 2;
    }
    const kernel_conv2d_dims layers[3] = {
        {.n = batch, .c = 1, .h = 28, .w = 28, .filters = 32, .size = 3, .stride = 1},
        {.n = batch, .c = 32, .h = 13, .w = 13, .filters = 128, .size = 3, .stride = 1},
        {.n = batch, .c = 128, .h = 5, .w = 5, .filters = 256, .size = 3, .stride = 1},
    };
    const char *env_threads = getenv("OPENBLAS_NUM_THREADS");
    const char *env_core = getenv("OPENBLAS_CORETYPE");
    printf("# conv layers of the reference CNN, batch %d, %d repeats after 2 warm-ups\n", batch,
           repeats);
    printf("# OPENBLAS_NUM_THREADS=%s OPENBLAS_CORETYPE=%s\n", env_threads ? env_threads : "(unset)",
           env_core ? env_core : "(unset)");
    printf("%-22s %9s %9s %9s %9s %12s\n", "layer / pass", "median", "min", "max", "GFLOP/s",
           "sgemm only");
    printf("%-22s %9s %9s %9s %9s %12s\n", "", "ms", "ms", "ms", "", "median ms");

    double total[2] = {0.0, 0.0};
    static double times[BENCH_MAX_REPEATS];
    for (int l = 0; l < 3; l++) {
        const kernel_conv2d_dims *d = &layers[l];
        const size_t nin = (size_t)d->n * d->c * d->h * d->w;
        const size_t nw = (size_t)d->filters * d->c * d->size * d->size;
        const size_t nout =
            (size_t)d->n * d->filters * kernel_conv2d_out_h(d) * kernel_conv2d_out_w(d);
        float *in = bench_alloc("bench_kernels", nin, 1), *w = bench_alloc("bench_kernels", nw, 2), *b = bench_alloc("bench_kernels", d->filters, 3);
        float *dout = bench_alloc("bench_kernels", nout, 4), *out = bench_alloc("bench_kernels", nout, 5);
        float *din = bench_alloc("bench_kernels", nin, 6), *dw = bench_alloc("bench_kernels", nw, 7);
        float *db = bench_alloc("bench_kernels", d->filters, 8);
        float *work = bench_alloc("bench_kernels", kernel_conv2d_workspace_floats(d), 9);
        const int need_din = l > 0;
        const double cols = (double)d->n * kernel_conv2d_out_h(d) * kernel_conv2d_out_w(d);
        const double gemm_flops = 2.0 * d->filters * d->c * d->size * d->size * cols;

        for (int pass = PASS_FORWARD; pass <= PASS_BACKWARD; pass++) {
            bench_stats st[2];
            for (int gemm_only = 0; gemm_only < 2; gemm_only++) {
                for (int r = 0; r < repeats + 2; r++) {
                    double t0 = pt_now();
                    bench_run(pass, gemm_only, need_din, d, out, work, in, w, b, din, dw, db,
                              dout);
                    double t1 = pt_now();
                    if (r >= 2)
                        times[r - 2] = t1 - t0;
                }
                st[gemm_only] = bench_summarise(times, repeats);
            }
            const double flops = gemm_flops * (pass == PASS_FORWARD ? 1 : 1 + need_din);
            char name[48];
            snprintf(name, sizeof name, "conv%d %s", l + 1,
                     pass == PASS_FORWARD ? "forward" : need_din ? "backward" : "backward (no din)");
            printf("%-22s %9.3f %9.3f %9.3f %9.1f %12.3f\n", name, 1e3 * st[0].median,
                   1e3 * st[0].min, 1e3 * st[0].max, flops / st[0].median * 1e-9,
                   1e3 * st[1].median);
            total[0] += st[0].median;
            total[1] += st[1].median;
        }
        free(in); free(w); free(b); free(dout); free(out); free(din); free(dw); free(db);
        free(work);
    }
    printf("%-22s %9.3f %9s %9s %9s %12.3f\n", "sum of medians", 1e3 * total[0], "", "", "",
           1e3 * total[1]);
    return 0;
}
