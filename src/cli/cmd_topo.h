/* The `topo` and `plan` commands: the front end of topologies/ (discovery, placement). */
#ifndef PT_CMD_TOPO_H
#define PT_CMD_TOPO_H

/* `pipetrain topo` and `pipetrain plan`: argv[0] is the sub-command's name. They print to
 * stdout, errors as "pipetrain: message" to stderr, and return the exit status (0 ok,
 * 1 error, 2 usage). No MPI. */
int topo_cmd_topo(int argc, char **argv);
int topo_cmd_plan(int argc, char **argv);

#endif
