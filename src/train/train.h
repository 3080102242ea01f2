/* The `pipetrain train` sub-command: its entry, and the state of one run (train_run), which
 * the set-up fills and the loop, checkpoints and reports read. */
#ifndef PT_TRAIN_H
#define PT_TRAIN_H

#include <mpi.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/io/data.h"
#include "src/model/net.h"
#include "src/model/shard.h"
#include "src/reduce/reduce.h"
#include "src/runtime/cuda_plugin.h"
#include "src/runtime/exec.h"
#include "src/runtime/replicas.h"
#include "src/train/train_options.h"
#include "topologies/topo.h"

/* One run of `train` on this rank: its options (threads resolved), where it runs, and what
 * its set-up built. */
typedef struct {
    train_options o;
    MPI_Comm comm;              /* the world: every rank of the job */
    int rank, size;             /* in the world */
    /* where this rank sits: world rank = t + T·(s·R + r) for tensor shard t (tensor_rank)
     * of stage s (stage) in replica r (replica), with T tensor shards and R replicas: tensor
     * groups are consecutive ranks */
    int stage, replica;
    int tensor_rank;
    reduce_comms comms;         /* its pipeline (rank = stage) and its stage's replicas,
                                   among the ranks of its tensor index */
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
    dataset train, val, test;   /* a language model's val: its evaluation windows */
    /* a language model's text (src/train/train_text.h): the corpus's training part, the
     * batches of two steps (step mod 2: one trained on, the next one loading), and the
     * whole corpus's size and digest, which checkpoints keep */
    text_tokens corpus;
    dataset batches[2];
    long batch_step[2];
    size_t corpus_tokens, val_tokens;
    uint64_t corpus_digest;
    int labels_per_sample;      /* per sample: 1, or T next tokens (data_model_labels) */
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
    float last_lr;              /* the last step's learning rate (the schedule's) */
    double last_grad_norm;      /* and its gradient norm before clipping (NAN: none) */
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

/* Runs after MPI_Init on every rank; returns the process exit status. */
int train_main(int argc, char **argv);

#endif
