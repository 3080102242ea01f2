/* How a rank passes the time while it waits for MPI (a message, a reduction, a collective):
 * MPI_Test in a loop, with either a yield of the core between tests or a short sleep.
 * Sleeping is what lets ranks that outnumber the cores make progress (a spinning rank would
 * keep its peer off the core; blocking MPICH calls spin, ../shared/DESIGN.md), but each
 * sleep lasts 50 µs or more, and MPICH moves a non-blocking collective on only inside
 * MPI_Test: a pipelined reduction of a megabyte needs many tests, so sleeping between them
 * makes it several times slower. Every wait gives up after a timeout with a message. */
#ifndef PT_MPI_WAIT_H
#define PT_MPI_WAIT_H

#include <mpi.h>

typedef enum {
    WAIT_AUTO = 0, /* spin where the node's ranks × threads fit its cores, else sleep */
    WAIT_SPIN,     /* sched_yield between tests */
    WAIT_SLEEP,    /* 50 µs sleeps between tests (the default before it is set) */
} mpi_wait_mode;

/* Process-wide; AUTO must be resolved by the caller (it is taken as SLEEP). */
void mpi_wait_set_mode(mpi_wait_mode w);
mpi_wait_mode mpi_wait_get_mode(void);
const char *mpi_wait_mode_name(mpi_wait_mode w); /* "auto", "spin", "sleep" */
/* One pause between two tests, as set. */
void mpi_wait_pause(void);

/* Called between two tests of a wait (may be NULL): what the waiting rank must keep doing
 * meanwhile, such as posting its own pending sends, since a peer may need one of them
 * before it can answer. Non-zero ends the wait with that failure (its message set). */
typedef int (*mpi_wait_progress_fn)(void *ctx);

/* Waits for *req: a short spin first (a message on its way usually lands within a few
 * microseconds), then MPI_Test with mpi_wait_pause() and progress(ctx) between tests.
 * 0 when it completed; 0 with *timed_out = 1 once timeout_s have passed (the caller names
 * what it waited for); −1 with a message when MPI or progress failed. */
int mpi_wait_test(MPI_Request *req, double timeout_s, mpi_wait_progress_fn progress,
                  void *ctx, int *timed_out);
/* Waits for a non-blocking collective on comm; −1 with a message after timeout_s. */
int mpi_wait_collective(MPI_Request *req, MPI_Comm comm, double timeout_s);
/* A polite in-place all-reduce: MPI_Iallreduce waited for as above. */
int mpi_wait_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                       double timeout_s);
/* MPI_Comm_split(comm, color, key) without its spinning: the blocking split takes tens of
 * milliseconds of CPU per rank where ranks outnumber cores. The pairs are gathered politely
 * first; a split that is a duplicate of comm (one color, keys in rank order) is a polite
 * MPI_Comm_idup, one where every rank is alone a duplicate of MPI_COMM_SELF; any other is
 * MPI_Comm_split itself, once the ranks have met. Collective over comm. */
int mpi_wait_split(MPI_Comm comm, int color, int key, double timeout_s, MPI_Comm *out);
/* The ranks of comm on this host (MPI_Get_processor_name), ordered by key, as
 * mpi_wait_split: MPI_Comm_split_type(SHARED) without its spinning. */
int mpi_wait_split_node(MPI_Comm comm, int key, double timeout_s, MPI_Comm *out);

#endif
