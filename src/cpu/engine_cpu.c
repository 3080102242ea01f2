/* The CPU engine: a stage (src/cpu/stage.h) with its micro-batch buffers in host memory.
 * Everything runs synchronously, so messages are ready as soon as they are prepared (unless
 * a test delays them) and ticks are host clock readings around each call. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/base/clock.h"
#include "src/cpu/engine_cpu.h"
#include "src/cpu/stage.h"
#include "src/base/error.h"
#include "src/base/pages.h"
#include "src/engine/stage_plan.h"
#include "src/model/layer_table.h"

typedef struct {
    stage st;
    float **in;        /* [n_in] the stage's input: pixels (stage 0, [buffers]) or ACT_IN */
    float **grad_in;   /* [n_recv_grad] GRAD_IN; on the last stage the loss gradient (NULL where
                          it overwrites the logits in the slot: loss_in_place) */
    float **grad_out;  /* [n_send] GRAD_OUT (not on stage 0) */
    int n_in, n_recv, n_recv_grad, n_send; /* message b's entry: b mod n_recv (activations)
                                               or n_recv_grad received, mod n_send sent */
    int32_t **labels;  /* [buffers][max_batch] (last stage) */
    int64_t **ids;     /* [buffers][max_batch] */
    int *slot_of;      /* [buffers] the slot holding m's activations, −1 for none */
    float **act_out;   /* recompute: [n_kept] outputs of training forwards, kept to send
                          while their activations are dropped (not on the last stage) */
    int n_kept;
    int *kept_of;      /* recompute: [buffers] m's entry of act_out, −1 for none */
    int *kept_busy;    /* [n_kept] */
    int *n_of;         /* [buffers] samples of m's last forward */
    int *polls[2];     /* [buffers]: msg_ready polls of ACT_OUT and GRAD_OUT since prepare */
    int first_stage, last_stage;
    int loss_in_place; /* the last layer's backward never reads its output (and no
                          recomputation drops the slot between the forward and backward) */
    int pieces;        /* grad_pieces, at least 1 */
    float **piece;     /* [pieces]: [0] the stage's gradients, the others owned */
    engine_result sums;
    /* ZeRO (optim_shard): the runs this replica steps and their compact moments (the
     * stage's whole m and v are then never allocated) */
    engine_run *zruns;
    int n_zruns;
    float *zm, *zv;
    int zero2;          /* grads_shard: ZeRO-2, the gradients' pages are given back */
    pages_pool pool;    /* ZeRO-2: the released pages, kept for the next backward (grads_fill) */
    /* ZeRO-2, this step: bytes grads_fill asked for and grads_release gave, and the most
     * the asks ran ahead of the releases (what the pool must hold at the step's start) */
    size_t asked, given, ahead;
    size_t grads_peak;  /* the gradient arrays' most backed bytes seen (grads_resident) */
    /* ZeRO-3 (params_shard): the runtime's layer hook, and the parameters' most backed
     * bytes seen at the end of a layer's pass */
    engine_layer_hook zhook;
    void *zhook_ctx;
    pages_pool ppool;   /* the released parameter pages, kept for the next gather */
    size_t params_peak;
} cpu_engine;

static cpu_engine *impl(engine *e) { return e->impl; }

/* Buffer m's input (stage 0: its samples, one per buffer), received gradient and gradient
 * to send (messages: m mod n_recv or n_recv_grad received, m mod n_send sent). */
static float *input_of(const cpu_engine *c, int m)
{
    return c->in[c->first_stage ? m : m % c->n_recv];
}
static float *grad_in_of(const cpu_engine *c, int m)
{
    if (!c->loss_in_place) return c->grad_in[m % c->n_recv_grad];
    return c->slot_of[m] < 0 ? NULL : (float *)stage_output(&c->st, c->slot_of[m]);
}
static float *grad_out_of(const cpu_engine *c, int m)
{
    return c->first_stage ? NULL : c->grad_out[m % c->n_send];
}

static void *alloc_array(size_t bytes)
{
    /* aligned_alloc wants a multiple of the alignment */
    return aligned_alloc(STAGE_ALIGN, stage_round_up(bytes ? bytes : 1));
}

static void free_arrays(void **a, int n)
{
    if (!a) return;
    for (int i = 0; i < n; i++) free(a[i]);
    free(a);
}

