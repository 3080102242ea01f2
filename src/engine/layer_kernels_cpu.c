/* The CPU's layer_kernels (src/engine/layer_ops.h): kernels/kernels.h's, which cannot fail,
 * behind the device-neutral wrappers the shared layer loop calls. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/engine/layer_ops.h"

#include "kernels/bf16.h"
#include "src/base/error.h"

static int cpu_dense_forward(void *ctx, float *out, const float *in, const float *w,
                             const float *b, int n, int in_f, int out_f)
{
    kernel_dense_forward_cpu(out, in, w, b, n, in_f, out_f);
    return 0;
}
static int cpu_dense_backward(void *ctx, float *din, float *dw, float *db, const float *dout,
                              const float *in, const float *w, int n, int in_f, int out_f)
{
    kernel_dense_backward_cpu(din, dw, db, dout, in, w, n, in_f, out_f);
    return 0;
}
static int cpu_dense_backward_weight(void *ctx, float *dw, float *db, const float *dout,
                                     const float *in, int n, int in_f, int out_f)
{
    kernel_dense_backward_weight_cpu(dw, db, dout, in, n, in_f, out_f);
    return 0;
}
static int cpu_dense_backward_input(void *ctx, float *din, const float *dout, const float *w,
                                    int n, int in_f, int out_f)
{
    kernel_dense_backward_input_cpu(din, dout, w, n, in_f, out_f);
    return 0;
}
static int cpu_conv_forward(void *ctx, float *out, float *work, const float *in, const float *w,
                            const float *b, const kernel_conv2d_dims *d)
{
    kernel_conv2d_forward_cpu(out, work, in, w, b, d);
    return 0;
}
static int cpu_conv_backward(void *ctx, float *din, float *dw, float *db, float *work,
                             const float *dout, const float *in, const float *w,
                             const kernel_conv2d_dims *d)
{
    kernel_conv2d_backward_cpu(din, dw, db, work, dout, in, w, d);
    return 0;
}
static int cpu_conv_backward_weight(void *ctx, float *dw, float *db, float *work,
                                    const float *dout, const float *in,
                                    const kernel_conv2d_dims *d)
{
    kernel_conv2d_backward_weight_cpu(dw, db, work, dout, in, d);
    return 0;
}
static int cpu_conv_backward_input(void *ctx, float *din, float *work, const float *dout,
                                   const float *w, const kernel_conv2d_dims *d)
{
    kernel_conv2d_backward_input_cpu(din, work, dout, w, d);
    return 0;
}
static int cpu_maxpool_forward(void *ctx, float *out, int32_t *argmax, const float *in, int n,
                               int c, int h, int w, int size, int stride)
{
    kernel_maxpool2d_forward_cpu(out, argmax, in, n, c, h, w, size, stride);
    return 0;
}
static int cpu_maxpool_backward(void *ctx, float *din, const float *dout, const int32_t *argmax,
                                int n, int c, int h, int w, int size, int stride)
{
    kernel_maxpool2d_backward_cpu(din, dout, argmax, n, c, h, w, size, stride);
    return 0;
}
static int cpu_avgpool_forward(void *ctx, float *out, const float *in, int n, int c, int h,
                               int w, int size, int stride)
{
    kernel_avgpool2d_forward_cpu(out, in, n, c, h, w, size, stride);
    return 0;
}
static int cpu_avgpool_backward(void *ctx, float *din, const float *dout, int n, int c, int h,
                                int w, int size, int stride)
{
    kernel_avgpool2d_backward_cpu(din, dout, n, c, h, w, size, stride);
    return 0;
}
static int cpu_activation_forward(void *ctx, float *out, const float *in, size_t count,
                                  kernel_act act)
{
    kernel_activation_forward_cpu(out, in, count, act);
    return 0;
}
static int cpu_activation_backward(void *ctx, float *din, const float *dout, const float *out,
                                   size_t count, kernel_act act)
{
    kernel_activation_backward_cpu(din, dout, out, count, act);
    return 0;
}
static int cpu_dropout_forward(void *ctx, float *out, uint8_t *mask, const float *in, int n,
                               size_t per_sample, size_t elem_off, float p, uint64_t seed,
                               uint64_t stream, const int64_t *sample_ids)
{
    kernel_dropout_forward_range_cpu(out, mask, in, n, per_sample, elem_off, p, seed, stream,
                                     sample_ids);
    return 0;
}
static int cpu_dropout_backward(void *ctx, float *din, const float *dout, const uint8_t *mask,
                                size_t count, float p)
{
    kernel_dropout_backward_cpu(din, dout, mask, count, p);
    return 0;
}
static int cpu_copy(void *ctx, float *dst, const float *src, size_t count)
{
    memcpy(dst, src, count * sizeof(float));
    return 0;
}

static int cpu_add(void *ctx, float *dst, const float *src, size_t count)
{
    kernel_add_cpu(dst, src, count);
    return 0;
}
static int cpu_layernorm_forward(void *ctx, float *out, float *mean, float *rstd, const float *x,
                                 const float *gamma, const float *beta, int rows, int width)
{
    kernel_layernorm_forward_cpu(out, mean, rstd, x, gamma, beta, rows, width);
    return 0;
}
static int cpu_layernorm_backward(void *ctx, float *dx, float *dgamma, float *dbeta,
                                  const float *dy, const float *x, const float *mean,
                                  const float *rstd, const float *gamma, int rows, int width)
{
    kernel_layernorm_backward_cpu(dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, width);
    return 0;
}
static int cpu_gelu_forward(void *ctx, float *out, const float *in, size_t count)
{
    kernel_gelu_forward_cpu(out, in, count);
    return 0;
}
static int cpu_gelu_backward(void *ctx, float *din, const float *dout, const float *in,
                             size_t count)
{
    kernel_gelu_backward_cpu(din, dout, in, count);
    return 0;
}
/* Token ids from their float form; one outside [0, vocab) becomes −1, which the kernels turn
 * into a NaN row and no gradient (the data loader has already refused such a token). */
