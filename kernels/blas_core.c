/* Which of OpenBLAS's kernels run the products, and a better choice where it chose badly.
 *
 * A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels once, when it loads, from the CPU's
 * model number, and falls back to Prescott's SSE3 kernels on a model it does not know:
 * 0.3.21 (Debian 12) does so on an Emerald Rapids Xeon (family 6, model 207), where its
 * sgemm then runs 4.5× slower than with the AVX-512 kernels the CPU can run (20–30 against
 * 143 GF/s, docs/PERFORMANCE.md). OPENBLAS_CORETYPE, read at load, is the only way to choose
 * otherwise, so the choice needs a new image of the process (kernel_blas_core_upgrade). */
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* OpenBLAS's own (not CBLAS'), declared as kernels/dense.c does */
char *openblas_get_corename(void);

const char *kernel_blas_core(void) { return openblas_get_corename(); }

/* The fallbacks of OpenBLAS's detection and the cores older than AVX2: the only ones
 * replaced, so that a choice OpenBLAS made on purpose (Zen's Haswell kernels) stays. */
static int pre_avx2(const char *core)
{
    static const char *const old[] = {"Unknown", "Katmai", "Coppermine", "Northwood",
                                      "Prescott", "Banias", "Atom", "Core2", "Penryn",
                                      "Dunnington", "Nehalem", "Athlon", "Opteron",
                                      "Opteron(SSE3)", "Barcelona", "Nano", "Sandybridge",
                                      "Bobcat", "Bulldozer", "Piledriver", "Steamroller"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (!strcmp(core, old[i])) return 1;
    return 0;
}

const char *kernel_blas_core_upgrade(void)
{
    const char *core = kernel_blas_core();
    if (!core || !pre_avx2(core)) return NULL;
    __builtin_cpu_init();
    /* libgcc's checks include the operating system's support of the registers (XCR0) */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SKYLAKEX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "HASWELL";
    return NULL;
}

/* OpenBLAS made two choices as it loaded, before main, that only a new image of the process
 * undoes (the variables are read at load):
 * - its kernels: a fallback (4.5× slower products) where kernel_blas_core_upgrade has
 *   better ones;
 * - a pool of one thread per core. Every product runs on the calling thread
 *   (kernel_blas_threads(1)), yet the idle pool spins for about 0.1 s after it starts:
 *   0.16 s of CPU per process on 2 cores, more than a small run's work, and (cores − 1)
 *   spinning threads on every rank of a node. The exec costs about 10 ms.
 * PIPETRAIN_BLAS_DETECTED keeps OpenBLAS's choice of kernels for the report. */
void kernel_blas_restart(char **argv)
{
    const char *better = getenv("OPENBLAS_CORETYPE") ? NULL : kernel_blas_core_upgrade();
    const int pool = !getenv("OPENBLAS_NUM_THREADS") && kernel_blas_threads(1) > 1;
    if (!better && !pool) return;
    if (better) {
        setenv("PIPETRAIN_BLAS_DETECTED", kernel_blas_core(), 1);
        setenv("OPENBLAS_CORETYPE", better, 1);
    }
    if (pool) setenv("OPENBLAS_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv); /* returns only where it failed: as OpenBLAS chose, then */
}
