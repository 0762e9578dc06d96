/* SPDX-License-Identifier: MIT */
/* backward_tile.c - one (query tile, key tile) pair of the backward
 * (FlashAttention-2, Dao 2023, Alg. 2), and the statistics pass that some rows
 * need first:
 *     S^T = scale K Q^T (masked), P^T = exp(S^T - LSE)
 *     dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T * (dP^T - D)
 *     dK += scale dS^T Q;  dQ += scale dS K
 * A query tile holds rows [i0, i0+nr) of the heads [h0, h0+nh) of one GQA group,
 * as in the forward; its packed operands (Q^T, dO^T, LSE, D) are reused while
 * the same thread stays on it. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backward.h"

int sdpa_bwd_bf16_pairs(const plan *pl)
{
    const sdpa_kernels *kt = pl->kt;
    return !pl->strict && kt->bwd_bf16_dot && kt->gemm_bf16_pairs && pl->q_dtype == SDPA_DTYPE_BF16 &&
           pl->kv_dtype == SDPA_DTYPE_BF16 && pl->o_dtype == SDPA_DTYPE_BF16 && pl->Dk > 0 && pl->Dk % 2 == 0 &&
           pl->Dv > 0 && pl->Dv % 2 == 0;
}

/* The pair buffers of bwd_ws (floats each, in its order: qtp, dotp, qp, dop, kp, dsp,
 * otp, then p16, ds16, o16, then dpair), or none without bwd_pairs (otp, o16, dpair:
 * only with dot_pairs_cols); returns their total (each rounded to the alignment). */
static size_t pair_floats(const plan *pl, size_t n[11])
{
    size_t m[11] = {0};
    if (pl->bwd_pairs) {
        const size_t ld = (size_t)pl->ld, bk = (size_t)pl->bk, Dk = (size_t)pl->Dk, Dv = (size_t)pl->Dv;
        const size_t hk = (bk + 1) / 2, hl = (ld + 1) / 2, d = pl->kt->dot_pairs_cols ? 1 : 0;
        const size_t v[11] = {Dk / 2 * ld, Dv / 2 * ld, hl * Dk,     hl * Dv, hk * Dk, hk * ld,
                              d * Dv / 2 * ld, bk * hl, bk * hl, d * ld * Dv / 2, d * ld};
        memcpy(m, v, sizeof m);
    }
    size_t total = 0;
    for (int i = 0; i < 11; i++) {
        total += round_floats(m[i]);
        if (n)
            n[i] = m[i];
    }
    return total;
}

size_t sdpa_bwd_ws_floats(const plan *pl)
{
    const size_t ld = (size_t)pl->ld, pq = (size_t)plan_row_pad(pl, pl->Dk), pv = (size_t)plan_row_pad(pl, pl->Dv);
    const size_t g = pl->softcap != 0.0f ? round_floats(pl->bk * ld) : 0;
    const size_t kc = pq ? round_floats((size_t)pl->bk * ((size_t)pl->Dk + pq)) : 0;
    return round_floats(pl->Dk * ld) + round_floats(((size_t)pl->Dk + pq) * ld) + round_floats(pl->Dv * ld) +
           round_floats(((size_t)pl->Dv + pv) * ld) + 2 * round_floats(pl->bk * ld) + g + kc + 6 * round_floats(ld) +
           4 * round_floats(ld) + 3 * round_floats(2 * ld) + pair_floats(pl, NULL);
}

