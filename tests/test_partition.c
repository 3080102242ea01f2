/* Stage partitioners: uniform, exact min-max (against brute force), counts lists, the
 * method switch, and the printed table. Nets are built by hand so that these tests do not
 * depend on the model-file parser. Then what the planner builds on a partition: the
 * profile's split backward (measured, src/runtime/profile.c), and the step and memory a layout is
 * priced at (src/plan/predict.c), on models/ files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/base/error.h"
#include "src/plan/predict.h"
#include "src/runtime/profile.h"
#include "src/cpu/stage.h"
#include "tests/check.h"

static void expect_first(const partition *p, const int *want, int stages, const char *what)
{
    cr_assert_eq(p->stages, stages, "%s: %d stages, expected %d", what, p->stages, stages);
    cr_assert_not_null(p->first, "%s: no boundaries", what);
    for (int s = 0; s <= stages; s++)
        cr_assert_eq(p->first[s], want[s], "%s: first[%d] = %d, expected %d", what, s,
                     p->first[s], want[s]);
}

/* Asserts that `rc` is an error whose message contains `needle`. */
static void expect_error(int rc, const char *needle, const char *what)
{
    cr_assert_eq(rc, -1, "%s: expected an error, got %d", what, rc);
    cr_assert(strstr(pt_error_get(), needle), "%s: message \"%s\" lacks \"%s\"", what,
              pt_error_get(), needle);
}

/* ---- uniform ---- */

Test(partition, uniform_splits)
{
    partition p;
    cr_assert_eq(partition_uniform(&p, 11, 3), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 4, 8, 11}, 3, "11 into 3");
    cr_assert_eq(p.n_layers, 11);
    partition_free(&p);
    cr_assert_null(p.first, "partition_free must clear the pointer");

    cr_assert_eq(partition_uniform(&p, 12, 3), 0);
    expect_first(&p, (int[]){0, 4, 8, 12}, 3, "12 into 3");
    partition_free(&p);

    cr_assert_eq(partition_uniform(&p, 10, 4), 0);
    expect_first(&p, (int[]){0, 3, 6, 8, 10}, 4, "10 into 4");
    partition_free(&p);

    cr_assert_eq(partition_uniform(&p, 5, 5), 0);
    expect_first(&p, (int[]){0, 1, 2, 3, 4, 5}, 5, "5 into 5");
    partition_free(&p);

    cr_assert_eq(partition_uniform(&p, 7, 1), 0);
    expect_first(&p, (int[]){0, 7}, 1, "7 into 1");
    partition_free(&p);
}

Test(partition, too_many_stages_is_an_error)
{
    partition p;
    expect_error(partition_check(11, 12), "cannot cut 11 layers into 12 stages", "check");
    cr_assert(strstr(pt_error_get(), "empty"), "%s", pt_error_get());
    expect_error(partition_check(5, 0), "at least 1", "zero stages");
    expect_error(partition_check(0, 1), "no layers", "no layers");
    cr_assert_eq(partition_check(11, 11), 0);
    cr_assert_eq(partition_check(11, 1), 0);

    expect_error(partition_uniform(&p, 3, 4), "cannot cut 3 layers into 4 stages", "uniform");
    cr_assert_null(p.first, "a failed call must leave a freeable, empty partition");
    partition_free(&p);
    double cost[3] = {1, 2, 3};
    expect_error(partition_min_max(&p, cost, 3, 4), "a stage would be empty", "min_max");
    partition_free(&p);
    expect_error(partition_from_counts(&p, "1,1,1,1", 3, 4), "a stage would be empty",
                 "counts");
    partition_free(&p);
}

/* ---- min-max against brute force ---- */

/* Deterministic generator (no clock seeds): 64-bit LCG, top bits. */
static uint64_t rng_state;
static double rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

/* Stage sum accumulated from the stage's first layer upwards, as the library does. */
static double stage_sum(const double *cost, int a, int b)
{
    double s = 0;
    for (int l = a; l < b; l++)
        s += cost[l];
    return s;
}

/* Enumerates every cut in lexicographic order of its boundaries and keeps the first one
 * with the smallest maximum: the lexicographically smallest optimum. */
static double brute_min_max(const double *cost, int n, int k, int *best_first)
{
    int first[16];
    double best = INFINITY;
    first[0] = 0;
    first[k] = n;
    for (int s = 1; s < k; s++)
        first[s] = s;
    for (;;) {
        double m = 0;
        for (int s = 0; s < k; s++)
            m = fmax(m, stage_sum(cost, first[s], first[s + 1]));
        if (m < best) {
            best = m;
            memcpy(best_first, first, (size_t)(k + 1) * sizeof *first);
        }
        /* Next combination of boundaries first[1..k-1] in (0, n). */
        int s = k - 1;
        while (s >= 1 && first[s] == n - (k - s))
            s--;
        if (s < 1)
            break;
        first[s]++;
        for (int t = s + 1; t < k; t++)
            first[t] = first[t - 1] + 1;
    }
    return best;
}

