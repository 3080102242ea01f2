/* The transformer layers in the CPU stage (src/engine/layer_ops.c, src/cpu/stage.c): every
 * parameter tensor's gradient against central finite differences of the language-model loss;
 * the split backward (B then W) against the whole one, bit for bit; one thread against two
 * and one micro-batch against its cut into two (the stage's sums do not depend on either);
 * GPT-2's initialisation (σ, residual scaling, ones and zeros, a tied head equal to the
 * token matrix) and its sameness across stages. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/cpu/stage.h"
#include "src/model/net.h"
#include "tests/check.h"

void openblas_set_num_threads(int);

/* V = 13, T = 6, C = 8, two blocks of 2 heads (hidden 12), ln_f and a head. */
static const char *tiny(int tied)
{
    return tied ? "[net]\n[embedding]\nvocab=13\ncontext=6\nwidth=8\n[block]\nheads=2\nhidden=12\n"
                  "[block]\nheads=2\nhidden=12\n[layernorm]\n[lm_head]\ntied=1\n"
                : "[net]\n[embedding]\nvocab=13\ncontext=6\nwidth=8\n[block]\nheads=2\nhidden=12\n"
                  "[block]\nheads=2\nhidden=12\n[layernorm]\n[lm_head]\n";
}

static void parse(net_desc *net, int tied)
{
    cr_assert_eq(net_desc_parse_string(net, tiny(tied), "tiny.cfg"), 0, "%s", pt_error_get());
}

/* Tokens and next tokens of n samples, keyed by the sample. */
static void make_tokens(int n, int T, int V, float *x, int32_t *labels, int first)
{
    for (int j = 0; j < n; j++)
        for (int t = 0; t < T; t++) {
            uint64_t s = (uint64_t)(first + j);
            x[j * T + t] = (float)(int)(rng_uniform_at(5, 40 + s, (uint64_t)t) * V);
            labels[j * T + t] = (int32_t)(rng_uniform_at(5, 90 + s, (uint64_t)t) * V);
        }
}

/* The mean token loss of n samples, and (grad) its parameter gradients in s->grads. */
static double loss_of(stage *s, const float *x, const int32_t *labels, int n, int grad)
{
    const net_desc *net = s->plan.net;
    int T = net->input.c, V = net->classes;
    int64_t ids[8];
    for (int j = 0; j < n; j++) ids[j] = j;
    int slot = stage_slot_acquire(s);
    const float *logits = stage_forward(s, slot, x, n, ids, 1, 0, grad);
    float *dlogits = malloc((size_t)n * T * V * sizeof(float));
    int correct;
    double sum = kernel_softmax_xent_cpu(dlogits, &correct, logits, labels, n * T, V,
                                         1.0f / (float)(n * T));
    if (grad) stage_backward(s, slot, dlogits, NULL);
    stage_slot_release(s, slot);
    free(dlogits);
    return sum / (n * T);
}

Test(stage_gpt, every_tensor_matches_finite_differences)
{
    openblas_set_num_threads(1);
    for (int tied = 0; tied < 2; tied++) {
        net_desc net;
        parse(&net, tied);
        stage s;
        cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, 3, 1, 1), 0, "%s", pt_error_get());
        stage_init_params(&s, 3);
        /* larger values than GPT-2's σ, so every path carries a visible gradient */
        for (size_t i = 0; i < s.plan.param_count; i++)
            s.params[i] += 0.3f * (rng_uniform_at(9, 1, i) - 0.5f);
        int n = 3, T = net.input.c, V = net.classes;
        float x[3 * 6];
        int32_t labels[3 * 6];
        make_tokens(n, T, V, x, labels, 0);
        memset(s.grads, 0, s.plan.param_count * sizeof(float));
        loss_of(&s, x, labels, n, 1);
        float *grads = malloc(s.plan.param_count * sizeof(float));
        memcpy(grads, s.grads, s.plan.param_count * sizeof(float));
        int checked = 0;
        for (int l = 0; l < net.n_layers; l++) {
            layer_tensor t[LAYER_MAX_TENSORS];
            int nt = layer_tensors(&net.layers[l], net.blocks, t);
            for (int k = 0; k < nt; k++)
                for (int e = 0; e < 3; e++) {
                    size_t at = s.plan.param_off[l] + t[k].offset +
                                (size_t)(rng_uniform_at(2, (uint64_t)(l * 16 + k), (uint64_t)e) *
                                         (float)t[k].count);
                    float keep = s.params[at];
                    const float h = 1e-2f;
                    s.params[at] = keep + h;
                    double up = loss_of(&s, x, labels, n, 0);
                    s.params[at] = keep - h;
                    double down = loss_of(&s, x, labels, n, 0);
                    s.params[at] = keep;
                    double fd = (up - down) / (2.0 * h);
                    double an = grads[at];
                    cr_assert(fabs(fd - an) <= 2e-3 + 2e-2 * fabs(fd),
                              "tied=%d layer %d %s[%zu]: analytic %.6g, finite differences "
                              "%.6g", tied, l, t[k].name, at, an, fd);
                    checked++;
                }
        }
        cr_assert_gt(checked, 40);
        free(grads);
        stage_free(&s);
        net_desc_free(&net);
    }
}

