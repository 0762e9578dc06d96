/* SPDX-License-Identifier: MIT */
/* x86/attend_pairs_avx512.h - attend_rows_bf16_pairs for the AVX-512 table (kernels.h):
 * the decode step of bf16 query rows over a bf16 K/V cache with the scores S = scale Q K^T
 * on AVX512-BF16 `vdpbf16ps`, 32 products of a query row and a key row per instruction
 * against the 16 FMAs (and the 16 widenings of K) of attend_rows_bf16; the row softmax
 * and O = alpha O + P V are attend_rows_bf16's own (simd/attend.h), V widened in
 * registers, P in fp32.
 *
 * Included by x86/kernels_avx512.c after simd_tmpl.h. That file is built for AVX-512
 * F/VL/BW/DQ only: the functions here that issue `vdpbf16ps` carry the avx512bf16 target
 * themselves, and the table holds them only where CPUID has AVX512_BF16 (set by
 * sdpa_kernels_init_avx512_bf16). The numbers: Q's and K's values are bf16 (the problem's
 * q_dtype and kv_dtype), so every product is exact in fp32, as in attend_rows_bf16; the
 * sums run in another fixed order (lane p of a chain adds pairs p, p + 16, ... of the
 * row; two chains, then the V_REDUCE4 tree), and bf16 subnormals count as zero
 * (docs/design.md, "What is rounded"). */
#ifndef SDPA_X86_ATTEND_PAIRS_AVX512_H
#define SDPA_X86_ATTEND_PAIRS_AVX512_H

#define PAIRS_TARGET __attribute__((target("avx512bf16")))
#define PAIRS_INLINE static inline __attribute__((always_inline, target("avx512bf16")))
#define PAIRS_MAX_NP (V_NT_QREGS / 2) /* pair vectors of a query row: head_dim up to 256 */

/* Keys n0 .. n0 + TMPL_REDUCE_N / rb - 1 (one at or past N reads row N - 1, never stored)
 * against the rb query rows: pair products, even and odd vectors in two chains. */
PAIRS_INLINE void pairs_keys(const int rb, const int np, const __m512bh *qp, int n0, int N, const uint16_t *K,
                             ptrdiff_t ldk, __m512 acc[TMPL_REDUCE_N][2])
{
    TMPL_UNROLL
    for (int j = 0; j < TMPL_REDUCE_N / rb; j++) {
        const uint16_t *k = K + (ptrdiff_t)(n0 + j < N ? n0 + j : N - 1) * ldk;
        TMPL_UNROLL
        for (int i = 0; i < rb; i++)
            acc[j * rb + i][0] = acc[j * rb + i][1] = _mm512_setzero_ps();
        TMPL_UNROLL
        for (int v = 0; v < np; v++) {
            const __m512bh kv = (__m512bh)_mm512_loadu_si512((const void *)(k + 32 * v));
            TMPL_UNROLL
            for (int i = 0; i < rb; i++)
                acc[j * rb + i][v & 1] = _mm512_dpbf16_ps(acc[j * rb + i][v & 1], qp[i * PAIRS_MAX_NP + v], kv);
        }
    }
}

/* avx512_reduce4 (vec_avx512.h) of four iterations at once, in two halves. This first
 * half, of one iteration's four (row, key) accumulator pairs: per 128-bit lane L, the sums
 * q_L of its four vectors (avx512_reduce4's u). */
PAIRS_INLINE __m512 pairs_reduce_part(__m512 acc[TMPL_REDUCE_N][2])
{
    const __m512 a0 = _mm512_add_ps(acc[0][0], acc[0][1]), a1 = _mm512_add_ps(acc[1][0], acc[1][1]),
                 a2 = _mm512_add_ps(acc[2][0], acc[2][1]), a3 = _mm512_add_ps(acc[3][0], acc[3][1]);
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    return _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xEE));
}

