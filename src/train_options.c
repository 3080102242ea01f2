/* Options of `pipetrain train` (src/train_options.h). */
#include "src/train_options.h"

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "src/base/error.h"
#include "src/exec.h"
#include "src/options.h"

void train_options_usage(FILE *f)
{
    fprintf(f,
        "usage: pipetrain train --model FILE [options]\n"
        "       mpiexec -n K pipetrain train --model FILE --stages K [options]\n"
        "\n"
        "data and model\n"
        "  --model FILE          model file (INI), e.g. models/seed-cnn.cfg\n"
        "  --data DIR            IDX files, .gz or not (default " DEFAULT_DATA_DIR ")\n"
        "  --val N               hold out the last N training samples for validation\n"
        "  --train-samples N     use only the first N training samples (after --val)\n"
        "  --test-samples N      evaluate on the first N test samples (0: skip the test set)\n"
        "  --load FILE           start from a safetensors checkpoint\n"
        "  --save FILE           write the final parameters as safetensors\n"
        "training\n"
        "  --epochs N            passes over the training set (default 1)\n"
        "  --steps N             run N optimizer steps, crossing epochs; with --epochs, stop\n"
        "                        at whichever limit comes first\n"
        "  --warmup N            leave the first N steps out of speed and bubble figures\n"
        "  --batch N             samples per optimizer step (default 128)\n"
        "  --optimizer NAME      sgd | momentum | adam (default adam)\n"
        "  --lr X                learning rate (default 0.001)\n"
        "  --momentum X          for momentum (default 0.9)\n"
        "  --weight-decay X      L2 penalty added to the gradient (default 0)\n"
        "  --seed N              initialisation, shuffling and dropout (default 0)\n"
        "  --shuffle on|off      off: batches in file order (default on)\n"
        "parallelism\n"
        "  --stages K            pipeline stages, one MPI rank each (default 1)\n"
        "  --microbatches M      micro-batches per batch; must divide it (default 1)\n"
        "  --schedule NAME       gpipe | 1f1b (default 1f1b)\n"
        "  --partition METHOD    uniform | params | time | counts like 4,3,4 (default time)\n"
        "  --threads N           worker threads per rank (default: cores / ranks on the node)\n"
        "  --bind MODE           auto | core | none: pin each rank to its cores (default none)\n"
        "  --device NAME         cpu | cuda: where the stages run; with cuda each rank takes a\n"
        "                        GPU by local rank (several ranks may share one) (default cpu)\n"
        "  --timeout S           give up when a rank waits longer than S s (default 300)\n"
        "output\n"
        "  --trace FILE          Chrome trace JSON of every rank's events (Perfetto)\n"
        "  --json                last line of stdout: one JSON object of results\n"
        "  --progress S          when stdout is no terminal, a progress line every S s\n"
        "                        (default 5; 0: none)\n"
        "  --verbose             more detail (binding of every rank)\n"
        "  --help                this text\n");
}

