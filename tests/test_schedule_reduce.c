/* Schedule IR: reductions (hybrid mode): the passes that add them to gpipe, 1f1b and
 * interleaved lists, the verifier's checks of them, their simulation and printing. */
#include "tests/schedule_build.h"

/* ---- reductions (hybrid mode) ------------------------------------------------------------ */

static void check_reduction_lists(const schedule *s, int B, int overlap, const char *what)
{
    int M = s->microbatches;
    for (int st = 0; st < s->stages; st++) {
        const schedule_list *l = &s->lists[st];
        cr_assert_eq(l->buckets, B, "%s stage %d: %d buckets", what, st, l->buckets);
        int n = l->n_ops, ar[8], wait[8], parts = 0, wholes = 0;
        for (int b = 0; b < B; b++)
            ar[b] = wait[b] = -1;
        for (int i = 0; i < n; i++) {
            const schedule_op *op = &l->ops[i];
            if (op->kind == SCHED_OP_ALLREDUCE) {
                cr_assert_eq(ar[op->bucket], -1, "%s stage %d: two allreduce %d", what, st,
                             op->bucket);
                ar[op->bucket] = i;
            } else if (op->kind == SCHED_OP_REDUCE_WAIT) {
                cr_assert_eq(wait[op->bucket], -1);
                wait[op->bucket] = i;
            } else if (op->kind == SCHED_OP_BACKWARD && op->bucket >= 0) {
                cr_assert_eq(op->microbatch, M - 1, "%s stage %d: part of B m=%d", what, st,
                             op->microbatch);
                cr_assert_eq(op->bucket, parts++, "%s stage %d: parts out of order", what, st);
            } else if (op->kind == SCHED_OP_BACKWARD) {
                wholes++;
            } else {
                cr_assert_eq(op->bucket, -1, "%s stage %d op %d: bucket set", what, st, i);
            }
        }
        int split = overlap && B > 1;
        cr_assert_eq(parts, split ? B : 0, "%s stage %d: %d parts", what, st, parts);
        cr_assert_eq(wholes, split ? M - 1 : M, "%s stage %d: %d whole backwards", what, st,
                     wholes);
        for (int b = 0; b < B; b++) {
            /* the waits in bucket order just before the step */
            cr_assert_eq(wait[b], n - 1 - B + b, "%s stage %d: W%d at op %d", what, st, b,
                         wait[b]);
            if (!overlap) {
                cr_assert_eq(ar[b], n - 1 - 2 * B + b, "%s stage %d: A%d at op %d", what, st,
                             b, ar[b]);
                continue;
            }
            /* right after its part (or the whole last backward), or after the last part's
             * gradient send */
            const schedule_op *prev = &l->ops[ar[b] - 1];
            if (prev->kind == SCHED_OP_SEND_GRAD) {
                cr_assert_eq(b, B - 1);
                prev = &l->ops[ar[b] - 2];
            }
            cr_assert(prev->kind == SCHED_OP_BACKWARD && prev->microbatch == M - 1 &&
                          prev->bucket == (split ? b : -1),
                      "%s stage %d: A%d at op %d does not follow its part", what, st, b,
                      ar[b]);
        }
    }
}

