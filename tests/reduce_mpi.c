/* The gradient reduction module (src/reduce/reduce.h) at any number of ranks; run by
 * tests/reduce_mpi.sh. A plain MPI program, not Criterion (DESIGN.md: Criterion's child
 * processes cannot reach mpiexec's process manager).
 *
 *   reduce_mpi [check]          every check; exit 0 only when every rank passed them all
 *   reduce_mpi timeout METHOD   the last rank never joins bucket 1: the others must fail
 *                               within the 1 s timeout; they print the module's message and
 *                               end the job with MPI_Abort (exit 3). A run that does not
 *                               time out prints "FAIL" and ends with exit 5 or 6.
 *
 * Each rank's gradients are g_r[i] = value(r, i), known to every rank, so every rank
 * computes the reference itself: ref = g_0; ref += g_1; ... in float32, rank order. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/runtime/exec.h"
#include "src/reduce/reduce.h"
#include "topologies/topo.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"

static int world_rank, world_size, checks, failures;
static const double TIMEOUT = 30;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            fprintf(stderr, "rank %d: FAIL %s:%d: ", world_rank, __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* A library call that must succeed; when it does not, the ranks may be out of step in
 * their collectives, so end them all rather than hang. */
#define OK(call)                                                                           \
    do {                                                                                   \
        if ((call) != 0) {                                                                 \
            fprintf(stderr, "rank %d: FAIL %s:%d: %s: %s\n", world_rank, __FILE__,         \
                    __LINE__, #call, pt_error_get());                                      \
            MPI_Abort(MPI_COMM_WORLD, 2);                                                  \
        }                                                                                  \
    } while (0)

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Signs and exponents vary (2^-12 .. 2^11) so that the order of a float32 sum shows. */
static float value(int r, size_t i, int salt)
{
    uint64_t h = mix(((uint64_t)salt << 48) ^ ((uint64_t)r << 32) ^ (uint64_t)i);
    float u = (float)((h >> 40) & 0xffffff) / 16777216.0f - 0.5f;
    return ldexpf(u, (int)((h >> 8) % 24) - 12);
}

static void fill(float *g, size_t n, int r, int salt)
{
    for (size_t i = 0; i < n; i++) g[i] = value(r, i, salt);
}

/* ref = g_0 + g_1 + ... + g_{R−1} in rank order (or reversed), and scale = Σ|g_r| for the
 * tolerance of the methods whose order MPI chooses. */
static void reference(float *ref, double *scale, size_t n, int R, int salt, int reversed)
{
    for (size_t i = 0; i < n; i++) {
        float acc = value(reversed ? R - 1 : 0, i, salt);
        double s = fabs(acc);
        for (int k = 1; k < R; k++) {
            float v = value(reversed ? R - 1 - k : k, i, salt);
            acc += v;
            s += fabs(v);
        }
        ref[i] = acc;
        if (scale) scale[i] = s;
    }
}

/* |a − ref| ≤ 1e-6 × Σ_r |g_r| for every element (the bound of any summation order);
 * prints the worst element when asked. Returns 1 when within. */
static int within(const float *a, const float *ref, const double *scale, size_t n,
                  const char *what, int verbose)
{
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / (scale[i] > 0 ? scale[i] : 1);
        if (!(d <= worst)) {
            worst = d;
            at = i;
        }
    }
    if (worst > 1e-6 && verbose)
        fprintf(stderr, "rank %d: %s: element %zu is %.9g, the rank-order sum %.9g (%.3g of "
                        "the summands' size)\n", world_rank, what, at, a[at], ref[at], worst);
    return worst <= 1e-6;
}

/* ---- plans ------------------------------------------------------------------------- */

static size_t layout(reduce_layer *l, const size_t *counts, int n)
{
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        l[i] = (reduce_layer){.offset = counts[i] ? at : 12345, .count = counts[i]};
        at += counts[i];
    }
    return at;
}

