/* `plan --ranks N [--memory-mb X]`: which layout of N ranks to run (src/plan/build.h).
 *
 * The space, exhaustive: tensor shards T dividing N (--tensor: that T only), in both modes
 * for T > 1 (--tensor-mode: that one only), skipping a T some layer cannot be cut into;
 * stages K dividing N / T with K ≤ layers (replicas R = N / (K·T), dividing the batch),
 * micro-batches M a power of two up to 64 dividing batch / R, the schedules train runs,
 * each with recomputation off and on every stage:
 *   gpipe, 1f1b and zb-h1 (K = 1 runs 1f1b only: the others do the same work there, zb-h1
 *   with more memory);
 *   zb-h2 and search with V = 1 (K ≥ 2);
 *   interleaved with V = 2, 3, 4 model chunks per rank where train runs it: K ≥ 2, R = 1,
 *   M a multiple of K, K·V ≤ layers, and no tensor shards (T = 1: interleaving tensor
 *   groups is not searched); under the same conditions with V = 2, zb-v, v-half, v-min,
 *   search and (M ≥ 2K) dualpipev. The search (schedule_search, 32 greedy orders per
 *   layout) runs at the layout's own chunk costs, under the first of no limit, K, ⌈K/2⌉
 *   and 1 micro-batches per rank that fits --memory-mb (price_search).
 * At most Σ_{T | N} modes(T) × divisors(N / T) × 7 × 13 × 2 layouts. Tensor layouts are
 * priced as plan --tensor prices them (src/plan/predict.h: compute / T where layers are
 * cut, each stage's collectives α–β on its tensor group's slowest link, memory of the
 * largest shard); the placement sees their collectives as traffic, so it keeps a group on
 * the closest links it can. The profile is measured once per micro-batch
 * size; the partition and placement once per (K, M, V) and shared by the schedules and
 * recomputation settings (they change neither); each layout is then simulated and its
 * memory estimated in well under a millisecond.
 *
 * Exact given the profile: the simulated step of each layout and its memory per rank
 * (plan_memory: what train's CPU engine allocates). Heuristic or fixed:
 * - the partition is train's (the --partition method, by default "time": the min-max cut
 *   of forward + backward into K·V contiguous chunks), not a joint optimum: for interleaved
 *   schedules it balances the chunks, not the sums of each rank's V chunks, and it ignores
 *   that recomputation adds a forward and that zero bubble moves W into the bubbles;
 * - recomputation is searched off or on every stage only, not per-stage subsets;
 * - tensor compute is a profile of the shards tensor rank T − 1 runs (each layer alone,
 *   as for whole layers), once per micro-batch, T and mode;
 * - not searched: uneven replica shares, the reduction method, bucket size and overlap,
 *   --wgrad (taken from the options), M beyond powers of two, V beyond 4, and zb-h1's
 *   memory-capped variant ("zb"), which train does not run.
 * A layout over the memory limit is never proposed; when none fits, the error names the
 * smallest. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/base/options.h"
#include "src/plan/costs.h"
#include "src/plan/search.h"

enum { MAX_M = 64 };

/* The schedules searched: a generator and its chunks per rank. */
typedef struct {
    const char *name;
    int virtual_stages;
} sched_kind;
static const sched_kind kinds[] = {
    {"1f1b", 1},        {"gpipe", 1},     {"zb-h1", 1},      {"zb-h2", 1},
    {"search", 1},      {"interleaved", 2}, {"interleaved", 3}, {"interleaved", 4},
    {"zb-v", 2},        {"v-half", 2},    {"v-min", 2},      {"dualpipev", 2},
    {"search", 2},
};
/* The search's greedy orders per layout: plan prices hundreds of layouts. */
enum { PLAN_SEARCH_RUNS = 32 };
enum { N_KINDS = sizeof kinds / sizeof kinds[0] };

