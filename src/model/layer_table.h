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

/* Whether W of L, a stage's last layer (whole, not cut into tensor shards), can read its
 * output gradient where the stage received it (the engine's GRAD_IN, or the loss gradient:
 * both live until the micro-batch's W) instead of a copy B keeps in the slot: the gradient
 * reaches L's weight product unchanged (no activation between) and L is not a block (a
 * block's B leaves W's gradients in rows of its own). */
static inline int layer_w_reads_dout(const layer_desc *L)
{
    return L->weight_count && L->type != LAYER_BLOCK && L->activation == KERNEL_ACT_LINEAR;
}

/* Whether W of a stage whose first layer is L may read the stage's input where it was
 * received (the engine's ACT_IN), so that the buffer lives until the micro-batch's W: every
 * layer but a whole block, whose W reads only rows of its slot (its layer norms' weight
 * gradients are formed in B; a block cut into tensor shards forms ln_1's in W, from x). */
static inline int layer_w_reads_input(const layer_desc *L, int sharded)
{
    return sharded || L->type != LAYER_BLOCK;
}

/* What W of a stage of layers [first, last) reads where its messages were received, as
 * schedule_receive_buffers' w_reads: bit 0 (SCHED_W_READS_ACT) the input, bit 1
 * (SCHED_W_READS_GRAD) the output gradient. */
static inline int layer_stage_w_reads(const net_desc *net, int first, int last, int sharded)
{
    return (layer_w_reads_input(&net->layers[first], sharded) ? 1 : 0) |
           (layer_w_reads_dout(&net->layers[last - 1]) ? 2 : 0);
}

/* Whether the loss gradient of a stage of layers [.., last) overwrites its logits in the
 * micro-batch's slot (both engines, and the planner's price): the stage ends the net, its
 * last layer's training output lives in storage of its own that its backward never reads
 * (only an activation's backward reads the output; the layers read their input and what
 * they saved), and no recomputation gives the slot back between forward and backward. */
static inline int layer_loss_in_place(const net_desc *net, int last, int recompute)
{
    const layer_desc *L = &net->layers[last - 1];
    return last == net->n_layers && !recompute && layer_kind_of(L->type)->own_output &&
           !layer_is_identity(L, 1) && L->activation == KERNEL_ACT_LINEAR;
}

/* ---- parameters as named tensors, and what a layer keeps for its backward ----
 * A layer's parameters are weight_count + bias_count floats: its tensors, in the order
 * layer_tensors lists them (PyTorch's layout: a linear map is [out, in]). The transformer
 * layers' names are GPT-2's, without the "transformer.h.N." prefix. */
enum { LAYER_MAX_TENSORS = 12 };
typedef enum {
    LAYER_INIT_TORCH = 0, /* U(±1/√fan_in), PyTorch's default (conv and dense) */
    LAYER_INIT_NORMAL,    /* N(0, std²) from the counter-based generator (GPT-2) */
    LAYER_INIT_ONES,
    LAYER_INIT_ZEROS,
    LAYER_INIT_TIED,      /* a copy of the embedding's token matrix (a tied head) */
} layer_init;
typedef struct {
    const char *name;
    size_t offset, count; /* in the layer's parameters */
    int rows, cols;       /* a vector is rows × 1 */
    layer_init init;
    double std;           /* LAYER_INIT_NORMAL */
    int decay;            /* AdamW's weight decay applies (matrices of blocks and heads) */
} layer_tensor;
/* L's tensors into t[LAYER_MAX_TENSORS]; blocks: the net's [block] count (GPT-2 scales the
 * residual projections' σ by 1/√(2·blocks)). Returns how many (0: no parameters). */
int layer_tensors(const layer_desc *L, int blocks, layer_tensor *t);
/* The leading parameters of L that AdamW decays (nanoGPT's rule: matrices of dense, conv,
 * blocks and an untied head; not biases, norms, embeddings or a tied head, which must stay
 * equal to the embedding). */
