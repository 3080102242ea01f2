#include "src/runtime/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/base/output.h"

static const char *const names[TRACE_KIND_COUNT] = {
    "forward", "backward", "send_act", "send_grad", "wait_act",
    "wait_grad", "optimizer", "sync", "eval", "reduce",
    "backward_input", "backward_weight", "recompute", "tensor",
};

/* Each rank's process has two threads (tracks): what it computes, and what it sends,
 * waits for and synchronises. On a GPU the two overlap in time, and one track would hold
 * slices that cross without nesting, which viewers draw wrongly. */
enum { TID_COMPUTE = 0, TID_MESSAGES = 1 };

const char *trace_kind_name(trace_kind k)
{
    return (unsigned)k < TRACE_KIND_COUNT ? names[k] : "unknown";
}

int trace_add(trace_log *t, const trace_event *ev)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 1024;
        trace_event *events = realloc(t->events, (size_t)cap * sizeof *events);
        if (!events) return -1;
        t->events = events;
        t->cap = cap;
    }
    t->events[t->n++] = *ev;
    return 0;
}

void trace_free(trace_log *t)
{
    free(t->events);
    memset(t, 0, sizeof *t);
}

long long trace_flow_id(long step, int backward, int microbatch, int microbatches, int sender,
                        int ranks)
{
    return (((long long)step * 2 + backward) * microbatches + microbatch) * ranks + sender;
}

void trace_clock_add(trace_clock *c, double at, double offset, double error)
{
    int i = c->n < 2 ? c->n++ : 1;
    c->at[i] = at;
    c->offset[i] = offset;
    c->error[i] = error;
}

/* Two measurements that agree within their errors show no drift: the better one is then
 * used alone (a worse one would only add its error to the slope). */
static int clock_drifts(const trace_clock *c)
{
    return c->n == 2 && c->at[1] != c->at[0] &&
           fabs(c->offset[1] - c->offset[0]) > c->error[0] + c->error[1];
}

double trace_clock_to_rank0(const trace_clock *c, double t)
{
    if (c->n == 0) return t;
    if (clock_drifts(c))
        return t - (c->offset[0] + (c->offset[1] - c->offset[0]) * (t - c->at[0]) /
                                       (c->at[1] - c->at[0]));
    return t - (c->n == 2 && c->error[1] < c->error[0] ? c->offset[1] : c->offset[0]);
}

static int is_compute(trace_kind k)
{
    return k == TRACE_FORWARD || k == TRACE_BACKWARD || k == TRACE_OPTIMIZER ||
           k == TRACE_EVAL || k == TRACE_BACKWARD_INPUT || k == TRACE_BACKWARD_WEIGHT ||
           k == TRACE_RECOMPUTE;
}

/* Streams the trace: one event per line inside the array, each encoded by jansson. The
 * first failure sticks: err (an errno) for output, oom for encoding. */
typedef struct {
    FILE *f;
    long count;
    int err, oom;
} writer;

/* Writes and releases obj (NULL: its construction failed). */
static void emit(writer *w, json_t *obj)
{
    if (!obj) w->oom = 1;
    if (w->err || w->oom) {
        json_decref(obj);
        return;
    }
    errno = 0;
    if ((w->count++ && fputs(",\n", w->f) == EOF) ||
        json_dumpf(obj, w->f, JSON_COMPACT | JSON_REAL_PRECISION(15)) != 0)
        w->err = errno ? errno : EIO;
    json_decref(obj);
}

/* Microseconds with nanosecond resolution, so that the text stays short and exact. */
static double us_of(long long ns) { return (double)ns / 1e3; }