static void expect_bucket(const reduce_plan *p, int b, size_t offset, size_t count, int first,
                          int last)
{
    CHECK(b < p->n_buckets, "bucket %d missing (%d buckets)", b, p->n_buckets);
    if (b >= p->n_buckets) return;
    const reduce_bucket *k = &p->buckets[b];
    CHECK(k->offset == offset && k->count == count && k->first_layer == first &&
              k->last_layer == last,
          "bucket %d is [%zu, +%zu) layers %d-%d; expected [%zu, +%zu) layers %d-%d", b,
          k->offset, k->count, k->first_layer, k->last_layer, offset, count, first, last);
}

/* Layers 0..8 with 0, 40, 7, 0, 300, 0, 129, 5, 0 parameters. */
static const size_t MID[] = {0, 40, 7, 0, 300, 0, 129, 5, 0};
enum { N_MID = 9 };

static void test_plans(void)
{
    reduce_layer l[N_MID];
    size_t total = layout(l, MID, N_MID);
    reduce_plan p;
    /* 150 floats a bucket: 7+6 together, 4 (300) alone although larger, then 2+1 */
    OK(reduce_plan_buckets(&p, l, N_MID, 150 * sizeof(float)));
    CHECK(p.n_buckets == 3 && p.total_count == total, "%d buckets, %zu elements", p.n_buckets,
          p.total_count);
    expect_bucket(&p, 0, 347, 134, 6, 7);
    expect_bucket(&p, 1, 47, 300, 4, 4);
    expect_bucket(&p, 2, 0, 47, 1, 2);
    reduce_plan_free(&p);
    /* a size that is not a multiple of 4 bytes rounds down: 134 floats still fit in 537 */
    OK(reduce_plan_buckets(&p, l, N_MID, 537));
    CHECK(p.n_buckets == 3, "537 bytes: %d buckets", p.n_buckets);
    expect_bucket(&p, 0, 347, 134, 6, 7);
    reduce_plan_free(&p);
    OK(reduce_plan_buckets(&p, l, N_MID, 133 * sizeof(float)));
    expect_bucket(&p, 0, 476, 5, 7, 7); /* 129 + 5 no longer fit */
    expect_bucket(&p, 1, 347, 129, 6, 6);
    reduce_plan_free(&p);
    /* a huge bucket: one bucket of everything */
    OK(reduce_plan_buckets(&p, l, N_MID, (size_t)1 << 40));
    CHECK(p.n_buckets == 1, "huge buckets: %d buckets", p.n_buckets);
    expect_bucket(&p, 0, 0, total, 1, 7);
    reduce_plan_free(&p);
    /* 4 bytes: one bucket per layer with parameters, last layer first */
    OK(reduce_plan_buckets(&p, l, N_MID, 4));
    CHECK(p.n_buckets == 5, "4-byte buckets: %d buckets", p.n_buckets);
    expect_bucket(&p, 0, 476, 5, 7, 7);
    expect_bucket(&p, 4, 0, 40, 1, 1);
    for (int b = 1; b < p.n_buckets; b++)
        CHECK(p.buckets[b].offset + p.buckets[b].count == p.buckets[b - 1].offset,
              "bucket %d does not end where bucket %d starts", b, b - 1);
    reduce_plan_free(&p);
    /* no parameters at all */
    size_t none[] = {0, 0, 0};
    layout(l, none, 3);
    OK(reduce_plan_buckets(&p, l, 3, 1024));
    CHECK(p.n_buckets == 0 && p.total_count == 0, "no parameters: %d buckets", p.n_buckets);
    reduce_plan_free(&p);
    OK(reduce_plan_buckets(&p, l, 0, 1024));
    CHECK(p.n_buckets == 0, "no layers: %d buckets", p.n_buckets);
    reduce_plan_free(&p);
    /* bad input */
    layout(l, MID, N_MID);
    CHECK(reduce_plan_buckets(&p, l, N_MID, 0) == -1 && strstr(pt_error_get(), "--bucket-mb"),
          "bucket size 0: '%s'", pt_error_get());
    l[4].offset++;
    CHECK(reduce_plan_buckets(&p, l, N_MID, 1024) == -1 &&
              strstr(pt_error_get(), "layer 4's parameters start at element 48, expected 47"),
          "gap in the layout: '%s'", pt_error_get());
}

