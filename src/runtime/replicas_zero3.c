/* ZeRO-3: the parameters' gathers around each layer's passes (replicas_zero3.h). */
#include "src/runtime/replicas_zero3.h"

#include <limits.h>
#include <stdlib.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"

enum { GIVEN_BACK, GATHERING, WHOLE };

struct zero3 {
    MPI_Comm comm;      /* owned: a dup of the group, so that no gather matches a reduction */
    engine *eng;
    float *params;      /* the engine's host parameters */
    int n_layers, R;
    size_t *lo, *hi;    /* [n_layers] layer l's parameters [lo, hi); lo == hi: none */
    size_t *mine_lo, *mine_hi; /* [n_layers] this replica's shard of them */
    int *counts, *displs; /* [n_layers × R] each replica's part of layer l (displs from lo) */
    int *state;         /* [n_layers] GIVEN_BACK, GATHERING, WHOLE */
    MPI_Request *req;   /* [n_layers] */
    unsigned char *skipped; /* [n_layers] testing: never gathered before a pass */
    int fresh;          /* nothing given back yet: the first hook gives back every layer */
    int prefetch;       /* a layer's beginning starts the next one's gather */
    double timeout_s;
    long gathers;
    size_t bytes;
    double wait_s;
    float *cal;         /* zero3_calibrate's scratch, the stage's size, until calibrate_done */
};

static int has_params(const zero3_t *z, int l) { return z->hi[l] > z->lo[l]; }

/* ZeRO-3: the engine backs layer l's parts outside the shard again before MPI writes them
 * (pages moved from what the last releases kept), as give_back released them. */
static int fill(zero3_t *z, int l)
{
    engine *e = z->eng;
    if (!e->ops->params_fill) return 0;
    return e->ops->params_fill(e, z->lo[l], z->mine_lo[l] - z->lo[l]) ||
                   e->ops->params_fill(e, z->mine_hi[l], z->hi[l] - z->mine_hi[l])
               ? -1
               : 0;
}

static int start(zero3_t *z, int l)
{
    int *c = z->counts + (size_t)l * z->R, *d = z->displs + (size_t)l * z->R;
    if (fill(z, l)) return -1;
    if (PT_MPI_CALL(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, z->params + z->lo[l], c,
                                    d, MPI_FLOAT, z->comm, &z->req[l])))
        return -1;
    z->state[l] = GATHERING;
    z->gathers++;
    z->bytes += (z->hi[l] - z->lo[l] - (z->mine_hi[l] - z->mine_lo[l])) * sizeof(float);
    return 0;
}

static int wait_layer(zero3_t *z, int l)
{
    if (z->state[l] != GATHERING) return 0;
    double t0 = pt_now();
    if (mpi_wait_collective(&z->req[l], z->comm, z->timeout_s)) return -1; /* the message set */
    z->wait_s += pt_now() - t0;
    z->state[l] = WHOLE;
    return 0;
}

/* Layer l's pages outside this replica's shard go back (whole pages only: the partial
 * ends, shared with the shard or a neighbour, stay, and are overwritten by the next gather). */
static int give_back(zero3_t *z, int l)
{
    if (!has_params(z, l)) return 0;
    z->state[l] = GIVEN_BACK;
    engine *e = z->eng;
    return e->ops->params_release(e, z->lo[l], z->mine_lo[l] - z->lo[l]) ||
                   e->ops->params_release(e, z->mine_hi[l], z->hi[l] - z->mine_hi[l])
               ? -1
               : 0;
}

/* The next layer with parameters after l in the pass's direction, −1 for none. */
static int next_layer(const zero3_t *z, int l, int backward)
{
    for (int k = backward ? l - 1 : l + 1; k >= 0 && k < z->n_layers; k += backward ? -1 : 1)
        if (has_params(z, k) && !z->skipped[k]) return k;
    return -1;
}

