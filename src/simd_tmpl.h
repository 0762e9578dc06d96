/* SPDX-License-Identifier: MIT */
/* simd_tmpl.h - every kernel of the table (src/kernels.h) written once over a small vector layer.
 *
 * libdeflate / ggml style: an ISA translation unit includes its vector layer
 * (src/x86/vec_avx2.h, src/x86/vec_avx512.h, src/arm/vec_neon.h) and then this
 * file, which turns the layer into static kernels and tmpl_fill_table(). Only
 * static (inline) definitions live here, so nothing compiled with one ISA's
 * flags can leak into another translation unit.
 *
 * What the vector layer provides:
 *   V_LANES             fp32 lanes per vector (VL)
 *   V_GEMM_MR, _NV      gemm register block: MR rows x NV vectors of accumulators
 *   V_GEMM_MR_SKIP      (optional) rows per pass in the SKIP_ZERO kernels, whose
 *                       predicates need registers too (default MR)
 *   V_TRANSPOSE_BLOCK   side of the square block that V_TRANSPOSE transposes
 *   v_f32, v_mask       a vector, a per-lane predicate
 *   v_tail              a partial-vector descriptor for 1..VL leading lanes
 *   V_ZERO() V_SET1(x) V_LOAD(p) V_STORE(p,v) V_BCAST(p: one float to all lanes)
 *   V_TAIL_INIT(n) V_LOAD_T(p,t) V_STORE_T(p,v,t)   touch only the n leading
 *                       elements (the loaded vector's other lanes are 0)
 *   V_ADD V_SUB V_MUL, V_FMA(a,b,c) = a*b + c (fused)
 *   V_MAX(a,b)          a > b ? a : b (so b when either is NaN, as x86 max)
 *   V_NEZ(a)            a != 0, true for NaN;  V_EQ, V_LT (ordered: false for NaN)
 *   V_ISMASKED(a), V_NOTMASKED(a)  a is / is not the masked sentinel -0.0 (bitwise)
 *   V_MAND(m1,m2)       and of predicates;  V_SEL(m,a,b) = m ? a : b
 *   V_ALL(m)            nonzero when the predicate holds in every lane
 *   either V_FMA_M(a,b,c,m) = m ? a*b + c : c (a masked FMA, AVX-512), or
 *   V_ZERO_UNLESS(v,m)  m ? v : +0 (a bitwise and, off the accumulator chain)
 *   V_EXP2(x)           SLEEF's u10 vector exp2f of this ISA
 *   V_TRANSPOSE(src,lds,dst,ldd)   one V_TRANSPOSE_BLOCK square block
 *   V_TRANSPOSE16(src,lds,dst,ldd) (optional) one 16 x 16 block
 *   V_NT_QREGS          vector registers for query rows (gemm_nt) and for two output
 *                       rows (gemm_stream): 8 or 16
 *   V_STREAM_HREGS      vector registers for one output row (gemm_stream): 12 or 24
 *   V_REDUCE4(a0,a1,a2,a3,out)     out[j] = sum of the lanes of a_j (float out[4]), in
 *                       one fixed order that is the same for every j
 *   V_HMAX(a)           the largest lane of a (no lane is NaN where it is used)
 *
 * Numerics: the gemm accumulates each C(m,n) with one fused multiply-add per k
 * in increasing k (the scalar kernel's order; it rounds each product, so the
 * last bits may differ), then C = alpha*acc, or C = fma(alpha, acc, C): the
 * same bits for any caller threading and any position of (m,n) in its block.
 * A skipped term (SKIP_ZERO_A/B) either leaves the accumulator alone
 * (masked FMA) or, without masked FMA, becomes fma(+0 or a, +0 or b, acc) with
 * the NaN/Inf side zeroed: the product is a zero, which leaves every acc
 * unchanged but -0 (an accumulator that starts at +0 is -0 only after an
 * underflow below the smallest denormal; then the zero's sign may differ).
 * gemm_nt keeps vector accumulators per (m,n): where the query rows fit in
 * registers (K <= V_NT_QREGS vectors), two, one for the even and one for the
 * odd vectors of k, added before the reduction; else one. Lane l sums the
 * products of its k (fused, in increasing k; the tail's missing lanes add +0
 * products), then V_REDUCE4 adds the lanes in its fixed tree and C =
 * alpha*sum. Each C(m,n) thus depends only on row m of A, row n of B, K and
 * alpha, not on M, N or where (m,n) falls in a block.
 * Streams (decode): the few-column kernels (gemm_nt, gemm_stream,
 * attend_rows) read each K and V row whole, front to back, and load full
 * vectors with plain loads; the masked forms are for real tails only. On
 * Zen 4 either a row order that reads several rows side by side, or masked
 * loads of full vectors, costs 20-50% of the memory bandwidth a decode pass
 * gets (the hardware prefetchers do not follow them).
 * Softmax sums run in increasing k per column, as in the scalar kernel.
 * exp(x) is SLEEF's u10 2^y of y = x log2(e) rounded to float, as the scalar
 * kernels do it with libm's exp2f (SLEEF's exp2f is 33 instructions per AVX2
 * vector and 24 per AVX-512 one, its expf 40 and 29): besides the ulp or so of
 * u10, the rounding of y costs a relative error of at most |x| (2^-24 + 1.4e-8)
 * (the product, and log2(e) rounded to float), which is below 1e-6 for the
 * probabilities above e^-16 that carry weight (every x here is
 * a score minus its running maximum or LSE, so x <= 0 but for NaN). Results
 * below FLT_MIN (y < -126, where 2^y would be a denormal) are flushed to 0, as
 * XNNPACK does: denormals are slow and carry no weight next to the row max,
 * which always contributes exp(0) = 1. */
#ifndef SDPA_SIMD_TMPL_H
#define SDPA_SIMD_TMPL_H

#ifndef SDPA_VEC_ISA
#error "include a vector layer (x86/vec_avx2.h, x86/vec_avx512.h, arm/vec_neon.h) first"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define TMPL_VL V_LANES
#define TMPL_MR V_GEMM_MR
#define TMPL_NV V_GEMM_NV
#define TMPL_NB (V_GEMM_NV * V_LANES) /* columns per gemm register block */
#ifdef V_GEMM_MR_SKIP
#define TMPL_MR_SKIP V_GEMM_MR_SKIP
#else
#define TMPL_MR_SKIP V_GEMM_MR
#endif

#define TMPL_INLINE static inline __attribute__((always_inline))

#if defined(__clang__)
#define TMPL_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define TMPL_UNROLL _Pragma("GCC unroll 32") /* register blocks go up to 24 vectors */
#else
#define TMPL_UNROLL
#endif

/* Loads/stores of a whole vector, or of a tail when the compile-time `tail` is set. */
#define TMPL_LOAD(tail, p, t) ((tail) ? V_LOAD_T((p), (t)) : V_LOAD(p))
#define TMPL_STORE(tail, p, v, t)                                                                  \
    do {                                                                                           \
        if (tail)                                                                                  \
            V_STORE_T((p), (v), (t));                                                              \
        else                                                                                       \
            V_STORE((p), (v));                                                                     \
    } while (0)

/* ------------------------------------------------------------------- exp */

/* exp(x) = 2^y, y = x log2(e) rounded to float, with the XNNPACK denormal
 * cut-off: y < -126 (x below about ln(FLT_MIN)) gives exactly 0 (so -inf gives
 * 0), NaN stays NaN, and SLEEF never sees an input that would make a denormal.
 * The cut-off maps such y to -inf before the call (SLEEF's 2^-inf is exactly
 * 0), so nothing has to live across the call. */
TMPL_INLINE v_f32 tmpl_exp(v_f32 x)
{
    const v_f32 y = V_MUL(x, V_SET1(0x1.715476p+0f)); /* log2(e) rounded to float */
    return V_EXP2(V_SEL(V_LT(y, V_SET1(-126.0f)), V_SET1(-INFINITY), y)); /* NaN < c is false */
}

/* ------------------------------------------------------------------ gemm */

/* The ukr's `accumulate`: 0 overwrite C, 1 add into C, TMPL_STORE_STREAM
 * overwrite C with non-temporal stores (full vectors; C and ldc aligned to
 * V_STREAM_ALIGN bytes, see tmpl_gemm). */
#define TMPL_STORE_STREAM 2

