/* Text corpora: UTF-8 checks and byte tokens, llm.c's token files and nanoGPT's raw ones,
 * fortune separators, the validation split, the sampling of windows, and the Debian
 * fortunes when they are installed. Every file but the last is written here. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/io/text_data.h"
#include "tests/test_tmpdir.h"

PT_TEST_TMPDIR_SUITE(text);

static const char *write_file(const char *name, const void *data, size_t n)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    return path;
}

/* An llm.c file: header (magic, version, count) then `n` tokens (little-endian uint16),
 * with `extra` bytes of zeros after them. */
static const char *write_llmc(const char *name, int32_t magic, int32_t version, int32_t count,
                              const uint16_t *toks, size_t n, size_t extra)
{
    size_t size = TEXT_LLMC_HEADER_BYTES + 2 * n + extra;
    uint8_t *b = calloc(1, size);
    int32_t h[3] = {magic, version, count};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++)
            b[4 * k + j] = (uint8_t)((uint32_t)h[k] >> (8 * j));
    for (size_t i = 0; i < n; i++) {
        b[TEXT_LLMC_HEADER_BYTES + 2 * i] = (uint8_t)toks[i];
        b[TEXT_LLMC_HEADER_BYTES + 2 * i + 1] = (uint8_t)(toks[i] >> 8);
    }
    const char *path = write_file(name, b, size);
    free(b);
    return path;
}

static void expect_utf8(const char *bytes, size_t n, int ok, size_t bad_at)
{
    size_t bad = 12345;
    const char *why = NULL;
    int rc = text_utf8_check((const uint8_t *)bytes, n, &bad, &why);
    cr_assert_eq(rc, ok ? 0 : -1, "sequence %02X.. of %zu bytes: rc %d", (uint8_t)bytes[0], n,
                 rc);
    if (!ok) {
        cr_assert_eq(bad, bad_at, "first bad byte at %zu, expected %zu (%s)", bad, bad_at, why);
        cr_assert_not_null(why);
    }
}

Test(text, utf8_accepts_well_formed)
{
    expect_utf8("plain ASCII\n", 12, 1, 0);
    expect_utf8("\xC2\x80 \xDF\xBF", 5, 1, 0);                 /* U+0080, U+07FF */
    expect_utf8("\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80", 9, 1, 0); /* U+0800, U+D7FF, U+E000 */
    expect_utf8("\xEF\xBF\xBF", 3, 1, 0);                      /* U+FFFF */
    expect_utf8("\xF0\x90\x80\x80\xF4\x8F\xBF\xBF", 8, 1, 0);  /* U+10000, U+10FFFF */
    expect_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 14, 1, 0);
    expect_utf8("a\0b", 3, 1, 0); /* NUL is a character */
}

Test(text, utf8_refuses_ill_formed)
{
    expect_utf8("ab\xC0\xAF", 4, 0, 2);          /* overlong '/' */
    expect_utf8("\xC1\xBF", 2, 0, 0);            /* overlong */
    expect_utf8("x\xE0\x80\xAF", 4, 0, 1);       /* overlong 3-byte */
    expect_utf8("\xF0\x80\x80\xAF", 4, 0, 0);    /* overlong 4-byte */
    expect_utf8("ok\xED\xA0\x80", 5, 0, 2);      /* U+D800, a surrogate */
    expect_utf8("\xED\xBF\xBF", 3, 0, 0);        /* U+DFFF */
    expect_utf8("\xF4\x90\x80\x80", 4, 0, 0);    /* U+110000 */
    expect_utf8("\xF5\x80\x80\x80", 4, 0, 0);    /* lead byte above F4 */
    expect_utf8("\xFF", 1, 0, 0);
    expect_utf8("abc\xE2\x82", 5, 0, 3);         /* cut short by the end */
    expect_utf8("\xF0\x9F\x98", 3, 0, 0);
    expect_utf8("\xE2\x82x", 3, 0, 0);           /* cut short by an ASCII byte */
    expect_utf8("a\x80", 2, 0, 1);               /* lone continuation byte */
    expect_utf8("\xC3\xA9\xBF", 3, 0, 2);        /* continuation after a whole sequence */
}