static int hook(void *ctx, int l, int backward, int begins)
{
    zero3_t *z = ctx;
    if (z->fresh) { /* the initial values were whole: from now on only the shard stays */
        z->fresh = 0;
        if (zero3_release_all(z)) return -1;
    }
    if (l < 0 || l >= z->n_layers) return pt_error_set("ZeRO-3: layer %d of %d", l, z->n_layers);
    if (!has_params(z, l) || z->skipped[l]) return 0; /* skipped: the stale values stay */
    if (!begins) return give_back(z, l);
    if ((z->state[l] == GIVEN_BACK && start(z, l)) || wait_layer(z, l)) return -1;
    int k = z->prefetch ? next_layer(z, l, backward) : -1; /* its gather runs during l */
    return k >= 0 && z->state[k] == GIVEN_BACK ? start(z, k) : 0;
}

int zero3_settle(zero3_t *z)
{
    for (int l = 0; l < z->n_layers; l++)
        if (wait_layer(z, l)) return -1;
    return 0;
}

int zero3_release_all(zero3_t *z)
{
    if (zero3_settle(z)) return -1;
    for (int l = 0; l < z->n_layers; l++)
        if (give_back(z, l)) return -1;
    return 0;
}

int zero3_whole(zero3_t *z)
{
    for (int l = 0; l < z->n_layers; l++)
        if (has_params(z, l) && z->state[l] == GIVEN_BACK && start(z, l)) return -1;
    return zero3_settle(z);
}

int zero3_calibrate(zero3_t *z)
{
    size_t n = z->n_layers ? z->hi[z->n_layers - 1] : 0;
    if (!z->cal) z->cal = calloc(n ? n : 1, sizeof *z->cal); /* touched: no faults timed */
    float *buf = z->cal;
    MPI_Request *req = malloc((size_t)(z->n_layers ? z->n_layers : 1) * sizeof *req);
    int rc = buf && req ? 0 : pt_error_set("out of memory for ZeRO-3's calibration");
    int started = 0;
    for (int l = 0; !rc && l < z->n_layers; l++) {
        if (!has_params(z, l)) continue;
        rc = PT_MPI_CALL(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf + z->lo[l],
                                         z->counts + (size_t)l * z->R,
                                         z->displs + (size_t)l * z->R, MPI_FLOAT, z->comm,
                                         &req[started]));
        if (!rc) started++;
    }
    for (int k = 0; k < started; k++)
        if (mpi_wait_collective(&req[k], z->comm, z->timeout_s) && !rc) rc = -1;
    free(req);
    return rc;
}

void zero3_calibrate_done(zero3_t *z)
{
    free(z->cal);
    z->cal = NULL;
}

/* Layer l's parts: each replica's shard of its bucket (a layer lies in one) inside it. */
static int cut_layer(zero3_t *z, int l, const reduce_plan *plan, const reduce_t *red, int me,
                     int skip_bucket)
{
    int b = 0;
    while (b < plan->n_buckets && !(plan->buckets[b].offset <= z->lo[l] &&
                                    z->hi[l] <= plan->buckets[b].offset + plan->buckets[b].count))
        b++;
    if (b == plan->n_buckets) return pt_error_set("ZeRO-3: layer %d lies in no bucket", l);
    z->skipped[l] = b == skip_bucket;
    z->mine_lo[l] = z->mine_hi[l] = z->lo[l];
    for (int j = 0; j < z->R; j++) {
        size_t off, n;
        if (reduce_shard(red, b, j, &off, &n)) return -1;
        /* [a, e): the shard inside the layer, empty (at an end) where they do not meet */
        size_t a = off > z->lo[l] ? off : z->lo[l];
        if (a > z->hi[l]) a = z->hi[l];
        size_t e = off + n < z->hi[l] ? off + n : z->hi[l];
        if (e < a) e = a;
        if (e - z->lo[l] > INT_MAX) return pt_error_set("ZeRO-3: layer %d is too large for MPI", l);
        z->counts[(size_t)l * z->R + j] = (int)(e - a);
        z->displs[(size_t)l * z->R + j] = (int)(a - z->lo[l]);
        if (j == me) {
            z->mine_lo[l] = a;
            z->mine_hi[l] = e;
        }
    }
    return 0;
}

