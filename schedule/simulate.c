/* Simulator: prices a schedule by list scheduling. Each stage runs its list in order; an op
 * starts when the stage is free and, for a receive, when the matching send has finished.
 * Sends cost `comm_cost` on the sender and never wait for the receiver, like the executor's
 * buffered/non-blocking sends, so this is the same dependency rule the verifier proves
 * deadlock-free. Reductions run on each stage's own network resource, one after another,
 * beside the stage's compute (or, with reduce_in_waits, only from the REDUCE_WAIT that needs
 * them); only REDUCE_WAIT makes compute wait for them. */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cost_ok(double v)
{
    return isfinite(v) && v >= 0;
}

/* A stage's reduction link: its own figures where given (measured per group), else the
 * common ones. */
static double stage_alpha(const schedule_costs *c, int st)
{
    return c->alpha_stage ? c->alpha_stage[st] : c->alpha;
}

static double stage_beta(const schedule_costs *c, int st)
{
    return c->beta_stage ? c->beta_stage[st] : c->beta;
}

/* Cost arrays are per stage (V = 1) or per model chunk v·K + s (V > 1). */
static size_t cost_index(const schedule *s, int st, int chunk)
{
    return s->virtual_stages > 1 ? (size_t)chunk * (size_t)s->stages + (size_t)st : (size_t)st;
}

static int check_cost_array(const schedule *s, const double *a, const char *what)
{
    int n = s->stages * s->virtual_stages;
    for (int k = 0; a && k < n; k++)
        if (!cost_ok(a[k])) {
            if (s->virtual_stages > 1)
                return pt_error_set("schedule_simulate: %s cost of model chunk %d (stage %d "
                                    "chunk %d) is %g; costs must be finite and >= 0", what, k,
                                    k % s->stages, k / s->stages, a[k]);
            return pt_error_set("schedule_simulate: %s cost of stage %d is %g; costs must be "
                                "finite and >= 0", what, k, a[k]);
        }
    return 0;
}

static int check_costs(const schedule *s, const schedule_costs *c)
{
    if (check_cost_array(s, c->fwd, "forward") || check_cost_array(s, c->bwd, "backward") ||
        check_cost_array(s, c->bwd_input, "input-gradient backward") ||
        check_cost_array(s, c->bwd_weight, "weight-gradient backward") ||
        check_cost_array(s, c->recompute, "recompute"))
        return -1;
    if (!cost_ok(c->comm_cost) || !cost_ok(c->step_cost))
        return pt_error_set("schedule_simulate: comm_cost %g and step_cost %g must be finite "
                            "and >= 0", c->comm_cost, c->step_cost);
    if (c->replicas < 0)
        return pt_error_set("schedule_simulate: %d replicas; need >= 0", c->replicas);
    for (int st = 0; st < s->stages && c->replicas >= 2; st++) {
        if (s->lists[st].buckets == 0) continue; /* nothing to reduce there */
        double a = stage_alpha(c, st), b = stage_beta(c, st);
        if (!cost_ok(a) || !(b > 0))
            return pt_error_set("schedule_simulate: reductions among %d replicas need a "
                                "latency alpha >= 0 (got %g) and a bandwidth beta > 0 (got %g)"
                                " on stage %d", c->replicas, a, b, st);
    }
    for (int st = 0; st < s->stages; st++) {
        int B = s->lists[st].buckets;
        const double *bytes = c->bucket_bytes ? c->bucket_bytes[st] : NULL;
        const double *share = c->part_share ? c->part_share[st] : NULL;
        double sum = 0;
        for (int b = 0; b < B; b++) {
            if (bytes && !cost_ok(bytes[b]))
                return pt_error_set("schedule_simulate: stage %d bucket %d has %g bytes; "
                                    "sizes must be finite and >= 0", st, b, bytes[b]);
            if (share && !cost_ok(share[b]))
                return pt_error_set("schedule_simulate: stage %d backward part %d has share "
                                    "%g; shares must be finite and >= 0", st, b, share[b]);
            sum += share ? share[b] : 0;
        }
        if (share && B > 0 && fabs(sum - 1.0) > 1e-6)
            return pt_error_set("schedule_simulate: stage %d's backward part shares sum to "
                                "%.9g; they must sum to 1 (the parts are the whole backward)",
                                st, sum);
    }
    return 0;
}

