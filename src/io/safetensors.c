/* safetensors checkpoints (F32 only): an atomic writer and a strict reader; jansson writes
 * and parses the JSON header (duplicate keys rejected). Checkpoints are what a restarted job
 * trusts, so the reader rejects anything it cannot account for byte by byte, as the
 * reference implementation does: every tensor's bytes match its shape, no two tensors
 * overlap, and the tensors cover the data section exactly. It checks all of that against
 * the file's size before it reads any data, so a damaged or hostile file costs no more than
 * its header. */
#include "src/io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "src/base/error.h"
#include "src/base/io.h"
#include "src/base/output.h"

/* The raw data is copied to and from disk as it sits in memory. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* The reference implementation refuses larger headers too. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
#define ST_MAX_NAME ((int)sizeof(((st_tensor *)0)->name) - 1)
#define ST_MAX_DIMS 4

/* Bytes of a tensor's data, or -1 when a dimension is negative or the size overflows. */
static int tensor_bytes(const long *shape, int ndim, uint64_t *bytes)
{
    uint64_t n = 4;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n))
            return -1;
    }
    *bytes = n;
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* Names NUL-terminated and unique, shapes sane, data present. */
static int check_tensors(const char *path, const st_tensor *tensors, int count)
{
    for (int i = 0; i < count; i++) {
        const st_tensor *t = &tensors[i];
        if (memchr(t->name, '\0', sizeof t->name) == NULL)
            return pt_error_set("%s: tensor %d: name is longer than %d bytes", path, i,
                                ST_MAX_NAME);
        json_t *name = json_string(t->name); /* NULL: not UTF-8, as JSON must be */
        if (!name)
            return pt_error_set("%s: tensor %d: name is not valid UTF-8", path, i);
        json_decref(name);
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS)
            return pt_error_set("%s: tensor '%s': %d dimensions (0..%d allowed)", path, t->name,
                                t->ndim, ST_MAX_DIMS);
        uint64_t bytes;
        if (tensor_bytes(t->shape, t->ndim, &bytes) != 0)
            return pt_error_set("%s: tensor '%s': bad shape (negative or too large)", path,
                                t->name);
        if (bytes > 0 && !t->data)
            return pt_error_set("%s: tensor '%s': no data", path, t->name);
    }
    const st_tensor **sorted = malloc((count > 0 ? (size_t)count : 1) * sizeof *sorted);
    if (!sorted)
        return pt_error_set("%s: out of memory", path);
    for (int i = 0; i < count; i++)
        sorted[i] = &tensors[i];
    qsort(sorted, (size_t)count, sizeof *sorted, name_cmp);
    for (int i = 1; i < count; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            pt_error_set("%s: tensor name '%s' is used twice", path, sorted[i]->name);
            free(sorted);
            return -1;
        }
    free(sorted);
    return 0;
}

/* ---- checksums ---- */

/* CRC-32 (zlib's) of every tensor's bytes, "crc32:NAME", and of the rest of the metadata,
 * "crc32:__metadata__": a flipped bit anywhere in a file is found when it is read. Files
 * from other writers carry none and are read as before. */
#define ST_CRC_PREFIX "crc32:"
#define ST_CRC_META ST_CRC_PREFIX "__metadata__"

static unsigned long crc_bytes(unsigned long crc, const void *data, uint64_t n)
{
    const unsigned char *p = data;
    while (n > 0) { /* zlib takes an unsigned int length */
        uInt part = n > (1u << 30) ? 1u << 30 : (uInt)n;
        crc = crc32(crc, p, part);
        p += part;
        n -= part;
    }
    return crc;
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* The CRC of the metadata pairs other than ST_CRC_META, in key order: key NUL value NUL. */
static int crc_meta(char *const *pairs, size_t n_pairs, unsigned long *out)
{
    char *const **order = malloc((n_pairs ? n_pairs : 1) * sizeof *order);
    if (!order) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n_pairs; i++)
        if (strcmp(pairs[2 * i], ST_CRC_META)) order[k++] = &pairs[2 * i];
    qsort(order, k, sizeof *order, key_cmp);
    unsigned long crc = crc32(0, Z_NULL, 0);
    for (size_t i = 0; i < k; i++) {
        crc = crc_bytes(crc, order[i][0], strlen(order[i][0]) + 1);
        crc = crc_bytes(crc, order[i][1], strlen(order[i][1]) + 1);
    }
    free(order);
    *out = crc;
    return 0;
}