int zero3_init(zero3_t **out, MPI_Comm group, engine *eng, const net_desc *net, int first,
               int last, const reduce_plan *plan, const reduce_t *red, double timeout_s,
               int skip_bucket, int prefetch)
{
    *out = NULL;
    if (!eng->ops->params_shard || !eng->ops->params_release || !eng->ops->params_host)
        return pt_error_set("--zero 3: the %s engine cannot shard its parameters (ZeRO-3 runs "
                            "on the CPU engine)", eng->ops->name);
    zero3_t *z = calloc(1, sizeof *z);
    if (!z) return pt_error_set("out of memory");
    z->comm = MPI_COMM_NULL;
    z->eng = eng;
    z->n_layers = last - first;
    z->R = reduce_group_size(red);
    z->timeout_s = timeout_s;
    z->prefetch = prefetch;
    z->fresh = 1;
    size_t L = (size_t)z->n_layers, LR = L * (size_t)z->R;
    z->lo = calloc(L, sizeof *z->lo);
    z->hi = calloc(L, sizeof *z->hi);
    z->mine_lo = calloc(L, sizeof *z->mine_lo);
    z->mine_hi = calloc(L, sizeof *z->mine_hi);
    z->counts = calloc(LR, sizeof *z->counts);
    z->displs = calloc(LR, sizeof *z->displs);
    z->state = calloc(L, sizeof *z->state);
    z->req = malloc(L * sizeof *z->req);
    z->skipped = calloc(L, 1);
    int rc = z->skipped && z->lo && z->hi && z->mine_lo && z->mine_hi && z->counts &&
                     z->displs && z->state && z->req
                 ? 0
                 : pt_error_set("out of memory");
    size_t off = 0;
    for (int l = 0; l < z->n_layers && !rc; l++) {
        const layer_desc *Ld = &net->layers[first + l];
        z->req[l] = MPI_REQUEST_NULL;
        z->lo[l] = off;
        z->hi[l] = off += Ld->weight_count + Ld->bias_count;
        if (has_params(z, l))
            rc = cut_layer(z, l, plan, red, reduce_group_rank(red), skip_bucket);
    }
    if (!rc) rc = eng->ops->params_host(eng, &z->params);
    if (!rc) { /* polite: a blocking dup spins where ranks outnumber cores */
        MPI_Request req;
        rc = PT_MPI_CALL(MPI_Comm_idup(group, &z->comm, &req));
        if (!rc) rc = mpi_wait_collective(&req, group, timeout_s);
    }
    /* what the engine may keep between a release and the next gather: the layer given back
     * and the one prefetched, the two largest layers' parts outside the shard (one without
     * prefetch) */
    size_t big[2] = {0, 0};
    for (int l = 0; l < z->n_layers && !rc; l++) {
        size_t n = (z->hi[l] - z->lo[l] - (z->mine_hi[l] - z->mine_lo[l])) * sizeof(float);
        if (n > big[0]) big[1] = big[0], big[0] = n;
        else if (n > big[1]) big[1] = n;
    }
    if (!rc) rc = eng->ops->params_shard(eng, hook, z, big[0] + (prefetch ? big[1] : 0));
    if (rc) {
        zero3_free(z);
        return -1;
    }
    *out = z;
    return 0;
}

void zero3_free(zero3_t *z)
{
    if (!z) return;
    for (int l = 0; z->req && l < z->n_layers; l++)
        if (z->req[l] != MPI_REQUEST_NULL) MPI_Request_free(&z->req[l]);
    if (z->comm != MPI_COMM_NULL) MPI_Comm_free(&z->comm);
    free(z->lo);
    free(z->hi);
    free(z->mine_lo);
    free(z->mine_hi);
    free(z->counts);
    free(z->displs);
    free(z->state);
    free(z->req);
    free(z->skipped);
    free(z->cal);
    free(z);
}

void zero3_stats(const zero3_t *z, long *gathers, size_t *bytes, double *wait_s)
{
    *gathers = z ? z->gathers : 0;
    *bytes = z ? z->bytes : 0;
    *wait_s = z ? z->wait_s : 0;
}
