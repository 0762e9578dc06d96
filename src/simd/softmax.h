/* SPDX-License-Identifier: MIT */
/* simd/softmax.h - the element-wise kernels over the vector layer: the online softmax (both
 * layouts), the row rescale, and the backward's P = exp(S - LSE) and dS = P (dP - D).
 *
 * Part of src/simd_tmpl.h, included only from there (after a vector layer). */
#ifndef SDPA_SIMD_SOFTMAX_H
#define SDPA_SIMD_SOFTMAX_H

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
    /* the rows in chunks, each in three phases: the exps' arguments, the exps alone (see
     * TMPL_EXP_CHUNK), then P and its sum (the same operations per element as
     * tmpl_exp, and the sum in the same order: the same bits as one pass) */
    for (int k0 = 0; k0 < M; k0 += TMPL_EXP_CHUNK) {
        const int kn = M - k0 < TMPL_EXP_CHUNK ? M - k0 : TMPL_EXP_CHUNK;
        v_f32 y[TMPL_EXP_CHUNK];
        for (int q = 0; q < kn; q++)
            y[q] = tmpl_exp_arg(V_SUB(TMPL_LOAD(tail, S + (ptrdiff_t)(k0 + q) * lds, t), mu));
        for (int q = 0; q < kn; q++)
            y[q] = V_EXP2(y[q]);
        for (int q = 0; q < kn; q++) {
            float *s = S + (ptrdiff_t)(k0 + q) * lds;
            /* masked (-inf): the sentinel -0.0, so that the P.V product can tell it
             * from a probability that underflowed to +0 */
            const v_f32 p = V_SEL(V_EQ(TMPL_LOAD(tail, s, t), V_SET1(-INFINITY)), V_SET1(SDPA_MASKED_SENTINEL), y[q]);
            TMPL_STORE(tail, s, p, t);
            sum = V_ADD(sum, p);
        }
    }
    TMPL_STORE(tail, alpha, a, t);
    TMPL_STORE(tail, l, V_ADD(V_MUL(TMPL_LOAD(tail, l, t), a), sum), t);
    TMPL_STORE(tail, m, mx, t);
}

