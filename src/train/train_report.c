/* What `pipetrain train` prints (src/train/train_report.h): banner, progress, per-stage figures,
 * and the final report as text or as one JSON object (jansson, so that every string is
 * escaped and a figure that does not exist is null). */
#include "src/train/train_report.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "kernels/kernels.h"
#include "src/base/mpi_wait.h"
#include "src/plan/predict.h"
#include "src/train/train_text.h"

/* CMakeLists.txt defines both for src/train (and src/base); PT_GIT_COMMIT is "" when the source is no git
 * checkout. */
#ifndef PT_VERSION
#error "PT_VERSION must be defined by the build (CMakeLists.txt)"
#endif
#ifndef PT_GIT_COMMIT
#error "PT_GIT_COMMIT must be defined by the build (CMakeLists.txt)"
#endif

static const char *optimizer_name(optimizer_kind k) { return optimizer_kind_name(k); }
/* --precision's value as written */
static const char *precision_name(engine_precision p)
{
    return p == ENGINE_TF32 ? "tf32" : p == ENGINE_BF16 ? "bf16" : "fp32";
}

/* ---- banner and epoch lines ---- */

/* The corpus, as the options name it. */
static const char *corpus_name(const train_options *o)
{
    return o->text == TEXT_FORTUNES ? "fortunes" : o->text_file;
}

/* A language model's data line: the corpus, its split, windows and steps. */
static void banner_text(const train_run *run)
{
    const train_options *o = &run->o;
    printf("data: %s, %zu tokens: %zu training, %zu held out (%d evaluation window%s); batch "
           "%d windows of %d tokens, %ld step%s per epoch (the training tokens' worth); %ld "
           "step%s over %ld epoch%s\n", corpus_name(o), run->corpus_tokens,
           run->corpus.count, run->val_tokens, run->val.count, run->val.count == 1 ? "" : "s",
           o->batch, run->labels_per_sample, run->steps_per_epoch,
           run->steps_per_epoch == 1 ? "" : "s", run->total_steps,
           run->total_steps == 1 ? "" : "s", run->epochs, run->epochs > 1 ? "s" : "");
}

void train_report_banner(const train_run *run)
{
    const train_options *o = &run->o;
    if (run->rank != 0 || o->json) return;
    printf("model %s: %d layer%s, %zu parameters, %d %s\n", o->model, run->net.n_layers,
           run->net.n_layers == 1 ? "" : "s", run->net.param_count, run->net.classes,
           run->net.sequence ? "tokens in its vocabulary" : "classes");
    if (o->text)
        banner_text(run);
    else
        printf("data: %d training, %d validation, %d test samples; batch %d, %ld step%s per "
               "epoch; %ld step%s over %ld epoch%s\n", run->train.count, run->val.count,
               run->test.count, o->batch, run->steps_per_epoch,
               run->steps_per_epoch == 1 ? "" : "s", run->total_steps,
               run->total_steps == 1 ? "" : "s", run->epochs, run->epochs > 1 ? "s" : "");
    if (run->resumed_from_step >= 0)
        printf("resuming from %s at step %ld\n", run->resumed_from, run->resumed_from_step);
    printf("layout: %d stage%s", o->stages, o->stages > 1 ? "s" : "");
    if (run->sched.virtual_stages > 1)
        printf(" × %d virtual (%d model chunks)", run->sched.virtual_stages,
               o->stages * run->sched.virtual_stages);
    if (o->tensor > 1)
        printf(" × %d tensor shards (%s)", o->tensor, tensor_mode_name(o->tensor_mode));
    if (o->replicas > 1) {
        printf(" × %d replicas (reduce %s", o->replicas, reduce_method_name(o->reduce));
        if (!reduce_method_root_steps(o->reduce))
            printf(", %g MiB buckets, overlap %s", o->bucket_mb, o->overlap ? "on" : "off");
        printf(")");
    }
    printf(", %d micro-batch%s of %d%s, schedule %s%s%s%s, ", o->microbatches,
           o->microbatches > 1 ? "es" : "", o->batch / (o->replicas * o->microbatches),
           o->replicas > 1 ? " per replica" : "", run->sched.name,
           run->sched.origin[0] ? " (" : "", run->sched.origin,
           run->sched.origin[0] ? ")" : "");
    if (o->recompute && strcmp(o->recompute, "none") != 0)
        printf("recompute %s, ", o->recompute);
    if (o->wgrad_batched) printf("wgrad batched, ");
    if (o->device == ENGINE_CUDA)
        printf("rank 0 on CUDA device %d (%s, %s messages, %s products)", run->gpu,
               run->gpu_info.name, run->device_messages ? "device-memory" : "host-staged",
               precision_name(o->precision));
    else
        printf("%d thread%s per rank%s", o->threads, o->threads > 1 ? "s" : "",
               o->precision == ENGINE_BF16 ? ", bf16 products" : "");
    printf("; %s lr %g", optimizer_name(o->opt.kind), (double)o->opt.lr);
    if (o->lr_sched.kind != LR_CONSTANT || o->lr_sched.warmup)
        printf(" (%s, warm-up %ld, min %g)", lr_schedule_name(o->lr_sched.kind),
               o->lr_sched.warmup, o->lr_sched.lr_min);
    if (o->opt.clip_norm > 0) printf(", gradient norm clipped to %g", (double)o->opt.clip_norm);
    printf("\n");
    if ((o->stages > 1 || o->replicas > 1) && o->microbatches <= 16) {
        printf("schedule (unit-time timeline, F = forward, B = backward%s):\n",
               o->replicas > 1 ? ", A = reduction, W = waiting for one" : "");
        schedule_print(&run->sched, stdout);
    }
    fflush(stdout);
}

