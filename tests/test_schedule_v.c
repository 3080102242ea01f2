/* The V placement's chunk map, and the schedules of issue 26: zb-h2, zb-v, v-half, v-min
 * (greedy orders) and dualpipev. Each verifies, has every op once where the routing says,
 * keeps to its memory and gives the unit-cost figures stated in schedule.h. Execution is
 * compared with one process in tests/schedule_v_equivalence.sh. */
#include "tests/schedule_build.h"

/* F = b = w = 1 per chunk op (a whole B = 2), messages free. */
static schedule_sim sim_units(const schedule *s)
{
    int C = s->stages * s->virtual_stages;
    double *one = malloc((size_t)C * sizeof *one), *two = malloc((size_t)C * sizeof *two);
    cr_assert(one && two);
    for (int c = 0; c < C; c++) one[c] = 1, two[c] = 2;
    schedule_costs c = {.fwd = one, .bwd = two, .bwd_input = one, .bwd_weight = one,
                        .replicas = 1};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(s, &c, &sim), 0, "%s: %s", s->name, pt_error_get());
    free(one);
    free(two);
    return sim;
}

static int most(const int *a, int n)
{
    int m = 0;
    for (int i = 0; i < n; i++) m = a[i] > m ? a[i] : m;
    return m;
}

Test(schedule_v, chunk_map_round_trip_and_routing)
{
    for (int pl = 0; pl < 2; pl++)
        for (int K = 1; K <= 5; K++)
            for (int V = 1; V <= 4; V++) {
                int seen[20] = {0};
                for (int s = 0; s < K; s++)
                    for (int v = 0; v < V; v++) {
                        int c = schedule_model_chunk_of(K, V, pl, s, v), s2, v2;
                        cr_assert(c >= 0 && c < K * V);
                        seen[c]++;
                        schedule_chunk_place(K, V, pl, c, &s2, &v2);
                        cr_assert(s2 == s && v2 == v, "pl %d K %d V %d (%d,%d)", pl, K, V, s, v);
                    }
                for (int c = 0; c < K * V; c++) cr_assert_eq(seen[c], 1);
            }
    /* V = 2 in a V: rank k holds model chunks k and 2K − 1 − k; K − 1 hands over to itself */
    schedule s;
    cr_assert_eq(schedule_init_named(&s, "zb-v", 4, 1, 4), 0, "%s", pt_error_get());
    cr_assert_eq(s.virtual_stages, 2);
    cr_assert_eq(s.placement, SCHED_PLACE_V);
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(schedule_model_chunk(&s, k, 0), k);
        cr_assert_eq(schedule_model_chunk(&s, k, 1), 7 - k);
    }
    int ns, nc;
    cr_assert_eq(schedule_route_next(&s, 3, 0, &ns, &nc), 1);
    cr_assert(ns == 3 && nc == 1);
    cr_assert_eq(schedule_route_next(&s, 1, 1, &ns, &nc), 1);
    cr_assert(ns == 0 && nc == 1);
    cr_assert_eq(schedule_route_next(&s, 0, 1, NULL, NULL), 0); /* the loss, on rank 0 */
    cr_assert_eq(schedule_route_prev(&s, 0, 0, NULL, NULL), 0); /* the data, on rank 0 */
    int self = 0;
    for (int i = 0; i < s.lists[3].n_ops; i++)
        self += s.lists[3].ops[i].kind == SCHED_OP_SEND_ACT && s.lists[3].ops[i].peer == 3;
    cr_assert_eq(self, 4, "rank 3 hands each micro-batch over to itself");
    schedule_free(&s);
}

/* Every (stage, chunk) forwards each micro-batch once and backwards it once (b then w, or
 * a whole B in dualpipev). */
static void check_counts(const schedule *s)
{
    for (int st = 0; st < s->stages; st++)
        for (int v = 0; v < s->virtual_stages; v++) {
            int f = 0, b = 0, w = 0, B = 0;
            const schedule_list *l = &s->lists[st];
            for (int i = 0; i < l->n_ops; i++) {
                if (l->ops[i].chunk != v) continue;
                f += l->ops[i].kind == SCHED_OP_FORWARD;
                b += l->ops[i].kind == SCHED_OP_BACKWARD_INPUT;
                w += l->ops[i].kind == SCHED_OP_BACKWARD_WEIGHT;
                B += l->ops[i].kind == SCHED_OP_BACKWARD;
            }
            int M = s->microbatches;
            cr_assert(f == M && b == w && b + B == M, "%s stage %d chunk %d: F %d b %d w %d B %d",
                      s->name, st, v, f, b, w, B);
        }
}

