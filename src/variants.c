/* SPDX-License-Identifier: MIT */
/* variants.c - the attention variants of today's models, applied to score tiles
 * and softmax states through the kernel table:
 *   softcap (Gemma 2 report, 2024):  x = cap * tanh(x / cap), before everything else;
 *   ALiBi (Press et al. 2022):       x -= slope[h] * |j - (i + d)|, after the softcap;
 *   sinks (gpt-oss model card):      one logit s_h per query head in every row's
 *                                    softmax denominator, no value: the online
 *                                    softmax starts from m = s_h, l = 1.
 * The bias and the masks come after (mask.c), so -inf still masks. */
#include <math.h>
#include <stdint.h>

#include "driver.h"

/* The aligned diagonal offset d of batch b (0 top-left, Tk_b - Tq bottom-right, plus
 * the descriptor's diagonal_offset). */
static int64_t diagonal(const plan *pl, int64_t b)
{
    return (pl->bottom_right ? keys_of_batch(pl, b) - pl->Tq : 0) + pl->diag_offset;
}

/* Per column of a tile (head h0 + g, row i0 + ii): pos = its aligned diagonal
 * i + d minus the first key key0, as a float; slope = its head's. scratch: pos
 * then slope, nh * nr floats each. */
static void alibi_columns(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, int64_t key0,
                          float *scratch)
{
    const int ncol = nh * nr;
    const int64_t d = diagonal(pl, b);
    for (int g = 0; g < nh; g++)
        for (int ii = 0; ii < nr; ii++) {
            scratch[g * nr + ii] = (float)(i0 + ii + d - key0);
            scratch[ncol + g * nr + ii] = pl->slopes[h0 + g];
        }
}

void sdpa_logit_variants_t(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, int64_t ks, int nk,
                           float *S, ptrdiff_t ld, float *G, float *scratch)
{
    const sdpa_kernels *kt = pl->kt;
    const int ncol = nh * nr;
    if (pl->softcap != 0.0f)
        kt->softcap(nk, ncol, S, ld, pl->softcap, G, ld);
    if (!pl->slopes)
        return;
    alibi_columns(pl, b, h0, nh, i0, nr, ks, scratch);
    kt->alibi_cols(nk, ncol, S, ld, scratch, scratch + ncol);
}

void sdpa_logit_variants_n(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, int64_t j0, int nk,
                           float *S, ptrdiff_t lds, float *scratch)
{
    const sdpa_kernels *kt = pl->kt;
    const int ncol = nh * nr;
    if (pl->softcap != 0.0f)
        kt->softcap(ncol, nk, S, lds, pl->softcap, NULL, 0);
    if (!pl->slopes)
        return;
    alibi_columns(pl, b, h0, nh, i0, nr, j0, scratch);
    kt->alibi_rows(ncol, nk, S, lds, scratch, scratch + ncol);
}

void sdpa_sink_state(const plan *pl, int64_t h0, int nh, int nr, float *m, float *l)
{
    if (!pl->sinks)
        return;
    for (int g = 0; g < nh; g++) {
        const float s = pl->sinks[h0 + g];
        for (int ii = 0; ii < nr; ii++) {
            m[g * nr + ii] = s;
            l[g * nr + ii] = s == -INFINITY ? 0.0f : 1.0f; /* exp(s - m) with m = s */
        }
    }
}
