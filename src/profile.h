/* The layer profiler behind the `time` partitioner: it drives the engines (src/engine.h),
 * so it sits beside them rather than in partition/, which only consumes its figures. */
#ifndef PT_PROFILE_H
#define PT_PROFILE_H

#include "partition/partition.h"

/* Measures each layer of `net` on this machine with the CPU kernels (batch `batch`,
 * `warmup` untimed runs, then the median of `repeats`), in seconds per sample.
 */
int partition_profile_measure(partition_profile *prof, const net_desc *net, int batch,
                              int warmup, int repeats);
/* The same on a device (src/engine.h: ENGINE_CPU, or ENGINE_CUDA on GPU `gpu`). */
int partition_profile_measure_on(partition_profile *prof, const net_desc *net, int batch,
                                 int warmup, int repeats, int device, int gpu);

#endif