static double partition_max(const partition *p, const double *cost)
{
    double m = 0;
    for (int s = 0; s < p->stages; s++) {
        cr_assert_lt(p->first[s], p->first[s + 1], "stage %d is empty", s);
        m = fmax(m, stage_sum(cost, p->first[s], p->first[s + 1]));
    }
    return m;
}

Test(partition, min_max_matches_brute_force)
{
    rng_state = 12345;
    double cost[12];
    int want[16];
    int cases = 0;
    for (int trial = 0; trial < 60; trial++) {
        for (int n = 1; n <= 12; n++) {
            /* Alternate real costs with small integers, whose many ties exercise the
             * tie-breaking rule; a few zero-cost layers mimic parameterless layers. */
            for (int l = 0; l < n; l++) {
                double u = rng_uniform();
                cost[l] = trial % 2 ? 1e-3 * u : floor(4 * u);
            }
            for (int k = 1; k <= n; k++) {
                partition p;
                cr_assert_eq(partition_min_max(&p, cost, n, k), 0, "n %d k %d: %s", n, k,
                             pt_error_get());
                double best = brute_min_max(cost, n, k, want);
                double got = partition_max(&p, cost);
                CHECK_CLOSE("optimum", &got, &best, 1, 0.0, 0.0);
                cr_assert_eq(p.first[0], 0);
                cr_assert_eq(p.first[k], n);
                for (int s = 0; s <= k; s++)
                    cr_assert_eq(p.first[s], want[s],
                                 "trial %d n %d k %d: first[%d] = %d, brute force %d", trial,
                                 n, k, s, p.first[s], want[s]);
                /* Same input, same answer: nothing depends on earlier calls. */
                partition q;
                cr_assert_eq(partition_min_max(&q, cost, n, k), 0);
                cr_assert_eq(memcmp(p.first, q.first, (size_t)(k + 1) * sizeof(int)), 0,
                             "n %d k %d: second call differs", n, k);
                partition_free(&q);
                partition_free(&p);
                cases++;
            }
        }
    }
    cr_assert_eq(cases, 60 * 78);
}

/* Fills each stage while it stays within total/K: the obvious heuristic. */
static double greedy_max(const double *cost, int n, int k)
{
    double target = stage_sum(cost, 0, n) / k, worst = 0;
    int i = 0;
    for (int s = 0; s < k; s++) {
        int j = i + 1;
        double acc = cost[i];
        if (s == k - 1)
            j = n, acc = stage_sum(cost, i, n);
        while (j < n - (k - 1 - s) && acc + cost[j] <= target)
            acc += cost[j++];
        worst = fmax(worst, acc);
        i = j;
    }
    return worst;
}

Test(partition, min_max_beats_greedy)
{
    partition p;
    double a[5] = {2, 2, 3, 1, 4};
    cr_assert_eq(greedy_max(a, 5, 2), 8, "the greedy heuristic should get 8 here");
    cr_assert_eq(partition_min_max(&p, a, 5, 2), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 3, 5}, 2, "2,2,3 | 1,4");
    cr_assert_eq(partition_max(&p, a), 7);
    partition_free(&p);

    double b[5] = {3, 3, 2, 2, 2};
    cr_assert_eq(greedy_max(b, 5, 3), 6, "the greedy heuristic should get 6 here");
    cr_assert_eq(partition_min_max(&p, b, 5, 3), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 1, 3, 5}, 3, "3 | 3,2 | 2,2");
    cr_assert_eq(partition_max(&p, b), 5);
    partition_free(&p);
}

Test(partition, min_max_ties_and_zero_costs)
{
    partition p;
    double zeros[5] = {0};
    cr_assert_eq(partition_min_max(&p, zeros, 5, 3), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 1, 2, 5}, 3, "all zero: earliest boundaries");
    partition_free(&p);

    double peak[5] = {0, 0, 3, 0, 0};
    cr_assert_eq(partition_min_max(&p, peak, 5, 2), 0);
    expect_first(&p, (int[]){0, 1, 5}, 2, "one heavy layer");
    partition_free(&p);

    double even[4] = {1, 1, 1, 1};
    cr_assert_eq(partition_min_max(&p, even, 4, 2), 0);
    expect_first(&p, (int[]){0, 2, 4}, 2, "even");
    partition_free(&p);
}

Test(partition, min_max_rejects_bad_costs)
{
    partition p;
    double nan_cost[3] = {1, NAN, 1};
    expect_error(partition_min_max(&p, nan_cost, 3, 2), "layer 1", "NaN");
    partition_free(&p);
    double neg[3] = {1, 2, -0.5};
    expect_error(partition_min_max(&p, neg, 3, 2), "layer 2", "negative");
    partition_free(&p);
    double inf[2] = {INFINITY, 1};
    expect_error(partition_min_max(&p, inf, 2, 1), "finite", "infinite");
    partition_free(&p);
    double huge[2] = {1.5e308, 1.5e308};
    expect_error(partition_min_max(&p, huge, 2, 1), "add up", "overflowing sum");
    partition_free(&p);
    expect_error(partition_min_max(&p, NULL, 3, 2), "no layer costs", "NULL costs");
    partition_free(&p);
    double ok[3] = {1, 1, 1};
    expect_error(partition_min_max(&p, ok, 3, 0), "at least 1", "K = 0");
    partition_free(&p);
    expect_error(partition_min_max(NULL, ok, 3, 1), "NULL", "NULL partition");
}

