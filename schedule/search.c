/* The schedule search (schedule.h: schedule_search): the greedy list scheduler of
 * generate_v.c run with the stages' real costs over its policies, placements and memory
 * caps, and every hand-written schedule of the same chunks per rank, each verified and
 * priced by the simulator at those costs; the shortest step within the memory limit wins.
 *
 * Why both: the greedy order at real costs fills the idle time that uneven stages leave
 * (a heavy embedding or head) where the hand-written orders, built for equal stages, wait;
 * the hand-written ones are candidates too, so the search is never slower (simulated) than
 * any of them under the same limit. The work is capped (max_runs greedy orders) so that
 * `plan`, which searches once per layout, stays quick. */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const schedule_search_config *cfg;
    int C;                               /* K·V model chunks */
    double *fwd, *bin, *bw, *bwd;        /* per model chunk (one block of 4·C) */
    schedule best;
    double best_step, best_peak;
    schedule_search_result *res;
    double smallest;                     /* the least peak seen (micro-batches), any limit */
    char smallest_how[64];
} search_state;

/* The most micro-batches any rank holds (chunk activations / V); −1 if the verifier
 * refuses the schedule. */
static double peak_of(const schedule *s)
{
    schedule_report rep;
    if (schedule_verify(s, &rep)) return -1;
    int most = 0;
    for (int k = 0; k < s->stages; k++)
        if (rep.peak_inflight[k] > most) most = rep.peak_inflight[k];
    schedule_report_free(&rep);
    return (double)most / (s->virtual_stages > 0 ? s->virtual_stages : 1);
}

static double step_of(const search_state *w, const schedule *s)
{
    schedule_costs sc = {.fwd = w->fwd, .bwd = w->bwd, .bwd_input = w->bin,
                         .bwd_weight = w->bw, .comm_cost = w->cfg->comm, .replicas = 1};
    schedule_sim sim;
    if (schedule_simulate_costs(s, &sc, &sim)) return INFINITY;
    double t = sim.makespan;
    schedule_sim_free(&sim);
    return t;
}

/* Takes t (freeing it unless it becomes the best). */
static void consider(search_state *w, schedule *t, const char *how, int named)
{
    const int *rc = w->cfg->recompute;
    int any = 0;
    for (int k = 0; rc && k < t->stages; k++) any |= rc[k] != 0;
    if (any && schedule_add_recompute(t, rc)) {
        schedule_free(t);
        return;
    }
    double peak = peak_of(t);
    w->res->tried++;
    if (peak < 0) { /* never expected: the generators verify; keep the search going */
        schedule_free(t);
        return;
    }
    if (peak < w->smallest) {
        w->smallest = peak;
        snprintf(w->smallest_how, sizeof w->smallest_how, "%s", how);
    }
    double limit = w->cfg->memory;
    if (limit > 0 && peak > limit + 1e-9) {
        schedule_free(t);
        return;
    }
    w->res->kept++;
    double step = step_of(w, t);
    if (named && step < w->res->best_named) {
        w->res->best_named = step;
        snprintf(w->res->best_named_name, sizeof w->res->best_named_name, "%s", how);
    }
    /* strictly shorter, or as short with less memory: at a tie the earlier (hand-written)
     * candidate stays */
    double tol = 1e-9 * (w->best_step < INFINITY ? w->best_step : 1);
    if (step < w->best_step - tol || (step <= w->best_step + tol && peak < w->best_peak)) {
        schedule_free(&w->best);
        w->best = *t;
        w->best_step = step;
        w->best_peak = peak;
        snprintf(w->res->how, sizeof w->res->how, "%s", how);
        return;
    }
    schedule_free(t);
}

/* The hand-written schedules with the config's V chunks per rank. */
static void try_named(search_state *w)
{
    static const char *one[] = {"gpipe", "1f1b", "zb-h1", "zb-h2"};
    static const char *many[] = {"interleaved", "zb-v", "v-half", "v-min", "dualpipev"};
    const schedule_search_config *c = w->cfg;
    int V = c->virtual_stages;
    const char *const *names = V == 1 ? one : many;
    int n = V == 1 ? 4 : 5;
    for (int i = 0; i < n; i++) {
        if (V > 1 && strcmp(names[i], "interleaved") && V % 2) continue; /* a V: even V */
        if (!strcmp(names[i], "dualpipev") && V != 2) continue;
        schedule t;
        if (schedule_init_named(&t, names[i], c->stages, V, c->microbatches)) continue;
        consider(w, &t, names[i], 1);
    }
}

