/* CPU kernels of GPT-2 style transformer language models (issue 24): layer norm, GELU (tanh
 * approximation), token + position embedding, the causal self-attention core, and the
 * helpers of global gradient-norm clipping. Included from kernels/kernels.h, whose
 * conventions hold here too (float32 row-major, outputs-inputs-weights-sizes, parameter
 * gradients accumulate, input gradients are overwritten, no allocation, results depend only
 * on the inputs and the BLAS thread count). The language-model loss is
 * kernel_softmax_xent_cpu and AdamW is kernel_adamw_update_cpu (kernels/kernels.h).
 *
 * Activations are [tokens, width] with tokens = batch·seq, sequence-major within a sample:
 * token t of sample b is row b·seq + t. */
#ifndef PT_KERNELS_TRANSFORMER_H
#define PT_KERNELS_TRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layer norm over the last dimension, as torch.nn.LayerNorm(width, eps=1e-5) ----
 * out = (x − mean) · rstd · gamma + beta per row, with the biased variance. The forward
 * saves mean[rows] and rstd[rows] = 1/sqrt(var + eps) for the backward, which also needs
 * the input x (the layer keeps x, mean and rstd; not its output). Statistics are summed in
 * double. */
#define KERNEL_LAYERNORM_EPS 1e-5
void kernel_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *x,
                                  const float *gamma, const float *beta, int rows, int width);
/* dx (overwritten), dgamma and dbeta (accumulated, rows added in order). Each of the three
 * may be NULL: the input half (dgamma = dbeta = NULL) and the weight half (dx = NULL) are
 * then, bit for bit, what the whole call computes for them. dx may alias dy. */
void kernel_layernorm_backward_cpu(float *dx, float *dgamma, float *dbeta, const float *dy,
                                   const float *x, const float *mean, const float *rstd,
                                   const float *gamma, int rows, int width);

/* ---- GELU, tanh approximation (GPT-2's; torch's F.gelu(x, approximate="tanh")) ----
 * y = x/2 · (1 + tanh(sqrt(2/π) · (x + 0.044715 x³))). The backward needs the INPUT x (the
 * other activations' backward uses the output), so the layer keeps its input. out may alias
 * in only when no backward follows; din may alias dout. */
void kernel_gelu_forward_cpu(float *out, const float *in, size_t count);
void kernel_gelu_backward_cpu(float *din, const float *dout, const float *in, size_t count);

/* ---- token + position embedding ----
 * out[b·seq + t, :] = wte[tokens[b·seq + t], :] + wpe[t, :]; wte is [vocab, width], wpe
 * [≥ seq, width]. The CALLER checks 0 ≤ token < vocab (the data loader, once per batch) and
 * reports a bad id. The kernel still never reads or writes out of bounds: an id outside the
 * range gives a NaN row of out and no gradient, so the loss shows the fault. (No assert:
 * this project's builds keep asserts on, and library code must not abort.) */
void kernel_embedding_forward_cpu(float *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int batch, int seq, int width, int vocab);
/* dwte[tokens[r], :] += dout[r, :] and dwpe[t, :] += dout[b·seq + t, :], rows in order
 * (deterministic). Either may be NULL. A tied output projection adds into the same dwte. */
void kernel_embedding_backward_cpu(float *dwte, float *dwpe, const float *dout,
                                   const int32_t *tokens, int batch, int seq, int width,
                                   int vocab);

/* ---- causal multi-head self-attention core (after the q, k, v projections) ----
 * q, k, v and dq, dk, dv are [batch·seq, heads·head_dim] with rows qkv_stride floats apart:
 * heads·head_dim for separate tensors, 3·heads·head_dim for views into GPT-2's fused c_attn
 * output [tokens, 3·C] (q = qkv, k = qkv + C, v = qkv + 2C), so no split copies are made.
 * Head h uses columns h·head_dim .. h·head_dim + head_dim − 1. y and dy are
 * [batch·seq, heads·head_dim], rows heads·head_dim apart. No output may overlap an input.
 *   y = softmax(mask(q k^T / sqrt(head_dim))) v   per sample and head, mask j ≤ i. */
typedef struct {
    int batch, seq, heads, head_dim;
    int qkv_stride; /* floats between rows of q, k, v, dq, dk, dv; ≥ heads·head_dim */
} kernel_attention_dims;

