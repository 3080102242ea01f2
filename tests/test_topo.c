/* Tests of topologies/: every machine description loads with the expected counts, malformed
 * XML is a clear error, bus ids match CUDA numbers, the cost model and traffic are as
 * documented, placements keep their invariants on every machine (own cores while there are
 * enough, cores near the GPU, neighbouring stages on one package where possible, never
 * worse than rank order, optimal where searched exhaustively), and binding this process
 * really changes its affinity. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error.h"
#include "tests/check.h"
#include "topologies/topo.h"

static topo_t *load(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/topologies/%s", check_source_dir(), name);
    topo_t *t = NULL;
    int rc = topo_init(&t, path);
    cr_assert_eq(rc, 0, "loading %s: %s", path, pt_error_get());
    return t;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* ---- discovery ---------------------------------------------------------------------- */

typedef struct {
    const char *file;
    int packages, numa, l3, cores, pus, gpus, nvidia;
    int has_numa_distance, has_gpu_bandwidth;
} expected_counts;

static const expected_counts machines[] = {
    {"local-2core.xml", 1, 1, 1, 2, 2, 0, 0, 0, 0},
    {"node-16c-1gpu.xml", 1, 1, 4, 16, 32, 1, 1, 0, 0},
    {"node-2s-8gpu.xml", 2, 2, 2, 40, 80, 8, 8, 1, 1}, /* and a VGA that is no GPU */
    {"ws-4gpu.xml", 1, 1, 4, 24, 48, 4, 4, 0, 0},
};
#define N_MACHINES (int)(sizeof machines / sizeof machines[0])

Test(topo, every_description_loads_with_expected_counts)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/topologies", check_source_dir());
    DIR *d = opendir(dir);
    cr_assert(d, "cannot open %s", dir);
    int seen = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".xml"))
            continue;
        const expected_counts *x = NULL;
        for (int k = 0; k < N_MACHINES; k++)
            if (!strcmp(machines[k].file, e->d_name))
                x = &machines[k];
        cr_assert(x, "%s has no expected counts in this test: add them", e->d_name);
        topo_t *t = load(e->d_name);
        const topo_machine *m = topo_get_machine(t);
        cr_expect_eq(m->is_this_system, 0, "%s: an XML machine is not this system", x->file);
        cr_expect_eq(m->n_packages, x->packages, "%s packages", x->file);
        cr_expect_eq(m->n_numa, x->numa, "%s NUMA nodes", x->file);
        cr_expect_eq(m->n_l3, x->l3, "%s L3", x->file);
        cr_expect_eq(m->n_cores, x->cores, "%s cores", x->file);
        cr_expect_eq(m->n_pus, x->pus, "%s PUs", x->file);
        cr_expect_eq(m->n_gpus, x->gpus, "%s GPUs", x->file);
        cr_expect_eq(topo_count_cuda_gpus(m), x->nvidia, "%s NVIDIA GPUs", x->file);
        cr_expect_eq(m->numa_distance != NULL, x->has_numa_distance, "%s NUMA matrix", x->file);
        cr_expect_eq(m->gpu_bandwidth != NULL, x->has_gpu_bandwidth, "%s GPU matrix", x->file);
        cr_expect_gt(m->n_caches, 0, "%s caches", x->file);
        cr_expect_gt(m->memory, 0ull, "%s memory", x->file);
        for (int c = 0; c < m->n_cores; c++)
            cr_expect(m->cores[c].package >= 0 && m->cores[c].numa >= 0 && m->cores[c].n_pus >= 1,
                      "%s core %d has no package / NUMA node / PU", x->file, c);
        topo_free(t);
        seen++;
    }
    closedir(d);
    cr_assert_eq(seen, N_MACHINES, "expected %d XML files in %s, found %d", N_MACHINES, dir, seen);
}

Test(topo, this_machine_loads)
{
    topo_t *t = NULL;
    cr_assert_eq(topo_init(&t, NULL), 0, "%s", pt_error_get());
    const topo_machine *m = topo_get_machine(t);
    cr_expect_eq(m->is_this_system, 1);
    cr_expect_geq(m->n_cores, 1);
    cr_expect_geq(m->n_pus, m->n_cores);
    cr_expect_eq(sysconf(_SC_NPROCESSORS_ONLN) >= m->n_pus, 1, "more PUs than online CPUs");
    topo_free(t);
}

Test(topo, eight_gpu_node_details)
{
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    static const char *bus[8] = {"0000:06:00.0", "0000:07:00.0", "0000:0a:00.0", "0000:0b:00.0",
                                 "0000:85:00.0", "0000:86:00.0", "0000:89:00.0", "0000:8a:00.0"};
    for (int g = 0; g < 8; g++) {
        const topo_gpu *gp = &m->gpus[g];
        cr_expect_str_eq(gp->busid, bus[g]);
        cr_expect(gp->is_nvidia && gp->class_id == 0x0302, "GPU %d is an NVIDIA 3D controller", g);
        cr_expect_eq(gp->cuda_index, g, "GPU %d has CUDA OS device cuda%d", g, g);
        cr_expect_eq(gp->package, g / 4);
        cr_expect_eq(gp->numa, g / 4);
        cr_expect_eq(gp->n_near, 20);
        cr_expect_eq(gp->near[0], 20 * (g / 4), "GPU %d's cores start at the package's", g);
        cr_expect_str_eq(gp->model, "Tesla V100-SXM2-16GB");
    }
    /* the BMC's ASPEED VGA (0000:0e:00.0) is a display adapter, not a GPU */
    cr_expect_eq(m->n_gpus, 8, "the BMC's VGA is counted as a GPU");
    for (int g = 0; g < m->n_gpus; g++)
        cr_expect_str_neq(m->gpus[g].busid, "0000:0e:00.0", "GPU %d is the BMC's VGA", g);
    double numa[4] = {10, 21, 21, 10};
    CHECK_CLOSE("NUMA distances", m->numa_distance, numa, 4, 0, 0);
    const double *bw = m->gpu_bandwidth;
    int n = m->n_gpus;
    cr_expect_eq(bw[0 * n + 3], 50e9, "GPU 0–3: two NVLinks");
    cr_expect_eq(bw[0 * n + 1], 25e9, "GPU 0–1: one NVLink");
    cr_expect_eq(bw[0 * n + 5], 0, "GPU 0–5: no NVLink");
    cr_expect_eq(bw[3 * n + 7], 25e9);
    cr_expect_str_eq(m->gpu_bandwidth_name, "NVLinkBandwidth");
    topo_free(t);
}

