/* The CUDA engine's forward, backward, slot release and messages (state and stream
 * ordering: engine_cuda_impl.h). The layers run through the shared layer loop
 * (src/engine/layer_ops.h) with the CUDA kernel set below and the whole micro-batch as one
 * chunk, as src/cpu/stage.c runs it chunk by chunk with the CPU's. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "src/cuda/engine_cuda_impl.h"
#include "src/engine/layer_ops.h"
#include "src/base/clock.h"
#include "src/base/error.h"

/* ------------------------------------------------------------ the CUDA kernel set ---- */

/* kernels/cuda/kernels_cuda.h as the shared layer loop's device (src/engine/layer_ops.h); ctx is
 * the engine's kernel_cuda_ctx. */
static int cu_dense_forward(void *ctx, float *out, const float *in, const float *w,
                            const float *b, int n, int in_f, int out_f)
{
    return kernel_dense_forward_cuda(out, in, w, b, n, in_f, out_f, ctx);
}
static int cu_dense_backward(void *ctx, float *din, float *dw, float *db, const float *dout,
                             const float *in, const float *w, int n, int in_f, int out_f)
{
    return kernel_dense_backward_cuda(din, dw, db, dout, in, w, n, in_f, out_f, ctx);
}
static int cu_dense_backward_weight(void *ctx, float *dw, float *db, const float *dout,
                                    const float *in, int n, int in_f, int out_f)
{
    return kernel_dense_backward_weight_cuda(dw, db, dout, in, n, in_f, out_f, ctx);
}
static int cu_dense_backward_input(void *ctx, float *din, const float *dout, const float *w,
                                   int n, int in_f, int out_f)
{
    return kernel_dense_backward_input_cuda(din, dout, w, n, in_f, out_f, ctx);
}
static int cu_conv_forward(void *ctx, float *out, float *work, const float *in, const float *w,
                           const float *b, const kernel_conv2d_dims *d)
{
    return kernel_conv2d_forward_cuda(out, work, in, w, b, d, ctx);
}
static int cu_conv_backward(void *ctx, float *din, float *dw, float *db, float *work,
                            const float *dout, const float *in, const float *w,
                            const kernel_conv2d_dims *d)
{
    return kernel_conv2d_backward_cuda(din, dw, db, work, dout, in, w, d, ctx);
}
static int cu_conv_backward_weight(void *ctx, float *dw, float *db, float *work,
                                   const float *dout, const float *in, const kernel_conv2d_dims *d)
{
    return kernel_conv2d_backward_weight_cuda(dw, db, work, dout, in, d, ctx);
}
static int cu_conv_backward_input(void *ctx, float *din, float *work, const float *dout,
                                  const float *w, const kernel_conv2d_dims *d)
{
    return kernel_conv2d_backward_input_cuda(din, work, dout, w, d, ctx);
}
static int cu_maxpool_forward(void *ctx, float *out, int32_t *argmax, const float *in, int n,
                              int c, int h, int w, int size, int stride)
{
    return kernel_maxpool2d_forward_cuda(out, argmax, in, n, c, h, w, size, stride, ctx);
}
static int cu_maxpool_backward(void *ctx, float *din, const float *dout, const int32_t *argmax,
                               int n, int c, int h, int w, int size, int stride)
{
    return kernel_maxpool2d_backward_cuda(din, dout, argmax, n, c, h, w, size, stride, ctx);
}
static int cu_avgpool_forward(void *ctx, float *out, const float *in, int n, int c, int h, int w,
                              int size, int stride)
{
    return kernel_avgpool2d_forward_cuda(out, in, n, c, h, w, size, stride, ctx);
}
static int cu_avgpool_backward(void *ctx, float *din, const float *dout, int n, int c, int h,
                               int w, int size, int stride)
{
    return kernel_avgpool2d_backward_cuda(din, dout, n, c, h, w, size, stride, ctx);
}
static int cu_activation_forward(void *ctx, float *out, const float *in, size_t count,
                                 kernel_act act)
{
    return kernel_activation_forward_cuda(out, in, count, act, ctx);
}
static int cu_activation_backward(void *ctx, float *din, const float *dout, const float *out,
                                  size_t count, kernel_act act)
{
    return kernel_activation_backward_cuda(din, dout, out, count, act, ctx);
}
static int cu_dropout_forward(void *ctx, float *out, uint8_t *mask, const float *in, int n,
                              size_t per_sample, size_t elem_off, float p, uint64_t seed,
                              uint64_t stream, const int64_t *sample_ids)
{
    return kernel_dropout_forward_range_cuda(out, mask, in, n, per_sample, elem_off, p, seed,
                                             stream, sample_ids, ctx);
}
static int cu_dropout_backward(void *ctx, float *din, const float *dout, const uint8_t *mask,
                               size_t count, float p)
{
    if (!count) return 0;
    return kernel_dropout_backward_cuda(din, dout, mask, count, p, ctx);
}
static int cu_copy(void *ctx, float *dst, const float *src, size_t count)
{
    const kernel_cuda_ctx *k = ctx;
    if (count)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice,
                                   k->stream));
    return 0;
}

