/* The CUDA engine's private state, shared by engine_cuda.c (memory, parameters, samples,
 * finish), engine_cuda_run.c (forward, backward) and engine_cuda_msg.c (messages). Not
 * for other modules.
 *
 * The CUDA engine (src/engine/engine.h) is one pipeline stage resident on one GPU.
 * Every slot's activations and every micro-batch buffer live in ONE device allocation, the
 * parameters and the gradient blocks in one each (ZeRO-2 and 3 move them into mapped
 * ranges, cuda_vmm below), and every host staging buffer in one pinned allocation, all made
 * at creation. The optimizer's moments have their own, made at the first update (whole) or
 * by optim_shard (ZeRO: this replica's runs only, with a pinned mirror of the parameters
 * for the all-gather); nothing else is allocated while training. Work is queued
 * on three non-blocking streams: compute (the kernels and cuBLAS), h2d (samples and
 * incoming messages) and d2h (outgoing messages), so that copies overlap compute. Each
 * operation returns as soon as its work is queued; events (the ev_ fields) order the
 * streams:
 *
 *   per micro-batch m   loaded    h2d      samples of m copied        → forward of m waits
 *                       act_in    h2d      ACT_IN copied              → forward of m waits
 *                       grad_in   h2d      GRAD_IN copied             → backward of m waits
 *                       fwd       compute  forward of m done          → D2H of ACT_OUT waits;
 *                                                                       h2d waits before
 *                                                                       overwriting m's inputs
 *                       bwd       compute  backward of m done         → D2H of GRAD_OUT waits;
 *                                                                       h2d waits likewise
 *                       act_out   d2h      ACT_OUT copied to the host → msg_ready; m's input
 *                                                                       (which the output may
 *                                                                       alias) is rewritten
 *                                                                       only after it
 *                       grad_out  d2h      GRAD_OUT copied            → msg_ready; the next
 *                                                                       backward of m waits
 *                       late      compute  m's last recompute or W    → h2d waits likewise
 *                                          (they read m's input after
 *                                          its forward and its B)
 *   per slot            read      d2h      last copy out of the slot  → a forward reusing it
 *   per local layer     grads[k]  compute  the last write of layer i's → grads_host's copy of
 *                                          gradients, k = grads_ev[i]   them waits (on the
 *                                          (backward, step, zeroing,    grads stream)
 *                                          commit)
 *
 * With device messages (a CUDA-aware MPI reads and writes the device buffers) nothing is
 * copied: msg_ready queries fwd or bwd, and msg_buffer of an incoming message first waits
 * on the host for the kernels that still read that buffer (fwd, bwd of m).
 *
 * cudaStreamWaitEvent and cudaEventSynchronize on an event never recorded do not wait, so
 * the first use of every buffer needs no special case. Some waits (slot read, GRAD_OUT,
 * and h2d on fwd and bwd) are implied by the executor's protocol (a send completes before
 * its buffer is reused) and by the pipeline's data dependencies; they are kept so that the
 * engine stays correct for any order the interface allows.
 *
 * Data parallel (engine.h: backward_range, grads_host, grads_commit): the gradients have a
 * pinned host mirror per piece; grads_host copies a range of them out on a fourth stream,
 * the grads stream, once the compute work that last wrote those layers' gradients is done
 * (so a range's reduction can start while the lower layers are still computed), and waits
 * for that copy; grads_commit copies piece 0's mirror back on the compute stream, before
 * the step. Between the ranges of one micro-batch's backward the running gradient stays
 * where the previous range left it (range_g: GRAD_IN or one of the scratch buffers), as in
 * one whole backward: nothing else uses the scratch buffers (forwards use only `work` and
 * the slots), and another backward or a step is refused until the last range (zero_grads
 * abandons an unfinished one).
 *
 * Zero-bubble split (split_backward): B (backward_input) runs the backward's input halves
 * and keeps, per slot, the gradient of each parameter layer's output (stage_slot_layer.gout);
 * W (backward_weight) forms the parameter gradients of a range of layers from them with
 * the kernels' weight halves, into the same targets, with the same zeroing and adding, as
 * backward_range would (so B then W is backward, bit for bit, as on the CPU). Recomputation
 * (recompute): a training forward copies its output into the buffer's act_out (what
 * ACT_OUT then sends) and gives its slot back at once; recompute(m) runs the training
 * forward again into a fresh slot from the input the buffer still holds (no loss). Batched
 * weight gradients (wgrad_rows): dense layers copy each micro-batch's input and output-
 * gradient rows into a device stash (stash_x, stash_g) and skip their weight half; the
 * backward (or W) of the step's last micro-batch writes those layers' gradients in the
 * shared fixed tiles of output units (STAGE_WGRAD_TILE, src/engine/stage_plan.h).
 *
 * Tensor shards (engine_config.shard, src/model/shard.h): the engine holds rank
 * plan.tp_rank's shards (plan.loc: each local layer as this rank runs it; param_count is the
 * rank's) and runs the forward and the backward in runs of layers between the group's
 * collectives (src/engine/stage_plan.h's stage_tensor_forward and _backward, over the CUDA
 * stage_tensor_ops of engine_cuda_run.c): the all-reduce of an input-split layer's partial
 * output (then its bias and activation on the device), the all-gathers of sliced vectors,
 * and in the backward the all-reduce of an output-split layer's input gradient. A collective waits on the host for
 * the compute stream, then calls the executor's MPI collective on pinned host copies (or
 * on the device buffers themselves with CUDA-aware MPI); what follows is queued after it.
 * So a forward or backward with shards returns once its last collective is done (the work
 * after it stays queued). A transformer block cut by heads runs in phases between the
 * all-reduces of its partial sums (forward_phases, backward_phases: the shared loop's from
 * and to), its inner gradients kept in tp_inner between its backward phases; a language
 * model's head cut by vocabulary leaves its logits sharded, and the last stage's loss is
 * the vocabulary-parallel one (kernel_xent_shard_*, two all-gathers of a few floats a row),
 * as the CPU stage's.
 *
 * The layer loop is the one both engines drive (src/engine/layer_ops.h; the CUDA kernel set
 * is in engine_cuda_layers.c), with the whole micro-batch as one chunk: a GPU kernel fills the chip,
 * and each layer then sees the same shapes in every pipeline layout, so a layout does not
 * change the bits. The stage's layout and rules (gradient targets, the order of backward
 * ranges, initialisation, the update) are src/engine/stage_plan.h's, shared with the CPU. */
