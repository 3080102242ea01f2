/* Included by tests/cuda/mock_cuda.c: the driver's virtual memory management (the calls
 * src/cuda/engine_cuda_vmm.c reaches through cudaGetDriverEntryPointByVersion), emulated
 * with host mappings so that a use after unmap is caught, not silently served:
 *   cuMemAddressReserve  an inaccessible range (PROT_NONE), registered as device memory;
 *   cuMemCreate          a memfd of the granule's size, filled with garbage (0xA5) as
 *                        cudaMalloc's memory is: the engine must zero what it needs zeroed;
 *   cuMemMap             the memfd mapped at the address, still inaccessible...
 *   cuMemSetAccess       ...until its access is set (read-write);
 *   cuMemUnmap           the address made inaccessible again: any kernel or copy that
 *                        touches it later (one still queued on a stream included) faults
 *                        (SIGSEGV) — the test fails, as on a GPU it would be an illegal
 *                        address or silent corruption;
 *   cuMemRelease         the memfd closed (its memory freed once unmapped).
 * The granularity is $PT_MOCK_CUDA_GRANULE bytes (default 4096, a host page; a GPU's is
 * 2 MiB), so that the tests' small models see their memory come and go. mock_vmm_mapped
 * counts the bytes mapped now. */
#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

size_t mock_vmm_mapped = 0;

typedef struct {
    int fd;
    size_t size;
} mock_handle;

static size_t mock_granule(void)
{
    const char *g = getenv("PT_MOCK_CUDA_GRANULE");
    long v = g ? atol(g) : 4096;
    return v >= 4096 && v % 4096 == 0 ? (size_t)v : 4096;
}

static CUresult mock_granularity(size_t *g, const CUmemAllocationProp *p,
                                 CUmemAllocationGranularity_flags f)
{
    (void)p, (void)f;
    *g = mock_granule();
    return CUDA_SUCCESS;
}

static CUresult mock_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags)
{
    (void)align, (void)addr, (void)flags;
    if (!size || size % mock_granule()) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    add_region(p, size, 1);
    *ptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

static CUresult mock_addr_free(CUdeviceptr ptr, size_t size)
{
    del_region((void *)ptr);
    munmap((void *)ptr, size);
    return CUDA_SUCCESS;
}

static CUresult mock_create(CUmemGenericAllocationHandle *h, size_t size,
                            const CUmemAllocationProp *p, unsigned long long flags)
{
    (void)p, (void)flags;
    if (!size || size % mock_granule()) return CUDA_ERROR_INVALID_VALUE;
    mock_handle *m = malloc(sizeof *m);
    int fd = memfd_create("mock-cuda-granule", 0);
    if (!m || fd < 0 || ftruncate(fd, (off_t)size)) die("cuMemCreate: no host memory");
    void *w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (w == MAP_FAILED) die("cuMemCreate: mmap");
    memset(w, 0xA5, size);
    munmap(w, size);
    *m = (mock_handle){fd, size};
    *h = (CUmemGenericAllocationHandle)(uintptr_t)m;
    return CUDA_SUCCESS;
}

static CUresult mock_release(CUmemGenericAllocationHandle h)
{
    mock_handle *m = (mock_handle *)(uintptr_t)h;
    close(m->fd);
    free(m);
    return CUDA_SUCCESS;
}

static CUresult mock_map(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle h, unsigned long long flags)
{
    (void)flags;
    mock_handle *m = (mock_handle *)(uintptr_t)h;
    if (!is_device((void *)ptr) || offset + size > m->size) return CUDA_ERROR_INVALID_VALUE;
    if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, m->fd, (off_t)offset) ==
        MAP_FAILED)
        die("cuMemMap: mmap");
    mock_vmm_mapped += size;
    return CUDA_SUCCESS;
}

static CUresult mock_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *d, size_t n)
{
    if (n != 1 || d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
    if (mprotect((void *)ptr, size, PROT_READ | PROT_WRITE)) die("cuMemSetAccess: mprotect");
    return CUDA_SUCCESS;
}

static CUresult mock_unmap(CUdeviceptr ptr, size_t size)
{
    if (mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
             MAP_FIXED, -1, 0) == MAP_FAILED)
        die("cuMemUnmap: mmap");
    mock_vmm_mapped -= size;
    return CUDA_SUCCESS;
}

void *mock_vmm_symbol(const char *name)
{
    static const struct { const char *name; void *fn; } table[] = {
        {"cuMemGetAllocationGranularity", (void *)mock_granularity},
        {"cuMemAddressReserve", (void *)mock_reserve},
        {"cuMemAddressFree", (void *)mock_addr_free},
        {"cuMemCreate", (void *)mock_create},
        {"cuMemRelease", (void *)mock_release},
        {"cuMemMap", (void *)mock_map},
        {"cuMemSetAccess", (void *)mock_access},
        {"cuMemUnmap", (void *)mock_unmap},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(name, table[i].name)) return table[i].fn;
    return NULL;
}

/* Where the device part of the mock (mock_cuda_device.c) is not linked (the engine's unit
 * test): the driver entry points are the VMM's alone. */
__attribute__((weak)) cudaError_t
cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                 unsigned long long flags,
                                 enum cudaDriverEntryPointQueryResult *status)
{
    (void)version, (void)flags;
    *fn = mock_vmm_symbol(symbol);
    *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
