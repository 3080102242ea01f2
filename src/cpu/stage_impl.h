/* What the CPU stage's files (stage.c, stage_wgrad.c) share; not for other modules. */
#ifndef PT_STAGE_IMPL_H
#define PT_STAGE_IMPL_H

#include <stddef.h>

/* bytes zeroed, aligned to STAGE_ALIGN and rounded up to it (at least one block); NULL when
 * out of memory */
void *stage_alloc_zeroed(size_t bytes);

#endif
