#include "src/engine/layer_ops.h"
#include "src/engine/layer_call.h"

#include <string.h>

#include "kernels/rng.h"
#include "src/base/error.h"

/* ---- the table: per layer type, its forward, backward and weight half ---- */

/* After a parameter layer's product (rc its result): its activation in place, unless the
 * layer is split by its inputs (a partial sum: the engine activates after the all-reduce). */
static int activate(const layer_call *c, int rc)
{
    if (rc || c->io->partial) return rc;
    return c->k->activation_forward(c->kc, c->io->y, c->io->y, (size_t)c->n * c->out_count,
                                    c->L->activation);
}

static int conv_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_io *io = c->io;
    kernel_conv2d_dims d = layer_conv_dims(c->L, c->n);
    return activate(c, c->k->conv_forward(c->kc, io->y, c->work, io->x, io->w,
                                          io->partial ? NULL : io->b, &d));
}
static int conv_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_io *io = c->io;
    kernel_conv2d_dims d = layer_conv_dims(c->L, c->n);
    if (weight_now)
        return c->k->conv_backward(c->kc, dx, io->dw, io->db, c->work, g, io->x, io->w, &d);
    if (dx) return c->k->conv_backward_input(c->kc, dx, c->work, g, io->w, &d);
    return 0;
}
static int conv_weight(const layer_call *c, const float *g)
{
    kernel_conv2d_dims d = layer_conv_dims(c->L, c->n);
    return c->k->conv_backward_weight(c->kc, c->io->dw, c->io->db, c->work, g, c->io->x, &d);
}

static int dense_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_io *io = c->io;
    return activate(c, c->k->dense_forward(c->kc, io->y, io->x, io->w,
                                           io->partial ? NULL : io->b, c->n, (int)c->in_count,
                                           c->L->u.dense.units));
}
static int dense_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_io *io = c->io;
    if (weight_now)
        return c->k->dense_backward(c->kc, dx, io->dw, io->db, g, io->x, io->w, c->n,
                                    (int)c->in_count, c->L->u.dense.units);
    if (dx)
        return c->k->dense_backward_input(c->kc, dx, g, io->w, c->n, (int)c->in_count,
                                          c->L->u.dense.units);
    return 0;
}
static int dense_weight(const layer_call *c, const float *g)
{
    return c->k->dense_backward_weight(c->kc, c->io->dw, c->io->db, g, c->io->x, c->n,
                                       (int)c->in_count, c->L->u.dense.units);
}

static int maxpool_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_desc *L = c->L;
    return c->k->maxpool_forward(c->kc, c->io->y, c->io->argmax, c->io->x, c->n, L->in.c, L->in.h,
                                 L->in.w, L->u.pool.size, L->u.pool.stride);
}
static int maxpool_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_desc *L = c->L;
    if (!dx) return 0;
    return c->k->maxpool_backward(c->kc, dx, g, c->io->argmax, c->n, L->in.c, L->in.h, L->in.w,
                                  L->u.pool.size, L->u.pool.stride);
}

static int avgpool_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_desc *L = c->L;
    return c->k->avgpool_forward(c->kc, c->io->y, c->io->x, c->n, L->in.c, L->in.h, L->in.w,
                                 L->u.pool.size, L->u.pool.stride);
}
static int avgpool_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    const layer_desc *L = c->L;
    if (!dx) return 0;
    return c->k->avgpool_backward(c->kc, dx, g, c->n, L->in.c, L->in.h, L->in.w, L->u.pool.size,
                                  L->u.pool.stride);
}

static int dropout_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    const layer_io *io = c->io;
    /* a slice's elements keep their places in the whole vector's mask */
    return c->k->dropout_forward(c->kc, io->y, io->mask, io->x, c->n, c->in_count, io->elem_off,
                                 c->L->u.dropout.p, seed, rng_stream_dropout(c->l, step),
                                 io->ids);
}
/* dropout, and flatten (always the identity) */
static int pass_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    if (!dx) return 0;
    if (c->io->identity) return c->k->copy(c->kc, dx, g, (size_t)c->n * c->in_count);
    return c->k->dropout_backward(c->kc, dx, g, c->io->mask, (size_t)c->n * c->in_count,
                                  c->L->u.dropout.p);
}
static int flatten_forward(const layer_call *c, uint64_t seed, uint64_t step) { return 0; }

