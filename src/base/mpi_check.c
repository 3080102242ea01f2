#include "src/base/mpi_check.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Only one thread calls MPI (MPI_THREAD_FUNNELED). */
static int mpi_failed;

int pt_mpi_check(int code, const char *call, const char *file, int line)
{
    if (code == MPI_SUCCESS) return 0;
    mpi_failed = 1;
    /* MPI's text (MPICH's spans several lines: the error, then its stack) on one line */
    char raw[MPI_MAX_ERROR_STRING] = "", text[MPI_MAX_ERROR_STRING + 64];
    int len = 0;
    if (MPI_Error_string(code, raw, &len) != MPI_SUCCESS)
        snprintf(raw, sizeof raw, "MPI error code %d", code);
    size_t n = 0;
    for (const char *c = raw; *c && n + 3 < sizeof text; c++) {
        if (*c != '\n') text[n++] = *c;
        else if (c[1] && n && text[n - 1] == ':') text[n++] = ' ';
        else if (c[1]) text[n++] = ';', text[n++] = ' ';
    }
    text[n] = '\0';
    /* the rank in MPI_COMM_WORLD, as mpiexec numbers the processes */
    int init = 0, fini = 0, rank = -1;
    if (MPI_Initialized(&init) == MPI_SUCCESS && init && MPI_Finalized(&fini) == MPI_SUCCESS &&
        !fini && MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS)
        rank = -1;
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    size_t name = strcspn(call, "(");
    if (rank >= 0)
        return pt_error_set("rank %d (%s): %.*s failed at %s:%d: %s", rank, host, (int)name,
                            call, file, line, text);
    return pt_error_set("%s: %.*s failed at %s:%d: %s", host, (int)name, call, file, line,
                        text);
}

int pt_mpi_failed(void) { return mpi_failed; }

int pt_mpi_errors_return(void)
{
    if (PT_MPI_CALL(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN)) ||
        PT_MPI_CALL(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN)))
        return -1;
    return 0;
}

_Noreturn void pt_mpi_abort(MPI_Comm comm, int code)
{
    signal(SIGALRM, SIG_DFL);
    alarm(PT_ABORT_GRACE_S);
    MPI_Abort(comm, code);
    _exit(code); /* MPI_Abort returned: it could not end the job */
}
