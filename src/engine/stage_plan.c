#include "src/engine/stage_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "src/base/error.h"

/* ------------------------------------------------------------------- layout ---- */

static const shard_plan *shape_tp(const stage_shape *sh)
{
    return sh->tp && sh->tp->T > 1 ? sh->tp : NULL;
}

/* Layer l of the net as rank tp_rank runs it. */
static layer_desc shape_layer(const stage_shape *sh, int l)
{
    const shard_plan *tp = shape_tp(sh);
    return tp ? shard_local_layer(tp, sh->net, l, sh->tp_rank) : sh->net->layers[l];
}

/* Bytes of local layer L's (the net's layer l) storage in one slot, each rounded. */
typedef struct {
    size_t out, argmax, mask, saved, xin;
} slot_part;

static slot_part slot_part_of(const stage_shape *sh, const layer_desc *L, int l)
{
    const shard_plan *tp = shape_tp(sh);
    size_t mb = (size_t)sh->max_batch, count = mb * layer_shape_count(L->out);
    const layer_kind *k = layer_kind_of(L->type);
    slot_part s = {
        .out = k->own_output ? stage_round_up(count * sizeof(float)) : 0,
        .argmax = k->argmax ? stage_round_up(count * sizeof(int32_t)) : 0,
        .mask = stage_round_up(mb * layer_mask_bytes(L)),
        .saved = stage_round_up(mb * layer_saved_floats(L) * sizeof(float)),
        .xin = tp ? stage_round_up(mb * shard_slot_input(tp, sh->net, l, sh->first, sh->tp_rank) *
                                   sizeof(float))
                  : 0,
    };
    return s;
}

/* The stage's output all-gathered whole, per slot (0: its output is not sharded). */
static size_t whole_out_bytes(const stage_shape *sh)
{
    const shard_plan *tp = shape_tp(sh);
    if (!tp || !shard_output_gathered(tp, sh->last)) return 0;
    return stage_round_up((size_t)sh->max_batch *
                          layer_shape_count(sh->net->layers[sh->last - 1].out) * sizeof(float));
}

/* The one pass over the layers both stage_plan_sizes and stage_plan_init make; loc and
 * param_off (either may be NULL) receive the local layers and their offsets. */
static stage_sizes walk(const stage_shape *sh, layer_desc *loc, size_t *param_off)
{
    stage_sizes z = {0};
    for (int l = sh->first; l < sh->last; l++) {
        layer_desc L = shape_layer(sh, l);
        if (loc) loc[l - sh->first] = L;
        if (param_off) param_off[l - sh->first] = z.param_count;
        z.param_count += L.weight_count + L.bias_count;
        if (L.type == LAYER_CONV) {
            kernel_conv2d_dims d = layer_conv_dims(&L, sh->chunk);
            size_t ws = sh->conv_workspace(&d);
            if (ws > z.work_floats) z.work_floats = ws;
        }
        size_t lw = layer_work_floats(&L, sh->chunk);
        if (lw > z.work_floats) z.work_floats = lw;
        if (layer_phases(&L) > 1 && layer_gout_floats(&L) > z.phase_floats)
            z.phase_floats = layer_gout_floats(&L);
        const layer_desc *W = &sh->net->layers[l];
        size_t in = layer_shape_count(W->in), out = layer_shape_count(W->out);
        if (in > z.widest) z.widest = in;
        if (out > z.widest) z.widest = out;
        /* a sequence-parallel block's gradient gathered with a layer norm's output */
        if (layer_block_seq(&L) > 1 && 2 * in > z.widest) z.widest = 2 * in;
        slot_part s = slot_part_of(sh, &L, l);
        z.slot_bytes += s.out + s.argmax + s.mask + s.saved + s.xin;
    }
    z.slot_bytes += whole_out_bytes(sh);
    return z;
}

stage_sizes stage_plan_sizes(const stage_shape *shape) { return walk(shape, NULL, NULL); }

int stage_plan_init(stage_plan *p, const stage_shape *sh, const char *name)
{
    p->net = sh->net;
    p->first = sh->first;
    p->last = sh->last;
    p->nl = sh->last - sh->first;
    p->max_batch = sh->max_batch;
    p->tp = shape_tp(sh);
    p->tp_rank = p->tp ? sh->tp_rank : 0;
    p->name = name;
    p->loc = calloc((size_t)p->nl, sizeof *p->loc);
    p->param_off = calloc((size_t)p->nl, sizeof *p->param_off);
    if (!p->loc || !p->param_off) {
        stage_plan_free(p);
        return pt_error_set("%s %d..%d: out of memory", name, sh->first, sh->last - 1);
    }
    stage_sizes z = walk(sh, p->loc, p->param_off);
    p->param_count = z.param_count;
    p->widest = z.widest;
    p->work_floats = z.work_floats;
    p->phase_floats = z.phase_floats;
    p->slot_bytes = z.slot_bytes;
    return 0;
}

