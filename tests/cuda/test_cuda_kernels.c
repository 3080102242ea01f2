/* CUDA kernels against their CPU references in kernels/, on random inputs.
 *
 * A plain program (not Criterion: its fork per test would re-initialise CUDA each time).
 * - Always: the cuRAND device-API path the dropout and init kernels use, built for the
 *   host (kernel_cuda_rng_block), must give kernels/rng.h's Philox blocks bit for bit.
 * - No usable GPU: kernel_cuda_ctx_init must fail with "no CUDA device"; then the program
 *   prints "SKIP: ..." and exits 77 (ctest's SKIP_RETURN_CODE).
 * - With a GPU: every kernel on several shapes (the seed-cnn layers, odd sizes, stride 2,
 *   pad 1), outputs poisoned with NaN (0xFF bytes) before each run so an unwritten element
 *   fails, backward passes called repeatedly on accumulating gradients, and the result
 *   compared with the CPU kernel: float-rounding kernels by the normwise relative error
 *   max|gpu − cpu| / max|cpu| (fails above 1e-4), the others bit for bit.
 * - The backward halves against the CPU's and, bit for bit, against the fused CUDA call;
 *   the dense weight gradient of a tile of units (tests/cuda/test_cuda_kernels_split.c).
 * - The tensor-shard kernels bit for bit: dropout and init over a range of each vector
 *   against the CPU's range twins and the columns of the whole-vector result, with guard
 *   elements after the output that must stay poisoned; the bias add.
 * - The transformer kernels and the many-block loss (tests/cuda/test_cuda_kernels_transformer.c;
 *   not yet run on a GPU).
 * Ends with "N passed, N failed" and exits 1 if anything failed. The harness (buffers,
 * copies, comparisons, bookkeeping) is tests/cuda/kernel_check.{h,c}. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "src/base/error.h"
#include "tests/cuda/kernel_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- the cases ---------------- */

/* kernels/rng.h against the cuRAND path of the dropout and init kernels, on the host. */
static void test_rng_host(void)
{
    const uint64_t seeds[] = {0, 1, 2024, 0x0123456789abcdefULL, ~0ULL};
    const uint64_t streams[] = {0, 3, rng_stream_init(7, 1), rng_stream_dropout(12, 987654),
                                rng_stream_shuffle(3), ~0ULL};
    /* Blocks < 2^62: every block an index i>>2 of rng.h can name. */
    const uint64_t blocks[] = {0, 1, 2, 255, (1ULL << 30) + 5, (123456ULL << 30) | 63,
                               0xfffffff0ULL, (1ULL << 62) - 1};
    size_t bad = 0, total = 0;
    for (size_t a = 0; a < sizeof seeds / sizeof *seeds; a++)
        for (size_t b = 0; b < sizeof streams / sizeof *streams; b++)
            for (size_t c = 0; c < sizeof blocks / sizeof *blocks; c++)
                for (uint64_t d = 0; d < 8 && blocks[c] + d < (1ULL << 62); d++) {
                    uint32_t got[4], want[4];
                    kernel_cuda_rng_block(got, seeds[a], streams[b], blocks[c] + d);
                    rng_philox4x32_10(want, seeds[a], streams[b], blocks[c] + d);
                    bad += memcmp(got, want, sizeof got) != 0;
                    total++;
                }
    char shape[64], detail[64] = "";
    snprintf(shape, sizeof shape, "%zu blocks, on the host", total);
    if (bad)
        snprintf(detail, sizeof detail, "%zu blocks differ", bad);
    record("curand philox = rng.h", shape, bad == 0, bad ? INFINITY : 0.0, 1, detail);
}

static void test_dense(int n, int in_f, int out_f, int with_bias)
{
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d %d->%d%s", n, in_f, out_f, with_bias ? "" : " no bias");
    const size_t ni = (size_t)n * in_f, no = (size_t)n * out_f, nw = (size_t)out_f * in_f;
    const size_t fs = sizeof(float);
    float *in = rand_f(ni, -1, 1), *w = rand_f(nw, -0.5f, 0.5f), *b = rand_f(out_f, -1, 1);
    float *dout = rand_f(no, -1, 1), *dw = rand_f(nw, -1, 1), *db = rand_f(out_f, -1, 1);
    float *d_in = dcopy(in, ni * fs), *d_w = dcopy(w, nw * fs);
    float *d_b = with_bias ? dcopy(b, out_f * fs) : NULL, *d_dout = dcopy(dout, no * fs);
    float *d_dw = dcopy(dw, nw * fs), *d_db = dcopy(db, out_f * fs);
    float *d_out = dmalloc(no * fs), *d_din = dmalloc(ni * fs);
    float *out = hmalloc(no * fs), *din = hmalloc(ni * fs);

    kernel_dense_forward_cpu(out, in, w, with_bias ? b : NULL, n, in_f, out_f);
    poison(d_out, no * fs);
    if (call_ok("dense_forward", shape,
                kernel_dense_forward_cuda(d_out, d_in, d_w, d_b, n, in_f, out_f, &ctx)))
        check_close("dense_forward", shape, fetch_f(d_out, no), out, no);

    /* Three backward calls, the middle one without din: dw and db must accumulate all
     * three, din must be overwritten (it is poisoned before each call that writes it). */
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        kernel_dense_backward_cpu(k == 1 ? NULL : din, dw, db, dout, in, w, n, in_f, out_f);
        if (k != 1)
            poison(d_din, ni * fs);
        ok = ok && call_ok("dense_backward", shape,
                           kernel_dense_backward_cuda(k == 1 ? NULL : d_din, d_dw, d_db, d_dout,
                                                      d_in, d_w, n, in_f, out_f, &ctx));
    }
    if (ok) {
        check_close("dense_backward din", shape, fetch_f(d_din, ni), din, ni);
        check_close("dense_backward dw", shape, fetch_f(d_dw, nw), dw, nw);
        check_close("dense_backward db", shape, fetch_f(d_db, out_f), db, out_f);
    }
    free_case();
}