/* ---- a hand-built CNN ---- */

static layer_shape shp(int c, int h, int w) { return (layer_shape){c, h, w}; }

/* conv 1→8 3×3, maxpool, conv 8→16 3×3, maxpool, flatten, dense 784→128, dropout,
 * dense 128→10 on a 1×28×28 input. */
static net_desc cnn_net(layer_desc *l)
{
    memset(l, 0, 8 * sizeof *l);
    l[0] = (layer_desc){.type = LAYER_CONV, .in = shp(1, 28, 28), .out = shp(8, 28, 28),
                        .weight_count = 72, .bias_count = 8};
    l[1] = (layer_desc){.type = LAYER_MAXPOOL, .in = shp(8, 28, 28), .out = shp(8, 14, 14)};
    l[2] = (layer_desc){.type = LAYER_CONV, .in = shp(8, 14, 14), .out = shp(16, 14, 14),
                        .weight_count = 1152, .bias_count = 16};
    l[3] = (layer_desc){.type = LAYER_MAXPOOL, .in = shp(16, 14, 14), .out = shp(16, 7, 7)};
    l[4] = (layer_desc){.type = LAYER_FLATTEN, .in = shp(16, 7, 7), .out = shp(784, 1, 1)};
    l[5] = (layer_desc){.type = LAYER_DENSE, .in = shp(784, 1, 1), .out = shp(128, 1, 1),
                        .weight_count = 100352, .bias_count = 128};
    l[6] = (layer_desc){.type = LAYER_DROPOUT, .in = shp(128, 1, 1), .out = shp(128, 1, 1)};
    l[7] = (layer_desc){.type = LAYER_DENSE, .in = shp(128, 1, 1), .out = shp(10, 1, 1),
                        .weight_count = 1280, .bias_count = 10};
    net_desc net = {.input = shp(1, 28, 28), .n_layers = 8, .layers = l, .classes = 10};
    for (int i = 0; i < 8; i++)
        net.param_count += l[i].weight_count + l[i].bias_count;
    return net;
}

Test(partition, params_method_on_cnn)
{
    layer_desc l[8];
    net_desc net = cnn_net(l);
    partition p;
    /* Two stages: everything up to the big dense layer (101728 parameters) against the
     * last two layers; cutting one layer earlier would give the second stage 101770. */
    cr_assert_eq(partition_by_method(&p, "params", &net, NULL, 2), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 6, 8}, 2, "params, 2 stages");
    partition_free(&p);
    /* Three stages: the dense layer alone with its parameterless neighbours; the earliest
     * boundaries that achieve 100480 are 3 and 6. */
    cr_assert_eq(partition_by_method(&p, "params", &net, NULL, 3), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 3, 6, 8}, 3, "params, 3 stages");
    partition_free(&p);
    /* As many stages as layers: parameterless layers still get a stage each. */
    cr_assert_eq(partition_by_method(&p, "params", &net, NULL, 8), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 1, 2, 3, 4, 5, 6, 7, 8}, 8, "params, 8 stages");
    partition_free(&p);
    expect_error(partition_by_method(&p, "params", &net, NULL, 9), "cannot cut 8 layers",
                 "params, 9 stages");
    partition_free(&p);
}

static void profile_fill(partition_profile *prof, const double *fwd, const double *bwd, int n)
{
    *prof = (partition_profile){0};
    prof->n_layers = n;
    prof->fwd_s = malloc((size_t)n * sizeof(double));
    prof->bwd_s = malloc((size_t)n * sizeof(double));
    cr_assert(prof->fwd_s && prof->bwd_s);
    memcpy(prof->fwd_s, fwd, (size_t)n * sizeof(double));
    memcpy(prof->bwd_s, bwd, (size_t)n * sizeof(double));
}

