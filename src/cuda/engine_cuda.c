/* The CUDA engine (src/engine/engine.h): creation, the memory layout, parameters, the optimizer
 * step, samples and finish. Forward, backward and the messages are in engine_cuda_run.c;
 * the state, and how events order the three streams, in engine_cuda_impl.h. */
#include "src/cuda/engine_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/rng.h"
#include "src/base/clock.h"
#include "src/cuda/engine_cuda_impl.h"
#include "src/base/error.h"

static size_t round_up(size_t x)
{
    return (x + ENGINE_CUDA_ALIGN - 1) / ENGINE_CUDA_ALIGN * ENGINE_CUDA_ALIGN;
}

/* ---------------------------------------------------------------- memory layout ---- */

/* One pass of the layout counts bytes (base NULL: every pointer comes out NULL); the next,
 * over the allocation, hands out the same offsets. */
typedef struct {
    char *base;
    size_t used;
} arena;

static void *arena_take(arena *a, size_t bytes)
{
    if (!bytes) return NULL;
    void *p = a->base ? a->base + a->used : NULL;
    a->used += round_up(bytes);
    return p;
}

/* Bytes of one slot's storage for layer L at batch n, counted as stage.c's
 * layer_slot_bytes does (so slot_bytes agrees with the CPU engine's). */
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

static void layout(const engine *e, cuda_engine *c, arena *d, arena *h)
{
    const engine_config *cfg = &e->cfg;
    size_t mbs = (size_t)cfg->max_batch, fl = sizeof(float);
    /* params | grads | m | v | mb_grads | pieces 1.., each block rounded so every block
     * stays aligned */
    size_t block = round_up(e->param_count * fl);
    char *p = arena_take(d, (size_t)(4 + c->pieces) * block);
    c->params = p ? (float *)p : NULL;
    c->grads = p ? (float *)(p + block) : NULL;
    c->opt_m = p ? (float *)(p + 2 * block) : NULL;
    c->opt_v = p ? (float *)(p + 3 * block) : NULL;
    c->mb_grads = p ? (float *)(p + 4 * block) : NULL;
    for (int k = 0; k < c->pieces; k++)
        c->piece[k] = !p ? NULL : k ? (float *)(p + (size_t)(4 + k) * block) : c->grads;
    char *hg = arena_take(h, (size_t)c->pieces * block);
    c->h_grads = hg ? (float *)hg : NULL;
    for (int k = 0; k < cfg->n_slots; k++) {
        for (int l = c->first; l < c->last; l++) {
            slot_layer *sl = &c->slots[k].layers[l - c->first];
            const layer_desc *L = &c->loc[l - c->first];
            size_t ob, ab, mb;
            layer_slot_bytes(L, cfg->max_batch, &ob, &ab, &mb);
            sl->buf = arena_take(d, ob);
            sl->argmax = arena_take(d, ab);
            sl->mask = arena_take(d, mb);
            /* split backward: B's output gradient for W (batched layers stash theirs) */
            sl->gout = cfg->split_backward && L->weight_count &&
                               !engine_cuda_batched(c, l - c->first)
                           ? arena_take(d, mbs * layer_shape_count(L->out) * fl)
                           : NULL;
            sl->xin = c->tp ? arena_take(d, mbs * shard_slot_input(c->tp, c->net, l, c->first,
                                                                    c->tp_rank) * fl)
                            : NULL;
        }
        c->slots[k].whole_out =
            c->tp && c->tp->layers[c->last - 1].out.sharded ? arena_take(d, mbs * e->out_count * fl)
                                                             : NULL;
    }
    if (c->tp) {
        size_t wide = c->widest * mbs * fl;
        c->tp_dout = arena_take(d, wide);
        c->tp_din = arena_take(d, wide);
        c->tp_recv = c->dm ? arena_take(d, wide) : NULL;
        c->h_tp = c->dm ? NULL : arena_take(h, wide);
        c->h_tp_send = c->dm ? NULL : arena_take(h, wide);
    }
    for (int i = 0; i < c->nl; i++) {
        const layer_desc *L = &c->loc[i];
        if (!engine_cuda_batched(c, i)) continue;
        size_t rows = (size_t)c->wgrad_rows;
        c->stash_x[i] = arena_take(d, rows * layer_shape_count(L->in) * fl);
        c->stash_g[i] = arena_take(d, rows * layer_shape_count(L->out) * fl);
    }
    c->work = arena_take(d, c->work_floats * fl);
    for (int k = 0; k < 2; k++) c->scratch[k] = arena_take(d, c->widest * mbs * fl);
    for (int m = 0; m < cfg->buffers; m++) {
        cuda_mb *b = &c->mb[m];
        b->in = arena_take(d, mbs * e->in_count * fl);
        b->grad_in = arena_take(d, mbs * e->out_count * fl);
        b->grad_out = c->is_first ? NULL : arena_take(d, mbs * e->in_count * fl);
        b->pixels = c->is_first ? arena_take(d, mbs * e->in_count) : NULL;
        b->labels = c->is_last ? arena_take(d, mbs * sizeof(int32_t)) : NULL;
        b->ids = c->has_dropout ? arena_take(d, mbs * sizeof(int64_t)) : NULL;
        b->act_out = cfg->recompute && !c->is_last ? arena_take(d, mbs * e->out_count * fl)
                                                   : NULL;
        b->h_pixels = c->is_first ? arena_take(h, mbs * e->in_count) : NULL;
        b->h_labels = c->is_last ? arena_take(h, mbs * sizeof(int32_t)) : NULL;
        b->h_ids = c->has_dropout ? arena_take(h, mbs * sizeof(int64_t)) : NULL;
        if (!c->dm) {
            b->h_act_in = c->is_first ? NULL : arena_take(h, mbs * e->in_count * fl);
            b->h_grad_in = c->is_last ? NULL : arena_take(h, mbs * e->out_count * fl);
            b->h_act_out = arena_take(h, mbs * e->out_count * fl);
            b->h_grad_out = c->is_first ? NULL : arena_take(h, mbs * e->in_count * fl);
        }
    }
    if (c->is_last) {
        c->d_loss = arena_take(d, LOSS_CAPACITY * sizeof(double));
        c->d_correct = arena_take(d, LOSS_CAPACITY * sizeof(int));
        c->h_loss = arena_take(h, LOSS_CAPACITY * sizeof(double));
        c->h_correct = arena_take(h, LOSS_CAPACITY * sizeof(int));
    }
}