/* One rb x (nv vectors) block of C:
 *   C[i][n] (+)= alpha * sum_k A(i,k) B(k,n),   i < mr <= rb, n < columns of the block.
 * The accumulators stay in registers for the whole K loop; A is broadcast from
 * memory with its own strides, B is loaded as vectors. Rows i >= mr repeat row
 * mr - 1 (computed, never stored), so no A element outside the M rows is read.
 * `tail`: the last of the nv vectors holds only the lanes of t. rb, nv, tail,
 * skip_a, skip_b are compile-time constants in every instantiation. */
TMPL_INLINE void tmpl_gemm_rows(const int rb, const int nv, const int tail, const int skip_a,
                                const int skip_b, int mr, int K, float alpha, const float *A,
                                ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb,
                                float *C, ptrdiff_t ldc, int accumulate, const float *c_scale, v_tail t)
{
    v_f32 acc[TMPL_MR][TMPL_NV];
    /* A(i,k) = ak[off[i]] with one pointer ak that advances by cs_a per k: one
     * address increment per k, whatever the row count (six row pointers that
     * each advance cost six integer adds per k where A is read across rows) */
    ptrdiff_t off[TMPL_MR];
    TMPL_UNROLL
    for (int i = 0; i < rb; i++) {
        off[i] = (ptrdiff_t)(i < mr ? i : mr - 1) * rs_a;
        TMPL_UNROLL
        for (int j = 0; j < nv; j++)
            acc[i][j] = V_ZERO();
    }

    const float *ak = A;
    for (int k = 0; k < K; k++, ak += cs_a) {
        const float *bk = B + (ptrdiff_t)k * ldb;
        v_f32 b[TMPL_NV];
        v_mask mb[TMPL_NV];
        TMPL_UNROLL
        for (int j = 0; j < nv; j++) {
            b[j] = TMPL_LOAD(tail && j == nv - 1, bk + j * TMPL_VL, t);
            if (skip_b)
                mb[j] = V_NOTMASKED(b[j]);
        }
        TMPL_UNROLL
        for (int i = 0; i < rb; i++) {
            const v_f32 av = V_BCAST(ak + off[i]);
            if (!skip_a && !skip_b) {
                TMPL_UNROLL
                for (int j = 0; j < nv; j++)
                    acc[i][j] = V_FMA(av, b[j], acc[i][j]);
            } else if (skip_a && !skip_b) {
                const v_mask ma = V_NOTMASKED(av);
                TMPL_UNROLL
                for (int j = 0; j < nv; j++)
#ifdef V_FMA_M
                    acc[i][j] = V_FMA_M(av, b[j], acc[i][j], ma);
#else
                    acc[i][j] = V_FMA(av, V_ZERO_UNLESS(b[j], ma), acc[i][j]);
#endif
            } else if (!skip_a) {
                TMPL_UNROLL
                for (int j = 0; j < nv; j++)
#ifdef V_FMA_M
                    acc[i][j] = V_FMA_M(av, b[j], acc[i][j], mb[j]);
#else
                    acc[i][j] = V_FMA(V_ZERO_UNLESS(av, mb[j]), b[j], acc[i][j]);
#endif
            } else {
                const v_mask ma = V_NOTMASKED(av);
                TMPL_UNROLL
                for (int j = 0; j < nv; j++)
#ifdef V_FMA_M
                    acc[i][j] = V_FMA_M(av, b[j], acc[i][j], V_MAND(ma, mb[j]));
#else
                    acc[i][j] = V_FMA(V_ZERO_UNLESS(av, mb[j]), V_ZERO_UNLESS(b[j], ma), acc[i][j]);
#endif
            }
        }
    }

    const v_f32 va = V_SET1(alpha);
    TMPL_UNROLL
    for (int i = 0; i < rb; i++) {
        if (i < mr) {
            float *c = C + (ptrdiff_t)i * ldc;
            TMPL_UNROLL
            for (int j = 0; j < nv; j++) {
                const int last = tail && j == nv - 1;
                v_f32 r;
                if (accumulate == 1 && c_scale) /* C = C * c_scale[i] + alpha * acc, one rounding after the product */
                    r = V_FMA(TMPL_LOAD(last, c + j * TMPL_VL, t), V_SET1(c_scale[i]), V_MUL(va, acc[i][j]));
                else if (accumulate == 1)
                    r = V_FMA(va, acc[i][j], TMPL_LOAD(last, c + j * TMPL_VL, t));
                else
                    r = V_MUL(va, acc[i][j]);
#ifdef V_STREAM
                if (accumulate == TMPL_STORE_STREAM && !last)
                    V_STREAM(c + j * TMPL_VL, r);
                else
#endif
                    TMPL_STORE(last, c + j * TMPL_VL, r, t);
            }
        }
    }
}

/* One rb x (nv vectors) block (rb <= MR): in one pass, or for the SKIP_ZERO
 * kernels in passes of at most TMPL_MR_SKIP rows. */
TMPL_INLINE void tmpl_gemm_ukr(const int rb, const int nv, const int tail, const int skip_a,
                               const int skip_b, int mr, int K, float alpha, const float *A,
                               ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb,
                               float *C, ptrdiff_t ldc, int accumulate, const float *c_scale, v_tail t)
{
    if (!skip_a && !skip_b) {
        tmpl_gemm_rows(rb, nv, tail, 0, 0, mr, K, alpha, A, rs_a, cs_a, B, ldb, C, ldc, accumulate, c_scale, t);
        return;
    }
    const int pass = rb < TMPL_MR_SKIP ? rb : TMPL_MR_SKIP;
    TMPL_UNROLL
    for (int r0 = 0; r0 < rb; r0 += pass) {
        if (r0 < mr)
            tmpl_gemm_rows(pass, nv, tail, skip_a, skip_b, mr - r0, K, alpha,
                           A + (ptrdiff_t)r0 * rs_a, rs_a, cs_a, B, ldb, C + (ptrdiff_t)r0 * ldc,
                           ldc, accumulate, c_scale ? c_scale + r0 : NULL, t);
    }
}

typedef void (*tmpl_ukr_fn)(int mr, int K, float alpha, const float *A, ptrdiff_t rs_a,
                            ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                            int accumulate, const float *c_scale, v_tail t);

#define TMPL_UKR(name, rb, nv, tail, sa, sb)                                                       \
    static void name(int mr, int K, float alpha, const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a,   \
                     const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate,       \
                     const float *c_scale, v_tail t)                                               \
    {                                                                                              \
        tmpl_gemm_ukr(rb, nv, tail, sa, sb, mr, K, alpha, A, rs_a, cs_a, B, ldb, C, ldc,           \
                      accumulate, c_scale, t);                                                     \
    }

/* Row-block heights: the full MR, and smaller ones for the last rows of M
 * (computing a full MR block for 2 or 4 leftover rows wastes FMAs: e.g. the
 * 128-key score tile is 21 blocks of 6 and one of 2, few-column P.V is 4 rows). */
#define TMPL_RB_SMALL 2
#if TMPL_MR > 4
#define TMPL_RB_MID 4
#else
#define TMPL_RB_MID TMPL_MR
#endif

/* Per skip mode (sa, sb) and row height: the full block, and blocks of 1..NV
 * vectors whose last vector is partial. */
