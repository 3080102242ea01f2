/* Checks of the reduction module's MPI calls (src/reduce.c, src/reduce_plan.c). Private.
 * They mirror PT_MPI_CALL / PT_MPI_CHECK of src/base/mpi_check.h (not merged yet): once it
 * is, replace REDUCE_MPI_ by PT_MPI_ and delete this file. A failure records
 * "rank R (host): MPI_Iallreduce failed at src/reduce.c:LINE: MPI's error string" (the
 * communicators must have MPI_ERRORS_RETURN for MPI to return at all; the front end sets
 * it on MPI_COMM_WORLD and duplicates inherit it). */
#ifndef PT_REDUCE_CHECK_H
#define PT_REDUCE_CHECK_H

/* Expression: 0 when the call returned MPI_SUCCESS, −1 with the message recorded. */
#define REDUCE_MPI_CALL(call) reduce_mpi_check((call), #call, __FILE__, __LINE__)
/* Statement: on failure, records the message and returns −1 from the enclosing function. */
#define REDUCE_MPI_CHECK(call)                                                             \
    do {                                                                                   \
        if (REDUCE_MPI_CALL(call)) return -1;                                              \
    } while (0)

int reduce_mpi_check(int code, const char *call, const char *file, int line);

#endif
