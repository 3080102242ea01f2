/* CUDA kernels of the transformer layers (kernels_cuda.h: layer norm, GELU, token +
 * position embedding and its vocabulary shards, the fused causal attention). Each kernel
 * is a loop over its threads' items calling the per-thread functions of
 * kernels/cuda/transformer_math.cuh, which tests/cuda/test_transformer_host.cu runs on the
 * host against the CPU twins. Correctness first: one thread per row or column where a
 * fixed summation order is wanted (no floating-point atomics anywhere, so every run gives
 * the same bits); the attention never writes the T×T scores (an online softmax forward,
 * logsumexp saved; a backward that recomputes the probabilities), tiled through shared
 * memory with each thread's row in registers. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/transformer_math.cuh"

/* ---- layer norm ---- */

/* 16 threads a row (one a lane of transformer_math.cuh's statistics), 8 rows a block. */
enum { LN_THREADS = 128, LN_ROWS = LN_THREADS / TFC_LANES };

/* tfc_lanes_total's tree over the 16 lanes of a row, through shuffles: lane j adds lane
 * j + w for w = 8, 4, 2, 1 (the additions of the host tree); every lane gets the total. */
__device__ static double ln_lanes_total(double s)
{
    for (int w = TFC_LANES / 2; w > 0; w /= 2)
        s += __shfl_down_sync(0xffffffffu, s, w, TFC_LANES);
    return __shfl_sync(0xffffffffu, s, 0, TFC_LANES);
}

__global__ static void __launch_bounds__(LN_THREADS)
    ln_stats(float *mean, float *rstd, const float *x, int rows, int width)
{
    const int lane = threadIdx.x % TFC_LANES;
    const size_t r = (size_t)blockIdx.x * LN_ROWS + threadIdx.x / TFC_LANES;
    const bool on = r < (size_t)rows; /* every lane takes part in the shuffles */
    const float *xr = x + (on ? r : 0) * width;
    const double mu = ln_lanes_total(tfc_ln_lane_sum(xr, width, lane)) / width;
    const double var = ln_lanes_total(tfc_ln_lane_sq(xr, width, lane, mu)) / width;
    if (on && lane == 0)
        tfc_ln_stats_of(mu, var, mean + r, rstd + r);
}

__global__ static void ln_out(float *out, const float *mean, const float *rstd, const float *x,
                              const float *gamma, const float *beta, int width, size_t count)
{
    CUDA_GRID_STRIDE(i, count)
    {
        const size_t r = i / width;
        const int j = (int)(i % width);
        out[i] = tfc_ln_out(x[i], mean[r], rstd[r], gamma[j], beta[j]);
    }
}

/* Block (32 columns) × (TFC_LN_GROUPS row chunks): each thread one chunk of one column, the
 * chunks added in order by the first row of threads. */
__global__ static void __launch_bounds__(32 * TFC_LN_GROUPS)
    ln_params(float *dgamma, float *dbeta, const float *dy, const float *x, const float *mean,
              const float *rstd, int rows, int width)
{
    __shared__ float pg[TFC_LN_GROUPS][32], pb[TFC_LN_GROUPS][32];
    const int j = blockIdx.x * 32 + threadIdx.x, k = threadIdx.y;
    if (j < width)
        tfc_ln_param_part(&pg[k][threadIdx.x], &pb[k][threadIdx.x], dy, x, mean, rstd, rows,
                          width, j, k);
    __syncthreads();
    if (k == 0 && j < width)
        tfc_ln_param_add(dgamma, dbeta, &pg[0][threadIdx.x], &pb[0][threadIdx.x], 32, j);
}

