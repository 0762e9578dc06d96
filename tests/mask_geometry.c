/* SPDX-License-Identifier: MIT */
/* mask_geometry.c - the driver's mask geometry (src/mask.c, row_range in
 * src/driver.h) unit-tested on its own, without kernels, against a brute-force
 * reading of the contract (shared/design.md section 1): key j is allowed for
 * query i of batch b when
 *     j < Tk_b (kv_lengths),  j <= i + d + wr (causal: wr = 0),  j >= i + d - wl,
 *     the boolean mask is nonzero, and the bias is not -inf,
 * with d = 0 (top-left) or Tk_b - Tq (bottom-right), plus diagonal_offset. Over random
 * small problems
 * and every tile of their layout it checks:
 *   - row_range gives exactly the allowed keys of the interval masks;
 *   - classify_tile: SKIP iff no (row, key) of the tile is allowed; FULL only when
 *     every pair of the tile's key range is allowed and there is no element mask;
 *     [ks, ke] lies in the tile and holds every allowed key of it;
 *   - mask_tile writes -inf exactly on the disallowed entries, adds the bias
 *     elsewhere, and never reads a disallowed bias entry (NaN there);
 *   - the key runs of tile_keys cover [ks, ke] and the middle run holds only
 *     keys every row allows;
 *   - band_cols: columns outside [c0, c3) see no key of the band, columns in
 *     [c1, c2) see every key of it, cuts aligned to col_align.
 * Prints "N passed, N failed"; exit status 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static long n_pass, n_fail;

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        if (cond) {                                                                                                  \
            n_pass++;                                                                                                \
        } else {                                                                                                     \
            if (n_fail++ < 20) {                                                                                     \
                printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                          \
                printf(__VA_ARGS__);                                                                                 \
                printf("\n");                                                                                        \
            }                                                                                                        \
        }                                                                                                            \
    } while (0)

static uint32_t rng = 12345u;
static int64_t rnd(int64_t n) /* 0 .. n-1 */
{
    rng = rng * 1664525u + 1013904223u;
    return (int64_t)((rng >> 8) % (uint32_t)n);
}

typedef struct problem {
    sdpa_problem p;
    int32_t kvl[4];
    uint8_t *mask; /* [B][Tq][Tk], head stride 0 */
    float *bias;   /* [B][Tq][Tk], head stride 0 */
} problem;

