/* What the schedule suites share (tests/test_schedule.c, test_schedule_ir.c, test_schedule_reduce.c):
 * lists built from the printer's notation, and checks of verifier messages. Static inline, so a
 * suite that does not use one does not warn. */
#ifndef PT_TESTS_SCHEDULE_BUILD_H
#define PT_TESTS_SCHEDULE_BUILD_H

#include "schedule/schedule.h"

#include "src/base/error.h"
#include "tests/check.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Builds a schedule from one string per stage in the printer's notation ("<a0 F0 >a0 <g0 B0
 * >g0 STEP", with "B0/1" part 1 of a backward, "b0"/"w0" zero bubble's input/weight
 * backward, "F0.1" micro-batch 0 on chunk 1, "A1"/"W1" start/wait for bucket 1's
 * reduction), so that wrong lists read like the right ones. Peers are the natural ones
 * (<a from the previous model chunk's stage, >a to the next one's, <g and >g the reverse;
 * s−1 and s+1 when V = 1) unless given as "@p" ("<a0@2"). Every list's bucket count is 0:
 * set_buckets sets it. build_v builds a schedule with V chunks per stage. */
static inline void build_va(schedule *s, int stages, int V, int microbatches, va_list ap)
{
    cr_assert_eq(schedule_init_empty(s, "test", stages, microbatches), 0, "%s", pt_error_get());
    s->virtual_stages = V;
    for (int st = 0; st < stages; st++) {
        char *spec = strdup(va_arg(ap, const char *));
        char *save = NULL;
        for (char *t = strtok_r(spec, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
            schedule_op_kind kind;
            int peer = -1, m = -1, bucket = -1;
            const char *num = t + 1;
            if (strcmp(t, "STEP") == 0) {
                kind = SCHED_OP_OPTIMIZER_STEP;
                num = NULL;
            } else if (t[0] == 'A' || t[0] == 'W') {
                kind = t[0] == 'A' ? SCHED_OP_ALLREDUCE : SCHED_OP_REDUCE_WAIT;
                bucket = (int)strtol(t + 1, NULL, 10);
                num = NULL;
            } else if (t[0] == 'F') {
                kind = SCHED_OP_FORWARD;
            } else if (t[0] == 'B') {
                kind = SCHED_OP_BACKWARD;
            } else if (t[0] == 'b') {
                kind = SCHED_OP_BACKWARD_INPUT;
            } else if (t[0] == 'w') {
                kind = SCHED_OP_BACKWARD_WEIGHT;
            } else if (t[0] == 'R') {
                kind = SCHED_OP_RECOMPUTE;
            } else {
                cr_assert((t[0] == '<' || t[0] == '>') && (t[1] == 'a' || t[1] == 'g'),
                          "bad token '%s'", t);
                int act = t[1] == 'a', recv = t[0] == '<';
                kind = act ? (recv ? SCHED_OP_RECV_ACT : SCHED_OP_SEND_ACT)
                           : (recv ? SCHED_OP_RECV_GRAD : SCHED_OP_SEND_GRAD);
                peer = (act == recv) ? -2 : -3; /* towards the previous / next chunk */
                num = t + 2;
            }
            int chunk = 0;
            if (num) {
                char *end;
                m = (int)strtol(num, &end, 10);
                if (*end == '.')
                    chunk = (int)strtol(end + 1, &end, 10);
                if (peer < -1) {
                    int ps = peer == -2 ? st - 1 : st + 1, pv;
                    if (peer == -2)
                        schedule_prev_chunk(stages, V, st, chunk, &ps, &pv);
                    else
                        schedule_next_chunk(stages, V, st, chunk, &ps, &pv);
                    peer = ps;
                }
                if (*end == '@')
                    peer = (int)strtol(end + 1, NULL, 10);
                if (*end == '/')
                    bucket = (int)strtol(end + 1, NULL, 10);
            }
            schedule_op op = {.kind = kind, .microbatch = m, .peer = peer, .bucket = bucket,
                              .chunk = chunk};
            cr_assert_eq(schedule_append_op(s, st, op), 0, "%s", pt_error_get());
        }
        free(spec);
    }
}

static inline void build(schedule *s, int stages, int microbatches, ...)
{
    va_list ap;
    va_start(ap, microbatches);
    build_va(s, stages, 1, microbatches, ap);
    va_end(ap);
}

static inline void build_v(schedule *s, int stages, int V, int microbatches, ...)
{
    va_list ap;
    va_start(ap, microbatches);
    build_va(s, stages, V, microbatches, ap);
    va_end(ap);
}

static inline void set_buckets(schedule *s, int buckets)
{
    for (int st = 0; st < s->stages; st++)
        s->lists[st].buckets = buckets;
}

/* Asserts that verification fails and the message contains every given fragment. */
static inline void expect_invalid(const schedule *s, const char *what, const char *frag1,
                           const char *frag2)
{
    pt_error_clear();
    schedule_report r;
    cr_assert_eq(schedule_verify(s, &r), -1, "%s: verifier accepted a wrong schedule", what);
    const char *msg = pt_error_get();
    cr_assert(strstr(msg, frag1), "%s: message '%s' lacks '%s'", what, msg, frag1);
    cr_assert(!frag2 || strstr(msg, frag2), "%s: message '%s' lacks '%s'", what, msg, frag2 ? frag2 : "");
    cr_assert(!r.peak_inflight && !r.peak_inflight_chunk && !r.peak_inputs_chunk &&
                  !r.peak_inputs,
              "%s: report filled on failure", what);
    schedule_report_free(&r);
}

static inline void expect_same_ops(const schedule *got, const schedule *want)
{
    cr_assert_eq(got->stages, want->stages);
    for (int st = 0; st < want->stages; st++) {
        const schedule_list *g = &got->lists[st], *w = &want->lists[st];
        cr_assert_eq(g->n_ops, w->n_ops, "%s stage %d: %d ops, want %d", got->name, st,
                     g->n_ops, w->n_ops);
        cr_assert_eq(g->buckets, w->buckets, "%s stage %d: %d buckets, want %d", got->name,
                     st, g->buckets, w->buckets);
        for (int i = 0; i < w->n_ops; i++)
            cr_assert(g->ops[i].kind == w->ops[i].kind &&
                          g->ops[i].microbatch == w->ops[i].microbatch &&
                          g->ops[i].peer == w->ops[i].peer &&
                          g->ops[i].bucket == w->ops[i].bucket &&
                          g->ops[i].chunk == w->ops[i].chunk,
                      "%s stage %d op %d: got %s m=%d chunk %d peer %d bucket %d, want %s m=%d "
                      "chunk %d peer %d bucket %d",
                      got->name, st, i, schedule_op_name(g->ops[i].kind), g->ops[i].microbatch,
                      g->ops[i].chunk, g->ops[i].peer, g->ops[i].bucket,
                      schedule_op_name(w->ops[i].kind), w->ops[i].microbatch, w->ops[i].chunk,
                      w->ops[i].peer, w->ops[i].bucket);
    }
}

static inline void remove_op(schedule *s, int stage, int index)
{
    schedule_list *l = &s->lists[stage];
    cr_assert(index >= 0 && index < l->n_ops);
    memmove(&l->ops[index], &l->ops[index + 1],
            (size_t)(l->n_ops - index - 1) * sizeof *l->ops);
    l->n_ops--;
}

static inline int find_op(const schedule *s, int stage, schedule_op_kind kind, int m)
{
    for (int i = 0; i < s->lists[stage].n_ops; i++)
        if (s->lists[stage].ops[i].kind == kind && s->lists[stage].ops[i].microbatch == m)
            return i;
    cr_assert_fail("stage %d has no %s m=%d", stage, schedule_op_name(kind), m);
    return -1;
}

/* Index of the op (kind, m, bucket) on `stage`; m is −1 for reductions. */
static inline int find_bucket_op(const schedule *s, int stage, schedule_op_kind kind, int m,
                          int bucket)
{
    for (int i = 0; i < s->lists[stage].n_ops; i++) {
        const schedule_op *op = &s->lists[stage].ops[i];
        if (op->kind == kind && op->microbatch == m && op->bucket == bucket)
            return i;
    }
    cr_assert_fail("stage %d has no %s m=%d bucket %d", stage, schedule_op_name(kind), m,
                   bucket);
    return -1;
}

static inline void insert_op(schedule *s, int stage, int index, schedule_op op)
{
    cr_assert_eq(schedule_append_op(s, stage, op), 0); /* grows the list by one */
    schedule_list *l = &s->lists[stage];
    memmove(&l->ops[index + 1], &l->ops[index], (size_t)(l->n_ops - 1 - index) * sizeof op);
    l->ops[index] = op;
}

/* Moves op `from` to just before the op now at `to` (indices before the move). */
static inline void move_op(schedule *s, int stage, int from, int to)
{
    schedule_op op = s->lists[stage].ops[from];
    remove_op(s, stage, from);
    insert_op(s, stage, from < to ? to - 1 : to, op);
}

/* ---- generators ------------------------------------------------------------------------ */

/* The printer's output as a string (free it). */
static inline char *print_to_string(const schedule *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    schedule_print(s, f);
    cr_assert_eq(fclose(f), 0);
    return buf;
}

#endif
