/* Drives the CUDA engine (over the mock runtime) the way src/runtime/exec.c does, and compares it
 * bit for bit with the CPU engine. Micro-batches are small (8) so that the CPU stage runs
 * each micro-batch as one chunk: the same kernel calls, hence the same bits. The new
 * schedules' operations (split backward, recomputation, batched weight gradients) are
 * tested in tests/cuda/test_engine_cuda_sched.c, #included below. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/cuda/engine_cuda.h"
#include "src/engine/engine.h"
#include "src/runtime/engine_create.h"
#include "src/base/error.h"

extern int mock_mode, mock_no_device;
extern unsigned mock_seed;
extern long mock_ops_run;
extern int mock_fail_next_malloc;
void mock_progress(void);

static int failures;
#define MUST(x)                                                                            \
    do {                                                                                   \
        if ((x) != 0) {                                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, pt_error_get()); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#define EXPECT(c, ...)                                                                     \
    do {                                                                                   \
        if (!(c)) {                                                                        \
            failures++;                                                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                           \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
        }                                                                                  \
    } while (0)

enum { MB = 8, M = 4, STEPS = 3, MAXP = 40000 };

typedef struct {
    float params[MAXP];
    double loss[STEPS];
    long correct[STEPS];
    double eval_loss;
    long eval_correct;
    size_t P;
} outcome;

static dataset make_data(int count, int side, int classes, unsigned seed)
{
    dataset d = {.count = count, .channels = 1, .rows = side, .cols = side,
                 .pixels = malloc((size_t)count * side * side),
                 .labels = malloc((size_t)count * sizeof(int32_t))};
    for (size_t i = 0; i < (size_t)count * side * side; i++) {
        seed = seed * 1664525u + 1013904223u;
        d.pixels[i] = (uint8_t)(seed >> 24);
    }
    for (int i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        d.labels[i] = (int32_t)((seed >> 16) % (unsigned)classes);
    }
    return d;
}

static engine_config config(const net_desc *net, int first, int last, int dm, int slots)
{
    engine_config c = {.net = net, .first = first, .last = last, .buffers = M, .max_batch = MB,
                       .n_slots = slots, .batch = MB * M, .threads = 1, .device = 0,
                       .device_messages = dm, .max_ticks = 3 * M + 1};
    return c;
}

static const optimizer_config adam = {OPTIM_ADAM, 1e-2f, 0.9f, 0.0f, 0.9f, 0.999f, 1e-8f, 0.0f};
static const optimizer_config sgd = {.kind = OPTIM_SGD, .lr = 5e-2f};

/* How backward runs (engine.h: backward_range): 0 engine_backward; 1 one range per local
 * layer; 2 two ranges split in the middle; 3 the top layer, then the others. */
static int range_mode;

static int next_lo(int mode, int nl, int hi)
{
    switch (mode) {
    case 1: return hi - 1;
    case 2: return hi == nl ? nl / 2 : 0;
    default: return hi == nl ? nl - 1 : 0;
    }
}

static void do_backward(engine *e, int m, int tick)
{
    int nl = e->cfg.last - e->cfg.first;
    if (!range_mode) {
        MUST(engine_backward(e, m, tick));
        return;
    }
    for (int hi = nl, lo; hi > 0; hi = lo) {
        lo = next_lo(range_mode, nl, hi);
        MUST(engine_backward_range(e, m, lo, hi, tick));
    }
}

static void check_ticks(engine *e, int used_forward_backward)
{
    for (int t = 0; t < e->cfg.max_ticks; t++) {
        int used = t < used_forward_backward;
        if (used)
            EXPECT(e->tick_t1[t] >= e->tick_t0[t] && e->tick_t0[t] > 0,
                   "tick %d used but t0 %g t1 %g", t, e->tick_t0[t], e->tick_t1[t]);
        else
            EXPECT(e->tick_t1[t] < e->tick_t0[t], "tick %d unused but t0 %g t1 %g", t,
                   e->tick_t0[t], e->tick_t1[t]);
    }
}

