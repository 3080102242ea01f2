/* The new schedules' operations on the CUDA engine over the mock runtime: the zero-bubble
 * split (backward_input, backward_weight), recomputation (recompute) and batched weight
 * gradients (wgrad_rows), each against the CPU engine with the same configuration and
 * the same calls, bit for bit, as one stage and as 2-stage pipelines; and B then W against
 * the fused backward, recomputation against none.
 *
 * Part of test_engine_cuda_mock (#included by test_engine_cuda_mock.c, whose helpers it
 * uses: the test's target lists its sources in cmake/cuda.cmake). */

/* How a step's backward phase runs on every stage. */
typedef struct {
    int split;     /* B and W apart (split_backward) */
    int order;     /* split: 0 W(m) right after B(m); 1 every B, then every W; 2 B(m) then
                      W(m − 1), as zb-h1's steady state */
    int wmode;     /* W's layer ranges, as range_mode: 0 all layers at once, 1 one per
                      layer, 2 two halves, 3 the top layer then the others */
    int recompute; /* the training forward drops its activations; recompute(m) before B */
    int wgrad;     /* batched weight gradients over the step's MB · M rows */
    int pieces;    /* grad_pieces */
    int slots;     /* activation slots */
} sched_case;

enum { T_F = 0, T_R = M, T_B = 2 * M, T_W = 3 * M, T_STEP = 4 * M, T_COUNT = 4 * M + 1 };

static engine_config sched_config(const net_desc *net, int first, int last, int dm,
                                  const sched_case *k)
{
    engine_config c = config(net, first, last, dm, k->slots);
    c.max_ticks = T_COUNT;
    c.microbatches = M;
    c.split_backward = k->split;
    c.recompute = k->recompute;
    c.wgrad_rows = k->wgrad ? MB * M : 0;
    c.grad_pieces = k->pieces;
    return c;
}

/* B of m (or the whole backward without the split), after its recomputation. */
static void sched_b(engine *e, const sched_case *k, int m, uint64_t step)
{
    if (k->recompute) MUST(engine_recompute(e, m, 7, step, T_R + m));
    if (k->split) MUST(engine_backward_input(e, m, T_B + m));
    else do_backward(e, m, T_B + m);
}

/* W of m by k->wmode's ranges (nothing without the split), then the release. */
static void sched_w(engine *e, const sched_case *k, int m)
{
    int nl = e->cfg.last - e->cfg.first;
    for (int hi = nl, lo; k->split && hi > 0; hi = lo) {
        lo = k->wmode ? next_lo(k->wmode, nl, hi) : 0;
        MUST(engine_backward_weight(e, m, lo, hi, T_W + m));
    }
    MUST(engine_release(e, m));
}

/* Stage i's backward phase; GRAD_IN of m arrives from E[i + 1] just before B(m). */
static void sched_backward(engine **E, int S, int i, const sched_case *k, uint64_t step,
                           void *grad_in[][M])
{
    engine *e = E[i];
    for (int m = 0; m < M; m++) {
        if (i < S - 1) {
            deliver(E[i + 1], ENGINE_MSG_GRAD_OUT, m, grad_in[i][m], MB * e->out_count);
            MUST(engine_msg_received(e, ENGINE_MSG_GRAD_IN, m));
        }
        sched_b(e, k, m, step);
        if (i > 0) MUST(engine_msg_prepare(e, ENGINE_MSG_GRAD_OUT, m));
        if (!k->split || k->order == 0) sched_w(e, k, m);
        else if (k->order == 2 && m > 0) sched_w(e, k, m - 1);
    }
    if (k->split && k->order == 1)
        for (int m = 0; m < M; m++) sched_w(e, k, m);
    if (k->split && k->order == 2) sched_w(e, k, M - 1);
}

/* S stages (S = 1: one engine holding the net) through STEPS training steps: every
 * forward of a stage, then the next stage's; backward phases from the last stage down. */
