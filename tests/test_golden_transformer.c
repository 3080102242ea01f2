/* The transformer CPU kernels against PyTorch 1.13 (tests/golden/transformer.bin, written by
 * experiments/golden/make_golden.py): layer norm, GELU (tanh), causal attention, embedding
 * and the language-model cross-entropy computed by torch in float64 from the stored float32
 * inputs, and three AdamW steps run by torch in float32. */
#include "kernels/kernels.h"
#include "tests/check.h"
#include "tests/golden_reader.h"

#include <stdint.h>
#include <stdio.h>

Test(golden_transformer, layernorm)
{
    golden_file g;
    golden_open(&g, "transformer.bin");
    int32_t *dm = golden_ints(&g, "ln.dims", 2);
    const int rows = dm[0], width = dm[1];
    const size_t n = (size_t)rows * width;
    float *x = golden_floats(&g, "ln.x", n), *gamma = golden_floats(&g, "ln.gamma", width);
    float *beta = golden_floats(&g, "ln.beta", width), *out_ref = golden_floats(&g, "ln.out", n);
    float *mean_ref = golden_floats(&g, "ln.mean", rows);
    float *rstd_ref = golden_floats(&g, "ln.rstd", rows);
    float *dout = golden_floats(&g, "ln.dout", n), *dx_ref = golden_floats(&g, "ln.dx", n);
    float *dg_ref = golden_floats(&g, "ln.dgamma", width);
    float *db_ref = golden_floats(&g, "ln.dbeta", width);
    float *out = malloc(n * sizeof *out), *mean = malloc(rows * sizeof *mean);
    float *rstd = malloc(rows * sizeof *rstd), *dx = malloc(n * sizeof *dx);
    float *dg = calloc(width, sizeof *dg), *db = calloc(width, sizeof *db);

    kernel_layernorm_forward_cpu(out, mean, rstd, x, gamma, beta, rows, width);
    CHECK_CLOSE("ln out", out, out_ref, n, 1e-6, 1e-5);
    CHECK_CLOSE("ln mean", mean, mean_ref, rows, 1e-7, 1e-6);
    CHECK_CLOSE("ln rstd", rstd, rstd_ref, rows, 0, 1e-6);
    kernel_layernorm_backward_cpu(dx, dg, db, dout, x, mean, rstd, gamma, rows, width);
    CHECK_CLOSE("ln dx", dx, dx_ref, n, 1e-5, 1e-5);
    CHECK_CLOSE("ln dgamma", dg, dg_ref, width, 1e-6, 1e-5);
    CHECK_CLOSE("ln dbeta", db, db_ref, width, 1e-6, 1e-5);

    free(dm); free(x); free(gamma); free(beta); free(out_ref); free(mean_ref); free(rstd_ref);
    free(dout); free(dx_ref); free(dg_ref); free(db_ref); free(out); free(mean); free(rstd);
    free(dx); free(dg); free(db);
    golden_free(&g);
}

Test(golden_transformer, gelu_tanh)
{
    golden_file g;
    golden_open(&g, "transformer.bin");
    const size_t n = golden_count(&g, "gelu.x");
    float *x = golden_floats(&g, "gelu.x", n), *out_ref = golden_floats(&g, "gelu.out", n);
    float *dout = golden_floats(&g, "gelu.dout", n), *din_ref = golden_floats(&g, "gelu.din", n);
    float *out = malloc(n * sizeof *out), *din = malloc(n * sizeof *din);
    kernel_gelu_forward_cpu(out, x, n);
    /* Within an ulp or two, the tail x ≪ 0 included (the kernel's x·σ(2u) form does not
     * cancel there, as torch's float x/2·(1 + tanh u) would). */
    CHECK_CLOSE("gelu out", out, out_ref, n, 1e-7, 2e-6);
    kernel_gelu_backward_cpu(din, dout, x, n);
    /* atol: the derivative's two terms cancel near its zero, x ≈ −0.75. */
    CHECK_CLOSE("gelu din", din, din_ref, n, 3e-7, 2e-6);
    free(x); free(out_ref); free(dout); free(din_ref); free(out); free(din);
    golden_free(&g);
}

