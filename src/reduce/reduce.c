/* Gradient reduction inside a data-parallel group (src/reduce/reduce.h): the state machine
 * of the bucket reductions, their polite waits and statistics. Plans, method names and the
 * (stage, replica) layout are in src/reduce/reduce_plan.{h,c}. */
#include "src/reduce/reduce.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"

typedef enum {
    BUCKET_IDLE = 0, /* never started */
    BUCKET_PHASE1,   /* the collective (ordered: the reduce-scatter's exchange) in flight */
    BUCKET_SUMMED,   /* ordered: shard summed, its all-gather waits for its turn */
    BUCKET_PHASE2,   /* ordered: the all-gather in flight */
    BUCKET_DONE
} bucket_state;

typedef struct {
    bucket_state state;
    MPI_Request *req;      /* [pieces]: phase 1 has one per piece (ordered), else req[0] */
    float *dst;            /* the bucket's first element in the caller's (first) array */
    double t_start;
    reduce_bucket_stats st;
    /* ordered: shard j's count and offset in the bucket, and where rank j's piece p of this
     * rank's shard lands in scratch, recv_off[p·R + j] (MPI reads them until the requests
     * complete) */
    int *shard_cnt, *shard_off, *recv_cnt, *recv_off;
    float *scratch;        /* ordered: R × P × this rank's shard; gather-bcast root: R × count */
} bucket_run;

struct reduce {
    MPI_Comm comm;   /* the reductions and broadcasts */
    MPI_Comm comm2;  /* ordered: the all-gathers, started in their own order (see advance) */
    int rank, size, world_rank;
    int pieces;      /* P: arrays per rank (ordered), else 1 */
    char host[64];
    char group[200]; /* "the replica group of stage 1 (2 ranks: world 1, 3)" */
    reduce_config cfg;
    char name[64];
    reduce_plan plan;
    bucket_run *runs;
    int *queue;      /* ordered: started buckets whose all-gather is not started yet */
    int q_head, q_len;
    int active;      /* buckets in flight */
    int broken;      /* a wait failed: requests may be live, keep their memory */
    int *ints;       /* owned: every bucket's counts and displacements */
    MPI_Request *reqs; /* owned: every bucket's requests */
    float *scratch;  /* owned: every bucket's scratch (ZeRO-2: one, shared by the buckets) */
    size_t scratch_bytes; /* its size */
    MPI_Request *bcast_req;
    unsigned char *whole; /* zero: [buckets] 1 where the sum is kept whole (all-gathered) */
    reduce_stats st;
};

static int polite_dup(MPI_Comm in, MPI_Comm *out, double timeout_s)
{
    MPI_Request req;
    PT_MPI_CHECK(MPI_Comm_idup(in, out, &req));
    return mpi_wait_collective(&req, in, timeout_s);
}

/* "the replica group of stage 1 (2 ranks: world 1, 3)": which ranks to look at when a
 * reduction stalls. */
static void describe_group(reduce_t *r)
{
    int n = snprintf(r->group, sizeof r->group, "the replica group%s%s (%d rank%s: world",
                     r->name[0] ? " of " : "", r->name, r->size, r->size == 1 ? "" : "s");
    MPI_Group mine, world;
    int ok = MPI_Comm_group(r->comm, &mine) == MPI_SUCCESS &&
             MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS;
    enum { SHOWN = 16 };
    for (int i = 0; i < r->size && i < SHOWN && n < (int)sizeof r->group - 16; i++) {
        int w = MPI_UNDEFINED;
        if (ok) MPI_Group_translate_ranks(mine, 1, &i, world, &w);
        n += w == MPI_UNDEFINED ? snprintf(r->group + n, sizeof r->group - n, " ?")
                                : snprintf(r->group + n, sizeof r->group - n, " %d", w);
        if (i + 1 < r->size && i + 1 < SHOWN)
            n += snprintf(r->group + n, sizeof r->group - n, ",");
    }
    if (ok) {
        MPI_Group_free(&mine);
        MPI_Group_free(&world);
    }
    if (n < (int)sizeof r->group)
        snprintf(r->group + n, sizeof r->group - n, "%s)", r->size > SHOWN ? ", ..." : "");
}

/* Ordered: shard j of a bucket of n elements is [n·j/R, n·(j+1)/R). */
static size_t shard_start(size_t n, int j, int R) { return n * (size_t)j / (size_t)R; }

