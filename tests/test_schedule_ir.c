/* Schedule IR: interleaved (virtual stages), zero bubble (split backward) and
 * recomputation; reductions of interleaved schedules are tested in
 * tests/test_schedule_reduce.c. */
#include "tests/schedule_build.h"

/* ---- interleaved, zero bubble, recomputation ---------------------------------------------- */

/* The generated schedules the new tests sweep: name, V and whether (K, V, M) is accepted. */
static int accepted(const char *name, int K, int V, int M)
{
    if (strcmp(name, "interleaved") == 0)
        return V == 1 || (K >= 2 && M % K == 0);
    return V == 1;
}

/* Counts per (stage, chunk): each kind once per micro-batch where the routing says so. */
static void check_counts(const schedule *s, const char *what)
{
    int K = s->stages, V = s->virtual_stages, M = s->microbatches;
    int zb = strcmp(s->name, "zb-h1") == 0;
    for (int st = 0; st < K; st++)
        for (int v = 0; v < V; v++) {
            int count[SCHED_OP_COUNT] = {0};
            const schedule_list *l = &s->lists[st];
            for (int i = 0; i < l->n_ops; i++)
                if (l->ops[i].chunk == v && l->ops[i].microbatch >= 0 &&
                    !(l->ops[i].bucket > 0)) /* a split op counts once, by its part 0 */
                    count[l->ops[i].kind]++;
            int first = st == 0 && v == 0, last = st == K - 1 && v == V - 1;
            int want[SCHED_OP_COUNT] = {
                [SCHED_OP_RECV_ACT] = first ? 0 : M,
                [SCHED_OP_FORWARD] = M,
                [SCHED_OP_SEND_ACT] = last ? 0 : M,
                [SCHED_OP_RECV_GRAD] = last ? 0 : M,
                [SCHED_OP_BACKWARD] = zb ? 0 : M,
                [SCHED_OP_BACKWARD_INPUT] = zb ? M : 0,
                [SCHED_OP_BACKWARD_WEIGHT] = zb ? M : 0,
                [SCHED_OP_SEND_GRAD] = first ? 0 : M,
                [SCHED_OP_RECOMPUTE] = l->recompute ? M : 0,
            };
            for (int k = 0; k < SCHED_OP_COUNT; k++)
                if (k != SCHED_OP_ALLREDUCE && k != SCHED_OP_REDUCE_WAIT &&
                    k != SCHED_OP_OPTIMIZER_STEP)
                    cr_assert_eq(count[k], want[k], "%s stage %d chunk %d: %d %s, want %d",
                                 what, st, v, count[k], schedule_op_name((schedule_op_kind)k),
                                 want[k]);
        }
}

