/* Linked into every unit-test program: before Criterion's main, OpenBLAS's load-time choices
 * are undone as pipetrain's main undoes them (kernel_blas_restart), so that the tests
 * multiply with the kernels pipetrain uses: on a CPU OpenBLAS does not know, its fallback
 * ran test_stage 2.5× slower. glibc passes main's arguments to constructors. */
#include "kernels/kernels.h"

__attribute__((constructor)) static void blas_start(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)envp;
    kernel_blas_restart(argv);
}
