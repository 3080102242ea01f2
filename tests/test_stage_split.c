/* The stage's split backward (zero-bubble B and W) and batched weight gradients
 * (src/cpu/stage.h): B then W must be the fused backward bit for bit, whatever runs between
 * them; the batched weight gradient must not depend on the thread count or on whether the
 * backward is split, and must agree with the per-micro-batch sum to rounding. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/model/net.h"
#include "src/cpu/stage.h"
#include "tests/check.h"

void openblas_set_num_threads(int);


/* Deterministic inputs and output gradients of samples [first, first + n) of a step: keyed
 * by the sample, so that any cut into micro-batches sees the same data. */
typedef struct {
    float *x, *dy, *din;
    int64_t *ids;
} mb_data;

static mb_data make_data(const stage *s, int first, int n)
{
    size_t in = stage_in_count(s), out = stage_out_count(s);
    mb_data d = {malloc((size_t)n * in * sizeof(float)), malloc((size_t)n * out * sizeof(float)),
                 calloc((size_t)n * in, sizeof(float)), malloc((size_t)n * sizeof(int64_t))};
    cr_assert(d.x && d.dy && d.din && d.ids);
    for (int j = 0; j < n; j++) {
        uint64_t smp = (uint64_t)(first + j);
        d.ids[j] = (int64_t)smp;
        for (size_t i = 0; i < in; i++) d.x[(size_t)j * in + i] = rng_uniform_at(7, 100 + smp, i);
        for (size_t i = 0; i < out; i++)
            d.dy[(size_t)j * out + i] = rng_uniform_at(7, 100000 + smp, i) - 0.5f;
    }
    return d;
}

static void free_data(mb_data *d)
{
    free(d->x);
    free(d->dy);
    free(d->din);
    free(d->ids);
}


/* M micro-batches of n through a stage of layers [first, last): fused backwards in order
 * (reference), against F0..F(M−1), B0..B(M−1), then W in micro-batch order (the W of the
 * last one by the ranges `bounds`, descending to 0, when not NULL); skip_w: leave one W out
 * (a control that must differ); scribble: overwrite B's output gradients (dout) before
 * the Ws, which the caller must keep (the stage's last layer's W reads it:
 * stage_split_top_reads_dout). Returns the number of differing gradient and input
 * gradient values. */
static size_t split_vs_fused_dout(const char *model, int first, int last, int threads, int n,
                                  int M, const int *bounds, int skip_w, int scribble)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, model);
    if (last < 0) last = net.n_layers;
    stage a, b;
    cr_assert_eq(stage_init(&a, &net, first, last, n, M, threads), 0, "%s", pt_error_get());
    cr_assert_eq(stage_init(&b, &net, first, last, n, M, threads), 0, "%s", pt_error_get());
    cr_assert_eq(stage_enable_split(&b), 0, "%s", pt_error_get());
    stage_init_params(&a, 11);
    stage_init_params(&b, 11);
    size_t in = stage_in_count(&a);
    mb_data d[M], e[M];
    int slot[M];
    size_t diff = 0;
    for (int m = 0; m < M; m++) {
        d[m] = make_data(&a, m * n, n);
        e[m] = make_data(&a, m * n, n);
        int sa = stage_slot_acquire(&a);
        stage_forward(&a, sa, d[m].x, n, d[m].ids, 3, 5, 1);
        stage_backward(&a, sa, d[m].dy, first ? d[m].din : NULL);
        stage_slot_release(&a, sa);
    }
    for (int m = 0; m < M; m++) {
        slot[m] = stage_slot_acquire(&b);
        cr_assert_geq(slot[m], 0);
        stage_forward(&b, slot[m], e[m].x, n, e[m].ids, 3, 5, 1);
    }
    for (int m = 0; m < M; m++) {
        cr_assert_eq(stage_backward_input(&b, slot[m], e[m].dy, first ? e[m].din : NULL), 0,
                     "%s", pt_error_get());
        if (first) diff += count_differences(d[m].din, e[m].din, (size_t)n * in);
    }
    for (int m = 0; scribble && m < M; m++)
        for (size_t i = 0; i < (size_t)n * stage_out_count(&b); i++) e[m].dy[i] = 0.25f;
    int nl = last - first;
    for (int m = 0; m < M; m++) {
        if (m == skip_w) continue;
        if (bounds && m == M - 1) {
            for (int k = 0; bounds[k] > 0; k++)
                cr_assert_eq(stage_backward_weight(&b, slot[m], bounds[k + 1], bounds[k], NULL),
                             0, "%s", pt_error_get());
        } else {
            cr_assert_eq(stage_backward_weight(&b, slot[m], 0, nl, NULL), 0, "%s",
                         pt_error_get());
        }
        stage_slot_release(&b, slot[m]);
    }
    diff += count_differences(a.grads, b.grads, a.plan.param_count);
    for (int m = 0; m < M; m++) {
        free_data(&d[m]);
        free_data(&e[m]);
    }
    stage_free(&a);
    stage_free(&b);
    net_desc_free(&net);
    return diff;
}

