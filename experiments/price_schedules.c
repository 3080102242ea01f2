/* Every pipeline schedule priced at ONE profile of a model's layers, as `plan` prices one:
 *
 *   build/price_schedules MODEL STAGES MICROBATCHES BATCH [PROFILES [PARTITION [LIMIT]]]
 *
 * The layers are profiled PROFILES times (default 5), each by a process of its own, and
 * each layer's figure is the least of those medians: on a machine that other jobs share,
 * a layer's time is its own plus whatever the others stole, and the least is the nearest
 * to its own (one `plan` call profiles once and can price two schedules from a profile
 * 20% off another call's); with PT_PROFILE_LOG=FILE, also over every earlier call's.
 * Then, for gpipe, 1f1b, zb-h1, zb-h2 and search (one chunk per rank) and interleaved,
 * zb-v, v-half, v-min, dualpipev and search (two), each cut as train cuts it
 * (plan_v_partition) unless PARTITION (a method, or counts: then only the schedules of
 * that many chunks) is given, the search within LIMIT micro-batches per rank if given
 * (--schedule-memory): the predicted step, against 1F1B's, the bubble (idle share of the step), the largest rank's bytes as `plan`
 * prices them and the part of them that is activations (slots the verifier's per-chunk
 * peaks size, with the split backward's pending output gradients), and the most
 * micro-batches a rank holds (the verifier's peak chunk activations / V); with one chunk
 * per rank, a lower bound on any schedule's step (step_bound). First the
 * profile per layer (F, B, b, w of one micro-batch; a slot's bytes). Issue 26's study
 * (docs/PERFORMANCE.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "src/cpu/stage.h"
#include "src/model/net.h"
#include "src/plan/build.h"
#include "src/runtime/profile.h"
#include "topologies/topo.h"

static const struct {
    const char *name;
    int V;
} kinds[] = {{"1f1b", 1},        {"gpipe", 1}, {"zb-h1", 1}, {"zb-h2", 1},
             {"search", 1},      {"interleaved", 2}, {"zb-v", 2}, {"v-half", 2},
             {"v-min", 2},       {"dualpipev", 2},   {"search", 2}};

/* One profile of the layers (the planner's: 1 warm-up, median of 3), printed as four rows
 * F, B, b, w of seconds per sample. */
static int profile_print(const char *model, int mb)
{
    net_desc net = {0};
    partition_profile p;
    if (net_desc_load(&net, model) || partition_profile_measure(&p, &net, mb, 1, 3)) {
        fprintf(stderr, "price_schedules: %s\n", pt_error_get());
        return 2;
    }
    const double *rows[4] = {p.fwd_s, p.bwd_s, p.bwd_input_s, p.bwd_weight_s};
    for (int r = 0; r < 4; r++)
        for (int l = 0; l < net.n_layers; l++) printf("%.9g%c", rows[r][l], l + 1 < net.n_layers ? ' ' : '\n');
    partition_profile_free(&p);
    net_desc_free(&net);
    return 0;
}

/* With PT_PROFILE_LOG=FILE, the least is also over every profile of this model and
 * micro-batch an earlier call wrote there, and this one's is appended: figures taken over
 * minutes of a loaded machine rather than seconds. */
static int profile_log(partition_profile *best, const char *model, int mb)
{
    const char *path = getenv("PT_PROFILE_LOG");
    if (!path) return 0;
    int L = best->n_layers;
    double *rows[4] = {best->fwd_s, best->bwd_s, best->bwd_input_s, best->bwd_weight_s};
    FILE *f = fopen(path, "r");
    static char line[1 << 16];
    while (f && fgets(line, sizeof line, f)) {
        char *save, *tok = strtok_r(line, " \n", &save);
        char *m = strtok_r(NULL, " \n", &save);
        if (!tok || !m || strcmp(tok, model) || atoi(m) != mb) continue;
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < L; l++) {
                char *x = strtok_r(NULL, " \n", &save);
                if (!x) {
                    fclose(f);
                    return pt_error_set("%s: a short line", path);
                }
                rows[k][l] = fmin(rows[k][l], atof(x));
            }
    }
    if (f) fclose(f);
    f = fopen(path, "a");
    if (!f) return pt_error_set("cannot append to %s", path);
    fprintf(f, "%s %d", model, mb);
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < L; l++) fprintf(f, " %.9g", rows[k][l]);
    fprintf(f, "\n");
    return fclose(f) ? pt_error_set("cannot write %s", path) : 0;
}

