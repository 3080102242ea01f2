/* The compute side of one rank's pipeline stage: where its parameters, activations and
 * micro-batch buffers live (host memory for the CPU engine, a GPU for the CUDA engine)
 * and how they are computed. The executor (src/runtime/exec.c) owns the schedule and the MPI
 * messages and reaches buffers only through this interface, so one executor runs stages
 * on either device.
 *
 * Work may be asynchronous: the CUDA engine queues forward, backward and step on a stream
 * and returns at once. What the executor may rely on:
 *   - an outgoing message buffer (ACT_OUT, GRAD_OUT of m) holds its bytes once
 *     engine_msg_ready says so after engine_msg_prepare;
 *   - an incoming buffer (ACT_IN, GRAD_IN of m) may be handed to MPI from the return of
 *     engine_msg_buffer until engine_msg_received is called for it;
 *   - engine_finish waits for everything queued; only then are the loss sums and the
 *     times of the timed operations ("ticks") known.
 * Every function returns 0, or −1 with a message (src/base/error.h). */
#ifndef PT_ENGINE_H
#define PT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "src/engine/stage_plan.h"
#include "src/io/data.h"
#include "src/model/net.h"
#include "src/model/shard.h"

typedef enum { ENGINE_CPU = 0, ENGINE_CUDA } engine_device;

/* --precision: how the CUDA engine multiplies in dense and conv layers (kernels_cuda.h's
 * kernel_cuda_precision, the same numbers); the CPU engine takes FP32 only. */
typedef enum { ENGINE_FP32 = 0, ENGINE_TF32, ENGINE_BF16 } engine_precision;

typedef enum {
    ENGINE_MSG_ACT_IN = 0, /* activation of m from the previous stage: the stage's input */
    ENGINE_MSG_GRAD_IN,    /* gradient of the stage's output of m, from the next stage */
    ENGINE_MSG_ACT_OUT,    /* the stage's output of m, for the next stage */
    ENGINE_MSG_GRAD_OUT,   /* gradient of the stage's input of m, for the previous stage */
} engine_msg;

typedef struct {
    const net_desc *net;  /* not owned; must outlive the engine */
    int first, last;      /* layers [first, last) */
    int buffers;          /* micro-batch buffers: m in [0, buffers) (the executor uses
                             two per micro-batch, and at least 3 to evaluate) */
    int message_buffers;  /* CPU engine: buffers of GRAD_OUT, m's being m mod
                             message_buffers (0: buffers). Only the samples need two per
                             micro-batch (the next step's are loaded while this one runs); a
                             step's messages are all waited for by its end */
    int receive_buffers;  /* CPU engine: buffers of ACT_IN the same way (0:
                             message_buffers): fewer where the executor posts each receive
                             once its buffer is free (schedule_receive_buffers) */
    int receive_grad_buffers; /* CPU engine: buffers of GRAD_IN so (0: receive_buffers) */
    int send_buffers;     /* CPU engine: buffers of GRAD_OUT the same way (0:
                             message_buffers): fewer where the executor waits for m − n's
                             send before m's backward (schedule_send_buffers) */
    int max_batch;        /* samples per micro-batch */
    int n_slots;          /* micro-batches whose activations are held at once */
    int batch;            /* samples per optimizer step: the loss gradient is scaled 1/batch */
    int threads;          /* CPU engine: worker threads */
    int device;           /* CUDA engine: device number */
    int device_messages;  /* CUDA engine: message buffers in device memory (the MPI library
                             is CUDA-aware); else pinned host buffers */
    int max_ticks;        /* timed operations per step: tick in [0, max_ticks) or −1 */
    int debug_ready_delay; /* testing (CPU engine): an outgoing message reports ready only
                              at its (1 + this)-th msg_ready poll, as a GPU copy would */
    int grad_pieces;      /* data parallel, method "ordered": 0 or 1, the micro-batches'
                             gradients add up in the stage's gradients; P > 1, micro-batch m's
                             gradient is kept apart in piece m mod P (piece 0 is the stage's
                             gradients), each formed on its own (stage_backward_to), so that
                             replicas can sum every micro-batch's gradient in one fixed order */
    int microbatches;     /* M of a step: buffer b holds micro-batch b mod M of its half */
    int split_backward;   /* zero-bubble schedules: backward_input and backward_weight */
    int wgrad_rows;       /* > 0: dense layers' weight gradients batched over this many
                             rows, the step's samples (stage_enable_batched_wgrad), formed
                             at the backward of micro-batch M − 1 (the last, schedules
                             backward in micro-batch order) */
    int recompute;        /* a training forward keeps only its input (and output, to send);
                             recompute(m) rebuilds the activations before the backward */
    const shard_plan *shard; /* tensor shards (NULL or T = 1: whole layers; not owned):
                                the engine holds rank shard_rank's shards of its layers, its
                                param_count and parameter buffers are that rank's, and the
                                collectives go through tensor_comm */
    int shard_rank;
    stage_tensor_comm tensor_comm;
    int kept_outputs;     /* recompute: outputs kept at once (the verifier's inputs-kept
                             peak: a micro-batch's output waits from its forward until its
                             backward has made sure the send is done); 0: buffers */
    engine_precision precision; /* CUDA engine: the products' precision (0: FP32) */
} engine_config;

