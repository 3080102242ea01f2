/* CPU kernels: the reference implementation of every operation pipetrain trains with.
 *
 * Conventions (shared with the CUDA twins in kernels/cuda/kernels_cuda.h,
 * kernel_*_cuda(..., ctx), whose extra rules that header states):
 * - float32, row-major, activations NCHW; dense weights [out, in], conv weights
 *   [filters, channels, k, k], biases [out] (PyTorch's layouts).
 * - Argument order: outputs, inputs, weights, sizes.
 * - Parameter gradients ACCUMULATE (+=): micro-batches sum into one gradient in order.
 *   Input gradients (din) are OVERWRITTEN; din may be NULL when nobody needs it.
 * - Kernels never allocate; scratch space is passed in (see *_workspace_floats).
 * - Results depend only on the inputs and on the BLAS thread count.
 */
#ifndef PT_KERNELS_H
#define PT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KERNEL_ACT_LINEAR = 0,
    KERNEL_ACT_RELU,
    KERNEL_ACT_SIGMOID,
    KERNEL_ACT_TANH,
} kernel_act;

/* ---- dense: out[n, out_f] = in[n, in_f] · w[out_f, in_f]^T + b ---- */
/* OpenBLAS's own threads for the products: sets n, returns the count it had. A rank of
 * train, and every profile of layer times, multiplies on one thread (its workers split the
 * micro-batch instead); OpenBLAS's threads would otherwise spin on the cores they share. */
int kernel_blas_threads(int n);
/* The name of the kernels OpenBLAS chose when it loaded ("SkylakeX", "Prescott", ...). */
const char *kernel_blas_core(void);
/* The OPENBLAS_CORETYPE that would run faster kernels than the ones chosen, NULL where the
 * choice stands: only a fallback or pre-AVX2 core on a CPU with AVX2 or AVX-512 is replaced
 * (kernels/blas_core.c). It takes effect in a new image of the process. */
const char *kernel_blas_core_upgrade(void);
/* Starts the process again, once, where OpenBLAS's choices at load need undoing: with
 * OPENBLAS_CORETYPE where kernel_blas_core_upgrade has better kernels, and with
 * OPENBLAS_NUM_THREADS=1 where OpenBLAS started a pool of threads (a user's own values
 * stand). Returns where neither applies, or where the exec failed. For main (pipetrain's,
 * and the unit tests' through a constructor: tests/lib/blas_start.c). */
void kernel_blas_restart(char **argv);

void kernel_dense_forward_cpu(float *out, const float *in, const float *w, const float *b,
                              int n, int in_f, int out_f);
/* dw += dout^T · in, db += Σ_n dout, din = dout · w (skipped when din is NULL). */
void kernel_dense_backward_cpu(float *din, float *dw, float *db, const float *dout,
                               const float *in, const float *w, int n, int in_f, int out_f);
/* Its two halves (zero-bubble schedules run them apart): the weight gradient (dw += dout^T ·
 * in, db += column sums) and the input gradient (din = dout · w). Together they are the call
 * above, bit for bit. */
void kernel_dense_backward_weight_cpu(float *dw, float *db, const float *dout, const float *in,
                                      int n, int in_f, int out_f);
void kernel_dense_backward_input_cpu(float *din, const float *dout, const float *w, int n,
                                     int in_f, int out_f);
/* db[u0 + j] += Σ_i dout[i, u0 + j] for j < units, in float32 with the rows in order: the
 * bias gradient of every dense kernel, fp32 and bf16 (kernels/bf16.h) alike. */
void kernel_dense_bias_grad_cpu(float *db, const float *dout, int n, int out_f, int u0,
                                int units);
/* The weight gradient of output units [u0, u0 + units) alone, written (not added):
 * dw[u0.., :] = dout[:, u0..]^T · in, db[u0..] = column sums of dout (rows in order). The
 * batched weight gradient forms a layer's in fixed tiles of units this way. */
void kernel_dense_weight_grad_units_cpu(float *dw, float *db, const float *dout, const float *in,
                                        int n, int in_f, int out_f, int u0, int units);

/* ---- 2-D convolution (cross-correlation, as torch.nn.Conv2d), square kernel ---- */
typedef struct {
    int n, c, h, w;          /* input batch, channels, height, width */
    int filters, size;       /* output channels, kernel size */
    int stride, pad;         /* zero padding on every side */
    int bf16;                /* the products in bf16 (kernels/bf16.h), else fp32 (sgemm) */
} kernel_conv2d_dims;

