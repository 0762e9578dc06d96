/* SPDX-License-Identifier: MIT */
/* test_merge.c - sdpa_merge_states / sdpa_merge_states_n: attention over key
 * sets split in two or more parts, each part's (O, LSE) from sdpa_forward,
 * merged, against the float64 reference of the whole problem (the FlashAttention
 * rule: 2x the naive fp32 error); in place; parts with no key (LSE = -inf, O
 * poisoned with NaN: never read); both parts empty; bad arguments write nothing;
 * sdpa_merge_states_typed over every pair of types (bf16 / fp16 parts and O). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/dtype.h"
#include "ref.h"
#include "util.h"

enum { B = 2, H = 3, TQ = 21, TK = 150, D = 24 };

typedef struct parts {
    float *o[4], *lse[4];
    int n;
} parts;

/* Forward of the keys [k0, k1) of the problem (with kv_lengths kvl, causal as
 * given, top-left) into o, lse: K and V views start at key k0. A part whose
 * range is empty for a row gets LSE = -inf and O = 0 from the library. */
static void part_forward(const sdpa_problem *full, const float *q, const float *k, const float *v, int64_t k0,
                         int64_t k1, sdpa_isa isa, float *o, float *lse)
{
    sdpa_problem p = *full;
    p.kv_len = k1 - k0;
    p.kv_lengths = NULL; /* the parts below never cross the key length */
    p.isa = isa;
    p.num_threads = 1;
    const sdpa_tensor tq = util_cview(q, H, TQ, D);
    sdpa_tensor tk = util_cview(k, H, TK, D), tv = util_cview(v, H, TK, D);
    tk.data = k + k0 * D;
    tv.data = v + k0 * D;
    const sdpa_tensor_out to = util_cview_out(o, H, TQ, D), tl = util_lse_view_out(lse, H, TQ);
    cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
}

static void check_merge(int nparts, int in_place)
{
    util_rng r;
    util_rng_seed(&r, "merge", 0x5eed + (uint64_t)nparts * 7 + (uint64_t)in_place);
    const size_t nq = (size_t)B * H * TQ * D, nk = (size_t)B * H * TK * D, nl = (size_t)B * H * TQ;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    util_fill_uniform(&r, q, nq, -2.0f, 2.0f);
    util_fill_uniform(&r, k, nk, -2.0f, 2.0f);
    util_fill_uniform(&r, v, nk, -1.0f, 1.0f);
    sdpa_problem full = util_problem(B, H, H, TQ, TK, D, D);
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    float *no = malloc(nq * 4), *nlse = malloc(nl * 4);
    ref_forward(&full, q, k, v, ro, rl);
    naive32_forward(&full, q, k, v, no, nlse);
    const int64_t cut[5] = {0, 40, 41, 128, TK}; /* part 1 is one key; 4 parts */
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        parts ps = {.n = nparts};
        for (int s = 0; s < nparts; s++) {
            ps.o[s] = util_galloc(nq);
            ps.lse[s] = util_galloc(nl);
            const int64_t k0 = nparts == 2 ? (s ? 70 : 0) : cut[s], k1 = nparts == 2 ? (s ? TK : 70) : cut[s + 1];
            part_forward(&full, q, k, v, k0, k1, isas[ii], ps.o[s], ps.lse[s]);
        }
        sdpa_tensor vo[4], vl[4];
        for (int s = 0; s < nparts; s++) {
            vo[s] = util_cview(ps.o[s], H, TQ, D);
            vl[s] = util_lse_view(ps.lse[s], H, TQ);
        }
        float *mo = in_place ? ps.o[0] : util_galloc(nq), *ml = in_place ? ps.lse[0] : util_galloc(nl);
        const sdpa_tensor_out to = util_cview_out(mo, H, TQ, D), tl = util_lse_view_out(ml, H, TQ);
        const sdpa_status st = nparts == 2 ? sdpa_merge_states(B, H, TQ, D, &vo[0], &vl[0], &vo[1], &vl[1], &to, &tl)
                                           : sdpa_merge_states_n(nparts, B, H, TQ, D, vo, vl, &to, &tl);
        cr_assert_eq(st, SDPA_OK, "%s: %s", sdpa_isa_name(isas[ii]), sdpa_status_string(st));
        util_fa_expect("merged O", mo, no, ro, nq, 2.0);
        util_fa_expect("merged LSE", ml, nlse, rl, nl, 2.0);
        cr_expect(util_gintact(mo, "merged O") && util_gintact(ml, "merged LSE"));
        for (int s = 0; s < nparts; s++) {
            util_gfree(ps.o[s]);
            util_gfree(ps.lse[s]);
        }
        if (!in_place) {
            util_gfree(mo);
            util_gfree(ml);
        }
    }
    free(q), free(k), free(v), free(ro), free(rl), free(no), free(nlse);
}

Test(merge, two_parts_match_the_whole)
{
    check_merge(2, 0);
}

Test(merge, two_parts_in_place)
{
    check_merge(2, 1);
}

Test(merge, four_parts_n_way)
{
    check_merge(4, 0);
}