Test(topo, gpus_are_compute_devices_by_class_and_vendor)
{
    static const struct {
        unsigned vendor, class_id;
        int gpu;
        const char *what;
    } cases[] = {
        {0x10de, 0x0302, 1, "NVIDIA 3D controller (V100, H100)"},
        {0x10de, 0x0300, 1, "NVIDIA VGA (GeForce, RTX)"},
        {0x1002, 0x0380, 1, "AMD display controller (Instinct)"},
        {0x1002, 0x0300, 1, "AMD VGA (Radeon)"},
        {0x8086, 0x0380, 1, "Intel display controller (Data Center GPU Max)"},
        {0x1234, 0x0302, 1, "any vendor's 3D controller"},
        {0x1a03, 0x0300, 0, "ASPEED VGA (a BMC's)"},
        {0x102b, 0x0300, 0, "Matrox VGA (a server board's)"},
        {0x1234, 0x0380, 0, "an unknown vendor's display controller"},
        {0x10de, 0x0403, 0, "NVIDIA HD audio"},
        {0x10de, 0x0680, 0, "NVIDIA bridge (NVSwitch)"},
        {0x15b3, 0x0207, 0, "Mellanox InfiniBand"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(topo_pci_is_gpu(cases[i].vendor, cases[i].class_id), cases[i].gpu,
                     "%s [%04x] class 0x%04x: expected %s", cases[i].what, cases[i].vendor,
                     cases[i].class_id, cases[i].gpu ? "a GPU" : "not a GPU");
}

Test(topo, workstation_gpus_are_pci_only)
{
    topo_t *t = load("ws-4gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    for (int g = 0; g < 4; g++) {
        cr_expect_eq(m->gpus[g].class_id, 0x0300, "an RTX card is a VGA-class device");
        cr_expect_eq(m->gpus[g].cuda_index, -1, "no CUDA OS devices in this XML");
        cr_expect_eq(m->gpus[g].n_near, 24);
    }
    topo_free(t);
}

Test(topo, malformed_xml_is_a_clear_error)
{
    char dir[] = "/tmp/test_topo_XXXXXX";
    cr_assert(mkdtemp(dir));
    static const struct { const char *name, *text; } bad[] = {
        {"empty.xml", ""},
        {"text.xml", "this is not XML\n"},
        {"truncated.xml", "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n"
                          "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x1\"\n"},
        {"wrongroot.xml", "<?xml version=\"1.0\"?>\n<machine/>\n"},
    };
    char path[1200];
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, bad[k].name);
        write_file(path, bad[k].text);
        topo_t *t = (topo_t *)1;
        pt_error_clear();
        cr_expect_eq(topo_init(&t, path), -1, "%s loaded", bad[k].name);
        cr_expect_null(t);
        cr_expect(strstr(pt_error_get(), path) && strstr(pt_error_get(), "not a valid hwloc XML"),
                  "%s: message \"%s\"", bad[k].name, pt_error_get());
        unlink(path);
    }
    /* a distance matrix whose length= is wrong */
    char src[1024];
    snprintf(src, sizeof src, "%s/topologies/node-2s-8gpu.xml", check_source_dir());
    FILE *f = fopen(src, "r");
    cr_assert(f);
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    static const char key[] = "<u64values length=\"";
    char *u = strstr(text, key);
    cr_assert(u);
    u += strlen(key); /* first digit of the length */
    *u = *u == '9' ? '8' : '9';
    snprintf(path, sizeof path, "%s/badlength.xml", dir);
    write_file(path, text);
    topo_t *t = NULL;
    cr_expect_eq(topo_init(&t, path), -1, "a wrong length= loaded");
    unlink(path);

    snprintf(path, sizeof path, "%s/missing.xml", dir);
    cr_expect_eq(topo_init(&t, path), -1);
    cr_expect(strstr(pt_error_get(), "No such file"), "message \"%s\"", pt_error_get());
    rmdir(dir);
}

Test(topo, busid_normalize)
{
    static const struct { const char *in, *out; } ok[] = {
        {"0000:65:00.0", "0000:65:00.0"}, {"0000:1A:00.0", "0000:1a:00.0"},
        {"00000000:65:00.0", "0000:65:00.0"}, {"65:00.1", "0000:65:00.1"},
        {"0001:b3:1f.7", "0001:b3:1f.7"},
    };
    char out[16];
    for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
        cr_expect_eq(topo_busid_normalize(out, ok[k].in), 0, "%s: %s", ok[k].in, pt_error_get());
        cr_expect_str_eq(out, ok[k].out);
    }
    static const char *bad[] = {"", "zz", "0000:65:00", "0000:65:00.0x", "0000:65:20.0",
                                "0000:65:00.8", "10000:65:00.0", "0000:665:00.0"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        cr_expect_eq(topo_busid_normalize(out, bad[k]), -1, "\"%s\" accepted as %s", bad[k], out);
}

