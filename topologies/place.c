/* Communication cost model, traffic of a (stage, replica) grid of ranks, and placement of
 * the ranks on the nodes, GPUs and cores of a topo_machine. No hwloc, no MPI: the search
 * works on the plain description, so it runs the same for this machine and for an XML one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "topologies/internal.h"
#include "topologies/topo.h"

#define MAX_RANKS 1024 /* traffic matrices are n²: keep them a few MB */

/* ---- cost model -------------------------------------------------------------------- */

static const char *const link_names[TOPO_LINK_COUNT] = {
    "same-core", "same-l3", "same-numa", "same-package", "cross-package", "gpu-link", "pcie",
    "cross-node",
};

const char *topo_link_name(topo_link link)
{
    return link >= 0 && link < TOPO_LINK_COUNT ? link_names[link] : "?";
}

void topo_cost_model_default(topo_cost_model *cm)
{
    /* Shared-memory MPI figures start from the ones measured here (docs/DESIGN.md: 0.7 µs
     * ping-pong, 13–20 GB/s Sendrecv of 4 MB within one L3) and fall with distance; PCIe
     * peer-to-peer ~12 GB/s (gen 3 x16); the network 50 Gb/s. Rough on purpose: they rank
     * placements, and --bandwidth / --latency replace them with measured values. */
    static const double bw[TOPO_LINK_COUNT] = {16e9, 16e9, 14e9, 12e9, 8e9, 25e9, 12e9, 6.25e9};
    static const double lat[TOPO_LINK_COUNT] = {0.7e-6, 0.7e-6, 1e-6, 1e-6, 1.5e-6,
                                                3e-6,   5e-6,   5e-6};
    memcpy(cm->bandwidth, bw, sizeof bw);
    memcpy(cm->latency, lat, sizeof lat);
}

int topo_cost_model_parse(topo_cost_model *cm, const char *spec, int latency)
{
    const char *what = latency ? "--latency" : "--bandwidth";
    const char *p = spec;
    while (*p) {
        const char *eq = strchr(p, '=');
        const char *comma = strchr(p, ',');
        if (!comma)
            comma = p + strlen(p);
        if (!eq || eq > comma)
            return pt_error_set("%s: expected NAME=VALUE in \"%.*s\"", what, (int)(comma - p), p);
        int link = -1;
        for (int l = 0; l < TOPO_LINK_COUNT; l++)
            if ((size_t)(eq - p) == strlen(link_names[l]) && !strncmp(p, link_names[l], eq - p))
                link = l;
        if (link < 0)
            return pt_error_set("%s: unknown link \"%.*s\" (known: same-core, same-l3, same-numa, "
                                "same-package, cross-package, gpu-link, pcie, cross-node)",
                                what, (int)(eq - p), p);
        char *end;
        double v = strtod(eq + 1, &end);
        if (end != comma || end == eq + 1 || !isfinite(v) || v < 0 || (!latency && v < 1.0))
            return pt_error_set("%s: bad value \"%.*s\" for %s (a %s number)", what,
                                (int)(comma - eq - 1), eq + 1, link_names[link],
                                latency ? "non-negative" : "at least 1 byte/s");
        if (latency)
            cm->latency[link] = v;
        else
            cm->bandwidth[link] = v;
        p = *comma ? comma + 1 : comma;
    }
    return 0;
}

/* ---- traffic ----------------------------------------------------------------------- */

