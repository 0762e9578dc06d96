/* SPDX-License-Identifier: MIT */
/* arm/kernels_neon_bf16.c - the bf16 pair products on BFMMLA and BFDOT (FEAT_BF16:
 * Neoverse V1/V2/N2, Graviton 3 and 4, Apple M2 and later; HWCAP2_BF16).
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
 * the OS reports BF16 (src/arm/cpu.c).
 *
 * `BFMMLA Vd.4S, Vn.8H, Vm.8H` (the same FEAT_BF16) multiplies a 2 x 4 bf16 block of A
 * (two rows, two pairs each) by a 4 x 2 block of B into a 2 x 2 fp32 block of C: twice
 * BFDOT's multiply-adds per instruction, and the Arm ARM defines it (BFMatMulAdd) as two
 * BFDotAdd steps per element, the pair of lower index first: exactly the steps the BFDOT
 * kernel takes for the same element, so the two kernels give the same bits (checkasm
 * compares them). The table's gemm_bf16_pairs is the BFMMLA one: whole 8 x 8 blocks of C
 * on it (16 accumulators of 2 x 2), an odd last pair by one BFDOT step on the same
 * accumulators, and the rows and columns past the last whole block through the BFDOT
 * kernel. Why BFMMLA first, untimed here (no Arm hardware in this project's machines):
 * oneDNN measured its BFMMLA brgemm at 1.6-2.3x its BFDOT one on Neoverse V1 and V2
 * (uxlfoundation/oneDNN pull request 5592), and IREE found it faster on Cortex-A710 and X2
 * (slower only on the in-order A510); docs/perf-notes.md, "BFMMLA". */
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

/* ------------------------------------------------------------------- BFMMLA */

/* How A's pairs lie: pairs along a row (cs_a == 2: K, V, Q rows, the backward's P^T
 * and dS rows), pairs down a column (rs_a == 2: the packed P^T and dS^T, one word per
 * row), or anything else (element by element). */
enum { A_ALONG_ROWS, A_DOWN_COLS, A_ANY };

static inline uint32_t word_at(const uint16_t *a)
{
    uint32_t x;
    memcpy(&x, a, sizeof x);
    return x;
}

/* Rows (2i, 2i + 1), pairs (p, p + 1) of an 8-row block for BFMMLA's first operand:
 * an[i] = words (2i,p), (2i,p+1), (2i+1,p), (2i+1,p+1). */
static inline __attribute__((always_inline)) void mmla_load_a(const int mode, const uint16_t *A, ptrdiff_t rs_a,
                                                              ptrdiff_t cs_a, int p, bfloat16x8_t an[4])
{
    if (mode == A_ALONG_ROWS) {
        for (int i = 0; i < 4; i++)
            an[i] = vreinterpretq_bf16_u16(vcombine_u16(vld1_u16(A + (ptrdiff_t)(2 * i) * rs_a + 2 * p),
                                                        vld1_u16(A + (ptrdiff_t)(2 * i + 1) * rs_a + 2 * p)));
    } else if (mode == A_DOWN_COLS) {
        const uint16_t *a0 = A + (ptrdiff_t)p * cs_a, *a1 = a0 + cs_a;
        for (int h = 0; h < 2; h++) { /* rows 4h .. 4h + 3 */
            const uint32x4_t w0 = vreinterpretq_u32_u16(vld1q_u16(a0 + 8 * h)),
                             w1 = vreinterpretq_u32_u16(vld1q_u16(a1 + 8 * h));
            an[2 * h] = vreinterpretq_bf16_u32(vzip1q_u32(w0, w1));
            an[2 * h + 1] = vreinterpretq_bf16_u32(vzip2q_u32(w0, w1));
        }
    } else {
        for (int i = 0; i < 4; i++) {
            const uint16_t *r0 = A + (ptrdiff_t)(2 * i) * rs_a + (ptrdiff_t)p * cs_a, *r1 = r0 + rs_a;
            const uint32_t w[4] = {word_at(r0), word_at(r0 + cs_a), word_at(r1), word_at(r1 + cs_a)};
            an[i] = vreinterpretq_bf16_u32(vld1q_u32(w));
        }
    }
}

/* Pair p of rows 4h .. 4h + 3: one word per row. */
static inline uint32x4_t mmla_column_words(const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a, int p, int h)
{
    const uint16_t *a = A + (ptrdiff_t)(4 * h) * rs_a + (ptrdiff_t)p * cs_a;
    const uint32_t w[4] = {word_at(a), word_at(a + rs_a), word_at(a + 2 * rs_a), word_at(a + 3 * rs_a)};
    return vld1q_u32(w);
}

/* One whole 8 x 8 block of C. acc[i][j] holds C's 2 x 2 block (rows 2i, 2i + 1; columns
 * 2j, 2j + 1) as BFMMLA leaves it: (2i,2j), (2i,2j+1), (2i+1,2j), (2i+1,2j+1). */
