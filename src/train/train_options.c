/* Options of `pipetrain train` (src/train/train_options.h): one table (src/base/options.h)
 * gives both the parsing and the help. */
#include "src/train/train_options.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/bf16.h"
#include "schedule/schedule.h"
#include "src/base/error.h"
#include "src/base/mpi_wait.h"
#include "src/runtime/exec.h"
#include "src/base/options.h"
#include "src/io/checkpoint_dir.h"
#include "src/io/text_data.h"

enum { O_MODEL = 1, O_DATA, O_VAL, O_TRAIN_N, O_TEST_N, O_LOAD, O_SAVE, O_EPOCHS, O_STEPS,
       O_UNTIMED, O_BATCH, O_OPT, O_LR, O_MOM, O_WD, O_SEED, O_SHUFFLE, O_STAGES, O_MICRO,
       O_SCHED, O_PART, O_THREADS, O_BIND, O_DEVICE, O_TIMEOUT, O_TRACE, O_JSON, O_VERBOSE,
       O_HELP, O_STALL, O_KILL, O_DELAY, O_PROGRESS, O_MPI_ERROR, O_REPLICAS, O_REDUCE,
       O_TENSOR, O_TENSOR_MODE, O_SEQPAR, O_BUCKET_MB, O_OVERLAP, O_SKIP_BUCKET, O_WAIT, O_METRICS,
       O_LOG_EVERY, O_CKPT_DIR, O_CKPT_EVERY, O_KEEP, O_RESUME, O_CKPT_MIN, O_CKPT_WRITE,
       O_VIRTUAL, O_RECOMPUTE, O_WGRAD, O_WARMUP, O_TRAIN_IMG, O_TRAIN_LAB, O_TEST_IMG,
       O_TEST_LAB, O_BETA1, O_BETA2, O_EPS, O_LR_SCHED, O_LR_WARMUP, O_LR_MIN, O_CLIP, O_POSTVAL,
       /* a language model's text */
       O_TEXT, O_TOKENS, O_TOKENS_RAW, O_VAL_FRACTION, O_EVAL_WINDOWS, O_ZERO, O_ZERO3_PREFETCH,
       O_ZERO_OVERLAP,
       O_SCHED_FILE,
       O_SCHED_MEM, O_PRECISION };

/* The largest step count, sample count or seed we take: far beyond any run, exact in a
 * double (the table's ranges are doubles). */
#define BIG 1e15