Test(topo, match_cuda_by_bus_id)
{
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    /* CUDA's default order may differ from bus order: here reversed, upper case as CUDA
     * writes it, one in NVML's 8-digit-domain form */
    const char *ids[8] = {"0000:8A:00.0", "0000:89:00.0", "00000000:86:00.0", "0000:85:00.0",
                          "0000:0B:00.0", "0000:0A:00.0", "0000:07:00.0", "0000:06:00.0"};
    cr_assert_eq(topo_match_cuda(t, ids, 8), 0, "%s", pt_error_get());
    for (int g = 0; g < 8; g++)
        cr_expect_eq(m->gpus[g].cuda_index, 7 - g, "GPU %d (%s)", g, m->gpus[g].busid);
    /* CUDA_VISIBLE_DEVICES=2: one device; the others become unknown */
    const char *one[1] = {"0000:0a:00.0"};
    cr_assert_eq(topo_match_cuda(t, one, 1), 0);
    cr_expect_eq(m->gpus[2].cuda_index, 0);
    cr_expect_eq(m->gpus[0].cuda_index, -1);
    const char *absent[1] = {"0000:0e:00.1"};
    cr_expect_eq(topo_match_cuda(t, absent, 1), -1);
    cr_expect(strstr(pt_error_get(), "not a GPU"), "%s", pt_error_get());
    const char *dup[2] = {"0000:06:00.0", "0000:06:00.0"};
    cr_expect_eq(topo_match_cuda(t, dup, 2), -1);
    const char *junk[1] = {"GPU-1234"};
    cr_expect_eq(topo_match_cuda(t, junk, 1), -1);
    topo_free(t);
}

Test(topo, json_and_summary_mention_the_gpus)
{
    topo_t *t = load("node-2s-8gpu.xml");
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    topo_print_json(topo_get_machine(t), f);
    fclose(f);
    cr_expect(strstr(buf, "\"busid\":\"0000:8a:00.0\""), "JSON lacks the last GPU");
    cr_expect(strstr(buf, "\"matrix\":[[10,21],[21,10]]"), "JSON lacks the NUMA matrix");
    int depth = 0, min_depth = 0;
    for (char *p = buf; *p; p++) {
        depth += (*p == '{' || *p == '[') - (*p == '}' || *p == ']');
        min_depth = depth < min_depth ? depth : min_depth;
    }
    cr_expect(depth == 0 && min_depth == 0, "unbalanced JSON");
    free(buf);
    f = open_memstream(&buf, &size);
    topo_print_summary(topo_get_machine(t), f);
    fclose(f);
    cr_expect(strstr(buf, "GPUs: 8 (8 NVIDIA)"), "%s", buf);
    cr_expect(strstr(buf, "NVLinkBandwidth"), "%s", buf);
    free(buf);
    topo_free(t);
}

Test(topo, format_list)
{
    char buf[64];
    int v[] = {0, 1, 2, 3, 8, 10, 11};
    cr_expect_eq(topo_format_list(buf, sizeof buf, v, 7), 11);
    cr_expect_str_eq(buf, "0-3,8,10-11");
    topo_format_list(buf, 6, v, 7); /* only whole items fit */
    cr_expect_str_eq(buf, "0-3,8");
    topo_format_list(buf, sizeof buf, v, 0);
    cr_expect_str_eq(buf, "");
}

/* ---- cost model and traffic --------------------------------------------------------- */

Test(topo, cost_model_parse)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    for (int l = 0; l < TOPO_LINK_COUNT; l++)
        cr_expect(cm.bandwidth[l] > 0 && cm.latency[l] >= 0, "default of %s", topo_link_name(l));
    cr_expect_gt(cm.bandwidth[TOPO_LINK_SAME_PACKAGE], cm.bandwidth[TOPO_LINK_CROSS_PACKAGE]);
    cr_expect_gt(cm.bandwidth[TOPO_LINK_CROSS_PACKAGE], cm.bandwidth[TOPO_LINK_CROSS_NODE]);
    cr_assert_eq(topo_cost_model_parse(&cm, "same-package=20e9,cross-package=10e9,cross-node=12.5e9", 0),
                 0, "%s", pt_error_get());
    cr_expect_eq(cm.bandwidth[TOPO_LINK_SAME_PACKAGE], 20e9);
    cr_expect_eq(cm.bandwidth[TOPO_LINK_CROSS_PACKAGE], 10e9);
    cr_expect_eq(cm.bandwidth[TOPO_LINK_CROSS_NODE], 12.5e9);
    cr_assert_eq(topo_cost_model_parse(&cm, "gpu-link=0,pcie=2e-6", 1), 0, "%s", pt_error_get());
    cr_expect_eq(cm.latency[TOPO_LINK_GPU], 0);
    cr_expect_eq(cm.latency[TOPO_LINK_PCIE], 2e-6);
    static const char *bad[] = {"same-package", "bogus=1", "same-l3=", "same-l3=1x", "pcie=0",
                                "pcie=-1", "same-l3=1,,pcie=2", "pcie=inf"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        cr_expect_eq(topo_cost_model_parse(&cm, bad[k], 0), -1, "\"%s\" accepted", bad[k]);
    cr_expect_eq(topo_cost_model_parse(&cm, "pcie=-1", 1), -1, "negative latency accepted");
}

