/* The transformer kernels' device code, run on the HOST thread by thread, against the CPU
 * twins (kernels/kernels_transformer.h) — no GPU needed, so it runs on every machine with
 * nvcc.
 *
 * kernels/cuda/transformer.cu's kernels are loops over their threads' items calling the
 * __host__ __device__ functions of kernels/cuda/transformer_math.cuh; here every "thread"
 * of every launch is called in turn with the kernel's own index arithmetic, including the
 * embedding backward's block-wide gathering of a token's rows (chunks of 256 rows, in row
 * order), which is emulated. What this does NOT cover: the launches themselves (geometry,
 * streams), warp intrinsics (ballot), the device's own float rounding (FMA contraction)
 * and expf: those need a GPU (test_cuda_kernels). Random shapes include sequences and
 * widths that are multiples of nothing. Outputs start as NaN so an unwritten element
 * fails; gradients that accumulate start from random values.
 *
 * Float-rounding results are compared normwise: max|dev − cpu| / max|cpu| ≤ 1e-4; the
 * embedding's (the same additions in the same order) bit for bit. Prints one line per
 * check and "N passed, N failed"; exits 1 on a failure. Build with -DTFC_PLANTED=k
 * (tests/cuda/transformer_plant.sh) to check that each planted bug fails. */
#include "kernels/cuda/transformer_math.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

static int passed, failed;
static unsigned long long rng_state = 0x9e3779b97f4a7c15ULL;

static float urand(float lo, float hi)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((rng_state >> 40) & 0xffffff) / 16777216.0f;
}
static std::vector<float> rand_v(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (auto &x : v) x = urand(lo, hi);
    return v;
}
static std::vector<float> nan_v(size_t n) { return std::vector<float>(n, NAN); }

static void record(const char *what, const char *shape, bool ok, double err)
{
    printf("%-4s %-28s %-34s err %.3g\n", ok ? "ok" : "FAIL", what, shape, err);
    ok ? passed++ : failed++;
}

/* Normwise relative error, NaN where only one side is NaN (an unwritten output). */
static void check_close(const char *what, const char *shape, const float *dev, const float *cpu,
                  size_t n, double tol = 1e-4)
{
    double num = 0.0, den = 0.0;
    bool bad = false;
    for (size_t i = 0; i < n; i++) {
        if (isnan(dev[i]) || isnan(cpu[i])) {
            bad |= isnan(dev[i]) != isnan(cpu[i]);
            continue;
        }
        num = fmax(num, fabs((double)dev[i] - cpu[i]));
        den = fmax(den, fabs((double)cpu[i]));
    }
    const double err = bad ? INFINITY : den > 0 ? num / den : num;
    record(what, shape, err <= tol, err);
}
/* dq, dk and dv of rows interleaved as qkv (row stride ld, C each), each against the CPU's */
static void check_dqkv(const char *const names[3], const char *shape, const float *dqkv,
                       const float *c_dqkv, size_t rows, int C, size_t ld)
{
    std::vector<float> part(rows * C), c_part(rows * C);
    for (int s = 0; s < 3; s++) {
        for (size_t r = 0; r < rows; r++)
            for (int k = 0; k < C; k++) {
                part[r * C + k] = dqkv[r * ld + s * C + k];
                c_part[r * C + k] = c_dqkv[r * ld + s * C + k];
            }
        check_close(names[s], shape, part.data(), c_part.data(), part.size());
    }
}
static void exact(const char *what, const char *shape, const float *dev, const float *cpu,
                  size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(&dev[i], &cpu[i], sizeof(float)) != 0 && !(isnan(dev[i]) && isnan(cpu[i]));
    record(what, shape, bad == 0, (double)bad);
}

