/* SPDX-License-Identifier: MIT */
/* tests/test_variants.c - the attention variants of issue 15 (softcap, ALiBi,
 * sinks and dsinks) against the float64 reference (tests/ref.c), forward and
 * backward:
 *  - a covering sweep: each variant alone and all three together, under every
 *    mask kind (causal top-left / bottom-right, windows of both alignments,
 *    kv_lengths, boolean mask, bias with -inf), GQA, shapes whose Tq, Tk, Dk, Dv
 *    hit the vector and tile tails, padded row strides, odd tiles, decode (Tq = 1,
 *    the few-column path) and split-KV (few query tiles, long Tk); on every ISA,
 *    FlashAttention rule (2x the naive fp32 error forward, 3x for dQ, dK, dV and
 *    dsinks), guard zones, 1 and 2 threads bitwise equal;
 *  - finite differences: float64 central differences of L = sum(W * O) through
 *    the reference forward (validates the reference's dQ, dK, dV, dsinks) and
 *    through the library's own forward (its backward is the derivative of its
 *    forward, within the measured rounding noise of that forward);
 *  - the edge cases of the issue: softcap with -inf bias, sinks with fully masked
 *    rows (O = 0, LSE = s_h) and -inf sinks, ALiBi with bottom-right alignment and
 *    kv_lengths (against a closed form that does not use the reference), a large
 *    sink taking the backward's |LSE| >= 256 path;
 *  - refused values: status and outputs untouched.
 * SDPA_TEST_REDUCED=1 (CI under ASan / emulation) runs every third sweep case. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "util.h"

/* ------------------------------------------------------------------ setup */

enum { V_CAP = 1, V_ALIBI = 2, V_SINK = 4, V_ALL = 7 };

enum {
    M_NONE,
    M_CAUSAL_TL,
    M_CAUSAL_BR,
    M_WINDOW_TL,
    M_WINDOW_BR,
    M_KVLEN,
    M_KVLEN_CAUSAL_BR,
    M_BOOL, /* [B, 1, Tq, Tk], row 1 of every batch fully masked */
    M_BIAS, /* [1, Hq, Tq, Tk] with -inf, -30 and a fully masked row */
    M_CAUSAL_OFFSET, /* causal top-left, diagonal_offset = Tk / 3 (queries later in the sequence) */
    M_WINDOW_OFFSET, /* a window, diagonal_offset = -Tq / 2 (rows before the first key see none) */
    M_COUNT
};
static const char *const mask_name[M_COUNT] = {"none",   "causal-tl", "causal-br",           "window-tl", "window-br",
                                               "kvlen",  "kvlen+causal-br", "bool[B,1,Tq,Tk]", "bias[1,Hq,Tq,Tk]",
                                               "causal-tl+offset", "window-tl+offset"};

typedef struct vcase {
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int mask;
    int var;    /* V_* bits */
    int padded; /* row strides > D for every tensor */
    int bq, bk; /* 0: the ISA's tiles */
    int always; /* also under SDPA_TEST_REDUCED */
} vcase;

/* Owner of everything a problem points to. */
typedef struct owned {
    int32_t *kvl;
    uint8_t *bm;
    float *bias, *slopes, *sinks;
} owned;

static void owned_free(owned *o)
{
    free(o->kvl);
    free(o->bm);
    free(o->bias);
    free(o->slopes);
    free(o->sinks);
    memset(o, 0, sizeof *o);
}

static void setup_mask(sdpa_problem *p, int kind, util_rng *r, owned *m)
{
    const int64_t B = p->batch, Hq = p->q_heads, Tq = p->q_len, Tk = p->kv_len;
    switch (kind) {
    case M_CAUSAL_TL: p->causal = SDPA_CAUSAL_TOP_LEFT; break;
    case M_CAUSAL_BR: p->causal = SDPA_CAUSAL_BOTTOM_RIGHT; break;
    case M_WINDOW_TL:
    case M_WINDOW_BR:
        p->window_left = 1 + Tk / 5;
        p->window_right = Tk / 7;
        p->window_alignment = kind == M_WINDOW_BR ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
        break;
    case M_CAUSAL_OFFSET:
        p->causal = SDPA_CAUSAL_TOP_LEFT;
        p->diagonal_offset = Tk / 3;
        break;
    case M_WINDOW_OFFSET:
        p->window_left = 3 + Tk / 6;
        p->window_right = 2;
        p->diagonal_offset = -(Tq / 2);
        break;
    case M_KVLEN:
    case M_KVLEN_CAUSAL_BR:
        m->kvl = calloc((size_t)(B ? B : 1), sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) /* Tk, random, 0 for the third */
            m->kvl[b] = (int32_t)(b == 0 ? Tk : b == 2 ? 0 : util_rng_int(r, Tk / 2, Tk));
        p->kv_lengths = m->kvl;
        if (kind == M_KVLEN_CAUSAL_BR)
            p->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        break;
    case M_BOOL: {
        const size_t n = (size_t)(B * Tq * Tk);
        m->bm = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            m->bm[i] = util_rng_double(r) < 0.7;
        for (int64_t b = 0; b < B; b++)
            if (Tq > 1)
                memset(m->bm + (b * Tq + 1) * Tk, 0, (size_t)Tk);
        p->bool_mask = (sdpa_bool_mask){m->bm, Tq * Tk, 0, Tk, 1};
        break;
    }
    case M_BIAS: {
        const size_t n = (size_t)(Hq * Tq * Tk);
        m->bias = malloc(sizeof(float) * (n ? n : 1));
        for (size_t i = 0; i < n; i++) {
            const double u = util_rng_double(r);
            m->bias[i] = u < 0.15 ? -INFINITY : u < 0.2 ? -30.0f : (float)(1.5 * util_rng_normal(r));
        }
        if (Tq > 2)
            for (int64_t j = 0; j < Tk; j++)
                m->bias[2 * Tk + j] = -INFINITY; /* head 0, row 2: fully masked */
        p->bias = (sdpa_bias){m->bias, 0, Tq * Tk, Tk, 1};
        break;
    }
    default: break;
    }
}

/* Values that are exact multiples of 2^-10 (so x +- 2^-7 stays exact in fp32). */
static float q10(double x)
{
    return (float)(nearbyint(x * 1024.0) / 1024.0);
}

/* Softcap 2 (the logits of sigma-1.2 inputs reach a few units: tanh is far from
 * linear there); slopes of the ALiBi paper's geometric kind, one head 0 and one
 * negative; sinks around the logits, head 1 (of every 3) -inf. */
static void setup_variants(sdpa_problem *p, int var, util_rng *r, owned *m)
{
    const int64_t Hq = p->q_heads;
    if (var & V_CAP)
        p->softcap = 2.0f;
    if (var & V_ALIBI) {
        m->slopes = malloc(sizeof(float) * (size_t)(Hq ? Hq : 1));
        for (int64_t h = 0; h < Hq; h++)
            m->slopes[h] = h % 4 == 2 ? 0.0f : h % 4 == 3 ? -0.0625f : ldexpf(1.0f, -(int)(1 + h % 8));
        p->alibi_slopes = m->slopes;
    }
    if (var & V_SINK) {
        m->sinks = malloc(sizeof(float) * (size_t)(Hq ? Hq : 1));
        for (int64_t h = 0; h < Hq; h++)
            m->sinks[h] = h % 3 == 1 ? -INFINITY : q10(1.5 * util_rng_normal(r));
        p->sinks = m->sinks;
    }
}

