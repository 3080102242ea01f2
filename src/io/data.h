/* Image classification data sets in IDX format (MNIST, Fashion-MNIST), gzip or plain. */
#ifndef PT_DATA_H
#define PT_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int count;         /* samples */
    int rows, cols;    /* image size; one channel */
    uint8_t *pixels;   /* owned, count·rows·cols bytes */
    int32_t *labels;   /* owned, count labels in 0..classes−1 */
} dataset;

/* Reads an IDX3 image file and its IDX1 label file (".gz" or not; zlib reads both).
 * Checks magic numbers (0x00000803, 0x00000801), dimensions, that the sizes agree with the
 * file lengths (truncated data is an error, and so is trailing data in a plain file or in
 * a further gzip member; zlib silently ignores non-gzip bytes after a gzip stream), that the two counts agree and
 * that every label is < `classes`. Returns −1 with a message naming the file. */
int data_load_idx(dataset *d, const char *images_path, const char *labels_path, int classes);
/* Loads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz], trying ".gz" first. */
int data_load_fashion_mnist(dataset *train, dataset *test, const char *dir, int classes);
/* Moves the last `n` samples of `from` into `to` (a validation split). */
int data_split_tail(dataset *from, dataset *to, int n);
void data_free(dataset *d);

#endif
