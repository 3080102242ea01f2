/* The executor: one MPI rank per pipeline stage runs its schedule list with non-blocking
 * point-to-point messages, waiting politely (MPI_Test + short sleep, because ranks may
 * outnumber cores) and giving up after a timeout. Sequential training is the same code
 * with one stage. In hybrid mode the job runs R replicas of the pipeline (src/runtime/replicas.h):
 * each replica trains on its share of every batch, and each stage's gradients are reduced
 * among its replicas by the schedule's ALLREDUCE / REDUCE_WAIT instructions. */
#ifndef PT_EXEC_H
#define PT_EXEC_H

#include <mpi.h>
#include <stdint.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/io/data.h"
#include "src/engine/engine.h"
#include "src/runtime/replicas.h"
#include "src/cpu/stage.h"

typedef struct exec exec_t; /* opaque: holds MPI requests and buffers */

typedef struct {
    int batch, microbatches;
    int threads;           /* worker threads of this rank's stage */
    double timeout_s;      /* a wait longer than this fails the step */
    int trace;             /* record events for exec_write_trace */
    int stall_rank;        /* testing: this rank stops responding at stall_step (−1: never) */
    long stall_step;
    int stall_kills;       /* testing: ... or another fault there (EXEC_STALL_*) */
    engine_device device;  /* where the stage runs */
    int gpu;               /* CUDA device number (device == ENGINE_CUDA) */
    int device_messages;   /* CUDA: MPI sends device memory (CUDA-aware MPI) */
    engine_precision precision; /* CUDA: the products' precision (--precision) */
    int debug_ready_delay; /* testing: see engine_config */
    MPI_Comm world;        /* every rank of the job (comm itself with one replica): losses,
                              evaluation, trace */
    /* hybrid mode: rep.replicas > 1 replicas of the pipeline */
    int wgrad_batched;     /* dense layers' weight gradients in one product per step */
    int post_validation;   /* the optimizer steps before the norm's checks arrive and is
                              rolled back where they say so (exec_postval.c) */
    MPI_Comm group;        /* the replicas of this rank's stage, rank = replica */
    int replica;           /* this rank's replica */
    replicas_config rep;
    /* tensor shards (shard NULL or T = 1: none): this rank is tensor_rank of its stage's
     * tensor group `tensor` (rank = tensor index); comm and group then join the ranks of
     * this tensor index. local_net: the net as this rank runs it (shard_local_net), whose
     * layers' parameter counts the replicas' reductions use. */
    const shard_plan *shard;
    int tensor_rank;
    MPI_Comm tensor;
    const net_desc *local_net;
} exec_config;

/* Testing faults at stall_rank:stall_step (exec_config.stall_kills): stop responding, die
 * of SIGKILL, or make one invalid MPI call (a send of −1 floats) as a bug would. */
enum { EXEC_STALL_HANG = 0, EXEC_STALL_KILL = 1, EXEC_STALL_MPI_ERROR = 2 };

typedef struct {
    double loss_sum;       /* summed over the batch's labels (every rank gets it): one per
                              sample, T per sample for a language model (data_model_labels) */
    long correct;          /* labels predicted (first argmax): next tokens for a language
                              model */
    double grad_norm;      /* the whole model's gradient norm before clipping, on every rank
                              (optimizer_config.clip_norm > 0), else NAN */
} exec_step_result;

/* The first global sample id of replica r's micro-batch m (of B/(R·M) samples): replica r
 * takes [r·B/R, (r+1)·B/R) of the batch B, cut into its M micro-batches in order. A step's
 * samples are keyed by these ids (the data set's indices[id], a language model's window
 * id, dropout masks), so every layout of stages, replicas and micro-batches trains on the
 * same samples. */
static inline size_t exec_first_sample(int batch, int replicas, int replica, int microbatches,
                                       int m)
{
    size_t share = (size_t)(batch / replicas);
    return (size_t)replica * share + (size_t)m * (share / (size_t)microbatches);
}

/* What the per-chunk times of exec_stats.chunk_s count: forward, whole backward, the split
 * backward's B and W, and recomputation. */
typedef enum {
    EXEC_TIME_FORWARD = 0, EXEC_TIME_BACKWARD, EXEC_TIME_BACKWARD_INPUT,
    EXEC_TIME_BACKWARD_WEIGHT, EXEC_TIME_RECOMPUTE, EXEC_TIMES
} exec_time;

/* Per-rank figures since exec_init (or the last exec_reset_stats). */
typedef struct {
    double compute_s;      /* forward, backward, loss and optimizer time */
    double forward_s, backward_s, optimizer_s; /* its parts */
    double wall_s;         /* time inside training steps */
    long steps;
    size_t peak_act_bytes; /* most activation bytes held at once (slots in use × slot size) */
    int peak_microbatches; /* most micro-batches whose activations were held at once */
    int chunks;            /* model chunks this rank runs (exec_chunks) */
    const double *chunk_s; /* [chunk · EXEC_TIMES + t]: seconds per chunk in each kind of
                            * op (exec_time), owned by the executor */
    double tensor_s;       /* tensor shards: seconds in the tensor group's collectives */
    replicas_stats reduce; /* hybrid mode: the stage's reductions (zeros otherwise) */
    replicas_calibration reduce_cal; /* and their α–β figures measured at exec_start */
    long rollbacks;        /* --post-validation: steps rolled back and taken again */
} exec_stats;

