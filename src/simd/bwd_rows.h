/* SPDX-License-Identifier: MIT */
/* simd/bwd_rows.h - bwd_rows: the few-row (decode) backward over a run of keys that every
 * row allows, in one pass over K and V: per step of V_NT_STEP keys, S = scale Q K^T and
 * dP = dO V^T (simd/decode.h's long-row dot products, K and V widened in registers when
 * they are bf16 / fp16), P = exp(S - LSE) and dS = P (dP - D), then dQ += dS K
 * (gemm_stream's rows), and each key's dV = P^T dO and dK = scale dS^T Q stored at once,
 * narrowed to K/V's type. K and V are read from memory once, dK and dV written once,
 * and the step's work runs while the next rows stream in (sdpa_bwd_rows_fn in
 * src/kernels.h; backward_typed.c calls it; FlashAttention-2's backward, Dao 2023,
 * Algorithm 2, with one query tile).
 *
 * Part of src/simd_tmpl.h, included only from there (after simd/decode.h and simd/stream.h). */
#ifndef SDPA_SIMD_BWD_ROWS_H
#define SDPA_SIMD_BWD_ROWS_H

#define TMPL_BWD_ROWS_STEP V_NT_STEP
#define TMPL_BWD_ROWS_MAX V_ATTEND_MAX_ROWS
/* scratch: S (then P) and dP (then dS) of every row for one step, and D */
#define TMPL_BWD_ROWS_SCRATCH (2 * TMPL_BWD_ROWS_MAX * TMPL_BWD_ROWS_STEP + TMPL_BWD_ROWS_MAX)

/* One vector v stored at element off of a row of type kvt (fp32, or narrowed to bf16 /
 * fp16 with src/dtype.h's rounding); the _t form stores the first n elements only. */
TMPL_INLINE void tmpl_kv_store(const int kvt, void *B, ptrdiff_t off, v_f32 v)
{
    if (kvt == TMPL_KV_F32)
        V_STORE((float *)B + off, v);
    else if (kvt == TMPL_KV_BF16)
        V_NARROW_BF16((uint16_t *)B + off, v);
    else
        V_NARROW_F16((uint16_t *)B + off, v);
}

TMPL_INLINE void tmpl_kv_store_t(const int kvt, void *B, ptrdiff_t off, v_f32 v, int n, v_tail t)
{
    if (kvt == TMPL_KV_F32) {
        V_STORE_T((float *)B + off, v, t);
        return;
    }
    uint16_t *h = (uint16_t *)B + off;
#ifdef V_NARROW_BF16_T
    (void)n;
    if (kvt == TMPL_KV_BF16)
        V_NARROW_BF16_T(h, v, t);
    else
        V_NARROW_F16_T(h, v, t);
#else
    (void)t;
    uint16_t buf[TMPL_VL];
    if (kvt == TMPL_KV_BF16)
        V_NARROW_BF16(buf, v);
    else
        V_NARROW_F16(buf, v);
    memcpy(h, buf, (size_t)n * sizeof buf[0]);
#endif
}

/* Out row j = alpha * sum_{m < M} W[m][j] X[m] for the n keys j of a step (W: M rows
 * of the step's scores at stride ldw; X: M rows of len floats at stride ldx), each
 * vector one chain of fused multiply-adds in increasing m from zero, then alpha times
 * it, stored in type kvt at out + j * ldo: dV = P^T dO and dK = scale dS^T Q. */
TMPL_INLINE void tmpl_rows_tn(const int kvt, int M, int n, int len, float alpha, const float *W, ptrdiff_t ldw,
                              const float *X, ptrdiff_t ldx, void *out, ptrdiff_t ldo)
{
    const int nfull = len - len % TMPL_VL;
    const v_tail t = V_TAIL_INIT(len > nfull ? len - nfull : TMPL_VL);
    const v_f32 va = V_SET1(alpha);
    for (int j = 0; j < n; j++) {
        v_f32 w[TMPL_BWD_ROWS_MAX];
        for (int m = 0; m < M; m++)
            w[m] = V_SET1(W[(ptrdiff_t)m * ldw + j]);
        const ptrdiff_t o = (ptrdiff_t)j * ldo;
        int c = 0;
        for (; c < nfull; c += TMPL_VL) {
            v_f32 acc = V_ZERO();
            for (int m = 0; m < M; m++)
                acc = V_FMA(w[m], V_LOAD(X + (ptrdiff_t)m * ldx + c), acc);
            tmpl_kv_store(kvt, out, o + c, V_MUL(va, acc));
        }
        if (c < len) {
            v_f32 acc = V_ZERO();
            for (int m = 0; m < M; m++)
                acc = V_FMA(w[m], V_LOAD_T(X + (ptrdiff_t)m * ldx + c, t), acc);
            tmpl_kv_store_t(kvt, out, o + c, V_MUL(va, acc), len - c, t);
        }
    }
}

