/* The stage's optimizer step (src/engine/stage_plan.h, stage_optim_step) under AdamW: weight
 * decay on each layer's leading layer_decayed_count parameters only (nanoGPT's rule: the
 * matrices of dense, conv and transformer blocks and an untied lm_head; no decay on biases,
 * norms, embeddings or a tied head), and the per-layer runs it makes give the bits of one
 * update with a per-element decay. Also the optimizer names. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "src/engine/stage_plan.h"
#include "src/model/layer_table.h"
#include "src/model/net.h"
#include "src/base/error.h"
#include "tests/check.h"

static const char *const GPT_TIED = "[net]\n"
                                    "[embedding]\nvocab=50\ncontext=8\nwidth=16\n"
                                    "[block]\nheads=2\n"
                                    "[dropout]\np=0.1\n"
                                    "[block]\nheads=4\nhidden=24\n"
                                    "[layernorm]\n"
                                    "[lm_head]\ntied=1\n";

static const char *const MIXED = "[net]\ninput=1,8,8\n"
                                 "[conv]\nfilters=3\nsize=3\nactivation=relu\n"
                                 "[maxpool]\n"
                                 "[flatten]\n"
                                 "[dense]\nunits=12\nactivation=sigmoid\n"
                                 "[dense]\nunits=5\n";

/* A stage of layers [first, last) of net as the optimizer sees it: the layers and their
 * parameter offsets (the plan's layout: per layer its weight, then its bias). */
static stage_plan plan_of(const net_desc *net, int first, int last)
{
    stage_plan p = {.net = net, .first = first, .last = last, .nl = last - first};
    p.loc = calloc((size_t)p.nl, sizeof *p.loc);
    p.param_off = calloc((size_t)p.nl, sizeof *p.param_off);
    cr_assert(p.loc && p.param_off);
    for (int i = 0; i < p.nl; i++) {
        p.loc[i] = net->layers[first + i];
        p.param_off[i] = p.param_count;
        p.param_count += p.loc[i].weight_count + p.loc[i].bias_count;
    }
    return p;
}

static float *randoms(size_t n, unsigned seed, float scale)
{
    float *x = malloc(n * sizeof *x + 1);
    cr_assert(x);
    srand(seed);
    for (size_t i = 0; i < n; i++) x[i] = scale * ((float)rand() / (float)RAND_MAX - 0.5f);
    return x;
}

/* Three AdamW steps of the stage against the element-wise rule: every parameter updated by
 * kernel_adamw_update_cpu, with the decay where `decayed` says, without elsewhere. */
static void check_adamw(const net_desc *net, int first, int last, float wd)
{
    stage_plan p = plan_of(net, first, last);
    size_t n = p.param_count;
    cr_assert(n > 0);
    unsigned char *decayed = calloc(n, 1);
    size_t want_decayed = 0;
    for (int i = 0; i < p.nl; i++) {
        size_t d = layer_decayed_count(&p.loc[i]);
        memset(decayed + p.param_off[i], 1, d);
        want_decayed += d;
    }
    float *param = randoms(n, 1, 2.0f), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
    float *pd = malloc(n * sizeof *pd), *md = calloc(n, sizeof *md), *vd = calloc(n, sizeof *vd);
    float *pn = malloc(n * sizeof *pn), *mn = calloc(n, sizeof *mn), *vn = calloc(n, sizeof *vn);
    memcpy(pd, param, n * sizeof *pd);
    memcpy(pn, param, n * sizeof *pn);
    long updates = 0;
    optimizer_config o = {.kind = OPTIM_ADAMW, .lr = 0.01f, .weight_decay = wd, .beta1 = 0.9f,
                          .beta2 = 0.95f, .eps = 1e-8f};
    for (int step = 1; step <= 3; step++) {
        float *grad = randoms(n, 10 + (unsigned)step, 0.1f);
        stage_optim_state st = {.params = param, .grads = grad, .m = m, .v = v, .count = n,
                                .step = &updates, .plan = &p};
        cr_assert_eq(stage_optim_step(&optim_kernels_cpu, NULL, &st, &o), 0);
        kernel_adamw_update_cpu(pd, md, vd, grad, n, o.lr, o.beta1, o.beta2, o.eps, wd, step);
        kernel_adamw_update_cpu(pn, mn, vn, grad, n, o.lr, o.beta1, o.beta2, o.eps, 0.0f, step);
        free(grad);
    }
    cr_expect_eq(updates, 3);
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float *want = decayed[i] ? pd : pn, *wm = decayed[i] ? md : mn;
        const float *wv = decayed[i] ? vd : vn;
        if (memcmp(&param[i], &want[i], sizeof(float)) || memcmp(&m[i], &wm[i], sizeof(float)) ||
            memcmp(&v[i], &wv[i], sizeof(float)))
            if (!bad++) first_bad = i;
    }
    cr_expect_eq(bad, 0, "layers %d..%d: %zu of %zu parameters differ from the element-wise "
                 "rule, the first at %zu (%s)", first, last - 1, bad, n, first_bad,
                 decayed[first_bad] ? "decayed" : "not decayed");
    /* the decay acted where it should: decayed and undecayed updates differ there */
    if (wd > 0 && want_decayed) {
        size_t moved = 0;
        for (size_t i = 0; i < n; i++) moved += decayed[i] && pd[i] != pn[i];
        cr_expect(moved > want_decayed / 2, "the decay changed only %zu of %zu values", moved,
                  want_decayed);
    }
    free(decayed);
    free(param), free(m), free(v), free(pd), free(md), free(vd), free(pn), free(mn), free(vn);
    free(p.loc);
    free(p.param_off);
}