/* The second half, of four iterations' u[b]: lane 4b + j of the result is (q_0 + q_2) +
 * (q_1 + q_3) of u[b]'s vector j, the bits avx512_reduce4 gives, in one vector instead of
 * sixteen scalars. */
PAIRS_INLINE __m512 pairs_reduce16(const __m512 u[4])
{
    /* [u0 lanes 0 + 2, u0 1 + 3, u1 0 + 2, u1 1 + 3], and the same of u2, u3 */
    const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

/* S(i, n) = alpha Q_i . K_n for rb (1 or 2) query rows held as np vectors of 32 bf16
 * (qp) against N key rows of np * 32 bf16, four keys (rb = 1) or two (rb = 2) per
 * V_REDUCE4, each key row read whole, front to back, as tmpl_nt_reg reads it. */
PAIRS_INLINE void pairs_scores(const int rb, const int np, int mr, int N, float alpha, const __m512bh *qp,
                               const uint16_t *K, ptrdiff_t ldk, float *C, ptrdiff_t rs_c)
{
    const int kpi = TMPL_REDUCE_N / rb;
    int n0 = 0;
    for (; n0 + 4 * kpi <= N; n0 += 4 * kpi) { /* 16 sums: keys n0 + b kpi + j of row i in lane 4b + j rb + i */
        __m512 u[4];
        TMPL_UNROLL
        for (int b = 0; b < 4; b++) {
            __m512 acc[TMPL_REDUCE_N][2];
            pairs_keys(rb, np, qp, n0 + b * kpi, N, K, ldk, acc);
            u[b] = pairs_reduce_part(acc);
        }
        const __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), pairs_reduce16(u));
        if (rb == 1) {
            _mm512_storeu_ps(C + n0, r);
        } else { /* rows 0 and 1: the even and the odd lanes */
            const __m512 d = _mm512_permutexvar_ps(
                _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), r);
            _mm256_storeu_ps(C + n0, _mm512_castps512_ps256(d));
            if (mr > 1)
                _mm256_storeu_ps(C + rs_c + n0, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(d), 1)));
        }
    }
    for (; n0 < N; n0 += kpi) {
        __m512 acc[TMPL_REDUCE_N][2];
        pairs_keys(rb, np, qp, n0, N, K, ldk, acc);
        tmpl_nt_reduce_store(rb, kpi, mr, N, n0, alpha, acc, C, rs_c, 1);
    }
}

/* tmpl_attend (simd/attend.h) with the scores above: nv = 2 np vectors per row of Q, K,
 * V and O, steps of TMPL_ATTEND_STEP keys, query rows two at a time where two fit. */
