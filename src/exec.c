#include "src/exec.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "src/clock.h"
#include "src/error.h"
#include "src/trace.h"

/* Message tags name the micro-batch and the direction. They wrap below 32767, the least
 * MPI_TAG_UB the standard allows: two messages with one tag between one pair of ranks are
 * matched in the order they were sent, and both sides go through micro-batches in order. */
enum { TAG_ACT = 0, TAG_GRAD = 1, TAG_EVAL = 2, TAG_WRAP = 8192 };
static int tag_of(int kind, int m) { return (m % TAG_WRAP) * 4 + kind; }

struct exec {
    MPI_Comm comm;
    int rank, size;
    char host[64];
    const net_desc *net;
    const schedule *sched;
    exec_config cfg;
    int mb; /* micro-batch size */
    size_t in_count, out_count;
    stage st;
    /* per micro-batch buffers */
    float **act_in;    /* stage 0: converted pixels; others: received activations */
    float **grad_in;   /* gradient of the output received from the next stage */
    float **grad_out;  /* gradient of the input sent to the previous stage */
    float **dlogits;   /* last stage: gradient of the loss */
    float **eval_in;   /* two input buffers for evaluation */
    int *slot_of;
    MPI_Request *req_act, *req_grad, *req_send_act, *req_send_grad;
    /* statistics */
    double t_origin;
    double compute_s, wall_s, forward_s, backward_s, optimizer_s;
    long steps;
    int inflight, peak_inflight;
    trace_log trace;
};

static void polite_pause(void)
{
    struct timespec ts = {0, 50000}; /* 50 µs: blocking MPI would spin a shared core */
    nanosleep(&ts, NULL);
}

/* Waits for a request: a short spin first (a message on its way usually lands within a
 * few microseconds, and the pipeline's critical path crosses one wait per micro-batch),
 * then MPI_Test with 50 µs sleeps so that a rank sharing a core with its peer yields it. */
static int test_politely(MPI_Request *req, double t0, double timeout_s, int *timed_out)
{
    enum { SPIN_TESTS = 64 };
    int done = 0;
    for (int i = 0; i < SPIN_TESTS && !done; i++)
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
    while (!done) {
        if (pt_now() - t0 > timeout_s) {
            *timed_out = 1;
            return 0;
        }
        polite_pause();
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
    }
    return 0;
}

static int wait_request(exec_t *e, MPI_Request *req, const char *what, int m, int peer)
{
    if (*req == MPI_REQUEST_NULL) return 0;
    int timed_out = 0;
    if (test_politely(req, pt_now(), e->cfg.timeout_s, &timed_out))
        return pt_error_set("rank %d (%s): MPI_Test failed waiting for %s", e->rank, e->host,
                            what);
    if (timed_out)
        return pt_error_set("rank %d (%s, stage %d): no progress for %.0f s waiting for %s "
                                "of micro-batch %d %s stage %d (--timeout); a peer has died or "
                                "stalled", e->rank, e->host, e->rank, e->cfg.timeout_s, what, m,
                                strncmp(what, "send", 4) ? "from" : "to", peer);
    return 0;
}

int exec_allreduce(void *buf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   double timeout_s)
{
    MPI_Request req;
    if (MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, comm, &req) != MPI_SUCCESS)
        return pt_error_set("MPI_Iallreduce failed");
    return exec_wait_collective(&req, comm, timeout_s);
}

int exec_wait_collective(MPI_Request *req, MPI_Comm comm, double timeout_s)
{
    int timed_out = 0;
    if (test_politely(req, pt_now(), timeout_s, &timed_out))
        return pt_error_set("MPI_Test failed in a collective");
    if (timed_out) {
        int rank;
        MPI_Comm_rank(comm, &rank);
        return pt_error_set("rank %d: no progress for %.0f s in a collective (--timeout); "
                            "another rank has died or stalled", rank, timeout_s);
    }
    return 0;
}

static float **alloc_buffers(int count, size_t floats)
{
    float **b = calloc((size_t)count, sizeof *b);
    if (!b) return NULL;
    for (int i = 0; i < count; i++) {
        b[i] = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (!b[i]) {
            while (i-- > 0) free(b[i]);
            free(b);
            return NULL;
        }
    }
    return b;
}