Test(text, utf8_file_round_trip)
{
    const char text[] = "Hello, w\xC3\xB6rld \xE2\x82\xAC\n";
    const char *path = write_file("hello.txt", text, sizeof text - 1);
    text_tokens t;
    cr_assert_eq(text_load_utf8(&t, path, 0, 0), 0, "%s", pt_error_get());
    cr_assert_eq(t.count, sizeof text - 1);
    cr_assert_eq(t.vocab, 256);
    for (size_t i = 0; i < t.count; i++)
        cr_assert_eq(t.tokens[i], (uint8_t)text[i], "token %zu", i);
    text_free(&t);
}

static void expect_refused_text(const char *path, size_t max, const char *phrase)
{
    text_tokens t;
    cr_assert_eq(text_load_utf8(&t, path, max, 0), -1, "%s loaded", path);
    cr_assert(t.tokens == NULL && t.count == 0, "not cleared");
    const char *msg = pt_error_get();
    cr_assert(strstr(msg, path) != NULL, "message '%s' does not name the file", msg);
    cr_assert(strstr(msg, phrase) != NULL, "message '%s' lacks '%s'", msg, phrase);
}

Test(text, utf8_file_refusals)
{
    expect_refused_text(write_file("empty.txt", "", 0), 0, "empty");
    expect_refused_text(write_file("bad.txt", "line one\nsurrogate \xED\xA0\x80", 22), 0,
                        "not valid UTF-8 at byte offset 19");
    expect_refused_text(write_file("cut.txt", "ends in \xE2\x82", 10), 0,
                        "byte offset 8 (byte 0xE2): a sequence cut short by the end");
    expect_refused_text(write_file("big.txt", "0123456789", 10), 9,
                        "10 bytes is more than the limit of 9 bytes");
    expect_refused_text(tmpdir, 0, "directory");
    expect_refused_text(tmp_path("missing.txt"), 0, "cannot open");
}

Test(text, fortune_separators_stripped)
{
    const char text[] = "One.\n%\nTwo\nlines.\n%\n100%\n%";
    const char *path = write_file("fortunes", text, sizeof text - 1);
    text_tokens t;
    cr_assert_eq(text_load_utf8(&t, path, 0, 1), 0, "%s", pt_error_get());
    const char want[] = "One.\nTwo\nlines.\n100%\n";
    cr_assert_eq(t.count, sizeof want - 1, "%zu tokens", t.count);
    for (size_t i = 0; i < t.count; i++)
        cr_assert_eq(t.tokens[i], (uint8_t)want[i], "token %zu", i);
    text_free(&t);
    /* nothing but separators */
    path = write_file("only_separators", "%\n%\n", 4);
    cr_assert_eq(text_load_utf8(&t, path, 0, 1), -1);
    cr_assert(strstr(pt_error_get(), "no text") != NULL, "%s", pt_error_get());
}

Test(text, fortunes_directory)
{
    write_file("fortunes", "A.\n%\nB.\n", 8);
    write_file("literature", "C.\n%\n", 5);
    text_tokens t;
    cr_assert_eq(text_load_fortunes(&t, tmpdir), -1, "loaded without riddles");
    cr_assert(strstr(pt_error_get(), "riddles") != NULL, "%s", pt_error_get());
    cr_assert_null(t.tokens);
    write_file("riddles", "D?\n", 3);
    cr_assert_eq(text_load_fortunes(&t, tmpdir), 0, "%s", pt_error_get());
    const char want[] = "A.\nB.\nC.\nD?\n";
    cr_assert_eq(t.count, sizeof want - 1, "%zu tokens", t.count);
    for (size_t i = 0; i < t.count; i++)
        cr_assert_eq(t.tokens[i], (uint8_t)want[i], "token %zu", i);
    text_free(&t);
}

