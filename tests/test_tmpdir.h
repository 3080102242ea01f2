/* A Criterion suite's own temporary directory: PT_TEST_TMPDIR_SUITE(name) makes
 * /tmp/pt_test_NAME_XXXXXX before the suite's tests and removes it after them; tmp_path
 * names a file in it (eight names live at once). */
#ifndef PT_TEST_TMPDIR_H
#define PT_TEST_TMPDIR_H

#include <stdio.h>
#include <stdlib.h>

#include <criterion/criterion.h>

static char tmpdir[64];

static void remove_tmpdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

static const char *tmp_path(const char *name)
{
    static char paths[8][160];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", tmpdir, name);
    return p;
}

#define PT_TEST_TMPDIR_SUITE(name)                                                          \
    static void make_tmpdir(void)                                                           \
    {                                                                                       \
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pt_test_" #name "_XXXXXX");                  \
        cr_assert_not_null(mkdtemp(tmpdir));                                                \
    }                                                                                       \
    TestSuite(name, .init = make_tmpdir, .fini = remove_tmpdir)

#endif
