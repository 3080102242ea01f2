/* The tensor-parallel runs of a stage's layers (src/engine/stage_plan.h, "tensor-parallel
 * runs"): layers run between the group's collectives, the collectives a layer split by
 * inputs, cut by heads or by positions needs, forward and backward. */
#include "src/engine/stage_plan.h"

#include <string.h>

#include "src/base/error.h"

/* ---------------------------------------------------- tensor-parallel runs ---- */

void stage_tensor_counts(const stage_plan *p, const shard_state *st, size_t whole, int n,
                         size_t *count, size_t *off, size_t *len)
{
    int T = p->tp->T;
    for (int r = 0; r < T; r++) {
        shard_values(st, whole, T, r, &off[r], &len[r]);
        count[r] = (size_t)n * len[r];
    }
}

/* This rank's slice of n whole rows of a vector in state st. */
static int slice_mine(const stage_tensor_run *r, const shard_state *st, size_t whole,
                      const float *in, float *out)
{
    size_t off, len;
    shard_values(st, whole, r->plan->tp->T, r->plan->tp_rank, &off, &len);
    return r->ops->slice(r->self, in, whole, off, len, out, r->n);
}

/* A device that runs no layers in phases meets one (it refuses such models before). */
static int no_phases(const stage_plan *p)
{
    return pt_error_set("%s %d..%d: this device cannot run a layer in phases (a transformer "
                        "block cut by heads)", p->name, p->first, p->last - 1);
}

static int forward_one(const stage_tensor_run *r, int lo, int hi, int from, int to)
{
    const stage_tensor_ops *o = r->ops;
    if (!from && !to) return o->forward(r->self, lo, hi);
    return o->forward_phases ? o->forward_phases(r->self, lo, hi, from, to) : no_phases(r->plan);
}

/* The forward of local layers [lo, hi) from phase `from` of lo to before phase `to` of
 * hi − 1 (0: its end). With the layer hook, one layer at a time: each begins at its first
 * phase, and ends here unless it is the run's last layer and the run reaches its end (then
 * the caller ends it after its bias and activation, end_forward). */
static int run_forward(const stage_tensor_run *r, int lo, int hi, int from, int to)
{
    if (!r->layer) return forward_one(r, lo, hi, from, to);
    for (int i = lo; i < hi; i++) {
        int f = i == lo ? from : 0, t = i == hi - 1 ? to : 0;
        if ((!f && r->layer(r->self, i, 0, 1)) || forward_one(r, i, i + 1, f, t) ||
            (i < hi - 1 && r->layer(r->self, i, 0, 0)))
            return -1;
    }
    return 0;
}

/* The layer hook: local layer i's forward is done (its parameters no longer read). */
static int end_forward(const stage_tensor_run *r, int i)
{
    return r->layer ? r->layer(r->self, i, 0, 0) : 0;
}

/* A device without the sequence-parallel collectives meets them (it refuses before). */
static int no_sequence(const stage_plan *p)
{
    return pt_error_set("%s %d..%d: this device has no sequence-parallel collectives",
                        p->name, p->first, p->last - 1);
}

/* Layer l's input cut by positions (the state sequence parallelism sends it in; a gathered
 * input is whole as the layer uses it). */
static shard_state seq_state(const stage_plan *p, int l)
{
    shard_state st = p->tp->layers[l].in;
    st.sharded = 1;
    return st;
}

/* Between forward phases k and k + 1 of local layer i: the all-reduce of its output's
 * partial sums, or under sequence parallelism the all-gather of its output rows into the
 * exchange (k even) and the reduce-scatter of the exchange into them (k odd). */
static int forward_between(const stage_tensor_run *r, int i, int k)
{
    const stage_plan *p = r->plan;
    const stage_tensor_ops *o = r->ops;
    int l = p->first + i;
    float *buf = r->layers[i].buf;
    if (layer_block_seq(&p->loc[i]) == 1)
        return o->allreduce(r->self, buf, (size_t)r->n * layer_shape_count(p->loc[i].out));
    if (!o->reduce_scatter) return no_sequence(p);
    shard_state st = seq_state(p, l);
    size_t whole = layer_shape_count(p->net->layers[l].in);
    return k % 2 ? o->reduce_scatter(r->self, &st, whole, r->seq, buf, r->n)
                 : o->gather(r->self, &st, whole, buf, r->seq, r->n);
}

