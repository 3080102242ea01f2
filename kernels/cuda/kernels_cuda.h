/* CUDA twins of the CPU kernels in kernels/kernels.h.
 *
 * Every kernel_X_cuda has the meaning and argument order of kernel_X_cpu, plus a context as
 * the last argument; kernels/kernels.h's contract holds unchanged (parameter gradients
 * ACCUMULATE, input gradients are OVERWRITTEN, din may be NULL, scratch is passed in).
 * Differences, all because the work runs on a device:
 * - Every pointer argument is a DEVICE pointer (sample_ids and labels included), except
 *   the dims struct and the context, which are host memory and read during the call.
 * - The work is queued on ctx->stream and has not run when the call returns: synchronise
 *   the stream before reading results on the host or reusing inputs for something else.
 * - The functions return 0, or −1 with a message (file:line and the CUDA/cuBLAS error) left
 *   by pt_error_set (src/base/error.h). An error of a kernel that already ran may surface at a
 *   later call on the same stream, as CUDA reports it.
 * - The calling thread's current device must be the context's (cudaSetDevice); the
 *   context does not switch devices itself.
 * Results agree with the CPU kernels to float rounding (dense, conv, sigmoid and tanh
 * forward, softmax cross-entropy) or bit for bit (pooling, relu and linear, every
 * activation backward, bias add, dropout masks and values, initialisation, bytes_to_float,
 * optimizer updates); tests/cuda/test_cuda_kernels.c checks both on a GPU. That is in the
 * context's default precision, FP32; TF32 and BF16 (below) round the products' operands.
 *
 * Random numbers come from cuRAND's device API (curandStatePhilox4_32_10): curand_init(seed,
 * subsequence = stream, offset = 4·block) followed by curand4 yields exactly the Philox block
 * rng_philox4x32_10(seed, stream, block) of kernels/rng.h, so masks and initial weights are
 * the CPU's. */
#ifndef PT_KERNELS_CUDA_H
#define PT_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kernels.h"

/* How the matrix products of the dense and conv kernels multiply (--precision, issue 25).
 * Everything else (bias, sums, activations, norms, softmax, optimizers) is float32 always.
 *   FP32: cublasSgemm on CUDA cores, full float32 (the CPU kernels' results to rounding).
 *   TF32: cublasGemmEx with float32 storage and CUBLAS_COMPUTE_32F_FAST_TF32: tensor cores
 *         take each operand element with a 10-bit mantissa, accumulate in float32.
 *   BF16: both operands converted to bfloat16 (round to nearest even) into the context's
 *         scratch, then cublasGemmEx with bf16 inputs and a float32 accumulator and output
 *         (CUBLAS_COMPUTE_32F): the autocast-like scheme. */
typedef enum {
    KERNEL_CUDA_FP32 = 0,
    KERNEL_CUDA_TF32,
    KERNEL_CUDA_BF16,
} kernel_cuda_precision;

/* Device scratch for the bf16 copies of a product's operands (kernels/cuda/precision.cu). */
typedef struct {
    void *p;
    size_t bytes;
} kernel_cuda_scratch;

/* One stream and one cuBLAS handle bound to it. Plain struct owned by the caller.
 * precision: FP32 after init; the owner sets it before queuing work. bf16: the scratch
 * (host struct allocated by init, so that kernels taking a const context can grow it),
 * used in stream order: products on the one stream never overlap. */
typedef struct {
    cudaStream_t stream;
    cublasHandle_t blas;
    kernel_cuda_precision precision;
    kernel_cuda_scratch *bf16;
} kernel_cuda_ctx;

/* "fp32", "tf32", "bf16" (NULL for another value). */
static inline const char *kernel_cuda_precision_name(kernel_cuda_precision p)
{
    return p == KERNEL_CUDA_FP32 ? "fp32" : p == KERNEL_CUDA_TF32 ? "tf32"
           : p == KERNEL_CUDA_BF16 ? "bf16" : NULL;
}

/* Selects `device` as the calling thread's current device and creates a non-blocking
 * stream and a cuBLAS handle on it (default math: full float32, no TF32; precision FP32).
 * Returns −1 with a message ("no CUDA device: cudaGetDeviceCount: ...") when there is no
 * usable device. On failure *c holds nothing to free. */