typedef struct {
    int stages, replicas, microbatches, virtual_stages, recompute;
    int zero;                   /* --zero priced (1: where unsharded did not fit) */
    int zero3_prefetch;         /* with --zero 3: --zero3-prefetch on (off: where on did
                                 * not fit) */
    int zero_overlap;           /* with --zero 2 or 3: --zero-overlap on (off: where ZeRO-3
                                 * without prefetch did not fit either) */
    int tensor;                 /* shards per stage, 1: none */
    tensor_mode mode;
    double tensor_s;            /* the largest stage's tensor collectives per step */
    topo_link tensor_link;      /* the slowest link inside a tensor group (T > 1) */
    double rank_param_bytes;    /* the largest rank's parameters */
    double stage_param_bytes;   /* the largest stage's parameters, whole */
    const char *schedule;
    double schedule_memory;     /* search: the limit priced (micro-batches per rank, 0: none) */
    char origin[64];            /* search: what won */
    double step_s, bubble, peak_bytes;
    double *stage_bytes; /* owned: per rank (stage), `stages` entries */
    int *first;          /* owned: the partition, stages · virtual_stages + 1 entries */
    int fits;
} candidate;

typedef struct {
    int microbatch, T;
    tensor_mode mode;
    partition_profile prof; /* T > 1: of the shards (plan_profile_shards) */
} cached_profile;

typedef struct {
    cached_profile *c;
    int n, cap;
    const char *costs; /* --costs FILE, or NULL */
    engine_precision precision; /* --precision: the products' */
} profile_cache;

static const partition_profile *profile_for(profile_cache *pc, const net_desc *net,
                                            int microbatch, int T, tensor_mode mode)
{
    for (int i = 0; i < pc->n; i++)
        if (pc->c[i].microbatch == microbatch && pc->c[i].T == T &&
            (T == 1 || pc->c[i].mode == mode))
            return &pc->c[i].prof;
    if (pc->n == pc->cap) {
        int cap = pc->cap ? 2 * pc->cap : 8;
        cached_profile *c = realloc(pc->c, (size_t)cap * sizeof *c);
        if (!c) {
            pt_error_set("out of memory");
            return NULL;
        }
        pc->c = c;
        pc->cap = cap;
    }
    cached_profile *c = &pc->c[pc->n];
    if (T > 1) {
        shard_plan sp;
        if (shard_plan_init(&sp, net, T, mode) < 0) return NULL;
        profile_options po = {.batch = microbatch, .warmup = 1, .repeats = 3,
                              .device = ENGINE_CPU, .precision = pc->precision};
        int rc = plan_costs_profile(&c->prof, net, &sp, &po, pc->costs);
        shard_plan_free(&sp);
        if (rc < 0) return NULL;
    } else {
        profile_options po = {.batch = microbatch, .warmup = 1, .repeats = 3,
                              .device = ENGINE_CPU, .split = 1, .precision = pc->precision};
        if (plan_costs_profile(&c->prof, net, NULL, &po, pc->costs) < 0) return NULL;
    }
    c->microbatch = microbatch;
    c->T = T;
    c->mode = mode;
    pc->n++;
    return &c->prof;
}

/* Fitting first, then fastest; among equal times, less memory, then fewer stages, fewer
 * chunks, no recomputation, and the schedule's name (a total order: the ranking does not
 * depend on qsort). */
static int by_step(const void *pa, const void *pb)
{
    const candidate *a = pa, *b = pb;
    if (a->fits != b->fits) return b->fits - a->fits;
    if (a->step_s != b->step_s) return a->step_s < b->step_s ? -1 : 1;
    if (a->peak_bytes != b->peak_bytes) return a->peak_bytes < b->peak_bytes ? -1 : 1;
    if (a->tensor != b->tensor) return a->tensor - b->tensor;
    if (a->mode != b->mode) return (int)a->mode - (int)b->mode;
    if (a->stages != b->stages) return a->stages - b->stages;
    if (a->microbatches != b->microbatches) return a->microbatches - b->microbatches;
    if (a->virtual_stages != b->virtual_stages) return a->virtual_stages - b->virtual_stages;
    if (a->recompute != b->recompute) return a->recompute - b->recompute;
    return strcmp(a->schedule, b->schedule);
}

/* The train options of a layout. */
static void describe(char *buf, size_t size, const candidate *c)
{
    char virt[32] = "", ten[64] = "";
    if (c->virtual_stages > 1) snprintf(virt, sizeof virt, " --virtual %d", c->virtual_stages);
    if (c->tensor > 1)
        snprintf(ten, sizeof ten, " --tensor %d --tensor-mode %s", c->tensor,
                 tensor_mode_name(c->mode));
    char mem[48] = "";
    if (c->schedule_memory > 0)
        snprintf(mem, sizeof mem, " --schedule-memory %g", c->schedule_memory);
    char zero[64] = "";
    if (c->zero)
        snprintf(zero, sizeof zero, " --zero %d%s%s", c->zero,
                 c->zero == 3 && !c->zero3_prefetch ? " --zero3-prefetch off" : "",
                 c->zero >= 2 && !c->zero_overlap ? " --zero-overlap off" : "");
    snprintf(buf, size, "--stages %d --replicas %d%s --microbatches %d --schedule %s%s%s "
             "--recompute %s%s", c->stages, c->replicas, ten, c->microbatches, c->schedule, virt,
             mem, c->recompute ? "all" : "none",
             zero);
}

