/* SPDX-License-Identifier: MIT */
/* tests/test_forward.c - forward pass against the float64 reference: worked
 * example, softmax normalisation, the 1/sqrt(d_k) variance argument, a covering
 * shape/mask/layout sweep (FlashAttention tolerance rule, thread-count bitwise
 * determinism, guard zones) and NaN/overflow poisoning of masked inputs. Every
 * test runs on every ISA the machine supports. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "util.h"

/* ------------------------------------------------------------------ helpers */




/* ------------------------------------------------------- worked example -- */

Test(forward, textbook_example)
{
    /* Q K^T / sqrt(2) then softmax, then P V: the example every tutorial uses. */
    const float q[] = {1, 0, 0, 1, 1, 1};
    const float k[] = {1, 0, 0, 1, 0.5f, 0.5f};
    const float v[] = {10, 0, 0, 10, 5, 5};
    const double approx[] = {6.16, 3.85, 3.85, 6.16, 5, 5};
    sdpa_problem p = util_problem(1, 1, 1, 3, 3, 2, 2);
    double ref_o[6], ref_lse[3];
    ref_forward(&p, q, k, v, ref_o, ref_lse);
    for (int i = 0; i < 6; i++)
        cr_assert(fabs(ref_o[i] - approx[i]) < 0.006, "reference O[%d] = %g, textbook %g", i, ref_o[i],
                  approx[i]);

    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        float *o = util_galloc(6), *lse = util_galloc(3);
        p.isa = isas[ii];
        const sdpa_tensor tq = util_cview(q, 1, 3, 2), tk = util_cview(k, 1, 3, 2),
                          tv = util_cview(v, 1, 3, 2);
        const sdpa_tensor_out to = util_cview_out(o, 1, 3, 2), tl = util_lse_view_out(lse, 1, 3);
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        cr_assert_eq(st, SDPA_OK, "[%s] sdpa_forward: %s", sdpa_isa_name(isas[ii]),
                     sdpa_status_string(st));
        for (int i = 0; i < 6; i++)
            cr_expect(fabs(o[i] - ref_o[i]) <= 1e-6, "[%s] O[%d] = %.9g, float64 %.9g",
                      sdpa_isa_name(isas[ii]), i, (double)o[i], ref_o[i]);
        for (int i = 0; i < 3; i++)
            cr_expect(fabs(lse[i] - ref_lse[i]) <= 1e-6, "[%s] LSE[%d] = %.9g, float64 %.9g",
                      sdpa_isa_name(isas[ii]), i, (double)lse[i], ref_lse[i]);
        cr_expect(util_gintact(o, "O") && util_gintact(lse, "LSE"));
        util_gfree(o);
        util_gfree(lse);
    }
}

/* ----------------------------------------------- rows of P sum to one -- */

