/* The step's gradient finish (src/runtime/exec_impl.h): what happens to the gradients after
 * the data-parallel reduction and before the optimizer's update, on either device, through
 * the engines' host views of their gradients (engine_grads_host / engine_grads_commit: the
 * CPU engine's own memory, a CUDA engine's pinned mirror, copied back when changed).
 *
 * 1. A tied lm_head (docs/DESIGN.md, the parameter order): the head keeps its own copy of
 *    the embedding's token matrix wte; the two gradients are summed and both copies receive
 *    the sum, so the copies stay bit-identical. One stage holding both adds them; in a
 *    pipeline the two ranks holding them all-reduce on a communicator of their own (one
 *    per replica and tensor index), made at exec_start. a + b = b + a in floats, so both
 *    ways give the same bits.
 * 0. Sequence parallelism (src/model/shard.h): the layer norms' parameter gradients are
 *    sums over each tensor rank's positions; the tensor group all-gathers them and every
 *    rank adds the ranks' parts in rank order, so the group holds the same bits, the same
 *    in every pipeline and replica layout (after the replicas' reduction, which is linear).
 * 2. --clip-grad-norm X (torch.nn.utils.clip_grad_norm_): the whole model's gradient norm,
 *    from per-layer sums of squares in double (kernel_sum_squares_cpu), all-gathered over
 *    the job and added in the net's layer order, so it has the same bits in every pipeline
 *    and replica layout. Each parameter counts once: replica 0's (after the reduction every
 *    replica holds the same gradient; with a -bcast method only replica 0 holds it), a
 *    tensor-split layer's shards added in tensor rank order, a value that several tensor
 *    ranks hold (a whole bias of an input-split layer) by the lowest of them, and a tied
 *    head not at all (after step 1 it equals wte's gradient). Every rank then scales its
 *    gradients by kernel_clip_scale (kernel_scale_cpu).
 *    With ZeRO (--zero) a replica holds the sum of its shards only: each replica counts
 *    the parts of the runs in its shards, and a layer's parts add up in world rank order
 *    (deterministic; the norm is then within a double's rounding of the unsharded one). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "src/runtime/exec_impl.h"

/* A run of a layer's parameters this rank holds: its index in the whole layer, in the
 * rank's local layer, and its length. */
typedef struct {
    size_t whole, local, count;
} param_run;

typedef struct {
    param_run *r;
    int n, cap, failed;
} run_list;

/* A run of local parameters the norm counts: engine v's [off, off + count), of net layer. */
typedef struct {
    int v, layer;
    size_t off, count;
} norm_run;

/* The tie's runs: the same whole values of wte and of the head, at these local indices. */
typedef struct {
    size_t wte, head, count;
} tie_run;

struct exec_finish {
    int head;                 /* the tied lm_head (−1: none) */
    tie_run *tie;             /* [n_tie]; none: no tie to make */
    int n_tie;
    engine *wte_eng, *head_eng; /* this rank's engines holding them (NULL: elsewhere) */
    size_t wte_off, wte_count, head_off, head_count; /* their layers' local ranges there */
    MPI_Comm pair;            /* the two ranks holding them (MPI_COMM_NULL: one holds both) */
    norm_run *norm;           /* [n_norm]: what this rank's norm counts */
    int n_norm;
    double *sums, *all;       /* [layers], [world size · layers] (NULL: not yet needed) */
    MPI_Request req;          /* the all-gather of the norm's parts (norm_post) */
    float **host;             /* [V]: each engine's host view during the clip */
    double last_norm;         /* the last step's norm before clipping (NAN: not computed) */
    norm_run *seq;            /* [n_seq]: the runs step 0 sums over the tensor group */
    int n_seq, seq_ready;
    size_t seq_count;         /* their floats */
    float *seq_mine, *seq_all; /* [seq_count], [T · seq_count] */
};

/* The net as this rank runs it (its tensor shard's layers). */
static const net_desc *local_net(const exec_t *e)
{
    return e->cfg.local_net ? e->cfg.local_net : e->net;
}