Test(schedule, reductions_generators_verify)
{
    const char *names[] = {"gpipe", "1f1b"};
    for (int n = 0; n < 2; n++)
        for (int K = 1; K <= 4; K++)
            for (int M = 1; M <= 8; M++)
                for (int B = 1; B <= 4; B++)
                    for (int overlap = 0; overlap <= 1; overlap++) {
                        char what[64];
                        snprintf(what, sizeof what, "%s K=%d M=%d B=%d overlap=%d", names[n],
                                 K, M, B, overlap);
                        schedule plain, s;
                        cr_assert_eq(schedule_init_by_name(&plain, names[n], K, M), 0);
                        cr_assert_eq(schedule_init_by_name(&s, names[n], K, M), 0);
                        cr_assert_eq(schedule_add_reductions(&s, B, overlap), 0, "%s: %s",
                                     what, pt_error_get());
                        schedule_report r, rp;
                        cr_assert_eq(schedule_verify(&s, &r), 0, "%s: %s", what,
                                     pt_error_get());
                        cr_assert_eq(schedule_verify(&plain, &rp), 0);
                        check_reduction_lists(&s, B, overlap, what);
                        for (int st = 0; st < K; st++) {
                            cr_assert_eq(r.peak_inflight[st], rp.peak_inflight[st],
                                         "%s stage %d: peak in-flight changed", what, st);
                            cr_assert_eq(s.lists[st].n_ops, plain.lists[st].n_ops + 2 * B +
                                                                (overlap && B > 1 ? B - 1 : 0));
                        }
                        const schedule *reps[3] = {&s, &s, &s};
                        cr_assert_eq(schedule_verify_replicas(reps, 3), 0, "%s: %s", what,
                                     pt_error_get());
                        /* Free reductions (one replica, or no bytes and no latency) leave
                         * the step as long as without them. */
                        double fwd[4] = {1.5, 2, 1, 3}, bwd[4] = {3, 2.5, 4, 1};
                        schedule_sim a, b, c;
                        cr_assert_eq(schedule_simulate(&plain, fwd, bwd, 0.25, 1, &a), 0);
                        cr_assert_eq(schedule_simulate(&s, fwd, bwd, 0.25, 1, &b), 0, "%s: %s",
                                     what, pt_error_get());
                        schedule_costs free_net = {.fwd = fwd, .bwd = bwd, .comm_cost = 0.25,
                                                   .step_cost = 1, .replicas = 4,
                                                   .alpha = 0, .beta = 1e9};
                        cr_assert_eq(schedule_simulate_costs(&s, &free_net, &c), 0, "%s: %s",
                                     what, pt_error_get());
                        CHECK_CLOSE(what, &b.makespan, &a.makespan, 1, 1e-9, 0);
                        CHECK_CLOSE(what, &c.makespan, &a.makespan, 1, 1e-9, 0);
                        CHECK_CLOSE(what, b.busy, a.busy, K, 1e-9, 0);
                        for (int st = 0; st < K; st++)
                            cr_assert(b.exposed[st] == 0 && b.reduce[st] == 0 &&
                                          c.exposed[st] < 1e-9 && c.reduce[st] == 0,
                                      "%s stage %d: free reductions cost", what, st);
                        schedule_sim_free(&a);
                        schedule_sim_free(&b);
                        schedule_sim_free(&c);
                        schedule_report_free(&r);
                        schedule_report_free(&rp);
                        schedule_free(&plain);
                        schedule_free(&s);
                    }
}

Test(schedule, reductions_exact_lists)
{
    schedule got, want;
    cr_assert_eq(schedule_init_gpipe(&got, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&got, 2, 1), 0, "%s", pt_error_get());
    build(&want, 2, 2, "F0 >a0 F1 >a1 <g0 B0 <g1 B1/0 A0 B1/1 A1 W0 W1 STEP",
          "<a0 F0 <a1 F1 B0 >g0 B1/0 A0 B1/1 >g1 A1 W0 W1 STEP");
    set_buckets(&want, 2);
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);

    cr_assert_eq(schedule_init_1f1b(&got, 2, 3), 0);
    cr_assert_eq(schedule_add_reductions(&got, 3, 0), 0, "%s", pt_error_get());
    build(&want, 2, 3, "F0 >a0 F1 >a1 <g0 B0 F2 >a2 <g1 B1 <g2 B2 A0 A1 A2 W0 W1 W2 STEP",
          "<a0 F0 B0 >g0 <a1 F1 B1 >g1 <a2 F2 B2 >g2 A0 A1 A2 W0 W1 W2 STEP");
    set_buckets(&want, 3);
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);

    /* One bucket with overlap: the last backward stays whole, its reduction starts at once */
    cr_assert_eq(schedule_init_1f1b(&got, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&got, 1, 1), 0, "%s", pt_error_get());
    build(&want, 2, 2, "F0 >a0 F1 >a1 <g0 B0 <g1 B1 A0 W0 STEP",
          "<a0 F0 B0 >g0 <a1 F1 B1 >g1 A0 W0 STEP");
    set_buckets(&want, 1);
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);

    /* A stage without parameters (0 buckets) gets no reductions. */
    cr_assert_eq(schedule_init_gpipe(&got, 3, 1), 0);
    int per[3] = {2, 0, 1};
    cr_assert_eq(schedule_add_reductions_per_stage(&got, per, 1), 0, "%s", pt_error_get());
    build(&want, 3, 1, "F0 >a0 <g0 B0/0 A0 B0/1 A1 W0 W1 STEP",
          "<a0 F0 >a0 <g0 B0 >g0 STEP", "<a0 F0 B0 >g0 A0 W0 STEP");
    want.lists[0].buckets = 2;
    want.lists[2].buckets = 1;
    expect_same_ops(&got, &want);
    cr_assert_eq(schedule_verify(&got, NULL), 0, "%s", pt_error_get());
    schedule_free(&got);
    schedule_free(&want);
}

