/* The engine factory: the CPU engine (src/cpu/) or the CUDA plugin's (src/cuda/). */
#ifndef PT_ENGINE_CREATE_H
#define PT_ENGINE_CREATE_H

#include "src/engine/engine.h"

/* Creates the engine for a device. ENGINE_CUDA loads the CUDA plugin
 * (src/runtime/cuda_plugin.h) and fails with a message when it or a usable GPU is missing.
 * engine_destroy frees it. */
int engine_create(engine **e, engine_device device, const engine_config *cfg);

#endif
