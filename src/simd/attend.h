/* SPDX-License-Identifier: MIT */
/* simd/attend.h - attend_rows: the few-column (decode) forward of one step of keys at a
 * time, S = scale Q K^T, the row softmax and O = alpha O + P V in one call, composed of
 * simd/decode.h's gemm_nt and simd/stream.h's gemm_stream pieces (inlined) and simd/softmax.h's
 * online_softmax_rows, over an fp32 K/V or a bf16 / fp16 cache widened in registers.
 *
 * Part of src/simd_tmpl.h, included only from there (after simd/decode.h and simd/stream.h). */
#ifndef SDPA_SIMD_ATTEND_H
#define SDPA_SIMD_ATTEND_H

/* Keys per step of attend_rows (and of the driver's few-column path: the
 * table's nt_step) and the query rows it takes come from the layer; its
 * scratch: S of every row, and alpha. */
#define TMPL_ATTEND_STEP V_NT_STEP
#define TMPL_ATTEND_MAX_ROWS V_ATTEND_MAX_ROWS
#define TMPL_ATTEND_SCRATCH (TMPL_ATTEND_MAX_ROWS * TMPL_ATTEND_STEP + TMPL_ATTEND_MAX_ROWS)

/* One compile-time head_dim size (nv vectors for both Q.K and O): steps of
 * TMPL_ATTEND_STEP keys, each S = scale Q K^T (query rows in registers, two at a time when two
 * fit V_NT_QREGS, else one), the row softmax, O = alpha O + P V (O rows in
 * registers, likewise); the pieces are the kernels above, inlined. */
TMPL_INLINE void tmpl_attend(const int kvt, const int nv, int M, int N, int Dk, int Dv, float scale, const float *Q,
                             ptrdiff_t ldq, const void *K, ptrdiff_t ldk, const void *V, ptrdiff_t ldv,
                             float *m, float *l, float *O, ptrdiff_t ldo, float *S, float *alpha)
{
    const int pairs = 2 * nv <= V_NT_QREGS;
#ifdef V_ATTEND_QUAD
    /* a 16-bit cache where two rows fit the registers: rows four at a time first, each
     * K and V vector widened once for four rows instead of twice (measured faster for fp16
     * at every head_dim, for bf16 from 6 vectors; over an fp32 K/V the fewer passes over
     * each row were slower from memory: docs/perf-notes.md) */
    const int quad = pairs && nv >= 2 && (kvt == TMPL_KV_F16 || (kvt == TMPL_KV_BF16 && nv >= 6));
#else
    const int quad = 0;
#endif
    const size_t eb = kvt == TMPL_KV_F32 ? sizeof(float) : sizeof(uint16_t);
    for (int j = 0; j < N; j += TMPL_ATTEND_STEP) {
        const int n = N - j < TMPL_ATTEND_STEP ? N - j : TMPL_ATTEND_STEP;
        const void *kj = (const char *)K + (ptrdiff_t)j * ldk * (ptrdiff_t)eb;
        const void *vj = (const char *)V + (ptrdiff_t)j * ldv * (ptrdiff_t)eb;
        int m0 = 0;
        if (quad)
            for (; m0 + 4 <= M; m0 += 4)
                tmpl_nt_quad(kvt, nv, n, Dk, scale, Q + (ptrdiff_t)m0 * ldq, ldq, kj, ldk, S + m0 * TMPL_ATTEND_STEP,
                             TMPL_ATTEND_STEP, 1);
        if (pairs)
            for (; m0 + 2 <= M; m0 += 2)
                tmpl_nt_reg(kvt, 2, nv, 2, n, Dk, scale, Q + (ptrdiff_t)m0 * ldq, ldq, kj, ldk,
                            S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, 1);
        for (; m0 < M; m0++)
            tmpl_nt_reg(kvt, 1, nv, 1, n, Dk, scale, Q + (ptrdiff_t)m0 * ldq, ldq, kj, ldk,
                        S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, 1);
        if (n < TMPL_ATTEND_STEP)
            for (int r = 0; r < M; r++)
                for (int jj = n; jj < TMPL_ATTEND_STEP; jj++)
                    S[r * TMPL_ATTEND_STEP + jj] = -INFINITY;
        TMPL_FN(online_softmax_rows)(M, TMPL_ATTEND_STEP, S, TMPL_ATTEND_STEP, m, l, alpha);
        m0 = 0;
        if (quad) /* four O rows do not fit the registers whole: two halves of the columns */
            for (; m0 + 4 <= M; m0 += 4) {
                const int h = nv / 2 * TMPL_VL; /* first half: nv / 2 whole vectors */
                tmpl_stream_quad(kvt, nv / 2, h, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, vj, ldv,
                                 O + (ptrdiff_t)m0 * ldo, ldo, alpha + m0);
                tmpl_stream_quad(kvt, nv - nv / 2, Dv - h, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP,
                                 tmpl_kv_at(kvt, vj, h), ldv, O + (ptrdiff_t)m0 * ldo + h, ldo, alpha + m0);
            }
        if (pairs)
            for (; m0 + 2 <= M; m0 += 2)
                tmpl_stream_reg(kvt, 2, nv, 0, 2, Dv, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, vj, ldv,
                                O + (ptrdiff_t)m0 * ldo, ldo, alpha + m0);
        for (; m0 < M; m0++)
            tmpl_stream_reg(kvt, 1, nv, 0, 1, Dv, n, S + m0 * TMPL_ATTEND_STEP, TMPL_ATTEND_STEP, vj, ldv,
                            O + (ptrdiff_t)m0 * ldo, ldo, alpha + m0);
    }
}

