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
#include "kernels/rng.h"

#define TFC_HD __host__ __device__ static inline
/* Fully unrolled on the device (the per-row arrays then stay in registers); the host
 * compiler does not know the pragma. */
#ifdef __CUDA_ARCH__
#define TFC_UNROLL _Pragma("unroll")
#else
#define TFC_UNROLL
#endif

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

/* Row statistics as kernel_layernorm_forward_cpu: two passes in double over 16 lanes, lane l
 * adding the elements l, l + 16, ... in order, the lanes added in tfc_lanes_total's tree.
 * The kernel gives each lane a thread (16 to a row, the tree through warp shuffles), so
 * the loads coalesce; the sums, and so the bits, are those of the CPU. */
TFC_HD double tfc_ln_lane_sum(const float *xr, int width, int lane)
{
    double s = 0.0;
    for (int i = lane; i < width; i += TFC_LANES)
        s += (double)xr[i];
    return s;
}

TFC_HD double tfc_ln_lane_sq(const float *xr, int width, int lane, double mu)
{
    double s = 0.0;
    for (int i = lane; i < width; i += TFC_LANES) {
        const double d = (double)xr[i] - mu;
        s += d * d;
    }
    return s;
}

TFC_HD void tfc_ln_stats_of(double mu, double var, float *mean, float *rstd)
{
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(var + KERNEL_LAYERNORM_EPS));
#if TFC_PLANTED == 1
    *rstd = (float)(1.0 / sqrt(var + 1e-2));
#endif
}

/* One row, all lanes in one thread (the host test's reference of the kernel). */
TFC_HD void tfc_ln_stats(const float *xr, int width, float *mean, float *rstd)
{
    double acc[TFC_LANES];
    for (int l = 0; l < TFC_LANES; l++)
        acc[l] = tfc_ln_lane_sum(xr, width, l);
    const double mu = tfc_lanes_total(acc) / width;
    for (int l = 0; l < TFC_LANES; l++)
        acc[l] = tfc_ln_lane_sq(xr, width, l, mu);
    tfc_ln_stats_of(mu, tfc_lanes_total(acc) / width, mean, rstd);
}

/* One element of the normalised output, from the saved float statistics. */
TFC_HD float tfc_ln_out(float x, float mean, float rstd, float gamma, float beta)
{
    return (x - mean) * rstd * gamma + beta;
}

/* dgamma and dbeta: the rows in TFC_LN_GROUPS chunks of ⌈rows / groups⌉, each chunk's rows
 * added in order by one thread (tfc_ln_param_part), then the chunks' sums added in order to
 * what the column held (tfc_ln_param_col). A thread per column adding all rows left most of
 * the GPU idle (768 threads for GPT-2). */
enum { TFC_LN_GROUPS = 32 };

TFC_HD void tfc_ln_param_part(float *g, float *b, const float *dy, const float *x,
                              const float *mean, const float *rstd, int rows, int width, int j,
                              int group)
{
    const int per = (rows + TFC_LN_GROUPS - 1) / TFC_LN_GROUPS;
    const int r0 = group * per, r1 = r0 + per < rows ? r0 + per : rows;
    float sg = 0.0f, sb = 0.0f;
    for (int r = r0; r < r1; r++) {
        const size_t at = (size_t)r * width + j;
        sg += dy[at] * ((x[at] - mean[r]) * rstd[r]);
        sb += dy[at];
    }
    *g = sg;
    *b = sb;
}

/* Column j from its groups' sums pg[k], pb[k] (k = 0 .. TFC_LN_GROUPS − 1, stride apart);
 * either output may be NULL. */
TFC_HD void tfc_ln_param_add(float *dgamma, float *dbeta, const float *pg, const float *pb,
                             int stride, int j)
{
    float g = dgamma ? dgamma[j] : 0.0f, b = dbeta ? dbeta[j] : 0.0f;
    for (int k = 0; k < TFC_LN_GROUPS; k++) {
        g += pg[k * stride];
        b += pb[k * stride];
    }
#if TFC_PLANTED == 2
    g *= 1.001f;
#endif
    if (dgamma)
        dgamma[j] = g;
    if (dbeta)
        dbeta[j] = b;
}

