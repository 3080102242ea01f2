/* Hybrid mode (src/runtime/replicas.h): buckets, backward parts, the schedule's reductions and the
 * run-time reductions of one stage among its replicas. */
#include "src/runtime/replicas.h"
#include "src/runtime/replicas_zero3.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_wait.h"

int replicas_overlap(const replicas_config *cfg)
{
    return cfg->overlap && !reduce_method_root_steps(cfg->method);
}

int replicas_plan(reduce_plan *plan, const net_desc *net, int first, int last,
                  const replicas_config *cfg)
{
    int n = last - first;
    if (first < 0 || last > net->n_layers || n < 1)
        return pt_error_set("replicas_plan: bad layer range [%d, %d)", first, last);
    reduce_layer *layers = malloc((size_t)n * sizeof *layers);
    if (!layers) return pt_error_set("out of memory");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const layer_desc *L = &net->layers[first + i];
        layers[i] = (reduce_layer){.offset = off, .count = L->weight_count + L->bias_count};
        off += layers[i].count;
    }
    /* the -bcast methods: the whole stage at once */
    size_t bytes = reduce_method_root_steps(cfg->method) ? SIZE_MAX : cfg->bucket_bytes;
    int rc = reduce_plan_buckets(plan, layers, n, bytes);
    free(layers);
    return rc;
}

int replicas_grad_pieces(const replicas_config *cfg)
{
    return cfg->replicas > 1 && cfg->method == REDUCE_ORDERED && cfg->microbatches > 1
               ? cfg->microbatches
               : 0;
}

int replicas_schedule(schedule *s, const net_desc *net, const partition *part,
                      const replicas_config *cfg)
{
    if (cfg->replicas <= 1) return 0;
    /* interleaved and V schedules: the partition holds K·V model chunks, chunk v of stage k
     * being model chunk schedule_model_chunk(s, k, v) */
    int K = s->stages, V = s->virtual_stages > 1 ? s->virtual_stages : 1;
    if (part->stages != K * V)
        return pt_error_set("replicas_schedule: %d stages × %d chunks in the schedule, %d in "
                            "the partition", K, V, part->stages);
    int *buckets = malloc((size_t)(K * V) * sizeof *buckets);
    const schedule **per_replica = malloc((size_t)cfg->replicas * sizeof *per_replica);
    int rc = buckets && per_replica ? 0 : pt_error_set("out of memory");
    for (int k = 0; k < K && !rc; k++)
        for (int v = 0; v < V && !rc; v++) {
            int c = schedule_model_chunk(s, k, v);
            reduce_plan plan;
            rc = replicas_plan(&plan, net, part->first[c], part->first[c + 1], cfg);
            buckets[k * V + v] = plan.n_buckets;
            reduce_plan_free(&plan);
        }
    if (!rc) rc = schedule_add_reductions_chunks(s, buckets, replicas_overlap(cfg));
    /* every replica runs this same list; the check is cheap and guards the generators */
    for (int r = 0; r < cfg->replicas && !rc; r++) per_replica[r] = s;
    if (!rc) rc = schedule_verify_replicas(per_replica, cfg->replicas);
    free(buckets);
    free(per_replica);
    return rc;
}

int replicas_rank_bucket_bytes(const schedule *s, const net_desc *net, const partition *part,
                               const replicas_config *cfg, int k, double **bytes, int *n,
                               int **chunk_of)
{
    int V = s->virtual_stages > 1 ? s->virtual_stages : 1;
    *bytes = NULL;
    *n = 0;
    int *of = NULL;
    for (int v = 0; v < V; v++) {
        int c = schedule_model_chunk(s, k, v);
        reduce_plan plan;
        if (replicas_plan(&plan, net, part->first[c], part->first[c + 1], cfg)) goto fail;
        size_t room = (size_t)*n + (size_t)plan.n_buckets + 1;
        double *grown = realloc(*bytes, room * sizeof **bytes);
        if (grown) *bytes = grown;
        int *grown_of = chunk_of ? realloc(of, room * sizeof *of) : NULL;
        if (grown_of) of = grown_of;
        if (!grown || (chunk_of && !grown_of)) {
            reduce_plan_free(&plan);
            pt_error_set("out of memory");
            goto fail;
        }
        for (int b = 0; b < plan.n_buckets; b++) {
            if (of) of[*n] = v;
            (*bytes)[(*n)++] = (double)plan.buckets[b].count * sizeof(float);
        }
        reduce_plan_free(&plan);
    }
    if (chunk_of) *chunk_of = of;
    return 0;
fail:
    free(*bytes);
    free(of);
    *bytes = NULL;
    *n = 0;
    return -1;
}

