/* The transformer block's entry in the layer table (src/engine/layer_ops.h): GPT-2's
 * pre-norm block, x1 = x + attn(ln_1(x)), out = x1 + mlp(ln_2(x1)), whole, cut by heads
 * (in phases between the group's all-reduces), or with sequence parallelism (in phases
 * between all-gathers and reduce-scatters), with dropout at GPT-2's three sites and
 * batched weight gradients. */
#include "src/engine/layer_call.h"

#include <string.h>

#include "kernels/rng.h"

/* A block's parameters, activations and gradients as pointers: C its width, A its
 * attention width (C, or a shard's heads' columns) and H its hidden units (a shard's). */
typedef struct {
    int N, C, A, H;
    int M; /* rows of the rank's positions: N, or N / seq with sequence parallelism */
    const float *Wattn, *Waproj, *Wfc, *Wmproj, *g1, *b1, *battn, *baproj, *g2, *b2, *bfc,
        *bmproj;
    float *ln1, *qkv, *y, *x1, *ln2, *fc, *gel, *mean1, *rstd1, *mean2, *rstd2, *probs;
    kernel_attention_dims d;
    /* dropout (drops: the forward dropped, io->mask given; p > 0): the masks of the
     * attention probabilities, attention c_proj's output and the MLP c_proj's output */
    int drops;
    float p;
    uint8_t *mask_attn, *mask_a, *mask_m;
    size_t gout_per_token; /* layer_gout_floats / T */
} block_view;

static block_view block_of(const layer_call *c)
{
    const layer_desc *L = c->L;
    block_view v;
    size_t C = (size_t)L->in.w, H = (size_t)L->u.block.hidden;
    size_t M = (size_t)c->n * (size_t)L->in.c, T = (size_t)L->in.c * (size_t)layer_block_seq(L);
    size_t A = layer_block_attn_width(L), N = (size_t)c->n * T;
    v.N = (int)N;
    v.M = (int)M;
    v.C = (int)C;
    v.A = (int)A;
    v.H = (int)H;
    const float *w = c->io->w;
    v.Wattn = w;
    v.Waproj = v.Wattn + 3 * A * C;
    v.Wfc = v.Waproj + C * A;
    v.Wmproj = v.Wfc + H * C;
    v.g1 = v.Wmproj + C * H;
    v.b1 = v.g1 + C;
    v.battn = v.b1 + C;
    v.baproj = v.battn + 3 * A;
    v.g2 = v.baproj + C;
    v.b2 = v.g2 + C;
    v.bfc = v.b2 + C;
    v.bmproj = v.bfc + H;
    float *s = c->io->saved;
    v.ln1 = s;
    v.qkv = v.ln1 + M * C;
    v.y = v.qkv + N * 3 * A;
    v.x1 = v.y + N * A;
    v.ln2 = v.x1 + M * C;
    v.fc = v.ln2 + M * C;
    v.gel = v.fc + N * H;
    v.mean1 = v.gel + N * H;
    v.rstd1 = v.mean1 + M;
    v.mean2 = v.rstd1 + M;
    v.rstd2 = v.mean2 + M;
    v.probs = v.rstd2 + M;
    v.d = (kernel_attention_dims){.batch = c->n, .seq = (int)T, .heads = L->u.block.heads,
                                  .head_dim = (int)A / L->u.block.heads, .qkv_stride = 3 * (int)A};
    v.p = L->u.block.p;
    v.drops = layer_block_drops(L) && c->io->mask;
    v.mask_attn = v.drops ? c->io->mask : NULL;
    v.mask_a = v.drops ? v.mask_attn + (size_t)c->n * L->u.block.heads * T * T : NULL;
    v.mask_m = v.drops ? v.mask_a + N * C : NULL;
    v.gout_per_token = layer_gout_floats(L) / T;
    return v;
}

/* The attention dropout of the block's chunk (NULL: none): forward, with the chunk's sample
 * ids and the stream of site 0; backward, the mask alone. */
static const kernel_attention_dropout *attn_drop(const layer_call *c, const block_view *v,
                                                 kernel_attention_dropout *dr, uint64_t seed,
                                                 uint64_t step)
{
    if (!v->drops) return NULL;
    *dr = (kernel_attention_dropout){.p = v->p, .seed = seed,
                                     .stream = kernel_block_dropout_stream(c->l, 0, step),
                                     .sample_ids = c->io->ids, .elem_off = c->io->elem_off,
                                     .mask = v->mask_attn};
    return dr;
}

