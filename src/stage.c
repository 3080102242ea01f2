#include "src/stage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rng.h"
#include "src/error.h"

enum { ALIGN = 64 };

static size_t round_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static void *alloc_zeroed(size_t bytes)
{
    void *p = aligned_alloc(ALIGN, round_up(bytes ? bytes : 1));
    if (p) memset(p, 0, round_up(bytes ? bytes : 1));
    return p;
}

static kernel_conv2d_dims conv_dims(const layer_desc *L, int n)
{
    kernel_conv2d_dims d = {n, L->in.c, L->in.h, L->in.w, L->u.conv.filters, L->u.conv.size,
                            L->u.conv.stride, L->u.conv.pad};
    return d;
}

/* Bytes of one slot's storage for layer L at batch n: output, argmax, mask. */
static size_t layer_slot_bytes(const layer_desc *L, int n, size_t *out_b, size_t *arg_b,
                               size_t *mask_b)
{
    size_t count = (size_t)n * layer_shape_count(L->out);
    *out_b = L->type == LAYER_FLATTEN ? 0 : round_up(count * sizeof(float));
    *arg_b = L->type == LAYER_MAXPOOL ? round_up(count * sizeof(int32_t)) : 0;
    *mask_b = L->type == LAYER_DROPOUT ? round_up(count) : 0;
    return *out_b + *arg_b + *mask_b;
}

int stage_init(stage *s, const net_desc *net, int first, int last, int max_batch, int n_slots)
{
    memset(s, 0, sizeof *s);
    if (first < 0 || last > net->n_layers || first >= last)
        return pt_error_set("stage: bad layer range [%d, %d) of %d layers", first, last,
                            net->n_layers);
    if (max_batch < 1 || n_slots < 1)
        return pt_error_set("stage: batch %d and slots %d must be positive", max_batch, n_slots);
    s->net = net;
    s->first = first;
    s->last = last;
    s->max_batch = max_batch;
    s->n_slots = n_slots;
    int nl = last - first;

    for (int l = first; l < last; l++)
        s->param_count += net->layers[l].weight_count + net->layers[l].bias_count;
    size_t P = s->param_count;
    /* params | grads | m | v; each block rounded so every block stays aligned */
    size_t block = round_up(P * sizeof(float)) / sizeof(float);
    s->memory = alloc_zeroed(4 * block * sizeof(float));
    s->w = calloc((size_t)nl, sizeof *s->w);
    s->b = calloc((size_t)nl, sizeof *s->b);
    s->dw = calloc((size_t)nl, sizeof *s->dw);
    s->db = calloc((size_t)nl, sizeof *s->db);
    s->slots = calloc((size_t)n_slots, sizeof *s->slots);
    if (!s->memory || !s->w || !s->b || !s->dw || !s->db || !s->slots) goto oom;
    s->params = s->memory;
    s->grads = s->memory + block;
    s->opt_m = s->memory + 2 * block;
    s->opt_v = s->memory + 3 * block;
    size_t off = 0;
    size_t work = 0, widest = 0, slot_bytes = 0;
    for (int l = first; l < last; l++) {
        const layer_desc *L = &net->layers[l];
        int i = l - first;
        if (L->weight_count) {
            s->w[i] = s->params + off;
            s->dw[i] = s->grads + off;
            off += L->weight_count;
            s->b[i] = s->params + off;
            s->db[i] = s->grads + off;
            off += L->bias_count;
        }
        if (L->type == LAYER_CONV) {
            kernel_conv2d_dims d = conv_dims(L, max_batch);
            size_t ws = kernel_conv2d_workspace_floats(&d);
            if (ws > work) work = ws;
        }
        size_t in = layer_shape_count(L->in), out = layer_shape_count(L->out);
        if (in > widest) widest = in;
        if (out > widest) widest = out;
        size_t a, b, c;
        slot_bytes += layer_slot_bytes(L, max_batch, &a, &b, &c);
    }
    s->slot_bytes = slot_bytes;
    s->work = alloc_zeroed(work * sizeof(float));
    for (int k = 0; k < 2; k++) s->scratch[k] = alloc_zeroed(widest * max_batch * sizeof(float));
    s->slot_memory = alloc_zeroed(slot_bytes * n_slots);
    if (!s->work || !s->scratch[0] || !s->scratch[1] || !s->slot_memory) goto oom;

    char *mem = s->slot_memory;
    for (int k = 0; k < n_slots; k++) {
        stage_slot *sl = &s->slots[k];
        sl->buf = calloc((size_t)nl, sizeof *sl->buf);
        sl->out = calloc((size_t)nl, sizeof *sl->out);
        sl->argmax = calloc((size_t)nl, sizeof *sl->argmax);
        sl->mask = calloc((size_t)nl, sizeof *sl->mask);
        if (!sl->buf || !sl->out || !sl->argmax || !sl->mask) goto oom;
        for (int l = first; l < last; l++) {
            size_t ob, ab, mb;
            layer_slot_bytes(&net->layers[l], max_batch, &ob, &ab, &mb);
            int i = l - first;
            if (ob) sl->buf[i] = (float *)mem;
            mem += ob;
            if (ab) sl->argmax[i] = (int32_t *)mem;
            mem += ab;
            if (mb) sl->mask[i] = (uint8_t *)mem;
            mem += mb;
        }
    }
    return 0;
oom:
    stage_free(s);
    return pt_error_set("stage: out of memory for layers %d..%d (batch %d, %d slots)", first,
                        last - 1, max_batch, n_slots);
}

