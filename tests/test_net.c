/* Model files: the shipped models, the INI dialect (comments, blank sections, repeated
 * sections), every kind of error with its line number, and the summary table. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/model/net.h"
#include "tests/check.h"


static void assert_shape(layer_shape s, int c, int h, int w, const char *what)
{
    cr_assert(s.c == c && s.h == h && s.w == w, "%s: shape (%d, %d, %d), expected (%d, %d, %d)",
              what, s.c, s.h, s.w, c, h, w);
}

/* The text must fail to parse, with "test.cfg:LINE:" and `phrase` in the message. */
static void expect_error(const char *text, int line, const char *phrase)
{
    net_desc net;
    pt_error_clear();
    int rc = net_desc_parse_string(&net, text, "test.cfg");
    cr_assert_eq(rc, -1, "accepted a bad model (expected '%s' on line %d):\n%s", phrase, line,
                 text);
    cr_assert_null(net.layers, "layers left allocated after an error");
    char prefix[64];
    snprintf(prefix, sizeof prefix, "test.cfg:%d: ", line);
    const char *msg = pt_error_get();
    cr_assert(strncmp(msg, prefix, strlen(prefix)) == 0, "message '%s' does not start with '%s'",
              msg, prefix);
    cr_assert(strstr(msg, phrase) != NULL, "message '%s' does not contain '%s'", msg, phrase);
}

static void parse_ok(net_desc *net, const char *text)
{
    cr_assert_eq(net_desc_parse_string(net, text, "test.cfg"), 0, "%s", pt_error_get());
}

Test(net, seed_cnn_shapes_and_counts)
{
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    cr_assert_eq(net.n_layers, 11);
    assert_shape(net.input, 1, 28, 28, "input");
    static const layer_type types[] = {LAYER_CONV,    LAYER_MAXPOOL, LAYER_CONV,  LAYER_MAXPOOL,
                                       LAYER_CONV,    LAYER_MAXPOOL, LAYER_FLATTEN, LAYER_DROPOUT,
                                       LAYER_DENSE,   LAYER_DENSE,   LAYER_DENSE};
    static const int out[][3] = {{32, 26, 26}, {32, 13, 13}, {128, 11, 11}, {128, 5, 5},
                                 {256, 3, 3},  {256, 1, 1},  {256, 1, 1},   {256, 1, 1},
                                 {1000, 1, 1}, {100, 1, 1},  {10, 1, 1}};
    static const size_t params[] = {320, 0, 36992, 0, 295168, 0, 0, 0, 257000, 100100, 1010};
    for (int i = 0; i < net.n_layers; i++) {
        const layer_desc *L = &net.layers[i];
        char what[32];
        snprintf(what, sizeof what, "layer %d", i);
        cr_assert_eq(L->type, types[i], "%s: type %s", what, layer_type_name(L->type));
        assert_shape(L->out, out[i][0], out[i][1], out[i][2], what);
        if (i > 0)
            cr_assert_eq(layer_shape_count(L->in), layer_shape_count(net.layers[i - 1].out),
                         "%s: input does not chain", what);
        cr_assert_eq(L->weight_count + L->bias_count, params[i], "%s: %zu params", what,
                     L->weight_count + L->bias_count);
    }
    cr_assert_eq(net.layers[0].activation, KERNEL_ACT_RELU);
    cr_assert_eq(net.layers[0].u.conv.stride, 1);
    cr_assert_eq(net.layers[0].u.conv.pad, 0);
    cr_assert_eq(net.layers[0].weight_count, 32u * 9);
    cr_assert_eq(net.layers[1].u.pool.stride, 2);
    cr_assert_float_eq(net.layers[7].u.dropout.p, 0.5f, 1e-7);
    cr_assert_eq(net.layers[10].activation, KERNEL_ACT_LINEAR);
    cr_assert_eq(net.param_count, 690590u);
    cr_assert_eq(net.classes, 10);
    net_desc_free(&net);
    cr_assert_null(net.layers);
    cr_assert_eq(net.n_layers, 0);
}

