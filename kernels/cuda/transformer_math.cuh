/* The per-thread math of the transformer kernels (kernels/cuda/transformer.cu): each
 * function is what ONE thread of a kernel computes, compiled for the device and for the
 * host (__host__ __device__), so that tests/cuda/test_transformer_host.cu runs the device
 * code thread by thread on a machine without a GPU, against the CPU twins of
 * kernels/kernels_transformer.h. Private to kernels/cuda/ and its tests.
 *
 * Conventions as the CPU kernels': float32 row-major, token t of sample b is row b·seq + t,
 * parameter gradients accumulate, input gradients are overwritten. Sums run in a fixed
 * order inside one thread (no atomics, no reductions across threads), so every result is
 * the same bits on every run.
 *
 * TFC_PLANTED (a number, for the planted-bug runs of the host test only): breaks one
 * function on purpose, to show that the test notices. Never defined in a real build. */
#ifndef PT_KERNELS_CUDA_TRANSFORMER_MATH_CUH
#define PT_KERNELS_CUDA_TRANSFORMER_MATH_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define TFC_HD __host__ __device__ static inline

#ifndef TFC_PLANTED
#define TFC_PLANTED 0
#endif

/* Partial sums of the layer norm statistics: the CPU's 16 lanes in double, added in its
 * fixed tree. */
enum { TFC_LANES = 16 };
/* The longest head the fused attention keeps in a thread's registers (query, output or
 * gradient rows): GPT-2's is 64; wider heads are refused with a message. */
enum { TFC_MAX_HEAD_DIM = 128 };

TFC_HD double tfc_lanes_total(double *s)
{
    for (int w = TFC_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++)
            s[j] += s[j + w];
    return s[0];
}

/* ---- layer norm ---- */

/* Row statistics as kernel_layernorm_forward_cpu: two passes in double over 16 lanes. */
TFC_HD void tfc_ln_stats(const float *xr, int width, float *mean, float *rstd)
{
    double acc[TFC_LANES] = {0};
    int i = 0;
    for (; i + TFC_LANES <= width; i += TFC_LANES)
        for (int j = 0; j < TFC_LANES; j++)
            acc[j] += (double)xr[i + j];
    for (int j = 0; i < width; i++, j++)
        acc[j] += (double)xr[i];
    const double mu = tfc_lanes_total(acc) / width;
    for (int j = 0; j < TFC_LANES; j++)
        acc[j] = 0.0;
    for (i = 0; i + TFC_LANES <= width; i += TFC_LANES)
        for (int j = 0; j < TFC_LANES; j++) {
            const double d = (double)xr[i + j] - mu;
            acc[j] += d * d;
        }
    for (int j = 0; i < width; i++, j++) {
        const double d = (double)xr[i] - mu;
        acc[j] += d * d;
    }
    const double var = tfc_lanes_total(acc) / width;
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(var + KERNEL_LAYERNORM_EPS));
#if TFC_PLANTED == 1
    *rstd = (float)(1.0 / sqrt(var + 1e-2));
#endif
}

/* One element of the normalised output, from the saved float statistics. */
TFC_HD float tfc_ln_out(float x, float mean, float rstd, float gamma, float beta)
{
    return (x - mean) * rstd * gamma + beta;
}

/* Column j of dgamma and dbeta (either may be NULL): the rows added in order. */
TFC_HD void tfc_ln_param_col(float *dgamma, float *dbeta, const float *dy, const float *x,
                             const float *mean, const float *rstd, int rows, int width, int j)
{
    float g = dgamma ? dgamma[j] : 0.0f, b = dbeta ? dbeta[j] : 0.0f;
    for (int r = 0; r < rows; r++) {
        const size_t at = (size_t)r * width + j;
        g += dy[at] * ((x[at] - mean[r]) * rstd[r]);
        b += dy[at];
    }
#if TFC_PLANTED == 2
    g *= 1.001f;
#endif
    if (dgamma)
        dgamma[j] = g;
    if (dbeta)
        dbeta[j] = b;
}

/* One row of dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)), g = dy · gamma. dx may alias dy
 * (each index is read before it is written, by this thread only). */
