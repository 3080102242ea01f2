#include "src/plan/predict.h"

#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/cpu/stage.h"

void plan_tensor_cost(const shard_traffic *tr, int T, double microbatch, double alpha,
                      double beta, double *fwd, double *bwd)
{
    *fwd = *bwd = 0;
    if (T < 2) return;
    double f = (T - 1.0) / T, bytes = 4.0 * microbatch;
    *fwd = f * tr->fwd_gather * bytes / beta + tr->fwd_gathers * (T - 1.0) * alpha +
           2 * f * tr->fwd_reduce * bytes / beta + tr->fwd_reduces * 2 * (T - 1.0) * alpha;
    *bwd = f * tr->bwd_gather * bytes / beta + tr->bwd_gathers * (T - 1.0) * alpha +
           2 * f * tr->bwd_reduce * bytes / beta + tr->bwd_reduces * 2 * (T - 1.0) * alpha;
}

void plan_tensor_sent(const shard_traffic *tr, int T, double microbatch, double *bytes,
                      double *messages)
{
    *bytes = *messages = 0;
    if (T < 2) return;
    double f = (T - 1.0) / T;
    *bytes = 4.0 * microbatch *
             (f * (double)(tr->fwd_gather + tr->bwd_gather) +
              2 * f * (double)(tr->fwd_reduce + tr->bwd_reduce));
    *messages = (T - 1.0) * (tr->fwd_gathers + tr->bwd_gathers) +
                2 * (T - 1.0) * (tr->fwd_reduces + tr->bwd_reduces);
}

double plan_tensor_share(const shard_plan *p, int l)
{
    if (!p || p->T < 2) return 1;
    const shard_layer *sl = &p->layers[l];
    /* cut by outputs or inputs, or a layer without parameters on a sharded vector */
    if (sl->split != SHARD_NONE || sl->in.sharded) return 1.0 / p->T;
    return 1;
}

/* The largest share of layers [first, last)'s parameters a tensor rank holds (1 without
 * shards or parameters). */
static double param_share(const shard_plan *p, const net_desc *net, int first, int last)
{
    if (!p || p->T < 2) return 1;
    size_t whole = 0, most = 0;
    for (int l = first; l < last; l++)
        whole += net->layers[l].weight_count + net->layers[l].bias_count;
    for (int t = 0; t < p->T; t++) {
        size_t n = shard_param_count(p, net, first, last, t);
        if (n > most) most = n;
    }
    return whole ? (double)most / (double)whole : 1;
}

double plan_zero3_pass_s(const net_desc *net, int first, int last, const double *compute,
                         double scale, double share, int R, double alpha, double beta,
                         int in_waits, int backward)
{
    if (R < 2) return 0;
    double waited = 0, window = 0;
    int seen = 0;
    for (int i = 0; i < last - first; i++) {
        int l = backward ? last - 1 - i : first + i;
        double n = (double)(net->layers[l].weight_count + net->layers[l].bias_count) * share;
        if (n > 0) {
            double g = (R - 1.0) * alpha + (R - 1.0) / R * 4.0 * n / beta;
            double hidden = seen && !in_waits ? window : 0;
            waited += g > hidden ? g - hidden : 0;
            seen = 1;
            window = 0;
        }
        window += compute[l] * scale;
    }
    return waited;
}

void plan_prediction_free(plan_prediction *p)
{
    free(p->busy_s);
    schedule_free(&p->sched);
    *p = (plan_prediction){0};
}

int plan_schedule(schedule *s, const char *name, int stages, int virtual_stages,
                  int microbatches, const int *recompute)
{
    if (schedule_init_named(s, name, stages, virtual_stages > 1 ? virtual_stages : 1,
                            microbatches))
        return -1;
    int any = 0;
    for (int k = 0; recompute && k < stages; k++) any |= recompute[k] != 0;
    if (any && schedule_add_recompute(s, recompute)) {
        schedule_free(s);
        return -1;
    }
    return 0;
}