int stage_tensor_forward(const stage_tensor_run *r)
{
    const stage_plan *p = r->plan;
    const stage_tensor_ops *o = r->ops;
    if (!p->tp) return o->forward(r->self, 0, p->nl);
    const net_desc *net = p->net;
    const stage_slot_layer *ly = r->layers;
    int nl = p->nl, n = r->n, lo = 0, from = 0;
    size_t in0 = layer_shape_count(net->layers[p->first].in);
    if (ly[0].xin && shard_sequence(p->tp)) { /* the slice received, gathered */
        shard_state st = seq_state(p, p->first);
        if (o->gather(r->self, &st, in0, r->input, ly[0].xin, n)) return -1;
    } else if (ly[0].xin && /* the stage's first layer works on a slice of the whole input */
               slice_mine(r, &p->tp->layers[p->first].in, in0, r->input, ly[0].xin))
        return -1;
    for (int i = 0; i < nl; i++) {
        int l = p->first + i, np = stage_plan_phases(p, i);
        /* a layer in phases: its output's partial sums all-reduced after each but the last */
        for (int k = 0; k < np - 1; k++) {
            if (run_forward(r, lo, i + 1, from, k + 1) || forward_between(r, i, k)) return -1;
            lo = i;
            from = k + 1;
        }
        int then = shard_forward_after(p->tp, p->first, p->last, i);
        if (!then && i < nl - 1) continue;
        if (run_forward(r, lo, i + 1, from, 0)) return -1;
        lo = i + 1;
        from = 0;
        /* an input-split layer's bias and activation follow (an embedding cut by vocabulary
         * has neither) */
        if ((then & SHARD_THEN_REDUCE) && shard_reduce_scatters(p->tp, l)) {
            if (!o->reduce_scatter) return no_sequence(p);
            if (o->reduce_scatter(r->self, &p->tp->layers[l].out,
                                  layer_shape_count(net->layers[l].out), ly[i].buf, ly[i].buf, n))
                return -1;
        } else if ((then & SHARD_THEN_REDUCE) &&
            (o->allreduce(r->self, ly[i].buf, (size_t)n * layer_shape_count(p->loc[i].out)) ||
             (stage_plan_split_in(p, i) && o->finish(r->self, i, ly[i].buf, n))))
            return -1;
        if (end_forward(r, i)) return -1;
        if ((then & SHARD_THEN_GATHER) &&
            o->gather(r->self, &p->tp->layers[l].out, layer_shape_count(net->layers[l].out),
                      ly[i].out, i + 1 < nl ? ly[i + 1].xin : r->whole_out, n))
            return -1;
    }
    return 0;
}

/* After the run [b, h): what the group does with the gradient at local layer b's input. */
static int backward_collective(const stage_tensor_run *r, int b, float *din)
{
    const stage_plan *p = r->plan;
    const shard_plan *tp = p->tp;
    const stage_tensor_ops *o = r->ops;
    int l = p->first + b, n = r->n;
    size_t whole = layer_shape_count(p->net->layers[l].in);
    if (shard_sequence(tp) && !o->seq_carry) return no_sequence(p);
    /* sequence parallelism: a gathered input's partial gradient reduce-scattered back to
     * the previous layer's slice, a reduce-scattered output's gradient all-gathered */
    if (shard_sequence(tp) && b > 0 && tp->layers[l].split == SHARD_OUT)
        return o->seq_carry(r->self, &tp->layers[l - 1].out, whole, n, 0);
    if (b > 0 && shard_reduce_scatters(tp, l - 1))
        return o->seq_carry(r->self, &tp->layers[l - 1].out, whole, n, 1);
    if (shard_sequence(tp) && b == 0 && din && tp->layers[l].split == SHARD_OUT) {
        shard_state st = seq_state(p, l);
        return o->reduce_scatter(r->self, &st, whole, r->tp_din, din, n);
    }
    if (b > 0 && tp->layers[l].split == SHARD_OUT) {
        size_t from = 0, keep = whole;
        if (r->layers[b].xin) /* gathered input: back to the previous layer's slice */
            shard_values(&tp->layers[l - 1].out, whole, tp->T, p->tp_rank, &from, &keep);
        return o->reduce_carry(r->self, b, whole, from, keep, n);
    }
    if (b == 0 && din && tp->layers[l].split == SHARD_OUT)
        return o->allreduce(r->self, din, (size_t)n * whole);
    if (b == 0 && din && r->layers[0].xin) /* a sliced stage input's gradient */
        return o->gather(r->self, &tp->layers[l].in, whole, r->tp_din, din, n);
    return 0;
}