/* A metadata value as valid UTF-8 (JSON needs it): unchanged when it is; otherwise every
 * byte from 0x80 up written as "\xNN" (a path from a file system that is not UTF-8).
 * Owned by the caller; NULL when out of memory. */
static char *utf8_value(const char *v)
{
    json_t *probe = json_string(v);
    if (probe) {
        json_decref(probe);
        return strdup(v);
    }
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) n += *p >= 0x80 ? 4 : 1;
    char *out = malloc(n + 1), *o = out;
    for (const unsigned char *p = (const unsigned char *)v; out && *p; p++)
        o += *p >= 0x80 ? sprintf(o, "\\x%02x", *p) : (*o = (char)*p, 1);
    if (out) *o = '\0';
    return out;
}

/* The metadata written: the caller's pairs (values made UTF-8), a CRC per tensor and the
 * metadata's own; none of it without metadata (st_write: a plain file). A NULL-terminated
 * key, value list, every string owned; NULL with a message. */
static char **written_meta(const char *path, const st_tensor *tensors, int count,
                           const char *const *meta)
{
    if (!meta) return calloc(1, sizeof(char *));
    size_t n = 0;
    while (meta && meta[2 * n] && meta[2 * n + 1]) n++;
    for (size_t i = 0; i < n; i++)
        if (!strncmp(meta[2 * i], ST_CRC_PREFIX, strlen(ST_CRC_PREFIX))) {
            pt_error_set("%s: metadata key '%s' is reserved for checksums", path, meta[2 * i]);
            return NULL;
        }
    size_t total = n + (size_t)count + 1;
    char **out = calloc(2 * total + 1, sizeof *out);
    int ok = out != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *key = json_string(meta[2 * i]);
        if (!key) {
            pt_error_set("%s: metadata key is not valid UTF-8", path);
            ok = 0;
            break;
        }
        json_decref(key);
        ok = (out[2 * i] = strdup(meta[2 * i])) && (out[2 * i + 1] = utf8_value(meta[2 * i + 1]));
    }
    for (int t = 0; ok && t < count; t++) {
        uint64_t bytes = 0;
        tensor_bytes(tensors[t].shape, tensors[t].ndim, &bytes);
        char key[sizeof tensors[t].name + 8], value[16];
        snprintf(key, sizeof key, ST_CRC_PREFIX "%s", tensors[t].name);
        snprintf(value, sizeof value, "%08lx", crc_bytes(crc32(0, Z_NULL, 0), tensors[t].data, bytes));
        ok = (out[2 * (n + t)] = strdup(key)) && (out[2 * (n + t) + 1] = strdup(value));
    }
    unsigned long crc;
    char value[16];
    if (ok && (ok = crc_meta(out, total - 1, &crc) == 0)) {
        snprintf(value, sizeof value, "%08lx", crc);
        ok = (out[2 * (total - 1)] = strdup(ST_CRC_META)) && (out[2 * total - 1] = strdup(value));
    }
    if (!ok) {
        for (size_t i = 0; out && i < 2 * total; i++) free(out[i]);
        free(out);
        if (!*pt_error_get() || !strstr(pt_error_get(), path))
            pt_error_set("%s: out of memory building the header", path);
        return NULL;
    }
    return out;
}

/* The file's checksums against its bytes (st_read, after the data is in); f->checksummed
 * is set when it has them. */