/* One attention case: q, k, v as separate [tokens, heads·head_dim] tensors. */
static void golden_attention_case(const golden_file *g, const char *name)
{
    char key[64];
#define KEY(suffix) (snprintf(key, sizeof key, "attn.%s.%s", name, suffix), key)
    int32_t *dm = golden_ints(g, KEY("dims"), 4);
    const kernel_attention_dims d = {.batch = dm[0], .seq = dm[1], .heads = dm[2],
                                     .head_dim = dm[3], .qkv_stride = dm[2] * dm[3]};
    const size_t n = (size_t)d.batch * d.seq * d.heads * d.head_dim;
    const size_t np = kernel_attention_probs_floats(&d);
    float *q = golden_floats(g, KEY("q"), n), *k = golden_floats(g, KEY("k"), n);
    float *v = golden_floats(g, KEY("v"), n), *y_ref = golden_floats(g, KEY("out"), n);
    float *dy = golden_floats(g, KEY("dout"), n), *dq_ref = golden_floats(g, KEY("dq"), n);
    float *dk_ref = golden_floats(g, KEY("dk"), n), *dv_ref = golden_floats(g, KEY("dv"), n);
    float *y = malloc(n * sizeof *y), *probs = malloc(np * sizeof *probs);
    float *work = malloc(kernel_attention_workspace_floats(&d) * sizeof *work);
    float *dq = malloc(n * sizeof *dq), *dk = malloc(n * sizeof *dk), *dv = malloc(n * sizeof *dv);

    kernel_attention_forward_cpu(y, probs, q, k, v, &d);
    CHECK_CLOSE(key, y, y_ref, n, 1e-6, 1e-5);
    if (d.seq < 10) { /* the file holds the small case's probabilities */
        float *p_ref = golden_floats(g, KEY("probs"), np);
        for (size_t bh = 0; bh < (size_t)d.batch * d.heads; bh++)
            for (int i = 0; i < d.seq; i++) { /* the lower triangle: above it is unspecified */
                const size_t row = (bh * d.seq + i) * d.seq;
                CHECK_CLOSE(key, probs + row, p_ref + row, (size_t)i + 1, 1e-7, 1e-5);
            }
        free(p_ref);
    }
    kernel_attention_backward_cpu(dq, dk, dv, work, dy, q, k, v, probs, &d);
    CHECK_CLOSE(KEY("dq"), dq, dq_ref, n, 1e-5, 1e-5);
    CHECK_CLOSE(KEY("dk"), dk, dk_ref, n, 1e-5, 1e-5);
    CHECK_CLOSE(KEY("dv"), dv, dv_ref, n, 1e-5, 1e-5);
#undef KEY
    free(dm); free(q); free(k); free(v); free(y_ref); free(dy); free(dq_ref); free(dk_ref);
    free(dv_ref); free(y); free(probs); free(work); free(dq); free(dk); free(dv);
}

Test(golden_transformer, causal_attention)
{
    golden_file g;
    golden_open(&g, "transformer.bin");
    golden_attention_case(&g, "a"); /* 2 samples, 5 tokens, 3 heads of 4 */
    golden_attention_case(&g, "b"); /* 70 tokens: two blocks of queries */
    golden_free(&g);
}

