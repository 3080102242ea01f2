#include "src/model/shard.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"

const char *tensor_mode_name(tensor_mode m)
{
    return m == TENSOR_GATHER ? "gather" : m == TENSOR_SEQUENCE ? "megatron+sequence" : "megatron";
}

const char *shard_split_name(shard_split s)
{
    return s == SHARD_OUT     ? "outputs"
           : s == SHARD_IN    ? "inputs"
           : s == SHARD_HEADS ? "heads"
           : s == SHARD_VOCAB ? "vocabulary"
                              : "-";
}

void shard_cut(int n, int T, int t, int *off, int *len)
{
    long a = (long)t * n / T, b = (long)(t + 1) * n / T;
    *off = (int)a;
    *len = (int)(b - a);
}

void shard_values(const shard_state *s, size_t whole, int T, int t, size_t *off, size_t *len)
{
    if (!s->sharded) {
        *off = 0;
        *len = whole;
        return;
    }
    int o, l;
    shard_cut(s->units, T, t, &o, &l);
    *off = (size_t)o * (size_t)s->unit;
    *len = (size_t)l * (size_t)s->unit;
}

/* What a layer's parameters are cut along: dense units, conv filters or an lm_head's
 * tokens. */
static int out_units(const layer_desc *L)
{
    return L->type == LAYER_CONV      ? L->u.conv.filters
           : L->type == LAYER_LM_HEAD ? L->u.lm_head.vocab
                                      : L->u.dense.units;
}

/* A language model: each block cut by heads (its heads and hidden units multiples of T,
 * so every rank's attention width and MLP slice are equal), the embedding and the lm_head
 * by vocabulary, the logits sharded for the loss; every other vector whole. */
static int plan_sequence(shard_plan *p, const net_desc *net)
{
    int T = p->T, seq = shard_sequence(p), ctx = net->input.c;
    if (seq && ctx % T)
        return pt_error_set("--sequence-parallel: the context of %d positions is not a "
                            "multiple of --tensor %d (each rank holds T/%d positions)", ctx,
                            T, T);
    for (int l = 0; l < net->n_layers; l++) {
        const layer_desc *L = &net->layers[l];
        shard_layer *sl = &p->layers[l];
        sl->in = (shard_state){0, L->in.c, L->in.h * L->in.w};
        sl->out = (shard_state){0, L->out.c, L->out.h * L->out.w};
        if (T == 1) continue;
        /* sequence parallelism: every vector between layers is cut by positions, but the
         * token ids and the logits; the lm_head all-gathers its input */
        if (seq && L->type != LAYER_EMBEDDING && L->type != LAYER_LM_HEAD) sl->in.sharded = 1;
        if (seq && L->type != LAYER_LM_HEAD) sl->out.sharded = 1;
        if (seq && L->type == LAYER_LM_HEAD) sl->gather_in = 1;
        if (L->type == LAYER_BLOCK) {
            int heads = L->u.block.heads, hidden = L->u.block.hidden;
            if (heads % T || hidden % T)
                return pt_error_set("layer %d (block, line %d) has %d heads and hidden %d: it "
                                    "cannot be cut into %d tensor shards (heads and hidden "
                                    "must be multiples of %d)", l + 1, L->line, heads, hidden,
                                    T, T);
            if (seq && L->u.block.p > 0)
                return pt_error_set("layer %d (block, line %d) has dropout=%g: dropout inside "
                                    "blocks does not go with --sequence-parallel in this "
                                    "version (its masks are drawn over whole sequences)",
                                    l + 1, L->line, (double)L->u.block.p);
            sl->split = SHARD_HEADS;
        } else if (L->type == LAYER_EMBEDDING || L->type == LAYER_LM_HEAD) {
            int V = L->type == LAYER_EMBEDDING ? L->u.embedding.vocab : L->u.lm_head.vocab;
            if (V < T)
                return pt_error_set("layer %d (%s, line %d) has %d tokens: it cannot be cut "
                                    "into %d tensor shards (each needs at least one)", l + 1,
                                    layer_type_name(L->type), L->line, V, T);
            if (L->type == LAYER_EMBEDDING) {
                sl->split = SHARD_VOCAB;
                continue;
            }
            /* the logits of each position, cut by token (a sample's T rows of V) */
            sl->split = SHARD_OUT;
            sl->out = (shard_state){1, V, 1};
            p->loss_sharded = l == net->n_layers - 1;
        }
    }
    return 0;
}

