#include "src/runtime/engine_create.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/cpu/engine_cpu.h"
#include "src/runtime/cuda_plugin.h"

int engine_create(engine **e, engine_device device, const engine_config *cfg)
{
    *e = NULL;
    if (cfg->buffers < 2 || cfg->max_batch < 1 || cfg->n_slots < 1 || cfg->batch < 1 ||
        cfg->max_ticks < 0)
        return pt_error_set("engine: %d buffers, batch %d of %d, %d slots, %d ticks: out of "
                            "range", cfg->buffers, cfg->max_batch, cfg->batch, cfg->n_slots,
                            cfg->max_ticks);
    if ((cfg->split_backward || cfg->wgrad_rows || cfg->recompute) && cfg->microbatches < 1)
        return pt_error_set("engine: split backward, batched weight gradients and "
                            "recomputation need the step's micro-batch count");
    if (cfg->wgrad_rows && cfg->grad_pieces > 1)
        return pt_error_set("--wgrad batched forms one gradient per step; --reduce ordered "
                            "needs each micro-batch's apart: use another --reduce method");
    if (device == ENGINE_CPU) return engine_cpu_create(e, cfg);
    const cuda_plugin *p;
    if (cuda_plugin_load(&p)) return -1;
    return p->engine_create(e, cfg);
}
