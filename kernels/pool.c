/* Max and average pooling without padding, floor mode, as F.max_pool2d / F.avg_pool2d. */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

static int pool_out(int in, int size, int stride) { return (in - size) / stride + 1; }

/* One window position (i, j) applied to a whole output row: m/at hold the running maximum
 * and its index. Inlined with a literal stride where one is common (2), so that the strided
 * loads become vector loads and shuffles rather than element-by-element gathers. */
static inline void pool_max_row(float *restrict m, int32_t *restrict at,
                                const float *restrict row, int base, int ow_n, int stride)
{
    for (int ow = 0; ow < ow_n; ow++) {
        const float v = row[ow * stride];
        /* As torch: replace on a strictly larger value (first maximum wins) or on NaN (so
         * NaN propagates). */
        const int take = v > m[ow] || v != v;
        m[ow] = take ? v : m[ow];
        at[ow] = take ? base + ow * stride : at[ow];
    }
}

/* The common 2×2, stride 2 case as straight-line selects per output: no branches to
 * mispredict on random data, and no per-position passes over rows that are often only
 * 5–13 outputs long. Same visiting order and replacement rule as pool_max_row. */
#if defined(__AVX512F__)
/* 16 outputs at once: the even and odd columns of 32 inputs are separated with two
 * permutes, then the four window positions are compared in torch's order with masked
 * blends (first maximum wins; NaN replaces), without branches. Returns ow_n (all done). */
