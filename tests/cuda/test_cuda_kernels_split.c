/* The backward halves of the dense and conv kernels (zero-bubble schedules run them
 * apart) and the dense weight gradient of a tile of output units (batched weight
 * gradients), against their CPU twins; and the halves against the fused CUDA call, bit
 * for bit, since the fused call is made of them.
 *
 * Part of test_cuda_kernels (#included by test_cuda_kernels.c, whose helpers it uses: the
 * test's target lists its sources in cmake/cuda.cmake). */

static void test_dense_halves(int n, int in_f, int out_f)
{
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d %d->%d", n, in_f, out_f);
    const size_t ni = (size_t)n * in_f, no = (size_t)n * out_f, nw = (size_t)out_f * in_f;
    const size_t fs = sizeof(float);
    float *in = rand_f(ni, -1, 1), *w = rand_f(nw, -0.5f, 0.5f), *dout = rand_f(no, -1, 1);
    float *dw = rand_f(nw, -1, 1), *db = rand_f(out_f, -1, 1), *din = hmalloc(ni * fs);
    float *d_in = dcopy(in, ni * fs), *d_w = dcopy(w, nw * fs), *d_dout = dcopy(dout, no * fs);
    float *d_dw = dcopy(dw, nw * fs), *d_db = dcopy(db, out_f * fs), *d_din = dmalloc(ni * fs);
    float *d_dw2 = dcopy(dw, nw * fs), *d_db2 = dcopy(db, out_f * fs);
    float *d_din2 = dmalloc(ni * fs);

    /* the weight half twice: dw and db accumulate */
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        kernel_dense_backward_weight_cpu(dw, db, dout, in, n, in_f, out_f);
        ok = ok && call_ok("dense_backward_weight", shape,
                           kernel_dense_backward_weight_cuda(d_dw, d_db, d_dout, d_in, n, in_f,
                                                             out_f, &ctx));
    }
    if (ok) {
        check_close("dense_backward_weight dw", shape, fetch_f(d_dw, nw), dw, nw);
        check_close("dense_backward_weight db", shape, fetch_f(d_db, out_f), db, out_f);
    }
    kernel_dense_backward_input_cpu(din, dout, w, n, in_f, out_f);
    poison(d_din, ni * fs);
    if (call_ok("dense_backward_input", shape,
                kernel_dense_backward_input_cuda(d_din, d_dout, d_w, n, in_f, out_f, &ctx)))
        check_close("dense_backward_input", shape, fetch_f(d_din, ni), din, ni);
    /* halves = fused: the fused call twice on the same start as the weight half's */
    poison(d_din2, ni * fs);
    ok = 1;
    for (int k = 0; k < 2; k++)
        ok = ok && call_ok("dense halves = fused", shape,
                           kernel_dense_backward_cuda(d_din2, d_dw2, d_db2, d_dout, d_in, d_w, n,
                                                      in_f, out_f, &ctx));
    if (ok) {
        check_exact("dense halves = fused", shape, fetch_f(d_dw, nw), fetch_f(d_dw2, nw), nw);
        check_exact("dense halves = fused", shape, fetch_f(d_db, out_f), fetch_f(d_db2, out_f),
                    out_f);
        check_exact("dense halves = fused", shape, fetch_f(d_din, ni), fetch_f(d_din2, ni), ni);
    }
    free_case();
}

/* Tiles of `tile` units over the whole layer, written over poison; then one middle tile
 * written over other values, which must stay outside it. */
static void test_dense_units(int n, int in_f, int out_f, int tile)
{
    char shape[80];
    snprintf(shape, sizeof shape, "n=%d %d->%d tiles of %d", n, in_f, out_f, tile);
    const size_t ni = (size_t)n * in_f, no = (size_t)n * out_f, nw = (size_t)out_f * in_f;
    const size_t fs = sizeof(float);
    float *in = rand_f(ni, -1, 1), *dout = rand_f(no, -1, 1);
    float *dw = hmalloc(nw * fs), *db = hmalloc(out_f * fs);
    float *d_in = n ? dcopy(in, ni * fs) : dmalloc(fs);
    float *d_dout = n ? dcopy(dout, no * fs) : dmalloc(fs);
    float *d_dw = dmalloc(nw * fs), *d_db = dmalloc(out_f * fs);
    poison(d_dw, nw * fs);
    poison(d_db, out_f * fs);
    int ok = 1;
    for (int a = 0; a < out_f; a += tile) {
        int u = out_f - a < tile ? out_f - a : tile;
        kernel_dense_weight_grad_units_cpu(dw, db, dout, in, n, in_f, out_f, a, u);
        ok = ok && call_ok("dense_weight_grad_units", shape,
                           kernel_dense_weight_grad_units_cuda(d_dw, d_db, d_dout, d_in, n, in_f,
                                                               out_f, a, u, &ctx));
    }
    if (ok) {
        check_close("dense_weight_grad_units dw", shape, fetch_f(d_dw, nw), dw, nw);
        check_close("dense_weight_grad_units db", shape, fetch_f(d_db, out_f), db, out_f);
    }
    if (out_f >= 3) {
        float *other = rand_f(nw, -1, 1), *other_b = rand_f(out_f, -1, 1);
        upload(d_dw, other, nw * fs);
        upload(d_db, other_b, out_f * fs);
        int a = out_f / 3, u = out_f / 3;
        kernel_dense_weight_grad_units_cpu(other, other_b, dout, in, n, in_f, out_f, a, u);
        if (call_ok("dense_weight_grad_units", shape,
                    kernel_dense_weight_grad_units_cuda(d_dw, d_db, d_dout, d_in, n, in_f, out_f,
                                                        a, u, &ctx))) {
            float *g = fetch_f(d_dw, nw), *gb = fetch_f(d_db, out_f);
            const size_t lo = (size_t)a * in_f, hi = (size_t)(a + u) * in_f;
            check_exact("dense_weight_grad_units rest", shape, g, other, lo);
            check_exact("dense_weight_grad_units rest", shape, g + hi, other + hi, nw - hi);
            check_close("dense_weight_grad_units dw", shape, g + lo, other + lo, hi - lo);
            check_exact("dense_weight_grad_units rest", shape, gb, other_b, (size_t)a);
            check_close("dense_weight_grad_units db", shape, gb + a, other_b + a, (size_t)u);
        }
    }
    free_case();
}

