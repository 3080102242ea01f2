#include "src/runtime/engine_create.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/cpu/engine_cpu.h"
#include "src/cpu/stage.h"
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

/* One unit of the shared pool: the largest chunk's slot and split backward's gradients. */
static size_t shared_unit(int V, const engine_config *cfg)
{
    size_t unit = 0;
    for (int v = 0; v < V; v++) {
        const engine_config *c = &cfg[v];
        int threads = c->threads > 0 ? c->threads : 1;
        size_t b = stage_estimate_shard(c->net, c->first, c->last, c->max_batch, threads,
                                        c->shard, c->shard_rank)
                       .slot;
        if (c->split_backward)
            b += stage_split_slot_bytes_shard(c->net, c->first, c->last, c->max_batch,
                                              c->shard, c->shard_rank);
        if (b > unit) unit = b;
    }
    return stage_round_up(unit);
}

/* The rank's chunks share one pool of slots (engine_create_chunks). */
static int shares_slots(int V, engine_device device, const engine_config *cfg,
                        int rank_slots)
{
    int sum = 0;
    for (int v = 0; v < V; v++) sum += cfg[v].n_slots;
    return V > 1 && device == ENGINE_CPU && rank_slots > 0 && rank_slots < sum;
}

int engine_create_chunks(engine **e, int V, engine_device device, const engine_config *cfg,
                         int rank_slots)
{
    for (int v = 0; v < V; v++) e[v] = NULL;
    stage_slot_pool *pool = NULL;
    if (shares_slots(V, device, cfg, rank_slots)) {
        pool = stage_slot_pool_new(rank_slots, shared_unit(V, cfg));
        if (!pool)
            return pt_error_set("out of memory for the %d activation slots the rank's %d "
                                "chunks share", rank_slots, V);
    }
    /* the stages created now adopt the pool; it lives as long as the last of them */
    stage_slot_pool_use(pool);
    int rc = 0;
    for (int v = 0; v < V && rc == 0; v++) rc = engine_create(&e[v], device, &cfg[v]);
    stage_slot_pool_use(NULL);
    stage_slot_pool_drop(pool);
    return rc;
}