static const opt_spec train_opts[] = {
    {.section = "data and model"},
    {.id = O_MODEL, .name = "model", .shared = 1},
    {.id = O_DATA, .name = "data", .kind = OPT_TEXT, .arg = "DIR", .def = DEFAULT_DATA_DIR,
     .help = "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] in DIR: Fashion-MNIST's "
             "names; --data " TEXT_DATA_NAME ": the built-in text corpus (Debian's fortunes, "
             "" TEXT_FORTUNES_DIR ") for a language model"},
    {.id = O_TRAIN_IMG, .name = "train-images", .kind = OPT_TEXT, .arg = "FILE",
     .help = "training images, any name, instead of --data's (IDX, see below)"},
    {.id = O_TRAIN_LAB, .name = "train-labels", .kind = OPT_TEXT, .arg = "FILE",
     .help = "their labels"},
    {.id = O_TEST_IMG, .name = "test-images", .kind = OPT_TEXT, .arg = "FILE",
     .help = "test images, likewise (--train-images without them: no test set)"},
    {.id = O_TEST_LAB, .name = "test-labels", .kind = OPT_TEXT, .arg = "FILE",
     .help = "their labels"},
    {.id = O_TEXT, .name = "text", .kind = OPT_TEXT, .arg = "FILE",
     .help = "a language model's corpus instead of --data's: any UTF-8 text file, a token "
             "per byte"},
    {.id = O_TOKENS, .name = "tokens", .kind = OPT_TEXT, .arg = "FILE",
     .help = "likewise, pre-tokenized: llm.c's .bin (uint16 tokens after its 1024-byte "
             "header), each below the model's vocabulary"},
    {.id = O_TOKENS_RAW, .name = "tokens-raw", .kind = OPT_TEXT, .arg = "FILE",
     .help = "likewise, nanoGPT's .bin: uint16 tokens, no header (nothing to check but "
             "its size)"},
    {.id = O_VAL_FRACTION, .name = "val-fraction", .kind = OPT_REAL, .arg = "X", .min = 0,
     .max = 0.9, .def = "0.1",
     .help = "text: hold out the corpus's last X for validation (0: none)"},
    {.id = O_EVAL_WINDOWS, .name = "eval-windows", .kind = OPT_INT, .arg = "N", .min = 1,
     .max = 1 << 20, .def = "64",
     .help = "text: the validation loss is the mean over N windows of the model's context, "
             "evenly spaced over the held-out part"},
    {.id = O_VAL, .name = "val", .kind = OPT_INT, .arg = "N", .min = 0, .max = INT_MAX,
     .help = "hold out the last N training samples for validation"},
    {.id = O_TRAIN_N, .name = "train-samples", .kind = OPT_INT, .arg = "N", .min = 1,
     .max = INT_MAX, .help = "use only the first N training samples (after --val); without --val only "
             "they are read"},
    {.id = O_TEST_N, .name = "test-samples", .kind = OPT_INT, .arg = "N", .min = 0,
     .max = INT_MAX, .help = "evaluate on the first N test samples (0: skip the test set)"},
    {.id = O_LOAD, .name = "load", .kind = OPT_TEXT, .arg = "FILE",
     .help = "start from a safetensors checkpoint"},
    {.id = O_SAVE, .name = "save", .kind = OPT_TEXT, .arg = "FILE",
     .help = "write the final parameters as safetensors"},
    {.id = O_CKPT_DIR, .name = "checkpoint-dir", .kind = OPT_TEXT, .arg = "DIR",
     .help = "write checkpoints to resume from here (parameters, optimizer state, step)"},
    {.id = O_CKPT_EVERY, .name = "checkpoint-every", .kind = OPT_INT, .arg = "N", .min = 0,
     .max = 1000000000, .def = "0", .help = "a checkpoint every N steps (0: by time only)"},
    {.id = O_CKPT_MIN, .name = "checkpoint-minutes", .kind = OPT_REAL, .arg = "X", .min = 0,
     .max = 1e6, .help = "a checkpoint when X minutes have passed since the last (default "
     "10 with --checkpoint-dir and no --checkpoint-every; 0: by steps only)"},
    {.id = O_CKPT_WRITE, .name = "checkpoint-write", .kind = OPT_CHOICE,
     .choices = "background|sync", .def = "background",
     .help = "write checkpoints from a snapshot while training goes on, or hold it"},
    {.id = O_KEEP, .name = "keep", .kind = OPT_INT, .arg = "K", .min = 1, .max = 1000000,
     .def = "2",
     .help = "checkpoints kept in --checkpoint-dir (this run's newest K; other runs' are never "
             "deleted)"},
    {.id = O_RESUME, .name = "resume", .kind = OPT_TEXT, .arg = "DIR|FILE",
     .help = "continue from the newest complete checkpoint there, in any layout"},
    {.section = "training"},
    {.id = O_EPOCHS, .name = "epochs", .kind = OPT_INT, .arg = "N", .min = 1, .max = INT_MAX,
     .def = "1", .help = "passes over the training set"},
    {.id = O_STEPS, .name = "steps", .kind = OPT_INT, .arg = "N", .min = 1, .max = BIG,
     .help = "run N optimizer steps, crossing epochs; with --epochs, stop at whichever "
             "limit comes first"},
    {.id = O_UNTIMED, .name = "untimed-steps", .kind = OPT_INT, .arg = "N", .min = 0,
     .max = BIG, .def = "0", .help = "leave this process's first N steps out of the speed, "
     "bubble and per-stage time figures (they still train)"},
    {.id = O_BATCH, .name = "batch", .shared = 1},
    {.id = O_OPT, .name = "optimizer", .kind = OPT_CHOICE,
     .choices = "sgd|momentum|adam|adamw", .def = "adam",
     .help = "the update rule, as torch.optim's SGD, SGD(momentum), Adam and AdamW"},
    {.id = O_LR, .name = "lr", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1e6,
     .def = "0.001", .help = "learning rate (the peak of --lr-schedule)"},
    {.id = O_LR_SCHED, .name = "lr-schedule", .kind = OPT_CHOICE,
     .choices = "constant|cosine|linear", .def = "constant",
     .help = "the learning rate of update s (from 0) of a run of N updates: "
             "lr*(s+1)/W while s < W (--lr-warmup), then with p = (s-W)/max(1,N-W) clamped "
             "to [0,1]: constant: lr; cosine: min + 0.5*(1+cos(pi*p))*(lr-min); linear: "
             "lr - p*(lr-min) (min: --lr-min); in double, rounded to float once; every rank "
             "computes it, a resumed run continues it"},
    {.id = O_LR_WARMUP, .name = "lr-warmup", .kind = OPT_INT, .arg = "W", .min = 0,
     .max = BIG, .def = "0", .help = "steps of linear learning-rate warm-up (at most the run's "
                                     "steps)"},
    {.id = O_LR_MIN, .name = "lr-min", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1e6,
     .def = "0", .help = "the floor cosine and linear decay to (at most --lr)"},
    {.id = O_MOM, .name = "momentum", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1,
     .def = "0.9", .help = "for --optimizer momentum"},
    {.id = O_BETA1, .name = "beta1", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1,
     .def = "0.9", .help = "adam, adamw: decay of the first moment (below 1)"},
    {.id = O_BETA2, .name = "beta2", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1,
     .def = "0.999", .help = "adam, adamw: decay of the second moment (below 1)"},
    {.id = O_EPS, .name = "eps", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1,
     .def = "1e-8", .help = "adam, adamw: added to the denominator"},
    {.id = O_WD, .name = "weight-decay", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1e6,
     .help = "sgd, momentum, adam: L2 penalty added to the gradient (default 0); adamw: "
             "decoupled decay p*(1 - lr*X) of the weight matrices only (dense, conv, "
             "transformer blocks, an untied lm_head; not biases, norms or embeddings), "
             "default 0.01 as torch's"},
    {.id = O_CLIP, .name = "clip-grad-norm", .kind = OPT_REAL, .arg = "X", .min = 0,
     .max = 1e9, .help = "scale the step's gradient to a global L2 norm of at most X "
                         "(torch.nn.utils.clip_grad_norm_ over the whole model, every stage, "
                         "shard and replica) before the update"},
    {.id = O_POSTVAL, .name = "post-validation", .kind = OPT_FLAG,
     .help = "each rank steps as soon as its gradients are done, before the whole model's "
             "norm arrives, and the step is rolled back and taken again, bit for bit as "
             "without this, where the norm says it must be clipped; a non-finite norm rolls "
             "it back and stops the run (ZB-H2's optimizer post-validation; costs a copy "
             "of the parameters, moments and gradients per step)"},
    {.id = O_SEED, .name = "seed", .kind = OPT_INT, .arg = "N", .min = 0, .max = BIG,
     .def = "0", .help = "initialisation, shuffling and dropout"},
    {.id = O_SHUFFLE, .name = "shuffle", .kind = OPT_CHOICE, .choices = "on|off", .def = "on",
     .help = "off: batches in file order"},
    {.section = "parallelism"},
    {.id = O_STAGES, .name = "stages", .shared = 1},
    {.id = O_MICRO, .name = "microbatches", .shared = 1},
    {.id = O_SCHED, .name = "schedule", .shared = 1},
    {.id = O_SCHED_FILE, .name = "schedule-file", .shared = 1},
    {.id = O_SCHED_MEM, .name = "schedule-memory", .shared = 1},
    {.id = O_VIRTUAL, .name = "virtual", .shared = 1},
    {.id = O_RECOMPUTE, .name = "recompute", .shared = 1},
    {.id = O_WGRAD, .name = "wgrad", .shared = 1},
    {.id = O_PART, .name = "partition", .shared = 1},
    {.id = O_REPLICAS, .name = "replicas", .shared = 1},
    {.id = O_REDUCE, .name = "reduce", .shared = 1},
    {.id = O_TENSOR, .name = "tensor", .shared = 1},
    {.id = O_TENSOR_MODE, .name = "tensor-mode", .shared = 1},
    {.id = O_SEQPAR, .name = "sequence-parallel", .kind = OPT_FLAG,
     .help = "a language model under --tensor T >= 2 (megatron): the activations between "
             "layers cut along the sequence over the tensor group (each rank T/Tp "
             "positions; the layer norms, residuals and biases on them, all-gathers and "
             "reduce-scatters in place of the all-reduces; stages send slices)"},
    {.id = O_BUCKET_MB, .name = "bucket-mb", .shared = 1},
    {.id = O_OVERLAP, .name = "overlap", .shared = 1},
    {.id = O_ZERO, .name = "zero", .shared = 1},
    {.id = O_ZERO3_PREFETCH, .name = "zero3-prefetch", .shared = 1},
    {.id = O_ZERO_OVERLAP, .name = "zero-overlap", .shared = 1},
    {.id = O_THREADS, .name = "threads", .kind = OPT_INT, .arg = "N", .min = 1, .max = 1024,
     .help = "worker threads per rank (default: the node's cores / its ranks)"},
    {.id = O_BIND, .name = "bind", .kind = OPT_CHOICE, .choices = "auto|core|none",
     .def = "none", .help = "pin each rank to its cores"},
    {.id = O_WAIT, .name = "wait", .kind = OPT_CHOICE, .choices = "auto|spin|sleep",
     .def = "auto", .help = "between tests of a pending message or reduction: yield the "
                            "core (spin) or sleep 50 us (sleep, for more ranks than cores); "
                            "auto: spin unless a node's ranks × threads outnumber its cores"},
    {.id = O_DEVICE, .name = "device", .shared = 1},
    {.id = O_PRECISION, .name = "precision", .shared = 1},
    {.id = O_TIMEOUT, .name = "timeout", .kind = OPT_REAL, .arg = "S", .min = 0.001,
     .max = 1e9, .def = "300", .help = "give up when a rank waits longer than S seconds"},
    {.section = "output"},
    {.id = O_TRACE, .name = "trace", .kind = OPT_TEXT, .arg = "FILE",
     .help = "Chrome trace JSON of every rank's events (Perfetto)"},
    {.id = O_JSON, .name = "json", .shared = 1},
    {.id = O_METRICS, .name = "metrics", .kind = OPT_TEXT, .arg = "FILE",
     .help = "JSON Lines: the run, then a line every --log-every steps and per epoch"},
    {.id = O_LOG_EVERY, .name = "log-every", .kind = OPT_INT, .arg = "N", .min = 1,
     .max = 1000000000, .def = "10", .help = "steps between the metrics file's step lines"},
    {.id = O_PROGRESS, .name = "progress", .kind = OPT_REAL, .arg = "S", .min = 0, .max = 1e9,
     .def = "5", .help = "when stdout is no terminal, a progress line every S seconds (0: none)"},
    {.id = O_VERBOSE, .name = "verbose", .kind = OPT_FLAG,
     .help = "more detail (binding of every rank)"},
    {.id = O_HELP, .name = "help", .shared = 1},
    /* the old name of --untimed-steps (read as learning-rate warm-up): one more release */
    {.id = O_WARMUP, .name = "warmup", .kind = OPT_INT, .arg = "N", .min = 0, .max = BIG},
    /* the faults the tests inject: in the help, so that nobody meets them unawares */
    {.section = "testing only (faults the test suite injects; never for a real run)"},
    {.id = O_STALL, .name = "debug-stall", .kind = OPT_TEXT, .arg = "RANK:STEP",
     .help = "rank RANK stops responding at step STEP"},
    {.id = O_KILL, .name = "debug-kill", .kind = OPT_TEXT, .arg = "RANK:STEP",
     .help = "rank RANK kills itself (SIGKILL) at step STEP; PT_TEST_KILL_BEFORE_RENAME=FILE "
             "kills the writer of a checkpoint once before its rename; PT_TEST_FAULT_ONCE=FILE: "
             "a --debug-* fault fires only while FILE exists, and removes it"},
    {.id = O_MPI_ERROR, .name = "debug-mpi-error", .kind = OPT_TEXT, .arg = "RANK:STEP",
     .help = "rank RANK makes an invalid MPI call at step STEP"},
    {.id = O_DELAY, .name = "debug-delay-sends", .kind = OPT_INT, .arg = "POLLS", .min = 0,
     .max = 1000000, .help = "outgoing messages become ready POLLS polls late"},
    {.id = O_SKIP_BUCKET, .name = "debug-skip-bucket", .kind = OPT_INT, .arg = "B", .min = 0,
     .max = INT_MAX, .help = "gradient bucket B is left out of the reductions (with --zero 3: its layers' "
             "parameters are never gathered instead)"},
    {0},
};

