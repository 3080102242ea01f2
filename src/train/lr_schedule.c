/* The learning-rate schedule (src/train/lr_schedule.h). */
#include "src/train/lr_schedule.h"

#include <math.h>

/* Each operation rounds on its own, as Python's: no fused multiply-adds (the build's -std=c11
 * does not contract; this keeps it so under -std=gnu11 too). */
#if defined(__GNUC__) && !defined(__clang__)
#define LR_EXACT __attribute__((optimize("fp-contract=off")))
#else
#define LR_EXACT
#endif

/* Python's math.pi and C's M_PI: the double nearest π. */
static const double LR_PI = 3.14159265358979323846;

LR_EXACT
float lr_schedule_at(const lr_schedule *s, long step, long total)
{
    if (s->warmup > 0 && step < s->warmup)
        return (float)(s->lr * (double)(step + 1) / (double)s->warmup);
    long span = total - s->warmup > 1 ? total - s->warmup : 1;
    double p = (double)(step - s->warmup) / (double)span;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    switch (s->kind) {
    case LR_COSINE:
        return (float)(s->lr_min + 0.5 * (1.0 + cos(LR_PI * p)) * (s->lr - s->lr_min));
    case LR_LINEAR: return (float)(s->lr - p * (s->lr - s->lr_min));
    case LR_CONSTANT: break;
    }
    return (float)s->lr;
}

const char *lr_schedule_name(lr_schedule_kind k)
{
    static const char *const names[] = {"constant", "cosine", "linear"};
    return (unsigned)k < sizeof names / sizeof *names ? names[k] : "?";
}
