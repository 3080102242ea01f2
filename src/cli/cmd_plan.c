/* `pipetrain plan`: partition, placement and predicted step of one layout (--stages), or the
 * search for the best layout of N ranks under a memory limit (--ranks, src/plan/search.h).
 * Prints to stdout, errors as "pipetrain: message" to stderr, and returns the exit status
 * (0 ok, 1 error, 2 usage). */
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16.h"
#include "partition/partition.h"
#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"
#include "src/engine/engine.h"
#include "src/model/net.h"
#include "src/plan/build.h"
#include "src/plan/costs.h"
#include "src/plan/emit.h"
#include "src/plan/predict.h"
#include "src/plan/print.h"
#include "src/plan/search.h"
#include "schedule/schedule.h"
#include "src/runtime/profile.h"
#include "topologies/topo.h"

enum { O_TOPOLOGY = 1, O_JSON, O_HELP, O_MODEL, O_STAGES, O_REPLICAS, O_NODES, O_PARTITION,
       O_BATCH, O_MICRO, O_DEVICE, O_GPUS, O_EXCLUSIVE, O_BANDWIDTH, O_LATENCY, O_SCHED,
       O_REDUCE, O_BUCKET_MB, O_OVERLAP, O_EMIT, O_RANKS, O_MEMORY, O_TOP, O_VIRTUAL,
       O_RECOMPUTE, O_WGRAD, O_TENSOR, O_TENSOR_MODE, O_ZERO, O_SCHED_MEM, O_COSTS,
       O_PRECISION, O_ZERO3_PREFETCH, O_ZERO_OVERLAP };

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
    {.id = O_COSTS, .name = "costs-file", .kind = OPT_TEXT, .arg = "FILE",
     .help = "the layer costs: read from FILE where it holds them, measured and added to it "
             "where not (plans made one after another, or on another machine, then price "
             "from the same figures; a file of another model is refused)"},
    {.id = O_PRECISION, .name = "precision", .shared = 1},
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
    {.id = O_SCHED_MEM, .name = "schedule-memory", .shared = 1},
    {.id = O_VIRTUAL, .name = "virtual", .shared = 1},
    {.id = O_RECOMPUTE, .name = "recompute", .shared = 1},
    {.id = O_WGRAD, .name = "wgrad", .shared = 1},
    {.id = O_REDUCE, .name = "reduce", .shared = 1},
    {.id = O_BUCKET_MB, .name = "bucket-mb", .shared = 1},
    {.id = O_OVERLAP, .name = "overlap", .shared = 1},
    {.id = O_ZERO, .name = "zero", .shared = 1},
    {.id = O_ZERO3_PREFETCH, .name = "zero3-prefetch", .shared = 1},
    {.id = O_ZERO_OVERLAP, .name = "zero-overlap", .shared = 1},
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

/* Reads the options into *a. Returns the last opt_next result: 0 at the end, OPT_ERROR, or
 * O_HELP when --help was given (the rest left unread). */
