/* The transformer kernels (kernels/cuda/transformer.cu) and the many-block loss on a GPU,
 * against their CPU twins: layer norm, GELU, attention and the loss to float rounding
 * (normwise, REL_TOL), the embedding bit for bit (the same additions in the same order),
 * each run twice where a result must repeat bit for bit (no atomics), the attention
 * dropout's masks bit for bit (written without a GPU: not yet run on one). Shapes with
 * sequences and widths that are multiples of nothing, and of more than one tile. First run on
 * an H200 on 2026-11-26; their per-thread code is also checked on the host by
 * tests/cuda/test_transformer_host.cu, tile by tile.
 *
 * Part of test_cuda_kernels (#included by test_cuda_kernels.c, whose helpers it uses). */

static void test_layernorm_cuda(int rows, int width)
{
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d width=%d", rows, width);
    const size_t n = (size_t)rows * width, fs = sizeof(float);
    float *x = rand_f(n, -2, 3), *g = rand_f(width, 0.5f, 1.5f), *b = rand_f(width, -1, 1);
    float *dy = rand_f(n, -1, 1), *dg = rand_f(width, -1, 1), *db = rand_f(width, -1, 1);
    float *out = hmalloc(n * fs), *mean = hmalloc(rows * fs), *rstd = hmalloc(rows * fs);
    float *dx = hmalloc(n * fs);
    float *d_x = dcopy(x, n * fs), *d_g = dcopy(g, width * fs), *d_b = dcopy(b, width * fs);
    float *d_dy = dcopy(dy, n * fs), *d_dg = dcopy(dg, width * fs), *d_db = dcopy(db, width * fs);
    float *d_out = dmalloc(n * fs), *d_mean = dmalloc(rows * fs), *d_rstd = dmalloc(rows * fs);
    float *d_dx = dmalloc(n * fs);
    kernel_layernorm_forward_cpu(out, mean, rstd, x, g, b, rows, width);
    poison(d_out, n * fs);
    if (call_ok("layernorm_forward", shape,
                kernel_layernorm_forward_cuda(d_out, d_mean, d_rstd, d_x, d_g, d_b, rows, width,
                                              &ctx))) {
        check_close("layernorm_forward", shape, fetch_f(d_out, n), out, n);
        check_close("layernorm_forward rstd", shape, fetch_f(d_rstd, rows), rstd, rows);
    }
    int ok = 1;
    for (int k = 0; k < 2; k++) { /* the parameter gradients accumulate */
        kernel_layernorm_backward_cpu(dx, dg, db, dy, x, mean, rstd, g, rows, width);
        ok = ok && call_ok("layernorm_backward", shape,
                           kernel_layernorm_backward_cuda(d_dx, d_dg, d_db, d_dy, d_x, d_mean,
                                                          d_rstd, d_g, rows, width, &ctx));
    }
    if (ok) {
        check_close("layernorm_backward dx", shape, fetch_f(d_dx, n), dx, n);
        check_close("layernorm_backward dgamma", shape, fetch_f(d_dg, width), dg, width);
        check_close("layernorm_backward dbeta", shape, fetch_f(d_db, width), db, width);
    }
    free_case();
}

static void test_gelu_cuda(size_t count)
{
    char shape[64];
    snprintf(shape, sizeof shape, "count=%zu", count);
    const size_t fs = sizeof(float);
    float *x = rand_f(count, -6, 6), *dy = rand_f(count, -1, 1);
    float *out = hmalloc(count * fs), *din = hmalloc(count * fs);
    float *d_x = dcopy(x, count * fs), *d_dy = dcopy(dy, count * fs);
    float *d_out = dmalloc(count * fs), *d_din = dmalloc(count * fs);
    kernel_gelu_forward_cpu(out, x, count);
    kernel_gelu_backward_cpu(din, dy, x, count);
    poison(d_out, count * fs);
    poison(d_din, count * fs);
    if (call_ok("gelu_forward", shape, kernel_gelu_forward_cuda(d_out, d_x, count, &ctx)))
        check_close("gelu_forward", shape, fetch_f(d_out, count), out, count);
    if (call_ok("gelu_backward", shape,
                kernel_gelu_backward_cuda(d_din, d_dy, d_x, count, &ctx)))
        check_close("gelu_backward", shape, fetch_f(d_din, count), din, count);
    free_case();
}

