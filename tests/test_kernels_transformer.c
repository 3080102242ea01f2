/* The transformer CPU kernels by their own properties (kernels/kernels_transformer.h): every
 * backward against central finite differences of L = Σ r·out (tests/kernels_fd.h), forwards
 * against direct double-precision loops, accumulation, the split halves, aliasing,
 * determinism; the language-model cross-entropy, AdamW against Adam, and the
 * gradient-norm helpers. tests/test_golden_transformer.c compares them with PyTorch. */
#include "kernels/kernels.h"
#include "tests/check.h"
#include "tests/kernels_fd.h"

#include <stdio.h>
#include <stdint.h>
#include <string.h>

/* ---- layer norm ---- */

typedef struct {
    float *x, *gamma, *beta, *r, *out, *mean, *rstd;
    int rows, width;
} ln_ctx;

static double ln_loss(void *p)
{
    ln_ctx *c = p;
    kernel_layernorm_forward_cpu(c->out, c->mean, c->rstd, c->x, c->gamma, c->beta, c->rows,
                                 c->width);
    return weighted_sum(c->r, c->out, (size_t)c->rows * c->width);
}

static void ln_reference(double *out, const float *x, const float *gamma, const float *beta,
                         int rows, int width)
{
    for (int i = 0; i < rows; i++) {
        const float *xr = x + (size_t)i * width;
        double mu = 0, var = 0;
        for (int j = 0; j < width; j++) mu += xr[j];
        mu /= width;
        for (int j = 0; j < width; j++) var += (xr[j] - mu) * (xr[j] - mu);
        const double rs = 1.0 / sqrt(var / width + 1e-5);
        for (int j = 0; j < width; j++)
            out[(size_t)i * width + j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
    }
}

static void ln_check(int rows, int width, uint64_t seed)
{
    const size_t n = (size_t)rows * width;
    ln_ctx c = {rand_array(n, 2, seed), rand_array(width, 1, seed + 1),
                rand_array(width, 1, seed + 2), rand_array(n, 1, seed + 3),
                malloc(n * sizeof(float)), malloc(rows * sizeof(float)),
                malloc(rows * sizeof(float)), rows, width};
    for (size_t i = 0; i < n; i++) c.x[i] += 3.0f; /* a mean far from 0 */
    char what[64];
    snprintf(what, sizeof what, "layernorm %dx%d", rows, width);
    double *ref = malloc(n * sizeof *ref);
    ln_reference(ref, c.x, c.gamma, c.beta, rows, width);
    ln_loss(&c);
    CHECK_CLOSE(what, c.out, ref, n, 1e-5, 1e-5);

    float *dx = malloc(n * sizeof *dx), *dg = calloc(width, sizeof *dg);
    float *db = calloc(width, sizeof *db);
    kernel_layernorm_backward_cpu(dx, dg, db, c.r, c.x, c.mean, c.rstd, c.gamma, rows, width);
    CHECK_FD(what, dx, c.x, n, 1e-2f, ln_loss, &c, 5e-4, 1e-3);
    CHECK_FD(what, dg, c.gamma, width, 0.25f, ln_loss, &c, 2e-4, 1e-3);
    CHECK_FD(what, db, c.beta, width, 0.25f, ln_loss, &c, 2e-4, 1e-3);
    ln_loss(&c); /* mean and rstd at the unperturbed input again */

    /* The halves give the whole call's bits; dx may alias dy; dgamma and dbeta add. */
    float *dx2 = copy_array(c.r, n), *dg2 = copy_array(dg, width), *db2 = copy_array(db, width);
    kernel_layernorm_backward_cpu(dx2, NULL, NULL, dx2, c.x, c.mean, c.rstd, c.gamma, rows, width);
    cr_assert_eq(count_differences(dx2, dx, n), 0, "%s: input half differs", what);
    kernel_layernorm_backward_cpu(NULL, dg2, db2, c.r, c.x, c.mean, c.rstd, c.gamma, rows, width);
    for (int j = 0; j < width; j++) {
        dg[j] *= 2.0f;
        db[j] *= 2.0f;
    }
    CHECK_CLOSE(what, dg2, dg, width, 1e-6, 1e-6);
    CHECK_CLOSE(what, db2, db, width, 1e-6, 1e-6);
    free(c.x); free(c.gamma); free(c.beta); free(c.r); free(c.out); free(c.mean); free(c.rstd);
    free(ref); free(dx); free(dg); free(db); free(dx2); free(dg2); free(db2);
}

/* Widths below, at and past the 16 partial sums the row statistics use. */
Test(transformer, layernorm)
{
    ln_check(5, 13, 100);
    ln_check(3, 16, 110);
    ln_check(4, 37, 120);
}

/* A row of equal values has variance 0: rstd is 1/sqrt(eps), the output beta. */
Test(transformer, layernorm_constant_row)
{
    float x[8], g[8], b[8], out[8], mean, rstd;
    for (int j = 0; j < 8; j++) {
        x[j] = 1e3f;
        g[j] = 1.0f + j;
        b[j] = -0.5f * j;
    }
    kernel_layernorm_forward_cpu(out, &mean, &rstd, x, g, b, 1, 8);
    CHECK_CLOSE("constant row", out, b, 8, 0, 0);
    cr_expect(mean == 1e3f && fabsf(rstd - 316.227766f) < 1e-3f, "mean %g rstd %g", mean, rstd);
}

/* ---- GELU (tanh) ---- */

typedef struct {
    float *in, *r, *out;
    size_t count;
} gelu_ctx;

static double gelu_loss(void *p)
{
    gelu_ctx *c = p;
    kernel_gelu_forward_cpu(c->out, c->in, c->count);
    return weighted_sum(c->r, c->out, c->count);
}

Test(transformer, gelu)
{
    const size_t n = 101;
    gelu_ctx c = {rand_array(n, 5, 200), rand_array(n, 1, 201), malloc(n * sizeof(float)), n};
    c.in[0] = 0.0f;
    c.in[1] = 30.0f;
    c.in[2] = -30.0f;
    double ref[101];
    for (size_t i = 0; i < n; i++) {
        const double x = c.in[i];
        ref[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
    gelu_loss(&c);
    CHECK_CLOSE("gelu", c.out, ref, n, 1e-7, 2e-6);
    float *din = malloc(n * sizeof *din);
    kernel_gelu_backward_cpu(din, c.r, c.in, n);
    CHECK_FD("gelu din", din, c.in, n, 1e-2f, gelu_loss, &c, 1e-4, 1e-3);
    /* din may alias dout. */
    float *g = copy_array(c.r, n);
    kernel_gelu_backward_cpu(g, g, c.in, n);
    cr_assert_eq(count_differences(g, din, n), 0);
    free(c.in); free(c.r); free(c.out); free(din); free(g);
}

/* ---- token + position embedding ---- */

typedef struct {
    float *wte, *wpe, *r, *out;
    int32_t *tok;
    int batch, seq, width, vocab;
} emb_ctx;

static double emb_loss(void *p)
{
    emb_ctx *c = p;
    kernel_embedding_forward_cpu(c->out, c->tok, c->wte, c->wpe, c->batch, c->seq, c->width,
                                 c->vocab);
    return weighted_sum(c->r, c->out, (size_t)c->batch * c->seq * c->width);
}

Test(transformer, embedding)
{
    enum { B = 2, T = 5, W = 6, V = 7, CTX = 8 };
    int32_t tok[B * T] = {3, 1, 3, 0, 6, 6, 3, 2, 2, 5}; /* repeats within and across rows */
    emb_ctx c = {rand_array(V * W, 1, 300), rand_array(CTX * W, 1, 301),
                 rand_array(B * T * W, 1, 302), malloc(B * T * W * sizeof(float)), tok,
                 B, T, W, V};
    emb_loss(&c);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < W; j++) {
                const float want = c.wte[tok[b * T + t] * W + j] + c.wpe[t * W + j];
                cr_assert(c.out[(b * T + t) * W + j] == want, "out[%d, %d, %d]", b, t, j);
            }
    float *dwte = calloc(V * W, sizeof *dwte), *dwpe = calloc(CTX * W, sizeof *dwpe);
    kernel_embedding_backward_cpu(dwte, dwpe, c.r, tok, B, T, W, V);
    CHECK_FD("dwte", dwte, c.wte, V * W, 0.25f, emb_loss, &c, 1e-5, 1e-5);
    CHECK_FD("dwpe", dwpe, c.wpe, CTX * W, 0.25f, emb_loss, &c, 1e-5, 1e-5);
    /* Accumulates; dwpe may be NULL (positions past seq are never touched). */
    float *dwte2 = copy_array(dwte, V * W);
    kernel_embedding_backward_cpu(dwte2, NULL, c.r, tok, B, T, W, V);
    for (int i = 0; i < V * W; i++) dwte[i] *= 2.0f;
    CHECK_CLOSE("dwte twice", dwte2, dwte, V * W, 1e-6, 1e-6);
    for (int i = T * W; i < CTX * W; i++) cr_assert(dwpe[i] == 0.0f);
    free(c.wte); free(c.wpe); free(c.r); free(c.out); free(dwte); free(dwpe); free(dwte2);
}

/* An id out of range gives a NaN row and no gradient, reading nothing outside wte. */
Test(transformer, embedding_bad_token)
{
    int32_t tok[3] = {1, 4, -1};
    float wte[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8}, wpe[3 * 2] = {0}, out[3 * 2];
    float dwte[4 * 2] = {0}, dout[3 * 2] = {1, 1, 1, 1, 1, 1};
    kernel_embedding_forward_cpu(out, tok, wte, wpe, 1, 3, 2, 4);
    cr_expect(out[0] == 3.0f && out[1] == 4.0f);
    cr_expect(isnan(out[2]) && isnan(out[3]) && isnan(out[4]) && isnan(out[5]));
    kernel_embedding_backward_cpu(dwte, NULL, dout, tok, 1, 3, 2, 4);
    const float want[8] = {0, 0, 1, 1, 0, 0, 0, 0};
    CHECK_CLOSE("dwte", dwte, want, 8, 0, 0);
}

/* ---- causal self-attention ---- */

typedef struct {
    kernel_attention_dims d;
    float *q, *k, *v;   /* views: into buf when fused, else three buffers */
    float *buf, *r, *y, *probs;
} attn_ctx;

static double attn_loss(void *p)
{
    attn_ctx *c = p;
    kernel_attention_forward_cpu(c->y, c->probs, c->q, c->k, c->v, &c->d);
    return weighted_sum(c->r, c->y, (size_t)c->d.batch * c->d.seq * c->d.heads * c->d.head_dim);
}

/* y and P by the definition, in double. */
static void attn_reference(double *y, double *p, const attn_ctx *c)
{
    const kernel_attention_dims *d = &c->d;
    const int T = d->seq, D = d->head_dim, ld = d->qkv_stride, C = d->heads * D;
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads; h++)
            for (int i = 0; i < T; i++) {
                double *pr = p + (((size_t)b * d->heads + h) * T + i) * T, mx = -INFINITY, s = 0;
                for (int j = 0; j <= i; j++) {
                    double dot = 0;
                    for (int e = 0; e < D; e++)
                        dot += (double)c->q[(size_t)(b * T + i) * ld + h * D + e] *
                               c->k[(size_t)(b * T + j) * ld + h * D + e];
                    pr[j] = dot / sqrt((double)D);
                    mx = pr[j] > mx ? pr[j] : mx;
                }
                for (int j = 0; j <= i; j++) s += pr[j] = exp(pr[j] - mx);
                for (int j = 0; j < T; j++) pr[j] = j <= i ? pr[j] / s : 0.0;
                for (int e = 0; e < D; e++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++)
                        acc += pr[j] * c->v[(size_t)(b * T + j) * ld + h * D + e];
                    y[(size_t)(b * T + i) * C + h * D + e] = acc;
                }
            }
}

