/* SPDX-License-Identifier: MIT */
/* tests/conformance.c - end-to-end conformance of every ISA against the float64 reference.
 *
 * Plain C (no Criterion), so that it also runs in the aarch64 cross build under
 * qemu. For every ISA compiled in and supported, it runs forward and backward
 * over a sweep of shapes that cross every vector and tile tail, with every mask
 * kind (causal both alignments, sliding windows, key lengths, boolean masks,
 * additive bias with -inf, broadcasting), GQA, Tq != Tk, Dk != Dv and tile sizes
 * forced small, and checks O, LSE, dQ, dK, dV with the FlashAttention rule: the
 * error against float64 must be at most 2x (forward) / 3x (backward) the error of
 * a naive fp32 implementation, plus a small absolute slack. Guard zones around
 * every output must stay intact. Then, for every ISA, every edge case of
 * tests/data/edge_cases.json (EC-01 .. EC-13 with their tile, layout and thread
 * variants, see ec_cases.h); each of their checks counts. Then, for every ISA,
 * bf16 / fp16 storage (docs/design.md, "Reduced precision"): forward and backward
 * of every (Q, K/V, O) type combination over four shapes with tails (decode GQA,
 * a short prefill with odd head_dims, a causal prefill, ragged kv_lengths with an
 * empty sequence) by the rule of tests/test_dtypes.c (see run_dtype_case). Ends
 * with "N passed, N failed".
 *
 *   conformance [edge_cases.json]   (default: SDPA_TEST_DATA_DIR/edge_cases.json)
 *
 * SDPA_TEST_REDUCED=1 runs a smaller random sweep (emulation) and 7 of the 27 type
 * combinations (dtype_reduced); the edge cases always run in full. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/dtype.h"
#include "ec_cases.h"
#include "ref.h"
#include "sdpa.h"
#include "util.h"

#ifndef SDPA_TEST_DATA_DIR
#define SDPA_TEST_DATA_DIR "tests/data"
#endif

#define GUARD 64
static const float CANARY = 12345.678f;

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); }
static int rng_int(int n) { return n > 0 ? (int)(rng_unit() * n) : 0; }

/* A float buffer with canaries on both sides. */
static float *guarded(size_t n)
{
    float *b = malloc(sizeof(float) * (n + 2 * GUARD));
    if (!b) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < n + 2 * GUARD; i++)
        b[i] = CANARY;
    return b + GUARD;
}
static int guard_ok(const float *p, size_t n)
{
    for (size_t i = 0; i < GUARD; i++)
        if (memcmp(&p[-1 - (ptrdiff_t)i], &CANARY, 4) || memcmp(&p[n + i], &CANARY, 4))
            return 0;
    return 1;
}
static void guarded_free(float *p) { free(p - GUARD); }

/* max |x - ref| over n entries; infinities must match exactly; NaN in x when ref is
 * finite counts as infinite error. */
static double max_err(const float *x, const double *ref, size_t n)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i])) {
            if ((double)x[i] != ref[i])
                return INFINITY;
            continue;
        }
        double d = fabs((double)x[i] - ref[i]);
        if (!(d <= e))
            e = isnan(d) ? INFINITY : d;
    }
    return e;
}
static int passed, failed;

static void check(int ok, const char *isa, const char *what, const char *desc, double err, double bound)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL [%s] %s: %s (err %.3g > bound %.3g)\n", isa, what, desc, err, bound);
}

/* Edge-case checks count like the others; failures and notes are printed. */
static void ec_report(void *ctx, ec_event ev, const char *msg)
{
    const char *isa = sdpa_isa_name(*(const sdpa_isa *)ctx);
    if (ev == EC_PASS)
        passed++;
    else if (ev == EC_FAIL) {
        failed++;
        printf("FAIL [%s] edge case: %s\n", isa, msg);
    } else {
        printf("note [%s] edge case: %s\n", isa, msg);
    }
}

typedef struct shape {
    int B, Hq, Hkv, Tq, Tk, Dk, Dv;
} shape;

/* The attention variants of a case: 0 none, 1 softcap, 2 ALiBi, 3 sinks (one -inf;
 * the backward also checks dsinks), 4 all three. */
static void set_variant(sdpa_problem *p, int variant, float *slopes, float *sinks, float *dsinks)
{
    for (int64_t h = 0; h < p->q_heads; h++) {
        slopes[h] = ldexpf(1.0f, -(int)(h % 8) - 1);
        sinks[h] = h % 3 == 2 ? -INFINITY : (float)(rng_unit() * 4 - 2);
    }
    if (variant == 1 || variant == 4)
        p->softcap = 2.5f;
    if (variant == 2 || variant == 4)
        p->alibi_slopes = slopes;
    if (variant == 3 || variant == 4) {
        p->sinks = sinks;
        p->dsinks = dsinks;
    }
}