/* 1 when rank s's list splits backwards into B and W (zero bubble). */
static int list_splits(const schedule *s, int st)
{
    const schedule_list *l = &s->lists[st];
    for (int i = 0; i < l->n_ops; i++)
        if (l->ops[i].kind == SCHED_OP_BACKWARD_INPUT) return 1;
    return 0;
}

/* Per model chunk (per stage when V = 1): the profile's forward, backward and split
 * backward of one micro-batch, and (R > 1, V = 1) each stage's buckets' bytes and each
 * backward part's share of the backward (of W on a split list). */
typedef struct {
    double *fwd, *bwd, *bin, *bw; /* one block, 4·C; bin, bw NULL without a split profile */
    double *tfwd, *tbwd;          /* per chunk: its tensor collectives (in fwd, bwd), 2·C */
    double *zfwd, *zbwd;          /* per chunk: ZeRO-3's gather waits (in fwd, bwd), 2·C */
    double **bytes, **share;      /* [K][buckets], NULL rows for stages without buckets */
} chunk_costs;

static void chunk_costs_free(chunk_costs *c, int K)
{
    for (int s = 0; s < K && c->bytes; s++) free(c->bytes[s]);
    for (int s = 0; s < K && c->share; s++) free(c->share[s]);
    free(c->bytes);
    free(c->share);
    free(c->fwd);
}

/* ZeRO-3: chunk k's gathers (on stage s's link) where they are not hidden, added to its
 * forward (and so to a recomputation, priced as the forward), backward, and B and W each
 * (a split backward gathers before both). */
static void zero3_costs(chunk_costs *c, int k, int s, const net_desc *net, int first, int last,
                        const partition_profile *prof, const plan_predict_config *cfg,
                        double share, int split)
{
    const shard_plan *sp = cfg->shard && cfg->shard->T > 1 ? cfg->shard : NULL;
    /* the profile's per-sample times, as chunk_costs_init scales them (the tensor share
     * of each layer left out: a layer's compute hides its neighbour's gather roughly) */
    double mb = cfg->microbatch / (sp && !cfg->shard_profile ? (double)sp->T : 1.0);
    int R = cfg->rep.replicas, w = cfg->reduce_in_waits || !cfg->zero3_prefetch;
    double a = cfg->alpha ? cfg->alpha[s] : 0, b = cfg->beta ? cfg->beta[s] : 1e300;
    double f = plan_zero3_pass_s(net, first, last, prof->fwd_s, mb, share, R, a, b, w, 0);
    c->fwd[k] += f;
    c->zfwd[k] = f;
    double g = plan_zero3_pass_s(net, first, last, prof->bwd_s, mb, share, R, a, b, w, 1);
    c->bwd[k] += g;
    c->zbwd[k] = g;
    if (split) {
        c->bin[k] += plan_zero3_pass_s(net, first, last, prof->bwd_input_s, mb, share, R, a, b,
                                       w, 1);
        c->bw[k] += plan_zero3_pass_s(net, first, last, prof->bwd_weight_s, mb, share, R, a,
                                      b, w, 1);
    }
}

/* V > 1: each rank's buckets, its chunks' one after the other (replicas_schedule's order),
 * each chunk's bytes its tensor rank's share; the backwards stay whole, so no part shares;
 * ZeRO-3's gathers on each chunk's passes. */
static int chunk_buckets(chunk_costs *c, const net_desc *net, const partition *part,
                         const partition_profile *prof, const plan_predict_config *cfg,
                         const schedule *sched, int split)
{
    const shard_plan *sp = cfg->shard && cfg->shard->T > 1 ? cfg->shard : NULL;
    int K = sched->stages, V = sched->virtual_stages;
    for (int s = 0; s < K; s++) {
        int n, *chunk_of;
        if (replicas_rank_bucket_bytes(sched, net, part, &cfg->rep, s, &c->bytes[s], &n,
                                       &chunk_of))
            return -1;
        for (int b = 0; b < n; b++) {
            int k = schedule_model_chunk(sched, s, chunk_of[b]);
            c->bytes[s][b] *= param_share(sp, net, part->first[k], part->first[k + 1]);
        }
        free(chunk_of);
        for (int v = 0; cfg->zero >= 3 && v < V; v++) {
            int k = schedule_model_chunk(sched, s, v);
            zero3_costs(c, k, s, net, part->first[k], part->first[k + 1], prof, cfg,
                        param_share(sp, net, part->first[k], part->first[k + 1]), split);
        }
    }
    return 0;
}