void stage_free(stage *s)
{
    if (s->slots) {
        for (int k = 0; k < s->n_slots; k++) {
            free(s->slots[k].buf);
            free(s->slots[k].out);
            free(s->slots[k].argmax);
            free(s->slots[k].mask);
        }
    }
    free(s->slots);
    free(s->slot_memory);
    free(s->memory);
    free(s->w);
    free(s->b);
    free(s->dw);
    free(s->db);
    free(s->work);
    free(s->scratch[0]);
    free(s->scratch[1]);
    memset(s, 0, sizeof *s);
}

void stage_init_params(stage *s, uint64_t seed)
{
    for (int l = s->first; l < s->last; l++) {
        const layer_desc *L = &s->net->layers[l];
        int i = l - s->first;
        if (!L->weight_count) continue;
        size_t fan_in = L->weight_count / (L->type == LAYER_CONV ? (size_t)L->u.conv.filters
                                                                  : (size_t)L->u.dense.units);
        /* kaiming_uniform(a=√5) and the bias rule of torch.nn both give 1/√fan_in */
        float bound = (float)(1.0 / sqrt((double)fan_in));
        kernel_init_uniform_cpu(s->w[i], L->weight_count, bound, seed, rng_stream_init(l, 0));
        kernel_init_uniform_cpu(s->b[i], L->bias_count, bound, seed, rng_stream_init(l, 1));
    }
    s->step = 0;
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

const float *stage_forward(stage *s, int slot, const float *in, int n,
                           const int64_t *sample_ids, uint64_t seed, uint64_t step, int training)
{
    stage_slot *sl = &s->slots[slot];
    sl->n = n;
    sl->input = in;
    const float *x = in;
    for (int l = s->first; l < s->last; l++) {
        const layer_desc *L = &s->net->layers[l];
        int i = l - s->first;
        float *y = sl->buf[i];
        size_t out_count = (size_t)n * layer_shape_count(L->out);
        switch (L->type) {
        case LAYER_CONV: {
            kernel_conv2d_dims d = conv_dims(L, n);
            kernel_conv2d_forward_cpu(y, s->work, x, s->w[i], s->b[i], &d);
            kernel_activation_forward_cpu(y, y, out_count, L->activation);
            break;
        }
        case LAYER_DENSE:
            kernel_dense_forward_cpu(y, x, s->w[i], s->b[i], n, (int)layer_shape_count(L->in),
                                     L->u.dense.units);
            kernel_activation_forward_cpu(y, y, out_count, L->activation);
            break;
        case LAYER_MAXPOOL:
            kernel_maxpool2d_forward_cpu(y, sl->argmax[i], x, n, L->in.c, L->in.h, L->in.w,
                                         L->u.pool.size, L->u.pool.stride);
            break;
        case LAYER_AVGPOOL:
            kernel_avgpool2d_forward_cpu(y, x, n, L->in.c, L->in.h, L->in.w, L->u.pool.size,
                                         L->u.pool.stride);
            break;
        case LAYER_DROPOUT:
            if (training && L->u.dropout.p > 0) {
                kernel_dropout_forward_cpu(y, sl->mask[i], x, n, layer_shape_count(L->in),
                                           L->u.dropout.p, seed, rng_stream_dropout(l, step),
                                           sample_ids);
            } else {
                y = NULL; /* identity */
            }
            break;
        case LAYER_FLATTEN:
            y = NULL;
            break;
        }
        sl->out[i] = y ? y : x;
        x = sl->out[i];
    }
    return x;
}

void stage_backward(stage *s, int slot, const float *dout, float *din)
{
    stage_slot *sl = &s->slots[slot];
    int n = sl->n;
    const float *g = dout;
    int gi = -1; /* which scratch buffer g lives in, −1 for the caller's */
    for (int l = s->last - 1; l >= s->first; l--) {
        const layer_desc *L = &s->net->layers[l];
        int i = l - s->first;
        const float *x = i == 0 ? sl->input : sl->out[i - 1];
        size_t in_count = (size_t)n * layer_shape_count(L->in);
        size_t out_count = (size_t)n * layer_shape_count(L->out);
        if (L->activation != KERNEL_ACT_LINEAR) {
            float *ga = gi < 0 ? s->scratch[0] : s->scratch[gi];
            kernel_activation_backward_cpu(ga, g, sl->out[i], out_count, L->activation);
            g = ga;
            gi = gi < 0 ? 0 : gi;
        }
        int ti = gi < 0 ? 0 : 1 - gi;
        float *dx = i == 0 ? din : s->scratch[ti];
        switch (L->type) {
        case LAYER_CONV: {
            kernel_conv2d_dims d = conv_dims(L, n);
            kernel_conv2d_backward_cpu(dx, s->dw[i], s->db[i], s->work, g, x, s->w[i], &d);
            break;
        }
        case LAYER_DENSE:
            kernel_dense_backward_cpu(dx, s->dw[i], s->db[i], g, x, s->w[i], n,
                                      (int)layer_shape_count(L->in), L->u.dense.units);
            break;
        case LAYER_MAXPOOL:
            if (dx)
                kernel_maxpool2d_backward_cpu(dx, g, sl->argmax[i], n, L->in.c, L->in.h, L->in.w,
                                              L->u.pool.size, L->u.pool.stride);
            break;
        case LAYER_AVGPOOL:
            if (dx)
                kernel_avgpool2d_backward_cpu(dx, g, n, L->in.c, L->in.h, L->in.w,
                                              L->u.pool.size, L->u.pool.stride);
            break;
        case LAYER_DROPOUT:
            if (sl->out[i] == x) { /* identity in the forward */
                if (dx) memcpy(dx, g, in_count * sizeof(float));
            } else if (dx) {
                kernel_dropout_backward_cpu(dx, g, sl->mask[i], in_count, L->u.dropout.p);
            }
            break;
        case LAYER_FLATTEN:
            if (dx) memcpy(dx, g, in_count * sizeof(float));
            break;
        }
        if (i > 0) {
            g = dx;
            gi = ti;
        }
    }
}

void stage_zero_grad(stage *s) { memset(s->grads, 0, s->param_count * sizeof(float)); }

void stage_step(stage *s, const optimizer_config *o)
{
    s->step++;
    size_t P = s->param_count;
    switch (o->kind) {
    case OPT_SGD:
        kernel_sgd_update_cpu(s->params, s->grads, P, o->lr, o->weight_decay);
        break;
    case OPT_MOMENTUM:
        kernel_momentum_update_cpu(s->params, s->opt_m, s->grads, P, o->lr, o->momentum,
                                   o->weight_decay);
        break;
    case OPT_ADAM:
        kernel_adam_update_cpu(s->params, s->opt_m, s->opt_v, s->grads, P, o->lr, o->beta1,
                               o->beta2, o->eps, o->weight_decay, s->step);
        break;
    }
}