static int alloc_scratch(reduce_t *r)
{
    int R = r->size, nb = r->plan.n_buckets, P = r->pieces;
    size_t floats = 0;
    r->reqs = malloc((size_t)nb * (size_t)P * sizeof *r->reqs + 1);
    if (!r->reqs) return pt_error_set("out of memory for %d buckets' requests", nb);
    if (r->cfg.method == REDUCE_ORDERED || r->cfg.zero) {
        r->ints = malloc((size_t)nb * (3 + (size_t)P) * (size_t)R * sizeof *r->ints + 1);
        if (!r->ints) return pt_error_set("out of memory for %d buckets' shards", nb);
        for (int b = 0; b < nb; b++) {
            size_t n = r->plan.buckets[b].count;
            size_t mine = shard_start(n, r->rank + 1, R) - shard_start(n, r->rank, R);
            if ((size_t)R * P * mine > INT_MAX)
                return pt_error_set("bucket %d: %d ranks × %d pieces × %zu floats are more "
                                    "than one MPI message holds: lower --bucket-mb", b, R, P,
                                    mine);
            if (r->cfg.method != REDUCE_ORDERED) continue;
            if (r->cfg.zero >= 2) { /* one bucket at a time: the largest one's */
                if ((size_t)R * P * mine > floats) floats = (size_t)R * P * mine;
            } else {
                floats += (size_t)R * P * mine;
            }
        }
    } else if (r->cfg.method == REDUCE_GATHER_BCAST && r->rank == 0) {
        floats = (size_t)R * r->plan.total_count;
    }
    r->scratch_bytes = floats * sizeof(float) + 1;
    r->scratch = malloc(r->scratch_bytes);
    if (!r->scratch)
        return pt_error_set("out of memory for %zu bytes of reduction scratch (%s)",
                            floats * sizeof(float), reduce_method_name(r->cfg.method));
    size_t at = 0;
    for (int b = 0; b < nb; b++) {
        bucket_run *br = &r->runs[b];
        size_t n = r->plan.buckets[b].count;
        br->req = r->reqs + (size_t)b * P;
        for (int p = 0; p < P; p++) br->req[p] = MPI_REQUEST_NULL;
        br->scratch = r->scratch + at;
        if (r->cfg.method == REDUCE_GATHER_BCAST && r->rank == 0) at += (size_t)R * n;
        if (r->cfg.method != REDUCE_ORDERED && !r->cfg.zero) continue;
        int *ip = r->ints + (size_t)b * (3 + (size_t)P) * R;
        br->shard_cnt = ip;
        br->shard_off = ip + R;
        br->recv_cnt = ip + 2 * R;
        br->recv_off = ip + 3 * R;
        int mine = (int)(shard_start(n, r->rank + 1, R) - shard_start(n, r->rank, R));
        for (int j = 0; j < R; j++) { /* a bucket holds at most INT_MAX elements */
            br->shard_off[j] = (int)shard_start(n, j, R);
            br->shard_cnt[j] = (int)(shard_start(n, j + 1, R) - shard_start(n, j, R));
            br->recv_cnt[j] = mine;
            /* rank j's piece p is summand j·P + p (checked above to fit an int) */
            for (int p = 0; p < P; p++) br->recv_off[p * R + j] = (j * P + p) * mine;
        }
        if (r->cfg.method == REDUCE_ORDERED && r->cfg.zero < 2) at += (size_t)R * P * (size_t)mine;
    }
    return 0;
}

