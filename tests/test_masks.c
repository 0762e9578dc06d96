/* SPDX-License-Identifier: MIT */
/* tests/test_masks.c - masks: what a mask allows is read and what it
 * disallows never is. NaN and overflow poisoning of masked keys and masked bias
 * entries on every ISA, a randomized differential over every mask kind, layout
 * and NaN in never-read places (forward and backward against the float64
 * reference of tests/ref.c), windows at the int64 extremes, fully masked rows,
 * NaN/Inf bias entries, and a finite bias (-FLT_MAX) that must never count as
 * a mask. */
#include "sdpa.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ref.h"
#include "util.h"

static const float poison_values[] = {NAN, 1e38f, -1e38f, INFINITY, -INFINITY, 3e38f};
#define NPOISON (sizeof poison_values / sizeof poison_values[0])

/* Poisons key row j of K and V (all heads of batch b) with a rotating value. */
static void poison_key(const sdpa_problem *p, float *k, float *v, int64_t b, int64_t j, int salt)
{
    for (int64_t h = 0; h < p->kv_heads; h++) {
        float *kr = k + ((b * p->kv_heads + h) * p->kv_len + j) * p->head_dim_qk;
        float *vr = v + ((b * p->kv_heads + h) * p->kv_len + j) * p->head_dim_v;
        for (int64_t c = 0; c < p->head_dim_qk; c++)
            kr[c] = poison_values[(size_t)(salt + c) % NPOISON];
        for (int64_t c = 0; c < p->head_dim_v; c++)
            vr[c] = poison_values[(size_t)(salt + 3 + c) % NPOISON];
    }
}

/* Every output row whose (b, h, i) does not allow any poisoned key must be
 * bitwise equal to the clean run; rows that allow a NaN-poisoned key must be NaN
 * (when expect_nan). poisoned[b*Tk + j] marks the poisoned keys. */
static void compare_rows(const sdpa_problem *p, const char *what, const uint8_t *poisoned,
                         const float *o_clean, const float *l_clean, const float *o, const float *l,
                         int expect_nan)
{
    const int64_t B = p->batch, Hq = p->q_heads, Tq = p->q_len, Tk = p->kv_len, Dv = p->head_dim_v;
    int bad = 0, clean_rows = 0, nan_rows = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int touches = 0;
                for (int64_t j = 0; j < Tk; j++)
                    if (poisoned[b * Tk + j] && ref_allowed(p, b, h, i, j))
                        touches = 1;
                const size_t r = (size_t)((b * Hq + h) * Tq + i);
                if (!touches) {
                    clean_rows++;
                    if ((!util_same_bits(o + r * (size_t)Dv, o_clean + r * (size_t)Dv, (size_t)Dv) ||
                         !util_same_bits(l + r, l_clean + r, 1)) &&
                        bad++ < 5)
                        cr_log_error("%s: row (%ld,%ld,%ld) sees no poisoned key but changed (LSE %g vs %g)",
                                     what, (long)b, (long)h, (long)i, (double)l[r], (double)l_clean[r]);
                } else if (expect_nan) {
                    nan_rows++;
                    int all_nan = isnan(l[r]);
                    for (int64_t c = 0; c < Dv; c++)
                        all_nan &= isnan(o[r * (size_t)Dv + (size_t)c]);
                    if (!all_nan && bad++ < 5)
                        cr_log_error("%s: row (%ld,%ld,%ld) attends a NaN key but is not all NaN "
                                     "(LSE %g, O[0] %g)",
                                     what, (long)b, (long)h, (long)i, (double)l[r],
                                     Dv ? (double)o[r * (size_t)Dv] : 0.0);
                }
            }
    cr_expect_eq(bad, 0, "%s: %d row(s) wrong (%d rows must be unchanged, %d must be NaN)", what, bad,
                 clean_rows, nan_rows);
    cr_expect_gt(clean_rows, 0, "%s: test setup: no row is protected by the mask", what);
}

/* Criterion copies parameters into the test process (which may be a fresh
 * exec of this binary), so parameter structs hold no pointers. */
typedef struct poison_case {
    int kind; /* 0 kv_lengths, 1 causal tl, 2 causal br + window, 3 bool mask [B,1,Tq,Tk] */
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
} poison_case;

static const char *const poison_names[] = {"kv_lengths", "causal top-left",
                                           "causal bottom-right + window", "bool mask"};

static poison_case poison_cases[] = {
    {0, 3, 2, 1, 40, 70, 24, 17},
    {1, 1, 2, 2, 67, 67, 16, 16},
    {2, 2, 4, 2, 20, 90, 9, 33},
    {3, 2, 2, 2, 35, 50, 8, 8},
};

/* Guarded O and LSE of a run on clean inputs (oc, lc) and of the same run with
 * poison where the masks forbid it (op, lp). */
typedef struct clean_poisoned {
    float *oc, *lc, *op, *lp;
} clean_poisoned;

static clean_poisoned clean_poisoned_alloc(size_t no, size_t nl)
{
    return (clean_poisoned){util_galloc(no), util_galloc(nl), util_galloc(no), util_galloc(nl)};
}

static void clean_poisoned_free(clean_poisoned *r)
{
    util_gfree(r->oc);
    util_gfree(r->lc);
    util_gfree(r->op);
    util_gfree(r->lp);
}

ParameterizedTestParameters(masks, nan_in_masked_keys)
{
    return cr_make_param_array(poison_case, poison_cases, sizeof poison_cases / sizeof poison_cases[0]);
}

/* NaN, +-inf and +-1e38 in K/V rows of masked keys have no effect at all on the
 * rows that mask them (bitwise), and a NaN key row that a query may attend makes
 * that query's O row and LSE NaN. */