static const char *zero_note(const candidate *c)
{
    if (c->zero == 3 && !c->zero_overlap) return "  (--zero 3, no prefetch, no overlap)";
    if (c->zero == 3) return c->zero3_prefetch ? "  (--zero 3)" : "  (--zero 3, no prefetch)";
    return c->zero == 2 ? "  (--zero 2)" : "  (--zero 1)";
}

/* Why `b` ranks below `a` (both fit), in words. */
static void why_lost(char *buf, size_t size, const candidate *a, const candidate *b, int batch)
{
    char ta[32], tb[32], dt[32];
    topo_format_seconds(ta, sizeof ta, a->step_s);
    topo_format_seconds(tb, sizeof tb, b->step_s);
    if (b->step_s <= a->step_s) { /* as fast: the tie went to memory, then the order */
        if (b->peak_bytes > a->peak_bytes)
            snprintf(buf, size, "predicted step %s, as fast as the choice, but it needs %.2f "
                     "MiB per rank against %.2f", tb, b->peak_bytes / 1048576.0,
                     a->peak_bytes / 1048576.0);
        else
            snprintf(buf, size, "predicted step %s and %.2f MiB per rank, the same as the "
                     "choice; the simpler layout (fewer stages, chunks, no recomputation) "
                     "ranks first", tb, b->peak_bytes / 1048576.0);
        return;
    }
    topo_format_seconds(dt, sizeof dt, b->step_s - a->step_s);
    double pct = a->step_s > 0 ? 100 * (b->step_s / a->step_s - 1) : 0;
    char cause[192];
    int mb_a = batch / (a->replicas * a->microbatches);
    int mb_b = batch / (b->replicas * b->microbatches);
    char ts[32];
    topo_format_seconds(ts, sizeof ts, b->tensor_s);
    if (b->recompute && !a->recompute)
        snprintf(cause, sizeof cause, "recomputation runs every forward twice");
    else if (b->tensor > a->tensor)
        snprintf(cause, sizeof cause, "its tensor collectives cost %s per step on %s links, "
                 "more than %s", ts, topo_link_name(b->tensor_link),
                 b->replicas < a->replicas ? "the gradient reductions of fewer replicas save"
                 : b->stages < a->stages   ? "the pipeline's bubble and messages it avoids"
                                           : "the compute the shards split");
    else if (b->tensor < a->tensor)
        snprintf(cause, sizeof cause, "with %s tensor shards each rank computes more of "
                 "every layer", b->tensor > 1 ? "fewer" : "no");
    else if (b->tensor > 1 && b->mode != a->mode)
        snprintf(cause, sizeof cause, "tensor mode %s: its collectives cost %s per step",
                 tensor_mode_name(b->mode), ts);
    else if (b->bubble > a->bubble + 0.02)
        snprintf(cause, sizeof cause, "more of its step is pipeline bubble");
    else if (b->stages < a->stages)
        snprintf(cause, sizeof cause, "fewer stages leave each rank more layers to compute");
    else if (b->replicas < a->replicas)
        snprintf(cause, sizeof cause, "fewer replicas: each rank computes more samples");
    else if (b->replicas > a->replicas)
        snprintf(cause, sizeof cause, "its gradient reductions cost more than the work they "
                 "share");
    else if (mb_b != mb_a)
        snprintf(cause, sizeof cause, "the kernels run %d-sample micro-batches less "
                 "efficiently than %d-sample ones (profile)", mb_b, mb_a);
    else if (strcmp(b->schedule, a->schedule) || b->virtual_stages != a->virtual_stages)
        snprintf(cause, sizeof cause, "its schedule orders the same work less well "
                 "(messages, chunk balance)");
    else
        snprintf(cause, sizeof cause, "its stages are less balanced");
    snprintf(buf, size, "predicted step %s against %s, slower by %s (+%.1f%%; bubble %.3f "
             "against %.3f): %s", tb, ta, dt, pct, b->bubble, a->bubble, cause);
}

