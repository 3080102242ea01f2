/* `pipetrain topo` output: the readable summary and the JSON form of a topo_machine, and
 * the small formatting helpers of the module. */
#include <stdlib.h>
#include <string.h>

#include "topologies/internal.h"
#include "topologies/topo.h"

void topo_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", out);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
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

static void json_int_list(FILE *out, const int *v, int n)
{
    fputc('[', out);
    for (int i = 0; i < n; i++)
        fprintf(out, "%s%d", i ? "," : "", v[i]);
    fputc(']', out);
}

static void json_matrix(FILE *out, const double *v, int n)
{
    fputc('[', out);
    for (int i = 0; i < n; i++) {
        fprintf(out, "%s[", i ? "," : "");
        for (int j = 0; j < n; j++)
            fprintf(out, "%s%.17g", j ? "," : "", v[i * n + j]);
        fputc(']', out);
    }
    fputc(']', out);
}

static void json_index(FILE *out, int v)
{
    if (v < 0)
        fputs("null", out);
    else
        fprintf(out, "%d", v);
}

void topo_print_json(const topo_machine *m, FILE *out)
{
    int *list = malloc((size_t)m->n_cores * sizeof *list);
    if (!list)
        return;
    fputs("{\"source\":", out);
    topo_json_string(out, m->source);
    fputs(",\"host\":", out);
    topo_json_string(out, m->host);
    fprintf(out, ",\"this_system\":%s,\"cpu_model\":", m->is_this_system ? "true" : "false");
    topo_json_string(out, m->cpu_model);
    fprintf(out, ",\"packages\":%d,\"numa_nodes\":%d,\"l3_groups\":%d,\"cores\":%d,\"pus\":%d,"
                 "\"memory_bytes\":%llu,\n \"caches\":[",
            m->n_packages, m->n_numa, m->n_l3, m->n_cores, m->n_pus, m->memory);
    for (int k = 0; k < m->n_caches; k++) {
        fprintf(out, "%s{\"name\":", k ? "," : "");
        topo_json_string(out, m->caches[k].name);
        fprintf(out, ",\"count\":%d,\"size\":%llu}", m->caches[k].count, m->caches[k].size);
    }
    fputs("],\n \"package_cores\":[", out);
    for (int p = 0; p < m->n_packages; p++) {
        fputs(p ? "," : "", out);
        json_int_list(out, list, cores_of(m, 0, p, list));
    }
    fputs("],\n \"numa_cores\":[", out);
    for (int u = 0; u < m->n_numa; u++) {
        fputs(u ? "," : "", out);
        json_int_list(out, list, cores_of(m, 1, u, list));
    }
    fputs("],\n \"core_list\":[", out);
    for (int c = 0; c < m->n_cores; c++) {
        const topo_core *k = &m->cores[c];
        fprintf(out, "%s{\"os_index\":%d,\"package\":", c ? "," : "", k->os_index);
        json_index(out, k->package);
        fputs(",\"numa\":", out);
        json_index(out, k->numa);
        fputs(",\"l3\":", out);
        json_index(out, k->l3);
        fprintf(out, ",\"pus\":%d}", k->n_pus);
    }
    fputs("],\n \"gpus\":[", out);
    for (int g = 0; g < m->n_gpus; g++) {
        const topo_gpu *gp = &m->gpus[g];
        fprintf(out, "%s\n  {\"index\":%d,\"busid\":", g ? "," : "", g);
        topo_json_string(out, gp->busid);
        fputs(",\"vendor\":", out);
        topo_json_string(out, gp->vendor);
        fputs(",\"model\":", out);
        topo_json_string(out, gp->model);
        fprintf(out, ",\"vendor_id\":\"0x%04x\",\"device_id\":\"0x%04x\",\"class_id\":\"0x%04x\","
                     "\"class\":\"%s\",\"nvidia\":%s,\"cuda_index\":",
                gp->vendor_id, gp->device_id, gp->class_id, class_name(gp->class_id),
                gp->is_nvidia ? "true" : "false");
        json_index(out, gp->cuda_index);
        fputs(",\"package\":", out);
        json_index(out, gp->package);
        fputs(",\"numa\":", out);
        json_index(out, gp->numa);
        fputs(",\"near_cores\":", out);
        json_int_list(out, gp->near, gp->n_near);
        fputc('}', out);
    }
    fputs("],\n \"numa_distance\":", out);
    if (m->numa_distance) {
        fputs("{\"name\":", out);
        topo_json_string(out, m->numa_distance_name);
        fputs(",\"matrix\":", out);
        json_matrix(out, m->numa_distance, m->n_numa);
        fputc('}', out);
    } else {
        fputs("null", out);
    }
    fputs(",\n \"gpu_bandwidth\":", out);
    if (m->gpu_bandwidth) {
        fputs("{\"name\":", out);
        topo_json_string(out, m->gpu_bandwidth_name);
        fputs(",\"unit\":\"bytes/s\",\"matrix\":", out);
        json_matrix(out, m->gpu_bandwidth, m->n_gpus);
        fputc('}', out);
    } else {
        fputs("null", out);
    }
    fputs("}\n", out);
    free(list);
}
