/* A language model's data in a `train` run (src/train/train_text.c): the corpus the options
 * name, checked against the model, split, its evaluation windows, and each step's batch of
 * windows. */
#ifndef PT_TRAIN_TEXT_H
#define PT_TRAIN_TEXT_H

#include "src/train/train.h"

/* Loads the corpus (o.text), checks that the model is a language model, that every token
 * is below its vocabulary and that the training part holds more than a window of its
 * context T + 1 tokens; holds the last --val-fraction out and spaces --eval-windows
 * windows over it (run->val); sets up the step batches. −1 with a message. */
int train_text_load(train_run *run);
/* The batch of `step` (data_text_batch: sample i is the window text_sample_offset(seed,
 * step, i)), filled into buffer step mod 2 unless it holds that step already; the
 * executor's indices for it are run->order (0 … batch − 1). */
const dataset *train_text_batch(train_run *run, long step);
/* "bits per byte" (loss / ln 2) for byte tokens, "perplexity" (e^loss) for token files;
 * *value receives it. */
const char *train_text_measure(const train_run *run, double loss, double *value);
void train_text_free(train_run *run);

#endif
