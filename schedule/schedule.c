/* Schedule lists, the generators that fill them (GPipe, 1F1B / PipeDream-Flush; the
 * interleaved and zero-bubble ones, and the name → generator dispatch, are in generate.c,
 * which builds on this file and not the other way round) and the passes that add
 * reductions and recomputation to a generated schedule.
 *
 * Generators place each SEND right after the op that produced its data and each RECV right
 * before the op that consumes it: the executor posts receives early on its own, so a RECV in
 * the list only marks the point where the stage must have the data. */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[SCHED_OP_COUNT] = {
    [SCHED_OP_RECV_ACT] = "recv_act",
    [SCHED_OP_FORWARD] = "F",
    [SCHED_OP_SEND_ACT] = "send_act",
    [SCHED_OP_RECV_GRAD] = "recv_grad",
    [SCHED_OP_BACKWARD] = "B",
    [SCHED_OP_SEND_GRAD] = "send_grad",
    [SCHED_OP_ALLREDUCE] = "allreduce",
    [SCHED_OP_RECOMPUTE] = "R",
    [SCHED_OP_OPTIMIZER_STEP] = "optimizer_step",
    [SCHED_OP_REDUCE_WAIT] = "reduce_wait",
    /* lower case: zero bubble's B and W, told apart from the whole backward "B" */
    [SCHED_OP_BACKWARD_INPUT] = "b",
    [SCHED_OP_BACKWARD_WEIGHT] = "w",
};

const char *schedule_op_name(schedule_op_kind kind)
{
    /* The enum may hold any int (lists are built by hand in tests), so range-check. */
    if ((int)kind < 0 || kind >= SCHED_OP_COUNT)
        return "unknown";
    return op_names[kind];
}

int schedule_init_empty(schedule *s, const char *name, int stages, int microbatches)
{
    if (!s)
        return pt_error_set("schedule_init_empty: schedule is NULL");
    memset(s, 0, sizeof *s);
    if (stages < 1 || microbatches < 1)
        return pt_error_set("schedule_init_empty: need stages >= 1 and microbatches >= 1 "
                            "(got stages=%d, microbatches=%d)", stages, microbatches);
    if (!name)
        name = "";
    if (strlen(name) >= sizeof s->name)
        return pt_error_set("schedule_init_empty: name '%s' is longer than %zu characters",
                            name, sizeof s->name - 1);
    s->lists = calloc((size_t)stages, sizeof *s->lists);
    if (!s->lists)
        return pt_error_set("schedule_init_empty: out of memory for %d stage lists", stages);
    strcpy(s->name, name);
    s->stages = stages;
    s->microbatches = microbatches;
    s->virtual_stages = 1;
    return 0;
}

int schedule_next_chunk(int stages, int virtual_stages, int stage, int chunk,
                        int *next_stage, int *next_chunk)
{
    int ns = stage + 1, nc = chunk;
    if (ns == stages) {
        ns = 0;
        nc++;
    }
    if (nc >= virtual_stages)
        return 0;
    if (next_stage)
        *next_stage = ns;
    if (next_chunk)
        *next_chunk = nc;
    return 1;
}

int schedule_prev_chunk(int stages, int virtual_stages, int stage, int chunk,
                        int *prev_stage, int *prev_chunk)
{
    (void)virtual_stages;
    int ps = stage - 1, pc = chunk;
    if (ps < 0) {
        ps = stages - 1;
        pc--;
    }
    if (pc < 0)
        return 0;
    if (prev_stage)
        *prev_stage = ps;
    if (prev_chunk)
        *prev_chunk = pc;
    return 1;
}

int schedule_model_chunk_of(int stages, int virtual_stages, int placement, int stage,
                            int chunk)
{
    (void)virtual_stages;
    if (placement == SCHED_PLACE_V && chunk % 2)
        return chunk * stages + stages - 1 - stage;
    return chunk * stages + stage;
}

void schedule_chunk_place(int stages, int virtual_stages, int placement, int model_chunk,
                          int *stage, int *chunk)
{
    (void)virtual_stages;
    int v = model_chunk / stages, p = model_chunk % stages;
    if (chunk) *chunk = v;
    if (stage) *stage = placement == SCHED_PLACE_V && v % 2 ? stages - 1 - p : p;
}

int schedule_model_chunk(const schedule *s, int stage, int chunk)
{
    return schedule_model_chunk_of(s->stages, s->virtual_stages, s->placement, stage, chunk);
}