static int read_options(plan_args *a, opt_parser *p)
{
    static const reduce_method methods[] = {REDUCE_ALLREDUCE, REDUCE_REDUCE_BCAST,
                                            REDUCE_GATHER_BCAST, REDUCE_ORDERED};
    int id;
    while ((id = opt_next(p)) > 0) {
        switch (id) {
        case O_MODEL: a->model = p->arg; break;
        case O_TOPOLOGY: a->xml = p->arg; break;
        case O_PARTITION: a->method = p->arg; break;
        case O_EXCLUSIVE: a->exclusive = 1; break;
        case O_JSON: a->json = 1; break;
        case O_BANDWIDTH: a->bandwidth = p->arg; break;
        case O_LATENCY: a->latency = p->arg; break;
        case O_HELP: return O_HELP;
        case O_STAGES: a->stages = (int)p->num; break;
        case O_RANKS: a->ranks = (int)p->num; break;
        case O_MEMORY: a->memory_mb = p->real; break;
        case O_TOP: a->top = (int)p->num; break;
        case O_COSTS: a->costs = p->arg; break;
        case O_PRECISION: a->precision = (engine_precision)p->choice; break;
        case O_REPLICAS: a->replicas = (int)p->num; break;
        case O_NODES: a->nodes = (int)p->num; break;
        case O_BATCH: a->batch = (int)p->num; break;
        case O_MICRO: a->microbatches = (int)p->num; break;
        case O_GPUS: a->gpus_per_stage = (int)p->num; break;
        case O_DEVICE: a->device = p->choice ? TOPO_DEVICE_CUDA : TOPO_DEVICE_CPU; break;
        case O_SCHED: a->schedule = p->arg; break;
        case O_VIRTUAL: a->virtual_stages = (int)p->num; break;
        case O_SCHED_MEM: a->schedule_memory = p->real; break;
        case O_RECOMPUTE: a->recompute = p->arg; break;
        case O_WGRAD: a->wgrad_batched = p->choice == 1; break;
        case O_REDUCE: a->reduce = methods[p->choice]; break;
        case O_BUCKET_MB: a->bucket_mb = p->real; break;
        case O_OVERLAP: a->overlap = p->choice == 0; break;
        case O_ZERO: a->zero = (int)p->num; break;
        case O_ZERO3_PREFETCH: a->zero3_prefetch = p->choice == 0; break;
        case O_ZERO_OVERLAP: a->zero_overlap = p->choice == 0; break;
        case O_EMIT: a->emit = p->choice == 0 ? PLAN_EMIT_MPIEXEC : PLAN_EMIT_SLURM; break;
        case O_TENSOR: a->tensor = (int)p->num; break;
        case O_TENSOR_MODE: a->tensor_mode = p->choice ? TENSOR_GATHER : TENSOR_MEGATRON; break;
        }
    }
    return id;
}

/* --ranks N: the search chooses the layout, so the options that fix one are refused; the
 * search starts from one stage, one replica, one micro-batch. */
static int check_search(plan_args *a, const opt_parser *p)
{
    const int fixed[] = {O_REPLICAS, O_MICRO, O_GPUS, O_EMIT};
    const char *names[] = {"--replicas", "--microbatches", "--gpus-per-stage", "--emit"};
    for (int k = 0; k < 4; k++)
        if (opt_given(p, fixed[k]))
            return opt_error(p, "%s is chosen by the search with --ranks: leave it out, "
                                "or give --stages instead", names[k]);
    const int chosen[] = {O_SCHED, O_VIRTUAL, O_RECOMPUTE};
    const char *chosen_names[] = {"--schedule", "--virtual", "--recompute"};
    for (int k = 0; k < 3; k++)
        if (opt_given(p, chosen[k]))
            return opt_error(p, "%s is chosen by the search with --ranks", chosen_names[k]);
    a->stages = 1;
    a->virtual_stages = 1;
    a->recompute = "none";
    a->replicas = 1;
    a->microbatches = 1;
    return 0;
}

/* --gpus-per-stage G: --device cuda with G replicas. */
static int apply_gpus_per_stage(plan_args *a, const opt_parser *p)
{
    if (opt_given(p, O_DEVICE) && a->device != TOPO_DEVICE_CUDA)
        return opt_error(p, "--gpus-per-stage needs --device cuda");
    if (opt_given(p, O_REPLICAS) && a->replicas != a->gpus_per_stage)
        return opt_error(p, "--gpus-per-stage G means G replicas; it contradicts --replicas");
    a->device = TOPO_DEVICE_CUDA;
    a->replicas = a->gpus_per_stage;
    return 0;
}

