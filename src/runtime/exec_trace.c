/* The executor's trace (--trace, docs/TRACE.md): each rank records its events on its own
 * clock, and exec_write_trace puts every rank's on world rank 0's clock in one file. */
#include "src/runtime/exec_impl.h"

#include <stdio.h>
#include <stdlib.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"

/* The clock of the trace: pt_now() (the engines stamp their events with it), moved when
 * testing by PIPETRAIN_DEBUG_CLOCK_SKEW. */
static double trace_time(const exec_t *e, double t) { return trace_skew_apply(&e->skew, t); }
static double trace_now(void *e) { return trace_time(e, pt_now()); }

/* This rank's trace clock against world rank 0's (collective over the world). */
static int sync_clock(exec_t *e)
{
    return trace_clock_measure(&e->clock, e->world, tag_of(TAG_CLOCK, 0), trace_now, e,
                               e->cfg.timeout_s);
}

int exec_start_trace(exec_t *e)
{
    /* The ranks' clocks may differ (other hosts), and no two ranks leave a barrier at the
     * same moment: each rank's trace times count from its own origin, and the writer puts
     * them on world rank 0's clock with the offsets measured now and at the end. */
    if (trace_skew_from_env(e->world_rank, &e->skew)) return -1;
    e->clock = (trace_clock){.n = 0};
    if (sync_clock(e)) return -1;
    e->t_origin = trace_time(e, pt_now());
    return 0;
}

void exec_record_message(exec_t *e, trace_kind kind, double t0, double t1, int m, int v,
                         int peer, int recv_v)
{
    if (!e->cfg.trace) return;
    int grad = kind == TRACE_SEND_GRAD || kind == TRACE_WAIT_GRAD;
    int sender = kind == TRACE_SEND_ACT || kind == TRACE_SEND_GRAD ? e->rank : peer;
    int M = e->cfg.microbatches;
    trace_event ev = {
        .t0 = trace_time(e, t0) - e->t_origin, .t1 = trace_time(e, t1) - e->t_origin,
        .kind = (int)kind, .microbatch = m, .chunk = m < 0 ? -1 : v, .rank = e->world_rank,
        .step = e->trace_step,
        .flow = peer < 0 ? -1 : trace_flow_id(e->trace_step, grad, recv_v * M + m, e->V * M,
                                              e->pipe_world[sender], e->world_size),
    };
    trace_add(&e->trace, &ev);
}

void exec_record(exec_t *e, trace_kind kind, double t0, double t1, int m, int v)
{
    exec_record_message(e, kind, t0, t1, m, v, -1, v);
}

void exec_record_tensor(exec_t *e, double t0, size_t bytes)
{
    if (!e->cfg.trace) return;
    double t1 = pt_now();
    trace_event ev = {
        .t0 = trace_time(e, t0) - e->t_origin, .t1 = trace_time(e, t1) - e->t_origin,
        .kind = TRACE_TENSOR, .microbatch = -1, .chunk = -1, .rank = e->world_rank,
        .step = e->trace_step, .flow = -1, .bytes = (long long)bytes,
    };
    trace_add(&e->trace, &ev);
}

/* A bucket's reduction among the stage's replicas, with its size. */
static void record_reduction(exec_t *e, double t0, double t1, int bucket, size_t bytes)
{
    trace_event ev = {
        .t0 = trace_time(e, t0) - e->t_origin, .t1 = trace_time(e, t1) - e->t_origin,
        .kind = TRACE_REDUCE, .microbatch = bucket, .chunk = -1, .rank = e->world_rank,
        .step = e->trace_step, .flow = -1, .bytes = (long long)bytes,
    };
    trace_add(&e->trace, &ev);
}

void exec_record_reductions(exec_t *e)
{
    for (int v = 0; e->cfg.trace && e->reps && v < e->V; v++)
        for (int b = 0; b < replicas_buckets(e->reps[v]); b++) {
            double t0, t1;
            size_t bytes;
            if (replicas_bucket_event(e->reps[v], b, &t0, &t1, &bytes))
                record_reduction(e, t0, t1, e->rep_base[v] + b, bytes);
        }
}

int exec_write_trace(exec_t *e, const char *path)
{
    /* the clocks again: with the start's figures, they give each rank's drift */
    if (sync_clock(e)) return -1;
    trace_rank me = {.rank = e->world_rank, .stage = e->rank, .origin = e->t_origin,
                     .clock = e->clock, .replica = e->replica, .replicas = e->replicas,
                     .tensor = e->cfg.tensor_rank, .tensors = e->cfg.shard ? e->cfg.shard->T : 1};
    snprintf(me.host, sizeof me.host, "%s", e->host);
    snprintf(me.schedule, sizeof me.schedule, "%s", e->sched->name);
    snprintf(me.schedule_origin, sizeof me.schedule_origin, "%s", e->sched->origin);
    me.microbatches = e->cfg.microbatches;
    me.chunks = e->V;
    trace_rank ranks[e->world_size];
    PT_MPI_CHECK(MPI_Gather(&me, (int)sizeof me, MPI_BYTE, ranks, (int)sizeof me, MPI_BYTE, 0,
                            e->world));
    /* Events travel as raw bytes: every rank runs the same binary on one architecture. */
    int bytes = (int)(e->trace.n * sizeof(trace_event));
    int counts[e->world_size], displs[e->world_size];
    PT_MPI_CHECK(MPI_Gather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, 0, e->world));
    char *all = NULL;
    long total = 0;
    if (e->world_rank == 0) {
        for (int r = 0; r < e->world_size; r++) {
            displs[r] = (int)total;
            total += counts[r];
        }
        all = malloc(total ? (size_t)total : 1);
    }
    int ok = e->world_rank != 0 || all != NULL;
    if (PT_MPI_CALL(MPI_Bcast(&ok, 1, MPI_INT, 0, e->world))) {
        free(all);
        return -1;
    }
    if (!ok) return pt_error_set("out of memory for the trace (%ld bytes)", total);
    if (PT_MPI_CALL(MPI_Gatherv(e->trace.events, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE,
                                0, e->world))) {
        free(all);
        return -1;
    }
    /* rank 0's verdict, and its message, on every rank */
    char msg[512] = "";
    if (e->world_rank == 0) {
        if (trace_write_json(path, (trace_event *)all, (int)(total / sizeof(trace_event)),
                             ranks, e->world_size))
            snprintf(msg, sizeof msg, "%s", pt_error_get());
        free(all);
    }
    PT_MPI_CHECK(MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, 0, e->world));
    return msg[0] ? pt_error_set("%s", msg) : 0;
}
