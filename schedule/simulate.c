/* Simulator: prices a schedule by list scheduling. Each stage runs its list in order; an op
 * starts when the stage is free and, for a receive, when the matching send has finished.
 * Sends cost `comm_cost` on the sender and never wait for the receiver, like the executor's
 * buffered/non-blocking sends, so this is the same dependency rule the verifier proves
 * deadlock-free. Reductions run on each stage's own network resource, one after another,
 * beside the stage's compute; only REDUCE_WAIT makes compute wait for them. */
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

static int check_costs(const schedule *s, const schedule_costs *c)
{
    for (int st = 0; st < s->stages; st++) {
        if (c->fwd && !cost_ok(c->fwd[st]))
            return pt_error_set("schedule_simulate: forward cost of stage %d is %g; costs "
                                "must be finite and >= 0", st, c->fwd[st]);
        if (c->bwd && !cost_ok(c->bwd[st]))
            return pt_error_set("schedule_simulate: backward cost of stage %d is %g; costs "
                                "must be finite and >= 0", st, c->bwd[st]);
    }
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

/* Duration on stage st's compute of an op that neither receives nor waits. */
static double op_cost(const schedule_op *op, int st, int buckets, const schedule_costs *c)
{
    switch (op->kind) {
    case SCHED_OP_FORWARD:
    case SCHED_OP_RECOMPUTE:
        return c->fwd ? c->fwd[st] : 1.0;
    case SCHED_OP_BACKWARD: {
        double whole = c->bwd ? c->bwd[st] : 1.0;
        if (op->bucket < 0)
            return whole;
        const double *share = c->part_share ? c->part_share[st] : NULL;
        return whole * (share ? share[op->bucket] : 1.0 / buckets);
    }
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_SEND_GRAD:
        return c->comm_cost;
    case SCHED_OP_OPTIMIZER_STEP:
        return c->step_cost;
    default: /* ALLREDUCE only starts the reduction */
        return 0.0;
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

    int K = s->stages, M = s->microbatches;
    if (K < 1 || M < 1) /* verified already; restated so the compiler sees sizes are sane */
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
    /* ready[(st * 2 + g) * M + m]: when stage st has micro-batch m's activation (g = 0) or
     * gradient (g = 1); −1 until the peer's send has run. */
    double *ready = malloc((size_t)K * 2 * (size_t)M * sizeof *ready);
    int rc = -1;
    if (!out->offset || !out->busy || !out->reduce || !out->exposed || !out->start ||
        !out->end || !out->net_start || !out->net_end || !pc || !boff || !free_at ||
        !net_free || !reduced || !ready) {
        pt_error_set("schedule_simulate: out of memory for %zu ops", total);
        goto done;
    }
    for (size_t i = 0; i < (size_t)K * 2 * (size_t)M; i++)
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
                    double t = ready[((size_t)st * 2 + (size_t)g) * (size_t)M +
                                     (size_t)op->microbatch];
                    if (t < 0)
                        break; /* the peer has not sent it yet */
                    if (t > begin)
                        begin = t;
                    len = 0.0;
                } else if (op->kind == SCHED_OP_REDUCE_WAIT) {
                    /* its ALLREDUCE came earlier in this list (verified) */
                    double t = reduced[boff[st] + op->bucket];
                    len = t > begin ? t - begin : 0.0;
                    out->exposed[st] += len;
                } else {
                    len = op_cost(op, st, l->buckets, costs);
                    out->busy[st] += len;
                }
                if (op->kind == SCHED_OP_ALLREDUCE) {
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
                    int g = op->kind == SCHED_OP_SEND_GRAD;
                    ready[((size_t)op->peer * 2 + (size_t)g) * (size_t)M +
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
    double idle = 0.0;
    if (out->makespan > 0) {
        for (int st = 0; st < K; st++)
            idle += (out->makespan - out->busy[st]) / out->makespan;
        out->bubble = idle / K;
    }
    rc = 0;
done:
    free(pc);
    free(boff);
    free(free_at);
    free(net_free);
    free(reduced);
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
