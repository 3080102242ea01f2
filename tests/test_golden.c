/* The CPU kernels against PyTorch 1.13: forward values, autograd gradients and optimizer
 * steps recorded by experiments/golden/make_golden.py in tests/golden/ (*.bin).
 * A missing, truncated or corrupted golden file fails the test (never skips it). */
#include "kernels/kernels.h"
#include "tests/check.h"
#include "tests/golden_reader.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- the reader rejects what it must ---- */

static void write_file(const char *path, const unsigned char *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "cannot write %s", path);
    cr_assert(fwrite(p, 1, n, f) == n);
    fclose(f);
}

Test(golden, reader_rejects_damaged_files)
{
    golden_file g;
    golden_open(&g, "dense.bin");
    char dir[] = "/tmp/pt_golden_XXXXXX";
    cr_assert(mkdtemp(dir) != NULL);
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/x.bin", dir);
    unsigned char *copy = malloc(g.size);

    /* Intact copy loads. */
    write_file(path, g.buf, g.size);
    golden_file h;
    cr_assert(golden_load(&h, path, err, sizeof err) == 0, "%s", err);
    golden_free(&h);
    /* One flipped bit in the data, a truncation, a wrong magic, a wrong version. */
    const size_t cuts[] = {g.size / 2, g.size - 1, 0, 4};
    for (int k = 0; k < 4; k++) {
        memcpy(copy, g.buf, g.size);
        size_t n = g.size;
        if (k == 0)
            copy[g.size / 2] ^= 0x10;
        else if (k == 1)
            n = cuts[k];
        else if (k == 2)
            copy[0] = 'X';
        else
            copy[4] = 2;
        write_file(path, copy, n);
        cr_expect(golden_load(&h, path, err, sizeof err) == -1, "damage %d accepted", k);
    }
    /* Missing file. */
    snprintf(path, sizeof path, "%s/absent.bin", dir);
    cr_expect(golden_load(&h, path, err, sizeof err) == -1);
    snprintf(path, sizeof path, "%s/x.bin", dir);
    unlink(path);
    rmdir(dir);
    free(copy);
    golden_free(&g);
}

/* ---- kernels against torch ---- */

Test(golden, dense)
{
    golden_file g;
    golden_open(&g, "dense.bin");
    int32_t *dims = golden_ints(&g, "dims", 3);
    const int n = dims[0], in_f = dims[1], out_f = dims[2];
    float *in = golden_floats(&g, "in", (size_t)n * in_f);
    float *w = golden_floats(&g, "w", (size_t)out_f * in_f);
    float *b = golden_floats(&g, "b", out_f);
    float *out_ref = golden_floats(&g, "out", (size_t)n * out_f);
    float *dout = golden_floats(&g, "dout", (size_t)n * out_f);
    float *din_ref = golden_floats(&g, "din", (size_t)n * in_f);
    float *dw_ref = golden_floats(&g, "dw", (size_t)out_f * in_f);
    float *db_ref = golden_floats(&g, "db", out_f);
    float *out = malloc((size_t)n * out_f * sizeof *out);
    float *din = malloc((size_t)n * in_f * sizeof *din);
    float *dw = calloc((size_t)out_f * in_f, sizeof *dw);
    float *db = calloc(out_f, sizeof *db);

    kernel_dense_forward_cpu(out, in, w, b, n, in_f, out_f);
    CHECK_CLOSE("dense out", out, out_ref, (size_t)n * out_f, 1e-6, 1e-5);
    kernel_dense_backward_cpu(din, dw, db, dout, in, w, n, in_f, out_f);
    CHECK_CLOSE("dense din", din, din_ref, (size_t)n * in_f, 1e-6, 1e-5);
    CHECK_CLOSE("dense dw", dw, dw_ref, (size_t)out_f * in_f, 1e-6, 1e-5);
    CHECK_CLOSE("dense db", db, db_ref, out_f, 1e-6, 1e-5);

    free(dims); free(in); free(w); free(b); free(out_ref); free(dout); free(din_ref);
    free(dw_ref); free(db_ref); free(out); free(din); free(dw); free(db);
    golden_free(&g);
}

