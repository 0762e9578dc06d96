/* SPDX-License-Identifier: MIT */
/* forward.c - sdpa_forward: FlashAttention-2 (Dao 2023, Alg. 1) per (batch,
 * query tile), streaming over key tiles:
 *     Q^T tile  <- transpose(Q rows)                    Dk x BQ
 *     S^T       <- scale * K_tile Q^T                   BK x BQ   (kernels.gemm)
 *     mask S^T on tiles that need it (-inf, + bias)     (mask.c)
 *     m, l, alpha, P^T <- online softmax of S^T         (kernels.online_softmax)
 *     O         <- alpha O + P V                        (kernels.gemm, O natural)
 *     O = O / l,  LSE = m + log(l)   (l = 0: O = 0, LSE = -inf)
 * Scores are kept transposed (keys x queries) so that everything per query is a
 * vector along the contiguous dimension (see kernels.h). Tiles with few query
 * columns (decode) use the natural layout instead and go through the keys in
 * steps of kt->nt_step: S = Q K^T by dot products (gemm_nt), a row-wise softmax,
 * O = alpha O + P V (gemm_stream), or all three in one call (attend_rows) over a
 * run of unmasked tiles; these kernels read every K and V row whole, in address
 * order, which keeps decode at the memory bandwidth (fwd_nt_run). Short Tq packs
 * several heads of a GQA group into one tile; few tiles split the keys
 * (split-KV) and merge the partial (m, l, O) in a fixed order (fwd_merge). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "forward.h"

/* Writes O = on / l (on: the tile's accumulator [ncol][Dv]) and LSE of a tile;
 * inv_l[c] = 1 / l[c] (0 where l is 0). A bf16 / fp16 O goes row by row through
 * w_row (Dv floats), rounded to nearest even. */
static void fwd_store(const plan *pl, const fwd_args *a, const float *on, const float *m, const float *l,
                      const float *inv_l, int64_t b, int64_t h0, int nh, int64_t i0, int nr, float *w_row)
{
    const int Dv = (int)pl->Dv;
    for (int g = 0; g < nh; g++) {
        if (Dv > 0 && pl->o_dtype != SDPA_DTYPE_F32) { /* each row through the fp32 row buffer */
            const sdpa_narrow_rows_fn narrow =
                pl->o_dtype == SDPA_DTYPE_BF16 ? pl->kt->narrow_bf16 : pl->kt->narrow_f16;
            for (int ii = 0; ii < nr; ii++) {
                const int c = g * nr + ii;
                if (l[c] == 0.0f)
                    memset(w_row, 0, (size_t)Dv * sizeof(float));
                else
                    pl->kt->scale_rows(1, Dv, on + (size_t)c * Dv, Dv, inv_l + c, w_row, Dv);
                narrow(1, Dv, w_row, Dv, row_out_t(a->o, pl->o_dtype, b, h0 + g, i0 + ii), 1);
            }
        } else if (Dv > 0) {
            float *ob = row_out(a->o, b, h0 + g, i0);
            pl->kt->scale_rows(nr, Dv, on + (size_t)g * nr * Dv, Dv, inv_l + g * nr, ob, a->o->seq_stride);
            for (int ii = 0; ii < nr; ii++)
                if (l[g * nr + ii] == 0.0f) /* exact zeros even if NaN crept into the accumulator */
                    memset(ob + ii * a->o->seq_stride, 0, (size_t)Dv * sizeof(float));
        }
        if (a->lse && a->lse->data) {
            float *lb = row_out(a->lse, b, h0 + g, i0);
            for (int ii = 0; ii < nr; ii++) {
                const int c = g * nr + ii;
                lb[ii * a->lse->seq_stride] = l[c] == 0.0f ? -INFINITY : m[c] + logf(l[c]); /* NaN stays NaN */
            }
        }
    }
}

/* Asks for rows [j0, j1) of a K or V head (len floats each) to be brought into
 * the cache ahead of use. Each row is short (head_dim floats), too short for the
 * hardware stream prefetchers, so without this a pass whose compute per byte is
 * low (decode: a few queries per key) waits on memory latency. */