int shard_plan_init(shard_plan *p, const net_desc *net, int T, tensor_mode mode)
{
    memset(p, 0, sizeof *p);
    if (T < 1) return pt_error_set("--tensor %d: the tensor size must be at least 1", T);
    if (mode == TENSOR_SEQUENCE && T < 2)
        return pt_error_set("--sequence-parallel cuts the sequence across a tensor group: "
                            "it needs --tensor 2 or more (not %d)", T);
    if (mode == TENSOR_SEQUENCE && !net->sequence)
        return pt_error_set("--sequence-parallel is for language models (an [embedding] "
                            "first): this net has no sequence to cut");
    p->layers = calloc((size_t)net->n_layers ? (size_t)net->n_layers : 1, sizeof *p->layers);
    if (!p->layers) return pt_error_set("out of memory");
    p->T = T;
    p->mode = mode;
    p->n_layers = net->n_layers;
    if (net->sequence) {
        if (plan_sequence(p, net)) {
            shard_plan_free(p);
            return -1;
        }
        return 0;
    }
    shard_state st = {0, net->input.c, net->input.h * net->input.w};
    for (int l = 0; l < net->n_layers; l++) {
        const layer_desc *L = &net->layers[l];
        shard_layer *sl = &p->layers[l];
        sl->in = st;
        if (T == 1) {
            sl->out = st;
            continue;
        }
        if (L->weight_count) {
            if (mode == TENSOR_GATHER || !st.sharded) {
                int n = out_units(L);
                if (n < T) {
                    shard_plan_free(p);
                    return pt_error_set("layer %d (%s, line %d) has %d %s: it cannot be cut "
                                        "into %d tensor shards (each needs at least one)",
                                        l + 1, layer_type_name(L->type), L->line, n,
                                        L->type == LAYER_CONV ? "filters" : "units", T);
                }
                sl->split = SHARD_OUT;
                sl->gather_in = st.sharded;
                sl->in = (shard_state){0, st.units, st.unit};
                st = (shard_state){1, n, L->out.h * L->out.w};
            } else {
                sl->split = SHARD_IN;
                st = (shard_state){0, L->out.c, L->out.h * L->out.w};
            }
        } else if (st.sharded && (L->type == LAYER_MAXPOOL || L->type == LAYER_AVGPOOL)) {
            st.unit = L->out.h * L->out.w;
        } else if (!st.sharded) {
            st = (shard_state){0, L->out.c, L->out.h * L->out.w};
        }
        sl->out = st;
    }
    return 0;
}

void shard_plan_free(shard_plan *p)
{
    free(p->layers);
    memset(p, 0, sizeof *p);
}

/* The local shape of a vector of shape `s` in state `st`. */
static layer_shape local_shape(layer_shape s, const shard_state *st, int T, int t)
{
    if (!st->sharded) return s;
    int off, len;
    shard_cut(st->units, T, t, &off, &len);
    if (s.c == st->units && s.h * s.w == st->unit) return (layer_shape){len, s.h, s.w};
    return (layer_shape){len * st->unit, 1, 1};
}