static void test_methods_parse(void)
{
    for (int m = 0; m < REDUCE_METHOD_COUNT; m++) {
        reduce_method got = REDUCE_METHOD_COUNT;
        CHECK(reduce_method_parse(reduce_method_name((reduce_method)m), &got) == 0 &&
                  got == (reduce_method)m, "method %d does not parse back", m);
    }
    reduce_method got;
    CHECK(reduce_method_parse("ring", &got) == -1 &&
              strstr(pt_error_get(), "'ring'") &&
              strstr(pt_error_get(), "allreduce, reduce-bcast, gather-bcast and ordered"),
          "unknown method: '%s'", pt_error_get());
    CHECK(reduce_method_root_steps(REDUCE_REDUCE_BCAST) &&
              reduce_method_root_steps(REDUCE_GATHER_BCAST) &&
              !reduce_method_root_steps(REDUCE_ALLREDUCE) &&
              !reduce_method_root_steps(REDUCE_ORDERED), "root_steps");
    CHECK(reduce_bus_bandwidth(1000, 1.0, 4) == 1500 && reduce_bus_bandwidth(1000, 1.0, 1) == 0 &&
              reduce_bus_bandwidth(1000, 0, 2) == 0, "bus bandwidth");
}

/* ---- reductions ---------------------------------------------------------------------- */

typedef struct {
    MPI_Comm comm;
    int rank, size;   /* in comm: replica = rank */
    const char *name; /* for messages */
} group_t;

/* The parameters the root's "optimizer" makes from the summed gradients, the same formula
 * everywhere so that the broadcast result can be compared bit for bit. */
static float param_of(size_t i, float grad) { return value(99, i, 7) - 0.125f * grad; }

/* One method on one plan: every bucket started in `order` (a permutation, the same on
 * every rank), reduce_test between starts, waits in `wait_order`; buckets whose entry in
 * `skip` is set are not reduced at all. Leaves the result in out (the params for the
 * -bcast methods, the gradients otherwise). */
static void run_method(const group_t *g, reduce_method m, const reduce_plan *plan, int salt,
                       const int *order, const int *wait_order, const int *skip, float *out,
                       reduce_stats *st)
{
    reduce_t *r;
    reduce_config cfg = {.method = m, .timeout_s = TIMEOUT, .name = g->name};
    OK(reduce_init(&r, g->comm, plan, &cfg));
    size_t n = plan->total_count;
    fill(out, n, g->rank, salt);
    for (int k = 0; k < plan->n_buckets; k++) {
        int b = order ? order[k] : k;
        if (skip && skip[b]) continue;
        OK(reduce_start(r, out, b));
        CHECK(reduce_test(r) >= 0, "reduce_test: %s", pt_error_get());
    }
    for (int k = 0; k < plan->n_buckets; k++) {
        int b = wait_order ? wait_order[k] : k;
        if (skip && skip[b]) continue;
        OK(reduce_wait(r, b));
        CHECK(reduce_done(r, b), "bucket %d not done after its wait", b);
    }
    OK(reduce_wait_all(r));
    CHECK(reduce_test(r) == 0, "reductions still in flight after reduce_wait_all");
    if (reduce_method_root_steps(m)) {
        float *params = malloc(n * sizeof *params + 1);
        for (size_t i = 0; i < n; i++) params[i] = g->rank == 0 ? param_of(i, out[i]) : NAN;
        OK(reduce_broadcast(r, params));
        memcpy(out, params, n * sizeof *out);
        free(params);
    }
    reduce_get_stats(r, st);
    reduce_free(r);
}

