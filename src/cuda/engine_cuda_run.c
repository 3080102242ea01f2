/* The CUDA engine's forward, backward, slot release and messages (state and stream
 * ordering: engine_cuda_impl.h). The layer loops mirror src/stage.c's forward_chunk and
 * backward_chunk with the whole micro-batch as one chunk. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/rng.h"
#include "src/cuda/engine_cuda_impl.h"
#include "src/base/error.h"

/* ------------------------------------------------------------ forward, backward ---- */

static int forward_layers(engine *e, cuda_slot *s, int m, int n, uint64_t seed, uint64_t step)
{
    cuda_engine *c = engine_cuda_impl(e);
    const cuda_mb *b = &c->mb[m];
    const float *x = b->in;
    for (int l = c->first; l < c->last; l++) {
        const layer_desc *L = &c->net->layers[l];
        slot_layer *sl = &s->layers[l - c->first];
        size_t in_count = layer_shape_count(L->in), out_count = layer_shape_count(L->out);
        /* set_outputs: flatten, and dropout when not training, are the identity */
        sl->identity = L->type == LAYER_FLATTEN ||
                       (L->type == LAYER_DROPOUT && !(s->training && L->u.dropout.p > 0));
        if (sl->identity) {
            sl->out = x;
            continue;
        }
        float *y = sl->buf;
        const float *w = c->params + c->param_off[l - c->first];
        const float *bias = w + L->weight_count;
        size_t count = (size_t)n * out_count;
        int rc = 0;
        switch (L->type) {
        case LAYER_CONV: {
            kernel_conv2d_dims d = engine_cuda_conv_dims(L, n);
            rc = kernel_conv2d_forward_cuda(y, c->work, x, w, bias, &d, &c->ctx);
            if (!rc) rc = kernel_activation_forward_cuda(y, y, count, L->activation, &c->ctx);
            break;
        }
        case LAYER_DENSE:
            rc = kernel_dense_forward_cuda(y, x, w, bias, n, (int)in_count, L->u.dense.units,
                                           &c->ctx);
            if (!rc) rc = kernel_activation_forward_cuda(y, y, count, L->activation, &c->ctx);
            break;
        case LAYER_MAXPOOL:
            rc = kernel_maxpool2d_forward_cuda(y, sl->argmax, x, n, L->in.c, L->in.h, L->in.w,
                                               L->u.pool.size, L->u.pool.stride, &c->ctx);
            break;
        case LAYER_AVGPOOL:
            rc = kernel_avgpool2d_forward_cuda(y, x, n, L->in.c, L->in.h, L->in.w,
                                               L->u.pool.size, L->u.pool.stride, &c->ctx);
            break;
        case LAYER_DROPOUT:
            rc = kernel_dropout_forward_cuda(y, sl->mask, x, n, in_count, L->u.dropout.p, seed,
                                             rng_stream_dropout(l, step), b->ids, &c->ctx);
            break;
        case LAYER_FLATTEN:
            break;
        }
        if (rc) return engine_cuda_layer_fail("forward", l, m);
        sl->out = y;
        x = y;
    }
    return 0;
}

