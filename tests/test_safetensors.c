/* safetensors: round trip, the exact bytes of a small file, files as other writers lay
 * them out, and every kind of damage the reader must refuse. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/io/safetensors.h"
#include "tests/check.h"

static char tmpdir[64];
static char path[160];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt_test_st_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    snprintf(path, sizeof path, "%s/x.safetensors", tmpdir);
}

static void remove_tmpdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(safetensors, .init = make_tmpdir, .fini = remove_tmpdir);

static st_tensor tensor(const char *name, int ndim, const long *shape, const float *data)
{
    st_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t.shape[d] = shape[d];
    t.data = data;
    return t;
}

/* A file made of an 8-byte length `len`, the header text and `n` data bytes. */
static void write_raw_len(uint64_t len, const char *header, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    unsigned char len8[8];
    for (int b = 0; b < 8; b++)
        len8[b] = (unsigned char)(len >> (8 * b));
    cr_assert_eq(fwrite(len8, 1, 8, f), 8u);
    cr_assert_eq(fwrite(header, 1, strlen(header), f), strlen(header));
    if (n)
        cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static void write_raw(const char *header, const void *data, size_t n)
{
    write_raw_len(strlen(header), header, data, n);
}

static const float data16[4] = {1.0f, -2.0f, 3.5f, 4.25f};

static void expect_read_fail(const char *phrase)
{
    st_file f;
    pt_error_clear();
    cr_assert_eq(st_read(&f, path), -1, "accepted a bad file (expected '%s')", phrase);
    cr_assert(f.tensors == NULL && f.blob == NULL && f.count == 0, "st_file not cleared");
    const char *msg = pt_error_get();
    cr_assert(strncmp(msg, path, strlen(path)) == 0, "message '%s' does not name the file", msg);
    cr_assert(strstr(msg, phrase) != NULL, "message '%s' lacks '%s'", msg, phrase);
}

/* The header must be refused as `phrase` with 8 bytes of data after it. */
static void expect_header_fail(const char *header, const char *phrase)
{
    write_raw(header, data16, 8);
    expect_read_fail(phrase);
}

Test(safetensors, round_trip)
{
    float w[6], b[3], s = 7.5f;
    for (int i = 0; i < 6; i++)
        w[i] = 0.25f * (float)i - 1.0f;
    for (int i = 0; i < 3; i++)
        b[i] = 100.0f + (float)i;
    st_tensor in[4] = {
        tensor("layer0.weight", 2, (long[]){2, 3}, w),
        tensor("layer0.bias", 1, (long[]){3}, b),
        tensor("scalar", 0, NULL, &s),
        tensor("empty", 2, (long[]){0, 5}, NULL),
    };
    for (int pass = 0; pass < 2; pass++) { /* the second overwrites the first */
        cr_assert_eq(st_write(path, in, 4), 0, "%s", pt_error_get());
        st_file f;
        cr_assert_eq(st_read(&f, path), 0, "%s", pt_error_get());
        cr_assert_eq(f.count, 4);
        for (int i = 0; i < 4; i++) {
            cr_assert_str_eq(f.tensors[i].name, in[i].name);
            cr_assert_eq(f.tensors[i].ndim, in[i].ndim);
            for (int d = 0; d < in[i].ndim; d++)
                cr_assert_eq(f.tensors[i].shape[d], in[i].shape[d]);
        }
        CHECK_CLOSE("weight", f.tensors[0].data, w, 6, 0.0, 0.0);
        const st_tensor *t = st_find(&f, "layer0.bias");
        cr_assert_not_null(t);
        CHECK_CLOSE("bias", t->data, b, 3, 0.0, 0.0);
        cr_assert_float_eq(st_find(&f, "scalar")->data[0], 7.5f, 0.0);
        cr_assert_null(st_find(&f, "layer1.bias"));
        st_free(&f);
        cr_assert(f.tensors == NULL && f.blob == NULL && f.count == 0);
    }
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_neq(access(tmp, F_OK), 0, "temporary file left behind");
}

Test(safetensors, exact_layout)
{
    st_tensor t = tensor("a", 2, (long[]){1, 2}, data16);
    cr_assert_eq(st_write(path, &t, 1), 0, "%s", pt_error_get());
    const char *json = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]}}";
    size_t n = strlen(json);         /* 55 */
    size_t padded = (n + 7) / 8 * 8; /* 56 */
    unsigned char want[8 + 64 + 8];
    memset(want, 0, sizeof want);
    want[0] = (unsigned char)padded; /* little-endian u64 */
    memcpy(want + 8, json, n);
    memset(want + 8 + n, ' ', padded - n);
    memcpy(want + 8 + padded, data16, 8);
    size_t total = 8 + padded + 8;

    unsigned char got[256];
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    size_t len = fread(got, 1, sizeof got, f);
    fclose(f);
    cr_assert_eq(len, total, "file has %zu bytes, expected %zu", len, total);
    cr_assert_eq((8 + padded) % 8, 0u);
    for (size_t i = 0; i < total; i++)
        cr_assert_eq(got[i], want[i], "byte %zu is 0x%02x, expected 0x%02x", i, got[i], want[i]);
}

