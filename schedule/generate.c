/* Generators beyond GPipe and 1F1B: Megatron-LM's interleaved 1F1B over virtual chunks and
 * Zero Bubble H1 (backward split into input and weight gradients); and the dispatch from a
 * schedule's name to its generator, here because it needs every generator (schedule.c's
 * and these) while schedule.c needs none of these.
 *
 * As in schedule.c, each RECV sits right before the op that consumes it and each SEND right
 * after the op that produced its data; messages follow the chunk routing of schedule.h.
 */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <stdlib.h>
#include <string.h>

static int push(schedule *s, int st, schedule_op_kind kind, int v, int m, int peer)
{
    return schedule_append_op(s, st, (schedule_op){.kind = kind, .microbatch = m,
                                                   .peer = peer, .bucket = -1, .chunk = v});
}

/* Forward of m on (st, v) with the receive before it and the send after it. */
static int add_forward(schedule *s, int st, int v, int m)
{
    int ps, pv, ns, nv;
    if (schedule_route_prev(s, st, v, &ps, &pv) &&
        push(s, st, SCHED_OP_RECV_ACT, v, m, ps))
        return -1;
    if (push(s, st, SCHED_OP_FORWARD, v, m, -1))
        return -1;
    if (schedule_route_next(s, st, v, &ns, &nv) && push(s, st, SCHED_OP_SEND_ACT, v, m, ns))
        return -1;
    return 0;
}

/* BACKWARD or BACKWARD_INPUT of m on (st, v) with the gradient's receive and send. */
static int add_backward(schedule *s, int st, int v, int m, schedule_op_kind kind)
{
    int ps, pv, ns, nv;
    if (schedule_route_next(s, st, v, &ns, &nv) &&
        push(s, st, SCHED_OP_RECV_GRAD, v, m, ns))
        return -1;
    if (push(s, st, kind, v, m, -1))
        return -1;
    if (schedule_route_prev(s, st, v, &ps, &pv) && push(s, st, SCHED_OP_SEND_GRAD, v, m, ps))
        return -1;
    return 0;
}

/* ---- interleaved 1F1B ------------------------------------------------------------------ */

/* Megatron-LM's order (schedules.py): micro-batches in groups of K; each group goes
 * through chunk 0, then chunk 1, ..., V−1 before the next group starts. Backwards take the
 * same order with the chunks reversed (the last chunk's gradient comes first). k-th entry:
 * (tm[k], tv[k]). K divides M (checked by the caller). */
static void interleaved_table(int K, int V, int M, int *tm, int *tv)
{
    int k = 0;
    for (int lo = 0; lo < M; lo += K)
        for (int v = 0; v < V; v++)
            for (int m = lo; m < lo + K; m++) {
                tm[k] = m;
                tv[k] = v;
                k++;
            }
}

/* Rank r's list: warm-up forwards, steady one forward and one backward, cool-down
 * backwards. The warm-up is Megatron's: 2(K−1−r) so that the gradient of the first
 * micro-batch can come back through the later ranks (twice K−1−r: there and back), plus
 * (V−1)·K to fill the first group's pass through chunks 0..V−2 before the last chunk's
 * first backward is due. */
static int interleaved_rank(schedule *s, int r, const int *tm, const int *tv)
{
    int K = s->stages, V = s->virtual_stages, total = s->microbatches * V;
    long warm = 2L * (K - 1 - r) + (long)(V - 1) * K;
    if (warm > total)
        warm = total;
    int w = (int)warm;
    for (int k = 0; k < w; k++)
        if (add_forward(s, r, tv[k], tm[k]))
            return -1;
    for (int i = 0; i < total - w; i++)
        if (add_forward(s, r, tv[w + i], tm[w + i]) ||
            add_backward(s, r, V - 1 - tv[i], tm[i], SCHED_OP_BACKWARD))
            return -1;
    for (int i = total - w; i < total; i++)
        if (add_backward(s, r, V - 1 - tv[i], tm[i], SCHED_OP_BACKWARD))
            return -1;
    return push(s, r, SCHED_OP_OPTIMIZER_STEP, 0, -1, -1);
}

