/* The CPU stage's fold (src/cpu/stage_impl.h, stage_fold): each gradient group added to
 * group 0's as its layers' products are formed, where each group has one chunk. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/pages.h"
#include "src/cpu/stage.h"
#include "src/cpu/stage_impl.h"

int stage_fold_alloc(stage *s, int chunk)
{
    const stage_plan *p = &s->plan;
    if (!stage_folds(s->groups, chunk, p->max_batch, p->tp != NULL)) return 0;
    /* 0: no parameters; a part per thread, each whole pages */
    s->fold_floats = stage_fold_part_floats(p->net, p->first, p->last);
    size_t all = (size_t)s->threads * s->fold_floats;
    if (s->fold_floats && (s->rank_pool ? !stage_rank_pool_part(s->rank_pool, all)
                                        : !(s->fold_part = pages_alloc(all * sizeof(float)))))
        return -1;
    if (s->fold_floats && s->threads > 1 &&
        !(s->fold_done = calloc((size_t)s->groups, sizeof *s->fold_done)))
        return -1;
    return 0;
}

int stage_fold_group(void *self, float *dw_at, float *part, size_t count)
{
    stage_fold *f = self;
    while (f->wait && atomic_load_explicit(f->wait, memory_order_acquire) <= f->n)
        sched_yield(); /* polite: the ranks may share the cores */
    size_t off = (size_t)(dw_at - f->base);
    float *restrict form = f->form + off;
    const float *restrict src = part;
    if (f->add_to) { /* reduce_worker's blocked sum: dst += (g0 + g) */
        float *restrict to = f->add_to + off;
        for (size_t i = 0; i < count; i++) to[i] += form[i] + src[i];
    } else {
        for (size_t i = 0; i < count; i++) form[i] += src[i];
    }
    memset(part, 0, count * sizeof *part);
    f->n++;
    if (f->done) atomic_store_explicit(f->done, f->n, memory_order_release);
    return 0;
}