__global__ static void __launch_bounds__(LN_THREADS)
    ln_dx(float *dx, const float *dy, const float *x, const float *mean, const float *rstd,
          const float *gamma, int rows, int width)
{
    const int lane = threadIdx.x % TFC_LANES;
    const size_t r = (size_t)blockIdx.x * LN_ROWS + threadIdx.x / TFC_LANES;
    const bool on = r < (size_t)rows;
    const size_t at = (on ? r : 0) * width;
    const float mu = mean[on ? r : 0], rs = rstd[on ? r : 0];
    double sg, sgx;
    tfc_ln_dx_lane(&sg, &sgx, dy + at, x + at, mu, rs, gamma, width, lane);
    const float mg = (float)(ln_lanes_total(sg) / width);
    const float mgx = (float)(ln_lanes_total(sgx) / width);
    if (on)
        for (int j = lane; j < width; j += TFC_LANES)
            dx[at + j] = tfc_ln_dx_elem(dy[at + j], x[at + j], gamma[j], mu, rs, mg, mgx);
}

extern "C" int kernel_layernorm_forward_cuda(float *out, float *mean, float *rstd,
                                             const float *x, const float *gamma,
                                             const float *beta, int rows, int width,
                                             const kernel_cuda_ctx *ctx)
{
    if (rows < 0 || width < 1)
        return pt_error_set("layernorm: invalid sizes rows=%d width=%d", rows, width);
    if (rows == 0)
        return 0;
    const unsigned blocks = (unsigned)(((size_t)rows + LN_ROWS - 1) / LN_ROWS);
    ln_stats<<<blocks, LN_THREADS, 0, ctx->stream>>>(mean, rstd, x, rows, width);
    CUDA_CHECK_LAUNCH("ln_stats");
    const size_t count = (size_t)rows * width;
    ln_out<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(out, mean, rstd, x, gamma, beta,
                                                               width, count);
    CUDA_CHECK_LAUNCH("ln_out");
    return 0;
}

extern "C" int kernel_layernorm_backward_cuda(float *dx, float *dgamma, float *dbeta,
                                              const float *dy, const float *x,
                                              const float *mean, const float *rstd,
                                              const float *gamma, int rows, int width,
                                              const kernel_cuda_ctx *ctx)
{
    if (rows < 0 || width < 1)
        return pt_error_set("layernorm backward: invalid sizes rows=%d width=%d", rows, width);
    if (rows == 0)
        return 0;
    /* The parameter gradients first, on the same stream: dx may overwrite dy. */
    if (dgamma || dbeta) {
        ln_params<<<(unsigned)((width + 31) / 32), dim3(32, TFC_LN_GROUPS), 0, ctx->stream>>>(
            dgamma, dbeta, dy, x, mean, rstd, rows, width);
        CUDA_CHECK_LAUNCH("ln_params");
    }
    if (dx) {
        const unsigned blocks = (unsigned)(((size_t)rows + LN_ROWS - 1) / LN_ROWS);
        ln_dx<<<blocks, LN_THREADS, 0, ctx->stream>>>(dx, dy, x, mean, rstd, gamma, rows, width);
        CUDA_CHECK_LAUNCH("ln_dx");
    }
    return 0;
}

/* ---- GELU ---- */

__global__ static void gelu_f(float *out, const float *in, size_t count)
{
    CUDA_GRID_STRIDE(i, count)
    out[i] = tfc_gelu(in[i]);
}

__global__ static void gelu_b(float *din, const float *dout, const float *in, size_t count)
{
    CUDA_GRID_STRIDE(i, count)
    din[i] = tfc_gelu_grad(dout[i], in[i]);
}

extern "C" int kernel_gelu_forward_cuda(float *out, const float *in, size_t count,
                                        const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    gelu_f<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(out, in, count);
    CUDA_CHECK_LAUNCH("gelu_forward");
    return 0;
}

extern "C" int kernel_gelu_backward_cuda(float *din, const float *dout, const float *in,
                                         size_t count, const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    gelu_b<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(din, dout, in, count);
    CUDA_CHECK_LAUNCH("gelu_backward");
    return 0;
}

/* ---- token + position embedding ---- */