ParameterizedTest(poison_case *pc, masks, nan_in_masked_keys)
{
    const int64_t B = pc->B, Hq = pc->Hq, Hkv = pc->Hkv, Tq = pc->Tq, Tk = pc->Tk, Dk = pc->Dk, Dv = pc->Dv;
    util_rng rng;
    util_rng_seed(&rng, poison_names[pc->kind], 777);
    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    const size_t nq = (size_t)(B * Hq * Tq * Dk), nk = (size_t)(B * Hkv * Tk * Dk),
                 nv = (size_t)(B * Hkv * Tk * Dv), no = (size_t)(B * Hq * Tq * Dv), nl = (size_t)(B * Hq * Tq);
    float *q = util_falloc(nq), *k = util_falloc(nk), *v = util_falloc(nv);
    util_fill_normal(&rng, q, nq, 1.0f);
    util_fill_normal(&rng, k, nk, 1.0f);
    util_fill_normal(&rng, v, nv, 1.0f);
    int32_t kvlen[3] = {(int32_t)Tk, (int32_t)(Tk / 2), 5};
    uint8_t *mask = NULL;
    uint8_t *poisoned = calloc((size_t)(B * Tk), 1);
    int expect_nan = 0;
    switch (pc->kind) {
    case 0: /* every key past kv_lengths[b] */
        p.kv_lengths = kvlen;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = kvlen[b]; j < Tk; j++)
                poisoned[b * Tk + j] = 1;
        break;
    case 1: /* keys 30 and 50 (NaN rows): rows before them are protected by causality */
        p.causal = SDPA_CAUSAL_TOP_LEFT;
        poisoned[30] = poisoned[50] = 1;
        expect_nan = 1;
        break;
    case 2: /* window of 6 keys ending at the bottom-right diagonal: poison the rest */
        p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        p.window_left = 5;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Tk - Tq - 5; j++)
                poisoned[b * Tk + j] = 1;
        poisoned[Tk - 3] = 1; /* allowed for the last rows of batch 0 */
        expect_nan = 1;
        break;
    case 3: /* bool mask: poison a few keys; rows that disallow them all are protected */
        mask = malloc((size_t)(B * Tq * Tk));
        for (int64_t i = 0; i < B * Tq * Tk; i++)
            mask[i] = util_rng_double(&rng) < 0.6;
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 7; j < Tk; j += 19)
                poisoned[b * Tk + j] = 1;
        p.bool_mask = (sdpa_bool_mask){mask, Tq * Tk, 0, Tk, 1};
        expect_nan = 1;
        break;
    }
    float *kp = util_falloc(nk), *vp = util_falloc(nv);
    memcpy(kp, k, nk * sizeof(float));
    memcpy(vp, v, nv * sizeof(float));
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Tk; j++)
            if (poisoned[b * Tk + j])
                poison_key(&p, kp, vp, b, j, expect_nan ? 0 : (int)j); /* salt 0: NaN first */
    if (expect_nan) /* make the attended poison a NaN in every K component */
        for (size_t i = 0; i < nk; i++)
            if (kp[i] != k[i] && !isnan(kp[i]))
                kp[i] = NAN;

    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        clean_poisoned r = clean_poisoned_alloc(no, nl);
        util_forward_contig(&p, isas[ii], q, k, v, r.oc, r.lc);
        util_forward_contig(&p, isas[ii], q, kp, vp, r.op, r.lp);
        char what[160];
        snprintf(what, sizeof what, "[%s] poison %s", sdpa_isa_name(isas[ii]), poison_names[pc->kind]);
        compare_rows(&p, what, poisoned, r.oc, r.lc, r.op, r.lp, expect_nan);
        clean_poisoned_free(&r);
    }
    free(q);
    free(k);
    free(v);
    free(kp);
    free(vp);
    free(mask);
    free(poisoned);
}

/* NaN / 1e38 / inf in bias entries that the boolean mask disallows have no
 * effect (bitwise), with the bias broadcast over heads. */
Test(masks, nan_in_masked_bias)
{
    const int64_t B = 2, Hq = 2, Hkv = 1, Tq = 37, Tk = 45, Dk = 12, Dv = 10;
    util_rng rng;
    util_rng_seed(&rng, "nan_in_masked_bias", 4242);
    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    const size_t nq = (size_t)(B * Hq * Tq * Dk), nk = (size_t)(B * Hkv * Tk * Dk),
                 nv = (size_t)(B * Hkv * Tk * Dv), no = (size_t)(B * Hq * Tq * Dv), nl = (size_t)(B * Hq * Tq);
    const size_t nb = (size_t)(B * Tq * Tk);
    float *q = util_falloc(nq), *k = util_falloc(nk), *v = util_falloc(nv), *bias = util_falloc(nb), *biasp = util_falloc(nb);
    uint8_t *mask = malloc(nb);
    util_fill_normal(&rng, q, nq, 1.0f);
    util_fill_normal(&rng, k, nk, 1.0f);
    util_fill_normal(&rng, v, nv, 1.0f);
    for (size_t i = 0; i < nb; i++) {
        mask[i] = util_rng_double(&rng) < 0.5;
        bias[i] = mask[i] ? (float)util_rng_normal(&rng) : 0.0f;
        biasp[i] = mask[i] ? bias[i] : poison_values[i % NPOISON];
    }
    p.bool_mask = (sdpa_bool_mask){mask, Tq * Tk, 0, Tk, 1};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        clean_poisoned r = clean_poisoned_alloc(no, nl);
        p.bias = (sdpa_bias){bias, Tq * Tk, 0, Tk, 1};
        util_forward_contig(&p, isas[ii], q, k, v, r.oc, r.lc);
        p.bias = (sdpa_bias){biasp, Tq * Tk, 0, Tk, 1};
        util_forward_contig(&p, isas[ii], q, k, v, r.op, r.lp);
        cr_expect(util_same_bits(r.oc, r.op, no) && util_same_bits(r.lc, r.lp, nl),
                  "[%s] poisoned bias entries under a false mask changed the output",
                  sdpa_isa_name(isas[ii]));
        cr_expect(!util_has_nan(r.op, no), "[%s] NaN in O", sdpa_isa_name(isas[ii]));
        clean_poisoned_free(&r);
    }
    free(q);
    free(k);
    free(v);
    free(bias);
    free(biasp);
    free(mask);
}

typedef struct fz {
    sdpa_problem p;
    tbuf q, k, v, dout;
    int32_t kvl[4];
    uint8_t *mask;
    float *bias;
    char what[256];
} fz;

static int64_t pick(util_rng *r, const int64_t *vals, int n)
{
    return vals[util_rng_int(r, 0, n - 1)];
}

/* A random problem with random masks, strided rows whose gaps hold NaN, and NaN
 * planted everywhere the contract says is never read: K/V rows no query may
 * attend, bias entries every mapped position of which is disallowed by another
 * mask, Q and dO rows of fully masked queries. (K, V and Q rows masked only
 * by a -inf bias are left finite: that case is bug_nan_key_masked_by_bias.) */
