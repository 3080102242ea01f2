/* The set-up of a `train` run (src/train/train_setup.h): options, ranks, threads, GPU,
 * layout, model, shards, partition, schedule, data, executor and parameters. Every rank
 * parses the same options and loads the same files; set-up errors are gathered with a
 * collective (train_agree) so that every rank exits non-zero and one of them says why. */
#include "src/train/train_setup.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "src/base/options.h"
#include "src/base/output.h"
#include "src/base/stop_signal.h"
#include "src/io/checkpoint.h"
#include "src/io/checkpoint_dir.h"
#include "src/runtime/cuda_plugin.h"
#include "src/runtime/exec.h"
#include "src/runtime/profile.h"
#include "src/runtime/replicas.h"
#include "src/train/metrics.h"
#include "src/train/train_options.h"
#include "src/train/train_text.h"
#include "topologies/topo.h"

/* ---- collective error handling ---- */

/* Every rank calls this after a setup phase with its own status. If any failed, the lowest
 * failing rank prints its message (naming rank and host when there are several ranks) and
 * every rank returns −1, so that all of them exit non-zero. */
int train_agree(int status, MPI_Comm comm, double timeout)
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

/* Ends the job on every rank: a rank that timed out cannot count on the others. */
void train_abort_job(MPI_Comm comm)
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

/* ---- pieces of the set-up ---- */

/* One split: the files the options name, else --data's in Fashion-MNIST's names; the first
 * `limit` samples (−1: all). */
static int load_split(dataset *d, const char *images, const char *labels, const char *dir,
                      const char *prefix, const net_desc *net, long limit)
{
    if (images) return data_load_idx(d, images, labels, &net->input, net->classes, limit);
    return data_load_dir(d, dir, prefix, &net->input, net->classes, limit);
}

static int load_data(const train_options *o, const net_desc *net, dataset *train,
                     dataset *val, dataset *test)
{
    memset(val, 0, sizeof *val);
    memset(test, 0, sizeof *test);
    if (net->sequence)
        return pt_error_set("%s is a language model: give it text (--data " TEXT_DATA_NAME
                            ", the built-in corpus; --text FILE; --tokens FILE), not images",
                            o->model);
    /* only the samples the run uses are read: --val takes the last ones, so all then */
    long train_limit = !o->val && o->train_samples > 0 ? o->train_samples : -1;
    long test_limit = o->test_samples >= 0 ? o->test_samples : -1;
    if (load_split(train, o->train_images, o->train_labels, o->data, "train", net, train_limit))
        return -1;
    /* a user's training files without test files: no test set */
    if ((o->test_images || !o->train_images) &&
        load_split(test, o->test_images, o->test_labels, o->data, "t10k", net, test_limit))
        return -1;
    if (o->val && data_split_tail(train, val, o->val)) return -1;
    if (o->train_samples > 0 && o->train_samples < train->count)
        train->count = (int)o->train_samples;
    if (o->test_samples >= 0 && o->test_samples < test->count) test->count = (int)o->test_samples;
    if (train->count < o->batch)
        return pt_error_set("the training set has %d samples, fewer than one batch of %d",
                            train->count, o->batch);
    return 0;
}

/* Rank 0 profiles the layers (with the split backward on a CPU when the schedule is
 * searched: the search prices B and W apart) and every rank takes its figures, so that all
 * cut and search alike. */
