/* Verifier: proves a set of per-stage lists is a complete, well-formed optimizer step that
 * cannot deadlock, before the executor bets MPI ranks on it.
 *
 * Checks run from local to global, so that the first message names the simplest cause:
 *   1. each op on its own (kind, micro-batch, peer, nothing after OPTIMIZER_STEP, no
 *      duplicates), and every list has its OPTIMIZER_STEP;
 *   2. every send has its receive on the peer and vice versa;
 *   3. per stage and micro-batch: everything present and in dependency order;
 *   4. the lists run together to completion (receives block, sends never do).
 */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* pos[(stage * SCHED_OP_COUNT + kind) * M + m]: index of the op (kind, m) in the stage's
 * list, or −1. Only per-micro-batch kinds are stored; duplicates are rejected before. */
typedef struct {
    const schedule *s;
    int *pos;
    int *allreduce; /* per stage: index of its ALLREDUCE or −1 */
} verify_ctx;

static int *pos_at(const verify_ctx *c, int stage, schedule_op_kind kind, int m)
{
    size_t k = (size_t)stage * SCHED_OP_COUNT + (size_t)kind;
    return &c->pos[k * (size_t)c->s->microbatches + (size_t)m];
}

static int has_microbatch(schedule_op_kind kind)
{
    return kind != SCHED_OP_ALLREDUCE && kind != SCHED_OP_OPTIMIZER_STEP;
}

/* "send_act m=3 to stage 2", "F m=0", "optimizer_step": what the messages call an op. */
static void op_describe(const schedule_op *op, char *buf, size_t n)
{
    const char *name = schedule_op_name(op->kind);
    switch (op->kind) {
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_SEND_GRAD:
        snprintf(buf, n, "%s m=%d to stage %d", name, op->microbatch, op->peer);
        break;
    case SCHED_OP_RECV_ACT:
    case SCHED_OP_RECV_GRAD:
        snprintf(buf, n, "%s m=%d from stage %d", name, op->microbatch, op->peer);
        break;
    case SCHED_OP_FORWARD:
    case SCHED_OP_BACKWARD:
    case SCHED_OP_RECOMPUTE:
        snprintf(buf, n, "%s m=%d", name, op->microbatch);
        break;
    case SCHED_OP_ALLREDUCE:
    case SCHED_OP_OPTIMIZER_STEP:
        snprintf(buf, n, "%s", name);
        break;
    default:
        snprintf(buf, n, "unknown op kind %d", (int)op->kind);
        break;
    }
}

/* The one peer an op of this kind may name on `stage`: −1 for local ops, −2 when the stage
 * has no such neighbour (first stage receiving activations, last stage receiving grads). */
static int expected_peer(schedule_op_kind kind, int stage, int stages)
{
    switch (kind) {
    case SCHED_OP_RECV_ACT:
    case SCHED_OP_SEND_GRAD:
        return stage > 0 ? stage - 1 : -2;
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_RECV_GRAD:
        return stage < stages - 1 ? stage + 1 : -2;
    default:
        return -1;
    }
}