bwd_ws sdpa_bwd_ws_carve(const plan *pl, float *base)
{
    const size_t ld = (size_t)pl->ld;
    bwd_ws w;
    const size_t pq = (size_t)plan_row_pad(pl, pl->Dk), pv = (size_t)plan_row_pad(pl, pl->Dv);
    w.qt = carve(&base, pl->Dk * ld);
    w.qn = carve(&base, ((size_t)pl->Dk + pq) * ld);
    w.dot = carve(&base, pl->Dv * ld);
    w.don = carve(&base, ((size_t)pl->Dv + pv) * ld);
    w.p = carve(&base, pl->bk * ld);
    w.dp = carve(&base, pl->bk * ld);
    w.g = pl->softcap != 0.0f ? carve(&base, pl->bk * ld) : NULL;
    w.kc = pq ? carve(&base, (size_t)pl->bk * ((size_t)pl->Dk + pq)) : NULL;
    w.vs = carve(&base, 2 * ld);
    w.lse = carve(&base, ld);
    w.dd = carve(&base, ld);
    w.rm = carve(&base, ld);
    w.rl = carve(&base, ld);
    w.ralpha = carve(&base, ld);
    w.lo = carve_i64(&base, ld);
    w.hi = carve_i64(&base, ld);
    w.rd = (double *)(void *)carve(&base, 2 * ld);
    w.rs = (double *)(void *)carve(&base, 2 * ld);
    w.dhi = carve(&base, ld);
    size_t n[11];
    pair_floats(pl, n);
    uint32_t **pw[7] = {&w.qtp, &w.dotp, &w.qp, &w.dop, &w.kp, &w.dsp, &w.otp};
    uint16_t **ph[3] = {&w.p16, &w.ds16, &w.o16};
    for (int i = 0; i < 7; i++)
        *pw[i] = n[i] ? (uint32_t *)(void *)carve(&base, n[i]) : NULL;
    for (int i = 0; i < 3; i++)
        *ph[i] = n[7 + i] ? (uint16_t *)(void *)carve(&base, n[7 + i]) : NULL;
    w.dpair = n[10] ? carve(&base, n[10]) : NULL;
    w.shift = 0;
    w.dshift = 0;
    w.packed_tile = -1;
    return w;
}

/* Rows [i0, i0+nr) of heads [h0, h0+nh) packed as [ncol][len], row stride ldd
 * (column g*nr+ii; ldd = len + plan_row_pad where the products read them padded). */
static const float *pack_rows(const sdpa_tensor *t, int64_t b, int64_t h0, int nh, int64_t i0, int nr,
                              int len, ptrdiff_t ldd, float *dst)
{
    for (int g = 0; g < nh; g++)
        copy_rows(nr, len, row_in(t, b, h0 + g, i0), t->seq_stride, dst + (size_t)(g * nr) * (size_t)ldd, ldd);
    return dst;
}

/* On the pair products, a fresh tile's D = rowsum(dO * O) summed as its dP is (the
 * tile's O rows rounded to bf16, exactly: O is bf16; O^T's pairs against dO^T's,
 * dot_pairs_cols), into w->dd for the rows whose LSE needs no statistics pass (the
 * others keep theirs, bwd_tile_row_stats). With a one-hot P, O = V and dP - D then
 * cancels exactly, as in the fp32 backward (dQ, dK exactly 0). */
static void bwd_tile_pair_d(const plan *pl, bwd_ws *w, const bwd_args *a, int64_t b, int64_t h0, int nh,
                            int64_t i0, int nr)
{
    const sdpa_kernels *kt = pl->kt;
    const int ld = pl->ld, Dv = (int)pl->Dv, ncol = nh * nr;
    for (int g = 0; g < nh; g++)
        kt->round_rows_bf16(nr, Dv, row_in(a->o, b, h0 + g, i0), a->o->seq_stride, w->o16 + (size_t)g * nr * Dv, Dv);
    kt->transpose_pairs(ncol, Dv / 2, w->o16, Dv, w->otp, ld);
    kt->dot_pairs_cols(Dv / 2, ncol, w->otp, ld, w->dotp, ld, w->dpair);
    for (int g = 0; g < nh; g++) {
        const float *lb = row_in(a->lse, b, h0 + g, i0);
        for (int ii = 0; ii < nr; ii++)
            if (!lse_needs_stats(lb[ii * a->lse->seq_stride]))
                w->dd[g * nr + ii] = w->dpair[g * nr + ii];
    }
}

/* dP^T = V dO^T for the pair's keys [ks, ks + nk) (rows of w->dp, one column
 * per query row of the tile); returns the dO rows the tile uses (in place for
 * one head, else packed when fresh) and their stride in *lddo. */
