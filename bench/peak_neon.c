/* SPDX-License-Identifier: MIT */
/* bench/peak_neon.c - the AArch64 Advanced SIMD fp32 peak: independent vfmaq_f32 chains.
 *
 * 16 chains of 4 lanes cover FMA latency 4 x up to 4 pipes (Neoverse V1/V2,
 * Apple M cores); AArch64 has 32 vector registers. */
#include <arm_neon.h>

#include "peak.h"

#define CHAINS 16

double sdpa_bench_peak_neon(int64_t iters, float seed, float *sink)
{
    const float32x4_t mul = vdupq_n_f32(0.999999f), add = vdupq_n_f32(1e-6f);
    float32x4_t a0 = vdupq_n_f32(seed), a1 = vaddq_f32(a0, add), a2 = vaddq_f32(a1, add),
                a3 = vaddq_f32(a2, add), a4 = vaddq_f32(a3, add), a5 = vaddq_f32(a4, add),
                a6 = vaddq_f32(a5, add), a7 = vaddq_f32(a6, add), a8 = vaddq_f32(a7, add),
                a9 = vaddq_f32(a8, add), a10 = vaddq_f32(a9, add), a11 = vaddq_f32(a10, add),
                a12 = vaddq_f32(a11, add), a13 = vaddq_f32(a12, add), a14 = vaddq_f32(a13, add),
                a15 = vaddq_f32(a14, add);
    for (int64_t it = 0; it < iters; it++) {
        /* vfmaq_f32(c, a, b) = c + a * b; written out so every chain stays in a register */
        a0 = vfmaq_f32(add, a0, mul);
        a1 = vfmaq_f32(add, a1, mul);
        a2 = vfmaq_f32(add, a2, mul);
        a3 = vfmaq_f32(add, a3, mul);
        a4 = vfmaq_f32(add, a4, mul);
        a5 = vfmaq_f32(add, a5, mul);
        a6 = vfmaq_f32(add, a6, mul);
        a7 = vfmaq_f32(add, a7, mul);
        a8 = vfmaq_f32(add, a8, mul);
        a9 = vfmaq_f32(add, a9, mul);
        a10 = vfmaq_f32(add, a10, mul);
        a11 = vfmaq_f32(add, a11, mul);
        a12 = vfmaq_f32(add, a12, mul);
        a13 = vfmaq_f32(add, a13, mul);
        a14 = vfmaq_f32(add, a14, mul);
        a15 = vfmaq_f32(add, a15, mul);
    }
    float32x4_t s = vaddq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)),
                              vaddq_f32(vaddq_f32(a4, a5), vaddq_f32(a6, a7)));
    s = vaddq_f32(s, vaddq_f32(vaddq_f32(vaddq_f32(a8, a9), vaddq_f32(a10, a11)),
                               vaddq_f32(vaddq_f32(a12, a13), vaddq_f32(a14, a15))));
    *sink = vaddvq_f32(s);
    return 2.0 * 4 * CHAINS * (double)iters;
}