static const opt_command train_command = {
    .name = "train",
    .usage = "pipetrain train --model FILE [options]\n"
             "mpiexec -n K pipetrain train --model FILE --stages K [options]\n"
             "mpiexec -n K*R pipetrain train --model FILE --stages K --replicas R ...",
    .about = "Trains a model on Fashion-MNIST or the user's own IDX files (a language model on "
             "text: --data " TEXT_DATA_NAME ", --text or --tokens), sequentially, as a pipeline "
             "of K stages, or as R data-parallel replicas of that pipeline.",
    .notes = "Data files are IDX, gzip or plain. Images are unsigned bytes, N×H×W (IDX3, magic "
             "0x00000803, one channel) or N×C×H×W (IDX4, magic 0x00000804), of the shape the "
             "model's input=C,H,W names; pixels are divided by 255. Labels are IDX1 (magic "
             "0x00000801), each below the model's classes.\n\n"
             "A language model ([embedding] ... [lm_head]) trains on windows of its context T "
             "drawn from the corpus at random offsets (the same in every layout, from --seed "
             "and the step), predicting the next token at each position; an epoch is as many "
             "tokens as the training part holds. Every token must be below the model's vocab. "
             "The validation loss is per token, with bits per byte for text (loss / ln 2) and "
             "the perplexity for token files; accuracy is next-token accuracy.\n\n"
             "With --json the last line of stdout is one JSON object of results. With --device "
             "cuda each rank takes a GPU by its local rank (several ranks may share one). "
             "Tensor shard t of stage s in replica r is MPI rank t + T*(s*R + r) (a stage's "
             "shards, then its replicas, on consecutive ranks; --bind auto keeps this "
             "numbering); --batch is the whole "
             "job's batch, of which each replica takes batch/R samples in M micro-batches.",
    .opts = train_opts,
};