static void sched_run(engine **E, int S, const sched_case *k, const dataset *tr, outcome *o)
{
    int64_t ids[MB * M];
    void *act_in[SMAX][M], *grad_in[SMAX][M];
    memset(o, 0, sizeof *o);
    for (int i = 0; i < S; i++) MUST(engine_init_params(E[i], 42));
    for (int s = 0; s < STEPS; s++) {
        for (int j = 0; j < MB * M; j++) ids[j] = (s * 29 + j * 7) % tr->count;
        for (int i = 0; i < S; i++)
            for (int m = 0; m < M; m++) {
                if (i > 0 && !(act_in[i][m] = engine_msg_buffer(E[i], ENGINE_MSG_ACT_IN, m)))
                    MUST(-1);
                if (i < S - 1 &&
                    !(grad_in[i][m] = engine_msg_buffer(E[i], ENGINE_MSG_GRAD_IN, m)))
                    MUST(-1);
                MUST(engine_load(E[i], m, tr, ids + m * MB, MB));
            }
        for (int i = 0; i < S; i++)
            for (int m = 0; m < M; m++) {
                if (i > 0) {
                    deliver(E[i - 1], ENGINE_MSG_ACT_OUT, m, act_in[i][m], MB * E[i]->in_count);
                    MUST(engine_msg_received(E[i], ENGINE_MSG_ACT_IN, m));
                }
                MUST(engine_forward(E[i], m, MB, 7, (uint64_t)s, 1, T_F + m));
                if (i < S - 1) MUST(engine_msg_prepare(E[i], ENGINE_MSG_ACT_OUT, m));
            }
        for (int i = S - 1; i >= 0; i--) sched_backward(E, S, i, k, (uint64_t)s, grad_in);
        for (int i = 0; i < S; i++) MUST(engine_step(E[i], &adam, T_STEP));
        /* legal: finish is only needed to read (the next step's copies in then wait on
         * this step's work through the engine's events alone) */
        if (!finish_each_step && s < STEPS - 1) continue;
        for (int i = 0; i < S; i++) {
            engine_result r;
            MUST(engine_finish(E[i], &r));
            if (i == S - 1) o->loss[s] = r.loss_sum, o->correct[s] = r.correct;
        }
    }
    for (int i = 0; i < S; i++) {
        MUST(engine_read_params(E[i], o->params + o->P));
        o->P += E[i]->param_count;
    }
}

/* The case on S stages cut at cuts[], on the CPU (cuda = 0) or the CUDA engine. */
static void sched_outcome(const net_desc *net, const sched_case *k, const int *cuts, int S,
                          int dm, int cuda, const dataset *tr, outcome *o)
{
    engine *E[SMAX];
    for (int i = 0; i < S; i++) {
        engine_config c = sched_config(net, cuts[i], cuts[i + 1], dm, k);
        if (cuda) MUST(engine_cuda_create(&E[i], &c));
        else MUST(engine_create(&E[i], ENGINE_CPU, &c));
    }
    sched_run(E, S, k, tr, o);
    for (int i = 0; i < S; i++) engine_destroy(E[i]);
}

static void sched_name(char *buf, size_t n, int net_k, const sched_case *k)
{
    snprintf(buf, n, "net %d split %d order %d W %d recompute %d wgrad %d pieces %d slots %d",
             net_k, k->split, k->order, k->wmode, k->recompute, k->wgrad, k->pieces, k->slots);
}

/* Every case against the CPU engine: one stage in each mock mode, then 2-stage pipelines
 * cut at every layer (random mode; device and host messages, and steps with and without a
 * finish between them, in turn). */
