/* Schedules as text, to edit and share (like torch.distributed.pipelining's CSV action
 * lists): a header line, then one line per list's settings and one per instruction.
 *
 *   schedule NAME stages K microbatches M virtual V placement interleaved|v
 *   list STAGE buckets B recompute 0|1          (only where not 0)
 *   STAGE OP MICROBATCH CHUNK PEER BUCKET       (OP as schedule_op_name: F, b, w, send_act..)
 *
 * '#' starts a comment; blank lines are skipped. Reading checks the syntax line by line and
 * then runs the verifier, whose message gains the line of the instruction it names. */
#include "schedule/schedule.h"

#include "src/base/error.h"
#include "src/base/io.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

int schedule_write(const schedule *s, FILE *out)
{
    fprintf(out, "# pipetrain schedule: one line per instruction: stage op micro-batch chunk "
                 "peer bucket\n");
    fprintf(out, "schedule %s stages %d microbatches %d virtual %d placement %s\n",
            s->name[0] ? s->name : "file", s->stages, s->microbatches, s->virtual_stages,
            s->placement == SCHED_PLACE_V ? "v" : "interleaved");
    if (s->origin[0]) fprintf(out, "# the search chose: %s\n", s->origin);
    for (int st = 0; st < s->stages; st++) {
        const schedule_list *l = &s->lists[st];
        if (l->buckets || l->recompute)
            fprintf(out, "list %d buckets %d recompute %d\n", st, l->buckets, l->recompute);
        for (int i = 0; i < l->n_ops; i++) {
            const schedule_op *op = &l->ops[i];
            fprintf(out, "%d %s %d %d %d %d\n", st, schedule_op_name(op->kind), op->microbatch,
                    op->chunk, op->peer, op->bucket);
        }
    }
    return ferror(out) ? pt_error_set("writing the schedule failed") : 0;
}

static int op_kind(const char *name)
{
    for (int k = 0; k < SCHED_OP_COUNT; k++)
        if (!strcmp(schedule_op_name((schedule_op_kind)k), name)) return k;
    return -1;
}

/* Whether every whole-number field of a line fits an int: sscanf's %d does not say when
 * one does not (4294967296 read as 0, a valid micro-batch). 0, or −1 with a message naming
 * the field. */
static int numbers_fit(const char *path, int line, const char *text)
{
    for (const char *t = text; *t;) {
        t += strspn(t, " \t");
        size_t len = strcspn(t, " \t");
        if (!len) break;
        size_t digits = strspn(t + (*t == '-' || *t == '+'), "0123456789");
        if (digits && digits + (*t == '-' || *t == '+') == len) {
            errno = 0;
            long long v = strtoll(t, NULL, 10);
            if (errno || v < INT_MIN || v > INT_MAX)
                return pt_error_set("%s line %d: the number %.*s is out of range", path, line,
                                    (int)(len > 40 ? 40 : len), t);
        }
        t += len;
    }
    return 0;
}

/* The header line into an empty schedule. */
static int read_header(schedule *s, const char *path, int line, const char *text)
{
    char name[64], place[32];
    int K, M, V;
    if (sscanf(text, "schedule %63s stages %d microbatches %d virtual %d placement %31s", name,
               &K, &M, &V, place) != 5)
        return pt_error_set("%s line %d: expected 'schedule NAME stages K microbatches M "
                            "virtual V placement interleaved|v'", path, line);
    if (K < 1 || K > 4096 || M < 1 || M > 1 << 20 || V < 1 || V > 64)
        return pt_error_set("%s line %d: stages %d, microbatches %d, virtual %d out of range",
                            path, line, K, M, V);
    int pl = !strcmp(place, "v") ? SCHED_PLACE_V
             : !strcmp(place, "interleaved") ? SCHED_PLACE_INTERLEAVED : -1;
    if (pl < 0)
        return pt_error_set("%s line %d: placement '%s': expected interleaved or v", path,
                            line, place);
    if (pl == SCHED_PLACE_V && V % 2)
        return pt_error_set("%s line %d: a V placement needs an even number of chunks per "
                            "rank (virtual %d)", path, line, V);
    if (schedule_init_empty(s, name, K, M)) return -1;
    s->virtual_stages = V;
    s->placement = pl;
    return 0;
}

