/* SPDX-License-Identifier: MIT */
/* x86/vec_avx512.h - the V_* vector layer of src/simd_tmpl.h for AVX-512 F/VL (16 x fp32).
 *
 * Included only by translation units built with the AVX-512 flags. Tails use
 * the opmask registers (masked loads never touch the disabled lanes' memory);
 * the skip-zero FMA is a masked FMA. The transpose block reuses the AVX2 8x8
 * ymm transpose. Everything here is static inline. */
#ifndef SDPA_X86_VEC_AVX512_H
#define SDPA_X86_VEC_AVX512_H

#define SDPA_VEC_ISA avx512
#include "x86/vec_avx2.h" /* ymm helpers only: SDPA_VEC_ISA is taken */

#include <immintrin.h>
#include <sleef.h>

/* 6 x 4 zmm = 24 accumulators + 4 B vectors + 1 broadcast of the 32 registers. */
#define V_LANES 16
#define V_GEMM_MR 6
#define V_GEMM_NV 4
#define V_TRANSPOSE_BLOCK 8
/* gemm_nt with query rows in registers: 16 zmm = 2 rows of head_dim <= 128 or
 * 1 row of head_dim <= 256. */
#define V_NT_QREGS 16
/* gemm_stream: one output row of up to 24 zmm in registers (head_dim 384). */
#define V_STREAM_HREGS 24
/* The few-column (decode) path: keys per step (the table's nt_step; gemm_nt's
 * key block) and query rows attend_rows takes. The band column cut (col_align)
 * is 16 floats on every ISA, scalar included, so that the driver cuts a given
 * shape the same way whatever the ISA. */
#define V_NT_STEP 16
#define V_ATTEND_MAX_ROWS 16
/* attend_rows over a 16-bit cache takes query rows four at a time (simd/attend.h) */
#define V_ATTEND_QUAD 1
#define V_COL_ALIGN 16

typedef __m512 v_f32;
typedef __mmask16 v_mask;
typedef __mmask16 v_tail;

/* Horizontal sums of four zmm at once (transpose-and-add): with q_i the sum of
 * 128-bit lane i, q_i = (a[4i] + a[4i+2]) + (a[4i+1] + a[4i+3]),
 *   out[j] = (q_0 + q_2) + (q_1 + q_3)   of a_j, the same order for every j. */
static inline void avx512_reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float *out)
{
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    /* per 128-bit lane: the four-element sums of a0, a1, a2, a3 */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xEE));
    const __m256 v = _mm256_add_ps(_mm512_castps512_ps256(u),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* 16 x 16 transpose: dst[c][r] = src[r][c] (unpack within 128-bit lanes, then
 * 4 x 4 blocks, then two rounds of 128-bit lane shuffles). */
static inline void avx512_transpose16x16(const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(src + (ptrdiff_t)i * lds);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* r[4j + e], 128-bit lane L: element 4L + e of rows 4j .. 4j + 3 */
    for (int j = 0; j < 4; j++) {
        r[4 * j + 0] = _mm512_shuffle_ps(t[4 * j + 0], t[4 * j + 2], 0x44);
        r[4 * j + 1] = _mm512_shuffle_ps(t[4 * j + 0], t[4 * j + 2], 0xEE);
        r[4 * j + 2] = _mm512_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0x44);
        r[4 * j + 3] = _mm512_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0xEE);
    }
    /* column 4L + e = lane L of r[e], r[4 + e], r[8 + e], r[12 + e] */
    for (int e = 0; e < 4; e++) {
        const __m512 x0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x88);
        const __m512 x1 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xDD);
        const __m512 y0 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x88);
        const __m512 y1 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xDD);
        _mm512_storeu_ps(dst + (ptrdiff_t)(0 + e) * ldd, _mm512_shuffle_f32x4(x0, y0, 0x88));
        _mm512_storeu_ps(dst + (ptrdiff_t)(4 + e) * ldd, _mm512_shuffle_f32x4(x1, y1, 0x88));
        _mm512_storeu_ps(dst + (ptrdiff_t)(8 + e) * ldd, _mm512_shuffle_f32x4(x0, y0, 0xDD));
        _mm512_storeu_ps(dst + (ptrdiff_t)(12 + e) * ldd, _mm512_shuffle_f32x4(x1, y1, 0xDD));
    }
}

#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps((p), (v))
#define V_BCAST(p) _mm512_set1_ps(*(p))
#define V_TAIL_INIT(n) ((__mmask16)((1u << (n)) - 1u))
#define V_LOAD_T(p, t) _mm512_maskz_loadu_ps((t), (p))
#define V_STORE_T(p, v, t) _mm512_mask_storeu_ps((p), (t), (v))
#define V_STREAM(p, v) _mm512_stream_ps((p), (v)) /* non-temporal; p aligned to V_STREAM_ALIGN */
#define V_STREAM_ALIGN 64
#define V_STREAM_FENCE() _mm_sfence()
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
/* x held in a register from here on: a vector loaded once for several FMAs is not
 * folded into each of them as a memory operand (the compiler's choice, one load per FMA;
 * Zen 4 loads one zmm per cycle, as many as it issues FMAs): each V vector of
 * tmpl_stream_reg (simd/stream.h; the few-column P V of gemm_stream and of every
 * attend_rows variant) when it serves two query rows */
