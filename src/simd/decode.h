/* SPDX-License-Identifier: MIT */
/* simd/decode.h - the few-column (decode) kernels over the vector layer, first half: the
 * B-row loads of every type and gemm_nt (S = Q K^T with K rows read whole); simd/stream.h
 * has gemm_stream (O = alpha O + P V with B rows read whole). The forward's attend_rows
 * (simd/attend.h) and the backward's bwd_rows (simd/bwd_rows.h) are built of their pieces.
 *
 * Part of src/simd_tmpl.h, included only from there (after a vector layer). The
 * kernels instantiated per (rows, vectors) come from TMPL_UPTO lists, one per
 * family, which define both the kernels and their table. */
#ifndef SDPA_SIMD_DECODE_H
#define SDPA_SIMD_DECODE_H

/* Half of V_NT_QREGS as a literal (TMPL_UPTO needs one): the vectors per query
 * row when two rows share the registers. */
#define TMPL_HALF_8 4
#define TMPL_HALF_16 8
#define TMPL_NT_PAIR_NV TMPL_CAT(TMPL_HALF, V_NT_QREGS)
#if V_NT_QREGS != 8 && V_NT_QREGS != 16
#error "V_NT_QREGS must be 8 or 16 (add its half to TMPL_HALF_*)"
#endif

/* The element type of B in tmpl_nt_reg and tmpl_stream_reg (compile-time): fp32,
 * or a bf16 / fp16 K/V cache widened in registers as it is read (attend_rows_bf16,
 * attend_rows_f16: the same values as widening first, so the same bits as
 * attend_rows on the widened rows). */
enum { TMPL_KV_F32, TMPL_KV_BF16, TMPL_KV_F16 };

/* One vector of B at element off (full), or its first n elements (t: V_TAIL_INIT(n)). */
TMPL_INLINE v_f32 tmpl_kv_load(const int kvt, const void *B, ptrdiff_t off)
{
    if (kvt == TMPL_KV_F32)
        return V_LOAD((const float *)B + off);
    const uint16_t *h = (const uint16_t *)B + off;
    return kvt == TMPL_KV_BF16 ? V_WIDEN_BF16(h) : V_WIDEN_F16(h);
}

TMPL_INLINE v_f32 tmpl_kv_load_t(const int kvt, const void *B, ptrdiff_t off, int n, v_tail t)
{
    if (kvt == TMPL_KV_F32)
        return V_LOAD_T((const float *)B + off, t);
    const uint16_t *h = (const uint16_t *)B + off;
#ifdef V_WIDEN_BF16_T
    (void)n;
    return kvt == TMPL_KV_BF16 ? V_WIDEN_BF16_T(h, t) : V_WIDEN_F16_T(h, t);
#else
    uint16_t buf[TMPL_VL] = {0};
    memcpy(buf, h, (size_t)n * sizeof buf[0]);
    return kvt == TMPL_KV_BF16 ? V_WIDEN_BF16(buf) : V_WIDEN_F16(buf);
#endif
}

/* B advanced by off elements of its type. */
TMPL_INLINE const void *tmpl_kv_at(const int kvt, const void *B, ptrdiff_t off)
{
    return (const char *)B + off * (ptrdiff_t)(kvt == TMPL_KV_F32 ? sizeof(float) : sizeof(uint16_t));
}

/* --------------------------------------------------------------- gemm_nt */

/* Row n of B against rows 0..rb-1 of A (rb compile-time, 1..TMPL_REDUCE_N), for head_dims
 * too long to keep query rows in registers: C(i, n) = alpha * sum_k A[i*lda + k] B[k]
 * for i < rb. The key row is read once, front to back (see tmpl_nt_reg), and
 * each query row's vector comes from L1; one accumulator per row, then
 * V_REDUCE4. */
