/* `plan --stages K`'s report of one layout, as text or JSON (src/plan/print.h). */
#include "src/plan/print.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#include "src/model/shard.h"
#include "src/plan/predict.h"
#include "topologies/topo.h"

/* ---- figures of a rank or a stage -------------------------------------------------------- */

static void format_gpu(char *buf, size_t size, const topo_machine *m, const topo_place *p)
{
    if (p->gpu < 0)
        snprintf(buf, size, "-");
    else if (m->gpus[p->gpu].cuda_index >= 0)
        snprintf(buf, size, "%d (cuda%d)", p->gpu, m->gpus[p->gpu].cuda_index);
    else
        snprintf(buf, size, "%d", p->gpu);
}

static double sent_bytes(const topo_traffic *tr, int i)
{
    double b = 0;
    for (int j = 0; j < tr->n_ranks; j++)
        b += tr->bytes[i * tr->n_ranks + j];
    return b;
}

/* 1 when rank s sends activations to the next rank ((s + 1) mod K: with V > 1 the last
 * rank's chunks but the last feed rank 0's next chunks). */
static int rank_sends(const plan_result *r, int s)
{
    int K = r->a->stages;
    return r->a->virtual_stages > 1 ? K > 1 : s + 1 < K;
}

/* The largest activation message rank s sends (per micro-batch), over its chunks. */
static double message_bytes(const plan_result *r, int s)
{
    int V = r->a->virtual_stages;
    double most = 0;
    for (int v = 0; v < V; v++) {
        double b = plan_chunk_message_bytes(r->a, r->net, r->part, plan_model_chunk(r->a, s, v));
        if (b > most) most = b;
    }
    return most;
}

/* The place of the rank that rank i (tensor shard t of stage s in replica rep) sends its
 * activations to: the same shard of the next stage. */
static const topo_place *next_stage_place(const plan_result *r, int t, int s, int rep)
{
    return &r->pl->places[plan_rank(r->a, t, (s + 1) % r->a->stages, rep)];
}

/* Rank s's layers: "3", "3-5", or its chunks' ranges "0-1,6-7" (V > 1). */
static void format_layers(char *buf, size_t size, const plan_result *r, int s)
{
    int V = r->a->virtual_stages, len = 0;
    buf[0] = '\0';
    for (int v = 0; v < V && len < (int)size; v++) {
        int c = plan_model_chunk(r->a, s, v);
        int lo = r->part->first[c], hi = r->part->first[c + 1] - 1;
        len += lo == hi ? snprintf(buf + len, size - (size_t)len, "%s%d", v ? "," : "", lo)
                        : snprintf(buf + len, size - (size_t)len, "%s%d-%d", v ? "," : "", lo,
                                   hi);
    }
}

/* Parameters of stage s's model chunks: whole (t < 0), or as tensor rank t holds them. */
static double stage_params(const plan_result *r, int s, int t)
{
    int V = r->a->virtual_stages;
    double n = 0;
    for (int v = 0; v < V; v++) {
        int c = plan_model_chunk(r->a, s, v), first = r->part->first[c], last = r->part->first[c + 1];
        if (t >= 0) {
            n += (double)shard_param_count(r->shard, r->net, first, last, t);
            continue;
        }
        for (int l = first; l < last; l++)
            n += (double)(r->net->layers[l].weight_count + r->net->layers[l].bias_count);
    }
    return n;
}

/* The most parameters a tensor rank of stage s holds. */
static double stage_rank_params(const plan_result *r, int s)
{
    double most = 0;
    for (int t = 0; t < r->shard->T; t++) {
        double n = stage_params(r, s, t);
        if (n > most) most = n;
    }
    return most;
}

/* ZeRO-3: the bytes of parameters a replica of stage s (its tensor rank's shards) receives
 * per step: each layer all-gathered before its forward and again before its backward, every
 * micro-batch (a third time with recomputation): (2 or 3)·M·(R−1)/R·4Ψ_s. 0 without. */
