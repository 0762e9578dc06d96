/* SPDX-License-Identifier: MIT */
/* simd/stream.h - the few-column (decode) kernels over the vector layer, second half:
 * gemm_stream (O = alpha O + P V with B rows read whole, per B type), its one-, two- and
 * four-row register kernels and the hybrid one for long rows.
 *
 * Part of src/simd_tmpl.h, included only from there (after simd/decode.h, whose B-row
 * loads it uses). */
#ifndef SDPA_SIMD_STREAM_H
#define SDPA_SIMD_STREAM_H

/* ----------------------------------------------------------- gemm_stream */

/* Row i of C = row_scale[i] * C + acc[i] (row_scale NULL: 1), nv vectors, the last one
 * partial (tail t) when part: the epilogue of the two- and four-row kernels, with C,
 * ldc, row_scale, acc, nv, part and t of the function it stands in. A macro, not an
 * inline function: the accumulators stay in registers without their array's address
 * being taken (clang's ASan build of an inline helper taking acc by pointer was ten
 * times slower to compile). */
#define TMPL_STREAM_ROW_OUT(i)                                                                     \
    do {                                                                                           \
        float *c_ = C + (ptrdiff_t)(i) * ldc;                                                      \
        const v_f32 sc_ = V_SET1(row_scale ? row_scale[i] : 1.0f);                                 \
        TMPL_UNROLL                                                                                \
        for (int v_ = 0; v_ < nv; v_++) {                                                          \
            if (v_ == nv - 1 && part)                                                              \
                V_STORE_T(c_ + v_ * TMPL_VL, V_FMA(sc_, V_LOAD_T(c_ + v_ * TMPL_VL, t), acc[i][v_]), t); \
            else                                                                                   \
                V_STORE(c_ + v_ * TMPL_VL, V_FMA(sc_, V_LOAD(c_ + v_ * TMPL_VL), acc[i][v_]));     \
        }                                                                                          \
    } while (0)

#ifdef V_WIDEN_BF16_EO
/* A bf16 row of B read two vectors at a time (eo: whole rows of an even number of
 * vectors): at even v, the even elements of vectors v, v + 1 to *bv and the odd ones
 * to *odd (one load, a shift and an and, against two loads and two widenings); at odd
 * v, *odd. Each element meets the same A values in the same order, only in another
 * lane: V_INTERLEAVE puts the accumulators back before the store. Only a layer that
 * defines V_WIDEN_BF16_EO has it; elsewhere eo is never set (tmpl_stream_reg). */
TMPL_INLINE void tmpl_stream_eo_load(const void *B, ptrdiff_t off, int v, v_f32 *bv, v_f32 *odd)
{
    if (v % 2 == 0)
        V_WIDEN_BF16_EO((const uint16_t *)B + off, *bv, *odd);
    else
        *bv = *odd;
}
#endif

/* Vector v of the row of B at element b: even / odd (eo), else as it is, the last one
 * masked when the row's last vector is partial. */
TMPL_INLINE v_f32 tmpl_stream_b(const int kvt, const int eo, const int nv, int part, const void *B, ptrdiff_t b,
                                int v, int tailn, v_tail t, v_f32 *odd)
{
    v_f32 bv;
#ifdef V_WIDEN_BF16_EO
    if (eo) {
        tmpl_stream_eo_load(B, b + v * TMPL_VL, v, &bv, odd);
        return bv;
    }
#else
    (void)eo, (void)odd;
#endif
    bv = (v == nv - 1 && part) ? tmpl_kv_load_t(kvt, B, b + v * TMPL_VL, tailn, t)
                               : tmpl_kv_load(kvt, B, b + v * TMPL_VL);
    return bv;
}

/* rb (1 or 2) rows of accumulators, nv vectors each, in registers for the
 * whole call; per key, the row of B is read whole before the next. A term whose A(i,k)
 * is the sentinel leaves the accumulator alone (skip_masked); a key whose
 * terms are all skipped is not read. The last vector is partial when
 * N % VL != 0. eo (bf16 B, whole rows of an even number of vectors, only where the
 * layer defines V_WIDEN_BF16_EO): B read even / odd (tmpl_stream_eo_load) and the
 * accumulators interleaved back before the store. eo, rb, nv compile-time. */