static int verify_checksums(const char *path, st_file *f)
{
    const char *stored = st_meta(f, ST_CRC_META);
    size_t n = 0;
    while (f->meta && f->meta[2 * n]) n++;
    int any = 0;
    for (size_t i = 0; i < n; i++)
        any |= !strncmp(f->meta[2 * i], ST_CRC_PREFIX, strlen(ST_CRC_PREFIX));
    if (!any) return 0;
    unsigned long crc;
    char have[16];
    if (!stored) return pt_error_set("%s: corrupt: it has checksums but none of its metadata", path);
    if (crc_meta(f->meta, n, &crc)) return pt_error_set("%s: out of memory", path);
    snprintf(have, sizeof have, "%08lx", crc);
    if (strcmp(have, stored))
        return pt_error_set("%s: corrupt: its metadata fails its checksum (stored %s, computed "
                            "%s)", path, stored, have);
    for (int t = 0; t < f->count; t++) {
        char key[sizeof f->tensors[t].name + 8];
        snprintf(key, sizeof key, ST_CRC_PREFIX "%s", f->tensors[t].name);
        const char *want = st_meta(f, key);
        if (!want) return pt_error_set("%s: corrupt: tensor '%s' has no checksum", path,
                                       f->tensors[t].name);
        uint64_t bytes = 0;
        tensor_bytes(f->tensors[t].shape, f->tensors[t].ndim, &bytes);
        snprintf(have, sizeof have, "%08lx", crc_bytes(crc32(0, Z_NULL, 0), f->tensors[t].data, bytes));
        if (strcmp(have, want))
            return pt_error_set("%s: corrupt: tensor '%s' fails its checksum (stored %s, "
                                "computed %s)", path, f->tensors[t].name, want, have);
    }
    for (size_t i = 0; i < n; i++) {
        const char *k = f->meta[2 * i];
        if (strncmp(k, ST_CRC_PREFIX, strlen(ST_CRC_PREFIX)) || !strcmp(k, ST_CRC_META)) continue;
        if (!st_find(f, k + strlen(ST_CRC_PREFIX)))
            return pt_error_set("%s: corrupt: tensor '%s' is missing (its checksum is there)",
                                path, k + strlen(ST_CRC_PREFIX));
    }
    f->checksummed = 1;
    return 0;
}

/* The header: {"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, ...} in
 * the tensors' order, compact, padded with blanks so that the data starts 8-byte aligned
 * (after the 8-byte length). NULL when out of memory; the tensors are checked already. */
static char *header_text(const st_tensor *tensors, int count, char *const *meta, size_t *len)
{
    json_t *h = json_object();
    int ok = h != NULL;
    if (ok && meta && meta[0]) {
        json_t *m = json_object();
        for (int i = 0; m && meta[i] && meta[i + 1]; i += 2)
            if (json_object_set_new(m, meta[i], json_string(meta[i + 1])) != 0) ok = 0;
        if (!m || json_object_set_new(h, "__metadata__", m) != 0) ok = 0;
    }
    uint64_t offset = 0;
    for (int i = 0; ok && i < count; i++) {
        const st_tensor *t = &tensors[i];
        uint64_t bytes = 0;
        tensor_bytes(t->shape, t->ndim, &bytes);
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++)
            if (json_array_append_new(shape, json_integer(t->shape[d])) != 0)
                ok = 0;
        /* "o" hands `shape` over (freed if the pack fails) */
        json_t *entry = json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                                  "data_offsets", (json_int_t)offset,
                                  (json_int_t)(offset + bytes));
        if (json_object_set_new(h, t->name, entry) != 0)
            ok = 0;
        offset += bytes;
    }
    char *text = ok ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    if (!text)
        return NULL;
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *grown = realloc(text, padded + 1);
    if (!grown) {
        free(text);
        return NULL;
    }
    memset(grown + n, ' ', padded - n);
    grown[padded] = '\0';
    *len = padded;
    return grown;
}

int st_write(const char *path, const st_tensor *tensors, int count)
{
    return st_write_meta(path, tensors, count, NULL);
}

/* testing (tests/launch_restart.sh): die with the temporary complete, not yet renamed,
 * once: when the file $PT_TEST_KILL_BEFORE_RENAME names exists and its first line is part
 * of `path` */
static void test_kill_before_rename(const char *path)
{
    const char *flag = getenv("PT_TEST_KILL_BEFORE_RENAME");
    FILE *ff = flag && *flag ? fopen(flag, "r") : NULL;
    if (!ff) return;
    char want[256] = "";
    int hit = fgets(want, sizeof want, ff) && (want[strcspn(want, "\n")] = '\0', 1) && *want &&
              strstr(path, want);
    fclose(ff);
    if (hit && unlink(flag) == 0) raise(SIGKILL);
}

static int write_all(int fd, const void *data, uint64_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? 1u << 30 : (size_t)n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (uint64_t)w;
    }
    return 0;
}

