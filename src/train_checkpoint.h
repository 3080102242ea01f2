/* train's checkpoints to resume from: --checkpoint-dir DIR with --checkpoint-every N
 * (and one at the end), --keep K, and --resume DIR|FILE. The file format and directory are
 * src/checkpoint.h and src/checkpoint_dir.h; this is what the run does with them. */
#ifndef PT_TRAIN_CHECKPOINT_H
#define PT_TRAIN_CHECKPOINT_H

#include "src/train_report.h"

/* Collective, after the parameters are initialised (or loaded): prepares the checkpoint
 * directory (rank 0), and with --resume finds the newest usable checkpoint (rank 0; the
 * refused ones are reported with their reason), and loads every rank's parameters,
 * optimizer state and update count from it, in this run's layout, whatever layout wrote
 * it. Sets run->resumed_from_step (−1 when not resuming). A checkpoint of another model or
 * with other options that the state depends on (seed, shuffle, batch, optimizer and its
 * settings) is refused with what differs. −1 with a message (printed by the rank it
 * concerns) on every rank when it fails. */
int train_checkpoint_setup(train_run *run);

/* Collective: the whole model's parameters and optimizer state after `step` steps,
 * gathered from replica 0's pipeline to rank 0 (politely, under --timeout) and written
 * there atomically as DIR/ckpt-STEP.safetensors; then all but the newest --keep removed.
 * −1 on every rank when it fails (the previous checkpoints stay). */
int train_checkpoint_save(train_run *run, long step);

#endif