int kernel_cuda_ctx_init(kernel_cuda_ctx *c, int device);
/* Releases the handle, the stream (pending work is waited for) and the bf16 scratch, and
 * clears the members; safe on a zeroed or already freed context. */
void kernel_cuda_ctx_free(kernel_cuda_ctx *c);

/* C = alpha·op(A)·op(B) + beta·C, cublasSgemm's arguments and meaning, in ctx->precision:
 * FP32 is that very cublasSgemm call (the same bits as before precisions existed). The
 * dense and conv kernels make every product through these two. */
int kernel_cuda_gemm(const kernel_cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb,
                     int m, int n, int k, const float *alpha, const float *a, int lda,
                     const float *b, int ldb, const float *beta, float *c, int ldc);
/* cublasSgemmStridedBatched's likewise. */
int kernel_cuda_gemm_strided_batched(const kernel_cuda_ctx *ctx, cublasOperation_t ta,
                                     cublasOperation_t tb, int m, int n, int k,
                                     const float *alpha, const float *a, int lda,
                                     long long stride_a, const float *b, int ldb,
                                     long long stride_b, const float *beta, float *c, int ldc,
                                     long long stride_c, int batch);

/* ---- dense (cuBLAS, kernel_cuda_gemm); db is summed by a kernel ---- */
int kernel_dense_forward_cuda(float *out, const float *in, const float *w, const float *b,
                              int n, int in_f, int out_f, const kernel_cuda_ctx *ctx);
int kernel_dense_backward_cuda(float *din, float *dw, float *db, const float *dout,
                               const float *in, const float *w, int n, int in_f, int out_f,
                               const kernel_cuda_ctx *ctx);
/* Its two halves (zero-bubble schedules run them apart), kernels.h's: the weight gradient
 * (dw += dout^T · in, db += column sums) and the input gradient (din = dout · w; nothing
 * when din is NULL). The fused call above is the weight half then the input half, so the
 * halves give its bits. */
int kernel_dense_backward_weight_cuda(float *dw, float *db, const float *dout, const float *in,
                                      int n, int in_f, int out_f, const kernel_cuda_ctx *ctx);
int kernel_dense_backward_input_cuda(float *din, const float *dout, const float *w, int n,
                                     int in_f, int out_f, const kernel_cuda_ctx *ctx);
/* The weight gradient of output units [u0, u0 + units) alone, WRITTEN (not added):
 * dw[u0.., :] = dout[:, u0..]^T · in, db[u0..] = column sums of dout (the batched weight
 * gradient forms a layer's in fixed tiles of units this way). */
int kernel_dense_weight_grad_units_cuda(float *dw, float *db, const float *dout,
                                        const float *in, int n, int in_f, int out_f, int u0,
                                        int units, const kernel_cuda_ctx *ctx);

/* ---- 2-D convolution: im2col + cuBLAS ----
 * Workspace (device floats): col[c·k·k][n·oh·ow], then, for the backward, dy[filters]
 * [n·oh·ow]. Not the CPU's size: allocate kernel_conv2d_workspace_floats_cuda floats. */
size_t kernel_conv2d_workspace_floats_cuda(const kernel_conv2d_dims *d);
int kernel_conv2d_forward_cuda(float *out, float *work, const float *in, const float *w,
                               const float *b, const kernel_conv2d_dims *d,
                               const kernel_cuda_ctx *ctx);
int kernel_conv2d_backward_cuda(float *din, float *dw, float *db, float *work,
                                const float *dout, const float *in, const float *w,
                                const kernel_conv2d_dims *d, const kernel_cuda_ctx *ctx);
/* Its two halves, each making the fused call's kernel calls for its outputs (the weight
 * half rebuilds im2col), so bit for bit what the fused call gives; the same workspace. */
int kernel_conv2d_backward_weight_cuda(float *dw, float *db, float *work, const float *dout,
                                       const float *in, const kernel_conv2d_dims *d,
                                       const kernel_cuda_ctx *ctx);
int kernel_conv2d_backward_input_cuda(float *din, float *work, const float *dout,
                                      const float *w, const kernel_conv2d_dims *d,
                                      const kernel_cuda_ctx *ctx);

