/* SPDX-License-Identifier: MIT */
/* backward.h - what backward.c (scheduling, zeroing, D) and backward_tile.c (one
 * pair of tiles, the statistics pass) share. Internal. */
#ifndef SDPA_BACKWARD_H
#define SDPA_BACKWARD_H

#include <math.h>

#include "driver.h"

/* Bytes of K, V, dK and dV rows per pass of the per-head order (sdpa_backward). */
#define BWD_KV_CHUNK_BYTES (1 << 20)
/* dK + dV of at least this many bytes, each row written once (kv_once), are
 * stored with non-temporal stores (SDPA_GEMM_STREAM_C): they would not stay in
 * the last-level cache anyway. Smaller ones stay in cache for whoever reads
 * them next. */
#define BWD_STREAM_KV_BYTES ((int64_t)16 << 20)
/* |LSE| from which the backward recomputes a row's max and sum (the statistics
 * pass): float LSE = m + log(l) keeps log(l) only to ulp(LSE)/2, 2^-17 here,
 * which is the relative error it would give P; below, LSE is used as it is. */
#define BWD_LSE_EXACT_LIMIT 256.0f

/* A row whose LSE is too coarse for P = exp(S - LSE): the statistics pass
 * recomputes its max, log-sum and D. */
static inline int lse_needs_stats(float lse)
{
    return isfinite(lse) && fabsf(lse) >= BWD_LSE_EXACT_LIMIT;
}

/* One thread's workspace. */
typedef struct bwd_ws {
    float *qt, *dot, *p, *dp, *lse, *dd;
    float *rm, *rl, *ralpha; /* per column: a recomputed row max and sum (bwd_tile_stats), and the
                                max the scores are shifted by before P (0: not shifted) */
    double *rd, *rs;         /* per column: the running sums of P dP and of P (bwd_tile_stats;
                                the float l loses P's below ulp(1)) */
    float *dhi;              /* per column: the D that dP is shifted by before dS (0: not
                                shifted; then dd holds D, else the rest of D) */
    int shift;               /* some column of the packed tile is shifted */
    int dshift;              /* some column's dP is shifted */
    float *qn, *don; /* Q and dO rows packed [ncol][D + pad] (row stride D + plan_row_pad) when a
                        tile spans several heads or plan_row_pad is set */
    float *kc;       /* with plan_row_pad(Dk): a pair's K rows [nk][Dk + pad] for dQ += dS K */
    float *g;        /* with softcap: its derivative 1 - tanh^2 of the pair's scores, like p */
    float *vs;       /* 2 * ld floats: the logit variants' per-column scratch */
    int64_t *lo, *hi;
    /* bf16 pair products only (bwd_args.pairs; else NULL): Q^T and dO^T in pairs along
     * head_dim ([D/2][ld]), Q and dO rows in pairs along the tile's columns ([ncol/2][D]),
     * the pair's K rows in pairs along the keys ([nk/2][Dk]) and dS in pairs along the
     * keys ([nk/2][ld]); P^T and dS^T rounded to bf16 ([nk][ld], the column after an
     * odd ncol zero); with dot_pairs_cols, the tile's O rows rounded to bf16 ([ncol][Dv]),
     * O^T in pairs ([Dv/2][ld]) and their D on the pair products ([ld] floats) */
    uint32_t *qtp, *dotp, *qp, *dop, *kp, *dsp, *otp;
    uint16_t *p16, *ds16, *o16;
    float *dpair;
    int64_t packed_tile; /* the query tile whose Q^T, dO^T, LSE, D (and packed rows) are in
                            qt, dot, lse, dd, qn, don; -1: none */
} bwd_ws;