__global__ static void token_rows(int32_t *tok, const float *ids, size_t count, int first,
                                  int vocab)
{
    CUDA_GRID_STRIDE(i, count)
    tok[i] = tfc_token_row(ids[i], first, vocab);
}

__global__ static void embed_f(float *out, const int32_t *tok, const float *wte,
                               const float *wpe, int seq, int width, int bad_nan, size_t count)
{
    CUDA_GRID_STRIDE(i, count)
    out[i] = tfc_embed(tok, wte, wpe, i / width, (int)(i % width), seq, width, bad_nan);
}

__global__ static void embed_pos_grad(float *dwpe, const float *dout, int n, int seq,
                                      int width)
{
    CUDA_GRID_STRIDE(i, (size_t)seq * width)
    tfc_embed_pos_grad(dwpe, dout, n, seq, width, (int)(i / width), (int)(i % width));
}

/* One block per token row v of wte (grid-stride over the rows): the block gathers, chunk by
 * chunk of EMB_CHUNK rows, the rows holding v in row order (a ballot per warp and the warps'
 * counts in order), then each thread adds those rows' values to its columns of dwte[v]
 * (tfc_embed_tok_grad). Each (v, column) is one thread's, summed in row order as on the CPU:
 * deterministic, and no atomics. A block reads the whole token array (cached: 4 bytes a
 * row) per token row, so the kernel costs O(vocab · rows / EMB_CHUNK) block steps. */
enum { EMB_CHUNK = 256 };

__global__ static void __launch_bounds__(EMB_CHUNK)
    embed_tok_grad(float *dwte, const float *dout, const int32_t *tok, int rows, int width,
                   int vocab)
{
    __shared__ int32_t list[EMB_CHUNK];
    __shared__ int warp_count[EMB_CHUNK / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int v = blockIdx.x; v < vocab; v += gridDim.x) {
        for (int r0 = 0; r0 < rows; r0 += EMB_CHUNK) {
            const int r = r0 + threadIdx.x;
            const bool mine = r < rows && tok[r] == v;
            const unsigned ballot = __ballot_sync(0xffffffffu, mine);
            if (lane == 0)
                warp_count[warp] = __popc(ballot);
            __syncthreads();
            int before = 0, total = 0;
            for (int w = 0; w < EMB_CHUNK / 32; w++) {
                before += w < warp ? warp_count[w] : 0;
                total += warp_count[w];
            }
            if (mine)
                list[before + __popc(ballot & ((1u << lane) - 1u))] = r;
            __syncthreads();
            if (total > 0)
                for (int j = threadIdx.x; j < width; j += EMB_CHUNK)
                    tfc_embed_tok_grad(dwte + (size_t)v * width, dout, list, total, width, j);
            __syncthreads(); /* list and warp_count are rewritten by the next chunk */
        }
    }
}

static int embed_check(const char *what, int n, int seq, int width, int vocab)
{
    if (n < 0 || seq < 1 || width < 1 || vocab < 0 || (size_t)n * seq > INT32_MAX)
        return pt_error_set("%s: invalid sizes n=%d seq=%d width=%d vocab=%d", what, n, seq,
                            width, vocab);
    return 0;
}

static int tokens_of(int32_t *tok, const float *ids, size_t count, int first, int vocab,
                     const kernel_cuda_ctx *ctx)
{
    token_rows<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(tok, ids, count, first,
                                                                   vocab);
    CUDA_CHECK_LAUNCH("token_rows");
    return 0;
}

extern "C" int kernel_embedding_shard_forward_cuda(float *out, int32_t *tok, const float *ids,
                                                   const float *wte, const float *wpe, int n,
                                                   int seq, int width, int first, int vocab,
                                                   const kernel_cuda_ctx *ctx)
{
    if (embed_check("embedding", n, seq, width, vocab))
        return -1;
    const size_t rows = (size_t)n * seq, count = rows * width;
    if (count == 0)
        return 0;
    if (tokens_of(tok, ids, rows, first, vocab, ctx))
        return -1;
    /* another shard's token (or a bad id) adds nothing here: the whole table has it */
    embed_f<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(out, tok, wte, wpe, seq, width,
                                                                0, count);
    CUDA_CHECK_LAUNCH("embedding_forward");
    return 0;
}