int reduce_init(reduce_t **out, MPI_Comm group, const reduce_plan *plan,
                const reduce_config *cfg)
{
    *out = NULL;
    if ((unsigned)cfg->method >= REDUCE_METHOD_COUNT)
        return pt_error_set("reduce_init: unknown reduction method %d", (int)cfg->method);
    if (!(cfg->timeout_s > 0))
        return pt_error_set("reduce_init: the timeout must be positive (got %g s)",
                            cfg->timeout_s);
    if (cfg->pieces < 0 || (cfg->pieces > 1 && cfg->method != REDUCE_ORDERED))
        return pt_error_set("reduce_init: %d gradient pieces per rank (only the ordered "
                            "method sums more than one)", cfg->pieces);
    if (cfg->zero && reduce_method_root_steps(cfg->method))
        return pt_error_set("reduce_init: --reduce %s steps on one rank: it has no shards "
                            "for ZeRO", reduce_method_name(cfg->method));
    reduce_t *r = calloc(1, sizeof *r);
    if (!r) return pt_error_set("out of memory");
    r->comm = r->comm2 = MPI_COMM_NULL;
    r->cfg = *cfg;
    r->pieces = cfg->pieces > 1 ? cfg->pieces : 1;
    if (cfg->name) snprintf(r->name, sizeof r->name, "%s", cfg->name);
    r->cfg.name = r->name;
    gethostname(r->host, sizeof r->host - 1);
    MPI_Comm_rank(MPI_COMM_WORLD, &r->world_rank);
    int nb = plan->n_buckets;
    r->plan = (reduce_plan){.n_buckets = nb, .total_count = plan->total_count,
                            .buckets = malloc((size_t)nb * sizeof(reduce_bucket) + 1)};
    r->runs = calloc((size_t)nb + 1, sizeof *r->runs);
    r->queue = malloc((size_t)nb * sizeof *r->queue + 1);
    r->bcast_req = malloc((size_t)nb * sizeof *r->bcast_req + 1);
    r->whole = calloc((size_t)nb + 1, 1);
    if (!r->plan.buckets || !r->runs || !r->queue || !r->bcast_req || !r->whole) {
        reduce_free(r);
        return pt_error_set("out of memory for %d buckets", nb);
    }
    if (nb) memcpy(r->plan.buckets, plan->buckets, (size_t)nb * sizeof(reduce_bucket));
    if (PT_MPI_CALL(MPI_Comm_rank(group, &r->rank)) ||
        PT_MPI_CALL(MPI_Comm_size(group, &r->size)) ||
        polite_dup(group, &r->comm, cfg->timeout_s) ||
        polite_dup(group, &r->comm2, cfg->timeout_s) || alloc_scratch(r)) {
        reduce_free(r);
        return -1;
    }
    describe_group(r);
    *out = r;
    return 0;
}

void reduce_free(reduce_t *r)
{
    if (!r) return;
    if (r->active || r->broken) return; /* MPI may still write there: leave it (header) */
    if (r->comm != MPI_COMM_NULL) MPI_Comm_free(&r->comm);
    if (r->comm2 != MPI_COMM_NULL) MPI_Comm_free(&r->comm2);
    reduce_plan_free(&r->plan);
    free(r->runs);
    free(r->queue);
    free(r->bcast_req);
    free(r->whole);
    free(r->ints);
    free(r->reqs);
    free(r->scratch);
    free(r);
}

int reduce_group_size(const reduce_t *r) { return r->size; }
int reduce_group_rank(const reduce_t *r) { return r->rank; }
const reduce_plan *reduce_get_plan(const reduce_t *r) { return &r->plan; }

static int check_bucket(const reduce_t *r, int b, const char *fn)
{
    if (b < 0 || b >= r->plan.n_buckets)
        return pt_error_set("%s: bucket %d does not exist (the plan has %d)", fn, b,
                            r->plan.n_buckets);
    return 0;
}

int reduce_start(reduce_t *r, float *grads, int b)
{
    if (check_bucket(r, b, "reduce_start")) return -1;
    if (r->pieces > 1)
        return pt_error_set("reduce_start: the reduction sums %d pieces per rank: use "
                            "reduce_start_pieces", r->pieces);
    float *g = grads + r->plan.buckets[b].offset;
    return reduce_start_pieces(r, b, &g);
}