typedef util_inputs inputs;

/* q, k normal (sigma), v and dO uniform in [-1, 1], all multiples of 2^-10. */
static inputs make_inputs(const sdpa_problem *p, util_rng *r, double sigma)
{
    inputs in;
    in.nq = (size_t)(p->batch * p->q_heads * p->q_len * p->head_dim_qk);
    in.nk = (size_t)(p->batch * p->kv_heads * p->kv_len * p->head_dim_qk);
    in.nv = (size_t)(p->batch * p->kv_heads * p->kv_len * p->head_dim_v);
    in.no = (size_t)(p->batch * p->q_heads * p->q_len * p->head_dim_v);
    in.nl = (size_t)(p->batch * p->q_heads * p->q_len);
    in.q = util_falloc(in.nq);
    in.k = util_falloc(in.nk);
    in.v = util_falloc(in.nv);
    in.dout = util_falloc(in.no);
    for (size_t i = 0; i < in.nq; i++)
        in.q[i] = q10(sigma * util_rng_normal(r));
    for (size_t i = 0; i < in.nk; i++)
        in.k[i] = q10(sigma * util_rng_normal(r));
    for (size_t i = 0; i < in.nv; i++)
        in.v[i] = q10(2.0 * util_rng_double(r) - 1.0);
    for (size_t i = 0; i < in.no; i++)
        in.dout[i] = q10(2.0 * util_rng_double(r) - 1.0);
    return in;
}

typedef struct layouts {
    util_layout q, k, v, o, lse, dout, dq, dk, dv;
} layouts;

static layouts make_layouts(const sdpa_problem *p, int padded)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v, a = padded ? 3 : 0;
    layouts L;
    L.q = util_padded(B, Hq, Tq, Dk, Dk + a);
    L.k = util_padded(B, Hkv, Tk, Dk, Dk + 2 * a);
    L.v = util_padded(B, Hkv, Tk, Dv, Dv + a);
    L.o = util_padded(B, Hq, Tq, Dv, Dv + 2 * a);
    L.lse = util_padded(B, Hq, Tq, 1, 1 + a);
    L.dout = util_padded(B, Hq, Tq, Dv, Dv + a);
    L.dq = util_padded(B, Hq, Tq, Dk, Dk + a);
    L.dk = util_padded(B, Hkv, Tk, Dk, Dk + a);
    L.dv = util_padded(B, Hkv, Tk, Dv, Dv + 2 * a);
    return L;
}

/* The six outputs of one forward + backward, contiguous. */
typedef struct outs {
    util_outputs r;
    float *ds; /* dsinks [Hq] (NULL without sinks) */
} outs;

static void outs_free(outs *o)
{
    util_outputs_free(&o->r);
    free(o->ds);
    o->ds = NULL;
}

/* sdpa_forward then sdpa_backward (O, LSE from that forward; dsinks when the
 * problem has sinks) in guarded buffers of layouts L: statuses, guard zones and
 * gaps checked, results unpacked into *res. */
static void run_fb(const sdpa_problem *p, const layouts *L, const inputs *in, outs *res, const char *what)
{
    float *gq = util_gpack(&L->q, in->q), *gk = util_gpack(&L->k, in->k), *gv = util_gpack(&L->v, in->v),
          *gdo = util_gpack(&L->dout, in->dout);
    const util_layout *ols[5] = {&L->o, &L->lse, &L->dq, &L->dk, &L->dv};
    float *g[5];
    size_t ext[5];
    for (int i = 0; i < 5; i++) {
        ext[i] = util_extent(ols[i]);
        g[i] = util_galloc(ext[i]);
    }
    const int64_t Hq = p->q_heads;
    float *gds = p->sinks ? util_galloc((size_t)Hq) : NULL;
    const sdpa_tensor tq = util_view(&L->q, gq), tk = util_view(&L->k, gk), tv = util_view(&L->v, gv),
                      tdo = util_view(&L->dout, gdo);
    const sdpa_tensor_out to = util_view_out(&L->o, g[0]), tl = util_view_out(&L->lse, g[1]);
    sdpa_status st = sdpa_forward(p, &tq, &tk, &tv, &to, &tl);
    cr_assert_eq(st, SDPA_OK, "%s: sdpa_forward: %s", what, sdpa_status_string(st));
    const sdpa_tensor tio = util_view(&L->o, g[0]), til = util_view(&L->lse, g[1]);
    const sdpa_tensor_out tdq = util_view_out(&L->dq, g[2]), tdk = util_view_out(&L->dk, g[3]),
                          tdv = util_view_out(&L->dv, g[4]);
    sdpa_problem pb = *p;
    pb.dsinks = gds;
    st = sdpa_backward(&pb, &tq, &tk, &tv, &tio, &til, &tdo, &tdq, &tdk, &tdv);
    cr_assert_eq(st, SDPA_OK, "%s: sdpa_backward: %s", what, sdpa_status_string(st));
    static const char *const names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    char w[300];
    for (int i = 0; i < 5; i++) {
        snprintf(w, sizeof w, "%s: %s", what, names[i]);
        cr_expect(util_gintact(g[i], w) && util_gaps_intact(ols[i], g[i], ext[i], w),
                  "%s: written outside the view", w);
    }
    snprintf(w, sizeof w, "%s: dsinks", what);
    cr_expect(util_gintact(gds, w), "%s: written outside its Hq floats", w);
    float **dst[5] = {&res->r.o, &res->r.lse, &res->r.dq, &res->r.dk, &res->r.dv};
    for (int i = 0; i < 5; i++) {
        *dst[i] = util_falloc(util_numel(ols[i]));
        util_unpack(ols[i], *dst[i], g[i]);
        util_gfree(g[i]);
    }
    res->ds = NULL;
    if (gds) {
        res->ds = util_falloc((size_t)Hq);
        memcpy(res->ds, gds, sizeof(float) * (size_t)Hq);
    }
    util_gfree(gds);
    util_gfree(gq);
    util_gfree(gk);
    util_gfree(gv);
    util_gfree(gdo);
}

static int same_outs(const outs *a, const outs *b, const inputs *in, int64_t Hq)
{
    return util_same_bits(a->r.o, b->r.o, in->no) && util_same_bits(a->r.lse, b->r.lse, in->nl) &&
           util_same_bits(a->r.dq, b->r.dq, in->nq) && util_same_bits(a->r.dk, b->r.dk, in->nk) &&
           util_same_bits(a->r.dv, b->r.dv, in->nv) &&
           (!a->ds || util_same_bits(a->ds, b->ds, (size_t)Hq));
}

static int reduced(void)
{
    const char *e = getenv("SDPA_TEST_REDUCED");
    return e && *e && strcmp(e, "0") != 0;
}

static void var_text(char *buf, size_t len, int var)
{
    snprintf(buf, len, "%s%s%s%s", var & V_CAP ? "softcap " : "", var & V_ALIBI ? "alibi " : "",
             var & V_SINK ? "sinks" : "", var ? "" : "none");
}

/* ----------------------------------------------------------------- sweep */