/* Host-side bookkeeping, the stage's sizes, and the two allocations. */
static int create_memory(engine *e, cuda_engine *c)
{
    const engine_config *cfg = &e->cfg;
    int nl = c->nl;
    c->param_off = calloc((size_t)nl, sizeof *c->param_off);
    c->slots = calloc((size_t)cfg->n_slots, sizeof *c->slots);
    c->slot_layers = calloc((size_t)cfg->n_slots * (size_t)nl, sizeof *c->slot_layers);
    c->mb = calloc((size_t)cfg->buffers, sizeof *c->mb);
    c->tick_ev = calloc(2 * (size_t)cfg->max_ticks + 1, sizeof *c->tick_ev);
    c->tick_used = calloc((size_t)cfg->max_ticks + 1, 1);
    c->pieces = cfg->grad_pieces > 1 ? cfg->grad_pieces : 1;
    c->piece = calloc((size_t)c->pieces, sizeof *c->piece);
    c->ev_grads = calloc((size_t)nl, sizeof *c->ev_grads);
    c->grads_ev = calloc((size_t)nl, sizeof *c->grads_ev);
    c->wgrad_rows = cfg->wgrad_rows > 0 ? cfg->wgrad_rows : 0;
    c->stash_x = calloc((size_t)nl, sizeof *c->stash_x);
    c->stash_g = calloc((size_t)nl, sizeof *c->stash_g);
    c->runs = calloc((size_t)nl, sizeof *c->runs);
    c->loc = calloc((size_t)nl, sizeof *c->loc);
    if (!c->param_off || !c->slots || !c->slot_layers || !c->mb || !c->tick_ev ||
        !c->tick_used || !c->piece || !c->ev_grads || !c->grads_ev || !c->stash_x ||
        !c->stash_g || !c->runs || !c->loc)
        return pt_error_set("CUDA engine: out of host memory");
    /* tensor shards: this rank's layers and parameters (engine_base_init counted whole ones) */
    for (int i = 0; i < nl; i++)
        c->loc[i] = c->tp ? shard_local_layer(c->tp, c->net, c->first + i, c->tp_rank)
                          : c->net->layers[c->first + i];
    if (c->tp) e->param_count = shard_param_count(c->tp, c->net, c->first, c->last, c->tp_rank);
    for (int k = 0; k < cfg->n_slots; k++) c->slots[k].layers = c->slot_layers + (size_t)k * nl;
    for (int m = 0; m < cfg->buffers; m++) c->mb[m].slot = -1;

    size_t off = 0, slot_bytes = 0;
    for (int l = c->first; l < c->last; l++) {
        const layer_desc *L = &c->loc[l - c->first];
        c->param_off[l - c->first] = off;
        off += L->weight_count + L->bias_count;
        if (L->type == LAYER_CONV) {
            kernel_conv2d_dims dd = engine_cuda_conv_dims(L, cfg->max_batch);
            size_t ws = kernel_conv2d_workspace_floats_cuda(&dd);
            if (ws > c->work_floats) c->work_floats = ws;
        }
        if (layer_kind_of(L->type)->mask) c->has_dropout = 1;
        /* whole vectors: the local ones are no wider, and tensor collectives move whole ones */
        const layer_desc *W = &c->net->layers[l];
        size_t in = layer_shape_count(W->in), out = layer_shape_count(W->out);
        if (in > c->widest) c->widest = in;
        if (out > c->widest) c->widest = out;
        size_t a, b, m;
        slot_bytes += layer_slot_bytes(L, cfg->max_batch, &a, &b, &m);
        if (c->tp)
            slot_bytes += round_up((size_t)cfg->max_batch *
                                   shard_slot_input(c->tp, c->net, l, c->first, c->tp_rank) *
                                   sizeof(float));
    }
    if (c->tp && c->tp->layers[c->last - 1].out.sharded)
        slot_bytes += round_up((size_t)cfg->max_batch * e->out_count * sizeof(float));
    e->slot_bytes = slot_bytes;
    c->needs_load = c->is_first || c->is_last || c->has_dropout;

    arena d = {NULL, 0}, h = {NULL, 0};
    layout(e, c, &d, &h);
    c->dmem_bytes = d.used;
    c->hmem_bytes = h.used;
    cudaError_t r = cudaMalloc(&c->dmem, d.used ? d.used : ENGINE_CUDA_ALIGN);
    if (r != cudaSuccess) {
        c->dmem = NULL;
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&free_b, &total_b);
        return pt_error_set("CUDA engine, layers %d..%d on device %d: cannot allocate %zu bytes "
                            "(%.1f MiB) of device memory (%.1f MiB free of %.1f MiB; batch %d, "
                            "%d slots, %d buffers): cudaMalloc: %s",
                            c->first, c->last - 1, c->device, d.used, d.used / 1048576.0,
                            free_b / 1048576.0, total_b / 1048576.0, cfg->max_batch,
                            cfg->n_slots, cfg->buffers, cudaGetErrorString(r));
    }
    r = cudaHostAlloc(&c->hmem, h.used ? h.used : ENGINE_CUDA_ALIGN, cudaHostAllocDefault);
    if (r != cudaSuccess) {
        c->hmem = NULL;
        (void)cudaGetLastError();
        return pt_error_set("CUDA engine, layers %d..%d: cannot allocate %zu bytes of pinned "
                            "host memory: cudaHostAlloc: %s",
                            c->first, c->last - 1, h.used, cudaGetErrorString(r));
    }
    d.base = c->dmem;
    h.base = c->hmem;
    d.used = h.used = 0;
    layout(e, c, &d, &h);
    /* Zero once: gradients and optimizer state must start at zero, and no kernel then reads
     * memory that was never written (compute-sanitizer's initcheck stays quiet). */
    CUDA_CHECK(cudaMemsetAsync(c->dmem, 0, c->dmem_bytes ? c->dmem_bytes : ENGINE_CUDA_ALIGN,
                               c->ctx.stream));
    memset(c->hmem, 0, c->hmem_bytes ? c->hmem_bytes : ENGINE_CUDA_ALIGN);
    return 0;
}

