/* SPDX-License-Identifier: MIT */
/* tests/test_backward.c - the backward pass (dQ, dK, dV):
 *  - central finite differences of L = sum(dO * O) through the float64 reference
 *    forward, against sdpa_backward's analytic gradient (and against
 *    ref_backward, so the reference itself is validated), under every mask
 *    kind, GQA/MQA and Dk != Dv;
 *  - oracle-free invariants (sum over keys of dK is 0; sum over keys of dV is
 *    the sum of dO over the rows that attend to something);
 *  - a covering shape/mask/layout sweep against ref_backward with the
 *    FlashAttention tolerance rule (3x the error of a naive fp32 backward);
 *  - bitwise determinism across thread counts;
 *  - fully masked rows, NaN in masked K/V rows, guard zones, Tq = 0, Dv = 0.
 * O and LSE handed to sdpa_backward always come from sdpa_forward on the same
 * ISA. Every numeric test runs on every ISA the machine supports (util_isas
 * logs the ones it skips). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "util.h"

/* ------------------------------------------------------------------ helpers */



/* Mask kinds of the generated problems. */
enum {
    M_NONE,
    M_CAUSAL_TL,
    M_CAUSAL_BR,
    M_WINDOW,    /* window_left/right, top-left alignment */
    M_WINDOW_BR, /* window, bottom-right alignment, no causal */
    M_KVLEN,     /* per-batch key lengths (one batch may have 0) */
    M_BOOL,      /* boolean mask [B, 1, Tq, Tk] broadcast over heads, some rows empty */
    M_BIAS,      /* additive bias [1, Hq, Tq, Tk] broadcast over batch, some -inf */
    M_ALL,       /* causal BR + window_left + kv_lengths + bool + bias */
    M_COUNT
};
static const char *mask_name[M_COUNT] = {"none", "causal-tl", "causal-br", "window",  "window-br",
                                         "kvlen", "bool",     "bias",      "all"};

/* Storage layouts of the generated problems. */
enum {
    L_CONTIG,
    L_BTHD,   /* every tensor stored [B, T, H, D] */
    L_PADDED, /* row strides larger than D */
    L_BCAST,  /* K, V broadcast over batch (stride 0), dO broadcast over heads */
    L_MIXED,  /* a different layout per tensor */
    L_COUNT
};
static const char *layout_name[L_COUNT] = {"contig", "bthd", "padded", "bcast", "mixed"};

/* Owner of the mask operands a problem points to. */
typedef struct masks {
    int32_t *kvl;
    uint8_t *bm;
    float *bias;
} masks;

static void masks_free(masks *m)
{
    free(m->kvl);
    free(m->bm);
    free(m->bias);
    memset(m, 0, sizeof *m);
}

/* Sets up mask kind `kind` on p (sizes already set). */
static void masks_setup(sdpa_problem *p, int kind, util_rng *r, masks *m)
{
    memset(m, 0, sizeof *m);
    const int64_t B = p->batch, Hq = p->q_heads, Tq = p->q_len, Tk = p->kv_len;
    if (kind == M_CAUSAL_TL)
        p->causal = SDPA_CAUSAL_TOP_LEFT;
    if (kind == M_CAUSAL_BR || kind == M_ALL)
        p->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    if (kind == M_WINDOW || kind == M_WINDOW_BR) {
        p->window_left = 1 + Tk / 5;
        p->window_right = Tk / 7;
        p->window_alignment = kind == M_WINDOW_BR ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    }
    if (kind == M_ALL)
        p->window_left = 2 + Tk / 3;
    if (kind == M_KVLEN || kind == M_ALL) {
        m->kvl = calloc((size_t)(B ? B : 1), sizeof(int32_t));
        cr_assert_not_null(m->kvl);
        for (int64_t b = 0; b < B; b++) /* Tk, then random, then 0 for the third batch */
            m->kvl[b] = (int32_t)(b == 0 ? Tk : b == 2 ? 0 : util_rng_int(r, 0, Tk));
        p->kv_lengths = m->kvl;
    }
    if (kind == M_BOOL || kind == M_ALL) {
        const size_t n = (size_t)(B * Tq * Tk);
        m->bm = malloc(n ? n : 1);
        cr_assert_not_null(m->bm);
        for (size_t i = 0; i < n; i++)
            m->bm[i] = util_rng_double(r) < 0.7;
        for (int64_t b = 0; b < B; b++) /* query row 1 of every batch attends to nothing */
            if (Tq > 1)
                memset(m->bm + (b * Tq + 1) * Tk, 0, (size_t)Tk);
        p->bool_mask.data = m->bm;
        p->bool_mask.batch_stride = Tq * Tk;
        p->bool_mask.head_stride = 0;
        p->bool_mask.query_stride = Tk;
        p->bool_mask.key_stride = 1;
    }
    if (kind == M_BIAS || kind == M_ALL) {
        const size_t n = (size_t)(Hq * Tq * Tk);
        m->bias = malloc(sizeof(float) * (n ? n : 1));
        cr_assert_not_null(m->bias);
        for (size_t i = 0; i < n; i++) {
            const double u = util_rng_double(r);
            m->bias[i] = u < 0.1 ? -INFINITY : u < 0.15 ? -30.0f : (float)(2.0 * util_rng_normal(r));
        }
        p->bias.data = m->bias;
        p->bias.batch_stride = 0;
        p->bias.head_stride = Tq * Tk;
        p->bias.query_stride = Tk;
        p->bias.key_stride = 1;
    }
}

/* Layouts of the nine tensors of a backward call. */
typedef struct layouts {
    util_layout q, k, v, o, lse, dout, dq, dk, dv;
} layouts;

static util_layout bcast(util_layout l, int dim)
{
    if (dim == 0)
        l.sb = 0;
    else
        l.sh = 0;
    return l;
}

