/* Whole-model checkpoints as safetensors: tensors "layers.<i>.weight" / "layers.<i>.bias",
 * i the layer's index among the model file's sections after [net]. */
#ifndef PT_CHECKPOINT_H
#define PT_CHECKPOINT_H

#include "src/model/net.h"

/* Writes the whole model from `all` (every parameter in layer order, as a stage holding
 * every layer stores them). */
int checkpoint_save(const char *path, const net_desc *net, const float *all);
/* Fills the parameters of layers [first, last) in stage order (per layer its weight, then
 * its bias) from a file; a missing tensor or a wrong shape is an error. */
int checkpoint_load_layers(const char *path, const net_desc *net, int first, int last,
                           float *params);

#endif
