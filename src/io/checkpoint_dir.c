#include "src/io/checkpoint_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int ckpt_dir_prepare(const char *dir)
{
    if (mkdir_parents(dir)) return -1;
    /* an exclusive file under a name nobody can plant a link at (src/base/output.h) */
    if (pt_output_probe_dir("--checkpoint-dir", dir)) return -1;
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

int ckpt_dir_prune(const char *dir, int keep)
{
    int n, err;
    long *steps = list_steps(dir, &n, &err);
    if (err) return pt_error_set("%s: %s", dir, strerror(err));
    for (int i = keep; i < n; i++) {
        char path[4200];
        ckpt_dir_file(dir, steps[i], path, sizeof path);
        unlink(path);
    }
    free(steps);
    return 0;
}

/* A file that reads completely, is a pipetrain checkpoint marked complete, and passes the
 * caller's check. */
static int usable(const char *path, ckpt_check_fn check, void *arg)
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
        if (usable(path, check, arg)) return -1;
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
        if (usable(file, check, arg) == 0) {
            snprintf(out, size, "%s", file);
            free(steps);
            return 0;
        }
        fprintf(stderr, "pipetrain: refusing %s%s\n", pt_error_get(),
                i + 1 < n ? "; trying the previous checkpoint" : "");
    }
    free(steps);
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
