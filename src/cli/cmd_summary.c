/* `pipetrain summary`: the layers, output shapes and parameters of a model file. */
#include <stdio.h>

#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"
#include "src/model/net.h"

enum { O_MODEL = 1, O_HELP };

static const opt_spec summary_opts[] = {
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command summary_command = {
    .name = "summary",
    .usage = "pipetrain summary --model FILE",
    .about = "Layers, output shapes and parameters of a model file.",
    .opts = summary_opts,
};

int cmd_summary(int argc, char **argv)
{
    const char *model = NULL;
    opt_parser p;
    if (opt_parser_init(&p, &summary_command, argc, argv)) return cli_usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        if (id == O_MODEL) model = p.arg;
        if (id == O_HELP) {
            opt_print_help(&summary_command, stdout);
            return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return cli_usage_fail();
    net_desc net;
    if (net_desc_load(&net, model)) return cli_input_fail();
    net_desc_print_summary(&net, stdout);
    net_desc_free(&net);
    return PT_EXIT_OK;
}
