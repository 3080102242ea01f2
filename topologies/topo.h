/* Machine topology: discovery with hwloc (this machine or an XML description), placement of
 * a job's ranks on one or more such nodes by a communication cost model, and binding.
 *
 * Layers, so that most of it can be used and tested without hwloc or MPI:
 *   topo_t         opaque handle on an hwloc topology (topologies/topo.c);
 *   topo_machine   plain description extracted from it: cores, caches, GPUs, matrices;
 *   topo_traffic   bytes and messages each pair of ranks exchanges per training step;
 *   topo_placement node, GPU and cores of every rank, chosen by the cost model
 *                  (topologies/place.c and search.c, pure computation on plain structs);
 *   topo_bind_*    binding this process (topologies/bind.c, the only file using MPI).
 * Indices of cores, packages, NUMA nodes and L3 caches are hwloc logical indices (the order
 * of the tree, so neighbouring indices are neighbours in the machine); OS numbers appear
 * only where the OS needs them (affinity masks). */
#ifndef PT_TOPO_H
#define PT_TOPO_H

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>

#include "partition/partition.h"
#include "src/model/net.h"

/* ---- discovery ---------------------------------------------------------------------- */

typedef struct topo_s topo_t; /* hwloc topology plus its topo_machine */

typedef struct {
    int os_index;          /* the core's number given by the OS (not unique across packages) */
    int package, numa, l3; /* logical indices of the enclosing objects; -1 where none */
    int n_pus;             /* hardware threads */
    int pu_first;          /* OS index of its first hardware thread */
} topo_core;

typedef struct {
    char name[8];            /* "L1d", "L1i", "L2", "L3", ... */
    int count;               /* caches of this kind in the machine */
    unsigned long long size; /* bytes, of each one */
} topo_cache;

typedef struct {
    char busid[16];   /* PCI bus id, "0000:65:00.0" (lower case) */
    unsigned vendor_id, device_id;
    unsigned class_id; /* PCI class: 0x0300 display (VGA), 0x0302 3D controller, ... */
    char vendor[48];   /* "NVIDIA" etc. */
    char model[96];    /* from the CUDA OS device or the PCI name, else "[10de:1db1]" */
    int is_nvidia;     /* vendor 0x10de: usable by the CUDA backend */
    int cuda_index;    /* CUDA device number: from a "cudaN" OS device in the topology, or
                        * set by topo_match_cuda; -1 when unknown */
    int package, numa; /* logical index of the package / NUMA node it is attached to, or -1 */
    int n_near;        /* cores next to the GPU (its locality), logical indices; all cores */
    int *near;         /* when the topology does not say. Owned by the machine. */
} topo_gpu;

typedef struct {
    char source[256];   /* "this machine" or the XML file's path */
    char host[64];      /* HostName recorded in the topology, "" if none */
    char cpu_model[96]; /* of the first package, "" if unknown */
    int is_this_system; /* 1: binding is possible; 0: a described machine */
    int n_packages, n_numa, n_l3, n_cores, n_pus;
    unsigned long long memory;        /* bytes, all NUMA nodes */
    topo_core *cores;                 /* n_cores, in logical order */
    int n_caches;
    topo_cache caches[8];             /* largest level first */
    int n_gpus;                       /* compute devices (topo_pci_is_gpu): NVIDIA ones first,
                                       * then the others, each in bus order */
    topo_gpu *gpus;
    double *numa_distance;            /* n_numa², row-major, as in the topology (10 = local);
                                       * NULL when the topology has none */
    char numa_distance_name[32];
    double *gpu_bandwidth;            /* n_gpus², bytes/s between GPUs (0: no direct link);
                                       * NULL when the topology has none */
    char gpu_bandwidth_name[32];
} topo_machine;

/* Loads the topology of this machine (xml_path NULL) or the one described by an hwloc XML
 * file, with PCI and OS devices kept. An unreadable or malformed file is an error. */
int topo_init(topo_t **t, const char *xml_path);
void topo_free(topo_t *t);
/* The description; owned by `t`, valid until topo_free. */
const topo_machine *topo_get_machine(const topo_t *t);

/* 1 if a PCI device of this vendor and class is a GPU (a compute device): any 3D
 * controller (0x0302), and VGA or other display controllers (0x03xx) from NVIDIA, AMD or
 * Intel; a board's or BMC's VGA (ASPEED, Matrox, ...) is not. */
int topo_pci_is_gpu(unsigned vendor_id, unsigned class_id);

/* Number of NVIDIA GPUs (the ones the CUDA backend can use). */
int topo_count_cuda_gpus(const topo_machine *m);

/* Normalises a PCI bus id as CUDA ("0000:65:00.0", "0000:1A:00.0") or NVML
 * ("00000000:65:00.0") write it, or without domain ("65:00.0"), to "dddd:bb:dd.f" in lower
 * case. out must hold 16 bytes. */
int topo_busid_normalize(char out[16], const char *busid);

