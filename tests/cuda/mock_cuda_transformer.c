/* Part of tests/cuda/mock_cuda.c (#included at its end, whose ops, memory checks and
 * scheduling it uses): the mock's twins of kernels/cuda/transformer.cu and of the many-block
 * loss, each the CPU kernel as the CPU's layer_kernels set calls it. */
/* ---- transformer layers: the CPU twins (kernels/kernels_transformer.h), as the CPU's
 * layer_kernels set calls them, so the mock engine's bits are the CPU engine's ---- */
int kernel_softmax_xent_rows_cuda(float *dlogits, int *correct, double *loss_sum,
                                  const float *logits, const int32_t *labels, int n,
                                  int classes, float grad_scale, double *part_loss,
                                  int *part_right, const kernel_cuda_ctx *ctx)
{
    need_dev(part_loss, "xent part_loss"); need_dev(part_right, "xent part_right");
    return kernel_softmax_xent_cuda(dlogits, correct, loss_sum, logits, labels, n, classes,
                                    grad_scale, ctx);
}
static void r_lnf(op *o)
{
    kernel_layernorm_forward_cpu(o->p[0], o->p[1], o->p[2], o->p[3], o->p[4], o->p[5], o->i[0], o->i[1]);
}
int kernel_layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *x,
                                  const float *gamma, const float *beta, int rows, int width,
                                  const kernel_cuda_ctx *ctx)
{
    need_dev(out, "ln out"); need_dev(mean, "ln mean"); need_dev(rstd, "ln rstd"); need_dev(x, "ln x");
    need_dev(gamma, "ln gamma"); need_dev(beta, "ln beta");
    KOP(r_lnf);
    o->p[0] = out; o->p[1] = mean; o->p[2] = rstd; o->p[3] = (void *)x; o->p[4] = (void *)gamma;
    o->p[5] = (void *)beta; o->i[0] = rows; o->i[1] = width;
    DONE();
}
static void r_lnb(op *o)
{
    kernel_layernorm_backward_cpu(o->p[0], o->p[1], o->p[2], o->p[3], o->p[4], o->p[5], o->p[6], o->p[7], o->i[0], o->i[1]);
}
int kernel_layernorm_backward_cuda(float *dx, float *dgamma, float *dbeta, const float *dy,
                                   const float *x, const float *mean, const float *rstd,
                                   const float *gamma, int rows, int width,
                                   const kernel_cuda_ctx *ctx)
{
    need_dev(dx, "ln dx"); need_dev(dgamma, "ln dgamma"); need_dev(dbeta, "ln dbeta"); need_dev(dy, "ln dy");
    need_dev(x, "ln x"); need_dev(mean, "ln mean"); need_dev(rstd, "ln rstd"); need_dev(gamma, "ln gamma");
    KOP(r_lnb);
    o->p[0] = dx; o->p[1] = dgamma; o->p[2] = dbeta; o->p[3] = (void *)dy; o->p[4] = (void *)x;
    o->p[5] = (void *)mean; o->p[6] = (void *)rstd; o->p[7] = (void *)gamma; o->i[0] = rows; o->i[1] = width;
    DONE();
}
static void r_gelf(op *o) { kernel_gelu_forward_cpu(o->p[0], o->p[1], o->z[0]); }
int kernel_gelu_forward_cuda(float *out, const float *in, size_t count, const kernel_cuda_ctx *ctx)
{
    need_dev(out, "gelu out"); need_dev(in, "gelu in");
    KOP(r_gelf);
    o->p[0] = out; o->p[1] = (void *)in; o->z[0] = count;
    DONE();
}
static void r_gelb(op *o) { kernel_gelu_backward_cpu(o->p[0], o->p[1], o->p[2], o->z[0]); }
int kernel_gelu_backward_cuda(float *din, const float *dout, const float *in, size_t count,
                              const kernel_cuda_ctx *ctx)
{
    need_dev(din, "gelu din"); need_dev(dout, "gelu dout"); need_dev(in, "gelu in");
    KOP(r_gelb);
    o->p[0] = din; o->p[1] = (void *)dout; o->p[2] = (void *)in; o->z[0] = count;
    DONE();
}
/* Ids as rows of a table of tokens [first, first + vocab), −1 outside (layer_kernels_cpu.c). */
static void m_token_rows(int32_t *tok, const float *ids, size_t count, int first, int vocab)
{
    for (size_t i = 0; i < count; i++)
        tok[i] = ids[i] >= (float)first && ids[i] < (float)first + (float)vocab
                     ? (int32_t)ids[i] - first : -1;
}
/* i[4]: 1 the whole table, 0 a shard (whose forward is the CPU set's loop) */
static void r_embf(op *o)
{
    float *out = o->p[0];
    int32_t *tok = o->p[1];
    const float *ids = o->p[2], *wte = o->p[3], *wpe = o->p[4];
    int n = o->i[0], seq = o->i[1], width = o->i[2], first = o->i[3], vocab = o->i[5];
    size_t rows = (size_t)n * seq;
    m_token_rows(tok, ids, rows, first, vocab);
    if (o->i[4]) {
        kernel_embedding_forward_cpu(out, tok, wte, wpe, n, seq, width, vocab);
        return;
    }
    for (size_t r = 0; r < rows; r++) {
        float *y = out + r * width;
        const float *e = tok[r] >= 0 ? wte + (size_t)tok[r] * width : NULL;
        const float *p = wpe ? wpe + (r % (size_t)seq) * width : NULL;
        for (int j = 0; j < width; j++) y[j] = e && p ? e[j] + p[j] : e ? e[j] : p ? p[j] : 0.0f;
    }
}
static int m_embf(float *out, int32_t *tok, const float *ids, const float *wte, const float *wpe,
                  int n, int seq, int width, int first, int vocab, int whole,
                  const kernel_cuda_ctx *ctx)
{
    need_dev(out, "emb out"); need_dev(tok, "emb tok"); need_dev(ids, "emb ids");
    need_dev(wte, "emb wte"); need_dev(wpe, "emb wpe");
    KOP(r_embf);
    o->p[0] = out; o->p[1] = tok; o->p[2] = (void *)ids; o->p[3] = (void *)wte; o->p[4] = (void *)wpe;
    o->i[0] = n; o->i[1] = seq; o->i[2] = width; o->i[3] = first; o->i[4] = whole; o->i[5] = vocab;
    DONE();
}
int kernel_embedding_forward_cuda(float *out, int32_t *tok, const float *ids, const float *wte,
                                  const float *wpe, int n, int seq, int width, int vocab,
                                  const kernel_cuda_ctx *ctx)
{
    return m_embf(out, tok, ids, wte, wpe, n, seq, width, 0, vocab, 1, ctx);
}
int kernel_embedding_shard_forward_cuda(float *out, int32_t *tok, const float *ids,
                                        const float *wte, const float *wpe, int n, int seq,
                                        int width, int first, int vocab,
                                        const kernel_cuda_ctx *ctx)
{
    return m_embf(out, tok, ids, wte, wpe, n, seq, width, first, vocab, 0, ctx);
}
static void r_embb(op *o)
{
    int n = o->i[0], seq = o->i[1], width = o->i[2], first = o->i[3], vocab = o->i[4];
    m_token_rows(o->p[2], o->p[4], (size_t)n * seq, first, vocab);
    kernel_embedding_backward_cpu(o->p[0], o->p[1], o->p[3], o->p[2], n, seq, width, vocab);
}
int kernel_embedding_shard_backward_cuda(float *dwte, float *dwpe, int32_t *tok,
                                         const float *dout, const float *ids, int n, int seq,
                                         int width, int first, int vocab,
                                         const kernel_cuda_ctx *ctx)
{
    need_dev(dwte, "emb dwte"); need_dev(dwpe, "emb dwpe"); need_dev(tok, "emb tok");
    need_dev(dout, "emb dout"); need_dev(ids, "emb ids");
    KOP(r_embb);
    o->p[0] = dwte; o->p[1] = dwpe; o->p[2] = tok; o->p[3] = (void *)dout; o->p[4] = (void *)ids;
    o->i[0] = n; o->i[1] = seq; o->i[2] = width; o->i[3] = first; o->i[4] = vocab;
    DONE();
}
int kernel_embedding_backward_cuda(float *dwte, float *dwpe, int32_t *tok, const float *dout,
                                   const float *ids, int n, int seq, int width, int vocab,
                                   const kernel_cuda_ctx *ctx)
{
    return kernel_embedding_shard_backward_cuda(dwte, dwpe, tok, dout, ids, n, seq, width, 0,
                                                vocab, ctx);
}
static kernel_attention_dims m_attn_dims(const op *o)
{
    return (kernel_attention_dims){o->i[0], o->i[1], o->i[2], o->i[3], o->i[4]};
}
static void m_attn_put(op *o, const kernel_attention_dims *d)
{
    o->i[0] = d->batch; o->i[1] = d->seq; o->i[2] = d->heads; o->i[3] = d->head_dim; o->i[4] = d->qkv_stride;
}
/* The attention dropout into the op (p[4] its mask, p[5] the sample ids; f[0] = 0: none)
 * and back out: the CPU kernel reads the ids and writes the mask when the op runs, as the
 * device kernel would. */