static const float *bwd_tile_dp(const plan *pl, bwd_ws *w, const bwd_args *a, const tile_keys *tk, int64_t b,
                                int64_t h0, int nh, int64_t i0, int nr, int64_t ks, int nk, int fresh,
                                ptrdiff_t *lddo)
{
    const sdpa_kernels *kt = pl->kt;
    const int ld = pl->ld, Dv = (int)pl->Dv, ncol = nh * nr;
    const int64_t hk = h0 / pl->G;
    const float *vb = row_in(a->v, b, hk, ks);
    const int pv = plan_row_pad(pl, Dv), in_place = nh == 1 && !pv;
    const float *dob = in_place ? row_in(a->dout, b, h0, i0)
                       : fresh  ? pack_rows(a->dout, b, h0, nh, i0, nr, Dv, Dv + pv, w->don)
                                : w->don;
    *lddo = in_place ? a->dout->seq_stride : Dv + pv;
    if (a->nt) {
        kt->gemm_nt_rows4(ncol, nk, Dv, 1.0f, dob, *lddo, vb, a->v->seq_stride, w->dp, 1, ld);
    } else if (a->pairs) { /* dO^T and dO rows in pairs once per tile; the bf16 V rows in place */
        if (fresh) {
            kt->transpose(ncol, Dv, dob, *lddo, w->dot, ld);
            kt->pack_pairs_f32(Dv, ncol, w->dot, ld, w->dotp, ld);
            kt->pack_pairs_f32(ncol, Dv, dob, *lddo, w->dop, Dv);
            if (kt->dot_pairs_cols)
                bwd_tile_pair_d(pl, w, a, b, h0, nh, i0, nr);
        }
        kt->gemm_bf16_pairs(nk, ncol, Dv / 2, 1.0f, a->v16 + ks * a->ldv16, a->ldv16, 2, w->dotp, ld, w->dp, ld, 0,
                            NULL);
    } else {
        if (fresh)
            kt->transpose(ncol, Dv, dob, *lddo, w->dot, ld);
        sdpa_gemm_keys(kt, tk, KEYS_M_COLS_N, ncol, Dv, 1.0f, vb, a->v->seq_stride, 1, w->dot, ld, w->dp, ld, 0, 0);
    }
    return dob;
}

/* A pair: its query tile, key range, and the operands both kinds of pass use. */
typedef struct bwd_tile {
    int64_t tile, b, hk, h0, i0, j0, j1, ks, ke;
    int nh, nr, ncol, nk, kind, fresh;
    tile_keys tk;
    const float *kb;   /* K rows from ks (NULL when Dk = 0) */
    const float *qsrc; /* Q rows of the tile: in place for one head, else packed */
    ptrdiff_t ldq;
} bwd_tile;

/* The start of pair (query tile `tile`, key tile from j0): the rows' key
 * intervals and the tile's kind; for a pair that is not skipped, its key runs,
 * Q rows, and (fresh tile) Q^T, LSE and D. Returns the kind. */
static int bwd_tile_begin(const plan *pl, bwd_ws *w, const bwd_args *a, bwd_tile *pt)
{
    const int64_t tkb = keys_of_batch(pl, pt->b), b = pt->b;
    const int nh = pt->nh, nr = pt->nr, Dk = (int)pl->Dk;
    for (int ii = 0; ii < nr; ii++)
        row_range(pl, tkb, pt->i0 + ii, &w->lo[ii], &w->hi[ii]);
    pt->hk = pt->h0 / pl->G;
    pt->ncol = nh * nr;
    pt->j1 = pl->Tk - pt->j0 > pl->bk ? pt->j0 + pl->bk : pl->Tk;
    pt->kind = sdpa_classify_tile(pl, b, pt->h0, nh, pt->i0, nr, w->lo, w->hi, pt->j0, pt->j1, &pt->ks, &pt->ke);
    if (pt->kind == TILE_SKIP)
        return TILE_SKIP;
    pt->nk = (int)(pt->ke - pt->ks + 1);
    sdpa_tile_keys_init(pl, &pt->tk, w->lo, w->hi, pt->kind, nh, nr, pt->ks, pt->ke);
    pt->kb = Dk > 0 ? row_in(a->k, b, pt->hk, pt->ks) : NULL;
    pt->fresh = w->packed_tile != pt->tile;
    const int pq = plan_row_pad(pl, Dk), in_place = nh == 1 && !pq;
    pt->qsrc = Dk == 0     ? NULL
               : in_place  ? row_in(a->q, b, pt->h0, pt->i0)
               : pt->fresh ? pack_rows(a->q, b, pt->h0, nh, pt->i0, nr, Dk, Dk + pq, w->qn)
                           : w->qn;
    pt->ldq = in_place ? a->q->seq_stride : Dk + pq;
    for (int g = 0; g < nh && pt->fresh; g++) {
        if (Dk > 0 && !a->nt)
            pl->kt->transpose(nr, Dk, row_in(a->q, b, pt->h0 + g, pt->i0), a->q->seq_stride, w->qt + g * nr, pl->ld);
        const float *lb = row_in(a->lse, b, pt->h0 + g, pt->i0);
        const int64_t r0 = (b * pl->Hq + pt->h0 + g) * pl->Tq + pt->i0;
        for (int ii = 0; ii < nr; ii++) {
            w->lse[g * nr + ii] = lb[ii * a->lse->seq_stride];
            w->dd[g * nr + ii] = a->D[r0 + ii];
        }
    }
    if (a->pairs && pt->fresh) { /* Q^T in pairs along head_dim (S^T), Q rows in pairs along columns (dK) */
        pl->kt->pack_pairs_f32(Dk, pt->ncol, w->qt, pl->ld, w->qtp, pl->ld);
        pl->kt->pack_pairs_f32(pt->ncol, Dk, pt->qsrc, pt->ldq, w->qp, Dk);
    }
    return pt->kind;
}