int st_write_meta(const char *path, const st_tensor *tensors, int count,
                  const char *const *meta)
{
    if (count < 0 || (count > 0 && !tensors))
        return pt_error_set("%s: bad tensor list (count %d)", path, count);
    if (check_tensors(path, tensors, count) != 0)
        return -1;
    char **all = written_meta(path, tensors, count, meta);
    if (!all) return -1;
    size_t len;
    char *h = header_text(tensors, count, all, &len);
    for (size_t i = 0; all[i]; i++) free(all[i]);
    free(all);
    if (!h) return pt_error_set("%s: out of memory building the header", path);

    pt_output out;
    if (pt_output_begin(&out, path)) {
        free(h);
        return -1;
    }
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)((uint64_t)len >> (8 * b));
    int ok = write_all(out.fd, len8, 8) == 0 && write_all(out.fd, h, len) == 0;
    free(h);
    for (int i = 0; ok && i < count; i++) {
        uint64_t bytes = 0; /* already validated by check_tensors */
        tensor_bytes(tensors[i].shape, tensors[i].ndim, &bytes);
        ok = bytes == 0 || write_all(out.fd, tensors[i].data, bytes) == 0;
    }
    if (!ok) {
        int e = errno;
        pt_output_abort(&out);
        return pt_error_set("%s: write failed: %s", path, strerror(e));
    }
    test_kill_before_rename(path);
    return pt_output_commit(&out);
}

/* ---- reader ---- */

typedef struct {
    st_tensor t;
    uint64_t begin, end;
} st_entry;

/* An array of at most `max` non-negative integers into vals; *n receives its length. */
static int uint_array(const char *path, const char *tensor, const char *what, const json_t *a,
                      uint64_t *vals, int max, int *n)
{
    if (!json_is_array(a))
        return pt_error_set("%s: tensor '%s': %s is not an array", path, tensor, what);
    if (json_array_size(a) > (size_t)max)
        return pt_error_set("%s: tensor '%s': %s has %zu entries, more than %d", path, tensor,
                            what, json_array_size(a), max);
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++) {
        const json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v))
            return pt_error_set("%s: tensor '%s': %s holds %s, not an integer", path, tensor,
                                what, json_is_real(v) ? "a fraction" : "a non-number");
        if (json_integer_value(v) < 0)
            return pt_error_set("%s: tensor '%s': %s holds the negative number %lld", path,
                                tensor, what, (long long)json_integer_value(v));
        vals[i] = (uint64_t)json_integer_value(v);
    }
    return 0;
}

/* {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, keys in any order. */
static int parse_tensor(const char *path, const json_t *o, st_entry *e)
{
    const char *name = e->t.name;
    if (!json_is_object(o))
        return pt_error_set("%s: tensor '%s' is not a JSON object", path, name);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v)
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return pt_error_set("%s: unknown key '%s' in tensor '%s'", path, key, name);
    static const char *const keys[] = {"dtype", "shape", "data_offsets"};
    for (int k = 0; k < 3; k++)
        if (!json_object_get(o, keys[k]))
            return pt_error_set("%s: tensor '%s' lacks '%s'", path, name, keys[k]);

    const json_t *dtype = json_object_get(o, "dtype");
    if (!json_is_string(dtype))
        return pt_error_set("%s: tensor '%s': dtype is not a string", path, name);
    if (strcmp(json_string_value(dtype), "F32") != 0)
        return pt_error_set("%s: tensor '%s' has dtype %.32s; only F32 is supported", path,
                            name, json_string_value(dtype));
    uint64_t dims[ST_MAX_DIMS], off[2];
    int n;
    if (uint_array(path, name, "shape", json_object_get(o, "shape"), dims, ST_MAX_DIMS,
                   &e->t.ndim) != 0 ||
        uint_array(path, name, "data_offsets", json_object_get(o, "data_offsets"), off, 2,
                   &n) != 0)
        return -1;
    if (n != 2)
        return pt_error_set("%s: tensor '%s': data_offsets has %d entries, not 2", path, name,
                            n);
    for (int d = 0; d < e->t.ndim; d++)
        e->t.shape[d] = (long)dims[d]; /* ≤ 2^63 − 1: a JSON integer of jansson */
    e->begin = off[0];
    e->end = off[1];
    return 0;
}