static int share_profile(const train_options *o, const net_desc *net, partition_profile *prof,
                         MPI_Comm comm, int rank, int gpu, int split)
{
    int n = net->n_layers, rows = split ? 4 : 2, rc = 0, ok = 1;
    double *costs = calloc((size_t)rows * n, sizeof *costs);
    if (!costs) return pt_error_set("out of memory");
    if (rank == 0) {
        int mb = o->batch / o->microbatches;
        profile_options po = {.batch = mb, .warmup = 2, .repeats = 5, .device = o->device,
                              .gpu = gpu, .split = split, .precision = o->precision};
        if (partition_profile_measure_with(prof, net, &po)) {
            ok = 0;
        } else {
            const double *from[4] = {prof->fwd_s, prof->bwd_s, prof->bwd_input_s,
                                     prof->bwd_weight_s};
            for (int r = 0; r < rows; r++)
                for (int l = 0; l < n; l++)
                    /* no split measured (a GPU): half of the backward each */
                    costs[(size_t)r * n + l] = from[r] ? from[r][l] : prof->bwd_s[l] / 2;
            partition_profile_free(prof);
        }
    }
    MPI_Request req;
    if (PT_MPI_CALL(MPI_Ibcast(costs, rows * n, MPI_DOUBLE, 0, comm, &req))) {
        free(costs);
        return -1;
    }
    if (mpi_wait_allreduce(&ok, 1, MPI_INT, MPI_MIN, comm, o->timeout)) rc = -1;
    if (mpi_wait_collective(&req, comm, o->timeout)) rc = -1;
    if (!rc && !ok) rc = rank == 0 ? -1 : pt_error_set("rank 0 could not profile the layers");
    if (!rc) {
        *prof = (partition_profile){.n_layers = n};
        double **to[4] = {&prof->fwd_s, &prof->bwd_s, &prof->bwd_input_s, &prof->bwd_weight_s};
        for (int r = 0; r < rows && !rc; r++) {
            *to[r] = malloc((size_t)n * sizeof(double));
            if (!*to[r]) rc = pt_error_set("out of memory");
            else memcpy(*to[r], costs + (size_t)r * n, (size_t)n * sizeof(double));
        }
    }
    free(costs);
    return rc;
}

/* --schedule search: each model chunk's F, B and W of one micro-batch from the profile (B
 * and W half of the backward each where it was not split), recomputation (a forward) on
 * the ranks `recompute` flags; messages are not priced (ranks on one host: small beside
 * the layers). The same figures on every rank, so every rank
 * finds the same schedule. */
static int search_schedule(const train_options *o, const partition *part,
                           const partition_profile *prof, const int *recompute, schedule *s,
                           double *step)
{
    int C = part->stages;
    double mb = (double)o->batch / ((double)o->replicas * o->microbatches);
    double *c = calloc(4 * (size_t)C, sizeof *c);
    if (!c) return pt_error_set("out of memory");
    for (int k = 0; k < C; k++)
        for (int l = part->first[k]; l < part->first[k + 1]; l++) {
            c[k] += prof->fwd_s[l] * mb;
            c[C + k] += (prof->bwd_input_s ? prof->bwd_input_s[l] : prof->bwd_s[l] / 2) * mb;
            c[2 * C + k] += (prof->bwd_weight_s ? prof->bwd_weight_s[l] : prof->bwd_s[l] / 2) * mb;
            c[3 * C + k] += prof->bwd_s[l] * mb;
        }
    /* a layer without parameters has no W: the search needs costs > 0 */
    for (int k = 0; k < 4 * C; k++)
        if (!(c[k] > 1e-9)) c[k] = 1e-9;
    schedule_search_config cfg = {.stages = o->stages, .microbatches = o->microbatches,
                                  .virtual_stages = o->virtual_stages, .fwd = c,
                                  .bwd_input = c + C, .bwd_weight = c + 2 * C, .bwd = c + 3 * C,
                                  .memory = o->schedule_memory, .recompute = recompute};
    schedule_search_result r;
    int rc = schedule_search(s, &cfg, &r);
    free(c);
    if (step) *step = r.step;
    return rc;
}

/* --schedule search with V = 2 and a cut by cost: the V's pairs' cut (in *part) and the
 * chunks' one each searched, the shorter simulated step's kept, as plan_build keeps it (the
 * search's candidates in a V want the first, the interleaved ones the second). */
static int search_both_cuts(const train_options *o, const net_desc *net,
                            const partition_profile *prof, partition *part)
{
    int K = o->stages, flags[K];
    partition chunks;
    schedule a, b;
    double ta, tb;
    if (schedule_parse_recompute(o->recompute, K, flags) ||
        partition_by_method_placed(&chunks, o->partition, net, prof, K, 2, 0))
        return -1;
    if (search_schedule(o, part, prof, flags, &a, &ta)) {
        partition_free(&chunks);
        return -1;
    }
    schedule_free(&a);
    /* no order of the chunks' cut within the limit: the pairs' stays */
    if (search_schedule(o, &chunks, prof, flags, &b, &tb)) tb = INFINITY;
    else schedule_free(&b);
    if (tb < ta) {
        partition_free(part);
        *part = chunks;
    } else {
        partition_free(&chunks);
    }
    return 0;
}