/* One stage: the executor's calls for GPipe, then evaluation. */
static void run_single(engine *e, const dataset *tr, const dataset *te, outcome *o, int cuda)
{
    int64_t ids[MB * M];
    MUST(engine_init_params(e, 42));
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < MB * M; i++) ids[i] = (s * 37 + i * 11) % tr->count;
        for (int m = 0; m < M; m++) MUST(engine_load(e, m, tr, ids + m * MB, MB));
        for (int m = 0; m < M; m++) MUST(engine_forward(e, m, MB, 7, (uint64_t)s, 1, m));
        for (int m = 0; m < M; m++) {
            do_backward(e, m, M + m);
            MUST(engine_release(e, m));
        }
        MUST(engine_step(e, &adam, 2 * M));
        engine_result r;
        MUST(engine_finish(e, &r));
        o->loss[s] = r.loss_sum;
        o->correct[s] = r.correct;
        if (cuda) check_ticks(e, 2 * M + 1);
    }
    int chunks = (te->count + MB - 1) / MB;
    for (int c = 0; c < chunks; c++) {
        int n = c == chunks - 1 ? te->count - c * MB : MB, m = c & 1;
        for (int j = 0; j < n; j++) ids[j] = (int64_t)c * MB + j;
        MUST(engine_load(e, m, te, ids, n));
        MUST(engine_forward(e, m, n, 0, 0, 0, -1));
        MUST(engine_release(e, m));
    }
    engine_result r;
    MUST(engine_finish(e, &r));
    if (cuda) check_ticks(e, 0);
    o->eval_loss = r.loss_sum;
    o->eval_correct = r.correct;
    o->P = e->param_count;
    MUST(engine_read_params(e, o->params));
}

/* "MPI": waits until the sender's buffer is ready, then copies into the receive buffer
 * that was handed out when the receive was posted. */
static void deliver(engine *src, engine_msg k, int m, void *dst, size_t floats)
{
    int ready = 0;
    for (long spins = 0; !ready; spins++) {
        MUST(engine_msg_ready(src, k, m, &ready));
        if (!ready) mock_progress();
        if (spins > 10000000) {
            fprintf(stderr, "message never ready\n");
            exit(1);
        }
    }
    memcpy(dst, engine_msg_buffer(src, k, m), floats * sizeof(float));
}

enum { SMAX = 4 };
static void compare(const outcome *ref, const outcome *x, const char *what);

/* S stages as S ranks would run them: GPipe, each stage running all its forwards before
 * the next; evaluation with stage i one chunk behind stage i − 1 (exec_evaluate). */
static int finish_each_step = 1;
static void run_pipeline(engine **E, int S, const dataset *tr, const dataset *te, outcome *o)
{
    int64_t ids[MB * M];
    void *act_in[SMAX][M], *grad_in[SMAX][M];
    for (int i = 0; i < S; i++) MUST(engine_init_params(E[i], 42));
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < MB * M; i++) ids[i] = (s * 37 + i * 11) % tr->count;
        for (int i = 0; i < S; i++) /* receives posted up front */
            for (int m = 0; m < M; m++) {
                if (i > 0 && !(act_in[i][m] = engine_msg_buffer(E[i], ENGINE_MSG_ACT_IN, m)))
                    MUST(-1);
                if (i < S - 1 &&
                    !(grad_in[i][m] = engine_msg_buffer(E[i], ENGINE_MSG_GRAD_IN, m)))
                    MUST(-1);
            }
        for (int i = 0; i < S; i++)
            for (int m = 0; m < M; m++) MUST(engine_load(E[i], m, tr, ids + m * MB, MB));
        for (int i = 0; i < S; i++)
            for (int m = 0; m < M; m++) {
                if (i > 0) {
                    deliver(E[i - 1], ENGINE_MSG_ACT_OUT, m, act_in[i][m], MB * E[i]->in_count);
                    MUST(engine_msg_received(E[i], ENGINE_MSG_ACT_IN, m));
                }
                MUST(engine_forward(E[i], m, MB, 7, (uint64_t)s, 1, m));
                if (i < S - 1) MUST(engine_msg_prepare(E[i], ENGINE_MSG_ACT_OUT, m));
            }
        for (int i = S - 1; i >= 0; i--)
            for (int m = 0; m < M; m++) {
                if (i < S - 1) {
                    deliver(E[i + 1], ENGINE_MSG_GRAD_OUT, m, grad_in[i][m],
                            MB * E[i]->out_count);
                    MUST(engine_msg_received(E[i], ENGINE_MSG_GRAD_IN, m));
                }
                do_backward(E[i], m, M + m);
                if (i > 0) MUST(engine_msg_prepare(E[i], ENGINE_MSG_GRAD_OUT, m));
                MUST(engine_release(E[i], m));
            }
        for (int i = 0; i < S; i++) MUST(engine_step(E[i], &adam, 2 * M));
        if (!finish_each_step && s < STEPS - 1) continue; /* legal: finish is only needed to read */
        for (int i = 0; i < S; i++) {
            engine_result r;
            MUST(engine_finish(E[i], &r));
            if (i < S - 1) EXPECT(r.loss_sum == 0 && r.correct == 0, "stage %d has a loss", i);
            o->loss[s] = r.loss_sum;
            o->correct[s] = r.correct;
            check_ticks(E[i], 2 * M + 1);
        }
    }
    int chunks = (te->count + MB - 1) / MB;
    void *posted[SMAX][2];
    for (int i = 1; i < S; i++)
        if (!(posted[i][0] = engine_msg_buffer(E[i], ENGINE_MSG_ACT_IN, 0))) MUST(-1);
    int64_t cids[MB];
    for (int t = 0; t <= chunks + S - 1; t++) {
        for (int i = 0; i < S; i++) {
            int c = t - i;
            if (c < 0 || c > chunks) continue;
            int m = c & 1;
            if (i < S - 1 && c > 0) { /* the send of c − 1 completes */
                int pn = (c - 1) == chunks - 1 ? te->count - (c - 1) * MB : MB;
                deliver(E[i], ENGINE_MSG_ACT_OUT, 1 - m, posted[i + 1][1 - m],
                        (size_t)pn * E[i]->out_count);
                MUST(engine_release(E[i], 1 - m));
            }
            if (c == chunks) continue;
            int n = c == chunks - 1 ? te->count - c * MB : MB;
            for (int j = 0; j < n; j++) cids[j] = (int64_t)c * MB + j;
            MUST(engine_load(E[i], m, te, cids, n));
            if (i > 0) {
                MUST(engine_msg_received(E[i], ENGINE_MSG_ACT_IN, m));
                if (c + 1 < chunks &&
                    !(posted[i][1 - m] = engine_msg_buffer(E[i], ENGINE_MSG_ACT_IN, 1 - m)))
                    MUST(-1);
            }
            MUST(engine_forward(E[i], m, n, 0, 0, 0, -1));
            if (i < S - 1) MUST(engine_msg_prepare(E[i], ENGINE_MSG_ACT_OUT, m));
            else MUST(engine_release(E[i], m));
        }
    }
    o->P = 0;
    for (int i = 0; i < S; i++) {
        engine_result r;
        MUST(engine_finish(E[i], &r));
        o->eval_loss = r.loss_sum;
        o->eval_correct = r.correct;
        MUST(engine_read_params(E[i], o->params + o->P));
        o->P += E[i]->param_count;
    }
}

