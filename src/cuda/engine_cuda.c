/* The CUDA engine (src/engine/engine.h): creation, the memory layout, parameters, the CUDA
 * layer kernel set, the optimizer step, samples and finish. Forward, backward and the messages
 * are in engine_cuda_run.c; the state, and how events order the three streams, in
 * engine_cuda_impl.h; the stage's layout and rules, shared with the CPU engine, in
 * src/engine/stage_plan.h. */
#include "src/cuda/engine_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "src/base/clock.h"
#include "src/cuda/engine_cuda_impl.h"
#include "src/model/layer_table.h"
#include "src/base/error.h"

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
    a->used += stage_round_up(bytes);
    return p;
}

/* Each slot: its activations as the shared layout carves them (plan.slot_bytes, the same
 * bytes as the CPU stage's), then the split backward's output gradients. */
static void layout_slots(const engine *e, cuda_engine *c, arena *d)
{
    const engine_config *cfg = &e->cfg;
    const stage_plan *p = &c->plan;
    for (int k = 0; k < cfg->n_slots; k++) {
        cuda_slot *s = &c->slots[k];
        s->whole_out = stage_plan_carve_slot(p, arena_take(d, p->slot_bytes), s->layers);
        for (int i = 0; i < p->nl; i++) {
            const layer_desc *L = &p->loc[i];
            /* B's output gradient for W (batched layers stash theirs in B, but a block
             * stashes its products' rows in W); a block's: every inner gradient its W
             * needs that has no home in the slot (layer_gout_kept_floats) */
            int keeps = !stage_plan_batched(p, i) || L->type == LAYER_BLOCK;
            s->layers[i].gout = cfg->split_backward && L->weight_count && keeps
                                    ? arena_take(d, (size_t)cfg->max_batch *
                                                        layer_gout_kept_floats(L, 0) * sizeof(float))
                                    : NULL;
            /* a layer in phases keeps its inner gradients between them (shared) */
            if (!s->layers[i].gout && stage_plan_phases(p, i) > 1)
                s->layers[i].gout = c->tp_inner;
        }
    }
}

/* The last stage of a language model whose head is cut by vocabulary computes the
 * vocabulary-parallel loss (as stage_loss_sharded). */
static int loss_sharded(const engine *e, const cuda_engine *c)
{
    const stage_plan *p = &c->plan;
    return c->is_last && p->tp && p->tp->T > 1 && p->tp->loss_sharded &&
           p->last == e->cfg.net->n_layers;
}

/* The vocabulary-parallel loss's buffers (loss_sharded): rows of the micro-batch. */
static void layout_loss(const engine *e, cuda_engine *c, arena *d, arena *h, size_t rows)
{
    size_t T = loss_sharded(e, c) ? (size_t)c->plan.tp->T : 0, fl = sizeof(float);
    if (!T) return;
    c->xs_mine = arena_take(d, 3 * rows * fl);
    c->xs_all = arena_take(d, 3 * rows * T * fl);
    c->xs_ma = arena_take(d, 2 * rows * fl);
    c->xs_loss = arena_take(d, rows * sizeof(double));
    c->xs_right = arena_take(d, rows * sizeof(int));
    c->h_xs_mine = c->dm ? NULL : arena_take(h, 3 * rows * fl);
    c->h_xs_all = c->dm ? NULL : arena_take(h, 3 * rows * T * fl);
}

