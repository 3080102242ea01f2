/* `pipetrain topo`: the command-line front end of topologies/ (discovery). It prints
 * results to stdout, errors as "pipetrain: message" to stderr, and returns the exit status
 * (0 ok, 1 error, 2 usage). `plan` is src/cli/cmd_plan.c. */
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"
#include "topologies/topo.h"

enum { O_TOPOLOGY = 1, O_JSON, O_HELP };

static const opt_spec topo_opts[] = {
    {.id = O_TOPOLOGY, .name = "topology", .shared = 1},
    {.id = O_JSON, .name = "json", .shared = 1},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command topo_command = {
    .name = "topo",
    .usage = "pipetrain topo [--topology FILE] [--json]",
    .about = "Shows the topology of this machine, or of the machine an hwloc XML file "
             "describes: packages, NUMA nodes, cores, hardware threads, caches, GPUs (PCI "
             "display / 3D devices) with the cores near each, and NUMA distance and GPU "
             "bandwidth matrices where present.",
    .opts = topo_opts,
};

int cmd_topo(int argc, char **argv)
{
    const char *xml = NULL;
    int json = 0, id;
    opt_parser p;
    if (opt_parser_init(&p, &topo_command, argc, argv)) return cli_usage_fail();
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_TOPOLOGY: xml = p.arg; break;
        case O_JSON: json = 1; break;
        case O_HELP: opt_print_help(&topo_command, stdout); return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return cli_usage_fail();
    topo_t *t;
    if (topo_init(&t, xml) < 0) /* a file that cannot be read is the input's fault */
        return xml ? cli_input_fail() : cli_fail(pt_error_get());
    int rc = 0;
    if (json)
        rc = topo_print_json(topo_get_machine(t), stdout);
    else
        topo_print_summary(topo_get_machine(t), stdout);
    topo_free(t);
    return rc < 0 ? cli_fail(pt_error_get()) : 0;
}