Test(forward, probability_rows_sum_to_one)
{
    /* V = identity (Dv = Tk), so row i of O is row i of P. Causal bottom-right
     * with Tq < Tk, GQA, a boolean mask that removes some keys and one whole row. */
    const int64_t B = 2, Hq = 2, Hkv = 1, Tq = 33, Tk = 65, Dk = 16, Dv = Tk;
    util_rng rng;
    util_rng_seed(&rng, "probability_rows_sum_to_one", 1001);
    const size_t nq = (size_t)(B * Hq * Tq * Dk), nk = (size_t)(B * Hkv * Tk * Dk);
    const size_t nv = (size_t)(B * Hkv * Tk * Dv), no = (size_t)(B * Hq * Tq * Dv);
    float *q = util_falloc(nq), *k = util_falloc(nk), *v = util_falloc(nv);
    util_fill_normal(&rng, q, nq, 1.5f);
    util_fill_normal(&rng, k, nk, 1.5f);
    for (int64_t bh = 0; bh < B * Hkv; bh++)
        for (int64_t j = 0; j < Tk; j++)
            for (int64_t c = 0; c < Dv; c++)
                v[(bh * Tk + j) * Dv + c] = j == c ? 1.0f : 0.0f;
    uint8_t *mask = malloc((size_t)(B * Tq * Tk));
    for (int64_t i = 0; i < B * Tq * Tk; i++)
        mask[i] = util_rng_double(&rng) < 0.8;
    for (int64_t j = 0; j < Tk; j++)
        mask[5 * Tk + j] = 0; /* batch 0, row 5: nothing allowed */

    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.bool_mask = (sdpa_bool_mask){mask, Tq * Tk, 0, Tk, 1};
    const double scale = ref_scale(&p);

    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        const char *isa = sdpa_isa_name(isas[ii]);
        float *o = util_galloc(no), *lse = util_galloc((size_t)(B * Hq * Tq));
        p.isa = isas[ii];
        const sdpa_tensor tq = util_cview(q, Hq, Tq, Dk), tk = util_cview(k, Hkv, Tk, Dk),
                          tv = util_cview(v, Hkv, Tk, Dv);
        const sdpa_tensor_out to = util_cview_out(o, Hq, Tq, Dv), tl = util_lse_view_out(lse, Hq, Tq);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK, "[%s]", isa);
        int bad = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < Tq; i++) {
                    const float *orow = o + ((b * Hq + h) * Tq + i) * Dv;
                    const float l = lse[(b * Hq + h) * Tq + i];
                    const float *qrow = q + ((b * Hq + h) * Tq + i) * Dk;
                    const float *kh = k + (b * Hkv + h / (Hq / Hkv)) * Tk * Dk;
                    int any = 0;
                    double sum_o = 0.0, sum_e = 0.0;
                    for (int64_t j = 0; j < Tk; j++) {
                        const int allowed = ref_allowed(&p, b, h, i, j);
                        any |= allowed;
                        if (!allowed) {
                            if (orow[j] != 0.0f && bad++ < 5)
                                cr_log_error("[%s] P[%ld,%ld,%ld,%ld] = %g for a masked key", isa,
                                             (long)b, (long)h, (long)i, (long)j, (double)orow[j]);
                            continue;
                        }
                        if (!(orow[j] >= 0.0f) && bad++ < 5)
                            cr_log_error("[%s] P[%ld,%ld,%ld,%ld] = %g < 0", isa, (long)b, (long)h,
                                         (long)i, (long)j, (double)orow[j]);
                        sum_o += orow[j];
                        double s = 0.0;
                        for (int64_t c = 0; c < Dk; c++)
                            s += (double)qrow[c] * kh[j * Dk + c];
                        sum_e += exp(s * scale - (double)l);
                    }
                    if (!any) {
                        if ((l != -INFINITY || sum_o != 0.0) && bad++ < 5)
                            cr_log_error("[%s] fully masked row %ld: LSE %g, sum %g", isa, (long)i,
                                         (double)l, sum_o);
                        continue;
                    }
                    if ((fabs(sum_o - 1.0) > 2e-6 || fabs(sum_e - 1.0) > 1e-5) && bad++ < 5)
                        cr_log_error("[%s] row (%ld,%ld,%ld): sum of O row %.9f, sum exp(S - LSE) %.9f",
                                     isa, (long)b, (long)h, (long)i, sum_o, sum_e);
                }
        cr_expect_eq(bad, 0, "[%s] %d probability rows are not normalised", isa, bad);
        cr_expect(util_gintact(o, "O") && util_gintact(lse, "LSE"));
        util_gfree(o);
        util_gfree(lse);
    }
    free(q);
    free(k);
    free(v);
    free(mask);
}

/* ------------------------------------------ Var(q.k) = d_k Monte Carlo -- */

