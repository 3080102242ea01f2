/* Schedule IR: generators, verifier, simulator and printer (gpipe, 1f1b); their reductions
 * are tested in tests/test_schedule_reduce.c. */
#include "tests/schedule_build.h"

Test(schedule, generators_verify_and_count_ops)
{
    const char *names[] = {"gpipe", "1f1b"};
    for (int n = 0; n < 2; n++)
        for (int K = 1; K <= 8; K++)
            for (int M = 1; M <= 16; M++) {
                schedule s;
                cr_assert_eq(schedule_init_by_name(&s, names[n], K, M), 0, "%s",
                             pt_error_get());
                cr_assert_str_eq(s.name, names[n]);
                schedule_report r;
                cr_assert_eq(schedule_verify(&s, &r), 0, "%s K=%d M=%d: %s", names[n], K, M,
                             pt_error_get());
                cr_assert_eq(r.stages, K);
                for (int st = 0; st < K; st++) {
                    int count[SCHED_OP_COUNT] = {0}, next_b = 0;
                    const schedule_list *l = &s.lists[st];
                    for (int i = 0; i < l->n_ops; i++) {
                        count[l->ops[i].kind]++;
                        if (l->ops[i].kind == SCHED_OP_BACKWARD)
                            cr_assert_eq(l->ops[i].microbatch, next_b++,
                                         "%s K=%d M=%d stage %d: backwards out of order",
                                         names[n], K, M, st);
                    }
                    int first = st == 0, last = st == K - 1;
                    int want[SCHED_OP_COUNT] = {
                        [SCHED_OP_RECV_ACT] = first ? 0 : M,
                        [SCHED_OP_FORWARD] = M,
                        [SCHED_OP_SEND_ACT] = last ? 0 : M,
                        [SCHED_OP_RECV_GRAD] = last ? 0 : M,
                        [SCHED_OP_BACKWARD] = M,
                        [SCHED_OP_SEND_GRAD] = first ? 0 : M,
                        [SCHED_OP_OPTIMIZER_STEP] = 1,
                    };
                    for (int k = 0; k < SCHED_OP_COUNT; k++)
                        cr_assert_eq(count[k], want[k], "%s K=%d M=%d stage %d: %d %s, want %d",
                                     names[n], K, M, st, count[k],
                                     schedule_op_name((schedule_op_kind)k), want[k]);
                    cr_assert_eq(l->ops[l->n_ops - 1].kind, SCHED_OP_OPTIMIZER_STEP);
                    int peak = n == 0 ? M : (K - st < M ? K - st : M);
                    cr_assert_eq(r.peak_inflight[st], peak,
                                 "%s K=%d M=%d stage %d: peak in-flight %d, want %d", names[n],
                                 K, M, st, r.peak_inflight[st], peak);
                }
                schedule_report_free(&r);
                cr_assert_null(r.peak_inflight);
                schedule_free(&s);
                cr_assert_null(s.lists);
                cr_assert_eq(s.stages, 0);
            }
}

Test(schedule, gpipe_exact_lists)
{
    schedule got, want;
    cr_assert_eq(schedule_init_gpipe(&got, 3, 2), 0);
    build(&want, 3, 2, "F0 >a0 F1 >a1 <g0 B0 <g1 B1 STEP",
          "<a0 F0 >a0 <a1 F1 >a1 <g0 B0 >g0 <g1 B1 >g1 STEP",
          "<a0 F0 <a1 F1 B0 >g0 B1 >g1 STEP");
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);
}

