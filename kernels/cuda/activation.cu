/* Element-wise activations, the bias add of a layer split by its inputs, and the input
 * conversion.
 *
 * nvcc contracts a·b + c into one fused multiply-add by default; where the CPU kernel
 * rounds each operation, the explicit __f*_rn intrinsics (never contracted) keep the same
 * roundings. relu, linear and bytes_to_float are therefore bit-identical to the CPU;
 * sigmoid and tanh use CUDA's expf/tanhf (≤ 2 ulp) where the CPU uses its own
 * kernels/fastmath.h polynomials (≤ 2 ulp), so they agree to a few ulp. The bias add is one
 * rounded addition per element, bit-identical too. */
#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

/* The CPU's formulation: through e = e^−|x| ≤ 1, so nothing overflows. */
__device__ static inline float act_sigmoid(float x)
{
    const float e = expf(-fabsf(x));
    const float num = x >= 0.0f ? 1.0f : e;
    return __fdiv_rn(num, __fadd_rn(1.0f, e));
}

/* `in`/`out` (and `dout`/`din`) may be the same array: each element is read, then written,
 * by one thread; hence no __restrict__. */
__global__ static void act_forward(float *out, const float *in, size_t count, kernel_act act)
{
    CUDA_GRID_STRIDE(i, count)
    {
        const float x = in[i];
        float y;
        switch (act) {
        case KERNEL_ACT_RELU: y = x < 0.0f ? 0.0f : x; break; /* NaN passes, as torch.relu */
        case KERNEL_ACT_SIGMOID: y = act_sigmoid(x); break;
        case KERNEL_ACT_TANH: y = tanhf(x); break;
        default: y = x; break;
        }
        out[i] = y;
    }
}

__global__ static void act_backward(float *din, const float *dout, const float *out,
                                    size_t count, kernel_act act)
{
    CUDA_GRID_STRIDE(i, count)
    {
        const float g = dout[i], y = out[i];
        float d;
        switch (act) {
        case KERNEL_ACT_RELU: d = y <= 0.0f ? 0.0f : g; break;
        /* g·(1 − y)·y in torch's order, each product rounded. */
        case KERNEL_ACT_SIGMOID: d = __fmul_rn(__fmul_rn(g, __fsub_rn(1.0f, y)), y); break;
        /* g·(1 − y²) with 1 − y·y fused, as the CPU kernel (and torch) compute it. */
        case KERNEL_ACT_TANH: d = __fmul_rn(g, __fmaf_rn(-y, y, 1.0f)); break;
        default: d = g; break;
        }
        din[i] = d;
    }
}

/* y[(i·units + u)·per + k] += b[u]: one thread per element, u read off its index. */
__global__ static void bias_add(float *y, const float *b, size_t count, size_t units,
                                size_t per)
{
    CUDA_GRID_STRIDE(i, count)
    y[i] = __fadd_rn(y[i], b[i / per % units]);
}

__global__ static void bytes_to_float(float *out, const uint8_t *in, size_t count)
{
    /* A true division by 255, as torchvision's ToTensor and the CPU kernel. */
    CUDA_GRID_STRIDE(i, count)
    out[i] = __fdiv_rn((float)in[i], 255.0f);
}

extern "C" int kernel_activation_forward_cuda(float *out, const float *in, size_t count,
                                              kernel_act act, const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    if (act == KERNEL_ACT_LINEAR) {
        if (out != in)
            CUDA_CHECK(cudaMemcpyAsync(out, in, count * sizeof *out, cudaMemcpyDeviceToDevice,
                                       ctx->stream));
        return 0;
    }
    if (act != KERNEL_ACT_RELU && act != KERNEL_ACT_SIGMOID && act != KERNEL_ACT_TANH)
        return pt_error_set("activation: unknown kind %d", (int)act);
    act_forward<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(out, in, count, act);
    CUDA_CHECK_LAUNCH("act_forward");
    return 0;
}

extern "C" int kernel_activation_backward_cuda(float *din, const float *dout, const float *out,
                                               size_t count, kernel_act act,
                                               const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    if (act == KERNEL_ACT_LINEAR) {
        if (din != dout)
            CUDA_CHECK(cudaMemcpyAsync(din, dout, count * sizeof *din,
                                       cudaMemcpyDeviceToDevice, ctx->stream));
        return 0;
    }
    if (act != KERNEL_ACT_RELU && act != KERNEL_ACT_SIGMOID && act != KERNEL_ACT_TANH)
        return pt_error_set("activation: unknown kind %d", (int)act);
    act_backward<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(din, dout, out, count,
                                                                     act);
    CUDA_CHECK_LAUNCH("act_backward");
    return 0;
}

extern "C" int kernel_bias_add_cuda(float *y, const float *b, int n, int units, size_t per,
                                    const kernel_cuda_ctx *ctx)
{
    if (n < 0 || units < 0)
        return pt_error_set("bias_add: invalid sizes n=%d units=%d", n, units);
    const size_t count = (size_t)n * (size_t)units * per;
    if (count == 0)
        return 0;
    bias_add<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(y, b, count, (size_t)units,
                                                                 per);
    CUDA_CHECK_LAUNCH("bias_add");
    return 0;
}

extern "C" int kernel_bytes_to_float_cuda(float *out, const uint8_t *in, size_t count,
                                          const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    bytes_to_float<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(out, in, count);
    CUDA_CHECK_LAUNCH("bytes_to_float");
    return 0;
}
