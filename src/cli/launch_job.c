/* The job `pipetrain launch` runs: its command, and its train options read with train's own
 * table (train_options_parse), so that attached short options (-k2), abbreviations
 * (--tens 2) and repeated options mean to launch what they mean to train. What launch
 * changes is appended (train takes the last of a repeated option) or, for --load, removed. */
#include "src/cli/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

void launch_job_free(launch_job *j)
{
    for (int i = 0; i < j->argc; i++) free(j->argv[i]);
    free(j->argv);
    free(j->resume);
    *j = (launch_job){0};
}

static int job_insert(launch_job *j, int at, const char *a)
{
    char **v = realloc(j->argv, (size_t)(j->argc + 2) * sizeof *v);
    if (!v) return pt_error_set("out of memory");
    j->argv = v;
    memmove(v + at + 1, v + at, (size_t)(j->argc - at + 1) * sizeof *v);
    j->argc++;
    if (at <= j->pt) j->pt++;
    if (at <= j->fixed) j->fixed++;
    return (v[at] = strdup(a)) ? 0 : pt_error_set("out of memory");
}

/* Removes argv[at] and the n − 1 after it. */
static void job_remove(launch_job *j, int at, int n)
{
    for (int i = at; i < at + n; i++) free(j->argv[i]);
    memmove(j->argv + at, j->argv + at + n, (size_t)(j->argc - at - n + 1) * sizeof *j->argv);
    j->argc -= n;
    if (at < j->fixed) j->fixed -= n;
}

int launch_job_options(const launch_job *j, train_options *o)
{
    /* train's parser may permute its argv: give it a copy of the pointers */
    int n = j->argc - j->pt - 1;
    char **v = malloc((size_t)(n + 1) * sizeof *v);
    if (!v) return pt_error_set("out of memory");
    memcpy(v, j->argv + j->pt + 1, (size_t)(n + 1) * sizeof *v);
    int rc = train_options_parse(o, n, v);
    free(v);
    return rc;
}

int launch_job_ranks_at(const launch_job *j)
{
    for (int i = 1; i + 1 < j->pt; i++) {
        const char *a = j->argv[i];
        if (j->launcher == 1 && (!strcmp(a, "-n") || !strcmp(a, "-np"))) return i + 1;
        if (j->launcher == 2 && (!strcmp(a, "-n") || !strcmp(a, "--ntasks"))) return i + 1;
    }
    return -1;
}

/* srun lets the other tasks run on when one dies (KillOnBadExit=0 by default): they would
 * wait for it until --timeout. Ask srun to end the step at once, as mpiexec does, unless
 * the command says otherwise; and split --ntasks=N, so that N can be rewritten. */
static int srun_args(launch_job *j)
{
    int kill_set = 0;
    for (int i = 1; i < j->pt; i++)
        kill_set |= !strncmp(j->argv[i], "--kill-on-bad-exit", 18) ||
                    !strncmp(j->argv[i], "-K", 2);
    if (!kill_set && job_insert(j, 1, "--kill-on-bad-exit=1")) return -1;
    for (int i = 1; i < j->pt; i++)
        if (!strncmp(j->argv[i], "--ntasks=", 9)) {
            char *v = strdup(j->argv[i] + 9);
            if (!v) return pt_error_set("out of memory");
            j->argv[i][8] = '\0';
            int rc = job_insert(j, i + 1, v);
            free(v);
            if (rc) return -1;
        }
    return 0;
}

int launch_job_parse(launch_job *j, int argc, char **argv)
{
    *j = (launch_job){0};
    j->argv = calloc((size_t)argc + 1, sizeof *j->argv);
    if (!j->argv) return pt_error_set("out of memory");
    for (int i = 0; i < argc; i++)
        if (!(j->argv[j->argc++] = strdup(argv[i]))) return pt_error_set("out of memory");
    j->fixed = j->argc;
    j->pt = -1;
    for (int i = 0; i + 1 < argc; i++)
        if (!strncmp(base_name(argv[i]), "pipetrain", 9) && !strcmp(argv[i + 1], "train")) {
            j->pt = i;
            break;
        }
    if (j->pt < 0)
        return pt_error_set("the command is not a pipetrain training job (expected "
                            "'... pipetrain train ...', e.g. mpiexec -n 4 build/pipetrain "
                            "train ...): launch restarts only those");
    const char *l = base_name(argv[0]);
    j->launcher = j->pt == 0 ? 0 : !strcmp(l, "srun") ? 2 : !strncmp(l, "mpi", 3) ? 1 : -1;
    if (j->launcher < 0)
        return pt_error_set("%s: not a launcher launch knows (mpiexec, mpirun, srun, or "
                            "pipetrain itself)", argv[0]);
    return j->launcher == 2 ? srun_args(j) : 0;
}

