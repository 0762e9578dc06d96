/* SPDX-License-Identifier: MIT */
/* tests/test_numerics.c - numerics: extreme scales and magnitudes,
 * signed zeros, denormals, and IEEE propagation of NaN/Inf in allowed inputs
 * (forward and backward, including where a probability underflows to 0), on every
 * ISA against the float64 reference of tests/ref.c. */
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

/* Runs the forward of a 1-head problem on every ISA and checks O and LSE row by
 * row against the reference with a relative tolerance. */
static int check_all_isas(sdpa_problem p, const float *q, const float *k, const float *v, double rtol,
                          const char *what)
{
    const int64_t Tq = p.q_len, Tk = p.kv_len, Dk = p.head_dim_qk, Dv = p.head_dim_v;
    const sdpa_tensor tq = {q, Tq * Dk, Tq * Dk, Dk}, tk = {k, Tk * Dk, Tk * Dk, Dk}, tv = {v, Tk * Dv, Tk * Dv, Dv};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    int bad = 0;
    double *ro = malloc((size_t)(Dv + 1) * sizeof(double));
    for (int ii = 0; ii < nisa; ii++) {
        p.isa = isas[ii];
        float *o = util_galloc((size_t)(Tq * Dv)), *l = util_galloc((size_t)Tq);
        const sdpa_tensor_out to = {o, Tq * Dv, Tq * Dv, Dv}, tl = {l, Tq, Tq, 1};
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        if (st != SDPA_OK) {
            cr_log_error("[%s] %s: status %d", sdpa_isa_name(isas[ii]), what, (int)st);
            bad++;
        }
        for (int64_t i = 0; i < Tq && st == SDPA_OK; i++) {
            double rl;
            ref_forward_row(&p, &tq, &tk, &tv, 0, 0, i, ro, &rl);
            int ok = util_close_tol(l[i], rl, rtol * (fabs(rl) + 1e-30));
            for (int64_t c = 0; c < Dv; c++)
                ok = ok && util_close_tol(o[i * Dv + c], ro[c], rtol * (fabs(ro[c]) + 1e-44));
            if (!ok && bad++ < 4)
                cr_log_error("[%s] %s row %ld: O[0] %.9g (ref %.9g) LSE %.9g (ref %.9g)", sdpa_isa_name(isas[ii]), what,
                             (long)i, Dv ? (double)o[i * Dv] : 0.0, Dv ? ro[0] : 0.0, (double)l[i], rl);
        }
        cr_expect(util_gintact(o, "O") && util_gintact(l, "LSE"));
        util_gfree(o);
        util_gfree(l);
    }
    free(ro);
    return bad;
}

Test(numerics, extreme_scales)
{
    /* well separated scores so that even scale 1e30 has one clear winner */
    const float q[2 * 2] = {1.0f, 0.5f, -0.25f, 1.0f};
    const float k[3 * 2] = {1.0f, 0.0f, 0.0f, 1.0f, -1.0f, -1.0f};
    const float v[3 * 2] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
    static const float scales[] = {1e30f, -1e30f, 1e-30f, 1e-40f /* denormal */, -0.0f, 0.0f, 3.4e38f};
    int bad = 0;
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        sdpa_problem p = util_problem(1, 1, 1, 2, 3, 2, 2);
        p.use_default_scale = 0;
        p.scale = scales[s];
        char what[64];
        snprintf(what, sizeof what, "scale %g", (double)scales[s]);
        bad += check_all_isas(p, q, k, v, 1e-5, what);
    }
    cr_expect_eq(bad, 0);
}

/* Inputs near 1e18 (scores near 1e36, still finite in fp32) and signed zeros:
 * one-hot softmax rows, the same on every ISA as in float64. */
Test(numerics, huge_magnitude_and_signed_zero_inputs)
{
    enum { TQ = 7, TK = 40, D = 4 };
    util_rng r;
    util_rng_seed(&r, "adversarial.huge_magnitude", 13);
    float q[TQ * D], k[TK * D], v[TK * D];
    util_fill_normal(&r, q, TQ * D, 1e18f);
    util_fill_normal(&r, k, TK * D, 1e18f);
    util_fill_normal(&r, v, TK * D, 1.0f);
    for (int i = 0; i < D; i++) {
        q[i] = -0.0f;         /* row 0: all scores are zeros of either sign: uniform */
        k[5 * D + i] = -0.0f; /* key 5: score -0 or +0 for every row */
    }
    sdpa_problem p = util_problem(1, 1, 1, TQ, TK, D, D);
    p.use_default_scale = 0;
    p.scale = 1.0f;
    cr_expect_eq(check_all_isas(p, q, k, v, 1e-5, "|x| ~ 1e18"), 0);
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.block_k = 3;
    cr_expect_eq(check_all_isas(p, q, k, v, 1e-5, "|x| ~ 1e18, causal, block_k 3"), 0);
}