int reduce_start_pieces(reduce_t *r, int b, float *const *pieces)
{
    if (check_bucket(r, b, "reduce_start")) return -1;
    bucket_run *br = &r->runs[b];
    if (br->state != BUCKET_IDLE && br->state != BUCKET_DONE)
        return pt_error_set("reduce_start: bucket %d is already being reduced", b);
    const reduce_bucket *bk = &r->plan.buckets[b];
    float *g = pieces[0];
    int n = (int)bk->count, root = r->rank == 0;
    br->dst = g;
    br->t_start = pt_now();
    switch (r->cfg.method) {
    case REDUCE_ALLREDUCE:
        if (r->cfg.zero && !r->whole[b]) /* the shard at the bucket's start (finish moves it) */
            PT_MPI_CHECK(MPI_Ireduce_scatter(MPI_IN_PLACE, g, br->shard_cnt, MPI_FLOAT,
                                             MPI_SUM, r->comm, &br->req[0]));
        else
            PT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, g, n, MPI_FLOAT, MPI_SUM, r->comm,
                                        &br->req[0]));
        break;
    case REDUCE_REDUCE_BCAST:
        PT_MPI_CHECK(MPI_Ireduce(root ? MPI_IN_PLACE : g, root ? g : NULL, n, MPI_FLOAT,
                                     MPI_SUM, 0, r->comm, &br->req[0]));
        break;
    case REDUCE_GATHER_BCAST:
        PT_MPI_CHECK(MPI_Igather(g, n, MPI_FLOAT, root ? br->scratch : NULL, n,
                                     MPI_FLOAT, 0, r->comm, &br->req[0]));
        break;
    case REDUCE_ORDERED:
        /* ZeRO-2: the buckets share one scratch (alloc_scratch) */
        for (int k = 0; r->cfg.zero >= 2 && k < r->plan.n_buckets; k++)
            if (k != b && r->runs[k].state == BUCKET_PHASE1)
                return pt_error_set("reduce_start: bucket %d would share ZeRO-2's scratch with "
                                    "bucket %d, still in flight (wait for each bucket first)",
                                    b, k);
        /* one exchange per piece, every rank starting them in piece order */
        for (int p = 0; p < r->pieces; p++)
            PT_MPI_CHECK(MPI_Ialltoallv(pieces[p], br->shard_cnt, br->shard_off, MPI_FLOAT,
                                        br->scratch, br->recv_cnt, br->recv_off + p * r->size,
                                        MPI_FLOAT, r->comm, &br->req[p]));
        /* zero: only the buckets kept whole are all-gathered */
        if (!r->cfg.zero || r->whole[b])
            r->queue[(r->q_head + r->q_len++) % r->plan.n_buckets] = b;
        break;
    case REDUCE_METHOD_COUNT: break;
    }
    br->state = BUCKET_PHASE1;
    r->active++;
    return 0;
}

static void finish(reduce_t *r, int b)
{
    bucket_run *br = &r->runs[b];
    double t = pt_now();
    br->state = BUCKET_DONE;
    br->dst = NULL;
    br->st.reductions++;
    br->st.reduce_s += t - br->t_start;
    br->st.t_start = br->t_start;
    br->st.t_end = t;
    r->st.reductions++;
    r->st.bytes += r->plan.buckets[b].count * sizeof(float);
    r->st.reduce_s += t - br->t_start;
    r->active--;
}

/* acc = g_0; acc += g_1; ... acc += g_{R−1}, element by element in float32: the one order
 * that REDUCE_ORDERED and REDUCE_GATHER_BCAST promise. */
static void sum_rank_order(float *acc, const float *pieces, size_t n, int R)
{
    memcpy(acc, pieces, n * sizeof *acc);
    for (int j = 1; j < R; j++) {
        const float *p = pieces + (size_t)j * n;
        for (size_t i = 0; i < n; i++) acc[i] += p[i];
    }
}

/* Ordered: the all-gathers start in the order the buckets were started, which is the
 * same on every rank, however their exchanges complete here (MPI matches collectives on a
 * communicator in the order they are started). */
static int start_allgathers(reduce_t *r)
{
    while (r->q_len) {
        int b = r->queue[r->q_head];
        bucket_run *br = &r->runs[b];
        if (br->state != BUCKET_SUMMED) break;
        PT_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, br->dst,
                                     br->shard_cnt, br->shard_off, MPI_FLOAT, r->comm2,
                                     &br->req[0]));
        br->state = BUCKET_PHASE2;
        r->q_head = (r->q_head + 1) % r->plan.n_buckets;
        r->q_len--;
    }
    return 0;
}