/* S^T = scale K Q^T of the pair, with the logit variants (G: the softcap's
 * derivative, or NULL), masked, into w->p. */
static void bwd_tile_scores(const plan *pl, bwd_ws *w, const bwd_args *a, const bwd_tile *pt, float *G)
{
    const int ld = pl->ld;
    if (a->pairs) { /* the bf16 K rows in place times Q^T's pairs */
        pl->kt->gemm_bf16_pairs(pt->nk, pt->ncol, (int)pl->Dk / 2, pl->scale, a->k16 + pt->ks * a->ldk16, a->ldk16,
                                2, w->qtp, ld, w->p, ld, 0, NULL);
        if (pl->logit_variants)
            sdpa_logit_variants_t(pl, pt->b, pt->h0, pt->nh, pt->i0, pt->nr, pt->ks, pt->nk, w->p, ld, G, w->vs);
        if (pt->kind == TILE_PARTIAL)
            sdpa_mask_tile(pl, pt->b, pt->h0, pt->nh, pt->i0, pt->nr, w->lo, w->hi, pt->ks, pt->nk, w->p, ld, 1);
        return;
    }
    if (!a->nt) {
        sdpa_score_tile(pl, &pt->tk, pt->kind, pt->b, pt->h0, pt->nh, pt->i0, pt->nr, pt->nk, pt->kb,
                        a->k->seq_stride, w->qt, w->p, G, w->vs);
        return;
    }
    /* few columns: dot products along head_dim, full vectors */
    if (pl->Dk == 0) /* no features: every score is 0 (Q and K may have no data) */
        for (int jj = 0; jj < pt->nk; jj++)
            memset(w->p + (size_t)jj * ld, 0, (size_t)pt->ncol * sizeof(float));
    else
        pl->kt->gemm_nt_rows4(pt->ncol, pt->nk, (int)pl->Dk, pl->scale, pt->qsrc, pt->ldq, pt->kb, a->k->seq_stride, w->p,
                        1, ld);
    if (pl->logit_variants)
        sdpa_logit_variants_t(pl, pt->b, pt->h0, pt->nh, pt->i0, pt->nr, pt->ks, pt->nk, w->p, ld, G, w->vs);
    if (pt->kind == TILE_PARTIAL)
        sdpa_mask_tile(pl, pt->b, pt->h0, pt->nh, pt->i0, pt->nr, w->lo, w->hi, pt->ks, pt->nk, w->p, ld, 1);
}

/* For a fresh tile of a gradient pair: the rows whose |LSE| >= BWD_LSE_EXACT_LIMIT
 * take the statistics pass's max, log-sum and D (P = exp((s - m) - log l), and
 * dP - D as (dP - fl(D)) - (D - fl(D))); the others are not shifted. */