static int create_events(engine *e, cuda_engine *c)
{
    const unsigned sync_only = cudaEventDisableTiming;
    for (int m = 0; m < e->cfg.buffers; m++) {
        cuda_mb *b = &c->mb[m];
        cudaEvent_t *evs[] = {&b->ev_loaded, &b->ev_act_in,  &b->ev_grad_in, &b->ev_fwd,
                              &b->ev_bwd,    &b->ev_act_out, &b->ev_grad_out, &b->ev_late};
        for (size_t i = 0; i < sizeof evs / sizeof *evs; i++)
            CUDA_CHECK(cudaEventCreateWithFlags(evs[i], sync_only));
    }
    for (int k = 0; k < e->cfg.n_slots; k++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->slots[k].ev_read, sync_only));
    /* the timing events keep their timestamps (cudaEventElapsedTime) */
    CUDA_CHECK(cudaEventCreateWithFlags(&c->anchor, cudaEventDefault));
    for (int t = 0; t < 2 * e->cfg.max_ticks; t++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->tick_ev[t], cudaEventDefault));
    for (int i = 0; i < c->nl; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->ev_grads[i], sync_only));
    return 0;
}

static void cuda_destroy(engine *e)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (c) {
        /* No error channel: wait for what is queued, then release what exists. */
        if (c->ctx.stream) {
            (void)cudaSetDevice(c->device);
            (void)cudaStreamSynchronize(c->ctx.stream);
        }
        if (c->h2d) (void)cudaStreamSynchronize(c->h2d);
        if (c->d2h) (void)cudaStreamSynchronize(c->d2h);
        if (c->gstream) (void)cudaStreamSynchronize(c->gstream);
        if (c->mb) {
            for (int m = 0; m < e->cfg.buffers; m++) {
                cuda_mb *b = &c->mb[m];
                cudaEvent_t evs[] = {b->ev_loaded, b->ev_act_in,  b->ev_grad_in, b->ev_fwd,
                                     b->ev_bwd,    b->ev_act_out, b->ev_grad_out, b->ev_late};
                for (size_t i = 0; i < sizeof evs / sizeof *evs; i++)
                    if (evs[i]) (void)cudaEventDestroy(evs[i]);
            }
        }
        if (c->slots)
            for (int k = 0; k < e->cfg.n_slots; k++)
                if (c->slots[k].ev_read) (void)cudaEventDestroy(c->slots[k].ev_read);
        if (c->anchor) (void)cudaEventDestroy(c->anchor);
        if (c->tick_ev)
            for (int t = 0; t < 2 * e->cfg.max_ticks; t++)
                if (c->tick_ev[t]) (void)cudaEventDestroy(c->tick_ev[t]);
        if (c->ev_grads)
            for (int i = 0; i < c->nl; i++)
                if (c->ev_grads[i]) (void)cudaEventDestroy(c->ev_grads[i]);
        if (c->dmem) (void)cudaFree(c->dmem);
        if (c->hmem) (void)cudaFreeHost(c->hmem);
        if (c->h2d) (void)cudaStreamDestroy(c->h2d);
        if (c->d2h) (void)cudaStreamDestroy(c->d2h);
        if (c->gstream) (void)cudaStreamDestroy(c->gstream);
        kernel_cuda_ctx_free(&c->ctx);
        free(c->param_off);
        free(c->slots);
        free(c->slot_layers);
        free(c->mb);
        free(c->tick_ev);
        free(c->tick_used);
        free(c->piece);
        free(c->ev_grads);
        free(c->grads_ev);
        free(c->stash_x);
        free(c->stash_g);
        free(c->runs);
        free(c->loc);
        free(c);
    }
    engine_base_free(e);
    free(e);
}