/* What the pairs of one call share. */
typedef struct bwd_args {
    const sdpa_tensor *q, *k, *v, *o, *lse, *dout;
    const sdpa_tensor_out *dq, *dk, *dv;
    float *D; /* [B, Hq, Tq] contiguous: rowsum(dO * O), written before the pairs of its rows
                 (sum_j P_j dP_j rounded instead for the rows the statistics pass takes) */
    float *row_max, *row_logsum, *row_dlo; /* [B, Hq, Tq]: m, log(l) and the rest of D
                                    (D - fl(D)) recomputed for the rows with |LSE| >=
                                    BWD_LSE_EXACT_LIMIT (the statistics pass), else unused */
    int nt;   /* few-column tiles: S^T and dP^T (and D) by gemm_nt, see sdpa_backward */
    int kv_once; /* one query tile per (batch, kv head): every dK/dV row gets all of its
                    terms from one pair, which writes it (no zeroing first) */
    int kv_stream; /* kv_once, and dK + dV >= BWD_STREAM_KV_BYTES: written with SDPA_GEMM_STREAM_C */
    int pairs; /* the plan's bwd_pairs and wide tiles (not nt): the five products of a pair on
                  bf16 pairs (kt->gemm_bf16_pairs), P and dS rounded to bf16 before theirs */
    const uint16_t *k16, *v16; /* with pairs: the bf16 K and V rows the widened k, v hold (key j
                                  of the one (batch, kv head) at k16 + j * ldk16) */
    ptrdiff_t ldk16, ldv16;
} bwd_args;

/* Floats of one thread's workspace, and its carving. */
size_t sdpa_bwd_ws_floats(const plan *pl);
bwd_ws sdpa_bwd_ws_carve(const plan *pl, float *base);

/* Pair (query tile r, key tile c) of (batch, kv head) bh: adds its terms to dQ
 * of the query tile and to dK, dV of the key tile (or writes them, kv_once). */
void sdpa_bwd_pair(const plan *pl, bwd_ws *w, const bwd_args *a, const tile_layout *L, int64_t bh, int64_t r,
                   int64_t c);

/* The statistics pass of query tile r of (batch, kv head) bh: for its rows with
 * |LSE| >= BWD_LSE_EXACT_LIMIT, the max, log-sum and D recomputed over every key
 * tile (nothing to do, and no cost but reading LSE, otherwise). */
void sdpa_bwd_tile_stats(const plan *pl, bwd_ws *w, const bwd_args *a, const tile_layout *L, int64_t bh,
                         int64_t r);

/* Whether a 16-bit backward's fp32 group problems may run their products on bf16
 * pairs: the ISA's bwd_bf16_dot, Q, K/V and O (so dO) all bf16, even head dims. The
 * typed backward then sets bwd_pairs on a group's plan when its operands are finite. */
int sdpa_bwd_bf16_pairs(const plan *pl);

/* The views of a backward call (or of one problem of it). */
typedef struct bwd_views {
    const sdpa_tensor *q, *k, *v, *o, *lse, *dout;
    const sdpa_tensor_out *dq, *dk, *dv;
    const uint16_t *k16, *v16; /* NULL, or (a bwd_pairs group problem) the bf16 rows of k, v */
    ptrdiff_t ldk16, ldv16;
} bwd_views;

/* Nothing to compute but zeros (Dv = 0, or no rows). */
int sdpa_bwd_trivial(const plan *pl);
/* The fp32 backward of one non-trivial problem: its workspace (floats, and the
 * rounded length of its per-row arrays), and the run on the whole team (dsinks
 * added to dsinks_acc[h] when the plan has sinks). backward.c. */
sdpa_status sdpa_bwd_workspace_floats(const plan *pl, size_t *floats, size_t *nD_round);
void sdpa_bwd_run(const plan *pl, const bwd_views *x, float *ws, size_t nD_round, double *dsinks_acc);

/* The backward of one non-trivial problem with a bf16 / fp16 tensor
 * (backward_typed.c): per (batch, kv head) group its rows widened into fp32
 * buffers, sdpa_bwd_run on them, the gradients narrowed into their tensors. */
sdpa_status sdpa_bwd_typed_floats(const plan *pl, size_t *floats);
void sdpa_bwd_typed(const plan *pl, const bwd_views *x, float *ws, double *dsinks_acc);

#endif /* SDPA_BACKWARD_H */
