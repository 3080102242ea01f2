#include "src/io/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/io/safetensors.h"

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

/* The tensors of every layer with parameters, names prefixed ("" for the parameters,
 * "optimizer.m." for a moment buffer), data from `all` in stage order; appends to t. */
static void add_tensors(st_tensor *t, int *n, const net_desc *net, const float *all,
                        const char *prefix)
{
    size_t off = 0;
    for (int l = 0; l < net->n_layers; l++) {
        const layer_desc *L = &net->layers[l];
        if (!L->weight_count) continue;
        st_tensor *w = &t[*n], *b = &t[*n + 1];
        layer_tensor_shapes(L, w, b, l);
        /* "optimizer.m.layers.N.weight" fits the 95 bytes of a name with room to spare */
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix, w->name);
        snprintf(w->name, sizeof w->name, "%.95s", name);
        snprintf(name, sizeof name, "%s%s", prefix, b->name);
        snprintf(b->name, sizeof b->name, "%.95s", name);
        w->data = all + off;
        off += L->weight_count;
        b->data = all + off;
        off += L->bias_count;
        *n += 2;
    }
}

int checkpoint_save(const char *path, const net_desc *net, const float *all)
{
    return checkpoint_save_full(path, net, all, NULL, NULL, NULL);
}

int checkpoint_save_full(const char *path, const net_desc *net, const float *params,
                         const float *m, const float *v, const char *const *meta)
{
    st_tensor *t = calloc((size_t)net->n_layers * 6 + 1, sizeof *t);
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
        st_tensor want[2];
        memset(want, 0, sizeof want);
        layer_tensor_shapes(L, &want[0], &want[1], l);
        float *to[2] = {next, next + L->weight_count};
        next += L->weight_count + L->bias_count;
        size_t count[2] = {L->weight_count, L->bias_count};
        for (int k = 0; k < 2; k++) {
            char name[512];
            snprintf(name, sizeof name, "%s%s", prefix, want[k].name);
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
            memcpy(to[k], got->data, count[k] * sizeof(float));
        }
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
