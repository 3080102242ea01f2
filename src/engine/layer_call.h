/* What the layer table's entries share (src/engine/layer_ops.c, layer_block.c): one layer of
 * one chunk as an entry sees it, and the entry's three halves. Private to src/engine. */
#ifndef PT_LAYER_CALL_H
#define PT_LAYER_CALL_H

#include "src/base/error.h"
#include "src/engine/layer_ops.h"

/* One layer of one chunk as the table's entries see it. */
typedef struct {
    const layer_kernels *k;
    void *kc;
    const layer_desc *L;
    int l, n; /* the net's layer index; samples */
    const layer_io *io;
    float *work;
    size_t in_count, out_count;
    int ph0, ph1; /* the phases [ph0, ph1) of this call (layer_phases) */
} layer_call;

typedef struct {
    int (*forward)(const layer_call *c, uint64_t seed, uint64_t step);
    /* dx: the input gradient (NULL: not wanted); weight_now: the weight half as well */
    int (*backward)(const layer_call *c, const float *g, float *dx, int weight_now);
    /* the weight half alone, from the output gradient g (NULL: no parameters) */
    int (*weight)(const layer_call *c, const float *g);
} layer_ops;

static inline int seq_rows(const layer_call *c) { return c->n * c->L->in.c; }

/* A device without these kernels refuses transformer models before running one. */
static inline int need_transformer(const layer_call *c)
{
    if (c->k->layernorm_forward) return 0;
    return pt_error_set("layer %d [%s]: this device has no transformer kernels", c->l,
                        layer_type_name(c->L->type));
}

/* The transformer block's entry (src/engine/layer_block.c). */
int layer_block_forward(const layer_call *c, uint64_t seed, uint64_t step);
int layer_block_backward(const layer_call *c, const float *g, float *dx, int weight_now);
int layer_block_weight(const layer_call *c, const float *g);
/* layer_fold_floats of a whole block. */
size_t layer_block_fold_floats(const layer_desc *L);

#endif