/* ---- layer norm ---- */
static void test_layernorm(int rows, int width, float offset)
{
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d width=%d", rows, width);
    const size_t n = (size_t)rows * width;
    auto x = rand_v(n, offset - 2, offset + 2), g = rand_v(width, 0.5f, 1.5f);
    auto be = rand_v(width, -1, 1), dy = rand_v(n, -1, 1);
    auto out = nan_v(n), mean = nan_v(rows), rstd = nan_v(rows);
    auto c_out = nan_v(n), c_mean = nan_v(rows), c_rstd = nan_v(rows);
    kernel_layernorm_forward_cpu(c_out.data(), c_mean.data(), c_rstd.data(), x.data(), g.data(),
                                 be.data(), rows, width);
    for (int r = 0; r < rows; r++) /* ln_stats: one thread per row */
        tfc_ln_stats(x.data() + (size_t)r * width, width, &mean[r], &rstd[r]);
    for (size_t i = 0; i < n; i++) /* ln_out: one per element */
        out[i] = tfc_ln_out(x[i], mean[i / width], rstd[i / width], g[i % width],
                            be[i % width]);
    check_close("layernorm_forward mean", shape, mean.data(), c_mean.data(), rows);
    check_close("layernorm_forward rstd", shape, rstd.data(), c_rstd.data(), rows);
    check_close("layernorm_forward", shape, out.data(), c_out.data(), n);

    auto dg = rand_v(width, -1, 1), db = rand_v(width, -1, 1), dx = nan_v(n);
    auto c_dg = dg, c_db = db, c_dx = nan_v(n);
    for (int k = 0; k < 2; k++) { /* twice: the parameter gradients accumulate */
        kernel_layernorm_backward_cpu(c_dx.data(), c_dg.data(), c_db.data(), dy.data(),
                                      x.data(), c_mean.data(), c_rstd.data(), g.data(), rows,
                                      width);
        for (int j = 0; j < width; j++) /* ln_params: one thread per column */
            tfc_ln_param_col(dg.data(), db.data(), dy.data(), x.data(), mean.data(),
                             rstd.data(), rows, width, j);
        for (int r = 0; r < rows; r++) /* ln_dx: one per row */
            tfc_ln_dx_row(dx.data() + (size_t)r * width, dy.data() + (size_t)r * width,
                          x.data() + (size_t)r * width, mean[r], rstd[r], g.data(), width);
    }
    check_close("layernorm_backward dgamma", shape, dg.data(), c_dg.data(), width);
    check_close("layernorm_backward dbeta", shape, db.data(), c_db.data(), width);
    check_close("layernorm_backward dx", shape, dx.data(), c_dx.data(), n);
    /* dx in place of dy */
    auto io = dy;
    for (int r = 0; r < rows; r++)
        tfc_ln_dx_row(io.data() + (size_t)r * width, io.data() + (size_t)r * width,
                      x.data() + (size_t)r * width, mean[r], rstd[r], g.data(), width);
    check_close("layernorm_backward dx=dy", shape, io.data(), c_dx.data(), n);
}

/* ---- GELU ---- */
static void test_gelu(size_t count, float range)
{
    char shape[64];
    snprintf(shape, sizeof shape, "count=%zu |x|<%g", count, (double)range);
    auto x = rand_v(count, -range, range), dy = rand_v(count, -1, 1);
    auto out = nan_v(count), c_out = nan_v(count), din = nan_v(count), c_din = nan_v(count);
    kernel_gelu_forward_cpu(c_out.data(), x.data(), count);
    kernel_gelu_backward_cpu(c_din.data(), dy.data(), x.data(), count);
    for (size_t i = 0; i < count; i++) {
        out[i] = tfc_gelu(x[i]);
        din[i] = tfc_gelu_grad(dy[i], x[i]);
    }
    check_close("gelu_forward", shape, out.data(), c_out.data(), count);
    check_close("gelu_backward", shape, din.data(), c_din.data(), count);
}

/* ---- embedding ---- */

/* embed_tok_grad as the device runs it: per token row v, per chunk of 256 rows, the rows
 * holding v in order, then each column's thread. */
static void emu_tok_grad(float *dwte, const float *dout, const int32_t *tok, int rows,
                         int width, int vocab)
{
    for (int v = 0; v < vocab; v++)
        for (int r0 = 0; r0 < rows; r0 += 256) {
            int32_t list[256];
            int total = 0;
            for (int r = r0; r < rows && r < r0 + 256; r++)
                if (tok[r] == v) list[total++] = r;
            if (total)
                for (int j = 0; j < width; j++)
                    tfc_embed_tok_grad(dwte + (size_t)v * width, dout, list, total, width, j);
        }
}