static layouts make_layouts(const sdpa_problem *p, int kind)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    layouts L;
    L.q = util_contig(B, Hq, Tq, Dk);
    L.k = util_contig(B, Hkv, Tk, Dk);
    L.v = util_contig(B, Hkv, Tk, Dv);
    L.o = util_contig(B, Hq, Tq, Dv);
    L.lse = util_lse_layout(B, Hq, Tq);
    L.dout = util_contig(B, Hq, Tq, Dv);
    L.dq = util_contig(B, Hq, Tq, Dk);
    L.dk = util_contig(B, Hkv, Tk, Dk);
    L.dv = util_contig(B, Hkv, Tk, Dv);
    switch (kind) {
    case L_BTHD:
        L.q = util_bthd(B, Hq, Tq, Dk);
        L.k = util_bthd(B, Hkv, Tk, Dk);
        L.v = util_bthd(B, Hkv, Tk, Dv);
        L.o = util_bthd(B, Hq, Tq, Dv);
        L.lse = util_bthd(B, Hq, Tq, 1);
        L.dout = util_bthd(B, Hq, Tq, Dv);
        L.dq = util_bthd(B, Hq, Tq, Dk);
        L.dk = util_bthd(B, Hkv, Tk, Dk);
        L.dv = util_bthd(B, Hkv, Tk, Dv);
        break;
    case L_PADDED:
        L.q = util_padded(B, Hq, Tq, Dk, Dk + 3);
        L.k = util_padded(B, Hkv, Tk, Dk, Dk + 5);
        L.v = util_padded(B, Hkv, Tk, Dv, Dv + 1);
        L.o = util_padded(B, Hq, Tq, Dv, Dv + 2);
        L.lse = util_padded(B, Hq, Tq, 1, 3);
        L.dout = util_padded(B, Hq, Tq, Dv, Dv + 7);
        L.dq = util_padded(B, Hq, Tq, Dk, Dk + 1);
        L.dk = util_padded(B, Hkv, Tk, Dk, Dk + 2);
        L.dv = util_padded(B, Hkv, Tk, Dv, Dv + 3);
        break;
    case L_BCAST:
        L.k = bcast(L.k, 0);
        L.v = bcast(L.v, 0);
        L.dout = bcast(L.dout, 1);
        break;
    case L_MIXED:
        L.q = util_bthd(B, Hq, Tq, Dk);
        L.k = util_padded(B, Hkv, Tk, Dk, Dk + 4);
        L.o = util_padded(B, Hq, Tq, Dv, Dv + 1);
        L.lse = util_bthd(B, Hq, Tq, 1);
        L.dout = util_bthd(B, Hq, Tq, Dv);
        L.dq = util_padded(B, Hq, Tq, Dk, Dk + 2);
        L.dk = util_bthd(B, Hkv, Tk, Dk);
        L.dv = util_padded(B, Hkv, Tk, Dv, Dv + 1);
        break;
    default:
        break;
    }
    return L;
}

/* Logical (contiguous) inputs of a problem. */
typedef util_inputs inputs;

/* Random inputs in [-1, 1] (or multiples of 2^-10 in [-1, 1] when exact != 0,
 * so that x +- 2^-10 and x +- 2^-11 are exact fp32 values). With L_BCAST the
 * broadcast dimensions hold identical data. */
static inputs make_inputs(const sdpa_problem *p, const layouts *L, util_rng *r, int exact)
{
    inputs in;
    in.nq = util_numel(&L->q);
    in.nk = util_numel(&L->k);
    in.nv = util_numel(&L->v);
    in.no = util_numel(&L->dout);
    in.nl = (size_t)(p->batch * p->q_heads * p->q_len);
    in.q = util_falloc(in.nq);
    in.k = util_falloc(in.nk);
    in.v = util_falloc(in.nv);
    in.dout = util_falloc(in.no);
    float *arr[4] = {in.q, in.k, in.v, in.dout};
    const size_t n[4] = {in.nq, in.nk, in.nv, in.no};
    for (int t = 0; t < 4; t++) {
        if (exact)
            for (size_t i = 0; i < n[t]; i++)
                arr[t][i] = (float)util_rng_int(r, -1024, 1024) / 1024.0f;
        else
            util_fill_uniform(r, arr[t], n[t], -1.0f, 1.0f);
    }
    /* Make broadcast dimensions consistent: copy index 0 of the broadcast dim. */
    const util_layout *ls[4] = {&L->q, &L->k, &L->v, &L->dout};
    for (int t = 0; t < 4; t++) {
        const util_layout *l = ls[t];
        for (int64_t b = 0; b < l->B; b++)
            for (int64_t h = 0; h < l->H; h++) {
                const int64_t sb = l->sb == 0 ? 0 : b, sh = l->sh == 0 ? 0 : h;
                if (sb == b && sh == h)
                    continue;
                memcpy(arr[t] + ((b * l->H + h) * l->T) * l->D, arr[t] + ((sb * l->H + sh) * l->T) * l->D,
                       sizeof(float) * (size_t)(l->T * l->D));
            }
    }
    return in;
}

/* Runs sdpa_forward then sdpa_backward (O and LSE from that forward) with the
 * given layouts, checks statuses, guard zones and untouched gaps, and returns
 * the unpacked results. `what` names the run in messages. */
