/* Intra-layer model parallelism (tensor shards): how each layer of a net is cut across the
 * T ranks of a tensor group, what every rank holds, and where collectives complete the
 * layers. Pure description, as net.h: no MPI and no tensors here (the stage runs it,
 * src/cpu/stage.h; the executor moves the data, src/runtime/exec.c).
 *
 * A per-sample vector between layers is either whole on every rank of the group (FULL) or
 * cut (SHARDED) along its channels (a conv, pool or flattened conv output) or its features
 * (a dense output): rank t holds channels [⌊t·C/T⌋, ⌊(t+1)·C/T⌋), which are one contiguous
 * run of every sample's values, since tensors are channel-major. Shards may be uneven; a
 * dimension smaller than T is an error naming the layer.
 *
 * A layer with parameters is split by its outputs (dense units, conv filters: SHARD_OUT)
 * or by its inputs (SHARD_IN). A SHARD_OUT layer needs its whole input and leaves its
 * output sharded; a SHARD_IN layer takes the sharded input and leaves partial sums of its
 * whole output, all-reduced before its bias and activation (its bias is whole on every
 * rank). Layers without parameters work on what they are given, sharded or not.
 *   - mode gather (the classic scheme): every layer with parameters is SHARD_OUT, and a
 *     sharded vector is all-gathered where a layer needs it whole;
 *   - mode megatron: SHARD_OUT and SHARD_IN alternate from the net's first layer with
 *     parameters, so a pair needs one all-reduce forward (the SHARD_IN layer's output)
 *     and one backward (the SHARD_OUT layer's input gradient), and nothing in between.
 * The plan is made for the whole net, so a layer is cut the same way in every pipeline
 * layout; a stage whose first layer wants a sharded input takes its slice of the whole
 * vector it receives, and a stage that ends sharded all-gathers its output.
 *
 * A transformer language model is cut Megatron's way in both modes: each [block] by its
 * heads (SHARD_HEADS), its input and output whole on every rank. Rank t holds the q, k and
 * v columns of heads [t·h/T, (t+1)·h/T) (three row runs of c_attn [3C, C] and of its bias),
 * the matching input columns of attention c_proj, rows [t·H/T, (t+1)·H/T) of c_fc (and of
 * its bias) and those input columns of MLP c_proj; ln_1, ln_2 and both c_proj biases are
 * whole on every rank. Attention c_proj and MLP c_proj leave partial sums, all-reduced
 * before their bias and residual (two all-reduces forward), and the input gradients of
 * c_fc and c_attn are partial sums, all-reduced before the layer norms' backward (two
 * backward): the block runs in phases between them (src/engine/layer_ops.h). The heads
 * and the hidden units must be multiples of T. The embedding and the lm_head are cut by
 * vocabulary, rank t holding tokens [⌊t·V/T⌋, ⌊(t+1)·V/T⌋) (V ≥ T): the embedding's rows
 * of them (SHARD_VOCAB; the positions whole on every rank) give each token's vector on the
 * rank that holds it and zeros elsewhere (rank 0 adds the position's), all-reduced into
 * the whole output; the lm_head's rows of them (SHARD_OUT) give the logits of those
 * tokens, which stay sharded: the loss takes them so (loss_sharded; src/cpu/stage.h,
 * stage_loss, Megatron's vocabulary-parallel cross-entropy), and its input gradient is a
 * partial sum, all-reduced. The final layer norm is whole on every rank (SHARD_NONE),
 * computing the same values and the same whole gradients.
 *
 * Sequence parallelism (mode TENSOR_SEQUENCE, `train --sequence-parallel`; Korthikanti et
 * al. 2022, as Megatron-LM): a language model's vectors between layers are cut along the
 * sequence instead, rank t holding positions [t·T/Tp, (t+1)·T/Tp) of each sample (T a
 * multiple of Tp), a shard_state of T units of C values. The blocks are cut by heads as
 * above, but ln_1, ln_2, the residual adds and the c_proj biases run on the rank's
 * positions: a block all-gathers ln_1's (and ln_2's) output along the sequence before
 * c_attn (c_fc) and reduce-scatters attention c_proj's (MLP c_proj's) partial sums in
 * place of the all-reduce, so it runs in five phases (layer_block_seq); backward the
 * conjugates (the gradient of the block's output all-gathered, of ln_2's output
 * reduce-scattered, ...). The embedding reduce-scatters its partial output
 * (shard_reduce_scatters), the final layer norm works on the rank's positions, and the
 * lm_head all-gathers its input (gather_in) and reduce-scatters its input gradient. A
 * pipeline stage sends and receives only its slice (shard_stage_in_count). The layer norms'
 * parameter gradients are then sums over the rank's positions: the group sums them before
 * the update (shard_seq_partial_runs). */
