#include "src/engine/layer_ops.h"

#include <string.h>

#include "kernels/rng.h"
#include "src/base/error.h"

/* ---- the CPU's kernel set: kernels/kernels.h, which cannot fail ---- */

static int cpu_dense_forward(void *ctx, float *out, const float *in, const float *w,
                             const float *b, int n, int in_f, int out_f)
{
    kernel_dense_forward_cpu(out, in, w, b, n, in_f, out_f);
    return 0;
}
static int cpu_dense_backward(void *ctx, float *din, float *dw, float *db, const float *dout,
                              const float *in, const float *w, int n, int in_f, int out_f)
{
    kernel_dense_backward_cpu(din, dw, db, dout, in, w, n, in_f, out_f);
    return 0;
}
static int cpu_dense_backward_weight(void *ctx, float *dw, float *db, const float *dout,
                                     const float *in, int n, int in_f, int out_f)
{
    kernel_dense_backward_weight_cpu(dw, db, dout, in, n, in_f, out_f);
    return 0;
}
static int cpu_dense_backward_input(void *ctx, float *din, const float *dout, const float *w,
                                    int n, int in_f, int out_f)
{
    kernel_dense_backward_input_cpu(din, dout, w, n, in_f, out_f);
    return 0;
}
static int cpu_conv_forward(void *ctx, float *out, float *work, const float *in, const float *w,
                            const float *b, const kernel_conv2d_dims *d)
{
    kernel_conv2d_forward_cpu(out, work, in, w, b, d);
    return 0;
}
static int cpu_conv_backward(void *ctx, float *din, float *dw, float *db, float *work,
                             const float *dout, const float *in, const float *w,
                             const kernel_conv2d_dims *d)
{
    kernel_conv2d_backward_cpu(din, dw, db, work, dout, in, w, d);
    return 0;
}
static int cpu_conv_backward_weight(void *ctx, float *dw, float *db, float *work,
                                    const float *dout, const float *in,
                                    const kernel_conv2d_dims *d)
{
    kernel_conv2d_backward_weight_cpu(dw, db, work, dout, in, d);
    return 0;
}
static int cpu_conv_backward_input(void *ctx, float *din, float *work, const float *dout,
                                   const float *w, const kernel_conv2d_dims *d)
{
    kernel_conv2d_backward_input_cpu(din, work, dout, w, d);
    return 0;
}
static int cpu_maxpool_forward(void *ctx, float *out, int32_t *argmax, const float *in, int n,
                               int c, int h, int w, int size, int stride)
{
    kernel_maxpool2d_forward_cpu(out, argmax, in, n, c, h, w, size, stride);
    return 0;
}
static int cpu_maxpool_backward(void *ctx, float *din, const float *dout, const int32_t *argmax,
                                int n, int c, int h, int w, int size, int stride)
{
    kernel_maxpool2d_backward_cpu(din, dout, argmax, n, c, h, w, size, stride);
    return 0;
}
static int cpu_avgpool_forward(void *ctx, float *out, const float *in, int n, int c, int h,
                               int w, int size, int stride)
{
    kernel_avgpool2d_forward_cpu(out, in, n, c, h, w, size, stride);
    return 0;
}
static int cpu_avgpool_backward(void *ctx, float *din, const float *dout, int n, int c, int h,
                                int w, int size, int stride)
{
    kernel_avgpool2d_backward_cpu(din, dout, n, c, h, w, size, stride);
    return 0;
}
static int cpu_activation_forward(void *ctx, float *out, const float *in, size_t count,
                                  kernel_act act)
{
    kernel_activation_forward_cpu(out, in, count, act);
    return 0;
}
static int cpu_activation_backward(void *ctx, float *din, const float *dout, const float *out,
                                   size_t count, kernel_act act)
{
    kernel_activation_backward_cpu(din, dout, out, count, act);
    return 0;
}
static int cpu_dropout_forward(void *ctx, float *out, uint8_t *mask, const float *in, int n,
                               size_t per_sample, size_t elem_off, float p, uint64_t seed,
                               uint64_t stream, const int64_t *sample_ids)
{
    kernel_dropout_forward_range_cpu(out, mask, in, n, per_sample, elem_off, p, seed, stream,
                                     sample_ids);
    return 0;
}
static int cpu_dropout_backward(void *ctx, float *din, const float *dout, const uint8_t *mask,
                                size_t count, float p)
{
    kernel_dropout_backward_cpu(din, dout, mask, count, p);
    return 0;
}
static int cpu_copy(void *ctx, float *dst, const float *src, size_t count)
{
    memcpy(dst, src, count * sizeof(float));
    return 0;
}

