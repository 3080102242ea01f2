/* Generators with a split backward whose orders come from a greedy list scheduler (ZB-H2,
 * ZB-V, V-Half, V-Min, and the search over profiled costs), and DualPipeV, whose order is
 * DeepSeek's fixed eight phases. See schedule.h for what each promises.
 *
 * The greedy scheduler (in the spirit of the Zero Bubble repository's, not a copy of it)
 * simulates the ranks op by op at the given costs. The rank whose clock is earliest picks,
 * among what it can run now: an input-gradient backward (b) of the chunk nearest the loss,
 * else a forward of the chunk nearest the loss that its memory cap allows, else a pending
 * weight-gradient backward (w, oldest first), which fills what would be idle time; with
 * nothing to run it waits for the first message due. Memory is counted in chunk
 * activations (a forward takes one, its w gives it back); a micro-batch entering a rank on
 * chunk 0 reserves room for its later chunks there, so a cap of at least V per rank cannot
 * deadlock. Every order it produces is in micro-batch order per chunk, as the verifier
 * demands (gradients then accumulate in the order of sequential training). */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int push(schedule *s, int st, schedule_op_kind kind, int v, int m, int peer)
{
    return schedule_append_op(s, st, (schedule_op){.kind = kind, .microbatch = m,
                                                   .peer = peer, .bucket = -1, .chunk = v});
}

static int add_forward(schedule *s, int st, int v, int m)
{
    int ps, ns;
    if (schedule_route_prev(s, st, v, &ps, NULL) && push(s, st, SCHED_OP_RECV_ACT, v, m, ps))
        return -1;
    if (push(s, st, SCHED_OP_FORWARD, v, m, -1))
        return -1;
    if (schedule_route_next(s, st, v, &ns, NULL) && push(s, st, SCHED_OP_SEND_ACT, v, m, ns))
        return -1;
    return 0;
}

static int add_backward(schedule *s, int st, int v, int m, schedule_op_kind kind)
{
    int ps, ns;
    if (schedule_route_next(s, st, v, &ns, NULL) && push(s, st, SCHED_OP_RECV_GRAD, v, m, ns))
        return -1;
    if (push(s, st, kind, v, m, -1))
        return -1;
    if (schedule_route_prev(s, st, v, &ps, NULL) && push(s, st, SCHED_OP_SEND_GRAD, v, m, ps))
        return -1;
    return 0;
}

/* ---- the greedy list scheduler ---------------------------------------------------------- */

typedef struct {
    schedule *s;
    const schedule_greedy_config *cfg;
    int K, V, M, C;        /* C = K·V model chunks */
    double *t;             /* [K] each rank's clock */
    double *fdone, *bdone; /* [C·M] end of F / b of (model chunk, m); −1: not yet */
    int *nf, *nb;          /* [K·V] next micro-batch to forward / b on (rank, chunk) */
    int *wq, *wq_head, *wq_len; /* [K][C·M] pending w's (chunk·M + m), a ring per rank */
    int *mem, *reserve;    /* [K] chunk activations held, and promised to later chunks */
    int *blocked;          /* [K] nothing to run until another rank moves */
    int *left;             /* [K] ops still to place */
} greedy;

static double cost_of(const double *a, int c) { return a ? a[c] : 1.0; }

/* When the input of F (g = 0) or the gradient for b (g = 1) of (st, v, m) is there;
 * −1 while the op producing it has not been placed. */
static double ready_time(const greedy *w, int st, int v, int m, int g)
{
    const schedule *s = w->s;
    int c = schedule_model_chunk(s, st, v), ps;
    if (!g) {
        if (!schedule_route_prev(s, st, v, &ps, NULL)) return 0;
        double f = w->fdone[(size_t)(c - 1) * w->M + m];
        return f < 0 ? -1 : f + (ps == st ? 0 : w->cfg->comm);
    }
    double f = w->fdone[(size_t)c * w->M + m];
    if (f < 0) return -1;
    if (!schedule_route_next(s, st, v, &ps, NULL)) return f; /* the loss's own gradient */
    double b = w->bdone[(size_t)(c + 1) * w->M + m];
    if (b < 0) return -1;
    b += ps == st ? 0 : w->cfg->comm;
    return b > f ? b : f;
}

/* May (st, v) take the activation of its next forward: a micro-batch new to the rank
 * (chunk 0) needs room for all V of its chunks here; later chunks have it reserved. */
static int room_for(const greedy *w, int st, int v)
{
    if (!w->cfg->cap) return 1;
    if (v > 0) return 1;
    return w->mem[st] + w->reserve[st] + w->V <= w->cfg->cap[st];
}