static void pipeline_case(const net_desc *net, const int *cuts, int S, int dm, const dataset *tr,
                          const dataset *te, const outcome *ref, const char *what)
{
    static outcome x;
    engine *E[SMAX];
    for (int i = 0; i < S; i++) {
        engine_config c = config(net, cuts[i], cuts[i + 1], dm, M);
        MUST(engine_cuda_create(&E[i], &c));
    }
    memset(&x, 0, sizeof x);
    run_pipeline(E, S, tr, te, &x);
    for (int i = 0; i < S; i++) engine_destroy(E[i]);
    compare(ref, &x, what);
}

static void compare(const outcome *ref, const outcome *x, const char *what)
{
    EXPECT(ref->P == x->P, "%s: %zu vs %zu params", what, ref->P, x->P);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ref->P; i++)
        if (memcmp(&ref->params[i], &x->params[i], sizeof(float))) {
            if (!bad) first = i;
            bad++;
        }
    EXPECT(!bad, "%s: %zu of %zu parameters differ, first %zu: %.9g vs %.9g", what, bad,
           ref->P, first, ref->params[first], x->params[first]);
    for (int s = finish_each_step ? 0 : STEPS; s < STEPS; s++)
        EXPECT(ref->loss[s] == x->loss[s] && ref->correct[s] == x->correct[s],
               "%s: step %d loss %.17g/%ld vs %.17g/%ld", what, s, ref->loss[s],
               ref->correct[s], x->loss[s], x->correct[s]);
    EXPECT(ref->eval_loss == x->eval_loss && ref->eval_correct == x->eval_correct,
           "%s: eval %.17g/%ld vs %.17g/%ld", what, ref->eval_loss, ref->eval_correct,
           x->eval_loss, x->eval_correct);
}