int topo_traffic_init(topo_traffic *tr, int stages, int replicas, const double *boundary_values,
                      const double *param_bytes, int batch, int microbatches)
{
    memset(tr, 0, sizeof *tr);
    if (stages < 1 || replicas < 1 || batch < 1 || microbatches < 1)
        return pt_error_set("traffic: stages (%d), replicas (%d), batch (%d) and micro-batches "
                            "(%d) must be positive", stages, replicas, batch, microbatches);
    if ((long)stages * replicas > MAX_RANKS)
        return pt_error_set("traffic: %d × %d ranks is more than %d", stages, replicas, MAX_RANKS);
    if (replicas > 1 && !param_bytes)
        return pt_error_set("traffic: replicated stages need their parameter bytes");
    int n = stages * replicas;
    tr->bytes = calloc((size_t)n * n, sizeof(double));
    tr->messages = calloc((size_t)n * n, sizeof(double));
    if (!tr->bytes || !tr->messages) {
        topo_traffic_free(tr);
        return pt_error_set("traffic: out of memory");
    }
    tr->n_ranks = n;
    tr->stages = stages;
    tr->replicas = replicas;
    for (int r = 0; r < replicas; r++)
        for (int s = 0; s + 1 < stages; s++) {
            int i = topo_grid_rank(replicas, s, r), j = topo_grid_rank(replicas, s + 1, r);
            /* activations forward, gradients of the same shape backward */
            double b = boundary_values[s] * 4.0 * batch;
            tr->bytes[i * n + j] += b;
            tr->bytes[j * n + i] += b;
            tr->messages[i * n + j] += microbatches;
            tr->messages[j * n + i] += microbatches;
        }
    if (replicas > 1)
        for (int s = 0; s < stages; s++)
            for (int r = 0; r < replicas; r++) {
                /* ring Allreduce: reduce-scatter then all-gather, each R−1 steps of P/R */
                int i = topo_grid_rank(replicas, s, r);
                int j = topo_grid_rank(replicas, s, (r + 1) % replicas);
                tr->bytes[i * n + j] += 2.0 * (replicas - 1) / replicas * param_bytes[s];
                tr->messages[i * n + j] += 2.0 * (replicas - 1);
            }
    return 0;
}

int topo_traffic_from_partition(topo_traffic *tr, const net_desc *net, const partition *p,
                                int replicas, int batch, int microbatches)
{
    memset(tr, 0, sizeof *tr);
    if (p->stages < 1 || p->n_layers != net->n_layers)
        return pt_error_set("traffic: the partition (%d layers) does not fit the network (%d)",
                            p->n_layers, net->n_layers);
    double *bv = calloc((size_t)p->stages, sizeof *bv);
    double *pb = calloc((size_t)p->stages, sizeof *pb);
    if (!bv || !pb) {
        free(bv);
        free(pb);
        return pt_error_set("traffic: out of memory");
    }
    for (int s = 0; s < p->stages; s++) {
        for (int l = p->first[s]; l < p->first[s + 1]; l++)
            pb[s] += 4.0 * (double)(net->layers[l].weight_count + net->layers[l].bias_count);
        if (s + 1 < p->stages)
            bv[s] = (double)layer_shape_count(net->layers[p->first[s + 1] - 1].out);
    }
    int rc = topo_traffic_init(tr, p->stages, replicas, bv, pb, batch, microbatches);
    free(bv);
    free(pb);
    return rc;
}

void topo_traffic_free(topo_traffic *tr)
{
    free(tr->bytes);
    free(tr->messages);
    memset(tr, 0, sizeof *tr);
}

/* ---- links ------------------------------------------------------------------------- */

static int cores_intersect(const topo_place *a, const topo_place *b)
{
    /* both sorted */
    for (int i = 0, j = 0; i < a->n_cores && j < b->n_cores;) {
        if (a->cores[i] == b->cores[j])
            return 1;
        if (a->cores[i] < b->cores[j])
            i++;
        else
            j++;
    }
    return 0;
}

/* Whether every core of a and b has the same value of field (0 package, 1 NUMA, 2 L3);
 * unknown (-1) never matches, except packages when the machine has none. */
static int same_group(const topo_machine *m, const topo_place *a, const topo_place *b, int field)
{
    if (a->n_cores == 0 || b->n_cores == 0)
        return 0;
    const topo_core *c0 = &m->cores[a->cores[0]];
    int key = field == 0 ? c0->package : field == 1 ? c0->numa : c0->l3;
    if (key < 0 && field != 0)
        return 0;
    /* package −1 (a machine without packages) matches only −1 on every core, below */
    const topo_place *pl[2] = {a, b};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < pl[k]->n_cores; i++) {
            const topo_core *c = &m->cores[pl[k]->cores[i]];
            if ((field == 0 ? c->package : field == 1 ? c->numa : c->l3) != key)
                return 0;
        }
    return 1;
}

