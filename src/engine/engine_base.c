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

int engine_config_check(const engine_config *cfg)
{
    if (!cfg->net || cfg->buffers < 2 || cfg->max_batch < 1 || cfg->n_slots < 1 ||
        cfg->batch < 1 || cfg->max_ticks < 0)
        return pt_error_set("engine: %s%d buffers, batch %d of %d, %d slots, %d ticks: out of "
                            "range", cfg->net ? "" : "no net, ", cfg->buffers, cfg->max_batch,
                            cfg->batch, cfg->n_slots, cfg->max_ticks);
    if ((cfg->split_backward || cfg->wgrad_rows || cfg->recompute) && cfg->microbatches < 1)
        return pt_error_set("engine: split backward, batched weight gradients and "
                            "recomputation need the step's micro-batch count");
    if (cfg->wgrad_rows < 0)
        return pt_error_set("engine: batched weight gradients over %d rows: out of range",
                            cfg->wgrad_rows);
    if (cfg->wgrad_rows && cfg->grad_pieces > 1)
        return pt_error_set("--wgrad batched forms one gradient per step; --reduce ordered "
                            "needs each micro-batch's apart: use another --reduce method");
    return 0;
}

int engine_grads_range_check(const engine *e, int piece, size_t off, size_t count,
                             const char *what)
{
    int pieces = engine_pieces(&e->cfg);
    if (piece < 0 || piece >= pieces || off > e->param_count || count > e->param_count - off)
        return pt_error_set("%s engine: %s of gradients [%zu, %zu) of piece %d, outside the "
                            "stage's %zu in %d piece%s", e->ops->name, what, off, off + count,
                            piece, e->param_count, pieces, pieces > 1 ? "s" : "");
    return 0;
}

int engine_base_init(engine *e, const engine_ops *ops, const engine_config *cfg)
{
    memset(e, 0, sizeof *e);
    if (engine_config_check(cfg)) return -1;
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

size_t engine_runs_count(const engine_run *runs, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += runs[i].count;
    return total;
}

/* Elements [a, a + len) of the stage with weight decay wd; m and v at their compact place. */
static int step_piece(const optim_kernels *k, void *ctx, const stage_optim_state *s, float *m,
                      float *v, const optimizer_config *o, long step, size_t a, size_t len,
                      float wd)
{
    if (!len) return 0;
    float *p = s->params + a;
    const float *g = s->grads + a;
    switch (o->kind) {
    case OPTIM_SGD: return k->sgd(ctx, p, g, len, o->lr, wd);
    case OPTIM_MOMENTUM: return k->momentum(ctx, p, m, g, len, o->lr, o->momentum, wd);
    case OPTIM_ADAM:
        return k->adam(ctx, p, m, v, g, len, o->lr, o->beta1, o->beta2, o->eps, wd, step);
    case OPTIM_ADAMW:
        if (!k->adamw) return pt_error_set("AdamW is not available on this device");
        return k->adamw(ctx, p, m, v, g, len, o->lr, o->beta1, o->beta2, o->eps, wd, step);
    }
    return pt_error_set("unknown optimizer %d", (int)o->kind);
}

/* Run [a, b) whose moments start at m, v: AdamW by layer (each layer's leading
 * layer_decayed_count parameters decay, the rest not, as adamw_by_layer), else at once. */
static int step_run(const optim_kernels *k, void *ctx, const stage_optim_state *s, float *m,
                    float *v, const optimizer_config *o, long step, size_t a, size_t b)
{
    if (o->kind != OPTIM_ADAMW)
        return step_piece(k, ctx, s, m, v, o, step, a, b - a, o->weight_decay);
    const stage_plan *p = s->plan;
    if (!p || p->param_count != s->count)
        return pt_error_set("AdamW needs the stage's layers (its plan) to choose what decays");
    for (int i = 0; i < p->nl; i++) {
        size_t off = p->param_off[i], end = stage_plan_param_end(p, i + 1);
        size_t dec = layer_decayed_count(&p->loc[i]);
        size_t mid = off + (dec < end - off ? dec : end - off);
        /* [off, mid) decays, [mid, end) does not; each cut to [a, b) */
        size_t cut[3] = {off, mid, end};
        for (int h = 0; h < 2; h++) {
            size_t lo = cut[h] > a ? cut[h] : a, hi = cut[h + 1] < b ? cut[h + 1] : b;
            if (hi <= lo) continue;
            if (step_piece(k, ctx, s, m + (lo - a), v ? v + (lo - a) : NULL, o, step, lo,
                           hi - lo, h == 0 ? o->weight_decay : 0.0f))
                return -1;
        }
    }
    return 0;
}

int engine_optim_step_runs(const optim_kernels *k, void *ctx, const stage_optim_state *whole,
                           float *m, float *v, const engine_run *runs, int n,
                           const optimizer_config *o)
{
    long step = ++*whole->step;
    size_t c = 0;
    for (int i = 0; i < n; i++) {
        const engine_run *r = &runs[i];
        if (r->off > whole->count || r->count > whole->count - r->off)
            return pt_error_set("ZeRO: run [%zu, %zu) outside the stage's %zu parameters",
                                r->off, r->off + r->count, whole->count);
        if (step_run(k, ctx, whole, m ? m + c : NULL, v ? v + c : NULL, o, step, r->off,
                     r->off + r->count))
            return -1;
        c += r->count;
    }
    return 0;
}