Test(schedule, new_generators_verify_with_recompute_and_reductions)
{
    const char *names[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
    int all[8] = {1, 1, 1, 1, 1, 1, 1, 1}, checked = 0;
    for (int n = 0; n < 4; n++)
        for (int V = 1; V <= 4; V++)
            for (int K = 1; K <= 8; K++)
                for (int M = 1; M <= 32; M++) {
                    if (!accepted(names[n], K, V, M))
                        continue;
                    /* variants: plain; recompute; B = 1..3 x overlap (gpipe, 1f1b, zb-h1);
                     * those with recomputation added before or after the reductions */
                    for (int var = 0; var < 2 + 2 * 3 * 2; var++) {
                        int recompute = var == 1 || var >= 8, red = var >= 2;
                        int B = red ? 1 + (var - 2) % 6 / 2 : 0, overlap = (var - 2) % 2;
                        if (red && V > 1)
                            continue;
                        char what[96];
                        snprintf(what, sizeof what, "%s K=%d V=%d M=%d recompute=%d B=%d "
                                 "overlap=%d", names[n], K, V, M, recompute, B, overlap);
                        schedule s;
                        cr_assert_eq(schedule_init_named(&s, names[n], K, V, M), 0, "%s: %s",
                                     what, pt_error_get());
                        cr_assert_eq(s.virtual_stages, V, "%s", what);
                        if (recompute && var >= 8)
                            cr_assert_eq(schedule_add_recompute(&s, all), 0, "%s: %s", what,
                                         pt_error_get());
                        if (red)
                            cr_assert_eq(schedule_add_reductions(&s, B, overlap), 0, "%s: %s",
                                         what, pt_error_get());
                        if (recompute && var < 8)
                            cr_assert_eq(schedule_add_recompute(&s, all), 0, "%s: %s", what,
                                         pt_error_get());
                        schedule_report r;
                        cr_assert_eq(schedule_verify(&s, &r), 0, "%s: %s", what,
                                     pt_error_get());
                        check_counts(&s, what);
                        for (int st = 0; st < K; st++) {
                            cr_assert_eq(s.lists[st].recompute, recompute, "%s", what);
                            cr_assert_eq(s.lists[st].buckets, B, "%s", what);
                            int sum = 0;
                            for (int v = 0; v < V; v++)
                                sum += r.peak_inputs_chunk[st * V + v];
                            cr_assert(r.peak_inputs[st] <= sum && r.peak_inflight[st] <=
                                      r.peak_inputs[st], "%s stage %d", what, st);
                            /* recomputation rebuilds activations right before the backward:
                             * one micro-batch at once, but zero bubble keeps them until w */
                            if (recompute && n < 3)
                                cr_assert_eq(r.peak_inflight[st], 1, "%s stage %d", what, st);
                            if (recompute)
                                cr_assert_leq(r.peak_inflight[st], r.peak_inputs[st], "%s", what);
                        }
                        schedule_report_free(&r);
                        schedule_free(&s);
                        checked++;
                    }
                }
    cr_assert_gt(checked, 5000, "only %d schedules checked", checked);
}

Test(schedule, recompute_before_or_after_reductions_same_lists)
{
    const char *names[] = {"gpipe", "1f1b", "zb-h1"};
    int flags[4] = {1, 0, 1, 1};
    for (int n = 0; n < 3; n++)
        for (int M = 1; M <= 6; M++)
            for (int overlap = 0; overlap <= 1; overlap++) {
                schedule a, b;
                cr_assert_eq(schedule_init_named(&a, names[n], 4, 1, M), 0);
                cr_assert_eq(schedule_init_named(&b, names[n], 4, 1, M), 0);
                cr_assert_eq(schedule_add_recompute(&a, flags), 0, "%s", pt_error_get());
                cr_assert_eq(schedule_add_reductions(&a, 3, overlap), 0, "%s", pt_error_get());
                cr_assert_eq(schedule_add_reductions(&b, 3, overlap), 0, "%s", pt_error_get());
                cr_assert_eq(schedule_add_recompute(&b, flags), 0, "%s", pt_error_get());
                expect_same_ops(&a, &b);
                for (int st = 0; st < 4; st++)
                    cr_assert_eq(a.lists[st].recompute, flags[st]);
                schedule_free(&a);
                schedule_free(&b);
            }
}

Test(schedule, recompute_exact_lists_and_peaks)
{
    schedule got, want;
    cr_assert_eq(schedule_init_1f1b(&got, 2, 2), 0);
    int all[2] = {1, 1};
    cr_assert_eq(schedule_add_recompute(&got, all), 0, "%s", pt_error_get());
    /* the recompute goes before the gradient's receive: it can run while that travels */
    build(&want, 2, 2, "F0 >a0 F1 >a1 R0 <g0 B0 R1 <g1 B1 STEP",
          "<a0 F0 R0 B0 >g0 <a1 F1 R1 B1 >g1 STEP");
    want.lists[0].recompute = want.lists[1].recompute = 1;
    expect_same_ops(&got, &want);
    schedule_report r;
    cr_assert_eq(schedule_verify(&got, &r), 0, "%s", pt_error_get());
    cr_assert_eq(r.peak_inflight[0], 1);
    cr_assert_eq(r.peak_inputs[0], 2);
    cr_assert_eq(r.peak_inputs_chunk[0], 2);
    cr_assert_eq(r.peak_inflight_chunk[0], 1);
    cr_assert_eq(r.peak_inputs[1], 1);
    schedule_report_free(&r);
    /* twice is an error and leaves the schedule as it was */
    cr_assert_eq(schedule_add_recompute(&got, all), -1);
    cr_assert(strstr(pt_error_get(), "recomputation already"), "%s", pt_error_get());
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);
    /* a hand-built list with a recompute counts as having one */
    build(&got, 1, 1, "F0 R0 B0 STEP");
    cr_assert_eq(schedule_add_recompute(&got, all), -1);
    cr_assert(strstr(pt_error_get(), "is a recompute already"), "%s", pt_error_get());
    schedule_free(&got);
    /* only the flagged stages; zero bubble: before b */
    cr_assert_eq(schedule_init_zb_h1(&got, 2, 2), 0);
    int second[2] = {0, 1};
    cr_assert_eq(schedule_add_recompute(&got, second), 0, "%s", pt_error_get());
    build(&want, 2, 2, "F0 >a0 F1 >a1 <g0 b0 w0 <g1 b1 w1 STEP",
          "<a0 F0 R0 b0 >g0 <a1 F1 R1 b1 >g1 w0 w1 STEP");
    want.lists[1].recompute = 1;
    expect_same_ops(&got, &want);
    cr_assert_eq(schedule_verify(&got, &r), 0, "%s", pt_error_get());
    /* stage 1 holds both micro-batches' inputs until their w, activations from R to w */
    cr_assert_eq(r.peak_inputs[1], 2);
    cr_assert_eq(r.peak_inflight[1], 2);
    cr_assert_eq(r.peak_inflight[0], 2);
    schedule_report_free(&r);
    schedule_free(&got);
    schedule_free(&want);
}

Test(schedule, parse_recompute)
{
    int f[4];
    cr_assert_eq(schedule_parse_recompute("none", 4, f), 0);
    cr_assert(f[0] == 0 && f[1] == 0 && f[2] == 0 && f[3] == 0);
    cr_assert_eq(schedule_parse_recompute("all", 4, f), 0);
    cr_assert(f[0] == 1 && f[1] == 1 && f[2] == 1 && f[3] == 1);
    cr_assert_eq(schedule_parse_recompute("0,2", 4, f), 0);
    cr_assert(f[0] == 1 && f[1] == 0 && f[2] == 1 && f[3] == 0);
    cr_assert_eq(schedule_parse_recompute("0,4", 4, f), -1);
    cr_assert(strstr(pt_error_get(), "stage 4 does not exist (stages 0..3)"), "%s",
              pt_error_get());
    const char *bad[] = {"", "some", "1,", ",1", "1,,2", "-1", "1;2", "2 "};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(schedule_parse_recompute(bad[i], 4, f), -1, "'%s' accepted", bad[i]);
        cr_assert(strstr(pt_error_get(), "expected none, all or a comma list"), "'%s': %s",
                  bad[i], pt_error_get());
    }
}