Test(schedule, add_reductions_errors)
{
    schedule s;
    cr_assert_eq(schedule_init_gpipe(&s, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&s, 0, 1), -1);
    cr_assert(strstr(pt_error_get(), "buckets >= 1 (got 0)"), "%s", pt_error_get());
    int per[2] = {1, -1};
    cr_assert_eq(schedule_add_reductions_per_stage(&s, per, 1), -1);
    cr_assert(strstr(pt_error_get(), "stage 1 has -1 buckets"), "%s", pt_error_get());
    cr_assert_eq(s.lists[0].buckets, 0, "a failed call changed the schedule");
    cr_assert_eq(schedule_add_reductions(&s, 2, 1), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 1), -1);
    cr_assert(strstr(pt_error_get(), "stage 0 has reductions already"), "%s", pt_error_get());
    cr_assert_eq(schedule_add_reductions(NULL, 2, 1), -1);
    schedule_free(&s);
}

Test(schedule, verify_missing_reduction)
{
    schedule s;
    cr_assert_eq(schedule_init_1f1b(&s, 3, 4), 0);
    cr_assert_eq(schedule_add_reductions(&s, 3, 1), 0);
    remove_op(&s, 1, find_bucket_op(&s, 1, SCHED_OP_ALLREDUCE, -1, 1));
    expect_invalid(&s, "missing allreduce", "stage 1: bucket 1 of 3 is never reduced",
                   "no allreduce bucket 1");
    schedule_free(&s);
    /* both ends gone: the same */
    cr_assert_eq(schedule_init_gpipe(&s, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 0), 0);
    remove_op(&s, 0, find_bucket_op(&s, 0, SCHED_OP_ALLREDUCE, -1, 1));
    remove_op(&s, 0, find_bucket_op(&s, 0, SCHED_OP_REDUCE_WAIT, -1, 1));
    expect_invalid(&s, "missing bucket", "stage 0: bucket 1 of 2 is never reduced", NULL);
    schedule_free(&s);
    cr_assert_eq(schedule_init_gpipe(&s, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&s, 3, 1), 0);
    remove_op(&s, 1, find_bucket_op(&s, 1, SCHED_OP_REDUCE_WAIT, -1, 2));
    expect_invalid(&s, "missing wait", "stage 1: the reduction of bucket 2",
                   "is never waited for (no reduce_wait bucket 2 before the optimizer_step)");
    schedule_free(&s);
}

Test(schedule, verify_reduction_before_last_backward)
{
    schedule s;
    /* ALLREDUCE 0 moved before the last micro-batch's backward (its part 0) */
    cr_assert_eq(schedule_init_gpipe(&s, 2, 3), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 1), 0);
    move_op(&s, 0, find_bucket_op(&s, 0, SCHED_OP_ALLREDUCE, -1, 0),
            find_bucket_op(&s, 0, SCHED_OP_BACKWARD, 2, 0));
    expect_invalid(&s, "allreduce before part", "stage 0 op 11: allreduce bucket 0 comes before "
                   "B m=2 part 0 (op 12), which adds to its gradients", NULL);
    schedule_free(&s);
    /* without overlap: before the last whole backward */
    cr_assert_eq(schedule_init_1f1b(&s, 2, 3), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 0), 0);
    move_op(&s, 1, find_bucket_op(&s, 1, SCHED_OP_ALLREDUCE, -1, 1),
            find_op(&s, 1, SCHED_OP_BACKWARD, 2));
    expect_invalid(&s, "allreduce before backward", "allreduce bucket 1 comes before B m=2",
                   NULL);
    schedule_free(&s);
    /* a part of bucket 1 counts for bucket 1 only: A0 may precede it, A1 may not */
    build(&s, 1, 1, "F0 B0/0 A0 A1 B0/1 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "allreduce before its part", "op 3: allreduce bucket 1 comes before "
                   "B m=0 part 1 (op 4)", NULL);
    schedule_free(&s);
}

