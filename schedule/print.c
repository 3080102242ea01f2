/* Printer: each stage's list in a compact notation, then the unit-cost timeline (every F,
 * B, b, w, R of any chunk = 1 slot, messages and the optimizer step free), which is the
 * picture the bubble formula describes. A stage's reductions together cost one slot there
 * (as much as one backward), enough to show what overlap hides and what it leaves exposed.
 *
 * Chunks: an op of chunk v > 0 carries ".v" after its micro-batch ("F3.1": forward of
 * micro-batch 3 on the rank's chunk 1, model chunk K + s), chunk 0 is unmarked, so lists
 * of schedules with one chunk per rank read as before. Zero bubble's input and weight
 * backwards are "b3" and "w3" (lower case: "B3" is the whole backward and "W1" the wait for
 * bucket 1's reduction). */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Compact token for one op: "F3", "B3", "B3/1" (part 1), "b3", "w3", "w3/1", "R3", "<a3",
 * ">a3", "<g3", ">g3" (".v" after the micro-batch for chunk v > 0: "F3.1", "w3.1/0"),
 * "A1" (start reducing bucket 1), "W1" (wait for it), "STEP". */
static void op_token(const schedule_op *op, char *buf, size_t n)
{
    char m[32];
    if (op->chunk != 0)
        snprintf(m, sizeof m, "%d.%d", op->microbatch, op->chunk);
    else
        snprintf(m, sizeof m, "%d", op->microbatch);
    switch (op->kind) {
    case SCHED_OP_FORWARD: snprintf(buf, n, "F%s", m); break;
    case SCHED_OP_BACKWARD:
    case SCHED_OP_BACKWARD_WEIGHT: {
        char c = op->kind == SCHED_OP_BACKWARD ? 'B' : 'w';
        if (op->bucket >= 0)
            snprintf(buf, n, "%c%s/%d", c, m, op->bucket);
        else
            snprintf(buf, n, "%c%s", c, m);
        break;
    }
    case SCHED_OP_BACKWARD_INPUT: snprintf(buf, n, "b%s", m); break;
    case SCHED_OP_RECOMPUTE: snprintf(buf, n, "R%s", m); break;
    case SCHED_OP_RECV_ACT: snprintf(buf, n, "<a%s", m); break;
    case SCHED_OP_SEND_ACT: snprintf(buf, n, ">a%s", m); break;
    case SCHED_OP_RECV_GRAD: snprintf(buf, n, "<g%s", m); break;
    case SCHED_OP_SEND_GRAD: snprintf(buf, n, ">g%s", m); break;
    case SCHED_OP_ALLREDUCE: snprintf(buf, n, "A%d", op->bucket); break;
    case SCHED_OP_REDUCE_WAIT: snprintf(buf, n, "W%d", op->bucket); break;
    case SCHED_OP_OPTIMIZER_STEP: snprintf(buf, n, "STEP"); break;
    default: snprintf(buf, n, "?%d", (int)op->kind); break;
    }
}

static int digits(int v)
{
    int d = 1;
    while (v >= 10) {
        v /= 10;
        d++;
    }
    return d;
}

static int has_reductions(const schedule *s)
{
    for (int st = 0; st < s->stages; st++)
        if (s->lists[st].buckets > 0)
            return 1;
    return 0;
}

static int has_kind(const schedule *s, schedule_op_kind kind)
{
    for (int st = 0; st < s->stages; st++)
        for (int i = 0; i < s->lists[st].n_ops; i++)
            if (s->lists[st].ops[i].kind == kind)
                return 1;
    return 0;
}

