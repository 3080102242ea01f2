/* Placement search: builds the places a job can use on `nodes` copies of a machine (core
 * blocks, or GPUs), then assigns ranks to places to minimise the cost model's predicted
 * communication time, and never does worse than rank order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "topologies/internal.h"
#include "topologies/topo.h"

#define EXHAUSTIVE_LIMIT 1e6 /* orderings searched exhaustively (with branch and bound) */
#define LOCAL_ROUNDS 50      /* passes of pairwise swaps / moves after each greedy start */
#define MAX_PLACES 2048      /* the search keeps places² link costs */

typedef struct {
    int i, j; /* rank i sends to rank j */
    double bytes, messages;
} edge;

typedef struct {
    int n, S;          /* ranks, slots */
    double *cinv;      /* S², seconds per byte between slots */
    double *clat;      /* S², seconds per message */
    edge *edges;
    int n_edges;
    int *adj_start;    /* n + 1: edges incident to rank r are adj[adj_start[r] .. [r+1]) */
    int *adj;
    /* search state */
    int *slot, *best, *used;
    double best_cost;
    long long leaves;
} search;

static double edge_cost(const search *s, const edge *e, const int *slot)
{
    int a = slot[e->i], b = slot[e->j];
    return e->bytes * s->cinv[a * s->S + b] + e->messages * s->clat[a * s->S + b];
}

static double total_cost(const search *s, const int *slot)
{
    double c = 0;
    for (int k = 0; k < s->n_edges; k++)
        c += edge_cost(s, &s->edges[k], slot);
    return c;
}

/* Cost of the edges touching rank a or rank b (each counted once). */
static double local_cost(const search *s, const int *slot, int a, int b)
{
    double c = 0;
    for (int k = s->adj_start[a]; k < s->adj_start[a + 1]; k++)
        c += edge_cost(s, &s->edges[s->adj[k]], slot);
    if (b >= 0 && b != a)
        for (int k = s->adj_start[b]; k < s->adj_start[b + 1]; k++) {
            const edge *e = &s->edges[s->adj[k]];
            if (e->i != a && e->j != a)
                c += edge_cost(s, e, slot);
        }
    return c;
}

/* Depth-first over injective assignments of ranks 0..n−1, ranks below `d` placed; the
 * partial cost only grows, so a branch at or above the best is cut. */
static void dfs(search *s, int d, double partial)
{
    if (partial >= s->best_cost)
        return;
    if (d == s->n) {
        s->best_cost = partial;
        memcpy(s->best, s->slot, (size_t)s->n * sizeof *s->slot);
        s->leaves++;
        return;
    }
    for (int q = 0; q < s->S; q++) {
        if (s->used[q])
            continue;
        s->slot[d] = q;
        double add = 0;
        for (int k = s->adj_start[d]; k < s->adj_start[d + 1]; k++) {
            const edge *e = &s->edges[s->adj[k]];
            if (e->i <= d && e->j <= d)
                add += edge_cost(s, e, s->slot);
        }
        s->used[q] = 1;
        dfs(s, d + 1, partial + add);
        s->used[q] = 0;
    }
}

/* Pairwise swaps of two ranks and moves of a rank to a free slot while they lower the cost. */
static void improve(search *s, int *slot, int *used)
{
    for (int round = 0; round < LOCAL_ROUNDS; round++) {
        int changed = 0;
        for (int a = 0; a < s->n; a++) {
            for (int b = a + 1; b < s->n; b++) {
                double before = local_cost(s, slot, a, b);
                int t = slot[a];
                slot[a] = slot[b];
                slot[b] = t;
                if (local_cost(s, slot, a, b) < before * (1 - 1e-12)) {
                    changed = 1;
                } else {
                    slot[b] = slot[a];
                    slot[a] = t;
                }
            }
            for (int q = 0; q < s->S; q++) {
                if (used[q])
                    continue;
                double before = local_cost(s, slot, a, -1);
                int old = slot[a];
                slot[a] = q;
                if (local_cost(s, slot, a, -1) < before * (1 - 1e-12)) {
                    used[old] = 0;
                    used[q] = 1;
                    changed = 1;
                } else {
                    slot[a] = old;
                }
            }
        }
        if (!changed)
            break;
    }
}

