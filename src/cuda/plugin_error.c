/* src/base/error.h inside the CUDA plugin: messages go to the host's pt_error_set, so that the
 * front end (which only reads the host's thread-local message) sees them.
 *
 * These definitions are linked before the static libraries (ptcuda, ptcore), so the linker
 * never pulls src/base/error.o into the plugin: the kernels' and the engine's pt_error_set
 * calls land here. Before the entry has run (it never should) messages stay local. */
#include "src/base/error.h"

#include <stdarg.h>
#include <stdio.h>

#include "src/engine/cuda_abi.h"

void plugin_error_connect(const cuda_plugin_host *host);

static const cuda_plugin_host *error_host;
enum { MESSAGE_LEN = 1024 };
static _Thread_local char local_message[MESSAGE_LEN];

void plugin_error_connect(const cuda_plugin_host *host) { error_host = host; }

int pt_error_set(const char *fmt, ...)
{
    char buf[MESSAGE_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_host ? buf : local_message, MESSAGE_LEN, fmt, ap);
    va_end(ap);
    if (error_host) error_host->error_set("%s", buf);
    return -1;
}

const char *pt_error_get(void) { return error_host ? error_host->error_get() : local_message; }

void pt_error_clear(void)
{
    /* the host offers no clear: an empty message is the same */
    if (error_host) error_host->error_set("%s", "");
    local_message[0] = '\0';
}