Test(topo, traffic_of_a_replicated_pipeline)
{
    topo_traffic tr;
    double bv[2] = {1000, 10}, pb[3] = {4e6, 8e6, 0};
    cr_assert_eq(topo_traffic_init(&tr, 3, 2, bv, pb, 64, 4), 0, "%s", pt_error_get());
    int n = tr.n_ranks;
    cr_assert_eq(n, 6);
    /* ranks: stage 0 = 0,1; stage 1 = 2,3; stage 2 = 4,5 (replica r of stage s: 2s + r) */
    cr_expect_eq(topo_grid_rank(2, 2, 1), 5);
    cr_expect_eq(tr.bytes[0 * n + 2], 1000 * 4.0 * 64, "activations forward");
    cr_expect_eq(tr.bytes[2 * n + 0], 1000 * 4.0 * 64, "gradients backward");
    cr_expect_eq(tr.bytes[3 * n + 5], 10 * 4.0 * 64);
    cr_expect_eq(tr.messages[3 * n + 5], 4, "one message per micro-batch");
    cr_expect_eq(tr.bytes[0 * n + 4], 0, "stages 0 and 2 do not talk");
    cr_expect_eq(tr.bytes[4 * n + 1], 0, "different replicas of different stages do not talk");
    /* ring Allreduce of 2 replicas: 2(R−1)/R·P = P each way */
    cr_expect_eq(tr.bytes[2 * n + 3], 8e6);
    cr_expect_eq(tr.bytes[3 * n + 2], 8e6);
    cr_expect_eq(tr.messages[0 * n + 1], 2);
    cr_expect_eq(tr.bytes[4 * n + 5], 0, "a stage without parameters sends nothing");
    topo_traffic_free(&tr);
    cr_expect_eq(topo_traffic_init(&tr, 0, 1, bv, NULL, 1, 1), -1);
    cr_expect_eq(topo_traffic_init(&tr, 2, 2, bv, NULL, 1, 1), -1, "replicas need param bytes");
    cr_expect_eq(topo_traffic_init(&tr, 2, 1, bv, NULL, 8, 0), -1);
}

Test(topo, traffic_from_partition)
{
    /* conv → pool → dense: out shapes 8×4×4, 8×2×2, 10 */
    layer_desc layers[3] = {
        {.type = LAYER_CONV, .out = {8, 4, 4}, .weight_count = 72, .bias_count = 8},
        {.type = LAYER_MAXPOOL, .out = {8, 2, 2}},
        {.type = LAYER_DENSE, .out = {10, 1, 1}, .weight_count = 320, .bias_count = 10},
    };
    net_desc net = {.input = {1, 6, 6}, .n_layers = 3, .layers = layers, .param_count = 410,
                    .classes = 10};
    int first[3] = {0, 2, 3};
    partition p = {.stages = 2, .n_layers = 3, .first = first};
    topo_traffic tr;
    cr_assert_eq(topo_traffic_from_partition(&tr, &net, &p, 3, 16, 2), 0, "%s", pt_error_get());
    int n = tr.n_ranks;
    cr_assert_eq(n, 6);
    /* stage 0: ranks 0, 1, 2 (its replicas), stage 1: ranks 3, 4, 5 */
    cr_expect_eq(tr.bytes[0 * n + 3], 32 * 4.0 * 16, "the pool's output crosses the boundary");
    /* ring 2(R−1)/R·P over a stage's replicas, P = 80 params · 4 bytes for stage 0 */
    CHECK_CLOSE("allreduce bytes", &tr.bytes[0 * n + 1], (double[]){2.0 * 2 / 3 * 320}, 1, 0, 1e-12);
    CHECK_CLOSE("allreduce bytes", &tr.bytes[5 * n + 3], (double[]){2.0 * 2 / 3 * 1320}, 1, 0, 1e-12);
    cr_expect_eq(tr.messages[2 * n + 0], 4);
    topo_traffic_free(&tr);
}

/* ---- links and placement ------------------------------------------------------------ */

static topo_place cpu_place(int node, int *cores, int n)
{
    return (topo_place){.node = node, .gpu = -1, .n_cores = n, .cores = cores};
}

Test(topo, link_levels)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    int a[] = {0, 1, 2}, b[] = {5, 6}, c[] = {20, 21}, d[] = {2, 3};
    topo_place pa = cpu_place(0, a, 3), pb = cpu_place(0, b, 2), pc = cpu_place(0, c, 2),
               pd = cpu_place(0, d, 2), pe = cpu_place(1, b, 2);
    double bw, lat;
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pb, &bw, &lat), TOPO_LINK_SAME_L3);
    cr_expect_eq(bw, cm.bandwidth[TOPO_LINK_SAME_L3]);
    cr_expect_eq(lat, cm.latency[TOPO_LINK_SAME_L3]);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pc, NULL, NULL), TOPO_LINK_CROSS_PACKAGE);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pd, NULL, NULL), TOPO_LINK_SAME_CORE);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pe, NULL, NULL), TOPO_LINK_CROSS_NODE);
    topo_place g0 = {.node = 0, .gpu = 0}, g3 = {.node = 0, .gpu = 3}, g5 = {.node = 0, .gpu = 5},
               g1 = {.node = 0, .gpu = 1};
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g3, &bw, NULL), TOPO_LINK_GPU);
    cr_expect_eq(bw, 50e9, "the matrix gives the bandwidth");
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g5, &bw, NULL), TOPO_LINK_CROSS_PACKAGE);
    cr_expect_eq(bw, cm.bandwidth[TOPO_LINK_CROSS_PACKAGE]);
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g1, &bw, NULL), TOPO_LINK_GPU);
    cr_expect_eq(bw, 25e9);
    topo_free(t);

    t = load("node-16c-1gpu.xml");
    m = topo_get_machine(t);
    int e[] = {0, 1}, f[] = {4, 5};
    pa = cpu_place(0, e, 2);
    pb = cpu_place(0, f, 2);
    cr_expect_eq(topo_link_between(m, &cm, &pa, &pb, NULL, NULL), TOPO_LINK_SAME_NUMA,
                 "different L3 groups of one NUMA node");
    topo_free(t);

    t = load("ws-4gpu.xml");
    m = topo_get_machine(t);
    cr_expect_eq(topo_link_between(m, &cm, &g0, &g1, NULL, NULL), TOPO_LINK_PCIE);
    topo_free(t);
}

