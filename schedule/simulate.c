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

/* Cost arrays are per stage (V = 1) or per model chunk (V > 1: v·K + s when interleaved,
 * the V placement's own numbering otherwise; schedule_model_chunk). */
static size_t cost_index(const schedule *s, int st, int chunk)
{
    return s->virtual_stages > 1 ? (size_t)schedule_model_chunk(s, st, chunk) : (size_t)st;
}

static int check_cost_array(const schedule *s, const double *a, const char *what)
{
    int n = s->stages * s->virtual_stages;
    for (int k = 0; a && k < n; k++)
        if (!cost_ok(a[k])) {
            if (s->virtual_stages > 1) {
                int st, v;
                schedule_chunk_place(s->stages, s->virtual_stages, s->placement, k, &st, &v);
                return pt_error_set("schedule_simulate: %s cost of model chunk %d (stage %d "
                                    "chunk %d) is %g; costs must be finite and >= 0", what, k,
                                    st, v, a[k]);
            }
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
        /* a V placement's hand-over between two chunks of one rank is a local copy */
        return op->peer == st ? 0.0 : c->comm_cost;
    case SCHED_OP_OPTIMIZER_STEP:
        return c->step_cost;
    default: /* ALLREDUCE only starts the reduction */
        return 0.0;
    }
}

/* The simulation's scratch beside its results: per stage, the next op to run (pc), when its
 * compute and its network are next free, and where its buckets start in the per-bucket
 * arrays (boff); per bucket, when its reduction ends. */
typedef struct {
    const schedule *s;
    const schedule_costs *c;
    schedule_sim *out;
    size_t total;     /* ops in all lists */
    int *pc;
    size_t *boff;
    double *free_at, *net_free;
    double *reduced;  /* bucket's end */
    /* reduce_in_waits: per bucket, when its ALLREDUCE ran and that op's index; per stage,
     * its buckets in the order started and how many of them have run */
    double *issued;
    size_t *issue_idx;
    int *order;
    int *n_started, *n_run;
    /* ready[((st * V + v) * 2 + g) * M + m]: when (stage st, chunk v) has micro-batch m's
     * activation (g = 0) or gradient (g = 1); −1 until the peer's send has run. */
    double *ready;
    size_t n_ready;
} sim_state;

static double *ready_at(const sim_state *w, int st, int chunk, int g, int m)
{
    size_t V = (size_t)w->s->virtual_stages, M = (size_t)w->s->microbatches;
    return &w->ready[(((size_t)st * V + (size_t)chunk) * 2 + (size_t)g) * M + (size_t)m];
}

static int sim_alloc_out(schedule_sim *out, int K, size_t n)
{
    out->offset = malloc((size_t)K * sizeof *out->offset);
    out->busy = calloc((size_t)K, sizeof *out->busy);
    out->span = calloc((size_t)K, sizeof *out->span);
    out->reduce = calloc((size_t)K, sizeof *out->reduce);
    out->exposed = calloc((size_t)K, sizeof *out->exposed);
    out->start = malloc(n * sizeof *out->start);
    out->end = malloc(n * sizeof *out->end);
    out->net_start = malloc(n * sizeof *out->net_start);
    out->net_end = malloc(n * sizeof *out->net_end);
    return out->offset && out->busy && out->span && out->reduce && out->exposed && out->start && out->end &&
           out->net_start && out->net_end ? 0 : -1;
}

static void sim_free_scratch(sim_state *w)
{
    free(w->pc);
    free(w->boff);
    free(w->free_at);
    free(w->net_free);
    free(w->reduced);
    free(w->issued);
    free(w->issue_idx);
    free(w->order);
    free(w->n_started);
    free(w->n_run);
    free(w->ready);
}

/* Allocates the results and the scratch, and sets the op and bucket offsets and every
 * message to "not sent". On failure the caller frees both. */