/* Greedy: rank 0 on slot `start`, each next rank on the free slot that adds the least cost
 * against the ranks already placed; then local improvement. */
static double greedy(search *s, int start, int *slot, int *used)
{
    memset(used, 0, (size_t)s->S * sizeof *used);
    slot[0] = start;
    used[start] = 1;
    for (int d = 1; d < s->n; d++) {
        int best = -1;
        double best_add = INFINITY;
        for (int q = 0; q < s->S; q++) {
            if (used[q])
                continue;
            slot[d] = q;
            double add = 0;
            for (int k = s->adj_start[d]; k < s->adj_start[d + 1]; k++) {
                const edge *e = &s->edges[s->adj[k]];
                if (e->i <= d && e->j <= d)
                    add += edge_cost(s, e, slot);
            }
            if (add < best_add) {
                best_add = add;
                best = q;
            }
        }
        slot[d] = best;
        used[best] = 1;
    }
    improve(s, slot, used);
    return total_cost(s, slot);
}

static void search_free(search *s)
{
    free(s->cinv);
    free(s->clat);
    free(s->edges);
    free(s->adj_start);
    free(s->adj);
    free(s->slot);
    free(s->best);
    free(s->used);
}

static int search_init(search *s, const topo_machine *m, const topo_traffic *tr,
                       const topo_cost_model *cm, const topo_place *slots, int S)
{
    memset(s, 0, sizeof *s);
    int n = tr->n_ranks;
    s->n = n;
    s->S = S;
    for (int i = 0; i < n * n; i++)
        s->n_edges += (i / n != i % n) && (tr->bytes[i] != 0 || tr->messages[i] != 0);
    s->cinv = calloc((size_t)S * S, sizeof(double));
    s->clat = calloc((size_t)S * S, sizeof(double));
    s->edges = calloc((size_t)s->n_edges + 1, sizeof *s->edges);
    s->adj_start = calloc((size_t)n + 1, sizeof(int));
    s->adj = calloc(2 * (size_t)s->n_edges + 1, sizeof(int));
    s->slot = calloc((size_t)n, sizeof(int));
    s->best = calloc((size_t)n, sizeof(int));
    s->used = calloc((size_t)S, sizeof(int));
    if (!s->cinv || !s->clat || !s->edges || !s->adj_start || !s->adj || !s->slot || !s->best ||
        !s->used) {
        search_free(s);
        return pt_error_set("placement: out of memory");
    }
    for (int a = 0; a < S; a++)
        for (int b = 0; b < S; b++) {
            if (a == b)
                continue;
            double bw, lat;
            topo_link_between(m, cm, &slots[a], &slots[b], &bw, &lat);
            s->cinv[a * S + b] = 1.0 / bw;
            s->clat[a * S + b] = lat;
        }
    int k = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (i != j && (tr->bytes[i * n + j] != 0 || tr->messages[i * n + j] != 0)) {
                s->edges[k] = (edge){i, j, tr->bytes[i * n + j], tr->messages[i * n + j]};
                s->adj_start[i + 1]++;
                s->adj_start[j + 1]++;
                k++;
            }
    for (int r = 0; r < n; r++)
        s->adj_start[r + 1] += s->adj_start[r];
    int *fill = calloc((size_t)n + 1, sizeof(int));
    if (!fill) {
        search_free(s);
        return pt_error_set("placement: out of memory");
    }
    for (int e = 0; e < s->n_edges; e++) {
        int i = s->edges[e].i, j = s->edges[e].j;
        s->adj[s->adj_start[i] + fill[i]++] = e;
        s->adj[s->adj_start[j] + fill[j]++] = e;
    }
    free(fill);
    return 0;
}

/* ---- places ------------------------------------------------------------------------ */