const layer_kernels layer_kernels_cpu = {
    .dense_forward = cpu_dense_forward,
    .dense_backward = cpu_dense_backward,
    .dense_backward_weight = cpu_dense_backward_weight,
    .dense_backward_input = cpu_dense_backward_input,
    .conv_forward = cpu_conv_forward,
    .conv_backward = cpu_conv_backward,
    .conv_backward_weight = cpu_conv_backward_weight,
    .conv_backward_input = cpu_conv_backward_input,
    .maxpool_forward = cpu_maxpool_forward,
    .maxpool_backward = cpu_maxpool_backward,
    .avgpool_forward = cpu_avgpool_forward,
    .avgpool_backward = cpu_avgpool_backward,
    .activation_forward = cpu_activation_forward,
    .activation_backward = cpu_activation_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .copy = cpu_copy,
};

/* ---- the table: per layer type, its forward, backward and weight half ---- */

/* One layer of one chunk as the table's entries see it. */
typedef struct {
    const layer_kernels *k;
    void *kc;
    const layer_desc *L;
    int l, n; /* the net's layer index; samples */
    const layer_io *io;
    float *work;
    size_t in_count, out_count;
} layer_call;

typedef struct {
    int (*forward)(const layer_call *c, uint64_t seed, uint64_t step);
    /* dx: the input gradient (NULL: not wanted); weight_now: the weight half as well */
    int (*backward)(const layer_call *c, const float *g, float *dx, int weight_now);
    /* the weight half alone, from the output gradient g (NULL: no parameters) */
    int (*weight)(const layer_call *c, const float *g);
} layer_ops;

/* After a parameter layer's product (rc its result): its activation in place, unless the
 * layer is split by its inputs (a partial sum: the engine activates after the all-reduce). */
static int activate(const layer_call *c, int rc)
{
    if (rc || c->io->partial) return rc;
    return c->k->activation_forward(c->kc, c->io->y, c->io->y, (size_t)c->n * c->out_count,
                                    c->L->activation);
}

static int conv_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_io *io = c->io;
    kernel_conv2d_dims d = layer_conv_dims(c->L, c->n);
    return activate(c, c->k->conv_forward(c->kc, io->y, c->work, io->x, io->w,
                                          io->partial ? NULL : io->b, &d));
}
static int conv_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_io *io = c->io;
    kernel_conv2d_dims d = layer_conv_dims(c->L, c->n);
    if (weight_now)
        return c->k->conv_backward(c->kc, dx, io->dw, io->db, c->work, g, io->x, io->w, &d);
    if (dx) return c->k->conv_backward_input(c->kc, dx, c->work, g, io->w, &d);
    return 0;
}
static int conv_weight(const layer_call *c, const float *g)
{
    kernel_conv2d_dims d = layer_conv_dims(c->L, c->n);
    return c->k->conv_backward_weight(c->kc, c->io->dw, c->io->db, c->work, g, c->io->x, &d);
}