extern "C" int kernel_embedding_forward_cuda(float *out, int32_t *tok, const float *ids,
                                             const float *wte, const float *wpe, int n,
                                             int seq, int width, int vocab,
                                             const kernel_cuda_ctx *ctx)
{
    if (embed_check("embedding", n, seq, width, vocab))
        return -1;
    const size_t rows = (size_t)n * seq, count = rows * width;
    if (count == 0)
        return 0;
    if (tokens_of(tok, ids, rows, 0, vocab, ctx))
        return -1;
    embed_f<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(out, tok, wte, wpe, seq, width,
                                                                1, count);
    CUDA_CHECK_LAUNCH("embedding_forward");
    return 0;
}

extern "C" int kernel_embedding_shard_backward_cuda(float *dwte, float *dwpe, int32_t *tok,
                                                    const float *dout, const float *ids, int n,
                                                    int seq, int width, int first, int vocab,
                                                    const kernel_cuda_ctx *ctx)
{
    if (embed_check("embedding backward", n, seq, width, vocab))
        return -1;
    const size_t rows = (size_t)n * seq;
    if (rows == 0)
        return 0;
    if (tokens_of(tok, ids, rows, first, vocab, ctx))
        return -1;
    if (dwte && vocab > 0) {
        const int grid = vocab < CUDA_MAX_BLOCKS ? vocab : CUDA_MAX_BLOCKS;
        embed_tok_grad<<<grid, EMB_CHUNK, 0, ctx->stream>>>(dwte, dout, tok, (int)rows, width,
                                                            vocab);
        CUDA_CHECK_LAUNCH("embedding_backward (tokens)");
    }
    if (dwpe) {
        embed_pos_grad<<<cuda_grid((size_t)seq * width), CUDA_THREADS, 0, ctx->stream>>>(
            dwpe, dout, n, seq, width);
        CUDA_CHECK_LAUNCH("embedding_backward (positions)");
    }
    return 0;
}

extern "C" int kernel_embedding_backward_cuda(float *dwte, float *dwpe, int32_t *tok,
                                              const float *dout, const float *ids, int n,
                                              int seq, int width, int vocab,
                                              const kernel_cuda_ctx *ctx)
{
    return kernel_embedding_shard_backward_cuda(dwte, dwpe, tok, dout, ids, n, seq, width, 0,
                                                vocab, ctx);
}

/* ---- fused causal attention (tiled: transformer_math.cuh) ---- */

enum { ATT_ROWS = TFC_ATT_ROWS };

/* Stages rows r0 .. r0 + n − 1 of up to two views into tiles, all the block's threads. */
template <int MAXD>
__device__ static void att_stage(float *t1, const float *v1, float *t2, const float *v2,
                                 size_t ld, int r0, int n, int D)
{
    constexpr int E = tfc_att_tile_rows<MAXD>() * MAXD;
    for (int e = threadIdx.x; e < E; e += ATT_ROWS) {
        tfc_att_stage<MAXD>(t1, v1, ld, r0, n, D, e);
        if (t2)
            tfc_att_stage<MAXD>(t2, v2, ld, r0, n, D, e);
    }
}

