/* The MPI checks (src/base/mpi_check.h): the message names the call, file:line and MPI's
 * text; with MPI_ERRORS_RETURN a bad call returns to its caller, also on a communicator
 * split from MPI_COMM_WORLD (singleton MPI: the test runs without mpiexec). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "src/base/error.h"
#include "src/base/mpi_check.h"

static int checked_call(int code)
{
    PT_MPI_CHECK(code);
    return 0;
}

Test(mpi_check, success_records_nothing)
{
    pt_error_clear();
    cr_assert_eq(PT_MPI_CALL(MPI_SUCCESS), 0);
    cr_assert_eq(checked_call(MPI_SUCCESS), 0);
    cr_assert_str_empty(pt_error_get());
    cr_assert_eq(pt_mpi_failed(), 0);
}

Test(mpi_check, failure_names_call_line_and_mpi_text)
{
    /* before MPI_Init: no rank, but MPI's text (MPI_Error_string works at any time) */
    cr_assert_eq(pt_mpi_check(MPI_ERR_TAG, "MPI_Irecv(buf, 1, MPI_FLOAT, 0, -1, comm, &r)",
                              "src/runtime/exec.c", 42), -1);
    const char *msg = pt_error_get();
    cr_assert(strstr(msg, "MPI_Irecv failed at src/runtime/exec.c:42: Invalid tag") != NULL, "%s", msg);
    cr_assert(strstr(msg, "MPI_FLOAT") == NULL, "arguments copied into '%s'", msg);
    cr_assert_eq(pt_mpi_failed(), 1);
}

Test(mpi_check, errors_return_on_split_communicators)
{
    cr_assert_eq(MPI_Init(NULL, NULL), MPI_SUCCESS);
    cr_assert_eq(pt_mpi_errors_return(), 0, "%s", pt_error_get());
    MPI_Comm local;
    cr_assert_eq(PT_MPI_CALL(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0,
                                                 MPI_INFO_NULL, &local)), 0, "%s",
                 pt_error_get());
    float x = 0;
    MPI_Request req;
    int line = __LINE__ + 1;
    int rc = PT_MPI_CALL(MPI_Isend(&x, -1, MPI_FLOAT, 0, 0, local, &req));
    cr_assert_eq(rc, -1, "a send of -1 floats returned success");
    char where[64];
    snprintf(where, sizeof where, "tests/test_mpi_check.c:%d: Invalid count", line);
    const char *msg = pt_error_get();
    cr_assert(strncmp(msg, "rank 0 (", 8) == 0, "no rank in '%s'", msg);
    cr_assert(strstr(msg, "MPI_Isend failed at ") && strstr(msg, where), "'%s' lacks '%s'",
              msg, where);
    cr_assert_eq(PT_MPI_CALL(MPI_Comm_free(&local)), 0, "%s", pt_error_get());
    MPI_Finalize();
}
