/* SPDX-License-Identifier: MIT */
/* tests/test_dtypes.c - bf16 and fp16 storage (issue 16) in the forward, on every
 * ISA the machine runs:
 *  - the scalar conversions of src/dtype.h against the compiler's _Float16 on
 *    every fp16 pattern and a sweep of fp32 patterns (where _Float16 exists), and
 *    bf16 rounding against a float64 construction;
 *  - every combination of Q, K/V and O types over shapes that hit the tails
 *    (decode, GQA, prefill, Tq != Tk, Dk != Dv, odd head_dims, causal, sliding
 *    window, key lengths, a bias), paged K/V in bf16 and fp16: the accuracy rule
 *    of docs/design.md ("Reduced precision"): against float64 computed on the
 *    same rounded inputs, the error is at most 2x that of the naive fp32
 *    reference (tests/ref.c) given the same rounded inputs and rounding its O to
 *    the same type; LSE (fp32) by the same rule; the bits identical for 1 and 2
 *    threads; nothing written past the outputs;
 *  - the backward of every combination (dQ in Q's type, dK and dV in K/V's, dO in
 *    O's) by the 3x rule against a naive backward that reads the same stored O;
 *  - bad input: an unknown type is SDPA_ERR_BAD_DESCRIPTOR and writes nothing. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/dtype.h"
#include "ref.h"
#include "util.h"

static const char *dtype_name(sdpa_dtype t)
{
    return t == SDPA_DTYPE_F32 ? "fp32" : t == SDPA_DTYPE_BF16 ? "bf16" : "fp16";
}

/* x rounded to type t and back. */
static float round_to(sdpa_dtype t, float x)
{
    return t == SDPA_DTYPE_F32 ? x : t == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(sdpa_f32_to_bf16(x))
                                                          : sdpa_f16_to_f32(sdpa_f32_to_f16(x));
}

/* ------------------------------------------------------- the conversions -- */

/* bf16 rounding from its definition: the two bf16 neighbours of x (truncation and
 * the next one up in magnitude), the nearer in float64, ties to the even one. */
static uint16_t bf16_by_definition(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    const double dl = fabs((double)sdpa_bf16_to_f32(lo) - (double)x);
    /* above the largest finite bf16 the next value is 2^128 as if the exponent went
     * on (IEEE: a value at or past the midpoint to it overflows to inf) */
    const double hv = (lo & 0x7fff) == 0x7f7f ? copysign(0x1p128, (double)x) : (double)sdpa_bf16_to_f32(hi);
    const double dh = fabs(hv - (double)x);
    if (dl < dh || (dl == dh && !(lo & 1)))
        return lo;
    return hi;
}

Test(dtypes, conversions_exact)
{
    /* every bf16 and fp16 pattern widens to the value it encodes */
    for (uint32_t h = 0; h < 65536; h++) {
        const float b = sdpa_bf16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &b, 4);
        cr_assert_eq(u, h << 16, "bf16 %04x", h);
        if (((h >> 7) & 0xff) != 0xff) /* finite bf16: narrowing gives it back */
            cr_assert_eq(sdpa_f32_to_bf16(b), h, "bf16 %04x round trip", h);
        const float f = sdpa_f16_to_f32((uint16_t)h);
        const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        const double want = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
        if (e == 31 && m)
            cr_assert(isnan(f), "fp16 %04x NaN", h);
        else
            cr_assert_eq((double)fabsf(f), want, "fp16 %04x = %.9g, want %.9g", h, (double)f, want);
        cr_assert_eq(!!signbit(f), !!(h & 0x8000), "fp16 %04x sign", h);
        if (e != 31)
            cr_assert_eq(sdpa_f32_to_f16(f), h, "fp16 %04x round trip", h);
    }
    /* narrowing: a sweep of fp32 patterns (every 4099th, plus the neighbourhood of
     * every fp16 / bf16 tie and boundary) */
    util_rng r;
    util_rng_seed(&r, "dtypes conversions", 16);
    for (uint64_t i = 0; i < ((uint64_t)1 << 32); i += 4099 + (util_rng_u64(&r) & 1)) {
        float x;
        const uint32_t u = (uint32_t)i;
        memcpy(&x, &u, 4);
        cr_assert_eq(sdpa_f32_to_bf16(x), bf16_by_definition(x), "bf16 of %08x", u);
#ifdef __FLT16_MAX__
        const _Float16 c = (_Float16)x;
        uint16_t want;
        memcpy(&want, &c, 2);
        if (!isnan(x))
            cr_assert_eq(sdpa_f32_to_f16(x), want, "fp16 of %08x: %04x, _Float16 %04x", u, sdpa_f32_to_f16(x), want);
        else
            cr_assert(isnan(sdpa_f16_to_f32(sdpa_f32_to_f16(x))), "fp16 of NaN %08x", u);
#endif
    }
    /* fp16: ties and the overflow boundary by hand */
    cr_assert_eq(sdpa_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(sdpa_f32_to_f16(65519.99f), 0x7bff);
    cr_assert_eq(sdpa_f32_to_f16(65520.0f), 0x7c00); /* the tie above the largest: to even = inf */
    cr_assert_eq(sdpa_f32_to_f16(-1e9f), 0xfc00);
    cr_assert_eq(sdpa_f32_to_f16(0x1p-25f), 0x0000);      /* tie between 0 and 2^-24: even 0 */
    cr_assert_eq(sdpa_f32_to_f16(0x1.8p-24f), 0x0002);    /* tie between 1 and 2 units: even 2 */
    cr_assert_eq(sdpa_f32_to_f16(0x1.002p0f), 0x3c00);    /* halfway to the next: even */
    cr_assert_eq(sdpa_f32_to_f16(0x1.006p0f), 0x3c02);
    cr_assert_eq(sdpa_f32_to_bf16(1.00390625f), 0x3f80); /* 1 + 2^-8: tie, even */
    cr_assert_eq(sdpa_f32_to_bf16(1.01171875f), 0x3f82); /* 1 + 3 * 2^-8: tie, even */
}

/* ------------------------------------------------------------ the forward -- */

typedef struct shape {
    const char *name;
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    sdpa_causal causal;
    int64_t wl;      /* window_left, -1 unbounded */
    int kv_lengths;  /* ragged key lengths */
    int bias;        /* an additive bias */
} shape;

static const shape shapes[] = {
    {"decode GQA 1,8,2,1,300,128,128", 1, 8, 2, 1, 300, 128, 128, SDPA_CAUSAL_NONE, -1, 0, 0},
    {"decode odd 2,4,4,1,77,67,33", 2, 4, 4, 1, 77, 67, 33, SDPA_CAUSAL_NONE, -1, 1, 0},
    {"short Tq 1,4,1,5,200,64,64 causal br", 1, 4, 1, 5, 200, 64, 64, SDPA_CAUSAL_BOTTOM_RIGHT, -1, 0, 0},
    {"prefill 1,2,1,150,150,64,48 causal", 1, 2, 1, 150, 150, 64, 48, SDPA_CAUSAL_TOP_LEFT, -1, 0, 0},
    {"prefill 2,2,2,70,131,17,40 window", 2, 2, 2, 70, 131, 17, 40, SDPA_CAUSAL_NONE, 30, 1, 0},
    {"bias 1,2,2,33,65,32,32", 1, 2, 2, 33, 65, 32, 32, SDPA_CAUSAL_NONE, -1, 0, 1},
    /* decode over more keys than one chunk of the 16-bit backward (backward_typed.c:
       512 keys at head_dim 128, 1024 at 64): key lengths ending inside a chunk and
       before one, a bottom-right window across a chunk boundary, a bias, a causal
       top-left whose later chunks allow nothing */
    {"decode chunked 2,8,2,1,1300,128,128 lens", 2, 8, 2, 1, 1300, 128, 128, SDPA_CAUSAL_NONE, -1, 1, 0},
    {"decode chunked 1,4,4,1,1100,64,64 br window", 1, 4, 4, 1, 1100, 64, 64, SDPA_CAUSAL_BOTTOM_RIGHT, 700, 0, 0},
    {"decode chunked 1,2,1,2,700,128,128 bias", 1, 2, 1, 2, 700, 128, 128, SDPA_CAUSAL_NONE, -1, 0, 1},
    {"decode chunked 2,4,1,1,1200,128,128 br lens window", 2, 4, 1, 1, 1200, 128, 128, SDPA_CAUSAL_BOTTOM_RIGHT, 300,
     1, 0},
    {"short Tq chunked 1,4,2,3,900,128,96 causal", 1, 4, 2, 3, 900, 128, 96, SDPA_CAUSAL_TOP_LEFT, -1, 0, 0},
    /* prefill tiles for the bf16 pair products' tails (where an ISA has them): an odd
       number of keys in the last tile, query columns past a 64-column block, Dv past
       a 16-float vector, 9 pairs of head_dim, partial tiles of key lengths and of a
       bottom-right causal, GQA */
    {"prefill pairs 2,4,2,67,133,64,40 lens", 2, 4, 2, 67, 133, 64, 40, SDPA_CAUSAL_NONE, -1, 1, 0},
    {"prefill pairs 1,2,2,124,301,18,130 causal br", 1, 2, 2, 124, 301, 18, 130, SDPA_CAUSAL_BOTTOM_RIGHT, -1, 0, 0},
    /* several query tiles per kv head over whole and partial key tiles (amx's 128 x 128:
       the forward's cached V pairs, forward_pairs.c; the backward's 128-key chunks) */
    {"prefill pairs 1,4,2,300,390,32,48 causal br lens", 1, 4, 2, 300, 390, 32, 48, SDPA_CAUSAL_BOTTOM_RIGHT, -1, 1,
     0},
};

typedef struct run_out {
    void *o;
    float *lse;
} run_out;

/* The descriptor of shape s (fp32 types): its mask, key lengths (or NULL) and
 * bias ([B, Hq, Tq, Tk] contiguous, or NULL). */
static sdpa_problem shape_problem(const shape *s, const int32_t *lens, const float *bias)
{
    sdpa_problem p = util_problem(s->B, s->Hq, s->Hkv, s->Tq, s->Tk, s->Dk, s->Dv);
    p.causal = s->causal;
    p.window_left = s->wl;
    p.kv_lengths = lens;
    if (bias)
        p.bias = (sdpa_bias){bias, s->Hq * s->Tq * s->Tk, s->Tq * s->Tk, s->Tk, 1};
    return p;
}

/* x[i] rounded to type t and back, in place. */
static void round_all(sdpa_dtype t, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = round_to(t, x[i]);
}

