/* Checks for every CUDA runtime, cuBLAS and cuRAND call, and for every kernel launch.
 *
 * Each macro evaluates the call once and, on failure, records "file:line: call: error" with
 * pt_error_set and makes the enclosing function return −1 (so it is used in functions that
 * return int status). Library code never exits or prints: the caller decides.
 * Usable from C and from CUDA sources. Private to kernels/cuda/ and its test. */
#ifndef PT_KERNELS_CUDA_CHECK_H
#define PT_KERNELS_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <curand.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "src/base/error.h"
#ifdef __cplusplus
}
#endif

/* cuRAND has no status-to-text function. */
static inline const char *cuda_curand_status_string(curandStatus_t s)
{
    switch (s) {
    case CURAND_STATUS_SUCCESS: return "CURAND_STATUS_SUCCESS";
    case CURAND_STATUS_VERSION_MISMATCH: return "CURAND_STATUS_VERSION_MISMATCH";
    case CURAND_STATUS_NOT_INITIALIZED: return "CURAND_STATUS_NOT_INITIALIZED";
    case CURAND_STATUS_ALLOCATION_FAILED: return "CURAND_STATUS_ALLOCATION_FAILED";
    case CURAND_STATUS_TYPE_ERROR: return "CURAND_STATUS_TYPE_ERROR";
    case CURAND_STATUS_OUT_OF_RANGE: return "CURAND_STATUS_OUT_OF_RANGE";
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE: return "CURAND_STATUS_LENGTH_NOT_MULTIPLE";
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED:
        return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case CURAND_STATUS_LAUNCH_FAILURE: return "CURAND_STATUS_LAUNCH_FAILURE";
    case CURAND_STATUS_PREEXISTING_FAILURE: return "CURAND_STATUS_PREEXISTING_FAILURE";
    case CURAND_STATUS_INITIALIZATION_FAILED: return "CURAND_STATUS_INITIALIZATION_FAILED";
    case CURAND_STATUS_ARCH_MISMATCH: return "CURAND_STATUS_ARCH_MISMATCH";
    case CURAND_STATUS_INTERNAL_ERROR: return "CURAND_STATUS_INTERNAL_ERROR";
    }
    return "unknown cuRAND status";
}

#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        const cudaError_t cuda_e_ = (call);                                                \
        if (cuda_e_ != cudaSuccess)                                                        \
            return pt_error_set("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,           \
                                cudaGetErrorString(cuda_e_), cudaGetErrorName(cuda_e_));   \
    } while (0)

#define CUBLAS_CHECK(call)                                                                 \
    do {                                                                                   \
        const cublasStatus_t cublas_s_ = (call);                                           \
        if (cublas_s_ != CUBLAS_STATUS_SUCCESS)                                            \
            return pt_error_set("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,           \
                                cublasGetStatusString(cublas_s_),                          \
                                cublasGetStatusName(cublas_s_));                           \
    } while (0)

#define CURAND_CHECK(call)                                                                 \
    do {                                                                                   \
        const curandStatus_t curand_s_ = (call);                                           \
        if (curand_s_ != CURAND_STATUS_SUCCESS)                                            \
            return pt_error_set("%s:%d: %s: %s", __FILE__, __LINE__, #call,                \
                                cuda_curand_status_string(curand_s_));                     \
    } while (0)

/* After every <<<...>>>: a bad configuration or a missing kernel image shows up here. */
#define CUDA_CHECK_LAUNCH(kernel_name)                                                     \
    do {                                                                                   \
        const cudaError_t cuda_e_ = cudaGetLastError();                                    \
        if (cuda_e_ != cudaSuccess)                                                        \
            return pt_error_set("%s:%d: launch of %s: %s (%s)", __FILE__, __LINE__,        \
                                kernel_name, cudaGetErrorString(cuda_e_),                  \
                                cudaGetErrorName(cuda_e_));                                \
    } while (0)

#ifdef __CUDACC__
/* Launch geometry of the element-wise kernels: CUDA_THREADS per block, and enough blocks
 * for `count` items, capped because every such kernel walks a grid-stride loop (the cap
 * keeps the grid within limits for any count and still fills the largest GPUs). Callers
 * return before launching when count is 0: an empty grid is a launch error. */
enum { CUDA_THREADS = 256, CUDA_MAX_BLOCKS = 65536 };
static inline unsigned cuda_grid(size_t count)
{
    const size_t blocks = (count + CUDA_THREADS - 1) / CUDA_THREADS;
    const size_t cap = CUDA_MAX_BLOCKS;
    return (unsigned)(blocks < cap ? blocks : cap);
}
/* for (size_t i over this thread's share of 0 .. count−1) */
#define CUDA_GRID_STRIDE(i, count)                                                         \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count);            \
         i += (size_t)gridDim.x * blockDim.x)
#endif

#endif