Test(text, llmc_good_file)
{
    const uint16_t toks[] = {0, 1, 50256, 300, 65535};
    const char *path = write_llmc("good.bin", 20240520, 1, 5, toks, 5, 0);
    text_tokens t;
    cr_assert_eq(text_load_bin(&t, path, 65536, 0, 0), 0, "%s", pt_error_get());
    cr_assert_eq(t.count, 5);
    cr_assert_eq(t.vocab, 65536);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(t.tokens[i], toks[i]);
    text_free(&t);
}

static void expect_refused_bin(const char *path, int vocab, int raw, size_t max,
                               const char *phrase)
{
    text_tokens t;
    cr_assert_eq(text_load_bin(&t, path, vocab, raw, max), -1, "%s loaded", path);
    cr_assert(t.tokens == NULL && t.count == 0, "not cleared");
    const char *msg = pt_error_get();
    cr_assert(strstr(msg, path) != NULL, "message '%s' does not name the file", msg);
    cr_assert(strstr(msg, phrase) != NULL, "message '%s' lacks '%s'", msg, phrase);
}

Test(text, llmc_refusals)
{
    const uint16_t toks[] = {10, 20, 30, 50257, 7};
    expect_refused_bin(write_llmc("magic.bin", 20240521, 1, 5, toks, 5, 0), 50304, 0, 0,
                       "bad magic 20240521 (expected 20240520");
    expect_refused_bin(write_llmc("llama.bin", 20240801, 7, 5, toks, 5, 0), 50304, 0, 0,
                       "LLaMA-3");
    expect_refused_bin(write_llmc("version.bin", 20240520, 2, 5, toks, 5, 0), 50304, 0, 0,
                       "version 2 not supported");
    expect_refused_bin(write_llmc("short.bin", 20240520, 1, 6, toks, 5, 0), 50304, 0, 0,
                       "truncated: the header says 6 tokens (12 bytes), the file holds 10");
    expect_refused_bin(write_llmc("long.bin", 20240520, 1, 4, toks, 5, 0), 50304, 0, 0,
                       "trailing data: 2 bytes after the 4 tokens");
    expect_refused_bin(write_llmc("odd.bin", 20240520, 1, 5, toks, 5, 1), 50304, 0, 0,
                       "trailing data: 1 bytes");
    expect_refused_bin(write_llmc("zero.bin", 20240520, 1, 0, toks, 0, 0), 50304, 0, 0,
                       "bad token count 0");
    expect_refused_bin(write_llmc("negative.bin", 20240520, 1, -3, toks, 0, 0), 50304, 0, 0,
                       "bad token count -3");
    expect_refused_bin(write_file("header.bin", "\x28\xD4\x34\x01", 4), 50304, 0, 0,
                       "truncated: expected llm.c's 1024-byte header, got 4 bytes");
    expect_refused_bin(write_llmc("vocab.bin", 20240520, 1, 5, toks, 5, 0), 50257, 0, 0,
                       "token 50257 at index 3 is not below the vocabulary size 50257");
    expect_refused_bin(write_llmc("limit.bin", 20240520, 1, 5, toks, 5, 0), 50304, 0, 4,
                       "more than the limit");
    expect_refused_bin(write_llmc("badvocab.bin", 20240520, 1, 5, toks, 5, 0), 0, 0, 0,
                       "vocabulary size 0 out of range");
}

Test(text, raw_nanogpt_bin)
{
    const uint8_t raw[] = {1, 0, 0x39, 0x30, 0xFF, 0x00}; /* 1, 12345, 255 */
    const char *path = write_file("train.bin", raw, sizeof raw);
    text_tokens t;
    cr_assert_eq(text_load_bin(&t, path, 50257, 1, 0), 0, "%s", pt_error_get());
    cr_assert_eq(t.count, 3);
    cr_assert(t.tokens[0] == 1 && t.tokens[1] == 12345 && t.tokens[2] == 255);
    text_free(&t);
    /* the same bytes are no llm.c file: raw must be asked for */
    expect_refused_bin(path, 50257, 0, 0, "header");
    expect_refused_bin(path, 300, 1, 0, "token 12345 at index 1");
    expect_refused_bin(write_file("odd_raw.bin", raw, 5), 50257, 1, 0, "5 bytes is not");
    expect_refused_bin(write_file("empty_raw.bin", raw, 0), 50257, 1, 0, "0 bytes is not");
}