void stage_plan_free(stage_plan *p)
{
    free(p->loc);
    free(p->param_off);
    p->loc = NULL;
    p->param_off = NULL;
}

void stage_plan_layers_of(const stage_plan *p, size_t off, size_t count, int *lo, int *hi)
{
    int i = 0;
    while (i + 1 < p->nl && p->param_off[i + 1] <= off) i++;
    *lo = i;
    while (i < p->nl && p->param_off[i] < off + count) i++;
    *hi = i;
}

static stage_shape plan_shape(const stage_plan *p)
{
    stage_shape sh = {.net = p->net, .first = p->first, .last = p->last,
                      .max_batch = p->max_batch, .tp = p->tp, .tp_rank = p->tp_rank};
    return sh;
}

static void *take(char *base, size_t *at, size_t bytes)
{
    void *q = base && bytes ? base + *at : NULL;
    *at += bytes;
    return q;
}

float *stage_plan_carve_slot(const stage_plan *p, void *base, stage_slot_layer *layers)
{
    stage_shape sh = plan_shape(p);
    size_t at = 0;
    for (int i = 0; i < p->nl; i++) {
        slot_part s = slot_part_of(&sh, &p->loc[i], p->first + i);
        layers[i].buf = take(base, &at, s.out);
        layers[i].argmax = take(base, &at, s.argmax);
        layers[i].mask = take(base, &at, s.mask);
        layers[i].saved = take(base, &at, s.saved);
        layers[i].xin = take(base, &at, s.xin);
    }
    return take(base, &at, whole_out_bytes(&sh));
}

const float *stage_plan_set_outputs(const stage_plan *p, stage_slot_layer *layers,
                                    const float *input, float *whole_out, int training)
{
    const float *x = input;
    for (int i = 0; i < p->nl; i++) {
        if (layers[i].xin) x = layers[i].xin; /* gathered or sliced for tensor shards */
        layers[i].out = layer_is_identity(&p->loc[i], training) ? x : layers[i].buf;
        layers[i].trained = training;
        x = layers[i].out;
    }
    return whole_out ? whole_out : x;
}

void stage_plan_layer_io(const stage_plan *p, const stage_slot_layer *layers,
                         const float *input, float *params, float *grads, int i, int phase,
                         size_t off, layer_io *io)
{
    const stage_slot_layer *ly = &layers[i];
    const layer_desc *L = &p->loc[i];
    size_t in_count = layer_shape_count(L->in), out_count = layer_shape_count(L->out);
    io->x = stage_slot_input(layers, i, input) + off * in_count;
    io->identity = ly->out != ly->buf;
    io->y = ly->buf ? ly->buf + off * out_count : NULL;
    io->out = ly->out ? ly->out + off * out_count : NULL;
    io->argmax = ly->argmax ? ly->argmax + off * out_count : NULL;
    io->mask = ly->mask ? ly->mask + off * layer_mask_bytes(L) : NULL;
    if (L->type == LAYER_BLOCK && !ly->trained) io->mask = NULL; /* no dropout (eval) */
    io->gout = ly->gout ? ly->gout + off * layer_gout_kept_floats(L, p->norm_sums) : NULL;
    io->saved = ly->saved ? ly->saved + off * layer_saved_floats(L) : NULL;
    io->batched = stage_plan_batched(p, i);
    if (L->weight_count) {
        io->w = params + p->param_off[i];
        io->b = io->w + L->weight_count;
        io->dw = grads ? grads + p->param_off[i] : NULL;
        io->db = grads ? io->dw + L->weight_count : NULL;
    }
    if (phase != LAYER_PHASE_FORWARD) return;
    io->partial = stage_plan_split_in(p, i);
    /* a block cut by heads: its heads' probabilities keep their places among the whole
     * layer's (heads cut evenly, src/model/shard.c) */
    if (p->tp && io->mask && L->type == LAYER_BLOCK) {
        size_t T = (size_t)L->in.c;
        io->elem_off = (size_t)p->tp_rank * (size_t)L->u.block.heads * T * T;
        return;
    }
    /* a slice's elements keep their places in the whole vector's dropout mask */
    if (p->tp && io->mask) {
        int l = p->first + i;
        size_t len;
        shard_values(&p->tp->layers[l].in, layer_shape_count(p->net->layers[l].in), p->tp->T,
                     p->tp_rank, &io->elem_off, &len);
    }
}

