/* Shared between verify.c (per-op, message and order checks) and verify_run.c (the
 * deadlock run, the memory peaks, the replicas): the position tables of one schedule. */
#ifndef PT_SCHEDULE_VERIFY_INTERNAL_H
#define PT_SCHEDULE_VERIFY_INTERNAL_H

#include "schedule/schedule.h"

#include <stddef.h>

/* Ops whose backward may be split into bucket parts; index into last/parts. */
enum { VERIFY_SPLIT_BACKWARD = 0, VERIFY_SPLIT_WEIGHT = 1, VERIFY_SPLITS = 2 };

/* pos[((stage * V + chunk) * SCHED_OP_COUNT + kind) * M + m]: index of the op (kind, chunk,
 * m) in the stage's list, or −1. Only per-micro-batch kinds are stored; duplicates are
 * rejected before. For BACKWARD and BACKWARD_WEIGHT it is m's first op (whole or part 0). */
typedef struct {
    const schedule *s;
    int K, V, M;
    int *pos;
    int *last;      /* [((stage * V + chunk) * VERIFY_SPLITS + split) * M + m]: m's last
                     * BACKWARD / BACKWARD_WEIGHT op (whole, or its last part) */
    int *parts;     /* same index: parts of m seen; −1 once it ran whole */
    size_t *boff;   /* [stage]: the stage's first bucket in ar/wait; boff[K]: all buckets */
    int *ar, *wait; /* [boff[stage] + b]: index of ALLREDUCE b / REDUCE_WAIT b, or −1 */
} verify_ctx;

int *verify_pos(const verify_ctx *c, int stage, int chunk, schedule_op_kind kind, int m);
/* "send_act m=3 to stage 2", "F m=0", "w m=1 chunk 1 part 0": what messages call an op. */
const char *verify_describe(const verify_ctx *c, const schedule_op *op, char *buf, size_t n);
/* The kind that completes a message: SEND_ACT <-> RECV_ACT, SEND_GRAD <-> RECV_GRAD;
 * SCHED_OP_COUNT for other ops. */
schedule_op_kind verify_matching_kind(schedule_op_kind kind);
/* The chunk on the peer at the other end of a message op of (stage, chunk): −1 if none. */
int verify_peer_chunk(const verify_ctx *c, schedule_op_kind kind, int stage, int chunk);
/* Tables for s, then the per-op, message and order checks; ctx_free in any case. */
int verify_ctx_check(verify_ctx *c, const schedule *s);
void verify_ctx_free(verify_ctx *c);

#endif
