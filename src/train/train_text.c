/* A language model's data in a `train` run (src/train/train_text.h). Every rank loads and
 * checks the same corpus, so that a bad file is refused on every rank before training. */
#include "src/train/train_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"

/* What the options name as the corpus, for messages. */
static const char *source_name(const train_options *o)
{
    return o->text == TEXT_FORTUNES ? "--data " TEXT_DATA_NAME : o->text_file;
}

/* The model must be a language model whose vocabulary the tokens fit. */
static int check_model(const train_run *run)
{
    const train_options *o = &run->o;
    if (!run->net.sequence)
        return pt_error_set("%s is an image model (no [embedding] first), and %s is text "
                            "for a language model: give this model images (--data DIR, "
                            "--train-images FILE)", o->model, source_name(o));
    /* --device cuda trains it; what the GPU lacks yet (--sequence-parallel) the CUDA
     * engine refuses when it is made, on every rank */
    return 0;
}

/* Byte tokens against a vocabulary below 256 (an ASCII model): the first byte that is not
 * below it is named. */
static int check_bytes(const text_tokens *t, const char *name, const train_options *o, int V)
{
    for (size_t i = 0; V < TEXT_BYTE_VOCAB && i < t->count; i++)
        if (t->tokens[i] >= V)
            return pt_error_set("%s: byte 0x%02X at offset %zu is not below the vocabulary of "
                                "%s (vocab=%d)", name, (unsigned)t->tokens[i], i, o->model, V);
    return 0;
}

static int load_corpus(train_run *run, text_tokens *t)
{
    const train_options *o = &run->o;
    int V = run->net.classes;
    if (o->text == TEXT_FORTUNES) {
        if (text_load_fortunes(t, NULL)) {
            char why[1024];
            snprintf(why, sizeof why, "%s", pt_error_get());
            return pt_error_set("--data " TEXT_DATA_NAME ": the built-in corpus is Debian's "
                                "fortunes-min (apt-get install fortunes-min): %s", why);
        }
        return check_bytes(t, TEXT_FORTUNES_DIR, o, V);
    }
    if (o->text == TEXT_UTF8)
        return text_load_utf8(t, o->text_file, 0, 0) || check_bytes(t, o->text_file, o, V);
    /* uint16 tokens: none is above 65535, whatever the model's vocabulary */
    if (!text_load_bin(t, o->text_file, V < 65536 ? V : 65536, o->text == TEXT_RAW, 0))
        return 0;
    char why[1024];
    snprintf(why, sizeof why, "%s", pt_error_get());
    if (!strstr(why, "is not below the vocabulary")) {
        if (o->text == TEXT_LLMC && strstr(why, "bad magic") && !strstr(why, "LLaMA-3"))
            return pt_error_set("%s (a nanoGPT .bin without a header: --tokens-raw)", why);
        return pt_error_set("%s", why);
    }
    return pt_error_set("%s of %s%s", why, o->model,
                        o->text == TEXT_LLMC ? "; llm.c's version 1 files hold GPT-2 tokens "
                                               "(vocabulary 50257)" : "");
}

/* The validation tail and its evenly spaced windows (none with --val-fraction 0). */
static int split_validation(train_run *run, int T)
{
    const train_options *o = &run->o;
    text_tokens *t = &run->corpus, val = {0};
    size_t n = o->val_fraction > 0 ? text_tail_count(t->count, o->val_fraction) : 0;
    if (n == 0) return 0;
    if (n < (size_t)T + 1 || n >= t->count)
        return pt_error_set("%s: the validation part, the last %g of %zu tokens, is %zu tokens: "
                            "fewer than a window of the context %d plus its next token; give "
                            "a larger --val-fraction (or 0: none)", source_name(o),
                            o->val_fraction, t->count, n, T);
    if (text_split_tail(t, &val, n)) return -1;
    run->val_tokens = val.count;
    int rc = data_text_eval(&run->val, &val, T, o->eval_windows);
    text_free(&val);
    return rc;
}

int train_text_load(train_run *run)
{
    const train_options *o = &run->o;
    int T = data_model_labels(&run->net);
    if (check_model(run) || load_corpus(run, &run->corpus)) return -1;
    run->labels_per_sample = T;
    run->corpus_tokens = run->corpus.count;
    run->corpus_digest = text_digest(&run->corpus);
    if (split_validation(run, T)) return -1;
    /* the training part: windows at more than one offset */
    if (run->corpus.count <= (size_t)T + 1)
        return pt_error_set("%s: %zu tokens%s, no longer than the model's context %d plus one: "
                            "too short to draw windows from", source_name(o), run->corpus.count,
                            run->val_tokens ? " after the validation split" : "", T);
    run->order = malloc((size_t)o->batch * sizeof *run->order);
    if (!run->order) return pt_error_set("out of memory");
    for (int i = 0; i < o->batch; i++) run->order[i] = i;
    for (int k = 0; k < 2; k++) {
        run->batch_step[k] = -1;
        if (data_text_alloc(&run->batches[k], o->batch, T)) return -1;
    }
    return 0;
}

const dataset *train_text_batch(train_run *run, long step)
{
    dataset *d = &run->batches[step & 1];
    /* the corpus's length was checked at load: the fill cannot fail */
    if (run->batch_step[step & 1] != step &&
        !data_text_batch(d, &run->corpus, run->o.seed, (uint64_t)step))
        run->batch_step[step & 1] = step;
    return d;
}

const char *train_text_measure(const train_run *run, double loss, double *value)
{
    if (run->o.text == TEXT_LLMC || run->o.text == TEXT_RAW) {
        *value = exp(loss);
        return "perplexity";
    }
    *value = loss / log(2.0);
    return "bits per byte";
}

void train_text_free(train_run *run)
{
    text_free(&run->corpus);
    for (int k = 0; k < 2; k++) data_free(&run->batches[k]);
}
