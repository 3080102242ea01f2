/* Verifier: proves a set of per-stage lists is a complete, well-formed optimizer step that
 * cannot deadlock, before the executor bets MPI ranks on it.
 *
 * Checks run from local to global, so that the first message names the simplest cause:
 *   1. each op on its own (kind, chunk, micro-batch, peer, bucket, nothing after
 *      OPTIMIZER_STEP, no duplicates, backward parts in order), and every list has its
 *      OPTIMIZER_STEP;
 *   2. every send has its receive on the peer and vice versa (chunk routing of schedule.h);
 *   3. per stage, chunk and micro-batch: everything present and in dependency order; per
 *      chunk: backwards in micro-batch order; per stage and bucket: reduced once, after its
 *      last gradient contribution, waited for;
 *   4. (verify_run.c) the lists run together to completion (receives block, sends never do).
 * schedule_verify_replicas runs them on each replica's schedule, then compares the order in
 * which the replicas of a stage start their collectives.
 */
#include "schedule/verify_internal.h"

#include "src/base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int *verify_pos(const verify_ctx *c, int stage, int chunk, schedule_op_kind kind, int m)
{
    size_t k = ((size_t)stage * (size_t)c->V + (size_t)chunk) * SCHED_OP_COUNT + (size_t)kind;
    return &c->pos[k * (size_t)c->M + (size_t)m];
}