Test(schedule_v, all_verify_for_many_shapes)
{
    const char *names[] = {"zb-h2", "zb-v", "v-half", "v-min", "dualpipev"};
    for (int n = 0; n < 5; n++)
        for (int K = 1; K <= 6; K++)
            for (int M = 1; M <= 24; M += M < 8 ? 1 : 8) {
                schedule s;
                int rc = schedule_init_named(&s, names[n], K, 1, M);
                if (!strcmp(names[n], "dualpipev") && M < 2 * K) {
                    cr_assert_eq(rc, -1);
                    cr_assert(strstr(pt_error_get(), "2 micro-batches per stage"), "%s",
                              pt_error_get());
                    continue;
                }
                cr_assert_eq(rc, 0, "%s K=%d M=%d: %s", names[n], K, M, pt_error_get());
                schedule_report r;
                cr_assert_eq(schedule_verify(&s, &r), 0, "%s K=%d M=%d: %s", names[n], K, M,
                             pt_error_get());
                check_counts(&s);
                schedule_report_free(&r);
                schedule_free(&s);
            }
}

Test(schedule_v, zb_h2_zero_bubble_inside_each_stage)
{
    for (int K = 2; K <= 8; K++)
        for (int M = 2 * K - 1; M <= 4 * K; M += K) {
            schedule s;
            schedule_report r;
            cr_assert_eq(schedule_init_named(&s, "zb-h2", K, 1, M), 0);
            cr_assert_eq(schedule_verify(&s, &r), 0);
            schedule_sim sim = sim_units(&s);
            double span = 3.0 * M + K - 1, want = schedule_bubble_formula(&s, NULL);
            cr_assert_eq(sim.makespan, span, "K=%d M=%d: %g", K, M, sim.makespan);
            cr_assert_eq(sim.interior_idle, 0.0, "K=%d M=%d: %g", K, M, sim.interior_idle);
            CHECK_CLOSE("zb-h2 bubble", &sim.bubble, &want, 1, 1e-12, 0);
            /* (2K − 1) micro-batches in flight: the paper's memory */
            cr_assert_eq(most(r.peak_inflight, K), 2 * K - 1, "K=%d M=%d", K, M);
            schedule_sim_free(&sim);
            schedule_report_free(&r);
            schedule_free(&s);
        }
}

Test(schedule_v, dualpipev_reaches_the_v_bound)
{
    for (int K = 2; K <= 8; K++)
        for (int M = 2 * K; M <= 6 * K; M += 2 * K) {
            schedule s;
            schedule_report r;
            cr_assert_eq(schedule_init_named(&s, "dualpipev", K, 1, M), 0);
            cr_assert_eq(schedule_verify(&s, &r), 0);
            schedule_sim sim = sim_units(&s);
            double want = schedule_bubble_formula(&s, NULL);
            cr_assert_eq(sim.makespan, 6.0 * M + K - 1, "K=%d M=%d: %g", K, M, sim.makespan);
            CHECK_CLOSE("dualpipev bubble", &sim.bubble, &want, 1, 1e-12, 0);
            /* 2K + 1 chunk activations (K + ½ whole micro-batches) on every rank */
            for (int st = 0; st < K; st++)
                cr_assert_eq(r.peak_inflight[st], 2 * K + 1, "K=%d M=%d st %d", K, M, st);
            schedule_sim_free(&sim);
            schedule_report_free(&r);
            schedule_free(&s);
        }
}

/* zb-v: 1F1B's memory (2K chunk activations = K micro-batches), at most half its bubble for
 * M >= 2K, and the V bound at K = 4 (the target). */