void train_options_usage(FILE *f) { opt_print_help(&train_command, f); }

/* --debug-stall, --debug-kill, --debug-mpi-error RANK:STEP: the fault a test injects. */
static int read_fault(train_options *o, const opt_parser *p, int id)
{
    if (sscanf(p->arg, "%d:%ld", &o->stall_rank, &o->stall_step) != 2)
        return opt_error(p, "%s %s: expected RANK:STEP", p->name, p->arg);
    o->kill = id == O_KILL        ? EXEC_STALL_KILL
              : id == O_MPI_ERROR ? EXEC_STALL_MPI_ERROR
                                  : EXEC_STALL_HANG;
    return 0;
}

/* Option id, the parser's current one, into o; in the order of the table's sections.
 * −1 with a message for a value the table cannot check. */
/* The output and testing options (read_option's other cases). */
static int read_output_option(train_options *o, const opt_parser *p, int id)
{
    switch (id) {
    case O_TRACE: o->trace = p->arg; break;
    case O_JSON: o->json = 1; break;
    case O_METRICS: o->metrics = p->arg; break;
    case O_LOG_EVERY: o->log_every = (long)p->num; break;
    case O_PROGRESS: o->progress = p->real; break;
    case O_VERBOSE: o->verbose = 1; break;
    case O_STALL:
    case O_KILL:
    case O_MPI_ERROR: return read_fault(o, p, id);
    case O_DELAY: o->ready_delay = (int)p->num; break;
    case O_SKIP_BUCKET: o->skip_bucket = (int)p->num; break;
    }
    return 0;
}

