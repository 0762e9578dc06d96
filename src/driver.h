/* SPDX-License-Identifier: MIT */
/* driver.h - what the files of the ISA-neutral driver share (internal; nothing here
 * is exported): the plan of one call, the tile layout both passes use, the mask
 * geometry, the products cut by mask runs, and workspace carving.
 *
 *   validate.c  descriptor -> plan; tensor views: NULL, strides, overflow, aliasing
 *   mask.c      mask geometry: allowed key intervals, tile classes, masking a tile,
 *               key runs and bands (pure functions of the plan; no kernels)
 *   products.c  the products over a tile's keys, cut by mask runs and bands
 *   tiling.c    the tile layout (query tiles, GQA heads per tile, split-KV)
 *   forward.c   sdpa_forward: the streaming forward, decode path, split-KV merge
 *   backward.c  sdpa_backward: scheduling (per head or in waves), zeroing, D
 *   backward_tile.c  one (query tile, key tile) pair, and the statistics pass
 *   parallel.c  the only file that knows OpenMP
 *   api.c       sdpa_problem_init, sdpa_status_string
 * Per-ISA micro-kernels sit behind kernels.h; dispatch.c picks them. */
#ifndef SDPA_DRIVER_H
#define SDPA_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* ------------------------------------------------------------------- plan */

/* A validated call: sizes, scale, masks folded into intervals, tile sizes. */
typedef struct plan {
    int64_t B, Hq, Hkv, G, Tq, Tk, Dk, Dv; /* G = Hq / Hkv, query heads per kv head */
    float scale;
    int bottom_right;
    int64_t diag_offset; /* the descriptor's diagonal_offset, added to d */
    int64_t wl, wr; /* -1 = unbounded; causal folded into wr */
    const int32_t *kv_lengths;
    sdpa_bool_mask bm;
    sdpa_bias bias;
    int elem_mask;  /* boolean mask or bias present */
    float softcap;  /* 0: off */
    const float *slopes, *sinks; /* ALiBi slopes, sinks: Hq each, or NULL */
    float *dsinks;  /* the backward's d loss / d sinks, or NULL */
    int logit_variants; /* softcap or ALiBi: score tiles are transformed (sdpa_logit_variants_*) */
    const sdpa_seqs *seqs; /* packed sequences: this is the whole call's plan (sdpa_seq_plan gives
                              one sequence's), else NULL */
    const int32_t *pages;  /* one sequence's plan over a paged cache: its block table row (key j in
                              page pages[j / page_size]; K/V batch_stride = the page stride), else NULL */
    int64_t page_size;
    int causal;            /* the descriptor's causal, window_left/right (sub-plans renormalise) */
    int64_t wl_raw, wr_raw;
    sdpa_dtype q_dtype, kv_dtype, o_dtype; /* element types (the descriptor's) */
    int reduced;    /* some tensor is bf16 or fp16: tiles go through fp32 buffers (forward.c) */
    int strict;     /* SDPA_FPMATH_STRICT: no bf16 pair products (nothing rounded) */
    int bwd_pairs;  /* a 16-bit backward's fp32 group plan whose operands are bf16 values: the
                       wide tiles' five products run on bf16 pairs (backward_pairs.c) */
    int bq, bk, ld; /* tile sizes; ld = row stride of tile buffers (a multiple of kt->col_align) */
    int bq_given, bk_given; /* the descriptor's block_q / block_k were set (not the table's) */
    int nthreads;
    const sdpa_kernels *kt;
} plan;

/* ------------------------------------------------------------- validate.c */

/* One tensor view as validate.c checks it: n[3] rows (batch, head, seq) of len
 * contiguous elements of elem bytes at the given strides. */
typedef struct tensor_desc {
    const void *data;
    const int64_t *strides; /* batch, head, seq */
    int64_t n[3];
    int64_t len;
    size_t elem;
    int is_output;
    int present;
} tensor_desc;

/* Validates the descriptor and fills the plan (does not look at tensors); a
 * forward's plan (backward = 0) ignores the descriptor's dsinks, as sdpa.h says. */