/* Matches CUDA device numbers to the topology's GPUs by PCI bus id: busids[d] is the bus id
 * of CUDA device d (cudaDeviceGetPCIBusId). Sets each GPU's cuda_index (-1 for GPUs CUDA did
 * not list). A bus id that is malformed or not in the topology is an error. The CUDA backend
 * calls this once after cudaGetDeviceCount; it is plain C so tests need no GPU. */
int topo_match_cuda(topo_t *t, const char *const *busids, int n);

/* `pipetrain topo` output: a readable summary, or JSON (one line; -1 with a message when it
 * could not be built or written). */
void topo_print_summary(const topo_machine *m, FILE *out);
int topo_print_json(const topo_machine *m, FILE *out);

/* "0-3,8,10-11" for a sorted list of integers. Returns the length it needed. */
int topo_format_list(char *buf, size_t size, const int *v, int n);

/* ---- communication cost model ------------------------------------------------------- */

/* The kind of link between the places of two ranks, closest first. */
typedef enum {
    TOPO_LINK_SAME_CORE = 0, /* ranks that share cores (oversubscribed) */
    TOPO_LINK_SAME_L3,       /* one core group sharing a last-level cache */
    TOPO_LINK_SAME_NUMA,
    TOPO_LINK_SAME_PACKAGE,
    TOPO_LINK_CROSS_PACKAGE,
    TOPO_LINK_GPU,           /* two GPUs with a value in the topology's bandwidth matrix */
    TOPO_LINK_PCIE,          /* two GPUs of one package without one */
    TOPO_LINK_CROSS_NODE,
    TOPO_LINK_COUNT
} topo_link;

typedef struct {
    double bandwidth[TOPO_LINK_COUNT]; /* bytes/s; not used for TOPO_LINK_GPU, whose links
                                        * take the topology's matrix value */
    double latency[TOPO_LINK_COUNT];   /* seconds per message */
} topo_cost_model;

/* Defaults: rough figures for MPI over shared memory, PCIe and a 100 Gb/s network; see
 * topologies/README.md. */
void topo_cost_model_default(topo_cost_model *cm);
/* Overrides from "same-package=20e9,cross-node=12.5e9" (names as topo_link_name); into
 * bandwidths, or latencies (seconds) when `latency` is non-zero. */
int topo_cost_model_parse(topo_cost_model *cm, const char *spec, int latency);
const char *topo_link_name(topo_link link); /* "same-core", ..., "cross-node" */

/* ---- traffic of a job --------------------------------------------------------------- */

/* A job is a grid of ranks: stage s of replica r is rank s·replicas + r, so the replicas of
 * one stage, whose gradient reductions are the heavier traffic, are consecutive ranks and
 * stages are outermost (tensor shards extend the grid innermost: src/plan/build.h). */
static inline int topo_grid_rank(int replicas, int s, int r)
{
    return s * replicas + r;
}
typedef struct {
    int n_ranks, stages, replicas;
    double *bytes;    /* owned, n_ranks², bytes rank i sends to rank j per step */
    double *messages; /* owned, n_ranks², messages i sends to j per step */
} topo_traffic;

/* Traffic of a pipeline replicated `replicas` times: between stage s and s+1 of a replica,
 * boundary_values[s] activations per sample · 4 bytes · batch forward and the same in
 * gradients backward, in `microbatches` messages each way (batch: samples per step per
 * replica); inside stage s, a ring Allreduce over its replicas sends 2(R−1)/R ·
 * param_bytes[s] per step from each replica to the next, in 2(R−1) messages.
 * boundary_values has stages−1 entries; param_bytes may be NULL when replicas is 1. */
int topo_traffic_init(topo_traffic *tr, int stages, int replicas, const double *boundary_values,
                      const double *param_bytes, int batch, int microbatches);
/* The same for a partitioned network: boundary values are the out shapes of each stage's
 * last layer, parameter bytes 4 per parameter of the stage's layers. */
int topo_traffic_from_partition(topo_traffic *tr, const net_desc *net, const partition *p,
                                int replicas, int batch, int microbatches);
void topo_traffic_free(topo_traffic *tr);

/* ---- placement ---------------------------------------------------------------------- */

typedef enum { TOPO_DEVICE_CPU = 0, TOPO_DEVICE_CUDA } topo_device;

typedef struct {
    topo_device device; /* CUDA: one NVIDIA GPU per rank, cores near it */
    int nodes;          /* copies of the machine (≥ 1) */
    int exclusive;      /* CPU: more ranks than cores is an error instead of sharing cores */
} topo_place_options;

typedef struct {
    int node;   /* 0 .. nodes−1 */
    int gpu;    /* index into machine->gpus, -1 for none */
    int n_cores;
    int *cores; /* owned by the placement: logical core indices on that node, sorted */
    int shared; /* 1 when another rank has some of these cores */
} topo_place;

