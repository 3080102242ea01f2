/* Strict parsing of command-line numbers: the whole string must be a number in range. */
#ifndef PT_OPTIONS_H
#define PT_OPTIONS_H

int opt_parse_long(const char *name, const char *text, long min, long max, long *out);
int opt_parse_double(const char *name, const char *text, double min, double max, double *out);

#endif
