/* What the host and the CUDA plugin share (the loader: src/runtime/cuda_plugin.h).
 *
 * The CUDA backend as a plugin: libpipetrain-cuda.so (built beside the pipetrain binary
 * when CMake finds a CUDA toolkit) holds the CUDA kernels, the CUDA engine and the device
 * queries. pipetrain loads it with dlopen only for --device cuda and `pipetrain devices`:
 * the CPU binary, its tests and every CPU run never load cudart or cuBLAS (about 0.5 s per
 * process start, docs/DESIGN.md).
 *
 * The plugin is built from this tree at the same time as the binary; the ABI number and
 * the struct sizes it reports are checked at load. It reports errors through the host's
 * pt_error_set (handed over in cuda_plugin_host), so messages reach the front end. */
#ifndef PT_CUDA_ABI_H
#define PT_CUDA_ABI_H

#include <mpi.h>
#include <stddef.h>

#include "src/engine/engine.h"

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
    /* The CUDA engine on cfg->device (src/engine/engine.h). */
    int (*engine_create)(engine **e, const engine_config *cfg);
} cuda_plugin;

typedef const cuda_plugin *(*cuda_plugin_entry_fn)(const cuda_plugin_host *host);

/* FP32 lanes (CUDA cores) per streaming multiprocessor for compute capability
 * major.minor, for peak estimates; *estimate is set to 1 for capabilities not in the
 * table (128 is then a guess). Shared by the plugin, which computes the peak, and the
 * listing, which marks guessed peaks. */
static inline int cuda_fp32_lanes_per_sm(int major, int minor, int *estimate)
{
    *estimate = 0;
    if (major == 7 || (major == 8 && minor == 0))
        return 64; /* Volta, Turing, A100 */
    if ((major == 8 && (minor == 6 || minor == 9)) || (major == 9 && minor == 0) ||
        major == 10 || major == 12)
        return 128; /* consumer Ampere, Ada, Hopper, Blackwell */
    *estimate = 1;
    return 128;
}

#endif