static int chunk_costs_init(chunk_costs *c, const net_desc *net, const partition *part,
                            const partition_profile *prof, const plan_predict_config *cfg,
                            const schedule *sched)
{
    int C = part->stages, K = sched->stages;
    double mb = cfg->microbatch;
    *c = (chunk_costs){0};
    c->fwd = calloc(8 * (size_t)C, sizeof *c->fwd);
    c->bytes = calloc((size_t)K, sizeof *c->bytes);
    c->share = calloc((size_t)K, sizeof *c->share);
    if (!c->fwd || !c->bytes || !c->share) return pt_error_set("out of memory");
    c->bwd = c->fwd + C;
    c->tfwd = c->fwd + 4 * C;
    c->tbwd = c->fwd + 5 * C;
    c->zfwd = c->fwd + 6 * C;
    c->zbwd = c->fwd + 7 * C;
    const shard_plan *sp = cfg->shard && cfg->shard->T > 1 ? cfg->shard : NULL;
    int split = prof->bwd_input_s && prof->bwd_weight_s;
    if (split) {
        c->bin = c->fwd + 2 * C;
        c->bw = c->fwd + 3 * C;
    }
    for (int k = 0; k < C; k++) {
        for (int l = part->first[k]; l < part->first[k + 1]; l++) {
            double f = (cfg->shard_profile ? 1 : plan_tensor_share(sp, l)) * mb;
            c->fwd[k] += prof->fwd_s[l] * f;
            c->bwd[k] += prof->bwd_s[l] * f;
            if (split) {
                c->bin[k] += prof->bwd_input_s[l] * f;
                c->bw[k] += prof->bwd_weight_s[l] * f;
            }
        }
        if (!sp) continue;
        /* the chunk's collectives on its rank's tensor link; the input gradient's ones
         * belong to B where the backward splits */
        shard_traffic tr = shard_stage_traffic(sp, net, part->first[k], part->first[k + 1],
                                               k == 0);
        int s;
        schedule_chunk_place(K, sched->virtual_stages, sched->placement, k, &s, NULL);
        plan_tensor_cost(&tr, sp->T, mb, cfg->tensor_alpha ? cfg->tensor_alpha[s] : 0,
                         cfg->tensor_beta ? cfg->tensor_beta[s] : 1e300, &c->tfwd[k],
                         &c->tbwd[k]);
        c->fwd[k] += c->tfwd[k];
        c->bwd[k] += c->tbwd[k];
        if (split) c->bin[k] += c->tbwd[k];
    }
    if (cfg->rep.replicas < 2) return 0;
    if (sched->virtual_stages > 1) return chunk_buckets(c, net, part, prof, cfg, sched, split);
    for (int s = 0; s < K; s++) {
        int first = part->first[s], last = part->first[s + 1];
        /* a split list's parts are W's: their shares are of the weight gradients */
        const double *per_layer = split && list_splits(sched, s) ? prof->bwd_weight_s
                                                                 : prof->bwd_s;
        double whole = 0;
        for (int l = first; l < last; l++) whole += per_layer[l];
        reduce_plan plan;
        if (replicas_plan(&plan, net, first, last, &cfg->rep)) return -1;
        int B = plan.n_buckets;
        /* each tensor rank reduces its shards only: the largest rank's share */
        double share = param_share(sp, net, first, last);
        c->bytes[s] = malloc((size_t)B * sizeof **c->bytes + 1);
        c->share[s] = malloc((size_t)B * sizeof **c->share + 1);
        if (!c->bytes[s] || !c->share[s]) {
            reduce_plan_free(&plan);
            return pt_error_set("out of memory");
        }
        for (int b = 0; b < B; b++) {
            int lo, hi;
            double t = 0;
            replicas_plan_part_range(&plan, last - first, b, &lo, &hi);
            for (int l = lo; l < hi; l++) t += per_layer[first + l];
            c->bytes[s][b] = (double)plan.buckets[b].count * sizeof(float) * share;
            c->share[s][b] = whole > 0 ? t / whole : 1.0 / B;
        }
        /* the shares must sum to 1 exactly (the simulator checks): give the rounding to
         * the last part */
        double sum = 0;
        for (int b = 0; b + 1 < B; b++) sum += c->share[s][b];
        if (B) c->share[s][B - 1] = sum < 1 ? 1 - sum : 0;
        reduce_plan_free(&plan);
        if (cfg->zero >= 3) zero3_costs(c, s, s, net, first, last, prof, cfg, share, split);
    }
    return 0;
}