Test(schedule, named_and_interleaved_errors)
{
    schedule s;
    cr_assert_eq(schedule_init_named(&s, "zigzag", 2, 1, 2), -1);
    cr_assert(strstr(pt_error_get(), "zigzag") && strstr(pt_error_get(), "interleaved") &&
                  strstr(pt_error_get(), "zb-h1") && strstr(pt_error_get(), "gpipe"),
              "%s", pt_error_get());
    cr_assert_null(s.lists);
    cr_assert_eq(schedule_init_named(&s, "1f1b", 2, 2, 2), -1);
    cr_assert(strstr(pt_error_get(), "--virtual 2 needs --schedule interleaved"), "%s",
              pt_error_get());
    cr_assert_eq(schedule_init_named(&s, "zb-h1", 2, 3, 2), -1);
    cr_assert(strstr(pt_error_get(), "--virtual 3 needs --schedule interleaved"), "%s",
              pt_error_get());
    cr_assert_eq(schedule_init_named(&s, "interleaved", 2, 0, 2), -1);
    cr_assert_eq(schedule_init_interleaved(&s, 4, 2, 6), -1);
    cr_assert(strstr(pt_error_get(), "multiple of the 4 stages (got 6; use 4 or 8)"), "%s",
              pt_error_get());
    cr_assert_eq(schedule_init_interleaved(&s, 4, 2, 3), -1);
    cr_assert(strstr(pt_error_get(), "(got 3; use 4)"), "%s", pt_error_get());
    cr_assert_eq(schedule_init_interleaved(&s, 1, 2, 4), -1);
    cr_assert(strstr(pt_error_get(), "at least 2 stages"), "%s", pt_error_get());
    cr_assert_eq(schedule_init_interleaved(&s, 2, 2, 0), -1);
    cr_assert_eq(schedule_init_zb_h1(&s, 0, 2), -1);
    cr_assert(strstr(pt_error_get(), "stages"), "%s", pt_error_get());
    cr_assert_null(s.lists);
    int cap[2] = {2, 0};
    cr_assert_eq(schedule_init_zb(&s, 2, 4, cap), -1);
    cr_assert(strstr(pt_error_get(), "stage 1 may hold 0 micro-batches; it needs at least "
                                     "1F1B's min(K-s, M) = 1"), "%s", pt_error_get());
    cr_assert_null(s.lists);
    /* V = 1: 1F1B's lists (the name says what was asked for) */
    schedule f;
    cr_assert_eq(schedule_init_named(&s, "interleaved", 3, 1, 5), 0);
    cr_assert_str_eq(s.name, "interleaved");
    cr_assert_eq(schedule_init_1f1b(&f, 3, 5), 0);
    expect_same_ops(&s, &f);
    schedule_free(&f);
    /* several chunks per rank take bucket counts per chunk; the list is left alone */
    schedule_free(&s);
    cr_assert_eq(schedule_init_interleaved(&s, 2, 2, 4), 0);
    cr_assert_eq(schedule_add_reductions(&s, 2, 1), -1);
    cr_assert(strstr(pt_error_get(), "give buckets per chunk"), "%s", pt_error_get());
    cr_assert_eq(s.lists[0].buckets, 0);
    schedule_free(&s);
    /* routing */
    int ns = -1, nv = -1;
    cr_assert_eq(schedule_next_chunk(3, 2, 1, 0, &ns, &nv), 1);
    cr_assert(ns == 2 && nv == 0);
    cr_assert_eq(schedule_next_chunk(3, 2, 2, 0, &ns, &nv), 1);
    cr_assert(ns == 0 && nv == 1);
    cr_assert_eq(schedule_next_chunk(3, 2, 2, 1, &ns, &nv), 0);
    cr_assert_eq(schedule_prev_chunk(3, 2, 0, 1, &ns, &nv), 1);
    cr_assert(ns == 2 && nv == 0);
    cr_assert_eq(schedule_prev_chunk(3, 2, 0, 0, &ns, &nv), 0);
}

Test(schedule, interleaved_exact_lists)
{
    schedule got, want;
    /* K = 2, V = 2, M = 2: rank 0 warms up with 2(K−1) + (V−1)K = 4 forwards (all), rank 1
     * with 2; chunk 1 of rank 1 is the last model chunk (no send_act), chunk 0 of rank 0 the
     * first (no recv_act); activations of rank 1's chunk 0 go to rank 0's chunk 1. */
    cr_assert_eq(schedule_init_interleaved(&got, 2, 2, 2), 0, "%s", pt_error_get());
    build_v(&want, 2, 2, 2,
            "F0 >a0 F1 >a1 <a0.1 F0.1 >a0.1 <a1.1 F1.1 >a1.1 <g0.1 B0.1 >g0.1 <g1.1 B1.1 "
            ">g1.1 <g0 B0 <g1 B1 STEP",
            "<a0 F0 >a0 <a1 F1 >a1 <a0.1 F0.1 B0.1 >g0.1 <a1.1 F1.1 B1.1 >g1.1 <g0 B0 >g0 "
            "<g1 B1 >g1 STEP");
    expect_same_ops(&got, &want);
    cr_assert_eq(got.lists[0].ops[4].peer, 1, "rank 0's chunk 1 receives from rank 1");
    cr_assert_eq(got.lists[1].ops[5].peer, 0, "rank 1's chunk 0 sends to rank 0");
    schedule_free(&got);
    schedule_free(&want);
}

