/* Command-line options (src/base/options.h): tables that drive getopt_long and print the help. */
#include "src/base/options.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"

#ifndef PT_VERSION
#define PT_VERSION "unknown"
#endif
#ifndef PT_GIT_COMMIT
#define PT_GIT_COMMIT ""
#endif

int opt_parse_long(const char *name, const char *text, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno)
        return pt_error_set("%s %s: not an integer", name, text);
    if (v < min || v > max)
        return pt_error_set("%s %s: must be between %ld and %ld", name, text, min, max);
    *out = v;
    return 0;
}

int opt_parse_double(const char *name, const char *text, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v))
        return pt_error_set("%s %s: not a number", name, text);
    if (v < min || v > max)
        /* %.12g: a bound like 1048576 in full, not %g's 1.04858e+06 */
        return pt_error_set("%s %s: must be between %.12g and %.12g", name, text, min, max);
    *out = v;
    return 0;
}

/* The options several commands share: one name, letter, meaning, range and default. */
static const opt_spec opt_shared[] = {
    {.name = "model", .letter = 'm', .kind = OPT_TEXT, .arg = "FILE", .required = 1,
     .help = "model file (INI), e.g. models/seed-cnn.cfg"},
    {.name = "stages", .letter = 'k', .kind = OPT_INT, .arg = "K", .min = 1, .max = 4096,
     .def = "1", .help = "pipeline stages, one MPI rank each (per replica)"},
    {.name = "microbatches", .letter = 'M', .kind = OPT_INT, .arg = "M", .min = 1,
     .max = 1 << 20, .def = "1", .help = "micro-batches per batch; must divide it"},
    {.name = "replicas", .letter = 'r', .kind = OPT_INT, .arg = "R", .min = 1, .max = 65536,
     .def = "1", .help = "data-parallel replicas of the pipeline (stages × replicas ranks)"},
    {.name = "tensor", .kind = OPT_INT, .arg = "T", .min = 1, .max = 4096, .def = "1",
     .help = "tensor shards: every layer with parameters split across T ranks "
             "(stages × replicas × T ranks; tensor groups on consecutive ranks)"},
    {.name = "tensor-mode", .kind = OPT_CHOICE, .choices = "megatron|gather",
     .def = "megatron", .help = "megatron: layers split by outputs then by inputs in turn, one "
                                "all-reduce per pair; gather: every layer split by outputs, "
                                "its output all-gathered (a language model, either way: "
                                "blocks by heads, the embedding, head and loss by vocabulary)"},
    {.name = "batch", .letter = 'b', .kind = OPT_INT, .arg = "N", .min = 1, .max = 1 << 20,
     .def = "128", .help = "samples per optimizer step (all replicas together)"},
    {.name = "schedule", .letter = 's', .kind = OPT_TEXT, .arg = "NAME", .def = "1f1b",
     .help = "pipeline schedule: gpipe | 1f1b | interleaved (with --virtual V) | zb-h1 | "
             "zb-h2 (zero bubble: backward split into input and weight gradients) | zb-v | "
             "v-half | v-min | dualpipev (two model chunks per rank in a V: rank k holds "
             "chunks k and 2K-1-k) | search (the order of least simulated step at the stages' "
             "profiled costs among these and greedy orders, --virtual V chunks per rank, "
             "within --schedule-memory)"},
    {.name = "schedule-file", .kind = OPT_TEXT, .arg = "FILE",
     .help = "run the schedule in FILE (as pipetrain schedule --save-schedule writes it) "
             "instead of generating one: verified, and checked against --stages, "
             "--microbatches and the chunks per rank; errors name the line"},
    {.name = "schedule-memory", .kind = OPT_REAL, .arg = "N", .min = 0, .max = 1 << 20,
     .def = "0", .help = "--schedule search: most micro-batches' activations a rank may hold "
                         "(the verifier's peak; with V chunks per rank, chunk activations / "
                         "V; 1F1B holds K on its first stage); 0: no limit"},
    {.name = "virtual", .letter = 'v', .kind = OPT_INT, .arg = "V", .min = 1, .max = 64,
     .def = "1", .help = "model chunks per rank (schedule interleaved): the layers are cut "
                         "into stages × V chunks and rank k holds chunks k, k+K, ...; "
                         "the V schedules take an even V (default 2) and zig-zag"},
    {.name = "recompute", .kind = OPT_TEXT, .arg = "WHICH", .def = "none",
     .help = "activation recomputation: none | all | stage list like 0,2: those stages keep "
             "only their input per micro-batch and re-run the forward before the backward"},
    {.name = "wgrad", .kind = OPT_CHOICE, .choices = "per-microbatch|batched",
     .def = "per-microbatch",
     .help = "the weight gradients of dense layers and of transformer blocks' and heads' "
             "products: per micro-batch, or one product over every micro-batch of the step "
             "(keeps their inputs and output gradients until then)"},
    {.name = "reduce", .kind = OPT_CHOICE,
     .choices = "allreduce|reduce-bcast|gather-bcast|ordered", .def = "allreduce",
     .help = "how a stage's replicas sum their gradients: bucketed MPI_Iallreduce; "
             "reduce to the group's first rank, which steps and broadcasts the parameters; "
             "gather there and sum in rank order, then step and broadcast; or a fixed-order "
             "reduce-scatter + all-gather, bit-identical to one process with replicas × "
             "micro-batches micro-batches (the -bcast methods reduce the whole stage after "
             "the backward pass: --bucket-mb and --overlap do not apply to them)"},
    {.name = "bucket-mb", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1e6, .def = "1",
     .help = "gradient bucket size in MiB (MiB = 2^20 bytes); buckets are cut in reverse "
             "layer order"},
    {.name = "overlap", .kind = OPT_CHOICE, .choices = "on|off", .def = "on",
     .help = "start each bucket's reduction inside the last backward pass (split by bucket) "
             "rather than after it"},
    {.name = "zero", .kind = OPT_INT, .arg = "S", .min = 0, .max = 3, .def = "0",
     .help = "ZeRO stage inside each stage's replica group (--replicas 2 or more, --reduce ordered "
             "or allreduce): 1 keeps each replica's shard of the optimizer "
             "state only, steps it and all-gathers the parameters; 2 also gives back each "
             "bucket's gradient memory outside the replica's shard once the bucket is "
             "reduce-scattered (the drop needs --overlap on and one micro-batch per "
             "replica); 3 also keeps only the replica's shard of the parameters, all-gathering "
             "each layer's before each of its passes (with --tensor too: the layer's "
             "shard-local parameters around its phases); with --device cuda 2 and 3 map and "
             "unmap the device memory per granule (2 MiB on a GPU); plan "
             "prices 1 to 3 (memory per rank, and ZeRO-3's gathers in the step) and, with "
             "--ranks, tries 1, 2, 3, then 3 without prefetch where a layout does not fit "
             "--memory-mb"},
    {.name = "zero3-prefetch", .kind = OPT_CHOICE, .choices = "on|off", .def = "on",
     .help = "with --zero 3: gather the next layer's parameters while a layer runs (two "
             "layers whole beyond the shards at a time; the gather hidden where the link "
             "progresses it alone), or each layer's when it begins (one layer whole: less "
             "memory, every gather waited for)"},
    {.name = "zero-overlap", .kind = OPT_CHOICE, .choices = "on|off", .def = "on",
     .help = "with --zero 2 and 3: reduce-scatter a bucket while the backward forms the next "
             "(two buckets whole beyond the shards at a time), or wait for it before the "
             "backward goes on (one bucket whole: less memory, each reduction waited for, as "
             "DeepSpeed's overlap_comm false)"},
    {.name = "partition", .letter = 'p', .kind = OPT_TEXT, .arg = "METHOD", .def = "time",
     .help = "how the layers are cut into stages: uniform | params | time (layer times "
             "measured on this machine) | counts like 4,3,4; params and time balance "
             "each rank's pair of chunks under the V schedules, and a search with "
             "--virtual 2 tries that cut and the chunks' one"},
    {.name = "device", .letter = 'd', .kind = OPT_CHOICE, .choices = "cpu|cuda", .def = "cpu",
     .help = "where each rank runs its stage: CPU cores, or one CUDA GPU"},
    {.name = "precision", .kind = OPT_CHOICE, .choices = "fp32|tf32|bf16", .def = "fp32",
     .help = "the dense, conv and blocks' matrix products (forward and both backward "
             "halves): fp32; tf32 (--device cuda: tensor cores, operands with a 10-bit "
             "mantissa, float32 sums); bf16: operands rounded to bfloat16, float32 sums (as "
             "torch.autocast's products; on the CPU where it has AVX512_BF16, through "
             "oneDNN). Weights, gradients, optimizer state, norms, attention, softmax, loss, "
             "pipeline messages, reductions and checkpoints stay float32; plan profiles the "
             "layers in it"},
    {.name = "topology", .letter = 't', .kind = OPT_TEXT, .arg = "FILE",
     .help = "hwloc XML file (see topologies/*.xml) instead of this machine"},
    {.name = "json", .letter = 'j', .kind = OPT_FLAG, .help = "print the results as JSON"},
    {.name = "help", .letter = 'h', .kind = OPT_FLAG, .help = "this text"},
};
#define N_SHARED (int)(sizeof opt_shared / sizeof opt_shared[0])