static void fz_make(fz *f, util_rng *r)
{
    static const int64_t Ts[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 40, 64, 65, 129, 200};
    static const int64_t Ds[] = {0, 1, 2, 3, 5, 8, 15, 16, 17, 20, 33};
    static const int64_t blocks[] = {0, 0, 1, 2, 3, 16, 17, 64, 512};
    memset(f, 0, sizeof *f);
    const int64_t B = util_rng_int(r, 1, 2), Hkv = util_rng_int(r, 1, 2), G = util_rng_int(r, 1, 3);
    const int64_t Tq = pick(r, Ts, 17), Tk = pick(r, Ts, 17), Dk = pick(r, Ds, 11), Dv = pick(r, Ds, 11);
    sdpa_problem *p = &f->p;
    *p = util_problem(B, Hkv * G, Hkv, Tq, Tk, Dk, Dv);
    const int sc = (int)util_rng_int(r, 0, 5);
    if (Dk == 0 || sc > 2) {
        static const float scales[] = {0.5f, -0.7f, 0.0f, 1.0f, 0.25f};
        p->use_default_scale = 0;
        p->scale = scales[util_rng_int(r, 0, 4)];
    }
    p->causal = (sdpa_causal)util_rng_int(r, 0, 2);
    p->window_alignment = (sdpa_alignment)util_rng_int(r, 0, 1);
    const int64_t wins[] = {-1, -1, -1, 0, 1, 2, 5, Tq + Tk - 1, Tq + Tk, Tq + Tk + 1, INT64_MAX};
    p->window_left = pick(r, wins, 11);
    p->window_right = pick(r, wins, 11);
    p->block_q = (int)pick(r, blocks, 9);
    p->block_k = (int)pick(r, blocks, 9);
    if (util_rng_int(r, 0, 9) < 4) {
        for (int64_t b = 0; b < B; b++)
            f->kvl[b] = (int32_t)util_rng_int(r, 0, Tk);
        p->kv_lengths = f->kvl;
    }
    const int64_t full[4] = {B, p->q_heads, Tq, Tk};
    int64_t st[4];
    if (util_rng_int(r, 0, 9) < 3) { /* boolean mask, each dim broadcast or not */
        int64_t n = 1;
        for (int d = 3; d >= 0; d--) {
            st[d] = util_rng_int(r, 0, 2) ? n : 0;
            n *= st[d] ? full[d] : 1;
        }
        f->mask = malloc((size_t)n + 1);
        for (int64_t x = 0; x < n; x++)
            f->mask[x] = util_rng_int(r, 0, 9) < 7 ? (uint8_t)util_rng_int(r, 1, 255) : 0;
        p->bool_mask = (sdpa_bool_mask){f->mask, st[0], st[1], st[2], st[3]};
    }
    if (util_rng_int(r, 0, 9) < 3) { /* bias */
        int64_t n = 1;
        for (int d = 3; d >= 0; d--) {
            st[d] = util_rng_int(r, 0, 2) ? n : 0;
            n *= st[d] ? full[d] : 1;
        }
        f->bias = malloc(((size_t)n + 1) * sizeof(float));
        for (int64_t x = 0; x < n; x++)
            f->bias[x] = util_rng_int(r, 0, 9) == 0 ? -INFINITY : (float)(4.0 * util_rng_double(r) - 2.0);
        p->bias = (sdpa_bias){f->bias, st[0], st[1], st[2], st[3]};
    }
    if (util_rng_int(r, 0, 9) < 3) /* a moved diagonal, past either end too */
        p->diagonal_offset = util_rng_int(r, -(Tq + Tk + 2), Tq + Tk + 2);
    const int64_t pad = util_rng_int(r, 0, 1) ? 3 : 0;
    f->q = tb_alloc(B, p->q_heads, Tq, Dk, pad, NAN);
    f->k = tb_alloc(B, Hkv, Tk, Dk, pad, NAN);
    f->v = tb_alloc(B, Hkv, Tk, Dv, pad, NAN);
    f->dout = tb_alloc(B, p->q_heads, Tq, Dv, pad, NAN);
    tbuf *all[4] = {&f->q, &f->k, &f->v, &f->dout};
    for (int a = 0; a < 4; a++)
        for (int64_t b = 0; b < all[a]->B; b++)
            for (int64_t h = 0; h < all[a]->H; h++)
                for (int64_t i = 0; i < all[a]->T; i++)
                    for (int64_t c = 0; c < all[a]->D; c++)
                        tb_at(all[a], b, h, i)[c] = (float)util_rng_normal(r);

    /* NaN where nothing may read. */
    for (int64_t b = 0; b < B; b++) {
        for (int64_t hk = 0; hk < Hkv; hk++)
            for (int64_t j = 0; j < Tk; j++) {
                int used = 0;
                for (int64_t h = hk * G; h < (hk + 1) * G && !used; h++)
                    for (int64_t i = 0; i < Tq && !used; i++)
                        used = ref_allowed_nobias(p, b, h, i, j); /* _nobias: see bug_nan_key_masked_by_bias */
                if (!used && util_rng_int(r, 0, 1)) {
                    for (int64_t c = 0; c < Dk; c++)
                        tb_at(&f->k, b, hk, j)[c] = NAN;
                    for (int64_t c = 0; c < Dv; c++)
                        tb_at(&f->v, b, hk, j)[c] = NAN;
                }
            }
        for (int64_t h = 0; h < p->q_heads; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int used = 0, used_nb = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    used |= ref_allowed(p, b, h, i, j);
                    used_nb |= ref_allowed_nobias(p, b, h, i, j);
                }
                if (!used_nb && util_rng_int(r, 0, 1)) /* _nobias: see bug_nan_key_masked_by_bias */
                    for (int64_t c = 0; c < Dk; c++)
                        tb_at(&f->q, b, h, i)[c] = NAN;
                if (!used && util_rng_int(r, 0, 1))
                    for (int64_t c = 0; c < Dv; c++)
                        tb_at(&f->dout, b, h, i)[c] = NAN;
            }
    }
    if (f->bias) { /* NaN in bias entries whose every position is disallowed without the bias */
        const sdpa_bias *x = &p->bias;
        int64_t n = 1;
        for (int d = 0; d < 4; d++)
            n *= (d == 0 ? x->batch_stride : d == 1 ? x->head_stride : d == 2 ? x->query_stride : x->key_stride)
                     ? full[d] : 1;
        uint8_t *used = calloc((size_t)n + 1, 1);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < p->q_heads; h++)
                for (int64_t i = 0; i < Tq; i++)
                    for (int64_t j = 0; j < Tk; j++)
                        if (ref_allowed_nobias(p, b, h, i, j))
                            used[b * x->batch_stride + h * x->head_stride + i * x->query_stride + j * x->key_stride] = 1;
        for (int64_t e = 0; e < n; e++)
            if (!used[e] && util_rng_int(r, 0, 1))
                f->bias[e] = NAN;
        free(used);
    }
    snprintf(f->what, sizeof f->what,
             "B=%ld Hq=%ld Hkv=%ld Tq=%ld Tk=%ld Dk=%ld Dv=%ld scale=%s%g causal=%d align=%d wl=%ld wr=%ld "
             "bq=%d bk=%d kvlen=%s mask=%s bias=%s pad=%ld",
             (long)B, (long)p->q_heads, (long)Hkv, (long)Tq, (long)Tk, (long)Dk, (long)Dv,
             p->use_default_scale ? "default " : "", (double)p->scale, (int)p->causal, (int)p->window_alignment,
             (long)p->window_left, (long)p->window_right, p->block_q, p->block_k, p->kv_lengths ? "yes" : "no",
             f->mask ? "yes" : "no", f->bias ? "yes" : "no", (long)pad);
}

static void fz_free(fz *f)
{
    tb_free(&f->q);
    tb_free(&f->k);
    tb_free(&f->v);
    tb_free(&f->dout);
    free(f->mask);
    free(f->bias);
}

/* Forward + backward of one ISA and thread count into fresh strided outputs. */
typedef struct fz_out {
    tbuf o, lse, dq, dk, dv;
    sdpa_status sf, sb;
} fz_out;

static void fz_run(const fz *f, sdpa_isa isa, int threads, fz_out *r)
{
    sdpa_problem p = f->p;
    p.isa = isa;
    p.num_threads = threads;
    const int64_t pad = f->q.pad;
    r->o = tb_alloc(p.batch, p.q_heads, p.q_len, p.head_dim_v, pad, util_sentinel());
    r->lse = lse_alloc(p.batch, p.q_heads, p.q_len, pad, util_sentinel());
    r->dq = tb_alloc(p.batch, p.q_heads, p.q_len, p.head_dim_qk, pad, util_sentinel());
    r->dk = tb_alloc(p.batch, p.kv_heads, p.kv_len, p.head_dim_qk, pad, util_sentinel());
    r->dv = tb_alloc(p.batch, p.kv_heads, p.kv_len, p.head_dim_v, pad, util_sentinel());
    const sdpa_tensor q = tb_in(&f->q), k = tb_in(&f->k), v = tb_in(&f->v), dO = tb_in(&f->dout);
    const sdpa_tensor_out o = tb_out(&r->o), l = tb_out(&r->lse), dq = tb_out(&r->dq), dk = tb_out(&r->dk),
                          dv = tb_out(&r->dv);
    r->sf = sdpa_forward(&p, &q, &k, &v, &o, &l);
    const sdpa_tensor oi = tb_in(&r->o), li = tb_in(&r->lse);
    r->sb = r->sf == SDPA_OK ? sdpa_backward(&p, &q, &k, &v, &oi, &li, &dO, &dq, &dk, &dv) : r->sf;
}

static void fz_out_free(fz_out *r)
{
    tb_free(&r->o);
    tb_free(&r->lse);
    tb_free(&r->dq);
    tb_free(&r->dk);
    tb_free(&r->dv);
}

