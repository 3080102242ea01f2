#include "src/cpu/stage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rng.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/engine/layer_ops.h"
#include "src/cpu/pool.h"

enum { ALIGN = 64 };

static size_t round_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static void *alloc_zeroed(size_t bytes)
{
    void *p = aligned_alloc(ALIGN, round_up(bytes ? bytes : 1));
    if (p) memset(p, 0, round_up(bytes ? bytes : 1));
    return p;
}

/* Bytes of one slot's storage for layer L at batch n: output, argmax, mask. */
static size_t layer_slot_bytes(const layer_desc *L, int n, size_t *out_b, size_t *arg_b,
                               size_t *mask_b)
{
    size_t count = (size_t)n * layer_shape_count(L->out);
    const layer_kind *k = layer_kind_of(L->type);
    *out_b = k->own_output ? round_up(count * sizeof(float)) : 0;
    *arg_b = k->argmax ? round_up(count * sizeof(int32_t)) : 0;
    *mask_b = k->mask ? round_up(count) : 0;
    return *out_b + *arg_b + *mask_b;
}

/* Convolution layers run faster on chunks of 16 samples (their im2col matrices then stay in
 * cache; measured with experiments/bench_kernels.c); dense layers prefer larger ones. The
 * chunk size depends only on the net and the micro-batch size, never on the layout or the
 * thread count, so that every layout computes the same sums. */
enum { CONV_CHUNK = 16, DENSE_CHUNK_MIN = 64 };

int stage_chunk(const stage *s, int n)
{
    int c = s->chunk_max > 0 ? s->chunk_max : (n + s->groups - 1) / s->groups;
    if (s->chunk_max == 0 && c < DENSE_CHUNK_MIN) c = DENSE_CHUNK_MIN;
    return c < n ? c : (n > 0 ? n : 1);
}

int stage_init(stage *s, const net_desc *net, int first, int last, int max_batch, int n_slots,
               int threads)
{
    return stage_init_shard(s, net, first, last, max_batch, n_slots, threads, NULL, 0, NULL);
}

static int tp_on(const shard_plan *tp) { return tp && tp->T > 1; }

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
    s->net = net;
    s->first = first;
    s->last = last;
    s->max_batch = max_batch;
    s->n_slots = n_slots;
    s->threads = threads;
    s->groups = threads > STAGE_MIN_GROUPS ? threads : STAGE_MIN_GROUPS;
    int nl = last - first;
    for (int l = 0; l < net->n_layers; l++) /* the whole net decides, not this stage */
        if (net->layers[l].type == LAYER_CONV) s->chunk_max = CONV_CHUNK;
    int chunk = stage_chunk(s, max_batch);
    if (tp_on(tp)) {
        s->tp = tp;
        s->tp_rank = tp_rank;
        s->tp_comm = *comm;
    }
    s->loc = calloc((size_t)nl, sizeof *s->loc);
    if (!s->loc) goto oom;
    for (int l = first; l < last; l++) {
        s->loc[l - first] = s->tp ? shard_local_layer(tp, net, l, tp_rank) : net->layers[l];
        s->param_count += s->loc[l - first].weight_count + s->loc[l - first].bias_count;
    }
    size_t P = s->param_count;
    /* params | grads | m | v; each block rounded so every block stays aligned */
    size_t block = round_up(P * sizeof(float)) / sizeof(float);
    s->memory = alloc_zeroed(4 * block * sizeof(float));
    s->w = calloc((size_t)nl, sizeof *s->w);
    s->b = calloc((size_t)nl, sizeof *s->b);
    s->dw = calloc((size_t)nl, sizeof *s->dw);
    s->db = calloc((size_t)nl, sizeof *s->db);
    s->slots = calloc((size_t)n_slots, sizeof *s->slots);
    s->workers = calloc((size_t)threads, sizeof *s->workers);
    s->group_grads = calloc((size_t)s->groups, sizeof *s->group_grads);
    s->param_off = calloc((size_t)nl, sizeof *s->param_off);
    if (!s->memory || !s->w || !s->b || !s->dw || !s->db || !s->slots || !s->workers ||
        !s->param_off || !s->group_grads)
        goto oom;
    s->params = s->memory;
    s->grads = s->memory + block;
    s->opt_m = s->memory + 2 * block;
    s->opt_v = s->memory + 3 * block;
    size_t off = 0;
    size_t work = 0, widest = 0, slot_bytes = 0;
    for (int l = first; l < last; l++) {
        const layer_desc *L = &s->loc[l - first];
        int i = l - first;
        s->param_off[i] = off;
        if (L->weight_count) {
            s->w[i] = s->params + off;
            s->dw[i] = s->grads + off;
            off += L->weight_count;
            s->b[i] = s->params + off;
            s->db[i] = s->grads + off;
            off += L->bias_count;
        }
        if (L->type == LAYER_CONV) {
            kernel_conv2d_dims d = layer_conv_dims(L, chunk);
            size_t ws = kernel_conv2d_workspace_floats(&d);
            if (ws > work) work = ws;
        }
        /* whole vectors too: tensor collectives gather and reduce them */
        size_t in = layer_shape_count(net->layers[l].in), out = layer_shape_count(net->layers[l].out);
        if (in > widest) widest = in;
        if (out > widest) widest = out;
        size_t a, b, c;
        slot_bytes += layer_slot_bytes(L, max_batch, &a, &b, &c);
        if (s->tp)
            slot_bytes += round_up((size_t)max_batch *
                                   shard_slot_input(tp, net, l, first, tp_rank) * sizeof(float));
    }
    if (s->tp && tp->layers[last - 1].out.sharded)
        slot_bytes += round_up((size_t)max_batch * layer_shape_count(net->layers[last - 1].out) *
                               sizeof(float));
    s->slot_bytes = slot_bytes;
    if (s->tp) {
        size_t bytes = (size_t)max_batch * widest * sizeof(float);
        s->tp_buf = alloc_zeroed(bytes);
        s->tp_din = alloc_zeroed(bytes);
        s->tp_dout = alloc_zeroed(bytes);
        s->carry = alloc_zeroed(bytes);
        if (!s->tp_buf || !s->tp_din || !s->tp_dout || !s->carry) goto oom;
    }
    s->widest = widest;
    for (int t = 0; t < threads; t++) {
        stage_worker *wk = &s->workers[t];
        wk->work = alloc_zeroed(work * sizeof(float));
        for (int k = 0; k < 2; k++) wk->scratch[k] = alloc_zeroed(widest * chunk * sizeof(float));
        if (!wk->work || !wk->scratch[0] || !wk->scratch[1]) goto oom;
    }
    /* group 0 of the first micro-batch sums straight into the stage's gradients, of later
     * ones into mb_grads; the other groups need their own only when a micro-batch can have
     * more than one chunk */
    int used_groups = (max_batch + chunk - 1) / chunk;
    if (used_groups > s->groups) used_groups = s->groups;
    s->group_grads[0] = s->grads;
    s->mb_grads = alloc_zeroed(P * sizeof(float));
    if (!s->mb_grads) goto oom;
    for (int g = 1; g < used_groups; g++) {
        s->group_grads[g] = alloc_zeroed(P * sizeof(float));
        if (!s->group_grads[g]) goto oom;
    }
    s->slot_memory = alloc_zeroed(slot_bytes * n_slots);
    if (!s->slot_memory) goto oom;
    if (pool_init(&s->pool, threads)) {
        stage_free(s);
        return -1;
    }

    char *mem = s->slot_memory;
    for (int k = 0; k < n_slots; k++) {
        stage_slot *sl = &s->slots[k];
        sl->buf = calloc((size_t)nl, sizeof *sl->buf);
        sl->out = calloc((size_t)nl, sizeof *sl->out);
        sl->argmax = calloc((size_t)nl, sizeof *sl->argmax);
        sl->mask = calloc((size_t)nl, sizeof *sl->mask);
        sl->xin = calloc((size_t)nl, sizeof *sl->xin);
        if (!sl->buf || !sl->out || !sl->argmax || !sl->mask || !sl->xin) goto oom;
        for (int l = first; l < last; l++) {
            size_t ob, ab, mb;
            int i = l - first;
            layer_slot_bytes(&s->loc[i], max_batch, &ob, &ab, &mb);
            if (ob) sl->buf[i] = (float *)mem;
            mem += ob;
            if (ab) sl->argmax[i] = (int32_t *)mem;
            mem += ab;
            if (mb) sl->mask[i] = (uint8_t *)mem;
            mem += mb;
            size_t xb = s->tp ? shard_slot_input(tp, net, l, first, tp_rank) : 0;
            if (xb) sl->xin[i] = (float *)mem;
            mem += round_up((size_t)max_batch * xb * sizeof(float));
        }
        if (s->tp && tp->layers[last - 1].out.sharded) {
            sl->whole_out = (float *)mem;
            mem += round_up((size_t)max_batch * layer_shape_count(net->layers[last - 1].out) *
                            sizeof(float));
        }
    }
    return 0;