/* Empty parts: LSE = -inf with NaN in O (never read); both empty: O = 0, LSE = -inf;
 * one empty: the other part's state bit for bit (weight 1, the other 0). */
Test(merge, empty_parts)
{
    enum { T = 3, DV = 5 };
    float oa[T * DV], ob[T * DV], la[T] = {-INFINITY, -INFINITY, 0.25f}, lb[T] = {-INFINITY, 1.5f, -INFINITY};
    for (int i = 0; i < T * DV; i++) {
        oa[i] = NAN;
        ob[i] = NAN;
    }
    for (int d = 0; d < DV; d++) {
        ob[1 * DV + d] = 0.5f + (float)d; /* row 1: only b */
        oa[2 * DV + d] = -1.0f - (float)d; /* row 2: only a */
    }
    float o[T * DV], l[T];
    const sdpa_tensor va = util_cview(oa, 1, T, DV), vb = util_cview(ob, 1, T, DV), vla = util_lse_view(la, 1, T),
                      vlb = util_lse_view(lb, 1, T);
    const sdpa_tensor_out to = util_cview_out(o, 1, T, DV), tl = util_lse_view_out(l, 1, T);
    cr_assert_eq(sdpa_merge_states(1, 1, T, DV, &va, &vla, &vb, &vlb, &to, &tl), SDPA_OK);
    cr_expect(isinf(l[0]) && l[0] < 0, "both empty: LSE %g", l[0]);
    for (int d = 0; d < DV; d++) {
        cr_expect(o[d] == 0.0f, "both empty: O[%d] = %g", d, o[d]);
        cr_expect(o[DV + d] == ob[DV + d], "only b: O[%d] = %g", d, o[DV + d]);
        cr_expect(o[2 * DV + d] == oa[2 * DV + d], "only a: O[%d] = %g", d, o[2 * DV + d]);
    }
    cr_expect(l[1] == 1.5f && l[2] == 0.25f, "LSE %g %g", l[1], l[2]);
}

/* Bad arguments: a status, and nothing written. */
Test(merge, bad_arguments_write_nothing)
{
    enum { T = 4, DV = 8 };
    float oa[T * DV] = {0}, ob[T * DV] = {0}, la[T] = {0}, lb[T] = {0};
    float *o = util_galloc(T * DV), *l = util_galloc(T);
    const sdpa_tensor va = util_cview(oa, 1, T, DV), vb = util_cview(ob, 1, T, DV), vla = util_lse_view(la, 1, T),
                      vlb = util_lse_view(lb, 1, T);
    const sdpa_tensor_out to = util_cview_out(o, 1, T, DV), tl = util_lse_view_out(l, 1, T);
    cr_expect_eq(sdpa_merge_states(1, 1, T, DV, NULL, &vla, &vb, &vlb, &to, &tl), SDPA_ERR_NULL_ARGUMENT);
    cr_expect_eq(sdpa_merge_states(1, 1, T, DV, &va, &vla, &vb, &vlb, NULL, &tl), SDPA_ERR_NULL_ARGUMENT);
    cr_expect_eq(sdpa_merge_states(1, -1, T, DV, &va, &vla, &vb, &vlb, &to, &tl), SDPA_ERR_NEGATIVE_SIZE);
    cr_expect_eq(sdpa_merge_states_n(0, 1, 1, T, DV, &va, &vla, &to, &tl), SDPA_ERR_NEGATIVE_SIZE);
    /* the output overlapping an input it is not: part b's O shifted by one row */
    const sdpa_tensor_out shifted = util_cview_out(ob + DV, 1, T - 1, DV);
    cr_expect_eq(sdpa_merge_states(1, 1, T - 1, DV, &va, &vla, &vb, &vlb, &shifted, &tl), SDPA_ERR_ALIASING);
    /* an output overlapping itself */
    const sdpa_tensor_out self = {o, 0, 0, 1};
    cr_expect_eq(sdpa_merge_states(1, 1, T, DV, &va, &vla, &vb, &vlb, &self, &tl), SDPA_ERR_BAD_STRIDE);
    /* a part ending past the top of the address space (a garbage pointer whose extent
     * wraps): refused before anything is read (session 32 review) */
    const sdpa_tensor wraps = {(const void *)(UINTPTR_MAX - 15), DV, DV, DV};
    cr_expect_eq(sdpa_merge_states(1, 1, T, DV, &wraps, &vla, &vb, &vlb, &to, &tl), SDPA_ERR_SIZE_OVERFLOW);
    for (int i = 0; i < T * DV; i++)
        cr_expect(util_is_sentinel(o[i]), "O[%d] written", i);
    for (int i = 0; i < T; i++)
        cr_expect(util_is_sentinel(l[i]), "LSE[%d] written", i);
    util_gfree(o);
    util_gfree(l);
}

/* ---------------------------------------------- typed states (16-bit O) -- */

static const char *tname(sdpa_dtype t)
{
    return t == SDPA_DTYPE_F32 ? "fp32" : t == SDPA_DTYPE_BF16 ? "bf16" : "fp16";
}

