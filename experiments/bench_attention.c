/* Benchmark: the causal self-attention core (kernel_attention_forward_cpu / _backward_cpu)
 * at GPT-2-like sizes, next to the same sgemm calls alone, to show that the products
 * dominate its time.
 *
 *   ./bench_attention [--batch 8] [--seq 256] [--heads 6] [--head-dim 64] [--threads 1]
 *                     [--repeats 20]
 *
 * Prints one table: per pass, the median, min and max milliseconds over the repeats (after
 * two warm-ups), GFLOP/s of the median counting the products the kernel executes (query
 * blocks of 64 against the keys they can see, kernels/attention.c), and the median of those
 * sgemm calls alone. The header also gives the causal flop count (keys j ≤ i only) and the
 * dense one (all T² scores), for comparison with other implementations. q, k, v are views
 * into one [tokens, 3·C] buffer, as GPT-2's c_attn output. */
#include "kernels/kernels.h"
#include "experiments/bench_common.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void openblas_set_num_threads(int);

enum { BLOCK = 64 }; /* kernels/attention.c's ATTN_BLOCK */

typedef struct {
    kernel_attention_dims d;
    float *qkv, *dqkv, *y, *dy, *probs, *work;
} bench_bufs;

/* The kernel's sgemm calls with the same shapes and strides, and nothing else. */
static void bench_gemms(const bench_bufs *b, int backward)
{
    const kernel_attention_dims *d = &b->d;
    const int T = d->seq, D = d->head_dim, ld = d->qkv_stride, C = d->heads * D;
    for (int s = 0; s < d->batch; s++)
        for (int h = 0; h < d->heads; h++) {
            const size_t off = (size_t)s * T * ld + (size_t)h * D;
            const float *Q = b->qkv + off, *K = Q + C, *V = Q + 2 * C;
            float *dQ = b->dqkv + off, *dK = dQ + C, *dV = dQ + 2 * C;
            float *Y = b->y + (size_t)s * T * C + (size_t)h * D;
            const float *dY = b->dy + (size_t)s * T * C + (size_t)h * D;
            float *P = b->probs + ((size_t)s * d->heads + h) * T * T;
            for (int i0 = 0; i0 < T; i0 += BLOCK) {
                const int m = T - i0 < BLOCK ? T - i0 : BLOCK, n = i0 + m;
                float *Pb = P + (size_t)i0 * T;
                if (!backward) {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, D, 1.0f,
                                Q + (size_t)i0 * ld, ld, K, ld, 0.0f, Pb, T);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, n, 1.0f, Pb, T,
                                V, ld, 0.0f, Y + (size_t)i0 * C, C);
                    continue;
                }
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, m, 1.0f, Pb, T,
                            dY + (size_t)i0 * C, C, 1.0f, dV, ld);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, D, 1.0f,
                            dY + (size_t)i0 * C, C, V, ld, 0.0f, b->work, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, n, 1.0f, b->work, T,
                            K, ld, 0.0f, dQ + (size_t)i0 * ld, ld);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, m, 1.0f, b->work, T,
                            Q + (size_t)i0 * ld, ld, 1.0f, dK, ld);
            }
        }
}

static void bench_pass(const bench_bufs *b, int backward, int gemm_only)
{
    const kernel_attention_dims *d = &b->d;
    const int C = d->heads * d->head_dim;
    if (gemm_only)
        bench_gemms(b, backward);
    else if (!backward)
        kernel_attention_forward_cpu(b->y, b->probs, b->qkv, b->qkv + C, b->qkv + 2 * C, d);
    else
        kernel_attention_backward_cpu(b->dqkv, b->dqkv + C, b->dqkv + 2 * C, b->work, b->dy,
                                      b->qkv, b->qkv + C, b->qkv + 2 * C, b->probs, d);
}

/* Median, min and max seconds of one pass over the repeats after two warm-ups. */
static void bench_time(double out[3], const bench_bufs *b, int backward, int gemm_only,
                       int repeats)
{
    static double t[BENCH_MAX_REPEATS];
    for (int r = 0; r < repeats + 2; r++) {
        const double t0 = pt_now();
        bench_pass(b, backward, gemm_only);
        if (r >= 2)
            t[r - 2] = pt_now() - t0;
    }
    bench_stats st = bench_summarise(t, repeats);
    out[0] = st.median;
    out[1] = st.min;
    out[2] = st.max;
}