static void test_embedding_cuda(int n, int seq, int width, int vocab)
{
    char shape[64];
    snprintf(shape, sizeof shape, "n=%d T=%d C=%d V=%d", n, seq, width, vocab);
    const size_t rows = (size_t)n * seq, cnt = rows * width, fs = sizeof(float);
    float *ids = rand_f(rows, 0, 1); /* one draw per row in one buffer (the harness holds 64) */
    int32_t *tok = hmalloc(rows * sizeof(int32_t));
    for (size_t r = 0; r < rows; r++) {
        ids[r] = (float)(int)(ids[r] * vocab);
        tok[r] = (int32_t)ids[r];
    }
    float *wte = rand_f((size_t)vocab * width, -1, 1), *wpe = rand_f((size_t)seq * width, -1, 1);
    float *dout = rand_f(cnt, -1, 1), *dwte = rand_f((size_t)vocab * width, -1, 1);
    float *dwpe = rand_f((size_t)seq * width, -1, 1), *out = hmalloc(cnt * fs);
    float *d_ids = dcopy(ids, rows * fs), *d_wte = dcopy(wte, (size_t)vocab * width * fs);
    float *d_wpe = dcopy(wpe, (size_t)seq * width * fs), *d_dout = dcopy(dout, cnt * fs);
    float *d_dwte = dcopy(dwte, (size_t)vocab * width * fs);
    float *d_dwpe = dcopy(dwpe, (size_t)seq * width * fs), *d_out = dmalloc(cnt * fs);
    int32_t *d_tok = dmalloc(rows * sizeof(int32_t));
    kernel_embedding_forward_cpu(out, tok, wte, wpe, n, seq, width, vocab);
    poison(d_out, cnt * fs);
    if (call_ok("embedding_forward", shape,
                kernel_embedding_forward_cuda(d_out, d_tok, d_ids, d_wte, d_wpe, n, seq, width,
                                              vocab, &ctx)))
        check_exact("embedding_forward", shape, fetch_f(d_out, cnt), out, cnt);
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        kernel_embedding_backward_cpu(dwte, dwpe, dout, tok, n, seq, width, vocab);
        ok = ok && call_ok("embedding_backward", shape,
                           kernel_embedding_backward_cuda(d_dwte, d_dwpe, d_tok, d_dout, d_ids,
                                                          n, seq, width, vocab, &ctx));
    }
    if (ok) {
        check_exact("embedding_backward dwte", shape, fetch_f(d_dwte, (size_t)vocab * width),
                    dwte, (size_t)vocab * width);
        check_exact("embedding_backward dwpe", shape, fetch_f(d_dwpe, (size_t)seq * width),
                    dwpe, (size_t)seq * width);
    }
    free_case();
}

