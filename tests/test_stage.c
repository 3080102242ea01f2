/* The stage's gradient accumulation (src/stage.h): each micro-batch's gradient is rounded
 * on its own before it joins the step's sum, so that a micro-batch's gradient formed apart
 * (stage_backward_to, what data-parallel replicas reduce in a fixed order) adds up to the
 * same bits; and the sum does not depend on the thread count. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/model/net.h"
#include "src/stage.h"

void openblas_set_num_threads(int);

static void load_model(net_desc *net, const char *name)
{
    const char *src = getenv("PT_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/%s", src ? src : ".", name);
    cr_assert_eq(net_desc_load(net, path), 0, "%s", pt_error_get());
}

/* Forward and backward of micro-batch m (n samples of deterministic data) into `grads`
 * (NULL: accumulate into the stage's gradients), the backward cut at the local layer
 * boundaries cuts[0] > cuts[1] > ... > 0 (ncuts of them; 0: one whole backward); din, when
 * given, receives the input's gradient. */
static void run_microbatch_cut(stage *s, int m, int n, float *grads, const int *cuts, int ncuts,
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
    int hi = s->last - s->first;
    for (int c = 0; c <= ncuts; c++) {
        int lo = c < ncuts ? cuts[c] : 0;
        cr_assert_eq(stage_backward_range(s, slot, dy, din, grads, lo, hi), 0, "%s",
                     pt_error_get());
        hi = lo;
    }
    stage_slot_release(s, slot);
    free(x);
    free(dy);
    free(ids);
}

static void run_microbatch(stage *s, int m, int n, float *grads)
{
    run_microbatch_cut(s, m, n, grads, NULL, 0, NULL);
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
    size_t P = a.param_count;
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
    size_t P = a.param_count;
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
    cr_assert_eq(memcmp(s[0].grads, s[1].grads, s[0].param_count * sizeof(float)), 0);
    stage_free(&s[0]);
    stage_free(&s[1]);
    net_desc_free(&net);
}

/* A backward cut into layer ranges (what replicas do to reduce the last layers' gradients
 * while the first ones compute) gives the same bits as the whole backward: the parameters'
 * gradients, accumulated over micro-batches or formed apart, and the input's gradient. */
static void check_ranges(const char *model, int threads, int n, const int *cuts, int ncuts)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, model);
    /* stage 1.. of the net, so that the input's gradient exists */
    stage a, b;
    cr_assert_eq(stage_init(&a, &net, 1, net.n_layers, n, 1, threads), 0, "%s", pt_error_get());
    cr_assert_eq(stage_init(&b, &net, 1, net.n_layers, n, 1, threads), 0, "%s", pt_error_get());
    stage_init_params(&a, 11);
    stage_init_params(&b, 11);
    size_t P = a.param_count, in = stage_in_count(&a) * (size_t)n;
    float *pa = malloc(P * sizeof(float)), *pb = malloc(P * sizeof(float));
    float *da = malloc(in * sizeof(float)), *db = malloc(in * sizeof(float));
    for (int m = 0; m < 3; m++) {
        run_microbatch_cut(&a, m, n, NULL, NULL, 0, da);
        run_microbatch_cut(&b, m, n, NULL, cuts, ncuts, db);
        cr_assert_eq(memcmp(da, db, in * sizeof(float)), 0, "%s: input gradient differs", model);
    }
    cr_assert_eq(memcmp(a.grads, b.grads, P * sizeof(float)), 0, "%s: accumulated differs",
                 model);
    run_microbatch_cut(&a, 3, n, pa, NULL, 0, NULL);
    run_microbatch_cut(&b, 3, n, pb, cuts, ncuts, NULL);
    cr_assert_eq(memcmp(pa, pb, P * sizeof(float)), 0, "%s: a piece differs", model);
    free(pa);
    free(pb);
    free(da);
    free(db);
    stage_free(&a);
    stage_free(&b);
    net_desc_free(&net);
}

Test(stage, backward_by_layer_ranges_is_the_whole_backward)
{
    /* seed-cnn from layer 1: 10 local layers (conv, pool, conv, pool, ..., dense) */
    int every[] = {9, 8, 7, 6, 5, 4, 3, 2, 1}, two[] = {6}, three[] = {8, 3};
    check_ranges("seed-cnn.cfg", 1, 40, every, 9);
    check_ranges("seed-cnn.cfg", 2, 70, two, 1);
    check_ranges("seed-cnn.cfg", 2, 33, three, 2);
    int mlp[] = {1}; /* seed-mlp from layer 1: 2 local layers */
    check_ranges("seed-mlp.cfg", 1, 100, mlp, 1);
    check_ranges("seed-mlp.cfg", 2, 300, mlp, 1);
}

Test(stage, backward_ranges_out_of_order_are_refused)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    stage s;
    cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, 8, 1, 1), 0);
    stage_init_params(&s, 1);
    float x[8 * 784] = {0}, dy[8 * 10] = {0};
    int slot = stage_slot_acquire(&s);
    stage_forward(&s, slot, x, 8, (int64_t[8]){0}, 1, 0, 1);
    cr_assert_eq(stage_backward_range(&s, slot, dy, NULL, NULL, 2, 3), 0);
    cr_assert_eq(stage_backward_range(&s, slot, dy, NULL, NULL, 0, 1), -1);
    cr_assert(strstr(pt_error_get(), "after the range ending at 2"), "%s", pt_error_get());
    cr_assert_eq(stage_backward_range(&s, slot, dy, NULL, NULL, 2, 2), -1);
    stage_free(&s);
    net_desc_free(&net);
}