/* Every mask kind with each variant alone and all three (36 cases), shapes
 * cycling through tails (T of 1, 2, 7, 9, 17, 31, 33, 63, 65, 129, 257; D of 1, 3, 8,
 * 15, 16, 17, 63, 64, 65, 128), GQA 4:2 and 4:1 and 6:3, padded strides, odd
 * tiles; then decode (Tq = 1, Tq = 3) and split-KV (Tq <= 16, Tk in the
 * thousands) with every variant, GQA. */
static vcase sweep_cases[] = {
    /* B Hq Hkv  Tq   Tk  Dk  Dv  mask               var      pad bq  bk always */
    {2, 4, 2, 9, 17, 16, 16, M_NONE, V_CAP, 0, 0, 0, 1},
    {1, 2, 1, 33, 31, 17, 15, M_NONE, V_ALIBI, 1, 0, 0, 0},
    {2, 3, 3, 17, 65, 8, 3, M_NONE, V_SINK, 0, 0, 0, 0},
    {1, 4, 1, 65, 65, 64, 64, M_NONE, V_ALL, 0, 0, 0, 1},
    {1, 2, 2, 31, 31, 15, 17, M_CAUSAL_TL, V_CAP, 0, 7, 5, 0},
    {2, 4, 2, 63, 63, 3, 8, M_CAUSAL_TL, V_ALIBI, 0, 0, 0, 1},
    {1, 6, 3, 33, 33, 65, 63, M_CAUSAL_TL, V_SINK, 1, 0, 0, 0},
    {1, 2, 1, 129, 129, 16, 16, M_CAUSAL_TL, V_ALL, 0, 16, 17, 0},
    {2, 2, 2, 7, 33, 17, 16, M_CAUSAL_BR, V_CAP, 0, 0, 0, 0},
    {1, 4, 2, 17, 65, 63, 65, M_CAUSAL_BR, V_ALIBI, 0, 0, 0, 0},
    {2, 2, 1, 65, 17, 8, 8, M_CAUSAL_BR, V_SINK, 0, 0, 0, 1},
    {1, 2, 2, 33, 257, 128, 64, M_CAUSAL_BR, V_ALL, 0, 0, 0, 0},
    {1, 2, 2, 63, 63, 16, 15, M_WINDOW_TL, V_CAP, 1, 0, 0, 0},
    {1, 4, 2, 65, 65, 1, 3, M_WINDOW_TL, V_ALIBI, 0, 0, 0, 0},
    {2, 2, 2, 31, 63, 16, 16, M_WINDOW_TL, V_SINK, 0, 9, 8, 0},
    {1, 4, 1, 129, 129, 17, 17, M_WINDOW_TL, V_ALL, 0, 0, 0, 1},
    {1, 2, 1, 17, 129, 64, 8, M_WINDOW_BR, V_CAP, 0, 0, 0, 0},
    {2, 4, 2, 9, 65, 16, 16, M_WINDOW_BR, V_ALIBI, 0, 3, 17, 1},
    {1, 2, 2, 65, 65, 15, 65, M_WINDOW_BR, V_SINK, 0, 0, 0, 0},
    {1, 4, 2, 31, 129, 63, 63, M_WINDOW_BR, V_ALL, 1, 0, 0, 0},
    {3, 2, 1, 17, 65, 16, 16, M_KVLEN, V_CAP, 0, 0, 0, 0},
    {3, 2, 2, 33, 33, 8, 17, M_KVLEN, V_ALIBI, 0, 0, 0, 0},
    {3, 4, 2, 9, 63, 17, 8, M_KVLEN, V_SINK, 0, 0, 0, 0},
    {3, 4, 1, 65, 129, 16, 16, M_KVLEN, V_ALL, 0, 0, 0, 1},
    {3, 2, 2, 9, 129, 64, 63, M_KVLEN_CAUSAL_BR, V_CAP, 0, 0, 0, 0},
    {3, 4, 2, 17, 65, 3, 1, M_KVLEN_CAUSAL_BR, V_ALIBI, 0, 0, 0, 1},
    {3, 2, 1, 33, 65, 16, 16, M_KVLEN_CAUSAL_BR, V_SINK, 1, 0, 0, 0},
    {3, 2, 1, 63, 257, 17, 17, M_KVLEN_CAUSAL_BR, V_ALL, 0, 31, 33, 0},
    {2, 2, 2, 33, 63, 16, 16, M_BOOL, V_CAP, 0, 0, 0, 0},
    {2, 4, 2, 65, 33, 15, 8, M_BOOL, V_ALIBI, 0, 0, 0, 0},
    {2, 2, 1, 17, 17, 64, 64, M_BOOL, V_SINK, 0, 0, 0, 1},
    {2, 4, 4, 31, 65, 17, 17, M_BOOL, V_ALL, 1, 0, 0, 0},
    {1, 2, 2, 33, 65, 16, 16, M_BIAS, V_CAP, 0, 0, 0, 1},
    {2, 4, 2, 17, 31, 8, 15, M_BIAS, V_ALIBI, 0, 5, 7, 0},
    {1, 2, 1, 65, 129, 65, 17, M_BIAS, V_SINK, 0, 0, 0, 0},
    {2, 4, 2, 63, 63, 16, 16, M_BIAS, V_ALL, 0, 0, 0, 0},
    {1, 4, 2, 33, 65, 16, 16, M_CAUSAL_OFFSET, V_ALIBI, 0, 0, 0, 1},
    {2, 2, 1, 65, 65, 17, 8, M_CAUSAL_OFFSET, V_ALL, 1, 0, 0, 0},
    {1, 4, 4, 31, 63, 16, 16, M_WINDOW_OFFSET, V_ALIBI, 0, 7, 9, 1},
    {2, 2, 2, 65, 33, 8, 15, M_WINDOW_OFFSET, V_ALL, 0, 0, 0, 0},
    {1, 8, 2, 1, 700, 32, 32, M_CAUSAL_OFFSET, V_ALIBI, 0, 0, 0, 0},
    /* decode: Tq = 1 and 3, long Tk (few columns, keys split over tiles), GQA */
    {2, 8, 2, 1, 1000, 32, 32, M_NONE, V_ALL, 0, 0, 0, 1},
    {2, 8, 2, 1, 777, 17, 15, M_KVLEN, V_CAP, 0, 0, 0, 0},
    {1, 8, 1, 1, 999, 16, 16, M_CAUSAL_BR, V_ALIBI, 0, 0, 0, 0},
    {3, 4, 2, 1, 513, 8, 8, M_KVLEN_CAUSAL_BR, V_SINK, 0, 0, 0, 0},
    {2, 4, 2, 3, 700, 65, 63, M_BIAS, V_ALL, 0, 0, 0, 1},
    {1, 4, 4, 2, 640, 16, 16, M_BOOL, V_ALL, 0, 0, 0, 0},
    /* split-KV: a few query tiles against thousands of keys */
    {1, 4, 2, 16, 2000, 32, 32, M_CAUSAL_BR, V_ALL, 0, 0, 0, 1},
    {2, 2, 1, 9, 2049, 16, 8, M_WINDOW_BR, V_ALL, 0, 0, 0, 0},
    {1, 2, 2, 5, 3001, 16, 16, M_NONE, V_SINK | V_CAP, 0, 0, 0, 0},
};

