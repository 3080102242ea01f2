/* The engine factory: the CPU engine (src/cpu/) or the CUDA plugin's (src/cuda/). */
#ifndef PT_ENGINE_CREATE_H
#define PT_ENGINE_CREATE_H

#include "src/engine/engine.h"

/* Creates the engine for a device. ENGINE_CUDA loads the CUDA plugin
 * (src/runtime/cuda_plugin.h) and fails with a message when it or a usable GPU is missing.
 * engine_destroy frees it. */
int engine_create(engine **e, engine_device device, const engine_config *cfg);

/* The engines of one rank's V model chunks (cfg[v], each with its own chunk's peak of
 * slots). On the CPU with V > 1 the chunks' stages share one stage_rank_pool: the
 * gradient groups' pages and the workers' scratch always, and, when the rank holds at most
 * rank_slots micro-batches over its chunks at once (the verifier's peak) and that is fewer
 * than the chunks' slots together, rank_slots slot units, each as large as the largest
 * chunk's slot with its split backward's gradients (plan_memory prices the same). On
 * failure the engines made so far are in e[] (NULL after them) for the caller to destroy. */
int engine_create_chunks(engine **e, int V, engine_device device, const engine_config *cfg,
                         int rank_slots);

#endif
