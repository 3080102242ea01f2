/* Helpers shared by the files of topologies/ only (not part of the public interface). */
#ifndef PT_TOPO_INTERNAL_H
#define PT_TOPO_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include "topologies/topo.h"

/* Gives places[0..k) contiguous blocks of the cores pool[0..count) that follow the hierarchy
 * (k ≤ count), or with more places than cores one core each, round robin, marked shared.
 * Sets each place's cores (malloc'ed), n_cores and shared. */
int topo_assign_cores(const topo_machine *m, const int *pool, int count, topo_place **places,
                      int k);

#endif