/* Replaces *sched (a named schedule of the right placement, no reductions) by the search's
 * result at c's costs (B and W half of the backward each without a split profile), with
 * cfg's recomputation (priced in the search). */
static int search_at_costs(schedule *sched, const chunk_costs *c, int C, double msg,
                           const plan_predict_config *cfg)
{
    double *half = NULL;
    const double *bin = c->bin, *bw = c->bw;
    if (!bin || !bw) {
        half = malloc((size_t)C * sizeof *half);
        if (!half) return pt_error_set("out of memory");
        for (int k = 0; k < C; k++) half[k] = c->bwd[k] / 2;
        bin = bw = half;
    }
    /* a chunk without parameters has no W (and may have no cost at all): the search
     * needs costs > 0 */
    double *f = malloc(4 * (size_t)C * sizeof *f);
    if (!f) {
        free(half);
        return pt_error_set("out of memory");
    }
    for (int k = 0; k < C; k++) {
        f[k] = c->fwd[k] > 1e-12 ? c->fwd[k] : 1e-12;
        f[C + k] = bin[k] > 1e-12 ? bin[k] : 1e-12;
        f[2 * C + k] = bw[k] > 1e-12 ? bw[k] : 1e-12;
        f[3 * C + k] = c->bwd[k] > 1e-12 ? c->bwd[k] : 1e-12;
    }
    schedule_search_config sc = {.stages = sched->stages, .microbatches = sched->microbatches,
                                 .virtual_stages = sched->virtual_stages, .fwd = f,
                                 .bwd_input = f + C, .bwd_weight = f + 2 * C,
                                 .bwd = f + 3 * C, .comm = msg,
                                 .memory = cfg->schedule_memory, .max_runs = cfg->search_runs,
                                 .recompute = cfg->recompute};
    schedule found;
    int rc = schedule_search(&found, &sc, NULL);
    free(f);
    free(half);
    if (rc) return -1;
    schedule_free(sched);
    *sched = found;
    return 0;
}