static int tb_same(const tbuf *a, const tbuf *b)
{
    return a->n == b->n && util_same_bits(a->data, b->data, a->n);
}

/* Compares a strided library output to a contiguous double reference. */
static int tb_check(const tbuf *got, const double *ref, double tol, const char *name, const char *isa, const char *what)
{
    int bad = 0;
    for (int64_t b = 0; b < got->B; b++)
        for (int64_t h = 0; h < got->H; h++)
            for (int64_t i = 0; i < got->T; i++)
                for (int64_t c = 0; c < got->D; c++) {
                    const float g = tb_at(got, b, h, i)[c];
                    const double e = ref[((b * got->H + h) * got->T + i) * got->D + c];
                    if (!util_close_tol(g, e, tol) && bad++ < 3)
                        cr_log_error("[%s] %s[%ld][%ld][%ld][%ld] = %.9g, reference %.9g (tol %.3g) | %s", isa, name,
                                     (long)b, (long)h, (long)i, (long)c, (double)g, e, tol, what);
                }
    if (!tb_gaps_are(got, util_sentinel())) {
        cr_log_error("[%s] %s: a gap between rows was written | %s", isa, name, what);
        bad++;
    }
    if (!util_gintact(got->data, name))
        bad++;
    return bad;
}

static int fz_check(const fz *f, int iter)
{
    const sdpa_problem *p = &f->p;
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len,
                  Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const size_t nO = (size_t)(B * Hq * Tq * Dv), nL = (size_t)(B * Hq * Tq), nQ = (size_t)(B * Hq * Tq * Dk),
                 nK = (size_t)(B * Hkv * Tk * Dk), nV = (size_t)(B * Hkv * Tk * Dv);
    double *ro = malloc((nO + 1) * sizeof(double)), *rl = malloc((nL + 1) * sizeof(double));
    double *rdq = malloc((nQ + 1) * sizeof(double)), *rdk = malloc((nK + 1) * sizeof(double)),
           *rdv = malloc((nV + 1) * sizeof(double));
    const sdpa_tensor q = tb_in(&f->q), k = tb_in(&f->k), v = tb_in(&f->v), dO = tb_in(&f->dout);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++)
                ref_forward_row(p, &q, &k, &v, b, h, i, ro + ((b * Hq + h) * Tq + i) * Dv, rl + (b * Hq + h) * Tq + i);
    ref_backward_views(p, &q, &k, &v, &dO, rdq, rdk, rdv);
    double vmax = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t j = 0; j < Tk; j++)
                for (int64_t c = 0; c < Dv; c++) {
                    const float x = tb_at(&f->v, b, h, j)[c];
                    if (isfinite(x) && fabsf(x) > vmax)
                        vmax = fabsf(x);
                }
    const double tolO = 3e-5 * (1.0 + vmax), tolL = 3e-5 * (1.0 + util_max_abs_finite(rl, nL));
    const double tq = 2e-3 * (1.0 + util_max_abs_finite(rdq, nQ)), tk = 2e-3 * (1.0 + util_max_abs_finite(rdk, nK)),
                 tv = 2e-3 * (1.0 + util_max_abs_finite(rdv, nV));
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    int bad = 0;
    char what[320];
    snprintf(what, sizeof what, "iter %d: %s", iter, f->what);
    for (int ii = 0; ii < nisa; ii++) {
        const char *name = sdpa_isa_name(isas[ii]);
        fz_out r1, r3;
        fz_run(f, isas[ii], 1, &r1);
        fz_run(f, isas[ii], 3, &r3);
        if (r1.sf != SDPA_OK || r1.sb != SDPA_OK) {
            cr_log_error("[%s] status %d / %d | %s", name, (int)r1.sf, (int)r1.sb, what);
            bad++;
        } else {
            bad += tb_check(&r1.o, ro, tolO, "O", name, what);
            bad += tb_check(&r1.lse, rl, tolL, "LSE", name, what);
            bad += tb_check(&r1.dq, rdq, tq, "dQ", name, what);
            bad += tb_check(&r1.dk, rdk, tk, "dK", name, what);
            bad += tb_check(&r1.dv, rdv, tv, "dV", name, what);
            if (!tb_same(&r1.o, &r3.o) || !tb_same(&r1.lse, &r3.lse) || !tb_same(&r1.dq, &r3.dq) ||
                !tb_same(&r1.dk, &r3.dk) || !tb_same(&r1.dv, &r3.dv)) {
                cr_log_error("[%s] 1 thread and 3 threads differ | %s", name, what);
                bad++;
            }
        }
        fz_out_free(&r1);
        fz_out_free(&r3);
    }
    free(ro);
    free(rl);
    free(rdq);
    free(rdk);
    free(rdv);
    return bad;
}

/* Random problems, every ISA, 1 and 3 threads, forward and backward against the
 * float64 reference; NaN in padding and in every never-read position.
 * ADV_FUZZ_ITERS=N runs N problems instead of 300 (SDPA_TEST_SEED picks the seed). */
Test(masks, differential_fuzz_nan_in_never_read_places, .timeout = 300)
{
    util_rng r;
    util_rng_seed(&r, "adversarial.differential_fuzz", 0xad7e55a1);
    int bad = 0, iters = 300;
    if (getenv("ADV_FUZZ_ITERS"))
        iters = atoi(getenv("ADV_FUZZ_ITERS"));
    for (int it = 0; it < iters && bad < 10; it++) {
        fz f;
        fz_make(&f, &r);
        bad += fz_check(&f, it);
        fz_free(&f);
    }
    cr_expect_eq(bad, 0, "%d mismatch(es), see the log", bad);
}

/* Windows at int64 extremes, every causal / alignment combination, with and
 * without key lengths, Tq != Tk both ways, diagonal offsets up to the limit. */
