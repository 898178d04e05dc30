/* classify.c: a C application of an aotconv-compiled network (lenet5).
 *
 *   classify PARAMS.bin [INPUT.bin OUTPUT.bin]
 *
 * Creates the network on the device it was built for, loads its parameters, runs one input
 * (INPUT.bin: AOTCONV_LENET5_INPUT_COUNT float32, or a generated pattern), prints the class of
 * each image and writes the output (OUTPUT.bin). It then runs the same input asynchronously
 * while preparing the next one on the host, and checks both runs agree.
 *
 *   cc classify.c $(PKG_CONFIG_PATH=BUILD pkg-config --cflags --libs lenet5) -Wl,-rpath,BUILD
 * or with CMake: examples/CMakeLists.txt (find_package(lenet5)).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lenet5.h"
#include "classify_io.h"

enum { IN = AOTCONV_LENET5_INPUT_COUNT, OUT = AOTCONV_LENET5_OUTPUT_COUNT };
enum { CLASSES = 10, IMAGES = OUT / CLASSES };

static int fail(const char *what, const aotconv_lenet5 *net, int rc)
{
    fprintf(stderr, "classify: %s failed (%d): %s\n", what, rc, aotconv_lenet5_last_error(net));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 4) {
        fprintf(stderr, "usage: classify PARAMS.bin [INPUT.bin OUTPUT.bin]\n");
        return 2;
    }
    float *in = malloc(IN * sizeof(float)), *next = malloc(IN * sizeof(float));
    float *out = malloc(OUT * sizeof(float)), *out2 = malloc(OUT * sizeof(float));
    if (!in || !next || !out || !out2)
        return 1;
    if (argc == 4) {
        if (read_floats(argv[2], in, IN)) {
            fprintf(stderr, "classify: %s does not hold %d floats\n", argv[2], IN);
            return 1;
        }
    } else {
        for (int i = 0; i < IN; ++i)
            in[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    }

    aotconv_lenet5 *net = NULL;
    int rc = aotconv_lenet5_create(&net, NULL);
    if (rc)
        return fail("create", NULL, rc);   /* last_error(NULL): why create failed */
    const char *how = NULL;
    int from_binary = aotconv_lenet5_program_source(net, &how);
    aotconv_lenet5_memory_info mem;
    aotconv_lenet5_memory(net, &mem);
    fprintf(stderr, "classify: programs %s (%s); device memory %zu bytes\n",
            from_binary == AOTCONV_LENET5_FROM_BINARY ? "from binaries" : "from source", how,
            mem.device_bytes);

    if ((rc = aotconv_lenet5_load_params(net, argv[1])))
        return fail("load_params", net, rc);
    if ((rc = aotconv_lenet5_run(net, in, IN, out, OUT)))
        return fail("run", net, rc);

    /* the device works on `in` while the host prepares the next input; `in` and `out2` stay
     * untouched until wait() returns */
    if ((rc = aotconv_lenet5_run_async(net, in, IN, out2, OUT)))
        return fail("run_async", net, rc);
    for (int i = 0; i < IN; ++i)
        next[i] = 1.0f - in[i];
    if ((rc = aotconv_lenet5_wait(net)))
        return fail("wait", net, rc);
    if (memcmp(out, out2, OUT * sizeof(float)) != 0) {
        fprintf(stderr, "classify: run and run_async disagree\n");
        return 3;
    }

    print_classes(out, IMAGES < 8 ? IMAGES : 8, CLASSES);
    if (argc == 4 && write_floats(argv[3], out, OUT)) {
        fprintf(stderr, "classify: cannot write %s\n", argv[3]);
        return 1;
    }
    aotconv_lenet5_destroy(net);
    free(in);
    free(next);
    free(out);
    free(out2);
    return 0;
}
