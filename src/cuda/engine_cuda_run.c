/* The CUDA engine's forward, backward and slot release (messages: engine_cuda_msg.c; state
 * and stream ordering: engine_cuda_impl.h). The layers run through the shared layer loop
 * (src/engine/layer_ops.h) with the CUDA kernel set (engine_cuda.c) and the whole
 * micro-batch as one chunk, as src/cpu/stage.c runs it chunk by chunk with the CPU's; the
 * tensor runs and the gradient targets are src/engine/stage_plan.h's, shared with it. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "src/cuda/engine_cuda_impl.h"
#include "src/engine/layer_ops.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/model/shard.h"

/* ------------------------------------------------------------ forward, backward ---- */

/* Micro-batch m in slot s as the shared layer loop and the shared tensor runs see it: the
 * whole micro-batch is one chunk. */
typedef struct {
    engine *e;
    cuda_slot *s;
    int m, n;            /* the micro-batch and its samples */
    uint64_t seed, step; /* forward: dropout */
    float *grads;        /* backward, W: where parameter gradients go (NULL: B alone) */
    int parts;           /* backward: LAYER_BW_BOTH, or LAYER_BW_INPUT (B) */
} cuda_pass;

/* Where local layer i's data lives: the shared rule, m's sample ids, and a batched layer's
 * rows of the step's stash. */
static int layer_io_of(void *self, int i, int phase, layer_io *io)
{
    const cuda_pass *q = self;
    engine *e = q->e;
    cuda_engine *c = engine_cuda_impl(e);
    const stage_plan *p = &c->plan;
    cuda_slot *s = q->s;
    stage_plan_layer_io(p, s->layers, c->mb[q->m].in, c->params, q->grads, i, phase, 0, io);
    io->ids = c->mb[q->m].ids;
    /* a batched layer's rows of the step's stash (a block stashes in B, or in W when split) */
    if (phase != LAYER_PHASE_FORWARD && io->batched && p->loc[i].weight_count) {
        size_t row = (size_t)engine_stash_row(e, q->m);
        if (row + (size_t)s->n > (size_t)p->wgrad_rows)
            return pt_error_set("CUDA engine, layer %d: rows [%zu, %zu) of micro-batch buffer "
                                "%d outside the step's %d batched rows", p->first + i, row,
                                row + (size_t)s->n, q->m, p->wgrad_rows);
        stage_plan_stash_io(p, i, c->stash_x[i], c->stash_g[i], row, io);
    }
    return 0;
}

static layer_run cuda_layer_run(cuda_pass *q)
{
    cuda_engine *c = engine_cuda_impl(q->e);
    layer_run r = {.k = &layer_kernels_cuda, .kctx = &c->ctx, .layers = c->plan.loc,
                   .first = c->plan.first, .n = q->n, .work = c->work, .io = layer_io_of,
                   .self = q, .seed = q->seed, .step = q->step};
    return r;
}

/* The loop failed: a kernel's message gets the operation, layer and micro-batch. */
static int layer_run_fail(const cuda_engine *c, const layer_run *r, int m)
{
    return r->what ? engine_cuda_layer_fail(r->what, c->plan.first + r->failed, m) : -1;
}

/* ---- tensor shards: the CUDA side of the shared runs (src/engine/stage_plan.h) ----
 *
 * The work queued so far must be done before MPI reads the buffer, so each collective waits
 * on the host for the compute stream; host-staged, the data goes through the pinned buffers
 * on that stream (their next writer, the next collective, syncs first); with device
 * messages (CUDA-aware MPI) MPI reads and writes device memory itself. What follows a
 * collective is queued after it on the compute stream. */

/* Layers [lo, hi) from phase `from` of the first to before phase `to` of the last (a block
 * cut by heads between its all-reduces; 0 and 0: whole layers). */
static int tp_forward_phases(void *self, int lo, int hi, int from, int to)
{
    cuda_pass *q = self;
    cuda_engine *c = engine_cuda_impl(q->e);
    layer_run r = cuda_layer_run(q);
    r.from = from;
    r.to = to;
    if (layer_run_forward(&r, lo, hi)) return layer_run_fail(c, &r, q->m);
    return 0;
}

/* The backward of [lo, hi) from phase `from` of hi − 1 to before phase `to` of lo, the
 * running gradient kept between the calls as between backward ranges (c->range_g): a
 * phase that stops inside a layer leaves its partial gradient in a scratch buffer, which
 * tp_reduce_carry all-reduces. */
