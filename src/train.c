/* `pipetrain train`: sequential or pipelined training on Fashion-MNIST-style IDX data.
 * Every rank parses the same options and loads the same files; setup errors are gathered
 * with a collective so that every rank exits non-zero and one of them says why. */
#include "src/train.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/rng.h"
#include "src/checkpoint.h"
#include "src/base/clock.h"
#include "src/cuda_plugin.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/exec.h"
#include "src/options.h"
#include "src/train_options.h"
#include "src/profile.h"
#include "topologies/topo.h"

void openblas_set_num_threads(int);

/* ---- collective error handling ---- */

/* Every rank calls this after a setup phase with its own status. If any failed, the lowest
 * failing rank prints its message (naming rank and host when there are several ranks) and
 * every rank returns −1, so that all of them exit non-zero. */
static int agree(int status, MPI_Comm comm, double timeout)
{
    int rank = 0, size = 1;
    if (PT_MPI_CALL(MPI_Comm_rank(comm, &rank)) || PT_MPI_CALL(MPI_Comm_size(comm, &size)))
        status = -1;
    int first_bad = status ? rank : INT_MAX;
    /* after an MPI error the others may wait in another collective: end the job */
    if ((status && pt_mpi_failed()) ||
        exec_allreduce(&first_bad, 1, MPI_INT, MPI_MIN, comm, timeout)) {
        /* a rank that never arrives may be hung: only ending the job helps */
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        fflush(stderr);
        MPI_Abort(comm, 1);
    }
    if (first_bad == INT_MAX) return 0;
    if (rank == first_bad) {
        char host[64] = "";
        gethostname(host, sizeof host - 1);
        if (size > 1)
            fprintf(stderr, "pipetrain: rank %d (%s): %s\n", rank, host, pt_error_get());
        else
            fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    }
    return -1;
}

/* ---- pieces of the run ---- */

static void shuffle_indices(int64_t *idx, int n, uint64_t seed, int epoch, int shuffle)
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

static int load_data(const train_options *o, const net_desc *net, dataset *train,
                     dataset *val, dataset *test)
{
    memset(val, 0, sizeof *val);
    if (data_load_fashion_mnist(train, test, o->data, net->classes)) return -1;
    if (train->rows * train->cols != (int)layer_shape_count(net->input))
        return pt_error_set("the data has %d×%d images but the model expects input %d,%d,%d",
                            train->rows, train->cols, net->input.c, net->input.h, net->input.w);
    if (o->val && data_split_tail(train, val, o->val)) return -1;
    if (o->train_samples > 0 && o->train_samples < train->count)
        train->count = (int)o->train_samples;
    if (o->test_samples >= 0 && o->test_samples < test->count) test->count = (int)o->test_samples;
    if (train->count < o->batch)
        return pt_error_set("the training set has %d samples, fewer than one batch of %d",
                            train->count, o->batch);
    return 0;
}

static int choose_partition(const train_options *o, const net_desc *net, partition *part,
                            MPI_Comm comm, int rank, int gpu)
{
    memset(part, 0, sizeof *part);
    if (partition_check(net->n_layers, o->stages)) return -1;
    partition_profile prof = {0};
    /* One stage needs no cut, and so no profile. */
    int have_profile = !strcmp(o->partition, "time") && o->stages > 1;
    int rc = 0;
    if (have_profile) {
        /* Rank 0 measures; the others take its figures so that all cut the same way. */
        int n = net->n_layers;
        double *costs = calloc(2 * (size_t)n, sizeof *costs);
        if (!costs) return pt_error_set("out of memory");
        int ok = 1;
        if (rank == 0) {
            int mb = o->batch / o->microbatches;
            if (partition_profile_measure_on(&prof, net, mb, 2, 5, o->device, gpu)) {
                ok = 0;
            } else {
                memcpy(costs, prof.fwd_s, (size_t)n * sizeof *costs);
                memcpy(costs + n, prof.bwd_s, (size_t)n * sizeof *costs);
                partition_profile_free(&prof);
            }
        }
        MPI_Request req;
        if (PT_MPI_CALL(MPI_Ibcast(costs, 2 * n, MPI_DOUBLE, 0, comm, &req))) {
            free(costs);
            return -1;
        }
        if (exec_allreduce(&ok, 1, MPI_INT, MPI_MIN, comm, o->timeout)) rc = -1;
        if (exec_wait_collective(&req, comm, o->timeout)) rc = -1;
        if (!rc && !ok) rc = rank == 0 ? -1 : pt_error_set("rank 0 could not profile the layers");
        if (!rc) {
            prof.n_layers = n;
            prof.fwd_s = malloc((size_t)n * sizeof(double));
            prof.bwd_s = malloc((size_t)n * sizeof(double));
            if (!prof.fwd_s || !prof.bwd_s) rc = pt_error_set("out of memory");
            else {
                memcpy(prof.fwd_s, costs, (size_t)n * sizeof(double));
                memcpy(prof.bwd_s, costs + n, (size_t)n * sizeof(double));
            }
        }
        free(costs);
    }
    if (!rc && o->stages == 1 && !strcmp(o->partition, "time"))
        rc = partition_uniform(part, net->n_layers, 1);
    else if (!rc) rc = partition_by_method(part, o->partition, net, have_profile ? &prof : NULL,
                                           o->stages);
    if (!rc && rank == 0 && !o->json && o->stages > 1) {
        printf("partition (%s):\n", o->partition);
        partition_print(part, net, have_profile ? &prof : NULL, stdout);
    }
    partition_profile_free(&prof);
    return rc;
}