static json_t *meta(const char *name, int pid, int tid, json_t *args)
{
    json_t *o = json_pack("{s:s, s:s, s:i, s:o}", "name", name, "ph", "M", "pid", pid, "args",
                          args);
    if (o && tid >= 0 && json_object_set_new(o, "tid", json_integer(tid))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void write_metadata(writer *w, const trace_rank *ranks, int n_ranks)
{
    for (int r = 0; r < n_ranks; r++) {
        const trace_rank *k = &ranks[r];
        char label[192], replica[32] = "", tensor[32] = "";
        if (k->replicas > 1) snprintf(replica, sizeof replica, " \u00b7 replica %d", k->replica);
        if (k->tensors > 1) snprintf(tensor, sizeof tensor, " \u00b7 tensor %d", k->tensor);
        snprintf(label, sizeof label, "rank %d \u00b7 stage %d%s%s \u00b7 host %s", k->rank,
                 k->stage, replica, tensor, k->host);
        emit(w, meta("process_name", k->rank, -1, json_pack("{s:s}", "name", label)));
        emit(w, meta("process_sort_index", k->rank, -1,
                     json_pack("{s:i}", "sort_index", k->rank)));
        emit(w, meta("thread_name", k->rank, TID_COMPUTE, json_pack("{s:s}", "name", "compute")));
        emit(w, meta("thread_name", k->rank, TID_MESSAGES,
                     json_pack("{s:s}", "name", "messages and syncs")));
        emit(w, meta("thread_sort_index", k->rank, TID_COMPUTE,
                     json_pack("{s:i}", "sort_index", TID_COMPUTE)));
        emit(w, meta("thread_sort_index", k->rank, TID_MESSAGES,
                     json_pack("{s:i}", "sort_index", TID_MESSAGES)));
    }
}

/* t (seconds since rank r's origin, on its clock) in nanoseconds on rank 0's. */
static long long ns_of(const trace_rank *ranks, int r, double t)
{
    double t0 = trace_clock_to_rank0(&ranks[r].clock, ranks[r].origin + t) -
                trace_clock_to_rank0(&ranks[0].clock, ranks[0].origin);
    return llround(t0 * 1e9);
}

static void write_event(writer *w, const trace_event *e, const trace_rank *ranks)
{
    trace_kind kind = (trace_kind)e->kind;
    const char *cat = trace_kind_name(kind);
    char name[48];
    int reduce = kind == TRACE_REDUCE; /* its microbatch is the bucket */
    if (reduce)
        snprintf(name, sizeof name, "reduce bucket %d", e->microbatch);
    else if (e->microbatch >= 0 && e->chunk > 0) /* as the schedule's printer: m.v */
        snprintf(name, sizeof name, "%s %d.%d", cat, e->microbatch, e->chunk);
    else if (e->microbatch >= 0)
        snprintf(name, sizeof name, "%s %d", cat, e->microbatch);
    else
        snprintf(name, sizeof name, "%s", cat);
    long long t0 = ns_of(ranks, e->rank, e->t0), t1 = ns_of(ranks, e->rank, e->t1);
    if (t1 < t0) t1 = t0;
    int tid = is_compute(kind) ? TID_COMPUTE : TID_MESSAGES;
    json_t *args = json_pack("{s:I}", "step", (json_int_t)e->step);
    if (args && e->microbatch >= 0 &&
        json_object_set_new(args, reduce ? "bucket" : "microbatch", json_integer(e->microbatch)))
        args = (json_decref(args), NULL);
    if (args && e->chunk > 0 && json_object_set_new(args, "chunk", json_integer(e->chunk)))
        args = (json_decref(args), NULL);
    if (args && (reduce || kind == TRACE_TENSOR) &&
        json_object_set_new(args, "bytes", json_integer(e->bytes)))
        args = (json_decref(args), NULL);
    if (args && e->flow >= 0 && json_object_set_new(args, "flow", json_integer(e->flow)))
        args = (json_decref(args), NULL);
    emit(w, args ? json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:o}", "name", name, "cat",
                             cat, "ph", "X", "pid", e->rank, "tid", tid, "ts", us_of(t0),
                             "dur", us_of(t1 - t0), "args", args)
                 : NULL);
    if (e->flow < 0) return;
    /* A flow from the send to its receive: "s" where the send's slice starts (the message
     * cannot have left earlier), "f" where the wait's slice ends (it had arrived by then),
     * bound to that slice ("bp":"e"), so 1 ns before its end to stay inside it when both
     * are rounded; both ends name it alike. Midpoints would draw an arrow back in time
     * whenever the send came in the second half of the wait. */
    int send = kind == TRACE_SEND_ACT || kind == TRACE_SEND_GRAD;
    int grad = kind == TRACE_SEND_GRAD || kind == TRACE_WAIT_GRAD;
    json_t *flow = json_pack("{s:s, s:s, s:s, s:I, s:i, s:i, s:f}", "name",
                             grad ? "gradient" : "activation", "cat", "message", "ph",
                             send ? "s" : "f", "id", (json_int_t)e->flow, "pid", e->rank,
                             "tid", tid, "ts", us_of(send || t1 - 1 < t0 ? t0 : t1 - 1));
    if (flow && !send && json_object_set_new(flow, "bp", json_string("e")))
        flow = (json_decref(flow), NULL);
    emit(w, flow);
}