static int sim_init(sim_state *w, const schedule *s, const schedule_costs *c,
                    schedule_sim *out)
{
    int K = s->stages;
    size_t buckets = 0;
    *w = (sim_state){.s = s, .c = c, .out = out};
    for (int st = 0; st < K; st++) {
        w->total += (size_t)s->lists[st].n_ops;
        buckets += (size_t)s->lists[st].buckets;
    }
    size_t nb = buckets ? buckets : 1;
    w->pc = calloc((size_t)K, sizeof *w->pc);
    w->boff = malloc((size_t)K * sizeof *w->boff);
    w->free_at = calloc((size_t)K, sizeof *w->free_at);
    w->net_free = calloc((size_t)K, sizeof *w->net_free);
    w->reduced = malloc(nb * sizeof *w->reduced);
    w->issued = malloc(nb * sizeof *w->issued);
    w->issue_idx = malloc(nb * sizeof *w->issue_idx);
    w->order = malloc(nb * sizeof *w->order);
    w->n_started = calloc((size_t)K, sizeof *w->n_started);
    w->n_run = calloc((size_t)K, sizeof *w->n_run);
    w->n_ready = (size_t)K * (size_t)s->virtual_stages * 2 * (size_t)s->microbatches;
    w->ready = malloc(w->n_ready * sizeof *w->ready);
    if (sim_alloc_out(out, K, w->total ? w->total : 1) || !w->pc || !w->boff ||
        !w->free_at || !w->net_free || !w->reduced || !w->ready || !w->issued ||
        !w->issue_idx || !w->order || !w->n_started || !w->n_run)
        return pt_error_set("schedule_simulate: out of memory for %zu ops", w->total);
    for (size_t i = 0; i < w->n_ready; i++)
        w->ready[i] = -1.0;
    size_t boffs = 0;
    for (int st = 0, off = 0; st < K; st++) {
        out->offset[st] = off;
        off += s->lists[st].n_ops;
        w->boff[st] = boffs;
        boffs += (size_t)s->lists[st].buckets;
    }
    return 0;
}

/* Bucket b of stage st (its ALLREDUCE is op idx) reduces on the stage's network from t0. */
static void run_reduction(sim_state *w, int st, int b, size_t idx, double t0)
{
    const schedule_costs *c = w->c;
    const double *bytes = c->bucket_bytes ? c->bucket_bytes[st] : NULL;
    double dur = schedule_allreduce_time(bytes ? bytes[b] : 0.0, c->replicas,
                                         stage_alpha(c, st), stage_beta(c, st));
    w->out->net_start[idx] = t0;
    w->out->net_end[idx] = w->net_free[st] = t0 + dur;
    w->reduced[w->boff[st] + (size_t)b] = t0 + dur;
    w->out->reduce[st] += dur;
}

/* reduce_in_waits: stage st waits for bucket `bucket` from time `now`; the reductions it
 * has started and not yet run go on its network in the order started, from `now` (or their
 * start, or the previous one's end), until that bucket's is done. */
static void run_started(sim_state *w, int st, int bucket, double now)
{
    size_t boff = w->boff[st];
    while (w->n_run[st] < w->n_started[st]) {
        int b = w->order[boff + (size_t)w->n_run[st]++];
        double t0 = now > w->net_free[st] ? now : w->net_free[st];
        if (w->issued[boff + (size_t)b] > t0) t0 = w->issued[boff + (size_t)b];
        run_reduction(w, st, b, w->issue_idx[boff + (size_t)b], t0);
        if (b == bucket) break;
    }
}

/* ALLREDUCE at `begin`: the reduction runs at once on the stage's network (once it is free),
 * or, with reduce_in_waits, is only recorded as started. */