static void m_attn_drop_put(op *o, const kernel_attention_dropout *drop)
{
    int on = drop && drop->p > 0.0f;
    o->f[0] = on ? drop->p : 0.0f;
    o->p[4] = on ? drop->mask : NULL;
    o->p[5] = on ? (void *)drop->sample_ids : NULL;
    o->u[0] = on ? drop->seed : 0;
    o->u[1] = on ? drop->stream : 0;
    o->z[0] = on ? drop->elem_off : 0;
}
static const kernel_attention_dropout *m_attn_drop(const op *o, kernel_attention_dropout *dr)
{
    if (o->f[0] <= 0.0f) return NULL;
    *dr = (kernel_attention_dropout){.p = o->f[0], .seed = o->u[0], .stream = o->u[1],
                                     .sample_ids = o->p[5], .elem_off = o->z[0],
                                     .mask = o->p[4]};
    return dr;
}
static int m_attn_drop_check(const kernel_attention_dropout *drop, int forward)
{
    if (!drop || drop->p <= 0.0f) return 0;
    need_dev(drop->mask, "attn dropout mask");
    if (forward) need_dev(drop->sample_ids, "attn dropout ids");
    if (!drop->mask || (forward && !drop->sample_ids)) die("attention dropout without mask or ids");
    return 0;
}
/* The CPU kernels' scratch is host memory of the op's own (the device kernels need none). */
static float *m_attn_work(const kernel_attention_dims *d, int backward)
{
    size_t n = kernel_attention_dropout_floats(d) +
               (backward ? kernel_attention_workspace_floats(d) : 0);
    float *w = malloc(n * sizeof(float));
    if (!w) die("attention scratch");
    return w;
}
static void r_attf(op *o)
{
    kernel_attention_dims d = m_attn_dims(o);
    kernel_attention_dropout dr;
    size_t C = (size_t)d.heads * d.head_dim;
    const float *qkv = o->p[2];
    float *work = m_attn_work(&d, 0);
    kernel_attention_forward_dropout_cpu(o->p[0], o->p[1], work, qkv, qkv + C, qkv + 2 * C, &d,
                                         m_attn_drop(o, &dr));
    free(work);
}
int kernel_attention_forward_cuda(float *y, float *probs, const float *qkv,
                                  const kernel_attention_dims *d,
                                  const kernel_attention_dropout *drop,
                                  const kernel_cuda_ctx *ctx)
{
    if (m_attn_drop_check(drop, 1)) return -1;
    need_dev(y, "attn y"); need_dev(probs, "attn probs"); need_dev(qkv, "attn qkv");
    KOP(r_attf);
    o->p[0] = y; o->p[1] = probs; o->p[2] = (void *)qkv;
    m_attn_put(o, d);
    m_attn_drop_put(o, drop);
    DONE();
}
static void r_attb(op *o)
{
    kernel_attention_dims d = m_attn_dims(o);
    kernel_attention_dropout dr;
    size_t C = (size_t)d.heads * d.head_dim;
    float *dqkv = o->p[0], *work = m_attn_work(&d, 1);
    const float *qkv = o->p[2];
    kernel_attention_backward_dropout_cpu(dqkv, dqkv + C, dqkv + 2 * C, work, o->p[3], qkv,
                                          qkv + C, qkv + 2 * C, o->p[1], &d, m_attn_drop(o, &dr));
    free(work);
}
int kernel_attention_backward_cuda(float *dqkv, float *probs, const float *dy, const float *qkv,
                                   const kernel_attention_dims *d,
                                   const kernel_attention_dropout *drop,
                                   const kernel_cuda_ctx *ctx)
{
    if (m_attn_drop_check(drop, 0)) return -1;
    need_dev(dqkv, "attn dqkv"); need_dev(probs, "attn probs"); need_dev(dy, "attn dy");
    need_dev(qkv, "attn qkv");
    KOP(r_attb);
    o->p[0] = dqkv; o->p[1] = probs; o->p[2] = (void *)qkv; o->p[3] = (void *)dy;
    m_attn_put(o, d);
    m_attn_drop_put(o, drop);
    DONE();
}
/* ---- the vocabulary-parallel loss: the CPU stage's phases (kernel_xent_shard_*_cpu), so
 * the mock engine's bits are the CPU engine's ---- */