static int run_fb(const sdpa_problem *p, const layouts *L, const inputs *in, util_outputs *res,
                  const char *what)
{
    float *gq = util_gpack(&L->q, in->q), *gk = util_gpack(&L->k, in->k),
          *gv = util_gpack(&L->v, in->v), *gdo = util_gpack(&L->dout, in->dout);
    const size_t eo = util_extent(&L->o), el = util_extent(&L->lse), edq = util_extent(&L->dq),
                 edk = util_extent(&L->dk), edv = util_extent(&L->dv);
    float *go = util_galloc(eo), *gl = util_galloc(el), *gdq = util_galloc(edq), *gdk = util_galloc(edk),
          *gdv = util_galloc(edv);
    const sdpa_tensor tq = util_view(&L->q, gq), tk = util_view(&L->k, gk), tv = util_view(&L->v, gv),
                      tdo = util_view(&L->dout, gdo);
    const sdpa_tensor_out to = util_view_out(&L->o, go), tl = util_view_out(&L->lse, gl);
    int ok = 1;
    sdpa_status st = sdpa_forward(p, &tq, &tk, &tv, &to, &tl);
    cr_expect_eq(st, SDPA_OK, "%s: sdpa_forward: %s", what, sdpa_status_string(st));
    ok &= st == SDPA_OK;
    const sdpa_tensor tio = util_view(&L->o, go), til = util_view(&L->lse, gl);
    const sdpa_tensor_out tdq = util_view_out(&L->dq, gdq), tdk = util_view_out(&L->dk, gdk),
                          tdv = util_view_out(&L->dv, gdv);
    st = sdpa_backward(p, &tq, &tk, &tv, &tio, &til, &tdo, &tdq, &tdk, &tdv);
    cr_expect_eq(st, SDPA_OK, "%s: sdpa_backward: %s", what, sdpa_status_string(st));
    ok &= st == SDPA_OK;
    char w[256];
    const float *outs[5] = {go, gl, gdq, gdk, gdv};
    const util_layout *ols[5] = {&L->o, &L->lse, &L->dq, &L->dk, &L->dv};
    const size_t exts[5] = {eo, el, edq, edk, edv};
    static const char *names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    for (int i = 0; i < 5; i++) {
        snprintf(w, sizeof w, "%s: %s", what, names[i]);
        const int intact = util_gintact(outs[i], w) && util_gaps_intact(ols[i], outs[i], exts[i], w);
        cr_expect(intact, "%s: write outside the view (guard zone or gap)", w);
        ok &= intact;
    }
    res->o = util_falloc(util_numel(&L->o));
    res->lse = util_falloc(in->nl);
    res->dq = util_falloc(util_numel(&L->dq));
    res->dk = util_falloc(util_numel(&L->dk));
    res->dv = util_falloc(util_numel(&L->dv));
    util_unpack(&L->o, res->o, go);
    util_unpack(&L->lse, res->lse, gl);
    util_unpack(&L->dq, res->dq, gdq);
    util_unpack(&L->dk, res->dk, gdk);
    util_unpack(&L->dv, res->dv, gdv);
    float *all[] = {gq, gk, gv, gdo, go, gl, gdq, gdk, gdv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        util_gfree(all[i]);
    return ok;
}

/* ----------------------------------------------------- finite differences -- */

static double fd_loss(const sdpa_problem *p, const float *q, const float *k, const float *v,
                      const float *dout, double *obuf, size_t no)
{
    ref_forward(p, q, k, v, obuf, NULL);
    double L = 0.0;
    for (size_t i = 0; i < no; i++)
        L += (double)dout[i] * obuf[i];
    return L;
}

/* Numeric gradient of L = sum(dO * O) w.r.t. every element of x (one of q, k,
 * v of `in`, perturbed in place and restored): central differences with steps
 * h = 2^-10 and h/2, combined by Richardson extrapolation (error O(h^4)). The
 * inputs are multiples of 2^-10 in [-1, 1], so every perturbed value is an
 * exact fp32 number and the differences are of the very function evaluated. */
static void fd_grad(const sdpa_problem *p, inputs *in, float *x, size_t n, double *g)
{
    const float h = 0x1p-10f;
    double *obuf = util_dalloc(in->no);
    for (size_t i = 0; i < n; i++) {
        const float x0 = x[i];
        double d[2];
        for (int s = 0; s < 2; s++) {
            const float hs = s ? h * 0.5f : h;
            x[i] = x0 + hs;
            const double lp = fd_loss(p, in->q, in->k, in->v, in->dout, obuf, in->no);
            x[i] = x0 - hs;
            const double lm = fd_loss(p, in->q, in->k, in->v, in->dout, obuf, in->no);
            d[s] = (lp - lm) / (2.0 * (double)hs);
        }
        x[i] = x0;
        g[i] = (4.0 * d[1] - d[0]) / 3.0;
    }
    free(obuf);
}

static double max_abs_d(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

/* max |got - want| <= rel * max|want| + abs_slack. */
static int expect_grad_close_f(const char *what, const float *got, const double *want, size_t n,
                               double rel, double abs_slack)
{
    const double bound = rel * max_abs_d(want, n) + abs_slack;
    double err = 0.0;
    size_t worst = 0;
    int nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            nonfinite = 1;
            worst = i;
            break;
        }
        const double e = fabs((double)got[i] - want[i]);
        if (e > err) {
            err = e;
            worst = i;
        }
    }
    const int ok = !nonfinite && err <= bound;
    cr_expect(ok, "%s: analytic vs finite differences: max err %.3g at %zu (got %.9g, numeric %.9g), bound %.3g",
              what, err, worst, n ? (double)got[worst] : 0.0, n ? want[worst] : 0.0, bound);
    return ok;
}

static int expect_grad_close_d(const char *what, const double *got, const double *want, size_t n,
                               double rel, double abs_slack)
{
    const double bound = rel * max_abs_d(want, n) + abs_slack;
    double err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs(got[i] - want[i]);
        if (!(e <= err)) {
            err = e;
            worst = i;
        }
    }
    const int ok = err <= bound;
    cr_expect(ok, "%s: ref_backward vs finite differences: max err %.3g at %zu (ref %.12g, numeric %.12g), bound %.3g",
              what, err, worst, n ? got[worst] : 0.0, n ? want[worst] : 0.0, bound);
    return ok;
}

typedef struct fd_case {
    const char *name;
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int mask;
    int bq, bk; /* 0: the ISA's tile sizes */
} fd_case;

static void run_fd_case(const fd_case *c, uint64_t seed)
{
    util_rng r;
    util_rng_init(&r, seed);
    sdpa_problem p = util_problem(c->B, c->Hq, c->Hkv, c->Tq, c->Tk, c->Dk, c->Dv);
    masks m;
    masks_setup(&p, c->mask, &r, &m);
    p.block_q = c->bq;
    p.block_k = c->bk;
    const layouts L = make_layouts(&p, L_CONTIG);
    inputs in = make_inputs(&p, &L, &r, 1);
    double *gq = util_dalloc(in.nq), *gk = util_dalloc(in.nk), *gv = util_dalloc(in.nv);
    fd_grad(&p, &in, in.q, in.nq, gq);
    fd_grad(&p, &in, in.k, in.nk, gk);
    fd_grad(&p, &in, in.v, in.nv, gv);

    /* The reference backward against the numeric gradient: with O(h^4)
     * differences in float64 this can be tight. */
    double *rq = util_dalloc(in.nq), *rk = util_dalloc(in.nk), *rv = util_dalloc(in.nv);
    ref_backward(&p, in.q, in.k, in.v, in.dout, rq, rk, rv);
    char w[160];
    snprintf(w, sizeof w, "%s: ref dQ", c->name);
    expect_grad_close_d(w, rq, gq, in.nq, 1e-7, 1e-10);
    snprintf(w, sizeof w, "%s: ref dK", c->name);
    expect_grad_close_d(w, rk, gk, in.nk, 1e-7, 1e-10);
    snprintf(w, sizeof w, "%s: ref dV", c->name);
    expect_grad_close_d(w, rv, gv, in.nv, 1e-7, 1e-10);

    /* The library on every ISA: fp32 accuracy, 1e-3 of the largest gradient. */
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        p.isa = isas[ii];
        util_outputs res;
        snprintf(w, sizeof w, "%s [%s]", c->name, sdpa_isa_name(isas[ii]));
        run_fb(&p, &L, &in, &res, w);
        char w2[200];
        snprintf(w2, sizeof w2, "%s dQ", w);
        expect_grad_close_f(w2, res.dq, gq, in.nq, 1e-3, 1e-6);
        snprintf(w2, sizeof w2, "%s dK", w);
        expect_grad_close_f(w2, res.dk, gk, in.nk, 1e-3, 1e-6);
        snprintf(w2, sizeof w2, "%s dV", w);
        expect_grad_close_f(w2, res.dv, gv, in.nv, 1e-3, 1e-6);
        util_outputs_free(&res);
    }
    free(gq);
    free(gk);
    free(gv);
    free(rq);
    free(rk);
    free(rv);
    util_inputs_free(&in);
    masks_free(&m);
}

