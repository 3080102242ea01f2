/* The CPU stage's state (src/cpu/stage.h): the parameters' initial values, the optimizer's
 * moments and step, the gradients' zeroing and their backed bytes. */
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/base/pages.h"
#include "src/cpu/stage.h"
#include "src/cpu/stage_impl.h"
#include "src/engine/layer_ops.h"

int stage_alloc_optim(stage *s)
{
    if (s->opt_memory) return 0;
    size_t block = stage_round_up(s->plan.param_count * sizeof(float)) / sizeof(float);
    s->opt_memory = stage_alloc_zeroed(2 * block * sizeof(float));
    if (!s->opt_memory)
        return pt_error_set("out of memory for the optimizer's state (%zu parameters)",
                            s->plan.param_count);
    s->opt_m = s->opt_memory;
    s->opt_v = s->opt_memory + block;
    return 0;
}

static int draw_cpu(void *ctx, float *dst, size_t first, size_t count, layer_init kind,
                    double scale, uint64_t seed, uint64_t stream)
{
    switch (kind) {
    case LAYER_INIT_TORCH:
        kernel_init_uniform_range_cpu(dst, first, count, (float)scale, seed, stream);
        break;
    case LAYER_INIT_NORMAL:
        kernel_init_normal_range_cpu(dst, first, count, scale, seed, stream);
        break;
    default:
        for (size_t i = 0; i < count; i++) dst[i] = kind == LAYER_INIT_ONES ? 1.0f : 0.0f;
    }
    return 0;
}

void stage_init_params(stage *s, uint64_t seed)
{
    int failed;
    (void)stage_plan_init_params(&s->plan, s->params, seed, draw_cpu, NULL, &failed);
    s->step = 0;
}

void stage_zero_grad(stage *s)
{
    if (s->release_zero) pages_zero(s->grads, s->plan.param_count * sizeof(float));
    else memset(s->grads, 0, s->plan.param_count * sizeof(float));
    stage_plan_grads_zeroed(&s->plan);
}

int stage_enable_release(stage *s)
{
    s->release_zero = 1;
    /* addresses for every buffer a backward range can give back at once: the threads'
     * group buffers and mb_grads */
    size_t bytes = (size_t)(s->threads + 1) * s->grads_bytes;
    if (s->group_pool->cap || !pages_pool_init(s->group_pool, bytes)) return 0;
    memset(s->group_pool, 0, sizeof *s->group_pool);
    return pt_error_set("stage %d..%d: no addresses for the gradient groups' page pool "
                        "(%zu bytes)", s->plan.first, s->plan.last - 1, bytes);
}

size_t stage_grads_resident(const stage *s)
{
    size_t n = pages_resident(s->grads, s->grads_bytes) +
               pages_resident(s->mb_grads, s->grads_bytes) +
               (s->counts_groups ? pages_pool_resident(s->group_pool) : 0) +
               pages_resident(s->fold_part, (size_t)s->threads * s->fold_floats * sizeof(float)) +
               (s->counts_groups && s->rank_pool ? stage_rank_pool_part_resident(s->rank_pool)
                                                  : 0);
    for (int g = 1; s->group_grads && g < s->groups; g++)
        n += pages_resident(s->group_grads[g], s->grads_bytes);
    return n;
}

int stage_step(stage *s, const optimizer_config *o)
{
    if (stage_alloc_optim(s)) return -1;
    stage_optim_state st = {.params = s->params, .grads = s->grads, .m = s->opt_m,
                            .v = s->opt_v, .count = s->plan.param_count, .step = &s->step,
                            .plan = &s->plan};
    return stage_optim_step(&optim_kernels_cpu, NULL, &st, o);
}