layer_desc shard_local_layer(const shard_plan *p, const net_desc *net, int l, int t)
{
    layer_desc D = net->layers[l];
    const shard_layer *sl = &p->layers[l];
    D.in = local_shape(D.in, &sl->in, p->T, t);
    D.out = local_shape(D.out, &sl->out, p->T, t);
    size_t in_count = layer_shape_count(D.in);
    if (shard_reduce_scatters(p, l)) /* its whole rows of partial sums, then its slice */
        D.out = net->layers[l].out;
    if (sl->split == SHARD_HEADS && sl->in.sharded) D.u.block.seq = p->T;
    if (sl->split == SHARD_VOCAB) { /* an embedding: its tokens' rows, the positions whole */
        int off, len;
        shard_cut(D.u.embedding.vocab, p->T, t, &off, &len);
        D.u.embedding.vocab = len;
        D.u.embedding.first = off;
        D.u.embedding.shards = p->T;
        D.weight_count = ((size_t)len + (size_t)D.u.embedding.context) * (size_t)D.u.embedding.width;
    } else if (sl->split == SHARD_OUT && D.type == LAYER_LM_HEAD) { /* its tokens' rows */
        int off, len;
        shard_cut(D.u.lm_head.vocab, p->T, t, &off, &len);
        layer_shape o = net->layers[l].out; /* {T, 1, V}: each position's logits, cut */
        D.u.lm_head.vocab = len;
        D.out = (layer_shape){o.c, o.h, len};
        D.weight_count = (size_t)len * (size_t)D.in.w;
    } else if (sl->split == SHARD_HEADS) {
        int T = p->T;
        size_t C = (size_t)D.in.w, A = C / (size_t)T, h = (size_t)D.u.block.hidden / (size_t)T;
        D.u.block.heads /= T;
        D.u.block.hidden /= T;
        D.u.block.shards = T;
        /* c_attn 3A×C, attention c_proj C×A, c_fc h×C, MLP c_proj C×h; the vectors as
         * the whole block's, c_attn's bias 3A and c_fc's h */
        D.weight_count = 4 * A * C + 2 * h * C;
        D.bias_count = 6 * C + 3 * A + h;
    } else if (sl->split == SHARD_OUT) {
        if (D.type == LAYER_CONV) {
            D.u.conv.filters = D.out.c;
            D.weight_count = (size_t)D.out.c * D.in.c * D.u.conv.size * D.u.conv.size;
        } else {
            D.u.dense.units = (int)layer_shape_count(D.out);
            D.weight_count = (size_t)D.u.dense.units * in_count;
        }
        D.bias_count = (size_t)out_units(&D);
    } else if (sl->split == SHARD_IN) {
        if (D.type == LAYER_CONV)
            D.weight_count = (size_t)D.u.conv.filters * D.in.c * D.u.conv.size * D.u.conv.size;
        else
            D.weight_count = (size_t)D.u.dense.units * in_count;
    }
    return D;
}

size_t shard_param_count(const shard_plan *p, const net_desc *net, int first, int last, int t)
{
    size_t n = 0;
    for (int l = first; l < last; l++) {
        layer_desc D = shard_local_layer(p, net, l, t);
        n += D.weight_count + D.bias_count;
    }
    return n;
}

/* Rank t's runs of a block cut by heads: the whole block's tensors in order
 * (src/model/layer_table.c), each cut to the rank's heads (attention width A, columns
 * [a0, a0 + A) of q, k and v) or hidden units [f0, f0 + h). */
static void block_runs(const layer_desc *L, int T, int t,
                       void (*fn)(void *ctx, size_t whole, size_t local, size_t count),
                       void *ctx)
{
    size_t C = (size_t)L->in.w, H = (size_t)L->u.block.hidden;
    size_t A = C / (size_t)T, h = H / (size_t)T, a0 = (size_t)t * A, f0 = (size_t)t * h;
    size_t W = 4 * C * C + 2 * H * C, Wl = 4 * A * C + 2 * h * C; /* the vectors' start */
    for (size_t j = 0; j < 3; j++) /* c_attn.weight: q, k, v rows of the rank's heads */
        fn(ctx, (j * C + a0) * C, j * A * C, A * C);
    for (size_t r = 0; r < C; r++) /* attention c_proj.weight: their input columns */
        fn(ctx, 3 * C * C + r * C + a0, 3 * A * C + r * A, A);
    fn(ctx, 4 * C * C + f0 * C, 4 * A * C, h * C); /* c_fc.weight: rows of its units */
    for (size_t r = 0; r < C; r++) /* MLP c_proj.weight: their input columns */
        fn(ctx, 4 * C * C + H * C + r * H + f0, 4 * A * C + h * C + r * h, h);
    fn(ctx, W, Wl, 2 * C); /* ln_1 weight and bias */
    for (size_t j = 0; j < 3; j++) /* c_attn.bias */
        fn(ctx, W + 2 * C + j * C + a0, Wl + 2 * C + j * A, A);
    fn(ctx, W + 5 * C, Wl + 2 * C + 3 * A, 3 * C); /* attention c_proj.bias, ln_2 */
    fn(ctx, W + 8 * C + f0, Wl + 5 * C + 3 * A, h); /* c_fc.bias */
    fn(ctx, W + 8 * C + H, Wl + 5 * C + 3 * A + h, C); /* MLP c_proj.bias */
}