static const layer_kernels layer_kernels_cuda = {
    .dense_forward = cu_dense_forward,
    .dense_backward = cu_dense_backward,
    .dense_backward_weight = cu_dense_backward_weight,
    .dense_backward_input = cu_dense_backward_input,
    .conv_forward = cu_conv_forward,
    .conv_backward = cu_conv_backward,
    .conv_backward_weight = cu_conv_backward_weight,
    .conv_backward_input = cu_conv_backward_input,
    .maxpool_forward = cu_maxpool_forward,
    .maxpool_backward = cu_maxpool_backward,
    .avgpool_forward = cu_avgpool_forward,
    .avgpool_backward = cu_avgpool_backward,
    .activation_forward = cu_activation_forward,
    .activation_backward = cu_activation_backward,
    .dropout_forward = cu_dropout_forward,
    .dropout_backward = cu_dropout_backward,
    .copy = cu_copy,
};

/* ------------------------------------------------------------ forward, backward ---- */

/* Micro-batch m in slot s as the shared layer loop sees it: the whole micro-batch is one
 * chunk. */
typedef struct {
    engine *e;
    cuda_slot *s;
    int m;
    float *grads; /* backward, W: where parameter gradients go (NULL: B alone) */
} cuda_layer_io;

/* Local layer i is split by its inputs: its forward leaves partial sums, all-reduced over
 * the tensor group before its bias and activation (tp_finish). */
static int split_in(const cuda_engine *c, int i)
{
    return c->tp && c->tp->layers[c->first + i].split == SHARD_IN;
}

/* Where local layer i's data lives. The forward decides here whether the layer is the
 * identity (set_outputs in src/cpu/stage.c). */
static int layer_io_of(void *self, int i, int phase, layer_io *io)
{
    const cuda_layer_io *q = self;
    engine *e = q->e;
    cuda_engine *c = engine_cuda_impl(e);
    cuda_slot *s = q->s;
    slot_layer *sl = &s->layers[i];
    const layer_desc *L = &c->loc[i];
    io->x = sl->xin ? sl->xin : i == 0 ? c->mb[q->m].in : s->layers[i - 1].out;
    if (phase == LAYER_PHASE_FORWARD) {
        sl->identity = layer_is_identity(L, s->training);
        sl->out = sl->identity ? io->x : sl->buf;
        io->partial = split_in(c, i);
        /* a slice's elements keep their places in the whole vector's dropout mask */
        if (c->tp && sl->mask) {
            int l = c->first + i;
            size_t len;
            shard_values(&c->tp->layers[l].in, layer_shape_count(c->net->layers[l].in),
                         c->tp->T, c->tp_rank, &io->elem_off, &len);
        }
    }
    io->identity = sl->identity;
    io->y = sl->buf;
    io->out = sl->out;
    io->argmax = sl->argmax;
    io->mask = sl->mask;
    io->w = c->params + c->param_off[i];
    io->b = io->w + L->weight_count;
    io->ids = c->mb[q->m].ids;
    io->dw = q->grads ? q->grads + c->param_off[i] : NULL;
    io->db = io->dw ? io->dw + L->weight_count : NULL;
    io->gout = sl->gout;
    io->batched = engine_cuda_batched(c, i);
    if (phase == LAYER_PHASE_BACKWARD && io->batched && L->weight_count) {
        /* m's rows of the step's stash: its micro-batch index times the micro-batch size,
         * as the CPU engine's stage_slot_set_row */
        size_t in = layer_shape_count(L->in), out = layer_shape_count(L->out);
        size_t row = (size_t)(q->m % e->cfg.microbatches) * (size_t)e->cfg.max_batch;
        if (row + (size_t)s->n > (size_t)c->wgrad_rows)
            return pt_error_set("CUDA engine, layer %d: rows [%zu, %zu) of micro-batch buffer "
                                "%d outside the step's %d batched rows", c->first + i, row,
                                row + (size_t)s->n, q->m, c->wgrad_rows);
        io->stash_x = c->stash_x[i] + row * in;
        io->stash_g = c->stash_g[i] + row * out;
    }
    return 0;
}

