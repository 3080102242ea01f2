/* The reader of the golden files tests/golden/NAME.bin (format described in
 * experiments/golden/make_golden.py), shared by tests/test_golden.c and
 * tests/test_golden_transformer.c. A missing, truncated or corrupted golden file fails the
 * test (never skips it). Static inline, so a suite that does not use a helper does not
 * warn. */
#ifndef PT_TESTS_GOLDEN_READER_H
#define PT_TESTS_GOLDEN_READER_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/check.h"

#define GOLDEN_MAGIC "PTGD"
#define GOLDEN_VERSION 1u
#define GOLDEN_MAX_ARRAYS 64
#define GOLDEN_MAX_DIMS 4

enum { GOLDEN_F32 = 0, GOLDEN_I32 = 1 };

typedef struct {
    char name[64];
    uint32_t dtype, ndim, dims[GOLDEN_MAX_DIMS];
    size_t count;
    const unsigned char *data; /* inside golden_file.buf, little-endian, maybe unaligned */
} golden_array;

typedef struct {
    unsigned char *buf;
    size_t size;
    int count;
    golden_array arr[GOLDEN_MAX_ARRAYS];
} golden_file;

static inline uint32_t golden_fnv1a(const unsigned char *p, size_t n)
{
    uint32_t h = 0x811C9DC5u;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x01000193u;
    }
    return h;
}

static inline uint32_t golden_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void golden_free(golden_file *g)
{
    free(g->buf);
    g->buf = NULL;
    g->size = 0;
    g->count = 0;
}

/* Reads and validates path; 0 on success, else −1 with a reason in err. */
static inline int golden_load(golden_file *g, const char *path, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    g->buf = malloc(cap);
    for (;;) {
        if (len == cap)
            g->buf = realloc(g->buf, cap *= 2);
        size_t got = fread(g->buf + len, 1, cap - len, f);
        if (got == 0)
            break;
        len += got;
    }
    fclose(f);
    g->size = len;
    const unsigned char *p = g->buf;
    if (len < 16 || memcmp(p, GOLDEN_MAGIC, 4) != 0) {
        snprintf(err, errlen, "%s: not a golden file (bad magic or too short)", path);
        goto fail;
    }
    if (golden_u32(p + 4) != GOLDEN_VERSION) {
        snprintf(err, errlen, "%s: version %u, expected %u", path, golden_u32(p + 4),
                 GOLDEN_VERSION);
        goto fail;
    }
    if (golden_fnv1a(p, len - 4) != golden_u32(p + len - 4)) {
        snprintf(err, errlen, "%s: checksum mismatch (corrupted or truncated)", path);
        goto fail;
    }
    uint32_t count = golden_u32(p + 8);
    if (count > GOLDEN_MAX_ARRAYS) {
        snprintf(err, errlen, "%s: %u arrays, at most %d supported", path, count,
                 GOLDEN_MAX_ARRAYS);
        goto fail;
    }
    size_t off = 12, end = len - 4;
    for (uint32_t i = 0; i < count; i++) {
        golden_array *a = &g->arr[i];
        if (off + 4 > end)
            goto short_file;
        uint32_t name_len = golden_u32(p + off);
        off += 4;
        if (name_len >= sizeof a->name || off + name_len + 8 > end)
            goto short_file;
        memcpy(a->name, p + off, name_len);
        a->name[name_len] = '\0';
        off += name_len;
        a->dtype = golden_u32(p + off);
        a->ndim = golden_u32(p + off + 4);
        off += 8;
        if (a->dtype > GOLDEN_I32 || a->ndim > GOLDEN_MAX_DIMS || off + 4 * a->ndim > end)
            goto short_file;
        a->count = 1;
        for (uint32_t d = 0; d < a->ndim; d++) {
            a->dims[d] = golden_u32(p + off + 4 * d);
            a->count *= a->dims[d];
        }
        off += 4 * a->ndim;
        if (a->count > (end - off) / 4)
            goto short_file;
        a->data = p + off;
        off += 4 * a->count;
    }
    if (off != end) {
        snprintf(err, errlen, "%s: %zu bytes after the last array", path, end - off);
        goto fail;
    }
    g->count = (int)count;
    return 0;
short_file:
    snprintf(err, errlen, "%s: array table runs past the end of the file", path);
fail:
    golden_free(g);
    return -1;
}

/* Loads tests/golden/<name> under the source tree, failing the test if that is impossible. */
static inline void golden_open(golden_file *g, const char *name)
{
    char path[4096], err[4300];
    snprintf(path, sizeof path, "%s/tests/golden/%s", check_source_dir(), name);
    int rc = golden_load(g, path, err, sizeof err);
    cr_assert(rc == 0, "%s", err);
}

static inline const golden_array *golden_find(const golden_file *g, const char *name,
                                              uint32_t dtype, size_t count)
{
    for (int i = 0; i < g->count; i++) {
        const golden_array *a = &g->arr[i];
        if (strcmp(a->name, name) != 0)
            continue;
        cr_assert(a->dtype == dtype, "golden array %s has dtype %u, expected %u", name,
                  a->dtype, dtype);
        cr_assert(a->count == count, "golden array %s has %zu elements, expected %zu", name,
                  a->count, count);
        return a;
    }
    cr_assert_fail("golden array %s is missing", name);
    return NULL;
}

/* The element count of a named array (failing the test if it is absent). */
static inline size_t golden_count(const golden_file *g, const char *name)
{
    for (int i = 0; i < g->count; i++)
        if (strcmp(g->arr[i].name, name) == 0)
            return g->arr[i].count;
    cr_assert_fail("golden array %s is missing", name);
    return 0;
}

/* A freshly allocated copy of a float32 array (the caller frees it). */
static inline float *golden_floats(const golden_file *g, const char *name, size_t count)
{
    const golden_array *a = golden_find(g, name, GOLDEN_F32, count);
    float *out = malloc((count ? count : 1) * sizeof *out);
    for (size_t i = 0; i < count; i++) {
        /* A union, not memcpy into out[i]: inlined, GCC 12's -Wstringop-overflow misjudges
         * the latter's bounds in the sanitizer build. */
        union { uint32_t u; float f; } v = {.u = golden_u32(a->data + 4 * i)};
        out[i] = v.f;
    }
    return out;
}

static inline int32_t *golden_ints(const golden_file *g, const char *name, size_t count)
{
    const golden_array *a = golden_find(g, name, GOLDEN_I32, count);
    int32_t *out = malloc((count ? count : 1) * sizeof *out);
    for (size_t i = 0; i < count; i++)
        out[i] = (int32_t)golden_u32(a->data + 4 * i);
    return out;
}

#endif