static void TMPL_FN(online_softmax)(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
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
 * and V_REDUCE4 (TMPL_REDUCE_N rows at a time, a fixed order), and those rows'
 * alpha come from one vector exp. */
/* vectors per row in a decode step of V_NT_STEP keys (at least one) */
#define TMPL_STEP_NV (V_NT_STEP > TMPL_VL ? V_NT_STEP / TMPL_VL : 1)
/* The phase-by-phase branch below holds 2 * TMPL_REDUCE_N * TMPL_STEP_NV vectors: 8 on
 * AVX-512, 16 on AVX2 (both timed, docs/perf-notes.md session 26); NEON's 32 would
 * take every register and spill, untimed on Arm hardware, so NEON keeps the row loop. */
#define TMPL_SOFTMAX_PHASED (TMPL_STEP_NV <= 2)

static void TMPL_FN(online_softmax_rows)(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                     float *alpha)
{
    for (int r0 = 0; r0 < M; r0 += TMPL_REDUCE_N) {
        const int rn = M - r0 < TMPL_REDUCE_N ? M - r0 : TMPL_REDUCE_N;
        v_f32 sums[TMPL_REDUCE_N];
        float mxs[TMPL_REDUCE_N], dm[TMPL_VL > TMPL_REDUCE_N ? TMPL_VL : TMPL_REDUCE_N] = {0}, tot[TMPL_REDUCE_N],
              al[TMPL_VL > TMPL_REDUCE_N ? TMPL_VL : TMPL_REDUCE_N];
        if (TMPL_SOFTMAX_PHASED && N == TMPL_STEP_NV * TMPL_VL && rn == TMPL_REDUCE_N) {
            /* a decode step (TMPL_STEP_NV vectors per row): the same operations per row
             * as the loop below, in the same order per row (so the same bits), phase by
             * phase across the rows, so that the rows' exps do not wait on one another's
             * maxima. NaN scores are skipped by the maximum, as fmaxf does; m[r] is one
             * of the candidates; m[r] = -inf gives dm = -inf and exp exactly 0. */
            v_f32 sv[TMPL_REDUCE_N][TMPL_STEP_NV], p[TMPL_REDUCE_N][TMPL_STEP_NV];
            float mu[TMPL_REDUCE_N];
            for (int q = 0; q < TMPL_REDUCE_N; q++) {
                const int r = r0 + q;
                v_f32 mxv = V_SET1(m[r]);
                for (int v = 0; v < TMPL_STEP_NV; v++) {
                    sv[q][v] = V_LOAD(S + (ptrdiff_t)r * lds + v * TMPL_VL);
                    mxv = V_MAX(sv[q][v], mxv);
                }
                mxs[q] = V_HMAX(mxv);
                mu[q] = (mxs[q] == -INFINITY) ? 0.0f : mxs[q];
                dm[q] = m[r] - mu[q];
            }
            for (int q = 0; q < TMPL_REDUCE_N; q++)
                for (int v = 0; v < TMPL_STEP_NV; v++)
                    p[q][v] = tmpl_exp(V_SUB(sv[q][v], V_SET1(mu[q])));
            for (int q = 0; q < TMPL_REDUCE_N; q++) {
                sums[q] = V_ZERO();
                for (int v = 0; v < TMPL_STEP_NV; v++) {
                    p[q][v] = V_SEL(V_EQ(sv[q][v], V_SET1(-INFINITY)), V_SET1(SDPA_MASKED_SENTINEL), p[q][v]);
                    V_STORE(S + (ptrdiff_t)(r0 + q) * lds + v * TMPL_VL, p[q][v]);
                    sums[q] = V_ADD(sums[q], p[q][v]);
                }
            }
        } else {
            for (int q = 0; q < TMPL_REDUCE_N; q++) {
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
                    const v_f32 p =
                        V_SEL(V_EQ(sv, V_SET1(-INFINITY)), V_SET1(SDPA_MASKED_SENTINEL), tmpl_exp(V_SUB(sv, muv)));
                    V_STORE(s + n, p);
                    sum = V_ADD(sum, p);
                }
                sums[q] = sum;
                mxs[q] = mx;
                dm[q] = m[r] - mu; /* m[r] = -inf: exp gives exactly 0 */
            }
        }
        V_REDUCE4(sums[0], sums[1], sums[2], sums[3], tot);
#if TMPL_VL >= TMPL_REDUCE_N
        /* no row's max moved (the common case after a decode's first steps): alpha = exp(0)
         * = 1 exactly, without the call */
        int moved = 0;
        for (int q = 0; q < TMPL_REDUCE_N; q++)
            moved |= dm[q] != 0.0f; /* a NaN counts as moved */
        if (!moved)
            V_STORE(al, V_SET1(1.0f));
        else
            V_STORE(al, tmpl_exp(V_LOAD(dm)));
#else
#error "the row softmax needs at least TMPL_REDUCE_N lanes"
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
static void TMPL_FN(scale_rows)(int M, int N, const float *src, ptrdiff_t lds, const float *alpha, float *dst,
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
        const v_f32 p = V_SEL(V_EQ(sv, V_SET1(-INFINITY)), V_SET1(SDPA_MASKED_SENTINEL), e);
        TMPL_STORE(tail, s, V_SEL(row_masked, V_SET1(SDPA_MASKED_SENTINEL), p), t);
    }
}

static void TMPL_FN(bwd_probs)(int M, int N, float *S, ptrdiff_t lds, const float *lse)
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
    return V_SEL(V_ISMASKED(p), V_SET1(SDPA_MASKED_SENTINEL), V_ADD(V_MUL(p, V_SUB(dp, d)), V_ZERO()));
}

static void TMPL_FN(bwd_dscores)(int M, int N, const float *P, ptrdiff_t ldp, float *dP,
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

#endif /* SDPA_SIMD_SOFTMAX_H */