int engine_cuda_forward(engine *e, int m, int n, uint64_t seed, uint64_t step, int training,
                        int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_cuda_check_m(e, m, "forward")) return -1;
    cuda_mb *b = &c->mb[m];
    if (n < 0 || n > e->cfg.max_batch)
        return pt_error_set("CUDA engine: forward of %d samples, outside 0..%d", n,
                            e->cfg.max_batch);
    if (b->slot >= 0)
        return pt_error_set("CUDA engine: forward of micro-batch %d, which still holds slot "
                            "%d (release it first)", m, b->slot);
    if (c->needs_load && b->loaded_n < n)
        return pt_error_set("CUDA engine: forward of %d samples of micro-batch %d, but %d "
                            "were loaded", n, m, b->loaded_n);
    int k = 0;
    while (k < e->cfg.n_slots && c->slots[k].busy) k++;
    if (k == e->cfg.n_slots)
        return pt_error_set("CUDA engine, layers %d..%d: all %d activation slots are in use",
                            c->first, c->last - 1, e->cfg.n_slots);
    cuda_slot *s = &c->slots[k];
    cudaStream_t cs = c->ctx.stream;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick)) return -1;
    /* Inputs copied in, and copies out of the memory this forward overwrites, finished. */
    if (c->needs_load) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_loaded, 0));
    if (!c->dm) {
        if (!c->is_first) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_act_in, 0));
        CUDA_CHECK(cudaStreamWaitEvent(cs, s->ev_read, 0));
        /* stage 0 rewrites its input, which an all-identity stage sent out as ACT_OUT */
        if (c->is_first) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_act_out, 0));
    }
    if (engine_cuda_tick_begin(e, tick)) return -1;
    if (c->is_first && kernel_bytes_to_float_cuda(b->in, b->pixels, (size_t)n * e->in_count,
                                                  &c->ctx))
        return engine_cuda_layer_fail("pixel conversion", c->first, m);
    s->training = training;
    if (forward_layers(e, s, m, n, seed, step)) return -1;
    if (c->is_last) {
        if (c->n_loss == LOSS_CAPACITY && engine_cuda_loss_drain(c)) return -1;
        int j = c->n_loss;
        const float *logits = s->layers[c->nl - 1].out;
        if (kernel_softmax_xent_cuda(training ? b->grad_in : NULL, c->d_correct + j,
                                     c->d_loss + j, logits, b->labels, n, c->net->classes,
                                     training ? 1.0f / (float)e->cfg.batch : 1.0f, &c->ctx))
            return engine_cuda_layer_fail("loss", c->last - 1, m);
        c->n_loss++;
    }
    CUDA_CHECK(cudaEventRecord(b->ev_fwd, cs));
    if (engine_cuda_tick_end(e, tick)) return -1;
    s->busy = 1;
    s->m = m;
    s->n = n;
    b->slot = k;
    b->n = n;
    b->has_grad_out = 0;
    b->act_out_prepared = b->grad_out_prepared = 0;
    return 0;
}

/* Local layers [lo, hi), from the running gradient c->range_g (in scratch buffer
 * c->range_gi, −1 for GRAD_IN), which is left where the next range starts; the ranges of one
 * micro-batch thus make exactly the kernel calls of one backward over all layers. Parameter
 * gradients go to `grads` (the stage's, mb_grads or a piece: see backward_range). */
static int backward_layers(engine *e, const cuda_slot *s, int m, int lo, int hi, float *din,
                           float *grads)
{
    cuda_engine *c = engine_cuda_impl(e);
    const float *g = c->range_g;
    int gi = c->range_gi, n = s->n; /* gi: the scratch buffer g lives in, −1 for dout */
    for (int l = c->first + hi - 1; l >= c->first + lo; l--) {
        const layer_desc *L = &c->net->layers[l];
        int i = l - c->first;
        const slot_layer *sl = &s->layers[i];
        size_t in_count = layer_shape_count(L->in), out_count = layer_shape_count(L->out);
        const float *x = i == 0 ? c->mb[m].in : s->layers[i - 1].out;
        if (sl->identity && i > 0) continue; /* the gradient passes through unchanged */
        int rc = 0;
        if (L->activation != KERNEL_ACT_LINEAR) {
            float *ga = gi < 0 ? c->scratch[0] : c->scratch[gi];
            rc = kernel_activation_backward_cuda(ga, g, sl->out, (size_t)n * out_count,
                                                 L->activation, &c->ctx);
            if (rc) return engine_cuda_layer_fail("activation backward", l, m);
            g = ga;
            gi = gi < 0 ? 0 : gi;
        }
        int ti = gi < 0 ? 0 : 1 - gi;
        float *dx = i == 0 ? din : c->scratch[ti];
        const float *w = c->params + c->param_off[i];
        float *dw = grads + c->param_off[i], *db = dw + L->weight_count;
        switch (L->type) {
        case LAYER_CONV: {
            kernel_conv2d_dims d = engine_cuda_conv_dims(L, n);
            rc = kernel_conv2d_backward_cuda(dx, dw, db, c->work, g, x, w, &d, &c->ctx);
            break;
        }
        case LAYER_DENSE:
            rc = kernel_dense_backward_cuda(dx, dw, db, g, x, w, n, (int)in_count,
                                            L->u.dense.units, &c->ctx);
            break;
        case LAYER_MAXPOOL:
            if (dx)
                rc = kernel_maxpool2d_backward_cuda(dx, g, sl->argmax, n, L->in.c, L->in.h,
                                                    L->in.w, L->u.pool.size, L->u.pool.stride,
                                                    &c->ctx);
            break;
        case LAYER_AVGPOOL:
            if (dx)
                rc = kernel_avgpool2d_backward_cuda(dx, g, n, L->in.c, L->in.h, L->in.w,
                                                    L->u.pool.size, L->u.pool.stride, &c->ctx);
            break;
        case LAYER_DROPOUT:
        case LAYER_FLATTEN:
            if (!dx || !n) break;
            if (sl->identity) {
                cudaError_t r = cudaMemcpyAsync(dx, g, (size_t)n * in_count * sizeof(float),
                                                cudaMemcpyDeviceToDevice, c->ctx.stream);
                if (r != cudaSuccess)
                    rc = pt_error_set("cudaMemcpyAsync: %s", cudaGetErrorString(r));
            } else {
                rc = kernel_dropout_backward_cuda(dx, g, sl->mask, (size_t)n * in_count,
                                                  L->u.dropout.p, &c->ctx);
            }
            break;
        }
        if (rc) return engine_cuda_layer_fail("backward", l, m);
        g = dx;
        gi = ti;
    }
    c->range_g = g;
    c->range_gi = gi;
    return 0;
}

