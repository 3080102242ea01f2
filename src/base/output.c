#include "src/base/output.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"

static const char *kind_of(mode_t mode)
{
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

/* Splits path into its directory (into dir) and final name; −1 when it names no file. */
static int split_path(const char *what, const char *path, char *dir, size_t dir_size,
                      const char **name)
{
    size_t n = strlen(path);
    if (n == 0) return pt_error_set("%s: an empty path names no file", what);
    if (path[n - 1] == '/')
        return pt_error_set("%s %s: ends in '/', so it names a directory, not a file", what, path);
    const char *slash = strrchr(path, '/');
    *name = slash ? slash + 1 : path;
    if (!strcmp(*name, ".") || !strcmp(*name, ".."))
        return pt_error_set("%s %s: names a directory, not a file", what, path);
    if (strlen(*name) > 200) return pt_error_set("%s %s: the file name is too long", what, path);
    size_t d = slash ? (size_t)(slash - path) : 0;
    if (d + 2 > dir_size) return pt_error_set("%s %s: the path is too long", what, path);
    if (!slash) snprintf(dir, dir_size, ".");
    else if (d == 0) snprintf(dir, dir_size, "/");
    else snprintf(dir, dir_size, "%.*s", (int)d, path);
    return 0;
}

/* What is at name in dirfd may be replaced by a regular file: nothing, a regular file (its
 * mode into *mode) or a link. */
static int replaceable(const char *what, const char *path, int dirfd, const char *name,
                       mode_t *mode)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return 0;
        return pt_error_set("%s %s: %s", what, path, strerror(errno));
    }
    if (S_ISREG(st.st_mode)) {
        if (mode) *mode = st.st_mode & 07777;
        return 0;
    }
    if (S_ISLNK(st.st_mode)) return 0; /* replaced by the rename, never written through */
    return pt_error_set("%s %s: is %s; pipetrain writes only regular files and does not "
                        "replace this", what, path, kind_of(st.st_mode));
}

static int open_dir(const char *what, const char *path, const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return pt_error_set("%s %s: cannot create it: its directory %s: %s", what, path, dir,
                            strerror(errno));
    return fd;
}

/* An exclusive, unguessable temporary "NAME.tmp-PID-RANDOM" in dirfd. */
static int create_temporary(int dirfd, const char *name, char *tmp, size_t size, mode_t mode)
{
    for (int tries = 0; tries < 8; tries++) {
        unsigned long long r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) return -1;
        snprintf(tmp, size, "%s.tmp-%ld-%016llx", name, (long)getpid(), r);
        int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

int pt_output_check(const char *what, const char *path)
{
    char dir[4096];
    const char *name;
    if (split_path(what, path, dir, sizeof dir, &name)) return -1;
    int dirfd = open_dir(what, path, dir);
    if (dirfd < 0) return -1;
    int rc = replaceable(what, path, dirfd, name, NULL);
    /* the temporary the write will make, made and removed now: permission bits do not
     * stop root, and /proc or a full or read-only file system say no only to a creation */
    char tmp[4200];
    int fd = rc ? -1 : create_temporary(dirfd, name, tmp, sizeof tmp, 0600);
    if (!rc && fd < 0)
        rc = pt_error_set("%s %s: cannot create files in %s: %s", what, path, dir, strerror(errno));
    if (fd >= 0) {
        close(fd);
        unlinkat(dirfd, tmp, 0);
    }
    close(dirfd);
    return rc;
}

int pt_output_begin(pt_output *o, const char *path)
{
    memset(o, 0, sizeof *o);
    o->dirfd = o->fd = -1;
    char dir[4096];
    const char *name;
    if (snprintf(o->path, sizeof o->path, "%s", path) >= (int)sizeof o->path)
        return pt_error_set("%s: the path is too long", path);
    if (split_path("writing", path, dir, sizeof dir, &name)) return -1;
    snprintf(o->name, sizeof o->name, "%s", name);
    if ((o->dirfd = open_dir("writing", path, dir)) < 0) return -1;
    o->mode = (mode_t)-1;
    if (replaceable("writing", path, o->dirfd, o->name, &o->mode)) {
        close(o->dirfd);
        return -1;
    }
    /* 0666 less the umask, as fopen would make it (the kernel applies the umask: no
     * umask() call, which would race with other threads) */
    o->fd = create_temporary(o->dirfd, o->name, o->tmp, sizeof o->tmp, 0666);
    struct stat st;
    if (o->fd < 0 || fstat(o->fd, &st) != 0) {
        int e = errno;
        pt_output_abort(o);
        return pt_error_set("%s: cannot create a file beside it: %s", path, strerror(e));
    }
    if (o->mode == (mode_t)-1) o->mode = st.st_mode & 07777;
    return 0;
}

void pt_output_abort(pt_output *o)
{
    if (o->fd >= 0) {
        close(o->fd);
        unlinkat(o->dirfd, o->tmp, 0);
    }
    if (o->dirfd >= 0) close(o->dirfd);
    o->fd = o->dirfd = -1;
}

int pt_output_commit(pt_output *o)
{
    int rc = 0;
    /* the file's mode as an existing file had it (0600 stays 0600), else as umask says */
    if (fchmod(o->fd, o->mode) != 0 || fsync(o->fd) != 0)
        rc = pt_error_set("%s: write failed: %s", o->path, strerror(errno));
    int fd = o->fd;
    o->fd = -1;
    if (close(fd) != 0 && !rc) rc = pt_error_set("%s: write failed: %s", o->path, strerror(errno));
    /* the path may have become something else meanwhile: check again right before */
    if (!rc && replaceable("writing", o->path, o->dirfd, o->name, NULL)) rc = -1;
    if (!rc && renameat(o->dirfd, o->tmp, o->dirfd, o->name) != 0)
        rc = pt_error_set("%s: cannot rename %s into place: %s", o->path, o->tmp, strerror(errno));
    if (rc) unlinkat(o->dirfd, o->tmp, 0);
    else if (fsync(o->dirfd) != 0)
        rc = pt_error_set("%s: written, but its directory could not be flushed to disk: %s",
                          o->path, strerror(errno));
    close(o->dirfd);
    o->dirfd = -1;
    return rc;
}

int pt_output_probe_dir(const char *what, const char *dir)
{
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) return pt_error_set("%s %s: %s", what, dir, strerror(errno));
    char tmp[128];
    int fd = create_temporary(dirfd, ".pipetrain-probe", tmp, sizeof tmp, 0600);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        unlinkat(dirfd, tmp, 0);
    }
    close(dirfd);
    return fd >= 0 ? 0 : pt_error_set("%s %s: cannot write there: %s", what, dir, strerror(e));
}
