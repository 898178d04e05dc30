/* classify_n.c: any number of images through an aotconv-compiled lenet5 built for several
 * batch sizes (aotconv build lenet5 --batch 1,8 ...).
 *
 *   classify_n PARAMS.bin INPUT.bin N OUTPUT.bin
 *
 * Prints the batch sizes the library was built for, runs the N images of INPUT.bin
 * (N * AOTCONV_LENET5_INPUT_SAMPLE_COUNT float32) with run_n, which picks the smallest size
 * that holds them, prints the class of each and writes their outputs to OUTPUT.bin. A library
 * of one size works too: N then goes up to that size.
 *
 *   cc classify_n.c $(PKG_CONFIG_PATH=BUILD pkg-config --cflags --libs lenet5) -Wl,-rpath,BUILD
 */
#include <stdio.h>
#include <stdlib.h>

#include "lenet5.h"
#include "classify_io.h"

enum { IN = AOTCONV_LENET5_INPUT_SAMPLE_COUNT, OUT = AOTCONV_LENET5_OUTPUT_SAMPLE_COUNT };

static int fail(const char *what, const aotconv_lenet5 *net, int rc)
{
    fprintf(stderr, "classify_n: %s failed (%d): %s\n", what, rc, aotconv_lenet5_last_error(net));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: classify_n PARAMS.bin INPUT.bin N OUTPUT.bin\n");
        return 2;
    }
    const size_t *sizes;
    size_t count = aotconv_lenet5_batch_sizes(&sizes);
    printf("batch sizes:");
    for (size_t i = 0; i < count; ++i)
        printf(" %zu", sizes[i]);
    printf(" (at most %u images a call)\n", AOTCONV_LENET5_BATCH_MAX);

    /* n is checked by run_n itself: 0 or more than BATCH_MAX is ERR_ARGUMENT */
    size_t n = strtoul(argv[3], NULL, 10);
    float *in = malloc((n ? n : 1) * IN * sizeof(float));
    float *out = malloc((n ? n : 1) * OUT * sizeof(float));
    if (!in || !out)
        return 1;
    if (read_floats(argv[2], in, n * IN)) {
        fprintf(stderr, "classify_n: %s does not hold %zu images\n", argv[2], n);
        return 1;
    }

    aotconv_lenet5 *net = NULL;
    int rc = aotconv_lenet5_create(&net, NULL);
    if (rc)
        return fail("create", NULL, rc);
    if ((rc = aotconv_lenet5_load_params(net, argv[1])))
        return fail("load_params", net, rc);
    if ((rc = aotconv_lenet5_run_n(net, n, in, n * IN, out, n * OUT)))
        return fail("run_n", net, rc);

    print_classes(out, n, OUT);
    if (write_floats(argv[4], out, n * OUT)) {
        fprintf(stderr, "classify_n: cannot write %s\n", argv[4]);
        return 1;
    }
    aotconv_lenet5_destroy(net);
    free(in);
    free(out);
    return 0;
}
