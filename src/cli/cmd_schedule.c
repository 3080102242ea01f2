/* `pipetrain schedule`: a pipeline schedule's instruction lists and timeline, verified. */
#include <math.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "schedule/schedule.h"
#include "src/base/error.h"
#include "src/base/options.h"
#include "src/base/output.h"
#include "src/cli/commands.h"

enum { O_STAGES = 1, O_MICRO, O_SCHED, O_BUCKETS, O_OVERLAP, O_VIRTUAL, O_RECOMPUTE, O_SAVE,
       O_LOAD, O_SMEM, O_COSTS, O_HELP };

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
    {.id = O_LOAD, .name = "schedule-file", .shared = 1},
    {.id = O_SMEM, .name = "schedule-memory", .shared = 1},
    {.id = O_COSTS, .name = "costs", .kind = OPT_TEXT, .arg = "LIST",
     .help = "--schedule search: each model chunk's costs in model order, comma-separated, "
             "each F (b = w = F) or F/B/W (forward, input gradient, weight gradient), e.g. "
             "3,1,1,3; default 1/V each"},
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
             "pipetrain schedule --stages K ... --schedule search [--costs LIST]\n"
             "pipetrain schedule --schedule-file FILE",
    .about = "Prints each stage's instruction list and a unit-time timeline of the schedule, "
             "verifies it (no deadlock) and reports the bubble, the peak micro-batches each "
             "stage holds (per chunk with --virtual, and the inputs kept with --recompute) "
             "and the message buffers the CPU engine needs (received into, and gradients "
             "sent from, by liveness).",
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

/* The CPU engine's message buffers by liveness (schedule/buffers.c): what each chunk
 * receives its activations and its gradients into (at most: where W reads both its input
 * and its output gradient; a model whose chunks start with a block needs fewer) and what it
 * sends its gradients from; 0 where it receives or sends none. */
static int print_buffers(const schedule *s, int V)
{
    int K = s->stages, n = K * V;
    int *per = malloc(3 * (size_t)n * sizeof *per), *sum = malloc(3 * (size_t)K * sizeof *sum);
    int rc = per && sum ? 0 : pt_error_set("out of memory");
    int *send = rc ? NULL : per + 2 * n;
    if (!rc) rc = schedule_send_buffers(s, 1, send);
    for (int k = 0; k < K && !rc; k++) {
        sum[k] = sum[K + k] = sum[2 * K + k] = 0;
        for (int v = 0; v < V && !rc; v++) {
            int to, i = k * V + v, nr[2];
            if (schedule_receive_buffers(s, k, v, schedule_least_receive_buffers(s),
                                         SCHED_W_READS_ACT | SCHED_W_READS_GRAD, nr, NULL))
                rc = -1;
            int from_prev = schedule_route_prev(s, k, v, &to, NULL);
            per[i] = from_prev ? nr[0] : 0;
            per[n + i] = schedule_route_next(s, k, v, &to, NULL) ? nr[1] : 0;
            if (!from_prev) send[i] = 0;
            for (int j = 0; j < 3; j++) sum[j * K + k] += per[j * n + i];
        }
    }
    if (!rc) {
        print_peaks("CPU engine's buffers activations are received into per stage (per chunk)",
                    sum, per, K, V);
        print_peaks("CPU engine's buffers gradients are received into per stage (per chunk)",
                    sum + K, per + n, K, V);
        print_peaks("CPU engine's buffers gradients are sent from per stage (per chunk)",
                    sum + 2 * K, send, K, V);
    }
    free(per);
    free(sum);
    return rc ? -1 : 0;
}

/* --costs: n model chunks' F, b, w ("F" or "F/B/W" each, comma-separated). */
static int parse_costs(const char *text, int n, double *f, double *b, double *w)
{
    const char *p = text;
    for (int c = 0; c < n; c++) {
        char *end;
        f[c] = strtod(p, &end);
        b[c] = w[c] = f[c];
        if (end != p && *end == '/') {
            b[c] = strtod(end + 1, &end);
            if (*end != '/') return pt_error_set("--costs %s: chunk %d: expected F/B/W", text, c);
            w[c] = strtod(end + 1, &end);
        }
        if (end == p || !(f[c] > 0 && b[c] > 0 && w[c] > 0) || !isfinite(f[c] + b[c] + w[c]))
            return pt_error_set("--costs %s: chunk %d: expected positive numbers", text, c);
        if (*end && *end != ',') /* "1/2/3/4" read as "too few costs" */
            return pt_error_set("--costs %s: chunk %d: expected F or F/B/W, then ',' or the "
                                "end", text, c);
        if (c + 1 < n && *end != ',')
            return pt_error_set("--costs %s: %d model chunks need %d costs, %d given", text, n,
                                n, c + 1);
        if (c + 1 == n && *end)
            return pt_error_set("--costs %s: more than the %d model chunks' costs", text, n);
        p = end + 1;
    }
    return 0;
}

