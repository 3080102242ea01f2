/* Model files: INI text parsed with libinih into a net_desc (layers, shapes, parameter
 * counts), and the Keras-style summary table.
 *
 * inih calls its handler only for key=value lines and this build has no line numbers, so
 * we feed it through our own line reader (ini_parse_stream). inih reads one line, then
 * calls the handler for it, then reads the next, so the reader always knows the current
 * line number, and it notices section headers itself: sections without keys ([flatten])
 * and two consecutive [conv] sections are then distinct layers. The reader also hands inih
 * normalised lines (no leading blanks, no comments), so inih's multi-line continuation
 * never triggers and "#" works as an inline comment like ";". */
#include "src/model/net.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "src/base/error.h"
#include "src/base/io.h"
#include "src/model/layer_table.h"

/* A model file is a few dozen lines; anything this big is not one. */
#define NET_MAX_FILE_BYTES (1 << 20)

typedef enum {
    SEC_NONE = -1, /* before the first section header */
    SEC_NET = 0,
    SEC_CONV,
    SEC_MAXPOOL,
    SEC_AVGPOOL,
    SEC_DENSE,
    SEC_DROPOUT,
    SEC_FLATTEN,
    SEC_EMBEDDING,
    SEC_BLOCK,
    SEC_LAYERNORM,
    SEC_LM_HEAD,
    SEC_COUNT
} section_kind;

static const char *const section_names[SEC_COUNT] = {
    "net", "conv", "maxpool", "avgpool", "dense", "dropout", "flatten",
    "embedding", "block", "layernorm", "lm_head",
};
static const layer_type section_layer[SEC_COUNT] = {
    LAYER_CONV, /* unused for [net] */
    LAYER_CONV, LAYER_MAXPOOL, LAYER_AVGPOOL, LAYER_DENSE, LAYER_DROPOUT, LAYER_FLATTEN,
    LAYER_EMBEDDING, LAYER_BLOCK, LAYER_LAYERNORM, LAYER_LM_HEAD,
};

typedef enum {
    KEY_INPUT = 0,
    KEY_FILTERS,
    KEY_SIZE,
    KEY_STRIDE,
    KEY_PAD,
    KEY_ACTIVATION,
    KEY_UNITS,
    KEY_P,
    KEY_VOCAB,
    KEY_CONTEXT,
    KEY_WIDTH,
    KEY_HEADS,
    KEY_HIDDEN,
    KEY_DROPOUT,
    KEY_TIED,
    KEY_COUNT
} key_id;

#define SEC_BIT(s) (1u << (s))
static const struct {
    const char *name;
    unsigned allowed;  /* sections where the key may appear */
    unsigned required; /* sections where it must */
} key_table[KEY_COUNT] = {
    [KEY_INPUT] = {"input", SEC_BIT(SEC_NET), 0},
    [KEY_FILTERS] = {"filters", SEC_BIT(SEC_CONV), SEC_BIT(SEC_CONV)},
    [KEY_SIZE] = {"size", SEC_BIT(SEC_CONV) | SEC_BIT(SEC_MAXPOOL) | SEC_BIT(SEC_AVGPOOL),
                  SEC_BIT(SEC_CONV)},
    [KEY_STRIDE] = {"stride", SEC_BIT(SEC_CONV) | SEC_BIT(SEC_MAXPOOL) | SEC_BIT(SEC_AVGPOOL), 0},
    [KEY_PAD] = {"pad", SEC_BIT(SEC_CONV), 0},
    [KEY_ACTIVATION] = {"activation", SEC_BIT(SEC_CONV) | SEC_BIT(SEC_DENSE), 0},
    [KEY_UNITS] = {"units", SEC_BIT(SEC_DENSE), SEC_BIT(SEC_DENSE)},
    [KEY_P] = {"p", SEC_BIT(SEC_DROPOUT), SEC_BIT(SEC_DROPOUT)},
    [KEY_VOCAB] = {"vocab", SEC_BIT(SEC_EMBEDDING) | SEC_BIT(SEC_LM_HEAD), SEC_BIT(SEC_EMBEDDING)},
    [KEY_CONTEXT] = {"context", SEC_BIT(SEC_EMBEDDING), SEC_BIT(SEC_EMBEDDING)},
    [KEY_WIDTH] = {"width", SEC_BIT(SEC_EMBEDDING), SEC_BIT(SEC_EMBEDDING)},
    [KEY_HEADS] = {"heads", SEC_BIT(SEC_BLOCK), SEC_BIT(SEC_BLOCK)},
    [KEY_HIDDEN] = {"hidden", SEC_BIT(SEC_BLOCK), 0},
    [KEY_DROPOUT] = {"dropout", SEC_BIT(SEC_BLOCK), 0},
    [KEY_TIED] = {"tied", SEC_BIT(SEC_LM_HEAD), 0},
};