static int read_option(train_options *o, const opt_parser *p, int id)
{
    static const optimizer_kind optimizers[] = {OPTIM_SGD, OPTIM_MOMENTUM, OPTIM_ADAM,
                                                OPTIM_ADAMW};
    static const lr_schedule_kind schedules[] = {LR_CONSTANT, LR_COSINE, LR_LINEAR};
    static const char *const binds[] = {"auto", "core", "none"};
    static const reduce_method methods[] = {REDUCE_ALLREDUCE, REDUCE_REDUCE_BCAST,
                                            REDUCE_GATHER_BCAST, REDUCE_ORDERED};
    switch (id) {
    /* data and model */
    case O_MODEL: o->model = p->arg; break;
    case O_DATA: o->data = p->arg; break;
    case O_TRAIN_IMG: o->train_images = p->arg; break;
    case O_TRAIN_LAB: o->train_labels = p->arg; break;
    case O_TEST_IMG: o->test_images = p->arg; break;
    case O_TEST_LAB: o->test_labels = p->arg; break;
    case O_TEXT:
    case O_TOKENS:
    case O_TOKENS_RAW:
        o->text = id == O_TEXT ? TEXT_UTF8 : id == O_TOKENS ? TEXT_LLMC : TEXT_RAW;
        o->text_file = p->arg;
        break;
    case O_VAL_FRACTION: o->val_fraction = p->real; break;
    case O_EVAL_WINDOWS: o->eval_windows = (int)p->num; break;
    case O_VAL: o->val = (int)p->num; break;
    case O_TRAIN_N: o->train_samples = p->num; break;
    case O_TEST_N: o->test_samples = p->num; break;
    case O_LOAD: o->load = p->arg; break;
    case O_SAVE: o->save = p->arg; break;
    case O_CKPT_DIR: o->ckpt_dir = p->arg; break;
    case O_CKPT_EVERY: o->ckpt_every = p->num; break;
    case O_CKPT_MIN: o->ckpt_minutes = p->real; break;
    case O_CKPT_WRITE: o->ckpt_sync = p->choice == 1; break;
    case O_KEEP: o->keep = (int)p->num; break;
    case O_RESUME: o->resume = p->arg; break;
    /* training */
    case O_EPOCHS: o->epochs = (int)p->num; break;
    case O_STEPS: o->steps = p->num; break;
    case O_UNTIMED: o->untimed_steps = p->num; break;
    case O_WARMUP:
        o->untimed_steps = p->num;
        o->warmup_alias = 1;
        break;
    case O_BATCH: o->batch = (int)p->num; break;
    case O_OPT: o->opt.kind = optimizers[p->choice]; break;
    case O_LR:
        o->opt.lr = (float)p->real;
        o->lr_sched.lr = p->real; /* the decimal as written: the schedule works in double */
        break;
    case O_LR_SCHED: o->lr_sched.kind = schedules[p->choice]; break;
    case O_LR_WARMUP: o->lr_sched.warmup = p->num; break;
    case O_LR_MIN: o->lr_sched.lr_min = p->real; break;
    case O_MOM: o->opt.momentum = (float)p->real; break;
    case O_BETA1: o->opt.beta1 = (float)p->real; break;
    case O_BETA2: o->opt.beta2 = (float)p->real; break;
    case O_EPS: o->opt.eps = (float)p->real; break;
    case O_WD: o->opt.weight_decay = (float)p->real; break;
    case O_CLIP: o->opt.clip_norm = (float)p->real; break;
    case O_POSTVAL: o->post_validation = 1; break;
    case O_SEED: o->seed = (unsigned long long)p->num; break;
    case O_SHUFFLE: o->shuffle = p->choice == 0; break;
    /* parallelism */
    case O_STAGES: o->stages = (int)p->num; break;
    case O_MICRO: o->microbatches = (int)p->num; break;
    case O_SCHED: o->schedule = p->arg; break;
    case O_VIRTUAL: o->virtual_stages = (int)p->num; break;
    case O_SCHED_FILE: o->schedule_file = p->arg; break;
    case O_SCHED_MEM: o->schedule_memory = p->real; break;
    case O_RECOMPUTE: o->recompute = p->arg; break;
    case O_WGRAD: o->wgrad_batched = p->choice == 1; break;
    case O_PART: o->partition = p->arg; break;
    case O_REPLICAS: o->replicas = (int)p->num; break;
    case O_REDUCE: o->reduce = methods[p->choice]; break;
    case O_TENSOR: o->tensor = (int)p->num; break;
    case O_TENSOR_MODE: o->tensor_mode = p->choice == 1 ? TENSOR_GATHER : TENSOR_MEGATRON; break;
    case O_SEQPAR: o->sequence_parallel = 1; break;
    case O_BUCKET_MB: o->bucket_mb = p->real; break;
    case O_OVERLAP: o->overlap = p->choice == 0; break;
    case O_ZERO: o->zero = (int)p->num; break;
    case O_ZERO3_PREFETCH: o->zero3_prefetch = p->choice == 0; break;
    case O_ZERO_OVERLAP: o->zero_overlap = p->choice == 0; break;
    case O_THREADS: o->threads = (int)p->num; break;
    case O_BIND: o->bind = binds[p->choice]; break;
    case O_WAIT: o->wait = (mpi_wait_mode)p->choice; break;
    case O_DEVICE: o->device = (engine_device)p->choice; break; /* the enums' order */
    case O_PRECISION: o->precision = (engine_precision)p->choice; break;
    case O_TIMEOUT: o->timeout = p->real; break;
    default: return read_output_option(o, p, id);
    }
    return 0;
}