static size_t split_index(const verify_ctx *c, int stage, int chunk, int split, int m)
{
    size_t k = ((size_t)stage * (size_t)c->V + (size_t)chunk) * VERIFY_SPLITS + (size_t)split;
    return k * (size_t)c->M + (size_t)m;
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

static int may_split(schedule_op_kind kind)
{
    return kind == SCHED_OP_BACKWARD || kind == SCHED_OP_BACKWARD_WEIGHT;
}

const char *verify_describe(const verify_ctx *c, const schedule_op *op, char *buf, size_t n)
{
    const char *name = schedule_op_name(op->kind);
    char mb[48];
    /* the chunk is named only where there are several */
    if (c->V > 1 || op->chunk != 0)
        snprintf(mb, sizeof mb, "m=%d chunk %d", op->microbatch, op->chunk);
    else
        snprintf(mb, sizeof mb, "m=%d", op->microbatch);
    switch (op->kind) {
    case SCHED_OP_SEND_ACT:
    case SCHED_OP_SEND_GRAD:
        snprintf(buf, n, "%s %s to stage %d", name, mb, op->peer);
        break;
    case SCHED_OP_RECV_ACT:
    case SCHED_OP_RECV_GRAD:
        snprintf(buf, n, "%s %s from stage %d", name, mb, op->peer);
        break;
    case SCHED_OP_BACKWARD:
    case SCHED_OP_BACKWARD_WEIGHT:
        if (op->bucket != -1) {
            snprintf(buf, n, "%s %s part %d", name, mb, op->bucket);
            break;
        }
        /* fall through */
    case SCHED_OP_FORWARD:
    case SCHED_OP_RECOMPUTE:
    case SCHED_OP_BACKWARD_INPUT:
        snprintf(buf, n, "%s %s", name, mb);
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
    return buf;
}

schedule_op_kind verify_matching_kind(schedule_op_kind kind)
{
    switch (kind) {
    case SCHED_OP_SEND_ACT: return SCHED_OP_RECV_ACT;
    case SCHED_OP_RECV_ACT: return SCHED_OP_SEND_ACT;
    case SCHED_OP_SEND_GRAD: return SCHED_OP_RECV_GRAD;
    case SCHED_OP_RECV_GRAD: return SCHED_OP_SEND_GRAD;
    default: return SCHED_OP_COUNT;
    }
}

/* Messages towards the previous model chunk: activations received, gradients sent. */
static int towards_prev(schedule_op_kind kind)
{
    return kind == SCHED_OP_RECV_ACT || kind == SCHED_OP_SEND_GRAD;
}

int verify_peer_chunk(const verify_ctx *c, schedule_op_kind kind, int stage, int chunk)
{
    int ps, pv;
    int ok = towards_prev(kind) ? schedule_route_prev(c->s, stage, chunk, &ps, &pv)
                                : schedule_route_next(c->s, stage, chunk, &ps, &pv);
    return ok ? pv : -1;
}

/* The one peer an op of this kind may name on (stage, chunk): −1 for local ops, −2 when the
 * chunk has no such neighbour (model chunk 0 receiving activations, the last one gradients). */
static int expected_peer(const verify_ctx *c, schedule_op_kind kind, int stage, int chunk)
{
    if (verify_matching_kind(kind) == SCHED_OP_COUNT)
        return -1;
    int ps, pv;
    int ok = towards_prev(kind) ? schedule_route_prev(c->s, stage, chunk, &ps, &pv)
                                : schedule_route_next(c->s, stage, chunk, &ps, &pv);
    return ok ? ps : -2;
}

/* The op's words in an error message ("forward m=3 chunk 1"), formatted only when an error
 * is reported: these checks run on every op of every candidate the planner and the schedule
 * search price. The functions below hold the buffer d. */
#define OP_TEXT verify_describe(c, op, d, sizeof d)

/* The bucket field of one op: a bucket of the stage for reductions, −1 or a bucket for a
 * backward or weight backward (a part), −1 for everything else. */
static int check_bucket(const verify_ctx *c, int st, int i, const schedule_op *op)
{
    char d[96];
    const schedule *s = c->s;
    int B = s->lists[st].buckets;
    int splits = may_split(op->kind);
    if (!is_reduction(op->kind) && !splits) {
        if (op->bucket != -1)
            return pt_error_set("schedule '%s' stage %d op %d (%s): bucket must be -1, got "
                                "%d", s->name, st, i, OP_TEXT, op->bucket);
        return 0;
    }
    if (splits && op->bucket == -1)
        return 0;
    if (B == 0)
        return pt_error_set("schedule '%s' stage %d op %d (%s): the stage has no buckets "
                            "(its list's buckets is 0), so no %s", s->name, st, i, OP_TEXT,
                            splits ? "backward parts" : "reductions");
    if (op->bucket < 0 || op->bucket >= B)
        return pt_error_set("schedule '%s' stage %d op %d (%s): bucket %d out of range "
                            "[0, %d)", s->name, st, i, OP_TEXT, op->bucket, B);
    return 0;
}

/* A BACKWARD or BACKWARD_WEIGHT of m, whole or part b: the only one of m, or the next of
 * its parts. */
static int note_split(verify_ctx *c, int st, int i, const schedule_op *op)
{
    char d[96];
    const schedule *s = c->s;
    int split = op->kind == SCHED_OP_BACKWARD ? VERIFY_SPLIT_BACKWARD : VERIFY_SPLIT_WEIGHT;
    size_t k = split_index(c, st, op->chunk, split, op->microbatch);
    int *first = verify_pos(c, st, op->chunk, op->kind, op->microbatch);
    int parts = c->parts[k];
    const char *what = split == VERIFY_SPLIT_BACKWARD ? "backward" : "weight backward";
    if (op->bucket == -1 && *first >= 0)
        return pt_error_set("schedule '%s' stage %d op %d: duplicate %s (first at op %d)",
                            s->name, st, i, OP_TEXT, *first);
    if (op->bucket != -1 && parts < 0)
        return pt_error_set("schedule '%s' stage %d op %d (%s): micro-batch %d was "
                            "%sed whole at op %d; a %s is either whole or split into parts "
                            "0..%d", s->name, st, i, OP_TEXT, op->microbatch,
                            split == VERIFY_SPLIT_BACKWARD ? "backward" : "weight-backward",
                            *first, what, s->lists[st].buckets - 1);
    if (op->bucket != -1 && op->bucket < parts)
        return pt_error_set("schedule '%s' stage %d op %d: duplicate %s", s->name, st, i, OP_TEXT);
    if (op->bucket != -1 && op->bucket > parts)
        return pt_error_set("schedule '%s' stage %d op %d (%s): part %d is due first; the "
                            "parts of a %s run in order 0..%d (bucket 0 holds the stage's "
                            "last layers)", s->name, st, i, OP_TEXT, parts, what,
                            s->lists[st].buckets - 1);
    if (*first < 0)
        *first = i;
    c->last[k] = i;
    c->parts[k] = op->bucket == -1 ? -1 : parts + 1;
    return 0;
}

/* Why a message op has no neighbour there: "the first stage has no stage to receive
 * activations from" (V = 1) or "... model chunk 0 ..." (V > 1). */
static int no_neighbour(const verify_ctx *c, int st, int i, const schedule_op *op)
{
    char d[96];
    const schedule *s = c->s;
    int prev = towards_prev(op->kind);
    const char *what = op->kind == SCHED_OP_RECV_ACT    ? "receive activations from"
                       : op->kind == SCHED_OP_SEND_GRAD ? "send gradients to"
                       : op->kind == SCHED_OP_SEND_ACT  ? "send activations to"
                                                        : "receive gradients from";
    if (c->V == 1)
        return pt_error_set("schedule '%s' stage %d op %d (%s): the %s stage has no stage to "
                            "%s", s->name, st, i, OP_TEXT, prev ? "first" : "last", what);
    return pt_error_set("schedule '%s' stage %d op %d (%s): chunk %d of stage %d is the %s "
                        "model chunk, it has no chunk to %s", s->name, st, i, OP_TEXT, op->chunk,
                        st, prev ? "first" : "last", what);
}

/* Pass 1, one op: its fields, plus the position tables the later passes use. */
static int check_one(verify_ctx *c, int st, int i, int step)
{
    const schedule *s = c->s;
    const schedule_op *op = &s->lists[st].ops[i];
    char d[96];
    if ((int)op->kind < 0 || op->kind >= SCHED_OP_COUNT)
        return pt_error_set("schedule '%s' stage %d op %d: unknown op kind %d", s->name, st,
                            i, (int)op->kind);
    if (step >= 0 && op->kind == SCHED_OP_REDUCE_WAIT)
        return pt_error_set("schedule '%s' stage %d op %d (%s): comes after the "
                            "optimizer_step at op %d, which needs every bucket reduced",
                            s->name, st, i, OP_TEXT, step);
    if (step >= 0)
        return pt_error_set("schedule '%s' stage %d op %d (%s): comes after the "
                            "optimizer_step at op %d; the list must end with it", s->name, st,
                            i, OP_TEXT, step);
    if (has_microbatch(op->kind)) {
        if (op->microbatch < 0 || op->microbatch >= s->microbatches)
            return pt_error_set("schedule '%s' stage %d op %d (%s): micro-batch %d out of "
                                "range [0, %d)", s->name, st, i, OP_TEXT, op->microbatch,
                                s->microbatches);
        if (op->chunk < 0 || op->chunk >= c->V)
            return pt_error_set("schedule '%s' stage %d op %d (%s): chunk %d out of range "
                                "[0, %d) (the schedule has %d virtual stages per rank)",
                                s->name, st, i, OP_TEXT, op->chunk, c->V, c->V);
    } else if (op->microbatch != -1) {
        return pt_error_set("schedule '%s' stage %d op %d (%s): micro-batch must be -1, got "
                            "%d", s->name, st, i, OP_TEXT, op->microbatch);
    } else if (is_reduction(op->kind)) {
        /* a reduction belongs to the chunk whose bucket it reduces */
        if (op->chunk < 0 || op->chunk >= c->V)
            return pt_error_set("schedule '%s' stage %d op %d (%s): chunk must be one of the "
                                "rank's %d, got %d", s->name, st, i, OP_TEXT, c->V, op->chunk);
    } else if (op->chunk != 0) {
        return pt_error_set("schedule '%s' stage %d op %d (%s): chunk must be 0, got %d (the "
                            "op belongs to the whole rank)", s->name, st, i, OP_TEXT, op->chunk);
    }
    int want = expected_peer(c, op->kind, st, op->chunk);
    if (want == -2)
        return no_neighbour(c, st, i, op);
    if (op->peer != want) {
        if (want == -1)
            return pt_error_set("schedule '%s' stage %d op %d (%s): wrong peer %d, a local op "
                                "must have peer -1", s->name, st, i, OP_TEXT, op->peer);
        return pt_error_set("schedule '%s' stage %d op %d (%s): wrong peer %d, expected stage "
                            "%d (activations flow from s-1 to s%s, gradients back)", s->name,
                            st, i, OP_TEXT, op->peer, want,
                            c->V > 1 ? " and from the last stage's chunk v to stage 0's "
                                       "chunk v+1"
                                     : "");
    }
    if (check_bucket(c, st, i, op))
        return -1;
    if (is_reduction(op->kind)) {
        int *p = &(op->kind == SCHED_OP_ALLREDUCE ? c->ar : c->wait)[c->boff[st] + op->bucket];
        if (*p >= 0)
            return pt_error_set("schedule '%s' stage %d op %d: duplicate %s (first at op %d); "
                                "a bucket is reduced exactly once", s->name, st, i, OP_TEXT, *p);
        *p = i;
    } else if (may_split(op->kind)) {
        return note_split(c, st, i, op);
    } else if (op->kind != SCHED_OP_OPTIMIZER_STEP) {
        int *p = verify_pos(c, st, op->chunk, op->kind, op->microbatch);
        if (*p >= 0)
            return pt_error_set("schedule '%s' stage %d op %d: duplicate %s (first at op %d)",
                                s->name, st, i, OP_TEXT, *p);
        *p = i;
    }
    return 0;
}

#undef OP_TEXT

/* Pass 1: each op on its own; every list ends with its step. */
static int check_ops(verify_ctx *c)
{
    const schedule *s = c->s;
    for (int st = 0; st < s->stages; st++) {
        const schedule_list *l = &s->lists[st];
        int step = -1;
        for (int i = 0; i < l->n_ops; i++) {
            if (check_one(c, st, i, step))
                return -1;
            if (l->ops[i].kind == SCHED_OP_OPTIMIZER_STEP)
                step = i;
        }
        if (step < 0)
            return pt_error_set("schedule '%s' stage %d: missing optimizer_step (the list of "
                                "%d ops must end with one)", s->name, st, l->n_ops);
    }
    return 0;
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
            schedule_op_kind other = verify_matching_kind(op->kind);
            if (other == SCHED_OP_COUNT)
                continue;
            int peer = op->peer; /* valid: checked in pass 1 */
            int pv = verify_peer_chunk(c, op->kind, st, op->chunk);
            if (*verify_pos(c, peer, pv, other, op->microbatch) >= 0)
                continue;
            hint[0] = '\0';
            for (int m = 0; m < s->microbatches; m++) {
                int j = *verify_pos(c, peer, pv, other, m);
                if (j >= 0 && *verify_pos(c, st, op->chunk, op->kind, m) < 0) {
                    snprintf(hint, sizeof hint, "; stage %d has an unmatched %s m=%d at op %d "
                             "(wrong micro-batch?)", peer, schedule_op_name(other), m, j);
                    break;
                }
            }
            verify_describe(c, op, d, sizeof d);
            char chunk[32] = "";
            if (c->V > 1)
                snprintf(chunk, sizeof chunk, " chunk %d", pv);
            int is_send = op->kind == SCHED_OP_SEND_ACT || op->kind == SCHED_OP_SEND_GRAD;
            return pt_error_set("schedule '%s' stage %d op %d (%s): %s, no matching %s m=%d%s "
                                "on stage %d%s", s->name, st, i, d,
                                is_send ? "send without receive" : "receive without send",
                                schedule_op_name(other), op->microbatch, chunk, peer, hint);
        }
    }
    return 0;
}