static void test_conv(kernel_conv2d_dims d, int with_bias)
{
    char shape[80];
    snprintf(shape, sizeof shape, "n%d c%d %dx%d f%d k%d s%d p%d%s", d.n, d.c, d.h, d.w,
             d.filters, d.size, d.stride, d.pad, with_bias ? "" : " no bias");
    const size_t fs = sizeof(float);
    const size_t oh = kernel_conv2d_out_h(&d), ow = kernel_conv2d_out_w(&d);
    const size_t ni = (size_t)d.n * d.c * d.h * d.w, no = (size_t)d.n * d.filters * oh * ow;
    const size_t nw = (size_t)d.filters * d.c * d.size * d.size, nb = d.filters;
    const size_t ws = kernel_conv2d_workspace_floats_cuda(&d);
    float *in = rand_f(ni, -1, 1), *w = rand_f(nw, -0.5f, 0.5f), *b = rand_f(nb, -1, 1);
    float *dout = rand_f(no, -1, 1), *dw = rand_f(nw, -1, 1), *db = rand_f(nb, -1, 1);
    float *work = hmalloc(kernel_conv2d_workspace_floats(&d) * fs);
    float *out = hmalloc(no * fs), *din = hmalloc(ni * fs);
    float *d_in = dcopy(in, ni * fs), *d_w = dcopy(w, nw * fs);
    float *d_b = with_bias ? dcopy(b, nb * fs) : NULL, *d_dout = dcopy(dout, no * fs);
    float *d_dw = dcopy(dw, nw * fs), *d_db = dcopy(db, nb * fs);
    float *d_out = dmalloc(no * fs), *d_din = dmalloc(ni * fs), *d_work = dmalloc(ws * fs);

    kernel_conv2d_forward_cpu(out, work, in, w, with_bias ? b : NULL, &d);
    poison(d_out, no * fs);
    poison(d_work, ws * fs); /* nothing may depend on the workspace's previous content */
    if (call_ok("conv2d_forward", shape,
                kernel_conv2d_forward_cuda(d_out, d_work, d_in, d_w, d_b, &d, &ctx)))
        check_close("conv2d_forward", shape, fetch_f(d_out, no), out, no);

    int ok = 1;
    for (int k = 0; k < 3; k++) {
        kernel_conv2d_backward_cpu(k == 1 ? NULL : din, dw, db, work, dout, in, w, &d);
        if (k != 1)
            poison(d_din, ni * fs);
        poison(d_work, ws * fs);
        ok = ok && call_ok("conv2d_backward", shape,
                           kernel_conv2d_backward_cuda(k == 1 ? NULL : d_din, d_dw, d_db, d_work,
                                                       d_dout, d_in, d_w, &d, &ctx));
    }
    if (ok) {
        check_close("conv2d_backward din", shape, fetch_f(d_din, ni), din, ni);
        check_close("conv2d_backward dw", shape, fetch_f(d_dw, nw), dw, nw);
        check_close("conv2d_backward db", shape, fetch_f(d_db, nb), db, nb);
    }
    free_case();
}

