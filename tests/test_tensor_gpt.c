/* Tensor shards of transformer language models at the stage level (src/model/shard.c, the
 * phases of src/engine/layer_ops.c, the tensor runs of src/engine/stage_plan.c and
 * src/cpu/stage.c, the loss of src/cpu/stage_loss.c): T stages of one process, one per
 * tensor rank, each on its own thread, their collectives a fake group that sums (and
 * concatenates) the ranks' buffers in rank order. Against the unsharded stage: the logits
 * (sharded by vocabulary, put together) and the loss on them, every parameter gradient
 * (the ranks' shards put together into whole tensors: the replicated ones must be each
 * rank's whole gradient, not a sum over ranks), the input gradient of a stage that starts
 * at a block, and SGD steps, to float32's tolerance (the shards sum in another order); the
 * embedding cut by vocabulary bit for bit; each rank's initial parameters are exact slices
 * of the whole ones; the split backward, a backward by ranges and two threads are
 * bit-identical to the sharded whole backward; exactly two all-reduces per block each way
 * (one for the embedding, one for the head, two all-gathers for the loss); blocks whose
 * heads or hidden units, and vocabularies that do not cut T ways are refused naming the
 * layer. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/cpu/stage.h"
#include "src/model/net.h"
#include "src/model/shard.h"
#include "tests/check.h"

void openblas_set_num_threads(int);

enum { MAX_T = 4 };

/* V = 13, T = 6, C = 16, two blocks of 4 heads (hidden 24), a dropout between them on the
 * sequence, ln_f and a head (tied or not). */
static const char *tiny(int tied)
{
    static char buf[512];
    snprintf(buf, sizeof buf,
             "[net]\n[embedding]\nvocab=13\ncontext=6\nwidth=16\n[block]\nheads=4\nhidden=24\n"
             "[dropout]\np=0.25\n[block]\nheads=4\nhidden=24\n[layernorm]\n[lm_head]\ntied=%d\n",
             tied);
    return buf;
}

static void parse(net_desc *net, int tied)
{
    cr_assert_eq(net_desc_parse_string(net, tiny(tied), "tiny.cfg"), 0, "%s", pt_error_get());
}

/* ---- the fake tensor group: T threads meet at a barrier for every collective ---- */

typedef struct {
    int T;
    pthread_barrier_t bar;
    float *buf[MAX_T];
    size_t n[MAX_T];
    const float *send[MAX_T];
    const size_t *count[MAX_T];
    int reduces, gathers; /* counted by rank 0 */
    int bad;              /* the ranks disagreed on a collective's size */
} group;

typedef struct {
    group *g;
    int rank;
} member;

static int fake_allreduce(void *ctx, float *buf, size_t n)
{
    member *m = ctx;
    group *g = m->g;
    g->buf[m->rank] = buf;
    g->n[m->rank] = n;
    pthread_barrier_wait(&g->bar);
    float *sum = malloc((n ? n : 1) * sizeof *sum);
    for (int r = 0; r < g->T; r++)
        if (g->n[r] != n) g->bad = 1;
    if (!g->bad) {
        memcpy(sum, g->buf[0], n * sizeof *sum);
        for (int r = 1; r < g->T; r++)
            for (size_t i = 0; i < n; i++) sum[i] += g->buf[r][i];
    }
    pthread_barrier_wait(&g->bar); /* every rank has read every buffer */
    if (!g->bad) memcpy(buf, sum, n * sizeof *sum);
    free(sum);
    if (m->rank == 0) g->reduces++;
    pthread_barrier_wait(&g->bar);
    return 0;
}

static int fake_allgather(void *ctx, const float *send, float *recv, const size_t *count)
{
    member *m = ctx;
    group *g = m->g;
    g->send[m->rank] = send;
    g->count[m->rank] = count;
    pthread_barrier_wait(&g->bar);
    size_t at = 0;
    for (int r = 0; r < g->T; r++) {
        memcpy(recv + at, g->send[r], count[r] * sizeof *recv);
        at += count[r];
    }
    pthread_barrier_wait(&g->bar);
    if (m->rank == 0) g->gathers++;
    return 0;
}

/* ---- one step of a stage: forward, loss (or a given output gradient), backward ---- */

typedef struct {
    stage *s;
    const float *x;        /* n samples of the stage's input */
    const int32_t *labels; /* the last stage of a language model: the loss's */
    const float *dy;       /* else the output gradient */
    int n, mode;           /* mode: 0 whole backward, 1 B then W, 2 by ranges */
    int steps;             /* > 0: SGD steps after each backward (then the loss of each) */
    float *logits;         /* out: the stage's output (this rank's columns of sharded logits) */
    int correct;           /* out: the last pass's rows whose argmax is the label */
    float *din;            /* out (NULL: not wanted): the input gradient */
    double loss[4];
} job;