/* Per bucket of stage st: one ALLREDUCE after every gradient contribution to the bucket
 * (each micro-batch's whole BACKWARD or BACKWARD_WEIGHT, or its part b, on the bucket's
 * chunk: the chunk its ALLREDUCE names), one REDUCE_WAIT of the same chunk after it (pass
 * 1 saw that nothing follows the step). */
static int check_reductions(const verify_ctx *c, int st)
{
    const schedule *s = c->s;
    const schedule_list *l = &s->lists[st];
    int B = l->buckets, V = c->V;
    if (B == 0)
        return 0;
    int *contrib = malloc(((size_t)B + (size_t)V) * sizeof *contrib), *whole = contrib + B;
    if (!contrib)
        return pt_error_set("schedule_verify: out of memory");
    for (int b = 0; b < B + V; b++)
        contrib[b] = -1;
    for (int i = 0; i < l->n_ops; i++)
        if (may_split(l->ops[i].kind)) {
            if (l->ops[i].bucket == -1)
                whole[l->ops[i].chunk] = i;
            else
                contrib[l->ops[i].bucket] = i;
        }
    int rc = 0;
    char d[96];
    for (int b = 0; b < B && !rc; b++) {
        int ar = c->ar[c->boff[st] + b], w = c->wait[c->boff[st] + b];
        int v = ar >= 0 ? l->ops[ar].chunk : 0;
        int last = contrib[b] > whole[v] ? contrib[b] : whole[v];
        if (ar >= 0 && w >= 0 && l->ops[w].chunk != v) {
            rc = pt_error_set("schedule '%s' stage %d op %d: reduce_wait bucket %d names chunk "
                              "%d, its allreduce (op %d) chunk %d", s->name, st, w, b,
                              l->ops[w].chunk, ar, v);
        } else if (ar < 0) {
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
            verify_describe(c, &l->ops[last], d, sizeof d);
            rc = pt_error_set("schedule '%s' stage %d op %d: allreduce bucket %d comes "
                              "before %s (op %d), which adds to its gradients; a bucket is "
                              "reduced after its last contribution", s->name, st, ar, b, d,
                              last);
        }
    }
    free(contrib);
    return rc;
}

