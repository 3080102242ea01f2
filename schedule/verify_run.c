/* Verifier, global part: the lists run together (deadlock freedom), the memory each stage
 * needs (peaks), and the replicas' agreement on the order of their collectives. The local
 * checks are in verify.c. */
#include "schedule/verify_internal.h"

#include "src/base/error.h"

#include <stdlib.h>
#include <string.h>

/* Pass 4: run all lists with a program counter each. A receive may pass once the peer's
 * matching send (on the chunk the routing names) has executed; sends never wait. Neither
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
                int is_recv = op->kind == SCHED_OP_RECV_ACT || op->kind == SCHED_OP_RECV_GRAD;
                if (is_recv) {
                    int pv = verify_peer_chunk(c, op->kind, st, op->chunk);
                    int sent = *verify_pos(c, op->peer, pv, verify_matching_kind(op->kind),
                                           op->microbatch);
                    if (pc[op->peer] <= sent)
                        break;
                }
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
        verify_describe(c, &s->lists[st].ops[pc[st]], d, sizeof d);
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

/* The op that ends (chunk, m)'s hold on its activations and input: its last backward op. */
static int releases(const schedule_op *op, int buckets)
{
    return (op->kind == SCHED_OP_BACKWARD || op->kind == SCHED_OP_BACKWARD_WEIGHT) &&
           (op->bucket == -1 || op->bucket == buckets - 1);
}

/* Walks each list once, counting per chunk the micro-batches held (activations: from
 * FORWARD, or RECOMPUTE on a recomputing list; inputs: from FORWARD) until their last
 * backward op, and the rank's sums of both at every moment. */
static int compute_peaks(const schedule *s, schedule_report *r)
{
    int K = s->stages, V = s->virtual_stages;
    size_t kv = (size_t)K * (size_t)V;
    r->stages = K;
    r->virtual_stages = V;
    r->peak_inflight = calloc((size_t)K, sizeof *r->peak_inflight);
    r->peak_inputs = calloc((size_t)K, sizeof *r->peak_inputs);
    r->peak_inflight_chunk = calloc(kv, sizeof *r->peak_inflight_chunk);
    r->peak_inputs_chunk = calloc(kv, sizeof *r->peak_inputs_chunk);
    int *act = calloc((size_t)V, sizeof *act), *in = calloc((size_t)V, sizeof *in);
    if (!r->peak_inflight || !r->peak_inputs || !r->peak_inflight_chunk ||
        !r->peak_inputs_chunk || !act || !in) {
        free(act);
        free(in);
        return pt_error_set("schedule_verify: out of memory");
    }
    for (int st = 0; st < K; st++) {
        const schedule_list *l = &s->lists[st];
        int *pa = &r->peak_inflight_chunk[(size_t)st * V], *pi = &r->peak_inputs_chunk[(size_t)st * V];
        int act_sum = 0, in_sum = 0;
        memset(act, 0, (size_t)V * sizeof *act);
        memset(in, 0, (size_t)V * sizeof *in);
        for (int i = 0; i < l->n_ops; i++) {
            const schedule_op *op = &l->ops[i];
            int v = op->chunk;
            int acquire = op->kind == (l->recompute ? SCHED_OP_RECOMPUTE : SCHED_OP_FORWARD);
            int keep_input = op->kind == SCHED_OP_FORWARD;
            int rel = releases(op, l->buckets);
            /* with recomputation a forward still needs its activations while it runs:
             * one more slot for that moment */
            int moment = l->recompute && op->kind == SCHED_OP_FORWARD;
            act[v] += acquire - rel;
            act_sum += acquire - rel;
            in[v] += keep_input - rel;
            in_sum += keep_input - rel;
            if (act[v] + moment > pa[v])
                pa[v] = act[v] + moment;
            if (in[v] > pi[v])
                pi[v] = in[v];
            if (act_sum + moment > r->peak_inflight[st])
                r->peak_inflight[st] = act_sum + moment;
            if (in_sum > r->peak_inputs[st])
                r->peak_inputs[st] = in_sum;
        }
    }
    free(act);
    free(in);
    return 0;
}

int schedule_verify(const schedule *s, schedule_report *report)
{
    if (report)
        memset(report, 0, sizeof *report);
    verify_ctx c;
    int rc = -1;
    if (verify_ctx_check(&c, s) || check_deadlock(&c))
        goto done;
    if (report && compute_peaks(s, report)) {
        schedule_report_free(report);
        goto done;
    }
    rc = 0;
done:
    verify_ctx_free(&c);
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
        if (verify_ctx_check(&cs[r], per_replica[r]) || check_deadlock(&cs[r])) {
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
        verify_ctx_free(&cs[q]);
    free(cs);
    return rc;
}

void schedule_report_free(schedule_report *r)
{
    if (!r)
        return;
    free(r->peak_inflight);
    free(r->peak_inflight_chunk);
    free(r->peak_inputs_chunk);
    free(r->peak_inputs);
    memset(r, 0, sizeof *r);
}