Test(schedule, one_f_one_b_exact_lists)
{
    schedule got, want;
    cr_assert_eq(schedule_init_1f1b(&got, 3, 4), 0);
    build(&want, 3, 4,
          /* two warm-up forwards, steady 1F1B, cool-down */
          "F0 >a0 F1 >a1 F2 >a2 <g0 B0 F3 >a3 <g1 B1 <g2 B2 <g3 B3 STEP",
          "<a0 F0 >a0 <a1 F1 >a1 <g0 B0 >g0 <a2 F2 >a2 <g1 B1 >g1 <a3 F3 >a3 <g2 B2 >g2 "
          "<g3 B3 >g3 STEP",
          "<a0 F0 B0 >g0 <a1 F1 B1 >g1 <a2 F2 B2 >g2 <a3 F3 B3 >g3 STEP");
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);
    /* K=4, M=2: stages 0 and 1 have more warm-up slots (3, 2) than micro-batches, so they
     * run all forwards then all backwards; stage 2 (one warm-up) happens to as well. */
    cr_assert_eq(schedule_init_1f1b(&got, 4, 2), 0);
    build(&want, 4, 2, "F0 >a0 F1 >a1 <g0 B0 <g1 B1 STEP",
          "<a0 F0 >a0 <a1 F1 >a1 <g0 B0 >g0 <g1 B1 >g1 STEP",
          "<a0 F0 >a0 <a1 F1 >a1 <g0 B0 >g0 <g1 B1 >g1 STEP",
          "<a0 F0 B0 >g0 <a1 F1 B1 >g1 STEP");
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);
}

Test(schedule, init_errors)
{
    schedule s;
    cr_assert_eq(schedule_init_gpipe(&s, 0, 4), -1);
    cr_assert(strstr(pt_error_get(), "stages"), "%s", pt_error_get());
    cr_assert_null(s.lists);
    cr_assert_eq(schedule_init_1f1b(&s, 2, 0), -1);
    cr_assert(strstr(pt_error_get(), "microbatches"), "%s", pt_error_get());
    cr_assert_eq(schedule_init_by_name(&s, "zigzag", 2, 2), -1);
    cr_assert(strstr(pt_error_get(), "zigzag") && strstr(pt_error_get(), "gpipe") &&
                  strstr(pt_error_get(), "1f1b"),
              "%s", pt_error_get());
    cr_assert_eq(schedule_init_empty(&s, "x", 2, 2), 0);
    cr_assert_eq(schedule_append(&s, 2, SCHED_OP_FORWARD, 0, -1), -1);
    cr_assert(strstr(pt_error_get(), "stage 2"), "%s", pt_error_get());
    schedule_free(&s);
    schedule_free(&s); /* a freed schedule can be freed again */
    cr_assert_str_eq(schedule_op_name(SCHED_OP_FORWARD), "F");
    cr_assert_str_eq(schedule_op_name(SCHED_OP_SEND_ACT), "send_act");
    cr_assert_str_eq(schedule_op_name((schedule_op_kind)99), "unknown");
}

/* ---- verifier: lists built wrong on purpose ---------------------------------------------- */

Test(schedule, verify_hand_built_valid)
{
    schedule s;
    /* Recompute and reductions in their legal places. */
    build(&s, 2, 2, "F0 >a0 F1 >a1 <g0 R0 B0 <g1 R1 B1 A0 W0 STEP",
          "<a0 F0 <a1 F1 B0 >g0 B1 >g1 A0 W0 STEP");
    set_buckets(&s, 1);
    schedule_report r;
    cr_assert_eq(schedule_verify(&s, &r), 0, "%s", pt_error_get());
    cr_assert_eq(r.peak_inflight[0], 2);
    schedule_report_free(&r);
    schedule_free(&s);
}

Test(schedule, verify_missing_receive)
{
    schedule s;
    cr_assert_eq(schedule_init_gpipe(&s, 3, 2), 0);
    remove_op(&s, 2, find_op(&s, 2, SCHED_OP_RECV_ACT, 1));
    expect_invalid(&s, "missing receive", "send without receive", "recv_act m=1 on stage 2");
    schedule_free(&s);
}