oom:
    stage_free(s);
    return pt_error_set("stage: out of memory for layers %d..%d (batch %d, %d slots)", first,
                        last - 1, max_batch, n_slots);
}

stage_bytes stage_estimate(const net_desc *net, int first, int last, int max_batch, int threads)
{
    return stage_estimate_shard(net, first, last, max_batch, threads, NULL, 0);
}

stage_bytes stage_estimate_shard(const net_desc *net, int first, int last, int max_batch,
                                 int threads, const shard_plan *tp, int t)
{
    stage_bytes b = {0};
    if (!tp_on(tp)) tp = NULL;
    /* the chunk and group rules of stage_init and stage_chunk */
    int groups = threads > STAGE_MIN_GROUPS ? threads : STAGE_MIN_GROUPS, chunk_max = 0;
    for (int l = 0; l < net->n_layers; l++)
        if (net->layers[l].type == LAYER_CONV) chunk_max = CONV_CHUNK;
    int chunk = chunk_max > 0 ? chunk_max : (max_batch + groups - 1) / groups;
    if (chunk_max == 0 && chunk < DENSE_CHUNK_MIN) chunk = DENSE_CHUNK_MIN;
    if (chunk > max_batch) chunk = max_batch;
    size_t P = 0, work = 0, widest = 0;
    for (int l = first; l < last; l++) {
        layer_desc D = tp ? shard_local_layer(tp, net, l, t) : net->layers[l];
        const layer_desc *L = &D;
        P += L->weight_count + L->bias_count;
        if (L->type == LAYER_CONV) {
            kernel_conv2d_dims d = layer_conv_dims(L, chunk);
            size_t ws = kernel_conv2d_workspace_floats(&d);
            if (ws > work) work = ws;
        }
        size_t in = layer_shape_count(net->layers[l].in), out = layer_shape_count(net->layers[l].out);
        if (in > widest) widest = in;
        if (out > widest) widest = out;
        size_t o, a, m;
        b.slot += layer_slot_bytes(L, max_batch, &o, &a, &m);
        if (tp) b.slot += round_up((size_t)max_batch * shard_slot_input(tp, net, l, first, t) *
                                   sizeof(float));
    }
    if (tp && tp->layers[last - 1].out.sharded)
        b.slot += round_up((size_t)max_batch * layer_shape_count(net->layers[last - 1].out) *
                           sizeof(float));
    b.state = 4 * round_up(P * sizeof(float));
    int used_groups = (max_batch + chunk - 1) / chunk;
    if (used_groups > groups) used_groups = groups;
    b.groups = (size_t)used_groups * round_up(P * sizeof(float)); /* mb_grads + groups 1.. */
    b.workers = (size_t)threads * (round_up(work * sizeof(float)) +
                                   2 * round_up(widest * chunk * sizeof(float)));
    if (tp) b.workers += 4 * round_up((size_t)max_batch * widest * sizeof(float));
    return b;
}