static const char *const act_names[] = {"linear", "relu", "sigmoid", "tanh"};
#define ACT_COUNT ((int)(sizeof act_names / sizeof act_names[0]))

typedef struct {
    const char *name; /* file name for messages */
    const char *text; /* whole file, NUL-terminated */
    size_t pos;       /* reader cursor */
    int line;         /* number of the line inih is working on */
    int failed;       /* an error was recorded: the reader stops the parse */

    section_kind sec;   /* current section */
    int sec_line;       /* its header line */
    unsigned seen;      /* bit k: key k was given in this section */
    int key_line[KEY_COUNT];
    int ival[KEY_COUNT]; /* integer values; activation as kernel_act */
    float p;             /* [dropout]'s p */
    float block_p;       /* [block]'s dropout */
    layer_shape input;
    int have_net;
    int input_line;      /* where [net] gave 'input' (0: not given) */
    int sequence;        /* layer 0 is an [embedding]: the layers work on a sequence */
    int head_line;       /* an [lm_head] was given (its line): it must be the last layer */

    layer_desc *layers;
    int n_layers, cap_layers;
    size_t param_count;
} net_parser;

/* Records "FILE:LINE: reason" and makes the reader end the parse. */
__attribute__((format(printf, 3, 4))) static int parser_fail(net_parser *p, int line,
                                                              const char *fmt, ...)
{
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    p->failed = 1;
    return pt_error_set("%s:%d: %s", p->name, line, reason);
}

const char *layer_type_name(layer_type t)
{
    return (int)t >= 0 && t < LAYER_TYPE_COUNT ? layer_kinds[t].name : "?";
}

const char *layer_act_name(kernel_act a)
{
    return (int)a >= 0 && (int)a < ACT_COUNT ? act_names[a] : "?";
}

/* ---- values ---- */

/* Strict decimal integer ≥ min (0 or 1): no sign other than a telling "-", no junk. */
static int parse_int(net_parser *p, const char *key, const char *v, int min, int *out)
{
    const char *s = v;
    if (*s == '\0')
        return parser_fail(p, p->line, "missing value for '%s'", key);
    if (*s == '-')
        s++;
    if (*s < '0' || *s > '9')
        return parser_fail(p, p->line, "bad value '%s' for '%s': not an integer", v, key);
    const char *d = s;
    while (*d >= '0' && *d <= '9')
        d++;
    if (*d != '\0')
        return parser_fail(p, p->line, "bad value '%s' for '%s': trailing characters after the integer",
                           v, key);
    errno = 0;
    long long x = strtoll(v, NULL, 10);
    if (errno == ERANGE || x > INT_MAX || x < INT_MIN)
        return parser_fail(p, p->line, "bad value '%s' for '%s': integer overflow", v, key);
    if (x < min)
        return parser_fail(p, p->line, "bad value '%s' for '%s': must be %s", v, key,
                           min > 0 ? "positive" : "non-negative");
    *out = (int)x;
    return 0;
}

/* "C,H,W": three positive integers, blanks allowed around the commas. */
static int parse_input(net_parser *p, const char *v, layer_shape *out)
{
    int dims[3];
    const char *s = v;
    for (int i = 0; i < 3; i++) {
        char part[64];
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        if ((i < 2 && !end) || (i == 2 && end))
            return parser_fail(p, p->line, "bad value '%s' for 'input': expected C,H,W", v);
        if (n >= sizeof part)
            return parser_fail(p, p->line, "bad value '%s' for 'input': component too long", v);
        memcpy(part, s, n);
        part[n] = '\0';
        char *a = part, *b = part + n;
        while (*a == ' ' || *a == '\t')
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            *--b = '\0';
        if (parse_int(p, "input", a, 1, &dims[i]) != 0)
            return -1;
        s = end ? end + 1 : s + n;
    }
    if ((long long)dims[0] * dims[1] * dims[2] > INT_MAX)
        return parser_fail(p, p->line, "input %d,%d,%d has too many elements", dims[0], dims[1],
                           dims[2]);
    *out = (layer_shape){dims[0], dims[1], dims[2]};
    return 0;
}