typedef struct engine engine;

/* ZeRO (--zero ≥ 1, src/runtime/replicas.h): a run of the stage's flat parameter array,
 * elements [off, off + count), whose optimizer state this replica keeps. */
typedef struct {
    size_t off, count;
} engine_run;

/* ZeRO-3 (engine_ops.params_shard): called around each pass of local layer `layer` (begins 1
 * before it runs, 0 after; backward 0 for a forward or recompute, 1 for the backward
 * passes): the runtime gathers the layer's parameters before and gives them back after.
 * Nonzero: the pass fails (the message set). */
typedef int (*engine_layer_hook)(void *ctx, int layer, int backward, int begins);

typedef struct {
    double loss_sum; /* last stage: summed loss over the labels (a sample's one, or a
                        language model's T) forwarded since the last finish; 0 elsewhere */
    long correct;    /* last stage: labels that are the first argmax of their scores */
    int nonfinite;   /* a micro-batch's loss was NaN or infinite */
} engine_result;

typedef struct {
    const char *name; /* "cpu", "cuda" */
    void (*destroy)(engine *);
    /* PyTorch's default initialisation from the counter-based generator (stage_init_params). */
    int (*init_params)(engine *, uint64_t seed);
    /* The stage's parameters in stage order (per layer: weight, then bias), host memory. */
    int (*read_params)(engine *, float *host);
    int (*write_params)(engine *, const float *host);
    /* The optimizer's state in the same order: the first and second moment buffers
     * (momentum uses m; Adam m and v; both param_count floats, zeros where unused) and the
     * number of updates taken (Adam's bias correction). For checkpoints. */
    int (*read_state)(engine *, float *m, float *v, long *updates);
    int (*write_state)(engine *, const float *m, const float *v, long updates);
    /* Micro-batch m's samples `ids` of `d`: stage 0 takes their pixels (or a language
     * model's token ids), the last stage their labels (data_model_labels of the net per
     * sample), a stage with dropout their ids. */
    int (*load)(engine *, int m, const dataset *d, const int64_t *ids, int n);
    /* Takes an activation slot for m and runs the forward of n samples (the input being
     * stage 0's loaded pixels, else ACT_IN of m); training = 0 turns dropout off. The last
     * stage adds the loss of m to the sums and, training, writes its gradient for the
     * backward. step numbers the dropout stream. */
    int (*forward)(engine *, int m, int n, uint64_t seed, uint64_t step, int training, int tick);
    /* Backward of m from GRAD_IN (the loss gradient on the last stage); parameter gradients
     * accumulate; GRAD_OUT of m receives the input's gradient (not on stage 0). */
    int (*backward)(engine *, int m, int tick);
    /* Data parallel: the backward of m through the stage's local layers [lo, hi) only
     * (0 ≤ lo < hi ≤ the stage's layer count), called for consecutive ranges from the top
     * (hi = layer count first, then each next hi = the previous lo, down to lo = 0); the
     * ranges together are backward(m), bit for bit. Once the range is done (for the CUDA
     * engine: once grads_host can see it) the parameter gradients of layers [lo, hi) hold
     * m's contribution, so a reduction of those layers can start while the lower layers
     * are computed. GRAD_OUT of m is written by the range with lo = 0. */
    int (*backward_range)(engine *, int m, int lo, int hi, int tick);
    /* Zero-bubble split (split_backward): B, the gradient of m's input (GRAD_OUT; the
     * activations stay held), and W, the parameter gradients of local layers [lo, hi)
     * from what B kept, for consecutive ranges from the top as backward_range; W releases
     * nothing (release(m) follows). B then W is backward(m), bit for bit. NULL where the
     * engine has no split. */
    int (*backward_input)(engine *, int m, int tick);
    int (*backward_weight)(engine *, int m, int lo, int hi, int tick);
    /* recompute: takes a slot for m again and re-runs its training forward from the input
     * kept (same dropout masks); the loss is not counted twice. NULL: not supported. */
    int (*recompute)(engine *, int m, uint64_t seed, uint64_t step, int tick);
    /* Gradients [off, off + count) of piece `piece` (0 unless grad_pieces > 1) in host
     * memory that MPI may read and write: the CPU engine's own, or for the CUDA engine a
     * pinned mirror filled from the device (waiting for the queued work that writes it). */
    int (*grads_host)(engine *, int piece, size_t off, size_t count, float **host);
    /* MPI wrote the reduced gradients [off, off + count) into piece 0's host range from
     * grads_host: the next step uses them (CUDA: copied back to the device). */
    int (*grads_commit)(engine *, size_t off, size_t count);
    /* Zeroes the accumulated gradients without an update (a data-parallel replica that does
     * not take the step itself, method reduce-bcast or gather-bcast). */
    int (*zero_grads)(engine *);
    /* Frees m's slot (after its backward, or its evaluation forward and send). */
    int (*release)(engine *, int m);
    /* One optimizer update from the accumulated gradients, which are then zeroed. */
    int (*step)(engine *, const optimizer_config *, int tick);
    /* Where MPI reads or writes message `msg` of m (host memory, or device memory when
     * msg_on_device). In elements: ACT_IN and GRAD_OUT max_batch·in_count floats, ACT_OUT
     * and GRAD_IN max_batch·out_count. ACT_OUT is only valid after m's forward. */
    void *(*msg_buffer)(engine *, engine_msg, int m);
    /* MPI has written the incoming message (ACT_IN, GRAD_IN) of m. */
    int (*msg_received)(engine *, engine_msg, int m);
    /* Starts filling the outgoing buffer (ACT_OUT, GRAD_OUT) of m from its computation. */
    int (*msg_prepare)(engine *, engine_msg, int m);
    /* *ready = 1 once the outgoing buffer holds its bytes (never blocks). */
    int (*msg_ready)(engine *, engine_msg, int m, int *ready);
    /* Waits for all queued work; returns and resets the loss sums; fills tick_t0/tick_t1. */
    int (*finish)(engine *, engine_result *);
    /* ZeRO: from now on the optimizer keeps m and v of these runs only (ascending, disjoint;
     * Σ count floats each, allocated here: the whole arrays are never made) and step
     * updates only their parameters (every gradient is still zeroed). read_state and
     * write_state keep whole arrays: they read and write the runs' positions, read_state
     * leaving the others as they were. Once, before the first step. NULL: no ZeRO. */
    int (*optim_shard)(engine *, const engine_run *runs, int n);
    /* ZeRO: the stage's parameters in host memory that MPI may write (the all-gather that
     * follows each replica's step of its shard), holding at least the current values of
     * the optim_shard runs (CUDA: a pinned mirror they are copied into, after the queued
     * work). NULL: no ZeRO. */
    int (*params_host)(engine *, float **host);
    /* ZeRO: MPI wrote the parameters into params_host's memory: the next forward uses them
     * (CUDA: copied back to the device). NULL: params_host is the parameters themselves
     * (the CPU engine), nothing to do. */
    int (*params_commit)(engine *);
    /* ZeRO-2: from now on zeroing the gradients gives their memory back (they read as
     * zero) rather than writing zeros, and grads_release may be called. Once, before the
     * first step. NULL: the engine cannot shard its gradients. */
    int (*grads_shard)(engine *);
    /* ZeRO-2: gradients [off, off + count) of piece `piece` are not needed again before the
     * step (a bucket's sum outside this replica's shard, or a piece already summed): their
     * memory goes back (CPU: whole pages into a pool that grads_fill takes from, the rest
     * to the system), and they read as zero until written. */
    int (*grads_release)(engine *, int piece, size_t off, size_t count);
    /* ZeRO-2: gradients [off, off + count) of piece `piece`, released at the last step, are
     * about to be formed again (their bucket's backward part begins): the engine may back
     * them with the memory it kept from releases (CPU: pages moved, not faulted in), reading
     * as zero where the backward adds to them. Once per release. NULL: none kept. */
    int (*grads_fill)(engine *, int piece, size_t off, size_t count);
    /* ZeRO-3: from now on `hook` is called around every layer's forward and backward (the
     * layers then run one at a time), and params_release may be called; the engine may keep
     * up to `keep` bytes of released memory for params_fill. Once, before the first forward.
     * NULL: the engine cannot shard its parameters. */
    int (*params_shard)(engine *, engine_layer_hook hook, void *ctx, size_t keep);
    /* ZeRO-3: parameters [off, off + count) are not needed until gathered again: the whole
     * pages inside go back (CPU: into a pool of at most `keep` bytes that params_fill takes
     * from, the rest to the system; the partial ends stay). */
    int (*params_release)(engine *, size_t off, size_t count);
    /* ZeRO-3: parameters [off, off + count), released, are about to be gathered (every
     * element written): the engine may back them with memory kept from releases (CPU:
     * pages moved, not faulted in; they hold old values until written). NULL: none kept. */
    int (*params_fill)(engine *, size_t off, size_t count);
    /* Bytes for the parameters and the optimizer's state (m and v; none before the first
     * update or write_state unless sharded), allocated now, and the gradients' (with the
     * pieces kept apart) peak backed bytes, measured at each step and each grads_release
     * (CPU: pages_resident): the memory figures of --json. ZeRO-3: the parameters' peak
     * backed bytes, measured at the end of each layer's pass (before its release). NULL:
     * not known. */
    void (*state_bytes)(const engine *, size_t *params, size_t *grads, size_t *optim);
} engine_ops;

