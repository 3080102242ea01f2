/* The step time a layout would take, before running it: the schedule's simulator fed with
 * per-layer times (a profile measured on this machine), the pipeline messages priced by
 * the links between neighbouring stages and each stage's reductions among its replicas by
 * the α–β figures of the link its group's ring crosses. `plan` prints it; `train --json`
 * reports the same simulation from measured stage times (src/train_report.c). */
#ifndef PT_PLAN_PREDICT_H
#define PT_PLAN_PREDICT_H

#include "partition/partition.h"
#include "src/model/net.h"
#include "src/replicas.h"

typedef struct {
    const char *schedule;      /* generator name, e.g. "1f1b" */
    int microbatch;            /* samples per micro-batch */
    replicas_config rep;       /* replicas, method, buckets, overlap, micro-batches (M) */
    const double *alpha, *beta; /* per stage: the group's link (R > 1), seconds / bytes/s */
    const double *message_s;   /* per stage: one activation or gradient message to the next
                                * stage (K − 1 entries; may be NULL: free) */
} plan_predict_config;

typedef struct {
    double step_s;                    /* makespan of one optimizer step */
    double bubble;                    /* mean over stages of idle / step */
    double *busy_s, *reduce_s, *exposed_s; /* per stage, one block (owned) */
} plan_prediction;

/* Simulates one step. The optimizer's update is left out (not in the profile). −1 with a
 * message for an unknown schedule or a profile of another model. */
int plan_predict(plan_prediction *out, const net_desc *net, const partition *part,
                 const partition_profile *prof, const plan_predict_config *cfg);
void plan_prediction_free(plan_prediction *p);

#endif
