/* src/base/io.h: what is not a regular file is refused, saying what it is, without
 * blocking on a FIFO; a regular file opens as a blocking stream. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/io.h"

static void on_alarm(int sig)
{
    (void)sig;
    _exit(3); /* a hang: the test fails rather than waits */
}

Test(io, refuses_what_is_not_a_regular_file)
{
    char dir[] = "/tmp/pt_test_io_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char fifo[64], file[64];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(file, sizeof file, "%s/file", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    FILE *w = fopen(file, "w");
    cr_assert_not_null(w);
    fputs("hello\n", w);
    fclose(w);
    signal(SIGALRM, on_alarm);
    alarm(10);
    struct {
        const char *path, *message;
    } cases[] = {
        {fifo, "is a FIFO (named pipe), not a regular file"},
        {dir, "is a directory, not a regular file"},
        {"/dev/null", "is a character device, not a regular file"},
        {"/nonexistent/x", "cannot open: No such file or directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(pt_open_regular(cases[i].path), -1, "%s opened", cases[i].path);
        cr_assert(strstr(pt_error_get(), cases[i].message), "%s", pt_error_get());
        cr_assert(!strncmp(pt_error_get(), cases[i].path, strlen(cases[i].path)), "%s",
                  pt_error_get());
        cr_assert_null(pt_fopen_regular(cases[i].path, "rb"));
    }
    FILE *f = pt_fopen_regular(file, "rb");
    cr_assert_not_null(f, "%s", pt_error_get());
    char line[16];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "hello\n");
    cr_assert(!(fcntl(fileno(f), F_GETFL) & O_NONBLOCK), "left non-blocking");
    fclose(f);
    alarm(0);
    unlink(fifo);
    unlink(file);
    rmdir(dir);
}