/* The forward against the reference; the lower triangle of probs against P. */
static void attn_check_forward(attn_ctx *c, const char *what)
{
    const kernel_attention_dims *d = &c->d;
    const int T = d->seq;
    const size_t ny = (size_t)d->batch * T * d->heads * d->head_dim;
    const size_t np = kernel_attention_probs_floats(d);
    double *y = malloc(ny * sizeof *y), *p = malloc(np * sizeof *p);
    attn_reference(y, p, c);
    attn_loss(c);
    CHECK_CLOSE(what, c->y, y, ny, 1e-6, 1e-5);
    for (size_t bh = 0; bh < (size_t)d->batch * d->heads; bh++)
        for (int i = 0; i < T; i++) {
            const size_t row = (bh * T + i) * T;
            CHECK_CLOSE(what, c->probs + row, p + row, (size_t)i + 1, 1e-7, 1e-5);
        }
    free(y);
    free(p);
}

enum { ATTN_GUARD = 32 };

/* One shape: forward, dq/dk/dv by finite differences, determinism, and that the entries
 * the header calls unspecified (probs above the diagonal, the workspace) are never read:
 * they start as NaN. fused puts q, k, v side by side in rows of 3·C + 2 floats (two
 * padding columns that must stay untouched), as GPT-2's c_attn output plus padding. */
