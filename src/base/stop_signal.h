/* A rank stopped from outside (Ctrl-C, `kill`, `scancel`, `pipetrain launch` passing a
 * signal on) says so itself: mpiexec (hydra 4.0) then reports the job as ended by
 * "Segmentation fault (signal 11)" or with exit status 2 whatever the signal was, so its
 * line alone misleads. */
#ifndef PT_STOP_SIGNAL_H
#define PT_STOP_SIGNAL_H

/* On SIGINT, SIGTERM, SIGHUP or SIGQUIT this process writes "pipetrain: rank RANK (HOST):
 * stopped by signal N (NAME)" to standard error, then ends by that signal as it would
 * have without the handler. RANK < 0 leaves the rank out. */
void pt_stop_signal_note(int rank, const char *host);

#endif