int plan_predict(plan_prediction *out, const net_desc *net, const partition *part,
                 const partition_profile *prof, const plan_predict_config *cfg)
{
    *out = (plan_prediction){0};
    int V = cfg->virtual_stages > 1 ? cfg->virtual_stages : 1;
    int C = part->stages, K = C / V;
    if (prof->n_layers != net->n_layers)
        return pt_error_set("plan_predict: a profile of %d layers for a model of %d",
                            prof->n_layers, net->n_layers);
    if (C % V)
        return pt_error_set("plan_predict: %d model chunks do not make %d per rank", C, V);
    schedule sched;
    int search = !strcmp(cfg->schedule, "search");
    /* a search needs the chunks' costs first: priced under a schedule of its placement */
    const char *named = !search ? cfg->schedule : V > 1 && V % 2 == 0 ? "zb-v"
                                                : V > 1 ? "interleaved" : "zb-h1";
    if (plan_schedule(&sched, named, K, V, cfg->rep.microbatches, search ? NULL : cfg->recompute))
        return -1;
    chunk_costs c = {0};
    int rc = (!search && replicas_schedule(&sched, net, part, &cfg->rep)) ||
             chunk_costs_init(&c, net, part, prof, cfg, &sched);
    /* the slowest boundary prices every message (the simulator has one message cost) */
    double msg = 0;
    for (int k = 0; !rc && cfg->message_s && k + 1 < C; k++)
        if (cfg->message_s[k] > msg) msg = cfg->message_s[k];
    if (!rc && search) {
        rc = search_at_costs(&sched, &c, C, msg, cfg);
        /* the winner's placement may differ: its chunks' costs (and buckets) again */
        chunk_costs_free(&c, K);
        c = (chunk_costs){0};
        rc = rc || replicas_schedule(&sched, net, part, &cfg->rep) ||
             chunk_costs_init(&c, net, part, prof, cfg, &sched);
    }
    schedule_sim sim;
    if (!rc) {
        schedule_costs sc = {
            .fwd = c.fwd, .bwd = c.bwd, .bwd_input = c.bin, .bwd_weight = c.bw,
            .recompute = NULL, /* = fwd */
            .comm_cost = msg, .step_cost = 0,
            .replicas = cfg->rep.replicas, .alpha = 0, .beta = 1,
            .alpha_stage = cfg->alpha, .beta_stage = cfg->beta,
            .bucket_bytes = (const double *const *)c.bytes,
            .part_share = (const double *const *)c.share,
            /* a reduction waited for as it starts (--zero-overlap off) hides behind no
             * compute either: priced as one that progresses only in the waits */
            .reduce_in_waits = cfg->reduce_in_waits || cfg->rep.zero_serial,
        };
        rc = schedule_simulate_costs(&sched, &sc, &sim);
    }
    if (!rc) {
        out->busy_s = calloc(5 * (size_t)K, sizeof *out->busy_s);
        if (!out->busy_s) {
            rc = pt_error_set("out of memory");
        } else {
            out->reduce_s = out->busy_s + K;
            out->exposed_s = out->busy_s + 2 * K;
            out->tensor_s = out->busy_s + 3 * K;
            out->zero3_s = out->busy_s + 4 * K;
            out->step_s = sim.makespan;
            out->bubble = sim.bubble;
            for (int s = 0; s < K; s++) {
                out->busy_s[s] = sim.busy[s];
                out->reduce_s[s] = sim.reduce[s];
                out->exposed_s[s] = sim.exposed[s];
            }
            /* every micro-batch's collectives, the forward's twice where it recomputes */
            for (int k = 0; k < C; k++) {
                int s;
                schedule_chunk_place(K, sched.virtual_stages, sched.placement, k, &s, NULL);
                int again = cfg->recompute && cfg->recompute[s];
                out->tensor_s[s] += cfg->rep.microbatches *
                                    (c.tfwd[k] * (1 + again) + c.tbwd[k]);
                out->zero3_s[s] += cfg->rep.microbatches *
                                   (c.zfwd[k] * (1 + again) + c.zbwd[k]);
            }
        }
        schedule_sim_free(&sim);
    }
    chunk_costs_free(&c, K);
    if (rc) schedule_free(&sched);
    else out->sched = sched;
    return rc ? -1 : 0;
}

/* ZeRO-2: the most gradient bytes a replica holds at once in its backward with one piece:
 * max over buckets b of Σ_{k < b−1} B_k/R + B_{b−1} + B_b (B in bytes, the shards rounded
 * to nothing), as src/runtime/replicas.c gives memory back, plus `scratch` buffers of the
 * largest bucket (the CPU stage's gradient groups and mb_grads, which hold one backward
 * range each: src/cpu/stage.h); with pieces (M > 1, ordered) the shards live in the earlier
 * micro-batches' arrays, which stay whole, so the last piece adds its two buckets only:
 * max_b B_{b−1} + B_b. With --zero-overlap off (rep.zero_serial) bucket b − 1 is given back
 * before b forms: Σ_{k < b} B_k/R + B_b, with pieces B_b. −1 with a message. */