/* count tokens 0, 1, 2, ... (mod vocab) */
static void make_ramp(text_tokens *t, size_t count, int vocab)
{
    t->tokens = malloc(count * sizeof *t->tokens);
    cr_assert_not_null(t->tokens);
    for (size_t i = 0; i < count; i++)
        t->tokens[i] = (int32_t)(i % (size_t)vocab);
    t->count = count;
    t->vocab = vocab;
}

Test(text, split_tail)
{
    text_tokens train, val;
    make_ramp(&train, 1000, 65536);
    cr_assert_eq(text_tail_count(1000, 0.1), 100);
    cr_assert_eq(text_tail_count(1000, 0.0001), 1);
    cr_assert_eq(text_tail_count(1000, 0), 0);
    cr_assert_eq(text_tail_count(1000, 1), 0);
    cr_assert_eq(text_split_tail(&train, &val, 100), 0, "%s", pt_error_get());
    cr_assert_eq(train.count, 900);
    cr_assert_eq(val.count, 100);
    cr_assert_eq(val.vocab, 65536);
    cr_assert_eq(train.tokens[899], 899);
    for (size_t i = 0; i < val.count; i++)
        cr_assert_eq(val.tokens[i], (int32_t)(900 + i));
    text_tokens none;
    cr_assert_eq(text_split_tail(&train, &none, 900), -1);
    cr_assert_eq(text_split_tail(&train, &none, 0), -1);
    cr_assert_null(none.tokens);
    text_free(&train);
    text_free(&val);
}

Test(text, sampling_windows)
{
    enum { T = 16, N = 64 };
    text_tokens t;
    make_ramp(&t, 5000, 65536); /* token == position: an offset reads off the tokens */
    uint64_t ids[N], rev[N];
    for (int k = 0; k < N; k++) {
        ids[k] = (uint64_t)k;
        rev[k] = (uint64_t)(N - 1 - k);
    }
    int32_t *in = malloc(sizeof(int32_t) * N * T), *tg = malloc(sizeof(int32_t) * N * T);
    int32_t *in2 = malloc(sizeof(int32_t) * N * T), *tg2 = malloc(sizeof(int32_t) * N * T);
    cr_assert_eq(text_fill_batch(&t, T, 42, 7, ids, N, in, tg), 0, "%s", pt_error_get());
    int distinct = 0;
    for (int k = 0; k < N; k++) {
        size_t o = text_sample_offset(&t, T, 42, 7, ids[k]);
        cr_assert(o + T < t.count, "offset %zu out of range", o);
        cr_assert_eq(o, text_sample_offset(&t, T, 42, 7, ids[k]), "not deterministic");
        distinct += k > 0 && o != text_sample_offset(&t, T, 42, 7, ids[k - 1]);
        for (int j = 0; j < T; j++) {
            cr_assert_eq(in[k * T + j], (int32_t)(o + j));
            cr_assert_eq(tg[k * T + j], (int32_t)(o + j + 1), "target is not input + 1");
        }
    }
    cr_assert_gt(distinct, N / 2, "offsets hardly vary");
    /* the same samples whichever order they are asked in, one by one or all together */
    cr_assert_eq(text_fill_batch(&t, T, 42, 7, rev, N, in2, tg2), 0);
    for (int k = 0; k < N; k++) {
        cr_assert_arr_eq(in2 + (N - 1 - k) * T, in + k * T, T * sizeof *in);
        cr_assert_arr_eq(tg2 + (N - 1 - k) * T, tg + k * T, T * sizeof *tg);
    }
    for (int k = 0; k < N; k++) {
        cr_assert_eq(text_fill_batch(&t, T, 42, 7, ids + k, 1, in2, tg2), 0);
        cr_assert_arr_eq(in2, in + k * T, T * sizeof *in);
    }
    /* another step or seed draws other windows */
    cr_assert_eq(text_fill_batch(&t, T, 42, 8, ids, N, in2, tg2), 0);
    cr_assert(memcmp(in, in2, sizeof(int32_t) * N * T) != 0, "step does not matter");
    cr_assert_eq(text_fill_batch(&t, T, 43, 7, ids, N, in2, tg2), 0);
    cr_assert(memcmp(in, in2, sizeof(int32_t) * N * T) != 0, "seed does not matter");
    free(in); free(tg); free(in2); free(tg2);
    text_free(&t);
}