/* Whether the layers are cut for a V placement (partition_by_method_placed), as plan cuts
 * them (plan_v_partition): a V schedule, a search with an even V, or a schedule file in a
 * V (checked when the options were read: it parses). */
static int cut_for_v(const train_options *o)
{
    if (o->schedule_file) {
        schedule s;
        if (schedule_read(&s, o->schedule_file)) return 0;
        int v = s.placement == SCHED_PLACE_V;
        schedule_free(&s);
        return v;
    }
    return schedule_is_v(o->schedule) ||
           (!strcmp(o->schedule, "search") && o->virtual_stages % 2 == 0);
}

/* The partition; *prof gets the profile where one was measured (the "time" cut, or the
 * schedule search), else stays empty. */
static int choose_partition(const train_options *o, const net_desc *net, partition *part,
                            partition_profile *prof, MPI_Comm comm, int rank, int gpu)
{
    memset(part, 0, sizeof *part);
    memset(prof, 0, sizeof *prof);
    /* interleaved schedules cut the layers into K·V model chunks */
    int parts = o->stages * o->virtual_stages;
    if (o->virtual_stages > 1 && parts > net->n_layers) /* "4 stages" of --stages 2 misled */
        return pt_error_set("cannot cut %d layers into %d model chunks (--stages %d x %d "
                            "chunks per rank): a chunk would be empty", net->n_layers, parts,
                            o->stages, o->virtual_stages);
    if (partition_check(net->n_layers, parts)) return -1;
    int search = !o->schedule_file && !strcmp(o->schedule, "search");
    /* One stage needs no cut, and so no profile, unless the search prices the schedules. */
    int have_profile = (!strcmp(o->partition, "time") && parts > 1) || search;
    int rc = have_profile ? share_profile(o, net, prof, comm, rank, gpu,
                                          search && o->device == ENGINE_CPU)
                          : 0;
    if (!rc && parts == 1 && !strcmp(o->partition, "time"))
        rc = partition_uniform(part, net->n_layers, 1);
    else if (!rc) rc = partition_by_method_placed(part, o->partition, net,
                                                  have_profile ? prof : NULL, o->stages,
                                                  o->virtual_stages, cut_for_v(o));
    if (!rc && search && o->virtual_stages == 2 &&
        (!strcmp(o->partition, "time") || !strcmp(o->partition, "params")))
        rc = search_both_cuts(o, net, prof, part);
    if (!rc && rank == 0 && !o->json && parts > 1) {
        printf("partition (%s):\n", o->partition);
        partition_print(part, net, have_profile ? prof : NULL, stdout);
    }
    return rc;
}

/* The schedule the options name (--schedule-file's as read and verified; the search's
 * once the profile is there: `search` then), with recomputation on the stages --recompute
 * lists. */
static int make_schedule(const train_options *o, const partition *part,
                         const partition_profile *prof, schedule *s)
{
    int K = o->stages, flags[K];
    if (o->schedule_file) return schedule_read(s, o->schedule_file);
    if (schedule_parse_recompute(o->recompute, K, flags)) return -1;
    /* the search prices recomputation with each candidate and returns it added */
    if (!strcmp(o->schedule, "search")) return search_schedule(o, part, prof, flags, s, NULL);
    if (schedule_init_named(s, o->schedule, K, o->virtual_stages, o->microbatches)) return -1;
    int any = 0;
    for (int k = 0; k < K; k++) any |= flags[k];
    if (any && schedule_add_recompute(s, flags)) {
        schedule_free(s);
        return -1;
    }
    return 0;
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
        int c = schedule_model_chunk(&run->sched, run->stage, v);
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
        train_abort_job(run->comm);
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
        .skip_bucket = o->skip_bucket, .timeout_s = o->timeout, .zero = o->zero,
        .zero3_prefetch = o->zero3_prefetch, .zero_serial = !o->zero_overlap,
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
    if (mpi_wait_split(run->comm, rest, run->tensor_rank, o->timeout, &run->tensor) ||
        mpi_wait_split(run->comm, run->tensor_rank, rest, o->timeout, &run->tensor_world))
        return -1;
    if (reduce_layout_default(rest, o->stages, o->replicas, &run->stage, &run->replica))
        return -1;
    if (reduce_comms_init(&run->comms, run->tensor_world, o->stages, o->replicas, run->stage,
                          run->replica, o->timeout))
        return -1;
    /* the group on one host: shared memory; else the network */
    MPI_Comm node;
    int local = 0, size = 0;
    if (mpi_wait_split_node(run->comms.group, 0, o->timeout, &node)) return -1;
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
    int local = 1; /* the ranks on this node, which binding finds */
    if (train_agree(topo_bind_rank(comm, o->bind, o->verbose, o->timeout, &blas_threads,
                                   &local),
                    comm, o->timeout))
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
    kernel_blas_threads(1);
    return 0;
}

