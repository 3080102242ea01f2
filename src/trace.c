#include "src/trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"

static const char *const names[TRACE_KIND_COUNT] = {
    "forward", "backward", "send_act", "send_grad", "wait_act",
    "wait_grad", "optimizer", "sync", "eval", "reduce",
};

const char *trace_kind_name(trace_kind k)
{
    return (unsigned)k < TRACE_KIND_COUNT ? names[k] : "unknown";
}

int trace_add(trace_log *t, trace_kind kind, double t0, double t1, int microbatch, int rank,
              long step)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 1024;
        trace_event *ev = realloc(t->events, (size_t)cap * sizeof *ev);
        if (!ev) return -1;
        t->events = ev;
        t->cap = cap;
    }
    t->events[t->n++] = (trace_event){t0, t1, (int)kind, microbatch, rank, step};
    return 0;
}

void trace_free(trace_log *t)
{
    free(t->events);
    memset(t, 0, sizeof *t);
}

int trace_write_json(const char *path, const trace_event *events, int n, int ranks)
{
    FILE *f = fopen(path, "w");
    if (!f) return pt_error_set("cannot write trace %s: %s", path, strerror(errno));
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"pipetrain\"}}");
    for (int r = 0; r < ranks; r++)
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                   "\"args\":{\"name\":\"rank %d (stage %d)\"}}", r, r, r);
    for (int i = 0; i < n; i++) {
        const trace_event *e = &events[i];
        const char *kind = trace_kind_name((trace_kind)e->kind);
        char label[48];
        if (e->microbatch >= 0)
            snprintf(label, sizeof label, "%s %d", kind, e->microbatch);
        else
            snprintf(label, sizeof label, "%s", kind);
        fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":0,\"tid\":%d,"
                   "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"microbatch\":%d,\"step\":%ld}}",
                label, kind, e->rank, e->t0 * 1e6, (e->t1 - e->t0) * 1e6, e->microbatch, e->step);
    }
    fprintf(f, "\n]}\n");
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) return pt_error_set("cannot write trace %s: %s", path, strerror(errno));
    return 0;
}
