/* SPDX-License-Identifier: MIT */
/* simd/gemm.h - the gemm kernel (C (+)= alpha A B, register-blocked) over the vector layer.
 *
 * Part of src/simd_tmpl.h, included only from there (after a vector layer). */
#ifndef SDPA_SIMD_GEMM_H
#define SDPA_SIMD_GEMM_H

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
 * vectors whose last vector is partial (one TMPL_UPTO list for the kernels and
 * their table row): gemm_ukr_<mode>_<height>_full_<isa>, ..._t<nv>_<isa>. */
#define TMPL_UKR_TAIL(nv, tag, rb, sa, sb) TMPL_UKR(TMPL_FN(gemm_ukr_##tag##_t##nv), rb, nv, 1, sa, sb)
#define TMPL_UKR_TAIL_PTR(nv, tag) , TMPL_FN(gemm_ukr_##tag##_t##nv)
#define TMPL_UKR_MODE_RB(tag, rb, sa, sb)                                                          \
    TMPL_UKR(TMPL_FN(gemm_ukr_##tag##_full), rb, TMPL_NV, 0, sa, sb)                               \
    TMPL_UPTO(TMPL_NV, TMPL_UKR_TAIL, tag, rb, sa, sb)
#define TMPL_UKR_MODE(mode, sa, sb)                                                                \
    TMPL_UKR_MODE_RB(mode##_hmr, TMPL_MR, sa, sb)                                                  \
    TMPL_UKR_MODE_RB(mode##_hmid, TMPL_RB_MID, sa, sb)                                             \
    TMPL_UKR_MODE_RB(mode##_hsmall, TMPL_RB_SMALL, sa, sb)

TMPL_UKR_MODE(plain, 0, 0)
TMPL_UKR_MODE(za, 1, 0)
TMPL_UKR_MODE(zb, 0, 1)
TMPL_UKR_MODE(zab, 1, 1)

#define TMPL_UKR_ROW(tag) {TMPL_FN(gemm_ukr_##tag##_full) TMPL_UPTO(TMPL_NV, TMPL_UKR_TAIL_PTR, tag)}
#define TMPL_UKR_ROWS(mode) {TMPL_UKR_ROW(mode##_hmr), TMPL_UKR_ROW(mode##_hmid), TMPL_UKR_ROW(mode##_hsmall)}

/* [skip mode: bit 0 = SKIP_ZERO_A, bit 1 = SKIP_ZERO_B][height: MR, mid, small]
 * [0: full block, v: v vectors, last partial] */
static const tmpl_ukr_fn TMPL_FN(gemm_ukr_tab)[4][3][TMPL_NV + 1] = {
    TMPL_UKR_ROWS(plain), TMPL_UKR_ROWS(za), TMPL_UKR_ROWS(zb), TMPL_UKR_ROWS(zab)};

/* ------------------------------------------------------------ small depth */

/* C (+)= alpha A B for a depth K of at most TMPL_SMALLK_MAX (the dK, dV of a decode
 * backward: keys x head_dim, the inner dimension the few query columns): B's K rows
 * of a block of nv vectors stay in registers while every row of A streams past them,
 * instead of reloading the K x NB panel and paying a micro-kernel call per TMPL_MR
 * rows (49% of the FMA peak at M = N = 128, K = 4 on Zen 4). Per element of C the
 * same operations in the same order as tmpl_gemm_rows (FMAs in increasing k from 0,
 * then alpha * acc or alpha * acc + C), so the same bits for inputs without NaN
 * (two NaNs of different payloads: the columns after the blocks take another tail
 * kernel, whose operand order may keep the other payload). No skip modes, no row
 * scale. Only whole blocks of nv full vectors: returns the columns done, a multiple
 * of nv * VL; the caller does the rest. */
#define TMPL_SMALLK_MAX 8
#define TMPL_SMALLK_NV(K) (V_NT_QREGS / (K) >= 4 ? 4 : V_NT_QREGS / (K) >= 2 ? 2 : 1)
TMPL_INLINE int tmpl_gemm_smallk(const int K, int M, int N, float alpha, const float *A, ptrdiff_t rs_a,
                                 ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                                 int accumulate)
{
    const int nv = TMPL_SMALLK_NV(K), cols = nv * TMPL_VL;
    const v_f32 va = V_SET1(alpha);
    /* 1 * acc is acc, bit for bit in the default environment (a caller's DAZ without FTZ
     * would flush a denormal acc in the multiply): the multiply is left out */
    const int unit = alpha == 1.0f;
    int n0 = 0;
    for (; n0 + cols <= N; n0 += cols) {
        v_f32 b[TMPL_SMALLK_MAX][4];
        TMPL_UNROLL
        for (int k = 0; k < K; k++) {
            TMPL_UNROLL
            for (int j = 0; j < nv; j++)
                b[k][j] = V_LOAD(B + (ptrdiff_t)k * ldb + n0 + j * TMPL_VL);
        }
        for (int m = 0; m < M; m++) {
            const float *a = A + (ptrdiff_t)m * rs_a;
            float *c = C + (ptrdiff_t)m * ldc + n0;
            v_f32 acc[4];
            TMPL_UNROLL
            for (int j = 0; j < nv; j++)
                acc[j] = V_ZERO();
            TMPL_UNROLL
            for (int k = 0; k < K; k++) {
                const v_f32 av = V_BCAST(a + (ptrdiff_t)k * cs_a);
                TMPL_UNROLL
                for (int j = 0; j < nv; j++)
                    acc[j] = V_FMA(av, b[k][j], acc[j]);
            }
            TMPL_UNROLL
            for (int j = 0; j < nv; j++) {
                if (accumulate == 1)
                    V_STORE(c + j * TMPL_VL, V_FMA(va, acc[j], V_LOAD(c + j * TMPL_VL)));
#ifdef V_STREAM
                else if (accumulate == TMPL_STORE_STREAM)
                    V_STREAM(c + j * TMPL_VL, unit ? acc[j] : V_MUL(va, acc[j]));
#endif
                else
                    V_STORE(c + j * TMPL_VL, unit ? acc[j] : V_MUL(va, acc[j]));
            }
        }
    }
    return n0;
}

typedef int (*tmpl_smallk_fn)(int M, int N, float alpha, const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a,
                              const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate);
#define TMPL_SMALLK_FN(K, unused)                                                                  \
    static int TMPL_FN(gemm_smallk_##K)(int M, int N, float alpha, const float *A, ptrdiff_t rs_a,     \
                                        ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C,       \
                                        ptrdiff_t ldc, int accumulate)                                 \
    {                                                                                              \
        return tmpl_gemm_smallk(K, M, N, alpha, A, rs_a, cs_a, B, ldb, C, ldc, accumulate);        \
    }
#define TMPL_SMALLK_PTR(K, unused) TMPL_FN(gemm_smallk_##K),
TMPL_UPTO(TMPL_SMALLK_MAX, TMPL_SMALLK_FN, 0)
static const tmpl_smallk_fn TMPL_FN(gemm_smallk_tab)[TMPL_SMALLK_MAX] = {
    TMPL_UPTO(TMPL_SMALLK_MAX, TMPL_SMALLK_PTR, 0)};

/* C = alpha A B (or C += with ACCUMULATE), see sdpa_gemm_fn. Column blocks of
 * NB = NV*VL outside, MR-row blocks inside: one K x NB panel of B serves every
 * row block. */
static void TMPL_FN(gemm)(int M, int N, int K, float alpha, const float *A, ptrdiff_t rs_a,
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
    int n_first = 0;
    if (mode == 0 && !c_row_scale && K >= 1 && K <= TMPL_SMALLK_MAX && M >= TMPL_MR)
        n_first = TMPL_FN(gemm_smallk_tab)[K - 1](M, N, alpha, A, rs_a, cs_a, B, ldb, C, ldc, accumulate);
    for (int n0 = n_first; n0 < N; n0 += TMPL_NB) {
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
            TMPL_FN(gemm_ukr_tab)[mode][h][nv](mr, K, alpha, A + (ptrdiff_t)m0 * rs_a, rs_a, cs_a, B + n0, ldb,
                                      C + (ptrdiff_t)m0 * ldc + n0, ldc, accumulate,
                                      c_row_scale ? c_row_scale + m0 : NULL, t);
        }
    }
#ifdef V_STREAM
    if (stream) /* order the non-temporal stores before whatever the caller does next */
        V_STREAM_FENCE();
#endif
}

#endif /* SDPA_SIMD_GEMM_H */