Test(net, seed_mlp_shapes_and_counts)
{
    net_desc net;
    load_model(&net, "seed-mlp.cfg");
    cr_assert_eq(net.n_layers, 3);
    /* the first dense layer flattens 1×28×28 implicitly */
    assert_shape(net.layers[0].in, 784, 1, 1, "dense 0 in");
    assert_shape(net.layers[0].out, 256, 1, 1, "dense 0 out");
    assert_shape(net.layers[2].out, 10, 1, 1, "dense 2 out");
    cr_assert_eq(net.layers[0].activation, KERNEL_ACT_SIGMOID);
    cr_assert_eq(net.layers[1].activation, KERNEL_ACT_SIGMOID);
    cr_assert_eq(net.layers[0].weight_count, 784u * 256);
    cr_assert_eq(net.layers[0].bias_count, 256u);
    cr_assert_eq(net.param_count, 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    cr_assert_eq(net.classes, 10);
    net_desc_free(&net);
}

Test(net, dialect_comments_blank_sections_and_lines)
{
    /* CRLF, indentation, ';' and '#' comments (whole-line and inline), keyless sections,
     * two consecutive [conv] sections, defaults */
    const char *text = "# a comment\r\n"
                       "[net]\r\n"
                       "  input = 3, 8, 8   ; colour\r\n"
                       "\r\n"
                       "[conv]\n"             /* line 5 */
                       "\tfilters=4 # inline\n"
                       "size=3\n"
                       "[conv]\n"             /* line 8 */
                       "filters=6\n"
                       "size=3\n"
                       "pad=1\n"
                       "stride=2\n"
                       "activation=tanh\n"
                       "[maxpool]\n"          /* line 14 */
                       "[avgpool]\n"          /* line 15 */
                       "size=1\n"
                       "[flatten]\n"          /* line 17 */
                       "[dense]\n"            /* line 18 */
                       "units=2";
    net_desc net;
    parse_ok(&net, text);
    cr_assert_eq(net.n_layers, 6);
    assert_shape(net.input, 3, 8, 8, "input");
    static const int lines[] = {5, 8, 14, 15, 17, 18};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(net.layers[i].line, lines[i], "layer %d on line %d", i, net.layers[i].line);
    assert_shape(net.layers[0].out, 4, 6, 6, "conv 0");
    cr_assert_eq(net.layers[0].activation, KERNEL_ACT_LINEAR);
    cr_assert_eq(net.layers[0].weight_count, 4u * 3 * 9);
    assert_shape(net.layers[1].out, 6, 3, 3, "conv 1"); /* (6 + 2 − 3) / 2 + 1 */
    cr_assert_eq(net.layers[1].activation, KERNEL_ACT_TANH);
    cr_assert_eq(net.layers[1].weight_count, 6u * 4 * 9);
    cr_assert_eq(net.layers[2].u.pool.size, 2);
    cr_assert_eq(net.layers[2].u.pool.stride, 2);
    assert_shape(net.layers[2].out, 6, 1, 1, "maxpool"); /* floor((3 − 2) / 2) + 1 */
    cr_assert_eq(net.layers[3].u.pool.stride, 1);
    assert_shape(net.layers[4].out, 6, 1, 1, "flatten");
    assert_shape(net.layers[5].in, 6, 1, 1, "dense in");
    cr_assert_eq(net.param_count, (4u * 27 + 4) + (6u * 36 + 6) + (2u * 6 + 2));
    cr_assert_eq(net.classes, 2);
    net_desc_free(&net);
}

Test(net, dense_after_conv_flattens_implicitly)
{
    net_desc net;
    parse_ok(&net, "[net]\ninput=2,5,5\n[conv]\nfilters=3\nsize=2\n[dense]\nunits=7\n");
    assert_shape(net.layers[1].in, 3 * 4 * 4, 1, 1, "dense in");
    cr_assert_eq(net.layers[1].weight_count, 7u * 48);
    net_desc_free(&net);
}

Test(net, default_input_is_28x28)
{
    net_desc net;
    parse_ok(&net, "[net]\n[dense]\nunits=3\n");
    assert_shape(net.input, 1, 28, 28, "default input");
    cr_assert_eq(net.layers[0].weight_count, 3u * 784);
    net_desc_free(&net);
}

Test(net, errors_sections)
{
    expect_error("[net]\n[dense]\nunits=10\n[lstm]\nunits=3\n", 4, "unknown section [lstm]");
    expect_error("[dense]\nunits=10\n", 1, "first section must be [net]");
    expect_error("input=1,2,2\n[net]\n[dense]\nunits=2\n", 1, "outside any section");
    expect_error("[net]\n[dense]\nunits=10\n[net]\n", 4, "[net] given twice");
    expect_error("; nothing\n[net]\ninput=1,4,4\n", 2, "no layers");
    expect_error("", 1, "no [net]");
    expect_error("# only a comment\n\n", 2, "no [net]");
    expect_error("[net]\n[conv\nfilters=2\n", 2, "closing ']'");
    expect_error("[net]\n[dense]\nunits 10\n", 3, "expected 'key = value'");
}

Test(net, errors_keys)
{
    expect_error("[net]\n[dense]\nunits=10\nfilters=3\n", 4, "unknown key 'filters' in [dense]");
    expect_error("[net]\nbatch=4\n[dense]\nunits=10\n", 2, "unknown key 'batch'");
    expect_error("[net]\n[flatten]\nsize=2\n[dense]\nunits=3\n", 3, "unknown key 'size'");
    expect_error("[net]\n[maxpool]\nactivation=relu\n", 3, "unknown key 'activation'");
    expect_error("[net]\n[conv]\nfilters=3\nsize=3\nfilters=4\n[dense]\nunits=2\n", 5,
                 "duplicate key 'filters'");
    expect_error("[net]\ninput=1,8,8\ninput=1,8,8\n[dense]\nunits=2\n", 3, "duplicate key");
    /* a duplicate in the second of two [conv] sections, not confused with the first */
    expect_error("[net]\n[conv]\nfilters=3\nsize=3\n[conv]\nsize=3\nfilters=1\nsize=1\n", 8,
                 "duplicate key 'size' in [conv] (first given on line 6)");
    /* missing required keys are reported at the section header */
    expect_error("[net]\n[conv]\nsize=3\n[dense]\nunits=10\n", 2, "[conv] needs 'filters'");
    expect_error("[net]\n[conv]\nfilters=3\n", 2, "[conv] needs 'size'");
    expect_error("[net]\n[dense]\nactivation=relu\n\n", 2, "[dense] needs 'units'");
    expect_error("[net]\n[dense]\nunits=4\n[dropout]\n[dense]\nunits=2\n", 4,
                 "[dropout] needs 'p'");
}

Test(net, errors_values)
{
    expect_error("[net]\n[dense]\nunits=abc\n", 3, "not an integer");
    expect_error("[net]\n[dense]\nunits=10x\n", 3, "trailing characters");
    expect_error("[net]\n[dense]\nunits=1 0\n", 3, "trailing characters");
    expect_error("[net]\n[dense]\nunits=99999999999\n", 3, "overflow");
    expect_error("[net]\n[dense]\nunits=2147483648\n", 3, "overflow");
    expect_error("[net]\n[dense]\nunits=0\n", 3, "must be positive");
    expect_error("[net]\n[dense]\nunits=-5\n", 3, "must be positive");
    expect_error("[net]\n[dense]\nunits=\n", 3, "missing value");
    expect_error("[net]\n[conv]\nfilters=2\nsize=3\npad=-1\n", 5, "must be non-negative");
    expect_error("[net]\n[conv]\nfilters=2\nsize=3\nstride=0\n", 5, "must be positive");
    expect_error("[net]\n[maxpool]\nsize=0\n", 3, "must be positive");
    expect_error("[net]\n[dense]\nunits=4\nactivation=gelu\n", 4, "unknown activation 'gelu'");
    expect_error("[net]\n[dense]\nunits=4\n[dropout]\np=1\n", 5, "0 <= p < 1");
    expect_error("[net]\n[dense]\nunits=4\n[dropout]\np=-0.1\n", 5, "0 <= p < 1");
    expect_error("[net]\n[dense]\nunits=4\n[dropout]\np=nan\n", 5, "0 <= p < 1");
    expect_error("[net]\n[dense]\nunits=4\n[dropout]\np=0.99999999999\n", 5, "0 <= p < 1");
    expect_error("[net]\n[dense]\nunits=4\n[dropout]\np=0.5x\n", 5, "not a number");
    expect_error("[net]\ninput=1,28\n[dense]\nunits=4\n", 2, "expected C,H,W");
    expect_error("[net]\ninput=1,28,28,3\n[dense]\nunits=4\n", 2, "expected C,H,W");
    expect_error("[net]\ninput=1,0,28\n[dense]\nunits=4\n", 2, "must be positive");
    expect_error("[net]\ninput=1,a,28\n[dense]\nunits=4\n", 2, "not an integer");
    expect_error("[net]\ninput=65536,65536,1\n[dense]\nunits=4\n", 2, "too many elements");
}

Test(net, errors_shapes)
{
    /* blamed on the 'size' key when given */
    expect_error("[net]\ninput=1,4,4\n[conv]\nfilters=2\nsize=5\n", 5,
                 "larger than its padded input");
    /* with padding the same kernel fits: (4 + 2 − 5) + 1 = 2 */
    net_desc net;
    parse_ok(&net, "[net]\ninput=1,4,4\n[conv]\nfilters=2\nsize=5\npad=1\n");
    assert_shape(net.layers[0].out, 2, 2, 2, "padded conv");
    net_desc_free(&net);
    expect_error("[net]\ninput=1,4,4\n[maxpool]\nsize=5\n", 4, "larger than its input");
    /* the default 2×2 window on a flat vector is blamed on the section header */
    expect_error("[net]\n[dense]\nunits=8\n[avgpool]\n[dense]\nunits=2\n", 4,
                 "larger than its input");
    expect_error("[net]\ninput=1,4,4\n[conv]\nfilters=2000000000\nsize=3\n", 3,
                 "too many elements");
    expect_error("[net]\ninput=1,1,1\n[conv]\nfilters=2000000000\nsize=2000000000\n"
                 "pad=1000000000\n[dense]\nunits=2\n",
                 3, "overflows");
    expect_error("[net]\n[dense]\nunits=10\n[dense]\nunits=1\n", 4, "at least 2 classes");
}

Test(net, error_long_line)
{
    char text[512];
    int n = snprintf(text, sizeof text, "[net]\n[dense]\nunits=10 ;");
    memset(text + n, 'x', 250);
    snprintf(text + n + 250, sizeof text - (size_t)n - 250, "\n[dense]\nunits=2\n");
    expect_error(text, 3, "longer than");
    /* a long comment that fits is fine */
    n = snprintf(text, sizeof text, "[net]\n[dense]\nunits=10 ;");
    memset(text + n, 'x', 150);
    snprintf(text + n + 150, sizeof text - (size_t)n - 150, "\n");
    net_desc net;
    parse_ok(&net, text);
    net_desc_free(&net);
}

Test(net, load_errors_name_the_file)
{
    net_desc net;
    cr_assert_eq(net_desc_load(&net, "/nonexistent/dir/model.cfg"), -1);
    cr_assert(strstr(pt_error_get(), "/nonexistent/dir/model.cfg") != NULL, "%s",
              pt_error_get());
    cr_assert(strstr(pt_error_get(), "No such file") != NULL, "%s", pt_error_get());

    char dir[] = "/tmp/pt_test_net_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/bad.cfg", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fputs("[net]\n[dense]\nunits=4\n\n[dense]\nunits=1\n", f);
    fclose(f);
    cr_assert_eq(net_desc_load(&net, path), -1);
    char expect[160];
    snprintf(expect, sizeof expect, "%s:5: ", path);
    cr_assert(strncmp(pt_error_get(), expect, strlen(expect)) == 0, "%s", pt_error_get());

    f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite("[net]\n[dense]\nunits=4\0\n", 1, 23, f);
    fclose(f);
    cr_assert_eq(net_desc_load(&net, path), -1);
    cr_assert(strstr(pt_error_get(), ":3: NUL byte") != NULL, "%s", pt_error_get());
    unlink(path);
    rmdir(dir);
}

/* The summary table as text (owned by the caller). */
static char *summary_text(const net_desc *net)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    cr_assert_not_null(out);
    net_desc_print_summary(net, out);
    fclose(out);
    return buf;
}