TFC_HD void tfc_ln_dx_row(float *dx, const float *dy, const float *xr, float mu, float rs,
                          const float *gamma, int width)
{
    double acc_g[TFC_LANES] = {0}, acc_gx[TFC_LANES] = {0};
    int j = 0;
    for (; j + TFC_LANES <= width; j += TFC_LANES)
        for (int l = 0; l < TFC_LANES; l++) {
            const float xh = (xr[j + l] - mu) * rs, g = dy[j + l] * gamma[j + l];
            acc_g[l] += g;
            acc_gx[l] += (double)g * xh;
        }
    for (int l = 0; j < width; j++, l++) {
        const float xh = (xr[j] - mu) * rs, g = dy[j] * gamma[j];
        acc_g[l] += g;
        acc_gx[l] += (double)g * xh;
    }
    const float mg = (float)(tfc_lanes_total(acc_g) / width);
    const float mgx = (float)(tfc_lanes_total(acc_gx) / width);
    for (j = 0; j < width; j++) {
        const float xh = (xr[j] - mu) * rs, g = dy[j] * gamma[j];
        dx[j] = rs * (g - mg - xh * mgx);
    }
}

/* ---- GELU, tanh approximation: x · σ(2u), u = sqrt(2/π)(x + 0.044715 x³), through
 * e = exp(−|2u|) as the CPU kernel (no overflow, no cancellation for x ≪ 0) ---- */

#define TFC_GELU_BETA 0.7978845608028654f
#define TFC_GELU_KAPPA 0.044715f

TFC_HD float tfc_gelu(float x)
{
    const float z = 2.0f * TFC_GELU_BETA * (x + TFC_GELU_KAPPA * (x * x * x));
    const float e = expf(-fabsf(z));
#if TFC_PLANTED == 3
    return x * ((z >= 0.0f ? 1.0f : e) / (1.0f + 0.99f * e));
#endif
    return x * ((z >= 0.0f ? 1.0f : e) / (1.0f + e));
}

TFC_HD float tfc_gelu_grad(float dout, float x)
{
    const float x_sq = x * x;
    const float z = 2.0f * TFC_GELU_BETA * (x + TFC_GELU_KAPPA * (x_sq * x));
    const float e = expf(-fabsf(z)), r = 1.0f / (1.0f + e);
    const float s = (z >= 0.0f ? 1.0f : e) * r, s_1ms = e * r * r;
    const float du = TFC_GELU_BETA * (1.0f + 3.0f * TFC_GELU_KAPPA * x_sq);
#if TFC_PLANTED == 4
    return dout * (s + x * s_1ms * du);
#endif
    return dout * (s + 2.0f * x * s_1ms * du);
}

/* ---- token + position embedding ---- */

/* A token id (a float of the stage input) as a row of wte holding tokens [first,
 * first + vocab): its index from 0, or −1 (outside: another shard's, or a bad id). */
TFC_HD int32_t tfc_token_row(float id, int first, int vocab)
{
    return id >= (float)first && id < (float)first + (float)vocab ? (int32_t)id - first : -1;
}

/* Element (r, j) of the output: wte's row of the token plus wpe's of the position, where
 * each is present. bad_nan (the whole embedding): a token outside the table gives NaN, as
 * kernel_embedding_forward_cpu; a shard instead leaves another rank's token out (0). */
TFC_HD float tfc_embed(const int32_t *tok, const float *wte, const float *wpe, size_t r, int j,
                       int seq, int width, int bad_nan)
{
    const int32_t t = tok[r];
    if (t < 0 && bad_nan)
        return NAN;
    const float *p = wpe ? wpe + (r % (size_t)seq) * width : NULL;
#if TFC_PLANTED == 5
    p = wpe ? wpe + ((r + 1) % (size_t)seq) * width : NULL;
#endif
    if (t >= 0 && p)
        return wte[(size_t)t * width + j] + p[j];
    return t >= 0 ? wte[(size_t)t * width + j] : p ? p[j] : 0.0f;
}

/* dwpe[t, j] += Σ_b dout[b·seq + t, j], the samples in order (the CPU's order). */
TFC_HD void tfc_embed_pos_grad(float *dwpe, const float *dout, int n, int seq, int width,
                               int t, int j)
{
    float acc = dwpe[(size_t)t * width + j];
    for (int b = 0; b < n; b++)
        acc += dout[((size_t)b * seq + t) * width + j];
    dwpe[(size_t)t * width + j] = acc;
}

