/* Receive buffers by liveness (schedule_receive_buffers in schedule.h). */
#include <stdlib.h>

#include "schedule/schedule.h"
#include "src/base/error.h"

static int uses_input(schedule_op_kind k)
{
    return k == SCHED_OP_RECV_ACT || k == SCHED_OP_RECV_GRAD || k == SCHED_OP_FORWARD ||
           k == SCHED_OP_RECOMPUTE || k == SCHED_OP_BACKWARD ||
           k == SCHED_OP_BACKWARD_INPUT || k == SCHED_OP_BACKWARD_WEIGHT;
}

/* Whether n buffers suffice: for every m ≥ n, m − n's last op comes before m's receive. */
static int enough(const int *last, const int *recv_act, const int *recv_grad, int M, int n)
{
    for (int m = n; m < M; m++) {
        if (recv_act[m] >= 0 && last[m - n] >= recv_act[m]) return 0;
        if (recv_grad[m] >= 0 && last[m - n] >= recv_grad[m]) return 0;
    }
    return 1;
}

int schedule_receive_buffers(const schedule *s, int stage, int chunk, int least, int *post_after)
{
    const schedule_list *l = &s->lists[stage];
    int M = s->microbatches;
    int *last = malloc((size_t)M * 3 * sizeof *last);
    if (!last) return pt_error_set("out of memory");
    int *recv_act = last + M, *recv_grad = last + 2 * M;
    for (int m = 0; m < M; m++) last[m] = recv_act[m] = recv_grad[m] = -1;
    for (int i = 0; i < l->n_ops; i++) {
        const schedule_op *op = &l->ops[i];
        if (op->chunk != chunk || op->microbatch < 0 || op->microbatch >= M ||
            !uses_input(op->kind))
            continue;
        int m = op->microbatch;
        if (i > last[m]) last[m] = i;
        if (op->kind == SCHED_OP_RECV_ACT) recv_act[m] = i;
        if (op->kind == SCHED_OP_RECV_GRAD) recv_grad[m] = i;
    }
    int n = least < 1 ? 1 : least;
    while (n < M && !enough(last, recv_act, recv_grad, M, n)) n++;
    for (int m = 0; post_after && m < M; m++) post_after[m] = m < n ? -1 : last[m - n];
    free(last);
    return n;
}
