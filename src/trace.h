/* Timed events of one rank, written as Chrome trace JSON (Perfetto, chrome://tracing). */
#ifndef PT_TRACE_H
#define PT_TRACE_H

#include <stdio.h>

typedef enum {
    TRACE_FORWARD = 0,
    TRACE_BACKWARD,
    TRACE_SEND_ACT,
    TRACE_SEND_GRAD,
    TRACE_WAIT_ACT,
    TRACE_WAIT_GRAD,
    TRACE_OPTIMIZER,
    TRACE_SYNC,
    TRACE_EVAL,
    TRACE_REDUCE, /* a bucket's gradient reduction among the stage's replicas */
    TRACE_KIND_COUNT
} trace_kind;

typedef struct {
    double t0, t1; /* seconds since the job's common start */
    int kind, microbatch, rank;
    long step;
} trace_event;

typedef struct {
    int n, cap;
    trace_event *events; /* owned */
} trace_log;

/* Appends an event; on allocation failure the event is dropped and −1 returned. */
int trace_add(trace_log *t, trace_kind kind, double t0, double t1, int microbatch, int rank,
              long step);
void trace_free(trace_log *t);
/* Writes every event as a complete ("X") slice, one track per rank (pid 0, tid rank),
 * micro-batch and step in its args, times in microseconds. */
int trace_write_json(const char *path, const trace_event *events, int n, int ranks);
const char *trace_kind_name(trace_kind k);

#endif
