/* Per-layer cost on this machine, for the `time` partitioner: each layer runs alone as a
 * one-layer stage on random data, on the device training will use, forward then backward,
 * and the median is kept. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/rng.h"
#include "src/profile.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/engine.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void fill_random(void *buf, size_t n, uint64_t stream)
{
    float *x = buf;
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform_at(12345, stream, i) - 0.5f;
}

/* One layer alone as a stage on `device`: random inputs (pixels for the first layer) and,
 * unless it ends the model, random output gradients; the engine's own timings (device
 * events on a GPU) of forward and backward. */
static int profile_layer(const net_desc *net, int l, int batch, int warmup, int repeats,
                         engine_device device, int gpu, const dataset *fake,
                         const int64_t *ids, double *tf, double *tb)
{
    engine_config cfg = {.net = net, .first = l, .last = l + 1, .buffers = 2,
                         .max_batch = batch, .n_slots = 1, .batch = batch, .threads = 1,
                         .device = gpu, .max_ticks = 2};
    engine *g;
    if (engine_create(&g, device, &cfg)) return -1;
    int rc = engine_init_params(g, 1);
    if (!rc) rc = engine_load(g, 0, fake, ids, batch);
    if (!rc && l > 0) {
        fill_random(engine_msg_buffer(g, ENGINE_MSG_ACT_IN, 0), (size_t)batch * g->in_count, 1);
        rc = engine_msg_received(g, ENGINE_MSG_ACT_IN, 0);
    }
    if (!rc && l + 1 < net->n_layers) {
        fill_random(engine_msg_buffer(g, ENGINE_MSG_GRAD_IN, 0), (size_t)batch * g->out_count,
                    2);
        rc = engine_msg_received(g, ENGINE_MSG_GRAD_IN, 0);
    }
    engine_result res;
    for (int r = 0; r < warmup + repeats && !rc; r++) {
        rc = engine_forward(g, 0, batch, 1, (uint64_t)r, 1, 0);
        if (!rc) rc = engine_backward(g, 0, 1);
        if (!rc) rc = engine_release(g, 0);
        if (!rc) rc = engine_finish(g, &res);
        if (!rc && r >= warmup) {
            tf[r - warmup] = g->tick_t1[0] - g->tick_t0[0];
            tb[r - warmup] = g->tick_t1[1] - g->tick_t0[1];
        }
    }
    engine_destroy(g);
    return rc;
}

int partition_profile_measure_on(partition_profile *prof, const net_desc *net, int batch,
                                 int warmup, int repeats, int device, int gpu)
{
    memset(prof, 0, sizeof *prof);
    if (batch < 1 || repeats < 1 || warmup < 0)
        return pt_error_set("profile: batch %d, repeats %d and warm-up %d must be positive",
                            batch, repeats, warmup);
    prof->n_layers = net->n_layers;
    prof->fwd_s = calloc((size_t)net->n_layers, sizeof(double));
    prof->bwd_s = calloc((size_t)net->n_layers, sizeof(double));
    double *tf = calloc((size_t)repeats, sizeof(double));
    double *tb = calloc((size_t)repeats, sizeof(double));
    int64_t *ids = calloc((size_t)batch, sizeof *ids);
    /* a data set of random images for the first layer, labels for the last */
    size_t px = layer_shape_count(net->input);
    dataset fake = {.count = batch, .rows = (int)px, .cols = 1,
                    .pixels = malloc((size_t)batch * px), .labels = calloc((size_t)batch, 4)};
    if (!prof->fwd_s || !prof->bwd_s || !tf || !tb || !ids || !fake.pixels || !fake.labels) {
        pt_error_set("profile: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < (size_t)batch * px; i++)
        fake.pixels[i] = (uint8_t)(rng_uniform_at(12345, 3, i) * 255.0f);
    for (int j = 0; j < batch; j++) {
        ids[j] = j;
        fake.labels[j] = j % net->classes;
    }
    for (int l = 0; l < net->n_layers; l++) {
        if (profile_layer(net, l, batch, warmup, repeats, (engine_device)device, gpu, &fake, ids,
                          tf, tb))
            goto fail;
        prof->fwd_s[l] = median(tf, repeats) / batch;
        prof->bwd_s[l] = median(tb, repeats) / batch;
    }
    free(tf), free(tb), free(ids), free(fake.pixels), free(fake.labels);
    return 0;
fail:
    free(tf), free(tb), free(ids), free(fake.pixels), free(fake.labels);
    partition_profile_free(prof);
    return -1;
}

int partition_profile_measure(partition_profile *prof, const net_desc *net, int batch,
                              int warmup, int repeats)
{
    return partition_profile_measure_on(prof, net, batch, warmup, repeats, ENGINE_CPU, 0);
}