static void sched_cases(const net_desc *net, int net_k, const dataset *tr, int pipelines)
{
    static const sched_case cases[] = {
        {.split = 1, .order = 0, .wmode = 0, .slots = M},
        {.split = 1, .order = 1, .wmode = 1, .slots = M},
        {.split = 1, .order = 2, .wmode = 2, .slots = M},
        {.recompute = 1, .slots = 1},
        {.recompute = 1, .split = 1, .order = 0, .wmode = 3, .slots = 1},
        {.recompute = 1, .split = 1, .order = 1, .wmode = 0, .slots = M},
        {.wgrad = 1, .slots = M},
        {.wgrad = 1, .split = 1, .order = 2, .wmode = 1, .slots = M},
        {.wgrad = 1, .recompute = 1, .split = 1, .order = 0, .wmode = 2, .slots = 2},
        {.pieces = 2, .split = 1, .order = 1, .wmode = 2, .slots = M},
    };
    static outcome ref, plain, x;
    char what[192];
    int whole[] = {0, net->n_layers};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const sched_case *k = &cases[c];
        sched_outcome(net, k, whole, 1, 0, 0, tr, &ref);
        /* B then W is the fused backward, recomputing is not recomputing, bit for bit
         * (on the CPU engine; the CUDA engine then agrees with both) */
        sched_case base = {.wgrad = k->wgrad, .pieces = k->pieces, .slots = M};
        sched_outcome(net, &base, whole, 1, 0, 0, tr, &plain);
        sched_name(what, sizeof what, net_k, k);
        compare(&plain, &ref, what);
        for (int mode = 0; mode < 3; mode++) {
            mock_mode = mode;
            mock_seed = 3 + (unsigned)c;
            range_mode = mode; /* the fused backward (cases without the split) by ranges */
            sched_outcome(net, k, whole, 1, 0, 1, tr, &x);
            sched_name(what, sizeof what, net_k, k);
            snprintf(what + strlen(what), sizeof what - strlen(what), ", mock mode %d", mode);
            compare(&ref, &x, what);
            compare(&plain, &x, what);
        }
        range_mode = 0;
        if (!pipelines || k->pieces) continue; /* pieces: the one-stage lockstep only */
        mock_mode = 2;
        for (int split = 1; split < net->n_layers; split++) {
            int cuts[] = {0, split, net->n_layers};
            mock_seed = 11 + (unsigned)split;
            finish_each_step = !(split & 2);
            sched_outcome(net, k, cuts, 2, split & 1, 1, tr, &x);
            sched_name(what, sizeof what, net_k, k);
            snprintf(what + strlen(what), sizeof what - strlen(what), ", 2 stages cut at %d, "
                     "dm %d%s", split, split & 1, finish_each_step ? "" : ", no finish");
            compare(&ref, &x, what);
            finish_each_step = 1;
        }
    }
    /* the comparisons can fail: batched weight gradients round differently from
     * per-micro-batch ones, and the CUDA engine's batched run differs from the CPU's
     * unbatched one */
    sched_case batched = {.wgrad = 1, .slots = M}, unbatched = {.slots = M};
    sched_outcome(net, &unbatched, whole, 1, 0, 0, tr, &ref);
    sched_outcome(net, &batched, whole, 1, 0, 1, tr, &x);
    int same = 1;
    for (size_t i = 0; i < ref.P; i++) same &= !memcmp(&ref.params[i], &x.params[i], sizeof(float));
    EXPECT(!same, "net %d: batched weight gradients gave the unbatched bits: the batched "
           "comparison is blind", net_k);
}