TMPL_INLINE void tmpl_stream_reg_body(const int kvt, const int eo, const int rb, const int nv,
                                      const int skip_masked, int mr, int N, int K, const float *A, ptrdiff_t lda,
                                      const void *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, const float *row_scale)
{
    const int tailn = N - (nv - 1) * TMPL_VL;
    const v_tail t = V_TAIL_INIT(tailn);
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
        const ptrdiff_t b = (ptrdiff_t)k * ldb;
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
            v_f32 odd = V_ZERO();
            TMPL_UNROLL
            for (int v = 0; v < nv; v++) {
                v_f32 bv = tmpl_stream_b(kvt, eo, nv, part, B, b, v, tailn, t, &odd);
#ifdef V_PIN /* one load per V vector for the rb rows (not in gemm_nt's K loop: from memory, 0.94-0.98x there) */
                if (rb > 1)
                    V_PIN(bv);
#endif
                TMPL_UNROLL
                for (int i = 0; i < rb; i++)
                    acc[i][v] = V_FMA(p[i], bv, acc[i][v]);
            }
        } else if (live) {
            v_f32 odd = V_ZERO();
            TMPL_UNROLL
            for (int v = 0; v < nv; v++) {
                const v_f32 bv = tmpl_stream_b(kvt, eo, nv, part, B, b, v, tailn, t, &odd);
                TMPL_UNROLL
                for (int i = 0; i < rb; i++)
                    if (live >> i & 1u)
                        acc[i][v] = V_FMA(p[i], bv, acc[i][v]);
            }
        }
    }
    /* C = row_scale * C + acc: the step's products are summed on their own
     * first (as the gemm does), then added with one rounding */
#ifdef V_WIDEN_BF16_EO
    if (eo) {
        TMPL_UNROLL
        for (int i = 0; i < rb; i++) {
            TMPL_UNROLL
            for (int v = 0; v < nv; v += 2)
                V_INTERLEAVE(acc[i][v], acc[i][v + 1]);
        }
    }
#endif
    TMPL_UNROLL
    for (int i = 0; i < rb; i++)
        if (i < mr)
            TMPL_STREAM_ROW_OUT(i);
}

/* C = row_scale C + A B for four rows of A (P) and C (O), over N columns in nv vectors
 * (at most V_NT_QREGS / 4: tmpl_attend's halves of a row that fits two rows in the
 * registers), B of type kvt: per key, its nv vectors of B widened once for the four rows.
 * Each (m, n) sums its terms from zero in increasing k, then one FMA with the scaled C,
 * as tmpl_stream_reg does: the same bits. nv compile-time; the last vector is partial
 * when N % VL != 0. */
TMPL_INLINE void tmpl_stream_quad(const int kvt, const int nv, int N, int K, const float *A, ptrdiff_t lda,
                                  const void *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, const float *row_scale)
{
    const int tailn = N - (nv - 1) * TMPL_VL;
    const v_tail t = V_TAIL_INIT(tailn);
    const int part = tailn < TMPL_VL;
    v_f32 acc[4][V_NT_QREGS / 4];
    TMPL_UNROLL
    for (int i = 0; i < 4; i++)
        TMPL_UNROLL
        for (int v = 0; v < nv; v++)
            acc[i][v] = V_ZERO();
    for (int k = 0; k < K; k++) {
        const ptrdiff_t b = (ptrdiff_t)k * ldb;
        v_f32 p[4];
        TMPL_UNROLL
        for (int i = 0; i < 4; i++)
            p[i] = V_SET1(A[(ptrdiff_t)i * lda + k]);
        TMPL_UNROLL
        for (int v = 0; v < nv; v++) {
            v_f32 bv = (v == nv - 1 && part) ? tmpl_kv_load_t(kvt, B, b + v * TMPL_VL, tailn, t)
                                             : tmpl_kv_load(kvt, B, b + v * TMPL_VL);
            TMPL_UNROLL
            for (int i = 0; i < 4; i++)
                acc[i][v] = V_FMA(p[i], bv, acc[i][v]);
        }
    }
    TMPL_UNROLL
    for (int i = 0; i < 4; i++)
        TMPL_STREAM_ROW_OUT(i);
}