static inline void prefetch_rows(const plan *pl, const void *base, ptrdiff_t stride, int64_t j0, int64_t j1,
                                 int64_t len)
{
    if (!base)
        return;
    const int64_t eb = (int64_t)dtype_bytes(pl->kv_dtype);
    for (int64_t j = j0; j < j1; j++) {
        const char *row = (const char *)base + j * stride * eb;
        for (int64_t off = 0; off < len * eb; off += 64)
            __builtin_prefetch(row + off, 0, 2);
    }
}

/* Rows [j, j + n) of K or V (one page), len elements each, as fp32: in place for
 * an fp32 cache (*ld = its seq_stride), else widened into buf (*ld = len). */
static const float *kv_rows_f32(const plan *pl, const sdpa_tensor *t, const void *head_base, int64_t j, int n,
                                int len, float *buf, ptrdiff_t *ld)
{
    const void *src = kv_row(pl, t, head_base, j);
    if (pl->kv_dtype == SDPA_DTYPE_F32) {
        *ld = t->seq_stride;
        return src;
    }
    const sdpa_widen_rows_fn widen = pl->kv_dtype == SDPA_DTYPE_BF16 ? pl->kt->widen_bf16 : pl->kt->widen_f16;
    widen(n, len, src, t->seq_stride, buf, len);
    *ld = len;
    return buf;
}

/* The V rows [j, j + n) of a wide tile (one page) as fp32 for its P V gemm: with
 * sdpa_fwd_v_pad, widened or copied into buf with row stride Dv + pad unless an fp32 V's
 * own rows are not a multiple of 256 bytes apart (used in place); else as kv_rows_f32. */
static const float *wide_v_rows(const plan *pl, const sdpa_tensor *v, const void *head_base, int64_t j, int n,
                                float *buf, ptrdiff_t *ld)
{
    const int Dv = (int)pl->Dv, pad = sdpa_fwd_v_pad(pl);
    if (!pad || (pl->kv_dtype == SDPA_DTYPE_F32 && !rows_share_l1_sets(v->seq_stride)))
        return kv_rows_f32(pl, v, head_base, j, n, Dv, buf, ld);
    const void *src = kv_row(pl, v, head_base, j);
    *ld = Dv + pad;
    if (pl->kv_dtype == SDPA_DTYPE_F32) {
        copy_rows(n, Dv, src, v->seq_stride, buf, *ld);
    } else {
        const sdpa_widen_rows_fn widen = pl->kv_dtype == SDPA_DTYPE_BF16 ? pl->kt->widen_bf16 : pl->kt->widen_f16;
        widen(n, Dv, src, v->seq_stride, buf, *ld);
    }
    return buf;
}

/* The end of the run of keys from j that lies in one page (unpaged: end). */
static inline int64_t kv_run_end(const plan *pl, int64_t j, int64_t end)
{
    if (!pl->pages)
        return end;
    const int64_t page_end = (j / pl->page_size + 1) * pl->page_size;
    return page_end < end ? page_end : end;
}

/* Few-column tiles (decode), keys [ks, ke) of one tile's rows that lie in one
 * page, with their K and V rows as fp32 from kr, vr (key ks) at strides sk, sv:
 * in steps of nt_step keys, S = scale Q K^T (natural layout [ncol][nt_step], keys
 * past the step -inf), the row-wise online softmax, then O = O * alpha + P V; in
 * one kernel call (attend_rows) where the ISA provides it for the shape, else
 * composed from gemm_nt, online_softmax_rows and gemm_stream. The kernels read
 * every K and V row whole, in address order, and short steps interleave the two
 * streams finely: the order the hardware prefetchers follow (docs/perf-notes.md).
 * partial: the masks apply element by element (and attend_rows is not used). */