#ifndef PT_ENGINE_CUDA_IMPL_H
#define PT_ENGINE_CUDA_IMPL_H

#include "kernels/cuda/kernels_cuda.h"
#include "src/engine/engine.h"
#include "src/engine/stage_plan.h"
#include "src/model/layer_table.h"

/* LOSS_CAPACITY: per-micro-batch loss entries held on the device between two reads;
 * evaluation forwards thousands of chunks between finishes and drains them when full. */
enum { LOSS_CAPACITY = 1024 };

/* ZeRO-2 and 3 (engine_cuda_vmm.c): a float array at a reserved device address whose
 * physical memory is mapped per granule (cuMemGetAllocationGranularity's minimum: 2 MiB
 * on current GPUs). Every float is live (its value is needed) or released; a granule with
 * no live float is unmapped, its memory kept for the next map up to `keep` bytes. A float
 * made live again reads as zero where the caller asks (the gradients), or is about to be
 * written (the parameters' gathers). Unmapping is not ordered with the streams, so the
 * caller says when queued work may still touch a granule (defer: unmapped once an event
 * recorded on that stream is done) and otherwise has waited for it. */
typedef struct {
    int device;
    const char *what;        /* "gradients", "parameters": for messages */
    char *base;              /* the reserved range */
    int reserved;
    size_t bytes, gran, n;   /* the array's bytes; granule bytes; granules */
    unsigned long long *h;   /* [n] CUmemGenericAllocationHandle mapped there, 0: none */
    uint64_t *live;          /* one bit per float */
    size_t *nlive;           /* [n] live floats per granule */
    unsigned char *pending;  /* [n] 1 + the generation that marks it for a deferred unmap */
    int gen, has[2];         /* generation being marked; generations with marks */
    cudaEvent_t ev[2];       /* recorded when a generation was closed (flip) */
    unsigned long long *pool; /* kept handles */
    size_t n_pool, keep;
    size_t mapped, peak;     /* bytes mapped now (the pool counted in peak), the most */
} cuda_vmm;

int engine_cuda_vmm_init(cuda_vmm *v, int device, size_t floats, const char *what);
void engine_cuda_vmm_free(cuda_vmm *v);
/* [off, off + count) live, mapped where needed; with zero_on, the floats not live before are
 * zeroed on that stream. */