static void progress(int epoch, int epochs, long step, long steps, double loss)
{
    int width = 30, done = steps ? (int)(width * step / steps) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < done ? '#' : '.';
    bar[width] = '\0';
    printf("\r  epoch %d/%d [%s] %ld/%ld loss %.4f", epoch, epochs, bar, step, steps, loss);
    fflush(stdout);
}

static const char *optimizer_name(optimizer_kind k)
{
    return k == OPT_SGD ? "sgd" : k == OPT_MOMENTUM ? "momentum" : "adam";
}

/* ---- per-stage figures at the end of a run ---- */

typedef struct {
    int stages;
    double *compute, *wall, *forward, *backward, *optimizer, *peak_bytes, *peak_mb; /* one block */
    double bubble; /* measured: mean over stages of the idle fraction of the step time */
    long steps;
} stage_figures;

static void figures_free(stage_figures *f)
{
    free(f->compute);
    memset(f, 0, sizeof *f);
}

static int gather_figures(exec_t *ex, MPI_Comm comm, double timeout, stage_figures *f)
{
    int rank, size;
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    memset(f, 0, sizeof *f);
    double *block = calloc(7 * (size_t)size, sizeof *block);
    if (!block) return pt_error_set("out of memory");
    f->stages = size;
    double **arrays[] = {&f->compute, &f->wall, &f->forward, &f->backward, &f->optimizer,
                         &f->peak_bytes, &f->peak_mb};
    for (int k = 0; k < 7; k++) *arrays[k] = block + (size_t)k * size;
    exec_stats st;
    exec_get_stats(ex, &st);
    f->steps = st.steps;
    f->compute[rank] = st.compute_s;
    f->wall[rank] = st.wall_s;
    f->forward[rank] = st.forward_s;
    f->backward[rank] = st.backward_s;
    f->optimizer[rank] = st.optimizer_s;
    f->peak_bytes[rank] = (double)st.peak_act_bytes;
    f->peak_mb[rank] = st.peak_microbatches;
    if (exec_allreduce(block, 7 * size, MPI_DOUBLE, MPI_SUM, comm, timeout)) {
        figures_free(f);
        return -1;
    }
    for (int r = 0; r < size; r++) f->bubble += f->wall[r] > 0 ? 1 - f->compute[r] / f->wall[r] : 0;
    f->bubble /= size;
    return 0;
}

/* The simulator's bubble for the measured mean forward/backward time of each stage: what
 * the schedule costs with these (possibly unbalanced) stages and free messages. */
static double simulated_bubble(const schedule *sched, const stage_figures *f, int micro)
{
    if (f->steps < 1) return NAN;
    int K = f->stages;
    double *costs = calloc(2 * (size_t)K, sizeof *costs);
    if (!costs) return NAN;
    double step = 0;
    for (int r = 0; r < K; r++) {
        costs[r] = f->forward[r] / ((double)f->steps * micro);
        costs[K + r] = f->backward[r] / ((double)f->steps * micro);
        if (f->optimizer[r] / f->steps > step) step = f->optimizer[r] / f->steps;
    }
    schedule_sim sim;
    double b = NAN;
    if (!schedule_simulate(sched, costs, costs + K, 0.0, step, &sim)) {
        b = sim.bubble;
        schedule_sim_free(&sim);
    }
    free(costs);
    return b;
}

static void print_json_array(const char *name, const double *v, int n)
{
    printf(",\"%s\":[", name);
    for (int i = 0; i < n; i++) printf(i ? ",%.9g" : "%.9g", v[i]);
    printf("]");
}