static const opt_spec *shared_by_name(const char *name)
{
    for (int i = 0; i < N_SHARED; i++)
        if (!strcmp(opt_shared[i].name, name)) return &opt_shared[i];
    return NULL;
}

static const opt_spec *shared_by_letter(char letter)
{
    for (int i = 0; i < N_SHARED; i++)
        if (opt_shared[i].letter == letter) return &opt_shared[i];
    return NULL;
}

static int table_error(const opt_command *cmd, const char *name, const char *why)
{
    return pt_error_set("option table of pipetrain %s: --%s %s", cmd->name, name, why);
}

/* The command's table with shared entries filled in, checked against the rule. */
static int resolve(const opt_command *cmd, opt_spec *out, int *n)
{
    *n = 0;
    for (const opt_spec *e = cmd->opts; e->name || e->section; e++) {
        if (!e->name) continue;
        if (*n == OPT_MAX) return table_error(cmd, e->name, "is one option too many");
        opt_spec s = *e;
        const opt_spec *sh = shared_by_name(e->name);
        if (e->shared) {
            if (!sh) return table_error(cmd, e->name, "is marked shared but is not");
            if (e->letter || e->kind || e->arg || e->choices || e->min || e->max || e->def ||
                e->help)
                return table_error(cmd, e->name, "is shared: only its id and required may "
                                                 "be set");
            s = *sh;
            s.id = e->id;
            s.required = sh->required || e->required;
            s.shared = 1;
        } else if (sh) {
            return table_error(cmd, e->name, "is a shared option: mark it .shared = 1");
        } else if (e->letter && shared_by_letter(e->letter)) {
            return table_error(cmd, e->name, "takes a letter that a shared option has");
        }
        if (s.id <= 0) return table_error(cmd, e->name, "needs an id > 0");
        if (s.kind < OPT_FLAG || s.kind > OPT_CHOICE) return table_error(cmd, e->name,
                                                                         "has no kind");
        if (s.kind == OPT_CHOICE && !s.choices)
            return table_error(cmd, e->name, "is a choice without choices");
        if (s.required) s.def = NULL; /* a required option has no default */
        if (s.kind != OPT_FLAG && s.kind != OPT_CHOICE && !s.arg) s.arg = "VALUE";
        for (int i = 0; i < *n; i++)
            if (!strcmp(out[i].name, s.name) || (s.letter && out[i].letter == s.letter))
                return table_error(cmd, e->name, "appears twice (or its letter does)");
        out[(*n)++] = s;
    }
    return 0;
}

