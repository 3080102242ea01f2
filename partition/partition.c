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

/* ---- min-max of a V placement's pairs ----
 *
 * With two chunks per rank in a V, rank k runs model chunks k and 2K−1−k: its work is the
 * sum of a chunk near the input and one near the loss. Balancing the 2K chunks one by one
 * (partition_min_max) can leave a rank with two heavy chunks and another with two light
 * ones (a language model's embedding and head chunks hold almost nothing, so rank 0 idles
 * and every other rank holds two blocks); the ranks' pairs are what must be balanced.
 *
 * The pairs nest: pair k is the chunk right after pair k−1's first one and the chunk right
 * before its second one. So a table over (left boundary i, right boundary j) per pair level
 * works from the middle out: f[k][i][j] is the least largest pair sum when layers [i, j)
 * are cut into the chunks of pairs k..K−1 (2(K−k) chunks; pair K−1's two chunks are
 * adjacent). A second pass with the largest pair sum held within 1% of that optimum
 * minimises the largest chunk, so that within a rank the two chunks are as even as the pairs allow (the
 * V's forward runs down the ranks on one chunk and back up on the other). O(K·n⁴) time,
 * O(K·n²) memory: models up to PAIR_MAX_LAYERS layers. */
enum { PAIR_MAX_LAYERS = 128 };
#define PAIR_SLACK 0.01

typedef struct {
    int n, K;
    size_t row;     /* n + 1 */
    double *sum;    /* [i·row + j]: cost of layers [i, j), accumulated from i upwards */
    double *f, *g;  /* [k·row² + i·row + j]; INFINITY where no cut exists */
    int *arg;       /* [k·row² + i·row + j]: pass 2's choice, i'·row + j' (innermost: m) */
} pair_tables;

static size_t pair_at(const pair_tables *t, int k, int i, int j)
{
    return (size_t)k * t->row * t->row + (size_t)i * t->row + (size_t)j;
}

/* Pass 1 (lim < 0): f, the least largest pair sum. Pass 2 (lim >= 0): g, the least
 * largest chunk among cuts whose pairs all cost at most lim, and its choices. */
static void pair_level(pair_tables *t, int k, double lim)
{
    int n = t->n, K = t->K, inner = 2 * (K - 1 - k); /* chunks inside pair k */
    double *out = lim < 0 ? t->f : t->g;
    const double *S = t->sum;
    for (int i = k; i <= n; i++)
        for (int j = i; j <= n - k; j++) {
            double best = INFINITY;
            int choice = -1;
            if (j - i < inner + 2) {
                out[pair_at(t, k, i, j)] = best;
                continue;
            }
            if (k == K - 1) { /* two adjacent chunks [i, m), [m, j) */
                for (int m = i + 1; m < j; m++) {
                    double a = S[i * t->row + m], b = S[m * t->row + j];
                    double v = lim < 0 ? a + b : a + b <= lim ? fmax(a, b) : INFINITY;
                    if (v < best) best = v, choice = m;
                }
            } else {
                for (int i2 = i + 1; i2 + inner + 1 <= j; i2++) {
                    double a = S[i * t->row + i2];
                    if (a >= best) break; /* the pair only grows with i2 */
                    for (int j2 = j - 1; j2 - i2 >= inner; j2--) {
                        double b = S[j2 * t->row + j];
                        if (lim < 0 ? a + b >= best : b >= best) break;
                        if (lim >= 0 && a + b > lim) break;
                        double in = out[pair_at(t, k + 1, i2, j2)];
                        double v = lim < 0 ? fmax(a + b, in) : fmax(fmax(a, b), in);
                        if (v < best) best = v, choice = i2 * (int)t->row + j2;
                    }
                }
            }
            out[pair_at(t, k, i, j)] = best;
            if (lim >= 0) t->arg[pair_at(t, k, i, j)] = choice;
        }
}

static void pair_tables_free(pair_tables *t)
{
    free(t->sum), free(t->f), free(t->g), free(t->arg);
}

