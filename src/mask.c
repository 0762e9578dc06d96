/* SPDX-License-Identifier: MIT */
/* mask.c - mask geometry, pure functions of the plan (no kernels; unit-tested
 * on their own).
 *
 * The window (causal included), kv_lengths and alignment give each query row one
 * contiguous allowed key interval [lo_i, hi_i] (row_range in driver.h),
 * nondecreasing in i. Against a key tile, a query tile is skipped (outside every
 * interval, or every key disallowed by the boolean mask or a -inf bias), full
 * (inside every interval, no boolean mask or bias: no per-element work) or
 * partial (masked element by element; its products skip the masked terms, so a
 * NaN in a masked K/V row or bias entry is never read into a result); a boolean
 * mask or bias that allows one run of keys in every row of a tile, the same
 * run, with a zero bias (key padding as a mask) makes that run a full tile. The keys
 * of a tile are cut into runs and, on the causal diagonal, bands, so that the
 * products leave out the masked triangle (products.c). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "driver.h"

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

/* What one row of a boolean mask and bias allows over keys [a, z]: how many keys,
 * the first and last, and whether an allowed key has a nonzero bias. */
typedef struct row_summary {
    const uint8_t *m;   /* the row it was computed for (with bias, a, z) */
    const float *bias;
    int64_t a, z;
    int64_t first, last, count;
    int biased;
} row_summary;

static void summarise_row(const plan *pl, const uint8_t *m, const float *bias, int64_t a, int64_t z,
                          row_summary *r)
{
    const int64_t ms = pl->bm.key_stride, bs = pl->bias.key_stride;
    int64_t first = INT64_MAX, last = -1, count = 0;
    int biased = 0;
    /* no branch on the data: min / max / sum reductions, one loop per operand mix
     * so that the contiguous ones vectorise */
    if (m && !bias && ms == 1) {
        for (int64_t j = a; j <= z; j++) {
            const int ok = m[j] != 0;
            count += ok;
            first = ok && j < first ? j : first;
            last = ok ? j : last;
        }
    } else if (!m && bias && bs == 1) {
        for (int64_t j = a; j <= z; j++) {
            const float bv = bias[j];
            const int ok = bv != -INFINITY;
            count += ok;
            first = ok && j < first ? j : first;
            last = ok ? j : last;
            biased |= ok & (bv != 0.0f);
        }
    } else {
        for (int64_t j = a; j <= z; j++) {
            const int mok = m ? m[j * ms] != 0 : 1;
            const float bv = bias && mok ? bias[j * bs] : 0.0f; /* the bias only where the mask allows */
            const int ok = mok & (bv != -INFINITY);
            count += ok;
            first = ok && j < first ? j : first;
            last = ok ? j : last;
            biased |= ok & (bv != 0.0f);
        }
    }
    r->m = m;
    r->bias = bias;
    r->a = a;
    r->z = z;
    r->first = first;
    r->last = last;
    r->count = count;
    r->biased = biased;
}

/* A row with the same interval whose (contiguous) mask or bias holds the same
 * bytes as the summarised one has its summary (a mask materialised over queries
 * repeats its rows). Only one operand: with both, the bias is read only where the
 * mask allows, so it is never compared whole. */
static int same_row(const plan *pl, const row_summary *r, const uint8_t *m, const float *bias, int64_t a, int64_t z)
{
    if (r->a != a || r->z != z || z < a)
        return 0;
    if (m && !bias && pl->bm.key_stride == 1 && r->m && !r->bias)
        return memcmp(m + a, r->m + a, (size_t)(z - a + 1)) == 0;
    if (bias && !m && pl->bias.key_stride == 1 && r->bias && !r->m)
        return memcmp(bias + a, r->bias + a, (size_t)(z - a + 1) * sizeof(float)) == 0;
    return 0;
}

/* Whether rows i0 + 1 .. i0 + nr - 1 of a contiguous boolean mask or bias (one
 * of them, key stride 1, the same rows for every head of the tile) hold the
 * bytes of row i0 over keys [a, z]: one branch-free pass the compiler
 * vectorises, where same_row would call memcmp once per row. A mask
 * materialised over queries, (B, 1, Tq, Tk), repeats its rows in every tile of
 * key padding; a tile whose rows all match is classified from its first row. */
