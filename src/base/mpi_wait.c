#include "src/base/mpi_wait.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"

static mpi_wait_mode waiting = WAIT_SLEEP;

void mpi_wait_set_mode(mpi_wait_mode w) { waiting = w == WAIT_SPIN ? w : WAIT_SLEEP; }

mpi_wait_mode mpi_wait_get_mode(void) { return waiting; }

const char *mpi_wait_mode_name(mpi_wait_mode w)
{
    static const char *const names[] = {"auto", "spin", "sleep"};
    return (unsigned)w < sizeof names / sizeof *names ? names[w] : "?";
}

void mpi_wait_pause(void)
{
    if (waiting == WAIT_SPIN) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50000}; /* 50 µs: blocking MPI would spin a shared core */
    nanosleep(&ts, NULL);
}

int mpi_wait_test(MPI_Request *req, double timeout_s, mpi_wait_progress_fn progress,
                  void *ctx, int *timed_out)
{
    enum { SPIN_TESTS = 64 };
    const double t0 = pt_now();
    int done = 0;
    *timed_out = 0;
    for (int i = 0; i < SPIN_TESTS && !done; i++)
        PT_MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
    while (!done) {
        if (pt_now() - t0 > timeout_s) {
            *timed_out = 1;
            return 0;
        }
        if (progress && progress(ctx)) return -1;
        mpi_wait_pause();
        PT_MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
    }
    return 0;
}

int mpi_wait_collective(MPI_Request *req, MPI_Comm comm, double timeout_s)
{
    int timed_out = 0;
    if (mpi_wait_test(req, timeout_s, NULL, NULL, &timed_out)) return -1;
    if (timed_out) {
        int rank;
        PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
        return pt_error_set("rank %d: no progress for %g s in a collective (--timeout); "
                            "another rank has died or stalled", rank, timeout_s);
    }
    return 0;
}

int mpi_wait_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                       double timeout_s)
{
    MPI_Request req;
    PT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, &req));
    return mpi_wait_collective(&req, comm, timeout_s);
}

/* How the ranks of comm split by (color, key), from every rank's pair: 1 when they form one
 * communicator in comm's own order (a duplicate), 2 when each is alone or without a color,
 * 0 otherwise. The same answer on every rank, which all hold the same pairs. */
static int split_shape(const int *pairs, int size)
{
    int one = 1, alone = 1;
    for (int r = 0; r < size; r++) {
        int color = pairs[2 * r], key = pairs[2 * r + 1];
        if (color != pairs[0] || color == MPI_UNDEFINED ||
            (r > 0 && key < pairs[2 * r - 1]))
            one = 0;
        for (int q = 0; q < r && alone; q++)
            if (color != MPI_UNDEFINED && pairs[2 * q] == color) alone = 0;
    }
    return one ? 1 : alone ? 2 : 0;
}

int mpi_wait_split(MPI_Comm comm, int color, int key, double timeout_s, MPI_Comm *out)
{
    *out = MPI_COMM_NULL;
    int size;
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    int mine[2] = {color, key}, *pairs = malloc((size_t)size * 2 * sizeof *pairs);
    if (!pairs) return pt_error_set("out of memory");
    MPI_Request req;
    int rc = PT_MPI_CALL(MPI_Iallgather(mine, 2, MPI_INT, pairs, 2, MPI_INT, comm, &req));
    if (!rc) rc = mpi_wait_collective(&req, comm, timeout_s);
    int shape = rc ? -1 : split_shape(pairs, size);
    free(pairs);
    if (shape == 1) { /* a duplicate: its context agreed on without blocking */
        rc = PT_MPI_CALL(MPI_Comm_idup(comm, out, &req));
        if (!rc) rc = mpi_wait_collective(&req, comm, timeout_s);
    } else if (shape == 2 && color != MPI_UNDEFINED) { /* nothing to agree on with others */
        MPI_Errhandler eh; /* a split inherits comm's error handler; a dup, SELF's */
        rc = PT_MPI_CALL(MPI_Comm_dup(MPI_COMM_SELF, out)) ||
             PT_MPI_CALL(MPI_Comm_get_errhandler(comm, &eh));
        if (!rc) {
            rc = PT_MPI_CALL(MPI_Comm_set_errhandler(*out, eh));
            MPI_Errhandler_free(&eh);
        }
    } else if (shape == 0) { /* the ranks met just now: the blocking split spins little */
        rc = PT_MPI_CALL(MPI_Comm_split(comm, color, key, out));
    }
    return rc ? -1 : 0;
}

int mpi_wait_split_node(MPI_Comm comm, int key, double timeout_s, MPI_Comm *out)
{
    *out = MPI_COMM_NULL;
    int size, rank, len = 0;
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    char me[MPI_MAX_PROCESSOR_NAME] = "";
    PT_MPI_CHECK(MPI_Get_processor_name(me, &len));
    char *names = malloc((size_t)size * MPI_MAX_PROCESSOR_NAME);
    if (!names) return pt_error_set("out of memory");
    MPI_Request req;
    int rc = PT_MPI_CALL(MPI_Iallgather(me, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names,
                                        MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm, &req));
    if (!rc) rc = mpi_wait_collective(&req, comm, timeout_s);
    int color = rank; /* the lowest rank on the same host */
    for (int r = 0; !rc && r < rank; r++)
        if (!strncmp(names + (size_t)r * MPI_MAX_PROCESSOR_NAME, me, MPI_MAX_PROCESSOR_NAME)) {
            color = r;
            break;
        }
    free(names);
    return rc ? -1 : mpi_wait_split(comm, color, key, timeout_s, out);
}
