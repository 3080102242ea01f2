/* `pipetrain train`: sequential or pipelined training on Fashion-MNIST-style IDX data (or a
 * language model on text, src/train/train_text.c). The
 * set-up (options, layout, model, data, executor) is src/train/train_setup.c; this is the
 * training loop, the metrics lines, the figures gathered at the end and the outputs. The
 * banner, progress and reports are in src/train/train_report.c. */
#include "src/train/train.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kernels/rng.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_wait.h"
#include "src/base/options.h"
#include "src/base/output.h"
#include "src/io/checkpoint.h"
#include "src/runtime/exec.h"
#include "src/train/lr_schedule.h"
#include "src/train/metrics.h"
#include "src/train/train_checkpoint.h"
#include "src/train/train_report.h"
#include "src/train/train_setup.h"
#include "src/train/train_text.h"

/* ---- pieces of the run ---- */

static void shuffle_indices(int64_t *idx, int n, uint64_t seed, long epoch, int shuffle)
{
    for (int i = 0; i < n; i++) idx[i] = i;
    if (!shuffle) return;
    /* Fisher–Yates with the counter-based generator: the same order on every rank. */
    uint64_t stream = rng_stream_shuffle((uint64_t)epoch);
    for (int i = n - 1; i > 0; i--) {
        uint32_t r[4];
        rng_philox4x32_10(r, seed, stream, (uint64_t)i);
        uint64_t x = ((uint64_t)r[0] << 32) | r[1];
        int j = (int)(x % (uint64_t)(i + 1));
        int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* ---- per-stage figures at the end of a run ---- */

static void figures_free(stage_figures *f)
{
    free(f->chunk);
    free(f->rank_mem);
    free(f->compute);
    memset(f, 0, sizeof *f);
}

/* Every rank's memory: its engines' parameter, gradient and optimizer bytes (the ZeRO
 * formulas' terms) and its peak resident set, on every rank. */
static int gather_memory(const train_run *run, stage_figures *f)
{
    int n = 0, me = run->rank;
    MPI_Comm_size(run->comm, &n);
    f->ranks = n;
    f->rank_mem = calloc((size_t)n * RANK_MEM_KINDS, sizeof *f->rank_mem);
    if (!f->rank_mem) return pt_error_set("out of memory");
    double mine[RANK_MEM_KINDS] = {0};
    for (int v = 0; v < exec_chunks(run->ex); v++) {
        engine *g = exec_chunk_engine(run->ex, v);
        size_t b[3] = {0};
        if (!g->ops->state_bytes) {
            mine[0] = mine[1] = mine[2] = NAN;
            break;
        }
        g->ops->state_bytes(g, &b[0], &b[1], &b[2]);
        for (int k = 0; k < 3; k++) mine[k] += (double)b[k];
    }
    struct rusage ru;
    mine[RANK_MEM_PEAK] = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss * 1024.0 : NAN;
    for (int k = 0; k < RANK_MEM_KINDS; k++) f->rank_mem[(size_t)k * n + me] = mine[k];
    return mpi_wait_allreduce(f->rank_mem, RANK_MEM_KINDS * n, MPI_DOUBLE, MPI_SUM, run->comm,
                              run->o.timeout);
}

/* Per stage, the mean over its replicas (every replica of a stage does the same work). */
static int gather_figures(const train_run *run, stage_figures *f)
{
    int K = run->o.stages, R = run->o.replicas, me = run->stage;
    memset(f, 0, sizeof *f);
    enum { N_ARRAYS = 15 };
    int copies = R * run->o.tensor; /* ranks per stage: replicas × tensor shards */
    /* the block, then the slowest replica's optimizer time per stage */
    double *block = calloc((N_ARRAYS + 1) * (size_t)K, sizeof *block);
    if (!block) return pt_error_set("out of memory");
    f->stages = K;
    double **arrays[N_ARRAYS] = {&f->compute, &f->wall, &f->forward, &f->backward,
                                 &f->optimizer, &f->peak_bytes, &f->peak_mb, &f->reduce,
                                 &f->reduce_exposed, &f->reduce_bytes, &f->reduce_alpha,
                                 &f->reduce_beta, &f->reduce_bcast, &f->tensor, &f->params};
    for (int k = 0; k < N_ARRAYS; k++) *arrays[k] = block + (size_t)k * K;
    exec_stats st;
    exec_get_stats(run->ex, &st);
    f->steps = st.steps;
    f->rollbacks = st.rollbacks;
    f->compute[me] = st.compute_s;
    f->wall[me] = st.wall_s;
    f->forward[me] = st.forward_s;
    f->backward[me] = st.backward_s;
    f->optimizer[me] = st.optimizer_s;
    f->peak_bytes[me] = (double)st.peak_act_bytes;
    f->peak_mb[me] = st.peak_microbatches;
    f->reduce[me] = st.reduce.reduce_s;
    f->reduce_exposed[me] = st.reduce.exposed_s;
    f->reduce_bytes[me] = (double)st.reduce.bytes;
    f->reduce_alpha[me] = st.reduce_cal.alpha; /* the same on every replica of the stage */
    f->reduce_beta[me] = st.reduce_cal.beta;
    f->reduce_bcast[me] = st.reduce_cal.bcast_s;
    f->tensor[me] = st.tensor_s;
    for (int v = 0; v < exec_chunks(run->ex); v++)
        f->params[me] += (double)exec_chunk_engine(run->ex, v)->param_count;
    if (mpi_wait_allreduce(block, N_ARRAYS * K, MPI_DOUBLE, MPI_SUM, run->comm, run->o.timeout)) {
        figures_free(f);
        return -1;
    }
    for (int i = 0; i < N_ARRAYS * K; i++) block[i] /= copies;
    /* -bcast methods: one replica steps, the others wait for its broadcast: the step on the
     * critical path is the slowest replica's, not the mean */
    f->optimizer_max = block + (size_t)N_ARRAYS * K;
    f->optimizer_max[me] = st.optimizer_s;
    if (mpi_wait_allreduce(f->optimizer_max, K, MPI_DOUBLE, MPI_MAX, run->comm, run->o.timeout)) {
        figures_free(f);
        return -1;
    }
    if (gather_memory(run, f)) {
        figures_free(f);
        return -1;
    }
    for (int r = 0; r < K; r++) f->bubble += f->wall[r] > 0 ? 1 - f->compute[r] / f->wall[r] : 0;
    f->bubble /= K;
    /* per model chunk c (schedule_model_chunk), each kind of op */
    int C = K * st.chunks;
    f->chunks = C;
    f->chunk = calloc((size_t)C * EXEC_TIMES, sizeof *f->chunk);
    if (!f->chunk) {
        figures_free(f);
        return pt_error_set("out of memory");
    }
    for (int v = 0; v < st.chunks; v++)
        for (int t = 0; t < EXEC_TIMES; t++)
            f->chunk[(size_t)t * C + schedule_model_chunk(&run->sched, me, v)] =
                st.chunk_s[v * EXEC_TIMES + t];
    if (mpi_wait_allreduce(f->chunk, C * EXEC_TIMES, MPI_DOUBLE, MPI_SUM, run->comm,
                       run->o.timeout)) {
        figures_free(f);
        return -1;
    }
    for (int i = 0; i < C * EXEC_TIMES; i++) f->chunk[i] /= copies;
    return 0;
}

/* For `pipetrain launch` (src/cli/cmd_launch.c): rank 0 notes the wall-clock time of the run's
 * first completed step in the file PT_LAUNCH_FIRST_STEP names, if any. */
static void note_first_step(const train_run *run)
{
    const char *path = getenv("PT_LAUNCH_FIRST_STEP");
    if (run->rank != 0 || !path || !*path) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    FILE *f = fopen(path, "w");
    if (!f) return; /* a measurement only: the run goes on */
    fprintf(f, "%.6f\n", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    fclose(f);
}

/* ---- the metrics file ---- */

/* Rank 0 writes a line; a failure (a full disk) is reported once and makes the run's exit
 * status non-zero, but does not stop training. */
static void metrics_line(train_run *run, const char *type, json_t *line)
{
    if (run->rank != 0 || !run->metrics || run->metrics_failed) {
        json_decref(line);
        return;
    }
    if (metrics_write(run->metrics, type, line)) {
        fprintf(stderr, "pipetrain: %s; no more metrics lines\n", pt_error_get());
        run->metrics_failed = 1;
    }
}

/* Collective (with --metrics): opens the file on rank 0 and writes the run's line. */
static int metrics_start(train_run *run)
{
    const train_options *o = &run->o;
    if (!o->metrics) return 0;
    int K = o->stages;
    run->metrics_prev = calloc(4 * (size_t)K, sizeof *run->metrics_prev);
    int rc = run->metrics_prev ? 0 : pt_error_set("out of memory");
    if (!rc && run->rank == 0) rc = metrics_open(&run->metrics, o->metrics, train_report_run_json(run));
    run->metrics_t = pt_now();
    /* the first interval of a resumed run starts at its checkpoint's step */
    run->metrics_step = run->resumed_from_step > 0 ? run->resumed_from_step : 0;
    return train_agree(rc, run->comm, o->timeout);
}

static json_t *json_array_of(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* Collective, every --log-every steps: the interval since the last step line. Per stage
 * (mean over its replicas): compute, waiting (bubble and messages: wall − compute −
 * exposed reduction) and the exposed reduction, in seconds over the interval. */
static int metrics_step(train_run *run, long epoch, long step)
{
    int K = run->o.stages, R = run->o.replicas, me = run->stage;
    double *now = calloc(4 * (size_t)K, sizeof *now);
    if (!now) return pt_error_set("out of memory");
    exec_stats st;
    exec_get_stats(run->ex, &st);
    now[me] = st.compute_s;
    now[K + me] = st.wall_s;
    now[2 * K + me] = st.reduce.exposed_s;
    now[3 * K + me] = (double)st.peak_act_bytes;
    if (mpi_wait_allreduce(now, 4 * K, MPI_DOUBLE, MPI_SUM, run->comm, run->o.timeout)) {
        free(now);
        return -1;
    }
    double *d = run->metrics_prev; /* becomes the interval's figures, then now's totals */
    for (int i = 0; i < 3 * K; i++) {
        double v = now[i] / (R * run->o.tensor);
        /* the figures restart after --untimed-steps: then the interval is what came since */
        double delta = v >= d[i] ? v - d[i] : v;
        d[i] = v;
        now[i] = delta;
    }
    for (int s = 0; s < K; s++) {
        double wait = now[K + s] - now[s] - now[2 * K + s];
        now[K + s] = wait > 0 ? wait : 0;
    }
    double t = pt_now(), dt = t - run->metrics_t;
    long samples = run->metrics_samples;
    json_t *line = json_object();
    if (line) {
        json_object_set_new(line, "step", json_integer(step));
        json_object_set_new(line, "epoch", json_integer(epoch + 1));
        json_object_set_new(line, "steps", json_integer(step - run->metrics_step));
        double labels = (double)samples * run->labels_per_sample; /* tokens for text */
        json_object_set_new(line, "loss", json_real(run->metrics_loss / labels));
        json_object_set_new(line, "acc", json_real((double)run->metrics_correct / labels));
        json_object_set_new(line, "samples_per_s", json_real(dt > 0 ? samples / dt : 0));
        /* the interval's last step: its learning rate and its gradient norm before clipping
         * (null without --clip-grad-norm) */
        json_object_set_new(line, "lr", json_real(run->last_lr));
        json_object_set_new(line, "grad_norm", isfinite(run->last_grad_norm)
                                                   ? json_real(run->last_grad_norm)
                                                   : json_null());
        json_object_set_new(line, "stage_compute_s", json_array_of(now, K));
        json_object_set_new(line, "stage_wait_s", json_array_of(now + K, K));
        json_object_set_new(line, "stage_reduce_exposed_s", json_array_of(now + 2 * K, K));
        json_t *peak = json_array();
        for (int k = 0; peak && k < K; k++)
            json_array_append_new(peak, json_integer((json_int_t)(now[3 * K + k] / (R * run->o.tensor) + 0.5)));
        json_object_set_new(line, "stage_peak_act_bytes", peak);
    }
    free(now);
    metrics_line(run, "step", line);
    run->metrics_t = pt_now();
    run->metrics_loss = 0;
    run->metrics_samples = run->metrics_correct = 0;
    run->metrics_step = step;
    return 0;
}

static json_t *json_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static void metrics_epoch(train_run *run, const train_results *res, double epoch_s, long samples)
{
    if (run->rank != 0 || !run->metrics) return;
    json_t *line = json_object();
    if (line) {
        json_object_set_new(line, "epoch", json_integer(res->epochs));
        json_object_set_new(line, "step", json_integer(res->steps));
        json_object_set_new(line, "train_loss", json_or_null(res->train_loss));
        json_object_set_new(line, "train_acc", json_or_null(res->train_acc));
        json_object_set_new(line, "val_loss", json_or_null(res->val_loss));
        json_object_set_new(line, "val_acc", json_or_null(res->val_acc));
        json_object_set_new(line, "test_loss", json_or_null(res->test_loss));
        json_object_set_new(line, "test_acc", json_or_null(res->test_acc));
        json_object_set_new(line, "epoch_s", json_real(epoch_s));
        json_object_set_new(line, "samples_per_s", json_real(epoch_s > 0 ? samples / epoch_s : 0));
    }
    metrics_line(run, "epoch", line);
}

/* ---- training ---- */

/* Validation and test figures, on every rank (evaluation is collective). */
static void evaluate(train_run *run, train_results *res)
{
    if (run->val.count && exec_evaluate(run->ex, &run->val, &res->val_loss, &res->val_acc))
        train_abort_job(run->comm);
    if (run->test.count && exec_evaluate(run->ex, &run->test, &res->test_loss, &res->test_acc))
        train_abort_job(run->comm);
}

/* One epoch: its steps (all, or what is left of the run's), then evaluation. −1 when the
 * run must stop on a failure that every rank knows of (its message printed). */
static int train_epoch(train_run *run, long ep, train_progress *prog, train_results *res)
{
    const train_options *o = &run->o;
    /* a resumed run enters its first epoch where the checkpoint left it */
    long s0 = res->steps - ep * run->steps_per_epoch;
    long left = run->total_steps - res->steps;
    long n = s0 + (left < run->steps_per_epoch - s0 ? left : run->steps_per_epoch - s0);
    /* a language model's windows are drawn per step (train_text_batch) */
    if (!o->text) shuffle_indices(run->order, run->train.count, o->seed, ep, o->shuffle);
    double per = run->labels_per_sample; /* losses are means over labels: tokens for text */
    double loss_sum = 0, t0 = pt_now();
    long correct = 0, samples = 0;
    for (long s = s0; s < n; s++) {
        long step = res->steps;
        /* the untimed steps are this process's first ones (caches, pages), also on resuming */
        if (step - res->first_step == o->untimed_steps) exec_reset_stats(run->ex);
        double ts = pt_now();
        /* the next step's samples, loaded while this one computes (not across epochs: the
         * next order is drawn after evaluation) */
        const int64_t *next = s + 1 < n ? run->order + (s + 1) * o->batch : NULL;
        const int64_t *now = run->order + s * o->batch;
        const dataset *data = &run->train, *next_data = NULL;
        if (o->text) { /* each step its own batch of windows, indexed 0 … batch − 1 */
            data = train_text_batch(run, step);
            next_data = next ? train_text_batch(run, step + 1) : NULL;
            now = run->order;
            next = next ? run->order : NULL;
        }
        /* the step's learning rate: every rank computes it from the step alone */
        optimizer_config opt = o->opt;
        opt.lr = lr_schedule_at(&o->lr_sched, step, run->total_steps);
        exec_step_result r;
        int src = exec_train_step(run->ex, data, now, next_data, next, o->seed, (uint64_t)step,
                                  &opt, &r);
        if (src == EXEC_FAILED_EVERYWHERE) {
            train_progress_clear(prog);
            if (run->rank == 0) fprintf(stderr, "pipetrain: %s\n", pt_error_get());
            return -1;
        }
        if (src) train_abort_job(run->comm);
        double dt = pt_now() - ts;
        if (step - res->first_step >= o->untimed_steps) {
            res->timed_s += dt;
            res->timed_steps++;
        }
        res->steps++;
        if (res->steps == res->first_step + 1)
            note_first_step(run);
        loss_sum += r.loss_sum;
        correct += r.correct;
        samples += o->batch;
        run->last_lr = opt.lr;
        run->last_grad_norm = r.grad_norm;
        int due = train_checkpoint_due(run, res->steps);
        if (due < 0 || (due && train_checkpoint_save(run, res->steps)))
            train_abort_job(run->comm);
        if (o->metrics) {
            run->metrics_loss += r.loss_sum;
            run->metrics_correct += r.correct;
            run->metrics_samples += o->batch;
            if (res->steps % o->log_every == 0 && metrics_step(run, ep, res->steps))
                train_abort_job(run->comm);
        }
        train_progress_step(prog, run, ep + 1, dt, loss_sum / (samples * per));
    }
    double epoch_s = pt_now() - t0;
    res->train_s += epoch_s;
    res->epochs = ep + 1;
    res->train_loss = loss_sum / (samples * per);
    res->train_acc = (double)correct / (samples * per);
    evaluate(run, res);
    train_progress_clear(prog);
    train_report_epoch(run, res, epoch_s, samples, res->steps - (n - s0));
    metrics_epoch(run, res, epoch_s, samples);
    return 0;
}

/* The schedule's warm-up against the run's length, known once the data is (every rank
 * decides the same). */
static int check_lr_schedule(const train_run *run)
{
    const lr_schedule *s = &run->o.lr_sched;
    if (s->warmup > run->total_steps)
        return pt_error_set("--lr-warmup %ld is longer than the run's %ld step%s: the learning "
                            "rate would never reach --lr", s->warmup, run->total_steps,
                            run->total_steps == 1 ? "" : "s");
    return 0;
}

static int train_loop(train_run *run, train_results *res)
{
    *res = (train_results){
        .train_loss = NAN, .train_acc = NAN,
        .val_loss = NAN, .val_acc = NAN, .test_loss = NAN, .test_acc = NAN,
        .t_begin = pt_now(),
    };
    /* a resumed run counts on from its checkpoint's step: progress, reports, metrics */
    long start = run->resumed_from_step > 0 ? run->resumed_from_step : 0;
    res->steps = res->first_step = start;
    train_progress prog;
    train_progress_init(&prog, run, start);
    for (long ep = start / run->steps_per_epoch; ep < run->epochs; ep++)
        if (train_epoch(run, ep, &prog, res)) return -1;
    return 0;
}

/* ---- outputs ---- */

/* Collective: the whole model gathered on rank 0 from replica 0's pipeline (every replica
 * holds the same parameters), and written there. */
static int save_checkpoint(train_run *run)
{
    float *all = NULL;
    if (run->rank == 0) all = malloc(run->net.stored_count * sizeof *all + 1);
    int oom = run->rank == 0 && !all ? pt_error_set("out of memory for the checkpoint") : 0;
    if (train_agree(oom, run->comm, run->o.timeout)) return -1;
    int err = run->replica == 0 ? exec_gather_params(run->ex, all) : exec_zero_params_send(run->ex);
    if (!err && run->rank == 0) err = checkpoint_save(run->o.save, &run->net, all);
    free(all);
    return train_agree(err, run->comm, run->o.timeout);
}

/* Figures, checkpoint, trace and report. Each output is attempted even when another one
 * failed (a trace that cannot be written must not cost the checkpoint); every failure is
 * reported. Returns the exit status. */
static int finish_run(train_run *run, train_results *res)
{
    stage_figures fig;
    if (gather_figures(run, &fig)) train_abort_job(run->comm);
    int failed = 0;
    /* the end of the run is a checkpoint too, to go on from later */
    if (run->o.ckpt_dir && run->last_checkpoint_step != res->steps &&
        train_checkpoint_save(run, res->steps))
        failed++;
    if (train_checkpoint_finish(run)) failed++; /* the last write has landed, or failed */
    if (run->o.save) {
        if (save_checkpoint(run)) failed++;
        else res->saved = run->o.save;
    }
    if (run->o.trace) {
        if (train_agree(exec_write_trace(run->ex, run->o.trace), run->comm, run->o.timeout))
            failed++;
        else res->traced = run->o.trace;
    }
    if (run->rank == 0 && train_report_final(run, res, &fig)) {
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        failed++;
    }
    if (run->metrics) {
        metrics_line(run, "final", train_report_results_json(run, res, &fig));
        if (metrics_close(run->metrics)) {
            fprintf(stderr, "pipetrain: %s\n", pt_error_get());
            failed++;
        }
        run->metrics = NULL;
        if (run->metrics_failed) failed++;
    }
    figures_free(&fig);
    return failed ? 1 : 0;
}

/* For `pipetrain launch`: rank 0 records how the run ended in the file PT_LAUNCH_STATUS
 * names ("completed|failed|input STEP TOTAL", then its last
 * message); launch decides restarts from it. */
static void write_status(const train_run *run, int rc, long step)
{
    const char *path = getenv("PT_LAUNCH_STATUS");
    if (run->rank != 0 || !path || !*path) return;
    const char *state = rc == PT_EXIT_OK ? "completed" : rc == PT_EXIT_USAGE ? "input" : "failed";
    pt_output out;
    if (pt_output_begin(&out, path)) return; /* launch then judges by the exit status */
    /* the second line: this rank's last message, which launch repeats ("" when the fault
     * was found on another rank, which printed it) */
    if (dprintf(out.fd, "%s %ld %ld\n%s\n", state, step, run->total_steps,
                rc == PT_EXIT_OK ? "" : pt_error_get()) < 0)
        pt_output_abort(&out);
    else pt_output_commit(&out);
}

int train_main(int argc, char **argv)
{
    train_run run;
    /* Exit statuses: what is found before training starts (options, ranks, model, data,
     * checkpoints, output paths, the device) is the input's fault: PT_EXIT_USAGE, which
     * `pipetrain launch` never restarts; a failure while training is PT_EXIT_FAIL. */
    int prc = train_setup_start(&run, argc, argv);
    if (prc == 1) return PT_EXIT_OK;
    if (prc) {
        write_status(&run, PT_EXIT_USAGE, 0);
        return PT_EXIT_USAGE;
    }

    int rc = PT_EXIT_USAGE;
    train_results res = {.steps = 0};
    run.last_checkpoint_step = -1;
    run.ckpt_req = MPI_REQUEST_NULL;
    run.ckpt_t_last = pt_now();
    run.last_grad_norm = NAN;
    if (!train_setup_run(&run) && !train_agree(check_lr_schedule(&run), run.comm, run.o.timeout) &&
        !train_checkpoint_setup(&run) && !metrics_start(&run)) {
        train_report_banner(&run);
        rc = PT_EXIT_FAIL;
        if (!train_loop(&run, &res)) rc = finish_run(&run, &res);
        else train_checkpoint_finish(&run); /* a write in progress lands before the exit */
    }
    write_status(&run, rc, rc == PT_EXIT_USAGE ? 0 : res.steps);
    train_run_free(&run);
    return rc;
}
