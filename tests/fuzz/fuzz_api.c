/* SPDX-License-Identifier: MIT */
/* tests/fuzz/fuzz_api.c - libFuzzer target for the C API (issue 14).
 *
 * Each input is decoded into one problem and its tensors: sizes, GQA groups,
 * strides (contiguous, padded rows, [B, T, H, D], stride-0 broadcast inputs),
 * causal modes, windows (small and near 2^31, 2^62, INT64_MAX), kv_lengths, a
 * boolean mask and a bias (broadcast strides, -inf and -FLT_MAX entries),
 * scales (default, 0, negative, denormal, large), num_threads 0/1/2, every ISA
 * by name, block sizes, and contents of three amplitudes with NaN, +-Inf,
 * denormals, -0 and FLT_MAX sprinkled in. A "wild" byte then breaks the problem
 * on purpose (negative or huge strides and sizes, bad enums, kv_lengths out of
 * range, NaN scale, ...). The forward runs, then the backward on its outputs.
 *   - every output is a guarded buffer (tests/util_core.c): guard zones and the
 *     gaps of strided outputs must keep their sentinel on every call;
 *   - on error nothing is written; a problem made invalid on purpose must fail,
 *     and a valid one must succeed;
 *   - on success the outputs are compared with the float64 reference
 *     (tests/ref.c) by the FlashAttention rule of the suite: infinities and NaN
 *     exactly where the reference has them, and the error within 2x (forward)
 *     or 8x (backward: the suite's 3x is exceeded on tiny problems, 5.9x at
 *     Dk = 1, Tk = 3, where dP - D cancels) the naive fp32 error plus a small
 *     slack (1e-6, backward 1e-5, of the largest value); with logits
 *     beyond +-64 (README's Limits) the forward gets 8x and 1e-5 of the largest
 *     value, and the backward's values are not compared (status, guards, gaps
 *     and the sanitizers still are), nor are they with NaN/Inf inputs.
 * A failure prints the decoded problem and aborts (libFuzzer saves the input).
 * Built by meson with -Dfuzzing=enabled (clang); README "Fuzzing" runs it. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "sdpa.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct rd {
    const uint8_t *p;
    size_t n, i;
} rd;

static unsigned u8(rd *r)
{
    return r->i < r->n ? r->p[r->i++] : 0;
}

static uint32_t u32(rd *r)
{
    uint32_t x = 0;
    for (int i = 0; i < 4; i++)
        x = x << 8 | u8(r);
    return x;
}

static uint64_t g_rng;
static uint64_t rnext(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double runif(void)
{
    return (double)(rnext() >> 11) / 9007199254740992.0;
}

static const int64_t WINDOWS[] = {SDPA_WINDOW_UNBOUNDED, 0, 1, 2, 3, 5, 8, 17, INT32_MAX, (int64_t)1 << 31,
                                  (int64_t)1 << 62, INT64_MAX - 1, INT64_MAX};
#define NWIN (sizeof WINDOWS / sizeof WINDOWS[0])

/* No FLT_MAX in the tensors: its products overflow fp32 but not the float64
 * reference (the bias carries -FLT_MAX, which the contract covers). */
static const float SPECIALS[] = {NAN, INFINITY, -INFINITY, 1e-40f, -1e-45f, -0.0f, 1e-38f};

static char g_desc[1024];
/* NaN/Inf were put into the inputs: an output the reference has non-finite
 * must be non-finite, but NaN and +-Inf are not told apart (the order of the
 * sums decides between Inf and Inf - Inf = NaN, e.g. dK = inf where the
 * float64 reference has NaN). */
static int g_specials;

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            fprintf(stderr, "fuzz_api: FAIL: " __VA_ARGS__);                                                         \
            fprintf(stderr, "\n  problem: %s\n", g_desc);                                                            \
            abort();                                                                                                 \
        }                                                                                                            \
    } while (0)

/* A tensor: its layout, guarded storage, and (inputs) a contiguous copy. */
typedef struct ften {
    util_layout l;
    float *g;   /* guarded storage of util_extent(l) floats */
    float *c;   /* contiguous [B, H, T, D] copy (inputs), or NULL */
    size_t ext, numel;
} ften;