Test(schedule, verify_reduction_mistakes)
{
    schedule s;
    build(&s, 1, 1, "F0 B0 A0 STEP W0");
    set_buckets(&s, 1);
    expect_invalid(&s, "wait after step", "stage 0 op 4 (reduce_wait bucket 0): comes after "
                   "the optimizer_step at op 3, which needs every bucket reduced", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 W0 A0 STEP");
    set_buckets(&s, 1);
    expect_invalid(&s, "wait before start", "op 2: reduce_wait bucket 0 comes before its "
                   "allreduce (op 3)", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 A0 A0 W0 STEP");
    set_buckets(&s, 1);
    expect_invalid(&s, "duplicate allreduce", "op 3: duplicate allreduce bucket 0 (first at "
                   "op 2)", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 A0 A2 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "bucket out of range", "op 3 (allreduce bucket 2): bucket 2 out of "
                   "range [0, 2)", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 A0 W0 STEP");
    expect_invalid(&s, "no buckets", "op 2 (allreduce bucket 0): the stage has no buckets",
                   NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0/0 STEP");
    expect_invalid(&s, "part without buckets", "the stage has no buckets", "no backward parts");
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0/1 B0/0 A0 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "parts out of order", "op 1 (B m=0 part 1): part 0 is due first", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0/0 B0/0 A0 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "duplicate part", "op 2: duplicate B m=0 part 0", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 B0/0 A0 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "whole and part", "micro-batch 0 was backwarded whole at op 1", NULL);
    schedule_free(&s);
    build(&s, 1, 2, "F0 F1 B0 B1/0 A0 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "unfinished split", "op 3: the backward of m=1 is split but stops after "
                   "part 0 (no B m=1 part 1 of 2)", NULL);
    schedule_free(&s);
    build(&s, 2, 1, "F0 >a0 <g0 B0 A0 W0 STEP", "<a0 F0 B0/0 >g0 B0/1 A0 A1 W0 W1 STEP");
    s.lists[0].buckets = 1;
    s.lists[1].buckets = 2;
    expect_invalid(&s, "gradient sent before the last part", "stage 1 op 3: send_grad m=0 comes "
                   "before the last part of B m=0 that produces it (op 4)", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 STEP");
    s.lists[0].ops[0].bucket = 0;
    expect_invalid(&s, "bucket on a forward", "op 0 (F m=0): bucket must be -1, got 0", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 A0 W0 STEP");
    set_buckets(&s, 3);
    expect_invalid(&s, "more buckets than ops allow", "stage 0: bucket 1 of 3 is never reduced",
                   NULL);
    s.lists[0].buckets = 6;
    expect_invalid(&s, "absurd bucket count", "6 buckets for a list of 5 ops", NULL);
    schedule_free(&s);
}

Test(schedule, verify_replicas)
{
    schedule a, b;
    cr_assert_eq(schedule_init_1f1b(&a, 3, 4), 0);
    cr_assert_eq(schedule_add_reductions(&a, 3, 1), 0);
    cr_assert_eq(schedule_init_1f1b(&b, 3, 4), 0);
    cr_assert_eq(schedule_add_reductions(&b, 3, 0), 0);
    /* Overlap on one replica and off on the other: waits differ, starts agree. */
    const schedule *reps[2] = {&a, &b};
    cr_assert_eq(schedule_verify_replicas(reps, 2), 0, "%s", pt_error_get());
    /* Replica 1 of stage 1 starts bucket 1 before bucket 0: alone it is a fine schedule. */
    int a0 = find_bucket_op(&b, 1, SCHED_OP_ALLREDUCE, -1, 0);
    int a1 = find_bucket_op(&b, 1, SCHED_OP_ALLREDUCE, -1, 1);
    b.lists[1].ops[a0].bucket = 1;
    b.lists[1].ops[a1].bucket = 0;
    cr_assert_eq(schedule_verify(&b, NULL), 0, "%s", pt_error_get());
    pt_error_clear();
    cr_assert_eq(schedule_verify_replicas(reps, 2), -1, "swapped buckets accepted");
    cr_assert(strstr(pt_error_get(), "replica 1 stage 1 op 24: starts the reduction of bucket 1 "
                                     "where replica 0 starts bucket 0 (op 23"),
              "%s", pt_error_get());
    cr_assert(strstr(pt_error_get(), "same order"), "%s", pt_error_get());
    schedule_free(&b);
    /* Different bucket counts. */
    cr_assert_eq(schedule_init_1f1b(&b, 3, 4), 0);
    cr_assert_eq(schedule_add_reductions(&b, 2, 1), 0);
    cr_assert_eq(schedule_verify_replicas(reps, 2), -1);
    cr_assert(strstr(pt_error_get(), "replica 1 stage 0: 2 buckets, replica 0 has 3"), "%s",
              pt_error_get());
    schedule_free(&b);
    /* A replica that is wrong on its own. */
    cr_assert_eq(schedule_init_1f1b(&b, 3, 4), 0);
    cr_assert_eq(schedule_add_reductions(&b, 3, 1), 0);
    remove_op(&b, 2, find_bucket_op(&b, 2, SCHED_OP_ALLREDUCE, -1, 0));
    cr_assert_eq(schedule_verify_replicas(reps, 2), -1);
    cr_assert(strstr(pt_error_get(), "replica 1: schedule '1f1b' stage 2: bucket 0 of 3 is "
                                     "never reduced"),
              "%s", pt_error_get());
    schedule_free(&b);
    /* A different pipeline. */
    cr_assert_eq(schedule_init_1f1b(&b, 2, 4), 0);
    cr_assert_eq(schedule_add_reductions(&b, 3, 1), 0);
    cr_assert_eq(schedule_verify_replicas(reps, 2), -1);
    cr_assert(strstr(pt_error_get(), "replica 1: 2 stages, replica 0 has 3"), "%s",
              pt_error_get());
    schedule_free(&b);
    cr_assert_eq(schedule_verify_replicas(reps, 0), -1);
    cr_assert_eq(schedule_verify_replicas(reps, 1), 0, "%s", pt_error_get());
    schedule_free(&a);
}

Test(schedule, simulate_reductions_by_hand)
{
    double t = schedule_allreduce_time(8, 4, 1, 2); /* 2·3·1 + 2·3/4 · 8/2 */
    double want = 12;
    CHECK_CLOSE("allreduce time", &t, &want, 1, 1e-12, 0);
    cr_assert_eq(schedule_allreduce_time(8, 1, 1, 2), 0.0);

    /* K = 1, M = 1, B = 2; F = 2, B = 4 split 1 + 3; R = 2, alpha = 0.5, beta = 10:
     * bucket 0 (50 bytes) takes 1 + 5 = 6, bucket 1 (10 bytes) 1 + 1 = 2.
     * overlap: F [0,2) B0/0 [2,3) A0: net [3,9) B0/1 [3,6) A1: net [9,11) (after bucket 0)
     *          W0 [6,9) W1 [9,11) STEP [11,12) */
    schedule s;
    cr_assert_eq(schedule_init_gpipe(&s, 1, 1), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 1), 0);
    double fwd = 2, bwd = 4, bytes0[2] = {50, 10}, share0[2] = {0.25, 0.75};
    const double *bytes[1] = {bytes0}, *share[1] = {share0};
    schedule_costs c = {.fwd = &fwd, .bwd = &bwd, .step_cost = 1, .replicas = 2, .alpha = 0.5,
                        .beta = 10, .bucket_bytes = bytes, .part_share = share};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), 0, "%s", pt_error_get());
    /* F0 B0/0 A0 B0/1 A1 W0 W1 STEP */
    double start[8] = {0, 2, 3, 3, 6, 6, 9, 11}, end[8] = {2, 3, 3, 6, 6, 9, 11, 12};
    double net_start[8] = {-1, -1, 3, -1, 9, -1, -1, -1}, net_end[8] = {-1, -1, 9, -1, 11,
                                                                          -1, -1, -1};
    cr_assert_eq(s.lists[0].n_ops, 8);
    CHECK_CLOSE("start", sim.start, start, 8, 1e-12, 0);
    CHECK_CLOSE("end", sim.end, end, 8, 1e-12, 0);
    CHECK_CLOSE("net start", sim.net_start, net_start, 8, 1e-12, 0);
    CHECK_CLOSE("net end", sim.net_end, net_end, 8, 1e-12, 0);
    double makespan = 12, busy = 7, reduce = 8, exposed = 5, bubble = 5.0 / 12;
    CHECK_CLOSE("makespan", &sim.makespan, &makespan, 1, 1e-12, 0);
    CHECK_CLOSE("busy", sim.busy, &busy, 1, 1e-12, 0);
    CHECK_CLOSE("reduce", sim.reduce, &reduce, 1, 1e-12, 0);
    CHECK_CLOSE("exposed", sim.exposed, &exposed, 1, 1e-12, 0);
    CHECK_CLOSE("bubble", &sim.bubble, &bubble, 1, 1e-12, 0);
    schedule_sim_free(&sim);
    cr_assert_null(sim.net_start);
    cr_assert_null(sim.exposed);

    /* reductions only in the waits (a CPU engine): A0 and A1 start the reductions, which
     * run from W0: bucket 0 on the net [6,12), bucket 1 [12,14); W0 [6,12) W1 [12,14)
     * STEP [14,15), as if they had not overlapped at all */
    c.reduce_in_waits = 1;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), 0, "%s", pt_error_get());
    double start_w[8] = {0, 2, 3, 3, 6, 6, 12, 14}, end_w[8] = {2, 3, 3, 6, 6, 12, 14, 15};
    double net_start_w[8] = {-1, -1, 6, -1, 12, -1, -1, -1},
           net_end_w[8] = {-1, -1, 12, -1, 14, -1, -1, -1};
    CHECK_CLOSE("start, in waits", sim.start, start_w, 8, 1e-12, 0);
    CHECK_CLOSE("end, in waits", sim.end, end_w, 8, 1e-12, 0);
    CHECK_CLOSE("net start, in waits", sim.net_start, net_start_w, 8, 1e-12, 0);
    CHECK_CLOSE("net end, in waits", sim.net_end, net_end_w, 8, 1e-12, 0);
    double makespan_w = 15, exposed_w = 8;
    CHECK_CLOSE("makespan, in waits", &sim.makespan, &makespan_w, 1, 1e-12, 0);
    CHECK_CLOSE("reduce, in waits", sim.reduce, &reduce, 1, 1e-12, 0);
    CHECK_CLOSE("exposed, in waits", sim.exposed, &exposed_w, 1, 1e-12, 0);
    schedule_sim_free(&sim);
    c.reduce_in_waits = 0;
    schedule_free(&s);

    /* no overlap: F [0,2) B [2,6), bucket 0 on the net [6,12), bucket 1 [12,14),
     * W0 [6,12) W1 [12,14) STEP [14,15) */
    cr_assert_eq(schedule_init_gpipe(&s, 1, 1), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 0), 0);
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), 0, "%s", pt_error_get());
    makespan = 15, exposed = 8;
    CHECK_CLOSE("makespan", &sim.makespan, &makespan, 1, 1e-12, 0);
    CHECK_CLOSE("reduce", sim.reduce, &reduce, 1, 1e-12, 0);
    CHECK_CLOSE("exposed", sim.exposed, &exposed, 1, 1e-12, 0);
    schedule_sim_free(&sim);

    /* bad costs */
    share0[1] = 0.5;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), -1);
    cr_assert(strstr(pt_error_get(), "stage 0's backward part shares sum to 0.75"), "%s",
              pt_error_get());
    share0[1] = 0.75;
    bytes0[1] = -1;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), -1);
    cr_assert(strstr(pt_error_get(), "stage 0 bucket 1 has -1 bytes"), "%s", pt_error_get());
    bytes0[1] = 10;
    c.beta = 0;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), -1);
    cr_assert(strstr(pt_error_get(), "bandwidth beta > 0 (got 0)"), "%s", pt_error_get());
    c.beta = 10;
    c.replicas = -1;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), -1);
    cr_assert(strstr(pt_error_get(), "-1 replicas"), "%s", pt_error_get());
    cr_assert_null(sim.busy);
    cr_assert_eq(schedule_simulate_costs(&s, NULL, &sim), -1);
    schedule_free(&s);
}

