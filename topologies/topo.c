/* Topology discovery: loads an hwloc topology (this machine or an XML description) and
 * extracts the plain topo_machine the rest of the module works on; PCI bus id matching for
 * CUDA; binding this process to cores. */
#include "topologies/topo.h"

#include <dlfcn.h>
#include <ctype.h>
#include <errno.h>
#include <hwloc.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>

#include "src/base/error.h"
#include "src/base/io.h"
#include "topologies/xml_check.h"

struct topo_s {
    hwloc_topology_t hw;
    topo_machine m;
};

static void copy_string(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src ? src : "");
}

static int obj_logical(hwloc_obj_t o) { return o ? (int)o->logical_index : -1; }

/* The NUMA node whose cpuset contains `set`, or -1 (NUMA nodes are memory children in hwloc
 * 2, not ancestors, so they are found by cpuset). */
static int numa_of_cpuset(hwloc_topology_t hw, hwloc_const_cpuset_t set)
{
    hwloc_obj_t n = NULL;
    while ((n = hwloc_get_next_obj_by_type(hw, HWLOC_OBJ_NUMANODE, n)) != NULL)
        if (n->cpuset && !hwloc_bitmap_iszero(set) && hwloc_bitmap_isincluded(set, n->cpuset))
            return (int)n->logical_index;
    return -1;
}

static int extract_cores(topo_t *t)
{
    hwloc_topology_t hw = t->hw;
    topo_machine *m = &t->m;
    /* Some virtual machines report PUs without cores: then a PU stands for a core. */
    hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE
                                                                                 : HWLOC_OBJ_PU;
    m->n_cores = hwloc_get_nbobjs_by_type(hw, core_type);
    if (m->n_cores <= 0)
        return pt_error_set("%s: the topology has no cores", m->source);
    m->cores = calloc((size_t)m->n_cores, sizeof *m->cores);
    if (!m->cores)
        return pt_error_set("%s: out of memory", m->source);
    for (int i = 0; i < m->n_cores; i++) {
        hwloc_obj_t c = hwloc_get_obj_by_type(hw, core_type, (unsigned)i);
        topo_core *tc = &m->cores[i];
        tc->os_index = (int)c->os_index;
        tc->package = obj_logical(hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_PACKAGE, c));
        tc->l3 = obj_logical(hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_L3CACHE, c));
        tc->numa = numa_of_cpuset(hw, c->cpuset);
        tc->n_pus = hwloc_bitmap_weight(c->cpuset);
        tc->pu_first = hwloc_bitmap_first(c->cpuset);
    }
    return 0;
}

static void extract_caches(topo_t *t)
{
    static const struct { hwloc_obj_type_t type; const char *name; } kinds[] = {
        {HWLOC_OBJ_L5CACHE, "L5"}, {HWLOC_OBJ_L4CACHE, "L4"}, {HWLOC_OBJ_L3CACHE, "L3"},
        {HWLOC_OBJ_L2CACHE, "L2"}, {HWLOC_OBJ_L1CACHE, "L1d"}, {HWLOC_OBJ_L1ICACHE, "L1i"},
    };
    topo_machine *m = &t->m;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0] && m->n_caches < 8; k++) {
        int count = hwloc_get_nbobjs_by_type(t->hw, kinds[k].type);
        if (count <= 0)
            continue;
        hwloc_obj_t first = hwloc_get_obj_by_type(t->hw, kinds[k].type, 0);
        topo_cache *c = &m->caches[m->n_caches++];
        copy_string(c->name, sizeof c->name, kinds[k].name);
        if (kinds[k].type == HWLOC_OBJ_L1CACHE && first->attr->cache.type == HWLOC_OBJ_CACHE_UNIFIED)
            copy_string(c->name, sizeof c->name, "L1");
        c->count = count;
        c->size = first->attr->cache.size;
    }
}

static const char *vendor_name(unsigned id)
{
    switch (id) {
    case 0x10de: return "NVIDIA";
    case 0x1002: return "AMD";
    case 0x8086: return "Intel";
    default: return NULL;
    }
}

