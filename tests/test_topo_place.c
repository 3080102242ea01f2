/* Tests of topologies/ placement and binding: link levels and the cost of placements by
 * hand, placements keep their invariants on every machine (own cores while there are
 * enough, cores near the GPU, neighbouring stages on one package where possible, never
 * worse than rank order, optimal where searched exhaustively), impossible requests are
 * clear errors, and binding this process really changes its affinity. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "tests/check.h"
#include "tests/topo_machines.h"
#include "topologies/topo.h"

/* ---- links and placement ------------------------------------------------------------ */

static topo_place cpu_place(int node, int *cores, int n)
{
    return (topo_place){.node = node, .gpu = -1, .n_cores = n, .cores = cores};
}

Test(topo, link_levels)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    int a[] = {0, 1, 2}, b[] = {5, 6}, c[] = {20, 21}, d[] = {2, 3};
    topo_place pa = cpu_place(0, a, 3), pb = cpu_place(0, b, 2), pc = cpu_place(0, c, 2),
               pd = cpu_place(0, d, 2), pe = cpu_place(1, b, 2);
    double bw, lat;
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pb, &bw, &lat), TOPO_LINK_SAME_L3);
    cr_expect_eq(bw, cm.bandwidth[TOPO_LINK_SAME_L3]);
    cr_expect_eq(lat, cm.latency[TOPO_LINK_SAME_L3]);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pc, NULL, NULL), TOPO_LINK_CROSS_PACKAGE);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pd, NULL, NULL), TOPO_LINK_SAME_CORE);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pe, NULL, NULL), TOPO_LINK_CROSS_NODE);
    topo_place g0 = {.node = 0, .gpu = 0}, g3 = {.node = 0, .gpu = 3}, g5 = {.node = 0, .gpu = 5},
               g1 = {.node = 0, .gpu = 1};
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g3, &bw, NULL), TOPO_LINK_GPU);
    cr_expect_eq(bw, 50e9, "the matrix gives the bandwidth");
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g5, &bw, NULL), TOPO_LINK_CROSS_PACKAGE);
    cr_expect_eq(bw, cm.bandwidth[TOPO_LINK_CROSS_PACKAGE]);
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g1, &bw, NULL), TOPO_LINK_GPU);
    cr_expect_eq(bw, 25e9);
    topo_free(t);

    t = load("node-16c-1gpu.xml");
    m = topo_get_machine(t);
    int e[] = {0, 1}, f[] = {4, 5};
    pa = cpu_place(0, e, 2);
    pb = cpu_place(0, f, 2);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pb, NULL, NULL), TOPO_LINK_SAME_NUMA,
                 "different L3 groups of one NUMA node");
    topo_free(t);

    t = load("ws-4gpu.xml");
    m = topo_get_machine(t);
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g1, NULL, NULL), TOPO_LINK_PCIE);
    topo_free(t);
}

Test(topo, cost_of_two_stages_by_hand)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("local-2core.xml");
    const topo_machine *m = topo_get_machine(t);
    topo_traffic tr;
    double bv[1] = {5408};
    cr_assert_eq(topo_traffic_init(&tr, 2, 1, bv, NULL, 128, 4), 0);
    topo_placement pl;
    topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = 1};
    cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
    cr_expect_eq(pl.places[0].n_cores, 1);
    cr_expect_eq(pl.places[0].cores[0] + pl.places[1].cores[0], 1, "one core each");
    double one_way = 5408 * 4.0 * 128 / cm.bandwidth[TOPO_LINK_SAME_L3] +
                     4 * cm.latency[TOPO_LINK_SAME_L3];
    double per_rank[2];
    double total = topo_placement_cost(m, &tr, &cm, pl.places, per_rank);
    CHECK_CLOSE("cost", &total, (double[]){2 * one_way}, 1, 0, 1e-12);
    CHECK_CLOSE("rank 0's share", per_rank, (double[]){one_way}, 1, 0, 1e-12);
    CHECK_CLOSE("reported cost", &pl.cost_s, &total, 1, 0, 1e-12);
    topo_placement_free(&pl);
    topo_traffic_free(&tr);
    topo_free(t);
}

