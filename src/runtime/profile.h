/* The layer profiler behind the `time` partitioner: it drives the engines (src/engine/engine.h),
 * so it sits beside them rather than in partition/, which only consumes its figures. */
#ifndef PT_PROFILE_H
#define PT_PROFILE_H

#include "partition/partition.h"
#include "src/engine/engine.h"

typedef struct {
    int batch;           /* samples per run */
    int warmup, repeats; /* untimed runs, then the median of `repeats` */
    int device, gpu;     /* src/engine/engine.h: ENGINE_CPU, or ENGINE_CUDA on GPU `gpu` */
    int split;           /* also the split backward (bwd_input_s, bwd_weight_s): CPU only,
                          * ignored elsewhere (they stay NULL) */
    engine_precision precision; /* the products' (--precision; 0: fp32) */
} profile_options;

/* Measures each layer of `net`, in seconds per sample. −1 with a message. */
int partition_profile_measure_with(partition_profile *prof, const net_desc *net,
                                   const profile_options *opt);
/* On this machine's CPU, with the split backward (the planner's). */
int partition_profile_measure(partition_profile *prof, const net_desc *net, int batch,
                              int warmup, int repeats);
/* On a device, forward and fused backward only (the "time" partitioner's). */
int partition_profile_measure_on(partition_profile *prof, const net_desc *net, int batch,
                                 int warmup, int repeats, int device, int gpu);

#endif