static void run_fd_cases(const fd_case *cases, size_t n, const char *who)
{
    const uint64_t seed = util_seed(who, 0xfd0001);
    for (size_t i = 0; i < n; i++)
        run_fd_case(&cases[i], seed + i);
}

/* Causal attention, the textbook check; once with the ISA's tiles, once with
 * 2 x 3 tiles so that skipped, full and partial tiles all occur. */
Test(backward, fd_causal)
{
    const fd_case cases[] = {
        {"causal", 1, 2, 2, 6, 6, 4, 4, M_CAUSAL_TL, 0, 0},
        {"causal, 2x3 tiles", 2, 1, 1, 7, 7, 3, 5, M_CAUSAL_TL, 2, 3},
    };
    run_fd_cases(cases, sizeof cases / sizeof cases[0], "backward/fd_causal");
}

Test(backward, fd_mask_kinds)
{
    const fd_case cases[] = {
        {"causal bottom-right, Tq < Tk", 1, 2, 1, 4, 7, 4, 3, M_CAUSAL_BR, 0, 0},
        {"causal bottom-right, Tq > Tk (empty rows)", 1, 1, 1, 7, 4, 3, 4, M_CAUSAL_BR, 3, 2},
        {"window", 1, 2, 2, 8, 8, 4, 4, M_WINDOW, 3, 3},
        {"window bottom-right", 1, 1, 1, 5, 9, 3, 3, M_WINDOW_BR, 0, 0},
        {"kv_lengths (one batch empty)", 3, 2, 2, 4, 6, 3, 3, M_KVLEN, 2, 4},
        {"bool mask", 2, 2, 1, 5, 6, 4, 3, M_BOOL, 2, 2},
        {"additive bias", 1, 2, 2, 5, 7, 3, 4, M_BIAS, 0, 0},
        {"every mask at once", 3, 2, 1, 6, 8, 3, 3, M_ALL, 4, 3},
    };
    run_fd_cases(cases, sizeof cases / sizeof cases[0], "backward/fd_mask_kinds");
}

Test(backward, fd_gqa_and_head_dims)
{
    const fd_case cases[] = {
        {"GQA Hq=4 Hkv=2", 1, 4, 2, 5, 6, 4, 4, M_CAUSAL_TL, 0, 0},
        {"MQA Hq=4 Hkv=1", 2, 4, 1, 4, 5, 3, 3, M_KVLEN, 2, 2},
        {"Dk=6 > Dv=2", 1, 2, 1, 5, 6, 6, 2, M_NONE, 0, 0},
        {"Dk=2 < Dv=7", 1, 2, 2, 5, 6, 2, 7, M_CAUSAL_BR, 3, 4},
        {"Dk=1, Dv=1", 1, 1, 1, 4, 4, 1, 1, M_BIAS, 0, 0},
    };
    run_fd_cases(cases, sizeof cases / sizeof cases[0], "backward/fd_gqa_and_head_dims");
}

/* ------------------------------------------------------------- invariants -- */

/* Without any reference: per (batch, kv head), sum over keys of dK is 0 (the
 * rows of dS sum to 0), and sum over keys of dV equals the sum of dO over the
 * query rows (of every head of the group) that attend to at least one key.
 * Bounds: 3e-5 of the sum of the magnitudes involved. The scalar kernels stay
 * below 1.5e-6 here (dK: cancellation inside each dK[j] makes it larger than
 * the plain sqrt(n) * 6e-8 of the sum), so the margin is about 20, and a lost
 * or doubled tile contribution is O(1e-2..1) of it. */
static void check_invariants(const char *what, const sdpa_problem *p, const util_outputs *res,
                             const inputs *in)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v, G = Hq / Hkv;
    int bad_k = 0, bad_v = 0;
    double worst_k = 0.0, worst_v = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t hk = 0; hk < Hkv; hk++) {
            const float *dk = res->dk + (b * Hkv + hk) * Tk * Dk;
            const float *dv = res->dv + (b * Hkv + hk) * Tk * Dv;
            for (int64_t c = 0; c < Dk; c++) {
                double s = 0.0, a = 0.0;
                for (int64_t j = 0; j < Tk; j++) {
                    s += dk[j * Dk + c];
                    a += fabs(dk[j * Dk + c]);
                }
                if (fabs(s) > 3e-5 * a + 1e-30) {
                    bad_k++;
                    if (fabs(s) / a > worst_k)
                        worst_k = fabs(s) / a;
                }
            }
            for (int64_t c = 0; c < Dv; c++) {
                double s = 0.0, want = 0.0, a = 0.0;
                for (int64_t j = 0; j < Tk; j++) {
                    s += dv[j * Dv + c];
                    a += fabs(dv[j * Dv + c]);
                }
                for (int64_t g = 0; g < G; g++) {
                    const int64_t h = hk * G + g;
                    for (int64_t i = 0; i < Tq; i++) {
                        int any = 0;
                        for (int64_t j = 0; j < Tk && !any; j++)
                            any = ref_allowed(p, b, h, i, j);
                        if (any) {
                            const double x = in->dout[((b * Hq + h) * Tq + i) * Dv + c];
                            want += x;
                            a += fabs(x);
                        }
                    }
                }
                if (fabs(s - want) > 3e-5 * a + 1e-30) {
                    bad_v++;
                    if (fabs(s - want) / a > worst_v)
                        worst_v = fabs(s - want) / a;
                }
            }
        }
    cr_expect(bad_k == 0, "%s: sum_j dK[j] != 0 in %d column(s) (worst relative %.3g)", what, bad_k, worst_k);
    cr_expect(bad_v == 0, "%s: sum_j dV[j] != sum of attending dO rows in %d column(s) (worst %.3g)", what,
              bad_v, worst_v);
}