int engine_cuda_vmm_live(cuda_vmm *v, size_t off, size_t count, cudaStream_t zero_on);
/* [off, off + count) released; granules left with nothing live unmapped at once (the caller
 * has waited for the work that touches them) or, defer, marked in the current generation. */
int engine_cuda_vmm_release(cuda_vmm *v, size_t off, size_t count, int defer);
/* Closes the current generation (an event on `stream`, after the work that may still read
 * its granules) and unmaps the previous one's after waiting for its event: a deferred unmap
 * happens one flip later (ZeRO-3: one layer's pass later). */
int engine_cuda_vmm_flip(cuda_vmm *v, cudaStream_t stream);
/* Every deferred unmap done now (waits for the work queued on `stream`). */
int engine_cuda_vmm_settle(cuda_vmm *v, cudaStream_t stream);
/* Memory kept for the next maps: at most `bytes` from now on. */
int engine_cuda_vmm_keep(cuda_vmm *v, size_t bytes);
/* From `off` (< end): the end of the run of floats that are all live (*live 1) or all not. */
size_t engine_cuda_vmm_run(const cuda_vmm *v, size_t off, size_t end, int *live);

typedef struct {
    int busy, m, n;     /* held by micro-batch m since its forward of n samples */
    int training;       /* that forward trained (dropout on, loss gradient written) */
    int has_gout;       /* split backward: B has run since that forward */
    stage_slot_layer *layers; /* [nl], device memory; gout: split backward, layers with
                                 parameters (not batched ones), B's output gradient for W */
    float *whole_out;   /* tensor shards: the stage's sharded output all-gathered */
    cudaEvent_t ev_read; /* the last copy out of the slot's memory */
} cuda_slot;

typedef struct {
    /* device */
    float *in;       /* the stage's input: converted pixels (stage 0) or ACT_IN */
    float *grad_in;  /* GRAD_IN; on the last stage the loss gradient (with loss_in_place the
                        logits' storage in m's slot, set by each training forward) */
    float *grad_out; /* GRAD_OUT (not on stage 0) */
    uint8_t *pixels;
    int32_t *labels;
    int64_t *ids;
    /* pinned host */
    uint8_t *h_pixels;
    int32_t *h_labels;
    int64_t *h_ids;
    float *h_act_in, *h_grad_in, *h_act_out, *h_grad_out; /* host-staged messages only */
    float *act_out;    /* device, recompute (not on the last stage): the output of m's
                          training forward, ACT_OUT while its activations are dropped */
    cudaEvent_t ev_loaded, ev_act_in, ev_grad_in, ev_fwd, ev_bwd, ev_act_out, ev_grad_out;
    cudaEvent_t ev_late;
    int slot;          /* −1: none */
    int n;             /* samples of the last forward */
    int loaded_n;      /* samples of the last load */
    int has_grad_out;  /* a backward has written GRAD_OUT since the last forward */
    int act_out_prepared, grad_out_prepared;
    int act_kept;      /* recompute: ACT_OUT of m is act_out */
    int dropped;       /* recompute: m's last forward trained and dropped its activations */
} cuda_mb;