static void bwd_tile_row_stats(const plan *pl, bwd_ws *w, const bwd_args *a, const bwd_tile *pt)
{
    w->shift = w->dshift = 0;
    for (int g = 0; g < pt->nh; g++) {
        const int64_t r0 = (pt->b * pl->Hq + pt->h0 + g) * pl->Tq + pt->i0;
        for (int ii = 0; ii < pt->nr; ii++) {
            const int c = g * pt->nr + ii;
            w->rm[c] = 0.0f;
            w->dhi[c] = 0.0f;
            if (lse_needs_stats(w->lse[c])) {
                w->lse[c] = a->row_logsum[r0 + ii];
                w->rm[c] = a->row_max[r0 + ii];
                w->dhi[c] = a->D[r0 + ii];
                w->dd[c] = a->row_dlo[r0 + ii];
            }
            w->shift |= w->rm[c] != 0.0f;
            w->dshift |= w->dhi[c] != 0.0f;
        }
    }
}

/* dK, dV rows of the key tile that no allowed pair reaches are 0 (kv_once: the
 * pair writes its key rows instead of adding to them). */
static void bwd_zero_unreached_kv(const plan *pl, const bwd_args *a, const bwd_tile *pt)
{
    const int64_t z0 = pt->kind == TILE_SKIP ? pt->j1 : pt->ks, z1 = pt->kind == TILE_SKIP ? pt->j1 : pt->ke + 1;
    for (int64_t j = pt->j0; j < pt->j1; j++)
        if (j < z0 || j >= z1) {
            if (pl->Dk > 0)
                memset(row_out(a->dk, pt->b, pt->hk, j), 0, (size_t)pl->Dk * sizeof(float));
            memset(row_out(a->dv, pt->b, pt->hk, j), 0, (size_t)pl->Dv * sizeof(float));
        }
}

/* nk rows of ncol fp32 (stride ld) rounded to bf16 into dst (stride ld), the column
 * after an odd ncol set to 0: the A operand of a product whose pairs run along the
 * columns (its B's padding row is 0 too, pack_pairs_f32). */
static void round_tile(const plan *pl, int nk, int ncol, const float *src, uint16_t *dst)
{
    const int ld = pl->ld;
    pl->kt->round_rows_bf16(nk, ncol, src, ld, dst, ld);
    if (ncol % 2)
        for (int jj = 0; jj < nk; jj++)
            dst[(size_t)jj * ld + ncol] = 0;
}

/* P^T from S^T (rows with recomputed statistics shifted by their max first),
 * dP^T = V dO^T, dV (+)= P^T dO; dP^T shifted by fl(D) where D was recomputed. */
static void bwd_tile_probs_dv(const plan *pl, bwd_ws *w, const bwd_args *a, const bwd_tile *pt, int kv_flags,
                              int skip)
{
    const int ld = pl->ld, Dv = (int)pl->Dv, ncol = pt->ncol, nk = pt->nk;
    if (w->shift) /* rows with a recomputed max: s - m (exact near the max), then exp(. - log l) */
        for (int c = 0; c < ncol; c++)
            if (w->rm[c] != 0.0f) /* |LSE| >= 256 puts |m| above 200 */
                for (int jj = 0; jj < nk; jj++)
                    w->p[(size_t)jj * ld + c] -= w->rm[c];
    pl->kt->bwd_probs(nk, ncol, w->p, ld, w->lse);
    if (Dv > 0) {
        float *dvb = row_out(a->dv, pt->b, pt->hk, pt->ks);
        ptrdiff_t lddo;
        const float *dob = bwd_tile_dp(pl, w, a, &pt->tk, pt->b, pt->h0, pt->nh, pt->i0, pt->nr, pt->ks, nk,
                                       pt->fresh, &lddo);
        if (a->pairs) { /* P^T rounded to bf16, pairs along the columns, times dO's pairs */
            round_tile(pl, nk, ncol, w->p, w->p16);
            pl->kt->gemm_bf16_pairs(nk, Dv, (ncol + 1) / 2, 1.0f, w->p16, ld, 2, w->dop, Dv, dvb, a->dv->seq_stride,
                                    kv_flags & SDPA_GEMM_ACCUMULATE, NULL);
        } else
            sdpa_gemm_keys(pl->kt, &pt->tk, KEYS_M_COLS_K, ncol, Dv, 1.0f, w->p, ld, 1, dob, lddo, dvb,
                       a->dv->seq_stride, kv_flags, skip);
    } else {
        for (int jj = 0; jj < nk; jj++)
            memset(w->dp + (size_t)jj * ld, 0, (size_t)ncol * sizeof(float));
    }
    if (w->dshift) /* rows with D = sum P dP: dP - fl(D) first (exact near the top key's dP) */
        for (int c = 0; c < ncol; c++)
            if (w->dhi[c] != 0.0f)
                for (int jj = 0; jj < nk; jj++)
                    w->dp[(size_t)jj * ld + c] -= w->dhi[c];
}

