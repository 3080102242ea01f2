/* Verifier: proves a set of per-stage lists is a complete, well-formed optimizer step that
 * cannot deadlock, before the executor bets MPI ranks on it.
 *
 * Checks run from local to global, so that the first message names the simplest cause:
 *   1. each op on its own (kind, micro-batch, peer, bucket, nothing after OPTIMIZER_STEP,
 *      no duplicates, backward parts in order), and every list has its OPTIMIZER_STEP;
 *   2. every send has its receive on the peer and vice versa;
 *   3. per stage and micro-batch: everything present and in dependency order; per stage
 *      and bucket: reduced once, after its last gradient contribution, waited for;
 *   4. the lists run together to completion (receives block, sends never do).
 * schedule_verify_replicas runs them on each replica's schedule, then compares the order in
 * which the replicas of a stage start their collectives.
 */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* pos[(stage * SCHED_OP_COUNT + kind) * M + m]: index of the op (kind, m) in the stage's
 * list, or −1. Only per-micro-batch kinds are stored; duplicates are rejected before. For
 * BACKWARD it is m's first backward op (the whole one or part 0). */
typedef struct {
    const schedule *s;
    int *pos;
    int *bwd_last;  /* [stage * M + m]: m's last backward op (whole, or its last part) */
    int *bwd_parts; /* [stage * M + m]: parts of m seen; −1 once m is backwarded whole */
    size_t *boff;   /* [stage]: the stage's first bucket in ar/wait; boff[K]: all buckets */
    int *ar, *wait; /* [boff[stage] + b]: index of ALLREDUCE b / REDUCE_WAIT b, or −1 */
} verify_ctx;

static int *pos_at(const verify_ctx *c, int stage, schedule_op_kind kind, int m)
{
    size_t k = (size_t)stage * SCHED_OP_COUNT + (size_t)kind;
    return &c->pos[k * (size_t)c->s->microbatches + (size_t)m];
}

static int has_microbatch(schedule_op_kind kind)
{
    return kind != SCHED_OP_ALLREDUCE && kind != SCHED_OP_REDUCE_WAIT &&
           kind != SCHED_OP_OPTIMIZER_STEP;
}

