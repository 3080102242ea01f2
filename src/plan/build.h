/* One layout of `plan` built: its settings (plan_args), the partition, tensor shards,
 * placement, predicted step and memory per rank (plan_build). Used by the command
 * (src/cli/cmd_plan.c, which prints it with src/plan/print.h) and the search
 * (src/plan/search.h). */
#ifndef PT_PLAN_BUILD_H
#define PT_PLAN_BUILD_H

#include <string.h>

#include "partition/partition.h"
#include "src/model/net.h"
#include "src/model/shard.h"
#include "src/plan/predict.h"
#include "src/runtime/profile.h"
#include "src/reduce/reduce.h"
#include "topologies/topo.h"

typedef struct {
    const char *model, *xml, *method, *bandwidth, *latency, *schedule;
    const char *recompute; /* --recompute: "none", "all" or a list of stages */
    int stages, replicas, nodes, batch, microbatches, gpus_per_stage, exclusive, json;
    int virtual_stages;    /* --virtual V (interleaved): K·V model chunks, V per rank */
    int wgrad_batched;     /* --wgrad batched (memory only: the step is priced as
                            * per-micro-batch weight gradients) */
    reduce_method reduce;
    double bucket_mb;
    int overlap;
    int zero; /* --zero: ZeRO stage priced (1: the moments sharded over the replicas);
               * with --ranks and --memory-mb the search tries 1 where 0 does not fit */
    int zero3_prefetch; /* --zero3-prefetch on */
    int zero_overlap;   /* --zero-overlap on (off: each bucket's reduction waited for as it
                         * starts, one bucket whole; the search tries it last) */
    int emit; /* 0, or plan_emit_kind */
    int replica_batch; /* batch / replicas: the samples each replica sees per step */
    topo_device device;
    /* --ranks N: search mode (0: the one layout --stages gives); --memory-mb X per rank
     * (0: no limit); --top K choices printed */
    int ranks, top;
    double memory_mb;
    /* --tensor T, --tensor-mode: T tensor shards per stage (1: none); the job's ranks are
     * stages × replicas × T, rank = t + T·(stage·replicas + replica) (plan_rank). With
     * --ranks: given, the search tries that T (and mode) only. */
    int tensor;
    tensor_mode tensor_mode;
    int shard_profile;   /* the profile given with these args is of the shards
                            (plan_profile_shards), not of whole layers */
    int tensor_given, tensor_mode_given;
    int cut;                /* how the layers are cut into K·V chunks: 0 as the schedule
                             * wants (plan_v_partition), 1 the chunks one by one, 2 the
                             * V's pairs (partition_by_method_placed) */
    double schedule_memory; /* --schedule search: micro-batches a rank may hold (0: any) */
    int search_runs;        /* the search's greedy orders at most (0: its default) */
    const char *costs;      /* --costs-file FILE: profiles read from it, measured ones added
                               (src/plan/costs.h); NULL: measured every time */
    engine_precision precision; /* --precision: the products the layers are profiled in */
} plan_args;

/* The rank of tensor shard t of stage s in replica r. */
/* The model chunk that chunk v of stage s runs: interleaved, or in a V for the V
 * schedules (schedule/schedule.h). */
static inline int plan_model_chunk(const plan_args *a, int s, int v)
{
    return schedule_model_chunk_of(a->stages, a->virtual_stages,
                                   schedule_is_v(a->schedule) ? SCHED_PLACE_V
                                                              : SCHED_PLACE_INTERLEAVED,
                                   s, v);
}

/* Whether the layers are cut for a V placement (partition_by_method_placed): a->cut where
 * set, else for the V schedules and a search with an even V (plan_build then tries the
 * chunks' cut too and keeps the faster, as train does). */
static inline int plan_v_partition(const plan_args *a)
{
    if (a->cut) return a->cut == 2;
    return schedule_is_v(a->schedule) ||
           (!strcmp(a->schedule, "search") && a->virtual_stages > 1 &&
            a->virtual_stages % 2 == 0);
}

static inline int plan_rank(const plan_args *a, int t, int s, int r)
{
    return t + a->tensor * topo_grid_rank(a->replicas, s, r);
}

/* One layout built: partition, traffic, placement, predicted step, memory per rank. */
typedef struct {
    const plan_args *a;
    const net_desc *net;
    const partition *part; /* K·V model chunks (V = a->virtual_stages) */
    const topo_machine *m;
    const topo_traffic *tr;
    const topo_cost_model *cm;
    const topo_placement *pl;
    double *rank_time;
    const plan_prediction *pred;
    const double *stage_bytes; /* per stage: estimated peak memory of one of its ranks */
    const shard_plan *shard;   /* the tensor shards (T = 1: none) */
    topo_link tensor_link;     /* T > 1: the slowest link inside a tensor group */
    int tensor_first;          /* the placement that keeps tensor groups close was kept */
} plan_result;

typedef struct {
    partition part;      /* K·V model chunks */
    topo_traffic tr;
    topo_placement pl;
    double *rank_time;   /* per rank, owned */
    plan_prediction pred;
    double *stage_bytes; /* per stage, owned */
    double peak_bytes;   /* the largest */
    shard_plan shard;    /* a->tensor shards (T = 1 plans nothing) */
    /* per stage (owned, one block of 2·stages): the slowest link of its tensor groups'
     * rings, as latency (s) and bandwidth (bytes/s); T = 1: 0 and 1 */
    double *tensor_alpha, *tensor_beta;
    topo_link tensor_link; /* the slowest of them (T > 1) */
    int tensor_first;      /* pl keeps the tensor groups close first (plan_layout tries it
                            * too, and keeps it where the step is predicted shorter) */
} plan_built;

/* Whether a->method's cut depends on the placement (partition_by_method_placed: a cost
 * method, V = 2): a search then prices both cuts. */
int plan_cut_matters(const plan_args *a);

/* Partitions (a->method, into K·V model chunks as train cuts them; a search with V = 2
 * both ways, keeping the shorter predicted step), plans the tensor shards
 * (a->tensor, a->tensor_mode), places the ranks on m,
 * predicts the step (plan_predict: a->schedule, a->virtual_stages, a->recompute) and
 * estimates each stage's memory per rank (plan_memory). −1 with a message. */
int plan_build(plan_built *b, const plan_args *a, const net_desc *net,
               const partition_profile *prof, const topo_machine *m, const topo_cost_model *cm);
void plan_built_free(plan_built *b);
/* plan_build in two halves, so that layouts that differ only in schedule or recomputation
 * share one partition and placement: plan_layout (partition, traffic, placement; *b
 * cleared on error) and plan_price (prediction and memory, replacing any earlier ones;
 * on error b keeps its layout and is still freed by plan_built_free). */
int plan_layout(plan_built *b, const plan_args *a, const net_desc *net,
                const partition_profile *prof, const topo_machine *m, const topo_cost_model *cm);
int plan_price(plan_built *b, const plan_args *a, const net_desc *net,
               const partition_profile *prof, const topo_machine *m, const topo_cost_model *cm);

/* Bytes of one activation message from model chunk c to c+1 (per micro-batch); 0 for the
 * last chunk. */
double plan_chunk_message_bytes(const plan_args *a, const net_desc *net, const partition *part,
                                int c);

#endif