static void **alloc_arrays(int n, size_t bytes)
{
    void **a = calloc((size_t)n, sizeof *a);
    if (!a) return NULL;
    for (int i = 0; i < n; i++) {
        if (!(a[i] = alloc_array(bytes))) {
            free_arrays(a, n);
            return NULL;
        }
    }
    return a;
}

static void cpu_destroy(engine *e)
{
    cpu_engine *c = impl(e);
    if (c) {
        int n = e->cfg.buffers;
        stage_free(&c->st);
        free_arrays((void **)c->in, c->n_in);
        free_arrays((void **)c->grad_in, c->n_recv_grad);
        free_arrays((void **)c->grad_out, c->n_send);
        free_arrays((void **)c->labels, n);
        free_arrays((void **)c->ids, n);
        free(c->slot_of);
        free_arrays((void **)c->act_out, c->n_kept);
        free(c->kept_of);
        free(c->kept_busy);
        free(c->n_of);
        free(c->polls[0]);
        free(c->polls[1]);
        if (c->piece)
            for (int p = 1; p < c->pieces; p++) /* the stage's grads_bytes: gone with it */
                pages_free(c->piece[p], stage_round_up(e->param_count * sizeof(float)));
        free(c->piece);
        pages_pool_free(&c->pool);
        pages_pool_free(&c->ppool);
        free(c->zruns);
        free(c->zm);
        free(c->zv);
        free(c);
    }
    engine_base_free(e);
    free(e);
}

static int cpu_init_params(engine *e, uint64_t seed)
{
    stage_init_params(&impl(e)->st, seed);
    return 0;
}

static int cpu_read_params(engine *e, float *host)
{
    memcpy(host, impl(e)->st.params, e->param_count * sizeof(float));
    return 0;
}

static int cpu_write_params(engine *e, const float *host)
{
    memcpy(impl(e)->st.params, host, e->param_count * sizeof(float));
    return 0;
}

/* ZeRO: the runs' moments between the whole arrays' positions and the compact ones. */
static void copy_runs(const cpu_engine *c, float *whole, float *compact, int to_whole)
{
    size_t k = 0;
    for (int i = 0; i < c->n_zruns; i++) {
        const engine_run *r = &c->zruns[i];
        if (to_whole) memcpy(whole + r->off, compact + k, r->count * sizeof(float));
        else memcpy(compact + k, whole + r->off, r->count * sizeof(float));
        k += r->count;
    }
}

static int cpu_read_state(engine *e, float *m, float *v, long *updates)
{
    cpu_engine *c = impl(e);
    const stage *st = &c->st;
    *updates = st->step;
    if (c->zruns) {
        copy_runs(c, m, c->zm, 1);
        copy_runs(c, v, c->zv, 1);
    } else if (st->opt_m) {
        memcpy(m, st->opt_m, e->param_count * sizeof(float));
        memcpy(v, st->opt_v, e->param_count * sizeof(float));
    } else { /* no update yet: the moments are zero */
        memset(m, 0, e->param_count * sizeof(float));
        memset(v, 0, e->param_count * sizeof(float));
    }
    return 0;
}

static int cpu_write_state(engine *e, const float *m, const float *v, long updates)
{
    cpu_engine *c = impl(e);
    stage *st = &c->st;
    st->step = updates;
    if (c->zruns) {
        copy_runs(c, (float *)m, c->zm, 0);
        copy_runs(c, (float *)v, c->zv, 0);
        return 0;
    }
    if (stage_alloc_optim(st)) return -1;
    memcpy(st->opt_m, m, e->param_count * sizeof(float));
    memcpy(st->opt_v, v, e->param_count * sizeof(float));
    return 0;
}

static int cpu_optim_shard(engine *e, const engine_run *runs, int n)
{
    cpu_engine *c = impl(e);
    if (c->zruns || c->st.opt_m)
        return pt_error_set("CPU engine: the optimizer's state is already allocated");
    size_t total = engine_runs_count(runs, n);
    c->zruns = malloc((size_t)(n > 0 ? n : 1) * sizeof *c->zruns);
    c->zm = alloc_array(total * sizeof(float));
    c->zv = alloc_array(total * sizeof(float));
    if (!c->zruns || !c->zm || !c->zv)
        return pt_error_set("out of memory for the optimizer's shard (%zu parameters)", total);
    memcpy(c->zruns, runs, (size_t)n * sizeof *runs);
    c->n_zruns = n;
    memset(c->zm, 0, total * sizeof(float));
    memset(c->zv, 0, total * sizeof(float));
    return 0;
}

