#include "src/cpu/pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "src/base/error.h"

struct pool {
    int threads;
    pthread_t *tid;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation; /* bumped for every pool_run */
    int pending, stop;
    void (*fn)(void *, int);
    void *arg;
};

typedef struct {
    pool_t *p;
    int t;
} worker_arg;

static void *worker(void *v)
{
    worker_arg wa = *(worker_arg *)v;
    free(v);
    pool_t *p = wa.p;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->generation == seen && !p->stop) pthread_cond_wait(&p->start, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        p->fn(p->arg, wa.t);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int pool_init(pool_t **out, int threads)
{
    *out = NULL;
    if (threads < 1) return pt_error_set("pool: %d threads", threads);
    pool_t *p = calloc(1, sizeof *p);
    if (!p) return pt_error_set("pool: out of memory");
    p->threads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->tid = calloc((size_t)threads, sizeof *p->tid);
    if (!p->tid) {
        pool_free(p);
        return pt_error_set("pool: out of memory");
    }
    for (int t = 1; t < threads; t++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){p, t};
        if (!wa || pthread_create(&p->tid[t], NULL, worker, wa)) {
            free(wa);
            p->threads = t; /* join the ones that did start */
            pool_free(p);
            return pt_error_set("pool: cannot start thread %d of %d", t, threads);
        }
    }
    *out = p;
    return 0;
}

void pool_free(pool_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->threads; t++)
        if (p->tid[t]) pthread_join(p->tid[t], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->tid);
    free(p);
}

int pool_threads(const pool_t *p) { return p ? p->threads : 1; }

void pool_run(pool_t *p, void (*fn)(void *arg, int t), void *arg)
{
    if (!p || p->threads == 1) {
        fn(arg, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