static void print_lists(const schedule *s, FILE *out)
{
    char tok[48];
    int w = digits(s->stages > 0 ? s->stages - 1 : 0);
    fprintf(out, "schedule '%s': %d stages, %d micro-batches", s->name, s->stages,
            s->microbatches);
    if (s->virtual_stages > 1 && s->placement == SCHED_PLACE_V)
        fprintf(out, ", %d chunks per stage in a V (model chunk of stage s, chunk v: v*%d + s "
                "for even v, v*%d + %d - s for odd v)", s->virtual_stages, s->stages,
                s->stages, s->stages - 1);
    else if (s->virtual_stages > 1)
        fprintf(out, ", %d chunks per stage (model chunk of stage s, chunk v: v*%d + s)",
                s->virtual_stages, s->stages);
    fputc('\n', out);
    fprintf(out, "legend: Fm forward, Bm backward, Rm recompute, <am/>am receive/send "
                 "activation, <gm/>gm receive/send gradient, STEP optimizer step\n");
    if (has_kind(s, SCHED_OP_BACKWARD_INPUT) || has_kind(s, SCHED_OP_BACKWARD_WEIGHT))
        fprintf(out, "        bm backward of m's input gradient only (zero bubble), wm its "
                     "weight gradients\n");
    if (s->virtual_stages > 1)
        fprintf(out, "        m.v micro-batch m on the stage's chunk v (no suffix: chunk "
                     "0)\n");
    if (has_reductions(s))
        fprintf(out, "        Bm/b backward of m through bucket b's layers only, Ab start "
                     "reducing bucket b (bucket 0 = the stage's last layers), Wb wait for "
                     "it\n");
    for (int st = 0; st < s->stages; st++) {
        fprintf(out, "s%-*d:", w, st);
        for (int i = 0; i < s->lists[st].n_ops; i++) {
            op_token(&s->lists[st].ops[i], tok, sizeof tok);
            fprintf(out, " %s", tok);
        }
        fputc('\n', out);
    }
}

static double overlap(double a0, double a1, double t)
{
    double lo = a0 > t ? a0 : t, hi = a1 < t + 1 ? a1 : t + 1;
    return hi - lo > 1e-9 ? hi - lo : 0.0;
}

/* Timeline token of op i of stage st: what occupies compute ("F3", "B3" and "w3" also for
 * a part, "b3", "R3", "F3.1" on chunk 1, "W" for a wait), or "" for an op that takes no time
 * there. */
static void cell_token(const schedule_op *op, char *buf, size_t n)
{
    switch (op->kind) {
    case SCHED_OP_FORWARD:
    case SCHED_OP_RECOMPUTE:
    case SCHED_OP_BACKWARD_INPUT:
        op_token(op, buf, n);
        break;
    case SCHED_OP_BACKWARD:
    case SCHED_OP_BACKWARD_WEIGHT: {
        schedule_op whole = *op;
        whole.bucket = -1;
        op_token(&whole, buf, n);
        break;
    }
    case SCHED_OP_REDUCE_WAIT: snprintf(buf, n, "W"); break;
    default: snprintf(buf, n, "%s", ""); break;
    }
}

/* Network row token of slot t: the buckets whose reductions run during it, "A0" or
 * "A0-2" (they run one after another, so a range); "." when none. */
static void net_token(const schedule *s, const schedule_sim *sim, int st, int t, char *buf,
                      size_t n)
{
    int lo = -1, hi = -1;
    for (int i = 0; i < s->lists[st].n_ops; i++) {
        size_t k = (size_t)sim->offset[st] + (size_t)i;
        if (s->lists[st].ops[i].kind != SCHED_OP_ALLREDUCE ||
            !overlap(sim->net_start[k], sim->net_end[k], t))
            continue;
        int b = s->lists[st].ops[i].bucket;
        if (lo < 0 || b < lo)
            lo = b;
        if (b > hi)
            hi = b;
    }
    if (lo < 0)
        snprintf(buf, n, ".");
    else if (lo == hi)
        snprintf(buf, n, "A%d", lo);
    else
        snprintf(buf, n, "A%d-%d", lo, hi);
}