Test(forward, dot_product_variance, .timeout = 120)
{
    /* With independent unit-variance entries, Var(q.k) = d_k; scaling by
     * 1/sqrt(d_k) brings it to 1. The library computes the scaled logit of a
     * single key as LSE (Tq = Tk = 1), one pair per batch entry. The sample
     * variance of N pairs has standard error sqrt((mu4 - sigma^4) / N), with
     * mu4 = 3 d^2 + 6 d for products of normals: tolerance 5 standard errors. */
    const int64_t N = 8192;
    static const int64_t dims[] = {4, 64, 256};
    util_rng rng;
    util_rng_seed(&rng, "dot_product_variance", 2024);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int di = 0; di < 3; di++) {
        const int64_t d = dims[di];
        float *q = util_falloc((size_t)(N * d)), *k = util_falloc((size_t)(N * d)), *v = util_falloc((size_t)N);
        util_fill_normal(&rng, q, (size_t)(N * d), 1.0f);
        util_fill_normal(&rng, k, (size_t)(N * d), 1.0f);
        for (int64_t b = 0; b < N; b++)
            v[b] = 1.0f;
        float *naive = util_falloc((size_t)N);
        double *exact = util_dalloc((size_t)N);
        for (int64_t b = 0; b < N; b++) {
            double s = 0.0;
            float sf = 0.0f;
            for (int64_t c = 0; c < d; c++) {
                s += (double)q[b * d + c] * k[b * d + c];
                sf += q[b * d + c] * k[b * d + c];
            }
            exact[b] = s;
            naive[b] = sf;
        }
        for (int ii = 0; ii < nisa; ii++)
            for (int scaled = 0; scaled <= 1; scaled++) {
                const char *isa = sdpa_isa_name(isas[ii]);
                sdpa_problem p = util_problem(N, 1, 1, 1, 1, d, 1);
                p.isa = isas[ii];
                if (!scaled) {
                    p.use_default_scale = 0;
                    p.scale = 1.0f;
                }
                float *o = util_galloc((size_t)N), *lse = util_galloc((size_t)N);
                const sdpa_tensor tq = util_cview(q, 1, 1, d), tk = util_cview(k, 1, 1, d),
                                  tv = util_cview(v, 1, 1, 1);
                const sdpa_tensor_out to = util_cview_out(o, 1, 1, 1), tl = util_lse_view_out(lse, 1, 1);
                cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
                const double sc = scaled ? 1.0 / sqrt((double)d) : 1.0;
                /* The logits themselves: FlashAttention rule against float64. */
                double *ref = util_dalloc((size_t)N);
                float *nv = util_falloc((size_t)N);
                for (int64_t b = 0; b < N; b++) {
                    ref[b] = exact[b] * sc;
                    nv[b] = naive[b] * (float)sc;
                }
                char what[96];
                snprintf(what, sizeof what, "[%s] d_k=%ld %s logits", isa, (long)d,
                         scaled ? "scaled" : "unscaled");
                util_fa_expect(what, lse, nv, ref, (size_t)N, 2.0);
                double mean = 0.0, var = 0.0;
                for (int64_t b = 0; b < N; b++)
                    mean += lse[b];
                mean /= (double)N;
                for (int64_t b = 0; b < N; b++)
                    var += (lse[b] - mean) * (lse[b] - mean);
                var /= (double)(N - 1);
                const double sigma2 = (double)d * sc * sc;
                const double mu4 = (3.0 * d * d + 6.0 * d) * sc * sc * sc * sc;
                const double se = sqrt((mu4 - sigma2 * sigma2) / (double)N);
                cr_log_info("%s: mean %.4f, variance %.4f (expected %.4f +- %.4f)", what, mean, var,
                            sigma2, se);
                cr_expect(fabs(var - sigma2) <= 5.0 * se, "%s: variance %.4f, expected %.4f (SE %.4f)",
                          what, var, sigma2, se);
                cr_expect(fabs(mean) <= 5.0 * sqrt(sigma2 / (double)N), "%s: mean %.4f", what, mean);
                if (scaled)
                    cr_expect(fabs(var - 1.0) < 0.1, "%s: scaled variance %.4f is not about 1", what, var);
                free(ref);
                free(nv);
                util_gfree(o);
                util_gfree(lse);
            }
        free(q);
        free(k);
        free(v);
        free(naive);
        free(exact);
    }
}

/* ------------------------------------------------------- covering sweep -- */

typedef enum mask_kind {
    MK_NONE,
    MK_CAUSAL_TL,
    MK_CAUSAL_BR,
    MK_WINDOW_TL,     /* window_left/right, top-left alignment, no causal */
    MK_WINDOW_BR,     /* window, bottom-right alignment, no causal */
    MK_CAUSAL_WINDOW, /* causal (top-left) + window_left: sliding window */
    MK_KVLEN,         /* per-batch key lengths (some 0, some Tk) */
    MK_KVLEN_CAUSAL_BR,
    MK_BOOL_B1QK,     /* bool [B,1,Tq,Tk] + one fully masked row */
    MK_BOOL_111K,     /* bool [1,1,1,Tk] */
    MK_BOOL_FULL,     /* bool [B,Hq,Tq,Tk], every 5th row fully masked */
    MK_BIAS_FULL,     /* bias [B,Hq,Tq,Tk] with -inf and large finite negatives */
    MK_BIAS_BCAST_BOOL, /* bias [1,Hq,Tq,Tk] + bool [B,1,1,Tk] */
    MK_BIAS_ROW_FINITE  /* bias [1,1,Tq,1]-like rows of -1e30 (finite: uniform weights) */
} mask_kind;

static const char *const mask_names[] = {
    "none", "causal-tl", "causal-br", "window-tl", "window-br", "causal+window", "kv_lengths",
    "kv_lengths+causal-br", "bool[B,1,Tq,Tk]", "bool[1,1,1,Tk]", "bool[B,Hq,Tq,Tk]",
    "bias[B,Hq,Tq,Tk]", "bias[1,Hq,Tq,Tk]+bool[B,1,1,Tk]", "bias -1e30 rows"};

typedef enum layout_kind {
    LK_CONTIG,
    LK_PADDED,    /* every tensor with a row stride > D (gaps checked), LSE seq stride 2 */
    LK_BTHD,      /* Q, K, V, O stored as [B,T,H,D] */
    LK_PACKED,    /* Q, K, V sliced from one [B,T,3,H,D] buffer; O as [B,T,H,D] */
    LK_BCAST_KV   /* K, V stored once, batch stride 0 */
} layout_kind;

static const char *const layout_names[] = {"contiguous", "padded-rows", "[B,T,H,D]",
                                           "packed-qkv", "kv-batch-stride-0"};