/* ---- the transformer layers (GPT-2's) ----
 * A chunk of n samples is N = n·T token rows. The forward keeps, besides its output, what
 * layer_saved_floats counts, laid out per chunk as [N, ·] regions so that each is one matrix
 * for the products; the backward and W of a chunk use the same chunking (the same n), so
 * they find them. A block's B leaves its inner gradients (layer_gout_floats) in io->gout
 * for W under the split backward, else in the chunk's workspace, and W reads them there:
 * the weight half is the same code either way, so split and whole agree bit for bit. */

int layer_phases(const layer_desc *L)
{
    if (L->type == LAYER_BLOCK && layer_block_seq(L) > 1) return LAYER_BLOCK_SEQ_PHASES;
    return L->type == LAYER_BLOCK && layer_block_shards(L) > 1 ? LAYER_BLOCK_PHASES : 1;
}

size_t layer_phase_floats(const layer_desc *L, int ph)
{
    size_t in = layer_shape_count(L->in);
    if (layer_block_seq(L) == 1) return in;
    return ph % 2 ? in * (size_t)layer_block_seq(L) : 2 * in;
}

/* The token and position embedding: the first layer of a language model; its input, token
 * ids, has no gradient. */
/* An embedding cut by vocabulary (shards > 1) holds the rows of tokens [first, first + V):
 * its output is a partial sum (each token's row on the rank that holds it, the position's
 * on the rank holding token 0), all-reduced by the engine; the whole is the same bits. */
static int embedding_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    if (need_transformer(c)) return -1;
    const layer_desc *L = c->L;
    int V = L->u.embedding.vocab, T = L->u.embedding.context, C = L->u.embedding.width;
    const float *wte = c->io->w, *wpe = wte + (size_t)V * C;
    if (L->u.embedding.shards > 1)
        return c->k->embedding_shard_forward(c->kc, c->io->y, (int32_t *)c->work, c->io->x, wte,
                                             L->u.embedding.first == 0 ? wpe : NULL, c->n, T,
                                             C, L->u.embedding.first, V);
    return c->k->embedding_forward(c->kc, c->io->y, (int32_t *)c->work, c->io->x, wte, wpe,
                                   c->n, T, C, V);
}
static int embedding_weight(const layer_call *c, const float *g)
{
    if (need_transformer(c)) return -1;
    const layer_desc *L = c->L;
    int V = L->u.embedding.vocab, T = L->u.embedding.context, C = L->u.embedding.width;
    float *dwte = c->io->dw;
    if (L->u.embedding.shards > 1) /* its rows' gradients; every position's, as every rank */
        return c->k->embedding_shard_backward(c->kc, dwte, dwte + (size_t)V * C,
                                              (int32_t *)c->work, g, c->io->x, c->n, T, C,
                                              L->u.embedding.first, V);
    return c->k->embedding_backward(c->kc, dwte, dwte + (size_t)V * C, (int32_t *)c->work, g,
                                    c->io->x, c->n, T, C, V);
}
static int embedding_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    /* token ids have no gradient: a caller that asks for one gets zeros */
    if (dx) memset(dx, 0, (size_t)c->n * c->in_count * sizeof *dx);
    return weight_now ? embedding_weight(c, g) : 0;
}

/* A layer norm over each position's vector (the final ln_f); its statistics are saved. */
static int layernorm_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    if (need_transformer(c)) return -1;
    int N = seq_rows(c), C = c->L->in.w;
    float *mean = c->io->saved, *rstd = mean + N;
    return c->k->layernorm_forward(c->kc, c->io->y, mean, rstd, c->io->x, c->io->w, c->io->b, N,
                                   C);
}
static int layernorm_weight_from(const layer_call *c, const float *g)
{
    int N = seq_rows(c), C = c->L->in.w;
    const float *mean = c->io->saved, *rstd = mean + N;
    return c->k->layernorm_backward(c->kc, NULL, c->io->dw, c->io->db, g, c->io->x, mean, rstd,
                                    c->io->w, N, C);
}
/* W: from the output gradient B kept, or the group's sums B formed (added once, by the
 * group's first chunk: the group's gradients start at zero, so the bits are those of
 * forming them here row by row, chunk after chunk) */