/* --zero 1 as train takes it: replicas, a method whose every replica steps its shard. */
static int check_zero(const plan_args *a, const opt_parser *p)
{
    if (opt_check_zero_choices(p, a->zero, O_ZERO3_PREFETCH, O_ZERO_OVERLAP, "plan")) return -1;
    if (!a->zero) return 0;
    if (!a->ranks && a->replicas < 2)
        return opt_error(p, "--zero %d shards the state across a stage's replicas: it needs "
                         "--replicas 2 or more (or --ranks)", a->zero);
    if (reduce_method_root_steps(a->reduce))
        return opt_error(p, "--zero %d with --reduce %s: that method sums on the group's "
                         "first rank, which steps alone (use ordered or allreduce)", a->zero,
                         reduce_method_name(a->reduce));
    return 0;
}

/* One layout's schedule, as train checks it, before any profiling. */
static int check_schedule(const plan_args *a, const opt_parser *p)
{
    int V = a->virtual_stages;
    schedule s;
    char why[512];
    if (V > 1 && !strcmp(a->schedule, "interleaved") && a->stages > 1 &&
        a->microbatches % a->stages)
        return opt_error(p, "--microbatches %d: interleaved schedules need a multiple of "
                            "--stages %d", a->microbatches, a->stages);
    if (schedule_init_named(&s, a->schedule, a->stages, V, a->microbatches)) {
        snprintf(why, sizeof why, "%s", pt_error_get());
        return opt_error(p, "%s", why);
    }
    schedule_free(&s);
    if (V > 1 && a->microbatches % a->stages)
        return opt_error(p, "--microbatches %d: interleaved schedules need a multiple of "
                            "--stages %d", a->microbatches, a->stages);
    int flags[a->stages];
    if (schedule_parse_recompute(a->recompute, a->stages, flags)) {
        snprintf(why, sizeof why, "%s", pt_error_get());
        return opt_error(p, "%s", why);
    }
    return 0;
}

/* As in train: --batch is per optimizer step; each replica takes its share, in
 * micro-batches. */
static int split_batch(plan_args *a, const opt_parser *p)
{
    if (a->batch % a->replicas)
        return opt_error(p, "--batch %d does not split evenly over %d replicas", a->batch,
                         a->replicas);
    a->replica_batch = a->batch / a->replicas;
    if (a->replica_batch % a->microbatches)
        return opt_error(p, "--microbatches %d does not divide the %d samples per replica "
                            "(--batch %d over %d replica%s)", a->microbatches,
                         a->replica_batch, a->batch, a->replicas, a->replicas > 1 ? "s" : "");
    return 0;
}

/* Returns 0, 1 when the help was shown, or −1 with a message. */
static int plan_parse(plan_args *a, int argc, char **argv)
{
    *a = (plan_args){0};
    opt_parser p;
    if (opt_parser_init(&p, &plan_command, argc, argv)) return -1;
    int id = read_options(a, &p);
    if (id == O_HELP) {
        opt_print_help(&plan_command, stdout);
        return 1;
    }
    if (id == OPT_ERROR) return -1;
    a->tensor_given = opt_given(&p, O_TENSOR);
    a->tensor_mode_given = opt_given(&p, O_TENSOR_MODE);
    if (opt_given(&p, O_STAGES) == opt_given(&p, O_RANKS))
        return opt_error(&p, "give --stages K (one layout) or --ranks N (search the layouts of "
                             "N ranks), not %s", a->ranks ? "both" : "neither");
    if (a->ranks) {
        if (check_search(a, &p)) return -1;
    } else if (opt_given(&p, O_MEMORY) || opt_given(&p, O_TOP)) {
        return opt_error(&p, "--memory-mb and --top go with --ranks");
    }
    if (!(a->bucket_mb > 0))
        return opt_error(&p, "--bucket-mb %g: must be positive", a->bucket_mb);
    if (a->emit && a->json)
        return opt_error(&p, "--emit prints a command, --json the plan: give one of them");
    if (a->gpus_per_stage && apply_gpus_per_stage(a, &p)) return -1;
    if (a->virtual_stages < 1) a->virtual_stages = 1;
    if (!a->recompute) a->recompute = "none";
    if (!a->schedule) a->schedule = "1f1b";
    /* the V schedules' default: two model chunks per rank (a --virtual 1 given is refused) */
    if (schedule_is_v(a->schedule) && opt_given(&p, O_VIRTUAL) && a->virtual_stages == 1)
        return opt_error(&p, "schedule %s places model chunks in a V (down the ranks and "
                         "back): it needs an even number of chunks per rank (2 unless "
                         "--virtual says), not --virtual 1", a->schedule);
    if (schedule_is_v(a->schedule) && a->virtual_stages == 1) a->virtual_stages = 2;
    if (a->schedule_memory > 0 && strcmp(a->schedule, "search"))
        return opt_error(&p, "--schedule-memory is the limit of --schedule search");
    if (check_zero(a, &p) || (!a->ranks && check_schedule(a, &p))) return -1;
    /* the layers are profiled on this CPU */
    if (a->precision == ENGINE_TF32)
        return opt_error(&p, "--precision tf32: plan profiles the layers on this CPU, which "
                         "has no TF32 unit (fp32 or bf16)");
    if (a->precision == ENGINE_BF16 && !kernel_bf16_available())
        return opt_error(&p, "%s", pt_error_get());
    if (a->exclusive && a->device == TOPO_DEVICE_CUDA)
        a->exclusive = 0; /* GPUs are never shared anyway */
    return split_batch(a, &p);
}