/* Pass 1: each op on its own, plus the position tables the later passes use. */
static int check_ops(verify_ctx *c)
{
    const schedule *s = c->s;
    char d[96];
    for (int st = 0; st < s->stages; st++) {
        const schedule_list *l = &s->lists[st];
        if (l->n_ops < 0 || (l->n_ops > 0 && !l->ops))
            return pt_error_set("schedule '%s' stage %d: list is corrupt (n_ops=%d, ops=%p)",
                                s->name, st, l->n_ops, (void *)l->ops);
        int step = -1;
        for (int i = 0; i < l->n_ops; i++) {
            const schedule_op *op = &l->ops[i];
            op_describe(op, d, sizeof d);
            if ((int)op->kind < 0 || op->kind >= SCHED_OP_COUNT)
                return pt_error_set("schedule '%s' stage %d op %d: unknown op kind %d",
                                    s->name, st, i, (int)op->kind);
            if (step >= 0)
                return pt_error_set("schedule '%s' stage %d op %d (%s): comes after the "
                                    "optimizer_step at op %d; the list must end with it",
                                    s->name, st, i, d, step);
            if (has_microbatch(op->kind)) {
                if (op->microbatch < 0 || op->microbatch >= s->microbatches)
                    return pt_error_set("schedule '%s' stage %d op %d (%s): micro-batch %d "
                                        "out of range [0, %d)", s->name, st, i, d,
                                        op->microbatch, s->microbatches);
            } else if (op->microbatch != -1) {
                return pt_error_set("schedule '%s' stage %d op %d (%s): micro-batch must be "
                                    "-1, got %d", s->name, st, i, d, op->microbatch);
            }
            int want = expected_peer(op->kind, st, s->stages);
            if (want == -2)
                return pt_error_set("schedule '%s' stage %d op %d (%s): the %s stage has no "
                                    "stage to %s", s->name, st, i, d,
                                    op->kind == SCHED_OP_RECV_ACT ||
                                            op->kind == SCHED_OP_SEND_GRAD
                                        ? "first"
                                        : "last",
                                    op->kind == SCHED_OP_RECV_ACT    ? "receive activations from"
                                    : op->kind == SCHED_OP_SEND_GRAD ? "send gradients to"
                                    : op->kind == SCHED_OP_SEND_ACT  ? "send activations to"
                                                                     : "receive gradients from");
            if (op->peer != want) {
                if (want == -1)
                    return pt_error_set("schedule '%s' stage %d op %d (%s): wrong peer %d, a "
                                        "local op must have peer -1", s->name, st, i, d,
                                        op->peer);
                return pt_error_set("schedule '%s' stage %d op %d (%s): wrong peer %d, "
                                    "expected stage %d (activations flow from s-1 to s, "
                                    "gradients from s+1 to s)", s->name, st, i, d, op->peer,
                                    want);
            }
            if (op->kind == SCHED_OP_OPTIMIZER_STEP) {
                step = i;
            } else if (op->kind == SCHED_OP_ALLREDUCE) {
                if (c->allreduce[st] >= 0)
                    return pt_error_set("schedule '%s' stage %d op %d: duplicate allreduce "
                                        "(first at op %d)", s->name, st, i, c->allreduce[st]);
                c->allreduce[st] = i;
            } else {
                int *p = pos_at(c, st, op->kind, op->microbatch);
                if (*p >= 0)
                    return pt_error_set("schedule '%s' stage %d op %d: duplicate %s (first "
                                        "at op %d)", s->name, st, i, d, *p);
                *p = i;
            }
        }
        if (step < 0)
            return pt_error_set("schedule '%s' stage %d: missing optimizer_step (the list of "
                                "%d ops must end with one)", s->name, st, l->n_ops);
    }
    return 0;
}

static schedule_op_kind matching_kind(schedule_op_kind kind)
{
    switch (kind) {
    case SCHED_OP_SEND_ACT: return SCHED_OP_RECV_ACT;
    case SCHED_OP_RECV_ACT: return SCHED_OP_SEND_ACT;
    case SCHED_OP_SEND_GRAD: return SCHED_OP_RECV_GRAD;
    case SCHED_OP_RECV_GRAD: return SCHED_OP_SEND_GRAD;
    default: return SCHED_OP_COUNT;
    }
}

/* Pass 2: every message has both ends. When the peer has an unmatched op of the matching
 * kind for another micro-batch, say so: that is the usual mistake (wrong micro-batch). */
static int check_matching(const verify_ctx *c)
{
    const schedule *s = c->s;
    char d[96], hint[160];
    for (int st = 0; st < s->stages; st++) {
        const schedule_list *l = &s->lists[st];
        for (int i = 0; i < l->n_ops; i++) {
            const schedule_op *op = &l->ops[i];
            schedule_op_kind other = matching_kind(op->kind);
            if (other == SCHED_OP_COUNT)
                continue;
            int peer = op->peer; /* valid: checked in pass 1 */
            if (*pos_at(c, peer, other, op->microbatch) >= 0)
                continue;
            hint[0] = '\0';
            for (int m = 0; m < s->microbatches; m++) {
                int j = *pos_at(c, peer, other, m);
                if (j >= 0 && *pos_at(c, st, op->kind, m) < 0) {
                    snprintf(hint, sizeof hint, "; stage %d has an unmatched %s m=%d at op %d "
                             "(wrong micro-batch?)", peer, schedule_op_name(other), m, j);
                    break;
                }
            }
            op_describe(op, d, sizeof d);
            int is_send = op->kind == SCHED_OP_SEND_ACT || op->kind == SCHED_OP_SEND_GRAD;
            return pt_error_set("schedule '%s' stage %d op %d (%s): %s, no matching %s m=%d "
                                "on stage %d%s", s->name, st, i, d,
                                is_send ? "send without receive" : "receive without send",
                                schedule_op_name(other), op->microbatch, peer, hint);
        }
    }
    return 0;
}