static size_t split_vs_fused(const char *model, int first, int last, int threads, int n, int M,
                             const int *bounds, int skip_w)
{
    return split_vs_fused_dout(model, first, last, threads, n, M, bounds, skip_w, 0);
}

Test(stage_split, b_then_w_is_the_fused_backward_bit_for_bit)
{
    /* the whole CNN (dropout included), a middle stage with an input gradient, the MLP */
    cr_assert_eq(split_vs_fused("seed-cnn.cfg", 0, -1, 1, 40, 3, NULL, -1), 0);
    cr_assert_eq(split_vs_fused("seed-cnn.cfg", 0, -1, 2, 70, 2, NULL, -1), 0);
    cr_assert_eq(split_vs_fused("seed-cnn.cfg", 2, 9, 2, 33, 3, NULL, -1), 0);
    cr_assert_eq(split_vs_fused("seed-mlp.cfg", 0, -1, 1, 100, 3, NULL, -1), 0);
    cr_assert_eq(split_vs_fused("seed-mlp.cfg", 1, -1, 2, 300, 2, NULL, -1), 0);
}

Test(stage_split, w_by_layer_ranges_is_the_whole_w)
{
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    int nl = net.n_layers;
    net_desc_free(&net);
    int bounds[] = {nl, nl - 2, 5, 2, 0, -1};
    cr_assert_eq(split_vs_fused("seed-cnn.cfg", 0, -1, 2, 40, 3, bounds, -1), 0);
}

/* The comparison can fail: a micro-batch's W left out changes the gradients. */
Test(stage_split, a_missing_w_differs)
{
    cr_assert_gt(split_vs_fused("seed-mlp.cfg", 0, -1, 1, 100, 3, NULL, 1), 0);
}

/* The last layer's W reads the output gradient B was given, kept by the caller (no copy in
 * the slot): the classifier of seed-mlp and of seed-cnn (linear dense layers); a stage
 * ending in a sigmoid dense layer keeps a copy (the activation's gradient is not dout). */
Test(stage_split, last_layer_w_reads_the_callers_dout)
{
    cr_assert_gt(split_vs_fused_dout("seed-mlp.cfg", 0, -1, 1, 100, 2, NULL, -1, 1), 0);
    cr_assert_gt(split_vs_fused_dout("seed-cnn.cfg", 2, -1, 1, 40, 2, NULL, -1, 1), 0);
    cr_assert_eq(split_vs_fused_dout("seed-mlp.cfg", 0, 2, 1, 100, 2, NULL, -1, 1), 0);
}

/* Two stages sharing one pool of slots (as a rank's model chunks do under a V schedule):
 * the split backward's gradients and activations live in whichever unit a slot is bound
 * to, after the other stage's micro-batch has written it; B then W stays the fused backward
 * bit for bit (a transformer: W's gradients in the slot's used-up rows), and an acquire
 * beyond the pool fails with a message. */