static int place_f(greedy *w, int st, int v, double begin)
{
    int m = w->nf[st * w->V + v]++, c = schedule_model_chunk(w->s, st, v);
    w->t[st] = begin + cost_of(w->cfg->fwd, c);
    w->fdone[(size_t)c * w->M + m] = w->t[st];
    w->mem[st]++;
    if (v == 0) w->reserve[st] += w->V - 1;
    else w->reserve[st]--;
    return add_forward(w->s, st, v, m);
}

static int place_b(greedy *w, int st, int v, double begin)
{
    int m = w->nb[st * w->V + v]++, c = schedule_model_chunk(w->s, st, v);
    w->t[st] = begin + cost_of(w->cfg->bwd_input, c);
    w->bdone[(size_t)c * w->M + m] = w->t[st];
    size_t n = (size_t)w->V * w->M;
    w->wq[(size_t)st * n + (size_t)((w->wq_head[st] + w->wq_len[st]) % (int)n)] = v * w->M + m;
    w->wq_len[st]++;
    return add_backward(w->s, st, v, m, SCHED_OP_BACKWARD_INPUT);
}

static int place_w(greedy *w, int st)
{
    size_t n = (size_t)w->V * w->M;
    int k = w->wq[(size_t)st * n + (size_t)w->wq_head[st]];
    w->wq_head[st] = (w->wq_head[st] + 1) % (int)n;
    w->wq_len[st]--;
    int v = k / w->M, m = k % w->M, c = schedule_model_chunk(w->s, st, v);
    w->t[st] += cost_of(w->cfg->bwd_weight, c);
    w->mem[st]--;
    return push(w->s, st, SCHED_OP_BACKWARD_WEIGHT, v, m, -1);
}

/* Rank st's next op at its clock: 1 placed, 0 it must wait for another rank. */
static int greedy_step(greedy *w, int st)
{
    double now = w->t[st], due = INFINITY;
    int best_b = -1, best_f = -1, cb = -1, cf = -1;
    for (int v = 0; v < w->V; v++) {
        int c = schedule_model_chunk(w->s, st, v);
        if (w->nb[st * w->V + v] < w->nf[st * w->V + v]) {
            double r = ready_time(w, st, v, w->nb[st * w->V + v], 1);
            int better = w->cfg->policy & SCHED_GREEDY_B_LOW ? cb < 0 || c < cb : c > cb;
            if (r >= 0 && r <= now && better) best_b = v, cb = c;
            else if (r > now && r < due) due = r;
        }
        if (w->nf[st * w->V + v] < w->M && room_for(w, st, v)) {
            double r = ready_time(w, st, v, w->nf[st * w->V + v], 0);
            int better = w->cfg->policy & SCHED_GREEDY_F_LOW ? cf < 0 || c < cf : c > cf;
            if (r >= 0 && r <= now && better) best_f = v, cf = c;
            else if (r > now && r < due) due = r;
        }
    }
    w->blocked[st] = 0;
    w->left[st]--;
    if (best_b >= 0) return place_b(w, st, best_b, now) ? -1 : 1;
    /* lazy: a micro-batch new to the rank waits while a w can run instead */
    int lazy = w->cfg->policy & SCHED_GREEDY_LAZY_F && best_f == 0 && w->wq_len[st];
    if (best_f >= 0 && !lazy) return place_f(w, st, best_f, now) ? -1 : 1;
    if (w->wq_len[st]) return place_w(w, st) ? -1 : 1;
    w->left[st]++;
    if (due < INFINITY) {
        w->t[st] = due; /* idle until the first message due */
        return 1;
    }
    w->blocked[st] = 1;
    return 0;
}

static void greedy_free(greedy *w)
{
    free(w->t);
    free(w->fdone);
    free(w->bdone);
    free(w->nf);
    free(w->nb);
    free(w->wq);
    free(w->wq_head);
    free(w->wq_len);
    free(w->mem);
    free(w->reserve);
    free(w->blocked);
    free(w->left);
}

