/* A pipeline stage at run time on the CPU: a contiguous run of layers of a net_desc with its
 * parameters, gradients and optimizer state (one allocation), and activation slots for the
 * micro-batches in flight, its micro-batches cut into chunks over worker threads.
 * Sequential training is a single stage holding every layer. Its layout and the rules it
 * shares with the CUDA engine are src/engine/stage_plan.h's (stage.plan). No MPI here: the
 * executor (src/runtime/exec.c) moves data between stages. */
#ifndef PT_STAGE_H
#define PT_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "src/model/net.h"
#include "src/model/shard.h"
#include "src/base/pages.h"
#include "src/engine/stage_plan.h"

/* One rank's memory shared by the stages of its model chunks, which run one at a time:
 * - activation slots (n > 0): a V schedule's rank holds at most the verifier's peak of
 *   micro-batches over its chunks at once, fewer than the sum of each chunk's peaks. n units
 *   of `unit` bytes (zeroed); a stage allocates no slot memory of its own but binds a unit
 *   to a slot when the slot is acquired (its activations, then its split backward's
 *   gradients) and unbinds it at release. n = 0: each stage has its own slots.
 * - the gradient groups' page pool (group_bytes of addresses): the pages one chunk's groups
 *   and mb_grads give back after a backward are the next chunk's, so the rank's groups hold
 *   one chunk's at a time, not each chunk's;
 * - the worker threads' scratch, as large as the largest chunk's.
 * A stage created while the pool is in use (stage_rank_pool_use; the executor sets it
 * around creating its chunks' engines, NULL after) adopts it. Reference counted: the
 * creator's reference (dropped with stage_rank_pool_drop) and each stage's; the last frees
 * it. NULL when out of memory. */
typedef struct stage_rank_pool stage_rank_pool;
stage_rank_pool *stage_rank_pool_new(int n, size_t unit, size_t group_bytes);
void stage_rank_pool_use(stage_rank_pool *pool);
void stage_rank_pool_drop(stage_rank_pool *pool);

/* Activations one micro-batch keeps between its forward and its backward. */
typedef struct {
    int busy, n;
    int unit;            /* a shared pool's unit bound to the slot while acquired (−1) */
    const float *input;  /* the stage's input for this micro-batch (caller keeps it alive) */
    stage_slot_layer *layers; /* per local layer: its storage and outputs, and the split
                                 backward's output gradient (src/engine/stage_plan.h) */
    float *whole_out;    /* tensor shards: the stage's output gathered whole */
    int row;             /* batched weight gradients: the micro-batch's first row in the
                            step's stash (stage_slot_set_row) */
} stage_slot;

/* Scratch of one worker thread. A micro-batch is cut into chunks of samples that run
 * through all the stage's layers. */

typedef struct {
    float *work;            /* convolution scratch for one chunk */
    float *scratch[2];      /* gradients flowing backward through one chunk */
} stage_worker;

/* Chunks are dealt to G = max(threads, STAGE_MIN_GROUPS) gradient groups (chunk c to group
 * c mod G), each summed into its own zeroed buffer; a micro-batch's gradient is then
 * g0 + g1 + ... in group order. Results are therefore the same for every thread count up to
 * STAGE_MIN_GROUPS, and in every layout. Where each micro-batch's gradient is formed and
 * added is the shared rule of src/engine/stage_plan.h (stage_plan_grad_target): so the
 * step's gradient is G0 + G1 + ... over micro-batches, each Gm independent of the others,
 * which lets data-parallel replicas reproduce one process bit for bit
 * (src/reduce/reduce.h, method "ordered"). */
enum { STAGE_MIN_GROUPS = 4 };

struct pool;