Test(topo, cost_of_two_stages_by_hand)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("local-2core.xml");
    const topo_machine *m = topo_get_machine(t);
    topo_traffic tr;
    double bv[1] = {5408};
    cr_assert_eq(topo_traffic_init(&tr, 2, 1, bv, NULL, 128, 4), 0);
    topo_placement pl;
    topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = 1};
    cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
    cr_expect_eq(pl.places[0].n_cores, 1);
    cr_expect_eq(pl.places[0].cores[0] + pl.places[1].cores[0], 1, "one core each");
    double one_way = 5408 * 4.0 * 128 / cm.bandwidth[TOPO_LINK_SAME_L3] +
                     4 * cm.latency[TOPO_LINK_SAME_L3];
    double per_rank[2];
    double total = topo_placement_cost(m, &tr, &cm, pl.places, per_rank);
    CHECK_CLOSE("cost", &total, (double[]){2 * one_way}, 1, 0, 1e-12);
    CHECK_CLOSE("rank 0's share", per_rank, (double[]){one_way}, 1, 0, 1e-12);
    CHECK_CLOSE("reported cost", &pl.cost_s, &total, 1, 0, 1e-12);
    topo_placement_free(&pl);
    topo_traffic_free(&tr);
    topo_free(t);
}

/* Package of a place: the one of all its cores, or -1 when they straddle packages. */
static int place_package(const topo_machine *m, const topo_place *p)
{
    int pkg = m->cores[p->cores[0]].package;
    for (int i = 1; i < p->n_cores; i++)
        if (m->cores[p->cores[i]].package != pkg)
            return -1;
    return pkg;
}

/* CPU placements: ranks of a node have their own cores, all of them used, while there are
 * enough; otherwise one core each, round robin, marked shared. */
static void check_cpu_cores(const char *what, const topo_machine *m, const topo_placement *pl,
                            int nodes)
{
    for (int k = 0; k < nodes; k++) {
        int *owner = calloc((size_t)m->n_cores, sizeof *owner), ranks = 0;
        for (int i = 0; i < pl->n_ranks; i++) {
            const topo_place *p = &pl->places[i];
            cr_assert(p->node >= 0 && p->node < nodes, "%s: rank %d on node %d", what, i, p->node);
            cr_assert_eq(p->gpu, -1, "%s: a CPU rank with a GPU", what);
            if (p->node != k)
                continue;
            ranks++;
            cr_assert_gt(p->n_cores, 0, "%s: rank %d has no cores", what, i);
            for (int c = 0; c < p->n_cores; c++) {
                cr_assert(p->cores[c] >= 0 && p->cores[c] < m->n_cores);
                cr_assert(c == 0 || p->cores[c] > p->cores[c - 1], "%s: cores not sorted", what);
                owner[p->cores[c]]++;
            }
        }
        for (int c = 0; c < m->n_cores; c++) {
            if (ranks == 0) {
                cr_expect_eq(owner[c], 0);
            } else if (ranks <= m->n_cores) {
                cr_expect_eq(owner[c], 1, "%s: node %d core %d has %d ranks with %d ranks on "
                             "%d cores", what, k, c, owner[c], ranks, m->n_cores);
            } else {
                cr_expect_geq(owner[c], 1, "%s: core %d idle while oversubscribed", what, c);
            }
        }
        for (int i = 0; i < pl->n_ranks; i++)
            if (pl->places[i].node == k)
                cr_expect_eq(pl->places[i].shared, ranks > m->n_cores, "%s: shared flag", what);
        free(owner);
    }
}

/* Stage boundaries that cross a package or node, against the fewest a chain through the
 * (node, package) groups it uses can have. */
static void check_neighbours(const char *what, const topo_machine *m, const topo_placement *pl)
{
    int groups = 0, crossings = 0, *seen = calloc((size_t)(m->n_packages + 1) * 64, sizeof *seen);
    for (int i = 0; i < pl->n_ranks; i++) {
        int pkg = place_package(m, &pl->places[i]);
        if (pkg < 0) {
            free(seen);
            return; /* fewer ranks than packages: a block spans packages, nothing to check */
        }
        int key = pl->places[i].node * (m->n_packages + 1) + pkg;
        groups += !seen[key];
        seen[key] = 1;
        if (i > 0) {
            const topo_place *a = &pl->places[i - 1], *b = &pl->places[i];
            crossings += a->node != b->node || place_package(m, a) != pkg;
        }
    }
    free(seen);
    cr_expect_eq(crossings, groups - 1, "%s: %d boundaries cross a package or node, %d needed",
                 what, crossings, groups - 1);
}