static void places_free(topo_place *p, int n)
{
    if (!p)
        return;
    for (int i = 0; i < n; i++)
        free(p[i].cores);
    free(p);
}

/* CPU places: the ranks spread evenly over the nodes (the first n % nodes take one more),
 * each node's cores cut into blocks. */
static int cpu_slots(const topo_machine *m, int n, const topo_place_options *opt, topo_place *slots)
{
    int N = opt->nodes, at = 0;
    int per_node = n / N + (n % N != 0);
    if (per_node > m->n_cores && opt->exclusive)
        return pt_error_set("%d ranks on %d node%s need %d cores per node, but %s has %d "
                            "(exclusive placement)", n, N, N > 1 ? "s" : "", per_node, m->source,
                            m->n_cores);
    int *all = malloc((size_t)m->n_cores * sizeof *all);
    topo_place **pp = malloc((size_t)n * sizeof *pp);
    if (!all || !pp) {
        free(all);
        free(pp);
        return pt_error_set("placement: out of memory");
    }
    for (int c = 0; c < m->n_cores; c++)
        all[c] = c;
    int rc = 0;
    for (int k = 0; k < N && rc == 0; k++) {
        int q = n / N + (k < n % N);
        for (int i = 0; i < q; i++) {
            slots[at + i].node = k;
            slots[at + i].gpu = -1;
            pp[i] = &slots[at + i];
        }
        rc = topo_assign_cores(m, all, m->n_cores, pp, q);
        at += q;
    }
    free(all);
    free(pp);
    return rc;
}

static int same_near(const topo_gpu *a, const topo_gpu *b)
{
    return a->n_near == b->n_near && !memcmp(a->near, b->near, (size_t)a->n_near * sizeof(int));
}

/* Cores for ranks that have GPUs: on each node, the ranks whose GPUs share a locality split
 * its cores, in GPU order. */
static int gpu_cores(const topo_machine *m, topo_place *places, int n, int nodes)
{
    topo_place **pp = malloc((size_t)n * sizeof *pp);
    int rc = 0;
    if (!pp)
        return pt_error_set("placement: out of memory");
    for (int k = 0; k < nodes && rc == 0; k++) {
        for (int g = 0; g < m->n_gpus && rc == 0; g++) {
            /* the first GPU (in bus order) of each locality gathers the ranks of all */
            int first = 1;
            for (int h = 0; h < g; h++)
                first &= !same_near(&m->gpus[h], &m->gpus[g]);
            if (!first)
                continue;
            int q = 0;
            for (int h = g; h < m->n_gpus; h++)
                for (int i = 0; i < n; i++)
                    if (places[i].node == k && places[i].gpu == h && same_near(&m->gpus[h], &m->gpus[g]))
                        pp[q++] = &places[i];
            rc = topo_assign_cores(m, m->gpus[g].near, m->gpus[g].n_near, pp, q);
        }
    }
    free(pp);
    /* Localities can overlap (a GPU near one package, another near the whole machine):
     * ranks of different localities may then have been given the same cores. */
    for (int i = 0; i < n && rc == 0; i++)
        for (int j = i + 1; j < n; j++) {
            if (places[i].node != places[j].node) continue;
            int overlap = 0;
            for (int a = 0, b = 0; a < places[i].n_cores && b < places[j].n_cores && !overlap;) {
                int x = places[i].cores[a], y = places[j].cores[b]; /* both sorted */
                overlap = x == y;
                a += x <= y;
                b += y <= x;
            }
            if (overlap) places[i].shared = places[j].shared = 1;
        }
    return rc;
}

static int copy_place(topo_place *dst, const topo_place *src)
{
    *dst = *src;
    dst->cores = NULL;
    if (src->n_cores) {
        dst->cores = malloc((size_t)src->n_cores * sizeof(int));
        if (!dst->cores)
            return pt_error_set("placement: out of memory");
        memcpy(dst->cores, src->cores, (size_t)src->n_cores * sizeof(int));
    }
    return 0;
}

