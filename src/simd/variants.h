/* SPDX-License-Identifier: MIT */
/* simd/variants.h - the element-wise kernels of the attention variants over the vector layer:
 * the logit soft-cap (with its derivative), ALiBi on both tile layouts, and the soft-cap's
 * backward factor.
 *
 * Part of src/simd_tmpl.h, included only from there (after a vector layer). Every kernel
 * walks its M x N elements row by row, whole vectors and then one tail through the
 * layer's tail loads/stores (nothing outside M x N is read or written).
 *
 * Numerics (the contract is src/kernels.h; the scalar kernels are the reference):
 *   softcap      u = S / cap (a division, the scalar kernel's rounding), t = V_TANH(u)
 *                (SLEEF's u10 vector tanhf: 1 ulp; libm's tanhf in the scalar kernel, so
 *                the last bit may differ from scalar), S = cap * t (one more rounding),
 *                G = fma(-t, t, 1) (1 - t^2 with one rounding; the scalar kernel rounds
 *                t*t first). +-inf gives +-cap and G = 0, NaN stays NaN.
 *   alibi_*      S - slope * |i - pos| with the scalar kernel's three roundings in its
 *                order (the sub, the product, the sub; nothing fused: the build is ISO C
 *                without fp contraction), so the same bits as scalar on every ISA.
 *   bwd_softcap  dS * G + 0 (two roundings, as scalar: the same bits), the masked sentinel
 *                -0.0 kept bitwise whatever G holds there. */
#ifndef SDPA_SIMD_VARIANTS_H
#define SDPA_SIMD_VARIANTS_H

/* ------------------------------------------------------------- soft-cap */

/* One vector of S (and G): u = s / cap, t = tanh(u), s = cap t, g = 1 - t^2. */
TMPL_INLINE void tmpl_softcap_vec(const int tail, const int with_g, v_tail tl, float *s, float *g, v_f32 capv)
{
    const v_f32 t = V_TANH(V_DIV(TMPL_LOAD(tail, s, tl), capv));
    TMPL_STORE(tail, s, V_MUL(capv, t), tl);
    if (with_g)
        TMPL_STORE(tail, g, V_FMA(V_SUB(V_ZERO(), t), t, V_SET1(1.0f)), tl);
}

TMPL_INLINE void tmpl_softcap_tile(const int with_g, int M, int N, float *S, ptrdiff_t lds, float cap, float *G,
                                   ptrdiff_t ldg)
{
    const int nfull = N - N % TMPL_VL;
    const v_tail tl = V_TAIL_INIT(N > nfull ? N - nfull : TMPL_VL);
    const v_f32 capv = V_SET1(cap);
    for (int m = 0; m < M; m++) {
        float *s = S + (ptrdiff_t)m * lds;
        float *g = with_g ? G + (ptrdiff_t)m * ldg : NULL;
        int n = 0;
        for (; n < nfull; n += TMPL_VL)
            tmpl_softcap_vec(0, with_g, tl, s + n, with_g ? g + n : NULL, capv);
        if (n < N)
            tmpl_softcap_vec(1, with_g, tl, s + n, with_g ? g + n : NULL, capv);
    }
}

static void TMPL_FN(softcap)(int M, int N, float *S, ptrdiff_t lds, float cap, float *G, ptrdiff_t ldg)
{
    if (G)
        tmpl_softcap_tile(1, M, N, S, lds, cap, G, ldg);
    else
        tmpl_softcap_tile(0, M, N, S, lds, cap, NULL, 0);
}

/* ---------------------------------------------------------------- ALiBi */

/* s - slope * |i - pos| in the scalar kernel's order of roundings. */
TMPL_INLINE v_f32 tmpl_alibi(v_f32 s, v_f32 i, v_f32 pos, v_f32 slope)
{
    return V_SUB(s, V_MUL(slope, V_ABS(V_SUB(i, pos))));
}

/* Transposed tile, one block of VL columns (queries): pos and slope stay in
 * registers while the rows (keys) go by. */