double schedule_allreduce_time(double bytes, int replicas, double alpha, double beta)
{
    if (replicas < 2)
        return 0.0;
    double steps = 2.0 * (replicas - 1);
    return steps * alpha + steps / replicas * bytes / beta;
}

/* A part b of a backward costing `whole`. */
static double part_cost(double whole, const schedule_op *op, int st, int buckets,
                        const schedule_costs *c)
{
    if (op->bucket < 0)
        return whole;
    const double *share = c->part_share ? c->part_share[st] : NULL;
    return whole * (share ? share[op->bucket] : 1.0 / buckets);
}

/* Duration on stage st's compute of an op that neither receives nor waits. Unit costs are
 * 1/V per chunk op, so that a rank's work is the same whatever V. */
static double op_cost(const schedule *s, const schedule_op *op, int st, int buckets,
                      const schedule_costs *c)
{
    size_t k = cost_index(s, st, op->chunk);
    double unit = 1.0 / s->virtual_stages;
    double fwd = c->fwd ? c->fwd[k] : unit, bwd = c->bwd ? c->bwd[k] : unit;
    switch (op->kind) {
    case SCHED_OP_FORWARD:
        return fwd;
    case SCHED_OP_RECOMPUTE:
        return c->recompute ? c->recompute[k] : fwd;
    case SCHED_OP_BACKWARD:
        return part_cost(bwd, op, st, buckets, c);
    case SCHED_OP_BACKWARD_INPUT:
        return c->bwd_input ? c->bwd_input[k] : bwd / 2;
    case SCHED_OP_BACKWARD_WEIGHT:
        return part_cost(c->bwd_weight ? c->bwd_weight[k] : bwd / 2, op, st, buckets, c);
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_SEND_GRAD:
        return c->comm_cost;
    case SCHED_OP_OPTIMIZER_STEP:
        return c->step_cost;
    default: /* ALLREDUCE only starts the reduction */
        return 0.0;
    }
}

/* reduce_in_waits: stage st waits for bucket `bucket` from time `now`; the reductions it
 * has started and not yet run go on its network in the order started, from `now` (or their
 * start, or the previous one's end), until that bucket's is done. */
static void run_started(const schedule_costs *c, int st, int bucket, double now, size_t boff,
                        const int *order, const int *n_started, int *n_run,
                        const double *issued, const size_t *issue_idx, double *net_free,
                        double *reduced, schedule_sim *out)
{
    const double *bytes = c->bucket_bytes ? c->bucket_bytes[st] : NULL;
    while (n_run[st] < n_started[st]) {
        int b = order[boff + (size_t)n_run[st]++];
        double t0 = now > net_free[st] ? now : net_free[st];
        if (issued[boff + (size_t)b] > t0) t0 = issued[boff + (size_t)b];
        double dur = schedule_allreduce_time(bytes ? bytes[b] : 0.0, c->replicas,
                                             stage_alpha(c, st), stage_beta(c, st));
        size_t idx = issue_idx[boff + (size_t)b];
        out->net_start[idx] = t0;
        out->net_end[idx] = net_free[st] = t0 + dur;
        reduced[boff + (size_t)b] = t0 + dur;
        out->reduce[st] += dur;
        if (b == bucket) break;
    }
}