static void fwd_nt_seg(const plan *pl, fwd_ws *w, const fwd_tile *ft, int64_t ks, int64_t ke, const float *kr,
                       ptrdiff_t sk, const float *vr, ptrdiff_t sv, int partial)
{
    const sdpa_kernels *kt = pl->kt;
    const int Dk = (int)pl->Dk, Dv = (int)pl->Dv, ncol = ft->ncol, step = kt->nt_step;
    if (!partial && !pl->logit_variants && kt->attend_rows && Dk > 0 && Dv > 0 && ke - ks <= INT32_MAX &&
        kt->attend_rows(ncol, (int)(ke - ks), Dk, Dv, pl->scale, w->qt, Dk, kr, sk, vr, sv, w->m, w->l, w->on, Dv,
                        w->s))
        return; /* else a shape the ISA does not take here: the steps below */
    for (int64_t j = ks, n; j < ke; j += n) {
        n = ke - j < step ? ke - j : step;
        if (Dk == 0) /* no features: every score is 0 (K may have no data at all) */
            for (int c = 0; c < ncol; c++)
                memset(w->s + (size_t)c * step, 0, (size_t)n * sizeof(float));
        else
            kt->gemm_nt(ncol, (int)n, Dk, pl->scale, w->qt, Dk, kr + (j - ks) * sk, sk, w->s, step, 1);
        if (pl->logit_variants)
            sdpa_logit_variants_n(pl, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, j, (int)n, w->s, step, w->vs);
        if (n < step)
            for (int c = 0; c < ncol; c++)
                for (int jj = n; jj < step; jj++)
                    w->s[(size_t)c * step + jj] = -INFINITY;
        if (partial)
            sdpa_mask_tile(pl, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, w->lo, w->hi, j, (int)n, w->s, 1, step);
        kt->online_softmax_rows(ncol, step, w->s, step, w->m, w->l, w->alpha);
        if (Dv > 0)
            kt->gemm_stream(ncol, Dv, (int)n, w->s, step, vr + (j - ks) * sv, sv, w->on, Dv, partial, w->alpha);
    }
}

/* A bf16 / fp16 cache's keys [ks, ke) in one page through the ISA's attend_rows
 * for that type (K and V widened in registers as they are read; with bf16 Q rows
 * where the table's bf16_dot is 1, unless SDPA_FPMATH_STRICT, the scores on its pair
 * products, attend_rows_bf16_pairs: bf16 subnormals read as 0); 0 when it does not take the call (not provided, masks
 * element by element, logit variants, or a shape it refuses), and then nothing was
 * done. */
static int fwd_nt_seg16(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft, int64_t ks, int64_t ke,
                        int partial)
{
    const sdpa_kernels *kt = pl->kt;
    const int q16 = pl->q_dtype == SDPA_DTYPE_BF16 || sdpa_rounds_q_bf16(pl); /* w->qt holds bf16 values */
    const sdpa_attend_rows16_fn f = pl->kv_dtype != SDPA_DTYPE_BF16                  ? kt->attend_rows_f16
                                    : q16 && kt->bf16_dot && !pl->strict && kt->attend_rows_bf16_pairs ? kt->attend_rows_bf16_pairs
                                                                                      : kt->attend_rows_bf16;
    if (!f || partial || pl->logit_variants || pl->Dk == 0 || pl->Dv == 0 || ke - ks > INT32_MAX)
        return 0;
    return f(ft->ncol, (int)(ke - ks), (int)pl->Dk, (int)pl->Dv, pl->scale, w->qt, pl->Dk,
             kv_row(pl, a->k, ft->kb, ks), a->k->seq_stride, kv_row(pl, a->v, ft->vb, ks), a->v->seq_stride, w->m,
             w->l, w->on, pl->Dv, w->s);
}

/* Few-column tiles (decode), keys [ks, ke): fwd_nt_seg over each run of keys in
 * one page (the whole range when unpaged); a bf16 / fp16 cache through the
 * ISA's typed attend_rows where it takes the run, else in runs of whole steps (at most
 * max(block_k, nt_step) keys) widened to fp32 first. */
