/* A topology file is checked before hwloc parses it in this process: hwloc 2.9 crashes on
 * some malformed files (SIGSEGV inside hwloc_topology_load, lstopo too; 74 such inputs in
 * 150 s of fuzzing), and a PU numbered 4294967295 makes it allocate half a gigabyte for one
 * bitmap. pipetrain must answer a bad file with a message, whatever hwloc does with it. */
#ifndef PT_TOPO_XML_CHECK_H
#define PT_TOPO_XML_CHECK_H

/* The largest PU or NUMA node number taken (hwloc sizes its bitmaps by the largest). */
#define TOPO_MAX_OS_INDEX 1048575u

/* 0 when hwloc can be given the XML file at `path` safely: its PU and NUMA node numbers
 * are at most TOPO_MAX_OS_INDEX, and hwloc read it in a child process (fork) without
 * crashing or refusing it. 1 when hwloc refused it cleanly in the child: the caller says so
 * without loading it again (hwloc 2.9 leaks objects on some refusal paths, which
 * LeakSanitizer reports). −1 with a message naming the file and what is wrong (the object
 * and its line, or how hwloc ended). No MPI call is made in the child. */
int topo_xml_check(const char *path);

#endif
