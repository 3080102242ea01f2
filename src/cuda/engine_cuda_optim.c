/* The CUDA engine's optimizer: its updates (kernels/cuda/kernels_cuda.h) as the shared
 * update's device set (stage_optim_step, src/engine/stage_plan.h; ctx is the engine's
 * kernel_cuda_ctx), and its state: the moments, whole or ZeRO-1's runs (optim_shard), their
 * checkpoint copies, the parameters' all-gather mirror and the memory figures. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "src/base/error.h"
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

/* ------------------------------------------------------------ optimizer state ---- */

/* The whole moments in their own device allocation, zeroed on the compute stream: at the
 * first update or write_state (never under ZeRO, whose runs have theirs). */
int engine_cuda_alloc_moments(engine *e, cuda_engine *c)
{
    if (c->omem || c->zruns) return 0;
    size_t block = stage_round_up(e->param_count * sizeof(float));
    cudaError_t r = cudaMalloc(&c->omem, block ? 2 * block : STAGE_ALIGN);
    if (r != cudaSuccess) {
        c->omem = NULL;
        (void)cudaGetLastError();
        return pt_error_set("CUDA engine, layers %d..%d: cannot allocate %zu bytes of device "
                            "memory for the optimizer's moments: cudaMalloc: %s",
                            c->plan.first, c->plan.last - 1, 2 * block, cudaGetErrorString(r));
    }
    c->opt_m = c->omem;
    c->opt_v = (float *)((char *)c->omem + block);
    CUDA_CHECK(cudaMemsetAsync(c->omem, 0, block ? 2 * block : STAGE_ALIGN, c->ctx.stream));
    return 0;
}

/* ZeRO: the runs' moments between the whole host arrays' positions and the compact device
 * ones, on the compute stream (the caller waits). */
static int copy_runs(cuda_engine *c, float *whole, float *compact, int to_whole)
{
    size_t k = 0;
    for (int i = 0; i < c->n_zruns; i++) {
        const engine_run *r = &c->zruns[i];
        if (r->count && to_whole)
            CUDA_CHECK(cudaMemcpyAsync(whole + r->off, compact + k, r->count * sizeof(float),
                                       cudaMemcpyDeviceToHost, c->ctx.stream));
        else if (r->count)
            CUDA_CHECK(cudaMemcpyAsync(compact + k, whole + r->off, r->count * sizeof(float),
                                       cudaMemcpyHostToDevice, c->ctx.stream));
        k += r->count;
    }
    return 0;
}

/* The optimizer's moments, copied like the parameters; the update count lives on the host.
 * Under ZeRO only the runs' positions are read (the others stay as they were); before any
 * update the moments are zero. */