/* Block (x, h, b): queries x·ATT_ROWS .. of head h of sample b. */
template <int MAXD>
__global__ static void __launch_bounds__(ATT_ROWS)
    att_forward(float *y, float *lse, const float *qkv, tfc_attn a, tfc_drop dr)
{
    constexpr int BK = tfc_att_tile_rows<MAXD>();
    __shared__ __align__(16) float K[BK * MAXD], V[BK * MAXD];
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * ATT_ROWS;
    const int i = q0 + threadIdx.x, kend = min(a.T, q0 + ATT_ROWS);
    const bool on = i < a.T;
    const float *qv = tfc_att_view(qkv, a, b, h, 0), *kv = tfc_att_view(qkv, a, b, h, 1);
    tfc_att_fwd<MAXD> s;
    tfc_att_fwd_begin<MAXD>(s, qv + (size_t)(on ? i : 0) * a.ld, a.D);
    /* with dropout, the thread's row of the mask first (written, then read by it alone) */
    uint8_t *mrow = on ? tfc_drop_row(dr, a.T, a.H, b, h, i) : NULL;
    if (mrow)
        tfc_drop_make_row(mrow, dr, a.T, b, h, i);
    for (int j0 = 0; j0 < kend; j0 += BK) {
        const int n = min(BK, kend - j0);
        __syncthreads(); /* the previous tile is read */
        att_stage<MAXD>(K, kv, V, kv + a.C, a.ld, j0, n, a.D);
        __syncthreads();
        if (on)
            tfc_att_fwd_tile<MAXD>(s, K, V, j0, n, i, a.scale, mrow, dr.scale);
    }
    if (on)
        tfc_att_fwd_end<MAXD>(s, y + ((size_t)b * a.T + i) * a.C + (size_t)h * a.D,
                              lse + ((size_t)b * a.H + h) * a.T + i, a.D, i);
}

template <int MAXD>
__global__ static void __launch_bounds__(ATT_ROWS)
    att_dq(float *dq, float *delta, const float *dy, const float *qkv, const float *lse,
           tfc_attn a, tfc_drop dr)
{
    constexpr int BK = tfc_att_tile_rows<MAXD>();
    __shared__ __align__(16) float K[BK * MAXD], V[BK * MAXD];
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * ATT_ROWS;
    const int i = q0 + threadIdx.x, ii = i < a.T ? i : 0, kend = min(a.T, q0 + ATT_ROWS);
    const bool on = i < a.T;
    const size_t row = ((size_t)b * a.H + h) * a.T + ii;
    const float *qv = tfc_att_view(qkv, a, b, h, 0), *kv = tfc_att_view(qkv, a, b, h, 1);
    const uint8_t *mrow = tfc_drop_row(dr, a.T, a.H, b, h, ii);
    tfc_att_dq<MAXD> s;
    tfc_att_dq_begin<MAXD>(s, qv + (size_t)ii * a.ld,
                           dy + ((size_t)b * a.T + ii) * a.C + (size_t)h * a.D, lse[row], a.D);
    for (int pass = 0; pass < 2; pass++)
        for (int j0 = 0; j0 < kend; j0 += BK) {
            const int n = min(BK, kend - j0);
            __syncthreads();
            att_stage<MAXD>(K, kv, V, kv + a.C, a.ld, j0, n, a.D);
            __syncthreads();
            if (on && pass == 0)
                tfc_att_dq_delta_tile<MAXD>(s, K, V, j0, n, i, a.scale, mrow, dr.scale);
            else if (on)
                tfc_att_dq_tile<MAXD>(s, K, V, j0, n, i, a.scale, mrow, dr.scale);
        }
    if (on)
        tfc_att_dq_end<MAXD>(s, dq + ((size_t)b * a.T + i) * a.ld + (size_t)h * a.D,
                             delta ? delta + row : NULL, a.D, a.scale);
}

/* Block (x, h, b): keys x·ATT_ROWS .. of head h of sample b; DK: dK, else dV. delta NULL
 * (seq 1): Δ recomputed from global rows while staging. */