static void attn_check(int batch, int seq, int heads, int head_dim, int fused, uint64_t seed)
{
    const int C = heads * head_dim, N = batch * seq;
    attn_ctx c = {.d = {batch, seq, heads, head_dim, fused ? 3 * C + 2 : C}};
    const size_t nq = (size_t)N * c.d.qkv_stride, ny = (size_t)N * C;
    const size_t np = kernel_attention_probs_floats(&c.d);
    const size_t nw = kernel_attention_workspace_floats(&c.d);
    char what[96];
    snprintf(what, sizeof what, "attention B%d T%d H%d D%d%s", batch, seq, heads, head_dim,
             fused ? " fused" : "");
    c.buf = rand_array(fused ? nq : 3 * nq, 1.5f, seed);
    c.q = c.buf;
    c.k = fused ? c.buf + C : c.buf + nq;
    c.v = fused ? c.buf + 2 * C : c.buf + 2 * nq;
    c.r = rand_array(ny, 1, seed + 1);
    c.y = malloc(ny * sizeof(float));
    c.probs = malloc(np * sizeof(float));
    float *work = malloc((nw + ATTN_GUARD) * sizeof *work);
    for (size_t i = 0; i < np; i++) c.probs[i] = NAN;
    for (size_t i = 0; i < nw; i++) work[i] = NAN;
    for (int i = 0; i < ATTN_GUARD; i++) work[nw + i] = 12345.0f;
    attn_check_forward(&c, what);

    /* Gradients laid out as the inputs; padding columns start (and must stay) 0. */
    const size_t ng = fused ? nq : 3 * nq;
    float *grad = calloc(ng, sizeof *grad);
    float *dq = grad, *dk = fused ? grad + C : grad + nq;
    float *dv = fused ? grad + 2 * C : grad + 2 * nq;
    kernel_attention_backward_cpu(dq, dk, dv, work, c.r, c.q, c.k, c.v, c.probs, &c.d);
    for (int i = 0; i < ATTN_GUARD; i++)
        cr_assert(work[nw + i] == 12345.0f, "%s: workspace overrun", what);
    float *again = copy_array(grad, ng);
    kernel_attention_backward_cpu(dq, dk, dv, work, c.r, c.q, c.k, c.v, c.probs, &c.d);
    cr_assert_eq(count_differences(again, grad, ng), 0, "%s: not deterministic", what);
    /* Finite differences over the whole input storage (all of q, k, v and the padding). */
    CHECK_FD(what, grad, c.buf, ng, 1e-2f, attn_loss, &c, 3e-4, 1e-3);
    free(c.buf); free(c.r); free(c.y); free(c.probs); free(work); free(grad); free(again);
}

