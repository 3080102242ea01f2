/* Max and average pooling without padding, floor mode, as F.max_pool2d / F.avg_pool2d. */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

static int pool_out(int in, int size, int stride) { return (in - size) / stride + 1; }

void kernel_maxpool2d_forward_cpu(float *out, int32_t *argmax, const float *in,
                                  int n, int c, int h, int w, int size, int stride)
{
    const int oh_n = pool_out(h, size, stride), ow_n = pool_out(w, size, stride);
    const size_t planes = (size_t)n * c;
    for (size_t pl = 0; pl < planes; pl++) {
        const float *src = in + pl * h * w;
        float *dst = out + pl * oh_n * ow_n;
        int32_t *idx = argmax + pl * oh_n * ow_n;
        for (int oh = 0; oh < oh_n; oh++) {
            for (int ow = 0; ow < ow_n; ow++) {
                const int ih0 = oh * stride, iw0 = ow * stride;
                /* As torch: start below every value so the first element wins ties with
                 * −inf, and let NaN win (val != val) so that NaN propagates. */
                int32_t best = ih0 * w + iw0;
                float m = -INFINITY;
                for (int ih = ih0; ih < ih0 + size; ih++) {
                    for (int iw = iw0; iw < iw0 + size; iw++) {
                        float v = src[ih * w + iw];
                        if (v > m || v != v) {
                            m = v;
                            best = ih * w + iw;
                        }
                    }
                }
                dst[oh * ow_n + ow] = m;
                idx[oh * ow_n + ow] = best;
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

void kernel_avgpool2d_forward_cpu(float *out, const float *in,
                                  int n, int c, int h, int w, int size, int stride)
{
    const int oh_n = pool_out(h, size, stride), ow_n = pool_out(w, size, stride);
    const size_t planes = (size_t)n * c;
    const float area = (float)(size * size);
    for (size_t pl = 0; pl < planes; pl++) {
        const float *src = in + pl * h * w;
        float *dst = out + pl * oh_n * ow_n;
        for (int oh = 0; oh < oh_n; oh++) {
            for (int ow = 0; ow < ow_n; ow++) {
                float sum = 0.0f;
                for (int ih = oh * stride; ih < oh * stride + size; ih++)
                    for (int iw = ow * stride; iw < ow * stride + size; iw++)
                        sum += src[ih * w + iw];
                /* A division, not a multiplication by 1/area, to round as torch does. */
                dst[oh * ow_n + ow] = sum / area;
            }
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
        const float *g = dout + pl * oh_n * ow_n;
        for (int oh = 0; oh < oh_n; oh++) {
            for (int ow = 0; ow < ow_n; ow++) {
                const float share = g[oh * ow_n + ow] / area;
                for (int ih = oh * stride; ih < oh * stride + size; ih++)
                    for (int iw = ow * stride; iw < ow * stride + size; iw++)
                        dst[ih * w + iw] += share;
            }
        }
    }
}
