/* Dropout inside [block] (GPT-2's three: the attention probabilities, attention c_proj's
 * output and the MLP c_proj's output before their residual adds; src/engine/layer_ops.c,
 * kernels/attention.c): the attention kernel against its definition from the saved
 * probabilities and mask, its mask against the generator at each element's place among
 * all heads (a call on heads [1, 2) draws what a call on [0, 2) draws for head 1), the kept
 * fraction ≈ 1 − p and the scale 1/(1 − p); in the CPU stage every parameter tensor's
 * gradient against finite differences with dropout on (the same seed, step and sample ids:
 * the same masks), p = 0 bit for bit as no key, no dropout when not training, and the
 * gradients the same bits whatever the threads, the split backward or the micro-batch
 * cut. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/cpu/stage.h"
#include "src/model/net.h"
#include "tests/check.h"

void openblas_set_num_threads(int);

/* V = 13, T = 6, C = 8, two blocks of 2 heads (hidden 12) with dropout p, ln_f, a head;
 * p < 0: no dropout key. */
static void parse_tiny(net_desc *net, double p, int tied)
{
    char key[64] = "";
    if (p >= 0) snprintf(key, sizeof key, "dropout=%g\n", p);
    char text[512];
    snprintf(text, sizeof text,
             "[net]\n[embedding]\nvocab=13\ncontext=6\nwidth=8\n[block]\nheads=2\nhidden=12\n%s"
             "[block]\nheads=2\nhidden=12\n%s[layernorm]\n[lm_head]\n%s",
             key, key, tied ? "tied=1\n" : "");
    cr_assert_eq(net_desc_parse_string(net, text, "drop.cfg"), 0, "%s", pt_error_get());
    cr_assert_eq(net_desc_check_trainable(net, "drop.cfg"), 0, "%s", pt_error_get());
}

static void make_tokens(int n, int T, int V, float *x, int32_t *labels)
{
    for (int j = 0; j < n; j++)
        for (int t = 0; t < T; t++) {
            x[j * T + t] = (float)(int)(rng_uniform_at(5, 40 + (uint64_t)j, (uint64_t)t) * V);
            labels[j * T + t] = (int32_t)(rng_uniform_at(5, 90 + (uint64_t)j, (uint64_t)t) * V);
        }
}

/* ---- the attention kernel ---- */

enum { KB = 2, KT = 70, KH = 2, KD = 4 }; /* T = 70: two query blocks of 64 and 6 */

static void fill(float *x, size_t n, uint64_t stream)
{
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * rng_uniform_at(11, stream, i) - 1.0f;
}