/* See sdpa_bwd_rows_fn. */
TMPL_INLINE int tmpl_bwd_rows(const int kvt, int M, int N, int Dk, int Dv, float scale, const float *Q,
                              ptrdiff_t ldq, const float *O, ptrdiff_t ldo, const float *dO, ptrdiff_t lddo,
                              const float *lse, const void *K, ptrdiff_t ldk, const void *V, ptrdiff_t ldv, float *dQ,
                              ptrdiff_t lddq, void *dK, ptrdiff_t lddk, void *dV, ptrdiff_t lddv, float *scratch)
{
    if (M <= 0 || M > TMPL_BWD_ROWS_MAX || Dk <= 0 || Dv <= 0 || N < 0)
        return 0;
    const int step = TMPL_BWD_ROWS_STEP;
    const ptrdiff_t eb = kvt == TMPL_KV_F32 ? sizeof(float) : sizeof(uint16_t);
    float *S = scratch, *dP = S + TMPL_BWD_ROWS_MAX * step, *D = dP + TMPL_BWD_ROWS_MAX * step;
    /* D = rowsum(dO * O) with the dot product that forms dP (one-hot P: O = V, and
     * dP - D is then exactly 0) */
    for (int m = 0; m < M; m++)
        tmpl_nt_long(TMPL_KV_F32, 1, 1, Dv, 1.0f, dO + (ptrdiff_t)m * lddo, lddo, O + (ptrdiff_t)m * ldo, ldo, D + m,
                     1, 1);
    for (int m = 0; m < M; m++)
        memset(dQ + (ptrdiff_t)m * lddq, 0, (size_t)Dk * sizeof(float));
    for (int i = 0; i < M * step; i++) /* lanes past a short last step: computed, never used */
        S[i] = dP[i] = 0.0f;
    for (int j = 0; j < N; j += step) {
        const int n = N - j < step ? N - j : step;
        const void *kj = tmpl_kv_at(kvt, K, (ptrdiff_t)j * ldk), *vj = tmpl_kv_at(kvt, V, (ptrdiff_t)j * ldv);
        tmpl_nt_long(kvt, M, n, Dk, scale, Q, ldq, kj, ldk, S, step, 1);
        tmpl_nt_long(kvt, M, n, Dv, 1.0f, dO, lddo, vj, ldv, dP, step, 1);
        for (int m = 0; m < M; m++) {
            const v_f32 l = V_SET1(lse[m]), d = V_SET1(D[m]);
            float *s = S + m * step, *dp = dP + m * step;
            for (int c = 0; c < step; c += TMPL_VL) {
                const v_f32 p = tmpl_exp(V_SUB(V_LOAD(s + c), l));
                V_STORE(s + c, p);
                V_STORE(dp + c, V_MUL(p, V_SUB(V_LOAD(dp + c), d)));
            }
        }
        tmpl_gemm_stream(kvt, M, Dk, n, dP, step, kj, ldk, dQ, lddq, 0, NULL);
        tmpl_rows_tn(kvt, M, n, Dv, 1.0f, S, step, dO, lddo, (char *)dV + (ptrdiff_t)j * lddv * (ptrdiff_t)eb, lddv);
        tmpl_rows_tn(kvt, M, n, Dk, scale, dP, step, Q, ldq, (char *)dK + (ptrdiff_t)j * lddk * (ptrdiff_t)eb, lddk);
    }
    const v_f32 vs = V_SET1(scale);
    const int nfull = Dk - Dk % TMPL_VL;
    const v_tail t = V_TAIL_INIT(Dk > nfull ? Dk - nfull : TMPL_VL);
    for (int m = 0; m < M; m++) { /* dQ = scale dS K */
        float *q = dQ + (ptrdiff_t)m * lddq;
        int c = 0;
        for (; c < nfull; c += TMPL_VL)
            V_STORE(q + c, V_MUL(vs, V_LOAD(q + c)));
        if (c < Dk)
            V_STORE_T(q + c, V_MUL(vs, V_LOAD_T(q + c, t)), t);
    }
    return 1;
}

/* bwd_rows_<type>_<isa>: sdpa_bwd_rows_fn over K/V of that type */
#define TMPL_BWD_ROWS_T(ty, kvt)                                                                   \
    static int TMPL_FN(bwd_rows_##ty)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq, \
                                      const float *O, ptrdiff_t ldo, const float *dO, ptrdiff_t lddo,        \
                                      const float *lse, const void *K, ptrdiff_t ldk, const void *V,         \
                                      ptrdiff_t ldv, float *dQ, ptrdiff_t lddq, void *dK, ptrdiff_t lddk,    \
                                      void *dV, ptrdiff_t lddv, float *scratch)                              \
    {                                                                                              \
        return tmpl_bwd_rows(kvt, M, N, Dk, Dv, scale, Q, ldq, O, ldo, dO, lddo, lse, K, ldk, V, ldv, dQ, lddq, dK, \
                             lddk, dV, lddv, scratch);                                             \
    }
TMPL_BWD_ROWS_T(f32, TMPL_KV_F32)
TMPL_BWD_ROWS_T(bf16, TMPL_KV_BF16)
TMPL_BWD_ROWS_T(f16, TMPL_KV_F16)

#endif /* SDPA_SIMD_BWD_ROWS_H */
