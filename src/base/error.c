#include "src/base/error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char error_message[1024];

int pt_error_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return -1;
}

const char *pt_error_get(void) { return error_message; }

void pt_error_clear(void) { error_message[0] = '\0'; }