/* Pass 3: per stage and micro-batch, each op present exactly once and in dependency order. */
static int check_order(const verify_ctx *c)
{
    const schedule *s = c->s;
    const char *n = s->name;
    int last = s->stages - 1;
    for (int st = 0; st < s->stages; st++) {
        int end = s->lists[st].n_ops;
        for (int m = 0; m < s->microbatches; m++) {
            int f = *pos_at(c, st, SCHED_OP_FORWARD, m);
            int b = *pos_at(c, st, SCHED_OP_BACKWARD, m);
            int ra = *pos_at(c, st, SCHED_OP_RECV_ACT, m);
            int sa = *pos_at(c, st, SCHED_OP_SEND_ACT, m);
            int rg = *pos_at(c, st, SCHED_OP_RECV_GRAD, m);
            int sg = *pos_at(c, st, SCHED_OP_SEND_GRAD, m);
            int r = *pos_at(c, st, SCHED_OP_RECOMPUTE, m);
            if (f < 0)
                return pt_error_set("schedule '%s' stage %d: micro-batch %d is never "
                                    "forwarded (no F m=%d in %d ops)", n, st, m, m, end);
            if (b < 0)
                return pt_error_set("schedule '%s' stage %d: micro-batch %d is never "
                                    "backwarded (no B m=%d in %d ops)", n, st, m, m, end);
            if (b < f)
                return pt_error_set("schedule '%s' stage %d op %d: backward before forward "
                                    "(B m=%d comes before F m=%d at op %d)", n, st, b, m, m,
                                    f);
            if (st > 0 && ra < 0)
                return pt_error_set("schedule '%s' stage %d op %d: F m=%d has no recv_act "
                                    "m=%d", n, st, f, m, m);
            if (st > 0 && ra > f)
                return pt_error_set("schedule '%s' stage %d op %d: recv_act m=%d comes after "
                                    "the F m=%d that needs it (op %d)", n, st, ra, m, m, f);
            if (st < last && sa < 0)
                return pt_error_set("schedule '%s' stage %d op %d: output of F m=%d is never "
                                    "sent (no send_act m=%d)", n, st, f, m, m);
            if (st < last && sa < f)
                return pt_error_set("schedule '%s' stage %d op %d: send_act m=%d comes before "
                                    "the F m=%d that produces it (op %d)", n, st, sa, m, m, f);
            if (st < last && rg < 0)
                return pt_error_set("schedule '%s' stage %d op %d: B m=%d has no recv_grad "
                                    "m=%d", n, st, b, m, m);
            if (st < last && rg > b)
                return pt_error_set("schedule '%s' stage %d op %d: recv_grad m=%d comes "
                                    "after the B m=%d that needs it (op %d)", n, st, rg, m, m,
                                    b);
            if (st > 0 && sg < 0)
                return pt_error_set("schedule '%s' stage %d op %d: input gradient of B m=%d "
                                    "is never sent (no send_grad m=%d)", n, st, b, m, m);
            if (st > 0 && sg < b)
                return pt_error_set("schedule '%s' stage %d op %d: send_grad m=%d comes "
                                    "before the B m=%d that produces it (op %d)", n, st, sg,
                                    m, m, b);
            if (r >= 0 && (r < f || r > b))
                return pt_error_set("schedule '%s' stage %d op %d: R m=%d must lie between "
                                    "F m=%d (op %d) and B m=%d (op %d)", n, st, r, m, m, f, m,
                                    b);
            int ar = c->allreduce[st];
            if (ar >= 0 && ar < b)
                return pt_error_set("schedule '%s' stage %d op %d: allreduce comes before "
                                    "B m=%d (op %d); gradients are complete only after the "
                                    "last backward", n, st, ar, m, b);
        }
    }
    return 0;
}