/* Op i follows the op at *prev in one of the micro-batch orders: it must be a later
 * micro-batch. */
static int order_note(const verify_ctx *c, int st, int i, int *prev, int input)
{
    const schedule_list *l = &c->s->lists[st];
    if (*prev >= 0 && l->ops[*prev].microbatch >= l->ops[i].microbatch) {
        char d[96], e[96];
        verify_describe(c, &l->ops[i], d, sizeof d);
        verify_describe(c, &l->ops[*prev], e, sizeof e);
        return pt_error_set("schedule '%s' stage %d op %d (%s): comes after %s (op %d); %s run "
                            "in micro-batch order 0..%d on each chunk, so that gradients "
                            "accumulate as in sequential training", c->s->name, st, i, d, e,
                            *prev,
                            input ? "input-gradient backwards (B, b)"
                                  : "the ops adding parameter gradients (B, w)",
                            c->M - 1);
    }
    *prev = i;
    return 0;
}

/* Per chunk of stage st: the ops computing input gradients (BACKWARD, its part 0,
 * BACKWARD_INPUT) in micro-batch order, and, per bucket, the ops adding to it (BACKWARD and
 * BACKWARD_WEIGHT, whole or its part) in micro-batch order: gradients then accumulate in
 * the order of sequential training, bit for bit. */
