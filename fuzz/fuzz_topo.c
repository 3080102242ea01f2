/* libFuzzer harness: loading a topology file (topologies/topo.c: topo_init with the checks
 * of topologies/xml_check.c, then hwloc's XML reader). hwloc 2.9 crashes on some malformed
 * files; pipetrain must answer every file with a machine or a message, never a crash. A
 * loaded machine is checked for what the placement relies on. */
#include "fuzz/fuzz_input.h"
#include "topologies/topo.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_file f;
    if (fuzz_file_open(&f, data, size)) return 0;
    topo_t *t;
    if (topo_init(&t, f.path) == 0) {
        const topo_machine *m = topo_get_machine(t);
        if (m->n_cores < 0 || m->n_pus < 0 || m->n_gpus < 0 || (m->n_cores && !m->cores))
            abort();
        for (int g = 0; g < m->n_gpus; g++) (void)m->gpus[g];
        topo_free(t);
    }
    fuzz_file_close(&f);
    return 0;
}