/* ---- pooling (same rules as the CPU: first maximum wins, NaN propagates) ---- */
int kernel_maxpool2d_forward_cuda(float *out, int32_t *argmax, const float *in, int n, int c,
                                  int h, int w, int size, int stride,
                                  const kernel_cuda_ctx *ctx);
int kernel_maxpool2d_backward_cuda(float *din, const float *dout, const int32_t *argmax,
                                   int n, int c, int h, int w, int size, int stride,
                                   const kernel_cuda_ctx *ctx);
int kernel_avgpool2d_forward_cuda(float *out, const float *in, int n, int c, int h, int w,
                                  int size, int stride, const kernel_cuda_ctx *ctx);
int kernel_avgpool2d_backward_cuda(float *din, const float *dout, int n, int c, int h, int w,
                                   int size, int stride, const kernel_cuda_ctx *ctx);

/* ---- element-wise activations (out may alias in; din may alias dout) ---- */
int kernel_activation_forward_cuda(float *out, const float *in, size_t count, kernel_act act,
                                   const kernel_cuda_ctx *ctx);
int kernel_activation_backward_cuda(float *din, const float *dout, const float *out,
                                    size_t count, kernel_act act, const kernel_cuda_ctx *ctx);
/* y[(i·units + u)·per + k] += b[u] for i < n, u < units, k < per (per = 1 for a dense
 * layer, h·w for a conv): the bias of a layer split by its inputs, added after the partial
 * sums are all-reduced and before kernel_activation_forward_cuda. One rounded addition per
 * element, so the CPU loop's bits. */
int kernel_bias_add_cuda(float *y, const float *b, int n, int units, size_t per,
                         const kernel_cuda_ctx *ctx);

/* ---- inverted dropout; sample_ids is a device array of n ids ---- */
int kernel_dropout_forward_cuda(float *out, uint8_t *mask, const float *in, int n,
                                size_t per_sample, float p, uint64_t seed, uint64_t stream,
                                const int64_t *sample_ids, const kernel_cuda_ctx *ctx);
/* kernels.h's range twin: rows hold elements [elem_off, elem_off + per_sample) of each
 * sample's whole vector (a shard), and equal those columns of the whole-vector result bit
 * for bit. Only the Philox blocks that meet the range are computed; the call above is this
 * with elem_off = 0. −1 unless elem_off + per_sample ≤ 2^32. */
int kernel_dropout_forward_range_cuda(float *out, uint8_t *mask, const float *in, int n,
                                      size_t per_sample, size_t elem_off, float p,
                                      uint64_t seed, uint64_t stream,
                                      const int64_t *sample_ids, const kernel_cuda_ctx *ctx);
int kernel_dropout_backward_cuda(float *din, const float *dout, const uint8_t *mask,
                                 size_t count, float p, const kernel_cuda_ctx *ctx);

/* ---- softmax cross-entropy ----
 * Unlike the CPU kernel, which returns the loss, the results stay on the device so that a
 * training step need not wait for them: *loss_sum (device double, may be NULL) receives the
 * SUM over the n samples of −log softmax(logits)[label] (NaN if a label is outside
 * [0, classes)), *correct (device int, may be NULL) the number of samples whose first
 * argmax is the label; both are overwritten. dlogits (may be NULL, may alias logits) as on
 * the CPU. labels is a device array of n. The loss is summed in a fixed order: the same
 * inputs give the same bits on every run. */
int kernel_softmax_xent_cuda(float *dlogits, int *correct, double *loss_sum,
                             const float *logits, const int32_t *labels, int n, int classes,
                             float grad_scale, const kernel_cuda_ctx *ctx);

/* The same over many rows (a language model's positions: batch·seq rows of the
 * vocabulary): up to KERNEL_XENT_PARTS blocks, each summing its rows into part_loss[b] and
 * part_right[b] (device scratch of KERNEL_XENT_PARTS each), then added in block order, so
 * the same bits on every run (not the one-block kernel's: other partial sums). Falls back
 * to the call above when the rows fill fewer than two blocks. */