static int check_microbatch_order(const verify_ctx *c, int st)
{
    const schedule *s = c->s;
    const schedule_list *l = &s->lists[st];
    int V = c->V, nb = l->buckets > 0 ? l->buckets : 1;
    /* [v]: last input-gradient op; [V + v·nb + b]: last op adding to bucket b (−1: none) */
    size_t n = (size_t)V + (size_t)V * (size_t)nb;
    int *last = malloc(n * sizeof *last);
    if (!last)
        return pt_error_set("schedule_verify: out of memory");
    for (size_t k = 0; k < n; k++)
        last[k] = -1;
    int rc = 0;
    for (int i = 0; i < l->n_ops && !rc; i++) {
        const schedule_op *op = &l->ops[i];
        if (op->kind == SCHED_OP_BACKWARD_INPUT ||
            (op->kind == SCHED_OP_BACKWARD && op->bucket <= 0))
            rc = order_note(c, st, i, &last[op->chunk], 1);
        if (!may_split(op->kind))
            continue;
        int lo = op->bucket < 0 ? 0 : op->bucket, hi = op->bucket < 0 ? nb - 1 : op->bucket;
        for (int b = lo; b <= hi && !rc; b++)
            rc = order_note(c, st, i, &last[(size_t)V + (size_t)op->chunk * (size_t)nb +
                                            (size_t)b], 0);
    }
    free(last);
    return rc;
}