static void run_case_v(sdpa_isa isa, const shape *s, int mask_kind, int threads, int blocks, int backward,
                       int variant)
{
    sdpa_problem p = util_problem(s->B, s->Hq, s->Hkv, s->Tq, s->Tk, s->Dk, s->Dv);
    float slopes[64], sinks[64], dsinks[64] = {0};
    set_variant(&p, variant, slopes, sinks, dsinks);
    p.isa = isa;
    p.num_threads = threads;
    if (blocks) {
        p.block_q = blocks;
        p.block_k = blocks + 3;
    }
    int32_t kvl[8];
    uint8_t *mask = NULL;
    float *bias = NULL;
    const size_t TqTk = (size_t)s->Tq * s->Tk;
    switch (mask_kind) {
    case 0: break;
    case 1: p.causal = SDPA_CAUSAL_TOP_LEFT; break;
    case 2: p.causal = SDPA_CAUSAL_BOTTOM_RIGHT; break;
    case 3: p.causal = SDPA_CAUSAL_TOP_LEFT; p.window_left = 5; break;
    case 4: p.window_left = 7; p.window_right = 3; p.window_alignment = SDPA_ALIGN_BOTTOM_RIGHT; break;
    case 5:
        for (int b = 0; b < s->B; b++)
            kvl[b] = rng_int(s->Tk + 1);
        p.kv_lengths = kvl;
        p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        break;
    case 6: /* boolean mask [B,1,Tq,Tk] */
        mask = malloc((size_t)s->B * TqTk + 1);
        for (size_t i = 0; i < (size_t)s->B * TqTk; i++)
            mask[i] = rng_int(5) != 0;
        p.bool_mask.data = mask;
        p.bool_mask.batch_stride = (int64_t)TqTk;
        p.bool_mask.query_stride = s->Tk;
        p.bool_mask.key_stride = 1;
        break;
    case 7: /* additive bias [1,1,Tq,Tk] with -inf and large negative entries, plus key padding mask [1,1,1,Tk] */
        bias = malloc(sizeof(float) * (TqTk + 1));
        for (size_t i = 0; i < TqTk; i++)
            bias[i] = rng_int(6) == 0 ? -INFINITY : rng_int(9) == 0 ? -1e30f : (float)(rng_unit() * 4 - 2);
        p.bias.data = bias;
        p.bias.query_stride = s->Tk;
        p.bias.key_stride = 1;
        mask = malloc((size_t)s->Tk + 1);
        for (int j = 0; j < s->Tk; j++)
            mask[j] = rng_int(7) != 0;
        p.bool_mask.data = mask;
        p.bool_mask.key_stride = 1;
        break;
    }
    const size_t nq = (size_t)s->B * s->Hq * s->Tq * s->Dk, nk = (size_t)s->B * s->Hkv * s->Tk * s->Dk;
    const size_t nv = (size_t)s->B * s->Hkv * s->Tk * s->Dv, no = (size_t)s->B * s->Hq * s->Tq * s->Dv;
    const size_t nl = (size_t)s->B * s->Hq * s->Tq;
    float *q = guarded(nq), *k = guarded(nk), *v = guarded(nv), *dout = guarded(no);
    float *o = guarded(no), *lse = guarded(nl), *dq = guarded(nq), *dk = guarded(nk), *dv = guarded(nv);
    for (size_t i = 0; i < nq; i++) q[i] = (float)(rng_unit() * 4 - 2);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(rng_unit() * 4 - 2);
    for (size_t i = 0; i < nv; i++) v[i] = (float)(rng_unit() * 2 - 1);
    for (size_t i = 0; i < no; i++) dout[i] = (float)(rng_unit() * 2 - 1);

    const sdpa_tensor tq = {q, (int64_t)s->Hq * s->Tq * s->Dk, (int64_t)s->Tq * s->Dk, s->Dk};
    const sdpa_tensor tk = {k, (int64_t)s->Hkv * s->Tk * s->Dk, (int64_t)s->Tk * s->Dk, s->Dk};
    const sdpa_tensor tv = {v, (int64_t)s->Hkv * s->Tk * s->Dv, (int64_t)s->Tk * s->Dv, s->Dv};
    const sdpa_tensor_out to = {o, (int64_t)s->Hq * s->Tq * s->Dv, (int64_t)s->Tq * s->Dv, s->Dv};
    const sdpa_tensor_out tl = {lse, (int64_t)s->Hq * s->Tq, s->Tq, 1};
    char desc[256];
    snprintf(desc, sizeof desc, "B=%d Hq=%d Hkv=%d Tq=%d Tk=%d Dk=%d Dv=%d mask=%d threads=%d blocks=%d variant=%d",
             s->B, s->Hq, s->Hkv, s->Tq, s->Tk, s->Dk, s->Dv, mask_kind, threads, blocks, variant);
    const char *name = sdpa_isa_name(isa);

    sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
    check(st == SDPA_OK, name, "forward status", desc, st, 0);
    double *ro = malloc(sizeof(double) * (no + 1)), *rl = malloc(sizeof(double) * (nl + 1));
    float *no32 = malloc(sizeof(float) * (no + 1)), *nl32 = malloc(sizeof(float) * (nl + 1));
    ref_forward(&p, q, k, v, ro, rl);
    naive32_forward(&p, q, k, v, no32, nl32);
    {
        const double slack = 1e-6 * (1.0 + util_max_abs_finite(ro, no));
        const double bound = 2.0 * max_err(no32, ro, no) + slack;
        const double e = max_err(o, ro, no);
        check(e <= bound, name, "forward O", desc, e, bound);
        const double lslack = 1e-6 * (1.0 + util_max_abs_finite(rl, nl));
        const double lbound = 2.0 * max_err(nl32, rl, nl) + lslack;
        const double le = max_err(lse, rl, nl);
        check(le <= lbound, name, "forward LSE", desc, le, lbound);
        check(guard_ok(o, no) && guard_ok(lse, nl), name, "forward guard zones", desc, 0, 0);
    }
    if (backward) {
        const sdpa_tensor tO = {o, to.batch_stride, to.head_stride, to.seq_stride};
        const sdpa_tensor tL = {lse, tl.batch_stride, tl.head_stride, tl.seq_stride};
        const sdpa_tensor tdo = {dout, to.batch_stride, to.head_stride, to.seq_stride};
        const sdpa_tensor_out tdq = {dq, tq.batch_stride, tq.head_stride, tq.seq_stride};
        const sdpa_tensor_out tdk = {dk, tk.batch_stride, tk.head_stride, tk.seq_stride};
        const sdpa_tensor_out tdv = {dv, tv.batch_stride, tv.head_stride, tv.seq_stride};
        st = sdpa_backward(&p, &tq, &tk, &tv, &tO, &tL, &tdo, &tdq, &tdk, &tdv);
        check(st == SDPA_OK, name, "backward status", desc, st, 0);
        double *rq = malloc(sizeof(double) * (nq + 1)), *rk = malloc(sizeof(double) * (nk + 1)),
               *rv = malloc(sizeof(double) * (nv + 1));
        float *n32q = malloc(sizeof(float) * (nq + 1)), *n32k = malloc(sizeof(float) * (nk + 1)),
              *n32v = malloc(sizeof(float) * (nv + 1));
        double rds[64];
        float nds[64];
        ref_backward_dsinks(&p, q, k, v, dout, rq, rk, rv, rds);
        naive32_backward_dsinks(&p, q, k, v, dout, n32q, n32k, n32v, nds);
        if (p.dsinks) {
            const double slack = 1e-5 * (1.0 + util_max_abs_finite(rds, (size_t)s->Hq));
            const double bound = 3.0 * max_err(nds, rds, (size_t)s->Hq) + slack;
            const double e = max_err(dsinks, rds, (size_t)s->Hq);
            check(e <= bound, name, "backward dsinks", desc, e, bound);
        }
        const struct {
            const char *what;
            const float *x, *naive;
            const double *ref;
            size_t n;
        } g[3] = {{"backward dQ", dq, n32q, rq, nq}, {"backward dK", dk, n32k, rk, nk}, {"backward dV", dv, n32v, rv, nv}};
        for (int i = 0; i < 3; i++) {
            const double slack = 1e-5 * (1.0 + util_max_abs_finite(g[i].ref, g[i].n));
            const double bound = 3.0 * max_err(g[i].naive, g[i].ref, g[i].n) + slack;
            const double e = max_err(g[i].x, g[i].ref, g[i].n);
            check(e <= bound, name, g[i].what, desc, e, bound);
        }
        check(guard_ok(dq, nq) && guard_ok(dk, nk) && guard_ok(dv, nv), name, "backward guard zones", desc, 0, 0);
        free(rq); free(rk); free(rv); free(n32q); free(n32k); free(n32v);
    }
    free(ro); free(rl); free(no32); free(nl32);
    guarded_free(q); guarded_free(k); guarded_free(v); guarded_free(dout);
    guarded_free(o); guarded_free(lse); guarded_free(dq); guarded_free(dk); guarded_free(dv);
    free(mask);
    free(bias);
}