static void test_attention_cuda(int B, int T, int H, int D)
{
    char shape[64];
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d D=%d", B, T, H, D);
    const int C = H * D, ld = 3 * C;
    const kernel_attention_dims d = {B, T, H, D, ld};
    const size_t rows = (size_t)B * T, fs = sizeof(float), np = kernel_attention_probs_floats(&d);
    float *qkv = rand_f(rows * ld, -2, 2), *dy = rand_f(rows * C, -1, 1);
    float *y = hmalloc(rows * C * fs), *probs = hmalloc(np * fs), *dqkv = hmalloc(rows * ld * fs);
    float *work = hmalloc(kernel_attention_workspace_floats(&d) * fs);
    float *d_qkv = dcopy(qkv, rows * ld * fs), *d_dy = dcopy(dy, rows * C * fs);
    float *d_y = dmalloc(rows * C * fs), *d_probs = dmalloc(np * fs);
    float *d_dqkv = dmalloc(rows * ld * fs), *d_dqkv2 = dmalloc(rows * ld * fs);
    kernel_attention_forward_cpu(y, probs, qkv, qkv + C, qkv + 2 * C, &d);
    kernel_attention_backward_cpu(dqkv, dqkv + C, dqkv + 2 * C, work, dy, qkv, qkv + C,
                                  qkv + 2 * C, probs, &d);
    poison(d_y, rows * C * fs);
    poison(d_dqkv, rows * ld * fs);
    if (call_ok("attention_forward", shape,
                kernel_attention_forward_cuda(d_y, d_probs, d_qkv, &d, NULL, &ctx)))
        check_close("attention_forward", shape, fetch_f(d_y, rows * C), y, rows * C);
    if (call_ok("attention_backward", shape,
                kernel_attention_backward_cuda(d_dqkv, d_probs, d_dy, d_qkv, &d, NULL, &ctx)) &&
        call_ok("attention_backward", shape,
                kernel_attention_backward_cuda(d_dqkv2, d_probs, d_dy, d_qkv, &d, NULL, &ctx))) {
        float *got = fetch_f(d_dqkv, rows * ld);
        check_close("attention_backward dqkv", shape, got, dqkv, rows * ld);
        check_exact("attention_backward repeats", shape, fetch_f(d_dqkv2, rows * ld), got,
                    rows * ld);
    }
    free_case();
}

/* The attention dropout (a block's attention probabilities): the mask bit for bit (j ≤ i,
 * the part either side writes), the output and the gradients to rounding, the backward
 * twice bit for bit; elem_off places the call's heads among a layer's (a tensor shard's). */
static void test_attention_dropout_cuda(int B, int T, int H, int D, float p, size_t elem_off)
{
    char shape[80];
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d D=%d p=%g off=%zu", B, T, H, D, (double)p,
             elem_off);
    const int C = H * D, ld = 3 * C;
    const kernel_attention_dims d = {B, T, H, D, ld};
    const size_t rows = (size_t)B * T, fs = sizeof(float), np = kernel_attention_probs_floats(&d);
    float *qkv = rand_f(rows * ld, -2, 2), *dy = rand_f(rows * C, -1, 1);
    float *y = hmalloc(rows * C * fs), *probs = hmalloc(np * fs), *dqkv = hmalloc(rows * ld * fs);
    float *work = hmalloc((kernel_attention_workspace_floats(&d) +
                           kernel_attention_dropout_floats(&d)) * fs);
    uint8_t *mask = hmalloc(np), *got_mask = hmalloc(np);
    int64_t *ids = hmalloc((size_t)B * sizeof(int64_t));
    for (int b = 0; b < B; b++) ids[b] = 1000 + 7 * b + (b % 2) * ((int64_t)1 << 33);
    float *d_qkv = dcopy(qkv, rows * ld * fs), *d_dy = dcopy(dy, rows * C * fs);
    float *d_y = dmalloc(rows * C * fs), *d_probs = dmalloc(np * fs);
    float *d_dqkv = dmalloc(rows * ld * fs), *d_dqkv2 = dmalloc(rows * ld * fs);
    uint8_t *d_mask = dmalloc(np);
    int64_t *d_ids = dcopy(ids, (size_t)B * sizeof(int64_t));
    const uint64_t seed = 0x1234567890abcdefULL, stream = kernel_block_dropout_stream(3, 0, 11);
    kernel_attention_dropout cd = {p, seed, stream, ids, elem_off, mask};
    kernel_attention_dropout gd = {p, seed, stream, d_ids, elem_off, d_mask};
    kernel_attention_forward_dropout_cpu(y, probs, work, qkv, qkv + C, qkv + 2 * C, &d, &cd);
    kernel_attention_backward_dropout_cpu(dqkv, dqkv + C, dqkv + 2 * C, work, dy, qkv, qkv + C,
                                          qkv + 2 * C, probs, &d, &cd);
    poison(d_y, rows * C * fs);
    poison(d_dqkv, rows * ld * fs);
    if (call_ok("attention_forward dropout", shape,
                kernel_attention_forward_cuda(d_y, d_probs, d_qkv, &d, &gd, &ctx))) {
        check_close("attention_forward dropout", shape, fetch_f(d_y, rows * C), y, rows * C);
        download(got_mask, d_mask, np);
        size_t bad = 0;
        for (size_t bh = 0; bh < (size_t)B * H; bh++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j <= i; j++) {
                    const size_t at = (bh * T + i) * T + j;
                    bad += got_mask[at] != mask[at];
                }
        record("attention dropout mask", shape, bad == 0, (double)bad, 1, "");
    }
    gd.sample_ids = NULL; /* the backward reads the mask alone */
    if (call_ok("attention_backward dropout", shape,
                kernel_attention_backward_cuda(d_dqkv, d_probs, d_dy, d_qkv, &d, &gd, &ctx)) &&
        call_ok("attention_backward dropout", shape,
                kernel_attention_backward_cuda(d_dqkv2, d_probs, d_dy, d_qkv, &d, &gd, &ctx))) {
        float *got = fetch_f(d_dqkv, rows * ld);
        check_close("attention_backward dropout dqkv", shape, got, dqkv, rows * ld);
        check_exact("attention_backward dropout repeats", shape, fetch_f(d_dqkv2, rows * ld),
                    got, rows * ld);
    }
    free_case();
}

