/* The CPU engine's data-parallel operations (src/engine/engine.h): backward by layer ranges,
 * gradients kept apart in pieces, the host view of the gradients that the step uses, and
 * zeroing. (The CUDA engine is compared with this one in tests/cuda/test_engine_cuda_mock.c.) */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/engine/engine.h"
#include "src/runtime/engine_create.h"
#include "tests/check.h"

void openblas_set_num_threads(int);

enum { MB = 16, M = 4 };


static dataset make_data(int count, unsigned seed)
{
    dataset d = {.count = count, .channels = 1, .rows = 28, .cols = 28,
                 .pixels = malloc((size_t)count * 28 * 28),
                 .labels = malloc((size_t)count * sizeof(int32_t))};
    cr_assert(d.pixels && d.labels);
    for (size_t i = 0; i < (size_t)count * 28 * 28; i++) {
        seed = seed * 1664525u + 1013904223u;
        d.pixels[i] = (uint8_t)(seed >> 24);
    }
    for (int i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        d.labels[i] = (int32_t)((seed >> 16) % 10u);
    }
    return d;
}

static engine *make_engine(const net_desc *net, int pieces)
{
    engine_config c = {.net = net, .first = 0, .last = net->n_layers, .buffers = M,
                       .max_batch = MB, .n_slots = M, .batch = MB * M, .threads = 1,
                       .max_ticks = 1, .grad_pieces = pieces};
    engine *e;
    cr_assert_eq(engine_create(&e, ENGINE_CPU, &c), 0, "%s", pt_error_get());
    cr_assert_eq(engine_init_params(e, 3), 0);
    return e;
}

static void forward_all(engine *e, const dataset *d)
{
    for (int m = 0; m < M; m++) {
        int64_t ids[MB];
        for (int j = 0; j < MB; j++) ids[j] = m * MB + j;
        cr_assert_eq(engine_load(e, m, d, ids, MB), 0);
        cr_assert_eq(engine_forward(e, m, MB, 1, 0, 1, -1), 0, "%s", pt_error_get());
    }
}

/* Micro-batch gradients formed apart in 2 pieces by one range per layer, read through
 * grads_host and summed in micro-batch order, are the accumulated gradients bit for bit. */
Test(engine_cpu, pieces_by_ranges_sum_to_the_accumulated_gradients)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    dataset d = make_data(M * MB, 5);
    engine *a = make_engine(&net, 0), *b = make_engine(&net, 2);
    size_t P = a->param_count;
    float *sum = malloc(P * sizeof(float)), *g[M], *ga, *h;
    cr_assert(sum);
    forward_all(a, &d);
    forward_all(b, &d);
    for (int m = 0; m < M; m++) {
        cr_assert_eq(engine_backward(a, m, -1), 0);
        for (int hi = net.n_layers; hi > 0; hi--)
            cr_assert_eq(engine_backward_range(b, m, hi - 1, hi, -1), 0, "%s", pt_error_get());
        cr_assert_eq(engine_grads_host(b, m % 2, 0, P, &h), 0, "%s", pt_error_get());
        g[m] = malloc(P * sizeof(float));
        cr_assert(g[m]);
        memcpy(g[m], h, P * sizeof(float));
        for (size_t i = 0; i < P; i++) sum[i] = m ? sum[i] + h[i] : h[i];
    }
    cr_assert_eq(engine_grads_host(a, 0, 0, P, &ga), 0);
    size_t diff = 0, nonzero = 0, reversed = 0;
    for (size_t i = 0; i < P; i++) {
        diff += memcmp(&ga[i], &sum[i], sizeof(float)) != 0;
        nonzero += sum[i] != 0;
        float r = g[M - 1][i];
        for (int m = M - 2; m >= 0; m--) r += g[m][i];
        reversed += r != ga[i];
    }
    cr_assert_eq(diff, 0, "%zu of %zu gradients differ", diff, P);
    cr_assert_gt(nonzero, P / 2);
    cr_assert_gt(reversed, 0, "a sum in another order is the same: the comparison is blind");
    for (int m = 0; m < M; m++) free(g[m]);
    free(sum);
    engine_destroy(a);
    engine_destroy(b);
    data_free(&d);
    net_desc_free(&net);
}

/* grads_host is the memory the step reads: gradients zeroed through it (and committed)
 * leave the parameters of a plain SGD step unchanged, a gradient of one there moves them. */