/* The whole table (first = 0, shards = 0) or rows [first, first + Vr) of a vocabulary of
 * V (the shard forms, which take wpe only when `with_pos`). */
static void test_embedding(int n, int seq, int width, int V, int first, int Vr, bool shard,
                           bool with_pos)
{
    char shape[96];
    snprintf(shape, sizeof shape, "n=%d T=%d C=%d V=%d%s", n, seq, width, V,
             shard ? (with_pos ? " shard+pos" : " shard") : "");
    const size_t rows = (size_t)n * seq, cnt = rows * width;
    std::vector<float> ids(rows);
    for (size_t r = 0; r < rows; r++) ids[r] = (float)(int)urand(0, (float)V);
    if (!shard && rows > 2) ids[rows / 2] = (float)V; /* a bad id: a NaN row, no gradient */
    auto wte = rand_v((size_t)Vr * width, -1, 1), wpe = rand_v((size_t)seq * width, -1, 1);
    const float *P = with_pos ? wpe.data() : NULL;
    std::vector<int32_t> tok(rows), c_tok(rows);
    for (size_t r = 0; r < rows; r++) tok[r] = tfc_token_row(ids[r], first, Vr);
    auto out = nan_v(cnt);
    for (size_t i = 0; i < cnt; i++)
        out[i] = tfc_embed(tok.data(), wte.data(), P, i / width, (int)(i % width), seq, width,
                           !shard);
    std::vector<float> c_out(cnt, NAN);
    /* the CPU's: the whole kernel, or the CPU set's shard loop (layer_kernels_cpu.c) */
    if (!shard) {
        for (size_t r = 0; r < rows; r++) c_tok[r] = ids[r] < V ? (int32_t)ids[r] : -1;
        kernel_embedding_forward_cpu(c_out.data(), c_tok.data(), wte.data(), wpe.data(), n, seq,
                                     width, V);
    } else {
        c_tok = tok;
        for (size_t r = 0; r < rows; r++)
            for (int j = 0; j < width; j++) {
                const float *e = tok[r] >= 0 ? wte.data() + (size_t)tok[r] * width : NULL;
                const float *p = P ? P + (r % seq) * width : NULL;
                c_out[r * width + j] = e && p ? e[j] + p[j] : e ? e[j] : p ? p[j] : 0.0f;
            }
    }
    exact("embedding_forward", shape, out.data(), c_out.data(), cnt);

    auto dout = rand_v(cnt, -1, 1);
    auto dwte = rand_v(wte.size(), -1, 1), dwpe = rand_v(wpe.size(), -1, 1);
    auto c_dwte = dwte, c_dwpe = dwpe;
    for (int k = 0; k < 2; k++) {
        kernel_embedding_backward_cpu(c_dwte.data(), with_pos ? c_dwpe.data() : NULL,
                                      dout.data(), c_tok.data(), n, seq, width, Vr);
        emu_tok_grad(dwte.data(), dout.data(), tok.data(), (int)rows, width, Vr);
        if (with_pos)
            for (int t = 0; t < seq; t++)
                for (int j = 0; j < width; j++)
                    tfc_embed_pos_grad(dwpe.data(), dout.data(), n, seq, width, t, j);
    }
    exact("embedding_backward dwte", shape, dwte.data(), c_dwte.data(), dwte.size());
    exact("embedding_backward dwpe", shape, dwpe.data(), c_dwpe.data(), dwpe.size());
}

/* ---- attention ---- */

/* The tiled kernels of transformer.cu, block by block: each tile staged by the block's
 * threads (tfc_att_stage, element by element), then each thread's step on it. */