Test(schedule, verify_missing_send)
{
    schedule s;
    cr_assert_eq(schedule_init_1f1b(&s, 3, 3), 0);
    remove_op(&s, 2, find_op(&s, 2, SCHED_OP_SEND_GRAD, 2));
    expect_invalid(&s, "missing send", "receive without send", "send_grad m=2 on stage 2");
    schedule_free(&s);
}

Test(schedule, verify_wrong_peer)
{
    schedule s;
    build(&s, 3, 1, "F0 >a0 <g0 B0 STEP", "<a0 F0 >a0 <g0 B0 >g0 STEP",
          "<a0@0 F0 B0 >g0 STEP");
    expect_invalid(&s, "receive from wrong peer", "stage 2 op 0", "wrong peer 0, expected stage 1");
    schedule_free(&s);
    /* The first stage has nobody to receive activations from. */
    build(&s, 2, 1, "<a0@1 F0 >a0 <g0 B0 STEP", "<a0 F0 B0 >g0 STEP");
    expect_invalid(&s, "first stage receiving", "first stage has no stage to receive", NULL);
    schedule_free(&s);
}

Test(schedule, verify_backward_before_forward)
{
    schedule s;
    /* Stage 1 runs B1 (and sends its gradient) before F1. */
    build(&s, 2, 2, "F0 >a0 F1 >a1 <g0 B0 <g1 B1 STEP",
          "<a0 F0 B0 >g0 <a1 B1 >g1 F1 STEP");
    expect_invalid(&s, "backward before forward", "backward before forward",
                   "B m=1 comes before F m=1");
    schedule_free(&s);
}

Test(schedule, verify_receive_on_wrong_microbatch)
{
    schedule s;
    /* Stage 0 sends activation 0, stage 1 waits for activation 1 there instead. */
    build(&s, 2, 2, "F0 >a0 F1 >a1 <g0 B0 <g1 B1 STEP",
          "<a1 F0 <a1 F1 B0 >g0 B1 >g1 STEP");
    expect_invalid(&s, "duplicate receive", "duplicate recv_act m=1", NULL);
    schedule_free(&s);
    build(&s, 2, 2, "F0 >a0 F1 >a1 <g0 B0 <g1 B1 STEP",
          "F0 <a1 F1 B0 >g0 B1 >g1 STEP");
    remove_op(&s, 0, find_op(&s, 0, SCHED_OP_SEND_ACT, 1));
    /* Now stage 0 sends only a0 and stage 1 only receives a1. */
    expect_invalid(&s, "receive on wrong micro-batch", "send_act m=0 to stage 1",
                   "unmatched recv_act m=1 at op 1 (wrong micro-batch?)");
    schedule_free(&s);
}

Test(schedule, verify_true_deadlock)
{
    schedule s;
    /* Stage 0 waits for the gradient before it sends the activation that stage 1 needs. */
    build(&s, 2, 1, "<g0 F0 >a0 B0 STEP", "<a0 F0 B0 >g0 STEP");
    expect_invalid(&s, "deadlock", "deadlock",
                   "stage 0 waits at op 0 (recv_grad m=0 from stage 1); stage 1 waits at op 0 "
                   "(recv_act m=0 from stage 0)");
    schedule_free(&s);
    /* 1F1B with one warm-up forward too few on stage 0 of 3: stage 0 waits for gradient 0
     * while stage 1 waits for activation 1. Every local order is right; only the global
     * check can see it. */
    build(&s, 3, 3, "F0 >a0 <g0 B0 F1 >a1 F2 >a2 <g1 B1 <g2 B2 STEP",
          "<a0 F0 >a0 <a1 F1 >a1 <g0 B0 >g0 <a2 F2 >a2 <g1 B1 >g1 <g2 B2 >g2 STEP",
          "<a0 F0 B0 >g0 <a1 F1 B1 >g1 <a2 F2 B2 >g2 STEP");
    expect_invalid(&s, "1f1b deadlock", "deadlock", "stage 1 waits at op 3 (recv_act m=1");
    schedule_free(&s);
}