/* Planted between B and W (split = PLANT + h): one float of micro-batch 0's first block
 * changed in home h of its split backward's gradients for W (block_split_homes): c_attn's
 * over qkv, c_fc's over the pre-GELU rows, the MLP output's over the attention
 * probabilities, the residual's over the residual x1, and the layer norms' sums of B
 * (ln_1's γ, group 0), so that the bit comparisons with the whole backward are shown to
 * see every home. */
enum { PLANT = 2, PLANT_HOMES = 5 };

static void plant(stage *s, int slot, int n, int h)
{
    const stage_plan *p = &s->plan;
    int i = 0;
    while (i < p->nl && p->loc[i].type != LAYER_BLOCK) i++;
    cr_assert_lt(i, p->nl, "no block to plant in");
    const layer_desc *L = &p->loc[i];
    size_t T = (size_t)L->in.c, C = (size_t)L->in.w;
    size_t nc = (size_t)(stage_chunk(s, n) < n ? stage_chunk(s, n) : n); /* chunk 0's */
    size_t probs = layer_saved_floats(L) - (size_t)L->u.block.heads * T * T;
    size_t at[PLANT_HOMES - 1] = {nc * T * C, nc * T * (7 * C), nc * probs, nc * T * 5 * C};
    cr_assert_eq(layer_block_split_fits(L), 1, "the tiny block's MLP output gradient fits "
                 "over its probabilities");
    stage_slot_layer *ly = &s->slots[slot].layers[i];
    cr_assert_null(ly->gout, "the tiny block keeps nothing apart for W");
    float *f = h < PLANT_HOMES - 1 ? ly->saved + at[h] : ly->sums;
    *f += 0.5f;
}

/* The parameter gradients of two micro-batches of n: whole backwards, or B then W (split
 * 1, or PLANT + h: with a float of home h changed between them). */
static float *grads_of(const net_desc *net, int first, int last, int threads, int n, int split,
                       size_t *count)
{
    stage s;
    cr_assert_eq(stage_init(&s, net, first, last, n, 2, threads), 0, "%s", pt_error_get());
    if (split) cr_assert_eq(stage_enable_split(&s), 0, "%s", pt_error_get());
    stage_init_params(&s, 7);
    size_t in = stage_in_count(&s), out = stage_out_count(&s);
    float *x = malloc(2 * (size_t)n * in * sizeof(float));
    float *dy = malloc(2 * (size_t)n * out * sizeof(float));
    int32_t *labels = malloc(2 * (size_t)n * in * sizeof(int32_t));
    if (first == 0) {
        make_tokens(2 * n, net->input.c, net->classes, x, labels, 0);
    } else {
        for (size_t i = 0; i < 2 * (size_t)n * in; i++) x[i] = rng_uniform_at(4, 4, i) - 0.5f;
    }
    for (size_t i = 0; i < 2 * (size_t)n * out; i++) dy[i] = rng_uniform_at(4, 5, i) - 0.5f;
    int64_t ids[16];
    for (int j = 0; j < 2 * n; j++) ids[j] = j;
    int slot[2];
    for (int m = 0; m < 2; m++) {
        slot[m] = stage_slot_acquire(&s);
        stage_forward(&s, slot[m], x + (size_t)m * n * in, n, ids + m * n, 1, 0, 1);
    }
    for (int m = 0; m < 2; m++) {
        const float *g = dy + (size_t)m * n * out;
        if (split)
            cr_assert_eq(stage_backward_input(&s, slot[m], g, NULL), 0, "%s", pt_error_get());
        else
            stage_backward(&s, slot[m], g, NULL);
    }
    if (split >= PLANT) plant(&s, slot[0], n, split - PLANT);
    for (int m = 0; m < 2; m++) {
        if (split)
            cr_assert_eq(stage_backward_weight(&s, slot[m], 0, last - first, NULL), 0, "%s",
                         pt_error_get());
        stage_slot_release(&s, slot[m]);
    }
    *count = s.plan.param_count;
    float *g = malloc(*count * sizeof(float));
    memcpy(g, s.grads, *count * sizeof(float));
    free(x);
    free(dy);
    free(labels);
    stage_free(&s);
    return g;
}

