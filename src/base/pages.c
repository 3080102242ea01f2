/* Anonymous pages that can be given back (src/base/pages.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mremap */
#endif
#include "src/base/pages.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
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

/* ---------------------------------------------------------------- the pool ---- */

static int whole_pages(void *p, size_t bytes, char **a, size_t *n)
{
    size_t ps = page_size();
    uintptr_t s = ((uintptr_t)p + ps - 1) / ps * ps, e = ((uintptr_t)p + bytes) / ps * ps;
    *a = (char *)s;
    *n = e > s ? e - s : 0;
    return *n > 0;
}

/* Fresh anonymous pages over [p, p + n): what a move leaves must stay addressable. */
static int map_again(char *p, size_t n)
{
    if (!n) return 0;
    void *q = mmap(p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return q == p ? 0 : -1;
}

/* mremap moves within one mapping only, and the earlier moves leave mappings of their own
 * (EFAULT where the range spans several): such a range is moved in halves. A failure
 * leaves some pages unmoved; the callers treat both ends as holding stale data. */
static int move_pages(char *src, char *dst, size_t n, size_t ps)
{
    /* the system call itself: libc's mremap may be interposed (UCX's libucm, under MPI,
     * drops the fifth argument, and the pages went elsewhere); the callers map the ranges
     * around it through libc (mmap, madvise), which such hooks see */
    if ((char *)syscall(SYS_mremap, src, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == dst)
        return 0;
    if (errno != EFAULT || n <= ps) return -1;
    size_t half = n / ps / 2 * ps;
    int r1 = move_pages(src, dst, half, ps);
    int r2 = move_pages(src + half, dst + half, n - half, ps);
    return r1 || r2 ? -1 : 0;
}

int pages_pool_init(pages_pool *pool, size_t bytes)
{
    size_t ps = page_size();
    pool->cap = (bytes + ps - 1) / ps * ps;
    pool->used = 0;
    pool->limit = pool->cap;
    pool->base = NULL;
    if (!pool->cap) return 0;
    void *p = mmap(NULL, pool->cap, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return -1;
    pool->base = p;
    return 0;
}

void pages_pool_free(pages_pool *pool)
{
    if (pool->base) munmap(pool->base, pool->cap);
    pool->base = NULL;
    pool->cap = pool->used = pool->limit = 0;
}

int pages_pool_put(pages_pool *pool, void *p, size_t bytes)
{
    char *a;
    size_t n;
    if (!whole_pages(p, bytes, &a, &n)) return 0;
    size_t room = pool->limit > pool->used ? pool->limit - pool->used : 0;
    size_t k = room < n ? room : n;
    if (k) {
        /* a failed move leaves stale or empty pages in the pool: taken, they are written
         * over or zeroed like any other */
        move_pages(a, pool->base + pool->used, k, page_size());
        pool->used += k;
        if (map_again(a, k)) return -1;
    }
    if (n > k) madvise(a + k, n - k, MADV_DONTNEED); /* past the limit: released */
    return 0;
}

int pages_pool_take(pages_pool *pool, void *p, size_t bytes, char **at, size_t *moved)
{
    char *a;
    size_t n;
    *at = p;
    *moved = 0;
    if (!whole_pages(p, bytes, &a, &n) || !pool->used) return 0;
    size_t k = pool->used < n ? pool->used : n;
    char *src = pool->base + pool->used - k; /* from the top: the pages put last */
    move_pages(src, a, k, page_size());
    pool->used -= k;
    *at = a;
    *moved = k;
    return map_again(src, k);
}

void pages_pool_limit(pages_pool *pool, size_t keep)
{
    size_t ps = page_size();
    keep = (keep + ps - 1) / ps * ps;
    pool->limit = keep < pool->cap ? keep : pool->cap;
    keep = pool->limit;
    if (keep >= pool->used) return;
    if (!keep) {
        pages_pool_drain(pool);
        return;
    }
    madvise(pool->base + keep, pool->used - keep, MADV_DONTNEED);
    pool->used = keep;
}

void pages_pool_drain(pages_pool *pool)
{
    /* one fresh mapping over the whole pool: its pages go, and the moves' mappings with them */
    if (pool->used && map_again(pool->base, pool->cap)) madvise(pool->base, pool->cap, MADV_DONTNEED);
    pool->used = 0;
}

size_t pages_pool_resident(const pages_pool *pool)
{
    return pool->used ? pages_resident(pool->base, pool->used) : 0;
}
