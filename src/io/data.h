/* Data sets: image classification in IDX format (MNIST, Fashion-MNIST, a user's own files),
 * gzip or plain; and a language model's windows of a token corpus (src/io/text_data.h),
 * in the same struct, so that the executor and the engines deal samples to replicas,
 * micro-batches and stages one way for both. */
#ifndef PT_DATA_H
#define PT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "src/io/text_data.h"
#include "src/model/net.h"

typedef struct {
    int count;                /* samples */
    int channels, rows, cols; /* image shape C×H×W */
    uint8_t *pixels;          /* owned, count images of C·H·W bytes (N·C·H·W order) */
    int32_t *labels;          /* owned, count · data_labels_per_sample labels in
                                 0..classes−1 (sample i's from labels[i·L]) */
    /* A language model's samples (data_text_*) instead of images: sample i is a window of
     * seq tokens, its inputs tokens[i·seq .. i·seq + seq) (token ids as floats, exact below
     * 2^24: the stage input of the embedding) and its labels the seq tokens that follow
     * each of them. NULL and 0 for images. */
    float *tokens;            /* owned */
    int seq;
} dataset;

/* Labels per sample of a data set: 1 (an image's class), or a window's T next tokens. */
static inline int data_labels_per_sample(const dataset *d)
{
    return d->tokens ? d->seq : 1;
}
/* Labels per sample a model predicts: T for a language model (a next token at each of its
 * T positions, the loss averaged over all of them), else 1. */
static inline int data_model_labels(const net_desc *net)
{
    return net->sequence ? (int)layer_shape_count(net->input) : 1;
}

/* Bytes of one image: C·H·W. */
static inline size_t data_image_bytes(const dataset *d)
{
    return (size_t)d->channels * d->rows * d->cols;
}

/* Reads an image file and its IDX1 label file (".gz" or not; zlib reads both). Images are
 * unsigned bytes, IDX3 (N×H×W, one channel, magic 0x00000803) or IDX4 (N×C×H×W, magic
 * 0x00000804); with `want` (a model's input) their C×H×W must equal it, NULL takes any.
 * Checks magic numbers (labels 0x00000801), dimensions, that the sizes agree with the
 * file lengths (truncated data is an error, and so is trailing data in a plain file or in
 * a further gzip member; zlib silently ignores non-gzip bytes after a gzip stream), that the
 * two counts agree and that every label is < `classes`. Returns −1 with a message naming
 * the file. `limit` ≥ 0 reads only the first `limit` samples (a run that uses 256 of
 * Fashion-MNIST's 60,000 need not inflate 47 MB on every rank); the checks then stop where
 * the reading does: headers, counts and the samples read, not what follows. −1 reads all. */
int data_load_idx(dataset *d, const char *images_path, const char *labels_path,
                  const layer_shape *want, int classes, long limit);
/* Loads one split of a directory in Fashion-MNIST's names: DIR/PREFIX-images-idx3-ubyte and
 * DIR/PREFIX-labels-idx1-ubyte, each ".gz" when that exists; PREFIX "train" or "t10k". */
int data_load_dir(dataset *d, const char *dir, const char *prefix, const layer_shape *want,
                  int classes, long limit);
/* Moves the last `n` samples of `from` into `to` (a validation split); images only. */
int data_split_tail(dataset *from, dataset *to, int n);
void data_free(dataset *d);

/* ---- a language model's windows (src/io/data_text.c) ---- */

/* An empty text data set of `count` windows of T tokens (tokens and labels allocated,
 * zero). −1 with a message when out of memory or the sizes are out of range. */
int data_text_alloc(dataset *d, int count, int T);
/* Window k of d from the corpus at offset o: inputs tokens[o, o+T), labels [o+1, o+T]
 * (o + T < t->count: the caller's). */
void data_text_window(dataset *d, int k, const text_tokens *t, size_t o);
/* One training step's batch, d->count windows of d->seq tokens: sample i is the window at
 * text_sample_offset(t, T, seed, step, i). Sample i is the step's global sample id i (the
 * executor deals ids [r·B/R + m·B/(R·M), ...) to replica r's micro-batch m), so every
 * layout trains on the same windows. −1 when the corpus holds no window. */
int data_text_batch(dataset *d, const text_tokens *t, uint64_t seed, uint64_t step);
/* The evaluation set: n windows of T tokens evenly spaced over t, window k at offset
 * ⌊k·(count − T − 1)/(n − 1)⌋ (the first at 0, the last ending at the corpus's end), so
 * that every run and layout evaluates on the same tokens. n is cut to count − T (the
 * distinct windows there are). −1 with a message when t holds no window. */
int data_text_eval(dataset *d, const text_tokens *t, int T, int n);
/* Samples of the right kind for `net` with no meaning (profiling): `count` random images
 * and labels, or windows of token 0 … classes−1 in turn; owned by d. */
int data_fake(dataset *d, const net_desc *net, int count);

#endif