/* The contract's allowed(b, i, j), written from its definition. */
static int allowed(const problem *pr, int64_t b, int64_t i, int64_t j)
{
    const sdpa_problem *p = &pr->p;
    const int64_t tkb = p->kv_lengths ? p->kv_lengths[b] : p->kv_len;
    if (j < 0 || j >= tkb)
        return 0;
    const int br = p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
                   (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
    const int64_t d = (br ? tkb - p->q_len : 0) + p->diagonal_offset;
    if (p->causal != SDPA_CAUSAL_NONE && j > i + d)
        return 0;
    if (p->window_right != SDPA_WINDOW_UNBOUNDED && j > i + d + p->window_right)
        return 0;
    if (p->window_left != SDPA_WINDOW_UNBOUNDED && j < i + d - p->window_left)
        return 0;
    const size_t e = (size_t)((b * p->q_len + i) * p->kv_len + j);
    if (pr->mask && !pr->mask[e])
        return 0;
    if (pr->bias && pr->bias[e] == -INFINITY)
        return 0;
    return 1;
}

static void make_problem(problem *pr, int elem)
{
    sdpa_problem *p = &pr->p;
    sdpa_problem_init(p);
    p->batch = 1 + rnd(3);
    p->q_heads = p->kv_heads = 1;
    p->q_len = 1 + rnd(90);
    p->kv_len = rnd(120);
    p->head_dim_qk = p->head_dim_v = 8;
    p->causal = (sdpa_causal)rnd(3);
    p->window_alignment = (sdpa_alignment)rnd(2);
    p->window_left = rnd(3) ? SDPA_WINDOW_UNBOUNDED : rnd(40);
    p->window_right = rnd(3) ? SDPA_WINDOW_UNBOUNDED : rnd(40);
    p->diagonal_offset = rnd(3) ? 0 : rnd(301) - 150;
    p->block_q = 1 + rnd(64);
    p->block_k = 1 + rnd(64);
    p->isa = SDPA_ISA_SCALAR;
    p->num_threads = 1;
    if (rnd(2)) {
        for (int64_t b = 0; b < p->batch; b++)
            pr->kvl[b] = (int32_t)rnd(p->kv_len + 1);
        p->kv_lengths = pr->kvl;
    }
    const size_t n = (size_t)(p->batch * p->q_len * p->kv_len) + 1;
    pr->mask = NULL;
    pr->bias = NULL;
    /* half the element masks are key padding (per batch, keys [pad_lo, pad_hi)
     * allowed in every row; a zero bias there), the shape users pass as a mask */
    const int padding = rnd(2);
    int64_t pad_lo[64], pad_hi[64];
    for (int64_t b = 0; b < p->batch && b < 64; b++) {
        pad_lo[b] = rnd(3) ? 0 : rnd(p->kv_len + 1);
        pad_hi[b] = pad_lo[b] + rnd(p->kv_len - pad_lo[b] + 1);
    }
    const int64_t per = p->q_len * p->kv_len > 0 ? p->q_len * p->kv_len : 1; /* elements per batch */
    if (elem & 1) {
        pr->mask = malloc(n);
        for (size_t e = 0; e < n; e++) {
            const int64_t j = (int64_t)e % (p->kv_len ? p->kv_len : 1), b = (int64_t)e / per;
            pr->mask[e] = padding && b < p->batch ? (j >= pad_lo[b] && j < pad_hi[b]) : rnd(4) != 0;
        }
        p->bool_mask = (sdpa_bool_mask){pr->mask, p->q_len * p->kv_len, 0, p->kv_len, 1};
    }
    if (elem & 2) {
        pr->bias = malloc(n * sizeof(float));
        for (size_t e = 0; e < n; e++) {
            const int64_t j = (int64_t)e % (p->kv_len ? p->kv_len : 1), b = (int64_t)e / per;
            if (padding && b < p->batch)
                pr->bias[e] = j >= pad_lo[b] && j < pad_hi[b] ? (rnd(2) ? 0.0f : -0.0f) : -INFINITY;
            else
                pr->bias[e] = rnd(5) ? (float)rnd(7) - 3.0f : -INFINITY;
        }
        if (pr->mask) /* a disallowed entry's bias is never read: poison it */
            for (size_t e = 0; e < n; e++)
                if (!pr->mask[e])
                    pr->bias[e] = NAN;
        p->bias = (sdpa_bias){pr->bias, p->q_len * p->kv_len, 0, p->kv_len, 1};
    }
    /* a third of the element masks are broadcast over queries, (B, 1, 1, Tk) as
     * users pass key padding: every row a copy of row 0, read with query stride 0 */
    if ((pr->mask || pr->bias) && rnd(3) == 0) {
        for (int64_t b = 0; b < p->batch; b++)
            for (int64_t i = 1; i < p->q_len; i++) {
                const size_t r0 = (size_t)(b * p->q_len * p->kv_len), ri = r0 + (size_t)(i * p->kv_len);
                if (pr->mask)
                    memcpy(pr->mask + ri, pr->mask + r0, (size_t)p->kv_len);
                if (pr->bias)
                    memcpy(pr->bias + ri, pr->bias + r0, (size_t)p->kv_len * sizeof(float));
            }
        p->bool_mask.query_stride = 0;
        p->bias.query_stride = 0;
    } else if (padding && (!pr->mask != !pr->bias) && p->q_len > 1 && p->kv_len > 0 && rnd(2)) {
        /* key padding materialised over queries, (B, 1, Tq, Tk), with one entry of
         * one row changed: the tile holding it must not be classified from its
         * first row alone (rows_repeat in mask.c) */
        const int64_t b = rnd(p->batch), i = 1 + rnd(p->q_len - 1), j = rnd(p->kv_len);
        const size_t e = (size_t)((b * p->q_len + i) * p->kv_len + j);
        if (pr->mask)
            pr->mask[e] = !pr->mask[e];
        else
            pr->bias[e] = pr->bias[e] == -INFINITY ? (rnd(2) ? 0.0f : 1.5f) : (rnd(2) ? -INFINITY : 0.25f);
    }
}

static void check_rows(const plan *pl, const problem *pr, int64_t b, int64_t tkb)
{
    for (int64_t i = 0; i < pl->Tq; i++) {
        int64_t lo, hi;
        row_range(pl, tkb, i, &lo, &hi);
        for (int64_t j = -2; j < pl->Tk + 2; j++) {
            const int in = j >= lo && j <= hi && j >= 0 && j < pl->Tk;
            /* the interval masks alone: allowed() without the element masks */
            problem bare = *pr;
            bare.mask = NULL;
            bare.bias = NULL;
            CHECK(in == allowed(&bare, b, i, j), "row_range b=%lld i=%lld j=%lld: [%lld, %lld]", (long long)b,
                  (long long)i, (long long)j, (long long)lo, (long long)hi);
        }
    }
}

/* One (query tile, key tile): classify, mask, runs, bands. */
static void check_tile(const plan *pl, const problem *pr, int64_t b, int64_t i0, int nr, int64_t j0, int64_t j1,
                       const int64_t *lo, const int64_t *hi)
{
    int64_t ks = -1, ke = -1;
    const int kind = sdpa_classify_tile(pl, b, 0, 1, i0, nr, lo, hi, j0, j1, &ks, &ke);
    int any = 0, all = 1;
    int64_t amin = INT64_MAX, amax = -1;
    for (int ii = 0; ii < nr; ii++)
        for (int64_t j = j0; j < j1; j++) {
            const int a = allowed(pr, b, i0 + ii, j);
            any |= a;
            if (a) {
                amin = j < amin ? j : amin;
                amax = j > amax ? j : amax;
            }
        }
    CHECK((kind == TILE_SKIP) == !any, "classify b=%lld i0=%lld j0=%lld: kind %d, allowed pairs %d", (long long)b,
          (long long)i0, (long long)j0, kind, any);
    if (kind == TILE_SKIP)
        return;
    CHECK(ks >= j0 && ke < j1 && ks <= amin && ke >= amax, "key range [%lld, %lld] of tile [%lld, %lld)",
          (long long)ks, (long long)ke, (long long)j0, (long long)j1);
    for (int ii = 0; ii < nr; ii++)
        for (int64_t j = ks; j <= ke; j++)
            all &= allowed(pr, b, i0 + ii, j);
    /* FULL: every pair of [ks, ke] allowed and, with a bias, a zero bias on each
     * (a mask that allows one run of keys in every row, the same run, is full over
     * that run: key padding as a mask) */
    int zero_bias = 1;
    for (int ii = 0; ii < nr && pr->bias; ii++)
        for (int64_t j = ks; j <= ke; j++)
            zero_bias &= pr->bias[(b * pl->Tq + i0 + ii) * pl->Tk + j] == 0.0f;
    if (kind == TILE_FULL)
        CHECK(all && zero_bias, "a FULL tile with a disallowed pair or a nonzero bias");
    /* and conversely: a tile whose allowed pairs are exactly one run of keys [amin,
     * amax] in every row, with a zero bias, is FULL over it */
    int one_run = 1;
    for (int ii = 0; ii < nr; ii++)
        for (int64_t j = j0; j < j1; j++)
            one_run &= allowed(pr, b, i0 + ii, j) == (j >= amin && j <= amax);
    for (int ii = 0; ii < nr && pr->bias && one_run; ii++)
        for (int64_t j = amin; j <= amax; j++)
            one_run &= pr->bias[(b * pl->Tq + i0 + ii) * pl->Tk + j] == 0.0f;
    CHECK(!one_run || (kind == TILE_FULL && ks == amin && ke == amax),
          "a tile allowing one run [%lld, %lld] in every row (zero bias): kind %d over [%lld, %lld]",
          (long long)amin, (long long)amax, kind, (long long)ks, (long long)ke);

    /* mask_tile on S^T (keys x columns), scores 1 + column */
    const int nk = (int)(ke - ks + 1), ld = nr;
    float *s = malloc((size_t)nk * (size_t)ld * sizeof(float));
    for (int jj = 0; jj < nk; jj++)
        for (int c = 0; c < nr; c++)
            s[jj * ld + c] = 1.0f + (float)c;
    if (kind == TILE_PARTIAL)
        sdpa_mask_tile(pl, b, 0, 1, i0, nr, lo, hi, ks, nk, s, ld, 1);
    for (int jj = 0; jj < nk; jj++)
        for (int c = 0; c < nr; c++) {
            const int64_t i = i0 + c, j = ks + jj;
            const float bv = pr->bias ? pr->bias[(b * pl->Tq + i) * pl->Tk + j] : 0.0f;
            const float want = allowed(pr, b, i, j) ? 1.0f + (float)c + bv : -INFINITY;
            CHECK(s[jj * ld + c] == want, "mask_tile b=%lld i=%lld j=%lld: %g, want %g", (long long)b,
                  (long long)i, (long long)j, s[jj * ld + c], want);
        }
    free(s);

    tile_keys tk;
    sdpa_tile_keys_init(pl, &tk, lo, hi, kind, 1, nr, ks, ke);
    CHECK(tk.seg[0] == ks && tk.seg[0] <= tk.seg[1] && tk.seg[1] <= tk.seg[2] && tk.seg[2] <= tk.seg[3] &&
              tk.seg[3] == ke + 1,
          "key runs %lld %lld %lld %lld over [%lld, %lld]", (long long)tk.seg[0], (long long)tk.seg[1],
          (long long)tk.seg[2], (long long)tk.seg[3], (long long)ks, (long long)ke);
    for (int64_t j = tk.seg[1]; j < tk.seg[2]; j++)
        for (int ii = 0; ii < nr; ii++)
            CHECK(allowed(pr, b, i0 + ii, j), "key %lld of the plain run is masked for row %lld", (long long)j,
                  (long long)(i0 + ii));
    if (!tk.banded)
        return;
    const int ca = tk.col_align;
    for (int g = 0; g < 3; g += 2)
        for (int64_t jb = tk.seg[g]; jb < tk.seg[g + 1]; jb += tk.band_keys) {
            const int64_t je = jb + tk.band_keys - 1 < tk.seg[g + 1] - 1 ? jb + tk.band_keys - 1 : tk.seg[g + 1] - 1;
            int c[4];
            sdpa_band_cols(&tk, jb, je, c);
            CHECK(c[0] % ca == 0 && (c[3] % ca == 0 || c[3] == nr) && c[0] <= c[1] && c[1] <= c[2] && c[2] <= c[3] &&
                      (c[1] % ca == 0 || c[1] == nr) && (c[2] % ca == 0 || c[2] == nr),
                  "band cut %d %d %d %d (align %d, %d columns)", c[0], c[1], c[2], c[3], ca, nr);
            for (int col = 0; col < nr; col++)
                for (int64_t j = jb; j <= je; j++) {
                    const int a = j >= lo[col] && j <= hi[col];
                    if (col < c[0] || col >= c[3])
                        CHECK(!a, "band [%lld, %lld]: column %d outside [%d, %d) sees key %lld", (long long)jb,
                              (long long)je, col, c[0], c[3], (long long)j);
                    if (col >= c[1] && col < c[2])
                        CHECK(a, "band [%lld, %lld]: column %d inside [%d, %d) does not see key %lld", (long long)jb,
                              (long long)je, col, c[1], c[2], (long long)j);
                }
        }
}

static void check_problem(int elem)
{
    problem pr;
    make_problem(&pr, elem);
    plan pl;
    const sdpa_status st = sdpa_make_plan(&pr.p, &pl, 0);
    CHECK(st == SDPA_OK, "make_plan: %s", sdpa_status_string(st));
    if (st != SDPA_OK)
        return;
    int64_t *lo = malloc((size_t)pl.bq * sizeof(int64_t)), *hi = malloc((size_t)pl.bq * sizeof(int64_t));
    for (int64_t b = 0; b < pl.B; b++) {
        const int64_t tkb = keys_of_batch(&pl, b);
        check_rows(&pl, &pr, b, tkb);
        for (int64_t i0 = 0; i0 < pl.Tq; i0 += pl.bq) {
            const int nr = (int)(pl.Tq - i0 < pl.bq ? pl.Tq - i0 : pl.bq);
            for (int ii = 0; ii < nr; ii++)
                row_range(&pl, tkb, i0 + ii, &lo[ii], &hi[ii]);
            for (int64_t j0 = 0; j0 < pl.Tk; j0 += pl.bk)
                check_tile(&pl, &pr, b, i0, nr, j0, pl.Tk - j0 < pl.bk ? pl.Tk : j0 + pl.bk, lo, hi);
        }
    }
    free(lo);
    free(hi);
    free(pr.mask);
    free(pr.bias);
}

int main(void)
{
    for (int it = 0; it < 400; it++)
        check_problem(it % 4); /* interval masks only, + boolean mask, + bias, + both */
    printf("mask geometry: %ld passed, %ld failed\n", n_pass, n_fail);
    return n_fail != 0;
}