Test(net, summary_table)
{
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    char *buf = summary_text(&net);
    static const char *const expected[] = {
        "Total params: 690,590\n", "conv2d (3×3, 32, relu)", "(32, 26, 26)", "295,168",
        "maxpool2d (2×2)", "dense (1000, relu)", "(1000)", "dropout (0.5)", "flatten",
        "=====",
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        cr_assert(strstr(buf, expected[i]) != NULL, "summary lacks '%s':\n%s", expected[i], buf);
    /* one row per layer: rows start with the index */
    cr_assert(strstr(buf, "\n10   dense (10, linear)") != NULL, "%s", buf);
    free(buf);
    net_desc_free(&net);
}

Test(net, names)
{
    cr_assert_str_eq(layer_type_name(LAYER_CONV), "conv");
    cr_assert_str_eq(layer_type_name(LAYER_FLATTEN), "flatten");
    cr_assert_str_eq(layer_act_name(KERNEL_ACT_SIGMOID), "sigmoid");
    cr_assert_str_eq(layer_act_name(KERNEL_ACT_LINEAR), "linear");
}

/* ---- transformer sections (issue 24): GPT-2-style language models ---- */

#define EMB "[net]\n[embedding]\nvocab=256\ncontext=16\nwidth=32\n" /* lines 1–5 */

Test(net, gpt2_small_exact_count)
{
    net_desc net;
    load_model(&net, "gpt2-small.cfg");
    cr_assert_eq(net.param_count, (size_t)124439808, "%zu", net.param_count);
    cr_assert_eq(net.n_layers, 15);
    cr_assert(net.sequence);
    cr_assert_eq(net.classes, 50257);
    assert_shape(net.input, 1024, 1, 1, "input: T token ids");
    const layer_desc *E = &net.layers[0], *B = &net.layers[1], *H = &net.layers[14];
    cr_assert_eq(E->type, LAYER_EMBEDDING);
    assert_shape(E->in, 1024, 1, 1, "embedding in");
    assert_shape(E->out, 1024, 1, 768, "embedding out: positions major");
    cr_assert_eq(E->weight_count + E->bias_count, (size_t)(50257 + 1024) * 768);
    cr_assert_eq(B->type, LAYER_BLOCK);
    cr_assert_eq(B->u.block.heads, 12);
    cr_assert_eq(B->u.block.hidden, 3072);
    cr_assert_eq(B->weight_count + B->bias_count, (size_t)7087872);
    cr_assert_eq(net.layers[13].type, LAYER_LAYERNORM);
    cr_assert_eq(net.layers[13].weight_count + net.layers[13].bias_count, (size_t)1536);
    cr_assert_eq(H->type, LAYER_LM_HEAD);
    cr_assert(H->u.lm_head.tied);
    /* a tied head keeps a copy of the token matrix; the net counts it once */
    cr_assert_eq(H->weight_count + H->bias_count, (size_t)50257 * 768);
    cr_assert_eq(net.tied_head, 14);
    cr_assert_eq(net.blocks, 12);
    assert_shape(H->out, 1024, 1, 50257, "lm_head out");
    for (int i = 0; i < net.n_layers; i++)
        cr_assert_eq(layer_shape_count(net.layers[i].out),
                     (size_t)1024 * (i == 14 ? 50257 : 768), "layer %d floats per sample", i);
    net_desc_free(&net);
}

Test(net, gpt_nano_and_mini_counts)
{
    net_desc net;
    load_model(&net, "gpt-nano.cfg");
    cr_assert_eq(net.param_count, (size_t)42880, "%zu", net.param_count);
    cr_assert_eq(net.layers[net.n_layers - 1].weight_count, (size_t)256 * 32, "untied head");
    net_desc_free(&net);
    load_model(&net, "gpt-mini.cfg");
    cr_assert_eq(net.param_count, (size_t)10844160, "%zu", net.param_count);
    net_desc_free(&net);
}

Test(net, gpt_sections_parse)
{
    net_desc net;
    parse_ok(&net, EMB "[dropout]\np=0.1\n[block]\nheads=4\nhidden=48\ndropout=0.1\n"
                       "[layernorm]\n[lm_head]\n");
    cr_assert_eq(net.n_layers, 5);
    const layer_desc *B = &net.layers[2];
    cr_assert_eq(B->u.block.hidden, 48);
    cr_assert_float_eq(B->u.block.p, 0.1f, 1e-7f);
    cr_assert_eq(B->weight_count, (size_t)(4 * 32 * 32 + 2 * 32 * 48));
    cr_assert_eq(B->bias_count, (size_t)(9 * 32 + 48));
    assert_shape(net.layers[1].out, 16, 1, 32, "dropout keeps the sequence");
    cr_assert_eq(net.layers[4].weight_count, (size_t)256 * 32);
    cr_assert_eq(net.classes, 256);
    net_desc_free(&net);
    /* the head's vocab may be given when it matches */
    parse_ok(&net, EMB "[lm_head]\nvocab=256\ntied=0\n");
    net_desc_free(&net);
}

Test(net, gpt_errors)
{
    expect_error(EMB "[block]\nheads=5\n[lm_head]\n", 6, "heads=5 does not divide the width 32");
    expect_error(EMB "[block]\nheads=64\n[lm_head]\n", 6, "heads=64 is larger than 32");
    expect_error("[net]\n[block]\nheads=2\n", 2, "[block] before an [embedding]");
    expect_error("[net]\n[dense]\nunits=4\n[layernorm]\n", 4, "[layernorm] before an [embedding]");
    expect_error("[net]\n[dense]\nunits=4\n[lm_head]\n", 4, "[lm_head] before an [embedding]");
    expect_error(EMB "[lm_head]\nvocab=100\ntied=1\n", 6, "vocab=100 differs");
    expect_error(EMB "[lm_head]\ntied=2\n", 7, "must be 0 or 1");
    expect_error(EMB "[dense]\nunits=4\n", 6, "[dense] in a language model");
    expect_error(EMB "[conv]\nfilters=2\nsize=1\n", 6, "[conv] in a language model");
    expect_error(EMB "[flatten]\n[lm_head]\n", 6, "[flatten] in a language model");
    expect_error("[net]\n[dense]\nunits=4\n[embedding]\nvocab=8\ncontext=4\nwidth=4\n", 4,
                 "[embedding] must be the first layer");
    expect_error("[net]\ninput=1,4,4\n[embedding]\nvocab=8\ncontext=4\nwidth=4\n[lm_head]\n", 2,
                 "'input' in [net] of a language model");
    expect_error(EMB "[lm_head]\n[layernorm]\n", 7, "after the [lm_head] (line 6)");
    expect_error(EMB "[block]\nheads=2\n", 6, "must end with an [lm_head]");
    expect_error("[net]\n[embedding]\nvocab=0\ncontext=4\nwidth=4\n", 3, "must be positive");
    expect_error("[net]\n[embedding]\nvocab=8\ncontext=-4\nwidth=4\n", 4, "must be positive");
    expect_error("[net]\n[embedding]\nvocab=8\ncontext=4\nwidth=0\n", 5, "must be positive");
    expect_error("[net]\n[embedding]\nvocab=1\ncontext=4\nwidth=4\n[lm_head]\n", 2,
                 "at least 2 tokens");
    expect_error("[net]\n[embedding]\nvocab=16777217\ncontext=4\nwidth=4\n[lm_head]\n", 2,
                 "vocab=16777217 is larger than 16777216");
    expect_error("[net]\n[embedding]\nvocab=8\ncontext=65537\nwidth=4\n[lm_head]\n", 2,
                 "context=65537 is larger");
    expect_error("[net]\n[embedding]\nvocab=8\ncontext=4\nwidth=65537\n[lm_head]\n", 2,
                 "width=65537 is larger");
    expect_error(EMB "[block]\nheads=2\nhidden=1048577\n[lm_head]\n", 6, "hidden=1048577 is larger");
    expect_error(EMB "[block]\nheads=2\nhidden=0\n", 8, "must be positive");
    expect_error(EMB "[block]\nheads=2\ndropout=1\n", 8, "0 <= dropout < 1");
    expect_error(EMB "[block]\n[lm_head]\n", 6, "[block] needs 'heads'");
    expect_error("[net]\n[embedding]\nvocab=8\nwidth=4\n[lm_head]\n", 2,
                 "[embedding] needs 'context'");
    expect_error(EMB "[block]\nheads=2\nvocab=4\n", 8, "unknown key 'vocab' in [block]");
    /* the logits of every position must stay within the stages' int indexing */
    expect_error("[net]\n[embedding]\nvocab=16777216\ncontext=65536\nwidth=1\n[lm_head]\n", 6,
                 "[lm_head] has too many elements");
}

Test(net, gpt_summary_and_refusal)
{
    net_desc net;
    load_model(&net, "gpt-mini.cfg");
    char *buf = summary_text(&net);
    static const char *const expected[] = {
        "Input: 256 token ids (vocabulary 256)", "embedding (256, 256 positions)", "(256, 384)",
        "block (6 heads, hidden 1536)", "1,774,464", "lm_head (256, tied to layer 0)",
        "(256, 256)", "Total params: 10,844,160\n", "shares the embedding's token matrix",
        "Loss per position: 256 classes",
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        cr_assert(strstr(buf, expected[i]) != NULL, "summary lacks '%s':\n%s", expected[i], buf);
    free(buf);
    cr_assert_eq(net_desc_check_trainable(&net, "gpt-mini.cfg"), 0, "%s", pt_error_get());
    net_desc_free(&net);
    /* dropout inside blocks is trained; refused only where heads·T² outgrows the 2^32
     * elements a mask numbers, with the layer and the key */
    cr_assert_eq(net_desc_parse_string(&net, "[net]\n[embedding]\nvocab=8\ncontext=4\n"
                                             "width=4\n[block]\nheads=2\ndropout=0.1\n"
                                             "[lm_head]\n", "drop.cfg"), 0, "%s",
                 pt_error_get());
    cr_assert_eq(net_desc_check_trainable(&net, "drop.cfg"), 0, "%s", pt_error_get());
    net_desc_free(&net);
    cr_assert_eq(net_desc_parse_string(&net, "[net]\n[embedding]\nvocab=8\ncontext=65536\n"
                                             "width=4\n[block]\nheads=2\ndropout=0.1\n"
                                             "[lm_head]\n", "drop.cfg"), 0, "%s",
                 pt_error_get());
    cr_assert_eq(net_desc_check_trainable(&net, "drop.cfg"), -1);
    cr_assert(strstr(pt_error_get(), "drop.cfg: layer 1 [block] dropout=0.1: its 2 heads"),
              "%s", pt_error_get());
    net_desc_free(&net);
    load_model(&net, "seed-cnn.cfg");
    cr_assert_eq(net_desc_check_trainable(&net, "seed-cnn.cfg"), 0);
    net_desc_free(&net);
}
