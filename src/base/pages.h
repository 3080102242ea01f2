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

#endif