Test(safetensors, empty_file_and_escaped_names)
{
    cr_assert_eq(st_write(path, NULL, 0), 0, "%s", pt_error_get());
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_size, 16, "\"{}\" padded to 8 bytes after the length");
    st_file f;
    cr_assert_eq(st_read(&f, path), 0, "%s", pt_error_get());
    cr_assert_eq(f.count, 0);
    st_free(&f);

    st_tensor t = tensor("we\"ird\\name\t", 1, (long[]){1}, data16);
    cr_assert_eq(st_write(path, &t, 1), 0, "%s", pt_error_get());
    cr_assert_eq(st_read(&f, path), 0, "%s", pt_error_get());
    cr_assert_str_eq(f.tensors[0].name, "we\"ird\\name\t");
    st_free(&f);
}

Test(safetensors, reads_other_writers_layouts)
{
    /* metadata, keys in another order, blanks, \u escapes, tensors listed out of data order */
    write_raw("{ \"__metadata__\" : {\"format\":\"pt\"},\n"
              "  \"b\\u00e9\": {\"data_offsets\": [8, 16], \"shape\": [2], \"dtype\": \"F32\"},\n"
              "  \"a\": {\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[0,8]} }  ",
              data16, 16);
    st_file f;
    cr_assert_eq(st_read(&f, path), 0, "%s", pt_error_get());
    cr_assert_eq(f.count, 2);
    const st_tensor *a = st_find(&f, "a"), *b = st_find(&f, "b\xc3\xa9");
    cr_assert(a && b);
    CHECK_CLOSE("a", a->data, data16, 2, 0.0, 0.0);
    CHECK_CLOSE("b", b->data, data16 + 2, 2, 0.0, 0.0);
    cr_assert(a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 1);
    st_free(&f);
    /* a header length that leaves the data unaligned in the file */
    write_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} ", data16, 8);
    cr_assert_eq(st_read(&f, path), 0, "%s", pt_error_get());
    cr_assert_eq(((uintptr_t)f.tensors[0].data) % sizeof(float), 0u);
    CHECK_CLOSE("a", f.tensors[0].data, data16, 2, 0.0, 0.0);
    st_free(&f);
}

Test(safetensors, truncated_files)
{
    write_raw_len(0, "", NULL, 0); /* a zero header length: no JSON at all */
    expect_read_fail("bad JSON header at byte 0: '[' or '{' expected near end of file");
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite("\x10\0\0", 1, 3, f);
    fclose(f);
    expect_read_fail("truncated: 3 bytes");
    /* the header length runs past the end of the file */
    write_raw_len(1000, "{}", NULL, 0);
    expect_read_fail("header length 1000 exceeds the 2 bytes");
    write_raw_len(UINT64_MAX, "{}", NULL, 0);
    expect_read_fail("exceeds");
    /* a good file cut inside its data */
    st_tensor t = tensor("a", 1, (long[]){4}, data16);
    cr_assert_eq(st_write(path, &t, 1), 0, "%s", pt_error_get());
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(truncate(path, st.st_size - 4), 0);
    expect_read_fail("out of range");
    /* ... and inside its header */
    cr_assert_eq(truncate(path, 20), 0);
    expect_read_fail("exceeds");
    expect_read_fail("truncated");
}