static int greedy_alloc(greedy *w)
{
    size_t CM = (size_t)w->C * w->M, K = (size_t)w->K;
    w->t = calloc(K, sizeof *w->t);
    w->fdone = malloc(CM * sizeof *w->fdone);
    w->bdone = malloc(CM * sizeof *w->bdone);
    w->nf = calloc((size_t)w->C, sizeof *w->nf);
    w->nb = calloc((size_t)w->C, sizeof *w->nb);
    w->wq = malloc(K * (size_t)w->V * w->M * sizeof *w->wq);
    w->wq_head = calloc(K, sizeof *w->wq_head);
    w->wq_len = calloc(K, sizeof *w->wq_len);
    w->mem = calloc(K, sizeof *w->mem);
    w->reserve = calloc(K, sizeof *w->reserve);
    w->blocked = calloc(K, sizeof *w->blocked);
    w->left = calloc(K, sizeof *w->left);
    if (!w->t || !w->fdone || !w->bdone || !w->nf || !w->nb || !w->wq || !w->wq_head ||
        !w->wq_len || !w->mem || !w->reserve || !w->blocked || !w->left)
        return pt_error_set("schedule: out of memory for %d x %d micro-batches", w->C, w->M);
    for (size_t i = 0; i < CM; i++) w->fdone[i] = w->bdone[i] = -1;
    for (int st = 0; st < w->K; st++) w->left[st] = 3 * w->V * w->M;
    return 0;
}

/* The rank that moves next: the earliest clock among those with work that are not waiting
 * for another rank (ties: the lower rank); −1 when none. */
static int next_rank(const greedy *w)
{
    int best = -1;
    for (int st = 0; st < w->K; st++)
        if (w->left[st] > 0 && !w->blocked[st] && (best < 0 || w->t[st] < w->t[best]))
            best = st;
    return best;
}

static int check_greedy_config(const schedule_greedy_config *cfg, int C, int K, int V)
{
    const double *arrays[3] = {cfg->fwd, cfg->bwd_input, cfg->bwd_weight};
    for (int a = 0; a < 3; a++)
        for (int c = 0; arrays[a] && c < C; c++)
            if (!(arrays[a][c] > 0) || !isfinite(arrays[a][c]))
                return pt_error_set("schedule: the %s cost of model chunk %d is %g; costs must "
                                    "be finite and > 0", a == 0 ? "F" : a == 1 ? "B" : "W", c,
                                    arrays[a][c]);
    if (!(cfg->comm >= 0) || !isfinite(cfg->comm))
        return pt_error_set("schedule: message cost %g; must be finite and >= 0", cfg->comm);
    for (int st = 0; cfg->cap && st < K; st++)
        if (cfg->cap[st] < V)
            return pt_error_set("schedule: stage %d may hold %d chunk activations; a "
                                "micro-batch needs %d there (one per chunk of the rank)", st,
                                cfg->cap[st], V);
    return 0;
}

int schedule_init_greedy(schedule *s, const char *name, int stages, int virtual_stages,
                         int placement, int microbatches, const schedule_greedy_config *cfg)
{
    if (schedule_init_empty(s, name, stages, microbatches)) return -1;
    int V = virtual_stages, C = stages * virtual_stages;
    if (!cfg || V < 1 || (placement == SCHED_PLACE_V && V % 2) ||
        (size_t)C * (size_t)microbatches > (size_t)1 << 24) {
        schedule_free(s);
        return pt_error_set("schedule %s: %d chunks per rank%s", name, V,
                            !cfg ? " and no costs" : V % 2 ? " (a V needs an even number)"
                                                           : " is too many");
    }
    if (check_greedy_config(cfg, C, stages, V)) {
        schedule_free(s);
        return -1;
    }
    s->virtual_stages = V;
    s->placement = placement;
    greedy w = {.s = s, .cfg = cfg, .K = stages, .V = V, .M = microbatches, .C = C};
    int rc = greedy_alloc(&w);
    while (!rc) {
        int st = next_rank(&w);
        if (st < 0) break;
        int moved = greedy_step(&w, st);
        if (moved < 0) rc = -1;
        else if (moved)
            for (int q = 0; q < stages; q++) w.blocked[q] = 0;
    }
    for (int st = 0; st < stages && !rc; st++) {
        if (w.left[st] > 0) {
            rc = pt_error_set("schedule %s: stage %d cannot go on with %d ops left: its memory "
                              "cap of %d chunk activations is too small for this order",
                              name, st, w.left[st], cfg->cap ? cfg->cap[st] : -1);
            break;
        }
        rc = push(s, st, SCHED_OP_OPTIMIZER_STEP, 0, -1, -1);
    }
    greedy_free(&w);
    if (rc) schedule_free(s);
    return rc;
}

/* The simulated step of a greedy order at its own costs (the messages' included), and the
 * most a stage idles within its span. */
