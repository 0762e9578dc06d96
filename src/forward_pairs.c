/* SPDX-License-Identifier: MIT */
/* forward_pairs.c - the forward's bf16 pair-product path (sdpa_fwd_bf16_pairs): a wide
 * (prefill) key tile of bf16 K/V and a bf16 or fp32 Q (rounded to bf16) through the
 * ISA's gemm_bf16_pairs (AVX512-BF16 vdpbf16ps, src/x86/kernels_avx512_bf16.c; AMX
 * tdpbf16ps, src/x86/kernels_amx.c), P rounded to bf16 before
 * P V (docs/design.md, "What is rounded"). The rest of the tile's work, masks,
 * variants and the online softmax, is forward.c's, in fp32. */
#include <string.h>

#include "dtype.h"
#include "forward.h"

int sdpa_fwd_bf16_pairs(const plan *pl)
{
    const sdpa_kernels *kt = pl->kt;
    const int q_ok = pl->q_dtype == SDPA_DTYPE_BF16 || pl->q_dtype == SDPA_DTYPE_F32;
    return !pl->strict && kt->bf16_dot && kt->gemm_bf16_pairs && q_ok && pl->kv_dtype == SDPA_DTYPE_BF16 && pl->Dk > 0 && pl->Dk % 2 == 0 && pl->Dv > 0;
}

int sdpa_rounds_q_bf16(const plan *pl)
{
    return pl->q_dtype == SDPA_DTYPE_F32 && sdpa_fwd_bf16_pairs(pl) && sdpa_wide_problem(pl);
}

void sdpa_round_q_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = sdpa_f32_bits(x[i]);
        if ((u & 0x7F800000u) == 0) /* zero or subnormal: the zero of its sign */
            u &= 0x80000000u;
        x[i] = sdpa_bf16_to_f32(sdpa_f32_to_bf16(sdpa_bits_f32(u)));
    }
}

void sdpa_fwd_pairs_blocks(plan *pl)
{
    const sdpa_kernels *kt = pl->kt;
    /* problems with wide tiles only (a packed sequence's own plan: its Tq): a decode
     * problem's tiles never run the pair products and keep the fp32 call's blocks (its
     * bits are the fp32 call's on the widened inputs) */
    if (!sdpa_fwd_bf16_pairs(pl) || !sdpa_wide_problem(pl))
        return;
    if (!pl->bq_given && kt->pairs_block_q)
        pl->bq = kt->pairs_block_q;
    if (!pl->bk_given && kt->pairs_block_k)
        pl->bk = kt->pairs_block_k;
    pl->ld = plan_ld(pl->bq, kt);
}

/* Words per column of P's pairs in the rows layout (online_softmax_pairs_rows): a key
 * tile's pairs rounded up to whole chunks of 16. */
static ptrdiff_t p_rows_ld(const plan *pl)
{
    return (((ptrdiff_t)pl->bk + 1) / 2 + 15) & ~(ptrdiff_t)15;
}

size_t sdpa_fwd_pair_floats(const plan *pl, size_t *qp, size_t *pp, size_t *vp)
{
    const size_t half_bk = ((size_t)pl->bk + 1) / 2;
    *qp = *pp = *vp = 0;
    if (sdpa_fwd_bf16_pairs(pl)) {
        *qp = (size_t)pl->Dk / 2 * (size_t)pl->ld;
        /* P's pairs: half_bk rows of ld words, or ld rows (columns) of p_rows_ld words */
        *pp = (pl->kt->online_softmax_pairs_rows ? (size_t)p_rows_ld(pl) : half_bk) * (size_t)pl->ld;
        *vp = half_bk * (size_t)pl->Dv;
    }
    return round_floats(*qp) + round_floats(*pp) + round_floats(*vp);
}

size_t sdpa_fwd_vpairs_floats(const plan *pl, size_t *tiles)
{
    if (tiles)
        *tiles = 0;
    /* wide tiles only (the blocks sdpa_fwd_pairs_blocks chose), and at least two query
     * tiles per kv head to reuse it */
    if (!sdpa_fwd_bf16_pairs(pl) || !sdpa_wide_problem(pl) || pl->Tq <= pl->bq ||
        pl->bk <= 0)
        return 0;
    const size_t nkt = (size_t)(pl->Tk / pl->bk), words = nkt * (((size_t)pl->bk + 1) / 2) * (size_t)pl->Dv;
    if (nkt == 0 || words * sizeof(uint32_t) > FWD_VPAIRS_CACHE_BYTES)
        return 0;
    if (tiles)
        *tiles = nkt;
    return round_floats(words) + round_floats((nkt + sizeof(float) - 1) / sizeof(float));
}

/* Key tile [ks, ks + nk) of V in pairs: from the thread's cache when the tile is a
 * whole key tile (and the cache exists), packing it there the first time; else packed
 * into w->vp. *finite: pack_pairs_bf16's flag. */