Test(block_dropout, attention_kernel_is_its_definition)
{
    openblas_set_num_threads(1);
    const int C = KH * KD, N = KB * KT;
    const float p = 0.25f;
    kernel_attention_dims d = {KB, KT, KH, KD, 3 * C};
    float *qkv = malloc((size_t)N * 3 * C * sizeof(float));
    float *y = malloc((size_t)N * C * sizeof(float)), *y1 = malloc((size_t)N * KD * sizeof(float));
    size_t np = kernel_attention_probs_floats(&d);
    float *probs = malloc(np * sizeof(float)), *probs1 = malloc(np * sizeof(float));
    uint8_t *mask = malloc(np), *mask1 = malloc(np);
    float *work = malloc(kernel_attention_dropout_floats(&d) * sizeof(float));
    fill(qkv, (size_t)N * 3 * C, 1);
    int64_t ids[KB] = {7, 300};
    uint64_t stream = kernel_block_dropout_stream(3, 0, 9);
    kernel_attention_dropout dr = {.p = p, .seed = 4, .stream = stream, .sample_ids = ids,
                                   .elem_off = 0, .mask = mask};
    kernel_attention_forward_dropout_cpu(y, probs, work, qkv, qkv + C, qkv + 2 * C, &d, &dr);
    size_t kept = 0, seen = 0;
    double worst = 0;
    for (int b = 0; b < KB; b++)
        for (int h = 0; h < KH; h++)
            for (int i = 0; i < KT; i++) {
                size_t row = (((size_t)b * KH + h) * KT + i) * KT;
                for (int j = 0; j <= i; j++) {
                    /* the mask is the generator's at the element's place in the sample */
                    uint64_t e = ((uint64_t)h * KT + (uint64_t)i) * KT + (uint64_t)j;
                    int want = rng_uniform_at(4, stream, ((uint64_t)ids[b] << 32) | e) < 1 - p;
                    cr_assert_eq(mask[row + j], want, "b %d h %d (%d, %d)", b, h, i, j);
                    kept += mask[row + j];
                    seen++;
                }
                /* y = (P ∘ M / (1 − p)) v, from the saved (undropped) P */
                for (int c = 0; c < KD; c++) {
                    double s = 0;
                    for (int j = 0; j <= i; j++)
                        if (mask[row + j])
                            s += (double)probs[row + j] / (1.0 - p) *
                                 qkv[((size_t)b * KT + j) * 3 * C + 2 * C + h * KD + c];
                    double got = y[((size_t)b * KT + i) * C + h * KD + c];
                    if (fabs(got - s) > worst) worst = fabs(got - s);
                }
                double sum = 0; /* P is the softmax itself, rows summing to 1 */
                for (int j = 0; j <= i; j++) sum += probs[row + j];
                cr_assert(fabs(sum - 1.0) < 1e-5, "row sum %g", sum);
            }
    cr_assert(worst < 1e-5, "y differs from (P ∘ M / (1 - p)) v by %g", worst);
    double frac = (double)kept / (double)seen;
    cr_assert(fabs(frac - (1 - p)) < 0.03, "kept %.4f of %zu, expected %.2f", frac, seen, 1 - p);
    /* head 1 alone, placed at elem_off = T²: its mask and output are head 1's above */
    kernel_attention_dims d1 = {KB, KT, 1, KD, 3 * C};
    kernel_attention_dropout dr1 = dr;
    dr1.elem_off = (size_t)KT * KT;
    dr1.mask = mask1;
    /* q, k, v of head 1 are the columns KD.. of each third: views with stride 3C */
    float *q1 = qkv + KD;
    kernel_attention_forward_dropout_cpu(y1, probs1, work, q1, q1 + C, q1 + 2 * C, &d1, &dr1);
    for (int b = 0; b < KB; b++) {
        for (int i = 0; i < KT; i++) {
            size_t r0 = (((size_t)b * KH + 1) * KT + i) * KT, r1 = ((size_t)b * KT + i) * KT;
            cr_assert_eq(memcmp(mask + r0, mask1 + r1, (size_t)i + 1), 0, "b %d row %d", b, i);
            cr_assert_eq(memcmp(y + ((size_t)b * KT + i) * C + KD, y1 + ((size_t)b * KT + i) * KD,
                                KD * sizeof(float)), 0);
        }
    }
    /* p = 0 and NULL: the plain kernel's bits */
    kernel_attention_dropout none = dr;
    none.p = 0;
    kernel_attention_forward_dropout_cpu(y, probs1, work, qkv, qkv + C,
                                         qkv + 2 * C, &d, &none);
    float *yp = malloc((size_t)N * C * sizeof(float));
    kernel_attention_forward_cpu(yp, probs, qkv, qkv + C, qkv + 2 * C, &d);
    cr_assert_eq(memcmp(y, yp, (size_t)N * C * sizeof(float)), 0);
    free(qkv), free(y), free(y1), free(yp), free(probs), free(probs1), free(mask), free(mask1);
    free(work);
}

/* The attention backward with dropout against finite differences of Σ y·w (masks fixed). */
Test(block_dropout, attention_backward_matches_finite_differences)
{
    openblas_set_num_threads(1);
    enum { B = 1, T = 7, H = 2, D = 3 };
    const int C = H * D, N = B * T;
    kernel_attention_dims d = {B, T, H, D, 3 * C};
    double qkv[N * 3 * C];
    float qf[N * 3 * C], y[N * C], wy[N * C], dq[N * 3 * C];
    float probs[B * H * T * T], work[2 * T * T];
    uint8_t mask[B * H * T * T];
    int64_t ids[1] = {5};
    kernel_attention_dropout dr = {.p = 0.4f, .seed = 2, .stream = 77, .sample_ids = ids,
                                   .mask = mask};
    for (int i = 0; i < N * 3 * C; i++) qkv[i] = 2.0 * rng_uniform_at(3, 1, (uint64_t)i) - 1.0;
    fill(wy, (size_t)N * C, 2);
    for (int i = 0; i < N * 3 * C; i++) qf[i] = (float)qkv[i];
    kernel_attention_forward_dropout_cpu(y, probs, work, qf, qf + C, qf + 2 * C, &d, &dr);
    kernel_attention_backward_dropout_cpu(dq, dq + C, dq + 2 * C, work, wy, qf, qf + C,
                                          qf + 2 * C, probs, &d, &dr);
    for (int at = 0; at < N * 3 * C; at++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            for (int i = 0; i < N * 3 * C; i++) qf[i] = (float)qkv[i];
            qf[at] = (float)(qkv[at] + (s ? -1e-2 : 1e-2));
            kernel_attention_forward_dropout_cpu(y, probs, work, qf, qf + C, qf + 2 * C, &d, &dr);
            f[s] = 0;
            for (int i = 0; i < N * C; i++) f[s] += (double)y[i] * wy[i];
        }
        double fd = (f[0] - f[1]) / 2e-2;
        cr_assert(fabs(fd - dq[at]) <= 2e-3 + 2e-2 * fabs(fd), "element %d: analytic %g, fd %g",
                  at, dq[at], fd);
    }
}

