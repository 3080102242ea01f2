/* `pipetrain launch [--max-restarts N] [--min-ranks R] [--hostfile F] [--log FILE] --
 * COMMAND...`: MPICH 4.0.2 gives the surviving ranks of a job no way to go on after one
 * dies (DESIGN.md), so a lost rank is handled as elastic launchers do: the job ends (its
 * launcher ends it within seconds of a killed rank; the watchdog within --timeout of a stalled
 * one), and this runs it again with --resume from its newest complete checkpoint.
 *
 * How it reads the job's end (measured with MPICH hydra 4.0.2): every rank exits with
 * train's status and mpiexec passes it on, so 2 (PT_EXIT_USAGE: options, model, data,
 * checkpoints or output paths at fault, found before training starts) is never restarted;
 * 1 is a failure while training (watchdog, MPI error, a write that failed); a rank killed by
 * signal S makes mpiexec exit with S (9 for SIGKILL), and a job run without a launcher is
 * seen killed by S. Everything but 0 and 2 is restarted, up to --max-restarts times.
 *
 * Elastic restarts (--min-ranks R): before each restart the ranks available are read from
 * --hostfile (MPICH's "host[:slots]" lines, re-read every time, so that a lost node can be
 * taken out of it) or from Slurm's SLURM_NTASKS; with fewer than the job had, but at least
 * R, the launcher's rank count (-n/-np; srun's -n/--ntasks) is rewritten and the layout
 * re-planned: --tensor T kept (the ranks left must be a multiple of it), --stages kept
 * when it divides the ranks left / T (replicas = ranks / (T · stages)),
 * else the largest stage count that does and is not larger; micro-batches per replica
 * scaled so that replicas × micro-batches stays what it was (with --reduce ordered the
 * arithmetic is then the same), else the largest count that divides the samples per
 * replica. The checkpoints are layout-independent, so the job resumes in the new layout. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"

enum { O_MAX = 1, O_MIN, O_HOSTFILE, O_LOG, O_HELP };

static const opt_spec launch_opts[] = {
    {.id = O_MAX, .name = "max-restarts", .kind = OPT_INT, .arg = "N", .min = 0, .max = 1000000,
     .def = "3", .help = "restarts after failures before giving up"},
    {.id = O_MIN, .name = "min-ranks", .kind = OPT_INT, .arg = "R", .min = 1, .max = 1 << 20,
     .help = "restart on fewer ranks, down to R, when fewer are available (re-planning the "
             "layout); without it a restart asks for the ranks the job had"},
    {.id = O_HOSTFILE, .name = "hostfile", .kind = OPT_TEXT, .arg = "FILE",
     .help = "where the ranks available are read before each restart (host[:slots] lines); "
             "else SLURM_NTASKS"},
    {.id = O_LOG, .name = "log", .kind = OPT_TEXT, .arg = "FILE",
     .help = "append each attempt's start, failure and restart as JSON lines"},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command launch_command = {
    .name = "launch",
    .usage = "pipetrain launch [options] -- COMMAND...",
    .about = "Runs a pipetrain training job (COMMAND: mpiexec ... pipetrain train ..., srun "
             "... pipetrain train ..., or pipetrain train ...; it must have --checkpoint-dir) "
             "and, when it fails (a rank killed, a stall caught by the watchdog, a node lost), "
             "runs it again with --resume from its newest complete checkpoint. A job whose "
             "input is at fault (exit status 2: bad options or files) is not restarted.",
    .notes = "Exit status: 0 when the job ends well; 2 for a bad launch command or a job whose "
             "input is at fault; otherwise the last attempt's status once the restarts are "
             "spent (a signal S as 128 + S).",
    .opts = launch_opts,
};

typedef struct {
    int max_restarts, min_ranks;
    const char *hostfile, *log;
    FILE *logf;
} launch_options;

/* The job's command as a growable argv, and where its parts are. */
typedef struct {
    char **argv; /* owned array of owned strings, NULL-terminated */
    int argc;
    int launcher;  /* 0: pipetrain itself; 1: mpiexec/mpirun; 2: srun */
    int pt;        /* index of the pipetrain binary ("train" follows) */
} job_cmd;

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void job_free(job_cmd *j)
{
    for (int i = 0; i < j->argc; i++) free(j->argv[i]);
    free(j->argv);
    j->argv = NULL;
    j->argc = 0;
}