static void one_pass(job *j, int k)
{
    stage *s = j->s;
    const net_desc *net = s->plan.net;
    int64_t ids[64];
    for (int i = 0; i < j->n; i++) ids[i] = 100 + i;
    /* the stage's output as this rank holds it */
    size_t out = layer_shape_count(s->plan.loc[s->plan.nl - 1].out);
    if (!stage_loss_sharded(s)) out = stage_out_count(s);
    int slot = stage_slot_acquire(s);
    const float *y = stage_forward(s, slot, j->x, j->n, ids, 7, (uint64_t)k, 1);
    memcpy(j->logits, y, (size_t)j->n * out * sizeof(float));
    float *g = malloc((size_t)j->n * out * sizeof(float));
    if (j->labels) {
        int T = net->input.c;
        j->loss[k] = stage_loss(s, y, g, &j->correct, j->labels, j->n * T,
                                1.0f / (float)(j->n * T)) /
                     (j->n * T);
    } else {
        memcpy(g, j->dy, (size_t)j->n * out * sizeof(float));
    }
    int nl = s->plan.nl;
    if (j->mode == 1) {
        (void)stage_backward_input(s, slot, g, j->din);
        (void)stage_backward_weight(s, slot, 0, nl, NULL);
    } else if (j->mode == 2) {
        /* every layer its own range, from the top */
        for (int hi = nl; hi > 0; hi--)
            (void)stage_backward_range(s, slot, hi - 1, hi, g, j->din, NULL);
    } else {
        stage_backward(s, slot, g, j->din);
    }
    stage_slot_release(s, slot);
    free(g);
}

static void *run_job(void *arg)
{
    job *j = arg;
    if (j->steps == 0) {
        one_pass(j, 0);
        return NULL;
    }
    /* SGD: Adam would turn the rounding noise of a gradient that is zero in exact
     * arithmetic (c_attn's key bias: the softmax ignores it) into steps of lr's size */
    optimizer_config o = {.kind = OPTIM_SGD, .lr = 0.5f};
    for (int k = 0; k < j->steps; k++) {
        stage_zero_grad(j->s);
        one_pass(j, k);
        (void)stage_step(j->s, &o);
    }
    return NULL;
}

/* The ranks' jobs, each on its thread (T = 1: the caller's). */
static void run_ranks(job *jobs, int T)
{
    if (T == 1) {
        run_job(&jobs[0]);
        return;
    }
    pthread_t th[MAX_T];
    for (int t = 0; t < T; t++) cr_assert_eq(pthread_create(&th[t], NULL, run_job, &jobs[t]), 0);
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
}

/* ---- a sharded run and its unsharded reference ---- */

typedef struct {
    int T;
    shard_plan sp;
    group g;
    member m[MAX_T];
    stage s[MAX_T];
} shards;

static void shards_init(shards *h, const net_desc *net, int first, int last, int n, int T,
                        int threads, int split)
{
    memset(h, 0, sizeof *h);
    h->T = T;
    cr_assert_eq(shard_plan_init(&h->sp, net, T, TENSOR_MEGATRON), 0, "%s", pt_error_get());
    h->g.T = T;
    pthread_barrier_init(&h->g.bar, NULL, (unsigned)T);
    for (int t = 0; t < T; t++) {
        h->m[t] = (member){&h->g, t};
        stage_tensor_comm comm = {&h->m[t], fake_allreduce, fake_allgather, NULL};
        cr_assert_eq(stage_init_shard(&h->s[t], net, first, last, n, 2, threads, &h->sp, t,
                                      &comm),
                     0, "%s", pt_error_get());
        if (split) cr_assert_eq(stage_enable_split(&h->s[t]), 0, "%s", pt_error_get());
        stage_init_params(&h->s[t], 3);
    }
}

static void shards_free(shards *h)
{
    for (int t = 0; t < h->T; t++) stage_free(&h->s[t]);
    pthread_barrier_destroy(&h->g.bar);
    shard_plan_free(&h->sp);
}

/* The ranks' arrays (params or grads) of layers [first, last) put together into the
 * whole tensors' `count` values. A value several ranks hold (a replicated tensor) must be
 * the same bits on each, and every value must be held by some rank. */