Test(safetensors, bad_json)
{
    /* syntax: jansson's message, where it stopped */
    expect_header_fail("", "bad JSON header at byte 0: '[' or '{' expected near end of file");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}",
                       "'}' expected near end of file");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}",
                       "bad JSON header at byte 32: unexpected token near ']'");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x",
                       "end of file expected near 'x'");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\" \"shape\":[2],\"data_offsets\":[0,8]}}",
                       "'}' expected near '\"shape\"'");
    expect_header_fail("{\"a:{}}", "premature end of input");
    expect_header_fail("{\"a\\q\":{}}", "invalid escape");
    expect_header_fail("{\"a\\ud800\":{}}", "invalid Unicode '\\uD800'");
    expect_header_fail("{\"a\tb\":{}}", "control character 0x9");
    expect_header_fail("{\"a\\u0000b\":{}}", "NUL byte in object key");
    expect_header_fail("{\"a\xff\":{}}", "unable to decode byte 0xff");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}",
                       "invalid token near '0'");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                       "\"data_offsets\":[0,8]}}",
                       "too big integer");
    /* duplicates, in a tensor and between tensors (the reference implementation's JSON
     * reader would keep the last one silently) */
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],"
                       "\"data_offsets\":[0,8]}}",
                       "duplicate object key near '\"dtype\"'");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                       "bad JSON header at byte 57: duplicate object key near '\"a\"'");
    /* well-formed JSON that is no safetensors header */
    expect_header_fail("[]", "the JSON header is not an object");
    expect_header_fail("{\"a\":[]}", "tensor 'a' is not a JSON object");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
                       "tensor 'a': shape holds the negative number -2");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}",
                       "shape holds a fraction, not an integer");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}",
                       "shape holds a non-number, not an integer");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}",
                       "shape is not an array");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,2],\"data_offsets\":[0,8]}}",
                       "shape has 5 entries, more than 4");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}",
                       "data_offsets has 3 entries, more than 2");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}}",
                       "data_offsets has 1 entries, not 2");
    expect_header_fail("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", "lacks 'dtype'");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", "lacks 'shape'");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", "lacks 'data_offsets'");
    expect_header_fail("{\"a\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}",
                       "dtype is not a string");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}",
                       "unknown key 'x' in tensor 'a'");
    expect_header_fail("{\"__metadata__\":{\"n\":1},\"a\":{}}",
                       "__metadata__ entry 'n' is not a string");
    expect_header_fail("{\"__metadata__\":[]}", "__metadata__ is not a JSON object");
    char header[300];
    char name[101];
    memset(name, 'n', 100);
    name[100] = '\0';
    snprintf(header, sizeof header,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", name);
    expect_header_fail(header, "is longer than 95 bytes");
}

Test(safetensors, bad_layout)
{
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                       "tensor 'a': data_offsets [0, 16] out of range");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
                       "shape needs 12 bytes but data_offsets span 8");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}",
                       "reversed");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                       "4 unused bytes before tensor 'a'");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                       "4 bytes of data after the last tensor");
    expect_header_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                       "overlap");
    expect_header_fail("{\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
                       "tensor 'a' has dtype F16; only F32 is supported");
    expect_header_fail("{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}",
                       "tensor 'w' has dtype BF16");
}