Test(transformer, attention_small)
{
    attn_check(1, 1, 1, 4, 0, 400);  /* one token: y = v, no gradient for q and k */
    attn_check(2, 7, 3, 4, 1, 410);
    attn_check(2, 5, 1, 8, 0, 420);
    attn_check(3, 3, 3, 4, 0, 430);
}

/* Past one block of 64 queries: the blocked products and the backward's order of blocks. */
Test(transformer, attention_blocks)
{
    attn_check(1, 67, 3, 4, 1, 440);
    attn_check(1, 130, 1, 4, 0, 450);
}

/* ---- the language-model loss: kernel_softmax_xent_cpu over every position ---- */

typedef struct {
    float *logits;
    int32_t *targets;
    int n, vocab;
} lm_ctx;

static double lm_loss(void *p)
{
    lm_ctx *c = p;
    return kernel_softmax_xent_cpu(NULL, NULL, c->logits, c->targets, c->n, c->vocab,
                                   1.0f) / c->n;
}

Test(transformer, lm_cross_entropy)
{
    enum { B = 2, T = 3, N = B * T, V = 1000 };
    int32_t targets[N] = {0, 999, 17, 500, 17, 3};
    lm_ctx c = {rand_array((size_t)N * V, 4, 500), targets, N, V};
    float *dl = malloc((size_t)N * V * sizeof *dl);
    const double sum = kernel_softmax_xent_cpu(dl, NULL, c.logits, targets, N, V, 1.0f / N);
    double want = 0;
    for (int i = 0; i < N; i++) {
        const float *x = c.logits + (size_t)i * V;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)x[j]);
        want += log(s) - x[targets[i]];
    }
    cr_expect(fabs(sum - want) <= 1e-9 * want, "sum %.15g, want %.15g", sum, want);
    CHECK_FD("lm dlogits", dl, c.logits, (size_t)N * V, 1e-2f, lm_loss, &c, 1e-6, 1e-3);
    free(c.logits);
    free(dl);
}