void shard_layer_runs(const shard_plan *p, const net_desc *net, int l, int t,
                      void (*fn)(void *ctx, size_t whole, size_t local, size_t count),
                      void *ctx)
{
    const layer_desc *L = &net->layers[l];
    const shard_layer *sl = &p->layers[l];
    if (!L->weight_count) return;
    if (sl->split == SHARD_HEADS) {
        block_runs(L, p->T, t, fn, ctx);
        return;
    }
    if (sl->split == SHARD_NONE) { /* whole on every rank */
        fn(ctx, 0, 0, L->weight_count + L->bias_count);
        return;
    }
    if (sl->split == SHARD_VOCAB) { /* the rank's rows of wte, then wpe whole */
        int off, len;
        size_t C = (size_t)L->u.embedding.width, V = (size_t)L->u.embedding.vocab;
        shard_cut(L->u.embedding.vocab, p->T, t, &off, &len);
        fn(ctx, (size_t)off * C, 0, (size_t)len * C);
        fn(ctx, V * C, (size_t)len * C, (size_t)L->u.embedding.context * C);
        return;
    }
    layer_desc D = shard_local_layer(p, net, l, t);
    /* a weight is [units or filters][per-unit values], PyTorch's order */
    int units = out_units(L);
    size_t per = L->weight_count / (size_t)units;
    if (sl->split == SHARD_OUT) {
        int off, len;
        shard_cut(units, p->T, t, &off, &len);
        fn(ctx, (size_t)off * per, 0, (size_t)len * per);
        if (L->bias_count) fn(ctx, L->weight_count + (size_t)off, D.weight_count, (size_t)len);
    } else if (sl->split == SHARD_IN) {
        /* each unit's weights over the input: the rank's run of input channels (conv: the
         * channels' kernels, contiguous) or input values (dense) */
        size_t voff, vlen;
        shard_values(&sl->in, per, p->T, t, &voff, &vlen);
        if (L->type == LAYER_CONV) {
            size_t kk = (size_t)L->u.conv.size * L->u.conv.size;
            int coff, clen;
            shard_cut(sl->in.units, p->T, t, &coff, &clen);
            voff = (size_t)coff * kk;
            vlen = (size_t)clen * kk;
        }
        for (int u = 0; u < units; u++)
            fn(ctx, (size_t)u * per + voff, (size_t)u * vlen, vlen);
        fn(ctx, L->weight_count, D.weight_count, L->bias_count);
    }
}

typedef struct {
    float *local, *whole;
    int to_local;
} copy_ctx;

static void copy_run(void *ctx, size_t whole, size_t local, size_t count)
{
    copy_ctx *c = ctx;
    if (c->to_local) memcpy(c->local + local, c->whole + whole, count * sizeof(float));
    else memcpy(c->whole + whole, c->local + local, count * sizeof(float));
}

void shard_copy_layer(const shard_plan *p, const net_desc *net, int l, int t, float *local,
                      float *whole, int to_local)
{
    copy_ctx c = {local, whole, to_local};
    shard_layer_runs(p, net, l, t, copy_run, &c);
}

void shard_copy_layers(const shard_plan *p, const net_desc *net, int first, int last, int t,
                       float *local, float *whole, int to_local)
{
    size_t lo = 0, wo = 0;
    for (int l = first; l < last; l++) {
        const layer_desc *L = &net->layers[l];
        layer_desc D = shard_local_layer(p, net, l, t);
        shard_copy_layer(p, net, l, t, local + lo, whole + wo, to_local);
        lo += D.weight_count + D.bias_count;
        wo += L->weight_count + L->bias_count;
    }
}