/* ---- run time ----------------------------------------------------------------------- */

struct replicas {
    replicas_config cfg;
    engine *eng;
    reduce_t *red;
    reduce_plan plan;     /* owned; layer indices local to the stage */
    int n_layers;         /* the stage's */
    int pieces;           /* P ≥ 1: gradient arrays per rank */
    int root, root_steps; /* this rank is the group's first; the method steps there only */
    float **ptrs;         /* [pieces] scratch for reduce_start_pieces */
    float *params;        /* -bcast methods: the broadcast parameters (param_count) */
    long *seen;           /* [buckets] reductions of each bucket counted so far */
    double *ev_t0, *ev_t1; /* [buckets] this step's interval, t1 < t0 when none */
    double step_bcast_s;  /* the broadcast (ZeRO: all-gather) of this step */
    engine_run *zruns;    /* ZeRO: [buckets] this replica's shard of each bucket */
    unsigned char *whole; /* ZeRO: [buckets] 1 where the sum is kept whole (a tie) */
    unsigned char *owed;  /* ZeRO-2: [buckets] started this step, memory not given back yet */
    unsigned char *given; /* ZeRO-2: [buckets × pieces] given back, not yet asked back (fill) */
    zero3_t *z3;          /* ZeRO-3: the parameters' gathers around each layer */
    replicas_stats st;
};

/* ZeRO: the buckets holding a tied pair's layers (the embedding's token matrix, the tied
 * head) keep their sum whole: exec_finish adds the two gradients across stages after the
 * reduction, position by position, and the two layers' shards fall on other replicas. */
static int keep_tied_whole(replicas_t *r, const net_desc *net, int first)
{
    if (net->tied_head < 0) return 0;
    for (int b = 0; b < r->plan.n_buckets; b++) {
        const reduce_bucket *bk = &r->plan.buckets[b];
        int lo = first + bk->first_layer, hi = first + bk->last_layer;
        if ((lo <= 0 && 0 <= hi) || (lo <= net->tied_head && net->tied_head <= hi)) {
            if (reduce_keep_whole(r->red, b)) return -1;
            r->whole[b] = 1;
        }
    }
    return 0;
}

/* ZeRO: this replica's runs, handed to the engine (which then allocates its shard's
 * optimizer state only). */
static int shard_engine(replicas_t *r)
{
    int nb = r->plan.n_buckets, me = reduce_group_rank(r->red);
    r->zruns = malloc((size_t)nb * sizeof *r->zruns + 1);
    if (!r->zruns) return pt_error_set("out of memory");
    for (int b = 0; b < nb; b++)
        if (reduce_shard(r->red, b, me, &r->zruns[b].off, &r->zruns[b].count)) return -1;
    if (r->eng->ops->optim_shard(r->eng, r->zruns, nb)) return -1;
    return r->cfg.zero >= 2 ? r->eng->ops->grads_shard(r->eng) : 0;
}

/* ZeRO-2: piece p's part of bucket b that goes back once the bucket's reduction
 * completes: all of it in the pieces past the first (summed into it), all but this
 * replica's shard of the sum in piece 0, which the step needs (none of a bucket kept
 * whole). `op` is the engine's grads_release or grads_fill, which takes the same part back. */
static int piece_part(replicas_t *r, int b, int p, int (*op)(engine *, int, size_t, size_t))
{
    const reduce_bucket *bk = &r->plan.buckets[b];
    const engine_run *z = &r->zruns[b];
    if (p > 0) return op(r->eng, p, bk->offset, bk->count);
    if (r->whole[b]) return 0;
    size_t end = bk->offset + bk->count, zend = z->off + z->count;
    if (op(r->eng, 0, bk->offset, z->off - bk->offset)) return -1;
    return op(r->eng, 0, zend, end - zend);
}