static void put_together(shards *h, const net_desc *net, int first, int last, int grads,
                         float *whole, size_t count)
{
    float *mine = malloc(count * sizeof *mine);
    for (size_t i = 0; i < count; i++) whole[i] = NAN;
    for (int t = 0; t < h->T; t++) {
        for (size_t i = 0; i < count; i++) mine[i] = NAN;
        shard_copy_layers(&h->sp, net, first, last, t, grads ? h->s[t].grads : h->s[t].params,
                          mine, 0);
        for (size_t i = 0; i < count; i++) {
            if (isnan(mine[i])) continue;
            cr_assert(isnan(whole[i]) || !memcmp(&whole[i], &mine[i], sizeof(float)),
                      "%s %zu: rank %d holds %.9g, an earlier rank %.9g",
                      grads ? "gradient" : "parameter", i, t, mine[i], whole[i]);
            whole[i] = mine[i];
        }
    }
    for (size_t i = 0; i < count; i++)
        cr_assert(!isnan(whole[i]), "%s %zu: held by no rank", grads ? "gradient" : "parameter", i);
    free(mine);
}

/* Tokens and next tokens of n samples. */
static void make_tokens(int n, int T, int V, float *x, int32_t *labels)
{
    for (int j = 0; j < n; j++)
        for (int t = 0; t < T; t++) {
            x[j * T + t] = (float)(int)(rng_uniform_at(5, 40 + (uint64_t)j, (uint64_t)t) * V);
            labels[j * T + t] = (int32_t)(rng_uniform_at(5, 90 + (uint64_t)j, (uint64_t)t) * V);
        }
}

/* Larger values than GPT-2's σ so every path carries a visible gradient: the same for
 * every layout (each rank's are the slices of the whole's). */
static void perturb_whole(float *w, size_t count)
{
    for (size_t i = 0; i < count; i++) w[i] += 0.3f * (rng_uniform_at(9, 1, i) - 0.5f);
}

static size_t layers_params(const net_desc *net, int first, int last)
{
    size_t n = 0;
    for (int l = first; l < last; l++) n += net->layers[l].weight_count + net->layers[l].bias_count;
    return n;
}

/* The sharded run of layers [first, last) with n samples in `mode` against the unsharded
 * stage: outputs, losses, input gradients, parameter gradients (or parameters after
 * `steps` SGD steps). */
typedef struct {
    float *out, *din, *grads, *params;
    double loss[4];
    int correct;
    int reduces, gathers;
} result;

static void result_free(result *r)
{
    free(r->out);
    free(r->din);
    free(r->grads);
    free(r->params);
}

/* The ranks' columns of sharded logits (n samples) put together into outs[0]. */
static void whole_logits(const net_desc *net, int n, int T, float *const *outs)
{
    int V = net->classes;
    size_t rows = (size_t)n * net->input.c;
    float *whole = malloc(rows * V * sizeof(float));
    for (int t = 0; t < T; t++) {
        int off, len;
        shard_cut(V, T, t, &off, &len);
        for (size_t i = 0; i < rows; i++)
            memcpy(whole + i * V + off, outs[t] + i * len, (size_t)len * sizeof(float));
    }
    memcpy(outs[0], whole, rows * V * sizeof(float));
    free(whole);
}