topo_link topo_link_between(const topo_machine *m, const topo_cost_model *cm,
                            const topo_place *a, const topo_place *b, double *bandwidth,
                            double *latency)
{
    topo_link link;
    double bw = 0;
    if (a->node != b->node) {
        link = TOPO_LINK_CROSS_NODE;
    } else if (a->gpu >= 0 && b->gpu >= 0) {
        const topo_gpu *ga = &m->gpus[a->gpu], *gb = &m->gpus[b->gpu];
        if (m->gpu_bandwidth && a->gpu != b->gpu)
            bw = m->gpu_bandwidth[a->gpu * m->n_gpus + b->gpu];
        if (a->gpu == b->gpu)
            link = TOPO_LINK_SAME_CORE; /* one device: a copy in its memory */
        else if (bw > 0)
            link = TOPO_LINK_GPU;
        else if (ga->package == gb->package)
            link = TOPO_LINK_PCIE;
        else
            link = TOPO_LINK_CROSS_PACKAGE;
    } else if (cores_intersect(a, b)) {
        link = TOPO_LINK_SAME_CORE;
    } else if (same_group(m, a, b, 2)) {
        link = TOPO_LINK_SAME_L3;
    } else if (same_group(m, a, b, 1)) {
        link = TOPO_LINK_SAME_NUMA;
    } else if (same_group(m, a, b, 0)) {
        link = TOPO_LINK_SAME_PACKAGE;
    } else {
        link = TOPO_LINK_CROSS_PACKAGE;
    }
    if (bandwidth)
        *bandwidth = link == TOPO_LINK_GPU ? bw : cm->bandwidth[link];
    if (latency)
        *latency = cm->latency[link];
    return link;
}

double topo_placement_cost(const topo_machine *m, const topo_traffic *tr,
                           const topo_cost_model *cm, const topo_place *places,
                           double *per_rank)
{
    int n = tr->n_ranks;
    double total = 0;
    for (int i = 0; i < n; i++) {
        double t = 0;
        for (int j = 0; j < n; j++) {
            double b = tr->bytes[i * n + j], k = tr->messages[i * n + j];
            if (i == j || (b == 0 && k == 0))
                continue;
            double bw, lat;
            topo_link_between(m, cm, &places[i], &places[j], &bw, &lat);
            t += b / bw + k * lat;
        }
        if (per_rank)
            per_rank[i] = t;
        total += t;
    }
    return total;
}

/* ---- core blocks ------------------------------------------------------------------- */

static int core_key(const topo_machine *m, int core, int level)
{
    const topo_core *c = &m->cores[core];
    return level == 0 ? c->package : level == 1 ? c->numa : c->l3;
}

/* Cuts idx[lo, hi) (core indices in logical order) into k contiguous blocks that follow the
 * hierarchy: first the packages, then NUMA nodes, then L3 groups, then even pieces. Where
 * k is at least the number of groups each group gets ranks in proportion to its cores
 * (D'Hondt, so no group gets more ranks than cores); where it is smaller, ranks get whole
 * groups. Appends the k block ends to bounds[*nb + 1 ...]. */
static int split_blocks(const topo_machine *m, const int *idx, int lo, int hi, int k, int level,
                        int *bounds, int *nb)
{
    if (k <= 1) {
        bounds[++*nb] = hi;
        return 0;
    }
    int runs = 1;
    for (; level < 3; level++) {
        runs = 1;
        for (int i = lo + 1; i < hi; i++)
            runs += core_key(m, idx[i], level) != core_key(m, idx[i - 1], level);
        if (runs > 1)
            break;
    }
    if (level == 3) {
        int len = hi - lo, at = lo;
        for (int b = 0; b < k; b++) {
            at += len / k + (b < len % k);
            bounds[++*nb] = at;
        }
        return 0;
    }
    int *rb = malloc((size_t)(runs + 1) * sizeof *rb);
    int *alloc = calloc((size_t)runs, sizeof *alloc);
    if (!rb || !alloc) {
        free(rb);
        free(alloc);
        return pt_error_set("placement: out of memory");
    }
    rb[0] = lo;
    for (int i = lo + 1, r = 1; i < hi; i++)
        if (core_key(m, idx[i], level) != core_key(m, idx[i - 1], level))
            rb[r++] = i;
    rb[runs] = hi;
    int rc = 0;
    if (k <= runs) {
        for (int i = 0; i < k; i++)
            bounds[++*nb] = rb[(long)(i + 1) * runs / k];
    } else {
        for (int g = 0; g < runs; g++)
            alloc[g] = 1;
        for (int left = k - runs; left > 0; left--) {
            int best = 0;
            for (int g = 1; g < runs; g++)
                if ((double)(rb[g + 1] - rb[g]) / alloc[g] >
                    (double)(rb[best + 1] - rb[best]) / alloc[best])
                    best = g;
            alloc[best]++;
        }
        for (int g = 0; g < runs && rc == 0; g++)
            rc = split_blocks(m, idx, rb[g], rb[g + 1], alloc[g], level + 1, bounds, nb);
    }
    free(rb);
    free(alloc);
    return rc;
}

