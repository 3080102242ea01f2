#include "src/plan/emit.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"

/* The shell word for s: single-quoted unless it is plainly safe. */
static void put_word(FILE *out, const char *s)
{
    if (*s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                        "_-./,:=+@%") == strlen(s)) {
        fputs(s, out);
        return;
    }
    fputc('\'', out);
    for (; *s; s++) {
        if (*s == '\'') fputs("'\\''", out);
        else fputc(*s, out);
    }
    fputc('\'', out);
}

/* The cut as train's counts ("3,8"), so train runs the plan's partition. */
static void put_counts(FILE *out, const partition *part)
{
    for (int s = 0; s < part->stages; s++)
        fprintf(out, "%s%d", s ? "," : "", part->first[s + 1] - part->first[s]);
}

/* 1 when every node that holds ranks lays them out as node 0 does (the same count, and in
 * local rank order the same core lists), so one binding flag serves them all. */
static int uniform_nodes(const topo_placement *pl, int nodes)
{
    int *local = calloc((size_t)nodes, sizeof *local);
    int ok = local != NULL;
    /* the k-th rank of node n must have the k-th core list of node 0 */
    int **idx = ok ? calloc((size_t)nodes, sizeof *idx) : NULL;
    ok = ok && idx;
    for (int n = 0; ok && n < nodes; n++) {
        idx[n] = malloc((size_t)pl->n_ranks * sizeof **idx + 1);
        ok = idx[n] != NULL;
    }
    for (int i = 0; ok && i < pl->n_ranks; i++) {
        int n = pl->places[i].node;
        idx[n][local[n]++] = i;
    }
    for (int n = 1; ok && n < nodes; n++) {
        if (local[n] == 0) continue; /* a node the plan leaves empty binds nothing */
        if (local[n] != local[0]) ok = 0;
        for (int k = 0; ok && k < local[0]; k++) {
            const topo_place *a = &pl->places[idx[0][k]], *b = &pl->places[idx[n][k]];
            ok = a->n_cores == b->n_cores &&
                 !memcmp(a->cores, b->cores, (size_t)a->n_cores * sizeof *a->cores);
        }
    }
    for (int n = 0; idx && n < nodes; n++) free(idx[n]);
    free(idx);
    free(local);
    return ok;
}

/* Node 0's ranks' core lists in local order, as hydra's user binding: "0+1,2+3". */
static void put_hydra_binding(FILE *out, const topo_placement *pl)
{
    int first = 1;
    for (int i = 0; i < pl->n_ranks; i++) {
        const topo_place *p = &pl->places[i];
        if (p->node != 0) continue;
        fputs(first ? "" : ",", out);
        first = 0;
        for (int c = 0; c < p->n_cores; c++) fprintf(out, "%s%d", c ? "+" : "", p->cores[c]);
    }
}

/* Node 0's ranks' cores as Slurm's mask_cpu list: "0x3,0xC". */
static void put_slurm_masks(FILE *out, const topo_placement *pl)
{
    int first = 1;
    for (int i = 0; i < pl->n_ranks; i++) {
        const topo_place *p = &pl->places[i];
        if (p->node != 0) continue;
        /* a hexadecimal mask of any width: digits from the highest core down */
        int top = 0;
        for (int c = 0; c < p->n_cores; c++)
            if (p->cores[c] > top) top = p->cores[c];
        fputs(first ? "0x" : ",0x", out);
        first = 0;
        for (int d = top / 4; d >= 0; d--) {
            int v = 0;
            for (int c = 0; c < p->n_cores; c++)
                if (p->cores[c] / 4 == d) v |= 1 << (p->cores[c] % 4);
            fprintf(out, "%X", v);
        }
    }
}

static int most_cores(const topo_placement *pl)
{
    int m = 1;
    for (int i = 0; i < pl->n_ranks; i++)
        if (pl->places[i].n_cores > m) m = pl->places[i].n_cores;
    return m;
}