/* Data files by name: images and labels in pairs, each pair instead of --data. */
static int check_data_files(const train_options *o, const opt_parser *p)
{
    const char *files[2][2] = {{o->train_images, o->train_labels},
                               {o->test_images, o->test_labels}};
    static const char *const names[2][2] = {{"--train-images", "--train-labels"},
                                            {"--test-images", "--test-labels"}};
    for (int s = 0; s < 2; s++) {
        if (!files[s][0] != !files[s][1]) {
            int g = files[s][0] ? 0 : 1;
            return opt_error(p, "%s %s needs %s FILE too", names[s][g], files[s][g],
                             names[s][!g]);
        }
        if (files[s][0] && opt_given(p, O_DATA))
            return opt_error(p, "%s and --data %s both name the %s data: give one", names[s][0],
                             o->data, s ? "test" : "training");
    }
    return 0;
}

/* The optimizer's and the schedule's rules beyond the table's ranges; AdamW's default decay
 * (torch's 0.01). The warm-up against the run's length is checked once that is known
 * (train.c). */
static int check_optimizer(train_options *o, const opt_parser *p)
{
    if (o->opt.kind == OPTIM_ADAMW && !opt_given(p, O_WD)) o->opt.weight_decay = 0.01f;
    if (!(o->opt.beta1 < 1) || !(o->opt.beta2 < 1))
        return opt_error(p, "--beta1 %g, --beta2 %g: each must be below 1", (double)o->opt.beta1,
                         (double)o->opt.beta2);
    if (opt_given(p, O_CLIP) && !(o->opt.clip_norm > 0))
        return opt_error(p, "--clip-grad-norm %g: the largest norm must be positive",
                         (double)o->opt.clip_norm);
    if (opt_given(p, O_LR_MIN) && o->lr_sched.kind == LR_CONSTANT)
        return opt_error(p, "--lr-min is the floor of --lr-schedule cosine or linear, not of "
                         "constant");
    if (o->lr_sched.lr_min > o->lr_sched.lr)
        return opt_error(p, "--lr-min %g is above --lr %g: the schedule decays from --lr to it",
                         o->lr_sched.lr_min, o->lr_sched.lr);
    return 0;
}

/* A language model's text: one source, instead of --data's images; the options of image
 * data sets have no meaning for it, and its own none for images. */
static int check_text_options(train_options *o, const opt_parser *p)
{
    static const int sources[] = {O_TEXT, O_TOKENS, O_TOKENS_RAW};
    static const char *const names[] = {"--text", "--tokens", "--tokens-raw"};
    int given = 0, first = -1;
    for (int k = 0; k < 3; k++)
        if (opt_given(p, sources[k]) && (given++, first < 0)) first = k;
    if (given > 1)
        return opt_error(p, "%s and another of --text, --tokens and --tokens-raw: give one "
                         "corpus", names[first]);
    int fortunes = !strcmp(o->data, TEXT_DATA_NAME);
    o->data_given = opt_given(p, O_DATA);
    if (given && opt_given(p, O_DATA))
        return opt_error(p, "%s and --data %s both name the data: give one", names[first],
                         o->data);
    if (fortunes) o->text = TEXT_FORTUNES;
    const char *what = given ? names[first] : "--data " TEXT_DATA_NAME;
    static const int image_only[] = {O_TRAIN_IMG, O_TRAIN_LAB, O_TEST_IMG, O_TEST_LAB, O_VAL,
                                     O_TRAIN_N, O_TEST_N, O_SHUFFLE};
    static const char *const image_names[] = {
        "--train-images", "--train-labels", "--test-images", "--test-labels", "--val",
        "--train-samples", "--test-samples", "--shuffle"};
    static const char *const why[] = {
        "", "", "", "", " (a text corpus holds out its tail: --val-fraction)", "", "",
        " (text windows are drawn at random offsets every step)"};
    for (int k = 0; o->text && k < (int)(sizeof image_only / sizeof *image_only); k++)
        if (opt_given(p, image_only[k]))
            return opt_error(p, "%s is for image data sets, not with %s%s", image_names[k],
                             what, why[k]);
    if (o->text || !(opt_given(p, O_VAL_FRACTION) || opt_given(p, O_EVAL_WINDOWS))) return 0;
    o->text_option = opt_given(p, O_VAL_FRACTION) ? "val-fraction" : "eval-windows";
    /* with no data option at all, a language model reads the built-in corpus: known only
     * once the model is read (train_setup) */
    for (int k = 0; k < (int)(sizeof image_only / sizeof *image_only); k++)
        if (opt_given(p, image_only[k]) || opt_given(p, O_DATA))
            return opt_error(p, "--%s is for a text corpus (--data " TEXT_DATA_NAME ", --text, "
                             "--tokens)", o->text_option);
    return 0;
}

/* --zero S: shards inside a stage's replica group, of the methods whose every replica holds
 * the sum of its shard (reduce-bcast and gather-bcast give the sum to one rank, which
 * steps alone: nothing to shard). */
static int check_zero(const train_options *o, const opt_parser *p)
{
    if (opt_check_zero_choices(p, o->zero, O_ZERO3_PREFETCH, O_ZERO_OVERLAP, "run")) return -1;
    if (!o->zero) return 0;
    if (o->replicas < 2)
        return opt_error(p, "--zero %d shards the state across a stage's replicas: it needs "
                         "--replicas 2 or more", o->zero);
    if (o->reduce == REDUCE_REDUCE_BCAST || o->reduce == REDUCE_GATHER_BCAST)
        return opt_error(p, "--zero %d with --reduce %s: that method sums on the group's "
                         "first rank, which steps alone; ZeRO needs every replica to hold its "
                         "shard's sum (--reduce ordered or allreduce)", o->zero,
                         reduce_method_name(o->reduce));
    return 0;
}