typedef struct fcase {
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int mask;   /* mask_kind */
    int layout; /* layout_kind */
    int64_t wl, wr;
    int scale_kind; /* 0 default, 1 explicit 0.3, 2 explicit -0.7, 3 explicit 2.5 */
    int bq, bk;     /* 0 = default tiles */
} fcase;

/* A covering design, not the cartesian product: every Dk and Dv of
 * {1,3,8,15,16,17,63,64,65,80,96,128,256}, every T of {0,1,2,7,9,15,17,31,33,63,
 * 65,127,129,257,1000} (VL = 8, 16 and tiles 32, 64, 128 minus/plus one) as Tq
 * and as Tk, every mask kind, every layout, GQA 4:2 and 4:1, Tq != Tk, Dk != Dv,
 * small odd tiles so that tails cross tile borders. Each runs on every ISA. */
static fcase sweep_cases[] = {
    /* B  Hq Hkv   Tq    Tk   Dk   Dv  mask                layout       wl  wr sc bq bk */
    {1, 1, 1, 1, 1, 1, 1, MK_NONE, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 2, 2, 7, 3, 8, MK_NONE, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 2, 2, 9, 9, 15, 16, MK_CAUSAL_TL, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 1, 1, 7, 33, 17, 63, MK_CAUSAL_BR, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 2, 1, 65, 17, 64, 65, MK_CAUSAL_BR, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 1, 1, 33, 129, 80, 96, MK_CAUSAL_TL, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 1, 1, 127, 127, 128, 128, MK_WINDOW_TL, LK_CONTIG, 5, 3, 0, 0, 0},
    {1, 1, 1, 31, 257, 256, 256, MK_WINDOW_BR, LK_CONTIG, 16, 0, 0, 0, 0},
    {1, 1, 1, 1000, 1000, 8, 8, MK_CAUSAL_WINDOW, LK_CONTIG, 100, -1, 0, 0, 0},
    {3, 1, 1, 15, 65, 96, 1, MK_KVLEN, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 2, 17, 129, 63, 17, MK_KVLEN_CAUSAL_BR, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 2, 63, 63, 65, 80, MK_BOOL_B1QK, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 1, 1, 129, 31, 16, 3, MK_BOOL_111K, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 1, 33, 65, 8, 256, MK_BOOL_FULL, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 2, 65, 127, 3, 15, MK_BIAS_FULL, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 2, 257, 33, 1, 64, MK_BIAS_BCAST_BOOL, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 1, 1, 2, 9, 8, 8, MK_BIAS_ROW_FINITE, LK_CONTIG, -1, -1, 0, 0, 0},
    /* layouts */
    {1, 1, 1, 31, 1000, 17, 17, MK_NONE, LK_PADDED, -1, -1, 0, 0, 0},
    {2, 4, 2, 17, 63, 64, 64, MK_CAUSAL_BR, LK_BTHD, -1, -1, 0, 0, 0},
    {2, 3, 3, 65, 65, 15, 15, MK_CAUSAL_TL, LK_PACKED, -1, -1, 0, 0, 0},
    {3, 1, 1, 9, 129, 128, 80, MK_BOOL_B1QK, LK_BCAST_KV, -1, -1, 0, 0, 0},
    {2, 2, 2, 33, 31, 16, 16, MK_BIAS_FULL, LK_PADDED, -1, -1, 0, 0, 0},
    {2, 2, 1, 15, 17, 8, 3, MK_KVLEN, LK_BTHD, -1, -1, 0, 0, 0},
    /* GQA and MQA */
    {1, 4, 1, 7, 257, 96, 128, MK_CAUSAL_BR, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 4, 2, 15, 17, 1, 1, MK_BOOL_FULL, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 4, 2, 63, 65, 80, 63, MK_WINDOW_TL, LK_BTHD, 7, 9, 0, 0, 0},
    /* empty and decode-like shapes */
    {1, 1, 1, 0, 9, 8, 8, MK_NONE, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 1, 9, 0, 16, 8, MK_NONE, LK_CONTIG, -1, -1, 0, 0, 0},
    {2, 2, 2, 1, 1000, 256, 256, MK_KVLEN, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 1, 1, 1000, 2, 65, 63, MK_NONE, LK_CONTIG, -1, -1, 0, 0, 0},
    {1, 2, 2, 0, 0, 3, 3, MK_CAUSAL_BR, LK_CONTIG, -1, -1, 0, 0, 0},
    /* explicit scales and odd tiles crossing every tail */
    {1, 1, 1, 129, 129, 17, 8, MK_CAUSAL_TL, LK_CONTIG, -1, -1, 2, 0, 0},
    {1, 2, 2, 127, 63, 65, 17, MK_BOOL_B1QK, LK_CONTIG, -1, -1, 1, 7, 5},
    {2, 2, 1, 33, 257, 15, 65, MK_KVLEN_CAUSAL_BR, LK_CONTIG, -1, -1, 3, 3, 17},
    {1, 1, 1, 65, 65, 9, 31, MK_WINDOW_BR, LK_PADDED, 2, 2, 0, 1, 1},
    {2, 2, 2, 31, 15, 63, 1, MK_BIAS_BCAST_BOOL, LK_CONTIG, -1, -1, 0, 16, 64},
    {1, 4, 2, 17, 31, 256, 3, MK_CAUSAL_WINDOW, LK_BTHD, 4, -1, 0, 9, 8},
};

