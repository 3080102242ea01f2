/* Cutting a layer list into K contiguous pipeline stages. */
#ifndef PT_PARTITION_H
#define PT_PARTITION_H

#include <stdio.h>

#include "src/model/net.h"

typedef struct {
    int stages;
    int n_layers;
    int *first; /* owned, stages + 1 entries: stage s holds layers [first[s], first[s+1]) */
} partition;

/* Equal numbers of layers (the first n_layers % K stages take one more). */
int partition_uniform(partition *p, int n_layers, int stages);
/* Exact minimisation of the largest stage cost (sum of cost[l] over its layers) over all
 * contiguous cuts into non-empty stages; ties broken towards the lexicographically
 * smallest cut, so the answer is deterministic. Costs must be finite and ≥ 0. */
int partition_min_max(partition *p, const double *cost, int n_layers, int stages);
/* The same for a V placement of two chunks per rank over `ranks` ranks: 2·ranks chunks,
 * rank k running chunks k and 2·ranks−1−k (zb-v, v-half, v-min, dualpipev). Minimises the
 * largest pair sum (a rank's work), then, among the cuts whose pairs are all within 1% of
 * that, the largest chunk. Exact for
 * models of up to 128 layers; longer ones get partition_min_max's chunks. */
int partition_min_max_v(partition *p, const double *cost, int n_layers, int ranks);
/* An explicit list of layer counts, "4,3,4": they must be positive and add up. */
int partition_from_counts(partition *p, const char *list, int n_layers, int stages);
void partition_free(partition *p);

/* Layers per stage must be ≥ 1: more stages than layers is an error. */
int partition_check(int n_layers, int stages);

/* Per-layer costs a method balances (and the planner's simulator prices). */
typedef struct {
    double *fwd_s, *bwd_s; /* owned; measured seconds per sample for forward / backward */
    /* owned, may be NULL (not measured, e.g. on a GPU): the backward split as zero-bubble
     * schedules run it, seconds per sample of the input gradient (B) and of the parameter
     * gradients (W, 0 for a layer without parameters); B + W is about bwd_s */
    double *bwd_input_s, *bwd_weight_s;
    int n_layers;
} partition_profile;

void partition_profile_free(partition_profile *prof);

/* Chooses a partition by method: "uniform", "params" (balanced parameter bytes), "time"
 * (balanced fwd+bwd time of `profile`, which must then be non-NULL), or a list of counts.
 * An unknown method is an error naming the known ones. */
int partition_by_method(partition *p, const char *method, const net_desc *net,
                        const partition_profile *profile, int stages);

/* partition_by_method for `ranks` ranks of `virtual_stages` chunks each (ranks·V chunks);
 * with v_placement and V = 2 the cost methods ("time", "params") balance each rank's pair
 * of chunks (partition_min_max_v) instead of the chunks one by one. */
int partition_by_method_placed(partition *p, const char *method, const net_desc *net,
                               const partition_profile *profile, int ranks,
                               int virtual_stages, int v_placement);

/* Table: stage, layers (first–last and types), parameters, estimated time per sample
 * (when profile is given), boundary activation values per sample; then the imbalance,
 * slowest / mean, of time (or of parameters without a profile). */
void partition_print(const partition *p, const net_desc *net,
                     const partition_profile *profile, FILE *out);
/* Imbalance of per-stage cost: max / mean. */
double partition_imbalance(const partition *p, const double *cost);

#endif
