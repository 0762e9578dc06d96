/* SPDX-License-Identifier: MIT */
/* bench/blas.h - OpenBLAS for the naive-blas rows of `sdpa bench`, loaded at run time.
 *
 * The `sdpa` program never links a BLAS: installing it pulls none, and a process
 * that never asks for the naive rows never loads one. `sdpa bench` opens OpenBLAS
 * with dlopen() when the naive comparison is wanted: first the OpenMP build
 * (SDPA_BENCH_OPENBLAS_OMP, Debian's libopenblas0-openmp; bench/meson.build says
 * why), then whichever libopenblas.so.0 the dynamic loader finds. */
#ifndef SDPA_BENCH_BLAS_H
#define SDPA_BENCH_BLAS_H

#include <stddef.h>

/* The CBLAS constants (the values every CBLAS uses; no cblas.h is needed). */
enum { CblasRowMajor = 101 };
enum { CblasNoTrans = 111, CblasTrans = 112 };

/* The OpenBLAS functions the benchmark calls (LP64: int indices, as Debian's build). */
typedef struct bench_blas {
    void (*sgemm)(int order, int transa, int transb, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc);
    void (*set_num_threads)(int n);
    int (*get_parallel)(void); /* 0 sequential, 1 its own pthreads, 2 OpenMP */
    char *(*get_config)(void);
    char *(*get_corename)(void);
    const char *path;          /* the file that was loaded */
} bench_blas;

/** Loads OpenBLAS once (later calls return the first result). Returns 0 and
 *  fills *blas, or -1 with a one-line reason in why. */
int bench_blas_load(bench_blas *blas, char *why, size_t whylen);

#endif /* SDPA_BENCH_BLAS_H */
