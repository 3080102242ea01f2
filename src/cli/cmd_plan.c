/* `pipetrain plan`: partition, placement and predicted step of one layout (--stages), or the
 * search for the best layout of N ranks under a memory limit (--ranks, src/plan/search.h).
 * Prints to stdout, errors as "pipetrain: message" to stderr, and returns the exit status
 * (0 ok, 1 error, 2 usage). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"
#include "src/base/error.h"
#include "src/plan/build.h"
#include "src/plan/search.h"
#include "src/cli/cmd_topo.h"
#include "src/engine/engine.h"
#include "src/model/net.h"
#include "src/base/options.h"
#include "src/plan/emit.h"
#include "src/plan/predict.h"
#include "src/runtime/profile.h"
#include "src/cpu/stage.h"
#include "topologies/topo.h"

enum { O_TOPOLOGY = 1, O_JSON, O_HELP, O_MODEL, O_STAGES, O_REPLICAS, O_NODES, O_PARTITION,
       O_BATCH, O_MICRO, O_DEVICE, O_GPUS, O_EXCLUSIVE, O_BANDWIDTH, O_LATENCY, O_SCHED,
       O_REDUCE, O_BUCKET_MB, O_OVERLAP, O_EMIT, O_RANKS, O_MEMORY, O_TOP, O_VIRTUAL,
       O_RECOMPUTE, O_WGRAD, O_TENSOR, O_TENSOR_MODE };

static const opt_spec plan_opts[] = {
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.id = O_STAGES, .name = "stages", .shared = 1},
    {.id = O_RANKS, .name = "ranks", .kind = OPT_INT, .arg = "N", .min = 1, .max = 65536,
     .help = "instead of --stages: search every layout of N ranks (stages × replicas, "
             "micro-batches, schedule and its virtual stages, recomputation) and print the "
             "best"},
    {.id = O_MEMORY, .name = "memory-mb", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1e12,
     .help = "with --ranks: memory per rank in MiB; layouts that need more are never "
             "proposed (0: no limit)"},
    {.id = O_TOP, .name = "top", .kind = OPT_INT, .arg = "K", .min = 1, .max = 1000,
     .def = "5", .help = "with --ranks: the best K layouts printed"},
    {.id = O_REPLICAS, .name = "replicas", .shared = 1},
    {.id = O_TENSOR, .name = "tensor", .shared = 1},
    {.id = O_TENSOR_MODE, .name = "tensor-mode", .shared = 1},
    {.id = O_NODES, .name = "nodes", .letter = 'n', .kind = OPT_INT, .arg = "N", .min = 1,
     .max = 65536, .def = "1", .help = "copies of the machine"},
    {.id = O_TOPOLOGY, .name = "topology", .shared = 1},
    {.id = O_PARTITION, .name = "partition", .shared = 1},
    {.id = O_BATCH, .name = "batch", .shared = 1},
    {.id = O_MICRO, .name = "microbatches", .shared = 1},
    {.id = O_SCHED, .name = "schedule", .shared = 1},
    {.id = O_VIRTUAL, .name = "virtual", .shared = 1},
    {.id = O_RECOMPUTE, .name = "recompute", .shared = 1},
    {.id = O_WGRAD, .name = "wgrad", .shared = 1},
    {.id = O_REDUCE, .name = "reduce", .shared = 1},
    {.id = O_BUCKET_MB, .name = "bucket-mb", .shared = 1},
    {.id = O_OVERLAP, .name = "overlap", .shared = 1},
    {.id = O_DEVICE, .name = "device", .shared = 1},
    {.id = O_GPUS, .name = "gpus-per-stage", .letter = 'g', .kind = OPT_INT, .arg = "G",
     .min = 1, .max = 65536, .help = "GPUs per stage: --device cuda with G replicas"},
    {.id = O_EXCLUSIVE, .name = "exclusive", .letter = 'x', .kind = OPT_FLAG,
     .help = "CPU: more ranks than cores is an error, not shared cores"},
    {.id = O_BANDWIDTH, .name = "bandwidth", .kind = OPT_TEXT, .arg = "SPEC",
     .help = "override link bandwidths in bytes/s, e.g.\n"
             "same-package=20e9,cross-node=12.5e9"},
    {.id = O_LATENCY, .name = "latency", .kind = OPT_TEXT, .arg = "SPEC",
     .help = "override link latencies in seconds, e.g. cross-node=2e-6"},
    {.id = O_EMIT, .name = "emit", .kind = OPT_CHOICE, .choices = "mpiexec|slurm",
     .help = "print only the mpiexec command or the Slurm job script that runs this plan"},
    {.id = O_JSON, .name = "json", .shared = 1},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command plan_command = {
    .name = "plan",
    .usage = "pipetrain plan --model FILE (--stages K | --ranks N) [options]",
    .about = "Partitions the model into K pipeline stages, places the ranks (stage, replica) on "
             "the machine's nodes, GPUs and cores, and predicts the communication time per step "
             "of the chosen placement and of rank order, and the step time: the schedule's "
             "simulator with layer times profiled on this machine's CPU, messages and each "
             "stage's gradient reductions priced by their links. With --tensor T each stage's "
             "layers are cut T ways (tensor shards): its compute shrinks T-fold, its tensor "
             "collectives are priced on its group's links, and memory per rank is the largest "
             "shard's. No MPI launch needed. The options mean "
             "what they mean to train: each replica gets batch / R samples per step, in M "
             "micro-batches; bytes per step do not depend on M, the message size (bytes / M) "
             "does.",
    .notes = "Links for --bandwidth and --latency: same-core same-l3 same-numa same-package "
             "cross-package gpu-link pcie cross-node. With --ranks, --tensor and --tensor-mode "
             "restrict the search to that T and mode (by default it tries every T dividing N, "
             "in both modes).",
    .opts = plan_opts,
};

static int fail(const char *what)
{
    fprintf(stderr, "pipetrain: %s\n", what);
    return 1;
}

/* A wrong command line; the message says "(see pipetrain CMD --help)". */
static int usage_fail(void)
{
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    return PT_EXIT_USAGE;
}



