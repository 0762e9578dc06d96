/* SPDX-License-Identifier: MIT */
/* x86/vec_avx2.h - the V_* vector layer of src/simd_tmpl.h for AVX2 + FMA (8 x fp32).
 *
 * Included only by translation units built with -mavx2 -mfma -mf16c. Two parts:
 *  1. ymm helpers (tail masks, the 8x8 transpose), also used by the AVX-512
 *     layer, which includes this file with SDPA_VEC_ISA already defined;
 *  2. the V_* macros, defined only when no other layer claimed SDPA_VEC_ISA.
 * Everything here is static inline (no out-of-line copies may leak between
 * differently flagged translation units). */
#ifndef SDPA_X86_VEC_AVX2_H
#define SDPA_X86_VEC_AVX2_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Lane masks for maskload/maskstore: the 8 ints at avx2_tail_tbl + 8 - n have
 * their first n lanes set. */
static const int32_t avx2_tail_tbl[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256i avx2_tail_mask(int n)
{
    return _mm256_loadu_si256((const __m256i *)(const void *)(avx2_tail_tbl + 8 - n));
}

/* dst[c*ldd + r] = src[r*lds + c] for an 8 x 8 block. */
static inline void avx2_transpose8x8(const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    __m256 r0 = _mm256_loadu_ps(src + 0 * lds), r1 = _mm256_loadu_ps(src + 1 * lds);
    __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
    __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
    __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
    /* pairs of rows interleaved: t0 = r0[0] r1[0] r0[1] r1[1] | r0[4] r1[4] r0[5] r1[5] */
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    /* four rows per 128-bit lane: s0 = column 0 of rows 0..3 | column 4 of rows 0..3 */
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    /* join the rows 0..3 and 4..7 halves */
    _mm256_storeu_ps(dst + 0 * ldd, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(dst + 1 * ldd, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* Horizontal sums of four ymm at once (transpose-and-add):
 *   out[j] = ((a_j[0] + a_j[2]) + (a_j[1] + a_j[3])) + ((a_j[4] + a_j[6]) + (a_j[5] + a_j[7])),
 * the same order for every j. */
static inline void avx2_reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float *out)
{
    /* per 128-bit lane: [a0[0]+a0[2], a1[0]+a1[2], a0[1]+a0[3], a1[1]+a1[3]] */
    const __m256 t0 = _mm256_add_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    const __m256 t1 = _mm256_add_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    /* per 128-bit lane: the four-element sums of a0, a1, a2, a3 */
    const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t0, t1, 0x44), _mm256_shuffle_ps(t0, t1, 0xEE));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
}

#endif /* SDPA_X86_VEC_AVX2_H */

#ifndef SDPA_VEC_ISA
#define SDPA_VEC_ISA avx2

#include <sleef.h>

/* Register blocking of the gemm micro-kernel: MR rows x NV vectors of
 * accumulators (6 x 2 ymm = 12 of the 16 registers, BLIS haswell's shape). */
#define V_LANES 8
#define V_GEMM_MR 6
#define V_GEMM_NV 2
#define V_GEMM_MR_SKIP 3 /* 6 x 2 with two predicates and two zeroed operands spills */
#define V_TRANSPOSE_BLOCK 8
/* gemm_nt with query rows in registers: 8 ymm = 1 row of head_dim <= 64 or 2
 * rows of head_dim <= 32; longer rows are read from L1, 4 rows per key. */
#define V_NT_QREGS 8
/* gemm_stream: one output row of up to 12 ymm in registers (head_dim 96); longer
 * rows keep 12 there and the rest in L1. */
#define V_STREAM_HREGS 12
/* gemm_stream, rows longer than V_NT_QREGS / 2 vectors: two rows at a time in
 * column chunks of 6 ymm (12 accumulators, 2 broadcasts and a B vector). */
#define V_STREAM_PAIR_NV 6
/* The few-column (decode) path: keys per step (the table's nt_step; gemm_nt's
 * key block) and query rows attend_rows takes. The band column cut (col_align)
 * is 16 floats on every ISA, scalar included, so that the driver cuts a given
 * shape the same way whatever the ISA. */
#define V_NT_STEP 16
#define V_ATTEND_MAX_ROWS 16
/* attend_rows over a 16-bit cache takes query rows four at a time (simd/attend.h) */
#define V_ATTEND_QUAD 1
#define V_COL_ALIGN 16

typedef __m256 v_f32;
typedef __m256 v_mask; /* all-ones / all-zeros lanes */
typedef __m256i v_tail;

#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
/* The largest lane (lanes are never NaN where it is used). */
static inline float avx2_hmax(__m256 a)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps((p), (v))
#define V_BCAST(p) _mm256_broadcast_ss(p)
#define V_TAIL_INIT(n) avx2_tail_mask(n)
#define V_LOAD_T(p, t) _mm256_maskload_ps((p), (t))
#define V_STORE_T(p, v, t) _mm256_maskstore_ps((p), (t), (v))
#define V_STREAM(p, v) _mm256_stream_ps((p), (v)) /* non-temporal; p aligned to V_STREAM_ALIGN */
#define V_STREAM_ALIGN 32
#define V_STREAM_FENCE() _mm_sfence()
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_SUB(a, b) _mm256_sub_ps((a), (b))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_PIN(x) __asm__("" : "+v"(x)) /* see vec_avx512.h */
#define V_DIV(a, b) _mm256_div_ps((a), (b))
#define V_ABS(a) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), (a)) /* clears the sign bit */
/* a > b ? a : b: the result is b when either is NaN (x86 max semantics) */
#define V_MAX(a, b) _mm256_max_ps((a), (b))
#define V_NEZ(a) _mm256_cmp_ps((a), _mm256_setzero_ps(), _CMP_NEQ_UQ) /* NaN: true */
/* the masked-entry sentinel -0.0 (bit pattern 0x80000000), and its negation */
#define V_ISMASKED(a)                                                                              \
    _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_castps_si256(a), _mm256_set1_epi32((int)0x80000000u)))
