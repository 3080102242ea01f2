/* A language model's samples as data sets (src/io/data_text.c) and how a step's batch of
 * windows reaches the engine: each layout's replicas and micro-batches take the global
 * sample ids exec_first_sample deals, so every layout trains on the same windows; the
 * evaluation windows are evenly spaced; the CPU engine loads T token ids and T labels per
 * sample and its loss is per position. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/base/error.h"
#include "src/engine/engine.h"
#include "src/io/data.h"
#include "src/runtime/engine_create.h"
#include "src/runtime/exec.h"
#include "tests/check.h"

void openblas_set_num_threads(int);

/* A corpus of n tokens below vocab (a fixed pseudo-random sequence). */
static text_tokens corpus(size_t n, int vocab)
{
    text_tokens t = {.tokens = malloc(n * sizeof(int32_t)), .count = n, .vocab = vocab};
    cr_assert_not_null(t.tokens);
    unsigned x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t.tokens[i] = (int32_t)((x >> 16) % (unsigned)vocab);
    }
    return t;
}

/* Sample k of d is the window of the corpus at offset o. */
static void expect_window(const dataset *d, int k, const text_tokens *t, size_t o)
{
    int T = d->seq;
    for (int j = 0; j < T; j++) {
        cr_assert_eq(d->tokens[(size_t)k * T + j], (float)t->tokens[o + j],
                     "sample %d position %d: input", k, j);
        cr_assert_eq(d->labels[(size_t)k * T + j], t->tokens[o + j + 1],
                     "sample %d position %d: target", k, j);
    }
}

Test(text_batch, sample_i_is_the_window_of_its_global_id)
{
    text_tokens t = corpus(5000, 256);
    dataset d;
    cr_assert_eq(data_text_alloc(&d, 24, 16), 0);
    cr_assert_eq(data_labels_per_sample(&d), 16);
    for (uint64_t step = 0; step < 3; step++) {
        cr_assert_eq(data_text_batch(&d, &t, 7, step), 0, "%s", pt_error_get());
        for (int i = 0; i < d.count; i++)
            expect_window(&d, i, &t, text_sample_offset(&t, 16, 7, step, (uint64_t)i));
    }
    /* the same as text_fill_batch, the corpus module's own reading of the rule */
    uint64_t ids[24];
    int32_t in[24 * 16], tg[24 * 16];
    for (int i = 0; i < 24; i++) ids[i] = (uint64_t)i;
    cr_assert_eq(text_fill_batch(&t, 16, 7, 2, ids, 24, in, tg), 0);
    for (int k = 0; k < 24 * 16; k++) {
        cr_assert_eq(d.tokens[k], (float)in[k]);
        cr_assert_eq(d.labels[k], tg[k]);
    }
    data_free(&d);
    text_free(&t);
}

/* Every layout (R replicas × M micro-batches of B/(R·M)) deals each global id once, and the
 * rows a replica's micro-batch loads are the one-process batch's rows of those ids. */
Test(text_batch, every_layout_takes_the_same_windows)
{
    enum { B = 16, T = 8 };
    text_tokens t = corpus(3000, 200);
    dataset d;
    cr_assert_eq(data_text_alloc(&d, B, T), 0);
    cr_assert_eq(data_text_batch(&d, &t, 3, 11), 0);
    int64_t order[B];
    for (int i = 0; i < B; i++) order[i] = i;
    int layouts[][2] = {{1, 1}, {1, 2}, {1, 4}, {1, 16}, {2, 1}, {2, 2}, {2, 8}, {4, 1},
                        {4, 4}, {8, 2}, {16, 1}};
    for (size_t L = 0; L < sizeof layouts / sizeof *layouts; L++) {
        int R = layouts[L][0], M = layouts[L][1], mb = B / (R * M);
        int seen[B] = {0};
        for (int r = 0; r < R; r++)
            for (int m = 0; m < M; m++) {
                size_t first = exec_first_sample(B, R, r, M, m);
                cr_assert_leq(first + (size_t)mb, (size_t)B);
                for (int j = 0; j < mb; j++) {
                    int64_t id = order[first + (size_t)j];
                    seen[id]++;
                    /* what the engine copies for sample j of this micro-batch */
                    expect_window(&d, (int)id, &t, text_sample_offset(&t, T, 3, 11, (uint64_t)id));
                    /* the ids run in order: replica r's micro-batch m is the one-process
                     * run's micro-batch r·M + m of R·M */
                    cr_assert_eq(id, (int64_t)(r * M + m) * mb + j, "R=%d M=%d", R, M);
                }
            }
        for (int i = 0; i < B; i++) cr_assert_eq(seen[i], 1, "R=%d M=%d: id %d", R, M, i);
    }
    data_free(&d);
    text_free(&t);
}