/* Denormal inputs must not be flushed to zero by any ISA (no FTZ/DAZ). */
Test(numerics, denormal_values_not_flushed)
{
    const float tiny = 1e-40f;
    const float q[2 * 2] = {tiny, -tiny, 1.0f, 0.0f};
    const float k[3 * 2] = {tiny, 0.0f, -0.0f, tiny, 1.0f, -0.0f};
    const float v[3 * 2] = {tiny, -tiny, 2 * tiny, 3e-45f, -0.0f, 5 * tiny};
    sdpa_problem p = util_problem(1, 1, 1, 2, 3, 2, 2);
    cr_expect_eq(check_all_isas(p, q, k, v, 1e-4, "denormals"), 0);
}

/* Two queries against two keys (B = H = 1, Tq = Tk = 2, D = 1) on isa,
 * with a neutral mask: 0 none, 1 an all-zero bias, 2 an all-ones bool mask. */
static sdpa_problem two_keys(sdpa_isa isa, int mask)
{
    static const float zero_bias[4] = {0, 0, 0, 0};
    static const uint8_t ones[4] = {1, 1, 1, 1};
    sdpa_problem p = util_problem(1, 1, 1, 2, 2, 1, 1);
    p.isa = isa;
    if (mask == 1)
        p.bias = (sdpa_bias){zero_bias, 0, 0, 2, 1};
    if (mask == 2)
        p.bool_mask = (sdpa_bool_mask){ones, 0, 0, 2, 1};
    return p;
}

/* REGRESSION (a bug found by the adversarial review, now fixed): a NaN in an ALLOWED V row disappears when
 * its probability underflows to 0 and the key tile is "partial". src/sdpa.c
 * fwd_item passes SDPA_GEMM_SKIP_ZERO_B / _A to the P.V gemm on every partial
 * tile (sdpa.c, the two kt->gemm calls after online_softmax), and a tile is
 * partial as soon as any bool mask or bias is given, or a causal/window edge
 * crosses it. So adding an all-ones boolean mask or an all-zero bias (which
 * change nothing mathematically) turns O from NaN into a finite number.
 * Contract: "A NaN or Inf in an allowed input propagates" (design.md 1); the
 * float64 reference gives exp(-141) * NaN = NaN. */
Test(numerics, bug_nan_in_allowed_v_hidden_by_neutral_mask)
{
    /* two keys, both allowed; score of key 1 = -200/sqrt(1) far below key 0 */
    const float q[2] = {1.0f, 1.0f}, k[2] = {0.0f, -200.0f}, v[2] = {1.0f, NAN};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++)
        for (int variant = 0; variant < 3; variant++) {
            const sdpa_problem p = two_keys(isas[ii], variant);
            float o[2], l[2];
            util_forward_plain(&p, q, k, v, o, l);
            static const char *const names[] = {"no mask", "all-zero bias", "all-ones bool mask"};
            cr_expect(isnan(o[0]) && isnan(o[1]), "[%s] %s: O = (%g, %g), expected NaN (V[1] = NaN is allowed)",
                      sdpa_isa_name(isas[ii]), names[variant], (double)o[0], (double)o[1]);
        }
}

/* REGRESSION (a bug found by the adversarial review, now fixed): the same in the backward. dS is forced to
 * exactly 0 wherever P == 0 (kernels bwd_dscores: "exactly 0 where P == 0"),
 * and the dV / dK / dQ gemms skip zero terms on partial tiles, so a NaN dO row
 * of an allowed query whose P to key 0 underflowed never reaches dV[0] (with a
 * mask) and never reaches dK[0] (even without one). Reference: P = exp(-200),
 * dV[0] = P00 dO0 + P10 dO1 = NaN, dK[0] = NaN. */
Test(numerics, bug_nan_in_allowed_dout_hidden_by_underflow)
{
    const float q[2] = {1.0f, 1.0f}, k[2] = {-200.0f, 0.0f}, v[2] = {1.0f, 2.0f}, dO[2] = {1.0f, NAN};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++)
        for (int variant = 0; variant < 2; variant++) {
            sdpa_problem p = two_keys(isas[ii], variant ? 2 : 0);
            p.use_default_scale = 0;
            p.scale = 1.0f;
            float o[2], l[2], dq[2], dk[2], dv[2];
            const sdpa_tensor tq = util_cview(q, 1, 2, 1), tk = util_cview(k, 1, 2, 1), tv = util_cview(v, 1, 2, 1),
                              tdo = util_cview(dO, 1, 2, 1), oi = util_cview(o, 1, 2, 1), li = util_lse_view(l, 1, 2);
            const sdpa_tensor_out to = util_cview_out(o, 1, 2, 1), tl = util_lse_view_out(l, 1, 2),
                                  odq = util_cview_out(dq, 1, 2, 1), odk = util_cview_out(dk, 1, 2, 1),
                                  odv = util_cview_out(dv, 1, 2, 1);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &oi, &li, &tdo, &odq, &odk, &odv), SDPA_OK);
            cr_expect(isnan(dv[0]) && isnan(dk[0]), "[%s] %s: dV[0] = %g, dK[0] = %g, expected NaN",
                      sdpa_isa_name(isas[ii]), variant ? "all-ones mask" : "no mask", (double)dv[0], (double)dk[0]);
        }
}