/* The vocabulary-parallel loss: T ranks' shards of the logits through the three kernels,
 * the all-gathers between them done on the host, against the whole row's
 * kernel_softmax_xent_cpu: the loss and the gradient to rounding, the hits exactly, every
 * rank's loss and hits the same bits (written without a GPU: not yet run on one). */
static void test_xent_shard_cuda(int R, int V, int T)
{
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d V=%d T=%d", R, V, T);
    const size_t fs = sizeof(float);
    float *x = rand_f((size_t)R * V, -4, 4), *dl = hmalloc((size_t)R * V * fs);
    int32_t *lab = hmalloc((size_t)R * sizeof(int32_t));
    const float *u = rand_f((size_t)R, 0, 1);
    for (int i = 0; i < R; i++) lab[i] = (int32_t)(u[i] * V);
    int c_right = 0;
    double c_loss = kernel_softmax_xent_cpu(dl, &c_right, x, lab, R, V, 0.5f);
    float *all1 = hmalloc((size_t)T * 2 * R * fs), *all2 = hmalloc((size_t)T * 3 * R * fs);
    float *got = hmalloc((size_t)R * V * fs);
    int32_t *d_lab = dcopy(lab, (size_t)R * sizeof(int32_t));
    float *d_x[8], *d_d[8], *d_mine = dmalloc(3 * (size_t)R * fs), *d_ma[8];
    float *d_all = dmalloc((size_t)T * 3 * R * fs);
    double *d_loss = dmalloc((size_t)T * sizeof(double)), *d_rl = dmalloc((size_t)R * 8);
    int *d_right = dmalloc((size_t)T * sizeof(int)), *d_rr = dmalloc((size_t)R * sizeof(int));
    int first[8], width[8], ok = 1;
    for (int r = 0; r < T; r++) {
        first[r] = (int)((long)V * r / T);
        width[r] = (int)((long)V * (r + 1) / T) - first[r];
        float *xr = hmalloc((size_t)R * width[r] * fs);
        for (int i = 0; i < R; i++)
            memcpy(xr + (size_t)i * width[r], x + (size_t)i * V + first[r], width[r] * fs);
        d_x[r] = dcopy(xr, (size_t)R * width[r] * fs);
        d_d[r] = dmalloc((size_t)R * width[r] * fs);
        d_ma[r] = dmalloc(2 * (size_t)R * fs);
        poison(d_d[r], (size_t)R * width[r] * fs);
        ok = ok && call_ok("xent_shard_max", shape,
                           kernel_xent_shard_max_cuda(d_mine, d_x[r], R, width[r], first[r], &ctx));
        if (ok) download(all1 + (size_t)r * 2 * R, d_mine, 2 * (size_t)R * fs);
    }
    upload(d_all, all1, (size_t)T * 2 * R * fs);
    for (int r = 0; r < T && ok; r++) {
        ok = call_ok("xent_shard_sums", shape,
                     kernel_xent_shard_sums_cuda(d_mine, d_d[r], d_ma[r], d_all, d_x[r], d_lab, R,
                                                 width[r], first[r], T, &ctx));
        if (ok) download(all2 + (size_t)r * 3 * R, d_mine, 3 * (size_t)R * fs);
    }
    upload(d_all, all2, (size_t)T * 3 * R * fs);
    for (int r = 0; r < T && ok; r++)
        ok = call_ok("xent_shard_finish", shape,
                     kernel_xent_shard_finish_cuda(d_d[r], d_right + r, d_loss + r, d_all, d_ma[r],
                                                   d_lab, R, width[r], first[r], V, T, 0.5f, d_rl,
                                                   d_rr, &ctx));
    if (!ok) { free_case(); return; }
    double loss[8];
    int right[8];
    download(loss, d_loss, (size_t)T * sizeof(double));
    download(right, d_right, (size_t)T * sizeof(int));
    int same = 1;
    for (int r = 0; r < T; r++) {
        same = same && memcmp(&loss[r], &loss[0], sizeof(double)) == 0 && right[r] == right[0];
        float *dr = fetch_f(d_d[r], (size_t)R * width[r]);
        for (int i = 0; i < R; i++)
            memcpy(got + (size_t)i * V + first[r], dr + (size_t)i * width[r], width[r] * fs);
    }
    record("xent_shard ranks agree", shape, same, 0, 1, "");
    const double err = fabs(loss[0] - c_loss) / fabs(c_loss);
    record("xent_shard loss", shape, err <= REL_TOL, err, 0, "");
    record("xent_shard correct", shape, right[0] == c_right, right[0] - c_right, 1, "");
    check_close("xent_shard dlogits", shape, got, dl, (size_t)R * V);
    free_case();
}