/* One forward of shape s with the given types, on isa with `threads` threads. */
static sdpa_status run_forward(const shape *s, const sdpa_dtype ty[3], sdpa_isa isa, int threads, const void *q,
                               const void *k, const void *v, const float *bias, const int32_t *lens,
                               const run_out *out)
{
    sdpa_problem p = shape_problem(s, lens, bias);
    p.q_dtype = ty[0];
    p.kv_dtype = ty[1];
    p.o_dtype = ty[2];
    p.isa = isa;
    p.num_threads = threads;
    const sdpa_tensor tq = {q, s->Hq * s->Tq * s->Dk, s->Tq * s->Dk, s->Dk};
    const sdpa_tensor tk = {k, s->Hkv * s->Tk * s->Dk, s->Tk * s->Dk, s->Dk};
    const sdpa_tensor tv = {v, s->Hkv * s->Tk * s->Dv, s->Tk * s->Dv, s->Dv};
    const sdpa_tensor_out to = {out->o, s->Hq * s->Tq * s->Dv, s->Tq * s->Dv, s->Dv};
    const sdpa_tensor_out tl = {out->lse, s->Hq * s->Tq, s->Tq, 1};
    return sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
}

/* util_rounds_p for a type triple. */
static int rounds_p(sdpa_isa isa, const sdpa_dtype ty[3], int64_t Dk, int64_t Dv)
{
    return util_rounds_p(isa, ty[0], ty[1], Dk, Dv);
}

static void check_shape(const shape *s, const sdpa_dtype ty[3], const sdpa_isa *isas, int nisa, uint64_t seed)
{
    const size_t nq = (size_t)(s->B * s->Hq * s->Tq * s->Dk), nk = (size_t)(s->B * s->Hkv * s->Tk * s->Dk),
                 nv = (size_t)(s->B * s->Hkv * s->Tk * s->Dv), no = (size_t)(s->B * s->Hq * s->Tq * s->Dv),
                 nl = (size_t)(s->B * s->Hq * s->Tq), nb = s->bias ? (size_t)(s->B * s->Hq * s->Tq * s->Tk) : 0;
    util_rng r;
    util_rng_init(&r, seed);
    float *q = malloc(nq * 4 + 4), *k = malloc(nk * 4 + 4), *v = malloc(nv * 4 + 4), *bias = NULL;
    util_fill_normal(&r, q, nq, 1.5f);
    util_fill_normal(&r, k, nk, 1.5f);
    util_fill_normal(&r, v, nv, 1.0f);
    if (nb) {
        bias = malloc(nb * 4);
        util_fill_normal(&r, bias, nb, 1.0f);
        for (size_t i = 0; i < nb; i += 7)
            bias[i] = -INFINITY;
    }
    int32_t lens[8];
    for (int64_t b = 0; b < s->B; b++)
        lens[b] = s->kv_lengths ? (int32_t)(b == 0 ? s->Tk - 3 : s->Tk / 2 + b) : (int32_t)s->Tk;
    /* the inputs as the library holds them, and the same values in fp32 */
    void *qs = util_store_as(ty[0], q, nq, 0), *ks = util_store_as(ty[1], k, nk, 0), *vs = util_store_as(ty[1], v, nv, 0);
    round_all(ty[0], q, nq);
    round_all(ty[1], k, nk);
    round_all(ty[1], v, nv);
    /* references on the rounded inputs */
    sdpa_problem p = shape_problem(s, s->kv_lengths ? lens : NULL, bias);
    double *ro = malloc(no * 8 + 8), *rl = malloc(nl * 8);
    float *no32 = malloc(no * 4 + 4), *nl32 = malloc(nl * 4), *got = malloc(no * 4 + 4);
    float *np32 = malloc(no * 4 + 4); /* the naive reference with P rounded to bf16 */
    ref_forward(&p, q, k, v, ro, rl);
    naive32_forward(&p, q, k, v, no32, nl32);
    float *qp32 = util_pairs_q(q, nq, ty[0]); /* Q as the pair products read it */
    float *npl32 = malloc(nl * 4);
    naive32_forward_bf16_p(&p, qp32, k, v, np32, npl32);
    free(qp32);
    for (size_t i = 0; i < no; i++) {
        no32[i] = round_to(ty[2], no32[i]);
        np32[i] = round_to(ty[2], np32[i]);
    }
    const size_t guard = 16;
    for (int ii = 0; ii < nisa; ii++) {
        const float *naive_o = rounds_p(isas[ii], ty, s->Dk, s->Dv) ? np32 : no32;
        run_out out[2];
        for (int t = 0; t < 2; t++) {
            out[t].o = util_store_as(ty[2], no32, 0, no + guard); /* all guard bytes */
            out[t].lse = malloc(nl * 4);
            const sdpa_status st = run_forward(s, ty, isas[ii], t + 1, qs, ks, vs, bias,
                                               s->kv_lengths ? lens : NULL, &out[t]);
            cr_assert_eq(st, SDPA_OK, "[%s] %s q %s kv %s o %s: %s", sdpa_isa_name(isas[ii]), s->name,
                         dtype_name(ty[0]), dtype_name(ty[1]), dtype_name(ty[2]), sdpa_status_string(st));
            cr_expect(util_guard_intact(out[t].o, no * util_dtype_bytes(ty[2]), guard * util_dtype_bytes(ty[2])),
                      "[%s] %s: written past O", sdpa_isa_name(isas[ii]), s->name);
        }
        char what[200];
        snprintf(what, sizeof what, "[%s] %s q %s kv %s o %s: O", sdpa_isa_name(isas[ii]), s->name,
                 dtype_name(ty[0]), dtype_name(ty[1]), dtype_name(ty[2]));
        for (size_t i = 0; i < no; i++)
            got[i] = util_load_as(ty[2], out[0].o, i);
        util_fa_expect(what, got, naive_o, ro, no, 2.0);
        snprintf(what, sizeof what, "[%s] %s q %s kv %s o %s: LSE", sdpa_isa_name(isas[ii]), s->name,
                 dtype_name(ty[0]), dtype_name(ty[1]), dtype_name(ty[2]));
        util_fa_expect(what, out[0].lse, rounds_p(isas[ii], ty, s->Dk, s->Dv) ? npl32 : nl32, rl, nl, 2.0);
        cr_expect(memcmp(out[0].o, out[1].o, no * util_dtype_bytes(ty[2])) == 0 &&
                      memcmp(out[0].lse, out[1].lse, nl * 4) == 0,
                  "[%s] %s q %s kv %s o %s: 1 and 2 threads differ", sdpa_isa_name(isas[ii]), s->name,
                  dtype_name(ty[0]), dtype_name(ty[1]), dtype_name(ty[2]));
        for (int t = 0; t < 2; t++) {
            free(out[t].o);
            free(out[t].lse);
        }
    }
    free(q), free(k), free(v), free(bias), free(qs), free(ks), free(vs);
    free(ro), free(rl), free(no32), free(np32), free(nl32), free(npl32), free(got);
}

static void sweep(const sdpa_dtype ty[3])
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(&shapes[i], ty, isas, nisa, 1600 + i);
}

