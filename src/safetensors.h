/* Checkpoints in the safetensors format: 8-byte little-endian header length, a JSON header
 * {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}, then the
 * raw little-endian data. Only F32 tensors are written or read. */
#ifndef PT_SAFETENSORS_H
#define PT_SAFETENSORS_H

#include <stddef.h>

typedef struct {
    char name[96];
    int ndim;
    long shape[4];
    const float *data; /* writer: caller's buffer; reader: points into the file's data */
} st_tensor;

/* Writes the tensors (names unique, in the given order) to `path` atomically (temporary
 * file then rename). Returns −1 with a message on any I/O error. */
int st_write(const char *path, const st_tensor *tensors, int count);

typedef struct {
    int count;
    st_tensor *tensors; /* owned */
    void *blob;         /* owned: the file's data section */
} st_file;

/* Reads and validates a whole file: header length within the file, well-formed JSON (no
 * duplicate keys), dtype F32, offsets inside the data and matching each shape, no overlap,
 * no gap and nothing after the last tensor. All of it is checked against the file's size
 * before any data is read or allocated. A truncated or corrupt file is an error naming the
 * file and the problem. */
int st_read(st_file *f, const char *path);
/* The tensor called `name`, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
void st_free(st_file *f);

#endif