/* Column j of dgamma and dbeta in one thread (the host test's reference of the kernel). */
TFC_HD void tfc_ln_param_col(float *dgamma, float *dbeta, const float *dy, const float *x,
                             const float *mean, const float *rstd, int rows, int width, int j)
{
    float pg[TFC_LN_GROUPS], pb[TFC_LN_GROUPS];
    for (int k = 0; k < TFC_LN_GROUPS; k++)
        tfc_ln_param_part(&pg[k], &pb[k], dy, x, mean, rstd, rows, width, j, k);
    tfc_ln_param_add(dgamma, dbeta, pg, pb, 1, j);
}

/* dx = rstd · (g − mean(g) − x̂ · mean(g · x̂)), g = dy · gamma, per row: the two means over
 * 16 lanes in double as the statistics (lane l: elements l, l + 16, ...), then each element.
 * dx may alias dy: every element is read, then written, by its lane's thread only. */
TFC_HD void tfc_ln_dx_lane(double *sg, double *sgx, const float *dy, const float *xr, float mu,
                           float rs, const float *gamma, int width, int lane)
{
    double ag = 0.0, agx = 0.0;
    for (int j = lane; j < width; j += TFC_LANES) {
        const float xh = (xr[j] - mu) * rs, g = dy[j] * gamma[j];
        ag += g;
        agx += (double)g * xh;
    }
    *sg = ag;
    *sgx = agx;
}

TFC_HD float tfc_ln_dx_elem(float dy, float x, float gamma, float mu, float rs, float mg,
                            float mgx)
{
    const float xh = (x - mu) * rs, g = dy * gamma;
    return rs * (g - mg - xh * mgx);
}

