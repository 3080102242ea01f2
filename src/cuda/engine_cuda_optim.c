/* The CUDA engine's optimizer updates (kernels/cuda/kernels_cuda.h) as the shared update's
 * device set (stage_optim_step, src/engine/stage_plan.h); ctx is the engine's
 * kernel_cuda_ctx. */
#include "kernels/cuda/kernels_cuda.h"
#include "src/cuda/engine_cuda_impl.h"

static int cu_sgd(void *ctx, float *param, const float *grad, size_t count, float lr,
                  float weight_decay)
{
    return kernel_sgd_update_cuda(param, grad, count, lr, weight_decay, ctx);
}

static int cu_momentum(void *ctx, float *param, float *buf, const float *grad, size_t count,
                       float lr, float momentum, float weight_decay)
{
    return kernel_momentum_update_cuda(param, buf, grad, count, lr, momentum, weight_decay, ctx);
}

static int cu_adam(void *ctx, float *param, float *m, float *v, const float *grad, size_t count,
                   float lr, float beta1, float beta2, float eps, float weight_decay, long step)
{
    return kernel_adam_update_cuda(param, m, v, grad, count, lr, beta1, beta2, eps, weight_decay,
                                   step, ctx);
}

static int cu_adamw(void *ctx, float *param, float *m, float *v, const float *grad,
                    size_t count, float lr, float beta1, float beta2, float eps,
                    float weight_decay, long step)
{
    return kernel_adamw_update_cuda(param, m, v, grad, count, lr, beta1, beta2, eps,
                                    weight_decay, step, ctx);
}

const optim_kernels optim_kernels_cuda = {.sgd = cu_sgd, .momentum = cu_momentum,
                                                 .adam = cu_adam, .adamw = cu_adamw};