/* Three parts of the keys (one of them a single key; in row 5 of every head part 1
 * empty: LSE = -inf, O NaN, never read) from the fp32 forward, stored as pt, merged
 * into an O of type ot (odd Dv: no row a multiple of a vector). Checked: (1) the bits
 * of the fp32 merge (sdpa_merge_states_n) of the parts widened, rounded once to ot,
 * and its LSE; (2) against a float64 merge of the stored parts, the error within
 * half a unit of ot's last place (relative) and a few fp32 roundings; (3) nothing
 * written past O; (4) with ot = pt, in place into part 0: the same bits. */
static void check_typed(sdpa_dtype pt, sdpa_dtype ot)
{
    enum { TB = 2, TH = 3, TT = 13, TKK = 97, TD = 19, NP = 3, GUARD = 37 };
    util_rng r;
    util_rng_seed(&r, "merge-typed", 0x7e3 + (uint64_t)pt * 3 + (uint64_t)ot);
    const size_t nq = (size_t)TB * TH * TT * TD, nk = (size_t)TB * TH * TKK * TD, nl = (size_t)TB * TH * TT;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    util_fill_uniform(&r, q, nq, -2.0f, 2.0f);
    util_fill_uniform(&r, k, nk, -2.0f, 2.0f);
    util_fill_uniform(&r, v, nk, -3.0f, 3.0f);
    const int64_t cut[NP + 1] = {0, 30, 31, TKK};
    float *o32[NP], *lse[NP];
    void *stored[NP];
    float *wide[NP];
    sdpa_tensor vo[NP], vl[NP], vw[NP];
    for (int s = 0; s < NP; s++) {
        o32[s] = malloc(nq * 4), lse[s] = malloc(nl * 4), wide[s] = malloc(nq * 4);
        sdpa_problem p = util_problem(TB, TH, TH, TT, cut[s + 1] - cut[s], TD, TD);
        p.num_threads = 1;
        sdpa_tensor tk = util_cview(k, TH, TKK, TD), tv = util_cview(v, TH, TKK, TD);
        tk.data = k + cut[s] * TD;
        tv.data = v + cut[s] * TD;
        const sdpa_tensor tq = util_cview(q, TH, TT, TD);
        const sdpa_tensor_out to = util_cview_out(o32[s], TH, TT, TD), tl = util_lse_view_out(lse[s], TH, TT);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
    }
    for (size_t row = 5; row < nl; row += TT) { /* part 1 empty in row 5 of each head */
        lse[1][row] = -INFINITY;
        for (int d = 0; d < TD; d++)
            o32[1][row * TD + (size_t)d] = NAN;
    }
    for (int s = 0; s < NP; s++) {
        stored[s] = util_store_as(pt, o32[s], nq, 0);
        for (size_t i = 0; i < nq; i++)
            wide[s][i] = util_load_as(pt, stored[s], i);
        vo[s] = util_cview(stored[s], TH, TT, TD);
        vw[s] = util_cview(wide[s], TH, TT, TD);
        vl[s] = util_lse_view(lse[s], TH, TT);
    }
    /* (1) the expected bits: the fp32 merge of the widened parts, rounded once */
    float *eo = malloc(nq * 4), *el = malloc(nl * 4);
    const sdpa_tensor_out teo = util_cview_out(eo, TH, TT, TD), tel = util_lse_view_out(el, TH, TT);
    cr_assert_eq(sdpa_merge_states_n(NP, TB, TH, TT, TD, vw, vl, &teo, &tel), SDPA_OK);
    void *expect = util_store_as(ot, eo, nq, 0);
    void *out = util_store_as(ot, eo, 0, nq + GUARD); /* all 0xA5 */
    float *ml = util_galloc(nl);
    const sdpa_tensor_out to = util_cview_out(out, TH, TT, TD), tl = util_lse_view_out(ml, TH, TT);
    const sdpa_status st = sdpa_merge_states_typed(NP, TB, TH, TT, TD, pt, vo, vl, ot, &to, &tl);
    cr_assert_eq(st, SDPA_OK, "%s -> %s: %s", tname(pt), tname(ot), sdpa_status_string(st));
    cr_expect(memcmp(out, expect, nq * util_dtype_bytes(ot)) == 0, "%s -> %s: not the fp32 merge rounded once", tname(pt),
              tname(ot));
    cr_expect(memcmp(ml, el, nl * 4) == 0, "%s -> %s: LSE not the fp32 merge's", tname(pt), tname(ot));
    cr_expect(util_guard_intact(out, nq * util_dtype_bytes(ot), GUARD * util_dtype_bytes(ot)), "%s -> %s: written past O",
              tname(pt), tname(ot));
    cr_expect(util_gintact(ml, "merged LSE"));
    /* (2) a float64 merge of the parts as stored */
    const double half_ulp = ot == SDPA_DTYPE_F32 ? 0x1p-24 : ot == SDPA_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    double worst = 0.0;
    for (size_t row = 0; row < nl; row++) {
        double M = -INFINITY, L = 0.0;
        for (int s = 0; s < NP; s++)
            M = fmax(M, (double)lse[s][row]);
        for (int s = 0; s < NP; s++)
            L += lse[s][row] == -INFINITY ? 0.0 : exp((double)lse[s][row] - M);
        const double lse64 = M + log(L);
        cr_expect(fabs(ml[row] - lse64) <= 8 * 0x1p-24 * fmax(1.0, fabs(lse64)), "%s -> %s: LSE row %zu %g vs %.9g",
                  tname(pt), tname(ot), row, ml[row], lse64);
        for (int d = 0; d < TD; d++) {
            double acc = 0.0;
            for (int s = 0; s < NP; s++)
                if (lse[s][row] != -INFINITY)
                    acc += exp((double)lse[s][row] - M) * (double)wide[s][row * TD + (size_t)d];
            const double ref = acc / L, got = util_load_as(ot, out, row * TD + (size_t)d);
            const double err = fabs(got - ref) / (half_ulp * fabs(ref) + 16 * 0x1p-24 * 3.0);
            worst = fmax(worst, err);
        }
    }
    cr_expect(worst <= 1.0, "%s -> %s: error %.3g of the bound", tname(pt), tname(ot), worst);
    /* (4) in place into part 0 */
    if (pt == ot) {
        const sdpa_tensor_out tin = util_cview_out(stored[0], TH, TT, TD), tlin = util_lse_view_out(lse[0], TH, TT);
        cr_expect_eq(sdpa_merge_states_typed(NP, TB, TH, TT, TD, pt, vo, vl, ot, &tin, &tlin), SDPA_OK);
        cr_expect(memcmp(stored[0], expect, nq * util_dtype_bytes(ot)) == 0 && memcmp(lse[0], el, nl * 4) == 0,
                  "%s: in place differs", tname(pt));
    }
    for (int s = 0; s < NP; s++)
        free(o32[s]), free(lse[s]), free(wide[s]), free(stored[s]);
    free(q), free(k), free(v), free(eo), free(el), free(expect), free(out);
    util_gfree(ml);
}