static size_t local_count(const exec_t *e, int l)
{
    const layer_desc *L = &local_net(e)->layers[l];
    return L->weight_count + L->bias_count;
}

static int sharded(const exec_t *e) { return e->cfg.shard && e->cfg.shard->T > 1; }

/* The engine of this rank holding net layer l and where its parameters start there; NULL
 * when l is elsewhere. */
static engine *engine_of(const exec_t *e, int l, size_t *off)
{
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        if (l < g->cfg.first || l >= g->cfg.last) continue;
        *off = 0;
        for (int k = g->cfg.first; k < l; k++) *off += local_count(e, k);
        return g;
    }
    return NULL;
}

static void collect_run(void *ctx, size_t whole, size_t local, size_t count)
{
    run_list *rl = ctx;
    if (rl->failed || !count) return;
    if (rl->n == rl->cap) {
        int cap = rl->cap ? 2 * rl->cap : 16;
        param_run *r = realloc(rl->r, (size_t)cap * sizeof *r);
        if (!r) {
            rl->failed = 1;
            return;
        }
        rl->r = r;
        rl->cap = cap;
    }
    rl->r[rl->n++] = (param_run){whole, local, count};
}

static int by_whole(const void *a, const void *b)
{
    size_t x = ((const param_run *)a)->whole, y = ((const param_run *)b)->whole;
    return (x > y) - (x < y);
}

/* The runs of layer l that tensor rank t holds, sorted by their whole index (a whole
 * layer without shards). −1 when out of memory (rl freed). */
static int layer_runs(const exec_t *e, int l, int t, run_list *rl)
{
    *rl = (run_list){0};
    if (!sharded(e))
        collect_run(rl, 0, 0, e->net->layers[l].weight_count + e->net->layers[l].bias_count);
    else
        shard_layer_runs(e->cfg.shard, e->net, l, t, collect_run, rl);
    if (rl->failed) {
        free(rl->r);
        return pt_error_set("out of memory");
    }
    if (rl->n > 1) qsort(rl->r, (size_t)rl->n, sizeof *rl->r, by_whole);
    return 0;
}

/* ------------------------------------------------------------------ the tie ---- */

/* Pairs wte's runs (its first `n` whole values) with the head's: both must hold the same
 * whole values on this tensor rank, or the copies could not be summed here. */
static int pair_runs(struct exec_finish *f, const run_list *w, const run_list *h, size_t n)
{
    f->tie = calloc((size_t)(w->n + h->n) + 1, sizeof *f->tie);
    if (!f->tie) return pt_error_set("out of memory");
    int i = 0, j = 0;
    size_t wi = 0, hj = 0; /* consumed of the current runs */
    while (i < w->n && w->r[i].whole < n && j < h->n) {
        const param_run *a = &w->r[i], *b = &h->r[j];
        if (a->whole + wi != b->whole + hj) break;
        size_t ra = a->count - wi, rb = b->count - hj;
        if (a->whole + a->count > n) ra = n - a->whole - wi;
        size_t len = ra < rb ? ra : rb;
        f->tie[f->n_tie++] = (tie_run){a->local + wi, b->local + hj, len};
        wi += len, hj += len;
        if (wi == a->count || a->whole + wi == n) i++, wi = 0;
        if (hj == b->count) j++, hj = 0;
    }
    int w_done = i == w->n || w->r[i].whole + wi >= n;
    if (!w_done || j < h->n)
        return pt_error_set("the tied lm_head's tensor shards hold other values of the token "
                            "matrix than the embedding's: they cannot be summed");
    return 0;
}