static double zero3_gather_bytes(const plan_result *r, int s)
{
    const plan_args *a = r->a;
    if (a->zero < 3 || a->replicas < 2) return 0;
    double passes = r->pred->sched.lists[s].recompute ? 3 : 2;
    double share = (a->replicas - 1.0) / a->replicas;
    return passes * a->microbatches * share * 4 * stage_rank_params(r, s);
}

/* Stage s's tensor traffic per sample, summed over its model chunks. */
static shard_traffic stage_traffic(const plan_result *r, int s)
{
    int V = r->a->virtual_stages;
    shard_traffic sum = {0};
    for (int v = 0; v < V; v++) {
        int c = plan_model_chunk(r->a, s, v);
        shard_traffic t = shard_stage_traffic(r->shard, r->net, r->part->first[c],
                                              r->part->first[c + 1], c == 0);
        sum.fwd_gather += t.fwd_gather, sum.fwd_reduce += t.fwd_reduce;
        sum.bwd_reduce += t.bwd_reduce, sum.bwd_gather += t.bwd_gather;
        sum.fwd_gathers += t.fwd_gathers, sum.fwd_reduces += t.fwd_reduces;
        sum.bwd_reduces += t.bwd_reduces, sum.bwd_gathers += t.bwd_gathers;
    }
    return sum;
}

/* ---- text -------------------------------------------------------------------------------- */

/* What the plan is: model, layout, machine, device, batch and partition. */
static void print_header(const plan_result *r, FILE *out)
{
    const plan_args *a = r->a;
    int S = a->stages, T = a->tensor;
    char tensor[64] = "";
    if (T > 1)
        snprintf(tensor, sizeof tensor, " × %d tensor shards (%s)", T,
                 tensor_mode_name(a->tensor_mode));
    fprintf(out, "Plan: %s, %d stage%s × %d replica%s%s = %d ranks on %d node%s of %s, "
            "device %s\n", a->model, S, S > 1 ? "s" : "", a->replicas,
            a->replicas > 1 ? "s" : "", tensor, r->pl->n_ranks, a->nodes,
            a->nodes > 1 ? "s" : "", r->m->source,
            a->device == TOPO_DEVICE_CUDA ? "cuda" : "cpu");
    fprintf(out, "Batch %d per step (%d per replica) in %d micro-batches; partition \"%s\"",
            a->batch, a->replica_batch, a->microbatches, a->method);
    if (a->virtual_stages > 1)
        fprintf(out, " into %d model chunks, %d per rank (rank k holds chunks k, k+%d, ...)",
                S * a->virtual_stages, a->virtual_stages, S);
    fprintf(out, "\n\n");
}

/* Rank i's row of the placement table; counts the link to its next stage in boundaries
 * and the edge to the next rank of its tensor group's ring in groups. */
static void print_rank_row(const plan_result *r, int i, int *boundaries, int *groups, FILE *out)
{
    const plan_args *a = r->a;
    const topo_machine *m = r->m;
    const topo_place *p = &r->pl->places[i];
    int R = a->replicas, T = a->tensor;
    int t = i % T, rep = (i / T) % R, s = i / (T * R);
    if (T > 1)
        groups[topo_link_between(m, r->cm, p, &r->pl->places[plan_rank(a, (t + 1) % T, s, rep)],
                                 NULL, NULL)]++;
    char layers[64], gpu[32], cores[64], sent[32], msg[32], link[64], time[32];
    format_layers(layers, sizeof layers, r, s);
    format_gpu(gpu, sizeof gpu, m, p);
    topo_format_list(cores, sizeof cores, p->cores, p->n_cores);
    if (p->shared)
        strncat(cores, "*", sizeof cores - strlen(cores) - 1);
    topo_format_bytes(sent, sizeof sent, sent_bytes(r->tr, i));
    if (rank_sends(r, s)) {
        double bw;
        topo_link l = topo_link_between(m, r->cm, p, next_stage_place(r, t, s, rep), &bw, NULL);
        boundaries[l]++;
        topo_format_bytes(msg, sizeof msg, message_bytes(r, s));
        char rate[32];
        topo_format_bytes(rate, sizeof rate, bw);
        snprintf(link, sizeof link, "%s %s/s", topo_link_name(l), rate);
    } else {
        snprintf(msg, sizeof msg, "-");
        snprintf(link, sizeof link, "-");
    }
    topo_format_seconds(time, sizeof time, r->rank_time[i]);
    fprintf(out, "%4d %5d %7d", i, s, rep);
    if (T > 1) fprintf(out, " %6d", t);
    fprintf(out, " %-7s %4d %-10s %-12s %11s %11s %-24s %11s\n", layers, p->node, gpu, cores,
            sent, msg, link, time);
}

