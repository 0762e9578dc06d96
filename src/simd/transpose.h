/* SPDX-License-Identifier: MIT */
/* simd/transpose.h - the transpose kernel over the vector layer's square blocks.
 *
 * Part of src/simd_tmpl.h, included only from there (after a vector layer). */
#ifndef SDPA_SIMD_TRANSPOSE_H
#define SDPA_SIMD_TRANSPOSE_H

static void TMPL_FN(transpose_blocks)(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
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

/* dst[c][r] = src[r][c]: V_TRANSPOSE16 blocks where the layer has them, then
 * V_TRANSPOSE_BLOCK blocks, then element by element. */
static void TMPL_FN(transpose)(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                               ptrdiff_t ldd)
{
#ifdef V_TRANSPOSE16
    enum { T16 = 16 }; /* the side of V_TRANSPOSE16's block */
    const int r16 = rows - rows % T16, c16 = cols - cols % T16;
    for (int r0 = 0; r0 < r16; r0 += T16)
        for (int c0 = 0; c0 < c16; c0 += T16)
            V_TRANSPOSE16(src + (ptrdiff_t)r0 * lds + c0, lds, dst + (ptrdiff_t)c0 * ldd + r0, ldd);
    if (c16 < cols) /* rows [0, r16), columns [c16, cols) */
        TMPL_FN(transpose_blocks)(r16, cols - c16, src + c16, lds, dst + (ptrdiff_t)c16 * ldd, ldd);
    if (r16 < rows) /* rows [r16, rows), every column */
        TMPL_FN(transpose_blocks)(rows - r16, cols, src + (ptrdiff_t)r16 * lds, lds, dst + r16, ldd);
#else
    TMPL_FN(transpose_blocks)(rows, cols, src, lds, dst, ldd);
#endif
}

#endif /* SDPA_SIMD_TRANSPOSE_H */