/* pipetrain train and its layout options (the binary as PIPETRAIN, default build/pipetrain) */
static void put_train(FILE *out, const plan_emit_args *a, const partition *part, int bind_auto,
                      int threads)
{
    fputs("\"${PIPETRAIN:-build/pipetrain}\" train --model ", out);
    put_word(out, a->model);
    fprintf(out, " --stages %d --replicas %d --batch %d --microbatches %d --schedule ", a->stages,
            a->replicas, a->batch, a->microbatches);
    put_word(out, a->schedule);
    fputs(" --partition ", out);
    put_counts(out, part);
    fprintf(out, " --threads %d --bind %s%s%s%s", threads, bind_auto ? "auto" : "none",
            a->cuda ? " --device cuda" : "", a->train_options[0] ? " " : "", a->train_options);
}

int plan_emit(FILE *out, const plan_emit_args *a, const partition *part,
              const topo_placement *pl)
{
    int N = pl->n_ranks, uniform = uniform_nodes(pl, a->nodes), threads = most_cores(pl);
    if (a->kind == PLAN_EMIT_MPIEXEC) {
        if (a->nodes > 1) {
            /* rank i on the node of the i-th line (hydra fills the lines in order) */
            fputs("printf '%s\\n'", out);
            for (int i = 0; i < N; i++) fprintf(out, " \"${NODE%d:?set NODE%d to node %d's host name}:1\"",
                                                pl->places[i].node, pl->places[i].node,
                                                pl->places[i].node);
            fputs(" > pipetrain.hosts && \\\n", out);
        }
        fprintf(out, "mpiexec -n %d%s", N, a->nodes > 1 ? " -f pipetrain.hosts" : "");
        if (uniform) {
            fputs(" -bind-to user:", out);
            put_hydra_binding(out, pl);
        }
        fputc(' ', out);
        put_train(out, a, part, !uniform, threads);
        fputc('\n', out);
        return ferror(out) ? pt_error_set("cannot write the command") : 0;
    }
    fprintf(out, "#!/usr/bin/env bash\n"
                 "# Written by pipetrain plan --emit slurm: %d ranks (%d stages x %d replicas) on "
                 "%d node%s,\n# each on the node and cores the plan chose. Submit from the "
                 "repository: sbatch THIS_FILE [more train options]\n",
            N, a->stages, a->replicas, a->nodes, a->nodes > 1 ? "s" : "");
    fprintf(out, "#SBATCH --job-name=pipetrain\n#SBATCH --nodes=%d\n#SBATCH --ntasks=%d\n"
                 "#SBATCH --cpus-per-task=%d\n", a->nodes, N, threads);
    fputs("set -euo pipefail\n", out);
    fputs("# the plan's node of each rank, 0-based, in rank order\nnode_of=(", out);
    for (int i = 0; i < N; i++) fprintf(out, "%s%d", i ? " " : "", pl->places[i].node);
    fputs(")\nmapfile -t hosts < <(scontrol show hostnames \"$SLURM_JOB_NODELIST\")\n", out);
    fprintf(out, "[ ${#hosts[@]} -eq %d ] || { echo \"pipetrain job: the plan is for %d nodes, "
                 "the allocation has ${#hosts[@]}\" >&2; exit 2; }\n", a->nodes, a->nodes);
    fputs("export SLURM_HOSTFILE=$(mktemp)\ntrap 'rm -f \"$SLURM_HOSTFILE\"' EXIT\n"
          "for n in \"${node_of[@]}\"; do echo \"${hosts[$n]}\"; done >\"$SLURM_HOSTFILE\"\n", out);
    fputs("srun --mpi=pmi2 --kill-on-bad-exit=1 --distribution=arbitrary", out);
    if (uniform) {
        fputs(" --cpu-bind=mask_cpu:", out);
        put_slurm_masks(out, pl);
    } else {
        fputs(" --cpu-bind=none", out);
    }
    fputs(" \\\n    ", out);
    put_train(out, a, part, !uniform, threads);
    fputs(" \"$@\"\n", out);
    if (!uniform)
        fputs("# the nodes lay their ranks out differently: each rank binds itself (--bind auto)\n",
              out);
    return ferror(out) ? pt_error_set("cannot write the job script") : 0;
}