static int tp_backward_phases(void *self, int lo, int hi, int from, int to, const float *dout,
                              float *din)
{
    cuda_pass *q = self;
    cuda_engine *c = engine_cuda_impl(q->e);
    if (dout) {
        c->range_g = dout;
        c->range_gi = -1;
    }
    layer_run r = cuda_layer_run(q);
    r.from = from;
    r.to = to;
    if (layer_run_backward(&r, lo, hi, &c->range_g, &c->range_gi, c->scratch, din, q->parts))
        return layer_run_fail(c, &r, q->m);
    return 0;
}

static int tp_forward_run(void *self, int lo, int hi)
{
    cuda_pass *q = self;
    cuda_engine *c = engine_cuda_impl(q->e);
    layer_run r = cuda_layer_run(q);
    /* with tensor shards the shared runs call the ZeRO-3 hook themselves (tp_layer) */
    if (!c->zero3 || c->plan.tp) {
        if (layer_run_forward(&r, lo, hi)) return layer_run_fail(c, &r, q->m);
        return 0;
    }
    /* ZeRO-3: one layer at a time, its parameters gathered and uploaded around it */
    for (int l = lo; l < hi; l++) {
        if (engine_cuda_layer_begin(q->e, l, 0)) return -1;
        if (layer_run_forward(&r, l, l + 1)) return layer_run_fail(c, &r, q->m);
        if (engine_cuda_layer_end(q->e, l, 0)) return -1;
    }
    return 0;
}

/* From dout when given (the top range), else from where the range above left the running
 * gradient (c->range_g, in scratch buffer c->range_gi, −1 for GRAD_IN), which is left where
 * the next range starts: the ranges of one micro-batch make exactly the kernel calls of one
 * backward over all layers. */
static int tp_backward_run(void *self, int lo, int hi, const float *dout, float *din)
{
    cuda_pass *q = self;
    cuda_engine *c = engine_cuda_impl(q->e);
    /* with tensor shards the shared runs call the ZeRO-3 hook themselves (tp_layer) */
    if (!c->zero3 || c->plan.tp) return tp_backward_phases(self, lo, hi, 0, 0, dout, din);
    if (dout) {
        c->range_g = dout;
        c->range_gi = -1;
    }
    layer_run r = cuda_layer_run(q);
    /* ZeRO-3: layer by layer from the top, the running gradient left between them as
     * between backward ranges (the same kernel calls) */
    for (int l = hi - 1; l >= lo; l--) {
        if (engine_cuda_layer_begin(q->e, l, 1)) return -1;
        if (layer_run_backward(&r, l, l + 1, &c->range_g, &c->range_gi, c->scratch, din,
                               q->parts))
            return layer_run_fail(c, &r, q->m);
        if (engine_cuda_layer_end(q->e, l, 1)) return -1;
    }
    return 0;
}