/* The residual dropout at `site` (1: attention c_proj's output, 2: the MLP's) of the chunk's
 * rows y in place: whole rows (after a cut block's all-reduce), elements t·C + j of each
 * sample, the same masks on every tensor rank. */
static int block_drop(const layer_call *c, const block_view *v, float *y, int site,
                      uint64_t seed, uint64_t step)
{
    if (!v->drops) return 0;
    return c->k->dropout_forward(c->kc, y, site == 1 ? v->mask_a : v->mask_m, y, c->n,
                                 (size_t)v->d.seq * v->C, 0, v->p, seed,
                                 kernel_block_dropout_stream(c->l, site, step), c->io->ids);
}

/* A block's inner gradients (layer_gout_floats' order): the MLP output's (its input's
 * gradient through the residual as well), c_fc's, ln_2's output's, the residual stream's
 * after attention, c_attn's, ln_1's output's. */
typedef struct {
    float *dmp, *dfc, *dln2, *dx1, *dqkv, *dln1;
    float *dmpl, *dx1l; /* sequence parallelism: dmp's and dx1's rows of the rank's
                           positions (dmp and dx1 themselves otherwise) */
    const float *ln1w, *ln2w; /* ln_1's and ln_2's outputs of the whole sequence for W:
                                 gathered again (sequence parallelism), else the saved */
    float *dap; /* attention c_proj's output's: dx1, or with dropout dx1 ∘ M / (1 − p) */
} block_grads;

static block_grads block_grads_at(float *set, const block_view *v)
{
    size_t N = (size_t)v->N, M = (size_t)v->M, C = (size_t)v->C, A = (size_t)v->A,
           H = (size_t)v->H;
    block_grads g;
    g.dmp = set;
    g.dfc = g.dmp + N * C;
    g.dln2 = g.dfc + N * H;
    g.dx1 = g.dln2 + M * C;
    g.dqkv = g.dx1 + N * C;
    g.dln1 = g.dqkv + N * 3 * A;
    g.dmpl = M < N ? g.dln1 + M * C : g.dmp;
    g.dx1l = M < N ? g.dmpl + M * C : g.dx1;
    g.ln1w = M < N ? g.dx1l + M * C : v->ln1;
    g.ln2w = M < N ? g.ln1w + N * C : v->ln2;
    /* (dropout inside blocks and sequence parallelism do not go together: net_desc) */
    g.dap = v->drops ? g.dln1 + M * C : g.dx1;
    return g;
}

/* Where a whole block's split backward leaves W's gradients (layer_gout_kept_floats, the
 * rule the planner counts): c_fc's over the pre-GELU rows and c_attn's over qkv, dead once
 * B's GELU and attention backwards have read them; the rest over the attention
 * probabilities (dead after the attention's backward) as far as they fit, then in
 * io->gout. With the layer norms' sums (io->norm_sums) W needs neither ln_1's nor ln_2's
 * output gradient, and the residual's lands on the residual x1 (ln_2's backward reads each
 * element before it writes it; W no longer reads x1): the MLP output's over the
 * probabilities, and with dropout attention c_proj's dropped in io->gout. Without them
 * (the CUDA engine): ln_1's output's and the MLP output's over the probabilities; ln_2's
 * output's, the residual's, the two that did not fit, and attention c_proj's dropped in
 * io->gout. */
static block_grads block_split_homes(const layer_call *c, const block_view *v)
{
    size_t NC = (size_t)v->N * (size_t)v->C;
    int fits = layer_block_split_fits(c->L);
    float *rest = c->io->gout;
    block_grads g;
    g.dfc = v->fc;
    g.dqkv = v->qkv;
    g.dmpl = NULL;
    g.dx1l = NULL;
    g.ln1w = v->ln1;
    g.ln2w = v->ln2;
    if (c->io->norm_sums) {
        g.dln2 = g.dln1 = NULL;
        g.dx1 = v->x1;
        g.dmp = fits >= 1 ? v->probs : rest;
        rest += fits >= 1 ? 0 : NC;
        g.dap = v->drops ? rest : g.dx1;
        g.dmpl = g.dmp;
        g.dx1l = g.dx1;
        return g;
    }
    g.dln2 = rest;
    g.dx1 = rest + NC;
    rest += 2 * NC;
    g.dln1 = fits >= 1 ? v->probs : rest;
    rest += fits >= 1 ? 0 : NC;
    g.dmp = fits >= 2 ? v->probs + NC : rest;
    rest += fits >= 2 ? 0 : NC;
    g.dap = v->drops ? rest : g.dx1;
    g.dmpl = g.dmp;
    g.dx1l = g.dx1;
    return g;
}