/* The backward of local layers [lo, hi) from phase `from` of hi − 1 to before phase `to`
 * of lo (0: its end). */
static int backward_one(const stage_tensor_run *r, int lo, int hi, int from, int to,
                        const float *dout, float *din)
{
    const stage_tensor_ops *o = r->ops;
    if (!from && !to) return o->backward(r->self, lo, hi, dout, din);
    return o->backward_phases ? o->backward_phases(r->self, lo, hi, from, to, dout, din)
                              : no_phases(r->plan);
}

/* With the layer hook, one layer at a time from the top (the running gradient waits where
 * a run's lower end leaves it, as between runs), each begun at its first backward phase and
 * ended after its last: no collective after a backward run reads parameters. */
static int run_backward(const stage_tensor_run *r, int lo, int hi, int from, int to,
                        const float *dout, float *din)
{
    if (!r->layer) return backward_one(r, lo, hi, from, to, dout, din);
    for (int i = hi - 1; i >= lo; i--) {
        int f = i == hi - 1 ? from : 0, t = i == lo ? to : 0;
        if ((!f && r->layer(r->self, i, 1, 1)) ||
            backward_one(r, i, i + 1, f, t, i == hi - 1 ? dout : NULL, i == lo ? din : NULL) ||
            (!t && r->layer(r->self, i, 1, 0)))
            return -1;
    }
    return 0;
}

/* Where a backward run from phase `from` of local layer h − 1 stops: inside layer *b
 * before phase *to, at the first boundary between phases below its start, else at the
 * end of layer *b = shard_backward_stop's (*to = 0). */
static void backward_stop(const stage_plan *p, int lo, int h, int from, int *b, int *to)
{
    int stop = shard_backward_stop(p->tp, p->first, lo, h);
    for (int i = h - 1; i >= stop; i--) {
        int start = i == h - 1 ? from : 0;
        if (start + 1 < stage_plan_phases(p, i)) {
            *b = i;
            *to = start + 1;
            return;
        }
    }
    *b = stop;
    *to = 0;
}

int stage_tensor_backward(const stage_tensor_run *r, int lo, int hi, const float *dout,
                          float *din)
{
    const stage_plan *p = r->plan;
    const stage_tensor_ops *o = r->ops;
    int nl = p->nl;
    if (!p->tp) return o->backward(r->self, lo, hi, hi == nl ? dout : NULL, din);
    if (hi == nl && r->whole_out) {
        int L = p->last - 1;
        if (slice_mine(r, &p->tp->layers[L].out, layer_shape_count(p->net->layers[L].out), dout,
                       r->tp_dout))
            return -1;
        dout = r->tp_dout;
    }
    if (hi == nl && shard_reduce_scatters(p->tp, p->last - 1)) { /* the slice received */
        int L = p->last - 1;
        if (o->gather(r->self, &p->tp->layers[L].out, layer_shape_count(p->net->layers[L].out),
                      dout, r->tp_dout, r->n))
            return -1;
        dout = r->tp_dout;
    }
    for (int h = hi, from = 0; h > lo;) {
        int b, to;
        backward_stop(p, lo, h, from, &b, &to);
        int slice_in = b == 0 && !to && r->layers[0].xin;
        if (run_backward(r, b, h, from, to, h == nl && !from ? dout : NULL,
                         b == 0 && !to ? (slice_in && din ? r->tp_din : din) : NULL))
            return -1;
        if (to && layer_block_seq(&p->loc[b]) > 1) { /* gathered, or reduce-scattered */
            shard_state st = seq_state(p, p->first + b);
            size_t whole = layer_shape_count(p->net->layers[p->first + b].in);
            int gather = (to - 1) % 2 == 0;
            if (gather) { /* each position's gradient and layer-norm output */
                st.unit *= 2;
                whole *= 2;
            }
            if (!o->seq_carry) return no_sequence(p);
            if (o->seq_carry(r->self, &st, whole, r->n, gather)) return -1;
            h = b + 1;
            from = to;
            continue;
        }
        if (to) { /* inside layer b: the partial gradient its phase left, all-reduced */
            size_t whole = layer_shape_count(p->loc[b].in);
            if (o->reduce_carry(r->self, b, whole, 0, whole, r->n)) return -1;
            h = b + 1;
            from = to;
            continue;
        }
        if (backward_collective(r, b, din)) return -1;
        h = b;
        from = 0;
    }
    return 0;
}

