/* pipetrain's command-line front end: the only place that decides to end the process. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/runtime/profile.h"
#include "src/cli/cmd_launch.h"
#include "src/cli/cmd_topo.h"
#include "src/cli/devices.h"
#include "src/base/error.h"
#include "src/base/io.h"
#include "src/base/mpi_check.h"
#include "src/model/net.h"
#include "src/base/options.h"
#include "src/io/safetensors.h"
#include "src/train/train.h"
#include "topologies/topo.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: pipetrain COMMAND [options]   (pipetrain COMMAND --help for details)\n"
        "\n"
        "  train      train a model, sequentially or as a pipeline:\n"
        "             mpiexec -n K pipetrain train ... --stages K\n"
        "  summary    layers, output shapes and parameters of a model file\n"
        "  partition  cut a model into pipeline stages and show the balance\n"
        "  schedule   instruction lists and timeline of a pipeline schedule\n"
        "  topo       this machine's (or an XML file's) topology\n"
        "  devices    the CPU and CUDA devices training can use, and MPI's CUDA support\n"
        "  plan       partition + placement + predicted communication for a machine\n"
        "  diff       compare two safetensors checkpoints tensor by tensor\n"
        "  launch     run a training job; restart it from its checkpoints if it fails\n"
        "  version    the version of pipetrain (also --version)\n");
}

static int fail(const char *what)
{
    fprintf(stderr, "pipetrain: %s\n", what);
    return PT_EXIT_FAIL;
}

/* A wrong command line: the message ends with "(see pipetrain CMD --help)". */
static int usage_fail(void)
{
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    return PT_EXIT_USAGE;
}

enum { O_MODEL = 1, O_STAGES, O_MICRO, O_BATCH, O_SCHED, O_PART, O_METHOD, O_RTOL, O_BUCKETS,
       O_OVERLAP, O_VIRTUAL, O_RECOMPUTE, O_HELP };

