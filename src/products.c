/* SPDX-License-Identifier: MIT */
/* products.c - the products over a tile's keys, cut as the mask geometry says
 * (key runs and bands, mask.c), through the kernel table's gemm. Per entry of
 * C, terms are added in increasing key (or column) order, in a cut that
 * depends on the shape only. */
#include <string.h>

#include "driver.h"
/* The product restricted to keys [ks + koff, + nk) and columns [c0, c0 + nc);
 * `other` is the third dimension (a head_dim). A, B, C point at key ks, column 0.
 * c_row_scale: see sdpa_gemm_fn (only with c0 = 0 and all of C's rows). */
void sdpa_gemm_part(const sdpa_kernels *kt, int where, int64_t koff, int nk, int c0, int nc, int other, float alpha,
                    const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C,
                    ptrdiff_t ldc, int flags, const float *c_row_scale)
{
    const ptrdiff_t k = (ptrdiff_t)koff;
    switch (where) {
    case KEYS_M_COLS_N:
        kt->gemm(nk, nc, other, alpha, A + k * rs_a, rs_a, cs_a, B + c0, ldb, C + k * ldc + c0, ldc, flags,
                 c_row_scale);
        break;
    case KEYS_M_COLS_K:
        kt->gemm(nk, other, nc, alpha, A + k * rs_a + c0 * cs_a, rs_a, cs_a, B + c0 * ldb, ldb, C + k * ldc, ldc,
                 flags, c_row_scale);
        break;
    default: /* KEYS_K_COLS_M */
        kt->gemm(nc, other, nk, alpha, A + c0 * rs_a + k * cs_a, rs_a, cs_a, B + k * ldb, ldb, C + c0 * ldc, ldc,
                 flags, c_row_scale);
        break;
    }
}

/* A product over the keys and ncols columns of a tile, cut as tile_keys
 * says: gemm flags `flags` everywhere, plus skip_flag (SKIP_ZERO_A/B) where
 * masked entries may be. Unbanded, a product that skips nothing is one call.
 * Banded, entries of columns that no key of a band sees are not written (for
 * products that overwrite C: S^T, which mask_tile then fills with -inf, and
 * dP^T, whose masked entries bwd_dscores never reads), except for
 * KEYS_M_COLS_K without ACCUMULATE (dV, dK written once): there a band's
 * first part overwrites its key rows of C, the others add, and a band that
 * no column sees gets zero rows. Per entry of C, terms are added in
 * increasing key (or column) order, in a fixed cut. */
void sdpa_gemm_keys(const sdpa_kernels *kt, const tile_keys *tk, int where, int ncols, int other, float alpha,
                    const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C,
                    ptrdiff_t ldc, int flags, int skip_flag)
{
    const int64_t *seg = tk->seg;
    if (!tk->banded && !skip_flag) {
        sdpa_gemm_part(kt, where, 0, (int)(seg[3] - seg[0]), 0, ncols, other, alpha, A, rs_a, cs_a, B, ldb, C, ldc,
                  flags, NULL);
        return;
    }
    for (int g = 0; g < 3; g++) {
        const int n = (int)(seg[g + 1] - seg[g]);
        if (n <= 0)
            continue;
        if (g == 1 || !tk->banded) {
            sdpa_gemm_part(kt, where, seg[g] - tk->ks, n, 0, ncols, other, alpha, A, rs_a, cs_a, B, ldb, C, ldc,
                      flags | (g != 1 ? skip_flag : 0), NULL);
            continue;
        }
        const int once = where == KEYS_M_COLS_K && !(flags & SDPA_GEMM_ACCUMULATE);
        for (int64_t jb = seg[g]; jb < seg[g + 1]; jb += tk->band_keys) {
            const int nb = seg[g + 1] - jb < tk->band_keys ? (int)(seg[g + 1] - jb) : tk->band_keys;
            const int64_t koff = jb - tk->ks;
            int c[4];
            sdpa_band_cols(tk, jb, jb + nb - 1, c);
            if (once && c[3] == c[0])
                for (int r = 0; r < nb; r++)
                    memset(C + (koff + r) * ldc, 0, (size_t)other * sizeof(float));
            if (!skip_flag) { /* nothing to skip: one plain part over [c0, c3) */
                c[1] = c[0];
                c[2] = c[3];
            }
            int f = flags & ~SDPA_GEMM_STREAM_C; /* a band's parts are read back right away */
            for (int p = 0; p < 3; p++)
                if (c[p + 1] > c[p]) {
                    sdpa_gemm_part(kt, where, koff, nb, c[p], c[p + 1] - c[p], other, alpha, A, rs_a, cs_a, B, ldb, C,
                              ldc, f | (p != 1 ? skip_flag : 0), NULL);
                    if (once) /* later parts add to what the first wrote */
                        f |= SDPA_GEMM_ACCUMULATE;
                }
        }
    }
}

void sdpa_score_tile(const plan *pl, const tile_keys *tk, int kind, int64_t b, int64_t h0, int nh, int64_t i0,
                     int nr, int nk, const float *krows, ptrdiff_t ldk, const float *qt, float *s, float *G,
                     float *scratch)
{
    const int ld = pl->ld, ncol = nh * nr;
    if (pl->Dk == 0)
        for (int jj = 0; jj < nk; jj++)
            memset(s + (size_t)jj * ld, 0, (size_t)ncol * sizeof(float));
    else
        sdpa_gemm_keys(pl->kt, tk, KEYS_M_COLS_N, ncol, (int)pl->Dk, pl->scale, krows, ldk, 1, qt, ld, s, ld, 0, 0);
    if (pl->logit_variants)
        sdpa_logit_variants_t(pl, b, h0, nh, i0, nr, tk->ks, nk, s, ld, G, scratch);
    if (kind == TILE_PARTIAL)
        sdpa_mask_tile(pl, b, h0, nh, i0, nr, tk->lo, tk->hi, tk->ks, nk, s, ld, 1);
}
