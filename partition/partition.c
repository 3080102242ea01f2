/* Cutting a layer list into K contiguous pipeline stages: uniform, exact min-max, explicit
 * counts, and the method switch used by the command line. The table printer and the
 * imbalance measure live in partition/print.c. */
#include "partition/partition.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"

/* Long user-supplied lists are cut in messages so that the reason still fits. */
#define LIST_SHOWN 200

int partition_check(int n_layers, int stages)
{
    if (stages < 1)
        return pt_error_set("the number of pipeline stages must be at least 1 (got %d)", stages);
    if (n_layers < 1)
        return pt_error_set("cannot cut %d layers into %d stage%s: the model has no layers",
                            n_layers, stages, stages == 1 ? "" : "s");
    if (stages > n_layers)
        return pt_error_set("cannot cut %d layer%s into %d stages: a stage would be empty",
                            n_layers, n_layers == 1 ? "" : "s", stages);
    return 0;
}

/* Clears *p and checks the sizes, so that every function below leaves a partition that
 * partition_free accepts, whether it succeeds or not. */
static int partition_start(partition *p, int n_layers, int stages, const char *who)
{
    if (!p)
        return pt_error_set("%s: no partition to fill (NULL)", who);
    *p = (partition){0};
    return partition_check(n_layers, stages);
}

static int partition_alloc(partition *p, int n_layers, int stages)
{
    p->first = malloc(((size_t)stages + 1) * sizeof *p->first);
    if (!p->first)
        return pt_error_set("out of memory for a partition of %d stages", stages);
    p->stages = stages;
    p->n_layers = n_layers;
    return 0;
}

void partition_free(partition *p)
{
    if (!p)
        return;
    free(p->first);
    *p = (partition){0};
}

void partition_profile_free(partition_profile *prof)
{
    if (!prof)
        return;
    free(prof->fwd_s);
    free(prof->bwd_s);
    free(prof->bwd_input_s);
    free(prof->bwd_weight_s);
    *prof = (partition_profile){0};
}

int partition_uniform(partition *p, int n_layers, int stages)
{
    if (partition_start(p, n_layers, stages, "partition_uniform") ||
        partition_alloc(p, n_layers, stages))
        return -1;
    int base = n_layers / stages, extra = n_layers % stages;
    p->first[0] = 0;
    for (int s = 0; s < stages; s++)
        p->first[s + 1] = p->first[s] + base + (s < extra ? 1 : 0);
    return 0;
}

/* ---- exact min-max ----
 *
 * h[k][i] is the smallest possible largest-stage cost when layers [i, n) are cut into k
 * non-empty stages. Stage sums are always accumulated from the stage's first layer upwards,
 * both in the table and in the reconstruction, so the two see bit-identical numbers and the
 * comparison with the optimum is exact (no tolerance is needed or used). */

static double *min_max_table(const double *cost, int n, int stages)
{
    size_t row = (size_t)n + 1;
    double *h = malloc(((size_t)stages + 1) * row * sizeof *h);
    if (!h)
        return NULL;
    /* One stage takes everything that is left. */
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int l = i; l < n; l++)
            s += cost[l];
        h[row + (size_t)i] = s;
    }
    for (int k = 2; k <= stages; k++) {
        /* With k stages left, layers [i, n) need n − i ≥ k, and the first of them may end
         * no later than n − (k − 1) so that each later stage still gets a layer. */
        for (int i = 0; i <= n - k; i++) {
            double best = INFINITY, s = 0;
            for (int j = i + 1; j <= n - (k - 1); j++) {
                s += cost[j - 1];
                /* Costs are ≥ 0, so s only grows with j: once it reaches the best value
                 * no longer first stage can do better. */
                if (s >= best)
                    break;
                double m = fmax(s, h[(size_t)(k - 1) * row + (size_t)j]);
                if (m < best)
                    best = m;
            }
            h[(size_t)k * row + (size_t)i] = best;
        }
    }
    return h;
}

