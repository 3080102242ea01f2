/* The compute half of the layer table (the description half, names, shapes, parameter
 * counts and summary text, is src/model/layer_table.h): for each layer type, which kernels
 * its forward, its backward (input and weight halves together, or the input half alone)
 * and its weight half call, and ONE layer loop over them that both engines drive: the CPU
 * stage (src/cpu/stage.c, chunk by chunk, between tensor collectives) and the CUDA engine
 * (src/cuda/engine_cuda_run.c, the whole micro-batch as one chunk).
 *
 * A device is a layer_kernels: one struct of int-returning kernel wrappers (the CPU set,
 * layer_kernels_cpu, is here; the CUDA set is in src/cuda/). The engine describes where a
 * layer's data lives through one callback per layer per chunk (layer_run.io); the loop
 * never calls through a pointer per element. Adding a layer type means one entry in each
 * table and its kernels in each device set. */
#ifndef PT_LAYER_OPS_H
#define PT_LAYER_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "src/model/layer_table.h"

/* One device's kernels. ctx: the device's context (NULL on the CPU, the kernel_cuda_ctx on
 * CUDA). Each returns 0, or −1 with a message. Arguments as kernels/kernels.h. */
typedef struct {
    int (*dense_forward)(void *ctx, float *out, const float *in, const float *w,
                         const float *b, int n, int in_f, int out_f);
    int (*dense_backward)(void *ctx, float *din, float *dw, float *db, const float *dout,
                          const float *in, const float *w, int n, int in_f, int out_f);
    int (*dense_backward_weight)(void *ctx, float *dw, float *db, const float *dout,
                                 const float *in, int n, int in_f, int out_f);
    int (*dense_backward_input)(void *ctx, float *din, const float *dout, const float *w, int n,
                                int in_f, int out_f);
    int (*conv_forward)(void *ctx, float *out, float *work, const float *in, const float *w,
                        const float *b, const kernel_conv2d_dims *d);
    int (*conv_backward)(void *ctx, float *din, float *dw, float *db, float *work,
                         const float *dout, const float *in, const float *w,
                         const kernel_conv2d_dims *d);
    int (*conv_backward_weight)(void *ctx, float *dw, float *db, float *work,
                                const float *dout, const float *in, const kernel_conv2d_dims *d);
    int (*conv_backward_input)(void *ctx, float *din, float *work, const float *dout,
                               const float *w, const kernel_conv2d_dims *d);
    int (*maxpool_forward)(void *ctx, float *out, int32_t *argmax, const float *in, int n, int c,
                           int h, int w, int size, int stride);
    int (*maxpool_backward)(void *ctx, float *din, const float *dout, const int32_t *argmax,
                            int n, int c, int h, int w, int size, int stride);
    int (*avgpool_forward)(void *ctx, float *out, const float *in, int n, int c, int h, int w,
                           int size, int stride);
    int (*avgpool_backward)(void *ctx, float *din, const float *dout, int n, int c, int h, int w,
                            int size, int stride);
    int (*activation_forward)(void *ctx, float *out, const float *in, size_t count,
                              kernel_act act);
    int (*activation_backward)(void *ctx, float *din, const float *dout, const float *out,
                               size_t count, kernel_act act);
    /* elements [elem_off, elem_off + per_sample) of each sample's whole vector */
    int (*dropout_forward)(void *ctx, float *out, uint8_t *mask, const float *in, int n,
                           size_t per_sample, size_t elem_off, float p, uint64_t seed,
                           uint64_t stream, const int64_t *sample_ids);
    int (*dropout_backward)(void *ctx, float *din, const float *dout, const uint8_t *mask,
                            size_t count, float p);
    /* count floats, device to device (count may be 0) */
    int (*copy)(void *ctx, float *dst, const float *src, size_t count);
    /* the transformer layers' (kernels/kernels_transformer.h); NULL on a device without them
     * (such a device refuses transformer models before it runs one) */
    int (*add)(void *ctx, float *dst, const float *src, size_t count);
    /* y[r·width + u] += b[u] for every row r, one addition per element (NULL: `add` per row,
     * the same bits; a GPU wants one launch, not one per token) */
    int (*add_rows)(void *ctx, float *y, const float *b, int rows, int width);
    int (*layernorm_forward)(void *ctx, float *out, float *mean, float *rstd, const float *x,
                             const float *gamma, const float *beta, int rows, int width);
    int (*layernorm_backward)(void *ctx, float *dx, float *dgamma, float *dbeta,
                              const float *dy, const float *x, const float *mean,
                              const float *rstd, const float *gamma, int rows, int width);
    int (*gelu_forward)(void *ctx, float *out, const float *in, size_t count);
    int (*gelu_backward)(void *ctx, float *din, const float *dout, const float *in,
                         size_t count);
    /* token ids arrive as floats (the stage input); tok: scratch for n·seq int32 */
    int (*embedding_forward)(void *ctx, float *out, int32_t *tok, const float *ids,
                             const float *wte, const float *wpe, int n, int seq, int width,
                             int vocab);
    int (*embedding_backward)(void *ctx, float *dwte, float *dwpe, int32_t *tok,
                              const float *dout, const float *ids, int n, int seq, int width,
                              int vocab);
    /* an embedding cut by vocabulary (src/model/shard.h): wte holds the rows of tokens
     * [first, first + vocab); forward, those tokens' rows and zeros for the others, plus
     * each position's row where wpe is given; backward, those tokens' rows of dwte and
     * (dwpe given) every position's */
    int (*embedding_shard_forward)(void *ctx, float *out, int32_t *tok, const float *ids,
                                   const float *wte, const float *wpe, int n, int seq,
                                   int width, int first, int vocab);
    int (*embedding_shard_backward)(void *ctx, float *dwte, float *dwpe, int32_t *tok,
                                    const float *dout, const float *ids, int n, int seq,
                                    int width, int first, int vocab);
    /* drop: the attention dropout (NULL: none); work: kernel_attention_dropout_floats
     * forward, kernel_attention_workspace_floats (+ the dropout's) backward */
    int (*attention_forward)(void *ctx, float *y, float *probs, float *work, const float *qkv,
                             const kernel_attention_dims *d,
                             const kernel_attention_dropout *drop);
    int (*attention_backward)(void *ctx, float *dqkv, float *work, const float *dy,
                              const float *qkv, const float *probs,
                              const kernel_attention_dims *d,
                              const kernel_attention_dropout *drop);
} layer_kernels;