Test(schedule, verify_missing_optimizer_step)
{
    schedule s;
    cr_assert_eq(schedule_init_1f1b(&s, 2, 2), 0);
    s.lists[1].n_ops--;
    expect_invalid(&s, "missing step", "stage 1", "missing optimizer_step");
    schedule_free(&s);
}

Test(schedule, verify_duplicate_forward)
{
    schedule s;
    build(&s, 1, 2, "F0 F1 F1 B0 B1 STEP");
    expect_invalid(&s, "duplicate forward", "stage 0 op 2", "duplicate F m=1 (first at op 1)");
    schedule_free(&s);
}

Test(schedule, verify_other_mistakes)
{
    schedule s;
    build(&s, 1, 2, "F0 F1 B0 B1 STEP B1");
    expect_invalid(&s, "op after step", "op 5", "comes after the optimizer_step at op 4");
    schedule_free(&s);
    build(&s, 1, 2, "F0 F2 B0 B1 STEP");
    expect_invalid(&s, "micro-batch out of range", "micro-batch 2 out of range [0, 2)", NULL);
    schedule_free(&s);
    build(&s, 1, 2, "F0 F1 B0 B1 STEP");
    s.lists[0].ops[2].kind = (schedule_op_kind)42;
    expect_invalid(&s, "unknown kind", "op 2: unknown op kind 42", NULL);
    schedule_free(&s);
    build(&s, 1, 2, "F0 B0 B1 STEP");
    expect_invalid(&s, "never forwarded", "micro-batch 1 is never forwarded", NULL);
    schedule_free(&s);
    build(&s, 2, 1, ">a0 F0 <g0 B0 STEP", "<a0 F0 B0 >g0 STEP");
    expect_invalid(&s, "send before producer", "send_act m=0 comes before the F m=0", NULL);
    schedule_free(&s);
    build(&s, 1, 2, "F0 F1 B0 A0 B1 W0 STEP");
    set_buckets(&s, 1);
    expect_invalid(&s, "early allreduce", "op 3: allreduce bucket 0 comes before B m=1 (op 4)",
                   NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 R0 STEP");
    expect_invalid(&s, "late recompute", "R m=0 must lie between", NULL);
    schedule_free(&s);
}

/* ---- simulator --------------------------------------------------------------------------- */

Test(schedule, gpipe_unit_bubble_matches_formula_and_1f1b_makespan)
{
    for (int K = 1; K <= 8; K++)
        for (int M = 1; M <= 16; M++) {
            schedule g, f;
            schedule_sim sg, sf;
            cr_assert_eq(schedule_init_gpipe(&g, K, M), 0);
            cr_assert_eq(schedule_init_1f1b(&f, K, M), 0);
            cr_assert_eq(schedule_simulate(&g, NULL, NULL, 0, 0, &sg), 0, "%s", pt_error_get());
            cr_assert_eq(schedule_simulate(&f, NULL, NULL, 0, 0, &sf), 0, "%s", pt_error_get());
            double theory = schedule_bubble_theory(K, M);
            double want = (double)(K - 1) / (M + K - 1);
            CHECK_CLOSE("theory", &theory, &want, 1, 0, 0);
            CHECK_CLOSE("gpipe unit bubble", &sg.bubble, &theory, 1, 1e-12, 0);
            double span = 2.0 * (M + K - 1);
            CHECK_CLOSE("gpipe makespan", &sg.makespan, &span, 1, 0, 0);
            CHECK_CLOSE("1f1b makespan", &sf.makespan, &sg.makespan, 1, 0, 0);
            CHECK_CLOSE("1f1b bubble", &sf.bubble, &sg.bubble, 1, 1e-12, 0);
            for (int st = 0; st < K; st++) {
                double busy = 2.0 * M;
                CHECK_CLOSE("busy", &sg.busy[st], &busy, 1, 0, 0);
            }
            schedule_sim_free(&sg);
            schedule_sim_free(&sf);
            cr_assert_null(sg.start);
            schedule_free(&g);
            schedule_free(&f);
        }
}

Test(schedule, simulate_costs_by_hand)
{
    schedule s;
    cr_assert_eq(schedule_init_gpipe(&s, 2, 1), 0);
    /* s0: F0 >a0 <g0 B0 STEP ; s1: <a0 F0 B0 >g0 STEP */
    double fwd[2] = {2, 3}, bwd[2] = {4, 5};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate(&s, fwd, bwd, 0.5, 1, &sim), 0, "%s", pt_error_get());
    double start[10] = {0, 2, 11, 11, 15, 2.5, 2.5, 5.5, 10.5, 11};
    double end[10] = {2, 2.5, 11, 15, 16, 2.5, 5.5, 10.5, 11, 12};
    cr_assert_eq(sim.offset[0], 0);
    cr_assert_eq(sim.offset[1], 5);
    CHECK_CLOSE("start", sim.start, start, 10, 1e-12, 0);
    CHECK_CLOSE("end", sim.end, end, 10, 1e-12, 0);
    double busy[2] = {7.5, 9.5}, makespan = 16, bubble = 15.0 / 32;
    CHECK_CLOSE("busy", sim.busy, busy, 2, 1e-12, 0);
    CHECK_CLOSE("makespan", &sim.makespan, &makespan, 1, 1e-12, 0);
    CHECK_CLOSE("bubble", &sim.bubble, &bubble, 1, 1e-12, 0);
    schedule_sim_free(&sim);

    fwd[1] = -1;
    cr_assert_eq(schedule_simulate(&s, fwd, bwd, 0, 0, &sim), -1);
    cr_assert(strstr(pt_error_get(), "forward cost of stage 1"), "%s", pt_error_get());
    cr_assert_null(sim.busy);
    schedule_free(&s);
}

