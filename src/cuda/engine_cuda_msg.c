/* The CUDA engine's messages (ACT_IN, ACT_OUT, GRAD_IN, GRAD_OUT): their buffers, host-staged
 * copies and readiness (stream ordering: engine_cuda_impl.h). Split from engine_cuda_run.c. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "src/base/error.h"
#include "src/cuda/engine_cuda_impl.h"

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
        return pt_error_set("CUDA engine, layers %d..%d: no %s message %s", c->plan.first,
                            c->plan.last - 1, msg_name(k),
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
        if (b->act_kept) return b->act_out;
        if (b->slot < 0) {
            pt_error_set("CUDA engine: ACT_OUT of micro-batch %d before its forward", m);
            return NULL;
        }
        return (void *)engine_cuda_slot_output(c, &c->slots[b->slot]);
    }
    switch (k) {
    case ENGINE_MSG_ACT_IN:
        /* MPI may write the buffer from now on: host-staged, the previous copy out of it
         * must be over; device, the kernels that read m's input (forward and backward) */
        if (c->dm) {
            r = cudaEventSynchronize(b->ev_fwd);
            if (r == cudaSuccess) r = cudaEventSynchronize(b->ev_bwd);
            if (r == cudaSuccess) r = cudaEventSynchronize(b->ev_late);
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
        CUDA_CHECK(cudaStreamWaitEvent(c->h2d, b->ev_late, 0));
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
        if (b->slot < 0 && !b->act_kept)
            return pt_error_set("CUDA engine: ACT_OUT of micro-batch %d before its forward", m);
        /* recompute: the kept copy of the output; else the slot's last layer */
        cuda_slot *s = b->act_kept ? NULL : &c->slots[b->slot];
        if (!c->dm) {
            size_t bytes = (size_t)b->n * e->out_count * sizeof(float);
            const float *src = s ? engine_cuda_slot_output(c, s) : b->act_out;
            CUDA_CHECK(cudaStreamWaitEvent(c->d2h, b->ev_fwd, 0));
            if (bytes)
                CUDA_CHECK(cudaMemcpyAsync(b->h_act_out, src, bytes, cudaMemcpyDeviceToHost,
                                           c->d2h));
            CUDA_CHECK(cudaEventRecord(b->ev_act_out, c->d2h));
            if (s) CUDA_CHECK(cudaEventRecord(s->ev_read, c->d2h));
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

