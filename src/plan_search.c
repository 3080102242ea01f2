/* `plan --ranks N [--memory-mb X]`: which layout of N ranks to run (src/cmd_plan.h).
 *
 * The space: stages K dividing N with K ≤ layers (replicas R = N / K, dividing the batch),
 * micro-batches M a power of two up to 64 dividing batch / R, and the schedules train runs
 * (gpipe and 1f1b; K = 1 runs 1f1b only, they are the same there). For each, the partition
 * is the --partition method's (by default "time": the exact dynamic programme over
 * contiguous cuts, on layer times profiled at that micro-batch size), the placement the
 * topology search of `plan --stages`, the step the schedule's simulator and the memory
 * plan_memory's. The search over (K, M, schedule) is exhaustive: at most
 * divisors(N) × 7 × 2 layouts, each simulated in well under a millisecond; the profile is
 * measured once per micro-batch size. What is not searched: uneven replica shares, the
 * reduction method, bucket size and overlap (taken from the options), and schedules train
 * cannot run yet. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/cmd_plan.h"

enum { MAX_M = 64, N_SCHEDULES = 2 };
static const char *const schedules[N_SCHEDULES] = {"1f1b", "gpipe"};

typedef struct {
    int stages, replicas, microbatches;
    const char *schedule;
    double step_s, bubble, peak_bytes;
    double *stage_bytes; /* owned */
    int *first;          /* owned: the partition, stages + 1 entries */
    int fits;
} candidate;

typedef struct {
    int microbatch;
    partition_profile prof;
} cached_profile;

static const partition_profile *profile_for(cached_profile *cache, int *n, const net_desc *net,
                                            int microbatch)
{
    for (int i = 0; i < *n; i++)
        if (cache[i].microbatch == microbatch) return &cache[i].prof;
    cached_profile *c = &cache[*n];
    if (partition_profile_measure(&c->prof, net, microbatch, 1, 3) < 0) return NULL;
    c->microbatch = microbatch;
    (*n)++;
    return &c->prof;
}

/* Fastest first; among equal times, less memory, then fewer stages. */
static int by_step(const void *pa, const void *pb)
{
    const candidate *a = pa, *b = pb;
    if (a->fits != b->fits) return b->fits - a->fits;
    if (a->step_s != b->step_s) return a->step_s < b->step_s ? -1 : 1;
    if (a->peak_bytes != b->peak_bytes) return a->peak_bytes < b->peak_bytes ? -1 : 1;
    return a->stages - b->stages;
}

static void describe(char *buf, size_t size, const candidate *c)
{
    snprintf(buf, size, "--stages %d --replicas %d --microbatches %d --schedule %s", c->stages,
             c->replicas, c->microbatches, c->schedule);
}

/* Why `b` ranks below `a`, in words. */
static void why_lost(char *buf, size_t size, const candidate *a, const candidate *b)
{
    char ta[32], tb[32];
    topo_format_seconds(ta, sizeof ta, a->step_s);
    topo_format_seconds(tb, sizeof tb, b->step_s);
    double pct = a->step_s > 0 ? 100 * (b->step_s / a->step_s - 1) : 0;
    const char *cause =
        b->bubble > a->bubble + 0.02 ? "more of its step is pipeline bubble"
        : b->stages < a->stages      ? "fewer stages leave each rank more layers to compute"
        : b->replicas < a->replicas  ? "fewer replicas: each rank computes more samples"
        : b->replicas > a->replicas  ? "its gradient reductions cost more than the work they share"
        : b->microbatches > a->microbatches ? "smaller micro-batches run the kernels less efficiently"
                                             : "its stages are less balanced";
    snprintf(buf, size, "predicted step %s against %s (+%.1f%%, bubble %.3f against %.3f): %s",
             tb, ta, pct, b->bubble, a->bubble, cause);
}

static int print_json(const plan_args *a, const candidate *c, int n, int shown,
                      const candidate *smallest)
{
    json_t *o = json_object(), *arr = json_array();
    int ok = o && arr;
    for (int i = 0; ok && i < shown; i++) {
        json_t *j = json_pack("{s:i, s:i, s:i, s:s, s:f, s:f, s:f, s:b}", "stages",
                              c[i].stages, "replicas", c[i].replicas, "microbatches",
                              c[i].microbatches, "schedule", c[i].schedule, "step_s",
                              c[i].step_s, "bubble", c[i].bubble, "peak_bytes",
                              c[i].peak_bytes, "fits", c[i].fits);
        json_t *first = json_array(), *mem = json_array();
        for (int s = 0; s <= c[i].stages; s++) json_array_append_new(first, json_integer(c[i].first[s]));
        for (int s = 0; s < c[i].stages; s++)
            json_array_append_new(mem, json_real(c[i].stage_bytes[s]));
        ok = j && !json_object_set_new(j, "partition_first", first) &&
             !json_object_set_new(j, "stage_memory_bytes", mem) && !json_array_append_new(arr, j);
    }
    if (ok) {
        json_object_set_new(o, "model", json_string(a->model));
        json_object_set_new(o, "ranks", json_integer(a->ranks));
        json_object_set_new(o, "batch", json_integer(a->batch));
        json_object_set_new(o, "memory_limit_bytes",
                            a->memory_mb > 0 ? json_real(a->memory_mb * 1048576.0) : json_null());
        json_object_set_new(o, "layouts_searched", json_integer(n));
        json_object_set_new(o, "choices", arr);
        json_object_set_new(o, "smallest_peak_bytes", json_real(smallest->peak_bytes));
    } else {
        json_decref(arr);
    }
    return topo_json_print(ok ? o : NULL, stdout);
}