/* The backward's scratch after the inner gradients in the chunk's workspace: attention's
 * output gradient (N·A), then the attention backward's. */
static float *block_dy(const layer_call *c, const block_view *v)
{
    return c->work + (size_t)v->N * v->gout_per_token;
}

/* dst = src ∘ mask / (1 − p) (the residual dropouts' backward; dst may be src). */
static int drop_back(const layer_call *c, const block_view *v, float *dst, const float *src,
                     const uint8_t *mask)
{
    return c->k->dropout_backward(c->kc, dst, src, mask, (size_t)v->N * v->C, v->p);
}

/* y[r, :] += b for each of `rows` rows of `width`. */
static int add_rows(const layer_call *c, float *y, const float *b, int rows, int width)
{
    if (c->k->add_rows) return c->k->add_rows(c->kc, y, b, rows, width);
    for (int r = 0; r < rows; r++)
        if (c->k->add(c->kc, y + (size_t)r * width, b, (size_t)width)) return -1;
    return 0;
}

/* dst = src, unless they are one buffer. */
static int copy_unless_same(const layer_call *c, float *dst, const float *src, size_t count)
{
    return dst == src ? 0 : c->k->copy(c->kc, dst, src, count);
}

/* The phases [ph0, ph1) of a block cut by heads (layer_phases): its output holds attention
 * c_proj's partial sum after phase 0 and MLP c_proj's after phase 1, which the engine
 * all-reduces before the next phase adds the (whole) bias and the residual. */
static int block_forward_shard(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_kernels *k = c->k;
    void *kc = c->kc;
    block_view v = block_of(c);
    const float *x = c->io->x;
    float *out = c->io->y;
    size_t NC = (size_t)v.N * v.C;
    kernel_attention_dropout dr;
    const kernel_attention_dropout *drop = attn_drop(c, &v, &dr, seed, step);
    for (int ph = c->ph0; ph < c->ph1; ph++) {
        int rc;
        if (ph == 0)
            rc = k->layernorm_forward(kc, v.ln1, v.mean1, v.rstd1, x, v.g1, v.b1, v.N, v.C) ||
                 k->dense_forward(kc, v.qkv, v.ln1, v.Wattn, v.battn, v.N, v.C, 3 * v.A) ||
                 k->attention_forward(kc, v.y, v.probs, c->work, v.qkv, &v.d, drop) ||
                 k->dense_forward(kc, out, v.y, v.Waproj, NULL, v.N, v.A, v.C);
        else if (ph == 1)
            rc = k->copy(kc, v.x1, out, NC) || add_rows(c, v.x1, v.baproj, v.N, v.C) ||
                 block_drop(c, &v, v.x1, 1, seed, step) || k->add(kc, v.x1, x, NC) ||
                 k->layernorm_forward(kc, v.ln2, v.mean2, v.rstd2, v.x1, v.g2, v.b2, v.N,
                                      v.C) ||
                 k->dense_forward(kc, v.fc, v.ln2, v.Wfc, v.bfc, v.N, v.C, v.H) ||
                 k->gelu_forward(kc, v.gel, v.fc, (size_t)v.N * v.H) ||
                 k->dense_forward(kc, out, v.gel, v.Wmproj, NULL, v.N, v.H, v.C);
        else
            rc = add_rows(c, out, v.bmproj, v.N, v.C) || block_drop(c, &v, out, 2, seed, step) ||
                 k->add(kc, out, v.x1, NC);
        if (rc) return -1;
    }
    return 0;
}

/* The forward phases [ph0, ph1) of a block with sequence parallelism (LAYER_BLOCK_SEQ_PHASES):
 * x, the output and x1 are M rows of the rank's positions; io->seq holds the N rows of the
 * whole sequence the engine gathered (after phases 0 and 2) or will reduce-scatter (after
 * 1 and 3). */