Test(partition, time_and_other_methods)
{
    layer_desc l[8];
    net_desc net = cnn_net(l);
    /* Convolutions dominate time even though the dense layer dominates parameters. */
    double fwd[8] = {4e-4, 1e-4, 6e-4, 5e-5, 1e-6, 2e-5, 1e-6, 1e-6};
    double bwd[8] = {8e-4, 1e-4, 12e-4, 5e-5, 1e-6, 4e-5, 1e-6, 2e-6};
    partition_profile prof;
    profile_fill(&prof, fwd, bwd, 8);
    partition p, q;
    cr_assert_eq(partition_by_method(&p, "time", &net, &prof, 2), 0, "%s", pt_error_get());
    double cost[8];
    for (int i = 0; i < 8; i++)
        cost[i] = fwd[i] + bwd[i];
    cr_assert_eq(partition_min_max(&q, cost, 8, 2), 0);
    expect_first(&p, q.first, 2, "time equals min_max of fwd + bwd");
    expect_first(&p, (int[]){0, 2, 8}, 2, "time: first conv and pool alone");
    partition_free(&p);
    partition_free(&q);

    expect_error(partition_by_method(&p, "time", &net, NULL, 2), "profile", "time without");
    prof.n_layers = 7;
    expect_error(partition_by_method(&p, "time", &net, &prof, 2), "7 layers but the model has 8",
                 "time, wrong profile");
    prof.n_layers = 8;
    partition_profile_free(&prof);
    cr_assert(prof.fwd_s == NULL && prof.bwd_s == NULL && prof.n_layers == 0,
              "partition_profile_free must clear the profile");
    partition_profile_free(&prof); /* twice is harmless */

    cr_assert_eq(partition_by_method(&p, "uniform", &net, NULL, 3), 0);
    expect_first(&p, (int[]){0, 3, 6, 8}, 3, "uniform");
    partition_free(&p);
    cr_assert_eq(partition_by_method(&p, "1,4,3", &net, NULL, 3), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 1, 5, 8}, 3, "counts");
    partition_free(&p);
    cr_assert_eq(partition_by_method(&p, "8", &net, NULL, 1), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 8}, 1, "single count");
    partition_free(&p);
    expect_error(partition_by_method(&p, "4,,4", &net, NULL, 2), "entry 2 is empty",
                 "malformed list through by_method");
    expect_error(partition_by_method(&p, "balanced", &net, NULL, 2), "unknown", "unknown");
    for (const char *name = "uniform\0params\0time\0"; *name; name += strlen(name) + 1)
        cr_assert(strstr(pt_error_get(), name), "message \"%s\" should name %s",
                  pt_error_get(), name);
    expect_error(partition_by_method(&p, NULL, &net, NULL, 2), "no partition method", "NULL");
    expect_error(partition_by_method(&p, "uniform", NULL, NULL, 2), "no layers", "no net");
}

/* ---- counts lists ---- */

Test(partition, counts_good)
{
    partition p;
    cr_assert_eq(partition_from_counts(&p, "4,3,4", 11, 3), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 4, 7, 11}, 3, "4,3,4");
    partition_free(&p);
    /* Blanks around entries are accepted (as typed in a config file), not inside them. */
    cr_assert_eq(partition_from_counts(&p, " 4, 3 ,\t4 ", 11, 3), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 4, 7, 11}, 3, "with blanks");
    partition_free(&p);
    cr_assert_eq(partition_from_counts(&p, "11", 11, 1), 0, "%s", pt_error_get());
    expect_first(&p, (int[]){0, 11}, 1, "one stage");
    partition_free(&p);
}