TMPL_INLINE void tmpl_nt_key(const int kvt, const int rb, int K, float alpha, const float *A, ptrdiff_t lda,
                             const void *B, ptrdiff_t b, float *c, ptrdiff_t rs_c)
{
    v_f32 acc[TMPL_REDUCE_N];
    TMPL_UNROLL
    for (int i = 0; i < TMPL_REDUCE_N; i++)
        acc[i] = V_ZERO();
    int k = 0;
    for (; k + TMPL_VL <= K; k += TMPL_VL) {
        const v_f32 bv = tmpl_kv_load(kvt, B, b + k);
        TMPL_UNROLL
        for (int i = 0; i < rb; i++)
            acc[i] = V_FMA(V_LOAD(A + (ptrdiff_t)i * lda + k), bv, acc[i]);
    }
    if (k < K) {
        const v_tail t = V_TAIL_INIT(K - k);
        const v_f32 bv = tmpl_kv_load_t(kvt, B, b + k, K - k, t);
        TMPL_UNROLL
        for (int i = 0; i < rb; i++)
            acc[i] = V_FMA(V_LOAD_T(A + (ptrdiff_t)i * lda + k, t), bv, acc[i]);
    }
    float s[TMPL_REDUCE_N];
    V_REDUCE4(acc[0], acc[1], acc[2], acc[3], s);
    TMPL_UNROLL
    for (int i = 0; i < rb; i++)
        c[(ptrdiff_t)i * rs_c] = alpha * s[i];
}

typedef void (*tmpl_nt_fn)(int N, int K, float alpha, const float *A, ptrdiff_t lda, const void *B,
                           ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c);
/* gemm_nt_keys_<type>_<rows>_<isa>, rows 1..TMPL_REDUCE_N, per K type (fp32, or a
 * bf16 / fp16 cache widened in registers: attend_rows_bf16 and _f16 of long rows) */
#define TMPL_NT_KEYS_T(ty, kvt, rb)                                                                \
    static void TMPL_FN(gemm_nt_keys_##ty##_##rb)(int N, int K, float alpha, const float *A, ptrdiff_t lda, \
                                                  const void *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, \
                                                  ptrdiff_t cs_c)                                  \
    {                                                                                              \
        for (int n = 0; n < N; n++)                                                                \
            tmpl_nt_key(kvt, rb, K, alpha, A, lda, B, (ptrdiff_t)n * ldb, C + (ptrdiff_t)n * cs_c, rs_c); \
    }
#define TMPL_NT_KEYS(rb, unused)                                                                   \
    TMPL_NT_KEYS_T(f32, TMPL_KV_F32, rb) TMPL_NT_KEYS_T(bf16, TMPL_KV_BF16, rb) TMPL_NT_KEYS_T(f16, TMPL_KV_F16, rb)