#define TMPL_UKR_MODE_RB(sfx, tag, rb, sa, sb)                                                     \
    TMPL_UKR(tmpl_ukr_full_##sfx##_##tag, rb, TMPL_NV, 0, sa, sb)                                  \
    TMPL_UKR(tmpl_ukr_t1_##sfx##_##tag, rb, 1, 1, sa, sb)                                          \
    TMPL_UKR_T2(sfx##_##tag, rb, sa, sb)                                                           \
    TMPL_UKR_T3(sfx##_##tag, rb, sa, sb)                                                           \
    TMPL_UKR_T4(sfx##_##tag, rb, sa, sb)
#define TMPL_UKR_MODE(sfx, sa, sb)                                                                 \
    TMPL_UKR_MODE_RB(sfx, hmr, TMPL_MR, sa, sb)                                                    \
    TMPL_UKR_MODE_RB(sfx, hmid, TMPL_RB_MID, sa, sb)                                               \
    TMPL_UKR_MODE_RB(sfx, hsmall, TMPL_RB_SMALL, sa, sb)

#if TMPL_NV >= 2
#define TMPL_UKR_T2(sfx, rb, sa, sb) TMPL_UKR(tmpl_ukr_t2_##sfx, rb, 2, 1, sa, sb)
#define TMPL_T2(sfx) , tmpl_ukr_t2_##sfx
#else
#define TMPL_UKR_T2(sfx, rb, sa, sb)
#define TMPL_T2(sfx)
#endif
#if TMPL_NV >= 3
#define TMPL_UKR_T3(sfx, rb, sa, sb) TMPL_UKR(tmpl_ukr_t3_##sfx, rb, 3, 1, sa, sb)
#define TMPL_T3(sfx) , tmpl_ukr_t3_##sfx
#else
#define TMPL_UKR_T3(sfx, rb, sa, sb)
#define TMPL_T3(sfx)
#endif
#if TMPL_NV >= 4
#define TMPL_UKR_T4(sfx, rb, sa, sb) TMPL_UKR(tmpl_ukr_t4_##sfx, rb, 4, 1, sa, sb)
#define TMPL_T4(sfx) , tmpl_ukr_t4_##sfx
#else
#define TMPL_UKR_T4(sfx, rb, sa, sb)
#define TMPL_T4(sfx)
#endif
#if TMPL_NV > 4
#error "V_GEMM_NV above 4 needs more tail instantiations"
#endif

TMPL_UKR_MODE(plain, 0, 0)
TMPL_UKR_MODE(za, 1, 0)
TMPL_UKR_MODE(zb, 0, 1)
TMPL_UKR_MODE(zab, 1, 1)

#define TMPL_ROW(sfx) {tmpl_ukr_full_##sfx, tmpl_ukr_t1_##sfx TMPL_T2(sfx) TMPL_T3(sfx) TMPL_T4(sfx)}
#define TMPL_ROWS(sfx) {TMPL_ROW(sfx##_hmr), TMPL_ROW(sfx##_hmid), TMPL_ROW(sfx##_hsmall)}

/* [skip mode: bit 0 = SKIP_ZERO_A, bit 1 = SKIP_ZERO_B][height: MR, mid, small]
 * [0: full block, v: v vectors, last partial] */
static const tmpl_ukr_fn tmpl_ukr_tab[4][3][TMPL_NV + 1] = {
    TMPL_ROWS(plain), TMPL_ROWS(za), TMPL_ROWS(zb), TMPL_ROWS(zab)};

/* C = alpha A B (or C += with ACCUMULATE), see sdpa_gemm_fn. Column blocks of
 * NB = NV*VL outside, MR-row blocks inside: one K x NB panel of B serves every
 * row block. */
static void tmpl_gemm(int M, int N, int K, float alpha, const float *A, ptrdiff_t rs_a,
                      ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                      int flags, const float *c_row_scale)
{
    if (M <= 0 || N <= 0)
        return;
    if (K < 0)
        K = 0;
    const int mode = ((flags & SDPA_GEMM_SKIP_ZERO_A) ? 1 : 0) | ((flags & SDPA_GEMM_SKIP_ZERO_B) ? 2 : 0);
    int accumulate = (flags & SDPA_GEMM_ACCUMULATE) != 0;
#ifdef V_STREAM
    /* C written once and not read soon (dK, dV of a decode backward): non-temporal
     * stores skip the read-for-ownership of every line of C (a third of the
     * memory traffic there) where C's rows are aligned for them */
    const int stream = !accumulate && (flags & SDPA_GEMM_STREAM_C) &&
                       (uintptr_t)(const void *)C % V_STREAM_ALIGN == 0 &&
                       ((size_t)ldc * sizeof(float)) % V_STREAM_ALIGN == 0 && TMPL_NB * sizeof(float) % V_STREAM_ALIGN == 0;
    if (stream)
        accumulate = TMPL_STORE_STREAM;
#endif
    for (int n0 = 0; n0 < N; n0 += TMPL_NB) {
        const int nb = N - n0 < TMPL_NB ? N - n0 : TMPL_NB;
        int nv = 0; /* 0: full block */
        v_tail t = V_TAIL_INIT(TMPL_VL);
        if (nb < TMPL_NB) {
            nv = (nb + TMPL_VL - 1) / TMPL_VL;
            t = V_TAIL_INIT(nb - (nv - 1) * TMPL_VL);
        }
        for (int m0 = 0; m0 < M; m0 += TMPL_MR) {
            const int mr = M - m0 < TMPL_MR ? M - m0 : TMPL_MR;
            const int h = mr <= TMPL_RB_SMALL ? 2 : mr <= TMPL_RB_MID ? 1 : 0;
            tmpl_ukr_tab[mode][h][nv](mr, K, alpha, A + (ptrdiff_t)m0 * rs_a, rs_a, cs_a, B + n0, ldb,
                                      C + (ptrdiff_t)m0 * ldc + n0, ldc, accumulate,
                                      c_row_scale ? c_row_scale + m0 : NULL, t);
        }
    }
#ifdef V_STREAM
    if (stream) /* order the non-temporal stores before whatever the caller does next */
        V_STREAM_FENCE();
#endif
}

/* -------------------------------------------------------- online softmax */

/* One block of VL columns (the first lanes of t when `tail`). */
TMPL_INLINE void tmpl_softmax_block(const int tail, v_tail t, int M, float *S, ptrdiff_t lds,
                                    float *m, float *l, float *alpha)
{
    const v_f32 m_old = TMPL_LOAD(tail, m, t);
    /* column max, two chains; V_MAX(s, mx) keeps mx when s is NaN, like fmaxf */
    v_f32 mx0 = m_old, mx1 = m_old;
    int k = 0;
    for (; k + 1 < M; k += 2) {
        mx0 = V_MAX(TMPL_LOAD(tail, S + (ptrdiff_t)k * lds, t), mx0);
        mx1 = V_MAX(TMPL_LOAD(tail, S + (ptrdiff_t)(k + 1) * lds, t), mx1);
    }
    if (k < M)
        mx0 = V_MAX(TMPL_LOAD(tail, S + (ptrdiff_t)k * lds, t), mx0);
    const v_f32 mx = V_MAX(mx1, mx0);
    /* fully masked so far: subtract 0 instead of -inf (no NaN from -inf - -inf) */
    const v_f32 mu = V_SEL(V_EQ(mx, V_SET1(-INFINITY)), V_ZERO(), mx);
    const v_f32 a = tmpl_exp(V_SUB(m_old, mu)); /* m_old = -inf: exactly 0 */
    v_f32 sum = V_ZERO();
    for (k = 0; k < M; k++) {
        float *s = S + (ptrdiff_t)k * lds;
        const v_f32 sv = TMPL_LOAD(tail, s, t);
        /* masked (-inf): the sentinel -0.0, so that the P.V product can tell it
         * from a probability that underflowed to +0 */
        const v_f32 p = V_SEL(V_EQ(sv, V_SET1(-INFINITY)), V_SET1(-0.0f), tmpl_exp(V_SUB(sv, mu)));
        TMPL_STORE(tail, s, p, t);
        sum = V_ADD(sum, p);
    }
    TMPL_STORE(tail, alpha, a, t);
    TMPL_STORE(tail, l, V_ADD(V_MUL(TMPL_LOAD(tail, l, t), a), sum), t);
    TMPL_STORE(tail, m, mx, t);
}

static void tmpl_online_softmax(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                float *alpha)
{
    int n0 = 0;
    for (; n0 + TMPL_VL <= N; n0 += TMPL_VL)
        tmpl_softmax_block(0, V_TAIL_INIT(TMPL_VL), M, S + n0, lds, m + n0, l + n0, alpha + n0);
    if (n0 < N)
        tmpl_softmax_block(1, V_TAIL_INIT(N - n0), M, S + n0, lds, m + n0, l + n0, alpha + n0);
}

/* Row-wise update for few-column tiles (natural layout, N a multiple of VL):
 * vector max and sum along the keys; the VL lanes are then combined by V_HMAX
 * and V_REDUCE4 (four rows at a time, a fixed order), and the four rows' alpha
 * come from one vector exp. */
static void tmpl_online_softmax_rows(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                     float *alpha)
{
    for (int r0 = 0; r0 < M; r0 += 4) {
        const int rn = M - r0 < 4 ? M - r0 : 4;
        v_f32 sums[4];
        float mxs[4], dm[TMPL_VL > 4 ? TMPL_VL : 4] = {0}, tot[4], al[TMPL_VL > 4 ? TMPL_VL : 4];
        for (int q = 0; q < 4; q++) {
            sums[q] = V_ZERO();
            if (q >= rn)
                continue;
            const int r = r0 + q;
            float *s = S + (ptrdiff_t)r * lds;
            v_f32 mxv = V_SET1(m[r]);
            for (int n = 0; n < N; n += TMPL_VL)
                mxv = V_MAX(V_LOAD(s + n), mxv); /* NaN scores are skipped here, as fmaxf does */
            const float mx = V_HMAX(mxv);        /* m[r] is one of the candidates */
            const float mu = (mx == -INFINITY) ? 0.0f : mx;
            const v_f32 muv = V_SET1(mu);
            v_f32 sum = V_ZERO();
            for (int n = 0; n < N; n += TMPL_VL) {
                const v_f32 sv = V_LOAD(s + n);
                const v_f32 p = V_SEL(V_EQ(sv, V_SET1(-INFINITY)), V_SET1(-0.0f), tmpl_exp(V_SUB(sv, muv)));
                V_STORE(s + n, p);
                sum = V_ADD(sum, p);
            }
            sums[q] = sum;
            mxs[q] = mx;
            dm[q] = m[r] - mu; /* m[r] = -inf: exp gives exactly 0 */
        }
        V_REDUCE4(sums[0], sums[1], sums[2], sums[3], tot);
#if TMPL_VL >= 4
        V_STORE(al, tmpl_exp(V_LOAD(dm)));
#else
#error "the row softmax needs at least 4 lanes"
#endif
        for (int q = 0; q < rn; q++) {
            const int r = r0 + q;
            alpha[r] = al[q];
            l[r] = l[r] * al[q] + tot[q];
            m[r] = mxs[q];
        }
    }
}

/* ------------------------------------------------------------ scale rows */

/* Column blocks outside: a block whose factors are all exactly 1 (the running
 * max of none of its queries moved, the common case after the first tiles) is
 * left alone, which is what multiplying by 1 gives bit for bit. */
static void tmpl_scale_rows(int M, int N, const float *src, ptrdiff_t lds, const float *alpha, float *dst,
                            ptrdiff_t ldd)
{
    const int nf = N / TMPL_VL * TMPL_VL;
    const v_tail t = V_TAIL_INIT(N > nf ? N - nf : TMPL_VL);
    for (int m = 0; m < M; m++) {
        const float *s = src + (ptrdiff_t)m * lds;
        float *d = dst + (ptrdiff_t)m * ldd;
        if (alpha[m] == 1.0f && s == d)
            continue;
        const v_f32 a = V_SET1(alpha[m]);
        int n = 0;
        for (; n + 2 * TMPL_VL <= nf; n += 2 * TMPL_VL) {
            const v_f32 x0 = V_LOAD(s + n), x1 = V_LOAD(s + n + TMPL_VL);
            V_STORE(d + n, V_MUL(x0, a));
            V_STORE(d + n + TMPL_VL, V_MUL(x1, a));
        }
        if (n < nf)
            V_STORE(d + n, V_MUL(V_LOAD(s + n), a));
        if (N > nf)
            V_STORE_T(d + nf, V_MUL(V_LOAD_T(s + nf, t), a), t);
    }
}

/* ---------------------------------------------------- backward: P from S */

TMPL_INLINE void tmpl_probs_block(const int tail, v_tail t, int M, float *S, ptrdiff_t lds,
                                  const float *lse)
{
    /* masked entries (-inf) and rows fully masked (lse = -inf) become the
     * masked sentinel -0.0; everything else exp(s - lse) >= +0 */
    const v_f32 lv = TMPL_LOAD(tail, lse, t);
    const v_mask row_masked = V_EQ(lv, V_SET1(-INFINITY));
    for (int k = 0; k < M; k++) {
        float *s = S + (ptrdiff_t)k * lds;
        const v_f32 sv = TMPL_LOAD(tail, s, t);
        const v_f32 e = tmpl_exp(V_SUB(sv, lv));
        const v_f32 p = V_SEL(V_EQ(sv, V_SET1(-INFINITY)), V_SET1(-0.0f), e);
        TMPL_STORE(tail, s, V_SEL(row_masked, V_SET1(-0.0f), p), t);
    }
}

static void tmpl_bwd_probs(int M, int N, float *S, ptrdiff_t lds, const float *lse)
{
    int n0 = 0;
    for (; n0 + TMPL_VL <= N; n0 += TMPL_VL)
        tmpl_probs_block(0, V_TAIL_INIT(TMPL_VL), M, S + n0, lds, lse + n0);
    if (n0 < N)
        tmpl_probs_block(1, V_TAIL_INIT(N - n0), M, S + n0, lds, lse + n0);
}

/* ------------------------------------------------- backward: dS from dP */

TMPL_INLINE v_f32 tmpl_dscore(v_f32 p, v_f32 dp, v_f32 d)
{
    /* masked (P = -0.0): the sentinel again, whatever dP holds (NaN from a masked
     * V row); otherwise P (dP - D) + 0, which turns an arithmetic -0 into +0 so
     * that -0.0 keeps meaning "masked" for the gemms that skip it */
    return V_SEL(V_ISMASKED(p), V_SET1(-0.0f), V_ADD(V_MUL(p, V_SUB(dp, d)), V_ZERO()));
}

static void tmpl_bwd_dscores(int M, int N, const float *P, ptrdiff_t ldp, float *dP,
                             ptrdiff_t lddp, const float *d)
{
    const int nfull = N - N % TMPL_VL;
    const v_tail t = V_TAIL_INIT(N > nfull ? N - nfull : TMPL_VL);
    for (int k = 0; k < M; k++) {
        const float *p = P + (ptrdiff_t)k * ldp;
        float *dp = dP + (ptrdiff_t)k * lddp;
        int n = 0;
        for (; n < nfull; n += TMPL_VL)
            V_STORE(dp + n, tmpl_dscore(V_LOAD(p + n), V_LOAD(dp + n), V_LOAD(d + n)));
        if (n < N)
            V_STORE_T(dp + n, tmpl_dscore(V_LOAD_T(p + n, t), V_LOAD_T(dp + n, t), V_LOAD_T(d + n, t)),
                      t);
    }
}

/* --------------------------------------------------------------- gemm_nt */

/* Row n of B against rows 0..rb-1 of A (rb compile-time, 1..4), for head_dims
 * too long to keep query rows in registers: C(i, n) = alpha * sum_k A[i*lda + k] B[k]
 * for i < rb. The key row is read once, front to back (see tmpl_nt_reg), and
 * each query row's vector comes from L1; one accumulator per row, then
 * V_REDUCE4. */
TMPL_INLINE void tmpl_nt_key(const int rb, int K, float alpha, const float *A, ptrdiff_t lda,
                             const float *b, float *c, ptrdiff_t rs_c)
{
    v_f32 acc[4];
    TMPL_UNROLL
    for (int i = 0; i < 4; i++)
        acc[i] = V_ZERO();
    int k = 0;
    for (; k + TMPL_VL <= K; k += TMPL_VL) {
        const v_f32 bv = V_LOAD(b + k);
        TMPL_UNROLL
        for (int i = 0; i < rb; i++)
            acc[i] = V_FMA(V_LOAD(A + (ptrdiff_t)i * lda + k), bv, acc[i]);
    }
    if (k < K) {
        const v_tail t = V_TAIL_INIT(K - k);
        const v_f32 bv = V_LOAD_T(b + k, t);
        TMPL_UNROLL
        for (int i = 0; i < rb; i++)
            acc[i] = V_FMA(V_LOAD_T(A + (ptrdiff_t)i * lda + k, t), bv, acc[i]);
    }
    float s[4];
    V_REDUCE4(acc[0], acc[1], acc[2], acc[3], s);
    TMPL_UNROLL
    for (int i = 0; i < rb; i++)
        c[(ptrdiff_t)i * rs_c] = alpha * s[i];
}

typedef void (*tmpl_nt_fn)(int N, int K, float alpha, const float *A, ptrdiff_t lda, const float *B,
                           ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c);
#define TMPL_NT_KEYS(rb)                                                                           \
    static void tmpl_nt_keys_##rb(int N, int K, float alpha, const float *A, ptrdiff_t lda,        \
                                  const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c,         \
                                  ptrdiff_t cs_c)                                                  \
    {                                                                                              \
        for (int n = 0; n < N; n++)                                                                \
            tmpl_nt_key(rb, K, alpha, A, lda, B + (ptrdiff_t)n * ldb, C + (ptrdiff_t)n * cs_c, rs_c); \
    }
TMPL_NT_KEYS(1)
TMPL_NT_KEYS(2)
TMPL_NT_KEYS(3)
TMPL_NT_KEYS(4)
static const tmpl_nt_fn tmpl_nt_keys_tab[5] = {NULL, tmpl_nt_keys_1, tmpl_nt_keys_2, tmpl_nt_keys_3,
                                               tmpl_nt_keys_4};

/* Register-resident query rows, for head_dim up to V_NT_QREGS vectors (decode).
 * rb (1 or 2) query rows of nv vectors stay in registers, and keys are taken
 * 4/rb at a time, each key row read whole, front to back, before the next:
 * the hardware prefetchers follow that order (on Zen 4, reading 4 key rows
 * side by side, as a register-blocked dot product would, gets half the memory
 * bandwidth). Each (row, key) sums even and odd vectors in two chains, then
 * V_REDUCE4 of their sum: C(m,n) depends only on row m, row n, K and alpha,
 * the same for rb = 1 and 2. rb, nv compile-time; the last vector is partial
 * when K % VL != 0. */
TMPL_INLINE void tmpl_nt_reg(const int rb, const int nv, int mr, int N, int K, float alpha,
                             const float *A, ptrdiff_t lda, const float *B, ptrdiff_t ldb, float *C,
                             ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    const int kpi = 4 / rb; /* keys per iteration: one V_REDUCE4 */
    const int tailn = K - (nv - 1) * TMPL_VL;
    const v_tail t = V_TAIL_INIT(tailn);
    const int part = tailn < TMPL_VL; /* the last vector is partial: masked loads */
    v_f32 q[2][V_NT_QREGS];
    TMPL_UNROLL
    for (int i = 0; i < rb; i++) {
        const float *a = A + (ptrdiff_t)(i < mr ? i : mr - 1) * lda;
        TMPL_UNROLL
        for (int v = 0; v < nv; v++)
            q[i][v] = (v == nv - 1 && part) ? V_LOAD_T(a + v * TMPL_VL, t) : V_LOAD(a + v * TMPL_VL);
    }
    for (int n0 = 0; n0 < N; n0 += kpi) {
        v_f32 acc[4][2];
        TMPL_UNROLL
        for (int j = 0; j < kpi; j++) {
            const float *b = B + (ptrdiff_t)(n0 + j < N ? n0 + j : N - 1) * ldb;
            TMPL_UNROLL
            for (int i = 0; i < rb; i++)
                acc[j * rb + i][0] = acc[j * rb + i][1] = V_ZERO();
            TMPL_UNROLL
            for (int v = 0; v < nv; v++) {
                const v_f32 bv = (v == nv - 1 && part) ? V_LOAD_T(b + v * TMPL_VL, t) : V_LOAD(b + v * TMPL_VL);
                TMPL_UNROLL
                for (int i = 0; i < rb; i++)
                    acc[j * rb + i][v & 1] = V_FMA(q[i][v], bv, acc[j * rb + i][v & 1]);
            }
        }
        float s[4];
        V_REDUCE4(V_ADD(acc[0][0], acc[0][1]), V_ADD(acc[1][0], acc[1][1]), V_ADD(acc[2][0], acc[2][1]),
                  V_ADD(acc[3][0], acc[3][1]), s);
        TMPL_UNROLL
        for (int j = 0; j < kpi; j++)
            if (n0 + j < N)
                TMPL_UNROLL
                for (int i = 0; i < rb; i++)
                    if (i < mr)
                        C[(ptrdiff_t)i * rs_c + (ptrdiff_t)(n0 + j) * cs_c] = alpha * s[j * rb + i];
    }
}

typedef void (*tmpl_nt_reg_fn)(int mr, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                               const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c);
#define TMPL_NT_REG(rb, nv)                                                                        \
    static void tmpl_nt_reg_##rb##_##nv(int mr, int N, int K, float alpha, const float *A,         \
                                        ptrdiff_t lda, const float *B, ptrdiff_t ldb, float *C,    \
                                        ptrdiff_t rs_c, ptrdiff_t cs_c)                            \
    {                                                                                              \
        tmpl_nt_reg(rb, nv, mr, N, K, alpha, A, lda, B, ldb, C, rs_c, cs_c);                       \
    }
/* rb = 1 up to V_NT_QREGS vectors, rb = 2 up to half of them */
TMPL_NT_REG(1, 1) TMPL_NT_REG(1, 2) TMPL_NT_REG(1, 3) TMPL_NT_REG(1, 4)
TMPL_NT_REG(1, 5) TMPL_NT_REG(1, 6) TMPL_NT_REG(1, 7) TMPL_NT_REG(1, 8)
TMPL_NT_REG(2, 1) TMPL_NT_REG(2, 2) TMPL_NT_REG(2, 3) TMPL_NT_REG(2, 4)
#if V_NT_QREGS >= 16
TMPL_NT_REG(1, 9) TMPL_NT_REG(1, 10) TMPL_NT_REG(1, 11) TMPL_NT_REG(1, 12)
TMPL_NT_REG(1, 13) TMPL_NT_REG(1, 14) TMPL_NT_REG(1, 15) TMPL_NT_REG(1, 16)
TMPL_NT_REG(2, 5) TMPL_NT_REG(2, 6) TMPL_NT_REG(2, 7) TMPL_NT_REG(2, 8)
#endif
#if V_NT_QREGS != 8 && V_NT_QREGS != 16
#error "V_NT_QREGS must be 8 or 16"
#endif
/* [rows - 1][vectors] */
static const tmpl_nt_reg_fn tmpl_nt_reg_tab[2][V_NT_QREGS + 1] = {
    {NULL, tmpl_nt_reg_1_1, tmpl_nt_reg_1_2, tmpl_nt_reg_1_3, tmpl_nt_reg_1_4, tmpl_nt_reg_1_5,
     tmpl_nt_reg_1_6, tmpl_nt_reg_1_7, tmpl_nt_reg_1_8
#if V_NT_QREGS >= 16
     , tmpl_nt_reg_1_9, tmpl_nt_reg_1_10, tmpl_nt_reg_1_11, tmpl_nt_reg_1_12, tmpl_nt_reg_1_13,
     tmpl_nt_reg_1_14, tmpl_nt_reg_1_15, tmpl_nt_reg_1_16
#endif
    },
    {NULL, tmpl_nt_reg_2_1, tmpl_nt_reg_2_2, tmpl_nt_reg_2_3, tmpl_nt_reg_2_4
#if V_NT_QREGS >= 16
     , tmpl_nt_reg_2_5, tmpl_nt_reg_2_6, tmpl_nt_reg_2_7, tmpl_nt_reg_2_8
#endif
    }};

/* C(m,n) = alpha * sum_k A[m*lda + k] B[n*ldb + k], see sdpa_gemm_nt_fn. Blocks
 * of 16 key rows: each row is read from memory once, whole and in order, by the
 * first pass over the block; the other passes (query rows) find it in L1. */
static void tmpl_gemm_nt(int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                         const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* no products: C = alpha * 0, and A, B (maybe NULL) are not touched */
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                C[(ptrdiff_t)m * rs_c + (ptrdiff_t)n * cs_c] = alpha * 0.0f;
        return;
    }
    const int nvk = (K + TMPL_VL - 1) / TMPL_VL;
    if (nvk <= V_NT_QREGS) { /* query rows in registers: key blocks of 16, row pairs inside */
        const int two = 2 * nvk <= V_NT_QREGS;
        for (int n0 = 0; n0 < N; n0 += 16) {
            const int nb = N - n0 < 16 ? N - n0 : 16;
            for (int m0 = 0; m0 < M; m0 += 1 + two) {
                const int mr = M - m0 < 1 + two ? M - m0 : 1 + two;
                tmpl_nt_reg_tab[mr - 1][nvk](mr, nb, K, alpha, A + (ptrdiff_t)m0 * lda, lda,
                                             B + (ptrdiff_t)n0 * ldb, ldb,
                                             C + (ptrdiff_t)m0 * rs_c + (ptrdiff_t)n0 * cs_c, rs_c, cs_c);
            }
        }
        return;
    }
    /* query rows from L1, up to 4 per pass over a block of 16 key rows */
    for (int n0 = 0; n0 < N; n0 += 16) {
        const int nb = N - n0 < 16 ? N - n0 : 16;
        for (int m0 = 0; m0 < M; m0 += 4) {
            const int mr = M - m0 < 4 ? M - m0 : 4;
            tmpl_nt_keys_tab[mr](nb, K, alpha, A + (ptrdiff_t)m0 * lda, lda, B + (ptrdiff_t)n0 * ldb, ldb,
                                 C + (ptrdiff_t)m0 * rs_c + (ptrdiff_t)n0 * cs_c, rs_c, cs_c);
        }
    }
}

/* ----------------------------------------------------------- gemm_stream */

/* rb (1 or 2) rows of accumulators, nv vectors each, in registers for the
 * whole call; per key, the row of B is read whole before the next. A term whose A(i,k)
 * is the sentinel leaves the accumulator alone (skip_masked); a key whose
 * terms are all skipped is not read. The last vector is partial when
 * N % VL != 0. rb, nv compile-time. */
TMPL_INLINE void tmpl_stream_reg(const int rb, const int nv, const int skip_masked, int mr, int N, int K,
                                 const float *A, ptrdiff_t lda, const float *B, ptrdiff_t ldb, float *C,
                                 ptrdiff_t ldc, const float *row_scale)
{
    const v_tail t = V_TAIL_INIT(N - (nv - 1) * TMPL_VL);
    const int part = N - (nv - 1) * TMPL_VL < TMPL_VL; /* the last vector is partial: masked */
    v_f32 acc[2][V_STREAM_HREGS];
    const float *a[2];
    TMPL_UNROLL
    for (int i = 0; i < rb; i++) {
        a[i] = A + (ptrdiff_t)(i < mr ? i : mr - 1) * lda;
        TMPL_UNROLL
        for (int v = 0; v < nv; v++)
            acc[i][v] = V_ZERO();
    }
    const unsigned all = (1u << rb) - 1u;
    for (int k = 0; k < K; k++) {
        const float *b = B + (ptrdiff_t)k * ldb;
        v_f32 p[2];
        unsigned live = all;
        TMPL_UNROLL
        for (int i = 0; i < rb; i++) {
            const float x = a[i][k];
            p[i] = V_SET1(x);
            if (skip_masked) {
                uint32_t u;
                memcpy(&u, &x, sizeof u);
                if (u == 0x80000000u)
                    live &= ~(1u << i);
            }
        }
        if (live == all) {
            TMPL_UNROLL
            for (int v = 0; v < nv; v++) {
                const v_f32 bv = (v == nv - 1 && part) ? V_LOAD_T(b + v * TMPL_VL, t) : V_LOAD(b + v * TMPL_VL);
                TMPL_UNROLL
                for (int i = 0; i < rb; i++)
                    acc[i][v] = V_FMA(p[i], bv, acc[i][v]);
            }
        } else if (live) {
            TMPL_UNROLL
            for (int v = 0; v < nv; v++) {
                const v_f32 bv = (v == nv - 1 && part) ? V_LOAD_T(b + v * TMPL_VL, t) : V_LOAD(b + v * TMPL_VL);
                TMPL_UNROLL
                for (int i = 0; i < rb; i++)
                    if (live >> i & 1u)
                        acc[i][v] = V_FMA(p[i], bv, acc[i][v]);
            }
        }
    }
    /* C = row_scale * C + acc: the step's products are summed on their own
     * first (as the gemm does), then added with one rounding */
    TMPL_UNROLL
    for (int i = 0; i < rb; i++)
        if (i < mr) {
            float *c = C + (ptrdiff_t)i * ldc;
            const v_f32 sc = V_SET1(row_scale ? row_scale[i] : 1.0f);
            TMPL_UNROLL
            for (int v = 0; v < nv; v++) {
                if (v == nv - 1 && part)
                    V_STORE_T(c + v * TMPL_VL, V_FMA(sc, V_LOAD_T(c + v * TMPL_VL, t), acc[i][v]), t);
                else
                    V_STORE(c + v * TMPL_VL, V_FMA(sc, V_LOAD(c + v * TMPL_VL), acc[i][v]));
            }
        }
}

typedef void (*tmpl_stream_fn)(int mr, int N, int K, const float *A, ptrdiff_t lda, const float *B,
                               ptrdiff_t ldb, float *C, ptrdiff_t ldc, const float *row_scale);
#define TMPL_STREAM1(rb, nv, sk)                                                                   \
    static void tmpl_stream_##rb##_##nv##_##sk(int mr, int N, int K, const float *A, ptrdiff_t lda, \
                                               const float *B, ptrdiff_t ldb, float *C,            \
                                               ptrdiff_t ldc, const float *row_scale)              \
    {                                                                                              \
        tmpl_stream_reg(rb, nv, sk, mr, N, K, A, lda, B, ldb, C, ldc, row_scale);                  \
    }
#define TMPL_STREAM(rb, nv) TMPL_STREAM1(rb, nv, 0) TMPL_STREAM1(rb, nv, 1)
/* one row: up to V_STREAM_HREGS vectors; two rows: up to V_NT_QREGS / 2 each */
TMPL_STREAM(1, 1) TMPL_STREAM(1, 2) TMPL_STREAM(1, 3) TMPL_STREAM(1, 4)
TMPL_STREAM(1, 5) TMPL_STREAM(1, 6) TMPL_STREAM(1, 7) TMPL_STREAM(1, 8)
TMPL_STREAM(1, 9) TMPL_STREAM(1, 10) TMPL_STREAM(1, 11) TMPL_STREAM(1, 12)
TMPL_STREAM(2, 1) TMPL_STREAM(2, 2) TMPL_STREAM(2, 3) TMPL_STREAM(2, 4)
#if V_STREAM_HREGS >= 24
TMPL_STREAM(1, 13) TMPL_STREAM(1, 14) TMPL_STREAM(1, 15) TMPL_STREAM(1, 16)
TMPL_STREAM(1, 17) TMPL_STREAM(1, 18) TMPL_STREAM(1, 19) TMPL_STREAM(1, 20)
TMPL_STREAM(1, 21) TMPL_STREAM(1, 22) TMPL_STREAM(1, 23) TMPL_STREAM(1, 24)
#endif
#if V_NT_QREGS >= 16 || (defined(V_STREAM_PAIR_NV) && V_STREAM_PAIR_NV >= 5)
TMPL_STREAM(2, 5) TMPL_STREAM(2, 6) TMPL_STREAM(2, 7) TMPL_STREAM(2, 8)
#endif
#if V_STREAM_HREGS != 12 && V_STREAM_HREGS != 24
#error "V_STREAM_HREGS must be 12 or 24"
#endif
#define TMPL_S1(sk)                                                                                \
    NULL, tmpl_stream_1_1_##sk, tmpl_stream_1_2_##sk, tmpl_stream_1_3_##sk, tmpl_stream_1_4_##sk,  \
        tmpl_stream_1_5_##sk, tmpl_stream_1_6_##sk, tmpl_stream_1_7_##sk, tmpl_stream_1_8_##sk,    \
        tmpl_stream_1_9_##sk, tmpl_stream_1_10_##sk, tmpl_stream_1_11_##sk, tmpl_stream_1_12_##sk
#if V_STREAM_HREGS >= 24
#define TMPL_S1H(sk)                                                                               \
    , tmpl_stream_1_13_##sk, tmpl_stream_1_14_##sk, tmpl_stream_1_15_##sk, tmpl_stream_1_16_##sk,  \
        tmpl_stream_1_17_##sk, tmpl_stream_1_18_##sk, tmpl_stream_1_19_##sk, tmpl_stream_1_20_##sk, \
        tmpl_stream_1_21_##sk, tmpl_stream_1_22_##sk, tmpl_stream_1_23_##sk, tmpl_stream_1_24_##sk
#else
#define TMPL_S1H(sk)
#endif
#define TMPL_S2(sk)                                                                                \
    NULL, tmpl_stream_2_1_##sk, tmpl_stream_2_2_##sk, tmpl_stream_2_3_##sk, tmpl_stream_2_4_##sk
#if V_NT_QREGS >= 16 || (defined(V_STREAM_PAIR_NV) && V_STREAM_PAIR_NV >= 5)
#define TMPL_S2H(sk)                                                                               \
    , tmpl_stream_2_5_##sk, tmpl_stream_2_6_##sk, tmpl_stream_2_7_##sk, tmpl_stream_2_8_##sk
#else
#define TMPL_S2H(sk)
#endif
/* [skip_masked][rows - 1][vectors] (unused entries NULL) */
static const tmpl_stream_fn tmpl_stream_tab[2][2][V_STREAM_HREGS + 1] = {
    {{TMPL_S1(0) TMPL_S1H(0)}, {TMPL_S2(0) TMPL_S2H(0)}},
    {{TMPL_S1(1) TMPL_S1H(1)}, {TMPL_S2(1) TMPL_S2H(1)}}};

/* One row of C longer than V_STREAM_HREGS vectors: the first V_STREAM_HREGS
 * vectors of accumulators in registers, the other columns (at most
 * TMPL_STREAM_NMAX) in an L1 buffer; each row of B still read whole, in order,
 * and the same sums as tmpl_stream_reg. */
#define TMPL_STREAM_NMAX 512
TMPL_INLINE void tmpl_stream_hyb(const int skip_masked, int N, int K, const float *A, const float *B,
                                 ptrdiff_t ldb, float *C, const float *row_scale)
{
    enum { NR = V_STREAM_HREGS };
    float accl[TMPL_STREAM_NMAX] __attribute__((aligned(64)));
    const int n1 = NR * TMPL_VL, nl = N - n1, nlf = nl - nl % TMPL_VL;
    const v_tail t = V_TAIL_INIT(nl > nlf ? nl - nlf : TMPL_VL);
    v_f32 acc[NR];
    TMPL_UNROLL
    for (int v = 0; v < NR; v++)
        acc[v] = V_ZERO();
    for (int n = 0; n < nl; n++)
        accl[n] = 0.0f;
    for (int k = 0; k < K; k++) {
        const float x = A[k];
        if (skip_masked) {
            uint32_t u;
            memcpy(&u, &x, sizeof u);
            if (u == 0x80000000u)
                continue;
        }
        const v_f32 p = V_SET1(x);
        const float *b = B + (ptrdiff_t)k * ldb;
        TMPL_UNROLL
        for (int v = 0; v < NR; v++)
            acc[v] = V_FMA(p, V_LOAD(b + v * TMPL_VL), acc[v]);
        int n = 0;
        for (; n < nlf; n += TMPL_VL)
            V_STORE(accl + n, V_FMA(p, V_LOAD(b + n1 + n), V_LOAD(accl + n)));
        if (n < nl)
            V_STORE_T(accl + n, V_FMA(p, V_LOAD_T(b + n1 + n, t), V_LOAD_T(accl + n, t)), t);
    }
    const v_f32 sc = V_SET1(row_scale ? row_scale[0] : 1.0f);
    TMPL_UNROLL
    for (int v = 0; v < NR; v++)
        V_STORE(C + v * TMPL_VL, V_FMA(sc, V_LOAD(C + v * TMPL_VL), acc[v]));
    int n = 0;
    for (; n < nlf; n += TMPL_VL)
        V_STORE(C + n1 + n, V_FMA(sc, V_LOAD(C + n1 + n), V_LOAD(accl + n)));
    if (n < nl)
        V_STORE_T(C + n1 + n, V_FMA(sc, V_LOAD_T(C + n1 + n, t), V_LOAD_T(accl + n, t)), t);
}

static void tmpl_stream_hyb_0(int N, int K, const float *A, const float *B, ptrdiff_t ldb, float *C,
                              const float *row_scale)
{
    tmpl_stream_hyb(0, N, K, A, B, ldb, C, row_scale);
}

static void tmpl_stream_hyb_1(int N, int K, const float *A, const float *B, ptrdiff_t ldb, float *C,
                              const float *row_scale)
{
    tmpl_stream_hyb(1, N, K, A, B, ldb, C, row_scale);
}

/* See sdpa_gemm_stream_fn: a row of accumulators in registers when N fits
 * V_STREAM_HREGS vectors (two rows per pass when two fit V_NT_QREGS), else
 * V_STREAM_HREGS vectors in registers and the rest in an L1 buffer (column
 * chunks for very long rows). */
static void tmpl_gemm_stream(int M, int N, int K, const float *A, ptrdiff_t lda, const float *B,
                             ptrdiff_t ldb, float *C, ptrdiff_t ldc, int skip_masked,
                             const float *row_scale)
{
    if (M <= 0 || N <= 0)
        return;
    if (K < 0)
        K = 0;
    const int nv = (N + TMPL_VL - 1) / TMPL_VL;
#ifdef V_STREAM_PAIR_NV
    if (M >= 2 && 2 * nv > V_NT_QREGS) {
        /* Rows too long for two in registers (AVX2 at head_dim > 32): the first
         * row alone, reading each row of B whole and in address order (the
         * order the prefetchers follow when B comes from memory: chunked
         * first, AVX2 decode ran at 0.6-0.7x), then the other rows in pairs,
         * columns in chunks of V_STREAM_PAIR_NV vectors from L1, so that each B
         * vector loaded serves two rows and no accumulator goes through L1 (the
         * one-row kernels load each B vector once per row, and past
         * V_STREAM_HREGS vectors add a load and a store of an L1 accumulator).
         * Each (m, n) still sums its terms from zero in increasing k and then
         * adds the scaled C: the same bits as the one-row kernels. AVX2 decode
         * D=128 (four query rows): +16% hot in cache, +7% from memory on one
         * thread. */
        const int cw = V_STREAM_PAIR_NV * TMPL_VL;
        tmpl_gemm_stream(1, N, K, A, lda, B, ldb, C, ldc, skip_masked, row_scale); /* B rows read whole, in order */
        M -= 1, A += lda, C += ldc, row_scale = row_scale ? row_scale + 1 : NULL;
        for (; M >= 2; M -= 2, A += 2 * lda, C += 2 * ldc, row_scale = row_scale ? row_scale + 2 : NULL)
            for (int n0 = 0; n0 < N; n0 += cw) {
                const int nc = N - n0 < cw ? N - n0 : cw;
                tmpl_stream_tab[skip_masked != 0][1][(nc + TMPL_VL - 1) / TMPL_VL](2, nc, K, A, lda, B + n0, ldb,
                                                                                 C + n0, ldc, row_scale);
            }
        if (M == 0)
            return;
    }
#endif
    if (nv <= V_STREAM_HREGS) { /* rows of accumulators in registers, two at a time if they fit */
        const int step = 2 * nv <= V_NT_QREGS ? 2 : 1;
        for (int m0 = 0; m0 < M; m0 += step) {
            const int mr = M - m0 < step ? M - m0 : step;
            tmpl_stream_tab[skip_masked != 0][mr - 1][nv](mr, N, K, A + (ptrdiff_t)m0 * lda, lda, B, ldb,
                                                          C + (ptrdiff_t)m0 * ldc, ldc,
                                                          row_scale ? row_scale + m0 : NULL);
        }
        return;
    }
    /* longer rows: per row, V_STREAM_HREGS vectors in registers and up to
     * TMPL_STREAM_NMAX more columns in L1, in column chunks of that width */
    const int chunk = V_STREAM_HREGS * TMPL_VL + TMPL_STREAM_NMAX;
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int nc = N - n0 < chunk ? N - n0 : chunk;
        for (int m = 0; m < M; m++) {
            const float *am = A + (ptrdiff_t)m * lda;
            float *cm = C + (ptrdiff_t)m * ldc + n0;
            const float *sm = row_scale ? row_scale + m : NULL;
            if (nc > V_STREAM_HREGS * TMPL_VL)
                (skip_masked ? tmpl_stream_hyb_1 : tmpl_stream_hyb_0)(nc, K, am, B + n0, ldb, cm, sm);
            else /* the last chunk is short enough for registers alone */
                tmpl_stream_tab[skip_masked != 0][0][(nc + TMPL_VL - 1) / TMPL_VL](1, nc, K, am, lda, B + n0, ldb,
                                                                                 cm, ldc, sm);
        }
    }
}