/* Messages of a schedule: count[from][to] of SEND_ACT and of SEND_GRAD between ranks. */
static void count_messages(const schedule *s, int *act, int *grad)
{
    int K = s->stages;
    memset(act, 0, (size_t)K * K * sizeof *act);
    memset(grad, 0, (size_t)K * K * sizeof *grad);
    for (int st = 0; st < K; st++)
        for (int i = 0; i < s->lists[st].n_ops; i++) {
            const schedule_op *op = &s->lists[st].ops[i];
            if (op->kind == SCHED_OP_SEND_ACT)
                act[st * K + op->peer]++;
            if (op->kind == SCHED_OP_SEND_GRAD)
                grad[st * K + op->peer]++;
        }
}

Test(schedule, interleaved_messages_are_v_times_1f1b)
{
    for (int K = 2; K <= 8; K++)
        for (int V = 2; V <= 4; V++)
            for (int M = K; M <= 32; M += K) {
                schedule il, f;
                cr_assert_eq(schedule_init_interleaved(&il, K, V, M), 0, "%s", pt_error_get());
                cr_assert_eq(schedule_init_1f1b(&f, K, M), 0);
                int ia[64], ig[64], fa[64], fg[64], ti = 0, tf = 0;
                count_messages(&il, ia, ig);
                count_messages(&f, fa, fg);
                for (int a = 0; a < K; a++)
                    for (int b = 0; b < K; b++) {
                        /* every link of 1F1B carries V times as much; only the wrap-around
                         * link from the last rank to the first is new: V−1 chunk
                         * boundaries */
                        int want = a == K - 1 && b == 0 ? (V - 1) * M : V * fa[a * K + b];
                        if (K == 2 && a == 1 && b == 0) /* that link is also 1F1B's */
                            want = (V - 1) * M;
                        cr_assert_eq(ia[a * K + b], want, "K=%d V=%d M=%d act %d->%d: %d, "
                                     "want %d", K, V, M, a, b, ia[a * K + b], want);
                        cr_assert_eq(ig[b * K + a], ia[a * K + b], "gradients mirror");
                        ti += ia[a * K + b] + ig[a * K + b];
                        tf += fa[a * K + b] + fg[a * K + b];
                    }
                cr_assert_eq(ti, V * tf + 2 * (V - 1) * M, "K=%d V=%d M=%d: %d messages, "
                             "1F1B %d", K, V, M, ti, tf);
                schedule_free(&il);
                schedule_free(&f);
            }
}

Test(schedule, interleaved_unit_bubble_matches_formula)
{
    /* Unit costs (NULL arrays): 1/V per chunk op, so each rank's work is 2M, as with V = 1;
     * idle share of the step = (makespan − busy) / makespan = (K−1)/(V·M+K−1), the published
     * (K−1)/(V·M) of the ideal time. */
    for (int V = 1; V <= 4; V++)
        for (int K = 1; K <= 8; K++)
            for (int M = 1; M <= 32; M++) {
                if (!accepted("interleaved", K, V, M))
                    continue;
                schedule s;
                schedule_sim sim;
                cr_assert_eq(schedule_init_interleaved(&s, K, V, M), 0);
                cr_assert_eq(schedule_simulate(&s, NULL, NULL, 0, 0, &sim), 0, "%s",
                             pt_error_get());
                const char *formula;
                double want = (double)(K - 1) / (V * M + K - 1);
                double got = schedule_bubble_formula(&s, &formula);
                cr_assert_str_eq(formula, "(K-1)/(V*M+K-1)");
                CHECK_CLOSE("formula", &got, &want, 1, 1e-15, 0);
                CHECK_CLOSE("interleaved unit bubble", &sim.bubble, &want, 1, 1e-12, 0);
                double span = 2.0 * M + 2.0 * (K - 1) / V;
                CHECK_CLOSE("interleaved makespan", &sim.makespan, &span, 1, 1e-12, 0);
                for (int st = 0; st < K; st++) {
                    double busy = 2.0 * M, rel = (sim.makespan - busy) / sim.makespan;
                    CHECK_CLOSE("busy", &sim.busy[st], &busy, 1, 1e-12, 0);
                    CHECK_CLOSE("per stage", &rel, &want, 1, 1e-12, 0);
                }
                schedule_sim_free(&sim);
                schedule_free(&s);
            }
}