typedef struct {
    int n_ranks;
    topo_place *places;  /* owned, n_ranks: the chosen placement */
    topo_place *naive;   /* owned, n_ranks: rank order (rank i on the i-th place) */
    double cost_s;       /* predicted communication time per step of `places` */
    double naive_cost_s; /* the same for `naive`; cost_s ≤ naive_cost_s always */
    int oversubscribed;  /* more ranks than cores on some node: cores are shared */
    char method[48];     /* how it was chosen: "exhaustive (40320 orders)", ... */
} topo_placement;

/* Places every rank of `tr` on `nodes` copies of machine `m`:
 * - CPU: each node's cores are cut into one contiguous block per rank that follows the
 *   hierarchy (package, NUMA node, L3), so a block does not straddle a package while there
 *   are at least as many ranks as packages; ranks share cores round robin when there are
 *   more ranks than cores (unless exclusive, which is then an error);
 * - CUDA: each rank gets its own NVIDIA GPU (fewer GPUs than ranks is an error, so is a
 *   machine without one) and a block of the cores near that GPU;
 * then assigns ranks to places to minimise the predicted time (exhaustive search while the
 * orderings number at most 10⁶, else greedy from every start plus pairwise swaps), and keeps
 * rank order when that is not worse. */
int topo_place_ranks(topo_placement *pl, const topo_machine *m, const topo_traffic *tr,
                     const topo_cost_model *cm, const topo_place_options *opt);
/* Whether n_ranks can be placed at all (enough GPUs, cores for --exclusive): the errors
 * topo_place_ranks would give, found before the work that precedes it (plan's profile). */
int topo_place_check(const topo_machine *m, int n_ranks, const topo_place_options *opt);
void topo_placement_free(topo_placement *pl);

/* The link between two places and its bandwidth (bytes/s) and latency under `cm`. */
topo_link topo_link_between(const topo_machine *m, const topo_cost_model *cm,
                            const topo_place *a, const topo_place *b, double *bandwidth,
                            double *latency);
/* Predicted communication time per step of `places` (the sum over sending ranks of bytes
 * over bandwidth plus messages times latency); per_rank (n_ranks entries, may be NULL)
 * receives each rank's share, the time of what it sends. */
double topo_placement_cost(const topo_machine *m, const topo_traffic *tr,
                           const topo_cost_model *cm, const topo_place *places,
                           double *per_rank);

/* Cores of one rank out of `local_size` on this node, for binding: mode "auto" gives it its
 * own contiguous block (the CPU placement above, in rank order: neighbouring ranks are
 * neighbouring stages), "core" one core, round robin, "none" nothing (n = 0). *shared is set
 * when cores are shared with another rank. *cores is malloc'ed; the caller frees it. */
int topo_local_cores(const topo_machine *m, const char *mode, int local_rank, int local_size,
                     int **cores, int *n, int *shared);

/* ---- binding ------------------------------------------------------------------------ */

/* Binds this whole process (all its threads, present and future) to the hardware threads
 * of the given cores. An error for a topology that is not this machine. */
int topo_bind_cores(topo_t *t, const int *cores, int n);
/* The CPUs this process may run on, read back from the OS (sched_getaffinity), as a list
 * "0-3,8". Returns the number of CPUs, or -1. */
int topo_affinity_read(char *buf, size_t size);

/* Called by every rank of a training job right after MPI_Init: finds the ranks on this
 * node (mpi_wait_split_node), loads this machine's topology, gives this rank its
 * cores (see topo_local_cores) and binds to them. *blas_threads_out receives the number of
 * cores (0 for "none"): the caller sets OpenBLAS's threads to it; *local_size_out the
 * number of ranks on this node (set once they are found). With verbose, every rank
 * prints one line (rank, host, cores, affinity read back) to stdout, in rank order.
 * Collective over comm; a rank that waits timeout_s for the others fails with a message. */
int topo_bind_rank(MPI_Comm comm, const char *mode, int verbose, double timeout_s,
                   int *blas_threads_out, int *local_size_out);

/* ---- command line ------------------------------------------------------------------- */


/* Text helpers for the topo, plan and devices commands (src/cli/cmd_topo.c, src/cli/cmd_devices.c). */
/* JSON values (jansson; NULL when out of memory): a string from any C string, with bytes
 * that are not UTF-8 (a path may hold any) replaced by U+FFFD, as JSON must be UTF-8; a
 * number: an integer when the value is a whole number (exact below 2^53), null when it is
 * not finite; an array of integers. */
struct json_t;
struct json_t *topo_json_text(const char *s);
struct json_t *topo_json_number(double v);
struct json_t *topo_json_int_list(const int *v, int n);
/* Writes j as one line to out and frees it; NULL (a tree that could not be built) or a
 * failed write is -1 with a message. */
int topo_json_print(struct json_t *j, FILE *out);
/* "1.5 GiB" style, binary units, for sizes. */
void topo_format_size(char *buf, size_t size, double bytes);
/* "12.3 MB" style, decimal units, for traffic (bytes/s figures are decimal too). */
void topo_format_bytes(char *buf, size_t size, double bytes);
/* "1.23 ms" style. */
void topo_format_seconds(char *buf, size_t size, double s);

#endif
