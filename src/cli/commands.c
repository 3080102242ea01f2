/* What the commands share (src/cli/commands.h): how they report a failure. */
#include "src/cli/commands.h"

#include <stdio.h>

#include "src/base/error.h"
#include "src/base/options.h"

int cli_fail(const char *what)
{
    fprintf(stderr, "pipetrain: %s\n", what);
    return PT_EXIT_FAIL;
}

int cli_input_fail(void)
{
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    return PT_EXIT_USAGE;
}

int cli_usage_fail(void)
{
    fprintf(stderr, "pipetrain: %s\n", pt_error_get());
    return PT_EXIT_USAGE;
}
