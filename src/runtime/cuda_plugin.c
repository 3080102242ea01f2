/* Host side of the CUDA plugin (src/runtime/cuda_plugin.h): finding and loading
 * libpipetrain-cuda.so, asking MPI whether it is CUDA-aware, and choosing each rank's GPU.
 * Plain C without CUDA headers, so that ptcore and every binary stay free of cudart. */
#include "src/runtime/cuda_plugin.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support */
#endif

#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "topologies/topo.h"

/* The outcome of the one load attempt: a second call gets the same plugin or message. */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const cuda_plugin *loaded;
static char load_error[1024];

static const cuda_plugin_host plugin_host = {PT_CUDA_PLUGIN_ABI, pt_error_set, pt_error_get};

/* Records why the load failed. (vsnprintf: a message cut at 1 KiB is fine, and gcc's
 * truncation warnings do not apply.) */
static void load_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void load_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(load_error, sizeof load_error, fmt, ap);
    va_end(ap);
}

static void load_plugin(void)
{
    char path[PATH_MAX + 64], exe[PATH_MAX];
    const char *env = getenv("PIPETRAIN_CUDA_PLUGIN");
    if (env && *env) {
        /* dlopen searches the library path for a bare name; access() would not */
        snprintf(path, sizeof path, "%s%s", strchr(env, '/') ? "" : "./", env);
    } else {
        ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len < 0) {
            load_fail("cannot find the CUDA plugin: readlink /proc/self/exe: %s (name it in "
                      "PIPETRAIN_CUDA_PLUGIN)", strerror(errno));
            return;
        }
        exe[len] = '\0';
        char *slash = strrchr(exe, '/'); /* always there: the link is an absolute path */
        if (slash) *slash = '\0';
        snprintf(path, sizeof path, "%s/%s", exe, PT_CUDA_PLUGIN_FILE);
    }
    if (access(path, F_OK) != 0) {
        if (env && *env)
            load_fail("the CUDA plugin %s (PIPETRAIN_CUDA_PLUGIN) cannot be read: %s", path,
                      strerror(errno));
        else
#ifdef PT_CUDA_PLUGIN_BUILT
            load_fail("the CUDA plugin %s is missing: it is built beside pipetrain (cmake "
                      "--build), or name it in PIPETRAIN_CUDA_PLUGIN", path);
#else
            load_fail("this pipetrain was built without the CUDA backend (no CUDA toolkit at "
                      "configure time, or -DPT_CUDA=OFF): %s not found", path);
#endif
        return;
    }
    /* RTLD_LOCAL: the plugin's copies of ptcore and the CUDA libraries stay its own. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        load_fail("cannot load the CUDA plugin: %s", dlerror());
        return;
    }
    void *sym = dlsym(h, PT_CUDA_PLUGIN_ENTRY);
    if (!sym) {
        load_fail("%s is not a pipetrain CUDA plugin: %s", path, dlerror());
        dlclose(h);
        return;
    }
    /* ISO C has no cast from void * to a function pointer; memcpy does it */
    cuda_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    pt_error_clear();
    /* The handle stays open even on failure from here: the entry may have loaded the CUDA
     * libraries, whose exit handlers must find their code at process exit. */
    const cuda_plugin *p = entry(&plugin_host);
    if (!p) {
        load_fail("the CUDA plugin %s refused to load: %s", path,
                  *pt_error_get() ? pt_error_get() : "no reason given");
    } else if (p->abi != PT_CUDA_PLUGIN_ABI || p->engine_size != sizeof(engine) ||
               p->engine_config_size != sizeof(engine_config) ||
               p->device_info_size != sizeof(cuda_device_info)) {
        load_fail("the CUDA plugin %s does not match this pipetrain (ABI %d, struct sizes "
                  "%zu/%zu/%zu; expected ABI %d, %zu/%zu/%zu): rebuild both from one tree",
                  path, p->abi, p->engine_size, p->engine_config_size, p->device_info_size,
                  PT_CUDA_PLUGIN_ABI, sizeof(engine), sizeof(engine_config),
                  sizeof(cuda_device_info));
    } else if (!p->versions || !p->device_count || !p->device_info || !p->device_bus_id ||
               !p->engine_create) {
        load_fail("the CUDA plugin %s lacks a function", path);
    } else {
        loaded = p;
    }
}

