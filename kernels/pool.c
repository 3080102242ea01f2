/* Max and average pooling without padding, floor mode, as F.max_pool2d / F.avg_pool2d. */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

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
static void pool_max2x2_plane(float *restrict m, int32_t *restrict at,
                              const float *restrict src, int w, int oh_n, int ow_n)
{
    for (int oh = 0; oh < oh_n; oh++) {
        const float *r0 = src + 2 * oh * w, *r1 = r0 + w;
        for (int ow = 0; ow < ow_n; ow++) {
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
