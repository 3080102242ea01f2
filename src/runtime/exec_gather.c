/* The whole model's parameters, and for checkpoints the optimizer's state, gathered from
 * every stage (and tensor shard) onto the pipeline's stage 0. */
#include "src/runtime/exec_impl.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"

/* One array of every stage gathered on the pipeline's rank 0, politely (under --timeout).
 * `mine` floats from this rank, −1 when it could not read them (rank 0 then fails). */
static int gather_array(exec_t *e, const float *local, int mine, float *all, const char *what)
{
    int *counts = calloc((size_t)e->size, sizeof *counts);
    int *displs = calloc((size_t)e->size, sizeof *displs);
    if (!counts || !displs) {
        free(counts);
        free(displs);
        return pt_error_set("out of memory");
    }
    int ok = mine >= 0, n = ok ? mine : 0;
    MPI_Request req;
    int rc = PT_MPI_CALL(MPI_Igather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, e->comm, &req)) ||
             mpi_wait_collective(&req, e->comm, e->cfg.timeout_s);
    long total = 0;
    if (!rc && e->rank == 0)
        for (int r = 0; r < e->size; r++) {
            displs[r] = (int)total;
            total += counts[r];
        }
    /* stages hold consecutive layers, so their blocks concatenate into the whole model */
    if (!rc)
        rc = PT_MPI_CALL(MPI_Igatherv(local, n, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0,
                                      e->comm, &req)) ||
             mpi_wait_collective(&req, e->comm, e->cfg.timeout_s);
    free(counts);
    free(displs);
    if (rc) return -1;
    if (!ok) return -1;
    if (e->rank == 0 && (size_t)total != e->net->stored_count)
        return pt_error_set("gathering the %s: another stage could not read its own", what);
    return 0;
}

/* Rank 0 (V > 1): the gathered blocks come rank by rank, each its chunks v = 0..V−1 in
 * turn; the model's order is the schedule's placement's (schedule_chunk_place). */
static int reorder_chunks(const exec_t *e, float *all)
{
    int K = e->size, V = e->V;
    size_t total = e->net->stored_count;
    float *tmp = malloc((total ? total : 1) * sizeof *tmp);
    if (!tmp) return pt_error_set("out of memory for the parameters");
    memcpy(tmp, all, total * sizeof *tmp);
    size_t dst = 0;
    for (int c = 0; c < K * V; c++) {
        int rank, v, pl = e->sched->placement;
        schedule_chunk_place(K, V, pl, c, &rank, &v);
        size_t src = 0;
        for (int q = 0; q < K * V; q++) {
            int rq, vq;
            schedule_chunk_place(K, V, pl, q, &rq, &vq);
            if (rq < rank || (rq == rank && vq < v)) src += e->chunk_params[q];
        }
        memcpy(all + dst, tmp + src, e->chunk_params[c] * sizeof *all);
        dst += e->chunk_params[c];
    }
    free(tmp);
    return 0;
}

/* This rank's parameters (and optimizer moments) of its chunks in turn; 0 or −1. */
static int read_local(exec_t *e, float *local, size_t P, int state, long *upd)
{
    size_t off = 0;
    for (int q = 0; q < e->V; q++) {
        engine *g = e->engs[q];
        replicas_t *rp = e->reps ? e->reps[q] : NULL; /* ZeRO: the group's shards */
        /* ZeRO-3: the parameters gathered whole for the read (exec_zero_params_send on the
         * other replicas), given back after */
        if (replicas_params_whole(rp) || engine_read_params(g, local + off)) return -1;
        if (state && (rp ? replicas_read_state(rp, local + P + off, local + 2 * P + off, upd)
                         : engine_read_state(g, local + P + off, local + 2 * P + off, upd)))
            return -1;
        if (replicas_params_done(rp)) return -1;
        off += g->param_count;
    }
    return 0;
}

/* Tensor shards: this rank's arrays (`arrays` of P floats each, one after the other) to
 * tensor rank 0, which makes the whole tensors of its stage's layers of them (`whole`,
 * arrays of W floats). Collective over the tensor group; ok = 0: this rank sends nothing
 * (rank 0 then fails, and every rank still takes part). */
