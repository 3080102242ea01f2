/* Text corpora (src/io/text_data.h). Files are read whole, up to a limit, and checked
 * strictly: a file that is not what it claims must fail loudly, naming itself, rather than
 * train a language model on garbage. */
#include "src/io/text_data.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/base/io.h"

/* Reads a whole regular file of at most `limit` bytes into a new buffer (*size bytes).
 * `what` names the limit in the message about a file too large. */
static int read_whole(const char *path, size_t limit, const char *what, uint8_t **out,
                      size_t *size)
{
    *out = NULL;
    *size = 0;
    int fd = pt_open_regular(path);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pt_error_set("%s: cannot stat: %s", path, strerror(e));
    }
    if ((unsigned long long)st.st_size > limit) {
        close(fd);
        return pt_error_set("%s: %lld bytes is more than the limit of %zu bytes (%s)", path,
                            (long long)st.st_size, limit, what);
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return pt_error_set("%s: out of memory for %zu bytes", path, n);
    }
    size_t done = 0;
    while (done < n) {
        ssize_t got = read(fd, buf + done, n - done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            return got < 0 ? pt_error_set("%s: read failed: %s", path, strerror(e))
                           : pt_error_set("%s: file shrank while being read (%zu of %zu bytes)",
                                          path, done, n);
        }
        done += (size_t)got;
    }
    /* a file that grew since fstat: refuse rather than read part of it silently */
    uint8_t extra;
    ssize_t more = read(fd, &extra, 1);
    close(fd);
    if (more != 0) {
        free(buf);
        return pt_error_set("%s: file grew while being read (past %zu bytes)", path, n);
    }
    *out = buf;
    *size = n;
    return 0;
}

/* Length of the well-formed sequence starting at b[0] (n ≥ 1 bytes available), or 0 with
 * *why set (Unicode 15, table 3-7). */
static size_t utf8_sequence(const uint8_t *b, size_t n, const char **why)
{
    uint8_t c = b[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (c >= 0x80 && c <= 0xBF) {
        *why = "a continuation byte with no lead byte";
        return 0;
    } else if (c == 0xC0 || c == 0xC1) {
        *why = "an overlong encoding (lead byte 0xC0 or 0xC1)";
        return 0;
    } else if (c <= 0xDF) {
        len = 2;
    } else if (c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *why = "a lead byte above 0xF4 (a code point above U+10FFFF or no UTF-8 at all)";
        return 0;
    }
    for (size_t k = 1; k < len; k++) {
        if (k >= n) {
            *why = "a sequence cut short by the end of the file";
            return 0;
        }
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b[k] >= l && b[k] <= h)
            continue;
        if (k == 1 && b[k] >= 0x80 && b[k] <= 0xBF)
            *why = c == 0xE0 || c == 0xF0 ? "an overlong encoding"
                   : c == 0xED            ? "a UTF-16 surrogate (U+D800..U+DFFF)"
                                          : "a code point above U+10FFFF";
        else
            *why = "a sequence cut short (a byte that is not a continuation byte)";
        return 0;
    }
    return len;
}

