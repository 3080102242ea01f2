#include "src/model/layer_table.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

__attribute__((format(printf, 2, 3))) static int shape_fail(layer_shape_error *e,
                                                            const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->reason, sizeof e->reason, fmt, ap);
    va_end(ap);
    return -1;
}

static int mul_size(size_t a, size_t b, size_t *out) { return __builtin_mul_overflow(a, b, out); }

/* ---- conv ---- */

static int conv_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    layer_shape in = L->in;
    int k = sp->size;
    int stride = (sp->given & LAYER_SPEC_STRIDE) ? sp->stride : 1;
    int pad = (sp->given & LAYER_SPEC_PAD) ? sp->pad : 0;
    if (sp->given & LAYER_SPEC_ACTIVATION) L->activation = sp->activation;
    L->u.conv.filters = sp->filters;
    L->u.conv.size = k;
    L->u.conv.stride = stride;
    L->u.conv.pad = pad;
    long long ph = (long long)in.h + 2LL * pad, pw = (long long)in.w + 2LL * pad;
    if (k > ph || k > pw) {
        e->blame_size = (sp->given & LAYER_SPEC_SIZE) != 0;
        return shape_fail(e, "conv kernel %d×%d is larger than its padded input %lld×%lld", k,
                          k, ph, pw);
    }
    long long out_h = (ph - k) / stride + 1, out_w = (pw - k) / stride + 1;
    if (out_h > INT_MAX || out_w > INT_MAX)
        return shape_fail(e, "conv output %lld×%lld is too large", out_h, out_w);
    L->out = (layer_shape){L->u.conv.filters, (int)out_h, (int)out_w};
    size_t w;
    if (mul_size((size_t)L->u.conv.filters, (size_t)in.c, &w) || mul_size(w, (size_t)k, &w) ||
        mul_size(w, (size_t)k, &w))
        return shape_fail(e, "conv weight count overflows");
    L->weight_count = w;
    L->bias_count = (size_t)L->u.conv.filters;
    return 0;
}

static void conv_describe(char *buf, size_t size, const layer_desc *L)
{
    int n = snprintf(buf, size, "conv2d (%d×%d, %d, %s", L->u.conv.size, L->u.conv.size,
                     L->u.conv.filters, layer_act_name(L->activation));
    if (L->u.conv.stride != 1 && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ", stride %d", L->u.conv.stride);
    if (L->u.conv.pad != 0 && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ", pad %d", L->u.conv.pad);
    if (n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, ")");
}

/* ---- maxpool, avgpool ---- */

static int pool_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    layer_shape in = L->in;
    int size = (sp->given & LAYER_SPEC_SIZE) ? sp->size : 2;
    int stride = (sp->given & LAYER_SPEC_STRIDE) ? sp->stride : size;
    L->u.pool.size = size;
    L->u.pool.stride = stride;
    if (size > in.h || size > in.w) {
        e->blame_size = (sp->given & LAYER_SPEC_SIZE) != 0;
        return shape_fail(e, "%s window %d×%d is larger than its input %d×%d",
                          layer_type_name(L->type), size, size, in.h, in.w);
    }
    L->out = (layer_shape){in.c, (in.h - size) / stride + 1, (in.w - size) / stride + 1};
    return 0;
}

static void pool_describe(char *buf, size_t size, const layer_desc *L)
{
    if (L->u.pool.stride == L->u.pool.size)
        snprintf(buf, size, "%s2d (%d×%d)", layer_type_name(L->type), L->u.pool.size,
                 L->u.pool.size);
    else
        snprintf(buf, size, "%s2d (%d×%d, stride %d)", layer_type_name(L->type), L->u.pool.size,
                 L->u.pool.size, L->u.pool.stride);
}

/* ---- dense ---- */

static int dense_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    size_t in_count = layer_shape_count(L->in);
    if (sp->given & LAYER_SPEC_ACTIVATION) L->activation = sp->activation;
    L->u.dense.units = sp->units;
    /* a dense layer after a spatial one flattens implicitly */
    L->in = (layer_shape){(int)in_count, 1, 1};
    L->out = (layer_shape){L->u.dense.units, 1, 1};
    if (mul_size((size_t)L->u.dense.units, in_count, &L->weight_count))
        return shape_fail(e, "dense weight count overflows");
    L->bias_count = (size_t)L->u.dense.units;
    return 0;
}