static const opt_spec summary_opts[] = {
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command summary_command = {
    .name = "summary",
    .usage = "pipetrain summary --model FILE",
    .about = "Layers, output shapes and parameters of a model file.",
    .opts = summary_opts,
};

static int cmd_summary(int argc, char **argv)
{
    const char *model = NULL;
    opt_parser p;
    if (opt_parser_init(&p, &summary_command, argc, argv)) return usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        if (id == O_MODEL) model = p.arg;
        if (id == O_HELP) {
            opt_print_help(&summary_command, stdout);
            return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return usage_fail();
    net_desc net;
    if (net_desc_load(&net, model)) return fail(pt_error_get());
    net_desc_print_summary(&net, stdout);
    net_desc_free(&net);
    return PT_EXIT_OK;
}

static const opt_spec partition_opts[] = {
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.id = O_STAGES, .name = "stages", .shared = 1, .required = 1},
    {.id = O_PART, .name = "partition", .shared = 1},
    {.id = O_BATCH, .name = "batch", .shared = 1},
    {.id = O_MICRO, .name = "microbatches", .shared = 1},
    {.id = O_METHOD, .name = "method", .kind = OPT_TEXT, .arg = "METHOD"}, /* old name */
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command partition_command = {
    .name = "partition",
    .usage = "pipetrain partition --model FILE --stages K [options]",
    .about = "Cuts a model into K pipeline stages as train would and shows the balance: "
             "parameters, time per sample and values sent at each boundary. --partition time "
             "measures every layer on this machine at the micro-batch size (batch / M).",
    .opts = partition_opts,
};

static int cmd_partition(int argc, char **argv)
{
    const char *model = NULL, *method = NULL;
    int stages = 0, batch = 0, micro = 0;
    opt_parser p;
    if (opt_parser_init(&p, &partition_command, argc, argv)) return usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_MODEL: model = p.arg; break;
        case O_PART:
        case O_METHOD: method = p.arg; break;
        case O_STAGES: stages = (int)p.num; break;
        case O_BATCH: batch = (int)p.num; break;
        case O_MICRO: micro = (int)p.num; break;
        case O_HELP: opt_print_help(&partition_command, stdout); return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return usage_fail();
    if (batch % micro) {
        opt_error(&p, "--microbatches %d does not divide --batch %d", micro, batch);
        return usage_fail();
    }
    net_desc net;
    if (net_desc_load(&net, model)) return fail(pt_error_get());
    partition_profile prof = {0};
    partition part = {0};
    int timed = !strcmp(method, "time");
    int rc = partition_check(net.n_layers, stages);
    if (!rc && timed) rc = partition_profile_measure(&prof, &net, batch / micro, 2, 7);
    if (!rc) rc = partition_by_method(&part, method, &net, timed ? &prof : NULL, stages);
    if (!rc) {
        printf("%s into %d stages by %s%s:\n", model, stages, method,
               timed ? " (measured on this machine)" : "");
        partition_print(&part, &net, timed ? &prof : NULL, stdout);
    } else {
        fail(pt_error_get());
    }
    partition_free(&part);
    partition_profile_free(&prof);
    net_desc_free(&net);
    return rc ? PT_EXIT_FAIL : PT_EXIT_OK;
}

static const opt_spec schedule_opts[] = {
    {.id = O_SCHED, .name = "schedule", .shared = 1},
    {.id = O_STAGES, .name = "stages", .shared = 1, .required = 1},
    {.id = O_MICRO, .name = "microbatches", .shared = 1},
    {.id = O_BUCKETS, .name = "buckets", .kind = OPT_INT, .arg = "B", .min = 0, .max = 64,
     .def = "0", .help = "gradient buckets each stage reduces among its data-parallel "
                         "replicas (0: no reductions)"},
    {.id = O_OVERLAP, .name = "overlap", .shared = 1},
    {.id = O_VIRTUAL, .name = "virtual", .shared = 1},
    {.id = O_RECOMPUTE, .name = "recompute", .shared = 1},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command schedule_command = {
    .name = "schedule",
    .usage = "pipetrain schedule --stages K [--microbatches M] [--schedule NAME]\n"
             "pipetrain schedule --stages K ... --schedule interleaved --virtual V\n"
             "pipetrain schedule --stages K ... --buckets B [--overlap on|off]\n"
             "pipetrain schedule --stages K ... --recompute none|all|0,2",
    .about = "Prints each stage's instruction list and a unit-time timeline of the schedule, "
             "verifies it (no deadlock) and reports the bubble and the peak micro-batches each "
             "stage holds (per chunk with --virtual, and the inputs kept with --recompute).",
    .opts = schedule_opts,
};

/* The verifier's peaks: per stage, and per chunk "a+b" when there are several. */
static void print_peaks(const char *what, const int *per_stage, const int *per_chunk, int K,
                        int V)
{
    printf("%s:", what);
    for (int k = 0; k < K; k++) {
        printf(" %d", per_stage[k]);
        for (int v = 0; v < V && V > 1; v++)
            printf("%s%d%s", v ? "+" : " (", per_chunk[k * V + v], v == V - 1 ? ")" : "");
    }
    printf("\n");
}

/* What the printer can show in a terminal's worth of text. */
enum { SCHEDULE_MAX_STAGES = 256, SCHEDULE_MAX_MICRO = 4096 };

static int cmd_schedule(int argc, char **argv)
{
    const char *name = NULL, *recompute = "none";
    int stages = 0, micro = 0, buckets = 0, overlap = 1, virt = 1;
    opt_parser p;
    if (opt_parser_init(&p, &schedule_command, argc, argv)) return usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_SCHED: name = p.arg; break;
        case O_STAGES: stages = (int)p.num; break;
        case O_MICRO: micro = (int)p.num; break;
        case O_BUCKETS: buckets = (int)p.num; break;
        case O_OVERLAP: overlap = p.choice == 0; break;
        case O_VIRTUAL: virt = (int)p.num; break;
        case O_RECOMPUTE: recompute = p.arg; break;
        case O_HELP: opt_print_help(&schedule_command, stdout); return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return usage_fail();
    if (stages > SCHEDULE_MAX_STAGES || micro > SCHEDULE_MAX_MICRO) {
        opt_error(&p, "schedule prints at most %d stages and %d micro-batches",
                  SCHEDULE_MAX_STAGES, SCHEDULE_MAX_MICRO);
        return usage_fail();
    }
    int flags[SCHEDULE_MAX_STAGES];
    if (schedule_parse_recompute(recompute, stages, flags)) {
        char why[256];
        snprintf(why, sizeof why, "%s", pt_error_get());
        opt_error(&p, "%s", why);
        return usage_fail();
    }
    int any_recompute = 0;
    for (int k = 0; k < stages; k++) any_recompute |= flags[k];
    schedule s;
    if (schedule_init_named(&s, name, stages, virt, micro)) return fail(pt_error_get());
    /* --buckets B: B buckets on every stage, or on every chunk of an interleaved one */
    int per_chunk[stages * virt];
    for (int k = 0; k < stages * virt; k++) per_chunk[k] = buckets;
    if ((buckets && schedule_add_reductions_chunks(&s, per_chunk, overlap)) ||
        (any_recompute && schedule_add_recompute(&s, flags))) {
        schedule_free(&s);
        return fail(pt_error_get());
    }
    schedule_report rep;
    if (schedule_verify(&s, &rep)) {
        schedule_free(&s);
        return fail(pt_error_get());
    }
    schedule_print(&s, stdout);
    int V = rep.virtual_stages;
    print_peaks(V > 1 ? "verified: no deadlock; peak micro-batches held per stage (per chunk)"
                      : "verified: no deadlock; peak micro-batches held per stage",
                rep.peak_inflight, rep.peak_inflight_chunk, rep.stages, V);
    if (any_recompute)
        print_peaks("inputs kept per stage (recomputation keeps only these between F and R)",
                    rep.peak_inputs, rep.peak_inputs_chunk, rep.stages, V);
    schedule_report_free(&rep);
    schedule_free(&s);
    return PT_EXIT_OK;
}

static const opt_spec diff_opts[] = {
    {.id = O_RTOL, .name = "rtol", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1e30,
     .def = "0", .help = "fail when a tensor's largest |a-b| exceeds X times its largest |b| "
                         "(0: bit-identical)"},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command diff_command = {
    .name = "diff",
    .usage = "pipetrain diff A.safetensors B.safetensors [--rtol X]",
    .about = "Compares two checkpoints tensor by tensor: the largest absolute and relative "
             "difference of each, and the tensors only one file holds or whose shapes differ. "
             "Exits 1 when they differ beyond the tolerance.",
    .opts = diff_opts,
    .operands = 2,
};

static void format_shape(char *buf, size_t size, const st_tensor *t)
{
    int n = snprintf(buf, size, "[");
    for (int d = 0; d < t->ndim && n < (int)size; d++)
        n += snprintf(buf + n, size - (size_t)n, "%s%ld", d ? ", " : "", t->shape[d]);
    if (n < (int)size) snprintf(buf + n, size - (size_t)n, "]");
}

/* Largest absolute and relative difference per tensor; fails above the tolerance. Names
 * the tensors that only one file holds and those whose shapes differ. */
static int cmd_diff(int argc, char **argv)
{
    double rtol = 0;
    opt_parser p;
    if (opt_parser_init(&p, &diff_command, argc, argv)) return usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        if (id == O_RTOL) rtol = p.real;
        if (id == O_HELP) {
            opt_print_help(&diff_command, stdout);
            return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return usage_fail();
    const char *paths[2] = {p.operands[0], p.operands[1]};
    st_file a, b;
    if (st_read(&a, paths[0])) return fail(pt_error_get());
    if (st_read(&b, paths[1])) {
        st_free(&a);
        return fail(pt_error_get());
    }
    int bad = 0, only_a = 0, only_b = 0, reshaped = 0;
    double worst = 0;
    char sa[96], sb[96];
    for (int t = 0; t < a.count; t++) {
        const st_tensor *x = &a.tensors[t], *y = st_find(&b, x->name);
        long count = 1;
        for (int d = 0; d < x->ndim; d++) count *= x->shape[d];
        format_shape(sa, sizeof sa, x);
        if (!y) {
            printf("%-24s only in A: %s\n", x->name, sa);
            only_a++;
            continue;
        }
        int same_shape = y->ndim == x->ndim;
        for (int d = 0; same_shape && d < x->ndim; d++) same_shape = x->shape[d] == y->shape[d];
        if (!same_shape) {
            format_shape(sb, sizeof sb, y);
            printf("%-24s shape differs: A %s vs B %s\n", x->name, sa, sb);
            reshaped++;
            continue;
        }
        double max_abs = 0, max_ref = 0;
        for (long i = 0; i < count; i++) {
            double d = fabs((double)x->data[i] - (double)y->data[i]);
            if (d > max_abs || d != d) max_abs = d != d ? INFINITY : d;
            if (fabs((double)y->data[i]) > max_ref) max_ref = fabs((double)y->data[i]);
        }
        double rel = max_ref > 0 ? max_abs / max_ref : max_abs;
        if (rel > worst) worst = rel;
        int over = rel > rtol;
        bad |= over;
        printf("%-24s %9ld values  max |a-b| %.3e  relative %.3e%s\n", x->name, count, max_abs,
               rel, over ? "  EXCEEDS" : "");
    }
    for (int t = 0; t < b.count; t++)
        if (!st_find(&a, b.tensors[t].name)) {
            format_shape(sb, sizeof sb, &b.tensors[t]);
            printf("%-24s only in B: %s\n", b.tensors[t].name, sb);
            only_b++;
        }
    if (only_a || only_b || reshaped) {
        printf("A = %s (%d tensors), B = %s (%d tensors): %d only in A, %d only in B, "
               "%d with different shapes\n", paths[0], a.count, paths[1], b.count, only_a,
               only_b, reshaped);
        bad = 1;
    }
    printf("%s: largest relative difference %.3e (tolerance %.1e)\n",
           bad ? "DIFFERENT" : (worst == 0 ? "IDENTICAL" : "WITHIN TOLERANCE"), worst, rtol);
    st_free(&a);
    st_free(&b);
    return bad ? PT_EXIT_FAIL : PT_EXIT_OK;
}

int main(int argc, char **argv)
{
    pt_stdio_whole_lines(); /* mpiexec -prepend-rank: one prefix per line */
    /* MPICH's MPI_Init runs hwloc too, whose GL plugin (libhwloc-plugins) opens X displays
     * :0, :1, ... and may wait seconds for DNS on each; unless the user chose components,
     * leave it and the OpenCL one out (GPUs are found on the PCI bus). */
    setenv("HWLOC_COMPONENTS", "-gl,-opencl", 0);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? PT_EXIT_USAGE : PT_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        if (argc > 2) {
            fprintf(stderr, "pipetrain: version takes no arguments\n");
            return PT_EXIT_USAGE;
        }
        printf("%s\n", opt_version());
        return PT_EXIT_OK;
    }
    const char *cmd = argv[1];
    argc--, argv++;
    if (!strcmp(cmd, "train")) {
        /* the stage's worker threads never call MPI; only this one does */
        int provided = MPI_THREAD_SINGLE;
        if (PT_MPI_CALL(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided))) {
            fprintf(stderr, "pipetrain: %s\n", pt_error_get());
            return 1;
        }
        /* MPI errors return to the caller, which says where (src/base/mpi_check.h) */
        if (pt_mpi_errors_return()) {
            fprintf(stderr, "pipetrain: %s\n", pt_error_get());
            pt_mpi_abort(MPI_COMM_WORLD, 1);
        }
        if (provided < MPI_THREAD_FUNNELED) {
            fprintf(stderr, "pipetrain: this MPI cannot run threads beside MPI (level %d)\n",
                    provided);
            pt_mpi_abort(MPI_COMM_WORLD, 1);
        }
        pt_stdio_whole_lines(); /* MPICH's MPI_Init made stdout unbuffered again */
        int rc = train_main(argc, argv);
        if (PT_MPI_CALL(MPI_Finalize())) {
            fprintf(stderr, "pipetrain: %s\n", pt_error_get());
            if (!rc) rc = 1;
        }
        return rc;
    }
    if (!strcmp(cmd, "summary")) return cmd_summary(argc, argv);
    if (!strcmp(cmd, "partition")) return cmd_partition(argc, argv);
    if (!strcmp(cmd, "schedule")) return cmd_schedule(argc, argv);
    if (!strcmp(cmd, "topo")) return topo_cmd_topo(argc, argv);
    if (!strcmp(cmd, "devices")) return devices_cmd(argc, argv);
    if (!strcmp(cmd, "plan")) return topo_cmd_plan(argc, argv);
    if (!strcmp(cmd, "diff")) return cmd_diff(argc, argv);
    if (!strcmp(cmd, "launch")) return launch_main(argc, argv);
    fprintf(stderr, "pipetrain: unknown command %s\n", cmd);
    usage(stderr);
    return PT_EXIT_USAGE;
}
