#include "src/io/checkpoint_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/output.h"

static int mkdir_parents(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return pt_error_set("--checkpoint-dir %s: path too long", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pt_error_set("--checkpoint-dir %s: cannot create %s: %s", dir, buf,
                                strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return pt_error_set("--checkpoint-dir %s: cannot create it: %s", dir, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return pt_error_set("--checkpoint-dir %s: not a directory", dir);
    return 0;
}

/* The steps of DIR's checkpoints, newest first; *n of them. NULL with *n = 0 when none. */
static long *list_steps(const char *dir, int *n, int *err)
{
    *n = 0;
    *err = 0;
    DIR *d = opendir(dir);
    if (!d) {
        *err = errno;
        return NULL;
    }
    long *steps = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = ckpt_dir_name_step(e->d_name);
        if (s < 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            long *grown = realloc(steps, (size_t)cap * sizeof *steps);
            if (!grown) break;
            steps = grown;
        }
        steps[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* newest first */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return steps;
}

/* The lock held for the life of the process (flock goes with the descriptor, so a job that
 * dies, however it dies, frees the directory), and the directory it is on. */
static int lock_fd = -1;
static char lock_dir_path[4096];

/* flock on DIR/.pipetrain-lock, created without following a link; it holds "PID HOST" of
 * its holder, which a refused job names. Taking the lock again in the same process is a
 * no-op. */
static int lock_dir(const char *dir)
{
    if (lock_fd >= 0 && !strcmp(lock_dir_path, dir)) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/" CKPT_DIR_LOCK, dir);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int err = fd < 0 ? errno : EINVAL;
        if (fd >= 0) close(fd);
        return pt_error_set("--checkpoint-dir %s: cannot open its lock file %s: %s", dir,
                            CKPT_DIR_LOCK, strerror(err));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[256] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(fd);
        if (err != EWOULDBLOCK)
            return pt_error_set("--checkpoint-dir %s: cannot lock it: %s", dir, strerror(err));
        char pid[32] = "?", host[200] = "?";
        sscanf(holder, "%31s %199s", pid, host);
        return pt_error_set("--checkpoint-dir %s: in use by another job (pid %s on %s holds "
                            "%s/%s); one job per checkpoint directory", dir, pid, host, dir,
                            CKPT_DIR_LOCK);
    }
    char me[300], host[256] = "?";
    gethostname(host, sizeof host - 1);
    int len = snprintf(me, sizeof me, "%ld %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me, (size_t)len, 0) != len) { /* only a label */ }
    if (lock_fd >= 0) close(lock_fd);
    lock_fd = fd;
    snprintf(lock_dir_path, sizeof lock_dir_path, "%s", dir);
    return 0;
}

int ckpt_dir_prepare(const char *dir)
{
    if (mkdir_parents(dir)) return -1;
    /* an exclusive file under a name nobody can plant a link at (src/base/output.h) */
    if (pt_output_probe_dir("--checkpoint-dir", dir)) return -1;
    if (lock_dir(dir)) return -1;
    /* temporaries of a writer that was killed: never a checkpoint, only litter */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, "ckpt-", 5) == 0 && strstr(e->d_name, ".safetensors.tmp-")) {
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
    return 0;
}

void ckpt_dir_file(const char *dir, long step, char *buf, size_t size)
{
    snprintf(buf, size, "%s/ckpt-%010ld.safetensors", dir, step);
}

/* The "run_id" in a checkpoint's metadata, read from its header alone (the tensors are not
 * needed to prune): 0, or −1 when the file has none or cannot be read. */
static int run_id_of(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "rb");
    unsigned char len[8];
    if (!f) return -1;
    uint64_t n = 0;
    if (fread(len, 1, 8, f) == 8)
        for (int i = 7; i >= 0; i--) n = n << 8 | len[i];
    char *text = n > 0 && n < (64u << 20) ? malloc(n + 1) : NULL;
    int rc = -1;
    if (text && fread(text, 1, n, f) == n) {
        json_t *h = json_loadb(text, n, 0, NULL);
        const char *id = json_string_value(json_object_get(json_object_get(h, "__metadata__"),
                                                           "run_id"));
        if (id && strlen(id) < size) {
            snprintf(out, size, "%s", id);
            rc = 0;
        }
        json_decref(h);
    }
    free(text);
    fclose(f);
    return rc;
}

int ckpt_dir_prune(const char *dir, int keep, const char *run_id)
{
    int n, err;
    long *steps = list_steps(dir, &n, &err);
    if (err) return pt_error_set("%s: %s", dir, strerror(err));
    /* newest first: the run's first `keep` stay, its older ones go, other runs' stay */
    int mine = 0;
    for (int i = 0; i < n; i++) {
        char path[4200], id[64];
        ckpt_dir_file(dir, steps[i], path, sizeof path);
        if (run_id_of(path, id, sizeof id) != 0 || strcmp(id, run_id) != 0) continue;
        if (++mine > keep) unlink(path);
    }
    free(steps);
    return 0;
}

/* The metadata's step is the one the file's name gives (an edited step would skip steps). */
static int step_matches(const st_file *f, long step)
{
    char want[32];
    snprintf(want, sizeof want, "%ld", step);
    const char *have = st_meta(f, "step");
    return have && !strcmp(have, want);
}

/* A file that reads completely, is a pipetrain checkpoint marked complete, whose step is
 * the one its name gives (name_step ≥ 0: found in a directory), and passes the caller's
 * check. */
static int usable(const char *path, long name_step, ckpt_check_fn check, void *arg)
{
    st_file f;
    if (st_read(&f, path)) return -1;
    const char *fmt = st_meta(&f, "pipetrain_checkpoint"), *complete = st_meta(&f, "complete");
    int rc = 0;
    if (!fmt || strcmp(fmt, "1") != 0)
        rc = pt_error_set("%s: not a pipetrain checkpoint to resume from (no "
                          "pipetrain_checkpoint in its metadata: a --save file?)", path);
    else if (!complete || strcmp(complete, "1") != 0)
        rc = pt_error_set("%s: not marked complete", path);
    else if (name_step >= 0 && !step_matches(&f, name_step))
        rc = pt_error_set("%s: bad step '%s' in its metadata (its name says %ld)", path,
                          st_meta(&f, "step") ? st_meta(&f, "step") : "(none)", name_step);
    else if (check)
        rc = check(&f, path, arg);
    st_free(&f);
    return rc;
}

int ckpt_find_latest(const char *path, ckpt_check_fn check, void *arg, char *out, size_t size)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return pt_error_set("--resume %s: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        if (usable(path, -1, check, arg)) return -1;
        snprintf(out, size, "%s", path);
        return 0;
    }
    int n, err;
    long *steps = list_steps(path, &n, &err);
    if (err) return pt_error_set("--resume %s: %s", path, strerror(err));
    if (n == 0) {
        free(steps);
        return pt_error_set("--resume %s: no checkpoint in this directory (ckpt-STEP.safetensors)",
                            path);
    }
    for (int i = 0; i < n; i++) {
        char file[4200];
        ckpt_dir_file(path, steps[i], file, sizeof file);
        if (usable(file, steps[i], check, arg) == 0) {
            snprintf(out, size, "%s", file);
            free(steps);
            return 0;
        }
        fprintf(stderr, "pipetrain: refusing %s%s\n", pt_error_get(),
                i + 1 < n ? "; trying the previous checkpoint" : "");
    }
    free(steps);
    if (n == 1)
        return pt_error_set("--resume %s: its one checkpoint cannot be used (reason above)", path);
    return pt_error_set("--resume %s: none of its %d checkpoints can be used (reasons above)",
                        path, n);
}

long ckpt_dir_name_step(const char *name)
{
    if (strncmp(name, "ckpt-", 5) != 0) return -1;
    const char *p = name + 5;
    long step = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 18; p++, digits++) step = 10 * step + (*p - '0');
    return digits > 0 && strcmp(p, ".safetensors") == 0 ? step : -1;
}
