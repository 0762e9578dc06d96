/* SPDX-License-Identifier: MIT */
/* forward_ws.c - the forward's per-thread workspace: what each buffer holds and how
 * many floats, its carving (sdpa_fwd_ws_carve), and the split-KV partial states. The
 * tile loop that uses them is forward.c. */
#include <stdint.h>

#include "forward.h"

/* Score tile: S^T [block_k][ld], or for few-column tiles S [ncol][nt_step]
 * (sized generously: max(nt_max_cols, nt_step) x block_k rounded up to
 * nt_step), or attend_rows's scratch. */
static size_t fwd_s_floats(const plan *pl)
{
    const sdpa_kernels *kt = pl->kt;
    const size_t step = (size_t)kt->nt_step;
    const size_t transposed = (size_t)pl->bk * (size_t)pl->ld;
    const size_t cols = (size_t)kt->nt_max_cols > step ? (size_t)kt->nt_max_cols : step;
    size_t natural = cols * (((size_t)pl->bk + step - 1) / step * step);
    if (natural < (size_t)kt->attend_scratch)
        natural = (size_t)kt->attend_scratch;
    return transposed > natural ? transposed : natural;
}

/* Rows of the output accumulator: a tile's columns. */
static size_t fwd_o_rows(const plan *pl)
{
    return (size_t)(pl->ld > pl->kt->nt_max_cols ? pl->ld : pl->kt->nt_max_cols);
}

/* Rows of the K and V conversion buffers: a wide tile's block_k keys, and at least one
 * step of the few-column path (fwd_nt_run widens its runs in whole steps). */
int sdpa_fwd_cvt_rows(const plan *pl)
{
    return pl->bk > pl->kt->nt_step ? pl->bk : pl->kt->nt_step;
}

/* Floats added to the row stride of a wide tile's V rows in the V buffer (w->vc),
 * plan_row_pad's for Dv: the 8-lane ISAs' P V gemm, whose 16-column panel of a 128-key
 * tile is 128 rows of one cache line, then finds them in every L1 set rather than in 8
 * or 16 of them; 0: V used in place, or widened with stride Dv. Same values, same
 * products: the same bits (docs/perf-notes.md, "The tile row stride"). */
int sdpa_fwd_v_pad(const plan *pl)
{
    return plan_row_pad(pl, pl->Dv);
}

/* Floats of the conversion buffers: K and V widened from bf16 / fp16, or for an fp32
 * problem with sdpa_fwd_v_pad the V tile copied with the padded stride (0 otherwise). */
static size_t fwd_cvt_floats(const plan *pl)
{
    const size_t bk = (size_t)sdpa_fwd_cvt_rows(pl), vrow = (size_t)pl->Dv + (size_t)sdpa_fwd_v_pad(pl);
    if (!pl->reduced)
        return sdpa_fwd_v_pad(pl) ? round_floats(bk * vrow) : 0;
    size_t qp, pp, vp;
    const size_t row = (size_t)(pl->Dk > pl->Dv ? pl->Dk : pl->Dv);
    return round_floats(bk * (size_t)pl->Dk) + round_floats(bk * vrow) + sdpa_fwd_pair_floats(pl, &qp, &pp, &vp) +
           round_floats(row);
}

int sdpa_fwd_reuses_tiles(const plan *pl)
{
    return pl->elem_mask && !pl->seqs && (!pl->bm.data || pl->bm.head_stride == 0) &&
           (!pl->bias.data || pl->bias.head_stride == 0) && pl->Hq > 1;
}

/* Key tiles of the problem (the classification cache's entries). */
size_t sdpa_fwd_key_tiles(const plan *pl)
{
    return pl->bk > 0 ? (size_t)(pl->Tk / pl->bk + (pl->Tk % pl->bk != 0)) : 0;
}

/* The classification cache: a kind (int8) and ks, ke (int64) per key tile. */
static size_t fwd_cls_floats(const plan *pl)
{
    const size_t nkt = sdpa_fwd_reuses_tiles(pl) ? sdpa_fwd_key_tiles(pl) : 0;
    return nkt ? round_floats((nkt + sizeof(float) - 1) / sizeof(float)) + 2 * round_floats(2 * nkt) : 0;
}