/* ------------------------------------------------------- gradient targets ---- */

stage_grad_target stage_plan_grad_target(const stage_plan *p, float *grads, float *mb_grads,
                                         float *piece)
{
    stage_grad_target t = {.form = grads};
    if (piece) {
        t.form = piece;
        t.apart = 1;
    } else if (p->accumulated) {
        t.form = mb_grads;
        t.apart = 1;
        t.add_to = grads;
    }
    return t;
}

void stage_plan_grads_formed(stage_plan *p, int lo, const float *piece)
{
    if (lo == 0 && !piece) p->accumulated = 1;
}

void stage_plan_grads_zeroed(stage_plan *p)
{
    p->accumulated = 0;
    p->range_hi = 0;
}

int stage_wgrad_products(const layer_desc *L, stage_wgrad_product *pr, size_t *x_floats,
                         size_t *g_floats)
{
    int n = 0;
    if (L->type == LAYER_DENSE) {
        pr[n++] = (stage_wgrad_product){0, L->weight_count, (int)layer_shape_count(L->in),
                                        L->u.dense.units, 1, 0, 0};
    } else if (L->type == LAYER_LM_HEAD) {
        pr[n++] = (stage_wgrad_product){0, STAGE_WGRAD_NO_BIAS, L->in.w, L->u.lm_head.vocab,
                                        L->in.c, 0, 0};
    } else if (L->type == LAYER_BLOCK) {
        /* c_attn C→3A, attention c_proj A→C, c_fc C→H, MLP c_proj H→C (layer_ops.c's
         * block_view: the matrices, then ln_1, c_attn's bias, c_proj's, ln_2, c_fc's,
         * c_proj's) */
        int C = L->in.w, A = (int)layer_block_attn_width(L), H = L->u.block.hidden, T = L->in.c;
        size_t c = (size_t)C, a = (size_t)A, h = (size_t)H, wc = L->weight_count;
        pr[n++] = (stage_wgrad_product){0, wc + 2 * c, C, 3 * A, T, 0, 0};
        pr[n++] = (stage_wgrad_product){3 * a * c, wc + 2 * c + 3 * a, A, C, T, 0, 0};
        pr[n++] = (stage_wgrad_product){4 * a * c, wc + 5 * c + 3 * a, C, H, T, 0, 0};
        pr[n++] = (stage_wgrad_product){4 * a * c + h * c, wc + 5 * c + 3 * a + h, H, C, T, 0,
                                        0};
    }
    size_t xs = 0, gs = 0;
    for (int k = 0; k < n; k++) {
        pr[k].x_off = xs;
        pr[k].g_off = gs;
        xs += (size_t)pr[k].tokens * (size_t)pr[k].in;
        gs += (size_t)pr[k].tokens * (size_t)pr[k].out;
    }
    if (x_floats) *x_floats = xs;
    if (g_floats) *g_floats = gs;
    return n;
}

int stage_plan_mb_ranges(const stage_plan *p, int i, size_t (*r)[2])
{
    const layer_desc *L = &p->loc[i];
    size_t b = p->param_off[i], e = stage_plan_param_end(p, i + 1);
    if (b == e) return 0;
    if (!stage_plan_batched(p, i)) {
        r[0][0] = b, r[0][1] = e;
        return 1;
    }
    if (L->type != LAYER_BLOCK) return 0;
    /* ln_1's gain and bias, ln_2's: around c_attn's and c_proj's biases */
    size_t c = (size_t)L->in.w, a = layer_block_attn_width(L), w = b + L->weight_count;
    r[0][0] = w, r[0][1] = w + 2 * c;
    r[1][0] = w + 3 * c + 3 * a, r[1][1] = w + 5 * c + 3 * a;
    return 2;
}

void stage_plan_stash_io(const stage_plan *p, int i, float *x_base, float *g_base, size_t row,
                         layer_io *io)
{
    const layer_desc *L = &p->loc[i];
    if (L->type == LAYER_BLOCK) {
        io->stash_x = x_base;
        io->stash_g = g_base;
        io->stash_row = row;
        io->stash_rows = p->wgrad_rows;
        return;
    }
    io->stash_x = x_base + row * layer_shape_count(L->in);
    io->stash_g = g_base + row * layer_shape_count(L->out);
}