/* ---- the stage ---- */

/* The mean token loss of n samples (ids first, first + 1, ...) with the forward's training
 * flag; grad: its parameter gradients in s->grads. */
static double loss_of(stage *s, const float *x, const int32_t *labels, int n, int training,
                      int grad)
{
    const net_desc *net = s->plan.net;
    int T = net->input.c, V = net->classes;
    int64_t ids[8];
    for (int j = 0; j < n; j++) ids[j] = 100 + j;
    int slot = stage_slot_acquire(s);
    const float *logits = stage_forward(s, slot, x, n, ids, 1, 3, training);
    float *dlogits = malloc((size_t)n * T * V * sizeof(float));
    int correct;
    double sum = kernel_softmax_xent_cpu(dlogits, &correct, logits, labels, n * T, V,
                                         1.0f / (float)(n * T));
    if (grad) stage_backward(s, slot, dlogits, NULL);
    stage_slot_release(s, slot);
    free(dlogits);
    return sum / (n * T);
}

Test(block_dropout, every_tensor_matches_finite_differences_with_dropout)
{
    openblas_set_num_threads(1);
    for (int tied = 0; tied < 2; tied++) {
        net_desc net;
        parse_tiny(&net, 0.3, tied);
        stage s;
        cr_assert_eq(stage_init(&s, &net, 0, net.n_layers, 3, 1, 1), 0, "%s", pt_error_get());
        stage_init_params(&s, 3);
        for (size_t i = 0; i < s.plan.param_count; i++)
            s.params[i] += 0.3f * (rng_uniform_at(9, 1, i) - 0.5f);
        int n = 3, T = net.input.c, V = net.classes;
        float x[3 * 6];
        int32_t labels[3 * 6];
        make_tokens(n, T, V, x, labels);
        memset(s.grads, 0, s.plan.param_count * sizeof(float));
        double with = loss_of(&s, x, labels, n, 1, 1);
        double without = loss_of(&s, x, labels, n, 0, 0);
        cr_assert(fabs(with - without) > 1e-4, "training and eval losses equal: %g", with);
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
                    double up = loss_of(&s, x, labels, n, 1, 0);
                    s.params[at] = keep - h;
                    double down = loss_of(&s, x, labels, n, 1, 0);
                    s.params[at] = keep;
                    double fd = (up - down) / (2.0 * h), an = grads[at];
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

/* Logits and gradients of one model file's net at seed 7: (training) forward + backward
 * of 4 samples as one micro-batch, or 2 + 2 (cut), on `threads` threads, whole or split
 * backward. */
static float *run_net(const net_desc *net, int threads, int split, int cut, int training,
                      float **logits_out, size_t *count)
{
    stage s;
    cr_assert_eq(stage_init(&s, net, 0, net->n_layers, 4, 2, threads), 0, "%s", pt_error_get());
    if (split) cr_assert_eq(stage_enable_split(&s), 0, "%s", pt_error_get());
    stage_init_params(&s, 7);
    int T = net->input.c, V = net->classes, n = 4;
    float x[4 * 64];
    int32_t labels[4 * 64];
    make_tokens(n, T, V, x, labels);
    size_t per = (size_t)T * V;
    float *logits = malloc(n * per * sizeof(float)), *dl = malloc(n * per * sizeof(float));
    int64_t ids[4] = {10, 11, 12, 13};
    int parts = cut ? 2 : 1, m = n / parts, slot[2];
    memset(s.grads, 0, s.plan.param_count * sizeof(float));
    for (int k = 0; k < parts; k++) {
        slot[k] = stage_slot_acquire(&s);
        const float *y = stage_forward(&s, slot[k], x + (size_t)k * m * T, m, ids + k * m, 1,
                                       3, training);
        memcpy(logits + (size_t)k * m * per, y, m * per * sizeof(float));
    }
    int correct;
    kernel_softmax_xent_cpu(dl, &correct, logits, labels, n * T, V, 1.0f / (float)(n * T));
    for (int k = 0; k < parts; k++) {
        if (split) {
            cr_assert_eq(stage_backward_input(&s, slot[k], dl + (size_t)k * m * per, NULL), 0);
            cr_assert_eq(stage_backward_weight(&s, slot[k], 0, s.plan.nl, NULL), 0);
        } else {
            stage_backward(&s, slot[k], dl + (size_t)k * m * per, NULL);
        }
        stage_slot_release(&s, slot[k]);
    }
    *count = s.plan.param_count;
    float *g = malloc(*count * sizeof(float));
    memcpy(g, s.grads, *count * sizeof(float));
    stage_free(&s);
    free(dl);
    *logits_out = logits;
    return g;
}

Test(block_dropout, p0_is_no_key_and_eval_drops_nothing)
{
    openblas_set_num_threads(1);
    net_desc none, zero, drop;
    parse_tiny(&none, -1, 0);
    parse_tiny(&zero, 0, 0);
    parse_tiny(&drop, 0.3, 0);
    size_t n1, n2, n3;
    float *l1, *l2, *l3;
    float *g1 = run_net(&none, 1, 0, 0, 1, &l1, &n1);
    float *g2 = run_net(&zero, 1, 0, 0, 1, &l2, &n2);
    cr_assert_eq(n1, n2);
    size_t nl = (size_t)4 * 6 * 13;
    cr_assert_eq(count_differences(l1, l2, nl), 0, "p = 0: logits differ from no key");
    cr_assert_eq(count_differences(g1, g2, n1), 0, "p = 0: gradients differ from no key");
    /* not training: p = 0.3 gives the logits of no dropout at all */
    free(g2), free(l2);
    g2 = run_net(&drop, 1, 0, 0, 0, &l2, &n2);
    cr_assert_eq(count_differences(l1, l2, nl), 0, "eval with dropout 0.3 drops something");
    /* training: it does drop */
    float *g3 = run_net(&drop, 1, 0, 0, 1, &l3, &n3);
    cr_assert_gt(count_differences(l1, l3, nl), nl / 2, "training with dropout 0.3 drops nothing");
    cr_assert_gt(count_differences(g1, g3, n1), n1 / 2);
    free(g1), free(g2), free(g3), free(l1), free(l2), free(l3);
    net_desc_free(&none);
    net_desc_free(&zero);
    net_desc_free(&drop);
}

Test(block_dropout, masks_do_not_depend_on_the_layout)
{
    openblas_set_num_threads(1);
    for (int big = 0; big < 2; big++) {
        net_desc net;
        if (big) { /* gpt-nano with dropout 0.2 in its blocks: T = 32, so 2 threads cut a
                      micro-batch of 4 into gradient groups */
            load_model(&net, "gpt-nano.cfg");
            for (int l = 0; l < net.n_layers; l++)
                if (net.layers[l].type == LAYER_BLOCK) net.layers[l].u.block.p = 0.2f;
        } else {
            parse_tiny(&net, 0.3, 1);
        }
        size_t n1, n2, n3, n4;
        float *l1, *l2, *l3, *l4;
        float *whole = run_net(&net, 1, 0, 0, 1, &l1, &n1);
        float *two = run_net(&net, 2, 0, 0, 1, &l2, &n2);
        float *split = run_net(&net, 1, 1, 0, 1, &l3, &n3);
        float *cut = run_net(&net, 1, 0, 1, 1, &l4, &n4);
        size_t nl = (size_t)4 * net.input.c * net.classes;
        cr_assert_eq(count_differences(l1, l2, nl), 0, "2 threads: logits differ");
        cr_assert_eq(count_differences(l1, l3, nl), 0, "split: logits differ");
        /* the same masks in a micro-batch of 2: the tiny net's products give the same bits
         * at 2 and 4 samples; gpt-nano's (64 against 128 rows) round differently even
         * without dropout, so within 1e-5 there (a mask moved by the cut would be far) */
        double lw = 0;
        for (size_t i = 0; i < nl; i++)
            if (fabs((double)l1[i] - l4[i]) > lw) lw = fabs((double)l1[i] - l4[i]);
        cr_assert(big ? lw <= 1e-5 : lw == 0, "2 + 2 samples: logits differ by %g", lw);
        cr_assert_eq(count_differences(whole, two, n1), 0, "2 threads: gradients differ");
        cr_assert_eq(count_differences(whole, split, n1), 0, "split: gradients differ");
        /* two micro-batches sum their gradients apart: within rounding of one */
        double worst = 0, scale = 0;
        for (size_t i = 0; i < n1; i++) {
            double dd = fabs((double)whole[i] - cut[i]);
            if (dd > worst) worst = dd;
            if (fabs(whole[i]) > scale) scale = fabs(whole[i]);
        }
        cr_assert(worst <= 1e-5 * scale, "2 + 2 samples: gradients differ by %g (scale %g)",
                  worst, scale);
        free(whole), free(two), free(split), free(cut);
        free(l1), free(l2), free(l3), free(l4);
        net_desc_free(&net);
    }
}
