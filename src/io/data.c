/* IDX data sets (MNIST, Fashion-MNIST, a user's own). zlib's gz* functions read gzip and
 * plain files alike. Files are checked strictly: a corrupt or truncated download must fail
 * loudly rather than train on garbage. */
#include "src/io/data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "src/base/error.h"
#include "src/base/io.h"

/* The magic's low byte is the number of dimensions, the one before it the value type. */
#define IDX_MAGIC_IMAGES3 0x00000803u /* unsigned bytes, N×H×W: one channel */
#define IDX_MAGIC_IMAGES4 0x00000804u /* unsigned bytes, N×C×H×W */
#define IDX_MAGIC_LABELS 0x00000801u  /* unsigned bytes, 1 dimension */
/* Far above any image data set; with count ≤ INT_MAX they keep count·C·H·W inside size_t. */
#define IDX_MAX_SIDE 32768
#define IDX_MAX_IMAGE ((size_t)1 << 30)
/* Read buffers grow as data arrives, so a header that claims terabytes in a small file
 * fails as truncated instead of allocating them. */
#define IDX_FIRST_CHUNK ((size_t)1 << 20)

typedef struct {
    const char *path;
    gzFile gz;
    char gz_problem[160]; /* zlib's complaint when the stream ended badly, else "" */
    int gz_cut;           /* the problem is a stream cut short (Z_BUF_ERROR) */
} idx_file;

static int idx_open(idx_file *f, const char *path)
{
    f->path = path;
    f->gz_problem[0] = '\0';
    /* open() ourselves so that errno reliably says why it failed */
    int fd = pt_open_regular(path);
    if (fd < 0)
        return -1;
    f->gz = gzdopen(fd, "rb");
    if (!f->gz) {
        close(fd);
        return pt_error_set("%s: cannot open: out of memory", path);
    }
    return 0;
}

static void idx_close(idx_file *f)
{
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}

/* Notes zlib's message, without the "<fd:N>: " that gzdopen streams put in front. */
static void idx_note_gz_problem(idx_file *f)
{
    int err;
    const char *msg = gzerror(f->gz, &err);
    if (err == Z_OK || err == Z_STREAM_END)
        return;
    const char *colon = strstr(msg, ": ");
    if (strncmp(msg, "<fd:", 4) == 0 && colon)
        msg = colon + 2;
    snprintf(f->gz_problem, sizeof f->gz_problem, "%s", msg);
    f->gz_cut = err == Z_BUF_ERROR;
}

/* zlib found the stream damaged (not merely cut short). */
static int idx_corrupt(const idx_file *f) { return f->gz_problem[0] && !f->gz_cut; }

/* Reads up to n bytes and returns the count read (short at the end of the data). A
 * gzip stream that is corrupt ends the data, and one cut short ends it after what zlib
 * could still decode (it may note the cut before handing that over), with f->gz_problem
 * set, so that the caller can say how much it got. */
static size_t idx_read(idx_file *f, void *buf, size_t n)
{
    size_t done = 0;
    while (done < n && !idx_corrupt(f)) {
        size_t want = n - done > (1u << 30) ? (1u << 30) : n - done;
        int got = gzread(f->gz, (char *)buf + done, (unsigned)want);
        if (got > 0)
            done += (size_t)got;
        /* zlib reports a stream cut short only through gzerror */
        idx_note_gz_problem(f);
        if (got <= 0)
            break;
    }
    return done;
}

/* Suffix for a message about missing data: zlib's reason when it had one. */
static const char *idx_why(const idx_file *f, char *buf, size_t size)
{
    if (!f->gz_problem[0])
        return "";
    snprintf(buf, size, " (gzip: %s)", f->gz_problem);
    return buf;
}