/* Package of a place: the one of all its cores, or -1 when they straddle packages. */
static int place_package(const topo_machine *m, const topo_place *p)
{
    int pkg = m->cores[p->cores[0]].package;
    for (int i = 1; i < p->n_cores; i++)
        if (m->cores[p->cores[i]].package != pkg)
            return -1;
    return pkg;
}

/* CPU placements: ranks of a node have their own cores, all of them used, while there are
 * enough; otherwise one core each, round robin, marked shared. */
static void check_cpu_cores(const char *what, const topo_machine *m, const topo_placement *pl,
                            int nodes)
{
    for (int k = 0; k < nodes; k++) {
        int *owner = calloc((size_t)m->n_cores, sizeof *owner), ranks = 0;
        for (int i = 0; i < pl->n_ranks; i++) {
            const topo_place *p = &pl->places[i];
            cr_assert(p->node >= 0 && p->node < nodes, "%s: rank %d on node %d", what, i, p->node);
            cr_assert_eq(p->gpu, -1, "%s: a CPU rank with a GPU", what);
            if (p->node != k)
                continue;
            ranks++;
            cr_assert_gt(p->n_cores, 0, "%s: rank %d has no cores", what, i);
            for (int c = 0; c < p->n_cores; c++) {
                cr_assert(p->cores[c] >= 0 && p->cores[c] < m->n_cores);
                cr_assert(c == 0 || p->cores[c] > p->cores[c - 1], "%s: cores not sorted", what);
                owner[p->cores[c]]++;
            }
        }
        for (int c = 0; c < m->n_cores; c++) {
            if (ranks == 0) {
                cr_expect_eq(owner[c], 0);
            } else if (ranks <= m->n_cores) {
                cr_expect_eq(owner[c], 1, "%s: node %d core %d has %d ranks with %d ranks on "
                             "%d cores", what, k, c, owner[c], ranks, m->n_cores);
            } else {
                cr_expect_geq(owner[c], 1, "%s: core %d idle while oversubscribed", what, c);
            }
        }
        for (int i = 0; i < pl->n_ranks; i++)
            if (pl->places[i].node == k)
                cr_expect_eq(pl->places[i].shared, ranks > m->n_cores, "%s: shared flag", what);
        free(owner);
    }
}

/* Stage boundaries that cross a package or node, against the fewest a chain through the
 * (node, package) groups it uses can have. */
static void check_neighbours(const char *what, const topo_machine *m, const topo_placement *pl)
{
    int groups = 0, crossings = 0, *seen = calloc((size_t)(m->n_packages + 1) * 64, sizeof *seen);
    for (int i = 0; i < pl->n_ranks; i++) {
        int pkg = place_package(m, &pl->places[i]);
        if (pkg < 0) {
            free(seen);
            return; /* fewer ranks than packages: a block spans packages, nothing to check */
        }
        int key = pl->places[i].node * (m->n_packages + 1) + pkg;
        groups += !seen[key];
        seen[key] = 1;
        if (i > 0) {
            const topo_place *a = &pl->places[i - 1], *b = &pl->places[i];
            crossings += a->node != b->node || place_package(m, a) != pkg;
        }
    }
    free(seen);
    cr_expect_eq(crossings, groups - 1, "%s: %d boundaries cross a package or node, %d needed",
                 what, crossings, groups - 1);
}