#define V_PIN(x) __asm__("" : "+v"(x))
#define V_DIV(a, b) _mm512_div_ps((a), (b))
#define V_ABS(a) _mm512_abs_ps(a) /* clears the sign bit */
/* a > b ? a : b: the result is b when either is NaN (x86 max semantics) */
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_NEZ(a) _mm512_cmp_ps_mask((a), _mm512_setzero_ps(), _CMP_NEQ_UQ) /* NaN: true */
/* the masked-entry sentinel -0.0 (bit pattern 0x80000000), and its negation */
#define V_ISMASKED(a) _mm512_cmpeq_epi32_mask(_mm512_castps_si512(a), _mm512_set1_epi32((int)0x80000000u))
#define V_NOTMASKED(a) _mm512_cmpneq_epi32_mask(_mm512_castps_si512(a), _mm512_set1_epi32((int)0x80000000u))
#define V_EQ(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_EQ_OQ)
#define V_LT(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)
#define V_MAND(m1, m2) ((__mmask16)((m1) & (m2)))
#define V_ALL(m) ((m) == (__mmask16)0xffff)
#define V_SEL(m, a, b) _mm512_mask_blend_ps((m), (b), (a)) /* m ? a : b */
#define V_FMA_M(a, b, c, m) _mm512_mask3_fmadd_ps((a), (b), (c), (m))
#define V_EXP2(x) Sleef_exp2f16_u10avx512f(x)
#define V_TANH(x) Sleef_tanhf16_u35avx512f(x)
#define V_TRANSPOSE(src, lds, dst, ldd) avx2_transpose8x8((src), (lds), (dst), (ldd))
#define V_TRANSPOSE16(src, lds, dst, ldd) avx512_transpose16x16((src), (lds), (dst), (ldd))
#define V_REDUCE4(a0, a1, a2, a3, out) avx512_reduce4((a0), (a1), (a2), (a3), (out))
#define V_HMAX(a) _mm512_reduce_max_ps(a)

/* The 16-bit storage types (simd/convert.h; the bits of src/dtype.h), 16 per
 * ymm of words: bf16 is integer work (widen = each word to its dword's upper half;
 * narrow = sdpa_f32_to_bf16's u + 0x7fff + lsb, upper half, a NaN its upper
 * half with the quiet bit set; not vcvtneps2bf16, which flushes denormals),
 * fp16 is vcvtph2ps / vcvtps2ph with round to nearest even from the immediate
 * (F16C's conversions over zmm: dtype.h's bits for every input). Tails: the
 * words through AVX512BW/VL masked loads and stores (the disabled lanes'
 * memory is never touched). */
static inline __m256i avx512_f32_to_bf16(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)); /* quiet NaN */
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q)); /* every lane 0 .. 0xffff */
}

static inline __m512 avx512_widen_bf16(__m256i h)
{
    /* word i to the upper half of dword i, the lower halves zeroed: one vpermw. The
     * indices select words 0-15 only, so the upper half of the cast (undefined) is never
     * read. Measured on Zen 4 only (docs/perf-notes.md, session 26), where it runs free
     * beside the FMAs; not timed on Intel cores, whose shuffle port it shares. */
    const __m512i idx = _mm512_setr_epi32(0x00000, 0x10001, 0x20002, 0x30003, 0x40004, 0x50005, 0x60006, 0x70007,
                                          0x80008, 0x90009, 0xa000a, 0xb000b, 0xc000c, 0xd000d, 0xe000e, 0xf000f);
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16((__mmask32)0xaaaaaaaau, idx, _mm512_castsi256_si512(h)));
}

#define AVX512_CVTPS_PH(v) _mm512_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_WIDEN_BF16(p) avx512_widen_bf16(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define V_WIDEN_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define V_NARROW_BF16(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), avx512_f32_to_bf16(v))
#define V_NARROW_F16(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), AVX512_CVTPS_PH(v))
/* Two vectors of bf16 in one load (optional, simd/stream.h's tmpl_stream_reg): e the
 * even elements 0, 2, .. 30 widened (each dword shifted left 16), o the odd ones (each
 * dword's upper word, the lower cleared); V_INTERLEAVE(e, o) puts a pair so split back
 * in element order, e the first 16 elements and o the last. */
#define V_WIDEN_BF16_EO(p, e, o)                                                                   \
    do {                                                                                           \
        const __m512i w_ = _mm512_loadu_si512((const void *)(p));                                  \
        (e) = _mm512_castsi512_ps(_mm512_slli_epi32(w_, 16));                                      \
        (o) = _mm512_castsi512_ps(_mm512_and_si512(w_, _mm512_set1_epi32((int)0xffff0000u)));      \
    } while (0)
static inline void avx512_interleave(__m512 *e, __m512 *o)
{
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512 a = _mm512_permutex2var_ps(*e, lo, *o), b = _mm512_permutex2var_ps(*e, hi, *o);
    *e = a;
    *o = b;
}
#define V_INTERLEAVE(e, o) avx512_interleave(&(e), &(o))
#define V_WIDEN_BF16_T(p, t) avx512_widen_bf16(_mm256_maskz_loadu_epi16((t), (p)))
#define V_WIDEN_F16_T(p, t) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((t), (p)))
#define V_NARROW_BF16_T(p, v, t) _mm256_mask_storeu_epi16((p), (t), avx512_f32_to_bf16(v))
#define V_NARROW_F16_T(p, v, t) _mm256_mask_storeu_epi16((p), (t), AVX512_CVTPS_PH(v))

#endif /* SDPA_X86_VEC_AVX512_H */