PAIRS_INLINE void pairs_attend(const int np, int M, int N, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                               const uint16_t *K, ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, float *m,
                               float *l, float *O, ptrdiff_t ldo, float *S, float *alpha)
{
    const int nv = 2 * np, two = 2 * nv <= V_NT_QREGS;
    __m512bh qp[TMPL_ATTEND_MAX_ROWS * PAIRS_MAX_NP];
    for (int r = 0; r < M; r++) /* exact: the rows hold bf16 values (a subnormal becomes 0, as vdpbf16ps reads it) */
        TMPL_UNROLL
        for (int v = 0; v < np; v++)
            qp[r * PAIRS_MAX_NP + v] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(Q + (ptrdiff_t)r * ldq + 32 * v + 16),
                                                           _mm512_loadu_ps(Q + (ptrdiff_t)r * ldq + 32 * v));
    for (int j = 0; j < N; j += TMPL_ATTEND_STEP) {
        const int n = N - j < TMPL_ATTEND_STEP ? N - j : TMPL_ATTEND_STEP;
        const uint16_t *kj = K + (ptrdiff_t)j * ldk, *vj = V + (ptrdiff_t)j * ldv;
        int m0 = 0;
        if (two)
            for (; m0 + 2 <= M; m0 += 2)
                pairs_scores(2, np, 2, n, scale, qp + m0 * PAIRS_MAX_NP, kj, ldk, S + m0 * TMPL_ATTEND_STEP,
                             TMPL_ATTEND_STEP);
        for (; m0 < M; m0++)
            pairs_scores(1, np, 1, n, scale, qp + m0 * PAIRS_MAX_NP, kj, ldk, S + m0 * TMPL_ATTEND_STEP,
                         TMPL_ATTEND_STEP);
        if (n < TMPL_ATTEND_STEP)
            for (int r = 0; r < M; r++)
                for (int jj = n; jj < TMPL_ATTEND_STEP; jj++)
                    S[r * TMPL_ATTEND_STEP + jj] = -INFINITY;
        TMPL_FN(online_softmax_rows)(M, TMPL_ATTEND_STEP, S, TMPL_ATTEND_STEP, m, l, alpha);
        m0 = 0;
        if (two)
            for (; m0 + 2 <= M; m0 += 2)
                tmpl_stream_reg(TMPL_KV_BF16, 2, nv, 0, 2, Dv, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, vj,
                                ldv, O + (ptrdiff_t)m0 * ldo, ldo, alpha + m0);
        for (; m0 < M; m0++)
            tmpl_stream_reg(TMPL_KV_BF16, 1, nv, 0, 1, Dv, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, vj, ldv,
                            O + (ptrdiff_t)m0 * ldo, ldo, alpha + m0);
    }
}

typedef void (*pairs_attend_fn)(int M, int N, int Dv, float scale, const float *Q, ptrdiff_t ldq, const uint16_t *K,
                                ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, float *m, float *l, float *O,
                                ptrdiff_t ldo, float *S, float *alpha);
#define PAIRS_ATTEND(np)                                                                           \
    static PAIRS_TARGET void attend_pairs_##np(int M, int N, int Dv, float scale, const float *Q, ptrdiff_t ldq, \
                                               const uint16_t *K, ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, \
                                               float *m, float *l, float *O, ptrdiff_t ldo, float *S, float *alpha) \
    {                                                                                              \
        pairs_attend(np, M, N, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, S, alpha);       \
    }
PAIRS_ATTEND(1)
PAIRS_ATTEND(2)
PAIRS_ATTEND(3)
PAIRS_ATTEND(4)
PAIRS_ATTEND(5)
PAIRS_ATTEND(6)
PAIRS_ATTEND(7)
PAIRS_ATTEND(8)
static const pairs_attend_fn attend_pairs_tab[PAIRS_MAX_NP + 1] = {
    NULL, attend_pairs_1, attend_pairs_2, attend_pairs_3, attend_pairs_4,
    attend_pairs_5, attend_pairs_6, attend_pairs_7, attend_pairs_8};

/* See sdpa_attend_rows16_fn and kernels.h's attend_rows_bf16_pairs: head_dim_qk =
 * head_dim_v, a multiple of 32 and at most 32 PAIRS_MAX_NP; any other shape (or M outside
 * 1..TMPL_ATTEND_MAX_ROWS) is attend_rows_bf16's, with its bits. */
int sdpa_avx512_attend_rows_bf16_pairs(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                       const uint16_t *K, ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, float *m,
                                       float *l, float *O, ptrdiff_t ldo, float *scratch)
{
    if (Dk != Dv || Dk <= 0 || Dk % 32 != 0 || Dk / 32 > PAIRS_MAX_NP || M <= 0 || M > TMPL_ATTEND_MAX_ROWS)
        return TMPL_FN(attend_rows_bf16)(M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch);
    if (N > 0)
        attend_pairs_tab[Dk / 32](M, N, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch,
                                  scratch + TMPL_ATTEND_MAX_ROWS * TMPL_ATTEND_STEP);
    return 1;
}

#endif /* SDPA_X86_ATTEND_PAIRS_AVX512_H */