typedef struct {
    stage_plan plan;        /* the layout and the rules every engine shares: net, layers,
                               local layers, parameter offsets, sizes, gradient targets and
                               the backward by ranges under way */
    int n_slots;
    float *memory;          /* owned: params */
    float *opt_memory;      /* owned: m | v, from the first stage_alloc_optim (NULL before) */
    float *params, *grads, *opt_m, *opt_v;
    stage_slot *slots;      /* owned */
    stage_slot_layer *slot_layers; /* owned: [n_slots · nl], each slot's layers */
    void *slot_memory;      /* owned: every slot's activations (NULL with shared slots) */
    stage_rank_pool *rank_pool; /* a reference: the rank's shared memory, or NULL */
    int shared_slots;       /* the slots are rank_pool's units */
    int threads, chunk_max; /* worker threads; samples per chunk (0: from the batch) */
    int chunk_min;          /* the least samples per chunk when chunk_max is 0 */
    int groups;             /* gradient groups, see STAGE_MIN_GROUPS */
    int bf16;               /* the products in bf16 (--precision bf16): the layers run
                               layer_kernels_cpu_bf16(), the batched weight gradients
                               kernel_dense_weight_grad_units_bf16 */
    stage_worker *workers;  /* one per thread: owned (own_workers), or rank_pool's */
    int own_workers;
    float **group_grads;    /* owned (but [0] may be the stage's grads): one per group */
    float *mb_grads;        /* owned: a micro-batch's gradient after the first */
    /* The gradient arrays (grads, mb_grads, group_grads[1..]) are whole pages
     * (src/base/pages.h) of grads_bytes each, backed only where written: a run with one
     * micro-batch per step never touches mb_grads. The groups are formed a wave of
     * `threads` at a time into group_grads[1..threads], whose pages (and mb_grads') move
     * into group_pool once summed and back in at the next backward's runs: the groups hold
     * one backward range per thread (one layer with split_groups), not a whole array per
     * group. release_zero (ZeRO-2, stage_enable_release): stage_zero_grad gives the
     * gradients' pages back instead of writing zeros. */
    size_t grads_bytes;
    int release_zero;
    pages_pool *group_pool; /* own_groups, or rank_pool's */
    pages_pool own_groups;
    int counts_groups;      /* stage_grads_resident counts group_pool's pages (one stage of
                               those sharing it) */
    /* a backward of several layers with several groups runs one layer at a time through the
     * carry, so that the group buffers and mb_grads hold one layer's gradients each, when
     * the carry costs less than the buffers held whole would (stage.c groups_by_layer) */
    int split_groups;
    /* one chunk per group (stage_folds): the groups are added to group 0 product by product
     * as they are formed (stage_fold_group), in a part per thread, not the group buffers;
     * fold_floats (0: no fold); fold_part owned, or the rank pool's part */
    size_t fold_floats;     /* a part's floats (whole pages), one part per thread */
    float *fold_part;
    _Atomic int *fold_done; /* owned, several threads: each group's folds in the wave */
    struct pool *pool;      /* owned */
    /* stage_backward_range: where each chunk's running gradient waits between ranges
     * (owned, max_batch · widest floats, allocated at the first range that needs it) */
    float *carry;
    long step;              /* optimizer steps taken */
    /* zero-bubble split backward (stage_enable_split): per-slot output gradients */
    int split;
    void *split_memory;     /* owned */
    /* batched weight gradients (stage_enable_batched_wgrad; plan.wgrad_rows rows): dense
     * layers keep every micro-batch's input and output-gradient rows of the step, and their
     * weight gradient is one product over all of them (stage_wgrad_flush) */
    float **stash_x, **stash_g; /* per local layer: [wgrad_rows][in], [wgrad_rows][out]
                                 * (dense layers only; else NULL); one owned block */
    void *stash_memory;
    size_t stash_bytes;
    /* tensor shards (stage_init_shard, plan.tp): the collectives */
    stage_tensor_comm tp_comm;
    float *tp_buf;          /* owned: max_batch · widest floats for collectives */
    float *tp_din;          /* owned: the input gradient's slice before its all-gather */
    float *tp_dout;         /* owned: the slice of a gathered output's gradient */
    float *tp_loss;         /* owned: the loss on logits sharded by vocabulary
                               (stage_loss_floats) */
    float *tp_seq;          /* owned, sequence parallelism: max_batch · widest floats, a
                               block's whole rows between forward phases, and the packed
                               rows of a gathered or reduce-scattered gradient */
    float *tp_inner;        /* owned: the inner gradients of a layer in phases (a block cut
                               by heads) between its backward phases, max_batch ·
                               plan.phase_floats (every slot's gout unless split) */
    int tp_failed;          /* a collective failed: the forward or backward is void */
    /* ZeRO-3 (issue 27): called around each local layer's forward and backward (begins 1,
     * then 0 when it ends; backward 1 for the backward passes), so that the runtime can
     * gather the layer's parameters before and give them back after; the layers then run
     * one at a time. NULL: none, the layers run together. Nonzero from it: the pass is
     * void (tp_failed), the message set. */
    int (*layer_hook)(void *ctx, int layer, int backward, int begins);
    void *hook_ctx;
    double tp_s;            /* seconds in tensor collectives since stage_init */
} stage;

/* Allocates a stage for layers [first, last) of `net`, micro-batches of up to `max_batch`
 * samples, `n_slots` micro-batches in flight and `threads` worker threads (call BLAS
 * single-threaded then). Parameters start at zero. */
int stage_init(stage *s, const net_desc *net, int first, int last, int max_batch, int n_slots,
               int threads);
/* What stage_init(s, net, first, last, max_batch, n_slots, threads) allocates, in bytes,
 * without allocating it (the planner's memory figures; tests/test_stage.c holds the two
 * equal): parameters, gradients and both moment buffers; the gradient groups; the worker
 * threads' convolution workspace and scratch; and per slot (micro-batch in flight) the
 * activations: total = state + groups + workers + n_slots · slot. */