int shard_local_net(net_desc *out, const shard_plan *p, const net_desc *net, int t)
{
    *out = *net;
    out->layers = malloc((size_t)(net->n_layers ? net->n_layers : 1) * sizeof *out->layers);
    if (!out->layers) return pt_error_set("out of memory");
    out->param_count = 0;
    for (int l = 0; l < net->n_layers; l++) {
        out->layers[l] = shard_local_layer(p, net, l, t);
        out->param_count += out->layers[l].weight_count + out->layers[l].bias_count;
    }
    return 0;
}

size_t shard_slot_input(const shard_plan *p, const net_desc *net, int l, int first, int t)
{
    const shard_layer *sl = &p->layers[l];
    /* under sequence parallelism a stage receives its slice: only a gathered input needs
     * storage of its own, at the stage's first layer too */
    if (sl->gather_in && (l > first || shard_sequence(p))) return layer_shape_count(net->layers[l].in);
    if (shard_sequence(p)) return 0;
    if (l == first && sl->in.sharded) {
        size_t off, len;
        shard_values(&sl->in, layer_shape_count(net->layers[l].in), p->T, t, &off, &len);
        return len;
    }
    return 0;
}

int shard_output_gathered(const shard_plan *p, int last)
{
    return p->layers[last - 1].out.sharded && !(p->loss_sharded && last == p->n_layers) &&
           !shard_sequence(p); /* which sends its slice */
}

int shard_reduce_scatters(const shard_plan *p, int l)
{
    return shard_sequence(p) && p->layers[l].split == SHARD_VOCAB && p->layers[l].out.sharded;
}

/* The values of the vector between layers l − 1 and l that rank t sends or receives. */
static size_t boundary_count(const shard_plan *p, const net_desc *net, int l, int t)
{
    size_t whole = layer_shape_count(net->layers[l - 1].out), off, len;
    if (!shard_sequence(p) || l <= 0 || l >= net->n_layers) return whole;
    shard_values(&p->layers[l - 1].out, whole, p->T, t, &off, &len);
    return len;
}

size_t shard_stage_in_count(const shard_plan *p, const net_desc *net, int first, int t)
{
    return first == 0 ? layer_shape_count(net->layers[0].in) : boundary_count(p, net, first, t);
}

size_t shard_stage_out_count(const shard_plan *p, const net_desc *net, int last, int t)
{
    return boundary_count(p, net, last, t);
}

void shard_seq_partial_runs(const shard_plan *p, const net_desc *net, int l, int t,
                            void (*fn)(void *ctx, size_t local, size_t count), void *ctx)
{
    if (!shard_sequence(p)) return;
    const layer_desc *L = &net->layers[l];
    if (L->type == LAYER_LAYERNORM) {
        fn(ctx, 0, L->weight_count + L->bias_count);
        return;
    }
    if (L->type != LAYER_BLOCK || !p->layers[l].in.sharded) return;
    /* the local block: matrices Wl, then ln_1 (2C), c_attn's bias (3A), attention c_proj's
     * bias (C), ln_2 (2C), ... (shard_layer_runs' local order) */
    layer_desc D = shard_local_layer(p, net, l, t);
    size_t C = (size_t)L->in.w, A = C / (size_t)p->T;
    fn(ctx, D.weight_count, 2 * C);
    fn(ctx, D.weight_count + 2 * C + 3 * A + C, 2 * C);
}

int shard_forward_after(const shard_plan *p, int first, int last, int i)
{
    int l = first + i;
    shard_split s = p->layers[l].split;
    int what = s == SHARD_IN || s == SHARD_VOCAB ? SHARD_THEN_REDUCE : 0;
    if (l + 1 < last ? p->layers[l + 1].gather_in : shard_output_gathered(p, last))
        what |= SHARD_THEN_GATHER;
    return what;
}

int shard_backward_stop(const shard_plan *p, int first, int lo, int h)
{
    int b = h - 1;
    /* ... or under a layer whose output was reduce-scattered: its gradient all-gathered */
    while (b > lo && p->layers[first + b].split != SHARD_OUT && !p->layers[first + b].gather_in &&
           !shard_reduce_scatters(p, first + b - 1))
        b--;
    return b;
}

