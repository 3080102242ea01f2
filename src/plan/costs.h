/* plan --costs-file FILE: the layer costs plan measures, kept in a file and used again.
 *
 * Every plan profiles the model's layers on this machine's CPU (src/runtime/profile.h), at
 * each micro-batch size and tensor cut it prices: a search of 8 ranks measures a dozen
 * profiles, seconds of work, and two plans see two slightly different machines. With a
 * costs file, a profile the file holds is read instead of measured, and one it lacks is
 * measured and added, so that plans made one after another (or elsewhere: a login node
 * planning with a compute node's costs) price layouts from the same figures.
 *
 * The file is text, one profile per block, keyed by what changes the figures:
 *
 *   pipetrain-costs 1 model 9c0f...e1 layers 11 host node17
 *   profile microbatch 64 tensor 1 mode megatron split 1      (+ " precision bf16" for
 *                                                             plan --precision bf16's)
 *   <forward s> <backward s> <input-gradient s> <weight-gradient s>    one line per layer,
 *   ...                                                                 seconds per sample,
 *                                                                       −1: not measured
 * `model` is a digest of the layer descriptions (not of the file's text): costs measured
 * for another model are refused by name. Writes go to a temporary beside the file and are
 * renamed over it. */
#ifndef PT_PLAN_COSTS_H
#define PT_PLAN_COSTS_H

#include "partition/partition.h"
#include "src/model/net.h"
#include "src/model/shard.h"
#include "src/runtime/profile.h"

/* The profile of `net` at po's micro-batch (cut by `sp` when non-NULL: the shards a rank
 * of the tensor group computes, plan_profile_shards), read from the costs file `path` when
 * it holds one with the same key, else measured and added to it. path NULL: measured
 * only. −1 with a message (a file of another model, malformed, unwritable). */
int plan_costs_profile(partition_profile *prof, const net_desc *net, const shard_plan *sp,
                       const profile_options *po, const char *path);

/* Before any measurement: the costs file `path`, where it exists, is a well-formed file of
 * this model, and its directory takes the temporary a write needs. −1 with a message. */
int plan_costs_check(const char *path, const net_desc *net);

/* The digest that keys a model's costs: 64-bit FNV-1a over the layers' descriptions. */
unsigned long long plan_costs_model_digest(const net_desc *net);

#endif