/* Ends the job on every rank: a rank that timed out cannot count on the others. */
static void abort_job(MPI_Comm comm)
{
    int rank = -1;
    char host[64] = "", msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_get()); /* a failing MPI call records its own */
    if (PT_MPI_CALL(MPI_Comm_rank(comm, &rank)))
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    gethostname(host, sizeof host - 1);
    /* executor messages already name the rank and host */
    if (strncmp(msg, "rank ", 5) == 0) fprintf(stderr, "pipetrain: %s\n", msg);
    else fprintf(stderr, "pipetrain: rank %d (%s): %s\n", rank, host, msg);
    fflush(stderr);
    MPI_Abort(comm, 1);
}

/* The seed's initialisation, then the checkpoint's values when --load names one. */
static int init_parameters(engine *eng, const train_options *o, const net_desc *net,
                           const partition *part, int rank)
{
    if (engine_init_params(eng, o->seed)) return -1;
    if (!o->load) return 0;
    float *p = malloc(eng->param_count ? eng->param_count * sizeof *p : 1);
    if (!p) return pt_error_set("out of memory for the checkpoint");
    int rc = checkpoint_load_layers(o->load, net, part->first[rank], part->first[rank + 1], p);
    if (!rc) rc = engine_write_params(eng, p);
    free(p);
    return rc;
}