#ifndef PT_SHARD_H
#define PT_SHARD_H

#include <stddef.h>

#include "src/model/net.h"

/* TENSOR_SEQUENCE: megatron with sequence parallelism (a language model only; see below). */
typedef enum { TENSOR_MEGATRON = 0, TENSOR_GATHER, TENSOR_SEQUENCE } tensor_mode;
typedef enum { SHARD_NONE = 0, SHARD_OUT, SHARD_IN, SHARD_HEADS, SHARD_VOCAB } shard_split;

/* A per-sample vector: whole, or cut into `units` (channels or features) of `unit` values
 * each (rank t: units [⌊t·units/T⌋, ⌊(t+1)·units/T⌋)). */
typedef struct {
    int sharded;
    int units, unit;
} shard_state;

typedef struct {
    shard_split split;
    shard_state in;     /* the input as the layer uses it */
    shard_state out;    /* its output (after its collective, for SHARD_IN) */
    int gather_in;      /* the input arrives sharded and is all-gathered first */
} shard_layer;

typedef struct {
    int T;
    tensor_mode mode;
    int n_layers;
    shard_layer *layers; /* owned, per layer of the net */
    int loss_sharded;    /* the net's last layer (a language model's lm_head) leaves its
                            output sharded by vocabulary for the loss: never gathered */
} shard_plan;

/* Plans T shards (T ≥ 1; T = 1 plans nothing: every layer SHARD_NONE, every vector FULL).
 * Returns −1 with a message naming the layer (file:line) that cannot be cut T ways. */
int shard_plan_init(shard_plan *p, const net_desc *net, int T, tensor_mode mode);
void shard_plan_free(shard_plan *p);
const char *tensor_mode_name(tensor_mode m);
const char *shard_split_name(shard_split s);

/* Rank t's cut of n units: [*off, *off + *len). */
void shard_cut(int n, int T, int t, int *off, int *len);
/* Rank t's values of a per-sample vector in state s: [*off, *off + *len) of the whole
 * vector's `whole` values (0, whole when not sharded). */
void shard_values(const shard_state *s, size_t whole, int T, int t, size_t *off, size_t *len);

/* Layer l as rank t runs it: shapes of its local input and output, its units or filters
 * and its parameter counts (weight slice; bias slice for SHARD_OUT, whole for SHARD_IN; a
 * block's heads, hidden units and shards, src/model/layer_table.h; an embedding's or
 * lm_head's tokens). */
layer_desc shard_local_layer(const shard_plan *p, const net_desc *net, int l, int t);
/* Parameters rank t holds of layers [first, last). */
size_t shard_param_count(const shard_plan *p, const net_desc *net, int first, int last, int t);

/* Copies between rank t's parameters of layer l (weight then bias, as the stage keeps
 * them) and the whole layer's (weight then bias, the one-process order):
 * to_local = 1: local ← whole; 0: whole ← local (only the values rank t holds). */
void shard_copy_layer(const shard_plan *p, const net_desc *net, int l, int t, float *local,
                      float *whole, int to_local);
/* The same for layers [first, last): rank t's parameters of them, concatenated in layer
 * order, and the layers' whole parameters, concatenated. */
void shard_copy_layers(const shard_plan *p, const net_desc *net, int first, int last, int t,
                       float *local, float *whole, int to_local);
/* The net as rank t runs it: every layer shard_local_layer's, param_count rank t's. For
 * what counts parameters per layer (the replicas' reduction buckets). net_desc_free frees
 * it. */
