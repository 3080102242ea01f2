/* Tests of topologies/ discovery, cost model and traffic: every machine description loads
 * with the expected counts, malformed XML is a clear error, bus ids match CUDA numbers, and
 * the cost model and traffic are as documented. Placement and binding:
 * tests/test_topo_place.c. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/base/error.h"
#include "tests/check.h"
#include "tests/topo_machines.h"
#include "topologies/topo.h"

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* ---- discovery ---------------------------------------------------------------------- */

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