Test(merge, typed_every_pair_of_types)
{
    const sdpa_dtype ts[3] = {SDPA_DTYPE_F32, SDPA_DTYPE_BF16, SDPA_DTYPE_F16};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            check_typed(ts[a], ts[b]);
}

/* An fp16 O: a merged value past 65504 after rounding is +-inf (65519.99 rounds to
 * 65504, 65520 to inf); NaN stays NaN; a bf16 O keeps 1e30. */
Test(merge, typed_fp16_range)
{
    enum { DV = 5 };
    float oa[DV] = {65519.99f, 65520.0f, -70000.0f, NAN, 1e30f}, la[1] = {0.0f}, lb[1] = {-INFINITY};
    float ob[DV];
    for (int d = 0; d < DV; d++)
        ob[d] = NAN; /* empty part: never read */
    uint16_t o16[DV];
    float l;
    const sdpa_tensor parts[2] = {util_cview(oa, 1, 1, DV), util_cview(ob, 1, 1, DV)},
                      lparts[2] = {util_lse_view(la, 1, 1), util_lse_view(lb, 1, 1)};
    const sdpa_tensor_out to = util_cview_out((float *)(void *)o16, 1, 1, DV), tl = util_lse_view_out(&l, 1, 1);
    cr_assert_eq(sdpa_merge_states_typed(2, 1, 1, 1, DV, SDPA_DTYPE_F32, parts, lparts, SDPA_DTYPE_F16, &to, &tl),
                 SDPA_OK);
    cr_expect(util_half_to_float(o16[0]) == 65504.0f, "65519.99 -> %g", util_half_to_float(o16[0]));
    cr_expect(util_half_to_float(o16[1]) == INFINITY, "65520 -> %g", util_half_to_float(o16[1]));
    cr_expect(util_half_to_float(o16[2]) == -INFINITY, "-70000 -> %g", util_half_to_float(o16[2]));
    cr_expect(isnan(util_half_to_float(o16[3])), "NaN -> %g", util_half_to_float(o16[3]));
    cr_expect(util_half_to_float(o16[4]) == INFINITY, "1e30 -> %g", util_half_to_float(o16[4]));
    cr_expect(l == 0.0f, "LSE %g", l);
    cr_assert_eq(sdpa_merge_states_typed(2, 1, 1, 1, DV, SDPA_DTYPE_F32, parts, lparts, SDPA_DTYPE_BF16, &to, &tl),
                 SDPA_OK);
    cr_expect(fabsf(sdpa_bf16_to_f32(o16[4]) - 1e30f) <= 1e30f * 0x1p-8f, "bf16 1e30 -> %g",
              sdpa_bf16_to_f32(o16[4]));
}

/* Bad typed arguments: a status and nothing written. A 16-bit O at the address of
 * fp32 parts (or of parts of the other 16-bit type) is no in-place merge: aliasing. */
