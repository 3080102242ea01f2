/* Everything drawn from the counter-based generator (dropout masks, initial weights), on
 * cuRAND's device API, and the dropout backward.
 *
 * kernels/rng.h defines uniform number i of (seed, stream) as lane i%4 of the Philox4x32-10
 * block with counter (i/4 as the low 64 bits, stream as the high 64 bits) and key seed.
 * cuRAND's Philox4_32_10 uses the same rounds, constants and key schedule; curand_init(seed,
 * subsequence, offset) sets the counter's high 64 bits to the subsequence and its low 64
 * bits to offset/4 (offset a multiple of 4), and the first curand4 then returns that
 * block's four words in order. So curand_init(seed, stream, 4·block) + curand4 is
 * rng_philox4x32_10(seed, stream, block), bit for bit (read from curand_kernel.h and
 * curand_philox4x32_x.h of CUDA 13.0; kernel_cuda_rng_block lets a test check it on the
 * host, and the GPU test compares masks and weights with the CPU's).
 *
 * The state set up per block costs nothing extra: inlined, the counter skips and the
 * look-ahead block that curand4 prepares are dead code, and one Philox evaluation remains.
 *
 * QUALIFIERS is cuRAND's hook for the storage class of its inline functions: with __host__
 * added, the same functions compile for the host too (used by kernel_cuda_rng_block only). */
#define QUALIFIERS static __forceinline__ __host__ __device__
#include <curand_kernel.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/kernels_cuda.h"

/* The four words of Philox block `block` of (seed, stream). */
__host__ __device__ static inline uint4 rng_block(uint64_t seed, uint64_t stream,
                                                  uint64_t block)
{
    curandStatePhilox4_32_10_t state;
    curand_init(seed, stream, block << 2, &state);
    return curand4(&state);
}

/* rng.h's rng_u32_to_unit: 24 random bits scaled by 2^−24 (exact), in [0, 1). */
__device__ static inline float rng_unit(uint32_t x) { return (float)(x >> 8) * 0x1p-24f; }

extern "C" void kernel_cuda_rng_block(uint32_t out[4], uint64_t seed, uint64_t stream,
                                      uint64_t block)
{
    const uint4 r = rng_block(seed, stream, block);
    out[0] = r.x;
    out[1] = r.y;
    out[2] = r.z;
    out[3] = r.w;
}

/* One thread per Philox block that meets a row: a row holds elements [elem_off, end) of its
 * sample's whole vector, and thread t handles block b = first_block + t % blocks_per_row of
 * sample i = t / blocks_per_row, i.e. elements e = 4b .. 4b+3 of the sample, whose counter
 * index is (sample_ids[i] << 32) | e, computed as the CPU does (bits of the id above 32
 * shifted out the same way); it writes the lanes inside [elem_off, end), at row position
 * e − elem_off. With elem_off = 0 these are the whole-sample kernel's blocks and lanes. */
__global__ static void drop_forward(float *out, uint8_t *mask, const float *in,
                                    size_t per_sample, size_t elem_off, size_t first_block,
                                    size_t blocks_per_row, size_t total, float keep,
                                    float scale, uint64_t seed, uint64_t stream,
                                    const int64_t *sample_ids)
{
    const size_t end = elem_off + per_sample;
    CUDA_GRID_STRIDE(t, total)
    {
        const size_t i = t / blocks_per_row, b = first_block + t % blocks_per_row;
        const uint64_t block = (((uint64_t)sample_ids[i] << 32) | (4 * b)) >> 2;
        const uint4 r = rng_block(seed, stream, block);
        const uint32_t word[4] = {r.x, r.y, r.z, r.w};
        const size_t row = i * per_sample;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const size_t e = 4 * b + l;
            if (e >= end)
                break;
            if (e < elem_off)
                continue;
            const size_t at = row + (e - elem_off);
            const bool kept = rng_unit(word[l]) < keep;
            out[at] = kept ? __fmul_rn(in[at], scale) : 0.0f;
            if (mask)
                mask[at] = kept ? 1 : 0;
        }
    }
}

__global__ static void drop_backward(float *din, const float *dout, const uint8_t *mask,
                                     size_t count, float scale)
{
    CUDA_GRID_STRIDE(i, count)
    din[i] = mask[i] ? __fmul_rn(dout[i], scale) : 0.0f;
}

/* out[e − first] = (2·u_e − 1)·bound for e in [first, end), each operation rounded as on
 * the CPU; one thread per Philox block that meets the range (block first/4 + t), writing
 * the lanes inside it. With first = 0, the whole-tensor kernel's blocks and lanes. */
