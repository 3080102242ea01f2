/* The schedule search (schedule/search.c): never slower, at the costs it is given, than any
 * hand-written schedule with the same chunks per rank under the same memory limit; strictly
 * faster on uneven stages; within the limit; verified; a limit nothing meets names the
 * smallest. */
#include "tests/schedule_build.h"

#include <math.h>

/* The simulated step at split costs (F, b, w per model chunk). */
static double step_at(const schedule *s, const double *f, const double *b, const double *w)
{
    int C = s->stages * s->virtual_stages;
    double *whole = malloc((size_t)C * sizeof *whole);
    cr_assert(whole);
    for (int c = 0; c < C; c++) whole[c] = b[c] + w[c];
    schedule_costs sc = {.fwd = f, .bwd = whole, .bwd_input = b, .bwd_weight = w,
                         .replicas = 1};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(s, &sc, &sim), 0, "%s", pt_error_get());
    double t = sim.makespan;
    schedule_sim_free(&sim);
    free(whole);
    return t;
}

static double peak_mb(const schedule *s)
{
    schedule_report rep;
    cr_assert_eq(schedule_verify(s, &rep), 0, "%s: %s", s->name, pt_error_get());
    int most = 0;
    for (int k = 0; k < s->stages; k++) most = rep.peak_inflight[k] > most ? rep.peak_inflight[k] : most;
    schedule_report_free(&rep);
    return (double)most / s->virtual_stages;
}

static const char *one_chunk[] = {"gpipe", "1f1b", "zb-h1", "zb-h2"};
static const char *two_chunks[] = {"interleaved", "zb-v", "v-half", "v-min", "dualpipev"};

/* Searches at (f, b, w) with limit `mem` and checks it against every hand-written schedule
 * with V chunks that keeps to it: never slower; strictly faster when `strict`. */
static void check_against_named(int K, int V, int M, const double *f, const double *b,
                                const double *w, double mem, int strict)
{
    schedule s;
    schedule_search_result r;
    schedule_search_config c = {.stages = K, .microbatches = M, .virtual_stages = V,
                                .fwd = f, .bwd_input = b, .bwd_weight = w, .memory = mem};
    cr_assert_eq(schedule_search(&s, &c, &r), 0, "%s", pt_error_get());
    cr_assert_str_eq(s.name, "search");
    cr_assert_str_eq(s.origin, r.how);
    cr_assert(mem <= 0 || peak_mb(&s) <= mem + 1e-9, "peak %g > %g", peak_mb(&s), mem);
    double mine = step_at(&s, f, b, w);
    cr_assert(fabs(mine - r.step) < 1e-9 * mine, "%g vs %g", mine, r.step);
    const char *const *names = V == 1 ? one_chunk : two_chunks;
    int n = V == 1 ? 4 : 5, compared = 0;
    for (int i = 0; i < n; i++) {
        schedule h;
        if (schedule_init_named(&h, names[i], K, V, M)) continue;
        if (mem > 0 && peak_mb(&h) > mem + 1e-9) {
            schedule_free(&h);
            continue;
        }
        double t = step_at(&h, f, b, w);
        compared++;
        cr_assert(mine <= t + 1e-9 * t, "K %d V %d M %d mem %g: search (%s) %g slower than %s %g",
                  K, V, M, mem, r.how, mine, names[i], t);
        if (strict)
            cr_assert(mine < t * (1 - 1e-6), "K %d V %d M %d mem %g: search (%s) %g not faster "
                      "than %s %g", K, V, M, mem, r.how, mine, names[i], t);
        schedule_free(&h);
    }
    cr_assert(compared > 0);
    schedule_free(&s);
}