template <int MAXD, bool DK>
__global__ static void __launch_bounds__(ATT_ROWS)
    att_dkv(float *out, const float *delta, const float *dy, const float *qkv,
            const float *lse, tfc_attn a, tfc_drop dr)
{
    constexpr int BQ = tfc_att_tile_rows<MAXD>();
    __shared__ __align__(16) float Q[BQ * MAXD], G[BQ * MAXD];
    __shared__ float L[BQ], DL[BQ];
    const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * ATT_ROWS;
    const int j = k0 + threadIdx.x, jj = j < a.T ? j : 0;
    const bool on = j < a.T;
    const float *qv = tfc_att_view(qkv, a, b, h, 0), *kv = tfc_att_view(qkv, a, b, h, 1);
    const float *gv = dy + (size_t)b * a.T * a.C + (size_t)h * a.D;
    const size_t rows = ((size_t)b * a.H + h) * a.T;
    /* key j's column of the mask: query i at [i·T] */
    const uint8_t *m0 = tfc_drop_row(dr, a.T, a.H, b, h, 0), *mcol = m0 ? m0 + jj : NULL;
    tfc_att_dkv<MAXD, DK> s;
    tfc_att_dkv_begin<MAXD, DK>(s, kv + (size_t)jj * a.ld, kv + a.C + (size_t)jj * a.ld, a.D);
    for (int i0 = k0; i0 < a.T; i0 += BQ) {
        const int n = min(BQ, a.T - i0);
        __syncthreads();
        for (int e = threadIdx.x; e < BQ * MAXD; e += ATT_ROWS) {
            tfc_att_stage<MAXD>(Q, qv, a.ld, i0, n, a.D, e);
            tfc_att_stage<MAXD>(G, gv, a.C, i0, n, a.D, e);
        }
        for (int r = threadIdx.x; r < n; r += ATT_ROWS) {
            L[r] = lse[rows + i0 + r];
            if (DK)
                DL[r] = delta ? delta[rows + i0 + r]
                              : tfc_attn_delta(dy, qkv, lse, a, b, h, i0 + r,
                                               tfc_drop_row(dr, a.T, a.H, b, h, i0 + r),
                                               dr.scale);
        }
        __syncthreads();
        if (on)
            tfc_att_dkv_tile<MAXD, DK>(s, Q, G, L, DL, i0, n, j, a.scale, mcol, a.T, dr.scale);
    }
    if (on)
        tfc_att_dkv_end<MAXD, DK>(s, out + ((size_t)b * a.T + j) * a.ld + (size_t)h * a.D, a.D,
                                  a.scale, j);
}

static int attn_check(const char *what, const kernel_attention_dims *d)
{
    if (d->batch < 0 || d->seq < 1 || d->heads < 1 || d->head_dim < 1 ||
        d->qkv_stride < d->heads * d->head_dim)
        return pt_error_set("%s: invalid dims batch=%d seq=%d heads=%d head_dim=%d stride=%d",
                            what, d->batch, d->seq, d->heads, d->head_dim, d->qkv_stride);
    if (d->head_dim > TFC_MAX_HEAD_DIM)
        return pt_error_set("%s: heads of %d values; the CUDA attention takes at most %d",
                            what, d->head_dim, (int)TFC_MAX_HEAD_DIM);
    if (d->heads > 65535 || d->batch > 65535)
        return pt_error_set("%s: %d samples of %d heads; the CUDA attention takes at most "
                            "65535 of each", what, d->batch, d->heads);
    return 0;
}

/* The dropout as the kernels take it (mask NULL: none). The forward needs the sample ids
 * and the mask; the backward the mask alone. Every element's index (elem_off + the call's
 * heads·T²) must lie below 2^32, as kernel_attention_dropout says. */
static int attn_drop_of(const char *what, const kernel_attention_dims *d,
                        const kernel_attention_dropout *drop, bool forward, tfc_drop *dr)
{
    *dr = tfc_drop{1.0f, 1.0f, 0, 0, 0, NULL, NULL};
    if (!drop || drop->p <= 0.0f)
        return 0;
    const size_t span = (size_t)d->heads * d->seq * d->seq;
    if (!(drop->p < 1.0f) || !drop->mask || (forward && !drop->sample_ids) ||
        drop->elem_off > ((size_t)1 << 32) - span || span > ((size_t)1 << 32))
        return pt_error_set("%s: invalid attention dropout (p=%g, mask %s, sample ids %s, "
                            "elements from %zu of %zu per sample past 2^32)",
                            what, (double)drop->p, drop->mask ? "given" : "missing",
                            drop->sample_ids ? "given" : "missing", drop->elem_off, span);
    dr->keep = 1.0f - drop->p;
    dr->scale = 1.0f / dr->keep;
    dr->seed = drop->seed;
    dr->stream = drop->stream;
    dr->elem_off = drop->elem_off;
    dr->ids = drop->sample_ids;
    dr->mask = drop->mask;
    return 0;
}