/* Checks one method on one plan against the rank-order sum, and that a second run gives
 * the same bits. */
static void check_method(const group_t *g, reduce_method m, const reduce_plan *plan, int salt,
                         const int *order, const int *wait_order, const char *label)
{
    size_t n = plan->total_count;
    float *a = malloc(n * sizeof *a + 1), *b = malloc(n * sizeof *b + 1),
          *ref = malloc(n * sizeof *ref + 1);
    double *scale = malloc(n * sizeof *scale + 1);
    reduce_stats st;
    run_method(g, m, plan, salt, order, wait_order, NULL, a, &st);
    run_method(g, m, plan, salt, order, wait_order, NULL, b, &st);
    reference(ref, scale, n, g->size, salt, 0);
    const char *name = reduce_method_name(m);
    CHECK(!memcmp(a, b, n * sizeof *a), "%s %s (%s): two runs differ", name, label, g->name);
    int root_steps = reduce_method_root_steps(m);
    if (root_steps) /* the expected parameters, from the reference sum */
        for (size_t i = 0; i < n; i++) ref[i] = param_of(i, ref[i]);
    if (m == REDUCE_ORDERED || m == REDUCE_GATHER_BCAST) {
        size_t bad = 0;
        while (bad < n && !memcmp(&a[bad], &ref[bad], sizeof *a)) bad++;
        CHECK(bad == n, "%s %s (%s): element %zu is %.9g, the rank-order result %.9g", name,
              label, g->name, bad, bad < n ? a[bad] : 0, bad < n ? ref[bad] : 0);
    } else {
        if (root_steps) /* the parameters: p0 − g/8 */
            for (size_t i = 0; i < n; i++) scale[i] = fabs(value(99, i, 7)) + scale[i] / 8;
        CHECK(within(a, ref, scale, n, name, 1), "%s %s (%s): beyond 1e-6", name, label,
              g->name);
    }
    /* statistics of the second run */
    size_t bytes = n * sizeof(float);
    CHECK(st.reductions == plan->n_buckets && st.bytes == bytes && st.reduce_s >= 0 &&
              st.exposed_s >= 0 && (!root_steps || (st.broadcasts == 1 &&
                                                    st.broadcast_bytes == bytes)),
          "%s %s: stats %ld reductions of %zu bytes, %ld broadcasts", name, label,
          st.reductions, st.bytes, st.broadcasts);
    free(a);
    free(b);
    free(ref);
    free(scale);
}

/* Plans of several shapes, bucket sizes below R elements included (empty shards). */
static void test_reductions(const group_t *g)
{
    static const size_t big[] = {5000, 0, 20000, 3, 1, 2};
    struct {
        const size_t *counts;
        int n;
        size_t bucket_bytes;
        const char *label;
    } plans[] = {
        {MID, N_MID, 150 * sizeof(float), "3 buckets"},
        {MID, N_MID, (size_t)1 << 30, "1 bucket"},
        {MID, N_MID, 4, "a bucket per layer"},
        {big, 6, 16384, "larger layers, 1-3 element buckets"},
    };
    for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++) {
        reduce_layer l[16];
        layout(l, plans[p].counts, plans[p].n);
        reduce_plan plan;
        OK(reduce_plan_buckets(&plan, l, plans[p].n, plans[p].bucket_bytes));
        for (int m = 0; m < REDUCE_METHOD_COUNT; m++)
            check_method(g, (reduce_method)m, &plan, (int)p + 1, NULL, NULL, plans[p].label);
        /* started in another order than the buckets' (the same on every rank, as it
         * must be), waited for in another order on each rank (which is allowed) */
        int order[16], wait_order[16], nb = plan.n_buckets;
        for (int k = 0; k < nb; k++) {
            order[k] = (k * 3 + 1) % nb; /* a permutation when 3 does not divide nb */
            wait_order[k] = (nb - 1 - k + g->rank) % nb;
        }
        if (nb % 3 == 0)
            for (int k = 0; k < nb; k++) order[k] = nb - 1 - k;
        check_method(g, REDUCE_ALLREDUCE, &plan, 11, order, wait_order, "reordered");
        check_method(g, REDUCE_ORDERED, &plan, 11, order, wait_order, "reordered");
        reduce_plan_free(&plan);
    }
}

