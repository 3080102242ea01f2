/* What the libFuzzer harnesses share: the fuzzer's bytes as a file the parsers can open
 * by path (an anonymous memory file, /proc/self/fd/N), since users hand pipetrain files. */
#ifndef PT_FUZZ_INPUT_H
#define PT_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    int fd;
    char path[64];
} fuzz_file;

/* 0, or −1 when the memory file cannot be made (then the harness skips the input). */
static inline int fuzz_file_open(fuzz_file *f, const uint8_t *data, size_t size)
{
    f->fd = memfd_create("pt-fuzz", 0);
    if (f->fd < 0) return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(f->fd, data + done, size - done);
        if (n <= 0) {
            close(f->fd);
            return -1;
        }
        done += (size_t)n;
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
    return 0;
}

static inline void fuzz_file_close(fuzz_file *f) { close(f->fd); }

#endif