/* Every combination of types (the all-fp32 one included: it goes the old way). */
#define COMBO(qt, kvt, ot)                                                                                         \
    Test(dtypes, forward_q_##qt##_kv_##kvt##_o_##ot)                                                               \
    {                                                                                                              \
        const sdpa_dtype ty[3] = {SDPA_DTYPE_##qt, SDPA_DTYPE_##kvt, SDPA_DTYPE_##ot};                             \
        sweep(ty);                                                                                                 \
    }
#define COMBO_O(qt, kvt) COMBO(qt, kvt, F32) COMBO(qt, kvt, BF16) COMBO(qt, kvt, F16)
#define COMBO_KV(qt) COMBO_O(qt, F32) COMBO_O(qt, BF16) COMBO_O(qt, F16)
COMBO_KV(F32)
COMBO_KV(BF16)
COMBO_KV(F16)

/* ------------------------------------------------------------ backward -- */

/* The backward of shape s with the given types: O and LSE from the library's own
 * forward in those types (O stored in o_dtype, as a training step keeps it), then
 * dQ, dK, dV in their tensors' types. Against float64 on the rounded Q, K, V, dO,
 * the error of each gradient (read back from its type) is at most 3x that of the
 * naive fp32 backward given the same rounded inputs and the same stored O (D =
 * rowsum(dO * O) from it, one term at a time) with its gradients rounded to the
 * same types; 1 and 2 threads give the same bits; nothing is written past them. */
static void check_backward(const shape *s, const sdpa_dtype ty[3], const sdpa_isa *isas, int nisa, uint64_t seed)
{
    const size_t nq = (size_t)(s->B * s->Hq * s->Tq * s->Dk), nk = (size_t)(s->B * s->Hkv * s->Tk * s->Dk),
                 nv = (size_t)(s->B * s->Hkv * s->Tk * s->Dv), no = (size_t)(s->B * s->Hq * s->Tq * s->Dv),
                 nl = (size_t)(s->B * s->Hq * s->Tq), nb = s->bias ? (size_t)(s->B * s->Hq * s->Tq * s->Tk) : 0;
    util_rng r;
    util_rng_init(&r, seed);
    float *q = malloc(nq * 4 + 4), *k = malloc(nk * 4 + 4), *v = malloc(nv * 4 + 4), *dout = malloc(no * 4 + 4);
    float *bias = NULL;
    util_fill_normal(&r, q, nq, 1.0f);
    util_fill_normal(&r, k, nk, 1.0f);
    util_fill_normal(&r, v, nv, 1.0f);
    util_fill_normal(&r, dout, no, 1.0f);
    if (nb) {
        bias = malloc(nb * 4);
        util_fill_normal(&r, bias, nb, 1.0f);
        for (size_t i = 0; i < nb; i += 7)
            bias[i] = -INFINITY;
    }
    int32_t lens[8];
    for (int64_t b = 0; b < s->B; b++)
        lens[b] = s->kv_lengths ? (int32_t)(b == 0 ? s->Tk - 3 : s->Tk / 2 + b) : (int32_t)s->Tk;
    void *qs = util_store_as(ty[0], q, nq, 0), *ks = util_store_as(ty[1], k, nk, 0), *vs = util_store_as(ty[1], v, nv, 0),
         *dos = util_store_as(ty[2], dout, no, 0);
    round_all(ty[0], q, nq);
    round_all(ty[1], k, nk);
    round_all(ty[1], v, nv);
    round_all(ty[2], dout, no);
    sdpa_problem p = shape_problem(s, s->kv_lengths ? lens : NULL, bias);
    double *rq = malloc(nq * 8 + 8), *rk = malloc(nk * 8 + 8), *rv = malloc(nv * 8 + 8);
    ref_backward(&p, q, k, v, dout, rq, rk, rv);
    float *nq32 = malloc(nq * 4 + 4), *nk32 = malloc(nk * 4 + 4), *nv32 = malloc(nv * 4 + 4);
    float *o32 = malloc(no * 4 + 4), *got = malloc((nq > nk ? (nq > nv ? nq : nv) : (nk > nv ? nk : nv)) * 4 + 4);
    float *qr = NULL;                /* Q rounded as util_pairs_q gives it, when an ISA rounds it */
    double *rr[3] = {NULL, NULL, NULL}; /* the float64 backward on it */
    const size_t guard = 16;
    const sdpa_tensor tq = {qs, s->Hq * s->Tq * s->Dk, s->Tq * s->Dk, s->Dk};
    const sdpa_tensor tk = {ks, s->Hkv * s->Tk * s->Dk, s->Tk * s->Dk, s->Dk};
    const sdpa_tensor tv = {vs, s->Hkv * s->Tk * s->Dv, s->Tk * s->Dv, s->Dv};
    const sdpa_tensor tdo = {dos, s->Hq * s->Tq * s->Dv, s->Tq * s->Dv, s->Dv};
    for (int ii = 0; ii < nisa; ii++) {
        run_out fw = {util_store_as(ty[2], dout, 0, no), malloc(nl * 4)};
        cr_assert_eq(run_forward(s, ty, isas[ii], 1, qs, ks, vs, bias, s->kv_lengths ? lens : NULL, &fw), SDPA_OK);
        for (size_t i = 0; i < no; i++)
            o32[i] = util_load_as(ty[2], fw.o, i);
        /* an fp32 Q that the problem rounds to bf16 (sdpa_rounds_q_bf16): the references
           read it rounded, the float64 one computed once */
        const int rounds_q = util_rounds_q(isas[ii], ty[0], ty[1], s->Dk, s->Dv, s->Tq, s->Hq / s->Hkv);
        if (rounds_q && !qr) {
            qr = util_pairs_q(q, nq, ty[0]);
            for (int x = 0; x < 3; x++)
                rr[x] = malloc((x == 0 ? nq : x == 1 ? nk : nv) * 8 + 8);
            ref_backward(&p, qr, k, v, dout, rr[0], rr[1], rr[2]);
        }
        (util_rounds_bwd(isas[ii], ty, s->Dk, s->Dv, s->Tq, s->Hq / s->Hkv) ? naive32_backward_o_bf16_p
                                                                             : naive32_backward_o)(
            &p, rounds_q ? qr : q, k, v, o32, dout, nq32, nk32, nv32);
        for (size_t i = 0; i < nq; i++)
            nq32[i] = round_to(ty[0], nq32[i]);
        for (size_t i = 0; i < nk; i++)
            nk32[i] = round_to(ty[1], nk32[i]);
        for (size_t i = 0; i < nv; i++)
            nv32[i] = round_to(ty[1], nv32[i]);
        const sdpa_tensor to = {fw.o, s->Hq * s->Tq * s->Dv, s->Tq * s->Dv, s->Dv},
                          tl = {fw.lse, s->Hq * s->Tq, s->Tq, 1};
        void *g[2][3];
        for (int t = 0; t < 2; t++) {
            g[t][0] = util_store_as(ty[0], q, 0, nq + guard);
            g[t][1] = util_store_as(ty[1], k, 0, nk + guard);
            g[t][2] = util_store_as(ty[1], v, 0, nv + guard);
            p.q_dtype = ty[0], p.kv_dtype = ty[1], p.o_dtype = ty[2];
            p.isa = isas[ii];
            p.num_threads = t + 1;
            const sdpa_tensor_out tdq = {g[t][0], tq.batch_stride, tq.head_stride, tq.seq_stride},
                                  tdk = {g[t][1], tk.batch_stride, tk.head_stride, tk.seq_stride},
                                  tdv = {g[t][2], tv.batch_stride, tv.head_stride, tv.seq_stride};
            const sdpa_status st = sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv);
            p.q_dtype = p.kv_dtype = p.o_dtype = SDPA_DTYPE_F32;
            p.isa = SDPA_ISA_AUTO;
            p.num_threads = 0;
            cr_assert_eq(st, SDPA_OK, "[%s] %s backward q %s kv %s o %s: %s", sdpa_isa_name(isas[ii]), s->name,
                         dtype_name(ty[0]), dtype_name(ty[1]), dtype_name(ty[2]), sdpa_status_string(st));
            cr_expect(util_guard_intact(g[t][0], nq * util_dtype_bytes(ty[0]), guard * util_dtype_bytes(ty[0])) &&
                          util_guard_intact(g[t][1], nk * util_dtype_bytes(ty[1]), guard * util_dtype_bytes(ty[1])) &&
                          util_guard_intact(g[t][2], nv * util_dtype_bytes(ty[1]), guard * util_dtype_bytes(ty[1])),
                      "[%s] %s backward: written past a gradient", sdpa_isa_name(isas[ii]), s->name);
        }
        const size_t n[3] = {nq, nk, nv};
        const float *naive[3] = {nq32, nk32, nv32};
        const double *ref[3] = {rounds_q ? rr[0] : rq, rounds_q ? rr[1] : rk, rounds_q ? rr[2] : rv};
        const char *names[3] = {"dQ", "dK", "dV"};
        for (int x = 0; x < 3; x++) {
            const sdpa_dtype t = x == 0 ? ty[0] : ty[1];
            for (size_t i = 0; i < n[x]; i++)
                got[i] = util_load_as(t, g[0][x], i);
            char what[200];
            snprintf(what, sizeof what, "[%s] %s q %s kv %s o %s: %s", sdpa_isa_name(isas[ii]), s->name,
                     dtype_name(ty[0]), dtype_name(ty[1]), dtype_name(ty[2]), names[x]);
            util_fa_expect(what, got, naive[x], ref[x], n[x], 3.0);
            cr_expect(memcmp(g[0][x], g[1][x], n[x] * util_dtype_bytes(t)) == 0, "%s: 1 and 2 threads differ", what);
        }
        for (int t = 0; t < 2; t++)
            for (int x = 0; x < 3; x++)
                free(g[t][x]);
        free(fw.o), free(fw.lse);
    }
    free(q), free(k), free(v), free(dout), free(bias), free(qs), free(ks), free(vs), free(dos);
    free(rq), free(rk), free(rv), free(nq32), free(nk32), free(nv32), free(o32), free(got);
    free(qr), free(rr[0]), free(rr[1]), free(rr[2]);
}

static void sweep_backward(const sdpa_dtype ty[3])
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_backward(&shapes[i], ty, isas, nisa, 1700 + i);
}

