/* `pipetrain sample`: text from a trained language model. One process, the whole model as
 * one CPU stage, from a checkpoint any layout wrote (whole tensors, as `train --load` reads
 * them); each new token is drawn from the logits at the last real position of the last ≤ T
 * tokens (the positions after them zero: a causal model never looks at them). */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/rng.h"
#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"
#include "src/io/checkpoint.h"
#include "src/io/checkpoint_dir.h"
#include "src/io/data.h"
#include "src/runtime/engine_create.h"

enum { O_MODEL = 1, O_LOAD, O_PROMPT, O_TOKENS, O_TEMP, O_TOP_K, O_SEED, O_HELP };

static const opt_spec sample_opts[] = {
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.id = O_LOAD, .name = "load", .kind = OPT_TEXT, .arg = "FILE|DIR", .required = 1,
     .help = "the checkpoint (train --save, or --checkpoint-dir's newest complete one), "
             "written in any layout"},
    {.id = O_PROMPT, .name = "prompt", .kind = OPT_TEXT, .arg = "TEXT",
     .help = "what the text continues: UTF-8 for a byte model (vocab ≤ 256), else token ids "
             "separated by spaces or commas; the model sees its last T tokens (default: "
             "none)"},
    {.id = O_TOKENS, .name = "tokens", .kind = OPT_INT, .arg = "N", .min = 0, .max = 1 << 20,
     .def = "200", .help = "tokens to generate"},
    {.id = O_TEMP, .name = "temperature", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 100,
     .def = "1", .help = "softmax(logits / X); 0: always the most likely token"},
    {.id = O_TOP_K, .name = "top-k", .kind = OPT_INT, .arg = "K", .min = 0, .max = 1 << 24,
     .def = "0", .help = "draw among the K most likely tokens only (0: all)"},
    {.id = O_SEED, .name = "seed", .kind = OPT_INT, .arg = "N", .min = 0, .max = 1e15,
     .def = "0", .help = "the draws: the same seed gives the same text"},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command sample_command = {
    .name = "sample",
    .usage = "pipetrain sample --model FILE --load CHECKPOINT [--prompt TEXT] [--tokens N] "
             "[--temperature X] [--top-k K] [--seed N]",
    .about = "Writes the prompt, then N tokens a trained language model generates after it, to "
             "stdout: bytes for a byte model (vocab ≤ 256), else token ids on one line. One "
             "process on the CPU, whatever layout trained the checkpoint.",
    .notes = "Each token is drawn with the counter-based generator from (seed, its number), so "
             "a seed always gives the same text. An empty prompt starts after a newline "
             "(byte models) or token vocab−1 (GPT-2's <|endoftext|>), which is not written.",
    .opts = sample_opts,
};

typedef struct {
    const char *model, *load, *prompt;
    long tokens, top_k;
    double temperature;
    uint64_t seed;
} sample_options;

/* The model, its one stage, one window's buffers and the tokens so far. */
typedef struct {
    net_desc net;
    engine *eng;
    dataset window; /* one sample of T tokens */
    int T, V, bytes;
    int32_t *ctx;   /* the prompt (or the start token) and what was generated */
    size_t n, first_generated;
    struct cand { float logit; int id; } *cand; /* [V] */
    float *row;     /* [V]: the logits of the next token */
} sampler;

/* The draws' stream: this command's own (a sample run has no other use of the generator). */
static uint64_t stream_sample(void) { return (uint64_t)5 << 60; }

static int parse(sample_options *o, int argc, char **argv)
{
    opt_parser p;
    if (opt_parser_init(&p, &sample_command, argc, argv)) return -1;
    int id;
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_MODEL: o->model = p.arg; break;
        case O_LOAD: o->load = p.arg; break;
        case O_PROMPT: o->prompt = p.arg; break;
        case O_TOKENS: o->tokens = p.num; break;
        case O_TEMP: o->temperature = p.real; break;
        case O_TOP_K: o->top_k = p.num; break;
        case O_SEED: o->seed = (uint64_t)p.num; break;
        case O_HELP: return 1;
        }
    }
    return id == OPT_ERROR ? -1 : 0;
}