static int rows_repeat(const plan *pl, int64_t b, int64_t h0, int64_t i0, int nr, int64_t a, int64_t z)
{
    const size_t n = (size_t)(z - a + 1);
    if (pl->bm.data) {
        const uint8_t *r0 = &pl->bm.data[b * pl->bm.batch_stride + h0 * pl->bm.head_stride +
                                         i0 * pl->bm.query_stride + a];
        unsigned diff = 0;
        for (int ii = 1; ii < nr; ii++) {
            const uint8_t *r = r0 + ii * pl->bm.query_stride;
            for (size_t j = 0; j < n; j++)
                diff |= (unsigned)(r[j] ^ r0[j]);
        }
        return diff == 0;
    }
    const float *f0 = &pl->bias.data[b * pl->bias.batch_stride + h0 * pl->bias.head_stride +
                                     i0 * pl->bias.query_stride + a];
    uint32_t diff = 0;
    for (int ii = 1; ii < nr; ii++) {
        const float *f = f0 + ii * pl->bias.query_stride;
        for (size_t j = 0; j < n; j++) {
            uint32_t x, y;
            memcpy(&x, &f[j], sizeof x);
            memcpy(&y, &f0[j], sizeof y);
            diff |= x ^ y;
        }
    }
    return diff == 0;
}

int sdpa_classify_tile(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, const int64_t *lo,
                       const int64_t *hi, int64_t j0, int64_t j1, int64_t *ks, int64_t *ke)
{
    int64_t s = j0 > lo[0] ? j0 : lo[0];
    int64_t e = j1 - 1 < hi[nr - 1] ? j1 - 1 : hi[nr - 1];
    if (s > e)
        return TILE_SKIP;
    *ks = s;
    *ke = e;
    if (!pl->elem_mask)
        return (lo[nr - 1] <= s && hi[0] >= e) ? TILE_FULL : TILE_PARTIAL;
    /* A boolean mask or bias may disallow every key of the tile (skip it), or
     * allow in every row exactly one run of keys [F, L], the same in all rows,
     * with a zero bias on it (key padding as PyTorch and transformers pass it):
     * then the tile is full over [F, L], as it would be with kv_lengths, and
     * costs no per-element work. Each row is read once, inside its interval (the
     * bias only where the boolean mask allows), by a branch-free pass the
     * compiler vectorises; rows that share their mask and bias rows and their
     * interval (a mask broadcast over heads or queries) are read once. */
    int64_t F = -1, L = -1;
    int any = 0, full = 1;
    row_summary prev = {NULL, NULL, 0, -1, 0, -1, 0, 0};
    /* every row the same: the operands broadcast over queries (and heads, or one
     * head), and one interval for all rows */
    int uniform = (!pl->bm.data || (pl->bm.query_stride == 0 && (pl->bm.head_stride == 0 || nh == 1))) &&
                  (!pl->bias.data || (pl->bias.query_stride == 0 && (pl->bias.head_stride == 0 || nh == 1))) &&
                  lo[0] == lo[nr - 1] && hi[0] == hi[nr - 1];
    /* or every row holds the same bytes (one operand, contiguous keys, the same
     * rows for every head): then too the first row decides */
    if (!uniform && nr > 1 && lo[0] == lo[nr - 1] && hi[0] == hi[nr - 1] && !(pl->bm.data && pl->bias.data)) {
        const int64_t a = lo[0] > s ? lo[0] : s, z = hi[0] < e ? hi[0] : e;
        const int heads_same = nh == 1 || (pl->bm.data ? pl->bm.head_stride : pl->bias.head_stride) == 0;
        const int contiguous = pl->bm.data ? pl->bm.key_stride == 1 : pl->bias.key_stride == 1;
        uniform = heads_same && contiguous && a <= z && rows_repeat(pl, b, h0, i0, nr, a, z);
    }
    for (int g = 0; g < (uniform ? 1 : nh); g++)
        for (int ii = 0; ii < (uniform ? 1 : nr); ii++) {
            const int64_t i = i0 + ii, h = h0 + g;
            const int64_t a = lo[ii] > s ? lo[ii] : s, z = hi[ii] < e ? hi[ii] : e;
            const uint8_t *mrow = pl->bm.data ? &pl->bm.data[b * pl->bm.batch_stride + h * pl->bm.head_stride +
                                                              i * pl->bm.query_stride]
                                              : NULL;
            const float *brow = pl->bias.data ? &pl->bias.data[b * pl->bias.batch_stride +
                                                                h * pl->bias.head_stride + i * pl->bias.query_stride]
                                              : NULL;
            if (!(g || ii) || !((prev.m == mrow && prev.bias == brow && prev.a == a && prev.z == z) ||
                                same_row(pl, &prev, mrow, brow, a, z)))
                summarise_row(pl, mrow, brow, a, z, &prev);
            else {
                prev.m = mrow; /* the next row compares with this one */
                prev.bias = brow;
            }
            any |= prev.count > 0;
            const int run = prev.count > 0 && prev.count == prev.last - prev.first + 1 && !prev.biased;
            if (g == 0 && ii == 0) {
                F = prev.count ? prev.first : -1;
                L = prev.count ? prev.last : -1;
            }
            if (!run || prev.first != F || prev.last != L)
                full = 0;
            if (!full && any)
                return TILE_PARTIAL;
        }
    if (!any)
        return TILE_SKIP;
    if (full && lo[nr - 1] <= F && hi[0] >= L) { /* (each row's run lies in its interval) */
        *ks = F;
        *ke = L;
        return TILE_FULL;
    }
    return TILE_PARTIAL;
}