static void describe(char *buf, size_t len, const vcase *c)
{
    char v[40];
    var_text(v, sizeof v, c->var);
    snprintf(buf, len, "B=%ld Hq=%ld Hkv=%ld Tq=%ld Tk=%ld Dk=%ld Dv=%ld mask=%s variants=[%s]%s tiles=%dx%d",
             (long)c->B, (long)c->Hq, (long)c->Hkv, (long)c->Tq, (long)c->Tk, (long)c->Dk, (long)c->Dv,
             mask_name[c->mask], v, c->padded ? " padded" : "", c->bq, c->bk);
}

/* Runs p (row strides > D when padded) on every ISA with 1 and 2 threads:
 * FlashAttention rule against the reference (dsinks included), 2 threads bitwise
 * equal to 1, and calls `check` (when not NULL) on each 1-thread result. */
typedef void (*outs_check)(const sdpa_problem *p, const inputs *in, const outs *o, const char *what);

static void run_all_isas(sdpa_problem p, const inputs *in, int padded, const char *name, outs_check check)
{
    util_refs R = util_refs_make(&p, in, 1);
    const layouts L = make_layouts(&p, padded);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        outs o1, o2;
        char w[320];
        p.isa = isas[ii];
        p.num_threads = 1;
        snprintf(w, sizeof w, "[%s, 1 thread] %s", sdpa_isa_name(isas[ii]), name);
        run_fb(&p, &L, in, &o1, w);
        util_refs_expect(w, &o1.r, o1.ds, &R, in, (size_t)p.q_heads);
        if (check)
            check(&p, in, &o1, w);
        p.num_threads = 2;
        snprintf(w, sizeof w, "[%s, 2 threads] %s", sdpa_isa_name(isas[ii]), name);
        run_fb(&p, &L, in, &o2, w);
        cr_expect(same_outs(&o1, &o2, in, p.q_heads), "%s: differs bitwise from 1 thread", w);
        outs_free(&o1);
        outs_free(&o2);
    }
    util_refs_free(&R);
}

static void run_sweep_case(const vcase *c, uint64_t seed)
{
    char desc[256];
    describe(desc, sizeof desc, c);
    util_rng r;
    util_rng_init(&r, seed);
    sdpa_problem p = util_problem(c->B, c->Hq, c->Hkv, c->Tq, c->Tk, c->Dk, c->Dv);
    p.block_q = c->bq;
    p.block_k = c->bk;
    owned m;
    memset(&m, 0, sizeof m);
    setup_mask(&p, c->mask, &r, &m);
    setup_variants(&p, c->var, &r, &m);
    inputs in = make_inputs(&p, &r, 1.2);
    run_all_isas(p, &in, c->padded, desc, NULL);
    util_inputs_free(&in);
    owned_free(&m);
}

ParameterizedTestParameters(variants, sweep)
{
    return cr_make_param_array(vcase, sweep_cases, sizeof sweep_cases / sizeof sweep_cases[0]);
}

ParameterizedTest(vcase *c, variants, sweep, .timeout = 300)
{
    size_t idx = 0; /* c is Criterion's copy: find the case by value */
    while (idx + 1 < sizeof sweep_cases / sizeof sweep_cases[0] && memcmp(&sweep_cases[idx], c, sizeof *c) != 0)
        idx++;
    if (reduced() && !c->always && idx % 3 != 0)
        cr_skip_test("SDPA_TEST_REDUCED: sweep case %zu skipped", idx);
    char who[64];
    snprintf(who, sizeof who, "variants/sweep #%zu", idx);
    char desc[256];
    describe(desc, sizeof desc, c);
    cr_log_info("%s: %s", who, desc);
    run_sweep_case(c, util_seed(who, 0x7a410000u + idx));
}

/* ---------------------------------------------------- finite differences */

/* L = sum(dO * O) in float64 from the float64 reference forward. */
static double ref_loss(const sdpa_problem *p, const inputs *in, double *obuf)
{
    ref_forward(p, in->q, in->k, in->v, obuf, NULL);
    double L = 0.0;
    for (size_t i = 0; i < in->no; i++)
        L += (double)in->dout[i] * obuf[i];
    return L;
}

/* The same loss through the library's own forward (contiguous, p's ISA, one
 * thread), summed in float64. */
static double lib_loss(const sdpa_problem *p, const inputs *in, float *obuf)
{
    const sdpa_tensor tq = util_cview(in->q, p->q_heads, p->q_len, p->head_dim_qk),
                      tk = util_cview(in->k, p->kv_heads, p->kv_len, p->head_dim_qk),
                      tv = util_cview(in->v, p->kv_heads, p->kv_len, p->head_dim_v);
    const sdpa_tensor_out to = util_cview_out(obuf, p->q_heads, p->q_len, p->head_dim_v);
    const sdpa_status st = sdpa_forward(p, &tq, &tk, &tv, &to, NULL);
    cr_assert_eq(st, SDPA_OK, "sdpa_forward: %s", sdpa_status_string(st));
    double L = 0.0;
    for (size_t i = 0; i < in->no; i++)
        L += (double)in->dout[i] * (double)obuf[i];
    return L;
}

/* Every differentiated input as one list: q, k, v, then the sinks. */
typedef struct fd_vars {
    float *x[4];
    size_t n[4];
} fd_vars;

static fd_vars fd_list(inputs *in, owned *m, int64_t Hq)
{
    fd_vars f = {{in->q, in->k, in->v, m->sinks}, {in->nq, in->nk, in->nv, m->sinks ? (size_t)Hq : 0}};
    return f;
}

typedef struct fd_case {
    const char *name;
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int masks[2]; /* mask kinds applied together (M_NONE: none) */
} fd_case;

/* dQ, dK, dV and dsinks by finite differences, two ways:
 *  1. through the float64 reference: central differences with h = 2^-10 and
 *     2^-11, Richardson-combined (error O(h^4)), against ref_backward_dsinks at
 *     1e-7 of the largest gradient: checks the reference's backward (softcap
 *     derivative, ALiBi constant, dsinks) against its own forward;
 *  2. through the library's forward on every ISA: D = (L(x+h) - L(x-h)) / 2h,
 *     h = 2^-7, L summed in float64 over the library's fp32 O. With e(x) =
 *     L_lib(x) - L_ref(x) measured at both points and g the float64 gradient,
 *       |g_lib - D_lib| <= |g_lib - g| + |g - D_ref| + |D_ref - D_lib|
 *                       <= 1e-4 max|g| + 1e-6 + trunc + (|e(x+h)| + |e(x-h)|) / 2h
 *     where trunc = |g - D_ref| (D_ref: the same difference of the reference) and
 *     the last term, the forward's rounding seen through the difference, are both
 *     measured per element; 1e-4 max|g| is a generous fp32 allowance for the
 *     backward itself (the sweep holds it to 3x the naive fp32 error). The
 *     measured noise must stay below 2% of max|g|, or the check would be empty.
 * The inputs are multiples of 2^-10 of moderate size, so every x +- h is exact. */