Test(stage_gpt, split_backward_and_threads_are_bit_identical)
{
    openblas_set_num_threads(1);
    net_desc net;
    parse(&net, 1);
    int cuts[][2] = {{0, 5}, {1, 3}, {3, 5}};
    for (int c = 0; c < 3; c++) {
        int a = cuts[c][0], b = cuts[c][1];
        size_t n1, n2, n3;
        float *whole = grads_of(&net, a, b, 1, 4, 0, &n1);
        float *split = grads_of(&net, a, b, 1, 4, 1, &n2);
        float *two = grads_of(&net, a, b, 2, 4, 0, &n3);
        cr_assert_eq(n1, n2);
        cr_assert_eq(count_differences(whole, split, n1), 0, "layers %d..%d: split differs", a,
                     b - 1);
        cr_assert_eq(count_differences(whole, two, n1), 0, "layers %d..%d: 2 threads differ", a,
                     b - 1);
        size_t nz = 0;
        for (size_t i = 0; i < n1; i++) nz += whole[i] != 0;
        cr_assert_gt(nz, n1 / 2, "layers %d..%d: most gradients are zero", a, b - 1);
        /* the comparison sees each home of W's gradients: a float changed in one
         * between B and W changes the gradients */
        for (int h = 0; c == 0 && h < PLANT_HOMES; h++) {
            float *planted = grads_of(&net, a, b, 1, 4, PLANT + h, &n2);
            cr_assert_gt(count_differences(whole, planted, n1), 0,
                         "layers %d..%d: a float planted in home %d went unseen", a, b - 1, h);
            free(planted);
        }
        free(whole);
        free(split);
        free(two);
    }
    net_desc_free(&net);
    /* gpt-nano (T = 32): micro-batches of 8 are two chunks of 4, summed by gradient group */
    load_model(&net, "gpt-nano.cfg");
    size_t n1, n2, n3;
    float *one = grads_of(&net, 0, net.n_layers, 1, 8, 0, &n1);
    float *two = grads_of(&net, 0, net.n_layers, 2, 8, 0, &n2);
    float *split = grads_of(&net, 0, net.n_layers, 2, 8, 1, &n3);
    cr_assert_eq(count_differences(one, two, n1), 0, "gpt-nano: 2 threads differ");
    cr_assert_eq(count_differences(one, split, n1), 0, "gpt-nano: split differs");
    free(one);
    free(two);
    free(split);
    net_desc_free(&net);
}

Test(stage_gpt, gpt2_initialisation)
{
    net_desc net;
    parse(&net, 1);
    stage whole, tail;
    cr_assert_eq(stage_init(&whole, &net, 0, net.n_layers, 1, 1, 1), 0);
    cr_assert_eq(stage_init(&tail, &net, 3, net.n_layers, 1, 1, 1), 0);
    stage_init_params(&whole, 42);
    stage_init_params(&tail, 42);
    const int V = 13, C = 8, H = 12;
    /* the tied head's copy is the token matrix, in one stage and on another */
    const float *wte = whole.params;
    const float *head = whole.params + whole.plan.param_off[4];
    const float *head2 = tail.params + tail.plan.param_off[1];
    cr_assert_eq(count_differences(wte, head, (size_t)V * C), 0);
    cr_assert_eq(count_differences(wte, head2, (size_t)V * C), 0);
    /* σ of the c_attn matrices ≈ 0.02, the residual projections' ≈ 0.02/√4, ones, zeros */
    const float *b1 = whole.params + whole.plan.param_off[1];
    double ss = 0, sr = 0;
    for (int i = 0; i < 3 * C * C; i++) ss += (double)b1[i] * b1[i];
    for (int i = 0; i < C * C; i++) sr += (double)b1[3 * C * C + i] * b1[3 * C * C + i];
    double sd = sqrt(ss / (3 * C * C)), sdr = sqrt(sr / (C * C));
    cr_assert(sd > 0.015 && sd < 0.025, "c_attn σ %g", sd);
    cr_assert(sdr > 0.006 && sdr < 0.0135, "c_proj σ %g (0.01 expected)", sdr);
    const float *vec = b1 + 4 * C * C + 2 * H * C;
    for (int i = 0; i < C; i++) {
        cr_assert_eq(vec[i], 1.0f);     /* ln_1.weight */
        cr_assert_eq(vec[C + i], 0.0f); /* ln_1.bias */
    }
    cr_assert_eq(net.param_count, whole.plan.param_count - (size_t)V * C,
                 "a tied head is counted once");
    stage_free(&whole);
    stage_free(&tail);
    net_desc_free(&net);
}

/* A cut of the batch into micro-batches changes no sample's loss: the per-sample logits
 * of 4 samples at once and of 2 + 2 are the same bits. */
Test(stage_gpt, logits_do_not_depend_on_the_micro_batch)
{
    openblas_set_num_threads(1);
    net_desc net;
    parse(&net, 0);
    stage s;
    cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, 4, 2, 1), 0);
    stage_init_params(&s, 5);
    float x[4 * 6];
    int32_t labels[4 * 6];
    make_tokens(4, 6, 13, x, labels, 0);
    int64_t ids[4] = {0, 1, 2, 3};
    size_t per = (size_t)6 * 13;
    int a = stage_slot_acquire(&s);
    const float *all = stage_forward(&s, a, x, 4, ids, 1, 0, 0);
    int b = stage_slot_acquire(&s);
    const float *half = stage_forward(&s, b, x + 12, 2, ids + 2, 1, 0, 0);
    cr_assert_eq(count_differences(all + 2 * per, half, 2 * per), 0);
    stage_free(&s);
    net_desc_free(&net);
}