static uint32_t be32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* What a magic number that is not the one expected says the file is. */
static const char *idx_describe(uint32_t magic, char *buf, size_t size)
{
    static const struct { unsigned code; const char *name; } types[] = {
        {0x08, "unsigned bytes"}, {0x09, "signed bytes"}, {0x0B, "16-bit integers"},
        {0x0C, "32-bit integers"}, {0x0D, "floats"}, {0x0E, "doubles"}};
    for (size_t i = 0; magic >> 16 == 0 && i < sizeof types / sizeof *types; i++)
        if ((magic >> 8) == types[i].code) {
            unsigned n = magic & 0xFF;
            snprintf(buf, size, ": it is IDX of %s in %u dimension%s", types[i].name, n,
                     n == 1 ? "" : "s");
            return buf;
        }
    return ": not an IDX file";
}

/* Reads the header: a magic number in [lo, hi], whose low byte gives *ndim, then the
 * dimensions (at most 4). */
static int idx_read_header(idx_file *f, uint32_t lo, uint32_t hi, const char *kind, int *ndim,
                           uint32_t *dims)
{
    unsigned char h[20];
    size_t need = 4 + 4 * (size_t)(lo & 0xFF), got = idx_read(f, h, 4);
    char why[200];
    if (got == 4 && !idx_corrupt(f)) {
        uint32_t magic = be32(h);
        if (magic < lo || magic > hi) {
            char expect[32];
            snprintf(expect, sizeof expect, lo == hi ? "0x%08x" : "0x%08x or 0x%08x", lo, hi);
            return pt_error_set("%s: bad magic 0x%08x (expected %s for %s)%s", f->path, magic,
                                expect, kind, idx_describe(magic, why, sizeof why));
        }
        need = 4 + 4 * (size_t)(magic & 0xFF);
        got += idx_read(f, h + 4, need - 4);
    }
    if (idx_corrupt(f))
        return pt_error_set("%s: corrupt gzip data: %s", f->path, f->gz_problem);
    if (got < need)
        return pt_error_set("%s: truncated: expected a %zu-byte header, got %zu%s", f->path,
                            need, got, idx_why(f, why, sizeof why));
    *ndim = (int)(need - 4) / 4;
    for (int i = 0; i < *ndim; i++)
        dims[i] = be32(h + 4 + 4 * i);
    return 0;
}

/* Reads exactly n bytes of payload into a new buffer; with `to_end`, then checks that
 * nothing follows (a file read only in part is not checked past that part). */
static int idx_read_payload(idx_file *f, size_t n, const char *what, uint32_t count,
                            int to_end, unsigned char **out)
{
    *out = NULL;
    size_t cap = n < IDX_FIRST_CHUNK ? n : IDX_FIRST_CHUNK;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return pt_error_set("%s: out of memory", f->path);
    size_t have = 0;
    for (;;) {
        have += idx_read(f, buf + have, cap - have);
        if (have < cap || cap == n)
            break;
        size_t next = cap > n / 2 ? n : 2 * cap;
        unsigned char *grown = realloc(buf, next);
        if (!grown) {
            free(buf);
            return pt_error_set("%s: out of memory for %zu bytes", f->path, n);
        }
        buf = grown;
        cap = next;
    }
    char why[200];
    if (idx_corrupt(f)) {
        free(buf);
        return pt_error_set("%s: corrupt gzip data after %zu %s bytes: %s", f->path, have, what,
                            f->gz_problem);
    }
    if (have < n) {
        free(buf);
        return pt_error_set("%s: truncated: expected %zu %s bytes, got %zu%s", f->path, n, what,
                            have, idx_why(f, why, sizeof why));
    }
    unsigned char extra;
    if (!to_end) {
        *out = buf;
        return 0;
    }
    if (idx_read(f, &extra, 1) != 0) {
        free(buf);
        return pt_error_set("%s: trailing data after %u %ss", f->path, count, what);
    }
    if (f->gz_problem[0]) {
        free(buf);
        return pt_error_set("%s: gzip stream %s after %u %ss: %s", f->path,
                            f->gz_cut ? "cut short" : "corrupt", count, what, f->gz_problem);
    }
    *out = buf;
    return 0;
}

