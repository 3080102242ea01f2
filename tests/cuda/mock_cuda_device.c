/* With tests/cuda/mock_cuda.c, the CUDA plugin built over a mock runtime
 * (libpipetrain-cuda-mock.so, for tests/cuda_mock_e2e.sh): one fake device, "Mock GPU",
 * whose kernels are the CPU kernels, and the few runtime and driver queries that
 * src/cuda/plugin.c makes. $PT_MOCK_CUDA_MODE picks the mock's scheduling (see
 * mock_cuda.c; 2 = random, which progresses work at every API call as a GPU would on its
 * own). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (device != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "Mock GPU (CPU kernels)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 1;
    p->totalGlobalMem = (size_t)1 << 30;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int device)
{
    if (device != 0) return cudaErrorInvalidDevice;
    snprintf(buf, (size_t)len, "0000:00:00.0");
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int device)
{
    (void)attr;
    if (device != 0) return cudaErrorInvalidDevice;
    *v = 1000000; /* the clock rate, kHz: the only attribute asked */
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* The driver entry points of the plugin's memory query. */
static CUresult fake_device_get(CUdevice *d, int ordinal)
{
    *d = ordinal;
    return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
static CUresult fake_retain(CUcontext *c, CUdevice d)
{
    (void)d;
    *c = (CUcontext)1;
    return CUDA_SUCCESS;
}
static CUresult fake_release(CUdevice d)
{
    (void)d;
    return CUDA_SUCCESS;
}
static CUresult fake_push(CUcontext c)
{
    (void)c;
    return CUDA_SUCCESS;
}
static CUresult fake_pop(CUcontext *c)
{
    *c = (CUcontext)1;
    return CUDA_SUCCESS;
}
static CUresult fake_mem_get_info(size_t *free_bytes, size_t *total)
{
    *free_bytes = *total = (size_t)1 << 30;
    return CUDA_SUCCESS;
}

void *mock_vmm_symbol(const char *name);

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                             unsigned int version, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status)
{
    (void)version, (void)flags;
    static const struct { const char *name; void *fn; } table[] = {
        {"cuDeviceGet", (void *)fake_device_get},
        {"cuDevicePrimaryCtxRetain", (void *)fake_retain},
        {"cuDevicePrimaryCtxRelease", (void *)fake_release},
        {"cuCtxPushCurrent", (void *)fake_push},
        {"cuCtxPopCurrent", (void *)fake_pop},
        {"cuMemGetInfo", (void *)fake_mem_get_info},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(symbol, table[i].name)) {
            *fn = table[i].fn;
            *status = cudaDriverEntryPointSuccess;
            return cudaSuccess;
        }
    *fn = mock_vmm_symbol(symbol); /* mock_cuda.c: the virtual memory management */
    *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