/* data: 0 random, 1 many ties (first maximum must win), 2 NaN and −inf sprinkled in. */
static void test_pool(int n, int c, int h, int w, int size, int stride, int data)
{
    static const char *kinds[] = {"", " ties", " nan/-inf"};
    char shape[80];
    snprintf(shape, sizeof shape, "n%d c%d %dx%d size%d stride%d%s", n, c, h, w, size, stride,
             kinds[data]);
    const size_t fs = sizeof(float);
    const size_t oh = (h - size) / stride + 1, ow = (w - size) / stride + 1;
    const size_t ni = (size_t)n * c * h * w, no = (size_t)n * c * oh * ow;
    float *in = rand_f(ni, -1, 1), *dout = rand_f(no, -1, 1);
    for (size_t i = 0; i < ni; i++) {
        if (data == 1)
            in[i] = floorf(in[i] * 1.5f);
        if (data == 2 && i % 7 == 3)
            in[i] = NAN;
        if (data == 2 && i % 5 == 1)
            in[i] = -INFINITY;
    }
    float *out = hmalloc(no * fs), *din = hmalloc(ni * fs);
    int32_t *arg = hmalloc(no * sizeof *arg), *garg = hmalloc(no * sizeof *garg);
    float *d_in = dcopy(in, ni * fs), *d_dout = dcopy(dout, no * fs);
    float *d_out = dmalloc(no * fs), *d_din = dmalloc(ni * fs);
    int32_t *d_arg = dmalloc(no * sizeof *d_arg);

    kernel_maxpool2d_forward_cpu(out, arg, in, n, c, h, w, size, stride);
    kernel_maxpool2d_backward_cpu(din, dout, arg, n, c, h, w, size, stride);
    poison(d_out, no * fs);
    poison(d_arg, no * sizeof *d_arg);
    if (call_ok("maxpool2d_forward", shape,
                kernel_maxpool2d_forward_cuda(d_out, d_arg, d_in, n, c, h, w, size, stride,
                                              &ctx))) {
        check_exact("maxpool2d_forward", shape, fetch_f(d_out, no), out, no);
        download(garg, d_arg, no * sizeof *garg);
        check_exact_bytes("maxpool2d_forward argmax", shape, garg, arg, no, sizeof *arg);
    }
    /* The backward runs on the CPU's argmax, so it is checked on its own. */
    upload(d_arg, arg, no * sizeof *arg);
    poison(d_din, ni * fs);
    if (call_ok("maxpool2d_backward", shape,
                kernel_maxpool2d_backward_cuda(d_din, d_dout, d_arg, n, c, h, w, size, stride,
                                               &ctx)))
        check_exact("maxpool2d_backward", shape, fetch_f(d_din, ni), din, ni);

    if (data != 2) {
        kernel_avgpool2d_forward_cpu(out, in, n, c, h, w, size, stride);
        kernel_avgpool2d_backward_cpu(din, dout, n, c, h, w, size, stride);
        poison(d_out, no * fs);
        poison(d_din, ni * fs);
        if (call_ok("avgpool2d_forward", shape,
                    kernel_avgpool2d_forward_cuda(d_out, d_in, n, c, h, w, size, stride, &ctx)))
            check_exact("avgpool2d_forward", shape, fetch_f(d_out, no), out, no);
        if (call_ok("avgpool2d_backward", shape,
                    kernel_avgpool2d_backward_cuda(d_din, d_dout, n, c, h, w, size, stride,
                                                   &ctx)))
            check_exact("avgpool2d_backward", shape, fetch_f(d_din, ni), din, ni);
    }
    free_case();
}

static void test_activation(kernel_act act, size_t count, int in_place)
{
    static const char *fwd[] = {"activation_fwd linear", "activation_fwd relu",
                                "activation_fwd sigmoid", "activation_fwd tanh"};
    static const char *bwd[] = {"activation_bwd linear", "activation_bwd relu",
                                "activation_bwd sigmoid", "activation_bwd tanh"};
    char shape[64];
    snprintf(shape, sizeof shape, "count=%zu%s", count, in_place ? " in place" : "");
    const size_t bytes = count * sizeof(float);
    float *in = rand_f(count, -6, 6), *dout = rand_f(count, -1, 1);
    const float special[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 30.0f, -30.0f, 1e-30f,
                             -1e-30f, 0.5f, 88.0f, -90.0f};
    for (size_t i = 0; i < count && i < sizeof special / sizeof *special; i++)
        in[i] = special[i];
    float *out = hmalloc(bytes), *din = hmalloc(bytes);
    kernel_activation_forward_cpu(out, in, count, act);
    kernel_activation_backward_cpu(din, dout, out, count, act);

    float *d_in = dcopy(in, bytes), *d_out = in_place ? d_in : dmalloc(bytes);
    if (!in_place)
        poison(d_out, bytes);
    if (call_ok(fwd[act], shape, kernel_activation_forward_cuda(d_out, d_in, count, act, &ctx))) {
        float *got = fetch_f(d_out, count);
        if (act == KERNEL_ACT_SIGMOID || act == KERNEL_ACT_TANH)
            check_close(fwd[act], shape, got, out, count);
        else
            check_exact(fwd[act], shape, got, out, count);
    }
    /* The backward reads the CPU's forward output, so it is checked on its own. */
    float *d_y = dcopy(out, bytes), *d_g = dcopy(dout, bytes);
    float *d_din = in_place ? d_g : dmalloc(bytes);
    if (!in_place)
        poison(d_din, bytes);
    if (call_ok(bwd[act], shape,
                kernel_activation_backward_cuda(d_din, d_g, d_y, count, act, &ctx)))
        check_exact(bwd[act], shape, fetch_f(d_din, count), din, count);
    free_case();
}