static int block_forward_seq(const layer_call *c)
{
    const layer_kernels *k = c->k;
    void *kc = c->kc;
    block_view v = block_of(c);
    const float *x = c->io->x;
    float *out = c->io->y, *seq = c->io->seq;
    size_t MC = (size_t)v.M * v.C;
    if (!seq && c->ph1 > c->ph0 + 1)
        return pt_error_set("layer %d [block]: sequence-parallel phases need the group", c->l);
    for (int ph = c->ph0; ph < c->ph1; ph++) {
        int rc;
        if (ph == 0)
            rc = k->layernorm_forward(kc, v.ln1, v.mean1, v.rstd1, x, v.g1, v.b1, v.M, v.C) ||
                 k->copy(kc, out, v.ln1, MC);
        else if (ph == 1)
            rc = k->dense_forward(kc, v.qkv, seq, v.Wattn, v.battn, v.N, v.C, 3 * v.A) ||
                 k->attention_forward(kc, v.y, v.probs, c->work, v.qkv, &v.d, NULL) ||
                 k->dense_forward(kc, seq, v.y, v.Waproj, NULL, v.N, v.A, v.C);
        else if (ph == 2)
            rc = k->copy(kc, v.x1, out, MC) || add_rows(c, v.x1, v.baproj, v.M, v.C) ||
                 k->add(kc, v.x1, x, MC) ||
                 k->layernorm_forward(kc, v.ln2, v.mean2, v.rstd2, v.x1, v.g2, v.b2, v.M, v.C) ||
                 k->copy(kc, out, v.ln2, MC);
        else if (ph == 3)
            rc = k->dense_forward(kc, v.fc, seq, v.Wfc, v.bfc, v.N, v.C, v.H) ||
                 k->gelu_forward(kc, v.gel, v.fc, (size_t)v.N * v.H) ||
                 k->dense_forward(kc, seq, v.gel, v.Wmproj, NULL, v.N, v.H, v.C);
        else
            rc = add_rows(c, out, v.bmproj, v.M, v.C) || k->add(kc, out, v.x1, MC);
        if (rc) return -1;
    }
    return 0;
}

int layer_block_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    if (need_transformer(c)) return -1;
    if (layer_block_seq(c->L) > 1) return block_forward_seq(c);
    if (layer_block_shards(c->L) > 1) return block_forward_shard(c, seed, step);
    const layer_kernels *k = c->k;
    void *kc = c->kc;
    block_view v = block_of(c);
    const float *x = c->io->x;
    float *out = c->io->y;
    size_t NC = (size_t)v.N * v.C;
    kernel_attention_dropout dr;
    const kernel_attention_dropout *drop = attn_drop(c, &v, &dr, seed, step);
    /* x1 = x + drop(attn(ln_1(x))); out = x1 + drop(mlp(ln_2(x1))), the attention's
     * probabilities dropped as well (GPT-2's three dropouts of a block; none when the
     * forward does not train) */
    return k->layernorm_forward(kc, v.ln1, v.mean1, v.rstd1, x, v.g1, v.b1, v.N, v.C) ||
           k->dense_forward(kc, v.qkv, v.ln1, v.Wattn, v.battn, v.N, v.C, 3 * v.A) ||
           k->attention_forward(kc, v.y, v.probs, c->work, v.qkv, &v.d, drop) ||
           k->dense_forward(kc, v.x1, v.y, v.Waproj, v.baproj, v.N, v.A, v.C) ||
           block_drop(c, &v, v.x1, 1, seed, step) || k->add(kc, v.x1, x, NC) ||
           k->layernorm_forward(kc, v.ln2, v.mean2, v.rstd2, v.x1, v.g2, v.b2, v.N, v.C) ||
           k->dense_forward(kc, v.fc, v.ln2, v.Wfc, v.bfc, v.N, v.C, v.H) ||
           k->gelu_forward(kc, v.gel, v.fc, (size_t)v.N * v.H) ||
           k->dense_forward(kc, out, v.gel, v.Wmproj, v.bmproj, v.N, v.H, v.C) ||
           block_drop(c, &v, out, 2, seed, step) || k->add(kc, out, v.x1, NC);
}

/* Folds part[0, count) in at dw_at (layer_io.fold). */
static int fold_at(const layer_call *c, float *dw_at, float *part, size_t count)
{
    return c->io->fold(c->io->fold_self, dw_at, part, count);
}

/* The layer norms' weight gradients: from their output gradients, or (sums, the split
 * backward on the CPU) B's sums of the chunk's gradient group [γ1 | β1 | γ2 | β2], which
 * the group's first chunk adds (the group's gradients start at zero: the bits of forming
 * them here, row after row, chunk after chunk). */
static int block_norm_grads(const layer_call *c, const block_view *v, const block_grads *g,
                            const float *sums, float *dg1, float *db1, float *dg2, float *db2)
{
    const layer_kernels *k = c->k;
    size_t C = (size_t)v->C;
    if (sums)
        return c->io->norm_sums_first &&
               (k->add(c->kc, dg1, sums, C) || k->add(c->kc, db1, sums + C, C) ||
                k->add(c->kc, dg2, sums + 2 * C, C) || k->add(c->kc, db2, sums + 3 * C, C));
    return k->layernorm_backward(c->kc, NULL, dg2, db2, g->dln2, v->x1, v->mean2, v->rstd2,
                                 v->g2, v->M, v->C) ||
           k->layernorm_backward(c->kc, NULL, dg1, db1, g->dln1, c->io->x, v->mean1, v->rstd1,
                                 v->g1, v->M, v->C);
}

