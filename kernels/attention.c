/* Causal multi-head self-attention core (kernels/kernels_transformer.h), as GPT-2's
 * explicit form: softmax(mask(q k^T / sqrt(D))) v per sample and head.
 *
 * The products are cblas_sgemm calls on strided views of q, k, v (heads side by side in a
 * row, leading dimension qkv_stride), never copies. Rows are taken in blocks of ATTN_BLOCK
 * queries: block [i0, i1) needs keys [0, i1) only, so the products skip most of the masked
 * upper triangle (5/8 of the dense work at seq = 256, 17/32 at 1024) while each call
 * stays large enough for the BLAS. Backward sums over blocks (dk, dv) run from the last
 * block, which covers every key and overwrites, to the first: a fixed order. */
#include "kernels/kernels.h"
#include "kernels/fastmath.h"

#include <cblas.h>
#include <math.h>

enum { ATTN_BLOCK = 64, ATTN_LANES = 16 };

size_t kernel_attention_probs_floats(const kernel_attention_dims *d)
{
    return (size_t)d->batch * d->heads * d->seq * d->seq;
}

size_t kernel_attention_workspace_floats(const kernel_attention_dims *d)
{
    const int rows = d->seq < ATTN_BLOCK ? d->seq : ATTN_BLOCK;
    return (size_t)rows * d->seq;
}

/* Max and sums over a row in ATTN_LANES partial results (fixed, so deterministic) that GCC
 * vectorises; a single running value would be a scalar dependency chain. */
static float attn_row_max(const float *x, int n)
{
    float acc[ATTN_LANES];
    for (int l = 0; l < ATTN_LANES; l++)
        acc[l] = x[0];
    int j = 0;
    for (; j + ATTN_LANES <= n; j += ATTN_LANES)
        for (int l = 0; l < ATTN_LANES; l++)
            acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
    for (int l = 0; j < n; j++, l++)
        acc[l] = x[j] > acc[l] ? x[j] : acc[l];
    float m = acc[0];
    for (int l = 1; l < ATTN_LANES; l++)
        m = acc[l] > m ? acc[l] : m;
    return m;
}