static inline __attribute__((always_inline)) void mmla_block(const int mode, int P, float alpha, const uint16_t *A,
                                                             ptrdiff_t rs_a, ptrdiff_t cs_a, const uint32_t *B,
                                                             ptrdiff_t ldb, float *C, ptrdiff_t ldc, int flags,
                                                             const float *c_row_scale)
{
    float32x4_t acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            acc[i][j] = vdupq_n_f32(0.0f);
    int p = 0;
    for (; p + 2 <= P; p += 2) {
        bfloat16x8_t an[4], bm[4];
        mmla_load_a(mode, A, rs_a, cs_a, p, an);
        const uint32_t *b0 = B + (ptrdiff_t)p * ldb, *b1 = b0 + ldb;
        for (int h = 0; h < 2; h++) { /* columns 4h .. 4h + 3, pairs p and p + 1 */
            const uint32x4_t x = vld1q_u32(b0 + 4 * h), y = vld1q_u32(b1 + 4 * h);
            bm[2 * h] = vreinterpretq_bf16_u32(vzip1q_u32(x, y));
            bm[2 * h + 1] = vreinterpretq_bf16_u32(vzip2q_u32(x, y));
        }
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                acc[i][j] = vbfmmlaq_f32(acc[i][j], an[i], bm[j]);
    }
    if (p < P) { /* the odd last pair: one BFDOT step per element, lanes laid out as acc's */
        bfloat16x8_t an[4], bm[4];
        for (int h = 0; h < 2; h++) {
            const uint32x4_t w = mode == A_DOWN_COLS
                                     ? vreinterpretq_u32_u16(vld1q_u16(A + (ptrdiff_t)p * cs_a + 8 * h))
                                     : mmla_column_words(A, rs_a, cs_a, p, h);
            an[2 * h] = vreinterpretq_bf16_u32(vzip1q_u32(w, w)); /* (r,p), (r,p), (r+1,p), (r+1,p) */
            an[2 * h + 1] = vreinterpretq_bf16_u32(vzip2q_u32(w, w));
            const uint64x2_t x = vreinterpretq_u64_u32(vld1q_u32(B + (ptrdiff_t)p * ldb + 4 * h));
            bm[2 * h] = vreinterpretq_bf16_u64(vdupq_laneq_u64(x, 0)); /* (p,c), (p,c+1), (p,c), (p,c+1) */
            bm[2 * h + 1] = vreinterpretq_bf16_u64(vdupq_laneq_u64(x, 1));
        }
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                acc[i][j] = vbfdotq_f32(acc[i][j], an[i], bm[j]);
    }
    const float32x4_t va = vdupq_n_f32(alpha);
    for (int i = 0; i < 4; i++)
        for (int half = 0; half < 2; half++) { /* row 2i + half */
            const int r = 2 * i + half;
            float *c = C + (ptrdiff_t)r * ldc;
            for (int h = 0; h < 2; h++) {
                const float64x2_t lo = vreinterpretq_f64_f32(acc[i][2 * h]),
                                  hi = vreinterpretq_f64_f32(acc[i][2 * h + 1]);
                const float32x4_t row = vreinterpretq_f32_f64(half ? vzip2q_f64(lo, hi) : vzip1q_f64(lo, hi));
                float32x4_t out = vmulq_f32(va, row); /* as pairs_block: the same operations per element */
                if (flags & SDPA_GEMM_ACCUMULATE) {
                    const float32x4_t old = vld1q_f32(c + 4 * h);
                    out = c_row_scale ? vfmaq_f32(out, old, vdupq_n_f32(c_row_scale[r])) : vaddq_f32(old, out);
                }
                vst1q_f32(c + 4 * h, out);
            }
        }
}

static void mmla_blocks(const int mode, int M8, int N8, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a,
                        ptrdiff_t cs_a, const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int flags,
                        const float *c_row_scale)
{
    for (int m = 0; m < M8; m += 8)
        for (int n = 0; n < N8; n += 8)
            mmla_block(mode, P, alpha, A + (ptrdiff_t)m * rs_a, rs_a, cs_a, B + n, ldb, C + (ptrdiff_t)m * ldc + n,
                       ldc, flags, c_row_scale ? c_row_scale + m : NULL);
}

void sdpa_neon_gemm_bf16_pairs_mmla(int M, int N, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a,
                                    ptrdiff_t cs_a, const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                                    int flags, const float *c_row_scale)
{
    if (!(flags & SDPA_GEMM_ACCUMULATE))
        c_row_scale = NULL;
    const int M8 = M >= 8 ? M & ~7 : 0, N8 = N >= 8 ? N & ~7 : 0;
    if (M8 > 0 && N8 > 0) {
        if (cs_a == 2)
            mmla_blocks(A_ALONG_ROWS, M8, N8, P, alpha, A, rs_a, cs_a, B, ldb, C, ldc, flags, c_row_scale);
        else if (rs_a == 2)
            mmla_blocks(A_DOWN_COLS, M8, N8, P, alpha, A, rs_a, cs_a, B, ldb, C, ldc, flags, c_row_scale);
        else
            mmla_blocks(A_ANY, M8, N8, P, alpha, A, rs_a, cs_a, B, ldb, C, ldc, flags, c_row_scale);
    }
    if (N8 < N) /* the columns past the whole blocks, every row */
        sdpa_neon_gemm_bf16_pairs(M, N - N8, P, alpha, A, rs_a, cs_a, B + N8, ldb, C + N8, ldc, flags, c_row_scale);
    if (M8 < M && N8 > 0) /* the rows past the whole blocks, their first N8 columns */
        sdpa_neon_gemm_bf16_pairs(M - M8, N8, P, alpha, A + (ptrdiff_t)M8 * rs_a, rs_a, cs_a, B, ldb,
                                  C + (ptrdiff_t)M8 * ldc, ldc, flags, c_row_scale ? c_row_scale + M8 : NULL);
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