/* dK (+)= scale dS^T Q with dS^T rounded to bf16 (pairs along the columns) and Q's
 * row pairs; dQ += scale dS K with dS in pairs along the keys, rounded, and K's
 * pairs along the keys (one call over the heads' rows when each head has one).
 * ds_ready: w->ds16 and w->dsp hold dS already (bwd_dscores_pairs), else from w->dp. */
static void bwd_tile_dqdk_pairs(const plan *pl, bwd_ws *w, const bwd_args *a, const bwd_tile *pt, float *dkb,
                                int kv_flags, int ds_ready)
{
    const sdpa_kernels *kt = pl->kt;
    const int ld = pl->ld, Dk = (int)pl->Dk, nh = pt->nh, nr = pt->nr, nk = pt->nk, ncol = pt->ncol;
    if (!ds_ready) {
        round_tile(pl, nk, ncol, w->dp, w->ds16);
        kt->pack_pairs_f32(nk, ncol, w->dp, ld, w->dsp, ld);
    }
    kt->gemm_bf16_pairs(nk, Dk, (ncol + 1) / 2, pl->scale, w->ds16, ld, 2, w->qp, Dk, dkb, a->dk->seq_stride,
                        kv_flags & SDPA_GEMM_ACCUMULATE, NULL);
    kt->pack_pairs_bf16(nk, Dk, a->k16 + pt->ks * a->ldk16, a->ldk16, w->kp, Dk); /* finite (bwd_pairs) */
    const uint16_t *dsa = (const uint16_t *)(const void *)w->dsp;
    if (nr == 1) /* one row per head: the heads' dQ rows as one C, head_stride apart */
        kt->gemm_bf16_pairs(nh, Dk, (nk + 1) / 2, pl->scale, dsa, 2, 2 * (ptrdiff_t)ld, w->kp, Dk,
                            row_out(a->dq, pt->b, pt->h0, pt->i0), a->dq->head_stride, SDPA_GEMM_ACCUMULATE, NULL);
    else
        for (int h = 0; h < nh; h++)
            kt->gemm_bf16_pairs(nr, Dk, (nk + 1) / 2, pl->scale, dsa + 2 * (size_t)(h * nr), 2, 2 * (ptrdiff_t)ld,
                                w->kp, Dk, row_out(a->dq, pt->b, pt->h0 + h, pt->i0), a->dq->seq_stride,
                                SDPA_GEMM_ACCUMULATE, NULL);
}

/* dS^T = P^T * (dP^T - D) (times the softcap's derivative); dK (+)= scale dS^T Q;
 * dQ += scale dS K per head. */