Test(merge, typed_bad_arguments_write_nothing)
{
    enum { T = 4, DV = 8 };
    float pa[T * DV] = {0}, la[T] = {0}, lb[T] = {0};
    uint16_t pb[T * DV + 1] = {0};
    float *l = util_galloc(T);
    uint16_t *o = malloc((T * DV + 1) * 2);
    memset(o, 0xA5, (T * DV + 1) * 2);
    const sdpa_tensor_out to = util_cview_out((float *)(void *)o, 1, T, DV), tl = util_lse_view_out(l, 1, T);
    const sdpa_tensor f32parts[2] = {util_cview(pa, 1, T, DV), util_cview(pa, 1, T, DV)},
                      h16parts[2] = {util_cview((float *)(void *)pb, 1, T, DV), util_cview((float *)(void *)pb, 1, T, DV)},
                      lp[2] = {util_lse_view(la, 1, T), util_lse_view(lb, 1, T)};
    cr_expect_eq(sdpa_merge_states_typed(2, 1, 1, T, DV, (sdpa_dtype)3, h16parts, lp, SDPA_DTYPE_BF16, &to, &tl),
                 SDPA_ERR_BAD_DESCRIPTOR);
    cr_expect_eq(sdpa_merge_states_typed(2, 1, 1, T, DV, SDPA_DTYPE_BF16, h16parts, lp, (sdpa_dtype)-1, &to, &tl),
                 SDPA_ERR_BAD_DESCRIPTOR);
    /* fp16 O over the bf16 parts' own memory, and a bf16 O over fp32 parts */
    const sdpa_tensor_out over16 = util_cview_out((float *)(void *)pb, 1, T, DV),
                          over32 = util_cview_out(pa, 1, T, DV);
    cr_expect_eq(sdpa_merge_states_typed(2, 1, 1, T, DV, SDPA_DTYPE_BF16, h16parts, lp, SDPA_DTYPE_F16, &over16, &tl),
                 SDPA_ERR_ALIASING);
    cr_expect_eq(sdpa_merge_states_typed(2, 1, 1, T, DV, SDPA_DTYPE_F32, f32parts, lp, SDPA_DTYPE_BF16, &over32, &tl),
                 SDPA_ERR_ALIASING);
    /* a 16-bit O or part at an odd address */
    const sdpa_tensor_out odd = util_cview_out((float *)(void *)((char *)o + 1), 1, T, DV);
    cr_expect_eq(sdpa_merge_states_typed(2, 1, 1, T, DV, SDPA_DTYPE_BF16, h16parts, lp, SDPA_DTYPE_F16, &odd, &tl),
                 SDPA_ERR_MISALIGNED);
    const sdpa_tensor oddp[2] = {util_cview((float *)(void *)((char *)pb + 1), 1, T, DV), h16parts[1]};
    cr_expect_eq(sdpa_merge_states_typed(2, 1, 1, T, DV, SDPA_DTYPE_F16, oddp, lp, SDPA_DTYPE_F16, &to, &tl),
                 SDPA_ERR_MISALIGNED);
    for (int i = 0; i < (T * DV + 1) * 2; i++)
        cr_expect(((unsigned char *)o)[i] == 0xA5, "O byte %d written", i);
    for (int i = 0; i < T; i++)
        cr_expect(util_is_sentinel(l[i]), "LSE[%d] written", i);
    cr_expect(util_gintact(l, "LSE"));
    for (int i = 0; i < T * DV; i++)
        cr_expect(pa[i] == 0.0f && pb[i] == 0, "a part written at %d", i);
    free(o);
    util_gfree(l);
}

/* ------------------------------------------------ caller-owned workspace -- */

/* sdpa_*_with_workspace: the same bits as the allocating calls, with a
 * misaligned workspace of exactly the queried size; one byte less is refused
 * with nothing written. Decode (split-KV partials) and prefill, both passes. */
