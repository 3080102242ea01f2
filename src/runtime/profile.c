/* Per-layer cost on this machine, for the `time` partitioner and the planner's simulator:
 * each layer runs alone as a one-layer stage on random data, on the device training will
 * use, forward then backward, and the median is kept. On the CPU the backward is also
 * measured split as zero-bubble schedules run it (input gradient B, then parameter
 * gradients W), with the stage API directly: the engine runs exactly these calls. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
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
/* A run of a layer that takes longer than this is measured once, without a warm-up: the
 * blocks and heads of GPT-2-sized models on a CPU take seconds each, and a second run would
 * not change their figure much. *measured: the repetitions timed. */
#define PROFILE_LONG_S 1.0

static int profile_layer(const net_desc *net, int l, int batch, int warmup, int repeats,
                         engine_device device, int gpu, engine_precision precision,
                         const dataset *fake, const int64_t *ids, double *tf, double *tb,
                         int *measured)
{
    engine_config cfg = {.net = net, .first = l, .last = l + 1, .buffers = 2,
                         .max_batch = batch, .n_slots = 1, .batch = batch, .threads = 1,
                         .device = gpu, .max_ticks = 2, .precision = precision};
    engine *g;
    if (engine_create(&g, device, &cfg)) return -1;
    /* a language model's layers are timed on zero parameters: drawing GPT-2's normals for
     * a 50,257-token matrix takes longer than timing the layer, and the time of a product
     * does not depend on the values */
    int rc = net->sequence ? 0 : engine_init_params(g, 1);
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
    *measured = 0;
    for (int r = 0; r < warmup + repeats && !rc; r++) {
        rc = engine_forward(g, 0, batch, 1, (uint64_t)r, 1, 0);
        if (!rc) rc = engine_backward(g, 0, 1);
        if (!rc) rc = engine_release(g, 0);
        if (!rc) rc = engine_finish(g, &res);
        if (rc) break;
        double f = g->tick_t1[0] - g->tick_t0[0], b = g->tick_t1[1] - g->tick_t0[1];
        if (r < warmup && f + b < PROFILE_LONG_S) continue;
        tf[*measured] = f;
        tb[*measured] = b;
        if (++*measured == repeats || f + b >= PROFILE_LONG_S) break;
    }
    engine_destroy(g);
    return rc;
}

/* One layer alone as a split-backward stage (CPU, one thread, as profile_layer): random
 * input and output gradient; times of stage_backward_input and stage_backward_weight. */
static int profile_split(const net_desc *net, int l, int batch, int warmup, int repeats,
                         engine_precision precision, const int64_t *ids, double *ti,
                         double *tw, int *measured)
{
    *measured = 0;
    stage st;
    if (stage_init(&st, net, l, l + 1, batch, 1, 1)) return -1;
    st.bf16 = precision == ENGINE_BF16;
    size_t in = stage_in_count(&st), out = stage_out_count(&st);
    float *x = malloc((size_t)batch * in * sizeof *x);
    float *dy = malloc((size_t)batch * out * sizeof *dy);
    float *dx = l > 0 ? malloc((size_t)batch * in * sizeof *dx) : NULL;
    int rc = !x || !dy || (l > 0 && !dx) ? pt_error_set("profile: out of memory")
                                         : stage_enable_split(&st);
    if (!rc) {
        if (!net->sequence) stage_init_params(&st, 1); /* as profile_layer */
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
        if (r < warmup && t2 - t0 < PROFILE_LONG_S) continue;
        ti[*measured] = t1 - t0;
        tw[*measured] = t2 - t1;
        if (++*measured == repeats || t2 - t0 >= PROFILE_LONG_S) break;
    }
    free(x), free(dy), free(dx);
    stage_free(&st);
    return rc;
}

/* The earlier layer of the same transformer kind and shapes as layer l (−1: none). Older
 * models' layers are each measured, as before. */
static int same_as_earlier(const net_desc *net, int l)
{
    const layer_desc *L = &net->layers[l];
    if (L->type != LAYER_BLOCK) return -1;
    for (int e = 0; e < l; e++) {
        const layer_desc *E = &net->layers[e];
        if (E->type == L->type && E->in.c == L->in.c && E->in.w == L->in.w &&
            E->u.block.heads == L->u.block.heads && E->u.block.hidden == L->u.block.hidden &&
            E->u.block.p == L->u.block.p)
            return e;
    }
    return -1;
}

int partition_profile_measure_with(partition_profile *prof, const net_desc *net,
                                   const profile_options *opt)
{
    /* a language model's sample is a whole sequence: one is enough for its products */
    int batch = net->sequence ? 1 : opt->batch, warmup = opt->warmup, repeats = opt->repeats;
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
    /* as a rank of train multiplies (train_setup.c): on one BLAS thread */
    int blas = kernel_blas_threads(1);
    for (int l = 0; l < net->n_layers; l++) {
        int same = same_as_earlier(net, l), measured;
        if (same >= 0) { /* a transformer's blocks are alike: measured once */
            prof->fwd_s[l] = prof->fwd_s[same];
            prof->bwd_s[l] = prof->bwd_s[same];
            if (split) {
                prof->bwd_input_s[l] = prof->bwd_input_s[same];
                prof->bwd_weight_s[l] = prof->bwd_weight_s[same];
            }
            continue;
        }
        if (profile_layer(net, l, batch, warmup, repeats, (engine_device)device, gpu,
                          opt->precision, &fake, ids, tf, tb, &measured))
            goto fail_blas;
        prof->fwd_s[l] = median(tf, measured) / batch;
        prof->bwd_s[l] = median(tb, measured) / batch;
        if (!split) continue;
        if (profile_split(net, l, batch, warmup, repeats, opt->precision, ids, tf, tb,
                          &measured))
            goto fail_blas;
        prof->bwd_input_s[l] = median(tf, measured) / batch;
        prof->bwd_weight_s[l] = median(tb, measured) / batch;
    }
    kernel_blas_threads(blas);
    free(tf), free(tb), free(ids);
    data_free(&fake);
    return 0;
fail_blas:
    kernel_blas_threads(blas);
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
