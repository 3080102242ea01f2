/* One rank's activation slots shared by the stages of its model chunks (src/cpu/stage.h,
 * stage_slot_pool): a fixed set of equal units, each bound to a stage's slot from its
 * acquire to its release. */
#include <stdlib.h>

#include "src/base/error.h"
#include "src/cpu/stage.h"
#include "src/cpu/stage_impl.h"

struct stage_slot_pool {
    char *memory;
    size_t unit;
    int n, refs;
    unsigned char *busy;
};

/* The pool stages created now adopt (stage_slot_pool_use); one executor per process
 * creates its engines at a time. */
static stage_slot_pool *in_use;

stage_slot_pool *stage_slot_pool_new(int n, size_t unit)
{
    stage_slot_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->unit = stage_round_up(unit);
    p->n = n;
    p->refs = 1;
    p->busy = calloc((size_t)(n > 0 ? n : 1), 1);
    p->memory = n > 0 ? stage_alloc_zeroed(p->unit * (size_t)n) : NULL;
    if (n < 1 || !p->busy || !p->memory) {
        free(p->busy);
        free(p->memory);
        free(p);
        return NULL;
    }
    return p;
}

void stage_slot_pool_use(stage_slot_pool *pool) { in_use = pool; }

void stage_slot_pool_drop(stage_slot_pool *pool)
{
    if (!pool || --pool->refs > 0) return;
    free(pool->memory);
    free(pool->busy);
    free(pool);
}

stage_slot_pool *stage_slot_pool_adopt(void)
{
    if (in_use) in_use->refs++;
    return in_use;
}

size_t stage_slot_pool_unit(const stage_slot_pool *pool) { return pool->unit; }

int stage_slot_pool_take(stage_slot_pool *pool, char **base)
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

void stage_slot_pool_give(stage_slot_pool *pool, int u)
{
    if (u >= 0 && u < pool->n) pool->busy[u] = 0;
}