/* --precision tf32|bf16 on the CPU: bf16 products through oneDNN where the CPU has
 * AVX512_BF16 (kernels/bf16.h); no CPU has a TF32 unit. */
static int check_precision(const train_options *o, const opt_parser *p)
{
    if (o->precision == ENGINE_FP32 || o->device == ENGINE_CUDA) return 0;
    if (o->precision == ENGINE_TF32)
        return opt_error(p, "--precision tf32 is for --device cuda: a CPU has no TF32 unit "
                         "(--precision fp32 or bf16)");
    if (!kernel_bf16_available()) return opt_error(p, "%s", pt_error_get());
    return 0;
}

static int check_schedule(train_options *o, const opt_parser *p);

/* What the table cannot check: options that need others, and the batch's split. Sets the
 * defaults that depend on other options. */
static int check_options(train_options *o, const opt_parser *p)
{
    o->epochs_given = opt_given(p, O_EPOCHS);
    if (check_text_options(o, p) || check_data_files(o, p) || check_optimizer(o, p))
        return -1;
    if (!(o->bucket_mb > 0))
        return opt_error(p, "--bucket-mb %g: must be positive", o->bucket_mb);
    if (o->sequence_parallel && o->tensor < 2)
        return opt_error(p, "--sequence-parallel cuts the sequence across a tensor group: "
                         "it needs --tensor 2 or more");
    if (o->sequence_parallel && o->tensor_mode == TENSOR_GATHER)
        return opt_error(p, "--sequence-parallel is Megatron's cut (blocks by heads): not "
                         "with --tensor-mode gather");
    if (o->sequence_parallel) o->tensor_mode = TENSOR_SEQUENCE;
    if (o->ckpt_every > 0 && !o->ckpt_dir)
        return opt_error(p, "--checkpoint-every needs --checkpoint-dir DIR");
    if (opt_given(p, O_CKPT_MIN) && !o->ckpt_dir)
        return opt_error(p, "--checkpoint-minutes needs --checkpoint-dir DIR");
    if (o->ckpt_dir && !opt_given(p, O_CKPT_MIN) && o->ckpt_every == 0)
        o->ckpt_minutes = 10;
    if (o->resume && o->load)
        return opt_error(p, "--resume and --load both set the parameters: give one");
    if (check_zero(o, p) || check_precision(o, p)) return -1;
    if (o->post_validation && o->zero)
        return opt_error(p, "--post-validation with --zero %d: the optimizer's state is "
                         "sharded across the replicas, and rolling a step back is written for "
                         "whole state only (use --zero 0)", o->zero);
    if (o->replicas > 1 && o->batch % ((long)o->replicas * o->microbatches))
        return opt_error(p, "--batch %d is not divisible by --replicas %d × --microbatches %d "
                         "= %ld: each replica takes batch/replicas samples in micro-batches of "
                         "equal size", o->batch, o->replicas, o->microbatches,
                         (long)o->replicas * o->microbatches);
    if (o->batch % o->microbatches)
        return opt_error(p, "--microbatches %d does not divide --batch %d", o->microbatches,
                         o->batch);
    return check_schedule(o, p);
}

/* The line of FILE's header ("schedule NAME stages ..."), for messages about it. */
static int header_line(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[512];
    int line = 0, found = 0;
    while (f && !found && fgets(buf, sizeof buf, f)) {
        line++;
        found = !strncmp(buf, "schedule ", 9);
    }
    if (f) fclose(f);
    return found ? line : 1;
}

/* --schedule-file: read and verified now; its stages, micro-batches and reductions must be
 * this run's (train adds the replicas' reductions itself). */
static int check_schedule_file(train_options *o, const opt_parser *p)
{
    if (opt_given(p, O_SCHED) || opt_given(p, O_VIRTUAL) || strcmp(o->recompute, "none"))
        return opt_error(p, "--schedule-file %s holds the whole schedule (its chunks per rank "
                         "and recomputation): not with --schedule, --virtual or --recompute",
                         o->schedule_file);
    schedule s;
    if (schedule_read(&s, o->schedule_file)) {
        char why[768];
        snprintf(why, sizeof why, "%s", pt_error_get());
        return opt_error(p, "--schedule-file: %s", why);
    }
    int bad = s.stages != o->stages || s.microbatches != o->microbatches, buckets = 0;
    for (int k = 0; k < s.stages; k++) buckets |= s.lists[k].buckets;
    int line = header_line(o->schedule_file);
    int rc = 0;
    if (bad)
        rc = opt_error(p, "--schedule-file %s line %d: a schedule of %d stages and %d "
                       "micro-batches; this run has --stages %d --microbatches %d",
                       o->schedule_file, line, s.stages, s.microbatches, o->stages,
                       o->microbatches);
    else if (buckets)
        rc = opt_error(p, "--schedule-file %s: its lists reduce gradients (a 'list' line with "
                       "buckets); train adds the replicas' reductions itself: save the "
                       "schedule without --buckets", o->schedule_file);
    o->virtual_stages = s.virtual_stages;
    schedule_free(&s);
    return rc;
}