TMPL_INLINE void tmpl_alibi_cols_block(const int tail, v_tail tl, int M, float *S, ptrdiff_t lds, const float *pos,
                                       const float *slope)
{
    const v_f32 pv = TMPL_LOAD(tail, pos, tl), sv = TMPL_LOAD(tail, slope, tl);
    for (int m = 0; m < M; m++) {
        float *s = S + (ptrdiff_t)m * lds;
        TMPL_STORE(tail, s, tmpl_alibi(TMPL_LOAD(tail, s, tl), V_SET1((float)m), pv, sv), tl);
    }
}

static void TMPL_FN(alibi_cols)(int M, int N, float *S, ptrdiff_t lds, const float *pos, const float *slope)
{
    int n0 = 0;
    for (; n0 + TMPL_VL <= N; n0 += TMPL_VL)
        tmpl_alibi_cols_block(0, V_TAIL_INIT(TMPL_VL), M, S + n0, lds, pos + n0, slope + n0);
    if (n0 < N)
        tmpl_alibi_cols_block(1, V_TAIL_INIT(N - n0), M, S + n0, lds, pos + n0, slope + n0);
}

/* The lane indices 0 .. VL-1 as floats (the key index of each lane of a natural tile). */
static const float tmpl_lane_index[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#if TMPL_VL > 16
#error "tmpl_lane_index has 16 lanes"
#endif

/* Natural tile: per row (query) one pos and one slope; the key index of a lane
 * is n + lane, exact as a float (n < 2^24). */
static void TMPL_FN(alibi_rows)(int M, int N, float *S, ptrdiff_t lds, const float *pos, const float *slope)
{
    const int nfull = N - N % TMPL_VL;
    const v_tail tl = V_TAIL_INIT(N > nfull ? N - nfull : TMPL_VL);
    const v_f32 lane = V_LOAD(tmpl_lane_index);
    for (int m = 0; m < M; m++) {
        float *s = S + (ptrdiff_t)m * lds;
        const v_f32 pv = V_BCAST(pos + m), sv = V_BCAST(slope + m);
        int n = 0;
        for (; n < nfull; n += TMPL_VL)
            V_STORE(s + n, tmpl_alibi(V_LOAD(s + n), V_ADD(lane, V_SET1((float)n)), pv, sv));
        if (n < N)
            V_STORE_T(s + n, tmpl_alibi(V_LOAD_T(s + n, tl), V_ADD(lane, V_SET1((float)n)), pv, sv), tl);
    }
}

/* ------------------------------------------------ backward of the soft-cap */

/* dS G + 0 (an arithmetic -0 becomes +0), or the masked sentinel as it is
 * (whatever G holds there: NaN from a masked entry must not leak). */
TMPL_INLINE v_f32 tmpl_bwd_softcap_vec(v_f32 d, v_f32 g)
{
    return V_SEL(V_ISMASKED(d), V_SET1(SDPA_MASKED_SENTINEL), V_ADD(V_MUL(d, g), V_ZERO()));
}

static void TMPL_FN(bwd_softcap)(int M, int N, float *dS, ptrdiff_t ldd, const float *G, ptrdiff_t ldg)
{
    const int nfull = N - N % TMPL_VL;
    const v_tail tl = V_TAIL_INIT(N > nfull ? N - nfull : TMPL_VL);
    for (int m = 0; m < M; m++) {
        float *d = dS + (ptrdiff_t)m * ldd;
        const float *g = G + (ptrdiff_t)m * ldg;
        int n = 0;
        for (; n < nfull; n += TMPL_VL)
            V_STORE(d + n, tmpl_bwd_softcap_vec(V_LOAD(d + n), V_LOAD(g + n)));
        if (n < N)
            V_STORE_T(d + n, tmpl_bwd_softcap_vec(V_LOAD_T(d + n, tl), V_LOAD_T(g + n, tl)), tl);
    }
}

#endif /* SDPA_SIMD_VARIANTS_H */