static void run_fd(const fd_case *c, uint64_t seed)
{
    util_rng r;
    util_rng_init(&r, seed);
    sdpa_problem p = util_problem(c->B, c->Hq, c->Hkv, c->Tq, c->Tk, c->Dk, c->Dv);
    owned m;
    memset(&m, 0, sizeof m);
    setup_mask(&p, c->masks[0], &r, &m);
    setup_mask(&p, c->masks[1], &r, &m);
    setup_variants(&p, V_ALL, &r, &m);
    p.softcap = 1.5f;
    inputs in = make_inputs(&p, &r, 1.2);
    p.num_threads = 1;
    fd_vars fv = fd_list(&in, &m, c->Hq);
    size_t total = 0;
    for (int t = 0; t < 4; t++)
        total += fv.n[t];
    double *g = util_dalloc(total), *rich = util_dalloc(total), *dref = util_dalloc(total),
           *dlib = util_dalloc(total), *noise = util_dalloc(total);
    {
        const size_t o1 = in.nq, o2 = o1 + in.nk, o3 = o2 + in.nv;
        ref_backward_dsinks(&p, in.q, in.k, in.v, in.dout, g, g + o1, g + o2, g + o3);
    }
    double *ob = util_dalloc(in.no);
    float *of = util_falloc(in.no);
    const float h = 0x1p-7f;
    size_t e = 0;
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < fv.n[t]; i++, e++) {
            float *x = &fv.x[t][i];
            const float x0 = *x;
            if (x0 == -INFINITY) /* a -inf sink: no sink, gradient 0 */
                continue;
            double d[2];
            for (int s = 0; s < 2; s++) {
                const float hs = s ? 0x1p-11f : 0x1p-10f;
                *x = x0 + hs;
                const double lp = ref_loss(&p, &in, ob);
                *x = x0 - hs;
                const double lm = ref_loss(&p, &in, ob);
                d[s] = (lp - lm) / (2.0 * (double)hs);
            }
            rich[e] = (4.0 * d[1] - d[0]) / 3.0;
            *x = x0 + h;
            const double rp = ref_loss(&p, &in, ob);
            *x = x0 - h;
            const double rm = ref_loss(&p, &in, ob);
            *x = x0;
            dref[e] = (rp - rm) / (2.0 * (double)h);
        }
    const double gmax = util_max_abs_finite(g, total);
    cr_assert_gt(gmax, 0.0);
    {
        double err = 0.0;
        size_t worst = 0;
        for (size_t i = 0; i < total; i++)
            if (fabs(g[i] - rich[i]) > err) {
                err = fabs(g[i] - rich[i]);
                worst = i;
            }
        cr_expect(err <= 1e-7 * gmax + 1e-10,
                  "%s: ref_backward_dsinks vs float64 finite differences: max err %.3g at %zu (ref %.12g, "
                  "numeric %.12g), bound %.3g",
                  c->name, err, worst, g[worst], rich[worst], 1e-7 * gmax + 1e-10);
        cr_log_info("%s: reference gradient vs Richardson differences: %.3g (max |g| %.3g)", c->name, err, gmax);
    }

    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    const layouts L = make_layouts(&p, 0);
    for (int ii = 0; ii < ni; ii++) {
        p.isa = isas[ii];
        const char *isa = sdpa_isa_name(isas[ii]);
        e = 0;
        double nmax = 0.0;
        for (int t = 0; t < 4; t++)
            for (size_t i = 0; i < fv.n[t]; i++, e++) {
                float *x = &fv.x[t][i];
                const float x0 = *x;
                dlib[e] = noise[e] = 0.0;
                if (x0 == -INFINITY)
                    continue;
                *x = x0 + h;
                const double lp = lib_loss(&p, &in, of), rp = ref_loss(&p, &in, ob);
                *x = x0 - h;
                const double lm = lib_loss(&p, &in, of), rm = ref_loss(&p, &in, ob);
                *x = x0;
                dlib[e] = (lp - lm) / (2.0 * (double)h);
                noise[e] = (fabs(lp - rp) + fabs(lm - rm)) / (2.0 * (double)h);
                if (noise[e] > nmax)
                    nmax = noise[e];
            }
        cr_expect(nmax < 0.02 * gmax, "%s [%s]: forward rounding noise %.3g too large for the check (max |g| %.3g)",
                  c->name, isa, nmax, gmax);
        outs res;
        char w[200];
        snprintf(w, sizeof w, "%s [%s]", c->name, isa);
        run_fb(&p, &L, &in, &res, w);
        const float *got[4] = {res.r.dq, res.r.dk, res.r.dv, res.ds};
        static const char *const nm[4] = {"dQ", "dK", "dV", "dsinks"};
        e = 0;
        for (int t = 0; t < 4; t++) {
            size_t bad = 0;
            double worst = 0.0;
            for (size_t i = 0; i < fv.n[t]; i++, e++) {
                const double bound = 1e-4 * gmax + 1e-6 + fabs(g[e] - dref[e]) + noise[e];
                const double err = fabs((double)got[t][i] - dlib[e]);
                if (err / bound > worst)
                    worst = err / bound;
                if (!(err <= bound) && bad++ < 3)
                    cr_log_error("%s: %s[%zu] = %.9g, differences of the library's forward %.9g (bound %.3g: "
                                 "noise %.3g, truncation %.3g)",
                                 w, nm[t], i, (double)got[t][i], dlib[e], bound, noise[e], fabs(g[e] - dref[e]));
            }
            cr_expect_eq(bad, 0, "%s: %zu %s elements off the library forward's finite differences", w, bad, nm[t]);
            cr_log_info("%s: %s worst err / bound %.3g (noise max %.3g, max |g| %.3g)", w, nm[t], worst, nmax, gmax);
        }
        outs_free(&res);
    }
    free(g);
    free(rich);
    free(dref);
    free(dlib);
    free(noise);
    free(ob);
    free(of);
    util_inputs_free(&in);
    owned_free(&m);
}

Test(variants, finite_differences_unmasked, .timeout = 120)
{
    const fd_case c = {"fd all variants, GQA, no mask", 2, 4, 2, 5, 7, 4, 3, {M_NONE, M_NONE}};
    run_fd(&c, util_seed("variants/finite_differences_unmasked", 0xfd15a));
}

Test(variants, finite_differences_masked, .timeout = 120)
{
    /* kv_lengths + causal bottom-right (ALiBi on that diagonal) + bias with -inf
     * and a fully masked row (with a sink: O = 0, LSE = s_h, no gradient) */
    const fd_case c = {"fd all variants, kvlen+causal-br+bias", 2, 4, 2, 5, 8, 4, 3, {M_KVLEN_CAUSAL_BR, M_BIAS}};
    run_fd(&c, util_seed("variants/finite_differences_masked", 0xfd15b));
}

/* ------------------------------------------------------------ edge cases */

/* Rows with no allowed key (by the reference's predicate): O = 0 and dQ = 0
 * exactly, LSE = the sink (bitwise; -inf without one); keys allowed for no query
 * of a kv head: dK = dV = 0 exactly. */