static void free_buffers(float **b, int count)
{
    if (!b) return;
    for (int i = 0; i < count; i++) free(b[i]);
    free(b);
}

int exec_init(exec_t **out, MPI_Comm comm, const net_desc *net, const partition *part,
              const schedule *sched, const exec_config *cfg)
{
    *out = NULL;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (part->stages != size || sched->stages != size)
        return pt_error_set("the job has %d ranks but the layout has %d stages: run with "
                            "mpiexec -n %d", size, part->stages, part->stages);
    if (sched->microbatches != cfg->microbatches || part->n_layers != net->n_layers)
        return pt_error_set("the schedule has %d micro-batches and the partition %d layers; "
                            "expected %d and %d", sched->microbatches, part->n_layers,
                            cfg->microbatches, net->n_layers);
    if (cfg->microbatches < 1 || cfg->batch % cfg->microbatches)
        return pt_error_set("%d micro-batches do not divide the batch of %d", cfg->microbatches,
                            cfg->batch);
    schedule_report rep;
    if (schedule_verify(sched, &rep)) return -1;
    int slots = rep.peak_inflight[rank];
    schedule_report_free(&rep);

    exec_t *e = calloc(1, sizeof *e);
    if (!e) return pt_error_set("out of memory");
    e->comm = comm;
    e->rank = rank;
    e->size = size;
    gethostname(e->host, sizeof e->host - 1);
    e->net = net;
    e->sched = sched;
    e->cfg = *cfg;
    e->mb = cfg->batch / cfg->microbatches;
    if (stage_init(&e->st, net, part->first[rank], part->first[rank + 1], e->mb,
                   slots > 0 ? slots : 1, cfg->threads > 0 ? cfg->threads : 1)) {
        free(e);
        return -1;
    }
    int M = cfg->microbatches;
    e->in_count = stage_in_count(&e->st);
    e->out_count = stage_out_count(&e->st);
    if ((double)e->mb * (double)(e->in_count > e->out_count ? e->in_count : e->out_count) >
        (double)INT_MAX) {
        exec_free(e);
        return pt_error_set("a micro-batch of %d samples is too large for one MPI message",
                            cfg->batch / M);
    }
    e->act_in = alloc_buffers(M, (size_t)e->mb * e->in_count);
    e->grad_in = alloc_buffers(M, (size_t)e->mb * e->out_count);
    e->grad_out = alloc_buffers(M, (size_t)e->mb * e->in_count);
    e->dlogits = rank == size - 1 ? alloc_buffers(M, (size_t)e->mb * e->out_count) : NULL;
    e->eval_in = alloc_buffers(2, (size_t)e->mb * e->in_count);
    e->slot_of = calloc((size_t)M, sizeof *e->slot_of);
    e->req_act = malloc((size_t)M * sizeof *e->req_act);
    e->req_grad = malloc((size_t)M * sizeof *e->req_grad);
    e->req_send_act = malloc((size_t)M * sizeof *e->req_send_act);
    e->req_send_grad = malloc((size_t)M * sizeof *e->req_send_grad);
    if (!e->act_in || !e->grad_in || !e->grad_out || (rank == size - 1 && !e->dlogits) || !e->eval_in ||
        !e->slot_of || !e->req_act || !e->req_grad || !e->req_send_act || !e->req_send_grad) {
        exec_free(e);
        return pt_error_set("out of memory for %d micro-batches of %d samples", M, e->mb);
    }
    for (int m = 0; m < M; m++)
        e->req_act[m] = e->req_grad[m] = e->req_send_act[m] = e->req_send_grad[m] =
            MPI_REQUEST_NULL;
    /* the default 50 µs timer slack would double every polite pause */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    e->t_origin = pt_now();
    *out = e;
    return 0;
}

int exec_start(exec_t *e)
{
    /* A common time origin for the trace: everyone leaves the barrier together. */
    if (exec_allreduce(&(int){0}, 1, MPI_INT, MPI_SUM, e->comm, e->cfg.timeout_s)) return -1;
    e->t_origin = pt_now();
    return 0;
}

void exec_free(exec_t *e)
{
    if (!e) return;
    int M = e->cfg.microbatches;
    stage_free(&e->st);
    free_buffers(e->act_in, M);
    free_buffers(e->grad_in, M);
    free_buffers(e->grad_out, M);
    free_buffers(e->dlogits, M);
    free_buffers(e->eval_in, 2);
    free(e->slot_of);
    free(e->req_act);
    free(e->req_grad);
    free(e->req_send_act);
    free(e->req_send_grad);
    trace_free(&e->trace);
    free(e);
}