int schedule_simulate_costs(const schedule *s, const schedule_costs *costs,
                            schedule_sim *out)
{
    if (!out)
        return pt_error_set("schedule_simulate: out is NULL");
    memset(out, 0, sizeof *out);
    if (!costs)
        return pt_error_set("schedule_simulate: costs is NULL");
    /* An invalid schedule would give meaningless times or loop on a receive that never
     * completes: refuse it with the verifier's message (which names any deadlock). */
    if (schedule_verify(s, NULL))
        return -1;
    if (check_costs(s, costs))
        return -1;

    int K = s->stages, M = s->microbatches, V = s->virtual_stages;
    if (K < 1 || M < 1 || V < 1) /* verified already; restated so the compiler sees it */
        return pt_error_set("schedule_simulate: need stages and microbatches >= 1");
    size_t total = 0, buckets = 0;
    for (int st = 0; st < K; st++) {
        total += (size_t)s->lists[st].n_ops;
        buckets += (size_t)s->lists[st].buckets;
    }
    size_t n = total ? total : 1;
    out->offset = malloc((size_t)K * sizeof *out->offset);
    out->busy = calloc((size_t)K, sizeof *out->busy);
    out->reduce = calloc((size_t)K, sizeof *out->reduce);
    out->exposed = calloc((size_t)K, sizeof *out->exposed);
    out->start = malloc(n * sizeof *out->start);
    out->end = malloc(n * sizeof *out->end);
    out->net_start = malloc(n * sizeof *out->net_start);
    out->net_end = malloc(n * sizeof *out->net_end);
    int *pc = calloc((size_t)K, sizeof *pc);
    size_t *boff = malloc((size_t)K * sizeof *boff);
    double *free_at = calloc((size_t)K, sizeof *free_at);
    double *net_free = calloc((size_t)K, sizeof *net_free);
    double *reduced = malloc((buckets ? buckets : 1) * sizeof *reduced); /* bucket's end */
    /* reduce_in_waits: per bucket, when its ALLREDUCE ran and that op's index; per stage,
     * its buckets in the order started and how many of them have run */
    double *issued = malloc((buckets ? buckets : 1) * sizeof *issued);
    size_t *issue_idx = malloc((buckets ? buckets : 1) * sizeof *issue_idx);
    int *order = malloc((buckets ? buckets : 1) * sizeof *order);
    int *n_started = calloc((size_t)K, sizeof *n_started);
    int *n_run = calloc((size_t)K, sizeof *n_run);
    /* ready[((st * V + v) * 2 + g) * M + m]: when (stage st, chunk v) has micro-batch m's
     * activation (g = 0) or gradient (g = 1); −1 until the peer's send has run. */
    size_t n_ready = (size_t)K * (size_t)V * 2 * (size_t)M;
    double *ready = malloc(n_ready * sizeof *ready);
    int rc = -1;
    if (!out->offset || !out->busy || !out->reduce || !out->exposed || !out->start ||
        !out->end || !out->net_start || !out->net_end || !pc || !boff || !free_at ||
        !net_free || !reduced || !ready || !issued || !issue_idx || !order || !n_started ||
        !n_run) {
        pt_error_set("schedule_simulate: out of memory for %zu ops", total);
        goto done;
    }
    for (size_t i = 0; i < n_ready; i++)
        ready[i] = -1.0;
    size_t boffs = 0;
    for (int st = 0, off = 0; st < K; st++) {
        out->offset[st] = off;
        off += s->lists[st].n_ops;
        boff[st] = boffs;
        boffs += (size_t)s->lists[st].buckets;
    }

    size_t done_ops = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int st = 0; st < K; st++) {
            const schedule_list *l = &s->lists[st];
            while (pc[st] < l->n_ops) {
                const schedule_op *op = &l->ops[pc[st]];
                size_t idx = (size_t)out->offset[st] + (size_t)pc[st];
                double begin = free_at[st], len;
                out->net_start[idx] = out->net_end[idx] = -1.0;
                if (op->kind == SCHED_OP_RECV_ACT || op->kind == SCHED_OP_RECV_GRAD) {
                    int g = op->kind == SCHED_OP_RECV_GRAD;
                    double t = ready[(((size_t)st * V + (size_t)op->chunk) * 2 + (size_t)g) *
                                         (size_t)M + (size_t)op->microbatch];
                    if (t < 0)
                        break; /* the peer has not sent it yet */
                    if (t > begin)
                        begin = t;
                    len = 0.0;
                } else if (op->kind == SCHED_OP_REDUCE_WAIT) {
                    /* its ALLREDUCE came earlier in this list (verified) */
                    if (costs->reduce_in_waits)
                        run_started(costs, st, op->bucket, begin, boff[st], order, n_started,
                                    n_run, issued, issue_idx, net_free, reduced, out);
                    double t = reduced[boff[st] + op->bucket];
                    len = t > begin ? t - begin : 0.0;
                    out->exposed[st] += len;
                } else {
                    len = op_cost(s, op, st, l->buckets, costs);
                    out->busy[st] += len;
                }
                if (op->kind == SCHED_OP_ALLREDUCE && costs->reduce_in_waits) {
                    size_t b = boff[st] + (size_t)op->bucket;
                    order[boff[st] + (size_t)n_started[st]++] = op->bucket;
                    issued[b] = begin;
                    issue_idx[b] = idx;
                } else if (op->kind == SCHED_OP_ALLREDUCE) {
                    const double *bytes = costs->bucket_bytes ? costs->bucket_bytes[st] : NULL;
                    double t0 = begin > net_free[st] ? begin : net_free[st];
                    double dur = schedule_allreduce_time(bytes ? bytes[op->bucket] : 0.0,
                                                         costs->replicas,
                                                         stage_alpha(costs, st),
                                                         stage_beta(costs, st));
                    out->net_start[idx] = t0;
                    out->net_end[idx] = net_free[st] = t0 + dur;
                    reduced[boff[st] + op->bucket] = t0 + dur;
                    out->reduce[st] += dur;
                }
                out->start[idx] = begin;
                out->end[idx] = begin + len;
                free_at[st] = begin + len;
                if (op->kind == SCHED_OP_SEND_ACT || op->kind == SCHED_OP_SEND_GRAD) {
                    int g = op->kind == SCHED_OP_SEND_GRAD, ps = 0, pv = 0;
                    if (g)
                        schedule_prev_chunk(K, V, st, op->chunk, &ps, &pv);
                    else
                        schedule_next_chunk(K, V, st, op->chunk, &ps, &pv);
                    /* ps == op->peer: verified */
                    ready[(((size_t)op->peer * V + (size_t)pv) * 2 + (size_t)g) * (size_t)M +
                          (size_t)op->microbatch] = begin + len;
                }
                if (begin + len > out->makespan)
                    out->makespan = begin + len;
                pc[st]++;
                done_ops++;
                progress = 1;
            }
        }
    }
    if (done_ops != total) {
        /* Cannot happen after schedule_verify; kept so that a verifier bug cannot turn
         * into wrong numbers. */
        pt_error_set("schedule_simulate: schedule '%s' stalled after %zu of %zu ops", s->name,
                     done_ops, total);
        goto done;
    }
    double idle = 0.0, rel = 0.0;
    if (out->makespan > 0) {
        for (int st = 0; st < K; st++) {
            idle += (out->makespan - out->busy[st]) / out->makespan;
            if (out->busy[st] > 0)
                rel += (out->makespan - out->busy[st]) / out->busy[st];
        }
        out->bubble = idle / K;
        out->bubble_ideal = rel / K;
    }
    rc = 0;