/* ---- AdamW ---- */

/* AdamW is the decay p·(1 − lr·wd) followed by Adam without weight decay, bit for bit. */
Test(transformer, adamw_is_decay_then_adam)
{
    const size_t n = 1000; /* two chunks of the update and a tail */
    float *p = rand_array(n, 1, 600), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    float *p2 = copy_array(p, n), *m2 = calloc(n, sizeof *m2), *v2 = calloc(n, sizeof *v2);
    const float decay = kernel_adamw_decay_at(6e-4f, 0.1f);
    cr_expect(decay == (float)(1.0 - 6e-4 * 0.1), "decay %.9g", decay);
    for (long t = 1; t <= 3; t++) {
        float *g = rand_array(n, 0.1f, 610 + t);
        kernel_adamw_update_cpu(p, m, v, g, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        for (size_t i = 0; i < n; i++) p2[i] *= decay;
        kernel_adam_update_cpu(p2, m2, v2, g, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, t);
        cr_assert_eq(count_differences(p, p2, n), 0, "step %ld", t);
        free(g);
    }
    cr_assert_eq(count_differences(m, m2, n) + count_differences(v, v2, n), 0);
    free(p); free(m); free(v); free(p2); free(m2); free(v2);
}

/* ---- gradient-norm helpers ---- */

Test(transformer, sum_squares_and_scale)
{
    const size_t n = 1237;
    float *x = rand_array(n + 1, 3, 700);
    double want = 0;
    for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    const double s = kernel_sum_squares_cpu(x, n);
    cr_expect(fabs(s - want) <= 1e-14 * want, "%.17g, want %.17g", s, want);
    /* The same bits at another address (blocking by index, not by alignment). */
    memmove(x + 1, x, n * sizeof *x);
    const double s1 = kernel_sum_squares_cpu(x + 1, n);
    cr_expect(memcmp(&s, &s1, sizeof s) == 0, "%.17g moved: %.17g", s, s1);
    cr_expect(kernel_sum_squares_cpu(x, 0) == 0.0);

    /* torch: max_norm / (norm + 1e-6), at most 1. */
    cr_expect(kernel_clip_scale(16.0, 1.0f) == (1.0f / (4.0f + 1e-6f)) * 1.0f);
    cr_expect(kernel_clip_scale(0.25, 1.0f) == 1.0f);
    cr_expect(kernel_clip_scale(0.0, 1.0f) == 1.0f);
    float y[5] = {1, -2, 3, 0, 4};
    kernel_scale_cpu(y, 5, 0.5f);
    const float half[5] = {0.5f, -1, 1.5f, 0, 2};
    CHECK_CLOSE("scale", y, half, 5, 0, 0);
    free(x);
}
