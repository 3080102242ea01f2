/* `pipetrain launch`: the job's command, read as train reads it (src/cli/launch_job.c), and
 * the loop that runs it, watches it and restarts it (src/cli/cmd_launch.c). */
#ifndef PT_LAUNCH_H
#define PT_LAUNCH_H

#include "src/train/train_options.h"

typedef struct {
    char **argv;  /* owned array of owned strings, NULL-terminated: the command to run */
    int argc;
    int fixed;    /* argv[fixed..argc) are launch's own additions (--resume, the layout) */
    int launcher; /* 0: pipetrain itself; 1: mpiexec/mpirun; 2: srun */
    int pt;       /* index of the pipetrain binary ("train" follows) */
    char *resume; /* the checkpoint directory, once the job resumes from it (owned) */
    long stages, replicas, microbatches; /* a re-planned layout (0: the job's own) */
    int unshard;  /* the re-planned layout has one replica: --zero 0 (ZeRO needs two) */
} launch_job;

/* Copies the command and finds its parts; −1 with a message (then launch_job_free). */
int launch_job_parse(launch_job *j, int argc, char **argv);
void launch_job_free(launch_job *j);
/* The train options as `pipetrain train` reads them (train_options_parse, its own table):
 * 0, 1 for --help, −1 with its message. Pointers in *o point into j->argv. */
int launch_job_options(const launch_job *j, train_options *o);
/* The launcher's rank count: its index in argv, or −1 (then one rank). */
int launch_job_ranks_at(const launch_job *j);
/* From now on the job resumes from DIR (its --load dropped: the checkpoint sets the
 * parameters). −1 with a message. */
int launch_job_resume(launch_job *j, const char *dir);
/* Rewrites the rank count to n and re-plans the layout from what train would run
 * (cmd_launch.c's header says how); the new layout in k, r, m. −1 with a message. */
int launch_job_replan(launch_job *j, long n, long *k, long *r, long *m);
/* The command as one line (malloc'd; NULL when out of memory). */
char *launch_job_joined(const launch_job *j);

#endif
