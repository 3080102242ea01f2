/* How a rank passes the time while it waits for MPI (a message, a reduction, a collective):
 * MPI_Test in a loop, with either a yield of the core between tests or a short sleep.
 * Sleeping is what lets ranks that outnumber the cores make progress (a spinning rank would
 * keep its peer off the core), but each sleep lasts 50 µs or more, and MPICH moves a
 * non-blocking collective on only inside MPI_Test: a pipelined reduction of a megabyte
 * needs many tests, so sleeping between them makes it several times slower. */
#ifndef PT_EXEC_WAIT_H
#define PT_EXEC_WAIT_H

typedef enum {
    EXEC_WAIT_AUTO = 0, /* spin where the node's ranks × threads fit its cores, else sleep */
    EXEC_WAIT_SPIN,     /* sched_yield between tests */
    EXEC_WAIT_SLEEP,    /* 50 µs sleeps between tests (the default before it is set) */
} exec_waiting;

/* Process-wide; AUTO must be resolved by the caller (it is taken as SLEEP). */
void exec_set_waiting(exec_waiting w);
exec_waiting exec_get_waiting(void);
const char *exec_waiting_name(exec_waiting w); /* "auto", "spin", "sleep" */
/* One pause between two tests, as set. */
void exec_wait_pause(void);

#endif