static int dense_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_io *io = c->io;
    return activate(c, c->k->dense_forward(c->kc, io->y, io->x, io->w,
                                           io->partial ? NULL : io->b, c->n, (int)c->in_count,
                                           c->L->u.dense.units));
}
static int dense_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_io *io = c->io;
    if (weight_now)
        return c->k->dense_backward(c->kc, dx, io->dw, io->db, g, io->x, io->w, c->n,
                                    (int)c->in_count, c->L->u.dense.units);
    if (dx)
        return c->k->dense_backward_input(c->kc, dx, g, io->w, c->n, (int)c->in_count,
                                          c->L->u.dense.units);
    return 0;
}
static int dense_weight(const layer_call *c, const float *g)
{
    return c->k->dense_backward_weight(c->kc, c->io->dw, c->io->db, g, c->io->x, c->n,
                                       (int)c->in_count, c->L->u.dense.units);
}

static int maxpool_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_desc *L = c->L;
    return c->k->maxpool_forward(c->kc, c->io->y, c->io->argmax, c->io->x, c->n, L->in.c, L->in.h,
                                 L->in.w, L->u.pool.size, L->u.pool.stride);
}
static int maxpool_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_desc *L = c->L;
    if (!dx) return 0;
    return c->k->maxpool_backward(c->kc, dx, g, c->io->argmax, c->n, L->in.c, L->in.h, L->in.w,
                                  L->u.pool.size, L->u.pool.stride);
}

static int avgpool_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_desc *L = c->L;
    return c->k->avgpool_forward(c->kc, c->io->y, c->io->x, c->n, L->in.c, L->in.h, L->in.w,
                                 L->u.pool.size, L->u.pool.stride);
}
static int avgpool_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_desc *L = c->L;
    if (!dx) return 0;
    return c->k->avgpool_backward(c->kc, dx, g, c->n, L->in.c, L->in.h, L->in.w, L->u.pool.size,
                                  L->u.pool.stride);
}

static int dropout_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_io *io = c->io;
    /* a slice's elements keep their places in the whole vector's mask */
    return c->k->dropout_forward(c->kc, io->y, io->mask, io->x, c->n, c->in_count, io->elem_off,
                                 c->L->u.dropout.p, seed, rng_stream_dropout(c->l, step),
                                 io->ids);
}
/* dropout, and flatten (always the identity) */
static int pass_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    if (!dx) return 0;
    if (c->io->identity) return c->k->copy(c->kc, dx, g, (size_t)c->n * c->in_count);
    return c->k->dropout_backward(c->kc, dx, g, c->io->mask, (size_t)c->n * c->in_count,
                                  c->L->u.dropout.p);
}
static int flatten_forward(const layer_call *c, uint64_t seed, uint64_t step) { return 0; }

/* The transformer layers (issue 24) are described but have no compute half yet: train,
 * plan and partition by time refuse them up front (net_desc_check_trainable); should one
 * reach the loop anyway, it fails with that message instead of calling through NULL. */
static int untrained(const layer_call *c)
{
    return pt_error_set("layer %d [%s] is not trained by this version of pipetrain yet "
                        "(issue 24)", c->l, layer_type_name(c->L->type));
}
static int untrained_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    return untrained(c);
}
static int untrained_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    return untrained(c);
}
static int untrained_weight(const layer_call *c, const float *g) { return untrained(c); }

static const layer_ops layer_ops_table[LAYER_TYPE_COUNT] = {
    [LAYER_CONV] = {conv_forward, conv_backward, conv_weight},
    [LAYER_MAXPOOL] = {maxpool_forward, maxpool_backward, NULL},
    [LAYER_AVGPOOL] = {avgpool_forward, avgpool_backward, NULL},
    [LAYER_DENSE] = {dense_forward, dense_backward, dense_weight},
    [LAYER_DROPOUT] = {dropout_forward, pass_backward, NULL},
    [LAYER_FLATTEN] = {flatten_forward, pass_backward, NULL},
    [LAYER_EMBEDDING] = {untrained_forward, untrained_backward, untrained_weight},
    [LAYER_BLOCK] = {untrained_forward, untrained_backward, untrained_weight},
    [LAYER_LAYERNORM] = {untrained_forward, untrained_backward, untrained_weight},
    [LAYER_LM_HEAD] = {untrained_forward, untrained_backward, untrained_weight},
};