static result run_layout(const net_desc *net, int first, int last, int n, int T, int threads,
                         int mode, int steps)
{
    result res = {0};
    shards h;
    stage one;
    stage *st;
    if (T > 1) {
        shards_init(&h, net, first, last, n, T, threads, mode == 1);
        st = h.s;
    } else {
        cr_assert_eq(stage_init(&one, net, first, last, n, 2, threads), 0, "%s", pt_error_get());
        if (mode == 1) cr_assert_eq(stage_enable_split(&one), 0, "%s", pt_error_get());
        stage_init_params(&one, 3);
        st = &one;
    }
    /* the perturbed whole parameters, each rank its slices */
    size_t P = layers_params(net, first, last);
    float *whole = malloc(P * sizeof *whole);
    if (T > 1) put_together(&h, net, first, last, 0, whole, P);
    else memcpy(whole, one.params, P * sizeof *whole);
    perturb_whole(whole, P);
    for (int t = 0; t < T; t++)
        if (T > 1) shard_copy_layers(&h.sp, net, first, last, t, h.s[t].params, whole, 1);
        else memcpy(one.params, whole, P * sizeof *whole);
    size_t in = layer_shape_count(net->layers[first].in),
           out = layer_shape_count(net->layers[last - 1].out);
    float *x = malloc((size_t)n * in * sizeof *x);
    float *dy = malloc((size_t)n * out * sizeof *dy);
    int32_t *labels = malloc((size_t)n * net->input.c * sizeof *labels);
    float *tokens = malloc((size_t)n * net->input.c * sizeof *tokens);
    make_tokens(n, net->input.c, net->classes, tokens, labels);
    if (first == 0) memcpy(x, tokens, (size_t)n * in * sizeof *x);
    else
        for (size_t i = 0; i < (size_t)n * in; i++) x[i] = rng_uniform_at(4, 4, i) - 0.5f;
    free(tokens);
    for (size_t i = 0; i < (size_t)n * out; i++) dy[i] = rng_uniform_at(4, 5, i) - 0.5f;
    int lm = net->layers[last - 1].type == LAYER_LM_HEAD;
    job jobs[MAX_T];
    float *outs[MAX_T], *dins[MAX_T];
    for (int t = 0; t < T; t++) {
        outs[t] = malloc((size_t)n * out * sizeof(float));
        dins[t] = first > 0 ? malloc((size_t)n * in * sizeof(float)) : NULL;
        jobs[t] = (job){.s = &st[t], .x = x, .labels = lm ? labels : NULL, .dy = dy, .n = n,
                        .mode = mode, .steps = steps, .logits = outs[t], .din = dins[t]};
    }
    run_ranks(jobs, T);
    int sharded_out = T > 1 && stage_loss_sharded(&st[0]);
    if (sharded_out) whole_logits(net, n, T, outs);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(stage_tensor_failed(&st[t]), 0, "rank %d: %s", t, pt_error_get());
        /* every rank computes the same whole output (unless sharded logits), loss and
         * input gradient */
        if (!sharded_out)
            cr_assert_eq(count_differences(outs[t], outs[0], (size_t)n * out), 0,
                         "rank %d's output differs from rank 0's", t);
        cr_assert_eq(memcmp(jobs[t].loss, jobs[0].loss, sizeof jobs[0].loss), 0);
        cr_assert_eq(jobs[t].correct, jobs[0].correct);
        if (dins[t])
            cr_assert_eq(count_differences(dins[t], dins[0], (size_t)n * in), 0,
                         "rank %d's input gradient differs from rank 0's", t);
    }
    res.out = outs[0];
    res.din = dins[0];
    res.correct = jobs[0].correct;
    memcpy(res.loss, jobs[0].loss, sizeof res.loss);
    for (int t = 1; t < T; t++) {
        free(outs[t]);
        free(dins[t]);
    }
    res.grads = malloc(P * sizeof(float));
    res.params = malloc(P * sizeof(float));
    if (T > 1) {
        put_together(&h, net, first, last, 1, res.grads, P);
        put_together(&h, net, first, last, 0, res.params, P);
        cr_assert_eq(h.g.bad, 0, "the ranks disagreed on a collective's size");
        res.reduces = h.g.reduces;
        res.gathers = h.g.gathers;
        shards_free(&h);
    } else {
        memcpy(res.grads, one.grads, P * sizeof(float));
        memcpy(res.params, one.params, P * sizeof(float));
        stage_free(&one);
    }
    free(whole);
    free(x);
    free(dy);
    free(labels);
    return res;
}

/* Each tensor of layers [first, last) within rtol of its largest value (sums cut across
 * ranks round differently; a tensor's small elements are differences of large terms). */
static void check_tensors(const char *what, const net_desc *net, int first, int last,
                          const float *a, const float *ref, double rtol)
{
    size_t off = 0;
    for (int l = first; l < last; l++) {
        layer_tensor t[LAYER_MAX_TENSORS];
        int nt = layer_tensors(&net->layers[l], net->blocks, t);
        for (int k = 0; k < nt; k++) {
            const float *x = a + off + t[k].offset, *r = ref + off + t[k].offset;
            double big = 0;
            for (size_t i = 0; i < t[k].count; i++)
                if (fabs(r[i]) > big) big = fabs(r[i]);
            char name[160];
            snprintf(name, sizeof name, "%s: layer %d %s", what, l, t[k].name);
            CHECK_CLOSE(name, x, r, t[k].count, rtol * big, 0.0);
        }
        off += net->layers[l].weight_count + net->layers[l].bias_count;
    }
}

