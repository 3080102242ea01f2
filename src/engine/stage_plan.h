/* The rules of a pipeline stage that every engine (the CPU's, src/cpu/, and the CUDA
 * plugin's, src/cuda/) shares: they must agree bit for bit, so each is written once, here. */
#ifndef PT_STAGE_PLAN_H
#define PT_STAGE_PLAN_H

#include <stddef.h>

typedef enum { OPTIM_SGD = 0, OPTIM_MOMENTUM, OPTIM_ADAM } optimizer_kind;

typedef struct {
    optimizer_kind kind;
    float lr, momentum, weight_decay;
    float beta1, beta2, eps;
} optimizer_config;

/* Tensor shards (src/model/shard.h): the collectives of the stage's tensor group, given by
 * the executor (the stage itself knows no MPI). Each waits until done; −1 with a message.
 * allreduce: sums n floats in place over the group. allgather: every rank's `count[r]`
 * floats (this rank's at `send`) into `recv`, rank by rank in rank order. */
typedef struct {
    void *ctx;
    int (*allreduce)(void *ctx, float *buf, size_t n);
    int (*allgather)(void *ctx, const float *send, float *recv, const size_t *count);
} stage_tensor_comm;

#endif
