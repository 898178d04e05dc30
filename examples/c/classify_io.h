/* classify_io.h: the files and the printout of the C examples (classify.c, classify_n.c),
 * none of it aotconv's API: float32 files read and written whole, and the class of each image.
 * Found next to the example that includes it, by the pkg-config and the CMake build alike. */
#ifndef CLASSIFY_IO_H
#define CLASSIFY_IO_H

#include <stdio.h>

/* `n` float32 of the file `path` into x: 0, or -1 where it cannot be read or holds fewer. */
static inline int read_floats(const char *path, float *x, size_t n)
{
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(x, sizeof(float), n, f) : 0;
    if (f)
        fclose(f);
    return got == n ? 0 : -1;
}

/* x[0 .. n) to the file `path` as float32: 0, or -1 where it cannot be written. */
static inline int write_floats(const char *path, const float *x, size_t n)
{
    FILE *f = fopen(path, "wb");
    size_t put = f ? fwrite(x, sizeof(float), n, f) : 0;
    if (f)
        fclose(f);
    return put == n ? 0 : -1;
}

/* "image i: class c (score)" for each of `images` rows of `classes` scores: c the highest. */
static inline void print_classes(const float *out, size_t images, size_t classes)
{
    for (size_t img = 0; img < images; ++img) {
        const float *row = out + img * classes;
        size_t best = 0;
        for (size_t c = 1; c < classes; ++c)
            if (row[c] > row[best])
                best = c;
        printf("image %zu: class %zu (%.3f)\n", img, best, row[best]);
    }
}

#endif
