#include "src/train/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/output.h"

struct metrics {
    int fd;
    char path[512];
};

/* Each line goes out in one write(2) of the whole line, newline included, on a file opened
 * with O_APPEND: the kernel puts it in the file at once or not at all as far as a later
 * reader is concerned (a crash of this process cannot leave half of it in the page cache);
 * a short write (a full disk) is reported. No stdio buffer holds lines back. */
static int write_line(metrics_t *m, json_t *obj)
{
    char *text = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(obj);
    if (!text) return pt_error_set("%s: out of memory for a metrics line", m->path);
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps' terminator becomes the newline */
    ssize_t w = write(m->fd, text, n + 1);
    int err = errno;
    free(text);
    if (w != (ssize_t)(n + 1))
        return pt_error_set("%s: cannot write a metrics line: %s", m->path,
                            w < 0 ? strerror(err) : "short write (disk full?)");
    return 0;
}

/* {"type": type, ...obj} (the type first, for readers that look at it first); takes obj. */
static json_t *with_type(json_t *obj, const char *type)
{
    json_t *t = obj ? json_pack("{ss}", "type", type) : NULL;
    if (t && json_object_update(t, obj) == 0) {
        json_decref(obj);
        return t;
    }
    json_decref(t);
    json_decref(obj);
    return NULL;
}

/* The file through src/base/output.h, never through a link or a guessable name: an
 * exclusive temporary, put in place at once (empty), and kept open to append to, so that
 * a reader sees the lines as they come. The fd, or −1 with a message. */
static int create_in_place(const char *path)
{
    pt_output o;
    if (pt_output_begin(&o, path)) return -1;
    int fd = dup(o.fd);
    if (fd < 0 || fcntl(fd, F_SETFL, O_APPEND) != 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        pt_output_abort(&o);
        return pt_error_set("--metrics %s: %s", path, strerror(err));
    }
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (pt_output_commit(&o)) {
        close(fd);
        return -1;
    }
    return fd;
}

int metrics_open(metrics_t **out, const char *path, json_t *run)
{
    *out = NULL;
    metrics_t *m = calloc(1, sizeof *m);
    if (!m) {
        json_decref(run);
        return pt_error_set("out of memory");
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    m->fd = create_in_place(path);
    if (m->fd < 0) {
        free(m);
        json_decref(run);
        return -1;
    }
    run = with_type(run, "run");
    int rc = run ? write_line(m, run) : pt_error_set("out of memory for the metrics header");
    if (rc) {
        close(m->fd);
        free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int metrics_write(metrics_t *m, const char *type, json_t *line)
{
    line = with_type(line, type);
    return line ? write_line(m, line)
                : pt_error_set("%s: out of memory for a metrics line", m->path);
}

int metrics_close(metrics_t *m)
{
    if (!m) return 0;
    /* flushed to disk: a line the disk did not take is an error, not a silent loss */
    int rc = fsync(m->fd) ? pt_error_set("%s: %s", m->path, strerror(errno)) : 0;
    if (close(m->fd) && !rc) rc = pt_error_set("%s: %s", m->path, strerror(errno));
    free(m);
    return rc;
}