/* One row in one thread (the host test's reference of the kernel). */
TFC_HD void tfc_ln_dx_row(float *dx, const float *dy, const float *xr, float mu, float rs,
                          const float *gamma, int width)
{
    double acc_g[TFC_LANES], acc_gx[TFC_LANES];
    for (int l = 0; l < TFC_LANES; l++)
        tfc_ln_dx_lane(&acc_g[l], &acc_gx[l], dy, xr, mu, rs, gamma, width, l);
    const float mg = (float)(tfc_lanes_total(acc_g) / width);
    const float mgx = (float)(tfc_lanes_total(acc_gx) / width);
    for (int j = 0; j < width; j++)
        dx[j] = tfc_ln_dx_elem(dy[j], xr[j], gamma[j], mu, rs, mg, mgx);
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

/* ---- attention dropout (kernel_attention_dropout): the counter RNG of kernels/rng.h ----
 * Element e of a sample's whole numbering (e = elem_off + (h·T + i)·T + j) is kept when
 * uniform(seed, stream, (id << 32) | e) < 1 − p: lane e % 4 of Philox block ((id << 32) | e)
 * / 4, rng_u32_to_unit's 24 bits (kernel_dropout_forward_range_cpu's numbers). The Philox
 * rounds are rng_philox4x32_10's (kernels/rng.h, compiled for both sides). */

/* The dropout of one attention call as the kernels take it (by value): mask NULL, none. */
typedef struct {
    float keep, scale; /* 1 − p, 1 / (1 − p) */
    uint64_t seed, stream;
    size_t elem_off;   /* the call's head 0 in the sample's whole numbering */
    const int64_t *ids; /* [batch], device */
    uint8_t *mask;     /* [batch·heads·T²] laid out as the probabilities */
} tfc_drop;

/* Row i of (b, h)'s mask (keys j at [j]), or NULL without dropout. */
TFC_HD uint8_t *tfc_drop_row(const tfc_drop &dr, int T, int H, int b, int h, int i)
{
    return dr.mask ? dr.mask + (((size_t)b * H + h) * T + i) * (size_t)T : NULL;
}

/* The forward's mask of query row i (keys 0 .. i) of head h in sample b into mrow: one
 * Philox block per four consecutive elements (the row's elements are consecutive in e). */
TFC_HD void tfc_drop_make_row(uint8_t *mrow, const tfc_drop &dr, int T, int b, int h, int i)
{
    const size_t e0 = dr.elem_off + ((size_t)h * T + i) * (size_t)T;
    const uint64_t base = (uint64_t)dr.ids[b] << 32;
    uint32_t w[4] = {0, 0, 0, 0};
    uint64_t have = ~(uint64_t)0;
    for (int j = 0; j <= i; j++) {
        const uint64_t c = base | (uint64_t)(e0 + j);
#if TFC_PLANTED == 9
        const uint64_t blk = (c + 1) >> 2;
#else
        const uint64_t blk = c >> 2;
#endif
        if (blk != have) {
            rng_philox4x32_10(w, dr.seed, dr.stream, blk);
            have = blk;
        }
        const float u = rng_u32_to_unit(w[c & 3]);
        mrow[j] = u < dr.keep ? 1 : 0;
    }
}

/* The factor element `at` of a mask gives a probability: 1/(1 − p) kept, 0 dropped, 1
 * without dropout (exact: the products without dropout keep their bits). */
TFC_HD float tfc_drop_f(const uint8_t *m, size_t at, float scale)
{
    return m ? (m[at] ? scale : 0.0f) : 1.0f;
}

/* ---- fused causal attention ----
 * Views as kernel_attention_dims: q, k, v of token r at qkv + r·ld (+ C, + 2C), head h's
 * columns h·D ..; y and dy rows C apart. The forward keeps, per (b, h, i), the row's
 * logsumexp lse = m + log Σ_j exp(s_ij − m) of the scaled scores s_ij = scale · q_i·k_j,
 * never the scores themselves; the backward recomputes P_ij = exp(s_ij − lse_i).
 *
 * Tiled: a block of TFC_ATT_ROWS threads owns as many consecutive rows of one (sample,
 * head), one row a thread (queries in the forward and dQ, keys in dK and dV), held in
 * registers; the other side's rows pass through shared memory in tiles of
 * tfc_att_tile_rows<MAXD> rows, zero-padded to MAXD columns. MAXD, the compile-time bound
 * on D (16, 32, 64 or 128), keeps the per-row arrays in registers (a runtime bound puts
 * them in local memory; the first kernels, written so, ran ~17× slower than PyTorch on
 * GPT-2 shapes).
 * The padding adds exact zeros, so every sum has the value of the sum over D, taken in the
 * order of j (or i) as the one-row-per-thread formulation did. The host test runs these
 * functions block by block and tile by tile, as the kernels do (staging, then each thread). */

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

enum { TFC_ATT_ROWS = 64 };

/* Rows of a staged tile: two tiles of MAXD floats a row in 32 KB of shared memory. */
template <int MAXD> TFC_HD constexpr int tfc_att_tile_rows()
{
    return MAXD <= 64 ? 64 : 4096 / MAXD;
}

TFC_HD float tfc_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int k = 0; k < n; k++)
        s += a[k] * b[k];
    return s;
}

/* Σ_k a[k]·t[k] over MAXD columns, t a staged row (16-byte aligned: read 4 at a time). */
template <int MAXD> TFC_HD float tfc_att_dot(const float *a, const float *t)
{
    float s = 0.0f;
    TFC_UNROLL
    for (int k = 0; k < MAXD; k += 4) {
        const float4 v = *(const float4 *)(t + k);
        s += a[k] * v.x;
        s += a[k + 1] * v.y;
        s += a[k + 2] * v.z;
        s += a[k + 3] * v.w;
    }
    return s;
}

