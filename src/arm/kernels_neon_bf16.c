/* SPDX-License-Identifier: MIT */
/* arm/kernels_neon_bf16.c - the bf16 pair products on BFDOT (FEAT_BF16: Neoverse V1/V2/N2,
 * Graviton 3 and 4, Apple M2 and later; HWCAP2_BF16).
 *
 * `BFDOT Vd.4S, Vn.8H, Vm.8H` adds to each fp32 lane the two products of one pair of bf16
 * from each operand: twice the multiply-adds of an fp32 FMLA per instruction. The pair
 * layout is kernels.h's (the reduction dimension in pairs of adjacent bf16, one pair per
 * 32-bit word), the same as the AVX512-BF16 and AMX kernels': gemm_bf16_pairs broadcasts
 * A's pairs (any strides, any alignment) and loads B's as vectors along N, a register
 * block of 4 rows x 4 q (16 accumulators of the 32 registers).
 *
 * Arithmetic (Arm ARM, BFDotAdd with FEAT_EBF16 absent or FPCR.EBF = 0, which the library
 * never sets): bf16 subnormal inputs count as zero, the two products are added and then
 * added to the accumulator, each step rounded to odd, a subnormal result flushed to zero;
 * FPCR's rounding mode is not consulted. The packs (src/arm/kernels_neon.c) round to
 * nearest even. Built with -march=armv8.2-a+bf16; installed into the NEON table only when
 * the OS reports BF16 (src/arm/cpu.c). */
#include <arm_neon.h>
#include <string.h>

#include "kernels.h"

#define PAIR_MR 4
#define PAIR_NV 4

static inline bfloat16x8_t pair_bcast(const uint16_t *a)
{
    uint32_t x;
    memcpy(&x, a, sizeof x);
    return vreinterpretq_bf16_u32(vdupq_n_u32(x));
}

/* n (1..4) words of B; a short vector through a zero-padded buffer. */
static inline bfloat16x8_t load_b(const uint32_t *b, int n)
{
    if (n == 4)
        return vreinterpretq_bf16_u32(vld1q_u32(b));
    uint32_t t[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; i++)
        t[i] = b[i];
    return vreinterpretq_bf16_u32(vld1q_u32(t));
}

static inline float32x4_t load_c(const float *c, int n)
{
    if (n == 4)
        return vld1q_f32(c);
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; i++)
        t[i] = c[i];
    return vld1q_f32(t);
}

static inline void store_c(float *c, float32x4_t v, int n)
{
    if (n == 4) {
        vst1q_f32(c, v);
        return;
    }
    float t[4];
    vst1q_f32(t, v);
    for (int i = 0; i < n; i++)
        c[i] = t[i];
}

/* One block of mr rows x nv vectors of C (the last vector's first `last` lanes), over P
 * pairs. mr and nv are compile-time constants at every call (always inlined); so is
 * `last` in the full blocks. */
static inline __attribute__((always_inline)) void pairs_block(const int mr, const int nv, const int last, int P,
                                                              float alpha, const uint16_t *A, ptrdiff_t rs_a,
                                                              ptrdiff_t cs_a, const uint32_t *B, ptrdiff_t ldb,
                                                              float *C, ptrdiff_t ldc, int flags,
                                                              const float *c_row_scale)
{
    float32x4_t acc[PAIR_MR][PAIR_NV];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++)
            acc[i][v] = vdupq_n_f32(0.0f);
    for (int p = 0; p < P; p++) {
        const uint32_t *b = B + (ptrdiff_t)p * ldb;
        bfloat16x8_t bv[PAIR_NV];
        for (int v = 0; v < nv; v++)
            bv[v] = load_b(b + 4 * v, v == nv - 1 ? last : 4);
        for (int i = 0; i < mr; i++) {
            const bfloat16x8_t a = pair_bcast(A + (ptrdiff_t)i * rs_a + (ptrdiff_t)p * cs_a);
            for (int v = 0; v < nv; v++)
                acc[i][v] = vbfdotq_f32(acc[i][v], a, bv[v]);
        }
    }
    const float32x4_t va = vdupq_n_f32(alpha);
    for (int i = 0; i < mr; i++) {
        float *c = C + (ptrdiff_t)i * ldc;
        for (int v = 0; v < nv; v++) {
            const int n = v == nv - 1 ? last : 4;
            float32x4_t out = vmulq_f32(va, acc[i][v]);
            if (flags & SDPA_GEMM_ACCUMULATE) {
                const float32x4_t old = load_c(c + 4 * v, n);
                out = c_row_scale ? vfmaq_f32(out, old, vdupq_n_f32(c_row_scale[i])) : vaddq_f32(old, out);
            }
            store_c(c + 4 * v, out, n);
        }
    }
}

/* Rows [m0, m0 + mr) of C, all N columns: 4-vector column blocks, then one block of the
 * 1..4 vectors left (the last one partial). */
static inline __attribute__((always_inline)) void pairs_rows(const int mr, int N, int P, float alpha,
                                                             const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a,
                                                             const uint32_t *B, ptrdiff_t ldb, float *C,
                                                             ptrdiff_t ldc, int flags, const float *rs)
{
    int n = 0;
    for (; n + 4 * PAIR_NV <= N; n += 4 * PAIR_NV)
        pairs_block(mr, PAIR_NV, 4, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs);
    if (n == N)
        return;
    const int left = N - n, nv = (left + 3) / 4, last = left % 4 ? left % 4 : 4;
    switch (nv) {
    case 1: pairs_block(mr, 1, last, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    case 2: pairs_block(mr, 2, last, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    case 3: pairs_block(mr, 3, last, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    default: pairs_block(mr, 4, last, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    }
}

void sdpa_neon_gemm_bf16_pairs(int M, int N, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a,
                               const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int flags,
                               const float *c_row_scale)
{
    if (!(flags & SDPA_GEMM_ACCUMULATE))
        c_row_scale = NULL;
    int m = 0;
    for (; m + PAIR_MR <= M; m += PAIR_MR)
        pairs_rows(PAIR_MR, N, P, alpha, A + (ptrdiff_t)m * rs_a, rs_a, cs_a, B, ldb, C + (ptrdiff_t)m * ldc, ldc,
                   flags, c_row_scale ? c_row_scale + m : NULL);
    for (; m < M; m++)
        pairs_rows(1, N, P, alpha, A + (ptrdiff_t)m * rs_a, rs_a, cs_a, B, ldb, C + (ptrdiff_t)m * ldc, ldc, flags,
                   c_row_scale ? c_row_scale + m : NULL);
}

/* out[n] = sdpa_neon_gemm_bf16_pairs(1, 1, P, 1.0f)'s sum for column n alone: one lane per
 * column, the pairs in increasing p, the same BFDOT per step (kernels.h). */
void sdpa_neon_dot_pairs_cols(int P, int N, const uint32_t *A, ptrdiff_t lda, const uint32_t *B, ptrdiff_t ldb,
                              float *out)
{
    for (int n = 0; n < N; n += 4) {
        const int w = N - n >= 4 ? 4 : N - n;
        float32x4_t acc = vdupq_n_f32(0.0f);
        for (int p = 0; p < P; p++)
            acc = vbfdotq_f32(acc, load_b(A + (ptrdiff_t)p * lda + n, w), load_b(B + (ptrdiff_t)p * ldb + n, w));
        store_c(out + n, vmulq_f32(vdupq_n_f32(1.0f), acc), w);
    }
}