enum { KERNEL_XENT_PARTS = 256 };
int kernel_softmax_xent_rows_cuda(float *dlogits, int *correct, double *loss_sum,
                                  const float *logits, const int32_t *labels, int n,
                                  int classes, float grad_scale, double *part_loss,
                                  int *part_right, const kernel_cuda_ctx *ctx);

/* ---- transformer layers (kernels/cuda/transformer.cu; kernels/kernels_transformer.h's
 * twins, to float rounding: tests/cuda/test_transformer_host.cu runs their per-thread code
 * on the host against the CPU kernels, test_cuda_kernels the kernels on a GPU). No
 * floating-point atomics: every sum has a fixed order, so runs repeat bit for bit. ---- */
/* Statistics in double as the CPU's (same lanes); one thread per row. */
int kernel_layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *x,
                                  const float *gamma, const float *beta, int rows, int width,
                                  const kernel_cuda_ctx *ctx);
/* dgamma, dbeta: one thread per column adding the rows in order; dx (may alias dy): one
 * thread per row. Any of the three may be NULL. */
int kernel_layernorm_backward_cuda(float *dx, float *dgamma, float *dbeta, const float *dy,
                                   const float *x, const float *mean, const float *rstd,
                                   const float *gamma, int rows, int width,
                                   const kernel_cuda_ctx *ctx);
int kernel_gelu_forward_cuda(float *out, const float *in, size_t count,
                             const kernel_cuda_ctx *ctx);
int kernel_gelu_backward_cuda(float *din, const float *dout, const float *in, size_t count,
                              const kernel_cuda_ctx *ctx);
/* Token ids arrive as floats (the stage input, device); tok: device scratch of n·seq int32
 * (the ids as rows of wte, −1 outside). The whole table: a bad id gives a NaN row and no
 * gradient, as on the CPU. */
int kernel_embedding_forward_cuda(float *out, int32_t *tok, const float *ids, const float *wte,
                                  const float *wpe, int n, int seq, int width, int vocab,
                                  const kernel_cuda_ctx *ctx);
/* dwte (rows of a token summed in row order by one thread per (token, column): no atomics)
 * and dwpe (samples in order); either may be NULL. */
int kernel_embedding_backward_cuda(float *dwte, float *dwpe, int32_t *tok, const float *dout,
                                   const float *ids, int n, int seq, int width, int vocab,
                                   const kernel_cuda_ctx *ctx);
/* A vocabulary shard (layer_ops.h's embedding_shard_*): wte holds tokens [first,
 * first + vocab); another shard's token adds nothing (0, or its position's row). */
int kernel_embedding_shard_forward_cuda(float *out, int32_t *tok, const float *ids,
                                        const float *wte, const float *wpe, int n, int seq,
                                        int width, int first, int vocab,
                                        const kernel_cuda_ctx *ctx);
int kernel_embedding_shard_backward_cuda(float *dwte, float *dwpe, int32_t *tok,
                                         const float *dout, const float *ids, int n, int seq,
                                         int width, int first, int vocab,
                                         const kernel_cuda_ctx *ctx);
/* Fused causal attention on GPT-2's fused qkv rows (kernel_attention_dims; y rows C apart).
 * Never forms the T×T scores: one thread per (sample, head, query row) with an online
 * softmax. probs: the saved area the layer gives (kernel_attention_probs_floats floats);
 * the forward keeps each row's logsumexp in its first batch·heads·seq floats, and the
 * backward writes Δ = rowsum(P ∘ dP) after them (seq ≥ 2; at seq 1 it recomputes it), so
 * the area is written by both. The backward overwrites dqkv's three views: dQ by query
 * rows, dK and dV by key rows (queries in order): deterministic. head_dim ≤ 128.
 * Dropout (drop with p > 0; device sample_ids and mask): the forward draws each query row's
 * mask from the counter RNG as kernel_attention_forward_dropout_cpu does (the same bits,
 * elem_off placing a shard's heads) and writes it; the softmax's sum stays that of the
 * probabilities before the dropout, each key's term is scaled by M/(1 − p); the backward
 * reads the mask (dP = M/(1 − p) ∘ dO vᵀ, Δ = rowsum(P ∘ dP)). */
int kernel_attention_forward_cuda(float *y, float *probs, const float *qkv,
                                  const kernel_attention_dims *d,
                                  const kernel_attention_dropout *drop,
                                  const kernel_cuda_ctx *ctx);
