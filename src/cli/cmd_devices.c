/* `pipetrain devices`: the CPU from this machine's topology, the CUDA devices through the
 * plugin, and MPI's CUDA-awareness, as text or as one JSON object (built with jansson). A
 * machine without a usable GPU is a normal answer (the reason is printed, the status is 0);
 * only a listing that could not be made is an error. */
#include <jansson.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "kernels/kernels.h"
#include "src/runtime/cuda_plugin.h"
#include "src/base/error.h"
#include "src/base/io.h"
#include "src/base/mpi_check.h"
#include "src/base/options.h"
#include "src/cli/commands.h"
#include "topologies/topo.h"

typedef struct {
    int ok;               /* the plugin loaded and lists devices */
    char reason[1024];    /* why not, when !ok */
    char versions[128];   /* "" when the plugin did not load */
    int n;                /* devices */
    cuda_device_info *info;
    int *failed;          /* per device: its query failed (message in errors) */
    char (*errors)[512];
} cuda_listing;

static double gib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

/* What the plugin says; the listing keeps going whatever fails. */
static void cuda_list(cuda_listing *l)
{
    memset(l, 0, sizeof *l);
    const cuda_plugin *p;
    if (cuda_plugin_load(&p) < 0) {
        snprintf(l->reason, sizeof l->reason, "%s", pt_error_get());
        return;
    }
    if (p->versions(l->versions, sizeof l->versions) < 0)
        snprintf(l->versions, sizeof l->versions, "versions unknown: %s", pt_error_get());
    const int rc = p->device_count(&l->n);
    if (rc < 0 || l->n <= 0) {
        snprintf(l->reason, sizeof l->reason, "%s",
                 rc < 0 ? pt_error_get() : "no CUDA device: the driver lists none");
        l->n = 0;
        return;
    }
    l->info = calloc((size_t)l->n, sizeof *l->info);
    l->failed = calloc((size_t)l->n, sizeof *l->failed);
    l->errors = calloc((size_t)l->n, sizeof *l->errors);
    if (!l->info || !l->failed || !l->errors) {
        snprintf(l->reason, sizeof l->reason, "out of memory for %d devices", l->n);
        l->n = 0;
        return;
    }
    l->ok = 1;
    for (int d = 0; d < l->n; d++)
        if (p->device_info(d, &l->info[d]) < 0) {
            l->failed[d] = 1;
            snprintf(l->errors[d], sizeof l->errors[d], "%s", pt_error_get());
        }
}

static void cuda_listing_free(cuda_listing *l)
{
    free(l->info);
    free(l->failed);
    free(l->errors);
    l->info = NULL;
    l->failed = NULL;
    l->errors = NULL;
}

static void print_text(const topo_machine *m, const char *topo_err, const cuda_listing *l,
                       const char *mpi_lib, int aware)
{
    if (m)
        printf("CPU: %s (%d package%s, %d core%s, %d hardware thread%s, %d NUMA node%s, "
               "%.1f GiB)\n", *m->cpu_model ? m->cpu_model : "model unknown", m->n_packages,
               m->n_packages == 1 ? "" : "s", m->n_cores, m->n_cores == 1 ? "" : "s", m->n_pus,
               m->n_pus == 1 ? "" : "s", m->n_numa,
               m->n_numa == 1 ? "" : "s", gib(m->memory));
    else
        printf("CPU: unknown: %s\n", topo_err);
    if (!l->ok) {
        printf("CUDA: not available: %s\n", l->reason);
        if (*l->versions) printf("      (%s)\n", l->versions);
    } else {
        printf("CUDA: %s; %d device%s\n", l->versions, l->n, l->n == 1 ? "" : "s");
    }
    for (int d = 0; d < l->n; d++) {
        const cuda_device_info *g = &l->info[d];
        if (l->failed[d]) {
            printf("  device %d: %s\n", d, l->errors[d]);
            continue;
        }
        int estimate;
        cuda_fp32_lanes_per_sm(g->major, g->minor, &estimate);
        printf("  device %d: %s\n"
               "    memory %.1f GiB, %.1f GiB free; compute capability %d.%d; %d SMs at "
               "%d MHz\n"
               "    PCI bus %s; FP32 peak %.1f TFLOP/s%s\n", d, g->name, gib(g->total_bytes),
               gib(g->free_bytes), g->major, g->minor, g->multiprocessors, g->clock_khz / 1000,
               g->pci_bus_id, g->peak_fp32_flops / 1e12, estimate ? " (estimate)" : "");
    }
    printf("MPI: %s; CUDA-aware: %s\n", mpi_lib, aware ? "yes" : "no");
    const char *detected = getenv("PIPETRAIN_BLAS_DETECTED");
    printf("BLAS: OpenBLAS, %s kernels", kernel_blas_core());
    if (detected) printf(" (OpenBLAS chose %s for this CPU; pipetrain chose again)", detected);
    printf("\n");
    if (kernel_bf16_available())
        printf("bf16 products on the CPU (--precision bf16): yes, through oneDNN\n");
    else
        printf("bf16 products on the CPU (--precision bf16): no: %s\n", pt_error_get());
}