Test(partition, counts_bad)
{
    static const struct {
        const char *list;
        int n, k;
        const char *needle;
    } bad[] = {
        {"4,3", 11, 3, "has 2 entries but 3 stages were asked for"},
        {"4,,3", 11, 3, "entry 2 is empty"},
        {"4,3,4,", 11, 3, "entry 4 is empty"},
        {",4,3,4", 11, 3, "entry 1 is empty"},
        {"0,11", 11, 2, "entry 1 is 0"},
        {"a,b", 11, 2, "entry 1 \"a\" is not a positive integer"},
        {"4,3,3", 11, 3, "partition list 4,3,3 covers 10 layers but the model has 11"},
        {"4,4,4", 11, 3, "covers 12 layers"},
        {"4,3,2,2", 11, 3, "has 4 entries but 3 stages"},
        {"4 3,4", 11, 2, "entry 1 \"4 3\" is not a positive integer"},
        {"-4,15", 11, 2, "\"-4\" is not a positive integer"},
        {"+4,7", 11, 2, "\"+4\" is not a positive integer"},
        {"4.0,7", 11, 2, "\"4.0\" is not a positive integer"},
        {"99999999999,1", 11, 2, "too large"},
        {"", 11, 1, "empty"},
        {"  ", 11, 1, "empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        partition p;
        pt_error_clear();
        expect_error(partition_from_counts(&p, bad[i].list, bad[i].n, bad[i].k), bad[i].needle,
                     bad[i].list);
        cr_assert_null(p.first, "%s: a failed parse must leave no allocation", bad[i].list);
        partition_free(&p);
    }
    partition p;
    expect_error(partition_from_counts(&p, NULL, 11, 1), "missing", "NULL list");
}

/* ---- printing and imbalance ---- */

static char *print_to_string(const partition *p, const net_desc *net,
                             const partition_profile *prof)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    cr_assert_not_null(f);
    partition_print(p, net, prof, f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_not_null(buf);
    return buf;
}

/* The line of `text` that starts with `prefix`, copied into `line`. */
static int find_line(const char *text, const char *prefix, char *line, size_t size)
{
    for (const char *s = text; *s;) {
        const char *e = strchr(s, '\n');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (strncmp(s, prefix, strlen(prefix)) == 0 && len < size) {
            memcpy(line, s, len);
            line[len] = '\0';
            return 1;
        }
        s += len + (e ? 1 : 0);
    }
    return 0;
}

Test(partition, print_table_with_profile)
{
    layer_desc l[8];
    net_desc net = cnn_net(l);
    double fwd[8] = {1e-3, 0, 1e-3, 0, 0, 2e-3, 0, 0};
    double bwd[8] = {1e-3, 0, 1e-3, 0, 0, 2e-3, 0, 0};
    partition_profile prof;
    profile_fill(&prof, fwd, bwd, 8);
    partition p;
    cr_assert_eq(partition_from_counts(&p, "2,3,3", 8, 3), 0);
    char *text = print_to_string(&p, &net, &prof);
    char line[512];

    cr_assert(find_line(text, "stage", line, sizeof line), "no header in:\n%s", text);
    cr_assert(strstr(line, "parameters") && strstr(line, "ms/sample"), "header: %s", line);

    /* Stage 0: conv + maxpool, 80 parameters, 2 ms, sends 8·14·14 = 1568 values. */
    cr_assert(find_line(text, "    0  0\u20131 ", line, sizeof line), "no row 0 in:\n%s", text);
    cr_assert(strstr(line, layer_type_name(LAYER_CONV)), "row 0: %s", line);
    cr_assert(strstr(line, layer_type_name(LAYER_MAXPOOL)), "row 0: %s", line);
    cr_assert(strstr(line, " 80 "), "row 0 parameters: %s", line);
    cr_assert(strstr(line, " 2.000 "), "row 0 time: %s", line);
    cr_assert(strstr(line, " 1568"), "row 0 boundary: %s", line);
    /* Stage 1: conv, maxpool, flatten: 1168 parameters, 2 ms, sends 784 values. */
    cr_assert(find_line(text, "    1  2\u20134 ", line, sizeof line), "no row 1 in:\n%s", text);
    cr_assert(strstr(line, layer_type_name(LAYER_FLATTEN)), "row 1: %s", line);
    cr_assert(strstr(line, " 1168 "), "row 1 parameters: %s", line);
    cr_assert(strstr(line, " 784"), "row 1 boundary: %s", line);
    /* Stage 2: dense, dropout, dense: 101770 parameters, 4 ms, last stage sends nothing. */
    cr_assert(find_line(text, "    2  5\u20137 ", line, sizeof line), "no row 2 in:\n%s", text);
    cr_assert(strstr(line, layer_type_name(LAYER_DROPOUT)), "row 2: %s", line);
    cr_assert(strstr(line, " 101770 "), "row 2 parameters: %s", line);
    cr_assert(strstr(line, " 4.000 "), "row 2 time: %s", line);
    size_t len = strlen(line);
    cr_assert(len > 2 && strcmp(line + len - 2, " -") == 0, "row 2 boundary: %s", line);
    cr_assert(find_line(text, "total", line, sizeof line), "no total in:\n%s", text);
    cr_assert(strstr(line, " 103018 ") && strstr(line, " 8.000"), "total: %s", line);

    /* Stage times 2, 2, 4 ms: slowest / mean = 4 / (8/3) = 1.5. */
    cr_assert(strstr(text, "imbalance (slowest / mean): 1.50\n"), "imbalance in:\n%s", text);
    free(text);

    double cost[8];
    for (int i = 0; i < 8; i++)
        cost[i] = fwd[i] + bwd[i];
    double imb = partition_imbalance(&p, cost), want = 1.5;
    CHECK_CLOSE("imbalance", &imb, &want, 1, 0.0, 1e-12);
    partition_profile_free(&prof);
    partition_free(&p);
}

Test(partition, print_table_without_profile)
{
    layer_desc l[8];
    net_desc net = cnn_net(l);
    partition p;
    cr_assert_eq(partition_uniform(&p, 8, 2), 0);
    char *text = print_to_string(&p, &net, NULL);
    char line[512];
    cr_assert(find_line(text, "stage", line, sizeof line), "no header in:\n%s", text);
    cr_assert_null(strstr(line, "ms/sample"), "no time column without a profile: %s", line);
    cr_assert(find_line(text, "    0  0\u20133 ", line, sizeof line), "no row 0 in:\n%s", text);
    cr_assert(strstr(line, " 1248 ") && strstr(line, " 784"), "row 0: %s", line);
    cr_assert(find_line(text, "    1  4\u20137 ", line, sizeof line), "no row 1 in:\n%s", text);
    cr_assert(strstr(line, " 101770 "), "row 1: %s", line);
    /* Parameters 1248 and 101770: largest / mean = 101770 / 51509 = 1.98. */
    cr_assert(strstr(text, "imbalance (largest / mean, parameters): 1.98\n"),
              "imbalance in:\n%s", text);
    free(text);

    /* A partition of another model is reported, not printed as a table. */
    partition wrong;
    cr_assert_eq(partition_uniform(&wrong, 7, 2), 0);
    text = print_to_string(&wrong, &net, NULL);
    cr_assert(strstr(text, "does not fit"), "got:\n%s", text);
    cr_assert_null(strstr(text, "imbalance"), "got:\n%s", text);
    free(text);
    partition_free(&wrong);
    partition_free(&p);
}

Test(partition, imbalance_values)
{
    partition p;
    cr_assert_eq(partition_from_counts(&p, "1,2,1", 4, 3), 0);
    double cost[4] = {3, 1, 1, 1};
    double imb = partition_imbalance(&p, cost), want = 1.5; /* 3 / (6/3) */
    CHECK_CLOSE("imbalance", &imb, &want, 1, 0.0, 1e-12);
    double zero[4] = {0};
    imb = partition_imbalance(&p, zero);
    want = 1.0;
    CHECK_CLOSE("all-zero imbalance", &imb, &want, 1, 0.0, 0.0);
    cr_assert(isnan(partition_imbalance(&p, NULL)), "NULL costs give NaN");
    partition_free(&p);
    cr_assert(isnan(partition_imbalance(&p, cost)), "an empty partition gives NaN");
}

/* ---- the profile's split backward, the planner's prices ---- */

void openblas_set_num_threads(int);


/* B and W measured per layer: both positive where the layer has parameters (W is zero
 * work elsewhere), and together about the fused backward: within 50% over the model and
 * over its convolutions. The two are timed apart, on a machine ctest shares among several
 * tests (or other work loads), so each layer's least time over the profiles taken so far
 * counts, and a profile whose sums disagree is followed by another, up to five: load only
 * lengthens times, so the least ones converge on the work, and a split that does other
 * work keeps disagreeing. */
static int split_close(const net_desc *net, int attempt, int last, double *least)
{
    int n = net->n_layers;
    partition_profile prof;
    cr_assert_eq(partition_profile_measure(&prof, net, 16, 2, 7), 0, "%s", pt_error_get());
    cr_assert(prof.bwd_input_s && prof.bwd_weight_s, "the CPU profile measures B and W");
    double fused = 0, split = 0, conv_fused = 0, conv_split = 0;
    for (int l = 0; l < n; l++) {
        const layer_desc *L = &net->layers[l];
        double b = prof.bwd_input_s[l], w = prof.bwd_weight_s[l], f = prof.bwd_s[l];
        cr_assert(b >= 0 && w >= 0 && isfinite(b) && isfinite(w), "layer %d: B %g, W %g", l, b,
                  w);
        if (L->weight_count + L->bias_count > 0)
            cr_assert(b > 0 && w > 0, "layer %d (%s) has parameters: B %g and W %g must be > 0",
                      l, layer_type_name(L->type), b, w);
        double now[3] = {f, b, w};
        for (int k = 0; k < 3; k++)
            if (attempt == 1 || now[k] < least[3 * l + k]) least[3 * l + k] = now[k];
        f = least[3 * l], b = least[3 * l + 1], w = least[3 * l + 2];
        fused += f;
        split += b + w;
        if (L->type == LAYER_CONV) {
            conv_fused += f;
            conv_split += b + w;
        }
    }
    partition_profile_free(&prof);
    cr_assert(prof.bwd_input_s == NULL && prof.bwd_weight_s == NULL,
              "partition_profile_free must clear the split too");
    cr_assert(conv_fused > 0, "the convolutions' backward is measured");
    int close = fabs(split - fused) <= 0.5 * fused &&
                fabs(conv_split - conv_fused) <= 0.5 * conv_fused;
    if (!close && last)
        cr_assert_fail("after %d profiles: B + W = %g s/sample against the fused %g; "
                       "convolutions: %g against %g", attempt, split, fused, conv_split,
                       conv_fused);
    return close;
}

Test(profile, split_backward_close_to_fused)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    double least[3 * net.n_layers];
    for (int attempt = 1;
         attempt <= 5 && !split_close(&net, attempt, attempt == 5, least); attempt++)
        ;
    net_desc_free(&net);
}

