/* A directory of checkpoints to resume from (train --checkpoint-dir): one safetensors file
 * per checkpoint, DIR/ckpt-STEP.safetensors (STEP zero-padded to 10 digits, so names sort
 * by step), written atomically by st_write_meta and described by its "__metadata__":
 *   pipetrain_checkpoint  "1" (the format), complete "1" (written last of the keys)
 *   step, epoch           optimizer steps taken; epochs begun
 *   model, model_hash     the model file and the FNV-1a 64 hash of its bytes (hex)
 *   seed, shuffle, batch, optimizer, lr, momentum, beta1, beta2, eps, weight_decay
 *   corpus_digest, corpus_tokens, val_fraction, corpus   a language model's text only:
 *                         text_digest of the whole corpus, its tokens, the split, its name
 *                         (with seed and step, the data position)
 *   stages, replicas, microbatches, schedule, reduce   the layout that wrote it
 *   version, commit       the pipetrain that wrote it
 *   run_id                the run that wrote it: 16 random hex digits drawn at a fresh
 *                         start, kept by a run that resumes from it (--keep prunes by it)
 * The tensors: the parameters and the optimizer's moments (src/io/checkpoint.h). */
#ifndef PT_CHECKPOINT_DIR_H
#define PT_CHECKPOINT_DIR_H

#include <stddef.h>

#include "src/io/safetensors.h"

/* Creates DIR (and its parents) when missing, checks that a file can be written there,
 * locks it for the life of the process (flock on DIR/.pipetrain-lock, which names its
 * holder's pid and host: a second job on the directory is refused, naming them), and
 * removes temporaries a killed writer left behind (ckpt-*.safetensors.tmp-*).
 * −1 with a message naming the directory and the reason. */
#define CKPT_DIR_LOCK ".pipetrain-lock"
int ckpt_dir_prepare(const char *dir);
/* DIR/ckpt-STEP.safetensors into buf. */
void ckpt_dir_file(const char *dir, long step, char *buf, size_t size);
/* Removes all but the `keep` newest checkpoints of the run `run_id` (keep ≥ 1): those whose
 * metadata "run_id" is that; other runs' checkpoints, and files without a run_id, stay. */
int ckpt_dir_prune(const char *dir, int keep, const char *run_id);

/* Checks an open checkpoint against what the run needs; 0, or −1 with the reason. */
typedef int (*ckpt_check_fn)(const st_file *f, const char *path, void *arg);

/* The checkpoint to resume from: `path` itself when it is a file, else the newest file of
 * the directory that reads completely and passes `check`. Refused ones are reported on
 * stderr with their reason, and the next older one is tried. −1 with a message when none
 * is usable (an empty directory says so). */
int ckpt_find_latest(const char *path, ckpt_check_fn check, void *arg, char *out, size_t size);

/* The step of a checkpoint's file name (ckpt-DIGITS.safetensors, as ckpt_dir_file writes
 * it), else −1: temporaries, ckpt-best.safetensors and other names are not checkpoints.
 * Train and `pipetrain launch` both use it, so that they agree on what a checkpoint is. */
long ckpt_dir_name_step(const char *name);

#endif