/* "3×28×28" */
static const char *dims_text(const uint32_t *dims, int n, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%u", i ? "×" : "", dims[i]);
    return buf;
}

/* Images: IDX3 (one channel) or IDX4, of the shape `want` when it is given. */
static int check_image_dims(const char *path, int ndim, const uint32_t *dims,
                            const layer_shape *want)
{
    /* IDX3 is N×H×W: one channel */
    const uint32_t *chw = dims + 1;
    uint32_t one[3] = {1, dims[1], dims[2]};
    if (ndim == 3) chw = one;
    char text[2][64];
    int bad = dims[0] == 0 || dims[0] > INT_MAX;
    for (int i = 0; i < 3; i++) bad |= chw[i] == 0 || chw[i] > IDX_MAX_SIDE;
    if (bad || (size_t)chw[0] * chw[1] * chw[2] > IDX_MAX_IMAGE)
        return pt_error_set("%s: bad dimensions %s (count and sides must be 1..%d and 1..%d, an "
                            "image at most %zu bytes)", path,
                            dims_text(dims, ndim, text[0], sizeof text[0]), INT_MAX,
                            IDX_MAX_SIDE, IDX_MAX_IMAGE);
    if (!want || (chw[0] == (uint32_t)want->c && chw[1] == (uint32_t)want->h &&
                  chw[2] == (uint32_t)want->w))
        return 0;
    uint32_t w[3] = {(uint32_t)want->c, (uint32_t)want->h, (uint32_t)want->w};
    return pt_error_set("%s: images are %s, the model takes %s%s", path,
                        dims_text(chw, 3, text[0], sizeof text[0]),
                        dims_text(w, 3, text[1], sizeof text[1]),
                        ndim == 3 && want->c > 1
                            ? " (IDX3 holds one channel: more need IDX4, N×C×H×W, magic "
                              "0x00000804)"
                            : "");
}

/* The samples to read of a file that holds n: all, or the first `limit` (≥ 0). */
static uint32_t samples_to_read(uint32_t n, long limit)
{
    return limit >= 0 && (unsigned long)limit < n ? (uint32_t)limit : n;
}

static int load_images(const char *path, const layer_shape *want, long limit, uint32_t *count,
                       dataset *d)
{
    idx_file f = {0};
    if (idx_open(&f, path) != 0)
        return -1;
    uint32_t dims[4];
    int ndim = 0;
    if (idx_read_header(&f, IDX_MAGIC_IMAGES3, IDX_MAGIC_IMAGES4, "images", &ndim, dims) != 0 ||
        check_image_dims(path, ndim, dims, want) != 0) {
        idx_close(&f);
        return -1;
    }
    int c = ndim == 4 ? (int)dims[1] : 1;
    int h = (int)dims[ndim - 2], w = (int)dims[ndim - 1];
    uint32_t take = samples_to_read(dims[0], limit);
    size_t n = (size_t)take * c * h * w;
    int rc = idx_read_payload(&f, n, "image", dims[0], take == dims[0], &d->pixels);
    idx_close(&f);
    if (rc != 0)
        return -1;
    *count = dims[0];
    d->channels = c;
    d->rows = h;
    d->cols = w;
    return 0;
}

static int load_labels(const char *path, int classes, long limit, uint32_t *count,
                       int32_t **labels)
{
    idx_file f = {0};
    if (idx_open(&f, path) != 0)
        return -1;
    uint32_t n = 0;
    int ndim = 0;
    if (idx_read_header(&f, IDX_MAGIC_LABELS, IDX_MAGIC_LABELS, "labels", &ndim, &n) != 0) {
        idx_close(&f);
        return -1;
    }
    if (n == 0 || n > INT_MAX) {
        idx_close(&f);
        return pt_error_set("%s: bad label count %u (must be 1..%d)", path, n, INT_MAX);
    }
    unsigned char *raw;
    uint32_t file_n = n;
    n = samples_to_read(file_n, limit);
    int rc = idx_read_payload(&f, n, "label", file_n, n == file_n, &raw);
    idx_close(&f);
    if (rc != 0)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        if (raw[i] >= classes) {
            pt_error_set("%s: label %u at index %u is out of range 0..%d", path, raw[i], i,
                         classes - 1);
            free(raw);
            return -1;
        }
    *labels = malloc((n ? n : 1) * sizeof **labels);
    if (!*labels) {
        free(raw);
        return pt_error_set("%s: out of memory", path);
    }
    for (uint32_t i = 0; i < n; i++)
        (*labels)[i] = raw[i];
    free(raw);
    *count = file_n;
    return 0;
}