int cuda_plugin_load(const cuda_plugin **out)
{
    *out = NULL;
    pthread_once(&load_once, load_plugin);
    if (!loaded) return pt_error_set("%s", load_error);
    *out = loaded;
    return 0;
}

int cuda_mpi_aware(void)
{
    /* The override first: some libraries are CUDA-aware without saying so at run time. */
    const char *env = getenv("PIPETRAIN_CUDA_AWARE_MPI");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) return env[0] == '1';
    int aware = 0;
#if defined(MPIX_GPU_SUPPORT_CUDA)
    int supported = 0; /* MPICH ≥ 4; a failed query means no (host-staged messages) */
    if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) == MPI_SUCCESS)
        aware = supported != 0;
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    aware = MPIX_Query_cuda_support() != 0; /* Open MPI built with CUDA */
#endif
    return aware;
}

/* ---- which GPU for this rank ---- */

enum { MAX_DEVICES = 31 }; /* one bit each in a mask that is also an MPI colour (≥ 0) */

/* The CUDA devices (bit d for device d) nearest to the cores this process is bound to:
 * those whose locality in this machine's topology holds the most of its cores. 0, with the
 * reason in `why`, when there is no such preference; `cores` lists the bound cores. */
static unsigned near_devices(const cuda_plugin *p, int n, char *why, size_t len, char *cores,
                             size_t clen)
{
    static const char not_bound[] = "not bound to a subset of the cores";
    cpu_set_t set;
    topo_t *t = NULL;
    const topo_machine *m = NULL;
    int *mine = NULL, n_mine = 0, best = 0;
    unsigned mask = 0;
    char ids[MAX_DEVICES][32];
    const char *skip = NULL, *ptrs[MAX_DEVICES];
    /* the common case, not bound, needs no topology (whose discovery takes a while) */
    if (n > MAX_DEVICES) skip = "more devices than the choice handles";
    else if (sched_getaffinity(0, sizeof set, &set) < 0) skip = "sched_getaffinity failed";
    else if (CPU_COUNT(&set) >= sysconf(_SC_NPROCESSORS_ONLN)) skip = not_bound;
    else if (topo_init(&t, NULL) < 0) skip = pt_error_get();
    else if (!(mine = malloc((size_t)(m = topo_get_machine(t))->n_cores * sizeof *mine)))
        skip = "out of memory";
    for (int c = 0; !skip && c < m->n_cores; c++)
        if (m->cores[c].pu_first >= 0 && m->cores[c].pu_first < CPU_SETSIZE &&
            CPU_ISSET(m->cores[c].pu_first, &set))
            mine[n_mine++] = c;
    topo_format_list(cores, clen, mine, n_mine);
    if (!skip && (n_mine == 0 || n_mine == m->n_cores)) skip = not_bound;
    else if (!skip && !topo_count_cuda_gpus(m)) skip = "the topology shows no NVIDIA GPU";
    for (int d = 0; !skip && d < n; d++) {
        /* the bus id alone: a full device_info would open every GPU's context */
        if (p->device_bus_id(d, ids[d], (int)sizeof ids[d]) < 0) skip = pt_error_get();
        ptrs[d] = ids[d];
    }
    /* not fatal: a container may hide PCI devices from hwloc */
    if (!skip && topo_match_cuda(t, ptrs, n) < 0) skip = pt_error_get();
    for (int g = 0; !skip && g < m->n_gpus; g++) {
        const topo_gpu *gpu = &m->gpus[g];
        int overlap = 0;
        for (int i = 0; i < gpu->n_near; i++)
            for (int j = 0; j < n_mine; j++) overlap += gpu->near[i] == mine[j];
        if (gpu->cuda_index < 0 || overlap == 0 || overlap < best) continue;
        if (overlap > best) best = overlap, mask = 0;
        mask |= 1u << gpu->cuda_index;
    }
    if (!skip && !mask) skip = "no GPU is local to its cores";
    if (skip) snprintf(why, len, "%s", skip);
    free(mine);
    topo_free(t);
    return mask;
}