static layer_run cuda_layer_run(engine *e, cuda_layer_io *q, int n)
{
    cuda_engine *c = engine_cuda_impl(e);
    layer_run r = {.k = &layer_kernels_cuda, .kctx = &c->ctx, .layers = c->loc,
                   .first = c->first, .n = n,
                   .work = c->work, .io = layer_io_of, .self = q};
    return r;
}

/* The loop failed: a kernel's message gets the operation, layer and micro-batch. */
static int layer_run_fail(const cuda_engine *c, const layer_run *r, int m)
{
    return r->what ? engine_cuda_layer_fail(r->what, c->first + r->failed, m) : -1;
}

/* ---- tensor shards: the collectives between the layers (src/model/shard.h) ----
 *
 * As src/cpu/stage.c: the work queued so far must be done before MPI reads the buffer, so each
 * collective waits on the host for the compute stream; host-staged, the data goes through
 * the pinned buffers on that stream (their next writer, the next collective, syncs first);
 * with device messages (CUDA-aware MPI) MPI reads and writes device memory itself. What
 * follows a collective is queued after it on the compute stream. */

/* Sums `count` floats at dbuf (device) over the tensor group, in place. */
static int tp_allreduce(engine *e, float *dbuf, size_t count)
{
    cuda_engine *c = engine_cuda_impl(e);
    cudaStream_t cs = c->ctx.stream;
    size_t bytes = count * sizeof(float);
    if (!c->dm && bytes)
        CUDA_CHECK(cudaMemcpyAsync(c->h_tp, dbuf, bytes, cudaMemcpyDeviceToHost, cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
    double t0 = pt_now();
    int rc = e->cfg.tensor_comm.allreduce(e->cfg.tensor_comm.ctx, c->dm ? dbuf : c->h_tp, count);
    e->tensor_s += pt_now() - t0;
    if (rc) return -1;
    if (!c->dm && bytes)
        CUDA_CHECK(cudaMemcpyAsync(dbuf, c->h_tp, bytes, cudaMemcpyHostToDevice, cs));
    return 0;
}

/* n samples of a vector of `whole` values in state st: every rank's slice (n rows of its
 * length, contiguous at `local` on this rank) all-gathered into n whole rows at `out`. */
static int tp_gather(engine *e, const shard_state *st, size_t whole, const float *local,
                     float *out, int n)
{
    cuda_engine *c = engine_cuda_impl(e);
    cudaStream_t cs = c->ctx.stream;
    int T = c->tp->T;
    size_t count[T], off[T], len[T];
    for (int r = 0; r < T; r++) {
        shard_values(st, whole, T, r, &off[r], &len[r]);
        count[r] = (size_t)n * len[r];
    }
    size_t mine = count[c->tp_rank] * sizeof(float);
    if (!c->dm && mine)
        CUDA_CHECK(cudaMemcpyAsync(c->h_tp_send, local, mine, cudaMemcpyDeviceToHost, cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
    float *recv = c->dm ? c->tp_recv : c->h_tp;
    double t0 = pt_now();
    int rc = e->cfg.tensor_comm.allgather(e->cfg.tensor_comm.ctx, c->dm ? local : c->h_tp_send,
                                          recv, count);
    e->tensor_s += pt_now() - t0;
    if (rc) return -1;
    const float *blk = recv;
    for (int r = 0; r < T && n > 0; blk += count[r], r++)
        CUDA_CHECK(cudaMemcpy2DAsync(out + off[r], whole * sizeof(float), blk,
                                     len[r] * sizeof(float), len[r] * sizeof(float), (size_t)n,
                                     c->dm ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                                     cs));
    return 0;
}

/* Rows [from, from + keep) of n rows of `whole` values, as n contiguous rows (device). */
static int tp_slice_rows(cuda_engine *c, const float *in, size_t whole, size_t from,
                         size_t keep, float *out, int n)
{
    if (n > 0 && keep)
        CUDA_CHECK(cudaMemcpy2DAsync(out, keep * sizeof(float), in + from,
                                     whole * sizeof(float), keep * sizeof(float), (size_t)n,
                                     cudaMemcpyDeviceToDevice, c->ctx.stream));
    return 0;
}

/* This rank's slice of n whole rows of a vector in state st. */
static int tp_slice(cuda_engine *c, const shard_state *st, size_t whole, const float *in,
                    float *out, int n)
{
    size_t off, len;
    shard_values(st, whole, c->tp->T, c->tp_rank, &off, &len);
    return tp_slice_rows(c, in, whole, off, len, out, n);
}

/* A layer split by its inputs, after its all-reduce: bias, then activation (per element,
 * as the CPU's tp_finish, so the bits agree). */
static int tp_finish(cuda_engine *c, int i, float *y, int n, int m)
{
    const layer_desc *L = &c->loc[i];
    size_t count = layer_shape_count(L->out);
    size_t per = L->type == LAYER_CONV ? (size_t)L->out.h * L->out.w : 1;
    if (kernel_bias_add_cuda(y, c->params + c->param_off[i] + L->weight_count, n,
                             (int)(count / per), per, &c->ctx) ||
        kernel_activation_forward_cuda(y, y, (size_t)n * count, L->activation, &c->ctx))
        return engine_cuda_layer_fail("bias and activation after the all-reduce",
                                      c->first + i, m);
    return 0;
}

/* The slot's output as the stage sends it: whole (gathered with tensor shards). */
static const float *slot_output(const cuda_engine *c, const cuda_slot *s)
{
    return s->whole_out ? s->whole_out : s->layers[c->nl - 1].out;
}

/* The forward in runs of layers between collectives: the shared loop runs each run, then
 * the tensor group completes what the next layer needs (src/cpu/stage.c's tp_forward). */
static int forward_layers(engine *e, cuda_slot *s, int m, int n, uint64_t seed, uint64_t step)
{
    cuda_engine *c = engine_cuda_impl(e);
    const net_desc *net = c->net;
    cuda_layer_io q = {.e = e, .s = s, .m = m};
    layer_run r = cuda_layer_run(e, &q, n);
    r.seed = seed;
    r.step = step;
    int nl = c->nl, lo = 0;
    if (!c->tp) return layer_run_forward(&r, 0, nl) ? layer_run_fail(c, &r, m) : 0;
    if (s->layers[0].xin && /* the stage's first layer works on a slice of the whole input */
        tp_slice(c, &c->tp->layers[c->first].in, e->in_count, c->mb[m].in, s->layers[0].xin,
                 n))
        return -1;
    for (int i = 0; i < nl; i++) {
        int l = c->first + i, then = shard_forward_after(c->tp, c->first, c->last, i);
        if (!then && i < nl - 1) continue;
        if (layer_run_forward(&r, lo, i + 1)) return layer_run_fail(c, &r, m);
        lo = i + 1;
        if ((then & SHARD_THEN_REDUCE) &&
            (tp_allreduce(e, s->layers[i].buf,
                          (size_t)n * layer_shape_count(c->loc[i].out)) ||
             tp_finish(c, i, s->layers[i].buf, n, m)))
            return -1;
        if ((then & SHARD_THEN_GATHER) &&
            tp_gather(e, &c->tp->layers[l].out, layer_shape_count(net->layers[l].out),
                      s->layers[i].out, i + 1 < nl ? s->layers[i + 1].xin : s->whole_out, n))
            return -1;
    }
    return 0;
}

/* A free slot for m's activations, or −1 with a message. */
static int take_slot(engine *e)
{
    cuda_engine *c = engine_cuda_impl(e);
    int k = 0;
    while (k < e->cfg.n_slots && c->slots[k].busy) k++;
    if (k == e->cfg.n_slots)
        return pt_error_set("CUDA engine, layers %d..%d: all %d activation slots are in use",
                            c->first, c->last - 1, e->cfg.n_slots);
    return k;
}

/* The compute stream waits for m's inputs to be copied in, and for the copies out of the
 * memory a forward into slot s overwrites. */
static int forward_waits(cuda_engine *c, const cuda_mb *b, const cuda_slot *s, int recompute)
{
    cudaStream_t cs = c->ctx.stream;
    if (c->needs_load) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_loaded, 0));
    if (!c->dm) {
        if (!c->is_first) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_act_in, 0));
        CUDA_CHECK(cudaStreamWaitEvent(cs, s->ev_read, 0));
        /* stage 0 rewrites its input, which an all-identity stage sent out as ACT_OUT; a
         * recomputing stage's training forward rewrites act_out, sent the same way */
        if (!recompute && (c->is_first || b->act_out))
            CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_act_out, 0));
    }
    return 0;
}