typedef struct prepared {
    fcase c;
    sdpa_problem p;
    float *q, *k, *v;      /* logical contiguous inputs */
    uint8_t *mask;
    float *bias;
    int32_t *kvlen;
    double *ref_o, *ref_lse;
    float *nv_o, *nv_lse;
    size_t nq, nk, nv, no, nl;
} prepared;

static void prepare(prepared *pr, const fcase *c, uint64_t seed)
{
    memset(pr, 0, sizeof *pr);
    pr->c = *c;
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Tq = c->Tq, Tk = c->Tk, Dk = c->Dk, Dv = c->Dv;
    util_rng rng;
    util_rng_init(&rng, seed);
    pr->nq = (size_t)(B * Hq * Tq * Dk);
    pr->nk = (size_t)(B * Hkv * Tk * Dk);
    pr->nv = (size_t)(B * Hkv * Tk * Dv);
    pr->no = (size_t)(B * Hq * Tq * Dv);
    pr->nl = (size_t)(B * Hq * Tq);
    pr->q = util_falloc(pr->nq);
    pr->k = util_falloc(pr->nk);
    pr->v = util_falloc(pr->nv);
    util_fill_normal(&rng, pr->q, pr->nq, 1.0f);
    util_fill_normal(&rng, pr->k, pr->nk, 1.0f);
    util_fill_normal(&rng, pr->v, pr->nv, 1.0f);
    if (c->layout == LK_BCAST_KV) /* every batch entry sees batch 0's K and V */
        for (int64_t b = 1; b < B; b++) {
            memcpy(pr->k + b * Hkv * Tk * Dk, pr->k, sizeof(float) * (size_t)(Hkv * Tk * Dk));
            memcpy(pr->v + b * Hkv * Tk * Dv, pr->v, sizeof(float) * (size_t)(Hkv * Tk * Dv));
        }

    sdpa_problem *p = &pr->p;
    *p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    p->block_q = c->bq;
    p->block_k = c->bk;
    static const float scales[] = {0.0f, 0.3f, -0.7f, 2.5f};
    if (c->scale_kind) {
        p->use_default_scale = 0;
        p->scale = scales[c->scale_kind];
    }
    const size_t nmask = (size_t)(B * Hq * Tq * Tk);
    switch ((mask_kind)c->mask) {
    case MK_NONE: break;
    case MK_CAUSAL_TL: p->causal = SDPA_CAUSAL_TOP_LEFT; break;
    case MK_CAUSAL_BR: p->causal = SDPA_CAUSAL_BOTTOM_RIGHT; break;
    case MK_WINDOW_TL:
        p->window_left = c->wl;
        p->window_right = c->wr;
        break;
    case MK_WINDOW_BR:
        p->window_alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        p->window_left = c->wl;
        p->window_right = c->wr;
        break;
    case MK_CAUSAL_WINDOW:
        p->causal = SDPA_CAUSAL_TOP_LEFT;
        p->window_left = c->wl;
        p->window_right = c->wr;
        break;
    case MK_KVLEN:
    case MK_KVLEN_CAUSAL_BR:
        pr->kvlen = malloc(sizeof(int32_t) * (size_t)(B ? B : 1));
        for (int64_t b = 0; b < B; b++)
            pr->kvlen[b] = b == 0 ? (int32_t)Tk : b == 1 ? 0 : (int32_t)util_rng_int(&rng, 0, Tk);
        if (B == 2 && Tk > 3)
            pr->kvlen[1] = (int32_t)(Tk / 2 + 1);
        p->kv_lengths = pr->kvlen;
        if (c->mask == MK_KVLEN_CAUSAL_BR)
            p->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        break;
    case MK_BOOL_B1QK:
        pr->mask = malloc(nmask ? nmask : 1);
        for (size_t i = 0; i < (size_t)(B * Tq * Tk); i++)
            pr->mask[i] = util_rng_double(&rng) < 0.7 ? (uint8_t)(1 + util_rng_int(&rng, 0, 254)) : 0;
        if (Tq > 1)
            memset(pr->mask + Tk, 0, (size_t)Tk); /* batch 0, row 1 */
        p->bool_mask = (sdpa_bool_mask){pr->mask, Tq * Tk, 0, Tk, 1};
        break;
    case MK_BOOL_111K:
        pr->mask = malloc((size_t)(Tk ? Tk : 1));
        for (int64_t j = 0; j < Tk; j++)
            pr->mask[j] = util_rng_double(&rng) < 0.6;
        p->bool_mask = (sdpa_bool_mask){pr->mask, 0, 0, 0, 1};
        break;
    case MK_BOOL_FULL:
        pr->mask = malloc(nmask ? nmask : 1);
        for (size_t i = 0; i < nmask; i++)
            pr->mask[i] = util_rng_double(&rng) < 0.5;
        for (int64_t r = 0; r < B * Hq * Tq; r += 5)
            memset(pr->mask + r * Tk, 0, (size_t)Tk);
        p->bool_mask = (sdpa_bool_mask){pr->mask, Hq * Tq * Tk, Tq * Tk, Tk, 1};
        break;
    case MK_BIAS_FULL:
        pr->bias = util_falloc(nmask);
        for (size_t i = 0; i < nmask; i++) {
            const double u = util_rng_double(&rng);
            pr->bias[i] = u < 0.1 ? -INFINITY : u < 0.2 ? -1e30f : u < 0.25 ? -3e38f
                                                                      : (float)(2.0 * util_rng_normal(&rng));
        }
        if (Tq > 2)
            for (int64_t j = 0; j < Tk; j++) {
                pr->bias[1 * Tk + j] = -INFINITY; /* (0,0,1): fully masked */
                pr->bias[2 * Tk + j] = -1e30f;    /* (0,0,2): finite, uniform weights */
            }
        p->bias = (sdpa_bias){pr->bias, Hq * Tq * Tk, Tq * Tk, Tk, 1};
        break;
    case MK_BIAS_BCAST_BOOL:
        pr->bias = util_falloc((size_t)(Hq * Tq * Tk));
        for (int64_t i = 0; i < Hq * Tq * Tk; i++)
            pr->bias[i] = util_rng_double(&rng) < 0.15 ? -INFINITY : (float)util_rng_normal(&rng);
        pr->mask = malloc((size_t)(B * Tk > 0 ? B * Tk : 1));
        for (int64_t i = 0; i < B * Tk; i++)
            pr->mask[i] = util_rng_double(&rng) < 0.8;
        p->bias = (sdpa_bias){pr->bias, 0, Tq * Tk, Tk, 1};
        p->bool_mask = (sdpa_bool_mask){pr->mask, Tk, 0, 0, 1};
        break;
    case MK_BIAS_ROW_FINITE:
        pr->bias = util_falloc((size_t)(Tq ? Tq : 1));
        for (int64_t i = 0; i < Tq; i++)
            pr->bias[i] = i % 2 ? -1e30f : -3e38f;
        p->bias = (sdpa_bias){pr->bias, 0, 0, 1, 0};
        break;
    }

    pr->ref_o = util_dalloc(pr->no);
    pr->ref_lse = util_dalloc(pr->nl);
    pr->nv_o = util_falloc(pr->no);
    pr->nv_lse = util_falloc(pr->nl);
    ref_forward(p, pr->q, pr->k, pr->v, pr->ref_o, pr->ref_lse);
    naive32_forward(p, pr->q, pr->k, pr->v, pr->nv_o, pr->nv_lse);
}