int text_utf8_check(const uint8_t *b, size_t n, size_t *bad, const char **why)
{
    size_t i = 0;
    while (i < n) {
        /* ASCII runs are the common case */
        if (b[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = utf8_sequence(b + i, n - i, why);
        if (len == 0) {
            *bad = i;
            return -1;
        }
        i += len;
    }
    return 0;
}

/* Removes the lines that are exactly "%" (with or without their newline); returns the
 * new length. */
static size_t strip_separators(uint8_t *b, size_t n)
{
    size_t out = 0, i = 0;
    while (i < n) {
        size_t end = i;
        while (end < n && b[end] != '\n')
            end++;
        size_t line = end < n ? end + 1 - i : end - i; /* with its newline */
        int sep = end - i == 1 && b[i] == '%';
        if (!sep) {
            memmove(b + out, b + i, line);
            out += line;
        }
        i += line;
    }
    return out;
}

static int tokens_from_bytes(text_tokens *t, const char *path, const uint8_t *b, size_t n)
{
    t->tokens = malloc(n * sizeof *t->tokens);
    if (!t->tokens)
        return pt_error_set("%s: out of memory for %zu tokens", path, n);
    for (size_t i = 0; i < n; i++)
        t->tokens[i] = b[i];
    t->count = n;
    t->vocab = TEXT_BYTE_VOCAB;
    return 0;
}

int text_load_utf8(text_tokens *t, const char *path, size_t max_bytes,
                   int strip_fortune_separators)
{
    memset(t, 0, sizeof *t);
    uint8_t *buf;
    size_t n;
    if (read_whole(path, max_bytes ? max_bytes : TEXT_DEFAULT_MAX_BYTES,
                   "the text corpus's size limit", &buf, &n) != 0)
        return -1;
    int rc = 0;
    size_t bad = 0;
    const char *why = "";
    if (n == 0)
        rc = pt_error_set("%s: empty file (a text corpus needs at least one byte)", path);
    else if (text_utf8_check(buf, n, &bad, &why) != 0)
        rc = pt_error_set("%s: not valid UTF-8 at byte offset %zu (byte 0x%02X): %s", path, bad,
                          buf[bad], why);
    if (rc == 0 && strip_fortune_separators) {
        n = strip_separators(buf, n);
        if (n == 0)
            rc = pt_error_set("%s: no text once the '%%' separator lines are removed", path);
    }
    if (rc == 0)
        rc = tokens_from_bytes(t, path, buf, n);
    free(buf);
    return rc;
}

static uint32_t le32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* llm.c's header: the count it promises, checked against the payload's size. */
static int llmc_header(const char *path, const uint8_t *b, size_t size, size_t *count)
{
    if (size < TEXT_LLMC_HEADER_BYTES)
        return pt_error_set("%s: truncated: expected llm.c's %d-byte header, got %zu bytes",
                            path, TEXT_LLMC_HEADER_BYTES, size);
    int32_t magic = (int32_t)le32(b), version = (int32_t)le32(b + 4);
    int32_t n = (int32_t)le32(b + 8);
    if (magic != TEXT_LLMC_MAGIC)
        return pt_error_set("%s: bad magic %d (expected %d, llm.c's token file)%s", path, magic,
                            TEXT_LLMC_MAGIC,
                            magic == 20240801 ? ": it is llm.c's LLaMA-3 format (uint32 "
                                                "tokens), not supported"
                                              : "");
    if (version != TEXT_LLMC_VERSION)
        return pt_error_set("%s: version %d not supported (expected %d: uint16 tokens)", path,
                            version, TEXT_LLMC_VERSION);
    if (n <= 0)
        return pt_error_set("%s: bad token count %d in the header (must be ≥ 1)", path, n);
    size_t payload = size - TEXT_LLMC_HEADER_BYTES, want = 2 * (size_t)n;
    if (payload < want)
        return pt_error_set("%s: truncated: the header says %d tokens (%zu bytes), the file "
                            "holds %zu bytes after it", path, n, want, payload);
    if (payload > want)
        return pt_error_set("%s: trailing data: %zu bytes after the %d tokens the header "
                            "says", path, payload - want, n);
    *count = (size_t)n;
    return 0;
}

int text_load_bin(text_tokens *t, const char *path, int vocab, int raw, size_t max_tokens)
{
    memset(t, 0, sizeof *t);
    if (vocab < 1 || vocab > 65536)
        return pt_error_set("%s: vocabulary size %d out of range 1..65536 (uint16 tokens)",
                            path, vocab);
    size_t max = max_tokens ? max_tokens : TEXT_DEFAULT_MAX_TOKENS;
    if (max > (size_t)1 << 40) /* keeps the byte limit below from overflowing */
        max = (size_t)1 << 40;
    size_t header = raw ? 0 : TEXT_LLMC_HEADER_BYTES;
    uint8_t *buf;
    size_t size, count = 0;
    if (read_whole(path, header + 2 * max, "the limit on tokens, 2 bytes each, after the header", &buf, &size) != 0)
        return -1;
    int rc = 0;
    if (raw && (size == 0 || size % 2))
        rc = pt_error_set("%s: %zu bytes is not a whole, non-zero number of uint16 tokens",
                          path, size);
    else if (raw)
        count = size / 2;
    else
        rc = llmc_header(path, buf, size, &count);
    if (rc == 0 && count > max)
        rc = pt_error_set("%s: %zu tokens is more than the limit of %zu", path, count, max);
    const uint8_t *p = buf + header;
    for (size_t i = 0; rc == 0 && i < count; i++) {
        unsigned tok = (unsigned)p[2 * i] | (unsigned)p[2 * i + 1] << 8;
        if (tok >= (unsigned)vocab)
            rc = pt_error_set("%s: token %u at index %zu is not below the vocabulary size %d",
                              path, tok, i, vocab);
    }
    if (rc == 0 && !(t->tokens = malloc(count * sizeof *t->tokens)))
        rc = pt_error_set("%s: out of memory for %zu tokens", path, count);
    if (rc == 0) {
        for (size_t i = 0; i < count; i++)
            t->tokens[i] = (int32_t)((unsigned)p[2 * i] | (unsigned)p[2 * i + 1] << 8);
        t->count = count;
        t->vocab = vocab;
    }
    free(buf);
    return rc;
}

int text_load_fortunes(text_tokens *t, const char *dir)
{
    static const char *const names[] = {"fortunes", "literature", "riddles"};
    memset(t, 0, sizeof *t);
    if (!dir)
        dir = TEXT_FORTUNES_DIR;
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        char path[4096];
        int len = snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        if (len < 0 || (size_t)len >= sizeof path) {
            text_free(t);
            return pt_error_set("%s: path too long", dir);
        }
        text_tokens part;
        if (text_load_utf8(&part, path, 0, 1) != 0) {
            text_free(t);
            return -1;
        }
        int32_t *all = realloc(t->tokens, (t->count + part.count) * sizeof *all);
        if (!all) {
            text_free(&part);
            text_free(t);
            return pt_error_set("%s: out of memory", path);
        }
        memcpy(all + t->count, part.tokens, part.count * sizeof *all);
        t->tokens = all;
        t->count += part.count;
        t->vocab = TEXT_BYTE_VOCAB;
        text_free(&part);
    }
    return 0;
}

int text_split_tail(text_tokens *from, text_tokens *to, size_t n)
{
    memset(to, 0, sizeof *to);
    if (n == 0 || n >= from->count)
        return pt_error_set("cannot split %zu tokens off a corpus of %zu (need 0 < n < count)",
                            n, from->count);
    size_t keep = from->count - n;
    to->tokens = malloc(n * sizeof *to->tokens);
    if (!to->tokens)
        return pt_error_set("out of memory splitting %zu tokens", n);
    memcpy(to->tokens, from->tokens + keep, n * sizeof *to->tokens);
    to->count = n;
    to->vocab = from->vocab;
    from->count = keep;
    /* give the moved tail back; a failed shrink leaves the larger (valid) block */
    int32_t *p = realloc(from->tokens, keep * sizeof *p);
    if (p)
        from->tokens = p;
    return 0;
}

size_t text_tail_count(size_t count, double fraction)
{
    if (!(fraction > 0) || !(fraction < 1))
        return 0;
    size_t n = (size_t)((double)count * fraction);
    return n ? n : 1;
}

void text_free(text_tokens *t)
{
    free(t->tokens);
    memset(t, 0, sizeof *t);
}

size_t text_sample_offset(const text_tokens *t, int T, uint64_t seed, uint64_t step,
                          uint64_t i)
{
    if (T < 1 || t->count < (size_t)T + 1)
        return SIZE_MAX; /* no window fits (text_fill_batch says so in words) */
    uint32_t r[4];
    rng_philox4x32_10(r, seed, rng_stream_text(step), i);
    uint64_t x = (uint64_t)r[0] | (uint64_t)r[1] << 32;
    /* the windows that fit: offsets 0..count−T−1 */
    uint64_t positions = (uint64_t)(t->count - (size_t)T);
    return (size_t)(x % positions);
}

int text_fill_batch(const text_tokens *t, int T, uint64_t seed, uint64_t step,
                    const uint64_t *ids, int n, int32_t *inputs, int32_t *targets)
{
    if (T < 1)
        return pt_error_set("text sampling: sequence length %d must be ≥ 1", T);
    if (t->count < (size_t)T + 1)
        return pt_error_set("text sampling: a corpus of %zu tokens is too short for windows "
                            "of %d tokens plus the target after them", t->count, T);
    for (int k = 0; k < n; k++) {
        size_t o = text_sample_offset(t, T, seed, step, ids[k]);
        memcpy(inputs + (size_t)k * T, t->tokens + o, (size_t)T * sizeof *inputs);
        memcpy(targets + (size_t)k * T, t->tokens + o + 1, (size_t)T * sizeof *targets);
    }
    return 0;
}

uint64_t text_digest(const text_tokens *t)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t words[2] = {(uint64_t)t->count, (uint64_t)t->vocab};
    for (int w = 0; w < 2; w++)
        for (int b = 0; b < 8; b++) {
            h ^= (words[w] >> (8 * b)) & 0xFF;
            h *= 0x100000001b3ull;
        }
    for (size_t i = 0; i < t->count; i++)
        for (int b = 0; b < 4; b++) {
            h ^= ((uint32_t)t->tokens[i] >> (8 * b)) & 0xFF;
            h *= 0x100000001b3ull;
        }
    return h;
}