static int bench_args(int argc, char **argv, kernel_attention_dims *d, int *threads,
                      int *repeats)
{
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--batch")      ? &d->batch
                   : !strcmp(argv[i], "--seq")      ? &d->seq
                   : !strcmp(argv[i], "--heads")    ? &d->heads
                   : !strcmp(argv[i], "--head-dim") ? &d->head_dim
                   : !strcmp(argv[i], "--threads")  ? threads
                   : !strcmp(argv[i], "--repeats")  ? repeats
                                                    : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(stderr, "usage: %s [--batch N] [--seq T] [--heads H] [--head-dim D] "
                            "[--threads N] [--repeats N] (all >= 1)\n", argv[0]);
            return -1;
        }
    }
    if (*repeats > BENCH_MAX_REPEATS) {
        fprintf(stderr, "bench_attention: at most %d repeats\n", BENCH_MAX_REPEATS);
        return -1;
    }
    d->qkv_stride = 3 * d->heads * d->head_dim;
    return 0;
}

/* The kernel's workspace, or what this file's copy of its products writes, if more. */
static size_t bench_work_floats(const kernel_attention_dims *d)
{
    const size_t own = (size_t)(d->seq < BLOCK ? d->seq : BLOCK) * d->seq;
    const size_t kernel = kernel_attention_workspace_floats(d);
    return own > kernel ? own : kernel;
}

int main(int argc, char **argv)
{
    kernel_attention_dims d = {.batch = 8, .seq = 256, .heads = 6, .head_dim = 64};
    int threads = 1, repeats = 20;
    if (bench_args(argc, argv, &d, &threads, &repeats) != 0)
        return 2;
    openblas_set_num_threads(threads);
    const int T = d.seq, C = d.heads * d.head_dim;
    const size_t tokens = (size_t)d.batch * T;
    bench_bufs b = {d, bench_alloc("bench_attention", tokens * 3 * C, 1), bench_alloc("bench_attention", tokens * 3 * C, 2),
                    bench_alloc("bench_attention", tokens * C, 3), bench_alloc("bench_attention", tokens * C, 4),
                    bench_alloc("bench_attention", kernel_attention_probs_floats(&d), 5),
                    bench_alloc("bench_attention", bench_work_floats(&d), 6)};
    /* Flops of one product over a (sample, head): executed (blocked), causal, dense. */
    double keys_blocked = 0.0;
    for (int i0 = 0; i0 < T; i0 += BLOCK) {
        const int m = T - i0 < BLOCK ? T - i0 : BLOCK;
        keys_blocked += (double)m * (i0 + m);
    }
    const double per = 2.0 * d.batch * d.heads * d.head_dim;
    const double f_exec = per * keys_blocked, f_causal = per * T * (T + 1) / 2.0;
    const double f_dense = per * T * T;
    const char *env_core = getenv("OPENBLAS_CORETYPE");
    printf("# causal attention B=%d T=%d H=%d D=%d, %d BLAS thread(s), OPENBLAS_CORETYPE=%s, "
           "%d repeats after 2 warm-ups\n", d.batch, T, d.heads, d.head_dim, threads,
           env_core ? env_core : "(unset)", repeats);
    printf("# GFLOP per pass (forward 2 products, backward 4): executed %.3f / %.3f, causal "
           "%.3f / %.3f, dense %.3f / %.3f\n", 2 * f_exec * 1e-9, 4 * f_exec * 1e-9,
           2 * f_causal * 1e-9, 4 * f_causal * 1e-9, 2 * f_dense * 1e-9, 4 * f_dense * 1e-9);
    printf("%-18s %9s %9s %9s %9s %9s %12s\n", "pass", "median", "min", "max", "GFLOP/s",
           "causal", "sgemm only");
    printf("%-18s %9s %9s %9s %9s %9s %12s\n", "", "ms", "ms", "ms", "executed", "GFLOP/s",
           "median ms");
    double sum[2] = {0.0, 0.0};
    for (int pass = 0; pass < 2; pass++) {
        double k[3], g[3];
        bench_time(k, &b, pass, 0, repeats);
        bench_time(g, &b, pass, 1, repeats);
        const int products = pass ? 4 : 2;
        printf("%-18s %9.3f %9.3f %9.3f %9.1f %9.1f %12.3f\n", pass ? "backward" : "forward",
               1e3 * k[0], 1e3 * k[1], 1e3 * k[2], products * f_exec / k[0] * 1e-9,
               products * f_causal / k[0] * 1e-9, 1e3 * g[0]);
        sum[0] += k[0];
        sum[1] += g[0];
    }
    printf("%-18s %9.3f %9s %9s %9.1f %9.1f %12.3f\n", "forward+backward", 1e3 * sum[0], "", "",
           6 * f_exec / sum[0] * 1e-9, 6 * f_causal / sum[0] * 1e-9, 1e3 * sum[1]);
    free(b.qkv); free(b.dqkv); free(b.y); free(b.dy); free(b.probs); free(b.work);
    return 0;
}
