/* The CPU stage's zero-bubble split backward and batched weight gradients
 * (src/cpu/stage.h): their storage, and the flush of the batched products. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "src/base/error.h"
#include "src/cpu/pool.h"
#include "src/cpu/stage.h"
#include "src/cpu/stage_impl.h"

size_t stage_split_slot_bytes(const net_desc *net, int first, int last, int max_batch)
{
    return stage_split_slot_bytes_shard(net, first, last, max_batch, 1, NULL, 0);
}

/* Bytes of one slot's B-to-W gradients of local layer L (layer_gout_kept_floats), the
 * stage's last when `last`: none where W reads the stage's output gradient (whole layers
 * only: layer_w_reads_dout); *sums: the layer norms' sums of `groups` gradient groups
 * (groups 0: none, W forms them from the gradients kept; tensor shards keep those). */
static size_t split_layer_bytes(const layer_desc *L, int last, int sharded, int max_batch,
                                int groups, size_t *sums)
{
    *sums = 0;
    if (!L->weight_count) return 0;
    int norm_sums = groups > 0 && !sharded;
    if (norm_sums)
        *sums = stage_round_up((size_t)groups * layer_norm_sum_floats(L) * sizeof(float));
    if (last && !sharded && layer_w_reads_dout(L)) return 0;
    return stage_round_up((size_t)max_batch * layer_gout_kept_floats(L, norm_sums) *
                          sizeof(float));
}

static int stage_plan_sharded(const stage_plan *p) { return p->tp && p->tp->T > 1; }

int stage_split_top_reads_dout(const stage_plan *p)
{
    return p->nl > 0 && !stage_plan_sharded(p) && layer_w_reads_dout(&p->loc[p->nl - 1]);
}

static size_t split_bytes(const stage *s)
{
    const stage_plan *p = &s->plan;
    size_t bytes = 0, sums;
    for (int i = 0; i < p->nl; i++)
        bytes += split_layer_bytes(&p->loc[i], i == p->nl - 1, stage_plan_sharded(p),
                                   p->max_batch, s->groups, &sums) +
                 sums;
    return bytes;
}

size_t stage_split_slot_bytes_shard(const net_desc *net, int first, int last, int max_batch,
                                    int threads, const shard_plan *tp, int t)
{
    size_t bytes = 0, sums;
    int sharded = tp && tp->T > 1, groups = 0, chunk_max, chunk_min;
    if (threads > 0) stage_chunk_rules(net, threads, &groups, &chunk_max, &chunk_min);
    for (int l = first; l < last; l++) {
        /* as rank t runs it: a block cut by heads keeps all its inner gradients apart */
        layer_desc L = sharded ? shard_local_layer(tp, net, l, t) : net->layers[l];
        bytes += split_layer_bytes(&L, l == last - 1, sharded, max_batch, groups, &sums) + sums;
    }
    return bytes;
}

void stage_split_carve(stage *s, stage_slot *sl, char *mem)
{
    const stage_plan *p = &s->plan;
    for (int i = 0; i < p->nl; i++) {
        size_t sums, b = split_layer_bytes(&p->loc[i], i == p->nl - 1, stage_plan_sharded(p),
                                           p->max_batch, s->groups, &sums);
        sl->layers[i].gout = b ? (float *)mem : NULL; /* NULL: B points it at its dout */
        sl->layers[i].sums = sums ? (float *)(mem + b) : NULL;
        mem += b + sums;
    }
}

void stage_split_zero_sums(stage *s, int slot)
{
    const stage_plan *p = &s->plan;
    for (int i = 0; i < p->nl; i++)
        if (s->slots[slot].layers[i].sums)
            memset(s->slots[slot].layers[i].sums, 0,
                   (size_t)s->groups * layer_norm_sum_floats(&p->loc[i]) * sizeof(float));
}

int stage_enable_split(stage *s)
{
    stage_plan *p = &s->plan;
    if (s->split) return 0;
    p->norm_sums = !stage_plan_sharded(p);
    size_t per = split_bytes(s);
    if (s->shared_slots) { /* each unit holds a slot's gradients after its activations */
        if (stage_rank_pool_unit(s->rank_pool) < p->slot_bytes + per)
            return pt_error_set("stage %d..%d: the rank's shared slots are smaller than a "
                                "slot and its split backward's gradients, %zu bytes",
                                p->first, p->last - 1, p->slot_bytes + per);
        s->split = 1;
        return 0;
    }
    s->split_memory = stage_alloc_zeroed(per * (size_t)s->n_slots);
    if (!s->split_memory)
        return pt_error_set("stage %d..%d: out of memory for the output gradients of %d "
                            "micro-batches (split backward)", p->first, p->last - 1, s->n_slots);
    char *mem = s->split_memory;
    for (int k = 0; k < s->n_slots; k++) {
        stage_split_carve(s, &s->slots[k], mem);
        mem += per;
    }
    s->split = 1;
    return 0;
}