/* The layer times of one layout: profiled on this machine with the CPU kernels, whatever
 * --topology says, at the micro-batch size train would profile at (the "time" partition
 * and the prediction); with --tensor T as a rank of the tensor group computes, measured. */
static int profile_layers(partition_profile *prof, plan_args *a, const net_desc *net)
{
    /* the split backward only where it is priced */
    profile_options po = {.batch = a->replica_batch / a->microbatches, .warmup = 1,
                          .repeats = 3, .device = ENGINE_CPU,
                          .split = schedule_splits_backward(a->schedule),
                          .precision = a->precision};
    if (a->tensor == 1) return plan_costs_profile(prof, net, NULL, &po, a->costs);
    shard_plan sp;
    if (shard_plan_init(&sp, net, a->tensor, a->tensor_mode) < 0) return -1;
    int rc = plan_costs_profile(prof, net, &sp, &po, a->costs);
    shard_plan_free(&sp);
    if (rc < 0) return -1;
    a->shard_profile = 1;
    return 0;
}

/* --emit: the command that runs the plan, with train's options beyond the layout's. */
static int emit_command(const plan_args *a, const plan_built *b)
{
    char extra[512] = "";
    int len = 0;
    if (a->replicas > 1)
        len += snprintf(extra, sizeof extra, "--reduce %s --bucket-mb %g --overlap %s",
                        reduce_method_name(a->reduce), a->bucket_mb, a->overlap ? "on" : "off");
    if (a->virtual_stages > 1)
        len += snprintf(extra + len, sizeof extra - (size_t)len, "%s--virtual %d",
                        len ? " " : "", a->virtual_stages);
    if (a->schedule_memory > 0)
        len += snprintf(extra + len, sizeof extra - (size_t)len, "%s--schedule-memory %g",
                        len ? " " : "", a->schedule_memory);
    if (strcmp(a->recompute, "none"))
        len += snprintf(extra + len, sizeof extra - (size_t)len, "%s--recompute %s",
                        len ? " " : "", a->recompute);
    if (a->wgrad_batched)
        len += snprintf(extra + len, sizeof extra - (size_t)len, "%s--wgrad batched",
                        len ? " " : "");
    if (a->tensor > 1)
        snprintf(extra + len, sizeof extra - (size_t)len, "%s--tensor %d --tensor-mode %s",
                 len ? " " : "", a->tensor, tensor_mode_name(a->tensor_mode));
    plan_emit_args ea = {
        .kind = (plan_emit_kind)a->emit, .model = a->model, .stages = a->stages,
        .replicas = a->replicas, .nodes = a->nodes, .batch = a->batch,
        .microbatches = a->microbatches, .schedule = a->schedule, .train_options = extra,
        .cuda = a->device == TOPO_DEVICE_CUDA,
    };
    return plan_emit(stdout, &ea, &b->part, &b->pl);
}