/* The least of n profiles' figures per layer into *best, each profile taken by a process
 * of its own (self --profile): on this VM a layer's fused backward measures 22.8 or 38 ms
 * depending on the process, whatever the repeats within it, so the least over processes. */
static int profile_least(partition_profile *best, const net_desc *net, const char *self,
                         const char *model, int mb, int n)
{
    int L = net->n_layers;
    *best = (partition_profile){.n_layers = L};
    double **to[4] = {&best->fwd_s, &best->bwd_s, &best->bwd_input_s, &best->bwd_weight_s};
    for (int k = 0; k < 4; k++) {
        *to[k] = malloc((size_t)L * sizeof(double));
        if (!*to[k]) return pt_error_set("out of memory");
        for (int l = 0; l < L; l++) (*to[k])[l] = INFINITY;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' --profile '%s' %d", self, model, mb);
    for (int r = 0; r < n; r++) {
        FILE *f = popen(cmd, "r");
        if (!f) return pt_error_set("cannot run %s", cmd);
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < L; l++) {
                double x;
                if (fscanf(f, "%lf", &x) != 1) {
                    pclose(f);
                    return pt_error_set("%s printed no profile", cmd);
                }
                (*to[k])[l] = fmin((*to[k])[l], x);
            }
        if (pclose(f)) return pt_error_set("%s failed", cmd);
    }
    return profile_log(best, model, mb);
}

static void print_profile(const partition_profile *p, const net_desc *net, int mb)
{
    printf("layer  type        F ms     B ms     b ms     w ms   slot MiB  split MiB   (one "
           "micro-batch of %d)\n", mb);
    for (int l = 0; l < net->n_layers; l++) {
        stage_bytes b = stage_estimate(net, l, l + 1, mb, 1);
        printf("%5d  %-8s %7.2f  %7.2f  %7.2f  %7.2f  %9.2f  %9.2f\n", l,
               layer_type_name(net->layers[l].type), p->fwd_s[l] * mb * 1e3,
               p->bwd_s[l] * mb * 1e3, p->bwd_input_s[l] * mb * 1e3,
               p->bwd_weight_s[l] * mb * 1e3, b.slot / 1048576.0,
               stage_split_slot_bytes(net, l, l + 1, mb) / 1048576.0);
    }
}

/* The largest rank's activation bytes: per chunk, its verifier peak × (slot + split); with
 * V > 1 the rank's peak × the largest chunk's where that is less (the chunks share their
 * slots, src/runtime/engine_create.h). */
static double activation_bytes(const plan_built *b, const net_desc *net, int mb, int *held)
{
    const schedule *s = &b->pred.sched;
    schedule_report rep;
    if (schedule_verify(s, &rep)) return -1;
    int V = s->virtual_stages;
    double most = 0;
    *held = 0;
    for (int k = 0; k < s->stages; k++) {
        double bytes = 0, unit = 0;
        int split = 0, n_held = 0; /* a split list keeps each slot's output gradients until its W */
        for (int i = 0; i < s->lists[k].n_ops; i++)
            split |= s->lists[k].ops[i].kind == SCHED_OP_BACKWARD_INPUT;
        for (int v = 0; v < V; v++) {
            int c = schedule_model_chunk(s, k, v);
            int first = b->part.first[c], last = b->part.first[c + 1];
            stage_bytes sb = stage_estimate(net, first, last, mb, 1);
            double slot = (double)sb.slot +
                          (split ? (double)stage_split_slot_bytes(net, first, last, mb) : 0);
            bytes += rep.peak_inflight_chunk[k * V + v] * slot;
            n_held += rep.peak_inflight_chunk[k * V + v];
            if (stage_round_up((size_t)slot) > unit) unit = stage_round_up((size_t)slot);
        }
        if (V > 1 && rep.peak_inflight[k] < n_held) bytes = rep.peak_inflight[k] * unit;
        if (bytes > most) most = bytes;
        if (rep.peak_inflight[k] > *held) *held = rep.peak_inflight[k];
    }
    schedule_report_free(&rep);
    return most;
}