/* ZeRO-2: bucket b's reduction has completed: its parts go back. Once per start. With
 * P > 1 pieces only the last piece's: the pieces before it are formed by whole backwards
 * (the micro-batches before the last), which faulted every page of theirs in again each
 * step (a trap and a kernel clear per 4 KiB: 1.16× the unsharded step on the 9-layer MLP
 * at M = 2, issue 27), while the last piece's bucket parts take their pages back from the
 * engine's pool (replicas_part_begins). The gradients then hold P − 1 whole pieces and
 * about two buckets of the last: below the unsharded run's P whole pieces, and they keep
 * pages that the step's peak held anyway. */
static int give_back(replicas_t *r, int b)
{
    if (!r->owed || !r->owed[b]) return 0;
    r->owed[b] = 0;
    for (int p = r->pieces - 1; p < r->pieces; p++) {
        r->given[b * r->pieces + p] = 1;
        if (piece_part(r, b, p, r->eng->ops->grads_release)) return -1;
    }
    return 0;
}

int replicas_part_begins(replicas_t *r, int b, int m)
{
    if (!r->given || b >= r->plan.n_buckets) return 0;
    /* micro-batch m's piece only: the others' parts come back when theirs begin, so that
     * fewer pages wait in the engine's pool */
    int p = engine_piece_of(&r->eng->cfg, m);
    if (p < 0 || p >= r->pieces) p = 0;
    /* a whole backward (the micro-batches before the last, with --microbatches > 1) forms a
     * piece that kept its pages (give_back): nothing to fill */
    for (int k = 0; b < 0 && k < r->plan.n_buckets; k++) r->given[k * r->pieces + p] = 0;
    if (b < 0 || !r->given[b * r->pieces + p]) return 0;
    r->given[b * r->pieces + p] = 0;
    return r->eng->ops->grads_fill ? piece_part(r, b, p, r->eng->ops->grads_fill) : 0;
}

/* ZeRO-2: the memory of every bucket whose reduction has completed. */
static int give_back_done(replicas_t *r)
{
    for (int b = 0; r->owed && b < r->plan.n_buckets; b++)
        if (r->owed[b] && reduce_done(r->red, b) && give_back(r, b)) return -1;
    return 0;
}