static void start_reduction(sim_state *w, int st, const schedule_op *op, size_t idx,
                            double begin)
{
    if (w->c->reduce_in_waits) {
        size_t b = w->boff[st] + (size_t)op->bucket;
        w->order[w->boff[st] + (size_t)w->n_started[st]++] = op->bucket;
        w->issued[b] = begin;
        w->issue_idx[b] = idx;
        return;
    }
    double t0 = begin > w->net_free[st] ? begin : w->net_free[st];
    run_reduction(w, st, op->bucket, idx, t0);
}

/* When stage st's op can begin (from *begin, the stage's free time) and how long it holds
 * the stage's compute; 0 when it is a receive whose message has not been sent yet. */
static int op_timing(sim_state *w, int st, const schedule_op *op, double *begin, double *len)
{
    if (op->kind == SCHED_OP_RECV_ACT || op->kind == SCHED_OP_RECV_GRAD) {
        double t = *ready_at(w, st, op->chunk, op->kind == SCHED_OP_RECV_GRAD, op->microbatch);
        if (t < 0)
            return 0; /* the peer has not sent it yet */
        if (t > *begin)
            *begin = t;
        *len = 0.0;
    } else if (op->kind == SCHED_OP_REDUCE_WAIT) {
        /* its ALLREDUCE came earlier in this list (verified) */
        if (w->c->reduce_in_waits)
            run_started(w, st, op->bucket, *begin);
        double t = w->reduced[w->boff[st] + (size_t)op->bucket];
        *len = t > *begin ? t - *begin : 0.0;
        w->out->exposed[st] += *len;
    } else {
        *len = op_cost(w->s, op, st, w->s->lists[st].buckets, w->c);
        w->out->busy[st] += *len;
    }
    return 1;
}

/* Runs stage st's next op if it can run now; 0 when it waits for a message. */
static int sim_step(sim_state *w, int st)
{
    const schedule *s = w->s;
    schedule_sim *out = w->out;
    const schedule_op *op = &s->lists[st].ops[w->pc[st]];
    size_t idx = (size_t)out->offset[st] + (size_t)w->pc[st];
    double begin = w->free_at[st], len;
    out->net_start[idx] = out->net_end[idx] = -1.0;
    if (!op_timing(w, st, op, &begin, &len))
        return 0;
    if (op->kind == SCHED_OP_ALLREDUCE)
        start_reduction(w, st, op, idx, begin);
    out->start[idx] = begin;
    out->end[idx] = begin + len;
    w->free_at[st] = begin + len;
    if (op->kind == SCHED_OP_SEND_ACT || op->kind == SCHED_OP_SEND_GRAD) {
        int g = op->kind == SCHED_OP_SEND_GRAD, ps = 0, pv = 0;
        if (g)
            schedule_route_prev(s, st, op->chunk, &ps, &pv);
        else
            schedule_route_next(s, st, op->chunk, &ps, &pv);
        /* ps == op->peer: verified */
        *ready_at(w, op->peer, pv, g, op->microbatch) = begin + len;
    }
    if (begin + len > out->makespan)
        out->makespan = begin + len;
    w->pc[st]++;
    return 1;
}

/* List scheduling: every stage runs as far as it can, round after round, until no stage
 * moves. Returns the number of ops run. */
static size_t sim_run(sim_state *w)
{
    size_t done_ops = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int st = 0; st < w->s->stages; st++)
            while (w->pc[st] < w->s->lists[st].n_ops && sim_step(w, st)) {
                done_ops++;
                progress = 1;
            }
    }
    return done_ops;
}