static void error_paths(const net_desc *net, const dataset *tr)
{
    engine *e;
    engine_config c = config(net, 0, net->n_layers, 0, 1);
    MUST(engine_cuda_create(&e, &c));
    int64_t ids[MB] = {0, 1, 2, 3, 4, 5, 6, 7};
    EXPECT(engine_forward(e, 0, MB, 0, 0, 1, -1) != 0, "forward before load");
    MUST(engine_load(e, 0, tr, ids, MB));
    MUST(engine_load(e, 1, tr, ids, MB));
    EXPECT(engine_backward(e, 0, -1) != 0, "backward before forward");
    EXPECT(engine_release(e, 0) != 0, "release before forward");
    MUST(engine_forward(e, 0, MB, 0, 0, 1, -1));
    EXPECT(engine_forward(e, 0, MB, 0, 0, 1, -1) != 0, "double forward");
    EXPECT(engine_forward(e, 1, MB, 0, 0, 1, -1) != 0, "no free slot");
    EXPECT(strstr(pt_error_get(), "slots are in use") != NULL, "message: %s", pt_error_get());
    EXPECT(engine_forward(e, M, MB, 0, 0, 1, -1) != 0, "m out of range");
    EXPECT(engine_msg_buffer(e, ENGINE_MSG_ACT_IN, 0) == NULL, "ACT_IN on stage 0");
    EXPECT(engine_msg_buffer(e, ENGINE_MSG_GRAD_IN, 0) == NULL, "GRAD_IN on last stage");
    int ready;
    EXPECT(engine_msg_ready(e, ENGINE_MSG_ACT_OUT, 0, &ready) != 0, "ready before prepare");
    EXPECT(engine_msg_prepare(e, ENGINE_MSG_ACT_IN, 0) != 0, "prepare of incoming");
    EXPECT(engine_forward(e, 1, MB + 1, 0, 0, 1, -1) != 0, "n > max_batch");
    MUST(engine_backward(e, 0, c.max_ticks - 1));
    EXPECT(engine_step(e, &adam, c.max_ticks) != 0, "tick out of range");
    MUST(engine_release(e, 0));
    MUST(engine_forward(e, 1, MB, 0, 0, 0, -1));
    EXPECT(engine_backward(e, 1, -1) != 0, "backward after evaluation forward");
    int64_t bad[1] = {tr->count};
    EXPECT(engine_load(e, 0, tr, bad, 1) != 0, "id out of range");
    engine_result r;
    MUST(engine_finish(e, &r));
    engine_destroy(e);

    /* creation failures clean up and say why */
    mock_no_device = 1;
    EXPECT(engine_cuda_create(&e, &c) != 0 && e == NULL, "no device");
    EXPECT(strstr(pt_error_get(), "no CUDA device") != NULL, "message: %s", pt_error_get());
    mock_no_device = 0;
    mock_fail_next_malloc = 1;
    EXPECT(engine_cuda_create(&e, &c) != 0 && e == NULL, "out of device memory");
    EXPECT(strstr(pt_error_get(), "bytes") != NULL, "message: %s", pt_error_get());
    fprintf(stderr, "  (out-of-memory message: %s)\n", pt_error_get());
}

/* The step and the micro-batch's end, as the runtime ends a step. */
static void step_finish(engine *e, const optimizer_config *opt)
{
    MUST(engine_step(e, opt, 2 * M));
    engine_result r;
    MUST(engine_finish(e, &r));
}

/* Both engines' parameters read into params[k]: the same bits. */
static void same_params(engine *E[2], float params[2][MAXP], size_t P, const char *what)
{
    for (int k = 0; k < 2; k++) MUST(engine_read_params(E[k], params[k]));
    size_t bad = 0;
    for (size_t i = 0; i < P; i++) bad += memcmp(&params[0][i], &params[1][i], sizeof(float)) != 0;
    EXPECT(!bad, "%s: %zu of %zu parameters differ", what, bad, P);
}

/* The CPU engine and the CUDA engine in lockstep on one stage holding the whole net, as a
 * data-parallel executor drives them: backward by ranges, each range's gradients read
 * through grads_host as soon as it is done (they must already be the final bits), then
 * a host-side "reduction" written back through grads_commit before the step.
 *   pieces ≤ 1: gradients accumulate; the middle third is doubled on the host and
 *               committed (step 0), everything is zeroed by zero_grads (step 1), or the
 *               whole is read, halved and committed (step 2);
 *   pieces > 1: micro-batch m's gradient is read from piece m mod P right after its
 *               backward and summed on the host in micro-batch order; the sum goes to
 *               piece 0's host view and is committed whole. */
