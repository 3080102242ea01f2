/* trace: clock alignment (offset and drift), the JSON the writer streams (processes,
 * threads, flows), and a failed write that leaves nothing behind. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/base/error.h"
#include "src/runtime/trace.h"

static char tmpdir[64];
static char path[160];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt_test_trace_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    snprintf(path, sizeof path, "%s/t.json", tmpdir);
}

static void remove_tmpdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(trace, .init = make_tmpdir, .fini = remove_tmpdir);

Test(trace, clock_offset_and_drift)
{
    trace_clock c = {.n = 0};
    cr_assert_float_eq(trace_clock_to_rank0(&c, 5.0), 5.0, 1e-12, "no measurement: as is");
    /* 2 s ahead at t = 10, 2.001 s ahead at t = 20: 100 µs per 10 s */
    trace_clock_add(&c, 10.0, 2.0, 1e-6);
    cr_assert_float_eq(trace_clock_to_rank0(&c, 12.0), 10.0, 1e-12);
    trace_clock_add(&c, 20.0, 2.001, 1e-6);
    cr_assert_float_eq(trace_clock_to_rank0(&c, 15.0), 15.0 - 2.0005, 1e-12);
    cr_assert_float_eq(trace_clock_to_rank0(&c, 20.0), 20.0 - 2.001, 1e-12);
    /* measurements that agree within their errors show no drift: the better one counts */
    trace_clock d = {.n = 0};
    trace_clock_add(&d, 10.0, 2.0, 50e-6);
    trace_clock_add(&d, 20.0, 2.00001, 1e-6);
    cr_assert_float_eq(trace_clock_to_rank0(&d, 10.0), 10.0 - 2.00001, 1e-12);
    /* a third replaces the second */
    trace_clock_add(&d, 30.0, 2.5, 1e-6);
    cr_assert_eq(d.n, 2);
    cr_assert_float_eq(d.at[1], 30.0, 0);
}

Test(trace, flow_ids_are_unique)
{
    enum { STEPS = 3, M = 5, RANKS = 4 };
    long long seen[STEPS * 2 * M * RANKS];
    int n = 0;
    for (long s = 0; s < STEPS; s++)
        for (int g = 0; g < 2; g++)
            for (int m = 0; m < M; m++)
                for (int r = 0; r < RANKS; r++) {
                    long long id = trace_flow_id(s, g, m, M, r, RANKS);
                    for (int i = 0; i < n; i++) cr_assert_neq(seen[i], id);
                    seen[n++] = id;
                }
}

static json_t *find(json_t *events, const char *ph, const char *name, int pid)
{
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), ph) == 0 &&
            (!name || strcmp(json_string_value(json_object_get(e, "name")), name) == 0) &&
            json_integer_value(json_object_get(e, "pid")) == pid)
            return e;
    }
    return NULL;
}