Test(topo, cpu_placement_invariants_on_every_machine)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    static const int stage_counts[] = {1, 2, 3, 4, 5, 8, 12, 16, 24, 40, 50};
    for (int k = 0; k < N_MACHINES; k++) {
        topo_t *t = load(machines[k].file);
        const topo_machine *m = topo_get_machine(t);
        for (int nodes = 1; nodes <= 2; nodes++)
            for (size_t s = 0; s < sizeof stage_counts / sizeof stage_counts[0]; s++) {
                int S = stage_counts[s];
                if (S > 2 * m->n_cores * nodes + 1)
                    continue;
                /* equal boundaries: then fewest crossings is also cheapest */
                double *bv = malloc((size_t)S * sizeof *bv);
                for (int i = 0; i < S; i++)
                    bv[i] = 10000;
                topo_traffic tr;
                cr_assert_eq(topo_traffic_init(&tr, S, 1, bv, NULL, 32, 4), 0);
                topo_placement pl;
                topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = nodes};
                char what[128];
                snprintf(what, sizeof what, "%s, %d stages, %d nodes", machines[k].file, S, nodes);
                cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s: %s", what,
                             pt_error_get());
                check_cpu_cores(what, m, &pl, nodes);
                if (S <= m->n_cores * nodes)
                    check_neighbours(what, m, &pl);
                cr_expect_leq(pl.cost_s, pl.naive_cost_s, "%s: worse than rank order", what);
                CHECK_CLOSE(what, &pl.cost_s, (double[]){topo_placement_cost(m, &tr, &cm, pl.places, NULL)},
                            1, 0, 1e-12);
                cr_expect_eq(pl.oversubscribed, (S + nodes - 1) / nodes > m->n_cores,
                             "%s: oversubscribed flag", what);
                topo_placement_free(&pl);
                opt.exclusive = 1;
                int rc = topo_place_ranks(&pl, m, &tr, &cm, &opt);
                cr_expect_eq(rc, (S + nodes - 1) / nodes > m->n_cores ? -1 : 0,
                             "%s: exclusive placement %s", what, rc ? "refused" : "accepted");
                if (rc == 0)
                    topo_placement_free(&pl);
                else
                    cr_expect(strstr(pt_error_get(), "exclusive"), "%s", pt_error_get());
                topo_traffic_free(&tr);
                free(bv);
            }
        topo_free(t);
    }
}

/* GPU placements: one NVIDIA GPU per rank, never two ranks on one, cores near the GPU and
 * not shared while the GPU's neighbourhood has enough. */
static void check_gpu_places(const char *what, const topo_machine *m, const topo_placement *pl)
{
    for (int i = 0; i < pl->n_ranks; i++) {
        const topo_place *p = &pl->places[i];
        cr_assert(p->gpu >= 0 && p->gpu < m->n_gpus, "%s: rank %d has no GPU", what, i);
        cr_expect(m->gpus[p->gpu].is_nvidia, "%s: rank %d on a non-NVIDIA GPU", what, i);
        cr_expect_gt(p->n_cores, 0, "%s: rank %d has no cores", what, i);
        const topo_gpu *g = &m->gpus[p->gpu];
        for (int c = 0; c < p->n_cores; c++) {
            int near = 0;
            for (int q = 0; q < g->n_near; q++)
                near |= g->near[q] == p->cores[c];
            cr_expect(near, "%s: rank %d core %d is not near GPU %d", what, i, p->cores[c], p->gpu);
        }
        for (int j = 0; j < i; j++) {
            const topo_place *o = &pl->places[j];
            if (o->node != p->node)
                continue;
            cr_expect_neq(o->gpu, p->gpu, "%s: ranks %d and %d share GPU %d", what, j, i, p->gpu);
            if (!p->shared)
                for (int a = 0; a < p->n_cores; a++)
                    for (int b = 0; b < o->n_cores; b++)
                        cr_expect_neq(p->cores[a], o->cores[b], "%s: ranks %d, %d share a core",
                                      what, j, i);
        }
    }
    cr_expect_leq(pl->cost_s, pl->naive_cost_s, "%s: worse than rank order", what);
}

