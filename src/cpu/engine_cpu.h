/* The CPU engine: a stage (src/cpu/stage.h) and its host buffers behind the engine
 * interface (src/engine/engine.h). */
#ifndef PT_ENGINE_CPU_H
#define PT_ENGINE_CPU_H

#include "src/engine/engine.h"

int engine_cpu_create(engine **e, const engine_config *cfg);

#endif
