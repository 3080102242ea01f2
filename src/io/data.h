/* Image classification data sets in IDX format (MNIST, Fashion-MNIST, a user's own files),
 * gzip or plain. */
#ifndef PT_DATA_H
#define PT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "src/model/net.h"

typedef struct {
    int count;                /* samples */
    int channels, rows, cols; /* image shape C×H×W */
    uint8_t *pixels;          /* owned, count images of C·H·W bytes (N·C·H·W order) */
    int32_t *labels;          /* owned, count labels in 0..classes−1 */
} dataset;

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
/* Moves the last `n` samples of `from` into `to` (a validation split). */
int data_split_tail(dataset *from, dataset *to, int n);
void data_free(dataset *d);

#endif
