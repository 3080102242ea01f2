/* Which of OpenBLAS's kernels run the products, and a better choice where it chose badly.
 *
 * A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels once, when it loads, from the CPU's
 * model number, and falls back to Prescott's SSE3 kernels on a model it does not know:
 * 0.3.21 (Debian 12) does so on an Emerald Rapids Xeon (family 6, model 207), where its
 * sgemm then runs 4.5× slower than with the AVX-512 kernels the CPU can run (20–30 against
 * 143 GF/s, docs/PERFORMANCE.md). OPENBLAS_CORETYPE, read at load, is the only way to choose
 * otherwise, so the choice needs a new image of the process (kernel_blas_core_upgrade). */
#include "kernels/kernels.h"

#include <string.h>

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