static void dense_describe(char *buf, size_t size, const layer_desc *L)
{
    snprintf(buf, size, "dense (%d, %s)", L->u.dense.units, layer_act_name(L->activation));
}

/* ---- dropout ---- */

static int dropout_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    L->u.dropout.p = sp->p;
    L->out = L->in;
    return 0;
}

static void dropout_describe(char *buf, size_t size, const layer_desc *L)
{
    snprintf(buf, size, "dropout (%g)", (double)L->u.dropout.p);
}

static int dropout_identity(const layer_desc *L, int training)
{
    return !(training && L->u.dropout.p > 0);
}

/* ---- flatten ---- */

static int flatten_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    L->out = (layer_shape){(int)layer_shape_count(L->in), 1, 1};
    return 0;
}

static void flatten_describe(char *buf, size_t size, const layer_desc *L)
{
    snprintf(buf, size, "flatten");
}

/* ---- transformer: embedding, block, layernorm, lm_head (GPT-2's layers) ----
 * A sequence is {T, 1, C} (src/model/net.h). Parameters per layer, in the order an engine
 * will keep them: weights first, then the vectors (layer-norm gains and biases count as
 * biases). */

/* Values within [1, max]: the parser checked ≥ 1. */
static int check_max(layer_shape_error *e, const char *sec, const char *key, int v, int max)
{
    if (v > max) return shape_fail(e, "[%s] %s=%d is larger than %d", sec, key, v, max);
    return 0;
}

static int embedding_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    if (check_max(e, "embedding", "vocab", sp->vocab, LAYER_MAX_VOCAB) ||
        check_max(e, "embedding", "context", sp->context, LAYER_MAX_CONTEXT) ||
        check_max(e, "embedding", "width", sp->width, LAYER_MAX_WIDTH))
        return -1;
    if (sp->vocab < 2)
        return shape_fail(e, "[embedding] vocab=%d: a language model needs at least 2 tokens",
                          sp->vocab);
    L->u.embedding.vocab = sp->vocab;
    L->u.embedding.context = sp->context;
    L->u.embedding.width = sp->width;
    L->in = (layer_shape){sp->context, 1, 1}; /* T token ids */
    L->out = (layer_shape){sp->context, 1, sp->width};
    /* token matrix V×C, then the learned positions T×C */
    L->weight_count = ((size_t)sp->vocab + (size_t)sp->context) * (size_t)sp->width;
    return 0;
}

static void embedding_describe(char *buf, size_t size, const layer_desc *L)
{
    snprintf(buf, size, "embedding (%d, %d positions)", L->u.embedding.vocab,
             L->u.embedding.context);
}

static int block_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    int C = L->in.w;
    int hidden = (sp->given & LAYER_SPEC_HIDDEN) ? sp->hidden : 4 * C;
    if (check_max(e, "block", "heads", sp->heads, C) ||
        check_max(e, "block", "hidden", hidden, LAYER_MAX_HIDDEN))
        return -1;
    if (C % sp->heads)
        return shape_fail(e, "[block] heads=%d does not divide the width %d", sp->heads, C);
    L->u.block.heads = sp->heads;
    L->u.block.hidden = hidden;
    L->u.block.p = (sp->given & LAYER_SPEC_DROPOUT) ? sp->dropout : 0.0f;
    L->u.block.shards = 1;
    L->out = L->in;
    size_t c = (size_t)C, h = (size_t)hidden;
    /* c_attn C×3C, attention c_proj C×C, c_fc C×hidden, MLP c_proj hidden×C */
    L->weight_count = 4 * c * c + 2 * c * h;
    /* ln_1 2C, c_attn 3C, c_proj C, ln_2 2C, c_fc hidden, c_proj C */
    L->bias_count = 9 * c + h;
    return 0;
}

static void block_describe(char *buf, size_t size, const layer_desc *L)
{
    int n = snprintf(buf, size, "block (%d heads, hidden %d", L->u.block.heads,
                     L->u.block.hidden);
    if (L->u.block.p > 0 && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ", dropout %g", (double)L->u.block.p);
    if (n >= 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, ")");
}

static int layernorm_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    L->out = L->in;
    L->weight_count = (size_t)L->in.w; /* gain */
    L->bias_count = (size_t)L->in.w;
    return 0;
}

static void layernorm_describe(char *buf, size_t size, const layer_desc *L)
{
    snprintf(buf, size, "layernorm");
}