static void pci_busid(char out[16], const struct hwloc_pcidev_attr_s *p)
{
    snprintf(out, 16, "%04x:%02x:%02x.%01x", (unsigned)p->domain, (unsigned)p->bus,
             (unsigned)p->dev, (unsigned)p->func & 0xf);
}

/* Which PCI devices are GPUs, that is compute devices, decided by PCI class and vendor
 * (hwloc in Debian has no CUDA, OpenCL or NVML plugin, so the PCI ids are all there is):
 * - class 0x0302, 3D controller: a GPU from any vendor. NVIDIA's data-centre GPUs (V100,
 *   A100, H100) have no display output and use this class.
 * - the other display classes (0x0300 VGA, 0x0301 XGA, 0x0380 other display controller):
 *   a GPU only from a vendor that makes compute GPUs: NVIDIA (GeForce, RTX and Quadro
 *   cards are VGA class), AMD (Instinct cards are 0x0380), Intel (Data Center GPU Max is
 *   0x0380). From any other vendor (ASPEED, Matrox, ...) it is the display adapter of
 *   a server's board or BMC, which computes nothing.
 * Only NVIDIA GPUs are used by the CUDA backend (is_nvidia). */
int topo_pci_is_gpu(unsigned vendor_id, unsigned class_id)
{
    if ((class_id >> 8) != 0x03)
        return 0;
    if (class_id == 0x0302)
        return 1;
    return vendor_id == 0x10de || vendor_id == 0x1002 || vendor_id == 0x8086;
}

static int pci_is_gpu(hwloc_obj_t o)
{
    return topo_pci_is_gpu(o->attr->pcidev.vendor_id, o->attr->pcidev.class_id);
}

/* NVIDIA GPUs first, then the others (AMD, Intel), each in bus order. */
static int compare_gpu(const void *a, const void *b)
{
    const topo_gpu *x = a, *y = b;
    if (x->is_nvidia != y->is_nvidia)
        return y->is_nvidia - x->is_nvidia;
    return strcmp(x->busid, y->busid);
}

/* Fills one GPU from its PCI device: names, CUDA number from a "cudaN" OS device below it,
 * and locality from the first non-I/O ancestor (the package or machine it hangs off). */
static int fill_gpu(topo_t *t, topo_gpu *g, hwloc_obj_t pci)
{
    const struct hwloc_pcidev_attr_s *p = &pci->attr->pcidev;
    pci_busid(g->busid, p);
    g->vendor_id = p->vendor_id;
    g->device_id = p->device_id;
    g->class_id = p->class_id;
    g->is_nvidia = p->vendor_id == 0x10de;
    g->cuda_index = -1;
    const char *v = vendor_name(p->vendor_id);
    if (!v)
        v = hwloc_obj_get_info_by_name(pci, "PCIVendor");
    if (v)
        copy_string(g->vendor, sizeof g->vendor, v);
    else
        snprintf(g->vendor, sizeof g->vendor, "0x%04x", p->vendor_id);
    const char *model = NULL;
    for (hwloc_obj_t os = pci->io_first_child; os; os = os->next_sibling) {
        if (os->type != HWLOC_OBJ_OS_DEVICE || !os->name)
            continue;
        int n;
        char end;
        if (sscanf(os->name, "cuda%d%c", &n, &end) == 1 && n >= 0)
            g->cuda_index = n;
        const char *gm = hwloc_obj_get_info_by_name(os, "GPUModel");
        if (gm && !model)
            model = gm;
    }
    if (!model)
        model = hwloc_obj_get_info_by_name(pci, "PCIDevice");
    if (model)
        copy_string(g->model, sizeof g->model, model);
    else
        snprintf(g->model, sizeof g->model, "[%04x:%04x]", p->vendor_id, p->device_id);

    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t->hw, pci);
    hwloc_obj_t pkg = anc ? (anc->type == HWLOC_OBJ_PACKAGE ? anc
                             : hwloc_get_ancestor_obj_by_type(t->hw, HWLOC_OBJ_PACKAGE, anc))
                          : NULL;
    g->package = obj_logical(pkg);
    g->numa = anc && anc->cpuset ? numa_of_cpuset(t->hw, anc->cpuset) : -1;
    const topo_machine *m = &t->m;
    g->near = malloc((size_t)m->n_cores * sizeof *g->near);
    if (!g->near)
        return pt_error_set("%s: out of memory", m->source);
    hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE
                                                                                    : HWLOC_OBJ_PU;
    for (int i = 0; i < m->n_cores; i++) {
        hwloc_obj_t c = hwloc_get_obj_by_type(t->hw, core_type, (unsigned)i);
        if (anc && anc->cpuset && hwloc_bitmap_isincluded(c->cpuset, anc->cpuset))
            g->near[g->n_near++] = i;
    }
    if (g->n_near == 0) /* no locality recorded: every core is as near as any other */
        for (int i = 0; i < m->n_cores; i++)
            g->near[g->n_near++] = i;
    return 0;
}

