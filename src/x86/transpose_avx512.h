/* SPDX-License-Identifier: MIT */
/* x86/transpose_avx512.h - a 16 x 16 transpose of 32-bit words in zmm registers, for
 * the bf16 pair layouts (kernels_avx512_bf16.c, kernels_amx.c): four rounds of
 * unpack / 128-bit lane shuffles. Include only from files built with AVX-512F. */
#ifndef SDPA_X86_TRANSPOSE_AVX512_H
#define SDPA_X86_TRANSPOSE_AVX512_H

#include <immintrin.h>

/* 16 x 16 32-bit words in place: r[j] becomes column j of the rows r[0..15]. */
static inline void sdpa_transpose16x32(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4b + k] now holds, in each 128-bit lane L, column (4L + k') words of rows
     * 4b..4b+3 (k' = 0, 1, 2, 3 for k = 0, 1, 2, 3 in that order) */
    for (int k = 0; k < 4; k++) {
        const __m512i a = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x88), b = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xdd);
        const __m512i c = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x88),
                      d = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xdd);
        t[k] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[8 + k] = _mm512_shuffle_i32x4(a, c, 0xdd);
        t[4 + k] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[12 + k] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

#endif