sdpa_status sdpa_make_plan(const sdpa_problem *p, plan *pl, int backward);
/* Checks every tensor (NULL, strides, overflow, self-overlap) and aliasing
 * between outputs and inputs, other outputs and the mask operands. */
sdpa_status sdpa_check_tensors(const plan *pl, tensor_desc *t, int nt, const void *workspace,
                               size_t workspace_bytes);

/* One sequence's plan of a packed call (B = 1, its own Tq, Tk and windows; its
 * block table row and page-sized key tiles when paged). */
void sdpa_seq_plan(const plan *pl, int64_t b, plan *sub);
/* A paged plan's key tiles inside one page: bk becomes the largest divisor of the
 * page size <= bk (every tile the driver reads lies in one page); others unchanged.
 * Again after any later change of bk (the pair products' own blocks). */
void sdpa_page_tiles(plan *pl);
/* Whether the problem has wide (prefill) tiles, tiles of more query columns than the
 * decode path takes: more than nt_max_cols / G query rows per kv head (a packed
 * sequence's own plan: its Tq). The bf16 pair products run on those only. */
static inline int sdpa_wide_problem(const plan *pl)
{
    return pl->G > 0 && pl->Tq > pl->kt->nt_max_cols / pl->G;
}
/* Whether an fp32 Q over a bf16 K/V cache is rounded to bf16 for the whole problem:
 * on an ISA whose forward runs its wide tiles through the bf16 pair products
 * (kt->bf16_dot, Dk even, Dv > 0), in a problem with wide tiles (more than
 * nt_max_cols / G query rows). Then every forward tile, the few-column ones too, reads
 * Q rounded to nearest even (a subnormal to the zero of its sign, the pair products'
 * rounding), and the backward recomputes S and forms dK = dS^T Q from that same Q, so
 * that the LSE the forward returns and the P the backward recomputes come from one Q
 * (docs/design.md, "What is rounded"). forward_pairs.c. */
int sdpa_rounds_q_bf16(const plan *pl);
/* An fp32 value rounded as sdpa_rounds_q_bf16 says, in place over n floats. */
void sdpa_round_q_bf16(float *x, size_t n);
/* The rows (batch, head, seq) the Q-like and K-like views of the call span:
 * dense [B, H, T]; packed token lists [1, H, total]; paged caches
 * [num_blocks, Hkv, block_size]. */
void sdpa_view_rows(const plan *pl, int64_t nq[3], int64_t nk[3]);

/* ----------------------------------------------------------------- mask.c */

enum { TILE_SKIP = 0, TILE_FULL = 1, TILE_PARTIAL = 2 };

/* The row stride of a plan's tile buffers: block_q rounded up to the table's
 * col_align, plus the table's tile_pad when that is a multiple of 256 bytes. A
 * 64-query tile's rows 256 bytes apart put the 128 rows of one 16-column block
 * (the 8-lane ISAs' gemm panel of Q^T, the P^T rows one P V block broadcasts
 * from) in 16 of a 64-set L1's sets, where they evict each other and the K rows;
 * 320 bytes apart they use all 64 (docs/perf-notes.md, "The tile row stride"). */
static inline int plan_ld(int bq, const sdpa_kernels *kt)
{
    const int ld = (bq + kt->col_align - 1) / kt->col_align * kt->col_align;
    return ld % 64 == 0 ? ld + kt->tile_pad : ld;
}

/* The same reason for rows the 8-lane products read as their B operand from a tensor
 * (a forward tile's V, the backward's Q, dO and K): floats added to the row stride of
 * their copy, the table's tile_pad where rows of D floats would lie a multiple of 256
 * bytes apart (D a multiple of 64), else 0 (no copy). */
static inline int plan_row_pad(const plan *pl, int64_t D)
{
    return D > 0 && D % 64 == 0 ? pl->kt->tile_pad : 0;
}

/* Whether a tensor's rows, stride floats apart, are a multiple of 256 bytes apart
 * (those plan_row_pad's copies are for; others are read in place). */
static inline int rows_share_l1_sets(ptrdiff_t stride)
{
    return stride % 64 == 0;
}

/* n rows of len floats from src (row stride lds) to dst (row stride ldd). */
static inline void copy_rows(int n, int len, const float *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    for (int r = 0; r < n; r++)
        memcpy(dst + (ptrdiff_t)r * ldd, src + (ptrdiff_t)r * lds, (size_t)len * sizeof(float));
}