/* Sums `count` floats at dbuf (device) over the tensor group, in place. */
static int tp_allreduce(void *self, float *dbuf, size_t count)
{
    engine *e = ((cuda_pass *)self)->e;
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

static int tp_gather(void *self, const shard_state *st, size_t whole, const float *local,
                     float *out, int n)
{
    engine *e = ((cuda_pass *)self)->e;
    cuda_engine *c = engine_cuda_impl(e);
    cudaStream_t cs = c->ctx.stream;
    int T = c->plan.tp->T;
    size_t count[T], off[T], len[T];
    stage_tensor_counts(&c->plan, st, whole, n, count, off, len);
    size_t mine = count[c->plan.tp_rank] * sizeof(float);
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

/* Values [from, from + keep) of n rows of `whole` values, as n contiguous rows (device). */
static int slice_rows(cuda_engine *c, const float *in, size_t whole, size_t from, size_t keep,
                      float *out, int n)
{
    if (n > 0 && keep)
        CUDA_CHECK(cudaMemcpy2DAsync(out, keep * sizeof(float), in + from,
                                     whole * sizeof(float), keep * sizeof(float), (size_t)n,
                                     cudaMemcpyDeviceToDevice, c->ctx.stream));
    return 0;
}

static int tp_slice(void *self, const float *in, size_t whole, size_t from, size_t keep,
                    float *out, int n)
{
    return slice_rows(engine_cuda_impl(((cuda_pass *)self)->e), in, whole, from, keep, out, n);
}

/* A layer split by its inputs, after its all-reduce: bias, then activation (per element,
 * as the CPU's, so the bits agree). */
static int tp_finish(void *self, int i, float *y, int n)
{
    const cuda_pass *q = self;
    cuda_engine *c = engine_cuda_impl(q->e);
    const layer_desc *L = &c->plan.loc[i];
    size_t count = layer_shape_count(L->out);
    size_t per = L->type == LAYER_CONV ? (size_t)L->out.h * L->out.w : 1;
    if (kernel_bias_add_cuda(y, c->params + c->plan.param_off[i] + L->weight_count, n,
                             (int)(count / per), per, &c->ctx) ||
        kernel_activation_forward_cuda(y, y, (size_t)n * count, L->activation, &c->ctx))
        return engine_cuda_layer_fail("bias and activation after the all-reduce",
                                      c->plan.first + i, q->m);
    return 0;
}

/* The running gradient (a parameter layer wrote it into a scratch buffer) all-reduced; a
 * gathered input's gradient is then cut to the previous layer's slice, into the other. */
static int tp_reduce_carry(void *self, int b, size_t whole, size_t from, size_t keep, int n)
{
    const cuda_pass *q = self;
    cuda_engine *c = engine_cuda_impl(q->e);
    int gi = c->range_gi;
    if (gi < 0)
        return pt_error_set("CUDA engine, layer %d: no input gradient to all-reduce "
                            "(micro-batch %d)", c->plan.first + b, q->m);
    if (tp_allreduce(self, c->scratch[gi], (size_t)n * whole)) return -1;
    if (!q->s->layers[b].xin) return 0;
    if (slice_rows(c, c->scratch[gi], whole, from, keep, c->scratch[1 - gi], n)) return -1;
    c->range_g = c->scratch[1 - gi];
    c->range_gi = 1 - gi;
    return 0;
}

/* ZeRO-3 with tensor shards: the shared runs call this around each layer's phases
 * (stage_tensor_run.layer, one layer per run), so a layer cut by its inputs keeps its
 * parameters mapped through its all-reduce to its bias and activation (tp_finish), and the
 * replica group's gathers interleave with the tensor collectives in one order on every rank. */
static int tp_layer(void *self, int i, int backward, int begins)
{
    engine *e = ((cuda_pass *)self)->e;
    return begins ? engine_cuda_layer_begin(e, i, backward)
                  : engine_cuda_layer_end(e, i, backward);
}

static const stage_tensor_ops tensor_ops_cuda = {
    .forward = tp_forward_run,
    .backward = tp_backward_run,
    .allreduce = tp_allreduce,
    .gather = tp_gather,
    .slice = tp_slice,
    .finish = tp_finish,
    .reduce_carry = tp_reduce_carry,
    .forward_phases = tp_forward_phases,
    .backward_phases = tp_backward_phases,
};

static stage_tensor_run cuda_tensor_run(engine *e, cuda_pass *q)
{
    cuda_engine *c = engine_cuda_impl(e);
    stage_tensor_run r = {.plan = &c->plan, .ops = &tensor_ops_cuda, .self = q, .n = q->n,
                          .layers = q->s->layers, .input = c->mb[q->m].in,
                          .whole_out = q->s->whole_out, .tp_dout = c->tp_dout,
                          .tp_din = c->tp_din,
                          .layer = c->zero3 && c->plan.tp ? tp_layer : NULL};
    return r;
}


/* The forward of m's n samples into slot s (the shared runs between collectives). */
static int forward_layers(engine *e, cuda_slot *s, int m, int n, uint64_t seed, uint64_t step)
{
    cuda_engine *c = engine_cuda_impl(e);
    (void)stage_plan_set_outputs(&c->plan, s->layers, c->mb[m].in, s->whole_out, s->training);
    cuda_pass q = {.e = e, .s = s, .m = m, .n = n, .seed = seed, .step = step};
    stage_tensor_run r = cuda_tensor_run(e, &q);
    return stage_tensor_forward(&r);
}

/* ---- the vocabulary-parallel loss (the head cut by vocabulary, c->xs_*) ---- */

/* `each` floats of every rank of the tensor group, rank by rank, from mine into all
 * (device): host-staged through the pinned copies, or on the device buffers with
 * CUDA-aware MPI; after the compute stream's work, and before what follows on it. */
static int xs_gather(engine *e, const float *mine, float *all, size_t each)
{
    cuda_engine *c = engine_cuda_impl(e);
    cudaStream_t cs = c->ctx.stream;
    int T = c->plan.tp->T;
    size_t count[T];
    for (int r = 0; r < T; r++) count[r] = each;
    if (!c->dm && each)
        CUDA_CHECK(cudaMemcpyAsync(c->h_xs_mine, mine, each * sizeof(float),
                                   cudaMemcpyDeviceToHost, cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
    double t0 = pt_now();
    int rc = e->cfg.tensor_comm.allgather(e->cfg.tensor_comm.ctx, c->dm ? mine : c->h_xs_mine,
                                          c->dm ? all : c->h_xs_all, count);
    e->tensor_s += pt_now() - t0;
    if (rc) return -1;
    if (!c->dm && each)
        CUDA_CHECK(cudaMemcpyAsync(all, c->h_xs_all, (size_t)T * each * sizeof(float),
                                   cudaMemcpyHostToDevice, cs));
    return 0;
}

/* Loss entry j of m's `rows` rows of this rank's logits (src/cpu/stage_loss.c's
 * sharded_loss): each row's maximum and argmax gathered, then each rank's sum of
 * exponentials and the target's logit, then every rank's loss, hits and its columns of the
 * gradient (into GRAD_IN when training). */
static int sharded_loss(engine *e, cuda_mb *b, const float *logits, int rows, int training,
                        int j)
{
    cuda_engine *c = engine_cuda_impl(e);
    const stage_plan *p = &c->plan;
    int T = p->tp->T, V = p->net->classes, first, Vr;
    shard_cut(V, T, p->tp_rank, &first, &Vr);
    float *dl = training ? b->grad_in : NULL;
    size_t R = (size_t)rows;
    return kernel_xent_shard_max_cuda(c->xs_mine, logits, rows, Vr, first, &c->ctx) ||
           xs_gather(e, c->xs_mine, c->xs_all, 2 * R) ||
           kernel_xent_shard_sums_cuda(c->xs_mine, dl, c->xs_ma, c->xs_all, logits, b->labels,
                                       rows, Vr, first, T, &c->ctx) ||
           xs_gather(e, c->xs_mine, c->xs_all, 3 * R) ||
           kernel_xent_shard_finish_cuda(dl, c->d_correct + j, c->d_loss + j, c->xs_all,
                                         c->xs_ma, b->labels, rows, Vr, first, V, T,
                                         engine_loss_scale(&e->cfg, training), c->xs_loss,
                                         c->xs_right, &c->ctx);
}

/* A free slot for m's activations, or −1 with a message. */
static int take_slot(engine *e)
{
    cuda_engine *c = engine_cuda_impl(e);
    int k = 0;
    while (k < e->cfg.n_slots && c->slots[k].busy) k++;
    if (k == e->cfg.n_slots)
        return pt_error_set("CUDA engine, layers %d..%d: all %d activation slots are in use",
                            c->plan.first, c->plan.last - 1, e->cfg.n_slots);
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
    /* a language model's token ids were loaded into `in` as floats */
    if (c->is_first && b->pixels &&
        kernel_bytes_to_float_cuda(b->in, b->pixels, (size_t)n * e->in_count, &c->ctx))
        return engine_cuda_layer_fail("pixel conversion", c->plan.first, m);
    s->training = training;
    if (forward_layers(e, s, m, n, seed, step)) return -1;
    if (c->is_last) {
        if (c->n_loss == LOSS_CAPACITY && engine_cuda_loss_drain(c)) return -1;
        int j = c->n_loss;
        const float *logits = engine_cuda_slot_output(c, s);
        /* the gradient overwrites the logits (the kernels read each row's before writing) */
        if (c->loss_in_place && training) b->grad_in = (float *)logits;
        /* a row of scores per label: a language model's n·T positions */
        int rows = n * data_model_labels(c->plan.net);
        if (c->xs_mine ? sharded_loss(e, b, logits, rows, training, j)
                       : kernel_softmax_xent_rows_cuda(training ? b->grad_in : NULL,
                                                       c->d_correct + j, c->d_loss + j, logits,
                                                       b->labels, rows, c->plan.net->classes,
                                                       engine_loss_scale(&e->cfg, training),
                                                       c->xent_loss, c->xent_right, &c->ctx))
            return engine_cuda_layer_fail("loss", c->plan.last - 1, m);
        c->n_loss++;
    }
    /* recompute: the output is kept to send (the last stage keeps the loss gradient) and
     * the activations are dropped until recompute(m) */
    int drop = engine_drops_activations(&e->cfg, training);
    if (drop && b->act_out && n > 0)
        CUDA_CHECK(cudaMemcpyAsync(b->act_out, engine_cuda_slot_output(c, s),
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

/* Local layers [lo, hi) of m's backward (the shared runs between collectives) from GRAD_IN
 * at the top range, else from where the range above left the running gradient. Parameter
 * gradients go to `grads` (the target of stage_plan_grad_target; unused by B). parts:
 * LAYER_BW_BOTH, or LAYER_BW_INPUT alone (B, which keeps each parameter layer's output
 * gradient in the slot for W). Batched layers stash their rows and leave their weight half
 * to the step's flush. */
static int backward_layers(engine *e, cuda_slot *s, int m, int lo, int hi, float *din,
                           float *grads, int parts)
{
    cuda_engine *c = engine_cuda_impl(e);
    cuda_pass q = {.e = e, .s = s, .m = m, .n = s->n, .grads = grads, .parts = parts};
    stage_tensor_run r = cuda_tensor_run(e, &q);
    return stage_tensor_backward(&r, lo, hi, c->mb[m].grad_in, din);
}

/* W of local layers [lo, hi): each parameter layer's weight half from its input and the
 * output gradient B kept. */
static int weight_layers(engine *e, cuda_slot *s, int m, int lo, int hi, float *grads)
{
    cuda_engine *c = engine_cuda_impl(e);
    cuda_pass q = {.e = e, .s = s, .m = m, .n = s->n, .grads = grads};
    layer_run r = cuda_layer_run(&q);
    if (!c->zero3) {
        if (layer_run_weight(&r, lo, hi)) return layer_run_fail(c, &r, m);
        return 0;
    }
    for (int l = hi - 1; l >= lo; l--) { /* ZeRO-3: layer by layer */
        if (engine_cuda_layer_begin(e, l, 1)) return -1;
        if (layer_run_weight(&r, l, l + 1)) return layer_run_fail(c, &r, m);
        if (engine_cuda_layer_end(e, l, 1)) return -1;
    }
    return 0;
}

/* m's own gradient piece (data parallel, method "ordered"), NULL without pieces. */
static float *piece_of(engine *e, int m)
{
    int k = engine_piece_of(&e->cfg, m);
    return k < 0 ? NULL : engine_cuda_impl(e)->piece[k];
}

/* m's parameter gradients of layers [lo, hi) into the shared rule's target: zeroed first
 * when formed apart, added to the stage's after when formed in mb_grads (only the runs of
 * stage_plan_grad_runs). parts: LAYER_BW_BOTH runs the backward of those layers
 * (backward_range), LAYER_BW_WEIGHT W alone. */
static int grads_span(engine *e, cuda_slot *s, int m, int lo, int hi, int parts)
{
    cuda_engine *c = engine_cuda_impl(e);
    size_t(*runs)[2] = c->runs;
    stage_grad_target t = stage_plan_grad_target(&c->plan, c->grads, c->mb_grads, piece_of(e, m));
    int nr = stage_plan_grad_runs(&c->plan, lo, hi, runs, c->plan.nl), rc = 0;
    /* ZeRO-2: what the last step gave back is mapped again (reading as zero) first */
    if (engine_cuda_grads_live(c, t.form, lo, hi) || engine_cuda_grads_live(c, t.add_to, lo, hi))
        return -1;
    for (int r = 0; t.apart && r < nr && !rc; r++) {
        cudaError_t err = cudaMemsetAsync(t.form + runs[r][0], 0,
                                          (runs[r][1] - runs[r][0]) * sizeof(float),
                                          c->ctx.stream);
        if (err != cudaSuccess)
            rc = pt_error_set("CUDA engine: cudaMemsetAsync: %s", cudaGetErrorString(err));
    }
    if (!rc)
        rc = parts == LAYER_BW_WEIGHT
                 ? weight_layers(e, s, m, lo, hi, t.form)
                 : backward_layers(e, s, m, lo, hi, c->is_first ? NULL : c->mb[m].grad_out,
                                   t.form, parts);
    for (int r = 0; t.add_to && r < nr && !rc; r++)
        rc = kernel_add_cuda(t.add_to + runs[r][0], t.form + runs[r][0],
                             runs[r][1] - runs[r][0], &c->ctx);
    return rc;
}

static int units_cuda(void *ctx, float *dw, float *db, const float *dout, const float *in,
                      int rows, int in_f, int out_f, int u0, int units)
{
    return kernel_dense_weight_grad_units_cuda(dw, db, dout, in, rows, in_f, out_f, u0, units,
                                               ctx);
}

/* Batched weight gradients: at the backward (or W) of the step's last micro-batch, the
 * batched layers of [lo, hi) get theirs, written, in the shared tiles (one stream: t = 0 of
 * one). */
static int wgrad_flush(engine *e, int m, int lo, int hi)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!c->plan.wgrad_rows || !engine_last_microbatch(e, m)) return 0;
    int failed;
    if (stage_plan_wgrad_flush(&c->plan, c->grads, c->stash_x, c->stash_g, lo, hi, 0, 1,
                               units_cuda, &c->ctx, &failed))
        return engine_cuda_layer_fail("batched weight gradient", c->plan.first + failed, m);
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
    if (!s || stage_plan_range_check(&c->plan, m, lo, hi, NULL)) return -1;
    cuda_mb *b = &c->mb[m];
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick)) return -1;
    if (backward_waits(c, b)) return -1;
    if (engine_cuda_tick_begin(e, tick)) return -1;
    if (grads_span(e, s, m, lo, hi, LAYER_BW_BOTH) || wgrad_flush(e, m, lo, hi) ||
        engine_cuda_grads_written(c, lo, hi))
        return -1;
    CUDA_CHECK(cudaEventRecord(b->ev_bwd, c->ctx.stream));
    if (engine_cuda_tick_end(e, tick)) return -1;
    stage_plan_range_done(&c->plan, m, lo, NULL);
    stage_plan_grads_formed(&c->plan, lo, piece_of(e, m));
    if (lo == 0) {
        b->has_grad_out = !c->is_first;
        b->grad_out_prepared = 0;
    }
    return 0;
}

int engine_cuda_backward(engine *e, int m, int tick)
{
    return engine_cuda_backward_range(e, m, 0, engine_cuda_impl(e)->plan.nl, tick);
}

int engine_cuda_backward_input(engine *e, int m, int tick)
{
    cuda_engine *c = engine_cuda_impl(e);
    if (!e->cfg.split_backward)
        return pt_error_set("CUDA engine: backward_input of micro-batch %d without "
                            "split_backward", m);
    cuda_slot *s = backward_slot(e, m, "backward_input");
    if (!s || stage_plan_range_idle(&c->plan, "backward_input")) return -1;
    cuda_mb *b = &c->mb[m];
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick)) return -1;
    if (backward_waits(c, b)) return -1;
    if (engine_cuda_tick_begin(e, tick)) return -1;
    if (backward_layers(e, s, m, 0, c->plan.nl, c->is_first ? NULL : b->grad_out, NULL,
                        LAYER_BW_INPUT))
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
    const stage_plan *p = &c->plan;
    if (!e->cfg.split_backward)
        return pt_error_set("CUDA engine: backward_weight of micro-batch %d without "
                            "split_backward", m);
    cuda_slot *s = backward_slot(e, m, "backward_weight");
    if (!s) return -1;
    if (!s->has_gout)
        return pt_error_set("CUDA engine: backward_weight of micro-batch %d before its "
                            "backward_input", m);
    if (lo < 0 || hi > p->nl || lo >= hi)
        return pt_error_set("CUDA engine, layers %d..%d: weight gradients of local layers "
                            "[%d, %d), outside the stage's %d", p->first, p->last - 1, lo, hi,
                            p->nl);
    CUDA_CHECK(cudaSetDevice(c->device));
    if (engine_cuda_tick_check(e, tick) || engine_cuda_tick_begin(e, tick)) return -1;
    if (grads_span(e, s, m, lo, hi, LAYER_BW_WEIGHT) || wgrad_flush(e, m, lo, hi) ||
        engine_cuda_grads_written(c, lo, hi))
        return -1;
    CUDA_CHECK(cudaEventRecord(c->mb[m].ev_late, c->ctx.stream));
    if (engine_cuda_tick_end(e, tick)) return -1;
    stage_plan_grads_formed(&c->plan, lo, piece_of(e, m));
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