static int print_json(const plan_args *a, const candidate *c, int n, int shown,
                      const candidate *smallest, const char *skipped)
{
    json_t *o = json_object(), *arr = json_array();
    int ok = o && arr;
    for (int i = 0; ok && i < shown; i++) {
        json_t *j = json_pack("{s:i, s:i, s:i, s:s, s:i, s:s, s:f, s:f, s:f, s:b}", "stages",
                              c[i].stages, "replicas", c[i].replicas, "microbatches",
                              c[i].microbatches, "schedule", c[i].schedule, "virtual",
                              c[i].virtual_stages, "recompute", c[i].recompute ? "all" : "none",
                              "step_s", c[i].step_s, "bubble", c[i].bubble, "peak_bytes",
                              c[i].peak_bytes, "fits", c[i].fits);
        json_t *first = json_array(), *mem = json_array();
        for (int s = 0; s <= c[i].stages * c[i].virtual_stages; s++)
            json_array_append_new(first, json_integer(c[i].first[s]));
        for (int s = 0; s < c[i].stages; s++)
            json_array_append_new(mem, json_real(c[i].stage_bytes[s]));
        json_t *tj = json_pack("{s:i, s:s, s:f, s:o, s:f}", "tensor", c[i].tensor,
                               "tensor_mode", tensor_mode_name(c[i].mode),
                               "tensor_collective_s", c[i].tensor_s, "tensor_link",
                               c[i].tensor > 1 ? json_string(topo_link_name(c[i].tensor_link))
                                               : json_null(),
                               "rank_param_bytes", c[i].rank_param_bytes);
        ok = j && tj && !json_object_update(j, tj);
        json_decref(tj);
        ok = ok && !json_object_set_new(j, "partition_first", first) &&
             !json_object_set_new(j, "stage_memory_bytes", mem) &&
             !json_object_set_new(j, "zero", json_integer(c[i].zero)) &&
             !json_object_set_new(j, "zero3_prefetch",
                                  json_boolean(c[i].zero != 3 || c[i].zero3_prefetch)) &&
             !json_object_set_new(j, "zero_overlap",
                                  json_boolean(c[i].zero < 2 || c[i].zero_overlap)) &&
             !json_object_set_new(j, "schedule_memory", json_real(c[i].schedule_memory)) &&
             !json_object_set_new(j, "schedule_origin", c[i].origin[0]
                                                            ? json_string(c[i].origin)
                                                            : json_null()) &&
             !json_array_append_new(arr, j);
    }
    if (ok) {
        json_object_set_new(o, "model", json_string(a->model));
        json_object_set_new(o, "ranks", json_integer(a->ranks));
        json_object_set_new(o, "batch", json_integer(a->batch));
        json_object_set_new(o, "memory_limit_bytes",
                            a->memory_mb > 0 ? json_real(a->memory_mb * 1048576.0) : json_null());
        json_object_set_new(o, "wgrad",
                            json_string(a->wgrad_batched ? "batched" : "per-microbatch"));
        json_object_set_new(o, "layouts_searched", json_integer(n));
        json_object_set_new(o, "tensor_skipped", skipped ? json_string(skipped) : json_null());
        json_object_set_new(o, "choices", arr);
        json_object_set_new(o, "smallest_peak_bytes", json_real(smallest->peak_bytes));
    } else {
        json_decref(arr);
    }
    return topo_json_print(ok ? o : NULL, stdout);
}

/* Where a tensor group's slowest link keeps it, in words. */
static const char *link_place(topo_link l)
{
    switch (l) {
    case TOPO_LINK_SAME_CORE: return "on shared cores";
    case TOPO_LINK_SAME_L3: return "inside an L3 cache domain";
    case TOPO_LINK_SAME_NUMA: return "inside a NUMA node";
    case TOPO_LINK_SAME_PACKAGE: return "inside a socket";
    case TOPO_LINK_CROSS_PACKAGE: return "across sockets";
    case TOPO_LINK_GPU: return "on direct GPU links (NVLink)";
    case TOPO_LINK_PCIE: return "on PCIe inside a socket";
    default: return "across nodes";
    }
}

