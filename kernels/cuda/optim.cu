/* Optimizer updates with exactly the operations and roundings of kernels/optim.c (which
 * reproduces torch.optim 1.13 bit for bit; its header comment lists which torch operations
 * are fused multiply-adds). Every operation is an explicit round-to-nearest intrinsic:
 * nvcc would otherwise fuse a·b + c where the CPU rounds twice, and __fsqrt_rn/__fdiv_rn
 * stay IEEE-exact whatever -use_fast_math or -prec-* flags a build adds. The scalars that
 * torch computes in double are computed here on the host, by the same code as optim.c. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

#include <math.h>

__global__ static void optim_sgd(float *param, const float *grad, size_t count, float neg_lr,
                                 float wd)
{
    CUDA_GRID_STRIDE(i, count)
    {
        const float g = wd != 0.0f ? __fmaf_rn(wd, param[i], grad[i]) : grad[i];
        param[i] = __fmaf_rn(neg_lr, g, param[i]);
    }
}

/* buf must be zero before the first step (then 0·μ + g clones g exactly, as torch). */
__global__ static void optim_momentum(float *param, float *buf, const float *grad,
                                      size_t count, float neg_lr, float momentum, float wd)
{
    CUDA_GRID_STRIDE(i, count)
    {
        const float p = param[i];
        const float g = wd != 0.0f ? __fmaf_rn(wd, p, grad[i]) : grad[i];
        const float b = __fadd_rn(__fmul_rn(buf[i], momentum), g);
        buf[i] = b;
        param[i] = __fmaf_rn(neg_lr, b, p);
    }
}

/* wd: Adam's L2 term (added to the gradient); decay: AdamW's factor 1 − lr·wd, applied to
 * the parameter first (1: none, as x·1 = x), as optim_adam_core on the CPU. */
typedef struct {
    float beta1, beta2, one_m_b1, one_m_b2, eps, wd, decay, neg_step_size, bc2_sqrt;
} optim_adam_consts;

__global__ static void optim_adam(float *param, float *m, float *v, const float *grad,
                                  size_t count, optim_adam_consts k)
{
    CUDA_GRID_STRIDE(i, count)
    {
        const float p = k.decay != 1.0f ? __fmul_rn(param[i], k.decay) : param[i];
        const float g = k.wd != 0.0f ? __fmaf_rn(k.wd, p, grad[i]) : grad[i];
        const float mi = __fmaf_rn(k.one_m_b1, g, __fmul_rn(m[i], k.beta1));
        const float vi = __fmaf_rn(__fmul_rn(k.one_m_b2, g), g, __fmul_rn(v[i], k.beta2));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(k.neg_step_size, mi), denom));
    }
}


__global__ static void add_inplace(float *dst, const float *src, size_t count)
{
    CUDA_GRID_STRIDE(i, count) { dst[i] = __fadd_rn(dst[i], src[i]); }
}

extern "C" int kernel_add_cuda(float *dst, const float *src, size_t count,
                               const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    add_inplace<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(dst, src, count);
    CUDA_CHECK_LAUNCH("add_inplace");
    return 0;
}

extern "C" int kernel_sgd_update_cuda(float *param, const float *grad, size_t count, float lr,
                                      float weight_decay, const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    optim_sgd<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(param, grad, count, -lr,
                                                                  weight_decay);
    CUDA_CHECK_LAUNCH("optim_sgd");
    return 0;
}

extern "C" int kernel_momentum_update_cuda(float *param, float *buf, const float *grad,
                                           size_t count, float lr, float momentum,
                                           float weight_decay, const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    optim_momentum<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(
        param, buf, grad, count, -lr, momentum, weight_decay);
    CUDA_CHECK_LAUNCH("optim_momentum");
    return 0;
}

/* Adam (l2 = its weight decay, decay 1) and AdamW (l2 0, decay its factor). */
static int adam_launch(float *param, float *m, float *v, const float *grad, size_t count,
                       float lr, float beta1, float beta2, float eps, float l2, float decay,
                       long step, const char *name, const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    if (step < 1)
        return pt_error_set("%s: step %ld, must start at 1", name, step);
    /* the same scalars as the CPU update, computed by the same function */
    const kernel_adam_scalars sc = kernel_adam_scalars_at(lr, beta1, beta2, step);
    optim_adam_consts k;
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.one_m_b1 = sc.one_m_b1;
    k.one_m_b2 = sc.one_m_b2;
    k.eps = eps;
    k.wd = l2;
    k.decay = decay;
    k.neg_step_size = sc.neg_step_size;
    k.bc2_sqrt = sc.bc2_sqrt;
    optim_adam<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(param, m, v, grad, count,
                                                                   k);
    CUDA_CHECK_LAUNCH("optim_adam");
    return 0;
}

extern "C" int kernel_adam_update_cuda(float *param, float *m, float *v, const float *grad,
                                       size_t count, float lr, float beta1, float beta2,
                                       float eps, float weight_decay, long step,
                                       const kernel_cuda_ctx *ctx)
{
    return adam_launch(param, m, v, grad, count, lr, beta1, beta2, eps, weight_decay, 1.0f,
                       step, "adam", ctx);
}

extern "C" int kernel_adamw_update_cuda(float *param, float *m, float *v, const float *grad,
                                        size_t count, float lr, float beta1, float beta2,
                                        float eps, float weight_decay, long step,
                                        const kernel_cuda_ctx *ctx)
{
    return adam_launch(param, m, v, grad, count, lr, beta1, beta2, eps, 0.0f,
                       kernel_adamw_decay_at(lr, weight_decay), step, "adamw", ctx);
}