static void check_masked_rows(const sdpa_problem *p, const inputs *in, const outs *o, const char *what)
{
    (void)in;
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v, G = Hq / Hkv;
    size_t bad = 0, rows = 0, keys = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int any = 0;
                for (int64_t j = 0; j < Tk && !any; j++)
                    any = ref_allowed(p, b, h, i, j);
                if (any)
                    continue;
                rows++;
                const size_t r = (size_t)((b * Hq + h) * Tq + i);
                const float want = p->sinks ? p->sinks[h] : -INFINITY;
                if (memcmp(&o->r.lse[r], &want, sizeof want) != 0 && bad++ < 5)
                    cr_log_error("%s: fully masked row (%ld,%ld,%ld): LSE %g, expected the sink %g", what, (long)b,
                                 (long)h, (long)i, (double)o->r.lse[r], (double)want);
                for (int64_t c = 0; c < Dv; c++)
                    if (o->r.o[r * (size_t)Dv + (size_t)c] != 0.0f && bad++ < 5)
                        cr_log_error("%s: fully masked row (%ld,%ld,%ld): O[%ld] = %g", what, (long)b, (long)h,
                                     (long)i, (long)c, (double)o->r.o[r * (size_t)Dv + (size_t)c]);
                for (int64_t c = 0; c < Dk; c++)
                    if (o->r.dq[r * (size_t)Dk + (size_t)c] != 0.0f && bad++ < 5)
                        cr_log_error("%s: fully masked row (%ld,%ld,%ld): dQ[%ld] = %g", what, (long)b, (long)h,
                                     (long)i, (long)c, (double)o->r.dq[r * (size_t)Dk + (size_t)c]);
            }
    for (int64_t b = 0; b < B; b++)
        for (int64_t hk = 0; hk < Hkv; hk++)
            for (int64_t j = 0; j < Tk; j++) {
                int any = 0;
                for (int64_t h = hk * G; h < (hk + 1) * G && !any; h++)
                    for (int64_t i = 0; i < Tq && !any; i++)
                        any = ref_allowed(p, b, h, i, j);
                if (any)
                    continue;
                keys++;
                const size_t r = (size_t)((b * Hkv + hk) * Tk + j);
                for (int64_t c = 0; c < Dk; c++)
                    bad += o->r.dk[r * (size_t)Dk + (size_t)c] != 0.0f;
                for (int64_t c = 0; c < Dv; c++)
                    bad += o->r.dv[r * (size_t)Dv + (size_t)c] != 0.0f;
            }
    cr_expect_eq(bad, 0, "%s: %zu wrong values in %zu fully masked rows / %zu unused keys", what, bad, rows, keys);
    cr_expect_gt(rows, 0, "%s: the case has no fully masked row", what);
}

Test(variants, softcap_with_neginf_bias)
{
    /* A small softcap (every capped logit in [-0.5, 0.5]): the -inf bias entries
     * must still mask (capping -inf would give -0.5 and a weight), a -inf row is
     * fully masked (O = 0, LSE = -inf), and key 5, -inf for every query, holds
     * NaN in K and V that must never be read. */
    const int64_t B = 2, Hq = 2, Hkv = 1, Tq = 9, Tk = 40, Dk = 16, Dv = 8;
    util_rng r;
    util_rng_seed(&r, "variants/softcap_with_neginf_bias", 0x5c0f);
    for (int var = V_CAP; var <= V_ALL; var += V_ALL - V_CAP) {
        sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
        owned m;
        memset(&m, 0, sizeof m);
        setup_variants(&p, var, &r, &m);
        p.softcap = 0.5f;
        const size_t nb = (size_t)(B * Hq * Tq * Tk);
        float *bias = util_falloc(nb);
        for (size_t i = 0; i < nb; i++)
            bias[i] = util_rng_double(&r) < 0.4 ? -INFINITY : (float)util_rng_normal(&r);
        for (int64_t bh = 0; bh < B * Hq; bh++)
            for (int64_t i = 0; i < Tq; i++)
                bias[(bh * Tq + i) * Tk + 5] = -INFINITY;
        for (int64_t j = 0; j < Tk; j++)
            bias[3 * Tk + j] = -INFINITY; /* (0, 0, 3) */
        p.bias = (sdpa_bias){bias, Hq * Tq * Tk, Tq * Tk, Tk, 1};
        inputs in = make_inputs(&p, &r, 2.0);
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < Dk; c++)
                in.k[(b * Tk + 5) * Dk + c] = NAN;
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < Dv; c++)
                in.v[(b * Tk + 5) * Dv + c] = NAN;
        run_all_isas(p, &in, 0, var == V_CAP ? "softcap 0.5, -inf bias" : "softcap 0.5 + alibi + sinks, -inf bias",
                     check_masked_rows);
        free(bias);
        util_inputs_free(&in);
        owned_free(&m);
    }
}

Test(variants, sinks_with_fully_masked_rows)
{
    /* Sinks 0.75, -inf and 5.5 (dominant); batch 1 has no key (kv_lengths 0),
     * row 2 of batch 0 is masked by the boolean mask, batch 2 has 3 keys under
     * causal bottom-right with Tq = 6 (its first rows see nothing): O = 0,
     * LSE = s_h bitwise, dQ = 0 there, every other value against float64. */
    const int64_t B = 3, Hq = 3, Hkv = 1, Tq = 6, Tk = 20, Dk = 8, Dv = 5;
    util_rng r;
    util_rng_seed(&r, "variants/sinks_with_fully_masked_rows", 0x5111);
    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    float sinks[3] = {0.75f, -INFINITY, 5.5f};
    int32_t kvl[3] = {20, 0, 3};
    uint8_t *bm = malloc((size_t)(B * Tq * Tk));
    memset(bm, 1, (size_t)(B * Tq * Tk));
    memset(bm + 2 * Tk, 0, (size_t)Tk);
    p.sinks = sinks;
    p.kv_lengths = kvl;
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.bool_mask = (sdpa_bool_mask){bm, Tq * Tk, 0, Tk, 1};
    inputs in = make_inputs(&p, &r, 1.0);
    run_all_isas(p, &in, 0, "sinks, fully masked rows", check_masked_rows);
    /* with softcap and ALiBi too */
    const float slopes[3] = {0.25f, 0.5f, 0.0f};
    p.softcap = 3.0f;
    p.alibi_slopes = slopes;
    run_all_isas(p, &in, 0, "sinks + softcap + alibi, fully masked rows", check_masked_rows);
    free(bm);
    util_inputs_free(&in);
}