shard_traffic shard_stage_traffic(const shard_plan *p, const net_desc *net, int first, int last,
                                  int first_stage)
{
    shard_traffic tr = {0};
    if (p->T == 1) return tr;
    for (int l = first; l < last; l++) {
        const layer_desc *L = &net->layers[l];
        const shard_layer *sl = &p->layers[l];
        size_t in = layer_shape_count(L->in), out = layer_shape_count(L->out);
        if (sl->split == SHARD_HEADS && shard_sequence(p)) {
            /* two all-gathers and two reduce-scatters each way, each moving what an
             * all-gather of the whole vector moves (counted with the gathers); the
             * backward's gathers carry a layer norm's output too */
            tr.fwd_gather += 4 * out, tr.fwd_gathers += 4;
            tr.bwd_gather += 6 * in, tr.bwd_gathers += 4;
            continue;
        }
        if (sl->split == SHARD_HEADS) { /* attention's and the MLP's, each way */
            tr.fwd_reduce += 2 * out, tr.fwd_reduces += 2;
            tr.bwd_reduce += 2 * in, tr.bwd_reduces += 2;
            continue;
        }
        if (shard_sequence(p)) { /* the embedding's and the lm_head's, both ways */
            if (shard_reduce_scatters(p, l) || sl->gather_in) {
                size_t v = sl->gather_in ? in : out;
                tr.fwd_gather += v, tr.fwd_gathers++;
                tr.bwd_gather += v, tr.bwd_gathers++;
            }
            if (p->loss_sharded && l == p->n_layers - 1)
                tr.fwd_gather += 5 * (size_t)L->out.c * (size_t)p->T, tr.fwd_gathers += 2;
            continue;
        }
        if (sl->gather_in && l > first) tr.fwd_gather += in, tr.fwd_gathers++;
        if (sl->split == SHARD_IN || sl->split == SHARD_VOCAB)
            tr.fwd_reduce += out, tr.fwd_reduces++;
        if (p->loss_sharded && l == p->n_layers - 1) {
            /* the loss on the shards (stage_loss): each position's maximum and its index,
             * then its sum of exponentials (two floats) and target's logit, all-gathered */
            tr.fwd_gather += 5 * (size_t)L->out.c * (size_t)p->T, tr.fwd_gathers += 2;
        }
        /* the input gradient: partial sums of an output-split layer's, or the slices of
         * a stage that took its slice of the input */
        if (!(l == first && first_stage)) {
            if (sl->split == SHARD_OUT) tr.bwd_reduce += in, tr.bwd_reduces++;
            else if (l == first && sl->in.sharded) tr.bwd_gather += in, tr.bwd_gathers++;
        }
    }
    if (shard_output_gathered(p, last)) {
        tr.fwd_gather += layer_shape_count(net->layers[last - 1].out);
        tr.fwd_gathers++;
    }
    return tr;
}

void shard_plan_print(const shard_plan *p, const net_desc *net, FILE *out)
{
    fprintf(out, "tensor shards: %d, mode %s\n", p->T, tensor_mode_name(p->mode));
    fprintf(out, "  %-5s %-8s %-10s %-9s %s\n", "layer", "type", "split by", "input", "output");
    for (int l = 0; l < net->n_layers; l++) {
        const shard_layer *sl = &p->layers[l];
        fprintf(out, "  %-5d %-8s %-10s %-9s %s%s\n", l + 1,
                layer_type_name(net->layers[l].type), shard_split_name(sl->split),
                sl->gather_in ? "gathered" : sl->in.sharded ? "sharded" : "whole",
                sl->out.sharded ? "sharded" : "whole",
                shard_reduce_scatters(p, l) ? " (reduce-scattered)"
                : sl->split == SHARD_IN || sl->split == SHARD_VOCAB ? " (all-reduced)"
                : sl->split == SHARD_HEADS && sl->in.sharded
                    ? " (two all-gathers and two reduce-scatters each way)"
                : sl->split == SHARD_HEADS ? " (two all-reduces each way)"
                : p->loss_sharded && l == net->n_layers - 1 ? " (the loss takes the shards)"
                                                            : "");
    }
}
