/* `pipetrain launch [--max-restarts N] [--min-ranks R] [--hostfile F] [--log FILE]
 * [--backoff S] -- COMMAND...`: MPICH 4.0.2 gives the surviving ranks of a job no way to go
 * on after one dies (DESIGN.md), so a lost rank is handled as elastic launchers do: the job
 * ends (its launcher ends it within seconds of a killed rank; the watchdog within --timeout
 * of a stalled one), and this runs it again with --resume from its newest complete
 * checkpoint.
 *
 * How it reads the job's end: rank 0 of train writes a status record (PT_LAUNCH_STATUS, a
 * file in the checkpoint directory) as it ends: "completed", "failed" or "input" (at fault,
 * found before training) with the step. Only "completed" is a success, whatever the exit
 * status; "input" is never restarted; neither is a command that cannot be run (126, 127
 * with no record). Anything else (a failure, a rank killed, by SIGINT too, which mpiexec
 * reports as 2, no record at all) is restarted, up to --max-restarts times, after a delay
 * that doubles from --backoff seconds (at most 60 s). The job's options are read with
 * train's own table (launch_job.c), so they are refused here, before any attempt, when
 * train would refuse them.
 *
 * Signals: SIGINT and SIGTERM to launch are passed to the job's process group (the job runs
 * in a group of its own, so that mpiexec and every rank it started get them; after 10 s the
 * group is killed); launch then exits 128 + the signal, saying it was interrupted, unless
 * the job's record says it completed. When launch itself is killed (SIGKILL, the OOM
 * killer), the kernel sends the job SIGTERM (PR_SET_PDEATHSIG), and mpiexec ends its ranks.
 *
 * Elastic restarts (--min-ranks R): before each restart the ranks available are read from
 * --hostfile (MPICH's "host[:slots]" lines, re-read every time, so that a lost node can be
 * taken out of it) or from Slurm's SLURM_NTASKS; with fewer than the job had, but at least
 * R, the launcher's rank count (-n/-np; srun's -n/--ntasks) is rewritten and the layout
 * re-planned from what train would run: --tensor T kept (the ranks left must be a multiple
 * of it), --stages kept when it divides the ranks left / T (replicas = ranks / (T · stages)),
 * else the largest stage count that does and is not larger; micro-batches per replica
 * scaled so that replicas × micro-batches stays what it was (with --reduce ordered the
 * arithmetic is then the same), else the largest count that divides the samples per
 * replica; with one replica left, --zero 0 (ZeRO needs two). The checkpoints are
 * layout-independent, so the job resumes in the new layout. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/io.h"
#include "src/base/options.h"
#include "src/base/output.h"
#include "src/cli/commands.h"
#include "src/cli/launch.h"
#include "src/io/checkpoint_dir.h"

enum { O_MAX = 1, O_MIN, O_HOSTFILE, O_LOG, O_BACKOFF, O_HELP };

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
    {.id = O_BACKOFF, .name = "backoff", .kind = OPT_REAL, .arg = "S", .min = 0, .max = 60,
     .def = "1", .help = "seconds to wait before the first restart; each further restart "
                         "waits twice as long as the one before, at most 60 s"},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command launch_command = {
    .name = "launch",
    .usage = "pipetrain launch [options] -- COMMAND...",
    .about = "Runs a pipetrain training job (COMMAND: mpiexec ... pipetrain train ..., srun "
             "... pipetrain train ..., or pipetrain train ...; it must have --checkpoint-dir) "
             "and, when it fails (a rank killed, a stall caught by the watchdog, a node lost), "
             "runs it again with --resume from its newest complete checkpoint. The job tells "
             "launch how it ended (a status record in the checkpoint directory): a job whose "
             "input is at fault (bad options or files) is not restarted, and only a job that "
             "reached its last step is a success. SIGINT and SIGTERM stop the job and launch.",
    .notes = "Exit status: 0 when the job completed; 2 for a bad launch command or a job whose "
             "input is at fault; 128 + S when stopped by signal S; otherwise the last "
             "attempt's status (1 when it was 0 without completing) once the restarts are "
             "spent (a signal S as 128 + S).",
    .opts = launch_opts,
};

typedef struct {
    int max_restarts, min_ranks;
    double backoff;
    const char *hostfile, *log;
    FILE *logf;
    char *ckpt_dir;              /* the job's --checkpoint-dir, absolute */
    char status[PATH_MAX + 64];  /* the job's status record */
    char first[PATH_MAX + 64];   /* when its first step ended */
} launch_options;

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
        /* a full disk must not lose events silently: said once, then stderr only */
        if (!line || fprintf(o->logf, "%s\n", line) < 0 || fflush(o->logf) != 0) {
            fprintf(stderr, "pipetrain launch: --log %s: cannot write: %s (events from now on "
                            "on stderr only)\n", o->log, line ? strerror(errno) : "out of memory");
            fclose(o->logf);
            o->logf = NULL;
        }
        free(line);
    }
    json_decref(ev);
}

