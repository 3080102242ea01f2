/* Optimizer updates that reproduce torch.optim.SGD, Adam and AdamW (1.13, single-tensor
 * path, CPU) bit for bit, not just mathematically.
 *
 * Each torch tensor operation rounds once, and some of them are fused multiply-adds on
 * torch's AVX2 CPU kernels. Measured against torch 1.13 on 10^5 random elements:
 *   t.add(u, alpha=a)          → fma(a, u, t)   (vec::fmadd)
 *   t.addcmul_(u, u, value=s)  → fma(s·u, u, t) (s·u rounded first)
 *   t.addcdiv_(u, d, value=s)  → t + (s·u)/d    (no fusion)
 *   t / python_scalar          → a true division, not a multiplication by the reciprocal
 * so those are written here with fmaf (inlined and vectorised with -march=native's FMA)
 * and, everywhere else, with plain operations that the compiler must not fuse: the project
 * builds with -std=c11, where GCC does not contract, and OPTIM_EXACT keeps it so under
 * -std=gnu11 or -ffp-contract=fast too (GCC ignores #pragma STDC FP_CONTRACT).
 * experiments/golden/make_golden.py records torch's results and tests/test_golden.c checks
 * several steps against them. */
#include "kernels/kernels.h"

#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define OPTIM_EXACT __attribute__((optimize("fp-contract=off")))
#else
#define OPTIM_EXACT
#endif

/* torch keeps hyper-parameters as Python doubles and computes 1 − β, β^t and lr / (1 − β1^t)
 * in double; this API passes floats. The double the user wrote (0.999, 1e-3) is recovered as
 * the shortest decimal that rounds to the float, as Python's repr finds it: its value is
 * correctly rounded here because the decimal's digits and its power of ten are exact doubles. */
static double optim_decimal_value(float x)
{
    static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                   1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                   1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    if (x == 0.0f || !isfinite(x))
        return x;
    const double ax = fabs((double)x);
    const int e10 = (int)floor(log10(ax));
    for (int digits = 1; digits <= 10; digits++) {
        const int k = digits - 1 - e10;
        double cand;
        if (k >= 0 && k <= 22)
            cand = nearbyint(ax * pow10[k]) / pow10[k];
        else if (k < 0 && k >= -22)
            cand = nearbyint(ax / pow10[-k]) * pow10[-k];
        else
            break;
        if ((float)cand == (float)ax)
            return copysign(cand, (double)x);
    }
    return x;
}

kernel_adam_scalars kernel_adam_scalars_at(float lr, float beta1, float beta2, long step)
{
    const double lr_d = optim_decimal_value(lr);
    const double beta1_d = optim_decimal_value(beta1);
    const double beta2_d = optim_decimal_value(beta2);
    /* torch's step counter is a float32 tensor read back with .item(). */
    const double t = (double)(float)step;
    const double bc1 = 1.0 - pow(beta1_d, t);
    const double bc2 = 1.0 - pow(beta2_d, t);
    kernel_adam_scalars k = {(float)(1.0 - beta1_d), (float)(1.0 - beta2_d),
                             (float)-(lr_d / bc1), (float)sqrt(bc2)};
    return k;
}

void kernel_add_cpu(float *restrict dst, const float *restrict src, size_t count)
{
    for (size_t i = 0; i < count; i++) dst[i] += src[i];
}

OPTIM_EXACT
void kernel_sgd_update_cpu(float *param, const float *grad, size_t count, float lr,
                           float weight_decay)
{
    const float neg_lr = -lr;
    if (weight_decay != 0.0f) {
        for (size_t i = 0; i < count; i++) {
            float g = fmaf(weight_decay, param[i], grad[i]);
            param[i] = fmaf(neg_lr, g, param[i]);
        }
    } else {
        for (size_t i = 0; i < count; i++)
            param[i] = fmaf(neg_lr, grad[i], param[i]);
    }
}

/* buf must be zero before the first step: torch then clones the gradient into it, which
 * 0·μ + g reproduces exactly. Dampening 0, no Nesterov. */
OPTIM_EXACT
void kernel_momentum_update_cpu(float *param, float *buf, const float *grad, size_t count,
                                float lr, float momentum, float weight_decay)
{
    const float neg_lr = -lr;
    for (size_t i = 0; i < count; i++) {
        float g = weight_decay != 0.0f ? fmaf(weight_decay, param[i], grad[i]) : grad[i];
        float b = buf[i] * momentum;
        b = b + g; /* add_(d_p, alpha=1 − dampening): fma with 1 is a plain sum */
        buf[i] = b;
        param[i] = fmaf(neg_lr, b, param[i]);
    }
}

