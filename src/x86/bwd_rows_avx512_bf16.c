/* SPDX-License-Identifier: MIT */
/* x86/bwd_rows_avx512_bf16.c - bwd_rows over a bf16 K/V (simd/bwd_rows.h) with its dK and
 * dV narrowed by AVX512-BF16's `vcvtneps2bf16`: one instruction per vector instead of
 * the zmm layer's integer rounding (vec_avx512.h: eleven operations and `vpmovdw`),
 * which took most of the fused decode backward's own samples on Zen 4
 * (docs/perf-notes.md). The instruction rounds to nearest even and quiets a NaN as
 * src/dtype.h does, but flushes a subnormal input to zero; a vector with a subnormal
 * lane (`vfpclassps`, rare: a gradient below 2^-126) takes the layer's integer rounding
 * instead, so the bits are dtype.h's for every input, those of the AVX-512 table's
 * bwd_rows_bf16 (checkasm compares them). The rest of the template is the zmm layer's;
 * only bwd_rows_bf16 is taken from this file. Built with the AVX512-BF16 flags;
 * installed into the AVX-512 table when CPUID reports AVX512_BF16 (dispatch.c). */
#include "x86/vec_avx512.h"

#undef SDPA_VEC_ISA
#define SDPA_VEC_ISA avx512bf16 /* distinct names in profiles */

static inline __m256i avx512bf16_f32_to_bf16(__m512 v)
{
    if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) != 0, 0)) /* 0x20: subnormal */
        return avx512_f32_to_bf16(v);
    return (__m256i)_mm512_cvtneps_pbh(v);
}

#undef V_NARROW_BF16
#undef V_NARROW_BF16_T
#define V_NARROW_BF16(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), avx512bf16_f32_to_bf16(v))
#define V_NARROW_BF16_T(p, v, t) _mm256_mask_storeu_epi16((p), (t), avx512bf16_f32_to_bf16(v))

/* Only bwd_rows_bf16 is used: the template's other kernels are the AVX-512 table's. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-const-variable"
#include "simd_tmpl.h"
#pragma GCC diagnostic pop

sdpa_bwd_rows_fn sdpa_avx512_bf16_bwd_rows(void)
{
    return TMPL_FN(bwd_rows_bf16);
}
