/* libFuzzer harness: train's command line (src/train/train_options.c over the option
 * parser of src/base/options.c) and the lists inside it, --partition (explicit layer
 * counts, partition/partition.c) and --recompute (a list of stages, schedule/schedule.c).
 * The input is the arguments separated by NUL bytes. An accepted command line must have
 * its numbers in range; an accepted list must add up; an accepted learning-rate schedule
 * must give finite rates within [0, --lr]. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"
#include "schedule/schedule.h"
#include "src/train/lr_schedule.h"
#include "src/train/train_options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ARGS = 64, LAYERS = 12 };

static void check_lists(const train_options *o)
{
    int stages = o->stages > 0 && o->stages <= 64 ? o->stages : 4;
    if (o->partition) {
        partition p;
        if (partition_from_counts(&p, o->partition, LAYERS, stages) == 0) {
            if (p.first[0] != 0 || p.first[p.stages] != LAYERS) abort();
            for (int s = 0; s < p.stages; s++)
                if (p.first[s + 1] <= p.first[s]) abort();
            partition_free(&p);
        }
    }
    if (o->recompute) {
        int flags[64];
        if (schedule_parse_recompute(o->recompute, stages, flags) == 0)
            for (int s = 0; s < stages; s++)
                if (flags[s] != 0 && flags[s] != 1) abort();
    }
}

/* The optimizer's settings and the learning-rate schedule an accepted command line gives:
 * in range, and a schedule whose every rate is finite and within [0, --lr]. */
static void check_optimizer(const train_options *o)
{
    const optimizer_config *c = &o->opt;
    const lr_schedule *s = &o->lr_sched;
    if ((unsigned)c->kind > OPTIM_ADAMW || (unsigned)s->kind > LR_LINEAR) abort();
    if (!(c->clip_norm >= 0) || !(c->beta1 >= 0 && c->beta1 < 1) ||
        !(c->beta2 >= 0 && c->beta2 < 1) || !(c->eps >= 0) || !(c->weight_decay >= 0))
        abort();
    if (s->warmup < 0 || !(s->lr_min >= 0 && s->lr_min <= s->lr)) abort();
    long total = o->steps > 0 ? o->steps : 1000;
    const long at[] = {0, s->warmup - 1, s->warmup, total - 1, total, total + 1};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        if (at[i] < 0) continue;
        float lr = lr_schedule_at(s, at[i], total);
        /* at the peak the double may round a last bit above --lr's float */
        if (!(lr >= 0) || !(lr <= nextafterf((float)s->lr, INFINITY))) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "train";
    for (char *p = text; p < text + size && argc <= MAX_ARGS; p += strlen(p) + 1)
        argv[argc++] = p;
    argv[argc] = NULL;
    train_options o;
    if (train_options_parse(&o, argc, argv) == 0) {
        if (o.stages < 1 || o.batch < 1 || o.threads < 0) abort(); /* threads 0: auto */
        check_lists(&o);
        check_optimizer(&o);
    }
    free(text);
    return 0;
}