Test(schedule_v, zb_v_memory_and_bubble)
{
    for (int K = 2; K <= 8; K++)
        for (int M = 2 * K; M <= 32; M *= 2) {
            schedule s, o;
            schedule_report r;
            cr_assert_eq(schedule_init_named(&s, "zb-v", K, 1, M), 0);
            cr_assert_eq(schedule_init_named(&o, "1f1b", K, 1, M), 0);
            cr_assert_eq(schedule_verify(&s, &r), 0);
            cr_assert(most(r.peak_inflight, K) <= 2 * K, "K=%d M=%d: %d", K, M,
                      most(r.peak_inflight, K));
            schedule_sim sim = sim_units(&s), ref = sim_units(&o);
            cr_assert(sim.bubble <= ref.bubble / 2, "K=%d M=%d: zb-v %g, 1f1b %g", K, M,
                      sim.bubble, ref.bubble);
            if (K == 4) {
                double want = schedule_bubble_formula(&s, NULL);
                CHECK_CLOSE("zb-v bubble at K = 4", &sim.bubble, &want, 1, 1e-12, 0);
            }
            schedule_sim_free(&sim);
            schedule_sim_free(&ref);
            schedule_report_free(&r);
            schedule_free(&s);
            schedule_free(&o);
        }
}

/* v-half and v-min keep to their caps: K + 1 and ⌈2K/3⌉ + 1 chunk activations. */
Test(schedule_v, v_half_and_v_min_memory)
{
    for (int K = 2; K <= 8; K++)
        for (int M = 1; M <= 16; M *= 2) {
            schedule s;
            schedule_report r;
            cr_assert_eq(schedule_init_named(&s, "v-half", K, 1, M), 0);
            cr_assert_eq(schedule_verify(&s, &r), 0);
            cr_assert(most(r.peak_inflight, K) <= K + 1);
            schedule_report_free(&r);
            schedule_free(&s);
            cr_assert_eq(schedule_init_named(&s, "v-min", K, 1, M), 0);
            cr_assert_eq(schedule_verify(&s, &r), 0);
            int cap = (2 * K + 2) / 3 + 1;
            cr_assert(most(r.peak_inflight, K) <= (cap < 2 ? 2 : cap));
            schedule_report_free(&r);
            schedule_free(&s);
        }
}

Test(schedule_v, errors)
{
    schedule s;
    cr_assert_eq(schedule_init_named(&s, "zb-v", 2, 3, 4), -1);
    cr_assert(strstr(pt_error_get(), "even number"), "%s", pt_error_get());
    cr_assert_eq(schedule_init_named(&s, "dualpipev", 2, 4, 4), -1);
    cr_assert(strstr(pt_error_get(), "2 chunks per rank"), "%s", pt_error_get());
    cr_assert_eq(schedule_init_named(&s, "zb-h2", 2, 2, 4), -1);
    cr_assert_eq(schedule_init_named(&s, "zb-x", 2, 1, 4), -1);
    cr_assert(strstr(pt_error_get(), "dualpipev"), "%s", pt_error_get());
    int cap[2] = {1, 4};
    schedule_greedy_config cfg = {.cap = cap};
    cr_assert_eq(schedule_init_greedy(&s, "g", 2, 2, SCHED_PLACE_V, 4, &cfg), -1);
    cr_assert(strstr(pt_error_get(), "stage 0 may hold 1"), "%s", pt_error_get());
    /* the verifier sees a missing hand-over on the V's turn */
    cr_assert_eq(schedule_init_named(&s, "zb-v", 2, 1, 2), 0);
    schedule_list *l = &s.lists[1];
    for (int i = 0; i < l->n_ops; i++)
        if (l->ops[i].kind == SCHED_OP_SEND_ACT && l->ops[i].peer == 1) {
            memmove(&l->ops[i], &l->ops[i + 1], (size_t)(l->n_ops - i - 1) * sizeof *l->ops);
            l->n_ops--;
            break;
        }
    cr_assert_eq(schedule_verify(&s, NULL), -1);
    cr_assert(strstr(pt_error_get(), "stage 1"), "%s", pt_error_get());
    schedule_free(&s);
}

/* The greedy scheduler with uneven costs: a heavy last model chunk. Verified, and never
 * slower than 1F1B on the same costs (a cap of 1F1B's memory). */
