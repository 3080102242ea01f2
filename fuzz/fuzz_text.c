/* libFuzzer harness: the text corpus readers (src/io/text_data.c). The first byte picks the
 * parser (low two bits: 0 UTF-8 text, 1 UTF-8 text with fortune separators stripped,
 * 2 llm.c token file, 3 nanoGPT raw uint16), the second the vocabulary of a token file
 * (1 + byte·257: 1..65536); the rest is the file. A loaded corpus is then split and sampled. */
#include "fuzz/fuzz_input.h"
#include "src/io/text_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What a loaded corpus promises: count ≥ 1, every token below the vocabulary, and windows
 * that stay inside it. */
static void check_corpus(text_tokens *t, unsigned sel)
{
    if (t->count == 0 || t->vocab < 1) abort();
    for (size_t i = 0; i < t->count; i++)
        if (t->tokens[i] < 0 || t->tokens[i] >= t->vocab) abort();
    int T = 1 + (int)(sel % 8);
    if (t->count >= 2 * ((size_t)T + 1)) {
        text_tokens val;
        if (text_split_tail(t, &val, text_tail_count(t->count, 0.25)) != 0) abort();
        text_free(&val);
    }
    int32_t in[4 * 8], tg[4 * 8];
    uint64_t ids[4] = {0, 1, sel, ~(uint64_t)0};
    int rc = text_fill_batch(t, T, sel, sel >> 2, ids, 4, in, tg);
    if ((rc == 0) != (t->count >= (size_t)T + 1)) abort();
    for (int k = 0; rc == 0 && k < 4; k++) {
        size_t o = text_sample_offset(t, T, sel, sel >> 2, ids[k]);
        if (o + (size_t)T >= t->count || in[k * T] != t->tokens[o] ||
            tg[k * T + T - 1] != t->tokens[o + (size_t)T])
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    fuzz_file f;
    if (fuzz_file_open(&f, data + 2, size - 2)) return 0;
    unsigned mode = data[0] & 3;
    int vocab = 1 + data[1] * 257;
    text_tokens t;
    int rc = mode < 2 ? text_load_utf8(&t, f.path, 1 << 20, mode == 1)
                      : text_load_bin(&t, f.path, vocab, mode == 3, 1 << 19);
    if (rc == 0) {
        check_corpus(&t, data[0]);
        text_free(&t);
    } else if (t.tokens || t.count) {
        abort(); /* a refusal leaves nothing behind */
    }
    fuzz_file_close(&f);
    return 0;
}
