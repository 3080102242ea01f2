/* `pipetrain train`: sequential or pipelined training on Fashion-MNIST-style IDX data.
 * Every rank parses the same options and loads the same files; setup errors are gathered
 * with a collective so that every rank exits non-zero and one of them says why. The
 * banner, progress and reports are in src/train_report.c. */
#include "src/train/train.h"

#include <sched.h>
#include <getopt.h>
#include <limits.h>
#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/rng.h"
#include "src/io/checkpoint.h"
#include "src/base/clock.h"
#include "src/runtime/cuda_plugin.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "src/runtime/exec.h"
#include "src/train/metrics.h"
#include "src/train/train_checkpoint.h"
#include "src/base/options.h"
#include "src/train/train_options.h"
#include "src/train/train_report.h"
#include "src/runtime/profile.h"
#include "src/runtime/replicas.h"
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
        mpi_wait_allreduce(&first_bad, 1, MPI_INT, MPI_MIN, comm, timeout)) {
        /* a rank that never arrives may be hung: only ending the job helps */
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        fflush(stderr);
        pt_mpi_abort(comm, 1);
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
    /* interleaved schedules cut the layers into K·V model chunks */
    int parts = o->stages * o->virtual_stages;
    if (partition_check(net->n_layers, parts)) return -1;
    partition_profile prof = {0};
    /* One stage needs no cut, and so no profile. */
    int have_profile = !strcmp(o->partition, "time") && parts > 1;
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
        if (mpi_wait_allreduce(&ok, 1, MPI_INT, MPI_MIN, comm, o->timeout)) rc = -1;
        if (mpi_wait_collective(&req, comm, o->timeout)) rc = -1;
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
    if (!rc && parts == 1 && !strcmp(o->partition, "time"))
        rc = partition_uniform(part, net->n_layers, 1);
    else if (!rc) rc = partition_by_method(part, o->partition, net, have_profile ? &prof : NULL,
                                           parts);
    if (!rc && rank == 0 && !o->json && parts > 1) {
        printf("partition (%s):\n", o->partition);
        partition_print(part, net, have_profile ? &prof : NULL, stdout);
    }
    partition_profile_free(&prof);
    return rc;
}

/* The schedule the options name, with recomputation on the stages --recompute lists. */
static int make_schedule(const train_options *o, schedule *s)
{
    int K = o->stages, flags[K];
    if (schedule_parse_recompute(o->recompute, K, flags)) return -1;
    if (schedule_init_named(s, o->schedule, K, o->virtual_stages, o->microbatches)) return -1;
    int any = 0;
    for (int k = 0; k < K; k++) any |= flags[k];
    if (any && schedule_add_recompute(s, flags)) {
        schedule_free(s);
        return -1;
    }
    return 0;
}

/* ---- per-stage figures at the end of a run ---- */

static void figures_free(stage_figures *f)
{
    free(f->chunk);
    free(f->compute);
    memset(f, 0, sizeof *f);
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
    for (int r = 0; r < K; r++) f->bubble += f->wall[r] > 0 ? 1 - f->compute[r] / f->wall[r] : 0;
    f->bubble /= K;
    /* per model chunk c = v·K + stage, each kind of op */
    int C = K * st.chunks;
    f->chunks = C;
    f->chunk = calloc((size_t)C * EXEC_TIMES, sizeof *f->chunk);
    if (!f->chunk) {
        figures_free(f);
        return pt_error_set("out of memory");
    }
    for (int v = 0; v < st.chunks; v++)
        for (int t = 0; t < EXEC_TIMES; t++)
            f->chunk[(size_t)t * C + v * K + me] = st.chunk_s[v * EXEC_TIMES + t];
    if (mpi_wait_allreduce(f->chunk, C * EXEC_TIMES, MPI_DOUBLE, MPI_SUM, run->comm,
                       run->o.timeout)) {
        figures_free(f);
        return -1;
    }
    for (int i = 0; i < C * EXEC_TIMES; i++) f->chunk[i] /= copies;
    return 0;
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
    /* mpiexec may end the job before it has forwarded the message (seen under load): give
     * it a moment */
    nanosleep(&(struct timespec){.tv_nsec = 200000000}, NULL);
    pt_mpi_abort(comm, 1);
}

