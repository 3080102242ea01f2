/* Everything drawn from the counter-based generator (dropout masks, initial weights) and the
 * input conversion. */
#include "kernels/kernels.h"
#include "kernels/rng.h"

#include <math.h>
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
 * 4 exactly when e is, and block e/4 of the sample is Philox block ((sample << 32) | e) / 4.
 * A row holds elements [elem_off, elem_off + per_sample) of its sample: the loop walks the
 * whole 64-element chunks of the sample's index space that meet that range, and uses the
 * lanes inside it (all of them but at the two ends; with elem_off = 0, all but the tail). */
void kernel_dropout_forward_range_cpu(float *out, uint8_t *mask, const float *in, int n,
                                      size_t per_sample, size_t elem_off, float p,
                                      uint64_t seed, uint64_t stream, const int64_t *sample_ids)
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
    const size_t end = elem_off + per_sample;
    const size_t chunk0 = elem_off & ~(size_t)(DROP_CHUNK - 1);
    for (int i = 0; i < n; i++) {
        const uint64_t base = (uint64_t)sample_ids[i] << 32;
        const float *x = in + (size_t)i * per_sample;
        float *y = out + (size_t)i * per_sample;
        uint8_t *mk = mask ? mask + (size_t)i * per_sample : NULL;
        for (size_t c = chunk0; c < end; c += DROP_CHUNK) {
            float u[DROP_CHUNK];
            drop_uniform_chunk(u, seed, stream, (base | c) >> 2);
            /* Lanes [lo, hi) of this chunk are elements [c + lo, c + hi) of the sample, at
             * row position r = c + lo − elem_off. */
            const size_t lo = c < elem_off ? elem_off - c : 0;
            const size_t hi = end - c < DROP_CHUNK ? end - c : DROP_CHUNK;
            const size_t r = c + lo - elem_off, len = hi - lo;
            const float *ul = u + lo, *xr = x + r;
            float *yr = y + r;
            for (size_t l = 0; l < len; l++)
                yr[l] = ul[l] < keep ? xr[l] * scale : 0.0f;
            if (mk)
                for (size_t l = 0; l < len; l++)
                    mk[r + l] = (uint8_t)(ul[l] < keep);
        }
    }
}

void kernel_dropout_forward_cpu(float *out, uint8_t *mask, const float *in, int n,
                                size_t per_sample, float p, uint64_t seed, uint64_t stream,
                                const int64_t *sample_ids)
{
    kernel_dropout_forward_range_cpu(out, mask, in, n, per_sample, 0, p, seed, stream,
                                     sample_ids);
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

/* out[i] = (2·uniform(seed, stream, first + i) − 1)·bound: whole 64-element chunks of the
 * index space, of which the lanes in [first, first + count) are kept. */
void kernel_init_uniform_range_cpu(float *out, size_t first, size_t count, float bound,
                                   uint64_t seed, uint64_t stream)
{
    const size_t end = first + count;
    for (size_t c = first & ~(size_t)(DROP_CHUNK - 1); c < end; c += DROP_CHUNK) {
        float u[DROP_CHUNK];
        drop_uniform_chunk(u, seed, stream, (uint64_t)c >> 2);
        const size_t lo = c < first ? first - c : 0;
        const size_t hi = end - c < DROP_CHUNK ? end - c : DROP_CHUNK;
        float *o = out + (c + lo - first);
        for (size_t l = lo; l < hi; l++)
            o[l - lo] = (2.0f * u[l] - 1.0f) * bound;
    }
}

void kernel_init_uniform_cpu(float *out, size_t count, float bound, uint64_t seed,
                             uint64_t stream)
{
    kernel_init_uniform_range_cpu(out, 0, count, bound, seed, stream);
}

double rng_normal_at(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint32_t r[4];
    rng_philox4x32_10(r, seed, stream, i);
    double u1 = ((double)r[0] + 1.0) * 0x1p-32, u2 = (double)r[1] * 0x1p-32;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void kernel_init_normal_range_cpu(float *out, size_t first, size_t count, double std,
                                  uint64_t seed, uint64_t stream)
{
    for (size_t i = 0; i < count; i++)
        out[i] = (float)(std * rng_normal_at(seed, stream, first + i));
}

void kernel_bytes_to_float_cpu(float *out, const uint8_t *in, size_t count)
{
    /* A division like torchvision's ToTensor (x / 255), not a multiplication by 1/255. */
    for (size_t i = 0; i < count; i++)
        out[i] = (float)in[i] / 255.0f;
}
