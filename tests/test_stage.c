/* The stage's gradient accumulation (src/cpu/stage.h): each micro-batch's gradient is rounded
 * on its own before it joins the step's sum, so that a micro-batch's gradient formed apart
 * (stage_backward_to, what data-parallel replicas reduce in a fixed order) adds up to the
 * same bits; and the sum does not depend on the thread count. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/model/net.h"
#include "src/cpu/stage.h"
#include "tests/check.h"

void openblas_set_num_threads(int);


/* Forward and backward of micro-batch m (n samples of deterministic data) into `grads`
 * (NULL: accumulate into the stage's gradients). bounds: NULL, one stage_backward_to; else
 * stage_backward_range over each [bounds[k + 1], bounds[k]) (bounds descend from the layer
 * count to 0). din (may be NULL) receives the gradient of the stage's input. */
static void run_microbatch_ranges(stage *s, int m, int n, float *grads, const int *bounds,
                                  float *din)
{
    size_t in = stage_in_count(s), out = stage_out_count(s);
    float *x = malloc((size_t)n * in * sizeof *x), *dy = malloc((size_t)n * out * sizeof *dy);
    int64_t *ids = malloc((size_t)n * sizeof *ids);
    cr_assert(x && dy && ids);
    for (size_t i = 0; i < (size_t)n * in; i++) x[i] = rng_uniform_at(7, 100 + (uint64_t)m, i);
    for (size_t i = 0; i < (size_t)n * out; i++)
        dy[i] = rng_uniform_at(7, 200 + (uint64_t)m, i) - 0.5f;
    for (int i = 0; i < n; i++) ids[i] = (int64_t)m * n + i;
    int slot = stage_slot_acquire(s);
    cr_assert_geq(slot, 0);
    stage_forward(s, slot, x, n, ids, 3, 0, 1);
    if (!bounds) {
        stage_backward_to(s, slot, dy, din, grads);
    } else {
        for (int k = 0; bounds[k] > 0 && bounds[k + 1] >= 0; k++)
            cr_assert_eq(stage_backward_range(s, slot, bounds[k + 1], bounds[k], dy, din, grads),
                         0, "range [%d, %d): %s", bounds[k + 1], bounds[k], pt_error_get());
    }
    stage_slot_release(s, slot);
    free(x);
    free(dy);
    free(ids);
}

static void run_microbatch(stage *s, int m, int n, float *grads)
{
    run_microbatch_ranges(s, m, n, grads, NULL, NULL);
}

static void check_pieces_add_up(const char *model, int threads, int n, int M)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, model);
    stage a, b;
    cr_assert_eq(stage_init(&a, &net, 0, net.n_layers, n, 1, threads), 0, "%s", pt_error_get());
    cr_assert_eq(stage_init(&b, &net, 0, net.n_layers, n, 1, threads), 0, "%s", pt_error_get());
    stage_init_params(&a, 11);
    stage_init_params(&b, 11);
    size_t P = a.plan.param_count;
    float *piece = malloc(P * sizeof *piece), *sum = calloc(P, sizeof *sum);
    cr_assert(piece && sum);
    for (int m = 0; m < M; m++) {
        run_microbatch(&a, m, n, NULL);
        run_microbatch(&b, m, n, piece);
        if (m == 0) memcpy(sum, piece, P * sizeof *sum);
        else
            for (size_t i = 0; i < P; i++) sum[i] += piece[i];
    }
    size_t diff = 0;
    for (size_t i = 0; i < P; i++) diff += memcmp(&sum[i], &a.grads[i], sizeof(float)) != 0;
    cr_assert_eq(diff, 0, "%s, %d threads, %d micro-batches of %d: %zu of %zu gradients differ",
                 model, threads, M, n, diff, P);
    /* the stage's own gradients were left alone by stage_backward_to */
    for (size_t i = 0; i < P; i++) cr_assert_eq(b.grads[i], 0.0f);
    free(piece);
    free(sum);
    stage_free(&a);
    stage_free(&b);
    net_desc_free(&net);
}

Test(stage, microbatch_gradients_formed_apart_add_up_to_the_same_bits)
{
    check_pieces_add_up("seed-mlp.cfg", 1, 100, 3);
    check_pieces_add_up("seed-mlp.cfg", 2, 300, 4);
    check_pieces_add_up("seed-cnn.cfg", 1, 40, 3);
    check_pieces_add_up("seed-cnn.cfg", 2, 70, 2);
}