/* Grid of the unit-cost simulation: cell[st * slots + t] is the op index that occupies the
 * most of slot t on stage st (F, B or its parts, R, or a wait for a reduction), or −1. */
static void print_timeline(const schedule *s, const schedule_sim *sim, FILE *out)
{
    int slots = (int)ceil(sim->makespan - 1e-9);
    if (slots < 0)
        slots = 0;
    size_t cells = (size_t)s->stages * (size_t)(slots ? slots : 1);
    int *cell = malloc(cells * sizeof *cell);
    double *best = calloc(cells, sizeof *best);
    if (!cell || !best) {
        fprintf(out, "timeline: not available (out of memory for %d slots)\n", slots);
        free(cell);
        free(best);
        return;
    }
    for (size_t i = 0; i < cells; i++)
        cell[i] = -1;
    char tok[48];
    int width = digits(slots > 0 ? slots - 1 : 0);
    for (int st = 0; st < s->stages; st++) {
        for (int i = 0; i < s->lists[st].n_ops; i++) {
            size_t k = (size_t)sim->offset[st] + (size_t)i;
            cell_token(&s->lists[st].ops[i], tok, sizeof tok);
            if (!tok[0])
                continue;
            for (int t = (int)floor(sim->start[k]); t < slots && t < sim->end[k]; t++) {
                double o = overlap(sim->start[k], sim->end[k], t);
                size_t c = (size_t)st * (size_t)slots + (size_t)t;
                if (t >= 0 && o > best[c]) {
                    best[c] = o;
                    cell[c] = i;
                    if ((int)strlen(tok) > width)
                        width = (int)strlen(tok);
                }
            }
        }
        for (int t = 0; t < slots && s->lists[st].buckets > 0; t++) {
            net_token(s, sim, st, t, tok, sizeof tok);
            if ((int)strlen(tok) > width)
                width = (int)strlen(tok);
        }
    }
    int w = digits(s->stages > 0 ? s->stages - 1 : 0);
    const char *units = has_kind(s, SCHED_OP_BACKWARD_INPUT) ? "F = b = w = R = 1 slot"
                        : s->virtual_stages > 1            ? "F = B = R = 1 slot per chunk"
                                                           : "F = B = R = 1 slot";
    if (has_reductions(s))
        fprintf(out, "timeline (unit costs: %s, a stage's reductions 1 slot together, "
                     "messages and step free; row nK: stage K's network, W: compute waits "
                     "for it):\n", units);
    else
        fprintf(out, "timeline (unit costs: %s, messages and step free):\n", units);
    fprintf(out, "%*s |", w + 1, "t");
    for (int t = 0; t < slots; t++)
        fprintf(out, " %*d", width, t);
    fputc('\n', out);
    for (int st = 0; st < s->stages; st++) {
        fprintf(out, "s%-*d |", w, st);
        for (int t = 0; t < slots; t++) {
            int i = cell[(size_t)st * (size_t)slots + (size_t)t];
            if (i >= 0)
                cell_token(&s->lists[st].ops[i], tok, sizeof tok);
            else
                strcpy(tok, ".");
            fprintf(out, " %*s", width, tok);
        }
        fputc('\n', out);
        if (s->lists[st].buckets == 0)
            continue;
        fprintf(out, "n%-*d |", w, st);
        for (int t = 0; t < slots; t++) {
            net_token(s, sim, st, t, tok, sizeof tok);
            fprintf(out, " %*s", width, tok);
        }
        fputc('\n', out);
    }
    free(cell);
    free(best);
}

/* The unit-cost simulation the timeline draws: every compute op of any chunk 1 slot, each
 * bucket's reduction 1/B slot. */