void stage_free(stage *s)
{
    if (s->slots) {
        for (int k = 0; k < s->n_slots; k++) {
            free(s->slots[k].buf);
            free(s->slots[k].out);
            free(s->slots[k].argmax);
            free(s->slots[k].mask);
            free(s->slots[k].xin);
        }
    }
    if (s->slots)
        for (int k = 0; k < s->n_slots; k++) free(s->slots[k].gout);
    free(s->slots);
    free(s->slot_memory);
    free(s->split_memory);
    free(s->stash_x);
    free(s->stash_g);
    free(s->stash_memory);
    free(s->memory);
    free(s->w);
    free(s->b);
    free(s->dw);
    free(s->db);
    if (s->workers) {
        for (int t = 0; t < s->threads; t++) {
            free(s->workers[t].work);
            free(s->workers[t].scratch[0]);
            free(s->workers[t].scratch[1]);
        }
    }
    if (s->group_grads)
        for (int g = 1; g < s->groups; g++) free(s->group_grads[g]);
    free(s->mb_grads);
    free(s->carry);
    free(s->group_grads);
    free(s->workers);
    free(s->param_off);
    free(s->loc);
    free(s->tp_buf);
    free(s->tp_din);
    free(s->tp_dout);
    pool_free(s->pool);
    memset(s, 0, sizeof *s);
}

typedef struct {
    float *w;          /* the local layer's parameters: weight, then bias */
    size_t weight_count; /* of the whole layer */
    float bound;
    uint64_t seed;
    int layer;
} init_ctx;

/* A run of the whole layer's parameters this rank holds: the same draws as the whole. */
static void init_run(void *arg, size_t whole, size_t local, size_t count)
{
    init_ctx *c = arg;
    int bias = whole >= c->weight_count;
    kernel_init_uniform_range_cpu(c->w + local, bias ? whole - c->weight_count : whole, count,
                                  c->bound, c->seed, rng_stream_init(c->layer, bias));
}

void stage_init_params(stage *s, uint64_t seed)
{
    for (int l = s->first; l < s->last; l++) {
        const layer_desc *L = &s->net->layers[l]; /* the whole layer: its fan-in */
        int i = l - s->first;
        if (!L->weight_count) continue;
        size_t fan_in = L->weight_count / (L->type == LAYER_CONV ? (size_t)L->u.conv.filters
                                                                  : (size_t)L->u.dense.units);
        /* kaiming_uniform(a=√5) and the bias rule of torch.nn both give 1/√fan_in */
        float bound = (float)(1.0 / sqrt((double)fan_in));
        if (s->tp) {
            init_ctx c = {s->w[i], L->weight_count, bound, seed, l};
            shard_layer_runs(s->tp, s->net, l, s->tp_rank, init_run, &c);
            continue;
        }
        kernel_init_uniform_cpu(s->w[i], L->weight_count, bound, seed, rng_stream_init(l, 0));
        kernel_init_uniform_cpu(s->b[i], L->bias_count, bound, seed, rng_stream_init(l, 1));
    }
    s->step = 0;
}

const float *stage_output(const stage *s, int slot)
{
    const stage_slot *sl = &s->slots[slot];
    return sl->whole_out ? sl->whole_out : sl->out[s->last - s->first - 1];
}

size_t stage_in_count(const stage *s) { return layer_shape_count(s->net->layers[s->first].in); }

size_t stage_out_count(const stage *s)
{
    return layer_shape_count(s->net->layers[s->last - 1].out);
}

int stage_slot_acquire(stage *s)
{
    for (int k = 0; k < s->n_slots; k++) {
        if (!s->slots[k].busy) {
            s->slots[k].busy = 1;
            return k;
        }
    }
    return pt_error_set("stage %d..%d: all %d activation slots are in use", s->first,
                        s->last - 1, s->n_slots);
}

void stage_slot_release(stage *s, int slot) { s->slots[slot].busy = 0; }

/* Where each layer's output lives for this forward: its own buffer, or its input when the
 * layer is the identity (flatten; dropout when not training). Decided once per forward. */
static const float *set_outputs(stage *s, stage_slot *sl, const float *in, int training)
{
    const float *x = in;
    for (int l = s->first; l < s->last; l++) {
        const layer_desc *L = &s->loc[l - s->first];
        int i = l - s->first;
        if (sl->xin[i]) x = sl->xin[i]; /* gathered or sliced for tensor shards */
        sl->out[i] = layer_is_identity(L, training) ? x : sl->buf[i];
        x = sl->out[i];
    }
    return sl->whole_out ? sl->whole_out : x;
}

/* Local layer i's input as it uses it. */
static const float *layer_input(const stage_slot *sl, int i)
{
    return sl->xin[i] ? sl->xin[i] : i == 0 ? sl->input : sl->out[i - 1];
}

/* Local layer i is split by its inputs: its output is a partial sum until the tensor
 * group's all-reduce; the bias and the activation come after (tp_finish). */
static int split_in(const stage *s, int i)
{
    return s->tp && s->tp->layers[s->first + i].split == SHARD_IN;
}

typedef struct {
    stage *s;
    stage_slot *sl;
    int n, chunk;
    const int64_t *ids;
    uint64_t seed, step;
    const float *dout;
    float *din;
    int lo, hi; /* backward: local layers [lo, hi) */
    int parts;  /* backward: BW_INPUT and/or BW_WEIGHT */
} chunk_job;