/* One greedy order: placement, policy, per-rank caps (NULL: none). */
static void try_greedy(search_state *w, int placement, int policy, const int *cap,
                       const char *shape, int cap_of)
{
    const schedule_search_config *c = w->cfg;
    schedule_greedy_config g = {.fwd = w->fwd, .bwd_input = w->bin, .bwd_weight = w->bw,
                                .comm = c->comm, .cap = cap, .policy = policy};
    schedule t;
    if (schedule_init_greedy(&t, "search", c->stages, c->virtual_stages, placement,
                             c->microbatches, &g))
        return;
    /* greedy-v / greedy-i: V or interleaved placement (V > 1); p: the policy flags; the
     * cap in chunk activations per rank */
    char how[64];
    const char *pl = c->virtual_stages == 1 ? "" : placement == SCHED_PLACE_V ? "-v" : "-i";
    snprintf(how, sizeof how, "greedy%s p%d %s%d", pl, policy, shape, cap_of);
    consider(w, &t, how, 0);
}

/* The caps tried, in chunk activations per rank: the largest the limit allows (or every
 * micro-batch's, M·V, without one), 1F1B's K·V where below it, and evenly spaced values
 * down to V (one micro-batch), at most n in all. */
static int cap_ladder(const schedule_search_config *c, int *caps, int n)
{
    int K = c->stages, V = c->virtual_stages, M = c->microbatches;
    int top = M * V;
    if (c->memory > 0 && floor(c->memory * V + 1e-9) < top) top = (int)floor(c->memory * V + 1e-9);
    if (top < V) return 0;
    int k = 0;
    caps[k++] = top;
    if (K * V < top && k < n) caps[k++] = K * V;
    for (int i = 1; k < n && i < n; i++) {
        int x = top - (int)((double)(top - V) * i / (n - 1) + 0.5);
        int dup = 0;
        for (int j = 0; j < k; j++) dup |= caps[j] == x;
        if (!dup && x >= V) caps[k++] = x;
    }
    return k;
}

static void try_greedy_all(search_state *w)
{
    const schedule_search_config *c = w->cfg;
    int K = c->stages, V = c->virtual_stages;
    int placements[2] = {SCHED_PLACE_INTERLEAVED, SCHED_PLACE_V}, np = 1;
    if (V > 1) {
        np = V % 2 ? 1 : 2;
        if (V % 2 == 0) placements[0] = SCHED_PLACE_V, placements[1] = SCHED_PLACE_INTERLEAVED;
    }
    int budget = c->max_runs > 0 ? c->max_runs : 128;
    /* each cap: both placements × every policy, uniform and 1F1B-shaped caps */
    int per_cap = 2 * np * SCHED_GREEDY_POLICIES;
    int ncap = budget / per_cap;
    if (ncap < 1) ncap = 1;
    if (ncap > 16) ncap = 16;
    int caps[16];
    int n = cap_ladder(c, caps, ncap);
    int *cap = malloc((size_t)K * sizeof *cap);
    if (!cap) return;
    int runs = 0;
    for (int i = 0; i < n; i++)
        for (int shape = 0; shape < 2; shape++) {
            /* 1F1B's shape: rank k holds at most (K − k)·V, within the cap */
            int differs = 0;
            for (int k = 0; k < K; k++) {
                int x = shape ? (K - k) * V : caps[i];
                if (x > caps[i]) x = caps[i];
                if (x < V) x = V;
                cap[k] = x;
                differs |= x != caps[i];
            }
            if (shape && !differs) continue;
            for (int p = 0; p < np; p++)
                for (int pol = 0; pol < SCHED_GREEDY_POLICIES; pol++) {
                    if (runs++ >= budget) goto done;
                    try_greedy(w, placements[p], pol, cap, shape ? "1f1b-cap" : "cap", caps[i]);
                }
        }
done:
    /* with a limit below one micro-batch no cap is allowed: the least memory any order
     * needs, for the message */
    if (n == 0) {
        for (int k = 0; k < K; k++) cap[k] = V;
        schedule t;
        schedule_greedy_config g = {.fwd = w->fwd, .bwd_input = w->bin, .bwd_weight = w->bw,
                                    .comm = c->comm, .cap = cap};
        if (!schedule_init_greedy(&t, "search", K, V, placements[0], c->microbatches, &g))
            consider(w, &t, "greedy cap 1 micro-batch", 0);
    }
    free(cap);
}