/* A profile of per-sample costs: every layer forward f, backward b, split bi + bw. */
static void profile_const(partition_profile *prof, int n, double f, double b, double bi,
                          double bw)
{
    double fwd[n], bwd[n];
    for (int l = 0; l < n; l++) fwd[l] = f, bwd[l] = b;
    profile_fill(prof, fwd, bwd, n);
    prof->bwd_input_s = malloc((size_t)n * sizeof(double));
    prof->bwd_weight_s = malloc((size_t)n * sizeof(double));
    cr_assert(prof->bwd_input_s && prof->bwd_weight_s);
    for (int l = 0; l < n; l++) prof->bwd_input_s[l] = bi, prof->bwd_weight_s[l] = bw;
}

static plan_prediction predict(const net_desc *net, const partition *part,
                               const partition_profile *prof, const char *sched, int V, int M,
                               const int *recompute)
{
    plan_predict_config cfg = {.schedule = sched, .virtual_stages = V, .recompute = recompute,
                               .microbatch = 1, .rep = {.replicas = 1, .microbatches = M}};
    plan_prediction p;
    cr_assert_eq(plan_predict(&p, net, part, prof, &cfg), 0, "%s: %s", sched, pt_error_get());
    return p;
}

/* Layer costs on the 8-layer net, 4 stages of 2 (per stage F = 2, B = 8, split 2 + 2):
 * 1F1B's step is (M + K − 1)(F + B); zb-h1 runs B and W at the profile's split costs (not
 * half the fused backward: the split must be used); recomputation adds a forward per
 * micro-batch to every stage's busy time; interleaved (8 chunks) has a smaller bubble. */