int train_options_parse(train_options *o, int argc, char **argv)
{
    *o = (train_options){
        .data = DEFAULT_DATA_DIR, .schedule = "1f1b", .partition = "time", .bind = "none",
        .epochs = 1, .batch = 128, .stages = 1, .microbatches = 1, .shuffle = 1,
        .steps = -1, .train_samples = -1, .test_samples = -1, .timeout = 300, .progress = 5,
        .opt = {OPT_ADAM, 1e-3f, 0.9f, 0.0f, 0.9f, 0.999f, 1e-8f},
        .stall_rank = -1, .stall_step = -1,
    };
    enum { O_MODEL = 256, O_DATA, O_EPOCHS, O_STEPS, O_BATCH, O_LR, O_OPT, O_MOM, O_WD, O_SEED,
           O_SHUFFLE, O_VAL, O_THREADS, O_LOAD, O_SAVE, O_JSON, O_HELP, O_STAGES, O_MICRO,
           O_SCHED, O_PART, O_TRACE, O_TIMEOUT, O_BIND, O_VERBOSE, O_TRAIN_N, O_TEST_N,
           O_STALL, O_WARMUP, O_KILL, O_DEVICE, O_DELAY, O_PROGRESS, O_MPI_ERROR };
    static const struct option longopts[] = {
        {"model", required_argument, 0, O_MODEL}, {"data", required_argument, 0, O_DATA},
        {"epochs", required_argument, 0, O_EPOCHS}, {"steps", required_argument, 0, O_STEPS},
        {"batch", required_argument, 0, O_BATCH}, {"lr", required_argument, 0, O_LR},
        {"optimizer", required_argument, 0, O_OPT}, {"momentum", required_argument, 0, O_MOM},
        {"weight-decay", required_argument, 0, O_WD}, {"seed", required_argument, 0, O_SEED},
        {"shuffle", required_argument, 0, O_SHUFFLE}, {"val", required_argument, 0, O_VAL},
        {"threads", required_argument, 0, O_THREADS}, {"load", required_argument, 0, O_LOAD},
        {"save", required_argument, 0, O_SAVE}, {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, O_HELP}, {"stages", required_argument, 0, O_STAGES},
        {"microbatches", required_argument, 0, O_MICRO},
        {"schedule", required_argument, 0, O_SCHED},
        {"partition", required_argument, 0, O_PART}, {"trace", required_argument, 0, O_TRACE},
        {"timeout", required_argument, 0, O_TIMEOUT}, {"bind", required_argument, 0, O_BIND},
        {"verbose", no_argument, 0, O_VERBOSE},
        {"train-samples", required_argument, 0, O_TRAIN_N},
        {"test-samples", required_argument, 0, O_TEST_N},
        {"warmup", required_argument, 0, O_WARMUP},
        {"device", required_argument, 0, O_DEVICE},
        {"progress", required_argument, 0, O_PROGRESS},
        {"debug-stall", required_argument, 0, O_STALL}, /* testing: RANK:STEP */
        {"debug-kill", required_argument, 0, O_KILL},   /* testing: RANK:STEP */
        {"debug-delay-sends", required_argument, 0, O_DELAY}, /* testing: POLLS */
        {"debug-mpi-error", required_argument, 0, O_MPI_ERROR}, /* testing: RANK:STEP */
        {0, 0, 0, 0}};
    long v;
    double d;
    optind = 1;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, "", longopts, NULL);
        if (c == -1) break;
        switch (c) {
        case O_MODEL: o->model = optarg; break;
        case O_DATA: o->data = optarg; break;
        case O_LOAD: o->load = optarg; break;
        case O_SAVE: o->save = optarg; break;
        case O_TRACE: o->trace = optarg; break;
        case O_SCHED: o->schedule = optarg; break;
        case O_PART: o->partition = optarg; break;
        case O_JSON: o->json = 1; break;
        case O_VERBOSE: o->verbose = 1; break;
        case O_HELP: return 1;
        case O_DEVICE:
            if (!strcmp(optarg, "cpu")) o->device = ENGINE_CPU;
            else if (!strcmp(optarg, "cuda")) o->device = ENGINE_CUDA;
            else return pt_error_set("--device must be cpu or cuda, not '%s'", optarg);
            break;
        case O_EPOCHS:
            if (opt_parse_long("--epochs", optarg, 1, INT_MAX, &v)) return -1;
            o->epochs = (int)v;
            o->epochs_given = 1;
            break;
        case O_STEPS:
            if (opt_parse_long("--steps", optarg, 1, LONG_MAX, &o->steps)) return -1;
            break;
        case O_WARMUP:
            if (opt_parse_long("--warmup", optarg, 0, LONG_MAX, &o->warmup)) return -1;
            break;
        case O_BATCH:
            if (opt_parse_long("--batch", optarg, 1, 1 << 20, &v)) return -1;
            o->batch = (int)v;
            break;
        case O_STAGES:
            if (opt_parse_long("--stages", optarg, 1, 4096, &v)) return -1;
            o->stages = (int)v;
            break;
        case O_MICRO:
            if (opt_parse_long("--microbatches", optarg, 1, 1 << 20, &v)) return -1;
            o->microbatches = (int)v;
            break;
        case O_THREADS:
            if (opt_parse_long("--threads", optarg, 1, 1024, &v)) return -1;
            o->threads = (int)v;
            break;
        case O_VAL:
            if (opt_parse_long("--val", optarg, 0, INT_MAX, &v)) return -1;
            o->val = (int)v;
            break;
        case O_TRAIN_N:
            if (opt_parse_long("--train-samples", optarg, 1, INT_MAX, &o->train_samples))
                return -1;
            break;
        case O_TEST_N:
            if (opt_parse_long("--test-samples", optarg, 0, INT_MAX, &o->test_samples))
                return -1;
            break;
        case O_SEED:
            if (opt_parse_long("--seed", optarg, 0, LONG_MAX, &v)) return -1;
            o->seed = (unsigned long long)v;
            break;
        case O_LR:
            if (opt_parse_double("--lr", optarg, 0, 1e6, &d)) return -1;
            o->opt.lr = (float)d;
            break;
        case O_MOM:
            if (opt_parse_double("--momentum", optarg, 0, 1, &d)) return -1;
            o->opt.momentum = (float)d;
            break;
        case O_WD:
            if (opt_parse_double("--weight-decay", optarg, 0, 1e6, &d)) return -1;
            o->opt.weight_decay = (float)d;
            break;
        case O_PROGRESS:
            if (opt_parse_double("--progress", optarg, 0, 1e9, &o->progress)) return -1;
            break;
        case O_TIMEOUT:
            if (opt_parse_double("--timeout", optarg, 0.001, 1e9, &o->timeout)) return -1;
            break;
        case O_OPT:
            if (!strcmp(optarg, "sgd")) o->opt.kind = OPT_SGD;
            else if (!strcmp(optarg, "momentum")) o->opt.kind = OPT_MOMENTUM;
            else if (!strcmp(optarg, "adam")) o->opt.kind = OPT_ADAM;
            else return pt_error_set("--optimizer %s: expected sgd, momentum or adam", optarg);
            break;
        case O_SHUFFLE:
            if (!strcmp(optarg, "on")) o->shuffle = 1;
            else if (!strcmp(optarg, "off")) o->shuffle = 0;
            else return pt_error_set("--shuffle %s: expected on or off", optarg);
            break;
        case O_BIND:
            if (strcmp(optarg, "auto") && strcmp(optarg, "core") && strcmp(optarg, "none"))
                return pt_error_set("--bind %s: expected auto, core or none", optarg);
            o->bind = optarg;
            break;
        case O_DELAY:
            if (opt_parse_long("--debug-delay-sends", optarg, 0, 1000000, &v)) return -1;
            o->ready_delay = (int)v;
            break;
        case O_STALL:
        case O_KILL:
        case O_MPI_ERROR:
            if (sscanf(optarg, "%d:%ld", &o->stall_rank, &o->stall_step) != 2)
                return pt_error_set("%s %s: expected RANK:STEP", argv[optind - 2], optarg);
            o->kill = c == O_KILL ? EXEC_STALL_KILL
                      : c == O_MPI_ERROR ? EXEC_STALL_MPI_ERROR : EXEC_STALL_HANG;
            break;
        default:
            return pt_error_set("unknown or incomplete option %s (see pipetrain train --help)",
                                argv[optind - 1]);
        }
    }
    if (optind < argc) return pt_error_set("unexpected argument %s", argv[optind]);
    if (!o->model) return pt_error_set("--model FILE is required (see pipetrain train --help)");
    if (o->batch % o->microbatches)
        return pt_error_set("--microbatches %d does not divide --batch %d", o->microbatches,
                            o->batch);
    return 0;
}