static void fwd_nt_run(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft, int64_t ks, int64_t ke,
                       int partial)
{
    const int Dk = (int)pl->Dk, Dv = (int)pl->Dv;
    for (int64_t j = ks, e; j < ke; j = e) {
        if (pl->kv_dtype != SDPA_DTYPE_F32) {
            e = kv_run_end(pl, j, ke);
            if (fwd_nt_seg16(pl, w, a, ft, j, e, partial))
                continue;
        }
        e = kv_run_end(pl, j, ke);
        /* widened in runs of whole steps, so that the steps fall where an fp32 call's do
           (the same bits as the fp32 call on the widened values, whatever block_k) */
        const int run = sdpa_fwd_cvt_rows(pl) - sdpa_fwd_cvt_rows(pl) % pl->kt->nt_step;
        if (pl->reduced && e - j > run)
            e = j + run;
        const int n = pl->reduced ? (int)(e - j) : 0;
        ptrdiff_t sk = a->k->seq_stride, sv = a->v->seq_stride;
        const float *kr = Dk > 0 ? kv_rows_f32(pl, a->k, ft->kb, j, n, Dk, w->kc, &sk) : NULL;
        const float *vr = Dv > 0 ? kv_rows_f32(pl, a->v, ft->vb, j, n, Dv, w->vc, &sv) : NULL;
        fwd_nt_seg(pl, w, ft, j, e, kr, sk, vr, sv, partial);
    }
}

/* Key tiles [*first, *end) of this split, intersected with the tile's allowed
 * keys. Split s covers key tiles [s*base + min(s, rem), ...): no s * nkt overflow. */
static void fwd_key_tiles(const plan *pl, const tile_layout *L, const fwd_ws *w, int nr, int64_t split,
                          int64_t *first_tile, int64_t *end_tile)
{
    const int64_t base = L->nkt / L->nsplit, rem = L->nkt % L->nsplit;
    int64_t kt_first = split * base + (split < rem ? split : rem);
    int64_t kt_end = (split + 1) * base + (split + 1 < rem ? split + 1 : rem);
    const int64_t first = w->lo[0] > 0 ? w->lo[0] : 0, last = w->hi[nr - 1];
    if (first <= last) {
        if (kt_first < first / pl->bk)
            kt_first = first / pl->bk;
        if (kt_end > last / pl->bk + 1)
            kt_end = last / pl->bk + 1;
    } else {
        kt_end = kt_first; /* every row fully masked */
    }
    *first_tile = kt_first;
    *end_tile = kt_end;
}

/* The tile's Q once: Q^T [Dk][ld] for the transposed path (in pairs [Dk/2][ld] for
 * the bf16 pair products), or Q rows [ncol][Dk] for gemm_nt. */
static void fwd_pack_q(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft)
{
    const int Dk = (int)pl->Dk;
    if (!ft->nt && w->qp) { /* bf16 pair products: bf16 Q^T in pairs, straight from the rows */
        sdpa_fwd_pairs_pack_q(pl, w, a, ft);
        return;
    }
    if (pl->q_dtype != SDPA_DTYPE_F32) { /* row by row, widened */
        const sdpa_widen_rows_fn widen = pl->q_dtype == SDPA_DTYPE_BF16 ? pl->kt->widen_bf16 : pl->kt->widen_f16;
        for (int g = 0; g < ft->nh && Dk > 0; g++)
            for (int ii = 0; ii < ft->nr; ii++) {
                const void *qrow = row_in_t(a->q, pl->q_dtype, ft->b, ft->h0 + g, ft->i0 + ii);
                if (ft->nt) {
                    widen(1, Dk, qrow, 1, w->qt + (size_t)(g * ft->nr + ii) * Dk, Dk);
                } else {
                    widen(1, Dk, qrow, 1, w->rowc, Dk);
                    pl->kt->transpose(1, Dk, w->rowc, Dk, w->qt + g * ft->nr + ii, pl->ld);
                }
            }
        return;
    }
    for (int g = 0; g < ft->nh; g++) {
        const float *qrow = row_in(a->q, ft->b, ft->h0 + g, ft->i0);
        if (!ft->nt)
            pl->kt->transpose(ft->nr, Dk, qrow, a->q->seq_stride, w->qt + g * ft->nr, pl->ld);
        else if (Dk > 0)
            for (int ii = 0; ii < ft->nr; ii++)
                memcpy(w->qt + (size_t)(g * ft->nr + ii) * Dk, qrow + ii * a->q->seq_stride,
                       (size_t)Dk * sizeof(float));
    }
    if (ft->nt && sdpa_rounds_q_bf16(pl)) /* the Q that the problem's wide tiles read */
        sdpa_round_q_bf16(w->qt, (size_t)ft->ncol * (size_t)Dk);
}