static void lockstep_case(const net_desc *net, const dataset *tr, int pieces, const char *what)
{
    engine *E[2];
    engine_config c = config(net, 0, net->n_layers, 0, M);
    c.grad_pieces = pieces;
    MUST(engine_create(&E[0], ENGINE_CPU, &c));
    MUST(engine_cuda_create(&E[1], &c));
    size_t P = E[0]->param_count, off[64];
    int nl = net->n_layers;
    off[0] = 0;
    for (int l = 0; l < nl; l++)
        off[l + 1] = off[l] + net->layers[l].weight_count + net->layers[l].bias_count;
    static float sum[2][MAXP], params[2][MAXP];
    int64_t ids[MB * M];
    for (int k = 0; k < 2; k++) MUST(engine_init_params(E[k], 42));
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < MB * M; i++) ids[i] = (s * 41 + i * 13) % tr->count;
        for (int k = 0; k < 2; k++)
            for (int m = 0; m < M; m++) {
                MUST(engine_load(E[k], m, tr, ids + m * MB, MB));
                MUST(engine_forward(E[k], m, MB, 7, (uint64_t)s, 1, m));
            }
        for (int m = 0; m < M; m++) {
            int piece = pieces > 1 ? m % pieces : 0;
            for (int hi = nl, lo; hi > 0; hi = lo) {
                lo = range_mode ? next_lo(range_mode, nl, hi) : 0;
                float *h[2];
                for (int k = 0; k < 2; k++) {
                    MUST(engine_backward_range(E[k], m, lo, hi, M + m));
                    MUST(engine_grads_host(E[k], piece, off[lo], off[hi] - off[lo], &h[k]));
                }
                EXPECT(!memcmp(h[0], h[1], (off[hi] - off[lo]) * sizeof(float)),
                       "%s: step %d micro-batch %d layers [%d, %d): gradients differ", what, s,
                       m, lo, hi);
            }
            for (int k = 0; k < 2; k++) {
                MUST(engine_release(E[k], m));
                if (pieces <= 1) continue;
                float *h;
                MUST(engine_grads_host(E[k], piece, 0, P, &h));
                for (size_t i = 0; i < P; i++) sum[k][i] = m ? sum[k][i] + h[i] : h[i];
            }
        }
        for (int k = 0; k < 2; k++) {
            float *h;
            if (pieces > 1) {
                MUST(engine_grads_host(E[k], 0, 0, P, &h));
                memcpy(h, sum[k], P * sizeof(float));
                MUST(engine_grads_commit(E[k], 0, P));
            } else if (s == 0) {
                size_t a = P / 3, n = P / 3;
                MUST(engine_grads_host(E[k], 0, a, n, &h));
                for (size_t i = 0; i < n; i++) h[i] *= 2;
                MUST(engine_grads_commit(E[k], a, n));
            } else if (s == 1) {
                MUST(engine_zero_grads(E[k]));
                MUST(engine_grads_host(E[k], 0, 0, P, &h));
                for (size_t i = 0; i < P; i++) EXPECT(h[i] == 0, "%s: zeroed gradient", what);
            } else {
                MUST(engine_grads_host(E[k], 0, 0, P, &h));
                for (size_t i = 0; i < P; i++) h[i] *= 0.5f;
                MUST(engine_grads_commit(E[k], 0, P));
            }
            step_finish(E[k], &sgd);
        }
    }
    same_params(E, params, P, what);
    /* the comparison can fail: the first step's commit changed the parameters */
    static float fresh[MAXP];
    MUST(engine_init_params(E[0], 42));
    MUST(engine_read_params(E[0], fresh));
    EXPECT(memcmp(fresh, params[0], P * sizeof(float)) != 0, "%s: no step changed anything",
           what);
    for (int k = 0; k < 2; k++) engine_destroy(E[k]);
}

/* ZeRO-2 (engine grads_shard, grads_release, grads_fill) in lockstep with the CPU engine, as
 * the runtime drives it with one replica whose shard is the middle half of the stage: each
 * step the pieces' gradients are summed into piece 0's host view, everything outside the
 * shard is given back (every piece past the first whole), the shard committed, the shard
 * stepped (optim_shard). The CUDA engine maps its gradients per granule (the mock's: 4 KiB,
 * memory that faults once unmapped): the parameters must stay the CPU's bits, what was
 * given back must read as zero, and the gradients' peak must stay below the whole arrays. */