static int parse_value(net_parser *p, key_id k, const char *v)
{
    const char *key = key_table[k].name;
    switch (k) {
    case KEY_INPUT: p->input_line = p->line; return parse_input(p, v, &p->input);
    case KEY_TIED:
        if (parse_int(p, key, v, 0, &p->ival[k])) return -1;
        if (p->ival[k] > 1)
            return parser_fail(p, p->line, "bad value '%s' for 'tied': must be 0 or 1", v);
        return 0;
    case KEY_PAD: return parse_int(p, key, v, 0, &p->ival[k]);
    case KEY_FILTERS:
    case KEY_SIZE:
    case KEY_STRIDE:
    case KEY_UNITS:
    case KEY_VOCAB:
    case KEY_CONTEXT:
    case KEY_WIDTH:
    case KEY_HEADS:
    case KEY_HIDDEN: return parse_int(p, key, v, 1, &p->ival[k]);
    case KEY_ACTIVATION:
        for (int a = 0; a < ACT_COUNT; a++)
            if (strcmp(v, act_names[a]) == 0) {
                p->ival[k] = a;
                return 0;
            }
        return parser_fail(p, p->line,
                           "unknown activation '%s' (expected linear, relu, sigmoid or tanh)", v);
    case KEY_P:
    case KEY_DROPOUT: {
        char *end = NULL;
        errno = 0;
        double x = strtod(v, &end);
        if (!*v || end == v || *end != '\0' || errno == ERANGE)
            return parser_fail(p, p->line, "bad value '%s' for '%s': not a number", v, key);
        /* checked as the float we keep: 0.99999999999 would round to 1 */
        if (!(x >= 0.0 && (float)x < 1.0f))
            return parser_fail(p, p->line, "bad value '%s' for '%s': must satisfy 0 <= %s < 1",
                               v, key, key);
        *(k == KEY_P ? &p->p : &p->block_p) = (float)x;
        return 0;
    }
    case KEY_COUNT: break;
    }
    return parser_fail(p, p->line, "internal error: key %d", (int)k);
}

/* ---- layers ---- */

/* Line to blame for a shape problem: the key that set the size, else the header. */
static int blame_line(const net_parser *p, key_id k)
{
    return (p->seen & (1u << k)) ? p->key_line[k] : p->sec_line;
}

/* Where section s may stand: a language model is [embedding] first (token ids in, so no
 * 'input' in [net]), then [block]s, [layernorm]s and [dropout]s on the sequence, and an
 * [lm_head] last; the image/vector layers do not mix with it. */
static int check_order(net_parser *p, section_kind s)
{
    const char *name = section_names[s];
    int seq = layer_kind_of(section_layer[s])->sequence;
    if (p->head_line)
        return parser_fail(p, p->sec_line, "[%s] after the [lm_head] (line %d): the [lm_head] "
                           "must be the last layer", name, p->head_line);
    if (s == SEC_EMBEDDING) {
        if (p->n_layers > 0)
            return parser_fail(p, p->sec_line, "[embedding] must be the first layer (it takes "
                               "the token ids)");
        if (p->input_line)
            return parser_fail(p, p->input_line, "'input' in [net] of a language model: its "
                               "input is the [embedding]'s context of token ids");
        return 0;
    }
    if (seq == 1 && !p->sequence)
        return parser_fail(p, p->sec_line, "[%s] before an [embedding]: it works on a sequence "
                           "of token vectors, which only an [embedding] makes", name);
    if (seq == 0 && p->sequence)
        return parser_fail(p, p->sec_line, "[%s] in a language model: after an [embedding] "
                           "come [block], [layernorm], [dropout] and [lm_head]", name);
    return 0;
}