/* The placement table, a row per rank; counts its links as print_rank_row does. */
static void print_placement(const plan_result *r, int *boundaries, int *groups, FILE *out)
{
    fprintf(out, "Placement (%s%s):\n", r->pl->method,
            r->tensor_first ? "; tensor groups kept close first: a shorter predicted step" : "");
    fprintf(out, "%4s %5s %7s", "rank", "stage", "replica");
    if (r->a->tensor > 1) fprintf(out, " %6s", "tensor");
    fprintf(out, " %-7s %4s %-10s %-12s %11s %11s %-24s %11s\n", "layers", "node", "GPU",
            "cores", "sent/step", "msg/ubatch", "link to next stage", "time/step");
    for (int i = 0; i < r->pl->n_ranks; i++)
        print_rank_row(r, i, boundaries, groups, out);
}

/* title, then " link count" for each kind of link counted, comma-separated. */
static void print_link_counts(const char *title, const int *counts, FILE *out)
{
    fprintf(out, "%s", title);
    for (int l = 0, first = 1; l < TOPO_LINK_COUNT; l++)
        if (counts[l]) {
            fprintf(out, "%s %s %d", first ? "" : ",", topo_link_name(l), counts[l]);
            first = 0;
        }
}

/* The links the placement uses and its predicted communication, against rank order's. */
static void print_communication(const plan_result *r, const int *boundaries, const int *groups,
                                FILE *out)
{
    const topo_placement *pl = r->pl;
    double busiest = 0;
    for (int i = 0; i < pl->n_ranks; i++)
        if (r->rank_time[i] > busiest)
            busiest = r->rank_time[i];
    char c1[32], c2[32], c3[32];
    topo_format_seconds(c1, sizeof c1, pl->cost_s);
    topo_format_seconds(c2, sizeof c2, pl->naive_cost_s);
    topo_format_seconds(c3, sizeof c3, busiest);
    print_link_counts("\nStage boundaries by link:", boundaries, out);
    if (r->a->stages == 1)
        fprintf(out, " none (one stage)");
    if (r->a->tensor > 1) /* each rank's edge to the next of its group's ring */
        print_link_counts("\nTensor group ring edges by link:", groups, out);
    fprintf(out, "\nPredicted communication per step (sum over ranks of bytes/bandwidth + "
            "messages × latency):\n  chosen placement %s, rank order %s", c1, c2);
    if (pl->cost_s > 0 && pl->naive_cost_s > pl->cost_s)
        fprintf(out, " (%.2f× better)", pl->naive_cost_s / pl->cost_s);
    fprintf(out, "; busiest rank %s\n", c3);
    if (pl->oversubscribed)
        fprintf(out, "Note: more ranks than cores: ranks marked * share cores "
                "(oversubscribed).\n");
}

/* The tensor shards' part of the text: the cut, then per stage parameters per rank and
 * collectives. */