int opt_parser_init(opt_parser *p, const opt_command *cmd, int argc, char **argv)
{
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    p->argc = argc;
    p->argv = argv;
    if (resolve(cmd, p->specs, &p->n)) return -1;
    char *s = p->shortopts;
    *s++ = ':'; /* a missing value returns ':' rather than '?' */
    for (int i = 0; i < p->n; i++) {
        const opt_spec *e = &p->specs[i];
        int has_arg = e->kind == OPT_FLAG ? no_argument : required_argument;
        p->longopts[i] = (struct option){.name = e->name, .has_arg = has_arg, .flag = NULL,
                                         .val = e->letter ? e->letter : 256 + i};
        if (e->letter) {
            *s++ = e->letter;
            if (has_arg == required_argument) *s++ = ':';
        }
    }
    *s = '\0';
    p->longopts[p->n] = (struct option){0};
    return 0;
}

int opt_error(const opt_parser *p, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pt_error_set("%s (see pipetrain %s --help)", msg, p->cmd->name);
}

static int index_of_val(const opt_parser *p, int val)
{
    if (val >= 256 && val < 256 + p->n) return val - 256;
    for (int i = 0; val > 0 && val < 256 && i < p->n; i++)
        if (p->specs[i].letter == val) return i;
    return -1;
}