static void check_against_whole(const net_desc *net, int first, int last, int n, int T,
                                int threads)
{
    result one = run_layout(net, first, last, n, 1, 1, 0, 0);
    result sh = run_layout(net, first, last, n, T, threads, 0, 0);
    size_t out = layer_shape_count(net->layers[last - 1].out) * (size_t)n;
    double big = 0;
    for (size_t i = 0; i < out; i++)
        if (fabs(one.out[i]) > big) big = fabs(one.out[i]);
    CHECK_CLOSE("output", sh.out, one.out, out, 1e-5 * big, 0.0);
    cr_assert(fabs(sh.loss[0] - one.loss[0]) <= 1e-6 * fabs(one.loss[0]), "loss %.9g, one %.9g",
              sh.loss[0], one.loss[0]);
    if (first > 0) {
        size_t in = layer_shape_count(net->layers[first].in) * (size_t)n;
        CHECK_CLOSE("input gradient", sh.din, one.din, in, 1e-6, 1e-4);
    }
    char what[64];
    snprintf(what, sizeof what, "T=%d layers %d..%d gradient", T, first, last - 1);
    check_tensors(what, net, first, last, sh.grads, one.grads, 1e-5);
    cr_assert_eq(sh.correct, one.correct);
    /* two all-reduces per block each way; the embedding's output, the head's input
     * gradient; the loss's two all-gathers */
    int blocks = 0, head = net->layers[last - 1].type == LAYER_LM_HEAD;
    for (int l = first; l < last; l++) blocks += net->layers[l].type == LAYER_BLOCK;
    int reduces = 4 * blocks + (first == 0) + head;
    cr_assert_eq(sh.reduces, reduces, "T=%d layers %d..%d: %d all-reduces, not %d", T, first,
                 last - 1, sh.reduces, reduces);
    cr_assert_eq(sh.gathers, 2 * head);
    result_free(&one);
    result_free(&sh);
}

Test(tensor_gpt, shards_match_one_process)
{
    openblas_set_num_threads(1);
    for (int tied = 0; tied < 2; tied++) {
        net_desc net;
        parse(&net, tied);
        for (int T = 2; T <= 4; T += 2) {
            /* 48 samples of 6 tokens are chunks of 22, 22 and 4: the inner gradients and
             * the carried ones of several chunks between the phases */
            check_against_whole(&net, 0, net.n_layers, 48, T, 1);
            check_against_whole(&net, 1, 4, 5, T, 2); /* a stage that starts at a block */
            check_against_whole(&net, 3, net.n_layers, 3, T, 1);
        }
        net_desc_free(&net);
    }
}

/* The embedding cut by vocabulary: each token's row comes from one rank, the position's
 * from rank 0, so the all-reduced output and the gradients are the whole layer's bits. */
Test(tensor_gpt, embedding_shards_are_bit_identical)
{
    openblas_set_num_threads(1);
    net_desc net;
    parse(&net, 0);
    size_t P = layers_params(&net, 0, 1), out = layer_shape_count(net.layers[0].out) * 48;
    result one = run_layout(&net, 0, 1, 48, 1, 1, 0, 0);
    for (int T = 2; T <= 4; T += 2) {
        result sh = run_layout(&net, 0, 1, 48, T, 1, 0, 0);
        cr_assert_eq(count_differences(sh.out, one.out, out), 0, "T=%d: output", T);
        cr_assert_eq(count_differences(sh.grads, one.grads, P), 0, "T=%d: gradients", T);
        cr_assert_eq(sh.reduces, 1);
        result_free(&sh);
    }
    result_free(&one);
    net_desc_free(&net);
}

Test(tensor_gpt, gpt_nano_two_shards)
{
    openblas_set_num_threads(1);
    net_desc net;
    load_model(&net, "gpt-nano.cfg");
    check_against_whole(&net, 0, net.n_layers, 8, 2, 2); /* two chunks of 4 */
    check_against_whole(&net, 2, net.n_layers, 4, 2, 1); /* stage 2 of 2 */
    net_desc_free(&net);
}

/* The split backward (B then W), a backward by ranges and two threads: the sharded whole
 * backward's bits. */
Test(tensor_gpt, split_ranges_and_threads_are_bit_identical)
{
    openblas_set_num_threads(1);
    net_desc net;
    parse(&net, 1);
    int cuts[][2] = {{0, 6}, {1, 4}};
    for (int c = 0; c < 2; c++) {
        int a = cuts[c][0], b = cuts[c][1];
        size_t P = layers_params(&net, a, b);
        result whole = run_layout(&net, a, b, 48, 2, 1, 0, 0);
        result split = run_layout(&net, a, b, 48, 2, 1, 1, 0);
        result ranges = run_layout(&net, a, b, 48, 2, 1, 2, 0);
        result two = run_layout(&net, a, b, 48, 2, 2, 0, 0);
        cr_assert_eq(count_differences(split.grads, whole.grads, P), 0, "layers %d..%d: split",
                     a, b - 1);
        cr_assert_eq(count_differences(ranges.grads, whole.grads, P), 0,
                     "layers %d..%d: ranges", a, b - 1);
        cr_assert_eq(count_differences(two.grads, whole.grads, P), 0,
                     "layers %d..%d: 2 threads", a, b - 1);
        if (a > 0) {
            size_t in = layer_shape_count(net.layers[a].in) * 48;
            cr_assert_eq(count_differences(split.din, whole.din, in), 0);
            cr_assert_eq(count_differences(ranges.din, whole.din, in), 0);
        }
        size_t nz = 0;
        for (size_t i = 0; i < P; i++) nz += whole.grads[i] != 0;
        cr_assert_gt(nz, P / 2, "layers %d..%d: most gradients are zero", a, b - 1);
        result_free(&whole);
        result_free(&split);
        result_free(&ranges);
        result_free(&two);
    }
    net_desc_free(&net);
}

