/* The harness of test_cuda_kernels (a plain program, see tests/cuda/test_cuda_kernels.c):
 * what its cases (there and in tests/cuda/test_cuda_kernels_split.c) use to allocate,
 * move and compare data and to record each check. Defined in tests/cuda/kernel_check.c.
 *
 * Every check is recorded per kernel ("ok"/"FAIL" and its error, one line each) and counted
 * in passed/failed; print_summary prints the table per kernel. Infrastructure failures
 * (allocation, copies, a kernel fault at synchronisation) end the run through fatal: a
 * faulted CUDA context cannot run the remaining checks. */
#ifndef PT_TESTS_CUDA_KERNEL_CHECK_H
#define PT_TESTS_CUDA_KERNEL_CHECK_H

#include "kernels/cuda/kernels_cuda.h"

#include <stddef.h>

#define REL_TOL 1e-4 /* normwise relative error allowed to the float-rounding kernels */

extern kernel_cuda_ctx ctx; /* the context every kernel runs on; its stream orders copies */
extern int passed, failed;  /* checks so far */

/* ---- bookkeeping ---- */

/* One check of `kernel` on `shape`: ok, its error, whether it was bit for bit, and a detail
 * shown after it (may be ""). */
void record(const char *kernel, const char *shape, int ok, double err, int exact,
            const char *detail);
/* Prints the counts, frees the context and exits with `code`. */
void finish_and_exit(int code);
void fatal(const char *what);
/* fatal with the error message when rc != 0. */
void must(int rc);
/* A kernel call that returns −1 is a failed check of that kernel: 0 then, else 1. */
int call_ok(const char *kernel, const char *shape, int rc);
void print_summary(void);

/* ---- memory: the case's buffers, all freed by free_case ---- */

void *dmalloc(size_t bytes);
void *hmalloc(size_t bytes); /* zeroed */
void free_case(void);
/* Transfers, on ctx.stream and synchronised (plain cudaMemcpy on the legacy default stream
 * would not be ordered with the kernels' non-blocking stream). */
void upload(void *dev, const void *host, size_t bytes);
void download(void *host, const void *dev, size_t bytes);
/* 0xFF bytes: NaN as float, −1 as int32, 255 as a mask byte (queued, not synchronised). */
void poison(void *dev, size_t bytes);
void *dcopy(const void *host, size_t bytes);          /* a device copy of a host array */
float *fetch_f(const float *dev, size_t count);       /* a host copy of a device array */
/* Fresh uniform numbers in [lo, hi) for every call (deterministic: no clock). */
float *rand_f(size_t count, float lo, float hi);

/* ---- comparisons, each recorded ---- */

/* Normwise: max|gpu − cpu| / max|cpu| over the finite elements (absolute when cpu is all
 * zero) at most REL_TOL; a NaN or an infinity in one array and not the other fails. */
void check_close(const char *kernel, const char *shape, const float *gpu,
                 const float *cpu, size_t n);
/* Bit for bit (any NaN equals any NaN). */
void check_exact(const char *kernel, const char *shape, const float *gpu,
                 const float *cpu, size_t n);
/* Integer arrays (argmax, masks, counts): every element equal. */
void check_exact_bytes(const char *kernel, const char *shape, const void *gpu,
                       const void *cpu, size_t n, size_t elem);

#endif