/* places[i] = slots[slot[i]]; for GPUs, cores are then given by locality. */
static int realise(const topo_machine *m, const topo_place *slots, const int *slot, int n,
                   const topo_place_options *opt, topo_place **out)
{
    topo_place *p = calloc((size_t)n, sizeof *p);
    if (!p)
        return pt_error_set("placement: out of memory");
    for (int i = 0; i < n; i++)
        if (copy_place(&p[i], &slots[slot[i]]) < 0) {
            places_free(p, n);
            return -1;
        }
    if (opt->device == TOPO_DEVICE_CUDA && gpu_cores(m, p, n, opt->nodes) < 0) {
        places_free(p, n);
        return -1;
    }
    *out = p;
    return 0;
}

static double count_orders(int S, int n)
{
    double c = 1;
    for (int i = 0; i < n; i++)
        c *= S - i;
    return c;
}

/* How many places the search chooses among: every NVIDIA GPU of every node for CUDA,
 * else one per rank; −1 with a message when they cannot hold the ranks or are too many. */
static int place_count(const topo_machine *m, int n, const topo_place_options *opt)
{
    int N = opt->nodes, S = n;
    int n_cuda = topo_count_cuda_gpus(m);
    if (opt->device == TOPO_DEVICE_CUDA) {
        if (n_cuda == 0)
            return pt_error_set("no NVIDIA GPU in %s: cannot place ranks on CUDA devices "
                                "(use --device cpu)", m->source);
        if ((long)n > (long)N * n_cuda)
            return pt_error_set("%d ranks need a GPU each, but %d node%s of %s ha%s %d NVIDIA "
                                "GPU%s", n, N, N > 1 ? "s" : "", m->source, N > 1 ? "ve" : "s",
                                N * n_cuda, N * n_cuda > 1 ? "s" : "");
        if ((long long)N * n_cuda > MAX_PLACES)
            return pt_error_set("placement: %lld GPUs are too many to search (at most %d): use "
                                "fewer nodes", (long long)N * n_cuda, MAX_PLACES);
        S = N * n_cuda;
    }
    if (S > MAX_PLACES)
        return pt_error_set("placement: %d places are too many to search (at most %d): use "
                            "fewer nodes", S, MAX_PLACES);
    return S;
}

/* The S places, node-major: GPUs in bus order, or core blocks. NULL with a message. */
static topo_place *make_slots(const topo_machine *m, int n, int S,
                              const topo_place_options *opt)
{
    topo_place *slots = calloc((size_t)S, sizeof *slots);
    if (!slots) {
        pt_error_set("placement: out of memory");
        return NULL;
    }
    if (opt->device == TOPO_DEVICE_CUDA) {
        for (int k = 0, q = 0; k < opt->nodes; k++)
            for (int g = 0; g < m->n_gpus; g++)
                if (m->gpus[g].is_nvidia)
                    slots[q++] = (topo_place){.node = k, .gpu = g};
    } else if (cpu_slots(m, n, opt, slots) < 0) {
        places_free(slots, S);
        return NULL;
    }
    return slots;
}

/* Greedy starts spread over the places, each followed by swaps; the best in s->best. */
static int search_greedy(search *s, char *method, size_t len)
{
    int n = s->n, S = s->S;
    int *slot = malloc((size_t)n * sizeof *slot), *used = malloc((size_t)S * sizeof *used);
    if (!slot || !used) {
        free(slot);
        free(used);
        return pt_error_set("placement: out of memory");
    }
    int starts = n <= 128 ? (S < 16 ? S : 16) : 2;
    s->best_cost = INFINITY;
    for (int t = 0; t < starts; t++) {
        double c = greedy(s, (int)((long)t * S / starts), slot, used);
        if (c < s->best_cost) {
            s->best_cost = c;
            memcpy(s->best, slot, (size_t)n * sizeof *slot);
        }
    }
    free(slot);
    free(used);
    snprintf(method, len, "greedy from %d starts + swaps", starts);
    return 0;
}