/* sdpa_classify_tile for key tile ktile ([j0, j1)) of the tile ft, from the
 * thread's cache where the problem reuses tiles (the mask and bias are the same
 * for every head, so is the result; lo and hi depend on the batch and rows only). */
static int fwd_classify(const plan *pl, fwd_ws *w, const fwd_tile *ft, int64_t ktile, int64_t j0, int64_t j1,
                        int64_t *ks, int64_t *ke)
{
    if (!w->cls_kind || !sdpa_fwd_reuses_tiles(pl))
        return sdpa_classify_tile(pl, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, w->lo, w->hi, j0, j1, ks, ke);
    if (w->cls_pl != pl || w->cls_b != ft->b || w->cls_i0 != ft->i0 || w->cls_nr != ft->nr) {
        memset(w->cls_kind, -1, sdpa_fwd_key_tiles(pl));
        w->cls_pl = pl;
        w->cls_b = ft->b;
        w->cls_i0 = ft->i0;
        w->cls_nr = ft->nr;
    }
    if (w->cls_kind[ktile] < 0) {
        w->cls_ks[ktile] = w->cls_ke[ktile] = 0; /* (a skipped tile leaves them alone) */
        w->cls_kind[ktile] = (int8_t)sdpa_classify_tile(pl, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, w->lo, w->hi, j0,
                                                        j1, &w->cls_ks[ktile], &w->cls_ke[ktile]);
    }
    *ks = w->cls_ks[ktile];
    *ke = w->cls_ke[ktile];
    return w->cls_kind[ktile];
}

/* First key past the run of full key tiles that starts with the full tile
 * ktile (keys up to ke): consecutive full tiles form one decode run. *ktile
 * moves to the run's last tile. */
static int64_t fwd_full_run_end(const plan *pl, fwd_ws *w, const fwd_tile *ft, int64_t *ktile,
                                int64_t kt_end, int64_t ke)
{
    int64_t run_end = ke + 1;
    while (*ktile + 1 < kt_end) {
        const int64_t n0 = (*ktile + 1) * pl->bk, n1 = pl->Tk - n0 > pl->bk ? n0 + pl->bk : pl->Tk;
        int64_t ks2, ke2;
        if (fwd_classify(pl, w, ft, *ktile + 1, n0, n1, &ks2, &ke2) != TILE_FULL ||
            ks2 != run_end)
            break;
        run_end = ke2 + 1;
        (*ktile)++;
    }
    return run_end;
}

/* One key tile [ks, ke] of the transposed path: S^T, online softmax, O = alpha O
 * + P V (a full tile in one gemm that rescales O's rows as it adds; a partial
 * one rescales first, then adds in the cut the mask geometry gives). */
static void fwd_wide_tile(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft, int kind, int64_t ks,
                          int64_t ke)
{
    const sdpa_kernels *kt = pl->kt;
    const int ld = pl->ld, Dv = (int)pl->Dv, ncol = ft->ncol, nk = (int)(ke - ks + 1);
    tile_keys tk;
    sdpa_tile_keys_init(pl, &tk, w->lo, w->hi, kind, ft->nh, ft->nr, ks, ke);
    ptrdiff_t ldv;
    if (w->qp) {
        if (sdpa_fwd_pairs_tile(pl, w, a, ft, kind, ks, nk))
            return;
    } else {
        ptrdiff_t ldk = a->k->seq_stride;
        const float *krows = ft->kb ? kv_rows_f32(pl, a->k, ft->kb, ks, nk, (int)pl->Dk, w->kc, &ldk) : NULL;
        sdpa_score_tile(pl, &tk, kind, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, nk, krows, ldk, w->qt, w->s, NULL,
                        w->vs);
        kt->online_softmax(nk, ncol, w->s, ld, w->m, w->l, w->alpha); /* m, l, alpha; S^T -> P^T */
    }
    if (Dv == 0)
        return;
    const float *vrows = wide_v_rows(pl, a->v, ft->vb, ks, nk, w->vc, &ldv); /* a tile lies in one page */
    if (kind == TILE_FULL) {
        sdpa_gemm_part(kt, KEYS_K_COLS_M, 0, nk, 0, ncol, Dv, 1.0f, w->s, 1, ld, vrows, ldv, w->on, Dv,
                       SDPA_GEMM_ACCUMULATE, w->alpha);
    } else {
        kt->scale_rows(ncol, Dv, w->on, Dv, w->alpha, w->on, Dv);
        sdpa_gemm_keys(kt, &tk, KEYS_K_COLS_M, ncol, Dv, 1.0f, w->s, 1, ld, vrows, ldv, w->on, Dv,
                       SDPA_GEMM_ACCUMULATE, SDPA_GEMM_SKIP_ZERO_A);
    }
}