struct engine {
    const engine_ops *ops;
    engine_config cfg;
    size_t param_count;   /* of the stage */
    size_t in_count, out_count; /* values per sample of the stage's input and output */
    size_t slot_bytes;    /* activation bytes one slot holds at max_batch */
    int msg_on_device;    /* message buffers are device memory (CUDA-aware MPI) */
    double tensor_s;      /* tensor shards: seconds in the tensor group's collectives since
                             the engine was created, as of the last finish */
    double *tick_t0, *tick_t1; /* [max_ticks], pt_now() seconds, valid after finish; a
                                  tick not used since the last finish has t1 < t0 */
    void *impl;
};

/* Destroys an engine made by any engine's constructor (NULL: nothing). Engines are made by
 * engine_create (src/runtime/engine_create.h), which picks the device. */
void engine_destroy(engine *e);

/* For engine implementations: the common fields and the tick arrays (tick times start
 * "unused"), once cfg passed engine_config_check; engine_base_free releases what
 * engine_base_init allocated. */
int engine_base_init(engine *e, const engine_ops *ops, const engine_config *cfg);
void engine_base_free(engine *e);
/* The rules of a configuration every engine keeps (−1 with a message): counts in range, the
 * step's micro-batch count where a schedule needs it, batched weight gradients not with
 * gradient pieces. */
