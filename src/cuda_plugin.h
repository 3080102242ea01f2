/* The CUDA backend as a plugin: libpipetrain-cuda.so (built beside the pipetrain binary
 * when CMake finds a CUDA toolkit) holds the CUDA kernels, the CUDA engine and the device
 * queries. pipetrain loads it with dlopen only for --device cuda and `pipetrain devices`:
 * the CPU binary, its tests and every CPU run never load cudart or cuBLAS (about 0.5 s per
 * process start, docs/DESIGN.md).
 *
 * The plugin is built from this tree at the same time as the binary; the ABI number and
 * the struct sizes it reports are checked at load. It reports errors through the host's
 * pt_error_set (handed over in cuda_plugin_host), so messages reach the front end. */
#ifndef PT_CUDA_PLUGIN_H
#define PT_CUDA_PLUGIN_H

#include <mpi.h>
#include <stddef.h>

#include "src/engine.h"

#define PT_CUDA_PLUGIN_ABI 2
#define PT_CUDA_PLUGIN_ENTRY "pt_cuda_plugin_entry"
#define PT_CUDA_PLUGIN_FILE "libpipetrain-cuda.so"

typedef struct {
    char name[256];
    char pci_bus_id[32];      /* "0000:3B:00.0", cudaDeviceGetPCIBusId */
    int major, minor;         /* compute capability */
    int multiprocessors;
    size_t total_bytes, free_bytes;
    int clock_khz;            /* SM clock (for the peak below) */
    double peak_fp32_flops;   /* SMs × FP32 lanes per SM × 2 × clock; 0 if unknown */
} cuda_device_info;

/* What the host hands to the plugin. */
typedef struct {
    int abi;
    int (*error_set)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
    const char *(*error_get)(void);
} cuda_plugin_host;

/* What the plugin offers. */
typedef struct {
    int abi;
    size_t engine_size, engine_config_size, device_info_size; /* sizeof as built */
    /* Runtime and driver versions, e.g. "CUDA runtime 13.0, driver 13.0" (or why unknown). */
    int (*versions)(char *buf, size_t len);
    /* Usable devices; −1 with the reason ("no CUDA device: cudaGetDeviceCount: ...")
     * when there is no driver or no GPU. */
    int (*device_count)(int *n);
    /* Everything above; the memory query opens the device's context for a moment. */
    int (*device_info)(int device, cuda_device_info *info);
    /* Only the PCI bus id ("0000:3B:00.0"): no context is created. */
    int (*device_bus_id)(int device, char *buf, int len);
    /* The CUDA engine on cfg->device (src/engine.h). */
    int (*engine_create)(engine **e, const engine_config *cfg);
} cuda_plugin;

typedef const cuda_plugin *(*cuda_plugin_entry_fn)(const cuda_plugin_host *host);

/* Host side (src/cuda_plugin.c). Loads the plugin once per process: $PIPETRAIN_CUDA_PLUGIN
 * if set, else PT_CUDA_PLUGIN_FILE in the directory of the running executable. −1 with a
 * message naming the file and the reason (built without CUDA, dlopen error, ABI mismatch). */
int cuda_plugin_load(const cuda_plugin **out);

/* Whether the MPI library can send and receive device memory (CUDA-aware), asked at run
 * time (MPIX_GPU_query_support / MPIX_Query_cuda_support where the library has them);
 * $PIPETRAIN_CUDA_AWARE_MPI=0 or 1 overrides. After MPI_Init. */
int cuda_mpi_aware(void);

/* The CUDA device for this rank: by default local rank mod device count (several ranks may
 * share a GPU). When the rank is bound to cores (--bind) and the machine's topology places
 * GPUs (topologies/), the GPUs nearest to those cores come first. Collective over comm
 * (it splits off the node's ranks). Fills *device and, if info != NULL, its description. */
int cuda_pick_device(MPI_Comm comm, const cuda_plugin *p, int verbose, int *device,
                     cuda_device_info *info);

#endif