static void run_case(sdpa_isa isa, const shape *s, int mask_kind, int threads, int blocks, int backward)
{
    run_case_v(isa, s, mask_kind, threads, blocks, backward, 0);
}

/* ------------------------------------------------ bf16 / fp16 storage -- */

static const char *dtype_name(sdpa_dtype t)
{
    return t == SDPA_DTYPE_F32 ? "fp32" : t == SDPA_DTYPE_BF16 ? "bf16" : "fp16";
}
static size_t dtype_size(sdpa_dtype t) { return t == SDPA_DTYPE_F32 ? 4 : 2; }

/* x rounded to type t and back (src/dtype.h's conversions). */
static float round_to(sdpa_dtype t, float x)
{
    return t == SDPA_DTYPE_F32 ? x : t == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(sdpa_f32_to_bf16(x))
                                                          : sdpa_f16_to_f32(sdpa_f32_to_f16(x));
}

/* n values of x stored as type t, followed by `guard` elements of 0xA5 bytes (x may be
 * NULL with n = 0: an output buffer that is all guard bytes until written). */
static void *store_as(sdpa_dtype t, const float *x, size_t n, size_t guard)
{
    unsigned char *b = malloc((n + guard) * dtype_size(t) + 1);
    if (!b) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(b, 0xA5, (n + guard) * dtype_size(t));
    for (size_t i = 0; i < n; i++) {
        if (t == SDPA_DTYPE_F32) {
            memcpy(b + 4 * i, &x[i], 4);
        } else {
            const uint16_t h = t == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(x[i]) : sdpa_f32_to_f16(x[i]);
            memcpy(b + 2 * i, &h, 2);
        }
    }
    return b;
}

/* n elements of a buffer of type t, widened into x. */
static void load_as(sdpa_dtype t, const void *buf, size_t n, float *x)
{
    for (size_t i = 0; i < n; i++) {
        if (t == SDPA_DTYPE_F32) {
            memcpy(&x[i], (const char *)buf + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)buf + 2 * i, 2);
            x[i] = t == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(h) : sdpa_f16_to_f32(h);
        }
    }
}

static int bytes_are_a5(const void *buf, size_t from, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)buf)[from + i] != 0xA5)
            return 0;
    return 1;
}

