/* Files pipetrain writes where the user said (--save, checkpoints, --trace, --metrics,
 * launch --log). Whatever the directory holds, nothing outside the named path is written:
 * the directory is opened once and used by descriptor, temporaries are created exclusively,
 * without following links, under names that cannot be guessed, and only a regular file (or
 * nothing) at the named path is ever replaced. A FIFO, a device, a socket or a directory
 * there is refused, and so is a path that cannot name a file (empty, ending in '/'). */
#ifndef PT_OUTPUT_H
#define PT_OUTPUT_H

#include <stddef.h>
#include <sys/types.h>

/* Checks, before any work is done, that `path` can be written as an output file: it names
 * a file (not "", not ending in '/'), what is there now is a regular file, a symbolic link
 * (which a write replaces, never follows) or nothing, and its directory exists and takes
 * a new file (its temporary is created and removed). −1 with "WHAT PATH: reason" (what:
 * "--save", "--trace", ...). */
int pt_output_check(const char *what, const char *path);

/* A file written whole and then put in place atomically (write, fsync, rename, fsync of
 * the directory): a crash leaves the old file or the new one, at worst a temporary
 * "NAME.tmp-PID-RANDOM" beside it. */
typedef struct {
    int dirfd;        /* the directory of the path, opened once */
    int fd;           /* the temporary, open for writing (−1 once committed or aborted) */
    char name[256];   /* the final name inside the directory */
    char tmp[320];    /* the temporary's name inside the directory */
    char path[4096];  /* the whole path, for messages */
    mode_t mode;      /* the mode the file gets: an existing file's, else 0666 & ~umask */
} pt_output;

/* Opens the temporary; −1 with a message (nothing is left behind). */
int pt_output_begin(pt_output *o, const char *path);
/* fsync, rename over the path, fsync of the directory; closes everything. −1 with a
 * message (the temporary is removed). */
int pt_output_commit(pt_output *o);
/* Removes the temporary and closes everything (after a failed write). */
void pt_output_abort(pt_output *o);

/* Creates a file exclusively in `dir` under an unguessable name, without following links,
 * then removes it: whether the directory takes new files. −1 with "WHAT DIR: reason". */
int pt_output_probe_dir(const char *what, const char *dir);

#endif