/* Tests every reduction in flight and moves the completed ones on. */
static int advance(reduce_t *r)
{
    for (int b = 0; b < r->plan.n_buckets && r->active; b++) {
        bucket_run *br = &r->runs[b];
        if (br->state != BUCKET_PHASE1 && br->state != BUCKET_PHASE2) continue;
        int nreq = br->state == BUCKET_PHASE1 && r->cfg.method == REDUCE_ORDERED ? r->pieces : 1;
        int done = 1;
        for (int k = 0; k < nreq && done; k++) /* a completed request turns null */
            PT_MPI_CHECK(MPI_Test(&br->req[k], &done, MPI_STATUS_IGNORE));
        if (!done) continue;
        const reduce_bucket *bk = &r->plan.buckets[b];
        if (br->state == BUCKET_PHASE1 && r->cfg.method == REDUCE_ORDERED) {
            size_t mine = (size_t)br->shard_cnt[r->rank];
            sum_rank_order(br->dst + br->shard_off[r->rank], br->scratch, mine,
                           r->size * r->pieces);
            br->state = BUCKET_SUMMED;
            if (r->cfg.zero && !r->whole[b]) finish(r, b); /* the shard is all it keeps */
            continue;
        }
        if (r->cfg.method == REDUCE_ALLREDUCE && r->cfg.zero && !r->whole[b] && r->rank > 0)
            memmove(br->dst + br->shard_off[r->rank], br->dst,
                    (size_t)br->shard_cnt[r->rank] * sizeof(float));
        if (r->cfg.method == REDUCE_GATHER_BCAST && r->rank == 0)
            sum_rank_order(br->dst, br->scratch, bk->count, r->size);
        finish(r, b);
    }
    return r->cfg.method == REDUCE_ORDERED ? start_allgathers(r) : 0;
}

int reduce_test(reduce_t *r)
{
    if (advance(r)) return -1;
    return r->active;
}

int reduce_done(const reduce_t *r, int b)
{
    return b >= 0 && b < r->plan.n_buckets && r->runs[b].state == BUCKET_DONE;
}

static void format_bytes(char *buf, size_t len, double bytes)
{
    if (bytes < 1024) snprintf(buf, len, "%.0f B", bytes);
    else if (bytes < 1024.0 * 1024) snprintf(buf, len, "%.1f KiB", bytes / 1024);
    else snprintf(buf, len, "%.1f MiB", bytes / (1024.0 * 1024));
}

static const char *phase_name(const reduce_t *r, bucket_state s)
{
    switch (r->cfg.method) {
    case REDUCE_ALLREDUCE: return "the allreduce";
    case REDUCE_REDUCE_BCAST: return "the reduce (reduce-bcast) to the group's first rank";
    case REDUCE_GATHER_BCAST: return "the gather (gather-bcast) to the group's first rank";
    case REDUCE_ORDERED:
        return s == BUCKET_PHASE2 ? "the all-gather of the ordered reduction"
                                  : "the reduce-scatter of the ordered reduction";
    case REDUCE_METHOD_COUNT: break;
    }
    return "the reduction";
}

/* The wait for what (a phase of bucket b, or b's broadcast) failed: a timeout when
 * timeout_s has passed since t0, else the MPI failure recorded by mpi_wait_collective. */
static int wait_failed(reduce_t *r, const char *what, int b, double t0)
{
    char cause[512];
    snprintf(cause, sizeof cause, "%s", pt_error_get());
    const reduce_bucket *bk = &r->plan.buckets[b];
    char size[32];
    format_bytes(size, sizeof size, (double)bk->count * sizeof(float));
    char layers[32];
    if (bk->first_layer == bk->last_layer) snprintf(layers, sizeof layers, "layer %d",
                                                    bk->first_layer);
    else snprintf(layers, sizeof layers, "layers %d-%d", bk->first_layer, bk->last_layer);
    char bucket[160];
    snprintf(bucket, sizeof bucket, "bucket %d of %d (%s, %zu floats, %s)", b,
             r->plan.n_buckets, layers, bk->count, size);
    if (pt_now() - t0 >= r->cfg.timeout_s)
        return pt_error_set("rank %d (%s): no progress for %g s in %s: %s in %s (--timeout); "
                            "a replica has died or stalled", r->world_rank, r->host,
                            r->cfg.timeout_s, bucket, what, r->group);
    return pt_error_set("rank %d (%s): %s failed: %s in %s: %s", r->world_rank, r->host,
                        bucket, what, r->group, cause);
}

/* A request of phase 1 not completed yet (the last one when all have: the wait then
 * returns at once). */
static MPI_Request *phase1_request(const reduce_t *r, bucket_run *br)
{
    int n = r->cfg.method == REDUCE_ORDERED ? r->pieces : 1;
    for (int p = 0; p < n - 1; p++)
        if (br->req[p] != MPI_REQUEST_NULL) return &br->req[p];
    return &br->req[n - 1];
}

/* The request that bucket b waits for: its own, or (ordered, all-gather not started) the
 * exchange of the oldest bucket before it whose all-gather must start first. */