/* The tie's runs and ranks. Collective over the pipeline when the net has a tied head. */
static int tie_start(exec_t *e, struct exec_finish *f)
{
    f->head = e->net->tied_head;
    if (f->head < 0) return 0;
    const layer_desc *E = &e->net->layers[0];
    if (E->type != LAYER_EMBEDDING)
        return pt_error_set("a tied lm_head needs an [embedding] at layer 0");
    size_t n = (size_t)E->u.embedding.vocab * (size_t)E->u.embedding.width;
    run_list w, h;
    if (layer_runs(e, 0, e->cfg.tensor_rank, &w)) return -1;
    if (layer_runs(e, f->head, e->cfg.tensor_rank, &h)) {
        free(w.r);
        return -1;
    }
    int rc = pair_runs(f, &w, &h, n);
    free(w.r);
    free(h.r);
    if (rc) return -1;
    for (int k = 0; k < f->n_tie; k++)
        if (f->tie[k].count > INT_MAX)
            return pt_error_set("a tied head's run of %zu values is too large for MPI",
                                f->tie[k].count);
    f->wte_eng = engine_of(e, 0, &f->wte_off);
    f->head_eng = engine_of(e, f->head, &f->head_off);
    if (f->wte_eng) f->wte_count = local_count(e, 0);
    if (f->head_eng) f->head_count = local_count(e, f->head);
    /* the two ranks holding the layers (every rank of the pipeline takes part in the split) */
    int mine = f->wte_eng || f->head_eng;
    MPI_Comm pair = MPI_COMM_NULL;
    if (mpi_wait_split(e->comm, mine ? 0 : MPI_UNDEFINED, e->rank, e->cfg.timeout_s, &pair))
        return -1;
    int size = 0;
    if (pair != MPI_COMM_NULL) PT_MPI_CHECK(MPI_Comm_size(pair, &size));
    if (size == 2) f->pair = pair;
    else if (pair != MPI_COMM_NULL) MPI_Comm_free(&pair);
    return 0;
}

/* Step 1: both copies receive wte's gradient + the head's. */
static int tie_step(exec_t *e, struct exec_finish *f)
{
    if (!f->n_tie || (!f->wte_eng && !f->head_eng)) return 0;
    float *a = NULL, *b = NULL;
    if (f->wte_eng && engine_grads_host(f->wte_eng, 0, f->wte_off, f->wte_count, &a)) return -1;
    if (f->head_eng && engine_grads_host(f->head_eng, 0, f->head_off, f->head_count, &b))
        return -1;
    for (int k = 0; k < f->n_tie; k++) {
        const tie_run *t = &f->tie[k];
        if (a && b) { /* one stage holds both */
            float *x = a + t->wte, *y = b + t->head;
            for (size_t i = 0; i < t->count; i++) x[i] = y[i] = x[i] + y[i];
            continue;
        }
        MPI_Request req;
        if (PT_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, a ? a + t->wte : b + t->head,
                                       (int)t->count, MPI_FLOAT, MPI_SUM, f->pair, &req)) ||
            mpi_wait_collective(&req, f->pair, e->cfg.timeout_s))
            return -1;
    }
    if (a && engine_grads_commit(f->wte_eng, f->wte_off, f->wte_count)) return -1;
    if (b && engine_grads_commit(f->head_eng, f->head_off, f->head_count)) return -1;
    return 0;
}

/* ------------------------------------------- step 0: sequence-parallel sums ---- */

typedef struct {
    struct exec_finish *f;
    int v, layer, cap, failed;
    size_t off;
} seq_collect;

static void seq_run(void *ctx, size_t local, size_t count)
{
    seq_collect *c = ctx;
    struct exec_finish *f = c->f;
    if (c->failed || !count) return;
    if (f->n_seq == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        norm_run *r = realloc(f->seq, (size_t)cap * sizeof *r);
        if (!r) {
            c->failed = 1;
            return;
        }
        f->seq = r;
        c->cap = cap;
    }
    f->seq[f->n_seq++] = (norm_run){c->v, c->layer, c->off + local, count};
    f->seq_count += count;
}