Test(variants, neg_inf_sinks_are_no_sinks)
{
    /* Every sink -inf: the bits of the same call without sinks, and dsinks = 0. */
    const int64_t B = 2, Hq = 4, Hkv = 2, Tq = 33, Tk = 70, Dk = 16, Dv = 16;
    util_rng r;
    util_rng_seed(&r, "variants/neg_inf_sinks_are_no_sinks", 0x1f5);
    for (int var = 0; var <= (V_CAP | V_ALIBI); var += V_CAP | V_ALIBI) {
        sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
        p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        owned m;
        memset(&m, 0, sizeof m);
        setup_variants(&p, var, &r, &m);
        inputs in = make_inputs(&p, &r, 1.0);
        const layouts L = make_layouts(&p, 0);
        float sinks[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        sdpa_isa isas[SDPA_ISA_COUNT];
        const int ni = util_isas(isas);
        for (int ii = 0; ii < ni; ii++) {
            char w[160];
            snprintf(w, sizeof w, "[%s] -inf sinks%s", sdpa_isa_name(isas[ii]), var ? " + softcap + alibi" : "");
            outs a, b;
            p.isa = isas[ii];
            p.sinks = NULL;
            run_fb(&p, &L, &in, &a, w);
            p.sinks = sinks;
            run_fb(&p, &L, &in, &b, w);
            cr_expect(util_same_bits(a.r.o, b.r.o, in.no) && util_same_bits(a.r.lse, b.r.lse, in.nl) &&
                          util_same_bits(a.r.dq, b.r.dq, in.nq) && util_same_bits(a.r.dk, b.r.dk, in.nk) &&
                          util_same_bits(a.r.dv, b.r.dv, in.nv),
                      "%s: differs bitwise from the call without sinks", w);
            for (int64_t h = 0; h < Hq; h++)
                cr_expect(b.ds[h] == 0.0f, "%s: dsinks[%ld] = %g, expected 0", w, (long)h, (double)b.ds[h]);
            outs_free(&a);
            outs_free(&b);
        }
        util_inputs_free(&in);
        owned_free(&m);
    }
}

/* ALiBi's diagonal without the reference: Q = 0 makes every logit
 * -slope[h] |j - (i + d)|, and V = the identity (Dv = Tk) makes row i of O row i
 * of P, so O and LSE have a closed form computed here in float64 (d = Tk_b - Tq
 * bottom-right, the keys allowed by kv_lengths and the causal / window bounds on
 * that diagonal). */
static void alibi_closed_form(int causal, int64_t wl, int64_t wr, const char *name)
{
    const int64_t B = 3, Hq = 2, Hkv = 1, Tq = 12, Tk = 24, Dk = 4, Dv = Tk;
    const float slopes[2] = {0.5f, 0.125f};
    const int32_t kvl[3] = {24, 9, 17};
    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    p.alibi_slopes = slopes;
    p.kv_lengths = kvl;
    if (causal)
        p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    else
        p.window_alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    p.window_left = wl;
    p.window_right = wr;
    const size_t nq = (size_t)(B * Hq * Tq * Dk), nk = (size_t)(B * Hkv * Tk * Dk), nv = (size_t)(B * Hkv * Tk * Dv);
    const size_t no = (size_t)(B * Hq * Tq * Dv), nl = (size_t)(B * Hq * Tq);
    float *q = util_falloc(nq), *k = util_falloc(nk), *v = util_falloc(nv);
    util_rng r;
    util_rng_seed(&r, "variants/alibi_closed_form", 0xa1b1);
    util_fill_normal(&r, k, nk, 1.0f);
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < Tk; j++)
            v[(b * Tk + j) * Dv + j] = 1.0f;
    double *want_o = util_dalloc(no), *want_l = util_dalloc(nl);
    int empty = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                const int64_t d = i + kvl[b] - Tq, r0 = (b * Hq + h) * Tq + i;
                double sum = 0.0;
                for (int64_t j = 0; j < kvl[b]; j++) {
                    const int ok = (!causal || j <= d) && (wl < 0 || j >= d - wl) && (wr < 0 || j <= d + wr);
                    const double e = ok ? exp(-(double)slopes[h] * (double)llabs(j - d)) : 0.0;
                    want_o[r0 * Dv + j] = e;
                    sum += e;
                }
                for (int64_t j = 0; j < Tk; j++)
                    want_o[r0 * Dv + j] = sum > 0 ? want_o[r0 * Dv + j] / sum : 0.0;
                want_l[r0] = sum > 0 ? log(sum) : -INFINITY;
                empty += sum == 0;
            }
    cr_assert_gt(empty, 0, "%s: the case should have rows with no key (Tk_b < Tq)", name);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        float *o = util_galloc(no), *lse = util_galloc(nl);
        p.isa = isas[ii];
        util_forward_contig(&p, isas[ii], q, k, v, o, lse);
        char w[160];
        snprintf(w, sizeof w, "%s [%s]: O = P", name, sdpa_isa_name(isas[ii]));
        util_expect_close(w, o, want_o, no, 1e-6, 0, 0);
        snprintf(w, sizeof w, "%s [%s]: LSE", name, sdpa_isa_name(isas[ii]));
        util_expect_close(w, lse, want_l, nl, 1e-6, 0, 0);
        util_gfree(o);
        util_gfree(lse);
    }
    free(q);
    free(k);
    free(v);
    free(want_o);
    free(want_l);
}

Test(variants, alibi_bottom_right_kv_lengths_causal)
{
    alibi_closed_form(1, SDPA_WINDOW_UNBOUNDED, SDPA_WINDOW_UNBOUNDED, "alibi causal-br kvlen");
}

Test(variants, alibi_bottom_right_kv_lengths_window)
{
    /* keys on both sides of the diagonal: |j - (i + d)| on the right too */
    alibi_closed_form(0, 4, 2, "alibi window-br (4, 2) kvlen");
}

Test(variants, large_sink_takes_the_lse_256_path)
{
    /* Bias +300 on every logit and sinks near it: |LSE| >= 256, where the backward
     * recomputes each row's max and sum from the keys: the sink must be in them. */
    const int64_t B = 1, Hq = 3, Hkv = 1, Tq = 17, Tk = 45, Dk = 8, Dv = 8;
    util_rng r;
    util_rng_seed(&r, "variants/large_sink_takes_the_lse_256_path", 0x256);
    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    const float bias = 300.0f, sinks[3] = {300.5f, 304.0f, -INFINITY};
    p.bias = (sdpa_bias){&bias, 0, 0, 0, 0};
    p.sinks = sinks;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    inputs in = make_inputs(&p, &r, 1.0);
    run_all_isas(p, &in, 0, "sinks near 300, bias +300", NULL);
    p.softcap = 1.0f;
    run_all_isas(p, &in, 0, "sinks near 300, bias +300, softcap", NULL);
    util_inputs_free(&in);
}

/* ---------------------------------------------------------------- refusals */

/* A valid forward/backward set-up whose outputs stay the sentinel when refused. */
typedef struct refusal {
    sdpa_problem p;
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv, *ds;
    float q_copy[2 * 5 * 4];
} refusal;

static void refusal_init(refusal *f)
{
    memset(f, 0, sizeof *f);
    f->p = util_problem(1, 2, 1, 5, 6, 4, 3);
    util_rng r;
    util_rng_init(&r, 77);
    f->q = util_galloc(2 * 5 * 4);
    f->k = util_galloc(6 * 4);
    f->v = util_galloc(6 * 3);
    f->dout = util_galloc(2 * 5 * 3);
    util_fill_uniform(&r, f->q, 40, -1, 1);
    util_fill_uniform(&r, f->k, 24, -1, 1);
    util_fill_uniform(&r, f->v, 18, -1, 1);
    util_fill_uniform(&r, f->dout, 30, -1, 1);
    memcpy(f->q_copy, f->q, sizeof f->q_copy);
    f->o = util_galloc(30);
    f->lse = util_galloc(10);
    f->dq = util_galloc(40);
    f->dk = util_galloc(24);
    f->dv = util_galloc(18);
    f->ds = util_galloc(2);
}

static void refusal_free(refusal *f)
{
    float *all[] = {f->q, f->k, f->v, f->o, f->lse, f->dout, f->dq, f->dk, f->dv, f->ds};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        util_gfree(all[i]);
}

static int all_sentinel(const float *x)
{
    const size_t n = util_glen(x);
    for (size_t i = 0; i < n; i++)
        if (!util_is_sentinel(x[i]))
            return 0;
    return util_gintact(x, "output");
}