/* ---- the loop ---- */

static layer_call call_of(const layer_run *r, int i, const layer_io *io)
{
    const layer_desc *L = &r->layers[i];
    layer_call c = {.k = r->k, .kc = r->kctx, .L = L, .l = r->first + i, .n = r->n, .io = io,
                    .work = r->work, .in_count = layer_shape_count(L->in),
                    .out_count = layer_shape_count(L->out)};
    return c;
}

static int fail(layer_run *r, const char *what, int i)
{
    r->what = what;
    r->failed = i;
    return -1;
}

int layer_run_forward(layer_run *r, int lo, int hi)
{
    r->what = NULL;
    for (int i = lo; i < hi; i++) {
        layer_io io;
        memset(&io, 0, sizeof io);
        if (r->io(r->self, i, LAYER_PHASE_FORWARD, &io)) return -1;
        if (io.identity) continue;
        layer_call c = call_of(r, i, &io);
        if (layer_ops_table[c.L->type].forward(&c, r->seed, r->step)) return fail(r, "forward", i);
    }
    return 0;
}

int layer_run_backward(layer_run *r, int lo, int hi, const float **gp, int *gip,
                       float *const scratch[2], float *din, int parts)
{
    r->what = NULL;
    const float *g = *gp;
    int gi = *gip;
    int rc = 0;
    for (int i = hi - 1; i >= lo; i--) {
        layer_io io;
        memset(&io, 0, sizeof io);
        if (r->io(r->self, i, LAYER_PHASE_BACKWARD, &io)) {
            rc = -1;
            break;
        }
        if (io.identity && i > 0) continue; /* the gradient passes through unchanged */
        layer_call c = call_of(r, i, &io);
        const layer_desc *L = c.L;
        if (L->activation != KERNEL_ACT_LINEAR) {
            float *ga = gi < 0 ? scratch[0] : scratch[gi];
            if (r->k->activation_backward(r->kctx, ga, g, io.out, (size_t)r->n * c.out_count,
                                          L->activation)) {
                rc = fail(r, "activation backward", i);
                break;
            }
            g = ga;
            gi = gi < 0 ? 0 : gi;
        }
        int ti = gi < 0 ? 0 : 1 - gi;
        float *dx = i == 0 ? din : scratch[ti];
        /* the weight half happens now (both parts, not batched), in W (split), or in the
         * step's flush (batched: the rows go to the stash) */
        int weight_now = (parts & LAYER_BW_WEIGHT) && !io.batched;
        if (L->weight_count && io.batched) {
            if (r->k->copy(r->kctx, io.stash_x, io.x, (size_t)r->n * c.in_count) ||
                r->k->copy(r->kctx, io.stash_g, g, (size_t)r->n * c.out_count)) {
                rc = -1;
                break;
            }
        } else if (L->weight_count && !(parts & LAYER_BW_WEIGHT)) {
            if (r->k->copy(r->kctx, io.gout, g, (size_t)r->n * c.out_count)) {
                rc = -1;
                break;
            }
        }
        if (layer_ops_table[L->type].backward(&c, g, dx, weight_now)) {
            rc = fail(r, "backward", i);
            break;
        }
        g = dx;
        gi = ti;
    }
    if (rc == 0) {
        *gp = g;
        *gip = gi;
    }
    return rc;
}

int layer_run_weight(layer_run *r, int lo, int hi)
{
    r->what = NULL;
    for (int i = hi - 1; i >= lo; i--) {
        const layer_desc *L = &r->layers[i];
        int (*weight)(const layer_call *, const float *) = layer_ops_table[L->type].weight;
        if (!L->weight_count || !weight) continue;
        layer_io io;
        memset(&io, 0, sizeof io);
        if (r->io(r->self, i, LAYER_PHASE_WEIGHT, &io)) return -1;
        if (io.batched) continue;
        layer_call c = call_of(r, i, &io);
        if (weight(&c, io.gout)) return fail(r, "weight gradient", i);
    }
    return 0;
}