int replicas_init(replicas_t **out, MPI_Comm group, engine *eng, const net_desc *net,
                  int first, int last, int stage_index, const replicas_config *cfg)
{
    *out = NULL;
    if (cfg->replicas <= 1) return 0;
    replicas_t *r = calloc(1, sizeof *r);
    if (!r) return pt_error_set("out of memory");
    r->cfg = *cfg;
    r->eng = eng;
    r->n_layers = last - first;
    r->root_steps = reduce_method_root_steps(cfg->method);
    int gp = replicas_grad_pieces(cfg);
    r->pieces = gp > 1 ? gp : 1;
    if (replicas_plan(&r->plan, net, first, last, cfg)) {
        free(r);
        return -1;
    }
    if (r->plan.n_buckets == 0) { /* nothing to reduce: every replica knows it */
        replicas_free(r);
        return 0;
    }
    if (r->plan.total_count != eng->param_count) {
        size_t planned = r->plan.total_count;
        replicas_free(r);
        return pt_error_set("stage %d: the bucket plan covers %zu parameters, the engine "
                            "holds %zu", stage_index, planned, eng->param_count);
    }
    const engine_ops *ops = eng->ops;
    int split = replicas_overlap(cfg) && r->plan.n_buckets > 1; /* backward parts */
    if (!ops->grads_host || !ops->grads_commit || (split && !ops->backward_range) ||
        (r->root_steps && !ops->zero_grads)) {
        replicas_free(r);
        return pt_error_set("the %s engine cannot run data-parallel replicas (it lacks the "
                            "gradient operations of src/engine/engine.h)", ops->name);
    }
    if (cfg->zero && (!ops->optim_shard || !ops->params_host || r->root_steps ||
                      (cfg->zero >= 2 && (!ops->grads_shard || !ops->grads_release)))) {
        int root_steps = r->root_steps, no_optim = !ops->optim_shard || !ops->params_host;
        replicas_free(r);
        return root_steps
                   ? pt_error_set("--zero %d: --reduce %s steps on one rank; use ordered or "
                                  "allreduce", cfg->zero, reduce_method_name(cfg->method))
               : no_optim
                   ? pt_error_set("--zero %d: the %s engine keeps no sharded optimizer state "
                                  "(ZeRO runs on the CPU engine)", cfg->zero, ops->name)
                   : pt_error_set("--zero %d: the %s engine cannot give its gradients' memory "
                                  "back (use --zero 1, or the CPU engine)", cfg->zero,
                                  ops->name);
    }
    int nb = r->plan.n_buckets;
    r->ptrs = calloc((size_t)r->pieces, sizeof *r->ptrs);
    r->seen = calloc((size_t)nb, sizeof *r->seen);
    r->ev_t0 = calloc((size_t)nb, sizeof *r->ev_t0);
    r->ev_t1 = calloc((size_t)nb, sizeof *r->ev_t1);
    r->whole = calloc((size_t)nb, 1);
    if (cfg->zero >= 2) r->owed = calloc((size_t)nb, 1);
    if (cfg->zero >= 2) r->given = calloc((size_t)nb * (size_t)r->pieces, 1);
    if (r->root_steps) r->params = malloc(eng->param_count * sizeof *r->params + 1);
    if (!r->ptrs || !r->seen || !r->ev_t0 || !r->ev_t1 || !r->whole ||
        (cfg->zero >= 2 && (!r->owed || !r->given)) || (r->root_steps && !r->params)) {
        replicas_free(r);
        return pt_error_set("out of memory for %d buckets", nb);
    }
    for (int b = 0; b < nb; b++) r->ev_t1[b] = r->ev_t0[b] - 1;
    char name[32];
    snprintf(name, sizeof name, "stage %d", stage_index);
    reduce_config rc = {.method = cfg->method, .timeout_s = cfg->timeout_s, .name = name,
                        .pieces = r->pieces, .zero = cfg->zero};
    if (reduce_init(&r->red, group, &r->plan, &rc) ||
        (cfg->zero && (keep_tied_whole(r, net, first) || shard_engine(r))) ||
        (cfg->zero >= 3 && zero3_init(&r->z3, group, eng, net, first, last, &r->plan, r->red,
                                      cfg->timeout_s, cfg->skip_bucket, cfg->zero3_prefetch))) {
        replicas_free(r);
        return -1;
    }
    r->root = reduce_group_rank(r->red) == 0;
    *out = r;
    return 0;
}

void replicas_free(replicas_t *r)
{
    if (!r) return;
    zero3_free(r->z3);
    reduce_free(r->red);
    reduce_plan_free(&r->plan);
    free(r->ptrs);
    free(r->params);
    free(r->seen);
    free(r->ev_t0);
    free(r->ev_t1);
    free(r->zruns);
    free(r->whole);
    free(r->owed);
    free(r->given);
    free(r);
}

int replicas_buckets(const replicas_t *r) { return r ? r->plan.n_buckets : 0; }

void replicas_plan_part_range(const reduce_plan *plan, int n_layers, int b, int *lo, int *hi)
{
    int nb = plan->n_buckets;
    *hi = b == 0 ? n_layers : plan->buckets[b - 1].first_layer;
    *lo = b == nb - 1 ? 0 : plan->buckets[b].first_layer;
}

void replicas_part_range(const replicas_t *r, int b, int *lo, int *hi)
{
    replicas_plan_part_range(&r->plan, r->n_layers, b, lo, hi);
}

static int check_bucket(const replicas_t *r, int b, const char *what)
{
    if (b < 0 || b >= r->plan.n_buckets)
        return pt_error_set("%s of bucket %d: the stage has %d buckets", what, b,
                            r->plan.n_buckets);
    return 0;
}