/* Many rows (a language model's positions) through the many-block loss. */
static void test_xent_rows_cuda(int n, int classes)
{
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d classes=%d", n, classes);
    const size_t cnt = (size_t)n * classes, fs = sizeof(float);
    float *x = rand_f(cnt, -4, 4), *dl = hmalloc(cnt * fs);
    int32_t *lab = hmalloc((size_t)n * sizeof(int32_t));
    const float *u = rand_f((size_t)n, 0, 1);
    for (int i = 0; i < n; i++) lab[i] = (int32_t)(u[i] * classes);
    int right = 0;
    double loss = kernel_softmax_xent_cpu(dl, &right, x, lab, n, classes, 0.5f);
    float *d_x = dcopy(x, cnt * fs), *d_dl = dmalloc(cnt * fs);
    int32_t *d_lab = dcopy(lab, (size_t)n * sizeof(int32_t));
    double *d_loss = dmalloc(2 * sizeof(double)), *d_part = dmalloc(KERNEL_XENT_PARTS * 8);
    int *d_right = dmalloc(2 * sizeof(int)), *d_pr = dmalloc(KERNEL_XENT_PARTS * sizeof(int));
    poison(d_dl, cnt * fs);
    int ok = 1;
    for (int k = 0; k < 2; k++)
        ok = ok && call_ok("softmax_xent_rows", shape,
                           kernel_softmax_xent_rows_cuda(d_dl, d_right + k, d_loss + k, d_x,
                                                         d_lab, n, classes, 0.5f, d_part, d_pr,
                                                         &ctx));
    if (!ok) { free_case(); return; }
    check_close("softmax_xent_rows dlogits", shape, fetch_f(d_dl, cnt), dl, cnt);
    double got[2];
    int got_right[2];
    download(got, d_loss, sizeof got);
    download(got_right, d_right, sizeof got_right);
    const double err = fabs(got[0] - loss) / fabs(loss);
    record("softmax_xent_rows loss", shape, err <= REL_TOL, err, 0, "");
    record("softmax_xent_rows repeats", shape,
           memcmp(&got[0], &got[1], sizeof(double)) == 0 && got_right[0] == got_right[1], 0, 1,
           "");
    record("softmax_xent_rows correct", shape, got_right[0] == right, got_right[0] - right, 1,
           "");
    free_case();
}