template <int MAXD>
static void emu_att(float *y, float *dqkv, float *lse, float *delta, const float *dy,
                    const float *qkv, const kernel_attention_dims &d, bool forward,
                    const tfc_drop &dr)
{
    constexpr int BT = tfc_att_tile_rows<MAXD>(), R = TFC_ATT_ROWS;
    const tfc_attn a = tfc_attn_of(&d);
    alignas(16) static float t1[BT * MAXD], t2[BT * MAXD];
    static float L[BT], DL[BT];
    auto mrow = [&](int b, int h, int i) { return tfc_drop_row(dr, a.T, a.H, b, h, i); };
    auto stage = [&](const float *v1, const float *v2, size_t ld, int r0, int n) {
        for (int e = 0; e < BT * MAXD; e++) {
            tfc_att_stage<MAXD>(t1, v1, ld, r0, n, a.D, e);
            tfc_att_stage<MAXD>(t2, v2, ld, r0, n, a.D, e);
        }
    };
    for (int b = 0; b < d.batch; b++)
        for (int h = 0; h < a.H; h++)
            for (int r0 = 0; r0 < a.T; r0 += R) {
                const int nr = std::min(R, a.T - r0), kend = std::min(a.T, r0 + R);
                const float *qv = tfc_att_view(qkv, a, b, h, 0), *kv = tfc_att_view(qkv, a, b, h, 1);
                const size_t rows = ((size_t)b * a.H + h) * a.T;
                if (forward) {
                    std::vector<tfc_att_fwd<MAXD>> s(nr);
                    std::vector<uint8_t *> mr(nr);
                    for (int t = 0; t < nr; t++) {
                        tfc_att_fwd_begin<MAXD>(s[t], qv + (size_t)(r0 + t) * a.ld, a.D);
                        if ((mr[t] = mrow(b, h, r0 + t))) tfc_drop_make_row(mr[t], dr, a.T, b, h, r0 + t);
                    }
                    for (int j0 = 0; j0 < kend; j0 += BT) {
                        const int n = std::min(BT, kend - j0);
                        stage(kv, kv + a.C, a.ld, j0, n);
                        for (int t = 0; t < nr; t++)
                            tfc_att_fwd_tile<MAXD>(s[t], t1, t2, j0, n, r0 + t, a.scale, mr[t],
                                                   dr.scale);
                    }
                    for (int t = 0; t < nr; t++)
                        tfc_att_fwd_end<MAXD>(s[t], y + ((size_t)b * a.T + r0 + t) * a.C + (size_t)h * a.D,
                                              lse + rows + r0 + t, a.D, r0 + t);
                    continue;
                }
                std::vector<tfc_att_dq<MAXD>> s(nr);
                for (int t = 0; t < nr; t++)
                    tfc_att_dq_begin<MAXD>(s[t], qv + (size_t)(r0 + t) * a.ld,
                                           dy + ((size_t)b * a.T + r0 + t) * a.C + (size_t)h * a.D,
                                           lse[rows + r0 + t], a.D);
                for (int pass = 0; pass < 2; pass++)
                    for (int j0 = 0; j0 < kend; j0 += BT) {
                        const int n = std::min(BT, kend - j0);
                        stage(kv, kv + a.C, a.ld, j0, n);
                        for (int t = 0; t < nr; t++)
                            if (pass == 0) tfc_att_dq_delta_tile<MAXD>(s[t], t1, t2, j0, n, r0 + t, a.scale, mrow(b, h, r0 + t), dr.scale);
                            else tfc_att_dq_tile<MAXD>(s[t], t1, t2, j0, n, r0 + t, a.scale, mrow(b, h, r0 + t), dr.scale);
                    }
                for (int t = 0; t < nr; t++)
                    tfc_att_dq_end<MAXD>(s[t], dqkv + ((size_t)b * a.T + r0 + t) * a.ld + (size_t)h * a.D,
                                         delta ? delta + rows + r0 + t : NULL, a.D, a.scale);
            }
    if (forward)
        return;
    /* dK then dV, after every dQ (and Δ): the kernels' order */
    for (int dk = 1; dk >= 0; dk--)
        for (int b = 0; b < d.batch; b++)
            for (int h = 0; h < a.H; h++)
                for (int k0 = 0; k0 < a.T; k0 += R) {
                    const int nr = std::min(R, a.T - k0);
                    const float *qv = tfc_att_view(qkv, a, b, h, 0), *kv = tfc_att_view(qkv, a, b, h, 1);
                    const float *gv = dy + (size_t)b * a.T * a.C + (size_t)h * a.D;
                    const size_t rows = ((size_t)b * a.H + h) * a.T;
                    std::vector<tfc_att_dkv<MAXD, true>> sk(nr);
                    std::vector<tfc_att_dkv<MAXD, false>> sv(nr);
                    for (int t = 0; t < nr; t++) {
                        const float *kj = kv + (size_t)(k0 + t) * a.ld;
                        if (dk) tfc_att_dkv_begin<MAXD, true>(sk[t], kj, kj + a.C, a.D);
                        else tfc_att_dkv_begin<MAXD, false>(sv[t], kj, kj + a.C, a.D);
                    }
                    for (int i0 = k0; i0 < a.T; i0 += BT) {
                        const int n = std::min(BT, a.T - i0);
                        for (int e = 0; e < BT * MAXD; e++) {
                            tfc_att_stage<MAXD>(t1, qv, a.ld, i0, n, a.D, e);
                            tfc_att_stage<MAXD>(t2, gv, a.C, i0, n, a.D, e);
                        }
                        for (int r = 0; r < n; r++) {
                            L[r] = lse[rows + i0 + r];
                            DL[r] = delta ? delta[rows + i0 + r]
                                          : tfc_attn_delta(dy, qkv, lse, a, b, h, i0 + r, mrow(b, h, i0 + r), dr.scale);
                        }
                        for (int t = 0; t < nr; t++) {
                            const uint8_t *mc = dr.mask ? mrow(b, h, 0) + k0 + t : NULL;
                            if (dk) tfc_att_dkv_tile<MAXD, true>(sk[t], t1, t2, L, DL, i0, n, k0 + t, a.scale, mc, a.T, dr.scale);
                            else tfc_att_dkv_tile<MAXD, false>(sv[t], t1, t2, L, DL, i0, n, k0 + t, a.scale, mc, a.T, dr.scale);
                        }
                    }
                    for (int t = 0; t < nr; t++) {
                        float *o = dqkv + ((size_t)b * a.T + k0 + t) * a.ld + (dk ? a.C : 2 * a.C) + (size_t)h * a.D;
                        if (dk) tfc_att_dkv_end<MAXD, true>(sk[t], o, a.D, a.scale, k0 + t);
                        else tfc_att_dkv_end<MAXD, false>(sv[t], o, a.D, a.scale, k0 + t);
                    }
                }
}