stage *exec_stage(exec_t *e) { return &e->st; }
int exec_rank(const exec_t *e) { return e->rank; }
int exec_stages(const exec_t *e) { return e->size; }

static void record(exec_t *e, trace_kind kind, double t0, double t1, int m)
{
    if (e->cfg.trace)
        trace_add(&e->trace, kind, t0 - e->t_origin, t1 - e->t_origin, m, e->rank, e->steps);
}

/* Stage 0's input: the micro-batch's pixels as floats. */
static void load_pixels(float *dst, const dataset *d, const int64_t *idx, int n)
{
    size_t px = (size_t)d->rows * d->cols;
    for (int j = 0; j < n; j++)
        kernel_bytes_to_float_cpu(dst + (size_t)j * px, d->pixels + (size_t)idx[j] * px, px);
}

static void stall_forever(int die)
{
    if (die) raise(SIGKILL);
    for (;;) pause();
}

int exec_train_step(exec_t *e, const dataset *data, const int64_t *indices, uint64_t seed,
                    uint64_t step, const optimizer_config *opt, exec_step_result *res)
{
    const schedule_list *list = &e->sched->lists[e->rank];
    int mb = e->mb, last = e->rank == e->size - 1;
    int classes = e->net->classes;
    double t_step = pt_now(), compute = 0;
    double loss_sum = 0;
    long correct = 0;
    int nonfinite = 0;
    if (e->cfg.stall_rank == e->rank && (long)step == e->cfg.stall_step)
        stall_forever(e->cfg.stall_kills);

    /* Post every receive of the step up front: a message may arrive before we wait. */
    for (int i = 0; i < list->n_ops; i++) {
        const schedule_op *op = &list->ops[i];
        int m = op->microbatch;
        if (op->kind == SCHED_OP_RECV_ACT)
            MPI_Irecv(e->act_in[m], (int)(mb * e->in_count), MPI_FLOAT, op->peer,
                      tag_of(TAG_ACT, m), e->comm, &e->req_act[m]);
        else if (op->kind == SCHED_OP_RECV_GRAD)
            MPI_Irecv(e->grad_in[m], (int)(mb * e->out_count), MPI_FLOAT, op->peer,
                      tag_of(TAG_GRAD, m), e->comm, &e->req_grad[m]);
    }
    for (int i = 0; i < list->n_ops; i++) {
        const schedule_op *op = &list->ops[i];
        int m = op->microbatch;
        double t0 = pt_now();
        switch (op->kind) {
        case SCHED_OP_RECV_ACT:
            if (wait_request(e, &e->req_act[m], "the activation", m, op->peer)) return -1;
            record(e, TRACE_WAIT_ACT, t0, pt_now(), m);
            break;
        case SCHED_OP_RECV_GRAD:
            if (wait_request(e, &e->req_grad[m], "the gradient", m, op->peer)) return -1;
            record(e, TRACE_WAIT_GRAD, t0, pt_now(), m);
            break;
        case SCHED_OP_FORWARD: {
            const int64_t *ids = indices + (size_t)m * mb;
            if (e->rank == 0) load_pixels(e->act_in[m], data, ids, mb);
            int slot = stage_slot_acquire(&e->st);
            if (slot < 0) return -1;
            e->slot_of[m] = slot;
            if (++e->inflight > e->peak_inflight) e->peak_inflight = e->inflight;
            const float *y = stage_forward(&e->st, slot, e->act_in[m], mb, ids, seed, step, 1);
            if (last) {
                int32_t labels[mb];
                for (int j = 0; j < mb; j++) labels[j] = data->labels[ids[j]];
                int ok = 0;
                double l = kernel_softmax_xent_cpu(e->dlogits[m], &ok, y, labels, mb, classes,
                                                   1.0f / (float)e->cfg.batch);
                if (!isfinite(l)) nonfinite = 1;
                loss_sum += l;
                correct += ok;
            }
            double t1 = pt_now();
            compute += t1 - t0;
            e->forward_s += t1 - t0;
            record(e, TRACE_FORWARD, t0, t1, m);
            break;
        }
        case SCHED_OP_SEND_ACT: {
            const stage_slot *sl = &e->st.slots[e->slot_of[m]];
            const float *y = sl->out[e->st.last - e->st.first - 1];
            MPI_Isend(y, (int)(mb * e->out_count), MPI_FLOAT, op->peer, tag_of(TAG_ACT, m),
                      e->comm, &e->req_send_act[m]);
            record(e, TRACE_SEND_ACT, t0, pt_now(), m);
            break;
        }
        case SCHED_OP_BACKWARD: {
            const float *dout = last ? e->dlogits[m] : e->grad_in[m];
            stage_backward(&e->st, e->slot_of[m], dout, e->rank > 0 ? e->grad_out[m] : NULL);
            double t1 = pt_now();
            compute += t1 - t0;
            e->backward_s += t1 - t0;
            record(e, TRACE_BACKWARD, t0, t1, m);
            /* the slot's output may still be on its way to the next stage */
            if (wait_request(e, &e->req_send_act[m], "send of the activation", m, e->rank + 1))
                return -1;
            stage_slot_release(&e->st, e->slot_of[m]);
            e->inflight--;
            break;
        }
        case SCHED_OP_SEND_GRAD:
            MPI_Isend(e->grad_out[m], (int)(mb * e->in_count), MPI_FLOAT, op->peer,
                      tag_of(TAG_GRAD, m), e->comm, &e->req_send_grad[m]);
            record(e, TRACE_SEND_GRAD, t0, pt_now(), m);
            break;
        case SCHED_OP_OPTIMIZER_STEP:
            for (int k = 0; k < e->cfg.microbatches; k++)
                if (wait_request(e, &e->req_send_grad[k], "send of the gradient", k,
                                 e->rank - 1))
                    return -1;
            stage_step(&e->st, opt);
            stage_zero_grad(&e->st);
            compute += pt_now() - t0;
            e->optimizer_s += pt_now() - t0;
            record(e, TRACE_OPTIMIZER, t0, pt_now(), -1);
            break;
        case SCHED_OP_ALLREDUCE:
        case SCHED_OP_RECOMPUTE:
        case SCHED_OP_COUNT:
            return pt_error_set("rank %d: instruction %s is not supported by this executor",
                                e->rank, schedule_op_name(op->kind));
        }
    }
    /* Share the loss (it lives on the last stage) and stop everyone on a non-finite one. */
    double t0 = pt_now();
    double sums[3] = {loss_sum, (double)correct, (double)nonfinite};
    if (exec_allreduce(sums, 3, MPI_DOUBLE, MPI_SUM, e->comm, e->cfg.timeout_s)) return -1;
    record(e, TRACE_SYNC, t0, pt_now(), -1);
    e->compute_s += compute;
    e->wall_s += pt_now() - t_step;
    e->steps++;
    res->loss_sum = sums[0];
    res->correct = (long)sums[1];
    if (sums[2] > 0) {
        pt_error_set("the loss is not finite (NaN or infinite) at step %llu: lower the "
                            "learning rate", (unsigned long long)step + 1);
        return EXEC_FAILED_EVERYWHERE;
    }
    return 0;
}