/* Floats of probs, what the forward saves for the backward: the attention probabilities
 * P[b, h, i, j] = probs[((b·heads + h)·seq + i)·seq + j], batch·heads·seq². Entries above
 * the diagonal (j > i) are unspecified and never read. */
size_t kernel_attention_probs_floats(const kernel_attention_dims *d);
/* Floats of scratch the backward needs (the forward needs none). */
size_t kernel_attention_workspace_floats(const kernel_attention_dims *d);
void kernel_attention_forward_cpu(float *y, float *probs, const float *q, const float *k,
                                  const float *v, const kernel_attention_dims *d);
/* dq, dk, dv overwritten (they may be views into one [tokens, 3·C] gradient); probs as the
 * forward left it (read only). */
void kernel_attention_backward_cpu(float *dq, float *dk, float *dv, float *work,
                                   const float *dy, const float *q, const float *k,
                                   const float *v, const float *probs,
                                   const kernel_attention_dims *d);

/* ---- attention dropout (GPT-2's attn_dropout, inverted) ----
 * On the probabilities after the softmax, before the product with v: y = (P ∘ M / (1 − p)) v,
 * M drawn as kernel_dropout_forward_range_cpu draws it: element e of sample b is kept when
 * uniform(seed, stream, (sample_ids[b] << 32) | e) < 1 − p, e = elem_off + ((h·seq) + i)·seq
 * + j for the call's head h. elem_off places the call's heads among the layer's (a tensor
 * shard holding heads [h0, h1) passes h0·seq²), so a mask depends on the sample, not on the
 * layout; heads·seq² of the whole layer must stay below 2^32 (the caller checks). probs
 * keeps P itself (the backward needs it where M drops), mask M for j ≤ i (the rest is
 * never written or read), laid out as probs. p = 0 or NULL: exactly the calls above. */
typedef struct {
    float p;
    uint64_t seed, stream;
    const int64_t *sample_ids; /* forward: [batch] */
    size_t elem_off;
    uint8_t *mask;             /* [batch·heads·seq²]: written forward, read backward */
} kernel_attention_dropout;
/* Floats of scratch both directions need with dropout, beyond the backward's workspace:
 * one block of dropped probabilities. The forward's work is this; the backward's is
 * kernel_attention_workspace_floats + this. */
size_t kernel_attention_dropout_floats(const kernel_attention_dims *d);
void kernel_attention_forward_dropout_cpu(float *y, float *probs, float *work, const float *q,
                                          const float *k, const float *v,
                                          const kernel_attention_dims *d,
                                          const kernel_attention_dropout *drop);
void kernel_attention_backward_dropout_cpu(float *dq, float *dk, float *dv, float *work,
                                           const float *dy, const float *q, const float *k,
                                           const float *v, const float *probs,
                                           const kernel_attention_dims *d,
                                           const kernel_attention_dropout *drop);
/* The stream of a [block]'s dropout at `site` (0: attention probabilities, 1: attention
 * c_proj's output, 2: MLP c_proj's output) in layer `layer` at `step`: rng_stream_dropout's
 * (kernels/rng.h) with the site in bits 60–61, which that stream leaves 0 below step 2^44,
 * so no two sites, layers or steps share numbers. */
static inline uint64_t kernel_block_dropout_stream(int layer, int site, uint64_t step)
{
    return ((uint64_t)2 << 62) | ((uint64_t)(site + 1) << 60) |
           ((step & (((uint64_t)1 << 44) - 1)) << 16) | (uint64_t)layer;
}

/* ---- global gradient-norm clipping (torch.nn.utils.clip_grad_norm_, one rank's part) ----
 * Σ x² in double, in a fixed blocking order: the same bits for the same buffer, whatever
 * its alignment. Ranks add their sums (in a fixed order) before the square root. */
double kernel_sum_squares_cpu(const float *x, size_t count);
/* torch's factor: min(1, max_norm / (sqrt(sum_squares) + 1e-6)), rounded to float. */
float kernel_clip_scale(double sum_squares, float max_norm);
/* x *= scale, in place. */
void kernel_scale_cpu(float *x, size_t count, float scale);

#ifdef __cplusplus
}
#endif

#endif
