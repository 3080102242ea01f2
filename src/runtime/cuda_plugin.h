/* Loading the CUDA plugin (the types it shares with the host: src/engine/cuda_abi.h),
 * and the host-side CUDA questions that need it: the device for a rank, and whether MPI
 * can move device memory. */
#ifndef PT_CUDA_PLUGIN_H
#define PT_CUDA_PLUGIN_H

#include <mpi.h>

#include "src/engine/cuda_abi.h"

/* Host side (src/runtime/cuda_plugin.c). Loads the plugin once per process: $PIPETRAIN_CUDA_PLUGIN
 * if set, else PT_CUDA_PLUGIN_FILE in the directory of the running executable. −1 with a
 * message naming the file and the reason (built without CUDA, dlopen error, ABI mismatch). */
int cuda_plugin_load(const cuda_plugin **out);

/* Whether the MPI library can send and receive device memory (CUDA-aware), asked at run
 * time (MPIX_GPU_query_support / MPIX_Query_cuda_support where the library has them);
 * $PIPETRAIN_CUDA_AWARE_MPI=0 or 1 overrides. After MPI_Init. */
int cuda_mpi_aware(void);

/* The CUDA device for this rank: by default local rank mod device count (several ranks may
 * share a GPU). When the rank is bound to cores (--bind) and the machine's topology places
 * GPUs (topologies/), the GPUs nearest to those cores come first. Collective over comm
 * (it splits off the node's ranks). Fills *device and, if info != NULL, its description. */
int cuda_pick_device(MPI_Comm comm, const cuda_plugin *p, int verbose, double timeout_s,
                     int *device, cuda_device_info *info);

#endif
