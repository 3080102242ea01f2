/* safetensors checkpoints (F32 only): an atomic writer and a strict reader with its own
 * small JSON parser for the header. Checkpoints are what a restarted job trusts, so the
 * reader rejects anything it cannot account for byte by byte, as the reference
 * implementation does: every tensor's bytes match its shape, no two tensors overlap, and
 * the tensors cover the data section exactly. */
#include "src/safetensors.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/io.h"

/* The raw data is copied to and from disk as it sits in memory. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* The reference implementation refuses larger headers too. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
#define ST_MAX_NAME ((int)sizeof(((st_tensor *)0)->name) - 1)
#define ST_MAX_DIMS 4

/* ---- a growable text buffer for the writer ---- */

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} st_text;

__attribute__((format(printf, 2, 3))) static void text_printf(st_text *t, const char *fmt, ...)
{
    if (t->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = 1;
            return;
        }
        if (t->s && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap : 256;
        while (cap <= t->len + (size_t)n)
            cap *= 2;
        char *grown = realloc(t->s, cap);
        if (!grown) {
            t->oom = 1;
            return;
        }
        t->s = grown;
        t->cap = cap;
    }
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void text_json_string(st_text *t, const char *s)
{
    text_printf(t, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            text_printf(t, "\\%c", c);
        else if (c < 0x20)
            text_printf(t, "\\u%04x", c);
        else
            text_printf(t, "%c", c);
    }
    text_printf(t, "\"");
}

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
    const st_tensor **sorted = malloc((size_t)(count ? count : 1) * sizeof *sorted);
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

int st_write(const char *path, const st_tensor *tensors, int count)
{
    if (count < 0 || (count > 0 && !tensors))
        return pt_error_set("%s: bad tensor list (count %d)", path, count);
    if (check_tensors(path, tensors, count) != 0)
        return -1;

    st_text h = {0};
    uint64_t offset = 0;
    text_printf(&h, "{");
    for (int i = 0; i < count; i++) {
        const st_tensor *t = &tensors[i];
        uint64_t bytes = 0; /* already validated by check_tensors */
        tensor_bytes(t->shape, t->ndim, &bytes);
        text_printf(&h, i ? "," : "");
        text_json_string(&h, t->name);
        text_printf(&h, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++)
            text_printf(&h, d ? ",%ld" : "%ld", t->shape[d]);
        text_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                    (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    text_printf(&h, "}");
    /* pad so that the data starts 8-byte aligned (8-byte length + header) */
    while (!h.oom && h.len % 8 != 0)
        text_printf(&h, " ");
    if (h.oom) {
        free(h.s);
        return pt_error_set("%s: out of memory building the header", path);
    }

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(h.s);
        return pt_error_set("%s: path too long", path);
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int e = errno;
        free(h.s);
        return pt_error_set("%s: cannot create: %s", tmp, strerror(e));
    }
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)((uint64_t)h.len >> (8 * b));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h.s, 1, h.len, f) == h.len;
    free(h.s);
    for (int i = 0; ok && i < count; i++) {
        uint64_t bytes = 0; /* already validated by check_tensors */
        tensor_bytes(tensors[i].shape, tensors[i].ndim, &bytes);
        ok = bytes == 0 || fwrite(tensors[i].data, 1, (size_t)bytes, f) == bytes;
    }
    /* on disk before the rename, so that a crash leaves the old file or the new one */
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        unlink(tmp);
        return pt_error_set("%s: write failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return pt_error_set("%s: cannot rename %s into place: %s", path, tmp, strerror(e));
    }
    return 0;
}

/* ---- reader: a strict JSON parser for the header ---- */

typedef struct {
    const char *path;
    const char *s;
    size_t len, pos;
} json_cursor;

__attribute__((format(printf, 2, 3))) static int json_fail(const json_cursor *c,
                                                            const char *fmt, ...)
{
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return pt_error_set("%s: bad JSON header at byte %zu: %s", c->path, c->pos, reason);
}

static void json_skip_ws(json_cursor *c)
{
    while (c->pos < c->len && (c->s[c->pos] == ' ' || c->s[c->pos] == '\t' ||
                               c->s[c->pos] == '\n' || c->s[c->pos] == '\r'))
        c->pos++;
}