Test(engine_cpu, host_view_is_what_the_step_uses)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    dataset d = make_data(M * MB, 7);
    engine *e = make_engine(&net, 0);
    size_t P = e->param_count, half = P / 2;
    float *before = malloc(P * sizeof(float)), *after = malloc(P * sizeof(float)), *h;
    cr_assert(before && after);
    cr_assert_eq(engine_read_params(e, before), 0);
    forward_all(e, &d);
    for (int m = 0; m < M; m++) cr_assert_eq(engine_backward(e, m, -1), 0);
    cr_assert_eq(engine_grads_host(e, 0, 0, half, &h), 0);
    memset(h, 0, half * sizeof(float));
    cr_assert_eq(engine_grads_commit(e, 0, half), 0);
    cr_assert_eq(engine_grads_host(e, 0, half, P - half, &h), 0);
    for (size_t i = 0; i < P - half; i++) h[i] = 1.0f;
    cr_assert_eq(engine_grads_commit(e, half, P - half), 0);
    optimizer_config sgd = {.kind = OPTIM_SGD, .lr = 0.5f};
    cr_assert_eq(engine_step(e, &sgd, -1), 0);
    cr_assert_eq(engine_read_params(e, after), 0);
    cr_assert_eq(memcmp(before, after, half * sizeof(float)), 0);
    for (size_t i = half; i < P; i++) cr_assert_eq(after[i], before[i] - 0.5f);
    /* the step zeroed the gradients; zero_grads does too, without a step */
    cr_assert_eq(engine_grads_host(e, 0, 0, P, &h), 0);
    for (size_t i = 0; i < P; i++) cr_assert_eq(h[i], 0.0f);
    h[0] = 1;
    cr_assert_eq(engine_zero_grads(e), 0);
    cr_assert_eq(h[0], 0.0f);
    free(before);
    free(after);
    engine_destroy(e);
    data_free(&d);
    net_desc_free(&net);
}

Test(engine_cpu, misuse_is_refused_with_a_message)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    dataset d = make_data(M * MB, 9);
    engine *e = make_engine(&net, 2);
    size_t P = e->param_count;
    float *h;
    optimizer_config sgd = {.kind = OPTIM_SGD, .lr = 0.1f};
    forward_all(e, &d);
    cr_assert_neq(engine_backward_range(e, 0, 0, 1, -1), 0, "not from the top");
    cr_assert_neq(engine_backward_range(e, M, 2, 3, -1), 0, "buffer out of range");
    cr_assert_eq(engine_backward_range(e, 0, 2, 3, -1), 0, "%s", pt_error_get());
    cr_assert_neq(engine_backward(e, 1, -1), 0, "backward in between");
    cr_assert(strstr(pt_error_get(), "unfinished"), "%s", pt_error_get());
    cr_assert_neq(engine_step(e, &sgd, -1), 0, "step in between");
    cr_assert_neq(engine_backward_range(e, 1, 1, 2, -1), 0, "other micro-batch");
    cr_assert_eq(engine_backward_range(e, 0, 0, 2, -1), 0, "%s", pt_error_get());
    cr_assert_neq(engine_grads_host(e, 2, 0, 1, &h), 0, "piece out of range");
    cr_assert(strstr(pt_error_get(), "outside"), "%s", pt_error_get());
    cr_assert_neq(engine_grads_host(e, 0, P, 1, &h), 0, "past the end");
    cr_assert_neq(engine_grads_commit(e, 1, P), 0, "past the end");
    cr_assert_eq(engine_grads_host(e, 1, P, 0, &h), 0, "an empty range at the end");
    /* zero_grads abandons an unfinished backward by ranges */
    cr_assert_eq(engine_backward_range(e, 1, 2, 3, -1), 0, "%s", pt_error_get());
    cr_assert_eq(engine_zero_grads(e), 0);
    cr_assert_eq(engine_step(e, &sgd, -1), 0, "%s", pt_error_get());
    engine_destroy(e);
    data_free(&d);
    net_desc_free(&net);
}

/* The samples keep one buffer per micro-batch of both steps' halves; the messages one per
 * micro-batch (engine_config.message_buffers): buffer b and b + M share their messages,
 * never their samples. A stage after the first: its input is a message too. */