/* The tile of item t and its starting state: allowed key intervals, m = -inf,
 * l = 0 (the sinks' state in the first split), O = 0. */
static void fwd_tile_begin(const plan *pl, fwd_ws *w, const fwd_args *a, int64_t t, int64_t split, fwd_tile *ft)
{
    sdpa_tile_coords(pl, &a->L, t, &ft->b, &ft->hk, &ft->h0, &ft->nh, &ft->i0, &ft->nr);
    ft->ncol = ft->nh * ft->nr;
    ft->kb = pl->Dk > 0 ? row_in_t(a->k, pl->kv_dtype, ft->b, ft->hk, 0) : NULL;
    ft->vb = pl->Dv > 0 ? row_in_t(a->v, pl->kv_dtype, ft->b, ft->hk, 0) : NULL;
    /* Few query columns (decode): dot-product S (gemm_nt) in natural layout, so
     * that the vector dimension runs along head_dim instead of along a handful
     * of queries. Chosen by shape only (never by threads). */
    ft->nt = ft->ncol <= pl->kt->nt_max_cols;
    const int64_t tkb = keys_of_batch(pl, ft->b);
    for (int ii = 0; ii < ft->nr; ii++)
        row_range(pl, tkb, ft->i0 + ii, &w->lo[ii], &w->hi[ii]);
    for (int c = 0; c < ft->ncol; c++) {
        w->m[c] = -INFINITY;
        w->l[c] = 0.0f;
    }
    if (split == 0) /* a sink joins each row's softmax once, in the first split */
        sdpa_sink_state(pl, ft->h0, ft->nh, ft->nr, w->m, w->l);
    memset(w->on, 0, (size_t)ft->ncol * pl->Dv * sizeof(float));
}

/* The end of an item: its partial state (split-KV), or O = O / l and LSE (a row
 * that saw no allowed key, l = 0, is exactly 0). */
static void fwd_tile_end(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft, int64_t t,
                         int64_t split)
{
    const tile_layout *L = &a->L;
    const int ncol = ft->ncol;
    if (L->nsplit > 1) {
        const size_t cols = (size_t)tile_cols(L);
        float *part = a->partials + (size_t)(t * L->nsplit + split) * sdpa_fwd_partial_floats(pl, L);
        memcpy(part, w->m, (size_t)ncol * sizeof(float));
        memcpy(part + round_floats(cols), w->l, (size_t)ncol * sizeof(float));
        memcpy(part + 2 * round_floats(cols), w->on, (size_t)ncol * pl->Dv * sizeof(float));
        return;
    }
    for (int c = 0; c < ncol; c++)
        w->alpha[c] = w->l[c] == 0.0f ? 0.0f : 1.0f / w->l[c];
    fwd_store(pl, a, w->on, w->m, w->l, w->alpha, ft->b, ft->h0, ft->nh, ft->i0, ft->nr, w->rowc);
}

/* Whether the wide path prefetches the next key tile's K and V rows while one
 * computes (kt->wide_prefetch). "Streaming": only where little of K and V is
 * reused from the caches, a head's K and V of at least 1 MiB read by at most two
 * row tiles; elsewhere the next tile is usually in the caches already and the
 * prefetch instructions only cost (docs/perf-notes.md has the measurements behind
 * the tuning table's choice per microarchitecture). */