/* Parses p->arg as option i's kind into p. */
static int take_value(opt_parser *p, int i)
{
    const opt_spec *e = &p->specs[i];
    int any = e->min == 0 && e->max == 0;
    switch (e->kind) {
    case OPT_INT:
        if (opt_parse_long(p->name, p->arg, any ? LONG_MIN : (long)e->min,
                           any ? LONG_MAX : (long)e->max, &p->num))
            return opt_error(p, "%s", pt_error_get());
        break;
    case OPT_REAL:
        if (opt_parse_double(p->name, p->arg, any ? -HUGE_VAL : e->min,
                             any ? HUGE_VAL : e->max, &p->real))
            return opt_error(p, "%s", pt_error_get());
        break;
    case OPT_CHOICE: {
        const char *c = e->choices;
        size_t len = strlen(p->arg);
        for (int k = 0; *c; k++) {
            size_t n = strcspn(c, "|");
            if (n == len && !strncmp(c, p->arg, n)) {
                p->choice = k;
                return 0;
            }
            c += n + (c[n] == '|');
        }
        char list[256] = "";
        for (c = e->choices; *c;) {
            size_t n = strcspn(c, "|");
            const char *sep = !*list ? "" : (c[n] ? ", " : " or ");
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%.*s", sep, (int)n, c);
            c += n + (c[n] == '|');
        }
        return opt_error(p, "%s %s: expected %s", p->name, p->arg, list);
    }
    default: break;
    }
    return 0;
}

/* getopt_long says '?' both for an unknown name and for a prefix of several. */
static int unknown_long(const opt_parser *p, const char *text)
{
    const char *name = text + strspn(text, "-");
    size_t len = strcspn(name, "=");
    char matches[256] = "";
    int n = 0;
    for (int i = 0; i < p->n; i++)
        if (!strncmp(p->specs[i].name, name, len)) {
            size_t used = strlen(matches);
            snprintf(matches + used, sizeof matches - used, "%s--%s", n ? ", " : "",
                     p->specs[i].name);
            n++;
        }
    if (n > 1 && len > 0)
        return opt_error(p, "option --%.*s is ambiguous: %s", (int)len, name, matches);
    return opt_error(p, "unknown option --%.*s", (int)len, name);
}

static int finish(opt_parser *p)
{
    for (int i = 0; i < p->n; i++)
        if (p->specs[i].required && !p->given[i]) {
            const opt_spec *e = &p->specs[i];
            return opt_error(p, "--%s%s%s is required", e->name, e->arg ? " " : "",
                             e->arg ? e->arg : "");
        }
    p->operands = p->argv + optind;
    p->n_operands = p->argc - optind;
    if (p->n_operands > p->cmd->operands)
        return opt_error(p, "unexpected argument %s", p->operands[p->cmd->operands]);
    if (p->n_operands < p->cmd->operands)
        return opt_error(p, "%d file%s needed, %d given", p->cmd->operands,
                         p->cmd->operands > 1 ? "s are" : " is", p->n_operands);
    return OPT_END;
}

int opt_next(opt_parser *p)
{
    p->arg = NULL;
    p->num = 0;
    p->real = 0;
    p->choice = 0;
    /* the defaults first, through the same parsing as given values */
    while (p->next_default < p->n) {
        int i = p->next_default++;
        if (!p->specs[i].def) continue;
        snprintf(p->name_buf, sizeof p->name_buf, "--%s", p->specs[i].name);
        p->name = p->name_buf;
        p->arg = p->specs[i].def;
        p->is_default = 1;
        if (take_value(p, i)) return OPT_ERROR;
        return p->specs[i].id;
    }
    p->is_default = 0;
    if (!p->started) {
        p->started = 1;
        optind = 0; /* glibc: rescan from the start, whatever was parsed before */
    }
    opterr = 0;
    int c = getopt_long(p->argc, p->argv, p->shortopts, p->longopts, NULL);
    if (c == -1) return finish(p);
    int i = index_of_val(p, c == '?' || c == ':' ? optopt : c);
    if (c == ':') {
        if (i >= 0)
            return opt_error(p, "option --%s needs a value (%s)", p->specs[i].name,
                             p->specs[i].kind == OPT_CHOICE ? p->specs[i].choices
                                                            : p->specs[i].arg);
        return opt_error(p, "option %s needs a value", p->argv[optind - 1]);
    }
    if (c == '?') {
        if (i >= 0 && p->specs[i].kind == OPT_FLAG)
            return opt_error(p, "option --%s takes no value", p->specs[i].name);
        if (optopt > 0 && optopt < 256)
            return opt_error(p, "unknown option -%c", optopt);
        return unknown_long(p, p->argv[optind - 1]);
    }
    if (i < 0) return opt_error(p, "unknown option %s", p->argv[optind - 1]);
    snprintf(p->name_buf, sizeof p->name_buf, "--%s", p->specs[i].name);
    p->name = p->name_buf;
    p->given[i] = 1;
    if (p->specs[i].kind != OPT_FLAG) {
        p->arg = optarg;
        if (take_value(p, i)) return OPT_ERROR;
    }
    return p->specs[i].id;
}

