/* Text corpora for transformer language models: UTF-8 text as byte tokens (vocabulary
 * 256), llm.c's pre-tokenized .bin files (and nanoGPT's headerless ones when asked), the
 * Debian fortunes as a corpus that needs no download, a held-out tail, and the sampling
 * of fixed-length windows by the counter-based generator (kernels/rng.h) so that every
 * layout and rank sees the same samples. Issue 24's data half; `train` reads it through
 * src/train/train_text.c, windows as data sets (src/io/data.h, data_text_*). */
#ifndef PT_TEXT_DATA_H
#define PT_TEXT_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Byte tokens: every byte of the text is one token 0..255. */
#define TEXT_BYTE_VOCAB 256
/* What text_load_utf8 and text_load_bin read when their limit is 0: 256 MiB of text
 * (1 GiB of int32 tokens), 2^27 tokens of a .bin file. */
#define TEXT_DEFAULT_MAX_BYTES ((size_t)1 << 28)
#define TEXT_DEFAULT_MAX_TOKENS ((size_t)1 << 27)
/* llm.c's token files (dev/data/data_common.py, write_datafile): a header of 256
 * little-endian int32, [0] the magic, [1] the version (1: GPT-2, uint16 tokens), [2] the
 * token count, the rest zero; then count little-endian uint16 tokens. */
#define TEXT_LLMC_MAGIC 20240520
#define TEXT_LLMC_VERSION 1
#define TEXT_LLMC_HEADER_BYTES 1024
/* The corpus that needs no download: Debian's fortunes-min (BSD licence, 98 KB of ASCII
 * in three files of this directory). See text_load_fortunes. */
#define TEXT_FORTUNES_DIR "/usr/share/games/fortunes"

typedef struct {
    int32_t *tokens; /* owned, count tokens, each in 0..vocab−1 */
    size_t count;
    int vocab;
} text_tokens;

/* Loads a UTF-8 text file as byte tokens (vocabulary 256). Refuses a file that is empty,
 * larger than max_bytes (0: TEXT_DEFAULT_MAX_BYTES), or not valid UTF-8 ("PATH: not valid
 * UTF-8 at byte offset N: REASON"). With strip_fortune_separators, lines that are exactly
 * "%" (fortune(6)'s separators) are removed after the check, so that the corpus is the
 * fortunes' text back to back, each ending with its own newline. −1 with a message. */
int text_load_utf8(text_tokens *t, const char *path, size_t max_bytes,
                   int strip_fortune_separators);
/* Loads a token file whose tokens must be < vocab (1..65536). Without `raw`, llm.c's
 * format (above): checks the magic, the version, the count against the file's size (cut
 * short, or data after the tokens), count ≥ 1. With `raw`, nanoGPT's plain .bin (uint16
 * tokens, no header): only an even, non-zero size can be checked, so a caller asks for it
 * explicitly. Refuses more than max_tokens tokens (0: TEXT_DEFAULT_MAX_TOKENS). A token
 * ≥ vocab is named with its index. −1 with a message naming the file. */
int text_load_bin(text_tokens *t, const char *path, int vocab, int raw, size_t max_tokens);
/* The default corpus: DIR/fortunes, DIR/literature and DIR/riddles (DIR NULL:
 * TEXT_FORTUNES_DIR) as byte tokens, in that order, separators stripped. */
int text_load_fortunes(text_tokens *t, const char *dir);
/* Checks a UTF-8 buffer. Returns 0, or −1 with *bad the offset of the first byte of the
 * first ill-formed sequence and *why what is wrong with it (Unicode 15, table 3-7:
 * overlong forms, surrogates U+D800..DFFF and code points above U+10FFFF are refused). */
int text_utf8_check(const uint8_t *b, size_t n, size_t *bad, const char **why);

/* Moves the last n tokens of `from` into `to` (a validation split); 0 < n < count. */
int text_split_tail(text_tokens *from, text_tokens *to, size_t n);
/* The tokens a validation fraction (0 < fraction < 1) of `count` holds, at least 1. */
size_t text_tail_count(size_t count, double fraction);
void text_free(text_tokens *t);

/* Sampling. Sample i of step s is the window of T+1 tokens at offset
 *     o = philox(seed, rng_stream_text(s), i) mod (count − T)
 * (64 random bits: the bias is below count/2^64), so o + T < count; its inputs are tokens
 * [o, o+T) and its targets [o+1, o+T+1). The offset depends on nothing but (seed, step, i)
 * and the tokens' count: every layout, rank and order of requests sees the same samples,
 * and a run resumes its data position from the step alone (a checkpoint keeps the seed and
 * the step, and the corpus must be the same: text_digest tells). SIZE_MAX when no window
 * fits (T < 1 or count < T+1). */
size_t text_sample_offset(const text_tokens *t, int T, uint64_t seed, uint64_t step,
                          uint64_t i);
/* Fills a micro-batch: for k < n, sample ids[k] of `step` into inputs[k·T .. k·T+T) and
 * targets[k·T .. k·T+T). −1 when the corpus holds fewer than T+1 tokens or T < 1. */
int text_fill_batch(const text_tokens *t, int T, uint64_t seed, uint64_t step,
                    const uint64_t *ids, int n, int32_t *inputs, int32_t *targets);
/* A 64-bit FNV-1a digest of the count and the tokens, for a checkpoint to check that a
 * resumed run reads the same corpus. */
uint64_t text_digest(const text_tokens *t);

#endif