int partition_min_max(partition *p, const double *cost, int n_layers, int stages)
{
    if (partition_start(p, n_layers, stages, "partition_min_max"))
        return -1;
    if (!cost)
        return pt_error_set("partition_min_max: no layer costs given (NULL)");
    double total = 0;
    for (int l = 0; l < n_layers; l++) {
        if (!isfinite(cost[l]) || cost[l] < 0)
            return pt_error_set("partition_min_max: the cost of layer %d is %g; costs must be "
                                "finite and >= 0",
                                l, cost[l]);
        total += cost[l];
    }
    if (!isfinite(total))
        return pt_error_set("partition_min_max: the layer costs add up to more than a double "
                            "can hold");

    double *h = min_max_table(cost, n_layers, stages);
    if (!h)
        return pt_error_set("out of memory for the min-max table (%d layers, %d stages)",
                            n_layers, stages);
    if (partition_alloc(p, n_layers, stages)) {
        free(h);
        return -1;
    }
    size_t row = (size_t)n_layers + 1;
    double opt = h[(size_t)stages * row];

    /* Lexicographically smallest cut: each boundary as early as possible while the rest
     * can still be cut within the optimum. */
    p->first[0] = 0;
    p->first[stages] = n_layers;
    for (int s = 0; s + 1 < stages; s++) {
        int left = stages - s - 1, i = p->first[s], found = -1;
        double sum = 0;
        for (int j = i + 1; j <= n_layers - left; j++) {
            sum += cost[j - 1];
            if (fmax(sum, h[(size_t)left * row + (size_t)j]) <= opt) {
                found = j;
                break;
            }
        }
        if (found < 0) {
            /* Cannot happen: the optimum's own cut passes this test. */
            free(h);
            partition_free(p);
            return pt_error_set("partition_min_max: internal error reconstructing stage %d", s);
        }
        p->first[s + 1] = found;
    }
    free(h);
    return 0;
}

/* ---- explicit counts ---- */

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* Parses entry `index` (1-based) starting at *pos; leaves *pos on the ',' or the end. */
static int counts_parse_entry(const char *list, const char **pos, int index, int *value)
{
    const char *s = *pos;
    while (is_blank(*s))
        s++;
    const char *text = s;
    const char *end = s;
    while (*end && *end != ',')
        end++;
    int len = (int)(end - text);
    while (len > 0 && is_blank(text[len - 1]))
        len--;
    *pos = end;
    if (len == 0)
        return pt_error_set("partition list %.*s: entry %d is empty", LIST_SHOWN, list, index);

    long long v = 0;
    int i = 0;
    for (; i < len && text[i] >= '0' && text[i] <= '9'; i++) {
        v = v * 10 + (text[i] - '0');
        if (v > INT_MAX)
            return pt_error_set("partition list %.*s: entry %d (%.*s) is too large",
                                LIST_SHOWN, list, index, len, text);
    }
    if (i == 0 || i < len)
        return pt_error_set("partition list %.*s: entry %d \"%.*s\" is not a positive integer",
                            LIST_SHOWN, list, index, len, text);
    if (v == 0)
        return pt_error_set("partition list %.*s: entry %d is 0, but every stage needs at "
                            "least one layer",
                            LIST_SHOWN, list, index);
    *value = (int)v;
    return 0;
}