static int is_reduction(schedule_op_kind kind)
{
    return kind == SCHED_OP_ALLREDUCE || kind == SCHED_OP_REDUCE_WAIT;
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
    case SCHED_OP_BACKWARD:
        if (op->bucket != -1) {
            snprintf(buf, n, "%s m=%d part %d", name, op->microbatch, op->bucket);
            break;
        }
        /* fall through */
    case SCHED_OP_FORWARD:
    case SCHED_OP_RECOMPUTE:
        snprintf(buf, n, "%s m=%d", name, op->microbatch);
        break;
    case SCHED_OP_ALLREDUCE:
    case SCHED_OP_REDUCE_WAIT:
        snprintf(buf, n, "%s bucket %d", name, op->bucket);
        break;
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

/* The bucket field of one op: a bucket of the stage for reductions, −1 or a bucket for a
 * backward (a part), −1 for everything else. */
static int check_bucket(const verify_ctx *c, int st, int i, const schedule_op *op,
                        const char *d)
{
    const schedule *s = c->s;
    int B = s->lists[st].buckets;
    int may_split = op->kind == SCHED_OP_BACKWARD;
    if (!is_reduction(op->kind) && !may_split) {
        if (op->bucket != -1)
            return pt_error_set("schedule '%s' stage %d op %d (%s): bucket must be -1, got "
                                "%d", s->name, st, i, d, op->bucket);
        return 0;
    }
    if (may_split && op->bucket == -1)
        return 0;
    if (B == 0)
        return pt_error_set("schedule '%s' stage %d op %d (%s): the stage has no buckets "
                            "(its list's buckets is 0), so no %s", s->name, st, i, d,
                            may_split ? "backward parts" : "reductions");
    if (op->bucket < 0 || op->bucket >= B)
        return pt_error_set("schedule '%s' stage %d op %d (%s): bucket %d out of range "
                            "[0, %d)", s->name, st, i, d, op->bucket, B);
    return 0;
}

/* A backward of m, whole or part b: the only backward of m, or the next of its parts. */
static int note_backward(verify_ctx *c, int st, int i, const schedule_op *op, const char *d)
{
    const schedule *s = c->s;
    size_t k = (size_t)st * (size_t)s->microbatches + (size_t)op->microbatch;
    int *first = pos_at(c, st, SCHED_OP_BACKWARD, op->microbatch);
    int parts = c->bwd_parts[k];
    if (op->bucket == -1 && *first >= 0)
        return pt_error_set("schedule '%s' stage %d op %d: duplicate %s (first at op %d)",
                            s->name, st, i, d, *first);
    if (op->bucket != -1 && parts < 0)
        return pt_error_set("schedule '%s' stage %d op %d (%s): micro-batch %d was "
                            "backwarded whole at op %d; a backward is either whole or split "
                            "into parts 0..%d", s->name, st, i, d, op->microbatch, *first,
                            s->lists[st].buckets - 1);
    if (op->bucket != -1 && op->bucket < parts)
        return pt_error_set("schedule '%s' stage %d op %d: duplicate %s", s->name, st, i, d);
    if (op->bucket != -1 && op->bucket > parts)
        return pt_error_set("schedule '%s' stage %d op %d (%s): part %d is due first; the "
                            "parts of a backward run in order 0..%d (bucket 0 holds the "
                            "stage's last layers)", s->name, st, i, d, parts,
                            s->lists[st].buckets - 1);
    if (*first < 0)
        *first = i;
    c->bwd_last[k] = i;
    c->bwd_parts[k] = op->bucket == -1 ? -1 : parts + 1;
    return 0;
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
            if (step >= 0 && op->kind == SCHED_OP_REDUCE_WAIT)
                return pt_error_set("schedule '%s' stage %d op %d (%s): comes after the "
                                    "optimizer_step at op %d, which needs every bucket "
                                    "reduced", s->name, st, i, d, step);
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
            if (check_bucket(c, st, i, op, d))
                return -1;
            if (op->kind == SCHED_OP_OPTIMIZER_STEP) {
                step = i;
            } else if (is_reduction(op->kind)) {
                int *p = &(op->kind == SCHED_OP_ALLREDUCE ? c->ar : c->wait)[c->boff[st] +
                                                                            op->bucket];
                if (*p >= 0)
                    return pt_error_set("schedule '%s' stage %d op %d: duplicate %s (first "
                                        "at op %d); a bucket is reduced exactly once",
                                        s->name, st, i, d, *p);
                *p = i;
            } else if (op->kind == SCHED_OP_BACKWARD) {
                if (note_backward(c, st, i, op, d))
                    return -1;
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

/* Per bucket of stage st: one ALLREDUCE after every gradient contribution to the bucket
 * (each micro-batch's whole backward, or its part b), one REDUCE_WAIT after it (pass 1
 * saw that nothing follows the step). */
static int check_reductions(const verify_ctx *c, int st)
{
    const schedule *s = c->s;
    const schedule_list *l = &s->lists[st];
    int B = l->buckets;
    if (B == 0)
        return 0;
    int *contrib = malloc((size_t)B * sizeof *contrib);
    if (!contrib)
        return pt_error_set("schedule_verify: out of memory");
    int whole = -1;
    for (int b = 0; b < B; b++)
        contrib[b] = -1;
    for (int i = 0; i < l->n_ops; i++)
        if (l->ops[i].kind == SCHED_OP_BACKWARD) {
            if (l->ops[i].bucket == -1)
                whole = i;
            else
                contrib[l->ops[i].bucket] = i;
        }
    int rc = 0;
    char d[96];
    for (int b = 0; b < B && !rc; b++) {
        int ar = c->ar[c->boff[st] + b], w = c->wait[c->boff[st] + b];
        int last = contrib[b] > whole ? contrib[b] : whole;
        if (ar < 0) {
            rc = pt_error_set("schedule '%s' stage %d: bucket %d of %d is never reduced (no "
                              "allreduce bucket %d in %d ops)", s->name, st, b, B, b,
                              l->n_ops);
        } else if (w < 0) {
            rc = pt_error_set("schedule '%s' stage %d: the reduction of bucket %d (op %d) is "
                              "never waited for (no reduce_wait bucket %d before the "
                              "optimizer_step)", s->name, st, b, ar, b);
        } else if (w < ar) {
            rc = pt_error_set("schedule '%s' stage %d op %d: reduce_wait bucket %d comes "
                              "before its allreduce (op %d)", s->name, st, w, b, ar);
        } else if (ar < last) {
            op_describe(&l->ops[last], d, sizeof d);
            rc = pt_error_set("schedule '%s' stage %d op %d: allreduce bucket %d comes "
                              "before %s (op %d), which adds to its gradients; a bucket is "
                              "reduced after its last contribution", s->name, st, ar, b, d,
                              last);
        }
    }
    free(contrib);
    return rc;
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
            int bl = c->bwd_last[(size_t)st * (size_t)s->microbatches + (size_t)m];
            int parts = c->bwd_parts[(size_t)st * (size_t)s->microbatches + (size_t)m];
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
            if (parts > 0 && parts < s->lists[st].buckets)
                return pt_error_set("schedule '%s' stage %d op %d: the backward of m=%d is "
                                    "split but stops after part %d (no B m=%d part %d of "
                                    "%d)", n, st, bl, m, parts - 1, m, parts,
                                    s->lists[st].buckets);
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
                                    "is never sent (no send_grad m=%d)", n, st, bl, m, m);
            if (st > 0 && sg < bl)
                return pt_error_set("schedule '%s' stage %d op %d: send_grad m=%d comes "
                                    "before the %sB m=%d that produces it (op %d)", n, st,
                                    sg, m, bl == b ? "" : "last part of ", m, bl);
            if (r >= 0 && (r < f || r > b))
                return pt_error_set("schedule '%s' stage %d op %d: R m=%d must lie between "
                                    "F m=%d (op %d) and B m=%d (op %d)", n, st, r, m, m, f, m,
                                    b);
        }
        if (check_reductions(c, st))
            return -1;
    }
    return 0;
}