/* Gives places[0..k) blocks of the cores pool[0..count) (k ≤ count), or, with more places
 * than cores, one core each round robin, marked shared. */
int topo_assign_cores(const topo_machine *m, const int *pool, int count, topo_place **places,
                        int k)
{
    if (k <= 0)
        return 0;
    if (k > count) {
        for (int i = 0; i < k; i++) {
            places[i]->cores = malloc(sizeof(int));
            if (!places[i]->cores)
                return pt_error_set("placement: out of memory");
            places[i]->cores[0] = pool[i % count];
            places[i]->n_cores = 1;
            places[i]->shared = 1;
        }
        return 0;
    }
    int *bounds = malloc((size_t)(k + 1) * sizeof *bounds), nb = 0;
    if (!bounds)
        return pt_error_set("placement: out of memory");
    bounds[0] = 0;
    if (split_blocks(m, pool, 0, count, k, 0, bounds, &nb) < 0) {
        free(bounds);
        return -1;
    }
    for (int i = 0; i < k; i++) {
        int len = bounds[i + 1] - bounds[i];
        places[i]->cores = malloc((size_t)len * sizeof(int));
        if (!places[i]->cores) {
            free(bounds);
            return pt_error_set("placement: out of memory");
        }
        memcpy(places[i]->cores, pool + bounds[i], (size_t)len * sizeof(int));
        places[i]->n_cores = len;
        places[i]->shared = 0;
    }
    free(bounds);
    return 0;
}

int topo_local_cores(const topo_machine *m, const char *mode, int local_rank, int local_size,
                     int **cores, int *n, int *shared)
{
    *cores = NULL;
    *n = 0;
    *shared = 0;
    if (local_size < 1 || local_rank < 0 || local_rank >= local_size)
        return pt_error_set("binding: local rank %d of %d", local_rank, local_size);
    if (!strcmp(mode, "none"))
        return 0;
    if (!strcmp(mode, "core")) {
        *cores = malloc(sizeof(int));
        if (!*cores)
            return pt_error_set("binding: out of memory");
        (*cores)[0] = local_rank % m->n_cores;
        *n = 1;
        *shared = local_size > m->n_cores;
        return 0;
    }
    if (strcmp(mode, "auto"))
        return pt_error_set("unknown binding mode \"%s\" (auto, core or none)", mode);
    int *all = malloc((size_t)m->n_cores * sizeof *all);
    topo_place *pl = calloc((size_t)local_size, sizeof *pl);
    topo_place **pp = malloc((size_t)local_size * sizeof *pp);
    int rc = 0;
    if (!all || !pl || !pp) {
        rc = pt_error_set("binding: out of memory");
    } else {
        for (int c = 0; c < m->n_cores; c++)
            all[c] = c;
        for (int i = 0; i < local_size; i++)
            pp[i] = &pl[i];
        rc = topo_assign_cores(m, all, m->n_cores, pp, local_size);
    }
    if (rc == 0) {
        *cores = pl[local_rank].cores;
        *n = pl[local_rank].n_cores;
        *shared = pl[local_rank].shared;
        pl[local_rank].cores = NULL;
    }
    if (pl)
        for (int i = 0; i < local_size; i++)
            free(pl[i].cores);
    free(pl);
    free(pp);
    free(all);
    return rc;
}
