/* libFuzzer harness: the model-file parser (src/model/net.c), from text as a user would
 * write it. Checks what every accepted model must satisfy, so that a parse that succeeds
 * with inconsistent shapes is found, not only crashes. */
#include <stdlib.h>
#include <string.h>

#include "src/model/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    net_desc net;
    if (net_desc_parse_string(&net, text, "fuzz.cfg") == 0) {
        size_t params = 0;
        if (net.n_layers < 1) abort();
        for (int i = 0; i < net.n_layers; i++) {
            const layer_desc *L = &net.layers[i];
            if (layer_shape_count(L->in) == 0 || layer_shape_count(L->out) == 0) abort();
            if (i > 0 && layer_shape_count(L->in) != layer_shape_count(net.layers[i - 1].out))
                abort();
            params += L->weight_count + L->bias_count;
        }
        /* the stages hold every layer's parameters; a tied head's copy is counted once */
        if (params != net.stored_count) abort();
        size_t copy = net.tied_head >= 0 ? net.layers[net.tied_head].weight_count : 0;
        if (net.param_count != params - copy) abort();
        if (net.tied_head >= 0 && (net.layers[net.tied_head].type != LAYER_LM_HEAD ||
                                   !net.layers[net.tied_head].u.lm_head.tied))
            abort();
        /* a language model's classes are per position: V at each of its T positions */
        const layer_desc *last = &net.layers[net.n_layers - 1];
        size_t positions = net.sequence ? (size_t)last->out.c : 1;
        if ((size_t)net.classes * positions != layer_shape_count(last->out)) abort();
        if (net.sequence && (net.layers[0].type != LAYER_EMBEDDING ||
                             last->type != LAYER_LM_HEAD ||
                             layer_shape_count(net.input) != positions))
            abort();
        FILE *sink = fopen("/dev/null", "w");
        if (sink) {
            net_desc_print_summary(&net, sink);
            fclose(sink);
        }
        net_desc_free(&net);
    }
    free(text);
    return 0;
}