Test(golden, conv2d)
{
    golden_file g;
    golden_open(&g, "conv.bin");
    const char *cases[] = {"a", "b", "c"};
    for (int k = 0; k < 3; k++) {
        char key[32];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", cases[k], suffix), key)
        int32_t *dm = golden_ints(&g, KEY("dims"), 8);
        kernel_conv2d_dims d = {.n = dm[0], .c = dm[1], .h = dm[2], .w = dm[3],
                                .filters = dm[4], .size = dm[5], .stride = dm[6], .pad = dm[7]};
        const size_t nin = (size_t)d.n * d.c * d.h * d.w;
        const size_t nw = (size_t)d.filters * d.c * d.size * d.size;
        const size_t nout = (size_t)d.n * d.filters * kernel_conv2d_out_h(&d) *
                            kernel_conv2d_out_w(&d);
        float *in = golden_floats(&g, KEY("in"), nin);
        float *w = golden_floats(&g, KEY("w"), nw);
        float *b = golden_floats(&g, KEY("b"), d.filters);
        float *out_ref = golden_floats(&g, KEY("out"), nout);
        float *dout = golden_floats(&g, KEY("dout"), nout);
        float *din_ref = golden_floats(&g, KEY("din"), nin);
        float *dw_ref = golden_floats(&g, KEY("dw"), nw);
        float *db_ref = golden_floats(&g, KEY("db"), d.filters);
#undef KEY
        float *work = malloc(kernel_conv2d_workspace_floats(&d) * sizeof *work);
        float *out = malloc(nout * sizeof *out);
        float *din = malloc(nin * sizeof *din);
        float *dw = calloc(nw, sizeof *dw);
        float *db = calloc(d.filters, sizeof *db);

        kernel_conv2d_forward_cpu(out, work, in, w, b, &d);
        CHECK_CLOSE(cases[k], out, out_ref, nout, 1e-5, 1e-5);
        kernel_conv2d_backward_cpu(din, dw, db, work, dout, in, w, &d);
        CHECK_CLOSE(cases[k], din, din_ref, nin, 1e-5, 1e-5);
        CHECK_CLOSE(cases[k], dw, dw_ref, nw, 1e-5, 1e-5);
        CHECK_CLOSE(cases[k], db, db_ref, d.filters, 1e-5, 1e-5);

        free(dm); free(in); free(w); free(b); free(out_ref); free(dout); free(din_ref);
        free(dw_ref); free(db_ref); free(work); free(out); free(din); free(dw); free(db);
    }
    golden_free(&g);
}

Test(golden, pooling)
{
    golden_file g;
    golden_open(&g, "pool.bin");
    const char *cases[] = {"max2", "max3", "avg2", "avg3"};
    for (int k = 0; k < 4; k++) {
        char key[32];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", cases[k], suffix), key)
        const int is_max = cases[k][0] == 'm';
        int32_t *dm = golden_ints(&g, KEY("dims"), 6);
        const int n = dm[0], c = dm[1], h = dm[2], w = dm[3], size = dm[4], stride = dm[5];
        const size_t nin = (size_t)n * c * h * w;
        const size_t nout = (size_t)n * c * ((h - size) / stride + 1) * ((w - size) / stride + 1);
        float *in = golden_floats(&g, KEY("in"), nin);
        float *out_ref = golden_floats(&g, KEY("out"), nout);
        float *dout = golden_floats(&g, KEY("dout"), nout);
        float *din_ref = golden_floats(&g, KEY("din"), nin);
        float *out = malloc(nout * sizeof *out);
        float *din = malloc(nin * sizeof *din);
        if (is_max) {
            int32_t *idx_ref = golden_ints(&g, KEY("argmax"), nout);
            int32_t *idx = malloc(nout * sizeof *idx);
            kernel_maxpool2d_forward_cpu(out, idx, in, n, c, h, w, size, stride);
            for (size_t i = 0; i < nout; i++)
                cr_assert(idx[i] == idx_ref[i], "%s argmax[%zu] = %d, torch %d", cases[k], i,
                          idx[i], idx_ref[i]);
            kernel_maxpool2d_backward_cpu(din, dout, idx, n, c, h, w, size, stride);
            free(idx_ref);
            free(idx);
        } else {
            kernel_avgpool2d_forward_cpu(out, in, n, c, h, w, size, stride);
            kernel_avgpool2d_backward_cpu(din, dout, n, c, h, w, size, stride);
        }
#undef KEY
        CHECK_CLOSE(cases[k], out, out_ref, nout, 1e-6, 1e-5);
        CHECK_CLOSE(cases[k], din, din_ref, nin, 1e-6, 1e-5);
        free(dm); free(in); free(out_ref); free(dout); free(din_ref); free(out); free(din);
    }
    golden_free(&g);
}

Test(golden, activations)
{
    golden_file g;
    golden_open(&g, "act.bin");
    const size_t n = golden_count(&g, "x");
    float *x = golden_floats(&g, "x", n);
    float *dout = golden_floats(&g, "dout", n);
    float *y = malloc(n * sizeof *y), *din = malloc(n * sizeof *din);
    const char *names[] = {"relu", "sigmoid", "tanh"};
    const kernel_act acts[] = {KERNEL_ACT_RELU, KERNEL_ACT_SIGMOID, KERNEL_ACT_TANH};
    for (int k = 0; k < 3; k++) {
        char key[32];
        snprintf(key, sizeof key, "%s.out", names[k]);
        float *y_ref = golden_floats(&g, key, n);
        snprintf(key, sizeof key, "%s.din", names[k]);
        float *din_ref = golden_floats(&g, key, n);
        kernel_activation_forward_cpu(y, x, n, acts[k]);
        /* atol covers sigmoid(−90): torch rounds 1/(1 + e^90) to 0 (e^90 overflows float),
         * this kernel returns the subnormal 8e−40. */
        CHECK_CLOSE(names[k], y, y_ref, n, 1e-30, 1e-5);
        /* The backward is fed torch's output: near saturation 1 − y² amplifies a 1-ulp
         * difference in y a thousandfold, which would test the forward again, not this. */
        kernel_activation_backward_cpu(din, dout, y_ref, n, acts[k]);
        CHECK_CLOSE(names[k], din, din_ref, n, 1e-30, 1e-5);
        free(y_ref);
        free(din_ref);
    }
    free(x); free(dout); free(y); free(din);
    golden_free(&g);
}