static int extract_gpus(topo_t *t)
{
    topo_machine *m = &t->m;
    int n = 0;
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(t->hw, o)) != NULL;)
        n += pci_is_gpu(o);
    if (n == 0)
        return 0;
    m->gpus = calloc((size_t)n, sizeof *m->gpus);
    if (!m->gpus)
        return pt_error_set("%s: out of memory", m->source);
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(t->hw, o)) != NULL;) {
        if (!pci_is_gpu(o))
            continue;
        if (fill_gpu(t, &m->gpus[m->n_gpus++], o) < 0)
            return -1;
    }
    /* So GPU g is CUDA device g under CUDA_DEVICE_ORDER=PCI_BUS_ID when all are visible. */
    qsort(m->gpus, (size_t)m->n_gpus, sizeof *m->gpus, compare_gpu);
    return 0;
}

/* Index of the GPU an object of a distance matrix stands for (its PCI device, or the PCI
 * device above an OS device), or -1. */
static int gpu_of_obj(const topo_machine *m, hwloc_obj_t o)
{
    while (o && o->type == HWLOC_OBJ_OS_DEVICE)
        o = o->parent;
    if (!o || o->type != HWLOC_OBJ_PCI_DEVICE)
        return -1;
    char id[16];
    pci_busid(id, &o->attr->pcidev);
    for (int g = 0; g < m->n_gpus; g++)
        if (!strcmp(m->gpus[g].busid, id))
            return g;
    return -1;
}

static int extract_distances(topo_t *t)
{
    topo_machine *m = &t->m;
    unsigned nr = 0;
    if (hwloc_distances_get(t->hw, &nr, NULL, 0, 0) < 0 || nr == 0)
        return 0;
    struct hwloc_distances_s **d = calloc(nr, sizeof *d);
    if (!d)
        return pt_error_set("%s: out of memory", m->source);
    int rc = 0;
    if (hwloc_distances_get(t->hw, &nr, d, 0, 0) < 0) {
        free(d);
        return 0;
    }
    for (unsigned k = 0; k < nr && rc == 0; k++) {
        struct hwloc_distances_s *ds = d[k];
        const char *name = hwloc_distances_get_name(t->hw, ds);
        unsigned n = ds->nbobjs;
        int all_numa = 1;
        for (unsigned i = 0; i < n; i++)
            all_numa &= ds->objs[i]->type == HWLOC_OBJ_NUMANODE;
        if (all_numa && !m->numa_distance && (ds->kind & HWLOC_DISTANCES_KIND_MEANS_LATENCY) &&
            m->n_numa > 0) {
            m->numa_distance = calloc((size_t)m->n_numa * m->n_numa, sizeof(double));
            if (!m->numa_distance) {
                rc = pt_error_set("%s: out of memory", m->source);
                break;
            }
            for (unsigned i = 0; i < n; i++)
                for (unsigned j = 0; j < n; j++) {
                    unsigned a = ds->objs[i]->logical_index, b = ds->objs[j]->logical_index;
                    if (a < (unsigned)m->n_numa && b < (unsigned)m->n_numa)
                        m->numa_distance[a * m->n_numa + b] = (double)ds->values[i * n + j];
                }
            copy_string(m->numa_distance_name, sizeof m->numa_distance_name, name ? name : "NUMA");
        } else if ((ds->kind & HWLOC_DISTANCES_KIND_MEANS_BANDWIDTH) && !m->gpu_bandwidth &&
                   m->n_gpus > 1) {
            int covered = 0;
            for (unsigned i = 0; i < n; i++)
                covered += gpu_of_obj(m, ds->objs[i]) >= 0;
            if (covered < 2)
                continue;
            m->gpu_bandwidth = calloc((size_t)m->n_gpus * m->n_gpus, sizeof(double));
            if (!m->gpu_bandwidth) {
                rc = pt_error_set("%s: out of memory", m->source);
                break;
            }
            /* hwloc's GPU link matrices (NVLinkBandwidth, XGMIBandwidth, ...) are in MB/s;
             * objects that are not GPUs (an NVSwitch) are left out. */
            for (unsigned i = 0; i < n; i++)
                for (unsigned j = 0; j < n; j++) {
                    int a = gpu_of_obj(m, ds->objs[i]), b = gpu_of_obj(m, ds->objs[j]);
                    if (a >= 0 && b >= 0)
                        m->gpu_bandwidth[a * m->n_gpus + b] = (double)ds->values[i * n + j] * 1e6;
                }
            copy_string(m->gpu_bandwidth_name, sizeof m->gpu_bandwidth_name, name ? name : "bandwidth");
        }
    }
    for (unsigned k = 0; k < nr; k++)
        hwloc_distances_release(t->hw, d[k]);
    free(d);
    return rc;
}