#define BCOMBO(qt, kvt, ot)                                                                                        \
    Test(dtypes, backward_q_##qt##_kv_##kvt##_o_##ot)                                                              \
    {                                                                                                              \
        const sdpa_dtype ty[3] = {SDPA_DTYPE_##qt, SDPA_DTYPE_##kvt, SDPA_DTYPE_##ot};                             \
        sweep_backward(ty);                                                                                        \
    }
#define BCOMBO_O(qt, kvt) BCOMBO(qt, kvt, F32) BCOMBO(qt, kvt, BF16) BCOMBO(qt, kvt, F16)
#define BCOMBO_KV(qt) BCOMBO_O(qt, F32) BCOMBO_O(qt, BF16) BCOMBO_O(qt, F16)
BCOMBO_KV(F32)
BCOMBO_KV(BF16)
BCOMBO_KV(F16)

/* Packed sequences (cu_seqlens) in bf16 / fp16, forward and backward: each
 * sequence's outputs and gradients bitwise those of the same sequence alone as a
 * dense problem of one batch (batch invariance carries over to 16-bit storage). */
static void packed_case(sdpa_dtype t)
{
    enum { NS = 3, HQ = 4, HKV = 2, D = 40 };
    /* the last one long enough for several key tiles of the bf16 pair products' own
     * blocks (128 x 128 on amx), the second a decode */
    const int32_t tq[NS] = {7, 1, 150}, tk[NS] = {30, 9, 300};
    int32_t cuq[NS + 1] = {0}, cuk[NS + 1] = {0};
    for (int b = 0; b < NS; b++)
        cuq[b + 1] = cuq[b] + tq[b], cuk[b + 1] = cuk[b] + tk[b];
    const size_t nq = (size_t)cuq[NS] * HQ * D, nk = (size_t)cuk[NS] * HKV * D, nl = (size_t)cuq[NS] * HQ;
    util_rng r;
    util_rng_seed(&r, "dtypes packed", 1618);
    float *x = malloc((2 * nq + 2 * nk) * 4);
    util_fill_normal(&r, x, 2 * nq + 2 * nk, 1.0f);
    void *q = util_store_as(t, x, nq, 0), *k = util_store_as(t, x + nq, nk, 0), *v = util_store_as(t, x + nq + nk, nk, 0),
         *dout = util_store_as(t, x + nq + 2 * nk, nq, 0);
    void *o = util_store_as(t, x, 0, nq), *dq = util_store_as(t, x, 0, nq), *dk = util_store_as(t, x, 0, nk),
         *dv = util_store_as(t, x, 0, nk);
    float *lse = malloc(nl * 4);
    sdpa_seqs sq = {0};
    sq.cu_seqlens_q = cuq;
    sq.cu_seqlens_k = cuk;
    sdpa_problem p = util_problem(NS, HQ, HKV, cuq[NS], cuk[NS], D, D);
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.seqs = &sq;
    p.q_dtype = p.kv_dtype = p.o_dtype = t;
    /* token lists [total, H, D] */
    const sdpa_tensor tq_ = {q, 0, D, HQ * D}, tk_ = {k, 0, D, HKV * D}, tv_ = {v, 0, D, HKV * D},
                      tdo = {dout, 0, D, HQ * D}, to_in = {o, 0, D, HQ * D}, tl_in = {lse, 0, 1, HQ};
    const sdpa_tensor_out to = {o, 0, D, HQ * D}, tl = {lse, 0, 1, HQ}, tdq = {dq, 0, D, HQ * D},
                          tdk = {dk, 0, D, HKV * D}, tdv = {dv, 0, D, HKV * D};
    cr_assert_eq(sdpa_forward(&p, &tq_, &tk_, &tv_, &to, &tl), SDPA_OK);
    sdpa_status st = sdpa_backward(&p, &tq_, &tk_, &tv_, &to_in, &tl_in, &tdo, &tdq, &tdk, &tdv);
    cr_assert_eq(st, SDPA_OK, "packed %s backward: %s", dtype_name(t), sdpa_status_string(st));
    const size_t e = util_dtype_bytes(t);
    for (int b = 0; b < NS; b++) { /* sequence b alone: views into the same token lists */
        sdpa_problem pd = util_problem(1, HQ, HKV, tq[b], tk[b], D, D);
        pd.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        pd.q_dtype = pd.kv_dtype = pd.o_dtype = t;
        const char *qb = (const char *)q + (size_t)cuq[b] * HQ * D * e, *kb = (const char *)k + (size_t)cuk[b] * HKV * D * e,
                   *vb = (const char *)v + (size_t)cuk[b] * HKV * D * e, *dob = (const char *)dout + (size_t)cuq[b] * HQ * D * e;
        void *o1 = util_store_as(t, x, 0, (size_t)tq[b] * HQ * D), *dq1 = util_store_as(t, x, 0, (size_t)tq[b] * HQ * D),
             *dk1 = util_store_as(t, x, 0, (size_t)tk[b] * HKV * D), *dv1 = util_store_as(t, x, 0, (size_t)tk[b] * HKV * D);
        float *l1 = malloc((size_t)tq[b] * HQ * 4);
        const sdpa_tensor a_q = {qb, 0, D, HQ * D}, a_k = {kb, 0, D, HKV * D}, a_v = {vb, 0, D, HKV * D},
                          a_do = {dob, 0, D, HQ * D}, a_oi = {o1, 0, D, HQ * D}, a_li = {l1, 0, 1, HQ};
        const sdpa_tensor_out a_o = {o1, 0, D, HQ * D}, a_l = {l1, 0, 1, HQ}, a_dq = {dq1, 0, D, HQ * D},
                              a_dk = {dk1, 0, D, HKV * D}, a_dv = {dv1, 0, D, HKV * D};
        cr_assert_eq(sdpa_forward(&pd, &a_q, &a_k, &a_v, &a_o, &a_l), SDPA_OK);
        cr_assert_eq(sdpa_backward(&pd, &a_q, &a_k, &a_v, &a_oi, &a_li, &a_do, &a_dq, &a_dk, &a_dv), SDPA_OK);
        cr_expect(memcmp(o1, (const char *)o + (size_t)cuq[b] * HQ * D * e, (size_t)tq[b] * HQ * D * e) == 0 &&
                      memcmp(dq1, (const char *)dq + (size_t)cuq[b] * HQ * D * e, (size_t)tq[b] * HQ * D * e) == 0 &&
                      memcmp(dk1, (const char *)dk + (size_t)cuk[b] * HKV * D * e, (size_t)tk[b] * HKV * D * e) == 0 &&
                      memcmp(dv1, (const char *)dv + (size_t)cuk[b] * HKV * D * e, (size_t)tk[b] * HKV * D * e) == 0,
                  "packed %s: sequence %d differs from the same sequence alone", dtype_name(t), b);
        free(o1), free(dq1), free(dk1), free(dv1), free(l1);
    }
    free(x), free(q), free(k), free(v), free(dout), free(o), free(dq), free(dk), free(dv), free(lse);
}

/* A NaN or inf in one K or V row j of a bf16 causal prefill: the rows that may not see
 * key j (i < j) stay finite and within the accuracy rule, the others are not finite
 * (NaN, or +-inf in the inf V row's columns), on every ISA. Key j lies in a partial (diagonal) tile, where the bf16 pair products would
 * turn a masked probability's -0 times an inf into a NaN: that tile's P V runs in fp32
 * (forward.c, fwd_pairs_tile). */
Test(dtypes, bf16_nonfinite_row_stays_masked)
{
    const shape s = {"causal 1,2,1,150,150,64,64", 1, 2, 1, 150, 150, 64, 64, SDPA_CAUSAL_TOP_LEFT, -1, 0, 0};
    const sdpa_dtype ty[3] = {SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_F32};
    const size_t nq = 2 * 150 * 64, nk = 150 * 64, no = 2 * 150 * 64, nl = 2 * 150;
    const int64_t bad_row = 100;
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (int which = 0; which < 4; which++) { /* V NaN, V inf, K NaN, K inf */
        util_rng r;
        util_rng_init(&r, 4242 + (uint64_t)which);
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
        util_fill_normal(&r, q, nq, 1.5f);
        util_fill_normal(&r, k, nk, 1.5f);
        util_fill_normal(&r, v, nk, 1.0f);
        round_all(ty[0], q, nq);
        round_all(ty[1], k, nk);
        round_all(ty[1], v, nk);
        /* references on the finite inputs: rows i < bad_row never see key bad_row */
        sdpa_problem p = shape_problem(&s, NULL, NULL);
        double *ro = malloc(no * 8), *rl = malloc(nl * 8);
        float *n32 = malloc(no * 4), *np32 = malloc(no * 4), *nl32 = malloc(nl * 4), *got = malloc(no * 4);
        ref_forward(&p, q, k, v, ro, rl);
        naive32_forward(&p, q, k, v, n32, nl32);
        naive32_forward_bf16_p(&p, q, k, v, np32, nl32);
        float *row = (which < 2 ? v : k) + bad_row * 64;
        for (int c = 0; c < 64; c += 5)
            row[c] = which % 2 ? INFINITY : NAN;
        void *qs = util_store_as(ty[0], q, nq, 0), *ks = util_store_as(ty[1], k, nk, 0), *vs = util_store_as(ty[1], v, nk, 0);
        for (int ii = 0; ii < nisa; ii++) {
            run_out out = {malloc(no * 4), malloc(nl * 4)};
            cr_assert_eq(run_forward(&s, ty, isas[ii], 1, qs, ks, vs, NULL, NULL, &out), SDPA_OK);
            memcpy(got, out.o, no * 4);
            size_t leaked = 0, missing = 0;
            for (size_t h = 0; h < 2; h++)
                for (size_t i = 0; i < 150; i++)
                    for (size_t c = 0; c < 64; c++) {
                        const float x = got[(h * 150 + i) * 64 + c];
                        if ((int64_t)i < bad_row && !isfinite(x))
                            leaked++;
                        if ((int64_t)i >= bad_row && (which == 1 ? isfinite(x) : !isnan(x)) &&
                            (which < 2 ? c % 5 == 0 : 1)) /* V inf: +-inf or NaN; else NaN */
                            missing++;
                    }
            cr_expect_eq(leaked, 0, "[%s] case %d: %zu non-finite values in rows before the bad key",
                         sdpa_isa_name(isas[ii]), which, leaked);
            cr_expect_eq(missing, 0, "[%s] case %d: %zu finite values where the bad key is allowed",
                         sdpa_isa_name(isas[ii]), which, missing);
            char what[96];
            snprintf(what, sizeof what, "[%s] case %d: O of the rows before the bad key", sdpa_isa_name(isas[ii]),
                     which);
            const size_t n_ok = (size_t)bad_row * 64; /* head 0's rows 0 .. bad_row - 1 */
            util_fa_expect(what, got, rounds_p(isas[ii], ty, 64, 64) ? np32 : n32, ro, n_ok, 2.0);
            free(out.o), free(out.lse);
        }
        free(q), free(k), free(v), free(qs), free(ks), free(vs), free(ro), free(rl), free(n32), free(np32);
        free(nl32), free(got);
    }
}

/* The backward of the same: bf16 Q, K/V, O and dO, a NaN or inf in K or V row j of a
 * causal prefill, O and LSE from the library's forward on them. dQ of the rows that
 * may not see key j (i < j) stays finite and within the accuracy rule, on every ISA.
 * A masked probability's -0 (and dS's) times an inf K would be a NaN in the bf16 pair
 * products (dS K reaches every row of the tile): a group or key chunk with a
 * non-finite operand runs its products in fp32 (backward_typed.c). */
Test(dtypes, bf16_nonfinite_row_backward)
{
    enum { H = 2, T = 150, D = 64 };
    const shape s = {"causal 1,2,1,150,150,64,64", 1, H, 1, T, T, D, D, SDPA_CAUSAL_TOP_LEFT, -1, 0, 0};
    const sdpa_dtype ty[3] = {SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16};
    const size_t nq = (size_t)H * T * D, nk = (size_t)T * D, nl = (size_t)H * T;
    const int64_t bad_row = 100;
    const size_t n_ok = (size_t)bad_row * D; /* per head: dQ rows 0 .. bad_row - 1 */
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (int which = 0; which < 4; which++) { /* V NaN, V inf, K NaN, K inf */
        util_rng r;
        util_rng_init(&r, 4343 + (uint64_t)which);
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
        util_fill_normal(&r, q, nq, 1.5f);
        util_fill_normal(&r, k, nk, 1.5f);
        util_fill_normal(&r, v, nk, 1.0f);
        util_fill_normal(&r, dout, nq, 1.0f);
        round_all(SDPA_DTYPE_BF16, q, nq);
        round_all(SDPA_DTYPE_BF16, k, nk);
        round_all(SDPA_DTYPE_BF16, v, nk);
        round_all(SDPA_DTYPE_BF16, dout, nq);
        sdpa_problem p = shape_problem(&s, NULL, NULL);
        double *rq = malloc(nq * 8), *rk = malloc(nk * 8), *rv = malloc(nk * 8);
        ref_backward(&p, q, k, v, dout, rq, rk, rv); /* on the finite inputs */
        float *kf = malloc(nk * 4), *vf = malloc(nk * 4);
        memcpy(kf, k, nk * 4), memcpy(vf, v, nk * 4);
        float *row = (which < 2 ? v : k) + bad_row * D;
        for (int c = 0; c < D; c += 5)
            row[c] = which % 2 ? INFINITY : NAN;
        void *qs = util_store_as(ty[0], q, nq, 0), *ks = util_store_as(ty[1], k, nk, 0), *vs = util_store_as(ty[1], v, nk, 0),
             *dos = util_store_as(ty[2], dout, nq, 0);
        float *o32 = malloc(nq * 4), *nq32 = malloc(nq * 4), *nk32 = malloc(nk * 4), *nv32 = malloc(nk * 4);
        float *got = malloc(nq * 4), *gh = malloc(n_ok * 4), *nh = malloc(n_ok * 4);
        double *rh = malloc(n_ok * 8);
        for (int ii = 0; ii < nisa; ii++) {
            run_out fw = {util_store_as(ty[2], dout, 0, nq), malloc(nl * 4)};
            cr_assert_eq(run_forward(&s, ty, isas[ii], 1, qs, ks, vs, NULL, NULL, &fw), SDPA_OK);
            void *dq = util_store_as(ty[0], q, 0, nq), *dk = util_store_as(ty[1], k, 0, nk), *dv = util_store_as(ty[1], v, 0, nk);
            p.q_dtype = p.kv_dtype = p.o_dtype = SDPA_DTYPE_BF16;
            p.isa = isas[ii];
            const sdpa_tensor tq = {qs, T * D * H, T * D, D}, tk = {ks, T * D, T * D, D}, tv = {vs, T * D, T * D, D},
                              to = {fw.o, T * D * H, T * D, D}, tl = {fw.lse, T * H, T, 1},
                              tdo = {dos, T * D * H, T * D, D};
            const sdpa_tensor_out tdq = {dq, T * D * H, T * D, D}, tdk = {dk, T * D, T * D, D},
                                  tdv = {dv, T * D, T * D, D};
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv), SDPA_OK);
            p.q_dtype = p.kv_dtype = p.o_dtype = SDPA_DTYPE_F32;
            p.isa = SDPA_ISA_AUTO;
            for (size_t i = 0; i < nq; i++) {
                got[i] = util_load_as(ty[0], dq, i);
                o32[i] = util_load_as(ty[2], fw.o, i);
            }
            /* the naive backward on the finite inputs and the stored O (finite in these rows);
               unrounded: the call's one group holds the inf / NaN, so it keeps fp32 products */
            naive32_backward_o(&p, q, kf, vf, o32, dout, nq32, nk32, nv32);
            for (int h = 0; h < H; h++) {
                size_t leaked = 0;
                for (size_t e = 0; e < n_ok; e++) {
                    const size_t at = (size_t)h * T * D + e;
                    gh[e] = got[at];
                    nh[e] = round_to(ty[0], nq32[at]);
                    rh[e] = rq[at];
                    leaked += !isfinite(gh[e]);
                }
                cr_expect_eq(leaked, 0, "[%s] case %d head %d: %zu non-finite dQ values before the bad key",
                             sdpa_isa_name(isas[ii]), which, h, leaked);
                char what[96];
                snprintf(what, sizeof what, "[%s] case %d head %d: dQ of the rows before the bad key",
                         sdpa_isa_name(isas[ii]), which, h);
                util_fa_expect(what, gh, nh, rh, n_ok, 3.0);
            }
            free(fw.o), free(fw.lse), free(dq), free(dk), free(dv);
        }
        free(q), free(k), free(v), free(dout), free(kf), free(vf), free(qs), free(ks), free(vs), free(dos);
        free(rq), free(rk), free(rv), free(o32), free(nq32), free(nk32), free(nv32), free(got), free(gh), free(nh);
        free(rh);
    }
}