static void sim_bubbles(const schedule *s, schedule_sim *out, int K)
{
    /* each stage's span: from its first compute op to its last op */
    for (int st = 0; st < K; st++) {
        const schedule_list *l = &s->lists[st];
        double first = -1, last = 0;
        for (int i = 0; i < l->n_ops; i++) {
            size_t idx = (size_t)out->offset[st] + (size_t)i;
            schedule_op_kind k = l->ops[i].kind;
            int compute = k == SCHED_OP_FORWARD || k == SCHED_OP_BACKWARD ||
                          k == SCHED_OP_BACKWARD_INPUT || k == SCHED_OP_BACKWARD_WEIGHT ||
                          k == SCHED_OP_RECOMPUTE;
            if (compute && first < 0) first = out->start[idx];
            if (out->end[idx] > last) last = out->end[idx];
        }
        out->span[st] = first >= 0 ? last - first : 0;
        double gap = out->span[st] - out->busy[st];
        if (gap > out->interior_idle) out->interior_idle = gap;
    }
    double idle = 0.0;
    if (out->makespan > 0) {
        for (int st = 0; st < K; st++)
            idle += (out->makespan - out->busy[st]) / out->makespan;
        out->bubble = idle / K;
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
    /* verified already; restated so the compiler sees it */
    if (s->stages < 1 || s->microbatches < 1 || s->virtual_stages < 1)
        return pt_error_set("schedule_simulate: need stages and microbatches >= 1");
    sim_state w;
    int rc = sim_init(&w, s, costs, out);
    if (rc == 0) {
        size_t done_ops = sim_run(&w);
        /* A stall cannot happen after schedule_verify; checked so that a verifier bug
         * cannot turn into wrong numbers. */
        if (done_ops != w.total)
            rc = pt_error_set("schedule_simulate: schedule '%s' stalled after %zu of %zu ops",
                              s->name, done_ops, w.total);
        else
            sim_bubbles(s, out, s->stages);
    }
    sim_free_scratch(&w);
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
    free(sim->span);
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

/* The published bubbles are stated relative to the ideal (busy) time: idle / busy = r.
 * As a share of the step, the unit of every figure printed, that is r / (1 + r), so
 * (K−1)/M becomes (K−1)/(M+K−1) and so on. */
double schedule_bubble_share(const char *name, int stages, int virtual_stages,
                             int microbatches, const char **formula)
{
    const char *text = NULL;
    double v = -1;
    if (name && stages >= 1 && microbatches >= 1 && virtual_stages >= 1) {
        double K = stages, M = microbatches, V = virtual_stages;
        if (!strcmp(name, "gpipe") || !strcmp(name, "1f1b")) {
            text = "(K-1)/(M+K-1)";
            v = (K - 1) / (M + K - 1);
        } else if (!strcmp(name, "interleaved")) {
            text = "(K-1)/(V*M+K-1)";
            v = (K - 1) / (V * M + K - 1);
        } else if (!strcmp(name, "zb-h1") && M >= K) {
            text = "(K-1)/(3M+K-1)";
            v = (K - 1) / (3 * M + K - 1);
        } else if (!strcmp(name, "zb-h2") && M >= 2 * K - 1) {
            /* no stage idles inside its span; the ranks still start one after another */
            text = "(K-1)/(3M+K-1), no idle inside a stage's span";
            v = (K - 1) / (3 * M + K - 1);
        } else if ((!strcmp(name, "dualpipev") && M >= 2 * K) ||
                   (!strcmp(name, "zb-v") && K == 4)) {
            /* F = b = w per chunk: 6M chunk ops per rank after the K − 1 forwards that
             * reach the last rank, the least a V can take */
            text = "(K-1)/(6M+K-1)";
            v = (K - 1) / (6 * M + K - 1);
        } else if (!strcmp(name, "zb-h1")) {
            /* fewer micro-batches than stages: a makespan of 2M + 2K − 1 for 3M of work */
            text = "(2K-M-1)/(2M+2K-1)";
            v = (2 * K - M - 1) / (2 * M + 2 * K - 1);
        }
    }
    if (formula)
        *formula = text;
    return v;
}

double schedule_bubble_formula(const schedule *s, const char **formula)
{
    if (!s) {
        if (formula)
            *formula = NULL;
        return -1;
    }
    return schedule_bubble_share(s->name, s->stages, s->virtual_stages, s->microbatches,
                                 formula);
}