static void release(prepared *pr)
{
    free(pr->q);
    free(pr->k);
    free(pr->v);
    free(pr->mask);
    free(pr->bias);
    free(pr->kvlen);
    free(pr->ref_o);
    free(pr->ref_lse);
    free(pr->nv_o);
    free(pr->nv_lse);
}

/* Physical storage of one case's inputs and outputs in its layout. */
typedef struct storage {
    float *qbuf, *kbuf, *vbuf; /* guarded (kbuf, vbuf NULL when packed) */
    float *obuf, *lbuf;        /* guarded */
    size_t obuf_n, lbuf_n;
    util_layout lq, lk, lv, lo, ll;
    sdpa_tensor tq, tk, tv;
    sdpa_tensor_out to, tl;
} storage;

static void store(storage *s, const prepared *pr)
{
    const fcase *c = &pr->c;
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Tq = c->Tq, Tk = c->Tk, Dk = c->Dk, Dv = c->Dv;
    memset(s, 0, sizeof *s);
    s->ll = util_lse_layout(B, Hq, Tq);
    switch ((layout_kind)c->layout) {
    case LK_CONTIG:
    case LK_BCAST_KV:
        s->lq = util_contig(B, Hq, Tq, Dk);
        s->lk = util_contig(B, Hkv, Tk, Dk);
        s->lv = util_contig(B, Hkv, Tk, Dv);
        s->lo = util_contig(B, Hq, Tq, Dv);
        break;
    case LK_PADDED:
        s->lq = util_padded(B, Hq, Tq, Dk, Dk + 3);
        s->lk = util_padded(B, Hkv, Tk, Dk, Dk + 5);
        s->lv = util_padded(B, Hkv, Tk, Dv, Dv + 1);
        s->lo = util_padded(B, Hq, Tq, Dv, Dv + 2);
        s->ll = (util_layout){B, Hq, Tq, 1, Hq * Tq * 2, Tq * 2, 2};
        break;
    case LK_BTHD:
        s->lq = util_bthd(B, Hq, Tq, Dk);
        s->lk = util_bthd(B, Hkv, Tk, Dk);
        s->lv = util_bthd(B, Hkv, Tk, Dv);
        s->lo = util_bthd(B, Hq, Tq, Dv);
        break;
    case LK_PACKED: {
        /* [B, T, 3, H, D]: Q at +0, K at +H*D, V at +2*H*D */
        cr_assert(Tq == Tk && Hq == Hkv && Dk == Dv, "packed QKV needs Tq = Tk, Hq = Hkv, Dk = Dv");
        const int64_t H = Hq, T = Tq, D = Dk;
        const util_layout l = {B, H, T, D, T * 3 * H * D, D, 3 * H * D};
        s->lq = s->lk = s->lv = l;
        s->lo = util_bthd(B, Hq, Tq, Dv);
        const size_t n = (size_t)(B * T * 3 * H * D);
        s->qbuf = util_galloc(n);
        util_pack(&l, s->qbuf, pr->q);
        util_pack(&l, s->qbuf + H * D, pr->k);
        util_pack(&l, s->qbuf + 2 * H * D, pr->v);
        s->tq = util_view(&l, s->qbuf);
        s->tk = util_view(&l, s->qbuf + H * D);
        s->tv = util_view(&l, s->qbuf + 2 * H * D);
        break;
    }
    }
    if (c->layout != LK_PACKED) {
        s->qbuf = util_galloc(util_extent(&s->lq));
        util_pack(&s->lq, s->qbuf, pr->q);
        s->tq = util_view(&s->lq, s->qbuf);
        if (c->layout == LK_BCAST_KV) {
            /* stored once: batch stride 0 */
            util_layout k1 = util_contig(1, Hkv, Tk, Dk), v1 = util_contig(1, Hkv, Tk, Dv);
            s->kbuf = util_galloc(util_extent(&k1));
            s->vbuf = util_galloc(util_extent(&v1));
            util_pack(&k1, s->kbuf, pr->k);
            util_pack(&v1, s->vbuf, pr->v);
            s->lk.sb = 0;
            s->lv.sb = 0;
        } else {
            s->kbuf = util_galloc(util_extent(&s->lk));
            s->vbuf = util_galloc(util_extent(&s->lv));
            util_pack(&s->lk, s->kbuf, pr->k);
            util_pack(&s->lv, s->vbuf, pr->v);
        }
        s->tk = util_view(&s->lk, s->kbuf);
        s->tv = util_view(&s->lv, s->vbuf);
    }
    s->obuf_n = util_extent(&s->lo);
    s->lbuf_n = util_extent(&s->ll);
    s->obuf = util_galloc(s->obuf_n);
    s->lbuf = util_galloc(s->lbuf_n);
    s->to = util_view_out(&s->lo, s->obuf);
    s->tl = util_view_out(&s->ll, s->lbuf);
}

