#include "src/model/layer_table.h"

#include <limits.h>
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
                       .flat = -1, .own_output = 1, .mask = 1, .identity = dropout_identity},
    [LAYER_FLATTEN] = {.name = "flatten", .shape = flatten_shape, .describe = flatten_describe,
                       .flat = 1, .own_output = 0, .identity = always_identity},
};