int exec_evaluate(exec_t *e, const dataset *data, double *loss, double *accuracy)
{
    int mb = e->mb, last = e->rank == e->size - 1, first = e->rank == 0;
    int chunks = (data->count + mb - 1) / mb;
    double loss_sum = 0;
    long correct = 0;
    double t_start = pt_now();
    MPI_Request send = MPI_REQUEST_NULL, recv[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int64_t ids[mb];
    int32_t labels[mb];
    /* Double-buffered: the next chunk's receive is posted before this chunk's compute. */
    int in_floats = (int)(mb * e->in_count);
    if (!first && chunks > 0)
        MPI_Irecv(e->eval_in[0], in_floats, MPI_FLOAT, e->rank - 1, tag_of(TAG_EVAL, 0),
                  e->comm, &recv[0]);
    for (int c = 0; c < chunks; c++) {
        int n = c == chunks - 1 ? data->count - c * mb : mb;
        for (int j = 0; j < n; j++) ids[j] = (int64_t)c * mb + j;
        const float *x = e->eval_in[c & 1];
        /* the previous chunk's output (which may alias its input buffer, when every layer
         * of the stage is the identity) must be gone before that buffer is reused */
        if (wait_request(e, &send, "send of the evaluation activation", c - 1, e->rank + 1))
            return -1;
        if (first) {
            load_pixels(e->eval_in[c & 1], data, ids, n);
        } else {
            if (wait_request(e, &recv[c & 1], "the evaluation activation", c, e->rank - 1))
                return -1;
            if (c + 1 < chunks)
                MPI_Irecv(e->eval_in[(c + 1) & 1], in_floats, MPI_FLOAT, e->rank - 1,
                          tag_of(TAG_EVAL, c + 1), e->comm, &recv[(c + 1) & 1]);
        }
        const float *y = stage_forward(&e->st, 0, x, n, ids, 0, 0, 0);
        if (last) {
            for (int j = 0; j < n; j++) labels[j] = data->labels[ids[j]];
            int ok = 0;
            loss_sum += kernel_softmax_xent_cpu(NULL, &ok, y, labels, n, e->net->classes, 1.0f);
            correct += ok;
        } else {
            MPI_Isend(y, (int)(n * e->out_count), MPI_FLOAT, e->rank + 1, tag_of(TAG_EVAL, c),
                      e->comm, &send);
        }
    }
    if (wait_request(e, &send, "send of the evaluation activation", chunks - 1, e->rank + 1))
        return -1;
    record(e, TRACE_EVAL, t_start, pt_now(), -1);
    double sums[2] = {loss_sum, (double)correct};
    if (exec_allreduce(sums, 2, MPI_DOUBLE, MPI_SUM, e->comm, e->cfg.timeout_s)) return -1;
    *loss = data->count ? sums[0] / data->count : 0;
    *accuracy = data->count ? sums[1] / data->count : 0;
    return 0;
}

int exec_gather_params(exec_t *e, float *all)
{
    int counts[e->size], displs[e->size];
    int mine = (int)e->st.param_count;
    if (MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, e->comm) != MPI_SUCCESS)
        return pt_error_set("MPI_Gather of parameter counts failed");
    if (e->rank == 0) {
        displs[0] = 0;
        for (int r = 1; r < e->size; r++) displs[r] = displs[r - 1] + counts[r - 1];
    }
    /* stages hold consecutive layers, so their blocks concatenate into the whole model */
    if (MPI_Gatherv(e->st.params, mine, MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, e->comm) !=
        MPI_SUCCESS)
        return pt_error_set("MPI_Gatherv of parameters failed");
    return 0;
}