/* dwte_row[j] += Σ dout[rows[k], j] over the rows of one token, in the order given (the
 * kernel gives them in row order, the CPU's). */
TFC_HD void tfc_embed_tok_grad(float *dwte_row, const float *dout, const int32_t *rows,
                               int count, int width, int j)
{
    float acc = dwte_row[j];
    for (int k = 0; k < count; k++)
        acc += dout[(size_t)rows[k] * width + j];
#if TFC_PLANTED == 6
    if (count > 1) acc -= dout[(size_t)rows[0] * width + j];
#endif
    dwte_row[j] = acc;
}

/* ---- fused causal attention, one thread per (sample, head, row) ----
 * Views as kernel_attention_dims: q, k, v of token r at qkv + r·ld (+ C, + 2C), head h's
 * columns h·D ..; y and dy rows C apart. The forward keeps, per (b, h, i), the row's
 * logsumexp lse = m + log Σ_j exp(s_ij − m) of the scaled scores s_ij = scale · q_i·k_j,
 * never the scores themselves; the backward recomputes P_ij = exp(s_ij − lse_i). */

typedef struct {
    int T, D, H, ld, C;
    float scale;
} tfc_attn;

TFC_HD tfc_attn tfc_attn_of(const kernel_attention_dims *d)
{
    tfc_attn a;
    a.T = d->seq;
    a.D = d->head_dim;
    a.H = d->heads;
    a.ld = d->qkv_stride;
    a.C = d->heads * d->head_dim;
    a.scale = (float)(1.0 / sqrt((double)d->head_dim));
    return a;
}

TFC_HD float tfc_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int k = 0; k < n; k++)
        s += a[k] * b[k];
    return s;
}

/* Row i of head h of sample b: y_i = Σ_j softmax_j(s_ij) v_j over j ≤ i, with an online
 * softmax (running maximum m, sum l, output o rescaled when m grows); lse[(b·H + h)·T + i]. */
TFC_HD void tfc_attn_forward_row(float *y, float *lse, const float *qkv, tfc_attn a, int b,
                                 int h, int i)
{
    const size_t base = (size_t)b * a.T;
    const float *q = qkv + (base + i) * a.ld + (size_t)h * a.D;
    float o[TFC_MAX_HEAD_DIM];
    for (int k = 0; k < a.D; k++)
        o[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= i; j++) {
        const float *kj = qkv + (base + j) * a.ld + a.C + (size_t)h * a.D;
        const float *vj = kj + a.C;
        const float s = a.scale * tfc_dot(q, kj, a.D);
        if (s > m) { /* rescale what was summed against the old maximum */
            const float c = expf(m - s); /* m = −∞ at first: 0 */
            l *= c;
            for (int k = 0; k < a.D; k++)
                o[k] *= c;
            m = s;
        }
        const float p = expf(s - m);
        l += p;
        for (int k = 0; k < a.D; k++)
            o[k] += p * vj[k];
    }
    float *yi = y + (base + i) * a.C + (size_t)h * a.D;
    const float inv = 1.0f / l;
    for (int k = 0; k < a.D; k++)
        yi[k] = o[k] * inv;
#if TFC_PLANTED == 7
    if (i > 0) yi[0] = o[0];
#endif
    lse[((size_t)b * a.H + h) * a.T + i] = m + logf(l);
}

/* P_ij of the forward, from the saved logsumexp. */
TFC_HD float tfc_attn_p(const float *q, const float *kj, float lse_i, tfc_attn a)
{
    return expf(a.scale * tfc_dot(q, kj, a.D) - lse_i);
}

/* Δ_i = Σ_{j ≤ i} P_ij (dO_i · v_j) = rowsum(P ∘ dP), which the softmax backward subtracts
 * (= dO_i · O_i without needing the forward's output). */
TFC_HD float tfc_attn_delta(const float *dy, const float *qkv, const float *lse, tfc_attn a,
                            int b, int h, int i)
{
    const size_t base = (size_t)b * a.T;
    const float *q = qkv + (base + i) * a.ld + (size_t)h * a.D;
    const float *g = dy + (base + i) * a.C + (size_t)h * a.D;
    const float L = lse[((size_t)b * a.H + h) * a.T + i];
    float delta = 0.0f;
    for (int j = 0; j <= i; j++) {
        const float *kj = qkv + (base + j) * a.ld + a.C + (size_t)h * a.D;
        delta += tfc_attn_p(q, kj, L, a) * tfc_dot(g, kj + a.C, a.D);
    }
    return delta;
}