static int simulate_units(const schedule *s, schedule_sim *sim)
{
    if (s->stages < 1 || s->virtual_stages < 1)
        return pt_error_set("schedule '%s' has %d stages and %d chunks per stage", s->name,
                            s->stages, s->virtual_stages);
    size_t n = (size_t)s->stages * (size_t)s->virtual_stages;
    double **rows = calloc((size_t)s->stages, sizeof *rows);
    double *ones = malloc(n * sizeof *ones);
    int rc = -1;
    if (!rows || !ones) {
        free(rows);
        free(ones);
        pt_error_set("out of memory");
        return -1;
    }
    for (size_t k = 0; k < n; k++)
        ones[k] = 1.0;
    /* a list with whole and split backwards (dualpipev): a whole B costs b + w */
    double *twos = NULL;
    if (has_kind(s, SCHED_OP_BACKWARD) && has_kind(s, SCHED_OP_BACKWARD_INPUT)) {
        twos = malloc(n * sizeof *twos);
        if (!twos) {
            free(rows);
            free(ones);
            return pt_error_set("out of memory");
        }
        for (size_t k = 0; k < n; k++) twos[k] = 2.0;
    }
    for (int st = 0; st < s->stages; st++) {
        int B = s->lists[st].buckets;
        if (B <= 0)
            continue;
        rows[st] = malloc((size_t)B * sizeof *rows[st]);
        if (!rows[st]) {
            pt_error_set("out of memory");
            goto done;
        }
        for (int b = 0; b < B; b++)
            rows[st][b] = 1.0 / B;
    }
    /* ring all-reduce among 2 replicas with alpha 0: time = bytes / beta */
    schedule_costs c = {.fwd = ones, .bwd = twos ? twos : ones, .bwd_input = ones,
                        .bwd_weight = ones,
                        .replicas = 2, .alpha = 0.0, .beta = 1.0,
                        .bucket_bytes = (const double *const *)rows};
    rc = schedule_simulate_costs(s, &c, sim);
done:
    for (int st = 0; st < s->stages; st++)
        free(rows[st]);
    free(rows);
    free(ones);
    free(twos);
    return rc;
}

void schedule_print(const schedule *s, FILE *out)
{
    if (!out)
        return;
    if (!s || !s->lists) {
        fprintf(out, "schedule: (not initialised)\n");
        return;
    }
    print_lists(s, out);
    schedule_sim sim;
    if (simulate_units(s, &sim)) {
        fprintf(out, "timeline: not available (%s)\n", pt_error_get());
        return;
    }
    print_timeline(s, &sim, out);
    char span[32];
    if (fabs(sim.makespan - round(sim.makespan)) < 1e-9)
        snprintf(span, sizeof span, "%d", (int)lround(sim.makespan));
    else
        snprintf(span, sizeof span, "%.2f", sim.makespan);
    const char *formula = NULL;
    double want = schedule_bubble_formula(s, &formula);
    if (!formula) { /* hand-built: GPipe's for comparison */
        want = schedule_bubble_theory(s->stages, s->microbatches);
        formula = "(K-1)/(M+K-1) (GPipe)";
    }
    int extra = has_reductions(s) || has_kind(s, SCHED_OP_RECOMPUTE);
    fprintf(out, "bubble (idle share of the step): %.4f simulated (unit costs), %.4f formula "
                 "%s with K=%d V=%d M=%d%s; makespan %s slots\n",
            sim.bubble, want, formula, s->stages, s->virtual_stages, s->microbatches,
            extra ? " (for the lists without R and reductions)" : "", span);
    if (s->placement == SCHED_PLACE_V || !strcmp(s->name, "zb-h2"))
        fprintf(out, "most idle inside one stage's span (first op to step): %.2f slots (the "
                     "Zero Bubble and DualPipe papers' bubble)\n", sim.interior_idle);
    if (has_reductions(s)) {
        fprintf(out, "reductions (unit costs), exposed / total per stage:");
        for (int st = 0; st < s->stages; st++)
            fprintf(out, " %.2f/%.2f", sim.exposed[st], sim.reduce[st]);
        fputc('\n', out);
    }
    schedule_sim_free(&sim);
}