/* ------------------------------------------------------------------- helpers ---- */

int engine_cuda_check_m(const engine *e, int m, const char *what)
{
    if (m < 0 || m >= e->cfg.buffers)
        return pt_error_set("CUDA engine: %s of micro-batch buffer %d, outside 0..%d", what, m,
                            e->cfg.buffers - 1);
    return 0;
}

/* Adds where a kernel failed to the kernel's own message (copied first: pt_error_set
 * must not read the buffer it writes). */
int engine_cuda_layer_fail(const char *what, int layer, int m)
{
    char msg[768];
    snprintf(msg, sizeof msg, "%s", pt_error_get());
    if (m < 0) return pt_error_set("CUDA engine, %s, layer %d: %s", what, layer, msg);
    return pt_error_set("CUDA engine, %s, layer %d, micro-batch %d: %s", what, layer, m, msg);
}

/* Timed operations: called first, before the operation makes the compute stream wait for
 * anything. The first after a finish records the anchor on an idle compute stream (waited
 * for: after a finish it normally is idle already), so the GPU stamps it at once and its
 * host time is the clock read just after queuing it. */
int engine_cuda_tick_check(engine *e, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (tick < 0) return 0;
    if (tick >= e->cfg.max_ticks)
        return pt_error_set("CUDA engine: tick %d outside 0..%d", tick, e->cfg.max_ticks - 1);
    if (!c->anchored) {
        CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
        CUDA_CHECK(cudaEventRecord(c->anchor, c->ctx.stream));
        c->anchor_host = pt_now();
        c->anchored = 1;
    }
    return 0;
}