static void emu_attention(float *y, float *dqkv, float *lse, float *delta, const float *dy,
                          const float *qkv, const kernel_attention_dims &d, bool forward,
                          const tfc_drop &dr = tfc_drop{1.0f, 1.0f, 0, 0, 0, NULL, NULL})
{
    if (d.head_dim <= 16) emu_att<16>(y, dqkv, lse, delta, dy, qkv, d, forward, dr);
    else if (d.head_dim <= 32) emu_att<32>(y, dqkv, lse, delta, dy, qkv, d, forward, dr);
    else if (d.head_dim <= 64) emu_att<64>(y, dqkv, lse, delta, dy, qkv, d, forward, dr);
    else emu_att<128>(y, dqkv, lse, delta, dy, qkv, d, forward, dr);
}

static void test_attention(int B, int T, int H, int D, bool keep_delta)
{
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d D=%d%s", B, T, H, D,
             keep_delta ? "" : " delta recomputed");
    const int C = H * D, ld = 3 * C;
    const kernel_attention_dims d = {B, T, H, D, ld};
    const size_t rows = (size_t)B * T;
    auto qkv = rand_v(rows * ld, -2, 2), dy = rand_v(rows * C, -1, 1);
    auto y = nan_v(rows * C), c_y = nan_v(rows * C);
    std::vector<float> probs(kernel_attention_probs_floats(&d), NAN), c_probs = probs;
    std::vector<float> work(kernel_attention_workspace_floats(&d));
    kernel_attention_forward_cpu(c_y.data(), c_probs.data(), qkv.data(), qkv.data() + C,
                                 qkv.data() + 2 * C, &d);
    emu_attention(y.data(), NULL, probs.data(), NULL, NULL, qkv.data(), d, true);
    check_close("attention_forward", shape, y.data(), c_y.data(), y.size());

    auto dqkv = nan_v(rows * ld), c_dqkv = nan_v(rows * ld);
    kernel_attention_backward_cpu(c_dqkv.data(), c_dqkv.data() + C, c_dqkv.data() + 2 * C,
                                  work.data(), dy.data(), qkv.data(), qkv.data() + C,
                                  qkv.data() + 2 * C, c_probs.data(), &d);
    float *delta = keep_delta ? tfc_attn_delta_area(probs.data(), &d) : NULL;
    emu_attention(NULL, dqkv.data(), probs.data(), delta, dy.data(), qkv.data(), d, false);
    const char *names[3] = {"attention_backward dq", "attention_backward dk",
                            "attention_backward dv"};
    check_dqkv(names, shape, dqkv.data(), c_dqkv.data(), rows, C, ld);
}