/* This batch's key length. */
static inline int64_t keys_of_batch(const plan *pl, int64_t b)
{
    return pl->kv_lengths ? pl->kv_lengths[b] : pl->Tk;
}

/* Allowed key interval [lo, hi] of query row i (empty when lo > hi) under the
 * window (causal folded in), alignment and key length tkb. */
static inline void row_range(const plan *pl, int64_t tkb, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t d = (pl->bottom_right ? tkb - pl->Tq : 0) + pl->diag_offset;
    int64_t l = 0, h = tkb - 1;
    if (pl->wl >= 0 && i + d - pl->wl > l)
        l = i + d - pl->wl;
    if (pl->wr >= 0 && i + d + pl->wr < h)
        h = i + d + pl->wr;
    *lo = l;
    *hi = h;
}

/* A tile's columns are the rows [i0, i0+nr) of the query heads [h0, h0+nh)
 * (column g*nr + ii is head h0+g, row i0+ii); lo/hi are the rows' intervals.
 * Against keys [j0, j1): the kind of tile (TILE_*) and the trimmed key
 * interval [*ks, *ke] that any column may see. */
int sdpa_classify_tile(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, const int64_t *lo,
                       const int64_t *hi, int64_t j0, int64_t j1, int64_t *ks, int64_t *ke);
/* Applies every mask to a score tile (keys ks.. x the tile's columns, key k,
 * column c at S[k*rs_key + c*cs_col]): -inf where disallowed, + bias where
 * allowed. Disallowed bias entries are never read. */
void sdpa_mask_tile(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, const int64_t *lo,
                    const int64_t *hi, int64_t ks, int nk, float *S, ptrdiff_t rs_key, ptrdiff_t cs_col);

/* How the products over a tile's keys [ks, ke] are cut (see mask.c): the key
 * runs seg[0..1) masked, [1..2) allowed by every row, [2..3) masked; banded:
 * the masked runs go in bands of kt->band_keys keys, each over the columns its
 * keys may see. Depends on the shape only. */
typedef struct tile_keys {
    int64_t ks;             /* first key of the tile */
    int64_t seg[4];         /* key runs */
    int banded;             /* the masked runs go in bands */
    int nr;                 /* rows of the tile (banded: its columns) */
    int band_keys, col_align; /* from the kernel table */
    const int64_t *lo, *hi; /* the rows' allowed key intervals */
} tile_keys;

void sdpa_tile_keys_init(const plan *pl, tile_keys *tk, const int64_t *lo, const int64_t *hi, int kind, int nh,
                         int nr, int64_t ks, int64_t ke);
/* For the keys [jb, je] of a banded tile: c[0..3) the columns some key of the
 * band may see, rounded out to col_align; [c[1], c[2]) those every key sees,
 * rounded in (empty: c[1] == c[2] == c[0]). */
void sdpa_band_cols(const tile_keys *tk, int64_t jb, int64_t je, int c[4]);

/* ------------------------------------------------------------- products.c */

/* Where a tile's keys and columns sit in a product C (+)= alpha A B. */
enum {
    KEYS_M_COLS_N, /* S^T = K Q^T, dP^T = V dO^T: keys are C's rows, columns C's columns */
    KEYS_M_COLS_K, /* dV += P^T dO, dK += dS^T Q: keys are C's rows, columns the inner dimension */
    KEYS_K_COLS_M  /* dQ += dS K: keys are the inner dimension, columns C's rows */
};

void sdpa_gemm_part(const sdpa_kernels *kt, int where, int64_t koff, int nk, int c0, int nc, int other, float alpha,
                    const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C,
                    ptrdiff_t ldc, int flags, const float *c_row_scale);
void sdpa_gemm_keys(const sdpa_kernels *kt, const tile_keys *tk, int where, int ncols, int other, float alpha,
                    const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C,
                    ptrdiff_t ldc, int flags, int skip_flag);
/* The masked score tile S^T = scale K Q^T (the tile's keys x its columns, row
 * stride pl->ld), with the logit variants (G, scratch: see
 * sdpa_logit_variants_t) before the bias and the masks. */
