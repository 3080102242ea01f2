/* train's checkpoints to resume from: --checkpoint-dir DIR with --checkpoint-every N
 * (and one at the end), --keep K, and --resume DIR|FILE. The file format and directory are
 * src/io/checkpoint.h and src/io/checkpoint_dir.h; this is what the run does with them. */
#ifndef PT_TRAIN_CHECKPOINT_H
#define PT_TRAIN_CHECKPOINT_H

#include "src/train/train.h"

/* Collective, after the parameters are initialised (or loaded): prepares the checkpoint
 * directory (rank 0), and with --resume finds the newest usable checkpoint (rank 0; the
 * refused ones are reported with their reason), and loads every rank's parameters,
 * optimizer state and update count from it, in this run's layout, whatever layout wrote
 * it. Sets run->resumed_from_step (−1 when not resuming). A checkpoint of another model or
 * with other options that the state depends on (seed, shuffle, batch, optimizer and its
 * settings) is refused with what differs. −1 with a message (printed by the rank it
 * concerns) on every rank when it fails. */
int train_checkpoint_setup(train_run *run);

/* Collective, after each step (`steps` done so far, fewer than the run's): whether a
 * checkpoint is due now, by --checkpoint-every, or by --checkpoint-minutes (rank 0's clock
 * decides, and its verdict reaches the others with a non-blocking broadcast that lands a
 * step later, so every rank agrees without a blocking collective per step). −1 on failure. */
int train_checkpoint_due(train_run *run, long steps);

/* Collective: the whole model's parameters and optimizer state after `step` steps,
 * gathered from replica 0's pipeline to rank 0 (politely, under --timeout) and written
 * there atomically as DIR/ckpt-STEP.safetensors; then all but the newest --keep removed.
 * With --checkpoint-write background (the default) rank 0 writes from its gathered copy in
 * a thread while training goes on; the write's outcome is agreed at the next checkpoint or
 * at train_checkpoint_finish, and a new checkpoint first waits for the previous write.
 * −1 on every rank when it fails (the previous checkpoints stay). */
int train_checkpoint_save(train_run *run, long step);

/* Collective, at the end of the run (also after a failure that every rank knows of):
 * waits for a write in progress and for the --checkpoint-minutes decision in flight.
 * −1 on every rank when the write failed. */
int train_checkpoint_finish(train_run *run);

#endif