int kernel_attention_backward_cuda(float *dqkv, float *probs, const float *dy, const float *qkv,
                                   const kernel_attention_dims *d,
                                   const kernel_attention_dropout *drop,
                                   const kernel_cuda_ctx *ctx);

/* ---- the vocabulary-parallel cross-entropy (a language model's head in tensor shards;
 * kernels/cuda/xent_shard.cu, src/cpu/stage_loss.c's sharded_loss step by step) ----
 * This rank holds columns [first, first + Vr) of `rows` rows of the logits (V in all, T
 * ranks). The engine all-gathers, rank by rank, max's `mine` ([rows][2]) into sums' `all`
 * ([T][rows][2]), and sums' `mine` ([rows][3]) into finish's `all` ([T][rows][3]). sums
 * keeps each row's maximum and argmax in ma ([rows][2]) and, with dlogits (not aliasing
 * the logits), the exponentials there, which finish turns into this rank's columns of the
 * gradient. finish writes the rows' loss sum and hits (device, may be NULL), summed in a
 * fixed order (row_loss, row_right: device scratch of rows each). The exponentials are
 * expf, not the CPU's fastmath_expf: to rounding. */
int kernel_xent_shard_max_cuda(float *mine, const float *logits, int rows, int Vr, int first,
                               const kernel_cuda_ctx *ctx);
int kernel_xent_shard_sums_cuda(float *mine, float *dlogits, float *ma, const float *all,
                                const float *logits, const int32_t *labels, int rows, int Vr,
                                int first, int T, const kernel_cuda_ctx *ctx);
int kernel_xent_shard_finish_cuda(float *dlogits, int *correct, double *loss_sum,
                                  const float *all, const float *ma, const int32_t *labels,
                                  int rows, int Vr, int first, int V, int T, float grad_scale,
                                  double *row_loss, int *row_right, const kernel_cuda_ctx *ctx);

/* dst += src (kernel_add_cpu). */
int kernel_add_cuda(float *dst, const float *src, size_t count, const kernel_cuda_ctx *ctx);

/* ---- optimizers: the CPU kernels' operations and roundings, so the same bits ---- */
int kernel_sgd_update_cuda(float *param, const float *grad, size_t count, float lr,
                           float weight_decay, const kernel_cuda_ctx *ctx);
int kernel_momentum_update_cuda(float *param, float *buf, const float *grad, size_t count,
                                float lr, float momentum, float weight_decay,
                                const kernel_cuda_ctx *ctx);
int kernel_adam_update_cuda(float *param, float *m, float *v, const float *grad, size_t count,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            long step, const kernel_cuda_ctx *ctx);
/* torch.optim.AdamW: decoupled decay by kernel_adamw_decay_at first (kernel_adamw_update_cpu) */
int kernel_adamw_update_cuda(float *param, float *m, float *v, const float *grad, size_t count,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             long step, const kernel_cuda_ctx *ctx);

/* ---- initialisation: U(−bound, bound), the CPU's numbers ---- */
int kernel_init_uniform_cuda(float *out, size_t count, float bound, uint64_t seed,
                             uint64_t stream, const kernel_cuda_ctx *ctx);
/* Elements [first, first + count) of that tensor into out[0 .. count) (a shard of it),
 * kernel_init_uniform_range_cpu's numbers; the call above is this with first = 0. */
int kernel_init_uniform_range_cuda(float *out, size_t first, size_t count, float bound,
                                   uint64_t seed, uint64_t stream, const kernel_cuda_ctx *ctx);

/* ---- small helpers ---- */
int kernel_bytes_to_float_cuda(float *out, const uint8_t *in, size_t count,
                               const kernel_cuda_ctx *ctx);

/* For tests: the Philox block (seed, stream, block) computed on the HOST by the very
 * cuRAND device-API code path the dropout and init kernels run (compiled for both sides),
 * so that its agreement with kernels/rng.h can be checked on a machine without a GPU. */
void kernel_cuda_rng_block(uint32_t out[4], uint64_t seed, uint64_t stream, uint64_t block);

#ifdef __cplusplus
}
#endif

#endif