int train_main(int argc, char **argv)
{
    MPI_Comm comm = MPI_COMM_WORLD;
    int rank, size;
    if (PT_MPI_CALL(MPI_Comm_rank(comm, &rank)) || PT_MPI_CALL(MPI_Comm_size(comm, &size)))
        abort_job(comm);

    train_options o;
    int prc = train_options_parse(&o, argc, argv);
    if (prc == 1) {
        if (rank == 0) train_options_usage(stdout);
        return 0;
    }
    if (prc) {
        if (rank == 0) fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        return 2;
    }
    if (size != o.stages) {
        if (rank == 0)
            fprintf(stderr, "pipetrain: --stages %d needs exactly %d MPI rank%s, the job has %d "
                    "(run: mpiexec -n %d pipetrain train ... --stages %d)\n", o.stages,
                    o.stages, o.stages > 1 ? "s" : "", size, o.stages, o.stages);
        return 2;
    }

    /* Threads: each rank gets its share of the node's cores unless told otherwise. */
    int blas_threads = 0;
    if (agree(topo_bind_rank(comm, o.bind, o.verbose, &blas_threads), comm, o.timeout))
        return 1;
    if (!o.threads) {
        if (blas_threads > 0) {
            o.threads = blas_threads;
        } else {
            MPI_Comm node;
            int local = 1;
            if (PT_MPI_CALL(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank,
                                                MPI_INFO_NULL, &node)) ||
                PT_MPI_CALL(MPI_Comm_size(node, &local)) || PT_MPI_CALL(MPI_Comm_free(&node)))
                abort_job(comm);
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            o.threads = cores / local > 0 ? (int)(cores / local) : 1;
        }
    }
    /* The stage's own workers split each micro-batch; BLAS stays single-threaded so that
     * two thread pools never fight over the cores. */
    openblas_set_num_threads(1);

    /* A GPU per rank: by local rank, or nearest to the rank's cores when it is bound. */
    int gpu = 0, device_messages = 0;
    cuda_device_info gpu_info = {0};
    if (o.device == ENGINE_CUDA) {
        const cuda_plugin *cp = NULL;
        if (agree(cuda_plugin_load(&cp), comm, o.timeout)) return 1;
        if (agree(cuda_pick_device(comm, cp, o.verbose, &gpu, &gpu_info), comm, o.timeout))
            return 1;
        device_messages = cuda_mpi_aware();
    }

    net_desc net = {0};
    partition part = {0};
    schedule sched = {0};
    dataset train = {0}, val = {0}, test = {0};
    exec_t *ex = NULL;
    int64_t *order = NULL;
    float *all = NULL;
    int rc = 1;

    if (agree(net_desc_load(&net, o.model), comm, o.timeout)) goto done;
    if (agree(choose_partition(&o, &net, &part, comm, rank, gpu), comm, o.timeout)) goto done;
    if (agree(schedule_init_by_name(&sched, o.schedule, o.stages, o.microbatches), comm,
              o.timeout))
        goto done;
    if (agree(load_data(&o, &net, &train, &val, &test), comm, o.timeout)) goto done;
    exec_config cfg = {o.batch, o.microbatches, o.threads, o.timeout, o.trace != NULL, o.stall_rank,
                       o.stall_step, o.kill, o.device, gpu, device_messages, o.ready_delay};
    if (agree(exec_init(&ex, comm, &net, &part, &sched, &cfg), comm, o.timeout)) goto done;
    if (exec_start(ex)) abort_job(comm);
    if (agree(init_parameters(exec_engine(ex), &o, &net, &part, rank), comm, o.timeout))
        goto done;
    order = malloc((size_t)train.count * sizeof *order);
    if (agree(order ? 0 : pt_error_set("out of memory"), comm, o.timeout)) goto done;

    long steps_per_epoch = train.count / o.batch;
    long total_steps = steps_per_epoch * o.epochs;
    if (o.steps > 0 && o.steps < total_steps) total_steps = o.steps;
    int epochs = (int)((total_steps + steps_per_epoch - 1) / steps_per_epoch);
    int tty = rank == 0 && !o.json && isatty(STDOUT_FILENO);
    if (rank == 0 && !o.json) {
        printf("model %s: %d layers, %zu parameters, %d classes\n", o.model, net.n_layers,
               net.param_count, net.classes);
        printf("data: %d training, %d validation, %d test samples; batch %d, %ld steps per "
               "epoch\n", train.count, val.count, test.count, o.batch, steps_per_epoch);
        printf("layout: %d stage%s, %d micro-batch%s of %d, schedule %s, ", o.stages,
               o.stages > 1 ? "s" : "", o.microbatches, o.microbatches > 1 ? "es" : "",
               o.batch / o.microbatches, sched.name);
        if (o.device == ENGINE_CUDA)
            printf("rank 0 on CUDA device %d (%s, %s messages)", gpu, gpu_info.name,
                   device_messages ? "device-memory" : "host-staged");
        else
            printf("%d thread%s per rank", o.threads, o.threads > 1 ? "s" : "");
        printf("; %s lr %g\n", optimizer_name(o.opt.kind), (double)o.opt.lr);
        if (o.stages > 1 && o.microbatches <= 16) {
            printf("schedule (unit-time timeline, F = forward, B = backward):\n");
            schedule_print(&sched, stdout);
        }
        fflush(stdout);
    }

    double t_train = 0, t_timed = 0, t_start = pt_now();
    long timed_steps = 0;
    double epoch_loss = 0, test_loss = NAN, test_acc = NAN, val_acc = NAN;
    long step = 0, epoch_correct = 0, epoch_samples = 0;
    for (int ep = 0; ep < epochs; ep++) {
        shuffle_indices(order, train.count, o.seed, ep, o.shuffle);
        double loss_sum = 0, t0 = pt_now(), last_bar = 0;
        long correct = 0, samples = 0;
        for (long s = 0; s < steps_per_epoch && step < total_steps; s++, step++) {
            exec_step_result r;
            if (step == o.warmup) exec_reset_stats(ex);
            double ts = pt_now();
            /* the next step's samples, loaded while this one computes (not across epochs:
             * the next order is drawn after evaluation) */
            const int64_t *next = s + 1 < steps_per_epoch && step + 1 < total_steps
                                      ? order + (s + 1) * o.batch : NULL;
            int src = exec_train_step(ex, &train, order + s * o.batch, next, o.seed,
                                      (uint64_t)step, &o.opt, &r);
            if (src == EXEC_FAILED_EVERYWHERE) {
                if (tty) printf("\n");
                if (rank == 0) fprintf(stderr, "pipetrain: %s\n", pt_error_get());
                goto done;
            }
            if (src) abort_job(comm);
            if (step >= o.warmup) {
                t_timed += pt_now() - ts;
                timed_steps++;
            }
            loss_sum += r.loss_sum;
            correct += r.correct;
            samples += o.batch;
            if (tty && pt_now() - last_bar > 0.2) {
                last_bar = pt_now();
                progress(ep + 1, epochs, s + 1, steps_per_epoch, loss_sum / samples);
            }
        }
        double dt = pt_now() - t0;
        t_train += dt;
        epoch_loss = loss_sum / samples;
        epoch_correct = correct;
        epoch_samples = samples;
        double val_loss;
        if (val.count && exec_evaluate(ex, &val, &val_loss, &val_acc)) abort_job(comm);
        if (test.count && exec_evaluate(ex, &test, &test_loss, &test_acc)) abort_job(comm);
        if (tty) printf("\r%*s\r", 80, "");
        if (rank == 0 && !o.json) {
            printf("epoch %d/%d  train loss %.4f acc %.4f", ep + 1, epochs, epoch_loss,
                   (double)correct / samples);
            if (val.count) printf("  val acc %.4f", val_acc);
            if (test.count) printf("  test loss %.4f acc %.4f", test_loss, test_acc);
            printf("  %.1f s  %.0f samples/s\n", dt, samples / dt);
            fflush(stdout);
        }
    }

    /* Per-stage figures, on every rank. */
    stage_figures fig;
    if (gather_figures(ex, comm, o.timeout, &fig)) abort_job(comm);
    if (o.trace && exec_write_trace(ex, o.trace)) {
        if (pt_mpi_failed()) abort_job(comm);
        if (rank == 0) fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        figures_free(&fig);
        goto done;
    }
    if (o.save) {
        if (rank == 0) all = malloc(net.param_count * sizeof *all + 1);
        if (agree(rank == 0 && !all ? pt_error_set("out of memory for the checkpoint") : 0,
                  comm, o.timeout)) {
            figures_free(&fig);
            goto done;
        }
        int ok = exec_gather_params(ex, all);
        if (!ok && rank == 0) ok = checkpoint_save(o.save, &net, all);
        if (agree(ok, comm, o.timeout)) {
            figures_free(&fig);
            goto done;
        }
    }
    double samples_per_s = t_timed > 0 ? (double)timed_steps * o.batch / t_timed : 0;
    if (rank == 0) {
        double theory = schedule_bubble_theory(o.stages, o.microbatches);
        double simulated = simulated_bubble(&sched, &fig, o.microbatches);
        if (!o.json) {
            printf("done: %ld steps in %.1f s, %.0f samples/s", step, t_train, samples_per_s);
            if (size > 1) {
                printf("; bubble %.3f measured, %.3f simulated from the measured stage times, "
                       "%.3f for balanced stages ((K-1)/(M+K-1))\n", fig.bubble, simulated,
                       theory);
                for (int r = 0; r < size; r++)
                    printf("  stage %d: compute %.2f s of %.2f s, peak activations %.2f MB "
                           "(%.0f micro-batch%s)\n", r, fig.compute[r], fig.wall[r],
                           fig.peak_bytes[r] / 1e6, fig.peak_mb[r],
                           fig.peak_mb[r] == 1 ? "" : "es");
            } else {
                printf("\n");
            }
            if (o.save) printf("saved %s\n", o.save);
            if (o.trace) printf("trace %s\n", o.trace);
        } else {
            printf("{\"model\":\"%s\",\"samples_per_s\":%.3f,\"train_loss\":%.6f,"
                   "\"train_acc\":%.6f,\"test_loss\":%.6f,\"test_acc\":%.6f,\"val_acc\":%.6f,"
                   "\"steps\":%ld,\"epochs\":%d,\"params\":%zu,\"wall_s\":%.3f,"
                   "\"train_s\":%.3f,\"batch\":%d,\"threads\":%d,\"device\":\"%s\","
                   "\"optimizer\":\"%s\","
                   "\"stages\":%d,\"microbatches\":%d,\"schedule\":\"%s\",\"partition\":\"%s\","
                   "\"bubble\":%.6f,\"bubble_theory\":%.6f,\"bubble_simulated\":%.6f",
                   o.model, samples_per_s, epoch_loss,
                   epoch_samples ? (double)epoch_correct / epoch_samples : 0.0,
                   isnan(test_loss) ? -1.0 : test_loss, isnan(test_acc) ? -1.0 : test_acc,
                   isnan(val_acc) ? -1.0 : val_acc, step, epochs, net.param_count,
                   pt_now() - t_start, t_train, o.batch, o.threads, o.device == ENGINE_CUDA ? "cuda" : "cpu",
                   optimizer_name(o.opt.kind),
                   o.stages, o.microbatches, sched.name, o.partition, fig.bubble, theory,
                   simulated);
            print_json_array("stage_compute_s", fig.compute, size);
            print_json_array("stage_wall_s", fig.wall, size);
            print_json_array("stage_forward_s", fig.forward, size);
            print_json_array("stage_backward_s", fig.backward, size);
            print_json_array("stage_peak_act_bytes", fig.peak_bytes, size);
            print_json_array("stage_peak_microbatches", fig.peak_mb, size);
            printf("}\n");
        }
        fflush(stdout);
    }
    figures_free(&fig);
    rc = 0;
done:
    free(all);
    free(order);
    exec_free(ex);
    data_free(&train);
    data_free(&val);
    data_free(&test);
    schedule_free(&sched);
    partition_free(&part);
    net_desc_free(&net);
    return rc;
}