__global__ static void init_uniform(float *out, size_t first, size_t end, size_t first_block,
                                    size_t blocks, float bound, uint64_t seed, uint64_t stream)
{
    CUDA_GRID_STRIDE(t, blocks)
    {
        const size_t b = first_block + t;
        const uint4 r = rng_block(seed, stream, b);
        const uint32_t word[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const size_t e = 4 * b + l;
            if (e >= end)
                break;
            if (e < first)
                continue;
            const float u = rng_unit(word[l]);
            out[e - first] = __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), bound);
        }
    }
}

extern "C" int kernel_dropout_forward_range_cuda(float *out, uint8_t *mask, const float *in,
                                                 int n, size_t per_sample, size_t elem_off,
                                                 float p, uint64_t seed, uint64_t stream,
                                                 const int64_t *sample_ids,
                                                 const kernel_cuda_ctx *ctx)
{
    /* The element index sits in the low 32 bits of the counter index. */
    const size_t limit = (size_t)1 << 32;
    if (n < 0 || per_sample > limit || elem_off > limit - per_sample)
        return pt_error_set("dropout: invalid sizes n=%d per_sample=%zu elem_off=%zu (the "
                            "elements must lie below 2^32)",
                            n, per_sample, elem_off);
    const size_t count = (size_t)n * per_sample;
    if (count == 0)
        return 0;
    if (p == 0.0f) {
        if (out != in)
            CUDA_CHECK(cudaMemcpyAsync(out, in, count * sizeof *out, cudaMemcpyDeviceToDevice,
                                       ctx->stream));
        if (mask)
            CUDA_CHECK(cudaMemsetAsync(mask, 1, count, ctx->stream));
        return 0;
    }
    const float keep = 1.0f - p;
    const float scale = 1.0f / keep;
    const size_t first_block = elem_off / 4, end_block = (elem_off + per_sample + 3) / 4;
    const size_t row_blocks = end_block - first_block, total = (size_t)n * row_blocks;
    drop_forward<<<cuda_grid(total), CUDA_THREADS, 0, ctx->stream>>>(
        out, mask, in, per_sample, elem_off, first_block, row_blocks, total, keep, scale, seed,
        stream, sample_ids);
    CUDA_CHECK_LAUNCH("drop_forward");
    return 0;
}

extern "C" int kernel_dropout_forward_cuda(float *out, uint8_t *mask, const float *in, int n,
                                           size_t per_sample, float p, uint64_t seed,
                                           uint64_t stream, const int64_t *sample_ids,
                                           const kernel_cuda_ctx *ctx)
{
    return kernel_dropout_forward_range_cuda(out, mask, in, n, per_sample, 0, p, seed, stream,
                                             sample_ids, ctx);
}

extern "C" int kernel_dropout_backward_cuda(float *din, const float *dout, const uint8_t *mask,
                                            size_t count, float p, const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    if (p == 0.0f) {
        if (din != dout)
            CUDA_CHECK(cudaMemcpyAsync(din, dout, count * sizeof *din,
                                       cudaMemcpyDeviceToDevice, ctx->stream));
        return 0;
    }
    const float scale = 1.0f / (1.0f - p);
    drop_backward<<<cuda_grid(count), CUDA_THREADS, 0, ctx->stream>>>(din, dout, mask, count,
                                                                      scale);
    CUDA_CHECK_LAUNCH("drop_backward");
    return 0;
}

extern "C" int kernel_init_uniform_range_cuda(float *out, size_t first, size_t count,
                                              float bound, uint64_t seed, uint64_t stream,
                                              const kernel_cuda_ctx *ctx)
{
    if (count == 0)
        return 0;
    /* Far beyond any tensor; keeps first + count and the block arithmetic from wrapping. */
    if (first > SIZE_MAX / 4 || count > SIZE_MAX / 4)
        return pt_error_set("init_uniform: invalid range first=%zu count=%zu", first, count);
    const size_t end = first + count, first_block = first / 4;
    const size_t blocks = (end + 3) / 4 - first_block;
    init_uniform<<<cuda_grid(blocks), CUDA_THREADS, 0, ctx->stream>>>(
        out, first, end, first_block, blocks, bound, seed, stream);
    CUDA_CHECK_LAUNCH("init_uniform");
    return 0;
}

extern "C" int kernel_init_uniform_cuda(float *out, size_t count, float bound, uint64_t seed,
                                        uint64_t stream, const kernel_cuda_ctx *ctx)
{
    return kernel_init_uniform_range_cuda(out, 0, count, bound, seed, stream, ctx);
}