Test(schedule, zb_h1_unit_bubble_and_memory)
{
    double ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    schedule_costs unit = {.fwd = ones, .bwd_input = ones, .bwd_weight = ones};
    for (int K = 1; K <= 8; K++)
        for (int M = 1; M <= 32; M++) {
            schedule zb, f, strict;
            cr_assert_eq(schedule_init_zb_h1(&zb, K, M), 0, "%s", pt_error_get());
            cr_assert_eq(schedule_init_1f1b(&f, K, M), 0);
            int caps[8];
            for (int st = 0; st < K; st++)
                caps[st] = K - st < M ? K - st : M;
            cr_assert_eq(schedule_init_zb(&strict, K, M, caps), 0, "%s", pt_error_get());
            schedule_report rz, rf, rs;
            cr_assert_eq(schedule_verify(&zb, &rz), 0, "K=%d M=%d: %s", K, M, pt_error_get());
            cr_assert_eq(schedule_verify(&f, &rf), 0);
            cr_assert_eq(schedule_verify(&strict, &rs), 0, "%s", pt_error_get());
            int most = 0;
            for (int st = 0; st < K; st++)
                most = rf.peak_inflight[st] > most ? rf.peak_inflight[st] : most;
            for (int st = 0; st < K; st++) {
                /* zb-h1: no stage holds more than 1F1B's most loaded stage (min(K, M)) */
                cr_assert_eq(rz.peak_inflight[st], most, "K=%d M=%d stage %d: zb-h1 holds %d, "
                             "1F1B at most %d", K, M, st, rz.peak_inflight[st], most);
                /* with 1F1B's caps, no stage holds more than in 1F1B */
                cr_assert_leq(rs.peak_inflight[st], rf.peak_inflight[st], "K=%d M=%d stage %d",
                              K, M, st);
            }
            schedule_sim sz, ss;
            cr_assert_eq(schedule_simulate_costs(&zb, &unit, &sz), 0, "%s", pt_error_get());
            cr_assert_eq(schedule_simulate_costs(&strict, &unit, &ss), 0, "%s", pt_error_get());
            double span = M >= K ? 3.0 * M + K - 1 : 2.0 * M + 2.0 * K - 1;
            double want = (span - 3.0 * M) / span; /* idle share of the step */
            CHECK_CLOSE("zb-h1 makespan", &sz.makespan, &span, 1, 0, 0);
            CHECK_CLOSE("zb-h1 bubble, share of the step", &sz.bubble, &want, 1, 1e-12, 0);
            double formula = schedule_bubble_formula(&zb, NULL);
            CHECK_CLOSE("formula", &formula, &want, 1, 1e-15, 0);
            if (M >= K) {
                /* 1F1B's memory on every stage: only the b on the critical path is shorter */
                double strict_want = 2.0 * (K - 1) / (3 * M + 2 * (K - 1));
                CHECK_CLOSE("zb with 1F1B's caps", &ss.bubble, &strict_want, 1, 1e-12, 0);
            }
            for (int st = 0; st < K; st++) {
                double busy = 3.0 * M;
                CHECK_CLOSE("busy", &sz.busy[st], &busy, 1, 0, 0);
            }
            schedule_sim_free(&sz);
            schedule_sim_free(&ss);
            schedule_report_free(&rz);
            schedule_report_free(&rf);
            schedule_report_free(&rs);
            schedule_free(&zb);
            schedule_free(&f);
            schedule_free(&strict);
        }
}

Test(schedule, zb_h1_exact_lists_and_reductions)
{
    schedule got, want;
    cr_assert_eq(schedule_init_zb_h1(&got, 2, 2), 0);
    /* stage 1 delays its w's by one micro-batch; stage 0 runs w right after b */
    build(&want, 2, 2, "F0 >a0 F1 >a1 <g0 b0 w0 <g1 b1 w1 STEP",
          "<a0 F0 b0 >g0 <a1 F1 b1 >g1 w0 w1 STEP");
    expect_same_ops(&got, &want);
    schedule_free(&want);
    /* overlap: the last w is split, each part followed by its bucket's start */
    cr_assert_eq(schedule_add_reductions(&got, 2, 1), 0, "%s", pt_error_get());
    build(&want, 2, 2, "F0 >a0 F1 >a1 <g0 b0 w0 <g1 b1 w1/0 A0 w1/1 A1 W0 W1 STEP",
          "<a0 F0 b0 >g0 <a1 F1 b1 >g1 w0 w1/0 A0 w1/1 A1 W0 W1 STEP");
    set_buckets(&want, 2);
    expect_same_ops(&got, &want);
    cr_assert_eq(schedule_verify(&got, NULL), 0, "%s", pt_error_get());
    schedule_free(&got);
    schedule_free(&want);
    cr_assert_eq(schedule_init_zb_h1(&got, 2, 2), 0);
    cr_assert_eq(schedule_add_reductions(&got, 2, 0), 0, "%s", pt_error_get());
    build(&want, 2, 2, "F0 >a0 F1 >a1 <g0 b0 w0 <g1 b1 w1 A0 A1 W0 W1 STEP",
          "<a0 F0 b0 >g0 <a1 F1 b1 >g1 w0 w1 A0 A1 W0 W1 STEP");
    set_buckets(&want, 2);
    expect_same_ops(&got, &want);
    schedule_free(&got);
    schedule_free(&want);
    /* free reductions leave the step as long as without them */
    for (int B = 1; B <= 3; B++) {
        schedule plain, s;
        cr_assert_eq(schedule_init_zb_h1(&plain, 4, 8), 0);
        cr_assert_eq(schedule_init_zb_h1(&s, 4, 8), 0);
        cr_assert_eq(schedule_add_reductions(&s, B, 1), 0);
        schedule_sim a, b;
        cr_assert_eq(schedule_simulate(&plain, NULL, NULL, 0, 0, &a), 0);
        cr_assert_eq(schedule_simulate(&s, NULL, NULL, 0, 0, &b), 0, "%s", pt_error_get());
        CHECK_CLOSE("free reductions", &b.makespan, &a.makespan, 1, 1e-12, 0);
        schedule_sim_free(&a);
        schedule_sim_free(&b);
        const schedule *reps[2] = {&s, &s};
        cr_assert_eq(schedule_verify_replicas(reps, 2), 0, "%s", pt_error_get());
        schedule_free(&plain);
        schedule_free(&s);
    }
}