/* What a backward computes: the input gradient (B), the parameter gradients (W), or both. */
enum { BW_INPUT = LAYER_BW_INPUT, BW_WEIGHT = LAYER_BW_WEIGHT, BW_BOTH = LAYER_BW_BOTH };

/* Local layer i's weight gradient is formed over the whole step (stage_wgrad_flush). */
static int batched(const stage *s, int i)
{
    return s->wgrad_rows > 0 && s->stash_x[i] != NULL;
}

/* One chunk of a slot as the shared layer loop sees it (src/engine/layer_ops.h). */
typedef struct {
    const stage *s;
    const stage_slot *sl;
    size_t off;          /* the chunk's first sample */
    const int64_t *ids;  /* forward: the micro-batch's sample ids */
    float *grads;        /* backward, weight: where parameter gradients go */
} stage_chunk_io;

/* Where local layer i's data lives for the chunk. */
static int chunk_io(void *self, int i, int phase, layer_io *io)
{
    const stage_chunk_io *c = self;
    const stage *s = c->s;
    const stage_slot *sl = c->sl;
    const layer_desc *L = &s->loc[i];
    size_t in_count = layer_shape_count(L->in), out_count = layer_shape_count(L->out);
    size_t off = c->off;
    io->x = layer_input(sl, i) + off * in_count;
    io->identity = sl->out[i] != sl->buf[i];
    io->argmax = sl->argmax[i] ? sl->argmax[i] + off * out_count : NULL;
    io->mask = sl->mask[i] ? sl->mask[i] + off * out_count : NULL;
    io->w = s->w[i];
    io->b = s->b[i];
    if (phase == LAYER_PHASE_FORWARD) {
        io->y = sl->buf[i] ? sl->buf[i] + off * out_count : NULL;
        io->partial = split_in(s, i);
        io->ids = c->ids ? c->ids + off : NULL;
        /* a slice's elements keep their places in the whole vector's mask */
        if (s->tp && io->mask) {
            int l = s->first + i;
            size_t len;
            shard_values(&s->tp->layers[l].in, layer_shape_count(s->net->layers[l].in),
                         s->tp->T, s->tp_rank, &io->elem_off, &len);
        }
        return 0;
    }
    io->out = sl->out[i] + off * out_count;
    io->batched = batched(s, i);
    if (L->weight_count && c->grads) {
        io->dw = c->grads + s->param_off[i];
        io->db = io->dw + L->weight_count;
    }
    if (sl->gout && sl->gout[i]) io->gout = sl->gout[i] + off * out_count;
    if (io->batched && phase == LAYER_PHASE_BACKWARD) {
        size_t row = (size_t)sl->row + off;
        io->stash_x = s->stash_x[i] + row * in_count;
        io->stash_g = s->stash_g[i] + row * out_count;
    }
    return 0;
}

static layer_run chunk_run(const stage *s, stage_worker *wk, stage_chunk_io *io, int n)
{
    layer_run r = {.k = &layer_kernels_cpu, .layers = s->loc, .first = s->first, .n = n,
                   .work = wk->work, .io = chunk_io, .self = io};
    return r;
}

static void forward_chunk(const stage *s, stage_worker *wk, const stage_slot *sl, int off, int n,
                          const int64_t *ids, uint64_t seed, uint64_t step, int lo, int hi)
{
    stage_chunk_io io = {.s = s, .sl = sl, .off = (size_t)off, .ids = ids};
    layer_run r = chunk_run(s, wk, &io, n);
    r.seed = seed;
    r.step = step;
    (void)layer_run_forward(&r, lo, hi); /* the CPU's kernels cannot fail */
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
            forward_chunk(s, &s->workers[t], j->sl, off, chunk_len(j, off), j->ids, j->seed,
                          j->step, j->lo, j->hi);
}

/* ---- tensor shards: the collectives between the layers (src/model/shard.h) ---- */

static int tp_allreduce(stage *s, float *buf, size_t n)
{
    double t0 = pt_now();
    int rc = s->tp_comm.allreduce(s->tp_comm.ctx, buf, n);
    s->tp_s += pt_now() - t0;
    if (rc) s->tp_failed = 1;
    return rc;
}

/* n samples of a vector of `whole` values in state st: this rank's slices (rows of its
 * length, contiguous) all-gathered into whole rows. */
static int tp_gather(stage *s, const shard_state *st, size_t whole, const float *local,
                     float *out, int n)
{
    int T = s->tp->T;
    size_t count[T], off[T], len[T];
    for (int r = 0; r < T; r++) {
        shard_values(st, whole, T, r, &off[r], &len[r]);
        count[r] = (size_t)n * len[r];
    }
    double t0 = pt_now();
    int rc = s->tp_comm.allgather(s->tp_comm.ctx, local, s->tp_buf, count);
    s->tp_s += pt_now() - t0;
    if (rc) {
        s->tp_failed = 1;
        return rc;
    }
    const float *blk = s->tp_buf;
    for (int r = 0; r < T; blk += count[r], r++)
        for (int j = 0; j < n; j++)
            memcpy(out + (size_t)j * whole + off[r], blk + (size_t)j * len[r],
                   len[r] * sizeof(float));
    return 0;
}

/* This rank's slice of n whole rows, as contiguous rows. */
static void tp_slice(const stage *s, const shard_state *st, size_t whole, const float *in,
                     float *out, int n)
{
    size_t off, len;
    shard_values(st, whole, s->tp->T, s->tp_rank, &off, &len);
    for (int j = 0; j < n; j++)
        memcpy(out + (size_t)j * len, in + (size_t)j * whole + off, len * sizeof(float));
}

/* A layer split by inputs after its all-reduce: bias, then activation, sample by sample
 * (each sample's row stays in cache between the two), the samples dealt to the threads. */