Test(backward, invariants)
{
    const uint64_t seed = util_seed("backward/invariants", 0x1a1a);
    const struct {
        int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
        int mask;
    } cases[] = {
        {1, 4, 2, 100, 130, 16, 24, M_NONE},   {2, 4, 1, 90, 70, 8, 8, M_CAUSAL_BR},
        {3, 2, 2, 64, 77, 17, 5, M_KVLEN},     {2, 2, 1, 50, 140, 32, 16, M_BOOL},
        {1, 3, 3, 70, 70, 12, 12, M_BIAS},     {3, 4, 2, 40, 90, 9, 13, M_ALL},
        {1, 2, 1, 120, 120, 20, 20, M_WINDOW},
    };
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        util_rng r;
        util_rng_init(&r, seed + ci);
        sdpa_problem p = util_problem(cases[ci].B, cases[ci].Hq, cases[ci].Hkv, cases[ci].Tq, cases[ci].Tk,
                                      cases[ci].Dk, cases[ci].Dv);
        masks m;
        masks_setup(&p, cases[ci].mask, &r, &m);
        const layouts L = make_layouts(&p, L_CONTIG);
        inputs in = make_inputs(&p, &L, &r, 0);
        for (int ii = 0; ii < ni; ii++) {
            p.isa = isas[ii];
            char w[160];
            snprintf(w, sizeof w, "invariants %zu (%s) [%s]", ci, mask_name[cases[ci].mask],
                     sdpa_isa_name(isas[ii]));
            util_outputs res;
            run_fb(&p, &L, &in, &res, w);
            check_invariants(w, &p, &res, &in);
            util_outputs_free(&res);
        }
        util_inputs_free(&in);
        masks_free(&m);
    }
}

/* ------------------------------------------------------------ shape sweep -- */

typedef struct sweep_case {
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int mask, layout;
    int bq, bk;
} sweep_case;

/* A covering design over design.md section 4, not the cartesian product:
 * every Dk and every Dv of {1, 3, 8, 15, 16, 17, 63, 64, 65, 80, 96, 128, 256}
 * occurs, every T of {0, 1, 2, 7, 9, 15, 17, 31, 33, 63, 65, 127, 129, 257,
 * 1000} occurs as Tq and as Tk, every mask kind and layout occurs several times,
 * with MHA, GQA (2:1) and MQA, with the ISA's tiles and with small odd tiles.
 * Long sequences are paired with short ones or small head dims to keep the
 * float64 reference cheap (this file also runs under qemu). */
static const sweep_case sweep[] = {
    /*  B Hq Hkv   Tq    Tk   Dk   Dv  mask          layout    bq  bk */
    {2, 4, 2, 0, 17, 16, 16, M_CAUSAL_BR, L_PADDED, 0, 0},
    {2, 2, 1, 1, 1000, 64, 64, M_KVLEN, L_CONTIG, 0, 0},
    {1, 2, 2, 2, 257, 128, 80, M_BIAS, L_BTHD, 0, 0},
    {1, 1, 1, 7, 9, 1, 3, M_NONE, L_BTHD, 0, 0},
    {2, 2, 2, 9, 7, 3, 1, M_CAUSAL_TL, L_PADDED, 0, 0},
    {1, 4, 1, 15, 15, 15, 17, M_WINDOW, L_CONTIG, 4, 4},
    {2, 2, 1, 17, 31, 17, 15, M_BOOL, L_BCAST, 0, 0},
    {1, 2, 2, 31, 33, 8, 8, M_CAUSAL_BR, L_MIXED, 8, 8},
    {3, 2, 1, 33, 63, 63, 65, M_ALL, L_CONTIG, 0, 0},
    {1, 4, 2, 63, 65, 65, 63, M_CAUSAL_TL, L_BTHD, 0, 0},
    {3, 2, 2, 65, 127, 64, 96, M_KVLEN, L_BTHD, 16, 16},
    {1, 2, 1, 127, 129, 80, 16, M_WINDOW_BR, L_MIXED, 0, 0},
    {1, 2, 2, 129, 127, 96, 8, M_BIAS, L_PADDED, 0, 0},
    {1, 1, 1, 257, 2, 256, 1, M_NONE, L_CONTIG, 0, 0},
    {2, 2, 1, 1000, 1, 3, 256, M_CAUSAL_BR, L_BCAST, 0, 0},
    {1, 2, 2, 7, 0, 16, 17, M_NONE, L_PADDED, 0, 0},
    {2, 2, 2, 1, 1, 256, 256, M_CAUSAL_TL, L_MIXED, 0, 0},
    {1, 1, 1, 2, 2, 1, 1, M_BOOL, L_CONTIG, 0, 0},
    {1, 4, 2, 257, 257, 16, 16, M_CAUSAL_TL, L_CONTIG, 0, 0},
    {1, 1, 1, 129, 1000, 17, 15, M_WINDOW, L_PADDED, 0, 0},
    {2, 2, 1, 63, 17, 128, 128, M_BOOL, L_BTHD, 0, 0},
    {2, 2, 2, 65, 65, 80, 80, M_ALL, L_BCAST, 5, 7},
    {1, 2, 2, 15, 257, 96, 96, M_CAUSAL_BR, L_PADDED, 0, 0},
    {1, 2, 1, 33, 7, 65, 3, M_WINDOW_BR, L_CONTIG, 0, 0},
    {3, 1, 1, 9, 129, 15, 65, M_KVLEN, L_MIXED, 0, 0},
    {1, 4, 2, 127, 63, 16, 64, M_CAUSAL_TL, L_PADDED, 16, 16},
    {1, 1, 1, 1000, 1000, 8, 1, M_CAUSAL_BR, L_CONTIG, 0, 0},
    {2, 4, 1, 17, 33, 1, 128, M_BIAS, L_MIXED, 3, 5},
    {1, 2, 2, 31, 9, 3, 63, M_ALL, L_PADDED, 0, 0},
    {2, 2, 2, 0, 0, 8, 8, M_NONE, L_CONTIG, 0, 0},
    {1, 2, 1, 1000, 63, 63, 8, M_WINDOW, L_BTHD, 0, 0},
    {2, 2, 2, 2, 15, 64, 15, M_BOOL, L_MIXED, 1, 1},
};