/* Misuse of the new operations gets a message; what recompute gives back is usable. */
static void sched_errors(const net_desc *net, const dataset *tr)
{
    int64_t ids[MB] = {0, 1, 2, 3, 4, 5, 6, 7};
    int nl = net->n_layers;
    engine *e;
    sched_case plain = {.slots = 2};
    engine_config c = sched_config(net, 0, nl, 0, &plain);
    MUST(engine_cuda_create(&e, &c));
    MUST(engine_load(e, 0, tr, ids, MB));
    MUST(engine_forward(e, 0, MB, 0, 0, 1, -1));
    EXPECT(engine_backward_input(e, 0, -1) != 0, "B without split_backward");
    EXPECT(engine_backward_weight(e, 0, 0, nl, -1) != 0, "W without split_backward");
    EXPECT(engine_recompute(e, 0, 0, 0, -1) != 0, "recompute without recompute");
    EXPECT(engine_release(e, 1) != 0, "release without a slot, not recomputing");
    engine_destroy(e);

    sched_case split = {.split = 1, .slots = 2};
    c = sched_config(net, 0, nl, 0, &split);
    MUST(engine_cuda_create(&e, &c));
    for (int m = 0; m < 2; m++) MUST(engine_load(e, m, tr, ids, MB));
    EXPECT(engine_backward_input(e, 0, -1) != 0, "B before the forward");
    MUST(engine_forward(e, 0, MB, 0, 0, 1, -1));
    MUST(engine_forward(e, 1, MB, 0, 0, 1, -1));
    EXPECT(engine_backward_weight(e, 0, 0, nl, -1) != 0, "W before B");
    EXPECT(strstr(pt_error_get(), "before its backward_input") != NULL, "message: %s",
           pt_error_get());
    MUST(engine_backward_range(e, 1, nl - 1, nl, -1));
    EXPECT(engine_backward_input(e, 0, -1) != 0, "B during a backward by ranges");
    MUST(engine_backward_range(e, 1, 0, nl - 1, -1));
    MUST(engine_backward_input(e, 0, -1));
    EXPECT(engine_backward_weight(e, 0, 0, nl + 1, -1) != 0, "W past the stage");
    EXPECT(engine_backward_weight(e, 0, 1, 1, -1) != 0, "W of no layers");
    MUST(engine_backward_weight(e, 0, 0, nl, -1));
    for (int m = 0; m < 2; m++) MUST(engine_release(e, m));
    MUST(engine_forward(e, 0, MB, 0, 0, 0, -1));
    EXPECT(engine_backward_input(e, 0, -1) != 0, "B after an evaluation forward");
    engine_result r;
    MUST(engine_finish(e, &r));
    engine_destroy(e);

    /* recompute with one slot: the training forwards give it back at once */
    sched_case rec = {.recompute = 1, .slots = 1};
    c = sched_config(net, 0, nl, 0, &rec);
    MUST(engine_cuda_create(&e, &c));
    for (int m = 0; m < 3; m++) MUST(engine_load(e, m, tr, ids, MB));
    EXPECT(engine_recompute(e, 0, 7, 0, -1) != 0, "recompute before a forward");
    MUST(engine_forward(e, 0, MB, 7, 0, 1, -1));
    MUST(engine_forward(e, 1, MB, 7, 0, 1, -1)); /* the one slot is free again */
    MUST(engine_release(e, 1));                  /* a no-op: engine.h */
    MUST(engine_recompute(e, 0, 7, 0, -1));
    EXPECT(engine_recompute(e, 0, 7, 0, -1) != 0, "recompute of a buffer holding its slot");
    EXPECT(engine_recompute(e, 1, 7, 0, -1) != 0, "recompute with every slot in use");
    MUST(engine_backward(e, 0, -1));
    MUST(engine_release(e, 0));
    MUST(engine_forward(e, 2, MB, 0, 0, 0, -1)); /* evaluation: keeps its slot */
    EXPECT(engine_forward(e, 0, MB, 0, 0, 0, -1) != 0, "an evaluation forward keeps its slot");
    MUST(engine_release(e, 2));
    EXPECT(engine_recompute(e, 2, 7, 0, -1) != 0, "recompute after an evaluation forward");
    MUST(engine_finish(e, &r));
    engine_destroy(e);

    /* batched weight gradients form one gradient per step, not one per piece */
    sched_case bad = {.wgrad = 1, .pieces = 2, .slots = 1};
    c = sched_config(net, 0, nl, 0, &bad);
    EXPECT(engine_cuda_create(&e, &c) != 0 && e == NULL, "wgrad with gradient pieces");
    c.wgrad_rows = 0;
    c.microbatches = 0;
    c.recompute = 1;
    EXPECT(engine_cuda_create(&e, &c) != 0 && e == NULL, "recompute without M");
}

/* Work queued late that still reads m's input (recompute, W) must finish before a new
 * ACT_IN or new samples of m are copied in. A stage after the first whose first layer has
 * parameters (so W reads the input), lazy mock streams: each engine forwards two
 * micro-batches, queues their recompute, B and W, and at once receives the next inputs
 * into the same buffers and loads other samples; the CPU engine,
 * synchronous, shows what the queued work must have read. */
