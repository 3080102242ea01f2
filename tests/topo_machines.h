/* What the topology suites share (tests/test_topo.c, tests/test_topo_place.c): the machine
 * descriptions in topologies/ with the counts each must load with, and loading one of them
 * by file name. Static inline, so a suite that does not use one does not warn. */
#ifndef PT_TESTS_TOPO_MACHINES_H
#define PT_TESTS_TOPO_MACHINES_H

#include <stdio.h>

#include "src/base/error.h"
#include "tests/check.h"
#include "topologies/topo.h"

static inline topo_t *load(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/topologies/%s", check_source_dir(), name);
    topo_t *t = NULL;
    int rc = topo_init(&t, path);
    cr_assert_eq(rc, 0, "loading %s: %s", path, pt_error_get());
    return t;
}

typedef struct {
    const char *file;
    int packages, numa, l3, cores, pus, gpus, nvidia;
    int has_numa_distance, has_gpu_bandwidth;
} expected_counts;

static const expected_counts machines[] = {
    {"local-2core.xml", 1, 1, 1, 2, 2, 0, 0, 0, 0},
    {"node-16c-1gpu.xml", 1, 1, 4, 16, 32, 1, 1, 0, 0},
    {"node-2s-8gpu.xml", 2, 2, 2, 40, 80, 8, 8, 1, 1}, /* and a VGA that is no GPU */
    {"ws-4gpu.xml", 1, 1, 4, 24, 48, 4, 4, 0, 0},
};
#define N_MACHINES (int)(sizeof machines / sizeof machines[0])

#endif