/* Model chunk c's neighbour c + dir, placed; 0 past either end. */
static int route(const schedule *s, int stage, int chunk, int dir, int *ns, int *nc)
{
    int K = s->stages, V = s->virtual_stages;
    int c = schedule_model_chunk(s, stage, chunk) + dir;
    if (c < 0 || c >= K * V)
        return 0;
    int a, b;
    schedule_chunk_place(K, V, s->placement, c, &a, &b);
    if (ns) *ns = a;
    if (nc) *nc = b;
    return 1;
}

int schedule_route_next(const schedule *s, int stage, int chunk, int *next_stage,
                        int *next_chunk)
{
    return route(s, stage, chunk, 1, next_stage, next_chunk);
}

int schedule_route_prev(const schedule *s, int stage, int chunk, int *prev_stage,
                        int *prev_chunk)
{
    return route(s, stage, chunk, -1, prev_stage, prev_chunk);
}

/* Grows a list by one op. */
static int list_push(schedule_list *l, int stage, schedule_op op)
{
    if (l->n_ops == l->cap) {
        if (l->cap > INT_MAX / 2)
            return pt_error_set("schedule_append: stage %d list is too long", stage);
        int cap = l->cap ? 2 * l->cap : 16;
        schedule_op *ops = realloc(l->ops, (size_t)cap * sizeof *ops);
        if (!ops)
            return pt_error_set("schedule_append: out of memory growing stage %d to %d ops",
                                stage, cap);
        l->ops = ops;
        l->cap = cap;
    }
    l->ops[l->n_ops++] = op;
    return 0;
}

/* Appends without judging the op: hand-built lists may be wrong on purpose, and
 * schedule_verify is the one place that says what is wrong with them. Only the stage index
 * is checked, because it guards memory. */
int schedule_append_op(schedule *s, int stage, schedule_op op)
{
    if (!s || !s->lists)
        return pt_error_set("schedule_append: schedule is not initialised");
    if (stage < 0 || stage >= s->stages)
        return pt_error_set("schedule_append: stage %d out of range [0, %d)", stage,
                            s->stages);
    return list_push(&s->lists[stage], stage, op);
}

int schedule_append(schedule *s, int stage, schedule_op_kind kind, int microbatch, int peer)
{
    return schedule_append_op(s, stage, (schedule_op){.kind = kind, .microbatch = microbatch,
                                                      .peer = peer, .bucket = -1,
                                                      .chunk = 0});
}

void schedule_free(schedule *s)
{
    if (!s)
        return;
    if (s->lists) {
        for (int i = 0; i < s->stages; i++)
            free(s->lists[i].ops);
        free(s->lists);
    }
    memset(s, 0, sizeof *s);
}

/* Forward of m on `stage` with the receive before it and the send after it. */
static int append_forward(schedule *s, int stage, int m)
{
    int last = s->stages - 1;
    if (stage > 0 && schedule_append(s, stage, SCHED_OP_RECV_ACT, m, stage - 1))
        return -1;
    if (schedule_append(s, stage, SCHED_OP_FORWARD, m, -1))
        return -1;
    if (stage < last && schedule_append(s, stage, SCHED_OP_SEND_ACT, m, stage + 1))
        return -1;
    return 0;
}

/* Backward of m on `stage` with the gradient receive before it and the send after it. */
static int append_backward(schedule *s, int stage, int m)
{
    int last = s->stages - 1;
    if (stage < last && schedule_append(s, stage, SCHED_OP_RECV_GRAD, m, stage + 1))
        return -1;
    if (schedule_append(s, stage, SCHED_OP_BACKWARD, m, -1))
        return -1;
    if (stage > 0 && schedule_append(s, stage, SCHED_OP_SEND_GRAD, m, stage - 1))
        return -1;
    return 0;
}

int schedule_init_gpipe(schedule *s, int stages, int microbatches)
{
    if (schedule_init_empty(s, "gpipe", stages, microbatches))
        return -1;
    for (int st = 0; st < stages; st++) {
        for (int m = 0; m < microbatches; m++)
            if (append_forward(s, st, m))
                goto fail;
        for (int m = 0; m < microbatches; m++)
            if (append_backward(s, st, m))
                goto fail;
        if (schedule_append(s, st, SCHED_OP_OPTIMIZER_STEP, -1, -1))
            goto fail;
    }
    return 0;
fail:
    schedule_free(s);
    return -1;
}