typedef struct {
    int device;
    kernel_cuda_ctx ctx; /* the compute stream and its cuBLAS handle */
    cudaStream_t h2d, d2h;
    cudaStream_t gstream; /* grads_host's copies out */
    stage_plan plan;   /* the stage's layout and shared rules: net, layers [first, last),
                          local layers, parameter offsets, gradient targets, ranges */
    int is_first, is_last, has_dropout, needs_load;
    int loss_in_place; /* the last stage's loss gradient overwrites the logits (as the
                          CPU engine's: layer_loss_in_place) */
    int dm; /* device messages (CUDA-aware MPI) */
    void *dmem, *hmem; /* the device and the pinned allocations */
    size_t dmem_bytes, hmem_bytes;
    float *params, *grads;
    /* params and the gradient blocks (grads | mb_grads | pieces 1..) have allocations of
     * their own (pmem, gmem), which ZeRO moves into mapped ranges: grads_shard (ZeRO-2)
     * the gradients into gv, params_shard (ZeRO-3) the parameters into pv */
    void *pmem, *gmem;
    size_t gblock;     /* bytes of one gradient block (param_count rounded) */
    cuda_vmm gv, pv;
    int zero2, zero3;
    engine_layer_hook zhook; /* ZeRO-3: the runtime's hook around each layer's pass */
    void *zhook_ctx;
    cudaEvent_t *ev_up;   /* ZeRO-3: [nl] the last upload of layer i from h_params */
    cudaEvent_t ev_shard_out; /* ZeRO-3: the step's shard copied into h_params */
    int z3_fresh;         /* ZeRO-3: no pass yet (the parameters are whole on the device) */
    int in_layer_end;     /* ZeRO-3: inside the hook after a pass (releases flip after it) */
    size_t params_peak;   /* ZeRO-3: the most mapped at the end of a pass (state_bytes) */
    /* the optimizer's whole moments, m then v in `omem` (a device allocation of their own,
     * made at the first update or write_state, as the CPU's stage_alloc_optim): a replica
     * under ZeRO never holds them */
    float *opt_m, *opt_v;
    void *omem;
    /* ZeRO (optim_shard): the runs this replica steps, their compact moments (zm then zv in
     * `zmem`, device) and the pinned mirror of the parameters that the all-gather writes
     * (params_host), uploaded by params_commit */
    engine_run *zruns;
    int n_zruns;
    float *zm, *zv;
    void *zmem;
    float *h_params;
    float *mb_grads;   /* a micro-batch's gradient after the first (stage_plan_grad_target) */
    int pieces;        /* grad_pieces, at least 1 */
    float **piece;     /* [pieces] device: [0] = grads, the others after mb_grads */
    float *h_grads;    /* pinned: [pieces · param_count], each piece's host mirror */
    cudaEvent_t *ev_grads; /* [nl], see the table above */
    int *grads_ev;         /* [nl]: which ev_grads follows the last write of layer i's */
    /* a backward by ranges in progress (plan.range_hi > 0): the running gradient between
     * ranges, and the scratch buffer it lives in (range_gi, −1 for GRAD_IN) */
    const float *range_g;
    int range_gi;
    float **stash_x, **stash_g; /* [nl]: dense layers' [wgrad_rows][in], [wgrad_rows][out] */
    size_t (*runs)[2]; /* [nl]: scratch of the backward's gradient runs */
    float *work, *scratch[2];
    double *d_loss, *h_loss; /* [LOSS_CAPACITY], last stage */
    int *d_correct, *h_correct;
    double *xent_loss;  /* device [KERNEL_XENT_PARTS], last stage: the loss's block parts */
    int *xent_right;
    int n_loss;         /* entries queued since the last drain */
    engine_result sums; /* drained entries, in forward order */
    long step;          /* optimizer steps since init_params */
    cuda_slot *slots;
    stage_slot_layer *slot_layers; /* [n_slots · nl] */
    cuda_mb *mb;             /* [buffers] */
    cudaEvent_t anchor;      /* timing origin: first timed op after a finish */
    double anchor_host;
    int anchored;
    cudaEvent_t *tick_ev; /* [2 · max_ticks]: begin, end */
    unsigned char *tick_used;
    /* tensor shards (plan.tp: engine_config.shard with T > 1) */
    float *tp_recv;            /* device messages: an all-gather's rank blocks */
    float *tp_dout, *tp_din;   /* device: a gathered output's gradient sliced; a sliced
                                  input's gradient before its all-gather */
    float *h_tp, *h_tp_send;   /* pinned, host-staged: a collective's buffers */
    float *tp_inner;           /* device: a block cut by heads' inner gradients between its
                                  backward phases (layer_gout_floats; one backward at a
                                  time, so every slot shares it; the split backward gives
                                  each slot its own) */
    /* the vocabulary-parallel loss (the last stage of a language model whose head is cut by
     * vocabulary, shard_plan.loss_sharded; kernel_xent_shard_*): per row this rank's step
     * output (3 floats), every rank's ([T][rows][3]), the maximum and argmax (2), each row's
     * loss and hit; pinned copies of the first two when host-staged */
    float *xs_mine, *xs_all, *xs_ma;
    double *xs_loss;
    int *xs_right;
    float *h_xs_mine, *h_xs_all;
} cuda_engine;

static inline cuda_engine *engine_cuda_impl(engine *e) { return e->impl; }

/* engine_cuda_layers.c: kernels/cuda/kernels_cuda.h as the shared layer loop's device
 * (src/engine/layer_ops.h); ctx is the engine's kernel_cuda_ctx. */
extern const layer_kernels layer_kernels_cuda;
/* engine_cuda_optim.c: the optimizer updates as stage_optim_step's device set. */
extern const optim_kernels optim_kernels_cuda;

