/* IDX reader: small files written here (gzip and plain; one channel and IDX4), the shape
 * check against a model's input, every kind of corruption, the validation split, and the
 * real Fashion-MNIST when it is installed. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "src/io/data.h"
#include "src/base/error.h"
#include "tests/test_tmpdir.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

PT_TEST_TMPDIR_SUITE(data);

static void put_be32(unsigned char *b, uint32_t v)
{
    b[0] = (unsigned char)(v >> 24);
    b[1] = (unsigned char)(v >> 16);
    b[2] = (unsigned char)(v >> 8);
    b[3] = (unsigned char)v;
}

/* Writes magic, dims, then `n` payload bytes (gzip-compressed when `gz`). */
static void write_idx(const char *path, int gz, uint32_t magic, const uint32_t *dims, int ndim,
                      const unsigned char *payload, size_t n)
{
    unsigned char buf[4096];
    put_be32(buf, magic);
    for (int i = 0; i < ndim; i++)
        put_be32(buf + 4 + 4 * i, dims[i]);
    size_t len = 4 + 4 * (size_t)ndim;
    cr_assert(len + n <= sizeof buf);
    memcpy(buf + len, payload, n);
    len += n;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, buf, (unsigned)len), (int)len);
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(buf, 1, len, f), len);
        cr_assert_eq(fclose(f), 0);
    }
}

static const unsigned char pixels3[18] = {0,  1,  2,  3,  4,  5,  10, 11,  12,
                                          13, 14, 15, 20, 21, 22, 23, 255, 25};
static const unsigned char labels3[3] = {9, 0, 4};

/* 3 images of 2×3 and their labels. */
static void write_good(const char *images, const char *labels, int gz)
{
    write_idx(images, gz, 0x803, (uint32_t[]){3, 2, 3}, 3, pixels3, sizeof pixels3);
    write_idx(labels, gz, 0x801, (uint32_t[]){3}, 1, labels3, sizeof labels3);
}

static void check_good(const dataset *d)
{
    cr_assert_eq(d->count, 3);
    cr_assert_eq(d->channels, 1);
    cr_assert_eq(d->rows, 2);
    cr_assert_eq(d->cols, 3);
    cr_assert_arr_eq(d->pixels, pixels3, sizeof pixels3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(d->labels[i], labels3[i], "label %d is %d", i, d->labels[i]);
}

/* data_load_idx for a model of input `want` (NULL: any) must fail, leave `d` empty, and
 * say `phrase`. */
static void expect_fail_for(const char *images, const char *labels, int classes,
                            const layer_shape *want, const char *phrase)
{
    dataset d;
    pt_error_clear();
    cr_assert_eq(data_load_idx(&d, images, labels, want, classes, -1), -1,
                 "accepted (expected '%s')", phrase);
    cr_assert(d.pixels == NULL && d.labels == NULL && d.count == 0, "dataset not cleared");
    cr_assert(strstr(pt_error_get(), phrase) != NULL, "message '%s' lacks '%s'", pt_error_get(),
              phrase);
}

static void expect_fail(const char *images, const char *labels, int classes, const char *phrase)
{
    expect_fail_for(images, labels, classes, NULL, phrase);
}

Test(data, read_plain_and_gzip)
{
    for (int gz = 0; gz < 2; gz++) {
        const char *img = tmp_path(gz ? "i.gz" : "i"), *lab = tmp_path(gz ? "l.gz" : "l");
        write_good(img, lab, gz);
        dataset d;
        cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, -1), 0, "%s", pt_error_get());
        check_good(&d);
        data_free(&d);
        cr_assert(d.pixels == NULL && d.labels == NULL && d.count == 0);
    }
}

Test(data, bad_magic)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l");
    write_good(img, lab, 1);
    expect_fail(lab, lab, 10,
                "bad magic 0x00000801 (expected 0x00000803 or 0x00000804 for images): it is "
                "IDX of unsigned bytes in 1 dimension");
    write_idx(lab, 1, 0x802, (uint32_t[]){3, 1}, 2, labels3, 3);
    char expect[256];
    snprintf(expect, sizeof expect, "%s: bad magic 0x00000802 (expected 0x00000801 for labels)",
             lab);
    expect_fail(img, lab, 10, expect);
}