/* The backed bytes of every gradient array now (the stage's and the pieces), measured; the
 * peak is kept. */
static void sample_grads(cpu_engine *c)
{
    size_t n = stage_grads_resident(&c->st);
    for (int p = 1; c->piece && p < c->pieces; p++)
        n += pages_resident(c->piece[p], c->st.grads_bytes);
    n += pages_pool_resident(&c->pool); /* kept for the next backward: still gradients' memory */
    if (n > c->grads_peak) c->grads_peak = n;
}

static int cpu_grads_shard(engine *e)
{
    cpu_engine *c = impl(e);
    c->zero2 = 1;
    if (stage_enable_release(&c->st)) return -1;
    /* room for everything that can be released at once: addresses only */
    if (pages_pool_init(&c->pool, (size_t)c->pieces * c->st.grads_bytes))
        return pt_error_set("CPU engine: no addresses for ZeRO-2's page pool (%zu bytes)",
                            (size_t)c->pieces * c->st.grads_bytes);
    pages_pool_limit(&c->pool, 0); /* nothing asked yet: released pages go back (cpu_step) */
    return 0;
}

static int run_by_off(const void *a, const void *b)
{
    size_t x = ((const engine_run *)a)->off, y = ((const engine_run *)b)->off;
    return (x > y) - (x < y);
}

/* ZeRO-2's zeroing after the step (issue 27): the replica's own shard is written with
 * zeros and keeps its pages, everything else goes back (pages_zero). Releasing the shard
 * too, as stage_zero_grad does, made the next backward fault every one of its pages in
 * again (a trap and a kernel clear per 4 KiB) although the step keeps them anyway: the
 * peak (at the step's start) holds the shard whatever happens after. The rest is mostly
 * given back already (give_back); a bucket kept whole is zeroed here. */
static void zero2_grads(cpu_engine *c)
{
    stage *st = &c->st;
    size_t n = st->plan.param_count, at = 0;
    engine_run *r = malloc((size_t)c->n_zruns * sizeof *r + 1);
    if (!r) { /* correct, only slower: release all */
        stage_zero_grad(st);
        return;
    }
    memcpy(r, c->zruns, (size_t)c->n_zruns * sizeof *r);
    qsort(r, (size_t)c->n_zruns, sizeof *r, run_by_off);
    for (int i = 0; i < c->n_zruns; i++) {
        if (!r[i].count) continue;
        if (r[i].off > at) pages_zero(st->grads + at, (r[i].off - at) * sizeof(float));
        memset(st->grads + r[i].off, 0, r[i].count * sizeof(float));
        if (r[i].off + r[i].count > at) at = r[i].off + r[i].count;
    }
    if (n > at) pages_zero(st->grads + at, (n - at) * sizeof(float));
    free(r);
    stage_plan_grads_zeroed(&st->plan);
}

static int cpu_grads_release(engine *e, int piece, size_t off, size_t count)
{
    cpu_engine *c = impl(e);
    if (!c->zero2) return pt_error_set("CPU engine: gradients released without --zero 2");
    if (engine_grads_range_check(e, piece, off, count, "release")) return -1;
    sample_grads(c); /* the peak: just before memory goes back */
    c->given += count * sizeof(float);
    /* into the pool rather than to the system: the next backward's grads_fill moves these
     * pages back in, where a fresh page would cost a fault and a kernel clear each */
    if (pages_pool_put(&c->pool, c->piece[piece] + off, count * sizeof(float)))
        return pt_error_set("CPU engine: gradients [%zu, %zu) of piece %d could not be mapped "
                            "again after moving their pages", off, off + count, piece);
    return 0;
}

static int cpu_grads_fill(engine *e, int piece, size_t off, size_t count)
{
    cpu_engine *c = impl(e);
    if (!c->zero2) return pt_error_set("CPU engine: gradients filled without --zero 2");
    if (engine_grads_range_check(e, piece, off, count, "fill")) return -1;
    char *at;
    size_t moved;
    c->asked += count * sizeof(float);
    if (c->asked > c->given && c->asked - c->given > c->ahead) c->ahead = c->asked - c->given;
    if (pages_pool_take(&c->pool, c->piece[piece] + off, count * sizeof(float), &at, &moved))
        return pt_error_set("CPU engine: the page pool's addresses could not be mapped again");
    /* a moved page holds an old gradient: zeroed (a memset on present pages, no fault)
     * where the kernels add to what they find, the stage's gradients without pieces (the
     * first micro-batch's is formed in place); with pieces, each micro-batch's piece is
     * zeroed before it is formed (stage_plan_grad_target: every parameter, no batched
     * layers with pieces) */
    if (moved && c->pieces <= 1) memset(at, 0, moved);
    return 0;
}

