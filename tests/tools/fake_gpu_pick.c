/* For tests/gpu_pick.sh: cuda_pick_device (src/runtime/cuda_plugin.c) with a fake CUDA plugin whose
 * devices have the PCI bus ids listed in $BUSIDS (comma-separated; empty: no device), so
 * the GPU choice per rank is tested on a machine without a GPU. Each rank writes one line,
 * "RESULT rank R device D BUSID" or "RESULT rank R failed: MESSAGE", to the file
 * $RESULT_PREFIX.R (ranks writing to one stream would interleave with the choice's own
 * --verbose lines). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/runtime/cuda_plugin.h"
#include "src/base/error.h"

static char ids[32][32];
static int n_ids;

static int fake_versions(char *buf, size_t len)
{
    snprintf(buf, len, "fake");
    return 0;
}

static int fake_count(int *n)
{
    *n = n_ids;
    return n_ids ? 0 : pt_error_set("no CUDA device: the fake plugin has none");
}

static int fake_bus_id(int d, char *buf, int len)
{
    if (d < 0 || d >= n_ids) return pt_error_set("fake device %d does not exist", d);
    snprintf(buf, (size_t)len, "%s", ids[d]);
    return 0;
}

static int fake_info(int d, cuda_device_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "Fake GPU %d", d);
    return fake_bus_id(d, info->pci_bus_id, (int)sizeof info->pci_bus_id);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const char *env = getenv("BUSIDS");
    char *list = strdup(env ? env : "");
    for (char *t = strtok(list, ","); t && n_ids < 32; t = strtok(NULL, ","))
        snprintf(ids[n_ids++], sizeof ids[0], "%s", t);
    free(list);
    cuda_plugin p = {.abi = PT_CUDA_PLUGIN_ABI, .engine_size = sizeof(engine),
                     .engine_config_size = sizeof(engine_config),
                     .device_info_size = sizeof(cuda_device_info), .versions = fake_versions,
                     .device_count = fake_count, .device_info = fake_info,
                     .device_bus_id = fake_bus_id};
    int rank, device = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    cuda_device_info info;
    int rc = cuda_pick_device(MPI_COMM_WORLD, &p, 1, 60, &device, &info);
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", getenv("RESULT_PREFIX") ? getenv("RESULT_PREFIX")
                                                                 : "gpu_pick", rank);
    FILE *f = fopen(path, "w");
    if (f) {
        if (rc) fprintf(f, "RESULT rank %d failed: %s\n", rank, pt_error_get());
        else fprintf(f, "RESULT rank %d device %d %s\n", rank, device, info.pci_bus_id);
        fclose(f);
    }
    MPI_Finalize();
    return rc ? 1 : 0;
}