/* The layer norms' gradients at dg1 (ln_1's γ, then β) and dg2 (ln_2's), or through io->part
 * and a fold (two folds: each norm's γ and β stand together in the parameters). */
static int block_norms(const layer_call *c, const block_view *v, const block_grads *g,
                       const float *sums, float *dg1, float *dg2)
{
    size_t C = (size_t)v->C;
    float *p = c->io->fold ? c->io->part : NULL;
    if (!p) return block_norm_grads(c, v, g, sums, dg1, dg1 + C, dg2, dg2 + C);
    return block_norm_grads(c, v, g, sums, p, p + C, p + 2 * C, p + 3 * C) ||
           fold_at(c, dg1, p, 2 * C) || fold_at(c, dg2, p + 2 * C, 2 * C);
}

/* A batched block (the step's weight gradients, src/engine/stage_plan.h): its four
 * products' input rows X and output-gradient rows G of the chunk into the step's stash,
 * product by product (stage_wgrad_products' order and places), and its layer norms'
 * gradients now, as every micro-batch forms them. */
static int block_stash(const layer_call *c, const block_view *v, const block_grads *g,
                       const float *sums, float *dg1, float *dg2)
{
    const layer_kernels *k = c->k;
    const layer_io *io = c->io;
    size_t N = (size_t)v->N, T = (size_t)v->d.seq, rows = (size_t)io->stash_rows;
    size_t r0 = io->stash_row * T; /* the chunk's first token row of the step */
    const float *xs[4] = {g->ln1w, v->y, g->ln2w, v->gel};
    const float *gs[4] = {g->dqkv, g->dap, g->dfc, g->dmp};
    const int in[4] = {v->C, v->A, v->C, v->H}, out[4] = {3 * v->A, v->C, v->H, v->C};
    size_t xo = 0, go = 0; /* floats per sample row of the products before */
    for (int q = 0; q < 4; q++) {
        if (k->copy(c->kc, io->stash_x + rows * xo + r0 * (size_t)in[q], xs[q],
                    N * (size_t)in[q]) ||
            k->copy(c->kc, io->stash_g + rows * go + r0 * (size_t)out[q], gs[q],
                    N * (size_t)out[q]))
            return -1;
        xo += T * (size_t)in[q];
        go += T * (size_t)out[q];
    }
    return block_norms(c, v, g, sums, dg1, dg2);
}

/* W: every parameter gradient of the block from its inner gradients (and the layer norms'
 * from B's sums, where given: block_norm_grads). */
static int block_weight_from(const layer_call *c, const block_view *v, const block_grads *g,
                             const float *sums)
{
    const layer_kernels *k = c->k;
    void *kc = c->kc;
    size_t C = (size_t)v->C, A = (size_t)v->A, H = (size_t)v->H;
    float *dw = c->io->dw;
    float *dWattn = dw, *dWaproj = dWattn + 3 * A * C, *dWfc = dWaproj + C * A,
          *dWmproj = dWfc + H * C, *dg1 = dWmproj + C * H, *db1 = dg1 + C,
          *dbattn = db1 + C, *dbaproj = dbattn + 3 * A, *dg2 = dbaproj + C, *db2 = dg2 + C,
          *dbfc = db2 + C, *dbmproj = dbfc + H;
    if (c->io->batched) return block_stash(c, v, g, sums, dg1, dg2);
    struct {
        float *dw, *db;
        const float *dout, *in;
        int in_f, out_f;
    } q[4] = {{dWmproj, dbmproj, g->dmp, v->gel, v->H, v->C},
              {dWfc, dbfc, g->dfc, g->ln2w, v->C, v->H},
              {dWaproj, dbaproj, g->dap, v->y, v->A, v->C},
              {dWattn, dbattn, g->dqkv, g->ln1w, v->C, 3 * v->A}};
    float *p = c->io->fold ? c->io->part : NULL; /* with a fold: each product's in part */
    for (int i = 0; i < 4; i++) {
        size_t w = (size_t)q[i].in_f * (size_t)q[i].out_f;
        if (k->dense_backward_weight(kc, p ? p : q[i].dw, p ? p + w : q[i].db, q[i].dout,
                                     q[i].in, v->N, q[i].in_f, q[i].out_f) ||
            (p && (fold_at(c, q[i].dw, p, w) || fold_at(c, q[i].db, p + w, (size_t)q[i].out_f))))
            return -1;
    }
    return block_norms(c, v, g, sums, dg1, dg2);
}