/* With the attention dropout (kernel_attention_dropout): the masks bit for bit (j ≤ i;
 * the rest is never written on either side), the output and the gradients to rounding.
 * elem_off ≠ 0 places the call's heads among a layer's (a tensor shard's); the sample ids
 * are not 0 .. B − 1, so the id's place in the counter is checked. */
static void test_attention_dropout(int B, int T, int H, int D, float p, size_t elem_off,
                                   bool keep_delta)
{
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d H=%d D=%d p=%g off=%zu%s", B, T, H, D, (double)p,
             elem_off, keep_delta ? "" : " delta recomputed");
    const int C = H * D, ld = 3 * C;
    const kernel_attention_dims d = {B, T, H, D, ld};
    const size_t rows = (size_t)B * T, np = kernel_attention_probs_floats(&d);
    auto qkv = rand_v(rows * ld, -2, 2), dy = rand_v(rows * C, -1, 1);
    std::vector<int64_t> ids(B);
    for (int b = 0; b < B; b++) ids[b] = 1000 + 7 * b + (b % 2) * ((int64_t)1 << 33);
    std::vector<uint8_t> mask(np, 7), c_mask(np, 7);
    const uint64_t seed = 0x1234567890abcdefULL, stream = kernel_block_dropout_stream(3, 0, 11);
    kernel_attention_dropout cd = {p, seed, stream, ids.data(), elem_off, c_mask.data()};
    const tfc_drop dr = {1.0f - p, 1.0f / (1.0f - p), seed, stream, elem_off, ids.data(),
                         mask.data()};
    auto y = nan_v(rows * C), c_y = nan_v(rows * C);
    std::vector<float> probs(np, NAN), c_probs = probs;
    std::vector<float> work(kernel_attention_workspace_floats(&d) +
                            kernel_attention_dropout_floats(&d));
    kernel_attention_forward_dropout_cpu(c_y.data(), c_probs.data(), work.data(), qkv.data(),
                                         qkv.data() + C, qkv.data() + 2 * C, &d, &cd);
    emu_attention(y.data(), NULL, probs.data(), NULL, NULL, qkv.data(), d, true, dr);
    size_t bad = 0, kept = 0, tri = 0;
    for (size_t bh = 0; bh < (size_t)B * H; bh++)
        for (int i = 0; i < T; i++)
            for (int j = 0; j <= i; j++) {
                const size_t at = (bh * T + i) * T + j;
                bad += mask[at] != c_mask[at];
                kept += c_mask[at] == 1;
                tri++;
            }
    record("attention dropout mask", shape, bad == 0, (double)bad);
    /* the masks drop some and keep some (a blind comparison would pass on all-ones) */
    if (tri >= 4)
        record("attention dropout mask mixed", shape, kept > 0 && kept < tri,
               (double)kept / (double)tri);
    check_close("attention_forward dropout", shape, y.data(), c_y.data(), y.size());

    auto dqkv = nan_v(rows * ld), c_dqkv = nan_v(rows * ld);
    cd.sample_ids = NULL; /* the backward reads the mask alone */
    kernel_attention_backward_dropout_cpu(c_dqkv.data(), c_dqkv.data() + C,
                                          c_dqkv.data() + 2 * C, work.data(), dy.data(),
                                          qkv.data(), qkv.data() + C, qkv.data() + 2 * C,
                                          c_probs.data(), &d, &cd);
    float *delta = keep_delta ? tfc_attn_delta_area(probs.data(), &d) : NULL;
    emu_attention(NULL, dqkv.data(), probs.data(), delta, dy.data(), qkv.data(), d, false, dr);
    const char *names[3] = {"attention_backward dropout dq", "attention_backward dropout dk",
                            "attention_backward dropout dv"};
    check_dqkv(names, shape, dqkv.data(), c_dqkv.data(), rows, C, ld);
}