/* ZeRO-3: the stage's hook, which measures the parameters' backed bytes at the end of each
 * layer's pass, before the runtime gives the layer back: the most held at once (the layer
 * whole, the next one's gather, the shards). */
static int cpu_layer_hook(void *ctx, int layer, int backward, int begins)
{
    cpu_engine *c = ctx;
    if (!begins) { /* the pool counts: parameters' memory between two gathers */
        size_t n = pages_resident(c->st.params, c->st.grads_bytes) + pages_pool_resident(&c->ppool);
        if (n > c->params_peak) c->params_peak = n;
    }
    return c->zhook(c->zhook_ctx, layer, backward, begins);
}

static int cpu_params_shard(engine *e, engine_layer_hook hook, void *ctx, size_t keep)
{
    cpu_engine *c = impl(e);
    /* a released layer's pages are moved into the next gather's range (mremap) rather
     * than faulted in and cleared by the kernel again: the pool holds about a layer */
    if (pages_pool_init(&c->ppool, c->st.grads_bytes))
        return pt_error_set("CPU engine: no addresses for ZeRO-3's page pool (%zu bytes)",
                            c->st.grads_bytes);
    pages_pool_limit(&c->ppool, keep);
    c->zhook = hook;
    c->zhook_ctx = ctx;
    c->st.layer_hook = cpu_layer_hook;
    c->st.hook_ctx = c;
    return 0;
}

static int cpu_params_release(engine *e, size_t off, size_t count)
{
    cpu_engine *c = impl(e);
    if (!c->zhook) return pt_error_set("CPU engine: parameters released without --zero 3");
    if (off > e->param_count || count > e->param_count - off)
        return pt_error_set("CPU engine: parameters [%zu, %zu) released, outside the stage's "
                            "%zu", off, off + count, e->param_count);
    if (pages_pool_put(&c->ppool, c->st.params + off, count * sizeof(float)))
        return pt_error_set("CPU engine: parameters [%zu, %zu) could not be mapped again after "
                            "moving their pages", off, off + count);
    return 0;
}

static int cpu_params_fill(engine *e, size_t off, size_t count)
{
    cpu_engine *c = impl(e);
    char *at;
    size_t moved;
    if (!c->zhook) return pt_error_set("CPU engine: parameters filled without --zero 3");
    if (off > e->param_count || count > e->param_count - off)
        return pt_error_set("CPU engine: parameters [%zu, %zu) filled, outside the stage's %zu",
                            off, off + count, e->param_count);
    if (pages_pool_take(&c->ppool, c->st.params + off, count * sizeof(float), &at, &moved))
        return pt_error_set("CPU engine: the parameters' page pool could not be mapped again");
    return 0; /* the gather writes every element: nothing to clear */
}

static void cpu_state_bytes(const engine *e, size_t *params, size_t *grads, size_t *optim)
{
    cpu_engine *c = e->impl;
    size_t block = stage_round_up(e->param_count * sizeof(float));
    *params = c->zhook ? c->params_peak : block;
    sample_grads(c);
    *grads = c->grads_peak;
    if (c->zruns) *optim = 2 * stage_round_up(engine_runs_count(c->zruns, c->n_zruns) * sizeof(float));
    else *optim = c->st.opt_memory ? 2 * block : 0;
}

static int cpu_params_host(engine *e, float **host)
{
    *host = impl(e)->st.params;
    return 0;
}

static int cpu_load(engine *e, int m, const dataset *d, const int64_t *ids, int n)
{
    cpu_engine *c = impl(e);
    const net_desc *net = e->cfg.net;
    int L = data_labels_per_sample(d);
    if (!d->tokens != !net->sequence || L != data_model_labels(net))
        return pt_error_set("CPU engine: %s data (%d label%s a sample) for %s model (%d)",
                            d->tokens ? "text" : "image", L, L == 1 ? "" : "s",
                            net->sequence ? "a language" : "an image", data_model_labels(net));
    if (c->first_stage && d->tokens) {
        for (int j = 0; j < n; j++) /* token ids, as floats */
            memcpy(c->in[m] + (size_t)j * L, d->tokens + (size_t)ids[j] * L,
                   (size_t)L * sizeof(float));
    } else if (c->first_stage) {
        size_t px = data_image_bytes(d);
        for (int j = 0; j < n; j++)
            kernel_bytes_to_float_cpu(c->in[m] + (size_t)j * px, d->pixels + (size_t)ids[j] * px,
                                      px);
    }
    if (c->last_stage && L == 1)
        for (int j = 0; j < n; j++) c->labels[m][j] = d->labels[ids[j]];
    else if (c->last_stage)
        for (int j = 0; j < n; j++)
            memcpy(c->labels[m] + (size_t)j * L, d->labels + (size_t)ids[j] * L,
                   (size_t)L * sizeof(int32_t));
    memcpy(c->ids[m], ids, (size_t)n * sizeof *ids);
    return 0;
}