static void zero2_case(const net_desc *net, const dataset *tr, int pieces, const char *what)
{
    engine *E[2];
    engine_config c = config(net, 0, net->n_layers, 0, M);
    c.grad_pieces = pieces;
    MUST(engine_create(&E[0], ENGINE_CPU, &c));
    MUST(engine_cuda_create(&E[1], &c));
    size_t P = E[0]->param_count;
    engine_run run = {P / 4, P / 2};
    int np = pieces > 1 ? pieces : 1, nl = net->n_layers;
    static float sum[MAXP], params[2][MAXP];
    int64_t ids[MB * M];
    for (int k = 0; k < 2; k++) {
        MUST(engine_init_params(E[k], 42));
        MUST(E[k]->ops->optim_shard(E[k], &run, 1));
        MUST(E[k]->ops->grads_shard(E[k]));
    }
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < MB * M; i++) ids[i] = (s * 29 + i * 7) % tr->count;
        for (int k = 0; k < 2; k++) {
            for (int m = 0; m < M; m++) {
                MUST(engine_load(E[k], m, tr, ids + m * MB, MB));
                MUST(engine_forward(E[k], m, MB, 7, (uint64_t)s, 1, m));
            }
            for (int m = 0; m < M; m++) {
                /* the runtime's fill ahead of a part (the backward maps it anyway) */
                if (s > 0 && m == M - 1)
                    MUST(E[k]->ops->grads_fill(E[k], m % np, 0, P / 8));
                MUST(engine_backward(E[k], m, M + m));
                MUST(engine_release(E[k], m));
            }
            float *h;
            for (int p = 0; p < np; p++) {
                MUST(engine_grads_host(E[k], p, 0, P, &h));
                for (size_t i = 0; i < P; i++) sum[i] = p ? sum[i] + h[i] : h[i];
            }
            for (int p = np - 1; p >= 0; p--) {
                MUST(engine_grads_host(E[k], p, 0, P, &h));
                if (!p) memcpy(h, sum, P * sizeof(float));
                if (p) MUST(E[k]->ops->grads_release(E[k], p, 0, P));
            }
            MUST(E[k]->ops->grads_release(E[k], 0, 0, run.off));
            MUST(E[k]->ops->grads_release(E[k], 0, run.off + run.count,
                                          P - run.off - run.count));
            MUST(engine_grads_commit(E[k], 0, P));
            /* the CUDA engine's released floats read as zero (the CPU's partial pages at
             * the shard's ends keep their values: only whole pages go back) */
            MUST(engine_grads_host(E[k], 0, 0, P, &h));
            size_t nz = 0;
            for (size_t i = 0; k == 1 && i < P; i++)
                nz += (i < run.off || i >= run.off + run.count) && h[i] != 0;
            EXPECT(!nz, "%s: step %d: %zu gradients given back do not read as zero", what, s,
                   nz);
            step_finish(E[k], &adam);
        }
    }
    same_params(E, params, P, what);
    size_t pb, gb, ob, whole = (size_t)(1 + np) * ((P * sizeof(float) + 63) / 64 * 64);
    E[1]->ops->state_bytes(E[1], &pb, &gb, &ob);
    /* these nets' gradients fit in one or two of the mock's 4 KiB granules: mapped, not
     * more (tests/zero_cuda_mock.sh measures the drop on seed-cnn) */
    EXPECT(gb > 0 && gb <= (whole + 4095) / 4096 * 4096 + 4096,
           "%s: the gradients' peak %zu, whole %zu", what, gb, whole);
    (void)nl;
    for (int k = 0; k < 2; k++) engine_destroy(E[k]);
}

static void zero2_cases(const net_desc *net, int k, const dataset *tr)
{
    for (int pieces = 0; pieces <= 2; pieces += 2)
        for (int mode = 0; mode < 3; mode++) {
            mock_mode = mode;
            mock_seed = 11;
            char what[128];
            snprintf(what, sizeof what, "net %d ZeRO-2 pieces %d mode %d", k, pieces, mode);
            zero2_case(net, tr, pieces, what);
        }
}

/* Misuse of the data-parallel operations gets a message, on both engines. */
static void range_errors(const net_desc *net, const dataset *tr)
{
    engine_config c = config(net, 0, net->n_layers, 0, 2);
    c.grad_pieces = 2;
    int nl = net->n_layers;
    int64_t ids[MB] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int k = 0; k < 2; k++) {
        engine *e;
        if (k) MUST(engine_cuda_create(&e, &c));
        else MUST(engine_create(&e, ENGINE_CPU, &c));
        const char *name = e->ops->name;
        float *h;
        for (int m = 0; m < 2; m++) {
            MUST(engine_load(e, m, tr, ids, MB));
            MUST(engine_forward(e, m, MB, 0, 0, 1, -1));
        }
        EXPECT(engine_backward_range(e, 0, 0, 1, -1) != 0, "%s: not from the top", name);
        EXPECT(engine_backward_range(e, 0, 1, nl + 1, -1) != 0, "%s: past the stage", name);
        EXPECT(engine_backward_range(e, 0, 1, 1, -1) != 0, "%s: empty range", name);
        MUST(engine_backward_range(e, 0, 1, nl, -1));
        EXPECT(engine_backward(e, 1, -1) != 0, "%s: other backward in between", name);
        EXPECT(engine_backward_range(e, 1, 0, 1, -1) != 0, "%s: other micro-batch", name);
        EXPECT(engine_step(e, &sgd, -1) != 0, "%s: step in between", name);
        EXPECT(strstr(pt_error_get(), "unfinished") != NULL, "%s: message: %s", name,
               pt_error_get());
        MUST(engine_backward_range(e, 0, 0, 1, -1));
        MUST(engine_backward(e, 1, -1));
        EXPECT(engine_grads_host(e, 2, 0, 1, &h) != 0, "%s: piece out of range", name);
        EXPECT(engine_grads_host(e, -1, 0, 1, &h) != 0, "%s: piece out of range", name);
        EXPECT(engine_grads_host(e, 0, e->param_count, 1, &h) != 0, "%s: past the end", name);
        EXPECT(strstr(pt_error_get(), "outside") != NULL, "%s: message: %s", name,
               pt_error_get());
        EXPECT(engine_grads_commit(e, 1, e->param_count) != 0, "%s: past the end", name);
        MUST(engine_grads_host(e, 1, e->param_count, 0, &h));
        /* zero_grads abandons an unfinished backward by ranges */
        MUST(engine_release(e, 0));
        MUST(engine_forward(e, 0, MB, 0, 0, 1, -1));
        MUST(engine_backward_range(e, 0, nl - 1, nl, -1));
        MUST(engine_zero_grads(e));
        MUST(engine_step(e, &sgd, -1));
        engine_result r;
        MUST(engine_finish(e, &r));
        engine_destroy(e);
    }
}