int stage_plan_grad_runs(const stage_plan *p, int lo, int hi, size_t (*runs)[2], int cap)
{
    int n = 0;
    for (int i = lo; i < hi; i++) {
        size_t r[2][2];
        int nr = stage_plan_mb_ranges(p, i, r);
        for (int k = 0; k < nr; k++) {
            size_t b = r[k][0], e = r[k][1];
            if (n && (runs[n - 1][1] == b || n == cap)) runs[n - 1][1] = e;
            else runs[n][0] = b, runs[n++][1] = e;
        }
    }
    return n;
}

/* ------------------------------------------------- backward by layer ranges ---- */

int stage_plan_range_check(const stage_plan *p, int mb, int lo, int hi, const float *grads)
{
    if (lo < 0 || hi > p->nl || lo >= hi)
        return pt_error_set("%s %d..%d: backward of local layers [%d, %d), outside the "
                            "stage's %d", p->name, p->first, p->last - 1, lo, hi, p->nl);
    if (!p->range_hi && hi != p->nl)
        return pt_error_set("%s %d..%d: backward of local layers [%d, %d) of micro-batch %d "
                            "out of order: a first range ends at the top, %d", p->name,
                            p->first, p->last - 1, lo, hi, mb, p->nl);
    if (p->range_hi && (hi != p->range_hi || mb != p->range_mb || grads != p->range_grads))
        return pt_error_set("%s %d..%d: backward of local layers [%d, %d) of micro-batch %d "
                            "out of order: micro-batch %d's backward by ranges is unfinished "
                            "(its next range ends at local layer %d%s)", p->name, p->first,
                            p->last - 1, lo, hi, mb, p->range_mb, p->range_hi,
                            grads != p->range_grads ? ", into other gradients" : "");
    return 0;
}

void stage_plan_range_done(stage_plan *p, int mb, int lo, const float *grads)
{
    p->range_hi = lo;
    p->range_mb = mb;
    p->range_grads = grads;
}

int stage_plan_range_idle(const stage_plan *p, const char *what)
{
    if (!p->range_hi) return 0;
    return pt_error_set("%s %d..%d: %s while micro-batch %d's backward by ranges is unfinished "
                        "(its next range ends at local layer %d)", p->name, p->first,
                        p->last - 1, what, p->range_mb, p->range_hi);
}

/* ------------------------------------------- initialisation and the update ---- */

typedef struct {
    stage_init_draw draw;
    void *ctx;
    float *w;            /* the local layer's parameters: weight, then bias */
    size_t weight_count; /* of the whole layer */
    float bound;
    uint64_t seed;
    int layer, rc;
} init_job;

/* A run of the whole layer's parameters this rank holds: the same draws as the whole. */
static void init_run(void *arg, size_t whole, size_t local, size_t count)
{
    init_job *j = arg;
    int bias = whole >= j->weight_count;
    if (!j->rc)
        j->rc = j->draw(j->ctx, j->w + local, bias ? whole - j->weight_count : whole, count,
                        LAYER_INIT_TORCH, j->bound, j->seed, rng_stream_init(j->layer, bias));
}

/* PyTorch's default for conv and dense: U(±1/√fan_in) (kaiming_uniform(a=√5) and the bias
 * rule of torch.nn both give 1/√fan_in), tensor shards drawing their runs of the whole. */
static int init_torch_layer(const stage_plan *p, float *w, const layer_desc *L, int l,
                            uint64_t seed, stage_init_draw draw, void *ctx)
{
    size_t fan_in = L->weight_count / (L->type == LAYER_CONV ? (size_t)L->u.conv.filters
                                                              : (size_t)L->u.dense.units);
    init_job j = {.draw = draw, .ctx = ctx, .w = w, .weight_count = L->weight_count,
                  .bound = (float)(1.0 / sqrt((double)fan_in)), .seed = seed, .layer = l};
    if (p->tp) {
        shard_layer_runs(p->tp, p->net, l, p->tp_rank, init_run, &j);
    } else {
        init_run(&j, 0, 0, L->weight_count);
        init_run(&j, L->weight_count, L->weight_count, L->bias_count);
    }
    return j.rc;
}

/* A transformer layer's tensors (layer_tensors of the whole layer) and where its local
 * parameters go. */
typedef struct {
    const stage_plan *p;
    stage_init_draw draw;
    void *ctx;
    float *w;
    uint64_t seed;
    layer_tensor t[LAYER_MAX_TENSORS];
    int nt, layer, rc;
} tensor_job;