/* The comparisons can fail: a bucket left out is caught, and the data make the summation
 * order visible (so that "bit-identical" says something). */
static void test_can_fail(const group_t *g)
{
    reduce_layer l[N_MID];
    layout(l, MID, N_MID);
    reduce_plan plan;
    OK(reduce_plan_buckets(&plan, l, N_MID, 150 * sizeof(float)));
    size_t n = plan.total_count;
    float *a = malloc(n * sizeof *a), *ref = malloc(n * sizeof *ref),
          *rev = malloc(n * sizeof *rev);
    double *scale = malloc(n * sizeof *scale);
    reference(ref, scale, n, g->size, 21, 0);
    int skip[3] = {0, 1, 0};
    reduce_stats st;
    run_method(g, REDUCE_ALLREDUCE, &plan, 21, NULL, NULL, skip, a, &st);
    const reduce_bucket *k = &plan.buckets[1];
    CHECK(within(a, ref, scale, k->offset, "", 0) &&
              within(a + k->offset + k->count, ref + k->offset + k->count,
                     scale + k->offset + k->count, n - k->offset - k->count, "", 0),
          "the buckets that were reduced differ");
    if (g->size > 1) {
        CHECK(!within(a, ref, scale, n, "", 0), "a bucket left out was not detected");
        CHECK(st.reductions == 2, "%ld reductions with a bucket left out", st.reductions);
    }
    if (g->size > 2) {
        reference(rev, NULL, n, g->size, 21, 1);
        CHECK(memcmp(ref, rev, n * sizeof *ref), "the data do not show the summation order");
    }
    free(a);
    free(ref);
    free(rev);
    free(scale);
    reduce_plan_free(&plan);
}

static void test_misuse(const group_t *g)
{
    reduce_layer l[N_MID];
    layout(l, MID, N_MID);
    reduce_plan plan;
    OK(reduce_plan_buckets(&plan, l, N_MID, 150 * sizeof(float)));
    reduce_t *r;
    reduce_config cfg = {.method = REDUCE_ALLREDUCE, .timeout_s = TIMEOUT};
    CHECK(reduce_init(&r, g->comm, &plan, &(reduce_config){.timeout_s = 0}) == -1,
          "timeout 0 accepted");
    OK(reduce_init(&r, g->comm, &plan, &cfg));
    float *grads = calloc(plan.total_count, sizeof *grads);
    CHECK(reduce_start(r, grads, 3) == -1 && strstr(pt_error_get(), "bucket 3 does not exist"),
          "bucket 3: '%s'", pt_error_get());
    CHECK(reduce_wait(r, 1) == -1 && strstr(pt_error_get(), "never started"),
          "wait before start: '%s'", pt_error_get());
    OK(reduce_start(r, grads, 1));
    CHECK(reduce_start(r, grads, 1) == -1 && strstr(pt_error_get(), "already"),
          "started twice: '%s'", pt_error_get());
    CHECK(reduce_broadcast(r, grads) == -1 && strstr(pt_error_get(), "still in flight"),
          "broadcast in flight: '%s'", pt_error_get());
    OK(reduce_wait(r, 1));
    OK(reduce_wait(r, 1)); /* done already */
    reduce_bucket_stats bs;
    reduce_get_bucket_stats(r, 1, &bs);
    CHECK(bs.reductions == 1 && bs.t_end >= bs.t_start && bs.reduce_s >= 0,
          "bucket stats: %ld reductions", bs.reductions);
    reduce_reset_stats(r);
    reduce_stats st;
    reduce_get_stats(r, &st);
    CHECK(st.reductions == 0 && st.bytes == 0, "stats not reset");
    reduce_free(r);
    free(grads);
    reduce_plan_free(&plan);
}

