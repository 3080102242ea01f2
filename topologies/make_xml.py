#!/usr/bin/env python3
"""Writes the hwloc 2 XML descriptions of the machines pipetrain can plan for but that are
not here (see topologies/README.md). Run from anywhere: python3 topologies/make_xml.py
The files are committed; rerun this only after changing a description below, then check
each with `lstopo-no-graphics -i FILE` (HWLOC_XML_VERBOSE=1 shows import errors).

Why a script: an hwloc XML file repeats every cpuset, nodeset and index in several places,
and the `length=` of distance matrices must be exact, so hand editing goes wrong easily.
The CPU and PCI layouts follow the real machines named in each description; PCI ids and
bus numbers are those of the real parts, so tools that match GPUs by bus id behave as on
the real machine."""

import os
import sys
from xml.sax.saxutils import quoteattr

HERE = os.path.dirname(os.path.abspath(__file__))


def bitmap(bits):
    """hwloc bitmap string: 32-bit words, most significant first, comma separated."""
    if not bits:
        return "0x0"
    top = max(bits) // 32
    words = [0] * (top + 1)
    for b in bits:
        words[b // 32] |= 1 << (b % 32)
    return ",".join("0x%08x" % words[i] for i in range(top, -1, -1))


class Writer:
    def __init__(self, comment):
        self.lines = ['<?xml version="1.0" encoding="UTF-8"?>',
                      '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
                      "<!-- %s -->" % comment,
                      '<topology version="2.0">']
        self.gp = 0
        self.depth = 1

    def next_gp(self):
        self.gp += 1
        return self.gp

    def open(self, attrs, infos=(), close=False):
        text = " ".join('%s=%s' % (k, quoteattr(str(v))) for k, v in attrs)
        pad = "  " * self.depth
        if not infos and close:
            self.lines.append("%s<object %s/>" % (pad, text))
            return
        self.lines.append("%s<object %s>" % (pad, text))
        for name, value in infos:
            self.lines.append("%s  <info name=%s value=%s/>" % (pad, quoteattr(name), quoteattr(str(value))))
        self.depth += 1
        if close:
            self.close()

    def close(self):
        self.depth -= 1
        self.lines.append("%s</object>" % ("  " * self.depth))

    def raw(self, line):
        self.lines.append("  " * self.depth + line)

    def text(self):
        return "\n".join(self.lines + ["</topology>", ""])


def sets(cpus, nodes):
    c, n = bitmap(cpus), bitmap(nodes)
    return [("cpuset", c), ("complete_cpuset", c), ("nodeset", n), ("complete_nodeset", n)]


def cache(w, kind, os_index, cpus, nodes, size, depth, assoc, ctype):
    w.open([("type", kind), ("os_index", os_index)] + sets(cpus, nodes) +
           [("gp_index", w.next_gp()), ("cache_size", size), ("depth", depth),
            ("cache_linesize", 64), ("cache_associativity", assoc), ("cache_type", ctype)])


def pci_dev(w, busid, cls, vendor, device, infos, osdevs=(), speed="15.753846"):
    """A PCI function; osdevs: (name, osdev_type, subtype, infos) below it."""
    w.open([("type", "PCIDev"), ("gp_index", w.next_gp()), ("pci_busid", busid),
            ("pci_type", "%04x [%04x:%04x] [%04x:%04x] a1" % (cls, vendor, device, vendor, 0x1000 + device % 0x1000)),
            ("pci_link_speed", speed)], infos, close=not osdevs)
    if osdevs:
        gps = []
        for name, ostype, subtype, oinfos in osdevs:
            gp = w.next_gp()
            gps.append((name, gp))
            attrs = [("type", "OSDev"), ("gp_index", gp), ("name", name)]
            if subtype:
                attrs.append(("subtype", subtype))
            attrs.append(("osdev_type", ostype))
            w.open(attrs, oinfos, close=True)
        w.close()
        return gps
    return []


def bridge(w, kind, sec, sub, busid=None, depth=0):
    attrs = [("type", "Bridge"), ("gp_index", w.next_gp()),
             ("bridge_type", "0-1" if kind == "host" else "1-1"), ("depth", depth),
             ("bridge_pci", "0000:[%02x-%02x]" % (sec, sub))]
    if busid:
        attrs += [("pci_busid", busid), ("pci_type", "0604 [10b5:8747] [0000:0000] ca"),
                  ("pci_link_speed", "15.753846")]
    w.open(attrs)


def package(w, pkg, cpu_model, numa, mem, l3_groups, pu_of, cache_sizes, io):
    """One package with one NUMA node. l3_groups: list of lists of core ids (global core
    numbers); pu_of(core) gives the PU OS indexes of a core; io(w) writes the package's
    PCI tree."""
    all_cores = [c for g in l3_groups for c in g]
    cpus = [p for c in all_cores for p in pu_of(c)]
    w.open([("type", "Package"), ("os_index", pkg)] + sets(cpus, [numa]) + [("gp_index", w.next_gp())],
           [("CPUVendor", cpu_model[0]), ("CPUModel", cpu_model[1])])
    w.open([("type", "NUMANode"), ("os_index", numa)] + sets(cpus, [numa]) +
           [("gp_index", w.next_gp()), ("local_memory", mem)], close=True)
    l3, l2, l1 = cache_sizes
    for gi, group in enumerate(l3_groups):
        gcpus = [p for c in group for p in pu_of(c)]
        cache(w, "L3Cache", group[0], gcpus, [numa], l3, 3, 16, 0)
        for core in group:
            ccpus = pu_of(core)
            cache(w, "L2Cache", core, ccpus, [numa], l2, 2, 8, 0)
            cache(w, "L1Cache", core, ccpus, [numa], l1, 1, 8, 1)
            cache(w, "L1iCache", core, ccpus, [numa], l1, 1, 8, 2)
            w.open([("type", "Core"), ("os_index", core - all_cores[0])] + sets(ccpus, [numa]) +
                   [("gp_index", w.next_gp())])
            for p in ccpus:
                w.open([("type", "PU"), ("os_index", p)] + sets([p], [numa]) +
                       [("gp_index", w.next_gp())], close=True)
            w.close()  # Core
            w.close()  # L1i
            w.close()  # L1d
            w.close()  # L2
        w.close()  # L3
    io(w)
    w.close()  # Package


def machine(w, npus, nnuma, host):
    cpus, nodes = bitmap(range(npus)), bitmap(range(nnuma))
    w.open([("type", "Machine"), ("os_index", 0), ("cpuset", cpus), ("complete_cpuset", cpus),
            ("allowed_cpuset", cpus), ("nodeset", nodes), ("complete_nodeset", nodes),
            ("allowed_nodeset", nodes), ("gp_index", w.next_gp())],
           [("Backend", "Linux"), ("OSName", "Linux"), ("HostName", host),
            ("Architecture", "x86_64"), ("hwlocVersion", "2.9.0")])


def distances(w, name, kind, type_, indexing, indexes, values):
    """A distances2 block. kind: hwloc_distances_kind_e bits. The lengths must be exact."""
    n = len(indexes)
    assert len(values) == n * n
    w.raw('<distances2%s type="%s" nbobjs="%d" kind="%d" indexing="%s">' %
          (' name="%s"' % name if name else "", type_, n, kind, indexing))
    idx = " ".join(str(i) for i in indexes) + " "
    w.raw('  <indexes length="%d">%s</indexes>' % (len(idx), idx))
    vals = " ".join(str(v) for v in values) + " "
    w.raw('  <u64values length="%d">%s</u64values>' % (len(vals), vals))
    w.raw("</distances2>")


FROM_OS, FROM_USER, LATENCY, BANDWIDTH, HETERO = 1, 2, 4, 8, 16
NVIDIA, MELLANOX, ASPEED, SAMSUNG = 0x10de, 0x15b3, 0x1a03, 0x144d


def nic(w, busid, index):
    pci_dev(w, busid, 0x0207, MELLANOX, 0x1013,
            [("PCIVendor", "Mellanox Technologies"), ("PCIDevice", "MT27700 Family [ConnectX-4]")],
            [("ib%d" % index, 2, None, []), ("mlx5_%d" % index, 3, None, [])])


def node_16c_1gpu():
    """Single-socket server: 16-core AMD EPYC 9124 (4 CCDs of 4 cores, each CCD its own
    16 MB L3; SMT 2, so 32 hardware threads numbered core and core+16), 1 NUMA node,
    one NVIDIA H100 PCIe GPU with its CUDA OS device, a ConnectX NIC and an NVMe disk."""
    w = Writer("pipetrain: 16-core single-socket node with one H100 PCIe GPU "
               "(EPYC 9124-like: 4 L3 groups of 4 cores, SMT 2). Made by topologies/make_xml.py")
    machine(w, 32, 1, "gpu16")

    def io(wr):
        bridge(wr, "host", 0x40, 0x41)
        bridge(wr, "pci", 0x41, 0x41, "0000:40:01.1", depth=1)
        pci_dev(wr, "0000:41:00.0", 0x0302, NVIDIA, 0x2331,
                [("PCIVendor", "NVIDIA Corporation"), ("PCIDevice", "GH100 [H100 PCIe]")],
                [("cuda0", 5, "CUDA", [("Backend", "CUDA"), ("GPUVendor", "NVIDIA Corporation"),
                                       ("GPUModel", "NVIDIA H100 PCIe"),
                                       ("CUDAGlobalMemorySize", 83468288)])],
                speed="31.507692")
        wr.close()
        wr.close()
        bridge(wr, "host", 0x80, 0x82)
        bridge(wr, "pci", 0x81, 0x81, "0000:80:01.1", depth=1)
        nic(wr, "0000:81:00.0", 0)
        wr.close()
        bridge(wr, "pci", 0x82, 0x82, "0000:80:03.1", depth=1)
        pci_dev(wr, "0000:82:00.0", 0x0108, SAMSUNG, 0xa80a,
                [("PCIVendor", "Samsung Electronics Co Ltd"), ("PCIDevice", "NVMe SSD Controller PM9A1")],
                [("nvme0n1", 0, "Disk", [])])
        wr.close()
        wr.close()

    package(w, 0, ("AuthenticAMD", "AMD EPYC 9124 16-Core Processor"), 0, 137438953472,
            [list(range(g * 4, g * 4 + 4)) for g in range(4)], lambda c: [c, c + 16],
            (16777216, 1048576, 32768), io)
    w.close()
    return w.text()


# DGX-1 (Volta) NVLink topology, as `nvidia-smi topo -m` prints it: number of NVLink
# links between GPUs (0 = none: traffic goes over PCIe and, across packages, the CPU link).
DGX1_LINKS = [
    [0, 1, 1, 2, 2, 0, 0, 0],
    [1, 0, 2, 1, 0, 2, 0, 0],
    [1, 2, 0, 2, 0, 0, 1, 0],
    [2, 1, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 1, 1, 2],
    [0, 2, 0, 0, 1, 0, 2, 1],
    [0, 0, 1, 0, 1, 2, 0, 2],
    [0, 0, 0, 1, 2, 1, 2, 0],
]


def node_2s_8gpu():
    """DGX-1-like: 2 Xeon E5-2698 v4 packages (20 cores, one 50 MB L3, SMT 2: PU p and
    p+40), a NUMA node each (SLIT 10/21), 8 Tesla V100-SXM2 behind 4 PCIe switches (2 GPUs
    and one InfiniBand NIC per switch, 2 switches per package), the BMC's ASPEED VGA, and
    the NVLink bandwidth matrix of the hybrid cube mesh in MB/s (25000 per link, V100
    NVLink 2; 0 where two GPUs have no link) over the CUDA OS devices."""
    w = Writer("pipetrain: 2-socket node with 8 V100 GPUs on 4 PCIe switches, NVLink hybrid "
               "cube mesh bandwidth matrix and NUMA distances (DGX-1-like). Made by "
               "topologies/make_xml.py")
    machine(w, 80, 2, "dgx8")
    cuda_gp = {}

    def gpu(wr, busid, index):
        gps = pci_dev(wr, busid, 0x0302, NVIDIA, 0x1db1,
                      [("PCIVendor", "NVIDIA Corporation"), ("PCIDevice", "GV100GL [Tesla V100 SXM2 16GB]")],
                      [("cuda%d" % index, 5, "CUDA", [("Backend", "CUDA"), ("GPUVendor", "NVIDIA Corporation"),
                                                      ("GPUModel", "Tesla V100-SXM2-16GB"),
                                                      ("CUDAGlobalMemorySize", 16515072)])])
        cuda_gp[index] = gps[0][1]

    def switch_pair(wr, host_bus, buses, first_gpu, first_nic):
        """Host bridge, then 2 PLX switches each with 2 GPUs and the first with a NIC."""
        bridge(wr, "host", host_bus, buses[-1][-1])
        for s, (up, g0, g1, n) in enumerate(buses):
            bridge(wr, "pci", up, n if n else g1, "0000:%02x:%02x.0" % (host_bus, 2 + s), depth=1)
            bridge(wr, "pci", g0, g1, "0000:%02x:00.0" % up, depth=2)
            gpu(wr, "0000:%02x:00.0" % g0, first_gpu + 2 * s)
            gpu(wr, "0000:%02x:00.0" % g1, first_gpu + 2 * s + 1)
            wr.close()
            if n:
                nic(wr, "0000:%02x:00.0" % n, first_nic + s)
            wr.close()
        wr.close()

    def io0(wr):
        # GPU buses 06,07 / 0a,0b as on a DGX-1; NICs behind the same switches
        switch_pair(wr, 0x00, [(0x04, 0x06, 0x07, 0x08), (0x09, 0x0a, 0x0b, 0x0c)], 0, 0)
        bridge(wr, "host", 0x0d, 0x0e)
        bridge(wr, "pci", 0x0e, 0x0e, "0000:0d:00.0", depth=1)
        pci_dev(wr, "0000:0e:00.0", 0x0300, ASPEED, 0x2000,
                [("PCIVendor", "ASPEED Technology, Inc."), ("PCIDevice", "ASPEED Graphics Family")])
        wr.close()
        wr.close()

    def io1(wr):
        switch_pair(wr, 0x80, [(0x83, 0x85, 0x86, 0x87), (0x88, 0x89, 0x8a, 0x8b)], 4, 2)

    pkg_cores = [list(range(0, 20)), list(range(20, 40))]
    for pkg in range(2):
        package(w, pkg, ("GenuineIntel", "Intel(R) Xeon(R) CPU E5-2698 v4 @ 2.20GHz"), pkg,
                274877906944, [pkg_cores[pkg]], lambda c: [c, c + 40],
                (52428800, 262144, 32768), io0 if pkg == 0 else io1)
    w.close()
    distances(w, "NUMALatency", FROM_OS | LATENCY, "NUMANode", "os", [0, 1], [10, 21, 21, 10])
    values = []
    for i in range(8):
        for j in range(8):
            values.append(900000 if i == j else 25000 * DGX1_LINKS[i][j])
    distances(w, "NVLinkBandwidth", FROM_OS | BANDWIDTH, "OSDev", "gp",
              [cuda_gp[i] for i in range(8)], values)
    return w.text()


def ws_4gpu():
    """PCIe workstation: 24-core Threadripper 7960X-like (4 CCDs of 6 cores, each its own
    32 MB L3; SMT 2: PU c and c+24), one NUMA node, 4 GeForce RTX 4090 (display class
    0x0300) each on its own root port, no NVLink and no CUDA OS devices (as Debian's hwloc
    sees a real machine: GPUs are PCI devices only)."""
    w = Writer("pipetrain: 4-GPU PCIe workstation, 24-core single socket (4 L3 groups of 6), "
               "4 RTX 4090 on separate root ports, no NVLink. Made by topologies/make_xml.py")
    machine(w, 48, 1, "ws4")

    def io(wr):
        bridge(wr, "host", 0x00, 0x44)
        for k, bus in enumerate([0x01, 0x21, 0x41, 0x44]):
            bridge(wr, "pci", bus, bus, "0000:00:%02x.1" % (1 + k), depth=1)
            pci_dev(wr, "0000:%02x:00.0" % bus, 0x0300, NVIDIA, 0x2684,
                    [("PCIVendor", "NVIDIA Corporation"), ("PCIDevice", "AD102 [GeForce RTX 4090]")],
                    speed="31.507692")
            wr.close()
        wr.close()

    package(w, 0, ("AuthenticAMD", "AMD Ryzen Threadripper 7960X 24-Cores"), 0, 137438953472,
            [list(range(g * 6, g * 6 + 6)) for g in range(4)], lambda c: [c, c + 24],
            (33554432, 1048576, 32768), io)
    w.close()
    return w.text()


FILES = {
    "node-16c-1gpu.xml": node_16c_1gpu,
    "node-2s-8gpu.xml": node_2s_8gpu,
    "ws-4gpu.xml": ws_4gpu,
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else HERE
    for name, make in FILES.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(make())
        print("wrote", os.path.join(out, name))


if __name__ == "__main__":
    main()
