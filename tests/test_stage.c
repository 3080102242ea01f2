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
 * (NULL: accumulate into the stage's gradients). */
static void run_microbatch(stage *s, int m, int n, float *grads)
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
    stage_backward_to(s, slot, dy, NULL, grads);
    stage_slot_release(s, slot);
    free(x);
    free(dy);
    free(ids);
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
