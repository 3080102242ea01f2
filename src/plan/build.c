#include "src/plan/build.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"
#include "src/base/error.h"
#include "src/engine/engine.h"
#include "src/model/net.h"
#include "src/plan/predict.h"
#include "src/runtime/profile.h"
#include "src/cpu/stage.h"
#include "topologies/topo.h"

/* Bytes of one activation message from model chunk c to c+1 (per micro-batch); 0 for the
 * last chunk. */
double plan_chunk_message_bytes(const plan_args *a, const net_desc *net, const partition *part,
                                int c)
{
    if (c + 1 >= part->stages) return 0;
    const layer_desc *l = &net->layers[part->first[c + 1] - 1];
    return (double)layer_shape_count(l->out) * 4.0 * a->replica_batch / a->microbatches;
}

/* The step time of the chosen placement (src/plan/predict.h): each stage's reductions
 * priced by the slowest link of its group's ring, its tensor collectives by the slowest
 * link of its tensor groups' rings (b->tensor_alpha, b->tensor_beta), messages between
 * model chunks by the link between their ranks (the slowest over replicas and tensor
 * ranks: each tensor rank sends the whole vector to its counterpart). */
static int predict_step(plan_prediction *out, const plan_args *a, const net_desc *net,
                        const partition_profile *prof, const topo_machine *m,
                        const topo_cost_model *cm, const plan_built *b, const int *recompute)
{
    const partition *part = &b->part;
    const topo_placement *pl = &b->pl;
    int S = a->stages, R = a->replicas, T = a->tensor, C = part->stages;
    double *alpha = calloc(2 * (size_t)S + (size_t)C, sizeof *alpha);
    if (!alpha) return pt_error_set("out of memory");
    double *beta = alpha + S, *msg = alpha + 2 * S;
    for (int s = 0; s < S; s++) {
        beta[s] = 1; /* no replicas: unused */
        for (int t = 0; t < T && R > 1; t++)
            for (int r = 0; r < R; r++) {
                double bw, lat;
                topo_link_between(m, cm, &pl->places[plan_rank(a, t, s, r)],
                                  &pl->places[plan_rank(a, t, s, (r + 1) % R)], &bw, &lat);
                if ((r == 0 && t == 0) || bw < beta[s]) beta[s] = bw;
                if (lat > alpha[s]) alpha[s] = lat;
            }
    }
    /* chunk c on rank c mod S sends to chunk c + 1 on rank (c + 1) mod S */
    for (int c = 0; c + 1 < C; c++)
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                double bw, lat;
                topo_link_between(m, cm, &pl->places[plan_rank(a, t, c % S, r)],
                                  &pl->places[plan_rank(a, t, (c + 1) % S, r)], &bw, &lat);
                double x = lat + plan_chunk_message_bytes(a, net, part, c) / bw;
                if (x > msg[c]) msg[c] = x;
            }
    double bytes = a->bucket_mb * 1048576.0;
    plan_predict_config cfg = {
        .schedule = a->schedule, .virtual_stages = a->virtual_stages, .recompute = recompute,
        .microbatch = a->replica_batch / a->microbatches,
        .rep = {.replicas = R, .method = a->reduce, .overlap = a->overlap,
                .zero_serial = a->zero >= 2 && !a->zero_overlap,
                .bucket_bytes = bytes < 1 ? 1 : bytes > 1e18 ? (size_t)1e18 : (size_t)bytes,
                .microbatches = a->microbatches, .skip_bucket = -1},
        .alpha = alpha, .beta = beta, .message_s = msg,
        .shard = T > 1 ? &b->shard : NULL, .shard_profile = T > 1 && a->shard_profile,
        .tensor_alpha = b->tensor_alpha,
        .tensor_beta = b->tensor_beta,
        .zero = R > 1 ? a->zero : 0, .zero3_prefetch = a->zero3_prefetch,
        .reduce_in_waits = a->device != TOPO_DEVICE_CUDA,
        .schedule_memory = a->schedule_memory, .search_runs = a->search_runs,
    };
    int rc = plan_predict(out, net, part, prof, &cfg);
    free(alpha);
    return rc;
}

/* The traffic per step between the S·R·T ranks (plan_rank) with tensor shards: each
 * tensor rank sends the whole activation (and receives the whole gradient) to its
 * counterpart in the next model chunk's stage; a ring all-reduce over the replicas of each
 * tensor rank's shards (2(R−1)/R of its parameter bytes, 2(R−1) messages to the next
 * replica); and each model chunk's tensor collectives (plan_tensor_sent per micro-batch,
 * M micro-batches) from each rank to the next of its group's ring, times tensor_weight
 * (1: the traffic; more: a placement that keeps the tensor groups close first). */