/* Pass 4: run all lists with a program counter each. A receive may pass once the peer's
 * matching send has executed (its program counter is past it); sends never wait. Neither
 * do ALLREDUCE (a non-blocking start) and REDUCE_WAIT: the other replicas of the stage run
 * this same list, so they start the bucket as this one did (pass 3: before the wait). */
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
        const schedule_list *l = &s->lists[st];
        for (int i = 0; i < l->n_ops; i++) {
            const schedule_op *op = &l->ops[i];
            /* a split backward releases the micro-batch after its last part */
            int released = op->kind == SCHED_OP_BACKWARD &&
                           (op->bucket == -1 || op->bucket == l->buckets - 1);
            held += (op->kind == SCHED_OP_FORWARD) - released;
            if (held > peak)
                peak = held;
        }
        r->peak_inflight[st] = peak;
    }
    return 0;
}

static void ctx_free(verify_ctx *c)
{
    free(c->pos);
    free(c->bwd_last);
    free(c->bwd_parts);
    free(c->boff);
    free(c->ar);
    free(c->wait);
    memset(c, 0, sizeof *c);
}

/* Tables for s, then passes 1–3. */
static int ctx_check(verify_ctx *c, const schedule *s)
{
    memset(c, 0, sizeof *c);
    c->s = s;
    if (!s || !s->lists)
        return pt_error_set("schedule_verify: schedule is not initialised");
    if (s->stages < 1 || s->microbatches < 1)
        return pt_error_set("schedule '%s': need stages >= 1 and microbatches >= 1 (got %d, "
                            "%d)", s->name, s->stages, s->microbatches);
    size_t rows = (size_t)s->stages * SCHED_OP_COUNT;
    if ((size_t)s->microbatches > SIZE_MAX / sizeof(int) / rows)
        return pt_error_set("schedule '%s': %d stages x %d micro-batches is too large",
                            s->name, s->stages, s->microbatches);
    /* A stage needs two ops per bucket, so more buckets than ops cannot be right; checking
     * here keeps a corrupt count from sizing the tables. */
    size_t buckets = 0;
    for (int st = 0; st < s->stages; st++) {
        const schedule_list *l = &s->lists[st];
        if (l->n_ops < 0 || (l->n_ops > 0 && !l->ops))
            return pt_error_set("schedule '%s' stage %d: list is corrupt (n_ops=%d, ops=%p)",
                                s->name, st, l->n_ops, (void *)l->ops);
        if (l->buckets < 0 || l->buckets > l->n_ops)
            return pt_error_set("schedule '%s' stage %d: %d buckets for a list of %d ops (it "
                                "needs an allreduce and a reduce_wait per bucket)", s->name,
                                st, l->buckets, l->n_ops);
        buckets += (size_t)l->buckets;
    }
    size_t cells = rows * (size_t)s->microbatches;
    size_t per_mb = (size_t)s->stages * (size_t)s->microbatches;
    c->pos = malloc(cells * sizeof *c->pos);
    c->bwd_last = malloc(per_mb * sizeof *c->bwd_last);
    c->bwd_parts = calloc(per_mb, sizeof *c->bwd_parts);
    c->boff = malloc(((size_t)s->stages + 1) * sizeof *c->boff);
    c->ar = malloc((buckets ? buckets : 1) * sizeof *c->ar);
    c->wait = malloc((buckets ? buckets : 1) * sizeof *c->wait);
    if (!c->pos || !c->bwd_last || !c->bwd_parts || !c->boff || !c->ar || !c->wait)
        return pt_error_set("schedule_verify: out of memory for %zu positions", cells);
    for (size_t i = 0; i < cells; i++)
        c->pos[i] = -1;
    for (size_t i = 0; i < per_mb; i++)
        c->bwd_last[i] = -1;
    for (size_t i = 0; i < buckets; i++)
        c->ar[i] = c->wait[i] = -1;
    c->boff[0] = 0;
    for (int st = 0; st < s->stages; st++)
        c->boff[st + 1] = c->boff[st] + (size_t)s->lists[st].buckets;
    if (check_ops(c) || check_matching(c) || check_order(c))
        return -1;
    return 0;
}