/* The operation's work starts here: after its waits, so that a tick times the work, not
 * the wait for an input still on its way. */
int engine_cuda_tick_begin(engine *e, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (tick >= 0) CUDA_CHECK(cudaEventRecord(c->tick_ev[2 * tick], c->ctx.stream));
    return 0;
}

int engine_cuda_tick_end(engine *e, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (tick < 0) return 0;
    CUDA_CHECK(cudaEventRecord(c->tick_ev[2 * tick + 1], c->ctx.stream));
    c->tick_used[tick] = 1;
    return 0;
}

/* Reads the queued per-micro-batch losses (after the compute stream has run them) and adds
 * them to the sums in the order their forwards were queued. */
int engine_cuda_loss_drain(cuda_engine *c)
{
    int n = c->n_loss;
    if (!n) return 0;
    cudaStream_t s = c->ctx.stream;
    CUDA_CHECK(cudaMemcpyAsync(c->h_loss, c->d_loss, (size_t)n * sizeof(double),
                               cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaMemcpyAsync(c->h_correct, c->d_correct, (size_t)n * sizeof(int),
                               cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    for (int k = 0; k < n; k++) {
        if (!isfinite(c->h_loss[k])) c->sums.nonfinite = 1;
        c->sums.loss_sum += c->h_loss[k];
        c->sums.correct += c->h_correct[k];
    }
    c->n_loss = 0;
    return 0;
}

/* ---------------------------------------------------------------- parameters ---- */

/* A run of layer `layer`'s whole parameters that this engine holds at w + local: the same
 * draws as the whole tensor's (stage_init_params' rule). */
typedef struct {
    cuda_engine *c;
    float *w;            /* the local layer's parameters: weight, then bias */
    size_t weight_count; /* of the whole layer */
    float bound;
    uint64_t seed;
    int layer, rc;
} init_ctx;

static void init_run(void *arg, size_t whole, size_t local, size_t count)
{
    init_ctx *x = arg;
    int bias = whole >= x->weight_count;
    if (!x->rc)
        x->rc = kernel_init_uniform_range_cuda(x->w + local, bias ? whole - x->weight_count
                                                                  : whole,
                                               count, x->bound, x->seed,
                                               rng_stream_init(x->layer, bias), &x->c->ctx);
}

static int cuda_init_params(engine *e, uint64_t seed)
{
    cuda_engine *c = engine_cuda_impl(e);
    CUDA_CHECK(cudaSetDevice(c->device));
    for (int l = c->first; l < c->last; l++) {
        const layer_desc *L = &c->net->layers[l]; /* the whole layer: its fan-in */
        if (!L->weight_count) continue;
        size_t fan_in = L->weight_count / (L->type == LAYER_CONV ? (size_t)L->u.conv.filters
                                                                  : (size_t)L->u.dense.units);
        /* stage_init_params' bound: kaiming_uniform(a=√5) and torch's bias rule, 1/√fan_in */
        init_ctx x = {.c = c, .w = c->params + c->param_off[l - c->first],
                      .weight_count = L->weight_count,
                      .bound = (float)(1.0 / sqrt((double)fan_in)), .seed = seed, .layer = l};
        if (c->tp) {
            shard_layer_runs(c->tp, c->net, l, c->tp_rank, init_run, &x);
        } else {
            init_run(&x, 0, 0, L->weight_count);
            init_run(&x, L->weight_count, L->weight_count, L->bias_count);
        }
        if (x.rc) return engine_cuda_layer_fail("initialisation", l, -1);
    }
    c->step = 0;
    return 0;
}

/* Copies on the compute stream, then waits: ordered after every queued update and before
 * anything queued later, and done when the call returns. */
static int cuda_read_params(engine *e, float *host)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!e->param_count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaMemcpyAsync(host, c->params, e->param_count * sizeof(float),
                               cudaMemcpyDeviceToHost, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

static int cuda_write_params(engine *e, const float *host)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!e->param_count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaMemcpyAsync(c->params, host, e->param_count * sizeof(float),
                               cudaMemcpyHostToDevice, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

/* The optimizer's moments, copied like the parameters; the update count lives on the host. */
static int cuda_read_state(engine *e, float *m, float *v, long *updates)
{
    cuda_engine *c = engine_cuda_impl(e);
    *updates = c->step;
    if (!e->param_count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaMemcpyAsync(m, c->opt_m, e->param_count * sizeof(float),
                               cudaMemcpyDeviceToHost, c->ctx.stream));
    CUDA_CHECK(cudaMemcpyAsync(v, c->opt_v, e->param_count * sizeof(float),
                               cudaMemcpyDeviceToHost, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

static int cuda_write_state(engine *e, const float *m, const float *v, long updates)
{
    cuda_engine *c = engine_cuda_impl(e);
    c->step = updates;
    if (!e->param_count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaMemcpyAsync(c->opt_m, m, e->param_count * sizeof(float),
                               cudaMemcpyHostToDevice, c->ctx.stream));
    CUDA_CHECK(cudaMemcpyAsync(c->opt_v, v, e->param_count * sizeof(float),
                               cudaMemcpyHostToDevice, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

/* ------------------------------------------------------------------ gradients ---- */

int engine_cuda_grads_written(cuda_engine *c, int lo, int hi)
{
    CUDA_CHECK(cudaEventRecord(c->ev_grads[lo], c->ctx.stream));
    for (int i = lo; i < hi; i++) c->grads_ev[i] = lo;
    return 0;
}

/* Piece 0 (the stage's gradients) zeroed on the compute stream; a backward by ranges left
 * unfinished is abandoned. */
static int zero_grads(cuda_engine *c, size_t P)
{
    if (P) CUDA_CHECK(cudaMemsetAsync(c->grads, 0, P * sizeof(float), c->ctx.stream));
    c->accumulated = 0;
    c->range_hi = 0;
    return engine_cuda_grads_written(c, 0, c->nl);
}

static int cuda_zero_grads(engine *e)
{
    cuda_engine *c = engine_cuda_impl(e);
    CUDA_CHECK(cudaSetDevice(c->device));
    return zero_grads(c, e->param_count);
}

static int check_grads_range(const engine *e, int piece, size_t off, size_t count,
                             const char *what)
{
    const cuda_engine *c = e->impl;
    if (piece < 0 || piece >= c->pieces || off > e->param_count || count > e->param_count - off)
        return pt_error_set("CUDA engine: %s of gradients [%zu, %zu) of piece %d, outside the "
                            "stage's %zu in %d piece%s", what, off, off + count, piece,
                            e->param_count, c->pieces, c->pieces > 1 ? "s" : "");
    return 0;
}

/* The local layers whose parameters overlap [off, off + count) (count > 0): [*lo, *hi). */
static void layers_of(const engine *e, size_t off, size_t count, int *lo, int *hi)
{
    const cuda_engine *c = e->impl;
    int i = 0;
    while (i + 1 < c->nl && c->param_off[i + 1] <= off) i++;
    *lo = i;
    while (i < c->nl && c->param_off[i] < off + count) i++;
    *hi = i;
}

/* The copy waits (on the grads stream) only for the compute work that last wrote those
 * layers' gradients, not for what was queued after it (the lower layers' backward). */
static int cuda_grads_host(engine *e, int piece, size_t off, size_t count, float **host)
{
    cuda_engine *c = engine_cuda_impl(e);
    *host = NULL;
    if (check_grads_range(e, piece, off, count, "host view")) return -1;
    size_t stride = round_up(e->param_count * sizeof(float)) / sizeof(float); /* layout's */
    float *mirror = c->h_grads + (size_t)piece * stride;
    if (count) {
        int lo, hi;
        layers_of(e, off, count, &lo, &hi);
        CUDA_CHECK(cudaSetDevice(c->device));
        for (int i = lo; i < hi; i++)
            if (i == lo || c->grads_ev[i] != c->grads_ev[i - 1])
                CUDA_CHECK(cudaStreamWaitEvent(c->gstream, c->ev_grads[c->grads_ev[i]], 0));
        CUDA_CHECK(cudaMemcpyAsync(mirror + off, c->piece[piece] + off, count * sizeof(float),
                                   cudaMemcpyDeviceToHost, c->gstream));
        CUDA_CHECK(cudaStreamSynchronize(c->gstream));
    }
    *host = mirror + off;
    return 0;
}

/* Queued on the compute stream, so the step (queued later) reads the reduced gradients. The
 * mirror is not written again before the next grads_host, whose copy waits for this one. */
static int cuda_grads_commit(engine *e, size_t off, size_t count)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (check_grads_range(e, 0, off, count, "commit")) return -1;
    if (!count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaMemcpyAsync(c->grads + off, c->h_grads + off, count * sizeof(float),
                               cudaMemcpyHostToDevice, c->ctx.stream));
    int lo, hi;
    layers_of(e, off, count, &lo, &hi);
    return engine_cuda_grads_written(c, lo, hi);
}

static int cuda_step(engine *e, const optimizer_config *o, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    size_t P = e->param_count;
    if (c->range_hi)
        return pt_error_set("CUDA engine, layers %d..%d: step while micro-batch %d's backward "
                            "by ranges is unfinished (its next range ends at local layer %d)",
                            c->first, c->last - 1, c->range_m, c->range_hi);
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick) || engine_cuda_tick_begin(e, tick)) return -1;
    c->step++; /* as stage_step: Adam's first update is step 1 */
    int rc = 0;
    switch (o->kind) {
    case OPTIM_SGD:
        rc = kernel_sgd_update_cuda(c->params, c->grads, P, o->lr, o->weight_decay, &c->ctx);
        break;
    case OPTIM_MOMENTUM:
        rc = kernel_momentum_update_cuda(c->params, c->opt_m, c->grads, P, o->lr, o->momentum,
                                         o->weight_decay, &c->ctx);
        break;
    case OPTIM_ADAM:
        rc = kernel_adam_update_cuda(c->params, c->opt_m, c->opt_v, c->grads, P, o->lr,
                                     o->beta1, o->beta2, o->eps, o->weight_decay, c->step,
                                     &c->ctx);
        break;
    default:
        return pt_error_set("CUDA engine: unknown optimizer %d", (int)o->kind);
    }
    if (rc) return -1;
    if (zero_grads(c, P)) return -1;
    return engine_cuda_tick_end(e, tick);
}

/* ------------------------------------------------------------------ samples ---- */

static int cuda_load(engine *e, int m, const dataset *d, const int64_t *ids, int n)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_cuda_check_m(e, m, "load")) return -1;
    if (n < 0 || n > e->cfg.max_batch)
        return pt_error_set("CUDA engine: load of %d samples, outside 0..%d", n,
                            e->cfg.max_batch);
    cuda_mb *b = &c->mb[m];
    if (!c->needs_load) {
        b->loaded_n = n;
        return 0;
    }
    for (int j = 0; j < n; j++)
        if (ids[j] < 0 || ids[j] >= d->count)
            return pt_error_set("CUDA engine: sample %lld outside the data set of %d",
                                (long long)ids[j], d->count);
    size_t px = e->in_count;
    if (c->is_first && (size_t)d->rows * (size_t)d->cols != px)
        return pt_error_set("CUDA engine: images of %dx%d pixels, but the network's input "
                            "has %zu values", d->rows, d->cols, px);
    CUDA_CHECK(cudaSetDevice(c->device));
    /* the previous copy out of these pinned buffers must be over before they are rewritten */
    CUDA_CHECK(cudaEventSynchronize(b->ev_loaded));
    for (int j = 0; j < n; j++) {
        if (c->is_first)
            memcpy(b->h_pixels + (size_t)j * px, d->pixels + (size_t)ids[j] * px, px);
        if (c->is_last) b->h_labels[j] = d->labels[ids[j]];
        if (c->has_dropout) b->h_ids[j] = ids[j];
    }
    /* the device copies are read by m's forward (and recompute), which may still be queued */
    CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_fwd, 0));
    CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_late, 0));
    if (n > 0) {
        size_t nn = (size_t)n;
        if (c->is_first)
            CUDA_CHECK(cudaMemcpyAsync(b->pixels, b->h_pixels, nn * px, cudaMemcpyHostToDevice,
                                       c->h2d));
        if (c->is_last)
            CUDA_CHECK(cudaMemcpyAsync(b->labels, b->h_labels, nn * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, c->h2d));
        if (c->has_dropout)
            CUDA_CHECK(cudaMemcpyAsync(b->ids, b->h_ids, nn * sizeof(int64_t),
                                       cudaMemcpyHostToDevice, c->h2d));
    }
    CUDA_CHECK(cudaEventRecord(b->ev_loaded, c->h2d));
    b->loaded_n = n;
    return 0;
}

/* ------------------------------------------------------------------- finish ---- */

static int cuda_finish(engine *e, engine_result *res)
{
    cuda_engine *c = engine_cuda_impl(e);
    memset(res, 0, sizeof *res);
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->h2d));
    CUDA_CHECK(cudaStreamSynchronize(c->d2h));
    if (engine_cuda_loss_drain(c)) return -1;
    *res = c->sums;
    memset(&c->sums, 0, sizeof c->sums);
    for (int t = 0; t < e->cfg.max_ticks; t++) {
        if (!c->tick_used[t]) {
            e->tick_t0[t] = 0;
            e->tick_t1[t] = -1;
            continue;
        }
        float ms0, ms1;
        CUDA_CHECK(cudaEventElapsedTime(&ms0, c->anchor, c->tick_ev[2 * t]));
        CUDA_CHECK(cudaEventElapsedTime(&ms1, c->anchor, c->tick_ev[2 * t + 1]));
        e->tick_t0[t] = c->anchor_host + ms0 / 1e3;
        e->tick_t1[t] = c->anchor_host + ms1 / 1e3;
        c->tick_used[t] = 0;
    }
    c->anchored = 0;
    return 0;
}