int engine_cuda_backward_range(engine *e, int m, int lo, int hi, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_cuda_check_m(e, m, "backward")) return -1;
    cuda_mb *b = &c->mb[m];
    if (b->slot < 0)
        return pt_error_set("CUDA engine: backward of micro-batch %d, which holds no slot "
                            "(no forward since its release)", m);
    const cuda_slot *s = &c->slots[b->slot];
    if (!s->training)
        return pt_error_set("CUDA engine: backward of micro-batch %d after an evaluation "
                            "forward", m);
    if (lo < 0 || hi > c->nl || lo >= hi)
        return pt_error_set("CUDA engine, layers %d..%d: backward of local layers [%d, %d), "
                            "outside the stage's %d", c->first, c->last - 1, lo, hi, c->nl);
    if (c->range_hi && (m != c->range_m || hi != c->range_hi))
        return pt_error_set("CUDA engine, layers %d..%d: backward of local layers [%d, %d) of "
                            "micro-batch %d, but micro-batch %d's backward by ranges is "
                            "unfinished (its next range ends at local layer %d)", c->first,
                            c->last - 1, lo, hi, m, c->range_m, c->range_hi);
    if (!c->range_hi && hi != c->nl)
        return pt_error_set("CUDA engine, layers %d..%d: backward of local layers [%d, %d) of "
                            "micro-batch %d before the ranges above it (the first ends at %d)",
                            c->first, c->last - 1, lo, hi, m, c->nl);
    cudaStream_t cs = c->ctx.stream;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick)) return -1;
    if (!c->dm) {
        if (!c->is_last) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_grad_in, 0));
        /* GRAD_OUT of m is about to be rewritten: its previous copy out must be over */
        if (!c->is_first) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_grad_out, 0));
    }
    if (engine_cuda_tick_begin(e, tick)) return -1;
    if (hi == c->nl) {
        /* As the CPU stage (src/stage.h): the first micro-batch since the step sums into the
         * gradients, each later one into mb_grads, which is then added; with pieces, m's
         * gradient is formed alone in piece m mod P. */
        c->range_add = c->pieces == 1 && c->accumulated;
        c->range_target = c->pieces > 1 ? c->piece[m % c->pieces]
                                        : c->range_add ? c->mb_grads : c->grads;
        c->range_g = b->grad_in;
        c->range_gi = -1;
    }
    size_t p0 = c->param_off[lo], p1 = hi < c->nl ? c->param_off[hi] : e->param_count;
    float *grads = c->range_target;
    if ((c->range_add || c->pieces > 1) && p1 > p0) /* formed apart: from zero */
        CUDA_CHECK(cudaMemsetAsync(grads + p0, 0, (p1 - p0) * sizeof(float), cs));
    if (backward_layers(e, s, m, lo, hi, c->is_first ? NULL : b->grad_out, grads)) return -1;
    if (c->range_add && p1 > p0 && kernel_add_cuda(c->grads + p0, grads + p0, p1 - p0, &c->ctx))
        return -1;
    if (engine_cuda_grads_written(c, lo, hi)) return -1;
    CUDA_CHECK(cudaEventRecord(b->ev_bwd, cs));
    if (engine_cuda_tick_end(e, tick)) return -1;
    c->range_m = m;
    c->range_hi = lo;
    if (lo == 0) {
        if (c->pieces == 1) c->accumulated = 1;
        b->has_grad_out = !c->is_first;
        b->grad_out_prepared = 0;
    }
    return 0;
}

