/* SPDX-License-Identifier: MIT */
/* arm/vec_neon.h - the V_* vector layer of src/simd_tmpl.h for AArch64 Advanced SIMD (4 x fp32).
 *
 * NEON has no masked loads: a tail of n < 4 lanes goes through a small
 * zero-padded stack buffer, so memory outside the n elements is never touched.
 * Everything here is static inline. */
#ifndef SDPA_ARM_VEC_NEON_H
#define SDPA_ARM_VEC_NEON_H

#define SDPA_VEC_ISA neon

#include <arm_neon.h>
#include <sleef.h>
#include <stddef.h>

/* 5 x 4 q registers = 20 accumulators + 4 B vectors + 5 A scalars (GCC hoists the
 * broadcasts of a whole k step and uses lane FMAs) of the 32: 6 x 4 spills. */
#define V_LANES 4
#define V_GEMM_MR 5
#define V_GEMM_NV 4
#define V_GEMM_MR_SKIP 3 /* the SKIP_ZERO kernels keep 4 predicates as well */
#define V_TRANSPOSE_BLOCK 4
/* gemm_nt with query rows in registers: 16 q = 1 row of head_dim <= 64 or 2
 * rows of head_dim <= 32. */
#define V_NT_QREGS 16
/* gemm_stream: one output row of up to 24 q in registers (head_dim 96). */
#define V_STREAM_HREGS 24
/* The few-column (decode) path: keys per step (the table's nt_step; gemm_nt's
 * key block) and query rows attend_rows takes. The band column cut (col_align)
 * is 16 floats on every ISA, scalar included, so that the driver cuts a given
 * shape the same way whatever the ISA. */
#define V_NT_STEP 16
#define V_ATTEND_MAX_ROWS 16
#define V_COL_ALIGN 16

typedef float32x4_t v_f32;
typedef uint32x4_t v_mask;
typedef int v_tail; /* number of valid lanes, 1..4 */

static inline float32x4_t neon_load_tail(const float *p, int n)
{
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; i++)
        t[i] = p[i];
    return vld1q_f32(t);
}

static inline void neon_store_tail(float *p, float32x4_t v, int n)
{
    float t[4];
    vst1q_f32(t, v);
    for (int i = 0; i < n; i++)
        p[i] = t[i];
}

/* a > b ? a : b, like x86 max (b when either is NaN) */
static inline float32x4_t neon_max(float32x4_t a, float32x4_t b)
{
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}

/* dst[c*ldd + r] = src[r*lds + c] for a 4 x 4 block. */
static inline void neon_transpose4x4(const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    const float32x4_t r0 = vld1q_f32(src), r1 = vld1q_f32(src + lds);
    const float32x4_t r2 = vld1q_f32(src + 2 * lds), r3 = vld1q_f32(src + 3 * lds);
    const float32x4x2_t t01 = vtrnq_f32(r0, r1); /* r0[0] r1[0] r0[2] r1[2] | r0[1] r1[1] r0[3] r1[3] */
    const float32x4x2_t t23 = vtrnq_f32(r2, r3);
    vst1q_f32(dst, vcombine_f32(vget_low_f32(t01.val[0]), vget_low_f32(t23.val[0])));
    vst1q_f32(dst + ldd, vcombine_f32(vget_low_f32(t01.val[1]), vget_low_f32(t23.val[1])));
    vst1q_f32(dst + 2 * ldd, vcombine_f32(vget_high_f32(t01.val[0]), vget_high_f32(t23.val[0])));
    vst1q_f32(dst + 3 * ldd, vcombine_f32(vget_high_f32(t01.val[1]), vget_high_f32(t23.val[1])));
}

/* Horizontal sums of four q registers at once (pairwise adds):
 *   out[j] = (a_j[0] + a_j[1]) + (a_j[2] + a_j[3]), the same order for every j. */
static inline void neon_reduce4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3, float *out)
{
    vst1q_f32(out, vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3)));
}

#define V_ZERO() vdupq_n_f32(0.0f)
#define V_SET1(x) vdupq_n_f32(x)
#define V_LOAD(p) vld1q_f32(p)
#define V_STORE(p, v) vst1q_f32((p), (v))
#define V_BCAST(p) vld1q_dup_f32(p)
#define V_TAIL_INIT(n) (n)
#define V_LOAD_T(p, t) neon_load_tail((p), (t))
#define V_STORE_T(p, v, t) neon_store_tail((p), (v), (t))
#define V_ADD(a, b) vaddq_f32((a), (b))
#define V_SUB(a, b) vsubq_f32((a), (b))
#define V_MUL(a, b) vmulq_f32((a), (b))
#define V_FMA(a, b, c) vfmaq_f32((c), (a), (b))
#define V_DIV(a, b) vdivq_f32((a), (b))
#define V_ABS(a) vabsq_f32(a) /* clears the sign bit */
#define V_MAX(a, b) neon_max((a), (b))
#define V_NEZ(a) vmvnq_u32(vceqq_f32((a), vdupq_n_f32(0.0f))) /* NaN: true */
/* the masked-entry sentinel -0.0 (bit pattern 0x80000000), and its negation */
#define V_ISMASKED(a) vceqq_u32(vreinterpretq_u32_f32(a), vdupq_n_u32(0x80000000u))
#define V_NOTMASKED(a) vmvnq_u32(V_ISMASKED(a))
#define V_EQ(a, b) vceqq_f32((a), (b))
#define V_LT(a, b) vcltq_f32((a), (b))
#define V_MAND(m1, m2) vandq_u32((m1), (m2))
#define V_ALL(m) (vminvq_u32(m) != 0)
#define V_SEL(m, a, b) vbslq_f32((m), (a), (b)) /* m ? a : b */
#define V_ZERO_UNLESS(v, m) vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), (m))) /* m ? v : +0 */
#define V_EXP2(x) Sleef_exp2f4_u10advsimd(x)
#define V_TANH(x) Sleef_tanhf4_u35advsimd(x)
#define V_TRANSPOSE(src, lds, dst, ldd) neon_transpose4x4((src), (lds), (dst), (ldd))
#define V_REDUCE4(a0, a1, a2, a3, out) neon_reduce4((a0), (a1), (a2), (a3), (out))
#define V_HMAX(a) vmaxvq_f32(a)

/* The 16-bit storage types (simd/convert.h; the bits of src/dtype.h), 4 per d
 * register: bf16 is integer work (widen = shift left 16 while widening;
 * narrow = sdpa_f32_to_bf16's u + 0x7fff + lsb, upper half, a NaN its upper
 * half with the quiet bit set); fp16 is FCVTL / FCVTN, whose NaN handling
 * (FPCR.DN clear: quiet bit set, sign and top payload bits kept), overflow to
 * inf and subnormals under the default FPCR (round to nearest even, no
 * flushing, IEEE half format) are dtype.h's. The library never changes FPCR. */
static inline uint16x4_t neon_f32_to_bf16(float32x4_t v)
{
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint16x4_t r = vshrn_n_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
    const uint16x4_t q = vorr_u16(vshrn_n_u32(u, 16), vdup_n_u16(0x40)); /* quiet NaN */
    const uint16x4_t nan = vmovn_u32(vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000)));
    return vbsl_u16(nan, q, r);
}

#define V_WIDEN_BF16(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))
#define V_WIDEN_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
#define V_NARROW_BF16(p, v) vst1_u16((p), neon_f32_to_bf16(v))
#define V_NARROW_F16(p, v) vst1_u16((p), vreinterpret_u16_f16(vcvt_f16_f32(v)))

#endif /* SDPA_ARM_VEC_NEON_H */