/* The seed's initialisation, then the checkpoint's values when --load names one. */
static int init_chunk(engine *eng, const train_options *o, const net_desc *net, int first,
                      int last, const shard_plan *sp, int t)
{
    if (engine_init_params(eng, o->seed)) return -1;
    if (!o->load) return 0;
    /* a checkpoint holds whole tensors: with tensor shards, this rank takes its slices */
    size_t whole = 0;
    for (int l = first; l < last; l++)
        whole += net->layers[l].weight_count + net->layers[l].bias_count;
    float *p = malloc((whole + eng->param_count + 1) * sizeof *p);
    if (!p) return pt_error_set("out of memory for the checkpoint");
    int rc = checkpoint_load_layers(o->load, net, first, last, p);
    float *mine = p;
    if (!rc && sp->T > 1) {
        mine = p + whole;
        shard_copy_layers(sp, net, first, last, t, mine, p, 1);
    }
    if (!rc) rc = engine_write_params(eng, mine);
    free(p);
    return rc;
}

/* Every model chunk this rank holds (one, unless the schedule is interleaved). */
static int init_parameters(train_run *run)
{
    const train_options *o = &run->o;
    for (int v = 0; v < exec_chunks(run->ex); v++) {
        int c = v * o->stages + run->stage;
        if (init_chunk(exec_chunk_engine(run->ex, v), o, &run->net, run->part.first[c],
                       run->part.first[c + 1], &run->shard, run->tensor_rank))
            return -1;
    }
    return 0;
}

/* ---- set-up ---- */

/* Where and when: the host and start time of the run's metadata. */
static void stamp_start(train_run *run)
{
    if (gethostname(run->host, sizeof run->host - 1)) run->host[0] = '\0';
    time_t now = time(NULL);
    struct tm utc;
    if (gmtime_r(&now, &utc))
        strftime(run->start_time, sizeof run->start_time, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

/* One rank per stage of each replica; the message says how to launch the job. */
static int check_ranks(const train_run *run)
{
    int stages = run->o.stages, replicas = run->o.replicas, T = run->o.tensor;
    long need = (long)stages * replicas * T;
    if (run->size == need) return 0;
    if (run->rank == 0 && T > 1)
        fprintf(stderr, "pipetrain: --stages %d × --replicas %d × --tensor %d needs exactly %ld "
                "MPI ranks, the job has %d (run: mpiexec -n %ld pipetrain train ... --stages %d "
                "--replicas %d --tensor %d)\n", stages, replicas, T, need, run->size, need,
                stages, replicas, T);
    else
    if (run->rank == 0 && replicas > 1)
        fprintf(stderr, "pipetrain: --stages %d × --replicas %d needs exactly %ld MPI ranks, "
                "the job has %d (run: mpiexec -n %ld pipetrain train ... --stages %d "
                "--replicas %d)\n", stages, replicas, need, run->size, need, stages, replicas);
    else if (run->rank == 0)
        fprintf(stderr, "pipetrain: --stages %d needs exactly %d MPI rank%s, the job has %d "
                "(run: mpiexec -n %d pipetrain train ... --stages %d)\n", stages, stages,
                stages > 1 ? "s" : "", run->size, stages, stages);
    return -1;
}

/* FNV-1a over the arguments and their separators. */
static uint64_t hash_args(int argc, char **argv)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < argc; i++)
        for (const char *c = argv[i];; c++) {
            h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
            if (!*c) break;
        }
    return h;
}

/* Every rank parsed its own command line (mpiexec's MPMD syntax can give each its own): a
 * rank whose line was refused, or lines that differ between ranks, end every rank with a
 * message from one of them. Returns prc (0, or 1 for --help) when all agree, else the
 * exit status. */
static int agree_options(const train_run *run, int prc, int argc, char **argv)
{
    /* one MIN gives the first failing rank and both the least and the greatest hash (as
     * signed 63-bit values: MPICH 4.0.2 compares MPI_UINT64_T as signed) */
    int64_t h = (int64_t)(hash_args(argc, argv) >> 1);
    int64_t v[3] = {prc < 0 ? (int64_t)run->rank : INT64_MAX, h, INT64_MAX - h};
    MPI_Request req;
    double timeout = prc == 0 ? run->o.timeout : 300;
    if (PT_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, v, 3, MPI_INT64_T, MPI_MIN, run->comm, &req)) ||
        mpi_wait_collective(&req, run->comm, timeout))
        abort_job(run->comm);
    if (v[0] != INT64_MAX) {
        if (run->rank == v[0]) {
            if (run->rank == 0) fprintf(stderr, "pipetrain: %s\n", pt_error_get());
            else fprintf(stderr, "pipetrain: rank %d: %s\n", run->rank, pt_error_get());
        }
        return PT_EXIT_USAGE;
    }
    if (v[1] != INT64_MAX - v[2]) {
        if (run->rank == 0)
            fprintf(stderr, "pipetrain: the ranks were started with different options: every "
                    "rank of a job must run the same command line (mpiexec -n N pipetrain "
                    "train ...)\n");
        return PT_EXIT_USAGE;
    }
    return prc;
}