int plan_search(const plan_args *base, const net_desc *net, const topo_machine *m,
                const topo_cost_model *cm)
{
    int N = base->ranks, cap = 0;
    for (int K = 1; K <= N; K++) cap += N % K == 0;
    cap *= 7 * N_SCHEDULES;
    candidate *c = calloc((size_t)cap, sizeof *c);
    cached_profile cache[8];
    int n = 0, n_prof = 0, rc = 1;
    if (!c) {
        fprintf(stderr, "pipetrain: out of memory\n");
        return 1;
    }
    for (int K = 1; K <= N && K <= net->n_layers; K++) {
        int R = N / K;
        if (N % K || base->batch % R) continue;
        int rb = base->batch / R;
        for (int M = 1; M <= MAX_M && M <= rb; M *= 2) {
            if (rb % M) continue;
            const partition_profile *prof = profile_for(cache, &n_prof, net, rb / M);
            if (!prof) goto out;
            for (int k = 0; k < N_SCHEDULES; k++) {
                if (K == 1 && strcmp(schedules[k], "1f1b")) continue;
                plan_args a = *base;
                a.stages = K, a.replicas = R, a.microbatches = M, a.replica_batch = rb;
                a.schedule = schedules[k];
                plan_built b;
                if (plan_build(&b, &a, net, prof, m, cm) < 0) goto out;
                candidate *x = &c[n++];
                *x = (candidate){.stages = K, .replicas = R, .microbatches = M,
                                 .schedule = schedules[k], .step_s = b.pred.step_s,
                                 .bubble = b.pred.bubble, .peak_bytes = b.peak_bytes,
                                 .stage_bytes = b.stage_bytes, .first = b.part.first};
                x->fits = base->memory_mb <= 0 || x->peak_bytes <= base->memory_mb * 1048576.0;
                b.stage_bytes = NULL; /* kept by the candidate */
                b.part.first = NULL;
                plan_built_free(&b);
            }
        }
    }
    if (n == 0) {
        pt_error_set("no layout of %d ranks: the batch of %d does not split over any "
                     "replica count that leaves whole stages (--batch)", N, base->batch);
        goto out;
    }
    qsort(c, (size_t)n, sizeof *c, by_step);
    const candidate *smallest = &c[0];
    for (int i = 1; i < n; i++)
        if (c[i].peak_bytes < smallest->peak_bytes) smallest = &c[i];
    if (!c[0].fits) {
        char lay[160];
        describe(lay, sizeof lay, smallest);
        pt_error_set("no layout of %d ranks fits in --memory-mb %g per rank: the smallest needs "
                     "%.2f MiB per rank (%s)", N, base->memory_mb,
                     smallest->peak_bytes / 1048576.0, lay);
        goto out;
    }
    int fitting = 0;
    while (fitting < n && c[fitting].fits) fitting++;
    int shown = fitting < base->top ? fitting : base->top;
    if (base->json) {
        rc = print_json(base, c, n, shown, smallest) ? 1 : 0;
        goto done;
    }
    printf("Plan for %d ranks: %s, batch %d, partition \"%s\", on %s; %d layouts simulated",
           N, base->model, base->batch, base->method, m->source, n);
    if (base->memory_mb > 0)
        printf(", %d fit in %g MiB per rank", fitting, base->memory_mb);
    printf("\n(step: the schedule's simulator on layer times profiled on this machine's CPU; "
           "memory: the largest stage's rank)\n\n");
    printf("%3s %6s %8s %4s %-9s %11s %7s %12s  %s\n", "#", "stages", "replicas", "M",
           "schedule", "step", "bubble", "MiB/rank", "partition (first layer of each stage)");
    for (int i = 0; i < shown; i++) {
        char st[32], cut[128] = "";
        topo_format_seconds(st, sizeof st, c[i].step_s);
        for (int s = 0, len = 0; s < c[i].stages && len < (int)sizeof cut - 8; s++)
            len += snprintf(cut + len, sizeof cut - (size_t)len, "%s%d", s ? "," : "",
                            c[i].first[s]);
        printf("%3d %6d %8d %4d %-9s %11s %7.3f %12.2f  %s\n", i + 1, c[i].stages,
               c[i].replicas, c[i].microbatches, c[i].schedule, st, c[i].bubble,
               c[i].peak_bytes / 1048576.0, cut);
    }
    char lay[160], why[256];
    describe(lay, sizeof lay, &c[0]);
    printf("\nChoice: %s\n", lay);
    if (fitting > 1) {
        why_lost(why, sizeof why, &c[0], &c[1]);
        printf("Runner-up lost: %s\n", why);
    }
    if (fitting < n) {
        /* the fastest layout the limit excluded, if it would have won */
        const candidate *x = &c[fitting];
        for (int i = fitting + 1; i < n; i++)
            if (c[i].step_s < x->step_s) x = &c[i];
        if (x->step_s < c[0].step_s) {
            char st[32];
            describe(lay, sizeof lay, x);
            topo_format_seconds(st, sizeof st, x->step_s);
            printf("Excluded by the memory limit: %s would take %s per step but needs %.2f "
                   "MiB per rank\n", lay, st, x->peak_bytes / 1048576.0);
        }
    }
    rc = 0;
    goto done;
out:
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    rc = 1;
done:
    for (int i = 0; i < n; i++) {
        free(c[i].stage_bytes);
        free(c[i].first);
    }
    free(c);
    for (int i = 0; i < n_prof; i++) partition_profile_free(&cache[i].prof);
    return rc;
}
