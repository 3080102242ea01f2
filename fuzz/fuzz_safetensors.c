/* libFuzzer harness: the safetensors reader (src/io/safetensors.c) and the checkpoint loader on
 * top of it (src/io/checkpoint.c), for a small fixed model. */
#include "fuzz/fuzz_input.h"
#include "src/io/checkpoint.h"
#include "src/model/net.h"
#include "src/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const MODEL = "[net]\ninput = 1,4,4\n[dense]\nunits = 3\nactivation = relu\n"
                                 "[dense]\nunits = 2\nactivation = linear\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static net_desc net;
    static int have_net = -1;
    if (have_net < 0) have_net = net_desc_parse_string(&net, MODEL, "fuzz-model") == 0;
    fuzz_file f;
    if (fuzz_file_open(&f, data, size)) return 0;
    st_file st;
    if (st_read(&st, f.path) == 0) {
        /* every tensor's data must be readable to its last element */
        float sum = 0;
        for (int t = 0; t < st.count; t++) {
            long n = 1;
            for (int d = 0; d < st.tensors[t].ndim; d++) n *= st.tensors[t].shape[d];
            for (long i = 0; i < n; i++) sum += st.tensors[t].data[i];
            if (st_find(&st, st.tensors[t].name) != &st.tensors[t]) abort();
        }
        __asm__ volatile("" : : "r"(sum)); /* keep the reads */
        st_free(&st);
    }
    if (have_net) {
        float params[64];
        if (net.param_count <= 64) (void)checkpoint_load_layers(f.path, &net, 0, net.n_layers, params);
    }
    fuzz_file_close(&f);
    return 0;
}