/* Why the choice has tensor shards, or what the best layout with them would cost. */
static void tensor_reason(const candidate *c, int n)
{
    char ts[32], st[32], lay[192];
    const candidate *x = &c[0];
    if (x->tensor > 1) {
        char cut[64];
        if (x->tensor == 2) snprintf(cut, sizeof cut, "halve each rank's parameters");
        else snprintf(cut, sizeof cut, "cut each rank's parameters to about 1/%d", x->tensor);
        topo_format_seconds(ts, sizeof ts, x->tensor_s);
        topo_format_seconds(st, sizeof st, x->step_s);
        printf("Tensor: %d shards (%s) %s %s (%.2f MiB of the largest stage's %.2f); their "
               "collectives cost %s per step (of %s) on the %s links\n", x->tensor,
               tensor_mode_name(x->mode), link_place(x->tensor_link), cut,
               x->rank_param_bytes / 1048576.0, x->stage_param_bytes / 1048576.0, ts, st,
               topo_link_name(x->tensor_link));
        return;
    }
    /* c is ranked: the first fitting layout with shards is the best of them */
    for (int i = 1; i < n; i++) {
        const candidate *y = &c[i];
        if (y->tensor < 2 || !y->fits) continue;
        describe(lay, sizeof lay, y);
        topo_format_seconds(ts, sizeof ts, y->tensor_s);
        topo_format_seconds(st, sizeof st, y->step_s);
        printf("Tensor shards: the best layout with them (%s, #%d) would take %s per step; "
               "its collectives cost %s of it on %s links (%s)\n", lay, i + 1, st, ts,
               topo_link_name(y->tensor_link), link_place(y->tensor_link));
        return;
    }
}

static void print_text(const plan_args *base, const topo_machine *m, const candidate *c, int n,
                       int fitting, int shown, const char *skipped)
{
    int N = base->ranks;
    printf("Plan for %d rank%s: %s, batch %d, partition \"%s\", on %s; %d layout%s simulated",
           N, N == 1 ? "" : "s", base->model, base->batch, base->method, m->source, n,
           n == 1 ? "" : "s");
    if (base->memory_mb > 0)
        printf(", %d fit in %g MiB per rank", fitting, base->memory_mb);
    printf("\n(step: the schedule's simulator on layer times profiled on this machine's CPU, "
           "of the shards a rank runs with --tensor; memory: the largest rank's; tensor: "
           "shards per stage T and how layers are cut; V: model chunks per rank; partition: "
           "the first layer of each stage, or of each model chunk with V > 1)\n");
    if (skipped) printf("(tensor shards not searched: %s)\n", skipped);
    printf("\n%3s %6s %8s %-10s %4s %-11s %2s %-9s %11s %7s %10s  %s\n", "#", "stages",
           "replicas", "tensor", "M", "schedule", "V", "recompute", "step", "bubble",
           "MiB/rank", "partition");
    for (int i = 0; i < shown; i++) {
        char st[32], cut[160] = "";
        topo_format_seconds(st, sizeof st, c[i].step_s);
        int chunks = c[i].stages * c[i].virtual_stages;
        for (int s = 0, len = 0; s < chunks && len < (int)sizeof cut - 8; s++)
            len += snprintf(cut + len, sizeof cut - (size_t)len, "%s%d", s ? "," : "",
                            c[i].first[s]);
        char ten[32];
        if (c[i].tensor > 1)
            snprintf(ten, sizeof ten, "%d:%s", c[i].tensor, tensor_mode_name(c[i].mode));
        else
            snprintf(ten, sizeof ten, "1");
        printf("%3d %6d %8d %-10s %4d %-11s %2d %-9s %11s %7.3f %10.2f  %s%s\n", i + 1,
               c[i].stages, c[i].replicas, ten, c[i].microbatches, c[i].schedule,
               c[i].virtual_stages,
               c[i].recompute ? "all" : "none", st, c[i].bubble, c[i].peak_bytes / 1048576.0,
               cut, c[i].zero ? zero_note(&c[i]) : "");
    }
    char lay[192], why[512];
    describe(lay, sizeof lay, &c[0]);
    printf("\nChoice: %s\n", lay);
    tensor_reason(c, n);
    if (fitting > 1) {
        why_lost(why, sizeof why, &c[0], &c[1], base->batch);
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
                   "MiB per rank, more than %g\n", lay, st, x->peak_bytes / 1048576.0,
                   base->memory_mb);
        }
    }
}

