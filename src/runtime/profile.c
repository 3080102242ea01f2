/* Per-layer cost on this machine, for the `time` partitioner and the planner's simulator:
 * each layer runs alone as a one-layer stage on random data, on the device training will
 * use, forward then backward, and the median is kept. On the CPU the backward is also
 * measured split as zero-bubble schedules run it (input gradient B, then parameter
 * gradients W), with the stage API directly: the engine runs exactly these calls. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/rng.h"
#include "src/runtime/profile.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/runtime/engine_create.h"
#include "src/engine/engine.h"
#include "src/cpu/stage.h"

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

/* One layer alone as a split-backward stage (CPU, one thread, as profile_layer): random
 * input and output gradient; times of stage_backward_input and stage_backward_weight. */
static int profile_split(const net_desc *net, int l, int batch, int warmup, int repeats,
                         const int64_t *ids, double *ti, double *tw)
{
    stage st;
    if (stage_init(&st, net, l, l + 1, batch, 1, 1)) return -1;
    size_t in = stage_in_count(&st), out = stage_out_count(&st);
    float *x = malloc((size_t)batch * in * sizeof *x);
    float *dy = malloc((size_t)batch * out * sizeof *dy);
    float *dx = l > 0 ? malloc((size_t)batch * in * sizeof *dx) : NULL;
    int rc = !x || !dy || (l > 0 && !dx) ? pt_error_set("profile: out of memory")
                                         : stage_enable_split(&st);
    if (!rc) {
        stage_init_params(&st, 1);
        fill_random(x, (size_t)batch * in, 4);
        fill_random(dy, (size_t)batch * out, 5);
    }
    for (int r = 0; r < warmup + repeats && !rc; r++) {
        int slot = stage_slot_acquire(&st);
        if (slot < 0) {
            rc = -1;
            break;
        }
        stage_forward(&st, slot, x, batch, ids, 1, (uint64_t)r, 1);
        double t0 = pt_now();
        rc = stage_backward_input(&st, slot, dy, dx);
        double t1 = pt_now();
        if (!rc) rc = stage_backward_weight(&st, slot, 0, 1, NULL);
        double t2 = pt_now();
        stage_slot_release(&st, slot);
        stage_zero_grad(&st);
        if (r >= warmup) {
            ti[r - warmup] = t1 - t0;
            tw[r - warmup] = t2 - t1;
        }
    }
    free(x), free(dy), free(dx);
    stage_free(&st);
    return rc;
}

int partition_profile_measure_with(partition_profile *prof, const net_desc *net,
                                   const profile_options *opt)
{
    int batch = opt->batch, warmup = opt->warmup, repeats = opt->repeats;
    int device = opt->device, gpu = opt->gpu;
    memset(prof, 0, sizeof *prof);
    if (batch < 1 || repeats < 1 || warmup < 0)
        return pt_error_set("profile: batch %d, repeats %d and warm-up %d must be positive",
                            batch, repeats, warmup);
    prof->n_layers = net->n_layers;
    prof->fwd_s = calloc((size_t)net->n_layers, sizeof(double));
    prof->bwd_s = calloc((size_t)net->n_layers, sizeof(double));
    double *tf = calloc((size_t)repeats, sizeof(double));
    double *tb = calloc((size_t)repeats, sizeof(double));
    /* the split backward is measured where the stage API runs: on the CPU */
    int split = opt->split && device == ENGINE_CPU;
    if (split) {
        prof->bwd_input_s = calloc((size_t)net->n_layers, sizeof(double));
        prof->bwd_weight_s = calloc((size_t)net->n_layers, sizeof(double));
    }
    int64_t *ids = calloc((size_t)batch, sizeof *ids);
    /* random images (or token windows) for the first layer, labels for the last */
    dataset fake;
    int fake_rc = data_fake(&fake, net, batch);
    if (!prof->fwd_s || !prof->bwd_s || (split && (!prof->bwd_input_s || !prof->bwd_weight_s)) ||
        !tf || !tb || !ids || fake_rc) {
        pt_error_set("profile: out of memory");
        goto fail;
    }
    for (int j = 0; j < batch; j++) ids[j] = j;
    for (int l = 0; l < net->n_layers; l++) {
        if (profile_layer(net, l, batch, warmup, repeats, (engine_device)device, gpu, &fake, ids,
                          tf, tb))
            goto fail;
        prof->fwd_s[l] = median(tf, repeats) / batch;
        prof->bwd_s[l] = median(tb, repeats) / batch;
        if (!split) continue;
        if (profile_split(net, l, batch, warmup, repeats, ids, tf, tb)) goto fail;
        prof->bwd_input_s[l] = median(tf, repeats) / batch;
        prof->bwd_weight_s[l] = median(tb, repeats) / batch;
    }
    free(tf), free(tb), free(ids);
    data_free(&fake);
    return 0;
fail:
    free(tf), free(tb), free(ids);
    data_free(&fake);
    partition_profile_free(prof);
    return -1;
}

int partition_profile_measure_on(partition_profile *prof, const net_desc *net, int batch,
                                 int warmup, int repeats, int device, int gpu)
{
    profile_options opt = {.batch = batch, .warmup = warmup, .repeats = repeats,
                           .device = device, .gpu = gpu};
    return partition_profile_measure_with(prof, net, &opt);
}

int partition_profile_measure(partition_profile *prof, const net_desc *net, int batch,
                              int warmup, int repeats)
{
    profile_options opt = {.batch = batch, .warmup = warmup, .repeats = repeats,
                           .device = ENGINE_CPU, .split = 1};
    return partition_profile_measure_with(prof, net, &opt);
}
