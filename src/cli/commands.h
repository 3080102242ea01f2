/* pipetrain's commands, one entry each (src/cli/cmd_NAME.c), dispatched by src/cli/main.c.
 * Each takes the command line after "pipetrain" (argv[0] is the command's name), prints its
 * results to stdout and its errors as "pipetrain: message" to stderr, and returns the exit
 * status: PT_EXIT_OK (0), PT_EXIT_FAIL (1: a failure while working, or a comparison that
 * found a difference) or PT_EXIT_USAGE (2: a wrong command line or input at fault, in every
 * command alike). */
#ifndef PT_CLI_COMMANDS_H
#define PT_CLI_COMMANDS_H

/* `train` (src/train/train.h): runs after main's MPI_Init, on every rank. */
int cmd_train(int argc, char **argv);
/* `launch`: runs a training job and, when it fails, runs it again from its last complete
 * checkpoint. 0 when the job ended well, the job's PT_EXIT_USAGE when its input is at
 * fault (never restarted), else the last attempt's status. */
int cmd_launch(int argc, char **argv);
/* `topo`: this machine's topology, or an hwloc XML file's. No MPI. */
int cmd_topo(int argc, char **argv);
/* `plan`: partition, placement and predicted step of one layout, or the search for the
 * best layout of N ranks. No MPI. */
int cmd_plan(int argc, char **argv);
/* `devices`: the CPU and CUDA devices training can use; 0 when the listing worked, even
 * without a usable GPU (the listing says why). Initialises MPI itself (for
 * cuda_mpi_aware) unless it already is. */
int cmd_devices(int argc, char **argv);
/* `summary`, `partition`, `schedule` and `diff`: a model's layers, its cut into stages, a
 * schedule's instruction lists and timeline, two checkpoints compared (1 when they differ
 * beyond the tolerance). No MPI. */
int cmd_summary(int argc, char **argv);
int cmd_partition(int argc, char **argv);
int cmd_schedule(int argc, char **argv);
int cmd_diff(int argc, char **argv);

/* For the commands: prints "pipetrain: what" to stderr and returns PT_EXIT_FAIL. */
int cli_fail(const char *what);
/* Input at fault (a model, topology or checkpoint file that cannot be used, a layout that
 * cannot be): prints "pipetrain: " and pt_error_get() and returns PT_EXIT_USAGE, as train
 * does for what it finds wrong before it starts. */
int cli_input_fail(void);
/* A wrong command line: prints the parser's message (pt_error_get(), which ends with
 * "(see pipetrain CMD --help)") and returns PT_EXIT_USAGE. */
int cli_usage_fail(void);

#endif