static void run_transformer_cases(void)
{
    test_layernorm_cuda(1, 1);
    test_layernorm_cuda(37, 33);
    test_layernorm_cuda(256, 768);
    test_gelu_cuda(1);
    test_gelu_cuda(100003);
    test_embedding_cuda(1, 1, 1, 3);
    test_embedding_cuda(3, 7, 5, 4);     /* every token many times */
    test_embedding_cuda(4, 130, 33, 11); /* chunks of 256 rows end mid-sample */
    test_embedding_cuda(2, 64, 48, 1000);
    test_attention_cuda(1, 1, 1, 8);
    test_attention_cuda(2, 5, 3, 4);
    test_attention_cuda(2, 70, 2, 16);
    test_attention_cuda(1, 129, 4, 64);
    test_attention_cuda(1, 33, 1, 128);
    test_attention_cuda(2, 200, 3, 64);  /* 4 query blocks, 4 key tiles, causal edges */
    test_attention_cuda(1, 100, 2, 100); /* padded to 128, tiles of 32 */
    test_attention_cuda(3, 1, 2, 20);    /* seq 1: Δ recomputed while staging */
    test_attention_dropout_cuda(1, 1, 1, 8, 0.5f, 0);
    test_attention_dropout_cuda(2, 70, 2, 16, 0.1f, 0);
    test_attention_dropout_cuda(2, 129, 3, 64, 0.2f, 0);
    test_attention_dropout_cuda(1, 100, 2, 100, 0.3f, 2 * 100 * 100); /* a shard's heads */
    test_xent_shard_cuda(1, 5, 1);
    test_xent_shard_cuda(33, 256, 2);
    test_xent_shard_cuda(1000, 1031, 3); /* uneven cuts, many blocks of rows */
    test_xent_shard_cuda(64, 50257, 4);  /* GPT-2's vocabulary */
    test_xent_rows_cuda(7, 10);          /* one block: the one-block kernel */
    test_xent_rows_cuda(1000, 257);
    test_xent_rows_cuda(4099, 1031);
}

/* ---- --bench: each transformer kernel's time at GPT-2 124M shapes (information, not a
 * check): where a step's time goes. Batch 4 × 1024 tokens, 12 heads of 64, width 768,
 * vocabulary 50257; CUDA events around `reps` calls after one warm-up call. */

typedef int (*bench_fn)(void *arg);