/* engine_cuda.c: helpers of both files. Each returns 0, or −1 with a message. */
int engine_cuda_check_m(const engine *e, int m, const char *what);
/* Prefixes the kernel's message with the operation, layer and micro-batch (m < 0: none). */
int engine_cuda_layer_fail(const char *what, int layer, int m);
/* Timed operations (tick ≥ 0): tick_check first (range; the anchor after a finish), then
 * tick_begin once the operation's waits are queued, tick_end after its work. */
int engine_cuda_tick_check(engine *e, int tick);
int engine_cuda_tick_begin(engine *e, int tick);
int engine_cuda_tick_end(engine *e, int tick);
/* Synchronises the compute stream and adds the queued losses to c->sums in order. */
int engine_cuda_loss_drain(cuda_engine *c);
/* Work just queued on the compute stream wrote the gradients of local layers [lo, hi). */
int engine_cuda_grads_written(cuda_engine *c, int lo, int hi);

/* engine_cuda_optim.c: the whole moments allocated (zeroed on the compute stream) unless
 * they are already, or ZeRO keeps runs; the engine_ops entries of the same names. */
int engine_cuda_alloc_moments(engine *e, cuda_engine *c);
int engine_cuda_read_state(engine *e, float *m, float *v, long *updates);
int engine_cuda_write_state(engine *e, const float *m, const float *v, long updates);
int engine_cuda_optim_shard(engine *e, const engine_run *runs, int n);
int engine_cuda_params_host(engine *e, float **host);
int engine_cuda_shard_to_host(cuda_engine *c);
int engine_cuda_params_commit(engine *e);
void engine_cuda_state_bytes(const engine *e, size_t *params, size_t *grads, size_t *optim);

/* engine_cuda.c: the gradient blocks (grads | mb_grads | pieces 1..) from base g. */
void engine_cuda_grad_blocks(cuda_engine *c, char *g);

/* engine_cuda_zero.c: ZeRO-2 and 3 (the engine_ops entries of the same names, and the
 * engine's own steps of them). */
int engine_cuda_grads_shard(engine *e);
int engine_cuda_grads_release(engine *e, int piece, size_t off, size_t count);
int engine_cuda_grads_fill(engine *e, int piece, size_t off, size_t count);
int engine_cuda_params_shard(engine *e, engine_layer_hook hook, void *ctx, size_t keep);
int engine_cuda_params_release(engine *e, size_t off, size_t count);
int engine_cuda_params_fill(engine *e, size_t off, size_t count);
void engine_cuda_zero_free(engine *e, cuda_engine *c);
int engine_cuda_grads_live(cuda_engine *c, float *arr, int lo, int hi);
int engine_cuda_zero2_zero(cuda_engine *c, size_t P);
int engine_cuda_zero2_host(cuda_engine *c, int piece, float *mirror, size_t off, size_t count);
int engine_cuda_zero2_commit(cuda_engine *c, const float *mirror, size_t off, size_t count);
int engine_cuda_layer_begin(engine *e, int l, int backward);
int engine_cuda_layer_end(engine *e, int l, int backward);
int engine_cuda_zero3_step(engine *e, cuda_engine *c);
int engine_cuda_zero3_read(engine *e, cuda_engine *c, float *host);
int engine_cuda_zero3_write(engine *e, cuda_engine *c, const float *host);

/* The slot's output as the stage sends it: whole (gathered with tensor shards). */
static inline const float *engine_cuda_slot_output(const cuda_engine *c, const cuda_slot *s)
{
    return s->whole_out ? s->whole_out : s->layers[c->plan.nl - 1].out;
}

/* engine_cuda_run.c (forward, backward) and engine_cuda_msg.c (messages): the engine_ops
 * entries of the same names. */
int engine_cuda_forward(engine *e, int m, int n, uint64_t seed, uint64_t step, int training,
                        int tick);
int engine_cuda_backward(engine *e, int m, int tick);
int engine_cuda_backward_range(engine *e, int m, int lo, int hi, int tick);
int engine_cuda_backward_input(engine *e, int m, int tick);
int engine_cuda_backward_weight(engine *e, int m, int lo, int hi, int tick);
int engine_cuda_recompute(engine *e, int m, uint64_t seed, uint64_t step, int tick);
int engine_cuda_release(engine *e, int m);
void *engine_cuda_msg_buffer(engine *e, engine_msg k, int m);
int engine_cuda_msg_received(engine *e, engine_msg k, int m);
int engine_cuda_msg_prepare(engine *e, engine_msg k, int m);
int engine_cuda_msg_ready(engine *e, engine_msg k, int m, int *ready);

#endif