static int job_insert(job_cmd *j, int at, const char *a, const char *b)
{
    int n = b ? 2 : 1;
    char **v = realloc(j->argv, (size_t)(j->argc + n + 1) * sizeof *v);
    if (!v) return pt_error_set("out of memory");
    j->argv = v;
    memmove(v + at + n, v + at, (size_t)(j->argc - at + 1) * sizeof *v);
    v[at] = strdup(a);
    if (b) v[at + 1] = strdup(b);
    j->argc += n;
    if (at <= j->pt) j->pt += n;
    return !v[at] || (b && !v[at + 1]) ? pt_error_set("out of memory") : 0;
}

/* The value of option `name` (or its one-letter form) among the train arguments: its index
 * in argv (the value's), or −1. "--name=V" is split into two arguments first. */
static int find_value(job_cmd *j, const char *name, char letter)
{
    size_t len = strlen(name);
    for (int i = j->pt + 2; i < j->argc; i++) {
        char *a = j->argv[i];
        if (!strncmp(a, "--", 2) && !strncmp(a + 2, name, len) && a[2 + len] == '=') {
            char *value = strdup(a + 3 + len);
            if (!value) return -1;
            a[2 + len] = '\0';
            if (job_insert(j, i + 1, value, NULL)) {
                free(value);
                return -1;
            }
            free(value);
            return i + 1;
        }
        if (((!strncmp(a, "--", 2) && !strcmp(a + 2, name)) ||
             (letter && a[0] == '-' && a[1] == letter && !a[2])) && i + 1 < j->argc)
            return i + 1;
    }
    return -1;
}

/* Removes argv[at] and the n − 1 after it. */
static void job_remove(job_cmd *j, int at, int n)
{
    for (int i = at; i < at + n; i++) free(j->argv[i]);
    memmove(j->argv + at, j->argv + at + n, (size_t)(j->argc - at - n + 1) * sizeof *j->argv);
    j->argc -= n;
}

static int set_value(job_cmd *j, int at, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    char *s = strdup(buf);
    if (!s) return pt_error_set("out of memory");
    free(j->argv[at]);
    j->argv[at] = s;
    return 0;
}

static long value_or(job_cmd *j, const char *name, char letter, long def)
{
    int i = find_value(j, name, letter);
    return i < 0 ? def : strtol(j->argv[i], NULL, 10);
}

/* The launcher's rank count: index of its value in argv, or −1 (then one rank). */
static int ranks_at(const job_cmd *j)
{
    for (int i = 1; i < j->pt; i++) {
        const char *a = j->argv[i];
        if (j->launcher == 1 && (!strcmp(a, "-n") || !strcmp(a, "-np")) && i + 1 < j->pt)
            return i + 1;
        if (j->launcher == 2 && (!strcmp(a, "-n") || !strcmp(a, "--ntasks")) && i + 1 < j->pt)
            return i + 1;
    }
    return -1;
}

static int parse_job(job_cmd *j, int argc, char **argv)
{
    *j = (job_cmd){0};
    j->argv = calloc((size_t)argc + 1, sizeof *j->argv);
    if (!j->argv) return pt_error_set("out of memory");
    for (int i = 0; i < argc; i++)
        if (!(j->argv[j->argc++] = strdup(argv[i]))) return pt_error_set("out of memory");
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
    /* srun lets the other tasks run on when one dies (KillOnBadExit=0 by default): they
     * would wait for it until --timeout. Ask srun to end the step at once, as mpiexec
     * does, unless the command says otherwise. */
    int kill_set = 0;
    for (int i = 1; j->launcher == 2 && i < j->pt; i++)
        kill_set |= !strncmp(j->argv[i], "--kill-on-bad-exit", 18) ||
                    !strncmp(j->argv[i], "-K", 2);
    if (j->launcher == 2 && !kill_set && job_insert(j, 1, "--kill-on-bad-exit=1", NULL))
        return -1;
    /* srun --ntasks=N: split, so that it can be rewritten */
    for (int i = 1; i < j->pt; i++)
        if (!strncmp(j->argv[i], "--ntasks=", 9)) {
            char *v = strdup(j->argv[i] + 9);
            if (!v) return pt_error_set("out of memory");
            j->argv[i][8] = '\0';
            int rc = job_insert(j, i + 1, v, NULL);
            free(v);
            if (rc) return -1;
        }
    return 0;
}