/* The comparison can fail: a sum in another order (pieces added to the last one first)
 * differs somewhere for a net this size. */
Test(stage, another_summation_order_differs)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    stage a;
    cr_assert_eq(stage_init(&a, &net, 0, net.n_layers, 64, 1, 1), 0);
    stage_init_params(&a, 11);
    size_t P = a.plan.param_count;
    float *p[3], *fwd = calloc(P, sizeof(float)), *rev = calloc(P, sizeof(float));
    for (int m = 0; m < 3; m++) {
        p[m] = malloc(P * sizeof(float));
        run_microbatch(&a, m, 64, p[m]);
    }
    size_t diff = 0;
    for (size_t i = 0; i < P; i++) {
        fwd[i] = (p[0][i] + p[1][i]) + p[2][i];
        rev[i] = p[0][i] + (p[1][i] + p[2][i]);
        diff += fwd[i] != rev[i];
    }
    cr_assert_gt(diff, 0, "no gradient depends on the summation order: the test is blind");
    for (int m = 0; m < 3; m++) free(p[m]);
    free(fwd);
    free(rev);
    stage_free(&a);
    net_desc_free(&net);
}

Test(stage, sum_is_the_same_for_one_and_two_threads)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    stage s[2];
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(stage_init(&s[k], &net, 0, net.n_layers, 50, 1, k + 1), 0);
        stage_init_params(&s[k], 5);
        for (int m = 0; m < 3; m++) run_microbatch(&s[k], m, 50, NULL);
    }
    cr_assert_eq(memcmp(s[0].grads, s[1].grads, s[0].plan.param_count * sizeof(float)), 0);
    stage_free(&s[0]);
    stage_free(&s[1]);
    net_desc_free(&net);
}


/* Layers [first, last) of `model`: M micro-batches of n samples, each by the ranges of
 * `bounds` on one stage and whole on another. pieces = 0: accumulated in the stage's
 * gradients (the first micro-batch in place, later ones formed apart and added); P > 0: as
 * the engine's grad_pieces, micro-batch m's gradient formed alone in piece m mod P, piece 0
 * being the stage's gradients. Gradients and the input's gradient must be the same bits. */
static void check_ranges(const char *model, int first, int last, int threads, int n, int M,
                         const int *bounds, int pieces)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, model);
    if (last <= 0) last = net.n_layers;
    stage a, b;
    cr_assert_eq(stage_init(&a, &net, first, last, n, 1, threads), 0, "%s", pt_error_get());
    cr_assert_eq(stage_init(&b, &net, first, last, n, 1, threads), 0, "%s", pt_error_get());
    stage_init_params(&a, 11);
    stage_init_params(&b, 11);
    size_t P = a.plan.param_count, I = (size_t)n * stage_in_count(&a);
    float *pa[4] = {a.grads}, *pb[4] = {b.grads};
    for (int p = 1; p < pieces; p++) {
        pa[p] = calloc(P, sizeof(float));
        pb[p] = calloc(P, sizeof(float));
        cr_assert(pa[p] && pb[p]);
    }
    float *da = malloc(I * sizeof(float)), *db = malloc(I * sizeof(float));
    cr_assert(da && db);
    char what[160];
    int nb = 0;
    while (bounds[nb] > 0) nb++;
    snprintf(what, sizeof what, "%s [%d, %d), %d threads, %d ranges, %d pieces", model, first,
             last, threads, nb, pieces);
    for (int m = 0; m < M; m++) {
        float *ga = pieces ? pa[m % pieces] : NULL, *gb = pieces ? pb[m % pieces] : NULL;
        run_microbatch_ranges(&a, m, n, ga, NULL, da);
        run_microbatch_ranges(&b, m, n, gb, bounds, db);
        cr_assert_eq(count_differences(da, db, I), 0, "%s: micro-batch %d: input gradients "
                     "differ", what, m);
        if (pieces) {
            size_t d = count_differences(ga, gb, P);
            cr_assert_eq(d, 0, "%s: micro-batch %d: %zu of %zu gradients differ", what, m, d, P);
        }
    }
    size_t d = count_differences(a.grads, b.grads, P), nonzero = 0;
    for (size_t i = 0; i < P; i++) nonzero += a.grads[i] != 0;
    cr_assert_eq(d, 0, "%s: %zu of %zu gradients differ", what, d, P);
    cr_assert_gt(nonzero, P / 2, "%s: only %zu of %zu gradients are nonzero", what, nonzero, P);
    for (int p = 1; p < pieces; p++) {
        free(pa[p]);
        free(pb[p]);
    }
    free(da);
    free(db);
    stage_free(&a);
    stage_free(&b);
    net_desc_free(&net);
}

