/* SPDX-License-Identifier: MIT */
/* bench/peak_scalar.c - the scalar fp32 FMA peak: independent fmaf() chains.
 *
 * Built with -fno-tree-vectorize (see bench/meson.build) so that the chains stay
 * scalar. fmaf() is what the scalar kernels use: on AArch64 it is one fmadd
 * instruction; on baseline x86-64 (no -mfma) it is a libm call, and this loop
 * measures that ceiling. */
#include <math.h>

#include "peak.h"

#define CHAINS 12

double sdpa_bench_peak_scalar(int64_t iters, float seed, float *sink)
{
    const float mul = 0.999999f, add = 1e-6f;
    float acc[CHAINS];
    for (int c = 0; c < CHAINS; c++)
        acc[c] = seed + (float)c * 1e-3f;
    for (int64_t it = 0; it < iters; it++) {
        /* Written out so that every chain is an independent register value. */
        acc[0] = fmaf(acc[0], mul, add);
        acc[1] = fmaf(acc[1], mul, add);
        acc[2] = fmaf(acc[2], mul, add);
        acc[3] = fmaf(acc[3], mul, add);
        acc[4] = fmaf(acc[4], mul, add);
        acc[5] = fmaf(acc[5], mul, add);
        acc[6] = fmaf(acc[6], mul, add);
        acc[7] = fmaf(acc[7], mul, add);
        acc[8] = fmaf(acc[8], mul, add);
        acc[9] = fmaf(acc[9], mul, add);
        acc[10] = fmaf(acc[10], mul, add);
        acc[11] = fmaf(acc[11], mul, add);
    }
    float s = 0.0f;
    for (int c = 0; c < CHAINS; c++)
        s += acc[c];
    *sink = s;
    return 2.0 * CHAINS * (double)iters;
}