/* Query rows longer than V_NT_QREGS vectors (no register variant): the steps the
 * driver composes for an fp32 cache (forward.c, fwd_nt_seg), with K and V of type kvt
 * read by the same kernels (widened in registers): S = scale Q K^T by gemm_nt's
 * long-row path, keys past the step -inf, the row softmax, O = alpha O + P V by
 * gemm_stream. The bits of that composition on the widened rows. */
TMPL_INLINE void tmpl_attend_long(const int kvt, int M, int N, int Dk, int Dv, float scale, const float *Q,
                                  ptrdiff_t ldq, const void *K, ptrdiff_t ldk, const void *V, ptrdiff_t ldv, float *m,
                                  float *l, float *O, ptrdiff_t ldo, float *S, float *alpha)
{
    for (int j = 0; j < N; j += TMPL_ATTEND_STEP) {
        const int n = N - j < TMPL_ATTEND_STEP ? N - j : TMPL_ATTEND_STEP;
        tmpl_nt_long(kvt, M, n, Dk, scale, Q, ldq, tmpl_kv_at(kvt, K, (ptrdiff_t)j * ldk), ldk, S, TMPL_ATTEND_STEP,
                     1);
        if (n < TMPL_ATTEND_STEP)
            for (int r = 0; r < M; r++)
                for (int jj = n; jj < TMPL_ATTEND_STEP; jj++)
                    S[r * TMPL_ATTEND_STEP + jj] = -INFINITY;
        TMPL_FN(online_softmax_rows)(M, TMPL_ATTEND_STEP, S, TMPL_ATTEND_STEP, m, l, alpha);
        tmpl_gemm_stream(kvt, M, Dv, n, S, TMPL_ATTEND_STEP, tmpl_kv_at(kvt, V, (ptrdiff_t)j * ldv), ldv, O, ldo, 0,
                         alpha);
    }
}

typedef void (*tmpl_attend_fn)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                               const void *K, ptrdiff_t ldk, const void *V, ptrdiff_t ldv, float *m,
                               float *l, float *O, ptrdiff_t ldo, float *S, float *alpha);
/* attend_rows_<type>_<vectors>_<isa>, up to V_NT_QREGS vectors, per K/V type */
#define TMPL_ATTEND_LIST(X) TMPL_UPTO(V_NT_QREGS, X, ~)
#define TMPL_ATTEND_T(ty, kvt, nv)                                                                 \
    static void TMPL_FN(attend_rows_##ty##_##nv)(int M, int N, int Dk, int Dv, float scale, const float *Q, \
                                                 ptrdiff_t ldq, const void *K, ptrdiff_t ldk, const void *V, \
                                                 ptrdiff_t ldv, float *m, float *l, float *O, ptrdiff_t ldo, \
                                                 float *S, float *alpha)                           \
    {                                                                                              \
        tmpl_attend(kvt, nv, M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, S, alpha); \
    }
#define TMPL_ATTEND(nv, unused)                                                                    \
    TMPL_ATTEND_T(f32, TMPL_KV_F32, nv) TMPL_ATTEND_T(bf16, TMPL_KV_BF16, nv) TMPL_ATTEND_T(f16, TMPL_KV_F16, nv)