/* NaN in an allowed input propagates: a NaN in row i of Q makes O row i and
 * LSE[i] NaN (other rows bitwise unchanged); a NaN in V[j][c] of an allowed key
 * makes column c NaN in every row that attends j (other columns unchanged). */
Test(numerics, nan_in_allowed_inputs_propagates)
{
    const int64_t B = 1, Hq = 2, Hkv = 2, Tq = 40, Tk = 40, Dk = 20, Dv = 19;
    util_rng rng;
    util_rng_seed(&rng, "nan_in_allowed_inputs_propagates", 99);
    sdpa_problem p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    const size_t nq = (size_t)(B * Hq * Tq * Dk), nk = (size_t)(B * Hkv * Tk * Dk),
                 nv = (size_t)(B * Hkv * Tk * Dv), no = (size_t)(B * Hq * Tq * Dv), nl = (size_t)(B * Hq * Tq);
    float *q = util_falloc(nq), *k = util_falloc(nk), *v = util_falloc(nv), *qp = util_falloc(nq), *vp = util_falloc(nv);
    util_fill_normal(&rng, q, nq, 0.5f);
    util_fill_normal(&rng, k, nk, 0.5f);
    util_fill_normal(&rng, v, nv, 1.0f);
    memcpy(qp, q, nq * sizeof(float));
    memcpy(vp, v, nv * sizeof(float));
    const int64_t qi = 17, qc = 3, vj = 25, vc = 11;
    qp[(0 * Tq + qi) * Dk + qc] = NAN;        /* head 0, row 17 */
    vp[(1 * Tk + vj) * Dv + vc] = NAN;        /* head 1, key 25, column 11 */
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        const char *isa = sdpa_isa_name(isas[ii]);
        float *oc = util_galloc(no), *lc = util_galloc(nl), *o = util_galloc(no), *l = util_galloc(nl);
        util_forward_contig(&p, isas[ii], q, k, v, oc, lc);
        cr_expect(!util_has_nan(oc, no) && !util_has_nan(lc, nl), "[%s] clean run has NaN", isa);
        util_forward_contig(&p, isas[ii], qp, k, vp, o, l);
        int bad = 0;
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                const size_t r = (size_t)(h * Tq + i);
                for (int64_t c = 0; c < Dv; c++) {
                    const size_t e = r * (size_t)Dv + (size_t)c;
                    const int want_nan = (h == 0 && i == qi) || (h == 1 && i >= vj && c == vc);
                    if (want_nan ? !isnan(o[e]) : !util_same_bits(o + e, oc + e, 1)) {
                        if (bad++ < 5)
                            cr_log_error("[%s] O[h=%ld][i=%ld][c=%ld] = %g, %s", isa, (long)h, (long)i,
                                         (long)c, (double)o[e], want_nan ? "expected NaN" : "changed");
                    }
                }
                const int lse_nan = h == 0 && i == qi;
                if (lse_nan ? !isnan(l[r]) : !util_same_bits(l + r, lc + r, 1))
                    if (bad++ < 5)
                        cr_log_error("[%s] LSE[h=%ld][i=%ld] = %g", isa, (long)h, (long)i, (double)l[r]);
            }
        cr_expect_eq(bad, 0, "[%s] NaN propagation wrong in %d place(s)", isa, bad);
        util_gfree(oc);
        util_gfree(lc);
        util_gfree(o);
        util_gfree(l);
    }
    free(q);
    free(k);
    free(v);
    free(qp);
    free(vp);
}

/* Smallest form of the propagation contract: one query, one key, Q = NaN.
 * O and LSE must both be NaN (an LSE of -inf would claim "fully masked" and
 * make the backward silently return zero gradients for this row). */
Test(numerics, nan_query_gives_nan_lse)
{
    const float q[1] = {NAN}, k[1] = {1.0f}, v[1] = {2.0f};
    sdpa_problem p = util_problem(1, 1, 1, 1, 1, 1, 1);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        float *o = util_galloc(1), *lse = util_galloc(1);
        util_forward_contig(&p, isas[ii], q, k, v, o, lse);
        cr_expect(isnan(o[0]) && !util_is_sentinel(o[0]), "[%s] O = %g, expected NaN",
                  sdpa_isa_name(isas[ii]), (double)o[0]);
        cr_expect(isnan(lse[0]) && !util_is_sentinel(lse[0]), "[%s] LSE = %g, expected NaN",
                  sdpa_isa_name(isas[ii]), (double)lse[0]);
        util_gfree(o);
        util_gfree(lse);
    }
}
