/* Everything drawn from the counter-based generator (dropout masks, initial weights) and the
 * input conversion. */
#include "kernels/kernels.h"
#include "kernels/rng.h"

#include <string.h>

/* Philox blocks generated together: 16 blocks = 64 uniforms per call. */
enum { DROP_BLOCKS = 16, DROP_CHUNK = 4 * DROP_BLOCKS };

/* u[4·l + j] = lane j of Philox block first_block + l, as a float in [0, 1): the same numbers
 * as rng_uniform_at(seed, stream, 4·(first_block + l) + j). rng_philox4x32_10 computes one
 * block at a time, a chain of 10 dependent rounds the compiler cannot vectorise; here the
 * rounds run over 16 independent blocks held as separate lanes, which it turns into vector
 * 32×32→64-bit multiplies (about 10× faster than calling rng_uniform_at per element). */
static void drop_uniform_chunk(float u[DROP_CHUNK], uint64_t seed, uint64_t stream,
                               uint64_t first_block)
{
    uint32_t c0[DROP_BLOCKS], c1[DROP_BLOCKS], c2[DROP_BLOCKS], c3[DROP_BLOCKS];
    for (int l = 0; l < DROP_BLOCKS; l++) {
        const uint64_t index = first_block + (uint64_t)l;
        c0[l] = (uint32_t)index;
        c1[l] = (uint32_t)(index >> 32);
        c2[l] = (uint32_t)stream;
        c3[l] = (uint32_t)(stream >> 32);
    }
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        /* Kept as a loop: GCC unrolls a 16-iteration loop completely before its loop
         * vectoriser runs, and then fails to vectorise the straight-line code. */
#pragma GCC unroll 1
        for (int l = 0; l < DROP_BLOCKS; l++) {
            const uint64_t p0 = (uint64_t)0xD2511F53u * c0[l];
            const uint64_t p1 = (uint64_t)0xCD9E8D57u * c2[l];
            const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
            const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c0[l] = n0;
            c1[l] = (uint32_t)p1;
            c2[l] = n2;
            c3[l] = (uint32_t)p0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int l = 0; l < DROP_BLOCKS; l++) {
        u[4 * l + 0] = rng_u32_to_unit(c0[l]);
        u[4 * l + 1] = rng_u32_to_unit(c1[l]);
        u[4 * l + 2] = rng_u32_to_unit(c2[l]);
        u[4 * l + 3] = rng_u32_to_unit(c3[l]);
    }
}

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
        for (size_t e0 = 0; e0 < per_sample; e0 += DROP_CHUNK) {
            float u[DROP_CHUNK];
            drop_uniform_chunk(u, seed, stream, (base | e0) >> 2);
            const size_t len = per_sample - e0 < DROP_CHUNK ? per_sample - e0 : DROP_CHUNK;
            for (size_t l = 0; l < len; l++)
                y[e0 + l] = u[l] < keep ? x[e0 + l] * scale : 0.0f;
            if (mk)
                for (size_t l = 0; l < len; l++)
                    mk[e0 + l] = (uint8_t)(u[l] < keep);
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
    for (size_t i0 = 0; i0 < count; i0 += DROP_CHUNK) {
        float u[DROP_CHUNK];
        drop_uniform_chunk(u, seed, stream, i0 >> 2);
        const size_t len = count - i0 < DROP_CHUNK ? count - i0 : DROP_CHUNK;
        for (size_t l = 0; l < len; l++)
            out[i0 + l] = (2.0f * u[l] - 1.0f) * bound;
    }
}

void kernel_bytes_to_float_cpu(float *out, const uint8_t *in, size_t count)
{
    /* A division like torchvision's ToTensor (x / 255), not a multiplication by 1/255. */
    for (size_t i = 0; i < count; i++)
        out[i] = (float)in[i] / 255.0f;
}