/* seed-cnn: 0 conv, 1 maxpool, 2 conv, 3 maxpool, 4 conv, 5 maxpool, 6 flatten,
 * 7 dropout, 8..10 dense. seed-mlp: 0..2 dense. */
static const int cnn_each[] = {11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
static const int cnn_dense[] = {11, 8, 0};           /* convolutions | dense layers */
static const int cnn_identity[] = {11, 9, 7, 6, 0};  /* flatten alone; dropout | dense */
static const int cnn_whole[] = {11, 0};
static const int mlp_each[] = {3, 2, 1, 0};
static const int mlp_top[] = {3, 2, 0};

Test(stage, backward_by_ranges_is_the_whole_backward_bit_for_bit)
{
    for (int threads = 1; threads <= 2; threads++) {
        /* 70 samples: 5 chunks of 16, so a group sums two chunks */
        check_ranges("seed-cnn.cfg", 0, 0, threads, 70, 3, cnn_each, 0);
        check_ranges("seed-cnn.cfg", 0, 0, threads, 70, 3, cnn_dense, 0);
        check_ranges("seed-cnn.cfg", 0, 0, threads, 40, 2, cnn_identity, 0);
        check_ranges("seed-cnn.cfg", 0, 0, threads, 40, 2, cnn_whole, 0);
        check_ranges("seed-mlp.cfg", 0, 0, threads, 300, 3, mlp_each, 0);
        check_ranges("seed-mlp.cfg", 0, 0, threads, 100, 3, mlp_top, 0);
    }
}

Test(stage, backward_by_ranges_of_a_middle_stage)
{
    /* layers 2..8 (conv .. dense) as local layers 0..6, the input's gradient compared */
    static const int each[] = {7, 6, 5, 4, 3, 2, 1, 0}, two[] = {7, 4, 0};
    check_ranges("seed-cnn.cfg", 2, 9, 2, 40, 3, each, 0);
    check_ranges("seed-cnn.cfg", 2, 9, 1, 40, 3, two, 0);
}

Test(stage, backward_by_ranges_into_pieces)
{
    for (int threads = 1; threads <= 2; threads++) {
        check_ranges("seed-cnn.cfg", 0, 0, threads, 40, 4, cnn_dense, 2);
        check_ranges("seed-cnn.cfg", 0, 0, threads, 40, 3, cnn_each, 3);
        check_ranges("seed-mlp.cfg", 0, 0, threads, 300, 4, mlp_each, 2);
    }
}

Test(stage, backward_ranges_out_of_order_are_refused)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    stage s;
    cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, 8, 2, 1), 0);
    stage_init_params(&s, 1);
    float *x = calloc(8 * 784, sizeof(float)), *dy = calloc(8 * 10, sizeof(float));
    int64_t ids[8] = {0};
    int k0 = stage_slot_acquire(&s), k1 = stage_slot_acquire(&s);
    stage_forward(&s, k0, x, 8, ids, 1, 0, 1);
    stage_forward(&s, k1, x, 8, ids, 1, 0, 1);
    cr_assert_neq(stage_backward_range(&s, k0, 0, 2, dy, NULL, NULL), 0, "not from the top");
    cr_assert(strstr(pt_error_get(), "out of order"), "%s", pt_error_get());
    cr_assert_neq(stage_backward_range(&s, k0, 2, 2, dy, NULL, NULL), 0, "empty range");
    cr_assert_neq(stage_backward_range(&s, k0, 2, 4, dy, NULL, NULL), 0, "past the stage");
    cr_assert_eq(stage_backward_range(&s, k0, 2, 3, dy, NULL, NULL), 0, "%s", pt_error_get());
    cr_assert_neq(stage_backward_range(&s, k1, 3, 3, dy, NULL, NULL), 0, "empty range");
    cr_assert_neq(stage_backward_range(&s, k1, 0, 3, dy, NULL, NULL), 0, "other micro-batch");
    cr_assert_neq(stage_backward_range(&s, k0, 0, 1, dy, NULL, NULL), 0, "gap");
    cr_assert_neq(stage_backward_range(&s, k0, 0, 2, dy, NULL, s.grads), 0, "other target");
    cr_assert_eq(stage_backward_range(&s, k0, 0, 2, dy, NULL, NULL), 0, "%s", pt_error_get());
    cr_assert_eq(stage_backward_range(&s, k1, 0, 3, dy, NULL, NULL), 0, "%s", pt_error_get());
    /* zeroing ends a sequence left unfinished */
    cr_assert_eq(stage_backward_range(&s, k0, 1, 3, dy, NULL, NULL), 0, "%s", pt_error_get());
    stage_zero_grad(&s);
    cr_assert_eq(stage_backward_range(&s, k1, 1, 3, dy, NULL, NULL), 0, "%s", pt_error_get());
    free(x);
    free(dy);
    stage_free(&s);
    net_desc_free(&net);
}

