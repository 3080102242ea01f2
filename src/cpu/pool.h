/* A fork-join pool of sleeping worker threads: pool_run calls fn(arg, t) for t = 0..T−1,
 * the caller itself running t = 0, and returns when all are done. Workers wait on a
 * condition variable, never spin: ranks may share cores. */
#ifndef PT_POOL_H
#define PT_POOL_H

typedef struct pool pool_t; /* opaque: holds threads */

/* threads ≥ 1; with 1 no thread is started and pool_run calls fn inline. */
int pool_init(pool_t **p, int threads);
void pool_free(pool_t *p);
int pool_threads(const pool_t *p);
void pool_run(pool_t *p, void (*fn)(void *arg, int t), void *arg);

#endif