Test(backward, shape_sweep, .timeout = 600)
{
    const uint64_t seed = util_seed("backward/shape_sweep", 0x5eee9);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (size_t ci = 0; ci < sizeof sweep / sizeof sweep[0]; ci++) {
        const sweep_case *c = &sweep[ci];
        util_rng r;
        util_rng_init(&r, seed + ci);
        sdpa_problem p = util_problem(c->B, c->Hq, c->Hkv, c->Tq, c->Tk, c->Dk, c->Dv);
        masks m;
        masks_setup(&p, c->mask, &r, &m);
        p.block_q = c->bq;
        p.block_k = c->bk;
        const layouts L = make_layouts(&p, c->layout);
        inputs in = make_inputs(&p, &L, &r, 0);
        util_refs R = util_refs_make(&p, &in, 0);
        for (int ii = 0; ii < ni; ii++) {
            p.isa = isas[ii];
            char w[200];
            snprintf(w, sizeof w,
                     "sweep %zu: B=%lld Hq=%lld Hkv=%lld Tq=%lld Tk=%lld Dk=%lld Dv=%lld %s %s tiles %d/%d [%s]",
                     ci, (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Tq,
                     (long long)c->Tk, (long long)c->Dk, (long long)c->Dv, mask_name[c->mask],
                     layout_name[c->layout], c->bq, c->bk, sdpa_isa_name(isas[ii]));
            util_outputs res;
            run_fb(&p, &L, &in, &res, w);
            util_refs_expect(w, &res, NULL, &R, &in, 0);
            util_outputs_free(&res);
        }
        util_refs_free(&R);
        util_inputs_free(&in);
        masks_free(&m);
    }
}

/* ------------------------------------------------------------ determinism -- */


/* Runs the forward and backward of p (its ISA and tiles as set) with each of
 * nt thread counts; every output must have the bits of the first count's run,
 * and that run must pass util_refs_expect against R when R is given. */
static void check_thread_counts(sdpa_problem p, const layouts *L, const inputs *in, const util_refs *R,
                                const int *threads, size_t nt, const char *what)
{
    util_outputs first;
    memset(&first, 0, sizeof first);
    for (size_t ti = 0; ti < nt; ti++) {
        p.num_threads = threads[ti];
        char w[160];
        snprintf(w, sizeof w, "[%s] %s, %d threads", sdpa_isa_name(p.isa), what, threads[ti]);
        util_outputs res;
        run_fb(&p, L, in, &res, w);
        if (ti == 0) {
            if (R)
                util_refs_expect(w, &res, NULL, R, in, 0);
            first = res;
            continue;
        }
        cr_expect(util_same_bits(res.o, first.o, in->no), "%s: O differs from %d threads", w, threads[0]);
        cr_expect(util_same_bits(res.lse, first.lse, in->nl), "%s: LSE differs from %d threads", w, threads[0]);
        cr_expect(util_same_bits(res.dq, first.dq, in->nq), "%s: dQ differs from %d threads", w, threads[0]);
        cr_expect(util_same_bits(res.dk, first.dk, in->nk), "%s: dK differs from %d threads", w, threads[0]);
        cr_expect(util_same_bits(res.dv, first.dv, in->nv), "%s: dV differs from %d threads", w, threads[0]);
        util_outputs_free(&res);
    }
    util_outputs_free(&first);
}

Test(backward, bitwise_across_thread_counts, .timeout = 600)
{
    const uint64_t seed = util_seed("backward/bitwise_across_thread_counts", 0xb17);
    const int threads[] = {1, 2, 3, 8};
    const int blocks[][2] = {{0, 0}, {16, 16}};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    util_rng r;
    util_rng_init(&r, seed);
    sdpa_problem p = util_problem(2, 4, 2, 300, 300, 32, 24);
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    const layouts L = make_layouts(&p, L_CONTIG);
    inputs in = make_inputs(&p, &L, &r, 0);
    for (int ii = 0; ii < ni; ii++)
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
            p.isa = isas[ii];
            p.block_q = blocks[bi][0];
            p.block_k = blocks[bi][1];
            char what[64];
            snprintf(what, sizeof what, "tiles %d/%d", p.block_q, p.block_k);
            check_thread_counts(p, &L, &in, NULL, threads, sizeof threads / sizeof threads[0], what);
        }
    util_inputs_free(&in);
}

/* The per-head backward runs a head's key tiles in passes of 1 MiB of K, V, dK
 * and dV rows (sdpa.c, BWD_KV_CHUNK_BYTES): with D = 1024 and 8-key tiles a pass
 * is 8 tiles, so 100 keys take two passes. One thread runs whole heads (2 kv
 * heads >= 2 x 1 thread), two and three threads run the anti-diagonal waves
 * (fewer than 2 heads per thread): the results must be the same bits, and
 * right against float64. */
Test(backward, key_tile_passes_bitwise_and_accurate, .timeout = 600)
{
    const uint64_t seed = util_seed("backward/key_tile_passes", 0x9a55);
    const int threads[] = {1, 2, 3};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int causal = 0; causal < 2; causal++) {
        util_rng r;
        util_rng_init(&r, seed + (uint64_t)causal);
        sdpa_problem p = util_problem(1, 2, 2, 40, 100, 1024, 1024);
        p.causal = causal ? SDPA_CAUSAL_BOTTOM_RIGHT : SDPA_CAUSAL_NONE;
        p.block_k = 8;
        const layouts L = make_layouts(&p, L_CONTIG);
        inputs in = make_inputs(&p, &L, &r, 0);
        util_refs R = util_refs_make(&p, &in, 0);
        for (int ii = 0; ii < ni; ii++) {
            p.isa = isas[ii];
            check_thread_counts(p, &L, &in, &R, threads, sizeof threads / sizeof threads[0],
                                causal ? "causal, two key-tile passes" : "no mask, two key-tile passes");
        }
        util_refs_free(&R);
        util_inputs_free(&in);
    }
}

/* Every element of x[0..n) equals `value` ("<what>: <name>[i] = ..." otherwise). */
static void expect_all_equal(const char *what, const char *name, const float *x, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        cr_expect(x[i] == value, "%s: %s[%zu] = %g", what, name, i, (double)x[i]);
}

/* got[0..n) == want[0..n) element by element. */
static void expect_equal_values(const char *what, const char *name, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_expect(got[i] == want[i], "%s: %s[%zu] %g vs %g", what, name, i, (double)got[i], (double)want[i]);
}