extern const layer_kernels layer_kernels_cpu; /* src/engine/layer_kernels_cpu.c */
/* The CPU set with the dense products in bf16 (kernels/bf16.h; --precision bf16). A product
 * oneDNN fails (out of memory) ends the process with the reason: the CPU's loop cannot fail. */
const layer_kernels *layer_kernels_cpu_bf16(void);

/* Where local layer i's data lives for one chunk of n samples (rows already offset to the
 * chunk). Filled by the engine's callback; fields a phase does not use may be left 0. */
typedef struct {
    const float *x;          /* its input rows */
    float *y;                /* forward: its output storage */
    const float *out;        /* backward: its output of the forward */
    int identity;            /* the forward passed x through (y unused, out = x) */
    int32_t *argmax;         /* maxpool */
    uint8_t *mask;           /* dropout; a [block]'s masks (layer_mask_bytes) when its
                                forward drops (training), else NULL */
    float *saved;            /* transformer layers: what the forward keeps for the backward */
    const float *w, *b;      /* parameters */
    float *dw, *db;          /* backward, weight: where its parameter gradients are added */
    float *gout;             /* split backward: the output gradient B keeps for W (a block:
                                every inner gradient W needs, layer_gout_floats) */
    float *norm_sums;        /* split backward on the CPU: the layer norms' weight gradients
                                of the chunk's gradient group, added up by B over the
                                group's chunks in order into sums the engine zeroed
                                (layer_norm_sum_floats); NULL: W forms them from what B
                                kept (layer_gout_kept_floats) */
    int norm_sums_first;     /* W: the chunk is its group's first, which adds the sums to
                                the group's gradients */
    int batched;             /* its weight half is the step's (rows go to the stash) */
    float *stash_x, *stash_g; /* batched, backward: where this chunk's rows go (a block:
                                 its stash's bases, stage_plan_stash_io) */
    size_t stash_row;        /* a batched block: the chunk's first row of the step */
    int stash_rows;          /* a batched block: the step's rows (wgrad_rows) */
    int partial;             /* split by inputs: no bias and no activation in its forward */
    size_t elem_off;         /* dropout: the chunk's elements' offset in the whole vector;
                                a block cut by heads: its attention probabilities' in a
                                sample's whole (first head · T²) */
    const int64_t *ids;      /* the chunk's sample ids (dropout) */
    float *seq;              /* a block with sequence parallelism, forward: the chunk's rows
                                of the whole sequence [n·T, C] the engine exchanges with the
                                group between phases (gathered in, reduce-scattered out) */
    /* The CPU stage adding a gradient group to group 0's as it forms it (NULL: none): the
     * weight half forms its gradients in `part` (zeros, layer_fold_floats) instead of at
     * dw and db, one product at a time where the layer has several (a block), and hands
     * each to fold with the place it stands for in dw or db; fold adds it there and leaves
     * part zeroed again. */
    float *part;
    int (*fold)(void *self, float *dw_at, float *part, size_t count);
    void *fold_self;
} layer_io;

enum { LAYER_PHASE_FORWARD = 0, LAYER_PHASE_BACKWARD, LAYER_PHASE_WEIGHT };