/* Three SGD steps: each rank updates its shard, the replicated parameters move as one
 * process's. */
Test(tensor_gpt, sgd_steps_match_one_process)
{
    openblas_set_num_threads(1);
    net_desc net;
    parse(&net, 0);
    result one = run_layout(&net, 0, net.n_layers, 8, 1, 1, 0, 3);
    result sh = run_layout(&net, 0, net.n_layers, 8, 2, 1, 0, 3);
    for (int k = 0; k < 3; k++)
        cr_assert(fabs(sh.loss[k] - one.loss[k]) <= 1e-5 * fabs(one.loss[k]),
                  "step %d: loss %.9g, one process %.9g", k, sh.loss[k], one.loss[k]);
    check_tensors("parameters after 3 SGD steps", &net, 0, net.n_layers, sh.params,
                  one.params, 1e-5);
    cr_assert(sh.loss[2] < sh.loss[0], "the loss does not fall: %g then %g", sh.loss[0],
              sh.loss[2]);
    result_free(&one);
    result_free(&sh);
    net_desc_free(&net);
}

/* Each rank draws its shard as slices of the whole tensors' draws: put together, the
 * ranks' initial parameters are the one process's, bit for bit; and every whole value is
 * held by exactly one rank (a cut tensor) or by all (a replicated one). */
Test(tensor_gpt, initial_shards_are_slices_of_the_whole)
{
    for (int tied = 0; tied < 2; tied++) {
        net_desc net;
        parse(&net, tied);
        for (int T = 2; T <= 4; T += 2) {
            shards h;
            shards_init(&h, &net, 0, net.n_layers, 2, T, 1, 0);
            stage one;
            cr_assert_eq(stage_init(&one, &net, 0, net.n_layers, 2, 1, 1), 0);
            stage_init_params(&one, 3);
            size_t P = one.plan.param_count;
            float *whole = calloc(P, sizeof *whole);
            for (int t = 0; t < T; t++) {
                cr_assert_eq(h.s[t].plan.param_count,
                             shard_param_count(&h.sp, &net, 0, net.n_layers, t));
                float *mine = calloc(P, sizeof *mine);
                shard_copy_layers(&h.sp, &net, 0, net.n_layers, t, h.s[t].params, mine, 0);
                /* a value rank t holds is the one process's */
                float *local = malloc(h.s[t].plan.param_count * sizeof *local);
                shard_copy_layers(&h.sp, &net, 0, net.n_layers, t, local, one.params, 1);
                cr_assert_eq(count_differences(local, h.s[t].params, h.s[t].plan.param_count),
                             0, "T=%d rank %d: its shard is not the whole's slice", T, t);
                shard_copy_layers(&h.sp, &net, 0, net.n_layers, t, h.s[t].params, whole, 0);
                free(local);
                free(mine);
            }
            cr_assert_eq(count_differences(whole, one.params, P), 0,
                         "T=%d: the shards put together differ from one process", T);
            stage_free(&one);
            shards_free(&h);
            free(whole);
        }
        net_desc_free(&net);
    }
}

typedef struct {
    int *held;
} hold_ctx;

static void hold_run(void *ctx, size_t whole, size_t local, size_t count)
{
    hold_ctx *c = ctx;
    for (size_t i = 0; i < count; i++) c->held[whole + i]++;
}

static void count_local(void *ctx, size_t whole, size_t local, size_t count)
{
    size_t *end = ctx;
    cr_assert_eq(local, *end, "runs are not in local order: %zu after %zu", local, *end);
    *end = local + count;
}