static void print_tensor(const plan_result *r, FILE *out)
{
    const plan_args *a = r->a;
    int S = a->stages, T = a->tensor;
    double mb = (double)a->replica_batch / a->microbatches;
    fprintf(out, "\n");
    shard_plan_print(r->shard, r->net, out);
    fprintf(out, "Tensor collectives per micro-batch of %g samples, ring over the group's "
            "slowest link (%s); parameters per rank: the largest shard's\n", mb,
            topo_link_name(r->tensor_link));
    fprintf(out, "%7s %12s %12s %9s %9s %11s %11s\n", "stage", "params/rank", "params/stage",
            "fwd coll", "bwd coll", "sent/ubatch", "coll/step");
    for (int s = 0; s < S; s++) {
        shard_traffic tr = stage_traffic(r, s);
        double bytes, msgs, pw = stage_params(r, s, -1), pr = stage_rank_params(r, s);
        plan_tensor_sent(&tr, T, mb, &bytes, &msgs);
        char wb[32], rb[32], sent[32], st[32], fw[16], bw[16];
        topo_format_bytes(wb, sizeof wb, 4 * pw);
        topo_format_bytes(rb, sizeof rb, 4 * pr);
        topo_format_bytes(sent, sizeof sent, bytes);
        topo_format_seconds(st, sizeof st, r->pred->tensor_s[s]);
        snprintf(fw, sizeof fw, "%dAG %dAR", tr.fwd_gathers, tr.fwd_reduces);
        snprintf(bw, sizeof bw, "%dAR %dAG", tr.bwd_reduces, tr.bwd_gathers);
        fprintf(out, "%7d %12s %12s %9s %9s %11s %11s\n", s, rb, wb, fw, bw, sent, st);
    }
    if (a->shard_profile)
        fprintf(out, "  (AG all-gather, AR all-reduce; compute: each layer profiled as tensor "
                "rank %d runs its shard, the largest)\n", T - 1);
    else
        fprintf(out, "  (AG all-gather, AR all-reduce; compute: the profile's layer times / %d "
                "for the layers cut or on sharded vectors, assuming the kernels scale "
                "perfectly)\n", T);
}

/* The schedule's unit-cost bubble for balanced stages, in the simulator's unit (the idle
 * share of the step); NAN with one stage, where there is no pipeline to idle in. */
static double plan_bubble_theory(const plan_args *a, const char **formula)
{
    *formula = NULL;
    if (a->stages < 2)
        return NAN;
    double f = schedule_bubble_share(a->schedule, a->stages, a->virtual_stages,
                                     a->microbatches, formula);
    return f >= 0 ? f : NAN;
}

/* The simulator's step and, per stage, its compute, reductions and memory per rank. */
static void print_prediction(const plan_result *r, FILE *out)
{
    const plan_args *a = r->a;
    const plan_prediction *pr = r->pred;
    int S = a->stages, T = a->tensor;
    char st[32], sched[160];
    topo_format_seconds(st, sizeof st, pr->step_s);
    int len = snprintf(sched, sizeof sched, "%s", a->schedule);
    if (a->virtual_stages > 1)
        len += snprintf(sched + len, sizeof sched - (size_t)len, " --virtual %d",
                        a->virtual_stages);
    if (pr->sched.origin[0]) /* what the search chose */
        snprintf(sched + len, sizeof sched - (size_t)len, " (%s)", pr->sched.origin);
    const char *formula = NULL;
    double theory = plan_bubble_theory(a, &formula);
    fprintf(out, "\nPredicted step (simulator, schedule %s, recompute %s, reduce %s): %s, "
            "bubble (idle share of the step) %.3f", sched, a->recompute,
            a->replicas > 1 ? reduce_method_name(a->reduce) : "-", st, pr->bubble);
    if (formula)
        fprintf(out, ", %.3f for balanced stages (%s)", theory, formula);
    fprintf(out, "\n  (layer times profiled on this machine's CPU; the optimizer's update left "
            "out%s)\n",
            a->wgrad_batched ? "; weight gradients priced per micro-batch, memory batched" : "");
    fprintf(out, "%7s %11s %11s %11s %14s", "stage", "compute", "reductions", "exposed",
            "memory/rank");
    fprintf(out, T > 1 ? " %11s\n" : "\n", "tensor");
    for (int s = 0; s < S; s++) {
        char c1[32], c2[32], c3[32], mem[32], ten[32];
        topo_format_seconds(c1, sizeof c1, pr->busy_s[s]);
        topo_format_seconds(c2, sizeof c2, pr->reduce_s[s]);
        topo_format_seconds(c3, sizeof c3, pr->exposed_s[s]);
        topo_format_bytes(mem, sizeof mem, r->stage_bytes[s]);
        topo_format_seconds(ten, sizeof ten, pr->tensor_s[s]);
        fprintf(out, "%7d %11s %11s %11s %14s", s, c1, c2, c3, mem);
        fprintf(out, T > 1 ? " %11s\n" : "\n", ten);
    }
    if (T > 1)
        fprintf(out, "  (compute includes the tensor collectives; tensor: their time per step; "
                "memory/rank: the largest tensor rank's)\n");
    for (int s = 0; a->zero >= 3 && a->replicas > 1 && s < S; s++) {
        char g[32], w[32];
        topo_format_bytes(g, sizeof g, zero3_gather_bytes(r, s));
        topo_format_seconds(w, sizeof w, pr->zero3_s[s]);
        fprintf(out, "  stage %d, --zero 3: %s of parameters gathered per step and replica (each "
                "layer before its forward and its backward, every micro-batch), %s of them "
                "waited for (in the step above)\n", s, g, w);
    }
}