/* The range comparison can fail: ranges that skip a layer leave its gradients out. */
Test(stage, backward_ranges_comparison_can_fail)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    stage a, b;
    cr_assert_eq(stage_init(&a, &net, 0, net.n_layers, 64, 1, 1), 0);
    cr_assert_eq(stage_init(&b, &net, 0, net.n_layers, 64, 1, 1), 0);
    stage_init_params(&a, 11);
    stage_init_params(&b, 11);
    static const int top_only[] = {3, 1, -1}; /* stops before layer 0 */
    run_microbatch_ranges(&a, 0, 64, NULL, NULL, NULL);
    run_microbatch_ranges(&b, 0, 64, NULL, top_only, NULL);
    size_t P = a.plan.param_count, first = b.plan.param_off[1];
    cr_assert_eq(count_differences(a.grads + first, b.grads + first, P - first), 0);
    cr_assert_gt(count_differences(a.grads, b.grads, first), 0);
    stage_free(&a);
    stage_free(&b);
    net_desc_free(&net);
}

/* The planner's figures (stage_estimate) are what stage_init allocates: activations per
 * slot, parameter state, gradient groups, for whole nets and parts, several batch sizes
 * and thread counts. */
static void check_estimate(const char *model, int first, int last, int batch, int threads)
{
    net_desc net;
    load_model(&net, model);
    if (last < 0) last = net.n_layers;
    stage s;
    cr_assert_eq(stage_init(&s, &net, first, last, batch, 2, threads), 0, "%s", pt_error_get());
    stage_bytes b = stage_estimate(&net, first, last, batch, threads);
    cr_expect_eq(b.slot, s.plan.slot_bytes, "%s [%d,%d) batch %d: slot %zu, stage_init %zu",
                 model, first, last, batch, b.slot, s.plan.slot_bytes);
    size_t block = (s.plan.param_count * sizeof(float) + 63) / 64 * 64;
    cr_expect_eq(b.state, 4 * block, "%s: state %zu, expected %zu", model, b.state, 4 * block);
    size_t groups = 1; /* mb_grads */
    for (int g = 1; g < s.groups; g++) groups += s.group_grads[g] != NULL;
    size_t part = (size_t)threads * s.fold_floats * sizeof(float); /* the fold's parts */
    cr_expect_eq(b.groups, groups * block + part,
                 "%s batch %d threads %d: groups %zu, expected %zu", model, batch, threads,
                 b.groups, groups * block + part);
    size_t scratch =
        (s.plan.widest * (size_t)stage_chunk(&s, batch) * sizeof(float) + 63) / 64 * 64;
    cr_expect_geq(b.workers, (size_t)threads * 2 * scratch, "%s: workers %zu", model, b.workers);
    stage_free(&s);
    net_desc_free(&net);
}

Test(stage, estimate_matches_what_stage_init_allocates)
{
    const int batches[] = {1, 16, 33, 128};
    for (int i = 0; i < 4; i++)
        for (int t = 1; t <= 5; t += 4) {
            check_estimate("seed-cnn.cfg", 0, -1, batches[i], t);
            check_estimate("seed-cnn.cfg", 3, 9, batches[i], t);
            check_estimate("seed-mlp.cfg", 0, -1, batches[i], t);
            check_estimate("seed-mlp.cfg", 1, 2, batches[i], t);
            /* a language model's micro-batch: one window per chunk, the groups folded at
             * one thread (stage_folds) */
            check_estimate("gpt-deep.cfg", 0, -1, 1 + i * 3, t);
            check_estimate("gpt-deep.cfg", 3, 5, 1 + i * 3, t);
        }
}