/* mode: 0 contiguous, 1 padded rows, 2 [B, T, H, D], 3 broadcast over B and/or H (inputs). */
static util_layout pick_layout(unsigned mode, int64_t B, int64_t H, int64_t T, int64_t D, int input)
{
    switch (mode % 4) {
    case 1: return util_padded(B, H, T, D, D + 1 + (int64_t)(mode / 4 % 3));
    case 2: return util_bthd(B, H, T, D);
    case 3:
        if (input) {
            util_layout l = util_contig(B, H, T, D);
            if (mode & 4)
                l.sb = 0;
            if (mode & 8)
                l.sh = 0;
            if (l.sb == 0 && l.sh == 0 && (mode & 16))
                l.st = 0; /* every row the same */
            return l;
        }
        return util_contig(B, H, T, D);
    default: return util_contig(B, H, T, D);
    }
}

/* Q and K get only the finite specials: a NaN or infinite score is where the
 * float64 reference (whole row NaN) and the library (an arithmetic -inf score
 * counts as masked: O = 0, LSE = -inf) part ways, which is not fuzzed here. */
static void ften_in(ften *t, util_layout l, float amp, unsigned nspecial, int finite_only)
{
    t->l = l;
    t->ext = util_extent(&l);
    t->numel = util_numel(&l);
    t->g = util_galloc(t->ext);
    for (size_t i = 0; i < t->ext; i++)
        t->g[i] = (float)((runif() * 2.0 - 1.0) * amp);
    for (unsigned s = 0; s < nspecial && t->ext; s++)
        t->g[rnext() % t->ext] = SPECIALS[(finite_only ? 3 : 0) + rnext() % (sizeof SPECIALS / sizeof SPECIALS[0] - (finite_only ? 3 : 0))];
    t->c = malloc((t->numel + 1) * sizeof(float));
    util_unpack(&t->l, t->c, t->g);
}

static void ften_out(ften *t, util_layout l)
{
    t->l = l;
    t->ext = util_extent(&l);
    t->numel = util_numel(&l);
    t->g = util_galloc(t->ext);
    t->c = NULL;
}

static void ften_free(ften *t)
{
    util_gfree(t->g);
    free(t->c);
}

/* Guards intact and, on error, every element still the sentinel; on success the
 * gaps between rows of a strided output untouched. */
static void check_untouched(const ften *t, const char *what, int all)
{
    char msg[256];
    CHECK(util_gcheck(t->g, msg, sizeof msg), "%s: guard zone: %s", what, msg);
    if (all) {
        for (size_t i = 0; i < t->ext; i++)
            CHECK(util_is_sentinel(t->g[i]), "%s[%zu] written by a call that failed", what, i);
    } else {
        CHECK(util_gaps_check(&t->l, t->g, t->ext, msg, sizeof msg), "%s: %s", what, msg);
    }
}

/* max |x| over n floats (0 for none). */
static double max_abs(const float *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)x[i]));
    return m;
}

/* The suite's FlashAttention rule (tests/util.c) without Criterion, plus an
 * absolute floor: the rounding noise of the terms a gradient sums, which the
 * rule cannot see when the true gradient and the naive loop's error are both 0
 * (e.g. identical V rows: every dP_j - D is 0 in float64, while the kernel's
 * D = rowsum(dO * O) and dP = dO . V round differently; the same holds for any
 * FlashAttention-2 backward). */