/* Turns the finished section into a layer: defaults, required keys, shapes, counts. */
static int finish_layer(net_parser *p)
{
    section_kind s = p->sec;
    for (int k = 0; k < KEY_COUNT; k++)
        if ((key_table[k].required & SEC_BIT(s)) && !(p->seen & (1u << k)))
            return parser_fail(p, p->sec_line, "[%s] needs '%s'", section_names[s],
                               key_table[k].name);
    if (check_order(p, s)) return -1;

    layer_desc L;
    memset(&L, 0, sizeof L);
    L.type = section_layer[s];
    L.line = p->sec_line;
    L.in = p->n_layers ? p->layers[p->n_layers - 1].out : p->input;
    L.activation = KERNEL_ACT_LINEAR;
    layer_spec spec = {
        .given = ((p->seen & (1u << KEY_SIZE)) ? LAYER_SPEC_SIZE : 0u) |
                 ((p->seen & (1u << KEY_STRIDE)) ? LAYER_SPEC_STRIDE : 0u) |
                 ((p->seen & (1u << KEY_PAD)) ? LAYER_SPEC_PAD : 0u) |
                 ((p->seen & (1u << KEY_ACTIVATION)) ? LAYER_SPEC_ACTIVATION : 0u) |
                 ((p->seen & (1u << KEY_VOCAB)) ? LAYER_SPEC_VOCAB : 0u) |
                 ((p->seen & (1u << KEY_HIDDEN)) ? LAYER_SPEC_HIDDEN : 0u) |
                 ((p->seen & (1u << KEY_DROPOUT)) ? LAYER_SPEC_DROPOUT : 0u) |
                 ((p->seen & (1u << KEY_TIED)) ? LAYER_SPEC_TIED : 0u),
        .filters = p->ival[KEY_FILTERS],
        .size = p->ival[KEY_SIZE],
        .stride = p->ival[KEY_STRIDE],
        .pad = p->ival[KEY_PAD],
        .units = p->ival[KEY_UNITS],
        .activation = (kernel_act)p->ival[KEY_ACTIVATION],
        .p = p->p,
        .vocab = p->ival[KEY_VOCAB],
        .context = p->ival[KEY_CONTEXT],
        .width = p->ival[KEY_WIDTH],
        .heads = p->ival[KEY_HEADS],
        .hidden = p->ival[KEY_HIDDEN],
        .tied = p->ival[KEY_TIED],
        .dropout = p->block_p,
        .embedding = p->sequence ? &p->layers[0] : NULL,
    };
    layer_shape_error err = {.blame_size = 0};
    if (layer_kind_of(L.type)->shape(&L, &spec, &err))
        return parser_fail(p, err.blame_size ? blame_line(p, KEY_SIZE) : p->sec_line, "%s",
                           err.reason);
    /* later stages index activations with int; keep every shape within that */
    if ((size_t)layer_shape_count(L.out) > INT_MAX)
        return parser_fail(p, p->sec_line, "output of [%s] has too many elements (%d×%d×%d)",
                           section_names[s], L.out.c, L.out.h, L.out.w);
    /* a tied head's copy of the token matrix is the embedding's, counted there */
    size_t counted = L.type == LAYER_LM_HEAD && L.u.lm_head.tied ? 0 : L.weight_count;
    if (__builtin_add_overflow(p->param_count, counted, &p->param_count) ||
        __builtin_add_overflow(p->param_count, L.bias_count, &p->param_count))
        return parser_fail(p, p->sec_line, "parameter count overflows");

    if (p->n_layers == p->cap_layers) {
        int cap = p->cap_layers ? 2 * p->cap_layers : 16;
        layer_desc *grown = realloc(p->layers, (size_t)cap * sizeof *grown);
        if (!grown)
            return parser_fail(p, p->sec_line, "out of memory");
        p->layers = grown;
        p->cap_layers = cap;
    }
    p->layers[p->n_layers++] = L;
    if (s == SEC_EMBEDDING) p->sequence = 1;
    if (s == SEC_LM_HEAD) p->head_line = p->sec_line;
    return 0;
}

/* Ends the current section (if any) and opens [name] found on the current line. */
static int begin_section(net_parser *p, const char *name)
{
    if (p->sec > SEC_NET && finish_layer(p) != 0)
        return -1;
    section_kind s = SEC_NONE;
    for (int i = 0; i < SEC_COUNT; i++)
        if (strcmp(name, section_names[i]) == 0)
            s = (section_kind)i;
    if (s == SEC_NONE)
        return parser_fail(p, p->line,
                           "unknown section [%s] (expected net, conv, maxpool, avgpool, dense, "
                           "dropout, flatten, embedding, block, layernorm or lm_head)", name);
    if (s == SEC_NET && p->have_net)
        return parser_fail(p, p->line, "[net] given twice (first on line %d)", p->have_net);
    if (s != SEC_NET && !p->have_net)
        return parser_fail(p, p->line, "the first section must be [net], not [%s]", name);
    p->sec = s;
    p->sec_line = p->line;
    p->seen = 0;
    memset(p->key_line, 0, sizeof p->key_line);
    if (s == SEC_NET)
        p->have_net = p->line;
    return 0;
}

