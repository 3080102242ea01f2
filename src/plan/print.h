/* What `plan --stages K` prints about one layout built (src/plan/build.h): the text report
 * (partition, placement, links, tensor shards, predicted step) or one JSON object. */
#ifndef PT_PLAN_PRINT_H
#define PT_PLAN_PRINT_H

#include <stdio.h>

#include "partition/partition.h"
#include "src/plan/build.h"

/* The text report. times: the layer times that chose the partition, shown in its table
 * (NULL: the partition was not cut by time). */
void plan_print_text(const plan_result *r, const partition_profile *times, FILE *out);
/* The layout as one line of JSON. −1 with a message when it cannot be built or written. */
int plan_print_json(const plan_result *r, FILE *out);

#endif