static int seq_start(exec_t *e, struct exec_finish *f)
{
    f->seq_ready = 1;
    const shard_plan *sp = e->cfg.shard;
    if (!shard_sequence(sp)) return 0;
    seq_collect c = {.f = f};
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        c.off = 0;
        c.v = v;
        for (int l = g->cfg.first; l < g->cfg.last; l++) {
            c.layer = l;
            shard_seq_partial_runs(sp, e->net, l, e->cfg.tensor_rank, seq_run, &c);
            c.off += local_count(e, l);
        }
    }
    if (c.failed) return pt_error_set("out of memory");
    if (!f->seq_count) return 0;
    if (f->seq_count * (size_t)sp->T > INT_MAX)
        return pt_error_set("the layer norms' %zu gradients are too many for one MPI message",
                            f->seq_count);
    f->seq_mine = malloc(f->seq_count * sizeof *f->seq_mine);
    f->seq_all = malloc(f->seq_count * (size_t)sp->T * sizeof *f->seq_all);
    if (!f->seq_mine || !f->seq_all) return pt_error_set("out of memory");
    return 0;
}

/* Step 0: the layer norms' gradients summed over the tensor group in rank order. */
static int seq_step(exec_t *e, struct exec_finish *f)
{
    if (!f->seq_ready && seq_start(e, f)) return -1;
    if (!f->seq_count) return 0;
    int T = e->cfg.shard->T;
    float *host[e->V];
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        host[v] = NULL;
        if (g->param_count && engine_grads_host(g, 0, 0, g->param_count, &host[v])) return -1;
    }
    size_t at = 0;
    for (int k = 0; k < f->n_seq; k++) {
        const norm_run *r = &f->seq[k];
        memcpy(f->seq_mine + at, host[r->v] + r->off, r->count * sizeof(float));
        at += r->count;
    }
    MPI_Request req;
    int n = (int)f->seq_count;
    if (PT_MPI_CALL(MPI_Iallgather(f->seq_mine, n, MPI_FLOAT, f->seq_all, n, MPI_FLOAT,
                                   e->cfg.tensor, &req)) ||
        mpi_wait_collective(&req, e->cfg.tensor, e->cfg.timeout_s))
        return -1;
    for (size_t i = 0; i < f->seq_count; i++) {
        float sum = f->seq_all[i];
        for (int t = 1; t < T; t++) sum += f->seq_all[(size_t)t * f->seq_count + i];
        f->seq_mine[i] = sum;
    }
    at = 0;
    for (int k = 0; k < f->n_seq; k++) {
        const norm_run *r = &f->seq[k];
        memcpy(host[r->v] + r->off, f->seq_mine + at, r->count * sizeof(float));
        at += r->count;
    }
    for (int v = 0; v < e->V; v++)
        if (host[v] && engine_grads_commit(e->engs[v], 0, e->engs[v]->param_count)) return -1;
    return 0;
}

/* ----------------------------------------------------------------- the norm ---- */

static int add_norm_run(struct exec_finish *f, int *cap, norm_run r)
{
    if (!r.count) return 0;
    if (f->n_norm == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        norm_run *n = realloc(f->norm, (size_t)*cap * sizeof *n);
        if (!n) return pt_error_set("out of memory");
        f->norm = n;
    }
    f->norm[f->n_norm++] = r;
    return 0;
}

/* Layer l's values that this tensor rank counts (those no lower tensor rank holds), in
 * local order, into f->norm as engine v's runs from `off`. */
static int norm_layer(exec_t *e, struct exec_finish *f, int *cap, int v, int l, size_t off)
{
    int t = e->cfg.tensor_rank;
    run_list mine;
    if (layer_runs(e, l, t, &mine)) return -1;
    const layer_desc *L = &e->net->layers[l];
    size_t whole = L->weight_count + L->bias_count;
    unsigned char *held = t > 0 ? calloc(whole / 8 + 1, 1) : NULL;
    int rc = t > 0 && !held ? pt_error_set("out of memory") : 0;
    for (int u = 0; u < t && !rc; u++) { /* what the lower tensor ranks hold */
        run_list o;
        rc = layer_runs(e, l, u, &o);
        for (int k = 0; !rc && k < o.n; k++)
            for (size_t i = o.r[k].whole; i < o.r[k].whole + o.r[k].count; i++)
                held[i / 8] |= (unsigned char)(1u << (i % 8));
        if (!rc) free(o.r);
    }
    for (int k = 0; !rc && k < mine.n; k++) { /* this rank's runs, cut where held */
        const param_run *r = &mine.r[k];
        size_t i = 0;
        while (!rc && i < r->count) {
            size_t j = i;
            int skip = held && (held[(r->whole + i) / 8] >> ((r->whole + i) % 8) & 1);
            while (j < r->count &&
                   skip == (held && (held[(r->whole + j) / 8] >> ((r->whole + j) % 8) & 1)))
                j++;
            if (!skip)
                rc = add_norm_run(f, cap, (norm_run){v, l, off + r->local + i, j - i});
            i = j;
        }
    }
    free(held);
    free(mine.r);
    return rc;
}