/* What a forward and a recompute begin with: a slot, the device, the waits of the slot's
 * reuse and the tick's start. The slot's index, or −1 with a message. */
static int begin_forward(engine *e, const cuda_mb *b, int recompute, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    int k = take_slot(e);
    if (k < 0) return -1;
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick) || forward_waits(c, b, &c->slots[k], recompute) ||
        engine_cuda_tick_begin(e, tick))
        return -1;
    return k;
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
    int k = begin_forward(e, b, 0, tick);
    if (k < 0) return -1;
    cuda_slot *s = &c->slots[k];
    cudaStream_t cs = c->ctx.stream;
    if (c->is_first && kernel_bytes_to_float_cuda(b->in, b->pixels, (size_t)n * e->in_count,
                                                  &c->ctx))
        return engine_cuda_layer_fail("pixel conversion", c->first, m);
    s->training = training;
    if (forward_layers(e, s, m, n, seed, step)) return -1;
    if (c->is_last) {
        if (c->n_loss == LOSS_CAPACITY && engine_cuda_loss_drain(c)) return -1;
        int j = c->n_loss;
        const float *logits = slot_output(c, s);
        if (kernel_softmax_xent_cuda(training ? b->grad_in : NULL, c->d_correct + j,
                                     c->d_loss + j, logits, b->labels, n, c->net->classes,
                                     training ? 1.0f / (float)e->cfg.batch : 1.0f, &c->ctx))
            return engine_cuda_layer_fail("loss", c->last - 1, m);
        c->n_loss++;
    }
    /* recompute: the output is kept to send (the last stage keeps the loss gradient) and
     * the activations are dropped until recompute(m) */
    int drop = e->cfg.recompute && training;
    if (drop && b->act_out && n > 0)
        CUDA_CHECK(cudaMemcpyAsync(b->act_out, slot_output(c, s),
                                   (size_t)n * e->out_count * sizeof(float),
                                   cudaMemcpyDeviceToDevice, cs));
    CUDA_CHECK(cudaEventRecord(b->ev_fwd, cs));
    if (engine_cuda_tick_end(e, tick)) return -1;
    s->busy = !drop;
    s->m = m;
    s->n = n;
    s->has_gout = 0;
    b->slot = drop ? -1 : k;
    b->n = n;
    b->has_grad_out = 0;
    b->act_out_prepared = b->grad_out_prepared = 0;
    b->act_kept = drop && b->act_out != NULL;
    b->dropped = drop;
    return 0;
}