static double zero2_grad_bytes(const net_desc *net, int first, int last,
                               const plan_memory_config *cfg, int scratch, int pieces)
{
    reduce_plan plan;
    if (replicas_plan(&plan, net, first, last, &cfg->rep)) return -1;
    double shards = 0, most = 0, largest = 0, R = cfg->replicas;
    int serial = cfg->rep.zero_serial;
    for (int b = 0; b < plan.n_buckets; b++) {
        double Bb = 4.0 * plan.buckets[b].count, prev = b ? 4.0 * plan.buckets[b - 1].count : 0;
        if (!pieces && serial) shards += prev / R; /* given back before b forms */
        double held = shards + (serial ? 0 : prev) + Bb;
        if (held > most) most = held;
        if (Bb > largest) largest = Bb;
        if (!pieces && !serial) shards += prev / R;
    }
    reduce_plan_free(&plan);
    return most + scratch * largest;
}

/* ZeRO-3: the parameters' peak bytes on a replica: its shards 4Ψ/R and two adjacent layers
 * whole (the one that ran, the next one's prefetched gather, whose pages the released one's
 * pool gives), or one without prefetch, as src/runtime/replicas_zero3.c holds them (shards
 * of a layer ≈ 1/R of it). */
static double zero3_param_bytes(const net_desc *net, int first, int last, double R,
                                int prefetch)
{
    double all = 0, most = 0, prev = 0;
    for (int l = first; l < last; l++) {
        double n = 4.0 * (double)(net->layers[l].weight_count + net->layers[l].bias_count);
        double rest = n - n / R;
        all += n;
        if ((prefetch ? prev : 0) + rest > most) most = (prefetch ? prev : 0) + rest;
        if (rest > 0) prev = rest;
    }
    return all / R + most;
}

/* The gradient groups and mb_grads (the micro-batches after the first, unless each has a
 * piece of its own): what their pages hold at the peak. */
static double held_groups(const stage_bytes *b, const plan_memory_config *cfg, int M)
{
    return (double)b->group_held +
           (M > 1 && cfg->grad_pieces <= 1 ? (double)b->apart_held : 0);
}

/* A chunk's parameters, gradients and optimizer state at its peak (the gradient groups', the
 * gradient pieces' and ZeRO's share of them); zn: the layers as this tensor rank holds them.
 * *failed set when a bucket plan cannot be made. */
static double state_bytes(const stage_bytes *bp, const net_desc *net, const net_desc *zn,
                          int first, int last, const plan_memory_config *cfg, int M, int *failed)
{
    const stage_bytes b = *bp;
    double groups_held = held_groups(&b, cfg, M);
    double bytes = (double)b.state + groups_held;
    if (cfg->grad_pieces > 1)
        bytes += (cfg->grad_pieces - 1.0) * (double)b.state / 4.0;
    /* ZeRO-1: m | v (half the state) sharded over the replicas; the bytes on
     * the wire are the unsharded ones (reduce-scatter + all-gather) */
    if (cfg->zero > 0 && cfg->replicas > 1)
        bytes -= (double)b.state / 2.0 * (1.0 - 1.0 / cfg->replicas);
    /* ZeRO-2: the gradients' peak is the shards of the buckets reduced so far
     * and two whole buckets (the one whose reduce-scatter the next start waits
     * for, and the one just formed), and in place of the whole group arrays
     * and mb_grads one bucket for each that is written (a micro-batch of
     * several chunks: a wave's group buffer, one thread here, or the part it
     * folds the groups in; M > 1 with one piece: mb_grads); with pieces, the
     * earlier ones whole (above) and the last one's two buckets */
    if (cfg->zero >= 2 && cfg->replicas > 1) {
        int pieces = cfg->grad_pieces > 1;
        int scratch = (stage_estimate_groups(net, cfg->microbatch, 1) > 1 && !b.fold_part) +
                      (M > 1 && !pieces);
        double g = zero2_grad_bytes(zn, first, last, cfg, scratch, pieces);
        if (g < 0) *failed = 1;
        bytes += g + (double)b.fold_part - (double)b.state / 4.0 - groups_held;
    }
    if (cfg->zero >= 3 && cfg->replicas > 1)
        bytes += zero3_param_bytes(zn, first, last, cfg->replicas, cfg->zero3_prefetch) -
                 (double)b.state / 4.0;
    return bytes;
}