Test(stage_split, stages_sharing_slots_are_bit_identical)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "gpt-nano.cfg");
    int nl = net.n_layers, n = 4, M = 3;
    stage a, b, c;
    cr_assert_eq(stage_init(&a, &net, 0, nl, n, M, 1), 0, "%s", pt_error_get());
    size_t unit =
        stage_estimate(&net, 0, nl, n, 1).slot + stage_split_slot_bytes(&net, 0, nl, n);
    stage_rank_pool *pool = stage_rank_pool_new(M + 1, unit, 1 << 20);
    cr_assert_not_null(pool);
    stage_rank_pool_use(pool);
    cr_assert_eq(stage_init(&b, &net, 0, nl, n, M, 1), 0, "%s", pt_error_get());
    cr_assert_eq(stage_init(&c, &net, 0, nl, n, 2, 1), 0, "%s", pt_error_get());
    stage_rank_pool_use(NULL);
    stage_rank_pool_drop(pool); /* the stages keep it */
    cr_assert_null(b.slot_memory, "a stage of the pool has slot memory of its own");
    cr_assert_eq(stage_enable_split(&b), 0, "%s", pt_error_get());
    cr_assert_eq(stage_enable_split(&c), 0, "%s", pt_error_get());
    stage_init_params(&a, 11);
    stage_init_params(&b, 11);
    stage_init_params(&c, 12);
    mb_data d[M], o = make_data(&c, 50, n);
    int slot[M];
    /* c's micro-batch writes the first unit (forward and B), which b's first takes next */
    int sc = stage_slot_acquire(&c);
    cr_assert_geq(sc, 0, "%s", pt_error_get());
    stage_forward(&c, sc, o.x, n, o.ids, 3, 5, 1);
    cr_assert_eq(stage_backward_input(&c, sc, o.dy, NULL), 0, "%s", pt_error_get());
    stage_slot_release(&c, sc);
    for (int m = 0; m < M; m++) {
        d[m] = make_data(&a, m * n, n);
        int sa = stage_slot_acquire(&a);
        stage_forward(&a, sa, d[m].x, n, d[m].ids, 3, 5, 1);
        stage_backward(&a, sa, d[m].dy, NULL);
        stage_slot_release(&a, sa);
        slot[m] = stage_slot_acquire(&b);
        cr_assert_geq(slot[m], 0, "%s", pt_error_get());
        stage_forward(&b, slot[m], d[m].x, n, d[m].ids, 3, 5, 1);
    }
    /* c takes the last unit and writes it between b's forwards and B; then none is left */
    sc = stage_slot_acquire(&c);
    cr_assert_geq(sc, 0, "%s", pt_error_get());
    stage_forward(&c, sc, o.x, n, o.ids, 3, 5, 1);
    cr_assert_eq(stage_slot_acquire(&c), -1, "a fifth slot from a pool of four");
    cr_assert(strstr(pt_error_get(), "rank's chunks"), "%s", pt_error_get());
    stage_slot_release(&c, sc);
    for (int m = 0; m < M; m++)
        cr_assert_eq(stage_backward_input(&b, slot[m], d[m].dy, NULL), 0, "%s", pt_error_get());
    for (int m = 0; m < M; m++) {
        cr_assert_eq(stage_backward_weight(&b, slot[m], 0, nl, NULL), 0, "%s", pt_error_get());
        stage_slot_release(&b, slot[m]);
    }
    cr_assert_eq(count_differences(a.grads, b.grads, a.plan.param_count), 0,
                 "shared slots: B then W differs from the fused backward");
    for (int m = 0; m < M; m++) free_data(&d[m]);
    free_data(&o);
    stage_free(&a);
    stage_free(&b);
    stage_free(&c);
    net_desc_free(&net);
}

Test(stage_split, refused_without_enabling_or_out_of_range)
{
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    stage s;
    cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, 8, 1, 1), 0);
    float dy[8 * 10] = {0};
    cr_assert_eq(stage_backward_input(&s, 0, dy, NULL), -1);
    cr_assert(strstr(pt_error_get(), "stage_enable_split"), "%s", pt_error_get());
    cr_assert_eq(stage_enable_split(&s), 0);
    cr_assert_eq(stage_backward_weight(&s, 0, 2, 1, NULL), -1);
    cr_assert(strstr(pt_error_get(), "outside"), "%s", pt_error_get());
    stage_free(&s);
    net_desc_free(&net);
}

/* The step's gradients with batched weight gradients: `rows` samples cut into micro-batches
 * of n, each through a whole backward (or B and W when split), then the flush. */