int opt_given(const opt_parser *p, int id)
{
    for (int i = 0; i < p->n; i++)
        if (p->specs[i].id == id && p->given[i]) return 1;
    return 0;
}

int opt_check_zero_choices(const opt_parser *p, int zero, int prefetch_id, int overlap_id,
                           const char *what)
{
    if (opt_given(p, prefetch_id) && (zero == 1 || zero == 2))
        return opt_error(p, "--zero3-prefetch is how --zero 3 gathers the parameters; this %s "
                         "has --zero %d", what, zero);
    if (opt_given(p, overlap_id) && zero == 1)
        return opt_error(p, "--zero-overlap is how --zero 2 and 3 reduce-scatter the "
                         "gradients; this %s has --zero 1", what);
    return 0;
}

/* ---- help ---------------------------------------------------------------------------- */

enum { HELP_WIDTH = 80, HELP_MAX_COLUMN = 30 };

/* The left column of an option: "  -m, --model FILE" or "      --data DIR". */
static void left_column(const opt_spec *e, char *buf, size_t size)
{
    int n = e->letter ? snprintf(buf, size, "  -%c, --%s", e->letter, e->name)
                      : snprintf(buf, size, "      --%s", e->name);
    if (e->kind == OPT_CHOICE)
        snprintf(buf + n, size - (size_t)n, " %s", e->choices);
    else if (e->kind != OPT_FLAG)
        snprintf(buf + n, size - (size_t)n, " %s", e->arg ? e->arg : "VALUE");
}

/* Writes text from column `at` (already reached) wrapped at HELP_WIDTH, continuation lines
 * indented to `indent`; '\n' in text starts a new line. */
static void print_wrapped(FILE *f, const char *text, int at, int indent)
{
    const char *w = text;
    int first = 1;
    while (*w) {
        if (*w == '\n') {
            fprintf(f, "\n%*s", indent, "");
            at = indent;
            first = 1;
            w++;
            continue;
        }
        if (*w == ' ') {
            w++;
            continue;
        }
        int len = (int)strcspn(w, " \n");
        if (!first && at + 1 + len > HELP_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            at = indent;
            first = 1;
        }
        if (!first) {
            fputc(' ', f);
            at++;
        }
        fprintf(f, "%.*s", len, w);
        at += len;
        first = 0;
        w += len;
    }
    fputc('\n', f);
}

void opt_print_help(const opt_command *cmd, FILE *f)
{
    opt_spec specs[OPT_MAX];
    int n;
    if (resolve(cmd, specs, &n)) { /* a broken table: say so rather than print half */
        fprintf(f, "pipetrain: %s\n", pt_error_get());
        return;
    }
    const char *u = cmd->usage;
    for (int line = 0; *u; line++) {
        size_t len = strcspn(u, "\n");
        fprintf(f, "%s%.*s\n", line ? "       " : "usage: ", (int)len, u);
        u += len + (u[len] == '\n');
    }
    if (cmd->about) {
        fputc('\n', f);
        print_wrapped(f, cmd->about, 0, 0);
    }

    int column = 0;
    char left[128];
    for (int i = 0; i < n; i++) {
        if (!specs[i].help) continue;
        left_column(&specs[i], left, sizeof left);
        int len = (int)strlen(left) + 2;
        if (len > column && len <= HELP_MAX_COLUMN) column = len;
    }
    int k = 0;
    const opt_spec *e = cmd->opts;
    if (e->name) fprintf(f, "\noptions\n");
    for (; e->name || e->section; e++) {
        if (!e->name) {
            fprintf(f, "\n%s\n", e->section);
            continue;
        }
        const opt_spec *s = &specs[k++];
        if (!s->help) continue;
        left_column(s, left, sizeof left);
        int at = fprintf(f, "%s", left);
        if (at + 2 > column) {
            fprintf(f, "\n%*s", column, "");
        } else {
            fprintf(f, "%*s", column - at, "");
        }
        char text[1024];
        if (s->required)
            snprintf(text, sizeof text, "%s (required)", s->help);
        else if (s->def)
            snprintf(text, sizeof text, "%s (default %s)", s->help, s->def);
        else
            snprintf(text, sizeof text, "%s", s->help);
        print_wrapped(f, text, column, column);
    }
    if (cmd->notes) {
        fputc('\n', f);
        print_wrapped(f, cmd->notes, 0, 0);
    }
}

const char *opt_version(void)
{
    static char text[128];
    if (*PT_GIT_COMMIT)
        snprintf(text, sizeof text, "pipetrain %s (git %s)", PT_VERSION, PT_GIT_COMMIT);
    else
        snprintf(text, sizeof text, "pipetrain %s", PT_VERSION);
    return text;
}