static int greedy_price(const schedule *s, const schedule_greedy_config *cfg, double *span,
                        double *interior)
{
    int C = s->stages * s->virtual_stages;
    double *ones = malloc((size_t)C * sizeof *ones), *bwd = malloc((size_t)C * sizeof *bwd);
    int rc = ones && bwd ? 0 : pt_error_set("schedule: out of memory");
    for (int c = 0; !rc && c < C; c++) {
        ones[c] = 1.0;
        bwd[c] = cost_of(cfg->bwd_input, c) + cost_of(cfg->bwd_weight, c);
    }
    schedule_costs sc = {.fwd = cfg->fwd ? cfg->fwd : ones, .bwd = bwd,
                         .bwd_input = cfg->bwd_input ? cfg->bwd_input : ones,
                         .bwd_weight = cfg->bwd_weight ? cfg->bwd_weight : ones,
                         .comm_cost = cfg->comm, .replicas = 1};
    schedule_sim sim;
    if (!rc && !(rc = schedule_simulate_costs(s, &sc, &sim))) {
        *span = sim.makespan;
        *interior = sim.interior_idle;
        schedule_sim_free(&sim);
    }
    free(ones);
    free(bwd);
    return rc;
}

int schedule_init_greedy_best(schedule *s, const char *name, int stages, int virtual_stages,
                              int placement, int microbatches,
                              const schedule_greedy_config *cfg)
{
    if (s) memset(s, 0, sizeof *s);
    if (!cfg) return pt_error_set("schedule %s: no costs", name);
    schedule best = {0};
    double best_span = INFINITY, best_in = INFINITY;
    char why[512] = "";
    for (int p = 0; p < SCHED_GREEDY_POLICIES; p++) {
        schedule_greedy_config c = *cfg;
        c.policy = p;
        schedule t;
        double span, in;
        if (schedule_init_greedy(&t, name, stages, virtual_stages, placement, microbatches,
                                 &c)) {
            snprintf(why, sizeof why, "%s", pt_error_get());
            continue;
        }
        if (greedy_price(&t, &c, &span, &in)) {
            snprintf(why, sizeof why, "%s", pt_error_get());
            schedule_free(&t);
            continue;
        }
        /* the shorter step; at equal steps, the less idle inside a stage's span */
        if (span < best_span - 1e-9 || (span < best_span + 1e-9 && in < best_in - 1e-9)) {
            schedule_free(&best);
            best = t;
            best_span = span;
            best_in = in;
        } else {
            schedule_free(&t);
        }
    }
    if (!best.lists) return pt_error_set("%s", why);
    *s = best;
    return 0;
}

/* ---- the named greedy schedules --------------------------------------------------------- */

/* The named schedules' caps (chunk activations per rank). 1F1B's stage 0 holds K
 * micro-batches, V chunk activations each: ZB-V keeps to that (2K), V-Half to half of it
 * (K + 1: one more than half, which the greedy order needs to keep its bubble small), V-Min
 * to a third (⌈2K/3⌉ + 1, at least V). ZB-H2 (one chunk per rank) holds 2K − 1. */
static int named_cap(const char *name, int K, int V)
{
    int cap = 2 * K;
    if (!strcmp(name, "v-half")) cap = K + 1;
    else if (!strcmp(name, "v-min")) cap = (2 * K + 2) / 3 + 1;
    else if (!strcmp(name, "zb-h2")) cap = 2 * K - 1;
    (void)V;
    return cap < V ? V : cap;
}

int schedule_init_zb_v_family(schedule *s, const char *name, int stages, int virtual_stages,
                              int microbatches)
{
    if (s) memset(s, 0, sizeof *s);
    if (stages < 1 || microbatches < 1)
        return pt_error_set("schedule %s: need stages >= 1 and microbatches >= 1 (got %d, %d)",
                            name, stages, microbatches);
    int h2 = !strcmp(name, "zb-h2");
    int V = h2 ? 1 : virtual_stages;
    if (!h2 && V % 2)
        return pt_error_set("schedule %s places model chunks in a V: it needs an even number of "
                            "chunks per rank (--virtual 2, 4, ...; got %d)", name, V);
    int *cap = malloc((size_t)stages * sizeof *cap);
    if (!cap) return pt_error_set("schedule: out of memory");
    for (int st = 0; st < stages; st++) cap[st] = named_cap(name, stages, V);
    schedule_greedy_config cfg = {.cap = cap};
    int rc = schedule_init_greedy_best(s, name, stages, V, h2 ? SCHED_PLACE_INTERLEAVED
                                                               : SCHED_PLACE_V,
                                       microbatches, &cfg);
    free(cap);
    return rc;
}