/* PipeDream-Flush: stage st runs w = min(K−1−st, M) warm-up forwards, so that by the time
 * its first backward is due the gradient can already be on its way; then one forward and
 * one backward alternate; the cool-down drains the remaining backwards. Stage st holds at
 * most min(K−st, M) micro-batches instead of GPipe's M. */
int schedule_init_1f1b(schedule *s, int stages, int microbatches)
{
    if (schedule_init_empty(s, "1f1b", stages, microbatches))
        return -1;
    for (int st = 0; st < stages; st++) {
        int warmup = stages - 1 - st;
        if (warmup > microbatches)
            warmup = microbatches;
        int next_f = 0, next_b = 0;
        for (; next_f < warmup; next_f++)
            if (append_forward(s, st, next_f))
                goto fail;
        while (next_f < microbatches) {
            if (append_forward(s, st, next_f++) || append_backward(s, st, next_b++))
                goto fail;
        }
        while (next_b < microbatches)
            if (append_backward(s, st, next_b++))
                goto fail;
        if (schedule_append(s, st, SCHED_OP_OPTIMIZER_STEP, -1, -1))
            goto fail;
    }
    return 0;
fail:
    schedule_free(s);
    return -1;
}

static schedule_op reduction_op(schedule_op_kind kind, int bucket)
{
    return (schedule_op){.kind = kind, .microbatch = -1, .peer = -1, .bucket = bucket,
                         .chunk = 0};
}

/* Replaces every stage's list with what `rewrite` builds into an empty list (it sets the
 * list's buckets and recompute); on error the schedule is left as it was. */
typedef int (*list_rewrite)(const schedule *s, int st, schedule_list *out, const void *arg);

static int rewrite_lists(schedule *s, list_rewrite rewrite, const void *arg)
{
    if (s->stages < 1) return pt_error_set("schedule: %d stages", s->stages);
    schedule_list *fresh = calloc((size_t)s->stages, sizeof *fresh);
    if (!fresh) return pt_error_set("schedule: out of memory");
    for (int st = 0; st < s->stages; st++) {
        if (rewrite(s, st, &fresh[st], arg)) {
            for (int k = 0; k <= st; k++) free(fresh[k].ops);
            free(fresh);
            return -1;
        }
    }
    for (int st = 0; st < s->stages; st++) free(s->lists[st].ops);
    free(s->lists);
    s->lists = fresh;
    return 0;
}

/* Ops that add to the parameter gradients: the ones a reduction must follow. */
static int adds_gradients(schedule_op_kind kind)
{
    return kind == SCHED_OP_BACKWARD || kind == SCHED_OP_BACKWARD_WEIGHT;
}

/* Reductions go into a list that has none yet (no reduction, no backward part). */
static int already_reduced(const schedule_op *op, int st, int i)
{
    if (op->kind == SCHED_OP_ALLREDUCE || op->kind == SCHED_OP_REDUCE_WAIT ||
        (adds_gradients(op->kind) && op->bucket != -1))
        return pt_error_set("schedule_add_reductions: stage %d op %d (%s) is a reduction or "
                            "a backward part already; add reductions to a schedule without "
                            "them", st, i, schedule_op_name(op->kind));
    return 0;
}

static schedule_op chunk_reduction_op(schedule_op_kind kind, int bucket, int chunk)
{
    schedule_op op = reduction_op(kind, bucket);
    op.chunk = chunk;
    return op;
}

/* Stage st's list of a schedule with V > 1 chunks, with the reductions of buckets[v]
 * buckets per chunk (numbered chunk by chunk: chunk v's are base_v .. base_v + B_v − 1,
 * reduction ops naming chunk v), built into `out`. Backwards stay whole: with overlap,
 * chunk v's reductions start right after its last gradient op (and that op's SEND_GRAD),
 * so a chunk done early (the last model chunks finish their backwards first) reduces while
 * the others compute; without, at the step. Every wait comes just before the step. */