static int extract_machine(topo_t *t)
{
    topo_machine *m = &t->m;
    hwloc_obj_t root = hwloc_get_root_obj(t->hw);
    copy_string(m->host, sizeof m->host, hwloc_obj_get_info_by_name(root, "HostName"));
    m->is_this_system = hwloc_topology_is_thissystem(t->hw);
    m->n_packages = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_PACKAGE);
    m->n_numa = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_NUMANODE);
    m->n_l3 = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_L3CACHE);
    m->n_pus = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_PU);
    m->memory = root->total_memory;
    if (m->n_packages > 0)
        copy_string(m->cpu_model, sizeof m->cpu_model,
                    hwloc_obj_get_info_by_name(hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_PACKAGE, 0),
                                               "CPUModel"));
    if (extract_cores(t) < 0)
        return -1;
    extract_caches(t);
    if (extract_gpus(t) < 0)
        return -1;
    return extract_distances(t);
}

static void machine_free(topo_machine *m)
{
    for (int g = 0; g < m->n_gpus; g++)
        free(m->gpus[g].near);
    free(m->gpus);
    free(m->cores);
    free(m->numa_distance);
    free(m->gpu_bandwidth);
    memset(m, 0, sizeof *m);
}

/* Debian ships hwloc's libxml2 XML reader (and its PCI discovery) as plugins in
 * libhwloc-plugins, a Recommends that minimal installs skip. Without it hwloc falls back to
 * a minimalistic parser that rejects any file hwloc did not write itself, so a failed parse
 * names the missing package rather than blaming the file. */
static int topo_xml_support(void)
{
    const char *dirs = getenv("HWLOC_PLUGINS_PATH"); /* hwloc's override: ':'-separated */
    if (!dirs || !*dirs) return access(PT_HWLOC_XML_PLUGIN, R_OK) == 0;
    char path[4096];
    for (const char *d = dirs; *d;) {
        size_t n = strcspn(d, ":");
        snprintf(path, sizeof path, "%.*s/hwloc_xml_libxml.so", (int)n, d);
        if (access(path, R_OK) == 0) return 1;
        d += n + (d[n] == ':');
    }
    return 0;
}

/* hwloc refused the file at `path`: why, as far as pipetrain can tell. */
static int xml_refused(const char *path)
{
    if (!topo_xml_support())
        return pt_error_set("%s: hwloc cannot read XML topologies on this machine: its "
                            "libxml2 reader (" PT_HWLOC_XML_PLUGIN ") is missing; install "
                            "it with: apt-get install libhwloc-plugins", path);
    return pt_error_set("%s: not a valid hwloc XML topology (HWLOC_XML_VERBOSE=1 "
                        "lstopo-no-graphics -i FILE shows why)", path);
}