void plan_print_text(const plan_result *r, const partition_profile *times, FILE *out)
{
    partition_print(r->part, r->net, times, out);
    fputc('\n', out);
    print_header(r, out);
    int boundaries[TOPO_LINK_COUNT] = {0}, groups[TOPO_LINK_COUNT] = {0};
    print_placement(r, boundaries, groups, out);
    print_communication(r, boundaries, groups, out);
    if (r->a->tensor > 1) print_tensor(r, out);
    print_prediction(r, out);
}

/* ---- JSON -------------------------------------------------------------------------------- */

/* Builders of the JSON tree, as in topologies/print.c: the setters take ownership of the
 * value (and free it when they fail, also for a NULL container or value); *ok records it. */
static void put(json_t *obj, const char *key, json_t *v, int *ok)
{
    if (json_object_set_new(obj, key, v) != 0)
        *ok = 0;
}

static void append(json_t *arr, json_t *v, int *ok)
{
    if (json_array_append_new(arr, v) != 0)
        *ok = 0;
}

/* The GPU of a place and its CUDA number, null where there is none. */
static void put_gpu(json_t *o, const topo_machine *m, const topo_place *p, int with_cuda,
                    int *ok)
{
    int cuda = p->gpu < 0 ? -1 : m->gpus[p->gpu].cuda_index;
    put(o, "gpu", p->gpu < 0 ? json_null() : json_integer(p->gpu), ok);
    if (with_cuda)
        put(o, "cuda_index", cuda < 0 ? json_null() : json_integer(cuda), ok);
}

static json_t *json_places(const topo_machine *m, const topo_place *p, int n, int *ok)
{
    json_t *a = json_array();
    for (int i = 0; *ok && i < n; i++) {
        json_t *o = json_object();
        put(o, "rank", json_integer(i), ok);
        put(o, "node", json_integer(p[i].node), ok);
        put_gpu(o, m, &p[i], 1, ok);
        put(o, "cores", topo_json_int_list(p[i].cores, p[i].n_cores), ok);
        put(o, "shared", json_boolean(p[i].shared), ok);
        append(a, o, ok);
    }
    return a;
}

/* The layout's settings, partition and placement cost (the object's first keys). */
static void put_layout(json_t *o, const plan_result *r, int *ok)
{
    const plan_args *a = r->a;
    const topo_placement *pl = r->pl;
    int T = a->tensor;
    put(o, "model", topo_json_text(a->model), ok);
    put(o, "topology", topo_json_text(r->m->source), ok);
    put(o, "stages", json_integer(a->stages), ok);
    put(o, "replicas", json_integer(a->replicas), ok);
    put(o, "tensor", json_integer(T), ok);
    put(o, "tensor_mode", json_string(tensor_mode_name(a->tensor_mode)), ok);
    put(o, "tensor_link", T > 1 ? json_string(topo_link_name(r->tensor_link)) : json_null(),
        ok);
    put(o, "ranks", json_integer(pl->n_ranks), ok);
    put(o, "nodes", json_integer(a->nodes), ok);
    put(o, "device", json_string(a->device == TOPO_DEVICE_CUDA ? "cuda" : "cpu"), ok);
    put(o, "batch", json_integer(a->batch), ok);
    put(o, "microbatches", json_integer(a->microbatches), ok);
    put(o, "virtual", json_integer(a->virtual_stages), ok);
    json_t *part = json_object();
    put(part, "method", topo_json_text(a->method), ok);
    /* model chunks: K·V + 1 entries */
    put(part, "first", topo_json_int_list(r->part->first, r->part->stages + 1), ok);
    put(o, "partition", part, ok);
    put(o, "search", topo_json_text(pl->method), ok);
    put(o, "cost_s", topo_json_number(pl->cost_s), ok);
    put(o, "rank_order_cost_s", topo_json_number(pl->naive_cost_s), ok);
    put(o, "oversubscribed", json_boolean(pl->oversubscribed), ok);
}