/* acc[k] += f · t[k] over MAXD columns. */
template <int MAXD> TFC_HD void tfc_att_axpy(float *acc, float f, const float *t)
{
    TFC_UNROLL
    for (int k = 0; k < MAXD; k += 4) {
        const float4 v = *(const float4 *)(t + k);
        acc[k] += f * v.x;
        acc[k + 1] += f * v.y;
        acc[k + 2] += f * v.z;
        acc[k + 3] += f * v.w;
    }
}

/* A row of D values into MAXD registers, zero beyond D. */
template <int MAXD> TFC_HD void tfc_att_load(float *r, const float *src, int D)
{
    TFC_UNROLL
    for (int k = 0; k < MAXD; k++)
        r[k] = k < D ? src[k] : 0.0f;
}

/* Of the n staged rows from j0, how many are keys j ≤ i (causal). */
TFC_HD int tfc_att_upto(int i, int j0, int n)
{
    return i - j0 + 1 < n ? i - j0 + 1 : n;
}

/* Element e of a staged tile: column e % MAXD of row r0 + e / MAXD of the view src (rows ld
 * apart), zero past n rows or D columns. A block's threads stage e = thread, thread + rows, ... */
template <int MAXD>
TFC_HD void tfc_att_stage(float *tile, const float *src, size_t ld, int r0, int n, int D, int e)
{
    const int r = e / MAXD, c = e % MAXD;
    tile[e] = r < n && c < D ? src[(size_t)(r0 + r) * ld + c] : 0.0f;
}

/* The view of part (0 q, 1 k, 2 v) of head h in sample b: row t at + t·ld. */
TFC_HD const float *tfc_att_view(const float *qkv, tfc_attn a, int b, int h, int part)
{
    return qkv + (size_t)b * a.T * a.ld + (size_t)part * a.C + (size_t)h * a.D;
}

/* -- forward: query row i; y_i = Σ_{j ≤ i} softmax_j(s_ij) v_j with an online softmax (running
 * maximum m, sum l, output o rescaled when m grows). */
template <int MAXD> struct tfc_att_fwd {
    float q[MAXD], o[MAXD], m, l;
};

template <int MAXD> TFC_HD void tfc_att_fwd_begin(tfc_att_fwd<MAXD> &s, const float *q, int D)
{
    tfc_att_load<MAXD>(s.q, q, D);
    TFC_UNROLL
    for (int k = 0; k < MAXD; k++)
        s.o[k] = 0.0f;
    s.m = -INFINITY;
    s.l = 0.0f;
}

/* Keys j0 .. j0 + n − 1, staged in K and V, those ≤ i. */
template <int MAXD>
TFC_HD void tfc_att_fwd_tile(tfc_att_fwd<MAXD> &s, const float *K, const float *V, int j0,
                             int n, int i, float scale, const uint8_t *mrow = NULL,
                             float dscale = 1.0f)
{
    const int last = tfc_att_upto(i, j0, n);
    for (int jj = 0; jj < last; jj++) {
        const float sc = scale * tfc_att_dot<MAXD>(s.q, K + jj * MAXD);
        if (sc > s.m) { /* rescale what was summed against the old maximum */
            const float c = expf(s.m - sc); /* m = −∞ at first: 0 */
            s.l *= c;
    TFC_UNROLL
            for (int k = 0; k < MAXD; k++)
                s.o[k] *= c;
            s.m = sc;
        }
        const float p = expf(sc - s.m);
        s.l += p; /* the softmax's sum is of the probabilities before the dropout */
        tfc_att_axpy<MAXD>(s.o, p * tfc_drop_f(mrow, (size_t)(j0 + jj), dscale), V + jj * MAXD);
    }
}

template <int MAXD>
TFC_HD void tfc_att_fwd_end(const tfc_att_fwd<MAXD> &s, float *yi, float *lse_i, int D, int i)
{
    const float inv = 1.0f / s.l;
    TFC_UNROLL
    for (int k = 0; k < MAXD; k++) /* constant indices: the arrays stay in registers */
        if (k < D)
            yi[k] = s.o[k] * inv;
#if TFC_PLANTED == 7
    if (i > 0) yi[0] = s.o[0];
#endif
    (void)i;
    *lse_i = s.m + logf(s.l);
}