/* The layout built, printed as --emit, --json or text ask. */
static int print_layout(const plan_args *a, const net_desc *net, const topo_machine *m,
                        const topo_cost_model *cm, const plan_built *b,
                        const partition_profile *prof)
{
    if (a->emit) return emit_command(a, b);
    plan_result r = {.a = a, .net = net, .part = &b->part, .m = m, .tr = &b->tr, .cm = cm,
                     .pl = &b->pl, .rank_time = b->rank_time, .pred = &b->pred,
                     .stage_bytes = b->stage_bytes, .shard = &b->shard,
                     .tensor_link = b->tensor_link, .tensor_first = b->tensor_first};
    if (a->json) return plan_print_json(&r, stdout);
    /* the layer times appear only where they chose the partition */
    plan_print_text(&r, !strcmp(a->method, "time") ? prof : NULL, stdout);
    return 0;
}

/* --stages K: the one layout, profiled, built and printed. */
static int plan_one(plan_args *a, const net_desc *net, const topo_machine *m,
                    const topo_cost_model *cm)
{
    if (a->virtual_stages > 1 && a->stages * a->virtual_stages > net->n_layers)
        return pt_error_set("cannot cut %d layers into %d model chunks (--stages %d x %d "
                            "chunks per rank): a chunk would be empty", net->n_layers,
                            a->stages * a->virtual_stages, a->stages, a->virtual_stages);
    if (partition_check(net->n_layers, a->stages * a->virtual_stages) < 0) return -1;
    /* a layout the machine cannot hold is refused before the seconds of profiling */
    topo_place_options po = {.device = a->device, .nodes = a->nodes, .exclusive = a->exclusive};
    if (topo_place_check(m, a->stages * a->replicas * a->tensor, &po) < 0) return -1;
    partition_profile prof = {0};
    if (profile_layers(&prof, a, net) < 0) return -1;
    plan_built b = {0};
    int rc = plan_build(&b, a, net, &prof, m, cm);
    if (rc == 0) rc = print_layout(a, net, m, cm, &b, &prof);
    plan_built_free(&b);
    partition_profile_free(&prof);
    return rc;
}

/* Whether every layer can be cut --tensor T ways, before any profiling. */
static int check_shards(const plan_args *a, const net_desc *net)
{
    shard_plan sp;
    if (shard_plan_init(&sp, net, a->tensor, a->tensor_mode) < 0) return -1;
    shard_plan_free(&sp);
    return 0;
}

int cmd_plan(int argc, char **argv)
{
    plan_args a;
    int rc = plan_parse(&a, argc, argv);
    if (rc)
        return rc == 1 ? PT_EXIT_OK : cli_usage_fail(); /* 1 = --help shown */
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    if ((a.bandwidth && topo_cost_model_parse(&cm, a.bandwidth, 0) < 0) ||
        (a.latency && topo_cost_model_parse(&cm, a.latency, 1) < 0)) {
        fprintf(stderr, "pipetrain: %s (see pipetrain plan --help)\n", pt_error_get());
        return PT_EXIT_USAGE;
    }
    net_desc net = {0};
    topo_t *t = NULL;
    rc = PT_EXIT_FAIL;
    if (net_desc_load(&net, a.model) < 0 || net_desc_check_trainable(&net, a.model) < 0 ||
        topo_init(&t, a.xml) < 0 ||
        ((!a.ranks || a.tensor_given) && check_shards(&a, &net) < 0) ||
        (a.costs && plan_costs_check(a.costs, &net) < 0))
        rc = cli_input_fail();
    else if (a.ranks) /* prints its own errors */
        rc = plan_search(&a, &net, topo_get_machine(t), &cm);
    else if (plan_one(&a, &net, topo_get_machine(t), &cm) < 0) /* a layout that cannot be */
        rc = cli_input_fail();
    else
        rc = 0;
    topo_free(t);
    net_desc_free(&net);
    return rc;
}