/* ---- what is available, and the new layout ---- */

/* Slots in an MPICH host file ("host[:slots]", # comments): −1 with a message. A FIFO or
 * a directory is refused (a FIFO blocked launch), and so are slots that are no positive
 * number (each such line counted 1) and a file naming no host (it read as "nothing says",
 * and the job kept its count). */
static long hostfile_slots(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return pt_error_set("--hostfile %s: cannot read: %s", path, strerror(errno));
    FILE *f = pt_fopen_regular(path, "r");
    if (!f) {
        char why[512];
        snprintf(why, sizeof why, "%s", pt_error_get());
        return pt_error_set("--hostfile %s", why);
    }
    char line[1024];
    long n = 0;
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *h = line + strspn(line, " \t");
        if (*h == '#' || *h == '\n' || *h == '\r' || !*h) continue;
        char *colon = strchr(h, ':'), *end = NULL;
        long s = colon ? strtol(colon + 1, &end, 10) : 1;
        if (colon && (end == colon + 1 || s < 1 || s > 1 << 20 ||
                      (*end && !strchr(" \t\r\n", *end)))) {
            fclose(f);
            return pt_error_set("--hostfile %s line %d: expected 'host' or 'host:slots' with "
                                "slots a positive number", path, lineno);
        }
        n += s;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) return pt_error_set("--hostfile %s: cannot read: %s", path, strerror(errno));
    if (n == 0) return pt_error_set("--hostfile %s: names no host", path);
    return n;
}

/* Ranks available now: 0 when nothing says (then the job keeps its own count). */
static long ranks_available(const launch_options *o)
{
    if (o->hostfile) return hostfile_slots(o->hostfile);
    const char *s = getenv("SLURM_NTASKS");
    return s ? strtol(s, NULL, 10) : 0;
}

/* Whether DIR holds a checkpoint, by the name train gives them (ckpt_dir_name_step). */
static int has_checkpoint(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) found = ckpt_dir_name_step(e->d_name) >= 0;
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

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL); /* a signal ends it early */
}

/* In the child: its own process group (a signal for the job reaches all it started), the
 * job ended by the kernel if launch dies, the signals as they were, then the command. */
static void exec_job(const launch_job *j, const launch_options *o, pid_t parent,
                     const sigset_t *old)
{
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(128 + SIGTERM);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, old, NULL);
    setenv("PT_LAUNCH_FIRST_STEP", o->first, 1);
    setenv("PT_LAUNCH_STATUS", o->status, 1);
    execvp(j->argv[0], j->argv);
    fprintf(stderr, "pipetrain launch: cannot run %s: %s\n", j->argv[0], strerror(errno));
    _exit(127);
}

/* Kills what is left of an ended job. launch is its subreaper (PR_SET_CHILD_SUBREAPER), so
 * a process the job started that outlived its parent (an MPI rank still starting when a
 * signal ended mpiexec, a proxy in a group of its own) is launch's child now: each such
 * child is killed and reaped, round after round as their own children come back to launch,
 * for at most 5 s. */
static void reap_orphans(void)
{
    long me = (long)getpid();
    for (int round = 0; round < 100; round++) {
        int found = 0;
        DIR *d = opendir("/proc");
        if (!d) return;
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            long pid = strtol(e->d_name, &end, 10);
            if (*end || pid <= 0) continue;
            char path[64], buf[512];
            snprintf(path, sizeof path, "/proc/%ld/stat", pid);
            FILE *f = fopen(path, "r");
            if (!f) continue;
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            /* "pid (comm) state ppid ...": comm may hold spaces and ')' */
            char *rp = strrchr(buf, ')');
            long ppid;
            if (rp && sscanf(rp + 1, " %*c %ld", &ppid) == 1 && ppid == me) {
                kill((pid_t)pid, SIGKILL);
                found = 1;
            }
        }
        closedir(d);
        while (waitpid(-1, NULL, WNOHANG) > 0) continue;
        if (!found) return;
        sleep_s(0.05);
    }
}