size_t layer_decayed_count(const layer_desc *L);
/* A [block] cut by heads over a tensor group (src/model/shard.h) is described as one rank
 * runs it: its heads and hidden units, and `shards`; its attention width (q, k and v
 * columns each, attention c_proj's inputs) is A = C / shards, C for a whole block. */
static inline int layer_block_shards(const layer_desc *L)
{
    return L->u.block.shards > 1 ? L->u.block.shards : 1;
}
/* A block with sequence parallelism (src/model/shard.h) holds 1/seq of the positions of its
 * input and output; 1 otherwise. Its whole sequence is in.c · seq. */
static inline int layer_block_seq(const layer_desc *L)
{
    return L->type == LAYER_BLOCK && L->u.block.seq > 1 ? L->u.block.seq : 1;
}
static inline size_t layer_block_attn_width(const layer_desc *L)
{
    return (size_t)L->in.w / (size_t)layer_block_shards(L);
}
/* Floats per sample a forward keeps for the backward besides the output (layer norms'
 * statistics; a block's inner activations and attention probabilities). */
size_t layer_saved_floats(const layer_desc *L);
/* Bytes per sample of the dropout masks a training forward keeps (uint8 per element): a
 * [dropout]'s output; a [block] with dropout p > 0, its heads' attention probabilities
 * heads·T² and its two residual dropouts (attention c_proj's and the MLP c_proj's
 * outputs) 2·T·C; else 0. */
size_t layer_mask_bytes(const layer_desc *L);
/* A [block] drops (p > 0) when trained. */
static inline int layer_block_drops(const layer_desc *L)
{
    return L->type == LAYER_BLOCK && L->u.block.p > 0.0f;
}
/* Floats per sample of the output gradients the split backward's B keeps for W (a block:
 * each of its inner products' and norms', and with dropout attention c_proj's output's
 * after its dropout); out_count for other parameter layers. */
size_t layer_gout_floats(const layer_desc *L);
/* The split backward of a whole block (not cut by heads, no sequence parallelism) leaves
 * most of W's gradients in its own slot's storage that its B has used up
 * (src/engine/layer_block.c, block_split_homes): c_fc's over the pre-GELU rows (fc, the
 * GELU's backward in place), c_attn's over qkv (copied there after the attention's
 * backward), and the rest over the attention probabilities as far as they fit
 * (layer_block_split_fits: how many gradients of C per token fit in heads·T² per sample).
 * Floats per sample it keeps apart (io.gout), layer_gout_floats for every other layer:
 * - norm_sums 0 (the CUDA engine): ln_2's output's and the residual's, and ln_1's output's
 *   and the MLP output's where they do not fit (those two go first over the
 *   probabilities), and with dropout attention c_proj's dropped;
 * - norm_sums 1 (the CPU engine): B forms the layer norms' weight gradients itself, into
 *   sums of the chunk's gradient group (layer_norm_sum_floats; W adds them), so W needs
 *   neither ln_1's nor ln_2's output gradient nor the residual before ln_2, over which B
 *   writes the residual's gradient; the MLP output's where it does not fit, and with
 *   dropout attention c_proj's dropped. A standalone layer norm keeps nothing. */
int layer_block_split_fits(const layer_desc *L);
size_t layer_gout_kept_floats(const layer_desc *L, int norm_sums);
/* Floats of the layer norms' weight-gradient sums a split backward with norm_sums forms in
 * B per gradient group: a whole block's ln_1 γ, β, ln_2 γ, β (C each), a layer norm's γ, β;
 * 0 for every other layer. */
size_t layer_norm_sum_floats(const layer_desc *L);
/* Floats of scratch a chunk of n samples needs (a block's backward; an embedding's token
 * ids), beyond the convolution workspace. */
size_t layer_work_floats(const layer_desc *L, int n);

/* A convolution's dimensions at batch n. */
static inline kernel_conv2d_dims layer_conv_dims(const layer_desc *L, int n)
{
    kernel_conv2d_dims d = {n, L->in.c, L->in.h, L->in.w, L->u.conv.filters, L->u.conv.size,
                            L->u.conv.stride, L->u.conv.pad, 0};
    return d;
}

#endif
