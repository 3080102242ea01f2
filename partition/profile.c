/* Per-layer cost on this machine, for the `time` partitioner: each layer runs alone as a
 * one-layer stage on random data, forward then backward, and the median is kept. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/rng.h"
#include "partition/partition.h"
#include "src/clock.h"
#include "src/error.h"
#include "src/stage.h"

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

static void fill_random(float *x, size_t n, uint64_t stream)
{
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform_at(12345, stream, i) - 0.5f;
}

int partition_profile_measure(partition_profile *prof, const net_desc *net, int batch,
                              int warmup, int repeats)
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
    if (!prof->fwd_s || !prof->bwd_s || !tf || !tb || !ids) goto oom;
    for (int j = 0; j < batch; j++) ids[j] = j;
    for (int l = 0; l < net->n_layers; l++) {
        stage st;
        if (stage_init(&st, net, l, l + 1, batch, 1, 1)) goto fail;
        stage_init_params(&st, 1);
        size_t nin = (size_t)batch * stage_in_count(&st), nout = (size_t)batch * stage_out_count(&st);
        float *x = malloc(nin * sizeof *x), *dy = malloc(nout * sizeof *dy),
              *dx = malloc(nin * sizeof *dx);
        if (!x || !dy || !dx) {
            free(x), free(dy), free(dx);
            stage_free(&st);
            goto oom;
        }
        fill_random(x, nin, 1);
        fill_random(dy, nout, 2);
        /* the first layer of a model needs no input gradient, any other does */
        float *din = l == 0 ? NULL : dx;
        for (int r = 0; r < warmup + repeats; r++) {
            double t0 = pt_now();
            stage_forward(&st, 0, x, batch, ids, 1, (uint64_t)r, 1);
            double t1 = pt_now();
            stage_backward(&st, 0, dy, din);
            double t2 = pt_now();
            if (r >= warmup) {
                tf[r - warmup] = t1 - t0;
                tb[r - warmup] = t2 - t1;
            }
        }
        prof->fwd_s[l] = median(tf, repeats) / batch;
        prof->bwd_s[l] = median(tb, repeats) / batch;
        free(x), free(dy), free(dx);
        stage_free(&st);
    }
    free(tf), free(tb), free(ids);
    return 0;
oom:
    pt_error_set("profile: out of memory");
fail:
    free(tf), free(tb), free(ids);
    partition_profile_free(prof);
    return -1;
}