Test(topo, cpu_placement_invariants_on_every_machine)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    static const int stage_counts[] = {1, 2, 3, 4, 5, 8, 12, 16, 24, 40, 50};
    for (int k = 0; k < N_MACHINES; k++) {
        topo_t *t = load(machines[k].file);
        const topo_machine *m = topo_get_machine(t);
        for (int nodes = 1; nodes <= 2; nodes++)
            for (size_t s = 0; s < sizeof stage_counts / sizeof stage_counts[0]; s++) {
                int S = stage_counts[s];
                if (S > 2 * m->n_cores * nodes + 1)
                    continue;
                /* equal boundaries: then fewest crossings is also cheapest */
                double *bv = malloc((size_t)S * sizeof *bv);
                for (int i = 0; i < S; i++)
                    bv[i] = 10000;
                topo_traffic tr;
                cr_assert_eq(topo_traffic_init(&tr, S, 1, bv, NULL, 32, 4), 0);
                topo_placement pl;
                topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = nodes};
                char what[128];
                snprintf(what, sizeof what, "%s, %d stages, %d nodes", machines[k].file, S, nodes);
                cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s: %s", what,
                             pt_error_get());
                check_cpu_cores(what, m, &pl, nodes);
                if (S <= m->n_cores * nodes)
                    check_neighbours(what, m, &pl);
                cr_expect_leq(pl.cost_s, pl.naive_cost_s, "%s: worse than rank order", what);
                CHECK_CLOSE(what, &pl.cost_s, (double[]){topo_placement_cost(m, &tr, &cm, pl.places, NULL)},
                            1, 0, 1e-12);
                cr_expect_eq(pl.oversubscribed, (S + nodes - 1) / nodes > m->n_cores,
                             "%s: oversubscribed flag", what);
                topo_placement_free(&pl);
                opt.exclusive = 1;
                int rc = topo_place_ranks(&pl, m, &tr, &cm, &opt);
                cr_expect_eq(rc, (S + nodes - 1) / nodes > m->n_cores ? -1 : 0,
                             "%s: exclusive placement %s", what, rc ? "refused" : "accepted");
                if (rc == 0)
                    topo_placement_free(&pl);
                else
                    cr_expect(strstr(pt_error_get(), "exclusive"), "%s", pt_error_get());
                topo_traffic_free(&tr);
                free(bv);
            }
        topo_free(t);
    }
}

/* GPU placements: one NVIDIA GPU per rank, never two ranks on one, cores near the GPU and
 * not shared while the GPU's neighbourhood has enough. */
static void check_gpu_places(const char *what, const topo_machine *m, const topo_placement *pl)
{
    for (int i = 0; i < pl->n_ranks; i++) {
        const topo_place *p = &pl->places[i];
        cr_assert(p->gpu >= 0 && p->gpu < m->n_gpus, "%s: rank %d has no GPU", what, i);
        cr_expect(m->gpus[p->gpu].is_nvidia, "%s: rank %d on a non-NVIDIA GPU", what, i);
        cr_expect_gt(p->n_cores, 0, "%s: rank %d has no cores", what, i);
        const topo_gpu *g = &m->gpus[p->gpu];
        for (int c = 0; c < p->n_cores; c++) {
            int near = 0;
            for (int q = 0; q < g->n_near; q++)
                near |= g->near[q] == p->cores[c];
            cr_expect(near, "%s: rank %d core %d is not near GPU %d", what, i, p->cores[c], p->gpu);
        }
        for (int j = 0; j < i; j++) {
            const topo_place *o = &pl->places[j];
            if (o->node != p->node)
                continue;
            cr_expect_neq(o->gpu, p->gpu, "%s: ranks %d and %d share GPU %d", what, j, i, p->gpu);
            if (!p->shared)
                for (int a = 0; a < p->n_cores; a++)
                    for (int b = 0; b < o->n_cores; b++)
                        cr_expect_neq(p->cores[a], o->cores[b], "%s: ranks %d, %d share a core",
                                      what, j, i);
        }
    }
    cr_expect_leq(pl->cost_s, pl->naive_cost_s, "%s: worse than rank order", what);
}

Test(topo, gpu_placement_invariants)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    for (int k = 0; k < N_MACHINES; k++) {
        topo_t *t = load(machines[k].file);
        const topo_machine *m = topo_get_machine(t);
        int gpus = topo_count_cuda_gpus(m);
        for (int nodes = 1; nodes <= 2; nodes++)
            for (int S = 1; S <= 2 * gpus * nodes + 1 && S <= 17; S++) {
                double bv[16];
                for (int i = 0; i < 16; i++)
                    bv[i] = 1000 * (i % 3 + 1);
                topo_traffic tr;
                cr_assert_eq(topo_traffic_init(&tr, S, 1, bv, NULL, 32, 2), 0);
                topo_placement pl;
                topo_place_options opt = {.device = TOPO_DEVICE_CUDA, .nodes = nodes};
                char what[128];
                snprintf(what, sizeof what, "%s, %d stages on %d nodes, cuda", machines[k].file, S,
                         nodes);
                int rc = topo_place_ranks(&pl, m, &tr, &cm, &opt);
                if (S > gpus * nodes) {
                    cr_expect_eq(rc, -1, "%s: more ranks than GPUs accepted", what);
                    cr_expect(strstr(pt_error_get(), gpus ? "need a GPU each" : "no NVIDIA GPU"),
                              "%s: %s", what, pt_error_get());
                } else {
                    cr_assert_eq(rc, 0, "%s: %s", what, pt_error_get());
                    check_gpu_places(what, m, &pl);
                    topo_placement_free(&pl);
                }
                topo_traffic_free(&tr);
            }
        topo_free(t);
    }
}