Test(data, bad_dimensions)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l");
    write_good(img, lab, 0);
    write_idx(img, 0, 0x803, (uint32_t[]){3, 0, 3}, 3, pixels3, 18);
    expect_fail(img, lab, 10, "bad dimensions");
    write_idx(img, 0, 0x803, (uint32_t[]){0xFFFFFFFFu, 28, 28}, 3, pixels3, 18);
    expect_fail(img, lab, 10, "bad dimensions");
    write_idx(img, 0, 0x803, (uint32_t[]){3, 1u << 20, 1u << 20}, 3, pixels3, 18);
    expect_fail(img, lab, 10, "bad dimensions");
    write_idx(img, 0, 0x803, (uint32_t[]){3, 2, 3}, 3, pixels3, 18);
    write_idx(lab, 0, 0x801, (uint32_t[]){0}, 1, labels3, 0);
    expect_fail(img, lab, 10, "bad label count 0");
}

Test(data, truncated)
{
    const char *img = tmp_path("i.gz"), *lab = tmp_path("l.gz");
    write_good(img, lab, 1);
    /* header claims a million 28×28 images: fails as truncated, without allocating them */
    write_idx(img, 1, 0x803, (uint32_t[]){1000000, 28, 28}, 3, pixels3, 18);
    expect_fail(img, lab, 10, "truncated: expected 784000000 image bytes, got 18");
    write_idx(img, 0, 0x803, (uint32_t[]){3, 2, 3}, 3, pixels3, 10);
    expect_fail(img, lab, 10, "truncated: expected 18 image bytes, got 10");
    write_idx(img, 0, 0x803, (uint32_t[]){3, 2, 3}, 3, pixels3, 18);
    write_idx(lab, 1, 0x801, (uint32_t[]){4}, 1, labels3, 3);
    expect_fail(img, lab, 10, "truncated: expected 4 label bytes, got 3");
    /* a header cut short */
    FILE *f = fopen(img, "wb");
    cr_assert_not_null(f);
    fwrite("\0\0\x08\x03\0\0", 1, 6, f);
    fclose(f);
    expect_fail(img, lab, 10, "truncated: expected a 16-byte header, got 6");
}

Test(data, truncated_gzip_stream)
{
    const char *img = tmp_path("i.gz"), *lab = tmp_path("l.gz");
    /* incompressible-ish payload so that the gzip stream is long enough to cut */
    unsigned char payload[2000];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof payload; i++) {
        x = x * 1664525u + 1013904223u;
        payload[i] = (unsigned char)(x >> 24);
    }
    write_idx(img, 1, 0x803, (uint32_t[]){2, 40, 25}, 3, payload, sizeof payload);
    write_idx(lab, 1, 0x801, (uint32_t[]){2}, 1, labels3, 2);
    dataset d;
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, -1), 0, "%s", pt_error_get());
    cr_assert_arr_eq(d.pixels, payload, sizeof payload);
    data_free(&d);
    struct stat st;
    cr_assert_eq(stat(img, &st), 0);
    cr_assert_eq(truncate(img, st.st_size / 2), 0);
    expect_fail(img, lab, 10, "truncated: expected 2000 image bytes, got ");
    expect_fail(img, lab, 10, "(gzip: unexpected end of file)");
    /* a corrupt stream (damaged compressed bytes) fails as well */
    write_idx(img, 1, 0x803, (uint32_t[]){2, 40, 25}, 3, payload, sizeof payload);
    FILE *f = fopen(img, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 40, SEEK_SET), 0);
    for (int i = 0; i < 64; i++)
        fputc(0xFF, f);
    fclose(f);
    expect_fail(img, lab, 10, "corrupt gzip data");
}

Test(data, trailing_data)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l.gz");
    write_good(img, lab, 1);
    unsigned char more[19];
    memcpy(more, pixels3, 18);
    more[18] = 7;
    write_idx(img, 0, 0x803, (uint32_t[]){3, 2, 3}, 3, more, 19);
    expect_fail(img, lab, 10, "trailing data after 3 images");
    write_idx(img, 0, 0x803, (uint32_t[]){3, 2, 3}, 3, pixels3, 18);
    write_idx(lab, 1, 0x801, (uint32_t[]){3}, 1, (const unsigned char[]){1, 2, 3, 4}, 4);
    expect_fail(img, lab, 10, "trailing data after 3 labels");
}