/* ---- time and the log ---- */

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void iso_time(double t, char *buf, size_t size)
{
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, size - n, ".%03dZ", (int)((t - (double)s) * 1000));
}

static char *joined(const job_cmd *j)
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

/* One event: a line on stderr, and a JSON line in --log. */
static void event(launch_options *o, json_t *ev, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void event(launch_options *o, json_t *ev, const char *fmt, ...)
{
    double t = wall_now();
    char when[40], msg[1024];
    iso_time(t, when, sizeof when);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "pipetrain launch: [%s] %s\n", when, msg);
    fflush(stderr);
    if (o->logf && ev) {
        json_object_set_new(ev, "time", json_string(when));
        json_object_set_new(ev, "unix_time", json_real(t));
        char *line = json_dumps(ev, JSON_COMPACT);
        if (line) {
            fprintf(o->logf, "%s\n", line);
            fflush(o->logf);
        }
        free(line);
    }
    json_decref(ev);
}

/* ---- what is available, and the new layout ---- */

/* Slots in an MPICH host file ("host[:slots]", # comments): −1 with a message. */
static long hostfile_slots(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return pt_error_set("--hostfile %s: cannot read: %s", path, strerror(errno));
    char line[1024];
    long n = 0;
    while (fgets(line, sizeof line, f)) {
        char *h = line + strspn(line, " \t");
        if (*h == '#' || *h == '\n' || !*h) continue;
        char *colon = strchr(h, ':');
        long s = colon ? strtol(colon + 1, NULL, 10) : 1;
        n += s > 0 ? s : 1;
    }
    fclose(f);
    return n;
}

/* Ranks available now: 0 when nothing says (then the job keeps its own count). */
static long ranks_available(const launch_options *o)
{
    if (o->hostfile) return hostfile_slots(o->hostfile);
    const char *s = getenv("SLURM_NTASKS");
    return s ? strtol(s, NULL, 10) : 0;
}

/* Rewrites the rank count and the layout for n ranks. */
static int replan(job_cmd *j, launch_options *o, long n)
{
    int at = ranks_at(j);
    if (at < 0) return pt_error_set("the command names no rank count (-n) to change");
    long K = value_or(j, "stages", 'k', 1), R = value_or(j, "replicas", 'r', 1);
    long M = value_or(j, "microbatches", 'M', 1), B = value_or(j, "batch", 'b', 128);
    /* tensor groups stay whole: the stages and replicas share the ranks' n / T groups */
    long T = value_or(j, "tensor", 0, 1);
    if (T < 1 || n % T)
        return pt_error_set("%ld ranks: not a multiple of --tensor %ld", n, T);
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
    if (set_value(j, at, n)) return -1;
    int i;
    const char *names[] = {"stages", "replicas", "microbatches"};
    const char letters[] = {'k', 'r', 'M'};
    long values[] = {K2, R2, M2}, old[] = {K, R, M};
    for (int k = 0; k < 3; k++) {
        if (values[k] == old[k]) continue;
        i = find_value(j, names[k], letters[k]);
        char opt[32];
        snprintf(opt, sizeof opt, "--%s", names[k]);
        char v[32];
        snprintf(v, sizeof v, "%ld", values[k]);
        if (i < 0 ? job_insert(j, j->argc, opt, v) : set_value(j, i, values[k])) return -1;
    }
    json_t *ev = json_pack("{s:s, s:i, s:i, s:i, s:i}", "event", "replan", "ranks", (int)n,
                           "stages", (int)K2, "replicas", (int)R2, "microbatches", (int)M2);
    event(o, ev, "%ld ranks available: re-planned as --stages %ld --replicas %ld "
                 "--microbatches %ld", n, K2, R2, M2);
    return 0;
}