/* The checkpoint's parameters into the stage: a file, or a checkpoint directory's newest
 * complete checkpoint. */
static int load_params(sampler *s, const char *load)
{
    char path[4096];
    struct stat st;
    if (stat(load, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (ckpt_find_latest(load, NULL, NULL, path, sizeof path)) {
            /* its messages name train's --resume; here the option is --load */
            char why[1024];
            const char *e = pt_error_get();
            snprintf(why, sizeof why, "%s", strncmp(e, "--resume ", 9) ? e : e + 9);
            return pt_error_set("--load %s", why);
        }
    } else {
        snprintf(path, sizeof path, "%s", load);
    }
    float *p = malloc((s->net.stored_count + 1) * sizeof *p);
    if (!p) return pt_error_set("out of memory for %zu parameters", s->net.stored_count);
    int rc = checkpoint_load_layers(path, &s->net, 0, s->net.n_layers, p);
    if (!rc) rc = engine_write_params(s->eng, p);
    free(p);
    return rc;
}

static int open_model(sampler *s, const sample_options *o)
{
    if (net_desc_load(&s->net, o->model)) return -1;
    if (net_desc_check_trainable(&s->net, o->model)) return -1;
    if (!s->net.sequence)
        return pt_error_set("%s is not a language model (no [embedding] first): nothing to "
                            "sample", o->model);
    s->T = data_model_labels(&s->net);
    s->V = s->net.classes;
    s->bytes = s->V <= TEXT_BYTE_VOCAB;
    engine_config ec = {.net = &s->net, .first = 0, .last = s->net.n_layers, .buffers = 2,
                        .max_batch = 1, .n_slots = 1, .batch = 1, .threads = 1,
                        .max_ticks = 1};
    if (engine_create(&s->eng, ENGINE_CPU, &ec)) return -1;
    s->cand = malloc((size_t)s->V * sizeof *s->cand);
    s->row = malloc((size_t)s->V * sizeof *s->row);
    if (!s->cand || !s->row) return pt_error_set("out of memory");
    if (data_text_alloc(&s->window, 1, s->T)) return -1;
    return load_params(s, o->load);
}

/* Room for n more tokens of context. */
static int reserve(sampler *s, size_t more)
{
    int32_t *c = realloc(s->ctx, (s->n + more + 1) * sizeof *c);
    if (!c) return pt_error_set("out of memory for %zu tokens", s->n + more);
    s->ctx = c;
    return 0;
}

/* A byte model's prompt: UTF-8 (as its training text was), every byte below the vocab. */
static int prompt_bytes(sampler *s, const char *text)
{
    size_t n = strlen(text), bad;
    const char *why;
    if (text_utf8_check((const uint8_t *)text, n, &bad, &why))
        return pt_error_set("--prompt: not valid UTF-8 at byte offset %zu (byte 0x%02X): %s",
                            bad, (unsigned char)text[bad], why);
    if (reserve(s, n)) return -1;
    for (size_t i = 0; i < n; i++) {
        int b = (unsigned char)text[i];
        if (b >= s->V)
            return pt_error_set("--prompt: byte 0x%02X at offset %zu is not below the model's "
                                "vocabulary of %d", (unsigned)b, i, s->V);
        s->ctx[s->n++] = b;
    }
    return 0;
}

/* Another vocabulary's prompt: token ids, separated by spaces or commas. */
static int prompt_ids(sampler *s, const char *text)
{
    if (reserve(s, strlen(text) / 2 + 1)) return -1;
    const char *c = text;
    for (;;) {
        c += strspn(c, " \t\n,");
        if (!*c) return 0;
        char *end;
        long id = strtol(c, &end, 10);
        if (end == c || id < 0 || id >= s->V)
            return pt_error_set("--prompt: '%.20s' is not a token id below the model's "
                                "vocabulary of %d (a prompt of token ids: 15496 11 995)", c,
                                s->V);
        s->ctx[s->n++] = (int32_t)id;
        c = end;
    }
}

static int read_prompt(sampler *s, const char *text)
{
    if (s->bytes ? prompt_bytes(s, text) : prompt_ids(s, text)) return -1;
    s->first_generated = s->n;
    if (s->n == 0) { /* an implicit start: a newline, or GPT-2's <|endoftext|> */
        if (reserve(s, 1)) return -1;
        s->ctx[s->n++] = s->bytes ? ('\n' < s->V ? '\n' : 0) : s->V - 1;
    }
    return 0;
}

/* The logits after the context's last ≤ T tokens. */
static const float *next_logits(sampler *s)
{
    size_t len = s->n < (size_t)s->T ? s->n : (size_t)s->T;
    const int32_t *last = s->ctx + (s->n - len);
    for (int j = 0; j < s->T; j++) s->window.tokens[j] = (size_t)j < len ? (float)last[j] : 0.0f;
    engine_result r;
    int64_t id = 0;
    if (engine_load(s->eng, 0, &s->window, &id, 1) || engine_forward(s->eng, 0, 1, 0, 0, 0, -1))
        return NULL;
    const float *y = engine_msg_buffer(s->eng, ENGINE_MSG_ACT_OUT, 0);
    memcpy(s->row, y + (len - 1) * (size_t)s->V, (size_t)s->V * sizeof *s->row);
    if (engine_release(s->eng, 0) || engine_finish(s->eng, &r)) return NULL;
    return s->row;
}

/* Higher logit first; the lower id among equals. */
static int by_logit(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Token number k: the argmax at temperature 0, else a draw from softmax(logits / X) over
 * the top K. */
static int pick(sampler *s, const float *logits, const sample_options *o, uint64_t k)
{
    int V = s->V, best = 0;
    if (o->temperature == 0) {
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < V; i++) s->cand[i] = (struct cand){logits[i], i};
    qsort(s->cand, (size_t)V, sizeof *s->cand, by_logit);
    int K = o->top_k > 0 && o->top_k < V ? (int)o->top_k : V;
    double total = 0, top = s->cand[0].logit;
    for (int i = 0; i < K; i++) total += exp(((double)s->cand[i].logit - top) / o->temperature);
    uint32_t r[4];
    rng_philox4x32_10(r, o->seed, stream_sample(), k);
    double u = (double)(((uint64_t)r[0] << 32 | r[1]) >> 11) * 0x1p-53 * total, sum = 0;
    for (int i = 0; i < K; i++) {
        sum += exp(((double)s->cand[i].logit - top) / o->temperature);
        if (u < sum) return s->cand[i].id;
    }
    return s->cand[K - 1].id; /* u rounded up to the total */
}

static void write_token(const sampler *s, int32_t tok, int first)
{
    if (s->bytes) putchar(tok);
    else printf("%s%d", first ? "" : " ", (int)tok);
}

static int generate(sampler *s, const sample_options *o)
{
    for (size_t i = 0; i < s->first_generated; i++) write_token(s, s->ctx[i], i == 0);
    for (long k = 0; k < o->tokens; k++) {
        const float *logits = next_logits(s);
        if (!logits || reserve(s, 1)) return -1;
        int32_t tok = pick(s, logits, o, (uint64_t)k);
        s->ctx[s->n++] = tok;
        write_token(s, tok, s->first_generated == 0 && k == 0);
        if (s->bytes) fflush(stdout);
    }
    if (!s->bytes) putchar('\n');
    return fflush(stdout) ? pt_error_set("stdout: write failed") : 0;
}

static void sampler_free(sampler *s)
{
    engine_destroy(s->eng);
    data_free(&s->window);
    free(s->ctx);
    free(s->cand);
    free(s->row);
    if (s->net.layers) net_desc_free(&s->net);
}

int cmd_sample(int argc, char **argv)
{
    sample_options o = {.prompt = ""};
    int prc = parse(&o, argc, argv);
    if (prc == 1) {
        opt_print_help(&sample_command, stdout);
        return PT_EXIT_OK;
    }
    if (prc) return cli_usage_fail();
    sampler s = {0};
    int rc = PT_EXIT_OK;
    if (open_model(&s, &o) || read_prompt(&s, o.prompt)) rc = cli_input_fail();
    else if (generate(&s, &o)) rc = cli_fail(pt_error_get());
    sampler_free(&s);
    return rc;
}