static void r_xsmax(op *o)
{
    kernel_xent_shard_max_cpu(o->p[0], o->p[1], o->i[0], o->i[1], o->i[2]);
}
int kernel_xent_shard_max_cuda(float *mine, const float *logits, int rows, int Vr, int first,
                               const kernel_cuda_ctx *ctx)
{
    need_dev(mine, "xs mine"); need_dev(logits, "xs logits");
    if (rows < 0 || Vr < 1) return pt_error_set("vocabulary-parallel loss: invalid sizes");
    KOP(r_xsmax);
    o->p[0] = mine; o->p[1] = (void *)logits; o->i[0] = rows; o->i[1] = Vr; o->i[2] = first;
    DONE();
}
static void r_xssums(op *o)
{
    kernel_xent_shard_sums_cpu(o->p[0], o->p[1], o->p[2], o->p[3], o->p[4], o->p[5], o->i[0],
                               o->i[1], o->i[2], o->i[3]);
}
int kernel_xent_shard_sums_cuda(float *mine, float *dlogits, float *ma, const float *all,
                                const float *logits, const int32_t *labels, int rows, int Vr,
                                int first, int T, const kernel_cuda_ctx *ctx)
{
    need_dev(mine, "xs mine"); need_dev(dlogits, "xs dlogits"); need_dev(ma, "xs ma");
    need_dev(all, "xs all"); need_dev(logits, "xs logits"); need_dev(labels, "xs labels");
    /* dlogits may be the logits (the last stage's loss gradient in their place): every row's
     * target logit is read before the row is written, as in tfc_xs_sums */
    KOP(r_xssums);
    o->p[0] = mine; o->p[1] = dlogits; o->p[2] = ma; o->p[3] = (void *)all;
    o->p[4] = (void *)logits; o->p[5] = (void *)labels;
    o->i[0] = rows; o->i[1] = Vr; o->i[2] = first; o->i[3] = T;
    DONE();
}
static void r_xsfin(op *o)
{
    double loss = kernel_xent_shard_finish_cpu(o->p[0], o->p[1], o->p[3], o->p[4], o->p[5],
                                               o->i[0], o->i[1], o->i[2], o->i[3], o->i[4],
                                               o->f[0]);
    if (o->p[2]) *(double *)o->p[2] = loss;
}
int kernel_xent_shard_finish_cuda(float *dlogits, int *correct, double *loss_sum,
                                  const float *all, const float *ma, const int32_t *labels,
                                  int rows, int Vr, int first, int V, int T, float grad_scale,
                                  double *row_loss, int *row_right, const kernel_cuda_ctx *ctx)
{
    need_dev(dlogits, "xs dlogits"); need_dev(correct, "xs correct"); need_dev(loss_sum, "xs loss");
    need_dev(all, "xs all"); need_dev(ma, "xs ma"); need_dev(labels, "xs labels");
    need_dev(row_loss, "xs row_loss"); need_dev(row_right, "xs row_right");
    if (first + Vr > V) return pt_error_set("vocabulary-parallel loss: columns outside the vocabulary");
    KOP(r_xsfin);
    o->p[0] = dlogits; o->p[1] = correct; o->p[2] = loss_sum; o->p[3] = (void *)all;
    o->p[4] = (void *)ma; o->p[5] = (void *)labels;
    o->i[0] = rows; o->i[1] = Vr; o->i[2] = first; o->i[3] = V; o->i[4] = T; o->f[0] = grad_scale;
    DONE();
}