Test(schedule, simulate_refuses_deadlock)
{
    schedule s;
    build(&s, 2, 1, "<g0 F0 >a0 B0 STEP", "<a0 F0 B0 >g0 STEP");
    schedule_sim sim;
    cr_assert_eq(schedule_simulate(&s, NULL, NULL, 0, 0, &sim), -1);
    cr_assert(strstr(pt_error_get(), "deadlock"), "%s", pt_error_get());
    cr_assert_null(sim.start);
    cr_assert_null(sim.busy);
    schedule_free(&s);
}

/* ---- printer ----------------------------------------------------------------------------- */

Test(schedule, print_gpipe)
{
    schedule s;
    cr_assert_eq(schedule_init_gpipe(&s, 2, 2), 0);
    char *text = print_to_string(&s);
    const char *want[] = {
        "legend:",
        "\ns0: F0 >a0 F1 >a1 <g0 B0 <g1 B1 STEP\n",
        "\ns1: <a0 F0 <a1 F1 B0 >g0 B1 >g1 STEP\n",
        "\n t |  0  1  2  3  4  5\n",
        "\ns0 | F0 F1  .  . B0 B1\n",
        "\ns1 |  . F0 F1 B0 B1  .\n",
        ("bubble (idle share of the step): 0.3333 simulated (unit costs), 0.3333 formula "
         "(K-1)/(M+K-1) with K=2 V=1 M=2;"),
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(text, want[i]), "output lacks '%s':\n%s", want[i], text);
    free(text);
    schedule_free(&s);
}