Test(schedule_v, greedy_uneven_costs)
{
    int K = 4, M = 8, C = 2 * K;
    double f[8], b[8], w[8], bb[8];
    for (int c = 0; c < C; c++) f[c] = 1, b[c] = 1, w[c] = 1;
    f[C - 1] = 3, b[C - 1] = 3, w[C - 1] = 2;
    for (int c = 0; c < C; c++) bb[c] = b[c] + w[c];
    int cap[4] = {8, 8, 8, 8};
    schedule_greedy_config cfg = {.fwd = f, .bwd_input = b, .bwd_weight = w, .cap = cap};
    schedule s;
    cr_assert_eq(schedule_init_greedy_best(&s, "search", K, 2, SCHED_PLACE_V, M, &cfg), 0,
                 "%s", pt_error_get());
    schedule_report r;
    cr_assert_eq(schedule_verify(&s, &r), 0, "%s", pt_error_get());
    cr_assert(most(r.peak_inflight, K) <= 8);
    schedule_costs sc = {.fwd = f, .bwd = bb, .bwd_input = b, .bwd_weight = w, .replicas = 1};
    schedule_sim sim;
    cr_assert_eq(schedule_simulate_costs(&s, &sc, &sim), 0);
    double work = 0;
    for (int c = 0; c < C; c++)
        if (schedule_model_chunk(&s, 0, 0) == c || schedule_model_chunk(&s, 0, 1) == c)
            work += M * (f[c] + b[c] + w[c]);
    cr_assert(sim.makespan >= work);
    cr_assert(sim.makespan <= work * 1.2, "makespan %g, rank 0's work %g", sim.makespan, work);
    schedule_sim_free(&sim);
    schedule_report_free(&r);
    schedule_free(&s);
}

/* The nine named schedules the buffer tests run, at V = 2 where they take chunks. */
static const char *const buffer_names[] = {"gpipe", "1f1b",  "zb-h1",  "interleaved",
                                           "zb-h2", "zb-v",  "v-half", "v-min",
                                           "dualpipev"};
enum { N_NAMES = sizeof buffer_names / sizeof *buffer_names };

static int init_named(schedule *s, size_t k, int K, int M)
{
    int V = !strcmp(buffer_names[k], "interleaved") || schedule_is_v(buffer_names[k]) ? 2 : 1;
    cr_assert_eq(schedule_init_named(s, buffer_names[k], K, V, M), 0, "%s", pt_error_get());
    return V;
}

/* Receive buffers by liveness (schedule_receive_buffers): m's receive of each kind is posted
 * after m − n's last read of that kind and before m's own receive op, and no fewer buffers
 * would do; W reads each kind only where w_reads says, and the net's last chunk's forward
 * writes the loss gradient where a gradient is received. GPipe receives every activation
 * before its first backward (one buffer per micro-batch), 1F1B's last stage uses each at once,
 * and every V schedule needs fewer than M, fewer still where W reads neither buffer. */
static int arrival(const schedule *s, int st, int v, int m, int grad)
{
    const schedule_list *l = &s->lists[st];
    int V = s->virtual_stages, ends = schedule_model_chunk(s, st, v) == s->stages * V - 1;
    for (int i = 0; i < l->n_ops; i++) {
        schedule_op_kind k = l->ops[i].kind;
        if (l->ops[i].chunk == v && l->ops[i].microbatch == m &&
            (k == (grad ? SCHED_OP_RECV_GRAD : SCHED_OP_RECV_ACT) ||
             (grad && ends && k == SCHED_OP_FORWARD)))
            return i;
    }
    return -1;
}

static int last_use(const schedule_list *l, int v, int m, int grad, int w_reads)
{
    int last = -1;
    for (int i = 0; i < l->n_ops; i++) {
        const schedule_op *op = &l->ops[i];
        schedule_op_kind k = op->kind;
        if (op->chunk != v || op->microbatch != m || k == SCHED_OP_SEND_ACT ||
            k == SCHED_OP_SEND_GRAD || k == (grad ? SCHED_OP_RECV_ACT : SCHED_OP_RECV_GRAD))
            continue;
        if (grad && (k == SCHED_OP_FORWARD || k == SCHED_OP_RECOMPUTE)) continue;
        if (k == SCHED_OP_BACKWARD_WEIGHT &&
            !(w_reads & (grad ? SCHED_W_READS_GRAD : SCHED_W_READS_ACT)))
            continue;
        last = i;
    }
    return last;
}