/* Ordered with P pieces per rank: piece p of rank r holds summand r·P + p, and every rank
 * must end with the bits of summing the R·P arrays in that order on one process (how
 * replicas reproduce a one-process run of R·P micro-batches). Other methods take one. */
static void test_pieces(const group_t *g)
{
    reduce_layer l[N_MID];
    layout(l, MID, N_MID);
    reduce_plan plan;
    OK(reduce_plan_buckets(&plan, l, N_MID, 150 * sizeof(float)));
    size_t n = plan.total_count;
    enum { P = 3 };
    float *pieces[P], *ref = malloc(n * sizeof *ref);
    for (int p = 0; p < P; p++) {
        pieces[p] = malloc(n * sizeof *pieces[p]);
        for (size_t i = 0; i < n; i++) pieces[p][i] = value(g->rank * P + p, i, 41);
    }
    reference(ref, NULL, n, g->size * P, 41, 0);
    reduce_t *r;
    reduce_config cfg = {.method = REDUCE_ORDERED, .timeout_s = TIMEOUT, .pieces = P};
    OK(reduce_init(&r, g->comm, &plan, &cfg));
    CHECK(reduce_start(r, pieces[0], 0) == -1 && strstr(pt_error_get(), "pieces"),
          "reduce_start with pieces: '%s'", pt_error_get());
    for (int b = plan.n_buckets - 1; b >= 0; b--) {
        float *at[P];
        for (int p = 0; p < P; p++) at[p] = pieces[p] + plan.buckets[b].offset;
        OK(reduce_start_pieces(r, b, at));
        CHECK(reduce_test(r) >= 0, "reduce_test: %s", pt_error_get());
    }
    OK(reduce_wait_all(r));
    reduce_free(r);
    size_t bad = 0;
    while (bad < n && !memcmp(&pieces[0][bad], &ref[bad], sizeof *ref)) bad++;
    CHECK(bad == n, "ordered, %d pieces (%s): element %zu is %.9g, the (rank, piece)-order "
          "sum %.9g", P, g->name, bad, bad < n ? pieces[0][bad] : 0, bad < n ? ref[bad] : 0);
    cfg.method = REDUCE_ALLREDUCE;
    CHECK(reduce_init(&r, g->comm, &plan, &cfg) == -1 && strstr(pt_error_get(), "pieces"),
          "allreduce with %d pieces accepted", P);
    for (int p = 0; p < P; p++) free(pieces[p]);
    free(ref);
    reduce_plan_free(&plan);
}

/* Every (stages, replicas) layout of the world: default placement, communicators, and the
 * ordered reduction inside each stage's group. */
