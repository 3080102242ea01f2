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

/* Writes the tensors (names unique, in the given order) to `path` atomically through
 * src/base/output.h: an exclusive temporary in the same directory under an unguessable
 * name (PATH.tmp-PID-RANDOM), flushed to disk, renamed over PATH (an existing file's mode
 * is kept; a link there is replaced, never followed; anything else there is refused), and
 * the directory flushed, so that a crash at any moment leaves the old file or the new one,
 * and at worst a temporary behind. st_write writes no metadata (the plain format);
 * st_write_meta adds to it a CRC-32 of every tensor ("crc32:NAME") and of the metadata
 * itself ("crc32:__metadata__"), which st_read verifies.
 * Returns −1 with a message on any I/O error (the temporary is removed). */
int st_write(const char *path, const st_tensor *tensors, int count);
/* The same with "__metadata__": `meta` (may be NULL) is a NULL-terminated list of key,
 * value strings (keys starting "crc32:" are reserved). A value that is not UTF-8, as JSON
 * needs, is written with its bytes from 0x80 up as "\xNN". */
int st_write_meta(const char *path, const st_tensor *tensors, int count,
                  const char *const *meta);

typedef struct {
    int count;
    st_tensor *tensors; /* owned */
    void *blob;         /* owned: the file's data section */
    char **meta;        /* owned: NULL-terminated key, value list of "__metadata__" */
    int checksummed;    /* the file carries checksums, and every one matched */
} st_file;

/* Reads and validates a whole file: header length within the file, well-formed JSON (no
 * duplicate keys), dtype F32, offsets inside the data and matching each shape, no overlap,
 * no gap and nothing after the last tensor. All of it is checked against the file's size
 * before any data is read or allocated. Where the file carries checksums (st_write_meta
 * writes them), every tensor and the metadata must match theirs: a mismatch is an error
 * naming the tensor. A truncated or corrupt file is an error naming the file and the
 * problem. */
int st_read(st_file *f, const char *path);
/* The metadata value for `key`, or NULL. */
const char *st_meta(const st_file *f, const char *key);
/* The tensor called `name`, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
void st_free(st_file *f);

#endif