int replicas_start(replicas_t *r, int b)
{
    if (check_bucket(r, b, "the reduction")) return -1;
    if (b == r->cfg.skip_bucket && !r->z3) return 0;
    /* ZeRO-2: the buckets started before this one have had the backward of this bucket's
     * part to overlap; waiting for them now bounds the whole gradients held at once to
     * about two buckets (the one reduced, the one just formed) beyond the shards */
    for (int k = 0; r->owed && k < r->plan.n_buckets; k++)
        if (r->owed[k] && (reduce_wait(r->red, k) || give_back(r, k))) return -1;
    const reduce_bucket *bk = &r->plan.buckets[b];
    for (int p = 0; p < r->pieces; p++)
        if (engine_grads_host(r->eng, p, bk->offset, bk->count, &r->ptrs[p])) return -1;
    if (reduce_start_pieces(r->red, b, r->ptrs)) return -1;
    if (r->owed) r->owed[b] = 1;
    /* without overlap the backward goes on with this bucket's memory given back */
    if (r->owed && r->cfg.zero_serial && (reduce_wait(r->red, b) || give_back(r, b)))
        return -1;
    return 0;
}

int replicas_wait(replicas_t *r, int b)
{
    if (check_bucket(r, b, "the wait")) return -1;
    if (b == r->cfg.skip_bucket && !r->z3) return 0;
    if (reduce_wait(r->red, b) || give_back(r, b)) return -1;
    /* the -bcast methods: only the first rank has the sum */
    if (r->root_steps && !r->root) return 0;
    const reduce_bucket *bk = &r->plan.buckets[b];
    return engine_grads_commit(r->eng, bk->offset, bk->count);
}

const engine_run *replicas_shard_runs(const replicas_t *r, int *n)
{
    *n = r && r->zruns ? r->plan.n_buckets : 0;
    return r ? r->zruns : NULL;
}

/* ZeRO: the parameters' shards, stepped by their owners, to every replica. */
static int gather_params(replicas_t *r, double *spent)
{
    float *params;
    reduce_stats before, after;
    reduce_get_stats(r->red, &before);
    if (r->eng->ops->params_host(r->eng, &params) || reduce_allgather_params(r->red, params) ||
        (r->eng->ops->params_commit && r->eng->ops->params_commit(r->eng)))
        return -1;
    reduce_get_stats(r->red, &after);
    *spent = after.gather_s - before.gather_s;
    return 0;
}

int replicas_read_state(replicas_t *r, float *m, float *v, long *updates)
{
    if (!r->zruns) return engine_read_state(r->eng, m, v, updates);
    /* the engine reads into whole arrays: this rank's runs, then packed for the gather */
    size_t P = r->eng->param_count, mine = engine_runs_count(r->zruns, r->plan.n_buckets);
    float *tmp = malloc((2 * P + 2 * mine + 1) * sizeof *tmp);
    int rc = tmp ? engine_read_state(r->eng, tmp, tmp + P, updates)
                 : pt_error_set("out of memory for the optimizer's state");
    float *cm = tmp ? tmp + 2 * P : NULL, *cv = cm ? cm + mine : NULL;
    size_t k = 0;
    for (int b = 0; !rc && b < r->plan.n_buckets; b++) {
        const engine_run *z = &r->zruns[b];
        memcpy(cm + k, tmp + z->off, z->count * sizeof *cm);
        memcpy(cv + k, tmp + P + z->off, z->count * sizeof *cv);
        k += z->count;
    }
    /* every rank takes part in both gathers, even after a failure here */
    int g1 = reduce_gather_shards(r->red, rc ? NULL : cm, r->root ? m : NULL);
    int g2 = reduce_gather_shards(r->red, rc ? NULL : cv, r->root ? v : NULL);
    free(tmp);
    return rc || g1 || g2 ? -1 : 0;
}

int replicas_params_whole(replicas_t *r) { return r && r->z3 ? zero3_whole(r->z3) : 0; }

int replicas_params_done(replicas_t *r) { return r && r->z3 ? zero3_release_all(r->z3) : 0; }

int replicas_progress(replicas_t *r)
{
    return reduce_test(r->red) < 0 || give_back_done(r) ? -1 : 0;
}