typedef struct {
    const stage *s;
    int i, n;
    float *y;
} finish_job;

static void finish_worker(void *arg, int t)
{
    const finish_job *j = arg;
    const stage *s = j->s;
    const layer_desc *L = &s->loc[j->i];
    size_t count = layer_shape_count(L->out);
    size_t per = L->type == LAYER_CONV ? (size_t)L->out.h * L->out.w : 1;
    const float *b = s->b[j->i];
    int lo = (int)((long)j->n * t / s->threads), hi = (int)((long)j->n * (t + 1) / s->threads);
    for (int m = lo; m < hi; m++) {
        float *row = j->y + (size_t)m * count;
        for (size_t u = 0; u < count / per; u++) {
            float *v = row + u * per;
            for (size_t k = 0; k < per; k++) v[k] += b[u];
        }
        kernel_activation_forward_cpu(row, row, count, L->activation);
    }
}

static void tp_finish(stage *s, int i, float *y, int n)
{
    finish_job j = {.s = s, .i = i, .n = n, .y = y};
    pool_run(s->pool, finish_worker, &j);
}


/* The forward in runs of layers between collectives: each run goes chunk by chunk through
 * its layers (as the whole stage does without shards), then the tensor group completes
 * what the next layer needs. */
static int tp_forward(stage *s, stage_slot *sl, chunk_job *j)
{
    const net_desc *net = s->net;
    int nl = s->last - s->first, n = sl->n, lo = 0;
    if (sl->xin[0]) /* the stage's first layer works on a slice of the whole input */
        tp_slice(s, &s->tp->layers[s->first].in, layer_shape_count(net->layers[s->first].in),
                 sl->input, sl->xin[0], n);
    for (int i = 0; i < nl; i++) {
        int l = s->first + i, then = shard_forward_after(s->tp, s->first, s->last, i);
        if (!then && i < nl - 1) continue;
        j->lo = lo;
        j->hi = i + 1;
        pool_run(s->pool, forward_worker, j);
        lo = i + 1;
        if (then & SHARD_THEN_REDUCE) {
            if (tp_allreduce(s, sl->buf[i], (size_t)n * layer_shape_count(s->loc[i].out)))
                return -1;
            tp_finish(s, i, sl->buf[i], n);
        }
        if ((then & SHARD_THEN_GATHER) &&
            tp_gather(s, &s->tp->layers[l].out, layer_shape_count(net->layers[l].out),
                      sl->out[i], i + 1 < nl ? sl->xin[i + 1] : sl->whole_out, n))
            return -1;
    }
    return 0;
}

const float *stage_forward(stage *s, int slot, const float *in, int n,
                           const int64_t *sample_ids, uint64_t seed, uint64_t step, int training)
{
    stage_slot *sl = &s->slots[slot];
    sl->n = n;
    sl->input = in;
    const float *y = set_outputs(s, sl, in, training);
    chunk_job j = {.s = s, .sl = sl, .n = n, .chunk = stage_chunk(s, n), .ids = sample_ids,
                   .seed = seed, .step = step, .lo = 0, .hi = s->last - s->first};
    if (s->tp) return tp_forward(s, sl, &j) ? NULL : y;
    pool_run(s->pool, forward_worker, &j);
    return y;
}

size_t stage_param_end(const stage *s, int i)
{
    return i < s->last - s->first ? s->param_off[i] : s->param_count;
}

/* W alone for local layers [lo, hi) of one chunk, from the output gradients B kept. */
static void weight_chunk(const stage *s, stage_worker *wk, float *grads, const stage_slot *sl,
                         int off, int n, int lo, int hi)
{
    stage_chunk_io io = {.s = s, .sl = sl, .off = (size_t)off, .grads = grads};
    layer_run r = chunk_run(s, wk, &io, n);
    (void)layer_run_weight(&r, lo, hi);
}

/* Local layers [lo, hi) of one chunk, from the gradient of layer hi − 1's output (dout's
 * rows, or the rows the range above left in the carry). Below lo > 0 the gradient is left
 * in the carry, in the chunk's own rows off · widest: chunks never share carry memory.
 * parts: BW_BOTH, or BW_INPUT alone (the split backward's B, which keeps each parameter
 * layer's output gradient in the slot for W). Batched dense layers stash their rows. */
static void backward_chunk(const stage *s, stage_worker *wk, float *grads, const stage_slot *sl,
                           int off, int n, int lo, int hi, const float *dout, float *din,
                           int parts)
{
    if (parts == BW_WEIGHT) {
        weight_chunk(s, wk, grads, sl, off, n, lo, hi);
        return;
    }
    const float *g = dout;
    int gi = -1; /* which scratch buffer g lives in, −1 for the caller's */
    stage_chunk_io io = {.s = s, .sl = sl, .off = (size_t)off, .grads = grads};
    layer_run r = chunk_run(s, wk, &io, n);
    (void)layer_run_backward(&r, lo, hi, &g, &gi, wk->scratch, din, parts);
    if (lo > 0) {
        /* g is the carry itself only when every layer of the range passed it through */
        float *carry = s->carry + (size_t)off * s->widest;
        size_t count = layer_shape_count(s->loc[lo].in);
        if (g != carry) memcpy(carry, g, (size_t)n * count * sizeof(float));
    }
}

/* The parameters of local layers [lo, hi) whose gradients a backward forms per micro-batch
 * (all but batched layers) as at most `cap` maximal runs [begin, end) of offsets. */
