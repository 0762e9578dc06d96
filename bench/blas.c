/* SPDX-License-Identifier: MIT */
/* bench/blas.c - dlopen() of OpenBLAS for `sdpa bench` (see blas.h). */
#include "blas.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#ifndef SDPA_BENCH_OPENBLAS_OMP
#define SDPA_BENCH_OPENBLAS_OMP ""
#endif

/* Casts a dlsym() result to a function pointer without the object-to-function
 * pointer conversion that ISO C leaves undefined (POSIX guarantees it works). */
#define LOAD_FN(handle, dst, name)                                                                              \
    do {                                                                                                       \
        void *sym_ = dlsym(handle, name);                                                                      \
        if (!sym_) {                                                                                           \
            snprintf(why, whylen, "%s has no %s", path, name);                                                 \
            return -1;                                                                                         \
        }                                                                                                      \
        memcpy(&(dst), &sym_, sizeof(dst));                                                                    \
    } while (0)

static int resolve(void *h, const char *path, bench_blas *b, char *why, size_t whylen)
{
    LOAD_FN(h, b->sgemm, "cblas_sgemm");
    LOAD_FN(h, b->set_num_threads, "openblas_set_num_threads");
    LOAD_FN(h, b->get_parallel, "openblas_get_parallel");
    LOAD_FN(h, b->get_config, "openblas_get_config");
    LOAD_FN(h, b->get_corename, "openblas_get_corename");
    b->path = path;
    return 0;
}

static int load_once(bench_blas *b, char *why, size_t whylen)
{
    static const char *const cands[] = {SDPA_BENCH_OPENBLAS_OMP, "libopenblas.so.0"};
    char first[256] = "", missing[256] = "";
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!*cands[i])
            continue;
        void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            if (!*first)
                snprintf(first, sizeof first, "%s", dlerror());
            continue;
        }
        if (resolve(h, cands[i], b, missing, sizeof missing) == 0)
            return 0;
        dlclose(h);
    }
    snprintf(why, whylen, "OpenBLAS could not be loaded (%s)", *first ? first : missing);
    return -1;
}

int bench_blas_load(bench_blas *blas, char *why, size_t whylen)
{
    static bench_blas loaded;
    static int state; /* 0 not tried, 1 loaded, -1 failed */
    static char reason[600];
    if (state == 0)
        state = load_once(&loaded, reason, sizeof reason) == 0 ? 1 : -1;
    if (state < 0) {
        snprintf(why, whylen, "%s", reason);
        return -1;
    }
    *blas = loaded;
    return 0;
}