/* The rule of tests/test_dtypes.c (util_fa_compare_slack there): every non-finite
 * reference entry matched exactly (NaN by NaN), no non-finite result where the
 * reference is finite, and max |got - ref| <= factor * max |naive - ref| (over the
 * naive's finite entries) + 1e-6 max |ref| + 1e-7. */
static void fa_check(const char *isa, const char *what, const char *desc, const float *got, const float *naive,
                     const double *ref, size_t n, double factor)
{
    double err = 0.0, nerr = 0.0, rmax = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double r = ref[i], g = got[i];
        if (isnan(r) || isinf(r)) {
            bad += isnan(r) ? !isnan(g) : g != r;
            continue;
        }
        if (!isfinite(g)) {
            bad++;
            continue;
        }
        err = fmax(err, fabs(g - r));
        rmax = fmax(rmax, fabs(r));
        if (isfinite(naive[i]))
            nerr = fmax(nerr, fabs((double)naive[i] - r));
    }
    const double bound = factor * nerr + 1e-6 * rmax + 1e-7;
    check(bad == 0 && err <= bound, isa, what, desc, bad ? INFINITY : err, bound);
}

typedef struct dtype_shape {
    int B, Hq, Hkv, Tq, Tk, Dk, Dv;
    sdpa_causal causal;
    int kv_lengths; /* ragged key lengths: Tk - 3, 0 (an empty sequence), Tk / 2 + 1, ... */
} dtype_shape;

/* Four shapes with tails: decode GQA (the typed attend_rows path where an ISA has
 * one), a short prefill with odd head_dims and Dk != Dv (vector tails, widened key
 * runs), a causal prefill across tile edges, ragged bottom-right causal kv_lengths
 * with an empty sequence (O = 0, LSE = -inf, no gradient). */
static const dtype_shape dtype_shapes[] = {
    {1, 8, 2, 1, 300, 128, 128, SDPA_CAUSAL_NONE, 0},
    {1, 2, 1, 13, 45, 67, 33, SDPA_CAUSAL_NONE, 0},
    {1, 2, 2, 70, 70, 48, 48, SDPA_CAUSAL_TOP_LEFT, 0},
    {3, 4, 2, 6, 131, 40, 24, SDPA_CAUSAL_BOTTOM_RIGHT, 1},
    {1, 1, 1, 40, 40, 16, 16, SDPA_CAUSAL_NONE, 0},
};

/* Type combinations as (q, kv, o) digits of sdpa_dtype. SDPA_TEST_REDUCED runs the
 * three uniform ones plus four mixed ones that between them put bf16 and fp16 in
 * every role next to another type: fp32 activations over a bf16 KV cache; fp32 Q,
 * fp16 KV, bf16 O; fp16 Q and KV with an fp32 O; bf16 Q, fp32 KV, fp16 O. */
static const int dtype_reduced[][3] = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {0, 1, 0}, {0, 2, 1}, {2, 2, 0}, {1, 0, 2}};

/* Forward and backward of shape s stored as ty = {q, kv, o} on isa, by the rule of
 * tests/test_dtypes.c and docs/design.md: inputs drawn in fp32 and rounded to
 * their types; against float64 on the rounded inputs, O (read back from its type)
 * and LSE within 2x the error of the naive fp32 forward on the same rounded inputs
 * with its O rounded to O's type; then the backward from the library's stored O and
 * LSE, dO rounded to O's type: dQ, dK, dV (read back from Q's and K/V's types)
 * within 3x the error of naive32_backward_o (D from the same stored O) with its
 * gradients rounded to the same types; 1 and 2 threads give the same bits; nothing
 * written past an output. */
