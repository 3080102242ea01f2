/* The CPU stage's sizes (src/cpu/stage.h): how a micro-batch is cut into chunks and
 * gradient groups, and what stage_init allocates, without allocating it (the planner's
 * figures; tests/test_stage.c holds the two equal). */
#include "src/cpu/stage.h"

#include "src/cpu/stage_impl.h"
#include "src/engine/layer_ops.h"

/* Convolution layers run faster on chunks of 16 samples (their im2col matrices then stay in
 * cache; measured with experiments/bench_kernels.c); dense layers prefer larger ones. The
 * chunk size depends only on the net and the micro-batch size, never on the layout or the
 * thread count, so that every layout computes the same sums. */
enum { CONV_CHUNK = 16, DENSE_CHUNK_MIN = 64, SEQUENCE_CHUNK_MIN_TOKENS = 128 };

/* The gradient groups of `threads` threads, the chunk cap (CONV_CHUNK when the net has
 * convolutions: the whole net decides, not the stage) and the least chunk: 64 samples of a
 * vector net; a language model's sample is T tokens, so its chunks need only reach 128
 * token rows, and a micro-batch of a few sequences still spreads over the threads. */
void stage_chunk_rules(const net_desc *net, int threads, int *groups, int *chunk_max,
                        int *chunk_min)
{
    *groups = threads > STAGE_MIN_GROUPS ? threads : STAGE_MIN_GROUPS;
    *chunk_max = 0;
    for (int l = 0; l < net->n_layers; l++)
        if (net->layers[l].type == LAYER_CONV) *chunk_max = CONV_CHUNK;
    int T = net->input.c;
    *chunk_min = net->sequence ? (SEQUENCE_CHUNK_MIN_TOKENS + T - 1) / T : DENSE_CHUNK_MIN;
}

int stage_chunk_of(int chunk_max, int chunk_min, int groups, int n)
{
    int c = chunk_max > 0 ? chunk_max : (n + groups - 1) / groups;
    if (chunk_max == 0 && c < chunk_min) c = chunk_min;
    return c < n ? c : (n > 0 ? n : 1);
}

/* The groups that receive chunks of n samples. */
int stage_used_groups(int groups, int chunk, int n)
{
    int used = (n + chunk - 1) / chunk;
    return used < groups ? used : groups;
}


stage_shape stage_cpu_shape(const net_desc *net, int first, int last, int max_batch, int chunk,
                             const shard_plan *tp, int t)
{
    stage_shape sh = {.net = net, .first = first, .last = last, .max_batch = max_batch,
                      .chunk = chunk, .tp = tp, .tp_rank = t,
                      .conv_workspace = kernel_conv2d_workspace_floats};
    return sh;
}

/* Whether a stage forms its gradient groups layer by layer (split_groups in stage.h): with
 * tensor shards always (the carry is there already), else where the carried gradients
 * (max_batch · widest floats) cost less than what the group buffers would hold beyond one
 * layer each (min(used − 1, threads) of them). */
int stage_groups_by_layer(const net_desc *net, int first, int last, size_t param_count,
                           size_t widest, int max_batch, int threads, int used, int tp)
{
    if (used < 2) return 0;
    if (tp) return 1;
    size_t buffers = (size_t)(used - 1 < threads ? used - 1 : threads), largest = 0;
    for (int l = first; l < last; l++) {
        size_t n = net->layers[l].weight_count + net->layers[l].bias_count;
        if (n > largest) largest = n;
    }
    return (size_t)max_batch * widest < buffers * (param_count - largest);
}

int stage_folds(int groups, int chunk, int max_batch, int tp)
{
    int chunks = (max_batch + chunk - 1) / chunk;
    return !tp && chunks > 1 && chunks <= groups;
}

size_t stage_fold_part_floats(const net_desc *net, int first, int last)
{
    size_t most = 0, page = 4096 / sizeof(float);
    for (int l = first; l < last; l++)
        if (net->layers[l].weight_count && layer_fold_floats(&net->layers[l]) > most)
            most = layer_fold_floats(&net->layers[l]);
    return (most + page - 1) / page * page;
}