static void test_layouts(void)
{
    for (int stages = 1; stages <= world_size; stages++) {
        if (world_size % stages) continue;
        int replicas = world_size / stages, s, p;
        OK(reduce_layout_default(world_rank, stages, replicas, &s, &p));
        CHECK(world_rank == topo_grid_rank(replicas, s, p),
              "default layout of rank %d: stage %d replica %d", world_rank, s, p);
        reduce_comms c;
        OK(reduce_comms_init(&c, MPI_COMM_WORLD, stages, replicas, s, p, TIMEOUT));
        int gr, gs, pr, ps;
        MPI_Comm_rank(c.group, &gr);
        MPI_Comm_size(c.group, &gs);
        MPI_Comm_rank(c.pipeline, &pr);
        MPI_Comm_size(c.pipeline, &ps);
        CHECK(gr == p && gs == replicas && pr == s && ps == stages,
              "%dx%d: group %d/%d pipeline %d/%d", stages, replicas, gr, gs, pr, ps);
        /* who is in each: the sums of world ranks */
        int sums[2] = {world_rank, world_rank};
        OK(mpi_wait_allreduce(&sums[0], 1, MPI_INT, MPI_SUM, c.group, TIMEOUT));
        OK(mpi_wait_allreduce(&sums[1], 1, MPI_INT, MPI_SUM, c.pipeline, TIMEOUT));
        int want_group = 0, want_pipe = 0;
        for (int k = 0; k < replicas; k++) want_group += s * replicas + k;
        for (int k = 0; k < stages; k++) want_pipe += k * replicas + p;
        CHECK(sums[0] == want_group && sums[1] == want_pipe,
              "%dx%d: group holds ranks summing to %d (want %d), pipeline %d (want %d)", stages,
              replicas, sums[0], want_group, sums[1], want_pipe);
        char name[32];
        snprintf(name, sizeof name, "stage %d", s);
        group_t g = {.comm = c.group, .rank = gr, .size = gs, .name = name};
        reduce_layer l[N_MID];
        layout(l, MID, N_MID);
        reduce_plan plan;
        OK(reduce_plan_buckets(&plan, l, N_MID, 150 * sizeof(float)));
        check_method(&g, REDUCE_ORDERED, &plan, 30 + s, NULL, NULL, "in a split group");
        reduce_plan_free(&plan);
        reduce_comms_free(&c);
    }
    /* bad layouts fail on every rank, the same way */
    reduce_comms c;
    CHECK(reduce_comms_init(&c, MPI_COMM_WORLD, world_size + 1, 1, world_rank, 0, TIMEOUT) ==
              -1 && strstr(pt_error_get(), "mpiexec -n"),
          "wrong world size: '%s'", pt_error_get());
    CHECK(reduce_comms_init(&c, MPI_COMM_WORLD, world_size, 0, world_rank, 0, TIMEOUT) == -1,
          "0 replicas accepted");
    if (world_size > 1)
        CHECK(reduce_comms_init(&c, MPI_COMM_WORLD, world_size, 1, 0, 0, TIMEOUT) == -1 &&
                  strstr(pt_error_get(), "two ranks were placed at stage 0, replica 0"),
              "duplicate placement: '%s'", pt_error_get());
    int s, p;
    CHECK(reduce_layout_default(world_size, world_size, 1, &s, &p) == -1,
          "rank outside the layout accepted");
}

/* ---- timeout ------------------------------------------------------------------------- */