/* A few-column (decode) bf16 / fp16 problem whose head_dims the typed attend_rows
 * does not take (its K and V widened in runs first), with block_k that are not
 * multiples of the decode step (16 keys): O and LSE are the bits of the fp32 call on
 * the widened inputs (a run that ended off a step boundary summed in other groups). */
Test(dtypes, decode_widened_runs_any_block_k)
{
    enum { TQ = 15, TK = 210, DK = 10, DV = 171 };
    static const int blocks[] = {1, 8, 17, 37, 64, 100};
    util_rng r;
    util_rng_init(&r, 77);
    float *q = malloc(TQ * DK * 4), *k = malloc(TK * DK * 4), *v = malloc(TK * DV * 4);
    float *o16 = malloc(TQ * DV * 4), *o32 = malloc(TQ * DV * 4), l16[TQ], l32[TQ];
    util_fill_normal(&r, q, TQ * DK, 1.0f);
    util_fill_normal(&r, k, TK * DK, 1.0f);
    util_fill_normal(&r, v, TK * DV, 1.0f);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (int t = SDPA_DTYPE_BF16; t <= SDPA_DTYPE_F16; t++) {
        round_all((sdpa_dtype)t, q, TQ * DK);
        round_all((sdpa_dtype)t, k, TK * DK);
        round_all((sdpa_dtype)t, v, TK * DV);
        void *qs = util_store_as((sdpa_dtype)t, q, TQ * DK, 0), *ks = util_store_as((sdpa_dtype)t, k, TK * DK, 0),
             *vs = util_store_as((sdpa_dtype)t, v, TK * DV, 0);
        for (int ii = 0; ii < nisa; ii++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                sdpa_problem p = util_problem(1, 1, 1, TQ, TK, DK, DV);
                p.block_k = blocks[bi];
                p.isa = isas[ii];
                p.num_threads = 1;
                const sdpa_tensor_out to16 = {o16, 0, DV * TQ, DV}, tl16 = {l16, 0, TQ, 1};
                const sdpa_tensor_out to32 = {o32, 0, DV * TQ, DV}, tl32 = {l32, 0, TQ, 1};
                const sdpa_tensor f_q = {q, 0, TQ * DK, DK}, f_k = {k, 0, TK * DK, DK}, f_v = {v, 0, TK * DV, DV};
                cr_assert_eq(sdpa_forward(&p, &f_q, &f_k, &f_v, &to32, &tl32), SDPA_OK);
                p.q_dtype = p.kv_dtype = (sdpa_dtype)t;
                const sdpa_tensor h_q = {qs, 0, TQ * DK, DK}, h_k = {ks, 0, TK * DK, DK}, h_v = {vs, 0, TK * DV, DV};
                cr_assert_eq(sdpa_forward(&p, &h_q, &h_k, &h_v, &to16, &tl16), SDPA_OK);
                cr_expect(memcmp(o16, o32, sizeof(float) * TQ * DV) == 0 && memcmp(l16, l32, sizeof l16) == 0,
                          "[%s] %s block_k %d: O or LSE differs from the fp32 call on the widened inputs",
                          sdpa_isa_name(isas[ii]), dtype_name((sdpa_dtype)t), blocks[bi]);
            }
        free(qs), free(ks), free(vs);
    }
    free(q), free(k), free(v), free(o16), free(o32);
}

Test(dtypes, packed_bf16)
{
    packed_case(SDPA_DTYPE_BF16);
}

Test(dtypes, packed_fp16)
{
    packed_case(SDPA_DTYPE_F16);
}

/* Sinks in a bf16 backward, on every ISA: dsinks (fp32) the same for 1 and 2
 * threads, bit for bit, and within 1e-5 (relative) of the fp32 backward's on the
 * widened inputs and the same stored O (dsinks come from D and LSE only; only the
 * order of their float64 sums differs). The gradients: bitwise the fp32 backward's
 * rounded where the ISA widens (the 16-bit backward is that backward, group by
 * group); where it runs the bf16 pair products, the accuracy rule against the
 * naive backward that rounds P and dS as they do. */
static void sinks_backward_bf16_on(sdpa_isa isa)
{
    enum { B = 3, HQ = 4, HKV = 2, TQ = 9, TK = 33, D = 16 };
    const float sinks[HQ] = {0.5f, -INFINITY, 1.0f, -0.3f};
    const size_t nq = (size_t)B * HQ * TQ * D, nk = (size_t)B * HKV * TK * D, nl = (size_t)B * HQ * TQ;
    util_rng r;
    util_rng_seed(&r, "dtypes sinks", 1619);
    float *x = malloc((2 * nq + 2 * nk) * 4);
    util_fill_normal(&r, x, 2 * nq + 2 * nk, 1.0f);
    const sdpa_dtype t = SDPA_DTYPE_BF16;
    void *q = util_store_as(t, x, nq, 0), *k = util_store_as(t, x + nq, nk, 0), *v = util_store_as(t, x + nq + nk, nk, 0),
         *dout = util_store_as(t, x + nq + 2 * nk, nq, 0), *o = util_store_as(t, x, 0, nq);
    float *lse = malloc(nl * 4);
    sdpa_problem p = util_problem(B, HQ, HKV, TQ, TK, D, D);
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.sinks = sinks;
    p.q_dtype = p.kv_dtype = p.o_dtype = t;
    p.isa = isa;
    const sdpa_tensor tq = {q, HQ * TQ * D, TQ * D, D}, tk = {k, HKV * TK * D, TK * D, D}, tv = {v, HKV * TK * D, TK * D, D},
                      tdo = {dout, HQ * TQ * D, TQ * D, D}, toi = {o, HQ * TQ * D, TQ * D, D}, tli = {lse, HQ * TQ, TQ, 1};
    const sdpa_tensor_out to = {o, HQ * TQ * D, TQ * D, D}, tl = {lse, HQ * TQ, TQ, 1};
    cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
    float ds[3][HQ];
    void *g[2][3];
    for (int th = 0; th < 2; th++) {
        g[th][0] = util_store_as(t, x, 0, nq), g[th][1] = util_store_as(t, x, 0, nk), g[th][2] = util_store_as(t, x, 0, nk);
        const sdpa_tensor_out tdq = {g[th][0], HQ * TQ * D, TQ * D, D}, tdk = {g[th][1], HKV * TK * D, TK * D, D},
                              tdv = {g[th][2], HKV * TK * D, TK * D, D};
        p.num_threads = th + 1;
        p.dsinks = ds[th];
        cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &toi, &tli, &tdo, &tdq, &tdk, &tdv), SDPA_OK);
    }
    cr_expect(memcmp(ds[0], ds[1], sizeof ds[0]) == 0, "dsinks: 1 and 2 threads differ");
    for (int i = 0; i < 3; i++)
        cr_expect(memcmp(g[0][i], g[1][i], (i ? nk : nq) * 2) == 0, "gradient %d: 1 and 2 threads differ", i);
    /* the fp32 backward on the widened values */
    float *w[5];
    const void *src[5] = {q, k, v, dout, o};
    const size_t n[5] = {nq, nk, nk, nq, nq};
    for (int i = 0; i < 5; i++) {
        w[i] = malloc(n[i] * 4);
        for (size_t e = 0; e < n[i]; e++)
            w[i][e] = util_load_as(t, src[i], e);
    }
    float *gq = malloc(nq * 4), *gk = malloc(nk * 4), *gv = malloc(nk * 4);
    sdpa_problem pf = p;
    pf.q_dtype = pf.kv_dtype = pf.o_dtype = SDPA_DTYPE_F32;
    pf.dsinks = ds[2];
    pf.num_threads = 1;
    const sdpa_tensor fq = {w[0], HQ * TQ * D, TQ * D, D}, fk = {w[1], HKV * TK * D, TK * D, D},
                      fv = {w[2], HKV * TK * D, TK * D, D}, fdo = {w[3], HQ * TQ * D, TQ * D, D},
                      fo = {w[4], HQ * TQ * D, TQ * D, D};
    const sdpa_tensor_out fdq = {gq, HQ * TQ * D, TQ * D, D}, fdk = {gk, HKV * TK * D, TK * D, D},
                          fdv = {gv, HKV * TK * D, TK * D, D};
    cr_assert_eq(sdpa_backward(&pf, &fq, &fk, &fv, &fo, &tli, &fdo, &fdq, &fdk, &fdv), SDPA_OK);
    for (int h = 0; h < HQ; h++)
        cr_expect(fabsf(ds[0][h] - ds[2][h]) <= 1e-5f * (fabsf(ds[2][h]) + 1e-3f), "dsinks[%d] %.9g, fp32 %.9g", h,
                  (double)ds[0][h], (double)ds[2][h]);
    const sdpa_dtype ty[3] = {t, t, t};
    if (!util_rounds_bwd(isa, ty, D, D, TQ, HQ / HKV)) {
        for (size_t e = 0; e < nq; e++) /* the gradients: the fp32 ones rounded */
            cr_assert_eq(util_load_as(t, g[0][0], e), round_to(t, gq[e]), "[%s] dQ[%zu]", sdpa_isa_name(isa), e);
        for (size_t e = 0; e < nk; e++) {
            cr_assert_eq(util_load_as(t, g[0][1], e), round_to(t, gk[e]), "[%s] dK[%zu]", sdpa_isa_name(isa), e);
            cr_assert_eq(util_load_as(t, g[0][2], e), round_to(t, gv[e]), "[%s] dV[%zu]", sdpa_isa_name(isa), e);
        }
    } else { /* bf16 pair products (P and dS rounded): the accuracy rule against the naive
                backward that rounds them too, on the same stored O */
        double *rg[3] = {malloc(nq * 8), malloc(nk * 8), malloc(nk * 8)};
        float *ng[3] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4)}, *got = malloc((nq > nk ? nq : nk) * 4);
        pf.dsinks = NULL;
        ref_backward(&pf, w[0], w[1], w[2], w[3], rg[0], rg[1], rg[2]);
        naive32_backward_o_bf16_p(&pf, w[0], w[1], w[2], w[4], w[3], ng[0], ng[1], ng[2]);
        for (int x = 0; x < 3; x++) {
            const size_t m = x ? nk : nq;
            for (size_t e = 0; e < m; e++) {
                ng[x][e] = round_to(t, ng[x][e]);
                got[e] = util_load_as(t, g[0][x], e);
            }
            char what[64];
            snprintf(what, sizeof what, "[%s] sinks bf16 backward: gradient %d", sdpa_isa_name(isa), x);
            util_fa_expect(what, got, ng[x], rg[x], m, 3.0);
            free(rg[x]), free(ng[x]);
        }
        free(got);
    }
    for (int i = 0; i < 5; i++)
        free(w[i]);
    for (int th = 0; th < 2; th++)
        for (int i = 0; i < 3; i++)
            free(g[th][i]);
    free(x), free(q), free(k), free(v), free(dout), free(o), free(lse), free(gq), free(gk), free(gv);
}

