/* CUDA kernels of the transformer layers (kernels_cuda.h: layer norm, GELU, token +
 * position embedding and its vocabulary shards, the fused causal attention). Each kernel
 * is a loop over its threads' items calling the per-thread functions of
 * kernels/cuda/transformer_math.cuh, which tests/cuda/test_transformer_host.cu runs on the
 * host against the CPU twins. Correctness first: one thread per row or column where a
 * fixed summation order is wanted (no floating-point atomics anywhere, so every run gives
 * the same bits); the attention never writes the T×T scores (an online softmax forward,
 * logsumexp saved; a backward that recomputes the probabilities), untiled. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/transformer_math.cuh"

/* ---- layer norm ---- */

__global__ static void ln_stats(float *mean, float *rstd, const float *x, int rows, int width)
{
    CUDA_GRID_STRIDE(r, (size_t)rows)
    tfc_ln_stats(x + r * width, width, mean + r, rstd + r);
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

__global__ static void ln_params(float *dgamma, float *dbeta, const float *dy, const float *x,
                                 const float *mean, const float *rstd, int rows, int width)
{
    CUDA_GRID_STRIDE(j, (size_t)width)
    tfc_ln_param_col(dgamma, dbeta, dy, x, mean, rstd, rows, width, (int)j);
}

__global__ static void ln_dx(float *dx, const float *dy, const float *x, const float *mean,
                             const float *rstd, const float *gamma, int rows, int width)
{
    CUDA_GRID_STRIDE(r, (size_t)rows)
    tfc_ln_dx_row(dx + r * width, dy + r * width, x + r * width, mean[r], rstd[r], gamma,
                  width);
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
    ln_stats<<<cuda_grid((size_t)rows), CUDA_THREADS, 0, ctx->stream>>>(mean, rstd, x, rows,
                                                                        width);
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
        ln_params<<<cuda_grid((size_t)width), CUDA_THREADS, 0, ctx->stream>>>(
            dgamma, dbeta, dy, x, mean, rstd, rows, width);
        CUDA_CHECK_LAUNCH("ln_params");
    }
    if (dx) {
        ln_dx<<<cuda_grid((size_t)rows), CUDA_THREADS, 0, ctx->stream>>>(dx, dy, x, mean, rstd,
                                                                         gamma, rows, width);
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

/* ---- fused causal attention ---- */

__global__ static void attn_f(float *y, float *lse, const float *qkv, tfc_attn a, size_t count)
{
    CUDA_GRID_STRIDE(t, count)
    {
        const int i = (int)(t % a.T), h = (int)(t / a.T % a.H), b = (int)(t / a.T / a.H);
        tfc_attn_forward_row(y, lse, qkv, a, b, h, i);
    }
}

__global__ static void attn_dq(float *dq, float *delta, const float *dy, const float *qkv,
                               const float *lse, tfc_attn a, size_t count)
{
    CUDA_GRID_STRIDE(t, count)
    {
        const int i = (int)(t % a.T), h = (int)(t / a.T % a.H), b = (int)(t / a.T / a.H);
        tfc_attn_dq_row(dq, delta, dy, qkv, lse, a, b, h, i);
    }
}

__global__ static void attn_dkv(float *dk, float *dv, const float *delta, const float *dy,
                                const float *qkv, const float *lse, tfc_attn a, size_t count)
{
    CUDA_GRID_STRIDE(t, count)
    {
        const int j = (int)(t % a.T), h = (int)(t / a.T % a.H), b = (int)(t / a.T / a.H);
        tfc_attn_dkv_row(dk, dv, delta, dy, qkv, lse, a, b, h, j);
    }
}

/* Rows of work per kernel: one thread each, 64 to a block (the rows' head-sized arrays
 * live in each thread's registers and local memory). */
enum { ATTN_THREADS = 64 };

static int attn_check(const char *what, const kernel_attention_dims *d)
{
    if (d->batch < 0 || d->seq < 1 || d->heads < 1 || d->head_dim < 1 ||
        d->qkv_stride < d->heads * d->head_dim)
        return pt_error_set("%s: invalid dims batch=%d seq=%d heads=%d head_dim=%d stride=%d",
                            what, d->batch, d->seq, d->heads, d->head_dim, d->qkv_stride);
    if (d->head_dim > TFC_MAX_HEAD_DIM)
        return pt_error_set("%s: heads of %d values; the CUDA attention takes at most %d",
                            what, d->head_dim, (int)TFC_MAX_HEAD_DIM);
    return 0;
}

static int attn_no_dropout(const char *what, const kernel_attention_dropout *drop)
{
    if (drop && drop->p > 0.0f)
        return pt_error_set("%s: attention dropout (p=%g) has no CUDA kernel yet; train "
                            "with [block] dropout=0 on --device cuda",
                            what, (double)drop->p);
    return 0;
}

extern "C" int kernel_attention_forward_cuda(float *y, float *probs, const float *qkv,
                                             const kernel_attention_dims *d,
                                             const kernel_attention_dropout *drop,
                                             const kernel_cuda_ctx *ctx)
{
    if (attn_check("attention", d) || attn_no_dropout("attention", drop))
        return -1;
    const size_t rows = (size_t)d->batch * d->heads * d->seq;
    if (rows == 0)
        return 0;
    const unsigned grid = (unsigned)((rows + ATTN_THREADS - 1) / ATTN_THREADS);
    attn_f<<<grid, ATTN_THREADS, 0, ctx->stream>>>(y, probs, qkv, tfc_attn_of(d), rows);
    CUDA_CHECK_LAUNCH("attention_forward");
    return 0;
}

extern "C" int kernel_attention_backward_cuda(float *dqkv, float *probs, const float *dy,
                                              const float *qkv, const kernel_attention_dims *d,
                                              const kernel_attention_dropout *drop,
                                              const kernel_cuda_ctx *ctx)
{
    if (attn_check("attention backward", d) || attn_no_dropout("attention backward", drop))
        return -1;
    const size_t rows = (size_t)d->batch * d->heads * d->seq;
    if (rows == 0)
        return 0;
    const tfc_attn a = tfc_attn_of(d);
    const unsigned grid = (unsigned)((rows + ATTN_THREADS - 1) / ATTN_THREADS);
    float *delta = tfc_attn_delta_area(probs, d);
    const size_t C = (size_t)a.C;
    /* dQ (and Δ) first: the dK/dV kernel reads Δ; both read lse, which stays. */
    attn_dq<<<grid, ATTN_THREADS, 0, ctx->stream>>>(dqkv, delta, dy, qkv, probs, a, rows);
    CUDA_CHECK_LAUNCH("attention_backward (dq)");
    attn_dkv<<<grid, ATTN_THREADS, 0, ctx->stream>>>(dqkv + C, dqkv + 2 * C, delta, dy, qkv,
                                                     probs, a, rows);
    CUDA_CHECK_LAUNCH("attention_backward (dk, dv)");
    return 0;
}