/* Where the search was priced on two cuts of one layout (price_layouts), the one that fits
 * and is faster stays, as plan_build keeps it with --stages (the other freed). */
static void drop_slower_searches(candidate *c, int *n)
{
    for (int i = 0; i < *n; i++) {
        if (strcmp(c[i].schedule, "search")) continue;
        for (int j = i + 1; j < *n; j++) {
            candidate *x = &c[i], *y = &c[j];
            if (strcmp(y->schedule, "search") || x->stages != y->stages ||
                x->replicas != y->replicas || x->tensor != y->tensor || x->mode != y->mode ||
                x->microbatches != y->microbatches || x->virtual_stages != y->virtual_stages ||
                x->recompute != y->recompute)
                continue;
            int y_better = y->fits != x->fits ? y->fits : y->step_s < x->step_s;
            if (y_better) {
                candidate t = *x;
                *x = *y;
                *y = t;
            }
            free(y->stage_bytes);
            free(y->first);
            *y = c[--*n];
            j--;
        }
    }
}

/* The search's memory limit, from --memory-mb: the first of no limit, 1F1B's K
 * micro-batches per rank, ⌈K/2⌉ and 1 whose layout fits (the last tried where none does);
 * a->schedule_memory is left at the one priced. Without --memory-mb, no limit. */
static int price_search(plan_built *b, plan_args *a, const net_desc *net,
                        const partition_profile *prof, const topo_machine *m,
                        const topo_cost_model *cm)
{
    int K = a->stages;
    double limits[4] = {0, K, (K + 1) / 2, 1};
    int n = a->memory_mb > 0 ? 4 : 1;
    for (int i = 0; i < n; i++) {
        if (i > 0 && limits[i] >= limits[i - 1] && limits[i - 1] > 0) continue;
        a->schedule_memory = limits[i];
        if (plan_price(b, a, net, prof, m, cm) < 0) return -1;
        if (a->memory_mb <= 0 || b->peak_bytes <= a->memory_mb * 1048576.0) break;
    }
    return 0;
}

/* Prices every schedule and recomputation setting with `V` chunks per rank on the layout
 * in b (built for a->stages, a->virtual_stages = V), appending to c. With v_cut >= 0 the
 * layers were cut one of two ways (a->cut): only the schedules that want that cut
 * (plan_v_partition: v_cut 1 the V's pairs, 0 the chunks), and the search on both (the
 * slower dropped later: drop_slower_searches). */