/* argv[fixed..) again from j's additions: --resume DIR and the re-planned layout. */
static int rebuild(launch_job *j)
{
    job_remove(j, j->fixed, j->argc - j->fixed);
    j->fixed = j->argc;
    char buf[3][32];
    const char *add[10];
    int n = 0;
    if (j->resume) add[n++] = "--resume", add[n++] = j->resume;
    if (j->stages) {
        snprintf(buf[0], sizeof buf[0], "%ld", j->stages);
        snprintf(buf[1], sizeof buf[1], "%ld", j->replicas);
        snprintf(buf[2], sizeof buf[2], "%ld", j->microbatches);
        add[n++] = "--stages", add[n++] = buf[0], add[n++] = "--replicas", add[n++] = buf[1];
        add[n++] = "--microbatches", add[n++] = buf[2];
    }
    if (j->unshard) add[n++] = "--zero", add[n++] = "0";
    int fixed = j->fixed;
    for (int i = 0; i < n; i++)
        if (job_insert(j, j->argc, add[i])) return -1;
    j->fixed = fixed;
    return 0;
}

/* Drops every --load (in whatever form train reads it): train's parser says which argument
 * holds the value it took, and the option is that argument or the one before it. */
static int drop_load(launch_job *j)
{
    for (int guard = 0; guard < 1000; guard++) {
        train_options o;
        if (launch_job_options(j, &o) < 0) return -1;
        if (!o.load) return 0;
        int i = j->pt + 1;
        while (i < j->argc && !(o.load >= j->argv[i] &&
                                o.load <= j->argv[i] + strlen(j->argv[i])))
            i++;
        if (i >= j->argc) return pt_error_set("cannot find --load among the job's options");
        if (o.load == j->argv[i] && i > j->pt + 2) job_remove(j, i - 1, 2);
        else job_remove(j, i, 1);
    }
    return pt_error_set("cannot drop --load from the job's options");
}

int launch_job_resume(launch_job *j, const char *dir)
{
    if (j->resume) return 0;
    job_remove(j, j->fixed, j->argc - j->fixed);
    if (drop_load(j)) return -1;
    if (!(j->resume = strdup(dir))) return pt_error_set("out of memory");
    return rebuild(j);
}

int launch_job_replan(launch_job *j, long n, long *k, long *r, long *m)
{
    int at = launch_job_ranks_at(j);
    if (at < 0) return pt_error_set("the command names no rank count (-n) to change");
    train_options o;
    if (launch_job_options(j, &o) < 0) return -1;
    long K = o.stages, R = o.replicas, M = o.microbatches, B = o.batch, T = o.tensor;
    /* tensor groups stay whole: the stages and replicas share the ranks' n / T groups */
    if (T < 1 || n % T) return pt_error_set("%ld ranks: not a multiple of --tensor %ld", n, T);
    long G = n / T;
    long K2 = K < G ? K : G;
    while (K2 > 1 && G % K2) K2--;
    long R2 = G / K2;
    if (B % R2)
        return pt_error_set("%ld ranks: the batch of %ld does not split over %ld replicas", n,
                            B, R2);
    /* the step's micro-batches stay R·M where they can: then a --reduce ordered run goes on
     * with the same arithmetic, bit for bit */
    long M2 = (M * R) % R2 == 0 ? M * R / R2 : M;
    if ((B / R2) % M2) M2 = M;
    while (M2 > 1 && (B / R2) % M2) M2--;
    char v[32];
    snprintf(v, sizeof v, "%ld", n);
    char *s = strdup(v);
    if (!s) return pt_error_set("out of memory");
    free(j->argv[at]);
    j->argv[at] = s;
    j->stages = *k = K2, j->replicas = *r = R2, j->microbatches = *m = M2;
    /* one replica left: the state is whole (a checkpoint holds whole tensors either way);
     * o already reads an earlier re-plan's --zero 0 */
    j->unshard = R2 < 2 && (o.zero > 0 || j->unshard);
    return rebuild(j);
}

char *launch_job_joined(const launch_job *j)
{
    size_t len = 1;
    for (int i = 0; i < j->argc; i++) len += strlen(j->argv[i]) + 1;
    char *s = malloc(len);
    if (!s) return NULL;
    s[0] = '\0';
    for (int i = 0; i < j->argc; i++) {
        if (i) strcat(s, " ");
        strcat(s, j->argv[i]);
    }
    return s;
}
