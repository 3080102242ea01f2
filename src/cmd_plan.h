/* Internal to the `plan` command (src/cmd_plan.c, src/plan_search.c): its settings and
 * one layout built from them. */
#ifndef PT_CMD_PLAN_H
#define PT_CMD_PLAN_H

#include "partition/partition.h"
#include "src/model/net.h"
#include "src/plan_predict.h"
#include "src/profile.h"
#include "src/reduce.h"
#include "topologies/topo.h"

typedef struct {
    const char *model, *xml, *method, *bandwidth, *latency, *schedule;
    int stages, replicas, nodes, batch, microbatches, gpus_per_stage, exclusive, json;
    reduce_method reduce;
    double bucket_mb;
    int overlap;
    int emit; /* 0, or plan_emit_kind */
    int replica_batch; /* batch / replicas: the samples each replica sees per step */
    topo_device device;
    /* --ranks N: search mode (0: the one layout --stages gives); --memory-mb X per rank
     * (0: no limit); --top K choices printed */
    int ranks, top;
    double memory_mb;
} plan_args;

/* One layout built: partition, traffic, placement, predicted step, memory per stage. */
typedef struct {
    const plan_args *a;
    const net_desc *net;
    const partition *part;
    const topo_machine *m;
    const topo_traffic *tr;
    const topo_cost_model *cm;
    const topo_placement *pl;
    double *rank_time;
    const plan_prediction *pred;
    const double *stage_bytes; /* per stage: estimated peak memory of one of its ranks */
} plan_result;

typedef struct {
    partition part;
    topo_traffic tr;
    topo_placement pl;
    double *rank_time;   /* per rank, owned */
    plan_prediction pred;
    double *stage_bytes; /* per stage, owned */
    double peak_bytes;   /* the largest */
} plan_built;

/* Partitions (a->method), places the ranks on m, predicts the step and estimates each
 * stage's memory (plan_memory). −1 with a message. */
int plan_build(plan_built *b, const plan_args *a, const net_desc *net,
               const partition_profile *prof, const topo_machine *m, const topo_cost_model *cm);
void plan_built_free(plan_built *b);

/* Peak bytes one rank of each stage allocates (stage_estimate: parameters, gradients, both
 * moment buffers, gradient groups, workspaces, one activation slot per micro-batch the
 * schedule keeps in flight there; plus the engine's micro-batch input, gradient and label
 * buffers, two steps' worth). out: part->stages entries. −1 with a message. */
int plan_memory(double *out, const net_desc *net, const partition *part, const char *sched_name,
                int microbatches, int microbatch);

/* --ranks: every layout of a->ranks ranks (stages × replicas, micro-batches, schedule,
 * partition a->method) built and ranked; prints the best a->top (text or JSON) and why the
 * runner-up lost. Returns the exit status. */
int plan_search(const plan_args *a, const net_desc *net, const topo_machine *m,
                const topo_cost_model *cm);

#endif