Test(topo, gpu_placement_invariants)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    for (int k = 0; k < N_MACHINES; k++) {
        topo_t *t = load(machines[k].file);
        const topo_machine *m = topo_get_machine(t);
        int gpus = topo_count_cuda_gpus(m);
        for (int nodes = 1; nodes <= 2; nodes++)
            for (int S = 1; S <= 2 * gpus * nodes + 1 && S <= 17; S++) {
                double bv[16];
                for (int i = 0; i < 16; i++)
                    bv[i] = 1000 * (i % 3 + 1);
                topo_traffic tr;
                cr_assert_eq(topo_traffic_init(&tr, S, 1, bv, NULL, 32, 2), 0);
                topo_placement pl;
                topo_place_options opt = {.device = TOPO_DEVICE_CUDA, .nodes = nodes};
                char what[128];
                snprintf(what, sizeof what, "%s, %d stages on %d nodes, cuda", machines[k].file, S,
                         nodes);
                int rc = topo_place_ranks(&pl, m, &tr, &cm, &opt);
                if (S > gpus * nodes) {
                    cr_expect_eq(rc, -1, "%s: more ranks than GPUs accepted", what);
                    cr_expect(strstr(pt_error_get(), gpus ? "need a GPU each" : "no NVIDIA GPU"),
                              "%s: %s", what, pt_error_get());
                } else {
                    cr_assert_eq(rc, 0, "%s: %s", what, pt_error_get());
                    check_gpu_places(what, m, &pl);
                    topo_placement_free(&pl);
                }
                topo_traffic_free(&tr);
            }
        topo_free(t);
    }
}

Test(topo, nvlink_chain_beats_rank_order)
{
    /* GPU 3 and 4 have no NVLink: rank order crosses the packages there; the hybrid cube
     * mesh has a path through double links only (e.g. 1-2-3-0-4-7-6-5) */
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    double bv[7] = {21632, 5408, 15488, 3200, 2304, 256, 1000};
    for (int nodes = 1; nodes <= 2; nodes++) {
        topo_traffic tr;
        cr_assert_eq(topo_traffic_init(&tr, 8, 1, bv, NULL, 128, 8), 0);
        topo_placement pl;
        topo_place_options opt = {.device = TOPO_DEVICE_CUDA, .nodes = nodes};
        cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
        cr_expect_lt(pl.cost_s, pl.naive_cost_s * 0.9, "%d nodes: %g not clearly below %g", nodes,
                     pl.cost_s, pl.naive_cost_s);
        for (int i = 0; i + 1 < 8; i++) {
            double bw;
            topo_link l = topo_link_between(m, &cm, &pl.places[i], &pl.places[i + 1], &bw, NULL);
            cr_expect(l == TOPO_LINK_GPU && bw == 50e9, "%d nodes: boundary %d on %s at %g B/s",
                      nodes, i, topo_link_name(l), bw);
            cr_expect_eq(pl.places[i].node, pl.places[0].node, "%d nodes: the chain left a node",
                         nodes);
        }
        check_gpu_places("nvlink chain", m, &pl);
        topo_placement_free(&pl);
        topo_traffic_free(&tr);
    }
    topo_free(t);
}

/* 2 stages × 2 replicas on the two packages of node-2s-8gpu, placed by topo_place_ranks:
 * the pairs with the heavier traffic share a package. */
static void place_grid(double boundary_values, double param_bytes, topo_placement *pl,
                       const topo_machine *m, const topo_cost_model *cm)
{
    double bv[1] = {boundary_values}, pb[2] = {param_bytes, param_bytes};
    topo_traffic tr;
    cr_assert_eq(topo_traffic_init(&tr, 2, 2, bv, pb, 32, 4), 0);
    topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = 1};
    cr_assert_eq(topo_place_ranks(pl, m, &tr, cm, &opt), 0, "%s", pt_error_get());
    topo_traffic_free(&tr);
}