Test(text_batch, evaluation_windows_are_evenly_spaced)
{
    text_tokens t = corpus(1000, 50);
    dataset d;
    cr_assert_eq(data_text_eval(&d, &t, 10, 5), 0, "%s", pt_error_get());
    cr_assert_eq(d.count, 5);
    size_t last = 1000 - 10 - 1;
    for (int k = 0; k < 5; k++) expect_window(&d, k, &t, (size_t)k * last / 4);
    data_free(&d);
    /* one window: at 0; more windows than offsets: one per offset */
    cr_assert_eq(data_text_eval(&d, &t, 10, 1), 0);
    cr_assert_eq(d.count, 1);
    expect_window(&d, 0, &t, 0);
    data_free(&d);
    text_tokens small = corpus(14, 50);
    cr_assert_eq(data_text_eval(&d, &small, 10, 64), 0);
    cr_assert_eq(d.count, 4); /* offsets 0 … 14 − 10 − 1 */
    for (int k = 0; k < 4; k++) expect_window(&d, k, &small, (size_t)k);
    data_free(&d);
    /* no window at all */
    small.count = 10;
    cr_assert_eq(data_text_eval(&d, &small, 10, 4), -1);
    cr_assert(strstr(pt_error_get(), "no window"), "%s", pt_error_get());
    text_free(&small);
    text_free(&t);
}

Test(text_batch, a_corpus_too_short_is_refused)
{
    text_tokens t = corpus(8, 50);
    dataset d;
    cr_assert_eq(data_text_alloc(&d, 2, 8), 0);
    cr_assert_eq(data_text_batch(&d, &t, 1, 0), -1);
    cr_assert(strstr(pt_error_get(), "too short"), "%s", pt_error_get());
    data_free(&d);
    text_free(&t);
    cr_assert_eq(data_text_alloc(&d, 2, 0), -1);
}

static const char *const NANO =
    "[net]\n[embedding]\nvocab=64\ncontext=8\nwidth=16\n[block]\nheads=2\n[layernorm]\n"
    "[lm_head]\n";

Test(text_batch, fake_data_fits_either_kind_of_model)
{
    net_desc gpt, mlp;
    cr_assert_eq(net_desc_parse_string(&gpt, NANO, "nano"), 0, "%s", pt_error_get());
    load_model(&mlp, "seed-mlp.cfg");
    dataset a, b;
    cr_assert_eq(data_fake(&a, &gpt, 5), 0);
    cr_assert_eq(data_labels_per_sample(&a), data_model_labels(&gpt));
    cr_assert_eq(data_model_labels(&gpt), 8);
    for (int i = 0; i < 5 * 8; i++) {
        cr_assert_lt(a.tokens[i], 64.0f);
        cr_assert_lt(a.labels[i], 64);
    }
    cr_assert_eq(data_fake(&b, &mlp, 5), 0);
    cr_assert_null(b.tokens);
    cr_assert_eq(data_labels_per_sample(&b), 1);
    cr_assert_eq(data_model_labels(&mlp), 1);
    cr_assert_eq(data_image_bytes(&b), 784u);
    data_free(&a);
    data_free(&b);
    net_desc_free(&gpt);
    net_desc_free(&mlp);
}

/* The CPU engine takes T token ids and T labels per sample, and its loss is the sum over
 * every position's cross-entropy (kernel_softmax_xent_cpu over n·T rows of its logits);
 * data of the other kind is refused. */
Test(text_batch, the_engine_loss_is_per_position)
{
    openblas_set_num_threads(1);
    enum { N = 3, T = 8, V = 64 };
    net_desc net;
    cr_assert_eq(net_desc_parse_string(&net, NANO, "nano"), 0, "%s", pt_error_get());
    engine_config c = {.net = &net, .first = 0, .last = net.n_layers, .buffers = 2,
                       .max_batch = N, .n_slots = 1, .batch = N, .threads = 1, .max_ticks = 1};
    engine *e;
    cr_assert_eq(engine_create(&e, ENGINE_CPU, &c), 0, "%s", pt_error_get());
    cr_assert_eq(engine_init_params(e, 1), 0);
    text_tokens t = corpus(500, V);
    dataset d;
    cr_assert_eq(data_text_alloc(&d, 6, T), 0);
    cr_assert_eq(data_text_batch(&d, &t, 5, 0), 0);
    int64_t ids[N] = {4, 1, 5};
    cr_assert_eq(engine_load(e, 0, &d, ids, N), 0, "%s", pt_error_get());
    cr_assert_eq(engine_forward(e, 0, N, 1, 0, 0, -1), 0, "%s", pt_error_get());
    const float *logits = engine_msg_buffer(e, ENGINE_MSG_ACT_OUT, 0);
    int32_t labels[N * T];
    for (int k = 0; k < N; k++) memcpy(labels + k * T, d.labels + ids[k] * T, T * sizeof(int32_t));
    int ok = 0;
    double want = kernel_softmax_xent_cpu(NULL, &ok, logits, labels, N * T, V, 1.0f);
    engine_result r;
    cr_assert_eq(engine_release(e, 0), 0);
    cr_assert_eq(engine_finish(e, &r), 0);
    cr_assert_eq(r.loss_sum, want);
    cr_assert_eq(r.correct, ok);
    /* at initialisation (σ 0.02) the logits are nearly equal: about ln V a token */
    cr_assert_lt(fabs(r.loss_sum / (N * T) - log(V)), 0.05, "%g", r.loss_sum / (N * T));
    /* image data for a language model */
    dataset img = {.count = 4, .channels = 8, .rows = 1, .cols = 1,
                   .pixels = calloc(32, 1), .labels = calloc(4, sizeof(int32_t))};
    int64_t one = 0;
    cr_assert_eq(engine_load(e, 1, &img, &one, 1), -1);
    cr_assert(strstr(pt_error_get(), "image data"), "%s", pt_error_get());
    data_free(&img);
    engine_destroy(e);
    data_free(&d);
    text_free(&t);
    net_desc_free(&net);
}