Test(trace, writes_processes_threads_and_flows_on_rank0_clock)
{
    /* rank 1's clock is 3 s ahead of rank 0's; its origin is 1 ms after rank 0's */
    trace_rank ranks[2] = {
        {.rank = 0, .stage = 0, .host = "a", .origin = 100.0},
        {.rank = 1, .stage = 1, .host = "b\"q", .origin = 103.001},
    };
    trace_clock_add(&ranks[0].clock, 100.0, 0, 0);
    trace_clock_add(&ranks[1].clock, 103.0, 3.0, 1e-7);
    long long id = trace_flow_id(0, 0, 2, 4, 0, 2);
    trace_event ev[] = {
        {.t0 = 0.010, .t1 = 0.011, .kind = TRACE_SEND_ACT, .microbatch = 2, .rank = 0, .flow = id},
        {.t0 = 0.0095, .t1 = 0.0105, .kind = TRACE_WAIT_ACT, .microbatch = 2, .rank = 1, .flow = id},
        {.t0 = 0.02, .t1 = 0.03, .kind = TRACE_OPTIMIZER, .microbatch = -1, .rank = 1, .flow = -1},
    };
    cr_assert_eq(trace_write_json(path, ev, 3, ranks, 2), 0, "%s", pt_error_get());
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    cr_assert_not_null(doc, "invalid JSON: %s (line %d)", jerr.text, jerr.line);
    json_t *events = json_object_get(doc, "traceEvents");
    json_t *p1 = find(events, "M", "process_name", 1);
    cr_assert_not_null(p1);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(p1, "args"), "name")),
                     "rank 1 \u00b7 stage 1 \u00b7 host b\"q");
    cr_assert_not_null(find(events, "M", "process_sort_index", 1));
    json_t *wait = find(events, "X", "wait_act 2", 1);
    cr_assert_not_null(wait);
    /* rank 1's 103.001 + 0.0095 is rank 0's 100.0105: 10500 µs after rank 0's origin */
    cr_assert_float_eq(json_real_value(json_object_get(wait, "ts")), 10500.0, 1e-3);
    cr_assert_float_eq(json_real_value(json_object_get(wait, "dur")), 1000.0, 1e-3);
    json_t *s = find(events, "s", "activation", 0), *f = find(events, "f", "activation", 1);
    cr_assert(s && f, "a flow start on rank 0 and its end on rank 1");
    cr_assert_eq(json_integer_value(json_object_get(s, "id")), id);
    cr_assert_eq(json_integer_value(json_object_get(f, "id")), id);
    cr_assert_str_eq(json_string_value(json_object_get(f, "bp")), "e");
    cr_assert_eq(json_integer_value(json_object_get(f, "tid")),
                 json_integer_value(json_object_get(wait, "tid")));
    json_t *opt = find(events, "X", "optimizer", 1);
    cr_assert_null(json_object_get(json_object_get(opt, "args"), "microbatch"), "no −1");
    cr_assert_neq(json_integer_value(json_object_get(opt, "tid")),
                  json_integer_value(json_object_get(wait, "tid")), "compute apart from waits");
    json_decref(doc);
}

static int entries(const char *dir)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 0", dir);
    return system(cmd) == 0 ? 0 : 1;
}

Test(trace, failure_names_path_and_reason_and_leaves_nothing)
{
    trace_rank r = {.rank = 0, .host = "a"};
    trace_event ev = {.t0 = 0, .t1 = 1, .kind = TRACE_FORWARD, .rank = 0, .flow = -1};
    char bad[200];
    snprintf(bad, sizeof bad, "%s/missing/t.json", tmpdir);
    cr_assert_eq(trace_write_json(bad, &ev, 1, &r, 1), -1);
    cr_assert(strstr(pt_error_get(), bad) && strstr(pt_error_get(), "No such file"), "%s",
              pt_error_get());
    cr_assert_eq(trace_write_json(tmpdir, &ev, 1, &r, 1), -1);
    cr_assert(strstr(pt_error_get(), "is a directory"), "%s", pt_error_get());
    cr_assert_eq(entries(tmpdir), 0, "nothing written");
    /* a good write replaces an old file whole, leaving no temporary beside it */
    FILE *old = fopen(path, "w");
    fputs("old", old);
    fclose(old);
    cr_assert_eq(trace_write_json(path, &ev, 1, &r, 1), 0, "%s", pt_error_get());
    char cmd[200];
    snprintf(cmd, sizeof cmd, "test \"$(ls -A '%s')\" = t.json", tmpdir);
    cr_assert_eq(system(cmd), 0, "only t.json remains");
    /* a device is refused, neither written in place nor replaced (issue 23 item 4) */
    cr_assert_eq(trace_write_json("/dev/null", &ev, 1, &r, 1), -1);
    cr_assert(strstr(pt_error_get(), "/dev/null") && strstr(pt_error_get(), "device"), "%s",
              pt_error_get());
    struct stat st;
    cr_assert(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    /* a link planted at the path is replaced by the trace, its target left alone */
    char victim[200];
    snprintf(victim, sizeof victim, "%s/victim", tmpdir);
    FILE *v = fopen(victim, "w");
    fputs("precious", v);
    fclose(v);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(symlink(victim, path), 0);
    cr_assert_eq(trace_write_json(path, &ev, 1, &r, 1), 0, "%s", pt_error_get());
    cr_assert(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "the link is replaced");
    cr_assert(stat(victim, &st) == 0 && st.st_size == 8, "the link's target is untouched");
}