/* Whether DIR holds a complete checkpoint file (temporaries end in .tmp-...). */
static int has_checkpoint(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        found = !strncmp(e->d_name, "ckpt-", 5) && len > 17 &&
                !strcmp(e->d_name + len - 12, ".safetensors");
    }
    closedir(d);
    return found;
}

/* ---- running one attempt ---- */

static volatile sig_atomic_t child_group, stop_signal;

static void forward_signal(int sig)
{
    stop_signal = sig;
    if (child_group > 0) kill(-child_group, sig);
}

/* Runs the job; its wait status in *status. */
static int run_attempt(const job_cmd *j, const char *first_step_file, int *status)
{
    pid_t pid = fork();
    if (pid < 0) return pt_error_set("cannot start the job: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a signal for the job reaches all it started */
        setenv("PT_LAUNCH_FIRST_STEP", first_step_file, 1);
        execvp(j->argv[0], j->argv);
        fprintf(stderr, "pipetrain launch: cannot run %s: %s\n", j->argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    child_group = pid;
    while (waitpid(pid, status, 0) < 0)
        if (errno != EINTR) return pt_error_set("waiting for the job: %s", strerror(errno));
    child_group = 0;
    return 0;
}

static double read_first_step(const char *path)
{
    FILE *f = fopen(path, "r");
    double t = 0;
    if (f) {
        if (fscanf(f, "%lf", &t) != 1) t = 0;
        fclose(f);
    }
    return t;
}

static int launch_loop(launch_options *o, job_cmd *j, const char *ckpt_dir)
{
    char first_file[] = "/tmp/pipetrain-launch-XXXXXX";
    int fd = mkstemp(first_file);
    if (fd < 0) {
        fprintf(stderr, "pipetrain launch: cannot create a temporary file: %s\n", strerror(errno));
        return PT_EXIT_FAIL;
    }
    close(fd);
    int at = ranks_at(j);
    long ranks = at < 0 ? 1 : strtol(j->argv[at], NULL, 10);
    int rc = PT_EXIT_FAIL;
    for (int attempt = 0;; attempt++) {
        if (attempt > 0) {
            long avail = ranks_available(o);
            if (avail < 0) {
                event(o, NULL, "%s", pt_error_get());
                break;
            }
            if (o->min_ranks && avail > 0 && avail < ranks) {
                if (avail < o->min_ranks) {
                    event(o, json_pack("{s:s, s:i}", "event", "gave_up", "available", (int)avail),
                          "%ld ranks available, fewer than --min-ranks %d: giving up", avail,
                          o->min_ranks);
                    break;
                }
                if (replan(j, o, avail)) {
                    event(o, NULL, "cannot re-plan: %s", pt_error_get());
                    break;
                }
                ranks = avail;
            }
            if (has_checkpoint(ckpt_dir)) {
                /* the checkpoint sets the parameters now, not --load's file */
                int l = find_value(j, "load", 0);
                if (l >= 0) job_remove(j, l - 1, 2);
                int r = find_value(j, "resume", 0);
                if (r >= 0) {
                    char *d = strdup(ckpt_dir);
                    if (!d) break;
                    free(j->argv[r]);
                    j->argv[r] = d;
                } else if (job_insert(j, j->argc, "--resume", ckpt_dir)) {
                    break;
                }
            }
        }
        char *cmd = joined(j);
        unlink(first_file);
        double t0 = wall_now();
        event(o, json_pack("{s:s, s:i, s:s?}", "event", "start", "attempt", attempt + 1,
                           "command", cmd),
              "attempt %d: %s", attempt + 1, cmd ? cmd : "(out of memory)");
        free(cmd);
        int status = 0;
        if (run_attempt(j, first_file, &status)) {
            event(o, NULL, "%s", pt_error_get());
            break;
        }
        double t1 = wall_now(), tf = read_first_step(first_file);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        char how[64];
        if (WIFEXITED(status)) snprintf(how, sizeof how, "exit status %d", code);
        else snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
        json_t *ev = json_pack("{s:s, s:i, s:i, s:s, s:f}", "event", code ? "failed" : "done",
                               "attempt", attempt + 1, "status", code, "how", how,
                               "seconds", t1 - t0);
        if (tf > 0) json_object_set_new(ev, "first_step_s", json_real(tf - t0));
        char first[64] = "";
        if (tf > 0) snprintf(first, sizeof first, "; first step %.2f s after the start", tf - t0);
        event(o, ev, "attempt %d %s after %.2f s (%s)%s", attempt + 1,
              code ? "failed" : "ended well", t1 - t0, how, first);
        rc = code;
        if (code == 0) break;
        if (stop_signal) {
            event(o, NULL, "stopped by signal %d: not restarted", (int)stop_signal);
            break;
        }
        if (code == PT_EXIT_USAGE) {
            event(o, json_pack("{s:s}", "event", "not_restarted"),
                  "not restarted: the job's input is at fault (its message is above)");
            break;
        }
        if (attempt >= o->max_restarts) {
            event(o, json_pack("{s:s, s:i}", "event", "gave_up", "restarts", attempt),
                  "giving up after %d restart%s", attempt, attempt == 1 ? "" : "s");
            break;
        }
        event(o, json_pack("{s:s, s:i, s:b}", "event", "restart", "restart", attempt + 1,
                           "from_checkpoint", has_checkpoint(ckpt_dir)),
              "restart %d of %d, %s", attempt + 1, o->max_restarts,
              has_checkpoint(ckpt_dir) ? "from the newest checkpoint in the directory"
                                       : "from the start (no checkpoint yet)");
    }
    unlink(first_file);
    return rc;
}

int cmd_launch(int argc, char **argv)
{
    int dd = 0;
    while (dd < argc && strcmp(argv[dd], "--")) dd++;
    opt_parser p;
    launch_options o = {0};
    if (opt_parser_init(&p, &launch_command, dd, argv)) goto usage;
    int id;
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_MAX: o.max_restarts = (int)p.num; break;
        case O_MIN: o.min_ranks = (int)p.num; break;
        case O_HOSTFILE: o.hostfile = p.arg; break;
        case O_LOG: o.log = p.arg; break;
        case O_HELP: opt_print_help(&launch_command, stdout); return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) goto usage;
    if (dd + 1 >= argc) {
        opt_error(&p, "no job to run: give it after --, e.g. pipetrain launch --max-restarts 3 "
                      "-- mpiexec -n 4 pipetrain train ... --checkpoint-dir ck/");
        goto usage;
    }
    job_cmd j;
    if (parse_job(&j, argc - dd - 1, argv + dd + 1)) {
        job_free(&j);
        fprintf(stderr, "pipetrain launch: %s\n", pt_error_get());
        return PT_EXIT_USAGE;
    }
    int ck = find_value(&j, "checkpoint-dir", 0);
    if (ck < 0) {
        job_free(&j);
        fprintf(stderr, "pipetrain launch: the job has no --checkpoint-dir: a restart would "
                        "begin again from the first step; give it one\n");
        return PT_EXIT_USAGE;
    }
    if (o.min_ranks && ranks_at(&j) < 0) {
        job_free(&j);
        fprintf(stderr, "pipetrain launch: --min-ranks needs a launcher with a rank count "
                        "(mpiexec -n N or srun -n N)\n");
        return PT_EXIT_USAGE;
    }
    if (o.hostfile && hostfile_slots(o.hostfile) < 0) {
        job_free(&j);
        fprintf(stderr, "pipetrain launch: %s\n", pt_error_get());
        return PT_EXIT_USAGE;
    }
    if (o.log && !(o.logf = fopen(o.log, "a"))) {
        job_free(&j);
        fprintf(stderr, "pipetrain launch: --log %s: cannot open: %s\n", o.log, strerror(errno));
        return PT_EXIT_USAGE;
    }
    char *ckpt_dir = strdup(j.argv[ck]);
    struct sigaction sa = {.sa_handler = forward_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = ckpt_dir ? launch_loop(&o, &j, ckpt_dir) : PT_EXIT_FAIL;
    free(ckpt_dir);
    job_free(&j);
    if (o.logf) fclose(o.logf);
    return rc;
usage:
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    return PT_EXIT_USAGE;
}