void train_report_epoch(const train_run *run, const train_results *res, double epoch_s,
                        long epoch_samples, long from)
{
    if (run->rank != 0 || run->o.json) return;
    printf("epoch %ld/%ld", res->epochs, run->epochs);
    /* resumed mid-epoch: the figures cover only the steps this run took */
    if (from != (res->epochs - 1) * run->steps_per_epoch)
        printf(" (steps %ld-%ld only)", from + 1, res->steps);
    if (run->o.text) { /* per token */
        printf("  train loss %.4f next-token acc %.4f", res->train_loss, res->train_acc);
        double m;
        const char *what = train_text_measure(run, res->val_loss, &m);
        if (run->val.count)
            printf("  val loss %.4f (%s %.4f) next-token acc %.4f", res->val_loss, what, m,
                   res->val_acc);
    } else {
        printf("  train loss %.4f acc %.4f", res->train_loss, res->train_acc);
        if (run->val.count) printf("  val acc %.4f", res->val_acc);
    }
    if (run->test.count) printf("  test loss %.4f acc %.4f", res->test_loss, res->test_acc);
    printf("  %.1f s  %.0f samples/s\n", epoch_s, epoch_samples / epoch_s);
    fflush(stdout);
}

/* ---- progress ---- */

void train_progress_init(train_progress *p, const train_run *run, long first)
{
    *p = (train_progress){.mode = PROGRESS_OFF, .interval = run->o.progress, .last = pt_now(),
                          .first = first};
    p->start = p->last;
    if (run->rank != 0 || run->o.json) return;
    if (isatty(STDOUT_FILENO)) {
        p->mode = PROGRESS_BAR;
        p->interval = 0.2;
    } else if (run->o.progress > 0) {
        p->mode = PROGRESS_LINES;
    }
}