/* ------------------------------------------------------------ attend_rows */

/* Keys per step of attend_rows (and of the driver's few-column path). */
#define TMPL_ATTEND_STEP 16
/* Query rows attend_rows takes, and its scratch: S of every row, and alpha. */
#define TMPL_ATTEND_MAX_ROWS 16
#define TMPL_ATTEND_SCRATCH (TMPL_ATTEND_MAX_ROWS * TMPL_ATTEND_STEP + TMPL_ATTEND_MAX_ROWS)

/* One compile-time head_dim size (nv vectors for both Q.K and O): steps of 16
 * keys, each S = scale Q K^T (query rows in registers, two at a time when two
 * fit V_NT_QREGS, else one), the row softmax, O = alpha O + P V (O rows in
 * registers, likewise); the pieces are the kernels above, inlined. */
TMPL_INLINE void tmpl_attend(const int nv, int M, int N, int Dk, int Dv, float scale, const float *Q,
                             ptrdiff_t ldq, const float *K, ptrdiff_t ldk, const float *V, ptrdiff_t ldv,
                             float *m, float *l, float *O, ptrdiff_t ldo, float *S, float *alpha)
{
    const int pairs = 2 * nv <= V_NT_QREGS;
    for (int j = 0; j < N; j += TMPL_ATTEND_STEP) {
        const int n = N - j < TMPL_ATTEND_STEP ? N - j : TMPL_ATTEND_STEP;
        const float *kj = K + (ptrdiff_t)j * ldk, *vj = V + (ptrdiff_t)j * ldv;
        int m0 = 0;
        if (pairs)
            for (; m0 + 2 <= M; m0 += 2)
                tmpl_nt_reg(2, nv, 2, n, Dk, scale, Q + (ptrdiff_t)m0 * ldq, ldq, kj, ldk,
                            S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, 1);
        for (; m0 < M; m0++)
            tmpl_nt_reg(1, nv, 1, n, Dk, scale, Q + (ptrdiff_t)m0 * ldq, ldq, kj, ldk,
                        S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, 1);
        if (n < TMPL_ATTEND_STEP)
            for (int r = 0; r < M; r++)
                for (int jj = n; jj < TMPL_ATTEND_STEP; jj++)
                    S[r * TMPL_ATTEND_STEP + jj] = -INFINITY;
        tmpl_online_softmax_rows(M, TMPL_ATTEND_STEP, S, TMPL_ATTEND_STEP, m, l, alpha);
        m0 = 0;
        if (pairs)
            for (; m0 + 2 <= M; m0 += 2)
                tmpl_stream_reg(2, nv, 0, 2, Dv, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, vj, ldv,
                                O + (ptrdiff_t)m0 * ldo, ldo, alpha + m0);
        for (; m0 < M; m0++)
            tmpl_stream_reg(1, nv, 0, 1, Dv, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, vj, ldv,
                            O + (ptrdiff_t)m0 * ldo, ldo, alpha + m0);
    }
}