/* split backward, recomputation, batched weight gradients */
#include "tests/cuda/test_engine_cuda_sched.c"

/* The CUDA engine alone over the whole net, in the current mock mode, against ref. */
static void single_case(const engine_config *c, const dataset *tr, const dataset *te,
                        const outcome *ref, const char *what)
{
    static outcome x;
    engine *e;
    MUST(engine_cuda_create(&e, c));
    memset(&x, 0, sizeof x);
    run_single(e, tr, te, &x, 1);
    engine_destroy(e);
    compare(ref, &x, what);
}

/* Two-stage pipelines cut after every layer, with and without dm; with or without
 * engine_finish between steps (finish_each_step). */
static void two_stage_cases(const net_desc *net, int k, const dataset *tr, const dataset *te,
                            const outcome *ref, int mode, unsigned seed)
{
    char what[128];
    for (int split = 1; split < net->n_layers; split++)
        for (int dm = 0; dm < 2; dm++) {
            snprintf(what, sizeof what, "net %d split %d dm %d mode %d seed %u%s", k, split, dm,
                     mode, seed, finish_each_step ? "" : " no finish");
            int cuts[] = {0, split, net->n_layers};
            pipeline_case(net, cuts, 2, dm, tr, te, ref, what);
        }
}

/* Three-stage pipelines over every pair of cuts. */
static void three_stage_cases(const net_desc *net, int k, const dataset *tr,
                              const dataset *te, const outcome *ref, int mode)
{
    char what[128];
    for (int s1 = 1; s1 < net->n_layers; s1++)
        for (int s2 = s1 + 1; s2 < net->n_layers; s2++)
            for (int dm = 0; dm < 2; dm++) {
                snprintf(what, sizeof what, "net %d cuts %d,%d dm %d mode %d", k, s1, s2, dm,
                         mode);
                int cuts[] = {0, s1, s2, net->n_layers};
                pipeline_case(net, cuts, 3, dm, tr, te, ref, what);
            }
}

/* Single stage and pipelines in every mock mode (and several seeds of the mock's
 * completion order) against the CPU engine's ref. */
static void mode_cases(const net_desc *net, int k, const engine_config *c, const dataset *tr,
                       const dataset *te, const outcome *ref, const dataset *te_small,
                       const outcome *ref_small)
{
    for (int mode = 0; mode < 3; mode++) {
        for (unsigned seed = 1; seed <= (mode ? 3u : 1u); seed++) {
            mock_mode = mode;
            mock_seed = seed;
            char what[128];
            snprintf(what, sizeof what, "net %d single mode %d seed %u", k, mode, seed);
            single_case(c, tr, te, ref, what);
            /* the long evaluation (the loss buffer refilled) once per mode and split */
            const dataset *pte = seed == 1 ? te : te_small;
            const outcome *pref = seed == 1 ? ref : ref_small;
            two_stage_cases(net, k, tr, pte, pref, mode, seed);
            finish_each_step = 0; /* the same splits, steps not separated by finish */
            two_stage_cases(net, k, tr, te_small, ref_small, mode, seed);
            finish_each_step = 1;
            if (seed > 1) continue;
            three_stage_cases(net, k, tr, te_small, ref_small, mode);
        }
    }
}