/* Returns 0, 1 when the help was shown, or −1 with a message. */
static int plan_parse(plan_args *a, int argc, char **argv)
{
    static const reduce_method methods[] = {REDUCE_ALLREDUCE, REDUCE_REDUCE_BCAST,
                                            REDUCE_GATHER_BCAST, REDUCE_ORDERED};
    *a = (plan_args){0};
    opt_parser p;
    if (opt_parser_init(&p, &plan_command, argc, argv)) return -1;
    int id;
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_MODEL: a->model = p.arg; break;
        case O_TOPOLOGY: a->xml = p.arg; break;
        case O_PARTITION: a->method = p.arg; break;
        case O_EXCLUSIVE: a->exclusive = 1; break;
        case O_JSON: a->json = 1; break;
        case O_BANDWIDTH: a->bandwidth = p.arg; break;
        case O_LATENCY: a->latency = p.arg; break;
        case O_HELP: opt_print_help(&plan_command, stdout); return 1;
        case O_STAGES: a->stages = (int)p.num; break;
        case O_RANKS: a->ranks = (int)p.num; break;
        case O_MEMORY: a->memory_mb = p.real; break;
        case O_TOP: a->top = (int)p.num; break;
        case O_REPLICAS: a->replicas = (int)p.num; break;
        case O_NODES: a->nodes = (int)p.num; break;
        case O_BATCH: a->batch = (int)p.num; break;
        case O_MICRO: a->microbatches = (int)p.num; break;
        case O_GPUS: a->gpus_per_stage = (int)p.num; break;
        case O_DEVICE: a->device = p.choice ? TOPO_DEVICE_CUDA : TOPO_DEVICE_CPU; break;
        case O_SCHED: a->schedule = p.arg; break;
        case O_VIRTUAL: a->virtual_stages = (int)p.num; break;
        case O_RECOMPUTE: a->recompute = p.arg; break;
        case O_WGRAD: a->wgrad_batched = p.choice == 1; break;
        case O_REDUCE: a->reduce = methods[p.choice]; break;
        case O_BUCKET_MB: a->bucket_mb = p.real; break;
        case O_OVERLAP: a->overlap = p.choice == 0; break;
        case O_EMIT: a->emit = p.choice == 0 ? PLAN_EMIT_MPIEXEC : PLAN_EMIT_SLURM; break;
        case O_TENSOR: a->tensor = (int)p.num; break;
        case O_TENSOR_MODE: a->tensor_mode = p.choice ? TENSOR_GATHER : TENSOR_MEGATRON; break;
        }
    }
    if (id == OPT_ERROR) return -1;
    a->tensor_given = opt_given(&p, O_TENSOR);
    a->tensor_mode_given = opt_given(&p, O_TENSOR_MODE);
    if (opt_given(&p, O_STAGES) == opt_given(&p, O_RANKS))
        return opt_error(&p, "give --stages K (one layout) or --ranks N (search the layouts of "
                             "N ranks), not %s", a->ranks ? "both" : "neither");
    if (a->ranks) {
        const int fixed[] = {O_REPLICAS, O_MICRO, O_GPUS, O_EMIT};
        const char *names[] = {"--replicas", "--microbatches", "--gpus-per-stage", "--emit"};
        for (int k = 0; k < 4; k++)
            if (opt_given(&p, fixed[k]))
                return opt_error(&p, "%s is chosen by the search with --ranks: leave it out, "
                                     "or give --stages instead", names[k]);
        const int chosen[] = {O_SCHED, O_VIRTUAL, O_RECOMPUTE};
        const char *chosen_names[] = {"--schedule", "--virtual", "--recompute"};
        for (int k = 0; k < 3; k++)
            if (opt_given(&p, chosen[k]))
                return opt_error(&p, "%s is chosen by the search with --ranks", chosen_names[k]);
        a->stages = 1;
        a->virtual_stages = 1;
        a->recompute = "none";
        a->replicas = 1;
        a->microbatches = 1;
    } else if (opt_given(&p, O_MEMORY) || opt_given(&p, O_TOP)) {
        return opt_error(&p, "--memory-mb and --top go with --ranks");
    }
    if (!(a->bucket_mb > 0))
        return opt_error(&p, "--bucket-mb %g: must be positive", a->bucket_mb);
    if (a->emit && a->json)
        return opt_error(&p, "--emit prints a command, --json the plan: give one of them");
    if (a->gpus_per_stage) {
        if (opt_given(&p, O_DEVICE) && a->device != TOPO_DEVICE_CUDA)
            return opt_error(&p, "--gpus-per-stage needs --device cuda");
        if (opt_given(&p, O_REPLICAS) && a->replicas != a->gpus_per_stage)
            return opt_error(&p, "--gpus-per-stage G means G replicas; it contradicts "
                                 "--replicas");
        a->device = TOPO_DEVICE_CUDA;
        a->replicas = a->gpus_per_stage;
    }
    if (a->virtual_stages < 1) a->virtual_stages = 1;
    if (!a->recompute) a->recompute = "none";
    if (!a->schedule) a->schedule = "1f1b";
    if (!a->ranks) {
        /* as train checks them, before any profiling */
        int V = a->virtual_stages;
        if (V > 1 && strcmp(a->schedule, "interleaved"))
            return opt_error(&p, "--virtual %d needs --schedule interleaved", V);
        if (V > 1 && a->stages < 2)
            return opt_error(&p, "interleaved schedules (--virtual %d) need at least 2 stages",
                             V);
        if (V > 1 && a->replicas > 1)
            return opt_error(&p, "--replicas with interleaved schedules (--virtual %d) is not "
                                 "supported yet: use --replicas 1 or --virtual 1", V);
        if (V > 1 && a->microbatches % a->stages)
            return opt_error(&p, "--microbatches %d: interleaved schedules need a multiple of "
                                 "--stages %d", a->microbatches, a->stages);
        int flags[a->stages];
        if (schedule_parse_recompute(a->recompute, a->stages, flags)) {
            char why[256];
            snprintf(why, sizeof why, "%s", pt_error_get());
            return opt_error(&p, "%s", why);
        }
    }
    if (a->exclusive && a->device == TOPO_DEVICE_CUDA)
        a->exclusive = 0; /* GPUs are never shared anyway */
    /* as in train: --batch is per optimizer step; each replica takes its share */
    if (a->batch % a->replicas)
        return opt_error(&p, "--batch %d does not split evenly over %d replicas", a->batch,
                         a->replicas);
    a->replica_batch = a->batch / a->replicas;
    if (a->replica_batch % a->microbatches)
        return opt_error(&p, "--microbatches %d does not divide the %d samples per replica "
                             "(--batch %d over %d replica%s)", a->microbatches,
                         a->replica_batch, a->batch, a->replicas, a->replicas > 1 ? "s" : "");
    return 0;
}

