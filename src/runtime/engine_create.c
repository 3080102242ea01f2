#include "src/runtime/engine_create.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/cpu/engine_cpu.h"
#include "src/runtime/cuda_plugin.h"

int engine_create(engine **e, engine_device device, const engine_config *cfg)
{
    *e = NULL;
    if (engine_config_check(cfg)) return -1; /* before the CUDA plugin is loaded */
    /* train refuses these first (train_options.c); this guards every other caller */
    if (device == ENGINE_CPU && cfg->precision != ENGINE_FP32)
        return pt_error_set("the CPU engine multiplies in fp32 only (precision %d asked)",
                            (int)cfg->precision);
    if (device == ENGINE_CPU) return engine_cpu_create(e, cfg);
    const cuda_plugin *p;
    if (cuda_plugin_load(&p)) return -1;
    return p->engine_create(e, cfg);
}