/* P_ij of the forward, from the saved logsumexp (global rows: seq 1's Δ below). */
TFC_HD float tfc_attn_p(const float *q, const float *kj, float lse_i, tfc_attn a)
{
    return expf(a.scale * tfc_dot(q, kj, a.D) - lse_i);
}

/* Δ_i = Σ_{j ≤ i} P_ij (dO_i · v_j) = rowsum(P ∘ dP), which the softmax backward subtracts
 * (= dO_i · O_i without needing the forward's output), from global rows: for seq 1, whose
 * saved area cannot hold Δ. */
TFC_HD float tfc_attn_delta(const float *dy, const float *qkv, const float *lse, tfc_attn a,
                            int b, int h, int i, const uint8_t *mrow = NULL,
                            float dscale = 1.0f)
{
    const size_t base = (size_t)b * a.T;
    const float *q = qkv + (base + i) * a.ld + (size_t)h * a.D;
    const float *g = dy + (base + i) * a.C + (size_t)h * a.D;
    const float L = lse[((size_t)b * a.H + h) * a.T + i];
    float delta = 0.0f;
    for (int j = 0; j <= i; j++) {
        const float *kj = qkv + (base + j) * a.ld + a.C + (size_t)h * a.D;
        delta += tfc_attn_p(q, kj, L, a) *
                 (tfc_drop_f(mrow, (size_t)j, dscale) * tfc_dot(g, kj + a.C, a.D));
    }
    return delta;
}

/* -- dQ, query row i, in two passes over the keys j ≤ i: Δ_i first, then
 * dQ_i = scale Σ_j P_ij (dO_i·v_j − Δ_i) k_j (overwritten); Δ_i kept for dK. */
template <int MAXD> struct tfc_att_dq {
    float q[MAXD], g[MAXD], acc[MAXD], L, dl;
};

template <int MAXD>
TFC_HD void tfc_att_dq_begin(tfc_att_dq<MAXD> &s, const float *q, const float *g, float L,
                             int D)
{
    tfc_att_load<MAXD>(s.q, q, D);
    tfc_att_load<MAXD>(s.g, g, D);
    TFC_UNROLL
    for (int k = 0; k < MAXD; k++)
        s.acc[k] = 0.0f;
    s.L = L;
    s.dl = 0.0f;
}

/* With dropout (mrow: query row i's mask) dP_ij = f_ij (dO_i·v_j), f the mask's factor, and
 * Δ_i = Σ_j P_ij dP_ij. */
template <int MAXD>
TFC_HD void tfc_att_dq_delta_tile(tfc_att_dq<MAXD> &s, const float *K, const float *V, int j0,
                                  int n, int i, float scale, const uint8_t *mrow = NULL,
                                  float dscale = 1.0f)
{
    const int last = tfc_att_upto(i, j0, n);
    for (int jj = 0; jj < last; jj++) {
        const float p = expf(scale * tfc_att_dot<MAXD>(s.q, K + jj * MAXD) - s.L);
        s.dl += p * (tfc_drop_f(mrow, (size_t)(j0 + jj), dscale) *
                     tfc_att_dot<MAXD>(s.g, V + jj * MAXD));
    }
}

template <int MAXD>
TFC_HD void tfc_att_dq_tile(tfc_att_dq<MAXD> &s, const float *K, const float *V, int j0, int n,
                            int i, float scale, const uint8_t *mrow = NULL, float dscale = 1.0f)
{
    const int last = tfc_att_upto(i, j0, n);
    for (int jj = 0; jj < last; jj++) {
        const float *kj = K + jj * MAXD;
        const float p = expf(scale * tfc_att_dot<MAXD>(s.q, kj) - s.L);
        const float ds = p * (tfc_drop_f(mrow, (size_t)(j0 + jj), dscale) *
                                  tfc_att_dot<MAXD>(s.g, V + jj * MAXD) -
                              s.dl);
        tfc_att_axpy<MAXD>(s.acc, ds, kj);
    }
}

