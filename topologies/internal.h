/* Helpers shared by the files of topologies/ only (not part of the public interface). */
#ifndef PT_TOPO_INTERNAL_H
#define PT_TOPO_INTERNAL_H

#include <stddef.h>
#include <stdio.h>

#include "topologies/topo.h"

/* Writes s as a JSON string literal, quotes included. */
void topo_json_string(FILE *out, const char *s);
/* "1.5 GiB" style, binary units, for sizes. */
void topo_format_size(char *buf, size_t size, double bytes);
/* "12.3 MB" style, decimal units, for traffic (bytes/s figures are decimal too). */
void topo_format_bytes(char *buf, size_t size, double bytes);
/* "1.23 ms" style. */
void topo_format_seconds(char *buf, size_t size, double s);

/* Gives places[0..k) contiguous blocks of the cores pool[0..count) that follow the hierarchy
 * (k ≤ count), or with more places than cores one core each, round robin, marked shared.
 * Sets each place's cores (malloc'ed), n_cores and shared. */
int topo_assign_cores(const topo_machine *m, const int *pool, int count, topo_place **places,
                      int k);

#endif
