/* Element-wise activations. Each case is its own loop over a static inline function, so
 * that every loop vectorises (see kernels/fastmath.h for why expf is not called). */
#include "kernels/kernels.h"
#include "kernels/fastmath.h"

#include <math.h>
#include <string.h>

void kernel_activation_forward_cpu(float *out, const float *in, size_t count, kernel_act act)
{
    switch (act) {
    case KERNEL_ACT_LINEAR:
        if (out != in)
            memmove(out, in, count * sizeof *out);
        break;
    case KERNEL_ACT_RELU:
        /* x < 0 ? 0 : x rather than fmaxf: NaN passes through, as in torch.relu. */
        for (size_t i = 0; i < count; i++)
            out[i] = in[i] < 0.0f ? 0.0f : in[i];
        break;
    case KERNEL_ACT_SIGMOID:
        for (size_t i = 0; i < count; i++)
            out[i] = fastmath_sigmoidf(in[i]);
        break;
    case KERNEL_ACT_TANH:
        for (size_t i = 0; i < count; i++)
            out[i] = fastmath_tanhf(in[i]);
        break;
    }
}

void kernel_activation_backward_cpu(float *din, const float *dout, const float *out,
                                    size_t count, kernel_act act)
{
    switch (act) {
    case KERNEL_ACT_LINEAR:
        if (din != dout)
            memmove(din, dout, count * sizeof *din);
        break;
    case KERNEL_ACT_RELU:
        /* torch's threshold_backward: zero where the output is ≤ 0. */
        for (size_t i = 0; i < count; i++)
            din[i] = out[i] <= 0.0f ? 0.0f : dout[i];
        break;
    case KERNEL_ACT_SIGMOID:
        /* Same order of operations as torch's sigmoid_backward: g·(1 − y)·y. */
        for (size_t i = 0; i < count; i++)
            din[i] = dout[i] * (1.0f - out[i]) * out[i];
        break;
    case KERNEL_ACT_TANH:
        /* torch's tanh_backward g·(1 − y²), whose 1 − y·y its compiler fuses into one
         * multiply-add (measured); also the accurate form where y is near ±1. */
        for (size_t i = 0; i < count; i++)
            din[i] = dout[i] * fmaf(-out[i], out[i], 1.0f);
        break;
    }
}
