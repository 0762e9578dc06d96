/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_npy.c - libFuzzer target for the .npy reader of the sdpa tool (tools/npy.c).
 *
 * Built by meson with -Dfuzzing=enabled (clang; see README "Fuzzing"), seeds in
 * tests/fuzz/corpus_npy/. By hand:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
 *         -Itools tests/fuzz/fuzz_npy.c tools/npy.c -o /tmp/fuzz_npy
 *   /tmp/fuzz_npy -max_total_time=120 -rss_limit_mb=1024 -malloc_limit_mb=512 /tmp/corpus tests/fuzz/corpus_npy
 * Each input is written to a memfd and read back with npy_read(); a successful
 * read touches every byte of the data, a failed one must give a non-empty,
 * one-line reason. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("npy", 0);
        if (fd < 0)
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;
    npy_array a;
    char err[256] = "";
    if (npy_read(path, &a, err, sizeof err) == 0) {
        volatile unsigned char sum = 0;
        for (size_t i = 0; i < a.count * npy_dtype_size(a.dtype); i++)
            sum ^= ((const unsigned char *)a.data)[i];
        char sh[48]; /* small on purpose: the formatter must truncate safely */
        npy_shape_str(a.shape, a.ndim, sh, sizeof sh);
        npy_free(&a);
    } else if (err[0] == '\0' || !memchr(err, '\0', sizeof err) || strchr(err, '\n')) {
        abort(); /* the reason must be one non-empty line */
    }
    return 0;
}