/* Fully masked rows (LSE = -inf) contribute exactly 0: their dQ rows are +-0,
 * and dK, dV are bitwise what they are when those rows' dO is 0 or NaN. */
Test(backward, fully_masked_rows_contribute_zero)
{
    const uint64_t seed = util_seed("backward/fully_masked_rows_contribute_zero", 0xf0);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    const int kinds[] = {M_CAUSAL_BR, M_BOOL, M_KVLEN, M_ALL};
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
        util_rng r;
        util_rng_init(&r, seed + ki);
        /* Tq > Tk so that bottom-right causal leaves the first rows empty. */
        sdpa_problem p = util_problem(3, 4, 2, 45, 20, 11, 9);
        masks m;
        masks_setup(&p, kinds[ki], &r, &m);
        p.block_q = 8;
        p.block_k = 8;
        const layouts L = make_layouts(&p, L_CONTIG);
        inputs in = make_inputs(&p, &L, &r, 0);
        /* Which rows are empty. */
        unsigned char *empty = calloc(in.nl, 1);
        size_t nempty = 0;
        for (int64_t b = 0; b < p.batch; b++)
            for (int64_t h = 0; h < p.q_heads; h++)
                for (int64_t i = 0; i < p.q_len; i++) {
                    int any = 0;
                    for (int64_t j = 0; j < p.kv_len && !any; j++)
                        any = ref_allowed(&p, b, h, i, j);
                    empty[(b * p.q_heads + h) * p.q_len + i] = !any;
                    nempty += !any;
                }
        cr_assert(nempty > 0 && nempty < in.nl, "mask %s: %zu empty rows of %zu", mask_name[kinds[ki]], nempty,
                  in.nl);
        for (int ii = 0; ii < ni; ii++) {
            p.isa = isas[ii];
            char w[128];
            snprintf(w, sizeof w, "%s [%s]", mask_name[kinds[ki]], sdpa_isa_name(isas[ii]));
            util_outputs a, z, n;
            run_fb(&p, &L, &in, &a, w);
            for (size_t row = 0; row < in.nl; row++) {
                if (!empty[row])
                    continue;
                cr_expect(a.lse[row] == -INFINITY, "%s: LSE of empty row %zu = %g", w, row, (double)a.lse[row]);
                for (int64_t c = 0; c < p.head_dim_v; c++)
                    cr_expect(a.o[row * p.head_dim_v + c] == 0.0f, "%s: O of empty row %zu", w, row);
                for (int64_t c = 0; c < p.head_dim_qk; c++)
                    cr_expect(a.dq[row * p.head_dim_qk + c] == 0.0f, "%s: dQ[%zu][%lld] = %g", w, row,
                              (long long)c, (double)a.dq[row * p.head_dim_qk + c]);
            }
            /* Same problem, dO of the empty rows zeroed, then NaN. */
            for (int pass = 0; pass < 2; pass++) {
                float *saved = util_falloc(in.no);
                memcpy(saved, in.dout, in.no * sizeof(float));
                for (size_t row = 0; row < in.nl; row++)
                    if (empty[row])
                        for (int64_t c = 0; c < p.head_dim_v; c++)
                            in.dout[row * p.head_dim_v + c] = pass ? NAN : 0.0f;
                char w2[160];
                snprintf(w2, sizeof w2, "%s, dO of empty rows %s", w, pass ? "NaN" : "0");
                run_fb(&p, &L, &in, pass ? &n : &z, w2);
                const util_outputs *x = pass ? &n : &z;
                expect_equal_values(w2, "dQ", x->dq, a.dq, in.nq);
                expect_equal_values(w2, "dK", x->dk, a.dk, in.nk);
                expect_equal_values(w2, "dV", x->dv, a.dv, in.nv);
                memcpy(in.dout, saved, in.no * sizeof(float));
                free(saved);
            }
            util_outputs_free(&a);
            util_outputs_free(&z);
            util_outputs_free(&n);
        }
        free(empty);
        util_inputs_free(&in);
        masks_free(&m);
    }
}

/* NaN (and 1e38) in masked K and V rows, and NaN in bias entries the boolean
 * mask disallows, never reach any output; gradients of masked key rows are
 * exactly 0; everything else matches the reference. */