static int tensor_traffic(topo_traffic *tr, const plan_args *a, const net_desc *net,
                          const partition *part, const shard_plan *sp, double tensor_weight)
{
    int S = a->stages, R = a->replicas, T = a->tensor, M = a->microbatches, C = part->stages;
    long n = (long)S * R * T;
    *tr = (topo_traffic){0};
    if (n > 1024) return pt_error_set("traffic: %ld ranks are more than 1024", n);
    tr->bytes = calloc((size_t)(n * n), sizeof *tr->bytes);
    tr->messages = calloc((size_t)(n * n), sizeof *tr->messages);
    if (!tr->bytes || !tr->messages) {
        topo_traffic_free(tr);
        return pt_error_set("out of memory");
    }
    tr->n_ranks = (int)n;
    tr->stages = S;
    tr->replicas = R;
    double mb = (double)a->replica_batch / M;
    for (int c = 0; c < C; c++) {
        int s = c % S, first = part->first[c], last = part->first[c + 1];
        shard_traffic st = shard_stage_traffic(sp, net, first, last, c == 0);
        double tb, tm;
        plan_tensor_sent(&st, T, mb, &tb, &tm);
        double msg = plan_chunk_message_bytes(a, net, part, c) * M;
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                long i = plan_rank(a, t, s, r);
                if (c + 1 < C) {
                    long j = plan_rank(a, t, (c + 1) % S, r);
                    tr->bytes[i * n + j] += msg;
                    tr->bytes[j * n + i] += msg;
                    tr->messages[i * n + j] += M;
                    tr->messages[j * n + i] += M;
                }
                if (T > 1) {
                    long j = plan_rank(a, (t + 1) % T, s, r);
                    tr->bytes[i * n + j] += tb * M * tensor_weight;
                    tr->messages[i * n + j] += tm * M * tensor_weight;
                }
                if (R > 1) {
                    long j = plan_rank(a, t, s, (r + 1) % R);
                    double pb = 4.0 * (double)shard_param_count(sp, net, first, last, t);
                    tr->bytes[i * n + j] += 2.0 * (R - 1) / R * pb;
                    tr->messages[i * n + j] += 2.0 * (R - 1);
                }
            }
    }
    return 0;
}

/* The traffic per step between ranks: V = 1 as topologies/ prices a pipeline; V > 1 (one
 * replica) every boundary between model chunks c and c + 1 crosses from rank c mod K to
 * rank (c + 1) mod K, activations one way and gradients the other; with tensor shards, or
 * replicas of V > 1 chunks, tensor_traffic. */
static int plan_traffic(topo_traffic *tr, const plan_args *a, const net_desc *net,
                        const partition *part, const shard_plan *sp)
{
    if (a->tensor > 1 || (a->virtual_stages > 1 && a->replicas > 1))
        return tensor_traffic(tr, a, net, part, sp, 1);
    if (a->virtual_stages <= 1)
        return topo_traffic_from_partition(tr, net, part, a->replicas, a->replica_batch,
                                           a->microbatches);
    int K = a->stages;
    double *none = calloc((size_t)K, sizeof *none);
    if (!none) return pt_error_set("out of memory");
    int rc = topo_traffic_init(tr, K, 1, none, NULL, a->replica_batch, a->microbatches);
    free(none);
    for (int c = 0; !rc && c + 1 < part->stages; c++) {
        int i = c % K, j = (c + 1) % K, n = tr->n_ranks;
        double b = plan_chunk_message_bytes(a, net, part, c) * a->microbatches;
        tr->bytes[i * n + j] += b;
        tr->bytes[j * n + i] += b;
        tr->messages[i * n + j] += a->microbatches;
        tr->messages[j * n + i] += a->microbatches;
    }
    return rc;
}

/* Per stage, the slowest link of its tensor groups' rings (over replicas), and the
 * slowest of all. */