/* ---- the vocabulary-parallel cross-entropy ----
 * T ranks' shards of R rows of V logits through the three steps (the all-gathers between
 * them as copies, rank by rank), against the whole row's kernel_softmax_xent_cpu: the loss
 * and the gradient to rounding (the sums of exponentials are cut), the hits exactly, and
 * every rank's loss and hits the same bits. Ties across ranks (the first rank's index
 * wins, the whole row's first argmax) and a label outside the vocabulary (NaN) included. */
static void test_xent_shard(int R, int V, int T, bool grad)
{
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d V=%d T=%d%s", R, V, T, grad ? "" : " no grad");
    auto x = rand_v((size_t)R * V, -4, 4);
    std::vector<int32_t> lab(R);
    for (int i = 0; i < R; i++) lab[i] = (int32_t)urand(0, (float)V);
    if (R > 3) { /* row 1: its largest value twice, on the first and the last rank */
        x[(size_t)V + 0] = 9.0f;
        x[(size_t)V + V - 1] = 9.0f;
        lab[1] = V - 1; /* not the first argmax: a miss */
        lab[2] = (int32_t)(x[2 * (size_t)V] = 9.5f, 0); /* a hit at column 0 */
    }
    std::vector<float> c_d((size_t)R * V, NAN);
    int c_right = 0;
    const double c_loss = kernel_softmax_xent_cpu(grad ? c_d.data() : NULL, &c_right, x.data(),
                                                  lab.data(), R, V, 0.25f);
    std::vector<int> first(T), width(T);
    for (int r = 0; r < T; r++) {
        first[r] = (int)((long)V * r / T);
        width[r] = (int)((long)V * (r + 1) / T) - first[r];
    }
    std::vector<std::vector<float>> xs(T), ds(T), mas(T);
    std::vector<float> all1((size_t)T * 2 * R), all2((size_t)T * 3 * R);
    for (int r = 0; r < T; r++) {
        xs[r].resize((size_t)R * width[r]);
        ds[r].assign((size_t)R * width[r], NAN);
        mas[r].resize(2 * (size_t)R);
        for (int i = 0; i < R; i++)
            for (int j = 0; j < width[r]; j++)
                xs[r][(size_t)i * width[r] + j] = x[(size_t)i * V + first[r] + j];
        for (int i = 0; i < R; i++) /* step 1, gathered into rank r's block */
            tfc_xs_max(&all1[(size_t)r * 2 * R + 2 * i], &xs[r][(size_t)i * width[r]], width[r],
                       first[r]);
    }
    for (int r = 0; r < T; r++)
        for (int i = 0; i < R; i++) {
            tfc_xs_argmax(&mas[r][2 * i], &mas[r][2 * i + 1], all1.data(), (size_t)R, (size_t)i, T);
            tfc_xs_sums(&all2[(size_t)r * 3 * R + 3 * i],
                        grad ? &ds[r][(size_t)i * width[r]] : NULL, &xs[r][(size_t)i * width[r]],
                        width[r], first[r], mas[r][2 * i], lab[i]);
        }
    std::vector<double> loss(T, 0.0);
    std::vector<int> right(T, 0);
    for (int r = 0; r < T; r++)
        for (int i = 0; i < R; i++) {
            int h = 0;
            loss[r] += tfc_xs_finish(grad ? &ds[r][(size_t)i * width[r]] : NULL, &h, all2.data(),
                                     (size_t)R, (size_t)i, T, mas[r][2 * i], mas[r][2 * i + 1],
                                     lab[i], first[r], width[r], V, 0.25f);
            right[r] += h;
        }
    bool same = true;
    for (int r = 1; r < T; r++)
        same = same && memcmp(&loss[r], &loss[0], sizeof(double)) == 0 && right[r] == right[0];
    record("xent_shard ranks agree", shape, same, 0);
    const double err = fabs(loss[0] - c_loss) / fmax(fabs(c_loss), 1e-30);
    record("xent_shard loss", shape, err <= 1e-5, err);
    record("xent_shard correct", shape, right[0] == c_right, right[0] - c_right);
    if (grad) {
        std::vector<float> d((size_t)R * V);
        for (int r = 0; r < T; r++)
            for (int i = 0; i < R; i++)
                for (int j = 0; j < width[r]; j++)
                    d[(size_t)i * V + first[r] + j] = ds[r][(size_t)i * width[r] + j];
        check_close("xent_shard dlogits", shape, d.data(), c_d.data(), d.size());
    }
    /* a label outside the vocabulary: the loss is NaN on every rank */
    lab[0] = V;
    int h;
    const double bad = tfc_xs_finish(NULL, &h, all2.data(), (size_t)R, 0, T, mas[0][0],
                                     mas[0][1], lab[0], first[0], width[0], V, 1.0f);
    record("xent_shard bad label NaN", shape, isnan(bad), 0);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_layernorm(1, 1, 0.0f);
    test_layernorm(7, 33, 0.0f);
    test_layernorm(5, 16, 0.0f);
    test_layernorm(13, 100, 50.0f); /* far from zero: the two-pass variance */
    test_layernorm(32, 768, 0.0f);
    test_gelu(1, 1.0f);
    test_gelu(1000, 3.0f);
    test_gelu(4099, 12.0f);
    test_embedding(1, 1, 1, 5, 0, 5, false, true);
    test_embedding(3, 7, 5, 4, 0, 4, false, true);     /* many repeats of each token */
    test_embedding(4, 130, 9, 11, 0, 11, false, true); /* chunks of 256 rows end mid-sample */
    test_embedding(2, 33, 17, 300, 0, 300, false, true);
    test_embedding(3, 9, 6, 10, 0, 4, true, true);     /* shard 0 of a vocabulary of 10 */
    test_embedding(3, 9, 6, 10, 4, 6, true, false);    /* the next: no positions */
    test_embedding(5, 61, 3, 7, 2, 3, true, false);
    test_attention(1, 1, 1, 1, true);
    test_attention(2, 1, 2, 8, true);
    test_attention(2, 5, 3, 4, true);
    test_attention(2, 5, 3, 4, false);
    test_attention(1, 33, 2, 16, true);
    test_attention(3, 70, 1, 7, true); /* crosses the CPU's blocks of 64 queries */
    test_attention(1, 19, 2, 64, false);
    test_attention(1, 9, 1, 128, true);
    test_attention(2, 130, 2, 64, true);  /* three query blocks, key tiles of 64 */
    test_attention(1, 70, 1, 100, true);  /* D past 64: tiles of 32 rows, padded to 128 */
    test_attention(1, 65, 3, 20, false);  /* D 20 padded to 32; Δ recomputed while staging */
    test_attention_dropout(1, 1, 1, 4, 0.5f, 0, false); /* seq 1: Δ recomputed */
    test_attention_dropout(2, 5, 3, 4, 0.1f, 0, true);
    test_attention_dropout(2, 33, 2, 16, 0.3f, 0, true);
    test_attention_dropout(3, 70, 1, 7, 0.2f, 0, true);  /* crosses the CPU's blocks of 64 */
    test_attention_dropout(2, 19, 2, 64, 0.1f, 2 * 19 * 19, false); /* heads 2, 3 of a shard */
    test_attention_dropout(1, 130, 2, 20, 0.5f, 3 * 130 * 130, true); /* key tiles of 64 */
    test_xent_shard(1, 5, 1, true);
    test_xent_shard(7, 10, 2, true);
    test_xent_shard(33, 256, 2, true);
    test_xent_shard(40, 257, 3, true); /* uneven cuts */
    test_xent_shard(9, 1031, 4, false);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
