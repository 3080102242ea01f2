/* One rank's memory shared by the stages of its model chunks (src/cpu/stage.h,
 * stage_rank_pool): activation slots as a fixed set of equal units, each bound to a stage's
 * slot from its acquire to its release; the gradient groups' page pool; the worker threads'
 * scratch. The chunks run one at a time on the rank, so each part serves whichever runs. */
#include <stdlib.h>

#include "src/base/error.h"
#include "src/cpu/stage.h"
#include "src/cpu/stage_impl.h"

struct stage_rank_pool {
    char *memory;
    size_t unit;
    int n, refs;
    unsigned char *busy;
    pages_pool groups;
    int groups_counted; /* a stage reports the group pages (stage_grads_resident) */
    stage_worker *workers;
    int threads;
    size_t work_floats, scratch_floats; /* what each worker's buffers hold */
    float *part; /* the fold's (stage_rank_pool_part), part_floats, whole pages */
    size_t part_floats;
};

/* The pool stages created now adopt (stage_rank_pool_use); one executor per process
 * creates its engines at a time. */
static stage_rank_pool *in_use;

stage_rank_pool *stage_rank_pool_new(int n, size_t unit, size_t group_bytes)
{
    stage_rank_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->unit = stage_round_up(unit);
    p->n = n > 0 ? n : 0;
    p->refs = 1;
    p->busy = calloc((size_t)(p->n > 0 ? p->n : 1), 1);
    p->memory = p->n > 0 ? stage_alloc_zeroed(p->unit * (size_t)p->n) : NULL;
    int groups_failed = pages_pool_init(&p->groups, group_bytes ? group_bytes : 1);
    if (groups_failed || !p->busy || (p->n > 0 && !p->memory)) {
        if (!groups_failed) pages_pool_free(&p->groups);
        free(p->busy);
        free(p->memory);
        free(p);
        return NULL;
    }
    return p;
}

void stage_rank_pool_use(stage_rank_pool *pool) { in_use = pool; }

static void free_workers(stage_rank_pool *p)
{
    for (int t = 0; p->workers && t < p->threads; t++) {
        free(p->workers[t].work);
        free(p->workers[t].scratch[0]);
        free(p->workers[t].scratch[1]);
    }
    free(p->workers);
    p->workers = NULL;
}

void stage_rank_pool_drop(stage_rank_pool *pool)
{
    if (!pool || --pool->refs > 0) return;
    free(pool->memory);
    free(pool->busy);
    pages_pool_free(&pool->groups);
    pages_free(pool->part, pool->part_floats * sizeof(float));
    free_workers(pool);
    free(pool);
}

stage_rank_pool *stage_rank_pool_adopt(void)
{
    if (in_use) in_use->refs++;
    return in_use;
}

int stage_rank_pool_slots(const stage_rank_pool *pool) { return pool->n; }

size_t stage_rank_pool_unit(const stage_rank_pool *pool) { return pool->unit; }

int stage_rank_pool_take(stage_rank_pool *pool, char **base)
{
    for (int u = 0; u < pool->n; u++)
        if (!pool->busy[u]) {
            pool->busy[u] = 1;
            *base = pool->memory + (size_t)u * pool->unit;
            return u;
        }
    return pt_error_set("all %d activation slots of the rank's chunks are in use (the "
                        "schedule holds more micro-batches than its verifier counted)",
                        pool->n);
}

void stage_rank_pool_give(stage_rank_pool *pool, int u)
{
    if (u >= 0 && u < pool->n) pool->busy[u] = 0;
}

pages_pool *stage_rank_pool_groups(stage_rank_pool *pool, int *counts)
{
    *counts = !pool->groups_counted;
    pool->groups_counted = 1;
    return &pool->groups;
}

stage_worker *stage_rank_pool_workers(stage_rank_pool *pool, int threads, size_t work_floats,
                                      size_t scratch_floats)
{
    if (pool->workers && pool->threads == threads && pool->work_floats >= work_floats &&
        pool->scratch_floats >= scratch_floats)
        return pool->workers;
    /* larger buffers for every thread: the stages made before point at this array, whose
     * entries are replaced (nothing runs while the engines are made) */
    if (pool->workers && pool->threads != threads) return NULL;
    if (work_floats < pool->work_floats) work_floats = pool->work_floats;
    if (scratch_floats < pool->scratch_floats) scratch_floats = pool->scratch_floats;
    if (!pool->workers) {
        pool->workers = calloc((size_t)threads, sizeof *pool->workers);
        if (!pool->workers) return NULL;
        pool->threads = threads;
    }
    for (int t = 0; t < threads; t++) {
        stage_worker *wk = &pool->workers[t];
        free(wk->work);
        free(wk->scratch[0]);
        free(wk->scratch[1]);
        wk->work = stage_alloc_zeroed(work_floats * sizeof(float));
        wk->scratch[0] = stage_alloc_zeroed(scratch_floats * sizeof(float));
        wk->scratch[1] = stage_alloc_zeroed(scratch_floats * sizeof(float));
        if (!wk->work || !wk->scratch[0] || !wk->scratch[1]) {
            pool->work_floats = pool->scratch_floats = 0; /* the next call allocates again */
            return NULL;
        }
    }
    pool->work_floats = work_floats;
    pool->scratch_floats = scratch_floats;
    return pool->workers;
}

float *stage_rank_pool_part(stage_rank_pool *pool, size_t floats)
{
    if (floats > pool->part_floats) {
        pages_free(pool->part, pool->part_floats * sizeof(float));
        pool->part_floats = 0;
        if (!(pool->part = pages_alloc(floats * sizeof(float)))) return NULL;
        pool->part_floats = floats;
    }
    return pool->part;
}

size_t stage_rank_pool_part_resident(const stage_rank_pool *pool)
{
    return pool->part ? pages_resident(pool->part, pool->part_floats * sizeof(float)) : 0;
}