done:
    free(pc);
    free(boff);
    free(free_at);
    free(net_free);
    free(reduced);
    free(issued);
    free(issue_idx);
    free(order);
    free(n_started);
    free(n_run);
    free(ready);
    if (rc)
        schedule_sim_free(out);
    return rc;
}

int schedule_simulate(const schedule *s, const double *fwd, const double *bwd,
                      double comm_cost, double step_cost, schedule_sim *out)
{
    schedule_costs c = {.fwd = fwd, .bwd = bwd, .comm_cost = comm_cost,
                        .step_cost = step_cost, .replicas = 1};
    return schedule_simulate_costs(s, &c, out);
}

void schedule_sim_free(schedule_sim *sim)
{
    if (!sim)
        return;
    free(sim->busy);
    free(sim->start);
    free(sim->end);
    free(sim->offset);
    free(sim->reduce);
    free(sim->exposed);
    free(sim->net_start);
    free(sim->net_end);
    memset(sim, 0, sizeof *sim);
}

double schedule_bubble_theory(int stages, int microbatches)
{
    if (stages < 1 || microbatches < 1)
        return 0.0;
    return (double)(stages - 1) / (double)(microbatches + stages - 1);
}

double schedule_bubble_formula(const schedule *s, const char **formula)
{
    const char *text = NULL;
    double v = -1;
    if (s && s->stages >= 1 && s->microbatches >= 1) {
        double K = s->stages, M = s->microbatches, V = s->virtual_stages;
        if (!strcmp(s->name, "gpipe") || !strcmp(s->name, "1f1b")) {
            text = "(K-1)/M";
            v = (K - 1) / M;
        } else if (!strcmp(s->name, "interleaved")) {
            text = "(K-1)/(V*M)";
            v = (K - 1) / (V * M);
        } else if (!strcmp(s->name, "zb-h1")) {
            text = "(K-1)/(3M)";
            v = (K - 1) / (3 * M);
        }
    }
    if (formula)
        *formula = text;
    return v;
}
