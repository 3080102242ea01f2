/* ZeRO-2 and 3 on the CUDA engine (issue 27; docs/DESIGN.md "ZeRO inside a replica group").
 * ZeRO-2 (grads_shard): the gradient blocks (grads | mb_grads | pieces 1..) move into a
 * mapped range (cuda_vmm, engine_cuda_vmm.c) where nothing is live at first: a backward
 * makes its layers' gradients live (mapped, zeroed) before writing them, grads_release gives
 * a bucket's parts back once the reduction is done with them, and the step zeroes the live
 * floats (this replica's shard, buckets kept whole) and gives the pieces and mb_grads back.
 * ZeRO-3 (params_shard): the parameters move into one too; around each layer's pass the
 * runtime's hook gathers the layer into the pinned mirror h_params (host-staged, as ZeRO-1's
 * all-gather), the engine maps the layer and uploads it on the compute stream before the
 * layer's kernels, and after the pass the layer's floats outside the shard are released and
 * unmapped once the kernels that read them are done (one layer later: vmm_flip). */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "src/base/error.h"
#include "src/cuda/engine_cuda_impl.h"

void engine_cuda_zero_free(engine *e, cuda_engine *c)
{
    if (c->ev_up)
        for (int i = 0; i < c->plan.nl; i++)
            if (c->ev_up[i]) (void)cudaEventDestroy(c->ev_up[i]);
    free(c->ev_up);
    c->ev_up = NULL;
    if (c->ev_shard_out) (void)cudaEventDestroy(c->ev_shard_out);
    engine_cuda_vmm_free(&c->gv);
    engine_cuda_vmm_free(&c->pv);
    (void)e;
}

/* Index of device pointer p (inside gv) in floats. */
static size_t gidx(const cuda_engine *c, const float *p)
{
    return (size_t)(p - (const float *)c->gv.base);
}

/* ------------------------------------------------------------------- ZeRO-2 ---- */

int engine_cuda_grads_shard(engine *e)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (c->zero2) return pt_error_set("CUDA engine: grads_shard called twice");
    CUDA_CHECK(cudaSetDevice(c->device));
    size_t floats = (size_t)(1 + c->pieces) * c->gblock / sizeof(float);
    if (engine_cuda_vmm_init(&c->gv, c->device, floats, "gradients")) return -1;
    /* nothing is live: the gradients are zero before the first step, and read as zero */
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->gstream));
    CUDA_CHECK(cudaFree(c->gmem));
    c->gmem = NULL;
    engine_cuda_grad_blocks(c, c->gv.base);
    c->zero2 = 1;
    return 0;
}

/* The gradients of local layers [lo, hi) in block `arr` made live (zeroed where they were
 * not) before a backward writes them: ZeRO-2 maps what the last step gave back. */
int engine_cuda_grads_live(cuda_engine *c, float *arr, int lo, int hi)
{
    if (!c->zero2 || !arr || lo >= hi) return 0;
    size_t a = stage_plan_param_end(&c->plan, lo), b = stage_plan_param_end(&c->plan, hi);
    return engine_cuda_vmm_live(&c->gv, gidx(c, arr) + a, b - a, c->ctx.stream);
}

/* The device work that last wrote the gradients of the layers over [off, off + count) is
 * done (it is, after grads_host: this is the check that nothing still writes them). */
static int writes_done(cuda_engine *c, size_t off, size_t count)
{
    if (!count) return 0;
    int lo, hi;
    stage_plan_layers_of(&c->plan, off, count, &lo, &hi);
    for (int i = lo; i < hi; i++)
        if (i == lo || c->grads_ev[i] != c->grads_ev[i - 1])
            CUDA_CHECK(cudaEventSynchronize(c->ev_grads[c->grads_ev[i]]));
    return 0;
}

int engine_cuda_grads_release(engine *e, int piece, size_t off, size_t count)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!c->zero2) return pt_error_set("CUDA engine: gradients released without --zero 2");
    if (engine_grads_range_check(e, piece, off, count, "release")) return -1;
    if (!count) return 0;
    CUDA_CHECK(cudaSetDevice(c->device));
    /* grads_host's copy of them is over, and grads_commit writes live floats only */
    if (writes_done(c, off, count)) return -1;
    return engine_cuda_vmm_release(&c->gv, gidx(c, c->piece[piece]) + off, count, 0);
}

int engine_cuda_grads_fill(engine *e, int piece, size_t off, size_t count)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!c->zero2) return pt_error_set("CUDA engine: gradients filled without --zero 2");
    if (engine_grads_range_check(e, piece, off, count, "fill")) return -1;
    CUDA_CHECK(cudaSetDevice(c->device));
    return engine_cuda_vmm_live(&c->gv, gidx(c, c->piece[piece]) + off, count, c->ctx.stream);
}