void sdpa_score_tile(const plan *pl, const tile_keys *tk, int kind, int64_t b, int64_t h0, int nh, int64_t i0,
                     int nr, int nk, const float *krows, ptrdiff_t ldk, const float *qt, float *s, float *G,
                     float *scratch);

/* ------------------------------------------------------------- variants.c */

/* Softcap (G non-NULL: also its derivative 1 - tanh^2, row stride ld) and ALiBi
 * on a transposed score tile S^T (nk keys from ks x the tile's columns, row
 * stride ld), before the bias and the masks. scratch: 2 * nh * nr floats. */
void sdpa_logit_variants_t(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, int64_t ks, int nk,
                           float *S, ptrdiff_t ld, float *G, float *scratch);
/* The same on a natural score tile S (the tile's columns as rows x nk keys from
 * j0, row stride lds). */
void sdpa_logit_variants_n(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, int64_t j0, int nk,
                           float *S, ptrdiff_t lds, float *scratch);
/* With sinks: the online softmax's starting state of the tile's columns is the
 * sink's, m = s_h and l = 1 (l = 0 for s_h = -inf). No-op without sinks. */
void sdpa_sink_state(const plan *pl, int64_t h0, int nh, int nr, float *m, float *l);

/* --------------------------------------------------------------- merge.c */

/* The merge of n partial states (m_s, l_s, O_s unnormalised) of one row over
 * disjoint key sets: M = max m_s, a_s = e^(m_s - M) (0 where m_s = -inf),
 * L = sum_s l_s a_s, out[d] = sum_s a_s O_s[d] (unnormalised), each sum in
 * increasing s. Returns L; *M_out = M; alpha: n floats of scratch (the a_s).
 * l == NULL: normalised states (O, LSE), l_s = 1, and the O of a state with
 * m_s = -inf is not read. out may be one of the o[s] (in place). */
float sdpa_merge_row(int n, const float *m, const float *l, const float *const *o, int64_t dv, float *out,
                     float *M_out, float *alpha);

/* --------------------------------------------------------------- tiling.c */

/* How both passes cut the work: a tile holds rows [i0, i0+nr) of up to hpt
 * query heads of one GQA group (several heads share a tile when Tq is short,
 * e.g. decode, so that each K/V tile is read once for the whole group), and
 * when there are few tiles the forward splits the keys into nsplit chunks whose
 * partial (m, l, O) are merged in a fixed order. Everything here depends on the
 * shape only, never on the thread count. */
/* The most key splits of a tile (split-KV). */
#define SDPA_MAX_SPLITS 64

typedef struct tile_layout {
    int64_t rows;   /* rows per tile (nr) */
    int64_t hpt;    /* heads per tile */
    int64_t nrt;    /* row tiles per head */
    int64_t ngt;    /* head tiles per kv head */
    int64_t tiles;  /* B * Hkv * ngt * nrt */
    int64_t nkt;    /* key tiles over [0, Tk) */
    int64_t nsplit; /* key chunks per tile (forward) */
} tile_layout;

tile_layout sdpa_tile_layout(const plan *pl);
/* Tile t -> (b, kv head, first head of the tile, heads, first row, rows). */
void sdpa_tile_coords(const plan *pl, const tile_layout *L, int64_t t, int64_t *b, int64_t *hk, int64_t *h0,
                      int *nh, int64_t *i0, int *nr);

/* Columns of a tile (heads per tile x rows per tile). */
static inline int64_t tile_cols(const tile_layout *L)
{
    return L->rows * L->hpt;
}

/* ------------------------------------------------------------- workspace */

#define SDPA_ALIGN_BYTES 64

/* n floats rounded up to whole aligned blocks. */
static inline size_t round_floats(size_t n)
{
    const size_t a = SDPA_ALIGN_BYTES / sizeof(float);
    return (n + a - 1) / a * a;
}

/* The next n floats of a workspace (rounded up to the alignment); *base moves past them. */
static inline float *carve(float **base, size_t n)
{
    float *p = *base;
    *base += round_floats(n);
    return p;
}