Test(golden, softmax_cross_entropy)
{
    golden_file g;
    golden_open(&g, "xent.bin");
    int32_t *dm = golden_ints(&g, "dims", 3);
    const int n = dm[0], classes = dm[1], whole = dm[2];
    float *logits = golden_floats(&g, "logits", (size_t)n * classes);
    int32_t *labels = golden_ints(&g, "labels", n);
    float *loss_ref = golden_floats(&g, "loss", 1);
    float *loss64 = golden_floats(&g, "loss64_hi_lo", 2);
    float *dl_ref = golden_floats(&g, "dlogits", (size_t)n * classes);
    int32_t *correct_ref = golden_ints(&g, "correct", 1);
    float *dl = malloc((size_t)n * classes * sizeof *dl);
    int correct = -1;

    double loss = kernel_softmax_xent_cpu(dl, &correct, logits, labels, n, classes,
                                          1.0f / (float)whole);
    const double ref64 = (double)loss64[0] + (double)loss64[1];
    cr_expect(fabs(loss - ref64) <= 1e-6 * fabs(ref64), "loss %.12g, torch (double) %.12g",
              loss, ref64);
    cr_expect(fabs(loss - loss_ref[0]) <= 1e-5 * fabs(loss_ref[0]), "loss %.9g, torch %.9g",
              loss, (double)loss_ref[0]);
    cr_expect(correct == correct_ref[0], "correct %d, torch %d", correct, correct_ref[0]);
    CHECK_CLOSE("dlogits", dl, dl_ref, (size_t)n * classes, 1e-9, 1e-5);

    free(dm); free(logits); free(labels); free(loss_ref); free(loss64); free(dl_ref);
    free(correct_ref); free(dl);
    golden_free(&g);
}

/* Five steps from the same start with the recorded gradients; parameters after every step
 * and the final optimizer state must agree with torch to about an ulp. */
static void golden_check_optimizer(const char *name, int is_adam)
{
    golden_file g;
    golden_open(&g, "optim.bin");
    const size_t count = golden_count(&g, "p0");
    const int steps = 5;
    char key[64];
    float *p = golden_floats(&g, "p0", count);
    float *grads = golden_floats(&g, "grads", steps * count);
    snprintf(key, sizeof key, "%s.hyper", name);
    float *hp = golden_floats(&g, key, is_adam ? 5 : 3);
    snprintf(key, sizeof key, "%s.params", name);
    float *ref = golden_floats(&g, key, steps * count);
    float *s1 = calloc(count, sizeof *s1), *s2 = calloc(count, sizeof *s2);
    for (int t = 0; t < steps; t++) {
        const float *gt = grads + (size_t)t * count;
        if (is_adam)
            kernel_adam_update_cpu(p, s1, s2, gt, count, hp[0], hp[1], hp[2], hp[3], hp[4],
                                   t + 1);
        else if (hp[1] != 0.0f)
            kernel_momentum_update_cpu(p, s1, gt, count, hp[0], hp[1], hp[2]);
        else
            kernel_sgd_update_cpu(p, gt, count, hp[0], hp[2]);
        char what[64];
        snprintf(what, sizeof what, "%s step %d", name, t + 1);
        CHECK_CLOSE(what, p, ref + (size_t)t * count, count, 1e-12, 1e-6);
    }
    if (is_adam) {
        snprintf(key, sizeof key, "%s.m", name);
        float *m_ref = golden_floats(&g, key, count);
        snprintf(key, sizeof key, "%s.v", name);
        float *v_ref = golden_floats(&g, key, count);
        CHECK_CLOSE("adam m", s1, m_ref, count, 1e-30, 1e-6);
        CHECK_CLOSE("adam v", s2, v_ref, count, 1e-30, 1e-6);
        free(m_ref);
        free(v_ref);
    } else if (hp[1] != 0.0f) {
        snprintf(key, sizeof key, "%s.buf", name);
        float *b_ref = golden_floats(&g, key, count);
        CHECK_CLOSE("momentum buffer", s1, b_ref, count, 1e-30, 1e-6);
        free(b_ref);
    }
    free(p); free(grads); free(hp); free(ref); free(s1); free(s2);
    golden_free(&g);
}

Test(golden, sgd) { golden_check_optimizer("sgd", 0); }
Test(golden, sgd_weight_decay) { golden_check_optimizer("sgd_wd", 0); }
Test(golden, sgd_momentum_weight_decay) { golden_check_optimizer("momentum", 0); }
Test(golden, adam) { golden_check_optimizer("adam", 1); }
Test(golden, adam_weight_decay) { golden_check_optimizer("adam_wd", 1); }