/* The backward of (st, v, m) is complete: whole BACKWARD (all its parts), or b and w (all
 * of w's parts), not both, w after b. Sets *first (first backward op) and *input (the op
 * that produces the input gradient). */
static int check_backward(const verify_ctx *c, int st, int v, int m, int *first, int *input)
{
    const schedule *s = c->s;
    const char *n = s->name;
    int end = s->lists[st].n_ops, B = s->lists[st].buckets;
    char ch[32] = "";
    if (c->V > 1)
        snprintf(ch, sizeof ch, " chunk %d", v);
    int bw = *verify_pos(c, st, v, SCHED_OP_BACKWARD, m);
    int bi = *verify_pos(c, st, v, SCHED_OP_BACKWARD_INPUT, m);
    int ww = *verify_pos(c, st, v, SCHED_OP_BACKWARD_WEIGHT, m);
    size_t kb = split_index(c, st, v, VERIFY_SPLIT_BACKWARD, m);
    size_t kw = split_index(c, st, v, VERIFY_SPLIT_WEIGHT, m);
    if (bw < 0 && bi < 0 && ww < 0)
        return pt_error_set("schedule '%s' stage %d: micro-batch %d%s is never backwarded (no "
                            "B m=%d in %d ops)", n, st, m, ch, m, end);
    if (bw >= 0 && (bi >= 0 || ww >= 0))
        return pt_error_set("schedule '%s' stage %d op %d: micro-batch %d%s is backwarded "
                            "whole (B) and also split into b and w (op %d); it is one or the "
                            "other", n, st, bi >= 0 ? bi : ww, m, ch, bw);
    if (bi >= 0 && ww < 0)
        return pt_error_set("schedule '%s' stage %d op %d: b m=%d%s has no w m=%d: the "
                            "weight gradients of the micro-batch are never computed", n, st, bi,
                            m, ch, m);
    if (ww >= 0 && bi < 0)
        return pt_error_set("schedule '%s' stage %d op %d: w m=%d%s has no b m=%d before it "
                            "(the input-gradient backward comes first)", n, st, ww, m, ch, m);
    if (ww >= 0 && ww < bi)
        return pt_error_set("schedule '%s' stage %d op %d: w m=%d%s comes before b m=%d (op "
                            "%d); the weight gradients follow the input gradient", n, st, ww, m,
                            ch, m, bi);
    size_t k = bw >= 0 ? kb : kw;
    if (c->parts[k] > 0 && c->parts[k] < B)
        return pt_error_set("schedule '%s' stage %d op %d: the %s of m=%d%s is split but "
                            "stops after part %d (no %s m=%d part %d of %d)", n, st,
                            c->last[k], bw >= 0 ? "backward" : "weight backward", m, ch,
                            c->parts[k] - 1, bw >= 0 ? "B" : "w", m, c->parts[k], B);
    *first = bw >= 0 ? bw : bi;
    *input = bw >= 0 ? c->last[kb] : bi;
    return 0;
}

