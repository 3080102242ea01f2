/* IDX data sets (MNIST, Fashion-MNIST). zlib's gz* functions read gzip and plain files
 * alike. Files are checked strictly: a corrupt or truncated download must fail loudly
 * rather than train on garbage. */
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

#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dimension */
/* Far above any image data set; keeps count·rows·cols well inside size_t. */
#define IDX_MAX_SIDE 32768
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

/* Reads up to n bytes and returns the count read (short at the end of the data). A
 * gzip stream that is cut short or corrupt also ends the data, with f->gz_problem set,
 * so that the caller can say how much it got. */
static size_t idx_read(idx_file *f, void *buf, size_t n)
{
    size_t done = 0;
    while (done < n && !f->gz_problem[0]) {
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

/* Reads the header: magic and `ndim` dimensions. */
static int idx_read_header(idx_file *f, uint32_t magic, const char *kind, int ndim,
                           uint32_t *dims)
{
    unsigned char h[16];
    size_t need = 4 + 4 * (size_t)ndim;
    size_t got = idx_read(f, h, need);
    char why[200];
    if (f->gz_problem[0] && !f->gz_cut)
        return pt_error_set("%s: corrupt gzip data: %s", f->path, f->gz_problem);
    if (got >= 4 && be32(h) != magic)
        return pt_error_set("%s: bad magic 0x%08x (expected 0x%08x for %s)", f->path, be32(h),
                            magic, kind);
    if (got < need)
        return pt_error_set("%s: truncated: expected a %zu-byte header, got %zu%s", f->path,
                            need, got, idx_why(f, why, sizeof why));
    for (int i = 0; i < ndim; i++)
        dims[i] = be32(h + 4 + 4 * i);
    return 0;
}

/* Reads exactly n bytes of payload into a new buffer, then checks nothing follows. */
static int idx_read_payload(idx_file *f, size_t n, const char *what, uint32_t count,
                            unsigned char **out)
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
    if (f->gz_problem[0] && !f->gz_cut) {
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

static int load_images(const char *path, uint32_t *count, int *rows, int *cols, uint8_t **pixels)
{
    idx_file f = {0};
    if (idx_open(&f, path) != 0)
        return -1;
    uint32_t dims[3];
    if (idx_read_header(&f, IDX_MAGIC_IMAGES, "images", 3, dims) != 0) {
        idx_close(&f);
        return -1;
    }
    if (dims[0] == 0 || dims[0] > INT_MAX || dims[1] == 0 || dims[1] > IDX_MAX_SIDE ||
        dims[2] == 0 || dims[2] > IDX_MAX_SIDE) {
        idx_close(&f);
        return pt_error_set("%s: bad dimensions %u×%u×%u (count and sides must be 1..%d and "
                            "1..%d)", path, dims[0], dims[1], dims[2], INT_MAX, IDX_MAX_SIDE);
    }
    size_t n = (size_t)dims[0] * dims[1] * dims[2];
    int rc = idx_read_payload(&f, n, "image", dims[0], pixels);
    idx_close(&f);
    if (rc != 0)
        return -1;
    *count = dims[0];
    *rows = (int)dims[1];
    *cols = (int)dims[2];
    return 0;
}

static int load_labels(const char *path, int classes, uint32_t *count, int32_t **labels)
{
    idx_file f = {0};
    if (idx_open(&f, path) != 0)
        return -1;
    uint32_t n = 0;
    if (idx_read_header(&f, IDX_MAGIC_LABELS, "labels", 1, &n) != 0) {
        idx_close(&f);
        return -1;
    }
    if (n == 0 || n > INT_MAX) {
        idx_close(&f);
        return pt_error_set("%s: bad label count %u (must be 1..%d)", path, n, INT_MAX);
    }
    unsigned char *raw;
    int rc = idx_read_payload(&f, n, "label", n, &raw);
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
    *labels = malloc((size_t)n * sizeof **labels);
    if (!*labels) {
        free(raw);
        return pt_error_set("%s: out of memory", path);
    }
    for (uint32_t i = 0; i < n; i++)
        (*labels)[i] = raw[i];
    free(raw);
    *count = n;
    return 0;
}

int data_load_idx(dataset *d, const char *images_path, const char *labels_path, int classes)
{
    memset(d, 0, sizeof *d);
    if (classes < 1)
        return pt_error_set("%s: classes must be positive, got %d", labels_path, classes);
    uint32_t n_images = 0, n_labels = 0;
    if (load_images(images_path, &n_images, &d->rows, &d->cols, &d->pixels) != 0) {
        data_free(d);
        return -1;
    }
    if (load_labels(labels_path, classes, &n_labels, &d->labels) != 0) {
        data_free(d);
        return -1;
    }
    if (n_images != n_labels) {
        data_free(d);
        return pt_error_set("%s has %u samples but %s has %u", images_path, n_images,
                            labels_path, n_labels);
    }
    d->count = (int)n_images;
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

int data_load_fashion_mnist(dataset *train, dataset *test, const char *dir, int classes)
{
    memset(train, 0, sizeof *train);
    memset(test, 0, sizeof *test);
    char images[4096], labels[4096];
    if (find_file(images, sizeof images, dir, "train-images-idx3-ubyte") != 0 ||
        find_file(labels, sizeof labels, dir, "train-labels-idx1-ubyte") != 0 ||
        data_load_idx(train, images, labels, classes) != 0)
        return -1;
    if (find_file(images, sizeof images, dir, "t10k-images-idx3-ubyte") != 0 ||
        find_file(labels, sizeof labels, dir, "t10k-labels-idx1-ubyte") != 0 ||
        data_load_idx(test, images, labels, classes) != 0) {
        data_free(train);
        return -1;
    }
    if (test->rows != train->rows || test->cols != train->cols) {
        pt_error_set("%s: test images are %d×%d but training images are %d×%d", images,
                     test->rows, test->cols, train->rows, train->cols);
        data_free(train);
        data_free(test);
        return -1;
    }
    return 0;
}

int data_split_tail(dataset *from, dataset *to, int n)
{
    memset(to, 0, sizeof *to);
    if (n <= 0 || n >= from->count)
        return pt_error_set("cannot split %d samples off a data set of %d (need 0 < n < count)",
                            n, from->count);
    size_t image = (size_t)from->rows * from->cols;
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
    memset(d, 0, sizeof *d);
}