int partition_min_max_v(partition *p, const double *cost, int n_layers, int ranks)
{
    if (ranks < 1 || n_layers < 2 || ranks > n_layers / 2) {
        if (p) *p = (partition){0};
        return pt_error_set("partition_min_max_v: cannot cut %d layers into %d ranks' pairs "
                            "of chunks (%d chunks)", n_layers, ranks, 2 * ranks);
    }
    /* the layer checks and the fallback for long models: the chunks' own min-max */
    if (n_layers > PAIR_MAX_LAYERS) return partition_min_max(p, cost, n_layers, 2 * ranks);
    if (partition_min_max(p, cost, n_layers, 2 * ranks)) return -1;
    int n = n_layers, K = ranks;
    size_t row = (size_t)n + 1, cells = (size_t)K * row * row;
    pair_tables t = {.n = n, .K = K, .row = row, .sum = malloc(row * row * sizeof *t.sum),
                     .f = malloc(cells * sizeof *t.f), .g = malloc(cells * sizeof *t.g),
                     .arg = malloc(cells * sizeof *t.arg)};
    if (!t.sum || !t.f || !t.g || !t.arg) {
        pair_tables_free(&t);
        partition_free(p);
        return pt_error_set("out of memory for the pair table (%d layers, %d ranks)", n, K);
    }
    for (int i = 0; i <= n; i++) {
        double s = 0;
        for (int j = i; j <= n; j++) {
            t.sum[(size_t)i * row + (size_t)j] = s;
            if (j < n) s += cost[j];
        }
    }
    for (int k = K - 1; k >= 0; k--) pair_level(&t, k, -1);
    double opt = t.f[pair_at(&t, 0, 0, n)];
    /* pairs within PAIR_SLACK of the optimum count as balanced: a profile's layer times
     * are not that precise, and otherwise a head of 3% of a block decides that the first
     * chunk takes two blocks (a V's first forward then waits for both) */
    for (int k = K - 1; k >= 0; k--) pair_level(&t, k, opt * (1 + PAIR_SLACK));
    /* from the outside in: pair k's boundaries are first[k + 1] and first[2K − 1 − k] */
    int i = 0, j = n;
    for (int k = 0; k < K; k++) {
        int c = t.arg[pair_at(&t, k, i, j)];
        if (c < 0) { /* cannot happen: pass 1's own cut keeps to the limit */
            pair_tables_free(&t);
            partition_free(p);
            return pt_error_set("partition_min_max_v: internal error reconstructing pair %d",
                                k);
        }
        if (k == K - 1) {
            p->first[K] = c;
        } else {
            i = c / (int)row, j = c % (int)row;
            p->first[k + 1] = i;
            p->first[2 * K - 1 - k] = j;
        }
    }
    pair_tables_free(&t);
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
                   int stages, int use_time, int v_ranks)
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
    int rc = v_ranks ? partition_min_max_v(p, cost, n, v_ranks)
                     : partition_min_max(p, cost, n, stages);
    free(cost);
    return rc;
}

/* v_ranks > 0: a V placement over v_ranks ranks (stages = 2·v_ranks chunks); the cost
 * methods balance the ranks' pairs (partition_min_max_v). */
static int by_method(partition *p, const char *method, const net_desc *net,
                     const partition_profile *profile, int stages, int v_ranks)
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
        return partition_check(net->n_layers, stages) ? -1
                                                      : by_cost(p, net, NULL, stages, 0, v_ranks);
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
        return by_cost(p, net, profile, stages, 1, v_ranks);
    }
    return pt_error_set("unknown partition method \"%.*s\": %s", LIST_SHOWN, method, known);
}

int partition_by_method(partition *p, const char *method, const net_desc *net,
                        const partition_profile *profile, int stages)
{
    return by_method(p, method, net, profile, stages, 0);
}

int partition_by_method_placed(partition *p, const char *method, const net_desc *net,
                               const partition_profile *profile, int ranks,
                               int virtual_stages, int v_placement)
{
    int V = virtual_stages > 1 ? virtual_stages : 1;
    if (ranks < 1 || ranks > INT_MAX / V) {
        if (p) *p = (partition){0};
        return pt_error_set("the number of pipeline stages must be at least 1 (got %d)", ranks);
    }
    if (V > 1 && method && method_is_counts(method)) {
        /* one count per model chunk: say so, not "K·V stages were asked for" */
        int entries = 1;
        for (const char *c = method; *c; c++) entries += *c == ',';
        if (entries != ranks * V) {
            if (p) *p = (partition){0};
            return pt_error_set("partition list %.*s has %d entr%s but %d stage%s × %d model "
                                "chunks per rank make %d chunks: give one layer count per "
                                "chunk", LIST_SHOWN, method, entries,
                                entries == 1 ? "y" : "ies", ranks, ranks == 1 ? "" : "s", V,
                                ranks * V);
        }
    }
    return by_method(p, method, net, profile, ranks * V, v_placement && V == 2 ? ranks : 0);
}
