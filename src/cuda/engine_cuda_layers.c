/* The CUDA engine's layer_kernels (src/engine/layer_ops.h): kernels/cuda/kernels_cuda.h
 * behind the device-neutral wrappers the shared layer loop calls, the transformer layers'
 * included (issue 25). ctx is the engine's kernel_cuda_ctx; every pointer is device
 * memory. The update's set is in engine_cuda_optim.c. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "src/cuda/engine_cuda_impl.h"

static int cu_dense_forward(void *ctx, float *out, const float *in, const float *w,
                            const float *b, int n, int in_f, int out_f)
{
    return kernel_dense_forward_cuda(out, in, w, b, n, in_f, out_f, ctx);
}
static int cu_dense_backward(void *ctx, float *din, float *dw, float *db, const float *dout,
                             const float *in, const float *w, int n, int in_f, int out_f)
{
    return kernel_dense_backward_cuda(din, dw, db, dout, in, w, n, in_f, out_f, ctx);
}
static int cu_dense_backward_weight(void *ctx, float *dw, float *db, const float *dout,
                                    const float *in, int n, int in_f, int out_f)
{
    return kernel_dense_backward_weight_cuda(dw, db, dout, in, n, in_f, out_f, ctx);
}
static int cu_dense_backward_input(void *ctx, float *din, const float *dout, const float *w,
                                   int n, int in_f, int out_f)
{
    return kernel_dense_backward_input_cuda(din, dout, w, n, in_f, out_f, ctx);
}
static int cu_conv_forward(void *ctx, float *out, float *work, const float *in, const float *w,
                           const float *b, const kernel_conv2d_dims *d)
{
    return kernel_conv2d_forward_cuda(out, work, in, w, b, d, ctx);
}
static int cu_conv_backward(void *ctx, float *din, float *dw, float *db, float *work,
                            const float *dout, const float *in, const float *w,
                            const kernel_conv2d_dims *d)
{
    return kernel_conv2d_backward_cuda(din, dw, db, work, dout, in, w, d, ctx);
}
static int cu_conv_backward_weight(void *ctx, float *dw, float *db, float *work,
                                   const float *dout, const float *in, const kernel_conv2d_dims *d)
{
    return kernel_conv2d_backward_weight_cuda(dw, db, work, dout, in, d, ctx);
}
static int cu_conv_backward_input(void *ctx, float *din, float *work, const float *dout,
                                  const float *w, const kernel_conv2d_dims *d)
{
    return kernel_conv2d_backward_input_cuda(din, work, dout, w, d, ctx);
}
static int cu_maxpool_forward(void *ctx, float *out, int32_t *argmax, const float *in, int n,
                              int c, int h, int w, int size, int stride)
{
    return kernel_maxpool2d_forward_cuda(out, argmax, in, n, c, h, w, size, stride, ctx);
}
static int cu_maxpool_backward(void *ctx, float *din, const float *dout, const int32_t *argmax,
                               int n, int c, int h, int w, int size, int stride)
{
    return kernel_maxpool2d_backward_cuda(din, dout, argmax, n, c, h, w, size, stride, ctx);
}
static int cu_avgpool_forward(void *ctx, float *out, const float *in, int n, int c, int h, int w,
                              int size, int stride)
{
    return kernel_avgpool2d_forward_cuda(out, in, n, c, h, w, size, stride, ctx);
}
static int cu_avgpool_backward(void *ctx, float *din, const float *dout, int n, int c, int h,
                               int w, int size, int stride)
{
    return kernel_avgpool2d_backward_cuda(din, dout, n, c, h, w, size, stride, ctx);
}
static int cu_activation_forward(void *ctx, float *out, const float *in, size_t count,
                                 kernel_act act)
{
    return kernel_activation_forward_cuda(out, in, count, act, ctx);
}
static int cu_activation_backward(void *ctx, float *din, const float *dout, const float *out,
                                  size_t count, kernel_act act)
{
    return kernel_activation_backward_cuda(din, dout, out, count, act, ctx);
}
static int cu_dropout_forward(void *ctx, float *out, uint8_t *mask, const float *in, int n,
                              size_t per_sample, size_t elem_off, float p, uint64_t seed,
                              uint64_t stream, const int64_t *sample_ids)
{
    return kernel_dropout_forward_range_cuda(out, mask, in, n, per_sample, elem_off, p, seed,
                                             stream, sample_ids, ctx);
}
static int cu_dropout_backward(void *ctx, float *din, const float *dout, const uint8_t *mask,
                               size_t count, float p)
{
    if (!count) return 0;
    return kernel_dropout_backward_cuda(din, dout, mask, count, p, ctx);
}
static int cu_copy(void *ctx, float *dst, const float *src, size_t count)
{
    const kernel_cuda_ctx *k = ctx;
    if (count)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice,
                                   k->stream));
    return 0;
}

static int cu_add(void *ctx, float *dst, const float *src, size_t count)
{
    return kernel_add_cuda(dst, src, count, ctx);
}
static int cu_add_rows(void *ctx, float *y, const float *b, int rows, int width)
{
    return kernel_bias_add_cuda(y, b, rows, width, 1, ctx);
}
static int cu_layernorm_forward(void *ctx, float *out, float *mean, float *rstd, const float *x,
                                const float *gamma, const float *beta, int rows, int width)
{
    return kernel_layernorm_forward_cuda(out, mean, rstd, x, gamma, beta, rows, width, ctx);
}
static int cu_layernorm_backward(void *ctx, float *dx, float *dgamma, float *dbeta,
                                 const float *dy, const float *x, const float *mean,
                                 const float *rstd, const float *gamma, int rows, int width)
{
    return kernel_layernorm_backward_cuda(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows,
                                          width, ctx);
}
static int cu_gelu_forward(void *ctx, float *out, const float *in, size_t count)
{
    return kernel_gelu_forward_cuda(out, in, count, ctx);
}
static int cu_gelu_backward(void *ctx, float *din, const float *dout, const float *in,
                            size_t count)
{
    return kernel_gelu_backward_cuda(din, dout, in, count, ctx);
}
static int cu_embedding_forward(void *ctx, float *out, int32_t *tok, const float *ids,
                                const float *wte, const float *wpe, int n, int seq, int width,
                                int vocab)
{
    return kernel_embedding_forward_cuda(out, tok, ids, wte, wpe, n, seq, width, vocab, ctx);
}
static int cu_embedding_backward(void *ctx, float *dwte, float *dwpe, int32_t *tok,
                                 const float *dout, const float *ids, int n, int seq, int width,
                                 int vocab)
{
    return kernel_embedding_backward_cuda(dwte, dwpe, tok, dout, ids, n, seq, width, vocab,
                                          ctx);
}
static int cu_embedding_shard_forward(void *ctx, float *out, int32_t *tok, const float *ids,
                                      const float *wte, const float *wpe, int n, int seq,
                                      int width, int first, int vocab)
{
    return kernel_embedding_shard_forward_cuda(out, tok, ids, wte, wpe, n, seq, width, first,
                                               vocab, ctx);
}
static int cu_embedding_shard_backward(void *ctx, float *dwte, float *dwpe, int32_t *tok,
                                       const float *dout, const float *ids, int n, int seq,
                                       int width, int first, int vocab)
{
    return kernel_embedding_shard_backward_cuda(dwte, dwpe, tok, dout, ids, n, seq, width,
                                                first, vocab, ctx);
}
/* The fused attention keeps its logsumexp (and, backward, Δ) in the saved area the layer
 * sizes for the CPU's probabilities (batch·heads·seq², far more than it needs), and needs
 * no workspace. */
