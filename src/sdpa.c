/* SPDX-License-Identifier: MIT */
/* sdpa.c - the ISA-neutral driver: validation, masks, tiling, threading.
 *
 * Forward (FlashAttention-2, Dao 2023, Alg. 1), per (batch, query head, query
 * tile), streaming over key tiles:
 *     Q^T tile  <- transpose(Q rows)                    Dk x BQ
 *     S^T       <- scale * K_tile Q^T                   BK x BQ   (kernels.gemm)
 *     mask S^T on tiles that need it (-inf, + bias)
 *     m, l, alpha, P^T <- online softmax of S^T         (kernels.online_softmax)
 *     O^T       <- O^T * alpha + V_tile^T P^T           Dv x BQ
 *     O = (O^T / l)^T,  LSE = m + log(l)   (l = 0: O = 0, LSE = -inf)
 * Scores are kept transposed (keys x queries) so that everything per query is a
 * vector along the contiguous dimension (see kernels.h). Tiles with few query
 * columns (decode) use the natural layout instead and go through the keys in
 * steps of 16: S = Q K^T by dot products (kernels.gemm_nt), a row-wise softmax,
 * O = alpha O + P V (kernels.gemm_stream), or all three in one call
 * (kernels.attend_rows) over a run of unmasked tiles; these kernels read every
 * K and V row whole, in address order, which is what keeps decode at the
 * memory bandwidth (fwd_nt_run). Short Tq packs several heads of a GQA group
 * into one tile; few tiles split the keys (split-KV) and merge the partial
 * (m, l, O) in a fixed order.
 *
 * Backward (Alg. 2) works on (query tile, key tile) pairs of each
 * (batch, kv head); the query tiles of every head of a GQA group form the rows.
 * Pair (r, c) adds to dQ[r] and to dK[c], dV[c]. Pairs are run in anti-diagonal
 * waves d = r + c: the pairs of one wave touch distinct dQ and dK/dV tiles, so
 * they run in parallel without atomics, and every tile receives its
 * contributions in increasing order of the other index. With enough heads,
 * each thread runs whole heads row by row instead, which keeps that per-tile
 * order. The result is bitwise identical for any thread count.
 *
 * Masks: the window (causal included), kv_lengths and alignment give each query
 * row one contiguous allowed key interval [lo_i, hi_i], nondecreasing in i.
 * Tiles outside every interval are skipped before any arithmetic; tiles inside
 * every interval with no boolean mask or bias need no per-element work; the rest
 * ("partial") are masked element by element, and their products skip masked
 * terms so that a NaN in a masked K/V row or bias entry is never read into a
 * result. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kernels.h"

#if HAVE_OPENMP
#include <omp.h>
#endif

#define ALIGN_BYTES 64
#define BWD_KV_CHUNK_BYTES (1 << 20) /* see sdpa_backward: K, V, dK, dV rows per pass of a head */
/* dK + dV of at least this many bytes, each row written once (kv_once), are
 * stored with non-temporal stores (SDPA_GEMM_STREAM_C): they would not stay in
 * the last-level cache anyway, and skipping the read-for-ownership of every
 * line took the decode backward from 39.5 to 58.7 GFLOP/s (AVX-512, 2 threads, best of 3).
 * Smaller ones are left in cache for whoever reads them next. */
#define BWD_STREAM_KV_BYTES ((int64_t)16 << 20)
/* |LSE| from which the backward recomputes a row's max and sum (bwd_tile_stats):
 * float LSE = m + log(l) keeps log(l) only to ulp(LSE)/2, 2^-17 here, which
 * is the relative error it would give P; below, LSE is used as it is. */
#define BWD_LSE_EXACT_LIMIT 256.0f

typedef struct plan {
    int64_t B, Hq, Hkv, G, Tq, Tk, Dk, Dv;
    float scale;
    int bottom_right;
    int64_t wl, wr; /* -1 = unbounded; causal folded into wr */
    const int32_t *kv_lengths;
    sdpa_bool_mask bm;
    sdpa_bias bias;
    int elem_mask; /* boolean mask or bias present */
    int bq, bk, ld; /* tile sizes; ld = row stride of tile buffers */
    int nthreads;
    const sdpa_kernels *kt;
} plan;

/* ---------------------------------------------------------------- validation */

/* Threads for a call: the request (0: OpenMP's default), at most 4 per
 * processor: more never helps, and asking libgomp for thousands of threads can
 * make it print and exit the process when it cannot create them. */
static int64_t clamp_threads(int n)
{
#if HAVE_OPENMP
    int64_t t = n > 0 ? n : omp_get_max_threads();
    const int64_t most = 4 * (int64_t)(omp_get_num_procs() > 0 ? omp_get_num_procs() : 1);
    return t < 1 ? 1 : t > most ? most : t;
#else
    (void)n;
    return 1;
#endif
}

/* [lo, hi) byte span of a tensor of n[0..3] rows of len contiguous floats. */
typedef struct span {
    uintptr_t lo, hi;
} span;

static int tensor_span(const void *data, size_t elem, const int64_t n[3], const int64_t s[3],
                       int64_t len, span *out)
{
    out->lo = out->hi = 0;
    if (n[0] == 0 || n[1] == 0 || n[2] == 0 || len == 0)
        return 0;
    int64_t ext = len, t;
    for (int i = 0; i < 3; i++) {
        if (__builtin_mul_overflow(n[i] - 1, s[i], &t) || __builtin_add_overflow(ext, t, &ext))
            return -1;
    }
    int64_t bytes;
    if (__builtin_mul_overflow(ext, (int64_t)elem, &bytes) || bytes > PTRDIFF_MAX)
        return -1;
    out->lo = (uintptr_t)data;
    out->hi = (uintptr_t)data + (uintptr_t)bytes;
    return 0;
}