/* Chunk v of stage s's message and sample buffers, as src/runtime/exec.c sizes its engine:
 * 2M micro-batch buffers of samples (two steps; at least 3, for evaluation) with their
 * labels and ids; M of each message (two steps' on CUDA), the CPU executor's as few as
 * liveness allows (src/runtime/exec_msg.c: activations and gradients received, with what
 * the chunk's W reads, and n_send gradients sent). The inputs are samples on chunk 0, else
 * messages; the gradients received may take the logits' place on the last chunk. */
static double buffer_bytes(const schedule *sched, const net_desc *net, int s, int v,
                           int first, int last, double in, double outc,
                           const plan_memory_config *cfg, int n_send, int *failed)
{
    int M = sched->microbatches;
    double nb = 2.0 * M > 3 ? 2.0 * M : 3, nm = cfg->cuda_engine ? nb : M > 3 ? M : 3;
    double nr = nm, ng = nm, ns = nm, mb = cfg->microbatch;
    if (!cfg->cuda_engine) {
        int sharded = cfg->shard && cfg->shard->T > 1, n[2];
        if (schedule_receive_buffers(sched, s, v, schedule_least_receive_buffers(sched),
                                     layer_stage_w_reads(net, first, last, sharded), n, NULL)) {
            *failed = 1;
        } else {
            if (n[0] < nr) nr = n[0];
            if (n[1] < ng) ng = n[1];
        }
        if (n_send < ns) ns = n_send;
    }
    int in_place = layer_loss_in_place(net, last, sched->lists[s].recompute);
    return (first > 0 ? (nr + ns) * 4.0 * in : nb * 4.0 * in) * mb +
           (in_place ? 0 : ng * mb * 4.0 * outc) + nb * mb * (4 + 8);
}

/* A slot's split-backward gradients: the CPU stage's (its last layer's W may read the
 * gradient where it came in); the CUDA engine keeps that one's copy too. */
static double split_slot_bytes(const net_desc *net, int first, int last,
                               const plan_memory_config *cfg, const shard_plan *sp, int t)
{
    const layer_desc *top = &net->layers[last - 1];
    double b = (double)stage_split_slot_bytes_shard(net, first, last, cfg->microbatch,
                                                    cfg->cuda_engine ? 0 : 1, sp, t);
    if (cfg->cuda_engine && !sp && layer_w_reads_dout(top))
        b += (double)stage_round_up((size_t)cfg->microbatch * layer_gout_kept_floats(top, 0) *
                                    sizeof(float));
    return b;
}