static void layout(const engine *e, cuda_engine *c, arena *d, arena *h)
{
    const engine_config *cfg = &e->cfg;
    const stage_plan *pl = &c->plan;
    size_t mbs = (size_t)cfg->max_batch, fl = sizeof(float);
    /* labels a sample: a language model's one per position */
    size_t labels = (size_t)data_model_labels(cfg->net);
    int lm = cfg->net->sequence != 0;
    /* the parameters and gradients have their own allocations (engine_cuda_grad_blocks;
     * the moments: alloc_moments or optim_shard) */
    size_t block = stage_round_up(e->param_count * fl);
    char *hg = arena_take(h, (size_t)c->pieces * block);
    c->h_grads = hg ? (float *)hg : NULL;
    c->tp_inner = pl->tp ? arena_take(d, mbs * pl->phase_floats * fl) : NULL;
    layout_slots(e, c, d);
    layout_loss(e, c, d, h, mbs * labels);
    if (pl->tp) {
        size_t wide = pl->widest * mbs * fl;
        c->tp_dout = arena_take(d, wide);
        c->tp_din = arena_take(d, wide);
        c->tp_recv = c->dm ? arena_take(d, wide) : NULL;
        c->h_tp = c->dm ? NULL : arena_take(h, wide);
        c->h_tp_send = c->dm ? NULL : arena_take(h, wide);
    }
    for (int i = 0; i < pl->nl; i++) {
        const layer_desc *L = &pl->loc[i];
        if (!stage_plan_batched(pl, i)) continue;
        /* every product's input rows, then every product's output-gradient rows (a dense
         * layer or head: its one; a block: its four products' token rows) */
        stage_wgrad_product pr[STAGE_WGRAD_MAX_PRODUCTS];
        size_t rows = (size_t)pl->wgrad_rows, xs = 0, gs = 0;
        (void)stage_wgrad_products(L, pr, &xs, &gs);
        c->stash_x[i] = arena_take(d, rows * xs * fl);
        c->stash_g[i] = arena_take(d, rows * gs * fl);
    }
    c->work = arena_take(d, pl->work_floats * fl);
    for (int k = 0; k < 2; k++) c->scratch[k] = arena_take(d, pl->widest * mbs * fl);
    for (int m = 0; m < cfg->buffers; m++) {
        cuda_mb *b = &c->mb[m];
        b->in = arena_take(d, mbs * e->in_count * fl);
        b->grad_in = c->loss_in_place ? NULL : arena_take(d, mbs * e->out_count * fl);
        b->grad_out = c->is_first ? NULL : arena_take(d, mbs * e->in_count * fl);
        b->pixels = c->is_first && !lm ? arena_take(d, mbs * e->in_count) : NULL;
        b->labels = c->is_last ? arena_take(d, mbs * labels * sizeof(int32_t)) : NULL;
        b->ids = c->has_dropout ? arena_take(d, mbs * sizeof(int64_t)) : NULL;
        b->act_out = cfg->recompute && !c->is_last ? arena_take(d, mbs * e->out_count * fl)
                                                   : NULL;
        /* a language model's first stage: its token ids as floats, copied into `in` */
        b->h_pixels = c->is_first ? arena_take(h, mbs * e->in_count * (lm ? fl : 1)) : NULL;
        b->h_labels = c->is_last ? arena_take(h, mbs * labels * sizeof(int32_t)) : NULL;
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
        c->xent_loss = arena_take(d, KERNEL_XENT_PARTS * sizeof(double));
        c->xent_right = arena_take(d, KERNEL_XENT_PARTS * sizeof(int));
    }
}

/* The shared layout of the stage (its local layers and sizes: src/engine/stage_plan.h) at
 * the whole micro-batch as one chunk, with the CUDA convolutions' workspace. */
/* What the CUDA engine does not cover yet for language models (issue 25) is refused here,
 * before anything runs: sequence parallelism (the engine has no reduce-scatter). */
static int lm_supported(const engine_config *cfg, const stage_plan *pl)
{
    (void)pl;
    if (!cfg->net->sequence) return 0;
    if (cfg->shard && cfg->shard->T > 1 && shard_sequence(cfg->shard))
        return pt_error_set("CUDA engine: --sequence-parallel (the blocks of --tensor %d cut "
                            "by positions) does not run on the GPU yet; leave it out with "
                            "--device cuda (the blocks are then cut by heads), or use "
                            "--device cpu", cfg->shard->T);
    return 0;
}

static int create_plan(engine *e, cuda_engine *c)
{
    const engine_config *cfg = &e->cfg;
    stage_shape sh = {.net = cfg->net, .first = cfg->first, .last = cfg->last,
                      .max_batch = cfg->max_batch, .chunk = cfg->max_batch, .tp = cfg->shard,
                      .tp_rank = cfg->shard_rank,
                      .conv_workspace = kernel_conv2d_workspace_floats_cuda};
    if (stage_plan_init(&c->plan, &sh, "CUDA engine, layers")) return -1;
    c->plan.wgrad_rows = cfg->wgrad_rows;
    e->param_count = c->plan.param_count; /* this rank's with tensor shards */
    e->slot_bytes = c->plan.slot_bytes;
    for (int i = 0; i < c->plan.nl; i++)
        if (layer_kind_of(c->plan.loc[i].type)->mask || layer_block_drops(&c->plan.loc[i]))
            c->has_dropout = 1; /* [dropout] layers and blocks' dropouts: sample ids */
    return lm_supported(cfg, &c->plan);
}

