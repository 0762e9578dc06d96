/* SPDX-License-Identifier: MIT */
/* bench/peak_avx2.c - the AVX2+FMA fp32 peak: independent 256-bit FMA chains.
 *
 * Built with -mavx2 -mfma into its own static library; call only when
 * sdpa_isa_supported(SDPA_ISA_AVX2). 12 chains of 8 lanes cover FMA latency 4
 * x 2 pipes (Zen 3/4, Skylake and later) with room to spare, and with the two
 * constants fit in the 16 YMM registers. */
#include <immintrin.h>

#include "peak.h"

#define CHAINS 12

double sdpa_bench_peak_avx2(int64_t iters, float seed, float *sink)
{
    const __m256 mul = _mm256_set1_ps(0.999999f), add = _mm256_set1_ps(1e-6f);
    __m256 a0 = _mm256_set1_ps(seed), a1 = _mm256_add_ps(a0, add), a2 = _mm256_add_ps(a1, add),
           a3 = _mm256_add_ps(a2, add), a4 = _mm256_add_ps(a3, add), a5 = _mm256_add_ps(a4, add),
           a6 = _mm256_add_ps(a5, add), a7 = _mm256_add_ps(a6, add), a8 = _mm256_add_ps(a7, add),
           a9 = _mm256_add_ps(a8, add), a10 = _mm256_add_ps(a9, add), a11 = _mm256_add_ps(a10, add);
    for (int64_t it = 0; it < iters; it++) {
        a0 = _mm256_fmadd_ps(a0, mul, add);
        a1 = _mm256_fmadd_ps(a1, mul, add);
        a2 = _mm256_fmadd_ps(a2, mul, add);
        a3 = _mm256_fmadd_ps(a3, mul, add);
        a4 = _mm256_fmadd_ps(a4, mul, add);
        a5 = _mm256_fmadd_ps(a5, mul, add);
        a6 = _mm256_fmadd_ps(a6, mul, add);
        a7 = _mm256_fmadd_ps(a7, mul, add);
        a8 = _mm256_fmadd_ps(a8, mul, add);
        a9 = _mm256_fmadd_ps(a9, mul, add);
        a10 = _mm256_fmadd_ps(a10, mul, add);
        a11 = _mm256_fmadd_ps(a11, mul, add);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    float t = 0.0f;
    for (int i = 0; i < 8; i++)
        t += lanes[i];
    *sink = t;
    return 2.0 * 8 * CHAINS * (double)iters;
}