int replicas_step(replicas_t *r, const optimizer_config *opt, int tick)
{
    if (r->z3) /* ZeRO-3: no gather after the step; each layer's comes before its passes */
        return zero3_settle(r->z3) || engine_step(r->eng, opt, tick) ||
                       zero3_release_all(r->z3)
                   ? -1
                   : 0;
    if (r->zruns) { /* ZeRO: each replica steps its shard, then all get every shard */
        double spent = 0;
        if (engine_step(r->eng, opt, tick) || gather_params(r, &spent)) return -1;
        r->step_bcast_s += spent;
        return 0;
    }
    if (!r->root_steps) return engine_step(r->eng, opt, tick);
    if (r->root) {
        if (engine_step(r->eng, opt, tick) || engine_read_params(r->eng, r->params)) return -1;
    } else if (engine_zero_grads(r->eng)) {
        return -1;
    }
    reduce_stats before, after;
    reduce_get_stats(r->red, &before);
    if (reduce_broadcast(r->red, r->params)) return -1;
    reduce_get_stats(r->red, &after);
    r->step_bcast_s += after.broadcast_s - before.broadcast_s;
    return r->root ? 0 : engine_write_params(r->eng, r->params);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One timed round: [0] the whole reduction, [1] the broadcast, [2] a single value; each
 * the slowest rank's, on every rank. */
static int calibrate_round(replicas_t *r, MPI_Comm group, double t[3])
{
    double timeout = r->cfg.timeout_s;
    /* line the ranks up, so that no rank's time includes waiting for a late one */
    if (mpi_wait_allreduce(&(int){0}, 1, MPI_INT, MPI_SUM, group, timeout)) return -1;
    double t0 = pt_now();
    for (int b = 0; b < r->plan.n_buckets; b++) {
        const reduce_bucket *bk = &r->plan.buckets[b];
        for (int p = 0; p < r->pieces; p++)
            if (engine_grads_host(r->eng, p, bk->offset, bk->count, &r->ptrs[p])) return -1;
        /* ZeRO-2 reduces one bucket at a time, as replicas_start does (its scratch) */
        if (reduce_start_pieces(r->red, b, r->ptrs) || (r->owed && reduce_wait(r->red, b)))
            return -1;
    }
    if (reduce_wait_all(r->red)) return -1;
    double t1 = pt_now();
    if (r->root_steps) {
        if (r->root && engine_read_params(r->eng, r->params)) return -1;
        if (reduce_broadcast(r->red, r->params)) return -1; /* the values every rank has */
    } else if (r->zruns && !r->z3) { /* ZeRO's all-gather (of what every rank has) */
        double spent;
        if (gather_params(r, &spent)) return -1;
    } else if (r->z3 && zero3_calibrate(r->z3)) {
        return -1; /* ZeRO-3: every layer's gather, what one pass of the stage waits for */
    }
    double t2 = pt_now();
    if (mpi_wait_allreduce(&(int){0}, 1, MPI_INT, MPI_SUM, group, timeout)) return -1;
    double t3 = pt_now(), one = 0;
    if (mpi_wait_allreduce(&one, 1, MPI_DOUBLE, MPI_SUM, group, timeout)) return -1;
    t[0] = t1 - t0;
    t[1] = t2 - t1;
    t[2] = pt_now() - t3;
    return mpi_wait_allreduce(t, 3, MPI_DOUBLE, MPI_MAX, group, timeout);
}

int replicas_calibrate(replicas_t *r, MPI_Comm group, int reps, replicas_calibration *out)
{
    *out = (replicas_calibration){0};
    if (!r) return 0;
    if (reps < 1) return pt_error_set("replicas_calibrate: %d rounds", reps);
    double *t = malloc(3 * (size_t)reps * sizeof *t);
    if (!t) return pt_error_set("out of memory");
    /* Untimed rounds first: MPI sets up its channels and buffers, the pages and caches
     * warm up (with one, the figures came out up to 40% slow). Then up to `reps` timed
     * rounds, at least 3, within about half a second: every rank sees the same (agreed)
     * times, so all stop at the same round. */
    enum { WARM_ROUNDS = 3, MIN_ROUNDS = 3 };
    const double budget_s = 0.5;
    int rc = 0, done = 0;
    double spent = 0, one[3];
    for (int i = 0; !rc && i < WARM_ROUNDS; i++) rc = calibrate_round(r, group, one);
    for (; !rc && done < reps && (done < MIN_ROUNDS || spent < budget_s); done++) {
        rc = calibrate_round(r, group, one);
        for (int k = 0; k < 3; k++) t[(size_t)k * reps + done] = one[k];
        spent += one[0] + one[1] + one[2];
    }
    if (r->z3) zero3_calibrate_done(r->z3);
    /* the module's figures and the gradients start afresh for training */
    if (!rc && r->eng->ops->zero_grads) rc = engine_zero_grads(r->eng);
    reduce_reset_stats(r->red);
    memset(r->seen, 0, (size_t)r->plan.n_buckets * sizeof *r->seen);
    if (rc) {
        free(t);
        return -1;
    }
    /* the medians, but the latency's least round: a round that waited on a busy core says
     * nothing about the link, and an inflated α left the buckets' bytes no time (β = ∞) */
    double med[3];
    for (int k = 0; k < 3; k++) {
        qsort(t + (size_t)k * reps, (size_t)done, sizeof *t, cmp_double);
        med[k] = t[(size_t)k * reps + (k == 2 ? 0 : done / 2)];
    }
    free(t);
    int R = reduce_group_size(r->red), B = r->plan.n_buckets;
    double steps = 2.0 * (R - 1), bytes = (double)r->plan.total_count * sizeof(float);
    out->reduce_s = med[0];
    out->bcast_s = r->root_steps || r->zruns ? med[1] : 0;
    out->latency_s = med[2];
    /* 2(R−1)α from the single value; β from what the buckets took beyond their latency */
    out->alpha = med[2] / steps;
    double rest = med[0] - B * steps * out->alpha;
    if (rest > 0.05 * med[0]) {
        out->beta = steps / R * bytes / rest;
    } else { /* latency-bound: the whole time is latency */
        out->alpha = med[0] / (B * steps);
        out->beta = INFINITY;
    }
    return 0;
}

/* Length of the union of the intervals [t0[i], t1[i]] with t1 ≥ t0. */
static double union_length(const double *t0, const double *t1, int n)
{
    double total = 0, end = -1e300;
    int *order = malloc((size_t)n * sizeof *order + 1);
    if (!order) return 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (t1[i] < t0[i]) continue;
        int j = m++;
        while (j > 0 && t0[order[j - 1]] > t0[i]) { /* insertion sort by start */
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (int k = 0; k < m; k++) {
        double a = t0[order[k]], b = t1[order[k]];
        if (a > end) {
            total += b - a;
            end = b;
        } else if (b > end) {
            total += b - end;
            end = b;
        }
    }
    free(order);
    return total;
}

void replicas_end_step(replicas_t *r)
{
    int nb = r->plan.n_buckets;
    for (int b = 0; b < nb; b++) {
        reduce_bucket_stats bs;
        reduce_get_bucket_stats(r->red, b, &bs);
        if (bs.reductions != r->seen[b]) {
            r->ev_t0[b] = bs.t_start;
            r->ev_t1[b] = bs.t_end;
            r->st.bytes += (size_t)(bs.reductions - r->seen[b]) * r->plan.buckets[b].count *
                           sizeof(float);
            r->seen[b] = bs.reductions;
        } else {
            r->ev_t1[b] = r->ev_t0[b] - 1;
        }
    }
    r->st.reduce_s += union_length(r->ev_t0, r->ev_t1, nb) + r->step_bcast_s;
    r->step_bcast_s = 0;
    reduce_stats rs;
    reduce_get_stats(r->red, &rs);
    r->st.exposed_s = rs.exposed_s;
    r->st.steps++;
}

int replicas_bucket_event(const replicas_t *r, int b, double *t0, double *t1, size_t *bytes)
{
    if (b < 0 || b >= r->plan.n_buckets || r->ev_t1[b] < r->ev_t0[b]) return 0;
    *t0 = r->ev_t0[b];
    *t1 = r->ev_t1[b];
    *bytes = r->plan.buckets[b].count * sizeof(float);
    return 1;
}

void replicas_get_stats(const replicas_t *r, replicas_stats *st)
{
    *st = r ? r->st : (replicas_stats){0};
}

void replicas_reset_stats(replicas_t *r)
{
    if (!r) return;
    r->st = (replicas_stats){0};
    reduce_reset_stats(r->red);
    /* the per-bucket counts restart with the module's */
    memset(r->seen, 0, (size_t)r->plan.n_buckets * sizeof *r->seen);
}