/* ---- inih plumbing ---- */

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

/* inih's fgets-like reader: hands over one normalised line (see the top of the file). */
static char *reader_next_line(char *str, int num, void *stream)
{
    net_parser *p = stream;
    if (p->failed || p->text[p->pos] == '\0')
        return NULL;
    const char *start = p->text + p->pos;
    const char *nl = strchr(start, '\n');
    size_t len = nl ? (size_t)(nl - start) : strlen(start);
    p->pos += len + (nl ? 1 : 0);
    p->line++;
    /* inih's line buffer holds `num` bytes (INI_MAX_LINE, 200) with the terminator; we hand
     * it lines without '\n' (it strips line ends anyway) */
    char buf[1024];
    size_t max_len = (size_t)num - 1 < sizeof buf - 1 ? (size_t)num - 1 : sizeof buf - 1;
    if (len > 0 && start[len - 1] == '\r')
        len--;
    if (len > max_len) {
        parser_fail(p, p->line, "line is longer than %zu characters", max_len);
        return NULL;
    }
    memcpy(buf, start, len);
    buf[len] = '\0';
    char *s = buf;
    if (p->line == 1 && strncmp(s, "\xEF\xBB\xBF", 3) == 0) /* UTF-8 byte order mark */
        s += 3;
    while (is_blank(*s))
        s++;
    /* comments: ';' or '#' at the start or after a blank */
    for (char *c = s; *c; c++)
        if ((*c == ';' || *c == '#') && (c == s || is_blank(c[-1]))) {
            *c = '\0';
            break;
        }
    char *e = s + strlen(s);
    while (e > s && is_blank(e[-1]))
        *--e = '\0';

    if (*s == '[') {
        if (e[-1] != ']' || e - s < 2) {
            parser_fail(p, p->line, "section header without closing ']'");
            return NULL;
        }
        e[-1] = '\0';
        char *name = s + 1;
        while (is_blank(*name))
            name++;
        char *ne = name + strlen(name);
        while (ne > name && is_blank(ne[-1]))
            *--ne = '\0';
        if (begin_section(p, name) != 0)
            return NULL;
        snprintf(str, (size_t)num, "[%s]", name);
        return str;
    }
    if (*s != '\0') {
        if (!strchr(s, '=')) {
            parser_fail(p, p->line, "expected 'key = value' or '[section]', got '%s'", s);
            return NULL;
        }
        if (p->sec == SEC_NONE) {
            parser_fail(p, p->line, "key outside any section (the file must start with [net])");
            return NULL;
        }
    }
    snprintf(str, (size_t)num, "%s", s);
    return str;
}

static int handle_key(void *user, const char *section, const char *name, const char *value)
{
    (void)section; /* the reader tracks sections itself, with instance and line */
    net_parser *p = user;
    if (p->failed)
        return 0;
    int k = -1;
    for (int i = 0; i < KEY_COUNT; i++)
        if (strcmp(name, key_table[i].name) == 0)
            k = i;
    /* inih wants 0 for an error; the message is already recorded */
    if (k < 0 || !(key_table[k].allowed & SEC_BIT(p->sec))) {
        parser_fail(p, p->line, "unknown key '%s' in [%s]", name, section_names[p->sec]);
        return 0;
    }
    if (p->seen & (1u << k)) {
        parser_fail(p, p->line, "duplicate key '%s' in [%s] (first given on line %d)", name,
                    section_names[p->sec], p->key_line[k]);
        return 0;
    }
    p->seen |= 1u << k;
    p->key_line[k] = p->line;
    return parse_value(p, (key_id)k, value) == 0;
}

static void parser_free(net_parser *p)
{
    free(p->layers);
    p->layers = NULL;
}