static void compare(const char *what, const float *got, const float *naive, const double *ref, size_t n,
                    double factor, double rel, double floor, const double *logit_bound)
{
    double nerr = 0, rmax = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i])) {
            rmax = fmax(rmax, fabs(ref[i]));
            if (isfinite(naive[i]))
                nerr = fmax(nerr, fabs((double)naive[i] - ref[i]));
        }
    const double bound = factor * nerr + rel * rmax + 1e-7 + floor;
    for (size_t i = 0; i < n; i++) {
        if (g_specials && !isfinite(ref[i])) /* NaN/Inf inputs: propagation, not which of the two */
            CHECK(!isfinite(got[i]), "%s[%zu] = %g, reference %g", what, i, (double)got[i], ref[i]);
        else if (isnan(ref[i]))
            CHECK(isnan(got[i]), "%s[%zu] = %g, reference NaN", what, i, (double)got[i]);
        else if (isinf(ref[i]))
            CHECK((double)got[i] == ref[i], "%s[%zu] = %g, reference %g", what, i, (double)got[i], ref[i]);
        else
            CHECK(isfinite(got[i]) && fabs((double)got[i] - ref[i]) <= bound + (logit_bound ? logit_bound[i] : 0.0),
                  "%s[%zu] = %.9g, reference %.9g: error %.3g > bound %.3g + logit bound %.3g (naive fp32 error %.3g)",
                  what, i, (double)got[i], ref[i], fabs((double)got[i] - ref[i]), bound,
                  logit_bound ? logit_bound[i] : 0.0, nerr);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd r = {data, size, 0};
    const unsigned flags = u8(&r), flags2 = u8(&r);
    const int backward = flags & 1;
    int64_t B = u8(&r) % 3, Hkv = u8(&r) % 4, G = 1 + u8(&r) % 3, Tq = u8(&r) % 34, Tk = u8(&r) % 72;
    int64_t Dk = u8(&r) % 37, Dv = u8(&r) % 37;
    const int64_t Hq = Hkv * G;
    int must_fail = 0; /* made invalid on purpose */

    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    p.causal = (sdpa_causal)((flags >> 1) % 3);
    p.window_alignment = (sdpa_alignment)((flags >> 3) & 1);
    p.window_left = WINDOWS[u8(&r) % NWIN];
    p.window_right = WINDOWS[u8(&r) % NWIN];
    const unsigned sc = u8(&r) % 7;
    switch (sc) {
    case 0: must_fail |= Dk == 0; break; /* default 1/sqrt(Dk) */
    case 1: p.use_default_scale = 0; p.scale = Dk ? 1.0f / sqrtf((float)Dk) : 1.0f; break;
    case 2: p.use_default_scale = 0; p.scale = 0.0f; break;
    case 3: p.use_default_scale = 0; p.scale = -0.75f; break;
    case 4: p.use_default_scale = 0; p.scale = 1e-40f; break;
    case 5: p.use_default_scale = 0; p.scale = 3.0f; break;
    default: p.use_default_scale = 0; p.scale = 0.01f; break;
    }
    const unsigned th = u8(&r) % 3;
    p.num_threads = th == 0 ? 1 : th == 1 ? 2 : 0;
    const unsigned is = u8(&r) % 5;
    p.isa = is == 0 ? SDPA_ISA_AUTO : (sdpa_isa)(is - 1);
    if (p.isa != SDPA_ISA_AUTO && !sdpa_isa_supported(p.isa))
        must_fail = 1;
    static const int BLOCKS[] = {0, 0, 1, 8, 17, 64, 100, SDPA_MAX_BLOCK};
    p.block_q = BLOCKS[u8(&r) % 8];
    p.block_k = BLOCKS[u8(&r) % 8];
    static const float AMPS[] = {1.0f, 4.0f, 0.001f, 30.0f};
    const float amp = AMPS[u8(&r) % 4];
    const unsigned nspecial = (flags2 & 1) ? u8(&r) % 4 : 0;
    g_rng = u32(&r);
    g_specials = nspecial > 0;

    /* Tensors. */
    ften q, k, v, dout, o, lse, dq, dk, dv;
    ften_in(&q, pick_layout(u8(&r), B, Hq, Tq, Dk, 1), amp, nspecial, 1);
    ften_in(&k, pick_layout(u8(&r), B, Hkv, Tk, Dk, 1), amp, nspecial, 1);
    ften_in(&v, pick_layout(u8(&r), B, Hkv, Tk, Dv, 1), 1.0f, nspecial, 0);
    ften_in(&dout, pick_layout(u8(&r), B, Hq, Tq, Dv, 1), 1.0f, nspecial, 0);
    ften_out(&o, pick_layout(u8(&r), B, Hq, Tq, Dv, 0));
    ften_out(&lse, (flags2 & 2) ? util_padded(B, Hq, Tq, 1, 3) : util_lse_layout(B, Hq, Tq));
    ften_out(&dq, pick_layout(u8(&r), B, Hq, Tq, Dk, 0));
    ften_out(&dk, pick_layout(u8(&r), B, Hkv, Tk, Dk, 0));
    ften_out(&dv, pick_layout(u8(&r), B, Hkv, Tk, Dv, 0));
    const int want_lse = backward || !(flags2 & 4);

    /* Masks. */
    int32_t *kvl = NULL;
    uint8_t *bm = NULL;
    float *bias = NULL;
    const size_t nm = (size_t)(B * Hq * Tq * Tk);
    if (flags & 16) {
        kvl = malloc((size_t)(B + 1) * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++)
            kvl[b] = (int32_t)(rnext() % (uint64_t)(Tk + 1));
        p.kv_lengths = kvl;
    }
    if (flags & 32) { /* bool mask, strides broadcasting B, H, or Tq by bits */
        const unsigned m = u8(&r);
        bm = malloc(nm + 1);
        for (size_t i = 0; i < nm; i++)
            bm[i] = (rnext() % 8) != 0 ? (uint8_t)(1 + rnext() % 255) : 0;
        p.bool_mask = (sdpa_bool_mask){bm, (m & 1) ? 0 : Hq * Tq * Tk, (m & 2) ? 0 : Tq * Tk, (m & 4) ? 0 : Tk, 1};
    }
    if (flags & 64) {
        const unsigned m = u8(&r);
        bias = malloc((nm + 1) * sizeof(float));
        for (size_t i = 0; i < nm; i++) {
            const uint64_t x = rnext() % 16;
            bias[i] = x == 0 ? -INFINITY : x == 1 ? -FLT_MAX : (float)(runif() * 4.0 - 2.0);
        }
        p.bias = (sdpa_bias){bias, (m & 1) ? 0 : Hq * Tq * Tk, (m & 2) ? 0 : Tq * Tk, (m & 4) ? 0 : Tk, 1};
    }

    /* The wild byte: break the problem on purpose. */
    const int nonempty = B > 0 && Hq > 0 && Tq > 0 && Tk > 0 && Dk > 0 && Dv > 0;
    sdpa_tensor tq = util_view(&q.l, q.g), tk = util_view(&k.l, k.g), tv = util_view(&v.l, v.g);
    sdpa_tensor tdo = util_view(&dout.l, dout.g);
    sdpa_tensor_out to = util_view_out(&o.l, o.g), tl = util_view_out(&lse.l, lse.g);
    sdpa_tensor_out tdq = util_view_out(&dq.l, dq.g), tdk = util_view_out(&dk.l, dk.g),
                    tdv = util_view_out(&dv.l, dv.g);
    const unsigned wild = (flags & 128) ? u8(&r) % 17 : 255;
    int fwd_only = 0, bwd_only = 0; /* the break concerns one pass's tensors only (on a valid problem) */
    switch (wild) {
    case 0: p.causal = (sdpa_causal)3; must_fail = 1; break;
    case 1: p.window_left = -2; must_fail = 1; break;
    case 2: p.use_default_scale = 0; p.scale = NAN; must_fail = 1; break;
    case 3: p.use_default_scale = 1; p.scale = 0.125f; must_fail = 1; break;
    case 4: p.num_threads = -1; must_fail = 1; break;
    case 5: p.block_k = SDPA_MAX_BLOCK + 1; must_fail = 1; break;
    case 6: p.isa = (sdpa_isa)7; must_fail = 1; break;
    case 7: tk.seq_stride = -1; must_fail = 1; break;
    case 8: if (Tk > 1 && Dk > 0 && B > 0 && Hkv > 0) { tk.seq_stride = INT64_MAX / 2; must_fail = 1; } break;
    case 9: if (!must_fail && Tq > 1 && Dv > 0 && Hq > 0 && B > 0) { to.seq_stride = (int64_t)1 << 62; must_fail = fwd_only = 1; } break;
    case 10: if (!must_fail && Tk > 1 && Dk > 0 && B > 0 && Hkv > 0) { tdk.seq_stride = (int64_t)1 << 62; must_fail = bwd_only = 1; } break;
    case 11: if (kvl && B > 0) { kvl[0] = (int32_t)Tk + 1; must_fail = 1; } break;
    /* (not with K and V broadcast along T: 2^62 equal keys are a valid problem) */
    case 12: if (nonempty && (k.l.st || v.l.st)) { p.kv_len = (int64_t)1 << 62; must_fail = 1; } break;
    case 13: if (nonempty) { p.q_len = INT64_MAX; must_fail = 1; } break;
    case 14: if (nonempty) { p.batch = (int64_t)1 << 62; must_fail = 1; } break;
    case 15: if (Hkv > 1) { p.q_heads = Hq + 1; must_fail = 1; } break;
    case 16: p.diagonal_offset = SDPA_MAX_DIAGONAL_OFFSET + 1; must_fail = 1; break;
    default: break;
    }

    snprintf(g_desc, sizeof g_desc,
             "B %lld Hq %lld Hkv %lld Tq %lld Tk %lld Dk %lld Dv %lld causal %d align %d window [%lld, %lld] "
             "scale %s%g threads %d isa %s block %d x %d kv_lengths %s bool_mask %s bias %s lse %s amp %g "
             "specials %u wild %u %s",
             (long long)p.batch, (long long)p.q_heads, (long long)Hkv, (long long)p.q_len, (long long)p.kv_len,
             (long long)Dk, (long long)Dv, (int)p.causal, (int)p.window_alignment, (long long)p.window_left,
             (long long)p.window_right, p.use_default_scale ? "default, .scale " : "", (double)p.scale,
             p.num_threads, sdpa_isa_name(p.isa), p.block_q, p.block_k, kvl ? "yes" : "no", bm ? "yes" : "no",
             bias ? "yes" : "no", want_lse ? "yes" : "no", (double)amp, nspecial, wild,
             backward ? "forward+backward" : "forward");

    /* Logits beyond +-64: the fp32 scores' own rounding (an FMA chain's Q.K^T a
     * few ulps off where the naive loop's is 1) exceeds the rule; the allowance
     * of README's Limits applies (8x forward, 1e-5 relative; backward below). */
    double qmax = 0, kmax = 0;
    for (size_t i = 0; i < q.numel; i++)
        qmax = fmax(qmax, fabs((double)q.c[i]));
    for (size_t i = 0; i < k.numel; i++)
        kmax = fmax(kmax, fabs((double)k.c[i]));
    const double sc_abs = fabs(p.use_default_scale ? (Dk ? 1.0 / sqrt((double)Dk) : 0.0) : (double)p.scale);
    const int large = qmax * kmax * (double)Dk * sc_abs > 64.0;

    sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, want_lse ? &tl : NULL);
    CHECK(st == SDPA_OK || st < 0, "forward status %d", st);
    if (must_fail && !bwd_only)
        CHECK(st != SDPA_OK, "forward of an invalid problem returned SDPA_OK");
    else
        CHECK(st == SDPA_OK, "forward of a valid problem returned %d (%s)", st, sdpa_status_string(st));
    check_untouched(&o, "O", st != SDPA_OK);
    check_untouched(&lse, "LSE", st != SDPA_OK || !want_lse);

    const size_t no = (size_t)(B * Hq * Tq * Dv), nl = (size_t)(B * Hq * Tq);
    if (st == SDPA_OK) {
        double *ro = malloc((no + 1) * sizeof(double)), *rl = malloc((nl + 1) * sizeof(double));
        float *no32 = malloc((no + 1) * sizeof(float)), *nl32 = malloc((nl + 1) * sizeof(float));
        float *go = malloc((no + 1) * sizeof(float)), *gl = malloc((nl + 1) * sizeof(float));
        ref_forward_views(&p, &tq, &tk, &tv, ro, rl);
        naive32_forward(&p, q.c, k.c, v.c, no32, nl32);
        util_unpack(&o.l, go, o.g);
        util_unpack(&lse.l, gl, lse.g);
        /* Rows with a logit beyond +-64 also get the first-order bound of their logits'
         * own fp32 rounding (ref_forward_logit_bound): where such logits nearly tie, a
         * kernel's Q.K^T a few ulp off (its order of summation, FMA) moves O by more
         * than 8x the naive loop's error, which may happen to round the tied keys'
         * logits alike. */
        double *lb = large ? malloc((no + 1) * sizeof(double)) : NULL;
        if (lb)
            ref_forward_logit_bound(&p, &tq, &tk, &tv, 64.0, lb);
        compare("O", go, no32, ro, no, large ? 8.0 : 2.0, large ? 1e-5 : 1e-6, 0.0, lb);
        if (want_lse)
            compare("LSE", gl, nl32, rl, nl, large ? 8.0 : 2.0, large ? 1e-5 : 1e-6, 0.0, NULL);
        free(ro), free(rl), free(no32), free(nl32), free(go), free(gl), free(lb);
    }

    /* A forward failed on purpose leaves no O and LSE for a valid backward. */
    if (backward && !(fwd_only && st != SDPA_OK)) {
        /* The backward reads the forward's O and LSE (zeros if it failed). */
        if (st != SDPA_OK) {
            for (size_t i = 0; i < o.ext; i++)
                o.g[i] = 0.0f;
            for (size_t i = 0; i < lse.ext; i++)
                lse.g[i] = 0.0f;
        }
        sdpa_tensor ti = util_view(&o.l, o.g), tli = util_view(&lse.l, lse.g);
        const sdpa_status sb = sdpa_backward(&p, &tq, &tk, &tv, &ti, &tli, &tdo, &tdq, &tdk, &tdv);
        CHECK(sb == SDPA_OK || sb < 0, "backward status %d", sb);
        if (must_fail && !fwd_only)
            CHECK(sb != SDPA_OK, "backward of an invalid problem returned SDPA_OK");
        else
            CHECK(sb == SDPA_OK, "backward of a valid problem returned %d (%s)", sb, sdpa_status_string(sb));
        check_untouched(&dq, "dQ", sb != SDPA_OK);
        check_untouched(&dk, "dK", sb != SDPA_OK);
        check_untouched(&dv, "dV", sb != SDPA_OK);
        /* With NaN/Inf inputs the backward is checked for status, guards and
         * gaps only: the reference and the contract differ on which gradients
         * a NaN query reaches (dK rows of keys masked for every query are
         * exactly 0 by contract; the reference's 0 * NaN makes them NaN). */
        /* Logits beyond +-64: the backward's known limit (README, Limits: a peaked
         * row's dP - D cancels to fp32 rounding, e.g. dQ 4e-6 where the truth is
         * 1e-14 at Tq = 1, Dk = 1, logits ~700): status, guards and gaps only. */
        if (sb == SDPA_OK && !g_specials && !large) {
            const size_t nq = (size_t)(B * Hq * Tq * Dk), nk = (size_t)(B * Hkv * Tk * Dk),
                         nv = (size_t)(B * Hkv * Tk * Dv);
            double *rq = malloc((nq + 1) * sizeof(double)), *rk = malloc((nk + 1) * sizeof(double)),
                   *rv = malloc((nv + 1) * sizeof(double));
            float *nq32 = malloc((nq + 1) * sizeof(float)), *nk32 = malloc((nk + 1) * sizeof(float)),
                  *nv32 = malloc((nv + 1) * sizeof(float));
            float *gq = malloc((nq + 1) * sizeof(float)), *gk = malloc((nk + 1) * sizeof(float)),
                  *gv = malloc((nv + 1) * sizeof(float));
            ref_backward_views(&p, &tq, &tk, &tv, &tdo, rq, rk, rv);
            naive32_backward(&p, q.c, k.c, v.c, dout.c, nq32, nk32, nv32);
            util_unpack(&dq.l, gq, dq.g);
            util_unpack(&dk.l, gk, dk.g);
            util_unpack(&dv.l, gv, dv.g);
            /* dS = P (dP - D) carries D's and dP's rounding, a few ulp of
             * Dv max|dO| max|V|; dQ sums P-weighted rows of K (sum P = 1), dK
             * up to G * Tq rows of Q. */
            const double dp_noise = 8.0 * FLT_EPSILON * (double)Dv * max_abs(dout.c, (size_t)(B * Hq * Tq * Dv)) *
                                    max_abs(v.c, nv) * fabs(ref_scale(&p));
            compare("dQ", gq, nq32, rq, nq, 8.0, 1e-5, dp_noise * max_abs(k.c, nk), NULL);
            compare("dK", gk, nk32, rk, nk, 8.0, 1e-5,
                    dp_noise * max_abs(q.c, nq) * (double)(Hq / (Hkv ? Hkv : 1)) * (double)Tq, NULL);
            compare("dV", gv, nv32, rv, nv, 8.0, 1e-5, 0.0, NULL);
            free(rq), free(rk), free(rv), free(nq32), free(nk32), free(nv32), free(gq), free(gk), free(gv);
        }
    }

    ften *all[] = {&q, &k, &v, &dout, &o, &lse, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ften_free(all[i]);
    free(kvl);
    free(bm);
    free(bias);
    return 0;
}