/* Elements [first, first + count) of tensor k's draws to dst: normal draws per tensor
 * stream, ones and zeros; a tied head draws the embedding's token matrix's numbers, so it
 * equals it wherever the two live. */
static int draw_tensor(const tensor_job *j, int k, float *dst, size_t first, size_t count)
{
    const layer_tensor *t = &j->t[k];
    layer_init kind = t->init;
    double scale = t->std;
    uint64_t stream = rng_stream_init_tensor(j->layer, k);
    if (kind == LAYER_INIT_TIED) {
        layer_tensor e[LAYER_MAX_TENSORS];
        (void)layer_tensors(&j->p->net->layers[0], j->p->net->blocks, e);
        kind = e[0].init;
        scale = e[0].std;
        stream = rng_stream_init_tensor(0, 0);
    }
    return j->draw(j->ctx, dst, first, count, kind, scale, j->seed, stream);
}

/* A run of the whole layer's parameters this rank holds (shard_layer_runs): each tensor's
 * part of it drawn as the same elements of the whole tensor (a run may span tensors: the
 * vectors a block's shard keeps whole). */
static void tensor_run(void *arg, size_t whole, size_t local, size_t count)
{
    tensor_job *j = arg;
    for (int k = 0; k < j->nt && count && !j->rc; k++) {
        const layer_tensor *t = &j->t[k];
        if (whole >= t->offset + t->count) continue;
        size_t take = t->offset + t->count - whole < count ? t->offset + t->count - whole : count;
        j->rc = draw_tensor(j, k, j->w + local, whole - t->offset, take);
        whole += take;
        local += take;
        count -= take;
    }
}

/* GPT-2's for the transformer layers, tensor by tensor (layer_tensors); tensor shards (a
 * block cut by heads) draw their slices of the whole tensors. */
static int init_tensor_layer(const stage_plan *p, float *w, const layer_desc *L, int l,
                             uint64_t seed, stage_init_draw draw, void *ctx)
{
    tensor_job j = {.p = p, .draw = draw, .ctx = ctx, .w = w, .seed = seed, .layer = l};
    j.nt = layer_tensors(L, p->net->blocks, j.t);
    if (p->tp) shard_layer_runs(p->tp, p->net, l, p->tp_rank, tensor_run, &j);
    else tensor_run(&j, 0, 0, L->weight_count + L->bias_count);
    return j.rc ? -1 : 0;
}

int stage_plan_init_params(const stage_plan *p, float *params, uint64_t seed,
                           stage_init_draw draw, void *ctx, int *failed)
{
    for (int l = p->first; l < p->last; l++) {
        const layer_desc *L = &p->net->layers[l]; /* the whole layer: its fan-in */
        if (!L->weight_count) continue;
        float *w = params + p->param_off[l - p->first];
        int conv_dense = L->type == LAYER_CONV || L->type == LAYER_DENSE;
        if (conv_dense ? init_torch_layer(p, w, L, l, seed, draw, ctx)
                       : init_tensor_layer(p, w, L, l, seed, draw, ctx)) {
            *failed = l;
            return -1;
        }
    }
    return 0;
}

static int cpu_sgd(void *ctx, float *param, const float *grad, size_t count, float lr,
                   float weight_decay)
{
    kernel_sgd_update_cpu(param, grad, count, lr, weight_decay);
    return 0;
}

static int cpu_momentum(void *ctx, float *param, float *buf, const float *grad, size_t count,
                        float lr, float momentum, float weight_decay)
{
    kernel_momentum_update_cpu(param, buf, grad, count, lr, momentum, weight_decay);
    return 0;
}

static int cpu_adam(void *ctx, float *param, float *m, float *v, const float *grad,
                    size_t count, float lr, float beta1, float beta2, float eps,
                    float weight_decay, long step)
{
    kernel_adam_update_cpu(param, m, v, grad, count, lr, beta1, beta2, eps, weight_decay, step);
    return 0;
}

static int cpu_adamw(void *ctx, float *param, float *m, float *v, const float *grad,
                     size_t count, float lr, float beta1, float beta2, float eps,
                     float weight_decay, long step)
{
    kernel_adamw_update_cpu(param, m, v, grad, count, lr, beta1, beta2, eps, weight_decay,
                            step);
    return 0;
}

const optim_kernels optim_kernels_cpu = {.sgd = cpu_sgd, .momentum = cpu_momentum,
                                         .adam = cpu_adam, .adamw = cpu_adamw};

