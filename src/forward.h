/* SPDX-License-Identifier: MIT */
/* forward.h - what forward.c (one tile of the forward: Alg. 1 over its key tiles,
 * the split-KV merge) and forward_call.c (the entry points, the team, dense and
 * packed-sequence calls) share. Internal. */
#ifndef SDPA_FORWARD_H
#define SDPA_FORWARD_H

#include "driver.h"

/* One thread's workspace. */
typedef struct fwd_ws {
    float *qt, *s, *m, *l, *alpha;
    float *vs; /* 2 * ld floats: the logit variants' per-column scratch */
    float *on; /* the output accumulator O, natural layout [ncol][Dv] (row stride Dv) */
    float *kc, *vc, *rowc; /* bf16 / fp16 tensors only (else NULL): a key tile of K and of V
                              widened to fp32 ([block_k][Dk], [block_k][Dv]), and one row of Q
                              or O ([max(Dk, Dv)]) on its way in or out */
    uint32_t *qp, *pp, *vp; /* bf16 pair products only (sdpa_fwd_bf16_pairs; else NULL): the tile's
                               Q^T [Dk/2][ld], P^T [ceil(block_k/2)][ld] and a key tile of V
                               [ceil(block_k/2)][Dv] as bf16 pairs */
    /* The bf16 pair products' V cache (sdpa_fwd_vpairs_floats; else NULL): each whole key
     * tile of the kv head (vpc_pl, vpc_b, vpc_hk) packed in pairs once, [key tile][ceil(block_k
     * / 2)][Dv], for the query tiles that come next on this thread; vpc_state[kt] -1: not
     * packed yet, else pack_pairs_bf16's finiteness flag. */
    uint32_t *vpc;
    int8_t *vpc_state;
    const plan *vpc_pl;
    int64_t vpc_b, vpc_hk;
    int64_t *lo, *hi;
    /* A boolean mask or bias broadcast over heads (sdpa_fwd_reuses_tiles): each key
     * tile's classification for the query tile (cls_b, cls_i0, cls_nr) of cls_pl,
     * kept for the other heads, whose items come next (fwd_item_of). cls_kind[kt]
     * < 0: not classified yet. NULL otherwise. */
    int8_t *cls_kind;
    int64_t *cls_ks, *cls_ke;
    const plan *cls_pl;
    int64_t cls_b, cls_i0;
    int cls_nr;
} fwd_ws;

/* The tensors and tile layout of one problem (a dense call, or one sequence of a
 * packed call). */
typedef struct fwd_args {
    const sdpa_tensor *q, *k, *v;
    const sdpa_tensor_out *o, *lse;
    tile_layout L;
    float *partials; /* nsplit > 1: tiles * nsplit partial states */
} fwd_args;

/* Whether the problem's boolean mask and bias (at least one present) are the
 * same for every head: then a tile's classification is the same for all of its
 * heads, the items of one query tile run head after head, and each thread keeps
 * the classifications for the next head. */
int sdpa_fwd_reuses_tiles(const plan *pl);

/* The tile one item of the forward works on. */
typedef struct fwd_tile {
    int64_t b, hk, h0, i0;
    int nh, nr, ncol;
    const void *kb, *vb;  /* the kv head's K and V (NULL when Dk, Dv = 0), of type kv_dtype */
    int nt;               /* few columns: natural-layout path (fwd_nt_run) */
} fwd_tile;

/* Row j of a kv head of K or V (head_base: the head's row 0, or its offset in
 * page 0 when paged): in place, through the sequence's page table when paged. */
static inline const void *kv_row(const plan *pl, const sdpa_tensor *t, const void *head_base, int64_t j)
{
    if (!pl->pages)
        return elem_at(head_base, j * t->seq_stride, pl->kv_dtype);
    return elem_at(head_base,
                   (int64_t)pl->pages[j / pl->page_size] * t->batch_stride + (j % pl->page_size) * t->seq_stride,
                   pl->kv_dtype);
}

/* Whether the problem's prefill key tiles go through the ISA's bf16 pair products
 * (kt->bf16_dot: Q and K/V bf16, Dk even and > 0, Dv > 0): S^T = scale K Q^T from the
 * bf16 rows as they are, and P V with P rounded to bf16 (the only intermediate
 * rounded; docs/design.md, "What is rounded"). forward_pairs.c. */
int sdpa_fwd_bf16_pairs(const plan *pl);
/* A forward problem's block sizes (the dense call's plan, or a packed sequence's):
 * the table's pairs_block_q / pairs_block_k (where set and the descriptor gives none)
 * when it runs the pair products on wide tiles (more than nt_max_cols query columns
 * per head group). */
void sdpa_fwd_pairs_blocks(plan *pl);
/* Words of the pair buffers of one thread: *qp Q^T [Dk/2][ld], *pp P^T
 * [ceil(block_k/2)][ld], *vp V [ceil(block_k/2)][Dv] (all 0 without the pair products);
 * returns their total in floats, each rounded as carve() does. */
size_t sdpa_fwd_pair_floats(const plan *pl, size_t *qp, size_t *pp, size_t *vp);
/* Bytes of a kv head's V pairs up to which a thread caches them (FWD_VPAIRS_CACHE_BYTES),
 * and the floats of that cache (0: the problem does not run the pair products on wide
 * tiles, or its V is larger): the packed tiles and their state bytes. */
#define FWD_VPAIRS_CACHE_BYTES ((size_t)1 << 20)
size_t sdpa_fwd_vpairs_floats(const plan *pl, size_t *tiles);
/* The tile's Q^T in pairs (w->qp), straight from its bf16 rows. */
void sdpa_fwd_pairs_pack_q(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft);
/* One key tile [ks, ks + nk) on the pair products: S^T, the masks (kind TILE_PARTIAL)
 * and variants, the online softmax, P and V packed in pairs, O = alpha O + P V. Returns
 * 0, with P^T (fp32, w->s) and the softmax state updated but O not, when a partial
 * tile's V rows hold an inf or NaN (a masked -0 times inf would be NaN): the caller
 * finishes with the fp32 products, which skip the masked sentinel. */
int sdpa_fwd_pairs_tile(const plan *pl, fwd_ws *w, const fwd_args *a, const fwd_tile *ft, int kind, int64_t ks,
                        int nk);
/* Rows of the K and V conversion buffers (forward_ws.c): a wide tile's block_k keys,
 * and at least one step of the few-column path. */
int sdpa_fwd_cvt_rows(const plan *pl);
/* Floats added to the row stride of a wide tile's V rows in w->vc (0: none). */
int sdpa_fwd_v_pad(const plan *pl);
/* Key tiles of the problem (the classification cache's entries). */
size_t sdpa_fwd_key_tiles(const plan *pl);
/* Floats of one thread's workspace, and its carving. */
size_t sdpa_fwd_ws_floats(const plan *pl);
fwd_ws sdpa_fwd_ws_carve(const plan *pl, float *base);
/* Floats of one (tile, split) partial state (split-KV). */
size_t sdpa_fwd_partial_floats(const plan *pl, const tile_layout *L);
/* One (tile, split) of the forward: O and LSE of the tile, or its partial state. */
void sdpa_fwd_item(const plan *pl, fwd_ws *w, const fwd_args *a, int64_t t, int64_t split);
/* The merge of tile t's partial states into its O and LSE. */
void sdpa_fwd_merge(const plan *pl, fwd_ws *w, const fwd_args *a, int64_t t);

#endif /* SDPA_FORWARD_H */