/* Σ a[j]·b[j], or Σ a[j] when b is NULL. */
static float attn_row_sum(const float *a, const float *b, int n)
{
    float acc[ATTN_LANES] = {0};
    int j = 0;
    for (; j + ATTN_LANES <= n; j += ATTN_LANES)
        for (int l = 0; l < ATTN_LANES; l++)
            acc[l] += b ? a[j + l] * b[j + l] : a[j + l];
    for (int l = 0; j < n; j++, l++)
        acc[l] += b ? a[j] * b[j] : a[j];
    for (int w = ATTN_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

/* Rows i0 .. i0 + m − 1 of one head's scores s (leading dimension ld), keys [0, n): the
 * causal softmax in place, with zeros at j > i (the product with v reads them). */
static void attn_softmax_block(float *s, int ld, int i0, int m, int n)
{
    for (int r = 0; r < m; r++) {
        float *row = s + (size_t)r * ld;
        const int valid = i0 + r + 1;
        /* Subtracting the row maximum keeps every exponent ≤ 0 (no overflow). */
        const float mx = attn_row_max(row, valid);
        for (int j = 0; j < valid; j++)
            row[j] = fastmath_expf(row[j] - mx);
        const float inv = 1.0f / attn_row_sum(row, NULL, valid);
        for (int j = 0; j < valid; j++)
            row[j] *= inv;
        for (int j = valid; j < n; j++)
            row[j] = 0.0f;
    }
}

size_t kernel_attention_dropout_floats(const kernel_attention_dims *d)
{
    return kernel_attention_workspace_floats(d);
}

/* Rows i0 .. i0 + m − 1 of one head's probabilities P (leading dimension ld) through the
 * dropout into pd (same layout), keys [0, n): kept j ≤ i scaled, the rest 0, and the mask
 * of j ≤ i into mk (forward), or read from it (mk_in). head0: the element of (i = 0, j = 0)
 * of this head in the sample's whole numbering. */
static void attn_drop_block(float *pd, const float *P, int ld, uint8_t *mk, const uint8_t *mk_in,
                            int i0, int m, int n, size_t head0,
                            const kernel_attention_dropout *dr, int64_t id)
{
    for (int r = 0; r < m; r++) {
        const int i = i0 + r, valid = i + 1;
        float *o = pd + (size_t)r * ld;
        const float *x = P + (size_t)r * ld;
        if (mk)
            kernel_dropout_forward_range_cpu(o, mk + (size_t)r * ld, x, 1, (size_t)valid,
                                             head0 + (size_t)i * ld, dr->p, dr->seed,
                                             dr->stream, &id);
        else
            kernel_dropout_backward_cpu(o, x, mk_in + (size_t)r * ld, (size_t)valid, dr->p);
        for (int j = valid; j < n; j++)
            o[j] = 0.0f;
    }
}

static int attn_drops(const kernel_attention_dropout *dr) { return dr && dr->p > 0.0f; }

void kernel_attention_forward_dropout_cpu(float *y, float *probs, float *work, const float *q,
                                          const float *k, const float *v,
                                          const kernel_attention_dims *d,
                                          const kernel_attention_dropout *drop)
{
    const int T = d->seq, D = d->head_dim, ld = d->qkv_stride, C = d->heads * d->head_dim;
    const float scale = (float)(1.0 / sqrt((double)D));
    const int drops = attn_drops(drop);
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads; h++) {
            const size_t off = (size_t)b * T * ld + (size_t)h * D;
            const float *Q = q + off, *K = k + off, *V = v + off;
            float *Y = y + (size_t)b * T * C + (size_t)h * D;
            const size_t ph = ((size_t)b * d->heads + h) * T * T;
            float *P = probs + ph;
            for (int i0 = 0; i0 < T; i0 += ATTN_BLOCK) {
                const int m = T - i0 < ATTN_BLOCK ? T - i0 : ATTN_BLOCK, n = i0 + m;
                float *Pb = P + (size_t)i0 * T;
                /* S = scale · Q[i0:n] K[0:n]^T, then P = softmax(S), then Y = P V[0:n]
                 * (with dropout, Y = (P ∘ M / (1 − p)) V[0:n], P kept as it was). */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, D, scale,
                            Q + (size_t)i0 * ld, ld, K, ld, 0.0f, Pb, T);
                attn_softmax_block(Pb, T, i0, m, n);
                const float *A = Pb;
                if (drops) {
                    attn_drop_block(work, Pb, T, drop->mask + ph + (size_t)i0 * T, NULL, i0, m,
                                    n, drop->elem_off + (size_t)h * T * T, drop,
                                    drop->sample_ids[b]);
                    A = work;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, n, 1.0f, A, T,
                            V, ld, 0.0f, Y + (size_t)i0 * C, C);
            }
        }
}

void kernel_attention_forward_cpu(float *y, float *probs, const float *q, const float *k,
                                  const float *v, const kernel_attention_dims *d)
{
    kernel_attention_forward_dropout_cpu(y, probs, NULL, q, k, v, d, NULL);
}

/* dS = scale · P ∘ (dP − rowsum(P ∘ dP)) in place of dP, for rows i0 .. i0 + m − 1, keys
 * [0, n); zero above the diagonal. */
static void attn_softmax_backward_block(float *dp, const float *p, int ld, int i0, int m,
                                        int n, float scale)
{
    for (int r = 0; r < m; r++) {
        float *g = dp + (size_t)r * ld;
        const float *pr = p + (size_t)r * ld;
        const int valid = i0 + r + 1;
        const float dot = attn_row_sum(pr, g, valid);
        for (int j = 0; j < valid; j++)
            g[j] = scale * (pr[j] * (g[j] - dot));
        for (int j = valid; j < n; j++)
            g[j] = 0.0f;
    }
}