void exec_get_stats(const exec_t *e, exec_stats *st)
{
    st->compute_s = e->compute_s;
    st->forward_s = e->forward_s;
    st->backward_s = e->backward_s;
    st->optimizer_s = e->optimizer_s;
    st->wall_s = e->wall_s;
    st->steps = e->steps;
    st->peak_act_bytes = (size_t)e->peak_inflight * e->st.slot_bytes;
    st->peak_microbatches = e->peak_inflight;
}

void exec_reset_stats(exec_t *e)
{
    e->compute_s = e->wall_s = e->forward_s = e->backward_s = e->optimizer_s = 0;
    e->steps = 0;
    e->peak_inflight = 0;
}

int exec_write_trace(exec_t *e, const char *path)
{
    /* Events travel as raw bytes: every rank runs the same binary on one architecture. */
    int bytes = (int)(e->trace.n * sizeof(trace_event));
    int counts[e->size], displs[e->size];
    MPI_Gather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, 0, e->comm);
    char *all = NULL;
    long total = 0;
    if (e->rank == 0) {
        for (int r = 0; r < e->size; r++) {
            displs[r] = (int)total;
            total += counts[r];
        }
        all = malloc(total ? (size_t)total : 1);
    }
    int ok = e->rank != 0 || all != NULL;
    MPI_Bcast(&ok, 1, MPI_INT, 0, e->comm);
    if (!ok) return pt_error_set("out of memory for the trace (%ld bytes)", total);
    MPI_Gatherv(e->trace.events, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, e->comm);
    int rc = 0;
    if (e->rank == 0) {
        rc = trace_write_json(path, (trace_event *)all, (int)(total / sizeof(trace_event)),
                              e->size);
        free(all);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, e->comm);
    return rc;
}
