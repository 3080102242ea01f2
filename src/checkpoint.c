#include "src/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/safetensors.h"

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

int checkpoint_save(const char *path, const net_desc *net, const float *all)
{
    st_tensor *t = calloc((size_t)net->n_layers * 2 + 1, sizeof *t);
    if (!t) return pt_error_set("out of memory");
    int n = 0;
    size_t off = 0;
    for (int l = 0; l < net->n_layers; l++) {
        const layer_desc *L = &net->layers[l];
        if (!L->weight_count) continue;
        layer_tensor_shapes(L, &t[n], &t[n + 1], l);
        t[n].data = all + off;
        off += L->weight_count;
        t[n + 1].data = all + off;
        off += L->bias_count;
        n += 2;
    }
    int rc = st_write(path, t, n);
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

int checkpoint_load_layers(const char *path, const net_desc *net, int first, int last,
                           float *params)
{
    st_file f;
    if (st_read(&f, path)) return -1;
    int rc = 0;
    float *next = params;
    for (int l = first; l < last && !rc; l++) {
        const layer_desc *L = &net->layers[l];
        if (!L->weight_count) continue;
        st_tensor want[2];
        memset(want, 0, sizeof want);
        layer_tensor_shapes(L, &want[0], &want[1], l);
        float *dst[2] = {next, next + L->weight_count};
        next += L->weight_count + L->bias_count;
        size_t count[2] = {L->weight_count, L->bias_count};
        for (int k = 0; k < 2 && !rc; k++) {
            const st_tensor *got = st_find(&f, want[k].name);
            if (!got) {
                rc = pt_error_set("%s: no tensor %s (layer %d, %s)", path, want[k].name, l,
                                  layer_type_name(L->type));
            } else if (!shapes_equal(got, &want[k])) {
                char a[64], b[64];
                shape_string(got, a, sizeof a);
                shape_string(&want[k], b, sizeof b);
                rc = pt_error_set("%s: tensor %s has shape %s but the model needs %s", path,
                                  want[k].name, a, b);
            } else {
                memcpy(dst[k], got->data, count[k] * sizeof(float));
            }
        }
    }
    st_free(&f);
    return rc;
}