static int grad_runs(const stage *s, int lo, int hi, size_t (*runs)[2], int cap)
{
    int n = 0;
    for (int i = lo; i < hi; i++) {
        size_t b = s->param_off[i], e = stage_param_end(s, i + 1);
        if (b == e || batched(s, i)) continue;
        /* past `cap` runs, the last one spans a batched layer too: its groups are zeroed
         * and summed for nothing, and stage_wgrad_flush overwrites its gradient */
        if (n && (runs[n - 1][1] == b || n == cap)) runs[n - 1][1] = e;
        else runs[n][0] = b, runs[n++][1] = e;
    }
    return n;
}

enum { MAX_RUNS = 64 };

static void backward_worker(void *arg, int t)
{
    chunk_job *j = arg;
    stage *s = j->s;
    int nl = s->last - s->first;
    size_t in_count = layer_shape_count(s->loc[0].in),
           out_count = layer_shape_count(s->loc[nl - 1].out);
    int top = j->hi == nl; /* the gradient comes from dout, else the carry */
    size_t runs[MAX_RUNS][2];
    int nr = j->parts & BW_WEIGHT ? grad_runs(s, j->lo, j->hi, runs, MAX_RUNS) : 0;
    for (int g = t; g < s->groups && g * j->chunk < j->n; g += s->threads) {
        if (g > 0 || s->group_grads[0] == s->mb_grads)
            for (int r = 0; r < nr; r++)
                memset(s->group_grads[g] + runs[r][0], 0,
                       (runs[r][1] - runs[r][0]) * sizeof(float));
        for (int off = g * j->chunk; off < j->n; off += s->groups * j->chunk)
            backward_chunk(s, &s->workers[t], s->group_grads[g], j->sl, off, chunk_len(j, off),
                           j->lo, j->hi,
                           top ? j->dout + (size_t)off * out_count
                               : s->carry + (size_t)off * s->widest,
                           j->din ? j->din + (size_t)off * in_count : NULL, j->parts);
    }
}

typedef struct {
    stage *s;
    int used;   /* groups that received chunks */
    float *dst; /* where the micro-batch's gradient goes (or is added) */
    size_t begin, end; /* the parameters [begin, end) whose gradients the backward formed */
} reduce_job;

/* The micro-batch's gradient g0 + g1 + ... in group order, added to grads when group 0 was
 * summed apart (grads += that sum, so the micro-batch's gradient is rounded on its own
 * first); each thread sums one range of elements. Element by element, so any partition of
 * the elements (a backward by layer ranges) gives the same bits. */
static void reduce_worker(void *arg, int t)
{
    reduce_job *r = arg;
    stage *s = r->s;
    size_t per = (r->end - r->begin + s->threads - 1) / s->threads;
    size_t lo = r->begin + (size_t)t * per, hi = lo + per < r->end ? lo + per : r->end;
    float *restrict dst = r->dst;
    if (s->group_grads[0] == dst) {
        for (int g = 1; g < r->used; g++) {
            const float *restrict src = s->group_grads[g];
            for (size_t i = lo; i < hi; i++) dst[i] += src[i];
        }
        return;
    }
    enum { BLOCK = 1024 }; /* a block of partial sums stays in the L1 cache across groups */
    float sum[BLOCK];
    for (size_t b = lo; b < hi; b += BLOCK) {
        size_t n = hi - b < BLOCK ? hi - b : BLOCK;
        memcpy(sum, s->group_grads[0] + b, n * sizeof(float));
        for (int g = 1; g < r->used; g++) {
            const float *restrict src = s->group_grads[g] + b;
            for (size_t i = 0; i < n; i++) sum[i] += src[i];
        }
        for (size_t i = 0; i < n; i++) dst[b + i] += sum[i];
    }
}

/* Local layers [lo, hi) of the slot's micro-batch: the chunks' gradient groups of those
 * layers' parameters are zeroed, formed and summed into the target. `add` (a micro-batch
 * after the first, summed apart in mb_grads) does not change between the ranges of one
 * micro-batch, since only the last range (lo = 0) sets `accumulated`. */
static void backward_span_local(stage *s, int slot, int lo, int hi, const float *dout,
                                float *din, float *grads, int parts)
{
    stage_slot *sl = &s->slots[slot];
    chunk_job j = {.s = s, .sl = sl, .n = sl->n, .chunk = stage_chunk(s, sl->n), .dout = dout,
                   .din = din, .lo = lo, .hi = hi, .parts = parts};
    if (!(parts & BW_WEIGHT)) {
        pool_run(s->pool, backward_worker, &j);
        return;
    }
    size_t runs[MAX_RUNS][2];
    int nr = grad_runs(s, lo, hi, runs, MAX_RUNS);
    /* `grads` alone is the first micro-batch's case: its gradient is formed in place */
    float *target = grads ? grads : s->grads;
    int add = !grads && s->accumulated;
    for (int r = 0; grads && r < nr; r++)
        memset(grads + runs[r][0], 0, (runs[r][1] - runs[r][0]) * sizeof(float));
    s->group_grads[0] = add ? s->mb_grads : target;
    pool_run(s->pool, backward_worker, &j);
    int used = (sl->n + j.chunk - 1) / j.chunk;
    if (used > s->groups) used = s->groups;
    for (int k = 0; k < nr && (used > 1 || add); k++) {
        reduce_job r = {.s = s, .used = used, .dst = target, .begin = runs[k][0],
                        .end = runs[k][1]};
        pool_run(s->pool, reduce_worker, &r);
    }
    if (!grads && lo == 0) s->accumulated = 1;
}

/* Tensor shards: the carried gradient at local layer b's input (chunks at off · widest,
 * each its rows of `count`) packed into tp_buf's n contiguous rows, and back: rows of
 * `keep` values from `from` of each packed row (a slice, or the whole row). */
static void carry_pack(stage *s, int n, int chunk, size_t count)
{
    for (int off = 0; off < n; off += chunk) {
        int m = n - off < chunk ? n - off : chunk;
        memcpy(s->tp_buf + (size_t)off * count, s->carry + (size_t)off * s->widest,
               (size_t)m * count * sizeof(float));
    }
}