static void test_dropout(int n, size_t per, float p, int64_t first_id, int64_t id_step,
                         uint64_t seed, uint64_t stream)
{
    char shape[96];
    snprintf(shape, sizeof shape, "n%d x %zu p=%.2f ids %lld+%lld·i", n, per, (double)p,
             (long long)first_id, (long long)id_step);
    const size_t count = (size_t)n * per, bytes = count * sizeof(float);
    int64_t *ids = hmalloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++)
        ids[i] = first_id + i * id_step;
    float *in = rand_f(count, -1, 1), *dout = rand_f(count, -1, 1);
    float *out = hmalloc(bytes), *din = hmalloc(bytes);
    uint8_t *mask = hmalloc(count), *gmask = hmalloc(count);
    kernel_dropout_forward_cpu(out, mask, in, n, per, p, seed, stream, ids);
    kernel_dropout_backward_cpu(din, dout, mask, count, p);

    int64_t *d_ids = dcopy(ids, (size_t)n * sizeof *ids);
    float *d_in = dcopy(in, bytes), *d_out = dmalloc(bytes), *d_din = dmalloc(bytes);
    float *d_dout = dcopy(dout, bytes);
    uint8_t *d_mask = dmalloc(count);
    poison(d_out, bytes);
    poison(d_mask, count);
    if (call_ok("dropout_forward", shape,
                kernel_dropout_forward_cuda(d_out, d_mask, d_in, n, per, p, seed, stream, d_ids,
                                            &ctx))) {
        check_exact("dropout_forward", shape, fetch_f(d_out, count), out, count);
        download(gmask, d_mask, count);
        check_exact_bytes("dropout_forward mask", shape, gmask, mask, count, 1);
    }
    /* Without a mask the values must not change. */
    poison(d_out, bytes);
    if (call_ok("dropout_forward", shape,
                kernel_dropout_forward_cuda(d_out, NULL, d_in, n, per, p, seed, stream, d_ids,
                                            &ctx)))
        check_exact("dropout_forward no mask", shape, fetch_f(d_out, count), out, count);
    upload(d_mask, mask, count);
    poison(d_din, bytes);
    if (call_ok("dropout_backward", shape,
                kernel_dropout_backward_cuda(d_din, d_dout, d_mask, count, p, &ctx)))
        check_exact("dropout_backward", shape, fetch_f(d_din, count), din, count);
    free_case();
}

/* variant: 0 random, 1 ties in the logits, 2 invalid labels and NaN rows, 3 dlogits in
 * place over the logits, 4 no dlogits. */
static void test_xent(int n, int classes, int variant)
{
    static const char *kinds[] = {"", " ties", " bad labels, NaN", " in place", " no dlogits"};
    char shape[64];
    snprintf(shape, sizeof shape, "n%d classes%d%s", n, classes, kinds[variant]);
    const size_t count = (size_t)n * classes, bytes = count * sizeof(float);
    float *logits = rand_f(count, -4, 4), *u = rand_f(n, 0, 1);
    int32_t *labels = hmalloc((size_t)n * sizeof *labels);
    for (int i = 0; i < n; i++)
        labels[i] = (int32_t)(u[i] * classes) % classes;
    if (variant == 1)
        for (size_t i = 0; i < count; i++)
            logits[i] = floorf(logits[i] / 3.0f);
    if (variant == 2 && n >= 4) {
        labels[0] = -1;
        labels[1] = classes;
        logits[2 * (size_t)classes] = NAN; /* x[0] NaN: argmax stays 0 */
        if (classes > 1)
            logits[3 * (size_t)classes + 1] = NAN;
    }
    const float scale = 1.0f / (float)(2 * n);
    float *dl = variant == 4 ? NULL : hmalloc(bytes);
    int correct = -1;
    const double loss = kernel_softmax_xent_cpu(dl, &correct, logits, labels, n, classes, scale);

    float *d_logits = dcopy(logits, bytes);
    int32_t *d_labels = dcopy(labels, (size_t)n * sizeof *labels);
    float *d_dl = variant == 4 ? NULL : variant == 3 ? d_logits : dmalloc(bytes);
    double *d_loss = dmalloc(sizeof(double));
    int *d_correct = dmalloc(sizeof(int));
    if (d_dl && d_dl != d_logits)
        poison(d_dl, bytes);
    poison(d_loss, sizeof(double));
    poison(d_correct, sizeof(int));
    if (!call_ok("softmax_xent", shape,
                 kernel_softmax_xent_cuda(d_dl, d_correct, d_loss, d_logits, d_labels, n,
                                          classes, scale, &ctx))) {
        free_case();
        return;
    }
    double gloss;
    int gcorrect;
    download(&gloss, d_loss, sizeof gloss);
    download(&gcorrect, d_correct, sizeof gcorrect);
    if (dl)
        check_close("softmax_xent dlogits", shape, fetch_f(d_dl, count), dl, count);
    const int both_nan = loss != loss && gloss != gloss;
    const double err = both_nan ? 0.0 : fabs(gloss - loss) / (fabs(loss) > 0 ? fabs(loss) : 1.0);
    char detail[96] = "";
    if (!(err <= REL_TOL))
        snprintf(detail, sizeof detail, "GPU %.17g, CPU %.17g", gloss, loss);
    record("softmax_xent loss", shape, err <= REL_TOL, err, 0, detail);
    check_exact_bytes("softmax_xent correct", shape, &gcorrect, &correct, 1, sizeof correct);
    free_case();
}

enum { OPTIM_SGD, OPTIM_MOMENTUM, OPTIM_ADAM, OPTIM_ADAMW };