typedef struct {
    size_t state, groups, workers, slot;
    /* of `groups`, what is backed at a backward's peak (the page pool moves the rest:
     * src/cpu/stage.c move_group_pages): the group buffers of one wave (group_held), and
     * mb_grads (apart_held) in the micro-batches after the first. The planner counts these. */
    size_t group_held, apart_held;
    /* of group_held, the parts the threads fold the groups in (stage_folds; 0: none) */
    size_t fold_part;
    /* of `workers`, the threads' workspace and scratch (a rank's chunks share the largest:
     * stage_rank_pool) */
    size_t thread_scratch;
} stage_bytes;
stage_bytes stage_estimate(const net_desc *net, int first, int last, int max_batch, int threads);
/* The gradient groups that receive chunks of a micro-batch of max_batch samples (1: the
 * micro-batch's gradient is formed in place, no group arrays are written). */
int stage_estimate_groups(const net_desc *net, int max_batch, int threads);
/* The same for tensor rank t of `plan` (NULL or T = 1: stage_estimate). */
stage_bytes stage_estimate_shard(const net_desc *net, int first, int last, int max_batch,
                                 int threads, const shard_plan *plan, int t);
/* stage_init for tensor rank t of `plan` (not owned; NULL or T = 1: stage_init): the stage
 * holds rank t's shards of its layers, and runs the plan's collectives through `comm`.
 * A failed collective makes stage_forward return NULL and the backwards set tp_failed
 * (stage_tensor_failed); the message is set. */
int stage_init_shard(stage *s, const net_desc *net, int first, int last, int max_batch,
                     int n_slots, int threads, const shard_plan *plan, int t,
                     const stage_tensor_comm *comm);
static inline int stage_tensor_failed(const stage *s) { return s->tp_failed; }

/* Samples per chunk for a micro-batch of n: 16 in nets with convolutions, else
 * max(64, ⌈n / groups⌉), or for a language model max(⌈128 / T⌉, ⌈n / groups⌉); never
 * depends on the layout. */
int stage_chunk(const stage *s, int n);
void stage_free(stage *s);

/* PyTorch's default initialisation (U(±1/sqrt(fan_in)) for weights and biases), drawn
 * from the counter-based generator per layer, so it is the same in every layout. */
void stage_init_params(stage *s, uint64_t seed);

/* The output of the slot's last forward (whole: gathered with tensor shards). */
const float *stage_output(const stage *s, int slot);

/* Input/output values per sample as the stage receives and sends them: whole vectors, or
 * under sequence parallelism the rank's slice (shard_stage_in_count). */
size_t stage_in_count(const stage *s);
size_t stage_out_count(const stage *s);

/* Takes a free slot; returns its index or −1 (with a message) when all are busy. */
int stage_slot_acquire(stage *s);
void stage_slot_release(stage *s, int slot);

/* Forward of n samples (n ≤ max_batch) from `in` (kept alive by the caller until the
 * backward). sample_ids: each sample's index in the data set (dropout masks depend on
 * it); step: the optimizer step (dropout stream). training = 0 turns dropout off.
 * Returns the output (owned by the slot). */
const float *stage_forward(stage *s, int slot, const float *in, int n,
                           const int64_t *sample_ids, uint64_t seed, uint64_t step,
                           int training);
/* Backward of the slot's micro-batch from the gradient of its output; parameter gradients
 * accumulate. din (may be NULL) receives the gradient of the stage's input. */
void stage_backward(stage *s, int slot, const float *dout, float *din);
/* The same, but the micro-batch's gradient alone goes to `grads` (param_count floats, any
 * contents before), bit for bit what stage_backward would add for it; the stage's own
 * gradients are left alone. NULL: stage_backward. Replicas that reduce in a fixed order
 * keep each micro-batch's gradient apart this way (src/reduce/reduce.h). */
void stage_backward_to(stage *s, int slot, const float *dout, float *din, float *grads);
/* The backward of the slot's micro-batch through the stage's local layers [lo, hi) only,
 * so that data-parallel replicas can reduce the upper layers' gradients while the lower
 * ones are computed. Called for consecutive ranges from the top: hi = last − first first,
 * then each next hi = the previous lo, down to lo = 0, with no other backward, zeroing or
 * step of the stage in between (forwards may run). dout is read by the first range, din
 * (may be NULL) written by the last; `grads` as in stage_backward_to, the same for every
 * range. Together the ranges are stage_backward_to(s, slot, dout, din, grads), bit for bit,
 * and once a range returns, the gradients of its layers' parameters, [plan.param_off[lo],
 * stage_param_end(s, hi)), hold the micro-batch's contribution. Returns 0, or −1 with a
 * message (ranges out of order, no memory for the carried gradients). */
