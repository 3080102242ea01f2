#include "src/base/mpi_wait.h"

#include <sched.h>
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