int engine_config_check(const engine_config *cfg);
/* Gradient pieces of the engine: grad_pieces, at least 1. */
static inline int engine_pieces(const engine_config *cfg)
{
    return cfg->grad_pieces > 1 ? cfg->grad_pieces : 1;
}
/* The gradient piece of buffer m's micro-batch: m mod P, or −1 without pieces (its gradient
 * then goes to the stage's; stage_plan_grad_target). */
static inline int engine_piece_of(const engine_config *cfg, int m)
{
    return cfg->grad_pieces > 1 ? m % cfg->grad_pieces : -1;
}
/* The loss gradient's scale: the mean over every label of the step's batch when training
 * (batch × T for a language model, a label per position: F.cross_entropy's mean). */
static inline float engine_loss_scale(const engine_config *cfg, int training)
{
    return training ? 1.0f / (float)((double)cfg->batch * data_model_labels(cfg->net)) : 1.0f;
}
/* recompute: a training forward gives its activations back at once and keeps only its
 * output to send (not on the last stage, whose loss gradient is in GRAD_IN) until
 * recompute(m). */
static inline int engine_drops_activations(const engine_config *cfg, int training)
{
    return cfg->recompute && training;
}
/* grads_host and grads_commit: −1 with a message unless [off, off + count) lies in the
 * stage's parameters and piece is one of the engine's. what: "host view", "commit". */
