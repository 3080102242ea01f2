/* pipetrain's command-line front end: the only place that decides to end the process. */
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/profile.h"
#include "src/cmd_topo.h"
#include "src/devices.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/model/net.h"
#include "src/options.h"
#include "src/safetensors.h"
#include "src/train.h"
#include "topologies/topo.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: pipetrain COMMAND [options]   (pipetrain COMMAND --help for details)\n"
        "\n"
        "  train      train a model, sequentially or as a pipeline (mpiexec -n K ... --stages K)\n"
        "  summary    layers, output shapes and parameters of a model file\n"
        "  partition  cut a model into pipeline stages and show the balance\n"
        "  schedule   instruction lists and timeline of a pipeline schedule\n"
        "  topo       this machine's (or an XML file's) topology\n"
        "  devices    the CPU and CUDA devices training can use, and MPI's CUDA support\n"
        "  plan       partition + placement + predicted communication for a machine\n"
        "  diff       compare two safetensors checkpoints tensor by tensor\n");
}

static int fail(const char *what)
{
    fprintf(stderr, "pipetrain: %s\n", what);
    return 1;
}

static int cmd_summary(int argc, char **argv)
{
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: pipetrain summary --model FILE\n");
            return 0;
        } else {
            fprintf(stderr, "pipetrain summary: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "pipetrain summary: --model FILE is required\n");
        return 2;
    }
    net_desc net;
    if (net_desc_load(&net, model)) return fail(pt_error_get());
    net_desc_print_summary(&net, stdout);
    net_desc_free(&net);
    return 0;
}

static int cmd_partition(int argc, char **argv)
{
    const char *model = NULL, *method = "time";
    long stages = 2, batch = 128;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("usage: pipetrain partition --model FILE --stages K "
                   "[--method uniform|params|time|4,3,4] [--batch N]\n"
                   "  time profiles every layer on this machine at the given batch (default 128)\n");
            return 0;
        }
        if (!v) {
            fprintf(stderr, "pipetrain partition: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--method") || !strcmp(a, "--partition")) method = v;
        else if (!strcmp(a, "--stages")) {
            if (opt_parse_long("--stages", v, 1, 4096, &stages)) return fail(pt_error_get());
        } else if (!strcmp(a, "--batch")) {
            if (opt_parse_long("--batch", v, 1, 1 << 20, &batch)) return fail(pt_error_get());
        } else {
            fprintf(stderr, "pipetrain partition: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!model) {
        fprintf(stderr, "pipetrain partition: --model FILE is required\n");
        return 2;
    }
    net_desc net;
    if (net_desc_load(&net, model)) return fail(pt_error_get());
    partition_profile prof = {0};
    partition part = {0};
    int timed = !strcmp(method, "time");
    int rc = partition_check(net.n_layers, (int)stages);
    if (!rc && timed) rc = partition_profile_measure(&prof, &net, (int)batch, 2, 7);
    if (!rc) rc = partition_by_method(&part, method, &net, timed ? &prof : NULL, (int)stages);
    if (!rc) {
        printf("%s into %ld stages by %s%s:\n", model, stages, method,
               timed ? " (measured on this machine)" : "");
        partition_print(&part, &net, timed ? &prof : NULL, stdout);
    } else {
        fail(pt_error_get());
    }
    partition_free(&part);
    partition_profile_free(&prof);
    net_desc_free(&net);
    return rc ? 1 : 0;
}

static int cmd_schedule(int argc, char **argv)
{
    const char *name = "1f1b";
    long stages = 4, micro = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("usage: pipetrain schedule --schedule gpipe|1f1b --stages K --microbatches M\n");
            return 0;
        }
        if (!v) {
            fprintf(stderr, "pipetrain schedule: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        if (!strcmp(a, "--schedule")) name = v;
        else if (!strcmp(a, "--stages")) {
            if (opt_parse_long("--stages", v, 1, 256, &stages)) return fail(pt_error_get());
        } else if (!strcmp(a, "--microbatches")) {
            if (opt_parse_long("--microbatches", v, 1, 4096, &micro)) return fail(pt_error_get());
        } else {
            fprintf(stderr, "pipetrain schedule: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    schedule s;
    if (schedule_init_by_name(&s, name, (int)stages, (int)micro)) return fail(pt_error_get());
    schedule_report rep;
    if (schedule_verify(&s, &rep)) {
        schedule_free(&s);
        return fail(pt_error_get());
    }
    schedule_print(&s, stdout);
    printf("verified: no deadlock; peak micro-batches held per stage:");
    for (int k = 0; k < rep.stages; k++) printf(" %d", rep.peak_inflight[k]);
    printf("\n");
    schedule_report_free(&rep);
    schedule_free(&s);
    return 0;
}

/* Largest absolute and relative difference per tensor; fails above the tolerance. */
static int cmd_diff(int argc, char **argv)
{
    const char *paths[2] = {NULL, NULL};
    double rtol = 0;
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: pipetrain diff A.safetensors B.safetensors [--rtol X]\n"
                   "  fails when a tensor's largest |a-b| exceeds X times its largest |b|\n"
                   "  (default 0: bit-identical)\n");
            return 0;
        }
        if (!strcmp(argv[i], "--rtol") && i + 1 < argc) {
            if (opt_parse_double("--rtol", argv[++i], 0, 1e30, &rtol)) return fail(pt_error_get());
        } else if (n < 2) {
            paths[n++] = argv[i];
        } else {
            fprintf(stderr, "pipetrain diff: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (n != 2) {
        fprintf(stderr, "pipetrain diff: two files are needed\n");
        return 2;
    }
    st_file a, b;
    if (st_read(&a, paths[0])) return fail(pt_error_get());
    if (st_read(&b, paths[1])) {
        st_free(&a);
        return fail(pt_error_get());
    }
    int bad = 0;
    double worst = 0;
    for (int t = 0; t < a.count; t++) {
        const st_tensor *x = &a.tensors[t], *y = st_find(&b, x->name);
        long count = 1;
        for (int d = 0; d < x->ndim; d++) count *= x->shape[d];
        int same_shape = y && y->ndim == x->ndim;
        for (int d = 0; same_shape && d < x->ndim; d++) same_shape = x->shape[d] == y->shape[d];
        if (!same_shape) {
            printf("%-24s only in %s or shapes differ\n", x->name, paths[0]);
            bad = 1;
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
    if (b.count != a.count) {
        printf("the files hold %d and %d tensors\n", a.count, b.count);
        bad = 1;
    }
    printf("%s: largest relative difference %.3e (tolerance %.1e)\n",
           bad ? "DIFFERENT" : (worst == 0 ? "IDENTICAL" : "WITHIN TOLERANCE"), worst, rtol);
    st_free(&a);
    st_free(&b);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
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
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (provided < MPI_THREAD_FUNNELED) {
            fprintf(stderr, "pipetrain: this MPI cannot run threads beside MPI (level %d)\n",
                    provided);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
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
    fprintf(stderr, "pipetrain: unknown command %s\n", cmd);
    usage(stderr);
    return 2;
}