/* Exposed reduction time, per stage, of a generated schedule with B buckets. */
static void exposed_of(const char *name, int K, int M, int B, int overlap, const double *bwd,
                       double *exposed, double *makespan)
{
    schedule s;
    cr_assert_eq(schedule_init_by_name(&s, name, K, M), 0);
    cr_assert_eq(schedule_add_reductions(&s, B, overlap), 0);
    double fwd[4] = {1, 1.5, 0.5, 2}, row[4] = {4e6, 1e6, 3e6, 2e6};
    const double *bytes[4] = {row, row, row, row};
    schedule_costs c = {.fwd = fwd, .bwd = bwd, .step_cost = 0.5, .replicas = 4,
                        .alpha = 0.01, .beta = 4e6, .bucket_bytes = bytes};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), 0, "%s", pt_error_get());
    for (int st = 0; st < K; st++)
        exposed[st] = sim.exposed[st];
    *makespan = sim.makespan;
    schedule_sim_free(&sim);
    schedule_free(&s);
}

Test(schedule, simulate_overlap_hides_reductions)
{
    const char *names[] = {"gpipe", "1f1b"};
    double bwd[4] = {2, 3, 1, 4}, instant[4] = {0, 0, 0, 0};
    for (int n = 0; n < 2; n++)
        for (int K = 1; K <= 4; K++)
            for (int M = 1; M <= 8; M += 3)
                for (int B = 1; B <= 4; B++) {
                    double on[4], off[4], span_on, span_off;
                    exposed_of(names[n], K, M, B, 1, bwd, on, &span_on);
                    exposed_of(names[n], K, M, B, 0, bwd, off, &span_off);
                    cr_assert(span_on <= span_off + 1e-9, "%s K=%d M=%d B=%d: makespan %g "
                              "with overlap, %g without", names[n], K, M, B, span_on, span_off);
                    for (int st = 0; st < K; st++)
                        cr_assert(on[st] <= off[st] + 1e-9, "%s K=%d M=%d B=%d stage %d: "
                                  "exposed %g with overlap, %g without", names[n], K, M, B, st,
                                  on[st], off[st]);
                    /* strictly less where there is a backward part to hide behind */
                    if (B > 1)
                        cr_assert(on[0] < off[0] - 1e-9, "%s K=%d M=%d B=%d: overlap hid "
                                  "nothing", names[n], K, M, B);
                    exposed_of(names[n], K, M, B, 1, instant, on, &span_on);
                    exposed_of(names[n], K, M, B, 0, instant, off, &span_off);
                    CHECK_CLOSE("instant backward", on, off, K, 1e-9, 0);
                    CHECK_CLOSE("instant backward makespan", &span_on, &span_off, 1, 1e-9, 0);
                }
}