/* Builds this rank's stage (stage = rank in comm, the ranks of its pipeline) on its device
 * from the partition, checks the schedule with the verifier and sizes the activation slots
 * from its peak; each micro-batch has batch / (replicas × microbatches) samples. The
 * stage's parameters start undefined: initialise or load them through exec_engine(). */
int exec_init(exec_t **e, MPI_Comm comm, const net_desc *net, const partition *part,
              const schedule *sched, const exec_config *cfg);
void exec_free(exec_t *e);
/* Collective over the world, after every rank's exec_init succeeded: sets up the reductions
 * among the stage's replicas and measures them (replicas_calibrate, a few reductions of
 * the gradient buffers: call it before the parameters are set or the first step); with a
 * trace, measures the ranks' clocks against world rank
 * 0's and sets the trace's origin. */
int exec_start(exec_t *e);
engine *exec_engine(exec_t *e);
/* Interleaved schedules: the V model chunks this rank holds (1 otherwise); chunk v is
 * model chunk v·K + stage of the partition's K·V, run by engine v (NULL out of range). */
int exec_chunks(const exec_t *e);
engine *exec_chunk_engine(exec_t *e, int v);
int exec_rank(const exec_t *e);
int exec_stages(const exec_t *e);

/* exec_train_step's failure when every rank knows of it (a non-finite loss): the job can
 * end cleanly. Other failures (−1, timeouts) are local: the caller must end the job. */
#define EXEC_FAILED_EVERYWHERE (-2)

/* One optimizer step on `batch` samples of `data` given by `indices` (data-set indices,
 * the same array on every rank; replica r takes [r·batch/R, (r+1)·batch/R) of it, cut
 * into its micro-batches: exec_first_sample). next_indices (may be NULL) are the next
 * step's, of next_data (NULL: data; a language model's next batch is another data set):
 * they are loaded once this step is queued, so a GPU copies them in while it computes.
 * step numbers the dropout stream. opt is the step's update (its lr the schedule's for this
 * step); before it, a tied head's gradients are summed and, with opt->clip_norm > 0, the
 * whole model's gradient is clipped (exec_finish.c: then collective over the world, every
 * rank with the same opt). Fails with a message on a timeout or a non-finite loss (then
 * every rank that can still talk fails too). */
int exec_train_step(exec_t *e, const dataset *data, const int64_t *indices,
                    const dataset *next_data, const int64_t *next_indices, uint64_t seed,
                    uint64_t step, const optimizer_config *opt, exec_step_result *res);
/* Forward only, dropout off, over the whole data set in chunks of the micro-batch size
 * (replica r takes the share [r·N/R, (r+1)·N/R) of the N samples). Loss (the mean over
 * every label: a language model's tokens) and accuracy (the share of labels predicted) of
 * the whole set on every rank. */
int exec_evaluate(exec_t *e, const dataset *data, double *loss, double *accuracy);

/* The whole model's parameters in layer order on the pipeline's stage 0 (count = net
 * param_count), from every stage. `all` is only written there and may be NULL elsewhere.
 * Collective over the pipeline (one replica's ranks), and with tensor shards over each
 * stage's tensor group first (whole tensors: the result is on tensor rank 0's stage 0). */
int exec_gather_params(exec_t *e, float *all);
/* The same for checkpoints: the parameters and, with with_m / with_v (the same on every
 * rank), the optimizer's moment buffers (whole model each into m, v on rank 0) and the
 * updates taken. Every wait is polite and under --timeout. */
int exec_gather_state(exec_t *e, float *params, float *m, float *v, int with_m, int with_v,
                      long *updates);
/* ZeRO (--zero): the optimizer's shards are gathered inside each stage's replica group;
 * the replicas other than 0 take part in exec_gather_state's gathers (with_m or with_v)
 * through this, collective over each group. */
int exec_zero_state_send(exec_t *e);
/* ZeRO-3: the replicas other than 0 take part in the parameters' gathers of
 * exec_gather_params and of exec_gather_state without moments (nothing to do otherwise). */
int exec_zero_params_send(exec_t *e);

void exec_get_stats(const exec_t *e, exec_stats *st);
void exec_reset_stats(exec_t *e);
/* Collective over the world: measures the clocks again, and world rank 0 writes one Chrome
 * trace JSON of every rank's events on its clock (docs/TRACE.md); every rank returns rank
 * 0's result. */
int exec_write_trace(exec_t *e, const char *path);

#endif
