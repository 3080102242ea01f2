/* A network as described by a model file: layers in order, their shapes and parameter
 * counts. Pure description: no tensors live here (see src/cpu/stage.h). */
#ifndef PT_NET_H
#define PT_NET_H

#include <stddef.h>
#include <stdio.h>

#include "kernels/kernels.h"

typedef enum {
    LAYER_CONV = 0,
    LAYER_MAXPOOL,
    LAYER_AVGPOOL,
    LAYER_DENSE,
    LAYER_DROPOUT,
    LAYER_FLATTEN,
    LAYER_EMBEDDING, /* transformer layers (issue 24): described, not yet trained */
    LAYER_BLOCK,
    LAYER_LAYERNORM,
    LAYER_LM_HEAD,
    LAYER_TYPE_COUNT /* what each type is and does: src/model/layer_table.h, src/engine/layer_ops.h */
} layer_type;

/* A flat vector of n values is {n, 1, 1}. A sequence of T positions of width C (the
 * transformer layers) is {T, 1, C}: row-major, positions major, as the transformer kernels'
 * [tokens, width] rows; a language model's input, T token ids, is {T, 1, 1}. */
typedef struct {
    int c, h, w;
} layer_shape;

typedef struct {
    layer_type type;
    int line;              /* line of the section header in the model file */
    layer_shape in, out;
    kernel_act activation; /* conv and dense; KERNEL_ACT_LINEAR otherwise */
    union {
        struct { int filters, size, stride, pad; } conv;
        struct { int size, stride; } pool;
        struct { int units; } dense;
        struct { float p; } dropout;
        /* vocab: the whole layer's tokens, or those [first, first + vocab) one tensor rank
         * holds of an embedding cut `shards` ways by vocabulary (src/model/shard.h);
         * shards 0 or 1: whole */
        struct { int vocab, context, width, first, shards; } embedding;
        /* heads and hidden: the whole layer's, or those one tensor rank runs of a block
         * cut `shards` ways by heads (src/model/shard.h); shards 0 or 1: whole. seq > 1:
         * sequence parallelism, its input and output hold 1/seq of the positions (in.c =
         * T / seq) and it runs in phases around the group's gathers and reduce-scatters */
        struct { int heads, hidden; float p; int shards, seq; } block;
        struct { int vocab, tied; } lm_head;
    } u;
    size_t weight_count, bias_count; /* 0 for parameterless layers */
} layer_desc;

typedef struct {
    layer_shape input;
    int n_layers;
    layer_desc *layers; /* owned; layer i is the i-th section after [net] */
    size_t param_count; /* distinct parameters (a tied head's copy counted once) */
    size_t stored_count; /* what the stages hold in all: Σ weight_count + bias_count, the
                            length of the whole parameter vector gathers and checkpoints use */
    int classes;        /* elements of the last layer's output; a language model's vocabulary
                           (its loss is per position: T predictions of V classes a sample) */
    int sequence;       /* a language model: layer 0 is an [embedding], the input T token ids */
    int blocks;         /* [block] layers (GPT-2's initialisation scales by their count) */
    int tied_head;      /* the lm_head tied to layer 0's token matrix, −1 if none: it keeps a
                           copy (counted once in param_count), kept equal (src/train) */
} net_desc;

/* Parses a model file. On error returns -1 with a message "FILE:LINE: reason". */
int net_desc_load(net_desc *net, const char *path);
/* Same for text in memory; `name` stands for the file name in messages. */
int net_desc_parse_string(net_desc *net, const char *text, const char *name);
void net_desc_free(net_desc *net);

static inline size_t layer_shape_count(layer_shape s) { return (size_t)s.c * s.h * s.w; }
const char *layer_type_name(layer_type t);
const char *layer_act_name(kernel_act a);

/* 0 when this version trains every layer of the net; else −1 with
 * "MODEL: layer N [type] ...: what is not trained yet". */
int net_desc_check_trainable(const net_desc *net, const char *model);

/* Keras-style table: layer, type, output shape, parameters, and the total. */
void net_desc_print_summary(const net_desc *net, FILE *out);

#endif