size_t layer_block_fold_floats(const layer_desc *L)
{
    size_t C = (size_t)L->in.w, A = layer_block_attn_width(L), H = (size_t)L->u.block.hidden;
    size_t sizes[5] = {3 * A * C + 3 * A, C * A + C, H * C + H, C * H + C, 4 * C}, most = 0;
    for (int i = 0; i < 5; i++)
        if (sizes[i] > most) most = sizes[i];
    return most;
}

/* The backward phases [ph0, ph1) of a block cut by heads from the running gradient g (the
 * output's at phase 0; after it, the whole gradient of ln_2's or ln_1's output, which the
 * engine all-reduced) to dx: the partial gradient of ln_2's output after phase 0, ln_1's
 * after phase 1, the input's after phase 2. Its inner gradients stay in io->gout between
 * the calls; phases run in one call hand theirs on there directly. The weight half, with
 * the last phase, is the whole block's (block_weight_from). */
static int block_backward_shard(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_kernels *k = c->k;
    void *kc = c->kc;
    block_view v = block_of(c);
    block_grads G = block_grads_at(c->io->gout ? c->io->gout : c->work, &v);
    size_t NC = (size_t)v.N * v.C, NH = (size_t)v.N * v.H;
    float *dy = block_dy(c, &v);
    float *attn_work = dy + (size_t)v.N * v.A;
    kernel_attention_dropout dr;
    const kernel_attention_dropout *drop = attn_drop(c, &v, &dr, 0, 0);
    const float *in = g;
    for (int ph = c->ph0; ph < c->ph1; ph++) {
        float *to = ph == c->ph1 - 1 ? dx : ph == 0 ? G.dln2 : G.dln1;
        int rc;
        if (!to && ph < LAYER_BLOCK_PHASES - 1)
            return pt_error_set("layer %d [block]: backward phase %d has nowhere to leave its "
                                "gradient", c->l, ph);
        /* with dropout, phase 0 keeps the output's gradient (the residual's) in dx1 and
         * drops it for the MLP; phase 1 adds ln_2's input gradient to it (a + b = b + a:
         * the bits of the order without dropout), then drops it for attention c_proj */
        if (ph == 0 && v.drops)
            rc = k->copy(kc, G.dx1, in, NC) || drop_back(c, &v, G.dmp, in, v.mask_m);
        else if (ph == 0)
            rc = copy_unless_same(c, G.dmp, in, NC);
        else if (ph == 1 && v.drops)
            rc = copy_unless_same(c, G.dln2, in, NC) ||
                 k->layernorm_backward(kc, G.dap, NULL, NULL, G.dln2, v.x1, v.mean2, v.rstd2,
                                       v.g2, v.N, v.C) ||
                 k->add(kc, G.dx1, G.dap, NC) || drop_back(c, &v, G.dap, G.dx1, v.mask_a);
        else if (ph == 1)
            rc = copy_unless_same(c, G.dln2, in, NC) ||
                 k->layernorm_backward(kc, G.dx1, NULL, NULL, G.dln2, v.x1, v.mean2, v.rstd2,
                                       v.g2, v.N, v.C) ||
                 k->add(kc, G.dx1, G.dmp, NC);
        else
            rc = 0;
        if (rc) return -1;
        if (ph == 0)
            rc = k->dense_backward_input(kc, G.dfc, G.dmp, v.Wmproj, v.N, v.H, v.C) ||
                 k->gelu_backward(kc, G.dfc, G.dfc, v.fc, NH) ||
                 k->dense_backward_input(kc, to, G.dfc, v.Wfc, v.N, v.C, v.H);
        else if (ph == 1)
            rc = k->dense_backward_input(kc, dy, G.dap, v.Waproj, v.N, v.A, v.C) ||
                 k->attention_backward(kc, G.dqkv, attn_work, dy, v.qkv, v.probs, &v.d,
                                       drop) ||
                 k->dense_backward_input(kc, to, G.dqkv, v.Wattn, v.N, v.C, 3 * v.A);
        else
            rc = copy_unless_same(c, G.dln1, in, NC) ||
                 (to && (k->layernorm_backward(kc, to, NULL, NULL, G.dln1, c->io->x, v.mean1,
                                               v.rstd1, v.g1, v.N, v.C) ||
                         k->add(kc, to, G.dx1, NC)));
        if (rc) return -1;
        in = to;
    }
    return weight_now && c->ph1 == LAYER_BLOCK_PHASES ? block_weight_from(c, &v, &G, NULL) : 0;
}