Test(plan, predict_prices_split_recompute_and_chunks)
{
    layer_desc l[8];
    net_desc net = cnn_net(l);
    int n = net.n_layers, K = 4, M = 8;
    partition_profile prof;
    profile_const(&prof, n, 1, 4, 1, 1);
    partition p4, p8;
    cr_assert_eq(partition_uniform(&p4, n, K), 0);
    cr_assert_eq(partition_uniform(&p8, n, 2 * K), 0);
    double f = 2, b = 8;
    plan_prediction a = predict(&net, &p4, &prof, "1f1b", 1, M, NULL);
    double want = (M + K - 1) * (f + b);
    CHECK_CLOSE("1f1b step", &a.step_s, &want, 1, 1e-9, 1e-12);
    plan_prediction z = predict(&net, &p4, &prof, "zb-h1", 1, M, NULL);
    double busy = M * (f + 2 + 2); /* F + B + W of stage 0 */
    CHECK_CLOSE("zb-h1 busy of stage 0", &z.busy_s[0], &busy, 1, 1e-9, 1e-12);
    cr_assert(z.step_s < a.step_s, "zb-h1 %g against 1f1b %g", z.step_s, a.step_s);
    int all[4] = {1, 1, 1, 1};
    plan_prediction r = predict(&net, &p4, &prof, "1f1b", 1, M, all);
    busy = M * (f + b + f);
    CHECK_CLOSE("recompute busy of stage 0", &r.busy_s[0], &busy, 1, 1e-9, 1e-12);
    cr_assert(r.step_s > a.step_s, "recompute %g against %g", r.step_s, a.step_s);
    plan_prediction v = predict(&net, &p8, &prof, "interleaved", 2, M, NULL);
    cr_assert(v.bubble < a.bubble, "interleaved bubble %g against 1f1b %g", v.bubble, a.bubble);
    /* without the split in the profile, B and W are half the backward each */
    free(prof.bwd_input_s), free(prof.bwd_weight_s);
    prof.bwd_input_s = prof.bwd_weight_s = NULL;
    plan_prediction h = predict(&net, &p4, &prof, "zb-h1", 1, M, NULL);
    busy = M * (f + b);
    CHECK_CLOSE("zb-h1 without a split profile", &h.busy_s[0], &busy, 1, 1e-9, 1e-12);
    /* a partition that is not K·V chunks, replicas with V > 1 */
    plan_prediction bad;
    plan_predict_config cfg = {.schedule = "interleaved", .virtual_stages = 3,
                               .microbatch = 1, .rep = {.replicas = 1, .microbatches = M}};
    expect_error(plan_predict(&bad, &net, &p8, &prof, &cfg), "per rank", "8 chunks, V = 3");
    /* replicas with V = 2: rank s reduces its chunks s and s + K (R = 2: each byte once) */
    double alpha[4] = {0}, beta[4] = {1e9, 1e9, 1e9, 1e9}, bytes[4] = {0};
    cfg = (plan_predict_config){.schedule = "interleaved", .virtual_stages = 2, .microbatch = 1,
                                .alpha = alpha, .beta = beta,
                                .rep = {.replicas = 2, .microbatches = M, .bucket_bytes = 1 << 20,
                                        .skip_bucket = -1}};
    for (int c = 0; c < 2 * K; c++)
        for (int j = p8.first[c]; j < p8.first[c + 1]; j++)
            bytes[c % K] += 4e-9 * (double)(net.layers[j].weight_count + net.layers[j].bias_count);
    cr_assert_eq(plan_predict(&bad, &net, &p8, &prof, &cfg), 0, "V 2, R 2: %s", pt_error_get());
    CHECK_CLOSE("V 2, R 2: each rank's reductions", bad.reduce_s, bytes, K, 1e-9, 1e-15);
    plan_prediction_free(&bad);
    plan_prediction_free(&a), plan_prediction_free(&z), plan_prediction_free(&r);
    plan_prediction_free(&v), plan_prediction_free(&h);
    partition_free(&p4), partition_free(&p8);
    partition_profile_free(&prof);
}

static void memory_of(double *out, const net_desc *net, const partition *part, const char *name,
                      int K, int V, int M, const int *recompute, const plan_memory_config *mc)
{
    schedule s;
    cr_assert_eq(plan_schedule(&s, name, K, V, M, recompute), 0, "%s", pt_error_get());
    cr_assert_eq(plan_memory(out, net, part, &s, mc), 0, "%s", pt_error_get());
    schedule_free(&s);
}

/* What each schedule adds to a rank's memory, against 1F1B on the same cut: zb-h1 the
 * split's output gradients per slot (and the slots it holds longer), recomputation the
 * kept outputs minus the slots it frees, batched weight gradients the stash, and interleaved
 * the sum over a rank's chunks. */