int net_desc_parse_string(net_desc *net, const char *text, const char *name)
{
    memset(net, 0, sizeof *net);
    if (!name)
        name = "<string>";
    if (!text)
        return pt_error_set("%s: no model text", name);
    net_parser p;
    memset(&p, 0, sizeof p);
    p.name = name;
    p.text = text;
    p.sec = SEC_NONE;
    p.input = (layer_shape){1, 28, 28};

    int rc = ini_parse_stream(reader_next_line, &p, handle_key, &p);
    if (!p.failed && rc != 0)
        parser_fail(&p, rc > 0 ? rc : p.line, "syntax error");
    if (!p.failed && p.sec > SEC_NET)
        finish_layer(&p);
    if (!p.failed && !p.have_net)
        parser_fail(&p, p.line > 0 ? p.line : 1, "no [net] section");
    if (!p.failed && p.n_layers == 0)
        parser_fail(&p, p.have_net, "no layers after [net]");
    if (!p.failed && p.sequence && !p.head_line)
        parser_fail(&p, p.layers[p.n_layers - 1].line,
                    "a language model must end with an [lm_head] (it predicts the next token)");
    if (!p.failed && !p.sequence) {
        const layer_desc *last = &p.layers[p.n_layers - 1];
        size_t classes = layer_shape_count(last->out);
        if (classes < 2)
            parser_fail(&p, last->line,
                        "the last layer has %zu output; a classifier needs at least 2 classes",
                        classes);
    }
    if (p.failed) {
        parser_free(&p);
        return -1;
    }
    net->input = p.sequence ? p.layers[0].in : p.input;
    net->n_layers = p.n_layers;
    net->layers = p.layers;
    net->param_count = p.param_count;
    net->sequence = p.sequence;
    net->blocks = 0;
    net->tied_head = -1;
    net->stored_count = 0;
    for (int i = 0; i < p.n_layers; i++) {
        net->stored_count += p.layers[i].weight_count + p.layers[i].bias_count;
        if (p.layers[i].type == LAYER_BLOCK) net->blocks++;
        if (p.layers[i].type == LAYER_LM_HEAD && p.layers[i].u.lm_head.tied) net->tied_head = i;
    }
    /* a language model's loss is per position: V classes at each of the T positions */
    net->classes = p.sequence ? p.layers[p.n_layers - 1].out.w
                              : (int)layer_shape_count(p.layers[p.n_layers - 1].out);
    return 0;
}

int net_desc_load(net_desc *net, const char *path)
{
    memset(net, 0, sizeof *net);
    FILE *f = pt_fopen_regular(path, "rb");
    if (!f)
        return -1;
    char *text = malloc(NET_MAX_FILE_BYTES + 1);
    if (!text) {
        fclose(f);
        return pt_error_set("%s: out of memory", path);
    }
    size_t n = fread(text, 1, NET_MAX_FILE_BYTES + 1, f);
    int read_error = ferror(f);
    fclose(f);
    if (read_error) {
        free(text);
        return pt_error_set("%s: read error", path);
    }
    if (n > NET_MAX_FILE_BYTES) {
        free(text);
        return pt_error_set("%s: larger than %d bytes; not a model file", path,
                            NET_MAX_FILE_BYTES);
    }
    text[n] = '\0';
    const char *nul = memchr(text, '\0', n);
    if (nul) {
        int line = 1;
        for (const char *c = text; c < nul; c++)
            line += *c == '\n';
        free(text);
        return pt_error_set("%s:%d: NUL byte in a model file", path, line);
    }
    int rc = net_desc_parse_string(net, text, path);
    free(text);
    return rc;
}

void net_desc_free(net_desc *net)
{
    free(net->layers);
    memset(net, 0, sizeof *net);
}

/* ---- summary ---- */