/* Rank s's layers as [first, last]; with V > 1 an array of one such pair per chunk. */
static json_t *json_rank_layers(const plan_result *r, int s, int *ok)
{
    int S = r->a->stages, V = r->a->virtual_stages;
    json_t *layers = V > 1 ? json_array() : NULL;
    for (int v = 0; v < V; v++) {
        int c = v * S + s;
        json_t *pair = json_pack("[ii]", r->part->first[c], r->part->first[c + 1] - 1);
        if (V == 1) layers = pair;
        else append(layers, pair, ok);
    }
    return layers;
}

/* Rank i of the placement: where it sits, what it holds and sends, its time per step. */
static json_t *json_rank(const plan_result *r, int i, int *ok)
{
    const plan_args *a = r->a;
    const topo_place *p = &r->pl->places[i];
    int T = a->tensor, R = a->replicas;
    int t = i % T, rep = (i / T) % R, s = i / (T * R), last = !rank_sends(r, s);
    json_t *j = json_object();
    put(j, "rank", json_integer(i), ok);
    put(j, "stage", json_integer(s), ok);
    put(j, "replica", json_integer(rep), ok);
    put(j, "tensor", json_integer(t), ok);
    put(j, "layers", json_rank_layers(r, s, ok), ok);
    put(j, "node", json_integer(p->node), ok);
    put_gpu(j, r->m, p, 0, ok);
    put(j, "cores", topo_json_int_list(p->cores, p->n_cores), ok);
    put(j, "shared", json_boolean(p->shared), ok);
    put(j, "bytes_sent_per_step", topo_json_number(sent_bytes(r->tr, i)), ok);
    /* the last stage sends no activations: no message, no link */
    put(j, "message_bytes", last ? json_null() : topo_json_number(message_bytes(r, s)), ok);
    put(j, "next_link",
        last ? json_null()
             : json_string(topo_link_name(topo_link_between(
                   r->m, r->cm, p, next_stage_place(r, t, s, rep), NULL, NULL))),
        ok);
    put(j, "time_s", topo_json_number(r->rank_time[i]), ok);
    return j;
}

static json_t *json_placement(const plan_result *r, int *ok)
{
    json_t *placement = json_array();
    for (int i = 0; *ok && i < r->pl->n_ranks; i++)
        append(placement, json_rank(r, i, ok), ok);
    return placement;
}

/* Per stage: compute, reductions (all and exposed) and memory per rank. */
static void put_stage_figures(json_t *pj, const plan_result *r, int *ok)
{
    const plan_prediction *pr = r->pred;
    json_t *busy = json_array(), *red = json_array(), *exp = json_array();
    for (int s = 0; s < r->a->stages; s++) {
        append(busy, topo_json_number(pr->busy_s[s]), ok);
        append(red, topo_json_number(pr->reduce_s[s]), ok);
        append(exp, topo_json_number(pr->exposed_s[s]), ok);
    }
    put(pj, "stage_compute_s", busy, ok);
    put(pj, "stage_reduce_s", red, ok);
    put(pj, "stage_reduce_exposed_s", exp, ok);
    json_t *mem = json_array();
    for (int s = 0; s < r->a->stages; s++) append(mem, topo_json_number(r->stage_bytes[s]), ok);
    put(pj, "stage_memory_bytes", mem, ok);
    json_t *z3 = json_array();
    for (int s = 0; s < r->a->stages; s++)
        append(z3, topo_json_number(zero3_gather_bytes(r, s)), ok);
    put(pj, "stage_zero3_gather_bytes", z3, ok);
    json_t *z3s = json_array();
    for (int s = 0; s < r->a->stages; s++) append(z3s, topo_json_number(pr->zero3_s[s]), ok);
    put(pj, "stage_zero3_gather_s", z3s, ok);
}