static void check_workspace(int64_t Tq, int64_t Tk, int threads)
{
    enum { BW = 1, HQ = 4, HKV = 2, DW = 32 };
    util_rng r;
    util_rng_seed(&r, "workspace", 0xa11c + (uint64_t)Tq);
    const size_t nq = (size_t)BW * HQ * Tq * DW, nk = (size_t)BW * HKV * Tk * DW, nl = (size_t)BW * HQ * Tq;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dO = malloc(nq * 4);
    util_fill_uniform(&r, q, nq, -1.0f, 1.0f);
    util_fill_uniform(&r, k, nk, -1.0f, 1.0f);
    util_fill_uniform(&r, v, nk, -1.0f, 1.0f);
    util_fill_uniform(&r, dO, nq, -1.0f, 1.0f);
    sdpa_problem p = util_problem(BW, HQ, HKV, Tq, Tk, DW, DW);
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.num_threads = threads;
    const sdpa_tensor tq = util_cview(q, HQ, Tq, DW), tk = util_cview(k, HKV, Tk, DW), tv = util_cview(v, HKV, Tk, DW),
                      tdo = util_cview(dO, HQ, Tq, DW);
    float *o1 = util_galloc(nq), *l1 = util_galloc(nl), *o2 = util_galloc(nq), *l2 = util_galloc(nl);
    const sdpa_tensor_out to1 = util_cview_out(o1, HQ, Tq, DW), tl1 = util_lse_view_out(l1, HQ, Tq),
                          to2 = util_cview_out(o2, HQ, Tq, DW), tl2 = util_lse_view_out(l2, HQ, Tq);
    size_t fb = 0, bb = 0;
    cr_assert_eq(sdpa_forward_workspace_size(&p, &fb), SDPA_OK);
    cr_assert_eq(sdpa_backward_workspace_size(&p, &bb), SDPA_OK);
    char *ws = malloc((fb > bb ? fb : bb) + 3);
    cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to1, &tl1), SDPA_OK);
    cr_expect_eq(sdpa_forward_with_workspace(&p, &tq, &tk, &tv, &to2, &tl2, ws + 3, fb - 1),
                 SDPA_ERR_WORKSPACE_TOO_SMALL);
    cr_expect(util_is_sentinel(o2[0]) && util_is_sentinel(l2[0]), "a refused call wrote its outputs");
    cr_assert_eq(sdpa_forward_with_workspace(&p, &tq, &tk, &tv, &to2, &tl2, ws + 3, fb), SDPA_OK);
    cr_expect(util_same_bits(o1, o2, nq) && util_same_bits(l1, l2, nl), "forward: workspace changes the bits");
    float *g1[3] = {util_galloc(nq), util_galloc(nk), util_galloc(nk)}, *g2[3] = {util_galloc(nq), util_galloc(nk),
                                                                                   util_galloc(nk)};
    const sdpa_tensor to = util_cview(o1, HQ, Tq, DW), tl = util_lse_view(l1, HQ, Tq);
    sdpa_tensor_out d1[3] = {util_cview_out(g1[0], HQ, Tq, DW), util_cview_out(g1[1], HKV, Tk, DW),
                             util_cview_out(g1[2], HKV, Tk, DW)},
                    d2[3] = {util_cview_out(g2[0], HQ, Tq, DW), util_cview_out(g2[1], HKV, Tk, DW),
                             util_cview_out(g2[2], HKV, Tk, DW)};
    cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &d1[0], &d1[1], &d1[2]), SDPA_OK);
    cr_expect_eq(sdpa_backward_with_workspace(&p, &tq, &tk, &tv, &to, &tl, &tdo, &d2[0], &d2[1], &d2[2], ws + 1,
                                              bb - 1),
                 SDPA_ERR_WORKSPACE_TOO_SMALL);
    cr_expect(util_is_sentinel(g2[0][0]) && util_is_sentinel(g2[1][0]), "a refused backward wrote its outputs");
    cr_assert_eq(sdpa_backward_with_workspace(&p, &tq, &tk, &tv, &to, &tl, &tdo, &d2[0], &d2[1], &d2[2], ws + 1, bb),
                 SDPA_OK);
    cr_expect(util_same_bits(g1[0], g2[0], nq) && util_same_bits(g1[1], g2[1], nk) &&
                  util_same_bits(g1[2], g2[2], nk),
              "backward: workspace changes the bits");
    cr_expect_eq(sdpa_forward_with_workspace(&p, &tq, &tk, &tv, &to2, &tl2, NULL, fb), SDPA_ERR_NULL_ARGUMENT);
    cr_expect_eq(sdpa_forward_workspace_size(&p, NULL), SDPA_ERR_NULL_ARGUMENT);
    for (int i = 0; i < 3; i++) {
        util_gfree(g1[i]);
        util_gfree(g2[i]);
    }
    util_gfree(o1), util_gfree(l1), util_gfree(o2), util_gfree(l2);
    free(ws), free(q), free(k), free(v), free(dO);
}

/* The _with_workspace calls never allocate (sdpa.h: "never SDPA_ERR_OUT_OF_MEMORY"):
 * a NULL workspace of 0 bytes is SDPA_ERR_NULL_ARGUMENT, outputs untouched, where the
 * call needs one; the size query says 0 where there is nothing to compute, and then
 * NULL, 0 runs. Before (contract audit, session 30): NULL, 0 made the calls allocate
 * their own workspace like sdpa_forward / sdpa_backward, and the query never said 0. */