/* Three steps on fresh gradients, from the same parameters; state compared bit for bit. */
static void test_optim(int kind, size_t count, float wd)
{
    static const char *names[] = {"sgd_update", "momentum_update", "adam_update",
                                  "adamw_update"};
    char shape[64];
    snprintf(shape, sizeof shape, "count=%zu wd=%g", count, (double)wd);
    const size_t bytes = count * sizeof(float);
    float *param = rand_f(count, -1, 1), *m = hmalloc(bytes), *v = hmalloc(bytes);
    float *d_param = dcopy(param, bytes), *d_m = dcopy(m, bytes), *d_v = dcopy(v, bytes);
    float *d_grad = dmalloc(bytes);
    int ok = 1;
    for (long step = 1; step <= 3 && ok; step++) {
        float *grad = rand_f(count, -1, 1);
        for (size_t i = 0; i < count; i += 97)
            grad[i] *= 1e-6f; /* small gradients: Adam's eps and sqrt at work */
        upload(d_grad, grad, bytes);
        int rc = -1;
        if (kind == OPTIM_SGD) {
            kernel_sgd_update_cpu(param, grad, count, 0.05f, wd);
            rc = kernel_sgd_update_cuda(d_param, d_grad, count, 0.05f, wd, &ctx);
        } else if (kind == OPTIM_MOMENTUM) {
            kernel_momentum_update_cpu(param, m, grad, count, 0.05f, 0.9f, wd);
            rc = kernel_momentum_update_cuda(d_param, d_m, d_grad, count, 0.05f, 0.9f, wd, &ctx);
        } else if (kind == OPTIM_ADAM) {
            kernel_adam_update_cpu(param, m, v, grad, count, 1e-3f, 0.9f, 0.999f, 1e-8f, wd,
                                   step);
            rc = kernel_adam_update_cuda(d_param, d_m, d_v, d_grad, count, 1e-3f, 0.9f, 0.999f,
                                         1e-8f, wd, step, &ctx);
        } else {
            kernel_adamw_update_cpu(param, m, v, grad, count, 1e-3f, 0.9f, 0.95f, 1e-8f, wd,
                                    step);
            rc = kernel_adamw_update_cuda(d_param, d_m, d_v, d_grad, count, 1e-3f, 0.9f, 0.95f,
                                          1e-8f, wd, step, &ctx);
        }
        ok = call_ok(names[kind], shape, rc);
    }
    if (ok) {
        check_exact(names[kind], shape, fetch_f(d_param, count), param, count);
        int adam = kind == OPTIM_ADAM || kind == OPTIM_ADAMW;
        if (kind != OPTIM_SGD)
            check_exact(adam ? "adam_update m" : "momentum_update buf", shape,
                        fetch_f(d_m, count), m, count);
        if (adam)
            check_exact("adam_update v", shape, fetch_f(d_v, count), v, count);
    }
    free_case();
}

static void test_init(size_t count, float bound, uint64_t seed, uint64_t stream)
{
    char shape[80];
    snprintf(shape, sizeof shape, "count=%zu seed=%llx stream=%llx", count,
             (unsigned long long)seed, (unsigned long long)stream);
    float *out = hmalloc(count * sizeof *out), *d_out = dmalloc(count * sizeof *out);
    kernel_init_uniform_cpu(out, count, bound, seed, stream);
    poison(d_out, count * sizeof *out);
    if (call_ok("init_uniform", shape,
                kernel_init_uniform_cuda(d_out, count, bound, seed, stream, &ctx)))
        check_exact("init_uniform", shape, fetch_f(d_out, count), out, count);
    free_case();
}

/* Guard floats before and after a range kernel's output: still 0xFF bytes after the call,
 * or the kernel wrote outside its row range. */
enum { GUARD = 8 };

static void check_guard(const char *kernel, const char *shape, const float *tail)
{
    unsigned char ff[GUARD * sizeof(float)];
    memset(ff, 0xFF, sizeof ff);
    const int ok = memcmp(tail, ff, sizeof ff) == 0;
    record(kernel, shape, ok, ok ? 0.0 : INFINITY, 1, ok ? "" : "wrote past the output");
}

/* Rows of elements [off, off + per) of each sample's vector. whole > 0: the samples' whole
 * vectors have `whole` elements (off + per ≤ whole) and the rows must also equal those
 * columns of the whole-vector CPU result; whole = 0: offsets past any real vector. */
static void test_dropout_range(int n, size_t whole, size_t off, size_t per, float p,
                               int64_t first_id, uint64_t seed, uint64_t stream)
{
    char shape[96];
    snprintf(shape, sizeof shape, "n%d [%zu, +%zu) of %zu p=%.2f id %lld", n, off, per, whole,
             (double)p, (long long)first_id);
    const size_t count = (size_t)n * per, bytes = count * sizeof(float);
    int64_t *ids = hmalloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++)
        ids[i] = first_id + 3 * i;
    float *in = rand_f(count, -1, 1), *out = hmalloc(bytes);
    uint8_t *mask = hmalloc(count), *gmask = hmalloc(count);
    if (whole) {
        /* The rows' inputs are columns of whole-vector inputs. */
        const size_t wc = (size_t)n * whole;
        float *win = rand_f(wc, -1, 1), *wout = hmalloc(wc * sizeof *wout);
        uint8_t *wmask = hmalloc(wc);
        for (int i = 0; i < n; i++)
            memcpy(in + (size_t)i * per, win + (size_t)i * whole + off, per * sizeof *in);
        kernel_dropout_forward_cpu(wout, wmask, win, n, whole, p, seed, stream, ids);
        for (int i = 0; i < n; i++) {
            memcpy(out + (size_t)i * per, wout + (size_t)i * whole + off, per * sizeof *out);
            memcpy(mask + (size_t)i * per, wmask + (size_t)i * whole + off, per);
        }
    }
    float *ref = hmalloc(bytes);
    uint8_t *rmask = hmalloc(count);
    kernel_dropout_forward_range_cpu(ref, rmask, in, n, per, off, p, seed, stream, ids);
    if (whole) {
        /* The CPU twin itself (the GPU is compared with it below). */
        check_exact("dropout_range cpu=columns", shape, ref, out, count);
        check_exact_bytes("dropout_range cpu=columns", shape, rmask, mask, count, 1);
    }

    int64_t *d_ids = dcopy(ids, (size_t)n * sizeof *ids);
    float *d_in = dcopy(in, bytes), *d_buf = dmalloc(bytes + 2 * GUARD * sizeof(float));
    float *d_out = d_buf + GUARD;
    uint8_t *d_mask = dmalloc(count);
    poison(d_buf, bytes + 2 * GUARD * sizeof(float));
    poison(d_mask, count);
    if (call_ok("dropout_forward_range", shape,
                kernel_dropout_forward_range_cuda(d_out, d_mask, d_in, n, per, off, p, seed,
                                                  stream, d_ids, &ctx))) {
        float *got = fetch_f(d_buf, count + 2 * GUARD);
        check_exact("dropout_forward_range", shape, got + GUARD, ref, count);
        check_guard("dropout_forward_range", shape, got);
        check_guard("dropout_forward_range", shape, got + GUARD + count);
        download(gmask, d_mask, count);
        check_exact_bytes("dropout_forward_range mask", shape, gmask, rmask, count, 1);
    }
    poison(d_out, bytes);
    if (call_ok("dropout_forward_range", shape,
                kernel_dropout_forward_range_cuda(d_out, NULL, d_in, n, per, off, p, seed,
                                                  stream, d_ids, &ctx)))
        check_exact("dropout_forward_range no mask", shape, fetch_f(d_out, count), ref, count);
    free_case();
}