static void tick(engine *e, int t, double t0)
{
    if (t < 0) return;
    e->tick_t0[t] = t0;
    e->tick_t1[t] = pt_now();
}

/* Takes a slot for m and runs its forward; its first row in the step's stash. */
static const float *forward_slot(engine *e, int m, int n, uint64_t seed, uint64_t step,
                                 int training)
{
    cpu_engine *c = impl(e);
    int slot = stage_slot_acquire(&c->st);
    if (slot < 0) return NULL;
    c->slot_of[m] = slot;
    c->n_of[m] = n;
    if (e->cfg.wgrad_rows)
        stage_slot_set_row(&c->st, slot, engine_stash_row(e, m));
    return stage_forward(&c->st, slot, input_of(c, m), n, c->ids[m], seed, step, training);
}

static int cpu_forward(engine *e, int m, int n, uint64_t seed, uint64_t step, int training,
                       int t)
{
    cpu_engine *c = impl(e);
    double t0 = pt_now();
    const float *y = forward_slot(e, m, n, seed, step, training);
    if (!y) return -1;
    if (c->last_stage) {
        int ok = 0;
        /* a row of scores per label: a language model's n·T positions (with tensor shards
         * perhaps this rank's tokens of each: the stage computes the loss with its group) */
        double l = stage_loss(&c->st, y, training ? grad_in_of(c, m) : NULL, &ok, c->labels[m],
                              n * data_model_labels(e->cfg.net),
                              engine_loss_scale(&e->cfg, training));
        if (stage_tensor_failed(&c->st)) return -1;
        if (!isfinite(l)) c->sums.nonfinite = 1;
        c->sums.loss_sum += l;
        c->sums.correct += ok;
    }
    if (engine_drops_activations(&e->cfg, training)) {
        /* keep the output to send (the last stage keeps the loss gradient instead) and
         * drop the activations until recompute(m) */
        if (!c->last_stage) {
            int k = 0;
            while (k < c->n_kept && c->kept_busy[k]) k++;
            if (k == c->n_kept)
                return pt_error_set("CPU engine: all %d kept outputs are in use (the "
                                    "schedule holds more micro-batches than its verifier "
                                    "counted)", c->n_kept);
            c->kept_busy[k] = 1;
            c->kept_of[m] = k;
            memcpy(c->act_out[k], y, (size_t)n * e->out_count * sizeof(float));
        }
        stage_slot_release(&c->st, c->slot_of[m]);
        c->slot_of[m] = -1;
    }
    tick(e, t, t0);
    return 0;
}

static int cpu_recompute(engine *e, int m, uint64_t seed, uint64_t step, int t)
{
    cpu_engine *c = impl(e);
    double t0 = pt_now();
    if (!e->cfg.recompute || c->slot_of[m] >= 0)
        return pt_error_set("CPU engine: recompute of micro-batch buffer %d, which %s", m,
                            e->cfg.recompute ? "holds its activations" : "is not recomputed");
    if (!forward_slot(e, m, c->n_of[m], seed, step, 1)) return -1;
    tick(e, t, t0);
    return 0;
}

/* Where m's gradient goes: NULL, added to the stage's; with pieces, formed alone in
 * piece m mod P. */
static float *grads_of(engine *e, int m)
{
    int k = engine_piece_of(&e->cfg, m);
    return k < 0 ? NULL : impl(e)->piece[k];
}

