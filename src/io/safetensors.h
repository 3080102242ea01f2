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

/* Writes the tensors (names unique, in the given order) to `path` atomically: a temporary
 * file in the same directory with a unique name (PATH.tmp-PID-N: two writers never share
 * one), flushed to disk, renamed over PATH, and the directory flushed, so that a crash at
 * any moment leaves the old file or the new one, and at worst a temporary behind.
 * Returns −1 with a message on any I/O error (the temporary is removed). */
int st_write(const char *path, const st_tensor *tensors, int count);
/* The same with "__metadata__": `meta` (may be NULL) is a NULL-terminated list of key,
 * value strings. */
int st_write_meta(const char *path, const st_tensor *tensors, int count,
                  const char *const *meta);

typedef struct {
    int count;
    st_tensor *tensors; /* owned */
    void *blob;         /* owned: the file's data section */
    char **meta;        /* owned: NULL-terminated key, value list of "__metadata__" */
} st_file;

/* Reads and validates a whole file: header length within the file, well-formed JSON (no
 * duplicate keys), dtype F32, offsets inside the data and matching each shape, no overlap,
 * no gap and nothing after the last tensor. All of it is checked against the file's size
 * before any data is read or allocated. A truncated or corrupt file is an error naming the
 * file and the problem. */
int st_read(st_file *f, const char *path);
/* The metadata value for `key`, or NULL. */
const char *st_meta(const st_file *f, const char *key);
/* The tensor called `name`, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
void st_free(st_file *f);

#endif