static int layernorm_weight(const layer_call *c, const float *g)
{
    if (need_transformer(c)) return -1;
    const layer_io *io = c->io;
    if (!io->norm_sums) return layernorm_weight_from(c, g);
    size_t C = (size_t)c->L->in.w;
    return io->norm_sums_first && (c->k->add(c->kc, io->dw, io->norm_sums, C) ||
                                   c->k->add(c->kc, io->db, io->norm_sums + C, C));
}
static int layernorm_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    if (need_transformer(c)) return -1;
    const layer_io *io = c->io;
    int N = seq_rows(c), C = c->L->in.w;
    const float *mean = io->saved, *rstd = mean + N;
    /* B with the group's sums: the weight gradients now, in the same call (bit for bit
     * what the halves compute apart) */
    float *sg = !weight_now && io->norm_sums ? io->norm_sums : NULL;
    if ((dx || sg) && c->k->layernorm_backward(c->kc, dx, sg, sg ? sg + C : NULL, g, io->x,
                                               mean, rstd, io->w, N, C))
        return -1;
    return weight_now ? layernorm_weight_from(c, g) : 0;
}

/* The output head: each position's vector onto the vocabulary, no bias. */
static int lm_head_forward(const layer_call *c, uint64_t seed, uint64_t step)
{
    return c->k->dense_forward(c->kc, c->io->y, c->io->x, c->io->w, NULL, seq_rows(c),
                               c->L->in.w, c->L->u.lm_head.vocab);
}
static int lm_head_weight(const layer_call *c, const float *g)
{
    return c->k->dense_backward_weight(c->kc, c->io->dw, NULL, g, c->io->x, seq_rows(c),
                                       c->L->in.w, c->L->u.lm_head.vocab);
}
static int lm_head_backward(const layer_call *c, const float *g, float *dx, int weight_now)
{
    int N = seq_rows(c), C = c->L->in.w, V = c->L->u.lm_head.vocab;
    if (dx && c->k->dense_backward_input(c->kc, dx, g, c->io->w, N, C, V)) return -1;
    return weight_now ? lm_head_weight(c, g) : 0;
}

static const layer_ops layer_ops_table[LAYER_TYPE_COUNT] = {
    [LAYER_CONV] = {conv_forward, conv_backward, conv_weight},
    [LAYER_MAXPOOL] = {maxpool_forward, maxpool_backward, NULL},
    [LAYER_AVGPOOL] = {avgpool_forward, avgpool_backward, NULL},
    [LAYER_DENSE] = {dense_forward, dense_backward, dense_weight},
    [LAYER_DROPOUT] = {dropout_forward, pass_backward, NULL},
    [LAYER_FLATTEN] = {flatten_forward, pass_backward, NULL},
    [LAYER_EMBEDDING] = {embedding_forward, embedding_backward, embedding_weight},
    [LAYER_BLOCK] = {layer_block_forward, layer_block_backward, layer_block_weight},
    [LAYER_LAYERNORM] = {layernorm_forward, layernorm_backward, layernorm_weight},
    [LAYER_LM_HEAD] = {lm_head_forward, lm_head_backward, lm_head_weight},
};

/* ---- the loop ---- */

size_t layer_fold_floats(const layer_desc *L)
{
    if (L->type == LAYER_BLOCK) return layer_block_fold_floats(L);
    return L->weight_count + L->bias_count;
}

/* With a fold, a layer other than a block forms its gradients whole in io->part (dw, then
 * db), and they are folded in where they stand (layer_io.fold). */
static int folds_whole(const layer_desc *L, const layer_io *io)
{
    return io->fold && L->weight_count && L->type != LAYER_BLOCK;
}

static void into_part(layer_io *io, const layer_desc *L)
{
    io->dw = io->part;
    io->db = io->part + L->weight_count;
}

static int fold_whole(const layer_io *io, const layer_desc *L, float *dw, float *db)
{
    return io->fold(io->fold_self, dw, io->part, L->weight_count) ||
           (L->bias_count &&
            io->fold(io->fold_self, db, io->part + L->weight_count, L->bias_count));
}

/* Local layer i of a run whose first layer reached is `head` and last `tail` (forward: lo
 * and hi − 1; backward: hi − 1 and lo), with the phases of it the run covers. */
static layer_call call_of(const layer_run *r, int i, const layer_io *io, int head, int tail)
{
    const layer_desc *L = &r->layers[i];
    layer_call c = {.k = r->k, .kc = r->kctx, .L = L, .l = r->first + i, .n = r->n, .io = io,
                    .work = r->work, .in_count = layer_shape_count(L->in),
                    .out_count = layer_shape_count(L->out),
                    .ph0 = i == head ? r->from : 0,
                    .ph1 = i == tail && r->to ? r->to : layer_phases(L)};
    return c;
}

static int fail(layer_run *r, const char *what, int i)
{
    r->what = what;
    r->failed = i;
    return -1;
}