const char *optimizer_kind_name(optimizer_kind k)
{
    static const char *const names[] = {"sgd", "momentum", "adam", "adamw"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}

/* AdamW of parameters [a, b) with decay wd (nothing when empty). */
static int adamw_run(const optim_kernels *k, void *ctx, const stage_optim_state *s,
                     const optimizer_config *o, long step, size_t a, size_t b, float wd)
{
    if (b <= a) return 0;
    return k->adamw(ctx, s->params + a, s->m + a, s->v + a, s->grads + a, b - a, o->lr,
                    o->beta1, o->beta2, o->eps, wd, step);
}

/* AdamW over the stage in maximal runs of one decay: each local layer's leading
 * layer_decayed_count parameters with o's weight decay, the rest (biases, norms,
 * embeddings) with none; neighbouring parts of the same decay go in one call. */
static int adamw_by_layer(const optim_kernels *k, void *ctx, const stage_optim_state *s,
                          const optimizer_config *o, long step)
{
    const stage_plan *p = s->plan;
    if (!k->adamw) return pt_error_set("AdamW is not available on this device");
    if (!p || p->param_count != s->count)
        return pt_error_set("AdamW needs the stage's layers (its plan) to choose what decays");
    const float decay = o->weight_decay;
    size_t begin = 0; /* the run under way, [begin, ...) with decay wd */
    float wd = 0.0f;
    for (int i = 0; i < p->nl; i++) {
        size_t off = p->param_off[i], end = stage_plan_param_end(p, i + 1);
        size_t dec = layer_decayed_count(&p->loc[i]);
        size_t mid = off + (dec < end - off ? dec : end - off);
        if (mid > off && wd != decay) { /* [off, mid) decays */
            if (adamw_run(k, ctx, s, o, step, begin, off, wd)) return -1;
            begin = off;
            wd = decay;
        }
        if (end > mid && wd != 0.0f) { /* [mid, end) does not */
            if (adamw_run(k, ctx, s, o, step, begin, mid, wd)) return -1;
            begin = mid;
            wd = 0.0f;
        }
    }
    return adamw_run(k, ctx, s, o, step, begin, s->count, wd);
}

int stage_optim_step(const optim_kernels *k, void *ctx, const stage_optim_state *s,
                     const optimizer_config *o)
{
    long step = ++*s->step;
    switch (o->kind) {
    case OPTIM_SGD:
        return k->sgd(ctx, s->params, s->grads, s->count, o->lr, o->weight_decay);
    case OPTIM_MOMENTUM:
        return k->momentum(ctx, s->params, s->m, s->grads, s->count, o->lr, o->momentum,
                           o->weight_decay);
    case OPTIM_ADAM:
        return k->adam(ctx, s->params, s->m, s->v, s->grads, s->count, o->lr, o->beta1,
                       o->beta2, o->eps, o->weight_decay, step);
    case OPTIM_ADAMW:
        return adamw_by_layer(k, ctx, s, o, step);
    }
    return pt_error_set("unknown optimizer %d", (int)o->kind);
}

int stage_plan_wgrad_flush(const stage_plan *p, float *grads, float *const *stash_x,
                           float *const *stash_g, int lo, int hi, int t, int threads,
                           stage_wgrad_units units, void *ctx, int *failed)
{
    int k = 0;
    for (int i = lo; i < hi; i++) {
        if (!stage_plan_batched(p, i)) continue;
        stage_wgrad_product pr[STAGE_WGRAD_MAX_PRODUCTS];
        int np = stage_wgrad_products(&p->loc[i], pr, NULL, NULL);
        for (int q = 0; q < np; q++) {
            const stage_wgrad_product *P = &pr[q];
            size_t rows = (size_t)p->wgrad_rows;
            float *dw = grads + p->param_off[i] + P->w;
            float *db = P->b == STAGE_WGRAD_NO_BIAS ? NULL : grads + p->param_off[i] + P->b;
            const float *x = stash_x[i] + rows * P->x_off, *g = stash_g[i] + rows * P->g_off;
            for (int a = 0; a < P->out; a += STAGE_WGRAD_TILE, k++) {
                if (k % threads != t) continue;
                int w = P->out - a < STAGE_WGRAD_TILE ? P->out - a : STAGE_WGRAD_TILE;
                if (units(ctx, dw, db, g, x, (int)rows * P->tokens, P->in, P->out, a, w)) {
                    *failed = i;
                    return -1;
                }
            }
        }
    }
    return 0;
}