static int display_width(const char *s)
{
    int w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void print_padded(FILE *out, const char *s, int width, int right)
{
    int pad = width - display_width(s);
    if (right)
        for (; pad > 0; pad--)
            fputc(' ', out);
    fputs(s, out);
    if (!right)
        for (; pad > 0; pad--)
            fputc(' ', out);
}

/* 690590 → "690,590" */
static void format_thousands(char *buf, size_t size, size_t v)
{
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%zu", v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < size; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
}

#define SUMMARY_IDX_W 5
#define SUMMARY_NAME_W 40
#define SUMMARY_SHAPE_W 18
#define SUMMARY_PARAMS_W 12

static void print_rule(FILE *out, char c)
{
    for (int i = 0; i < SUMMARY_IDX_W + SUMMARY_NAME_W + SUMMARY_SHAPE_W + SUMMARY_PARAMS_W; i++)
        fputc(c, out);
    fputc('\n', out);
}

void net_desc_print_summary(const net_desc *net, FILE *out)
{
    char buf[128];
    if (net->sequence)
        fprintf(out, "Input: %d token ids (vocabulary %d)\n", net->input.c,
                net->layers[0].u.embedding.vocab);
    else
        fprintf(out, "Input shape: (%d, %d, %d)\n", net->input.c, net->input.h, net->input.w);
    print_rule(out, '_');
    print_padded(out, "#", SUMMARY_IDX_W, 0);
    print_padded(out, "Layer (type)", SUMMARY_NAME_W, 0);
    print_padded(out, "Output shape", SUMMARY_SHAPE_W, 0);
    print_padded(out, "Params", SUMMARY_PARAMS_W, 1);
    fputc('\n', out);
    print_rule(out, '=');
    int flat = 0; /* the current activation is a vector rather than C×H×W planes */
    for (int i = 0; i < net->n_layers; i++) {
        const layer_desc *L = &net->layers[i];
        if (layer_kind_of(L->type)->flat >= 0)
            flat = layer_kind_of(L->type)->flat;
        snprintf(buf, sizeof buf, "%d", i);
        print_padded(out, buf, SUMMARY_IDX_W, 0);
        layer_kind_of(L->type)->describe(buf, sizeof buf, L);
        print_padded(out, buf, SUMMARY_NAME_W - 1, 0);
        fputc(' ', out);
        if (flat == 2)
            snprintf(buf, sizeof buf, "(%d, %d)", L->out.c, L->out.w);
        else if (flat)
            snprintf(buf, sizeof buf, "(%zu)", layer_shape_count(L->out));
        else
            snprintf(buf, sizeof buf, "(%d, %d, %d)", L->out.c, L->out.h, L->out.w);
        print_padded(out, buf, SUMMARY_SHAPE_W, 0);
        if ((int)i == net->tied_head)
            snprintf(buf, sizeof buf, "(tied) 0");
        else
            format_thousands(buf, sizeof buf, L->weight_count + L->bias_count);
        print_padded(out, buf, SUMMARY_PARAMS_W, 1);
        fputc('\n', out);
    }
    print_rule(out, '=');
    format_thousands(buf, sizeof buf, net->param_count);
    fprintf(out, "Total params: %s\n", buf);
    const layer_desc *last = &net->layers[net->n_layers - 1];
    if (net->sequence && last->type == LAYER_LM_HEAD && last->u.lm_head.tied) {
        format_thousands(buf, sizeof buf,
                         (size_t)last->u.lm_head.vocab * (size_t)last->in.w);
        fprintf(out, "The lm_head shares the embedding's token matrix (tied): its %s weights "
                "are counted once, in layer 0.\n", buf);
    }
    if (net->sequence)
        fprintf(out, "Loss per position: %d classes at each of %d positions.\n", net->classes,
                last->out.c);
}

int net_desc_check_trainable(const net_desc *net, const char *model)
{
    for (int i = 0; i < net->n_layers; i++) {
        const layer_desc *L = &net->layers[i];
        if (layer_kind_of(L->type)->untrained)
            return pt_error_set("%s: layer %d [%s] is not trained by this version of pipetrain "
                                "yet", model ? model : "model", i, layer_type_name(L->type));
        /* the attention dropout numbers a sample's probabilities heads·T² in the low 32
         * bits of the generator's counter (kernels/kernels_transformer.h) */
        if (L->type == LAYER_BLOCK && L->u.block.p > 0 &&
            (uint64_t)L->u.block.heads * (uint64_t)L->in.c * (uint64_t)L->in.c >
                (uint64_t)UINT32_MAX + 1)
            return pt_error_set("%s: layer %d [block] dropout=%g: its %d heads × %d² attention "
                                "probabilities per sample exceed the 2^32 elements a dropout "
                                "mask numbers; remove the key (or set 0), or use a shorter "
                                "context", model ? model : "model", i, (double)L->u.block.p,
                                L->u.block.heads, L->in.c);
    }
    return 0;
}