static const uint32_t *v_pairs(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft, int64_t ks, int nk,
                               int *finite)
{
    const int Dv = (int)pl->Dv;
    const int64_t c = ks / pl->bk;
    if (!w->vpc || ks != c * pl->bk || nk != pl->bk) {
        *finite = pl->kt->pack_pairs_bf16(nk, Dv, kv_row(pl, a->v, ft->vb, ks), a->v->seq_stride, w->vp, Dv);
        return w->vp;
    }
    if (w->vpc_pl != pl || w->vpc_b != ft->b || w->vpc_hk != ft->hk) {
        size_t nkt;
        sdpa_fwd_vpairs_floats(pl, &nkt);
        memset(w->vpc_state, -1, nkt);
        w->vpc_pl = pl;
        w->vpc_b = ft->b;
        w->vpc_hk = ft->hk;
    }
    uint32_t *dst = w->vpc + (size_t)c * (((size_t)pl->bk + 1) / 2) * (size_t)Dv;
    if (w->vpc_state[c] < 0)
        w->vpc_state[c] =
            (int8_t)pl->kt->pack_pairs_bf16(nk, Dv, kv_row(pl, a->v, ft->vb, ks), a->v->seq_stride, dst, Dv);
    *finite = w->vpc_state[c];
    return dst;
}

void sdpa_fwd_pairs_pack_q(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft)
{
    if (pl->q_dtype == SDPA_DTYPE_F32) { /* fp32 Q over a bf16 cache: Q^T, then rounded to bf16 pairs */
        for (int g = 0; g < ft->nh; g++)
            pl->kt->transpose(ft->nr, (int)pl->Dk, row_in_t(a->q, pl->q_dtype, ft->b, ft->h0 + g, ft->i0),
                              a->q->seq_stride, w->qt + g * ft->nr, pl->ld);
        pl->kt->pack_pairs_f32((int)pl->Dk, ft->ncol, w->qt, pl->ld, w->qp, pl->ld);
        return;
    }
    for (int g = 0; g < ft->nh; g++)
        pl->kt->transpose_pairs(ft->nr, (int)pl->Dk / 2, row_in_t(a->q, pl->q_dtype, ft->b, ft->h0 + g, ft->i0),
                                a->q->seq_stride, w->qp + g * ft->nr, pl->ld);
}

int sdpa_fwd_pairs_tile(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft, int kind, int64_t ks,
                        int nk)
{
    const sdpa_kernels *kt = pl->kt;
    const int ld = pl->ld, Dv = (int)pl->Dv, ncol = ft->ncol;
    /* a tile that neither a mask nor a logit variant touches keeps its products unscaled in S
     * (AMX stores its tiles there as they are) and the softmax scales each one: the same
     * single product per score either way, so the same bits */
    const int plain = kind == TILE_FULL && !pl->logit_variants;
    kt->gemm_bf16_pairs(nk, ncol, (int)pl->Dk / 2, plain ? 1.0f : pl->scale, kv_row(pl, a->k, ft->kb, ks),
                        a->k->seq_stride, 2, w->qp, ld, w->s, ld, 0, NULL);
    if (pl->logit_variants)
        sdpa_logit_variants_t(pl, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, ks, nk, w->s, ld, NULL, w->vs);
    if (kind == TILE_PARTIAL)
        sdpa_mask_tile(pl, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, w->lo, w->hi, ks, nk, w->s, ld, 1);
    int finite;
    const uint32_t *vp = v_pairs(pl, w, a, ft, ks, nk, &finite);
    if (!finite && kind == TILE_PARTIAL) { /* the caller finishes with the fp32 products on P^T */
        kt->online_softmax(nk, ncol, w->s, ld, w->m, w->l, w->alpha); /* m, l, alpha; S^T -> P^T */
        return 0;
    }
    /* m, l, alpha; P^T straight into its bf16 pairs: down its columns, or (amx) each
     * column's pairs in a row, the tile products' A rows in place (the same words: same bits) */
    const float sc = plain ? pl->scale : 1.0f;
    const uint16_t *p16 = (const uint16_t *)(const void *)w->pp;
    if (kt->online_softmax_pairs_rows) {
        const ptrdiff_t ldp = p_rows_ld(pl);
        kt->online_softmax_pairs_rows(nk, ncol, w->s, ld, sc, w->m, w->l, w->alpha, w->pp, ldp);
        kt->gemm_bf16_pairs(ncol, Dv, (nk + 1) / 2, 1.0f, p16, 2 * ldp, 2, vp, Dv, w->on, Dv, SDPA_GEMM_ACCUMULATE,
                            w->alpha);
        return 1;
    }
    kt->online_softmax_pairs(nk, ncol, w->s, ld, sc, w->m, w->l, w->alpha, w->pp, ld);
    kt->gemm_bf16_pairs(ncol, Dv, (nk + 1) / 2, 1.0f, p16, 2, 2 * (ptrdiff_t)ld, vp, Dv, w->on, Dv,
                        SDPA_GEMM_ACCUMULATE, w->alpha);
    return 1;
}