/* Runs the job; its wait status in *status. The signals are held while it starts, so that
 * one that comes then reaches it as soon as its group exists. */
static int run_attempt(const launch_job *j, const launch_options *o, int *status)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        return pt_error_set("cannot start the job: %s", strerror(errno));
    }
    if (pid == 0) exec_job(j, o, parent, &old);
    setpgid(pid, pid);
    child_group = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    /* after a signal the job has 10 s to end before its whole group is killed */
    double waited = 0;
    pid_t got;
    while ((got = waitpid(pid, status, WNOHANG)) == 0) {
        sleep_s(0.05);
        if (stop_signal && (waited += 0.05) > 10) kill(-pid, SIGKILL);
    }
    child_group = 0;
    if (got < 0) return pt_error_set("waiting for the job: %s", strerror(errno));
    if (stop_signal) kill(-pid, SIGKILL); /* nothing of an interrupted job goes on */
    reap_orphans(); /* nor of one that ended: not in its group, not before a restart */
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

/* The job's status record: how it ended, at which step, of how many, and rank 0's last
 * message ("" when the fault was found on another rank). */
typedef enum { REC_NONE, REC_COMPLETED, REC_FAILED, REC_INPUT } record_state;
typedef struct {
    record_state state;
    long step, total;
    char message[512];
} job_record;

static job_record read_record(const char *path)
{
    job_record r = {REC_NONE, 0, 0, ""};
    FILE *f = fopen(path, "r");
    char word[16];
    if (!f) return r;
    if (fscanf(f, "%15s %ld %ld", word, &r.step, &r.total) == 3) {
        r.state = !strcmp(word, "completed") ? REC_COMPLETED
                  : !strcmp(word, "failed")  ? REC_FAILED
                  : !strcmp(word, "input")   ? REC_INPUT
                                             : REC_NONE;
        if (fgetc(f) == '\n' && fgets(r.message, sizeof r.message, f))
            r.message[strcspn(r.message, "\n")] = '\0';
    }
    fclose(f);
    return r;
}

/* Before a restart: the ranks available (re-planning when fewer), and --resume once the
 * directory holds a checkpoint. −1 to stop (reported). */
static int prepare_restart(launch_options *o, launch_job *j, const char *ckpt_arg, long *ranks)
{
    long avail = ranks_available(o);
    if (avail < 0) {
        event(o, NULL, "%s", pt_error_get());
        return -1;
    }
    if (o->min_ranks && avail > 0 && avail < *ranks) {
        if (avail < o->min_ranks) {
            event(o, json_pack("{s:s, s:i}", "event", "gave_up", "available", (int)avail),
                  "%ld ranks available, fewer than --min-ranks %d: giving up", avail,
                  o->min_ranks);
            return -1;
        }
        long k, r, m;
        if (launch_job_replan(j, avail, &k, &r, &m)) {
            event(o, NULL, "cannot re-plan: %s", pt_error_get());
            return -1;
        }
        event(o, json_pack("{s:s, s:i, s:i, s:i, s:i}", "event", "replan", "ranks", (int)avail,
                           "stages", (int)k, "replicas", (int)r, "microbatches", (int)m),
              "%ld ranks available: re-planned as --stages %ld --replicas %ld "
              "--microbatches %ld", avail, k, r, m);
        *ranks = avail;
    }
    /* the checkpoint sets the parameters now, not --load's file */
    if (has_checkpoint(ckpt_arg) && launch_job_resume(j, ckpt_arg)) {
        event(o, NULL, "%s", pt_error_get());
        return -1;
    }
    return 0;
}

/* Reports how attempt n (started at t0) ended, from the job's record first. Returns 1 when
 * it may be restarted, else 0; *rc: launch's exit status if it stops here. */
