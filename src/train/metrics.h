/* The metrics file (train --metrics FILE.jsonl): one JSON object per line, written by one
 * rank, each line whole: a reader, even of a file whose writer crashed, sees complete
 * lines only (at most the last one missing). The first line is the run's metadata
 * ({"type": "run", ...}); then "step" lines every --log-every steps, "epoch" lines and a
 * last "final" line (src/train/train.c says what each holds, docs in the README). */
#ifndef PT_METRICS_H
#define PT_METRICS_H

#include <jansson.h>

typedef struct metrics metrics_t; /* opaque: the open file */

/* Creates (truncates) the file and writes the first line: `run` with "type": "run" added
 * (the reference is taken). −1 with a message naming the path when it cannot be written. */
int metrics_open(metrics_t **m, const char *path, json_t *run);
/* Writes one line: `line` with "type": type added (the reference is taken). −1 with a
 * message when the write fails (a full disk): the caller decides whether that ends the run. */
int metrics_write(metrics_t *m, const char *type, json_t *line);
/* Closes the file; −1 with a message when its last bytes could not be written. */
int metrics_close(metrics_t *m);

#endif
