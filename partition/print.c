/* The partition table and the imbalance measure (see partition/partition.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partition/partition.h"

/* Wider stage descriptions are cut with "..." so that the columns after them stay readable. */
#define LAYERS_WIDTH 44

/* A partition that covers `n_layers` layers with non-empty, ordered stages. */
static int partition_valid(const partition *p, int n_layers)
{
    if (!p || !p->first || p->stages < 1 || p->n_layers != n_layers || p->first[0] != 0 ||
        p->first[p->stages] != n_layers)
        return 0;
    for (int s = 0; s < p->stages; s++)
        if (p->first[s + 1] <= p->first[s])
            return 0;
    return 1;
}

double partition_imbalance(const partition *p, const double *cost)
{
    if (!p || !cost || !partition_valid(p, p->n_layers))
        return NAN;
    double max = 0, total = 0;
    for (int s = 0; s < p->stages; s++) {
        double c = 0;
        for (int l = p->first[s]; l < p->first[s + 1]; l++)
            c += cost[l];
        total += c;
        if (c > max)
            max = c;
    }
    double mean = total / p->stages;
    /* Nothing to balance (all costs zero) is perfectly balanced. */
    return mean > 0 ? max / mean : 1.0;
}

/* Terminal columns of a UTF-8 string: one per character (the en dash is three bytes). */
static int display_width(const char *s)
{
    int w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

/* "4–7 conv maxpool dense", cut to LAYERS_WIDTH columns. */
static void stage_layers_text(char *buf, size_t size, const net_desc *net, int first, int last)
{
    int len = first == last ? snprintf(buf, size, "%d", first)
                            : snprintf(buf, size, "%d\u2013%d", first, last);
    for (int l = first; l <= last; l++) {
        const char *name = layer_type_name(net->layers[l].type);
        size_t need = strlen(name) + 1;
        /* Keep room for " ..." while more names may follow. */
        int room = LAYERS_WIDTH - (l == last ? 0 : 4);
        if (display_width(buf) + (int)need > room || (size_t)len + need + 4 >= size) {
            snprintf(buf + len, size - (size_t)len, " ...");
            return;
        }
        len += snprintf(buf + len, size - (size_t)len, " %s", name);
    }
}

static void print_padded(FILE *out, const char *s, int width)
{
    fputs(s, out);
    for (int w = display_width(s); w < width; w++)
        fputc(' ', out);
}

void partition_print(const partition *p, const net_desc *net, const partition_profile *profile,
                     FILE *out)
{
    if (!out)
        return;
    if (!net || !net->layers || net->n_layers < 1) {
        fprintf(out, "(no model to show a partition of)\n");
        return;
    }
    if (!partition_valid(p, net->n_layers)) {
        fprintf(out, "(the partition does not fit this model of %d layers)\n", net->n_layers);
        return;
    }
    int timed = profile && profile->fwd_s && profile->bwd_s &&
                profile->n_layers == net->n_layers;
    if (profile && !timed)
        fprintf(out, "(profile ignored: it has %d layers, the model %d)\n", profile->n_layers,
                net->n_layers);

    int n = net->n_layers;
    double *cost = malloc((size_t)n * sizeof *cost);
    if (!cost) {
        fprintf(out, "(out of memory printing the partition)\n");
        return;
    }
    for (int l = 0; l < n; l++)
        cost[l] = timed ? profile->fwd_s[l] + profile->bwd_s[l]
                        : (double)(net->layers[l].weight_count + net->layers[l].bias_count);

    fprintf(out, "stage  ");
    print_padded(out, "layers", LAYERS_WIDTH);
    fprintf(out, "  %12s", "parameters");
    if (timed)
        fprintf(out, "  %12s", "ms/sample");
    fprintf(out, "  %15s\n", "boundary values");

    size_t total_params = 0;
    double total_ms = 0;
    for (int s = 0; s < p->stages; s++) {
        int first = p->first[s], last = p->first[s + 1] - 1;
        char text[LAYERS_WIDTH * 4 + 16];
        stage_layers_text(text, sizeof text, net, first, last);
        size_t params = 0;
        double ms = 0;
        for (int l = first; l <= last; l++) {
            params += net->layers[l].weight_count + net->layers[l].bias_count;
            if (timed)
                ms += 1e3 * (profile->fwd_s[l] + profile->bwd_s[l]);
        }
        total_params += params;
        total_ms += ms;
        fprintf(out, "%5d  ", s);
        print_padded(out, text, LAYERS_WIDTH);
        fprintf(out, "  %12zu", params);
        if (timed)
            fprintf(out, "  %12.3f", ms);
        /* What this stage sends forward per sample (and receives back as gradient). */
        if (s + 1 < p->stages)
            fprintf(out, "  %15zu\n", layer_shape_count(net->layers[last].out));
        else
            fprintf(out, "  %15s\n", "-");
    }
    char all[32];
    snprintf(all, sizeof all, "0\u2013%d", n - 1);
    fprintf(out, "total  ");
    print_padded(out, all, LAYERS_WIDTH);
    fprintf(out, "  %12zu", total_params);
    if (timed)
        fprintf(out, "  %12.3f", total_ms);
    fprintf(out, "\n");
    if (net->tied_head >= 0)
        fprintf(out, "(the lm_head keeps its own copy of the tied token matrix, %zu values, kept "
                "equal to the embedding's: the model has %zu distinct parameters)\n",
                net->layers[net->tied_head].weight_count, net->param_count);

    double imb = partition_imbalance(p, cost);
    if (timed)
        fprintf(out, "imbalance (slowest / mean): %.2f\n", imb);
    else
        fprintf(out, "imbalance (largest / mean, parameters): %.2f\n", imb);
    free(cost);
}