static int check_config(const schedule_search_config *c)
{
    if (c->stages < 1 || c->microbatches < 1)
        return pt_error_set("schedule search: need stages >= 1 and microbatches >= 1 (got %d, "
                            "%d)", c->stages, c->microbatches);
    if (c->virtual_stages < 1 || c->virtual_stages > 64)
        return pt_error_set("schedule search: %d chunks per rank (1 to 64)",
                            c->virtual_stages);
    if (!(c->memory >= 0) || !isfinite(c->memory))
        return pt_error_set("schedule search: memory limit %g micro-batches; must be >= 0",
                            c->memory);
    if (!(c->comm >= 0) || !isfinite(c->comm))
        return pt_error_set("schedule search: message cost %g; must be finite and >= 0",
                            c->comm);
    int C = c->stages * c->virtual_stages;
    const double *arrays[4] = {c->fwd, c->bwd_input, c->bwd_weight, c->bwd};
    for (int a = 0; a < 4; a++)
        for (int k = 0; arrays[a] && k < C; k++)
            if (!(arrays[a][k] > 0) || !isfinite(arrays[a][k]))
                return pt_error_set("schedule search: the %s cost of model chunk %d is %g; "
                                    "costs must be finite and > 0",
                                    a == 0 ? "F" : a == 1 ? "B" : a == 2 ? "W" : "whole backward",
                                    k, arrays[a][k]);
    return 0;
}

int schedule_search(schedule *s, const schedule_search_config *cfg,
                    schedule_search_result *res)
{
    if (s) memset(s, 0, sizeof *s);
    schedule_search_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    res->best_named = INFINITY;
    res->step = INFINITY;
    if (!cfg || check_config(cfg)) return cfg ? -1 : pt_error_set("schedule search: no config");
    int C = cfg->stages * cfg->virtual_stages;
    search_state w = {.cfg = cfg, .C = C, .best_step = INFINITY, .best_peak = INFINITY,
                      .res = res, .smallest = INFINITY};
    w.fwd = malloc(4 * (size_t)C * sizeof *w.fwd);
    if (!w.fwd) return pt_error_set("schedule search: out of memory");
    w.bin = w.fwd + C, w.bw = w.fwd + 2 * C, w.bwd = w.fwd + 3 * C;
    /* unit costs: F = b = w = 1/V per chunk op, a rank's work per micro-batch 3 */
    double unit = 1.0 / cfg->virtual_stages;
    for (int k = 0; k < C; k++) {
        w.fwd[k] = cfg->fwd ? cfg->fwd[k] : unit;
        w.bin[k] = cfg->bwd_input ? cfg->bwd_input[k] : unit;
        w.bw[k] = cfg->bwd_weight ? cfg->bwd_weight[k] : unit;
        w.bwd[k] = cfg->bwd ? cfg->bwd[k] : w.bin[k] + w.bw[k];
    }
    try_named(&w);
    try_greedy_all(&w);
    free(w.fwd);
    if (!w.best.lists) {
        if (w.smallest < INFINITY)
            return pt_error_set("schedule search: no schedule holds at most %g micro-batches per "
                                "rank (--schedule-memory); the smallest, %s, holds %g",
                                cfg->memory, w.smallest_how, w.smallest);
        return pt_error_set("schedule search: no schedule of %d stages, %d chunks per rank and "
                            "%d micro-batches was found", cfg->stages, cfg->virtual_stages,
                            cfg->microbatches);
    }
    *s = w.best;
    snprintf(s->name, sizeof s->name, "search");
    snprintf(s->origin, sizeof s->origin, "%s", res->how);
    res->step = w.best_step;
    res->peak = w.best_peak;
    return 0;
}