static void carry_unpack(stage *s, int n, int chunk, size_t count, size_t from, size_t keep)
{
    for (int j = 0; j < n; j++) {
        int off = j / chunk * chunk;
        memcpy(s->carry + (size_t)off * s->widest + (size_t)(j - off) * keep,
               s->tp_buf + (size_t)j * count + from, keep * sizeof(float));
    }
}

/* The backward of local layers [lo, hi) in runs between the collectives: the gradient of
 * an output-split layer's input holds partial sums (all-reduced), a gathered input's
 * gradient is whole (each rank keeps its slice), a sliced stage input's gradient is a slice
 * (all-gathered for the previous stage), and a gathered stage output's gradient arrives
 * whole (sliced first). The weight gradients (W) need none of it. */
static void backward_span(stage *s, int slot, int lo, int hi, const float *dout, float *din,
                          float *grads, int parts)
{
    if (!s->tp || parts == BW_WEIGHT) {
        backward_span_local(s, slot, lo, hi, dout, din, grads, parts);
        return;
    }
    const net_desc *net = s->net;
    const shard_plan *tp = s->tp;
    stage_slot *sl = &s->slots[slot];
    int nl = s->last - s->first, n = sl->n, chunk = stage_chunk(s, n);
    if (hi == nl && sl->whole_out) {
        tp_slice(s, &tp->layers[s->last - 1].out, layer_shape_count(net->layers[s->last - 1].out),
                 dout, s->tp_dout, n);
        dout = s->tp_dout;
    }
    for (int h = hi; h > lo;) {
        int b = shard_backward_stop(tp, s->first, lo, h);
        int slice_in = b == 0 && sl->xin[0]; /* the gradient of a sliced stage input */
        backward_span_local(s, slot, b, h, h == nl ? dout : NULL,
                            b == 0 ? (slice_in && din ? s->tp_din : din) : NULL, grads, parts);
        int l = s->first + b;
        size_t whole = layer_shape_count(net->layers[l].in);
        if (b > 0 && tp->layers[l].split == SHARD_OUT) {
            carry_pack(s, n, chunk, whole);
            if (tp_allreduce(s, s->tp_buf, (size_t)n * whole)) return;
            size_t from = 0, keep = whole;
            if (sl->xin[b]) /* gathered input: back to the previous layer's slice */
                shard_values(&tp->layers[l - 1].out, whole, tp->T, s->tp_rank, &from, &keep);
            carry_unpack(s, n, chunk, whole, from, keep);
        } else if (b == 0 && din && tp->layers[l].split == SHARD_OUT) {
            if (tp_allreduce(s, din, (size_t)n * whole)) return;
        } else if (slice_in && din) {
            if (tp_gather(s, &tp->layers[l].in, whole, s->tp_din, din, n)) return;
        }
        h = b;
    }
}

void stage_backward(stage *s, int slot, const float *dout, float *din)
{
    stage_backward_to(s, slot, dout, din, NULL);
}

void stage_backward_to(stage *s, int slot, const float *dout, float *din, float *grads)
{
    backward_span(s, slot, 0, s->last - s->first, dout, din, grads, BW_BOTH);
}

int stage_backward_range(stage *s, int slot, int lo, int hi, const float *dout, float *din,
                         float *grads)
{
    int nl = s->last - s->first;
    if (lo < 0 || hi > nl || lo >= hi)
        return pt_error_set("stage %d..%d: backward of local layers [%d, %d), outside the "
                            "stage's %d", s->first, s->last - 1, lo, hi, nl);
    if (s->range_hi == 0 ? hi != nl
                         : hi != s->range_hi || slot != s->range_slot || grads != s->range_grads)
        return pt_error_set("stage %d..%d: backward of local layers [%d, %d) out of order: "
                            "expected %s ending at %d", s->first, s->last - 1, lo, hi,
                            s->range_hi ? "the same micro-batch's next range" : "a first range",
                            s->range_hi ? s->range_hi : nl);
    if (lo > 0 && !s->carry) {
        s->carry = alloc_zeroed((size_t)s->max_batch * s->widest * sizeof(float));
        if (!s->carry)
            return pt_error_set("stage %d..%d: out of memory for the gradients carried "
                                "between backward ranges", s->first, s->last - 1);
    }
    backward_span(s, slot, lo, hi, dout, din, grads, BW_BOTH);
    s->range_hi = lo;
    s->range_slot = slot;
    s->range_grads = grads;
    return 0;
}

size_t stage_split_slot_bytes(const net_desc *net, int first, int last, int max_batch)
{
    size_t bytes = 0;
    for (int l = first; l < last; l++)
        if (net->layers[l].weight_count)
            bytes += round_up((size_t)max_batch * layer_shape_count(net->layers[l].out) *
                              sizeof(float));
    return bytes;
}

int stage_enable_split(stage *s)
{
    if (s->split) return 0;
    int nl = s->last - s->first;
    size_t per = stage_split_slot_bytes(s->net, s->first, s->last, s->max_batch);
    s->split_memory = alloc_zeroed(per * (size_t)s->n_slots);
    if (!s->split_memory)
        return pt_error_set("stage %d..%d: out of memory for the output gradients of %d "
                            "micro-batches (split backward)", s->first, s->last - 1, s->n_slots);
    char *mem = s->split_memory;
    for (int k = 0; k < s->n_slots; k++) {
        stage_slot *sl = &s->slots[k];
        if (!(sl->gout = calloc((size_t)nl, sizeof *sl->gout)))
            return pt_error_set("stage %d..%d: out of memory", s->first, s->last - 1);
        for (int i = 0; i < nl; i++) {
            const layer_desc *L = &s->loc[i];
            if (!L->weight_count) continue;
            sl->gout[i] = (float *)mem;
            mem += round_up((size_t)s->max_batch * layer_shape_count(L->out) * sizeof(float));
        }
    }
    s->split = 1;
    return 0;
}