int engine_cuda_recompute(engine *e, int m, uint64_t seed, uint64_t step, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_cuda_check_m(e, m, "recompute")) return -1;
    cuda_mb *b = &c->mb[m];
    if (!e->cfg.recompute || b->slot >= 0 || !b->dropped)
        return pt_error_set("CUDA engine: recompute of micro-batch buffer %d, which %s", m,
                            !e->cfg.recompute ? "is not recomputed (engine without recompute)"
                            : b->slot >= 0    ? "holds its activations"
                                              : "had no training forward since its last "
                                                "evaluation");
    int k = begin_forward(e, b, 1, tick);
    if (k < 0) return -1;
    cuda_slot *s = &c->slots[k];
    cudaStream_t cs = c->ctx.stream;
    /* the input is still there: stage 0's converted pixels, or ACT_IN */
    s->training = 1;
    if (forward_layers(e, s, m, b->n, seed, step)) return -1;
    CUDA_CHECK(cudaEventRecord(b->ev_late, cs));
    if (engine_cuda_tick_end(e, tick)) return -1;
    s->busy = 1;
    s->m = m;
    s->n = b->n;
    s->has_gout = 0;
    b->slot = k;
    return 0;
}

/* Local layers [lo, hi), from the running gradient c->range_g (in scratch buffer
 * c->range_gi, −1 for GRAD_IN), which is left where the next range starts; the ranges of one
 * micro-batch thus make exactly the kernel calls of one backward over all layers. Parameter
 * gradients go to `grads` (the stage's, mb_grads or a piece: see backward_range; unused by
 * B). parts, as src/cpu/stage.c's backward_chunk: ENGINE_CUDA_BW_BOTH, or ENGINE_CUDA_BW_INPUT
 * alone (B, which keeps each parameter layer's output gradient in the slot for W). Batched
 * layers stash their rows and leave their weight half to the step's flush. */