Test(golden_transformer, embedding)
{
    golden_file g;
    golden_open(&g, "transformer.bin");
    int32_t *dm = golden_ints(&g, "emb.dims", 5);
    const int batch = dm[0], seq = dm[1], width = dm[2], vocab = dm[3], ctx = dm[4];
    const size_t n = (size_t)batch * seq * width;
    int32_t *tok = golden_ints(&g, "emb.tokens", (size_t)batch * seq);
    float *wte = golden_floats(&g, "emb.wte", (size_t)vocab * width);
    float *wpe = golden_floats(&g, "emb.wpe", (size_t)ctx * width);
    float *out_ref = golden_floats(&g, "emb.out", n), *dout = golden_floats(&g, "emb.dout", n);
    float *dwte_ref = golden_floats(&g, "emb.dwte", (size_t)vocab * width);
    float *dwpe_ref = golden_floats(&g, "emb.dwpe", (size_t)ctx * width);
    float *out = malloc(n * sizeof *out);
    float *dwte = calloc((size_t)vocab * width, sizeof *dwte);
    float *dwpe = calloc((size_t)ctx * width, sizeof *dwpe);
    kernel_embedding_forward_cpu(out, tok, wte, wpe, batch, seq, width, vocab);
    CHECK_CLOSE("emb out", out, out_ref, n, 1e-7, 1e-6);
    kernel_embedding_backward_cpu(dwte, dwpe, dout, tok, batch, seq, width, vocab);
    CHECK_CLOSE("emb dwte", dwte, dwte_ref, (size_t)vocab * width, 1e-7, 1e-6);
    CHECK_CLOSE("emb dwpe", dwpe, dwpe_ref, (size_t)ctx * width, 1e-7, 1e-6);
    free(dm); free(tok); free(wte); free(wpe); free(out_ref); free(dout); free(dwte_ref);
    free(dwpe_ref); free(out); free(dwte); free(dwpe);
    golden_free(&g);
}

/* F.cross_entropy's mean over positions: the sum over the N positions / N, with
 * grad_scale 1/N. */
Test(golden_transformer, lm_cross_entropy)
{
    golden_file g;
    golden_open(&g, "transformer.bin");
    int32_t *dm = golden_ints(&g, "xent.dims", 2);
    const int n = dm[0], vocab = dm[1];
    float *logits = golden_floats(&g, "xent.logits", (size_t)n * vocab);
    int32_t *targets = golden_ints(&g, "xent.targets", n);
    float *loss64 = golden_floats(&g, "xent.loss_hi_lo", 2);
    float *dl_ref = golden_floats(&g, "xent.dlogits", (size_t)n * vocab);
    float *dl = malloc((size_t)n * vocab * sizeof *dl);
    const double sum = kernel_softmax_xent_cpu(dl, NULL, logits, targets, n, vocab, 1.0f / n);
    const double mean = sum / n, ref = (double)loss64[0] + (double)loss64[1];
    cr_expect(fabs(mean - ref) <= 1e-6 * fabs(ref), "mean loss %.12g, torch %.12g", mean, ref);
    CHECK_CLOSE("xent dlogits", dl, dl_ref, (size_t)n * vocab, 1e-9, 1e-5);
    free(dm); free(logits); free(targets); free(loss64); free(dl_ref); free(dl);
    golden_free(&g);
}

/* Three steps of torch.optim.AdamW (weight decay 0.1): parameters after every step and the
 * final moments within about an ulp. */
Test(golden_transformer, adamw)
{
    golden_file g;
    golden_open(&g, "transformer.bin");
    const size_t count = golden_count(&g, "adamw.p0");
    const int steps = 3;
    float *p = golden_floats(&g, "adamw.p0", count);
    float *grads = golden_floats(&g, "adamw.grads", steps * count);
    float *hp = golden_floats(&g, "adamw.hyper", 5);
    float *ref = golden_floats(&g, "adamw.params", steps * count);
    float *m_ref = golden_floats(&g, "adamw.m", count);
    float *v_ref = golden_floats(&g, "adamw.v", count);
    float *m = calloc(count, sizeof *m), *v = calloc(count, sizeof *v);
    for (int t = 0; t < steps; t++) {
        kernel_adamw_update_cpu(p, m, v, grads + (size_t)t * count, count, hp[0], hp[1], hp[2],
                                hp[3], hp[4], t + 1);
        char what[32];
        snprintf(what, sizeof what, "adamw step %d", t + 1);
        CHECK_CLOSE(what, p, ref + (size_t)t * count, count, 1e-12, 1e-6);
    }
    CHECK_CLOSE("adamw m", m, m_ref, count, 1e-30, 1e-6);
    CHECK_CLOSE("adamw v", v, v_ref, count, 1e-30, 1e-6);
    free(p); free(grads); free(hp); free(ref); free(m_ref); free(v_ref); free(m); free(v);
    golden_free(&g);
}
