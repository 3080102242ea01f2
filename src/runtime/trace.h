/* Timed events of one rank, written as Chrome trace JSON (Perfetto, chrome://tracing).
 * docs/TRACE.md describes what a trace holds and how the ranks' clocks are aligned. */
#ifndef PT_TRACE_H
#define PT_TRACE_H

#include <mpi.h>

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
    TRACE_BACKWARD_INPUT,  /* zero bubble's B: the gradient of the input only */
    TRACE_BACKWARD_WEIGHT, /* zero bubble's W: the parameters' gradients */
    TRACE_RECOMPUTE,       /* a forward re-run to rebuild dropped activations */
    TRACE_TENSOR,          /* a collective of the stage's tensor group (all-reduce or
                              all-gather), inside a forward or backward */
    TRACE_KIND_COUNT
} trace_kind;

typedef struct {
    double t0, t1;  /* seconds since its rank's origin, on that rank's clock */
    int kind, microbatch, rank; /* microbatch −1: none */
    int chunk;      /* interleaved schedules: the rank's model chunk (0: the only one); −1 */
    long step;      /* the training step (the last one, for evaluation) */
    long long flow; /* sends and receives: the message's id, the same at both ends; −1 */
    long long bytes; /* TRACE_REDUCE: the bucket's bytes (microbatch holds the bucket);
                        TRACE_TENSOR: the bytes this rank receives */
} trace_event;

typedef struct {
    int n, cap;
    trace_event *events; /* owned */
} trace_log;

/* A rank's clock against rank 0's: offsets (this clock minus rank 0's) measured at up to
 * two moments, at the start and at the end; between them the offset moves linearly, as
 * two hosts' clocks drift apart. */
typedef struct {
    int n;            /* measurements held: 0, 1 or 2 */
    double at[2];     /* when, on this rank's clock */
    double offset[2]; /* this clock minus rank 0's */
    double error[2];  /* bound on the offset's error: half the best round trip */
} trace_clock;

/* Adds a measurement; a third replaces the second. */
void trace_clock_add(trace_clock *c, double at, double offset, double error);
/* Time t of this rank's clock on rank 0's clock. */
double trace_clock_to_rank0(const trace_clock *c, double t);
/* Collective over comm: measures this rank's clock now(ctx) against rank 0's by ping-pong
 * (docs/TRACE.md) and adds the measurement to *c. `tag` must be free of other messages.
 * Fails with a message when a peer has not answered for timeout_s (src/runtime/trace_clock.c). */
int trace_clock_measure(trace_clock *c, MPI_Comm comm, int tag, double (*now)(void *ctx),
                        void *ctx, double timeout_s);

/* Testing only: a rank's clock moved as another host's might be. */
typedef struct {
    double skew_s, rate, base; /* SECONDS ahead, gaining RATE s/s since pt_now() = base */
} trace_skew;
/* PIPETRAIN_DEBUG_CLOCK_SKEW=RANK:SECONDS[:RATE] sets *s on rank RANK (zero elsewhere);
 * −1 with a message when the variable is malformed. */
int trace_skew_from_env(int rank, trace_skew *s);
double trace_skew_apply(const trace_skew *s, double t);

/* One rank as the trace names it and places its events. */
typedef struct {
    int rank, stage;
    int replica, replicas; /* its replica of how many (named where replicas > 1) */
    int tensor, tensors;   /* its tensor shard of how many (named where tensors > 1) */
    char host[64];
    /* the schedule it runs (the same on every rank; the trace names rank 0's): its name,
     * what a search chose ("" when none), micro-batches and model chunks per rank */
    char schedule[32], schedule_origin[64];
    int microbatches, chunks;
    double origin;     /* what its event times count from, on its own clock */
    trace_clock clock; /* its clock against rank 0's */
} trace_rank;

/* Appends an event; on allocation failure the event is dropped and −1 returned. */
int trace_add(trace_log *t, const trace_event *ev);
void trace_free(trace_log *t);
/* The id of the message `backward` (0: activation, 1: gradient) of `microbatch` in `step`
 * sent by rank `sender`: unique in a run, and computed alike by both ends. */
long long trace_flow_id(long step, int backward, int microbatch, int microbatches, int sender,
                        int ranks);
/* Writes every event as a complete ("X") slice on its rank's process (pid = rank): compute
 * on one thread, messages and synchronisation on another, a flow from each send to its
 * receive (from the start of the send's slice to the end of the wait's: the message left no
 * earlier and had arrived by then, so no arrow points back in time). Times are microseconds since rank 0's origin on rank 0's clock; ranks[r] is rank
 * r, and ranks[0] the reference. The file appears whole or not at all: it is written
 * beside `path` and renamed (a device or FIFO is written in place). */
int trace_write_json(const char *path, const trace_event *events, int n,
                     const trace_rank *ranks, int n_ranks);
const char *trace_kind_name(trace_kind k);

#endif