static void run_dtype_case(sdpa_isa isa, const dtype_shape *s, const sdpa_dtype ty[3])
{
    const size_t nq = (size_t)s->B * s->Hq * s->Tq * s->Dk, nk = (size_t)s->B * s->Hkv * s->Tk * s->Dk;
    const size_t nv = (size_t)s->B * s->Hkv * s->Tk * s->Dv, no = (size_t)s->B * s->Hq * s->Tq * s->Dv;
    const size_t nl = (size_t)s->B * s->Hq * s->Tq, nmax = nq > nk ? (nq > nv ? nq : nv) : (nk > nv ? nk : nv);
    const size_t guard = 16;
    sdpa_problem p = util_problem(s->B, s->Hq, s->Hkv, s->Tq, s->Tk, s->Dk, s->Dv);
    p.causal = s->causal;
    int32_t lens[8];
    for (int b = 0; b < s->B; b++)
        lens[b] = b == 0 ? s->Tk - 3 : b == 1 ? 0 : s->Tk / 2 + b;
    p.kv_lengths = s->kv_lengths ? lens : NULL;
    char desc[200];
    snprintf(desc, sizeof desc, "q %s kv %s o %s B=%d Hq=%d Hkv=%d Tq=%d Tk=%d Dk=%d Dv=%d causal=%d kv_lengths=%d",
             dtype_name(ty[0]), dtype_name(ty[1]), dtype_name(ty[2]), s->B, s->Hq, s->Hkv, s->Tq, s->Tk, s->Dk,
             s->Dv, (int)s->causal, s->kv_lengths);
    const char *name = sdpa_isa_name(isa);

    float *q = malloc(4 * (nq + 1)), *k = malloc(4 * (nk + 1)), *v = malloc(4 * (nv + 1)), *dout = malloc(4 * (no + 1));
    for (size_t i = 0; i < nq; i++) q[i] = (float)(rng_unit() * 4 - 2);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(rng_unit() * 4 - 2);
    for (size_t i = 0; i < nv; i++) v[i] = (float)(rng_unit() * 2 - 1);
    for (size_t i = 0; i < no; i++) dout[i] = (float)(rng_unit() * 2 - 1);
    /* the inputs as the library holds them, then the same values in fp32 */
    void *qs = store_as(ty[0], q, nq, 0), *ks = store_as(ty[1], k, nk, 0), *vs = store_as(ty[1], v, nv, 0),
         *dos = store_as(ty[2], dout, no, 0);
    for (size_t i = 0; i < nq; i++) q[i] = round_to(ty[0], q[i]);
    for (size_t i = 0; i < nk; i++) k[i] = round_to(ty[1], k[i]);
    for (size_t i = 0; i < nv; i++) v[i] = round_to(ty[1], v[i]);
    for (size_t i = 0; i < no; i++) dout[i] = round_to(ty[2], dout[i]);

    /* forward, 1 and 2 threads */
    const sdpa_tensor tq = {qs, (int64_t)s->Hq * s->Tq * s->Dk, (int64_t)s->Tq * s->Dk, s->Dk};
    const sdpa_tensor tk = {ks, (int64_t)s->Hkv * s->Tk * s->Dk, (int64_t)s->Tk * s->Dk, s->Dk};
    const sdpa_tensor tv = {vs, (int64_t)s->Hkv * s->Tk * s->Dv, (int64_t)s->Tk * s->Dv, s->Dv};
    const sdpa_tensor tdo = {dos, (int64_t)s->Hq * s->Tq * s->Dv, (int64_t)s->Tq * s->Dv, s->Dv};
    void *o[2];
    float *lse[2];
    p.q_dtype = ty[0], p.kv_dtype = ty[1], p.o_dtype = ty[2];
    p.isa = isa;
    for (int t = 0; t < 2; t++) {
        o[t] = store_as(ty[2], NULL, 0, no + guard);
        lse[t] = guarded(nl);
        const sdpa_tensor_out to = {o[t], tdo.batch_stride, tdo.head_stride, tdo.seq_stride};
        const sdpa_tensor_out tl = {lse[t], (int64_t)s->Hq * s->Tq, s->Tq, 1};
        p.num_threads = t + 1;
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        check(st == SDPA_OK, name, t ? "dtype forward status (2 threads)" : "dtype forward status", desc, st, 0);
        check(bytes_are_a5(o[t], no * dtype_size(ty[2]), guard * dtype_size(ty[2])) && guard_ok(lse[t], nl), name,
              "dtype forward guard zones", desc, 0, 0);
    }
    check(memcmp(o[0], o[1], no * dtype_size(ty[2])) == 0 && memcmp(lse[0], lse[1], nl * 4) == 0, name,
          "dtype forward: 1 and 2 threads give the same bits", desc, 0, 0);
    /* the references see fp32 descriptors of the rounded values */
    p.q_dtype = p.kv_dtype = p.o_dtype = SDPA_DTYPE_F32;
    p.isa = SDPA_ISA_AUTO;
    p.num_threads = 0;
    double *ro = malloc(8 * (no + 1)), *rl = malloc(8 * (nl + 1));
    float *n32o = malloc(4 * (no + 1)), *n32l = malloc(4 * (nl + 1)), *got = malloc(4 * (nmax + 1));
    ref_forward(&p, q, k, v, ro, rl);
    if (util_rounds_p(isa, ty[0], ty[1], s->Dk, s->Dv)) { /* bf16 pair products: P (and an fp32 Q) rounded too */
        float *qp = util_pairs_q(q, nq, ty[0]);
        naive32_forward_bf16_p(&p, qp ? qp : q, k, v, n32o, n32l);
        free(qp);
    } else
        naive32_forward(&p, q, k, v, n32o, n32l);
    for (size_t i = 0; i < no; i++)
        n32o[i] = round_to(ty[2], n32o[i]);
    load_as(ty[2], o[0], no, got);
    fa_check(name, "dtype forward O", desc, got, n32o, ro, no, 2.0);
    fa_check(name, "dtype forward LSE", desc, lse[0], n32l, rl, nl, 2.0);

    /* backward from the stored O and LSE of the 1-thread forward */
    float *o32 = n32o; /* reused: the stored O, widened */
    load_as(ty[2], o[0], no, o32);
    double *rq = malloc(8 * (nq + 1)), *rk = malloc(8 * (nk + 1)), *rv = malloc(8 * (nv + 1));
    float *n32q = malloc(4 * (nq + 1)), *n32k = malloc(4 * (nk + 1)), *n32v = malloc(4 * (nv + 1));
    /* an fp32 Q that the problem rounds to bf16 (sdpa_rounds_q_bf16): the backward is
       that of the rounded Q, forward and backward alike */
    const int rounds_q = util_rounds_q(isa, ty[0], ty[1], s->Dk, s->Dv, s->Tq, s->Hq / s->Hkv);
    float *qb = rounds_q ? util_pairs_q(q, nq, ty[0]) : NULL;
    const float *qr = qb ? qb : q;
    ref_backward(&p, qr, k, v, dout, rq, rk, rv);
    /* P and dS rounded too where the ISA runs the backward's pair products */
    (util_rounds_bwd(isa, ty, s->Dk, s->Dv, s->Tq, s->Hq / s->Hkv) ? naive32_backward_o_bf16_p
                                                                  : naive32_backward_o)(&p, qr, k, v, o32, dout,
                                                                                        n32q, n32k, n32v);
    for (size_t i = 0; i < nq; i++) n32q[i] = round_to(ty[0], n32q[i]);
    for (size_t i = 0; i < nk; i++) n32k[i] = round_to(ty[1], n32k[i]);
    for (size_t i = 0; i < nv; i++) n32v[i] = round_to(ty[1], n32v[i]);
    const sdpa_tensor tO = {o[0], tdo.batch_stride, tdo.head_stride, tdo.seq_stride};
    const sdpa_tensor tL = {lse[0], (int64_t)s->Hq * s->Tq, s->Tq, 1};
    void *g[2][3];
    p.q_dtype = ty[0], p.kv_dtype = ty[1], p.o_dtype = ty[2];
    p.isa = isa;
    for (int t = 0; t < 2; t++) {
        g[t][0] = store_as(ty[0], NULL, 0, nq + guard);
        g[t][1] = store_as(ty[1], NULL, 0, nk + guard);
        g[t][2] = store_as(ty[1], NULL, 0, nv + guard);
        const sdpa_tensor_out tdq = {g[t][0], tq.batch_stride, tq.head_stride, tq.seq_stride};
        const sdpa_tensor_out tdk = {g[t][1], tk.batch_stride, tk.head_stride, tk.seq_stride};
        const sdpa_tensor_out tdv = {g[t][2], tv.batch_stride, tv.head_stride, tv.seq_stride};
        p.num_threads = t + 1;
        const sdpa_status st = sdpa_backward(&p, &tq, &tk, &tv, &tO, &tL, &tdo, &tdq, &tdk, &tdv);
        check(st == SDPA_OK, name, t ? "dtype backward status (2 threads)" : "dtype backward status", desc, st, 0);
        check(bytes_are_a5(g[t][0], nq * dtype_size(ty[0]), guard * dtype_size(ty[0])) &&
                  bytes_are_a5(g[t][1], nk * dtype_size(ty[1]), guard * dtype_size(ty[1])) &&
                  bytes_are_a5(g[t][2], nv * dtype_size(ty[1]), guard * dtype_size(ty[1])),
              name, "dtype backward guard zones", desc, 0, 0);
    }
    const struct {
        const char *what;
        sdpa_dtype t;
        const float *naive;
        const double *ref;
        size_t n;
    } gr[3] = {{"dtype backward dQ", ty[0], n32q, rq, nq},
               {"dtype backward dK", ty[1], n32k, rk, nk},
               {"dtype backward dV", ty[1], n32v, rv, nv}};
    int same = 1;
    for (int x = 0; x < 3; x++) {
        load_as(gr[x].t, g[0][x], gr[x].n, got);
        fa_check(name, gr[x].what, desc, got, gr[x].naive, gr[x].ref, gr[x].n, 3.0);
        same &= memcmp(g[0][x], g[1][x], gr[x].n * dtype_size(gr[x].t)) == 0;
    }
    check(same, name, "dtype backward: 1 and 2 threads give the same bits", desc, 0, 0);
    if (qb) { /* the same calls with Q rounded by the caller: the same bits, every output */
        void *qbs = store_as(SDPA_DTYPE_F32, qb, nq, 0), *o2 = store_as(ty[2], NULL, 0, no);
        float *l2 = guarded(nl);
        const sdpa_tensor tqb = {qbs, tq.batch_stride, tq.head_stride, tq.seq_stride};
        const sdpa_tensor_out to = {o2, tdo.batch_stride, tdo.head_stride, tdo.seq_stride};
        const sdpa_tensor_out tl = {l2, (int64_t)s->Hq * s->Tq, s->Tq, 1};
        p.num_threads = 1;
        sdpa_status st = sdpa_forward(&p, &tqb, &tk, &tv, &to, &tl);
        void *g2[3] = {store_as(ty[0], NULL, 0, nq), store_as(ty[1], NULL, 0, nk), store_as(ty[1], NULL, 0, nv)};
        const sdpa_tensor_out tdq = {g2[0], tq.batch_stride, tq.head_stride, tq.seq_stride};
        const sdpa_tensor_out tdk = {g2[1], tk.batch_stride, tk.head_stride, tk.seq_stride};
        const sdpa_tensor_out tdv = {g2[2], tv.batch_stride, tv.head_stride, tv.seq_stride};
        if (st == SDPA_OK)
            st = sdpa_backward(&p, &tqb, &tk, &tv, &tO, &tL, &tdo, &tdq, &tdk, &tdv);
        check(st == SDPA_OK, name, "dtype fp32 Q rounded by the caller: status", desc, st, 0);
        check(memcmp(o2, o[0], no * dtype_size(ty[2])) == 0 && memcmp(l2, lse[0], nl * 4) == 0, name,
              "dtype forward: an fp32 Q that the problem rounds gives the bits of Q rounded by the caller", desc,
              0, 0);
        check(memcmp(g2[0], g[0][0], nq * 4) == 0 && memcmp(g2[1], g[0][1], nk * dtype_size(ty[1])) == 0 &&
                  memcmp(g2[2], g[0][2], nv * dtype_size(ty[1])) == 0,
              name, "dtype backward: an fp32 Q that the problem rounds gives the bits of Q rounded by the caller",
              desc, 0, 0);
        free(qbs), free(o2), guarded_free(l2);
        for (int x = 0; x < 3; x++)
            free(g2[x]);
    }
    free(qb);

    for (int t = 0; t < 2; t++) {
        free(o[t]);
        guarded_free(lse[t]);
        for (int x = 0; x < 3; x++)
            free(g[t][x]);
    }
    free(q); free(k); free(v); free(dout); free(qs); free(ks); free(vs); free(dos);
    free(ro); free(rl); free(n32o); free(n32l); free(got);
    free(rq); free(rk); free(rv); free(n32q); free(n32k); free(n32v);
}