/* Per (stage, chunk, micro-batch): each op present exactly once and in dependency order. */
static int check_microbatch(const verify_ctx *c, int st, int v, int m)
{
    const schedule *s = c->s;
    const schedule_list *l = &s->lists[st];
    const char *n = s->name;
    int end = l->n_ops;
    char ch[32] = "";
    if (c->V > 1)
        snprintf(ch, sizeof ch, " chunk %d", v);
    int has_prev = schedule_route_prev(c->s, st, v, NULL, NULL);
    int has_next = schedule_route_next(c->s, st, v, NULL, NULL);
    int f = *verify_pos(c, st, v, SCHED_OP_FORWARD, m);
    int ra = *verify_pos(c, st, v, SCHED_OP_RECV_ACT, m);
    int sa = *verify_pos(c, st, v, SCHED_OP_SEND_ACT, m);
    int rg = *verify_pos(c, st, v, SCHED_OP_RECV_GRAD, m);
    int sg = *verify_pos(c, st, v, SCHED_OP_SEND_GRAD, m);
    int r = *verify_pos(c, st, v, SCHED_OP_RECOMPUTE, m);
    if (f < 0)
        return pt_error_set("schedule '%s' stage %d: micro-batch %d%s is never forwarded (no F "
                            "m=%d in %d ops)", n, st, m, ch, m, end);
    int b = -1, input = -1;
    if (check_backward(c, st, v, m, &b, &input))
        return -1;
    const char *bn = l->ops[b].kind == SCHED_OP_BACKWARD ? "B" : "b";
    int split = l->ops[input].kind == SCHED_OP_BACKWARD && input != b;
    if (b < f)
        return pt_error_set("schedule '%s' stage %d op %d: backward before forward (%s m=%d%s "
                            "comes before F m=%d at op %d)", n, st, b, bn, m, ch, m, f);
    if (has_prev && ra < 0)
        return pt_error_set("schedule '%s' stage %d op %d: F m=%d%s has no recv_act m=%d", n,
                            st, f, m, ch, m);
    if (has_prev && ra > f)
        return pt_error_set("schedule '%s' stage %d op %d: recv_act m=%d%s comes after the F "
                            "m=%d that needs it (op %d)", n, st, ra, m, ch, m, f);
    if (has_next && sa < 0)
        return pt_error_set("schedule '%s' stage %d op %d: output of F m=%d%s is never sent "
                            "(no send_act m=%d)", n, st, f, m, ch, m);
    if (has_next && sa < f)
        return pt_error_set("schedule '%s' stage %d op %d: send_act m=%d%s comes before the F "
                            "m=%d that produces it (op %d)", n, st, sa, m, ch, m, f);
    if (has_next && rg < 0)
        return pt_error_set("schedule '%s' stage %d op %d: %s m=%d%s has no recv_grad m=%d", n,
                            st, b, bn, m, ch, m);
    if (has_next && rg > b)
        return pt_error_set("schedule '%s' stage %d op %d: recv_grad m=%d%s comes after the "
                            "%s m=%d that needs it (op %d)", n, st, rg, m, ch, bn, m, b);
    if (has_prev && sg < 0)
        return pt_error_set("schedule '%s' stage %d op %d: input gradient of %s m=%d%s is "
                            "never sent (no send_grad m=%d)", n, st, input, bn, m, ch, m);
    if (has_prev && sg < input)
        return pt_error_set("schedule '%s' stage %d op %d: send_grad m=%d%s comes before the "
                            "%s%s m=%d that produces it (op %d)", n, st, sg, m, ch,
                            split ? "last part of " : "", bn, m, input);
    if (r >= 0 && (r < f || r > b))
        return pt_error_set("schedule '%s' stage %d op %d: R m=%d%s must lie between F m=%d "
                            "(op %d) and %s m=%d (op %d)", n, st, r, m, ch, m, f, bn, m, b);
    if (r < 0 && l->recompute)
        return pt_error_set("schedule '%s' stage %d: micro-batch %d%s is never recomputed (no "
                            "R m=%d between F m=%d at op %d and %s m=%d at op %d), but the "
                            "stage recomputes: it keeps only the input", n, st, m, ch, m, m,
                            f, bn, m, b);
    return 0;
}