typedef void (*tmpl_attend_fn)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                               const float *K, ptrdiff_t ldk, const float *V, ptrdiff_t ldv, float *m,
                               float *l, float *O, ptrdiff_t ldo, float *S, float *alpha);
#define TMPL_ATTEND(nv)                                                                            \
    static void tmpl_attend_##nv(int M, int N, int Dk, int Dv, float scale, const float *Q,         \
                                 ptrdiff_t ldq, const float *K, ptrdiff_t ldk, const float *V,      \
                                 ptrdiff_t ldv, float *m, float *l, float *O, ptrdiff_t ldo,        \
                                 float *S, float *alpha)                                            \
    {                                                                                              \
        tmpl_attend(nv, M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, S, alpha);      \
    }
TMPL_ATTEND(1) TMPL_ATTEND(2) TMPL_ATTEND(3) TMPL_ATTEND(4)
TMPL_ATTEND(5) TMPL_ATTEND(6) TMPL_ATTEND(7) TMPL_ATTEND(8)
#if V_NT_QREGS >= 16
TMPL_ATTEND(9) TMPL_ATTEND(10) TMPL_ATTEND(11) TMPL_ATTEND(12)
TMPL_ATTEND(13) TMPL_ATTEND(14) TMPL_ATTEND(15) TMPL_ATTEND(16)
#endif
static const tmpl_attend_fn tmpl_attend_tab[V_NT_QREGS + 1] = {
    NULL, tmpl_attend_1, tmpl_attend_2, tmpl_attend_3, tmpl_attend_4,
    tmpl_attend_5, tmpl_attend_6, tmpl_attend_7, tmpl_attend_8
#if V_NT_QREGS >= 16
    , tmpl_attend_9, tmpl_attend_10, tmpl_attend_11, tmpl_attend_12,
    tmpl_attend_13, tmpl_attend_14, tmpl_attend_15, tmpl_attend_16
#endif
};

