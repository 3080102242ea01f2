/* The set-up of a `train` run (src/train/train_setup.c): everything before the first step,
 * agreed on by every rank, and the collective error handling the whole run uses. */
#ifndef PT_TRAIN_SETUP_H
#define PT_TRAIN_SETUP_H

#include <mpi.h>

#include "src/train/train.h"

/* Every rank calls this after a phase with its own status. If any failed, the lowest
 * failing rank prints its message (naming rank and host when there are several ranks) and
 * every rank returns −1, so that all of them exit non-zero. */
int train_agree(int status, MPI_Comm comm, double timeout);
/* Ends the job on every rank, with this rank's message: a rank that timed out cannot count
 * on the others. */
void train_abort_job(MPI_Comm comm);

/* Collective, first: fills *run's place in the world and start time, parses the options
 * (the same on every rank, or the job ends), checks the job's rank count and sets up
 * threads, binding and the GPU. 0 when done, 1 when --help was printed (nothing to run),
 * −1 when the input is at fault (a message printed): the exit status is then
 * PT_EXIT_USAGE, which `pipetrain launch` never restarts. Only on 0 is there anything to
 * free (after train_setup_run). */
int train_setup_start(train_run *run, int argc, char **argv);
/* Collective, after train_setup_start: the output paths checked, the layout's
 * communicators, model, tensor shards, partition, schedule, data, executor and the
 * parameters (seeded, or --load), and the run's step counts. −1 when it fails on any rank
 * (one of them says why); free *run with train_run_free either way. */
int train_setup_run(train_run *run);
void train_run_free(train_run *run);

#endif