static int cpu_backward(engine *e, int m, int t)
{
    cpu_engine *c = impl(e);
    double t0 = pt_now();
    if (stage_plan_range_idle(&c->st.plan, "backward")) return -1;
    stage_backward_to(&c->st, c->slot_of[m], grad_in_of(c, m), grad_out_of(c, m),
                      grads_of(e, m));
    if (stage_tensor_failed(&c->st)) return -1;
    if (e->cfg.wgrad_rows && engine_last_microbatch(e, m))
        stage_wgrad_flush(&c->st, 0, c->st.plan.nl);
    tick(e, t, t0);
    return 0;
}

static int cpu_backward_input(engine *e, int m, int t)
{
    cpu_engine *c = impl(e);
    double t0 = pt_now();
    if (stage_backward_input(&c->st, c->slot_of[m], grad_in_of(c, m), grad_out_of(c, m)) ||
        stage_tensor_failed(&c->st))
        return -1;
    tick(e, t, t0);
    return 0;
}

static int cpu_backward_weight(engine *e, int m, int lo, int hi, int t)
{
    cpu_engine *c = impl(e);
    double t0 = pt_now();
    if (stage_backward_weight(&c->st, c->slot_of[m], lo, hi, grads_of(e, m))) return -1;
    if (e->cfg.wgrad_rows && engine_last_microbatch(e, m)) stage_wgrad_flush(&c->st, lo, hi);
    tick(e, t, t0);
    return 0;
}

static int cpu_backward_range(engine *e, int m, int lo, int hi, int t)
{
    cpu_engine *c = impl(e);
    double t0 = pt_now();
    if (m < 0 || m >= e->cfg.buffers)
        return pt_error_set("CPU engine: backward of micro-batch buffer %d, outside 0..%d", m,
                            e->cfg.buffers - 1);
    if (stage_backward_range(&c->st, c->slot_of[m], lo, hi, grad_in_of(c, m),
                             grad_out_of(c, m), grads_of(e, m)) ||
        stage_tensor_failed(&c->st))
        return -1;
    if (e->cfg.wgrad_rows && engine_last_microbatch(e, m)) stage_wgrad_flush(&c->st, lo, hi);
    tick(e, t, t0);
    return 0;
}

/* The gradients are host memory already: MPI reads and writes them in place. */
static int cpu_grads_host(engine *e, int piece, size_t off, size_t count, float **host)
{
    *host = NULL;
    if (engine_grads_range_check(e, piece, off, count, "host view")) return -1;
    *host = impl(e)->piece[piece] + off;
    return 0;
}

static int cpu_grads_commit(engine *e, size_t off, size_t count)
{
    return engine_grads_range_check(e, 0, off, count, "commit");
}

static int cpu_zero_grads(engine *e)
{
    cpu_engine *c = impl(e);
    stage_zero_grad(&c->st);
    /* ZeRO-2: the pieces too (the calibration's reductions read them in whole) */
    for (int p = 1; c->zero2 && p < c->pieces; p++)
        pages_zero(c->piece[p], e->param_count * sizeof(float));
    return 0;
}

static int cpu_release(engine *e, int m)
{
    cpu_engine *c = impl(e);
    if (c->slot_of[m] >= 0) stage_slot_release(&c->st, c->slot_of[m]);
    c->slot_of[m] = -1;
    /* the output kept to send (recompute): the send is done by now */
    if (c->kept_of && c->kept_of[m] >= 0) c->kept_busy[c->kept_of[m]] = 0;
    if (c->kept_of) c->kept_of[m] = -1;
    return 0;
}

/* ZeRO-2, at the step (this step's releases all done): a backward's bucket parts ask for
 * their pages before the earlier buckets' reductions give theirs back, by at most `ahead`
 * bytes; the next backward runs the same parts, so the pool keeps that much (and at most
 * that much from now on: the pages moving between the pool and the buckets' ranges then
 * stay the same ones) and gives the rest back. The step's peak holds the shard and those
 * pages, about two buckets beyond the shard as without the pool. Before any ask (the first
 * step) the limit is 0: every released page goes back. */
static void limit_pool(cpu_engine *c)
{
    pages_pool_limit(&c->pool, c->ahead);
    c->asked = c->given = c->ahead = 0;
}