/* See sdpa_attend_rows_fn: the kernels above, inlined, when head_dim_qk and
 * head_dim_v take the same number of vectors and a row fits V_NT_QREGS
 * registers; returns 0 (nothing done) otherwise, and unless
 * 0 < M <= TMPL_ATTEND_MAX_ROWS (the driver then composes the same steps). */
static int tmpl_attend_rows(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                            const float *K, ptrdiff_t ldk, const float *V, ptrdiff_t ldv, float *m,
                            float *l, float *O, ptrdiff_t ldo, float *scratch)
{
    const int nvk = (Dk + TMPL_VL - 1) / TMPL_VL, nvv = (Dv + TMPL_VL - 1) / TMPL_VL;
    if (Dk <= 0 || Dv <= 0 || nvk != nvv || nvk > V_NT_QREGS || M <= 0 || M > TMPL_ATTEND_MAX_ROWS)
        return 0;
    if (N > 0)
        tmpl_attend_tab[nvk](M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch,
                             scratch + TMPL_ATTEND_MAX_ROWS * TMPL_ATTEND_STEP);
    return 1;
}

/* ------------------------------------------------------------- transpose */

static void tmpl_transpose_blocks(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                                  ptrdiff_t ldd)
{
    const int tb = V_TRANSPOSE_BLOCK;
    int r0 = 0;
    for (; r0 + tb <= rows; r0 += tb) {
        int c0 = 0;
        for (; c0 + tb <= cols; c0 += tb)
            V_TRANSPOSE(src + (ptrdiff_t)r0 * lds + c0, lds, dst + (ptrdiff_t)c0 * ldd + r0, ldd);
        for (int c = c0; c < cols; c++)
            for (int r = r0; r < r0 + tb; r++)
                dst[(ptrdiff_t)c * ldd + r] = src[(ptrdiff_t)r * lds + c];
    }
    for (int c = 0; c < cols; c++)
        for (int r = r0; r < rows; r++)
            dst[(ptrdiff_t)c * ldd + r] = src[(ptrdiff_t)r * lds + c];
}

