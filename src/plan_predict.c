#include "src/plan_predict.h"

#include <stdlib.h>

#include "schedule/schedule.h"
#include "src/base/error.h"

void plan_prediction_free(plan_prediction *p)
{
    free(p->busy_s);
    *p = (plan_prediction){0};
}

/* Per stage: the profile's forward and backward of one micro-batch, and (R > 1) its
 * buckets' bytes and each backward part's share of the backward. */
typedef struct {
    double *fwd, *bwd;     /* one block, 2K */
    double **bytes, **share; /* [K][buckets], NULL rows for stages without buckets */
} stage_costs;

static void stage_costs_free(stage_costs *c, int K)
{
    for (int s = 0; s < K && c->bytes; s++) free(c->bytes[s]);
    for (int s = 0; s < K && c->share; s++) free(c->share[s]);
    free(c->bytes);
    free(c->share);
    free(c->fwd);
}

static int stage_costs_init(stage_costs *c, const net_desc *net, const partition *part,
                            const partition_profile *prof, const plan_predict_config *cfg)
{
    int K = part->stages;
    *c = (stage_costs){0};
    c->fwd = calloc(2 * (size_t)K, sizeof *c->fwd);
    c->bytes = calloc((size_t)K, sizeof *c->bytes);
    c->share = calloc((size_t)K, sizeof *c->share);
    if (!c->fwd || !c->bytes || !c->share) return pt_error_set("out of memory");
    c->bwd = c->fwd + K;
    for (int s = 0; s < K; s++) {
        int first = part->first[s], last = part->first[s + 1];
        for (int l = first; l < last; l++) {
            c->fwd[s] += prof->fwd_s[l] * cfg->microbatch;
            c->bwd[s] += prof->bwd_s[l] * cfg->microbatch;
        }
        if (cfg->rep.replicas < 2) continue;
        reduce_plan plan;
        if (replicas_plan(&plan, net, first, last, &cfg->rep)) return -1;
        int B = plan.n_buckets;
        c->bytes[s] = malloc((size_t)B * sizeof **c->bytes + 1);
        c->share[s] = malloc((size_t)B * sizeof **c->share + 1);
        if (!c->bytes[s] || !c->share[s]) {
            reduce_plan_free(&plan);
            return pt_error_set("out of memory");
        }
        for (int b = 0; b < B; b++) {
            int lo, hi;
            double t = 0;
            replicas_plan_part_range(&plan, last - first, b, &lo, &hi);
            for (int l = lo; l < hi; l++) t += prof->bwd_s[first + l] * cfg->microbatch;
            c->bytes[s][b] = (double)plan.buckets[b].count * sizeof(float);
            c->share[s][b] = c->bwd[s] > 0 ? t / c->bwd[s] : 1.0 / B;
        }
        /* the shares must sum to 1 exactly (the simulator checks): give the rounding to
         * the last part */
        double sum = 0;
        for (int b = 0; b + 1 < B; b++) sum += c->share[s][b];
        if (B) c->share[s][B - 1] = sum < 1 ? 1 - sum : 0;
        reduce_plan_free(&plan);
    }
    return 0;
}

int plan_predict(plan_prediction *out, const net_desc *net, const partition *part,
                 const partition_profile *prof, const plan_predict_config *cfg)
{
    *out = (plan_prediction){0};
    int K = part->stages;
    if (prof->n_layers != net->n_layers)
        return pt_error_set("plan_predict: a profile of %d layers for a model of %d",
                            prof->n_layers, net->n_layers);
    schedule sched;
    if (schedule_init_by_name(&sched, cfg->schedule, K, cfg->rep.microbatches)) return -1;
    stage_costs c = {0};
    int rc = replicas_schedule(&sched, net, part, &cfg->rep) ||
             stage_costs_init(&c, net, part, prof, cfg);
    /* the slowest boundary prices every message (the simulator has one message cost) */
    double msg = 0;
    for (int s = 0; !rc && cfg->message_s && s + 1 < K; s++)
        if (cfg->message_s[s] > msg) msg = cfg->message_s[s];
    schedule_sim sim;
    if (!rc) {
        schedule_costs sc = {
            .fwd = c.fwd, .bwd = c.bwd, .comm_cost = msg, .step_cost = 0,
            .replicas = cfg->rep.replicas, .alpha = 0, .beta = 1,
            .alpha_stage = cfg->alpha, .beta_stage = cfg->beta,
            .bucket_bytes = (const double *const *)c.bytes,
            .part_share = (const double *const *)c.share,
        };
        rc = schedule_simulate_costs(&sched, &sc, &sim);
    }
    if (!rc) {
        out->busy_s = malloc(3 * (size_t)K * sizeof *out->busy_s);
        if (!out->busy_s) {
            rc = pt_error_set("out of memory");
        } else {
            out->reduce_s = out->busy_s + K;
            out->exposed_s = out->busy_s + 2 * K;
            out->step_s = sim.makespan;
            out->bubble = sim.bubble;
            for (int s = 0; s < K; s++) {
                out->busy_s[s] = sim.busy[s];
                out->reduce_s[s] = sim.reduce[s];
                out->exposed_s[s] = sim.exposed[s];
            }
        }
        schedule_sim_free(&sim);
    }
    stage_costs_free(&c, K);
    schedule_free(&sched);
    return rc ? -1 : 0;
}