/* A layer whose work needs its tensor group's collectives in its middle runs in phases: a
 * block cut by heads (src/model/shard.h) forward in three, 0: ln_1, c_attn, attention and
 * attention c_proj's partial sum into its output; 1: bias and residual, ln_2, c_fc, GELU,
 * MLP c_proj's partial sum into its output; 2: bias and residual; and backward in three,
 * 0: MLP c_proj, GELU and c_fc, leaving the partial gradient of ln_2's output as the
 * running gradient; 1: ln_2 and the residual, attention c_proj, attention and c_attn,
 * leaving the partial gradient of ln_1's output; 2: ln_1 and the residual (and, with the
 * weight half, every parameter gradient of the block). Between two phases the engine
 * all-reduces over the group, for the whole micro-batch, what the first left: the
 * layer's output forward, the running gradient backward. A block's inner gradients
 * (layer_gout_floats) live between its backward phases in io.gout, which the engine
 * provides for such a block in every backward (in one call of all its phases, as a
 * profile runs it without a group, the chunk's workspace does). Every other layer runs
 * in one phase. */
enum { LAYER_BLOCK_PHASES = 3 };
/* With sequence parallelism (layer_block_seq > 1) a block runs in five phases each way,
 * its output and input of the rank's positions: forward 0: ln_1 into its output storage
 * (which the engine all-gathers into io.seq); 1: c_attn, attention and attention c_proj's
 * partial sums into io.seq (reduce-scattered into the output storage); 2: bias and
 * residual, ln_2 (all-gathered); 3: c_fc, GELU, MLP c_proj's partial sums
 * (reduce-scattered); 4: bias and residual. Backward 0: the output gradient passed on
 * with ln_2's output of the positions (all-gathered: the forward keeps only the rank's
 * positions of ln_1's and ln_2's outputs); 1: MLP c_proj, GELU, c_fc (ln_2's output's
 * partial gradient, reduce-scattered); 2: ln_2 and the residual, with ln_1's output
 * (all-gathered); 3: attention c_proj,
 * attention, c_attn (reduce-scattered); 4: ln_1 and the residual. */
enum { LAYER_BLOCK_SEQ_PHASES = 5 };
int layer_phases(const layer_desc *L);
/* Floats per sample of the running gradient a backward leaves after phase `ph` of a layer
 * in phases (stopping before phase ph + 1): under sequence parallelism a block's whole
 * sequence's rows after its odd phases, after its even ones its positions' rows paired
 * with a layer norm's output (2C a position); else as many as its input. */
size_t layer_phase_floats(const layer_desc *L, int ph);
/* What a backward computes: the input gradient (B), the parameter gradients (W), or both. */
enum { LAYER_BW_INPUT = 1, LAYER_BW_WEIGHT = 2, LAYER_BW_BOTH = 3 };

typedef struct {
    const layer_kernels *k;
    void *kctx;
    const layer_desc *layers; /* the local layers as this rank runs them, [i] */
    int first;                /* the net's index of local layer 0 (dropout streams) */
    int n;                    /* samples of the chunk */
    float *work;              /* convolution workspace */
    uint64_t seed, step;      /* dropout */
    /* fills io for local layer i in `phase`; 0, or −1 with a message */
    int (*io)(void *self, int i, int phase, layer_io *io);
    void *self;
    /* layers in phases: the run starts at phase `from` of the first layer it reaches
     * (forward: lo; backward: hi − 1) and stops before phase `to` of the last (forward:
     * hi − 1; backward: lo), 0: through its end; phases count in the pass's direction.
     * 0 and 0 run whole layers. */
    int from, to;
    /* set when a kernel failed: what failed ("forward", "activation backward", "backward",
     * "weight gradient") and the local layer; NULL when the callback or a copy failed */
    const char *what;
    int failed;
} layer_run;

/* Floats of layer_io.part a layer's weight half needs: its largest product's gradients and
 * bias (a whole block: its four products' and its layer norms' apart), else all of its
 * parameters'. */
size_t layer_fold_floats(const layer_desc *L);

/* Forward of local layers [lo, hi), identity layers skipped. 0, or −1 (see r->what). */
int layer_run_forward(layer_run *r, int lo, int hi);
/* Backward of local layers [hi − 1 … lo] from the running gradient *g (in scratch[*gi],
 * −1: the caller's), which is left where it ends (din when lo is 0, finished, and din is
 * given; a run that stops inside layer lo leaves its partial gradient in scratch);
 * parts: LAYER_BW_BOTH, or LAYER_BW_INPUT alone (B: each parameter layer that is not
 * batched keeps its output gradient in io.gout). Batched layers stash their rows. */
int layer_run_backward(layer_run *r, int lo, int hi, const float **g, int *gi,
                       float *const scratch[2], float *din, int parts);
/* W of local layers [lo, hi): each parameter layer's (not batched) weight half from its
 * input and io.gout. */
int layer_run_weight(layer_run *r, int lo, int hi);

#endif