/* One chunk per rank: no step can be shorter than some rank's busy time plus the forwards
 * of micro-batch 0 through the ranks before it (messages free), the largest over ranks. */
static double step_bound(const plan_built *b, const partition_profile *prof, int mb)
{
    double arrival = 0, most = 0;
    for (int k = 0; k < b->part.stages; k++) {
        most = fmax(most, arrival + b->pred.busy_s[k]);
        for (int l = b->part.first[k]; l < b->part.first[k + 1]; l++)
            arrival += prof->fwd_s[l] * mb;
    }
    return most;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--profile")) return profile_print(argv[2], atoi(argv[3]));
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL STAGES MICROBATCHES BATCH [PROFILES [PARTITION "
                        "[LIMIT]]]\n",
                argv[0]);
        return 2;
    }
    int K = atoi(argv[2]), M = atoi(argv[3]), batch = atoi(argv[4]);
    int n = argc > 5 ? atoi(argv[5]) : 5;
    const char *method = argc > 6 ? argv[6] : "time";
    double limit = argc > 7 ? atof(argv[7]) : 0;
    net_desc net = {0};
    topo_t *t = NULL;
    partition_profile prof = {0};
    if (K < 1 || M < 1 || batch % M || n < 1 || net_desc_load(&net, argv[1]) ||
        topo_init(&t, NULL) || profile_least(&prof, &net, argv[0], argv[1], batch / M, n)) {
        fprintf(stderr, "price_schedules: %s\n", K < 1 || M < 1 || batch % M || n < 1
                                                     ? "bad arguments" : pt_error_get());
        return 2;
    }
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    print_profile(&prof, &net, batch / M);
    printf("\n%-12s V  %-24s %9s  %7s  %6s  %9s  %9s  %5s  %s\n", "schedule", "origin", "step s",
           "vs 1f1b", "bubble", "MiB/rank", "act. MiB", "held", "cut (first layers)");
    double base = 0;
    int rc = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !rc; i++) {
        plan_args a = {.model = argv[1], .method = method, .schedule = kinds[i].name,
                       .recompute = "none", .stages = K, .replicas = 1, .nodes = 1,
                       .batch = batch, .microbatches = M, .virtual_stages = kinds[i].V,
                       .reduce = REDUCE_ALLREDUCE, .bucket_mb = 1, .overlap = 1,
                       .replica_batch = batch, .device = TOPO_DEVICE_CPU, .tensor = 1,
                       .schedule_memory = limit};
        if (!strcmp(kinds[i].name, "dualpipev") && M < 2 * K) continue;
        /* a counts list cuts K·V chunks for one V only */
        int entries = 1;
        for (const char *c = method; *c; c++) entries += *c == ',';
        if (strchr(method, ',') && entries != K * kinds[i].V) continue;
        plan_built b;
        if (plan_build(&b, &a, &net, &prof, topo_get_machine(t), &cm)) {
            fprintf(stderr, "price_schedules: %s: %s\n", kinds[i].name, pt_error_get());
            rc = 2;
            break;
        }
        if (!base) base = b.pred.step_s;
        int held = 0;
        double act = activation_bytes(&b, &net, batch / M, &held);
        printf("%-12s %d  %-24s %9.3f  %6.2fx  %6.3f  %9.1f  %9.1f  %5.2g  ", kinds[i].name,
               kinds[i].V, b.pred.sched.origin[0] ? b.pred.sched.origin : "-", b.pred.step_s,
               base / b.pred.step_s, b.pred.bubble, b.peak_bytes / 1048576.0,
               act / 1048576.0, (double)held / kinds[i].V);
        for (int c = 0; c < b.part.stages; c++) printf("%s%d", c ? "," : "", b.part.first[c]);
        if (kinds[i].V == 1) printf("  bound %.3f", step_bound(&b, &prof, batch / M));
        printf("\n");
        plan_built_free(&b);
    }
    partition_profile_free(&prof);
    topo_free(t);
    net_desc_free(&net);
    return rc;
}