Test(text, sampling_edges)
{
    text_tokens t;
    make_ramp(&t, 17, 256);
    int32_t in[16 * 8], tg[16 * 8];
    uint64_t ids[8] = {0, 1, 2, 3, 1000000, 1ull << 40, ~0ull, 5};
    /* exactly T+1 tokens: the one window at offset 0 */
    cr_assert_eq(text_fill_batch(&t, 16, 1, 0, ids, 8, in, tg), 0, "%s", pt_error_get());
    for (int k = 0; k < 8; k++)
        cr_assert(in[k * 16] == 0 && tg[k * 16 + 15] == 16);
    cr_assert_eq(text_fill_batch(&t, 17, 1, 0, ids, 1, in, tg), -1);
    cr_assert(strstr(pt_error_get(), "too short") != NULL, "%s", pt_error_get());
    cr_assert_eq(text_fill_batch(&t, 0, 1, 0, ids, 1, in, tg), -1);
    cr_assert_eq(text_sample_offset(&t, 17, 1, 0, 0), SIZE_MAX);
    cr_assert_eq(text_sample_offset(&t, 0, 1, 0, 0), SIZE_MAX);
    cr_assert_eq(text_sample_offset(&t, -5, 1, 0, 0), SIZE_MAX);
    /* every window of a short corpus is reached */
    int seen[2] = {0, 0};
    for (uint64_t i = 0; i < 64; i++)
        seen[text_sample_offset(&t, 15, 9, 3, i)] = 1;
    cr_assert(seen[0] && seen[1]);
    text_free(&t);
}

Test(text, digest)
{
    text_tokens a, b;
    make_ramp(&a, 100, 256);
    make_ramp(&b, 100, 256);
    cr_assert_eq(text_digest(&a), text_digest(&b));
    b.tokens[50] = 7;
    cr_assert_neq(text_digest(&a), text_digest(&b));
    b.tokens[50] = a.tokens[50];
    b.count = 99;
    cr_assert_neq(text_digest(&a), text_digest(&b));
    text_free(&a);
    text_free(&b);
}

Test(text, debian_fortunes)
{
    if (access(TEXT_FORTUNES_DIR "/fortunes", R_OK) != 0)
        cr_skip_test("%s is not installed (Debian package fortunes-min)", TEXT_FORTUNES_DIR);
    text_tokens t, val;
    cr_assert_eq(text_load_fortunes(&t, NULL), 0, "%s", pt_error_get());
    cr_assert_gt(t.count, 50000, "only %zu tokens", t.count);
    cr_assert_eq(t.vocab, 256);
    int percent_lines = 0;
    for (size_t i = 0; i + 1 < t.count; i++) {
        cr_assert(t.tokens[i] >= 0 && t.tokens[i] < 256);
        percent_lines += (i == 0 || t.tokens[i - 1] == '\n') && t.tokens[i] == '%' &&
                         t.tokens[i + 1] == '\n';
    }
    cr_assert_eq(percent_lines, 0, "separators left in");
    cr_assert_eq(text_split_tail(&t, &val, text_tail_count(t.count, 0.1)), 0);
    int32_t in[64], tg[64];
    uint64_t id = 3;
    cr_assert_eq(text_fill_batch(&val, 64, 1, 0, &id, 1, in, tg), 0, "%s", pt_error_get());
    text_free(&t);
    text_free(&val);
}
