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
 *   V_EXP(x)            SLEEF's u10 vector expf of this ISA
 *   V_TRANSPOSE(src,lds,dst,ldd)   one V_TRANSPOSE_BLOCK square block
 *   V_NT_MR             gemm_nt register block: V_NT_MR rows x 4 keys of accumulators
 *   V_REDUCE4(a0,a1,a2,a3,out)     out[j] = sum of the lanes of a_j (float out[4]), in
 *                       one fixed order that is the same for every j
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
 * gemm_nt keeps one vector accumulator per (m,n): lane l sums the products of
 * k = l, l + VL, l + 2VL, ... (fused, in increasing k; the tail's missing
 * lanes add +0 products), then V_REDUCE4 adds the lanes in its fixed tree
 * and C = alpha*sum. Each C(m,n) thus depends only on row m of A, row n of B,
 * K and alpha, not on M, N or where (m,n) falls in a block.
 * Softmax sums run in increasing k per column, as in the scalar kernel.
 * exp differs from libm by the ulp or so of SLEEF u10, and results below
 * FLT_MIN (x < -87.34, where expf would return a denormal) are flushed to 0,
 * as XNNPACK does: denormals are slow and carry no weight next to the row max,
 * which always contributes exp(0) = 1. */
#ifndef SDPA_SIMD_TMPL_H
#define SDPA_SIMD_TMPL_H

#ifndef SDPA_VEC_ISA
#error "include a vector layer (x86/vec_avx2.h, x86/vec_avx512.h, arm/vec_neon.h) first"
#endif

#include <math.h>
#include <stddef.h>

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
#define TMPL_UNROLL _Pragma("GCC unroll 16")
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

/* exp with the XNNPACK denormal cut-off: x < ln(FLT_MIN) gives exactly 0 (so
 * -inf gives 0), NaN stays NaN, and SLEEF never sees an input that would make
 * a denormal. The cut-off maps such x to -inf before the call (SLEEF's exp of
 * -inf is exactly 0), so nothing has to live across the call. */
TMPL_INLINE v_f32 tmpl_exp(v_f32 x)
{
    const v_f32 cutoff = V_SET1(-0x1.5D589Ep6f); /* -87.33654: expf(cutoff) = FLT_MIN */
    return V_EXP(V_SEL(V_LT(x, cutoff), V_SET1(-INFINITY), x)); /* NaN < c is false */
}

/* ------------------------------------------------------------------ gemm */

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
                                float *C, ptrdiff_t ldc, int accumulate, v_tail t)
{
    v_f32 acc[TMPL_MR][TMPL_NV];
    const float *a[TMPL_MR];
    TMPL_UNROLL
    for (int i = 0; i < rb; i++) {
        a[i] = A + (ptrdiff_t)(i < mr ? i : mr - 1) * rs_a;
        TMPL_UNROLL
        for (int j = 0; j < nv; j++)
            acc[i][j] = V_ZERO();
    }

    ptrdiff_t ka = 0; /* k * cs_a */
    for (int k = 0; k < K; k++, ka += cs_a) {
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
            const v_f32 av = V_BCAST(a[i] + ka);
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
                if (accumulate)
                    r = V_FMA(va, acc[i][j], TMPL_LOAD(last, c + j * TMPL_VL, t));
                else
                    r = V_MUL(va, acc[i][j]);
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
                               float *C, ptrdiff_t ldc, int accumulate, v_tail t)
{
    if (!skip_a && !skip_b) {
        tmpl_gemm_rows(rb, nv, tail, 0, 0, mr, K, alpha, A, rs_a, cs_a, B, ldb, C, ldc, accumulate, t);
        return;
    }
    const int pass = rb < TMPL_MR_SKIP ? rb : TMPL_MR_SKIP;
    TMPL_UNROLL
    for (int r0 = 0; r0 < rb; r0 += pass) {
        if (r0 < mr)
            tmpl_gemm_rows(pass, nv, tail, skip_a, skip_b, mr - r0, K, alpha,
                           A + (ptrdiff_t)r0 * rs_a, rs_a, cs_a, B, ldb, C + (ptrdiff_t)r0 * ldc,
                           ldc, accumulate, t);
    }
}

typedef void (*tmpl_ukr_fn)(int mr, int K, float alpha, const float *A, ptrdiff_t rs_a,
                            ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                            int accumulate, v_tail t);

#define TMPL_UKR(name, rb, nv, tail, sa, sb)                                                       \
    static void name(int mr, int K, float alpha, const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a,   \
                     const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate,       \
                     v_tail t)                                                                     \
    {                                                                                              \
        tmpl_gemm_ukr(rb, nv, tail, sa, sb, mr, K, alpha, A, rs_a, cs_a, B, ldb, C, ldc,           \
                      accumulate, t);                                                              \
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
                      int flags)
{
    if (M <= 0 || N <= 0)
        return;
    if (K < 0)
        K = 0;
    const int mode = ((flags & SDPA_GEMM_SKIP_ZERO_A) ? 1 : 0) | ((flags & SDPA_GEMM_SKIP_ZERO_B) ? 2 : 0);
    const int accumulate = (flags & SDPA_GEMM_ACCUMULATE) != 0;
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
                                      C + (ptrdiff_t)m0 * ldc + n0, ldc, accumulate, t);
        }
    }
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
 * vector max and sum along the keys, then the VL lanes combined in lane order
 * (a fixed order), so a row needs N/VL exp calls instead of N. */