/* Pass 4: run all lists with a program counter each. A receive may pass once the peer's
 * matching send has executed (its program counter is past it); sends never wait. */
static int check_deadlock(const verify_ctx *c)
{
    const schedule *s = c->s;
    int *pc = calloc((size_t)s->stages, sizeof *pc);
    if (!pc)
        return pt_error_set("schedule_verify: out of memory");
    for (int progress = 1; progress;) {
        progress = 0;
        for (int st = 0; st < s->stages; st++) {
            const schedule_list *l = &s->lists[st];
            while (pc[st] < l->n_ops) {
                const schedule_op *op = &l->ops[pc[st]];
                schedule_op_kind other = matching_kind(op->kind);
                int is_recv = op->kind == SCHED_OP_RECV_ACT || op->kind == SCHED_OP_RECV_GRAD;
                if (is_recv && pc[op->peer] <= *pos_at(c, op->peer, other, op->microbatch))
                    break;
                pc[st]++;
                progress = 1;
            }
        }
    }
    char msg[900], d[96];
    size_t len = 0;
    int stuck = 0;
    for (int st = 0; st < s->stages; st++) {
        if (pc[st] >= s->lists[st].n_ops)
            continue;
        op_describe(&s->lists[st].ops[pc[st]], d, sizeof d);
        if (len < sizeof msg)
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%sstage %d waits at op %d "
                                    "(%s)", stuck ? "; " : "", st, pc[st], d);
        stuck++;
    }
    free(pc);
    if (stuck)
        return pt_error_set("schedule '%s': deadlock, %d stage(s) stuck: %s", s->name, stuck,
                            msg);
    return 0;
}

static int compute_peaks(const schedule *s, schedule_report *r)
{
    r->peak_inflight = calloc((size_t)s->stages, sizeof *r->peak_inflight);
    if (!r->peak_inflight)
        return pt_error_set("schedule_verify: out of memory");
    r->stages = s->stages;
    for (int st = 0; st < s->stages; st++) {
        int held = 0, peak = 0;
        for (int i = 0; i < s->lists[st].n_ops; i++) {
            schedule_op_kind k = s->lists[st].ops[i].kind;
            held += (k == SCHED_OP_FORWARD) - (k == SCHED_OP_BACKWARD);
            if (held > peak)
                peak = held;
        }
        r->peak_inflight[st] = peak;
    }
    return 0;
}

int schedule_verify(const schedule *s, schedule_report *report)
{
    if (report)
        memset(report, 0, sizeof *report);
    if (!s || !s->lists)
        return pt_error_set("schedule_verify: schedule is not initialised");
    if (s->stages < 1 || s->microbatches < 1)
        return pt_error_set("schedule '%s': need stages >= 1 and microbatches >= 1 (got %d, "
                            "%d)", s->name, s->stages, s->microbatches);
    size_t rows = (size_t)s->stages * SCHED_OP_COUNT;
    if ((size_t)s->microbatches > SIZE_MAX / sizeof(int) / rows)
        return pt_error_set("schedule '%s': %d stages x %d micro-batches is too large",
                            s->name, s->stages, s->microbatches);
    size_t cells = rows * (size_t)s->microbatches;
    verify_ctx c = {.s = s,
                    .pos = malloc(cells * sizeof *c.pos),
                    .allreduce = malloc((size_t)s->stages * sizeof *c.allreduce)};
    int rc = -1;
    if (!c.pos || !c.allreduce) {
        pt_error_set("schedule_verify: out of memory for %zu positions", cells);
        goto done;
    }
    for (size_t i = 0; i < cells; i++)
        c.pos[i] = -1;
    for (int st = 0; st < s->stages; st++)
        c.allreduce[st] = -1;
    if (check_ops(&c) || check_matching(&c) || check_order(&c) || check_deadlock(&c))
        goto done;
    if (report && compute_peaks(s, report))
        goto done;
    rc = 0;
done:
    free(c.pos);
    free(c.allreduce);
    return rc;
}

void schedule_report_free(schedule_report *r)
{
    if (!r)
        return;
    free(r->peak_inflight);
    r->peak_inflight = NULL;
    r->stages = 0;
}