Test(dtypes, sinks_backward_bf16)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (int i = 0; i < nisa; i++)
        sinks_backward_bf16_on(isas[i]);
}

/* ---------------------------------------------------------------- paged -- */

/* Three sequences over a shuffled paged bf16 / fp16 cache [num_blocks, Hkv,
 * block_size, D] (decode rows and a chunk, bottom-right causal), against each
 * sequence's own dense reference on the gathered rounded keys. */
static void paged_case(sdpa_dtype kvt)
{
    enum { NS = 3, HQ = 4, HKV = 2, D = 64, BS = 16, MAXB = 8, NB = 24 };
    const int32_t tq[NS] = {1, 5, 1}, tk[NS] = {100, 37, 128};
    int32_t cuq[NS + 1] = {0}, table[NS * MAXB];
    for (int b = 0; b < NS; b++)
        cuq[b + 1] = cuq[b] + tq[b];
    for (int i = 0; i < NS * MAXB; i++)
        table[i] = (int32_t)((i * 7 + 3) % NB); /* shuffled, every id once */
    util_rng r;
    util_rng_seed(&r, "dtypes paged", 1616);
    const size_t ncache = (size_t)NB * HKV * BS * D, nq = (size_t)cuq[NS] * HQ * D;
    float *kc = malloc(ncache * 4), *vc = malloc(ncache * 4), *q = malloc(nq * 4);
    util_fill_normal(&r, kc, ncache, 1.5f);
    util_fill_normal(&r, vc, ncache, 1.0f);
    util_fill_normal(&r, q, nq, 1.5f);
    void *ks = util_store_as(kvt, kc, ncache, 0), *vs = util_store_as(kvt, vc, ncache, 0);
    for (size_t i = 0; i < ncache; i++) {
        kc[i] = round_to(kvt, kc[i]);
        vc[i] = round_to(kvt, vc[i]);
    }
    sdpa_seqs sq = {0};
    sq.cu_seqlens_q = cuq;
    sq.block_table = table;
    sq.max_blocks_per_seq = MAXB;
    sq.seq_lens_k = tk;
    sq.block_size = BS;
    sq.num_blocks = NB;
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (int ii = 0; ii < nisa; ii++) {
        sdpa_problem p = util_problem(NS, HQ, HKV, cuq[NS], 0, D, D);
        p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        p.seqs = &sq;
        p.kv_dtype = kvt;
        p.isa = isas[ii];
        float *o = malloc(nq * 4), *lse = malloc((size_t)cuq[NS] * HQ * 4);
        const sdpa_tensor tqq = {q, 0, D, HQ * D}, tkk = {ks, HKV * BS * D, BS * D, D}, tvv = {vs, HKV * BS * D, BS * D, D};
        const sdpa_tensor_out to = {o, 0, D, HQ * D}, tl = {lse, 0, 1, HQ};
        const sdpa_status st = sdpa_forward(&p, &tqq, &tkk, &tvv, &to, &tl);
        cr_assert_eq(st, SDPA_OK, "[%s] paged %s: %s", sdpa_isa_name(isas[ii]), dtype_name(kvt),
                     sdpa_status_string(st));
        for (int b = 0; b < NS; b++) { /* sequence b as a dense problem on its gathered keys */
            const size_t n = (size_t)tk[b];
            float *kd = malloc((size_t)HKV * n * D * 4), *vd = malloc((size_t)HKV * n * D * 4);
            float *qd = malloc((size_t)HQ * tq[b] * D * 4), *gd = malloc((size_t)HQ * tq[b] * D * 4);
            float *gl = malloc((size_t)HQ * tq[b] * 4);
            for (int h = 0; h < HKV; h++)
                for (size_t j = 0; j < n; j++) {
                    const size_t page = (size_t)table[b * MAXB + j / BS], src = ((page * HKV + h) * BS + j % BS) * D;
                    memcpy(kd + (h * n + j) * D, kc + src, D * 4);
                    memcpy(vd + (h * n + j) * D, vc + src, D * 4);
                }
            for (int h = 0; h < HQ; h++)
                for (int i = 0; i < tq[b]; i++) {
                    const size_t tok = (size_t)cuq[b] + i;
                    memcpy(qd + ((size_t)h * tq[b] + i) * D, q + (tok * HQ + h) * D, D * 4);
                    memcpy(gd + ((size_t)h * tq[b] + i) * D, o + (tok * HQ + h) * D, D * 4);
                    gl[h * tq[b] + i] = lse[tok * HQ + h];
                }
            sdpa_problem pd = util_problem(1, HQ, HKV, tq[b], tk[b], D, D);
            pd.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
            const size_t no = (size_t)HQ * tq[b] * D, nl = (size_t)HQ * tq[b];
            double *ro = malloc(no * 8), *rl = malloc(nl * 8);
            float *n32 = malloc(no * 4), *nl32 = malloc(nl * 4);
            ref_forward(&pd, qd, kd, vd, ro, rl);
            naive32_forward(&pd, qd, kd, vd, n32, nl32);
            char what[120];
            snprintf(what, sizeof what, "[%s] paged %s sequence %d: O", sdpa_isa_name(isas[ii]), dtype_name(kvt), b);
            util_fa_expect(what, gd, n32, ro, no, 2.0);
            snprintf(what, sizeof what, "[%s] paged %s sequence %d: LSE", sdpa_isa_name(isas[ii]), dtype_name(kvt), b);
            util_fa_expect(what, gl, nl32, rl, nl, 2.0);
            free(kd), free(vd), free(qd), free(gd), free(gl), free(ro), free(rl), free(n32), free(nl32);
        }
        free(o), free(lse);
    }
    free(kc), free(vc), free(q), free(ks), free(vs);
}

Test(dtypes, paged_bf16)
{
    paged_case(SDPA_DTYPE_BF16);
}

Test(dtypes, paged_fp16)
{
    paged_case(SDPA_DTYPE_F16);
}

/* ------------------------------------------------------------ bad input -- */

/* An fp32 Q over a bf16 K/V cache on an ISA that runs the forward's bf16 pair products
 * (sdpa_isa_bf16_pairs), in problems with wide tiles: the problem rounds Q to bf16 in
 * every forward tile (its few-column tiles too: a query tail of 3 or 6 rows) and in the
 * backward (S recomputed, dK = dS^T Q), so the calls give the bits of the same calls
 * with Q rounded by the caller, O, LSE, dQ, dK and dV alike; before, the backward
 * recomputed P from the fp32 Q against an LSE of the rounded one (P summing to 1 +-
 * 1.7%). Skipped where no ISA runs the pair products. */