static void test_conv_halves(kernel_conv2d_dims d)
{
    char shape[80];
    snprintf(shape, sizeof shape, "n%d c%d %dx%d f%d k%d s%d p%d", d.n, d.c, d.h, d.w,
             d.filters, d.size, d.stride, d.pad);
    const size_t fs = sizeof(float);
    const size_t oh = kernel_conv2d_out_h(&d), ow = kernel_conv2d_out_w(&d);
    const size_t ni = (size_t)d.n * d.c * d.h * d.w, no = (size_t)d.n * d.filters * oh * ow;
    const size_t nw = (size_t)d.filters * d.c * d.size * d.size, nb = d.filters;
    const size_t ws = kernel_conv2d_workspace_floats_cuda(&d);
    float *in = rand_f(ni, -1, 1), *w = rand_f(nw, -0.5f, 0.5f), *dout = rand_f(no, -1, 1);
    float *dw = rand_f(nw, -1, 1), *db = rand_f(nb, -1, 1), *din = hmalloc(ni * fs);
    float *work = hmalloc(kernel_conv2d_workspace_floats(&d) * fs);
    float *d_in = dcopy(in, ni * fs), *d_w = dcopy(w, nw * fs), *d_dout = dcopy(dout, no * fs);
    float *d_dw = dcopy(dw, nw * fs), *d_db = dcopy(db, nb * fs), *d_din = dmalloc(ni * fs);
    float *d_dw2 = dcopy(dw, nw * fs), *d_db2 = dcopy(db, nb * fs), *d_din2 = dmalloc(ni * fs);
    float *d_work = dmalloc(ws * fs);

    int ok = 1;
    for (int k = 0; k < 2; k++) {
        kernel_conv2d_backward_weight_cpu(dw, db, work, dout, in, &d);
        poison(d_work, ws * fs);
        ok = ok && call_ok("conv2d_backward_weight", shape,
                           kernel_conv2d_backward_weight_cuda(d_dw, d_db, d_work, d_dout, d_in,
                                                              &d, &ctx));
    }
    if (ok) {
        check_close("conv2d_backward_weight dw", shape, fetch_f(d_dw, nw), dw, nw);
        check_close("conv2d_backward_weight db", shape, fetch_f(d_db, nb), db, nb);
    }
    kernel_conv2d_backward_input_cpu(din, work, dout, w, &d);
    poison(d_din, ni * fs);
    poison(d_work, ws * fs);
    if (call_ok("conv2d_backward_input", shape,
                kernel_conv2d_backward_input_cuda(d_din, d_work, d_dout, d_w, &d, &ctx)))
        check_close("conv2d_backward_input", shape, fetch_f(d_din, ni), din, ni);
    poison(d_din2, ni * fs);
    ok = 1;
    for (int k = 0; k < 2; k++) {
        poison(d_work, ws * fs);
        ok = ok && call_ok("conv2d halves = fused", shape,
                           kernel_conv2d_backward_cuda(d_din2, d_dw2, d_db2, d_work, d_dout, d_in,
                                                       d_w, &d, &ctx));
    }
    if (ok) {
        check_exact("conv2d halves = fused", shape, fetch_f(d_dw, nw), fetch_f(d_dw2, nw), nw);
        check_exact("conv2d halves = fused", shape, fetch_f(d_db, nb), fetch_f(d_db2, nb), nb);
        check_exact("conv2d halves = fused", shape, fetch_f(d_din, ni), fetch_f(d_din2, ni), ni);
    }
    free_case();
}

static void run_split_cases(void)
{
    test_dense_halves(64, 256, 1000);
    test_dense_halves(33, 784, 256);
    test_dense_halves(7, 13, 5);
    test_dense_halves(1, 1, 1);
    test_dense_units(64, 256, 1000, 512); /* stage.c's tile: 512 + 488 */
    test_dense_units(33, 100, 1100, 512);
    test_dense_units(7, 13, 5, 2);
    test_dense_units(0, 4, 6, 4);         /* no rows: zeros */
    test_conv_halves((kernel_conv2d_dims){16, 32, 13, 13, 128, 3, 1, 0, 0});
    test_conv_halves((kernel_conv2d_dims){3, 3, 11, 9, 5, 3, 2, 1, 0});
    test_conv_halves((kernel_conv2d_dims){2, 4, 7, 7, 6, 5, 1, 2, 0});
}
