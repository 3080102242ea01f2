/* A language model's samples as a data set (src/io/data.h): windows of a token corpus,
 * drawn per step or spaced evenly for evaluation; and samples of any model's kind for the
 * profiler. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/io/data.h"

int data_text_alloc(dataset *d, int count, int T)
{
    memset(d, 0, sizeof *d);
    if (count < 0 || T < 1 || (count > 0 && (size_t)T > SIZE_MAX / sizeof(float) / (size_t)count))
        return pt_error_set("text data: %d windows of %d tokens are out of range", count, T);
    size_t n = (size_t)count * (size_t)T;
    d->tokens = calloc(n ? n : 1, sizeof *d->tokens);
    d->labels = calloc(n ? n : 1, sizeof *d->labels);
    if (!d->tokens || !d->labels) {
        data_free(d);
        return pt_error_set("out of memory for %d windows of %d tokens", count, T);
    }
    d->count = count;
    d->seq = T;
    return 0;
}

void data_text_window(dataset *d, int k, const text_tokens *t, size_t o)
{
    int T = d->seq;
    float *in = d->tokens + (size_t)k * T;
    int32_t *next = d->labels + (size_t)k * T;
    for (int j = 0; j < T; j++) {
        in[j] = (float)t->tokens[o + (size_t)j];
        next[j] = t->tokens[o + (size_t)j + 1];
    }
}

int data_text_batch(dataset *d, const text_tokens *t, uint64_t seed, uint64_t step)
{
    int T = d->seq;
    if (T < 1 || t->count < (size_t)T + 1)
        return pt_error_set("text sampling: a corpus of %zu tokens is too short for windows "
                            "of %d tokens plus the target after them", t->count, T);
    for (int i = 0; i < d->count; i++)
        data_text_window(d, i, t, text_sample_offset(t, T, seed, step, (uint64_t)i));
    return 0;
}

int data_text_eval(dataset *d, const text_tokens *t, int T, int n)
{
    memset(d, 0, sizeof *d);
    if (T < 1 || t->count < (size_t)T + 1)
        return pt_error_set("the validation split's %zu tokens hold no window of %d tokens "
                            "plus the target after them", t->count, T);
    size_t last = t->count - (size_t)T - 1; /* the last offset with a target after it */
    if ((size_t)n > last + 1) n = (int)(last + 1);
    if (data_text_alloc(d, n, T)) return -1;
    for (int k = 0; k < n; k++) {
        /* 128-bit free: k·last < 2^31 · 2^40 */
        size_t o = n > 1 ? (size_t)((unsigned __int128)k * last / (unsigned)(n - 1)) : 0;
        data_text_window(d, k, t, o);
    }
    return 0;
}

int data_fake(dataset *d, const net_desc *net, int count)
{
    memset(d, 0, sizeof *d);
    if (net->sequence) {
        int T = data_model_labels(net);
        if (data_text_alloc(d, count, T)) return -1;
        for (size_t i = 0; i < (size_t)count * T; i++) {
            d->tokens[i] = (float)(i % (size_t)net->classes);
            d->labels[i] = (int32_t)((i + 1) % (size_t)net->classes);
        }
        return 0;
    }
    *d = (dataset){.count = count, .channels = net->input.c, .rows = net->input.h,
                   .cols = net->input.w};
    size_t px = data_image_bytes(d) * (size_t)count;
    d->pixels = malloc(px ? px : 1);
    d->labels = malloc((size_t)(count > 0 ? count : 1) * sizeof *d->labels);
    if (!d->pixels || !d->labels) {
        data_free(d);
        return pt_error_set("out of memory for %d samples", count);
    }
    for (size_t i = 0; i < px; i++) d->pixels[i] = (uint8_t)(rng_uniform_at(12345, 3, i) * 255.0f);
    for (int j = 0; j < count; j++) d->labels[j] = j % net->classes;
    return 0;
}