static int receive_buffers_hold(const schedule *s, int st, int v, int n, int grad, int w_reads)
{
    for (int m = n; m < s->microbatches; m++) {
        int r = arrival(s, st, v, m, grad);
        if (r >= 0 && last_use(&s->lists[st], v, m - n, grad, w_reads) >= r) return 0;
    }
    return 1;
}

Test(schedule_v, receive_buffers_by_liveness)
{
    int K = 4, M = 8, after[16];
    const int reads[2] = {SCHED_W_READS_ACT | SCHED_W_READS_GRAD, 0};
    for (size_t k = 0; k < N_NAMES; k++) {
        schedule s;
        int V = init_named(&s, k, K, M), least = schedule_least_receive_buffers(&s), n[2];
        int most = 0, sum[2] = {0, 0};
        cr_assert_eq(least, V > 1 ? 1 : 3);
        for (int w = 0; w < 2; w++)
            for (int st = 0; st < K; st++)
                for (int v = 0; v < V; v++) {
                    cr_assert_eq(schedule_receive_buffers(&s, st, v, least, reads[w], n, after), 0);
                    for (int grad = 0; grad < 2; grad++) {
                        int nk = n[grad], lk = grad ? 1 : least;
                        cr_assert(nk >= lk && nk <= M, "%s (%d, %d): %d", buffer_names[k], st, v,
                                  nk);
                        cr_assert(receive_buffers_hold(&s, st, v, nk, grad, reads[w]),
                                  "%s (%d, %d) kind %d w_reads %d: %d buffers overlap",
                                  buffer_names[k], st, v, grad, reads[w], nk);
                        cr_assert(nk == lk ||
                                      !receive_buffers_hold(&s, st, v, nk - 1, grad, reads[w]),
                                  "%s (%d, %d) kind %d w_reads %d: %d buffers would do, not %d",
                                  buffer_names[k], st, v, grad, reads[w], nk - 1, nk);
                        for (int m = 0; m < M; m++) {
                            int r = arrival(&s, st, v, m, grad), a = after[grad * M + m];
                            cr_assert(m < nk ? a == -1
                                             : a == last_use(&s.lists[st], v, m - nk, grad,
                                                             reads[w]) &&
                                                   (r < 0 || a < r),
                                      "%s (%d, %d): m=%d's kind %d posted after op %d",
                                      buffer_names[k], st, v, m, grad, a);
                        }
                        if (w == 0) most = nk > most ? nk : most;
                        sum[w] += nk;
                    }
                }
        int both = SCHED_W_READS_ACT | SCHED_W_READS_GRAD;
        if (!strcmp(buffer_names[k], "gpipe")) {
            cr_assert_eq(schedule_receive_buffers(&s, 1, 0, least, both, n, NULL), 0);
            cr_assert_eq(n[0], M);
        }
        if (!strcmp(buffer_names[k], "1f1b")) {
            cr_assert_eq(schedule_receive_buffers(&s, K - 1, 0, least, both, n, NULL), 0);
            cr_assert_eq(n[0], 3);
            cr_assert_eq(n[1], 1, "1f1b's last stage computes each loss gradient just before "
                         "its backward: %d buffers", n[1]);
        }
        if (V == 2 && strcmp(buffer_names[k], "interleaved"))
            cr_assert(most < M, "%s: %d receive buffers somewhere", buffer_names[k], most);
        /* where W reads neither buffer, ZB-V's receive buffers end at B: fewer */
        if (!strcmp(buffer_names[k], "zb-v"))
            cr_assert(sum[1] < sum[0], "zb-v: %d receive buffers with W reading none, %d with "
                      "W reading both", sum[1], sum[0]);
        schedule_free(&s);
    }
}

/* Gradient send buffers by liveness (schedule_send_buffers): with n buffers, the
 * receiver's RECV of m − n must happen before the sender's first backward of m (then that
 * send is over when its buffer is written again). Checked here by a search over the
 * events (program order, and each receive after its send; another method than the
 * function's clocks), for n and, where n > 1, against n − 1; 1F1B's stage s needs K − s + 1
 * (its micro-batches in flight, and one more), GPipe M, and ZB-V fewer than M. */
static int grad_op(const schedule_list *l, int v, int m, int backward)
{
    for (int i = 0; i < l->n_ops; i++) {
        const schedule_op *op = &l->ops[i];
        int is = backward ? op->kind == SCHED_OP_BACKWARD || op->kind == SCHED_OP_BACKWARD_INPUT
                          : op->kind == SCHED_OP_RECV_GRAD;
        if (is && op->chunk == v && op->microbatch == m) return i;
    }
    return -1;
}