TMPL_INLINE void tmpl_stream_reg(const int kvt, const int rb, const int nv, const int skip_masked, int mr, int N,
                                 int K, const float *A, ptrdiff_t lda, const void *B, ptrdiff_t ldb, float *C,
                                 ptrdiff_t ldc, const float *row_scale)
{
#ifdef V_WIDEN_BF16_EO /* where two rows share each widening (one row: no faster, measured) */
    if (kvt == TMPL_KV_BF16 && rb == 2 && nv % 2 == 0 && N == nv * TMPL_VL) {
        tmpl_stream_reg_body(kvt, 1, rb, nv, skip_masked, mr, N, K, A, lda, B, ldb, C, ldc, row_scale);
        return;
    }
#endif
    tmpl_stream_reg_body(kvt, 0, rb, nv, skip_masked, mr, N, K, A, lda, B, ldb, C, ldc, row_scale);
}

typedef void (*tmpl_stream_fn)(int mr, int N, int K, const float *A, ptrdiff_t lda, const void *B,
                               ptrdiff_t ldb, float *C, ptrdiff_t ldc, const float *row_scale);
/* Vectors per row when two rows go together: half the query registers, or the
 * pair path's column chunk where the layer has one and it is wider. */
#if defined(V_STREAM_PAIR_NV) && V_STREAM_PAIR_NV > V_NT_QREGS / 2
#define TMPL_STREAM_PAIR_NV V_STREAM_PAIR_NV
#else
#define TMPL_STREAM_PAIR_NV TMPL_NT_PAIR_NV
#endif
/* gemm_stream_<type>_<rows>_<vectors>_<skip_masked>_<isa>: one row up to
 * V_STREAM_HREGS vectors, two rows up to TMPL_STREAM_PAIR_NV, per B type (fp32; bf16 and
 * fp16 without skip_masked, for attend_rows_bf16 / _f16). TMPL_STREAM_LIST(X) is X(nv, rb). */
#define TMPL_STREAM_LIST(X) TMPL_UPTO(V_STREAM_HREGS, X, 1) TMPL_UPTO(TMPL_STREAM_PAIR_NV, X, 2)
#define TMPL_STREAM1(ty, kvt, rb, nv, sk)                                                          \
    static void TMPL_FN(gemm_stream_##ty##_##rb##_##nv##_##sk)(int mr, int N, int K, const float *A, \
                                                               ptrdiff_t lda, const void *B, ptrdiff_t ldb, \
                                                               float *C, ptrdiff_t ldc, const float *row_scale) \
    {                                                                                              \
        tmpl_stream_reg(kvt, rb, nv, sk, mr, N, K, A, lda, B, ldb, C, ldc, row_scale);             \
    }
#define TMPL_STREAM(nv, rb)                                                                        \
    TMPL_STREAM1(f32, TMPL_KV_F32, rb, nv, 0) TMPL_STREAM1(f32, TMPL_KV_F32, rb, nv, 1)            \
    TMPL_STREAM1(bf16, TMPL_KV_BF16, rb, nv, 0) TMPL_STREAM1(f16, TMPL_KV_F16, rb, nv, 0)