/* Builders of the JSON tree: jansson's setters take ownership of the value (and free it
 * when they fail, also for a NULL container or value); *ok records any failure. */
static void put(json_t *obj, const char *key, json_t *v, int *ok)
{
    if (json_object_set_new(obj, key, v) != 0)
        *ok = 0;
}

static json_t *json_device(int d, const cuda_listing *l, int *ok)
{
    const cuda_device_info *g = &l->info[d];
    json_t *o = json_object();
    put(o, "index", json_integer(d), ok);
    if (l->failed[d]) {
        put(o, "error", topo_json_text(l->errors[d]), ok);
        return o;
    }
    int estimate;
    cuda_fp32_lanes_per_sm(g->major, g->minor, &estimate);
    char cc[32];
    snprintf(cc, sizeof cc, "%d.%d", g->major, g->minor);
    put(o, "name", topo_json_text(g->name), ok);
    put(o, "memory_total_bytes", json_integer((json_int_t)g->total_bytes), ok);
    put(o, "memory_free_bytes", json_integer((json_int_t)g->free_bytes), ok);
    put(o, "compute_capability", json_string(cc), ok);
    put(o, "multiprocessors", json_integer(g->multiprocessors), ok);
    /* the plugin reports 0 for what it does not know */
    put(o, "clock_khz", g->clock_khz > 0 ? json_integer(g->clock_khz) : json_null(), ok);
    put(o, "pci_bus_id", topo_json_text(g->pci_bus_id), ok);
    put(o, "peak_fp32_flops",
        g->peak_fp32_flops > 0 ? topo_json_number(g->peak_fp32_flops) : json_null(), ok);
    put(o, "peak_fp32_estimate", json_boolean(estimate), ok);
    return o;
}

static int print_json(const topo_machine *m, const char *topo_err, const cuda_listing *l,
                      const char *mpi_lib, int aware)
{
    int ok = 1;
    json_t *o = json_object(), *cpu = json_object(), *cuda = json_object(),
           *mpi = json_object();
    if (m) {
        put(cpu, "model", topo_json_text(m->cpu_model), &ok);
        put(cpu, "packages", json_integer(m->n_packages), &ok);
        put(cpu, "cores", json_integer(m->n_cores), &ok);
        put(cpu, "hardware_threads", json_integer(m->n_pus), &ok);
        put(cpu, "numa_nodes", json_integer(m->n_numa), &ok);
        put(cpu, "memory_bytes", json_integer((json_int_t)m->memory), &ok);
    } else {
        put(cpu, "error", topo_json_text(topo_err), &ok);
    }
    /* --precision bf16 on the CPU (kernels/bf16.h), or why not */
    int bf16 = kernel_bf16_available();
    put(cpu, "bf16_products", json_boolean(bf16), &ok);
    put(cpu, "bf16_products_why_not", bf16 ? json_null() : topo_json_text(pt_error_get()), &ok);
    put(o, "cpu", cpu, &ok);
    put(cuda, "available", json_boolean(l->ok), &ok);
    if (*l->versions)
        put(cuda, "versions", topo_json_text(l->versions), &ok);
    if (!l->ok) {
        put(cuda, "reason", topo_json_text(l->reason), &ok);
    } else {
        json_t *devices = json_array();
        for (int d = 0; ok && d < l->n; d++)
            if (json_array_append_new(devices, json_device(d, l, &ok)) != 0)
                ok = 0;
        put(cuda, "devices", devices, &ok);
    }
    put(o, "cuda", cuda, &ok);
    put(mpi, "library", topo_json_text(mpi_lib), &ok);
    put(mpi, "cuda_aware", json_boolean(aware), &ok);
    put(o, "mpi", mpi, &ok);
    json_t *blas = json_object();
    const char *detected = getenv("PIPETRAIN_BLAS_DETECTED");
    put(blas, "core", topo_json_text(kernel_blas_core()), &ok);
    put(blas, "core_detected", detected ? topo_json_text(detected) : json_null(), &ok);
    put(o, "blas", blas, &ok);
    if (!ok) {
        json_decref(o);
        o = NULL;
    }
    return topo_json_print(o, stdout);
}

