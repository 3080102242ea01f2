/* `pipetrain topo` output: the readable summary and the JSON form of a topo_machine (built
 * with jansson, which does the escaping), and the small formatting helpers of the module. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/error.h"
#include "topologies/internal.h"
#include "topologies/topo.h"

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong forms, surrogates
 * or code points past U+10FFFF), or 0 when the byte there does not start one. */
static int utf8_sequence(const unsigned char *s)
{
    int n;
    unsigned lo = 0x80, hi = 0xBF; /* range of the second byte */
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        n = 2;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        n = 3;
        lo = s[0] == 0xE0 ? 0xA0 : 0x80;
        hi = s[0] == 0xED ? 0x9F : 0xBF;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        n = 4;
        lo = s[0] == 0xF0 ? 0x90 : 0x80;
        hi = s[0] == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return n;
}

json_t *topo_json_text(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    /* not UTF-8 (a path, a name from a file): keep what is, replace what is not */
    size_t len = strlen(s);
    char *fixed = malloc(3 * len + 1); /* each bad byte becomes 3 bytes of U+FFFD */
    if (!fixed)
        return NULL;
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int k = utf8_sequence(p);
        if (k) {
            memcpy(fixed + n, p, (size_t)k);
            n += (size_t)k;
            p += k;
        } else {
            memcpy(fixed + n, "\xEF\xBF\xBD", 3);
            n += 3;
            p++;
        }
    }
    j = json_stringn(fixed, n);
    free(fixed);
    return j;
}

json_t *topo_json_number(double v)
{
    if (!isfinite(v))
        return json_null();
    if (fabs(v) <= 9007199254740992.0 && v == (double)(json_int_t)v) /* 2^53: exact */
        return json_integer((json_int_t)v);
    return json_real(v);
}

int topo_json_print(json_t *j, FILE *out)
{
    if (!j)
        return pt_error_set("out of memory building the JSON output");
    int rc = json_dumpf(j, out, JSON_COMPACT) == 0 && fputc('\n', out) != EOF ? 0 : -1;
    json_decref(j);
    return rc == 0 ? 0 : pt_error_set("cannot write the JSON output");
}

void topo_format_size(char *buf, size_t size, double bytes)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    if (bytes == (double)(long long)bytes)
        snprintf(buf, size, "%lld %s", (long long)bytes, units[u]);
    else
        snprintf(buf, size, "%.1f %s", bytes, units[u]);
}

