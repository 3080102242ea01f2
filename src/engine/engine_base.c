/* What every engine shares (src/engine/engine.h); apart from engine_create so that the CUDA
 * plugin, which links this, does not pull in the CPU engine and the plugin loader. */
#include <stdlib.h>
#include <string.h>

#include "src/engine/engine.h"
#include "src/base/error.h"

void engine_stage_sizes(const net_desc *net, int first, int last, size_t *in_count,
                        size_t *out_count, size_t *param_count)
{
    *in_count = layer_shape_count(net->layers[first].in);
    *out_count = layer_shape_count(net->layers[last - 1].out);
    *param_count = 0;
    for (int l = first; l < last; l++)
        *param_count += net->layers[l].weight_count + net->layers[l].bias_count;
}

int engine_base_init(engine *e, const engine_ops *ops, const engine_config *cfg)
{
    memset(e, 0, sizeof *e);
    const net_desc *net = cfg->net;
    if (cfg->first < 0 || cfg->last > net->n_layers || cfg->first >= cfg->last)
        return pt_error_set("engine: bad layer range [%d, %d) of %d layers", cfg->first,
                            cfg->last, net->n_layers);
    e->ops = ops;
    e->cfg = *cfg;
    engine_stage_sizes(net, cfg->first, cfg->last, &e->in_count, &e->out_count,
                       &e->param_count);
    size_t ticks = cfg->max_ticks > 0 ? (size_t)cfg->max_ticks : 1;
    e->tick_t0 = malloc(ticks * sizeof *e->tick_t0);
    e->tick_t1 = malloc(ticks * sizeof *e->tick_t1);
    if (!e->tick_t0 || !e->tick_t1) {
        engine_base_free(e);
        return pt_error_set("engine: out of memory");
    }
    for (size_t i = 0; i < ticks; i++) {
        e->tick_t0[i] = 0;
        e->tick_t1[i] = -1;
    }
    return 0;
}

void engine_base_free(engine *e)
{
    free(e->tick_t0);
    free(e->tick_t1);
    e->tick_t0 = e->tick_t1 = NULL;
}

void engine_destroy(engine *e)
{
    if (e) e->ops->destroy(e);
}
