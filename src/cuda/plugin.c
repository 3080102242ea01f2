/* The CUDA plugin's entry (src/runtime/cuda_plugin.h): libpipetrain-cuda.so exports only
 * pt_cuda_plugin_entry, which hands the host the device queries and the CUDA engine.
 * Everything else in the plugin is hidden (C_VISIBILITY_PRESET hidden, --exclude-libs). */
#include "src/engine/cuda_abi.h"

#include <cuda.h> /* driver API types only: its functions are reached through cudart */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "src/cuda/engine_cuda.h"
#include "src/base/error.h"

/* src/cuda/plugin_error.c: routes this plugin's pt_error_set to the host's. */
void plugin_error_connect(const cuda_plugin_host *host);

#define CHECK(call)                                                                        \
    do {                                                                                   \
        const cudaError_t e_ = (call);                                                     \
        if (e_ != cudaSuccess)                                                             \
            return pt_error_set("%s: %s (%s)", #call, cudaGetErrorString(e_),              \
                                cudaGetErrorName(e_));                                     \
    } while (0)

static int plugin_versions(char *buf, size_t len)
{
    int runtime = 0, driver = 0;
    CHECK(cudaRuntimeGetVersion(&runtime));
    /* 0 and success when no driver is installed */
    CHECK(cudaDriverGetVersion(&driver));
    if (driver)
        snprintf(buf, len, "CUDA runtime %d.%d, driver %d.%d", runtime / 1000,
                 runtime % 1000 / 10, driver / 1000, driver % 1000 / 10);
    else
        snprintf(buf, len, "CUDA runtime %d.%d, no driver", runtime / 1000,
                 runtime % 1000 / 10);
    return 0;
}

static int plugin_device_count(int *n)
{
    /* Without a driver cudaGetDeviceCount fails with cudaErrorInsufficientDriver and does
     * not write the count: hence the 0 first. */
    int count = 0;
    *n = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return pt_error_set("no CUDA device: cudaGetDeviceCount: %s (%s)",
                            cudaGetErrorString(e), cudaGetErrorName(e));
    if (count <= 0) return pt_error_set("no CUDA device: cudaGetDeviceCount found none");
    *n = count;
    return 0;
}

/* The driver API functions for a memory query, reached through cudart
 * (cudaGetDriverEntryPointByVersion) so that the plugin does not link libcuda. */
typedef struct {
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*release)(CUdevice);
    CUresult (*push)(CUcontext);
    CUresult (*pop)(CUcontext *);
    CUresult (*mem_get_info)(size_t *, size_t *);
} driver_api;

static int driver_symbol(const char *name, void *fn)
{
    void *p = NULL;
    enum cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess || found != cudaDriverEntryPointSuccess || !p)
        return -1;
    memcpy(fn, &p, sizeof p); /* void * to function pointer */
    return 0;
}

/* Free and total memory of a device. cudaMemGetInfo needs the device's context, which
 * takes hundreds of MB of device memory for the life of the process: a rank that lists
 * every GPU to choose its own must not leave one on each. So the primary context is
 * retained only for the query and released after: it disappears again unless something
 * else (the runtime, for a device already in use) holds it. */
static int device_memory(int device, size_t *free_bytes, size_t *total_bytes)
{
    driver_api d;
    CUdevice dev;
    CUcontext ctx, popped;
    if (driver_symbol("cuDeviceGet", &d.device_get) ||
        driver_symbol("cuDevicePrimaryCtxRetain", &d.retain) ||
        driver_symbol("cuDevicePrimaryCtxRelease", &d.release) ||
        driver_symbol("cuCtxPushCurrent", &d.push) || driver_symbol("cuCtxPopCurrent", &d.pop) ||
        driver_symbol("cuMemGetInfo", &d.mem_get_info))
        return pt_error_set("CUDA device %d: driver entry points for the memory query "
                            "missing", device);
    if (d.device_get(&dev, device) != CUDA_SUCCESS || d.retain(&ctx, dev) != CUDA_SUCCESS)
        return pt_error_set("CUDA device %d: cannot open a context for the memory query",
                            device);
    CUresult r = d.push(ctx);
    if (r == CUDA_SUCCESS) {
        r = d.mem_get_info(free_bytes, total_bytes);
        d.pop(&popped);
    }
    d.release(dev);
    if (r != CUDA_SUCCESS)
        return pt_error_set("CUDA device %d: cuMemGetInfo failed (CUresult %d)", device, (int)r);
    return 0;
}

static int plugin_device_info(int device, cuda_device_info *info)
{
    memset(info, 0, sizeof *info);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count)
        return pt_error_set("CUDA device %d does not exist (%d device%s)", device, count,
                            count == 1 ? "" : "s");
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, device));
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    CHECK(cudaDeviceGetPCIBusId(info->pci_bus_id, (int)sizeof info->pci_bus_id, device));
    info->major = prop.major;
    info->minor = prop.minor;
    info->multiprocessors = prop.multiProcessorCount;
    /* cudaDeviceProp lost clockRate in CUDA 13; the attribute remains */
    CHECK(cudaDeviceGetAttribute(&info->clock_khz, cudaDevAttrClockRate, device));
    info->total_bytes = prop.totalGlobalMem;
    if (device_memory(device, &info->free_bytes, &info->total_bytes) < 0) return -1;
    int estimate;
    const int lanes = cuda_fp32_lanes_per_sm(info->major, info->minor, &estimate);
    /* an FMA counts as two operations */
    info->peak_fp32_flops = (double)info->multiprocessors * lanes * 2.0 * info->clock_khz * 1e3;
    return 0;
}

static int plugin_device_bus_id(int device, char *buf, int len)
{
    CHECK(cudaDeviceGetPCIBusId(buf, len, device));
    return 0;
}

static const cuda_plugin plugin = {
    .abi = PT_CUDA_PLUGIN_ABI,
    .engine_size = sizeof(engine),
    .engine_config_size = sizeof(engine_config),
    .device_info_size = sizeof(cuda_device_info),
    .versions = plugin_versions,
    .device_count = plugin_device_count,
    .device_info = plugin_device_info,
    .device_bus_id = plugin_device_bus_id,
    .engine_create = engine_cuda_create,
};

__attribute__((visibility("default"))) const cuda_plugin *
pt_cuda_plugin_entry(const cuda_plugin_host *host);

const cuda_plugin *pt_cuda_plugin_entry(const cuda_plugin_host *host)
{
    /* Only the ABI number is read before it is known to match: the rest of the struct may
     * be laid out differently by another version. */
    if (!host || host->abi != PT_CUDA_PLUGIN_ABI) return NULL;
    plugin_error_connect(host);
    return &plugin;
}