static replicas_config replicas_of(const train_options *o)
{
    double bytes = o->bucket_mb * 1048576.0;
    return (replicas_config){
        .replicas = o->replicas, .method = o->reduce,
        .bucket_bytes = bytes < 1 ? 1 : bytes > 1e18 ? (size_t)1e18 : (size_t)bytes,
        .overlap = o->overlap, .microbatches = o->microbatches,
        .skip_bucket = o->skip_bucket, .timeout_s = o->timeout,
    };
}

/* Where this rank sits (stage, replica), its pipeline's and its group's communicators, and
 * the kind of link between the group's ranks (for the predicted reduction time). */
static int setup_layout(train_run *run)
{
    const train_options *o = &run->o;
    /* tensor groups innermost, then replicas, stages outermost:
     * world rank = t + T × (stage × replicas + replica) */
    int T = o->tensor, rest = run->rank / T;
    run->tensor_rank = run->rank % T;
    if (PT_MPI_CALL(MPI_Comm_split(run->comm, rest, run->tensor_rank, &run->tensor)) ||
        PT_MPI_CALL(MPI_Comm_split(run->comm, run->tensor_rank, rest, &run->tensor_world)))
        return -1;
    if (reduce_layout_default(rest, o->stages, o->replicas, &run->stage, &run->replica))
        return -1;
    if (reduce_comms_init(&run->comms, run->tensor_world, o->stages, o->replicas, run->stage,
                          run->replica, o->timeout))
        return -1;
    /* the group on one host: shared memory; else the network */
    MPI_Comm node;
    int local = 0, size = 0;
    if (PT_MPI_CALL(MPI_Comm_split_type(run->comms.group, MPI_COMM_TYPE_SHARED, 0,
                                        MPI_INFO_NULL, &node)))
        return -1;
    int rc = PT_MPI_CALL(MPI_Comm_size(node, &local)) ||
             PT_MPI_CALL(MPI_Comm_size(run->comms.group, &size)) ||
             PT_MPI_CALL(MPI_Comm_free(&node));
    int one_host = local == size;
    if (!rc) rc = mpi_wait_allreduce(&one_host, 1, MPI_INT, MPI_MIN, run->comm, o->timeout);
    run->reduce_link = one_host ? TOPO_LINK_SAME_L3 : TOPO_LINK_CROSS_NODE;
    return rc;
}

/* Threads: each rank gets its share of the node's cores unless told otherwise. */
static int setup_threads(train_run *run)
{
    train_options *o = &run->o;
    MPI_Comm comm = run->comm;
    int blas_threads = 0;
    /* the cores this job may use on the node, before binding narrows them per rank */
    cpu_set_t set;
    long cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                             : sysconf(_SC_NPROCESSORS_ONLN);
    MPI_Comm node;
    int local = 1;
    if (PT_MPI_CALL(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, run->rank, MPI_INFO_NULL,
                                        &node)) ||
        PT_MPI_CALL(MPI_Comm_size(node, &local)) || PT_MPI_CALL(MPI_Comm_free(&node)))
        abort_job(comm);
    if (agree(topo_bind_rank(comm, o->bind, o->verbose, &blas_threads), comm, o->timeout))
        return -1;
    if (!o->threads) {
        if (blas_threads > 0)
            o->threads = blas_threads;
        else
            o->threads = cores / local > 0 ? (int)(cores / local) : 1;
    }
    /* Spinning waits only where every thread of the node's ranks has a core of its own:
     * decided on each node alike, since its ranks have the same counts. */
    if (o->wait == WAIT_AUTO)
        o->wait = (long)local * o->threads <= cores ? WAIT_SPIN : WAIT_SLEEP;
    mpi_wait_set_mode(o->wait);
    /* The stage's own workers split each micro-batch; BLAS stays single-threaded so that
     * two thread pools never fight over the cores. */
    openblas_set_num_threads(1);
    return 0;
}