Test(masks, windows_int64_extremes_all_alignments, .timeout = 120)
{
    static const int64_t extra[] = {-1, 0, 1, 2, INT64_MAX, INT64_MAX - 1, INT64_MAX / 2};
    const int64_t shapes[][2] = {{5, 9}, {9, 5}, {1, 17}, {17, 1}};
    util_rng r;
    util_rng_seed(&r, "adversarial.windows", 7);
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t Tq = shapes[s][0], Tk = shapes[s][1], D = 3;
        const int64_t wins[] = {extra[0], extra[1], extra[2], extra[3], extra[4], extra[5], extra[6],
                                Tq + Tk - 1, Tq + Tk, Tq + Tk + 1, Tq, Tk};
        const int nw = (int)(sizeof wins / sizeof wins[0]);
        tbuf q = tb_alloc(1, 1, Tq, D, 0, 0), k = tb_alloc(1, 1, Tk, D, 0, 0), v = tb_alloc(1, 1, Tk, D, 0, 0);
        util_fill_normal(&r, q.data, q.n, 1.0f);
        util_fill_normal(&r, k.data, k.n, 1.0f);
        util_fill_normal(&r, v.data, v.n, 1.0f);
        int32_t kvl[1] = {(int32_t)(Tk > 2 ? Tk - 2 : Tk)};
        for (int wl = 0; wl < nw; wl++)
            for (int wr = 0; wr < nw; wr++)
                for (int mode = 0; mode < 8; mode++) {
                    sdpa_problem p = util_problem(1, 1, 1, Tq, Tk, D, D);
                    p.window_left = wins[wl];
                    p.window_right = wins[wr];
                    p.causal = (sdpa_causal)(mode % 3 == 2 ? 0 : mode % 3);
                    p.window_alignment = (sdpa_alignment)((mode / 2) % 2);
                    p.kv_lengths = mode >= 4 ? kvl : NULL;
                    static const int64_t offs[] = {0, -3, 4, SDPA_MAX_DIAGONAL_OFFSET, -SDPA_MAX_DIAGONAL_OFFSET};
                    p.diagonal_offset = offs[(wl + wr + mode) % 5];
                    p.isa = SDPA_ISA_SCALAR;
                    p.block_k = mode % 2 ? 2 : 0;
                    tbuf o = tb_alloc(1, 1, Tq, D, 0, util_sentinel()), l = lse_alloc(1, 1, Tq, 0, util_sentinel());
                    const sdpa_tensor tq = tb_in(&q), tk = tb_in(&k), tv = tb_in(&v);
                    const sdpa_tensor_out to = tb_out(&o), tl = tb_out(&l);
                    const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
                    if (st != SDPA_OK) {
                        if (bad++ < 5)
                            cr_log_error("wl=%ld wr=%ld mode=%d: status %d", (long)wins[wl], (long)wins[wr], mode, (int)st);
                    } else {
                        double ro[3], rl;
                        for (int64_t i = 0; i < Tq; i++) {
                            ref_forward_row(&p, &tq, &tk, &tv, 0, 0, i, ro, &rl);
                            int ok = util_close_tol(l.data[i], rl, 1e-5 * (1 + fabs(rl)));
                            for (int c = 0; c < D; c++)
                                ok = ok && util_close_tol(o.data[i * D + c], ro[c], 1e-5 * 4);
                            if (!ok && bad++ < 5)
                                cr_log_error("Tq=%ld Tk=%ld wl=%ld wr=%ld causal=%d align=%d kvlen=%s row %ld: "
                                             "LSE %.9g vs %.9g", (long)Tq, (long)Tk, (long)wins[wl], (long)wins[wr],
                                             (int)p.causal, (int)p.window_alignment, p.kv_lengths ? "yes" : "no",
                                             (long)i, (double)l.data[i], rl);
                        }
                    }
                    tb_free(&o);
                    tb_free(&l);
                }
        tb_free(&q);
        tb_free(&k);
        tb_free(&v);
    }
    cr_expect_eq(bad, 0, "%d window case(s) wrong", bad);
}

/* ================================================== nasty values ====== */

/* Everything masked (three ways) while every input, bias excepted, is NaN:
 * O = 0, LSE = -inf, gradients exactly 0, nothing read. */
Test(masks, all_masked_with_all_inputs_nan)
{
    const int64_t B = 2, H = 2, Tq = 5, Tk = 37, D = 9;
    const size_t nq = (size_t)(B * H * Tq * D), nk = (size_t)(B * H * Tk * D);
    float *q = util_galloc_fill(nq, NAN), *k = util_galloc_fill(nk, NAN), *v = util_galloc_fill(nk, NAN),
          *dO = util_galloc_fill(nq, NAN);
    float *bias = util_galloc_fill((size_t)(Tq * Tk), -INFINITY);
    uint8_t zeros[1] = {0};
    int32_t kvl[2] = {0, 0};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int how = 0; how < 3; how++)
        for (int ii = 0; ii < nisa; ii++)
            for (int bk = 0; bk < 2; bk++) {
                sdpa_problem p = util_problem(B, H, H, Tq, Tk, D, D);
                p.isa = isas[ii];
                p.block_k = bk ? 1 : 0; /* 1: the split-KV path for this short Tq */
                if (how == 0)
                    p.bias = (sdpa_bias){bias, 0, 0, Tk, 1};
                else if (how == 1)
                    p.bool_mask = (sdpa_bool_mask){zeros, 0, 0, 0, 0};
                else
                    p.kv_lengths = kvl;
                float *o = util_galloc(nq), *l = util_galloc((size_t)(B * H * Tq)), *dq = util_galloc(nq),
                      *dk = util_galloc(nk), *dv = util_galloc(nk);
                const sdpa_tensor tq = util_cview(q, H, Tq, D), tk = util_cview(k, H, Tk, D), tv = util_cview(v, H, Tk, D),
                                  tdo = util_cview(dO, H, Tq, D);
                const sdpa_tensor_out to = util_cview_out(o, H, Tq, D), tl = util_lse_view_out(l, H, Tq),
                                      odq = util_cview_out(dq, H, Tq, D), odk = util_cview_out(dk, H, Tk, D),
                                      odv = util_cview_out(dv, H, Tk, D);
                cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
                const sdpa_tensor oi = util_cview(o, H, Tq, D), li = util_lse_view(l, H, Tq);
                cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &oi, &li, &tdo, &odq, &odk, &odv), SDPA_OK);
                int bad = 0;
                for (size_t i = 0; i < nq; i++)
                    bad += o[i] != 0.0f || dq[i] != 0.0f;
                for (size_t i = 0; i < (size_t)(B * H * Tq); i++)
                    bad += l[i] != -INFINITY;
                for (size_t i = 0; i < nk; i++)
                    bad += dk[i] != 0.0f || dv[i] != 0.0f;
                cr_expect_eq(bad, 0, "[%s] how=%d bk=%d: %d wrong values", sdpa_isa_name(isas[ii]), how, bk, bad);
                util_gfree(o);
                util_gfree(l);
                util_gfree(dq);
                util_gfree(dk);
                util_gfree(dv);
            }
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
    util_gfree(dO);
    util_gfree(bias);
}

/* A NaN or +inf bias entry at an allowed position poisons exactly its row, also
 * when it sits alone in a split-KV chunk whose other keys are all masked. */
Test(masks, bias_nan_or_inf_poisons_only_its_row)
{
    const int64_t Tq = 3, Tk = 300, D = 4;
    util_rng r;
    util_rng_seed(&r, "adversarial.bias_nan", 3);
    float *q = util_galloc(Tq * D), *k = util_galloc(Tk * D), *v = util_galloc(Tk * D);
    util_fill_normal(&r, q, Tq * D, 1.0f);
    util_fill_normal(&r, k, Tk * D, 1.0f);
    util_fill_normal(&r, v, Tk * D, 1.0f);
    float *bias = util_galloc_fill((size_t)(Tq * Tk), 0.0f);
    for (int64_t j = 280; j < 300; j++)
        bias[1 * Tk + j] = -INFINITY;
    static const float poison[] = {NAN, INFINITY};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int pi = 0; pi < 2; pi++) {
        bias[1 * Tk + 290] = poison[pi];
        for (int ii = 0; ii < nisa; ii++)
            for (int bk = 0; bk < 3; bk++) {
                sdpa_problem p = util_problem(1, 1, 1, Tq, Tk, D, D);
                p.isa = isas[ii];
                p.block_k = bk == 0 ? 0 : bk == 1 ? 4 : 1;
                p.bias = (sdpa_bias){bias, 0, 0, Tk, 1};
                float *o = util_galloc(Tq * D), *l = util_galloc(Tq);
                util_forward_plain(&p, q, k, v, o, l);
                for (int64_t i = 0; i < Tq; i++) {
                    const int want_nan = i == 1;
                    int ok = want_nan ? isnan(l[i]) : isfinite(l[i]);
                    for (int64_t c = 0; c < D; c++)
                        ok = ok && (want_nan ? isnan(o[i * D + c]) : isfinite(o[i * D + c]));
                    cr_expect(ok, "[%s] bias %g, block_k %d: row %ld has O[0] = %g, LSE = %g", sdpa_isa_name(isas[ii]),
                              (double)poison[pi], p.block_k, (long)i, (double)o[i * D], (double)l[i]);
                }
                util_gfree(o);
                util_gfree(l);
            }
    }
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
    util_gfree(bias);
}