/* What this rank's norm counts, sorted by layer then local order (runs of one layer are
 * added in that order); local work, done at the first clipped step. */
static int norm_start(exec_t *e, struct exec_finish *f)
{
    int cap = 0, L = e->net->n_layers;
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        size_t off = 0;
        for (int l = g->cfg.first; l < g->cfg.last; l++) {
            if (l != f->head && norm_layer(e, f, &cap, v, l, off)) return -1;
            off += local_count(e, l);
        }
    }
    f->sums = calloc((size_t)L, sizeof *f->sums);
    f->all = calloc((size_t)L * (size_t)e->world_size, sizeof *f->all);
    f->host = calloc((size_t)e->V, sizeof *f->host);
    if (!f->sums || !f->all || !f->host) return pt_error_set("out of memory");
    return 0;
}

/* Step 2, first half: this rank's part of the norm and the all-gather of the parts,
 * started (norm_settle waits for it). */
static int norm_post(exec_t *e, struct exec_finish *f)
{
    if (!f->sums && norm_start(e, f)) return -1;
    int L = e->net->n_layers;
    memset(f->sums, 0, (size_t)L * sizeof *f->sums);
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        f->host[v] = NULL;
        if (g->param_count && engine_grads_host(g, 0, 0, g->param_count, &f->host[v]))
            return -1;
    }
    for (int k = 0; k < f->n_norm; k++) {
        const norm_run *r = &f->norm[k];
        int nz;
        const engine_run *z = replicas_shard_runs(e->reps ? e->reps[r->v] : NULL, &nz);
        if (!nz) { /* replica 0 counts the whole run */
            if (e->replica == 0)
                f->sums[r->layer] += kernel_sum_squares_cpu(f->host[r->v] + r->off, r->count);
            continue;
        }
        /* ZeRO: each replica holds the sum of its shards only and counts their part of the
         * run, in bucket order; the group's parts add up in world rank order below */
        for (int b = 0; b < nz; b++) {
            size_t lo = z[b].off > r->off ? z[b].off : r->off;
            size_t hi = z[b].off + z[b].count < r->off + r->count ? z[b].off + z[b].count
                                                                   : r->off + r->count;
            if (hi > lo) f->sums[r->layer] += kernel_sum_squares_cpu(f->host[r->v] + lo, hi - lo);
        }
    }
    f->req = MPI_REQUEST_NULL;
    return PT_MPI_CALL(MPI_Iallgather(f->sums, L, MPI_DOUBLE, f->all, L, MPI_DOUBLE, e->world,
                                      &f->req));
}

/* Step 2, second half: the whole norm's sum of squares (the same bits on every rank). */
static int norm_settle(exec_t *e, struct exec_finish *f, double *total)
{
    if (mpi_wait_collective(&f->req, e->world, e->cfg.timeout_s)) return -1;
    /* a layer's shards in world rank order (a stage's tensor ranks are consecutive), the
     * layers in order; every other rank's entry for the layer is an exact 0 */
    int L = e->net->n_layers;
    *total = 0;
    for (int l = 0; l < L; l++) {
        double layer = 0;
        for (int r = 0; r < e->world_size; r++) layer += f->all[(size_t)r * L + l];
        *total += layer;
    }
    f->last_norm = (float)sqrt(*total);
    return 0;
}