Test(tensor_gpt, block_runs_cover_the_block)
{
    net_desc net;
    parse(&net, 0);
    const layer_desc *B = &net.layers[1];
    size_t C = 16, H = 24, W = B->weight_count, all = W + B->bias_count;
    for (int T = 2; T <= 4; T += 2) {
        shard_plan sp;
        cr_assert_eq(shard_plan_init(&sp, &net, T, TENSOR_GATHER), 0);
        cr_assert_eq(sp.layers[1].split, SHARD_HEADS);
        cr_assert_eq(sp.layers[0].split, SHARD_VOCAB);
        cr_assert_eq(sp.layers[4].split, SHARD_NONE);
        cr_assert_eq(sp.layers[5].split, SHARD_OUT);
        cr_assert(sp.loss_sharded);
        int *held = calloc(all, sizeof *held);
        for (int t = 0; t < T; t++) {
            hold_ctx c = {held};
            shard_layer_runs(&sp, &net, 1, t, hold_run, &c);
            size_t end = 0;
            shard_layer_runs(&sp, &net, 1, t, count_local, &end);
            layer_desc D = shard_local_layer(&sp, &net, 1, t);
            cr_assert_eq(end, D.weight_count + D.bias_count);
            cr_assert_eq(D.u.block.heads, 4 / T);
            cr_assert_eq(D.u.block.hidden, 24 / T);
            cr_assert_eq(layer_block_shards(&D), T);
        }
        /* matrices, c_attn's and c_fc's biases: one rank; ln_1, ln_2, the c_proj biases:
         * every rank */
        for (size_t i = 0; i < all; i++) {
            size_t v = i - W;
            int replicated = i >= W && (v < 2 * C || (v >= 5 * C && v < 8 * C) ||
                                        v >= 8 * C + H);
            cr_assert_eq(held[i], replicated ? T : 1, "T=%d: parameter %zu held by %d ranks",
                         T, i, held[i]);
        }
        free(held);
        /* blocks: 2 all-reduces of 6·C floats each way; the embedding's output; the head's
         * input gradient; the loss's two all-gathers of 2 and 3 floats a position */
        shard_traffic tr = shard_stage_traffic(&sp, &net, 0, net.n_layers, 1);
        cr_assert_eq(tr.fwd_reduces, 5);
        cr_assert_eq(tr.bwd_reduces, 5);
        cr_assert_eq(tr.fwd_reduce, 5 * 6 * C);
        cr_assert_eq(tr.bwd_reduce, 5 * 6 * C);
        cr_assert_eq(tr.fwd_gathers, 2);
        cr_assert_eq(tr.fwd_gather, 5 * 6 * (size_t)T);
        cr_assert_eq(tr.bwd_gathers, 0);
        shard_plan_free(&sp);
    }
    net_desc_free(&net);
}

Test(tensor_gpt, heads_hidden_or_vocabulary_that_do_not_cut_are_refused)
{
    net_desc net;
    cr_assert_eq(net_desc_parse_string(&net,
                                       "[net]\n[embedding]\nvocab=13\ncontext=6\nwidth=12\n"
                                       "[block]\nheads=2\n[block]\nheads=3\n[layernorm]\n"
                                       "[lm_head]\n",
                                       "three.cfg"),
                 0, "%s", pt_error_get());
    shard_plan sp;
    cr_assert_eq(shard_plan_init(&sp, &net, 2, TENSOR_MEGATRON), -1);
    cr_assert(strstr(pt_error_get(), "layer 3 (block, line 8) has 3 heads and hidden 48: it "
                                     "cannot be cut into 2 tensor shards"),
              "%s", pt_error_get());
    cr_assert_eq(shard_plan_init(&sp, &net, 1, TENSOR_MEGATRON), 0);
    shard_plan_free(&sp);
    net_desc_free(&net);
    cr_assert_eq(net_desc_parse_string(&net,
                                       "[net]\n[embedding]\nvocab=13\ncontext=6\nwidth=12\n"
                                       "[block]\nheads=2\nhidden=30\n[layernorm]\n[lm_head]\n",
                                       "hidden.cfg"),
                 0, "%s", pt_error_get());
    cr_assert_eq(shard_plan_init(&sp, &net, 4, TENSOR_MEGATRON), -1);
    cr_assert(strstr(pt_error_get(), "layer 2 (block, line 6) has 2 heads and hidden 30"), "%s",
              pt_error_get());
    net_desc_free(&net);
    /* 3 tokens do not cut 4 ways */
    cr_assert_eq(net_desc_parse_string(&net,
                                       "[net]\n[embedding]\nvocab=3\ncontext=6\nwidth=8\n"
                                       "[block]\nheads=4\n[lm_head]\n",
                                       "vocab.cfg"),
                 0, "%s", pt_error_get());
    cr_assert_eq(shard_plan_init(&sp, &net, 4, TENSOR_MEGATRON), -1);
    cr_assert(strstr(pt_error_get(), "layer 1 (embedding, line 2) has 3 tokens: it cannot be "
                                     "cut into 4 tensor shards"),
              "%s", pt_error_get());
    net_desc_free(&net);
}

static void add_run(void *ctx, size_t local, size_t count)
{
    size_t *c = ctx;
    c[0] += count;
    if (!c[1]) c[1] = local + 1; /* the first run's start + 1 */
}

