/* The `pipetrain train` sub-command. */
#ifndef PT_TRAIN_H
#define PT_TRAIN_H

/* Runs after MPI_Init on every rank; returns the process exit status. */
int train_main(int argc, char **argv);

#endif