/* Output height/width: (h + 2·pad − size) / stride + 1. */
int kernel_conv2d_out_h(const kernel_conv2d_dims *d);
int kernel_conv2d_out_w(const kernel_conv2d_dims *d);
/* Floats of scratch the forward and backward calls need for these dims. */
size_t kernel_conv2d_workspace_floats(const kernel_conv2d_dims *d);
/* The four return 0, or −1 with pt_error where a bf16 product failed (d->bf16). */
int kernel_conv2d_forward_cpu(float *out, float *work, const float *in, const float *w,
                              const float *b, const kernel_conv2d_dims *d);
int kernel_conv2d_backward_cpu(float *din, float *dw, float *db, float *work,
                                const float *dout, const float *in, const float *w,
                                const kernel_conv2d_dims *d);
/* Its two halves, each bit for bit what the call above computes for its outputs (the
 * weight half rebuilds im2col, as the fused call does). */
int kernel_conv2d_backward_weight_cpu(float *dw, float *db, float *work, const float *dout,
                                       const float *in, const kernel_conv2d_dims *d);
int kernel_conv2d_backward_input_cpu(float *din, float *work, const float *dout,
                                      const float *w, const kernel_conv2d_dims *d);

/* ---- pooling, no padding, output (h − size) / stride + 1 (floor), as torch ---- */
/* argmax[i] is the index inside the input plane (0 .. h·w−1) of the first maximum. */
void kernel_maxpool2d_forward_cpu(float *out, int32_t *argmax, const float *in,
                                  int n, int c, int h, int w, int size, int stride);
void kernel_maxpool2d_backward_cpu(float *din, const float *dout, const int32_t *argmax,
                                   int n, int c, int h, int w, int size, int stride);
void kernel_avgpool2d_forward_cpu(float *out, const float *in,
                                  int n, int c, int h, int w, int size, int stride);
void kernel_avgpool2d_backward_cpu(float *din, const float *dout,
                                   int n, int c, int h, int w, int size, int stride);

/* ---- element-wise activations (out may alias in; din may alias dout) ---- */
void kernel_activation_forward_cpu(float *out, const float *in, size_t count, kernel_act act);
/* Derivative expressed through the forward OUTPUT y: relu y>0, sigmoid y(1−y), tanh 1−y². */
void kernel_activation_backward_cpu(float *din, const float *dout, const float *out,
                                    size_t count, kernel_act act);

/* ---- inverted dropout with a counter-based generator ----
 * Sample s (its index in the whole data set, so the mask does not depend on how the batch
 * was split) keeps element e when uniform(seed, stream, s, e) < 1 − p; kept elements are
 * scaled by 1 / (1 − p). mask[i] is 1 for kept, 0 for dropped. */
void kernel_dropout_forward_cpu(float *out, uint8_t *mask, const float *in, int n,
                                size_t per_sample, float p, uint64_t seed, uint64_t stream,
                                const int64_t *sample_ids);
/* The same for rows that hold elements [elem_off, elem_off + per_sample) of each sample's
 * whole vector (a shard of it): element e of a row uses the counter
 * (sample_id << 32) | (elem_off + e), so the rows equal those columns of the whole-vector
 * result. kernel_dropout_forward_cpu is this with elem_off = 0. */
void kernel_dropout_forward_range_cpu(float *out, uint8_t *mask, const float *in, int n,
                                      size_t per_sample, size_t elem_off, float p,
                                      uint64_t seed, uint64_t stream, const int64_t *sample_ids);
void kernel_dropout_backward_cpu(float *din, const float *dout, const uint8_t *mask,
                                 size_t count, float p);

/* ---- softmax cross-entropy over `classes` logits per sample ----
 * Returns the SUM over the n samples of −log softmax(logits)[label], in double.
 * dlogits (may be NULL) = (softmax − onehot) · grad_scale; grad_scale is 1 / (whole
 * batch size) so that micro-batches give the gradient of the batch mean.
 * *correct (may be NULL) receives the number of samples whose first argmax is the label.
 * A language model's loss is this call over every position: logits [batch·seq, vocab],
 * targets [batch·seq], grad_scale 1 / (tokens in the whole batch); its mean is the sum
 * divided by those tokens (F.cross_entropy's default reduction). */
double kernel_softmax_xent_cpu(float *dlogits, int *correct, const float *logits,
                               const int32_t *labels, int n, int classes, float grad_scale);

