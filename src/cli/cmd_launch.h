/* `pipetrain launch`: runs a training job and, when it fails, runs it again from its last
 * complete checkpoint (src/cli/cmd_launch.c says how). */
#ifndef PT_CMD_LAUNCH_H
#define PT_CMD_LAUNCH_H

/* argv[0] is "launch". Returns the exit status: 0 when the job ended well, the job's
 * PT_EXIT_USAGE when its input is at fault (never restarted), else the last attempt's. */
int launch_main(int argc, char **argv);

#endif
