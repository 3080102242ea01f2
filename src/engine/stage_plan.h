/* The rules of a pipeline stage that every engine (the CPU's, src/cpu/, and the CUDA
 * plugin's, src/cuda/) shares: they must agree bit for bit, so each is written once, here.
 * An engine keeps only what is about its own memory, threads and streams.
 *
 * - the layout (stage_plan_init, stage_plan_sizes, stage_plan_carve_slot): each local layer
 *   as this rank runs it, parameter offsets, one slot's activations (outputs, maxpool
 *   positions, dropout masks, tensor shards' inputs, the gathered stage output), the widest
 *   vector and the convolution workspace;
 * - the gradient targets (stage_plan_grad_target, stage_plan_grad_runs): where each
 *   micro-batch's parameter gradients are formed and added;
 * - the order of a backward by layer ranges (stage_plan_range_*);
 * - the tensor-parallel forward and backward in runs between collectives
 *   (stage_tensor_forward, stage_tensor_backward) over a device's stage_tensor_ops;
 * - PyTorch's initialisation (stage_plan_init_params), the optimizer update
 *   (stage_optim_step over a device's optim_kernels) and the batched weight gradients' tiles
 *   (stage_plan_wgrad_flush). */
#ifndef PT_STAGE_PLAN_H
#define PT_STAGE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "src/engine/layer_ops.h"
#include "src/model/layer_table.h"
#include "src/model/shard.h"

typedef enum { OPTIM_SGD = 0, OPTIM_MOMENTUM, OPTIM_ADAM, OPTIM_ADAMW } optimizer_kind;

/* One step's update. lr is the step's (the run's schedule, src/train/lr_schedule.h, gives
 * it). weight_decay: L2 added to the gradient (sgd, momentum, adam), or AdamW's decoupled
 * decay of each layer's leading layer_decayed_count parameters (the rest: none).
 * clip_norm: the executor scales the whole model's gradient to at most this global norm
 * before the update (torch.nn.utils.clip_grad_norm_; 0: no clipping); engines ignore it. */
typedef struct {
    optimizer_kind kind;
    float lr, momentum, weight_decay;
    float beta1, beta2, eps;
    float clip_norm;
} optimizer_config;

/* "sgd", "momentum", "adam", "adamw" ("?" out of range). */
const char *optimizer_kind_name(optimizer_kind k);
/* Adam and AdamW: both moment buffers and a count of the updates (bias correction). */
static inline int optimizer_is_adam(optimizer_kind k)
{
    return k == OPTIM_ADAM || k == OPTIM_ADAMW;
}

/* Tensor shards (src/model/shard.h): the collectives of the stage's tensor group, given by
 * the executor (the stage itself knows no MPI). Each waits until done; −1 with a message.
 * allreduce: sums n floats in place over the group. allgather: every rank's `count[r]`
 * floats (this rank's at `send`) into `recv`, rank by rank in rank order. */
typedef struct {
    void *ctx;
    int (*allreduce)(void *ctx, float *buf, size_t n);
    int (*allgather)(void *ctx, const float *send, float *recv, const size_t *count);
    /* sequence parallelism (NULL: none): `send` holds count[0] + count[1] + ... floats,
     * rank by rank; this rank receives the group's sum of block `rank` (count[rank]
     * floats) at recv */
    int (*reduce_scatter)(void *ctx, const float *send, float *recv, const size_t *count);
} stage_tensor_comm;

/* STAGE_ALIGN: every block of a stage's memory starts at a multiple of it (bytes).
 * STAGE_WGRAD_TILE: output units per product of a batched weight gradient; it fixes the
 * order of the sums, so it is one constant for every engine. */
enum { STAGE_ALIGN = 64, STAGE_WGRAD_TILE = 512 };

