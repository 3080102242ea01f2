/* The reduction module's planning side (src/reduce/reduce_plan.h): method names, the bucket
 * plan and the default (stage, replica) layout with its communicators. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/reduce/reduce_plan.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"

static const char *const method_names[REDUCE_METHOD_COUNT] = {
    [REDUCE_ALLREDUCE] = "allreduce",
    [REDUCE_REDUCE_BCAST] = "reduce-bcast",
    [REDUCE_GATHER_BCAST] = "gather-bcast",
    [REDUCE_ORDERED] = "ordered",
};

const char *reduce_method_name(reduce_method m)
{
    return (unsigned)m < REDUCE_METHOD_COUNT ? method_names[m] : "?";
}

int reduce_method_parse(const char *name, reduce_method *out)
{
    for (int m = 0; m < REDUCE_METHOD_COUNT; m++)
        if (name && !strcmp(name, method_names[m])) {
            *out = (reduce_method)m;
            return 0;
        }
    return pt_error_set("unknown --reduce '%s': the known methods are allreduce, "
                        "reduce-bcast, gather-bcast and ordered", name ? name : "");
}

int reduce_method_root_steps(reduce_method m)
{
    return m == REDUCE_REDUCE_BCAST || m == REDUCE_GATHER_BCAST;
}

int reduce_plan_buckets(reduce_plan *plan, const reduce_layer *layers, int n_layers,
                        size_t bucket_bytes)
{
    *plan = (reduce_plan){0};
    if (bucket_bytes == 0) return pt_error_set("the bucket size must be positive (--bucket-mb)");
    if (n_layers < 0) return pt_error_set("reduce_plan_buckets: %d layers", n_layers);
    size_t total = 0;
    int with_params = 0;
    for (int l = 0; l < n_layers; l++) {
        if (!layers[l].count) continue;
        if (layers[l].offset != total)
            return pt_error_set("layer %d's parameters start at element %zu, expected %zu: "
                                "the layers' gradients must be stored one after the other "
                                "in layer order", l, layers[l].offset, total);
        if (layers[l].count > INT_MAX)
            return pt_error_set("layer %d has %zu parameters: more than one MPI message "
                                "carries (%d)", l, layers[l].count, INT_MAX);
        total += layers[l].count;
        with_params++;
    }
    size_t cap = bucket_bytes / sizeof(float);
    if (cap < 1) cap = 1;
    if (cap > INT_MAX) cap = INT_MAX;
    plan->total_count = total;
    plan->buckets = malloc((size_t)with_params * sizeof *plan->buckets + 1);
    if (!plan->buckets) return pt_error_set("out of memory for %d buckets", with_params);
    reduce_bucket *cur = NULL;
    for (int l = n_layers - 1; l >= 0; l--) {
        size_t c = layers[l].count;
        if (!c) continue;
        if (cur && cur->count + c <= cap) { /* the layer joins the open bucket, below */
            cur->offset = layers[l].offset;
            cur->count += c;
            cur->first_layer = l;
            continue;
        }
        /* a new bucket; a layer larger than cap fills one alone */
        cur = &plan->buckets[plan->n_buckets++];
        *cur = (reduce_bucket){.offset = layers[l].offset, .count = c, .first_layer = l,
                               .last_layer = l};
    }
    return 0;
}

void reduce_plan_free(reduce_plan *plan)
{
    free(plan->buckets);
    *plan = (reduce_plan){0};
}

int reduce_layout_default(int rank, int stages, int replicas, int *stage_of,
                          int *replica_of)
{
    if (stages < 1 || replicas < 1 || rank < 0 || rank >= stages * replicas)
        return pt_error_set("rank %d has no place in %d stages × %d replicas", rank, stages,
                            replicas);
    *stage_of = rank / replicas;
    *replica_of = rank % replicas;
    return 0;
}

int reduce_comms_init(reduce_comms *c, MPI_Comm world, int stages, int replicas,
                      int my_stage, int my_replica, double timeout_s)
{
    *c = (reduce_comms){.stages = stages, .replicas = replicas, .stage = my_stage,
                        .replica = my_replica, .pipeline = MPI_COMM_NULL, .group = MPI_COMM_NULL};
    int rank, size;
    PT_MPI_CHECK(MPI_Comm_rank(world, &rank));
    PT_MPI_CHECK(MPI_Comm_size(world, &size));
    if (stages < 1 || replicas < 1)
        return pt_error_set("%d stages × %d replicas: both must be at least 1", stages,
                            replicas);
    if ((long)stages * replicas != size)
        return pt_error_set("the job has %d ranks but %d stages × %d replicas need %ld: run "
                            "with mpiexec -n %ld", size, stages, replicas,
                            (long)stages * replicas, (long)stages * replicas);
    /* Every rank checks every pair, so a bad placement fails on every rank alike, and a
     * rank that never arrives fails this polite all-gather instead of hanging a split. */
    int *pairs = malloc(2 * (size_t)size * sizeof *pairs);
    if (!pairs) return pt_error_set("out of memory");
    int mine[2] = {my_stage, my_replica};
    MPI_Request req;
    if (PT_MPI_CALL(MPI_Iallgather(mine, 2, MPI_INT, pairs, 2, MPI_INT, world, &req)) ||
        mpi_wait_collective(&req, world, timeout_s)) {
        free(pairs);
        return -1;
    }
    int rc = 0;
    char *seen = calloc((size_t)size, 1);
    for (int i = 0; i < size && !rc; i++) {
        int s = pairs[2 * i], p = pairs[2 * i + 1];
        if (s < 0 || s >= stages || p < 0 || p >= replicas)
            rc = pt_error_set("rank %d was placed at stage %d, replica %d: outside %d stages "
                              "× %d replicas", i, s, p, stages, replicas);
        else if (!seen)
            rc = pt_error_set("out of memory");
        else if (seen[(size_t)p * stages + s]++)
            rc = pt_error_set("two ranks were placed at stage %d, replica %d (the second is "
                              "rank %d)", s, p, i);
    }
    free(seen);
    free(pairs);
    if (rc) return -1;
    if (mpi_wait_split(world, my_replica, my_stage, timeout_s, &c->pipeline) ||
        mpi_wait_split(world, my_stage, my_replica, timeout_s, &c->group)) {
        reduce_comms_free(c);
        return -1;
    }
    return 0;
}

void reduce_comms_free(reduce_comms *c)
{
    if (c->pipeline != MPI_COMM_NULL) MPI_Comm_free(&c->pipeline);
    if (c->group != MPI_COMM_NULL) MPI_Comm_free(&c->group);
}
