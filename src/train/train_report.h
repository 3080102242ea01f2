/* What `pipetrain train` tells its user (src/train/train_report.c): the banner, the progress while
 * it trains, the per-stage figures and the final report as text or one JSON object. The run
 * itself (src/train/train.c) fills train_run and train_results; these functions only read them. */
#ifndef PT_TRAIN_REPORT_H
#define PT_TRAIN_REPORT_H

#include <jansson.h>
#include <mpi.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/runtime/cuda_plugin.h"
#include "src/io/data.h"
#include "src/runtime/exec.h"
#include "src/model/net.h"
#include "src/reduce/reduce.h"
#include "src/runtime/replicas.h"
#include "topologies/topo.h"
#include "src/train/train_options.h"

/* One run of `train` on this rank: its options (threads resolved), where it runs, and what
 * its set-up built. */
typedef struct {
    train_options o;
    MPI_Comm comm;              /* the world: every rank of the job */
    int rank, size;             /* in the world */
    int stage, replica;         /* where this rank sits: world rank = stage × replicas + replica */
    reduce_comms comms;         /* its pipeline (rank = stage) and its stage's replicas,
                                   among the ranks of its tensor index */
    int tensor_rank;            /* tensor shards: world rank = tensor_rank + T × (the rank
                                   above); tensor groups are consecutive ranks */
    MPI_Comm tensor;            /* its stage's tensor group (rank = tensor_rank), or
                                   MPI_COMM_NULL; tensor_world: the ranks of its tensor index */
    MPI_Comm tensor_world;
    shard_plan shard;           /* how the layers are cut (T = 1: not) */
    net_desc local_net;         /* the net as this rank runs it (T > 1) */
    double tensor_alpha, tensor_beta; /* T > 1: the tensor group's all-reduce latency (s)
                                   and bandwidth (bytes/s), measured at the start */
    replicas_config rep;        /* the hybrid mode's settings, from the options */
    topo_link reduce_link;      /* between a group's ranks: prices the predicted reductions */
    char host[256];
    char start_time[32];        /* ISO 8601 UTC, e.g. 2026-11-23T10:04:05Z */
    int gpu, device_messages;   /* --device cuda: the rank's GPU and how MPI sends from it */
    cuda_device_info gpu_info;
    net_desc net;
    partition part;
    schedule sched;
    dataset train, val, test;
    exec_t *ex;
    int64_t *order;             /* this epoch's sample order */
    long steps_per_epoch;
    long total_steps;           /* what --steps and --epochs ask for together */
    long epochs;                /* epochs the run touches (the last may be partial) */
    double read_s;              /* reading the data set (this rank's) */
    /* --metrics: the file (rank 0), and on every rank the totals at the last step line
     * (per stage: compute, wall, exposed reduction) and that interval's running sums */
    struct metrics *metrics;
    double *metrics_prev;
    double metrics_t, metrics_loss;
    long metrics_samples, metrics_correct, metrics_step;
    int metrics_failed;         /* rank 0: a line could not be written (reported once) */
    long resumed_from_step;     /* --resume: the checkpoint's step (−1: a fresh start) */
    char resumed_from[4096];    /* and its file */
    long last_checkpoint_step;  /* the step of the last checkpoint written (−1: none) */
    /* checkpoints in progress (src/train/train_checkpoint.c): the background writer (rank 0),
     * the --checkpoint-minutes decision in flight, and what checkpoints cost */
    struct ckpt_writer *ckpt_writer;
    MPI_Request ckpt_req;
    int ckpt_flag;
    double ckpt_t_last;
    long ckpt_written;
    double ckpt_hold_s;         /* training held: gathers and waits for an earlier write */
    double ckpt_write_s;        /* rank 0: writing files (in the background, or not) */
} train_run;

/* What the training loop measured; NAN where a figure does not exist (no --val, no test
 * samples). Then which outputs were written. */
typedef struct {
    long steps;
    long epochs;
    double t_begin;             /* pt_now() when training began (wall_s counts from it) */
    double train_s;             /* inside the epochs' steps, evaluation left out */
    double timed_s;             /* steps after --warmup */
    long timed_steps;
    double train_loss, train_acc; /* the last epoch's (or partial epoch's) means */
    double val_loss, val_acc, test_loss, test_acc;
    const char *saved, *traced; /* the checkpoint and trace written (NULL: none) */
} train_results;

/* Per-stage figures of the whole job, gathered on every rank (src/train/train.c): each stage's
 * mean over its replicas. reduce* are the reductions among the replicas (replicas_stats). */
typedef struct {
    int stages;
    double *compute, *wall, *forward, *backward, *optimizer, *peak_bytes, *peak_mb, /* one */
        *reduce, *reduce_exposed, *reduce_bytes,                                  /* block */
        *reduce_alpha, *reduce_beta, *reduce_bcast, /* measured at the start (replicas.h) */
        *tensor, *params, /* tensor collectives (s); parameters per rank (mean over shards) */
        *optimizer_max; /* per stage: the slowest replica's optimizer time (not the mean) */
    double bubble; /* measured: mean over stages of the idle fraction of the step time */
    long steps;
    int chunks;    /* model chunks: K·V (interleaved), else K */
    double *chunk; /* [t · chunks + c]: seconds in ops of kind t (exec_time) of model chunk
                    * c, the mean over replicas; owned */
} stage_figures;

/* Rank 0, unless --json: model, data, layout and (for a pipeline) the schedule's timeline. */
void train_report_banner(const train_run *run);
/* Rank 0, unless --json: the line of the epoch that just ended (res->epochs). */
void train_report_epoch(const train_run *run, const train_results *res, double epoch_s,
                        long epoch_samples);
/* Rank 0: the final report, as text or (--json) as the last line of stdout. −1 with a
 * message when the JSON object cannot be built. */
int train_report_final(const train_run *run, const train_results *res,
                       const stage_figures *fig);

/* The JSON object of what the run is (metadata and layout, known before the first step),
 * and that object with the results and per-stage figures added (what --json prints);
 * NULL when out of memory. The caller owns the result (json_decref). */
json_t *train_report_run_json(const train_run *run);
json_t *train_report_results_json(const train_run *run, const train_results *res,
                                  const stage_figures *fig);

/* Progress between the epoch lines, on rank 0 without --json: a bar redrawn in place on a
 * terminal, otherwise (under mpiexec, into a file) a line at the first step and then every
 * --progress seconds. Both show steps of the whole run, loss, samples/s and ETA. */
typedef struct {
    enum { PROGRESS_OFF, PROGRESS_BAR, PROGRESS_LINES } mode;
    double interval;            /* seconds between outputs */
    double start;               /* pt_now() before the first step */
    double last;                /* pt_now() of the last output */
    double step_s;              /* time inside steps so far */
    long steps;                 /* steps so far */
    int bar_width;              /* characters of the bar line on screen, to erase it */
} train_progress;

void train_progress_init(train_progress *p, const train_run *run);
/* After each step: step_s its duration, loss the epoch's mean loss so far. */
void train_progress_step(train_progress *p, const train_run *run, long epoch, double step_s,
                         double loss);
/* Erases the bar (before other output); nothing in the other modes. */
void train_progress_clear(train_progress *p);

#endif
