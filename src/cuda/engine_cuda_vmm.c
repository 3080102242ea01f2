/* ZeRO-2 and 3 on the CUDA engine (issue 27): a flat float array whose device memory is
 * mapped granule by granule through the driver's virtual memory management (cuMemAddress-
 * Reserve, cuMemCreate, cuMemMap, cuMemUnmap: what PyTorch's expandable segments use). The
 * array keeps its address for the run, so every kernel, copy and offset of the engine stays
 * as it is; only its physical memory comes and goes, as the CPU engine's pages do
 * (src/base/pages.h). See engine_cuda_impl.h (cuda_vmm) for the rules. The driver is
 * reached through cudart (cudaGetDriverEntryPointByVersion), as src/cuda/plugin.c does, so
 * that the plugin does not link libcuda and the mock runtime (tests/cuda/mock_cuda.c) can
 * stand in for it. */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "src/base/error.h"
#include "src/cuda/engine_cuda_impl.h"

typedef CUresult (*fn_granularity)(size_t *, const CUmemAllocationProp *,
                                   CUmemAllocationGranularity_flags);
typedef CUresult (*fn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*fn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*fn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*fn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
typedef CUresult (*fn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*fn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);

static struct {
    int loaded;
    fn_granularity granularity;
    fn_reserve reserve;
    fn_addr_free addr_free;
    fn_create create;
    fn_release release;
    fn_map map;
    fn_unmap unmap;
    fn_access access;
} drv;

static int symbol(const char *name, void **fn)
{
    enum cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !*fn) {
        (void)cudaGetLastError();
        return pt_error_set("CUDA engine: the driver has no %s (virtual memory management, "
                            "which --zero 2 and 3 need on the GPU)", name);
    }
    return 0;
}

static int load_driver(void)
{
    if (drv.loaded) return 0;
    if (symbol("cuMemGetAllocationGranularity", (void **)&drv.granularity) ||
        symbol("cuMemAddressReserve", (void **)&drv.reserve) ||
        symbol("cuMemAddressFree", (void **)&drv.addr_free) ||
        symbol("cuMemCreate", (void **)&drv.create) ||
        symbol("cuMemRelease", (void **)&drv.release) ||
        symbol("cuMemMap", (void **)&drv.map) || symbol("cuMemUnmap", (void **)&drv.unmap) ||
        symbol("cuMemSetAccess", (void **)&drv.access))
        return -1;
    drv.loaded = 1;
    return 0;
}

#define DRV(call, what)                                                                      \
    do {                                                                                     \
        CUresult drv_rc_ = (call);                                                           \
        if (drv_rc_ != CUDA_SUCCESS)                                                         \
            return pt_error_set("CUDA engine: %s failed (CUresult %d)", what, (int)drv_rc_); \
    } while (0)

static CUmemAllocationProp alloc_prop(int device)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    return p;
}

/* Bytes of granule g that the array uses (the last one may be partly past its end). */
static size_t granule_bytes(const cuda_vmm *v, size_t g)
{
    size_t end = v->bytes, at = g * v->gran;
    return end - at < v->gran ? end - at : v->gran;
}

static void count_peak(cuda_vmm *v)
{
    size_t held = v->mapped + v->n_pool * v->gran;
    if (held > v->peak) v->peak = held;
}

/* Physical memory for granule g: a kept handle, else a new one; mapped read-write. */
static int map_granule(cuda_vmm *v, size_t g)
{
    CUmemGenericAllocationHandle h;
    if (v->n_pool) {
        h = v->pool[--v->n_pool];
    } else {
        CUmemAllocationProp p = alloc_prop(v->device);
        CUresult r = drv.create(&h, v->gran, &p, 0);
        if (r != CUDA_SUCCESS)
            return pt_error_set("CUDA engine: cannot allocate %zu bytes of device memory for "
                                "the %s (cuMemCreate: CUresult %d)", v->gran, v->what, (int)r);
    }
    CUdeviceptr at = (CUdeviceptr)(v->base + g * v->gran);
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location = alloc_prop(v->device).location;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DRV(drv.map(at, v->gran, 0, h, 0), "cuMemMap");
    DRV(drv.access(at, v->gran, &a, 1), "cuMemSetAccess");
    v->h[g] = h;
    v->mapped += v->gran;
    count_peak(v);
    return 0;
}