static int backward_layers(engine *e, cuda_slot *s, int m, int lo, int hi, float *din,
                           float *grads, int parts)
{
    cuda_engine *c = engine_cuda_impl(e);
    cuda_layer_io q = {.e = e, .s = s, .m = m, .grads = grads};
    layer_run r = cuda_layer_run(e, &q, s->n);
    if (!c->tp) {
        if (layer_run_backward(&r, lo, hi, &c->range_g, &c->range_gi, c->scratch, din, parts))
            return layer_run_fail(c, &r, m);
        return 0;
    }
    /* Tensor shards, in runs between the collectives (src/cpu/stage.c's backward_span): an
     * output-split layer's input gradient holds partial sums (all-reduced), a gathered
     * input's gradient is whole (each rank keeps its slice), a sliced stage input's gradient
     * is a slice (all-gathered for the previous stage), and a gathered stage output's
     * gradient arrives whole (sliced first). */
    const shard_plan *tp = c->tp;
    int n = s->n;
    if (hi == c->nl && s->whole_out) {
        if (tp_slice(c, &tp->layers[c->last - 1].out, e->out_count, c->range_g, c->tp_dout, n))
            return -1;
        c->range_g = c->tp_dout;
        c->range_gi = -1;
    }
    for (int h = hi; h > lo;) {
        int b = shard_backward_stop(tp, c->first, lo, h);
        int slice_in = b == 0 && s->layers[0].xin; /* the gradient of a sliced stage input */
        if (layer_run_backward(&r, b, h, &c->range_g, &c->range_gi, c->scratch,
                               b == 0 ? (slice_in && din ? c->tp_din : din) : NULL, parts))
            return layer_run_fail(c, &r, m);
        int l = c->first + b;
        size_t whole = layer_shape_count(c->net->layers[l].in);
        if (b > 0 && tp->layers[l].split == SHARD_OUT) {
            int gi = c->range_gi; /* a parameter layer wrote it into a scratch buffer */
            if (gi < 0)
                return pt_error_set("CUDA engine, layer %d: no input gradient to all-reduce "
                                    "(micro-batch %d)", l, m);
            if (tp_allreduce(e, c->scratch[gi], (size_t)n * whole)) return -1;
            if (s->layers[b].xin) { /* gathered input: back to the previous layer's slice */
                size_t from, keep;
                shard_values(&tp->layers[l - 1].out, whole, tp->T, c->tp_rank, &from, &keep);
                if (tp_slice_rows(c, c->scratch[gi], whole, from, keep, c->scratch[1 - gi], n))
                    return -1;
                c->range_g = c->scratch[1 - gi];
                c->range_gi = 1 - gi;
            }
        } else if (b == 0 && din && tp->layers[l].split == SHARD_OUT) {
            if (tp_allreduce(e, din, (size_t)n * whole)) return -1;
        } else if (slice_in && din) {
            if (tp_gather(e, &tp->layers[l].in, whole, c->tp_din, din, n)) return -1;
        }
        h = b;
    }
    return 0;
}

/* W of local layers [lo, hi), as src/cpu/stage.c's weight_chunk: each parameter layer's weight
 * half from its input and the output gradient B kept. */
static int weight_layers(engine *e, cuda_slot *s, int m, int lo, int hi, float *grads)
{
    cuda_engine *c = engine_cuda_impl(e);
    cuda_layer_io q = {.e = e, .s = s, .m = m, .grads = grads};
    layer_run r = cuda_layer_run(e, &q, s->n);
    if (layer_run_weight(&r, lo, hi)) return layer_run_fail(c, &r, m);
    return 0;
}

/* The parameters of local layers [lo, hi) whose gradients a backward forms per micro-batch
 * (all but batched layers) as maximal runs [begin, end) of offsets (src/cpu/stage.c's
 * grad_runs): what is zeroed before and added after a gradient formed apart. Without
 * batched layers this is the one run [param_off[lo], end of layer hi − 1). */
static int grad_runs(const engine *e, int lo, int hi, size_t (*runs)[2])
{
    const cuda_engine *c = e->impl;
    int n = 0;
    for (int i = lo; i < hi; i++) {
        size_t b = c->param_off[i], end = i + 1 < c->nl ? c->param_off[i + 1] : e->param_count;
        if (b == end || engine_cuda_batched(c, i)) continue;
        if (n && runs[n - 1][1] == b) runs[n - 1][1] = end;
        else runs[n][0] = b, runs[n++][1] = end;
    }
    return n;
}