static void token_ids(int32_t *tok, const float *ids, size_t count, int vocab)
{
    for (size_t i = 0; i < count; i++)
        tok[i] = ids[i] >= 0 && ids[i] < (float)vocab ? (int32_t)ids[i] : -1;
}
static int cpu_embedding_forward(void *ctx, float *out, int32_t *tok, const float *ids,
                                 const float *wte, const float *wpe, int n, int seq, int width,
                                 int vocab)
{
    token_ids(tok, ids, (size_t)n * seq, vocab);
    kernel_embedding_forward_cpu(out, tok, wte, wpe, n, seq, width, vocab);
    return 0;
}
static int cpu_embedding_backward(void *ctx, float *dwte, float *dwpe, int32_t *tok,
                                  const float *dout, const float *ids, int n, int seq,
                                  int width, int vocab)
{
    token_ids(tok, ids, (size_t)n * seq, vocab);
    kernel_embedding_backward_cpu(dwte, dwpe, dout, tok, n, seq, width, vocab);
    return 0;
}
/* Token ids as this shard's rows: [first, first + vocab) from 0, −1 for another's. */
static void token_rows(int32_t *tok, const float *ids, size_t count, int first, int vocab)
{
    for (size_t i = 0; i < count; i++)
        tok[i] = ids[i] >= (float)first && ids[i] < (float)first + (float)vocab
                     ? (int32_t)ids[i] - first
                     : -1;
}
static int cpu_embedding_shard_forward(void *ctx, float *out, int32_t *tok, const float *ids,
                                       const float *wte, const float *wpe, int n, int seq,
                                       int width, int first, int vocab)
{
    token_rows(tok, ids, (size_t)n * seq, first, vocab);
    for (size_t r = 0; r < (size_t)n * seq; r++) {
        float *o = out + r * width;
        const float *e = tok[r] >= 0 ? wte + (size_t)tok[r] * width : NULL;
        const float *p = wpe ? wpe + (r % (size_t)seq) * width : NULL;
        /* e + p as the whole kernel adds them; the ranks' zeros add nothing */
        for (int j = 0; j < width; j++) o[j] = e && p ? e[j] + p[j] : e ? e[j] : p ? p[j] : 0.0f;
    }
    return 0;
}
static int cpu_embedding_shard_backward(void *ctx, float *dwte, float *dwpe, int32_t *tok,
                                        const float *dout, const float *ids, int n, int seq,
                                        int width, int first, int vocab)
{
    token_rows(tok, ids, (size_t)n * seq, first, vocab);
    kernel_embedding_backward_cpu(dwte, dwpe, dout, tok, n, seq, width, vocab);
    return 0;
}
static int cpu_attention_forward(void *ctx, float *y, float *probs, float *work,
                                 const float *qkv, const kernel_attention_dims *d,
                                 const kernel_attention_dropout *drop)
{
    size_t C = (size_t)d->heads * d->head_dim;
    kernel_attention_forward_dropout_cpu(y, probs, work, qkv, qkv + C, qkv + 2 * C, d, drop);
    return 0;
}
static int cpu_attention_backward(void *ctx, float *dqkv, float *work, const float *dy,
                                  const float *qkv, const float *probs,
                                  const kernel_attention_dims *d,
                                  const kernel_attention_dropout *drop)
{
    size_t C = (size_t)d->heads * d->head_dim;
    kernel_attention_backward_dropout_cpu(dqkv, dqkv + C, dqkv + 2 * C, work, dy, qkv,
                                          qkv + C, qkv + 2 * C, probs, d, drop);
    return 0;
}