/* ============================================ invalid arguments ====== */

/* REGRESSION (a bug found by the adversarial review, now fixed): a key disallowed by a -inf bias entry is
 * still read. src/sdpa.c mask_tile() (element-wise branch) computes the score
 * from K, then does `*sv += bias_at(...)` when the interval and boolean masks
 * allow the key, relying on x + (-inf) = -inf; but NaN + (-inf) = NaN, so a
 * NaN in a K row that the bias masks (padding, a common use of additive
 * masks) makes the whole query row NaN, and the backward spreads it to dQ, dK,
 * dV. The same happens for a fully masked query row (bias all -inf) whose Q
 * holds NaN, as soon as another row of its tile keeps a key. Contract: "a bias
 * of -inf disallows the key", "masked positions are never read". Fix: treat a
 * -inf bias as !ok (store -inf), do not add it. */
Test(masks, bug_nan_key_masked_by_bias)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        /* (a) one query, keys 0 and 1; the bias masks key 1, whose K and V rows are NaN */
        {
            const float q[1] = {1.0f}, k[2] = {0.5f, NAN}, v[2] = {3.0f, NAN}, bias[2] = {0.0f, -INFINITY};
            sdpa_problem p = util_problem(1, 1, 1, 1, 2, 1, 1);
            p.isa = isas[ii];
            p.bias = (sdpa_bias){bias, 0, 0, 0, 1};
            float o[1], l[1];
            util_forward_plain(&p, q, k, v, o, l);
            cr_expect(o[0] == 3.0f && fabsf(l[0] - 0.5f) < 1e-6f, "[%s] (a) O = %g, LSE = %g; want 3 and 0.5",
                      sdpa_isa_name(isas[ii]), (double)o[0], (double)l[0]);
        }
        /* (b) two queries; row 1 is fully masked by the bias and its Q is NaN */
        {
            const float q[2] = {1.0f, NAN}, k[2] = {0.5f, 0.25f}, v[2] = {3.0f, 5.0f};
            const float bias[4] = {0.0f, 0.0f, -INFINITY, -INFINITY};
            sdpa_problem p = util_problem(1, 1, 1, 2, 2, 1, 1);
            p.isa = isas[ii];
            p.bias = (sdpa_bias){bias, 0, 0, 2, 1};
            float o[2], l[2];
            util_forward_plain(&p, q, k, v, o, l);
            cr_expect(o[1] == 0.0f && l[1] == -INFINITY, "[%s] (b) fully masked row: O = %g, LSE = %g; want 0, -inf",
                      sdpa_isa_name(isas[ii]), (double)o[1], (double)l[1]);
        }
    }
}

/* A finite bias never masks, even -FLT_MAX on every key of every row of a tile.
 * Batch 0: every (head, row, key) carries -FLT_MAX, so every query tile of it is
 * made only of such rows (nothing else in the tile keeps a key: a tile
 * classification that took "very negative" for "masked" would skip it whole);
 * batch 1: an ordinary finite bias. Each score of batch 0 rounds to -FLT_MAX
 * exactly (in float and in double), so its rows attend uniformly: O = the mean
 * of V, LSE finite (-FLT_MAX + log Tk rounds to -FLT_MAX), and the backward
 * (|LSE| >= 256: statistics recomputed) is finite and follows P = 1/Tk. Tq = 70
 * spans several query tiles plus a tail on every ISA. Forward and backward
 * against the float64 reference with the FlashAttention rule (2x / 3x the
 * naive fp32 error), with 1 and 2 threads, on every ISA. */
Test(masks, finite_min_bias_tile_is_not_skipped, .timeout = 120)
{
    enum { B = 2, HQ = 2, HKV = 1, TQ = 70, TK = 45, DK = 24, DV = 20 };
    const size_t nq = (size_t)B * HQ * TQ * DK, nk = (size_t)B * HKV * TK * DK, nv = (size_t)B * HKV * TK * DV;
    const size_t no = (size_t)B * HQ * TQ * DV, nl = (size_t)B * HQ * TQ, nb = (size_t)B * HQ * TQ * TK;
    util_rng rng;
    util_rng_seed(&rng, "finite_min_bias_tile_is_not_skipped", 4242);
    float *q = util_falloc(nq), *k = util_falloc(nk), *v = util_falloc(nv), *dO = util_falloc(no);
    float *bias = util_falloc(nb);
    util_fill_normal(&rng, q, nq, 1.0f);
    util_fill_normal(&rng, k, nk, 1.0f);
    util_fill_normal(&rng, v, nv, 1.0f);
    util_fill_normal(&rng, dO, no, 1.0f);
    for (size_t e = 0; e < nb; e++)
        bias[e] = e < nb / 2 ? -FLT_MAX : (float)util_rng_normal(&rng);
    sdpa_problem p = util_problem(B, HQ, HKV, TQ, TK, DK, DV);
    p.bias = (sdpa_bias){bias, (int64_t)HQ * TQ * TK, (int64_t)TQ * TK, TK, 1};

    double *ro = util_dalloc(no), *rl = util_dalloc(nl), *rdq = util_dalloc(nq), *rdk = util_dalloc(nk),
           *rdv = util_dalloc(nv);
    float *no32 = util_falloc(no), *nl32 = util_falloc(nl), *ndq = util_falloc(nq), *ndk = util_falloc(nk),
          *ndv = util_falloc(nv);
    ref_forward(&p, q, k, v, ro, rl);
    ref_backward(&p, q, k, v, dO, rdq, rdk, rdv);
    naive32_forward(&p, q, k, v, no32, nl32);
    naive32_backward(&p, q, k, v, dO, ndq, ndk, ndv);
    /* the reference itself: batch 0 attends uniformly */
    for (int64_t h = 0; h < HQ; h++)
        for (int64_t i = 0; i < TQ; i++) {
            cr_assert(rl[h * TQ + i] == (double)-FLT_MAX, "reference LSE %.9g", rl[h * TQ + i]);
            for (int64_t c = 0; c < DV; c++) {
                double mean = 0.0;
                for (int64_t j = 0; j < TK; j++)
                    mean += (double)v[j * DV + c];
                mean /= TK;
                cr_assert(fabs(ro[(h * TQ + i) * DV + c] - mean) <= 1e-12, "reference O is not the mean of V");
            }
        }

    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int t = 0; t < ni; t++)
        for (int threads = 1; threads <= 2; threads++) {
            float *o = util_galloc(no), *l = util_galloc(nl), *dq = util_galloc(nq), *dk = util_galloc(nk),
                  *dv = util_galloc(nv);
            p.isa = isas[t];
            p.num_threads = threads;
            const sdpa_tensor tq = util_cview(q, HQ, TQ, DK), tk = util_cview(k, HKV, TK, DK),
                              tv = util_cview(v, HKV, TK, DV), tdo = util_cview(dO, HQ, TQ, DV),
                              oi = util_cview(o, HQ, TQ, DV), li = util_lse_view(l, HQ, TQ);
            const sdpa_tensor_out to = util_cview_out(o, HQ, TQ, DV), tl = util_lse_view_out(l, HQ, TQ),
                                  odq = util_cview_out(dq, HQ, TQ, DK), odk = util_cview_out(dk, HKV, TK, DK),
                                  odv = util_cview_out(dv, HKV, TK, DV);
            char w[96];
            snprintf(w, sizeof w, "[%s, %d thread(s)]", sdpa_isa_name(isas[t]), threads);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK, "%s forward", w);
            size_t skipped = 0;
            for (size_t r = 0; r < nl / 2; r++)
                if (!isfinite(l[r]) || l[r] != -FLT_MAX)
                    skipped++;
            cr_expect_eq(skipped, 0, "%s %zu row(s) of the -FLT_MAX batch have LSE != -FLT_MAX (first %.9g): "
                         "skipped as masked?", w, skipped, (double)l[0]);
            for (size_t e = 0; e < no / 2; e++) {
                const int64_t c = (int64_t)(e % DV);
                double mean = 0.0;
                for (int64_t j = 0; j < TK; j++)
                    mean += (double)v[j * DV + c];
                mean /= TK;
                if (!(fabs((double)o[e] - mean) <= 1e-5)) {
                    cr_expect(0, "%s O[%zu] = %.9g, the mean of V is %.9g", w, e, (double)o[e], mean);
                    break;
                }
            }
            char what[128];
            snprintf(what, sizeof what, "%s O", w);
            util_fa_expect(what, o, no32, ro, no, 2.0);
            snprintf(what, sizeof what, "%s LSE", w);
            util_fa_expect(what, l, nl32, rl, nl, 2.0);
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &oi, &li, &tdo, &odq, &odk, &odv), SDPA_OK,
                         "%s backward", w);
            cr_expect(!util_has_nan(dq, nq) && !util_has_nan(dk, nk) && !util_has_nan(dv, nv), "%s NaN gradient", w);
            snprintf(what, sizeof what, "%s dQ", w);
            util_fa_expect(what, dq, ndq, rdq, nq, 3.0);
            snprintf(what, sizeof what, "%s dK", w);
            util_fa_expect(what, dk, ndk, rdk, nk, 3.0);
            snprintf(what, sizeof what, "%s dV", w);
            util_fa_expect(what, dv, ndv, rdv, nv, 3.0);
            cr_expect(util_gintact(o, "O") && util_gintact(l, "LSE") && util_gintact(dq, "dQ") &&
                      util_gintact(dk, "dK") && util_gintact(dv, "dV"), "%s guard zones", w);
            util_gfree(o);
            util_gfree(l);
            util_gfree(dq);
            util_gfree(dk);
            util_gfree(dv);
        }
    free(q); free(k); free(v); free(dO); free(bias);
    free(ro); free(rl); free(rdq); free(rdk); free(rdv);
    free(no32); free(nl32); free(ndq); free(ndk); free(ndv);
}