/* Elements [first, first + count) of the tensor; against the CPU's range twin and, when the
 * tensor is small enough to make, the slice of the whole one. */
static void test_init_range(size_t first, size_t count, float bound, uint64_t seed,
                            uint64_t stream)
{
    char shape[80];
    snprintf(shape, sizeof shape, "[%zu, +%zu) stream=%llx", first, count,
             (unsigned long long)stream);
    float *ref = hmalloc(count * sizeof *ref);
    kernel_init_uniform_range_cpu(ref, first, count, bound, seed, stream);
    if (first + count <= ((size_t)1 << 22)) {
        float *whole = hmalloc((first + count) * sizeof *whole);
        kernel_init_uniform_cpu(whole, first + count, bound, seed, stream);
        check_exact("init_uniform_range cpu=slice", shape, ref, whole + first, count);
    }
    float *d_buf = dmalloc((count + 2 * GUARD) * sizeof *ref);
    poison(d_buf, (count + 2 * GUARD) * sizeof *ref);
    if (call_ok("init_uniform_range", shape,
                kernel_init_uniform_range_cuda(d_buf + GUARD, first, count, bound, seed, stream,
                                               &ctx))) {
        float *got = fetch_f(d_buf, count + 2 * GUARD);
        check_exact("init_uniform_range", shape, got + GUARD, ref, count);
        check_guard("init_uniform_range", shape, got);
        check_guard("init_uniform_range", shape, got + GUARD + count);
    }
    free_case();
}

/* The CPU loop of a layer split by inputs (src/cpu/stage.c's finish_worker). */
static void test_bias_add(int n, int units, size_t per)
{
    char shape[64];
    snprintf(shape, sizeof shape, "n%d units%d per%zu", n, units, per);
    const size_t count = (size_t)n * units * per, bytes = count * sizeof(float);
    float *y = rand_f(count, -4, 4), *b = rand_f((size_t)units, -1, 1);
    float *d_y = dcopy(y, bytes), *d_b = dcopy(b, (size_t)units * sizeof *b);
    for (int i = 0; i < n; i++)
        for (int u = 0; u < units; u++) {
            float *v = y + ((size_t)i * units + u) * per;
            for (size_t k = 0; k < per; k++) v[k] += b[u];
        }
    if (call_ok("bias_add", shape, kernel_bias_add_cuda(d_y, d_b, n, units, per, &ctx)))
        check_exact("bias_add", shape, fetch_f(d_y, count), y, count);
    free_case();
}

static void test_bytes_to_float(size_t count)
{
    char shape[32];
    snprintf(shape, sizeof shape, "count=%zu", count);
    uint8_t *in = hmalloc(count);
    for (size_t i = 0; i < count; i++)
        in[i] = (uint8_t)(i * 37 + i / 256);
    float *out = hmalloc(count * sizeof *out);
    kernel_bytes_to_float_cpu(out, in, count);
    uint8_t *d_in = dcopy(in, count);
    float *d_out = dmalloc(count * sizeof *out);
    poison(d_out, count * sizeof *out);
    if (call_ok("bytes_to_float", shape, kernel_bytes_to_float_cuda(d_out, d_in, count, &ctx)))
        check_exact("bytes_to_float", shape, fetch_f(d_out, count), out, count);
    free_case();
}