static int fwd_prefetches(const plan *pl, const tile_layout *L)
{
    if (pl->kt->wide_prefetch != SDPA_PREFETCH_STREAMING)
        return pl->kt->wide_prefetch == SDPA_PREFETCH_ALWAYS;
    const double kv_bytes = (double)pl->Tk * (double)(pl->Dk + pl->Dv) * (double)dtype_bytes(pl->kv_dtype);
    return L->nrt <= 2 && kv_bytes >= 1048576.0;
}

/* One (tile, split) of the forward: Alg. 1 over the tile's key tiles in the split. */
void sdpa_fwd_item(const plan *pl, fwd_ws *w, const fwd_args *a, int64_t t, int64_t split)
{
    fwd_tile ft;
    fwd_tile_begin(pl, w, a, t, split, &ft);
    int64_t kt_first, kt_end;
    fwd_key_tiles(pl, &a->L, w, ft.nr, split, &kt_first, &kt_end);
    int packed = 0;
    const int prefetch = fwd_prefetches(pl, &a->L);
    for (int64_t ktile = kt_first; ktile < kt_end; ktile++) {
        const int64_t j0 = ktile * pl->bk;
        const int64_t j1 = pl->Tk - j0 > pl->bk ? j0 + pl->bk : pl->Tk;
        int64_t ks, ke;
        const int kind = fwd_classify(pl, w, &ft, ktile, j0, j1, &ks, &ke);
        if (kind == TILE_SKIP)
            continue;
        if (!packed)
            fwd_pack_q(pl, w, a, &ft);
        packed = 1;
        if (ft.nt) {
            const int64_t run_end =
                kind == TILE_FULL && !pl->pages ? fwd_full_run_end(pl, w, &ft, &ktile, kt_end, ke) : ke + 1;
            fwd_nt_run(pl, w, a, &ft, ks, run_end, kind == TILE_PARTIAL);
            continue;
        }
        if (prefetch && ktile + 1 < kt_end) { /* the next key tile, while this one computes */
            const int64_t n1 = pl->Tk - j1 > pl->bk ? j1 + pl->bk : pl->Tk;
            if (ft.kb) /* a tile lies in one page */
                prefetch_rows(pl, kv_row(pl, a->k, ft.kb, j1), a->k->seq_stride, 0, n1 - j1, pl->Dk);
            if (ft.vb)
                prefetch_rows(pl, kv_row(pl, a->v, ft.vb, j1), a->v->seq_stride, 0, n1 - j1, pl->Dv);
        }
        fwd_wide_tile(pl, w, a, &ft, kind, ks, ke);
    }
    fwd_tile_end(pl, w, a, &ft, t, split);
}

/* Merges the nsplit partial states of tile t in split order (sdpa_merge_row):
 * M = max m_s, l = sum l_s exp(m_s - M), O = sum O_s exp(m_s - M) / l. */
void sdpa_fwd_merge(const plan *pl, fwd_ws *w, const fwd_args *a, int64_t t)
{
    const tile_layout *L = &a->L;
    const int Dv = (int)pl->Dv, n = (int)L->nsplit;
    const size_t pf = sdpa_fwd_partial_floats(pl, L), off_l = round_floats((size_t)tile_cols(L)),
                 off_o = 2 * off_l;
    int64_t b, hk, h0, i0;
    int nh, nr;
    sdpa_tile_coords(pl, L, t, &b, &hk, &h0, &nh, &i0, &nr);
    const float *first = a->partials + (size_t)(t * L->nsplit) * pf;
    float m[SDPA_MAX_SPLITS], l[SDPA_MAX_SPLITS], alpha[SDPA_MAX_SPLITS];
    const float *o[SDPA_MAX_SPLITS];
    for (int c = 0; c < nh * nr; c++) {
        for (int s = 0; s < n; s++) {
            m[s] = first[s * pf + c];
            l[s] = first[s * pf + off_l + c];
            o[s] = first + s * pf + off_o + (size_t)c * Dv;
        }
        w->l[c] = sdpa_merge_row(n, m, l, o, Dv, w->on + (size_t)c * Dv, &w->m[c], alpha);
        w->alpha[c] = w->l[c] == 0.0f ? 0.0f : 1.0f / w->l[c];
    }
    fwd_store(pl, a, w->on, w->m, w->l, w->alpha, b, h0, nh, i0, nr, w->rowc);
}