/* Every gradient times scale, through the host views f->host (fresh: fetched again). */
static int scale_grads(exec_t *e, struct exec_finish *f, float scale, int fetch)
{
    for (int v = 0; v < e->V; v++) {
        engine *g = e->engs[v];
        if (fetch) {
            f->host[v] = NULL;
            if (g->param_count && engine_grads_host(g, 0, 0, g->param_count, &f->host[v]))
                return -1;
        }
        if (!f->host[v]) continue;
        kernel_scale_cpu(f->host[v], g->param_count, scale);
        if (engine_grads_commit(g, 0, g->param_count)) return -1;
    }
    return 0;
}

/* Step 2: the norm over the job, and the gradients scaled to at most max_norm. */
static int clip_step(exec_t *e, struct exec_finish *f, float max_norm)
{
    double total;
    if (norm_post(e, f) || norm_settle(e, f, &total)) return -1;
    float scale = kernel_clip_scale(total, max_norm);
    if (!(scale < 1.0f)) return 0; /* torch multiplies by 1 then: nothing changes */
    return scale_grads(e, f, scale, 0);
}

/* ------------------------------------------------------------------ entries ---- */

int exec_finish_start(exec_t *e)
{
    struct exec_finish *f = calloc(1, sizeof *f);
    if (!f) return pt_error_set("out of memory");
    f->pair = MPI_COMM_NULL;
    f->req = MPI_REQUEST_NULL;
    f->last_norm = NAN;
    e->fin = f;
    return tie_start(e, f);
}

void exec_finish_free(exec_t *e)
{
    struct exec_finish *f = e->fin;
    if (!f) return;
    if (f->pair != MPI_COMM_NULL) MPI_Comm_free(&f->pair);
    free(f->tie);
    free(f->norm);
    free(f->sums);
    free(f->all);
    free(f->host);
    free(f->seq);
    free(f->seq_mine);
    free(f->seq_all);
    free(f);
    e->fin = NULL;
}

/* Steps 0 and 1 (the sequence-parallel sums, the tie), before either kind of norm. */
static int finish_begin(exec_t *e)
{
    struct exec_finish *f = e->fin;
    if (!f) return pt_error_set("rank %d: the step's finish was not set up (exec_start)",
                                e->world_rank);
    f->last_norm = NAN;
    return seq_step(e, f) || tie_step(e, f) ? -1 : 0;
}

int exec_finish_grads(exec_t *e, const optimizer_config *opt)
{
    if (finish_begin(e)) return -1;
    return opt->clip_norm > 0 ? clip_step(e, e->fin, opt->clip_norm) : 0;
}

double exec_finish_norm(const exec_t *e) { return e->fin ? e->fin->last_norm : NAN; }

int exec_finish_grads_post(exec_t *e) { return finish_begin(e) || norm_post(e, e->fin) ? -1 : 0; }

int exec_finish_validate(exec_t *e, const optimizer_config *opt, float *scale)
{
    double total;
    if (norm_settle(e, e->fin, &total)) return -1;
    *scale = 1.0f;
    if (!isfinite(total)) *scale = NAN;
    else if (opt->clip_norm > 0) *scale = kernel_clip_scale(total, opt->clip_norm);
    return 0;
}

int exec_finish_scale(exec_t *e, float scale) { return scale_grads(e, e->fin, scale, 1); }

int exec_zero_state_send(exec_t *e)
{
    long upd;
    int rc = 0;
    for (int v = 0; e->reps && v < e->V; v++)
        if (e->reps[v] && (replicas_params_whole(e->reps[v]) ||
                           replicas_read_state(e->reps[v], NULL, NULL, &upd) ||
                           replicas_params_done(e->reps[v])))
            rc = -1;
    return rc;
}

int exec_zero_params_send(exec_t *e)
{
    int rc = 0;
    for (int v = 0; e->reps && v < e->V; v++)
        if (e->reps[v] && (replicas_params_whole(e->reps[v]) || replicas_params_done(e->reps[v])))
            rc = -1;
    return rc;
}
