/* The learning rate of each optimizer step (--lr-schedule, --lr-warmup, --lr-min): a pure
 * function of the step, so every stage, tensor shard and replica computes the same value
 * on its own, and a resumed run continues the curve from its checkpoint's step.
 *
 * s = the 0-based index of the update in the whole run, total = the run's updates:
 *   s < warmup:  lr · (s + 1) / warmup
 *   otherwise    p = (s − warmup) / max(1, total − warmup), clamped to [0, 1], and
 *     constant:  lr
 *     cosine:    min + 0.5 · (1 + cos(π · p)) · (lr − min)
 *     linear:    lr − p · (lr − min)
 * in double, from lr and min as the decimals the user wrote, rounded to float once. The
 * update then uses that float as torch would use the Python float of its shortest decimal
 * (float(str(numpy.float32(x))), kernels/optim.c's reading of a learning rate). */
#ifndef PT_LR_SCHEDULE_H
#define PT_LR_SCHEDULE_H

typedef enum { LR_CONSTANT = 0, LR_COSINE, LR_LINEAR } lr_schedule_kind;

typedef struct {
    lr_schedule_kind kind;
    double lr;      /* the peak (--lr) */
    double lr_min;  /* the floor cosine and linear decay to (--lr-min) */
    long warmup;    /* steps of linear warm-up (--lr-warmup; 0: none) */
} lr_schedule;

/* The learning rate of update `step` (0-based) of a run of `total` updates. */
float lr_schedule_at(const lr_schedule *s, long step, long total);

/* "constant", "cosine", "linear" ("?" out of range). */
const char *lr_schedule_name(lr_schedule_kind k);

#endif
