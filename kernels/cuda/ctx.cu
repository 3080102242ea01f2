/* The CUDA kernel context: a stream, a cuBLAS handle that runs on it, the precision of the
 * products and the scratch of their bf16 operands (kernels/cuda/precision.cu). */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

#include <stdlib.h>
#include <string.h>

/* Each step records its own error; on failure what was created so far is released, so
 * the caller has nothing to free. */
static int ctx_create(kernel_cuda_ctx *c, int device)
{
    /* Without a driver (a machine with no GPU) cudaGetDeviceCount returns
     * cudaErrorInsufficientDriver and leaves count unwritten: hence the 0 first. */
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return pt_error_set("no CUDA device: cudaGetDeviceCount: %s (%s)",
                            cudaGetErrorString(e), cudaGetErrorName(e));
    if (count <= 0)
        return pt_error_set("no CUDA device: cudaGetDeviceCount found none");
    if (device < 0 || device >= count)
        return pt_error_set("CUDA device %d requested, but the devices are 0..%d", device,
                            count - 1);
    CUDA_CHECK(cudaSetDevice(device));
    /* Host waits for the device sleep instead of spinning a core: ranks may share cores
     * (and GPUs), as the executor's polite MPI waits assume. Allowed on an initialised
     * device; it replaces the flags. */
    const cudaError_t fe = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    if (fe == cudaErrorSetOnActiveProcess)
        (void)cudaGetLastError(); /* an older runtime keeps the active flags: fine */
    else
        CUDA_CHECK(fe);
    /* Non-blocking: the stream must not serialise with the legacy default stream that
     * other libraries (MPI implementations, for one) may use. */
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&c->blas));
    CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    /* Explicitly the default: float32 products in float32, never TF32 (whose 10-bit
     * mantissa would be ~1e-3 off the CPU reference). --precision tf32 asks for TF32 per
     * product (cublasGemmEx's compute type), never through this mode. */
    CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    c->precision = KERNEL_CUDA_FP32;
    /* Host memory, so that kernels given a const context can still grow the device part. */
    c->bf16 = (kernel_cuda_scratch *)calloc(1, sizeof *c->bf16);
    if (!c->bf16) return pt_error_set("CUDA context: out of host memory");
    return 0;
}

int kernel_cuda_ctx_init(kernel_cuda_ctx *c, int device)
{
    memset(c, 0, sizeof *c);
    if (ctx_create(c, device) == 0)
        return 0;
    kernel_cuda_ctx_free(c);
    return -1;
}

void kernel_cuda_ctx_free(kernel_cuda_ctx *c)
{
    /* No error channel here: wait for what is queued, then release what exists. */
    if (c->stream)
        (void)cudaStreamSynchronize(c->stream);
    if (c->blas)
        (void)cublasDestroy(c->blas);
    if (c->bf16) {
        if (c->bf16->p)
            (void)cudaFree(c->bf16->p); /* after the wait above: no product reads it */
        free(c->bf16);
    }
    if (c->stream)
        (void)cudaStreamDestroy(c->stream);
    c->blas = NULL;
    c->stream = NULL;
    c->bf16 = NULL;
    c->precision = KERNEL_CUDA_FP32;
}
