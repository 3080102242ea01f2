#include "src/options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "src/base/error.h"

int opt_parse_long(const char *name, const char *text, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno)
        return pt_error_set("%s %s: not an integer", name, text);
    if (v < min || v > max)
        return pt_error_set("%s %s: must be between %ld and %ld", name, text, min, max);
    *out = v;
    return 0;
}

int opt_parse_double(const char *name, const char *text, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v))
        return pt_error_set("%s %s: not a number", name, text);
    if (v < min || v > max)
        return pt_error_set("%s %s: must be between %g and %g", name, text, min, max);
    *out = v;
    return 0;
}