Test(topo, nvlink_chain_beats_rank_order)
{
    /* GPU 3 and 4 have no NVLink: rank order crosses the packages there; the hybrid cube
     * mesh has a path through double links only (e.g. 1-2-3-0-4-7-6-5) */
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    double bv[7] = {21632, 5408, 15488, 3200, 2304, 256, 1000};
    for (int nodes = 1; nodes <= 2; nodes++) {
        topo_traffic tr;
        cr_assert_eq(topo_traffic_init(&tr, 8, 1, bv, NULL, 128, 8), 0);
        topo_placement pl;
        topo_place_options opt = {.device = TOPO_DEVICE_CUDA, .nodes = nodes};
        cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
        cr_expect_lt(pl.cost_s, pl.naive_cost_s * 0.9, "%d nodes: %g not clearly below %g", nodes,
                     pl.cost_s, pl.naive_cost_s);
        for (int i = 0; i + 1 < 8; i++) {
            double bw;
            topo_link l = topo_link_between(m, &cm, &pl.places[i], &pl.places[i + 1], &bw, NULL);
            cr_expect(l == TOPO_LINK_GPU && bw == 50e9, "%d nodes: boundary %d on %s at %g B/s",
                      nodes, i, topo_link_name(l), bw);
            cr_expect_eq(pl.places[i].node, pl.places[0].node, "%d nodes: the chain left a node",
                         nodes);
        }
        check_gpu_places("nvlink chain", m, &pl);
        topo_placement_free(&pl);
        topo_traffic_free(&tr);
    }
    topo_free(t);
}

/* 2 stages × 2 replicas on the two packages of node-2s-8gpu, placed by topo_place_ranks:
 * the pairs with the heavier traffic share a package. */
static void place_grid(double boundary_values, double param_bytes, topo_placement *pl,
                       const topo_machine *m, const topo_cost_model *cm)
{
    double bv[1] = {boundary_values}, pb[2] = {param_bytes, param_bytes};
    topo_traffic tr;
    cr_assert_eq(topo_traffic_init(&tr, 2, 2, bv, pb, 32, 4), 0);
    topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = 1};
    cr_assert_eq(topo_place_ranks(pl, m, &tr, cm, &opt), 0, "%s", pt_error_get());
    topo_traffic_free(&tr);
}

Test(topo, heavier_pairs_share_a_package)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    topo_placement pl;
    /* Large parameters, small activations: the Allreduce pairs matter more than the stage
     * boundaries, so the two replicas of each stage sit in one package, as rank order
     * (a stage's replicas consecutive) already has them. */
    place_grid(100, 400e6, &pl, m, &cm);
    for (int s = 0; s < 2; s++) {
        const topo_place *a = &pl.places[topo_grid_rank(2, s, 0)],
                         *b = &pl.places[topo_grid_rank(2, s, 1)];
        cr_expect_eq(place_package(m, a), place_package(m, b),
                     "stage %d's replicas in packages %d and %d", s, place_package(m, a),
                     place_package(m, b));
    }
    cr_expect_leq(pl.cost_s, pl.naive_cost_s);
    topo_placement_free(&pl);
    /* Small parameters, large activations: the boundaries matter more, so each replica's
     * two stages sit in one package, which rank order (stage 0 on package 0, stage 1 on
     * package 1) does not do: the placement must find it. */
    place_grid(1e6, 4e3, &pl, m, &cm);
    for (int r = 0; r < 2; r++) {
        const topo_place *a = &pl.places[topo_grid_rank(2, 0, r)],
                         *b = &pl.places[topo_grid_rank(2, 1, r)];
        cr_expect_eq(place_package(m, a), place_package(m, b),
                     "replica %d's stages in packages %d and %d", r, place_package(m, a),
                     place_package(m, b));
    }
    cr_expect_lt(pl.cost_s, pl.naive_cost_s);
    topo_placement_free(&pl);
    topo_free(t);
}

static int next_permutation(int *v, int n)
{
    int i = n - 2;
    while (i >= 0 && v[i] >= v[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = n - 1;
    while (v[j] <= v[i])
        j--;
    int t = v[i];
    v[i] = v[j];
    v[j] = t;
    for (int a = i + 1, b = n - 1; a < b; a++, b--) {
        t = v[a];
        v[a] = v[b];
        v[b] = t;
    }
    return 1;
}

Test(topo, exhaustive_search_is_optimal)
{
    /* Random traffic of 6 ranks (2 replicas of 3 stages) on the 2-socket node: the chosen
     * placement must cost what the best of all 720 assignments to the same places costs. */
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    unsigned seed = 12345;
    for (int trial = 0; trial < 4; trial++) {
        double bv[2], pb[3];
        for (int i = 0; i < 2; i++)
            bv[i] = 1 + rand_r(&seed) % 100000;
        for (int i = 0; i < 3; i++)
            pb[i] = 4.0 * (rand_r(&seed) % 2000000);
        topo_traffic tr;
        cr_assert_eq(topo_traffic_init(&tr, 3, 2, bv, pb, 64, 4), 0);
        topo_placement pl;
        topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = trial % 2 + 1};
        cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
        int perm[6] = {0, 1, 2, 3, 4, 5};
        topo_place places[6];
        double best = INFINITY;
        do {
            for (int i = 0; i < 6; i++)
                places[i] = pl.naive[perm[i]];
            double c = topo_placement_cost(m, &tr, &cm, places, NULL);
            best = c < best ? c : best;
        } while (next_permutation(perm, 6));
        CHECK_CLOSE("optimum", &pl.cost_s, &best, 1, 0, 1e-9);
        cr_expect(strstr(pl.method, "exhaustive"), "%s", pl.method);
        topo_placement_free(&pl);
        topo_traffic_free(&tr);
    }
    topo_free(t);
}

Test(topo, greedy_search_on_many_ranks)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    unsigned seed = 7;
    double bv[19], pb[20];
    for (int i = 0; i < 19; i++)
        bv[i] = 1 + rand_r(&seed) % 50000;
    for (int i = 0; i < 20; i++)
        pb[i] = 4.0 * (rand_r(&seed) % 1000000);
    topo_traffic tr;
    cr_assert_eq(topo_traffic_init(&tr, 20, 2, bv, pb, 64, 4), 0);
    topo_placement pl;
    topo_place_options opt = {.device = TOPO_DEVICE_CPU, .nodes = 2};
    cr_assert_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
    cr_expect(strstr(pl.method, "greedy"), "%s", pl.method);
    check_cpu_cores("40 ranks on 2 nodes", m, &pl, 2);
    cr_expect_leq(pl.cost_s, pl.naive_cost_s);
    topo_placement_free(&pl);
    topo_traffic_free(&tr);
    topo_free(t);
}

