/* The CPU stage (src/cpu/stage.h): allocation, the forward and backward in chunks over the
 * worker threads, and the CPU's side of the tensor runs. The split backward's and the
 * batched weight gradients' storage is in stage_wgrad.c; the rules every engine shares are
 * src/engine/stage_plan.c's. */
#include "src/cpu/stage.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/base/pages.h"
#include "src/cpu/pool.h"
#include "src/cpu/stage_impl.h"
#include "src/engine/layer_ops.h"

void *stage_alloc_zeroed(size_t bytes)
{
    size_t rounded = stage_round_up(bytes ? bytes : 1);
    void *p = aligned_alloc(STAGE_ALIGN, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

int stage_chunk(const stage *s, int n)
{
    return stage_chunk_of(s->chunk_max, s->chunk_min, s->groups, n);
}

/* The parameters and the gradients in pages of their own (src/base/pages.h: backed where
 * written; ZeRO-2 gives a bucket's gradient pages back outside its shard, ZeRO-3 a layer's
 * parameter pages after its use). The optimizer's m | v
 * come at the first use (stage_alloc_optim): a ZeRO engine keeps only its shard's. */
static int alloc_state(stage *s)
{
    size_t block = stage_round_up(s->plan.param_count * sizeof(float));
    s->memory = pages_alloc(block);
    s->grads_bytes = block;
    s->grads = pages_alloc(block);
    if (!s->memory || !s->grads) return -1;
    s->params = s->memory;
    return 0;
}

/* Each thread's workspace and scratch (the rank pool's where the stage shares one); with
 * tensor shards the collectives' buffers. */
static int alloc_workers(stage *s, int chunk)
{
    const stage_plan *p = &s->plan;
    size_t scratch = p->widest * (size_t)chunk;
    if (s->rank_pool) {
        s->workers = stage_rank_pool_workers(s->rank_pool, s->threads, p->work_floats, scratch);
        if (!s->workers) return -1;
    } else {
        s->workers = calloc((size_t)s->threads, sizeof *s->workers);
        if (!s->workers) return -1;
        s->own_workers = 1;
        for (int t = 0; t < s->threads; t++) {
            stage_worker *wk = &s->workers[t];
            wk->work = stage_alloc_zeroed(p->work_floats * sizeof(float));
            for (int k = 0; k < 2; k++) wk->scratch[k] = stage_alloc_zeroed(scratch * sizeof(float));
            if (!wk->work || !wk->scratch[0] || !wk->scratch[1]) return -1;
        }
    }
    if (!p->tp) return 0;
    size_t bytes = (size_t)p->max_batch * p->widest * sizeof(float);
    s->tp_buf = stage_alloc_zeroed(bytes);
    s->tp_din = stage_alloc_zeroed(bytes);
    s->tp_dout = stage_alloc_zeroed(bytes);
    s->carry = stage_alloc_zeroed(bytes);
    if (shard_sequence(p->tp) && !(s->tp_seq = stage_alloc_zeroed(bytes))) return -1;
    if (p->phase_floats &&
        !(s->tp_inner = stage_alloc_zeroed((size_t)p->max_batch * p->phase_floats * sizeof(float))))
        return -1;
    size_t loss = stage_loss_floats(p->net, p->last, p->max_batch, p->tp);
    if (loss && !(s->tp_loss = stage_alloc_zeroed(loss * sizeof(float)))) return -1;
    return s->tp_buf && s->tp_din && s->tp_dout && s->carry ? 0 : -1;
}

/* Group 0 of the first micro-batch sums straight into the stage's gradients, of later ones
 * into mb_grads; the other groups need their own only when a micro-batch can have more
 * than one chunk. Their pages (and mb_grads') wait in group_pool between the backward's
 * runs, so that only the runs being formed are backed (stage.h). */
static int alloc_groups(stage *s, int chunk)
{
    s->group_grads = calloc((size_t)s->groups, sizeof *s->group_grads);
    s->mb_grads = pages_alloc(s->grads_bytes);
    if (!s->group_grads || !s->mb_grads) return -1;
    s->group_grads[0] = s->grads;
    int used = stage_used_groups(s->groups, chunk, s->plan.max_batch);
    for (int g = 1; g < used; g++)
        if (!(s->group_grads[g] = pages_alloc(s->grads_bytes))) return -1;
    if (s->rank_pool) {
        s->group_pool = stage_rank_pool_groups(s->rank_pool, &s->counts_groups);
    } else {
        if (pages_pool_init(&s->own_groups, (size_t)(s->threads + 1) * s->grads_bytes)) {
            memset(&s->own_groups, 0, sizeof s->own_groups);
            return -1;
        }
        s->group_pool = &s->own_groups;
        s->counts_groups = 1;
    }
    const stage_plan *p = &s->plan;
    s->split_groups = stage_groups_by_layer(p->net, p->first, p->last, p->param_count, p->widest,
                                      p->max_batch, s->threads, used, p->tp != NULL);
    if (stage_fold_alloc(s, chunk)) return -1;
    if (s->split_groups && !s->carry &&
        !(s->carry = stage_alloc_zeroed((size_t)s->plan.max_batch * s->plan.widest * sizeof(float))))
        return -1;
    return 0;
}

/* Every slot's activations in one block, each slot's carved by the shared layout. */
static int alloc_slots(stage *s)
{
    const stage_plan *p = &s->plan;
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->slot_layers = calloc((size_t)s->n_slots * (size_t)p->nl, sizeof *s->slot_layers);
    /* a shared pool's units are carved when bound (stage_slot_acquire) */
    s->slot_memory = s->shared_slots ? NULL : stage_alloc_zeroed(p->slot_bytes * s->n_slots);
    if (!s->slots || !s->slot_layers || (!s->shared_slots && !s->slot_memory)) return -1;
    for (int k = 0; k < s->n_slots; k++) {
        stage_slot *sl = &s->slots[k];
        sl->layers = s->slot_layers + (size_t)k * p->nl;
        sl->unit = -1;
        if (!s->shared_slots)
            sl->whole_out = stage_plan_carve_slot(
                p, (char *)s->slot_memory + k * p->slot_bytes, sl->layers);
        /* a layer in phases keeps its inner gradients between them: one backward runs at a
         * time, so every slot shares one store (the split backward gives each its own) */
        for (int i = 0; i < p->nl; i++)
            if (stage_plan_phases(p, i) > 1) sl->layers[i].gout = s->tp_inner;
    }
    return 0;
}

int stage_init(stage *s, const net_desc *net, int first, int last, int max_batch, int n_slots,
               int threads)
{
    return stage_init_shard(s, net, first, last, max_batch, n_slots, threads, NULL, 0, NULL);
}

int stage_init_shard(stage *s, const net_desc *net, int first, int last, int max_batch,
                     int n_slots, int threads, const shard_plan *tp, int tp_rank,
                     const stage_tensor_comm *comm)
{
    memset(s, 0, sizeof *s);
    if (first < 0 || last > net->n_layers || first >= last)
        return pt_error_set("stage: bad layer range [%d, %d) of %d layers", first, last,
                            net->n_layers);
    if (max_batch < 1 || n_slots < 1 || threads < 1)
        return pt_error_set("stage: batch %d, slots %d and threads %d must be positive",
                            max_batch, n_slots, threads);
    s->n_slots = n_slots;
    s->threads = threads;
    stage_chunk_rules(net, threads, &s->groups, &s->chunk_max, &s->chunk_min);
    int chunk = stage_chunk(s, max_batch);
    stage_shape sh = stage_cpu_shape(net, first, last, max_batch, chunk, tp, tp_rank);
    if (stage_plan_init(&s->plan, &sh, "stage")) return -1;
    if (s->plan.tp) s->tp_comm = *comm;
    s->rank_pool = stage_rank_pool_adopt();
    s->shared_slots = s->rank_pool && stage_rank_pool_slots(s->rank_pool) > 0;
    if (s->shared_slots && stage_rank_pool_unit(s->rank_pool) < s->plan.slot_bytes) {
        stage_free(s);
        return pt_error_set("stage: the rank's shared slots are smaller than layers "
                            "%d..%d's %zu bytes", first, last - 1, s->plan.slot_bytes);
    }
    if (alloc_state(s) || alloc_workers(s, chunk) || alloc_groups(s, chunk) || alloc_slots(s)) {
        stage_free(s);
        return pt_error_set("stage: out of memory for layers %d..%d (batch %d, %d slots)",
                            first, last - 1, max_batch, n_slots);
    }
    if (pool_init(&s->pool, threads)) {
        stage_free(s);
        return -1;
    }
    return 0;
}

void stage_free(stage *s)
{
    for (int k = 0; s->shared_slots && s->slots && k < s->n_slots; k++)
        if (s->slots[k].busy) stage_rank_pool_give(s->rank_pool, s->slots[k].unit);
    free(s->slots);
    free(s->slot_layers);
    free(s->slot_memory);
    free(s->split_memory);
    free(s->stash_x);
    free(s->stash_g);
    free(s->stash_memory);
    pages_free(s->memory, s->grads_bytes);
    free(s->opt_memory);
    if (s->workers && s->own_workers) {
        for (int t = 0; t < s->threads; t++) {
            free(s->workers[t].work);
            free(s->workers[t].scratch[0]);
            free(s->workers[t].scratch[1]);
        }
    }
    if (s->group_grads)
        for (int g = 1; g < s->groups; g++) pages_free(s->group_grads[g], s->grads_bytes);
    pages_free(s->mb_grads, s->grads_bytes);
    pages_free(s->fold_part, (size_t)s->threads * s->fold_floats * sizeof(float));
    free((void *)s->fold_done);
    pages_free(s->grads, s->grads_bytes);
    free(s->carry);
    free(s->group_grads);
    if (s->own_workers) free(s->workers);
    free(s->tp_buf);
    free(s->tp_din);
    free(s->tp_dout);
    free(s->tp_inner);
    free(s->tp_seq);
    free(s->tp_loss);
    pool_free(s->pool);
    pages_pool_free(&s->own_groups);
    stage_rank_pool_drop(s->rank_pool);
    stage_plan_free(&s->plan);
    memset(s, 0, sizeof *s);
}

const float *stage_output(const stage *s, int slot)
{
    const stage_slot *sl = &s->slots[slot];
    return sl->whole_out ? sl->whole_out : sl->layers[s->plan.nl - 1].out;
}

size_t stage_in_count(const stage *s)
{
    const stage_plan *p = &s->plan;
    return p->tp ? shard_stage_in_count(p->tp, p->net, p->first, p->tp_rank)
                 : layer_shape_count(p->net->layers[p->first].in);
}

size_t stage_out_count(const stage *s)
{
    const stage_plan *p = &s->plan;
    return p->tp ? shard_stage_out_count(p->tp, p->net, p->last, p->tp_rank)
                 : layer_shape_count(p->net->layers[p->last - 1].out);
}

/* Binds a unit of the shared pool to slot k: its activations, then the split backward's
 * gradients. */
static int bind_unit(stage *s, stage_slot *sl)
{
    char *base;
    sl->unit = stage_rank_pool_take(s->rank_pool, &base);
    if (sl->unit < 0) return -1;
    sl->whole_out = stage_plan_carve_slot(&s->plan, base, sl->layers);
    if (s->split) stage_split_carve(s, sl, base + s->plan.slot_bytes);
    return 0;
}

int stage_slot_acquire(stage *s)
{
    for (int k = 0; k < s->n_slots; k++) {
        if (!s->slots[k].busy) {
            if (s->shared_slots && bind_unit(s, &s->slots[k])) return -1;
            s->slots[k].busy = 1;
            return k;
        }
    }
    return pt_error_set("stage %d..%d: all %d activation slots are in use", s->plan.first,
                        s->plan.last - 1, s->n_slots);
}

void stage_slot_release(stage *s, int slot)
{
    stage_slot *sl = &s->slots[slot];
    sl->busy = 0;
    if (!s->shared_slots) return;
    stage_rank_pool_give(s->rank_pool, sl->unit);
    sl->unit = -1;
}

typedef struct {
    stage *s;
    stage_slot *sl;
    int n, chunk;
    const int64_t *ids;
    uint64_t seed, step;
    const float *dout;
    float *din;
    int lo, hi; /* local layers [lo, hi) */
    int from, to; /* their phases (layer_run's) */
    int parts;  /* backward: LAYER_BW_INPUT and/or LAYER_BW_WEIGHT */
    int zero0;  /* backward: group 0 (mb_grads) is zeroed by its worker first */
    int g_lo, g_hi, width; /* backward: this wave's groups [g_lo, g_hi) (group_buf) */
    float *fold_part;      /* backward with a fold (stage_fold_group): thread t's part at
                              fold_part + t · fold_floats; groups 1.. fold (every group with
                              several threads) */
    float *fold_add_to;    /* ... and the last group (fold_last) adds to it, not group 0 */
    int fold_last;
} chunk_job;

/* One chunk of a slot as the shared layer loop sees it (src/engine/layer_ops.h). */
typedef struct {
    const stage *s;
    const stage_slot *sl;
    size_t off;          /* the chunk's first sample */
    int chunk;           /* backward, weight: the micro-batch's chunk size (its groups) */
    const int64_t *ids;  /* forward: the micro-batch's sample ids */
    float *grads;        /* backward, weight: where parameter gradients go */
    struct stage_fold *fold; /* backward, weight: a group folded as formed, or NULL */
} stage_chunk_io;

/* Where local layer i's data lives for the chunk: the shared rule, the chunk's sample ids
 * and a batched layer's rows of the step's stash. */
static int chunk_io(void *self, int i, int phase, layer_io *io)
{
    const stage_chunk_io *c = self;
    const stage *s = c->s;
    const stage_slot *sl = c->sl;
    stage_plan_layer_io(&s->plan, sl->layers, sl->input, s->params, c->grads, i, phase, c->off,
                        io);
    io->ids = c->ids ? c->ids + c->off : NULL;
    if (c->fold && phase != LAYER_PHASE_FORWARD) {
        io->part = c->fold->part;
        io->fold = stage_fold_group;
        io->fold_self = c->fold;
    }
    if (sl->layers[i].sums && phase != LAYER_PHASE_FORWARD) {
        /* the chunk's gradient group (backward_worker's dealing): its layer-norm sums */
        size_t k = c->off / (size_t)c->chunk;
        io->norm_sums = sl->layers[i].sums +
                        k % (size_t)s->groups * layer_norm_sum_floats(&s->plan.loc[i]);
        io->norm_sums_first = k < (size_t)s->groups;
    }
    if (s->tp_seq && layer_block_seq(&s->plan.loc[i]) > 1) /* the whole sequence's rows */
        io->seq = s->tp_seq + c->off * layer_shape_count(s->plan.net->layers[s->plan.first + i].in);
    if (io->batched && phase != LAYER_PHASE_FORWARD) /* a block stashes in W as well */
        stage_plan_stash_io(&s->plan, i, s->stash_x[i], s->stash_g[i],
                            (size_t)sl->row + c->off, io);
    return 0;
}

static layer_run chunk_run(const stage *s, stage_worker *wk, stage_chunk_io *io, int n)
{
    layer_run r = {.k = s->bf16 ? layer_kernels_cpu_bf16() : &layer_kernels_cpu,
                   .layers = s->plan.loc, .first = s->plan.first,
                   .n = n, .work = wk->work, .io = chunk_io, .self = io};
    return r;
}

static void forward_chunk(const stage *s, stage_worker *wk, const chunk_job *j, int off, int n)
{
    stage_chunk_io io = {.s = s, .sl = j->sl, .off = (size_t)off, .ids = j->ids};
    layer_run r = chunk_run(s, wk, &io, n);
    r.seed = j->seed;
    r.step = j->step;
    r.from = j->from;
    r.to = j->to;
    (void)layer_run_forward(&r, j->lo, j->hi); /* the CPU's kernels cannot fail */
}

/* Chunk c belongs to group c mod G; worker t runs groups t, t+T, ..., each group's chunks
 * in increasing order, so a group's gradient sum is the same for every thread count. */
static int chunk_len(const chunk_job *j, int off) { return j->n - off < j->chunk ? j->n - off : j->chunk; }

static void forward_worker(void *arg, int t)
{
    chunk_job *j = arg;
    const stage *s = j->s;
    for (int g = t; g < s->groups; g += s->threads)
        for (int off = g * j->chunk; off < j->n; off += s->groups * j->chunk)
            forward_chunk(s, &s->workers[t], j, off, chunk_len(j, off));
}

/* W alone for local layers [lo, hi) of one chunk, from the output gradients B kept. */
static void weight_chunk(const stage *s, stage_worker *wk, float *grads, const stage_slot *sl,
                         int off, int n, int chunk, int lo, int hi, stage_fold *fold)
{
    stage_chunk_io io = {.s = s, .sl = sl, .off = (size_t)off, .chunk = chunk, .grads = grads,
                         .fold = fold};
    layer_run r = chunk_run(s, wk, &io, n);
    (void)layer_run_weight(&r, lo, hi);
}

/* Local layers [lo, hi) of one chunk (phases from, to), from the gradient of layer
 * hi − 1's output (dout's rows, or the rows the range above left in the carry). Below
 * lo > 0, or inside layer lo (to > 0: its partial gradient), the gradient is left in the
 * carry, in the chunk's own rows off · widest: chunks never share carry memory. parts:
 * LAYER_BW_BOTH, or LAYER_BW_INPUT alone (the split backward's B, which keeps each
 * parameter layer's output gradient in the slot for W). Batched dense layers stash their
 * rows. */
static void backward_chunk(const stage *s, stage_worker *wk, float *grads, const chunk_job *j,
                           int off, int n, const float *dout, float *din, stage_fold *fold)
{
    int lo = j->lo, hi = j->hi;
    if (j->parts == LAYER_BW_WEIGHT) {
        weight_chunk(s, wk, grads, j->sl, off, n, j->chunk, lo, hi, fold);
        return;
    }
    const float *g = dout;
    int gi = -1; /* which scratch buffer g lives in, −1 for the caller's */
    stage_chunk_io io = {.s = s, .sl = j->sl, .off = (size_t)off, .chunk = j->chunk,
                         .grads = grads, .fold = fold};
    layer_run r = chunk_run(s, wk, &io, n);
    r.from = j->from;
    r.to = j->to;
    (void)layer_run_backward(&r, lo, hi, &g, &gi, wk->scratch, din, j->parts);
    if (lo > 0 || j->to) {
        /* g is the carry itself only when every layer of the range passed it through */
        float *carry = s->carry + (size_t)off * s->plan.widest;
        size_t count = j->to ? layer_phase_floats(&s->plan.loc[lo], j->to - 1)
                             : layer_shape_count(s->plan.loc[lo].in);
        if (g != carry) memcpy(carry, g, (size_t)n * count * sizeof(float));
    }
}

enum { MAX_RUNS = 64 };

/* The first local layer whose parameter gradients a backward job forms: a layer in phases
 * forms them in its last, so not layer lo when the job stops inside it. */
static int formed_from(const chunk_job *j) { return j->lo + (j->to != 0); }

/* Where group g's gradient is formed when the groups are formed `width` at a time (waves):
 * group 0 in the target (group_grads[0]), the others in group_grads[1..width], reused from
 * one wave to the next once the earlier wave is summed. width ≥ the groups: each its own. */
static float *group_buf(const stage *s, int g, int width)
{
    return g == 0 ? s->group_grads[0] : s->group_grads[(g - 1) % width + 1];
}

static void backward_worker(void *arg, int t)
{
    chunk_job *j = arg;
    stage *s = j->s;
    const stage_plan *p = &s->plan;
    size_t in_count = layer_shape_count(p->loc[0].in),
           out_count = layer_shape_count(p->loc[p->nl - 1].out);
    /* the gradient comes from dout, else the carry */
    int top = j->hi == p->nl && !j->from;
    size_t runs[MAX_RUNS][2];
    int nr = j->parts & LAYER_BW_WEIGHT
                 ? stage_plan_grad_runs(p, formed_from(j), j->hi, runs, MAX_RUNS)
                 : 0;
    for (int g = j->g_lo + t; g < j->g_hi && g * j->chunk < j->n; g += s->threads) {
        float *buf = group_buf(s, g, j->width);
        /* folded: the buffer is only addressed (its pages stay in the pool) */
        int several = j->width > 1, folds = j->fold_part && (g > 0 || several);
        stage_fold fold = {0};
        if (folds)
            fold = (stage_fold){.base = buf, .form = s->group_grads[0],
                                .part = j->fold_part + (size_t)t * s->fold_floats,
                                .add_to = g == j->fold_last ? j->fold_add_to : NULL,
                                .wait = several && g > j->g_lo ? &s->fold_done[g - 1] : NULL,
                                .done = several ? &s->fold_done[g] : NULL};
        if (g > 0 ? !folds : j->zero0)
            for (int r = 0; r < nr; r++)
                memset(buf + runs[r][0], 0, (runs[r][1] - runs[r][0]) * sizeof(float));
        for (int off = g * j->chunk; off < j->n; off += s->groups * j->chunk)
            backward_chunk(s, &s->workers[t], buf, j, off, chunk_len(j, off),
                           top ? j->dout + (size_t)off * out_count
                               : s->carry + (size_t)off * p->widest,
                           j->din ? j->din + (size_t)off * in_count : NULL,
                           folds ? &fold : NULL);
    }
}

typedef struct {
    stage *s;
    int lo, hi, width; /* the groups [lo, hi) summed now (group_buf), lo ≥ 1 */
    float *dst; /* where the micro-batch's gradient goes (or is added) */
    size_t begin, end; /* the parameters [begin, end) whose gradients the backward formed */
} reduce_job;

/* The micro-batch's gradient g0 + g1 + ... in group order, added to grads when group 0 was
 * summed apart (grads += that sum, so the micro-batch's gradient is rounded on its own
 * first); each thread sums one range of elements. Element by element, so any partition of
 * the elements (a backward by layer ranges) gives the same bits, and so does summing the
 * groups wave by wave into group 0's buffer (dst = group 0's: g0 += g_lo, += ...; the
 * blocked sum below starts from that partial sum and adds the same values in the same
 * order). */
static void reduce_worker(void *arg, int t)
{
    reduce_job *r = arg;
    stage *s = r->s;
    size_t per = (r->end - r->begin + s->threads - 1) / s->threads;
    size_t lo = r->begin + (size_t)t * per, hi = lo + per < r->end ? lo + per : r->end;
    float *restrict dst = r->dst;
    if (s->group_grads[0] == dst) {
        for (int g = r->lo; g < r->hi; g++) {
            const float *restrict src = group_buf(s, g, r->width);
            for (size_t i = lo; i < hi; i++) dst[i] += src[i];
        }
        return;
    }
    enum { BLOCK = 1024 }; /* a block of partial sums stays in the L1 cache across groups */
    float sum[BLOCK];
    for (size_t b = lo; b < hi; b += BLOCK) {
        size_t n = hi - b < BLOCK ? hi - b : BLOCK;
        memcpy(sum, s->group_grads[0] + b, n * sizeof(float));
        for (int g = r->lo; g < r->hi; g++) {
            const float *restrict src = group_buf(s, g, r->width) + b;
            for (size_t i = 0; i < n; i++) sum[i] += src[i];
        }
        for (size_t i = 0; i < n; i++) dst[b + i] += sum[i];
    }
}

/* The group buffers' runs (and mb_grads', when the micro-batch was formed apart and added)
 * are dead once summed, so their pages wait in the stage's pool for the next backward's
 * runs instead of staying backed for the whole array: `put` 1 after the sum, 0 before the
 * first wave (the pool's pages move in; the workers zero them). The groups then hold one
 * range's gradients per buffer (one layer's with split_groups), not the whole array each. */
static void move_group_pages(stage *s, int buffers, float *apart, size_t (*runs)[2], int nr,
                             int put)
{
    for (int k = 0; k <= buffers; k++) {
        float *buf = k < buffers ? s->group_grads[k + 1] : apart;
        for (int r = 0; buf && r < nr; r++) {
            float *p = buf + runs[r][0];
            size_t bytes = (runs[r][1] - runs[r][0]) * sizeof(float);
            char *at;
            size_t moved;
            if (put) (void)pages_pool_put(s->group_pool, p, bytes);
            else (void)pages_pool_take(s->group_pool, p, bytes, &at, &moved);
        }
    }
}

/* Local layers [lo, hi) of the slot's micro-batch, their phases [from of hi − 1, to of lo)
 * (0 and 0: whole layers): the chunks' gradient groups of the parameters of the layers
 * that end in it are zeroed, formed and summed into the target of the shared rule
 * (stage_plan_grad_target; a piece is zeroed here, mb_grads by group 0's worker). */
static void backward_span_local(stage *s, int slot, int lo, int hi, int from, int to,
                                const float *dout, float *din, float *grads, int parts)
{
    stage_slot *sl = &s->slots[slot];
    chunk_job j = {.s = s, .sl = sl, .n = sl->n, .chunk = stage_chunk(s, sl->n), .dout = dout,
                   .din = din, .lo = lo, .hi = hi, .from = from, .to = to, .parts = parts,
                   .g_hi = s->groups, .width = s->groups};
    if (!(parts & LAYER_BW_WEIGHT)) {
        pool_run(s->pool, backward_worker, &j);
        return;
    }
    int used = stage_used_groups(s->groups, j.chunk, sl->n);
    /* several groups: one layer at a time through the carry (split_groups), so that the
     * group buffers and mb_grads hold one layer's gradients each, not the range's; the
     * ranges are the whole backward bit for bit (stage_backward_range) */
    if (s->split_groups && used > 1 && hi - lo > 1 && !from && !to) {
        for (int l = hi - 1; l >= lo; l--)
            backward_span_local(s, slot, l, l + 1, 0, 0, l == hi - 1 ? dout : NULL,
                                l == lo ? din : NULL, grads, parts);
        return;
    }
    size_t runs[MAX_RUNS][2];
    int nr = stage_plan_grad_runs(&s->plan, formed_from(&j), hi, runs, MAX_RUNS);
    stage_grad_target t = stage_plan_grad_target(&s->plan, s->grads, s->mb_grads, grads);
    for (int r = 0; t.apart && !t.add_to && r < nr; r++)
        memset(t.form + runs[r][0], 0, (runs[r][1] - runs[r][0]) * sizeof(float));
    s->group_grads[0] = t.form;
    j.zero0 = t.add_to != NULL;
    /* the groups a wave of the threads at a time, summed after each wave, so that the
     * threads' buffers are all the groups need (the same sums in the same order) */
    j.width = s->threads < used ? s->threads : s->groups;
    int buffers = used - 1 < j.width ? used - 1 : j.width;
    float *apart = t.add_to ? t.form : NULL;
    /* a whole backward of whole arrays would take back at once what it gave: only moved
     * where the runs are a part (measured: 1.5% of seed-cnn's step for nothing), or where
     * the rank's chunks share the pages */
    int moved = s->release_zero || s->split_groups || lo > 0 || hi < s->plan.nl || s->rank_pool;
    /* one chunk per group: each group folded into group 0 as it is formed */
    if (s->fold_floats && used > 1 && (sl->n + j.chunk - 1) / j.chunk == used) {
        j.fold_part = s->rank_pool ? stage_rank_pool_part(s->rank_pool, 0) : s->fold_part;
        j.fold_add_to = t.add_to;
        j.fold_last = used - 1;
        buffers = 0;
    }
    if (moved) move_group_pages(s, buffers, apart, runs, nr, 0);
    for (j.g_lo = 0; j.g_lo < used; j.g_lo += j.width) {
        j.g_hi = j.g_lo + j.width < used ? j.g_lo + j.width : used;
        for (int g = j.g_lo; s->fold_done && g < j.g_hi; g++) atomic_init(&s->fold_done[g], 0);
        pool_run(s->pool, backward_worker, &j);
        if (j.fold_part) continue; /* folded as formed: nothing to sum */
        int last = j.g_hi == used;
        for (int k = 0; k < nr && (j.g_hi > 1 || (last && t.add_to)); k++) {
            reduce_job r = {.s = s, .lo = j.g_lo > 1 ? j.g_lo : 1, .hi = j.g_hi,
                            .width = j.width, .dst = last && t.add_to ? t.add_to : t.form,
                            .begin = runs[k][0], .end = runs[k][1]};
            pool_run(s->pool, reduce_worker, &r);
        }
    }
    if (moved) move_group_pages(s, buffers, apart, runs, nr, 1);
    stage_plan_grads_formed(&s->plan, formed_from(&j), grads);
}

/* ---- tensor shards: the CPU's side of the shared runs (src/engine/stage_plan.h) ---- */

static int tp_forward_phases(void *self, int lo, int hi, int from, int to)
{
    stage_pass *ps = self;
    stage *s = ps->s;
    stage_slot *sl = &s->slots[ps->slot];
    chunk_job j = {.s = s, .sl = sl, .n = sl->n, .chunk = stage_chunk(s, sl->n), .ids = ps->ids,
                   .seed = ps->seed, .step = ps->step, .lo = lo, .hi = hi, .from = from,
                   .to = to};
    pool_run(s->pool, forward_worker, &j);
    return 0;
}

/* ZeRO-3: the layer hook around a run of layer l (begins 1, ends 0); −1 makes the pass void. */
static int hook(stage *s, int l, int backward, int begins)
{
    if (s->layer_hook(s->hook_ctx, l, backward, begins)) {
        s->tp_failed = 1;
        return -1;
    }
    return 0;
}

/* ZeRO-3 with tensor shards: the shared runs call the hook around each layer's phases
 * (stage_tensor_run.layer), one layer per run. */
static int tp_layer(void *self, int i, int backward, int begins)
{
    return hook(((stage_pass *)self)->s, i, backward, begins);
}

static int tp_forward_run(void *self, int lo, int hi)
{
    stage *s = ((stage_pass *)self)->s;
    if (!s->layer_hook || s->plan.tp) return tp_forward_phases(self, lo, hi, 0, 0);
    /* ZeRO-3: one layer at a time, its parameters gathered around it */
    for (int l = lo; l < hi; l++)
        if (hook(s, l, 0, 1) || tp_forward_phases(self, l, l + 1, 0, 0) || hook(s, l, 0, 0))
            return -1;
    return 0;
}

/* Where each chunk's running gradient waits between backward ranges (stage_backward_range)
 * and between ZeRO-3's layers: allocated at the first use. */
static int ensure_carry(stage *s)
{
    if (s->carry) return 0;
    s->carry = stage_alloc_zeroed((size_t)s->plan.max_batch * s->plan.widest * sizeof(float));
    if (!s->carry)
        return pt_error_set("stage %d..%d: out of memory for the gradients carried "
                            "between backward ranges", s->plan.first, s->plan.last - 1);
    return 0;
}

static int tp_backward_phases(void *self, int lo, int hi, int from, int to, const float *dout,
                              float *din)
{
    stage_pass *ps = self;
    backward_span_local(ps->s, ps->slot, lo, hi, from, to, dout, din, ps->grads, ps->parts);
    return 0;
}

static int tp_backward_run(void *self, int lo, int hi, const float *dout, float *din)
{
    stage_pass *ps = self;
    stage *s = ps->s;
    if (!s->layer_hook || s->plan.tp) return tp_backward_phases(self, lo, hi, 0, 0, dout, din);
    if (lo + 1 < hi && ensure_carry(s)) return -1;
    for (int l = hi - 1; l >= lo; l--)
        if (hook(s, l, 1, 1) ||
            tp_backward_phases(self, l, l + 1, 0, 0, dout, l == lo ? din : NULL) ||
            hook(s, l, 1, 0))
            return -1;
    return 0;
}

static const stage_tensor_ops tensor_ops_cpu = {
    .reduce_scatter = stage_tp_reduce_scatter, /* stage_seq.c; the collectives: stage_tp.c */
    .seq_carry = stage_tp_seq_carry,
    .forward = tp_forward_run,
    .backward = tp_backward_run,
    .allreduce = stage_tp_allreduce,
    .gather = stage_tp_gather,
    .slice = stage_tp_slice,
    .finish = stage_tp_finish,
    .reduce_carry = stage_tp_reduce_carry,
    .forward_phases = tp_forward_phases,
    .backward_phases = tp_backward_phases,
};

static stage_tensor_run tensor_run(stage *s, stage_pass *ps)
{
    stage_slot *sl = &s->slots[ps->slot];
    stage_tensor_run r = {.plan = &s->plan, .ops = &tensor_ops_cpu, .self = ps, .n = sl->n,
                          .layers = sl->layers, .input = sl->input, .whole_out = sl->whole_out,
                          .tp_dout = s->tp_dout, .tp_din = s->tp_din, .seq = s->tp_seq,
                          .layer = s->layer_hook && s->plan.tp ? tp_layer : NULL};
    return r;
}

const float *stage_forward(stage *s, int slot, const float *in, int n,
                           const int64_t *sample_ids, uint64_t seed, uint64_t step, int training)
{
    stage_slot *sl = &s->slots[slot];
    sl->n = n;
    sl->input = in;
    const float *y = stage_plan_set_outputs(&s->plan, sl->layers, in, sl->whole_out, training);
    stage_pass ps = {.s = s, .slot = slot, .ids = sample_ids, .seed = seed, .step = step};
    stage_tensor_run r = tensor_run(s, &ps);
    return stage_tensor_forward(&r) ? NULL : y; /* a failed collective set tp_failed */
}

/* The backward of local layers [lo, hi): in runs between the tensor collectives (W needs
 * none of them). A failed collective sets tp_failed. */
static void backward_span(stage *s, int slot, int lo, int hi, const float *dout, float *din,
                          float *grads, int parts)
{
    if (parts == LAYER_BW_WEIGHT) {
        if (!s->layer_hook) {
            backward_span_local(s, slot, lo, hi, 0, 0, dout, din, grads, parts);
            return;
        }
        for (int l = hi - 1; l >= lo; l--) { /* ZeRO-3: layer by layer */
            if (hook(s, l, 1, 1)) return;
            backward_span_local(s, slot, l, l + 1, 0, 0, dout, din, grads, parts);
            if (hook(s, l, 1, 0)) return;
        }
        return;
    }
    stage_pass ps = {.s = s, .slot = slot, .grads = grads, .parts = parts};
    stage_tensor_run r = tensor_run(s, &ps);
    (void)stage_tensor_backward(&r, lo, hi, dout, din);
}

void stage_backward(stage *s, int slot, const float *dout, float *din)
{
    stage_backward_to(s, slot, dout, din, NULL);
}

void stage_backward_to(stage *s, int slot, const float *dout, float *din, float *grads)
{
    backward_span(s, slot, 0, s->plan.nl, dout, din, grads, LAYER_BW_BOTH);
}

int stage_backward_range(stage *s, int slot, int lo, int hi, const float *dout, float *din,
                         float *grads)
{
    if (stage_plan_range_check(&s->plan, slot, lo, hi, grads)) return -1;
    if (lo > 0 && ensure_carry(s)) return -1;
    backward_span(s, slot, lo, hi, dout, din, grads, LAYER_BW_BOTH);
    stage_plan_range_done(&s->plan, slot, lo, grads);
    return 0;
}

int stage_backward_input(stage *s, int slot, const float *dout, float *din)
{
    if (!s->split)
        return pt_error_set("stage %d..%d: backward_input without stage_enable_split",
                            s->plan.first, s->plan.last - 1);
    if (stage_plan_range_idle(&s->plan, "backward_input")) return -1;
    /* a last layer without a kept copy (stage_split_carve): W reads dout, which the caller
     * keeps until then */
    if (stage_split_top_reads_dout(&s->plan))
        s->slots[slot].layers[s->plan.nl - 1].gout = (float *)dout;
    stage_split_zero_sums(s, slot);
    backward_span(s, slot, 0, s->plan.nl, dout, din, NULL, LAYER_BW_INPUT);
    return 0;
}

int stage_backward_weight(stage *s, int slot, int lo, int hi, float *grads)
{
    const stage_plan *p = &s->plan;
    if (!s->split)
        return pt_error_set("stage %d..%d: backward_weight without stage_enable_split",
                            p->first, p->last - 1);
    if (lo < 0 || hi > p->nl || lo >= hi)
        return pt_error_set("stage %d..%d: weight gradients of local layers [%d, %d), outside "
                            "the stage's %d", p->first, p->last - 1, lo, hi, p->nl);
    backward_span(s, slot, lo, hi, NULL, NULL, grads, LAYER_BW_WEIGHT);
    return s->tp_failed ? -1 : 0; /* ZeRO-3: a gather around a layer failed (message set) */
}