static int bit_count(unsigned m)
{
    int c = 0;
    for (; m; m &= m - 1) c++;
    return c;
}

int cuda_pick_device(MPI_Comm comm, const cuda_plugin *p, int verbose, double timeout_s,
                     int *device, cuda_device_info *info)
{
    *device = -1;
    int rank, size, lrank, lsize, n = 0, ok = 1, pos = 0, sharing = 0;
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    char host[64] = "?", err[512] = "", why[512] = "", cores[128] = "", how[1024] = "";
    gethostname(host, sizeof host - 1);
    MPI_Comm local, group;
    if (mpi_wait_split_node(comm, rank, timeout_s, &local)) return -1;
    PT_MPI_CHECK(MPI_Comm_rank(local, &lrank));
    PT_MPI_CHECK(MPI_Comm_size(local, &lsize));
    const int rc = p->device_count(&n);
    if (rc < 0 || n <= 0) {
        snprintf(err, sizeof err, "%s", rc < 0 ? pt_error_get()
                 : "no CUDA device: the driver lists none");
        ok = 0;
    }
    /* Whatever happened, every rank takes part in the same collectives below. The ranks
     * with the same nearest GPUs take them in turn, in local rank order. */
    unsigned mask = ok ? near_devices(p, n, why, sizeof why, cores, sizeof cores) : 0;
    if (mpi_wait_split(local, mask ? (int)mask : MPI_UNDEFINED, lrank, timeout_s, &group)) {
        MPI_Comm_free(&local);
        return -1;
    }
    if (group != MPI_COMM_NULL) {
        PT_MPI_CHECK(MPI_Comm_rank(group, &pos));
        PT_MPI_CHECK(MPI_Comm_size(group, &sharing));
        PT_MPI_CHECK(MPI_Comm_free(&group));
    }
    PT_MPI_CHECK(MPI_Comm_free(&local));

    if (ok && mask) {
        char list[MAX_DEVICES * 4] = "";
        for (int d = 0, k = pos % bit_count(mask); d < n; d++) {
            if (!(mask >> d & 1)) continue;
            if (k-- == 0) *device = d;
            snprintf(list + strlen(list), sizeof list - strlen(list), ",%d", d);
        }
        char turns[64] = "";
        if (sharing > 1) snprintf(turns, sizeof turns, "; %d ranks there take turns", sharing);
        snprintf(how, sizeof how, "nearest to its cores %s (device%s %s local to them%s)", cores,
                 bit_count(mask) > 1 ? "s" : "", list + 1, turns);
    } else if (ok) {
        *device = lrank % n;
        snprintf(how, sizeof how, "local rank %d of %d, modulo %d device%s (%s)", lrank,
                 lsize, n, n > 1 ? "s" : "", why);
    }
    cuda_device_info mine = {0};
    if (ok && (info || verbose) && p->device_info(*device, &mine) < 0) {
        snprintf(err, sizeof err, "%s", pt_error_get());
        ok = 0;
    }
    if (ok && info) *info = mine;
    if (verbose) {
        /* one line per rank, in rank order, printed by rank 0 */
        char line[2048];
        if (ok)
            snprintf(line, sizeof line, "rank %d on %s: CUDA device %d (%s, %s): %s", rank,
                     host, *device, mine.name, mine.pci_bus_id, how);
        else
            snprintf(line, sizeof line, "rank %d on %s: %s", rank, host, err);
        enum { TAG = 0x7c0d };
        if (rank != 0) PT_MPI_CHECK(MPI_Send(line, sizeof line, MPI_CHAR, 0, TAG, comm));
        for (int r = 0; rank == 0 && r < size; r++) {
            if (r) PT_MPI_CHECK(MPI_Recv(line, sizeof line, MPI_CHAR, r, TAG, comm,
                                         MPI_STATUS_IGNORE));
            printf("%s\n", line);
        }
        fflush(stdout);
    }
    return ok ? 0 : pt_error_set("%s", err);
}