/* Errors are reported, not crashed on: a bad device, shapes the kernels cannot compute. */
static void test_errors(int devices)
{
    kernel_cuda_ctx bad;
    int rc = kernel_cuda_ctx_init(&bad, devices);
    record("errors", "ctx_init on a missing device", rc == -1 && bad.stream == NULL, 0, 1,
           pt_error_get());
    const kernel_conv2d_dims d = {.n = 1, .c = 1, .h = 2, .w = 2, .filters = 1, .size = 3,
                                  .stride = 1, .pad = 0};
    pt_error_clear();
    rc = kernel_conv2d_forward_cuda(NULL, NULL, NULL, NULL, NULL, &d, &ctx);
    record("errors", "conv2d kernel larger than input",
           rc == -1 && strstr(pt_error_get(), "conv2d") != NULL, 0, 1, pt_error_get());
    pt_error_clear();
    rc = kernel_maxpool2d_forward_cuda(NULL, NULL, NULL, 1, 1, 1, 1, 2, 2, &ctx);
    record("errors", "maxpool window larger than input",
           rc == -1 && strstr(pt_error_get(), "pool") != NULL, 0, 1, pt_error_get());
    pt_error_clear();
    rc = kernel_dropout_forward_range_cuda(NULL, NULL, NULL, 1, 4, ((size_t)1 << 32) - 3, 0.5f,
                                           1, 1, NULL, &ctx);
    record("errors", "dropout range past 2^32",
           rc == -1 && strstr(pt_error_get(), "dropout") != NULL, 0, 1, pt_error_get());
    pt_error_clear();
    rc = kernel_bias_add_cuda(NULL, NULL, -1, 4, 1, &ctx);
    record("errors", "bias add n < 0", rc == -1 && strstr(pt_error_get(), "bias") != NULL, 0,
           1, pt_error_get());
}

/* the backward halves and the batched weight gradient's tiles */
#include "tests/cuda/test_cuda_kernels_split.c"
#include "tests/cuda/test_cuda_kernels_transformer.c"