void engine_cuda_grad_blocks(cuda_engine *c, char *g)
{
    size_t block = c->gblock;
    c->grads = (float *)g;
    c->mb_grads = (float *)(g + block);
    for (int k = 0; k < c->pieces; k++)
        c->piece[k] = k ? (float *)(g + (size_t)(1 + k) * block) : c->grads;
}

/* The parameters (pmem) and the gradient blocks, grads | mb_grads | pieces 1.. (gmem), in
 * allocations of their own, zeroed: ZeRO-2 and 3 move them into mapped ranges
 * (engine_cuda_zero.c), and the old ones are then freed whole. */
static int create_arrays(engine *e, cuda_engine *c)
{
    c->gblock = stage_round_up(e->param_count * sizeof(float));
    size_t pb = c->gblock ? c->gblock : STAGE_ALIGN, gb = (size_t)(1 + c->pieces) * pb;
    cudaError_t r = cudaMalloc(&c->pmem, pb);
    if (r == cudaSuccess) r = cudaMalloc(&c->gmem, gb);
    if (r != cudaSuccess) {
        (void)cudaGetLastError();
        return pt_error_set("CUDA engine, layers %d..%d on device %d: cannot allocate %zu "
                            "bytes of device memory for the parameters and gradients: "
                            "cudaMalloc: %s", c->plan.first, c->plan.last - 1, c->device,
                            pb + gb, cudaGetErrorString(r));
    }
    c->params = c->pmem;
    engine_cuda_grad_blocks(c, c->gmem);
    CUDA_CHECK(cudaMemsetAsync(c->pmem, 0, pb, c->ctx.stream));
    CUDA_CHECK(cudaMemsetAsync(c->gmem, 0, gb, c->ctx.stream));
    return 0;
}

/* Host-side bookkeeping, the stage's sizes, and the allocations. */
static int create_memory(engine *e, cuda_engine *c)
{
    const engine_config *cfg = &e->cfg;
    if (create_plan(e, c)) return -1;
    int nl = c->plan.nl;
    c->slots = calloc((size_t)cfg->n_slots, sizeof *c->slots);
    c->slot_layers = calloc((size_t)cfg->n_slots * (size_t)nl, sizeof *c->slot_layers);
    c->mb = calloc((size_t)cfg->buffers, sizeof *c->mb);
    c->tick_ev = calloc(2 * (size_t)cfg->max_ticks + 1, sizeof *c->tick_ev);
    c->tick_used = calloc((size_t)cfg->max_ticks + 1, 1);
    c->pieces = engine_pieces(cfg);
    c->piece = calloc((size_t)c->pieces, sizeof *c->piece);
    c->ev_grads = calloc((size_t)nl, sizeof *c->ev_grads);
    c->grads_ev = calloc((size_t)nl, sizeof *c->grads_ev);
    c->stash_x = calloc((size_t)nl, sizeof *c->stash_x);
    c->stash_g = calloc((size_t)nl, sizeof *c->stash_g);
    c->runs = calloc((size_t)nl, sizeof *c->runs);
    if (!c->slots || !c->slot_layers || !c->mb || !c->tick_ev || !c->tick_used || !c->piece ||
        !c->ev_grads || !c->grads_ev || !c->stash_x || !c->stash_g || !c->runs)
        return pt_error_set("CUDA engine: out of host memory");
    for (int k = 0; k < cfg->n_slots; k++) c->slots[k].layers = c->slot_layers + (size_t)k * nl;
    for (int m = 0; m < cfg->buffers; m++) c->mb[m].slot = -1;
    c->needs_load = c->is_first || c->is_last || c->has_dropout;

    arena d = {NULL, 0}, h = {NULL, 0};
    layout(e, c, &d, &h);
    c->dmem_bytes = d.used;
    c->hmem_bytes = h.used;
    cudaError_t r = cudaMalloc(&c->dmem, d.used ? d.used : STAGE_ALIGN);
    if (r != cudaSuccess) {
        c->dmem = NULL;
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&free_b, &total_b);
        return pt_error_set("CUDA engine, layers %d..%d on device %d: cannot allocate %zu bytes "
                            "(%.1f MiB) of device memory (%.1f MiB free of %.1f MiB; batch %d, "
                            "%d slots, %d buffers): cudaMalloc: %s",
                            c->plan.first, c->plan.last - 1, c->device, d.used, d.used / 1048576.0,
                            free_b / 1048576.0, total_b / 1048576.0, cfg->max_batch,
                            cfg->n_slots, cfg->buffers, cudaGetErrorString(r));
    }
    r = cudaHostAlloc(&c->hmem, h.used ? h.used : STAGE_ALIGN, cudaHostAllocDefault);
    if (r != cudaSuccess) {
        c->hmem = NULL;
        (void)cudaGetLastError();
        return pt_error_set("CUDA engine, layers %d..%d: cannot allocate %zu bytes of pinned "
                            "host memory: cudaHostAlloc: %s",
                            c->plan.first, c->plan.last - 1, h.used, cudaGetErrorString(r));
    }
    d.base = c->dmem;
    h.base = c->hmem;
    d.used = h.used = 0;
    layout(e, c, &d, &h);
    /* Zero once: gradients and optimizer state must start at zero, and no kernel then reads
     * memory that was never written (compute-sanitizer's initcheck stays quiet). */
    CUDA_CHECK(cudaMemsetAsync(c->dmem, 0, c->dmem_bytes ? c->dmem_bytes : STAGE_ALIGN,
                               c->ctx.stream));
    memset(c->hmem, 0, c->hmem_bytes ? c->hmem_bytes : STAGE_ALIGN);
    return create_arrays(e, c);
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
    for (int i = 0; i < c->plan.nl; i++)
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
            for (int i = 0; i < c->plan.nl; i++)
                if (c->ev_grads[i]) (void)cudaEventDestroy(c->ev_grads[i]);
        if (c->dmem) (void)cudaFree(c->dmem);
        if (c->pmem) (void)cudaFree(c->pmem);
        if (c->gmem) (void)cudaFree(c->gmem);
        engine_cuda_zero_free(e, c);
        if (c->hmem) (void)cudaFreeHost(c->hmem);
        if (c->omem) (void)cudaFree(c->omem);
        if (c->zmem) (void)cudaFree(c->zmem);
        if (c->h_params) (void)cudaFreeHost(c->h_params);
        free(c->zruns);
        if (c->h2d) (void)cudaStreamDestroy(c->h2d);
        if (c->d2h) (void)cudaStreamDestroy(c->d2h);
        if (c->gstream) (void)cudaStreamDestroy(c->gstream);
        kernel_cuda_ctx_free(&c->ctx);
        stage_plan_free(&c->plan);
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

