/* The V placement's partitioner (partition_min_max_v): against brute force over every cut,
 * and on a language model's shape, where balancing the ranks' pairs rather than the chunks
 * shortens zb-v's simulated step. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/base/error.h"
#include "tests/check.h"

static uint64_t rng_state;
static double rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* Asserts that `rc` is an error whose message contains `needle`. */
static void expect_error(int rc, const char *needle, const char *what)
{
    cr_assert_eq(rc, -1, "%s: expected an error, got %d", what, rc);
    cr_assert(strstr(pt_error_get(), needle), "%s: message \"%s\" lacks \"%s\"", what,
              pt_error_get(), needle);
}

/* A chunk's cost accumulated from its first layer upwards, as the library does. */
static double stage_sum(const double *cost, int a, int b)
{
    double s = 0;
    for (int l = a; l < b; l++) s += cost[l];
    return s;
}

/* Largest pair sum (chunks k and 2K−1−k) and largest chunk of a cut into 2K chunks. */
static void pair_figures(const double *cost, const int *first, int K, double *pair,
                         double *chunk)
{
    *pair = *chunk = 0;
    for (int k = 0; k < K; k++) {
        double a = stage_sum(cost, first[k], first[k + 1]);
        double b = stage_sum(cost, first[2 * K - 1 - k], first[2 * K - k]);
        *pair = fmax(*pair, a + b);
        *chunk = fmax(*chunk, fmax(a, b));
    }
}

/* Every cut into 2K chunks: the least largest pair, and the least largest chunk among the
 * cuts whose pairs are all within 1% of it. */
static void brute_pairs(const double *cost, int n, int K, double *best_pair, double *best_chunk)
{
    int C = 2 * K, first[16];
    *best_pair = *best_chunk = INFINITY;
    for (int pass = 0; pass < 2; pass++) {
        first[0] = 0;
        first[C] = n;
        for (int s = 1; s < C; s++) first[s] = s;
        for (;;) {
            double p, c;
            pair_figures(cost, first, K, &p, &c);
            if (pass == 0) *best_pair = fmin(*best_pair, p);
            else if (p <= *best_pair * 1.01 * (1 + 1e-12)) *best_chunk = fmin(*best_chunk, c);
            int s = C - 1;
            while (s >= 1 && first[s] == n - (C - s)) s--;
            if (s < 1) break;
            first[s]++;
            for (int t = s + 1; t < C; t++) first[t] = first[t - 1] + 1;
        }
    }
}

Test(partition, min_max_v_matches_brute_force)
{
    rng_state = 777;
    double cost[12];
    int cases = 0;
    for (int trial = 0; trial < 20; trial++)
        for (int K = 1; K <= 4; K++)
            for (int n = 2 * K; n <= 10; n++) {
                for (int l = 0; l < n; l++) {
                    double u = rng_uniform();
                    cost[l] = trial % 2 ? 1e-3 * u : floor(4 * u);
                }
                partition p;
                cr_assert_eq(partition_min_max_v(&p, cost, n, K), 0, "n %d K %d: %s", n, K,
                             pt_error_get());
                cr_assert_eq(p.stages, 2 * K);
                cr_assert_eq(p.first[0], 0);
                cr_assert_eq(p.first[2 * K], n);
                for (int s = 0; s < 2 * K; s++)
                    cr_assert_lt(p.first[s], p.first[s + 1], "n %d K %d: chunk %d empty", n, K,
                                 s);
                double pair, chunk, best_pair, best_chunk;
                pair_figures(cost, p.first, K, &pair, &chunk);
                brute_pairs(cost, n, K, &best_pair, &best_chunk);
                cr_assert(pair >= best_pair * (1 - 1e-12) &&
                              pair <= best_pair * 1.01 * (1 + 1e-12) + 1e-300,
                          "trial %d n %d K %d: largest pair %g, optimum %g", trial, n, K, pair,
                          best_pair);
                CHECK_CLOSE("largest chunk", &chunk, &best_chunk, 1, 1e-12, 0.0);
                partition_free(&p);
                cases++;
            }
    cr_assert_eq(cases, 20 * (9 + 7 + 5 + 3));
    partition p;
    expect_error(partition_min_max_v(&p, cost, 5, 3), "3 ranks", "too few layers");
    expect_error(partition_min_max_v(&p, cost, 5, 0), "0 ranks", "no ranks");
}

/* zb-v's simulated step at F = b = w = a chunk's cost, K = 2, M = 8. */
static double zb_v_step(const double *cost, const partition *p)
{
    double c[4];
    for (int k = 0; k < 4; k++) c[k] = stage_sum(cost, p->first[k], p->first[k + 1]);
    schedule s;
    cr_assert_eq(schedule_init_named(&s, "zb-v", 2, 2, 8), 0, "%s", pt_error_get());
    double two[4];
    for (int k = 0; k < 4; k++) two[k] = 2 * c[k];
    schedule_costs sc = {.fwd = c, .bwd = two, .bwd_input = c, .bwd_weight = c, .replicas = 1};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(&s, &sc, &sim), 0, "%s", pt_error_get());
    double t = sim.makespan;
    schedule_sim_free(&sim);
    schedule_free(&s);
    return t;
}

/* A language model's shape: a light embedding, six equal blocks, a light norm and head. Cut
 * into 4 chunks one by one, rank 1 gets two blocks on each of its chunks (4 blocks, rank 0
 * 2); the pairs' cut gives each rank 3 (and a head's worth), and zb-v's simulated step
 * drops with it. */
Test(partition, min_max_v_balances_a_language_model)
{
    double cost[9] = {0.01, 1, 1, 1, 1, 1, 1, 0.01, 0.05};
    partition chunks, pairs;
    cr_assert_eq(partition_min_max(&chunks, cost, 9, 4), 0);
    cr_assert_eq(partition_min_max_v(&pairs, cost, 9, 2), 0, "%s", pt_error_get());
    double pc, cc, pp, cp;
    pair_figures(cost, chunks.first, 2, &pc, &cc);
    pair_figures(cost, pairs.first, 2, &pp, &cp);
    cr_assert_float_eq(pc, 4, 1e-9, "chunk by chunk: largest pair %g", pc);
    cr_assert_float_eq(cc, 2, 1e-9, "chunk by chunk: largest chunk %g", cc);
    cr_assert_lt(pp, 3.1, "pairs: largest pair %g", pp);
    cr_assert_leq(cp, 2.01 + 1e-9, "pairs: largest chunk %g", cp);
    double t_chunks = zb_v_step(cost, &chunks), t_pairs = zb_v_step(cost, &pairs);
    cr_assert_lt(t_pairs, 0.85 * t_chunks, "zb-v step %g with the pairs' cut, %g without",
                 t_pairs, t_chunks);
    partition_free(&chunks);
    partition_free(&pairs);
}

/* A list of layer counts with several model chunks per rank: one count per chunk, and the
 * message says so (not "4 stages were asked for" of a run of --stages 2). */
Test(partition, counts_per_model_chunk)
{
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    partition p;
    expect_error(partition_by_method_placed(&p, "5,6", &net, NULL, 2, 2, 0),
                 "2 stages × 2 model chunks per rank make 4 chunks", "V = 2");
    cr_assert_null(p.first);
    cr_assert_eq(partition_by_method_placed(&p, "3,3,3,2", &net, NULL, 2, 2, 0), 0, "%s",
                 pt_error_get());
    cr_assert_eq(p.stages, 4);
    partition_free(&p);
    net_desc_free(&net);
}
