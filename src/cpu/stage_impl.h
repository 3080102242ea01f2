/* What the CPU stage's files (stage.c, stage_sizes.c, stage_wgrad.c, stage_seq.c, stage_fold.c,
 * stage_tp.c, stage_rank_pool.c) share; not for other modules. */
#ifndef PT_STAGE_IMPL_H
#define PT_STAGE_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "src/cpu/stage.h"

/* bytes zeroed, aligned to STAGE_ALIGN and rounded up to it (at least one block); NULL when
 * out of memory */
void *stage_alloc_zeroed(size_t bytes);

/* How a micro-batch is cut (stage_sizes.c): the gradient groups of `threads` threads, the
 * chunk cap and the least chunk (the whole net decides, not the stage); the chunk size for
 * n samples; the groups that receive chunks of n samples; the stage's shape for the
 * shared layout; whether its groups are formed layer by layer (split_groups). */
void stage_chunk_rules(const net_desc *net, int threads, int *groups, int *chunk_max,
                       int *chunk_min);
int stage_chunk_of(int chunk_max, int chunk_min, int groups, int n);
int stage_used_groups(int groups, int chunk, int n);
stage_shape stage_cpu_shape(const net_desc *net, int first, int last, int max_batch, int chunk,
                            const shard_plan *tp, int t);
int stage_groups_by_layer(const net_desc *net, int first, int last, size_t param_count,
                          size_t widest, int max_batch, int threads, int used, int tp);
/* Whether the gradient groups are added to group 0's product by product as they are formed
 * (stage_fold_group: one chunk per group, no tensor shards), and the floats of the part
 * each thread forms them in (layer_fold_floats, the largest of layers [first, last), rounded
 * up to whole pages; 0: no parameters). */
int stage_folds(int groups, int chunk, int max_batch, int tp);
size_t stage_fold_part_floats(const net_desc *net, int first, int last);

/* Group g ≥ 1 of a micro-batch added to group 0's gradient as each of its layers' products
 * is formed (layer_io.fold), where each group has one chunk: the additions reduce_worker
 * makes, element by element in group order, so the same bits; the group's buffer (base) is
 * addressed, never written. One thread forms the groups one after another. Several form
 * a wave's groups at once, group 0 folding into its zeroed gradient too (0 + x is x), and
 * group g's k-th fold waits for group g − 1's k-th (each group folds the same products in
 * the same order), so the sums keep their order. */
typedef struct stage_fold {
    float *base, *form; /* the group's buffer; group 0's gradient (group_grads[0]) */
    float *add_to;      /* the last group of a micro-batch formed apart: where the sum goes */
    float *part;        /* where the layers form each product (zeros between folds) */
    atomic_int *wait, *done; /* several threads: group g − 1's folds in this wave (NULL: none
                                to wait for), group g's */
    int n;              /* folds made */
} stage_fold;
/* The stage's parts (and, with several threads, its fold counters) where its groups fold;
 * 0, or −1 out of memory. */
int stage_fold_alloc(stage *s, int chunk);
/* layer_io.fold of a stage_fold (self). */
int stage_fold_group(void *self, float *dw_at, float *part, size_t count);

/* The pool stages created now share (stage_rank_pool_use), with a reference for the
 * caller; NULL: none. slots: its units (0: none); take: binds a free unit (its index, its
 * memory at *base), −1 with a message when all are bound; give: unbinds it. groups: the
 * shared page pool, *counts 1 for the first stage that asks (it reports the pool's pages).
 * workers: `threads` workers whose buffers hold at least these floats (grown for a larger
 * chunk: the entries change, the array stays), NULL when out of memory. */
stage_rank_pool *stage_rank_pool_adopt(void);
int stage_rank_pool_slots(const stage_rank_pool *pool);
size_t stage_rank_pool_unit(const stage_rank_pool *pool);
int stage_rank_pool_take(stage_rank_pool *pool, char **base);
void stage_rank_pool_give(stage_rank_pool *pool, int u);
pages_pool *stage_rank_pool_groups(stage_rank_pool *pool, int *counts);
stage_worker *stage_rank_pool_workers(stage_rank_pool *pool, int threads, size_t work_floats,
                                      size_t scratch_floats);
/* The parts the stages fold their gradient groups in (one per thread, zeros between
 * folds), grown to at least `floats` in all (0: as they are; the stages register theirs
 * when made, nothing runs then);
 * NULL when out of memory. Its bytes backed now (the group pages' reporter counts them). */
float *stage_rank_pool_part(stage_rank_pool *pool, size_t floats);
size_t stage_rank_pool_part_resident(const stage_rank_pool *pool);
/* Whether W of the stage's last layer reads the output gradient B was given (the caller
 * keeps it until W: an engine's GRAD_IN or loss gradient) rather than a copy in the slot. */
int stage_split_top_reads_dout(const stage_plan *p);
/* The split backward's gradients of one slot (stage_split_slot_bytes) carved at mem. */
void stage_split_carve(stage *s, stage_slot *sl, char *mem);
/* Zeroes slot's layer-norm sums (stage_slot_layer.sums) before its B adds to them. */
void stage_split_zero_sums(stage *s, int slot);

/* One forward or backward of a slot's micro-batch as the tensor runs see it (the `self`
 * of the CPU's stage_tensor_ops). */
typedef struct {
    stage *s;
    int slot;
    const int64_t *ids;      /* forward */
    uint64_t seed, step;
    float *grads;            /* backward */
    int parts;
} stage_pass;

/* stage_tensor_ops' allreduce, gather, slice, finish and reduce_carry (stage_tp.c),
 * reduce_scatter and seq_carry (stage_seq.c). */
int stage_tp_allreduce(void *self, float *buf, size_t n);
int stage_tp_gather(void *self, const shard_state *st, size_t whole, const float *local,
                    float *out, int n);
int stage_tp_slice(void *self, const float *in, size_t whole, size_t from, size_t keep,
                   float *out, int n);
int stage_tp_finish(void *self, int i, float *y, int n);
int stage_tp_reduce_carry(void *self, int b, size_t count, size_t from, size_t keep, int n);
int stage_tp_reduce_scatter(void *self, const shard_state *st, size_t whole, const float *in,
                            float *out, int n);
int stage_tp_seq_carry(void *self, const shard_state *st, size_t whole, int n, int gather);

#endif