/* The best order found into s->best (exhaustive where the orders are few enough, else
 * greedy) and its method; *naive gets rank order's cost. */
static int search_orders(search *s, double *naive, char *method, size_t len)
{
    int n = s->n;
    /* rank order: rank i on the i-th place (node-major, then core or GPU order) */
    for (int i = 0; i < n; i++)
        s->slot[i] = i;
    *naive = total_cost(s, s->slot);
    double orders = count_orders(s->S, n);
    if (orders > EXHAUSTIVE_LIMIT)
        return search_greedy(s, method, len);
    /* starting from rank order's cost prunes more; only strictly better orders win */
    s->best_cost = *naive;
    memcpy(s->best, s->slot, (size_t)n * sizeof *s->slot);
    dfs(s, 0, 0);
    snprintf(method, len, "exhaustive over %.0f orders", orders);
    return 0;
}

/* pl's naive and chosen placements from the search: the search's best where it beats rank
 * order, else rank order (the placement people expect, kept on a tie too). */
static int place_realise(topo_placement *pl, const topo_machine *m, const topo_place *slots,
                         const search *s, double naive, const topo_place_options *opt)
{
    int n = s->n;
    int *rank_order = malloc((size_t)n * sizeof *rank_order);
    if (!rank_order)
        return pt_error_set("placement: out of memory");
    for (int i = 0; i < n; i++)
        rank_order[i] = i;
    const int *chosen = s->best;
    if (!(s->best_cost < naive * (1 - 1e-9))) {
        chosen = rank_order;
        size_t len = strlen(pl->method);
        snprintf(pl->method + len, sizeof pl->method - len, "; rank order kept");
    }
    pl->n_ranks = n;
    int rc = realise(m, slots, rank_order, n, opt, &pl->naive);
    if (rc == 0)
        rc = realise(m, slots, chosen, n, opt, &pl->places);
    free(rank_order);
    return rc;
}

/* The places n ranks can take (*S of them), NULL with the reason they cannot. */
static topo_place *place_slots(const topo_machine *m, int n, const topo_place_options *opt,
                               int *S)
{
    if (n < 1 || opt->nodes < 1) {
        pt_error_set("placement: %d ranks on %d nodes", n, opt->nodes);
        return NULL;
    }
    *S = place_count(m, n, opt);
    return *S < 0 ? NULL : make_slots(m, n, *S, opt);
}

int topo_place_check(const topo_machine *m, int n_ranks, const topo_place_options *opt)
{
    int S = 0;
    topo_place *slots = place_slots(m, n_ranks, opt, &S);
    if (!slots)
        return -1;
    places_free(slots, S);
    return 0;
}

int topo_place_ranks(topo_placement *pl, const topo_machine *m, const topo_traffic *tr,
                     const topo_cost_model *cm, const topo_place_options *opt)
{
    memset(pl, 0, sizeof *pl);
    int n = tr->n_ranks, S = 0;
    topo_place *slots = place_slots(m, n, opt, &S);
    if (!slots)
        return -1;
    search s;
    if (search_init(&s, m, tr, cm, slots, S) < 0) {
        places_free(slots, S);
        return -1;
    }
    double naive = 0;
    int rc = search_orders(&s, &naive, pl->method, sizeof pl->method);
    if (rc == 0)
        rc = place_realise(pl, m, slots, &s, naive, opt);
    search_free(&s);
    places_free(slots, S);
    if (rc < 0) {
        topo_placement_free(pl);
        return -1;
    }
    pl->cost_s = topo_placement_cost(m, tr, cm, pl->places, NULL);
    pl->naive_cost_s = topo_placement_cost(m, tr, cm, pl->naive, NULL);
    for (int i = 0; i < n; i++)
        pl->oversubscribed |= pl->places[i].shared;
    return 0;
}

void topo_placement_free(topo_placement *pl)
{
    places_free(pl->places, pl->n_ranks);
    places_free(pl->naive, pl->n_ranks);
    memset(pl, 0, sizeof *pl);
}