int stage_backward_input(stage *s, int slot, const float *dout, float *din)
{
    if (!s->split)
        return pt_error_set("stage %d..%d: backward_input without stage_enable_split",
                            s->first, s->last - 1);
    if (s->range_hi)
        return pt_error_set("stage %d..%d: backward_input while a backward by ranges is "
                            "unfinished", s->first, s->last - 1);
    backward_span(s, slot, 0, s->last - s->first, dout, din, NULL, BW_INPUT);
    return 0;
}

int stage_backward_weight(stage *s, int slot, int lo, int hi, float *grads)
{
    int nl = s->last - s->first;
    if (!s->split)
        return pt_error_set("stage %d..%d: backward_weight without stage_enable_split",
                            s->first, s->last - 1);
    if (lo < 0 || hi > nl || lo >= hi)
        return pt_error_set("stage %d..%d: weight gradients of local layers [%d, %d), outside "
                            "the stage's %d", s->first, s->last - 1, lo, hi, nl);
    backward_span(s, slot, lo, hi, NULL, NULL, grads, BW_WEIGHT);
    return 0;
}

size_t stage_wgrad_row_bytes(const net_desc *net, int first, int last)
{
    size_t bytes = 0;
    for (int l = first; l < last; l++) {
        const layer_desc *L = &net->layers[l];
        if (L->type == LAYER_DENSE)
            bytes += (layer_shape_count(L->in) + layer_shape_count(L->out)) * sizeof(float);
    }
    return bytes;
}

int stage_enable_batched_wgrad(stage *s, int rows)
{
    int nl = s->last - s->first;
    if (rows < 1 || s->wgrad_rows)
        return pt_error_set("stage %d..%d: batched weight gradients over %d rows (already: %d)",
                            s->first, s->last - 1, rows, s->wgrad_rows);
    s->stash_x = calloc((size_t)nl, sizeof *s->stash_x);
    s->stash_g = calloc((size_t)nl, sizeof *s->stash_g);
    size_t total = 0;
    for (int i = 0; i < nl; i++) {
        const layer_desc *L = &s->loc[i];
        if (L->type == LAYER_DENSE)
            total += round_up((size_t)rows * layer_shape_count(L->in) * sizeof(float)) +
                     round_up((size_t)rows * layer_shape_count(L->out) * sizeof(float));
    }
    s->stash_memory = total ? alloc_zeroed(total) : NULL;
    if (!s->stash_x || !s->stash_g || (total && !s->stash_memory))
        return pt_error_set("stage %d..%d: out of memory for the batched weight gradients' "
                            "%zu bytes (%d rows)", s->first, s->last - 1, total, rows);
    char *mem = s->stash_memory;
    for (int i = 0; i < nl; i++) {
        const layer_desc *L = &s->loc[i];
        if (L->type != LAYER_DENSE) continue;
        s->stash_x[i] = (float *)mem;
        mem += round_up((size_t)rows * layer_shape_count(L->in) * sizeof(float));
        s->stash_g[i] = (float *)mem;
        mem += round_up((size_t)rows * layer_shape_count(L->out) * sizeof(float));
    }
    s->stash_bytes = total;
    s->wgrad_rows = rows;
    return 0;
}

void stage_slot_set_row(stage *s, int slot, int row) { s->slots[slot].row = row; }

/* Tiles of a batched product: TILE output units of one layer, dealt to the threads in
 * order; each tile's sums run over the rows in order whatever the thread count. */
enum { WGRAD_TILE = 512 };

typedef struct {
    stage *s;
    int lo, hi;
} flush_job;

static void flush_worker(void *arg, int t)
{
    flush_job *j = arg;
    stage *s = j->s;
    int rows = s->wgrad_rows, k = 0;
    for (int i = j->lo; i < j->hi; i++) {
        if (!batched(s, i)) continue;
        const layer_desc *L = &s->loc[i];
        int in = (int)layer_shape_count(L->in), out = L->u.dense.units;
        float *dw = s->grads + s->param_off[i], *db = dw + L->weight_count;
        for (int a = 0; a < out; a += WGRAD_TILE, k++) {
            if (k % s->threads != t) continue;
            int w = out - a < WGRAD_TILE ? out - a : WGRAD_TILE;
            kernel_dense_weight_grad_units_cpu(dw, db, s->stash_g[i], s->stash_x[i], rows, in,
                                               out, a, w);
        }
    }
}

void stage_wgrad_flush(stage *s, int lo, int hi)
{
    if (!s->wgrad_rows) return;
    flush_job j = {.s = s, .lo = lo, .hi = hi};
    pool_run(s->pool, flush_worker, &j);
}

void stage_zero_grad(stage *s)
{
    memset(s->grads, 0, s->param_count * sizeof(float));
    s->accumulated = 0;
    s->range_hi = 0;
}

void stage_step(stage *s, const optimizer_config *o)
{
    s->step++;
    size_t P = s->param_count;
    switch (o->kind) {
    case OPTIM_SGD:
        kernel_sgd_update_cpu(s->params, s->grads, P, o->lr, o->weight_decay);
        break;
    case OPTIM_MOMENTUM:
        kernel_momentum_update_cpu(s->params, s->opt_m, s->grads, P, o->lr, o->momentum,
                                   o->weight_decay);
        break;
    case OPTIM_ADAM:
        kernel_adam_update_cpu(s->params, s->opt_m, s->opt_v, s->grads, P, o->lr, o->beta1,
                               o->beta2, o->eps, o->weight_decay, s->step);
        break;
    }
}