int stage_backward_range(stage *s, int slot, int lo, int hi, const float *dout, float *din,
                         float *grads);
/* Offset in params/grads where local layer i's parameters start (i = last − first: the
 * parameter count). */
static inline size_t stage_param_end(const stage *s, int i)
{
    return stage_plan_param_end(&s->plan, i);
}

/* Zero-bubble split of the backward into the input gradient (B) and the parameter
 * gradients (W). stage_enable_split allocates, per slot, the output gradient of every
 * layer with parameters that has no home in the slot (stage_split_slot_bytes,
 * layer_gout_kept_floats: a whole block's B leaves most of its in its own used-up rows),
 * and the layer norms' weight-gradient sums of each gradient group, which B forms
 * (layer_norm_sum_floats; W adds them). stage_backward_input runs B of the
 * slot's micro-batch (din may be NULL) and keeps those gradients; the slot must stay
 * acquired until its W. stage_backward_weight runs W for the local layers [lo, hi) (call
 * it for ranges from the top, hi = layer count first, down to lo = 0, as
 * stage_backward_range; `grads` as in stage_backward_to). B then W is
 * stage_backward_to bit for bit, whatever runs between them. */
int stage_enable_split(stage *s);
size_t stage_split_slot_bytes(const net_desc *net, int first, int last, int max_batch);
/* The same at `threads` threads (their gradient groups' layer-norm sums; 0: the rule
 * without them, the CUDA engine's) as rank t of tensor shards `tp` runs the layers (tp
 * NULL: whole layers). */
size_t stage_split_slot_bytes_shard(const net_desc *net, int first, int last, int max_batch,
                                    int threads, const shard_plan *tp, int t);
int stage_backward_input(stage *s, int slot, const float *dout, float *din);
int stage_backward_weight(stage *s, int slot, int lo, int hi, float *grads);

/* Batched weight gradients of dense layers: every backward (whole, by range, or B) copies
 * the dense layers' input and output-gradient rows of its micro-batch into a stash of
 * `rows` rows (the step's samples), at the slot's row (stage_slot_set_row, before the
 * backward), and leaves those layers' gradients alone; stage_wgrad_flush then forms them
 * in one product per layer over all rows (dw = G^T·X, db = column sums of G, written, not
 * added), in fixed tiles of output units, so the result does not depend on the thread
 * count or the pipeline layout (for the same micro-batches: the forward's products round
 * differently for another micro-batch size). Convolutions keep per-micro-batch
 * gradients (their products are large already). stage_wgrad_row_bytes: stash bytes per
 * row. Not with `grads` other than NULL (gradient pieces). */
int stage_enable_batched_wgrad(stage *s, int rows);
size_t stage_wgrad_row_bytes(const net_desc *net, int first, int last);
void stage_slot_set_row(stage *s, int slot, int row);
void stage_wgrad_flush(stage *s, int lo, int hi);

/* The loss at the net's last layer: softmax cross-entropy of `rows` rows of logits y (the
 * slot's stage_forward output) against labels, its gradient into dlogits (NULL: none)
 * scaled by grad_scale, *correct the rows whose first argmax is the label: what
 * kernel_softmax_xent_cpu returns. With logits sharded by vocabulary over the tensor group
 * (stage_loss_sharded: shard_plan.loss_sharded and this stage ends the net), y and dlogits
 * are this rank's columns of each row, and the group computes the loss of the whole rows,
 * the same on every rank (two all-gathers of a few floats per row, not the logits); not
 * bit for bit the whole kernel's (the sums of exponentials are cut). A failed collective:
 * NaN and stage_tensor_failed. stage_loss_floats: the scratch it needs (0: none). */
double stage_loss(stage *s, const float *y, float *dlogits, int *correct,
                  const int32_t *labels, int rows, float grad_scale);
int stage_loss_sharded(const stage *s);
size_t stage_loss_floats(const net_desc *net, int last, int max_batch, const shard_plan *tp);

/* ZeRO-2: the gradients' pages given back where they are dead (release_zero above); −1
 * with a message when no addresses are left for the groups' page pool. */
int stage_enable_release(stage *s);
/* Zeroes the gradients; ends a stage_backward_range sequence left unfinished. */
void stage_zero_grad(stage *s);
/* Bytes of the gradient arrays (grads, mb_grads, group_grads[1..], group_pool) backed now
 * (pages_resident: measured, not computed). */
size_t stage_grads_resident(const stage *s);
/* One optimizer update of every parameter from the accumulated gradients (−1 with a
 * message for an unknown optimizer). */
int stage_step(stage *s, const optimizer_config *opt);
/* The optimizer's moment buffers m and v (zeroed), if not yet there: stage_step makes them
 * at the first update; the state's readers and writers before it. */
int stage_alloc_optim(stage *s);

#endif
