/* `pipetrain devices`: what this machine offers for training: the CPU (from the topology),
 * every CUDA device (through the CUDA plugin, src/runtime/cuda_plugin.h) and whether the MPI library
 * can move device memory. */
#ifndef PT_DEVICES_H
#define PT_DEVICES_H

/* `pipetrain devices [--json]`; argv[0] is the command's name. Prints to stdout; returns
 * the exit status: 0 when the listing worked, even without a usable GPU (the listing then
 * says why), 1 on an error, 2 on a usage error. Initialises MPI itself (for
 * cuda_mpi_aware) unless it already is. */
int devices_cmd(int argc, char **argv);

#endif
