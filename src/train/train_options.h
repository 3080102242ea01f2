/* Options of `pipetrain train`: what they hold, their parsing and their help text. */
#ifndef PT_TRAIN_OPTIONS_H
#define PT_TRAIN_OPTIONS_H

#include <stdio.h>

#include "kernels/kernels.h"
#include "src/engine/engine.h"
#include "src/model/shard.h"
#include "src/base/mpi_wait.h"
#include "src/reduce/reduce.h"
#include "src/train/lr_schedule.h"

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"
/* --data's value that names the built-in text corpus */
#define TEXT_DATA_NAME "text"

/* train_options.text: where a language model's tokens come from */
enum { TEXT_NONE = 0, TEXT_FORTUNES, TEXT_UTF8, TEXT_LLMC, TEXT_RAW };

typedef struct {
    const char *model, *data, *load, *save, *trace, *schedule, *partition, *bind;
    /* IDX files by name, each pair instead of --data's (NULL: none); training files without
     * test files: no test set */
    const char *train_images, *train_labels, *test_images, *test_labels;
    /* a language model's corpus (src/io/text_data.h), instead of images: --data text (the
     * fortunes), --text FILE (UTF-8, byte tokens) or --tokens / --tokens-raw FILE (llm.c's
     * uint16 tokens with their header, or nanoGPT's without); text says which (TEXT_*) */
    int text;
    const char *text_file;
    double val_fraction;  /* the corpus's tail held out for validation (0: none) */
    int eval_windows;     /* evaluation windows spaced evenly over that tail */
    int data_given; /* --data given (even as its default): a language model then takes no
                       built-in corpus in its place */
    const char *text_option; /* --val-fraction or --eval-windows given with no corpus named:
                                a language model's default corpus takes it (train_setup) */
    engine_device device;
    engine_precision precision; /* --precision: the CUDA engine's products */
    int epochs, batch, stages, microbatches, threads, val, json, verbose, shuffle;
    int epochs_given;    /* --epochs was on the command line (else --steps alone decides) */
    double progress;     /* seconds between progress lines when stdout is no terminal */
    long steps, train_samples, test_samples;
    long untimed_steps;  /* --untimed-steps: this process's first steps, left out of timings */
    int warmup_alias;    /* the deprecated --warmup named them (a warning on rank 0) */
    double timeout;
    unsigned long long seed;
    optimizer_config opt; /* opt.lr: --lr as a float; opt.clip_norm: --clip-grad-norm */
    lr_schedule lr_sched; /* --lr (the decimal), --lr-schedule, --lr-warmup, --lr-min */
    int stall_rank, kill; /* testing: stop responding, or another fault (EXEC_STALL_*) */
    long stall_step;
    int ready_delay; /* testing: outgoing messages become ready late, as after a GPU copy */
    /* hybrid mode */
    int replicas;         /* data-parallel replicas of the pipeline (1: none) */
    int tensor;           /* tensor shards per stage (1: none) */
    tensor_mode tensor_mode;   /* TENSOR_SEQUENCE with --sequence-parallel */
    int sequence_parallel;
    reduce_method reduce; /* how a stage's replicas sum their gradients */
    double bucket_mb;     /* bucket size in MiB */
    int overlap;          /* reductions start during the backward pass */
    int zero;             /* --zero: ZeRO stage inside each replica group (0: none) */
    int zero3_prefetch;   /* --zero3-prefetch on: the next layer's gather during a layer */
    int zero_overlap;     /* --zero-overlap on: a bucket's reduce-scatter during the next's
                             backward (--zero 2 and 3) */
    int skip_bucket;      /* testing: a bucket left unreduced (−1: none) */
    mpi_wait_mode wait;    /* how MPI waits pass the time (--wait) */
    const char *metrics;  /* --metrics FILE.jsonl (NULL: none) */
    /* checkpoints to resume from (src/io/checkpoint_dir.h) */
    const char *ckpt_dir; /* --checkpoint-dir (NULL: none) */
    long ckpt_every;      /* a checkpoint every N steps (0: none by steps) */
    double ckpt_minutes;  /* and one when this many minutes have passed (0: none by time) */
    int ckpt_sync;        /* write in the foreground (else from a snapshot, in a thread) */
    int keep;             /* checkpoints kept */
    const char *resume;   /* --resume DIR|FILE (NULL: a fresh start) */
    long log_every;       /* a metrics "step" line every N steps */
    /* schedules beyond 1F1B */
    int virtual_stages;   /* --virtual V: model chunks per rank (interleaved) */
    const char *recompute; /* --recompute none|all|LIST */
    const char *schedule_file; /* --schedule-file FILE: the schedule to run, as text */
    double schedule_memory;    /* --schedule search: most micro-batches a rank holds; 0: any */
    int wgrad_batched;    /* --wgrad batched */
    int post_validation;  /* --post-validation (exec_config.post_validation) */
} train_options;

/* Fills o from argv (defaults first). Returns 0, 1 for --help, or −1 with a message. */
int train_options_parse(train_options *o, int argc, char **argv);
void train_options_usage(FILE *f);
/* Two of --save, --trace, --metrics naming one file, one of them an input (the model, the
 * corpus, the IDX files, the schedule file) or a file of --checkpoint-dir's own (a
 * checkpoint's name, a .pipetrain-* record): −1 with a message (rank 0 at start). */
int train_options_check_clashes(const train_options *o);

#endif
