/* Everything drawn from the counter-based generator (dropout masks, initial weights) and the
 * input conversion. One Philox call yields the uniforms of 4 consecutive indices, so the
 * loops run over blocks of 4 rather than calling rng_uniform_at per element (4× the work). */
#include "kernels/kernels.h"
#include "kernels/rng.h"

#include <string.h>

/* Keeps e when uniform(seed, stream, (sample << 32) | e) < 1 − p. The sample's index sits in
 * the high half of the counter and e in the low half, so (sample << 32) | e is a multiple of
 * 4 exactly when e is, and block e/4 of the sample is Philox block ((sample << 32) | e) / 4. */
void kernel_dropout_forward_cpu(float *out, uint8_t *mask, const float *in, int n,
                                size_t per_sample, float p, uint64_t seed, uint64_t stream,
                                const int64_t *sample_ids)
{
    if (p == 0.0f) {
        if (out != in)
            memmove(out, in, (size_t)n * per_sample * sizeof *out);
        if (mask)
            memset(mask, 1, (size_t)n * per_sample);
        return;
    }
    const float keep = 1.0f - p;
    const float scale = 1.0f / keep;
    for (int i = 0; i < n; i++) {
        const uint64_t base = (uint64_t)sample_ids[i] << 32;
        const float *x = in + (size_t)i * per_sample;
        float *y = out + (size_t)i * per_sample;
        uint8_t *mk = mask ? mask + (size_t)i * per_sample : NULL;
        for (size_t e0 = 0; e0 < per_sample; e0 += 4) {
            uint32_t r[4];
            rng_philox4x32_10(r, seed, stream, (base | e0) >> 2);
            const size_t len = per_sample - e0 < 4 ? per_sample - e0 : 4;
            for (size_t l = 0; l < len; l++) {
                const int kept = rng_u32_to_unit(r[l]) < keep;
                y[e0 + l] = kept ? x[e0 + l] * scale : 0.0f;
                if (mk)
                    mk[e0 + l] = (uint8_t)kept;
            }
        }
    }
}

void kernel_dropout_backward_cpu(float *din, const float *dout, const uint8_t *mask,
                                 size_t count, float p)
{
    if (p == 0.0f) {
        if (din != dout)
            memmove(din, dout, count * sizeof *din);
        return;
    }
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < count; i++)
        din[i] = mask[i] ? dout[i] * scale : 0.0f;
}

/* out[i] = (2·uniform(seed, stream, i) − 1)·bound. */
void kernel_init_uniform_cpu(float *out, size_t count, float bound, uint64_t seed,
                             uint64_t stream)
{
    for (size_t i0 = 0; i0 < count; i0 += 4) {
        uint32_t r[4];
        rng_philox4x32_10(r, seed, stream, i0 >> 2);
        const size_t len = count - i0 < 4 ? count - i0 : 4;
        for (size_t l = 0; l < len; l++)
            out[i0 + l] = (2.0f * rng_u32_to_unit(r[l]) - 1.0f) * bound;
    }
}

void kernel_bytes_to_float_cpu(float *out, const uint8_t *in, size_t count)
{
    /* A division like torchvision's ToTensor (x / 255), not a multiplication by 1/255. */
    for (size_t i = 0; i < count; i++)
        out[i] = (float)in[i] / 255.0f;
}
