/* Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the value at a
 * given (seed, stream, index) is the same whatever order or process asks for it, so
 * initial weights and dropout masks do not depend on how a model is split or batched.
 * Inline because it sits inside element loops; the CUDA kernels share the arithmetic. */
#ifndef PT_RNG_H
#define PT_RNG_H

#include <stdint.h>

/* Compiled by nvcc too (kernels/cuda/transformer_math.cuh): one Philox for host and device. */
#ifdef __CUDACC__
#define RNG_HD __host__ __device__
#else
#define RNG_HD
#endif

RNG_HD static inline void rng_philox4x32_10(uint32_t out[4], uint64_t seed, uint64_t stream,
                                     uint64_t index)
{
    uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* A uniform float in [0, 1) with 24 random bits. */
RNG_HD static inline float rng_u32_to_unit(uint32_t x) { return (float)(x >> 8) * 0x1p-24f; }

/* Element i of the uniform sequence (seed, stream): lane i%4 of block i/4. */
static inline float rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint32_t r[4];
    rng_philox4x32_10(r, seed, stream, i >> 2);
    return rng_u32_to_unit(r[i & 3]);
}

/* Streams: one per use, so that no two uses share numbers. */
static inline uint64_t rng_stream_init(int layer, int is_bias)
{
    return ((uint64_t)1 << 62) | ((uint64_t)layer << 1) | (uint64_t)is_bias;
}
static inline uint64_t rng_stream_dropout(int layer, uint64_t step)
{
    return ((uint64_t)2 << 62) | (step << 16) | (uint64_t)layer;
}
static inline uint64_t rng_stream_shuffle(uint64_t epoch)
{
    return ((uint64_t)3 << 62) | epoch;
}
/* Tensor k of transformer layer `layer` (GPT-2's normal initialisation). */
static inline uint64_t rng_stream_init_tensor(int layer, int k)
{
    return ((uint64_t)1 << 62) | ((uint64_t)1 << 59) | ((uint64_t)layer << 8) | (uint64_t)k;
}

/* Element i of the standard normal sequence (seed, stream), by Box–Muller on one Philox
 * block per element, in double: u1 = (r0 + 1)/2^32 in (0, 1], u2 = r1/2^32, z =
 * √(−2 ln u1)·cos(2π u2). experiments/gpt_torch.py reproduces it. */
double rng_normal_at(uint64_t seed, uint64_t stream, uint64_t i);

/* A text corpus's windows of one step (src/io/text_data.c); index: the sample's id. */
static inline uint64_t rng_stream_text(uint64_t step)
{
    return ((uint64_t)1 << 61) | (step & (((uint64_t)1 << 61) - 1));
}

#endif