static int run_timeout(const char *method_name)
{
    reduce_method m;
    OK(reduce_method_parse(method_name, &m));
    reduce_layer l[N_MID];
    layout(l, MID, N_MID);
    reduce_plan plan;
    OK(reduce_plan_buckets(&plan, l, N_MID, 150 * sizeof(float)));
    reduce_t *r;
    reduce_config cfg = {.method = m, .timeout_s = 1, .name = "stage 0"};
    OK(reduce_init(&r, MPI_COMM_WORLD, &plan, &cfg));
    float *grads = calloc(plan.total_count, sizeof *grads);
    OK(reduce_start(r, grads, 0));
    OK(reduce_wait(r, 0));
    if (world_rank == world_size - 1) { /* stalls: never joins bucket 1 */
        sleep(30);
        fprintf(stderr, "rank %d: FAIL: the stalled rank was not ended by the others\n",
                world_rank);
        MPI_Abort(MPI_COMM_WORLD, 5);
    }
    double t0 = pt_now();
    int rc = reduce_start(r, grads, 1);
    if (!rc) rc = reduce_wait(r, 1);
    if (!rc && reduce_method_root_steps(m)) rc = reduce_broadcast(r, grads);
    if (rc) {
        fprintf(stderr, "rank %d: after %.1f s: %s\n", world_rank, pt_now() - t0,
                pt_error_get());
        fflush(stderr);
        /* mpiexec may drop output it has not forwarded yet when the abort comes (seen
         * once, under load): give it a moment */
        usleep(300000);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    fprintf(stderr, "rank %d: FAIL: bucket 1 was reduced without the last rank\n", world_rank);
    MPI_Abort(MPI_COMM_WORLD, 6);
    return 1;
}

/* The polite split (src/base/mpi_wait.h) gives each rank the communicator MPI_Comm_split
 * gives, in every shape it treats apart: a duplicate, each rank alone, ranks without a
 * color, keys out of rank order, several groups; and keeps comm's error handler. */
static void test_splits(void)
{
    const int R = world_rank, N = world_size;
    const int shapes[][2] = {
        {0, R}, {0, 0}, {R, 0}, {R % 2 ? MPI_UNDEFINED : R, 0}, {0, N - R},
        {R / 2, R}, {R % 2, N - R}, {R == 0 ? MPI_UNDEFINED : 1, R},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        MPI_Comm mine, ref;
        OK(mpi_wait_split(MPI_COMM_WORLD, shapes[k][0], shapes[k][1], TIMEOUT, &mine));
        MPI_Comm_split(MPI_COMM_WORLD, shapes[k][0], shapes[k][1], &ref);
        CHECK((mine == MPI_COMM_NULL) == (ref == MPI_COMM_NULL), "split %zu: null differs", k);
        if (mine == MPI_COMM_NULL || ref == MPI_COMM_NULL) continue;
        int result = MPI_UNEQUAL;
        MPI_Comm_compare(mine, ref, &result);
        CHECK(result == MPI_CONGRUENT, "split %zu (color %d key %d): %d, not congruent", k,
              shapes[k][0], shapes[k][1], result);
        MPI_Errhandler eh;
        MPI_Comm_get_errhandler(mine, &eh);
        CHECK(eh == MPI_ERRORS_RETURN, "split %zu: the error handler is not world's", k);
        MPI_Errhandler_free(&eh);
        MPI_Comm_free(&mine);
        MPI_Comm_free(&ref);
    }
    MPI_Comm node;
    OK(mpi_wait_split_node(MPI_COMM_WORLD, N - R, TIMEOUT, &node));
    int size = 0, rank = -1;
    MPI_Comm_size(node, &size);
    MPI_Comm_rank(node, &rank);
    CHECK(size == N && rank == N - 1 - R, "node split: rank %d of %d", rank, size);
    MPI_Comm_free(&node);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    /* as the front end does: MPI errors come back as codes, checked by the module */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    const char *mode = argc > 1 ? argv[1] : "check";
    if (!strcmp(mode, "timeout") && argc > 2) return run_timeout(argv[2]);
    if (strcmp(mode, "check")) {
        if (world_rank == 0) fprintf(stderr, "usage: reduce_mpi [check | timeout METHOD]\n");
        MPI_Finalize();
        return 2;
    }
    double t0 = pt_now();
    test_plans();
    test_methods_parse();
    group_t world = {.comm = MPI_COMM_WORLD, .rank = world_rank, .size = world_size,
                     .name = "world"};
    test_reductions(&world);
    test_can_fail(&world);
    test_misuse(&world);
    test_pieces(&world);
    test_layouts();
    test_splits();
    int totals[2] = {checks, failures};
    OK(mpi_wait_allreduce(totals, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD, TIMEOUT));
    if (world_rank == 0) {
        if (totals[1])
            printf("reduce_mpi: %d of %d checks failed (%d ranks)\n", totals[1], totals[0],
                   world_size);
        else
            printf("reduce_mpi: all %d checks passed on %d ranks in %.2f s\n", totals[0],
                   world_size, pt_now() - t0);
    }
    MPI_Finalize();
    return totals[1] ? 1 : 0;
}