/* A GPU per rank: by local rank, or nearest to the rank's cores when it is bound. */
static int setup_gpu(train_run *run)
{
    if (run->o.device != ENGINE_CUDA) return 0;
    const cuda_plugin *cp = NULL;
    if (train_agree(cuda_plugin_load(&cp), run->comm, run->o.timeout)) return -1;
    if (train_agree(cuda_pick_device(run->comm, cp, run->o.verbose, run->o.timeout, &run->gpu,
                                     &run->gpu_info),
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
    /* text: an epoch is as many tokens as the training part holds, in windows of T */
    if (o->text) {
        double tokens = (double)o->batch * run->labels_per_sample;
        per_epoch = (long)((double)run->corpus.count / tokens);
        if (per_epoch < 1) per_epoch = 1;
    }
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

int train_setup_start(train_run *run, int argc, char **argv)
{
    *run = (train_run){.comm = MPI_COMM_WORLD,
                       .comms = {.pipeline = MPI_COMM_NULL, .group = MPI_COMM_NULL},
                       .tensor = MPI_COMM_NULL, .tensor_world = MPI_COMM_NULL};
    if (PT_MPI_CALL(MPI_Comm_rank(run->comm, &run->rank)) ||
        PT_MPI_CALL(MPI_Comm_size(run->comm, &run->size)))
        train_abort_job(run->comm);
    stamp_start(run);
    pt_stop_signal_note(run->size > 1 ? run->rank : -1, run->host);
    int prc = agree_options(run, train_options_parse(&run->o, argc, argv), argc, argv);
    if (prc == 1) {
        if (run->rank == 0) train_options_usage(stdout);
        return 1;
    }
    if (!prc && run->rank == 0 && run->o.warmup_alias)
        fprintf(stderr, "pipetrain: --warmup is deprecated and goes in the next release: it "
                "is --untimed-steps N (steps left out of the timings, not learning-rate "
                "warm-up)\n");
    if (prc || check_ranks(run) || setup_threads(run) || setup_gpu(run)) return -1;
    return 0;
}

/* Rank 0 writes --save, --trace, --metrics and the checkpoints: each must be a file (or a
 * directory) it can write now, not found wanting after the whole run (a restart would only
 * fail the same way). A FIFO, a device, a directory, "" or a trailing '/' is refused; so is
 * a link to anything but a regular file (/dev/stdout), which a write would replace. */
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
        if (paths[i][0] && access(dir, W_OK | X_OK) != 0)
            return pt_error_set("%s %s: cannot write in %s: %s", names[i], paths[i], dir,
                                strerror(errno));
        if (pt_output_check(names[i], paths[i])) return -1;
        /* /dev/stdout is a link in /dev: a rename would replace the link itself */
        char *real = realpath(dir, NULL);
        int in_dev = real && (!strcmp(real, "/dev") || !strncmp(real, "/dev/", 5));
        free(real);
        struct stat st;
        if (in_dev || (stat(paths[i], &st) == 0 && !S_ISREG(st.st_mode)))
            return pt_error_set("%s %s: is %s; pipetrain writes only regular files", names[i],
                                paths[i], in_dev ? "under /dev" : "a link to something "
                                "other than a regular file");
    }
    if (rank == 0 && train_options_check_clashes(o)) return -1;
    if (rank != 0 || !o->ckpt_dir) return 0;
    if (!o->ckpt_dir[0]) return pt_error_set("--checkpoint-dir: an empty path names no directory");
    /* created, probed and locked now, before any work (src/io/checkpoint_dir.h) */
    return ckpt_dir_prepare(o->ckpt_dir);
}

/* What the executor is told: the options' and the layout's settings. */
static exec_config exec_config_of(const train_run *run)
{
    const train_options *o = &run->o;
    return (exec_config){
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
        .precision = o->precision,
        .debug_ready_delay = o->ready_delay,
        .wgrad_batched = o->wgrad_batched,
        .post_validation = o->post_validation,
        .world = run->comm,
        .group = run->comms.group,
        .replica = run->replica,
        .rep = run->rep,
        .shard = &run->shard,
        .tensor_rank = run->tensor_rank,
        .tensor = run->tensor,
        .local_net = o->tensor > 1 ? &run->local_net : NULL,
    };
}

/* A language model given no data options reads the built-in corpus (--data text), as an
 * image model reads Fashion-MNIST; image data options with it stay refused (load_data), and
 * so does --data DIR given as the default's own directory (it was taken for no option). */
static void default_text(train_run *run)
{
    train_options *o = &run->o;
    if (run->net.sequence && !o->text && !o->train_images && !o->test_images && !o->val &&
        o->train_samples < 0 && o->test_samples < 0 && !o->data_given)
        o->text = TEXT_FORTUNES;
}

static int check_text_option(const train_options *o)
{
    if (o->text || !o->text_option) return 0;
    return pt_error_set("--%s is for a text corpus: %s is not a language model, and no corpus "
                        "was named (--data " TEXT_DATA_NAME ", --text, --tokens)",
                        o->text_option, o->model);
}

/* Model, partition, schedule, data, executor and parameters, agreed on by every rank. */
int train_setup_run(train_run *run)
{
    const train_options *o = &run->o;
    MPI_Comm comm = run->comm;
    double timeout = o->timeout;
    run->rep = replicas_of(o);
    if (train_agree(check_outputs(o, run->rank), comm, timeout) ||
        train_agree(setup_layout(run), comm, timeout) ||
        train_agree(net_desc_load(&run->net, o->model), comm, timeout) ||
        train_agree(net_desc_check_trainable(&run->net, o->model), comm, timeout) ||
        train_agree(setup_shards(run), comm, timeout))
        return -1;
    default_text(run);
    if (train_agree(check_text_option(o), comm, timeout)) return -1;
    /* the data before any profiling: a batch the data set cannot fill is refused now, not
     * after the layers were profiled (and memory allocated) at that batch */
    double t_read = pt_now();
    run->labels_per_sample = 1;
    int read_rc = o->text ? train_text_load(run)
                          : load_data(o, &run->net, &run->train, &run->val, &run->test);
    run->read_s = pt_now() - t_read;
    partition_profile prof;
    if (train_agree(read_rc, comm, timeout) ||
        train_agree(choose_partition(o, &run->net, &run->part, &prof, comm, run->rank,
                                     run->gpu),
                    comm, timeout))
        return -1;
    int sched_rc = make_schedule(o, &run->part, &prof, &run->sched);
    partition_profile_free(&prof);
    if (train_agree(sched_rc, comm, timeout) ||
        train_agree(replicas_schedule(&run->sched, o->tensor > 1 ? &run->local_net : &run->net,
                                      &run->part, &run->rep),
                    comm, timeout))
        return -1;
    exec_config cfg = exec_config_of(run);
    if (train_agree(exec_init(&run->ex, run->comms.pipeline, &run->net, &run->part, &run->sched,
                              &cfg),
                    comm, timeout))
        return -1;
    if (exec_start(run->ex)) train_abort_job(comm);
    if (calibrate_tensor(run)) train_abort_job(comm);
    if (train_agree(init_parameters(run), comm, timeout)) return -1;
    if (!o->text) /* a language model's: 0 … batch − 1, made with its corpus */
        run->order = malloc((size_t)run->train.count * sizeof *run->order);
    if (train_agree(run->order ? 0 : pt_error_set("out of memory"), comm, timeout)) return -1;
    plan_steps(run);
    return 0;
}

void train_run_free(train_run *run)
{
    metrics_close(run->metrics);
    free(run->metrics_prev);
    free(run->order);
    exec_free(run->ex);
    data_free(&run->train);
    data_free(&run->val);
    data_free(&run->test);
    train_text_free(run);
    schedule_free(&run->sched);
    partition_free(&run->part);
    shard_plan_free(&run->shard);
    if (run->local_net.layers) net_desc_free(&run->local_net);
    net_desc_free(&run->net);
    reduce_comms_free(&run->comms);
    if (run->tensor != MPI_COMM_NULL) MPI_Comm_free(&run->tensor);
    if (run->tensor_world != MPI_COMM_NULL) MPI_Comm_free(&run->tensor_world);
}
