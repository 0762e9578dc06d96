/* SPDX-License-Identifier: MIT */
/* bench/peak_scalar.c - the scalar fp32 multiply-add peak: independent a*b+c chains.
 *
 * Built with -fno-tree-vectorize (see bench/meson.build) so that the chains stay
 * scalar, like the scalar kernels (src/kernels_scalar.c), which are built the
 * same way and use plain a*b+c (fmaf would be a libm call on baseline x86-64;
 * C11 mode does not contract a*b+c into an FMA, so this is a multiply and an add). */

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
        acc[0] = acc[0] * mul + add;
        acc[1] = acc[1] * mul + add;
        acc[2] = acc[2] * mul + add;
        acc[3] = acc[3] * mul + add;
        acc[4] = acc[4] * mul + add;
        acc[5] = acc[5] * mul + add;
        acc[6] = acc[6] * mul + add;
        acc[7] = acc[7] * mul + add;
        acc[8] = acc[8] * mul + add;
        acc[9] = acc[9] * mul + add;
        acc[10] = acc[10] * mul + add;
        acc[11] = acc[11] * mul + add;
    }
    float s = 0.0f;
    for (int c = 0; c < CHAINS; c++)
        s += acc[c];
    *sink = s;
    return 2.0 * CHAINS * (double)iters;
}