template <int MAXD>
TFC_HD void tfc_att_dq_end(const tfc_att_dq<MAXD> &s, float *dqi, float *delta_i, int D,
                           float scale)
{
    TFC_UNROLL
    for (int k = 0; k < MAXD; k++)
        if (k < D)
            dqi[k] = scale * s.acc[k];
    if (delta_i)
        *delta_i = s.dl;
}

/* -- dK and dV, key row j, over the queries i ≥ j in order: dV_j = Σ_i P_ij dO_i and
 * dK_j = scale Σ_i P_ij (dO_i·v_j − Δ_i) q_i (overwritten). Two kernels (the dV one without
 * v_j and dK's accumulator): a thread holding k, v and both sums would not fit its
 * registers at D = 64. Staged per query tile: Q, dO, lse and Δ. */
template <int MAXD, bool DK> struct tfc_att_dkv {
    float k[MAXD], v[DK ? MAXD : 1], acc[MAXD];
};

template <int MAXD, bool DK>
TFC_HD void tfc_att_dkv_begin(tfc_att_dkv<MAXD, DK> &s, const float *kj, const float *vj,
                              int D)
{
    tfc_att_load<MAXD>(s.k, kj, D);
    if (DK)
        tfc_att_load<MAXD>(s.v, vj, D);
    TFC_UNROLL
    for (int k = 0; k < MAXD; k++)
        s.acc[k] = 0.0f;
}

/* Queries i0 .. i0 + n − 1, staged (Q, G = dO, their lse L and Δ dl), those ≥ j. */
/* With dropout, mcol: key j's column of the mask (query i at [i·T]). */
template <int MAXD, bool DK>
TFC_HD void tfc_att_dkv_tile(tfc_att_dkv<MAXD, DK> &s, const float *Q, const float *G,
                             const float *L, const float *dl, int i0, int n, int j, float scale,
                             const uint8_t *mcol = NULL, int T = 0, float dscale = 1.0f)
{
    for (int ii = j > i0 ? j - i0 : 0; ii < n; ii++) {
        const float p = expf(scale * tfc_att_dot<MAXD>(s.k, Q + ii * MAXD) - L[ii]);
        const float f = tfc_drop_f(mcol, (size_t)(i0 + ii) * T, dscale);
        if (DK) {
#if TFC_PLANTED == 10
            const float ds = p * (tfc_att_dot<MAXD>(s.v, G + ii * MAXD) - dl[ii]);
#else
            const float ds = p * (f * tfc_att_dot<MAXD>(s.v, G + ii * MAXD) - dl[ii]);
#endif
            tfc_att_axpy<MAXD>(s.acc, ds, Q + ii * MAXD);
        } else {
            tfc_att_axpy<MAXD>(s.acc, p * f, G + ii * MAXD);
        }
    }
}

template <int MAXD, bool DK>
TFC_HD void tfc_att_dkv_end(const tfc_att_dkv<MAXD, DK> &s, float *out_j, int D, float scale,
                            int j)
{
    TFC_UNROLL
    for (int k = 0; k < MAXD; k++)
        if (k < D)
            out_j[k] = DK ? scale * s.acc[k] : s.acc[k];
#if TFC_PLANTED == 8
    if (!DK && j == 0) out_j[0] = 0.0f;
#endif
    (void)j;
}

/* Where the attention keeps its logsumexp and Δ in the probs area the layer gives it
 * (batch·heads·seq² floats, kernel_attention_probs_floats): lse first, then Δ when two
 * rows fit (seq ≥ 2), else NULL. */
TFC_HD float *tfc_attn_delta_area(float *probs, const kernel_attention_dims *d)
{
    const size_t rows = (size_t)d->batch * d->heads * d->seq;
    return d->seq >= 2 ? probs + rows : NULL;
}