#define TMPL_NT_KEYS_PTR(rb, unused)                                                               \
    [TMPL_KV_F32][rb] = TMPL_FN(gemm_nt_keys_f32_##rb), [TMPL_KV_BF16][rb] = TMPL_FN(gemm_nt_keys_bf16_##rb), \
    [TMPL_KV_F16][rb] = TMPL_FN(gemm_nt_keys_f16_##rb),
TMPL_UPTO(TMPL_REDUCE_N, TMPL_NT_KEYS, ~)
static const tmpl_nt_fn TMPL_FN(gemm_nt_keys_tab)[3][TMPL_REDUCE_N + 1] = {
    TMPL_UPTO(TMPL_REDUCE_N, TMPL_NT_KEYS_PTR, ~)};

/* gemm_nt's path for query rows longer than V_NT_QREGS vectors: blocks of V_NT_STEP
 * key rows, each read from memory once, whole and in order, by the first pass over
 * the block; the other passes (up to TMPL_REDUCE_N query rows each, from L1) find it
 * in L1. B of type kvt. */
TMPL_INLINE void tmpl_nt_long(const int kvt, int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                              const void *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    for (int n0 = 0; n0 < N; n0 += V_NT_STEP) {
        const int nb = N - n0 < V_NT_STEP ? N - n0 : V_NT_STEP;
        for (int m0 = 0; m0 < M; m0 += TMPL_REDUCE_N) {
            const int mr = M - m0 < TMPL_REDUCE_N ? M - m0 : TMPL_REDUCE_N;
            TMPL_FN(gemm_nt_keys_tab)[kvt][mr](nb, K, alpha, A + (ptrdiff_t)m0 * lda, lda,
                                               tmpl_kv_at(kvt, B, (ptrdiff_t)n0 * ldb), ldb,
                                               C + (ptrdiff_t)m0 * rs_c + (ptrdiff_t)n0 * cs_c, rs_c, cs_c);
        }
    }
}

/* The end of a group of kpi keys x rb query rows of the register-resident scores
 * (tmpl_nt_reg, and x86/attend_pairs_avx512.h's): each (key j, row i)'s two chains
 * added, one V_REDUCE4 of the four sums, C(i, n0 + j) = alpha * sum for the keys below N
 * and the rows below mr. */
TMPL_INLINE void tmpl_nt_reduce_store(const int rb, const int kpi, int mr, int N, int n0, float alpha,
                                      v_f32 acc[TMPL_REDUCE_N][2], float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    float s[TMPL_REDUCE_N];
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

/* Register-resident query rows, for head_dim up to V_NT_QREGS vectors (decode).
 * rb (1 or 2) query rows of nv vectors stay in registers, and keys are taken
 * TMPL_REDUCE_N/rb at a time, each key row read whole, front to back, before
 * the next: the hardware prefetchers follow that order (reading several key
 * rows side by side, as a register-blocked dot product would, loses memory
 * bandwidth: docs/perf-notes.md). Each (row, key) sums even and odd vectors in two chains, then
 * V_REDUCE4 of their sum: C(m,n) depends only on row m, row n, K and alpha,
 * the same for rb = 1 and 2. rb, nv compile-time; the last vector is partial
 * when K % VL != 0. */
TMPL_INLINE void tmpl_nt_reg(const int kvt, const int rb, const int nv, int mr, int N, int K, float alpha,
                             const float *A, ptrdiff_t lda, const void *B, ptrdiff_t ldb, float *C,
                             ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    const int kpi = TMPL_REDUCE_N / rb; /* keys per iteration: one V_REDUCE4 */
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
        v_f32 acc[TMPL_REDUCE_N][2];
        TMPL_UNROLL
        for (int j = 0; j < kpi; j++) {
            const ptrdiff_t b = (ptrdiff_t)(n0 + j < N ? n0 + j : N - 1) * ldb;
            TMPL_UNROLL
            for (int i = 0; i < rb; i++)
                acc[j * rb + i][0] = acc[j * rb + i][1] = V_ZERO();
            TMPL_UNROLL
            for (int v = 0; v < nv; v++) {
                const v_f32 bv = (v == nv - 1 && part) ? tmpl_kv_load_t(kvt, B, b + v * TMPL_VL, tailn, t)
                                                       : tmpl_kv_load(kvt, B, b + v * TMPL_VL);
                TMPL_UNROLL
                for (int i = 0; i < rb; i++)
                    acc[j * rb + i][v & 1] = V_FMA(q[i][v], bv, acc[j * rb + i][v & 1]);
            }
        }
        tmpl_nt_reduce_store(rb, kpi, mr, N, n0, alpha, acc, C, rs_c, cs_c);
    }
}

/* Four query rows against N key rows of nv vectors (nv at most V_NT_QREGS / 2, compile-
 * time): rows 0 and 1 in registers, rows 2 and 3 read from A (L1) by the FMAs, each key
 * row read whole, front to back, and widened once for the four (tmpl_nt_reg's pairs widen
 * it once per pair). The same sums as tmpl_nt_reg (two chains per (row, key), even and
 * odd vectors, then V_REDUCE4, C = alpha * sum): the same bits. */
TMPL_INLINE void tmpl_nt_quad(const int kvt, const int nv, int N, int K, float alpha, const float *A,
                              ptrdiff_t lda, const void *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    const int tailn = K - (nv - 1) * TMPL_VL;
    const v_tail t = V_TAIL_INIT(tailn);
    const int part = tailn < TMPL_VL;
    v_f32 q[2][V_NT_QREGS / 2];
    TMPL_UNROLL
    for (int i = 0; i < 2; i++)
        TMPL_UNROLL
        for (int v = 0; v < nv; v++)
            q[i][v] = (v == nv - 1 && part) ? V_LOAD_T(A + i * lda + v * TMPL_VL, t) : V_LOAD(A + i * lda + v * TMPL_VL);
    const float *a2 = A + 2 * lda, *a3 = A + 3 * lda;
    for (int n = 0; n < N; n++) {
        const ptrdiff_t b = (ptrdiff_t)n * ldb;
        v_f32 acc[4][2];
        TMPL_UNROLL
        for (int i = 0; i < 4; i++)
            acc[i][0] = acc[i][1] = V_ZERO();
        TMPL_UNROLL
        for (int v = 0; v < nv; v++) {
            const int pv = v == nv - 1 && part;
            const v_f32 bv = pv ? tmpl_kv_load_t(kvt, B, b + v * TMPL_VL, tailn, t) : tmpl_kv_load(kvt, B, b + v * TMPL_VL);
            acc[0][v & 1] = V_FMA(q[0][v], bv, acc[0][v & 1]);
            acc[1][v & 1] = V_FMA(q[1][v], bv, acc[1][v & 1]);
            acc[2][v & 1] = V_FMA(pv ? V_LOAD_T(a2 + v * TMPL_VL, t) : V_LOAD(a2 + v * TMPL_VL), bv, acc[2][v & 1]);
            acc[3][v & 1] = V_FMA(pv ? V_LOAD_T(a3 + v * TMPL_VL, t) : V_LOAD(a3 + v * TMPL_VL), bv, acc[3][v & 1]);
        }
        float s4[TMPL_REDUCE_N];
        V_REDUCE4(V_ADD(acc[0][0], acc[0][1]), V_ADD(acc[1][0], acc[1][1]), V_ADD(acc[2][0], acc[2][1]),
                  V_ADD(acc[3][0], acc[3][1]), s4);
        TMPL_UNROLL
        for (int i = 0; i < 4; i++)
            C[(ptrdiff_t)i * rs_c + (ptrdiff_t)n * cs_c] = alpha * s4[i];
    }
}

typedef void (*tmpl_nt_reg_fn)(int mr, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                               const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c);
/* gemm_nt_reg_<rows>_<vectors>_<isa>: one row up to V_NT_QREGS vectors, two rows
 * up to half of them. TMPL_NT_REG_LIST(X) is X(nv, rb) for each. */
#define TMPL_NT_REG_LIST(X) TMPL_UPTO(V_NT_QREGS, X, 1) TMPL_UPTO(TMPL_NT_PAIR_NV, X, 2)
#define TMPL_NT_REG(nv, rb)                                                                        \
    static void TMPL_FN(gemm_nt_reg_##rb##_##nv)(int mr, int N, int K, float alpha, const float *A, \
                                                 ptrdiff_t lda, const float *B, ptrdiff_t ldb,     \
                                                 float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)         \
    {                                                                                              \
        tmpl_nt_reg(TMPL_KV_F32, rb, nv, mr, N, K, alpha, A, lda, B, ldb, C, rs_c, cs_c);          \
    }
#define TMPL_NT_REG_PTR(nv, rb) [rb - 1][nv] = TMPL_FN(gemm_nt_reg_##rb##_##nv),
TMPL_NT_REG_LIST(TMPL_NT_REG)
/* [rows - 1][vectors] (unused entries NULL) */
static const tmpl_nt_reg_fn TMPL_FN(gemm_nt_reg_tab)[2][V_NT_QREGS + 1] = {TMPL_NT_REG_LIST(TMPL_NT_REG_PTR)};

/* gemm_nt_quad_<vectors>_<isa>: tmpl_nt_quad over an fp32 B, 2 .. TMPL_NT_PAIR_NV vectors */
typedef void (*tmpl_nt_quad_fn)(int N, int K, float alpha, const float *A, ptrdiff_t lda, const float *B,
                                ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c);
#define TMPL_NT_QUAD(nv, unused)                                                                   \
    static void TMPL_FN(gemm_nt_quad_##nv)(int N, int K, float alpha, const float *A, ptrdiff_t lda, \
                                          const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c) \
    {                                                                                              \
        tmpl_nt_quad(TMPL_KV_F32, nv, N, K, alpha, A, lda, B, ldb, C, rs_c, cs_c);                 \
    }
#define TMPL_NT_QUAD_PTR(nv, unused) [nv] = TMPL_FN(gemm_nt_quad_##nv),
TMPL_UPTO(TMPL_NT_PAIR_NV, TMPL_NT_QUAD, ~)
static const tmpl_nt_quad_fn TMPL_FN(gemm_nt_quad_tab)[TMPL_NT_PAIR_NV + 1] = {TMPL_UPTO(TMPL_NT_PAIR_NV, TMPL_NT_QUAD_PTR, ~)};

/* C(m,n) = alpha * sum_k A[m*lda + k] B[n*ldb + k], see sdpa_gemm_nt_fn. Blocks
 * of V_NT_STEP key rows: each row is read from memory once, whole and in order,
 * by the first pass over the block; the other passes (query rows: one or two
 * per pass in registers, up to TMPL_REDUCE_N from L1) find it in L1. quad
 * (compile-time, gemm_nt_rows4): where two rows fit the registers, rows four at a
 * time first (tmpl_nt_quad: one pass over each key row per four rows, the same bits). */
TMPL_INLINE void tmpl_gemm_nt(const int quad, int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
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
    if (nvk <= V_NT_QREGS) { /* query rows in registers: key blocks of V_NT_STEP, row pairs inside */
        const int two = 2 * nvk <= V_NT_QREGS;
        for (int n0 = 0; n0 < N; n0 += V_NT_STEP) {
            const int nb = N - n0 < V_NT_STEP ? N - n0 : V_NT_STEP;
            int m0 = 0;
            if (quad && two && nvk >= 2)
                for (; m0 + 4 <= M; m0 += 4)
                    TMPL_FN(gemm_nt_quad_tab)[nvk](nb, K, alpha, A + (ptrdiff_t)m0 * lda, lda, B + (ptrdiff_t)n0 * ldb,
                                                  ldb, C + (ptrdiff_t)m0 * rs_c + (ptrdiff_t)n0 * cs_c, rs_c, cs_c);
            for (; m0 < M; m0 += 1 + two) {
                const int mr = M - m0 < 1 + two ? M - m0 : 1 + two;
                TMPL_FN(gemm_nt_reg_tab)[mr - 1][nvk](mr, nb, K, alpha, A + (ptrdiff_t)m0 * lda, lda,
                                             B + (ptrdiff_t)n0 * ldb, ldb,
                                             C + (ptrdiff_t)m0 * rs_c + (ptrdiff_t)n0 * cs_c, rs_c, cs_c);
            }
        }
        return;
    }
    /* query rows from L1, up to TMPL_REDUCE_N per pass over a block of V_NT_STEP key rows */
    tmpl_nt_long(TMPL_KV_F32, M, N, K, alpha, A, lda, B, ldb, C, rs_c, cs_c);
}

static void TMPL_FN(gemm_nt)(int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                             const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    tmpl_gemm_nt(0, M, N, K, alpha, A, lda, B, ldb, C, rs_c, cs_c);
}

static void TMPL_FN(gemm_nt_rows4)(int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                                   const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    tmpl_gemm_nt(1, M, N, K, alpha, A, lda, B, ldb, C, rs_c, cs_c);
}

#endif /* SDPA_SIMD_DECODE_H */