static int check_schedule(train_options *o, const opt_parser *p)
{
    if (o->schedule_file) return check_schedule_file(o, p);
    int search = !strcmp(o->schedule, "search");
    if (o->schedule_memory > 0 && !search)
        return opt_error(p, "--schedule-memory is the limit of --schedule search");
    /* the search runs once the layers are profiled (train_setup.c) */
    if (search) return 0;
    /* 1 is --virtual's default, which the V schedules read as their 2: given, it is refused */
    if (schedule_is_v(o->schedule) && opt_given(p, O_VIRTUAL) && o->virtual_stages == 1)
        return opt_error(p, "schedule %s places model chunks in a V (down the ranks and "
                         "back): it needs an even number of chunks per rank (2 unless "
                         "--virtual says), not --virtual 1", o->schedule);
    /* the schedule's own rules (--virtual needs interleaved, which needs 2 stages and
     * micro-batches in multiples of them) before anything is cut, profiled or allocated */
    schedule s;
    if (schedule_init_named(&s, o->schedule, o->stages, o->virtual_stages, o->microbatches)) {
        char why[512];
        snprintf(why, sizeof why, "%s", pt_error_get());
        return opt_error(p, "%s", why);
    }
    /* a V schedule's chunks per rank (2 unless --virtual says) cut the partition */
    o->virtual_stages = s.virtual_stages;
    schedule_free(&s);
    return 0;
}

int train_options_parse(train_options *o, int argc, char **argv)
{
    /* what no option sets; everything else comes from the table's defaults */
    *o = (train_options){
        .steps = -1, .train_samples = -1, .test_samples = -1,
        .opt = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
        .lr_sched = {.kind = LR_CONSTANT, .lr = 0.001},
        .stall_rank = -1, .stall_step = -1, .skip_bucket = -1, .tensor = 1,
    };
    opt_parser p;
    if (opt_parser_init(&p, &train_command, argc, argv)) return -1;
    int id;
    while ((id = opt_next(&p)) > 0) {
        if (id == O_HELP) return 1;
        if (read_option(o, &p, id)) return -1;
    }
    if (id == OPT_ERROR) return -1;
    return check_options(o, &p);
}

/* Where a write to `path` lands: its directory's real path and its last component (a link
 * there is replaced, never followed: src/base/output.h). −1 when the directory does not
 * resolve (train_setup's check_outputs has then said why). */
static int output_place(const char *path, char *out, size_t size)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? path + (slash - dir) + 1 : path;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    char *real = realpath(dir, NULL);
    if (!real) return -1;
    snprintf(out, size, "%s/%s", strcmp(real, "/") ? real : "", base);
    free(real);
    return 0;
}

/* Two outputs naming one file would overwrite each other, and an output over an input (the
 * model file, the corpus, the images, the schedule) would destroy it when the run ends.
 * --save over --load is allowed: the parameters are read at the start. */
/* Whether a write landing at `place` (output_place) is one of --checkpoint-dir's own files:
 * a checkpoint's name (--save there replaced the step's checkpoint with a file --resume
 * refuses) or a .pipetrain-* record (the lock, launch's status). */
static int names_checkpoint_file(const train_options *o, const char *place)
{
    char *real = o->ckpt_dir && *o->ckpt_dir ? realpath(o->ckpt_dir, NULL) : NULL;
    if (!real) return 0;
    const char *dir = strcmp(real, "/") ? real : "";
    size_t n = strlen(dir);
    const char *base = place + n + 1;
    int own = !strncmp(place, dir, n) && place[n] == '/' && !strchr(base, '/') &&
              (ckpt_dir_name_step(base) >= 0 || !strncmp(base, ".pipetrain-", 11));
    free(real);
    return own;
}

int train_options_check_clashes(const train_options *o)
{
    const char *outs[] = {o->save, o->trace, o->metrics};
    const char *out_names[] = {"--save", "--trace", "--metrics"};
    const char *ins[] = {o->model, o->text_file, o->schedule_file, o->train_images,
                         o->train_labels, o->test_images, o->test_labels};
    const char *in_names[] = {"model", "corpus", "schedule", "training images",
                              "training labels", "test images", "test labels"};
    char place[3][4200];
    for (int i = 0; i < 3; i++) {
        if (!outs[i] || output_place(outs[i], place[i], sizeof place[i])) {
            place[i][0] = '\0';
            continue;
        }
        if (names_checkpoint_file(o, place[i]))
            return pt_error_set("%s %s: a file of --checkpoint-dir %s (its checkpoints and "
                                ".pipetrain-* records): give another name", out_names[i],
                                outs[i], o->ckpt_dir);
        for (int j = 0; j < i; j++)
            if (place[j][0] && !strcmp(place[i], place[j]))
                return pt_error_set("%s %s and %s %s name the same file: one would overwrite "
                                    "the other", out_names[j], outs[j], out_names[i], outs[i]);
        struct stat os, is;
        if (lstat(outs[i], &os) != 0 || !S_ISREG(os.st_mode)) continue;
        for (int k = 0; k < 7; k++)
            if (ins[k] && stat(ins[k], &is) == 0 && is.st_dev == os.st_dev &&
                is.st_ino == os.st_ino)
                return pt_error_set("%s %s is the %s file %s: writing it would destroy that "
                                    "input", out_names[i], outs[i], in_names[k], ins[k]);
    }
    return 0;
}