Test(engine_cpu, messages_take_one_buffer_per_microbatch)
{
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    for (int first = 0; first < 2; first++) {
        engine_config c = {.net = &net, .first = first, .last = net.n_layers - 1,
                           .buffers = 2 * M, .message_buffers = M, .max_batch = MB,
                           .n_slots = M, .batch = MB * M, .threads = 1, .max_ticks = 1};
        engine *e;
        cr_assert_eq(engine_create(&e, ENGINE_CPU, &c), 0, "%s", pt_error_get());
        for (int b = 0; b < M; b++) {
            void *in = engine_msg_buffer(e, ENGINE_MSG_ACT_IN, b);
            void *in2 = engine_msg_buffer(e, ENGINE_MSG_ACT_IN, b + M);
            cr_assert(first ? in == in2 : in != in2, "first %d buffer %d", first, b);
            cr_assert_eq(engine_msg_buffer(e, ENGINE_MSG_GRAD_IN, b),
                         engine_msg_buffer(e, ENGINE_MSG_GRAD_IN, b + M));
            if (first)
                cr_assert_eq(engine_msg_buffer(e, ENGINE_MSG_GRAD_OUT, b),
                             engine_msg_buffer(e, ENGINE_MSG_GRAD_OUT, b + M));
            for (int b2 = 0; b2 < b; b2++)
                cr_assert_neq(engine_msg_buffer(e, ENGINE_MSG_GRAD_IN, b),
                              engine_msg_buffer(e, ENGINE_MSG_GRAD_IN, b2));
        }
        engine_destroy(e);
    }
    net_desc_free(&net);
}

/* On the last stage the loss gradient takes the logits' place in the micro-batch's slot
 * (the dense classifier's backward reads its input, not its output), and the gradients
 * are those of an engine that keeps it apart (recomputation: the slot goes between the
 * forward and the backward, so the gradient has a buffer of its own). */
Test(engine_cpu, loss_gradient_in_the_logits_place)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    dataset d = make_data(M * MB, 9);
    engine *e[2];
    for (int r = 0; r < 2; r++) {
        engine_config c = {.net = &net, .first = 0, .last = net.n_layers, .buffers = M,
                           .max_batch = MB, .n_slots = M, .batch = MB * M, .threads = 1,
                           .max_ticks = 1, .microbatches = M, .recompute = r};
        cr_assert_eq(engine_create(&e[r], ENGINE_CPU, &c), 0, "%s", pt_error_get());
        cr_assert_eq(engine_init_params(e[r], 3), 0);
    }
    int64_t ids[MB];
    for (int j = 0; j < MB; j++) ids[j] = j;
    cr_assert_eq(engine_load(e[0], 0, &d, ids, MB), 0);
    cr_assert_eq(engine_forward(e[0], 0, MB, 1, 0, 1, -1), 0, "%s", pt_error_get());
    cr_assert_eq(engine_msg_buffer(e[0], ENGINE_MSG_GRAD_IN, 0),
                 engine_msg_buffer(e[0], ENGINE_MSG_ACT_OUT, 0));
    cr_assert_eq(engine_backward(e[0], 0, -1), 0);
    /* kept apart (the slot is dropped after the forward and rebuilt): the same bits */
    cr_assert_eq(engine_load(e[1], 0, &d, ids, MB), 0);
    cr_assert_eq(engine_forward(e[1], 0, MB, 1, 0, 1, -1), 0, "%s", pt_error_get());
    cr_assert_eq(engine_recompute(e[1], 0, 1, 0, -1), 0, "%s", pt_error_get());
    cr_assert_neq(engine_msg_buffer(e[1], ENGINE_MSG_GRAD_IN, 0),
                  engine_msg_buffer(e[1], ENGINE_MSG_ACT_OUT, 0));
    cr_assert_eq(engine_backward(e[1], 0, -1), 0);
    size_t P = e[0]->param_count;
    float *g0, *g1 = malloc(P * sizeof(float));
    cr_assert(g1);
    cr_assert_eq(engine_grads_host(e[1], 0, 0, P, &g0), 0);
    memcpy(g1, g0, P * sizeof(float));
    cr_assert_eq(engine_grads_host(e[0], 0, 0, P, &g0), 0);
    cr_assert(memcmp(g0, g1, P * sizeof(float)) == 0, "in place and apart differ");
    free(g1);
    for (int r = 0; r < 2; r++) engine_destroy(e[r]);
    data_free(&d);
    net_desc_free(&net);
}