/* Sequence parallelism's plan: the vectors between layers cut by positions (not the token
 * ids nor the logits), the embedding reduce-scatters, the lm_head gathers its input, the
 * blocks run in five phases on their positions, a stage sends its slice, and the layer
 * norms' parameters are the runs the group sums. */
Test(tensor_gpt, sequence_parallel_plan)
{
    net_desc net;
    parse(&net, 0); /* context 6: embedding, block, dropout, block, layernorm, lm_head */
    shard_plan sp;
    cr_assert_eq(shard_plan_init(&sp, &net, 2, TENSOR_SEQUENCE), 0, "%s", pt_error_get());
    cr_assert(shard_sequence(&sp));
    size_t C = 16, T = 6;
    cr_assert(!sp.layers[0].in.sharded && sp.layers[0].out.sharded);
    cr_assert(shard_reduce_scatters(&sp, 0));
    cr_assert(!shard_reduce_scatters(&sp, 1));
    for (int l = 1; l < 5; l++) cr_assert(sp.layers[l].in.sharded && sp.layers[l].out.sharded);
    cr_assert(sp.layers[5].gather_in && !sp.layers[5].in.sharded && sp.loss_sharded);
    for (int t = 0; t < 2; t++) {
        layer_desc E = shard_local_layer(&sp, &net, 0, t), B = shard_local_layer(&sp, &net, 1, t);
        cr_assert_eq(layer_shape_count(E.out), T * C); /* its partial sums are whole rows */
        cr_assert_eq(B.in.c, 3);
        cr_assert_eq(layer_block_seq(&B), 2);
        cr_assert_eq(layer_phases(&B), LAYER_BLOCK_SEQ_PHASES);
        cr_assert_eq(shard_stage_in_count(&sp, &net, 0, t), T); /* the token ids */
        cr_assert_eq(shard_stage_in_count(&sp, &net, 1, t), T / 2 * C);
        cr_assert_eq(shard_stage_out_count(&sp, &net, 5, t), T / 2 * C);
        cr_assert_eq(shard_stage_out_count(&sp, &net, 6, t), T * 13); /* the logits */
        cr_assert_eq(shard_slot_input(&sp, &net, 5, 5, t), T * C); /* gathered, first too */
        cr_assert_eq(shard_slot_input(&sp, &net, 1, 1, t), 0);     /* its slice, as is */
        /* ln_1 and ln_2 of a block (2C each, ln_1 first after the matrices), all of ln_f */
        size_t c[2] = {0, 0};
        shard_seq_partial_runs(&sp, &net, 1, t, add_run, c);
        cr_assert_eq(c[0], 4 * C);
        cr_assert_eq(c[1] - 1, B.weight_count);
        size_t f[2] = {0, 0};
        shard_seq_partial_runs(&sp, &net, 4, t, add_run, f);
        cr_assert_eq(f[0], 2 * C);
        size_t none[2] = {0, 0};
        shard_seq_partial_runs(&sp, &net, 0, t, add_run, none);
        shard_seq_partial_runs(&sp, &net, 5, t, add_run, none);
        cr_assert_eq(none[0], 0);
    }
    cr_assert(!shard_output_gathered(&sp, 2)); /* a stage sends its slice */
    shard_plan_free(&sp);
    /* without sequence parallelism: whole vectors, no runs */
    cr_assert_eq(shard_plan_init(&sp, &net, 2, TENSOR_MEGATRON), 0);
    cr_assert_eq(shard_stage_in_count(&sp, &net, 1, 0), T * C);
    size_t c[2] = {0, 0};
    shard_seq_partial_runs(&sp, &net, 1, 0, add_run, c);
    cr_assert_eq(c[0], 0);
    shard_plan_free(&sp);
    /* refusals: T = 1, a context of 6 over 4 ranks, a net without a sequence */
    cr_assert_eq(shard_plan_init(&sp, &net, 1, TENSOR_SEQUENCE), -1);
    cr_assert(strstr(pt_error_get(), "needs --tensor 2 or more"), "%s", pt_error_get());
    cr_assert_eq(shard_plan_init(&sp, &net, 4, TENSOR_SEQUENCE), -1);
    cr_assert(strstr(pt_error_get(), "the context of 6 positions is not a multiple of --tensor 4"),
              "%s", pt_error_get());
    net_desc_free(&net);
    cr_assert_eq(net_desc_parse_string(&net, "[net]\ninput=8,1,1\n[dense]\nunits=4\n", "mlp.cfg"), 0,
                 "%s", pt_error_get());
    cr_assert_eq(shard_plan_init(&sp, &net, 2, TENSOR_SEQUENCE), -1);
    cr_assert(strstr(pt_error_get(), "is for language models"), "%s", pt_error_get());
    net_desc_free(&net);
}