int schedule_verify(const schedule *s, schedule_report *report)
{
    if (report)
        memset(report, 0, sizeof *report);
    verify_ctx c;
    int rc = -1;
    if (ctx_check(&c, s) || check_deadlock(&c))
        goto done;
    if (report && compute_peaks(s, report))
        goto done;
    rc = 0;
done:
    ctx_free(&c);
    return rc;
}

/* Replica r's failure, with the verifier's message behind it. */
static int replica_error(int r)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", pt_error_get());
    return pt_error_set("replica %d: %s", r, why);
}

/* Per stage, the replicas start the same buckets in the same order as replica 0. */
static int check_collective_order(const verify_ctx *cs, int replicas)
{
    const schedule *s0 = cs[0].s;
    for (int r = 1; r < replicas; r++) {
        const schedule *s = cs[r].s;
        for (int st = 0; st < s0->stages; st++) {
            const schedule_list *l0 = &s0->lists[st], *l = &s->lists[st];
            if (l->buckets != l0->buckets)
                return pt_error_set("replica %d stage %d: %d buckets, replica 0 has %d; the "
                                    "replicas of a stage must reduce the same buckets", r,
                                    st, l->buckets, l0->buckets);
            int i0 = 0, i = 0;
            for (int k = 0; k < l0->buckets; k++) {
                while (l0->ops[i0].kind != SCHED_OP_ALLREDUCE) /* verified: B of each */
                    i0++;
                while (l->ops[i].kind != SCHED_OP_ALLREDUCE)
                    i++;
                if (l->ops[i].bucket != l0->ops[i0].bucket)
                    return pt_error_set("replica %d stage %d op %d: starts the reduction of "
                                        "bucket %d where replica 0 starts bucket %d (op %d, "
                                        "its collective number %d); the replicas of a stage "
                                        "must start their collectives in the same order, or "
                                        "MPI pairs different buckets and hangs", r, st, i,
                                        l->ops[i].bucket, l0->ops[i0].bucket, i0, k);
                i0++;
                i++;
            }
        }
    }
    return 0;
}

int schedule_verify_replicas(const schedule *const *per_replica, int replicas)
{
    if (!per_replica || replicas < 1)
        return pt_error_set("schedule_verify_replicas: need at least one replica's schedule "
                            "(got %d)", replicas);
    verify_ctx *cs = calloc((size_t)replicas, sizeof *cs);
    if (!cs)
        return pt_error_set("schedule_verify_replicas: out of memory");
    int rc = -1, r = 0;
    for (; r < replicas; r++) {
        if (ctx_check(&cs[r], per_replica[r]) || check_deadlock(&cs[r])) {
            replica_error(r);
            goto done;
        }
        if (cs[r].s->stages != cs[0].s->stages) {
            pt_error_set("replica %d: %d stages, replica 0 has %d; the replicas must run the "
                         "same pipeline", r, cs[r].s->stages, cs[0].s->stages);
            goto done;
        }
    }
    if (check_collective_order(cs, replicas))
        goto done;
    rc = 0;
done:
    for (int q = 0; q < replicas; q++)
        ctx_free(&cs[q]);
    free(cs);
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