static MPI_Request *blocking_request(reduce_t *r, int b, MPI_Comm *comm, int *blocker)
{
    *blocker = b;
    *comm = r->comm;
    bucket_run *br = &r->runs[b];
    if (br->state == BUCKET_PHASE2) {
        *comm = r->comm2;
        return &br->req[0];
    }
    for (int i = 0; i < r->q_len && br->state == BUCKET_SUMMED; i++) {
        int q = r->queue[(r->q_head + i) % r->plan.n_buckets];
        if (r->runs[q].state == BUCKET_PHASE1) {
            *blocker = q;
            return phase1_request(r, &r->runs[q]);
        }
    }
    return phase1_request(r, br);
}

int reduce_wait(reduce_t *r, int b)
{
    if (check_bucket(r, b, "reduce_wait")) return -1;
    if (r->runs[b].state == BUCKET_IDLE)
        return pt_error_set("reduce_wait: bucket %d was never started", b);
    double t0 = pt_now();
    int rc = 0;
    while (r->runs[b].state != BUCKET_DONE) {
        MPI_Comm comm;
        int blocker;
        MPI_Request *req = blocking_request(r, b, &comm, &blocker);
        const char *what = phase_name(r, r->runs[blocker].state);
        double left = r->cfg.timeout_s - (pt_now() - t0);
        if (left <= 0 || mpi_wait_collective(req, comm, left)) {
            rc = wait_failed(r, what, blocker, t0);
            r->broken = 1;
            break;
        }
        if ((rc = advance(r))) break;
    }
    r->st.exposed_s += pt_now() - t0;
    return rc;
}

int reduce_wait_all(reduce_t *r)
{
    for (int b = 0; b < r->plan.n_buckets; b++)
        if (r->runs[b].state != BUCKET_IDLE && r->runs[b].state != BUCKET_DONE &&
            reduce_wait(r, b))
            return -1;
    return 0;
}

int reduce_run(reduce_t *r, float *grads)
{
    for (int b = 0; b < r->plan.n_buckets; b++)
        if (reduce_start(r, grads, b)) return -1;
    return reduce_wait_all(r);
}

int reduce_broadcast(reduce_t *r, float *params)
{
    if (r->active)
        return pt_error_set("reduce_broadcast: %d bucket reductions are still in flight: "
                            "wait for them first", r->active);
    double t0 = pt_now();
    int nb = r->plan.n_buckets, rc = 0;
    for (int b = 0; b < nb; b++) r->bcast_req[b] = MPI_REQUEST_NULL;
    for (int b = 0; b < nb && !rc; b++)
        rc = PT_MPI_CALL(MPI_Ibcast(params + r->plan.buckets[b].offset,
                                        (int)r->plan.buckets[b].count, MPI_FLOAT, 0, r->comm,
                                        &r->bcast_req[b]));
    /* every broadcast started must be waited for, even after a failure: MPI writes params */
    for (int b = 0; b < nb; b++) {
        if (r->bcast_req[b] == MPI_REQUEST_NULL) continue;
        double tb = pt_now();
        if (mpi_wait_collective(&r->bcast_req[b], r->comm, r->cfg.timeout_s)) {
            rc = wait_failed(r, "the broadcast of the parameters from the group's first rank",
                             b, tb);
            r->broken = 1;
            break;
        }
    }
    double t = pt_now();
    r->st.exposed_s += t - t0;
    if (rc) return -1;
    r->st.broadcasts++;
    r->st.broadcast_bytes += r->plan.total_count * sizeof(float);
    r->st.broadcast_s += t - t0;
    return 0;
}

void reduce_get_stats(const reduce_t *r, reduce_stats *st) { *st = r->st; }

void reduce_get_bucket_stats(const reduce_t *r, int b, reduce_bucket_stats *st)
{
    *st = b >= 0 && b < r->plan.n_buckets ? r->runs[b].st : (reduce_bucket_stats){0};
}

void reduce_reset_stats(reduce_t *r)
{
    r->st = (reduce_stats){0};
    for (int b = 0; b < r->plan.n_buckets; b++) r->runs[b].st = (reduce_bucket_stats){0};
}

double reduce_bus_bandwidth(size_t bytes, double seconds, int ranks)
{
    if (ranks <= 1 || !(seconds > 0)) return 0;
    return 2.0 * (ranks - 1) / ranks * (double)bytes / seconds;
}