/* "__metadata__": an object of strings (kept: checkpoints describe themselves there). */
static int check_metadata(const char *path, const json_t *o)
{
    if (!json_is_object(o))
        return pt_error_set("%s: __metadata__ is not a JSON object", path);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)o, key, v)
        if (!json_is_string(v))
            return pt_error_set("%s: __metadata__ entry '%s' is not a string", path, key);
    return 0;
}

static void free_meta(char **meta)
{
    for (size_t i = 0; meta && meta[i]; i++) free(meta[i]);
    free(meta);
}

/* The header text: one object of tensors (and maybe "__metadata__"), then blanks. */
static int parse_header(const char *path, const char *text, size_t len, st_entry **entries,
                        int *count, char ***meta)
{
    *entries = NULL;
    *count = 0;
    *meta = NULL;
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return pt_error_set("%s: bad JSON header at byte %d: %s", path, err.position, err.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return pt_error_set("%s: the JSON header is not an object", path);
    }
    int rc = 0;
    size_t n = json_object_size(root);
    if (n > 0 && !(*entries = calloc(n, sizeof **entries))) {
        json_decref(root);
        return pt_error_set("%s: out of memory", path);
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (strcmp(name, "__metadata__") == 0) {
            if ((rc = check_metadata(path, v)) != 0)
                break;
            size_t m = json_object_size(v), k = 0;
            *meta = calloc(2 * m + 1, sizeof **meta);
            if (!*meta) {
                rc = pt_error_set("%s: out of memory", path);
                break;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                (*meta)[k] = strdup(mk);
                (*meta)[k + 1] = strdup(json_string_value(mv));
                if (!(*meta)[k] || !(*meta)[k + 1]) {
                    free((*meta)[k]);
                    (*meta)[k] = NULL;
                    rc = pt_error_set("%s: out of memory", path);
                    break;
                }
                k += 2;
            }
            if (rc) break;
            continue;
        }
        if (strlen(name) > (size_t)ST_MAX_NAME) {
            rc = pt_error_set("%s: tensor name '%.40s...' is longer than %d bytes", path, name,
                              ST_MAX_NAME);
            break;
        }
        st_entry *e = &(*entries)[(*count)++];
        memcpy(e->t.name, name, strlen(name) + 1);
        if ((rc = parse_tensor(path, v, e)) != 0)
            break;
    }
    json_decref(root);
    if (rc != 0) {
        free(*entries);
        *entries = NULL;
        *count = 0;
        free_meta(*meta);
        *meta = NULL;
    }
    return rc;
}