static void fill_act(float *dst, size_t count, unsigned seed)
{
    for (size_t i = 0; i < count; i++) {
        seed = seed * 1664525u + 1013904223u;
        dst[i] = (float)(seed >> 8) / 8388608.0f - 1.0f;
    }
}

/* Round 0 forwards m = 0, 1 from new samples and inputs; round 1 only brings new ones.
 * The first of the two copies queued on the h2d stream must wait: load_first picks it. */
static void late_inputs(engine *e, const dataset *tr, int round, int load_first)
{
    int64_t ids[MB];
    for (int m = 0; m < 2; m++) {
        for (int j = 0; j < MB; j++) ids[j] = (round * 31 + m * 11 + j * 5) % tr->count;
        if (load_first) MUST(engine_load(e, m, tr, ids, MB));
        float *in = engine_msg_buffer(e, ENGINE_MSG_ACT_IN, m);
        if (!in) MUST(-1);
        fill_act(in, MB * e->in_count, 100 * (unsigned)round + (unsigned)m);
        MUST(engine_msg_received(e, ENGINE_MSG_ACT_IN, m));
        if (!load_first) MUST(engine_load(e, m, tr, ids, MB));
        if (round == 0) MUST(engine_forward(e, m, MB, 7, 0, 1, -1));
    }
}

static void sched_late_readers(const net_desc *net, int net_k, const dataset *tr)
{
    static const sched_case cases[] = {
        {.split = 1, .slots = 2},
        {.recompute = 1, .split = 1, .wmode = 1, .slots = 2},
        {.recompute = 1, .slots = 2},
    };
    static float params[2][MAXP];
    int nl = net->n_layers, first = 1;
    while (first < nl - 1 && !net->layers[first].weight_count) first++; /* W reads its input */
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int dm = 0; dm < 2; dm++)
            for (unsigned seed = 1; seed <= 4; seed++) {
                const sched_case *k = &cases[c];
                mock_mode = 1;
                mock_seed = seed;
                size_t P = 0;
                for (int cuda = 0; cuda < 2; cuda++) {
                    engine *e;
                    engine_config cfg = sched_config(net, first, nl, dm, k);
                    if (cuda) MUST(engine_cuda_create(&e, &cfg));
                    else MUST(engine_create(&e, ENGINE_CPU, &cfg));
                    MUST(engine_init_params(e, 42));
                    late_inputs(e, tr, 0, 1);
                    for (int m = 0; m < 2; m++) {
                        sched_b(e, k, m, 0);
                        sched_w(e, k, m);
                    }
                    late_inputs(e, tr, 1, seed & 1);
                    MUST(engine_step(e, &sgd, -1));
                    engine_result r;
                    MUST(engine_finish(e, &r));
                    P = e->param_count;
                    MUST(engine_read_params(e, params[cuda]));
                    engine_destroy(e);
                }
                size_t bad = 0;
                for (size_t q = 0; q < P; q++)
                    bad += memcmp(&params[0][q], &params[1][q], sizeof(float)) != 0;
                char what[192];
                sched_name(what, sizeof what, net_k, k);
                EXPECT(!bad, "late readers, %s, dm %d, seed %u: %zu of %zu parameters differ",
                       what, dm, seed, bad, P);
            }
}

/* A net whose dense layer spans three of the batched gradient's tiles of 512 units. */
static void sched_wide_net(void)
{
    net_desc net;
    MUST(net_desc_parse_string(&net,
                               "[net]\ninput=1,4,4\n"
                               "[dense]\nunits=1100\nactivation=relu\n"
                               "[dropout]\np=0.25\n"
                               "[dense]\nunits=3\nactivation=linear\n",
                               "wide"));
    dataset tr = make_data(64, 4, 3, 17);
    sched_cases(&net, 2, &tr, 1);
    data_free(&tr);
    net_desc_free(&net);
}