/* A bf16 backward whose every softmax row is one-hot (a window of one key: query i
 * sees key i alone): dQ and dK must be exactly 0 and dV = dO, as in float64 and the
 * fp32 backward (D = rowsum(dO * O) with O = V_i cancels dP_ii exactly when D is
 * computed like dP: on the bf16 pair products too). Wide and decode-sized tiles, two
 * threads. Not on amx (its D stays the fp32 sum; docs/design.md). */
static void run_one_hot_case(sdpa_isa isa, int64_t B, int64_t H, int64_t T, int64_t D)
{
    const size_t n = (size_t)(B * H * T * D), nl = (size_t)(B * H * T);
    float *x = malloc(n * 4), *lse = malloc(nl * 4), *got = malloc(n * 4), *want = malloc(n * 4);
    void *t[5], *g[3];
    const float amp[5] = {1.0f, 1.0f, 3.0f, 7.0f, 3.0f}; /* Q, K, V, dO, O (V's values) */
    for (int i = 0; i < 5; i++) {
        for (size_t e = 0; e < n; e++)
            x[e] = amp[i] * (float)(2.0 * rng_unit() - 1.0);
        t[i] = store_as(SDPA_DTYPE_BF16, x, n, 0);
    }
    for (int i = 0; i < 3; i++)
        g[i] = store_as(SDPA_DTYPE_BF16, x, n, 0);
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = B, p.q_heads = p.kv_heads = H, p.q_len = p.kv_len = T, p.head_dim_qk = p.head_dim_v = D;
    p.window_left = p.window_right = 0;
    p.q_dtype = p.kv_dtype = p.o_dtype = SDPA_DTYPE_BF16;
    p.isa = isa;
    p.num_threads = 2;
    const sdpa_tensor tq = {t[0], H * T * D, T * D, D}, tk = {t[1], H * T * D, T * D, D},
                      tv = {t[2], H * T * D, T * D, D}, tdo = {t[3], H * T * D, T * D, D},
                      to = {t[4], H * T * D, T * D, D}, tl = {lse, H * T, T, 1};
    const sdpa_tensor_out oo = {t[4], H * T * D, T * D, D}, lo = {lse, H * T, T, 1},
                          gq = {g[0], H * T * D, T * D, D}, gk = {g[1], H * T * D, T * D, D},
                          gv = {g[2], H * T * D, T * D, D};
    char desc[96];
    snprintf(desc, sizeof desc, "bf16 one-hot rows B%lld H%lld T%lld D%lld", (long long)B, (long long)H,
             (long long)T, (long long)D);
    int ok = sdpa_forward(&p, &tq, &tk, &tv, &oo, &lo) == SDPA_OK &&
             sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &gq, &gk, &gv) == SDPA_OK;
    double worst = 0.0;
    for (int i = 0; i < 3 && ok; i++) {
        load_as(SDPA_DTYPE_BF16, g[i], n, got);
        load_as(SDPA_DTYPE_BF16, t[3], n, want); /* dV = dO */
        for (size_t e = 0; e < n; e++) {
            const double d = fabs((double)got[e] - (i == 2 ? (double)want[e] : 0.0));
            worst = d > worst ? d : worst;
        }
    }
    check(ok && worst == 0.0, sdpa_isa_name(isa), "dQ = dK = 0, dV = dO", desc, worst, 0.0);
    for (int i = 0; i < 5; i++)
        free(t[i]);
    for (int i = 0; i < 3; i++)
        free(g[i]);
    free(x), free(lse), free(got), free(want);
}

