/* The description half of the layer table: for each layer type its name, how a model
 * file's values make its shapes and parameter counts, its summary text, and what storage a
 * forward keeps. The compute half (which kernels each pass calls, on each device, and the
 * one layer loop) is src/layer_ops.h. A new layer type is one entry here, one there, and
 * its kernels. */
#ifndef PT_LAYER_TABLE_H
#define PT_LAYER_TABLE_H

#include <stddef.h>

#include "src/model/net.h"

/* A layer section's values as the model file gave them (the parser checked their ranges);
 * `given` has bit LAYER_SPEC_x for each key present. */
enum {
    LAYER_SPEC_SIZE = 1,
    LAYER_SPEC_STRIDE = 2,
    LAYER_SPEC_PAD = 4,
    LAYER_SPEC_ACTIVATION = 8,
    LAYER_SPEC_VOCAB = 16,
    LAYER_SPEC_HIDDEN = 32,
    LAYER_SPEC_DROPOUT = 64,
    LAYER_SPEC_TIED = 128,
};
typedef struct {
    unsigned given;
    int filters, size, stride, pad, units;
    kernel_act activation;
    float p;
    /* transformer sections; dropout is [block]'s p */
    int vocab, context, width, heads, hidden, tied;
    float dropout;
    const layer_desc *embedding; /* the model's [embedding] (layer 0), NULL if none */
} layer_spec;

/* Largest values the transformer sections take: a token id is exact as a float below 2^24,
 * and each count stays far inside size_t and every int index the stages use. */
#define LAYER_MAX_VOCAB (1 << 24)
#define LAYER_MAX_CONTEXT (1 << 16)
#define LAYER_MAX_WIDTH (1 << 16)
#define LAYER_MAX_HIDDEN (1 << 20)

/* Why a layer's shapes failed: the reason, and whether the 'size' key is to blame (else
 * the section header). */
typedef struct {
    char reason[256];
    int blame_size;
} layer_shape_error;

typedef struct {
    const char *name;   /* the model file's section and layer_type_name */
    /* Sets L's parameters, output shape and parameter counts from L->in and spec (L->in
     * may be replaced: dense flattens). −1 with *err filled when they cannot be made. */
    int (*shape)(layer_desc *L, const layer_spec *spec, layer_shape_error *err);
    /* The summary's "Layer (type)" text. */
    void (*describe)(char *buf, size_t size, const layer_desc *L);
    int flat;           /* summary: its output is shown as a vector (1), as planes (0), as
                           a sequence (T, C) (2), or as its input was (−1) */
    int sequence;       /* 1: it takes a sequence {T, 1, C} (follows an [embedding]); 0: an
                           image or vector; −1: either (dropout) */
    int untrained;      /* no compute half yet (src/engine/layer_ops.c): train, plan and
                           partition by time refuse it (net_desc_check_trainable) */
    int own_output;     /* a forward writes its output into storage of its own (flatten
                           passes its input through) */
    int argmax, mask;   /* a forward keeps maxpool positions / a dropout mask per output */
    /* the forward passes its input through unchanged (NULL: never) */
    int (*identity)(const layer_desc *L, int training);
} layer_kind;

extern const layer_kind layer_kinds[LAYER_TYPE_COUNT];

static inline const layer_kind *layer_kind_of(layer_type t) { return &layer_kinds[t]; }

/* Whether L's forward is the identity (flatten; dropout when not training or p = 0). */
static inline int layer_is_identity(const layer_desc *L, int training)
{
    const layer_kind *k = layer_kind_of(L->type);
    return k->identity && k->identity(L, training);
}

/* The leading parameters of L that weight decay applies to under --optimizer adamw (the
 * matrices, nanoGPT's rule): dense and conv: their weights; a block: its four matrices
 * (weight_count); an untied lm_head: its matrix; everything else (biases, layer norms,
 * embeddings, a tied head, which follows the embedding's token matrix) 0. The rest of the
 * layer's parameters (its bias, vectors) are updated without decay. */
size_t layer_decayed_count(const layer_desc *L);

/* A convolution's dimensions at batch n. */
static inline kernel_conv2d_dims layer_conv_dims(const layer_desc *L, int n)
{
    kernel_conv2d_dims d = {n, L->in.c, L->in.h, L->in.w, L->u.conv.filters, L->u.conv.size,
                            L->u.conv.stride, L->u.conv.pad};
    return d;
}

#endif