/* ------------------------------------------- key padding given as a mask -- */

/* Key padding as PyTorch and transformers pass it: a boolean mask broadcast as
 * (B, 1, 1, Tk) (head and query strides 0) or materialised as (B, 1, Tq, Tk), or
 * a 0 / -inf float bias of either shape. The library finds the run of allowed
 * keys in each tile and computes it as it computes kv_lengths: forward (O, LSE)
 * and backward (dQ, dK, dV) bit for bit those of the kv_lengths call, on every
 * ISA, for decode (GQA) and prefill. (With causal too the tiles inside the
 * padding run are full and those past it skipped, as with kv_lengths; the
 * diagonal tiles are partial either way, but kv_lengths also narrows each row's
 * interval there, which cuts their products differently: same values, not the
 * same bits, so causal is left to the reference-checked mask tests.) */
typedef struct pad_shape {
    int64_t B, Hq, Hkv, Tq, Tk, D;
} pad_shape;

static void padding_case(const pad_shape *s, sdpa_isa isa, int form)
{
    const int64_t B = s->B, Hq = s->Hq, Hkv = s->Hkv, Tq = s->Tq, Tk = s->Tk, D = s->D;
    const size_t nq = (size_t)(B * Hq * Tq * D), nk = (size_t)(B * Hkv * Tk * D), nl = (size_t)(B * Hq * Tq);
    util_rng r;
    util_rng_init(&r, 77 + (uint64_t)form);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    util_fill_normal(&r, q, nq, 1.0f);
    util_fill_normal(&r, k, nk, 1.0f);
    util_fill_normal(&r, v, nk, 1.0f);
    util_fill_normal(&r, dout, nq, 1.0f);
    int32_t lens[4];
    for (int64_t b = 0; b < B; b++)
        lens[b] = (int32_t)(b == 0 ? Tk : b == 1 ? Tk / 2 + 3 : b == 2 ? 1 : Tk - 17);
    const int per_query = form == 1 || form == 3; /* (B, 1, Tq, Tk) materialised */
    const size_t nm = (size_t)(B * (per_query ? Tq : 1) * Tk);
    uint8_t *m = malloc(nm);
    float *bias = malloc(nm * 4);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < (per_query ? Tq : 1); i++)
            for (int64_t j = 0; j < Tk; j++) {
                const size_t e = (size_t)((b * (per_query ? Tq : 1) + i) * Tk + j);
                m[e] = j < lens[b];
                bias[e] = j < lens[b] ? 0.0f : -INFINITY;
            }
    sdpa_problem base = util_problem(B, Hq, Hkv, Tq, Tk, D, D);
    base.isa = isa;
    sdpa_problem pm = base, pk = base;
    pk.kv_lengths = lens;
    const int64_t bs = (per_query ? Tq : 1) * Tk, qs = per_query ? Tk : 0;
    if (form < 2)
        pm.bool_mask = (sdpa_bool_mask){m, bs, 0, qs, 1};
    else
        pm.bias = (sdpa_bias){bias, bs, 0, qs, 1};
    float *out[2][5];
    for (int c = 0; c < 2; c++) {
        const sdpa_problem *p = c ? &pm : &pk;
        for (int x = 0; x < 5; x++)
            out[c][x] = malloc((x == 1 ? nl : x == 3 || x == 4 ? nk : nq) * 4);
        const sdpa_tensor tq4 = {q, Hq * Tq * D, Tq * D, D}, tk4 = {k, Hkv * Tk * D, Tk * D, D}, tv4 = {v, Hkv * Tk * D, Tk * D, D},
                    tdo4 = {dout, Hq * Tq * D, Tq * D, D};
        const sdpa_tensor_out to = {out[c][0], Hq * Tq * D, Tq * D, D}, tl = {out[c][1], Hq * Tq, Tq, 1},
                              tdq = {out[c][2], Hq * Tq * D, Tq * D, D}, tdk = {out[c][3], Hkv * Tk * D, Tk * D, D},
                              tdv = {out[c][4], Hkv * Tk * D, Tk * D, D};
        cr_assert_eq(sdpa_forward(p, &tq4, &tk4, &tv4, &to, &tl), SDPA_OK);
        const sdpa_tensor toi = {out[c][0], Hq * Tq * D, Tq * D, D}, tli = {out[c][1], Hq * Tq, Tq, 1};
        cr_assert_eq(sdpa_backward(p, &tq4, &tk4, &tv4, &toi, &tli, &tdo4, &tdq, &tdk, &tdv), SDPA_OK);
    }
    static const char *forms[] = {"bool (B,1,1,Tk)", "bool (B,1,Tq,Tk)", "bias (B,1,1,Tk)", "bias (B,1,Tq,Tk)"};
    static const char *names[] = {"O", "LSE", "dQ", "dK", "dV"};
    for (int x = 0; x < 5; x++)
        cr_expect(memcmp(out[0][x], out[1][x], (x == 1 ? nl : x == 3 || x == 4 ? nk : nq) * 4) == 0,
                  "[%s] %lld,%lld,%lld,%lld,%lld,%lld, padding as %s: %s differs from kv_lengths'",
                  sdpa_isa_name(isa), (long long)B, (long long)Hq, (long long)Hkv, (long long)Tq, (long long)Tk,
                  (long long)D, forms[form], names[x]);
    for (int c = 0; c < 2; c++)
        for (int x = 0; x < 5; x++)
            free(out[c][x]);
    free(q), free(k), free(v), free(dout), free(m), free(bias);
}