Test(workspace, null_workspace_is_never_replaced_by_an_allocation)
{
    enum { H = 2, T = 64, D = 16 };
    const size_t n = (size_t)H * T * D, nl = (size_t)H * T;
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *dO = malloc(n * 4), *o = util_galloc(n),
          *lse = util_galloc(nl);
    util_rng r;
    util_rng_seed(&r, "null workspace", 30);
    util_fill_uniform(&r, q, n, -1.0f, 1.0f);
    util_fill_uniform(&r, k, n, -1.0f, 1.0f);
    util_fill_uniform(&r, v, n, -1.0f, 1.0f);
    util_fill_uniform(&r, dO, n, -1.0f, 1.0f);
    sdpa_problem p = util_problem(1, H, H, T, T, D, D);
    p.num_threads = 1;
    const sdpa_tensor tq = util_cview(q, H, T, D), tk = util_cview(k, H, T, D), tv = util_cview(v, H, T, D),
                      tdo = util_cview(dO, H, T, D);
    const sdpa_tensor_out to = util_cview_out(o, H, T, D), tl = util_lse_view_out(lse, H, T);
    size_t fb = 0, bb = 0;
    cr_assert_eq(sdpa_forward_workspace_size(&p, &fb), SDPA_OK);
    cr_assert_eq(sdpa_backward_workspace_size(&p, &bb), SDPA_OK);
    cr_assert(fb > 0 && bb > 0);
    cr_expect_eq(sdpa_forward_with_workspace(&p, &tq, &tk, &tv, &to, &tl, NULL, 0), SDPA_ERR_NULL_ARGUMENT);
    cr_expect(util_is_sentinel(o[0]) && util_is_sentinel(lse[0]), "a refused forward wrote its outputs");
    /* a workspace whose extent runs past the top of the address space (session 32 review) */
    cr_expect_eq(sdpa_forward_with_workspace(&p, &tq, &tk, &tv, &to, &tl, (void *)(UINTPTR_MAX - 63), fb),
                 SDPA_ERR_SIZE_OVERFLOW);
    cr_expect(util_is_sentinel(o[0]) && util_is_sentinel(lse[0]), "a refused forward wrote its outputs");
    float *g[3] = {util_galloc(n), util_galloc(n), util_galloc(n)};
    const sdpa_tensor_out d[3] = {util_cview_out(g[0], H, T, D), util_cview_out(g[1], H, T, D),
                                  util_cview_out(g[2], H, T, D)};
    const sdpa_tensor ot = util_cview(q, H, T, D), lt = util_lse_view(q, H, T); /* any finite values */
    cr_expect_eq(sdpa_backward_with_workspace(&p, &tq, &tk, &tv, &ot, &lt, &tdo, &d[0], &d[1], &d[2], NULL, 0),
                 SDPA_ERR_NULL_ARGUMENT);
    cr_expect(util_is_sentinel(g[0][0]) && util_is_sentinel(g[1][0]) && util_is_sentinel(g[2][0]),
              "a refused backward wrote its outputs");
    /* nothing to compute (no batch): the queries say 0 bytes, and NULL, 0 is a workspace */
    sdpa_problem p0 = util_problem(0, H, H, T, T, D, D);
    cr_expect_eq(sdpa_forward_workspace_size(&p0, &fb), SDPA_OK);
    cr_expect_eq(fb, 0, "forward size %zu for an empty problem", fb);
    cr_expect_eq(sdpa_backward_workspace_size(&p0, &bb), SDPA_OK);
    cr_expect_eq(bb, 0, "backward size %zu for an empty problem", bb);
    cr_expect_eq(sdpa_forward_with_workspace(&p0, &tq, &tk, &tv, &to, &tl, NULL, 0), SDPA_OK);
    cr_expect_eq(sdpa_backward_with_workspace(&p0, &tq, &tk, &tv, &ot, &lt, &tdo, &d[0], &d[1], &d[2], NULL, 0),
                 SDPA_OK);
    for (int i = 0; i < 3; i++)
        util_gfree(g[i]);
    util_gfree(o), util_gfree(lse);
    free(q), free(k), free(v), free(dO);
}

Test(workspace, decode_split_kv_one_thread)
{
    check_workspace(1, 900, 1);
}

Test(workspace, prefill_two_threads)
{
    check_workspace(70, 90, 2);
}

/* ------------------------------------------- view structs inside an output -- */

/* The view structs (sdpa_tensor, sdpa_tensor_out) are no operand of the aliasing
 * rule, so a caller may keep them anywhere, an output buffer included (a reused
 * arena): the calls read them before writing anything (session 32 review: Q's view
 * at the start of O was read back after O's first tile was written, a SEGV). Every
 * result must equal the call with the views elsewhere, bit for bit. */