enum { O_JSON = 1, O_HELP };
static const opt_spec devices_opts[] = {
    {.id = O_JSON, .name = "json", .shared = 1},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command devices_command = {
    .name = "devices",
    .usage = "pipetrain devices [--json]",
    .about = "The CPU, every CUDA device (memory, compute capability, SMs, PCI bus, FP32 peak), "
             "the CUDA versions and whether MPI is CUDA-aware; without a usable GPU it says why "
             "(exit status 0 all the same).",
    .opts = devices_opts,
};

int cmd_devices(int argc, char **argv)
{
    int json = 0;
    opt_parser p;
    int id = opt_parser_init(&p, &devices_command, argc, argv) ? OPT_ERROR : OPT_END;
    while (id != OPT_ERROR && (id = opt_next(&p)) > 0) {
        if (id == O_JSON) json = 1;
        if (id == O_HELP) {
            opt_print_help(&devices_command, stdout);
            return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) {
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
        return PT_EXIT_USAGE;
    }
    topo_t *t = NULL;
    char topo_err[512] = "";
    if (topo_init(&t, NULL) < 0) snprintf(topo_err, sizeof topo_err, "%s", pt_error_get());
    cuda_listing l;
    cuda_list(&l);

    /* MPI only for its CUDA-awareness, which is asked at run time */
    int was_init = 0, we_init = 0, aware = 0, len = 0;
    char mpi_lib[MPI_MAX_LIBRARY_VERSION_STRING] = "unknown (MPI failed)";
    int mpi_ok = !PT_MPI_CALL(MPI_Initialized(&was_init));
    if (mpi_ok && !was_init) {
        mpi_ok = we_init = !PT_MPI_CALL(MPI_Init(NULL, NULL));
        pt_stdio_whole_lines(); /* MPICH's MPI_Init made stdout unbuffered */
    }
    if (mpi_ok && we_init) mpi_ok = !pt_mpi_errors_return();
    if (mpi_ok) mpi_ok = !PT_MPI_CALL(MPI_Get_library_version(mpi_lib, &len));
    if (mpi_ok) {
        mpi_lib[strcspn(mpi_lib, "\n")] = '\0'; /* the first line names the library */
        for (char *c = mpi_lib; *c; c++)
            if (*c == '\t') *c = ' ';
        aware = cuda_mpi_aware();
    }
    if (mpi_ok && we_init) mpi_ok = !PT_MPI_CALL(MPI_Finalize());
    if (!mpi_ok) fprintf(stderr, "pipetrain devices: %s\n", pt_error_get());

    const topo_machine *m = t ? topo_get_machine(t) : NULL;
    int failed = !m || !mpi_ok;
    if (json) {
        if (print_json(m, topo_err, &l, mpi_lib, aware) < 0) {
            fprintf(stderr, "pipetrain: devices: %s\n", pt_error_get());
            failed = 1;
        }
    } else {
        print_text(m, topo_err, &l, mpi_lib, aware);
    }
    fflush(stdout);
    for (int d = 0; d < l.n; d++) failed |= l.failed[d];
    cuda_listing_free(&l);
    topo_free(t);
    return failed ? 1 : 0;
}