/* ---- verifier: broken zero-bubble, chunked and recomputing lists -------------------------- */

Test(schedule, verify_zero_bubble_mistakes)
{
    schedule s;
    build(&s, 1, 1, "F0 w0 b0 STEP");
    expect_invalid(&s, "w before b", "op 1: w m=0 comes before b m=0 (op 2)", NULL);
    schedule_free(&s);
    build(&s, 1, 2, "F0 F1 b0 w0 b1 STEP");
    expect_invalid(&s, "missing w", "op 4: b m=1 has no w m=1", "never computed");
    schedule_free(&s);
    build(&s, 1, 1, "F0 w0 STEP");
    expect_invalid(&s, "w without b", "w m=0 has no b m=0 before it", NULL);
    schedule_free(&s);
    build(&s, 1, 2, "F0 F1 b0 b1 w1 w0 STEP");
    expect_invalid(&s, "w out of order", "op 5 (w m=0): comes after w m=1 (op 4)",
                   "micro-batch order 0..1");
    schedule_free(&s);
    build(&s, 1, 2, "F0 F1 b1 b0 w0 w1 STEP");
    expect_invalid(&s, "b out of order", "op 3 (b m=0): comes after b m=1 (op 2)",
                   "input-gradient backwards");
    schedule_free(&s);
    /* a whole backward adds to every bucket: a w of an earlier micro-batch after it is late */
    build(&s, 1, 2, "F0 F1 b0 B1 w0 STEP");
    expect_invalid(&s, "w after a later whole backward", "op 4 (w m=0): comes after B m=1",
                   NULL);
    schedule_free(&s);
    build(&s, 2, 1, "F0 >a0 <g0 b0 w0 STEP", "<a0 F0 >g0 b0 w0 STEP");
    expect_invalid(&s, "send_grad before b",
                   "stage 1 op 2: send_grad m=0 comes before the b m=0 that produces it (op 3)",
                   NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 b0 w0 STEP");
    expect_invalid(&s, "whole and split", "backwarded whole (B) and also split into b and w",
                   NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 b0 w0 w0 STEP");
    expect_invalid(&s, "duplicate w", "op 3: duplicate w m=0 (first at op 2)", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 b0 w0/1 w0/0 A0 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "w parts out of order", "op 2 (w m=0 part 1): part 0 is due first", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 b0 w0/0 A0 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    expect_invalid(&s, "unfinished w", "the weight backward of m=0 is split but stops after "
                   "part 0 (no w m=0 part 1 of 2)", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 b0 A0 w0 W0 STEP");
    set_buckets(&s, 1);
    expect_invalid(&s, "allreduce before w", "op 2: allreduce bucket 0 comes before w m=0 (op "
                   "3), which adds to its gradients", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 b0 w0 STEP");
    s.lists[0].ops[1].bucket = 0;
    expect_invalid(&s, "part of b", "op 1 (b m=0): bucket must be -1, got 0", NULL);
    schedule_free(&s);
    /* the same lists, right, pass */
    build(&s, 2, 2, "F0 >a0 F1 >a1 <g0 b0 w0 <g1 b1 w1/0 A0 w1/1 A1 W0 W1 STEP",
          "<a0 F0 b0 >g0 <a1 F1 b1 >g1 w0 w1/0 A0 w1/1 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    cr_assert_eq(schedule_verify(&s, NULL), 0, "%s", pt_error_get());
    schedule_free(&s);
}

/* A valid hand-built K = 2, V = 2, M = 1 schedule: model chunks (0,0) (1,0) (0,1) (1,1). */
#define CHUNKED_S0 "F0 >a0 <a0.1 F0.1 >a0.1 <g0.1 B0.1 >g0.1 <g0 B0 STEP"
#define CHUNKED_S1 "<a0 F0 >a0 <a0.1 F0.1 B0.1 >g0.1 <g0 B0 >g0 STEP"

Test(schedule, verify_chunk_mistakes)
{
    schedule s;
    build_v(&s, 2, 2, 1, CHUNKED_S0, CHUNKED_S1);
    schedule_report r;
    cr_assert_eq(schedule_verify(&s, &r), 0, "%s", pt_error_get());
    cr_assert_eq(r.virtual_stages, 2);
    cr_assert_eq(r.peak_inflight_chunk[0], 1);
    cr_assert_eq(r.peak_inflight_chunk[1], 1);
    cr_assert_eq(r.peak_inflight[0], 2, "both chunks hold micro-batch 0 at once");
    schedule_report_free(&r);
    schedule_free(&s);
    /* a bad chunk index */
    build_v(&s, 2, 2, 1, "F0 >a0 <a0.1 F0.2 >a0.1 <g0.1 B0.1 >g0.1 <g0 B0 STEP", CHUNKED_S1);
    expect_invalid(&s, "chunk 2 of 2", "stage 0 op 3 (F m=0 chunk 2): chunk 2 out of range "
                   "[0, 2)", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0.1 B0.1 STEP");
    expect_invalid(&s, "chunk with V = 1", "op 0 (F m=0 chunk 1): chunk 1 out of range [0, 1)",
                   NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 B0 STEP");
    s.lists[0].ops[2].chunk = 1;
    expect_invalid(&s, "chunk on the step", "chunk must be 0, got 1", NULL);
    schedule_free(&s);
    /* a deadlock across chunks: stage 0 waits for chunk 0's gradient before it forwards
     * chunk 1; every (stage, chunk) alone is in order */
    build_v(&s, 2, 2, 1, "F0 >a0 <g0 B0 <a0.1 F0.1 >a0.1 <g0.1 B0.1 >g0.1 STEP", CHUNKED_S1);
    expect_invalid(&s, "deadlock across chunks", "deadlock",
                   "stage 0 waits at op 2 (recv_grad m=0 chunk 0 from stage 1); stage 1 waits "
                   "at op 3 (recv_act m=0 chunk 1 from stage 0)");
    schedule_free(&s);
    /* rank 1's chunk 0 sends to rank 0's chunk 1, not to its own chunk 1 */
    build_v(&s, 2, 2, 1, CHUNKED_S0, "<a0 F0 >a0@1 <a0.1 F0.1 B0.1 >g0.1 <g0 B0 >g0 STEP");
    expect_invalid(&s, "wrong wrap-around peer", "stage 1 op 2 (send_act m=0 chunk 0 to stage "
                   "1): wrong peer 1, expected stage 0", "chunk v+1");
    schedule_free(&s);
    /* the last model chunk has nobody to send activations to */
    build_v(&s, 2, 2, 1, CHUNKED_S0,
            "<a0 F0 >a0 <a0.1 F0.1 >a0.1@0 B0.1 >g0.1 <g0 B0 >g0 STEP");
    expect_invalid(&s, "last model chunk sending", "chunk 1 of stage 1 is the last model chunk",
                   NULL);
    schedule_free(&s);
    /* a gradient sent to rank 0's chunk 1, which does not wait for it */
    build_v(&s, 2, 2, 1, "F0 >a0 <a0.1 F0.1 >a0.1 B0.1 >g0.1 <g0 B0 STEP", CHUNKED_S1);
    expect_invalid(&s, "gradient to a chunk that does not receive it", "stage 1 op 6 (send_grad "
                   "m=0 chunk 1 to stage 0): send without receive",
                   "no matching recv_grad m=0 chunk 1 on stage 0");
    schedule_free(&s);
    /* the backward order is per chunk: a later micro-batch of another chunk may come first */
    build_v(&s, 1, 2, 2, "F0 >a0 F1 >a1 <a0.1 F0.1 <a1.1 F1.1 B1.1 >g1.1 B0.1 >g0.1 <g0 B0 "
            "<g1 B1 STEP");
    expect_invalid(&s, "chunk out of order", "op 10 (B m=0 chunk 1): comes after B m=1 chunk 1 "
                   "(op 8)", NULL);
    schedule_free(&s);
}

Test(schedule, verify_recompute_mistakes)
{
    schedule s;
    build(&s, 1, 1, "F0 b0 R0 w0 STEP");
    s.lists[0].recompute = 1;
    expect_invalid(&s, "recompute after the backward", "R m=0 must lie between F m=0 (op 0) "
                   "and b m=0 (op 1)", NULL);
    schedule_free(&s);
    build(&s, 1, 2, "F0 F1 R0 B0 B1 STEP");
    s.lists[0].recompute = 1;
    expect_invalid(&s, "missing recompute", "micro-batch 1 is never recomputed", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "R0 F0 B0 STEP");
    s.lists[0].recompute = 1;
    expect_invalid(&s, "recompute before the forward", "R m=0 must lie between", NULL);
    schedule_free(&s);
    build(&s, 1, 1, "F0 R0 R0 B0 STEP");
    s.lists[0].recompute = 1;
    expect_invalid(&s, "recompute twice", "duplicate R m=0", NULL);
    schedule_free(&s);
    /* without the flag a list need not recompute every micro-batch (as before) */
    build(&s, 1, 2, "F0 F1 R0 B0 B1 STEP");
    cr_assert_eq(schedule_verify(&s, NULL), 0, "%s", pt_error_get());
    schedule_free(&s);
}

/* ---- simulator: chunks, zero bubble, recompute -------------------------------------------- */

Test(schedule, simulate_chunks_by_hand)
{
    schedule s;
    build_v(&s, 2, 2, 1, CHUNKED_S0, CHUNKED_S1);
    /* model chunks c = v·K + s: (0,0)=0 (1,0)=1 (0,1)=2 (1,1)=3 */
    double fwd[4] = {1, 2, 3, 4}, bwd[4] = {10, 20, 30, 40};
    schedule_costs c = {.fwd = fwd, .bwd = bwd};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), 0, "%s", pt_error_get());
    /* F(0) [0,1) F(1) [1,3) F(2) [3,6) F(3) [6,10) B(3) [10,50) B(2) [50,80) B(1) [80,100)
     * B(0) [100,110) */
    double makespan = 110, busy[2] = {44, 66};
    CHECK_CLOSE("makespan", &sim.makespan, &makespan, 1, 1e-12, 0);
    CHECK_CLOSE("busy", sim.busy, busy, 2, 1e-12, 0);
    int b01 = find_op(&s, 0, SCHED_OP_FORWARD, 0) + 3; /* s0: F0 >a0 <a0.1 F0.1 */
    double f_start = 3, f_end = 6;
    CHECK_CLOSE("F chunk 1 start", &sim.start[b01], &f_start, 1, 1e-12, 0);
    CHECK_CLOSE("F chunk 1 end", &sim.end[b01], &f_end, 1, 1e-12, 0);
    schedule_sim_free(&sim);
    /* unit costs: 1/V per chunk op */
    cr_assert_eq(schedule_simulate(&s, NULL, NULL, 0, 0, &sim), 0, "%s", pt_error_get());
    double unit_span = 4, unit_busy = 2;
    CHECK_CLOSE("unit makespan", &sim.makespan, &unit_span, 1, 1e-12, 0);
    CHECK_CLOSE("unit busy", &sim.busy[0], &unit_busy, 1, 1e-12, 0);
    schedule_sim_free(&sim);
    fwd[2] = -1;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), -1);
    cr_assert(strstr(pt_error_get(), "forward cost of model chunk 2 (stage 0 chunk 1) is -1"),
              "%s", pt_error_get());
    schedule_free(&s);
}

Test(schedule, simulate_zero_bubble_and_recompute_costs)
{
    schedule s;
    build(&s, 1, 1, "F0 R0 b0 w0 STEP");
    s.lists[0].recompute = 1;
    double fwd = 2, bwd = 6, in = 1, wt = 4, rc = 5;
    schedule_costs c = {.fwd = &fwd, .bwd = &bwd};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), 0, "%s", pt_error_get());
    /* R = F = 2, b = w = bwd / 2 = 3 */
    double start[5] = {0, 2, 4, 7, 10}, end[5] = {2, 4, 7, 10, 10};
    CHECK_CLOSE("start", sim.start, start, 5, 1e-12, 0);
    CHECK_CLOSE("end", sim.end, end, 5, 1e-12, 0);
    schedule_sim_free(&sim);
    c.bwd_input = &in;
    c.bwd_weight = &wt;
    c.recompute = &rc;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), 0, "%s", pt_error_get());
    double makespan = 2 + 5 + 1 + 4;
    CHECK_CLOSE("makespan", &sim.makespan, &makespan, 1, 1e-12, 0);
    schedule_sim_free(&sim);
    rc = -2;
    cr_assert_eq(schedule_simulate_costs(&s, &c, &sim), -1);
    cr_assert(strstr(pt_error_get(), "recompute cost of stage 0 is -2"), "%s", pt_error_get());
    schedule_free(&s);
    /* a weight backward's parts share its cost like a backward's */
    build(&s, 1, 1, "F0 b0 w0/0 A0 w0/1 A1 W0 W1 STEP");
    set_buckets(&s, 2);
    double share0[2] = {0.25, 0.75};
    const double *share[1] = {share0};
    schedule_costs p = {.fwd = &fwd, .bwd_input = &in, .bwd_weight = &wt, .part_share = share};
    cr_assert_eq(schedule_simulate_costs(&s, &p, &sim), 0, "%s", pt_error_get());
    double w_end[2] = {4, 7};
    CHECK_CLOSE("w part 0 end", &sim.end[2], &w_end[0], 1, 1e-12, 0);
    CHECK_CLOSE("w part 1 end", &sim.end[4], &w_end[1], 1, 1e-12, 0);
    schedule_sim_free(&sim);
    schedule_free(&s);
}

