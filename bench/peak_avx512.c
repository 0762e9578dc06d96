/* SPDX-License-Identifier: MIT */
/* bench/peak_avx512.c - the AVX-512 fp32 peak: independent 512-bit FMA chains.
 *
 * Built with the AVX-512 flags into its own static library; call only when
 * sdpa_isa_supported(SDPA_ISA_AVX512). 16 chains of 16 lanes cover FMA latency
 * 4 x 2 pipes (Intel server cores; Zen 4 runs each as two 256-bit halves). */
#include <immintrin.h>

#include "peak.h"

#define CHAINS 16

double sdpa_bench_peak_avx512(int64_t iters, float seed, float *sink)
{
    const __m512 mul = _mm512_set1_ps(0.999999f), add = _mm512_set1_ps(1e-6f);
    __m512 a0 = _mm512_set1_ps(seed), a1 = _mm512_add_ps(a0, add), a2 = _mm512_add_ps(a1, add),
           a3 = _mm512_add_ps(a2, add), a4 = _mm512_add_ps(a3, add), a5 = _mm512_add_ps(a4, add),
           a6 = _mm512_add_ps(a5, add), a7 = _mm512_add_ps(a6, add), a8 = _mm512_add_ps(a7, add),
           a9 = _mm512_add_ps(a8, add), a10 = _mm512_add_ps(a9, add), a11 = _mm512_add_ps(a10, add),
           a12 = _mm512_add_ps(a11, add), a13 = _mm512_add_ps(a12, add), a14 = _mm512_add_ps(a13, add),
           a15 = _mm512_add_ps(a14, add);
    for (int64_t it = 0; it < iters; it++) {
        a0 = _mm512_fmadd_ps(a0, mul, add);
        a1 = _mm512_fmadd_ps(a1, mul, add);
        a2 = _mm512_fmadd_ps(a2, mul, add);
        a3 = _mm512_fmadd_ps(a3, mul, add);
        a4 = _mm512_fmadd_ps(a4, mul, add);
        a5 = _mm512_fmadd_ps(a5, mul, add);
        a6 = _mm512_fmadd_ps(a6, mul, add);
        a7 = _mm512_fmadd_ps(a7, mul, add);
        a8 = _mm512_fmadd_ps(a8, mul, add);
        a9 = _mm512_fmadd_ps(a9, mul, add);
        a10 = _mm512_fmadd_ps(a10, mul, add);
        a11 = _mm512_fmadd_ps(a11, mul, add);
        a12 = _mm512_fmadd_ps(a12, mul, add);
        a13 = _mm512_fmadd_ps(a13, mul, add);
        a14 = _mm512_fmadd_ps(a14, mul, add);
        a15 = _mm512_fmadd_ps(a15, mul, add);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                       _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
    *sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * CHAINS * (double)iters;
}