/* The schedule the ranks ran, so that a trace says which one it shows: a searched one
 * names its winner (schedule_origin), a file's the name the file gave. */
static json_t *schedule_data(const trace_rank *r)
{
    return json_pack("{s:s, s:o, s:i, s:i}", "name", r->schedule[0] ? r->schedule : "unknown",
                     "origin", r->schedule_origin[0] ? json_string(r->schedule_origin)
                                                     : json_null(),
                     "microbatches", r->microbatches, "chunks_per_rank", r->chunks);
}

static json_t *other_data(const trace_rank *ranks, int n_ranks)
{
    json_t *list = json_array();
    for (int r = 0; list && r < n_ranks; r++) {
        const trace_clock *c = &ranks[r].clock;
        /* the bound on the error of the offset applied to an event */
        double error = c->n ? c->error[0] : 0, drift = 0;
        if (clock_drifts(c)) {
            if (c->error[1] > error) error = c->error[1];
            drift = (c->offset[1] - c->offset[0]) / (c->at[1] - c->at[0]);
        } else if (c->n == 2 && c->error[1] < error) {
            error = c->error[1];
        }
        if (json_array_append_new(
                list, json_pack("{s:i, s:i, s:s, s:f, s:f, s:f}", "rank", ranks[r].rank, "stage",
                                ranks[r].stage, "host", ranks[r].host, "clock_offset_us",
                                (ranks[r].origin - trace_clock_to_rank0(c, ranks[r].origin)) * 1e6,
                                "clock_error_us", error * 1e6,
                                "clock_drift_ppm", drift * 1e6)))
            list = (json_decref(list), NULL);
    }
    json_t *sched = list ? schedule_data(&ranks[0]) : NULL;
    if (!sched) {
        json_decref(list);
        return NULL;
    }
    return json_pack("{s:s, s:s, s:o, s:o}", "generator", "pipetrain", "clock",
                     "each rank's CLOCK_MONOTONIC, aligned to rank 0's by ping-pong "
                     "(docs/TRACE.md)", "schedule", sched, "ranks", list);
}

static void write_all(writer *w, const trace_event *events, int n, const trace_rank *ranks,
                      int n_ranks)
{
    json_t *other = other_data(ranks, n_ranks);
    if (!other) {
        w->oom = 1;
        return;
    }
    errno = 0;
    if (fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":", w->f) == EOF ||
        json_dumpf(other, w->f, JSON_COMPACT | JSON_REAL_PRECISION(15)) != 0 ||
        fputs(",\"traceEvents\":[\n", w->f) == EOF)
        w->err = errno ? errno : EIO;
    json_decref(other);
    write_metadata(w, ranks, n_ranks);
    for (int i = 0; i < n && !w->err && !w->oom; i++)
        if (events[i].rank >= 0 && events[i].rank < n_ranks) write_event(w, &events[i], ranks);
    errno = 0;
    if (!w->err && !w->oom && fputs("\n]}\n", w->f) == EOF) w->err = errno ? errno : EIO;
}

/* The trace goes through src/base/output.h: an exclusive temporary under an unguessable name
 * beside FILE, never through a link, renamed over FILE when whole. A FIFO or a device as
 * FILE (even /dev/stdout) is refused: train refuses it at start. */
int trace_write_json(const char *path, const trace_event *events, int n,
                     const trace_rank *ranks, int n_ranks)
{
    pt_output out;
    if (pt_output_begin(&out, path)) {
        char why[1024];
        snprintf(why, sizeof why, "%s", pt_error_get());
        return pt_error_set("cannot write trace %s: %s", path, why);
    }
    int fd = dup(out.fd);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        int err = errno;
        if (fd >= 0) close(fd);
        pt_output_abort(&out);
        return pt_error_set("cannot write trace %s: %s", path, strerror(err));
    }
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    writer w = {.f = f};
    write_all(&w, events, n, ranks, n_ranks);
    errno = 0;
    if (!w.err && fflush(f) != 0) w.err = errno ? errno : EIO;
    if (fclose(f) != 0 && !w.err) w.err = errno ? errno : EIO;
    if (!w.err && !w.oom) return pt_output_commit(&out);
    pt_output_abort(&out);
    if (w.oom)
        return pt_error_set("cannot write trace %s: encoding failed (out of memory, or a host "
                            "name that is not UTF-8)", path);
    return pt_error_set("cannot write trace %s: %s", path, strerror(w.err));
}