Test(data, label_out_of_range)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l");
    write_good(img, lab, 0);
    write_idx(lab, 0, 0x801, (uint32_t[]){3}, 1, (const unsigned char[]){0, 12, 1}, 3);
    expect_fail(img, lab, 10, "label 12 at index 1 is out of range 0..9");
    /* the same file is fine with enough classes */
    dataset d;
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 13, -1), 0, "%s", pt_error_get());
    cr_assert_eq(d.labels[1], 12);
    data_free(&d);
    write_good(img, lab, 0); /* label 9 */
    expect_fail(img, lab, 9, "label 9 at index 0 is out of range 0..8");
}

Test(data, count_mismatch)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l");
    write_good(img, lab, 0);
    write_idx(lab, 0, 0x801, (uint32_t[]){2}, 1, labels3, 2);
    char expect[256];
    snprintf(expect, sizeof expect, "%s has 3 samples but %s has 2", img, lab);
    expect_fail(img, lab, 10, expect);
}

Test(data, missing_file)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l");
    write_good(img, lab, 0);
    char expect[256];
    snprintf(expect, sizeof expect, "%s: cannot open: No such file or directory",
             tmp_path("nothing"));
    expect_fail(tmp_path("nothing"), lab, 10, expect);
    expect_fail(img, tmp_path("nothing"), 10, "nothing: cannot open: No such file");
}

/* A limit reads the first samples only: a file cut short, with trailing data or with a bad
 * label after them is not read there, and so not refused; the counts still must agree. */
Test(data, first_samples_only)
{
    const char *img = tmp_path("li"), *lab = tmp_path("ll");
    write_good(img, lab, 1);
    dataset d;
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, 2), 0, "%s", pt_error_get());
    cr_assert_eq(d.count, 2);
    cr_assert_arr_eq(d.pixels, pixels3, 12);
    cr_assert_eq(d.labels[0], 9);
    cr_assert_eq(d.labels[1], 0);
    data_free(&d);
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, 0), 0, "%s", pt_error_get());
    cr_assert_eq(d.count, 0);
    cr_assert_eq(d.rows, 2);
    data_free(&d);
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, 7), 0, "%s", pt_error_get());
    check_good(&d); /* more than the file holds: all of it */
    data_free(&d);
    /* the third label out of range for 5 classes: refused when read, not before */
    write_idx(lab, 1, 0x801, (uint32_t[]){3}, 1, (const unsigned char[]){1, 2, 7}, 3);
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 5, 2), 0, "%s", pt_error_get());
    data_free(&d);
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 5, 3), -1);
    cr_assert(strstr(pt_error_get(), "label 7 at index 2"), "%s", pt_error_get());
    /* trailing data: refused only when the whole file is read */
    write_idx(img, 0, 0x803, (uint32_t[]){2, 2, 3}, 3, pixels3, sizeof pixels3);
    write_idx(lab, 0, 0x801, (uint32_t[]){2}, 1, labels3, 2);
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, 1), 0, "%s", pt_error_get());
    data_free(&d);
    expect_fail(img, lab, 10, "trailing data");
    /* counts that disagree: refused whatever is read */
    write_idx(lab, 0, 0x801, (uint32_t[]){3}, 1, labels3, 3);
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, 1), -1);
    cr_assert(strstr(pt_error_get(), "has 2 samples but"), "%s", pt_error_get());
}

Test(data, split_tail)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l");
    write_good(img, lab, 0);
    dataset d, v;
    cr_assert_eq(data_load_idx(&d, img, lab, NULL, 10, -1), 0, "%s", pt_error_get());
    cr_assert_eq(data_split_tail(&d, &v, 3), -1, "split off everything");
    cr_assert_eq(data_split_tail(&d, &v, 0), -1, "split off nothing");
    cr_assert_eq(data_split_tail(&d, &v, 1), 0, "%s", pt_error_get());
    cr_assert_eq(d.count, 2);
    cr_assert_eq(v.count, 1);
    cr_assert(v.channels == 1 && v.rows == 2 && v.cols == 3);
    cr_assert_arr_eq(d.pixels, pixels3, 12);
    cr_assert_arr_eq(v.pixels, pixels3 + 12, 6);
    cr_assert(d.labels[0] == 9 && d.labels[1] == 0 && v.labels[0] == 4);
    data_free(&v);
    data_free(&d);
}

/* 2 images of 3 channels of 2×2, N·C·H·W, as IDX4. */
static const unsigned char pixels4[24] = {0,  1,  2,  3,  10, 11, 12, 13, 20, 21, 22, 23,
                                          30, 31, 32, 33, 40, 41, 42, 43, 50, 51, 52, 53};

