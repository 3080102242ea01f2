/* ZeRO-3 inside a stage's replica group (issue 27, docs/DESIGN.md "ZeRO inside a replica
 * group"): each replica keeps only its shard of the parameters (the ordered reduction's
 * shard of each bucket, src/reduce/reduce.h) backed; each layer's parameters are
 * all-gathered from their owners into their place before each of its passes (forward,
 * recompute, backward), the next layer's gather started when a layer begins (prefetch, one
 * layer ahead in the pass's direction; without it, each layer's when it begins, so that one
 * layer at a time is whole), and the layer's pages outside the shard go back
 * after the pass. The engine calls the hook (engine_ops.params_shard); every replica runs
 * the same schedule, so every replica issues the same gathers in the same order, on a
 * communicator of their own. */
#ifndef PT_REPLICAS_ZERO3_H
#define PT_REPLICAS_ZERO3_H

#include <mpi.h>

#include "src/engine/engine.h"
#include "src/model/net.h"
#include "src/reduce/reduce.h"
#include "src/reduce/reduce_plan.h"

typedef struct zero3 zero3_t;

/* Collective over `group` (MPI_Comm_dup): the layers [first, last) of the stage whose
 * buckets `plan` cuts and `red` shards; installs the hook in the engine. Testing: the
 * layers of bucket skip_bucket (−1: none) are never gathered (the run must differ). */
int zero3_init(zero3_t **z, MPI_Comm group, engine *eng, const net_desc *net, int first,
               int last, const reduce_plan *plan, const reduce_t *red, double timeout_s,
               int skip_bucket, int prefetch);
void zero3_free(zero3_t *z);
/* Before the step: waits for the gathers in flight (they would carry the old values). */
int zero3_settle(zero3_t *z);
/* After the step (or a checkpoint's read): every layer's pages outside the shard go back;
 * the next pass gathers again. */
int zero3_release_all(zero3_t *z);
/* Collective: every layer gathered whole (a checkpoint reads the parameters); release
 * with zero3_release_all after the read. */
int zero3_whole(zero3_t *z);
/* Collective: every layer's gather started at once into a scratch array of the stage's
 * size and waited for, as the replicas' calibration times one pass's gathers; the engine's
 * parameters are not touched (its pages and mirrors stay as they are). The scratch stays
 * (its pages touched once) until zero3_calibrate_done. */
int zero3_calibrate(zero3_t *z);
void zero3_calibrate_done(zero3_t *z);
/* Gathers started (layer by layer) and their bytes received by this replica, since init. */
void zero3_stats(const zero3_t *z, long *gathers, size_t *bytes, double *wait_s);

#endif
