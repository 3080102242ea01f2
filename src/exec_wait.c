#include "src/exec_wait.h"

#include <sched.h>
#include <time.h>

static exec_waiting waiting = EXEC_WAIT_SLEEP;

void exec_set_waiting(exec_waiting w) { waiting = w == EXEC_WAIT_SPIN ? w : EXEC_WAIT_SLEEP; }

exec_waiting exec_get_waiting(void) { return waiting; }

const char *exec_waiting_name(exec_waiting w)
{
    static const char *const names[] = {"auto", "spin", "sleep"};
    return (unsigned)w < sizeof names / sizeof *names ? names[w] : "?";
}

void exec_wait_pause(void)
{
    if (waiting == EXEC_WAIT_SPIN) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50000}; /* 50 µs: blocking MPI would spin a shared core */
    nanosleep(&ts, NULL);
}