Test(data, idx4_channels)
{
    for (int gz = 0; gz < 2; gz++) {
        const char *img = tmp_path(gz ? "i4.gz" : "i4"), *lab = tmp_path("l");
        write_idx(img, gz, 0x804, (uint32_t[]){2, 3, 2, 2}, 4, pixels4, sizeof pixels4);
        write_idx(lab, 0, 0x801, (uint32_t[]){2}, 1, labels3, 2);
        dataset d, v;
        const layer_shape input = {3, 2, 2};
        cr_assert_eq(data_load_idx(&d, img, lab, &input, 10, -1), 0, "%s", pt_error_get());
        cr_assert(d.count == 2 && d.channels == 3 && d.rows == 2 && d.cols == 2);
        cr_assert_eq(data_image_bytes(&d), 12);
        cr_assert_arr_eq(d.pixels, pixels4, sizeof pixels4);
        /* the validation split moves whole images, channels and all */
        cr_assert_eq(data_split_tail(&d, &v, 1), 0, "%s", pt_error_get());
        cr_assert(v.channels == 3 && v.rows == 2 && v.cols == 2 && v.labels[0] == 0);
        cr_assert_arr_eq(v.pixels, pixels4 + 12, 12);
        cr_assert_arr_eq(d.pixels, pixels4, 12);
        data_free(&v);
        data_free(&d);
    }
}

Test(data, shape_must_match_the_model)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l"), *img4 = tmp_path("i4");
    write_good(img, lab, 0);
    write_idx(img4, 0, 0x804, (uint32_t[]){3, 3, 2, 1}, 4, pixels3, sizeof pixels3);
    char expect[256];
    dataset d;
    /* IDX3 is one channel: it fits a model of 1×2×3 */
    cr_assert_eq(data_load_idx(&d, img, lab, &(layer_shape){1, 2, 3}, 10, -1), 0, "%s",
                 pt_error_get());
    data_free(&d);
    snprintf(expect, sizeof expect, "%s: images are 1×2×3, the model takes 1×3×2", img);
    expect_fail_for(img, lab, 10, &(layer_shape){1, 3, 2}, expect);
    expect_fail_for(img, lab, 10, &(layer_shape){3, 2, 3},
                "images are 1×2×3, the model takes 3×2×3 (IDX3 holds one channel: more need "
                "IDX4");
    snprintf(expect, sizeof expect, "%s: images are 3×2×1, the model takes 1×2×3", img4);
    expect_fail_for(img4, lab, 10, &(layer_shape){1, 2, 3}, expect);
    expect_fail_for(img4, lab, 10, &(layer_shape){6, 1, 1},
                    "images are 3×2×1, the model takes 6×1×1");
    cr_assert_eq(data_load_idx(&d, img4, lab, &(layer_shape){3, 2, 1}, 10, -1), 0, "%s",
                 pt_error_get());
    cr_assert(d.channels == 3 && d.rows == 2 && d.cols == 1);
    data_free(&d);
}

