/* What realises a plan: the mpiexec command line or the Slurm job script that starts each
 * rank on the node and cores `plan` chose for it, with the same layout and cut. */
#ifndef PT_PLAN_EMIT_H
#define PT_PLAN_EMIT_H

#include <stdio.h>

#include "partition/partition.h"
#include "topologies/topo.h"

typedef enum { PLAN_EMIT_MPIEXEC = 1, PLAN_EMIT_SLURM } plan_emit_kind;

typedef struct {
    plan_emit_kind kind;
    const char *model;
    int stages, replicas, nodes, batch, microbatches;
    const char *schedule;
    const char *train_options; /* the rest, already formatted ("--reduce ordered ..."), or "" */
    int cuda;
} plan_emit_args;

/* Writes the command (mpiexec: one line; slurm: a job script). A node whose ranks' cores
 * are laid out differently from the first node's cannot be bound by one flag: the ranks
 * then bind themselves (--bind auto) and a comment says so. −1 with a message for a model
 * path that needs quoting beyond what the shell text can carry. */
int plan_emit(FILE *out, const plan_emit_args *a, const partition *part,
              const topo_placement *pl);

#endif