/* ---- the vocabulary-parallel cross-entropy (Megatron's; src/cpu/stage_loss.c's
 * sharded_loss, step by step) ----
 * Each of the T ranks of a tensor group holds columns [first, first + Vr) of every row of
 * the logits. Three per-row steps, with an all-gather of each one's output between them:
 *   1. tfc_xs_max: the row's largest logit and its first index (as a float, exact below
 *      2^24) on this rank;
 *   2. tfc_xs_sums: from every rank's (rank order; a later rank's wins only when larger, so
 *      the whole row's first argmax) the row's maximum M and argmax A, then this rank's
 *      Σ exp(x − M) in double (columns in order, each exp kept in dlogits), sent as two
 *      floats (the value and its rounding residual), and the target's logit (0 on the
 *      ranks that do not hold it);
 *   3. tfc_xs_finish: every rank's sums added in rank order in double, the row's loss
 *      log Σ − (target − M) (NaN for a label outside [0, V)), whether A is the label, and
 *      this rank's columns of the gradient (e/Σ − [label]) · grad_scale.
 * One thread a row; the rows' losses are then added in row order. EXPF: the exponential
 * (expf on the device; the CPU's fastmath_expf in the mock's twin). */
TFC_HD void tfc_xs_max(float *mine, const float *x, int Vr, int first)
{
    int best = 0;
    for (int j = 1; j < Vr; j++)
        if (x[j] > x[best])
            best = j;
    mine[0] = x[best];
    mine[1] = (float)(first + best);
}

/* all: T blocks of 2R floats (step 1's of every rank); row i; M and A out. */
TFC_HD void tfc_xs_argmax(float *M, float *A, const float *all, size_t R, size_t i, int T)
{
    float m = all[2 * i], a = all[2 * i + 1];
    for (int r = 1; r < T; r++)
#if TFC_PLANTED == 12
        if (all[(size_t)r * 2 * R + 2 * i] >= m) {
#else
        if (all[(size_t)r * 2 * R + 2 * i] > m) {
#endif
            m = all[(size_t)r * 2 * R + 2 * i];
            a = all[(size_t)r * 2 * R + 2 * i + 1];
        }
    *M = m;
    *A = a;
}

TFC_HD void tfc_xs_sums(float *mine, float *d, const float *x, int Vr, int first, float M,
                        int32_t label)
{
    /* the target's logit before d is written: d may be the logits' own storage */
    const int32_t k = label - first;
    mine[2] = k >= 0 && k < Vr ? x[k] : 0.0f;
    double sum = 0.0;
    for (int j = 0; j < Vr; j++) {
        const float e = expf(x[j] - M);
        if (d)
            d[j] = e;
        sum += e;
    }
#if TFC_PLANTED == 11
    sum *= 1.001;
#endif
    mine[0] = (float)sum;
    mine[1] = (float)(sum - (double)(float)sum);
}

/* all: T blocks of 3R floats (step 2's); d: this rank's row of exponentials (NULL: no
 * gradient), overwritten by the gradient. Returns the row's loss; *right 1 when A is the
 * label. */
TFC_HD double tfc_xs_finish(float *d, int *right, const float *all, size_t R, size_t i, int T,
                            float M, float A, int32_t label, int first, int Vr, int V,
                            float grad_scale)
{
    double sum = 0.0, target = 0.0;
    for (int r = 0; r < T; r++) {
        const float *q = all + (size_t)r * 3 * R + 3 * i;
        sum += (double)q[0] + (double)q[1];
        target += (double)q[2];
    }
    *right = (float)label == A;
    if (d) {
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < Vr; j++)
            d[j] = (d[j] * inv - (first + j == label ? 1.0f : 0.0f)) * grad_scale;
    }
    if (label < 0 || label >= V)
        return NAN;
    return log(sum) - (target - (double)M);
}

#endif