/* m's parameter gradients of layers [lo, hi) into `target`: zeroed first when formed apart
 * (`apart`: mb_grads or a piece), added to the stage's after when `add` (mb_grads).
 * parts: BW_BOTH runs the backward of those layers (backward_range), BW_WEIGHT W alone. */
static int grads_span(engine *e, cuda_slot *s, int m, int lo, int hi, float *target, int apart,
                      int add, int parts)
{
    cuda_engine *c = engine_cuda_impl(e);
    size_t(*runs)[2] = c->runs;
    int nr = grad_runs(e, lo, hi, runs), rc = 0;
    for (int r = 0; apart && r < nr && !rc; r++) {
        cudaError_t err = cudaMemsetAsync(target + runs[r][0], 0,
                                          (runs[r][1] - runs[r][0]) * sizeof(float),
                                          c->ctx.stream);
        if (err != cudaSuccess)
            rc = pt_error_set("CUDA engine: cudaMemsetAsync: %s", cudaGetErrorString(err));
    }
    if (!rc)
        rc = parts == ENGINE_CUDA_BW_WEIGHT
                 ? weight_layers(e, s, m, lo, hi, target)
                 : backward_layers(e, s, m, lo, hi, c->is_first ? NULL : c->mb[m].grad_out,
                                   target, parts);
    for (int r = 0; add && r < nr && !rc; r++)
        rc = kernel_add_cuda(c->grads + runs[r][0], target + runs[r][0],
                             runs[r][1] - runs[r][0], &c->ctx);
    return rc;
}

/* Batched weight gradients: at the backward (or W) of the step's last micro-batch, the
 * batched layers of [lo, hi) get theirs, written, in the CPU's tiles of output units. */
static int wgrad_flush(engine *e, int m, int lo, int hi)
{
    cuda_engine *c = engine_cuda_impl(e);
    int M = e->cfg.microbatches;
    if (!c->wgrad_rows || m % M != M - 1) return 0;
    for (int i = lo; i < hi; i++) {
        if (!engine_cuda_batched(c, i)) continue;
        const layer_desc *L = &c->loc[i];
        int in = (int)layer_shape_count(L->in), out = L->u.dense.units;
        float *dw = c->grads + c->param_off[i], *db = dw + L->weight_count;
        for (int a = 0; a < out; a += ENGINE_CUDA_WGRAD_TILE) {
            int w = out - a < ENGINE_CUDA_WGRAD_TILE ? out - a : ENGINE_CUDA_WGRAD_TILE;
            if (kernel_dense_weight_grad_units_cuda(dw, db, c->stash_g[i], c->stash_x[i],
                                                    c->wgrad_rows, in, out, a, w, &c->ctx))
                return engine_cuda_layer_fail("batched weight gradient", c->first + i, m);
        }
    }
    return 0;
}

/* The slot of m for a backward part, or NULL with a message. */
static cuda_slot *backward_slot(engine *e, int m, const char *what)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_cuda_check_m(e, m, what)) return NULL;
    const cuda_mb *b = &c->mb[m];
    if (b->slot < 0) {
        pt_error_set("CUDA engine: %s of micro-batch %d, which holds no slot (no forward%s "
                     "since its release)", what, m, e->cfg.recompute ? " or recompute" : "");
        return NULL;
    }
    cuda_slot *s = &c->slots[b->slot];
    if (!s->training) {
        pt_error_set("CUDA engine: %s of micro-batch %d after an evaluation forward", what, m);
        return NULL;
    }
    return s;
}

/* The compute stream waits for GRAD_IN of m, and for the copy out of GRAD_OUT, which the
 * backward is about to rewrite. */
static int backward_waits(cuda_engine *c, const cuda_mb *b)
{
    cudaStream_t cs = c->ctx.stream;
    if (!c->dm) {
        if (!c->is_last) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_grad_in, 0));
        if (!c->is_first) CUDA_CHECK(cudaStreamWaitEvent(cs, b->ev_grad_out, 0));
    }
    return 0;
}