/* Rows of 2C: each of `rows` rows of a, then the same row of b (the gradient and a layer
 * norm's output, all-gathered together); and back. */
static int pair_rows(const layer_call *c, float *to, const float *a, const float *b, int rows,
                     int C)
{
    for (int r = 0; r < rows; r++)
        if (c->k->copy(c->kc, to + (size_t)r * 2 * C, a + (size_t)r * C, (size_t)C) ||
            c->k->copy(c->kc, to + (size_t)r * 2 * C + C, b + (size_t)r * C, (size_t)C))
            return -1;
    return 0;
}
static int unpair_rows(const layer_call *c, float *a, float *b, const float *from, int rows,
                       int C)
{
    for (int r = 0; r < rows; r++)
        if (c->k->copy(c->kc, a + (size_t)r * C, from + (size_t)r * 2 * C, (size_t)C) ||
            c->k->copy(c->kc, b + (size_t)r * C, from + (size_t)r * 2 * C + C, (size_t)C))
            return -1;
    return 0;
}

/* The backward phases [ph0, ph1) of a block with sequence parallelism from the running
 * gradient g to dx: M rows of the rank's positions into phases 0, 2 and 4; out of 0 and 2
 * M rows of 2C, the gradient paired with ln_2's (ln_1's) output, which the engine
 * all-gathers (W needs those outputs of the whole sequence: the forward kept only its
 * positions'); N rows of the whole sequence into 1 and 3 and partial sums out of them
 * (reduce-scattered). The inner gradients stay in io->gout between the calls; the weight
 * half, with the last phase, is the whole block's. */
static int block_backward_seq(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_kernels *k = c->k;
    void *kc = c->kc;
    block_view v = block_of(c);
    float *set = c->io->gout ? c->io->gout : c->work;
    block_grads G = block_grads_at(set, &v);
    size_t MC = (size_t)v.M * v.C, NH = (size_t)v.N * v.H;
    float *dy = c->work + (size_t)c->n * layer_gout_floats(c->L);
    float *attn_work = dy + (size_t)v.N * v.A;
    const float *in = g;
    for (int ph = c->ph0; ph < c->ph1; ph++) {
        float *to = dx;
        int rc;
        if (ph + 1 < c->ph1 || (!to && ph < LAYER_BLOCK_SEQ_PHASES - 1))
            return pt_error_set("layer %d [block]: sequence-parallel backward phase %d needs "
                                "the group after it", c->l, ph);
        if (ph == 0)
            rc = copy_unless_same(c, G.dmpl, in, MC) || pair_rows(c, to, in, v.ln2, v.M, v.C);
        else if (ph == 1)
            rc = unpair_rows(c, G.dmp, (float *)G.ln2w, in, v.N, v.C) ||
                 k->dense_backward_input(kc, G.dfc, G.dmp, v.Wmproj, v.N, v.H, v.C) ||
                 k->gelu_backward(kc, G.dfc, G.dfc, v.fc, NH) ||
                 k->dense_backward_input(kc, to, G.dfc, v.Wfc, v.N, v.C, v.H);
        else if (ph == 2)
            rc = copy_unless_same(c, G.dln2, in, MC) ||
                 k->layernorm_backward(kc, G.dx1l, NULL, NULL, G.dln2, v.x1, v.mean2, v.rstd2,
                                       v.g2, v.M, v.C) ||
                 k->add(kc, G.dx1l, G.dmpl, MC) || pair_rows(c, to, G.dx1l, v.ln1, v.M, v.C);
        else if (ph == 3)
            rc = unpair_rows(c, G.dx1, (float *)G.ln1w, in, v.N, v.C) ||
                 k->dense_backward_input(kc, dy, G.dx1, v.Waproj, v.N, v.A, v.C) ||
                 k->attention_backward(kc, G.dqkv, attn_work, dy, v.qkv, v.probs, &v.d, NULL) ||
                 k->dense_backward_input(kc, to, G.dqkv, v.Wattn, v.N, v.C, 3 * v.A);
        else
            rc = copy_unless_same(c, G.dln1, in, MC) ||
                 (to && (k->layernorm_backward(kc, to, NULL, NULL, G.dln1, c->io->x, v.mean1,
                                               v.rstd1, v.g1, v.M, v.C) ||
                         k->add(kc, to, G.dx1l, MC)));
        if (rc) return -1;
    }
    return weight_now && c->ph1 == LAYER_BLOCK_SEQ_PHASES ? block_weight_from(c, &v, &G, NULL)
                                                          : 0;
}