/* ---- printer: chunks and zero bubble ------------------------------------------------------ */

Test(schedule, print_zb_h1_and_interleaved)
{
    schedule s;
    cr_assert_eq(schedule_init_zb_h1(&s, 2, 2), 0);
    char *text = print_to_string(&s);
    const char *want[] = {
        "bm backward of m's input gradient only (zero bubble), wm its weight gradients",
        "\ns0: F0 >a0 F1 >a1 <g0 b0 w0 <g1 b1 w1 STEP\n",
        "\ns1: <a0 F0 b0 >g0 <a1 F1 b1 >g1 w0 w1 STEP\n",
        "unit costs: F = b = w = R = 1 slot",
        "\ns0 | F0 F1  . b0 w0 b1 w1\n",
        "\ns1 |  . F0 b0 F1 b1 w0 w1\n",
        ("bubble (idle share of the step): 0.1429 simulated (unit costs), 0.1429 formula "
         "(K-1)/(3M+K-1) with K=2 V=1 M=2; makespan 7 slots\n"),
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(text, want[i]), "output lacks '%s':\n%s", want[i], text);
    free(text);
    schedule_free(&s);

    cr_assert_eq(schedule_init_interleaved(&s, 2, 2, 2), 0);
    text = print_to_string(&s);
    const char *want_il[] = {
        "schedule 'interleaved': 2 stages, 2 micro-batches, 2 chunks per stage",
        "m.v micro-batch m on the stage's chunk v",
        "\ns0: F0 >a0 F1 >a1 <a0.1 F0.1 >a0.1 <a1.1 F1.1 >a1.1 <g0.1 B0.1 >g0.1",
        "\ns0 |   F0   F1 F0.1 F1.1    . B0.1    . B1.1   B0   B1\n",
        "\ns1 |    .   F0   F1 F0.1 B0.1 F1.1 B1.1   B0   B1    .\n",
        ("bubble (idle share of the step): 0.2000 simulated (unit costs), 0.2000 formula "
         "(K-1)/(V*M+K-1) with K=2 V=2 M=2; makespan 10 slots\n"),
    };
    for (size_t i = 0; i < sizeof want_il / sizeof *want_il; i++)
        cr_assert(strstr(text, want_il[i]), "output lacks '%s':\n%s", want_il[i], text);
    free(text);
    schedule_free(&s);
}