Test(topo, heavier_pairs_share_a_package)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    topo_placement pl;
    /* Large parameters, small activations: the Allreduce pairs matter more than the stage
     * boundaries, so the two replicas of each stage sit in one package, as rank order
     * (a stage's replicas consecutive) already has them. */
    place_grid(100, 400e6, &pl, m, &cm);
    for (int s = 0; s < 2; s++) {
        const topo_place *a = &pl.places[topo_grid_rank(2, s, 0)],
                         *b = &pl.places[topo_grid_rank(2, s, 1)];
        cr_expect_eq(place_package(m, a), place_package(m, b),
                     "stage %d's replicas in packages %d and %d", s, place_package(m, a),
                     place_package(m, b));
    }
    cr_expect_leq(pl.cost_s, pl.naive_cost_s);
    topo_placement_free(&pl);
    /* Small parameters, large activations: the boundaries matter more, so each replica's
     * two stages sit in one package, which rank order (stage 0 on package 0, stage 1 on
     * package 1) does not do: the placement must find it. */
    place_grid(1e6, 4e3, &pl, m, &cm);
    for (int r = 0; r < 2; r++) {
        const topo_place *a = &pl.places[topo_grid_rank(2, 0, r)],
                         *b = &pl.places[topo_grid_rank(2, 1, r)];
        cr_expect_eq(place_package(m, a), place_package(m, b),
                     "replica %d's stages in packages %d and %d", r, place_package(m, a),
                     place_package(m, b));
    }
    cr_expect_lt(pl.cost_s, pl.naive_cost_s);
    topo_placement_free(&pl);
    topo_free(t);
}

static int next_permutation(int *v, int n)
{
    int i = n - 2;
    while (i >= 0 && v[i] >= v[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = n - 1;
    while (v[j] <= v[i])
        j--;
    int t = v[i];
    v[i] = v[j];
    v[j] = t;
    for (int a = i + 1, b = n - 1; a < b; a++, b--) {
        t = v[a];
        v[a] = v[b];
        v[b] = t;
    }
    return 1;
}

Test(topo, exhaustive_search_is_optimal)
{
    /* Random traffic of 6 ranks (2 replicas of 3 stages) on the 2-socket node: the chosen
     * placement must cost what the best of all 720 assignments to the same places costs. */
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    unsigned seed = 12345;
    for (int trial = 0; trial < 4; trial++) {
        double bv[2], pb[3];
        for (int i = 0; i < 2; i++)
            bv[i] = 1 + rand_r(&seed) % 100000;
        for (int i = 0; i < 3; i++)
            pb[i] = 4.0 * (rand_r(&seed) % 2000000);
        topo_traffic tr;
        cr_assert_eq(topo_traffic_init(&tr, 3, 2, bv, pb, 64, 4), 0);
        topo_placement pl;
        topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = trial % 2 + 1};
        cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
        int perm[6] = {0, 1, 2, 3, 4, 5};
        topo_place places[6];
        double best = INFINITY;
        do {
            for (int i = 0; i < 6; i++)
                places[i] = pl.naive[perm[i]];
            double c = topo_placement_cost(m, &tr, &cm, places, NULL);
            best = c < best ? c : best;
        } while (next_permutation(perm, 6));
        CHECK_CLOSE("optimum", &pl.cost_s, &best, 1, 0, 1e-9);
        cr_expect(strstr(pl.method, "exhaustive"), "%s", pl.method);
        topo_placement_free(&pl);
        topo_traffic_free(&tr);
    }
    topo_free(t);
}

Test(topo, greedy_search_on_many_ranks)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    unsigned seed = 7;
    double bv[19], pb[20];
    for (int i = 0; i < 19; i++)
        bv[i] = 1 + rand_r(&seed) % 50000;
    for (int i = 0; i < 20; i++)
        pb[i] = 4.0 * (rand_r(&seed) % 1000000);
    topo_traffic tr;
    cr_assert_eq(topo_traffic_init(&tr, 20, 2, bv, pb, 64, 4), 0);
    topo_placement pl;
    topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = 2};
    cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
    cr_expect(strstr(pl.method, "greedy"), "%s", pl.method);
    check_cpu_cores("40 ranks on 2 nodes", m, &pl, 2);
    cr_expect_leq(pl.cost_s, pl.naive_cost_s);
    topo_placement_free(&pl);
    topo_traffic_free(&tr);
    topo_free(t);
}