/* ---- ZeRO ------------------------------------------------------------------------------ */

int reduce_keep_whole(reduce_t *r, int b)
{
    if (check_bucket(r, b, "reduce_keep_whole")) return -1;
    r->whole[b] = 1;
    return 0;
}

int reduce_shard(const reduce_t *r, int b, int rank, size_t *off, size_t *count)
{
    if (check_bucket(r, b, "reduce_shard")) return -1;
    if (rank < 0 || rank >= r->size)
        return pt_error_set("reduce_shard: rank %d of a group of %d", rank, r->size);
    size_t n = r->plan.buckets[b].count, a = shard_start(n, rank, r->size);
    *off = r->plan.buckets[b].offset + a;
    *count = shard_start(n, rank + 1, r->size) - a;
    return 0;
}

/* Waits for every request of reqs[0..n) (all of them, even after a failure: MPI writes the
 * buffers); what = the collective, for the message. */
static int wait_each(reduce_t *r, MPI_Request *reqs, int n, const char *what)
{
    int rc = 0;
    for (int b = 0; b < n; b++) {
        if (reqs[b] == MPI_REQUEST_NULL) continue;
        double tb = pt_now();
        if (mpi_wait_collective(&reqs[b], r->comm, r->cfg.timeout_s)) {
            rc = wait_failed(r, what, b, tb);
            r->broken = 1;
            break;
        }
    }
    return rc;
}

int reduce_allgather_params(reduce_t *r, float *params)
{
    if (!r->cfg.zero) return pt_error_set("reduce_allgather_params: not a ZeRO reduction");
    if (r->active)
        return pt_error_set("reduce_allgather_params: %d bucket reductions are still in "
                            "flight: wait for them first", r->active);
    double t0 = pt_now();
    int nb = r->plan.n_buckets, rc = 0;
    for (int b = 0; b < nb; b++) r->bcast_req[b] = MPI_REQUEST_NULL;
    for (int b = 0; b < nb && !rc; b++)
        rc = PT_MPI_CALL(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                                         params + r->plan.buckets[b].offset,
                                         r->runs[b].shard_cnt, r->runs[b].shard_off, MPI_FLOAT,
                                         r->comm, &r->bcast_req[b]));
    if (wait_each(r, r->bcast_req, nb, "the all-gather of the parameters' shards (ZeRO)"))
        rc = -1;
    double t = pt_now();
    r->st.exposed_s += t - t0;
    if (rc) return -1;
    r->st.gathers++;
    r->st.gather_bytes += r->plan.total_count * sizeof(float);
    r->st.gather_s += t - t0;
    return 0;
}

int reduce_gather_shards(reduce_t *r, const float *compact, float *whole)
{
    int R = r->size, nb = r->plan.n_buckets, root = r->rank == 0;
    int *counts = calloc((size_t)R, sizeof *counts), *displs = calloc((size_t)R, sizeof *displs);
    float *all = root ? malloc(r->plan.total_count * sizeof *all + 1) : NULL;
    int rc = counts && displs && (!root || all) ? 0 : pt_error_set("out of memory");
    long at = 0;
    for (int j = 0; j < R && !rc; j++) { /* rank j's shards, bucket after bucket */
        long n = 0;
        for (int b = 0; b < nb; b++) n += r->runs[b].shard_cnt[j];
        if (at + n > INT_MAX) rc = pt_error_set("a stage's state is too large for MPI");
        counts[j] = (int)n;
        displs[j] = (int)at;
        at += n;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    if (!rc)
        rc = PT_MPI_CALL(MPI_Igatherv(compact, counts[r->rank], MPI_FLOAT, all, counts, displs,
                                      MPI_FLOAT, 0, r->comm, &req));
    if (!rc && wait_each(r, &req, 1, "the gather of the optimizer's shards (ZeRO)")) rc = -1;
    for (int j = 0; !rc && root && j < R; j++) {
        const float *src = all + displs[j];
        for (int b = 0; b < nb; b++) {
            const bucket_run *br = &r->runs[b];
            memcpy(whole + r->plan.buckets[b].offset + br->shard_off[j], src,
                   (size_t)br->shard_cnt[j] * sizeof *src);
            src += br->shard_cnt[j];
        }
    }
    free(counts);
    free(displs);
    free(all);
    return rc;
}