/* The next n int64 of a workspace (as 2n floats). */
static inline int64_t *carve_i64(float **base, size_t n)
{
    return (int64_t *)(void *)carve(base, 2 * n);
}

/* floats * sizeof(float) bytes aligned to SDPA_ALIGN_BYTES; NULL when the size
 * overflows or the allocation fails. Free with free(). */
float *sdpa_alloc_floats(size_t floats);
/* The bytes a caller-owned workspace of `floats` floats needs (with room to
 * align any pointer; 0 for 0 floats), or SDPA_ERR_SIZE_OVERFLOW. */
sdpa_status sdpa_workspace_bytes(size_t floats, size_t *bytes);
/* The aligned start of a caller's workspace of `bytes` bytes for `floats` floats:
 * SDPA_ERR_NULL_ARGUMENT, SDPA_ERR_WORKSPACE_TOO_SMALL or SDPA_ERR_SIZE_OVERFLOW
 * otherwise. */
sdpa_status sdpa_workspace_take(void *workspace, size_t bytes, size_t floats, float **ws);
/* The workspace of an entry point: with own (sdpa_forward, sdpa_backward) one it
 * allocates (SDPA_ERR_OUT_OF_MEMORY; free() it after the call), otherwise the
 * caller's, as sdpa_workspace_take (never an allocation of its own). */
sdpa_status sdpa_workspace_acquire(int own, void *workspace, size_t bytes, size_t floats, float **ws);

/* Row i of head h of batch b of a tensor view; NULL for a view without data
 * (an empty tensor may have none: no arithmetic on a NULL pointer). */
static inline const float *row_in(const sdpa_tensor *t, int64_t b, int64_t h, int64_t i)
{
    return t->data ? (const float *)t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride : NULL;
}

static inline float *row_out(const sdpa_tensor_out *t, int64_t b, int64_t h, int64_t i)
{
    return t->data ? (float *)t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride : NULL;
}

/* Bytes of one element of a tensor type. */
static inline size_t dtype_bytes(sdpa_dtype t)
{
    return t == SDPA_DTYPE_F32 ? sizeof(float) : 2;
}

/* p advanced by n elements of type t (p may be NULL only when n is 0). */
static inline const void *elem_at(const void *p, int64_t n, sdpa_dtype t)
{
    return p ? (const void *)((const char *)p + n * (int64_t)dtype_bytes(t)) : NULL;
}

/* Row i of head h of batch b of a view whose elements have type t. */
static inline const void *row_in_t(const sdpa_tensor *t, sdpa_dtype ty, int64_t b, int64_t h, int64_t i)
{
    return elem_at(t->data, b * t->batch_stride + h * t->head_stride + i * t->seq_stride, ty);
}

static inline void *row_out_t(const sdpa_tensor_out *t, sdpa_dtype ty, int64_t b, int64_t h, int64_t i)
{
    return (void *)elem_at(t->data, b * t->batch_stride + h * t->head_stride + i * t->seq_stride, ty);
}

/* ------------------------------------------------------------- parallel.c */

/* The threads of a call: the request (0: OpenMP's default), at most 4 per
 * processor. 1 without OpenMP. A request of 1 never touches the runtime. */
int sdpa_threads_for_call(int requested);

/* Runs body(ctx, tid, team) on a team of nthreads threads (nthreads <= 1, or no
 * OpenMP: called directly on the caller's thread, without entering the OpenMP
 * runtime at all). */
typedef void (*sdpa_team_fn)(void *ctx, int tid, int team);
void sdpa_parallel(int nthreads, sdpa_team_fn body, void *ctx);

/* Inside a team body: items [0, n) shared among the team, each fn(arg, item)
 * once (arg: the calling thread's own context), in increasing order per thread
 * (dynamic: one item at a time to whichever thread is free; static: contiguous
 * blocks). Every thread of the team calls it with the same n; a barrier follows
 * unless nowait. team == 1: a plain loop, no OpenMP. */
typedef void (*sdpa_item_fn)(void *arg, int64_t item);
void sdpa_for_dynamic(int team, int64_t n, sdpa_item_fn fn, void *arg, int nowait);
void sdpa_for_static(int team, int64_t n, sdpa_item_fn fn, void *arg);

#endif /* SDPA_DRIVER_H */