static int lm_head_shape(layer_desc *L, const layer_spec *sp, layer_shape_error *e)
{
    const layer_desc *E = sp->embedding; /* the parser placed it at layer 0 */
    int V = (sp->given & LAYER_SPEC_VOCAB) ? sp->vocab : E->u.embedding.vocab;
    int tied = (sp->given & LAYER_SPEC_TIED) ? sp->tied : 0;
    if (V != E->u.embedding.vocab)
        return shape_fail(e, "[lm_head] vocab=%d differs from the [embedding]'s vocab=%d: it "
                          "predicts the model's own tokens", V, E->u.embedding.vocab);
    if (tied && L->in.w != E->u.embedding.width)
        return shape_fail(e, "[lm_head] tied=1 needs a %d×%d matrix but the [embedding]'s "
                          "token matrix is %d×%d", V, L->in.w, E->u.embedding.vocab,
                          E->u.embedding.width);
    L->u.lm_head.vocab = V;
    L->u.lm_head.tied = tied;
    L->out = (layer_shape){L->in.c, 1, V};
    /* C→V without bias. Tied, it keeps a copy of the embedding's token matrix (so that the
     * head can sit on another stage), kept equal to it; the net counts the pair once. */
    L->weight_count = (size_t)V * (size_t)L->in.w;
    return 0;
}

static void lm_head_describe(char *buf, size_t size, const layer_desc *L)
{
    snprintf(buf, size, "lm_head (%d%s)", L->u.lm_head.vocab,
             L->u.lm_head.tied ? ", tied to layer 0" : "");
}

static int always_identity(const layer_desc *L, int training) { return 1; }

const layer_kind layer_kinds[LAYER_TYPE_COUNT] = {
    [LAYER_CONV] = {.name = "conv", .shape = conv_shape, .describe = conv_describe, .flat = 0,
                    .own_output = 1},
    [LAYER_MAXPOOL] = {.name = "maxpool", .shape = pool_shape, .describe = pool_describe,
                       .flat = 0, .own_output = 1, .argmax = 1},
    [LAYER_AVGPOOL] = {.name = "avgpool", .shape = pool_shape, .describe = pool_describe,
                       .flat = 0, .own_output = 1},
    [LAYER_DENSE] = {.name = "dense", .shape = dense_shape, .describe = dense_describe,
                     .flat = 1, .own_output = 1},
    [LAYER_DROPOUT] = {.name = "dropout", .shape = dropout_shape, .describe = dropout_describe,
                       .flat = -1, .sequence = -1, .own_output = 1, .mask = 1,
                       .identity = dropout_identity},
    [LAYER_FLATTEN] = {.name = "flatten", .shape = flatten_shape, .describe = flatten_describe,
                       .flat = 1, .own_output = 0, .identity = always_identity},
    [LAYER_EMBEDDING] = {.name = "embedding", .shape = embedding_shape,
                         .describe = embedding_describe, .flat = 2, .own_output = 1},
    [LAYER_BLOCK] = {.name = "block", .shape = block_shape, .describe = block_describe,
                     .flat = 2, .sequence = 1, .own_output = 1},
    [LAYER_LAYERNORM] = {.name = "layernorm", .shape = layernorm_shape,
                         .describe = layernorm_describe, .flat = 2, .sequence = 1,
                         .own_output = 1},
    [LAYER_LM_HEAD] = {.name = "lm_head", .shape = lm_head_shape, .describe = lm_head_describe,
                       .flat = 2, .sequence = 1, .own_output = 1},
};

/* ---- named tensors, decay, and what the backward keeps ---- */

static int put(layer_tensor *t, int k, size_t *off, const char *name, int rows, int cols,
               layer_init init, double std, int decay)
{
    size_t count = (size_t)rows * (size_t)cols;
    t[k] = (layer_tensor){.name = name, .offset = *off, .count = count, .rows = rows,
                          .cols = cols, .init = init, .std = std, .decay = decay};
    *off += count;
    return k + 1;
}

enum { GPT2_STD_X1000 = 20 }; /* GPT-2's σ = 0.02 */

