/* Files the user names and pipetrain's own output streams. */
#ifndef PT_IO_H
#define PT_IO_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opens a file the user named (model, data, checkpoint, topology) for reading, refusing
 * what is not a regular file with a message that says what it is: "PATH: is a directory",
 * "is a FIFO (named pipe)", "is a character device", ... A FIFO never blocks the open: the
 * type is checked with stat first and again with fstat on a non-blocking descriptor.
 * Returns a (blocking) descriptor, or −1 with "PATH: cannot open: REASON" or the above. */
int pt_open_regular(const char *path);
/* The same as a stdio stream; mode is a read mode ("r" or "rb"). NULL on error. */
FILE *pt_fopen_regular(const char *path, const char *mode);

/* Makes stdout and stderr write whole lines (up to 64 KiB) with one write each. Call it
 * before any output and again after MPI_Init, which makes stdout unbuffered: under
 * mpiexec a line printed in pieces reaches the terminal in pieces, and `mpiexec
 * -prepend-rank` prefixes every piece. */
void pt_stdio_whole_lines(void);

#ifdef __cplusplus
}
#endif

#endif