int engine_cuda_backward_range(engine *e, int m, int lo, int hi, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    cuda_slot *s = backward_slot(e, m, "backward");
    if (!s) return -1;
    cuda_mb *b = &c->mb[m];
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
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick)) return -1;
    if (backward_waits(c, b)) return -1;
    if (engine_cuda_tick_begin(e, tick)) return -1;
    if (hi == c->nl) {
        /* As the CPU stage (src/cpu/stage.h): the first micro-batch since the step sums into the
         * gradients, each later one into mb_grads, which is then added; with pieces, m's
         * gradient is formed alone in piece m mod P. */
        c->range_add = c->pieces == 1 && c->accumulated;
        c->range_target = c->pieces > 1 ? c->piece[m % c->pieces]
                                        : c->range_add ? c->mb_grads : c->grads;
        c->range_g = b->grad_in;
        c->range_gi = -1;
    }
    if (grads_span(e, s, m, lo, hi, c->range_target, c->range_add || c->pieces > 1,
                   c->range_add, ENGINE_CUDA_BW_BOTH) ||
        wgrad_flush(e, m, lo, hi) || engine_cuda_grads_written(c, lo, hi))
        return -1;
    CUDA_CHECK(cudaEventRecord(b->ev_bwd, c->ctx.stream));
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

int engine_cuda_backward_input(engine *e, int m, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!e->cfg.split_backward)
        return pt_error_set("CUDA engine: backward_input of micro-batch %d without "
                            "split_backward", m);
    cuda_slot *s = backward_slot(e, m, "backward_input");
    if (!s) return -1;
    cuda_mb *b = &c->mb[m];
    if (c->range_hi)
        return pt_error_set("CUDA engine, layers %d..%d: backward_input of micro-batch %d "
                            "while micro-batch %d's backward by ranges is unfinished",
                            c->first, c->last - 1, m, c->range_m);
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick)) return -1;
    if (backward_waits(c, b)) return -1;
    if (engine_cuda_tick_begin(e, tick)) return -1;
    c->range_g = b->grad_in;
    c->range_gi = -1;
    if (backward_layers(e, s, m, 0, c->nl, c->is_first ? NULL : b->grad_out, NULL,
                        ENGINE_CUDA_BW_INPUT))
        return -1;
    CUDA_CHECK(cudaEventRecord(b->ev_bwd, c->ctx.stream));
    if (engine_cuda_tick_end(e, tick)) return -1;
    s->has_gout = 1;
    b->has_grad_out = !c->is_first;
    b->grad_out_prepared = 0;
    return 0;
}

int engine_cuda_backward_weight(engine *e, int m, int lo, int hi, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!e->cfg.split_backward)
        return pt_error_set("CUDA engine: backward_weight of micro-batch %d without "
                            "split_backward", m);
    cuda_slot *s = backward_slot(e, m, "backward_weight");
    if (!s) return -1;
    if (!s->has_gout)
        return pt_error_set("CUDA engine: backward_weight of micro-batch %d before its "
                            "backward_input", m);
    if (lo < 0 || hi > c->nl || lo >= hi)
        return pt_error_set("CUDA engine, layers %d..%d: weight gradients of local layers "
                            "[%d, %d), outside the stage's %d", c->first, c->last - 1, lo, hi,
                            c->nl);
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick) || engine_cuda_tick_begin(e, tick)) return -1;
    /* the targets of backward_range, decided per call as src/cpu/stage.c does */
    int add = c->pieces == 1 && c->accumulated;
    float *target = c->pieces > 1 ? c->piece[m % c->pieces] : add ? c->mb_grads : c->grads;
    if (grads_span(e, s, m, lo, hi, target, add || c->pieces > 1, add, ENGINE_CUDA_BW_WEIGHT) ||
        wgrad_flush(e, m, lo, hi) || engine_cuda_grads_written(c, lo, hi))
        return -1;
    CUDA_CHECK(cudaEventRecord(c->mb[m].ev_late, c->ctx.stream));
    if (engine_cuda_tick_end(e, tick)) return -1;
    if (lo == 0 && c->pieces == 1) c->accumulated = 1;
    return 0;
}

int engine_cuda_release(engine *e, int m)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (engine_cuda_check_m(e, m, "release")) return -1;
    cuda_mb *b = &c->mb[m];
    if (b->slot < 0) {
        /* recompute: the training forward gave the slot back already (engine.h) */
        if (e->cfg.recompute) return 0;
        return pt_error_set("CUDA engine: release of micro-batch %d, which holds no slot", m);
    }
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
        if (b->act_kept) return b->act_out;
        if (b->slot < 0) {
            pt_error_set("CUDA engine: ACT_OUT of micro-batch %d before its forward", m);
            return NULL;
        }
        return (void *)slot_output(c, &c->slots[b->slot]);
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
            const float *src = s ? slot_output(c, s) : b->act_out;
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