static int tensor_links(plan_built *b, const plan_args *a, const topo_machine *m,
                        const topo_cost_model *cm)
{
    int S = a->stages, R = a->replicas, T = a->tensor;
    b->tensor_alpha = calloc(2 * (size_t)S, sizeof *b->tensor_alpha);
    if (!b->tensor_alpha) return pt_error_set("out of memory");
    b->tensor_beta = b->tensor_alpha + S;
    b->tensor_link = TOPO_LINK_SAME_CORE;
    double slowest = 0;
    for (int s = 0; s < S; s++) {
        b->tensor_beta[s] = 1;
        for (int r = 0; r < R && T > 1; r++)
            for (int t = 0; t < T; t++) {
                double bw, lat;
                topo_link l = topo_link_between(m, cm, &b->pl.places[plan_rank(a, t, s, r)],
                                                &b->pl.places[plan_rank(a, (t + 1) % T, s, r)],
                                                &bw, &lat);
                if ((r == 0 && t == 0) || bw < b->tensor_beta[s]) b->tensor_beta[s] = bw;
                if (lat > b->tensor_alpha[s]) b->tensor_alpha[s] = lat;
                if (slowest == 0 || bw < slowest || (bw == slowest && l > b->tensor_link)) {
                    slowest = bw;
                    b->tensor_link = l;
                }
            }
    }
    return 0;
}

/* The predicted step of b's layout with its current placement (the schedule of a, no
 * recomputation), its tensor links recomputed; −1 with a message. */
static int placement_step(double *step, plan_built *b, const plan_args *a, const net_desc *net,
                          const partition_profile *prof, const topo_machine *m,
                          const topo_cost_model *cm)
{
    free(b->tensor_alpha);
    b->tensor_alpha = b->tensor_beta = NULL;
    plan_prediction p = {0};
    if (tensor_links(b, a, m, cm) < 0 || predict_step(&p, a, net, prof, m, cm, b, NULL) < 0)
        return -1;
    *step = p.step_s;
    plan_prediction_free(&p);
    return 0;
}

static int same_places(const topo_placement *x, const topo_placement *y)
{
    for (int i = 0; i < x->n_ranks; i++) {
        const topo_place *p = &x->places[i], *q = &y->places[i];
        if (p->node != q->node || p->gpu != q->gpu || p->n_cores != q->n_cores ||
            memcmp(p->cores, q->cores, (size_t)p->n_cores * sizeof *p->cores))
            return 0;
    }
    return 1;
}

/* Tensor shards: the placement minimises the traffic's total time, where a tensor group's
 * collectives weigh no more than the replicas' reductions; but the collectives stall every
 * micro-batch while the reductions overlap the backward. So a second placement that keeps
 * the tensor groups on the closest links first (their traffic weighted 1000-fold) is
 * tried too, and the one with the shorter predicted step (schedule a->schedule, no
 * recomputation) kept; its communication figures are those of the real traffic. */
static int tensor_placement(plan_built *b, const plan_args *a, const net_desc *net,
                            const partition_profile *prof, const topo_machine *m,
                            const topo_cost_model *cm, const topo_place_options *opt)
{
    topo_traffic w;
    topo_placement alt;
    double s0, s1;
    if (tensor_traffic(&w, a, net, &b->part, &b->shard, 1000) < 0) return -1;
    int rc = topo_place_ranks(&alt, m, &w, cm, opt);
    topo_traffic_free(&w);
    if (rc < 0) return -1;
    if (same_places(&alt, &b->pl)) {
        topo_placement_free(&alt);
        return 0;
    }
    alt.cost_s = topo_placement_cost(m, &b->tr, cm, alt.places, NULL);
    alt.naive_cost_s = topo_placement_cost(m, &b->tr, cm, alt.naive, NULL);
    if (placement_step(&s0, b, a, net, prof, m, cm) < 0) goto fail;
    topo_placement keep = b->pl;
    b->pl = alt;
    if (placement_step(&s1, b, a, net, prof, m, cm) < 0) {
        b->pl = keep;
        goto fail;
    }
    if (s1 < s0) {
        b->tensor_first = 1;
        topo_placement_free(&keep);
        return 0;
    }
    b->pl = keep;
    topo_placement_free(&alt);
    return 0;
fail:
    topo_placement_free(&alt);
    return -1;
}

int plan_layout(plan_built *b, const plan_args *a, const net_desc *net,
                const partition_profile *prof, const topo_machine *m, const topo_cost_model *cm)
{
    *b = (plan_built){0};
    topo_place_options opt = {.device = a->device, .nodes = a->nodes, .exclusive = a->exclusive};
    int V = a->virtual_stages > 1 ? a->virtual_stages : 1;
    if (shard_plan_init(&b->shard, net, a->tensor, a->tensor_mode) < 0) return -1;
    if (partition_by_method_placed(&b->part, a->method, net, prof, a->stages, V,
                                   plan_v_partition(a)) < 0)
        goto fail;
    if (plan_traffic(&b->tr, a, net, &b->part, &b->shard) < 0 ||
        topo_place_ranks(&b->pl, m, &b->tr, cm, &opt) < 0)
        goto fail;
    if (a->tensor > 1 && b->pl.n_ranks > a->tensor &&
        tensor_placement(b, a, net, prof, m, cm, &opt) < 0)
        goto fail;
    free(b->tensor_alpha);
    b->tensor_alpha = b->tensor_beta = NULL;
    if (tensor_links(b, a, m, cm) < 0) goto fail;
    b->rank_time = calloc((size_t)b->pl.n_ranks, sizeof *b->rank_time);
    if (!b->rank_time) {
        pt_error_set("out of memory");
        goto fail;
    }
    topo_placement_cost(m, &b->tr, cm, b->pl.places, b->rank_time);
    return 0;
fail:
    plan_built_free(b);
    return -1;
}