int topo_init(topo_t **out, const char *xml_path)
{
    *out = NULL;
    if (xml_path) {
        /* hwloc's own message for a missing file is only visible with HWLOC_XML_VERBOSE. */
        int fd = pt_open_regular(xml_path);
        if (fd < 0)
            return -1;
        close(fd);
        int checked = topo_xml_check(xml_path);
        if (checked < 0) return -1;
        if (checked > 0) return xml_refused(xml_path);
    }
    topo_t *t = calloc(1, sizeof *t);
    if (!t)
        return pt_error_set("out of memory");
    copy_string(t->m.source, sizeof t->m.source, xml_path ? xml_path : "this machine");
    if (hwloc_topology_init(&t->hw) < 0) {
        free(t);
        return pt_error_set("hwloc_topology_init failed: %s", strerror(errno));
    }
    /* hwloc's GL plugin (in libhwloc-plugins) opens X displays :0, :1, ... to find GPUs'
     * screens, and each attempt may wait seconds for DNS; its OpenCL one starts an OpenCL
     * runtime. pipetrain needs neither: GPUs come from PCI. */
    hwloc_topology_set_components(t->hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "gl");
    hwloc_topology_set_components(t->hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "opencl");
    /* Without this hwloc drops PCI and OS devices, and with them the GPUs. */
    hwloc_topology_set_io_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    hwloc_topology_set_icache_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_ALL);
    /* hwloc parses the file in set_xml (libxml2 or its own parser) and checks the objects in
     * load; either failure is a malformed file. */
    int failed = (xml_path && hwloc_topology_set_xml(t->hw, xml_path) < 0) ||
                 hwloc_topology_load(t->hw) < 0;
    /* hwloc's XML plugin (libxml2 under it) keeps a few kB reachable from its globals after
     * rejecting some malformed files (fuzz_topo found one); hwloc unloads the plugin with
     * the last topology, and LeakSanitizer then reports that memory as leaked. Keeping the
     * plugin mapped keeps it reachable, as for libpciaccess below. A no-op where it is not
     * loaded. */
    if (xml_path) dlopen(PT_HWLOC_XML_PLUGIN, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    if (failed) {
        int e = errno;
        hwloc_topology_destroy(t->hw);
        free(t);
        if (xml_path) return xml_refused(xml_path);
        return pt_error_set("hwloc cannot discover this machine's topology: %s", strerror(e));
    }
    /* hwloc's PCI plugin uses libpciaccess, whose state hangs off that library's globals;
     * when the last topology is destroyed hwloc unloads the plugin and the library with it,
     * and LeakSanitizer then reports that state (1 kB, once) as leaked, failing sanitizer
     * builds. Keeping the library mapped keeps it reachable. A no-op where it is not
     * loaded. */
    if (!xml_path)
        dlopen("libpciaccess.so.0", RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    if (extract_machine(t) < 0) {
        topo_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void topo_free(topo_t *t)
{
    if (!t)
        return;
    machine_free(&t->m);
    hwloc_topology_destroy(t->hw);
    free(t);
}

const topo_machine *topo_get_machine(const topo_t *t) { return &t->m; }

int topo_count_cuda_gpus(const topo_machine *m)
{
    int n = 0;
    for (int g = 0; g < m->n_gpus; g++)
        n += m->gpus[g].is_nvidia;
    return n;
}

int topo_busid_normalize(char out[16], const char *busid)
{
    unsigned long dom = 0;
    unsigned bus, dev, fn;
    int used = 0;
    const char *s = busid;
    /* With a domain there are two colons before the function. */
    const char *c1 = strchr(s, ':');
    if (c1 && strchr(c1 + 1, ':')) {
        char *end;
        errno = 0;
        dom = strtoul(s, &end, 16);
        if (end != c1 || errno || dom > 0xffff)
            return pt_error_set("bad PCI bus id \"%s\"", busid);
        s = c1 + 1;
    }
    /* exactly "hh:hh.h" (sscanf alone would accept blanks, signs and single digits) */
    int strict = strlen(s) == 7 && s[2] == ':' && s[5] == '.';
    for (int i = 0; strict && i < 7; i++)
        if (i != 2 && i != 5 && !isxdigit((unsigned char)s[i])) strict = 0;
    for (const char *q = busid; strict && q < s; q++) /* the domain too */
        if (q != c1 && !isxdigit((unsigned char)*q)) strict = 0;
    if (!strict || sscanf(s, "%2x:%2x.%1x%n", &bus, &dev, &fn, &used) != 3 || s[used] != '\0' ||
        dev > 0x1f || fn > 7)
        return pt_error_set("bad PCI bus id \"%s\" (expected like 0000:65:00.0)", busid);
    snprintf(out, 16, "%04lx:%02x:%02x.%x", dom, bus, dev, fn);
    return 0;
}

int topo_match_cuda(topo_t *t, const char *const *busids, int n)
{
    topo_machine *m = &t->m;
    int *found = malloc(((size_t)n + 1) * sizeof *found);
    if (!found)
        return pt_error_set("out of memory");
    for (int d = 0; d < n; d++) {
        char id[16];
        if (topo_busid_normalize(id, busids[d]) < 0) {
            free(found);
            return pt_error_set("CUDA device %d: %s", d, pt_error_get());
        }
        found[d] = -1;
        for (int g = 0; g < m->n_gpus; g++)
            if (!strcmp(m->gpus[g].busid, id))
                found[d] = g;
        if (found[d] < 0) {
            free(found);
            return pt_error_set("CUDA device %d (%s) is not a GPU of the topology (%s)", d, id,
                                m->source);
        }
        for (int e = 0; e < d; e++)
            if (found[e] == found[d]) {
                free(found);
                return pt_error_set("CUDA devices %d and %d have the same bus id %s", e, d, id);
            }
    }
    for (int g = 0; g < m->n_gpus; g++)
        m->gpus[g].cuda_index = -1;
    for (int d = 0; d < n; d++)
        m->gpus[found[d]].cuda_index = d;
    free(found);
    return 0;
}

int topo_bind_cores(topo_t *t, const int *cores, int n)
{
    if (!t->m.is_this_system)
        return pt_error_set("cannot bind to %s: it is not this machine", t->m.source);
    if (n <= 0)
        return pt_error_set("no cores to bind to");
    hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE
                                                                                    : HWLOC_OBJ_PU;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return pt_error_set("out of memory");
    for (int i = 0; i < n; i++) {
        hwloc_obj_t c = hwloc_get_obj_by_type(t->hw, core_type, (unsigned)cores[i]);
        if (!c) {
            hwloc_bitmap_free(set);
            return pt_error_set("core %d does not exist (this machine has %d)", cores[i],
                                t->m.n_cores);
        }
        hwloc_bitmap_or(set, set, c->cpuset);
    }
    /* PROCESS: every thread, including OpenBLAS's pool created later, inherits the mask. */
    int rc = hwloc_set_cpubind(t->hw, set, HWLOC_CPUBIND_PROCESS);
    int e = errno;
    hwloc_bitmap_free(set);
    if (rc < 0)
        return pt_error_set("hwloc_set_cpubind: %s", strerror(e));
    return 0;
}

int topo_affinity_read(char *buf, size_t size)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) < 0)
        return pt_error_set("sched_getaffinity: %s", strerror(errno));
    int cpus[CPU_SETSIZE], n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    topo_format_list(buf, size, cpus, n);
    return n;
}

int topo_format_list(char *buf, size_t size, const int *v, int n)
{
    size_t len = 0;
    int truncated = 0;
    if (size)
        buf[0] = '\0';
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && v[j + 1] == v[j] + 1)
            j++;
        char part[32];
        if (j == i)
            snprintf(part, sizeof part, "%s%d", i ? "," : "", v[i]);
        else
            snprintf(part, sizeof part, "%s%d-%d", i ? "," : "", v[i], v[j]);
        size_t pl = strlen(part);
        /* Only whole items: a list cut in the middle of a number would be wrong, not short. */
        if (!truncated && len + pl < size)
            memcpy(buf + len, part, pl + 1);
        else
            truncated = 1;
        len += pl;
        i = j + 1;
    }
    return (int)len;
}