/* One (sample, head): the blocks from last to first. work holds one block's dP/dS, and
 * with dropout (mk: this head's mask) the next block of work its dropped probabilities. */
static void attn_backward_head(float *dQ, float *dK, float *dV, float *work, const float *dY,
                               const float *Q, const float *K, const float *V, const float *P,
                               int T, int D, int ld, int C, float scale, const uint8_t *mk,
                               const kernel_attention_dropout *dr)
{
    const int last = (T - 1) / ATTN_BLOCK * ATTN_BLOCK;
    float *pd = work + (size_t)(T < ATTN_BLOCK ? T : ATTN_BLOCK) * T;
    for (int i0 = last; i0 >= 0; i0 -= ATTN_BLOCK) {
        const int m = T - i0 < ATTN_BLOCK ? T - i0 : ATTN_BLOCK, n = i0 + m;
        const float beta = i0 == last ? 0.0f : 1.0f; /* the last block covers all keys */
        const float *Pb = P + (size_t)i0 * T, *dYb = dY + (size_t)i0 * C, *A = Pb;
        const uint8_t *mb = mk ? mk + (size_t)i0 * T : NULL;
        if (mb) { /* the forward's P ∘ M / (1 − p), the same bits */
            attn_drop_block(pd, Pb, T, NULL, mb, i0, m, n, 0, dr, 0);
            A = pd;
        }
        /* dV[0:n] += A^T dY and dP = dY V[0:n]^T (into work, leading dimension T); with
         * dropout, dA is that and dP = dA ∘ M / (1 − p). */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, m, 1.0f, A, T, dYb, C,
                    beta, dV, ld);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, D, 1.0f, dYb, C, V, ld,
                    0.0f, work, T);
        if (mb)
            for (int r = 0; r < m; r++)
                kernel_dropout_backward_cpu(work + (size_t)r * T, work + (size_t)r * T,
                                            mb + (size_t)r * T, (size_t)(i0 + r + 1), dr->p);
        attn_softmax_backward_block(work, Pb, T, i0, m, n, scale);
        /* dQ[i0:n] = dS K[0:n] (each row once) and dK[0:n] += dS^T Q[i0:n]. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, D, n, 1.0f, work, T, K, ld,
                    0.0f, dQ + (size_t)i0 * ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, m, 1.0f, work, T,
                    Q + (size_t)i0 * ld, ld, beta, dK, ld);
    }
}

void kernel_attention_backward_dropout_cpu(float *dq, float *dk, float *dv, float *work,
                                           const float *dy, const float *q, const float *k,
                                           const float *v, const float *probs,
                                           const kernel_attention_dims *d,
                                           const kernel_attention_dropout *drop)
{
    const int T = d->seq, D = d->head_dim, ld = d->qkv_stride, C = d->heads * d->head_dim;
    const float scale = (float)(1.0 / sqrt((double)D));
    const int drops = attn_drops(drop);
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads; h++) {
            const size_t off = (size_t)b * T * ld + (size_t)h * D;
            const size_t ph = ((size_t)b * d->heads + h) * T * T;
            attn_backward_head(dq + off, dk + off, dv + off, work,
                               dy + (size_t)b * T * C + (size_t)h * D, q + off, k + off,
                               v + off, probs + ph, T, D, ld, C, scale,
                               drops ? drop->mask + ph : NULL, drop);
        }
}

void kernel_attention_backward_cpu(float *dq, float *dk, float *dv, float *work,
                                   const float *dy, const float *q, const float *k,
                                   const float *v, const float *probs,
                                   const kernel_attention_dims *d)
{
    kernel_attention_backward_dropout_cpu(dq, dk, dv, work, dy, q, k, v, probs, d, NULL);
}