/* The transformer layers' draws (normal, ones, zeros) on the host with the CPU's code,
 * then copied: the CPU's numbers bit for bit (the normal draw's double log and cosine
 * would not be on the device), once per run, outside training. */
static int draw_host(const kernel_cuda_ctx *ctx, float *dst, size_t first, size_t count,
                     layer_init kind, double scale, uint64_t seed, uint64_t stream)
{
    float *h = malloc((count ? count : 1) * sizeof *h);
    if (!h) return pt_error_set("CUDA engine: out of host memory for an initial draw");
    if (kind == LAYER_INIT_NORMAL)
        kernel_init_normal_range_cpu(h, first, count, scale, seed, stream);
    else
        for (size_t i = 0; i < count; i++) h[i] = kind == LAYER_INIT_ONES ? 1.0f : 0.0f;
    cudaError_t rc = cudaMemcpyAsync(dst, h, count * sizeof *h, cudaMemcpyHostToDevice,
                                     ctx->stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(ctx->stream);
    free(h);
    if (rc != cudaSuccess)
        return pt_error_set("CUDA engine: initial draw: %s", cudaGetErrorString(rc));
    return 0;
}

/* The shared initialisation's draws (stage_plan_init_params): the uniform one with the
 * CUDA kernel, the others on the host (a tied head is copied by the plan itself). */
static int draw_cuda(void *ctx, float *dst, size_t first, size_t count, layer_init kind,
                     double scale, uint64_t seed, uint64_t stream)
{
    if (kind != LAYER_INIT_TORCH)
        return count ? draw_host(ctx, dst, first, count, kind, scale, seed, stream) : 0;
    return kernel_init_uniform_range_cuda(dst, first, count, (float)scale, seed, stream, ctx);
}

static int cuda_init_params(engine *e, uint64_t seed)
{
    cuda_engine *c = engine_cuda_impl(e);
    CUDA_CHECK(cudaSetDevice(c->device));
    int failed;
    if (stage_plan_init_params(&c->plan, c->params, seed, draw_cuda, &c->ctx, &failed))
        return engine_cuda_layer_fail("initialisation", failed, -1);
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
    /* ZeRO-3: the runtime gathered them whole into the mirror */
    if (c->zero3 && !c->z3_fresh) return engine_cuda_zero3_read(e, c, host);
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
    if (c->zero3 && !c->z3_fresh) return engine_cuda_zero3_write(e, c, host);
    CUDA_CHECK(cudaMemcpyAsync(c->params, host, e->param_count * sizeof(float),
                               cudaMemcpyHostToDevice, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

/* ----------------------------------------------------------- the CUDA kernel sets ---- */


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
    if (c->zero2) {
        if (engine_cuda_zero2_zero(c, P)) return -1;
    } else if (P) {
        CUDA_CHECK(cudaMemsetAsync(c->grads, 0, P * sizeof(float), c->ctx.stream));
    }
    stage_plan_grads_zeroed(&c->plan);
    return engine_cuda_grads_written(c, 0, c->plan.nl);
}

static int cuda_zero_grads(engine *e)
{
    cuda_engine *c = engine_cuda_impl(e);
    CUDA_CHECK(cudaSetDevice(c->device));
    return zero_grads(c, e->param_count);
}

/* The copy waits (on the grads stream) only for the compute work that last wrote those
 * layers' gradients, not for what was queued after it (the lower layers' backward). */
static int cuda_grads_host(engine *e, int piece, size_t off, size_t count, float **host)
{
    cuda_engine *c = engine_cuda_impl(e);
    *host = NULL;
    if (engine_grads_range_check(e, piece, off, count, "host view")) return -1;
    size_t stride = stage_round_up(e->param_count * sizeof(float)) / sizeof(float); /* layout's */
    float *mirror = c->h_grads + (size_t)piece * stride;
    if (count) {
        int lo, hi;
        stage_plan_layers_of(&c->plan, off, count, &lo, &hi);
        CUDA_CHECK(cudaSetDevice(c->device));
        for (int i = lo; i < hi; i++)
            if (i == lo || c->grads_ev[i] != c->grads_ev[i - 1])
                CUDA_CHECK(cudaStreamWaitEvent(c->gstream, c->ev_grads[c->grads_ev[i]], 0));
        if (c->zero2) { /* what was given back reads as zero */
            if (engine_cuda_zero2_host(c, piece, mirror, off, count)) return -1;
        } else {
            CUDA_CHECK(cudaMemcpyAsync(mirror + off, c->piece[piece] + off,
                                       count * sizeof(float), cudaMemcpyDeviceToHost,
                                       c->gstream));
            CUDA_CHECK(cudaStreamSynchronize(c->gstream));
        }
    }
    *host = mirror + off;
    return 0;
}

/* Queued on the compute stream, so the step (queued later) reads the reduced gradients. The
 * mirror is not written again before the next grads_host, whose copy waits for this one. */
static int cuda_grads_commit(engine *e, size_t off, size_t count)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_grads_range_check(e, 0, off, count, "commit")) return -1;
    if (!count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (c->zero2) { /* the live floats: the rest was given back */
        if (engine_cuda_zero2_commit(c, c->h_grads, off, count)) return -1;
    } else {
        CUDA_CHECK(cudaMemcpyAsync(c->grads + off, c->h_grads + off, count * sizeof(float),
                                   cudaMemcpyHostToDevice, c->ctx.stream));
    }
    int lo, hi;
    stage_plan_layers_of(&c->plan, off, count, &lo, &hi);
    return engine_cuda_grads_written(c, lo, hi);
}

static int cuda_step(engine *e, const optimizer_config *o, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (stage_plan_range_idle(&c->plan, "step")) return -1;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick) || engine_cuda_tick_begin(e, tick)) return -1;
    if (engine_cuda_alloc_moments(e, c)) return -1;
    stage_optim_state st = {.params = c->params, .grads = c->grads, .m = c->opt_m,
                            .v = c->opt_v, .count = e->param_count, .step = &c->step,
                            .plan = &c->plan};
    int rc = c->zruns /* ZeRO: this replica's runs */
                 ? engine_optim_step_runs(&optim_kernels_cuda, &c->ctx, &st, c->zm, c->zv,
                                          c->zruns, c->n_zruns, o)
                 : stage_optim_step(&optim_kernels_cuda, &c->ctx, &st, o);
    if (rc || (c->zero3 && engine_cuda_zero3_step(e, c)) || zero_grads(c, e->param_count))
        return -1;
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
    const net_desc *net = e->cfg.net;
    int L = data_labels_per_sample(d);
    if (!d->tokens != !net->sequence || L != data_model_labels(net))
        return pt_error_set("CUDA engine: %s data (%d label%s a sample) for %s model (%d)",
                            d->tokens ? "text" : "image", L, L == 1 ? "" : "s",
                            net->sequence ? "a language" : "an image", data_model_labels(net));
    cuda_mb *b = &c->mb[m];
    if (!c->needs_load) {
        b->loaded_n = n;
        return 0;
    }
    for (int j = 0; j < n; j++)
        if (ids[j] < 0 || ids[j] >= d->count)
            return pt_error_set("CUDA engine: sample %lld outside the data set of %d",
                                (long long)ids[j], d->count);
    size_t px = e->in_count, lb = (size_t)L;
    if (c->is_first && !d->tokens && data_image_bytes(d) != px)
        return pt_error_set("CUDA engine: images of %d×%d×%d values, but the network's input "
                            "has %zu", d->channels, d->rows, d->cols, px);
    /* a sample's token ids as floats: the input's (px = T) values */
    size_t in_bytes = d->tokens ? px * sizeof(float) : px;
    CUDA_CHECK(cudaSetDevice(c->device));
    /* the previous copy out of these pinned buffers must be over before they are rewritten */
    CUDA_CHECK(cudaEventSynchronize(b->ev_loaded));
    for (int j = 0; j < n; j++) {
        if (c->is_first && d->tokens)
            memcpy(b->h_pixels + (size_t)j * in_bytes, d->tokens + (size_t)ids[j] * px,
                   in_bytes);
        else if (c->is_first)
            memcpy(b->h_pixels + (size_t)j * px, d->pixels + (size_t)ids[j] * px, px);
        if (c->is_last)
            memcpy(b->h_labels + (size_t)j * lb, d->labels + (size_t)ids[j] * lb,
                   lb * sizeof(int32_t));
        if (c->has_dropout) b->h_ids[j] = ids[j];
    }
    /* the device copies are read by m's forward (and recompute), which may still be queued */
    CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_fwd, 0));
    CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_late, 0));
    if (n > 0) {
        size_t nn = (size_t)n;
        if (c->is_first)
            CUDA_CHECK(cudaMemcpyAsync(b->pixels ? (void *)b->pixels : (void *)b->in,
                                       b->h_pixels, nn * in_bytes, cudaMemcpyHostToDevice,
                                       c->h2d));
        if (c->is_last)
            CUDA_CHECK(cudaMemcpyAsync(b->labels, b->h_labels, nn * lb * sizeof(int32_t),
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
    .read_state = engine_cuda_read_state,
    .write_state = engine_cuda_write_state,
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
    .optim_shard = engine_cuda_optim_shard,
    .params_host = engine_cuda_params_host,
    .params_commit = engine_cuda_params_commit,
    .grads_shard = engine_cuda_grads_shard,
    .grads_release = engine_cuda_grads_release,
    .grads_fill = engine_cuda_grads_fill,
    .params_shard = engine_cuda_params_shard,
    .params_release = engine_cuda_params_release,
    .params_fill = engine_cuda_params_fill,
    .state_bytes = engine_cuda_state_bytes,
};

/* --precision into the kernels' context: every dense and conv product follows it. */
static int set_precision(kernel_cuda_ctx *ctx, engine_precision p)
{
    _Static_assert((int)ENGINE_FP32 == (int)KERNEL_CUDA_FP32 &&
                       (int)ENGINE_TF32 == (int)KERNEL_CUDA_TF32 &&
                       (int)ENGINE_BF16 == (int)KERNEL_CUDA_BF16,
                   "engine_precision and kernel_cuda_precision number alike");
    if (!kernel_cuda_precision_name((kernel_cuda_precision)p))
        return pt_error_set("CUDA engine: unknown precision %d", (int)p);
    ctx->precision = (kernel_cuda_precision)p;
    return 0;
}

static int create_parts(engine *e, cuda_engine *c)
{
    const engine_config *cfg = &e->cfg;
    c->device = cfg->device;
    c->is_first = cfg->first == 0;
    c->is_last = cfg->last == cfg->net->n_layers;
    c->loss_in_place = layer_loss_in_place(cfg->net, cfg->last, cfg->recompute);
    c->dm = cfg->device_messages != 0;
    e->msg_on_device = c->dm;
    if (kernel_cuda_ctx_init(&c->ctx, cfg->device)) return -1;
    if (set_precision(&c->ctx, cfg->precision)) return -1;
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
