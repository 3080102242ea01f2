/* Drives the CUDA engine (over the mock runtime) the way src/exec.c does, and compares it
 * bit for bit with the CPU engine. Micro-batches are small (8) so that the CPU stage runs
 * each micro-batch as one chunk: the same kernel calls, hence the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/cuda/engine_cuda.h"
#include "src/engine.h"
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

enum { MB = 8, M = 4, STEPS = 3, MAXP = 20000 };

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
    dataset d = {count, side, side, malloc((size_t)count * side * side),
                 malloc((size_t)count * sizeof(int32_t))};
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

static const optimizer_config adam = {OPT_ADAM, 1e-2f, 0.9f, 0.0f, 0.9f, 0.999f, 1e-8f};

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

/* Data-parallel calls (src/engine.h) in run_single: 0 none; 1 the last micro-batch's
 * backward cut at every layer boundary; 2 also each micro-batch's gradient in its own
 * piece (grad_pieces = M), summed in order on the host through grads_host into piece 0,
 * then committed. Either way the parameters must equal the plain run's bit for bit. */
static int dp_mode;

static void backward_dp(engine *e, int m, int tick)
{
    int nl = e->cfg.last - e->cfg.first;
    if (dp_mode == 0 || m != M - 1) {
        MUST(engine_backward(e, m, tick));
        return;
    }
    for (int hi = nl; hi > 0; hi--) MUST(engine_backward_range(e, m, hi - 1, hi, hi == nl ? tick : -1));
}

static void sum_pieces(engine *e)
{
    size_t P = e->param_count;
    float *sum, *piece;
    MUST(engine_grads_host(e, 0, 0, P, &sum));
    for (int k = 1; k < M; k++) {
        MUST(engine_grads_host(e, k, 0, P, &piece));
        for (size_t i = 0; i < P; i++) sum[i] += piece[i];
    }
    MUST(engine_grads_commit(e, 0, P));
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
            backward_dp(e, m, M + m);
            MUST(engine_release(e, m));
        }
        if (dp_mode == 2) sum_pieces(e);
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
                MUST(engine_backward(E[i], m, M + m));
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
    for (int k = 0; k < 2; k++) {
        if (only_net >= 0 && k != only_net) continue;
        net_desc net;
        MUST(net_desc_parse_string(&net, nets[k], "test"));
        dataset tr = make_data(100, sides[k], classes[k], 1 + k);
        /* > LOSS_CAPACITY chunks, the last one partial */
        dataset te = make_data(MB * 1030 + 3, sides[k], classes[k], 9 + k);
        static outcome ref, x;
        engine *e;
        engine_config c = config(&net, 0, net.n_layers, 0, M);
        MUST(engine_create(&e, ENGINE_CPU, &c));
        memset(&ref, 0, sizeof ref);
        run_single(e, &tr, &te, &ref, 0);
        engine_destroy(e);
        printf("net %d: %zu params, losses %.6f %.6f %.6f, eval %.4f / %ld\n", k, ref.P,
               ref.loss[0], ref.loss[1], ref.loss[2], ref.eval_loss, ref.eval_correct);
        for (int mode = 0; mode < 3; mode++) {
            for (unsigned seed = 1; seed <= (mode ? 3u : 1u); seed++) {
                mock_mode = mode;
                mock_seed = seed;
                char what[128];
                snprintf(what, sizeof what, "net %d single mode %d seed %u", k, mode, seed);
                MUST(engine_cuda_create(&e, &c));
                memset(&x, 0, sizeof x);
                run_single(e, &tr, &te, &x, 1);
                engine_destroy(e);
                compare(&ref, &x, what);
                for (int split = 1; split < net.n_layers; split++)
                    for (int dm = 0; dm < 2; dm++) {
                        snprintf(what, sizeof what, "net %d split %d dm %d mode %d seed %u", k,
                                 split, dm, mode, seed);
                        int cuts[] = {0, split, net.n_layers};
                        pipeline_case(&net, cuts, 2, dm, &tr, &te, &ref, what);
                    }
                finish_each_step = 0; /* the same splits, steps not separated by finish */
                for (int split = 1; split < net.n_layers; split++)
                    for (int dm = 0; dm < 2; dm++) {
                        snprintf(what, sizeof what, "net %d split %d dm %d mode %d seed %u "
                                 "no finish", k, split, dm, mode, seed);
                        int cuts[] = {0, split, net.n_layers};
                        pipeline_case(&net, cuts, 2, dm, &tr, &te, &ref, what);
                    }
                finish_each_step = 1;
                if (seed > 1) continue;
                for (int s1 = 1; s1 < net.n_layers; s1++)
                    for (int s2 = s1 + 1; s2 < net.n_layers; s2++)
                        for (int dm = 0; dm < 2; dm++) {
                            snprintf(what, sizeof what, "net %d cuts %d,%d dm %d mode %d", k,
                                     s1, s2, dm, mode);
                            int cuts[] = {0, s1, s2, net.n_layers};
                            pipeline_case(&net, cuts, 3, dm, &tr, &te, &ref, what);
                        }
            }
        }
        /* the data-parallel operations, against the plain CPU run */
        for (dp_mode = 1; dp_mode <= 2; dp_mode++)
            for (int cuda = 0; cuda < 2; cuda++)
                for (int mode = 0; mode < 3; mode++) {
                    if (!cuda && mode) continue;
                    mock_mode = mode;
                    mock_seed = 5;
                    char what[128];
                    snprintf(what, sizeof what, "net %d %s data-parallel %d mode %d", k,
                             cuda ? "cuda" : "cpu", dp_mode, mode);
                    engine_config dc = c;
                    dc.grad_pieces = dp_mode == 2 ? M : 0;
                    if (cuda) MUST(engine_cuda_create(&e, &dc));
                    else MUST(engine_create(&e, ENGINE_CPU, &dc));
                    memset(&x, 0, sizeof x);
                    run_single(e, &tr, &te, &x, cuda);
                    engine_destroy(e);
                    compare(&ref, &x, what);
                }
        dp_mode = 0;
        mock_mode = 2;
        error_paths(&net, &tr);
        data_free(&tr);
        data_free(&te);
        net_desc_free(&net);
    }
    printf("%s (%d failures, %ld mock ops)\n", failures ? "FAILED" : "PASSED", failures,
           mock_ops_run);
    return failures ? 1 : 0;
}