/* The same loss over logits cut by vocabulary (Megatron's vocabulary-parallel
 * cross-entropy): one rank holds columns [first, first + Vr) of each of `rows` rows, and the
 * phases run around two all-gathers over the T ranks (rank by rank). max: mine[2i], [2i+1] =
 * the row's largest logit here and its first column (global). sums: from all (every rank's
 * pairs) the row's largest and its column into ma[2i], [2i+1] (the first rank's on a tie:
 * the whole kernel's first argmax); mine[3i..3i+2] = the sum of exponentials against it (a
 * double sent as two floats) and the target's logit (0 where another rank holds it);
 * dlogits (may be NULL) gets the exponentials. finish: from all (every rank's triples) the
 * loss summed over the rows (NaN for a label outside [0, V)), *correct, and dlogits' columns
 * of the gradient times grad_scale. Not bit for bit the whole kernel (the sums are cut).
 * The CPU stage (src/cpu/stage_loss.c) and the mock CUDA runtime run these; dlogits may be
 * the logits' own storage. */
void kernel_xent_shard_max_cpu(float *mine, const float *logits, int rows, int Vr, int first);
void kernel_xent_shard_sums_cpu(float *mine, float *dlogits, float *ma, const float *all,
                                const float *logits, const int32_t *labels, int rows, int Vr,
                                int first, int T);
double kernel_xent_shard_finish_cpu(float *dlogits, int *correct, const float *all,
                                    const float *ma, const int32_t *labels, int rows, int Vr,
                                    int first, int V, int T, float grad_scale);

/* dst += src, element by element: a micro-batch's gradient added to the step's sum. */
void kernel_add_cpu(float *dst, const float *src, size_t count);

/* ---- optimizers, exactly as torch.optim (1.13, single-tensor path) ----
 * weight_decay adds wd·p to the gradient first (L2). step is 1 on the first update. */
void kernel_sgd_update_cpu(float *param, const float *grad, size_t count, float lr,
                           float weight_decay);
void kernel_momentum_update_cpu(float *param, float *buf, const float *grad, size_t count,
                                float lr, float momentum, float weight_decay);
void kernel_adam_update_cpu(float *param, float *m, float *v, const float *grad, size_t count,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            long step);

/* torch.optim.AdamW: decoupled weight decay p ← p·(1 − lr·wd) first (kernel_adamw_decay_at),
 * then the Adam update above without the L2 term. m and v must be zero before step 1. */
void kernel_adamw_update_cpu(float *param, float *m, float *v, const float *grad, size_t count,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             long step);
/* AdamW's decay factor 1 − lr·wd, computed in double from the decimals as torch does. */
float kernel_adamw_decay_at(float lr, float weight_decay);

/* Adam's per-step scalars, computed as torch does: from the decimals the user wrote (0.999,
 * 1e-3: torch keeps them as Python doubles), in double, with a float32 step counter.
 * Shared by the CPU and CUDA updates so that both round identically. */
typedef struct {
    float one_m_b1, one_m_b2; /* 1 − β1, 1 − β2 */
    float neg_step_size;      /* −lr / (1 − β1^t) */
    float bc2_sqrt;           /* sqrt(1 − β2^t) */
} kernel_adam_scalars;
kernel_adam_scalars kernel_adam_scalars_at(float lr, float beta1, float beta2, long step);

/* ---- initialisation: U(−bound, bound) from the counter-based generator ---- */
void kernel_init_uniform_cpu(float *out, size_t count, float bound, uint64_t seed,
                             uint64_t stream);
/* out[i] = what kernel_init_uniform_cpu writes at index first + i, for any first: a slice
 * [first, first + count) of the whole tensor. kernel_init_uniform_cpu is this with first = 0. */
/* Elements [first, first + count) of N(0, std²) (rng_normal_at, times std in double, rounded
 * to float once): GPT-2's initialisation. */
void kernel_init_normal_range_cpu(float *out, size_t first, size_t count, double std,
                                  uint64_t seed, uint64_t stream);
void kernel_init_uniform_range_cpu(float *out, size_t first, size_t count, float bound,
                                   uint64_t seed, uint64_t stream);

/* ---- small helpers ---- */
/* y = bytes / 255 (input pixels). */
void kernel_bytes_to_float_cpu(float *out, const uint8_t *in, size_t count);

#ifdef __cplusplus
}
#endif

/* Layer norm, GELU, embedding, causal attention, gradient-norm helpers. */
#include "kernels/kernels_transformer.h"

#endif