size_t sdpa_fwd_ws_floats(const plan *pl)
{
    const size_t ld = (size_t)pl->ld;
    /* qt, s, m, l, alpha, and lo/hi as int64 (2 floats each), vs, on, the conversion buffers,
       the classification cache */
    return round_floats(pl->Dk * ld) + round_floats(fwd_s_floats(pl)) + 3 * round_floats(ld) +
           4 * round_floats(ld) + round_floats(2 * ld) + round_floats(fwd_o_rows(pl) * pl->Dv) +
           fwd_cvt_floats(pl) + fwd_cls_floats(pl) + sdpa_fwd_vpairs_floats(pl, NULL);
}

fwd_ws sdpa_fwd_ws_carve(const plan *pl, float *base)
{
    const size_t ld = (size_t)pl->ld;
    fwd_ws w;
    w.qt = carve(&base, pl->Dk * ld);
    w.s = carve(&base, fwd_s_floats(pl));
    w.m = carve(&base, ld);
    w.l = carve(&base, ld);
    w.alpha = carve(&base, ld);
    w.lo = carve_i64(&base, ld);
    w.hi = carve_i64(&base, ld);
    w.vs = carve(&base, 2 * ld);
    w.on = carve(&base, fwd_o_rows(pl) * pl->Dv);
    w.cls_kind = NULL;
    w.cls_ks = w.cls_ke = NULL;
    w.cls_pl = NULL;
    w.cls_b = w.cls_i0 = -1;
    w.cls_nr = 0;
    if (fwd_cls_floats(pl)) {
        const size_t nkt = sdpa_fwd_key_tiles(pl);
        w.cls_kind = (int8_t *)(void *)carve(&base, (nkt + sizeof(float) - 1) / sizeof(float));
        w.cls_ks = carve_i64(&base, nkt);
        w.cls_ke = carve_i64(&base, nkt);
    }
    w.vpc = NULL;
    w.vpc_state = NULL;
    w.vpc_pl = NULL;
    w.vpc_b = w.vpc_hk = -1;
    size_t nkt;
    const size_t vpc = sdpa_fwd_vpairs_floats(pl, &nkt);
    if (vpc) {
        const size_t words = nkt * (((size_t)pl->bk + 1) / 2) * (size_t)pl->Dv;
        w.vpc = (uint32_t *)(void *)carve(&base, words);
        w.vpc_state = (int8_t *)(void *)carve(&base, (nkt + sizeof(float) - 1) / sizeof(float));
    }
    w.kc = w.vc = w.rowc = NULL;
    w.qp = w.pp = w.vp = NULL;
    const size_t vrow = (size_t)pl->Dv + (size_t)sdpa_fwd_v_pad(pl);
    if (!pl->reduced && sdpa_fwd_v_pad(pl))
        w.vc = carve(&base, (size_t)sdpa_fwd_cvt_rows(pl) * vrow);
    if (pl->reduced) {
        w.kc = carve(&base, (size_t)sdpa_fwd_cvt_rows(pl) * pl->Dk);
        w.vc = carve(&base, (size_t)sdpa_fwd_cvt_rows(pl) * vrow);
        size_t qp, pp, vp;
        if (sdpa_fwd_pair_floats(pl, &qp, &pp, &vp)) {
            w.qp = (uint32_t *)(void *)carve(&base, qp);
            w.pp = (uint32_t *)(void *)carve(&base, pp);
            w.vp = (uint32_t *)(void *)carve(&base, vp);
        }
        w.rowc = base;
    }
    return w;
}

/* Partial state of one (tile, split), C = fwd_tile_cols: m[C], l[C], and the
 * unnormalised O[C][Dv]. Compact, so that a split writes whole cache lines. */
size_t sdpa_fwd_partial_floats(const plan *pl, const tile_layout *L)
{
    const size_t cols = (size_t)tile_cols(L);
    return 2 * round_floats(cols) + round_floats((size_t)pl->Dv * cols);
}