/* Granule g unmapped; its memory kept (up to `keep` bytes) for the next map, else freed.
 * The caller has made sure that no queued device work touches it. */
static int unmap_granule(cuda_vmm *v, size_t g)
{
    DRV(drv.unmap((CUdeviceptr)(v->base + g * v->gran), v->gran), "cuMemUnmap");
    if ((v->n_pool + 1) * v->gran <= v->keep) v->pool[v->n_pool++] = v->h[g];
    else DRV(drv.release(v->h[g]), "cuMemRelease");
    v->h[g] = 0;
    v->pending[g] = 0;
    v->mapped -= v->gran;
    return 0;
}

int engine_cuda_vmm_init(cuda_vmm *v, int device, size_t floats, const char *what)
{
    memset(v, 0, sizeof *v);
    v->device = device;
    v->what = what;
    if (load_driver()) return -1;
    CUmemAllocationProp p = alloc_prop(device);
    DRV(drv.granularity(&v->gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
    if (!v->gran || v->gran % 256) /* whole 64-bit words of the live map per granule */
        return pt_error_set("CUDA engine: allocation granularity %zu", v->gran);
    v->bytes = floats * sizeof(float);
    v->n = (v->bytes + v->gran - 1) / v->gran;
    size_t words = (floats + 63) / 64;
    v->h = calloc(v->n + 1, sizeof *v->h);
    v->pool = calloc(v->n + 1, sizeof *v->pool);
    v->nlive = calloc(v->n + 1, sizeof *v->nlive);
    v->pending = calloc(v->n + 1, 1);
    v->live = calloc(words + 1, sizeof *v->live);
    if (!v->h || !v->pool || !v->nlive || !v->pending || !v->live)
        return pt_error_set("CUDA engine: out of host memory for the %s' map", what);
    CUdeviceptr base;
    DRV(drv.reserve(&base, (v->n ? v->n : 1) * v->gran, 0, 0, 0), "cuMemAddressReserve");
    v->base = (char *)base;
    v->reserved = 1;
    for (int k = 0; k < 2; k++)
        CUDA_CHECK(cudaEventCreateWithFlags(&v->ev[k], cudaEventDisableTiming));
    return 0;
}

void engine_cuda_vmm_free(cuda_vmm *v)
{
    if (v->reserved && drv.loaded) {
        for (size_t g = 0; g < v->n; g++)
            if (v->h[g]) {
                (void)drv.unmap((CUdeviceptr)(v->base + g * v->gran), v->gran);
                (void)drv.release(v->h[g]);
            }
        for (size_t k = 0; k < v->n_pool; k++) (void)drv.release(v->pool[k]);
        (void)drv.addr_free((CUdeviceptr)v->base, (v->n ? v->n : 1) * v->gran);
    }
    for (int k = 0; k < 2; k++)
        if (v->ev[k]) (void)cudaEventDestroy(v->ev[k]);
    free(v->h);
    free(v->pool);
    free(v->nlive);
    free(v->pending);
    free(v->live);
    memset(v, 0, sizeof *v);
}

static int bit(const cuda_vmm *v, size_t i) { return (int)(v->live[i / 64] >> (i % 64) & 1); }

/* The end of the run of floats from `off` (before `end`) that are all live or all not. */
size_t engine_cuda_vmm_run(const cuda_vmm *v, size_t off, size_t end, int *live)
{
    *live = bit(v, off);
    uint64_t full = *live ? ~(uint64_t)0 : 0;
    size_t i = off + 1;
    while (i < end) {
        if (i % 64 == 0 && i + 64 <= end && v->live[i / 64] == full) {
            i += 64;
            continue;
        }
        if (bit(v, i) != *live) break;
        i++;
    }
    return i;
}

/* Sets (on) or clears the bits of [off, off + count), counting the live floats per granule:
 * word by word where a word lies inside one granule (granules are whole words: at least 256
 * bytes), bit by bit at the ends. */
static void set_bits(cuda_vmm *v, size_t off, size_t count, int on)
{
    size_t fpg = v->gran / sizeof(float), end = off + count, i = off;
    while (i < end) {
        size_t w = i / 64, b = i % 64, n = end - i < 64 - b ? end - i : 64 - b;
        uint64_t m = (n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1)) << b;
        uint64_t changed = on ? m & ~v->live[w] : m & v->live[w];
        size_t k = (size_t)__builtin_popcountll(changed);
        if (on) v->live[w] |= m, v->nlive[i / fpg] += k;
        else v->live[w] &= ~m, v->nlive[i / fpg] -= k;
        i += n;
    }
}

int engine_cuda_vmm_live(cuda_vmm *v, size_t off, size_t count, cudaStream_t zero_on)
{
    if (!count) return 0;
    size_t end = off + count, fpg = v->gran / sizeof(float);
    if (end * sizeof(float) > v->bytes)
        return pt_error_set("CUDA engine: %s [%zu, %zu) outside the %zu", v->what, off, end,
                            v->bytes / sizeof(float));
    for (size_t g = off / fpg; g <= (end - 1) / fpg; g++) {
        v->pending[g] = 0; /* needed again: a deferred unmap is called off */
        if (!v->h[g] && map_granule(v, g)) return -1;
    }
    /* the floats that come back read as zero (where asked): the runs not live before */
    for (size_t at = off; zero_on && at < end;) {
        int live;
        size_t to = engine_cuda_vmm_run(v, at, end, &live);
        if (!live)
            CUDA_CHECK(cudaMemsetAsync(v->base + at * sizeof(float), 0,
                                       (to - at) * sizeof(float), zero_on));
        at = to;
    }
    set_bits(v, off, count, 1);
    return 0;
}

/* Granules left with nothing live are unmapped at once, or (defer) marked for the next
 * engine_cuda_vmm_flip. */
int engine_cuda_vmm_release(cuda_vmm *v, size_t off, size_t count, int defer)
{
    size_t end = off + count, fpg = v->gran / sizeof(float);
    if (end * sizeof(float) > v->bytes)
        return pt_error_set("CUDA engine: %s [%zu, %zu) released, outside the %zu", v->what,
                            off, end, v->bytes / sizeof(float));
    set_bits(v, off, count, 0);
    for (size_t g = count ? off / fpg : 1; count && g <= (end - 1) / fpg; g++) {
        if (!v->h[g] || v->nlive[g]) continue;
        if (defer) v->pending[g] = (unsigned char)(1 + v->gen), v->has[v->gen] = 1;
        else if (unmap_granule(v, g)) return -1;
    }
    return 0;
}

/* Unmaps the granules marked in generation k (still with nothing live) once its event is
 * done. */
static int reap(cuda_vmm *v, int k)
{
    if (!v->has[k]) return 0;
    CUDA_CHECK(cudaEventSynchronize(v->ev[k]));
    v->has[k] = 0;
    for (size_t g = 0; g < v->n; g++) {
        if (v->pending[g] != 1 + k) continue;
        v->pending[g] = 0;
        if (!v->nlive[g] && v->h[g] && unmap_granule(v, g)) return -1;
    }
    return 0;
}

int engine_cuda_vmm_flip(cuda_vmm *v, cudaStream_t stream)
{
    int old = 1 - v->gen;
    if (reap(v, old)) return -1;
    if (v->has[v->gen]) CUDA_CHECK(cudaEventRecord(v->ev[v->gen], stream));
    v->gen = old;
    return 0;
}

int engine_cuda_vmm_settle(cuda_vmm *v, cudaStream_t stream)
{
    if (v->has[v->gen]) CUDA_CHECK(cudaEventRecord(v->ev[v->gen], stream));
    return reap(v, 0) || reap(v, 1) ? -1 : 0;
}

int engine_cuda_vmm_keep(cuda_vmm *v, size_t bytes)
{
    v->keep = bytes;
    while (v->n_pool && v->n_pool * v->gran > v->keep)
        DRV(drv.release(v->pool[--v->n_pool]), "cuMemRelease");
    return 0;
}