/* dst[c][r] = src[r][c]: V_TRANSPOSE16 blocks where the layer has them, then
 * V_TRANSPOSE_BLOCK blocks, then element by element. */
static void tmpl_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                           ptrdiff_t ldd)
{
#ifdef V_TRANSPOSE16
    const int r16 = rows - rows % 16, c16 = cols - cols % 16;
    for (int r0 = 0; r0 < r16; r0 += 16)
        for (int c0 = 0; c0 < c16; c0 += 16)
            V_TRANSPOSE16(src + (ptrdiff_t)r0 * lds + c0, lds, dst + (ptrdiff_t)c0 * ldd + r0, ldd);
    if (c16 < cols) /* rows [0, r16), columns [c16, cols) */
        tmpl_transpose_blocks(r16, cols - c16, src + c16, lds, dst + (ptrdiff_t)c16 * ldd, ldd);
    if (r16 < rows) /* rows [r16, rows), every column */
        tmpl_transpose_blocks(rows - r16, cols, src + (ptrdiff_t)r16 * lds, lds, dst + r16, ldd);
#else
    tmpl_transpose_blocks(rows, cols, src, lds, dst, ldd);
#endif
}

/* ----------------------------------------------------------------- table */

/* Installs every kernel of this file; the ISA's init sets name and block sizes. */
static inline void tmpl_fill_table(sdpa_kernels *t)
{
    t->vec_floats = V_LANES;
    t->col_align = 16; /* the band column cut: a multiple of every layer's V_LANES */
    t->nt_step = TMPL_ATTEND_STEP;
    t->attend_max_rows = TMPL_ATTEND_MAX_ROWS;
    t->attend_max_vecs = V_NT_QREGS;
    t->attend_scratch = TMPL_ATTEND_SCRATCH;
    t->gemm = tmpl_gemm;
    t->online_softmax = tmpl_online_softmax;
    t->scale_rows = tmpl_scale_rows;
    t->bwd_probs = tmpl_bwd_probs;
    t->bwd_dscores = tmpl_bwd_dscores;
    t->transpose = tmpl_transpose;
    t->gemm_nt = tmpl_gemm_nt;
    t->online_softmax_rows = tmpl_online_softmax_rows;
    t->gemm_stream = tmpl_gemm_stream;
    t->attend_rows = tmpl_attend_rows;
}

#endif /* SDPA_SIMD_TMPL_H */