int partition_from_counts(partition *p, const char *list, int n_layers, int stages)
{
    if (partition_start(p, n_layers, stages, "partition_from_counts"))
        return -1;
    if (!list)
        return pt_error_set("partition list is missing (NULL)");
    const char *t = list;
    while (is_blank(*t))
        t++;
    if (!*t)
        return pt_error_set("partition list is empty: give one layer count per stage, "
                            "such as 4,3,4");

    int entries = 1;
    for (const char *c = list; *c; c++)
        entries += *c == ',';
    int *counts = malloc((size_t)entries * sizeof *counts);
    if (!counts)
        return pt_error_set("out of memory parsing a partition list");

    /* Syntax first, so that "4,,3" is called malformed rather than short. */
    const char *pos = list;
    for (int e = 0; e < entries; e++) {
        if (counts_parse_entry(list, &pos, e + 1, &counts[e])) {
            free(counts);
            return -1;
        }
        if (*pos == ',')
            pos++;
    }
    if (entries != stages) {
        free(counts);
        return pt_error_set("partition list %.*s has %d entr%s but %d stage%s %s asked for",
                            LIST_SHOWN, list, entries, entries == 1 ? "y" : "ies", stages,
                            stages == 1 ? "" : "s", stages == 1 ? "was" : "were");
    }
    long long sum = 0;
    for (int e = 0; e < entries; e++)
        sum += counts[e];
    if (sum != n_layers) {
        free(counts);
        return pt_error_set("partition list %.*s covers %lld layers but the model has %d",
                            LIST_SHOWN, list, sum, n_layers);
    }
    if (partition_alloc(p, n_layers, stages)) {
        free(counts);
        return -1;
    }
    p->first[0] = 0;
    for (int s = 0; s < stages; s++)
        p->first[s + 1] = p->first[s] + counts[s];
    free(counts);
    return 0;
}

/* ---- method switch ---- */

/* A method is read as a counts list when it has a comma or is a single integer, so that a
 * malformed list ("4,,3", "a,b") gets the list parser's precise message. */
static int method_is_counts(const char *m)
{
    if (strchr(m, ','))
        return 1;
    while (is_blank(*m))
        m++;
    int digits = 0;
    while (*m >= '0' && *m <= '9') {
        m++;
        digits++;
    }
    while (is_blank(*m))
        m++;
    return digits > 0 && *m == '\0';
}

static int by_cost(partition *p, const net_desc *net, const partition_profile *profile,
                   int stages, int use_time)
{
    int n = net->n_layers;
    double *cost = malloc((size_t)n * sizeof *cost);
    if (!cost)
        return pt_error_set("out of memory for %d layer costs", n);
    for (int l = 0; l < n; l++) {
        if (use_time)
            cost[l] = profile->fwd_s[l] + profile->bwd_s[l];
        else /* fp32 parameter bytes */
            cost[l] = 4.0 * (double)(net->layers[l].weight_count + net->layers[l].bias_count);
    }
    int rc = partition_min_max(p, cost, n, stages);
    free(cost);
    return rc;
}

int partition_by_method(partition *p, const char *method, const net_desc *net,
                        const partition_profile *profile, int stages)
{
    static const char known[] = "use uniform, params, time, or a list of layer counts per "
                                "stage such as 4,3,4";
    if (p)
        *p = (partition){0};
    if (!net || !net->layers || net->n_layers < 1)
        return pt_error_set("cannot partition: the model has no layers");
    if (!method || !*method)
        return pt_error_set("no partition method given: %s", known);
    if (method_is_counts(method))
        return partition_from_counts(p, method, net->n_layers, stages);
    if (strcmp(method, "uniform") == 0)
        return partition_uniform(p, net->n_layers, stages);
    if (strcmp(method, "params") == 0)
        return partition_check(net->n_layers, stages) ? -1 : by_cost(p, net, NULL, stages, 0);
    if (strcmp(method, "time") == 0) {
        if (partition_check(net->n_layers, stages))
            return -1;
        if (!profile || !profile->fwd_s || !profile->bwd_s)
            return pt_error_set("partition method \"time\" needs a measured profile of the "
                                "layers, and none was given");
        if (profile->n_layers != net->n_layers)
            return pt_error_set("partition method \"time\": the profile has %d layers but the "
                                "model has %d",
                                profile->n_layers, net->n_layers);
        return by_cost(p, net, profile, stages, 1);
    }
    return pt_error_set("unknown partition method \"%.*s\": %s", LIST_SHOWN, method, known);
}