void topo_format_bytes(char *buf, size_t size, double bytes)
{
    static const char *units[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000 && u < 4) {
        bytes /= 1000;
        u++;
    }
    snprintf(buf, size, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
}

void topo_format_seconds(char *buf, size_t size, double s)
{
    if (s == 0)
        snprintf(buf, size, "0 s");
    else if (s < 1e-3)
        snprintf(buf, size, "%.1f µs", s * 1e6);
    else if (s < 1)
        snprintf(buf, size, "%.3f ms", s * 1e3);
    else
        snprintf(buf, size, "%.3f s", s);
}

static const char *class_name(unsigned class_id)
{
    switch (class_id) {
    case 0x0300: return "VGA";
    case 0x0301: return "XGA";
    case 0x0302: return "3D";
    default: return "display";
    }
}

/* Logical indices of the cores whose package (field 0) or NUMA node (field 1) is `which`. */
static int cores_of(const topo_machine *m, int field, int which, int *out)
{
    int n = 0;
    for (int c = 0; c < m->n_cores; c++)
        if ((field == 0 ? m->cores[c].package : m->cores[c].numa) == which)
            out[n++] = c;
    return n;
}

static void print_matrix(FILE *out, const double *v, int n, double scale, const char *fmt)
{
    fprintf(out, "      ");
    for (int j = 0; j < n; j++)
        fprintf(out, "%7d", j);
    fputc('\n', out);
    for (int i = 0; i < n; i++) {
        fprintf(out, "    %2d", i);
        for (int j = 0; j < n; j++)
            fprintf(out, fmt, v[i * n + j] * scale);
        fputc('\n', out);
    }
}

void topo_print_summary(const topo_machine *m, FILE *out)
{
    char buf[512], size[32];
    int *list = malloc((size_t)m->n_cores * sizeof *list);
    if (!list)
        return;
    fprintf(out, "Topology: %s%s%s%s\n", m->source, m->host[0] ? " (host " : "", m->host,
            m->host[0] ? ")" : "");
    if (!m->is_this_system)
        fprintf(out, "  (a described machine: binding is not possible)\n");
    if (m->cpu_model[0])
        fprintf(out, "  CPU:        %s\n", m->cpu_model);
    topo_format_size(size, sizeof size, (double)m->memory);
    fprintf(out, "  packages %d, NUMA nodes %d, L3 groups %d, cores %d, hardware threads %d, "
                 "memory %s\n",
            m->n_packages, m->n_numa, m->n_l3, m->n_cores, m->n_pus, size);
    fprintf(out, "  caches:    ");
    for (int k = 0; k < m->n_caches; k++) {
        topo_format_size(size, sizeof size, (double)m->caches[k].size);
        fprintf(out, "%s %s %s ×%d", k ? "," : "", m->caches[k].name, size, m->caches[k].count);
    }
    fputc('\n', out);
    for (int p = 0; p < m->n_packages; p++) {
        int n = cores_of(m, 0, p, list);
        topo_format_list(buf, sizeof buf, list, n);
        fprintf(out, "  package %d: cores %s\n", p, buf);
    }
    for (int u = 0; u < m->n_numa; u++) {
        int n = cores_of(m, 1, u, list);
        topo_format_list(buf, sizeof buf, list, n);
        fprintf(out, "  NUMA node %d: cores %s\n", u, buf);
    }
    if (m->numa_distance) {
        fprintf(out, "  NUMA distances (%s, relative latency):\n", m->numa_distance_name);
        print_matrix(out, m->numa_distance, m->n_numa, 1, "%7.0f");
    }
    if (m->n_gpus == 0) {
        fprintf(out, "  GPUs: none\n");
        free(list);
        return;
    }
    fprintf(out, "  GPUs: %d (%d NVIDIA)\n", m->n_gpus, topo_count_cuda_gpus(m));
    fprintf(out, "    %-3s  %-12s  %-7s  %-28s  %-5s  %-4s  %-7s  %-4s  %s\n", "gpu", "bus id",
            "vendor", "model", "class", "cuda", "package", "NUMA", "near cores");
    for (int g = 0; g < m->n_gpus; g++) {
        const topo_gpu *gp = &m->gpus[g];
        char cuda[12] = "-", pkg[12] = "-", numa[12] = "-";
        if (gp->cuda_index >= 0)
            snprintf(cuda, sizeof cuda, "%d", gp->cuda_index);
        if (gp->package >= 0)
            snprintf(pkg, sizeof pkg, "%d", gp->package);
        if (gp->numa >= 0)
            snprintf(numa, sizeof numa, "%d", gp->numa);
        topo_format_list(buf, sizeof buf, gp->near, gp->n_near);
        fprintf(out, "    %-3d  %-12s  %-7s  %-28.28s  %-5s  %-4s  %-7s  %-4s  %s\n", g, gp->busid,
                gp->vendor, gp->model, class_name(gp->class_id), cuda, pkg, numa, buf);
    }
    if (m->gpu_bandwidth) {
        fprintf(out, "  GPU bandwidth (%s, GB/s; 0: no direct link):\n", m->gpu_bandwidth_name);
        print_matrix(out, m->gpu_bandwidth, m->n_gpus, 1e-9, "%7.1f");
    }
    free(list);
}

/* Builders of the JSON tree. jansson's setters take ownership of the value and free it when
 * they fail, also when the container or the value is NULL (out of memory); *ok records any
 * failure, so that the tree is checked once at the end. */
static void put(json_t *obj, const char *key, json_t *v, int *ok)
{
    if (json_object_set_new(obj, key, v) != 0)
        *ok = 0;
}

static void append(json_t *arr, json_t *v, int *ok)
{
    if (json_array_append_new(arr, v) != 0)
        *ok = 0;
}

/* The tree, or NULL (and the tree freed) when some part of it failed. */
static json_t *checked(json_t *j, int ok)
{
    if (!ok) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *topo_json_int_list(const int *v, int n)
{
    json_t *a = json_array();
    int ok = a != NULL;
    for (int i = 0; ok && i < n; i++)
        append(a, json_integer(v[i]), &ok);
    return checked(a, ok);
}

static json_t *json_matrix(const double *v, int n)
{
    json_t *a = json_array();
    int ok = a != NULL;
    for (int i = 0; ok && i < n; i++) {
        json_t *row = json_array();
        for (int j = 0; j < n; j++)
            append(row, topo_json_number(v[i * n + j]), &ok);
        append(a, row, &ok);
    }
    return checked(a, ok);
}

/* A logical index, or null where there is none (-1). */
static json_t *json_index(int v)
{
    return v < 0 ? json_null() : json_integer(v);
}

static json_t *json_hex(unsigned v)
{
    char buf[16];
    snprintf(buf, sizeof buf, "0x%04x", v);
    return json_string(buf);
}

/* {"name": ..., ["unit": ...,] "matrix": [[...]]}, or null when the topology has none. */
static json_t *json_named_matrix(const char *name, const char *unit, const double *v, int n)
{
    if (!v)
        return json_null();
    json_t *o = json_object();
    int ok = 1;
    put(o, "name", topo_json_text(name), &ok);
    if (unit)
        put(o, "unit", json_string(unit), &ok);
    put(o, "matrix", json_matrix(v, n), &ok);
    return checked(o, ok);
}

static json_t *json_machine(const topo_machine *m, int *list)
{
    json_t *o = json_object();
    int ok = 1;
    put(o, "source", topo_json_text(m->source), &ok);
    put(o, "host", topo_json_text(m->host), &ok);
    put(o, "this_system", json_boolean(m->is_this_system), &ok);
    put(o, "cpu_model", topo_json_text(m->cpu_model), &ok);
    put(o, "packages", json_integer(m->n_packages), &ok);
    put(o, "numa_nodes", json_integer(m->n_numa), &ok);
    put(o, "l3_groups", json_integer(m->n_l3), &ok);
    put(o, "cores", json_integer(m->n_cores), &ok);
    put(o, "pus", json_integer(m->n_pus), &ok);
    put(o, "memory_bytes", json_integer((json_int_t)m->memory), &ok);
    json_t *caches = json_array();
    for (int k = 0; ok && k < m->n_caches; k++) {
        json_t *c = json_object();
        put(c, "name", topo_json_text(m->caches[k].name), &ok);
        put(c, "count", json_integer(m->caches[k].count), &ok);
        put(c, "size", json_integer((json_int_t)m->caches[k].size), &ok);
        append(caches, c, &ok);
    }
    put(o, "caches", caches, &ok);
    json_t *package_cores = json_array(), *numa_cores = json_array();
    for (int p = 0; ok && p < m->n_packages; p++)
        append(package_cores, topo_json_int_list(list, cores_of(m, 0, p, list)), &ok);
    for (int u = 0; ok && u < m->n_numa; u++)
        append(numa_cores, topo_json_int_list(list, cores_of(m, 1, u, list)), &ok);
    put(o, "package_cores", package_cores, &ok);
    put(o, "numa_cores", numa_cores, &ok);
    json_t *cores = json_array();
    for (int c = 0; ok && c < m->n_cores; c++) {
        const topo_core *k = &m->cores[c];
        json_t *j = json_object();
        put(j, "os_index", json_integer(k->os_index), &ok);
        put(j, "package", json_index(k->package), &ok);
        put(j, "numa", json_index(k->numa), &ok);
        put(j, "l3", json_index(k->l3), &ok);
        put(j, "pus", json_integer(k->n_pus), &ok);
        append(cores, j, &ok);
    }
    put(o, "core_list", cores, &ok);
    json_t *gpus = json_array();
    for (int g = 0; ok && g < m->n_gpus; g++) {
        const topo_gpu *gp = &m->gpus[g];
        json_t *j = json_object();
        put(j, "index", json_integer(g), &ok);
        put(j, "busid", topo_json_text(gp->busid), &ok);
        put(j, "vendor", topo_json_text(gp->vendor), &ok);
        put(j, "model", topo_json_text(gp->model), &ok);
        put(j, "vendor_id", json_hex(gp->vendor_id), &ok);
        put(j, "device_id", json_hex(gp->device_id), &ok);
        put(j, "class_id", json_hex(gp->class_id), &ok);
        put(j, "class", json_string(class_name(gp->class_id)), &ok);
        put(j, "nvidia", json_boolean(gp->is_nvidia), &ok);
        put(j, "cuda_index", json_index(gp->cuda_index), &ok);
        put(j, "package", json_index(gp->package), &ok);
        put(j, "numa", json_index(gp->numa), &ok);
        put(j, "near_cores", topo_json_int_list(gp->near, gp->n_near), &ok);
        append(gpus, j, &ok);
    }
    put(o, "gpus", gpus, &ok);
    put(o, "numa_distance",
        json_named_matrix(m->numa_distance_name, NULL, m->numa_distance, m->n_numa), &ok);
    put(o, "gpu_bandwidth",
        json_named_matrix(m->gpu_bandwidth_name, "bytes/s", m->gpu_bandwidth, m->n_gpus), &ok);
    return checked(o, ok);
}

int topo_print_json(const topo_machine *m, FILE *out)
{
    int *list = malloc((size_t)(m->n_cores ? m->n_cores : 1) * sizeof *list);
    if (!list)
        return pt_error_set("out of memory");
    json_t *o = json_machine(m, list);
    free(list);
    return topo_json_print(o, out);
}