/* ZeRO-2's zeroing (the step, zero_grads): the live floats of the stage's gradients are
 * written with zeros and stay (this replica's shard: the next backward writes it again,
 * and the step's peak holds it anyway); mb_grads and the pieces past the first, summed
 * already, are given back once the work queued so far is done. */
int engine_cuda_zero2_zero(cuda_engine *c, size_t P)
{
    for (size_t at = 0; at < P;) {
        int live;
        size_t to = engine_cuda_vmm_run(&c->gv, at, P, &live);
        if (live)
            CUDA_CHECK(cudaMemsetAsync(c->grads + at, 0, (to - at) * sizeof(float),
                                       c->ctx.stream));
        at = to;
    }
    size_t rest = (size_t)c->pieces * c->gblock / sizeof(float);
    if (rest && engine_cuda_vmm_release(&c->gv, gidx(c, c->mb_grads), rest, 1)) return -1;
    /* one wait per step, for the step's work: the backward has written them by now */
    return engine_cuda_vmm_settle(&c->gv, c->ctx.stream);
}

/* grads_host under ZeRO-2: the live runs of [off, off + count) of `piece` copied into the
 * mirror on the grads stream (after the waits the caller queued), the others read as
 * zero; waits for the copies. */
int engine_cuda_zero2_host(cuda_engine *c, int piece, float *mirror, size_t off, size_t count)
{
    size_t base = gidx(c, c->piece[piece]), end = base + off + count;
    for (size_t at = base + off; at < end;) {
        int live;
        size_t to = engine_cuda_vmm_run(&c->gv, at, end, &live);
        if (live)
            CUDA_CHECK(cudaMemcpyAsync(mirror + (at - base), c->piece[piece] + (at - base),
                                       (to - at) * sizeof(float), cudaMemcpyDeviceToHost,
                                       c->gstream));
        at = to;
    }
    /* after this wait no queued copy reads the mirror (the stream waited for the last
     * writes of these layers, which follow any commit out of it) */
    CUDA_CHECK(cudaStreamSynchronize(c->gstream));
    for (size_t at = base + off; at < end;) {
        int live;
        size_t to = engine_cuda_vmm_run(&c->gv, at, end, &live);
        if (!live) memset(mirror + (at - base), 0, (to - at) * sizeof(float));
        at = to;
    }
    return 0;
}

/* grads_commit under ZeRO-2: the live floats only (the reduction's shard, buckets kept
 * whole); the rest was given back. */
int engine_cuda_zero2_commit(cuda_engine *c, const float *mirror, size_t off, size_t count)
{
    size_t end = off + count;
    for (size_t at = off; at < end;) {
        int live;
        size_t to = engine_cuda_vmm_run(&c->gv, at, end, &live);
        if (live)
            CUDA_CHECK(cudaMemcpyAsync(c->grads + at, mirror + at, (to - at) * sizeof(float),
                                       cudaMemcpyHostToDevice, c->ctx.stream));
        at = to;
    }
    return 0;
}

/* ------------------------------------------------------------------- ZeRO-3 ---- */

int engine_cuda_params_shard(engine *e, engine_layer_hook hook, void *ctx, size_t keep)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (c->zero3) return pt_error_set("CUDA engine: params_shard called twice");
    if (!c->h_params)
        return pt_error_set("CUDA engine: params_shard before optim_shard (the parameters' "
                            "mirror)");
    CUDA_CHECK(cudaSetDevice(c->device));
    size_t P = e->param_count;
    if (engine_cuda_vmm_init(&c->pv, c->device, P, "parameters") ||
        engine_cuda_vmm_live(&c->pv, 0, P, NULL) || engine_cuda_vmm_keep(&c->pv, keep))
        return -1;
    c->ev_up = calloc((size_t)c->plan.nl + 1, sizeof *c->ev_up);
    if (!c->ev_up) return pt_error_set("CUDA engine: out of host memory");
    for (int i = 0; i < c->plan.nl; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&c->ev_up[i], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->ev_shard_out, cudaEventDisableTiming));
    /* the parameters move whole (all live until the first pass gives the rest back) */
    if (P)
        CUDA_CHECK(cudaMemcpyAsync(c->pv.base, c->params, P * sizeof(float),
                                   cudaMemcpyDeviceToDevice, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    CUDA_CHECK(cudaFree(c->pmem));
    c->pmem = NULL;
    c->params = (float *)c->pv.base;
    c->zhook = hook;
    c->zhook_ctx = ctx;
    c->zero3 = 1;
    c->z3_fresh = 1;
    return 0;
}

/* Parameters [off, off + count) given back after a pass: unmapped once the kernels queued
 * so far are done. Inside a pass's end (engine_cuda_layer_end) the engine flips after the
 * runtime's releases; elsewhere (after the step, after a checkpoint's read) each call does. */
int engine_cuda_params_release(engine *e, size_t off, size_t count)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!c->zero3) return pt_error_set("CUDA engine: parameters released without --zero 3");
    if (off > e->param_count || count > e->param_count - off)
        return pt_error_set("CUDA engine: parameters [%zu, %zu) released, outside the stage's "
                            "%zu", off, off + count, e->param_count);
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_vmm_release(&c->pv, off, count, 1)) return -1;
    return c->in_layer_end ? 0 : engine_cuda_vmm_flip(&c->pv, c->ctx.stream);
}