/* h:mm:ss, or m:ss under an hour. */
static void format_eta(char *buf, size_t n, double s)
{
    if (!isfinite(s) || s < 0 || s > 1e9) {
        snprintf(buf, n, "?");
        return;
    }
    long t = lround(s);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

void train_progress_step(train_progress *p, const train_run *run, long epoch, double step_s,
                         double loss)
{
    if (p->mode == PROGRESS_OFF) return;
    p->steps++;
    p->step_s += step_s;
    double now = pt_now();
    if (p->steps > 1 && now - p->last < p->interval) return;
    p->last = now;
    long total = run->total_steps, step = p->first + p->steps; /* of the whole run */
    /* samples/s over the steps alone; the ETA over the wall clock, evaluation included */
    double rate = p->step_s > 0 ? (double)p->steps * run->o.batch / p->step_s : 0;
    char eta[32];
    format_eta(eta, sizeof eta, (now - p->start) / (double)p->steps * (double)(total - step));
    if (p->mode == PROGRESS_LINES) {
        printf("  step %ld/%ld  epoch %ld/%ld  loss %.4f  %.0f samples/s  ETA %s\n", step,
               total, epoch, run->epochs, loss, rate, eta);
    } else {
        /* under 80 columns (the epoch is in the epoch lines), or \r cannot erase it */
        enum { WIDTH = 20 };
        char bar[WIDTH + 1];
        int done = (int)(WIDTH * step / total);
        for (int i = 0; i < WIDTH; i++) bar[i] = i < done ? '#' : '.';
        bar[WIDTH] = '\0';
        int len = printf("\r  [%s] %ld/%ld  loss %.4f  %.0f samples/s  ETA %s", bar, step,
                         total, loss, rate, eta);
        if (len > 1 + p->bar_width) p->bar_width = len - 1;
    }
    fflush(stdout);
}

void train_progress_clear(train_progress *p)
{
    if (p->mode != PROGRESS_BAR || !p->bar_width) return;
    printf("\r%*s\r", p->bar_width, "");
    fflush(stdout);
    p->bar_width = 0;
}

/* ---- final report ---- */

/* The simulator's bubble for the measured mean forward/backward time of each stage: what
 * the schedule costs with these (possibly unbalanced) stages and free messages. */
/* The simulator's costs of one micro-batch's ops, from the measured times: per stage, or
 * per model chunk for interleaved schedules; B and W (zero bubble) and recomputation as
 * measured. With --wgrad batched the last micro-batch's W or backward carries the step's
 * batched products, which the mean spreads over the micro-batches. Returns the owned block
 * (NULL when out of memory); step: the slowest stage's optimizer step. */
static double *measured_costs(const stage_figures *f, int micro, schedule_costs *c,
                              double *step)
{
    int C = f->chunks;
    double *a = calloc((size_t)EXEC_TIMES * C, sizeof *a);
    if (!a) return NULL;
    double n = (double)f->steps * micro, split = 0, recompute = 0;
    for (int i = 0; i < EXEC_TIMES * C; i++) a[i] = f->chunk[i] / n;
    double *fwd = a, *bwd = a + C, *bin = a + 2 * C, *bwt = a + 3 * C, *rec = a + 4 * C;
    for (int k = 0; k < C; k++) {
        split += bin[k] + bwt[k];
        recompute += rec[k];
        if (bwd[k] == 0) bwd[k] = bin[k] + bwt[k];
    }
    *c = (schedule_costs){.fwd = fwd, .bwd = bwd, .bwd_input = split > 0 ? bin : NULL,
                          .bwd_weight = split > 0 ? bwt : NULL,
                          .recompute = recompute > 0 ? rec : NULL};
    *step = 0;
    for (int r = 0; r < f->stages; r++)
        if (f->optimizer_max[r] / f->steps > *step) *step = f->optimizer_max[r] / f->steps;
    return a;
}

static double simulated_bubble(const schedule *sched, const stage_figures *f, int micro)
{
    if (f->steps < 1) return NAN;
    schedule_costs c;
    double step;
    double *block = measured_costs(f, micro, &c, &step);
    if (!block) return NAN;
    c.step_cost = step;
    schedule_sim sim;
    double b = NAN;
    if (!schedule_simulate_costs(sched, &c, &sim)) {
        b = sim.bubble;
        schedule_sim_free(&sim);
    }
    free(block);
    return b;
}

/* The bubble figures; NAN with one stage (there is no pipeline to idle in). */
typedef struct {
    double measured, simulated, theory;
} bubble_figures;

static bubble_figures bubbles(const train_run *run, const stage_figures *fig)
{
    if (run->o.stages < 2)
        return (bubble_figures){.measured = NAN, .simulated = NAN, .theory = NAN};
    /* all three are the idle share of the step, as a trace shows it */
    double f = schedule_bubble_formula(&run->sched, NULL);
    return (bubble_figures){
        .measured = fig->bubble,
        .simulated = simulated_bubble(&run->sched, fig, run->o.microbatches),
        .theory = f >= 0 ? f : NAN,
    };
}

static double samples_per_s(const train_run *run, const train_results *res)
{
    return res->timed_s > 0 ? (double)res->timed_steps * run->o.batch / res->timed_s : NAN;
}

/* The reductions' derived figures per stage: the simulator's prediction for the measured
 * stage times (summed over the same steps as the measurement) and the bus bandwidth. */
typedef struct {
    double *predicted, *bus_bw; /* one block, per stage; NAN where unknown */
    double step_predicted;      /* the simulator's step time (makespan), seconds */
} reduce_figures;

static void reduce_figures_free(reduce_figures *rf)
{
    free(rf->predicted);
    *rf = (reduce_figures){0};
}

/* fills rf; a figure that cannot be computed stays NAN */
static void reduce_figures_init(reduce_figures *rf, const train_run *run,
                                const stage_figures *f)
{
    int K = f->stages, R = run->o.replicas, M = run->o.microbatches;
    *rf = (reduce_figures){.step_predicted = NAN};
    rf->predicted = malloc(2 * (size_t)K * sizeof *rf->predicted);
    if (!rf->predicted) return;
    rf->bus_bw = rf->predicted + K;
    for (int s = 0; s < K; s++) {
        rf->predicted[s] = NAN;
        rf->bus_bw[s] = f->reduce[s] > 0 ? reduce_bus_bandwidth((size_t)f->reduce_bytes[s],
                                                                f->reduce[s], R)
                                         : NAN;
    }
    if (f->steps < 1) return;
    schedule_costs c;
    double step;
    double *costs = measured_costs(f, M, &c, &step);
    double **bytes = calloc((size_t)K, sizeof *bytes);
    int ok = costs && bytes;
    /* each rank's buckets as its list numbers them (with V > 1 its chunks' one after the
     * other) */
    for (int s = 0; ok && s < K && R >= 2; s++) {
        int n;
        if (replicas_rank_bucket_bytes(&run->sched, &run->net, &run->part, &run->rep, s,
                                       &bytes[s], &n, NULL))
            ok = 0;
    }
    /* The reductions priced with the α–β figures measured on each group at the start
     * (exec_start); the cost model's link where a stage has none. -bcast methods: the
     * parameters' broadcast after the step, as measured there (the measured optimizer
     * time is the engine's update alone). */
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    double *alpha = malloc(2 * (size_t)K * sizeof *alpha + 1), *beta = alpha + K;
    ok = ok && alpha;
    double bcast = 0;
    for (int s = 0; ok && s < K; s++) {
        int measured = f->reduce_beta[s] > 0;
        /* ZeRO-3 gathers inside the passes (in the measured forward and backward), not
         * after the step */
        if (run->o.zero < 3 && f->reduce_bcast[s] > bcast) bcast = f->reduce_bcast[s];
        alpha[s] = measured ? f->reduce_alpha[s] : cm.latency[run->reduce_link];
        beta[s] = measured ? f->reduce_beta[s] : cm.bandwidth[run->reduce_link];
    }
    c.step_cost = step + bcast;
    c.replicas = R;
    c.alpha = cm.latency[run->reduce_link];
    c.beta = cm.bandwidth[run->reduce_link];
    c.alpha_stage = alpha;
    c.beta_stage = beta;
    c.bucket_bytes = (const double *const *)bytes;
    /* the CPU engine's cores move and sum the data themselves, inside MPI calls */
    c.reduce_in_waits = run->o.device != ENGINE_CUDA;
    schedule_sim sim;
    if (ok && !schedule_simulate_costs(&run->sched, &c, &sim)) {
        for (int s = 0; s < K; s++) rf->predicted[s] = sim.reduce[s] * (double)f->steps;
        rf->step_predicted = sim.makespan;
        schedule_sim_free(&sim);
    }
    for (int s = 0; bytes && s < K; s++) free(bytes[s]);
    free(bytes);
    free(costs);
    free(alpha);
}

/* Per stage, the tensor collectives of the run's steps priced as plan prices them
 * (plan_tensor_cost) with the group's α–β figures measured at the start, forwards twice
 * where the stage recomputes. NAN without shards. */
static void tensor_predicted(const train_run *run, const stage_figures *f, double *out)
{
    const train_options *o = &run->o;
    int K = o->stages, T = o->tensor, M = o->microbatches;
    int V = run->sched.virtual_stages > 1 ? run->sched.virtual_stages : 1;
    double mb = (double)o->batch / ((double)o->replicas * M);
    for (int s = 0; s < K; s++) {
        out[s] = NAN;
        if (T < 2) continue;
        double fwd = 0, bwd = 0;
        for (int v = 0; v < V; v++) {
            int c = schedule_model_chunk(&run->sched, s, v);
            shard_traffic tr = shard_stage_traffic(&run->shard, &run->net, run->part.first[c],
                                                   run->part.first[c + 1], c == 0);
            double cf, cb;
            plan_tensor_cost(&tr, T, mb, run->tensor_alpha, run->tensor_beta, &cf, &cb);
            fwd += cf;
            bwd += cb;
        }
        if (run->sched.lists[s].recompute) fwd *= 2;
        out[s] = (fwd + bwd) * M * (double)f->steps;
    }
}

/* Per stage, ZeRO-3's gathers per step as the calibration prices them: the stage's
 * layers' gathers (reduce_bcast, measured at the start) once per pass of its list (a
 * forward, recomputation, backward or B; a backward or W by bucket parts 1/buckets each),
 * per model chunk. NAN without ZeRO-3. They are inside the measured forward and backward
 * times that train's simulator takes (so not added to step_predicted_s): this says what
 * they cost where nothing hides them, to set against the step's difference to --zero 2. */
static void zero3_predicted(const train_run *run, const stage_figures *f, double *out)
{
    int V = run->sched.virtual_stages > 1 ? run->sched.virtual_stages : 1;
    for (int s = 0; s < f->stages; s++) {
        out[s] = NAN;
        if (run->o.zero < 3 || run->o.replicas < 2) continue;
        const schedule_list *l = &run->sched.lists[s];
        double passes = 0;
        for (int i = 0; i < l->n_ops; i++) {
            const schedule_op *op = &l->ops[i];
            int whole = op->bucket < 0 || l->buckets < 1;
            switch (op->kind) {
            case SCHED_OP_FORWARD:
            case SCHED_OP_RECOMPUTE:
            case SCHED_OP_BACKWARD_INPUT: passes += 1; break;
            case SCHED_OP_BACKWARD:
            case SCHED_OP_BACKWARD_WEIGHT: passes += whole ? 1 : 1.0 / l->buckets; break;
            default: break;
            }
        }
        out[s] = passes / V * f->reduce_bcast[s];
    }
}

static void report_text(const train_run *run, const train_results *res,
                        const stage_figures *fig)
{
    double rate = samples_per_s(run, res);
    if (res->first_step > 0)
        printf("done: steps %ld-%ld of %ld (resumed at %ld) in %.1f s, ", res->first_step + 1,
               res->steps, run->total_steps, res->first_step, res->train_s);
    else
        printf("done: %ld step%s in %.1f s, ", res->steps, res->steps == 1 ? "" : "s",
               res->train_s);
    if (isnan(rate)) printf("no step after --untimed-steps %ld to time", run->o.untimed_steps);
    else printf("%.0f samples/s", rate);
    if (run->o.stages > 1) {
        bubble_figures b = bubbles(run, fig);
        const char *formula = NULL;
        schedule_bubble_formula(&run->sched, &formula);
        printf("; bubble (idle share of the step) %.3f measured, %.3f simulated from the "
               "measured stage times, %.3f for balanced stages (%s)\n", b.measured,
               b.simulated, b.theory, formula ? formula : "no formula");
    } else {
        printf("\n");
    }
    if (run->o.stages > 1 || run->o.replicas > 1 || run->o.tensor > 1) {
        reduce_figures rf;
        reduce_figures_init(&rf, run, fig);
        double tensor_pred[fig->stages > 0 ? fig->stages : 1];
        tensor_predicted(run, fig, tensor_pred);
        for (int r = 0; r < fig->stages; r++) {
            printf("  stage %d: compute %.2f s of %.2f s, peak activations %.2f MB "
                   "(%.0f micro-batch%s)", r, fig->compute[r], fig->wall[r],
                   fig->peak_bytes[r] / 1e6, fig->peak_mb[r], fig->peak_mb[r] == 1 ? "" : "es");
            if (run->o.replicas > 1)
                printf("; reductions %.4f s (%.4f s exposed, %.4f s predicted), %.1f MB, "
                       "bus %.2f GB/s", fig->reduce[r], fig->reduce_exposed[r],
                       rf.predicted[r], fig->reduce_bytes[r] / 1e6, rf.bus_bw[r] / 1e9);
            if (run->o.tensor > 1)
                printf("; tensor collectives %.4f s (%.4f s predicted), %.0f parameters per "
                       "rank", fig->tensor[r], tensor_pred[r], fig->params[r]);
            printf("\n");
        }
        reduce_figures_free(&rf);
    }
    if (res->saved) printf("saved %s\n", res->saved);
    if (res->traced) printf("trace %s\n", res->traced);
}

/* JSON strings must be UTF-8: a name that is not (a path in another encoding) keeps its
 * ASCII and shows '?' for the other bytes. */
static json_t *json_text(const char *s)
{
    if (!s) return json_null();
    json_t *j = json_string(s);
    if (j) return j;
    char *copy = strdup(s);
    if (!copy) return NULL;
    for (char *c = copy; *c; c++)
        if ((unsigned char)*c >= 0x80) *c = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

static json_t *json_number(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* A float option as its decimal (0.001, not 0.00100000005). */
static json_t *json_float(float v)
{
    char text[32];
    snprintf(text, sizeof text, "%.7g", (double)v);
    return json_number(strtod(text, NULL));
}

static json_t *json_reals(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_number(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Whole numbers held in doubles (bytes, micro-batch counts), as JSON integers. */
static json_t *json_counts(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((json_int_t)llround(v[i])))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Byte counts, null where not known (NAN). */
static json_t *json_bytes(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, isfinite(v[i]) ? json_integer((json_int_t)llround(v[i]))
                                                    : json_null())) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *json_stage_layers(const partition *part)
{
    json_t *a = json_array();
    for (int s = 0; a && s < part->stages; s++)
        if (json_array_append_new(a, json_integer(part->first[s + 1] - part->first[s]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* Sets fields[i].key to fields[i].value in obj for every field (NULL values, from a failed
 * allocation, make it fail); takes every value's reference, also on failure. */
typedef struct {
    const char *key;
    json_t *value;
} json_field;

static int put_fields(json_t *obj, json_field *fields, size_t n)
{
    int bad = !obj;
    for (size_t i = 0; i < n; i++) {
        /* json_object_set_new takes the value's reference even when it fails */
        if (!bad) bad = json_object_set_new(obj, fields[i].key, fields[i].value) != 0;
        else json_decref(fields[i].value);
    }
    return bad ? -1 : 0;
}

/* What the run is, known before its first step: what, where, when, how, the layout. */
static json_t *run_json(const train_run *run)
{
    const train_options *o = &run->o;
    int cuda = o->device == ENGINE_CUDA;
    json_field fields[] = {
        {"model", json_text(o->model)},
        {"data_read_s", json_number(run->read_s)},
        {"steps_per_epoch", json_integer(run->steps_per_epoch)},
        {"params", json_integer((json_int_t)run->net.param_count)},
        {"version", json_string(PT_VERSION)},
        {"commit", PT_GIT_COMMIT[0] ? json_string(PT_GIT_COMMIT) : json_null()},
        {"host", json_text(run->host)},
        {"start_time", run->start_time[0] ? json_string(run->start_time) : json_null()},
        {"seed", json_integer((json_int_t)o->seed)},
        {"train_samples", o->text ? json_null() : json_integer(run->train.count)},
        /* a language model's text (null for images): val_samples are its windows */
        {"corpus", o->text ? json_text(corpus_name(o)) : json_null()},
        {"corpus_tokens", o->text ? json_integer((json_int_t)run->corpus_tokens) : json_null()},
        {"train_tokens", o->text ? json_integer((json_int_t)run->corpus.count) : json_null()},
        {"val_tokens", o->text ? json_integer((json_int_t)run->val_tokens) : json_null()},
        {"context", o->text ? json_integer(run->labels_per_sample) : json_null()},
        {"accuracy", json_string(o->text ? "next-token" : "class")},
        {"val_samples", json_integer(run->val.count)},
        {"test_samples", json_integer(run->test.count)},
        {"batch", json_integer(o->batch)},
        {"optimizer", json_string(optimizer_name(o->opt.kind))},
        {"lr", json_float(o->opt.lr)},
        {"lr_schedule", json_string(lr_schedule_name(o->lr_sched.kind))},
        {"lr_warmup", json_integer(o->lr_sched.warmup)},
        {"lr_min", json_number(o->lr_sched.lr_min)},
        {"weight_decay", json_float(o->opt.weight_decay)},
        {"clip_grad_norm", o->opt.clip_norm > 0 ? json_float(o->opt.clip_norm) : json_null()},
        {"warmup", json_integer(o->untimed_steps)}, /* the old name, kept for readers */
        {"untimed_steps", json_integer(o->untimed_steps)},
        {"total_steps", json_integer(run->total_steps)},
        {"threads", json_integer(o->threads)},
        {"wait", json_string(mpi_wait_mode_name(o->wait))},
        {"device", json_string(cuda ? "cuda" : "cpu")},
        {"precision", json_string(precision_name(o->precision))},
        /* OpenBLAS's kernels, and what it had chosen where pipetrain chose better (main.c) */
        {"blas_core", json_text(kernel_blas_core())},
        {"blas_core_detected", getenv("PIPETRAIN_BLAS_DETECTED")
                                   ? json_text(getenv("PIPETRAIN_BLAS_DETECTED"))
                                   : json_null()},
        {"gpu", cuda ? json_integer(run->gpu) : json_null()},
        {"gpu_name", cuda ? json_text(run->gpu_info.name) : json_null()},
        /* the layout */
        {"stages", json_integer(o->stages)},
        {"microbatches", json_integer(o->microbatches)},
        {"schedule", json_text(run->sched.name)},
        /* what --schedule search chose (a hand-written name or the greedy order's) */
        {"schedule_origin", run->sched.origin[0] ? json_text(run->sched.origin) : json_null()},
        {"schedule_file", o->schedule_file ? json_text(o->schedule_file) : json_null()},
        {"virtual", json_integer(o->virtual_stages)},
        {"recompute", json_text(o->recompute)},
        {"wgrad", json_text(o->wgrad_batched ? "batched" : "per-microbatch")},
        {"partition", json_text(o->partition)},
        {"stage_layers", json_stage_layers(&run->part)},
        {"replicas", json_integer(o->replicas)},
        {"tensor", json_integer(o->tensor)},
        {"tensor_mode", json_string(tensor_mode_name(o->tensor_mode))},
        {"reduce", json_string(reduce_method_name(o->reduce))},
        {"bucket_mb", json_number(o->bucket_mb)},
        {"overlap", json_boolean(o->overlap)},
        {"zero3_prefetch", json_boolean(o->zero3_prefetch)},
        {"zero_overlap", json_boolean(o->zero_overlap)},
        {"reduce_link", json_string(topo_link_name(run->reduce_link))},
        /* where it started: in --json and in the metrics file's first line */
        {"resumed_from_step",
         run->resumed_from_step >= 0 ? json_integer(run->resumed_from_step) : json_null()},
        {"resumed_from", run->resumed_from_step >= 0 ? json_text(run->resumed_from) : json_null()},
    };
    json_t *obj = json_object();
    if (put_fields(obj, fields, sizeof fields / sizeof *fields)) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

json_t *train_report_run_json(const train_run *run) { return run_json(run); }

/* A language model's validation figure `what` (train_text_measure), else NAN. */
static double val_measure(const train_run *run, const train_results *res, const char *what)
{
    double v;
    if (!run->o.text || !run->val.count || strcmp(train_text_measure(run, res->val_loss, &v), what))
        return NAN;
    return v;
}

static json_t *results_json(const train_run *run, const train_results *res,
                            const stage_figures *fig)
{
    bubble_figures b = bubbles(run, fig);
    int K = fig->stages;
    reduce_figures rf;
    double tensor_pred[K > 0 ? K : 1], zero3_pred[K > 0 ? K : 1]; /* NAN where none */
    tensor_predicted(run, fig, tensor_pred), zero3_predicted(run, fig, zero3_pred);
    reduce_figures_init(&rf, run, fig);
    if (!rf.predicted) return NULL;
    /* the verifier's bound on the micro-batches each stage holds (what the measured peak
     * must not pass), and the split backward's and recomputation's times per stage */
    double bound[K], per_stage[3][K];
    schedule_report sr;
    int have_bound = schedule_verify(&run->sched, &sr) == 0;
    for (int k = 0; k < K; k++) {
        bound[k] = have_bound ? sr.peak_inflight[k] : NAN;
        for (int t = 0; t < 3; t++) per_stage[t][k] = 0;
        for (int c = k; c < fig->chunks; c += K) {
            per_stage[0][k] += fig->chunk[EXEC_TIME_BACKWARD_INPUT * fig->chunks + c];
            per_stage[1][k] += fig->chunk[EXEC_TIME_BACKWARD_WEIGHT * fig->chunks + c];
            per_stage[2][k] += fig->chunk[EXEC_TIME_RECOMPUTE * fig->chunks + c];
        }
    }
    if (have_bound) schedule_report_free(&sr);
    json_field fields[] = {
        /* results */
        {"samples_per_s", json_number(samples_per_s(run, res))},
        {"train_loss", json_number(res->train_loss)},
        {"train_acc", json_number(res->train_acc)},
        {"test_loss", json_number(res->test_loss)},
        {"test_acc", json_number(res->test_acc)},
        {"val_loss", json_number(res->val_loss)},
        {"val_acc", json_number(res->val_acc)},
        {"val_bits_per_byte", json_number(val_measure(run, res, "bits per byte"))},
        {"val_perplexity", json_number(val_measure(run, res, "perplexity"))},
        {"steps", json_integer(res->steps)}, /* the last step reached */
        {"steps_run", json_integer(res->steps - res->first_step)}, /* by this process */
        {"timed_steps", json_integer(res->timed_steps)},
        {"epochs", json_integer(res->epochs)},
        {"wall_s", json_number(pt_now() - res->t_begin)},
        {"train_s", json_number(res->train_s)},
        /* per-stage figures */
        {"bubble", json_number(b.measured)},
        {"bubble_theory", json_number(b.theory)},
        {"bubble_simulated", json_number(b.simulated)},
        {"stage_compute_s", json_reals(fig->compute, K)},
        {"stage_wall_s", json_reals(fig->wall, K)},
        {"stage_forward_s", json_reals(fig->forward, K)},
        {"stage_backward_s", json_reals(fig->backward, K)},
        {"stage_optimizer_s", json_reals(fig->optimizer, K)},
        {"stage_peak_act_bytes", json_counts(fig->peak_bytes, K)},
        {"stage_peak_microbatches", json_counts(fig->peak_mb, K)},
        {"stage_peak_microbatches_bound", json_counts(bound, K)},
        {"stage_backward_input_s", json_reals(per_stage[0], K)},
        {"stage_backward_weight_s", json_reals(per_stage[1], K)},
        {"stage_recompute_s", json_reals(per_stage[2], K)},
        {"stage_reduce_s", json_reals(fig->reduce, K)},
        {"stage_reduce_exposed_s", json_reals(fig->reduce_exposed, K)},
        {"stage_reduce_bytes", json_counts(fig->reduce_bytes, K)},
        {"stage_bus_bw", json_reals(rf.bus_bw, K)},
        {"stage_reduce_predicted_s", json_reals(rf.predicted, K)},
        {"stage_reduce_alpha_s", json_reals(fig->reduce_alpha, K)},
        {"stage_reduce_beta_Bps", json_reals(fig->reduce_beta, K)},
        {"stage_reduce_bcast_s", json_reals(fig->reduce_bcast, K)},
        {"step_predicted_s", json_number(rf.step_predicted)},
        {"stage_params", json_reals(fig->params, K)},
        {"stage_tensor_s", json_reals(fig->tensor, K)},
        {"stage_tensor_predicted_s", json_reals(tensor_pred, K)},
        {"tensor_alpha_s", json_number(run->o.tensor > 1 ? run->tensor_alpha : NAN)},
        {"tensor_beta_Bps", json_number(run->o.tensor > 1 ? run->tensor_beta : NAN)},
        /* memory per world rank (ZeRO's terms, measured): allocated bytes and peak RSS */
        {"zero", json_integer(run->o.zero)},
        {"stage_zero3_gather_predicted_s", json_reals(zero3_pred, K)},
        {"post_validation", json_boolean(run->o.post_validation)},
        {"post_validation_rollbacks", run->o.post_validation ? json_integer(fig->rollbacks)
                                                             : json_null()},
        {"rank_params_bytes", json_bytes(fig->rank_mem + RANK_MEM_PARAMS * fig->ranks, fig->ranks)},
        {"rank_grads_bytes", json_bytes(fig->rank_mem + RANK_MEM_GRADS * fig->ranks, fig->ranks)},
        {"rank_optimizer_bytes", json_bytes(fig->rank_mem + RANK_MEM_OPTIM * fig->ranks, fig->ranks)},
        {"rank_peak_rss_bytes", json_bytes(fig->rank_mem + RANK_MEM_PEAK * fig->ranks, fig->ranks)},
        /* outputs written */
        {"checkpoint", json_text(res->saved)},
        {"last_checkpoint_step",
         run->last_checkpoint_step >= 0 ? json_integer(run->last_checkpoint_step) : json_null()},
        /* rank 0's: what checkpoints held training up (gathers, waits for a write) and
         * what writing them took (in the background unless --checkpoint-write sync) */
        {"checkpoints_written", json_integer(run->ckpt_written)},
        {"checkpoint_hold_s", json_real(run->ckpt_hold_s)},
        {"checkpoint_write_s", json_real(run->ckpt_write_s)},
        {"trace", json_text(res->traced)},
    };
    reduce_figures_free(&rf);
    json_t *obj = run_json(run);
    if (put_fields(obj, fields, sizeof fields / sizeof *fields)) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

json_t *train_report_results_json(const train_run *run, const train_results *res,
                                  const stage_figures *fig)
{
    return results_json(run, res, fig);
}

int train_report_final(const train_run *run, const train_results *res,
                       const stage_figures *fig)
{
    if (!run->o.json) {
        report_text(run, res, fig);
        fflush(stdout);
        return 0;
    }
    json_t *obj = results_json(run, res, fig);
    char *text = obj ? json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(obj);
    if (!text) return pt_error_set("out of memory for the JSON results");
    printf("%s\n", text);
    fflush(stdout);
    free(text);
    return 0;
}