/* Whether op (st, i) is reached from op (from, j) over program order and messages. */
static int reaches(const schedule *s, int from, int j, int st, int i)
{
    int K = s->stages, total = 0;
    for (int q = 0; q < K; q++) total += s->lists[q].n_ops;
    char *seen = calloc((size_t)total, 1);
    int *base = calloc((size_t)K + 1, sizeof *base);
    int *stack = malloc((size_t)total * 2 * sizeof *stack);
    for (int q = 0; q < K; q++) base[q + 1] = base[q] + s->lists[q].n_ops;
    int top = 0, found = 0;
    stack[top++] = from, stack[top++] = j;
    while (top && !found) {
        int ci = stack[--top], cs = stack[--top];
        if (seen[base[cs] + ci]) continue;
        seen[base[cs] + ci] = 1;
        if (cs == st && ci <= i) found = 1; /* program order from there */
        const schedule_op *op = &s->lists[cs].ops[ci];
        if (ci + 1 < s->lists[cs].n_ops) stack[top++] = cs, stack[top++] = ci + 1;
        int act = op->kind == SCHED_OP_SEND_ACT, ps = -1, pv = -1;
        if (act || op->kind == SCHED_OP_SEND_GRAD) {
            /* the receiving chunk, as the routing names it (two chunks of a rank may send
             * the same kind and micro-batch to one peer rank) */
            if (act) schedule_route_next(s, cs, op->chunk, &ps, &pv);
            else schedule_route_prev(s, cs, op->chunk, &ps, &pv);
            schedule_op_kind want = act ? SCHED_OP_RECV_ACT : SCHED_OP_RECV_GRAD;
            const schedule_list *pl = &s->lists[ps];
            for (int k = 0; k < pl->n_ops; k++)
                if (pl->ops[k].kind == want && pl->ops[k].microbatch == op->microbatch &&
                    pl->ops[k].chunk == pv && !seen[base[ps] + k])
                    stack[top++] = ps, stack[top++] = k;
        }
    }
    free(seen);
    free(base);
    free(stack);
    return found;
}

static int sends_free(const schedule *s, int st, int v, int n)
{
    int to, tv;
    if (!schedule_route_prev(s, st, v, &to, &tv)) return 1;
    for (int m = n; m < s->microbatches; m++) {
        int b = grad_op(&s->lists[st], v, m, 1), r = grad_op(&s->lists[to], tv, m - n, 0);
        if (b >= 0 && r >= 0 && !reaches(s, to, r, st, b)) return 0;
    }
    return 1;
}

Test(schedule_v, send_buffers_by_liveness)
{
    int K = 4, M = 8, n[16];
    for (size_t k = 0; k < N_NAMES; k++) {
        schedule s;
        int V = init_named(&s, k, K, M);
        cr_assert_eq(schedule_send_buffers(&s, 1, n), 0, "%s", pt_error_get());
        int most = 0;
        for (int st = 0; st < K; st++)
            for (int v = 0; v < V; v++) {
                int c = n[st * V + v];
                cr_assert(c >= 1 && c <= M, "%s (%d, %d): %d", buffer_names[k], st, v, c);
                cr_assert(sends_free(&s, st, v, c), "%s (%d, %d): %d buffers overlap",
                          buffer_names[k], st, v, c);
                cr_assert(c == 1 || !sends_free(&s, st, v, c - 1),
                          "%s (%d, %d): %d buffers would do, not %d", buffer_names[k], st, v, c - 1, c);
                most = c > most ? c : most;
            }
        for (int st = 1; !strcmp(buffer_names[k], "1f1b") && st < K; st++)
            cr_assert_eq(n[st], K - st + 1, "1f1b stage %d: %d", st, n[st]);
        for (int st = 1; !strcmp(buffer_names[k], "gpipe") && st < K; st++)
            cr_assert_eq(n[st], M, "gpipe stage %d: %d", st, n[st]);
        if (!strcmp(buffer_names[k], "zb-v")) cr_assert(most < M, "zb-v: %d send buffers", most);
        schedule_free(&s);
    }
}