static int rewrite_chunks_with_reductions(const schedule_list *in, int st, int V,
                                          const int *buckets, int overlap, schedule_list *out)
{
    int step = -1, base[V + 1], after[V];
    base[0] = 0;
    for (int v = 0; v < V; v++) {
        base[v + 1] = base[v] + buckets[v];
        after[v] = -1;
    }
    for (int i = 0; i < in->n_ops; i++) {
        const schedule_op *op = &in->ops[i];
        if (already_reduced(op, st, i)) return -1;
        if (adds_gradients(op->kind)) after[op->chunk] = i;
        if (op->kind == SCHED_OP_OPTIMIZER_STEP && step < 0) step = i;
    }
    if (step < 0)
        return pt_error_set("schedule_add_reductions: stage %d has no optimizer_step to "
                            "reduce the gradients before", st);
    for (int v = 0; v < V; v++) {
        if (buckets[v] > 0 && after[v] < 0)
            return pt_error_set("schedule_add_reductions: stage %d chunk %d has no backward "
                                "to reduce the gradients of", st, v);
        /* the gradient's send that follows a whole backward goes first */
        int a = after[v];
        while (a >= 0 && in->ops[after[v]].kind == SCHED_OP_BACKWARD && a + 1 < step &&
               in->ops[a + 1].kind == SCHED_OP_SEND_GRAD &&
               in->ops[a + 1].microbatch == in->ops[after[v]].microbatch &&
               in->ops[a + 1].chunk == v)
            a++;
        after[v] = overlap ? a : -1;
    }
    for (int i = 0; i < in->n_ops; i++) {
        if (i == step) {
            for (int v = 0; v < V; v++)
                for (int b = base[v]; b < base[v + 1] && after[v] < 0; b++)
                    if (list_push(out, st, chunk_reduction_op(SCHED_OP_ALLREDUCE, b, v)))
                        return -1;
            for (int v = 0; v < V; v++)
                for (int b = base[v]; b < base[v + 1]; b++)
                    if (list_push(out, st, chunk_reduction_op(SCHED_OP_REDUCE_WAIT, b, v)))
                        return -1;
        }
        if (list_push(out, st, in->ops[i])) return -1;
        for (int v = 0; v < V; v++)
            for (int b = base[v]; b < base[v + 1] && after[v] == i; b++)
                if (list_push(out, st, chunk_reduction_op(SCHED_OP_ALLREDUCE, b, v)))
                    return -1;
    }
    return 0;
}

/* Stage st's list with its B buckets' reductions, built into `out` (empty on entry). */
static int rewrite_with_reductions(const schedule_list *in, int st, int B, int overlap,
                                   schedule_list *out)
{
    int split = -1, step = -1;
    for (int i = 0; i < in->n_ops; i++) {
        const schedule_op *op = &in->ops[i];
        if (already_reduced(op, st, i)) return -1;
        if (adds_gradients(op->kind))
            split = i;
        if (op->kind == SCHED_OP_OPTIMIZER_STEP && step < 0)
            step = i;
    }
    if (step < 0)
        return pt_error_set("schedule_add_reductions: stage %d has no optimizer_step to "
                            "reduce the gradients before", st);
    if (B > 0 && split < 0)
        return pt_error_set("schedule_add_reductions: stage %d has no backward to reduce "
                            "the gradients of", st);
    if (B == 0 || !overlap)
        split = -1;
    /* The ops that follow the split backward and belong to it (its gradient's send) come
     * before the last bucket's start: the previous stage waits for that gradient. A
     * BACKWARD_WEIGHT has no send of its own (it follows its BACKWARD_INPUT's). */
    int tail = split;
    while (tail >= 0 && in->ops[split].kind == SCHED_OP_BACKWARD && tail + 1 < step &&
           in->ops[tail + 1].kind == SCHED_OP_SEND_GRAD &&
           in->ops[tail + 1].microbatch == in->ops[split].microbatch &&
           in->ops[tail + 1].chunk == in->ops[split].chunk)
        tail++;
    for (int i = 0; i < in->n_ops; i++) {
        const schedule_op *op = &in->ops[i];
        if (i == step) {
            for (int b = 0; b < B && !overlap; b++)
                if (list_push(out, st, reduction_op(SCHED_OP_ALLREDUCE, b)))
                    return -1;
            for (int b = 0; b < B; b++)
                if (list_push(out, st, reduction_op(SCHED_OP_REDUCE_WAIT, b)))
                    return -1;
        }
        if (i == split && B > 1) {
            for (int b = 0; b < B - 1; b++) {
                schedule_op part = *op;
                part.bucket = b;
                if (list_push(out, st, part) ||
                    list_push(out, st, reduction_op(SCHED_OP_ALLREDUCE, b)))
                    return -1;
            }
            schedule_op part = *op;
            part.bucket = B - 1;
            if (list_push(out, st, part))
                return -1;
        } else if (list_push(out, st, *op)) {
            return -1;
        }
        if (i == tail && list_push(out, st, reduction_op(SCHED_OP_ALLREDUCE, B - 1)))
            return -1;
    }
    return 0;
}