static void bwd_tile_dqdk(const plan *pl, bwd_ws *w, const bwd_args *a, const bwd_tile *pt, int kv_flags, int skip)
{
    const sdpa_kernels *kt = pl->kt;
    const int ld = pl->ld, Dk = (int)pl->Dk, nh = pt->nh, nr = pt->nr;
    if (a->pairs && pl->softcap == 0.0f && kt->bwd_dscores_pairs) { /* dS straight into its two bf16 layouts */
        kt->bwd_dscores_pairs(pt->nk, pt->ncol, w->p, ld, w->dp, ld, w->dd, w->ds16, ld, w->dsp, ld);
        if (pt->ncol % 2)
            for (int jj = 0; jj < pt->nk; jj++)
                w->ds16[(size_t)jj * ld + pt->ncol] = 0;
        bwd_tile_dqdk_pairs(pl, w, a, pt, row_out(a->dk, pt->b, pt->hk, pt->ks), kv_flags, 1);
        return;
    }
    kt->bwd_dscores(pt->nk, pt->ncol, w->p, ld, w->dp, ld, w->dd);
    if (pl->softcap != 0.0f)
        kt->bwd_softcap(pt->nk, pt->ncol, w->dp, ld, w->g, ld);
    if (Dk == 0)
        return;
    float *dkb = row_out(a->dk, pt->b, pt->hk, pt->ks);
    if (a->pairs) {
        bwd_tile_dqdk_pairs(pl, w, a, pt, dkb, kv_flags, 0);
        return;
    }
    sdpa_gemm_keys(kt, &pt->tk, KEYS_M_COLS_K, pt->ncol, Dk, pl->scale, w->dp, ld, 1, pt->qsrc, pt->ldq, dkb,
                   a->dk->seq_stride, kv_flags, skip);
    const float *kb = pt->kb;
    ptrdiff_t ldk = a->k->seq_stride;
    if (w->kc && !a->nt && rows_share_l1_sets(ldk)) { /* plan_row_pad: the pair's K rows padded for dQ */
        const ptrdiff_t ldc = Dk + plan_row_pad(pl, Dk);
        copy_rows(pt->nk, Dk, kb, ldk, w->kc, ldc);
        kb = w->kc, ldk = ldc;
    }
    if (nr == 1 && nh > 1) /* one row per head (decode): the heads' dQ rows as one C, head_stride apart */
        sdpa_gemm_keys(kt, &pt->tk, KEYS_K_COLS_M, nh, Dk, pl->scale, w->dp, 1, ld, kb, ldk,
                       row_out(a->dq, pt->b, pt->h0, pt->i0), a->dq->head_stride, SDPA_GEMM_ACCUMULATE, skip);
    else
        for (int h = 0; h < nh; h++)
            sdpa_gemm_keys(kt, &pt->tk, KEYS_K_COLS_M, nr, Dk, pl->scale, w->dp + h * nr, 1, ld, kb, ldk,
                           row_out(a->dq, pt->b, pt->h0 + h, pt->i0), a->dq->seq_stride, SDPA_GEMM_ACCUMULATE, skip);
}

/* Query tile r of (batch, kv head) bh, against key tile from j0. */
static void bwd_tile_at(const plan *pl, const tile_layout *L, int64_t bh, int64_t r, int64_t j0, bwd_tile *pt)
{
    pt->tile = (bh * L->ngt + r / L->nrt) * L->nrt + r % L->nrt;
    int64_t hk;
    sdpa_tile_coords(pl, L, pt->tile, &pt->b, &hk, &pt->h0, &pt->nh, &pt->i0, &pt->nr);
    pt->j0 = j0;
}

void sdpa_bwd_pair(const plan *pl, bwd_ws *w, const bwd_args *a, const tile_layout *L, int64_t bh, int64_t r,
                   int64_t c)
{
    bwd_tile pt;
    bwd_tile_at(pl, L, bh, r, c * pl->bk, &pt);
    const int kind = bwd_tile_begin(pl, w, a, &pt);
    if (a->kv_once)
        bwd_zero_unreached_kv(pl, a, &pt);
    if (kind == TILE_SKIP)
        return;
    if (pt.fresh)
        bwd_tile_row_stats(pl, w, a, &pt);
    const int skip = kind == TILE_PARTIAL ? SDPA_GEMM_SKIP_ZERO_A : 0;
    /* dV, dK: write once (large ones with non-temporal stores), or add */
    const int kv_flags = a->kv_once ? (a->kv_stream ? SDPA_GEMM_STREAM_C : 0) : SDPA_GEMM_ACCUMULATE;
    bwd_tile_scores(pl, w, a, &pt, w->g);
    bwd_tile_probs_dv(pl, w, a, &pt, kv_flags, skip);
    bwd_tile_dqdk(pl, w, a, &pt, kv_flags, skip);
    w->packed_tile = pt.tile;
}

/* One key tile of the statistics pass: the masked S^T, the online-softmax update
 * of the rows' max and sum (w->rm, w->rl), and sum_j P_j dP_j and sum_j P_j in
 * float64, rescaled as l is. Nothing is written to the outputs. */