void sdpa_mask_tile(const plan *pl, int64_t b, int64_t h0, int nh, int64_t i0, int nr, const int64_t *lo,
                    const int64_t *hi, int64_t ks, int nk, float *S, ptrdiff_t rs_key, ptrdiff_t cs_col)
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

/* How the products over a tile's keys [ks, ke] are cut. The runs of key_runs;
 * and in a partial tile of one query head under interval masks only (the
 * causal diagonal, a sliding window's edges), "banded": the masked runs go in
 * bands of kt->band_keys keys, and each band works only on the columns (query
 * rows) that some of its keys may see, with the plain gemm on those that all
 * of them see and the sentinel-skipping one on the rest. On the causal
 * diagonal that leaves out most of the masked triangle instead of computing
 * it (and, for the products that skip masked terms, skipping it). The cut
 * depends on the shape only. */
void sdpa_tile_keys_init(const plan *pl, tile_keys *tk, const int64_t *lo, const int64_t *hi, int kind, int nh,
                         int nr, int64_t ks, int64_t ke)
{
    key_runs(pl, lo, hi, kind, nr, ks, ke, tk->seg);
    tk->ks = ks;
    tk->banded = kind == TILE_PARTIAL && !pl->elem_mask && nh == 1;
    tk->nr = nr;
    tk->band_keys = pl->kt->band_keys;
    tk->col_align = pl->kt->col_align;
    tk->lo = lo;
    tk->hi = hi;
}

/* For the keys [jb, je] of a banded tile: c[0..3) are the columns that some
 * key of the band may see, rounded out to col_align (every other column is
 * masked for every key of the band), and [c[1], c[2]) those that every key
 * sees, rounded in (empty: c[1] == c[2] == c[0]). Row ii allows key j when
 * lo[ii] <= j <= hi[ii], and lo, hi never decrease with ii, so the rows that
 * allow j are one run [a(j), z(j)] whose ends never decrease with j. */
void sdpa_band_cols(const tile_keys *tk, int64_t jb, int64_t je, int c[4])
{
    const int nr = tk->nr, ca = tk->col_align;
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
    c[0] = a0 / ca * ca;
    c[3] = (z1 + ca) / ca * ca;
    if (c[3] > nr)
        c[3] = nr;
    c[1] = (a1 + ca - 1) / ca * ca;
    c[2] = z0 + 1 == nr ? nr : (z0 + 1) / ca * ca;
    if (a1 > z0 || c[1] >= c[2])
        c[1] = c[2] = c[0];
}