/* rewrite_lists' callbacks of the reductions: stage st's buckets (per stage, or per chunk
 * at [st·V + v]) and whether they overlap the backward. */
typedef struct {
    const int *buckets;
    int overlap;
} reductions_arg;

static int stage_reductions(const schedule *s, int st, schedule_list *out, const void *arg)
{
    const reductions_arg *a = arg;
    out->buckets = a->buckets[st];
    out->recompute = s->lists[st].recompute;
    return rewrite_with_reductions(&s->lists[st], st, a->buckets[st], a->overlap, out);
}

static int chunk_reductions(const schedule *s, int st, schedule_list *out, const void *arg)
{
    const reductions_arg *a = arg;
    int V = s->virtual_stages;
    for (int v = 0; v < V; v++) out->buckets += a->buckets[st * V + v];
    out->recompute = s->lists[st].recompute;
    return rewrite_chunks_with_reductions(&s->lists[st], st, V, a->buckets + st * V,
                                          a->overlap, out);
}

int schedule_add_reductions_per_stage(schedule *s, const int *buckets, int overlap)
{
    if (!s || !s->lists)
        return pt_error_set("schedule_add_reductions: schedule is not initialised");
    if (s->stages < 1)
        return pt_error_set("schedule_add_reductions: schedule has %d stages", s->stages);
    if (!buckets)
        return pt_error_set("schedule_add_reductions: no bucket counts given");
    if (s->virtual_stages > 1)
        return pt_error_set("schedule_add_reductions: schedule '%s' has %d chunks per rank: "
                            "give buckets per chunk (schedule_add_reductions_chunks)", s->name,
                            s->virtual_stages);
    for (int st = 0; st < s->stages; st++) {
        if (buckets[st] < 0)
            return pt_error_set("schedule_add_reductions: stage %d has %d buckets; need >= 0",
                                st, buckets[st]);
        if (s->lists[st].buckets != 0)
            return pt_error_set("schedule_add_reductions: stage %d has reductions already "
                                "(%d buckets)", st, s->lists[st].buckets);
    }
    reductions_arg a = {buckets, overlap};
    return rewrite_lists(s, stage_reductions, &a);
}

int schedule_add_reductions_chunks(schedule *s, const int *buckets, int overlap)
{
    if (!s || !s->lists || !buckets)
        return pt_error_set("schedule_add_reductions: schedule or bucket counts missing");
    int K = s->stages, V = s->virtual_stages;
    if (V <= 1) return schedule_add_reductions_per_stage(s, buckets, overlap);
    if (K < 1) return pt_error_set("schedule_add_reductions: schedule has %d stages", K);
    for (int st = 0; st < K; st++) {
        if (s->lists[st].buckets != 0)
            return pt_error_set("schedule_add_reductions: stage %d has reductions already "
                                "(%d buckets)", st, s->lists[st].buckets);
        for (int v = 0; v < V; v++)
            if (buckets[st * V + v] < 0)
                return pt_error_set("schedule_add_reductions: stage %d chunk %d has %d "
                                    "buckets; need >= 0", st, v, buckets[st * V + v]);
    }
    reductions_arg a = {buckets, overlap};
    return rewrite_lists(s, chunk_reductions, &a);
}

int schedule_add_reductions(schedule *s, int buckets, int overlap)
{
    if (!s || !s->lists)
        return pt_error_set("schedule_add_reductions: schedule is not initialised");
    if (s->stages < 1)
        return pt_error_set("schedule_add_reductions: schedule has %d stages", s->stages);
    if (buckets < 1)
        return pt_error_set("schedule_add_reductions: need buckets >= 1 (got %d)", buckets);
    int *per = malloc((size_t)s->stages * sizeof *per);
    if (!per)
        return pt_error_set("schedule_add_reductions: out of memory");
    for (int st = 0; st < s->stages; st++)
        per[st] = buckets;
    int rc = schedule_add_reductions_per_stage(s, per, overlap);
    free(per);
    return rc;
}

/* Index of the first backward op (BACKWARD, its part 0, BACKWARD_INPUT) of (chunk, m), or
 * −1. */
static int first_backward(const schedule_list *l, int chunk, int m)
{
    for (int i = 0; i < l->n_ops; i++) {
        const schedule_op *op = &l->ops[i];
        if (op->microbatch == m && op->chunk == chunk &&
            (op->kind == SCHED_OP_BACKWARD_INPUT ||
             (op->kind == SCHED_OP_BACKWARD && op->bucket <= 0)))
            return i;
    }
    return -1;
}