int shard_local_net(net_desc *out, const shard_plan *p, const net_desc *net, int t);
/* Calls fn(ctx, whole_index, local_index, count) for each contiguous run of layer l's
 * parameters that rank t holds, in local order (weight runs, then bias runs), indices
 * counted from the layer's first parameter. A rank's block keeps the whole block's order
 * of tensors, each cut to its shard (c_attn [3A, C]: its q, then k, then v rows). */
void shard_layer_runs(const shard_plan *p, const net_desc *net, int l, int t,
                      void (*fn)(void *ctx, size_t whole, size_t local, size_t count),
                      void *ctx);

/* Values per sample a stage of layers [first, ...) keeps for local layer l's input on rank t
 * when that input is not the previous layer's output: its input all-gathered whole, or, at
 * the stage's first layer, its slice of the whole vector the stage receives; 0 otherwise.
 * Both engines size their slots with it. */
size_t shard_slot_input(const shard_plan *p, const net_desc *net, int l, int first, int t);

/* Where a stage of layers [first, last) stops for its tensor group; both engines run the
 * layers between these points and the collectives at them.
 * shard_forward_after: what follows local layer i's forward (0: the next layer at once):
 * SHARD_THEN_REDUCE, all-reduce its partial output, then its bias and activation; and/or
 * SHARD_THEN_GATHER, all-gather its sliced output into the next layer's input (the stage's
 * whole output after its last layer).
 * shard_backward_stop: a backward of local layers [lo, h) first runs [b, h) for the b
 * returned, then the group acts on the gradient at layer b's input (an output-split layer's
 * partial sums, a gathered input's slice); b = lo when nothing stops it earlier. */
enum { SHARD_THEN_REDUCE = 1, SHARD_THEN_GATHER = 2 };
/* A stage ending at layer last − 1 all-gathers its output (it is sharded, and is not the
 * sharded logits the loss takes as they are). */
int shard_output_gathered(const shard_plan *p, int last);
int shard_forward_after(const shard_plan *p, int first, int last, int i);
int shard_backward_stop(const shard_plan *p, int first, int lo, int h);

/* Per sample, the floats a stage of layers [first, last) moves in tensor collectives:
 * forward all-gathers (the values gathered, the whole vectors' sizes) and all-reduces,
 * backward all-reduces and all-gathers (a block cut by heads: two of its output's size
 * each way). first_stage: no input gradient is needed. For the planner and the
 * simulator's α–β pricing. */
typedef struct {
    size_t fwd_gather, fwd_reduce, bwd_reduce, bwd_gather;
    int fwd_gathers, fwd_reduces, bwd_reduces, bwd_gathers; /* how many collectives */
} shard_traffic;
shard_traffic shard_stage_traffic(const shard_plan *p, const net_desc *net, int first, int last,
                                  int first_stage);

/* Sequence parallelism (mode TENSOR_SEQUENCE with T > 1). */
static inline int shard_sequence(const shard_plan *p)
{
    return p && p->T > 1 && p->mode == TENSOR_SEQUENCE;
}
/* Layer l leaves partial sums of its whole output that the group reduce-scatters along the
 * sequence (an embedding under sequence parallelism): its output storage holds the whole
 * rows, the rank's slice is then packed at its start. */
int shard_reduce_scatters(const shard_plan *p, int l);
/* Values per sample a stage of layers [first, last) receives and sends on tensor rank t:
 * the whole vectors, or under sequence parallelism the rank's slice of them (not of the
 * token ids a first stage reads, nor of the logits a last stage keeps). */
size_t shard_stage_in_count(const shard_plan *p, const net_desc *net, int first, int t);
size_t shard_stage_out_count(const shard_plan *p, const net_desc *net, int last, int t);
/* Calls fn(ctx, local_index, count) for each run of layer l's local parameters (rank t's,
 * indices from the layer's first) whose gradients are sums over the rank's positions
 * only under sequence parallelism (the layer norms' weights and biases: ln_1 and ln_2 of
 * a block, a [layernorm]); the group sums them before the update. None otherwise. */
void shard_seq_partial_runs(const shard_plan *p, const net_desc *net, int l, int t,
                            void (*fn)(void *ctx, size_t local, size_t count), void *ctx);

/* One line per layer with its cut (the README's and `plan`'s table). */
void shard_plan_print(const shard_plan *p, const net_desc *net, FILE *out);

#endif