/* A GPU per rank: by local rank, or nearest to the rank's cores when it is bound. */
static int setup_gpu(train_run *run)
{
    if (run->o.device != ENGINE_CUDA) return 0;
    const cuda_plugin *cp = NULL;
    if (agree(cuda_plugin_load(&cp), run->comm, run->o.timeout)) return -1;
    if (agree(cuda_pick_device(run->comm, cp, run->o.verbose, &run->gpu, &run->gpu_info),
              run->comm, run->o.timeout))
        return -1;
    run->device_messages = cuda_mpi_aware();
    return 0;
}

/* --steps alone runs that many steps, crossing epochs; --epochs alone (or neither: 1) runs
 * whole epochs; both stop at whichever limit comes first. */
static void plan_steps(train_run *run)
{
    const train_options *o = &run->o;
    long per_epoch = run->train.count / o->batch; /* ≥ 1: load_data checked */
    long total = per_epoch * o->epochs;
    if (o->steps > 0 && (!o->epochs_given || o->steps < total)) total = o->steps;
    run->steps_per_epoch = per_epoch;
    run->total_steps = total;
    run->epochs = total / per_epoch + (total % per_epoch != 0);
}

/* How the layers are cut across the tensor group (every rank plans all of them), and the
 * net as this rank runs it. */
static int setup_shards(train_run *run)
{
    const train_options *o = &run->o;
    if (shard_plan_init(&run->shard, &run->net, o->tensor, o->tensor_mode)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pt_error_get());
        return pt_error_set("%s: %s", o->model, msg);
    }
    return o->tensor > 1 ? shard_local_net(&run->local_net, &run->shard, &run->net,
                                           run->tensor_rank)
                         : 0;
}

/* The tensor group's α–β figures (the ring all-reduce's: 2(T−1)·α + 2(T−1)/T·n/β), from
 * timed all-reduces of one float and of 4 MiB; the slowest group's, on every rank. */
static int calibrate_tensor(train_run *run)
{
    int T = run->o.tensor;
    if (T < 2) return 0;
    enum { REPS = 5, BIG = 1 << 20 };
    float *buf = calloc(BIG, sizeof *buf);
    if (!buf) return pt_error_set("out of memory");
    double t[2] = {0, 0};
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        int n = k ? BIG : 1;
        for (int r = 0; r <= REPS && !rc; r++) {
            double t0 = pt_now();
            rc = mpi_wait_allreduce(buf, n, MPI_FLOAT, MPI_SUM, run->tensor, run->o.timeout);
            if (r > 0) t[k] += (pt_now() - t0) / REPS; /* the first one warms up */
        }
    }
    free(buf);
    if (!rc) rc = mpi_wait_allreduce(t, 2, MPI_DOUBLE, MPI_MAX, run->comm, run->o.timeout);
    if (rc) return -1;
    run->tensor_alpha = t[0] / (2.0 * (T - 1));
    double per_byte = (t[1] - t[0]) / (2.0 * (T - 1) / T * BIG * sizeof(float));
    run->tensor_beta = per_byte > 0 ? 1 / per_byte : 1e12;
    return 0;
}

/* Model, partition, schedule, data, executor and parameters, agreed on by every rank. */
/* Rank 0 writes --save, --trace and --metrics: their directories must exist and be
 * writable now, not after the whole run (and a restart would only fail the same way). */