Test(schedule, print_reductions)
{
    schedule s;
    cr_assert_eq(schedule_init_gpipe(&s, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 1), 0);
    char *text = print_to_string(&s);
    const char *want[] = {
        "Bm/b backward of m through bucket b's layers only, Ab start reducing bucket b",
        "\ns0: F0 >a0 F1 >a1 <g0 B0 <g1 B1/0 A0 B1/1 A1 W0 W1 STEP\n",
        "\ns1: <a0 F0 <a1 F1 B0 >g0 B1/0 A0 B1/1 >g1 A1 W0 W1 STEP\n",
        "\n t |  0  1  2  3  4  5  6\n",
        "\ns0 | F0 F1  .  . B0 B1  W\n",
        "\nn0 |  .  .  .  .  . A0 A1\n",
        "\ns1 |  . F0 F1 B0 B1  W  .\n",
        "\nn1 |  .  .  .  . A0 A1  .\n",
        "makespan 6.50 slots\n",
        "reductions (unit costs), exposed / total per stage: 0.50/1.00 0.50/1.00\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(text, want[i]), "output lacks '%s':\n%s", want[i], text);
    free(text);
    schedule_free(&s);

    cr_assert_eq(schedule_init_1f1b(&s, 1, 2), 0);
    cr_assert_eq(schedule_add_reductions(&s, 3, 0), 0);
    text = print_to_string(&s);
    const char *want_off[] = {
        "\ns0: F0 B0 F1 B1 A0 A1 A2 W0 W1 W2 STEP\n",
        "\ns0 |   F0   B0   F1   B1    W\n",
        "\nn0 |    .    .    .    . A0-2\n",
        "makespan 5 slots\n",
        "exposed / total per stage: 1.00/1.00\n",
    };
    for (size_t i = 0; i < sizeof want_off / sizeof *want_off; i++)
        cr_assert(strstr(text, want_off[i]), "output lacks '%s':\n%s", want_off[i], text);
    free(text);
    schedule_free(&s);
}

/* ---- reductions of interleaved schedules ------------------------------------------------ */

/* Index of the first op of kind `kind` for bucket b on stage st, or −1. */
static int find_reduction(const schedule *s, int st, schedule_op_kind kind, int b)
{
    for (int i = 0; i < s->lists[st].n_ops; i++)
        if (s->lists[st].ops[i].kind == kind && s->lists[st].ops[i].bucket == b) return i;
    return -1;
}

/* Index of the last op adding gradients (BACKWARD, BACKWARD_WEIGHT) of chunk v on st. */
static int last_gradient_op(const schedule *s, int st, int v)
{
    int last = -1;
    for (int i = 0; i < s->lists[st].n_ops; i++) {
        const schedule_op *op = &s->lists[st].ops[i];
        if ((op->kind == SCHED_OP_BACKWARD || op->kind == SCHED_OP_BACKWARD_WEIGHT) &&
            op->chunk == v)
            last = i;
    }
    return last;
}

Test(schedule, interleaved_reductions_verify_and_follow_their_chunk)
{
    for (int K = 2; K <= 4; K++)
        for (int V = 2; V <= 3; V++)
            for (int M = K; M <= 2 * K; M += K)
                for (int overlap = 0; overlap <= 1; overlap++) {
                    schedule s;
                    cr_assert_eq(schedule_init_interleaved(&s, K, V, M), 0, "%s", pt_error_get());
                    /* 1 or 2 buckets per chunk, and a chunk without any (no parameters) */
                    int buckets[K * V];
                    for (int k = 0; k < K * V; k++) buckets[k] = k % 3;
                    cr_assert_eq(schedule_add_reductions_chunks(&s, buckets, overlap), 0, "%s",
                                 pt_error_get());
                    cr_assert_eq(schedule_verify(&s, NULL), 0, "K=%d V=%d M=%d overlap %d: %s",
                                 K, V, M, overlap, pt_error_get());
                    const schedule *two[2] = {&s, &s};
                    cr_assert_eq(schedule_verify_replicas(two, 2), 0, "%s", pt_error_get());
                    for (int st = 0; st < K; st++) {
                        int b = 0, step = s.lists[st].n_ops - 1;
                        for (int v = 0; v < V; v++)
                            for (int j = 0; j < buckets[st * V + v]; j++, b++) {
                                int ar = find_reduction(&s, st, SCHED_OP_ALLREDUCE, b);
                                int w = find_reduction(&s, st, SCHED_OP_REDUCE_WAIT, b);
                                cr_assert(ar >= 0 && w > ar && w < step);
                                cr_assert_eq(s.lists[st].ops[ar].chunk, v);
                                cr_assert_eq(s.lists[st].ops[w].chunk, v);
                                cr_assert_gt(ar, last_gradient_op(&s, st, v));
                                /* with overlap a chunk that ends early starts early */
                                if (overlap && v == V - 1)
                                    cr_assert_lt(ar, last_gradient_op(&s, st, 0),
                                                 "K=%d V=%d M=%d stage %d: chunk %d's bucket %d "
                                                 "starts only at op %d", K, V, M, st, v, b, ar);
                            }
                        cr_assert_eq(b, s.lists[st].buckets);
                    }
                    schedule_free(&s);
                }
}

/* A valid interleaved list with 1 bucket per chunk and overlap, K = 2, V = 2, M = 2. */
static void interleaved_with_reductions(schedule *s)
{
    cr_assert_eq(schedule_init_interleaved(s, 2, 2, 2), 0);
    int buckets[4] = {1, 1, 1, 1};
    cr_assert_eq(schedule_add_reductions_chunks(s, buckets, 1), 0, "%s", pt_error_get());
    cr_assert_eq(schedule_verify(s, NULL), 0, "%s", pt_error_get());
}

Test(schedule, verify_interleaved_reduction_mistakes)
{
    schedule s;
    /* a wait that names another chunk than its reduction */
    interleaved_with_reductions(&s);
    s.lists[0].ops[find_reduction(&s, 0, SCHED_OP_REDUCE_WAIT, 1)].chunk = 0;
    expect_invalid(&s, "wait on another chunk", "names chunk", NULL);
    schedule_free(&s);
    /* chunk 0's bucket started before chunk 0's last backward (right after chunk 1's) */
    interleaved_with_reductions(&s);
    int ar = find_reduction(&s, 0, SCHED_OP_ALLREDUCE, 0);
    move_op(&s, 0, ar, find_reduction(&s, 0, SCHED_OP_ALLREDUCE, 1) + 1);
    expect_invalid(&s, "reduction before its chunk's last backward", "comes before",
                   "adds to its gradients");
    schedule_free(&s);
    /* a reduction of a chunk the rank does not have */
    interleaved_with_reductions(&s);
    s.lists[1].ops[find_reduction(&s, 1, SCHED_OP_ALLREDUCE, 0)].chunk = 2;
    expect_invalid(&s, "reduction on chunk 2 of 2", "chunk must be", NULL);
    schedule_free(&s);
    /* with V = 1 a reduction on chunk 1 is out of range too */
    cr_assert_eq(schedule_init_1f1b(&s, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&s, 1, 0), 0);
    s.lists[0].ops[find_reduction(&s, 0, SCHED_OP_ALLREDUCE, 0)].chunk = 1;
    expect_invalid(&s, "reduction on chunk 1 of 1", "chunk must be", NULL);
    schedule_free(&s);
    /* bucket counts: negative, or given per stage where chunks need them */
    cr_assert_eq(schedule_init_interleaved(&s, 2, 2, 2), 0);
    int bad[4] = {1, -1, 1, 1};
    cr_assert_eq(schedule_add_reductions_chunks(&s, bad, 1), -1);
    cr_assert(strstr(pt_error_get(), "chunk 1"), "%s", pt_error_get());
    cr_assert_eq(schedule_add_reductions(&s, 1, 1), -1);
    cr_assert(strstr(pt_error_get(), "per chunk"), "%s", pt_error_get());
    schedule_free(&s);
}
