/* Anonymous pages that can be given back (src/base/pages.h). */
#define _DEFAULT_SOURCE
#include "src/base/pages.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t page_size(void)
{
    long n = sysconf(_SC_PAGESIZE);
    return n > 0 ? (size_t)n : 4096;
}

void *pages_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void pages_free(void *p, size_t bytes)
{
    if (p) munmap(p, bytes ? bytes : 1);
}

void pages_release(void *p, size_t bytes)
{
    size_t ps = page_size();
    uintptr_t a = ((uintptr_t)p + ps - 1) / ps * ps, b = ((uintptr_t)p + bytes) / ps * ps;
    /* MADV_DONTNEED on private anonymous memory: the pages read as zero afterwards */
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

void pages_zero(void *p, size_t bytes)
{
    size_t ps = page_size();
    uintptr_t s = (uintptr_t)p, e = s + bytes;
    uintptr_t a = (s + ps - 1) / ps * ps, b = e / ps * ps;
    if (b <= a) { /* inside one page, or two partial ones */
        memset(p, 0, bytes);
        return;
    }
    memset(p, 0, a - s);
    memset((void *)b, 0, e - b);
    madvise((void *)a, b - a, MADV_DONTNEED);
}

size_t pages_resident(const void *p, size_t bytes)
{
    if (!p || !bytes) return 0;
    size_t ps = page_size();
    uintptr_t a = (uintptr_t)p / ps * ps, b = ((uintptr_t)p + bytes + ps - 1) / ps * ps;
    size_t n = (b - a) / ps, in = 0;
    unsigned char *v = malloc(n);
    if (!v) return 0;
    if (mincore((void *)a, b - a, v) == 0)
        for (size_t i = 0; i < n; i++) in += v[i] & 1;
    free(v);
    return in * ps;
}