#define TMPL_STREAM_PTR(nv, rb)                                                                    \
    [TMPL_KV_F32][0][rb - 1][nv] = TMPL_FN(gemm_stream_f32_##rb##_##nv##_0),                       \
    [TMPL_KV_F32][1][rb - 1][nv] = TMPL_FN(gemm_stream_f32_##rb##_##nv##_1),                       \
    [TMPL_KV_BF16][0][rb - 1][nv] = TMPL_FN(gemm_stream_bf16_##rb##_##nv##_0),                     \
    [TMPL_KV_F16][0][rb - 1][nv] = TMPL_FN(gemm_stream_f16_##rb##_##nv##_0),
TMPL_STREAM_LIST(TMPL_STREAM)
/* [B type][skip_masked][rows - 1][vectors] (unused entries NULL) */
static const tmpl_stream_fn TMPL_FN(gemm_stream_tab)[3][2][2][V_STREAM_HREGS + 1] = {
    TMPL_STREAM_LIST(TMPL_STREAM_PTR)};

/* One row of C longer than V_STREAM_HREGS vectors: the first V_STREAM_HREGS
 * vectors of accumulators in registers, the other columns (at most
 * TMPL_STREAM_NMAX) in an L1 buffer; each row of B still read whole, in order,
 * and the same sums as tmpl_stream_reg. */
#define TMPL_STREAM_NMAX 512
TMPL_INLINE void tmpl_stream_hyb(const int kvt, const int skip_masked, int N, int K, const float *A, const void *B,
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
        const ptrdiff_t b = (ptrdiff_t)k * ldb;
        TMPL_UNROLL
        for (int v = 0; v < NR; v++)
            acc[v] = V_FMA(p, tmpl_kv_load(kvt, B, b + v * TMPL_VL), acc[v]);
        int n = 0;
        for (; n < nlf; n += TMPL_VL)
            V_STORE(accl + n, V_FMA(p, tmpl_kv_load(kvt, B, b + n1 + n), V_LOAD(accl + n)));
        if (n < nl)
            V_STORE_T(accl + n, V_FMA(p, tmpl_kv_load_t(kvt, B, b + n1 + n, nl - n, t), V_LOAD_T(accl + n, t)), t);
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

typedef void (*tmpl_stream_hyb_fn)(int N, int K, const float *A, const void *B, ptrdiff_t ldb, float *C,
                                   const float *row_scale);
#define TMPL_STREAM_HYB(ty, kvt, sk)                                                               \
    static void TMPL_FN(gemm_stream_hyb_##ty##_##sk)(int N, int K, const float *A, const void *B, ptrdiff_t ldb, \
                                                     float *C, const float *row_scale)             \
    {                                                                                              \
        tmpl_stream_hyb(kvt, sk, N, K, A, B, ldb, C, row_scale);                                   \
    }
TMPL_STREAM_HYB(f32, TMPL_KV_F32, 0)
TMPL_STREAM_HYB(f32, TMPL_KV_F32, 1)
TMPL_STREAM_HYB(bf16, TMPL_KV_BF16, 0)
TMPL_STREAM_HYB(f16, TMPL_KV_F16, 0)
/* [B type][skip_masked] (unused entries NULL) */
static const tmpl_stream_hyb_fn TMPL_FN(gemm_stream_hyb_tab)[3][2] = {
    [TMPL_KV_F32] = {TMPL_FN(gemm_stream_hyb_f32_0), TMPL_FN(gemm_stream_hyb_f32_1)},
    [TMPL_KV_BF16] = {TMPL_FN(gemm_stream_hyb_bf16_0), NULL},
    [TMPL_KV_F16] = {TMPL_FN(gemm_stream_hyb_f16_0), NULL}};

/* Rows of C one (or two) at a time: a row of accumulators in registers when N fits
 * V_STREAM_HREGS vectors (two rows per pass when two fit V_NT_QREGS), else
 * V_STREAM_HREGS vectors in registers and the rest in an L1 buffer (column chunks for
 * very long rows). B of type kvt (skip_masked only with fp32). */
TMPL_INLINE void tmpl_stream_rows(const int kvt, int M, int N, int K, const float *A, ptrdiff_t lda, const void *B,
                                  ptrdiff_t ldb, float *C, ptrdiff_t ldc, int skip_masked, const float *row_scale)
{
    const int nv = (N + TMPL_VL - 1) / TMPL_VL;
    if (nv <= V_STREAM_HREGS) { /* rows of accumulators in registers, two at a time if they fit */
        const int step = 2 * nv <= V_NT_QREGS ? 2 : 1;
        for (int m0 = 0; m0 < M; m0 += step) {
            const int mr = M - m0 < step ? M - m0 : step;
            TMPL_FN(gemm_stream_tab)[kvt][skip_masked != 0][mr - 1][nv](mr, N, K, A + (ptrdiff_t)m0 * lda, lda, B,
                                                                       ldb, C + (ptrdiff_t)m0 * ldc, ldc,
                                                                       row_scale ? row_scale + m0 : NULL);
        }
        return;
    }
    /* longer rows: per row, V_STREAM_HREGS vectors in registers and up to
     * TMPL_STREAM_NMAX more columns in L1, in column chunks of that width */
    const int chunk = V_STREAM_HREGS * TMPL_VL + TMPL_STREAM_NMAX;
    for (int n0 = 0; n0 < N; n0 += chunk) {
        const int nc = N - n0 < chunk ? N - n0 : chunk;
        const void *bn = tmpl_kv_at(kvt, B, n0);
        for (int m = 0; m < M; m++) {
            const float *am = A + (ptrdiff_t)m * lda;
            float *cm = C + (ptrdiff_t)m * ldc + n0;
            const float *sm = row_scale ? row_scale + m : NULL;
            if (nc > V_STREAM_HREGS * TMPL_VL)
                TMPL_FN(gemm_stream_hyb_tab)[kvt][skip_masked != 0](nc, K, am, bn, ldb, cm, sm);
            else /* the last chunk is short enough for registers alone */
                TMPL_FN(gemm_stream_tab)[kvt][skip_masked != 0][0][(nc + TMPL_VL - 1) / TMPL_VL](1, nc, K, am, lda,
                                                                                                 bn, ldb, cm, ldc, sm);
        }
    }
}

/* See sdpa_gemm_stream_fn, with B of type kvt (skip_masked only with fp32). */
TMPL_INLINE void tmpl_gemm_stream(const int kvt, int M, int N, int K, const float *A, ptrdiff_t lda, const void *B,
                                  ptrdiff_t ldb, float *C, ptrdiff_t ldc, int skip_masked, const float *row_scale)
{
    if (M <= 0 || N <= 0)
        return;
    if (K < 0)
        K = 0;
#ifdef V_STREAM_PAIR_NV
    const int nv = (N + TMPL_VL - 1) / TMPL_VL;
    if (M >= 2 && 2 * nv > V_NT_QREGS) {
        /* Rows too long for two in registers (AVX2 at head_dim > 32): the first
         * row alone, reading each row of B whole and in address order (the
         * order the prefetchers follow when B comes from memory; starting with
         * the column chunks is slower), then the other rows in pairs,
         * columns in chunks of V_STREAM_PAIR_NV vectors from L1, so that each B
         * vector loaded serves two rows and no accumulator goes through L1 (the
         * one-row kernels load each B vector once per row, and past
         * V_STREAM_HREGS vectors add a load and a store of an L1 accumulator).
         * Each (m, n) still sums its terms from zero in increasing k and then
         * adds the scaled C: the same bits as the one-row kernels (the
         * measured gain is in docs/perf-notes.md). */
        const int cw = V_STREAM_PAIR_NV * TMPL_VL;
        tmpl_stream_rows(kvt, 1, N, K, A, lda, B, ldb, C, ldc, skip_masked, row_scale); /* B rows read whole, in order */
        M -= 1, A += lda, C += ldc, row_scale = row_scale ? row_scale + 1 : NULL;
        for (; M >= 2; M -= 2, A += 2 * lda, C += 2 * ldc, row_scale = row_scale ? row_scale + 2 : NULL)
            for (int n0 = 0; n0 < N; n0 += cw) {
                const int nc = N - n0 < cw ? N - n0 : cw;
                TMPL_FN(gemm_stream_tab)[kvt][skip_masked != 0][1][(nc + TMPL_VL - 1) / TMPL_VL](
                    2, nc, K, A, lda, tmpl_kv_at(kvt, B, n0), ldb, C + n0, ldc, row_scale);
            }
        /* a last row alone: the same column chunks, its accumulators in registers (B's rows
           are in the caches by now; the one-row kernel would keep part of a long row in an
           L1 buffer, a load and a store per vector and key) */
        if (M == 1)
            for (int n0 = 0; n0 < N; n0 += V_STREAM_HREGS * TMPL_VL) {
                const int nc = N - n0 < V_STREAM_HREGS * TMPL_VL ? N - n0 : V_STREAM_HREGS * TMPL_VL;
                TMPL_FN(gemm_stream_tab)[kvt][skip_masked != 0][0][(nc + TMPL_VL - 1) / TMPL_VL](
                    1, nc, K, A, lda, tmpl_kv_at(kvt, B, n0), ldb, C + n0, ldc, row_scale);
            }
        return;
    }
#endif
    tmpl_stream_rows(kvt, M, N, K, A, lda, B, ldb, C, ldc, skip_masked, row_scale);
}

static void TMPL_FN(gemm_stream)(int M, int N, int K, const float *A, ptrdiff_t lda, const float *B,
                                 ptrdiff_t ldb, float *C, ptrdiff_t ldc, int skip_masked,
                                 const float *row_scale)
{
    tmpl_gemm_stream(TMPL_KV_F32, M, N, K, A, lda, B, ldb, C, ldc, skip_masked, row_scale);
}

#endif /* SDPA_SIMD_STREAM_H */