static int pool_max2x2_row_avx512(float *restrict m, int32_t *restrict at, const float *r0,
                                  const float *r1, int row_base, int w, int ow_n)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i lane2 = _mm512_slli_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 1);
    /* Masked loads and stores cover rows of any length (13 or 5 outputs are common). */
    for (int ow = 0; ow < ow_n; ow += 16) {
        const int count = ow_n - ow < 16 ? ow_n - ow : 16, inputs = 2 * count;
        const __mmask16 lo = (__mmask16)(inputs >= 16 ? 0xFFFF : (1u << inputs) - 1);
        const __mmask16 hi = (__mmask16)(inputs <= 16 ? 0 : (1u << (inputs - 16)) - 1);
        const __mmask16 out = (__mmask16)(count == 16 ? 0xFFFF : (1u << count) - 1);
        __m512 x0 = _mm512_maskz_loadu_ps(lo, r0 + 2 * ow), x1 = _mm512_maskz_loadu_ps(hi, r0 + 2 * ow + 16);
        __m512 y0 = _mm512_maskz_loadu_ps(lo, r1 + 2 * ow), y1 = _mm512_maskz_loadu_ps(hi, r1 + 2 * ow + 16);
        __m512 a = _mm512_permutex2var_ps(x0, even, x1), b = _mm512_permutex2var_ps(x0, odd, x1);
        __m512 c = _mm512_permutex2var_ps(y0, even, y1), d = _mm512_permutex2var_ps(y0, odd, y1);
        __m512i ia = _mm512_add_epi32(_mm512_set1_epi32(row_base + 2 * ow), lane2);
        __m512 best = a;
        __m512i idx = ia;
        __mmask16 k = _mm512_cmp_ps_mask(b, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
        best = _mm512_mask_blend_ps(k, best, b);
        idx = _mm512_mask_blend_epi32(k, idx, _mm512_add_epi32(ia, _mm512_set1_epi32(1)));
        k = _mm512_cmp_ps_mask(c, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
        best = _mm512_mask_blend_ps(k, best, c);
        idx = _mm512_mask_blend_epi32(k, idx, _mm512_add_epi32(ia, _mm512_set1_epi32(w)));
        k = _mm512_cmp_ps_mask(d, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
        best = _mm512_mask_blend_ps(k, best, d);
        idx = _mm512_mask_blend_epi32(k, idx, _mm512_add_epi32(ia, _mm512_set1_epi32(w + 1)));
        _mm512_mask_storeu_ps(m + ow, out, best);
        _mm512_mask_storeu_epi32(at + ow, out, idx);
    }
    return ow_n;
}
#endif

static void pool_max2x2_plane(float *restrict m, int32_t *restrict at,
                              const float *restrict src, int w, int oh_n, int ow_n)
{
    for (int oh = 0; oh < oh_n; oh++) {
        const float *r0 = src + 2 * oh * w, *r1 = r0 + w;
        int ow0 = 0;
#if defined(__AVX512F__)
        ow0 = pool_max2x2_row_avx512(m + oh * ow_n, at + oh * ow_n, r0, r1, 2 * oh * w, w, ow_n);
#endif
        for (int ow = ow0; ow < ow_n; ow++) {
            const int ia = 2 * oh * w + 2 * ow;
            float best = r0[2 * ow];
            int32_t idx = ia;
            const float b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
            int take = b > best || b != b;
            best = take ? b : best;
            idx = take ? ia + 1 : idx;
            take = c > best || c != c;
            best = take ? c : best;
            idx = take ? ia + w : idx;
            take = d > best || d != d;
            best = take ? d : best;
            idx = take ? ia + w + 1 : idx;
            m[oh * ow_n + ow] = best;
            at[oh * ow_n + ow] = idx;
        }
    }
}

/* Every window position (i, j) is one pass over a whole output row, so the innermost loop
 * runs along ow and vectorises; per output element the positions are still visited in
 * torch's row-major order, which is what "first maximum wins" depends on. */
void kernel_maxpool2d_forward_cpu(float *out, int32_t *argmax, const float *in,
                                  int n, int c, int h, int w, int size, int stride)
{
    const int oh_n = pool_out(h, size, stride), ow_n = pool_out(w, size, stride);
    const size_t planes = (size_t)n * c;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *src = in + pl * h * w;
        if (size == 2 && stride == 2) {
            pool_max2x2_plane(out + pl * oh_n * ow_n, argmax + pl * oh_n * ow_n, src, w, oh_n,
                              ow_n);
            continue;
        }
        for (int oh = 0; oh < oh_n; oh++) {
            float *m = out + (pl * oh_n + oh) * ow_n;
            int32_t *at = argmax + (pl * oh_n + oh) * ow_n;
            const int ih0 = oh * stride;
            /* Start below every value, so that all −inf still names the window's first
             * element, as in torch. */
            for (int ow = 0; ow < ow_n; ow++) {
                m[ow] = -INFINITY;
                at[ow] = ih0 * w + ow * stride;
            }
            for (int i = 0; i < size; i++) {
                for (int j = 0; j < size; j++) {
                    const int base = (ih0 + i) * w + j;
                    if (stride == 2)
                        pool_max_row(m, at, src + base, base, ow_n, 2);
                    else
                        pool_max_row(m, at, src + base, base, ow_n, stride);
                }
            }
        }
    }
}

void kernel_maxpool2d_backward_cpu(float *din, const float *dout, const int32_t *argmax,
                                   int n, int c, int h, int w, int size, int stride)
{
    const size_t planes = (size_t)n * c;
    const size_t plane_out = (size_t)pool_out(h, size, stride) * pool_out(w, size, stride);
    memset(din, 0, planes * h * w * sizeof *din);
    for (size_t pl = 0; pl < planes; pl++) {
        float *dst = din + pl * h * w;
        const float *g = dout + pl * plane_out;
        const int32_t *idx = argmax + pl * plane_out;
        /* += because overlapping windows (stride < size) can pick the same input. */
        for (size_t i = 0; i < plane_out; i++)
            dst[idx[i]] += g[i];
    }
}

static inline void pool_sum_row(float *restrict sum, const float *restrict row, int ow_n,
                                int stride)
{
    for (int ow = 0; ow < ow_n; ow++)
        sum[ow] += row[ow * stride];
}

static inline void pool_spread_row(float *restrict row, const float *restrict g, int ow_n,
                                   int stride, float area)
{
    for (int ow = 0; ow < ow_n; ow++)
        row[ow * stride] += g[ow] / area;
}

/* Same loop order as the max pool; the window is summed in row-major order as torch does. */
void kernel_avgpool2d_forward_cpu(float *out, const float *in,
                                  int n, int c, int h, int w, int size, int stride)
{
    const int oh_n = pool_out(h, size, stride), ow_n = pool_out(w, size, stride);
    const size_t planes = (size_t)n * c;
    const float area = (float)(size * size);
    for (size_t pl = 0; pl < planes; pl++) {
        const float *src = in + pl * h * w;
        for (int oh = 0; oh < oh_n; oh++) {
            float *sum = out + (pl * oh_n + oh) * ow_n;
            for (int ow = 0; ow < ow_n; ow++)
                sum[ow] = 0.0f;
            for (int i = 0; i < size; i++) {
                for (int j = 0; j < size; j++) {
                    const float *row = src + (oh * stride + i) * w + j;
                    if (stride == 2)
                        pool_sum_row(sum, row, ow_n, 2);
                    else
                        pool_sum_row(sum, row, ow_n, stride);
                }
            }
            /* A division, not a multiplication by 1/area, to round as torch does. */
            for (int ow = 0; ow < ow_n; ow++)
                sum[ow] /= area;
        }
    }
}

void kernel_avgpool2d_backward_cpu(float *din, const float *dout,
                                   int n, int c, int h, int w, int size, int stride)
{
    const int oh_n = pool_out(h, size, stride), ow_n = pool_out(w, size, stride);
    const size_t planes = (size_t)n * c;
    const float area = (float)(size * size);
    memset(din, 0, planes * h * w * sizeof *din);
    for (size_t pl = 0; pl < planes; pl++) {
        float *dst = din + pl * h * w;
        for (int oh = 0; oh < oh_n; oh++) {
            const float *g = dout + (pl * oh_n + oh) * ow_n;
            for (int i = 0; i < size; i++) {
                for (int j = 0; j < size; j++) {
                    /* Within one (i, j) pass the targets ow·stride + j are distinct. */
                    float *row = dst + (oh * stride + i) * w + j;
                    if (stride == 2)
                        pool_spread_row(row, g, ow_n, 2, area);
                    else
                        pool_spread_row(row, g, ow_n, stride, area);
                }
            }
        }
    }
}
