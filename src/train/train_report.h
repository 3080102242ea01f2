/* What `pipetrain train` tells its user (src/train/train_report.c): the banner, the progress
 * while it trains, the per-stage figures and the final report as text or one JSON object.
 * The run itself fills train_run (src/train/train.h; its set-up, src/train/train_setup.c)
 * and train_results (src/train/train.c); these functions only read them. */
#ifndef PT_TRAIN_REPORT_H
#define PT_TRAIN_REPORT_H

#include <jansson.h>

#include "src/train/train.h"

/* What the training loop measured; NAN where a figure does not exist (no --val, no test
 * samples). Then which outputs were written. */
typedef struct {
    long steps;                 /* the last step reached, counted from the run's beginning */
    long first_step;            /* the checkpoint's step when resuming, else 0 */
    long epochs;
    double t_begin;             /* pt_now() when training began (wall_s counts from it) */
    double train_s;             /* inside the epochs' steps, evaluation left out */
    double timed_s;             /* steps after --untimed-steps */
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
    long rollbacks; /* --post-validation: steps rolled back and taken again (every rank's) */
    int chunks;    /* model chunks: K·V (interleaved), else K */
    double *chunk; /* [t · chunks + c]: seconds in ops of kind t (exec_time) of model chunk
                    * c, the mean over replicas; owned */
    int ranks;     /* the job's */
    double *rank_mem; /* [RANK_MEM_KINDS · ranks]: per world rank, bytes allocated for the
                       * parameters, gradients and optimizer state (NAN: the engine does
                       * not say) and its peak resident set (getrusage); owned */
} stage_figures;

enum { RANK_MEM_PARAMS = 0, RANK_MEM_GRADS, RANK_MEM_OPTIM, RANK_MEM_PEAK, RANK_MEM_KINDS };

/* Rank 0, unless --json: model, data, layout and (for a pipeline) the schedule's timeline. */
void train_report_banner(const train_run *run);
/* Rank 0, unless --json: the line of the epoch that just ended (res->epochs); from: the
 * step it (re)started after, so that a resumed epoch says which steps its figures cover. */
void train_report_epoch(const train_run *run, const train_results *res, double epoch_s,
                        long epoch_samples, long from);
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
    long first;                 /* the step the run started after (a resumed checkpoint's) */
    long steps;                 /* steps so far, by this process */
    int bar_width;              /* characters of the bar line on screen, to erase it */
} train_progress;

void train_progress_init(train_progress *p, const train_run *run, long first);
/* After each step: step_s its duration, loss the epoch's mean loss so far. */
void train_progress_step(train_progress *p, const train_run *run, long epoch, double step_s,
                         double loss);
/* Erases the bar (before other output); nothing in the other modes. */
void train_progress_clear(train_progress *p);

#endif
