#include "src/base/stop_signal.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const int stops[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
enum { N_STOPS = sizeof stops / sizeof *stops };
/* Formatted in advance: a handler may only call async-signal-safe functions. */
static char lines[N_STOPS][192];

static void on_stop(int sig)
{
    for (int i = 0; i < N_STOPS; i++)
        if (stops[i] == sig) {
            ssize_t w = write(STDERR_FILENO, lines[i], strlen(lines[i]));
            (void)w;
        }
    signal(sig, SIG_DFL);
    raise(sig); /* the exit status still says which signal ended the process */
}

void pt_stop_signal_note(int rank, const char *host)
{
    char who[96] = "";
    if (rank >= 0) snprintf(who, sizeof who, "rank %d (%s): ", rank, host ? host : "?");
    for (int i = 0; i < N_STOPS; i++) {
        snprintf(lines[i], sizeof lines[i], "pipetrain: %sstopped by signal %d (%s)\n", who,
                 stops[i], strsignal(stops[i]));
        struct sigaction sa = {.sa_handler = on_stop};
        sigemptyset(&sa.sa_mask);
        /* a signal ignored at start (nohup, a shell's background job) stays ignored */
        struct sigaction old;
        if (sigaction(stops[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
        sigaction(stops[i], &sa, NULL);
    }
}