static inline size_t stage_round_up(size_t bytes)
{
    return (bytes + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
}

/* ------------------------------------------------------------------- layout ---- */

/* What a stage is, for its layout. */
typedef struct {
    const net_desc *net;    /* not owned */
    int first, last;        /* layers [first, last) */
    int max_batch;          /* samples per micro-batch */
    int chunk;              /* samples per chunk (what the convolution workspace serves) */
    const shard_plan *tp;   /* tensor shards (not owned): NULL or T = 1 for whole layers */
    int tp_rank;
    size_t (*conv_workspace)(const kernel_conv2d_dims *d); /* the device's, in floats */
} stage_shape;

/* The layout's sizes. slot_bytes: one slot's activations at max_batch (every block rounded
 * to STAGE_ALIGN), which is what the planner counts per micro-batch in flight. */
typedef struct {
    size_t param_count;     /* this rank's parameters */
    size_t widest;          /* values per sample of the widest whole input or output (tensor
                               collectives move whole vectors; local ones are no wider) */
    size_t work_floats;     /* the widest convolution workspace at `chunk` samples */
    size_t phase_floats;    /* per sample: the most inner gradients a layer in phases keeps
                               between its backward phases (layer_gout_floats; 0: none) */
    size_t slot_bytes;
} stage_sizes;

/* The shared part of a stage: its layout, and the state of the rules below. */
typedef struct {
    const net_desc *net;    /* not owned */
    int first, last, nl;    /* layers [first, last), nl of them */
    int max_batch;
    const shard_plan *tp;   /* not owned; NULL: whole layers */
    int tp_rank;
    const char *name;       /* how messages name the stage: "stage", "CUDA engine, layers" */
    layer_desc *loc;        /* owned, [nl]: each local layer as this rank runs it */
    size_t *param_off;      /* owned, [nl]: where its weight starts in params and grads (its
                               bias follows) */
    size_t param_count, widest, work_floats, phase_floats, slot_bytes; /* as stage_sizes */
    int wgrad_rows;         /* batched weight gradients: rows of the step (0: off) */
    int norm_sums;          /* the split backward's B forms the layer norms' weight
                               gradients (layer_gout_kept_floats; the CPU stage's) */
    int accumulated;        /* the stage's gradients hold a micro-batch's since zeroing */
    /* a backward by layer ranges under way (range_hi > 0: its next range ends there), of
     * micro-batch range_mb (the engine's index), into range_grads */
    int range_hi, range_mb;
    const float *range_grads;
} stage_plan;

/* Fills p for `shape` (the engine zeroes p first); −1 with a message when out of memory. */
int stage_plan_init(stage_plan *p, const stage_shape *shape, const char *name);
void stage_plan_free(stage_plan *p);
/* stage_plan_init's sizes, without allocating (the planner's estimates). */
stage_sizes stage_plan_sizes(const stage_shape *shape);

/* Offset in params/grads where local layer i's parameters start (i = nl: the count). */
static inline size_t stage_plan_param_end(const stage_plan *p, int i)
{
    return i < p->nl ? p->param_off[i] : p->param_count;
}

/* The local layers whose parameters overlap [off, off + count) (count > 0): [*lo, *hi). */
void stage_plan_layers_of(const stage_plan *p, size_t off, size_t count, int *lo, int *hi);

/* A layer type whose products batch their weight gradients: dense, the four products of a
 * [block] (c_attn, attention c_proj, c_fc, MLP c_proj) and [lm_head] (tied or not). */
static inline int stage_wgrad_batches(const layer_desc *L)
{
    return L->type == LAYER_DENSE || L->type == LAYER_BLOCK || L->type == LAYER_LM_HEAD;
}

/* Local layer i's products form their weight gradients over the whole step (batched weight
 * gradients); its micro-batches' rows go to a stash instead. */
static inline int stage_plan_batched(const stage_plan *p, int i)
{
    return p->wgrad_rows > 0 && stage_wgrad_batches(&p->loc[i]);
}

/* One product y = x·W^T (+ b) of a layer whose weight gradient batches: dW = G^T X (and
 * db = Σ G) over `tokens` rows per sample of `in` inputs and `out` outputs. w, b: where dW
 * and db start in the layer's parameters (b = (size_t)−1: no bias). x_off, g_off: where its
 * X and G start in the layer's stash, in floats per row of the step (times wgrad_rows). */
enum { STAGE_WGRAD_MAX_PRODUCTS = 4 };
typedef struct {
    size_t w, b;
    int in, out, tokens;
    size_t x_off, g_off;
} stage_wgrad_product;
#define STAGE_WGRAD_NO_BIAS ((size_t)-1)
/* L's products (as a rank runs it: a cut block's are its slices) into
 * pr[STAGE_WGRAD_MAX_PRODUCTS]; returns how many (0: none batch). *x_floats, *g_floats: the
 * stash's floats per sample (either may be NULL). */
int stage_wgrad_products(const layer_desc *L, stage_wgrad_product *pr, size_t *x_floats,
                         size_t *g_floats);
/* The parameters of local layer i whose gradients a backward forms per micro-batch, as
 * ranges [a, b) of offsets in the stage's: the whole layer, or with batched weight
 * gradients its parameters outside every product (a block's layer norms); returns how many
 * (≤ 2). */
int stage_plan_mb_ranges(const stage_plan *p, int i, size_t (*r)[2]);
/* A batched layer's stash for a chunk whose first sample is row `row` of the step: a
 * dense layer or head gets its rows' place (x_base + row·in, g_base + row·out), a block
 * the bases, the row and the step's rows (io->stash_row, stash_rows). */
void stage_plan_stash_io(const stage_plan *p, int i, float *x_base, float *g_base, size_t row,
                         layer_io *io);

/* Local layer i's storage in one slot, and where its data is for the last forward. */
typedef struct {
    float *buf;          /* its output storage (NULL: none of its own, flatten) */
    int32_t *argmax;     /* maxpool positions, else NULL */
    uint8_t *mask;       /* dropout masks (layer_mask_bytes), else NULL */
    float *saved;        /* what else its backward needs (layer_saved_floats), else NULL */
    float *xin;          /* tensor shards: its input when that is not the previous output
                            (gathered whole, or the stage input's slice), else NULL */
    const float *out;    /* its output of the last forward: buf, or its input when the
                            layer was the identity (flatten; dropout when not training) */
    float *gout;         /* split backward: the output gradient B keeps for W (engine's) */
    float *sums;         /* split backward with norm_sums: the layer norms' weight-gradient
                            sums of each gradient group (layer_norm_sum_floats each) */
    int trained;         /* the last forward trained: a block's dropout masks are valid */
} stage_slot_layer;

/* Carves one slot's slot_bytes at `base` (NULL: every pointer NULL) into layers[0, nl)
 * (buf, argmax, mask, saved, xin); returns the storage of the stage's output gathered whole, NULL
 * when its output is not sharded. */
float *stage_plan_carve_slot(const stage_plan *p, void *base, stage_slot_layer *layers);
/* Decides, for a forward, where each layer's output lives (out) from the stage's input.
 * Returns what the stage sends: the last layer's output, or whole_out when gathered. */
const float *stage_plan_set_outputs(const stage_plan *p, stage_slot_layer *layers,
                                    const float *input, float *whole_out, int training);
/* Local layer i's input as it uses it. */
static inline const float *stage_slot_input(const stage_slot_layer *layers, int i,
                                            const float *input)
{
    return layers[i].xin ? layers[i].xin : i == 0 ? input : layers[i - 1].out;
}
/* Local layer i is split by its inputs: its forward leaves partial sums, all-reduced over
 * the tensor group before its bias and activation (stage_tensor_ops.finish). */
static inline int stage_plan_split_in(const stage_plan *p, int i)
{
    return p->tp && p->tp->layers[p->first + i].split == SHARD_IN;
}
/* What the shared layer loop (src/engine/layer_ops.h) needs of local layer i for a chunk of
 * samples [off, ...) of a slot in `phase`, apart from the device's own: its input, output
 * and storage, parameters (and their gradients in `grads`, NULL: none), B's output
 * gradient, whether it is batched, and for the forward whether its output is partial and
 * where its dropout elements sit in the whole vector. The engine adds the sample ids and a
 * batched layer's stash rows. */
void stage_plan_layer_io(const stage_plan *p, const stage_slot_layer *layers,
                         const float *input, float *params, float *grads, int i, int phase,
                         size_t off, layer_io *io);

/* ------------------------------------------------------- gradient targets ---- */

/* A micro-batch's parameter gradients. The first since zeroing is formed in place in the
 * stage's gradients; each later one apart in mb_grads (zeroed first), then added, so that
 * each is rounded on its own: grads = G0 + G1 + ... With gradient pieces (data parallel,
 * method "ordered"), micro-batch m's is formed apart in its piece (m mod P) and left there.
 * Only the layers' runs of stage_plan_grad_runs are zeroed and added. */
typedef struct {
    float *form;     /* where the kernels sum it */
    int apart;       /* form is zeroed first (mb_grads or a piece) */
    float *add_to;   /* then added here (the stage's gradients), or NULL */
} stage_grad_target;

/* piece: the micro-batch's own target (NULL: none, the stage's gradients). The target does
 * not change between the ranges of one micro-batch's backward. */
stage_grad_target stage_plan_grad_target(const stage_plan *p, float *grads, float *mb_grads,
                                         float *piece);
/* A backward (or W) of layers [lo, ...) formed its target: at lo = 0 the stage's gradients
 * hold a micro-batch's, unless it went to a piece. */
void stage_plan_grads_formed(stage_plan *p, int lo, const float *piece);
/* The stage's gradients were zeroed; an unfinished backward by ranges is abandoned. */
void stage_plan_grads_zeroed(stage_plan *p);
/* The parameters of local layers [lo, hi) whose gradients a backward forms per micro-batch
 * (all but batched layers), as at most `cap` maximal runs [begin, end) of offsets (past cap,
 * the last run spans the rest: a batched layer inside is zeroed and summed for nothing, and
 * its flush overwrites it). Returns the number of runs. */
int stage_plan_grad_runs(const stage_plan *p, int lo, int hi, size_t (*runs)[2], int cap);

/* ------------------------------------------------- backward by layer ranges ---- */

/* A backward of local layers [lo, hi) of micro-batch mb into `grads`: −1 with a message
 * unless the range lies in the stage and continues the backward by ranges under way (the
 * same micro-batch and grads, ending where the last one began) or starts one at the top. */
int stage_plan_range_check(const stage_plan *p, int mb, int lo, int hi, const float *grads);
/* The range [lo, hi) of mb ran: the next ends at lo (none after lo = 0). */
void stage_plan_range_done(stage_plan *p, int mb, int lo, const float *grads);
/* −1 with a message ("<what> while ... unfinished") when a backward by ranges is under way. */
int stage_plan_range_idle(const stage_plan *p, const char *what);

/* ---------------------------------------------------- tensor-parallel runs ---- */

/* One device's side of a micro-batch's tensor-parallel forward and backward: the runs of
 * layers between the collectives, and the collectives and copies at them (as a
 * layer_kernels is a device's kernels; self is the engine's pass). Each returns 0, or −1
 * with a message. */
typedef struct {
    /* the forward of local layers [lo, hi) */
    int (*forward)(void *self, int lo, int hi);
    /* the backward of local layers [lo, hi) from dout (the gradient of layer hi − 1's
     * output; NULL: where the range above left it) to din (NULL: not wanted) */
    int (*backward)(void *self, int lo, int hi, const float *dout, float *din);
    /* sums count floats in place over the group */
    int (*allreduce)(void *self, float *buf, size_t count);
    /* n rows of this rank's slice (len values each, contiguous at local) of a vector of
     * `whole` values in state st, all-gathered into n whole rows at out */
    int (*gather)(void *self, const shard_state *st, size_t whole, const float *local,
                  float *out, int n);
    /* values [from, from + keep) of n rows of `whole`, as n contiguous rows */
    int (*slice)(void *self, const float *in, size_t whole, size_t from, size_t keep,
                 float *out, int n);
    /* an input-split layer after its all-reduce: its bias, then its activation */
    int (*finish)(void *self, int i, float *y, int n);
    /* the gradient the backward left at local layer b's input (an output-split layer's
     * partial sums, n rows of `whole`): all-reduced, and cut to values [from, from + keep)
     * of each row, which the layer below continues from; between two backward phases of
     * layer b (from 0, keep = whole), the partial gradient the first phase left */
    int (*reduce_carry)(void *self, int b, size_t whole, size_t from, size_t keep, int n);
    /* forward and backward as above, from phase `from` of the first layer each reaches to
     * before phase `to` of its last (layer_run's from and to, src/engine/layer_ops.h):
     * for layers in phases (a block cut by heads); NULL on a device without them */
    int (*forward_phases)(void *self, int lo, int hi, int from, int to);
    int (*backward_phases)(void *self, int lo, int hi, int from, int to, const float *dout,
                           float *din);
    /* sequence parallelism (src/model/shard.h; NULL on a device without it): n rows of
     * partial sums of a vector of `whole` values in state st (at in), summed over the group
     * into this rank's slice of each (n contiguous rows at out; out may be in) */
    int (*reduce_scatter)(void *self, const shard_state *st, size_t whole, const float *in,
                          float *out, int n);
    /* the running gradient the backward left (n rows, as reduce_carry's) of a vector in
     * state st: gather = 1, this rank's slice of each row all-gathered into whole rows;
     * 0, whole rows of partial sums reduce-scattered into this rank's slice */
    int (*seq_carry)(void *self, const shard_state *st, size_t whole, int n, int gather);
} stage_tensor_ops;

typedef struct {
    const stage_plan *plan;
    const stage_tensor_ops *ops;
    void *self;
    int n;                  /* samples of the micro-batch */
    const stage_slot_layer *layers; /* the slot's (buf, out, xin) */
    const float *input;     /* forward: the stage's input (whole rows) */
    float *whole_out;       /* the stage's output gathered whole (NULL: not sharded) */
    float *tp_dout;         /* backward, whole_out: the output gradient's slice */
    float *tp_din;          /* backward, a sliced input: the input gradient's slice (a
                               gathered one under sequence parallelism: its whole) */
    float *seq;             /* sequence parallelism: n whole rows of the widest vector, a
                               block's exchange between forward phases (layer_io.seq) */
    /* ZeRO-3 (NULL: none): called before local layer i's first phase of a pass (begins 1)
     * and after its last (begins 0: after the forward's bias and activation of an
     * input-split layer too); with shards the runs are then one layer each, so that the
     * calls are around each layer's phases and not around the runs between collectives.
     * Nonzero: the pass stops (the message set). */
    int (*layer)(void *self, int i, int backward, int begins);
} stage_tensor_run;

/* Local layer i's phases (layer_phases: 3 for a block cut by heads, else 1). */
static inline int stage_plan_phases(const stage_plan *p, int i)
{
    return layer_phases(&p->loc[i]);
}

/* The forward: without shards one run of every layer; with them, runs of layers, each
 * followed by what the group completes for the next (the stage input's slice first); a
 * layer in phases all-reduces its output between them. */
int stage_tensor_forward(const stage_tensor_run *r);
/* The backward of local layers [lo, hi) (dout read when hi = nl, din written when lo = 0 and
 * not NULL): in runs between the collectives with shards. The gradient of an output-split
 * layer's input holds partial sums (all-reduced), a gathered input's gradient is whole (each
 * rank keeps its slice), a sliced stage input's gradient is a slice (all-gathered for the
 * previous stage), and a gathered stage output's gradient arrives whole (sliced first). A
 * layer in phases all-reduces the running gradient between them (reduce_carry); it forms
 * its parameter gradients in its last phase. */
int stage_tensor_backward(const stage_tensor_run *r, int lo, int hi, const float *dout,
                          float *din);
/* n rows of a vector of `whole` values in state st, rank by rank: count[r] = n · len[r]
 * floats, rank r's values [off[r], off[r] + len[r]) of each row (for a gather). */
void stage_tensor_counts(const stage_plan *p, const shard_state *st, size_t whole, int n,
                         size_t *count, size_t *off, size_t *len);

/* ------------------------------------------- initialisation and the update ---- */

/* The initialisation, drawn per layer (per tensor) from the counter-based generator, so the
 * same in every layout: PyTorch's default for conv and dense (U(±1/√fan_in) for weights and
 * biases), GPT-2's for the transformer layers (src/model/layer_table.h, layer_tensors).
 * draw(ctx, dst, first, count, kind, scale, seed, stream) writes elements [first, first +
 * count) of that stream's tensor to dst: U(±scale) for LAYER_INIT_TORCH, N(0, scale²) for
 * LAYER_INIT_NORMAL, ones, zeros. On a failed draw, −1 and *failed = the net's layer. */
typedef int (*stage_init_draw)(void *ctx, float *dst, size_t first, size_t count,
                               layer_init kind, double scale, uint64_t seed, uint64_t stream);
int stage_plan_init_params(const stage_plan *p, float *params, uint64_t seed,
                           stage_init_draw draw, void *ctx, int *failed);

/* One device's optimizer updates (kernels/kernels.h's operations and roundings). */
typedef struct {
    int (*sgd)(void *ctx, float *param, const float *grad, size_t count, float lr,
               float weight_decay);
    int (*momentum)(void *ctx, float *param, float *buf, const float *grad, size_t count,
                    float lr, float momentum, float weight_decay);
    int (*adam)(void *ctx, float *param, float *m, float *v, const float *grad, size_t count,
                float lr, float beta1, float beta2, float eps, float weight_decay, long step);
    /* torch.optim.AdamW (kernel_adamw_update_cpu); NULL: the device has none */
    int (*adamw)(void *ctx, float *param, float *m, float *v, const float *grad, size_t count,
                 float lr, float beta1, float beta2, float eps, float weight_decay, long step);
} optim_kernels;

extern const optim_kernels optim_kernels_cpu;

/* The stage's parameters and optimizer state (one device's memory). */
typedef struct {
    float *params, *grads, *m, *v;
    size_t count;
    long *step;             /* updates taken: the first is 1 (Adam's bias correction) */
    const stage_plan *plan; /* the stage's layers (AdamW decays each one's leading
                               layer_decayed_count parameters); not owned */
} stage_optim_state;

/* One update of every parameter from the gradients. AdamW runs per layer in segments
 * (decayed, then not), which the element-wise update makes bit-identical to one call with
 * a per-element decay. −1 with a message (a failed kernel, an unknown optimizer, AdamW
 * without a plan or on a device without it). */
int stage_optim_step(const optim_kernels *k, void *ctx, const stage_optim_state *s,
                     const optimizer_config *o);

/* The batched weight gradients of local layers [lo, hi): per batched layer, dw = G^T·X and
 * db = column sums of G over the step's wgrad_rows rows (written, not added), in tiles of
 * STAGE_WGRAD_TILE output units; tiles numbered k = 0, 1, ... across the layers, and this
 * call (worker t of `threads`) forms those with k mod threads = t. units(ctx, dw, db, g, x,
 * rows, in, out, u0, count) is the device's kernel. On a failure, −1 and *failed = the
 * local layer. */
typedef int (*stage_wgrad_units)(void *ctx, float *dw, float *db, const float *dout,
                                 const float *in, int rows, int in_f, int out_f, int u0,
                                 int units);
int stage_plan_wgrad_flush(const stage_plan *p, float *grads, float *const *stash_x,
                           float *const *stash_g, int lo, int hi, int t, int threads,
                           stage_wgrad_units units, void *ctx, int *failed);

#endif