int engine_cuda_read_state(engine *e, float *m, float *v, long *updates)
{
    cuda_engine *c = engine_cuda_impl(e);
    *updates = c->step;
    if (!e->param_count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (c->zruns) {
        if (copy_runs(c, m, c->zm, 1) || copy_runs(c, v, c->zv, 1)) return -1;
    } else if (c->omem) {
        CUDA_CHECK(cudaMemcpyAsync(m, c->opt_m, e->param_count * sizeof(float),
                                   cudaMemcpyDeviceToHost, c->ctx.stream));
        CUDA_CHECK(cudaMemcpyAsync(v, c->opt_v, e->param_count * sizeof(float),
                                   cudaMemcpyDeviceToHost, c->ctx.stream));
    } else {
        memset(m, 0, e->param_count * sizeof(float));
        memset(v, 0, e->param_count * sizeof(float));
    }
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

int engine_cuda_write_state(engine *e, const float *m, const float *v, long updates)
{
    cuda_engine *c = engine_cuda_impl(e);
    c->step = updates;
    if (!e->param_count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (c->zruns) {
        if (copy_runs(c, (float *)m, c->zm, 0) || copy_runs(c, (float *)v, c->zv, 0))
            return -1;
    } else {
        if (engine_cuda_alloc_moments(e, c)) return -1;
        CUDA_CHECK(cudaMemcpyAsync(c->opt_m, m, e->param_count * sizeof(float),
                                   cudaMemcpyHostToDevice, c->ctx.stream));
        CUDA_CHECK(cudaMemcpyAsync(c->opt_v, v, e->param_count * sizeof(float),
                                   cudaMemcpyHostToDevice, c->ctx.stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

/* ZeRO-1 (engine.h optim_shard): the runs' compact moments on the device, zeroed, and the
 * pinned parameter mirror the all-gather writes into. */
int engine_cuda_optim_shard(engine *e, const engine_run *runs, int n)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (c->zruns || c->omem)
        return pt_error_set("CUDA engine: the optimizer's state is already allocated");
    size_t total = engine_runs_count(runs, n);
    size_t half = stage_round_up(total * sizeof(float));
    size_t pbytes = stage_round_up(e->param_count * sizeof(float));
    c->zruns = malloc((size_t)(n > 0 ? n : 1) * sizeof *c->zruns);
    if (!c->zruns) return pt_error_set("CUDA engine: out of host memory");
    memcpy(c->zruns, runs, (size_t)n * sizeof *runs);
    c->n_zruns = n;
    CUDA_CHECK(cudaSetDevice(c->device));
    cudaError_t r = cudaMalloc(&c->zmem, half ? 2 * half : STAGE_ALIGN);
    if (r != cudaSuccess) {
        c->zmem = NULL;
        (void)cudaGetLastError();
        return pt_error_set("CUDA engine: cannot allocate %zu bytes of device memory for the "
                            "optimizer's shard (%zu parameters): cudaMalloc: %s", 2 * half,
                            total, cudaGetErrorString(r));
    }
    c->zm = c->zmem;
    c->zv = (float *)((char *)c->zmem + half);
    r = cudaHostAlloc((void **)&c->h_params, pbytes ? pbytes : STAGE_ALIGN,
                      cudaHostAllocDefault);
    if (r != cudaSuccess) {
        c->h_params = NULL;
        (void)cudaGetLastError();
        return pt_error_set("CUDA engine: cannot allocate %zu bytes of pinned host memory for "
                            "the parameters' all-gather: cudaHostAlloc: %s", pbytes,
                            cudaGetErrorString(r));
    }
    CUDA_CHECK(cudaMemsetAsync(c->zmem, 0, half ? 2 * half : STAGE_ALIGN, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

/* ZeRO: this replica's runs of the parameters copied into the pinned mirror, queued on the
 * compute stream after everything queued there (its step). */
int engine_cuda_shard_to_host(cuda_engine *c)
{
    for (int i = 0; i < c->n_zruns; i++) {
        const engine_run *r = &c->zruns[i];
        if (r->count)
            CUDA_CHECK(cudaMemcpyAsync(c->h_params + r->off, c->params + r->off,
                                       r->count * sizeof(float), cudaMemcpyDeviceToHost,
                                       c->ctx.stream));
    }
    return 0;
}

/* ZeRO: the pinned mirror with this replica's runs copied out after everything queued (its
 * step), for the in-place all-gather to send them and write the other replicas' runs. */
int engine_cuda_params_host(engine *e, float **host)
{
    cuda_engine *c = engine_cuda_impl(e);
    *host = NULL;
    if (!c->h_params)
        return pt_error_set("CUDA engine: params_host before optim_shard (only ZeRO gathers "
                            "the parameters)");
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_shard_to_host(c)) return -1;
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    *host = c->h_params;
    return 0;
}

/* ZeRO: the gathered parameters to the device, queued on the compute stream before the next
 * forward. The mirror is not written again before the next params_host, which waits for
 * this copy (same stream). */
int engine_cuda_params_commit(engine *e)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!c->h_params) return pt_error_set("CUDA engine: params_commit before optim_shard");
    if (!e->param_count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaMemcpyAsync(c->params, c->h_params, e->param_count * sizeof(float),
                               cudaMemcpyHostToDevice, c->ctx.stream));
    return 0;
}

/* --json's memory: the device arrays as allocated: the parameters (ZeRO-3: the most mapped
 * at the end of a layer's pass, kept granules counted); the gradients with mb_grads and the
 * pieces kept apart (ZeRO-2: the most mapped at any time); the moments, whole or the
 * runs'. */
void engine_cuda_state_bytes(const engine *e, size_t *params, size_t *grads, size_t *optim)
{
    const cuda_engine *c = e->impl;
    size_t block = stage_round_up(e->param_count * sizeof(float));
    *params = c->zero3 ? c->params_peak : block;
    *grads = c->zero2 ? c->gv.peak : (size_t)(1 + c->pieces) * block;
    size_t mine = c->zruns ? engine_runs_count(c->zruns, c->n_zruns) : 0;
    if (c->zruns) *optim = 2 * stage_round_up(mine * sizeof(float));
    else *optim = c->omem ? 2 * block : 0;
}