static void unstore(storage *s)
{
    util_gfree(s->qbuf);
    util_gfree(s->kbuf);
    util_gfree(s->vbuf);
    util_gfree(s->obuf);
    util_gfree(s->lbuf);
}

static void reset_outputs(storage *s)
{
    const float sen = util_sentinel();
    for (size_t i = 0; i < s->obuf_n; i++)
        s->obuf[i] = sen;
    for (size_t i = 0; i < s->lbuf_n; i++)
        s->lbuf[i] = sen;
}

static void describe(char *buf, size_t len, const fcase *c)
{
    snprintf(buf, len, "B=%ld Hq=%ld Hkv=%ld Tq=%ld Tk=%ld Dk=%ld Dv=%ld mask=%s layout=%s wl=%ld wr=%ld "
                       "scale#%d tiles=%dx%d",
             (long)c->B, (long)c->Hq, (long)c->Hkv, (long)c->Tq, (long)c->Tk, (long)c->Dk, (long)c->Dv,
             mask_names[c->mask], layout_names[c->layout], (long)c->wl, (long)c->wr, c->scale_kind,
             c->bq, c->bk);
}

/* The slack of the FlashAttention rule in the sweep: two fp32 ulps of the
 * largest reference value plus 1e-8 (the rule's 2x naive error carries the rest). */
#define FWD_REL_SLACK 0x1p-22
#define FWD_ABS_SLACK 1e-8

