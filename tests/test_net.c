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

Test(net, summary_table)
{
    net_desc net;
    load_model(&net, "seed-cnn.cfg");
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    cr_assert_not_null(out);
    net_desc_print_summary(&net, out);
    fclose(out);
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