static int judge(launch_options *o, int n, int status, double t0, int *rc)
{
    double t1 = wall_now(), tf = read_first_step(o->first);
    job_record rec = read_record(o->status);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char how[64], first[64] = "", what[96];
    if (WIFEXITED(status)) snprintf(how, sizeof how, "exit status %d", code);
    else snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(status));
    if (tf > 0) snprintf(first, sizeof first, "; first step %.2f s after the start", tf - t0);
    const char *states[] = {"no_record", "completed", "failed", "input"};
    if (rec.state == REC_COMPLETED)
        snprintf(what, sizeof what, "completed (step %ld of %ld)", rec.step, rec.total);
    else if (rec.state == REC_FAILED)
        snprintf(what, sizeof what, "failed at step %ld of %ld", rec.step, rec.total);
    else if (rec.state == REC_INPUT)
        snprintf(what, sizeof what, "failed: its input is at fault");
    else
        snprintf(what, sizeof what, "ended without completing (no status record from the job)");
    json_t *ev = json_pack("{s:s, s:i, s:i, s:s, s:f, s:s, s:i}", "event",
                           rec.state == REC_COMPLETED ? "done" : "failed", "attempt", n,
                           "status", code, "how", how, "seconds", t1 - t0, "record",
                           states[rec.state], "step", (int)rec.step);
    if (tf > 0) json_object_set_new(ev, "first_step_s", json_real(tf - t0));
    event(o, ev, "attempt %d %s after %.2f s (%s)%s", n, what, t1 - t0, how, first);
    *rc = rec.state == REC_COMPLETED ? PT_EXIT_OK : code ? code : PT_EXIT_FAIL;
    if (rec.state == REC_COMPLETED || stop_signal) return 0;
    if (rec.state == REC_INPUT) {
        *rc = PT_EXIT_USAGE;
        event(o, json_pack("{s:s, s:s}", "event", "not_restarted", "message", rec.message),
              "not restarted: the job's input is at fault%s%s", *rec.message ? ": " : "",
              *rec.message ? rec.message : " (another rank than 0 found it and printed it)");
        return 0;
    }
    if (rec.state == REC_NONE && (code == 126 || code == 127)) {
        event(o, json_pack("{s:s}", "event", "not_restarted"),
              "not restarted: the command cannot be run (exit status %d)", code);
        return 0;
    }
    return 1;
}

static int launch_loop(launch_options *o, launch_job *j, const char *ckpt_arg)
{
    int at = launch_job_ranks_at(j);
    long ranks = at < 0 ? 1 : strtol(j->argv[at], NULL, 10);
    int rc = PT_EXIT_FAIL;
    double delay = o->backoff;
    for (int attempt = 0; !stop_signal; attempt++) {
        if (attempt > 0 && prepare_restart(o, j, ckpt_arg, &ranks)) break;
        if (stop_signal) break;
        unlink(o->first);
        unlink(o->status);
        char *cmd = launch_job_joined(j);
        double t0 = wall_now();
        event(o, json_pack("{s:s, s:i, s:s?}", "event", "start", "attempt", attempt + 1,
                           "command", cmd),
              "attempt %d: %s", attempt + 1, cmd ? cmd : "(out of memory)");
        free(cmd);
        int status = 0;
        if (run_attempt(j, o, &status)) {
            event(o, NULL, "%s", pt_error_get());
            break;
        }
        if (!judge(o, attempt + 1, status, t0, &rc)) break;
        if (attempt >= o->max_restarts) {
            event(o, json_pack("{s:s, s:i}", "event", "gave_up", "restarts", attempt),
                  "giving up after %d restart%s", attempt, attempt == 1 ? "" : "s");
            break;
        }
        int from = has_checkpoint(ckpt_arg);
        event(o, json_pack("{s:s, s:i, s:b, s:f}", "event", "restart", "restart", attempt + 1,
                           "from_checkpoint", from, "delay_s", delay),
              "restart %d of %d in %.3g s, %s", attempt + 1, o->max_restarts, delay,
              from ? "from the newest checkpoint in the directory"
                   : "from the start (no checkpoint yet)");
        for (double t = wall_now() + delay; !stop_signal && wall_now() < t;)
            sleep_s(t - wall_now());
        delay = delay * 2 > 60 ? 60 : delay * 2;
    }
    if (stop_signal && rc != PT_EXIT_OK) {
        event(o, json_pack("{s:s, s:i}", "event", "interrupted", "signal", (int)stop_signal),
              "interrupted by signal %d (%s): the job was stopped, not restarted",
              (int)stop_signal, strsignal(stop_signal));
        rc = 128 + stop_signal;
    }
    unlink(o->first);
    unlink(o->status);
    return rc;
}

/* Creates DIR and its parents (train would, but the status record goes there from the
 * start); the absolute path in o->ckpt_dir. */