/* ---- DualPipeV -------------------------------------------------------------------------- */

/* DualPipeV's rank r (DeepSeek, dualpipe/dualpipev.py), in eight phases over P ranks and M
 * >= 2P micro-batches; chunk 0 goes down the ranks, chunk 1 back up. A backward is whole
 * (B) unless the phase splits it (b now, w later from a queue of deferred w's, oldest
 * first, as DualPipe's WeightGradStore). "F&B" runs the forward of one chunk and the
 * backward of the other back to back: the forward's activation is sent (MPI_Isend) before
 * the backward computes, so one micro-batch's message is in flight while the other's
 * backward runs; DualPipe overlaps the two computations as well, which one CPU process per
 * rank cannot. */
typedef struct {
    schedule *s;
    int r, M;
    int nf[2], nb[2];
    int *q, qh, qn; /* deferred w's: chunk·M + m */
} dpv;

static int dpv_f(dpv *d, int v)
{
    return add_forward(d->s, d->r, v, d->nf[v]++);
}

static int dpv_b(dpv *d, int v, int split)
{
    int m = d->nb[v]++;
    if (!split) return add_backward(d->s, d->r, v, m, SCHED_OP_BACKWARD);
    d->q[(d->qh + d->qn++) % (2 * d->M)] = v * d->M + m;
    return add_backward(d->s, d->r, v, m, SCHED_OP_BACKWARD_INPUT);
}

static int dpv_w(dpv *d)
{
    if (!d->qn) return 0;
    int k = d->q[d->qh];
    d->qh = (d->qh + 1) % (2 * d->M);
    d->qn--;
    return push(d->s, d->r, SCHED_OP_BACKWARD_WEIGHT, k / d->M, k % d->M, -1);
}

static int dualpipev_rank(dpv *d, int P)
{
    int r = d->r, M = d->M, rc = 0;
    for (int i = 0; i < 2 * (P - r - 1) && !rc; i++) rc = dpv_f(d, 0);   /* 1: F0 */
    for (int i = 0; i < r + 1 && !rc; i++) rc = dpv_f(d, 0) || dpv_f(d, 1); /* 2: F0 F1 */
    for (int i = 0; i < P - r - 1 && !rc; i++)                          /* 3: b1 w F1 */
        rc = dpv_b(d, 1, 1) || dpv_w(d) || dpv_f(d, 1);
    for (int i = 0; i < M - 2 * P + r + 1 && !rc; i++)                  /* 4: F0&B1 F1&B0 */
        rc = dpv_f(d, 0) || dpv_b(d, 1, 0) || dpv_f(d, 1) || dpv_b(d, 0, 0);
    for (int i = 0; i < P - r - 1 && !rc; i++)                          /* 5: B1 F1&B0 */
        rc = dpv_b(d, 1, 0) || dpv_f(d, 1) || dpv_b(d, 0, 0);
    int split = 0;
    for (int i = 0; i < r + 1 && !rc; i++) {                            /* 6: B1 B0 */
        if (i == (r + 1) / 2 && r % 2 == 1) split = 1;
        rc = dpv_b(d, 1, split);
        if (i == (r + 1) / 2 && r % 2 == 0) split = 1;
        rc = rc || dpv_b(d, 0, split);
    }
    for (int i = 0; i < P - r - 1 && !rc; i++) rc = dpv_w(d) || dpv_b(d, 0, 1); /* 7: w b0 */
    while (d->qn && !rc) rc = dpv_w(d);                                 /* 8: w */
    return rc || push(d->s, r, SCHED_OP_OPTIMIZER_STEP, 0, -1, -1);
}

int schedule_init_dualpipev(schedule *s, int stages, int microbatches)
{
    if (s) memset(s, 0, sizeof *s);
    if (stages >= 1 && microbatches < 2 * stages)
        return pt_error_set("schedule dualpipev needs at least 2 micro-batches per stage: "
                            "--microbatches %d or more with %d stages (got %d)", 2 * stages,
                            stages, microbatches);
    if (schedule_init_empty(s, "dualpipev", stages, microbatches)) return -1;
    s->virtual_stages = 2;
    s->placement = SCHED_PLACE_V;
    int *q = malloc(2 * (size_t)microbatches * sizeof *q);
    int rc = q ? 0 : pt_error_set("schedule: out of memory");
    for (int r = 0; r < stages && !rc; r++) {
        dpv d = {.s = s, .r = r, .M = microbatches, .q = q};
        rc = dualpipev_rank(&d, stages);
    }
    free(q);
    if (rc) schedule_free(s);
    return rc;
}
