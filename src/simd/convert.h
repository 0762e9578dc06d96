/* SPDX-License-Identifier: MIT */
/* simd/convert.h - the 16-bit storage conversions over the vector layer: rows of bf16 or
 * fp16 (uint16 bit patterns) to fp32 and back (widen_bf16, widen_f16, narrow_bf16,
 * narrow_f16 of src/kernels.h).
 *
 * Part of src/simd_tmpl.h, included only from there (after a vector layer). The layer
 * converts one whole vector with V_WIDEN_BF16 / V_WIDEN_F16 (V_LANES uint16 at p to a
 * v_f32) and V_NARROW_BF16 / V_NARROW_F16 (a v_f32 to V_LANES uint16 at p), each giving
 * the bits of src/dtype.h for every input (exact widening; round to nearest even, fp16
 * overflow to +-inf, NaN quiet with its sign and top payload bits); a layer with masked
 * 16-bit loads and stores also defines the _T forms, which take a v_tail of V_TAIL_INIT.
 * Every row goes front to back in whole vectors, then one tail of 1..VL - 1 elements:
 * through the _T forms where the layer has them, else through a zero-padded buffer of
 * one vector on the stack (the fp32 side through V_LOAD_T / V_STORE_T). Nothing past
 * `cols` in a row is read or written, and the tail's values come from the same vector
 * conversion as the rest of the row. */
#ifndef SDPA_SIMD_CONVERT_H
#define SDPA_SIMD_CONVERT_H

enum { TMPL_CVT_BF16, TMPL_CVT_F16 };

TMPL_INLINE v_f32 tmpl_widen_vec(const int kind, const uint16_t *p)
{
    return kind == TMPL_CVT_F16 ? V_WIDEN_F16(p) : V_WIDEN_BF16(p);
}

TMPL_INLINE void tmpl_narrow_vec(const int kind, uint16_t *p, v_f32 v)
{
    if (kind == TMPL_CVT_F16)
        V_NARROW_F16(p, v);
    else
        V_NARROW_BF16(p, v);
}

TMPL_INLINE void tmpl_widen_rows(const int kind, int rows, int cols, const uint16_t *src, ptrdiff_t lds, float *dst,
                                 ptrdiff_t ldd)
{
    const int nfull = cols - cols % TMPL_VL;
    const v_tail tl = V_TAIL_INIT(cols > nfull ? cols - nfull : TMPL_VL);
    for (int r = 0; r < rows; r++) {
        const uint16_t *s = src + (ptrdiff_t)r * lds;
        float *d = dst + (ptrdiff_t)r * ldd;
        int c = 0;
        for (; c < nfull; c += TMPL_VL)
            V_STORE(d + c, tmpl_widen_vec(kind, s + c));
        if (c < cols) {
#ifdef V_WIDEN_BF16_T
            V_STORE_T(d + c, kind == TMPL_CVT_F16 ? V_WIDEN_F16_T(s + c, tl) : V_WIDEN_BF16_T(s + c, tl), tl);
#else
            uint16_t h[TMPL_VL] = {0};
            memcpy(h, s + c, (size_t)(cols - c) * sizeof h[0]);
            V_STORE_T(d + c, tmpl_widen_vec(kind, h), tl);
#endif
        }
    }
}

TMPL_INLINE void tmpl_narrow_rows(const int kind, int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst,
                                  ptrdiff_t ldd)
{
    const int nfull = cols - cols % TMPL_VL;
    const v_tail tl = V_TAIL_INIT(cols > nfull ? cols - nfull : TMPL_VL);
    for (int r = 0; r < rows; r++) {
        const float *s = src + (ptrdiff_t)r * lds;
        uint16_t *d = dst + (ptrdiff_t)r * ldd;
        int c = 0;
        for (; c < nfull; c += TMPL_VL)
            tmpl_narrow_vec(kind, d + c, V_LOAD(s + c));
        if (c < cols) {
            const v_f32 v = V_LOAD_T(s + c, tl);
#ifdef V_NARROW_BF16_T
            if (kind == TMPL_CVT_F16)
                V_NARROW_F16_T(d + c, v, tl);
            else
                V_NARROW_BF16_T(d + c, v, tl);
#else
            uint16_t h[TMPL_VL];
            tmpl_narrow_vec(kind, h, v);
            memcpy(d + c, h, (size_t)(cols - c) * sizeof h[0]);
#endif
        }
    }
}

static void TMPL_FN(widen_bf16)(int rows, int cols, const uint16_t *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    tmpl_widen_rows(TMPL_CVT_BF16, rows, cols, src, lds, dst, ldd);
}

static void TMPL_FN(widen_f16)(int rows, int cols, const uint16_t *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    tmpl_widen_rows(TMPL_CVT_F16, rows, cols, src, lds, dst, ldd);
}

static void TMPL_FN(narrow_bf16)(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst, ptrdiff_t ldd)
{
    tmpl_narrow_rows(TMPL_CVT_BF16, rows, cols, src, lds, dst, ldd);
}

static void TMPL_FN(narrow_f16)(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst, ptrdiff_t ldd)
{
    tmpl_narrow_rows(TMPL_CVT_F16, rows, cols, src, lds, dst, ldd);
}

#endif /* SDPA_SIMD_CONVERT_H */