static int check_outputs(const train_options *o, int rank)
{
    const char *paths[] = {o->save, o->trace, o->metrics};
    const char *names[] = {"--save", "--trace", "--metrics"};
    for (int i = 0; rank == 0 && i < 3; i++) {
        if (!paths[i]) continue;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", paths[i]);
        char *slash = strrchr(dir, '/');
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (slash == dir) dir[1] = '\0';
        else *slash = '\0';
        if (access(dir, W_OK | X_OK) != 0)
            return pt_error_set("%s %s: cannot write in %s: %s", names[i], paths[i], dir,
                                strerror(errno));
    }
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

static int setup_run(train_run *run)
{
    const train_options *o = &run->o;
    MPI_Comm comm = run->comm;
    run->rep = replicas_of(o);
    if (agree(check_outputs(o, run->rank), comm, o->timeout)) return -1;
    if (agree(setup_layout(run), comm, o->timeout)) return -1;
    if (agree(net_desc_load(&run->net, o->model), comm, o->timeout)) return -1;
    if (agree(setup_shards(run), comm, o->timeout)) return -1;
    if (agree(choose_partition(o, &run->net, &run->part, comm, run->rank, run->gpu), comm,
              o->timeout))
        return -1;
    if (agree(make_schedule(o, &run->sched), comm, o->timeout)) return -1;
    if (agree(replicas_schedule(&run->sched, o->tensor > 1 ? &run->local_net : &run->net,
                                &run->part, &run->rep),
              comm, o->timeout))
        return -1;
    double t_read = pt_now();
    int read_rc = load_data(o, &run->net, &run->train, &run->val, &run->test);
    run->read_s = pt_now() - t_read;
    if (agree(read_rc, comm, o->timeout))
        return -1;
    exec_config cfg = {
        .batch = o->batch,
        .microbatches = o->microbatches,
        .threads = o->threads,
        .timeout_s = o->timeout,
        .trace = o->trace != NULL,
        .stall_rank = o->stall_rank,
        .stall_step = o->stall_step,
        .stall_kills = o->kill,
        .device = o->device,
        .gpu = run->gpu,
        .device_messages = run->device_messages,
        .debug_ready_delay = o->ready_delay,
        .wgrad_batched = o->wgrad_batched,
        .world = comm,
        .group = run->comms.group,
        .replica = run->replica,
        .rep = run->rep,
        .shard = &run->shard,
        .tensor_rank = run->tensor_rank,
        .tensor = run->tensor,
        .local_net = o->tensor > 1 ? &run->local_net : NULL,
    };
    if (agree(exec_init(&run->ex, run->comms.pipeline, &run->net, &run->part, &run->sched,
                        &cfg),
              comm, o->timeout))
        return -1;
    if (exec_start(run->ex)) abort_job(comm);
    if (calibrate_tensor(run)) abort_job(comm);
    if (agree(init_parameters(run), comm, o->timeout))
        return -1;
    run->order = malloc((size_t)run->train.count * sizeof *run->order);
    if (agree(run->order ? 0 : pt_error_set("out of memory"), comm, o->timeout)) return -1;
    plan_steps(run);
    return 0;
}

static void run_free(train_run *run)
{
    metrics_close(run->metrics);
    free(run->metrics_prev);
    free(run->order);
    exec_free(run->ex);
    data_free(&run->train);
    data_free(&run->val);
    data_free(&run->test);
    schedule_free(&run->sched);
    partition_free(&run->part);
    shard_plan_free(&run->shard);
    if (run->local_net.layers) net_desc_free(&run->local_net);
    net_desc_free(&run->net);
    reduce_comms_free(&run->comms);
    if (run->tensor != MPI_COMM_NULL) MPI_Comm_free(&run->tensor);
    if (run->tensor_world != MPI_COMM_NULL) MPI_Comm_free(&run->tensor_world);
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
    return agree(rc, run->comm, o->timeout);
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
        /* the figures restart after --warmup: then the interval is what came since */
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
        json_object_set_new(line, "loss", json_real(run->metrics_loss / (double)samples));
        json_object_set_new(line, "acc", json_real((double)run->metrics_correct / (double)samples));
        json_object_set_new(line, "samples_per_s", json_real(dt > 0 ? samples / dt : 0));
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
        abort_job(run->comm);
    if (run->test.count && exec_evaluate(run->ex, &run->test, &res->test_loss, &res->test_acc))
        abort_job(run->comm);
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
    shuffle_indices(run->order, run->train.count, o->seed, ep, o->shuffle);
    double loss_sum = 0, t0 = pt_now();
    long correct = 0, samples = 0;
    for (long s = s0; s < n; s++) {
        long step = res->steps;
        if (step == o->warmup) exec_reset_stats(run->ex);
        double ts = pt_now();
        /* the next step's samples, loaded while this one computes (not across epochs: the
         * next order is drawn after evaluation) */
        const int64_t *next = s + 1 < n ? run->order + (s + 1) * o->batch : NULL;
        exec_step_result r;
        int src = exec_train_step(run->ex, &run->train, run->order + s * o->batch, next,
                                  o->seed, (uint64_t)step, &o->opt, &r);
        if (src == EXEC_FAILED_EVERYWHERE) {
            train_progress_clear(prog);
            if (run->rank == 0) fprintf(stderr, "pipetrain: %s\n", pt_error_get());
            return -1;
        }
        if (src) abort_job(run->comm);
        double dt = pt_now() - ts;
        if (step >= o->warmup) {
            res->timed_s += dt;
            res->timed_steps++;
        }
        res->steps++;
        if (res->steps == (run->resumed_from_step > 0 ? run->resumed_from_step : 0) + 1)
            note_first_step(run);
        loss_sum += r.loss_sum;
        correct += r.correct;
        samples += o->batch;
        int due = train_checkpoint_due(run, res->steps);
        if (due < 0 || (due && train_checkpoint_save(run, res->steps))) abort_job(run->comm);
        if (o->metrics) {
            run->metrics_loss += r.loss_sum;
            run->metrics_correct += r.correct;
            run->metrics_samples += o->batch;
            if (res->steps % o->log_every == 0 && metrics_step(run, ep, res->steps))
                abort_job(run->comm);
        }
        train_progress_step(prog, run, ep + 1, dt, loss_sum / samples);
    }
    double epoch_s = pt_now() - t0;
    res->train_s += epoch_s;
    res->epochs = ep + 1;
    res->train_loss = loss_sum / samples;
    res->train_acc = (double)correct / samples;
    evaluate(run, res);
    train_progress_clear(prog);
    train_report_epoch(run, res, epoch_s, samples);
    metrics_epoch(run, res, epoch_s, samples);
    return 0;
}

static int train_loop(train_run *run, train_results *res)
{
    *res = (train_results){
        .train_loss = NAN, .train_acc = NAN,
        .val_loss = NAN, .val_acc = NAN, .test_loss = NAN, .test_acc = NAN,
        .t_begin = pt_now(),
    };
    train_progress prog;
    train_progress_init(&prog, run);
    long start = run->resumed_from_step > 0 ? run->resumed_from_step : 0;
    res->steps = start;
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
    if (run->rank == 0) all = malloc(run->net.param_count * sizeof *all + 1);
    if (agree(run->rank == 0 && !all ? pt_error_set("out of memory for the checkpoint") : 0,
              run->comm, run->o.timeout))
        return -1;
    int err = run->replica == 0 ? exec_gather_params(run->ex, all) : 0;
    if (!err && run->rank == 0) err = checkpoint_save(run->o.save, &run->net, all);
    free(all);
    return agree(err, run->comm, run->o.timeout);
}

/* Figures, checkpoint, trace and report. Each output is attempted even when another one
 * failed (a trace that cannot be written must not cost the checkpoint); every failure is
 * reported. Returns the exit status. */
static int finish_run(train_run *run, train_results *res)
{
    stage_figures fig;
    if (gather_figures(run, &fig)) abort_job(run->comm);
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
        if (agree(exec_write_trace(run->ex, run->o.trace), run->comm, run->o.timeout)) failed++;
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

int train_main(int argc, char **argv)
{
    train_run run = {.comm = MPI_COMM_WORLD,
                     .comms = {.pipeline = MPI_COMM_NULL, .group = MPI_COMM_NULL},
                     .tensor = MPI_COMM_NULL, .tensor_world = MPI_COMM_NULL};
    if (PT_MPI_CALL(MPI_Comm_rank(run.comm, &run.rank)) ||
        PT_MPI_CALL(MPI_Comm_size(run.comm, &run.size)))
        abort_job(run.comm);
    stamp_start(&run);

    int prc = agree_options(&run, train_options_parse(&run.o, argc, argv), argc, argv);
    if (prc == 1) {
        if (run.rank == 0) train_options_usage(stdout);
        return 0;
    }
    if (prc) return prc;
    /* Exit statuses: what is found before training starts (options, ranks, model, data,
     * checkpoints, output paths, the device) is the input's fault: PT_EXIT_USAGE, which
     * `pipetrain launch` never restarts; a failure while training is PT_EXIT_FAIL. */
    if (check_ranks(&run)) return PT_EXIT_USAGE;
    if (setup_threads(&run) || setup_gpu(&run)) return PT_EXIT_USAGE;

    int rc = PT_EXIT_USAGE;
    train_results res;
    run.last_checkpoint_step = -1;
    run.ckpt_req = MPI_REQUEST_NULL;
    run.ckpt_t_last = pt_now();
    if (!setup_run(&run) && !train_checkpoint_setup(&run) && !metrics_start(&run)) {
        train_report_banner(&run);
        rc = PT_EXIT_FAIL;
        if (!train_loop(&run, &res)) rc = finish_run(&run, &res);
        else train_checkpoint_finish(&run); /* a write in progress lands before the exit */
    }
    run_free(&run);
    return rc;
}