/* Backward by ranges: single stage in every mock mode, and two-stage pipelines. */
static void range_cases(const net_desc *net, int k, const engine_config *c, const dataset *tr,
                        const dataset *te, const outcome *ref)
{
    for (range_mode = 1; range_mode <= 3; range_mode++) {
        for (int mode = 0; mode < 3; mode++) {
            mock_mode = mode;
            mock_seed = 1;
            char what[128];
            snprintf(what, sizeof what, "net %d ranges %d single mode %d", k, range_mode,
                     mode);
            single_case(c, tr, te, ref, what);
            if (mode != 2) continue;
            for (int split = 1; split < net->n_layers; split++) {
                snprintf(what, sizeof what, "net %d ranges %d split %d mode %d", k,
                         range_mode, split, mode);
                int cuts[] = {0, split, net->n_layers};
                pipeline_case(net, cuts, 2, split & 1, tr, te, ref, what);
            }
        }
    }
}

/* grads_host, grads_commit, zero_grads and pieces against the CPU engine. */
static void lockstep_cases(const net_desc *net, int k, const dataset *tr)
{
    for (range_mode = 0; range_mode <= 2; range_mode++)
        for (int pieces = 0; pieces <= 4; pieces += 2)
            for (int mode = 0; mode < 3; mode++) {
                mock_mode = mode;
                mock_seed = 5;
                char what[128];
                snprintf(what, sizeof what, "net %d lockstep ranges %d pieces %d mode %d",
                         k, range_mode, pieces, mode);
                lockstep_case(net, tr, pieces, what);
            }
    range_mode = 0;
}

/* Every case on net k (its description, input side and classes). */
static void net_cases(int k, const char *text, int side, int classes)
{
    net_desc net;
    MUST(net_desc_parse_string(&net, text, "test"));
    dataset tr = make_data(100, side, classes, 1 + k);
    /* > LOSS_CAPACITY chunks, the last one partial */
    dataset te = make_data(MB * 1030 + 3, side, classes, 9 + k);
    /* most cases evaluate a few chunks only: the long one costs a second a case */
    dataset te_small = make_data(MB * 3 + 3, side, classes, 9 + k);
    static outcome ref, ref_small;
    engine *e;
    engine_config c = config(&net, 0, net.n_layers, 0, M);
    MUST(engine_create(&e, ENGINE_CPU, &c));
    memset(&ref, 0, sizeof ref);
    run_single(e, &tr, &te, &ref, 0);
    engine_destroy(e);
    MUST(engine_create(&e, ENGINE_CPU, &c));
    memset(&ref_small, 0, sizeof ref_small);
    run_single(e, &tr, &te_small, &ref_small, 0);
    engine_destroy(e);
    printf("net %d: %zu params, losses %.6f %.6f %.6f, eval %.4f / %ld\n", k, ref.P,
           ref.loss[0], ref.loss[1], ref.loss[2], ref.eval_loss, ref.eval_correct);
    mode_cases(&net, k, &c, &tr, &te, &ref, &te_small, &ref_small);
    range_cases(&net, k, &c, &tr, &te_small, &ref_small);
    lockstep_cases(&net, k, &tr);
    zero2_cases(&net, k, &tr);
    mock_mode = 2;
    range_errors(&net, &tr);
    error_paths(&net, &tr);
    sched_cases(&net, k, &tr, 1);
    sched_errors(&net, &tr);
    sched_late_readers(&net, k, &tr);
    data_free(&tr);
    data_free(&te);
    data_free(&te_small);
    net_desc_free(&net);
}

int main(int argc, char **argv)
{
    const char *nets[] = {
        "[net]\ninput=1,12,12\n"
        "[conv]\nfilters=4\nsize=3\nstride=1\npad=1\nactivation=relu\n"
        "[maxpool]\nsize=2\n"
        "[conv]\nfilters=6\nsize=3\nstride=1\npad=0\nactivation=tanh\n"
        "[avgpool]\nsize=2\n"
        "[flatten]\n"
        "[dropout]\np=0.3\n"
        "[dense]\nunits=16\nactivation=sigmoid\n"
        "[dropout]\np=0.5\n"
        "[dense]\nunits=5\nactivation=linear\n",
        "[net]\ninput=1,6,6\n"
        "[dropout]\np=0.2\n"
        "[dense]\nunits=12\nactivation=relu\n"
        "[flatten]\n"
        "[dropout]\np=0\n"
        "[dense]\nunits=4\nactivation=linear\n",
    };
    int sides[] = {12, 6}, classes[] = {5, 4};
    int only_net = argc > 1 ? atoi(argv[1]) : -1;
    for (int k = 0; k < 2; k++) /* net 2: sched_wide_net */
        if (only_net < 0 || k == only_net)
            net_cases(k, nets[k], sides[k], classes[k]);
    if (only_net < 0 || only_net == 2) sched_wide_net();
    printf("%s (%d failures, %ld mock ops)\n", failures ? "FAILED" : "PASSED", failures,
           mock_ops_run);
    return failures ? 1 : 0;
}