Test(dtypes, fp32_q_rounded_like_the_pair_products)
{
    static const shape cases[] = {
        {"1,1,1,40,40,16,16", 1, 1, 1, 40, 40, 16, 16, SDPA_CAUSAL_NONE, -1, 0, 0},
        {"1,2,2,70,70,48,48 causal", 1, 2, 2, 70, 70, 48, 48, SDPA_CAUSAL_TOP_LEFT, -1, 0, 0},
        {"2,4,2,67,133,64,40 lens", 2, 4, 2, 67, 133, 64, 40, SDPA_CAUSAL_NONE, -1, 1, 0},
        {"1,2,1,131,200,32,32 br window", 1, 2, 1, 131, 200, 32, 32, SDPA_CAUSAL_BOTTOM_RIGHT, 50, 0, 0},
    };
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    int ran = 0;
    const sdpa_dtype ty[3] = {SDPA_DTYPE_F32, SDPA_DTYPE_BF16, SDPA_DTYPE_F32};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const shape *s = &cases[c];
        const size_t nq = (size_t)(s->B * s->Hq * s->Tq * s->Dk), nk = (size_t)(s->B * s->Hkv * s->Tk * s->Dk),
                     nv = (size_t)(s->B * s->Hkv * s->Tk * s->Dv), no = (size_t)(s->B * s->Hq * s->Tq * s->Dv),
                     nl = (size_t)(s->B * s->Hq * s->Tq);
        util_rng r;
        util_rng_init(&r, 4100 + c);
        float *q = malloc(nq * 4), *qr = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4),
              *dout = malloc(no * 4);
        util_fill_normal(&r, q, nq, 1.5f); /* logits of a few units: P far from one-hot */
        util_fill_normal(&r, k, nk, 1.5f);
        util_fill_normal(&r, v, nv, 1.0f);
        util_fill_normal(&r, dout, no, 1.0f);
        for (size_t i = 0; i < nq; i++)
            qr[i] = round_to(SDPA_DTYPE_BF16, q[i]);
        void *ks = util_store_as(SDPA_DTYPE_BF16, k, nk, 0), *vs = util_store_as(SDPA_DTYPE_BF16, v, nv, 0);
        int32_t lens[2] = {(int32_t)s->Tk - 3, (int32_t)s->Tk / 2 + 1};
        const int32_t *lp = s->kv_lengths ? lens : NULL;
        for (int ii = 0; ii < nisa; ii++) {
            if (!util_rounds_q(isas[ii], ty[0], ty[1], s->Dk, s->Dv, s->Tq, s->Hq / s->Hkv))
                continue;
            ran++;
            float *out[2][6]; /* O, LSE, dQ, dK (fp32 copies), dV, for Q as given and rounded */
            for (int w = 0; w < 2; w++) {
                const float *qq = w ? qr : q;
                run_out fw = {malloc(no * 4), malloc(nl * 4)};
                cr_assert_eq(run_forward(s, ty, isas[ii], 1, qq, ks, vs, NULL, lp, &fw), SDPA_OK);
                sdpa_problem p = shape_problem(s, lp, NULL);
                p.q_dtype = ty[0], p.kv_dtype = ty[1], p.o_dtype = ty[2];
                p.isa = isas[ii];
                p.num_threads = 1;
                void *gk = util_store_as(SDPA_DTYPE_BF16, NULL, 0, nk), *gv = util_store_as(SDPA_DTYPE_BF16, NULL, 0, nv);
                float *gq = malloc(nq * 4);
                const sdpa_tensor tq = {qq, s->Hq * s->Tq * s->Dk, s->Tq * s->Dk, s->Dk},
                                  tk = {ks, s->Hkv * s->Tk * s->Dk, s->Tk * s->Dk, s->Dk},
                                  tv = {vs, s->Hkv * s->Tk * s->Dv, s->Tk * s->Dv, s->Dv},
                                  to = {fw.o, s->Hq * s->Tq * s->Dv, s->Tq * s->Dv, s->Dv},
                                  tl = {fw.lse, s->Hq * s->Tq, s->Tq, 1},
                                  tdo = {dout, s->Hq * s->Tq * s->Dv, s->Tq * s->Dv, s->Dv};
                const sdpa_tensor_out tdq = {gq, tq.batch_stride, tq.head_stride, tq.seq_stride},
                                      tdk = {gk, tk.batch_stride, tk.head_stride, tk.seq_stride},
                                      tdv = {gv, tv.batch_stride, tv.head_stride, tv.seq_stride};
                cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv), SDPA_OK);
                out[w][0] = fw.o, out[w][1] = fw.lse, out[w][2] = gq;
                out[w][3] = malloc(nk * 4), out[w][4] = malloc(nv * 4), out[w][5] = NULL;
                for (size_t i = 0; i < nk; i++)
                    out[w][3][i] = util_load_as(SDPA_DTYPE_BF16, gk, i);
                for (size_t i = 0; i < nv; i++)
                    out[w][4][i] = util_load_as(SDPA_DTYPE_BF16, gv, i);
                free(gk), free(gv);
            }
            const size_t n[5] = {no, nl, nq, nk, nv};
            static const char *names[5] = {"O", "LSE", "dQ", "dK", "dV"};
            for (int x = 0; x < 5; x++) {
                size_t first = n[x];
                for (size_t i = 0; i < n[x] && first == n[x]; i++)
                    if (memcmp(&out[0][x][i], &out[1][x][i], 4) != 0)
                        first = i;
                cr_expect(first == n[x], "[%s] %s: %s[%zu] %.9g, with Q rounded by the caller %.9g",
                          sdpa_isa_name(isas[ii]), s->name, names[x], first,
                          first < n[x] ? (double)out[0][x][first] : 0.0,
                          first < n[x] ? (double)out[1][x][first] : 0.0);
            }
            for (int w = 0; w < 2; w++)
                for (int x = 0; x < 5; x++)
                    free(out[w][x]);
        }
        free(q), free(qr), free(k), free(v), free(dout), free(ks), free(vs);
    }
    if (!ran)
        cr_skip_test("no ISA here runs the bf16 pair products (%s)", sdpa_cpu_features());
}

Test(dtypes, bad_types_write_nothing)
{
    const shape *s = &shapes[1];
    const size_t nq = (size_t)(s->B * s->Hq * s->Tq * s->Dk), nk = (size_t)(s->B * s->Hkv * s->Tk * s->Dk),
                 nv = (size_t)(s->B * s->Hkv * s->Tk * s->Dv), no = (size_t)(s->B * s->Hq * s->Tq * s->Dv),
                 nl = (size_t)(s->B * s->Hq * s->Tq);
    float *x = calloc(nk + nq + nv + no, 4);
    void *q = util_store_as(SDPA_DTYPE_BF16, x, nq, 0), *k = util_store_as(SDPA_DTYPE_BF16, x, nk, 0),
         *v = util_store_as(SDPA_DTYPE_BF16, x, nv, 0);
    run_out out = {util_store_as(SDPA_DTYPE_BF16, x, 0, no), malloc(nl * 4)};
    memset(out.lse, 0xA5, nl * 4);
    const sdpa_dtype bad[3][3] = {{(sdpa_dtype)3, SDPA_DTYPE_F32, SDPA_DTYPE_F32},
                                  {SDPA_DTYPE_F32, (sdpa_dtype)-1, SDPA_DTYPE_F32},
                                  {SDPA_DTYPE_F32, SDPA_DTYPE_F32, (sdpa_dtype)7}};
    for (int i = 0; i < 3; i++)
        cr_expect_eq(run_forward(s, bad[i], SDPA_ISA_AUTO, 1, q, k, v, NULL, NULL, &out), SDPA_ERR_BAD_DESCRIPTOR,
                     "unknown type %d", i);
    cr_expect(util_guard_intact(out.o, 0, no * 2) && util_guard_intact(out.lse, 0, nl * 4), "written on error");
    free(x), free(q), free(k), free(v), free(out.o), free(out.lse);
}

/* Every row's softmax one-hot (a window of one key: query i sees key i alone), bf16 Q,
 * K, V, O and dO, on every ISA: P = 1, so dS = P (dP - D) = 0 and dQ, dK must be exactly
 * zero (the fp32 backward and float64 give 0: D = rowsum(dO * O) with O = V_i cancels
 * dP_ii), and dV_i = dO_i. On the backward's bf16 pair products dP is a pair sum, so D
 * must be the same pair sum for the residue to cancel (until session 22 it was an fp32
 * sum and left about 2^-24 |dP| in dQ and dK). Wide tiles (Tq well above nt_max_cols)
 * and a decode-sized call alike; D even. Not on amx, whose D stays the fp32 sum (one
 * tile product per row: its cost unmeasured without a CPU with AMX; docs/design.md). */
Test(dtypes, one_hot_rows_give_zero_dq_dk)
{
    static const int64_t shapes[][4] = {{1, 2, 96, 32}, {2, 1, 37, 64}, {1, 4, 1, 16}}; /* B, H, T, D */
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int64_t B = shapes[c][0], H = shapes[c][1], T = shapes[c][2], D = shapes[c][3];
        const size_t n = (size_t)(B * H * T * D), nl = (size_t)(B * H * T);
        util_rng r;
        util_rng_init(&r, 5200 + c);
        float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *dout = malloc(n * 4),
              *lse = malloc(nl * 4);
        util_fill_normal(&r, q, n, 1.0f);
        util_fill_normal(&r, k, n, 1.0f);
        util_fill_normal(&r, v, n, 3.0f);
        util_fill_normal(&r, dout, n, 7.0f);
        void *qs = util_store_as(SDPA_DTYPE_BF16, q, n, 0), *ks = util_store_as(SDPA_DTYPE_BF16, k, n, 0),
             *vs = util_store_as(SDPA_DTYPE_BF16, v, n, 0), *ds = util_store_as(SDPA_DTYPE_BF16, dout, n, 0),
             *os = util_store_as(SDPA_DTYPE_BF16, v, n, 0), *g[3];
        for (int i = 0; i < 3; i++)
            g[i] = util_store_as(SDPA_DTYPE_BF16, v, n, 0); /* overwritten */
        for (int ii = 0; ii < nisa; ii++) {
            if (isas[ii] == SDPA_ISA_AMX)
                continue;
            sdpa_problem p;
            sdpa_problem_init(&p);
            p.batch = B, p.q_heads = p.kv_heads = H, p.q_len = p.kv_len = T, p.head_dim_qk = p.head_dim_v = D;
            p.window_left = p.window_right = 0;
            p.q_dtype = p.kv_dtype = p.o_dtype = SDPA_DTYPE_BF16;
            p.isa = isas[ii];
            p.num_threads = 2;
            const sdpa_tensor tq = {qs, H * T * D, T * D, D}, tk = {ks, H * T * D, T * D, D},
                              tv = {vs, H * T * D, T * D, D}, tdo = {ds, H * T * D, T * D, D},
                              tl = {lse, H * T, T, 1};
            const sdpa_tensor_out to = {os, H * T * D, T * D, D}, tlo = {lse, H * T, T, 1},
                                  gq = {g[0], H * T * D, T * D, D}, gk = {g[1], H * T * D, T * D, D},
                                  gv = {g[2], H * T * D, T * D, D};
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tlo), SDPA_OK);
            for (size_t e = 0; e < n; e++) /* O = V: P is one-hot */
                cr_assert_eq(util_load_as(SDPA_DTYPE_BF16, os, e), util_load_as(SDPA_DTYPE_BF16, vs, e), "[%s] O[%zu]",
                             sdpa_isa_name(isas[ii]), e);
            const sdpa_tensor to_in = {os, H * T * D, T * D, D};
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &to_in, &tl, &tdo, &gq, &gk, &gv), SDPA_OK);
            for (size_t e = 0; e < n; e++) {
                cr_assert_eq(util_load_as(SDPA_DTYPE_BF16, g[0], e), 0.0f, "[%s] %s: dQ[%zu] = %g", sdpa_isa_name(isas[ii]),
                             sdpa_tuning(), e, (double)util_load_as(SDPA_DTYPE_BF16, g[0], e));
                cr_assert_eq(util_load_as(SDPA_DTYPE_BF16, g[1], e), 0.0f, "[%s] dK[%zu] = %g", sdpa_isa_name(isas[ii]), e,
                             (double)util_load_as(SDPA_DTYPE_BF16, g[1], e));
                cr_assert_eq(util_load_as(SDPA_DTYPE_BF16, g[2], e), util_load_as(SDPA_DTYPE_BF16, ds, e), "[%s] dV[%zu]",
                             sdpa_isa_name(isas[ii]), e);
            }
        }
        free(q), free(k), free(v), free(dout), free(lse), free(qs), free(ks), free(vs), free(ds), free(os);
        for (int i = 0; i < 3; i++)
            free(g[i]);
    }
}