/* The kernels of the smallest MAXD ≥ D. */
template <int MAXD>
static void att_launch(float *y, float *dqkv, float *lse, float *delta, const float *dy,
                       const float *qkv, tfc_attn a, tfc_drop dr, int batch, bool forward,
                       cudaStream_t st)
{
    const dim3 grid((unsigned)((a.T + ATT_ROWS - 1) / ATT_ROWS), (unsigned)a.H, (unsigned)batch);
    if (forward) {
        att_forward<MAXD><<<grid, ATT_ROWS, 0, st>>>(y, lse, qkv, a, dr);
        return;
    }
    /* dQ (and Δ) first: the dK kernel reads Δ; all read lse, which stays. */
    att_dq<MAXD><<<grid, ATT_ROWS, 0, st>>>(dqkv, delta, dy, qkv, lse, a, dr);
    att_dkv<MAXD, true><<<grid, ATT_ROWS, 0, st>>>(dqkv + a.C, delta, dy, qkv, lse, a, dr);
    att_dkv<MAXD, false><<<grid, ATT_ROWS, 0, st>>>(dqkv + 2 * a.C, delta, dy, qkv, lse, a, dr);
}

static void att_dispatch(float *y, float *dqkv, float *lse, float *delta, const float *dy,
                         const float *qkv, tfc_attn a, tfc_drop dr, int batch, bool forward,
                         cudaStream_t st)
{
    if (a.D <= 16)
        att_launch<16>(y, dqkv, lse, delta, dy, qkv, a, dr, batch, forward, st);
    else if (a.D <= 32)
        att_launch<32>(y, dqkv, lse, delta, dy, qkv, a, dr, batch, forward, st);
    else if (a.D <= 64)
        att_launch<64>(y, dqkv, lse, delta, dy, qkv, a, dr, batch, forward, st);
    else
        att_launch<128>(y, dqkv, lse, delta, dy, qkv, a, dr, batch, forward, st);
}

extern "C" int kernel_attention_forward_cuda(float *y, float *probs, const float *qkv,
                                             const kernel_attention_dims *d,
                                             const kernel_attention_dropout *drop,
                                             const kernel_cuda_ctx *ctx)
{
    tfc_drop dr;
    if (attn_check("attention", d) || attn_drop_of("attention", d, drop, true, &dr))
        return -1;
    if ((size_t)d->batch * d->heads * d->seq == 0)
        return 0;
    att_dispatch(y, NULL, probs, NULL, NULL, qkv, tfc_attn_of(d), dr, d->batch, true,
                 ctx->stream);
    CUDA_CHECK_LAUNCH("attention_forward");
    return 0;
}

extern "C" int kernel_attention_backward_cuda(float *dqkv, float *probs, const float *dy,
                                              const float *qkv, const kernel_attention_dims *d,
                                              const kernel_attention_dropout *drop,
                                              const kernel_cuda_ctx *ctx)
{
    tfc_drop dr;
    if (attn_check("attention backward", d) ||
        attn_drop_of("attention backward", d, drop, false, &dr))
        return -1;
    if ((size_t)d->batch * d->heads * d->seq == 0)
        return 0;
    att_dispatch(NULL, dqkv, probs, tfc_attn_delta_area(probs, d), dy, qkv, tfc_attn_of(d), dr,
                 d->batch, false, ctx->stream);
    CUDA_CHECK_LAUNCH("attention_backward");
    return 0;
}