static int cpu_step(engine *e, const optimizer_config *o, int t)
{
    double t0 = pt_now();
    cpu_engine *c = impl(e);
    stage *st = &c->st;
    if (stage_plan_range_idle(&st->plan, "step")) return -1;
    if (c->zero2) limit_pool(c);
    if (c->zruns) { /* ZeRO: this replica's shard */
        stage_optim_state whole = {.params = st->params, .grads = st->grads,
                                   .count = st->plan.param_count, .step = &st->step,
                                   .plan = &st->plan};
        if (engine_optim_step_runs(&optim_kernels_cpu, NULL, &whole, c->zm, c->zv, c->zruns,
                                   c->n_zruns, o))
            return -1;
    } else if (stage_step(st, o)) {
        return -1;
    }
    sample_grads(c); /* the most the gradients hold: the step's start */
    /* ZeRO-2 with pieces: every piece, the stage's too, is zeroed as its micro-batch's
     * gradient is formed (stage_plan_grad_target), so nothing is zeroed here: the pieces
     * before the last keep their pages for the next step's whole backwards, which would
     * fault them in again (issue 27), and the last piece's went back (replicas.c) */
    if (c->zero2 && c->pieces > 1) stage_plan_grads_zeroed(&st->plan);
    else if (c->zero2) zero2_grads(c);
    else stage_zero_grad(st);
    tick(e, t, t0);
    return 0;
}

static void *cpu_msg_buffer(engine *e, engine_msg k, int m)
{
    cpu_engine *c = impl(e);
    switch (k) {
    case ENGINE_MSG_ACT_IN: return input_of(c, m);
    case ENGINE_MSG_GRAD_IN: return grad_in_of(c, m);
    case ENGINE_MSG_ACT_OUT:
        if (c->kept_of && c->kept_of[m] >= 0) return c->act_out[c->kept_of[m]];
        /* the last layer's output, which may alias the input (an all-identity stage) */
        return (void *)stage_output(&c->st, c->slot_of[m]);
    case ENGINE_MSG_GRAD_OUT: return grad_out_of(c, m);
    }
    return NULL;
}

static int cpu_msg_received(engine *e, engine_msg k, int m)
{
    (void)e, (void)k, (void)m;
    return 0;
}

static int cpu_msg_prepare(engine *e, engine_msg k, int m)
{
    impl(e)->polls[k == ENGINE_MSG_GRAD_OUT][m] = 0;
    return 0;
}

/* Ready at once, unless a test asks for the delays of a device copy. */
static int cpu_msg_ready(engine *e, engine_msg k, int m, int *ready)
{
    *ready = impl(e)->polls[k == ENGINE_MSG_GRAD_OUT][m]++ >= e->cfg.debug_ready_delay;
    return 0;
}

static int cpu_finish(engine *e, engine_result *r)
{
    *r = impl(e)->sums;
    memset(&impl(e)->sums, 0, sizeof impl(e)->sums);
    e->tensor_s = impl(e)->st.tp_s;
    return 0;
}

static const engine_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .init_params = cpu_init_params,
    .read_params = cpu_read_params,
    .write_params = cpu_write_params,
    .read_state = cpu_read_state,
    .write_state = cpu_write_state,
    .load = cpu_load,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .backward_range = cpu_backward_range,
    .backward_input = cpu_backward_input,
    .backward_weight = cpu_backward_weight,
    .recompute = cpu_recompute,
    .grads_host = cpu_grads_host,
    .grads_commit = cpu_grads_commit,
    .zero_grads = cpu_zero_grads,
    .release = cpu_release,
    .step = cpu_step,
    .msg_buffer = cpu_msg_buffer,
    .msg_received = cpu_msg_received,
    .msg_prepare = cpu_msg_prepare,
    .msg_ready = cpu_msg_ready,
    .finish = cpu_finish,
    .optim_shard = cpu_optim_shard,
    .grads_shard = cpu_grads_shard,
    .grads_release = cpu_grads_release,
    .grads_fill = cpu_grads_fill,
    .params_shard = cpu_params_shard,
    .params_release = cpu_params_release,
    .params_fill = cpu_params_fill,
    .params_host = cpu_params_host,
    .state_bytes = cpu_state_bytes,
};