/* SDPA_FPMATH_STRICT (sdpa_problem.fpmath_mode): nothing is rounded to bf16, so a
 * forward over 16-bit tensors gives the bits of the fp32 call on their widened values
 * (O narrowed to its type at the end), on every ISA, where the default runs the bf16
 * pair products (an fp32 Q over a bf16 cache just past decode size: an integrator's
 * 5-token chunk at G = 4 lost three decimal digits, with no per-call way out) or, in
 * decode, AVX-512's vdpbf16ps scores of a bf16 Q (bf16 subnormals read as 0; the
 * review's reproducer: LSE 4.904 against 4.981). The backward of the prefill cases
 * likewise: dQ, dK, dV those of the fp32 backward on the widened values (a decode-sized
 * 16-bit backward sums dQ in another order: not compared bit for bit). */
Test(dtypes, strict_fpmath_rounds_nothing)
{
    static const struct {
        shape s;
        sdpa_dtype ty[3];
        int bwd_bits; /* the backward too (not decode-sized: those sum dQ in another order) */
    } cases[] = {
        {{"chunk 1,8,2,5,100,128,128 causal br", 1, 8, 2, 5, 100, 128, 128, SDPA_CAUSAL_BOTTOM_RIGHT, -1, 0, 0},
         {SDPA_DTYPE_F32, SDPA_DTYPE_BF16, SDPA_DTYPE_F32}, 1},
        {{"prefill 2,4,2,67,133,64,40 lens", 2, 4, 2, 67, 133, 64, 40, SDPA_CAUSAL_NONE, -1, 1, 0},
         {SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16}, 1},
        {{"prefill 1,2,2,124,301,18,130 causal br", 1, 2, 2, 124, 301, 18, 130, SDPA_CAUSAL_BOTTOM_RIGHT, -1, 0, 0},
         {SDPA_DTYPE_F32, SDPA_DTYPE_BF16, SDPA_DTYPE_F32}, 1},
        {{"prefill 1,2,1,70,70,48,48 fp16", 1, 2, 1, 70, 70, 48, 48, SDPA_CAUSAL_TOP_LEFT, -1, 0, 0},
         {SDPA_DTYPE_F16, SDPA_DTYPE_F16, SDPA_DTYPE_F16}, 1},
        /* decode of a bf16 Q over bf16 K/V (head_dim a multiple of 32: AVX-512's vdpbf16ps
           scores by default, which read bf16 subnormals as 0; q[0] is one here), and the
           last few-row tile of a prefill */
        {{"decode 1,4,1,1,40,64,64 bf16", 1, 4, 1, 1, 40, 64, 64, SDPA_CAUSAL_NONE, -1, 0, 0},
         {SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_F32}, 0},
        {{"prefill tail 1,2,1,130,130,64,64 bf16", 1, 2, 1, 130, 130, 64, 64, SDPA_CAUSAL_TOP_LEFT, -1, 0, 0},
         {SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_F32}, 1},
    };
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas_typed(isas);
    int differs_by_default = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const shape *s = &cases[c].s;
        const sdpa_dtype *ty = cases[c].ty;
        const size_t nq = (size_t)(s->B * s->Hq * s->Tq * s->Dk), nk = (size_t)(s->B * s->Hkv * s->Tk * s->Dk),
                     nv = (size_t)(s->B * s->Hkv * s->Tk * s->Dv), no = (size_t)(s->B * s->Hq * s->Tq * s->Dv),
                     nl = (size_t)(s->B * s->Hq * s->Tq);
        util_rng r;
        util_rng_init(&r, 5200 + c);
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4), *dout = malloc(no * 4);
        util_fill_normal(&r, q, nq, 1.5f);
        util_fill_normal(&r, k, nk, 1.5f);
        util_fill_normal(&r, v, nv, 1.0f);
        util_fill_normal(&r, dout, no, 1.0f);
        if (s->Tq == 1) { /* a bf16 subnormal in Q against huge keys: flushed, it moves the LSE */
            q[0] = 5e-39f;
            for (int64_t j = 0; j < s->Tk; j++)
                k[j * s->Dk] = j % 2 ? 1e38f : -1e38f;
        }
        round_all(ty[0], q, nq);
        round_all(ty[1], k, nk);
        round_all(ty[1], v, nv);
        round_all(ty[2], dout, no);
        void *qs = util_store_as(ty[0], q, nq, 0), *ks = util_store_as(ty[1], k, nk, 0), *vs = util_store_as(ty[1], v, nv, 0),
             *dos = util_store_as(ty[2], dout, no, 0);
        int32_t lens[2] = {(int32_t)s->Tk - 3, (int32_t)s->Tk / 2 + 1};
        const int32_t *lp = s->kv_lengths ? lens : NULL;
        const sdpa_tensor tq = {qs, s->Hq * s->Tq * s->Dk, s->Tq * s->Dk, s->Dk},
                          tk = {ks, s->Hkv * s->Tk * s->Dk, s->Tk * s->Dk, s->Dk},
                          tv = {vs, s->Hkv * s->Tk * s->Dv, s->Tk * s->Dv, s->Dv},
                          tdo = {dos, tq.batch_stride / s->Dk * s->Dv, s->Tq * s->Dv, s->Dv};
        const sdpa_tensor fq = {q, tq.batch_stride, tq.head_stride, tq.seq_stride},
                          fk = {k, tk.batch_stride, tk.head_stride, tk.seq_stride},
                          fv = {v, tv.batch_stride, tv.head_stride, tv.seq_stride},
                          fdo = {dout, tdo.batch_stride, tdo.head_stride, tdo.seq_stride};
        for (int ii = 0; ii < nisa; ii++) {
            /* the fp32 call on the widened values: O, LSE, dQ, dK, dV */
            sdpa_problem p = shape_problem(s, lp, NULL);
            p.isa = isas[ii];
            p.num_threads = 1;
            float *f[5] = {malloc(no * 4), malloc(nl * 4), malloc(nq * 4), malloc(nk * 4), malloc(nv * 4)};
            const sdpa_tensor_out fo = {f[0], tdo.batch_stride, tdo.head_stride, tdo.seq_stride},
                                  fl = {f[1], s->Hq * s->Tq, s->Tq, 1},
                                  fdq = {f[2], tq.batch_stride, tq.head_stride, tq.seq_stride},
                                  fdk = {f[3], tk.batch_stride, tk.head_stride, tk.seq_stride},
                                  fdv = {f[4], tv.batch_stride, tv.head_stride, tv.seq_stride};
            cr_assert_eq(sdpa_forward(&p, &fq, &fk, &fv, &fo, &fl), SDPA_OK);
            float *orr = malloc(no * 4); /* O as the typed backward reads it: stored in its type */
            for (size_t i = 0; i < no; i++)
                orr[i] = round_to(ty[2], f[0][i]);
            const sdpa_tensor fot = {orr, fo.batch_stride, fo.head_stride, fo.seq_stride},
                              flt = {f[1], fl.batch_stride, fl.head_stride, fl.seq_stride};
            cr_assert_eq(sdpa_backward(&p, &fq, &fk, &fv, &fot, &flt, &fdo, &fdq, &fdk, &fdv), SDPA_OK);
            /* the typed calls, strict and default */
            for (int strict = 1; strict >= 0; strict--) {
                p.q_dtype = ty[0], p.kv_dtype = ty[1], p.o_dtype = ty[2];
                p.fpmath_mode = strict ? SDPA_FPMATH_STRICT : SDPA_FPMATH_DEFAULT;
                void *o = util_store_as(ty[2], NULL, 0, no), *gq = util_store_as(ty[0], NULL, 0, nq),
                     *gk = util_store_as(ty[1], NULL, 0, nk), *gv = util_store_as(ty[1], NULL, 0, nv);
                float *lse = malloc(nl * 4);
                const sdpa_tensor_out to = {o, fo.batch_stride, fo.head_stride, fo.seq_stride},
                                      tl = {lse, fl.batch_stride, fl.head_stride, fl.seq_stride},
                                      tdq = {gq, fdq.batch_stride, fdq.head_stride, fdq.seq_stride},
                                      tdk = {gk, fdk.batch_stride, fdk.head_stride, fdk.seq_stride},
                                      tdv = {gv, fdv.batch_stride, fdv.head_stride, fdv.seq_stride};
                cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
                const sdpa_tensor tot = {o, to.batch_stride, to.head_stride, to.seq_stride},
                                  tlt = {lse, tl.batch_stride, tl.head_stride, tl.seq_stride};
                cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &tot, &tlt, &tdo, &tdq, &tdk, &tdv), SDPA_OK);
                const void *got[5] = {o, lse, gq, gk, gv};
                const sdpa_dtype gt[5] = {ty[2], SDPA_DTYPE_F32, ty[0], ty[1], ty[1]};
                const size_t n[5] = {no, nl, nq, nk, nv};
                static const char *names[5] = {"O", "LSE", "dQ", "dK", "dV"};
                int same = 1;
                for (int x = 0; x < (cases[c].bwd_bits ? 5 : 2); x++) {
                    size_t first = n[x];
                    for (size_t i = 0; i < n[x] && first == n[x]; i++) {
                        const float want = round_to(gt[x], f[x][i]), have = util_load_as(gt[x], got[x], i);
                        if (memcmp(&want, &have, 4) != 0)
                            first = i;
                    }
                    same = same && first == n[x];
                    if (strict)
                        cr_expect(first == n[x], "[%s] %s strict: %s[%zu] %.9g, the fp32 call on the widened "
                                  "values %.9g", sdpa_isa_name(isas[ii]), s->name, names[x], first,
                                  first < n[x] ? (double)util_load_as(gt[x], got[x], first) : 0.0,
                                  first < n[x] ? (double)round_to(gt[x], f[x][first]) : 0.0);
                }
                if (!strict && util_rounds_p(isas[ii], ty[0], ty[1], s->Dk, s->Dv) && s->Tq > 4)
                    differs_by_default += !same;
                free(o), free(gq), free(gk), free(gv), free(lse);
            }
            for (int x = 0; x < 5; x++)
                free(f[x]);
            free(orr);
        }
        free(q), free(k), free(v), free(dout), free(qs), free(ks), free(vs), free(dos);
    }
    if (util_rounds_p(SDPA_ISA_AUTO, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, 64, 40))
        cr_expect(differs_by_default > 0, "the default never differed from the strict call on an ISA that rounds "
                                          "(the test would not see a strict mode that does nothing)");
}