int plan_memory(double *out, const net_desc *net, const partition *part, const schedule *sched,
                const plan_memory_config *cfg)
{
    int K = sched->stages, V = sched->virtual_stages > 1 ? sched->virtual_stages : 1;
    int M = sched->microbatches;
    if (part->stages != K * V || part->n_layers != net->n_layers)
        return pt_error_set("plan_memory: a partition of %d chunks and %d layers for %d ranks "
                            "× %d chunks and %d layers", part->stages, part->n_layers, K, V,
                            net->n_layers);
    schedule_report rep;
    if (schedule_verify(sched, &rep)) return -1;
    int *n_send = calloc((size_t)K * V, sizeof *n_send); /* (buffer_bytes) */
    if (!n_send || (!cfg->cuda_engine && schedule_send_buffers(sched, 1, n_send))) {
        free(n_send);
        schedule_report_free(&rep);
        return n_send ? -1 : pt_error_set("out of memory");
    }
    double mb = cfg->microbatch;
    const shard_plan *sp = cfg->shard && cfg->shard->T > 1 ? cfg->shard : NULL;
    int T = sp ? sp->T : 1;
    for (int s = 0; s < K; s++) {
        int split = list_splits(sched, s), recompute = sched->lists[s].recompute;
        out[s] = 0;
        /* the tensor ranks of a stage may hold uneven shards: the largest */
        for (int t = 0; t < T; t++) {
            double rank = 0, held = 0, unit = 0; /* the chunks' slots; the largest */
            double groups_sum = 0, groups_most = 0, scratch_sum = 0, scratch_most = 0;
            int failed = 0, n_held = 0;
            /* ZeRO-2 and 3 price the buckets and layers this tensor rank holds */
            net_desc local;
            const net_desc *zn = net;
            if (sp && cfg->zero >= 2 && cfg->replicas > 1) {
                if (shard_local_net(&local, sp, net, t)) {
                    schedule_report_free(&rep);
                    free(n_send);
                    return -1;
                }
                zn = &local;
            }
            for (int v = 0; v < V; v++) {
                int c = schedule_model_chunk(sched, s, v), first = part->first[c], last = part->first[c + 1];
                stage_bytes b = stage_estimate_shard(net, first, last, cfg->microbatch, 1, sp, t);
                /* what the stage receives and sends (a slice under sequence parallelism) */
                double in = sp ? (double)shard_stage_in_count(sp, net, first, t)
                               : (double)layer_shape_count(net->layers[first].in);
                double outc = sp ? (double)shard_stage_out_count(sp, net, last, t)
                                 : (double)layer_shape_count(net->layers[last - 1].out);
                int slots = rep.peak_inflight_chunk[s * V + v];
                if (slots < 1) slots = 1;
                double slot = (double)b.slot +
                              (split ? split_slot_bytes(net, first, last, cfg, sp, t) : 0);
                double bytes = state_bytes(&b, net, zn, first, last, cfg, M, &failed) +
                               (double)b.workers + slots * slot;
                held += slots * slot;
                n_held += slots;
                double g = held_groups(&b, cfg, M);
                groups_sum += g;
                if (g > groups_most) groups_most = g;
                scratch_sum += (double)b.thread_scratch;
                if ((double)b.thread_scratch > scratch_most) scratch_most = (double)b.thread_scratch;
                if (stage_round_up((size_t)slot) > unit) unit = stage_round_up((size_t)slot);
                bytes += buffer_bytes(sched, net, s, v, first, last, in, outc, cfg,
                                      n_send[s * V + v], &failed);
                /* recomputation: the outputs of the micro-batches between forward and
                 * backward stay until sent (the engine's pool, sized by the verifier) */
                if (recompute && last < net->n_layers)
                    bytes += rep.peak_inputs_chunk[s * V + v] * mb * outc * 4.0;
                if (cfg->wgrad_batched)
                    bytes += (double)stage_wgrad_row_bytes(net, first, last) * mb * M;
                rank += bytes;
            }
            /* the CPU executor's chunks share the rank's peak of slots when it is fewer,
             * each unit the largest chunk's slot, and always the gradient groups' pages
             * and the threads' scratch, the largest chunk's (engine_create_chunks; ZeRO-2
             * prices its gradients its own way) */
            if (V > 1 && !cfg->cuda_engine) {
                if (rep.peak_inflight[s] > 0 && rep.peak_inflight[s] < n_held)
                    rank += rep.peak_inflight[s] * unit - held;
                rank += scratch_most - scratch_sum;
                if (!(cfg->zero >= 2 && cfg->replicas > 1)) rank += groups_most - groups_sum;
            }
            if (zn != net) net_desc_free(&local);
            if (failed) {
                schedule_report_free(&rep);
                free(n_send);
                return -1;
            }
            if (rank > out[s]) out[s] = rank;
        }
    }
    schedule_report_free(&rep);
    free(n_send);
    return 0;
}

int plan_profile_shards(partition_profile *prof, const net_desc *net, const shard_plan *sp,
                        const profile_options *po)
{
    net_desc local;
    if (shard_local_net(&local, sp, net, sp->T - 1)) return -1;
    /* the loss needs the whole logits: a last layer cut by outputs is profiled whole (an
     * overestimate of a layer that is small where it is the classifier) */
    int last = net->n_layers - 1;
    if (last >= 0 && sp->layers[last].out.sharded) local.layers[last] = net->layers[last];
    int rc = partition_profile_measure_with(prof, &local, po) < 0 ? -1 : 0;
    net_desc_free(&local);
    return rc;
}
