/* Simulator: prices a schedule by list scheduling. Each stage runs its list in order; an op
 * starts when the stage is free and, for a receive, when the matching send has finished.
 * Sends cost `comm_cost` on the sender and never wait for the receiver, like the executor's
 * buffered/non-blocking sends, so this is the same dependency rule the verifier proves
 * deadlock-free. */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cost_ok(double v)
{
    return isfinite(v) && v >= 0;
}

static int check_costs(const schedule *s, const double *fwd, const double *bwd,
                       double comm_cost, double step_cost)
{
    for (int st = 0; st < s->stages; st++) {
        if (fwd && !cost_ok(fwd[st]))
            return pt_error_set("schedule_simulate: forward cost of stage %d is %g; costs "
                                "must be finite and >= 0", st, fwd[st]);
        if (bwd && !cost_ok(bwd[st]))
            return pt_error_set("schedule_simulate: backward cost of stage %d is %g; costs "
                                "must be finite and >= 0", st, bwd[st]);
    }
    if (!cost_ok(comm_cost) || !cost_ok(step_cost))
        return pt_error_set("schedule_simulate: comm_cost %g and step_cost %g must be finite "
                            "and >= 0", comm_cost, step_cost);
    return 0;
}

/* Duration of a non-receive op on stage st. */
static double op_cost(const schedule_op *op, int st, const double *fwd, const double *bwd,
                      double comm_cost, double step_cost)
{
    switch (op->kind) {
    case SCHED_OP_FORWARD:
    case SCHED_OP_RECOMPUTE:
        return fwd ? fwd[st] : 1.0;
    case SCHED_OP_BACKWARD:
        return bwd ? bwd[st] : 1.0;
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_SEND_GRAD:
    case SCHED_OP_ALLREDUCE:
        return comm_cost;
    case SCHED_OP_OPTIMIZER_STEP:
        return step_cost;
    default:
        return 0.0;
    }
}

int schedule_simulate(const schedule *s, const double *fwd, const double *bwd,
                      double comm_cost, double step_cost, schedule_sim *out)
{
    if (!out)
        return pt_error_set("schedule_simulate: out is NULL");
    memset(out, 0, sizeof *out);
    /* An invalid schedule would give meaningless times or loop on a receive that never
     * completes: refuse it with the verifier's message (which names any deadlock). */
    if (schedule_verify(s, NULL))
        return -1;
    if (check_costs(s, fwd, bwd, comm_cost, step_cost))
        return -1;

    int K = s->stages, M = s->microbatches;
    if (K < 1 || M < 1) /* verified already; restated so the compiler sees sizes are sane */
        return pt_error_set("schedule_simulate: need stages and microbatches >= 1");
    size_t total = 0;
    for (int st = 0; st < K; st++)
        total += (size_t)s->lists[st].n_ops;
    out->offset = malloc((size_t)K * sizeof *out->offset);
    out->busy = calloc((size_t)K, sizeof *out->busy);
    out->start = malloc((total ? total : 1) * sizeof *out->start);
    out->end = malloc((total ? total : 1) * sizeof *out->end);
    int *pc = calloc((size_t)K, sizeof *pc);
    double *free_at = calloc((size_t)K, sizeof *free_at);
    /* ready[(st * 2 + g) * M + m]: when stage st has micro-batch m's activation (g = 0) or
     * gradient (g = 1); −1 until the peer's send has run. */
    double *ready = malloc((size_t)K * 2 * (size_t)M * sizeof *ready);
    int rc = -1;
    if (!out->offset || !out->busy || !out->start || !out->end || !pc || !free_at || !ready) {
        pt_error_set("schedule_simulate: out of memory for %zu ops", total);
        goto done;
    }
    for (size_t i = 0; i < (size_t)K * 2 * (size_t)M; i++)
        ready[i] = -1.0;
    for (int st = 0, off = 0; st < K; st++) {
        out->offset[st] = off;
        off += s->lists[st].n_ops;
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
                if (op->kind == SCHED_OP_RECV_ACT || op->kind == SCHED_OP_RECV_GRAD) {
                    int g = op->kind == SCHED_OP_RECV_GRAD;
                    double t = ready[((size_t)st * 2 + (size_t)g) * (size_t)M +
                                     (size_t)op->microbatch];
                    if (t < 0)
                        break; /* the peer has not sent it yet */
                    if (t > begin)
                        begin = t;
                    len = 0.0;
                } else {
                    len = op_cost(op, st, fwd, bwd, comm_cost, step_cost);
                    out->busy[st] += len;
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
    free(free_at);
    free(ready);
    if (rc)
        schedule_sim_free(out);
    return rc;
}

void schedule_sim_free(schedule_sim *sim)
{
    if (!sim)
        return;
    free(sim->busy);
    free(sim->start);
    free(sim->end);
    free(sim->offset);
    memset(sim, 0, sizeof *sim);
}

double schedule_bubble_theory(int stages, int microbatches)
{
    if (stages < 1 || microbatches < 1)
        return 0.0;
    return (double)(stages - 1) / (double)(microbatches + stages - 1);
}