#define TMPL_ATTEND_PTR(nv, unused)                                                                \
    [TMPL_KV_F32][nv] = TMPL_FN(attend_rows_f32_##nv), [TMPL_KV_BF16][nv] = TMPL_FN(attend_rows_bf16_##nv), \
    [TMPL_KV_F16][nv] = TMPL_FN(attend_rows_f16_##nv),
TMPL_ATTEND_LIST(TMPL_ATTEND)
static const tmpl_attend_fn TMPL_FN(attend_rows_tab)[3][V_NT_QREGS + 1] = {TMPL_ATTEND_LIST(TMPL_ATTEND_PTR)};
#define TMPL_ATTEND_LONG(ty, kvt)                                                                  \
    static void TMPL_FN(attend_rows_long_##ty)(int M, int N, int Dk, int Dv, float scale, const float *Q, \
                                               ptrdiff_t ldq, const void *K, ptrdiff_t ldk, const void *V, \
                                               ptrdiff_t ldv, float *m, float *l, float *O, ptrdiff_t ldo, \
                                               float *S, float *alpha)                             \
    {                                                                                              \
        tmpl_attend_long(kvt, M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, S, alpha); \
    }
TMPL_ATTEND_LONG(f32, TMPL_KV_F32)
TMPL_ATTEND_LONG(bf16, TMPL_KV_BF16)
TMPL_ATTEND_LONG(f16, TMPL_KV_F16)
static const tmpl_attend_fn TMPL_FN(attend_rows_long_tab)[3] = {
    [TMPL_KV_F32] = TMPL_FN(attend_rows_long_f32), [TMPL_KV_BF16] = TMPL_FN(attend_rows_long_bf16),
    [TMPL_KV_F16] = TMPL_FN(attend_rows_long_f16)};

/* See sdpa_attend_rows_fn: the kernels above, inlined, when head_dim_qk and
 * head_dim_v take the same number of vectors and a row fits V_NT_QREGS
 * registers; tmpl_attend_long when a query row is longer (any head_dim_v);
 * returns 0 (nothing done) otherwise, and unless 0 < M <= TMPL_ATTEND_MAX_ROWS
 * (the driver then composes the same steps). */
TMPL_INLINE int tmpl_attend_rows(const int kvt, int M, int N, int Dk, int Dv, float scale, const float *Q,
                                 ptrdiff_t ldq, const void *K, ptrdiff_t ldk, const void *V, ptrdiff_t ldv, float *m,
                                 float *l, float *O, ptrdiff_t ldo, float *scratch)
{
    const int nvk = (Dk + TMPL_VL - 1) / TMPL_VL, nvv = (Dv + TMPL_VL - 1) / TMPL_VL;
    if (Dk <= 0 || Dv <= 0 || M <= 0 || M > TMPL_ATTEND_MAX_ROWS)
        return 0;
    if (nvk > V_NT_QREGS) {
        if (N > 0)
            TMPL_FN(attend_rows_long_tab)[kvt](M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch,
                                               scratch + TMPL_ATTEND_MAX_ROWS * TMPL_ATTEND_STEP);
        return 1;
    }
    if (nvk != nvv)
        return 0;
    if (N > 0)
        TMPL_FN(attend_rows_tab)[kvt][nvk](M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch,
                                           scratch + TMPL_ATTEND_MAX_ROWS * TMPL_ATTEND_STEP);
    return 1;
}

static int TMPL_FN(attend_rows)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                const float *K, ptrdiff_t ldk, const float *V, ptrdiff_t ldv, float *m,
                                float *l, float *O, ptrdiff_t ldo, float *scratch)
{
    return tmpl_attend_rows(TMPL_KV_F32, M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch);
}

/* The same over a bf16 / fp16 K/V cache (sdpa_attend_rows16_fn), widened in registers. */
static int TMPL_FN(attend_rows_bf16)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                     const uint16_t *K, ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, float *m,
                                     float *l, float *O, ptrdiff_t ldo, float *scratch)
{
    return tmpl_attend_rows(TMPL_KV_BF16, M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch);
}

static int TMPL_FN(attend_rows_f16)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                    const uint16_t *K, ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, float *m,
                                    float *l, float *O, ptrdiff_t ldo, float *scratch)
{
    return tmpl_attend_rows(TMPL_KV_F16, M, N, Dk, Dv, scale, Q, ldq, K, ldk, V, ldv, m, l, O, ldo, scratch);
}

#endif /* SDPA_SIMD_ATTEND_H */