int schedule_init_interleaved(schedule *s, int stages, int virtual_stages, int microbatches)
{
    if (s)
        memset(s, 0, sizeof *s);
    if (virtual_stages < 1)
        return pt_error_set("schedule_init_interleaved: need virtual_stages >= 1 (got %d)",
                            virtual_stages);
    if (virtual_stages == 1) {
        /* one chunk per rank: Megatron's warm-up formula is for V > 1; 1F1B is the V = 1
         * case of the same idea */
        if (schedule_init_1f1b(s, stages, microbatches))
            return -1;
        strcpy(s->name, "interleaved");
        return 0;
    }
    if (stages < 2 && stages >= 1)
        return pt_error_set("schedule_init_interleaved: %d chunks per rank need at least 2 "
                            "stages (with one, the rank would send to itself)",
                            virtual_stages);
    if (schedule_init_empty(s, "interleaved", stages, microbatches))
        return -1;
    /* A last group smaller than K shifts the backward order against the forward order
     * that the warm-up is counted for: the verifier finds deadlocks (e.g. K = 5, V = 2,
     * M = 7), so, like Megatron-LM, only whole groups. */
    if (microbatches % stages) {
        int lo = microbatches / stages * stages;
        schedule_free(s);
        if (lo == 0)
            return pt_error_set("schedule interleaved with %d chunks per stage needs the "
                                "micro-batches to be a multiple of the %d stages (got %d; "
                                "use %d)", virtual_stages, stages, microbatches, stages);
        return pt_error_set("schedule interleaved with %d chunks per stage needs the "
                            "micro-batches to be a multiple of the %d stages (got %d; use %d "
                            "or %d)", virtual_stages, stages, microbatches, lo, lo + stages);
    }
    if ((size_t)microbatches * (size_t)virtual_stages > (size_t)1 << 24) {
        schedule_free(s);
        return pt_error_set("schedule_init_interleaved: %d micro-batches x %d chunks is too "
                            "many", microbatches, virtual_stages);
    }
    s->virtual_stages = virtual_stages;
    size_t n = (size_t)microbatches * (size_t)virtual_stages;
    int *tm = malloc(n * sizeof *tm), *tv = malloc(n * sizeof *tv);
    int rc = -1;
    if (!tm || !tv) {
        pt_error_set("schedule_init_interleaved: out of memory");
        goto done;
    }
    interleaved_table(stages, virtual_stages, microbatches, tm, tv);
    for (int r = 0; r < stages; r++)
        if (interleaved_rank(s, r, tm, tv))
            goto done;
    rc = 0;
done:
    free(tm);
    free(tv);
    if (rc)
        schedule_free(s);
    return rc;
}

/* ---- zero bubble ----------------------------------------------------------------------- */

/* Stage st runs 1F1B's order of forwards and input-gradient backwards (min(K−1−st, M)
 * warm-up forwards, then F and b in turn, then the cool-down b's), each b sending its
 * gradient at once, and places w j right after b (j + delay). With delay 0 every stage
 * holds what it holds in 1F1B, min(K−st, M) micro-batches (FORWARD to w), and the split
 * only shortens the backward on the critical path. ZB-H1 gives stage st the delay st (for
 * M >= K): the last stage runs K pairs F b before its first w, so the gradient of every
 * micro-batch leaves it, and reaches stage 0, as early as in a pipeline without W; the w's
 * deferred on each stage fill its cool-down. Each stage then idles K−1 slots in all (st
 * before its first forward): unit-cost makespan 3M + K − 1 (F = b = w = 1), while every
 * stage holds min(K, M) micro-batches, 1F1B's stage 0. The w's left when the b's run out
 * close the list. The verifier and tests/test_schedule.c check all of this for K <= 8,
 * M <= 32. */
static int zb_stage(schedule *s, int st, int delay)
{
    int K = s->stages, M = s->microbatches;
    int warm = K - 1 - st < M ? K - 1 - st : M;
    int nf = 0, nb = 0, nw = 0;
    for (; nf < warm; nf++)
        if (add_forward(s, st, 0, nf))
            return -1;
    while (nb < M) {
        if (nf < M && add_forward(s, st, 0, nf++))
            return -1;
        if (add_backward(s, st, 0, nb++, SCHED_OP_BACKWARD_INPUT))
            return -1;
        for (; nw <= nb - 1 - delay; nw++)
            if (push(s, st, SCHED_OP_BACKWARD_WEIGHT, 0, nw, -1))
                return -1;
    }
    for (; nw < M; nw++)
        if (push(s, st, SCHED_OP_BACKWARD_WEIGHT, 0, nw, -1))
            return -1;
    return push(s, st, SCHED_OP_OPTIMIZER_STEP, 0, -1, -1);
}

int schedule_init_zb(schedule *s, int stages, int microbatches, const int *max_inflight)
{
    if (schedule_init_empty(s, "zb", stages, microbatches))
        return -1;
    if (!max_inflight) {
        schedule_free(s);
        return pt_error_set("schedule_init_zb: no per-stage caps given");
    }
    for (int st = 0; st < stages; st++) {
        int base = stages - st < microbatches ? stages - st : microbatches;
        if (max_inflight[st] < base) {
            schedule_free(s);
            return pt_error_set("schedule_init_zb: stage %d may hold %d micro-batches; it "
                                "needs at least 1F1B's min(K-s, M) = %d", st,
                                max_inflight[st], base);
        }
    }
    for (int st = 0; st < stages; st++) {
        int base = stages - st < microbatches ? stages - st : microbatches;
        if (zb_stage(s, st, max_inflight[st] - base)) {
            schedule_free(s);
            return -1;
        }
    }
    return 0;
}

