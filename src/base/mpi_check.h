/* Checks for every MPI call.
 *
 * MPI's default error handler (MPI_ERRORS_ARE_FATAL) ends the whole job inside the failing
 * call, with MPI's text but without saying which rank, host or line of pipetrain made it.
 * pipetrain sets MPI_ERRORS_RETURN instead (pt_mpi_errors_return) and passes every MPI call
 * through one of these macros: a failure records
 *     "rank R (host): MPI_Isend failed at src/runtime/exec.c:290: Invalid count, error stack: ..."
 * with pt_error_set, and library code returns −1 as for any other error. The front end
 * prints the message and ends the job: after an MPI error the ranks may be stuck in
 * different calls, so it ends every rank with MPI_Abort (see pt_mpi_failed). */
#ifndef PT_MPI_CHECK_H
#define PT_MPI_CHECK_H

#include <mpi.h>

#include "src/base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Expression: 0 when the call returned MPI_SUCCESS, −1 with the message recorded when not.
 * The call is evaluated once. */
#define PT_MPI_CALL(call) pt_mpi_check((call), #call, __FILE__, __LINE__)

/* Statement: on failure, records the message and makes the enclosing function return −1. */
#define PT_MPI_CHECK(call)                                                                 \
    do {                                                                                   \
        if (PT_MPI_CALL(call)) return -1;                                                  \
    } while (0)

/* 0 when code is MPI_SUCCESS; otherwise records the message (call: the call's source text,
 * of which the function name is kept) and returns −1. */
int pt_mpi_check(int code, const char *call, const char *file, int line);

/* 1 once any MPI call of this process has failed: MPI may then be unusable and the ranks
 * out of step, so that only MPI_Abort ends the job without a hang. */
int pt_mpi_failed(void);

/* After MPI_Init: MPI calls on MPI_COMM_WORLD and MPI_COMM_SELF (where MPI reports errors
 * that belong to no communicator) return their error codes instead of aborting. Every
 * communicator made from them (split, dup) inherits the handler. 0, or −1 with a message. */
int pt_mpi_errors_return(void);

#ifdef __cplusplus
}
#endif

/* Ends the job: MPI_Abort, with a watchdog. MPI_Abort asks the process manager to kill
 * every rank; when that manager is gone or stuck (seen: a Slurm step whose other task had
 * died, after the daemons were stopped) MPI_Abort waits forever. A SIGALRM after
 * PT_ABORT_GRACE_S seconds ends this process anyway, so a rank never outlives its failure;
 * the others' own timeouts end them. Does not return. */
enum { PT_ABORT_GRACE_S = 10 };
_Noreturn void pt_mpi_abort(MPI_Comm comm, int code);

#endif