int layer_tensors(const layer_desc *L, int blocks, layer_tensor *t)
{
    const double std = GPT2_STD_X1000 / 1000.0;
    size_t off = 0;
    int k = 0;
    switch (L->type) {
    case LAYER_CONV:
    case LAYER_DENSE: {
        int out = L->type == LAYER_CONV ? L->u.conv.filters : L->u.dense.units;
        k = put(t, k, &off, "weight", out, (int)(L->weight_count / (size_t)out),
                LAYER_INIT_TORCH, 0, 1);
        return put(t, k, &off, "bias", out, 1, LAYER_INIT_TORCH, 0, 0);
    }
    case LAYER_EMBEDDING: {
        int V = L->u.embedding.vocab, T = L->u.embedding.context, C = L->u.embedding.width;
        k = put(t, k, &off, "wte.weight", V, C, LAYER_INIT_NORMAL, std, 0);
        return put(t, k, &off, "wpe.weight", T, C, LAYER_INIT_NORMAL, std, 0);
    }
    case LAYER_BLOCK: {
        int C = L->in.w, H = L->u.block.hidden;
        /* the residual projections' σ shrinks with depth (GPT-2) */
        double rstd = std / sqrt(2.0 * (blocks > 0 ? blocks : 1));
        k = put(t, k, &off, "attn.c_attn.weight", 3 * C, C, LAYER_INIT_NORMAL, std, 1);
        k = put(t, k, &off, "attn.c_proj.weight", C, C, LAYER_INIT_NORMAL, rstd, 1);
        k = put(t, k, &off, "mlp.c_fc.weight", H, C, LAYER_INIT_NORMAL, std, 1);
        k = put(t, k, &off, "mlp.c_proj.weight", C, H, LAYER_INIT_NORMAL, rstd, 1);
        k = put(t, k, &off, "ln_1.weight", C, 1, LAYER_INIT_ONES, 0, 0);
        k = put(t, k, &off, "ln_1.bias", C, 1, LAYER_INIT_ZEROS, 0, 0);
        k = put(t, k, &off, "attn.c_attn.bias", 3 * C, 1, LAYER_INIT_ZEROS, 0, 0);
        k = put(t, k, &off, "attn.c_proj.bias", C, 1, LAYER_INIT_ZEROS, 0, 0);
        k = put(t, k, &off, "ln_2.weight", C, 1, LAYER_INIT_ONES, 0, 0);
        k = put(t, k, &off, "ln_2.bias", C, 1, LAYER_INIT_ZEROS, 0, 0);
        k = put(t, k, &off, "mlp.c_fc.bias", H, 1, LAYER_INIT_ZEROS, 0, 0);
        return put(t, k, &off, "mlp.c_proj.bias", C, 1, LAYER_INIT_ZEROS, 0, 0);
    }
    case LAYER_LAYERNORM:
        k = put(t, k, &off, "weight", L->in.w, 1, LAYER_INIT_ONES, 0, 0);
        return put(t, k, &off, "bias", L->in.w, 1, LAYER_INIT_ZEROS, 0, 0);
    case LAYER_LM_HEAD:
        if (L->u.lm_head.tied)
            return put(t, k, &off, "weight", L->u.lm_head.vocab, L->in.w, LAYER_INIT_TIED, 0, 0);
        return put(t, k, &off, "weight", L->u.lm_head.vocab, L->in.w, LAYER_INIT_NORMAL, std, 1);
    default:
        return 0;
    }
}

size_t layer_decayed_count(const layer_desc *L)
{
    switch (L->type) {
    case LAYER_CONV:
    case LAYER_DENSE:
    case LAYER_BLOCK:
        return L->weight_count; /* a block's four matrices come first */
    case LAYER_LM_HEAD:
        return L->u.lm_head.tied ? 0 : L->weight_count;
    default:
        return 0;
    }
}

/* A block's inner activations per token (the forward's saved storage, in this order):
 * ln_1's output C, c_attn's output 3C, attention's output C, the residual after attention
 * C, ln_2's output C, c_fc's output H, GELU's output H, and the two norms' mean and rstd;
 * then per sample the attention probabilities heads·T². */
size_t layer_saved_floats(const layer_desc *L)
{
    size_t T = (size_t)L->in.c, C = (size_t)L->in.w;
    switch (L->type) {
    case LAYER_BLOCK: { /* ln1, qkv, y, x1, ln2, fc, gel, 4 statistics; probabilities. With
                         * sequence parallelism ln1, x1, ln2 and the statistics are of the
                         * rank's positions (the backward gathers ln1 and ln2 again), the
                         * rest of the whole sequence Tw */
        size_t Tw = T * (size_t)layer_block_seq(L);
        return Tw * (4 * layer_block_attn_width(L) + 2 * (size_t)L->u.block.hidden) +
               T * (3 * C + 4) + (size_t)L->u.block.heads * Tw * Tw;
    }
    case LAYER_LAYERNORM:
        return 2 * T; /* mean and rstd per token */
    default:
        return 0;
    }
}