static json_t *json_traffic(const shard_traffic *tr)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:i}", "fwd_gather",
                     (json_int_t)tr->fwd_gather, "fwd_reduce", (json_int_t)tr->fwd_reduce,
                     "bwd_reduce", (json_int_t)tr->bwd_reduce, "bwd_gather",
                     (json_int_t)tr->bwd_gather, "fwd_gathers", tr->fwd_gathers,
                     "fwd_reduces", tr->fwd_reduces, "bwd_reduces", tr->bwd_reduces,
                     "bwd_gathers", tr->bwd_gathers);
}

/* Tensor shards: per stage, collectives per step (0 without), the traffic per sample
 * (shard_stage_traffic, summed over the stage's chunks), parameters per rank (the largest
 * shard) and whole. */
static void put_stage_tensor(json_t *pj, const plan_result *r, int *ok)
{
    json_t *tcs = json_array(), *ttr = json_array(), *prk = json_array(), *pwh = json_array();
    for (int s = 0; s < r->a->stages; s++) {
        shard_traffic tr = stage_traffic(r, s);
        append(tcs, topo_json_number(r->pred->tensor_s[s]), ok);
        append(ttr, json_traffic(&tr), ok);
        append(prk, topo_json_number(4 * stage_rank_params(r, s)), ok);
        append(pwh, topo_json_number(4 * stage_params(r, s, -1)), ok);
    }
    put(pj, "tensor_collective_s", tcs, ok);
    put(pj, "tensor_traffic_per_sample", ttr, ok);
    put(pj, "stage_param_bytes_per_rank", prk, ok);
    put(pj, "stage_param_bytes", pwh, ok);
}

/* The simulator's step, its settings and the per-stage figures. */
static json_t *json_prediction(const plan_result *r, int *ok)
{
    const plan_args *a = r->a;
    json_t *pj = json_object();
    put(pj, "schedule", topo_json_text(a->schedule), ok);
    put(pj, "schedule_origin",
        r->pred->sched.origin[0] ? json_string(r->pred->sched.origin) : json_null(), ok);
    put(pj, "schedule_memory", json_real(a->schedule_memory), ok);
    put(pj, "virtual", json_integer(a->virtual_stages), ok);
    put(pj, "recompute", topo_json_text(a->recompute), ok);
    put(pj, "wgrad", json_string(a->wgrad_batched ? "batched" : "per-microbatch"), ok);
    put(pj, "reduce", json_string(reduce_method_name(a->reduce)), ok);
    put(pj, "bucket_mb", topo_json_number(a->bucket_mb), ok);
    put(pj, "overlap", json_boolean(a->overlap), ok);
    put(pj, "step_s", topo_json_number(r->pred->step_s), ok);
    put(pj, "bubble", topo_json_number(r->pred->bubble), ok);
    const char *formula;
    put(pj, "bubble_theory", topo_json_number(plan_bubble_theory(a, &formula)), ok);
    put_stage_figures(pj, r, ok);
    put_stage_tensor(pj, r, ok);
    return pj;
}

int plan_print_json(const plan_result *r, FILE *out)
{
    int ok = 1;
    json_t *o = json_object();
    put_layout(o, r, &ok);
    put(o, "placement", json_placement(r, &ok), &ok);
    put(o, "predicted", json_prediction(r, &ok), &ok);
    put(o, "rank_order", json_places(r->m, r->pl->naive, r->pl->n_ranks, &ok), &ok);
    if (!ok) {
        json_decref(o);
        o = NULL;
    }
    return topo_json_print(o, out);
}