Test(backward, nan_in_masked_inputs_never_leaks)
{
    const uint64_t seed = util_seed("backward/nan_in_masked_inputs_never_leaks", 0x9a9);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int variant = 0; variant < 2; variant++) {
        util_rng r;
        util_rng_init(&r, seed + (uint64_t)variant);
        sdpa_problem p = util_problem(2, 4, 2, 37, 41, 13, 10);
        masks m;
        masks_setup(&p, M_ALL, &r, &m);
        m.kvl[0] = 33;
        m.kvl[1] = 20;
        p.causal = variant ? SDPA_CAUSAL_TOP_LEFT : SDPA_CAUSAL_BOTTOM_RIGHT;
        p.block_q = variant ? 0 : 8;
        p.block_k = variant ? 0 : 8;
        /* Key 3 is masked for every query by the boolean mask. */
        for (int64_t b = 0; b < p.batch; b++)
            for (int64_t i = 0; i < p.q_len; i++)
                m.bm[(b * p.q_len + i) * p.kv_len + 3] = 0;
        const layouts L = make_layouts(&p, L_CONTIG);
        inputs in = make_inputs(&p, &L, &r, 0);
        /* Poison K/V rows no query may see, and bias entries the mask disallows. */
        unsigned char *used = calloc((size_t)(p.batch * p.kv_heads * p.kv_len), 1);
        const int64_t G = p.q_heads / p.kv_heads;
        for (int64_t b = 0; b < p.batch; b++)
            for (int64_t h = 0; h < p.q_heads; h++)
                for (int64_t i = 0; i < p.q_len; i++)
                    for (int64_t j = 0; j < p.kv_len; j++)
                        if (ref_allowed(&p, b, h, i, j))
                            used[(b * p.kv_heads + h / G) * p.kv_len + j] = 1;
        size_t poisoned = 0;
        for (int64_t row = 0; row < p.batch * p.kv_heads * p.kv_len; row++)
            if (!used[row]) {
                poisoned++;
                for (int64_t c = 0; c < p.head_dim_qk; c++)
                    in.k[row * p.head_dim_qk + c] = (c & 1) ? NAN : 1e38f;
                for (int64_t c = 0; c < p.head_dim_v; c++)
                    in.v[row * p.head_dim_v + c] = (c & 1) ? 1e38f : NAN;
            }
        cr_assert(poisoned > 0);
        for (int64_t h = 0; h < p.q_heads; h++) /* bias is [1, Hq, Tq, Tk]; mask is [B, 1, Tq, Tk] */
            for (int64_t i = 0; i < p.q_len; i++)
                for (int64_t j = 0; j < p.kv_len; j++) {
                    int masked_everywhere = 1;
                    for (int64_t b = 0; b < p.batch; b++)
                        masked_everywhere &= !m.bm[(b * p.q_len + i) * p.kv_len + j];
                    if (masked_everywhere)
                        m.bias[(h * p.q_len + i) * p.kv_len + j] = NAN;
                }
        util_refs R = util_refs_make(&p, &in, 0);
        for (int ii = 0; ii < ni; ii++) {
            p.isa = isas[ii];
            char w[128];
            snprintf(w, sizeof w, "poisoned masked inputs, variant %d [%s]", variant, sdpa_isa_name(isas[ii]));
            util_outputs res;
            run_fb(&p, &L, &in, &res, w);
            cr_expect(!util_has_nan(res.o, in.no), "%s: NaN in O", w);
            cr_expect(!util_has_nan(res.dq, in.nq), "%s: NaN in dQ", w);
            cr_expect(!util_has_nan(res.dk, in.nk), "%s: NaN in dK", w);
            cr_expect(!util_has_nan(res.dv, in.nv), "%s: NaN in dV", w);
            for (int64_t row = 0; row < p.batch * p.kv_heads * p.kv_len; row++)
                if (!used[row]) {
                    for (int64_t c = 0; c < p.head_dim_qk; c++)
                        cr_expect(res.dk[row * p.head_dim_qk + c] == 0.0f, "%s: dK of masked key row %lld", w,
                                  (long long)row);
                    for (int64_t c = 0; c < p.head_dim_v; c++)
                        cr_expect(res.dv[row * p.head_dim_v + c] == 0.0f, "%s: dV of masked key row %lld", w,
                                  (long long)row);
                }
            util_refs_expect(w, &res, NULL, &R, &in, 0);
            util_outputs_free(&res);
        }
        util_refs_free(&R);
        free(used);
        util_inputs_free(&in);
        masks_free(&m);
    }
}

/* -------------------------------------------------------- empty extents -- */

/* The checks of one empty-extent run (`what` names it). */
typedef void (*empty_extent_check)(const char *what, const sdpa_problem *p, const inputs *in, const util_outputs *res);

/* For each mask kind of kinds[0..nk) and every ISA: the problem of sizes `sizes`
 * with that mask, random inputs (seed `seed`, the same for every ISA) stored
 * with layout `layout`, forward + backward through run_fb (which checks the
 * statuses, guard zones and gaps), then `check`. */
static void run_empty_extent(const char *label, sdpa_problem sizes, uint64_t seed, const int *kinds, size_t nk,
                             int layout, empty_extent_check check)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (size_t mi = 0; mi < nk; mi++)
        for (int ii = 0; ii < ni; ii++) {
            util_rng r;
            util_rng_init(&r, seed);
            sdpa_problem p = sizes;
            masks m;
            masks_setup(&p, kinds[mi], &r, &m);
            p.isa = isas[ii];
            const layouts L = make_layouts(&p, layout);
            inputs in = make_inputs(&p, &L, &r, 0);
            char w[96];
            snprintf(w, sizeof w, "%s, %s [%s]", label, mask_name[kinds[mi]], sdpa_isa_name(isas[ii]));
            util_outputs res;
            run_fb(&p, &L, &in, &res, w);
            check(w, &p, &in, &res);
            util_outputs_free(&res);
            util_inputs_free(&in);
            masks_free(&m);
        }
}

static void check_tq_zero(const char *w, const sdpa_problem *p, const inputs *in, const util_outputs *res)
{
    expect_all_equal(w, "dK", res->dk, in->nk, 0.0f);
    expect_all_equal(w, "dV", res->dv, in->nv, 0.0f);
}

/* Tq = 0: dK and dV are overwritten with 0 in full (strided, gaps untouched). */
Test(backward, tq_zero_zeroes_dk_dv)
{
    const int kinds[] = {M_NONE, M_CAUSAL_BR, M_KVLEN};
    run_empty_extent("Tq = 0", util_problem(3, 4, 2, 0, 29, 12, 7), 3, kinds, sizeof kinds / sizeof kinds[0],
                     L_PADDED, check_tq_zero);
}

static void check_dv_zero(const char *w, const sdpa_problem *p, const inputs *in, const util_outputs *res)
{
    double *rl = util_dalloc(in->nl), *ro = util_dalloc(1);
    ref_forward(p, in->q, in->k, in->v, ro, rl);
    expect_all_equal(w, "dQ", res->dq, in->nq, 0.0f);
    expect_all_equal(w, "dK", res->dk, in->nk, 0.0f);
    for (size_t i = 0; i < in->nl; i++) /* LSE is still defined by Q and K */
        cr_expect(util_close(res->lse[i], rl[i], 1e-5, 1e-5), "%s: LSE[%zu] = %g, ref %g", w, i,
                  (double)res->lse[i], rl[i]);
    free(rl);
    free(ro);
}

/* Dv = 0: O is empty, D = 0 and dP = 0, so dS = 0 and dQ = dK = 0 exactly. */
Test(backward, dv_zero)
{
    const int kinds[] = {M_NONE, M_CAUSAL_TL, M_ALL};
    run_empty_extent("Dv = 0", util_problem(3, 2, 1, 19, 23, 10, 0), 4, kinds, sizeof kinds / sizeof kinds[0],
                     L_BTHD, check_dv_zero);
}

static void check_tk_zero(const char *w, const sdpa_problem *p, const inputs *in, const util_outputs *res)
{
    expect_all_equal(w, "dQ", res->dq, in->nq, 0.0f);
    expect_all_equal(w, "LSE", res->lse, in->nl, -INFINITY);
    expect_all_equal(w, "O", res->o, in->no, 0.0f);
}

/* Tk = 0: every row is empty: dQ = 0 in full, LSE = -inf, O = 0. */
Test(backward, tk_zero)
{
    const int kinds[] = {M_NONE};
    run_empty_extent("Tk = 0", util_problem(2, 4, 2, 13, 0, 9, 6), 5, kinds, 1, L_MIXED, check_tk_zero);
}