static int price_layouts(candidate *c, int *n, plan_args *a, plan_built *b, const net_desc *net,
                         const partition_profile *prof, const topo_machine *m,
                         const topo_cost_model *cm, int v_cut)
{
    int K = a->stages, V = a->virtual_stages, prefetch = a->zero3_prefetch;
    int overlap = a->zero_overlap, steps = 3 + prefetch + overlap;
    for (int k = 0; k < N_KINDS; k++) {
        if (kinds[k].virtual_stages != V) continue;
        plan_args own = *a;
        own.cut = 0;
        own.schedule = kinds[k].name;
        if (v_cut >= 0 && strcmp(kinds[k].name, "search") && plan_v_partition(&own) != v_cut)
            continue;
        if (K == 1 && strcmp(kinds[k].name, "1f1b")) continue;
        /* dualpipev needs two micro-batches per stage */
        if (!strcmp(kinds[k].name, "dualpipev") && a->microbatches < 2 * K) continue;
        int search = !strcmp(kinds[k].name, "search");
        for (int rc = 0; rc < 2; rc++) {
            a->schedule = kinds[k].name;
            a->recompute = rc ? "all" : "none";
            a->zero = 0;
            a->zero3_prefetch = prefetch;
            a->zero_overlap = overlap;
            a->search_runs = PLAN_SEARCH_RUNS;
            if (search ? price_search(b, a, net, prof, m, cm)
                       : plan_price(b, a, net, prof, m, cm) < 0)
                return -1;
            /* ZeRO-1 where the replicas' moments do not fit whole (same step: the same
             * bytes cross the wire), then each further stage where the last does not fit
             * either, as far as train takes it: ZeRO-2 (the gradients too), ZeRO-3 (the
             * parameters, gathered layer by layer), then ZeRO-3 without prefetch (one layer
             * whole, not two), then also without overlap (one bucket whole, not two), on
             * either device; the steps after 3 are those two, as far as the options left
             * them on */
            if (a->replicas > 1 && !reduce_method_root_steps(a->reduce))
                for (int z = 1; z <= steps && a->memory_mb > 0 &&
                                b->peak_bytes > a->memory_mb * 1048576.0; z++) {
                    a->zero = z < 4 ? z : 3;
                    a->zero3_prefetch = z < 4 && prefetch;
                    a->zero_overlap = overlap && !(z > 3 && z == steps);
                    if (plan_price(b, a, net, prof, m, cm) < 0) return -1;
                }
            int chunks = K * V;
            int *first = malloc(((size_t)chunks + 1) * sizeof *first);
            if (!first) return pt_error_set("out of memory");
            memcpy(first, b->part.first, ((size_t)chunks + 1) * sizeof *first);
            candidate *x = &c[(*n)++];
            *x = (candidate){.stages = K, .replicas = a->replicas,
                             .microbatches = a->microbatches, .virtual_stages = V,
                             .recompute = rc, .schedule = kinds[k].name, .zero = a->zero,
                             .zero3_prefetch = a->zero3_prefetch,
                             .zero_overlap = a->zero_overlap,
                             .schedule_memory = search ? a->schedule_memory : 0,
                             .step_s = b->pred.step_s, .bubble = b->pred.bubble,
                             .peak_bytes = b->peak_bytes, .stage_bytes = b->stage_bytes,
                             .first = first};
            x->fits = a->memory_mb <= 0 || x->peak_bytes <= a->memory_mb * 1048576.0;
            snprintf(x->origin, sizeof x->origin, "%s", b->pred.sched.origin);
            x->tensor = a->tensor;
            x->mode = a->tensor_mode;
            x->tensor_link = b->tensor_link;
            for (int s = 0; s < K; s++) {
                if (b->pred.tensor_s[s] > x->tensor_s) x->tensor_s = b->pred.tensor_s[s];
                double whole = 0, most = 0;
                for (int v = 0; v < V; v++) {
                    int ch = schedule_model_chunk(&b->pred.sched, s, v);
                    int lo = b->part.first[ch], hi = b->part.first[ch + 1];
                    for (int l = lo; l < hi; l++)
                        whole += (double)(net->layers[l].weight_count +
                                          net->layers[l].bias_count);
                }
                for (int t = 0; t < a->tensor; t++) {
                    double mine = 0;
                    for (int v = 0; v < V; v++) {
                        int ch = schedule_model_chunk(&b->pred.sched, s, v);
                        mine += (double)shard_param_count(&b->shard, net, b->part.first[ch],
                                                          b->part.first[ch + 1], t);
                    }
                    if (mine > most) most = mine;
                }
                if (4 * whole > x->stage_param_bytes) x->stage_param_bytes = 4 * whole;
                if (4 * most > x->rank_param_bytes) x->rank_param_bytes = 4 * most;
            }
            b->stage_bytes = NULL; /* kept by the candidate */
        }
    }
    a->zero3_prefetch = prefetch;
    a->zero_overlap = overlap;
    return 0;
}

/* Whether T tensor shards in `mode` cut every layer of net (0), else −1 with the reason. */
static int can_cut(const net_desc *net, int T, tensor_mode mode)
{
    shard_plan sp;
    if (shard_plan_init(&sp, net, T, mode) < 0) return -1;
    shard_plan_free(&sp);
    return 0;
}

/* The layouts of a's K, R, T, M and V priced (price_layouts): with V = 2 cut by cost, the
 * chunks' cut and the V's pairs' one (plan_v_partition), each schedule on its own. */
static int price_cuts(candidate *c, int *n, plan_args *a, const net_desc *net,
                      const partition_profile *prof, const topo_machine *m,
                      const topo_cost_model *cm)
{
    int two = plan_cut_matters(a);
    for (int v_cut = 0; v_cut < (two ? 2 : 1); v_cut++) {
        a->cut = two ? 1 + v_cut : 0;
        plan_built b;
        if (plan_layout(&b, a, net, prof, m, cm) < 0) return -1;
        int bad = price_layouts(c, n, a, &b, net, prof, m, cm, two ? v_cut : -1);
        plan_built_free(&b);
        if (bad) return -1;
    }
    return 0;
}