int layer_run_forward(layer_run *r, int lo, int hi)
{
    r->what = NULL;
    for (int i = lo; i < hi; i++) {
        layer_io io;
        memset(&io, 0, sizeof io);
        if (r->io(r->self, i, LAYER_PHASE_FORWARD, &io)) return -1;
        if (io.identity) continue;
        layer_call c = call_of(r, i, &io, lo, hi - 1);
        if (layer_ops_table[c.L->type].forward(&c, r->seed, r->step)) return fail(r, "forward", i);
    }
    return 0;
}

int layer_run_backward(layer_run *r, int lo, int hi, const float **gp, int *gip,
                       float *const scratch[2], float *din, int parts)
{
    r->what = NULL;
    const float *g = *gp;
    int gi = *gip;
    int rc = 0;
    for (int i = hi - 1; i >= lo; i--) {
        layer_io io;
        memset(&io, 0, sizeof io);
        if (r->io(r->self, i, LAYER_PHASE_BACKWARD, &io)) {
            rc = -1;
            break;
        }
        if (io.identity && i > 0) continue; /* the gradient passes through unchanged */
        layer_call c = call_of(r, i, &io, hi - 1, lo);
        const layer_desc *L = c.L;
        /* the layer's backward begins in this run (its output gradient is g) and ends in it
         * (else it leaves a partial gradient for the group to all-reduce, never in din) */
        int begins = c.ph0 == 0, ends = c.ph1 == layer_phases(L);
        if (L->activation != KERNEL_ACT_LINEAR && begins) {
            float *ga = gi < 0 ? scratch[0] : scratch[gi];
            if (r->k->activation_backward(r->kctx, ga, g, io.out, (size_t)r->n * c.out_count,
                                          L->activation)) {
                rc = fail(r, "activation backward", i);
                break;
            }
            g = ga;
            gi = gi < 0 ? 0 : gi;
        }
        int ti = gi < 0 ? 0 : 1 - gi;
        float *dx = i == 0 && ends ? din : scratch[ti];
        /* the weight half happens now (both parts, not batched), in W (split), or in the
         * step's flush (batched: the rows go to the stash; a block's weight half stashes
         * its products' rows itself, and forms its layer norms' gradients) */
        int self_stash = io.batched && L->type == LAYER_BLOCK;
        int weight_now = (parts & LAYER_BW_WEIGHT) && (!io.batched || self_stash);
        if (L->weight_count && io.batched && !self_stash) {
            if (r->k->copy(r->kctx, io.stash_x, io.x, (size_t)r->n * c.in_count) ||
                r->k->copy(r->kctx, io.stash_g, g, (size_t)r->n * c.out_count)) {
                rc = -1;
                break;
            }
        } else if (L->weight_count && !(parts & LAYER_BW_WEIGHT) && begins && !io.norm_sums &&
                   !(L->type == LAYER_BLOCK && layer_phases(L) == 1)) {
            /* (a whole block's B places W's gradients itself: layer_block.c; a stage's last
             * layer may keep them where they came in: io.gout is then g) */
            if (io.gout != g && r->k->copy(r->kctx, io.gout, g, (size_t)r->n * c.out_count)) {
                rc = -1;
                break;
            }
        }
        float *dw = io.dw, *db = io.db;
        int whole = weight_now && folds_whole(L, &io);
        if (whole) into_part(&io, L);
        if (layer_ops_table[L->type].backward(&c, g, dx, weight_now) ||
            (whole && fold_whole(&io, L, dw, db))) {
            rc = fail(r, "backward", i);
            break;
        }
        g = dx;
        gi = ti;
    }
    if (rc == 0) {
        *gp = g;
        *gip = gi;
    }
    return rc;
}

int layer_run_weight(layer_run *r, int lo, int hi)
{
    r->what = NULL;
    for (int i = hi - 1; i >= lo; i--) {
        const layer_desc *L = &r->layers[i];
        int (*weight)(const layer_call *, const float *) = layer_ops_table[L->type].weight;
        if (!L->weight_count || !weight) continue;
        layer_io io;
        memset(&io, 0, sizeof io);
        if (r->io(r->self, i, LAYER_PHASE_WEIGHT, &io)) return -1;
        if (io.batched && L->type != LAYER_BLOCK) continue; /* a block stashes in W */
        layer_call c = call_of(r, i, &io, hi - 1, lo);
        float *dw = io.dw, *db = io.db;
        int whole = folds_whole(L, &io);
        if (whole) into_part(&io, L);
        if (weight(&c, io.gout) || (whole && fold_whole(&io, L, dw, db)))
            return fail(r, "weight gradient", i);
    }
    return 0;
}