static void batched_grads(const char *model, int threads, int n, int rows, int split,
                          float *out, size_t *P)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, model);
    stage s;
    cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, n, 1, threads), 0, "%s", pt_error_get());
    cr_assert_eq(stage_enable_batched_wgrad(&s, rows), 0, "%s", pt_error_get());
    if (split) cr_assert_eq(stage_enable_split(&s), 0);
    stage_init_params(&s, 11);
    for (int m = 0; m * n < rows; m++) {
        mb_data d = make_data(&s, m * n, n);
        int slot = stage_slot_acquire(&s);
        stage_forward(&s, slot, d.x, n, d.ids, 3, 5, 1);
        stage_slot_set_row(&s, slot, m * n);
        if (split) {
            cr_assert_eq(stage_backward_input(&s, slot, d.dy, NULL), 0);
            cr_assert_eq(stage_backward_weight(&s, slot, 0, net.n_layers, NULL), 0);
        } else {
            stage_backward(&s, slot, d.dy, NULL);
        }
        stage_slot_release(&s, slot);
        free_data(&d);
    }
    stage_wgrad_flush(&s, 0, net.n_layers);
    memcpy(out, s.grads, s.plan.param_count * sizeof(float));
    *P = s.plan.param_count;
    stage_free(&s);
    net_desc_free(&net);
}

/* Per-micro-batch gradients of the same samples (the reference). */
static void per_microbatch_grads(const char *model, int n, int rows, float *out)
{
    net_desc net;
    load_model(&net, model);
    stage s;
    cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, n, 1, 1), 0);
    stage_init_params(&s, 11);
    for (int m = 0; m * n < rows; m++) {
        mb_data d = make_data(&s, m * n, n);
        int slot = stage_slot_acquire(&s);
        stage_forward(&s, slot, d.x, n, d.ids, 3, 5, 1);
        stage_backward(&s, slot, d.dy, NULL);
        stage_slot_release(&s, slot);
        free_data(&d);
    }
    memcpy(out, s.grads, s.plan.param_count * sizeof(float));
    stage_free(&s);
    net_desc_free(&net);
}

static void check_batched(const char *model, int rows)
{
    size_t P;
    enum { MAX_P = 800000 };
    float *ref = malloc(MAX_P * sizeof(float)), *a = malloc(MAX_P * sizeof(float)),
          *b = malloc(MAX_P * sizeof(float)), *c = malloc(MAX_P * sizeof(float));
    cr_assert(ref && a && b && c);
    /* The micro-batches stay the same: the forward's products (OpenBLAS) round differently
     * for another number of rows, so the stashed inputs would differ already. */
    batched_grads(model, 1, rows / 4, rows, 0, a, &P);
    cr_assert_leq(P, MAX_P);
    batched_grads(model, 3, rows / 4, rows, 0, b, &P); /* other threads */
    batched_grads(model, 2, rows / 4, rows, 1, c, &P); /* split backward */
    cr_assert_eq(count_differences(a, b, P), 0, "%s: batched gradients depend on the threads", model);
    cr_assert_eq(count_differences(a, c, P), 0, "%s: batched gradients differ with a split backward",
                 model);
    per_microbatch_grads(model, rows / 4, rows, ref);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < P; i++) {
        double dd = fabs((double)a[i] - ref[i]);
        if (dd > worst) worst = dd;
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    cr_assert_leq(worst, 1e-5 * scale, "%s: batched vs per-micro-batch: worst %g of %g", model,
                  worst, scale);
    free(ref);
    free(a);
    free(b);
    free(c);
}

Test(stage_split, batched_weight_gradients_are_layout_free_and_match)
{
    check_batched("seed-mlp.cfg", 256);
    check_batched("seed-cnn.cfg", 64);
}

/* The comparison can fail: a flush that misses a micro-batch's rows is far off. */
Test(stage_split, batched_without_a_microbatch_differs)
{
    size_t P;
    float *a = malloc(800000 * sizeof(float)), *b = malloc(800000 * sizeof(float));
    batched_grads("seed-mlp.cfg", 1, 64, 256, 0, a, &P);
    batched_grads("seed-mlp.cfg", 1, 64, 192, 0, b, &P); /* stash of 192 rows: one fewer */
    cr_assert_gt(count_differences(a, b, P), 0);
    free(a);
    free(b);
}