/* dQ_i = scale Σ_{j ≤ i} P_ij (dO_i·v_j − Δ_i) k_j (overwritten), and Δ_i into delta[(b·H +
 * h)·T + i] when delta is given (the dK/dV kernel reads it). */
TFC_HD void tfc_attn_dq_row(float *dq, float *delta, const float *dy, const float *qkv,
                            const float *lse, tfc_attn a, int b, int h, int i)
{
    const size_t base = (size_t)b * a.T;
    const float *q = qkv + (base + i) * a.ld + (size_t)h * a.D;
    const float *g = dy + (base + i) * a.C + (size_t)h * a.D;
    const float L = lse[((size_t)b * a.H + h) * a.T + i];
    const float dl = tfc_attn_delta(dy, qkv, lse, a, b, h, i);
    float acc[TFC_MAX_HEAD_DIM];
    for (int k = 0; k < a.D; k++)
        acc[k] = 0.0f;
    for (int j = 0; j <= i; j++) {
        const float *kj = qkv + (base + j) * a.ld + a.C + (size_t)h * a.D;
        const float ds = tfc_attn_p(q, kj, L, a) * (tfc_dot(g, kj + a.C, a.D) - dl);
        for (int k = 0; k < a.D; k++)
            acc[k] += ds * kj[k];
    }
    float *o = dq + (base + i) * a.ld + (size_t)h * a.D;
    for (int k = 0; k < a.D; k++)
        o[k] = a.scale * acc[k];
    if (delta)
        delta[((size_t)b * a.H + h) * a.T + i] = dl;
}

/* Key row j: dV_j = Σ_{i ≥ j} P_ij dO_i and dK_j = scale Σ_{i ≥ j} P_ij (dO_i·v_j − Δ_i) q_i
 * (both overwritten), queries in order. delta NULL: Δ_i recomputed here (a saved area too
 * small to hold it, seq 1). */
TFC_HD void tfc_attn_dkv_row(float *dk, float *dv, const float *delta, const float *dy,
                             const float *qkv, const float *lse, tfc_attn a, int b, int h,
                             int j)
{
    const size_t base = (size_t)b * a.T;
    const float *kj = qkv + (base + j) * a.ld + a.C + (size_t)h * a.D, *vj = kj + a.C;
    float ak[TFC_MAX_HEAD_DIM], av[TFC_MAX_HEAD_DIM];
    for (int k = 0; k < a.D; k++)
        ak[k] = av[k] = 0.0f;
    for (int i = j; i < a.T; i++) {
        const float *q = qkv + (base + i) * a.ld + (size_t)h * a.D;
        const float *g = dy + (base + i) * a.C + (size_t)h * a.D;
        const size_t row = ((size_t)b * a.H + h) * a.T + i;
        const float p = tfc_attn_p(q, kj, lse[row], a);
        const float dl = delta ? delta[row] : tfc_attn_delta(dy, qkv, lse, a, b, h, i);
        const float ds = p * (tfc_dot(g, vj, a.D) - dl);
        for (int k = 0; k < a.D; k++) {
            av[k] += p * g[k];
            ak[k] += ds * q[k];
        }
    }
#if TFC_PLANTED == 8
    if (j == 0) av[0] = 0.0f;
#endif
    float *ok = dk + (base + j) * a.ld + (size_t)h * a.D;
    float *ov = dv + (base + j) * a.ld + (size_t)h * a.D;
    for (int k = 0; k < a.D; k++) {
        ok[k] = a.scale * ak[k];
        ov[k] = av[k];
    }
}

/* Where the attention keeps its logsumexp and Δ in the probs area the layer gives it
 * (batch·heads·seq² floats, kernel_attention_probs_floats): lse first, then Δ when two
 * rows fit (seq ≥ 2), else NULL. */
TFC_HD float *tfc_attn_delta_area(float *probs, const kernel_attention_dims *d)
{
    const size_t rows = (size_t)d->batch * d->heads * d->seq;
    return d->seq >= 2 ? probs + rows : NULL;
}

#endif
