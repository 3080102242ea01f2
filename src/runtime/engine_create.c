#include "src/runtime/engine_create.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "src/base/error.h"
#include "src/cpu/engine_cpu.h"
#include "src/cpu/stage.h"
#include "src/runtime/cuda_plugin.h"

int engine_create(engine **e, engine_device device, const engine_config *cfg)
{
    *e = NULL;
    if (engine_config_check(cfg)) return -1; /* before the CUDA plugin is loaded */
    /* train refuses these first (train_options.c); this guards every other caller */
    if (device == ENGINE_CPU && cfg->precision == ENGINE_TF32)
        return pt_error_set("the CPU engine has no tf32 products (fp32 or bf16)");
    if (device == ENGINE_CPU && cfg->precision == ENGINE_BF16 && !kernel_bf16_available())
        return -1;
    if (device == ENGINE_CPU) return engine_cpu_create(e, cfg);
    const cuda_plugin *p;
    if (cuda_plugin_load(&p)) return -1;
    return p->engine_create(e, cfg);
}

static int threads_of(const engine_config *c) { return c->threads > 0 ? c->threads : 1; }

/* What the CPU stage of chunk c allocates (stage_estimate_shard). */
static stage_bytes chunk_bytes(const engine_config *c)
{
    return stage_estimate_shard(c->net, c->first, c->last, c->max_batch, threads_of(c),
                                c->shard, c->shard_rank);
}

/* One unit of the shared pool: the largest chunk's slot and split backward's gradients. */
static size_t shared_unit(int V, const engine_config *cfg)
{
    size_t unit = 0;
    for (int v = 0; v < V; v++) {
        const engine_config *c = &cfg[v];
        size_t b = chunk_bytes(c).slot;
        if (c->split_backward)
            b += stage_split_slot_bytes_shard(c->net, c->first, c->last, c->max_batch,
                                              threads_of(c), c->shard, c->shard_rank);
        if (b > unit) unit = b;
    }
    return stage_round_up(unit);
}

/* The rank's chunks share its slots when they hold fewer at once than their own together. */
static int shares_slots(int V, const engine_config *cfg, int rank_slots)
{
    int sum = 0;
    for (int v = 0; v < V; v++) sum += cfg[v].n_slots;
    return rank_slots > 0 && rank_slots < sum;
}

/* Addresses for the group pages the chunks may leave in the shared pool at once: each
 * chunk's threads' group buffers and mb_grads (a gradient array each, state / 4). */
static size_t group_pool_bytes(int V, const engine_config *cfg)
{
    size_t bytes = 0;
    for (int v = 0; v < V; v++)
        bytes += (size_t)(threads_of(&cfg[v]) + 1) * (chunk_bytes(&cfg[v]).state / 4 + 4096);
    return bytes;
}

int engine_create_chunks(engine **e, int V, engine_device device, const engine_config *cfg,
                         int rank_slots)
{
    for (int v = 0; v < V; v++) e[v] = NULL;
    stage_rank_pool *pool = NULL;
    if (V > 1 && device == ENGINE_CPU) {
        int slots = shares_slots(V, cfg, rank_slots) ? rank_slots : 0;
        pool = stage_rank_pool_new(slots, slots ? shared_unit(V, cfg) : 0,
                                   group_pool_bytes(V, cfg));
        if (!pool)
            return pt_error_set("out of memory for the %d activation slots and the gradient "
                                "pages the rank's %d chunks share", slots, V);
    }
    /* the stages created now adopt the pool; it lives as long as the last of them */
    stage_rank_pool_use(pool);
    int rc = 0;
    for (int v = 0; v < V && rc == 0; v++) rc = engine_create(&e[v], device, &cfg[v]);
    stage_rank_pool_use(NULL);
    stage_rank_pool_drop(pool);
    return rc;
}