int engine_cuda_backward(engine *e, int m, int tick)
{
    return engine_cuda_backward_range(e, m, 0, engine_cuda_impl(e)->nl, tick);
}

int engine_cuda_release(engine *e, int m)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_cuda_check_m(e, m, "release")) return -1;
    cuda_mb *b = &c->mb[m];
    if (b->slot < 0)
        return pt_error_set("CUDA engine: release of micro-batch %d, which holds no slot", m);
    c->slots[b->slot].busy = 0;
    b->slot = -1;
    return 0;
}

/* ----------------------------------------------------------------- messages ---- */

static const char *msg_name(engine_msg k)
{
    switch (k) {
    case ENGINE_MSG_ACT_IN: return "ACT_IN";
    case ENGINE_MSG_GRAD_IN: return "GRAD_IN";
    case ENGINE_MSG_ACT_OUT: return "ACT_OUT";
    case ENGINE_MSG_GRAD_OUT: return "GRAD_OUT";
    }
    return "unknown message";
}

/* Whether this stage has message k: no ACT_IN or GRAD_OUT on stage 0 (its input is the
 * pixels), no GRAD_IN on the last stage (its gradient is the loss's). */
static int msg_check(const engine *e, engine_msg k, int m, int incoming)
{
    const cuda_engine *c = e->impl;
    if (engine_cuda_check_m(e, m, msg_name(k))) return -1;
    int in = k == ENGINE_MSG_ACT_IN || k == ENGINE_MSG_GRAD_IN;
    int ok = (k == ENGINE_MSG_ACT_IN && !c->is_first) ||
             (k == ENGINE_MSG_GRAD_IN && !c->is_last) || k == ENGINE_MSG_ACT_OUT ||
             (k == ENGINE_MSG_GRAD_OUT && !c->is_first);
    if (!ok || (incoming >= 0 && in != incoming))
        return pt_error_set("CUDA engine, layers %d..%d: no %s message %s", c->first,
                            c->last - 1, msg_name(k),
                            !ok ? "on this stage" : incoming ? "to receive" : "to send");
    return 0;
}

void *engine_cuda_msg_buffer(engine *e, engine_msg k, int m)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (msg_check(e, k, m, -1)) return NULL;
    cuda_mb *b = &c->mb[m];
    cudaError_t r = cudaSuccess;
    void *p = NULL;
    if (k == ENGINE_MSG_ACT_OUT && c->dm) {
        if (b->slot < 0) {
            pt_error_set("CUDA engine: ACT_OUT of micro-batch %d before its forward", m);
            return NULL;
        }
        return (void *)c->slots[b->slot].layers[c->nl - 1].out;
    }
    switch (k) {
    case ENGINE_MSG_ACT_IN:
        /* MPI may write the buffer from now on: host-staged, the previous copy out of it
         * must be over; device, the kernels that read m's input (forward and backward) */
        if (c->dm) {
            r = cudaEventSynchronize(b->ev_fwd);
            if (r == cudaSuccess) r = cudaEventSynchronize(b->ev_bwd);
        } else {
            r = cudaEventSynchronize(b->ev_act_in);
        }
        p = c->dm ? (void *)b->in : (void *)b->h_act_in;
        break;
    case ENGINE_MSG_GRAD_IN:
        r = cudaEventSynchronize(c->dm ? b->ev_bwd : b->ev_grad_in);
        p = c->dm ? (void *)b->grad_in : (void *)b->h_grad_in;
        break;
    case ENGINE_MSG_ACT_OUT: p = b->h_act_out; break;
    case ENGINE_MSG_GRAD_OUT: p = c->dm ? (void *)b->grad_out : (void *)b->h_grad_out; break;
    }
    if (r != cudaSuccess) {
        pt_error_set("CUDA engine: waiting to reuse %s of micro-batch %d: "
                     "cudaEventSynchronize: %s", msg_name(k), m, cudaGetErrorString(r));
        return NULL;
    }
    return p;
}