/* ------------------------------------------------------------------- create ---- */

static const engine_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .init_params = cuda_init_params,
    .read_params = cuda_read_params,
    .write_params = cuda_write_params,
    .read_state = cuda_read_state,
    .write_state = cuda_write_state,
    .load = cuda_load,
    .forward = engine_cuda_forward,
    .backward = engine_cuda_backward,
    .backward_range = engine_cuda_backward_range,
    .backward_input = engine_cuda_backward_input,
    .backward_weight = engine_cuda_backward_weight,
    .recompute = engine_cuda_recompute,
    .grads_host = cuda_grads_host,
    .grads_commit = cuda_grads_commit,
    .zero_grads = cuda_zero_grads,
    .release = engine_cuda_release,
    .step = cuda_step,
    .msg_buffer = engine_cuda_msg_buffer,
    .msg_received = engine_cuda_msg_received,
    .msg_prepare = engine_cuda_msg_prepare,
    .msg_ready = engine_cuda_msg_ready,
    .finish = cuda_finish,
};

static int create_parts(engine *e, cuda_engine *c)
{
    const engine_config *cfg = &e->cfg;
    c->device = cfg->device;
    c->net = cfg->net;
    c->first = cfg->first;
    c->last = cfg->last;
    c->nl = cfg->last - cfg->first;
    c->is_first = cfg->first == 0;
    c->is_last = cfg->last == cfg->net->n_layers;
    c->dm = cfg->device_messages != 0;
    e->msg_on_device = c->dm;
    if (cfg->shard && cfg->shard->T > 1) {
        c->tp = cfg->shard;
        c->tp_rank = cfg->shard_rank;
    }
    if (kernel_cuda_ctx_init(&c->ctx, cfg->device)) return -1;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->h2d, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->d2h, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->gstream, cudaStreamNonBlocking));
    if (create_memory(e, c) || create_events(e, c)) return -1;
    /* the zeroing above has run before anyone uses the memory */
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