Test(api_views, view_structs_inside_an_output_buffer)
{
    enum { H = 2, T = 64, D = 16 };
    const size_t n = (size_t)H * T * D, nl = (size_t)H * T;
    util_rng r;
    util_rng_seed(&r, "views in outputs", 32);
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *dO = malloc(n * 4);
    util_fill_uniform(&r, q, n, -1.0f, 1.0f);
    util_fill_uniform(&r, k, n, -1.0f, 1.0f);
    util_fill_uniform(&r, v, n, -1.0f, 1.0f);
    util_fill_uniform(&r, dO, n, -1.0f, 1.0f);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        sdpa_problem p = util_problem(1, H, H, T, T, D, D);
        p.num_threads = 2;
        p.isa = isas[ii];
        const sdpa_tensor tq = util_cview(q, H, T, D), tk = util_cview(k, H, T, D), tv = util_cview(v, H, T, D),
                          tdo = util_cview(dO, H, T, D);
        /* the reference: views on the stack */
        float *o_ref = malloc(n * 4), *l_ref = malloc(nl * 4), *g_ref[3];
        const sdpa_tensor_out to_ref = util_cview_out(o_ref, H, T, D), tl_ref = util_lse_view_out(l_ref, H, T);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to_ref, &tl_ref), SDPA_OK);
        for (int i = 0; i < 3; i++)
            g_ref[i] = malloc(n * 4);
        const sdpa_tensor_out gr[3] = {util_cview_out(g_ref[0], H, T, D), util_cview_out(g_ref[1], H, T, D),
                                       util_cview_out(g_ref[2], H, T, D)};
        const sdpa_tensor ot = util_cview(o_ref, H, T, D), lt = util_lse_view(l_ref, H, T);
        cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &ot, &lt, &tdo, &gr[0], &gr[1], &gr[2]), SDPA_OK);

        /* forward: every view struct at the start of O */
        float *o = malloc(n * 4), *l = malloc(nl * 4);
        sdpa_tensor *vq = (sdpa_tensor *)(void *)o, *vk = vq + 1, *vv = vq + 2;
        sdpa_tensor_out *vo = (sdpa_tensor_out *)(void *)(vq + 3), *vl = vo + 1;
        cr_assert((char *)(vl + 1) <= (char *)(o + n), "the views must fit in O");
        *vq = tq, *vk = tk, *vv = tv, *vo = util_cview_out(o, H, T, D), *vl = util_lse_view_out(l, H, T);
        cr_expect_eq(sdpa_forward(&p, vq, vk, vv, vo, vl), SDPA_OK);
        cr_expect(memcmp(o, o_ref, n * 4) == 0 && memcmp(l, l_ref, nl * 4) == 0,
                  "isa %d: forward with its views in O differs", (int)isas[ii]);

        /* backward: every view struct at the start of dQ */
        float *g[3] = {malloc(n * 4), malloc(n * 4), malloc(n * 4)};
        sdpa_tensor *bq = (sdpa_tensor *)(void *)g[0], *bk = bq + 1, *bv = bq + 2, *bo = bq + 3, *bl = bq + 4,
                    *bdo = bq + 5;
        sdpa_tensor_out *bdq = (sdpa_tensor_out *)(void *)(bq + 6), *bdk = bdq + 1, *bdv = bdq + 2;
        cr_assert((char *)(bdv + 1) <= (char *)(g[0] + n), "the views must fit in dQ");
        *bq = tq, *bk = tk, *bv = tv, *bo = ot, *bl = lt, *bdo = tdo;
        *bdq = util_cview_out(g[0], H, T, D), *bdk = util_cview_out(g[1], H, T, D), *bdv = util_cview_out(g[2], H, T, D);
        cr_expect_eq(sdpa_backward(&p, bq, bk, bv, bo, bl, bdo, bdq, bdk, bdv), SDPA_OK);
        for (int i = 0; i < 3; i++)
            cr_expect(memcmp(g[i], g_ref[i], n * 4) == 0, "isa %d: gradient %d with its views in dQ differs",
                      (int)isas[ii], i);

        /* merge: the parts' view arrays in the output (two halves of the keys merged
         * into O in place of their views: the result is then checked for finiteness and
         * against a merge with the views elsewhere) */
        float *oa = malloc(n * 4), *la = malloc(nl * 4), *ob = malloc(n * 4), *lb = malloc(nl * 4);
        sdpa_problem ph = util_problem(1, H, H, T, T / 2, D, D);
        ph.isa = isas[ii];
        const sdpa_tensor ka = util_cview(k, H, T, D), va = util_cview(v, H, T, D);
        sdpa_tensor kb = ka, vb = va;
        kb.data = k + (T / 2) * D, vb.data = v + (T / 2) * D;
        const sdpa_tensor_out toa = util_cview_out(oa, H, T, D), tla = util_lse_view_out(la, H, T),
                              tob = util_cview_out(ob, H, T, D), tlb = util_lse_view_out(lb, H, T);
        cr_assert_eq(sdpa_forward(&ph, &tq, &ka, &va, &toa, &tla), SDPA_OK);
        cr_assert_eq(sdpa_forward(&ph, &tq, &kb, &vb, &tob, &tlb), SDPA_OK);
        const sdpa_tensor parts_o[2] = {util_cview(oa, H, T, D), util_cview(ob, H, T, D)},
                          parts_l[2] = {util_lse_view(la, H, T), util_lse_view(lb, H, T)};
        float *om_ref = malloc(n * 4), *lm_ref = malloc(nl * 4), *om = malloc(n * 4), *lm = malloc(nl * 4);
        const sdpa_tensor_out tom_ref = util_cview_out(om_ref, H, T, D), tlm_ref = util_lse_view_out(lm_ref, H, T);
        cr_assert_eq(sdpa_merge_states_n(2, 1, H, T, D, parts_o, parts_l, &tom_ref, &tlm_ref), SDPA_OK);
        sdpa_tensor *mv = (sdpa_tensor *)(void *)om;
        sdpa_tensor_out *mo = (sdpa_tensor_out *)(void *)(mv + 4), *ml = mo + 1;
        memcpy(mv, parts_o, sizeof parts_o);
        memcpy(mv + 2, parts_l, sizeof parts_l);
        *mo = util_cview_out(om, H, T, D), *ml = util_lse_view_out(lm, H, T);
        cr_expect_eq(sdpa_merge_states_n(2, 1, H, T, D, mv, mv + 2, mo, ml), SDPA_OK);
        cr_expect(memcmp(om, om_ref, n * 4) == 0 && memcmp(lm, lm_ref, nl * 4) == 0,
                  "isa %d: merge with its views in O differs", (int)isas[ii]);
        free(oa), free(la), free(ob), free(lb), free(om_ref), free(lm_ref), free(om), free(lm);
        free(o), free(l), free(o_ref), free(l_ref);
        for (int i = 0; i < 3; i++)
            free(g[i]), free(g_ref[i]);
    }
    free(q), free(k), free(v), free(dO);
}