Test(masks, key_padding_as_mask_or_bias_equals_kv_lengths, .timeout = 120)
{
    static const pad_shape shapes[] = {
        {4, 8, 2, 1, 300, 64},    /* decode, GQA */
        {4, 4, 4, 37, 200, 40},   /* short prefill, odd head_dim */
        {2, 2, 1, 150, 150, 64},
        {3, 2, 2, 128, 128, 32},
    };
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int form = 0; form < 4; form++)
                padding_case(&shapes[s], isas[ii], form);
}

/* ------------------------------ a mask the same for every head (reused tiles) -- */

/* A boolean mask or bias broadcast over heads (head stride 0) lets each thread
 * keep a key tile's classification for the other heads of the same rows, and
 * runs those heads one after another (forward.c, fwd_classify; forward_call.c,
 * fwd_item_of). The result must not change: O and LSE bit for bit those of the
 * same mask copied into every head (head stride Tq * Tk: nothing reused), on every
 * ISA, 1 and 2 threads, prefill and decode (several heads per tile); and a
 * caller's workspace reused for a second call with another mask must not carry
 * the first call's classifications over. */
static void reuse_case(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, int use_bias,
                       sdpa_isa isa, int threads)
{
    const size_t nq = (size_t)(B * Hq * Tq * D), nk = (size_t)(B * Hkv * Tk * D), nl = (size_t)(B * Hq * Tq);
    const size_t nm = (size_t)(B * Tq * Tk), nmh = nm * (size_t)Hq;
    util_rng r;
    util_rng_init(&r, 4242 + (uint64_t)use_bias);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    util_fill_normal(&r, q, nq, 1.0f);
    util_fill_normal(&r, k, nk, 1.0f);
    util_fill_normal(&r, v, nk, 1.0f);
    /* two masks: blocks of disallowed keys, a few disallowed rows, scattered holes;
       the second differs from the first in whole key tiles */
    uint8_t *m[2], *mh[2];
    float *bias[2], *biash[2];
    for (int x = 0; x < 2; x++) {
        m[x] = malloc(nm), bias[x] = malloc(nm * 4), mh[x] = malloc(nmh), biash[x] = malloc(nmh * 4);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < Tq; i++)
                for (int64_t j = 0; j < Tk; j++) {
                    const size_t e = (size_t)((b * Tq + i) * Tk + j);
                    int ok = util_rng_u64(&r) % 5 != 0;
                    if ((j / 48 + b + x) % 3 == 0) /* whole runs of keys disallowed, moved by x */
                        ok = 0;
                    if (i % 37 == 5)
                        ok = 0;
                    if ((j / 64 + x) % 4 == 1) /* runs allowed in every row */
                        ok = 1;
                    m[x][e] = (uint8_t)ok;
                    bias[x][e] = ok ? (j % 7 == 0 ? 0.5f : 0.0f) : -INFINITY;
                }
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++) {
                memcpy(mh[x] + (size_t)((b * Hq + h) * Tq * Tk), m[x] + (size_t)(b * Tq * Tk), (size_t)(Tq * Tk));
                memcpy(biash[x] + (size_t)((b * Hq + h) * Tq * Tk), bias[x] + (size_t)(b * Tq * Tk),
                       (size_t)(Tq * Tk) * 4);
            }
    }
    const sdpa_tensor tq = {q, Hq * Tq * D, Tq * D, D}, tk = {k, Hkv * Tk * D, Tk * D, D}, tv = {v, Hkv * Tk * D, Tk * D, D};
    float *out[3][2];
    for (int c = 0; c < 3; c++) { /* 0: per head, 1: broadcast, 2: broadcast in a reused workspace */
        sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, D, D);
        p.isa = isa;
        p.num_threads = threads;
        out[c][0] = malloc(nq * 4), out[c][1] = malloc(nl * 4);
        const sdpa_tensor_out to = {out[c][0], Hq * Tq * D, Tq * D, D}, tl = {out[c][1], Hq * Tq, Tq, 1};
        if (c == 0 && use_bias)
            p.bias = (sdpa_bias){biash[1], Hq * Tq * Tk, Tq * Tk, Tk, 1};
        else if (c == 0)
            p.bool_mask = (sdpa_bool_mask){mh[1], Hq * Tq * Tk, Tq * Tk, Tk, 1};
        else if (use_bias)
            p.bias = (sdpa_bias){bias[1], Tq * Tk, 0, Tk, 1};
        else
            p.bool_mask = (sdpa_bool_mask){m[1], Tq * Tk, 0, Tk, 1};
        if (c < 2) {
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            continue;
        }
        /* the same workspace, first with mask 0 (outputs discarded), then mask 1 */
        sdpa_problem p0 = p;
        if (use_bias)
            p0.bias.data = bias[0];
        else
            p0.bool_mask.data = m[0];
        size_t bytes = 0, bytes0 = 0;
        cr_assert_eq(sdpa_forward_workspace_size(&p, &bytes), SDPA_OK);
        cr_assert_eq(sdpa_forward_workspace_size(&p0, &bytes0), SDPA_OK);
        cr_assert_eq(bytes, bytes0);
        void *ws = malloc(bytes);
        cr_assert_eq(sdpa_forward_with_workspace(&p0, &tq, &tk, &tv, &to, &tl, ws, bytes), SDPA_OK);
        cr_assert_eq(sdpa_forward_with_workspace(&p, &tq, &tk, &tv, &to, &tl, ws, bytes), SDPA_OK);
        free(ws);
    }
    static const char *names[] = {"O", "LSE"};
    for (int c = 1; c < 3; c++)
        for (int x = 0; x < 2; x++)
            cr_expect(memcmp(out[0][x], out[c][x], (x ? nl : nq) * 4) == 0,
                      "[%s, %d thread(s)] %lld,%lld,%lld,%lld,%lld,%lld %s broadcast over heads%s: %s differs "
                      "from the per-head copy's",
                      sdpa_isa_name(isa), threads, (long long)B, (long long)Hq, (long long)Hkv, (long long)Tq,
                      (long long)Tk, (long long)D, use_bias ? "bias" : "bool mask",
                      c == 2 ? " (workspace reused after another mask)" : "", names[x]);
    for (int c = 0; c < 3; c++)
        free(out[c][0]), free(out[c][1]);
    for (int x = 0; x < 2; x++)
        free(m[x]), free(bias[x]), free(mh[x]), free(biash[x]);
    free(q), free(k), free(v);
}

Test(masks, mask_broadcast_over_heads_equals_per_head_copy, .timeout = 120)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++)
        for (int threads = 1; threads <= 2; threads++)
            for (int use_bias = 0; use_bias < 2; use_bias++) {
                reuse_case(2, 6, 3, 150, 200, 32, use_bias, isas[ii], threads); /* prefill, GQA */
                reuse_case(3, 8, 2, 1, 300, 64, use_bias, isas[ii], threads);   /* decode: heads share tiles */
                reuse_case(1, 4, 4, 70, 129, 16, use_bias, isas[ii], threads);
            }
}