/* Skips blanks, then consumes `ch` if it is next; returns whether it was. */
static int json_accept(json_cursor *c, char ch)
{
    json_skip_ws(c);
    if (c->pos < c->len && c->s[c->pos] == ch) {
        c->pos++;
        return 1;
    }
    return 0;
}

static int json_expect(json_cursor *c, char ch)
{
    if (json_accept(c, ch))
        return 0;
    if (c->pos >= c->len)
        return json_fail(c, "expected '%c', found the end of the header", ch);
    return json_fail(c, "expected '%c', found '%c'", ch, c->s[c->pos]);
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char h = s[i];
        v <<= 4;
        if (h >= '0' && h <= '9')
            v |= (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f')
            v |= (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F')
            v |= (unsigned)(h - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* A JSON string decoded to UTF-8 into out[cap] (NUL-terminated); longer is an error. */
static int json_string(json_cursor *c, char *out, size_t cap)
{
    if (json_expect(c, '"') != 0)
        return -1;
    size_t n = 0;
    for (;;) {
        if (c->pos >= c->len)
            return json_fail(c, "unterminated string");
        unsigned char ch = (unsigned char)c->s[c->pos];
        char enc[4];
        size_t enc_len = 1;
        if (ch == '"') {
            c->pos++;
            break;
        }
        if (ch < 0x20)
            return json_fail(c, "control character 0x%02x in a string", ch);
        if (ch != '\\') {
            enc[0] = (char)ch;
            c->pos++;
        } else {
            if (c->pos + 1 >= c->len)
                return json_fail(c, "unterminated escape");
            char e = c->s[c->pos + 1];
            c->pos += 2;
            switch (e) {
            case '"': enc[0] = '"'; break;
            case '\\': enc[0] = '\\'; break;
            case '/': enc[0] = '/'; break;
            case 'b': enc[0] = '\b'; break;
            case 'f': enc[0] = '\f'; break;
            case 'n': enc[0] = '\n'; break;
            case 'r': enc[0] = '\r'; break;
            case 't': enc[0] = '\t'; break;
            case 'u': {
                unsigned u, lo;
                if (c->pos + 4 > c->len || hex4(c->s + c->pos, &u) != 0)
                    return json_fail(c, "bad \\u escape");
                c->pos += 4;
                if (u >= 0xD800 && u <= 0xDBFF) { /* surrogate pair */
                    if (c->pos + 6 > c->len || c->s[c->pos] != '\\' || c->s[c->pos + 1] != 'u' ||
                        hex4(c->s + c->pos + 2, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
                        return json_fail(c, "unpaired UTF-16 surrogate");
                    c->pos += 6;
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    return json_fail(c, "unpaired UTF-16 surrogate");
                }
                if (u == 0)
                    return json_fail(c, "NUL character in a string");
                if (u < 0x80) {
                    enc[0] = (char)u;
                } else if (u < 0x800) {
                    enc[0] = (char)(0xC0 | u >> 6);
                    enc[1] = (char)(0x80 | (u & 0x3F));
                    enc_len = 2;
                } else if (u < 0x10000) {
                    enc[0] = (char)(0xE0 | u >> 12);
                    enc[1] = (char)(0x80 | ((u >> 6) & 0x3F));
                    enc[2] = (char)(0x80 | (u & 0x3F));
                    enc_len = 3;
                } else {
                    enc[0] = (char)(0xF0 | u >> 18);
                    enc[1] = (char)(0x80 | ((u >> 12) & 0x3F));
                    enc[2] = (char)(0x80 | ((u >> 6) & 0x3F));
                    enc[3] = (char)(0x80 | (u & 0x3F));
                    enc_len = 4;
                }
                break;
            }
            default: return json_fail(c, "bad escape '\\%c'", e);
            }
        }
        if (n + enc_len >= cap)
            return json_fail(c, "string longer than %zu bytes", cap - 1);
        memcpy(out + n, enc, enc_len);
        n += enc_len;
    }
    out[n] = '\0';
    return 0;
}

/* A non-negative JSON integer (no sign, fraction, exponent or leading zero). */
static int json_uint(json_cursor *c, uint64_t *out)
{
    json_skip_ws(c);
    if (c->pos < c->len && c->s[c->pos] == '-')
        return json_fail(c, "negative number");
    if (c->pos >= c->len || c->s[c->pos] < '0' || c->s[c->pos] > '9')
        return json_fail(c, "expected a non-negative integer");
    if (c->s[c->pos] == '0' && c->pos + 1 < c->len && c->s[c->pos + 1] >= '0' &&
        c->s[c->pos + 1] <= '9')
        return json_fail(c, "leading zero in a number");
    uint64_t v = 0;
    while (c->pos < c->len && c->s[c->pos] >= '0' && c->s[c->pos] <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(c->s[c->pos] - '0'), &v))
            return json_fail(c, "integer too large");
        c->pos++;
    }
    if (c->pos < c->len && (c->s[c->pos] == '.' || c->s[c->pos] == 'e' || c->s[c->pos] == 'E'))
        return json_fail(c, "expected an integer");
    *out = v;
    return 0;
}

/* "[a, b, ...]" with at most `max` integers. */
static int json_uint_array(json_cursor *c, uint64_t *vals, int max, int *n, const char *what)
{
    *n = 0;
    if (json_expect(c, '[') != 0)
        return -1;
    if (json_accept(c, ']'))
        return 0;
    do {
        if (*n == max)
            return json_fail(c, "%s has more than %d entries", what, max);
        if (json_uint(c, &vals[(*n)++]) != 0)
            return -1;
    } while (json_accept(c, ','));
    return json_expect(c, ']');
}

/* "__metadata__": an object of strings, which we do not use. */
static int json_skip_metadata(json_cursor *c)
{
    char buf[4096];
    if (json_expect(c, '{') != 0)
        return -1;
    if (json_accept(c, '}'))
        return 0;
    do {
        if (json_string(c, buf, sizeof buf) != 0 || json_expect(c, ':') != 0 ||
            json_string(c, buf, sizeof buf) != 0)
            return -1;
    } while (json_accept(c, ','));
    return json_expect(c, '}');
}

typedef struct {
    st_tensor t;
    uint64_t begin, end;
} st_entry;

/* {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, keys in any order. */
static int json_tensor(json_cursor *c, st_entry *e)
{
    enum { HAVE_DTYPE = 1, HAVE_SHAPE = 2, HAVE_OFFSETS = 4 };
    int have = 0;
    char key[32], dtype[32] = "";
    if (json_expect(c, '{') != 0)
        return -1;
    if (!json_accept(c, '}')) {
        do {
            size_t key_pos = c->pos;
            if (json_string(c, key, sizeof key) != 0 || json_expect(c, ':') != 0)
                return -1;
            int bit = strcmp(key, "dtype") == 0          ? HAVE_DTYPE
                      : strcmp(key, "shape") == 0        ? HAVE_SHAPE
                      : strcmp(key, "data_offsets") == 0 ? HAVE_OFFSETS
                                                         : 0;
            if (!bit) {
                c->pos = key_pos;
                return json_fail(c, "unknown key '%s' in tensor '%s'", key, e->t.name);
            }
            if (have & bit) {
                c->pos = key_pos;
                return json_fail(c, "duplicate key '%s' in tensor '%s'", key, e->t.name);
            }
            have |= bit;
            if (bit == HAVE_DTYPE) {
                if (json_string(c, dtype, sizeof dtype) != 0)
                    return -1;
            } else if (bit == HAVE_SHAPE) {
                uint64_t dims[ST_MAX_DIMS];
                if (json_uint_array(c, dims, ST_MAX_DIMS, &e->t.ndim, "shape") != 0)
                    return -1;
                for (int d = 0; d < e->t.ndim; d++) {
                    if (dims[d] > LONG_MAX)
                        return json_fail(c, "dimension too large in tensor '%s'", e->t.name);
                    e->t.shape[d] = (long)dims[d];
                }
            } else {
                uint64_t off[2];
                int n;
                if (json_uint_array(c, off, 2, &n, "data_offsets") != 0)
                    return -1;
                if (n != 2)
                    return json_fail(c, "data_offsets of tensor '%s' has %d entries, not 2",
                                     e->t.name, n);
                e->begin = off[0];
                e->end = off[1];
            }
        } while (json_accept(c, ','));
        if (json_expect(c, '}') != 0)
            return -1;
    }
    static const char *const names[] = {"dtype", "shape", "data_offsets"};
    for (int b = 0; b < 3; b++)
        if (!(have & (1 << b)))
            return json_fail(c, "tensor '%s' lacks '%s'", e->t.name, names[b]);
    if (strcmp(dtype, "F32") != 0)
        return pt_error_set("%s: tensor '%s' has dtype %s; only F32 is supported", c->path,
                            e->t.name, dtype);
    return 0;
}

/* The whole header: one object of tensors (and maybe "__metadata__"), then blanks. */
static int json_header(json_cursor *c, st_entry **entries, int *count)
{
    *entries = NULL;
    *count = 0;
    int cap = 0;
    if (json_expect(c, '{') != 0)
        return -1;
    if (!json_accept(c, '}')) {
        do {
            char name[sizeof(((st_tensor *)0)->name)];
            if (json_string(c, name, sizeof name) != 0 || json_expect(c, ':') != 0)
                return -1;
            if (strcmp(name, "__metadata__") == 0) {
                if (json_skip_metadata(c) != 0)
                    return -1;
                continue;
            }
            if (*count == cap) {
                cap = cap ? 2 * cap : 16;
                st_entry *grown = realloc(*entries, (size_t)cap * sizeof *grown);
                if (!grown)
                    return pt_error_set("%s: out of memory", c->path);
                *entries = grown;
            }
            st_entry *e = &(*entries)[(*count)++];
            memset(e, 0, sizeof *e);
            memcpy(e->t.name, name, strlen(name) + 1);
            if (json_tensor(c, e) != 0)
                return -1;
        } while (json_accept(c, ','));
        if (json_expect(c, '}') != 0)
            return -1;
    }
    json_skip_ws(c);
    if (c->pos != c->len)
        return json_fail(c, "unexpected '%c' after the header object", c->s[c->pos]);
    return 0;
}

static int entry_by_name(const void *a, const void *b)
{
    return strcmp(((const st_entry *)a)->t.name, ((const st_entry *)b)->t.name);
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
    /* (qsort must not see the NULL list of an empty file) */
    if (count > 1)
        qsort(entries, (size_t)count, sizeof *entries, entry_by_name);
    for (int i = 1; i < count; i++)
        if (strcmp(entries[i - 1].t.name, entries[i].t.name) == 0)
            return pt_error_set("%s: tensor '%s' appears twice", path, entries[i].t.name);
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
    if (data_bytes > SIZE_MAX / 2) {
        fclose(fp);
        return pt_error_set("%s: data section too large", path);
    }
    char *header = malloc(header_len ? (size_t)header_len : 1);
    /* its own allocation, so that the floats are aligned whatever the header length */
    f->blob = malloc(data_bytes ? (size_t)data_bytes : 1);
    if (!header || !f->blob) {
        free(header);
        fclose(fp);
        st_free(f);
        return pt_error_set("%s: out of memory", path);
    }
    int ok = fread(header, 1, (size_t)header_len, fp) == header_len &&
             fread(f->blob, 1, (size_t)data_bytes, fp) == data_bytes;
    fclose(fp);
    if (!ok) {
        free(header);
        st_free(f);
        return pt_error_set("%s: read error (file changed while reading?)", path);
    }

    json_cursor c = {path, header, (size_t)header_len, 0};
    st_entry *entries = NULL;
    int count = 0;
    int rc = json_header(&c, &entries, &count);
    free(header);
    if (rc == 0)
        rc = check_layout(path, entries, count, data_bytes);
    if (rc == 0 && count > 0) {
        f->tensors = malloc((size_t)count * sizeof *f->tensors);
        if (!f->tensors)
            rc = pt_error_set("%s: out of memory", path);
    }
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
    return 0;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

void st_free(st_file *f)
{
    free(f->tensors);
    free(f->blob);
    memset(f, 0, sizeof *f);
}
