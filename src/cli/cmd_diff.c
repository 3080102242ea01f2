/* `pipetrain diff`: two safetensors checkpoints compared tensor by tensor. */
#include <math.h>
#include <stdio.h>

#include "src/base/error.h"
#include "src/base/options.h"
#include "src/cli/commands.h"
#include "src/io/safetensors.h"

enum { O_RTOL = 1, O_HELP };

static const opt_spec diff_opts[] = {
    {.id = O_RTOL, .name = "rtol", .kind = OPT_REAL, .arg = "X", .min = 0, .max = 1e30,
     .def = "0", .help = "fail when a tensor's largest |a-b| exceeds X times its largest |b| "
                         "(0: bit-identical)"},
    {.id = O_HELP, .name = "help", .shared = 1},
    {0},
};
static const opt_command diff_command = {
    .name = "diff",
    .usage = "pipetrain diff A.safetensors B.safetensors [--rtol X]",
    .about = "Compares two checkpoints tensor by tensor: the largest absolute and relative "
             "difference of each, and the tensors only one file holds or whose shapes differ. "
             "Exits 1 when they differ beyond the tolerance.",
    .opts = diff_opts,
    .operands = 2,
};

static void format_shape(char *buf, size_t size, const st_tensor *t)
{
    int n = snprintf(buf, size, "[");
    for (int d = 0; d < t->ndim && n < (int)size; d++)
        n += snprintf(buf + n, size - (size_t)n, "%s%ld", d ? ", " : "", t->shape[d]);
    if (n < (int)size) snprintf(buf + n, size - (size_t)n, "]");
}

/* What the comparison found so far. */
typedef struct {
    int only_a, only_b, reshaped, exceeds, compared;
    double worst; /* the largest relative difference */
} diff_counts;

/* Tensor x of A against y, B's of the same name (NULL: none): its line, and what it counts. */
static void diff_tensor(const st_tensor *x, const st_tensor *y, double rtol, diff_counts *c)
{
    char sa[96], sb[96];
    long count = 1;
    for (int d = 0; d < x->ndim; d++) count *= x->shape[d];
    format_shape(sa, sizeof sa, x);
    if (!y) {
        printf("%-24s only in A: %s\n", x->name, sa);
        c->only_a++;
        return;
    }
    int same_shape = y->ndim == x->ndim;
    for (int d = 0; same_shape && d < x->ndim; d++) same_shape = x->shape[d] == y->shape[d];
    if (!same_shape) {
        format_shape(sb, sizeof sb, y);
        printf("%-24s shape differs: A %s vs B %s\n", x->name, sa, sb);
        c->reshaped++;
        return;
    }
    double max_abs = 0, max_ref = 0;
    for (long i = 0; i < count; i++) {
        double d = fabs((double)x->data[i] - (double)y->data[i]);
        if (d > max_abs || d != d) max_abs = d != d ? INFINITY : d;
        if (fabs((double)y->data[i]) > max_ref) max_ref = fabs((double)y->data[i]);
    }
    double rel = max_ref > 0 ? max_abs / max_ref : max_abs;
    c->compared++;
    if (rel > c->worst) c->worst = rel;
    int over = rel > rtol;
    c->exceeds |= over;
    printf("%-24s %9ld values  max |a-b| %.3e  relative %.3e%s\n", x->name, count, max_abs,
           rel, over ? "  EXCEEDS" : "");
}

/* Every tensor's line and the verdict; 1 when the files differ beyond rtol. */
static int diff_files(const st_file *a, const st_file *b, const char *const paths[2],
                      double rtol)
{
    diff_counts c = {0};
    for (int t = 0; t < a->count; t++)
        diff_tensor(&a->tensors[t], st_find(b, a->tensors[t].name), rtol, &c);
    for (int t = 0; t < b->count; t++)
        if (!st_find(a, b->tensors[t].name)) {
            char sb[96];
            format_shape(sb, sizeof sb, &b->tensors[t]);
            printf("%-24s only in B: %s\n", b->tensors[t].name, sb);
            c.only_b++;
        }
    int bad = c.exceeds;
    if (c.only_a || c.only_b || c.reshaped) {
        printf("A = %s (%d tensor%s), B = %s (%d tensor%s): %d only in A, %d only in B, "
               "%d with different shapes\n", paths[0], a->count, a->count == 1 ? "" : "s",
               paths[1], b->count, b->count == 1 ? "" : "s", c.only_a, c.only_b, c.reshaped);
        bad = 1;
    }
    if (!c.compared && (a->count || b->count)) /* no figure to give: none was measured */
        printf("DIFFERENT: no tensor of the same name and shape in both files\n");
    else
        printf("%s: largest relative difference %.3e over %d tensor%s (tolerance %.1e)\n",
               bad ? "DIFFERENT" : (c.worst == 0 ? "IDENTICAL" : "WITHIN TOLERANCE"), c.worst,
               c.compared, c.compared == 1 ? "" : "s", rtol);
    return bad;
}

/* Largest absolute and relative difference per tensor; fails above the tolerance. Names
 * the tensors that only one file holds and those whose shapes differ. */
int cmd_diff(int argc, char **argv)
{
    double rtol = 0;
    opt_parser p;
    if (opt_parser_init(&p, &diff_command, argc, argv)) return cli_usage_fail();
    int id;
    while ((id = opt_next(&p)) > 0) {
        if (id == O_RTOL) rtol = p.real;
        if (id == O_HELP) {
            opt_print_help(&diff_command, stdout);
            return PT_EXIT_OK;
        }
    }
    if (id == OPT_ERROR) return cli_usage_fail();
    const char *const paths[2] = {p.operands[0], p.operands[1]};
    st_file a, b;
    if (st_read(&a, paths[0])) return cli_input_fail();
    if (st_read(&b, paths[1])) {
        st_free(&a);
        return cli_input_fail();
    }
    int bad = diff_files(&a, &b, paths, rtol);
    st_free(&a);
    st_free(&b);
    return bad ? PT_EXIT_FAIL : PT_EXIT_OK;
}