Test(data, idx4_bad_headers)
{
    const char *img = tmp_path("i"), *lab = tmp_path("l");
    write_good(img, lab, 0);
    /* other ranks and value types */
    write_idx(img, 0, 0x802, (uint32_t[]){3, 6}, 2, pixels3, 18);
    expect_fail(img, lab, 10, "bad magic 0x00000802 (expected 0x00000803 or 0x00000804 for "
                              "images): it is IDX of unsigned bytes in 2 dimensions");
    write_idx(img, 0, 0x805, (uint32_t[]){3, 1, 1, 2, 3}, 5, pixels3, 18);
    expect_fail(img, lab, 10, "bad magic 0x00000805");
    write_idx(img, 0, 0xD04, (uint32_t[]){3, 1, 2, 3}, 4, pixels3, 18);
    expect_fail(img, lab, 10, "it is IDX of floats in 4 dimensions");
    write_idx(img, 0, 0x89504e47, (uint32_t[]){0}, 0, pixels3, 18);
    expect_fail(img, lab, 10, "bad magic 0x89504e47 (expected 0x00000803 or 0x00000804 for "
                              "images): not an IDX file");
    write_idx(img, 0, 0x803, (uint32_t[]){3, 2, 3}, 3, pixels3, 18);
    write_idx(lab, 0, 0x804, (uint32_t[]){3, 1, 1, 1}, 4, labels3, 3);
    expect_fail(img, lab, 10, "bad magic 0x00000804 (expected 0x00000801 for labels)");
    write_idx(lab, 0, 0x801, (uint32_t[]){3}, 1, labels3, 3);
    /* a header cut short: an IDX4 header is 20 bytes */
    write_idx(img, 0, 0x804, (uint32_t[]){3, 1, 2}, 3, pixels3, 0);
    expect_fail(img, lab, 10, "truncated: expected a 20-byte header, got 16");
    /* dimensions: zero channels, sides past the limit, an image past 2^30 bytes */
    write_idx(img, 0, 0x804, (uint32_t[]){3, 0, 2, 3}, 4, pixels3, 18);
    expect_fail(img, lab, 10, "bad dimensions 3×0×2×3");
    write_idx(img, 0, 0x804, (uint32_t[]){3, 40000, 2, 3}, 4, pixels3, 18);
    expect_fail(img, lab, 10, "bad dimensions 3×40000×2×3");
    write_idx(img, 0, 0x804, (uint32_t[]){3, 2048, 1024, 1024}, 4, pixels3, 18);
    expect_fail(img, lab, 10, "bad dimensions 3×2048×1024×1024");
    /* payload: truncated, trailing data, and the count check against the labels */
    write_idx(img, 1, 0x804, (uint32_t[]){3, 3, 2, 3}, 4, pixels4, 24);
    expect_fail(img, lab, 10, "truncated: expected 54 image bytes, got 24");
    write_idx(img, 0, 0x804, (uint32_t[]){1, 3, 2, 2}, 4, pixels4, 24);
    expect_fail(img, lab, 10, "trailing data after 1 images");
    write_idx(img, 0, 0x804, (uint32_t[]){2, 3, 2, 2}, 4, pixels4, 24);
    expect_fail(img, lab, 10, "has 2 samples but");
}

Test(data, fashion_mnist_layout_plain_fallback)
{
    /* plain files where the .gz are absent; a split whose images are missing fails */
    static const char *const names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    write_good(tmp_path(names[0]), tmp_path(names[1]), 0);
    dataset train, test;
    cr_assert_eq(data_load_dir(&test, tmpdir, "t10k", NULL, 10, -1), -1);
    cr_assert(strstr(pt_error_get(), "t10k-images-idx3-ubyte.gz: cannot open") != NULL, "%s",
              pt_error_get());
    cr_assert(test.pixels == NULL);
    char gzname[64];
    snprintf(gzname, sizeof gzname, "%s.gz", names[2]);
    write_good(tmp_path(gzname), tmp_path(names[3]), 1);
    cr_assert_eq(data_load_dir(&train, tmpdir, "train", NULL, 10, -1), 0, "%s", pt_error_get());
    cr_assert_eq(data_load_dir(&test, tmpdir, "t10k", NULL, 10, -1), 0, "%s", pt_error_get());
    check_good(&train);
    check_good(&test);
    data_free(&train);
    data_free(&test);
}

Test(data, fashion_mnist_real)
{
    struct stat st;
    if (stat(FASHION_DIR, &st) != 0)
        cr_skip_test("%s is not installed", FASHION_DIR);
    dataset train, test;
    const layer_shape input = {1, 28, 28};
    cr_assert_eq(data_load_dir(&train, FASHION_DIR, "train", &input, 10, -1), 0, "%s",
                 pt_error_get());
    cr_assert_eq(data_load_dir(&test, FASHION_DIR, "t10k", &input, 10, -1), 0, "%s",
                 pt_error_get());
    cr_assert_eq(train.count, 60000);
    cr_assert_eq(test.count, 10000);
    cr_assert(train.channels == 1 && train.rows == 28 && train.cols == 28 &&
              test.channels == 1 && test.rows == 28 && test.cols == 28);
    /* reference values read with Python's gzip module */
    cr_assert_eq(train.labels[0], 9);
    cr_assert_eq(train.labels[3], 3);
    cr_assert_eq(test.labels[0], 9);
    cr_assert_eq(test.labels[2], 1);
    long sum = 0;
    for (int i = 0; i < 784; i++)
        sum += train.pixels[i];
    cr_assert_eq(sum, 76247);
    sum = 0;
    for (int i = 0; i < 784; i++)
        sum += test.pixels[i];
    cr_assert_eq(sum, 33456);
    data_free(&train);
    data_free(&test);
}