/* What a stage of these sizes allocates (stage_init_shard's blocks, one by one). */
static stage_bytes bytes_of(const stage_sizes *z, int threads, int groups, int chunk,
                            int max_batch, int tp)
{
    size_t block = stage_round_up(z->param_count * sizeof(float));
    size_t wide = stage_round_up((size_t)max_batch * z->widest * sizeof(float));
    size_t scratch = (size_t)threads * (stage_round_up(z->work_floats * sizeof(float)) +
                                        2 * stage_round_up(z->widest * chunk * sizeof(float)));
    stage_bytes b = {
        .state = 4 * block,
        .groups = (size_t)stage_used_groups(groups, chunk, max_batch) * block, /* mb_grads, 1.. */
        .thread_scratch = scratch,
        .workers = scratch +
                   (tp ? (4 + (tp > 1)) * wide + /* tp_buf, tp_din, tp_dout, carry,
                                                        tp_seq; tp_inner */
                             stage_round_up((size_t)max_batch * z->phase_floats * sizeof(float))
                       : 0),
        .slot = z->slot_bytes,
    };
    return b;
}

int stage_estimate_groups(const net_desc *net, int max_batch, int threads)
{
    int groups, chunk_max, chunk_min;
    stage_chunk_rules(net, threads, &groups, &chunk_max, &chunk_min);
    return stage_used_groups(groups, stage_chunk_of(chunk_max, chunk_min, groups, max_batch), max_batch);
}

stage_bytes stage_estimate(const net_desc *net, int first, int last, int max_batch, int threads)
{
    return stage_estimate_shard(net, first, last, max_batch, threads, NULL, 0);
}

stage_bytes stage_estimate_shard(const net_desc *net, int first, int last, int max_batch,
                                 int threads, const shard_plan *tp, int t)
{
    int groups, chunk_max, chunk_min;
    stage_chunk_rules(net, threads, &groups, &chunk_max, &chunk_min);
    int chunk = stage_chunk_of(chunk_max, chunk_min, groups, max_batch);
    stage_shape sh = stage_cpu_shape(net, first, last, max_batch, chunk, tp, t);
    stage_sizes z = stage_plan_sizes(&sh);
    int tpk = tp && tp->T > 1 ? 1 + shard_sequence(tp) : 0;
    stage_bytes b = bytes_of(&z, threads, groups, chunk, max_batch, tpk);
    int used = stage_used_groups(groups, chunk, max_batch);
    int split = stage_groups_by_layer(net, first, last, z.param_count, z.widest, max_batch, threads,
                                used, tpk > 0);
    if (split && !tpk)
        b.workers += stage_round_up((size_t)max_batch * z.widest * sizeof(float)); /* carry */
    /* a buffer holds the runs being formed: one layer's (and the partial pages left at
     * every layer's ends), or the whole array */
    size_t page = 4096, unit = z.param_count * sizeof(float);
    if (split) {
        size_t largest = 0;
        for (int l = first; l < last; l++) {
            size_t n = net->layers[l].weight_count + net->layers[l].bias_count;
            if (n > largest) largest = n;
        }
        unit = largest * sizeof(float) + (size_t)(last - first + 1) * page;
    }
    unit = (unit + page - 1) / page * page;
    b.group_held = (size_t)(used - 1 < threads ? used - 1 : threads) * unit;
    b.apart_held = unit;
    size_t part = stage_fold_part_floats(net, first, last) * sizeof(float);
    if (stage_folds(groups, chunk, max_batch, tpk) && part) {
        /* a part per thread, not the buffers: one thread's, or each that forms a group */
        int forming = threads == 1 ? 1 : threads < used ? threads : used;
        b.groups += (size_t)threads * part;
        b.group_held = b.fold_part = (size_t)forming * part;
    }
    b.workers += stage_round_up(stage_loss_floats(net, last, max_batch, tp) * sizeof(float));
    return b;
}