int plan_price(plan_built *b, const plan_args *a, const net_desc *net,
               const partition_profile *prof, const topo_machine *m, const topo_cost_model *cm)
{
    int K = a->stages, rc = -1;
    plan_prediction_free(&b->pred);
    free(b->stage_bytes);
    b->peak_bytes = 0;
    b->stage_bytes = calloc((size_t)K, sizeof *b->stage_bytes);
    int *flags = malloc((size_t)K * sizeof *flags);
    schedule sched = {0};
    int have_sched = 0;
    if (!flags || !b->stage_bytes) {
        pt_error_set("out of memory");
        goto out;
    }
    /* the memory of the schedule the prediction simulated (a search's own result) */
    if (schedule_parse_recompute(a->recompute, K, flags) < 0 ||
        predict_step(&b->pred, a, net, prof, m, cm, b, flags) < 0)
        goto out;
    sched = b->pred.sched;
    replicas_config rep = {.replicas = a->replicas, .method = a->reduce,
                           .microbatches = a->microbatches,
                           .zero_serial = a->zero >= 2 && !a->zero_overlap};
    plan_memory_config mc = {.microbatch = a->replica_batch / a->microbatches,
                             .wgrad_batched = a->wgrad_batched,
                             .grad_pieces = replicas_grad_pieces(&rep),
                             .zero = a->replicas > 1 ? a->zero : 0, .replicas = a->replicas,
                             .zero3_prefetch = a->zero3_prefetch,
                             .shard = a->tensor > 1 ? &b->shard : NULL,
                             .cuda_engine = a->device == TOPO_DEVICE_CUDA, .rep = rep};
    double bucket = a->bucket_mb * 1048576.0;
    mc.rep.bucket_bytes = bucket < 1 ? 1 : bucket > 1e18 ? (size_t)1e18 : (size_t)bucket;
    if (plan_memory(b->stage_bytes, net, &b->part, &sched, &mc) < 0) goto out;
    for (int s = 0; s < K; s++)
        if (b->stage_bytes[s] > b->peak_bytes) b->peak_bytes = b->stage_bytes[s];
    rc = 0;
out:
    if (have_sched) schedule_free(&sched);
    free(flags);
    return rc;
}

int plan_build(plan_built *b, const plan_args *a, const net_desc *net,
               const partition_profile *prof, const topo_machine *m, const topo_cost_model *cm)
{
    if (plan_layout(b, a, net, prof, m, cm) < 0) return -1;
    if (plan_price(b, a, net, prof, m, cm) < 0) {
        plan_built_free(b);
        return -1;
    }
    if (a->cut || strcmp(a->schedule, "search") || !plan_cut_matters(a)) return 0;
    /* the search's candidates in a V want the pairs' cut, the interleaved ones the chunks':
     * the chunks' too, the faster kept */
    plan_args other = *a;
    other.cut = plan_v_partition(a) ? 1 : 2;
    plan_built alt;
    if (plan_layout(&alt, &other, net, prof, m, cm) < 0) {
        plan_built_free(b);
        return -1;
    }
    if (plan_price(&alt, &other, net, prof, m, cm) < 0) {
        plan_built_free(&alt);
        plan_built_free(b);
        return -1;
    }
    if (alt.pred.step_s < b->pred.step_s) {
        plan_built_free(b);
        *b = alt;
    } else {
        plan_built_free(&alt);
    }
    return 0;
}

int plan_cut_matters(const plan_args *a)
{
    return a->virtual_stages == 2 && a->method &&
           (!strcmp(a->method, "time") || !strcmp(a->method, "params"));
}

void plan_built_free(plan_built *b)
{
    free(b->rank_time);
    free(b->stage_bytes);
    free(b->tensor_alpha);
    shard_plan_free(&b->shard);
    plan_prediction_free(&b->pred);
    topo_placement_free(&b->pl);
    topo_traffic_free(&b->tr);
    if (b->part.first) partition_free(&b->part);
    *b = (plan_built){0};
}