static int cu_attention_forward(void *ctx, float *y, float *probs, float *work, const float *qkv,
                                const kernel_attention_dims *d,
                                const kernel_attention_dropout *drop)
{
    (void)work;
    return kernel_attention_forward_cuda(y, probs, qkv, d, drop, ctx);
}
static int cu_attention_backward(void *ctx, float *dqkv, float *work, const float *dy,
                                 const float *qkv, const float *probs,
                                 const kernel_attention_dims *d,
                                 const kernel_attention_dropout *drop)
{
    (void)work;
    /* the saved area is the slot's device memory: its Δ part is written here */
    return kernel_attention_backward_cuda(dqkv, (float *)probs, dy, qkv, d, drop, ctx);
}

const layer_kernels layer_kernels_cuda = {
    .dense_forward = cu_dense_forward,
    .dense_backward = cu_dense_backward,
    .dense_backward_weight = cu_dense_backward_weight,
    .dense_backward_input = cu_dense_backward_input,
    .conv_forward = cu_conv_forward,
    .conv_backward = cu_conv_backward,
    .conv_backward_weight = cu_conv_backward_weight,
    .conv_backward_input = cu_conv_backward_input,
    .maxpool_forward = cu_maxpool_forward,
    .maxpool_backward = cu_maxpool_backward,
    .avgpool_forward = cu_avgpool_forward,
    .avgpool_backward = cu_avgpool_backward,
    .activation_forward = cu_activation_forward,
    .activation_backward = cu_activation_backward,
    .dropout_forward = cu_dropout_forward,
    .dropout_backward = cu_dropout_backward,
    .copy = cu_copy,
    .add = cu_add,
    .add_rows = cu_add_rows,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .gelu_forward = cu_gelu_forward,
    .gelu_backward = cu_gelu_backward,
    .embedding_forward = cu_embedding_forward,
    .embedding_backward = cu_embedding_backward,
    .embedding_shard_forward = cu_embedding_shard_forward,
    .embedding_shard_backward = cu_embedding_shard_backward,
    .attention_forward = cu_attention_forward,
    .attention_backward = cu_attention_backward,
};
