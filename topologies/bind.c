/* Binding the ranks of a training job: the only MPI code of the module. The ranks of one
 * node find each other (mpi_wait_split_node: by host name, politely), each takes its cores
 * (topo_local_cores) and binds the whole process to them with hwloc. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/mpi_check.h"
#include "src/base/mpi_wait.h"
#include "topologies/topo.h"

/* Every rank must learn whether any rank failed, or the ones that succeeded would go on
 * into a job that the others have left. 1: all ok, 0: not, −1: the collective failed. */
static int agree(MPI_Comm comm, int ok, double timeout_s)
{
    /* polite: the ranks arrive as their topologies load, seconds apart on a loaded node */
    return mpi_wait_allreduce(&ok, 1, MPI_INT, MPI_LAND, comm, timeout_s) ? -1 : ok;
}

/* Prints one line per rank, in rank order, from rank 0 (lines from several processes on
 * one terminal interleave otherwise). */
static int print_lines(MPI_Comm comm, const char *line, double timeout_s)
{
    enum { LEN = 1024 };
    int rank, size;
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    PT_MPI_CHECK(MPI_Comm_size(comm, &size));
    char mine[LEN];
    snprintf(mine, sizeof mine, "%s", line);
    char *all = rank == 0 ? malloc((size_t)size * LEN) : NULL;
    int have = agree(comm, rank != 0 || all, timeout_s);
    if (have <= 0) {
        free(all);
        return have ? -1 : pt_error_set("rank %d: out of memory for the binding report", rank);
    }
    if (PT_MPI_CALL(MPI_Gather(mine, LEN, MPI_CHAR, all, LEN, MPI_CHAR, 0, comm))) {
        free(all);
        return -1;
    }
    if (rank == 0) {
        for (int r = 0; r < size; r++)
            printf("%s\n", all + (size_t)r * LEN);
        fflush(stdout);
    }
    free(all);
    return 0;
}

int topo_bind_rank(MPI_Comm comm, const char *mode, int verbose, double timeout_s,
                   int *blas_threads_out, int *local_size_out)
{
    *blas_threads_out = 0;
    int rank, local_rank, local_size;
    PT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    MPI_Comm local;
    if (mpi_wait_split_node(comm, rank, timeout_s, &local)) return -1;
    PT_MPI_CHECK(MPI_Comm_rank(local, &local_rank));
    PT_MPI_CHECK(MPI_Comm_size(local, &local_size));
    PT_MPI_CHECK(MPI_Comm_free(&local));
    *local_size_out = local_size;

    topo_t *t = NULL;
    int *cores = NULL, n = 0, shared = 0, ok = 1;
    char err[512] = "";
    if (topo_init(&t, NULL) < 0 ||
        topo_local_cores(topo_get_machine(t), mode, local_rank, local_size, &cores, &n, &shared) < 0 ||
        (n > 0 && topo_bind_cores(t, cores, n) < 0)) {
        snprintf(err, sizeof err, "rank %d on %s: %s", rank, host, pt_error_get());
        ok = 0;
    }
    /* every rank takes part in the collectives below, failed or not */
    int all_ok = agree(comm, ok, timeout_s);
    if (all_ok < 0) {
        free(cores);
        topo_free(t);
        return -1;
    }
    if (all_ok && verbose) {
        char line[1024], list[128], aff[256];
        topo_format_list(list, sizeof list, cores, n);
        if (topo_affinity_read(aff, sizeof aff) < 0)
            snprintf(aff, sizeof aff, "unknown (%s)", pt_error_get());
        if (n == 0)
            snprintf(line, sizeof line, "rank %d on %s (local %d of %d): not bound (--bind %s); "
                     "affinity %s", rank, host, local_rank, local_size, mode, aff);
        else
            snprintf(line, sizeof line, "rank %d on %s (local %d of %d): bound to core%s %s "
                     "(%d worker thread%s); affinity read back: cpus %s%s", rank, host, local_rank,
                     local_size, n > 1 ? "s" : "", list, n, n > 1 ? "s" : "", aff,
                     shared ? "; oversubscribed: cores shared with other ranks" : "");
        if (print_lines(comm, line, timeout_s) < 0) {
            snprintf(err, sizeof err, "%s", pt_error_get());
            ok = all_ok = 0;
        }
    }
    free(cores);
    topo_free(t);
    if (!ok)
        return pt_error_set("%s", err);
    if (!all_ok)
        return pt_error_set("rank %d on %s: binding failed on another rank", rank, host);
    *blas_threads_out = n;
    return 0;
}