static void tmpl_online_softmax_rows(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                     float *alpha)
{
    float lanes[TMPL_VL];
    for (int r = 0; r < M; r++) {
        float *s = S + (ptrdiff_t)r * lds;
        v_f32 mxv = V_SET1(m[r]);
        for (int n = 0; n < N; n += TMPL_VL)
            mxv = V_MAX(V_LOAD(s + n), mxv); /* NaN scores are skipped here, as fmaxf does */
        V_STORE(lanes, mxv);
        float mx = m[r];
        for (int i = 0; i < TMPL_VL; i++)
            mx = lanes[i] > mx ? lanes[i] : mx;
        const float mu = (mx == -INFINITY) ? 0.0f : mx;
        const v_f32 muv = V_SET1(mu);
        v_f32 sum = V_ZERO();
        for (int n = 0; n < N; n += TMPL_VL) {
            const v_f32 sv = V_LOAD(s + n);
            const v_f32 p = V_SEL(V_EQ(sv, V_SET1(-INFINITY)), V_SET1(-0.0f), tmpl_exp(V_SUB(sv, muv)));
            V_STORE(s + n, p);
            sum = V_ADD(sum, p);
        }
        V_STORE(lanes, sum);
        float tot = 0.0f;
        for (int i = 0; i < TMPL_VL; i++)
            tot += lanes[i];
        V_STORE(lanes, tmpl_exp(V_SET1(m[r] - mu))); /* m[r] = -inf: exactly 0 */
        alpha[r] = lanes[0];
        l[r] = l[r] * lanes[0] + tot;
        m[r] = mx;
    }
}

/* --------------------------------------------------------- scale columns */

/* Column blocks outside: a block whose factors are all exactly 1 (the running
 * max of none of its queries moved, the common case after the first tiles) is
 * left alone, which is what multiplying by 1 gives bit for bit. */