int engine_grads_range_check(const engine *e, int piece, size_t off, size_t count,
                             const char *what);
/* ZeRO: one update of the runs' parameters (flat offsets into whole->params and grads)
 * whose moments m and v are compact (run after run), with the element-wise kernels of k:
 * bit for bit the update stage_optim_step makes of those elements (AdamW's decay chosen
 * per layer from whole->plan as there). Counts one update (whole->step). */
int engine_optim_step_runs(const optim_kernels *k, void *ctx, const stage_optim_state *whole,
                           float *m, float *v, const engine_run *runs, int n,
                           const optimizer_config *o);
/* Bytes of the runs: Σ count. */
size_t engine_runs_count(const engine_run *runs, int n);
/* Buffer m holds its step's last micro-batch (batched weight gradients are formed at its
 * backward: schedules run backwards in micro-batch order). */
static inline int engine_last_microbatch(const engine *e, int m)
{
    return m % e->cfg.microbatches == e->cfg.microbatches - 1;
}
/* The first row of buffer m's micro-batch in the step's batched weight-gradient stash. */
static inline int engine_stash_row(const engine *e, int m)
{
    return m % e->cfg.microbatches * e->cfg.max_batch;
}
/* The stage layout: per-sample input and output counts, parameters, slot bytes. */
void engine_stage_sizes(const net_desc *net, int first, int last, size_t *in_count,
                        size_t *out_count, size_t *param_count);

static inline int engine_load(engine *e, int m, const dataset *d, const int64_t *ids, int n)
{
    return e->ops->load(e, m, d, ids, n);
}
static inline int engine_forward(engine *e, int m, int n, uint64_t seed, uint64_t step,
                                 int training, int tick)
{
    return e->ops->forward(e, m, n, seed, step, training, tick);
}
static inline int engine_backward(engine *e, int m, int tick)
{
    return e->ops->backward(e, m, tick);
}
static inline int engine_backward_range(engine *e, int m, int lo, int hi, int tick)
{
    return e->ops->backward_range(e, m, lo, hi, tick);
}
static inline int engine_backward_input(engine *e, int m, int tick)
{
    return e->ops->backward_input(e, m, tick);
}
static inline int engine_backward_weight(engine *e, int m, int lo, int hi, int tick)
{
    return e->ops->backward_weight(e, m, lo, hi, tick);
}
static inline int engine_recompute(engine *e, int m, uint64_t seed, uint64_t step, int tick)
{
    return e->ops->recompute(e, m, seed, step, tick);
}
static inline int engine_grads_host(engine *e, int piece, size_t off, size_t count,
                                    float **host)
{
    return e->ops->grads_host(e, piece, off, count, host);
}
static inline int engine_grads_commit(engine *e, size_t off, size_t count)
{
    return e->ops->grads_commit(e, off, count);
}
static inline int engine_zero_grads(engine *e) { return e->ops->zero_grads(e); }
static inline int engine_release(engine *e, int m) { return e->ops->release(e, m); }
static inline int engine_step(engine *e, const optimizer_config *o, int tick)
{
    return e->ops->step(e, o, tick);
}
static inline void *engine_msg_buffer(engine *e, engine_msg k, int m)
{
    return e->ops->msg_buffer(e, k, m);
}
static inline int engine_msg_received(engine *e, engine_msg k, int m)
{
    return e->ops->msg_received(e, k, m);
}
static inline int engine_msg_prepare(engine *e, engine_msg k, int m)
{
    return e->ops->msg_prepare(e, k, m);
}
static inline int engine_msg_ready(engine *e, engine_msg k, int m, int *ready)
{
    return e->ops->msg_ready(e, k, m, ready);
}
static inline int engine_finish(engine *e, engine_result *r) { return e->ops->finish(e, r); }
static inline int engine_init_params(engine *e, uint64_t seed)
{
    return e->ops->init_params(e, seed);
}
static inline int engine_read_params(engine *e, float *host)
{
    return e->ops->read_params(e, host);
}
static inline int engine_write_params(engine *e, const float *host)
{
    return e->ops->write_params(e, host);
}
static inline int engine_read_state(engine *e, float *m, float *v, long *updates)
{
    return e->ops->read_state(e, m, v, updates);
}
static inline int engine_write_state(engine *e, const float *m, const float *v, long updates)
{
    return e->ops->write_state(e, m, v, updates);
}

#endif