int plan_search(const plan_args *base, const net_desc *net, const topo_machine *m,
                const topo_cost_model *cm)
{
    int N = base->ranks, cap = 0;
    for (int T = 1; T <= N; T++)
        for (int K = 1; N % T == 0 && K <= N / T; K++) cap += (N / T) % K == 0 ? 2 : 0;
    cap *= 7 * N_KINDS * 2;
    candidate *c = calloc((size_t)cap, sizeof *c);
    profile_cache pc = {.costs = base->costs, .precision = base->precision};
    /* what is found wanting in the request (no layout can be, none fits) is the input's
     * fault: exit 2, as plan --stages answers a layout that cannot be; else 1 */
    int n = 0, rc = 1, input_fault = 0;
    char skipped[512] = "";
    if (!c) {
        fprintf(stderr, "pipetrain: out of memory\n");
        return 1;
    }
    for (int T = 1; T <= N; T++) {
        if (N % T || (base->tensor_given && T != base->tensor)) continue;
        for (int mode = 0; mode < (T > 1 ? 2 : 1); mode++) {
            tensor_mode tm = T > 1 ? (tensor_mode)mode : base->tensor_mode;
            if (T > 1 && base->tensor_mode_given && tm != base->tensor_mode) continue;
            if (T > 1 && can_cut(net, T, tm) < 0) {
                size_t len = strlen(skipped);
                snprintf(skipped + len, sizeof skipped - len, "%s%d %s: %s", len ? "; " : "",
                         T, tensor_mode_name(tm), pt_error_get());
                continue;
            }
            int NT = N / T;
            for (int K = 1; K <= NT && K <= net->n_layers; K++) {
                int R = NT / K;
                if (NT % K || base->batch % R) continue;
                int rb = base->batch / R;
                for (int M = 1; M <= MAX_M && M <= rb; M *= 2) {
                    if (rb % M) continue;
                    const partition_profile *prof = profile_for(&pc, net, rb / M, T, tm);
                    if (!prof) goto out;
                    for (int V = 1; V <= 4; V++) {
                        if (V > 1 && (T > 1 || K < 2 || M % K || K * V > net->n_layers))
                            continue;
                        plan_args a = *base;
                        a.stages = K, a.replicas = R, a.microbatches = M, a.replica_batch = rb;
                        a.virtual_stages = V;
                        a.tensor = T, a.tensor_mode = tm, a.shard_profile = T > 1;
                        if (price_cuts(c, &n, &a, net, prof, m, cm) < 0) goto out;
                    }
                }
            }
        }
    }
    input_fault = 1;
    if (n == 0 && base->tensor_given && skipped[0]) {
        pt_error_set("%s", skipped);
        goto out;
    }
    if (n == 0) {
        pt_error_set("no layout of %d ranks: the batch of %d does not split over any "
                     "replica count that leaves whole stages (--batch)", N, base->batch);
        goto out;
    }
    drop_slower_searches(c, &n);
    qsort(c, (size_t)n, sizeof *c, by_step);
    const candidate *smallest = &c[0];
    for (int i = 1; i < n; i++)
        if (c[i].peak_bytes < smallest->peak_bytes) smallest = &c[i];
    if (!c[0].fits) {
        char lay[192];
        describe(lay, sizeof lay, smallest);
        pt_error_set("--memory-mb %g: no layout of %d ranks fits; the smallest needs %.2f MiB "
                     "per rank (%s)", base->memory_mb, N, smallest->peak_bytes / 1048576.0, lay);
        goto out;
    }
    input_fault = 0;
    int fitting = 0;
    while (fitting < n && c[fitting].fits) fitting++;
    int shown = fitting < base->top ? fitting : base->top;
    if (base->json)
        rc = print_json(base, c, n, shown, smallest, skipped[0] ? skipped : NULL) ? 1 : 0;
    else {
        print_text(base, m, c, n, fitting, shown, skipped[0] ? skipped : NULL);
        rc = 0;
    }
    goto done;
out:
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    rc = input_fault ? PT_EXIT_USAGE : PT_EXIT_FAIL;
done:
    for (int i = 0; i < n; i++) {
        free(c[i].stage_bytes);
        free(c[i].first);
    }
    free(c);
    for (int i = 0; i < pc.n; i++) partition_profile_free(&pc.c[i].prof);
    free(pc.c);
    return rc;
}