int schedule_init_zb_h1(schedule *s, int stages, int microbatches)
{
    if (s)
        memset(s, 0, sizeof *s);
    if (stages < 1 || microbatches < 1)
        return pt_error_set("schedule_init_zb_h1: need stages >= 1 and microbatches >= 1 (got "
                            "stages=%d, microbatches=%d)", stages, microbatches);
    int *cap = malloc((size_t)stages * sizeof *cap);
    if (!cap)
        return pt_error_set("schedule_init_zb_h1: out of memory");
    for (int st = 0; st < stages; st++)
        cap[st] = stages < microbatches ? stages : microbatches;
    int rc = schedule_init_zb(s, stages, microbatches, cap);
    free(cap);
    if (!rc)
        strcpy(s->name, "zb-h1");
    return rc;
}

/* ---- by name --------------------------------------------------------------------------- */

int schedule_init_by_name(schedule *s, const char *name, int stages, int microbatches)
{
    if (s)
        memset(s, 0, sizeof *s);
    if (!name)
        return pt_error_set("schedule_init_by_name: no schedule name given (known: gpipe, "
                            "1f1b)");
    if (strcmp(name, "gpipe") == 0)
        return schedule_init_gpipe(s, stages, microbatches);
    if (strcmp(name, "1f1b") == 0)
        return schedule_init_1f1b(s, stages, microbatches);
    return pt_error_set("unknown schedule '%s' (known: gpipe, 1f1b)", name);
}

int schedule_is_v(const char *name)
{
    return name && (!strcmp(name, "zb-v") || !strcmp(name, "v-half") ||
                    !strcmp(name, "v-min") || !strcmp(name, "dualpipev"));
}

int schedule_splits_backward(const char *name)
{
    return name && (schedule_is_v(name) || !strcmp(name, "zb-h1") || !strcmp(name, "zb-h2") ||
                    !strcmp(name, "search"));
}

int schedule_init_named(schedule *s, const char *name, int stages, int virtual_stages,
                        int microbatches)
{
    if (s)
        memset(s, 0, sizeof *s);
    static const char known[] = "known: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, v-half, "
                                "v-min, dualpipev, search";
    if (!name)
        return pt_error_set("no schedule name given (%s)", known);
    if (!strcmp(name, "search")) {
        schedule_search_config c = {.stages = stages, .microbatches = microbatches,
                                    .virtual_stages = virtual_stages};
        return schedule_search(s, &c, NULL);
    }
    if (schedule_is_v(name)) {
        if (virtual_stages < 1)
            return pt_error_set("--virtual %d: need at least 1 chunk per rank", virtual_stages);
        int V = virtual_stages == 1 ? 2 : virtual_stages;
        if (V % 2)
            return pt_error_set("schedule %s places model chunks in a V (down the ranks and "
                                "back): it needs an even number of chunks per rank, not "
                                "--virtual %d", name, V);
        if (!strcmp(name, "dualpipev")) {
            if (V != 2)
                return pt_error_set("schedule dualpipev runs 2 chunks per rank, not --virtual "
                                    "%d", V);
            return schedule_init_dualpipev(s, stages, microbatches);
        }
        return schedule_init_zb_v_family(s, name, stages, V, microbatches);
    }
    if (strcmp(name, "zb-h2") == 0) {
        if (virtual_stages != 1)
            return pt_error_set("--virtual %d needs --schedule interleaved or a V schedule "
                                "(schedule 'zb-h2' runs one chunk per rank)", virtual_stages);
        return schedule_init_zb_v_family(s, name, stages, 1, microbatches);
    }
    int interleaved = strcmp(name, "interleaved") == 0;
    int other = strcmp(name, "gpipe") == 0 || strcmp(name, "1f1b") == 0 ||
                strcmp(name, "zb-h1") == 0;
    if (!interleaved && !other)
        return pt_error_set("unknown schedule '%s' (%s)", name, known);
    if (virtual_stages < 1)
        return pt_error_set("--virtual %d: need at least 1 chunk per rank", virtual_stages);
    if (virtual_stages > 1 && !interleaved)
        return pt_error_set("--virtual %d needs --schedule interleaved or a V schedule (schedule '%s' runs one "
                            "chunk per rank)", virtual_stages, name);
    if (interleaved)
        return schedule_init_interleaved(s, stages, virtual_stages, microbatches);
    if (strcmp(name, "zb-h1") == 0)
        return schedule_init_zb_h1(s, stages, microbatches);
    return schedule_init_by_name(s, name, stages, microbatches);
}