static int entry_by_offset(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Offsets against shapes and the data section: exact sizes, no overlap, no gap. */
static int check_layout(const char *path, st_entry *entries, int count, uint64_t data_bytes)
{
    for (int i = 0; i < count; i++) {
        const st_entry *e = &entries[i];
        uint64_t bytes;
        if (tensor_bytes(e->t.shape, e->t.ndim, &bytes) != 0)
            return pt_error_set("%s: tensor '%s': shape too large", path, e->t.name);
        if (e->begin > e->end)
            return pt_error_set("%s: tensor '%s': data_offsets [%llu, %llu] are reversed", path,
                                e->t.name, (unsigned long long)e->begin,
                                (unsigned long long)e->end);
        if (e->end > data_bytes)
            return pt_error_set("%s: tensor '%s': data_offsets [%llu, %llu] out of range: the "
                                "data section has %llu bytes",
                                path, e->t.name, (unsigned long long)e->begin,
                                (unsigned long long)e->end, (unsigned long long)data_bytes);
        if (e->end - e->begin != bytes)
            return pt_error_set("%s: tensor '%s': shape needs %llu bytes but data_offsets span "
                                "%llu",
                                path, e->t.name, (unsigned long long)bytes,
                                (unsigned long long)(e->end - e->begin));
    }
    /* (names are unique: the parser rejects duplicate keys; qsort must not see the NULL
     * list of an empty file) */
    if (count > 1)
        qsort(entries, (size_t)count, sizeof *entries, entry_by_offset);
    uint64_t at = 0;
    for (int i = 0; i < count; i++) {
        if (entries[i].begin < at)
            return pt_error_set("%s: tensors '%s' and '%s' overlap", path, entries[i - 1].t.name,
                                entries[i].t.name);
        if (entries[i].begin > at)
            return pt_error_set("%s: %llu unused bytes before tensor '%s'", path,
                                (unsigned long long)(entries[i].begin - at), entries[i].t.name);
        at = entries[i].end;
    }
    if (at != data_bytes)
        return pt_error_set("%s: %llu bytes of data after the last tensor", path,
                            (unsigned long long)(data_bytes - at));
    return 0;
}

int st_read(st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    FILE *fp = pt_fopen_regular(path, "rb");
    if (!fp)
        return -1;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return pt_error_set("%s: not a regular file", path);
    }
    /* the sizes first: nothing is allocated or read that the file cannot hold */
    uint64_t size = (uint64_t)st.st_size;
    unsigned char len8[8];
    if (size < 8 || fread(len8, 1, 8, fp) != 8) {
        fclose(fp);
        return pt_error_set("%s: truncated: %llu bytes, too short for the 8-byte header length",
                            path, (unsigned long long)size);
    }
    uint64_t header_len = 0;
    for (int b = 7; b >= 0; b--)
        header_len = header_len << 8 | len8[b];
    if (header_len > size - 8) {
        fclose(fp);
        return pt_error_set("%s: truncated or corrupt: header length %llu exceeds the %llu "
                            "bytes that follow it",
                            path, (unsigned long long)header_len, (unsigned long long)(size - 8));
    }
    if (header_len > ST_MAX_HEADER) {
        fclose(fp);
        return pt_error_set("%s: header length %llu is larger than %llu", path,
                            (unsigned long long)header_len, (unsigned long long)ST_MAX_HEADER);
    }
    uint64_t data_bytes = size - 8 - header_len;
    char *header = malloc(header_len ? (size_t)header_len : 1);
    if (!header) {
        fclose(fp);
        return pt_error_set("%s: out of memory", path);
    }
    if (fread(header, 1, (size_t)header_len, fp) != header_len) {
        free(header);
        fclose(fp);
        return pt_error_set("%s: read error (file changed while reading?)", path);
    }

    /* then the header against the data section, still without reading it */
    st_entry *entries = NULL;
    int count = 0;
    int rc = parse_header(path, header, (size_t)header_len, &entries, &count, &f->meta);
    free(header);
    if (rc == 0)
        rc = check_layout(path, entries, count, data_bytes);
    if (rc == 0 && data_bytes > SIZE_MAX / 2)
        rc = pt_error_set("%s: data section too large", path);
    if (rc == 0 && count > 0 && !(f->tensors = malloc((size_t)count * sizeof *f->tensors)))
        rc = pt_error_set("%s: out of memory", path);
    /* its own allocation, so that the floats are aligned whatever the header length */
    if (rc == 0 && !(f->blob = malloc(data_bytes ? (size_t)data_bytes : 1)))
        rc = pt_error_set("%s: out of memory for %llu bytes of data", path,
                          (unsigned long long)data_bytes);
    /* only now the data, which the tensors cover exactly */
    if (rc == 0 && fread(f->blob, 1, (size_t)data_bytes, fp) != data_bytes)
        rc = pt_error_set("%s: read error (file changed while reading?)", path);
    fclose(fp);
    if (rc != 0) {
        free(entries);
        st_free(f);
        return -1;
    }
    /* in file order of the data (the writer's order) */
    for (int i = 0; i < count; i++) {
        f->tensors[i] = entries[i].t;
        f->tensors[i].data = (const float *)((const char *)f->blob + entries[i].begin);
    }
    f->count = count;
    free(entries);
    if (verify_checksums(path, f)) {
        st_free(f);
        return -1;
    }
    return 0;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *st_meta(const st_file *f, const char *key)
{
    for (size_t i = 0; f->meta && f->meta[i]; i += 2)
        if (strcmp(f->meta[i], key) == 0) return f->meta[i + 1];
    return NULL;
}

void st_free(st_file *f)
{
    free_meta(f->meta);
    free(f->tensors);
    free(f->blob);
    memset(f, 0, sizeof *f);
}