#define V_NOTMASKED(a) _mm256_xor_ps(V_ISMASKED(a), _mm256_castsi256_ps(_mm256_set1_epi32(-1)))
#define V_EQ(a, b) _mm256_cmp_ps((a), (b), _CMP_EQ_OQ)
#define V_LT(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)
#define V_MAND(m1, m2) _mm256_and_ps((m1), (m2))
#define V_ALL(m) (_mm256_movemask_ps(m) == 0xff)
#define V_SEL(m, a, b) _mm256_blendv_ps((b), (a), (m)) /* m ? a : b */
#define V_ZERO_UNLESS(v, m) _mm256_and_ps((v), (m)) /* m ? v : +0 */
#define V_EXP2(x) Sleef_exp2f8_u10avx2(x)
#define V_TANH(x) Sleef_tanhf8_u35avx2(x)
#define V_TRANSPOSE(src, lds, dst, ldd) avx2_transpose8x8((src), (lds), (dst), (ldd))
#define V_REDUCE4(a0, a1, a2, a3, out) avx2_reduce4((a0), (a1), (a2), (a3), (out))
#define V_HMAX(a) avx2_hmax(a)

/* The 16-bit storage types (simd/convert.h; the bits of src/dtype.h). bf16 is
 * integer work: widen = each word to its dword's upper half; narrow = the rounding of
 * sdpa_f32_to_bf16 (u + 0x7fff + lsb, upper half; a NaN keeps its upper half
 * with the quiet bit set), not vcvtneps2bf16, which flushes denormals. fp16 is
 * F16C (vcvtph2ps, vcvtps2ph with round to nearest even from the immediate):
 * checked to give dtype.h's bits for all 2^32 fp32 and 2^16 fp16 inputs; the
 * library sets no MXCSR mode. */
static inline __m256i avx2_f32_to_bf16_epi32(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)); /* quiet NaN */
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000)); /* both sides >= 0: signed compare */
    return _mm256_blendv_epi8(r, q, nan);
}

static inline void avx2_store_bf16(uint16_t *p, __m256 v)
{
    const __m256i h = avx2_f32_to_bf16_epi32(v); /* every lane 0 .. 0xffff: packus does not saturate */
    _mm_storeu_si128((__m128i *)(void *)p,
                     _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* widen: the eight words in both 128-bit lanes (one broadcast load), each moved to the
 * upper half of its dword by one vpshufb that zeroes the lower halves */
static inline __m256 avx2_widen_bf16(const void *p)
{
    const __m256i idx = _mm256_setr_epi8(-128, -128, 0, 1, -128, -128, 2, 3, -128, -128, 4, 5, -128, -128, 6, 7,
                                         -128, -128, 8, 9, -128, -128, 10, 11, -128, -128, 12, 13, -128, -128, 14, 15);
    return _mm256_castsi256_ps(
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p)), idx));
}
#define V_WIDEN_BF16(p) avx2_widen_bf16((const void *)(p))
/* Two vectors of bf16 in one load (optional; see vec_avx512.h): e the even elements
 * widened, o the odd ones; V_INTERLEAVE(e, o) back to element order. */
#define V_WIDEN_BF16_EO(p, e, o)                                                                   \
    do {                                                                                           \
        const __m256i w_ = _mm256_loadu_si256((const __m256i *)(const void *)(p));                 \
        (e) = _mm256_castsi256_ps(_mm256_slli_epi32(w_, 16));                                      \
        (o) = _mm256_castsi256_ps(_mm256_and_si256(w_, _mm256_set1_epi32((int)0xffff0000u)));      \
    } while (0)
static inline void avx2_interleave(__m256 *e, __m256 *o)
{
    const __m256 a = _mm256_unpacklo_ps(*e, *o), b = _mm256_unpackhi_ps(*e, *o); /* elements 0-3, 8-11; 4-7, 12-15 */
    *e = _mm256_permute2f128_ps(a, b, 0x20);
    *o = _mm256_permute2f128_ps(a, b, 0x31);
}
#define V_INTERLEAVE(e, o) avx2_interleave(&(e), &(o))
#define V_WIDEN_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define V_NARROW_BF16(p, v) avx2_store_bf16((p), (v))
#define V_NARROW_F16(p, v)                                                                         \
    _mm_storeu_si128((__m128i *)(void *)(p), _mm256_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))

#endif /* SDPA_VEC_ISA */