/* Unit costs: at least as fast as each, for many shapes and limits. */
Test(schedule_search, never_slower_than_hand_written_at_unit_costs)
{
    for (int K = 2; K <= 4; K++)
        for (int M = K; M <= 2 * K + 2; M += K)
            for (int V = 1; V <= 2; V++) {
                double f[8], b[8], w[8];
                for (int c = 0; c < K * V; c++) f[c] = b[c] = w[c] = 1.0 / V;
                check_against_named(K, V, M, f, b, w, 0, 0);
                check_against_named(K, V, M, f, b, w, K, 0);
            }
}

/* A heavy first and last stage (embedding and head, as gpt-nano's under --partition
 * uniform): the search is strictly faster than every hand-written schedule. */
Test(schedule_search, strictly_faster_on_uneven_stages)
{
    /* V = 1, K = 4, stages of uneven F, b, w (with F = b = w per stage, or one heavy stage
     * alone, zb-h1 or 1f1b already reaches the busiest stage's bound) */
    double f1[4] = {1, 3, 3, 3}, b1[4] = {1, 2, 1, 2}, w1[4] = {1, 1, 3, 1};
    check_against_named(4, 1, 8, f1, b1, w1, 0, 1);
    check_against_named(4, 1, 8, f1, b1, w1, 4, 1);
    /* V = 2 in a V: model chunks 0 (embedding) and 7 (head) heavy, both on rank 0 */
    double f2[8] = {3, 1, 1, 1, 1, 1, 1, 3};
    check_against_named(4, 2, 8, f2, f2, f2, 0, 1);
    check_against_named(4, 2, 8, f2, f2, f2, 4, 1);
}

/* The limit is kept, down to one micro-batch per rank. (A smaller limit may still find a
 * faster order than a larger one: the caps tried differ.) */
Test(schedule_search, memory_limit_kept)
{
    double f[4] = {1, 1, 1, 1};
    for (int mem = 6; mem >= 1; mem--) {
        schedule s;
        schedule_search_result r;
        schedule_search_config c = {.stages = 4, .microbatches = 8, .virtual_stages = 1,
                                    .fwd = f, .bwd_input = f, .bwd_weight = f, .memory = mem};
        cr_assert_eq(schedule_search(&s, &c, &r), 0, "%s", pt_error_get());
        cr_assert(peak_mb(&s) <= mem, "limit %d: %s holds %g", mem, r.how, peak_mb(&s));
        cr_assert(r.kept >= 1 && r.tried >= r.kept);
        schedule_free(&s);
    }
}

Test(schedule_search, errors_name_the_smallest)
{
    schedule s;
    schedule_search_config c = {.stages = 4, .microbatches = 8, .virtual_stages = 2,
                                .memory = 0.5};
    cr_assert_eq(schedule_search(&s, &c, NULL), -1);
    cr_assert(strstr(pt_error_get(), "no schedule holds at most 0.5 micro-batches"), "%s",
              pt_error_get());
    cr_assert(strstr(pt_error_get(), "holds 1"), "%s", pt_error_get());
    double bad[4] = {1, 0, 1, 1};
    c = (schedule_search_config){.stages = 4, .microbatches = 8, .virtual_stages = 1,
                                 .fwd = bad};
    cr_assert_eq(schedule_search(&s, &c, NULL), -1);
    cr_assert(strstr(pt_error_get(), "F cost of model chunk 1"), "%s", pt_error_get());
    /* by name: unit costs */
    cr_assert_eq(schedule_init_named(&s, "search", 4, 2, 8), 0, "%s", pt_error_get());
    cr_assert_eq(s.virtual_stages, 2);
    cr_assert(s.origin[0]);
    schedule_free(&s);
}

/* The work is capped: max_runs bounds the greedy orders tried. */
Test(schedule_search, work_capped)
{
    schedule s;
    schedule_search_result r;
    schedule_search_config c = {.stages = 8, .microbatches = 64, .virtual_stages = 2,
                                .max_runs = 16};
    cr_assert_eq(schedule_search(&s, &c, &r), 0, "%s", pt_error_get());
    cr_assert(r.tried <= 16 + 5, "%d tried", r.tried);
    schedule_free(&s);
}