static int spans_overlap(span a, span b)
{
    return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* An output must not overlap itself: sorting its nontrivial dimensions by
 * stride, each stride must step over everything the smaller ones cover. */
static int output_self_overlaps(const int64_t n[3], const int64_t s[3], int64_t len)
{
    int64_t dims[4][2];
    int nd = 0;
    for (int i = 0; i < 3; i++)
        if (n[i] > 1) {
            dims[nd][0] = s[i];
            dims[nd][1] = n[i];
            nd++;
        }
    for (int i = 1; i < nd; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && dims[j][0] < dims[j - 1][0]; j--) {
            int64_t t0 = dims[j][0], t1 = dims[j][1];
            dims[j][0] = dims[j - 1][0];
            dims[j][1] = dims[j - 1][1];
            dims[j - 1][0] = t0;
            dims[j - 1][1] = t1;
        }
    int64_t covered = len; /* elements spanned by the inner dimensions */
    for (int i = 0; i < nd; i++) {
        if (dims[i][0] < covered)
            return 1;
        covered = dims[i][0] * (dims[i][1] - 1) + covered;
    }
    return 0;
}

typedef struct tensor_desc {
    const void *data;
    const int64_t *strides; /* batch, head, seq */
    int64_t n[3];
    int64_t len;
    size_t elem;
    int is_output;
    int present;
} tensor_desc;

static sdpa_status check_tensor(const tensor_desc *t, span *sp)
{
    const int64_t *s = t->strides;
    if (s[0] < 0 || s[1] < 0 || s[2] < 0)
        return SDPA_ERR_BAD_STRIDE;
    const int empty = t->n[0] == 0 || t->n[1] == 0 || t->n[2] == 0 || t->len == 0;
    if (!empty && !t->data)
        return SDPA_ERR_NULL_ARGUMENT;
    if (tensor_span(t->data, t->elem, t->n, s, t->len, sp))
        return SDPA_ERR_SIZE_OVERFLOW;
    if (t->is_output && !empty && output_self_overlaps(t->n, s, t->len))
        return SDPA_ERR_BAD_STRIDE;
    return SDPA_OK;
}

/* Validates the descriptor and fills the plan. Does not look at tensors. */
static sdpa_status make_plan(const sdpa_problem *p, plan *pl)
{
    if (!p)
        return SDPA_ERR_NULL_ARGUMENT;
    if (p->struct_size != sizeof(sdpa_problem) || p->reserved0 != 0)
        return SDPA_ERR_BAD_DESCRIPTOR;
    for (size_t i = 0; i < sizeof p->reserved / sizeof p->reserved[0]; i++)
        if (p->reserved[i])
            return SDPA_ERR_BAD_DESCRIPTOR;
    if ((unsigned)p->causal > SDPA_CAUSAL_BOTTOM_RIGHT ||
        (unsigned)p->window_alignment > SDPA_ALIGN_BOTTOM_RIGHT ||
        (p->use_default_scale != 0 && p->use_default_scale != 1) || (int)p->isa < SDPA_ISA_AUTO ||
        (int)p->isa >= SDPA_ISA_COUNT)
        return SDPA_ERR_BAD_DESCRIPTOR;
    if (p->batch < 0 || p->q_heads < 0 || p->kv_heads < 0 || p->q_len < 0 || p->kv_len < 0 ||
        p->head_dim_qk < 0 || p->head_dim_v < 0)
        return SDPA_ERR_NEGATIVE_SIZE;
    /* Never divide by kv_heads before this check (Hq = Hkv = 0 is legal). */
    if ((p->kv_heads == 0 && p->q_heads > 0) || (p->kv_heads > 0 && p->q_heads % p->kv_heads))
        return SDPA_ERR_HEAD_GROUPING;
    /* With the default scale, .scale must stay 0 as sdpa_problem_init() left it:
     * a value set there while use_default_scale is still 1 would be ignored. */
    if (p->use_default_scale ? (p->head_dim_qk == 0 || p->scale != 0.0f) : !isfinite(p->scale))
        return SDPA_ERR_BAD_SCALE;
    if (p->window_left < SDPA_WINDOW_UNBOUNDED || p->window_right < SDPA_WINDOW_UNBOUNDED)
        return SDPA_ERR_BAD_WINDOW;
    if (p->num_threads < 0)
        return SDPA_ERR_BAD_THREADS;
    if (p->block_q < 0 || p->block_q > SDPA_MAX_BLOCK || p->block_k < 0 || p->block_k > SDPA_MAX_BLOCK)
        return SDPA_ERR_BAD_BLOCK_SIZE;
    if (p->head_dim_qk > INT32_MAX || p->head_dim_v > INT32_MAX)
        return SDPA_ERR_SIZE_OVERFLOW;
    if (p->bool_mask.data && (p->bool_mask.batch_stride < 0 || p->bool_mask.head_stride < 0 ||
                              p->bool_mask.query_stride < 0 || p->bool_mask.key_stride < 0))
        return SDPA_ERR_BAD_STRIDE;
    if (p->bias.data && (p->bias.batch_stride < 0 || p->bias.head_stride < 0 ||
                         p->bias.query_stride < 0 || p->bias.key_stride < 0))
        return SDPA_ERR_BAD_STRIDE;
    if (p->kv_lengths)
        for (int64_t b = 0; b < p->batch; b++)
            if (p->kv_lengths[b] < 0 || p->kv_lengths[b] > p->kv_len)
                return SDPA_ERR_BAD_KV_LENGTH;
    const sdpa_kernels *kt = sdpa_kernels_get(p->isa);
    if (!kt)
        return SDPA_ERR_ISA_UNAVAILABLE;

    memset(pl, 0, sizeof *pl);
    pl->B = p->batch;
    pl->Hq = p->q_heads;
    pl->Hkv = p->kv_heads;
    pl->G = p->kv_heads ? p->q_heads / p->kv_heads : 0;
    pl->Tq = p->q_len;
    pl->Tk = p->kv_len;
    pl->Dk = p->head_dim_qk;
    pl->Dv = p->head_dim_v;
    pl->scale = p->use_default_scale ? (float)(1.0 / sqrt((double)p->head_dim_qk)) : p->scale;
    pl->bottom_right = p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
                       (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
    pl->wl = p->window_left;
    pl->wr = p->window_right;
    /* |i + d| <= Tq + Tk, so a wider window limits nothing: treat it as
     * unbounded (this also keeps i + d +- window from overflowing). */
    if (pl->wl > pl->Tq && pl->wl - pl->Tq > pl->Tk)
        pl->wl = SDPA_WINDOW_UNBOUNDED;
    if (pl->wr > pl->Tq && pl->wr - pl->Tq > pl->Tk)
        pl->wr = SDPA_WINDOW_UNBOUNDED;
    if (p->causal != SDPA_CAUSAL_NONE)
        pl->wr = (pl->wr == SDPA_WINDOW_UNBOUNDED || pl->wr > 0) ? 0 : pl->wr;
    pl->kv_lengths = p->kv_lengths;
    pl->bm = p->bool_mask;
    pl->bias = p->bias;
    pl->elem_mask = p->bool_mask.data != NULL || p->bias.data != NULL;
    pl->kt = kt;
    pl->bq = p->block_q ? p->block_q : kt->block_q;
    pl->bk = p->block_k ? p->block_k : kt->block_k;
    pl->ld = (pl->bq + 15) & ~15;
    pl->nthreads = (int)clamp_threads(p->num_threads);
    return SDPA_OK;
}

/* Mask operands as tensor descriptors, for overflow and aliasing checks. */
static sdpa_status mask_spans(const plan *pl, span sp[3])
{
    memset(sp, 0, 3 * sizeof(span));
    if (pl->kv_lengths && pl->B > 0) {
        sp[0].lo = (uintptr_t)pl->kv_lengths;
        sp[0].hi = sp[0].lo + (uintptr_t)pl->B * sizeof(int32_t);
    }
    const int64_t n4[4] = {pl->B, pl->Hq, pl->Tq, pl->Tk};
    for (int which = 0; which < 2; which++) {
        const void *data = which ? (const void *)pl->bias.data : (const void *)pl->bm.data;
        if (!data)
            continue;
        const int64_t s4[4] = {
            which ? pl->bias.batch_stride : pl->bm.batch_stride,
            which ? pl->bias.head_stride : pl->bm.head_stride,
            which ? pl->bias.query_stride : pl->bm.query_stride,
            which ? pl->bias.key_stride : pl->bm.key_stride};
        if (n4[0] == 0 || n4[1] == 0 || n4[2] == 0 || n4[3] == 0)
            continue;
        int64_t ext = 1, t;
        for (int i = 0; i < 4; i++)
            if (__builtin_mul_overflow(n4[i] - 1, s4[i], &t) || __builtin_add_overflow(ext, t, &ext))
                return SDPA_ERR_SIZE_OVERFLOW;
        const size_t elem = which ? sizeof(float) : 1;
        if (ext > PTRDIFF_MAX / (int64_t)elem)
            return SDPA_ERR_SIZE_OVERFLOW;
        sp[1 + which].lo = (uintptr_t)data;
        sp[1 + which].hi = (uintptr_t)data + (uintptr_t)ext * elem;
    }
    return SDPA_OK;
}

/* 1 if delta (elements) = sum_k d_k s_k + e with |d_k| <= n_k - 1 over the
 * dimensions [0, k] (sorted by stride, each stride stepping over everything the
 * smaller ones cover) and |e| < len: i.e. two rows of the layout, one shifted
 * by delta, share an element. Only d_k in {floor, floor + 1} of delta / s_k can
 * leave a remainder the smaller dimensions can reach, so this visits at most
 * 2^3 paths. */
static int layout_reaches(int64_t delta, const int64_t (*dims)[2], int k, int64_t len)
{
    if (k < 0)
        return delta > -len && delta < len;
    const int64_t st = dims[k][0], n = dims[k][1];
    int64_t q = delta / st;
    if (delta % st != 0 && delta < 0)
        q--; /* floor */
    for (int64_t d = q; d <= q + 1; d++)
        if (d >= -(n - 1) && d <= n - 1 && layout_reaches(delta - d * st, dims, k - 1, len))
            return 1;
    return 0;
}

/* Exact test for two views with the same sizes, strides and row length whose
 * byte spans overlap, e.g. dQ, dK, dV interleaved in one packed [B,T,3,H,D]
 * buffer: 1 if they share no element. Views of different layouts are not
 * analysed (0: treated as overlapping). */
static int interleaved_disjoint(const tensor_desc *x, const tensor_desc *y)
{
    if (!x->present || !y->present || x->elem != y->elem || x->len != y->len)
        return 0;
    for (int i = 0; i < 3; i++)
        if (x->n[i] != y->n[i] || (x->n[i] > 1 && x->strides[i] != y->strides[i]))
            return 0;
    const intptr_t bytes = (intptr_t)((const char *)y->data - (const char *)x->data);
    if (bytes % (intptr_t)x->elem)
        return 0; /* misaligned relative offset: not analysed */
    int64_t dims[3][2];
    int nd = 0;
    for (int i = 0; i < 3; i++)
        if (x->n[i] > 1) {
            dims[nd][0] = x->strides[i];
            dims[nd][1] = x->n[i];
            nd++;
        }
    for (int i = 1; i < nd; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && dims[j][0] < dims[j - 1][0]; j--) {
            int64_t t0 = dims[j][0], t1 = dims[j][1];
            dims[j][0] = dims[j - 1][0];
            dims[j][1] = dims[j - 1][1];
            dims[j - 1][0] = t0;
            dims[j - 1][1] = t1;
        }
    for (int i = 0; i < nd; i++)
        if (dims[i][0] <= 0)
            return 0;
    return !layout_reaches((int64_t)(bytes / (intptr_t)x->elem), (const int64_t(*)[2])dims, nd - 1, x->len);
}

/* Checks every tensor (NULL, strides, overflow, self-overlap) and aliasing
 * between outputs and inputs / other outputs. */
static sdpa_status check_tensors(const plan *pl, tensor_desc *t, int nt)
{
    span sp[16];
    sdpa_status st;
    for (int i = 0; i < nt; i++) {
        if (!t[i].present) {
            sp[i].lo = sp[i].hi = 0;
            continue;
        }
        if ((st = check_tensor(&t[i], &sp[i])) != SDPA_OK)
            return st;
    }
    span ms[3];
    if ((st = mask_spans(pl, ms)) != SDPA_OK)
        return st;
    for (int i = 0; i < nt; i++) {
        if (!t[i].is_output)
            continue;
        for (int j = 0; j < nt; j++)
            if (j != i && spans_overlap(sp[i], sp[j]) && !interleaved_disjoint(&t[i], &t[j]))
                return SDPA_ERR_ALIASING;
        for (int j = 0; j < 3; j++)
            if (spans_overlap(sp[i], ms[j]))
                return SDPA_ERR_ALIASING;
    }
    return SDPA_OK;
}

/* --------------------------------------------------------------- mask logic */

/* This batch's key length. */
static inline int64_t keys_of_batch(const plan *pl, int64_t b)
{
    return pl->kv_lengths ? pl->kv_lengths[b] : pl->Tk;
}

/* Allowed key interval [lo, hi] of query row i (empty when lo > hi). */
static inline void row_range(const plan *pl, int64_t tkb, int64_t i, int64_t *lo, int64_t *hi)
{
    const int64_t d = pl->bottom_right ? tkb - pl->Tq : 0;
    int64_t l = 0, h = tkb - 1;
    if (pl->wl >= 0 && i + d - pl->wl > l)
        l = i + d - pl->wl;
    if (pl->wr >= 0 && i + d + pl->wr < h)
        h = i + d + pl->wr;
    *lo = l;
    *hi = h;
}

enum { TILE_SKIP = 0, TILE_FULL = 1, TILE_PARTIAL = 2 };

static inline uint8_t mask_at(const plan *pl, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return pl->bm.data[b * pl->bm.batch_stride + h * pl->bm.head_stride + i * pl->bm.query_stride +
                       j * pl->bm.key_stride];
}

static inline float bias_at(const plan *pl, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return pl->bias.data[b * pl->bias.batch_stride + h * pl->bias.head_stride + i * pl->bias.query_stride +
                         j * pl->bias.key_stride];
}

/* A tile's columns are the rows [i0, i0+nr) of the query heads [h0, h0+nh)
 * (column g*nr + ii is head h0+g, row i0+ii); lo/hi are the rows' intervals
 * (they depend on the row only). Against keys [j0, j1): returns the kind of
 * tile and the trimmed key interval [*ks, *ke] that any column may see. */
static int classify_tile(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr,
                         const int64_t *lo, const int64_t *hi, int64_t j0, int64_t j1, int64_t *ks,
                         int64_t *ke)
{
    int64_t s = j0 > lo[0] ? j0 : lo[0];
    int64_t e = j1 - 1 < hi[nr - 1] ? j1 - 1 : hi[nr - 1];
    if (s > e)
        return TILE_SKIP;
    *ks = s;
    *ke = e;
    if (!pl->elem_mask)
        return (lo[nr - 1] <= s && hi[0] >= e) ? TILE_FULL : TILE_PARTIAL;
    /* A boolean mask or bias may still disallow every key of the tile: look
     * before computing anything. */
    for (int g = 0; g < nh; g++)
        for (int ii = 0; ii < nr; ii++) {
            const int64_t i = i0 + ii, h = h0 + g;
            const int64_t a = lo[ii] > s ? lo[ii] : s, z = hi[ii] < e ? hi[ii] : e;
            for (int64_t j = a; j <= z; j++) {
                if (pl->bm.data && !mask_at(pl, b, h, i, j))
                    continue;
                if (pl->bias.data && bias_at(pl, b, h, i, j) == -INFINITY)
                    continue;
                return TILE_PARTIAL;
            }
        }
    return TILE_SKIP;
}

/* Applies every mask to S^T (keys ks.. x the tile's columns): -inf where
 * disallowed, + bias where allowed. Disallowed bias entries are never read. */
static void mask_tile(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr,
                      const int64_t *lo, const int64_t *hi, int64_t ks, int nk, float *S, ptrdiff_t rs_key,
                      ptrdiff_t cs_col)
{
    if (!pl->elem_mask) {
        /* Interval masks only (causal, window, key lengths): since lo and hi are
         * nondecreasing in the row, the rows that allow key j are one run
         * [a, z]; both ends only move forward as j grows. Only the masked
         * entries are touched. */
        int a = 0, z = -1;
        for (int jj = 0; jj < nk; jj++) {
            const int64_t j = ks + jj;
            while (a < nr && hi[a] < j)
                a++;
            while (z + 1 < nr && lo[z + 1] <= j)
                z++;
            float *srow = S + (ptrdiff_t)jj * rs_key;
            for (int g = 0; g < nh; g++) {
                float *seg = srow + (ptrdiff_t)g * nr * cs_col;
                const int stop = a < z + 1 ? a : z + 1; /* empty run: mask the whole row */
                for (int ii = 0; ii < stop; ii++)
                    seg[ii * cs_col] = -INFINITY;
                for (int ii = stop > z + 1 ? stop : z + 1; ii < nr; ii++)
                    seg[ii * cs_col] = -INFINITY;
            }
        }
        return;
    }
    for (int jj = 0; jj < nk; jj++) {
        const int64_t j = ks + jj;
        float *srow = S + (ptrdiff_t)jj * rs_key;
        for (int g = 0; g < nh; g++)
            for (int ii = 0; ii < nr; ii++) {
                const int64_t i = i0 + ii, h = h0 + g;
                float *sv = &srow[(ptrdiff_t)(g * nr + ii) * cs_col];
                int ok = j >= lo[ii] && j <= hi[ii];
                if (ok && pl->bm.data)
                    ok = mask_at(pl, b, h, i, j) != 0;
                if (ok && pl->bias.data) {
                    /* a -inf bias masks the key: store -inf, never add it (a NaN
                     * score of a masked NaN key + -inf would stay NaN) */
                    const float bv = bias_at(pl, b, h, i, j);
                    if (bv == -INFINITY)
                        ok = 0;
                    else
                        *sv += bv;
                }
                if (!ok)
                    *sv = -INFINITY;
            }
    }
}

/* Splits keys [ks, ke] of a tile into three runs for the products over keys:
 * seg[0..1) and seg[2..3) may hold masked entries, seg[1..2) is allowed by
 * every row of the tile. Only interval masks (causal, window, key lengths)
 * give a run without masked entries in a partial tile ([lo of the last row,
 * hi of the first]); it takes the plain gemm, which on the diagonal tiles is
 * cheaper than the one that skips the masked sentinel. A full tile is one
 * plain run. The split depends on the shape only. */
static void key_runs(const plan *pl, const int64_t *lo, const int64_t *hi, int kind, int nr, int64_t ks,
                     int64_t ke, int64_t seg[4])
{
    int64_t fs = ks, fe = ke; /* a full tile: one plain run */
    if (kind == TILE_PARTIAL) {
        fs = ke + 1; /* no plain run unless the interval masks give one */
        if (!pl->elem_mask) {
            fs = lo[nr - 1] > ks ? lo[nr - 1] : ks;
            fe = hi[0] < ke ? hi[0] : ke;
        }
    }
    if (fs > fe) { /* everything in the first (masked) run */
        seg[0] = ks;
        seg[1] = seg[2] = seg[3] = ke + 1;
        return;
    }
    seg[0] = ks;
    seg[1] = fs;
    seg[2] = fe + 1;
    seg[3] = ke + 1;
}

/* Keys per band in the masked runs of a banded tile (see tile_keys). */
#define BAND_KEYS 16
/* Column granularity of a band's parts (a multiple of every ISA's vector width). */
#define BAND_COLS 16

/* How the products over a tile's keys [ks, ke] are cut. The runs of key_runs;
 * and in a partial tile of one query head under interval masks only (the
 * causal diagonal, a sliding window's edges), "banded": the masked runs go in
 * bands of BAND_KEYS keys, and each band works only on the columns (query
 * rows) that some of its keys may see, with the plain gemm on those that all
 * of them see and the sentinel-skipping one on the rest. On the causal
 * diagonal that leaves out most of the masked triangle instead of computing
 * it (and, for the products that skip masked terms, skipping it). The cut
 * depends on the shape only. */
typedef struct tile_keys {
    int64_t ks;             /* first key of the tile */
    int64_t seg[4];         /* key runs (key_runs) */
    int banded;             /* the masked runs go in bands */
    int nr;                 /* rows of the tile (banded: its columns) */
    const int64_t *lo, *hi; /* the rows' allowed key intervals */
} tile_keys;

static void tile_keys_init(const plan *pl, tile_keys *tk, const int64_t *lo, const int64_t *hi, int kind, int nh,
                           int nr, int64_t ks, int64_t ke)
{
    key_runs(pl, lo, hi, kind, nr, ks, ke, tk->seg);
    tk->ks = ks;
    tk->banded = kind == TILE_PARTIAL && !pl->elem_mask && nh == 1;
    tk->nr = nr;
    tk->lo = lo;
    tk->hi = hi;
}

/* For the keys [jb, je] of a banded tile: c[0..3) are the columns that some
 * key of the band may see, rounded out to BAND_COLS (every other column is
 * masked for every key of the band), and [c[1], c[2]) those that every key
 * sees, rounded in (empty: c[1] == c[2] == c[0]). Row ii allows key j when
 * lo[ii] <= j <= hi[ii], and lo, hi never decrease with ii, so the rows that
 * allow j are one run [a(j), z(j)] whose ends never decrease with j. */
static void band_cols(const tile_keys *tk, int64_t jb, int64_t je, int c[4])
{
    const int nr = tk->nr;
    int a0 = 0, a1, z0, z1 = nr - 1;
    while (a0 < nr && tk->hi[a0] < jb) /* a(jb) */
        a0++;
    for (a1 = a0; a1 < nr && tk->hi[a1] < je;) /* a(je) */
        a1++;
    while (z1 >= 0 && tk->lo[z1] > je) /* z(je) */
        z1--;
    for (z0 = z1; z0 >= 0 && tk->lo[z0] > jb;) /* z(jb) */
        z0--;
    if (a0 > z1) { /* no row sees the band */
        c[0] = c[1] = c[2] = c[3] = 0;
        return;
    }
    c[0] = a0 / BAND_COLS * BAND_COLS;
    c[3] = (z1 + BAND_COLS) / BAND_COLS * BAND_COLS;
    if (c[3] > nr)
        c[3] = nr;
    c[1] = (a1 + BAND_COLS - 1) / BAND_COLS * BAND_COLS;
    c[2] = z0 + 1 == nr ? nr : (z0 + 1) / BAND_COLS * BAND_COLS;
    if (a1 > z0 || c[1] >= c[2])
        c[1] = c[2] = c[0];
}

/* Where a tile's keys and columns sit in a product C (+)= alpha A B. */
enum {
    KEYS_M_COLS_N, /* S^T = K Q^T, dP^T = V dO^T: keys are C's rows, columns C's columns */
    KEYS_M_COLS_K, /* dV += P^T dO, dK += dS^T Q: keys are C's rows, columns the inner dimension */
    KEYS_K_COLS_N, /* O^T += V^T P^T: keys are the inner dimension, columns C's columns */
    KEYS_K_COLS_M  /* dQ += dS K: keys are the inner dimension, columns C's rows */
};

/* The product restricted to keys [ks + koff, + nk) and columns [c0, c0 + nc);
 * `other` is the third dimension (a head_dim). A, B, C point at key ks, column 0.
 * c_row_scale: see sdpa_gemm_fn (only with c0 = 0 and all of C's rows). */
static void gemm_part(const sdpa_kernels *kt, int where, int64_t koff, int nk, int c0, int nc, int other,
                      float alpha, const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb,
                      float *C, ptrdiff_t ldc, int flags, const float *c_row_scale)
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
    case KEYS_K_COLS_N:
        kt->gemm(other, nc, nk, alpha, A + k * cs_a, rs_a, cs_a, B + k * ldb + c0, ldb, C + c0, ldc, flags,
                 c_row_scale);
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
static void gemm_keys(const sdpa_kernels *kt, const tile_keys *tk, int where, int ncols, int other, float alpha,
                      const float *A, ptrdiff_t rs_a, ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C,
                      ptrdiff_t ldc, int flags, int skip_flag)
{
    const int64_t *seg = tk->seg;
    if (!tk->banded && !skip_flag) {
        gemm_part(kt, where, 0, (int)(seg[3] - seg[0]), 0, ncols, other, alpha, A, rs_a, cs_a, B, ldb, C, ldc,
                  flags, NULL);
        return;
    }
    for (int g = 0; g < 3; g++) {
        const int n = (int)(seg[g + 1] - seg[g]);
        if (n <= 0)
            continue;
        if (g == 1 || !tk->banded) {
            gemm_part(kt, where, seg[g] - tk->ks, n, 0, ncols, other, alpha, A, rs_a, cs_a, B, ldb, C, ldc,
                      flags | (g != 1 ? skip_flag : 0), NULL);
            continue;
        }
        const int once = where == KEYS_M_COLS_K && !(flags & SDPA_GEMM_ACCUMULATE);
        for (int64_t jb = seg[g]; jb < seg[g + 1]; jb += BAND_KEYS) {
            const int nb = seg[g + 1] - jb < BAND_KEYS ? (int)(seg[g + 1] - jb) : BAND_KEYS;
            const int64_t koff = jb - tk->ks;
            int c[4];
            band_cols(tk, jb, jb + nb - 1, c);
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
                    gemm_part(kt, where, koff, nb, c[p], c[p + 1] - c[p], other, alpha, A, rs_a, cs_a, B, ldb, C,
                              ldc, f | (p != 1 ? skip_flag : 0), NULL);
                    if (once) /* later parts add to what the first wrote */
                        f |= SDPA_GEMM_ACCUMULATE;
                }
        }
    }
}

/* The masked score tile S^T = scale K Q^T (the tile's keys x its columns,
 * row stride ld) from K rows (stride ldk, from key ks) and the packed Q^T,
 * cut as tk says; -inf and bias where the tile is partial. Dk = 0: every
 * score is 0 and K is not read. */
static void score_tile(const plan *pl, const tile_keys *tk, int kind, int64_t b, int64_t h0, int nh, int64_t i0,
                       int nr, int nk, const float *krows, ptrdiff_t ldk, const float *qt, float *s)
{
    const int ld = pl->ld, ncol = nh * nr;
    if (pl->Dk == 0)
        for (int jj = 0; jj < nk; jj++)
            memset(s + (size_t)jj * ld, 0, (size_t)ncol * sizeof(float));
    else
        gemm_keys(pl->kt, tk, KEYS_M_COLS_N, ncol, (int)pl->Dk, pl->scale, krows, ldk, 1, qt, ld, s, ld, 0, 0);
    if (kind == TILE_PARTIAL)
        mask_tile(pl, b, h0, nh, i0, nr, tk->lo, tk->hi, tk->ks, nk, s, ld, 1);
}

/* ------------------------------------------------------------------ helpers */

static void *aligned_alloc_bytes(size_t bytes)
{
    void *ptr = NULL;
    if (bytes == 0)
        bytes = ALIGN_BYTES;
    if (posix_memalign(&ptr, ALIGN_BYTES, bytes))
        return NULL;
    return ptr;
}

static inline size_t round_floats(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* ------------------------------------------------------------------ forward */

/* How the forward cuts the work: a tile holds rows [i0, i0+nr) of up to hpt
 * query heads of one GQA group (several heads share a tile when Tq is short,
 * e.g. decode, so that each K/V tile is read once for the whole group), and
 * when there are few tiles the keys are split into nsplit chunks whose partial
 * (m, l, O) are merged in a fixed order. Everything here depends on the shape
 * only, never on the thread count, so results are identical for any thread
 * count. */
typedef struct fwd_layout {
    int64_t rows;   /* rows per tile (nr) */
    int64_t hpt;    /* heads per tile */
    int64_t nrt;    /* row tiles per head */
    int64_t ngt;    /* head tiles per kv head */
    int64_t tiles;  /* B * Hkv * ngt * nrt */
    int64_t nkt;    /* key tiles over [0, Tk) */
    int64_t nsplit; /* key chunks per tile */
} fwd_layout;

/* Below this many tiles the keys are split (covers up to 64 threads). */
#define SPLIT_TARGET_ITEMS 64
/* Each split keeps at least this many key tiles, so merging stays cheap. */
#define SPLIT_MIN_KEY_TILES 4

static fwd_layout fwd_make_layout(const plan *pl)
{
    fwd_layout L;
    L.rows = pl->Tq >= pl->bq ? pl->bq : pl->Tq;
    L.hpt = 1;
    if (pl->Tq > 0 && pl->Tq < pl->bq) {
        L.hpt = pl->bq / pl->Tq;
        if (L.hpt > pl->G)
            L.hpt = pl->G;
        if (L.hpt < 1)
            L.hpt = 1;
    }
    L.nrt = L.rows ? pl->Tq / L.rows + (pl->Tq % L.rows != 0) : 0;
    L.ngt = pl->G ? (pl->G + L.hpt - 1) / L.hpt : 0;
    L.tiles = pl->B * pl->Hkv * L.ngt * L.nrt;
    L.nkt = pl->Tk / pl->bk + (pl->Tk % pl->bk != 0); /* no Tk + bk overflow */
    L.nsplit = 1;
    if (L.tiles > 0 && L.tiles < SPLIT_TARGET_ITEMS) {
        int64_t want = (SPLIT_TARGET_ITEMS + L.tiles - 1) / L.tiles;
        int64_t most = L.nkt / SPLIT_MIN_KEY_TILES;
        L.nsplit = want < most ? want : most;
        if (L.nsplit < 1)
            L.nsplit = 1;
    }
    return L;
}

/* Score tile: S^T [block_k][ld], or for few-column tiles S [nt_max_cols][round16(block_k)]. */
static size_t fwd_s_floats(const plan *pl)
{
    const size_t transposed = (size_t)pl->bk * (size_t)pl->ld;
    const size_t cols = pl->kt->nt_max_cols > 16 ? (size_t)pl->kt->nt_max_cols : 16;
    size_t natural = cols * (((size_t)pl->bk + 15) & ~(size_t)15);
    if (natural < (size_t)pl->kt->attend_scratch)
        natural = (size_t)pl->kt->attend_scratch;
    return transposed > natural ? transposed : natural;
}

typedef struct fwd_ws {
    float *qt, *s, *m, *l, *alpha;
    float *on; /* the output accumulator O, natural layout [ncol][Dv] (row stride Dv) */
    int64_t *lo, *hi;
} fwd_ws;

/* Rows of the output accumulator: a tile's columns. */
static size_t fwd_o_rows(const plan *pl)
{
    return (size_t)(pl->ld > pl->kt->nt_max_cols ? pl->ld : pl->kt->nt_max_cols);
}

static size_t fwd_ws_floats(const plan *pl)
{
    const size_t ld = (size_t)pl->ld;
    /* qt, s, m, l, alpha, and lo/hi as int64 (2 floats each), on */
    return round_floats(pl->Dk * ld) + round_floats(fwd_s_floats(pl)) + 3 * round_floats(ld) +
           4 * round_floats(ld) + round_floats(fwd_o_rows(pl) * pl->Dv);
}

/* The next n floats of a workspace (rounded up to the alignment); *base moves past them. */
static float *carve(float **base, size_t n)
{
    float *p = *base;
    *base += round_floats(n);
    return p;
}

/* The next n int64 of a workspace (as 2n floats). */
static int64_t *carve_i64(float **base, size_t n)
{
    return (int64_t *)(void *)carve(base, 2 * n);
}

static fwd_ws fwd_ws_carve(const plan *pl, float *base)
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
    w.on = base;
    return w;
}

/* Columns of a tile (heads per tile x rows per tile). */
static inline int64_t fwd_tile_cols(const fwd_layout *L)
{
    return L->rows * L->hpt;
}

/* Partial state of one (tile, split), C = fwd_tile_cols: m[C], l[C], and the
 * unnormalised O[C][Dv]. Compact, so that a split writes whole cache lines. */
static size_t fwd_partial_floats(const plan *pl, const fwd_layout *L)
{
    const size_t cols = (size_t)fwd_tile_cols(L);
    return 2 * round_floats(cols) + round_floats((size_t)pl->Dv * cols);
}

typedef struct fwd_args {
    const sdpa_tensor *q, *k, *v;
    const sdpa_tensor_out *o, *lse;
    fwd_layout L;
    float *partials; /* nsplit > 1: tiles * nsplit partial states */
} fwd_args;

static inline const float *row_in(const sdpa_tensor *t, int64_t b, int64_t h, int64_t i)
{
    return t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride;
}

static inline float *row_out(const sdpa_tensor_out *t, int64_t b, int64_t h, int64_t i)
{
    return t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride;
}

/* Tile t -> (b, kv head, first head of the tile, heads, first row, rows). */
static void fwd_tile_coords(const plan *pl, const fwd_layout *L, int64_t t, int64_t *b, int64_t *hk,
                            int64_t *h0, int *nh, int64_t *i0, int *nr)
{
    const int64_t rt = t % L->nrt, gt = (t / L->nrt) % L->ngt, bh = t / (L->nrt * L->ngt);
    *b = bh / pl->Hkv;
    *hk = bh % pl->Hkv;
    const int64_t g0 = gt * L->hpt;
    *nh = (int)(pl->G - g0 < L->hpt ? pl->G - g0 : L->hpt);
    *h0 = *hk * pl->G + g0;
    *i0 = rt * L->rows;
    *nr = (int)(pl->Tq - *i0 < L->rows ? pl->Tq - *i0 : L->rows);
}

/* Writes O = on / l (on: the tile's accumulator [ncol][Dv]) and LSE of a tile;
 * inv_l[c] = 1 / l[c] (0 where l is 0). */
static void fwd_store(const plan *pl, const fwd_args *a, const float *on, const float *m, const float *l,
                      const float *inv_l, int64_t b, int64_t h0, int nh, int64_t i0, int nr)
{
    const int Dv = (int)pl->Dv;
    for (int g = 0; g < nh; g++) {
        if (Dv > 0) {
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
static inline void prefetch_rows(const float *base, ptrdiff_t stride, int64_t j0, int64_t j1, int64_t len)
{
    if (!base)
        return;
    for (int64_t j = j0; j < j1; j++) {
        const char *row = (const char *)(base + j * stride);
        for (int64_t off = 0; off < len * (int64_t)sizeof(float); off += 64)
            __builtin_prefetch(row + off, 0, 2);
    }
}

/* Keys per step in the few-column path (see fwd_item). */
#define NT_STEP 16

/* Few-column tiles (decode), keys [ks, ke) of one tile's rows: in steps of
 * NT_STEP keys, S = scale Q K^T (natural layout [ncol][NT_STEP], keys past the
 * step -inf), the row-wise online softmax, then O = O * alpha + P V; in one
 * kernel call (attend_rows) where the ISA provides it for the shape, else
 * composed from gemm_nt, online_softmax_rows and gemm_stream. The kernels
 * read every K and V row whole, in address order, and short steps interleave
 * the two streams finely: the order the hardware prefetchers follow (measured
 * on Zen 4, decode B=1 Hq=32 Hkv=8 Tk=4096 D=128, 2 threads: 16- and 32-key
 * steps 99-111% of a plain read of the same bytes, 64-128: 91-97%). partial:
 * the masks apply element by element (and attend_rows is not used). */
static void fwd_nt_run(const plan *pl, fwd_ws *w, const fwd_args *a, const float *kb, const float *vb,
                       int64_t b, int64_t h0, int nh, int64_t i0, int nr, int64_t ks, int64_t ke,
                       int partial)
{
    const sdpa_kernels *kt = pl->kt;
    const int Dk = (int)pl->Dk, Dv = (int)pl->Dv, ncol = nh * nr;
    const ptrdiff_t sk = a->k->seq_stride, sv = a->v->seq_stride;
    if (!partial && kt->attend_rows && Dk > 0 && Dv > 0 && ke - ks <= INT32_MAX &&
        kt->attend_rows(ncol, (int)(ke - ks), Dk, Dv, pl->scale, w->qt, Dk, kb + ks * sk, sk, vb + ks * sv, sv,
                        w->m, w->l, w->on, Dv, w->s))
        return;
    for (int64_t j = ks; j < ke; j += NT_STEP) {
        const int n = ke - j < NT_STEP ? (int)(ke - j) : NT_STEP;
        if (Dk == 0) /* no features: every score is 0 (K may have no data at all) */
            for (int c = 0; c < ncol; c++)
                memset(w->s + (size_t)c * NT_STEP, 0, (size_t)n * sizeof(float));
        else
            kt->gemm_nt(ncol, n, Dk, pl->scale, w->qt, Dk, kb + j * sk, sk, w->s, NT_STEP, 1);
        if (n < NT_STEP)
            for (int c = 0; c < ncol; c++)
                for (int jj = n; jj < NT_STEP; jj++)
                    w->s[(size_t)c * NT_STEP + jj] = -INFINITY;
        if (partial)
            mask_tile(pl, b, h0, nh, i0, nr, w->lo, w->hi, j, n, w->s, 1, NT_STEP);
        kt->online_softmax_rows(ncol, NT_STEP, w->s, NT_STEP, w->m, w->l, w->alpha);
        if (Dv > 0)
            kt->gemm_stream(ncol, Dv, n, w->s, NT_STEP, vb + j * sv, sv, w->on, Dv, partial, w->alpha);
    }
}

/* One (tile, split) of the forward: Alg. 1 over the tile's key tiles in the split. */
static void fwd_item(const plan *pl, fwd_ws *w, const fwd_args *a, int64_t t, int64_t split)
{
    const sdpa_kernels *kt = pl->kt;
    const fwd_layout *L = &a->L;
    const int ld = pl->ld, Dk = (int)pl->Dk, Dv = (int)pl->Dv;
    int64_t b, hk, h0, i0;
    int nh, nr;
    fwd_tile_coords(pl, L, t, &b, &hk, &h0, &nh, &i0, &nr);
    const int ncol = nh * nr;
    const float *kb = Dk > 0 ? a->k->data + b * a->k->batch_stride + hk * a->k->head_stride : NULL;
    const float *vb = Dv > 0 ? a->v->data + b * a->v->batch_stride + hk * a->v->head_stride : NULL;
    const int64_t tkb = keys_of_batch(pl, b);

    for (int ii = 0; ii < nr; ii++)
        row_range(pl, tkb, i0 + ii, &w->lo[ii], &w->hi[ii]);
    for (int c = 0; c < ncol; c++) {
        w->m[c] = -INFINITY;
        w->l[c] = 0.0f;
    }
    /* Few query columns (decode): dot-product S^T (gemm_nt) and O kept in
     * natural layout, so that the vector dimension runs along head_dim instead
     * of along a handful of queries. Chosen by shape only (never by threads). */
    const int nt = ncol <= kt->nt_max_cols;
    /* Few-column tiles keep S in natural layout [ncol][NT_STEP] (keys contiguous, so
     * the softmax runs along full vectors); the others S^T [keys][ld]. O is
     * natural in both. */
    memset(w->on, 0, (size_t)ncol * Dv * sizeof(float));

    /* key tiles of this split, intersected with the tile's allowed keys */
    /* split s covers key tiles [s*base + min(s, rem), ...): no s * nkt overflow */
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
    int packed = 0;
    for (int64_t ktile = kt_first; ktile < kt_end; ktile++) {
        const int64_t j0 = ktile * pl->bk;
        const int64_t j1 = pl->Tk - j0 > pl->bk ? j0 + pl->bk : pl->Tk;
        int64_t ks, ke;
        const int kind = classify_tile(pl, b, h0, nh, i0, nr, w->lo, w->hi, j0, j1, &ks, &ke);
        if (kind == TILE_SKIP)
            continue;
        if (!packed) { /* Q^T [Dk][ld], or Q rows [ncol][Dk] for gemm_nt */
            for (int g = 0; g < nh; g++) {
                const float *qrow = row_in(a->q, b, h0 + g, i0);
                if (!nt)
                    kt->transpose(nr, Dk, qrow, a->q->seq_stride, w->qt + g * nr, ld);
                else if (Dk > 0)
                    for (int ii = 0; ii < nr; ii++)
                        memcpy(w->qt + (size_t)(g * nr + ii) * Dk, qrow + ii * a->q->seq_stride,
                               (size_t)Dk * sizeof(float));
            }
            packed = 1;
        }
        const int nk = (int)(ke - ks + 1);
        const float *ktile_rows = kb ? kb + ks * a->k->seq_stride : NULL;
        if (nt) {
            /* Few columns (decode): a run of keys in steps of NT_STEP, see fwd_nt_run.
             * Full tiles that follow each other form one run. */
            int64_t run_end = ke + 1;
            if (kind == TILE_FULL)
                while (ktile + 1 < kt_end) {
                    const int64_t n0 = (ktile + 1) * pl->bk, n1 = pl->Tk - n0 > pl->bk ? n0 + pl->bk : pl->Tk;
                    int64_t ks2, ke2;
                    if (classify_tile(pl, b, h0, nh, i0, nr, w->lo, w->hi, n0, n1, &ks2, &ke2) != TILE_FULL ||
                        ks2 != run_end)
                        break;
                    run_end = ke2 + 1;
                    ktile++;
                }
            fwd_nt_run(pl, w, a, kb, vb, b, h0, nh, i0, nr, ks, run_end, kind == TILE_PARTIAL);
            continue;
        }
        if (ktile + 1 < kt_end) { /* the next key tile, while this one computes */
            const int64_t n0 = j1, n1 = pl->Tk - j1 > pl->bk ? j1 + pl->bk : pl->Tk;
            prefetch_rows(kb, a->k->seq_stride, n0, n1, Dk);
            prefetch_rows(vb, a->v->seq_stride, n0, n1, Dv);
        }
        tile_keys tk;
        tile_keys_init(pl, &tk, w->lo, w->hi, kind, nh, nr, ks, ke);
        score_tile(pl, &tk, kind, b, h0, nh, i0, nr, nk, ktile_rows, a->k->seq_stride, w->qt, w->s);
        /* m, l, alpha; S^T -> P^T */
        kt->online_softmax(nk, ncol, w->s, ld, w->m, w->l, w->alpha);
        if (Dv > 0) {
            /* O = alpha O + P V (P read from P^T): a full tile in one gemm that
             * rescales O's rows as it adds (one pass over O instead of two); a
             * partial one rescales first, then adds in the cut tk says */
            const float *vrows = vb + ks * a->v->seq_stride;
            if (kind == TILE_FULL) {
                gemm_part(kt, KEYS_K_COLS_M, 0, nk, 0, ncol, Dv, 1.0f, w->s, 1, ld, vrows, a->v->seq_stride, w->on,
                          Dv, SDPA_GEMM_ACCUMULATE, w->alpha);
            } else {
                kt->scale_rows(ncol, Dv, w->on, Dv, w->alpha, w->on, Dv);
                gemm_keys(kt, &tk, KEYS_K_COLS_M, ncol, Dv, 1.0f, w->s, 1, ld, vrows, a->v->seq_stride, w->on, Dv,
                          SDPA_GEMM_ACCUMULATE, SDPA_GEMM_SKIP_ZERO_A);
            }
        }
    }
    if (L->nsplit > 1) {
        const size_t cols = (size_t)fwd_tile_cols(L);
        float *part = a->partials + (size_t)(t * L->nsplit + split) * fwd_partial_floats(pl, L);
        memcpy(part, w->m, (size_t)ncol * sizeof(float));
        memcpy(part + round_floats(cols), w->l, (size_t)ncol * sizeof(float));
        memcpy(part + 2 * round_floats(cols), w->on, (size_t)ncol * Dv * sizeof(float));
        return;
    }
    /* O = O / l; a row that saw no allowed key (l = 0) is exactly 0. */
    for (int c = 0; c < ncol; c++)
        w->alpha[c] = w->l[c] == 0.0f ? 0.0f : 1.0f / w->l[c];
    fwd_store(pl, a, w->on, w->m, w->l, w->alpha, b, h0, nh, i0, nr);
}

/* Merges the nsplit partial states of tile t in split order:
 * M = max m_s, l = sum l_s exp(m_s - M), O = sum O_s exp(m_s - M) / l. */
static void fwd_merge(const plan *pl, fwd_ws *w, const fwd_args *a, int64_t t)
{
    const fwd_layout *L = &a->L;
    const int Dv = (int)pl->Dv;
    const size_t pf = fwd_partial_floats(pl, L), off_l = round_floats((size_t)fwd_tile_cols(L)),
                 off_o = 2 * off_l;
    int64_t b, hk, h0, i0;
    int nh, nr;
    fwd_tile_coords(pl, L, t, &b, &hk, &h0, &nh, &i0, &nr);
    const int ncol = nh * nr;
    const float *first = a->partials + (size_t)(t * L->nsplit) * pf;
    for (int c = 0; c < ncol; c++) {
        float mx = -INFINITY;
        for (int64_t s = 0; s < L->nsplit; s++)
            mx = fmaxf(mx, first[s * pf + c]);
        w->m[c] = mx;
        w->l[c] = 0.0f;
    }
    memset(w->on, 0, (size_t)ncol * Dv * sizeof(float));
    for (int64_t s = 0; s < L->nsplit; s++) {
        const float *part = first + s * pf;
        for (int c = 0; c < ncol; c++) {
            /* a split that saw nothing (m_s = -inf) has l_s = 0 and O_s = 0 */
            w->alpha[c] = part[c] == -INFINITY ? 0.0f : expf(part[c] - w->m[c]);
            w->l[c] += part[off_l + c] * w->alpha[c];
        }
        const float *po = part + off_o;
        for (int c = 0; c < ncol; c++) {
            float *dst = w->on + (size_t)c * Dv;
            const float *src = po + (size_t)c * Dv, al = w->alpha[c];
            for (int d = 0; d < Dv; d++)
                dst[d] += src[d] * al;
        }
    }
    for (int c = 0; c < ncol; c++)
        w->alpha[c] = w->l[c] == 0.0f ? 0.0f : 1.0f / w->l[c];
    fwd_store(pl, a, w->on, w->m, w->l, w->alpha, b, h0, nh, i0, nr);
}

sdpa_status sdpa_forward(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, const sdpa_tensor_out *o, const sdpa_tensor_out *lse)
{
    plan pl;
    sdpa_status st = make_plan(p, &pl);
    if (st != SDPA_OK)
        return st;
    if (!q || !k || !v || !o)
        return SDPA_ERR_NULL_ARGUMENT;
    const int64_t sq[3] = {q->batch_stride, q->head_stride, q->seq_stride};
    const int64_t sk[3] = {k->batch_stride, k->head_stride, k->seq_stride};
    const int64_t sv[3] = {v->batch_stride, v->head_stride, v->seq_stride};
    const int64_t so[3] = {o->batch_stride, o->head_stride, o->seq_stride};
    const int64_t sl[3] = {lse ? lse->batch_stride : 0, lse ? lse->head_stride : 0,
                           lse ? lse->seq_stride : 0};
    tensor_desc t[5] = {
        {q->data, sq, {pl.B, pl.Hq, pl.Tq}, pl.Dk, 4, 0, 1},
        {k->data, sk, {pl.B, pl.Hkv, pl.Tk}, pl.Dk, 4, 0, 1},
        {v->data, sv, {pl.B, pl.Hkv, pl.Tk}, pl.Dv, 4, 0, 1},
        {o->data, so, {pl.B, pl.Hq, pl.Tq}, pl.Dv, 4, 1, 1},
        {lse ? lse->data : NULL, sl, {pl.B, pl.Hq, pl.Tq}, 1, 4, 1, lse && lse->data},
    };
    if ((st = check_tensors(&pl, t, 5)) != SDPA_OK)
        return st;

    if (pl.Dv == 0 && !(lse && lse->data))
        return SDPA_OK; /* nothing to write */
    fwd_args a = {q, k, v, o, lse, fwd_make_layout(&pl), NULL};
    const int64_t items = a.L.tiles * a.L.nsplit;
    if (items == 0)
        return SDPA_OK;
    int nthreads = pl.nthreads;
    if (nthreads > items)
        nthreads = (int)items;
    const size_t per = fwd_ws_floats(&pl);
    const size_t npart = a.L.nsplit > 1 ? (size_t)items * fwd_partial_floats(&pl, &a.L) : 0;
    float *ws = aligned_alloc_bytes(((size_t)nthreads * per + npart) * sizeof(float));
    if (!ws)
        return SDPA_ERR_OUT_OF_MEMORY;
    a.partials = npart ? ws + (size_t)nthreads * per : NULL;
    const int64_t nsplit = a.L.nsplit, nrt = a.L.nrt;

#if HAVE_OPENMP
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
#endif
    {
        int tid = 0;
#if HAVE_OPENMP
        tid = omp_get_thread_num();
#endif
        fwd_ws w = fwd_ws_carve(&pl, ws + (size_t)tid * per);
#if HAVE_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t it = 0; it < items; it++) {
            /* Within a head, last row tiles first: under causal masks they are the longest. */
            const int64_t split = it % nsplit, tile = it / nsplit;
            const int64_t t_ = (tile / nrt) * nrt + (nrt - 1 - tile % nrt);
            fwd_item(&pl, &w, &a, t_, split);
        }
        if (nsplit > 1) {
#if HAVE_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t tile = 0; tile < a.L.tiles; tile++)
                fwd_merge(&pl, &w, &a, tile);
        }
    }
    free(ws);
    return SDPA_OK;
}

/* ----------------------------------------------------------------- backward */

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
    float *qn, *don; /* Q and dO rows packed [ncol][D] when a tile spans several heads */
    int64_t *lo, *hi;
    int64_t packed_tile; /* the query tile whose Q^T, dO^T, LSE, D (and packed rows) are in
                            qt, dot, lse, dd, qn, don; -1: none */
} bwd_ws;

static size_t bwd_ws_floats(const plan *pl)
{
    const size_t ld = (size_t)pl->ld;
    return 2 * round_floats(pl->Dk * ld) + 2 * round_floats(pl->Dv * ld) + 2 * round_floats(pl->bk * ld) +
           6 * round_floats(ld) + 4 * round_floats(ld) + 2 * round_floats(2 * ld);
}

static bwd_ws bwd_ws_carve(const plan *pl, float *base)
{
    const size_t ld = (size_t)pl->ld;
    bwd_ws w;
    w.qt = carve(&base, pl->Dk * ld);
    w.qn = carve(&base, pl->Dk * ld);
    w.dot = carve(&base, pl->Dv * ld);
    w.don = carve(&base, pl->Dv * ld);
    w.p = carve(&base, pl->bk * ld);
    w.dp = carve(&base, pl->bk * ld);
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
    w.shift = 0;
    w.dshift = 0;
    w.packed_tile = -1;
    return w;
}

typedef struct bwd_args {
    const sdpa_tensor *q, *k, *v, *o, *lse, *dout;
    const sdpa_tensor_out *dq, *dk, *dv;
    float *D; /* [B, Hq, Tq] contiguous: rowsum(dO * O), written before the pairs of its rows
                 (sum_j P_j dP_j rounded instead for the rows bwd_tile_stats takes) */
    float *row_max, *row_logsum, *row_dlo; /* [B, Hq, Tq]: m, log(l) and the rest of D
                                    (D - fl(D)) recomputed for the rows with |LSE| >=
                                    BWD_LSE_EXACT_LIMIT (bwd_tile_stats), else unused */
    int nt;   /* few-column tiles: S^T and dP^T (and D) by gemm_nt, see sdpa_backward */
    int kv_once; /* one query tile per (batch, kv head): every dK/dV row gets all of its
                    terms from one pair, which writes it (no zeroing first) */
    int kv_stream; /* kv_once, and dK + dV >= BWD_STREAM_KV_BYTES: written with SDPA_GEMM_STREAM_C */
} bwd_args;

/* Rows [i0, i0+nr) of heads [h0, h0+nh) packed as [ncol][len] (column g*nr+ii). */
static const float *pack_rows(const sdpa_tensor *t, int64_t b, int64_t h0, int nh, int64_t i0, int nr,
                              int len, float *dst)
{
    for (int g = 0; g < nh; g++)
        for (int ii = 0; ii < nr; ii++)
            memcpy(dst + (size_t)(g * nr + ii) * len, row_in(t, b, h0 + g, i0 + ii), (size_t)len * sizeof(float));
    return dst;
}

/* The kernels' masked-entry sentinel in a P tile: -0.0 exactly (see kernels.h). */
static inline int is_masked_sentinel(float x)
{
    return x == 0.0f && signbit(x);
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
    const float *vb = a->v->data + b * a->v->batch_stride + hk * a->v->head_stride + ks * a->v->seq_stride;
    const float *dob = nh == 1 ? row_in(a->dout, b, h0, i0)
                               : fresh ? pack_rows(a->dout, b, h0, nh, i0, nr, Dv, w->don) : w->don;
    *lddo = nh == 1 ? a->dout->seq_stride : Dv;
    if (a->nt) {
        kt->gemm_nt(ncol, nk, Dv, 1.0f, dob, *lddo, vb, a->v->seq_stride, w->dp, 1, ld);
    } else {
        if (fresh)
            kt->transpose(ncol, Dv, dob, *lddo, w->dot, ld);
        gemm_keys(kt, tk, KEYS_M_COLS_N, ncol, Dv, 1.0f, vb, a->v->seq_stride, 1, w->dot, ld, w->dp, ld, 0, 0);
    }
    return dob;
}

/* One (query tile, key tile) pair of the backward. The query tile holds rows
 * [i0, i0+nr) of the heads [h0, h0+nh) of one GQA group, as in the forward. */
static inline int lse_needs_stats(float lse)
{
    return isfinite(lse) && fabsf(lse) >= BWD_LSE_EXACT_LIMIT;
}

/* Pair (query tile `tile`, key tile from j0). stats = 1: only the masked S^T of
 * the pair and the online-softmax update of w->rm, w->rl with it (a row's max
 * and sum, bwd_tile_stats); nothing is written to the outputs. */
static void bwd_pair(const plan *pl, bwd_ws *w, const bwd_args *a, int64_t tile, int64_t b, int64_t h0,
                     int nh, int64_t i0, int nr, int64_t j0, int stats)
{
    const sdpa_kernels *kt = pl->kt;
    const int ld = pl->ld, Dk = (int)pl->Dk, Dv = (int)pl->Dv;
    const int ncol = nh * nr;
    const int64_t hk = h0 / pl->G;
    const int64_t tkb = keys_of_batch(pl, b);
    for (int ii = 0; ii < nr; ii++)
        row_range(pl, tkb, i0 + ii, &w->lo[ii], &w->hi[ii]);
    const int64_t j1 = pl->Tk - j0 > pl->bk ? j0 + pl->bk : pl->Tk;
    int64_t ks, ke;
    const int kind = classify_tile(pl, b, h0, nh, i0, nr, w->lo, w->hi, j0, j1, &ks, &ke);
    if (a->kv_once && !stats) { /* dK, dV rows of the key tile that no allowed pair reaches are 0 */
        const int64_t z0 = kind == TILE_SKIP ? j1 : ks, z1 = kind == TILE_SKIP ? j1 : ke + 1;
        for (int64_t j = j0; j < j1; j++)
            if (j < z0 || j >= z1) {
                if (Dk > 0)
                    memset(row_out(a->dk, b, hk, j), 0, (size_t)Dk * sizeof(float));
                memset(row_out(a->dv, b, hk, j), 0, (size_t)Dv * sizeof(float));
            }
    }
    if (kind == TILE_SKIP)
        return;
    const int nk = (int)(ke - ks + 1);
    const int skip = kind == TILE_PARTIAL ? SDPA_GEMM_SKIP_ZERO_A : 0;
    /* dV, dK: write once (large ones with non-temporal stores), or add */
    const int kv_flags = a->kv_once ? (a->kv_stream ? SDPA_GEMM_STREAM_C : 0) : SDPA_GEMM_ACCUMULATE;
    tile_keys tk; /* key runs: masked, allowed by every row, masked; bands on the diagonal */
    tile_keys_init(pl, &tk, w->lo, w->hi, kind, nh, nr, ks, ke);
    const float *kb = Dk > 0 ? a->k->data + b * a->k->batch_stride + hk * a->k->head_stride + ks * a->k->seq_stride : NULL;

    /* The query tile's packed operands are reused while the same thread stays
     * on the same query tile (row-major order in bwd_head). */
    const int fresh = w->packed_tile != tile;
    /* Q rows (for dK, and for S^T in few-column tiles): in place for one head, else packed */
    const float *qsrc = Dk == 0 ? NULL
                        : nh == 1 ? row_in(a->q, b, h0, i0)
                        : fresh   ? pack_rows(a->q, b, h0, nh, i0, nr, Dk, w->qn)
                                  : w->qn;
    const ptrdiff_t ldq = nh == 1 ? a->q->seq_stride : Dk;
    /* S^T = scale K Q^T, masked; P^T = exp(S^T - LSE) */
    for (int g = 0; g < nh && fresh; g++) {
        if (Dk > 0 && !a->nt)
            kt->transpose(nr, Dk, row_in(a->q, b, h0 + g, i0), a->q->seq_stride, w->qt + g * nr, ld);
        const float *lb = row_in(a->lse, b, h0 + g, i0);
        const int64_t r0 = (b * pl->Hq + h0 + g) * pl->Tq + i0;
        for (int ii = 0; ii < nr; ii++) {
            const int c = g * nr + ii;
            const float lv = lb[ii * a->lse->seq_stride];
            w->lse[c] = lv;
            w->dd[c] = a->D[r0 + ii];
            if (stats) /* w->rm, w->rl hold the running statistics */
                continue;
            w->rm[c] = 0.0f;
            w->dhi[c] = 0.0f;
            if (lse_needs_stats(lv)) { /* P = exp((s - m) - log l), see bwd_tile_stats */
                w->lse[c] = a->row_logsum[r0 + ii];
                w->rm[c] = a->row_max[r0 + ii];
                w->dhi[c] = a->D[r0 + ii]; /* dP - D as (dP - fl(D)) - (D - fl(D)) */
                w->dd[c] = a->row_dlo[r0 + ii];
            }
        }
    }
    if (fresh && !stats) {
        w->shift = w->dshift = 0;
        for (int c = 0; c < ncol; c++) {
            w->shift |= w->rm[c] != 0.0f;
            w->dshift |= w->dhi[c] != 0.0f;
        }
    }
    if (a->nt) { /* few columns: dot products along head_dim, full vectors */
        kt->gemm_nt(ncol, nk, Dk, pl->scale, qsrc, ldq, kb, a->k->seq_stride, w->p, 1, ld);
        if (kind == TILE_PARTIAL)
            mask_tile(pl, b, h0, nh, i0, nr, w->lo, w->hi, ks, nk, w->p, ld, 1);
    } else {
        score_tile(pl, &tk, kind, b, h0, nh, i0, nr, nk, kb, a->k->seq_stride, w->qt, w->p);
    }
    if (stats) {
        kt->online_softmax(nk, ncol, w->p, ld, w->rm, w->rl, w->ralpha);
        if (Dv > 0) { /* sum_j P_j dP_j, rescaled as l is (w->p holds exp(s - m) now) */
            ptrdiff_t lddo;
            bwd_tile_dp(pl, w, a, &tk, b, h0, nh, i0, nr, ks, nk, fresh, &lddo);
            for (int c = 0; c < ncol; c++) {
                w->rd[c] *= w->ralpha[c];
                w->rs[c] *= w->ralpha[c];
            }
            for (int jj = 0; jj < nk; jj++) {
                const float *pr = w->p + (size_t)jj * ld, *dpr = w->dp + (size_t)jj * ld;
                for (int c = 0; c < ncol; c++) { /* a masked key's dP may be NaN: dropped */
                    const double t = (double)pr[c] * dpr[c];
                    w->rd[c] += is_masked_sentinel(pr[c]) ? 0.0 : t;
                    w->rs[c] += pr[c]; /* the sentinel adds -0.0 */
                }
            }
        }
        w->packed_tile = tile; /* Q^T, dO^T reused by the next key tile; bwd_tile_stats resets it */
        return;
    }
    if (w->shift) /* rows with a recomputed max: s - m (exact near the max), then exp(. - log l) */
        for (int c = 0; c < ncol; c++)
            if (w->rm[c] != 0.0f) /* |LSE| >= 256 puts |m| above 200 */
                for (int jj = 0; jj < nk; jj++)
                    w->p[(size_t)jj * ld + c] -= w->rm[c];
    kt->bwd_probs(nk, ncol, w->p, ld, w->lse);

    if (Dv > 0) {
        float *dvb = a->dv->data + b * a->dv->batch_stride + hk * a->dv->head_stride + ks * a->dv->seq_stride;
        ptrdiff_t lddo;
        /* dP^T = V dO^T */
        const float *dob = bwd_tile_dp(pl, w, a, &tk, b, h0, nh, i0, nr, ks, nk, fresh, &lddo);
        /* dV += P^T dO, in the runs of key_runs */
        gemm_keys(kt, &tk, KEYS_M_COLS_K, ncol, Dv, 1.0f, w->p, ld, 1, dob, lddo, dvb, a->dv->seq_stride,
                  kv_flags, skip);
    } else {
        for (int jj = 0; jj < nk; jj++)
            memset(w->dp + (size_t)jj * ld, 0, (size_t)ncol * sizeof(float));
    }
    if (w->dshift) /* rows with D = sum P dP: dP - fl(D) first (exact near the top key's dP) */
        for (int c = 0; c < ncol; c++)
            if (w->dhi[c] != 0.0f)
                for (int jj = 0; jj < nk; jj++)
                    w->dp[(size_t)jj * ld + c] -= w->dhi[c];
    /* dS^T = P^T * (dP^T - D) */
    kt->bwd_dscores(nk, ncol, w->p, ld, w->dp, ld, w->dd);
    if (Dk > 0) {
        float *dkb = a->dk->data + b * a->dk->batch_stride + hk * a->dk->head_stride + ks * a->dk->seq_stride;
        /* dK += scale dS^T Q ; dQ += scale dS K (per head of the tile) */
        gemm_keys(kt, &tk, KEYS_M_COLS_K, ncol, Dk, pl->scale, w->dp, ld, 1, qsrc, ldq, dkb, a->dk->seq_stride,
                  kv_flags, skip);
        if (nr == 1 && nh > 1) /* one row per head (decode): the heads' dQ rows as one C, head_stride apart */
            gemm_keys(kt, &tk, KEYS_K_COLS_M, nh, Dk, pl->scale, w->dp, 1, ld, kb, a->k->seq_stride,
                      row_out(a->dq, b, h0, i0), a->dq->head_stride, SDPA_GEMM_ACCUMULATE, skip);
        else
            for (int h = 0; h < nh; h++)
                gemm_keys(kt, &tk, KEYS_K_COLS_M, nr, Dk, pl->scale, w->dp + h * nr, 1, ld, kb, a->k->seq_stride,
                          row_out(a->dq, b, h0 + h, i0), a->dq->seq_stride, SDPA_GEMM_ACCUMULATE, skip);
    }
    w->packed_tile = tile;
}

/* Pair (row r, key tile c) of the wave order of (batch, kv head) bh. */
static void bwd_wave_pair(const plan *pl, bwd_ws *w, const bwd_args *a, const fwd_layout *L, int64_t bh,
                          int64_t r, int64_t c)
{
    const int64_t tile = (bh * L->ngt + r / L->nrt) * L->nrt + r % L->nrt;
    int64_t b, hk, h0, i0;
    int nh, nr;
    fwd_tile_coords(pl, L, tile, &b, &hk, &h0, &nh, &i0, &nr);
    bwd_pair(pl, w, a, tile, b, h0, nh, i0, nr, c * pl->bk, 0);
}

/* For the rows of row tile r of (batch, kv head) bh whose |LSE| >= BWD_LSE_EXACT_LIMIT:
 * their max m and sum l recomputed over every key tile, with the backward's own
 * score tiles (the same bits as its pairs see) and the online softmax, into
 * a->row_max and a->row_logsum = log(l). The float LSE keeps log(l) only to
 * ulp(LSE)/2: when every key of a row ties at a huge score (a bias of -FLT_MAX
 * on a padded row) it keeps nothing of it, and P = exp(s - LSE) would sum to
 * the number of keys. Nothing to do (and no cost but reading LSE) otherwise. */
static void bwd_tile_stats(const plan *pl, bwd_ws *w, const bwd_args *a, const fwd_layout *L, int64_t bh,
                           int64_t r)
{
    const int64_t tile = (bh * L->ngt + r / L->nrt) * L->nrt + r % L->nrt;
    int64_t b, hk, h0, i0;
    int nh, nr, any = 0;
    fwd_tile_coords(pl, L, tile, &b, &hk, &h0, &nh, &i0, &nr);
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
        w->rd[c] = w->rs[c] = 0.0;
    }
    w->packed_tile = -1;
    for (int64_t c = 0; c < L->nkt; c++)
        bwd_pair(pl, w, a, tile, b, h0, nh, i0, nr, c * pl->bk, 1);
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

/* Zeroes the rows of heads [h0, h1) of a gradient (heads numbered b * n[1] + h). */
static void zero_heads(float *data, const int64_t n[3], const int64_t s[3], int64_t len, int64_t h0, int64_t h1)
{
    if (!data || len == 0 || n[2] == 0)
        return;
    for (int64_t bh = h0; bh < h1; bh++)
        for (int64_t z = 0; z < n[2]; z++)
            memset(data + (bh / n[1]) * s[0] + (bh % n[1]) * s[1] + z * s[2], 0, (size_t)len * sizeof(float));
}

/* dQ, dK, dV (dQ only unless with_kv) = 0 for the heads [part * H / parts,
 * (part + 1) * H / parts) of each (H = its batch x heads), so that the threads
 * of a team share the work. */
static void zero_grads(const plan *pl, const sdpa_tensor_out *dq, const sdpa_tensor_out *dk,
                       const sdpa_tensor_out *dv, int part, int parts, int with_kv)
{
    const int64_t nq3[3] = {pl->B, pl->Hq, pl->Tq}, nk3[3] = {pl->B, pl->Hkv, pl->Tk};
    const int64_t sdq[3] = {dq->batch_stride, dq->head_stride, dq->seq_stride};
    const int64_t sdk[3] = {dk->batch_stride, dk->head_stride, dk->seq_stride};
    const int64_t sdv[3] = {dv->batch_stride, dv->head_stride, dv->seq_stride};
    const int64_t hq = pl->B * pl->Hq, hk = pl->B * pl->Hkv;
    zero_heads(dq->data, nq3, sdq, pl->Dk, hq * part / parts, hq * (part + 1) / parts);
    if (!with_kv)
        return;
    zero_heads(dk->data, nk3, sdk, pl->Dk, hk * part / parts, hk * (part + 1) / parts);
    zero_heads(dv->data, nk3, sdv, pl->Dv, hk * part / parts, hk * (part + 1) / parts);
}

/* D = rowsum(dO * O) for the rows [r0, r1) of all (batch, query head, row);
 * nt: with gemm_nt, as dP^T in few-column tiles. */
static void bwd_rows_D(const plan *pl, const sdpa_tensor *o, const sdpa_tensor *dout, float *D, int64_t r0,
                       int64_t r1, int nt)
{
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i = r % pl->Tq, bh = r / pl->Tq, b = bh / pl->Hq, h = bh % pl->Hq;
        const float *orow = o->data ? o->data + b * o->batch_stride + h * o->head_stride + i * o->seq_stride : NULL;
        const float *drow = dout->data ? dout->data + b * dout->batch_stride + h * dout->head_stride +
                                             i * dout->seq_stride : NULL;
        /* With the kernel that computes dP = dO . V for this shape, so that D
         * rounds exactly like it (when P is one-hot, O = V and dP - D must
         * cancel exactly). */
        if (pl->Dv > 0 && nt)
            pl->kt->gemm_nt(1, 1, (int)pl->Dv, 1.0f, drow, pl->Dv, orow, pl->Dv, &D[r], 1, 1);
        else if (pl->Dv > 0)
            pl->kt->gemm(1, 1, (int)pl->Dv, 1.0f, drow, 0, 1, orow, 1, &D[r], 1, 0, NULL);
        else
            D[r] = 0.0f;
    }
}

/* Before the pairs of (batch, kv head) bh when one thread runs them all:
 * dK, dV of the kv head and dQ of its query heads = 0, and their rows' D.
 * Done by the thread that then accumulates into them (the lines are in its
 * cache), with no barrier between the threads. */
static void bwd_head_prologue(const plan *pl, const bwd_args *a, int64_t bh)
{
    const int64_t b = bh / pl->Hkv, hk = bh % pl->Hkv, q0 = b * pl->Hq + hk * pl->G;
    const int64_t nq3[3] = {pl->B, pl->Hq, pl->Tq}, nk3[3] = {pl->B, pl->Hkv, pl->Tk};
    const int64_t sdq[3] = {a->dq->batch_stride, a->dq->head_stride, a->dq->seq_stride};
    const int64_t sdk[3] = {a->dk->batch_stride, a->dk->head_stride, a->dk->seq_stride};
    const int64_t sdv[3] = {a->dv->batch_stride, a->dv->head_stride, a->dv->seq_stride};
    zero_heads(a->dq->data, nq3, sdq, pl->Dk, q0, q0 + pl->G);
    if (!a->kv_once) {
        zero_heads(a->dk->data, nk3, sdk, pl->Dk, bh, bh + 1);
        zero_heads(a->dv->data, nk3, sdv, pl->Dv, bh, bh + 1);
    }
    bwd_rows_D(pl, a->o, a->dout, a->D, q0 * pl->Tq, (q0 + pl->G) * pl->Tq, a->nt);
}

sdpa_status sdpa_backward(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                          const sdpa_tensor *v, const sdpa_tensor *o, const sdpa_tensor *lse,
                          const sdpa_tensor *dout, const sdpa_tensor_out *dq, const sdpa_tensor_out *dk,
                          const sdpa_tensor_out *dv)
{
    plan pl;
    sdpa_status st = make_plan(p, &pl);
    if (st != SDPA_OK)
        return st;
    if (!q || !k || !v || !o || !lse || !dout || !dq || !dk || !dv)
        return SDPA_ERR_NULL_ARGUMENT;
#define STR3(t) {t->batch_stride, t->head_stride, t->seq_stride}
    const int64_t sq[3] = STR3(q), sk[3] = STR3(k), sv[3] = STR3(v), so[3] = STR3(o), sl[3] = STR3(lse),
                  sdo[3] = STR3(dout), sdq[3] = STR3(dq), sdk[3] = STR3(dk), sdv[3] = STR3(dv);
#undef STR3
    const int64_t nq3[3] = {pl.B, pl.Hq, pl.Tq}, nk3[3] = {pl.B, pl.Hkv, pl.Tk};
    tensor_desc t[9] = {
        {q->data, sq, {nq3[0], nq3[1], nq3[2]}, pl.Dk, 4, 0, 1},
        {k->data, sk, {nk3[0], nk3[1], nk3[2]}, pl.Dk, 4, 0, 1},
        {v->data, sv, {nk3[0], nk3[1], nk3[2]}, pl.Dv, 4, 0, 1},
        {o->data, so, {nq3[0], nq3[1], nq3[2]}, pl.Dv, 4, 0, 1},
        {lse->data, sl, {nq3[0], nq3[1], nq3[2]}, 1, 4, 0, 1},
        {dout->data, sdo, {nq3[0], nq3[1], nq3[2]}, pl.Dv, 4, 0, 1},
        {dq->data, sdq, {nq3[0], nq3[1], nq3[2]}, pl.Dk, 4, 1, 1},
        {dk->data, sdk, {nk3[0], nk3[1], nk3[2]}, pl.Dk, 4, 1, 1},
        {dv->data, sdv, {nk3[0], nk3[1], nk3[2]}, pl.Dv, 4, 1, 1},
    };
    if ((st = check_tensors(&pl, t, 9)) != SDPA_OK)
        return st;

    /* With Dv = 0 nothing flows back (dS = P * (0 - 0) = 0): the gradients are
     * zero. With Dk = Dv = 0, or no query or key rows, there is nothing else to
     * compute either; this also keeps empty problems of huge B x H instant. */
    if (pl.Dv == 0 || pl.B == 0 || pl.Hq == 0 || pl.Tq == 0 || pl.Tk == 0) {
        zero_grads(&pl, dq, dk, dv, 0, 1, 1);
        return SDPA_OK;
    }
    /* Query tiles as in the forward (several heads of a group per tile when Tq
     * is short); the wavefront's rows are (head tile, row tile). */
    const fwd_layout L = fwd_make_layout(&pl);
    const int64_t nkt = L.nkt;
    const int64_t R = L.ngt * L.nrt;
    const int64_t BH = pl.B * pl.Hkv;
    int nthreads = pl.nthreads;
    const size_t per = bwd_ws_floats(&pl);
    const size_t nD = (size_t)(pl.B * pl.Hq * pl.Tq);
    float *ws = aligned_alloc_bytes(((size_t)nthreads * per + 4 * round_floats(nD)) * sizeof(float));
    if (!ws)
        return SDPA_ERR_OUT_OF_MEMORY;
    float *D = ws + (size_t)nthreads * per;
    float *row_max = D + round_floats(nD), *row_logsum = row_max + round_floats(nD);
    float *row_dlo = row_logsum + round_floats(nD);

    /* From here on the outputs are written (zeroed first, by the team below). */
    /* Few-column tiles (decode-sized Tq): S^T and dP^T as dot products along
     * head_dim (gemm_nt) instead of a gemm whose vectors would hold a handful
     * of query columns. Chosen from the tile width, which depends on the shape
     * only, so D (which must round like dP) is computed the same way. */
    const int nt = fwd_tile_cols(&L) <= pl.kt->nt_max_cols;
    const double kv_bytes = (double)pl.B * (double)pl.Hkv * (double)pl.Tk * (double)(pl.Dk + pl.Dv) * sizeof(float);
    const bwd_args a = {q,          k,       v,  o,      lse,    dout, dq, dk, dv, D, row_max,
                        row_logsum, row_dlo, nt, R == 1, R == 1 && kv_bytes >= (double)BWD_STREAM_KV_BYTES};
    const int64_t ndiag = (R > 0 && nkt > 0) ? R + nkt - 1 : 0;
    /* Key tiles per pass of the per-head order: as many as 1 MiB of their K, V,
     * dK and dV rows (4 at D=128 and 128-key tiles, 8 at D=64), see below. */
    int64_t kchunk = BWD_KV_CHUNK_BYTES / ((int64_t)pl.bk * (int64_t)sizeof(float) * (2 * pl.Dk + 2 * pl.Dv));
    if (kchunk < 1)
        kchunk = 1;

#if HAVE_OPENMP
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
#endif
    {
        int tid = 0;
#if HAVE_OPENMP
        tid = omp_get_thread_num();
#endif
        bwd_ws w = bwd_ws_carve(&pl, ws + (size_t)tid * per);
        int team = 1;
#if HAVE_OPENMP
        team = omp_get_num_threads();
#endif
        if (BH >= 2 * (int64_t)nthreads) {
            /* Enough (batch, kv head) pairs to keep every thread busy: each
             * thread runs whole heads (zeroing their gradients and computing
             * their D first, bwd_head_prologue), in passes over kchunk key
             * tiles, each pass row by row (query tile r outer, key tile c of
             * the pass inner). Every dQ tile still receives its contributions
             * in increasing c and every dK/dV tile in increasing r, exactly as
             * in the waves below, so the bits are the same. A pass keeps its
             * K, V, dK and dV rows in cache while the query tiles stream by
             * (one pass over all key tiles re-reads the whole head's K, V, dK,
             * dV for every query tile: at T=4096 D=128 that is 8 MiB per row,
             * and the backward ran 10-20% slower than at T=2048). No barrier:
             * a thread that finishes a head takes the next one. */
#if HAVE_OPENMP
#pragma omp for schedule(dynamic, 1) nowait
#endif
            for (int64_t bh = 0; bh < BH; bh++) {
                bwd_head_prologue(&pl, &a, bh);
                for (int64_t r = 0; r < R; r++)
                    bwd_tile_stats(&pl, &w, &a, &L, bh, r);
                for (int64_t c0 = 0; c0 < nkt; c0 += kchunk)
                    for (int64_t r = 0; r < R; r++)
                        for (int64_t c = c0; c < nkt && c < c0 + kchunk; c++)
                            bwd_wave_pair(&pl, &w, &a, &L, bh, r, c);
            }
        } else {
            zero_grads(&pl, dq, dk, dv, tid, team, !a.kv_once);
            /* D = rowsum(dO * O); the barrier after it also covers the zeroing */
#if HAVE_OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t r = 0; r < (int64_t)nD; r++)
                bwd_rows_D(&pl, o, dout, D, r, r + 1, a.nt);
            /* the rows' recomputed statistics where LSE is too coarse; the barrier
             * after it comes before any pair */
#if HAVE_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t it = 0; it < BH * R; it++)
                bwd_tile_stats(&pl, &w, &a, &L, it / R, it % R);
            for (int64_t d = 0; d < ndiag; d++) {
                const int64_t rmin = d - nkt + 1 > 0 ? d - nkt + 1 : 0;
                const int64_t rmax = d < R - 1 ? d : R - 1;
                const int64_t cnt = rmax - rmin + 1;
#if HAVE_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
                for (int64_t it = 0; it < BH * cnt; it++)
                    bwd_wave_pair(&pl, &w, &a, &L, it / cnt, rmin + it % cnt, d - (rmin + it % cnt));
            }
        }
    }
    free(ws);
    return SDPA_OK;
}

/* -------------------------------------------------------------- misc public */

void sdpa_problem_init(sdpa_problem *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof(sdpa_problem);
    p->use_default_scale = 1;
    p->scale = 0.0f;
    p->causal = SDPA_CAUSAL_NONE;
    p->window_alignment = SDPA_ALIGN_TOP_LEFT;
    p->window_left = SDPA_WINDOW_UNBOUNDED;
    p->window_right = SDPA_WINDOW_UNBOUNDED;
    p->isa = SDPA_ISA_AUTO;
}

const char *sdpa_status_string(sdpa_status s)
{
    switch (s) {
    case SDPA_OK: return "success";
    case SDPA_ERR_NULL_ARGUMENT: return "a required pointer is NULL";
    case SDPA_ERR_BAD_DESCRIPTOR: return "problem descriptor not initialised by sdpa_problem_init (struct_size, reserved field or enum value)";
    case SDPA_ERR_NEGATIVE_SIZE: return "a size is negative";
    case SDPA_ERR_HEAD_GROUPING: return "q_heads is not a multiple of kv_heads";
    case SDPA_ERR_BAD_SCALE: return "scale is not finite, or the default scale 1/sqrt(head_dim_qk) with head_dim_qk = 0";
    case SDPA_ERR_BAD_STRIDE: return "a stride is negative, or an output overlaps itself";
    case SDPA_ERR_BAD_WINDOW: return "a window bound is negative and not SDPA_WINDOW_UNBOUNDED";
    case SDPA_ERR_BAD_KV_LENGTH: return "a per-batch key length is negative or larger than kv_len";
    case SDPA_ERR_ALIASING: return "an output overlaps an input or another output";
    case SDPA_ERR_BAD_THREADS: return "num_threads is negative";
    case SDPA_ERR_ISA_UNAVAILABLE: return "the requested ISA is not compiled in or not supported by this CPU/OS";
    case SDPA_ERR_OUT_OF_MEMORY: return "workspace allocation failed";
    case SDPA_ERR_SIZE_OVERFLOW: return "a tensor extent overflows the address space";
    case SDPA_ERR_BAD_BLOCK_SIZE: return "block_q or block_k is outside [0, SDPA_MAX_BLOCK]";
    }
    return "unknown status";
}