Test(topo, impossible_requests)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("local-2core.xml");
    const topo_machine *m = topo_get_machine(t);
    double bv[4] = {1, 1, 1, 1};
    topo_traffic tr;
    cr_assert_eq(topo_traffic_init(&tr, 3, 1, bv, NULL, 8, 1), 0);
    topo_placement pl;
    topo_place_options opt = {.device = TOPO_DEVICE_CUDA, .nodes = 1};
    cr_expect_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), -1, "CUDA without a GPU");
    cr_expect(strstr(pt_error_get(), "no NVIDIA GPU"), "%s", pt_error_get());
    opt = (topo_place_options){.device = TOPO_DEVICE_CPU, .nodes = 1, .exclusive = 1};
    cr_expect_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), -1, "3 exclusive ranks on 2 cores");
    opt.nodes = 2; /* 2 + 1 ranks: fits */
    cr_expect_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
    topo_placement_free(&pl);
    topo_traffic_free(&tr);
    topo_free(t);
}

Test(topo, local_cores_for_binding)
{
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    int *cores, n, shared;
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(topo_local_cores(m, "auto", r, 4, &cores, &n, &shared), 0);
        cr_expect_eq(n, 10);
        cr_expect_eq(cores[0], 10 * r, "rank %d starts at core %d", r, cores[0]);
        cr_expect_eq(cores[9], 10 * r + 9);
        cr_expect_eq(shared, 0);
        free(cores);
    }
    cr_assert_eq(topo_local_cores(m, "auto", 2, 3, &cores, &n, &shared), 0);
    cr_expect(n == 20 && cores[0] == 20, "3 ranks: the third has package 1 (%d cores from %d)", n,
              cores[0]);
    free(cores);
    cr_assert_eq(topo_local_cores(m, "core", 41, 45, &cores, &n, &shared), 0);
    cr_expect(n == 1 && cores[0] == 1 && shared, "core mode wraps round robin");
    free(cores);
    cr_assert_eq(topo_local_cores(m, "none", 0, 2, &cores, &n, &shared), 0);
    cr_expect(n == 0 && cores == NULL);
    cr_expect_eq(topo_local_cores(m, "socket", 0, 2, &cores, &n, &shared), -1);
    cr_expect_eq(topo_local_cores(m, "auto", 2, 2, &cores, &n, &shared), -1);
    topo_free(t);
}

/* ---- binding ------------------------------------------------------------------------ */

Test(topo, binding_sets_the_affinity)
{
    topo_t *t = NULL;
    cr_assert_eq(topo_init(&t, NULL), 0, "%s", pt_error_get());
    const topo_machine *m = topo_get_machine(t);
    char buf[256], want[32];
    /* each core in turn: at least one of these is a change from the inherited mask */
    for (int c = 0; c < m->n_cores && c < 4; c++) {
        cr_assert_eq(topo_bind_cores(t, &c, 1), 0, "%s", pt_error_get());
        int n = topo_affinity_read(buf, sizeof buf);
        cr_expect_eq(n, m->cores[c].n_pus, "core %d: %d CPUs allowed after binding", c, n);
        if (m->cores[c].n_pus == 1) {
            snprintf(want, sizeof want, "%d", m->cores[c].pu_first);
            cr_expect_str_eq(buf, want, "core %d", c);
        }
        cr_expect_eq(atoi(buf), m->cores[c].pu_first);
    }
    int *all = malloc((size_t)m->n_cores * sizeof *all);
    for (int c = 0; c < m->n_cores; c++)
        all[c] = c;
    cr_assert_eq(topo_bind_cores(t, all, m->n_cores), 0, "%s", pt_error_get());
    cr_expect_eq(topo_affinity_read(buf, sizeof buf), m->n_pus);
    free(all);
    int bad = m->n_cores;
    cr_expect_eq(topo_bind_cores(t, &bad, 1), -1, "a core that does not exist");
    topo_free(t);

    t = load("node-16c-1gpu.xml");
    int zero = 0;
    cr_expect_eq(topo_bind_cores(t, &zero, 1), -1, "binding to a described machine");
    cr_expect(strstr(pt_error_get(), "not this machine"), "%s", pt_error_get());
    topo_free(t);
}