Test(plan, memory_counts_what_train_allocates)
{
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    int n = net.n_layers, K = 2, M = 8, mb = 4;
    partition p;
    cr_assert_eq(partition_uniform(&p, n, K), 0);
    plan_memory_config mc = {.microbatch = mb};
    double base[2], zb[2], rc[2], wg[2];
    memory_of(base, &net, &p, "1f1b", K, 1, M, NULL, &mc);
    memory_of(zb, &net, &p, "zb-h1", K, 1, M, NULL, &mc);
    int all[2] = {1, 1};
    memory_of(rc, &net, &p, "1f1b", K, 1, M, all, &mc);
    mc.wgrad_batched = 1;
    memory_of(wg, &net, &p, "1f1b", K, 1, M, NULL, &mc);
    mc.wgrad_batched = 0;
    schedule s1, s2, s3;
    schedule_report r1, r2, r3;
    cr_assert_eq(plan_schedule(&s1, "1f1b", K, 1, M, NULL), 0);
    cr_assert_eq(plan_schedule(&s2, "zb-h1", K, 1, M, NULL), 0);
    cr_assert_eq(plan_schedule(&s3, "1f1b", K, 1, M, all), 0);
    cr_assert_eq(schedule_verify(&s1, &r1), 0);
    cr_assert_eq(schedule_verify(&s2, &r2), 0);
    cr_assert_eq(schedule_verify(&s3, &r3), 0);
    for (int s = 0; s < K; s++) {
        int first = p.first[s], last = p.first[s + 1];
        stage_bytes sb = stage_estimate(&net, first, last, mb, 1);
        double split = (double)stage_split_slot_bytes(&net, first, last, mb);
        double want = base[s] + r2.peak_inflight_chunk[s] * (sb.slot + split) -
                      r1.peak_inflight_chunk[s] * (double)sb.slot;
        CHECK_CLOSE("zb-h1 memory", &zb[s], &want, 1, 0.5, 0.0);
        /* the outputs waiting to be sent: the engine's pool, the verifier's inputs kept */
        double kept = last < n ? r3.peak_inputs_chunk[s] * mb * 4.0 *
                                     (double)layer_shape_count(net.layers[last - 1].out)
                               : 0;
        /* the messages received (and the last stage's loss gradient, in the logits' place
         * unless recomputation drops the slot between the forward and the backward) into
         * as many buffers as liveness needs: recomputation moves their last uses */
        int both = SCHED_W_READS_ACT | SCHED_W_READS_GRAD, n1[2], n3[2]; /* no W in these */
        cr_assert_eq(schedule_receive_buffers(&s1, s, 0, 3, both, n1, NULL), 0);
        cr_assert_eq(schedule_receive_buffers(&s3, s, 0, 3, both, n3, NULL), 0);
        double in_b = first > 0 ? mb * 4.0 * (double)layer_shape_count(net.layers[first].in) : 0;
        double out_b = mb * 4.0 * (double)layer_shape_count(net.layers[last - 1].out);
        double recv = (n3[0] - n1[0]) * in_b + (last < n ? n3[1] - n1[1] : n3[1]) * out_b;
        want = base[s] + kept + recv +
               (r3.peak_inflight_chunk[s] - r1.peak_inflight_chunk[s]) * (double)sb.slot;
        CHECK_CLOSE("recompute memory", &rc[s], &want, 1, 0.5, 0.0);
        want = base[s] + (double)stage_wgrad_row_bytes(&net, first, last) * mb * M;
        CHECK_CLOSE("batched wgrad memory", &wg[s], &want, 1, 0.5, 0.0);
    }
    cr_assert(r3.peak_inflight_chunk[0] < r1.peak_inflight_chunk[0],
              "recomputation must hold fewer activations on stage 0: %d against %d",
              r3.peak_inflight_chunk[0], r1.peak_inflight_chunk[0]);
    schedule_report_free(&r1), schedule_report_free(&r2), schedule_report_free(&r3);
    schedule_free(&s1), schedule_free(&s2), schedule_free(&s3);

    /* interleaved: rank s holds chunks s and s + K; its memory is more than either chunk's
     * stage_estimate state alone and the plan refuses a cut of the wrong size */
    partition p4;
    cr_assert_eq(partition_uniform(&p4, n, 2 * K), 0);
    double iv[2];
    memory_of(iv, &net, &p4, "interleaved", K, 2, M, NULL, &mc);
    for (int s = 0; s < K; s++) {
        double state = 0;
        for (int v = 0; v < 2; v++) {
            stage_bytes sb = stage_estimate(&net, p4.first[v * K + s], p4.first[v * K + s + 1],
                                            mb, 1);
            state += (double)(sb.state + sb.groups + sb.workers + sb.slot);
        }
        cr_assert(iv[s] > state, "rank %d: %g bytes, less than its chunks' %g", s, iv[s], state);
    }
    schedule s4;
    cr_assert_eq(plan_schedule(&s4, "interleaved", K, 2, M, NULL), 0);
    expect_error(plan_memory(iv, &net, &p, &s4, &mc), "plan_memory", "2 chunks for 2 × 2");
    schedule_free(&s4);
    partition_free(&p4);
    partition_free(&p);
    net_desc_free(&net);
}