/* The forward (when fwd) and the backward of p both return `want`, nothing written. */
static void expect_refused(refusal *f, const sdpa_problem *p, sdpa_status want, int fwd, const char *what)
{
    const sdpa_tensor tq = util_cview(f->q, 2, 5, 4), tk = util_cview(f->k, 1, 6, 4), tv = util_cview(f->v, 1, 6, 3),
                      tdo = util_cview(f->dout, 2, 5, 3);
    const sdpa_tensor_out to = util_cview_out(f->o, 2, 5, 3), tl = util_lse_view_out(f->lse, 2, 5);
    const sdpa_tensor_out tdq = util_cview_out(f->dq, 2, 5, 4), tdk = util_cview_out(f->dk, 1, 6, 4),
                          tdv = util_cview_out(f->dv, 1, 6, 3);
    if (fwd) {
        const sdpa_status st = sdpa_forward(p, &tq, &tk, &tv, &to, &tl);
        cr_expect_eq(st, want, "%s: sdpa_forward returned %s, expected %s", what, sdpa_status_string(st),
                     sdpa_status_string(want));
        cr_expect(all_sentinel(f->o) && all_sentinel(f->lse), "%s: sdpa_forward wrote an output", what);
    }
    /* the backward gets sentinel O and LSE views as inputs: never read when refused */
    const sdpa_tensor tio = util_cview(f->o, 2, 5, 3), til = util_lse_view(f->lse, 2, 5);
    const sdpa_status st = sdpa_backward(p, &tq, &tk, &tv, &tio, &til, &tdo, &tdq, &tdk, &tdv);
    cr_expect_eq(st, want, "%s: sdpa_backward returned %s, expected %s", what, sdpa_status_string(st),
                 sdpa_status_string(want));
    cr_expect(all_sentinel(f->dq) && all_sentinel(f->dk) && all_sentinel(f->dv),
              "%s: sdpa_backward wrote a gradient", what);
    cr_expect(p->dsinks != f->ds || all_sentinel(f->ds), "%s: sdpa_backward wrote dsinks", what);
    cr_expect(memcmp(f->q, f->q_copy, sizeof f->q_copy) == 0, "%s: Q was modified", what);
}

Test(variants, bad_values_refused)
{
    refusal f;
    refusal_init(&f);
    static const float caps[] = {-1.0f, -0x1p-149f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        sdpa_problem p = f.p;
        p.softcap = caps[i];
        char w[64];
        snprintf(w, sizeof w, "softcap %g", (double)caps[i]);
        expect_refused(&f, &p, SDPA_ERR_BAD_SOFTCAP, 1, w);
    }
    static const float bad_slopes[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_slopes / sizeof bad_slopes[0]; i++) {
        float slopes[2] = {0.5f, bad_slopes[i]};
        sdpa_problem p = f.p;
        p.alibi_slopes = slopes;
        char w[64];
        snprintf(w, sizeof w, "slope[1] %g", (double)bad_slopes[i]);
        expect_refused(&f, &p, SDPA_ERR_BAD_ALIBI, 1, w);
    }
    static const float bad_sinks[] = {NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_sinks / sizeof bad_sinks[0]; i++) {
        float sinks[2] = {bad_sinks[i], 0.0f};
        sdpa_problem p = f.p;
        p.sinks = sinks;
        p.dsinks = f.ds;
        char w[64];
        snprintf(w, sizeof w, "sink[0] %g", (double)bad_sinks[i]);
        expect_refused(&f, &p, SDPA_ERR_BAD_SINKS, 1, w);
    }
    {
        sdpa_problem p = f.p;
        p.dsinks = f.ds;
        expect_refused(&f, &p, SDPA_ERR_BAD_SINKS, 0, "dsinks without sinks");
    }
    /* dsinks overlapping an input (Q, the sinks, the slopes, dO) or an output (dQ) */
    {
        float sinks[3] = {0.5f, -1.0f, 0.0f};
        float slopes[3] = {0.25f, 0.5f, 0.0f};
        struct {
            float *at;
            const char *what;
        } const al[] = {{f.q + 7, "dsinks inside Q"},
                        {sinks + 1, "dsinks overlapping the sinks"},
                        {slopes + 1, "dsinks overlapping the slopes"},
                        {f.dout, "dsinks inside dO"},
                        {f.dq + 3, "dsinks inside dQ"}};
        for (size_t i = 0; i < sizeof al / sizeof al[0]; i++) {
            sdpa_problem p = f.p;
            p.sinks = sinks;
            p.alibi_slopes = slopes;
            p.dsinks = al[i].at;
            const float s1 = sinks[1], s2 = sinks[2], a1 = slopes[1], a2 = slopes[2];
            expect_refused(&f, &p, SDPA_ERR_ALIASING, 0, al[i].what);
            cr_expect(sinks[1] == s1 && sinks[2] == s2 && slopes[1] == a1 && slopes[2] == a2,
                      "%s: an input was written", al[i].what);
        }
    }
    refusal_free(&f);
}

/* sdpa.h: dsinks is "sdpa_backward only (sdpa_forward ignores it)". Before (contract
 * audit, session 30) the forward refused dsinks without sinks (BAD_SINKS) and a
 * misaligned dsinks (MISALIGNED); now any dsinks, sinks or not, misaligned or over the
 * forward's own outputs, gives the bits of the same call without it. */
Test(variants, forward_ignores_dsinks)
{
    refusal f;
    refusal_init(&f);
    const sdpa_tensor tq = util_cview(f.q, 2, 5, 4), tk = util_cview(f.k, 1, 6, 4), tv = util_cview(f.v, 1, 6, 3);
    const sdpa_tensor_out to = util_cview_out(f.o, 2, 5, 3), tl = util_lse_view_out(f.lse, 2, 5);
    const float sinks[2] = {0.5f, -1.0f};
    float o_ref[30], lse_ref[10];
    for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
        sdpa_problem p = f.p;
        p.sinks = with_sinks ? sinks : NULL;
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
        memcpy(o_ref, f.o, sizeof o_ref);
        memcpy(lse_ref, f.lse, sizeof lse_ref);
        float *const at[] = {f.ds, (float *)((char *)f.ds + 1), f.o + 2, f.lse};
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
            p.dsinks = at[i];
            const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
            cr_expect_eq(st, SDPA_OK, "sinks %d, dsinks placement %zu: %s", with_sinks, i, sdpa_status_string(st));
            cr_expect(memcmp(f.o, o_ref, sizeof o_ref) == 0 && memcmp(f.lse, lse_ref, sizeof lse_ref) == 0,
                      "sinks %d, dsinks placement %zu: other bits than without dsinks", with_sinks, i);
        }
    }
    refusal_free(&f);
}

Test(variants, accepted_values)
{
    /* -inf sinks, zero and negative slopes, tiny and huge finite softcaps are valid. */
    refusal f;
    refusal_init(&f);
    const float sinks[2] = {-INFINITY, 1.0f}, slopes[2] = {0.0f, -0.5f};
    static const float caps[] = {0x1p-149f, 1e-3f, 3e38f};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        sdpa_problem p = f.p;
        p.softcap = caps[i];
        p.sinks = sinks;
        p.alibi_slopes = slopes;
        const sdpa_tensor tq = util_cview(f.q, 2, 5, 4), tk = util_cview(f.k, 1, 6, 4), tv = util_cview(f.v, 1, 6, 3);
        const sdpa_tensor_out to = util_cview_out(f.o, 2, 5, 3), tl = util_lse_view_out(f.lse, 2, 5);
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        cr_expect_eq(st, SDPA_OK, "softcap %g: %s", (double)caps[i], sdpa_status_string(st));
        cr_expect(!util_has_nan(f.o, 30) && !util_has_nan(f.lse, 10), "softcap %g: NaN in the outputs",
                  (double)caps[i]);
    }
    refusal_free(&f);
}