static void run_gpu_cases(int devices)
{
    test_errors(devices);
    /* seed-cnn's dense layers, seed-mlp's first, odd and degenerate sizes. */
    test_dense(64, 256, 1000, 1);
    test_dense(64, 1000, 100, 1);
    test_dense(64, 100, 10, 1);
    test_dense(33, 784, 256, 1);
    test_dense(7, 13, 5, 0);
    test_dense(1, 1, 1, 1);
    /* seed-cnn's convolutions, then odd sizes, stride 2, padding. */
    test_conv((kernel_conv2d_dims){16, 1, 28, 28, 32, 3, 1, 0, 0}, 1);
    test_conv((kernel_conv2d_dims){16, 32, 13, 13, 128, 3, 1, 0, 0}, 1);
    test_conv((kernel_conv2d_dims){16, 128, 5, 5, 256, 3, 1, 0, 0}, 1);
    test_conv((kernel_conv2d_dims){3, 3, 11, 9, 5, 3, 2, 1, 0}, 1);
    test_conv((kernel_conv2d_dims){2, 4, 7, 7, 6, 5, 1, 2, 0}, 0);
    test_conv((kernel_conv2d_dims){5, 2, 10, 10, 3, 1, 1, 0, 0}, 1);
    test_conv((kernel_conv2d_dims){2, 3, 9, 8, 4, 3, 2, 0, 0}, 1);
    test_conv((kernel_conv2d_dims){1, 2, 6, 5, 3, 4, 3, 1, 0}, 1);
    /* seed-cnn's pools (26, 11 odd, 3), overlapping windows, stride > size. */
    test_pool(16, 32, 26, 26, 2, 2, 0);
    test_pool(16, 128, 11, 11, 2, 2, 0);
    test_pool(16, 256, 3, 3, 2, 2, 0);
    test_pool(3, 5, 9, 7, 3, 2, 0);
    test_pool(2, 3, 8, 8, 3, 1, 0);
    test_pool(2, 2, 5, 6, 2, 3, 0);
    test_pool(4, 6, 11, 11, 2, 2, 1);
    test_pool(3, 5, 9, 7, 3, 2, 1);
    test_pool(4, 6, 11, 11, 2, 2, 2);
    test_pool(2, 3, 8, 8, 3, 1, 2);
    for (int act = KERNEL_ACT_LINEAR; act <= KERNEL_ACT_TANH; act++) {
        test_activation((kernel_act)act, 1, 0);
        test_activation((kernel_act)act, 1000, 0);
        test_activation((kernel_act)act, 100003, 0);
        test_activation((kernel_act)act, 4099, 1);
    }
    /* seed-cnn's dropout (256 per sample, p 0.5), odd sizes, large and > 2^32 sample ids. */
    test_dropout(16, 256, 0.5f, 0, 1, 2024, rng_stream_dropout(6, 1));
    test_dropout(16, 256, 0.5f, 59984, 1, 2024, rng_stream_dropout(6, 937));
    test_dropout(5, 13, 0.3f, 7, 1001, 1, rng_stream_dropout(2, 5));
    test_dropout(3, 1001, 0.9f, 3000000000LL, 1, 0xdeadbeefULL, 17);
    test_dropout(3, 6, 0.25f, (1LL << 33) + 5, 1, 5, 9);
    test_dropout(4, 7, 0.0f, 0, 1, 1, 1);
    test_xent(64, 10, 0);
    test_xent(7, 3, 0);
    test_xent(5, 1000, 0);
    test_xent(33, 37, 0);
    test_xent(600, 10, 0);
    test_xent(64, 10, 1);
    test_xent(8, 10, 2);
    test_xent(64, 10, 3);
    test_xent(64, 10, 4);
    const size_t counts[] = {1, 1000, 100003};
    for (int i = 0; i < 3; i++) {
        test_optim(OPTIM_SGD, counts[i], 0.0f);
        test_optim(OPTIM_SGD, counts[i], 1e-4f);
        test_optim(OPTIM_MOMENTUM, counts[i], 0.0f);
        test_optim(OPTIM_MOMENTUM, counts[i], 5e-4f);
        test_optim(OPTIM_ADAM, counts[i], 0.0f);
        test_optim(OPTIM_ADAM, counts[i], 1e-2f);
        test_optim(OPTIM_ADAMW, counts[i], 0.0f);
        test_optim(OPTIM_ADAMW, counts[i], 0.1f);
    }
    test_init(1, 0.5f, 2024, rng_stream_init(0, 0));
    test_init(5, 0.1f, 2024, rng_stream_init(0, 1));
    test_init(1000, 0.0625f, 7, rng_stream_init(3, 0));
    test_init(256000, 0.0625f, 0xfedcba9876543210ULL, rng_stream_init(9, 0));
    test_init(100003, 1.0f, ~0ULL, ~0ULL);
    /* Shards: offsets and lengths off the 4-lane blocks, shorter than a block, inside one
     * block, across the 64-element CPU chunks, to the 2^32 limit; ids past 2^32; p = 0. */
    test_dropout_range(4, 1001, 0, 1001, 0.5f, 0, 2024, rng_stream_dropout(6, 1));
    test_dropout_range(4, 1001, 0, 3, 0.5f, 11, 2024, rng_stream_dropout(6, 2));
    test_dropout_range(4, 1001, 1, 2, 0.3f, 11, 2024, rng_stream_dropout(6, 2));
    test_dropout_range(5, 1001, 3, 1, 0.3f, 7, 1, 5);
    test_dropout_range(5, 1001, 5, 13, 0.3f, 7, 1, 5);
    test_dropout_range(3, 1001, 63, 66, 0.5f, 3000000000LL, 0xdeadbeefULL, 17);
    test_dropout_range(16, 256, 128, 128, 0.5f, 59984, 2024, rng_stream_dropout(6, 937));
    test_dropout_range(3, 1001, 250, 501, 0.9f, (1LL << 33) + 5, 5, 9);
    test_dropout_range(3, 1001, 998, 3, 0.25f, 0, 5, 9);
    test_dropout_range(6, 1001, 2, 999, 0.5f, 100, 5, 9);
    test_dropout_range(4, 7, 2, 5, 0.0f, 0, 1, 1);
    test_dropout_range(2, 0, ((size_t)1 << 32) - 7, 7, 0.5f, 42, 3, 4);
    test_init_range(0, 1000, 0.0625f, 7, rng_stream_init(3, 0));
    test_init_range(1, 1, 0.5f, 2024, rng_stream_init(0, 0));
    test_init_range(3, 2, 0.5f, 2024, rng_stream_init(0, 1));
    test_init_range(5, 13, 0.1f, 2024, rng_stream_init(0, 1));
    test_init_range(63, 66, 1.0f, ~0ULL, ~0ULL);
    test_init_range(1001, 99999, 0.0625f, 0xfedcba9876543210ULL, rng_stream_init(9, 0));
    test_init_range(((size_t)1 << 40) + 3, 17, 0.25f, 1, 2);
    /* dense (per 1) and conv (per 7·7) outputs */
    test_bias_add(64, 1000, 1);
    test_bias_add(7, 13, 1);
    test_bias_add(16, 32, 49);
    test_bias_add(3, 5, 49);
    test_bias_add(1, 1, 1);
    test_bias_add(0, 4, 49);
    test_bytes_to_float(784 * 16 + 3);
    run_split_cases();
    run_transformer_cases();
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* --bench: the transformer kernels' times at GPT-2 shapes instead of the checks;
     * --transformer: their checks only (short enough for compute-sanitizer's racecheck) */
    const int bench = argc > 1 && strcmp(argv[1], "--bench") == 0;
    const int transformer = argc > 1 && strcmp(argv[1], "--transformer") == 0;
    if (argc > 1 && !bench && !transformer) {
        fprintf(stderr, "usage: test_cuda_kernels [--bench | --transformer]\n");
        return 2;
    }
    test_rng_host();

    /* Without a driver cudaGetDeviceCount fails and leaves the count unwritten. */
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
        kernel_cuda_ctx c;
        const int rc = kernel_cuda_ctx_init(&c, 0);
        record("ctx_init", "without a device", rc == -1 &&
               strncmp(pt_error_get(), "no CUDA device", 14) == 0, 0, 1, pt_error_get());
        printf("%d passed, %d failed\n", passed, failed);
        if (failed)
            return 1;
        printf("SKIP: no usable CUDA device (cudaGetDeviceCount: %s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return 77;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("device 0: %s, compute capability %d.%d, %d multiprocessors\n", prop.name,
               prop.major, prop.minor, prop.multiProcessorCount);
    if (kernel_cuda_ctx_init(&ctx, 0) != 0)
        fatal(pt_error_get());
    if (bench) {
        run_transformer_bench();
        finish_and_exit(0);
    }
    if (transformer) {
        run_transformer_cases();
        print_summary();
        finish_and_exit(failed ? 1 : 0);
    }
    run_gpu_cases(devices);
    print_summary();
    finish_and_exit(failed ? 1 : 0);
}