/* Runs one prepared case on every ISA and thread count 1, 2, 3: tolerance rule,
 * exact zeros in fully masked rows, guard zones and gaps, bitwise equality across
 * thread counts. */
static void run_case(const prepared *pr, const char *desc)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    storage s;
    store(&s, pr);
    float *o1 = util_falloc(pr->no), *l1 = util_falloc(pr->nl), *ot = util_falloc(pr->no), *lt = util_falloc(pr->nl);
    const int64_t Dv = pr->c.Dv;
    for (int ii = 0; ii < nisa; ii++) {
        const char *isa = sdpa_isa_name(isas[ii]);
        for (int th = 1; th <= 3; th++) {
            sdpa_problem p = pr->p;
            p.isa = isas[ii];
            p.num_threads = th;
            reset_outputs(&s);
            const sdpa_status st = sdpa_forward(&p, &s.tq, &s.tk, &s.tv, &s.to, &s.tl);
            cr_assert_eq(st, SDPA_OK, "[%s, %d threads] %s: sdpa_forward returned %s", isa, th, desc,
                         sdpa_status_string(st));
            cr_expect(util_gintact(s.obuf, "O") && util_gintact(s.lbuf, "LSE"),
                      "[%s, %d threads] %s: guard zone written", isa, th, desc);
            cr_expect(util_gaps_intact(&s.lo, s.obuf, s.obuf_n, "O gaps") &&
                          util_gaps_intact(&s.ll, s.lbuf, s.lbuf_n, "LSE gaps"),
                      "[%s, %d threads] %s: gap between rows written", isa, th, desc);
            float *o = th == 1 ? o1 : ot, *l = th == 1 ? l1 : lt;
            util_unpack(&s.lo, o, s.obuf);
            util_unpack(&s.ll, l, s.lbuf);
            if (th == 1) {
                char what[512];
                snprintf(what, sizeof what, "[%s] %s: O", isa, desc);
                util_fa_expect_slack(what, o, pr->nv_o, pr->ref_o, pr->no, 2.0, FWD_REL_SLACK,
                                     FWD_ABS_SLACK);
                const util_err eo = util_fa_compare_slack(o, pr->nv_o, pr->ref_o, pr->no, 2.0,
                                                          FWD_REL_SLACK, FWD_ABS_SLACK);
                const util_err el = util_fa_compare_slack(l, pr->nv_lse, pr->ref_lse, pr->nl, 2.0,
                                                          FWD_REL_SLACK, FWD_ABS_SLACK);
                cr_log_info("[%s] O err %.3g (naive %.3g, bound %.3g), LSE err %.3g (naive %.3g, "
                            "bound %.3g)",
                            isa, eo.err, eo.naive_err, eo.bound, el.err, el.naive_err, el.bound);
                snprintf(what, sizeof what, "[%s] %s: LSE", isa, desc);
                util_fa_expect_slack(what, l, pr->nv_lse, pr->ref_lse, pr->nl, 2.0, FWD_REL_SLACK,
                                     FWD_ABS_SLACK);
                size_t bad = 0;
                for (size_t r = 0; r < pr->nl; r++)
                    if (pr->ref_lse[r] == -INFINITY)
                        for (int64_t c = 0; c < Dv; c++)
                            bad += o[r * (size_t)Dv + (size_t)c] != 0.0f;
                cr_expect_eq(bad, 0, "[%s] %s: %zu nonzero O elements in fully masked rows", isa, desc,
                             bad);
            } else {
                cr_expect(util_same_bits(o1, ot, pr->no) && util_same_bits(l1, lt, pr->nl),
                          "[%s] %s: %d threads differ bitwise from 1 thread", isa, desc, th);
            }
        }
    }
    free(o1);
    free(l1);
    free(ot);
    free(lt);
    unstore(&s);
}

ParameterizedTestParameters(forward, sweep)
{
    return cr_make_param_array(fcase, sweep_cases, sizeof sweep_cases / sizeof sweep_cases[0]);
}

ParameterizedTest(fcase *c, forward, sweep, .timeout = 120)
{
    char desc[256];
    describe(desc, sizeof desc, c);
    size_t idx = 0; /* c points at Criterion's copy: find the case by value */
    while (idx + 1 < sizeof sweep_cases / sizeof sweep_cases[0] &&
           memcmp(&sweep_cases[idx], c, sizeof *c) != 0)
        idx++;
    char who[64];
    snprintf(who, sizeof who, "forward/sweep #%zu", idx);
    prepared pr;
    prepare(&pr, c, util_seed(who, 0x5eed0000u + idx));
    cr_log_info("forward/sweep #%zu: %s", idx, desc);
    run_case(&pr, desc);
    release(&pr);
}

/* ----------------------------------------------------------- NaN poison -- */
