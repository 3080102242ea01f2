/* `plan --ranks N`: the search over every layout of N ranks (src/plan/build.h builds each). */
#ifndef PT_PLAN_SEARCH_H
#define PT_PLAN_SEARCH_H

#include "src/plan/build.h"

/* --ranks: every layout of a->ranks ranks (stages × replicas × tensor shards in both modes,
 * micro-batches, schedule with
 * its virtual stages, recomputation off or everywhere; partition a->method) built and
 * ranked; prints the best a->top that fit a->memory_mb (text or JSON) and why the
 * runner-up lost, or fails naming the smallest layout when none fits. Returns the exit
 * status. */
int plan_search(const plan_args *a, const net_desc *net, const topo_machine *m,
                const topo_cost_model *cm);

#endif