int main(int argc, char **argv)
{
    const char *ec_path = argc > 1 ? argv[1] : SDPA_TEST_DATA_DIR "/edge_cases.json";
    char ec_err[1200];
    ec_suite *ecs = ec_suite_load(ec_path, ec_err, sizeof ec_err);
    if (!ecs) {
        failed++;
        printf("FAIL edge cases: %s\n", ec_err);
    }
    const char *red = getenv("SDPA_TEST_REDUCED");
    const int reduced = red && *red && strcmp(red, "0") != 0;
    static const int dims[] = {1, 3, 8, 15, 16, 17, 63, 64, 65, 80, 96, 128, 256};
    static const int lens[] = {0, 1, 2, 7, 9, 15, 17, 31, 33, 63, 65, 127, 129, 257, 1000};
    const int ndims = sizeof dims / sizeof dims[0], nlens = sizeof lens / sizeof lens[0];

    printf("libsdpa %s conformance; ISAs:", sdpa_version());
    for (int i = 0; i < SDPA_ISA_COUNT; i++)
        printf(" %s=%s", sdpa_isa_name((sdpa_isa)i),
               sdpa_isa_supported((sdpa_isa)i) ? "tested" : sdpa_isa_compiled((sdpa_isa)i) ? "skipped (CPU)" : "not compiled");
    printf("; active %s%s\n", sdpa_isa_name(sdpa_isa_active()), reduced ? "; reduced sweep" : "");

    for (int i = 0; i < SDPA_ISA_COUNT; i++) {
        const sdpa_isa isa = (sdpa_isa)i;
        if (!sdpa_isa_supported(isa))
            continue;
        const int before = failed, before_p = passed;
        rng_state = 0x9E3779B97F4A7C15ull;
        /* amx runs fp32 and fp16 on the avx512 table's kernels and shapes (the Criterion
         * test dispatch/amx_fp32_is_avx512 checks the bits): only its 16-bit storage here */
        if (isa != SDPA_ISA_AMX) {
        /* 1. every head_dim for Dk and for Dv, against tails in T, each mask kind in turn */
        for (int d = 0; d < ndims; d++) {
            if (reduced && (d % 3))
                continue;
            const int Tq = lens[(d * 5 + 3) % nlens] % 300, Tk = lens[(d * 7 + 5) % nlens] % 300;
            shape s = {1 + d % 2, 2, 1 + (d % 2), Tq ? Tq : 5, Tk, dims[d], dims[(d + 4) % ndims]};
            run_case(isa, &s, d % 8, 1 + d % 3, 0, 1);
            shape s2 = {1, 1, 1, 33, 47, dims[(d + 7) % ndims], dims[d]};
            run_case(isa, &s2, (d + 3) % 8, 2, d % 2 ? 8 : 0, 1);
        }
        /* 2. every sequence length tail for both Tq and Tk, with every mask kind */
        for (int t = 0; t < nlens; t++) {
            if (reduced && (t % 3))
                continue;
            const int T = lens[t] > 300 && reduced ? 129 : lens[t];
            for (int m = 0; m < 8; m++) {
                if (reduced && m % 2)
                    continue;
                shape s = {2, 4, 2, T, lens[(t + m + 1) % nlens] > 300 ? 257 : lens[(t + m + 1) % nlens], 16 + m, 17 - m};
                run_case(isa, &s, m, 1 + (m % 2), m % 3 ? 0 : 16, T <= 300);
            }
        }
        /* 3. the realistic shapes, default tiles, two threads */
        if (!reduced) {
            shape big = {1, 4, 2, 1000, 1000, 64, 64};
            run_case(isa, &big, 1, 2, 0, 0);
            shape dec = {1, 8, 2, 1, 1000, 128, 128};
            run_case(isa, &dec, 5, 2, 0, 1);
        }
        /* 4. the variants (softcap, ALiBi, sinks, all three) with every mask kind, a
         * decode shape (few-column path) and tails */
        for (int variant = 1; variant <= 4; variant++)
            for (int m = 0; m < 8; m++) {
                if (reduced && (m + variant) % 3)
                    continue;
                shape s = {2, 4, 2, 21 + 8 * m, 37 + 5 * variant, 16 + variant, 17 - variant};
                run_case_v(isa, &s, m, 1 + (m % 2), m % 3 ? 0 : 16, 1, variant);
                shape dec = {1, 8, 2, 1, 300 + 40 * m, 32, 24};
                run_case_v(isa, &dec, m == 6 || m == 7 ? 0 : m, 1, 0, 1, variant);
            }
        printf("[%s] %d checks, %d failed\n", sdpa_isa_name(isa), passed - before_p + failed - before,
               failed - before);
        /* 5. the edge cases */
        if (ecs) {
            sdpa_isa ec_isa = isa;
            const int ec_before = failed, ec_before_p = passed;
            for (int g = 0; g < ec_group_count(); g++)
                ec_run_group(ecs, g, isa, ec_report, &ec_isa);
            printf("[%s] edge cases (%d): %d checks, %d failed\n", sdpa_isa_name(isa), ec_suite_size(ecs),
                   passed - ec_before_p + failed - ec_before, failed - ec_before);
        }
        }
        /* 6. bf16 / fp16 storage: every type combination (7 reduced) over dtype_shapes */
        {
            const int dt_before = failed, dt_before_p = passed;
            const int nshapes = (int)(sizeof dtype_shapes / sizeof dtype_shapes[0]);
            const int ncombos = reduced ? (int)(sizeof dtype_reduced / sizeof dtype_reduced[0]) : 27;
            rng_state = 0x243F6A8885A308D3ull;
            for (int c = 0; c < ncombos; c++) {
                const sdpa_dtype ty[3] = {
                    (sdpa_dtype)(reduced ? dtype_reduced[c][0] : c / 9),
                    (sdpa_dtype)(reduced ? dtype_reduced[c][1] : c / 3 % 3),
                    (sdpa_dtype)(reduced ? dtype_reduced[c][2] : c % 3)};
                for (int sh = 0; sh < nshapes; sh++)
                    run_dtype_case(isa, &dtype_shapes[sh], ty);
            }
            printf("[%s] bf16/fp16 storage (%d type combinations x %d shapes): %d checks, %d failed\n",
                   sdpa_isa_name(isa), ncombos, nshapes, passed - dt_before_p + failed - dt_before,
                   failed - dt_before);
        }
        /* 7. one-hot softmax rows in bf16: dQ, dK exactly 0 */
        if (isa != SDPA_ISA_AMX) {
            static const int64_t oh[][4] = {{1, 2, 96, 32}, {2, 1, 37, 64}, {1, 4, 1, 16}, {1, 3, 130, 128}};
            for (size_t c = 0; c < sizeof oh / sizeof oh[0]; c++)
                run_one_hot_case(isa, oh[c][0], oh[c][1], oh[c][2], oh[c][3]);
        }
    }
    ec_suite_free(ecs);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