/* Bytes this process has read through read(2) so far (/proc/self/io "rchar"). */
static unsigned long long bytes_read_so_far(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    cr_assert_not_null(f, "no /proc/self/io");
    unsigned long long rchar = 0;
    cr_assert_eq(fscanf(f, "rchar: %llu", &rchar), 1);
    fclose(f);
    return rchar;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A file of `size` bytes, sparse past its header (length `len`, 0: the text's), is refused
 * as `phrase` at once: within 2 s (it takes milliseconds), reading no more than a few
 * kilobytes and allocating nothing large. */
static void expect_sparse_fail(uint64_t len, const char *header, uint64_t size,
                               const char *phrase)
{
    write_raw_len(len ? len : strlen(header), header, NULL, 0);
    cr_assert_eq(truncate(path, (off_t)size), 0, "cannot make a sparse file of %llu bytes",
                 (unsigned long long)size);
    struct rusage before, after;
    cr_assert_eq(getrusage(RUSAGE_SELF, &before), 0);
    unsigned long long read0 = bytes_read_so_far();
    double t0 = now_s();
    expect_read_fail(phrase);
    double took = now_s() - t0;
    unsigned long long read = bytes_read_so_far() - read0;
    cr_assert_eq(getrusage(RUSAGE_SELF, &after), 0);
    cr_assert(read < 64 * 1024, "read %llu bytes of a file refused for its header", read);
    cr_assert(took < 2.0, "took %.2f s to refuse the file", took);
    cr_assert(after.ru_maxrss - before.ru_maxrss < 64 * 1024, /* KiB */
              "peak memory grew by %ld KiB", after.ru_maxrss - before.ru_maxrss);
}

Test(safetensors, sized_before_read)
{
    const uint64_t gib4 = (uint64_t)4 << 30;
    /* a header that names nothing in front of 4 GiB (took 21 s and 4.3 GB before) */
    expect_sparse_fail(0, "{}      ", 16 + gib4, "4294967296 bytes of data after the last tensor");
    /* one small tensor, then 4 GiB more than the header names */
    const char *one = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_sparse_fail(0, one, 8 + strlen(one) + 8 + gib4,
                       "4294967296 bytes of data after the last tensor");
    /* offsets past the end of the data, and a shape as large as they are */
    expect_sparse_fail(0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1073741824],"
                       "\"data_offsets\":[0,4294967296]}}",
                       1024, "data_offsets [0, 4294967296] out of range: the data section has");
    /* a header length within a (sparse) file but larger than any header may be */
    write_raw_len((uint64_t)200 << 20, "{}", NULL, 0);
    cr_assert_eq(truncate(path, (off_t)((uint64_t)300 << 20)), 0);
    expect_read_fail("header length 209715200 is larger than 104857600");
    /* a header length past the end of a large file */
    expect_sparse_fail((uint64_t)1 << 40, "{}", 8 + gib4,
                       "header length 1099511627776 exceeds the 4294967296 bytes");
}

Test(safetensors, missing_file)
{
    char missing[200];
    snprintf(missing, sizeof missing, "%s/none.safetensors", tmpdir);
    st_file f;
    cr_assert_eq(st_read(&f, missing), -1);
    cr_assert(strstr(pt_error_get(), "none.safetensors: cannot open: No such file") != NULL,
              "%s", pt_error_get());
}

Test(safetensors, writer_rejects_bad_input)
{
    st_tensor t[2] = {tensor("a", 1, (long[]){2}, data16), tensor("a", 1, (long[]){2}, data16)};
    cr_assert_eq(st_write(path, t, 2), -1);
    cr_assert(strstr(pt_error_get(), "'a' is used twice") != NULL, "%s", pt_error_get());
    cr_assert_neq(access(path, F_OK), 0, "a file was written");

    t[1] = tensor("b", 1, (long[]){2}, data16);
    memset(t[1].name, 'x', sizeof t[1].name); /* no terminator: 96 bytes */
    cr_assert_eq(st_write(path, t, 2), -1);
    cr_assert(strstr(pt_error_get(), "longer than 95 bytes") != NULL, "%s", pt_error_get());

    t[1] = tensor("b\xff", 1, (long[]){2}, data16); /* JSON text is UTF-8 */
    cr_assert_eq(st_write(path, t, 2), -1);
    cr_assert(strstr(pt_error_get(), "tensor 1: name is not valid UTF-8") != NULL, "%s",
              pt_error_get());

    t[1] = tensor("b", 1, (long[]){-2}, data16);
    cr_assert_eq(st_write(path, t, 2), -1);
    cr_assert(strstr(pt_error_get(), "bad shape") != NULL, "%s", pt_error_get());
    t[1] = tensor("b", 1, (long[]){2}, NULL);
    cr_assert_eq(st_write(path, t, 2), -1);
    cr_assert(strstr(pt_error_get(), "no data") != NULL, "%s", pt_error_get());
    t[1] = tensor("b", 1, (long[]){2}, data16);
    t[1].ndim = 5;
    cr_assert_eq(st_write(path, t, 2), -1);
    cr_assert(strstr(pt_error_get(), "5 dimensions") != NULL, "%s", pt_error_get());

    char bad[200];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.safetensors", tmpdir);
    cr_assert_eq(st_write(bad, t, 1), -1);
    cr_assert(strstr(pt_error_get(), "cannot create") != NULL, "%s", pt_error_get());
}
