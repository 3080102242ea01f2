/* Aligning the ranks' clocks for the trace: ping-pong offsets to rank 0 (docs/TRACE.md). */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "src/base/clock.h"
#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/runtime/trace.h"

enum {
    CLOCK_ROUNDS = 16,       /* rounds at least */
    CLOCK_MAX_ROUNDS = 1000, /* rounds at most, once CLOCK_BUDGET_S is not yet spent */
    SPIN_TESTS = 64,         /* MPI_Tests before a wait starts to yield its core */
};
static const double CLOCK_BUDGET_S = 0.01, CLOCK_MORE_S = 0.2, CLOCK_GOOD_S = 100e-6;
static const double NO_SLEEP_S = 1e-3; /* a wait yields for this long, then sleeps */

/* Waits for one message of the ping-pong: for a millisecond without sleeping (a round
 * trip as long as a polite pause measures nothing), spinning at first, then yielding the
 * core between tests in case the peer is bound to the same one; then with 50 µs sleeps
 * (ranks may outnumber cores), until timeout_s. */
static int wait_message(MPI_Request *req, MPI_Comm comm, int peer, double timeout_s)
{
    int done = 0;
    double t0 = pt_now();
    for (int i = 0; !done; i++) {
        PT_MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) break;
        double spent = pt_now() - t0;
        if (spent > timeout_s) {
            int rank;
            char host[64] = "";
            MPI_Comm_rank(comm, &rank);
            gethostname(host, sizeof host - 1);
            return pt_error_set("rank %d (%s): no answer from rank %d for %g s while "
                                "aligning the trace clocks (--timeout)", rank, host, peer,
                                timeout_s);
        }
        if (spent > NO_SLEEP_S)
            nanosleep(&(struct timespec){0, 50000}, NULL);
        else if (i >= SPIN_TESTS)
            sched_yield();
    }
    return 0;
}

/* Rank 0 measures the ranks in turn. In a round it reads its clock (t0), pings, the peer
 * reads its clock (p) and answers, rank 0 reads its clock again (t1): the peer's offset is
 * p − (t0 + t1)/2, wrong by at most (t1 − t0)/2, since p was read between t0 and t1. The
 * round with the shortest round trip counts. A round is short only when both processes
 * run at once, so on a busy machine it takes many: at least CLOCK_ROUNDS, then more for
 * CLOCK_BUDGET_S, and for up to CLOCK_MORE_S while none was shorter than CLOCK_GOOD_S.
 * Rank 0's messages are {1, ·, ·, ·} for a ping, then {0, p, offset, error}. */
static int measure_peer(MPI_Comm comm, int tag, int peer, double (*now)(void *), void *ctx,
                        double timeout_s)
{
    double ping[4] = {1, 0, 0, 0}, result[4] = {0, 0, 0, 0}, best = INFINITY;
    MPI_Request req[2];
    double start = pt_now();
    for (int k = 0;; k++) {
        double spent = pt_now() - start;
        if (k >= CLOCK_ROUNDS && (k >= CLOCK_MAX_ROUNDS || spent > CLOCK_BUDGET_S) &&
            (best < CLOCK_GOOD_S || spent > CLOCK_MORE_S))
            break;
        double remote;
        PT_MPI_CHECK(MPI_Irecv(&remote, 1, MPI_DOUBLE, peer, tag, comm, &req[0]));
        double t0 = now(ctx);
        PT_MPI_CHECK(MPI_Isend(ping, 4, MPI_DOUBLE, peer, tag, comm, &req[1]));
        if (wait_message(&req[0], comm, peer, timeout_s)) return -1;
        double t1 = now(ctx);
        if (wait_message(&req[1], comm, peer, timeout_s)) return -1;
        if (t1 - t0 < best) {
            best = t1 - t0;
            result[1] = remote;
            result[2] = remote - (t0 + t1) / 2;
            result[3] = best / 2;
        }
    }
    PT_MPI_CHECK(MPI_Isend(result, 4, MPI_DOUBLE, peer, tag, comm, &req[0]));
    return wait_message(&req[0], comm, peer, timeout_s);
}

int trace_clock_measure(trace_clock *c, MPI_Comm comm, int tag, double (*now)(void *ctx),
                        void *ctx, double timeout_s)
{
    int rank, size;
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    if (rank == 0) {
        for (int r = 1; r < size; r++)
            if (measure_peer(comm, tag, r, now, ctx, timeout_s)) return -1;
        trace_clock_add(c, now(ctx), 0, 0);
        return 0;
    }
    for (;;) {
        double msg[4];
        MPI_Request req;
        PT_MPI_CHECK(MPI_Irecv(msg, 4, MPI_DOUBLE, 0, tag, comm, &req));
        if (wait_message(&req, comm, 0, timeout_s)) return -1;
        double p = now(ctx);
        if (msg[0] == 0) {
            trace_clock_add(c, msg[1], msg[2], msg[3]);
            return 0;
        }
        PT_MPI_CHECK(MPI_Isend(&p, 1, MPI_DOUBLE, 0, tag, comm, &req));
        if (wait_message(&req, comm, 0, timeout_s)) return -1;
    }
}

int trace_skew_from_env(int rank, trace_skew *s)
{
    *s = (trace_skew){.skew_s = 0};
    const char *v = getenv("PIPETRAIN_DEBUG_CLOCK_SKEW");
    if (!v || !*v) return 0;
    char *end;
    long who = strtol(v, &end, 10);
    double skew = 0, rate = 0;
    int ok = end != v && *end == ':';
    if (ok) {
        const char *p = end + 1;
        skew = strtod(p, &end);
        ok = end != p && isfinite(skew);
    }
    if (ok && *end == ':') {
        const char *p = end + 1;
        rate = strtod(p, &end);
        ok = end != p && fabs(rate) < 0.5;
    }
    if (!ok || *end)
        return pt_error_set("PIPETRAIN_DEBUG_CLOCK_SKEW=%s: expected RANK:SECONDS[:RATE] "
                            "(|RATE| < 0.5)", v);
    if (who == rank) *s = (trace_skew){.skew_s = skew, .rate = rate, .base = pt_now()};
    return 0;
}

double trace_skew_apply(const trace_skew *s, double t)
{
    return t + s->skew_s + s->rate * (t - s->base);
}