static int tensor_whole(exec_t *e, const float *local, size_t P, int arrays, int ok,
                        float *whole, size_t W)
{
    const shard_plan *sp = e->cfg.shard;
    MPI_Comm tc = e->cfg.tensor;
    double to = e->cfg.timeout_s;
    int T = sp->T, me = e->cfg.tensor_rank, counts[T], displs[T];
    long n = ok ? (long)P * arrays : 0;
    if (n > INT_MAX) n = 0, ok = pt_error_set("a stage's parameters are too many for MPI") == 0;
    int mine = (int)n;
    MPI_Request req;
    if (PT_MPI_CALL(MPI_Iallgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, tc, &req)) ||
        mpi_wait_collective(&req, tc, to))
        return -1;
    long total = 0;
    for (int r = 0; r < T; r++) {
        displs[r] = (int)total;
        total += counts[r];
    }
    float *all = me == 0 ? malloc((size_t)(total ? total : 1) * sizeof *all) : NULL;
    int root_ok = me != 0 || (all && total <= INT_MAX);
    if (PT_MPI_CALL(MPI_Iallreduce(MPI_IN_PLACE, &root_ok, 1, MPI_INT, MPI_MIN, tc, &req)) ||
        mpi_wait_collective(&req, tc, to) || !root_ok) {
        free(all);
        return root_ok ? -1 : pt_error_set("tensor rank 0: out of memory for the shards");
    }
    int rc = PT_MPI_CALL(MPI_Igatherv(local, mine, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0,
                                      tc, &req)) ||
             mpi_wait_collective(&req, tc, to);
    for (int t = 0; !rc && me == 0 && t < T; t++) {
        size_t Pt = 0;
        for (int q = 0; q < e->V; q++)
            Pt += shard_param_count(sp, e->net, e->engs[q]->cfg.first, e->engs[q]->cfg.last, t);
        if ((long)Pt * arrays != counts[t]) {
            rc = pt_error_set("gathering the tensor shards: tensor rank %d could not read its "
                              "own", t);
            break;
        }
        for (int a = 0; a < arrays; a++) {
            float *src = all + displs[t] + (size_t)a * Pt;
            size_t lo = 0, wo = 0;
            for (int q = 0; q < e->V; q++) {
                int f = e->engs[q]->cfg.first, l = e->engs[q]->cfg.last;
                shard_copy_layers(sp, e->net, f, l, t, src + lo, whole + (size_t)a * W + wo, 0);
                lo += shard_param_count(sp, e->net, f, l, t);
                for (int k = f; k < l; k++)
                    wo += e->net->layers[k].weight_count + e->net->layers[k].bias_count;
            }
        }
    }
    free(all);
    return rc || !ok ? -1 : 0;
}

int exec_gather_state(exec_t *e, float *params, float *m, float *v, int with_m, int with_v,
                      long *updates)
{
    size_t P = 0;
    for (int q = 0; q < e->V; q++) P += e->engs[q]->param_count;
    float *local = malloc(3 * (P ? P : 1) * sizeof *local);
    long upd = 0;
    int ok = local ? read_local(e, local, P, with_m || with_v, &upd) == 0
                   : pt_error_set("out of memory for the parameters") == 0;
    if (e->cfg.shard && e->cfg.shard->T > 1) {
        /* whole tensors on tensor rank 0, whose pipeline then gathers them as below */
        size_t W = 0;
        for (int c = 0; c < e->V; c++) W += e->chunk_params[c * e->size + e->rank];
        float *whole = e->cfg.tensor_rank == 0 ? malloc(3 * (W ? W : 1) * sizeof *whole) : NULL;
        if (e->cfg.tensor_rank == 0 && !whole) ok = pt_error_set("out of memory") == 0;
        int rc = tensor_whole(e, local, P, with_m || with_v ? 3 : 1, ok, whole, W);
        free(local);
        if (e->cfg.tensor_rank != 0) {
            if (updates) *updates = upd;
            return rc;
        }
        local = whole;
        P = W;
        ok = ok && !rc && whole;
    }
    /* A rank whose copy failed sends nothing: rank 0 then sees a short model, and every
     * rank still takes part in every gather. */
    int mine = ok ? (int)P : -1;
    int rc = gather_array(e, local, mine, params, "parameters");
    /* every rank takes part in the same gathers (m and v matter on rank 0 only) */
    if (with_m && gather_array(e, local + P, mine, m, "optimizer's first moments")) rc = -1;
    if (with_v && gather_array(e, local + 2 * P, mine, v, "optimizer's second moments")) rc = -1;
    free(local);
    if (!rc && e->V > 1 && e->rank == 0) {
        if (reorder_chunks(e, params)) rc = -1;
        if (!rc && with_m && reorder_chunks(e, m)) rc = -1;
        if (!rc && with_v && reorder_chunks(e, v)) rc = -1;
    }
    if (updates) *updates = upd; /* every stage takes the same number of updates */
    return rc;
}

int exec_gather_params(exec_t *e, float *all)
{
    return exec_gather_state(e, all, NULL, NULL, 0, 0, NULL);
}