Test(optim_step, decayed_counts_follow_nanogpt)
{
    net_desc net;
    cr_assert_eq(net_desc_parse_string(&net, GPT_TIED, "tied.cfg"), 0);
    const layer_desc *L = net.layers;
    size_t C = 16;
    cr_expect_eq(layer_decayed_count(&L[0]), 0, "embedding: none");
    cr_expect_eq(layer_decayed_count(&L[1]), 4 * C * C + 2 * C * 4 * C, "block: its matrices");
    cr_expect_eq(layer_decayed_count(&L[2]), 0, "dropout");
    cr_expect_eq(layer_decayed_count(&L[3]), 4 * C * C + 2 * C * 24, "block, hidden 24");
    cr_expect_eq(layer_decayed_count(&L[4]), 0, "layernorm: none, its gain included");
    cr_expect_eq(layer_decayed_count(&L[5]), 0, "a tied head follows the embedding: none");
    net_desc_free(&net);
    load_model(&net, "gpt-nano.cfg");
    int h = net.n_layers - 1;
    cr_expect_eq(layer_decayed_count(&net.layers[h]), net.layers[h].weight_count,
                 "an untied head decays");
    cr_expect_gt(net.layers[h].weight_count, 0);
    net_desc_free(&net);
    cr_assert_eq(net_desc_parse_string(&net, MIXED, "mixed.cfg"), 0);
    cr_expect_eq(layer_decayed_count(&net.layers[0]), 3 * 9, "conv: its filters");
    cr_expect_eq(layer_decayed_count(&net.layers[1]), 0, "maxpool");
    cr_expect_eq(layer_decayed_count(&net.layers[3]), net.layers[3].weight_count, "dense");
    net_desc_free(&net);
}

Test(optim_step, adamw_decays_only_the_matrices)
{
    net_desc net;
    cr_assert_eq(net_desc_parse_string(&net, MIXED, "mixed.cfg"), 0);
    check_adamw(&net, 0, net.n_layers, 0.1f);
    check_adamw(&net, 3, net.n_layers, 0.1f); /* a stage of the dense layers */
    check_adamw(&net, 0, net.n_layers, 0.0f);
    net_desc_free(&net);
    cr_assert_eq(net_desc_parse_string(&net, GPT_TIED, "tied.cfg"), 0);
    check_adamw(&net, 0, net.n_layers, 0.1f);
    check_adamw(&net, 2, 5, 0.1f); /* dropout, block, layernorm */
    net_desc_free(&net);
    load_model(&net, "gpt-nano.cfg");
    check_adamw(&net, 0, net.n_layers, 0.1f);
    net_desc_free(&net);
}

/* AdamW needs the stage's layers; a device without AdamW says so. */
Test(optim_step, adamw_refusals)
{
    float x[4] = {0}, g[4] = {0}, m[4] = {0}, v[4] = {0};
    long updates = 0;
    optimizer_config o = {.kind = OPTIM_ADAMW, .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
                          .eps = 1e-8f};
    stage_optim_state st = {.params = x, .grads = g, .m = m, .v = v, .count = 4,
                            .step = &updates};
    cr_expect_eq(stage_optim_step(&optim_kernels_cpu, NULL, &st, &o), -1, "no plan");
    optim_kernels none = optim_kernels_cpu;
    none.adamw = NULL;
    net_desc net;
    cr_assert_eq(net_desc_parse_string(&net, MIXED, "mixed.cfg"), 0);
    stage_plan p = plan_of(&net, 4, 5);
    float *big = calloc(4 * p.param_count, sizeof *big);
    st = (stage_optim_state){.params = big, .grads = big + p.param_count,
                             .m = big + 2 * p.param_count, .v = big + 3 * p.param_count,
                             .count = p.param_count, .step = &updates, .plan = &p};
    cr_expect_eq(stage_optim_step(&none, NULL, &st, &o), -1, "a device without AdamW");
    cr_expect_eq(stage_optim_step(&optim_kernels_cpu, NULL, &st, &o), 0);
    free(big);
    free(p.loc);
    free(p.param_off);
    net_desc_free(&net);
}

Test(optim_step, names)
{
    cr_expect_str_eq(optimizer_kind_name(OPTIM_SGD), "sgd");
    cr_expect_str_eq(optimizer_kind_name(OPTIM_MOMENTUM), "momentum");
    cr_expect_str_eq(optimizer_kind_name(OPTIM_ADAM), "adam");
    cr_expect_str_eq(optimizer_kind_name(OPTIM_ADAMW), "adamw");
    cr_expect(optimizer_is_adam(OPTIM_ADAMW) && optimizer_is_adam(OPTIM_ADAM));
    cr_expect(!optimizer_is_adam(OPTIM_MOMENTUM));
}
