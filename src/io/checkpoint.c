#include "src/io/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/io/safetensors.h"
#include "src/model/layer_table.h"

/* Shapes in PyTorch's layout: dense [out, in], conv [out, in, k, k], bias [out]. */
static void layer_tensor_shapes(const layer_desc *L, st_tensor *w, st_tensor *b, int index)
{
    snprintf(w->name, sizeof w->name, "layers.%d.weight", index);
    snprintf(b->name, sizeof b->name, "layers.%d.bias", index);
    if (L->type == LAYER_CONV) {
        w->ndim = 4;
        w->shape[0] = L->u.conv.filters;
        w->shape[1] = L->in.c;
        w->shape[2] = w->shape[3] = L->u.conv.size;
    } else {
        w->ndim = 2;
        w->shape[0] = L->u.dense.units;
        w->shape[1] = (long)layer_shape_count(L->in);
    }
    b->ndim = 1;
    b->shape[0] = (long)L->bias_count;
}

/* Layer l's tensors as a checkpoint names them, with their shapes and their offsets in the
 * layer's parameters; returns how many. Dense and conv layers: "layers.<l>.weight" and
 * ".bias" in PyTorch's shapes; the transformer layers: their named tensors (layer_tensors,
 * GPT-2's names: "layers.1.attn.c_attn.weight"), a matrix [rows, cols], a vector [rows]. */
static int layer_st(const layer_desc *L, int l, st_tensor *st, size_t *off)
{
    if (L->type == LAYER_CONV || L->type == LAYER_DENSE) {
        layer_tensor_shapes(L, &st[0], &st[1], l);
        off[0] = 0;
        off[1] = L->weight_count;
        return 2;
    }
    layer_tensor t[LAYER_MAX_TENSORS];
    int n = layer_tensors(L, 0, t);
    /* a tied head's copy is the embedding's token matrix: stored once, under its name */
    int tied = L->type == LAYER_LM_HEAD && L->u.lm_head.tied;
    for (int k = 0; k < n; k++) {
        memset(&st[k], 0, sizeof st[k]);
        if (tied)
            snprintf(st[k].name, sizeof st[k].name, "layers.0.wte.weight");
        else
            snprintf(st[k].name, sizeof st[k].name, "layers.%d.%.60s", l, t[k].name);
        st[k].ndim = t[k].cols == 1 ? 1 : 2;
        st[k].shape[0] = t[k].rows;
        st[k].shape[1] = t[k].cols;
        off[k] = t[k].offset;
    }
    return n;
}

/* The tensors of every layer with parameters, names prefixed ("" for the parameters,
 * "optimizer.m." for a moment buffer), data from `all` in stage order; appends to t. */
static void add_tensors(st_tensor *t, int *n, const net_desc *net, const float *all,
                        const char *prefix)
{
    size_t base = 0;
    for (int l = 0; l < net->n_layers; l++) {
        const layer_desc *L = &net->layers[l];
        if (!L->weight_count) continue;
        if (l == net->tied_head) { /* equal to layer 0's token matrix, written there */
            base += L->weight_count + L->bias_count;
            continue;
        }
        size_t off[LAYER_MAX_TENSORS];
        int k = layer_st(L, l, &t[*n], off);
        for (int j = 0; j < k; j++) {
            st_tensor *w = &t[*n + j];
            /* "optimizer.m.layers.N.attn.c_attn.weight" fits the 95 bytes of a name */
            char name[512];
            snprintf(name, sizeof name, "%s%s", prefix, w->name);
            snprintf(w->name, sizeof w->name, "%.95s", name);
            w->data = all + base + off[j];
        }
        *n += k;
        base += L->weight_count + L->bias_count;
    }
}

int checkpoint_save(const char *path, const net_desc *net, const float *all)
{
    /* an empty metadata list, not none: the file then carries its CRC-32s (st_write_meta),
     * and a flipped bit in a --save file is refused at --load as in a checkpoint */
    static const char *const no_keys[] = {NULL};
    return checkpoint_save_full(path, net, all, NULL, NULL, no_keys);
}

int checkpoint_save_full(const char *path, const net_desc *net, const float *params,
                         const float *m, const float *v, const char *const *meta)
{
    st_tensor *t = calloc((size_t)net->n_layers * 3 * LAYER_MAX_TENSORS + 1, sizeof *t);
    if (!t) return pt_error_set("out of memory");
    int n = 0;
    add_tensors(t, &n, net, params, "");
    if (m) add_tensors(t, &n, net, m, CHECKPOINT_M_PREFIX);
    if (v) add_tensors(t, &n, net, v, CHECKPOINT_V_PREFIX);
    int rc = st_write_meta(path, t, n, meta);
    free(t);
    return rc;
}

static int shapes_equal(const st_tensor *a, const st_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

static void shape_string(const st_tensor *t, char *buf, size_t len)
{
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ", %ld" : "%ld", t->shape[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

/* Layers [first, last) of one family of tensors (prefix) from an open file into dst. */
static int load_family(const st_file *f, const char *path, const net_desc *net, int first,
                       int last, const char *prefix, float *dst)
{
    float *next = dst;
    for (int l = first; l < last; l++) {
        const layer_desc *L = &net->layers[l];
        if (!L->weight_count) continue;
        st_tensor want[LAYER_MAX_TENSORS];
        size_t off[LAYER_MAX_TENSORS];
        memset(want, 0, sizeof want);
        int n = layer_st(L, l, want, off);
        for (int k = 0; k < n; k++) {
            char name[512];
            snprintf(name, sizeof name, "%.100s%.95s", prefix, want[k].name);
            const st_tensor *got = st_find(f, name);
            if (!got)
                return pt_error_set("%s: no tensor %s (layer %d, %s)", path, name, l,
                                    layer_type_name(L->type));
            if (!shapes_equal(got, &want[k])) {
                char a[64], b[64];
                shape_string(got, a, sizeof a);
                shape_string(&want[k], b, sizeof b);
                return pt_error_set("%s: tensor %s has shape %s but the model needs %s", path,
                                    name, a, b);
            }
            size_t count = 1;
            for (int d = 0; d < want[k].ndim; d++) count *= (size_t)want[k].shape[d];
            memcpy(next + off[k], got->data, count * sizeof(float));
        }
        next += L->weight_count + L->bias_count;
    }
    return 0;
}

int checkpoint_load_layers(const char *path, const net_desc *net, int first, int last,
                           float *params)
{
    return checkpoint_load_full(path, net, first, last, params, NULL, NULL);
}

int checkpoint_load_full(const char *path, const net_desc *net, int first, int last,
                         float *params, float *m, float *v)
{
    st_file f;
    if (st_read(&f, path)) return -1;
    int rc = load_family(&f, path, net, first, last, "", params);
    if (!rc && m) rc = load_family(&f, path, net, first, last, CHECKPOINT_M_PREFIX, m);
    if (!rc && v) rc = load_family(&f, path, net, first, last, CHECKPOINT_V_PREFIX, v);
    st_free(&f);
    return rc;
}