const layer_kernels layer_kernels_cpu = {
    .dense_forward = cpu_dense_forward,
    .dense_backward = cpu_dense_backward,
    .dense_backward_weight = cpu_dense_backward_weight,
    .dense_backward_input = cpu_dense_backward_input,
    .conv_forward = cpu_conv_forward,
    .conv_backward = cpu_conv_backward,
    .conv_backward_weight = cpu_conv_backward_weight,
    .conv_backward_input = cpu_conv_backward_input,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
    .avgpool_forward = cpu_avgpool_forward,
    .avgpool_backward = cpu_avgpool_backward,
    .activation_forward = cpu_activation_forward,
    .activation_backward = cpu_activation_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .copy = cpu_copy,
    .add = cpu_add,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .embedding_shard_forward = cpu_embedding_shard_forward,
    .embedding_shard_backward = cpu_embedding_shard_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
};

/* ---- the dense and convolutions' products in bf16 ---- */

static int bf16_done(int rc)
{
    if (rc) {
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        exit(1);
    }
    return 0;
}
static int bf16_dense_forward(void *ctx, float *out, const float *in, const float *w,
                              const float *b, int n, int in_f, int out_f)
{
    return bf16_done(kernel_dense_forward_bf16(out, in, w, b, n, in_f, out_f));
}
static int bf16_dense_backward(void *ctx, float *din, float *dw, float *db, const float *dout,
                               const float *in, const float *w, int n, int in_f, int out_f)
{
    return bf16_done(kernel_dense_backward_bf16(din, dw, db, dout, in, w, n, in_f, out_f));
}
static int bf16_dense_backward_weight(void *ctx, float *dw, float *db, const float *dout,
                                      const float *in, int n, int in_f, int out_f)
{
    return bf16_done(kernel_dense_backward_weight_bf16(dw, db, dout, in, n, in_f, out_f));
}
static int bf16_dense_backward_input(void *ctx, float *din, const float *dout, const float *w,
                                     int n, int in_f, int out_f)
{
    return bf16_done(kernel_dense_backward_input_bf16(din, dout, w, n, in_f, out_f));
}

/* a convolution's three products in bf16, its im2col and sums as in fp32 */
static kernel_conv2d_dims bf16_dims(const kernel_conv2d_dims *d)
{
    kernel_conv2d_dims b = *d;
    b.bf16 = 1;
    return b;
}
static int bf16_conv_forward(void *ctx, float *out, float *work, const float *in,
                             const float *w, const float *b, const kernel_conv2d_dims *d)
{
    kernel_conv2d_dims e = bf16_dims(d);
    return bf16_done(kernel_conv2d_forward_cpu(out, work, in, w, b, &e));
}
static int bf16_conv_backward(void *ctx, float *din, float *dw, float *db, float *work,
                              const float *dout, const float *in, const float *w,
                              const kernel_conv2d_dims *d)
{
    kernel_conv2d_dims e = bf16_dims(d);
    return bf16_done(kernel_conv2d_backward_cpu(din, dw, db, work, dout, in, w, &e));
}
static int bf16_conv_backward_weight(void *ctx, float *dw, float *db, float *work,
                                     const float *dout, const float *in,
                                     const kernel_conv2d_dims *d)
{
    kernel_conv2d_dims e = bf16_dims(d);
    return bf16_done(kernel_conv2d_backward_weight_cpu(dw, db, work, dout, in, &e));
}
static int bf16_conv_backward_input(void *ctx, float *din, float *work, const float *dout,
                                    const float *w, const kernel_conv2d_dims *d)
{
    kernel_conv2d_dims e = bf16_dims(d);
    return bf16_done(kernel_conv2d_backward_input_cpu(din, work, dout, w, &e));
}

static layer_kernels bf16_set;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

static void bf16_init(void)
{
    bf16_set = layer_kernels_cpu;
    bf16_set.dense_forward = bf16_dense_forward;
    bf16_set.dense_backward = bf16_dense_backward;
    bf16_set.dense_backward_weight = bf16_dense_backward_weight;
    bf16_set.dense_backward_input = bf16_dense_backward_input;
    bf16_set.conv_forward = bf16_conv_forward;
    bf16_set.conv_backward = bf16_conv_backward;
    bf16_set.conv_backward_weight = bf16_conv_backward_weight;
    bf16_set.conv_backward_input = bf16_conv_backward_input;
}

const layer_kernels *layer_kernels_cpu_bf16(void)
{
    pthread_once(&bf16_once, bf16_init);
    return &bf16_set;
}