/* Pass 3: per stage, chunk and micro-batch, then the stage's orders and reductions. */
static int check_order(const verify_ctx *c)
{
    const schedule *s = c->s;
    for (int st = 0; st < s->stages; st++) {
        for (int v = 0; v < c->V; v++)
            for (int m = 0; m < s->microbatches; m++)
                if (check_microbatch(c, st, v, m))
                    return -1;
        if (check_microbatch_order(c, st) || check_reductions(c, st))
            return -1;
    }
    return 0;
}

void verify_ctx_free(verify_ctx *c)
{
    free(c->pos);
    free(c->last);
    free(c->parts);
    free(c->boff);
    free(c->ar);
    free(c->wait);
    memset(c, 0, sizeof *c);
}

int verify_ctx_check(verify_ctx *c, const schedule *s)
{
    memset(c, 0, sizeof *c);
    c->s = s;
    if (!s || !s->lists)
        return pt_error_set("schedule_verify: schedule is not initialised");
    if (s->stages < 1 || s->microbatches < 1)
        return pt_error_set("schedule '%s': need stages >= 1 and microbatches >= 1 (got %d, "
                            "%d)", s->name, s->stages, s->microbatches);
    if (s->virtual_stages < 1)
        return pt_error_set("schedule '%s': %d virtual stages; need >= 1", s->name,
                            s->virtual_stages);
    c->K = s->stages;
    c->V = s->virtual_stages;
    c->M = s->microbatches;
    size_t rows = (size_t)s->stages * (size_t)s->virtual_stages * SCHED_OP_COUNT;
    if ((size_t)s->microbatches > SIZE_MAX / sizeof(int) / rows)
        return pt_error_set("schedule '%s': %d stages x %d chunks x %d micro-batches is too "
                            "large", s->name, s->stages, s->virtual_stages, s->microbatches);
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
    size_t per_mb = (size_t)s->stages * (size_t)s->virtual_stages * VERIFY_SPLITS *
                    (size_t)s->microbatches;
    c->pos = malloc(cells * sizeof *c->pos);
    c->last = malloc(per_mb * sizeof *c->last);
    c->parts = calloc(per_mb, sizeof *c->parts);
    c->boff = malloc(((size_t)s->stages + 1) * sizeof *c->boff);
    c->ar = malloc((buckets ? buckets : 1) * sizeof *c->ar);
    c->wait = malloc((buckets ? buckets : 1) * sizeof *c->wait);
    if (!c->pos || !c->last || !c->parts || !c->boff || !c->ar || !c->wait)
        return pt_error_set("schedule_verify: out of memory for %zu positions", cells);
    for (size_t i = 0; i < cells; i++)
        c->pos[i] = -1;
    for (size_t i = 0; i < per_mb; i++)
        c->last[i] = -1;
    for (size_t i = 0; i < buckets; i++)
        c->ar[i] = c->wait[i] = -1;
    c->boff[0] = 0;
    for (int st = 0; st < s->stages; st++)
        c->boff[st + 1] = c->boff[st] + (size_t)s->lists[st].buckets;
    if (check_ops(c) || check_matching(c) || check_order(c))
        return -1;
    return 0;
}
