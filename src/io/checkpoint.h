/* Whole-model checkpoints as safetensors: tensors "layers.<i>.weight" / "layers.<i>.bias",
 * i the layer's index among the model file's sections after [net]; a transformer layer's
 * tensors "layers.<i>.<GPT-2's name>" ("layers.1.attn.c_attn.weight", layer_tensors). */
#ifndef PT_CHECKPOINT_H
#define PT_CHECKPOINT_H

#include "src/model/net.h"

/* Writes the whole model from `all` (every parameter in layer order, as a stage holding
 * every layer stores them), with a CRC-32 of each tensor in its metadata. */
int checkpoint_save(const char *path, const net_desc *net, const float *all);
/* Fills the parameters of layers [first, last) in stage order (per layer its weight, then
 * its bias) from a file; a missing tensor or a wrong shape is an error. */
int checkpoint_load_layers(const char *path, const net_desc *net, int first, int last,
                           float *params);

/* Checkpoints to resume from: the parameters as above, the optimizer's moment buffers
 * under the same names with these prefixes ("optimizer.m.layers.3.weight"; momentum keeps
 * m, Adam m and v, plain SGD neither) and metadata (a NULL-terminated key, value list; see
 * src/io/checkpoint_dir.h for the keys train writes). m, v may be NULL: not written. */
#define CHECKPOINT_M_PREFIX "optimizer.m."
#define CHECKPOINT_V_PREFIX "optimizer.v."
int checkpoint_save_full(const char *path, const net_desc *net, const float *params,
                         const float *m, const float *v, const char *const *meta);
/* Layers [first, last) of the parameters and, where m or v is not NULL, of that moment
 * buffer; a missing tensor or a wrong shape is an error naming it. */
int checkpoint_load_full(const char *path, const net_desc *net, int first, int last,
                         float *params, float *m, float *v);

#endif