Test(topo, impossible_requests)
{
    topo_cost_model cm;
    topo_cost_model_default(&cm);
    topo_t *t = load("local-2core.xml");
    const topo_machine *m = topo_get_machine(t);
    double bv[4] = {1, 1, 1, 1};
    topo_traffic tr;
    cr_assert_eq(topo_traffic_init(&tr, 3, 1, bv, NULL, 8, 1), 0);
    topo_placement pl;
    topo_place_options opt = {.device = TOPO_DEVICE_CUDA, .nodes = 1};
    cr_expect_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), -1, "CUDA without a GPU");
    cr_expect(strstr(pt_error_get(), "no NVIDIA GPU"), "%s", pt_error_get());
    opt = (topo_place_options){.device = TOPO_DEVICE_CPU, .nodes = 1, .exclusive = 1};
    cr_expect_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), -1, "3 exclusive ranks on 2 cores");
    opt.nodes = 2; /* 2 + 1 ranks: fits */
    cr_expect_eq(topo_place_ranks(&pl, m, &tr, &cm, &opt), 0, "%s", pt_error_get());
    topo_placement_free(&pl);
    topo_traffic_free(&tr);
    topo_free(t);
}

Test(topo, local_cores_for_binding)
{
    topo_t *t = load("node-2s-8gpu.xml");
    const topo_machine *m = topo_get_machine(t);
    int *cores, n, shared;
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(topo_local_cores(m, "auto", r, 4, &cores, &n, &shared), 0);
        cr_expect_eq(n, 10);
        cr_expect_eq(cores[0], 10 * r, "rank %d starts at core %d", r, cores[0]);
        cr_expect_eq(cores[9], 10 * r + 9);
        cr_expect_eq(shared, 0);
        free(cores);
    }
    cr_assert_eq(topo_local_cores(m, "auto", 2, 3, &cores, &n, &shared), 0);
    cr_expect(n == 20 && cores[0] == 20, "3 ranks: the third has package 1 (%d cores from %d)", n,
              cores[0]);
    free(cores);
    cr_assert_eq(topo_local_cores(m, "core", 41, 45, &cores, &n, &shared), 0);
    cr_expect(n == 1 && cores[0] == 1 && shared, "core mode wraps round robin");
    free(cores);
    cr_assert_eq(topo_local_cores(m, "none", 0, 2, &cores, &n, &shared), 0);
    cr_expect(n == 0 && cores == NULL);
    cr_expect_eq(topo_local_cores(m, "socket", 0, 2, &cores, &n, &shared), -1);
    cr_expect_eq(topo_local_cores(m, "auto", 2, 2, &cores, &n, &shared), -1);
    topo_free(t);
}

/* ---- binding ------------------------------------------------------------------------ */

Test(topo, binding_sets_the_affinity)
{
    topo_t *t = NULL;
    cr_assert_eq(topo_init(&t, NULL), 0, "%s", pt_error_get());
    const topo_machine *m = topo_get_machine(t);
    char buf[256], want[32];
    /* each core in turn: at least one of these is a change from the inherited mask */
    for (int c = 0; c < m->n_cores && c < 4; c++) {
        cr_assert_eq(topo_bind_cores(t, &c, 1), 0, "%s", pt_error_get());
        int n = topo_affinity_read(buf, sizeof buf);
        cr_expect_eq(n, m->cores[c].n_pus, "core %d: %d CPUs allowed after binding", c, n);
        if (m->cores[c].n_pus == 1) {
            snprintf(want, sizeof want, "%d", m->cores[c].pu_first);
            cr_expect_str_eq(buf, want, "core %d", c);
        }
        cr_expect_eq(atoi(buf), m->cores[c].pu_first);
    }
    int *all = malloc((size_t)m->n_cores * sizeof *all);
    for (int c = 0; c < m->n_cores; c++)
        all[c] = c;
    cr_assert_eq(topo_bind_cores(t, all, m->n_cores), 0, "%s", pt_error_get());
    cr_expect_eq(topo_affinity_read(buf, sizeof buf), m->n_pus);
    free(all);
    int bad = m->n_cores;
    cr_expect_eq(topo_bind_cores(t, &bad, 1), -1, "a core that does not exist");
    topo_free(t);

    t = load("node-16c-1gpu.xml");
    int zero = 0;
    cr_expect_eq(topo_bind_cores(t, &zero, 1), -1, "binding to a described machine");
    cr_expect(strstr(pt_error_get(), "not this machine"), "%s", pt_error_get());
    topo_free(t);
}