static void tmpl_scale_columns(int M, int N, float *C, ptrdiff_t ldc, const float *alpha)
{
    const v_f32 one = V_SET1(1.0f);
    int n = 0;
    for (; n + TMPL_VL <= N; n += TMPL_VL) {
        const v_f32 a = V_LOAD(alpha + n);
        if (V_ALL(V_EQ(a, one)))
            continue;
        for (int m = 0; m < M; m++) {
            float *c = C + (ptrdiff_t)m * ldc + n;
            V_STORE(c, V_MUL(V_LOAD(c), a));
        }
    }
    if (n < N) {
        const v_tail t = V_TAIL_INIT(N - n);
        const v_f32 a = V_LOAD_T(alpha + n, t);
        for (int m = 0; m < M; m++) {
            float *c = C + (ptrdiff_t)m * ldc + n;
            V_STORE_T(c, V_MUL(V_LOAD_T(c, t), a), t);
        }
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

#define TMPL_NT_MR V_NT_MR
#define TMPL_NT_NR 4 /* keys per block: one V_REDUCE4 per row */
/* Keys ahead that a block prefetches, into L2 (locality 2). Measured on Zen 4
 * (decode, D = 64..256): 12..16 keys ahead take B=1 Hq=32 Hkv=8 Tk=4096 D=128
 * from ~3.5 ms to ~2.5 ms on one core, and cost nothing visible in cache. */
#define TMPL_NT_PF (4 * TMPL_NT_NR)
#define TMPL_NT_PF_LOCALITY 2

/* One mb x 4 block: C(i,j) = alpha * sum_k A[i*lda + k] * B[j*ldb + k] for
 * i < mb, j < nr <= 4. Keys j >= nr repeat key nr - 1 (computed, never stored),
 * so no B element outside the N rows is read; only the K leading elements of a
 * row are touched (the last vector is a masked load). With `pf`, each vector
 * step also prefetches the same columns of the key rows pf_rows[0..3] (rows of
 * a later block, clamped to the call's last row). mb and pf are compile-time
 * constants in every instantiation; K > 0. */
TMPL_INLINE void tmpl_gemm_nt_block(const int mb, const int pf, int nr, int K, float alpha,
                                    const float *A, ptrdiff_t lda, const float *B, ptrdiff_t ldb,
                                    float *C, ptrdiff_t rs_c, ptrdiff_t cs_c,
                                    const float *const *pf_rows)
{
    v_f32 acc[TMPL_NT_MR][TMPL_NT_NR];
    const float *a[TMPL_NT_MR], *b[TMPL_NT_NR];
    TMPL_UNROLL
    for (int j = 0; j < TMPL_NT_NR; j++)
        b[j] = B + (ptrdiff_t)(j < nr ? j : nr - 1) * ldb;
    TMPL_UNROLL
    for (int i = 0; i < mb; i++) {
        a[i] = A + (ptrdiff_t)i * lda;
        TMPL_UNROLL
        for (int j = 0; j < TMPL_NT_NR; j++)
            acc[i][j] = V_ZERO();
    }
    int k = 0;
    for (; k + TMPL_VL <= K; k += TMPL_VL) {
        v_f32 bv[TMPL_NT_NR];
        TMPL_UNROLL
        for (int j = 0; j < TMPL_NT_NR; j++) {
            if (pf)
                __builtin_prefetch(pf_rows[j] + k, 0, TMPL_NT_PF_LOCALITY);
            bv[j] = V_LOAD(b[j] + k);
        }
        TMPL_UNROLL
        for (int i = 0; i < mb; i++) {
            const v_f32 av = V_LOAD(a[i] + k);
            TMPL_UNROLL
            for (int j = 0; j < TMPL_NT_NR; j++)
                acc[i][j] = V_FMA(av, bv[j], acc[i][j]);
        }
    }
    if (k < K) {
        const v_tail t = V_TAIL_INIT(K - k);
        v_f32 bv[TMPL_NT_NR];
        TMPL_UNROLL
        for (int j = 0; j < TMPL_NT_NR; j++) {
            if (pf)
                __builtin_prefetch(pf_rows[j] + k, 0, TMPL_NT_PF_LOCALITY);
            bv[j] = V_LOAD_T(b[j] + k, t);
        }
        TMPL_UNROLL
        for (int i = 0; i < mb; i++) {
            const v_f32 av = V_LOAD_T(a[i] + k, t);
            TMPL_UNROLL
            for (int j = 0; j < TMPL_NT_NR; j++)
                acc[i][j] = V_FMA(av, bv[j], acc[i][j]);
        }
    }
    TMPL_UNROLL
    for (int i = 0; i < mb; i++) {
        float s[TMPL_NT_NR];
        V_REDUCE4(acc[i][0], acc[i][1], acc[i][2], acc[i][3], s);
        float *c = C + (ptrdiff_t)i * rs_c;
        for (int j = 0; j < nr; j++)
            c[(ptrdiff_t)j * cs_c] = alpha * s[j];
    }
}

typedef void (*tmpl_nt_fn)(int nr, int K, float alpha, const float *A, ptrdiff_t lda, const float *B,
                           ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c,
                           const float *const *pf_rows);

#define TMPL_NT_UKR(mb, pf)                                                                        \
    static void tmpl_nt_ukr_##mb##_##pf(int nr, int K, float alpha, const float *A, ptrdiff_t lda, \
                                        const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c,   \
                                        ptrdiff_t cs_c, const float *const *pf_rows)               \
    {                                                                                              \
        tmpl_gemm_nt_block(mb, pf, nr, K, alpha, A, lda, B, ldb, C, rs_c, cs_c, pf_rows);          \
    }

TMPL_NT_UKR(1, 0)
TMPL_NT_UKR(1, 1)
TMPL_NT_UKR(2, 0)
TMPL_NT_UKR(2, 1)
#if TMPL_NT_MR >= 3
TMPL_NT_UKR(3, 0)
TMPL_NT_UKR(3, 1)
#endif
#if TMPL_NT_MR >= 4
TMPL_NT_UKR(4, 0)
TMPL_NT_UKR(4, 1)
#endif
#if TMPL_NT_MR > 4 || TMPL_NT_MR < 2
#error "V_NT_MR must be 2, 3 or 4"
#endif

/* [prefetch][rows in the block] */
static const tmpl_nt_fn tmpl_nt_tab[2][TMPL_NT_MR + 1] = {
    {NULL, tmpl_nt_ukr_1_0, tmpl_nt_ukr_2_0
#if TMPL_NT_MR >= 3
     , tmpl_nt_ukr_3_0
#endif
#if TMPL_NT_MR >= 4
     , tmpl_nt_ukr_4_0
#endif
    },
    {NULL, tmpl_nt_ukr_1_1, tmpl_nt_ukr_2_1
#if TMPL_NT_MR >= 3
     , tmpl_nt_ukr_3_1
#endif
#if TMPL_NT_MR >= 4
     , tmpl_nt_ukr_4_1
#endif
    }};

/* C(m,n) = alpha * sum_k A[m*lda + k] B[n*ldb + k], see sdpa_gemm_nt_fn. Key
 * blocks of 4 outside, row blocks of V_NT_MR inside: the 4 key rows come from
 * memory once and stay in L1 for every row block. The first row block of each
 * key block prefetches the key rows TMPL_NT_PF ahead (a decode pass streams K
 * once, with few FLOPs per byte: without it the loads wait on memory). */
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
    for (int n0 = 0; n0 < N; n0 += TMPL_NT_NR) {
        const int nr = N - n0 < TMPL_NT_NR ? N - n0 : TMPL_NT_NR;
        const float *b = B + (ptrdiff_t)n0 * ldb;
        float *c = C + (ptrdiff_t)n0 * cs_c;
        const float *pf_rows[TMPL_NT_NR];
        const int pf = n0 + TMPL_NT_PF < N;
        for (int j = 0; j < TMPL_NT_NR; j++) {
            const int r = n0 + TMPL_NT_PF + j;
            pf_rows[j] = B + (ptrdiff_t)(r < N ? r : N - 1) * ldb;
        }
        for (int m0 = 0; m0 < M; m0 += TMPL_NT_MR) {
            const int mr = M - m0 < TMPL_NT_MR ? M - m0 : TMPL_NT_MR;
            tmpl_nt_tab[pf && m0 == 0][mr](nr, K, alpha, A + (ptrdiff_t)m0 * lda, lda, b, ldb,
                                           c + (ptrdiff_t)m0 * rs_c, rs_c, cs_c, pf_rows);
        }
    }
}

/* ------------------------------------------------------------- transpose */

static void tmpl_transpose(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
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

/* ----------------------------------------------------------------- table */

/* Installs every kernel of this file; the ISA's init sets name and block sizes. */
static inline void tmpl_fill_table(sdpa_kernels *t)
{
    t->gemm = tmpl_gemm;
    t->online_softmax = tmpl_online_softmax;
    t->scale_columns = tmpl_scale_columns;
    t->bwd_probs = tmpl_bwd_probs;
    t->bwd_dscores = tmpl_bwd_dscores;
    t->transpose = tmpl_transpose;
    t->gemm_nt = tmpl_gemm_nt;
    t->online_softmax_rows = tmpl_online_softmax_rows;
}

#endif /* SDPA_SIMD_TMPL_H */