static void bench_one(const char *what, double flops, bench_fn f, void *arg)
{
    const int reps = 10;
    cudaEvent_t e0, e1;
    must(cudaEventCreate(&e0) == cudaSuccess ? 0 : pt_error_set("cudaEventCreate"));
    must(cudaEventCreate(&e1) == cudaSuccess ? 0 : pt_error_set("cudaEventCreate"));
    must(f(arg));
    must(cudaEventRecord(e0, ctx.stream) == cudaSuccess ? 0 : pt_error_set("cudaEventRecord"));
    for (int r = 0; r < reps; r++)
        must(f(arg));
    must(cudaEventRecord(e1, ctx.stream) == cudaSuccess ? 0 : pt_error_set("cudaEventRecord"));
    must(cudaEventSynchronize(e1) == cudaSuccess ? 0 : pt_error_set("%s failed", what));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    ms /= reps;
    printf("bench %-34s %9.3f ms", what, ms);
    if (flops > 0)
        printf("  %7.2f TFLOP/s", flops / (ms * 1e-3) / 1e12);
    printf("\n");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

typedef struct {
    float *qkv, *y, *lse, *dy, *dqkv, *x, *out, *mean, *rstd, *g, *b, *dx, *dg, *db, *h, *dh;
    float *ids, *wte, *wpe, *dwte, *dwpe, *logits, *dlogits, *w, *dw;
    int32_t *tok, *lab;
    double *loss, *part;
    int *right, *pr;
    kernel_attention_dims ad;
    int rows, C, V;
} bench_bufs;

static int b_att_f(void *p)
{
    bench_bufs *u = p;
    return kernel_attention_forward_cuda(u->y, u->lse, u->qkv, &u->ad, NULL, &ctx);
}
static int b_att_b(void *p)
{
    bench_bufs *u = p;
    return kernel_attention_backward_cuda(u->dqkv, u->lse, u->dy, u->qkv, &u->ad, NULL, &ctx);
}
static int b_ln_f(void *p)
{
    bench_bufs *u = p;
    return kernel_layernorm_forward_cuda(u->out, u->mean, u->rstd, u->x, u->g, u->b, u->rows,
                                         u->C, &ctx);
}
static int b_ln_b(void *p)
{
    bench_bufs *u = p;
    return kernel_layernorm_backward_cuda(u->dx, u->dg, u->db, u->out, u->x, u->mean, u->rstd,
                                          u->g, u->rows, u->C, &ctx);
}
static int b_gelu_f(void *p)
{
    bench_bufs *u = p;
    return kernel_gelu_forward_cuda(u->dh, u->h, (size_t)u->rows * 4 * u->C, &ctx);
}
static int b_gelu_b(void *p)
{
    bench_bufs *u = p;
    return kernel_gelu_backward_cuda(u->dh, u->h, u->h, (size_t)u->rows * 4 * u->C, &ctx);
}
static int b_emb_f(void *p)
{
    bench_bufs *u = p;
    return kernel_embedding_forward_cuda(u->out, u->tok, u->ids, u->wte, u->wpe, 4,
                                         u->rows / 4, u->C, u->V, &ctx);
}
static int b_emb_b(void *p)
{
    bench_bufs *u = p;
    return kernel_embedding_backward_cuda(u->dwte, u->dwpe, u->tok, u->out, u->ids, 4,
                                          u->rows / 4, u->C, u->V, &ctx);
}
static int b_xent(void *p)
{
    bench_bufs *u = p;
    return kernel_softmax_xent_rows_cuda(u->dlogits, u->right, u->loss, u->logits, u->lab,
                                         u->rows, u->V, 1.0f / u->rows, u->part, u->pr, &ctx);
}
static int b_mlp_f(void *p)
{
    bench_bufs *u = p;
    return kernel_dense_forward_cuda(u->h, u->x, u->w, NULL, u->rows, u->C, 4 * u->C, &ctx);
}
static int b_mlp_b(void *p)
{
    bench_bufs *u = p;
    return kernel_dense_backward_cuda(u->dx, u->dw, NULL, u->dh, u->x, u->w, u->rows, u->C,
                                      4 * u->C, &ctx);
}
static int b_head_f(void *p)
{
    bench_bufs *u = p;
    return kernel_dense_forward_cuda(u->logits, u->x, u->wte, NULL, u->rows, u->C, u->V, &ctx);
}

static void run_transformer_bench(void)
{
    bench_bufs u = {0};
    const int B = 4, T = 1024, H = 12, D = 64;
    u.C = H * D;
    u.V = 50257;
    u.rows = B * T;
    u.ad = (kernel_attention_dims){B, T, H, D, 3 * u.C};
    const size_t fs = sizeof(float), R = (size_t)u.rows, C = (size_t)u.C, V = (size_t)u.V;
    u.qkv = dcopy(rand_f(R * 3 * C, -1, 1), R * 3 * C * fs);
    u.dy = dcopy(rand_f(R * C, -1, 1), R * C * fs);
    u.y = dmalloc(R * C * fs);
    u.dqkv = dmalloc(R * 3 * C * fs);
    u.lse = dmalloc(2 * (size_t)B * H * T * fs);
    u.x = dcopy(rand_f(R * C, -2, 2), R * C * fs);
    u.out = dmalloc(R * C * fs);
    u.dx = dmalloc(R * C * fs);
    u.mean = dmalloc(R * fs);
    u.rstd = dmalloc(R * fs);
    u.g = dcopy(rand_f(C, 0.5f, 1.5f), C * fs);
    u.b = dcopy(rand_f(C, -1, 1), C * fs);
    u.dg = dmalloc(C * fs);
    u.db = dmalloc(C * fs);
    u.h = dcopy(rand_f(R * 4 * C, -3, 3), R * 4 * C * fs);
    u.dh = dmalloc(R * 4 * C * fs);
    float *ids = rand_f(R, 0, 1);
    int32_t *lab = hmalloc(R * sizeof(int32_t));
    for (size_t r = 0; r < R; r++) {
        ids[r] = (float)(int)(ids[r] * (float)V);
        lab[r] = (int32_t)ids[r];
    }
    u.ids = dcopy(ids, R * fs);
    u.lab = dcopy(lab, R * sizeof(int32_t));
    u.tok = dmalloc(R * sizeof(int32_t));
    u.wte = dcopy(rand_f(V * C, -0.1f, 0.1f), V * C * fs);
    u.wpe = dcopy(rand_f((size_t)T * C, -0.1f, 0.1f), (size_t)T * C * fs);
    u.dwte = dmalloc(V * C * fs);
    u.dwpe = dmalloc((size_t)T * C * fs);
    u.w = dcopy(rand_f(4 * C * C, -0.1f, 0.1f), 4 * C * C * fs);
    u.dw = dmalloc(4 * C * C * fs);
    u.logits = dmalloc(R * V * fs);
    u.dlogits = dmalloc(R * V * fs);
    u.loss = dmalloc(sizeof(double));
    u.part = dmalloc(KERNEL_XENT_PARTS * sizeof(double));
    u.right = dmalloc(sizeof(int));
    u.pr = dmalloc(KERNEL_XENT_PARTS * sizeof(int));
    must(kernel_dense_forward_cuda(u.logits, u.x, u.wte, NULL, u.rows, u.C, u.V, &ctx));
    /* causal attention: QKᵀ and PV over half the T² pairs, 2 FLOPs a multiply-add */
    const double att = 2.0 * 2.0 * B * H * (double)T * T / 2 * D;
    printf("bench: GPT-2 124M shapes, batch %d x %d tokens, %d heads of %d, vocabulary %d\n",
           B, T, H, D, u.V);
    bench_one("attention forward", att, b_att_f, &u);
    bench_one("attention backward", 2.5 * att, b_att_b, &u);
    bench_one("layernorm forward", 0, b_ln_f, &u);
    bench_one("layernorm backward", 0, b_ln_b, &u);
    bench_one("gelu forward (4C)", 0, b_gelu_f, &u);
    bench_one("gelu backward (4C)", 0, b_gelu_b, &u);
    bench_one("embedding forward", 0, b_emb_f, &u);
    bench_one("embedding backward", 0, b_emb_b, &u);
    bench_one("softmax xent rows (V)", 0, b_xent, &u);
    bench_one("dense C->4C forward (sgemm)", 2.0 * R * C * 4 * C, b_mlp_f, &u);
    bench_one("dense C->4C backward (2 sgemm)", 4.0 * R * C * 4 * C, b_mlp_b, &u);
    bench_one("head C->V forward (sgemm)", 2.0 * R * C * V, b_head_f, &u);
    free_case();
}