Test(schedule, print_1f1b_wide_and_invalid)
{
    schedule s;
    cr_assert_eq(schedule_init_1f1b(&s, 3, 11), 0);
    char *text = print_to_string(&s);
    /* Labels up to "F10" make every cell three wide; stage 2 starts after two idle slots. */
    cr_assert(strstr(text, "\ns2 |   .   .  F0  B0  F1  B1"), "%s", text);
    cr_assert(strstr(text, "\ns0 |  F0  F1  F2   .   .  B0  F3"), "%s", text);
    cr_assert(strstr(text, "bubble (idle share of the step): 0.1538 simulated"), "%s", text);
    free(text);
    schedule_free(&s);

    build(&s, 2, 1, "<g0 F0 >a0 B0 STEP", "<a0 F0 B0 >g0 STEP");
    text = print_to_string(&s);
    cr_assert(strstr(text, "s0: <g0 F0 >a0 B0 STEP"), "%s", text);
    cr_assert(strstr(text, "timeline: not available") && strstr(text, "deadlock"), "%s", text);
    free(text);
    schedule_free(&s);
}

/* Issue 23 item 14: one unit, the idle share of the step (what a trace shows), for every
 * schedule, named where printed; the formula agrees with the simulator for balanced stages.
 * K = 4, M = 8: gpipe and 1f1b 3/11, interleaved V = 1 the same as 1f1b, V = 2 3/19, zb-h1
 * 3/27 (the published 3/8, 3/16 and 3/24 are of the ideal time, not of the step). */
Test(schedule, bubbles_in_one_unit_at_k4_m8)
{
    static const struct {
        const char *name;
        int V;
        const char *line;
    } cases[] = {
        {"gpipe", 1, "bubble (idle share of the step): 0.2727 simulated (unit costs), 0.2727 "
                     "formula (K-1)/(M+K-1) with K=4 V=1 M=8;"},
        {"1f1b", 1, "bubble (idle share of the step): 0.2727 simulated (unit costs), 0.2727 "
                    "formula (K-1)/(M+K-1) with K=4 V=1 M=8;"},
        {"interleaved", 1, "bubble (idle share of the step): 0.2727 simulated (unit costs), "
                           "0.2727 formula (K-1)/(V*M+K-1) with K=4 V=1 M=8;"},
        {"interleaved", 2, "bubble (idle share of the step): 0.1579 simulated (unit costs), "
                           "0.1579 formula (K-1)/(V*M+K-1) with K=4 V=2 M=8;"},
        {"zb-h1", 1, "bubble (idle share of the step): 0.1111 simulated (unit costs), 0.1111 "
                     "formula (K-1)/(3M+K-1) with K=4 V=1 M=8;"},
    };
    const double want[] = {3.0 / 11, 3.0 / 11, 3.0 / 11, 3.0 / 19, 3.0 / 27};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        schedule s;
        schedule_sim sim;
        cr_assert_eq(schedule_init_named(&s, cases[i].name, 4, cases[i].V, 8), 0, "%s",
                     pt_error_get());
        /* unit costs as the printer's: F = B = 1, and F = b = w = 1 for zero bubble */
        double ones[4] = {1, 1, 1, 1};
        schedule_costs unit = {.fwd = ones, .bwd_input = ones, .bwd_weight = ones};
        int zb = !strcmp(cases[i].name, "zb-h1");
        cr_assert_eq(zb ? schedule_simulate_costs(&s, &unit, &sim)
                        : schedule_simulate(&s, NULL, NULL, 0, 0, &sim), 0, "%s",
                     pt_error_get());
        double formula = schedule_bubble_formula(&s, NULL);
        double named = schedule_bubble_share(cases[i].name, 4, cases[i].V, 8, NULL);
        CHECK_CLOSE("simulated", &sim.bubble, &want[i], 1, 1e-12, 0);
        CHECK_CLOSE("formula", &formula, &want[i], 1, 1e-15, 0);
        CHECK_CLOSE("by name", &named, &want[i], 1, 1e-15, 0);
        char *text = print_to_string(&s);
        cr_assert(strstr(text, cases[i].line), "%s V=%d: output lacks '%s':\n%s",
                  cases[i].name, cases[i].V, cases[i].line, text);
        free(text);
        schedule_sim_free(&sim);
        schedule_free(&s);
    }
}
