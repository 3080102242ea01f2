/* libFuzzer harness: the IDX reader (src/io/data.c) with gzip through zlib. The input is an
 * image file and a label file: its first two bytes give the image file's length (modulo
 * what is left), the rest is cut there. */
#include "fuzz/fuzz_input.h"
#include "src/io/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t rest = size - 2, cut = ((size_t)data[0] << 8 | data[1]) % (rest + 1);
    fuzz_file images, labels;
    if (fuzz_file_open(&images, data + 2, cut)) return 0;
    if (fuzz_file_open(&labels, data + 2 + cut, rest - cut)) {
        fuzz_file_close(&images);
        return 0;
    }
    dataset d;
    if (data_load_idx(&d, images.path, labels.path, NULL, 10, -1) == 0) {
        /* what a loaded set promises: every label in range, every pixel readable */
        unsigned sum = 0;
        for (int i = 0; i < d.count; i++) {
            if (d.labels[i] < 0 || d.labels[i] >= 10) abort();
            for (size_t p = 0; p < data_image_bytes(&d); p++)
                sum += d.pixels[(size_t)i * data_image_bytes(&d) + p];
        }
        (void)sum;
        data_free(&d);
    }
    fuzz_file_close(&images);
    fuzz_file_close(&labels);
    return 0;
}