int data_load_idx(dataset *d, const char *images_path, const char *labels_path,
                  const layer_shape *want, int classes, long limit)
{
    memset(d, 0, sizeof *d);
    if (classes < 1)
        return pt_error_set("%s: classes must be positive, got %d", labels_path, classes);
    uint32_t n_images = 0, n_labels = 0;
    if (load_images(images_path, want, limit, &n_images, d) != 0) {
        data_free(d);
        return -1;
    }
    if (load_labels(labels_path, classes, limit, &n_labels, &d->labels) != 0) {
        data_free(d);
        return -1;
    }
    if (n_images != n_labels) {
        data_free(d);
        return pt_error_set("%s has %u samples but %s has %u", images_path, n_images,
                            labels_path, n_labels);
    }
    d->count = (int)samples_to_read(n_images, limit);
    return 0;
}

/* DIR/NAME.gz when it exists, else DIR/NAME; an error names both when neither does. */
static int find_file(char *out, size_t size, const char *dir, const char *name)
{
    struct stat st;
    int n = snprintf(out, size, "%s/%s.gz", dir, name);
    if (n < 0 || (size_t)n >= size)
        return pt_error_set("%s: path too long", dir);
    if (stat(out, &st) == 0)
        return 0;
    snprintf(out, size, "%s/%s", dir, name);
    if (stat(out, &st) == 0)
        return 0;
    return pt_error_set("%s/%s.gz: cannot open: %s (nor without .gz)", dir, name,
                        strerror(errno));
}

int data_load_dir(dataset *d, const char *dir, const char *prefix, const layer_shape *want,
                  int classes, long limit)
{
    memset(d, 0, sizeof *d);
    char images[4096], labels[4096], name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    if (find_file(images, sizeof images, dir, name) != 0)
        return -1;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    if (find_file(labels, sizeof labels, dir, name) != 0)
        return -1;
    return data_load_idx(d, images, labels, want, classes, limit);
}

int data_split_tail(dataset *from, dataset *to, int n)
{
    memset(to, 0, sizeof *to);
    if (n <= 0 || n >= from->count)
        return pt_error_set("cannot split %d samples off a data set of %d (need 0 < n < count)",
                            n, from->count);
    size_t image = data_image_bytes(from);
    size_t keep = (size_t)(from->count - n);
    to->pixels = malloc((size_t)n * image);
    to->labels = malloc((size_t)n * sizeof *to->labels);
    if (!to->pixels || !to->labels) {
        data_free(to);
        return pt_error_set("out of memory splitting %d samples", n);
    }
    memcpy(to->pixels, from->pixels + keep * image, (size_t)n * image);
    memcpy(to->labels, from->labels + keep, (size_t)n * sizeof *to->labels);
    to->count = n;
    to->channels = from->channels;
    to->rows = from->rows;
    to->cols = from->cols;
    from->count -= n;
    /* give the moved tail back; a failed shrink leaves the larger (valid) block */
    uint8_t *p = realloc(from->pixels, keep * image);
    if (p)
        from->pixels = p;
    int32_t *l = realloc(from->labels, keep * sizeof *l);
    if (l)
        from->labels = l;
    return 0;
}

void data_free(dataset *d)
{
    free(d->pixels);
    free(d->labels);
    free(d->tokens);
    memset(d, 0, sizeof *d);
}