static void bwd_stats_pair(const plan *pl, bwd_ws *w, const bwd_args *a, const tile_layout *L, int64_t bh,
                           int64_t r, int64_t c)
{
    bwd_tile pt;
    bwd_tile_at(pl, L, bh, r, c * pl->bk, &pt);
    if (bwd_tile_begin(pl, w, a, &pt) == TILE_SKIP)
        return;
    const int ld = pl->ld, ncol = pt.ncol;
    bwd_tile_scores(pl, w, a, &pt, NULL);
    pl->kt->online_softmax(pt.nk, ncol, w->p, ld, w->rm, w->rl, w->ralpha);
    if (pl->Dv > 0) { /* w->p holds exp(s - m) now */
        ptrdiff_t lddo;
        bwd_tile_dp(pl, w, a, &pt.tk, pt.b, pt.h0, pt.nh, pt.i0, pt.nr, pt.ks, pt.nk, pt.fresh, &lddo);
        for (int k = 0; k < ncol; k++) {
            w->rd[k] *= w->ralpha[k];
            w->rs[k] *= w->ralpha[k];
        }
        for (int jj = 0; jj < pt.nk; jj++) {
            const float *pr = w->p + (size_t)jj * ld, *dpr = w->dp + (size_t)jj * ld;
            for (int k = 0; k < ncol; k++) { /* a masked key's dP may be NaN: dropped */
                const double t = (double)pr[k] * dpr[k];
                w->rd[k] += sdpa_is_masked_sentinel(pr[k]) ? 0.0 : t;
                w->rs[k] += pr[k]; /* the sentinel adds -0.0 */
            }
        }
    }
    w->packed_tile = pt.tile; /* Q^T, dO^T reused by the next key tile */
}

/* For the rows of row tile r of (batch, kv head) bh whose |LSE| >= BWD_LSE_EXACT_LIMIT:
 * their max m and sum l recomputed over every key tile, with the backward's own
 * score tiles (the same bits as its pairs see) and the online softmax, into
 * a->row_max and a->row_logsum = log(l). The float LSE keeps log(l) only to
 * ulp(LSE)/2: when every key of a row ties at a huge score (a bias of -FLT_MAX
 * on a padded row) it keeps nothing of it, and P = exp(s - LSE) would sum to
 * the number of keys. Nothing to do (and no cost but reading LSE) otherwise. */
void sdpa_bwd_tile_stats(const plan *pl, bwd_ws *w, const bwd_args *a, const tile_layout *L, int64_t bh,
                         int64_t r)
{
    const int64_t tile = (bh * L->ngt + r / L->nrt) * L->nrt + r % L->nrt;
    int64_t b, hk, h0, i0;
    int nh, nr, any = 0;
    sdpa_tile_coords(pl, L, tile, &b, &hk, &h0, &nh, &i0, &nr);
    for (int g = 0; g < nh && !any; g++) {
        const float *lb = row_in(a->lse, b, h0 + g, i0);
        for (int ii = 0; ii < nr; ii++)
            any |= lse_needs_stats(lb[ii * a->lse->seq_stride]);
    }
    if (!any)
        return;
    for (int c = 0; c < nh * nr; c++) {
        w->rm[c] = -INFINITY;
        w->rl[c] = 0.0f;
    }
    sdpa_sink_state(pl, h0, nh, nr, w->rm, w->rl); /* the sink's P is 1 at m = s_h, its dP 0 */
    for (int c = 0; c < nh * nr; c++) {
        w->rd[c] = 0.0;
        w->rs[c] = w->rl[c];
    }
    w->packed_tile = -1;
    for (int64_t c = 0; c < L->nkt; c++)
        bwd_stats_pair(pl, w, a, L, bh, r, c);
    for (int g = 0; g < nh; g++) {
        const float *lb = row_in(a->lse, b, h0 + g, i0);
        const int64_t r0 = (b * pl->Hq + h0 + g) * pl->Tq + i0;
        for (int ii = 0; ii < nr; ii++)
            if (lse_needs_stats(lb[ii * a->lse->seq_stride])) {
                a->row_max[r0 + ii] = w->rm[g * nr + ii];
                a->row_logsum[r0 + ii] = logf(w->rl[g * nr + ii]);
                a->row_dlo[r0 + ii] = 0.0f;
                if (pl->Dv > 0) { /* D = sum_j P_j dP_j, see above, as fl(D) + the rest */
                    const double d = w->rd[g * nr + ii] / w->rs[g * nr + ii];
                    a->D[r0 + ii] = (float)d;
                    a->row_dlo[r0 + ii] = (float)(d - (double)(float)d);
                }
            }
    }
    w->packed_tile = -1; /* the pairs pack the tile again, with the statistics */
}

