/* `pipetrain partition`: a model cut into pipeline stages as train would cut it, and the
 * balance. */
#include <stdio.h>
#include <string.h>

#include "partition/partition.h"
#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"
#include "src/model/net.h"
#include "src/runtime/profile.h"

enum { O_MODEL = 1, O_STAGES, O_MICRO, O_BATCH, O_PART, O_METHOD, O_HELP };

static const opt_spec partition_opts[] = {
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.id = O_STAGES, .name = "stages", .shared = 1, .required = 1},
    {.id = O_PART, .name = "partition", .shared = 1},
    {.id = O_BATCH, .name = "batch", .shared = 1},
    {.id = O_MICRO, .name = "microbatches", .shared = 1},
    {.id = O_METHOD, .name = "method", .kind = OPT_TEXT, .arg = "METHOD"}, /* old name */
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command partition_command = {
    .name = "partition",
    .usage = "pipetrain partition --model FILE --stages K [options]",
    .about = "Cuts a model into K pipeline stages as train would and shows the balance: "
             "parameters, time per sample and values sent at each boundary. --partition time "
             "measures every layer on this machine at the micro-batch size (batch / M).",
    .opts = partition_opts,
};

int cmd_partition(int argc, char **argv)
{
    const char *model = NULL, *method = NULL;
    int stages = 0, batch = 0, micro = 0;
    opt_parser p;
    if (opt_parser_init(&p, &partition_command, argc, argv)) return cli_usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_MODEL: model = p.arg; break;
        case O_PART:
        case O_METHOD: method = p.arg; break;
        case O_STAGES: stages = (int)p.num; break;
        case O_BATCH: batch = (int)p.num; break;
        case O_MICRO: micro = (int)p.num; break;
        case O_HELP: opt_print_help(&partition_command, stdout); return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return cli_usage_fail();
    if (batch % micro) {
        opt_error(&p, "--microbatches %d does not divide --batch %d", micro, batch);
        return cli_usage_fail();
    }
    net_desc net;
    if (net_desc_load(&net, model)) return cli_input_fail();
    partition_profile prof = {0};
    partition part = {0};
    int timed = !strcmp(method, "time");
    /* a cut that cannot be is the input's fault (2); only the profiling can fail (1) */
    int rc = partition_check(net.n_layers, stages) ? PT_EXIT_USAGE : PT_EXIT_OK;
    /* timing runs the layers: a model this version cannot train is refused (2) first */
    if (!rc && timed && net_desc_check_trainable(&net, model)) rc = PT_EXIT_USAGE;
    if (!rc && timed && partition_profile_measure(&prof, &net, batch / micro, 2, 7))
        rc = PT_EXIT_FAIL;
    if (!rc && partition_by_method(&part, method, &net, timed ? &prof : NULL, stages))
        rc = PT_EXIT_USAGE;
    if (!rc) {
        printf("%s into %d stage%s by %s%s:\n", model, stages, stages == 1 ? "" : "s", method,
               timed ? " (measured on this machine)" : "");
        partition_print(&part, &net, timed ? &prof : NULL, stdout);
    } else {
        fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    }
    partition_free(&part);
    partition_profile_free(&prof);
    net_desc_free(&net);
    return rc;
}
