/* Optimizer post-validation (--post-validation; the Zero Bubble paper's answer for ZB-H2,
 * whose stages end their backward passes at different times). The step's global checks,
 * the whole model's gradient norm for clipping and for non-finite gradients, need every
 * rank's gradients: a synchronisation before the optimizer that makes the ranks done early
 * wait for the last. Instead each rank keeps copies of its parameters, optimizer state and
 * gradients, starts the norm's all-gather, steps at once, and settles at the end of the
 * step (before the loss's all-reduce, which every step has):
 * - the norm says the step stands (no clipping: scale 1): nothing more;
 * - it says the gradients should have been clipped: every rank restores its copies, scales
 *   the gradients as exec_finish_grads would have and steps again, so the parameters are
 *   bit for bit those of the synchronous order (tests/post_validation.sh);
 * - it is not finite: every rank restores its copies and the run stops with a message,
 *   the parameters as they were before the step.
 * The decision is the same on every rank (the norm has the same bits everywhere), so the
 * collectives of a step taken again (replicas' broadcasts) match. Costs: a copy of the
 * parameters, optimizer moments and gradients per step, and a second step where it clips. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/runtime/exec_impl.h"

struct exec_postval {
    float **params, **m, **v, **grads; /* [V]: each engine's copies */
    long *updates;                    /* [V] */
    int pending, tick;                /* a step taken, not yet settled; its instruction */
};

static int postval_alloc(exec_t *e)
{
    struct exec_postval *p = calloc(1, sizeof *p);
    if (!p) return pt_error_set("out of memory");
    e->pv = p;
    size_t V = (size_t)e->V;
    p->params = calloc(V, sizeof *p->params);
    p->m = calloc(V, sizeof *p->m);
    p->v = calloc(V, sizeof *p->v);
    p->grads = calloc(V, sizeof *p->grads);
    p->updates = calloc(V, sizeof *p->updates);
    if (!p->params || !p->m || !p->v || !p->grads || !p->updates)
        return pt_error_set("out of memory");
    for (int w = 0; w < e->V; w++) {
        size_t n = e->engs[w]->param_count ? e->engs[w]->param_count : 1;
        p->params[w] = malloc(n * sizeof(float));
        p->m[w] = malloc(n * sizeof(float));
        p->v[w] = malloc(n * sizeof(float));
        p->grads[w] = malloc(n * sizeof(float));
        if (!p->params[w] || !p->m[w] || !p->v[w] || !p->grads[w])
            return pt_error_set("out of memory for --post-validation's copies (4 floats per "
                                "parameter, %zu parameters)", n);
    }
    return 0;
}

void exec_postval_free(exec_t *e)
{
    struct exec_postval *p = e->pv;
    if (!p) return;
    for (int w = 0; w < e->V; w++) {
        if (p->params) free(p->params[w]);
        if (p->m) free(p->m[w]);
        if (p->v) free(p->v[w]);
        if (p->grads) free(p->grads[w]);
    }
    free(p->params);
    free(p->m);
    free(p->v);
    free(p->grads);
    free(p->updates);
    free(p);
    e->pv = NULL;
}

/* Copies of what a step changes: parameters, moments (and the update count), gradients. */
static int postval_save(exec_t *e)
{
    struct exec_postval *p = e->pv;
    for (int w = 0; w < e->V; w++) {
        engine *g = e->engs[w];
        if (!g->param_count) continue;
        float *grads;
        if (engine_read_params(g, p->params[w]) ||
            engine_read_state(g, p->m[w], p->v[w], &p->updates[w]) ||
            engine_grads_host(g, 0, 0, g->param_count, &grads))
            return -1;
        memcpy(p->grads[w], grads, g->param_count * sizeof(float));
    }
    return 0;
}

static int postval_restore(exec_t *e)
{
    struct exec_postval *p = e->pv;
    for (int w = 0; w < e->V; w++) {
        engine *g = e->engs[w];
        if (!g->param_count) continue;
        float *grads;
        if (engine_write_params(g, p->params[w]) ||
            engine_write_state(g, p->m[w], p->v[w], p->updates[w]) ||
            engine_grads_host(g, 0, 0, g->param_count, &grads))
            return -1;
        memcpy(grads, p->grads[w], g->param_count * sizeof(float));
        if (engine_grads_commit(g, 0, g->param_count)) return -1;
    }
    return 0;
}

int exec_postval_step(exec_t *e, const optimizer_config *opt, int tick)
{
    if (!e->pv && postval_alloc(e)) return -1;
    if (exec_finish_grads_post(e) || postval_save(e)) return -1;
    e->pv->pending = 1;
    e->pv->tick = tick;
    return exec_step_engines(e, opt, tick);
}

int exec_postval_settle(exec_t *e, const optimizer_config *opt, uint64_t step)
{
    struct exec_postval *p = e->pv;
    if (!p || !p->pending) return 0;
    p->pending = 0;
    float scale;
    if (exec_finish_validate(e, opt, &scale)) return -1;
    if (scale == 1.0f || (scale > 1.0f && scale == scale)) return 0; /* the step stands */
    if (postval_restore(e)) return -1;
    if (scale != scale) {
        pt_error_set("the gradient norm is not finite (NaN or infinite) at step %llu: that "
                     "step was rolled back (--post-validation); lower the learning rate",
                     (unsigned long long)step + 1);
        return EXEC_FAILED_EVERYWHERE;
    }
    e->rollbacks++;
    if (exec_finish_scale(e, scale)) return -1;
    return exec_step_engines(e, opt, p->tick);
}
