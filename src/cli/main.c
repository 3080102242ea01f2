/* pipetrain's command-line front end: the table of commands (src/cli/commands.h), the MPI
 * set-up for those that need it, and the only place that decides to end the process. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/base/error.h"
#include "src/base/io.h"
#include "src/base/mpi_check.h"
#include "src/base/options.h"
#include "src/cli/commands.h"

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
        "  sample     text from a trained language model's checkpoint\n"
        "  launch     run a training job; restart it from its checkpoints if it fails\n"
        "  version    the version of pipetrain (also --version)\n");
}

/* The commands; mpi: main initialises MPI around it (train's ranks are one job). */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    int mpi;
} commands[] = {
    {"train", cmd_train, 1},
    {"summary", cmd_summary, 0},
    {"partition", cmd_partition, 0},
    {"schedule", cmd_schedule, 0},
    {"topo", cmd_topo, 0},
    {"devices", cmd_devices, 0},
    {"plan", cmd_plan, 0},
    {"diff", cmd_diff, 0},
    {"sample", cmd_sample, 0},
    {"launch", cmd_launch, 0},
};

/* Runs a command inside MPI_Init_thread and MPI_Finalize; returns its exit status. */
static int run_with_mpi(int (*run)(int, char **), int argc, char **argv)
{
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
    int rc = run(argc, argv);
    if (PT_MPI_CALL(MPI_Finalize())) {
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        if (!rc) rc = 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    kernel_blas_restart(argv); /* OpenBLAS's kernels and threads (kernels/blas_core.c) */
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
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (!strcmp(cmd, commands[k].name))
            return commands[k].mpi ? run_with_mpi(commands[k].run, argc, argv)
                                   : commands[k].run(argc, argv);
    fprintf(stderr, "pipetrain: unknown command %s\n", cmd);
    usage(stderr);
    return PT_EXIT_USAGE;
}