int engine_cuda_msg_received(engine *e, engine_msg k, int m)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (msg_check(e, k, m, 1)) return -1;
    if (c->dm) return 0; /* MPI wrote the device buffer itself */
    cuda_mb *b = &c->mb[m];
    size_t mbs = (size_t)e->cfg.max_batch;
    CUDA_CHECK(cudaSetDevice(c->device));
    /* The device buffer is overwritten: the compute stream must be done reading it. The
     * copy is the whole buffer, since the sender's count (≤ max_batch samples) is MPI's. */
    if (k == ENGINE_MSG_ACT_IN) {
        CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_fwd, 0));
        CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_bwd, 0));
        /* an all-identity stage's ACT_OUT is this very buffer */
        CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_act_out, 0));
        CUDA_CHECK(cudaMemcpyAsync(b->in, b->h_act_in, mbs * e->in_count * sizeof(float),
                                   cudaMemcpyHostToDevice, c->h2d));
        CUDA_CHECK(cudaEventRecord(b->ev_act_in, c->h2d));
    } else {
        CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_bwd, 0));
        CUDA_CHECK(cudaMemcpyAsync(b->grad_in, b->h_grad_in,
                                   mbs * e->out_count * sizeof(float), cudaMemcpyHostToDevice,
                                   c->h2d));
        CUDA_CHECK(cudaEventRecord(b->ev_grad_in, c->h2d));
    }
    return 0;
}

int engine_cuda_msg_prepare(engine *e, engine_msg k, int m)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (msg_check(e, k, m, 0)) return -1;
    cuda_mb *b = &c->mb[m];
    CUDA_CHECK(cudaSetDevice(c->device));
    if (k == ENGINE_MSG_ACT_OUT) {
        if (b->slot < 0)
            return pt_error_set("CUDA engine: ACT_OUT of micro-batch %d before its forward", m);
        cuda_slot *s = &c->slots[b->slot];
        if (!c->dm) {
            size_t bytes = (size_t)b->n * e->out_count * sizeof(float);
            CUDA_CHECK(cudaStreamWaitEvent(c->d2h, b->ev_fwd, 0));
            if (bytes)
                CUDA_CHECK(cudaMemcpyAsync(b->h_act_out, s->layers[c->nl - 1].out, bytes,
                                           cudaMemcpyDeviceToHost, c->d2h));
            CUDA_CHECK(cudaEventRecord(b->ev_act_out, c->d2h));
            CUDA_CHECK(cudaEventRecord(s->ev_read, c->d2h));
        }
        /* device messages: ready once the forward has run (msg_ready queries ev_fwd) */
        b->act_out_prepared = 1;
    } else {
        if (!b->has_grad_out)
            return pt_error_set("CUDA engine: GRAD_OUT of micro-batch %d before its backward",
                                m);
        if (!c->dm) {
            size_t bytes = (size_t)b->n * e->in_count * sizeof(float);
            CUDA_CHECK(cudaStreamWaitEvent(c->d2h, b->ev_bwd, 0));
            if (bytes)
                CUDA_CHECK(cudaMemcpyAsync(b->h_grad_out, b->grad_out, bytes,
                                           cudaMemcpyDeviceToHost, c->d2h));
            CUDA_CHECK(cudaEventRecord(b->ev_grad_out, c->d2h));
        }
        b->grad_out_prepared = 1;
    }
    return 0;
}

int engine_cuda_msg_ready(engine *e, engine_msg k, int m, int *ready)
{
    cuda_engine *c = engine_cuda_impl(e);
    *ready = 0;
    if (msg_check(e, k, m, 0)) return -1;
    cuda_mb *b = &c->mb[m];
    int act = k == ENGINE_MSG_ACT_OUT;
    if (!(act ? b->act_out_prepared : b->grad_out_prepared))
        return pt_error_set("CUDA engine: msg_ready of %s of micro-batch %d before "
                            "msg_prepare", msg_name(k), m);
    /* device messages: the kernels that wrote the buffer; host-staged: the copy out */
    cudaEvent_t ev = c->dm ? (act ? b->ev_fwd : b->ev_bwd)
                           : (act ? b->ev_act_out : b->ev_grad_out);
    cudaError_t r = cudaEventQuery(ev);
    if (r == cudaSuccess) {
        *ready = 1;
        return 0;
    }
    if (r == cudaErrorNotReady) {
        /* not an error, but the runtime may keep it as the last error, where the next
         * kernel launch's check would find it */
        (void)cudaGetLastError();
        return 0;
    }
    return pt_error_set("CUDA engine: %s of micro-batch %d: cudaEventQuery: %s (%s)",
                        msg_name(k), m, cudaGetErrorString(r), cudaGetErrorName(r));
}

