/* `pipetrain schedule`: a pipeline schedule's instruction lists and timeline, verified. */
#include <stdio.h>

#include "schedule/schedule.h"
#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"

enum { O_STAGES = 1, O_MICRO, O_SCHED, O_BUCKETS, O_OVERLAP, O_VIRTUAL, O_RECOMPUTE, O_SAVE,
       O_LOAD, O_HELP };

static const opt_spec schedule_opts[] = {
    {.id = O_SCHED, .name = "schedule", .shared = 1},
    {.id = O_STAGES, .name = "stages", .shared = 1},
    {.id = O_MICRO, .name = "microbatches", .shared = 1},
    {.id = O_BUCKETS, .name = "buckets", .kind = OPT_INT, .arg = "B", .min = 0, .max = 64,
     .def = "0", .help = "gradient buckets each stage reduces among its data-parallel "
                         "replicas (0: no reductions)"},
    {.id = O_OVERLAP, .name = "overlap", .shared = 1},
    {.id = O_VIRTUAL, .name = "virtual", .shared = 1},
    {.id = O_RECOMPUTE, .name = "recompute", .shared = 1},
    {.id = O_SAVE, .name = "save-schedule", .kind = OPT_TEXT, .arg = "FILE",
     .help = "also write the schedule as text (one line per instruction) to FILE"},
    {.id = O_LOAD, .name = "schedule-file", .kind = OPT_TEXT, .arg = "FILE",
     .help = "read the schedule from FILE (as --save-schedule writes it) instead of "
             "generating one; it is verified, errors name the line"},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command schedule_command = {
    .name = "schedule",
    .usage = "pipetrain schedule --stages K [--microbatches M] [--schedule NAME]\n"
             "pipetrain schedule --stages K ... --schedule interleaved --virtual V\n"
             "pipetrain schedule --stages K ... --buckets B [--overlap on|off]\n"
             "pipetrain schedule --stages K ... --recompute none|all|0,2\n"
             "pipetrain schedule --stages K ... --save-schedule FILE\n"
             "pipetrain schedule --schedule-file FILE",
    .about = "Prints each stage's instruction list and a unit-time timeline of the schedule, "
             "verifies it (no deadlock) and reports the bubble and the peak micro-batches each "
             "stage holds (per chunk with --virtual, and the inputs kept with --recompute).",
    .opts = schedule_opts,
};

/* The verifier's peaks: per stage, and per chunk "a+b" when there are several. */
static void print_peaks(const char *what, const int *per_stage, const int *per_chunk, int K,
                        int V)
{
    printf("%s:", what);
    for (int k = 0; k < K; k++) {
        printf(" %d", per_stage[k]);
        for (int v = 0; v < V && V > 1; v++)
            printf("%s%d%s", v ? "+" : " (", per_chunk[k * V + v], v == V - 1 ? ")" : "");
    }
    printf("\n");
}

/* What the printer can show in a terminal's worth of text. */
enum { SCHEDULE_MAX_STAGES = 256, SCHEDULE_MAX_MICRO = 4096 };

int cmd_schedule(int argc, char **argv)
{
    const char *name = NULL, *recompute = "none", *save = NULL, *load = NULL;
    int stages = 0, micro = 0, buckets = 0, overlap = 1, virt = 1;
    opt_parser p;
    if (opt_parser_init(&p, &schedule_command, argc, argv)) return cli_usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        switch (id) {
        case O_SCHED: name = p.arg; break;
        case O_STAGES: stages = (int)p.num; break;
        case O_MICRO: micro = (int)p.num; break;
        case O_BUCKETS: buckets = (int)p.num; break;
        case O_OVERLAP: overlap = p.choice == 0; break;
        case O_VIRTUAL: virt = (int)p.num; break;
        case O_RECOMPUTE: recompute = p.arg; break;
        case O_SAVE: save = p.arg; break;
        case O_LOAD: load = p.arg; break;
        case O_HELP: opt_print_help(&schedule_command, stdout); return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return cli_usage_fail();
    if (!load && stages < 1) {
        opt_error(&p, "--stages K is required (or --schedule-file FILE)");
        return cli_usage_fail();
    }
    if (stages > SCHEDULE_MAX_STAGES || micro > SCHEDULE_MAX_MICRO) {
        opt_error(&p, "schedule prints at most %d stages and %d micro-batches",
                  SCHEDULE_MAX_STAGES, SCHEDULE_MAX_MICRO);
        return cli_usage_fail();
    }
    int flags[SCHEDULE_MAX_STAGES];
    if (schedule_parse_recompute(recompute, stages, flags)) {
        char why[256];
        snprintf(why, sizeof why, "%s", pt_error_get());
        opt_error(&p, "%s", why);
        return cli_usage_fail();
    }
    int any_recompute = 0;
    for (int k = 0; k < stages; k++) any_recompute |= flags[k];
    schedule s;
    if (load) {
        if (schedule_read(&s, load)) return cli_input_fail();
    } else {
        if (schedule_init_named(&s, name, stages, virt, micro)) return cli_input_fail();
        /* --buckets B: B buckets on every stage, or on every chunk of a multi-chunk one */
        int C = stages * s.virtual_stages;
        int per_chunk[C];
        for (int k = 0; k < C; k++) per_chunk[k] = buckets;
        if ((buckets && schedule_add_reductions_chunks(&s, per_chunk, overlap)) ||
            (any_recompute && schedule_add_recompute(&s, flags))) {
            schedule_free(&s);
            return cli_input_fail();
        }
    }
    if (save) {
        FILE *f = fopen(save, "w");
        int bad = !f || schedule_write(&s, f);
        if (f && fclose(f)) bad = 1;
        if (bad) {
            schedule_free(&s);
            pt_error_set("cannot write the schedule to %s", save);
            return cli_input_fail();
        }
    }
    schedule_report rep;
    if (schedule_verify(&s, &rep)) {
        schedule_free(&s);
        return cli_fail(pt_error_get());
    }
    schedule_print(&s, stdout);
    int V = rep.virtual_stages;
    print_peaks(V > 1 ? "verified: no deadlock; peak micro-batches held per stage (per chunk)"
                      : "verified: no deadlock; peak micro-batches held per stage",
                rep.peak_inflight, rep.peak_inflight_chunk, rep.stages, V);
    if (any_recompute)
        print_peaks("inputs kept per stage (recomputation keeps only these between F and R)",
                    rep.peak_inputs, rep.peak_inputs_chunk, rep.stages, V);
    schedule_report_free(&rep);
    schedule_free(&s);
    return PT_EXIT_OK;
}