size_t stage_wgrad_row_bytes(const net_desc *net, int first, int last)
{
    size_t bytes = 0;
    for (int l = first; l < last; l++) {
        const layer_desc *L = &net->layers[l];
        stage_wgrad_product pr[STAGE_WGRAD_MAX_PRODUCTS];
        size_t xs, gs;
        if (stage_wgrad_batches(L) && stage_wgrad_products(L, pr, &xs, &gs))
            bytes += (xs + gs) * sizeof(float);
    }
    return bytes;
}

/* Stash bytes of local layer i at `rows` rows (samples): every product's inputs, then
 * every product's output gradients (a block: its four products' token rows). */
static size_t stash_bytes(const layer_desc *L, int rows, size_t *x_bytes)
{
    stage_wgrad_product pr[STAGE_WGRAD_MAX_PRODUCTS];
    size_t xs, gs;
    if (!stage_wgrad_batches(L) || !stage_wgrad_products(L, pr, &xs, &gs)) return *x_bytes = 0;
    *x_bytes = stage_round_up((size_t)rows * xs * sizeof(float));
    return *x_bytes + stage_round_up((size_t)rows * gs * sizeof(float));
}

int stage_enable_batched_wgrad(stage *s, int rows)
{
    stage_plan *p = &s->plan;
    if (rows < 1 || p->wgrad_rows)
        return pt_error_set("stage %d..%d: batched weight gradients over %d rows (already: %d)",
                            p->first, p->last - 1, rows, p->wgrad_rows);
    s->stash_x = calloc((size_t)p->nl, sizeof *s->stash_x);
    s->stash_g = calloc((size_t)p->nl, sizeof *s->stash_g);
    size_t total = 0, xb;
    for (int i = 0; i < p->nl; i++) total += stash_bytes(&p->loc[i], rows, &xb);
    s->stash_memory = total ? stage_alloc_zeroed(total) : NULL;
    if (!s->stash_x || !s->stash_g || (total && !s->stash_memory))
        return pt_error_set("stage %d..%d: out of memory for the batched weight gradients' "
                            "%zu bytes (%d rows)", p->first, p->last - 1, total, rows);
    char *mem = s->stash_memory;
    for (int i = 0; i < p->nl; i++) {
        size_t bytes = stash_bytes(&p->loc[i], rows, &xb);
        if (!bytes) continue;
        s->stash_x[i] = (float *)mem;
        s->stash_g[i] = (float *)(mem + xb);
        mem += bytes;
    }
    s->stash_bytes = total;
    p->wgrad_rows = rows;
    return 0;
}

void stage_slot_set_row(stage *s, int slot, int row) { s->slots[slot].row = row; }

static int units_cpu(void *ctx, float *dw, float *db, const float *dout, const float *in,
                     int rows, int in_f, int out_f, int u0, int units)
{
    kernel_dense_weight_grad_units_cpu(dw, db, dout, in, rows, in_f, out_f, u0, units);
    return 0;
}

/* A failed bf16 product ends the process with the reason, as the layers' do. */
static int units_bf16(void *ctx, float *dw, float *db, const float *dout, const float *in,
                      int rows, int in_f, int out_f, int u0, int units)
{
    if (kernel_dense_weight_grad_units_bf16(dw, db, dout, in, rows, in_f, out_f, u0, units)) {
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        exit(1);
    }
    return 0;
}

typedef struct {
    stage *s;
    int lo, hi;
} flush_job;

/* The shared tiles (STAGE_WGRAD_TILE), dealt to the threads in order; each tile's sums run
 * over the rows in order whatever the thread count. */
static void flush_worker(void *arg, int t)
{
    flush_job *j = arg;
    stage *s = j->s;
    int failed;
    (void)stage_plan_wgrad_flush(&s->plan, s->grads, s->stash_x, s->stash_g, j->lo, j->hi, t,
                                 s->threads, s->bf16 ? units_bf16 : units_cpu, NULL, &failed);
}

void stage_wgrad_flush(stage *s, int lo, int hi)
{
    if (!s->plan.wgrad_rows) return;
    flush_job j = {.s = s, .lo = lo, .hi = hi};
    pool_run(s->pool, flush_worker, &j);
}
