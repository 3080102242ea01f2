/* `pipetrain devices`: what this machine offers for training: the CPU (from the topology),
 * every CUDA device (through the CUDA plugin, src/cuda_plugin.h) and whether the MPI library
 * can move device memory. */
#ifndef PT_DEVICES_H
#define PT_DEVICES_H

/* `pipetrain devices [--json]`; argv[0] is the command's name. Prints to stdout; returns
 * the exit status: 0 when the listing worked, even without a usable GPU (the listing then
 * says why), 1 on an error, 2 on a usage error. Initialises MPI itself (for
 * cuda_mpi_aware) unless it already is. */
int devices_cmd(int argc, char **argv);

/* FP32 lanes (CUDA cores) per streaming multiprocessor for compute capability
 * major.minor, for peak estimates; *estimate is set to 1 for capabilities not in the
 * table (128 is then a guess). Shared by the plugin, which computes the peak, and the
 * listing, which marks guessed peaks. */
static inline int devices_fp32_lanes_per_sm(int major, int minor, int *estimate)
{
    *estimate = 0;
    if (major == 7 || (major == 8 && minor == 0))
        return 64; /* Volta, Turing, A100 */
    if ((major == 8 && (minor == 6 || minor == 9)) || (major == 9 && minor == 0) ||
        major == 10 || major == 12)
        return 128; /* consumer Ampere, Ada, Hopper, Blackwell */
    *estimate = 1;
    return 128;
}

#endif