/* --schedule search with the given costs and limit; prints what won. */
static int search_schedule(schedule *s, int stages, int virt, int micro, const char *costs,
                           double memory)
{
    int C = stages * virt;
    double *f = malloc(3 * (size_t)C * sizeof *f);
    if (!f) return pt_error_set("out of memory");
    int rc = costs ? parse_costs(costs, C, f, f + C, f + 2 * C) : 0;
    schedule_search_config c = {.stages = stages, .microbatches = micro, .virtual_stages = virt,
                                .fwd = costs ? f : NULL, .bwd_input = costs ? f + C : NULL,
                                .bwd_weight = costs ? f + 2 * C : NULL, .memory = memory};
    schedule_search_result r;
    if (!rc) rc = schedule_search(s, &c, &r);
    free(f);
    if (rc) return -1;
    printf("search: %s, simulated step %g at %s costs, holds %g micro-batches", r.how, r.step,
           costs ? "the given" : "unit", r.peak);
    if (r.best_named < INFINITY)
        printf("; fastest hand-written within the limit: %s, %g", r.best_named_name,
               r.best_named);
    printf(" (%d candidates verified, %d within the limit)\n", r.tried, r.kept);
    return 0;
}

/* --save-schedule FILE through src/base/output.h, as train writes its files: a FIFO, a
 * device or a directory there is refused (a FIFO blocked the write forever), a link there
 * is replaced, never followed, and a failed write leaves what was there. −1 with a message
 * naming the path. */
static int save_schedule(const schedule *s, const char *path)
{
    pt_output out;
    if (pt_output_begin(&out, path)) return -1;
    int fd = dup(out.fd);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f && fd >= 0) close(fd);
    int bad = !f || schedule_write(s, f);
    if (f && fclose(f)) bad = 1;
    if (bad) {
        pt_output_abort(&out);
        return pt_error_set("--save-schedule %s: the write failed", path);
    }
    return pt_output_commit(&out);
}

/* What the printer can show in a terminal's worth of text. */
enum { SCHEDULE_MAX_STAGES = 256, SCHEDULE_MAX_MICRO = 4096 };

int cmd_schedule(int argc, char **argv)
{
    const char *name = NULL, *recompute = "none", *save = NULL, *load = NULL, *costs = NULL;
    double memory = 0;
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
        case O_SMEM: memory = p.real; break;
        case O_COSTS: costs = p.arg; break;
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
    int searching = name && !strcmp(name, "search");
    if ((costs || memory > 0) && (!searching || load)) {
        opt_error(&p, "--costs and --schedule-memory are for --schedule search");
        return cli_usage_fail();
    }
    /* 1 is --virtual's default, which the V schedules read as their 2: given, it is refused */
    if (name && schedule_is_v(name) && opt_given(&p, O_VIRTUAL) && virt == 1) {
        opt_error(&p, "schedule %s places model chunks in a V (down the ranks and back): it "
                  "needs an even number of chunks per rank (2 unless --virtual says), not "
                  "--virtual 1", name);
        return cli_usage_fail();
    }
    int any_recompute = 0;
    for (int k = 0; k < stages; k++) any_recompute |= flags[k];
    schedule s;
    if (load) {
        if (schedule_read(&s, load)) return cli_input_fail();
    } else {
        if (searching ? search_schedule(&s, stages, virt, micro ? micro : 1, costs, memory)
                      : schedule_init_named(&s, name, stages, virt, micro))
            return cli_input_fail();
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
    if (save && save_schedule(&s, save)) {
        schedule_free(&s);
        return cli_input_fail();
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
    int rc = print_buffers(&s, V > 1 ? V : 1);
    schedule_free(&s);
    return rc ? cli_fail(pt_error_get()) : PT_EXIT_OK;
}