int layer_block_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    if (need_transformer(c)) return -1;
    if (layer_block_seq(c->L) > 1) return block_backward_seq(c, g, dx, weight_now);
    if (layer_block_shards(c->L) > 1) return block_backward_shard(c, g, dx, weight_now);
    const layer_kernels *k = c->k;
    void *kc = c->kc;
    block_view v = block_of(c);
    /* B alone leaves W's gradients where W finds them (H: block_split_homes), computing
     * them as the whole backward does: in the chunk's workspace (G), but those whose homes
     * are free from the start (in io->gout) and ln_1's output's (written after the
     * attention's backward, which frees its home). c_fc's lands on the pre-GELU rows it is
     * computed from (the GELU's backward reads each element before it writes it); c_attn's
     * and the MLP output's are copied once the attention's backward has read qkv and the
     * probabilities. The whole backward (H = G) runs the same kernels on the same values. */
    int keep = !weight_now && (c->io->gout || c->io->norm_sums);
    block_grads G = block_grads_at(c->work, &v);
    block_grads H = keep ? block_split_homes(c, &v) : G;
    /* B with the sums: the layer norms' weight gradients now, in the same calls as their
     * input gradients (bit for bit what the halves compute apart) */
    float *S = keep ? c->io->norm_sums : NULL;
    if (keep) {
        G.dx1 = H.dx1;
        G.dap = H.dap;
        if (!S) {
            G.dln2 = H.dln2;
            G.dln1 = H.dln1;
        }
    }
    size_t NC = (size_t)v.N * v.C, NH = (size_t)v.N * v.H;
    float *dy = block_dy(c, &v);
    float *attn_work = dy + (size_t)v.N * v.A;
    kernel_attention_dropout dr;
    const kernel_attention_dropout *drop = attn_drop(c, &v, &dr, 0, 0);
    /* g (the output's gradient) stays as it is: the residual's; the MLP's is g itself, or
     * with dropout g ∘ M / (1 − p) (in G.dmp) */
    if (v.drops) {
        if (drop_back(c, &v, G.dmp, g, v.mask_m)) return -1;
    } else {
        G.dmp = (float *)g; /* read only */
    }
    if (k->dense_backward_input(kc, G.dfc, G.dmp, v.Wmproj, v.N, v.H, v.C) ||
        k->gelu_backward(kc, H.dfc, G.dfc, v.fc, NH) ||
        k->dense_backward_input(kc, G.dln2, H.dfc, v.Wfc, v.N, v.C, v.H) ||
        k->layernorm_backward(kc, G.dx1, S ? S + 2 * v.C : NULL, S ? S + 3 * v.C : NULL,
                              G.dln2, v.x1, v.mean2, v.rstd2, v.g2, v.N, v.C) ||
        k->add(kc, G.dx1, g, NC) ||
        (v.drops && drop_back(c, &v, G.dap, G.dx1, v.mask_a)) ||
        k->dense_backward_input(kc, dy, G.dap, v.Waproj, v.N, v.A, v.C) ||
        k->attention_backward(kc, G.dqkv, attn_work, dy, v.qkv, v.probs, &v.d, drop) ||
        k->dense_backward_input(kc, G.dln1, G.dqkv, v.Wattn, v.N, v.C, 3 * v.A))
        return -1;
    if (keep && (k->copy(kc, H.dqkv, G.dqkv, (size_t)v.N * 3 * v.A) ||
                 k->copy(kc, H.dmp, G.dmp, NC)))
        return -1;
    if ((dx || S) && k->layernorm_backward(kc, dx, S, S ? S + v.C : NULL, G.dln1, c->io->x,
                                           v.mean1, v.rstd1, v.g1, v.N, v.C))
        return -1;
    if (dx && k->add(kc, dx, G.dx1, NC)) return -1;
    if (!weight_now) return 0;
    H.dfc = G.dfc;
    H.dmp = G.dmp;
    return block_weight_from(c, &v, &H, NULL);
}

int layer_block_weight(const layer_call *c, const float *g)
{
    if (need_transformer(c)) return -1;
    block_view v = block_of(c);
    int whole = layer_phases(c->L) == 1;
    block_grads G = whole ? block_split_homes(c, &v) : block_grads_at((float *)g, &v);
    return block_weight_from(c, &v, &G, whole ? c->io->norm_sums : NULL);
}

