/* Printer: each stage's list in a compact notation, then the unit-cost timeline (F = B = R
 * = 1 slot, messages and the optimizer step free), which is the picture the bubble formula
 * describes. */
#include "schedule/schedule.h"

#include "src/base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Compact token for one op: "F3", "B3", "R3", "<a3", ">a3", "<g3", ">g3", "AR", "STEP". */
static void op_token(const schedule_op *op, char *buf, size_t n)
{
    int m = op->microbatch;
    switch (op->kind) {
    case SCHED_OP_FORWARD: snprintf(buf, n, "F%d", m); break;
    case SCHED_OP_BACKWARD: snprintf(buf, n, "B%d", m); break;
    case SCHED_OP_RECOMPUTE: snprintf(buf, n, "R%d", m); break;
    case SCHED_OP_RECV_ACT: snprintf(buf, n, "<a%d", m); break;
    case SCHED_OP_SEND_ACT: snprintf(buf, n, ">a%d", m); break;
    case SCHED_OP_RECV_GRAD: snprintf(buf, n, "<g%d", m); break;
    case SCHED_OP_SEND_GRAD: snprintf(buf, n, ">g%d", m); break;
    case SCHED_OP_ALLREDUCE: snprintf(buf, n, "AR"); break;
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

static void print_lists(const schedule *s, FILE *out)
{
    char tok[32];
    int w = digits(s->stages > 0 ? s->stages - 1 : 0);
    fprintf(out, "schedule '%s': %d stages, %d micro-batches\n", s->name, s->stages,
            s->microbatches);
    fprintf(out, "legend: Fm forward, Bm backward, Rm recompute, <am/>am receive/send "
                 "activation, <gm/>gm receive/send gradient, AR allreduce, STEP optimizer "
                 "step\n");
    for (int st = 0; st < s->stages; st++) {
        fprintf(out, "s%-*d:", w, st);
        for (int i = 0; i < s->lists[st].n_ops; i++) {
            op_token(&s->lists[st].ops[i], tok, sizeof tok);
            fprintf(out, " %s", tok);
        }
        fputc('\n', out);
    }
}

/* Grid of the unit-cost simulation: cell[st * slots + t] is the op index that occupies slot
 * t on stage st, or −1. Only F, B and R take time there, one slot each. */
static void print_timeline(const schedule *s, const schedule_sim *sim, FILE *out)
{
    int slots = (int)lround(sim->makespan);
    int *cell = malloc((size_t)s->stages * (size_t)(slots ? slots : 1) * sizeof *cell);
    if (!cell) {
        fprintf(out, "timeline: not available (out of memory for %d slots)\n", slots);
        return;
    }
    for (size_t i = 0; i < (size_t)s->stages * (size_t)slots; i++)
        cell[i] = -1;
    char tok[32];
    int width = digits(slots > 0 ? slots - 1 : 0);
    for (int st = 0; st < s->stages; st++) {
        for (int i = 0; i < s->lists[st].n_ops; i++) {
            size_t k = (size_t)sim->offset[st] + (size_t)i;
            if (sim->end[k] - sim->start[k] < 0.5)
                continue;
            int t = (int)lround(sim->start[k]);
            if (t >= 0 && t < slots)
                cell[(size_t)st * (size_t)slots + (size_t)t] = i;
            op_token(&s->lists[st].ops[i], tok, sizeof tok);
            if ((int)strlen(tok) > width)
                width = (int)strlen(tok);
        }
    }
    int w = digits(s->stages > 0 ? s->stages - 1 : 0);
    fprintf(out, "timeline (unit costs: F = B = R = 1 slot, messages and step free):\n");
    fprintf(out, "%*s |", w + 1, "t");
    for (int t = 0; t < slots; t++)
        fprintf(out, " %*d", width, t);
    fputc('\n', out);
    for (int st = 0; st < s->stages; st++) {
        fprintf(out, "s%-*d |", w, st);
        for (int t = 0; t < slots; t++) {
            int i = cell[(size_t)st * (size_t)slots + (size_t)t];
            if (i >= 0)
                op_token(&s->lists[st].ops[i], tok, sizeof tok);
            else
                strcpy(tok, ".");
            fprintf(out, " %*s", width, tok);
        }
        fputc('\n', out);
    }
    free(cell);
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
    if (schedule_simulate(s, NULL, NULL, 0.0, 0.0, &sim)) {
        fprintf(out, "timeline: not available (%s)\n", pt_error_get());
        return;
    }
    print_timeline(s, &sim, out);
    fprintf(out, "bubble: %.4f simulated (unit costs), %.4f GPipe formula (K-1)/(M+K-1) "
                 "with K=%d M=%d; makespan %d slots\n",
            sim.bubble, schedule_bubble_theory(s->stages, s->microbatches), s->stages,
            s->microbatches, (int)lround(sim.makespan));
    schedule_sim_free(&sim);
}