int engine_cpu_create(engine **out, const engine_config *cfg)
{
    *out = NULL;
    engine *e = calloc(1, sizeof *e);
    if (!e) return pt_error_set("out of memory");
    if (engine_base_init(e, &cpu_ops, cfg)) {
        free(e);
        return -1;
    }
    cpu_engine *c = calloc(1, sizeof *c);
    e->impl = c;
    if (!c) {
        cpu_destroy(e);
        return pt_error_set("out of memory");
    }
    if (stage_init_shard(&c->st, cfg->net, cfg->first, cfg->last, cfg->max_batch, cfg->n_slots,
                         cfg->threads > 0 ? cfg->threads : 1, cfg->shard, cfg->shard_rank,
                         &cfg->tensor_comm)) {
        cpu_destroy(e);
        return -1;
    }
    c->st.bf16 = cfg->precision == ENGINE_BF16;
    e->param_count = c->st.plan.param_count; /* this rank's shards with tensor shards */
    e->slot_bytes = c->st.plan.slot_bytes;
    c->first_stage = cfg->first == 0;
    c->last_stage = cfg->last == cfg->net->n_layers;
    int nb = cfg->buffers;
    size_t mb = (size_t)cfg->max_batch;
    int n_msg = cfg->message_buffers > 0 && cfg->message_buffers < nb ? cfg->message_buffers
                                                                       : nb;
    c->n_recv = cfg->receive_buffers > 0 && cfg->receive_buffers < n_msg ? cfg->receive_buffers
                                                                           : n_msg;
    c->n_recv_grad = cfg->receive_grad_buffers <= 0 ? c->n_recv
                     : cfg->receive_grad_buffers < n_msg ? cfg->receive_grad_buffers
                                                         : n_msg;
    c->n_send = cfg->send_buffers > 0 && cfg->send_buffers < n_msg ? cfg->send_buffers : n_msg;
    c->n_in = c->first_stage ? nb : c->n_recv;
    c->in = (float **)alloc_arrays(c->n_in, mb * e->in_count * sizeof(float));
    /* on the last stage the loss gradient may take the logits' place in the slot: a
     * language model's logits are its largest activation (GPT-2's 50,257 per token) */
    c->loss_in_place = layer_loss_in_place(cfg->net, cfg->last, cfg->recompute);
    c->grad_in = c->loss_in_place
                     ? NULL
                     : (float **)alloc_arrays(c->n_recv_grad, mb * e->out_count * sizeof(float));
    c->grad_out = c->first_stage ? NULL : (float **)alloc_arrays(c->n_send, mb * e->in_count *
                                                                                 sizeof(float));
    c->labels = (int32_t **)alloc_arrays(nb, mb * data_model_labels(cfg->net) * sizeof(int32_t));
    c->ids = (int64_t **)alloc_arrays(nb, mb * sizeof(int64_t));
    c->slot_of = malloc((size_t)nb * sizeof *c->slot_of);
    c->n_of = calloc((size_t)nb, sizeof *c->n_of);
    for (int m = 0; c->slot_of && m < nb; m++) c->slot_of[m] = -1;
    int extras_ok = c->n_of != NULL;
    if (cfg->recompute && !c->last_stage) {
        c->n_kept = cfg->kept_outputs > 0 ? cfg->kept_outputs : nb;
        c->act_out = (float **)alloc_arrays(c->n_kept, mb * e->out_count * sizeof(float));
        c->kept_of = malloc((size_t)nb * sizeof *c->kept_of);
        c->kept_busy = calloc((size_t)c->n_kept, sizeof *c->kept_busy);
        extras_ok = extras_ok && c->act_out && c->kept_of && c->kept_busy;
        for (int m = 0; c->kept_of && m < nb; m++) c->kept_of[m] = -1;
    }
    c->polls[0] = calloc((size_t)nb, sizeof *c->polls[0]);
    c->polls[1] = calloc((size_t)nb, sizeof *c->polls[1]);
    c->pieces = engine_pieces(cfg);
    c->piece = calloc((size_t)c->pieces, sizeof *c->piece);
    int pieces_ok = c->piece != NULL;
    for (int p = 1; pieces_ok && p < c->pieces; p++) {
        /* pages: backed where written, given back by grads_release under ZeRO-2 */
        if (!(c->piece[p] = pages_alloc(c->st.grads_bytes))) pieces_ok = 0;
    }
    if (c->piece) c->piece[0] = c->st.grads;
    if (!extras_ok || !pieces_ok || !c->in || (!c->loss_in_place && !c->grad_in) ||
        (!c->first_stage && !c->grad_out) || !c->labels ||
        !c->ids || !c->slot_of || !c->polls[0] || !c->polls[1]) {
        cpu_destroy(e);
        return pt_error_set("out of memory for %d micro-batch buffers of %d samples", nb,
                            cfg->max_batch);
    }
    if ((cfg->split_backward && stage_enable_split(&c->st)) ||
        (cfg->wgrad_rows && stage_enable_batched_wgrad(&c->st, cfg->wgrad_rows))) {
        cpu_destroy(e);
        return -1;
    }
    *out = e;
    return 0;
}