/* Correctly rounded square roots of a block of floats. A loop over sqrtf does not vectorise
 * under GCC's default -fmath-errno (it keeps a scalar libm call for negative inputs, and a
 * per-function optimize("no-math-errno") does not help in GCC 12), so the vector square root
 * is requested explicitly where the target has one. The instructions are IEEE exact, like
 * the _mm256_sqrt_ps torch uses, so the result does not depend on the path taken. */
#if defined(__AVX512F__)
#define OPTIM_SQRT_WIDTH 16
static inline void optim_sqrt_block(float *x)
{
    _mm512_storeu_ps(x, _mm512_sqrt_ps(_mm512_loadu_ps(x)));
}
#elif defined(__AVX__)
#define OPTIM_SQRT_WIDTH 8
static inline void optim_sqrt_block(float *x)
{
    _mm256_storeu_ps(x, _mm256_sqrt_ps(_mm256_loadu_ps(x)));
}
#else
#define OPTIM_SQRT_WIDTH 1
static inline void optim_sqrt_block(float *x) { x[0] = sqrtf(x[0]); }
#endif

/* The Adam update of both rules: l2 is Adam's weight decay (added to the gradient), decay
 * AdamW's factor (applied to the parameter first; 1 skips it, as x·1 = x). m and v must be
 * zero before step 1. The update runs in chunks that stay in L1: moments first (vectorised),
 * then the square roots, then the parameter step (vectorised). Inlined into each caller, so
 * the test of l2 and decay is hoisted and Adam's loop is what it was before AdamW. */
OPTIM_EXACT
static inline void optim_adam_core(float *param, float *m, float *v, const float *grad,
                                   size_t count, float beta1, float beta2, float eps, float l2,
                                   float decay, kernel_adam_scalars k)
{
    enum { CHUNK = 512 };
    const float neg_step_size = k.neg_step_size, bc2_sqrt = k.bc2_sqrt;
    const float one_m_b1 = k.one_m_b1, one_m_b2 = k.one_m_b2;
    const float eps_f = eps;
    float root[CHUNK];
    for (size_t i0 = 0; i0 < count; i0 += CHUNK) {
        const size_t len = count - i0 < CHUNK ? count - i0 : CHUNK;
        float *p = param + i0, *mc = m + i0, *vc = v + i0;
        const float *gc = grad + i0;
        if (decay != 1.0f) /* param.mul_(1 − lr·wd): one rounding */
            for (size_t i = 0; i < len; i++)
                p[i] = p[i] * decay;
        for (size_t i = 0; i < len; i++) {
            float g = l2 != 0.0f ? fmaf(l2, p[i], gc[i]) : gc[i];
            float mi = mc[i] * beta1;
            mc[i] = fmaf(one_m_b1, g, mi);
            float vi = vc[i] * beta2;
            vi = fmaf(one_m_b2 * g, g, vi);
            vc[i] = vi;
            root[i] = vi;
        }
        size_t j = 0;
        for (; j + OPTIM_SQRT_WIDTH <= len; j += OPTIM_SQRT_WIDTH)
            optim_sqrt_block(root + j);
        for (; j < len; j++)
            root[j] = sqrtf(root[j]);
        for (size_t i = 0; i < len; i++) {
            float denom = root[i] / bc2_sqrt + eps_f;
            p[i] = p[i] + (neg_step_size * mc[i]) / denom;
        }
    }
}

OPTIM_EXACT
void kernel_adam_update_cpu(float *param, float *m, float *v, const float *grad, size_t count,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            long step)
{
    optim_adam_core(param, m, v, grad, count, beta1, beta2, eps, weight_decay, 1.0f,
                    kernel_adam_scalars_at(lr, beta1, beta2, step));
}

float kernel_adamw_decay_at(float lr, float weight_decay)
{
    /* torch: param.mul_(1 - lr * weight_decay), Python doubles, then the float tensor's
     * multiply by the scalar rounded to float. */
    return (float)(1.0 - optim_decimal_value(lr) * optim_decimal_value(weight_decay));
}

OPTIM_EXACT
void kernel_adamw_update_cpu(float *param, float *m, float *v, const float *grad, size_t count,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             long step)
{
    optim_adam_core(param, m, v, grad, count, beta1, beta2, eps, 0.0f,
                    kernel_adamw_decay_at(lr, weight_decay),
                    kernel_adam_scalars_at(lr, beta1, beta2, step));
}