/* Stage st's list with a RECOMPUTE before each micro-batch's first backward op (and before
 * the RECV_GRAD of the same micro-batch right before it), built into `out`. */
static int rewrite_with_recompute(const schedule *s, int st, schedule_list *out)
{
    const schedule_list *in = &s->lists[st];
    int M = s->microbatches, V = s->virtual_stages;
    char *at = calloc((size_t)in->n_ops + 1, 1); /* at[i]: a RECOMPUTE goes before op i */
    if (!at)
        return pt_error_set("schedule_add_recompute: out of memory");
    for (int v = 0; v < V; v++)
        for (int m = 0; m < M; m++) {
            int i = first_backward(in, v, m);
            if (i < 0) {
                free(at);
                return pt_error_set("schedule_add_recompute: stage %d has no backward of m=%d "
                                    "chunk %d to recompute for", st, m, v);
            }
            const schedule_op *prev = i > 0 ? &in->ops[i - 1] : NULL;
            if (prev && prev->kind == SCHED_OP_RECV_GRAD && prev->microbatch == m &&
                prev->chunk == v)
                i--;
            at[i] = 1;
        }
    for (int i = 0; i < in->n_ops; i++) {
        if (at[i]) {
            /* the op at i is m's backward or the receive right before it */
            const schedule_op *op = &in->ops[i];
            schedule_op r = {.kind = SCHED_OP_RECOMPUTE, .microbatch = op->microbatch,
                             .peer = -1, .bucket = -1, .chunk = op->chunk};
            if (list_push(out, st, r)) {
                free(at);
                return -1;
            }
        }
        if (list_push(out, st, in->ops[i])) {
            free(at);
            return -1;
        }
    }
    free(at);
    out->buckets = in->buckets;
    out->recompute = 1;
    return 0;
}

/* rewrite_lists' callback: the stages flagged in `arg` (K ints) get recomputation, the
 * others a copy of their list. */
static int stage_recompute(const schedule *s, int st, schedule_list *out, const void *arg)
{
    const int *stages = arg;
    if (stages[st]) return rewrite_with_recompute(s, st, out);
    out->buckets = s->lists[st].buckets;
    out->recompute = s->lists[st].recompute;
    for (int i = 0; i < s->lists[st].n_ops; i++)
        if (list_push(out, st, s->lists[st].ops[i])) return -1;
    return 0;
}

int schedule_add_recompute(schedule *s, const int *stages)
{
    if (!s || !s->lists)
        return pt_error_set("schedule_add_recompute: schedule is not initialised");
    if (!stages)
        return pt_error_set("schedule_add_recompute: no stage flags given");
    for (int st = 0; st < s->stages; st++) {
        if (s->lists[st].recompute)
            return pt_error_set("schedule_add_recompute: stage %d of schedule '%s' has "
                                "recomputation already", st, s->name);
        for (int i = 0; i < s->lists[st].n_ops; i++)
            if (s->lists[st].ops[i].kind == SCHED_OP_RECOMPUTE)
                return pt_error_set("schedule_add_recompute: stage %d op %d of schedule '%s' "
                                    "is a recompute already", st, i, s->name);
    }
    return rewrite_lists(s, stage_recompute, stages);
}

int schedule_parse_recompute(const char *spec, int stages, int *flags)
{
    if (!spec || !flags || stages < 1)
        return pt_error_set("--recompute: nothing to parse");
    for (int st = 0; st < stages; st++)
        flags[st] = 0;
    if (strcmp(spec, "none") == 0)
        return 0;
    if (strcmp(spec, "all") == 0) {
        for (int st = 0; st < stages; st++)
            flags[st] = 1;
        return 0;
    }
    const char *p = spec;
    for (;;) {
        if (!isdigit((unsigned char)*p))
            return pt_error_set("--recompute %s: expected none, all or a comma list of stage "
                                "numbers like 0,2", spec);
        char *end;
        long st = strtol(p, &end, 10);
        if (st >= stages)
            return pt_error_set("--recompute %s: stage %ld does not exist (stages 0..%d)",
                                spec, st, stages - 1);
        flags[st] = 1;
        if (*end == '\0')
            return 0;
        if (*end != ',')
            return pt_error_set("--recompute %s: expected none, all or a comma list of stage "
                                "numbers like 0,2", spec);
        p = end + 1;
    }
}