/* Parameters [off, off + count) are about to be gathered into h_params: no queued upload
 * may still read them there, and this replica's shard (which the gather sends from the
 * mirror) must have been copied out after the last step. */
int engine_cuda_params_fill(engine *e, size_t off, size_t count)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!c->zero3) return pt_error_set("CUDA engine: parameters filled without --zero 3");
    if (off > e->param_count || count > e->param_count - off)
        return pt_error_set("CUDA engine: parameters [%zu, %zu) filled, outside the stage's %zu",
                            off, off + count, e->param_count);
    CUDA_CHECK(cudaSetDevice(c->device));
    CUDA_CHECK(cudaEventSynchronize(c->ev_shard_out));
    if (!count) return 0;
    int lo, hi;
    stage_plan_layers_of(&c->plan, off, count, &lo, &hi);
    for (int i = lo; i < hi; i++) CUDA_CHECK(cudaEventSynchronize(c->ev_up[i]));
    return 0;
}

/* The first hook: the parameters were whole on the device (initialised or written after
 * optim_shard's copy); the mirror takes them before the runtime gives all but the shard
 * back and gathers from the mirrors. */
static int fresh_mirror(engine *e, cuda_engine *c)
{
    c->z3_fresh = 0;
    if (e->param_count)
        CUDA_CHECK(cudaMemcpyAsync(c->h_params, c->params, e->param_count * sizeof(float),
                                   cudaMemcpyDeviceToHost, c->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}

int engine_cuda_layer_begin(engine *e, int l, int backward)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (c->z3_fresh && fresh_mirror(e, c)) return -1;
    if (c->zhook(c->zhook_ctx, l, backward, 1)) return -1;
    size_t a = stage_plan_param_end(&c->plan, l), b = stage_plan_param_end(&c->plan, l + 1);
    if (a == b) return 0;
    /* the layer is whole in the mirror now: mapped and uploaded before its kernels */
    if (engine_cuda_vmm_live(&c->pv, a, b - a, NULL)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(c->params + a, c->h_params + a, (b - a) * sizeof(float),
                               cudaMemcpyHostToDevice, c->ctx.stream));
    CUDA_CHECK(cudaEventRecord(c->ev_up[l], c->ctx.stream));
    return 0;
}

int engine_cuda_layer_end(engine *e, int l, int backward)
{
    cuda_engine *c = engine_cuda_impl(e);
    /* --json's figure, as the CPU engine measures it: what is held at the end of a pass,
     * before the layer goes back (the layer, the one prefetched, one layer's deferred
     * unmaps, the shard, the kept granules) */
    size_t held = c->pv.mapped + c->pv.n_pool * c->pv.gran;
    if (held > c->params_peak) c->params_peak = held;
    c->in_layer_end = 1;
    int rc = c->zhook(c->zhook_ctx, l, backward, 0);
    c->in_layer_end = 0;
    return rc || engine_cuda_vmm_flip(&c->pv, c->ctx.stream) ? -1 : 0;
}

/* ZeRO-3's step: the updated shard copied into the mirror (the next gathers send it). */
int engine_cuda_zero3_step(engine *e, cuda_engine *c)
{
    (void)e;
    if (engine_cuda_shard_to_host(c)) return -1;
    CUDA_CHECK(cudaEventRecord(c->ev_shard_out, c->ctx.stream));
    return 0;
}

/* read_params under ZeRO-3 once layers have been given back: the mirror, which the
 * runtime has gathered whole (replicas_params_whole), with this replica's shard current. */
int engine_cuda_zero3_read(engine *e, cuda_engine *c, float *host)
{
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    memcpy(host, c->h_params, e->param_count * sizeof(float));
    return 0;
}

/* write_params under ZeRO-3 once layers have been given back: the mirror whole, and the
 * device's live floats (the shard); the rest is uploaded from the mirror at its next pass. */
int engine_cuda_zero3_write(engine *e, cuda_engine *c, const float *host)
{
    size_t P = e->param_count;
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    memcpy(c->h_params, host, P * sizeof(float));
    for (size_t at = 0; at < P;) {
        int live;
        size_t to = engine_cuda_vmm_run(&c->pv, at, P, &live);
        if (live)
            CUDA_CHECK(cudaMemcpyAsync(c->params + at, c->h_params + at,
                                       (to - at) * sizeof(float), cudaMemcpyHostToDevice,
                                       c->ctx.stream));
        at = to;
    }
    CUDA_CHECK(cudaStreamSynchronize(c->ctx.stream));
    return 0;
}