int engine_cuda_create(engine **out, const engine_config *cfg)
{
    *out = NULL;
    if (!cfg->net || cfg->buffers < 1 || cfg->max_batch < 1 || cfg->n_slots < 1 ||
        cfg->batch < 1 || cfg->max_ticks < 0)
        return pt_error_set("CUDA engine: %d buffers, batch %d of %d, %d slots, %d ticks: out "
                            "of range", cfg->buffers, cfg->max_batch, cfg->batch, cfg->n_slots,
                            cfg->max_ticks);
    if ((cfg->split_backward || cfg->wgrad_rows || cfg->recompute) && cfg->microbatches < 1)
        return pt_error_set("CUDA engine: split backward, batched weight gradients and "
                            "recomputation need the step's micro-batch count");
    if (cfg->wgrad_rows < 0 || (cfg->wgrad_rows && cfg->grad_pieces > 1))
        return pt_error_set("CUDA engine: batched weight gradients over %d rows%s",
                            cfg->wgrad_rows, cfg->wgrad_rows > 0 ? " form one gradient per "
                            "step, not one per gradient piece" : ": out of range");
    engine *e = calloc(1, sizeof *e);
    if (!e) return pt_error_set("CUDA engine: out of host memory");
    if (engine_base_init(e, &cuda_ops, cfg)) {
        free(e);
        return -1;
    }
    cuda_engine *c = calloc(1, sizeof *c);
    e->impl = c;
    if (!c) {
        cuda_destroy(e);
        return pt_error_set("CUDA engine: out of host memory");
    }
    if (create_parts(e, c)) {
        cuda_destroy(e); /* keeps the message: nothing in it sets one */
        return -1;
    }
    *out = e;
    return 0;
}
