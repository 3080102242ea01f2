/* Whole pages of anonymous memory whose physical backing can be given back while the
 * addresses stay: ZeRO-2 (src/runtime/replicas.h) keeps a stage's flat gradient array as
 * one range of addresses, so that the kernels address it as before, but a bucket's pages
 * outside this replica's shard go back to the system once the bucket is reduce-scattered.
 * Pages are backed on first touch and read as zero until written, so a fresh or released
 * range is also a zeroed one. */
#ifndef PT_PAGES_H
#define PT_PAGES_H

#include <stddef.h>

/* `bytes` of zeroed memory (at least 1), page-aligned, backed only where touched; NULL
 * when the system refuses. Free with pages_free and the same size. */
void *pages_alloc(size_t bytes);
void pages_free(void *p, size_t bytes);
/* The pages lying wholly inside [p, p + bytes) go back to the system: they read as zero
 * afterwards (the partial pages at either end are left as they are). p need not be
 * page-aligned, but must lie in a pages_alloc range. */
void pages_release(void *p, size_t bytes);
/* Zeroes [p, p + bytes): its whole pages are given back (pages_release), the partial pages
 * at either end are written with zeros. */
void pages_zero(void *p, size_t bytes);
/* Bytes of [p, p + bytes) (rounded out to whole pages) backed by physical memory now:
 * mincore(2), a measurement (0 when the system does not say). */
size_t pages_resident(const void *p, size_t bytes);


/* A pool of physical pages kept between a release and the next write (ZeRO-2, issue 27):
 * pages_pool_put moves the whole pages of a range into the pool instead of giving them to
 * the system, pages_pool_take moves pooled pages into the whole pages of another range.
 * Both move page tables (mremap of private anonymous memory): no fault, no kernel clear,
 * which a released page costs when the next backward writes it again. The range a move
 * leaves is mapped again at once (anonymous, no pages until touched, reading as zero), so
 * every address stays valid. A taken page holds whatever it held when put. */
typedef struct {
    char *base;   /* cap bytes of addresses; [base, base + used) holds the pooled pages */
    size_t cap, used;
    size_t limit; /* at most this many bytes pooled (pages_pool_limit; cap at first) */
} pages_pool;

/* Addresses for up to `bytes` pooled (no memory until pages arrive); −1 when refused. */
int pages_pool_init(pages_pool *pool, size_t bytes);
void pages_pool_free(pages_pool *pool);
/* The whole pages of [p, p + bytes) go into the pool, or back to the system past its
 * limit or where a move fails (as pages_release): they read as zero afterwards.
 * −1 only when a range could not be mapped again (then the caller must stop). */
int pages_pool_put(pages_pool *pool, void *p, size_t bytes);
/* Pooled pages into the whole pages of [p, p + bytes) from its start, as many as the pool
 * holds; *at and *moved: the part filled (*moved 0: none). −1 as pages_pool_put. */
int pages_pool_take(pages_pool *pool, void *p, size_t bytes, char **at, size_t *moved);
/* At most `keep` bytes (rounded up to pages, at most the capacity) pooled from now on: the
 * pooled pages past it go back to the system. */
void pages_pool_limit(pages_pool *pool, size_t keep);
/* Every pooled page back to the system. */
void pages_pool_drain(pages_pool *pool);
/* Bytes of the pool backed now (pages_resident). */
size_t pages_pool_resident(const pages_pool *pool);

#endif
