#include "src/base/io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"

/* What a non-regular file is, for the message. */
static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode)) return "is a directory";
    if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "is a character device";
    if (S_ISBLK(mode)) return "is a block device";
    if (S_ISSOCK(mode)) return "is a socket";
    return "is not a regular file";
}

static int refuse(const char *path, mode_t mode)
{
    return pt_error_set("%s: %s, not a regular file", path, file_kind(mode));
}

int pt_open_regular(const char *path)
{
    struct stat st;
    /* stat first: opening a device can have effects of its own */
    if (stat(path, &st) != 0)
        return pt_error_set("%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return refuse(path, st.st_mode);
    /* then the descriptor itself, in case the path changed in between; O_NONBLOCK so that
     * a FIFO put there meanwhile does not block the open */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return pt_error_set("%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return pt_error_set("%s: cannot open: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return refuse(path, st.st_mode);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        int err = errno;
        close(fd);
        return pt_error_set("%s: cannot open: %s", path, strerror(err));
    }
    return fd;
}

FILE *pt_fopen_regular(const char *path, const char *mode)
{
    int fd = pt_open_regular(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, mode);
    if (!f) {
        pt_error_set("%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

void pt_stdio_whole_lines(void)
{
    /* static: the streams use them until the process ends */
    static char out[1 << 16], err[1 << 14];
    fflush(stdout);
    fflush(stderr);
    setvbuf(stdout, out, _IOLBF, sizeof out);
    setvbuf(stderr, err, _IOLBF, sizeof err);
}