size_t layer_mask_bytes(const layer_desc *L)
{
    size_t T = (size_t)L->in.c, C = (size_t)L->in.w;
    if (L->type == LAYER_DROPOUT) return layer_shape_count(L->out);
    if (layer_block_drops(L)) return (size_t)L->u.block.heads * T * T + 2 * T * C;
    return 0;
}

/* A block's gradients per token that W needs (src/engine/layer_ops.c): its output's C
 * (MLP c_proj), c_fc's H, ln_2's output C, the residual after attention C (attention
 * c_proj), c_attn's 3A, ln_1's output C (A = C, or a shard's attention width). With
 * sequence parallelism ln_2's and ln_1's are of the rank's positions, the output's and the
 * residual's local rows are kept besides their whole ones, and so are ln_1's and ln_2's
 * outputs of the whole sequence, gathered again for W; with dropout (never with sequence
 * parallelism), attention c_proj's output's C after its dropout. */
size_t layer_gout_floats(const layer_desc *L)
{
    if (!L->weight_count) return 0;
    if (L->type == LAYER_BLOCK) {
        size_t T = (size_t)L->in.c, S = (size_t)layer_block_seq(L), C = (size_t)L->in.w;
        size_t whole = T * S * (2 * C + 3 * layer_block_attn_width(L) + (size_t)L->u.block.hidden);
        return whole + T * 2 * C + (S > 1 ? T * 2 * C + T * S * 2 * C : 0) +
               (layer_block_drops(L) ? T * C : 0);
    }
    return layer_shape_count(L->out);
}

/* A whole block: its split backward keeps W's gradients in place (layer_table.h). */
static int block_whole(const layer_desc *L)
{
    return L->type == LAYER_BLOCK && layer_block_shards(L) == 1 && layer_block_seq(L) == 1;
}

int layer_block_split_fits(const layer_desc *L)
{
    if (!block_whole(L)) return 0;
    size_t T = (size_t)L->in.c, C = (size_t)L->in.w;
    size_t fits = (size_t)L->u.block.heads * T * T / (T * C);
    return fits > 2 ? 2 : (int)fits;
}

size_t layer_gout_kept_floats(const layer_desc *L, int norm_sums)
{
    if (norm_sums && L->type == LAYER_LAYERNORM) return 0;
    if (!L->weight_count || !block_whole(L)) return layer_gout_floats(L);
    size_t T = (size_t)L->in.c, C = (size_t)L->in.w;
    int fits = layer_block_split_fits(L), drops = layer_block_drops(L) ? 1 : 0;
    if (!norm_sums) return T * C * (size_t)(4 - fits + drops);
    /* the MLP output's over the probabilities where it fits; attention c_proj's dropped
     * never there (B writes it before the attention's backward has read them) */
    return T * C * (size_t)((fits < 1) + drops);
}

size_t layer_norm_sum_floats(const layer_desc *L)
{
    if (L->type == LAYER_LAYERNORM) return 2 * (size_t)L->in.w;
    return block_whole(L) ? 4 * (size_t)L->in.w : 0;
}

size_t layer_work_floats(const layer_desc *L, int n)
{
    size_t T = (size_t)L->in.c, N = (size_t)n * T;
    switch (L->type) {
    case LAYER_BLOCK: {
        /* the gradients of layer_gout_floats (when W runs with B), attention's output
         * gradient, and the attention backward's scratch (of the whole sequence; with
         * dropout, one more block of it, which the forward uses as well) */
        size_t A = layer_block_attn_width(L), Tw = T * (size_t)layer_block_seq(L);
        kernel_attention_dims d = {n, (int)Tw, L->u.block.heads, (int)A / L->u.block.heads,
                                   3 * (int)A};
        return (size_t)n * layer_gout_floats(L) + (size_t)n * Tw * A +
               kernel_attention_workspace_floats(&d) +
               (layer_block_drops(L) ? kernel_attention_dropout_floats(&d) : 0);
    }
    case LAYER_EMBEDDING:
        return N; /* the token ids as int32 */
    default:
        return 0;
    }
}