static void print_gpu(char *buf, size_t size, const topo_machine *m, const topo_place *p)
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
    int K = r->a->stages, V = r->a->virtual_stages;
    double most = 0;
    for (int v = 0; v < V; v++) {
        double b = plan_chunk_message_bytes(r->a, r->net, r->part, v * K + s);
        if (b > most) most = b;
    }
    return most;
}

/* Rank s's layers: "3", "3-5", or its chunks' ranges "0-1,6-7" (V > 1). */
static void format_layers(char *buf, size_t size, const plan_result *r, int s)
{
    int K = r->a->stages, V = r->a->virtual_stages, len = 0;
    buf[0] = '\0';
    for (int v = 0; v < V && len < (int)size; v++) {
        int lo = r->part->first[v * K + s], hi = r->part->first[v * K + s + 1] - 1;
        len += lo == hi ? snprintf(buf + len, size - (size_t)len, "%s%d", v ? "," : "", lo)
                        : snprintf(buf + len, size - (size_t)len, "%s%d-%d", v ? "," : "", lo,
                                   hi);
    }
}

/* Parameters of stage s's model chunks: whole (t < 0), or as tensor rank t holds them. */
static double stage_params(const plan_result *r, int s, int t)
{
    int K = r->a->stages, V = r->a->virtual_stages;
    double n = 0;
    for (int v = 0; v < V; v++) {
        int c = v * K + s, first = r->part->first[c], last = r->part->first[c + 1];
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

/* Stage s's tensor traffic per sample, summed over its model chunks. */
static shard_traffic stage_traffic(const plan_result *r, int s)
{
    int K = r->a->stages, V = r->a->virtual_stages;
    shard_traffic sum = {0};
    for (int v = 0; v < V; v++) {
        int c = v * K + s;
        shard_traffic t = shard_stage_traffic(r->shard, r->net, r->part->first[c],
                                              r->part->first[c + 1], c == 0);
        sum.fwd_gather += t.fwd_gather, sum.fwd_reduce += t.fwd_reduce;
        sum.bwd_reduce += t.bwd_reduce, sum.bwd_gather += t.bwd_gather;
        sum.fwd_gathers += t.fwd_gathers, sum.fwd_reduces += t.fwd_reduces;
        sum.bwd_reduces += t.bwd_reduces, sum.bwd_gathers += t.bwd_gathers;
    }
    return sum;
}

/* The tensor shards' part of the text: the cut, then per stage parameters per rank and
 * collectives. */
static void print_tensor_text(const plan_result *r)
{
    const plan_args *a = r->a;
    int S = a->stages, T = a->tensor;
    double mb = (double)a->replica_batch / a->microbatches;
    printf("\n");
    shard_plan_print(r->shard, r->net, stdout);
    printf("Tensor collectives per micro-batch of %g samples, ring over the group's slowest "
           "link (%s); parameters per rank: the largest shard's\n", mb,
           topo_link_name(r->tensor_link));
    printf("%7s %12s %12s %9s %9s %11s %11s\n", "stage", "params/rank", "params/stage",
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
        printf("%7d %12s %12s %9s %9s %11s %11s\n", s, rb, wb, fw, bw, sent, st);
    }
    if (r->a->shard_profile)
        printf("  (AG all-gather, AR all-reduce; compute: each layer profiled as tensor rank %d "
               "runs its shard, the largest)\n", T - 1);
    else
        printf("  (AG all-gather, AR all-reduce; compute: the profile's layer times / %d for the "
               "layers cut or on sharded vectors, assuming the kernels scale perfectly)\n", T);
}

static void print_plan_text(const plan_result *r)
{
    const plan_args *a = r->a;
    const topo_placement *pl = r->pl;
    const topo_machine *m = r->m;
    int S = a->stages, R = a->replicas, T = a->tensor;
    char tensor[64] = "";
    if (T > 1)
        snprintf(tensor, sizeof tensor, " × %d tensor shards (%s)", T,
                 tensor_mode_name(a->tensor_mode));
    printf("Plan: %s, %d stage%s × %d replica%s%s = %d ranks on %d node%s of %s, device %s\n",
           a->model, S, S > 1 ? "s" : "", a->replicas, a->replicas > 1 ? "s" : "", tensor,
           pl->n_ranks, a->nodes, a->nodes > 1 ? "s" : "", m->source,
           a->device == TOPO_DEVICE_CUDA ? "cuda" : "cpu");
    printf("Batch %d per step (%d per replica) in %d micro-batches; partition \"%s\"",
           a->batch, a->replica_batch, a->microbatches, a->method);
    if (a->virtual_stages > 1)
        printf(" into %d model chunks, %d per rank (rank k holds chunks k, k+%d, ...)",
               S * a->virtual_stages, a->virtual_stages, S);
    printf("\n\n");
    printf("Placement (%s%s):\n", pl->method,
           r->tensor_first ? "; tensor groups kept close first: a shorter predicted step" : "");
    printf("%4s %5s %7s", "rank", "stage", "replica");
    if (T > 1) printf(" %6s", "tensor");
    printf(" %-7s %4s %-10s %-12s %11s %11s %-24s %11s\n", "layers", "node", "GPU", "cores",
           "sent/step", "msg/ubatch", "link to next stage", "time/step");
    int boundaries[TOPO_LINK_COUNT] = {0}, groups[TOPO_LINK_COUNT] = {0};
    for (int i = 0; i < pl->n_ranks; i++) {
        const topo_place *p = &pl->places[i];
        int t = i % T, rep = (i / T) % R, s = i / (T * R);
        if (T > 1)
            groups[topo_link_between(m, r->cm, p, &pl->places[plan_rank(a, (t + 1) % T, s, rep)],
                                     NULL, NULL)]++;
        char layers[64], gpu[32], cores[64], sent[32], msg[32], link[64], time[32];
        format_layers(layers, sizeof layers, r, s);
        print_gpu(gpu, sizeof gpu, m, p);
        topo_format_list(cores, sizeof cores, p->cores, p->n_cores);
        if (p->shared)
            strncat(cores, "*", sizeof cores - strlen(cores) - 1);
        topo_format_bytes(sent, sizeof sent, sent_bytes(r->tr, i));
        if (rank_sends(r, s)) {
            double bw;
            topo_link l = topo_link_between(m, r->cm, p,
                                            &pl->places[plan_rank(a, t, (s + 1) % S, rep)], &bw,
                                            NULL);
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
        printf("%4d %5d %7d", i, s, rep);
        if (T > 1) printf(" %6d", t);
        printf(" %-7s %4d %-10s %-12s %11s %11s %-24s %11s\n", layers, p->node, gpu, cores, sent,
               msg, link, time);
    }
    double busiest = 0;
    for (int i = 0; i < pl->n_ranks; i++)
        if (r->rank_time[i] > busiest)
            busiest = r->rank_time[i];
    char c1[32], c2[32], c3[32];
    topo_format_seconds(c1, sizeof c1, pl->cost_s);
    topo_format_seconds(c2, sizeof c2, pl->naive_cost_s);
    topo_format_seconds(c3, sizeof c3, busiest);
    printf("\nStage boundaries by link:");
    for (int l = 0, first = 1; l < TOPO_LINK_COUNT; l++)
        if (boundaries[l]) {
            printf("%s %s %d", first ? "" : ",", topo_link_name(l), boundaries[l]);
            first = 0;
        }
    if (S == 1)
        printf(" none (one stage)");
    if (T > 1) {
        /* each rank's edge to the next of its group's ring */
        printf("\nTensor group ring edges by link:");
        for (int l = 0, first = 1; l < TOPO_LINK_COUNT; l++)
            if (groups[l]) {
                printf("%s %s %d", first ? "" : ",", topo_link_name(l), groups[l]);
                first = 0;
            }
    }
    printf("\nPredicted communication per step (sum over ranks of bytes/bandwidth + messages × "
           "latency):\n  chosen placement %s, rank order %s", c1, c2);
    if (pl->cost_s > 0 && pl->naive_cost_s > pl->cost_s)
        printf(" (%.2f× better)", pl->naive_cost_s / pl->cost_s);
    printf("; busiest rank %s\n", c3);
    if (pl->oversubscribed)
        printf("Note: more ranks than cores: ranks marked * share cores (oversubscribed).\n");
    if (T > 1) print_tensor_text(r);
    const plan_prediction *pr = r->pred;
    char st[32];
    topo_format_seconds(st, sizeof st, pr->step_s);
    char sched[64];
    if (a->virtual_stages > 1)
        snprintf(sched, sizeof sched, "%s --virtual %d", a->schedule, a->virtual_stages);
    else
        snprintf(sched, sizeof sched, "%s", a->schedule);
    printf("\nPredicted step (simulator, schedule %s, recompute %s, reduce %s): %s, bubble %.3f\n"
           "  (layer times profiled on this machine's CPU; the optimizer's update left out%s)\n",
           sched, a->recompute, a->replicas > 1 ? reduce_method_name(a->reduce) : "-", st,
           pr->bubble,
           a->wgrad_batched ? "; weight gradients priced per micro-batch, memory batched" : "");
    printf("%7s %11s %11s %11s %14s", "stage", "compute", "reductions", "exposed",
           "memory/rank");
    printf(T > 1 ? " %11s\n" : "\n", "tensor");
    for (int s = 0; s < S; s++) {
        char mem[32], ten[32];
        topo_format_seconds(c1, sizeof c1, pr->busy_s[s]);
        topo_format_seconds(c2, sizeof c2, pr->reduce_s[s]);
        topo_format_seconds(c3, sizeof c3, pr->exposed_s[s]);
        topo_format_bytes(mem, sizeof mem, r->stage_bytes[s]);
        topo_format_seconds(ten, sizeof ten, pr->tensor_s[s]);
        printf("%7d %11s %11s %11s %14s", s, c1, c2, c3, mem);
        printf(T > 1 ? " %11s\n" : "\n", ten);
    }
    if (T > 1)
        printf("  (compute includes the tensor collectives; tensor: their time per step; "
               "memory/rank: the largest tensor rank's)\n");
}

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

static int print_plan_json(const plan_result *r)
{
    const plan_args *a = r->a;
    const topo_placement *pl = r->pl;
    int S = a->stages, R = a->replicas, T = a->tensor, ok = 1;
    json_t *o = json_object();
    put(o, "model", topo_json_text(a->model), &ok);
    put(o, "topology", topo_json_text(r->m->source), &ok);
    put(o, "stages", json_integer(S), &ok);
    put(o, "replicas", json_integer(a->replicas), &ok);
    put(o, "tensor", json_integer(T), &ok);
    put(o, "tensor_mode", json_string(tensor_mode_name(a->tensor_mode)), &ok);
    put(o, "tensor_link", T > 1 ? json_string(topo_link_name(r->tensor_link)) : json_null(),
        &ok);
    put(o, "ranks", json_integer(pl->n_ranks), &ok);
    put(o, "nodes", json_integer(a->nodes), &ok);
    put(o, "device", json_string(a->device == TOPO_DEVICE_CUDA ? "cuda" : "cpu"), &ok);
    put(o, "batch", json_integer(a->batch), &ok);
    put(o, "microbatches", json_integer(a->microbatches), &ok);
    put(o, "virtual", json_integer(a->virtual_stages), &ok);
    json_t *part = json_object();
    put(part, "method", topo_json_text(a->method), &ok);
    /* model chunks: K·V + 1 entries */
    put(part, "first", topo_json_int_list(r->part->first, r->part->stages + 1), &ok);
    put(o, "partition", part, &ok);
    put(o, "search", topo_json_text(pl->method), &ok);
    put(o, "cost_s", topo_json_number(pl->cost_s), &ok);
    put(o, "rank_order_cost_s", topo_json_number(pl->naive_cost_s), &ok);
    put(o, "oversubscribed", json_boolean(pl->oversubscribed), &ok);
    json_t *placement = json_array();
    for (int i = 0; ok && i < pl->n_ranks; i++) {
        const topo_place *p = &pl->places[i];
        int t = i % T, rep = (i / T) % R, s = i / (T * R);
        int last = !rank_sends(r, s), V = a->virtual_stages;
        json_t *j = json_object();
        put(j, "rank", json_integer(i), &ok);
        put(j, "stage", json_integer(s), &ok);
        put(j, "replica", json_integer(rep), &ok);
        put(j, "tensor", json_integer(t), &ok);
        /* [first, last]; with V > 1 one such pair per chunk the rank holds */
        json_t *layers = V > 1 ? json_array() : NULL;
        for (int v = 0; v < V; v++) {
            int c = v * S + s;
            json_t *pair = json_pack("[ii]", r->part->first[c], r->part->first[c + 1] - 1);
            if (V == 1) layers = pair;
            else append(layers, pair, &ok);
        }
        put(j, "layers", layers, &ok);
        put(j, "node", json_integer(p->node), &ok);
        put_gpu(j, r->m, p, 0, &ok);
        put(j, "cores", topo_json_int_list(p->cores, p->n_cores), &ok);
        put(j, "shared", json_boolean(p->shared), &ok);
        put(j, "bytes_sent_per_step", topo_json_number(sent_bytes(r->tr, i)), &ok);
        /* the last stage sends no activations: no message, no link */
        put(j, "message_bytes", last ? json_null() : topo_json_number(message_bytes(r, s)), &ok);
        put(j, "next_link",
            last ? json_null()
                 : json_string(topo_link_name(
                       topo_link_between(r->m, r->cm, p,
                                         &pl->places[plan_rank(a, t, (s + 1) % S, rep)], NULL,
                                         NULL))),
            &ok);
        put(j, "time_s", topo_json_number(r->rank_time[i]), &ok);
        append(placement, j, &ok);
    }
    put(o, "placement", placement, &ok);
    const plan_prediction *pr = r->pred;
    json_t *pj = json_object();
    put(pj, "schedule", topo_json_text(a->schedule), &ok);
    put(pj, "virtual", json_integer(a->virtual_stages), &ok);
    put(pj, "recompute", topo_json_text(a->recompute), &ok);
    put(pj, "wgrad", json_string(a->wgrad_batched ? "batched" : "per-microbatch"), &ok);
    put(pj, "reduce", json_string(reduce_method_name(a->reduce)), &ok);
    put(pj, "bucket_mb", topo_json_number(a->bucket_mb), &ok);
    put(pj, "overlap", json_boolean(a->overlap), &ok);
    put(pj, "step_s", topo_json_number(pr->step_s), &ok);
    put(pj, "bubble", topo_json_number(pr->bubble), &ok);
    json_t *busy = json_array(), *red = json_array(), *exp = json_array();
    for (int s = 0; s < S; s++) {
        append(busy, topo_json_number(pr->busy_s[s]), &ok);
        append(red, topo_json_number(pr->reduce_s[s]), &ok);
        append(exp, topo_json_number(pr->exposed_s[s]), &ok);
    }
    put(pj, "stage_compute_s", busy, &ok);
    put(pj, "stage_reduce_s", red, &ok);
    put(pj, "stage_reduce_exposed_s", exp, &ok);
    json_t *mem = json_array();
    for (int s = 0; s < S; s++) append(mem, topo_json_number(r->stage_bytes[s]), &ok);
    put(pj, "stage_memory_bytes", mem, &ok);
    /* tensor shards: per stage, collectives per step (0 without), the traffic per sample
     * (shard_stage_traffic, summed over the stage's chunks), parameters per rank (the
     * largest shard) and whole */
    json_t *tcs = json_array(), *ttr = json_array(), *prk = json_array(), *pwh = json_array();
    for (int s = 0; s < S; s++) {
        shard_traffic tr = stage_traffic(r, s);
        append(tcs, topo_json_number(pr->tensor_s[s]), &ok);
        append(ttr,
               json_pack("{s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:i}", "fwd_gather",
                         (json_int_t)tr.fwd_gather, "fwd_reduce", (json_int_t)tr.fwd_reduce,
                         "bwd_reduce", (json_int_t)tr.bwd_reduce, "bwd_gather",
                         (json_int_t)tr.bwd_gather, "fwd_gathers", tr.fwd_gathers,
                         "fwd_reduces", tr.fwd_reduces, "bwd_reduces", tr.bwd_reduces,
                         "bwd_gathers", tr.bwd_gathers),
               &ok);
        append(prk, topo_json_number(4 * stage_rank_params(r, s)), &ok);
        append(pwh, topo_json_number(4 * stage_params(r, s, -1)), &ok);
    }
    put(pj, "tensor_collective_s", tcs, &ok);
    put(pj, "tensor_traffic_per_sample", ttr, &ok);
    put(pj, "stage_param_bytes_per_rank", prk, &ok);
    put(pj, "stage_param_bytes", pwh, &ok);
    put(o, "predicted", pj, &ok);
    put(o, "rank_order", json_places(r->m, pl->naive, pl->n_ranks, &ok), &ok);
    if (!ok) {
        json_decref(o);
        o = NULL;
    }
    return topo_json_print(o, stdout);
}

int topo_cmd_plan(int argc, char **argv)
{
    plan_args a;
    int rc = plan_parse(&a, argc, argv);
    if (rc)
        return rc == 1 ? PT_EXIT_OK : usage_fail(); /* 1 = --help shown */
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    if ((a.bandwidth && topo_cost_model_parse(&cm, a.bandwidth, 0) < 0) ||
        (a.latency && topo_cost_model_parse(&cm, a.latency, 1) < 0)) {
        fprintf(stderr, "pipetrain: %s (see pipetrain plan --help)\n", pt_error_get());
        return PT_EXIT_USAGE;
    }
    net_desc net = {0};
    partition_profile prof = {0};
    topo_t *t = NULL;
    plan_built b = {0};
    int have_prof = 0;
    rc = 1;
    if (net_desc_load(&net, a.model) < 0 || topo_init(&t, a.xml) < 0) goto out;
    const topo_machine *m = topo_get_machine(t);
    if (!a.ranks || a.tensor_given) {
        /* a layer that cannot be cut T ways, before any profiling */
        shard_plan sp;
        if (shard_plan_init(&sp, &net, a.tensor, a.tensor_mode) < 0) goto out;
        shard_plan_free(&sp);
    }
    if (a.ranks) {
        rc = plan_search(&a, &net, m, &cm);
        goto done;
    }
    if (partition_check(net.n_layers, a.stages * a.virtual_stages) < 0) goto out;
    /* profiled on this machine with the CPU kernels, whatever --topology says, at the
     * micro-batch size train would profile at: the "time" partition and the prediction */
    /* the split backward only where it is priced */
    profile_options po = {.batch = a.replica_batch / a.microbatches, .warmup = 1, .repeats = 3,
                          .device = ENGINE_CPU, .split = !strcmp(a.schedule, "zb-h1")};
    if (a.tensor > 1) { /* what a rank of the tensor group computes, measured */
        shard_plan sp;
        if (shard_plan_init(&sp, &net, a.tensor, a.tensor_mode) < 0) goto out;
        int prc = plan_profile_shards(&prof, &net, &sp, &po);
        shard_plan_free(&sp);
        if (prc < 0) goto out;
        a.shard_profile = 1;
    } else if (partition_profile_measure_with(&prof, &net, &po) < 0) {
        goto out;
    }
    have_prof = 1;
    if (plan_build(&b, &a, &net, &prof, m, &cm) < 0) goto out;
    plan_result r = {.a = &a, .net = &net, .part = &b.part, .m = m, .tr = &b.tr, .cm = &cm,
                     .pl = &b.pl, .rank_time = b.rank_time, .pred = &b.pred,
                     .stage_bytes = b.stage_bytes, .shard = &b.shard,
                     .tensor_link = b.tensor_link, .tensor_first = b.tensor_first};
    if (a.emit) {
        char extra[512] = "";
        int len = 0;
        if (a.replicas > 1)
            len += snprintf(extra, sizeof extra, "--reduce %s --bucket-mb %g --overlap %s",
                            reduce_method_name(a.reduce), a.bucket_mb, a.overlap ? "on" : "off");
        if (a.virtual_stages > 1)
            len += snprintf(extra + len, sizeof extra - (size_t)len, "%s--virtual %d",
                            len ? " " : "", a.virtual_stages);
        if (strcmp(a.recompute, "none"))
            len += snprintf(extra + len, sizeof extra - (size_t)len, "%s--recompute %s",
                            len ? " " : "", a.recompute);
        if (a.wgrad_batched)
            len += snprintf(extra + len, sizeof extra - (size_t)len, "%s--wgrad batched",
                            len ? " " : "");
        if (a.tensor > 1)
            snprintf(extra + len, sizeof extra - (size_t)len, "%s--tensor %d --tensor-mode %s",
                     len ? " " : "", a.tensor, tensor_mode_name(a.tensor_mode));
        plan_emit_args ea = {
            .kind = (plan_emit_kind)a.emit, .model = a.model, .stages = a.stages,
            .replicas = a.replicas, .nodes = a.nodes, .batch = a.batch,
            .microbatches = a.microbatches, .schedule = a.schedule, .train_options = extra,
            .cuda = a.device == TOPO_DEVICE_CUDA,
        };
        if (plan_emit(stdout, &ea, &b.part, &b.pl) < 0)
            goto out;
    } else if (a.json) {
        if (print_plan_json(&r) < 0)
            goto out;
    } else {
        /* the layer times appear only where they chose the partition */
        partition_print(&b.part, &net, !strcmp(a.method, "time") ? &prof : NULL, stdout);
        putchar('\n');
        print_plan_text(&r);
    }
    rc = 0;
out:
    if (rc)
        fail(pt_error_get());
done:
    plan_built_free(&b);
    topo_free(t);
    if (have_prof)
        partition_profile_free(&prof);
    net_desc_free(&net);
    return rc;
}
