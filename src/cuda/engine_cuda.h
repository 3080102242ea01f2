/* The CUDA engine (src/engine/engine.h) inside the CUDA plugin: a stage whose parameters,
 * gradients, optimizer state and activations live on one GPU for the whole run. */
#ifndef PT_ENGINE_CUDA_H
#define PT_ENGINE_CUDA_H

#include "src/engine/engine.h"

/* Creates the engine on cfg->device; −1 with a message when the device is unusable or
 * its memory is short. */
int engine_cuda_create(engine **e, const engine_config *cfg);

#endif