/* One instruction or list line; line_of[st] grows with the list. */
static int read_line(schedule *s, const char *path, int line, const char *text, int **line_of)
{
    int st, a, b, n = 0;
    if (sscanf(text, "list %d buckets %d recompute %d %n", &st, &a, &b, &n) == 3) {
        if (text[n] || st < 0 || st >= s->stages || a < 0 || b < 0 || b > 1)
            return pt_error_set("%s line %d: list line out of range", path, line);
        s->lists[st].buckets = a;
        s->lists[st].recompute = b;
        return 0;
    }
    char op[32];
    schedule_op o = {0};
    n = 0;
    if (sscanf(text, "%d %31s %d %d %d %d %n", &st, op, &o.microbatch, &o.chunk, &o.peer,
               &o.bucket, &n) != 6 || text[n])
        return pt_error_set("%s line %d: expected 'STAGE OP MICROBATCH CHUNK PEER BUCKET' "
                            "(six fields), got '%s'", path, line, text);
    if (st < 0 || st >= s->stages)
        return pt_error_set("%s line %d: stage %d out of range [0, %d)", path, line, st,
                            s->stages);
    int k = op_kind(op);
    if (k < 0)
        return pt_error_set("%s line %d: unknown instruction '%s' (F, B, b, w, R, recv_act, "
                            "send_act, recv_grad, send_grad, allreduce, reduce_wait, "
                            "optimizer_step)", path, line, op);
    o.kind = (schedule_op_kind)k;
    schedule_list *l = &s->lists[st];
    int *grown = realloc(line_of[st], ((size_t)l->n_ops + 1) * sizeof *grown);
    if (!grown) return pt_error_set("out of memory");
    line_of[st] = grown;
    grown[l->n_ops] = line;
    return schedule_append_op(s, st, o);
}

/* The verifier's message, with the file's line of the op it names ("stage S op I"). */
static int rejected(const schedule *s, const char *path, int **line_of)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", pt_error_get());
    const char *at = strstr(why, "stage ");
    int st, i;
    while (at && sscanf(at, "stage %d op %d", &st, &i) != 2) at = strstr(at + 1, "stage ");
    if (at && st >= 0 && st < s->stages && i >= 0 && i < s->lists[st].n_ops)
        return pt_error_set("%s line %d: the verifier rejects the schedule: %s", path,
                            line_of[st][i], why);
    return pt_error_set("%s: the verifier rejects the schedule: %s", path, why);
}

int schedule_read(schedule *s, const char *path)
{
    memset(s, 0, sizeof *s);
    /* a FIFO or a directory is refused with what it is, never blocks the open */
    FILE *f = pt_fopen_regular(path, "r");
    if (!f) return -1;
    char buf[512];
    int line = 0, rc = 0, have = 0;
    int **line_of = NULL;
    while (!rc && fgets(buf, sizeof buf, f)) {
        line++;
        /* a longer line would be read as two: its tail taken for an instruction of its own */
        if (!strchr(buf, '\n') && !feof(f)) {
            rc = pt_error_set("%s line %d: longer than %zu characters", path, line,
                              sizeof buf - 2);
            break;
        }
        char *hash = strchr(buf, '#');
        if (hash) *hash = '\0';
        size_t len = strlen(buf);
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ' || buf[len - 1] == '\r'))
            buf[--len] = '\0';
        char *text = buf + strspn(buf, " \t");
        if (!*text) continue;
        if ((rc = numbers_fit(path, line, text))) break;
        if (!have) {
            rc = read_header(s, path, line, text);
            have = !rc;
            if (have && !(line_of = calloc((size_t)s->stages, sizeof *line_of)))
                rc = pt_error_set("out of memory");
            continue;
        }
        rc = read_line(s, path, line, text, line_of);
    }
    if (!rc && ferror(f)) rc = pt_error_set("reading %s failed", path);
    if (!rc && !have) rc = pt_error_set("%s: no 'schedule ...' header line", path);
    fclose(f);
    /* every stage runs a forward per micro-batch and chunk: a header whose counts its lists
     * cannot hold is refused before those counts size the verifier's tables (a few header
     * numbers asked it for terabytes) */
    for (int st = 0; !rc && st < s->stages; st++)
        if ((long long)s->lists[st].n_ops < (long long)s->microbatches * s->virtual_stages)
            rc = pt_error_set("%s: stage %d has %d instructions, fewer than the forward passes "
                              "of its %d micro-batches x %d chunks", path, st,
                              s->lists[st].n_ops, s->microbatches, s->virtual_stages);
    if (!rc && schedule_verify(s, NULL)) rc = rejected(s, path, line_of);
    for (int st = 0; line_of && st < s->stages; st++) free(line_of[st]);
    free(line_of);
    if (rc) schedule_free(s);
    return rc;
}