static int make_dir(launch_options *o, const char *dir)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return pt_error_set("--checkpoint-dir %s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        char c = *p;
        if (c && c != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pt_error_set("--checkpoint-dir %s: cannot create %s: %s", dir, buf,
                                strerror(errno));
        *p = c;
        if (!c) break;
    }
    if (!(o->ckpt_dir = realpath(dir, NULL)))
        return pt_error_set("--checkpoint-dir %s: %s", dir, strerror(errno));
    snprintf(o->status, sizeof o->status, "%s/.pipetrain-launch-status", o->ckpt_dir);
    snprintf(o->first, sizeof o->first, "%s/.pipetrain-launch-first-step", o->ckpt_dir);
    return 0;
}

/* The job's command and options, checked as train checks them; 0 or a message. */
static int read_job(launch_options *o, launch_job *j, int argc, char **argv, char **ckpt_arg)
{
    if (launch_job_parse(j, argc, argv)) return -1;
    train_options to;
    int prc = launch_job_options(j, &to);
    if (prc < 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", pt_error_get());
        return pt_error_set("the job's options: %s", why);
    }
    if (prc == 1) return pt_error_set("the job only asks for train's --help: nothing to run");
    if (!to.ckpt_dir)
        return pt_error_set("the job has no --checkpoint-dir: a restart would begin again "
                            "from the first step; give it one");
    if (o->min_ranks && launch_job_ranks_at(j) < 0)
        return pt_error_set("--min-ranks needs a launcher with a rank count (mpiexec -n N "
                            "or srun -n N)");
    if (o->hostfile && hostfile_slots(o->hostfile) < 0) return -1;
    if (!(*ckpt_arg = strdup(to.ckpt_dir))) return pt_error_set("out of memory");
    return make_dir(o, *ckpt_arg);
}

/* --log: appended to, so opened in place, but only as a regular file (pt_output_check
 * refuses a FIFO, a device, a directory), without following a link, and not inherited by
 * the job. */
static int open_log(launch_options *o)
{
    if (pt_output_check("--log", o->log)) return -1;
    /* not one of the files train and launch keep in the checkpoint directory: the status
     * record replaced the log and was then removed, a checkpoint got JSON appended */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", o->log);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? o->log + (slash - dir) + 1 : o->log;
    if (slash == dir) dir[1] = '\0'; /* "/x": the root */
    else if (slash) *slash = '\0';
    char *real = realpath(slash ? dir : ".", NULL);
    int own = real && o->ckpt_dir && !strcmp(real, o->ckpt_dir) &&
              (!strncmp(base, ".pipetrain-", 11) || ckpt_dir_name_step(base) >= 0);
    free(real);
    if (own)
        return pt_error_set("--log %s: a file of the job's checkpoint directory (its "
                            "checkpoints and .pipetrain-* records): give another name", o->log);
    int fd = open(o->log, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 || !(o->logf = fdopen(fd, "a"))) {
        int e = errno;
        if (fd >= 0) close(fd);
        return pt_error_set("--log %s: cannot open: %s", o->log, strerror(e));
    }
    return 0;
}

int cmd_launch(int argc, char **argv)
{
    /* first of all, so that a signal while the job's options are read stops launch with
     * its message and record rather than by the default action */
    struct sigaction sa = {.sa_handler = forward_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
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
        case O_BACKOFF: o.backoff = p.real; break;
        case O_HELP: opt_print_help(&launch_command, stdout); return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) goto usage;
    if (dd + 1 >= argc) {
        opt_error(&p, "no job to run: give it after --, e.g. pipetrain launch --max-restarts 3 "
                      "-- mpiexec -n 4 pipetrain train ... --checkpoint-dir ck/");
        goto usage;
    }
    launch_job j;
    char *ckpt_arg = NULL;
    int rc = PT_EXIT_USAGE;
    if (read_job(&o, &j, argc - dd - 1, argv + dd + 1, &ckpt_arg)) {
        fprintf(stderr, "pipetrain launch: %s\n", pt_error_get());
    } else if (o.log && open_log(&o)) {
        fprintf(stderr, "pipetrain launch: %s\n", pt_error_get());
    } else {
        /* the job's orphans become launch's children, for reap_orphans */
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        rc = launch_loop(&o, &j, ckpt_arg);
    }
    free(ckpt_arg);
    free(o.ckpt_dir);
    launch_job_free(&j);
    if (o.logf) fclose(o.logf);
    return rc;
usage:
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    return PT_EXIT_USAGE;
}
