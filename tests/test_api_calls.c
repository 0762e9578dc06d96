/* SPDX-License-Identifier: MIT */
/* tests/test_api_calls.c - the public API contract beyond the
 * validation table of test_api.c: sdpa_problem_init defaults, zero-sized
 * problems, scale 0 / negative / with Dk = 0, concurrent callers, packed and
 * interleaved outputs, invalid and garbage descriptors that must write nothing,
 * and random interleaved layouts against a brute-force overlap test. */
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

Test(api, problem_init_defaults)
{
    sdpa_problem p;
    memset(&p, 0xab, sizeof p);
    sdpa_problem_init(&p);
    cr_assert_eq(p.struct_size, sizeof(sdpa_problem));
    cr_assert_eq(p.reserved0, 0);
    cr_assert_eq(p.batch, 0);
    cr_assert_eq(p.q_heads, 0);
    cr_assert_eq(p.kv_heads, 0);
    cr_assert_eq(p.q_len, 0);
    cr_assert_eq(p.kv_len, 0);
    cr_assert_eq(p.head_dim_qk, 0);
    cr_assert_eq(p.head_dim_v, 0);
    cr_assert_eq(p.use_default_scale, 1);
    cr_assert_eq(p.causal, SDPA_CAUSAL_NONE);
    cr_assert_eq(p.window_alignment, SDPA_ALIGN_TOP_LEFT);
    cr_assert_eq(p.window_left, SDPA_WINDOW_UNBOUNDED);
    cr_assert_eq(p.window_right, SDPA_WINDOW_UNBOUNDED);
    cr_assert_null(p.kv_lengths);
    cr_assert_null(p.bool_mask.data);
    cr_assert_null(p.bias.data);
    cr_assert_eq(p.num_threads, 0);
    cr_assert_eq(p.isa, SDPA_ISA_AUTO);
    cr_assert_eq(p.block_q, 0);
    cr_assert_eq(p.block_k, 0);
    cr_assert_eq(p.softcap, 0.0f);
    cr_assert_eq(p.reserved1, 0);
    cr_assert_eq(p.fpmath_mode, SDPA_FPMATH_DEFAULT);
    cr_assert_eq(p.q_dtype, SDPA_DTYPE_F32);
    cr_assert_eq(p.kv_dtype, SDPA_DTYPE_F32);
    cr_assert_eq(p.o_dtype, SDPA_DTYPE_F32);
    cr_assert_null(p.alibi_slopes);
    cr_assert_null(p.sinks);
    cr_assert_null(p.dsinks);
    cr_assert_eq(p.diagonal_offset, 0);
    sdpa_problem_init(NULL); /* ignored, no crash */
    /* An all-zero problem is valid (empty). */
    cr_assert_eq(sdpa_forward(&p, &(sdpa_tensor){0}, &(sdpa_tensor){0}, &(sdpa_tensor){0},
                              &(sdpa_tensor_out){0}, NULL),
                 SDPA_ERR_BAD_SCALE, "default scale with Dk = 0 must be refused even when empty");
    p.use_default_scale = 0;
    p.scale = 1.0f;
    cr_assert_eq(sdpa_forward(&p, &(sdpa_tensor){0}, &(sdpa_tensor){0}, &(sdpa_tensor){0},
                              &(sdpa_tensor_out){0}, NULL),
                 SDPA_OK);
}

/* ------------------------------------------------------- zero-sized -- */

/* A guarded buffer of n floats uniform in [-1, 1) from r. */
static float *guniform(util_rng *r, size_t n)
{
    float *x = util_galloc(n);
    util_fill_uniform(r, x, n, -1, 1);
    return x;
}

/* Runs forward and backward of p (contiguous tensors, guarded buffers with the
 * sentinel), on every supported ISA, and checks that exactly the contract's
 * elements are written:
 *   O: 0 where the row has no key (Tk = 0), else untouched if empty;
 *   LSE: -inf when Tk = 0, ref value otherwise;
 *   dQ: 0 in full when Tk = 0; dK, dV: 0 in full when Tq = 0; dQ = dK = 0 when Dv = 0. */
static void check_zero_sized(const char *name, sdpa_problem p, int null_data)
{
    const int64_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, Tq = p.q_len, Tk = p.kv_len;
    const int64_t Dk = p.head_dim_qk, Dv = p.head_dim_v;
    const size_t nq = (size_t)(B * Hq * Tq * Dk), nk = (size_t)(B * Hkv * Tk * Dk),
                 nv = (size_t)(B * Hkv * Tk * Dv), no = (size_t)(B * Hq * Tq * Dv),
                 nl = (size_t)(B * Hq * Tq);
    util_rng r;
    util_rng_init(&r, 99);
    float *q = guniform(&r, nq), *k = guniform(&r, nk), *v = guniform(&r, nv), *dout = guniform(&r, no);
    double *ro = calloc(no + 1, sizeof(double)), *rl = calloc(nl + 1, sizeof(double));
    ref_forward(&p, q, k, v, ro, rl);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        p.isa = isas[ii];
        float *o = util_galloc(no), *lse = util_galloc(nl);
        float *dq = util_galloc(nq), *dk = util_galloc(nk), *dv = util_galloc(nv);
        /* null_data: every empty tensor gets a NULL data pointer */
        const sdpa_tensor tq = util_cview(null_data && !nq ? NULL : q, Hq, Tq, Dk);
        const sdpa_tensor tk = util_cview(null_data && !nk ? NULL : k, Hkv, Tk, Dk);
        const sdpa_tensor tv = util_cview(null_data && !nv ? NULL : v, Hkv, Tk, Dv);
        const sdpa_tensor_out to = util_cview_out(null_data && !no ? NULL : o, Hq, Tq, Dv);
        const sdpa_tensor_out tl = util_lse_view_out(null_data && !nl ? NULL : lse, Hq, Tq);
        char what[200];
        snprintf(what, sizeof what, "%s (%s%s)", name, sdpa_isa_name(isas[ii]),
                 null_data ? ", NULL data" : "");
        cr_expect_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK, "%s: forward", what);
        for (size_t i = 0; i < no; i++)
            cr_expect(Tk == 0 ? (o[i] == 0.0f && !signbit(o[i])) : fabs(o[i] - ro[i]) < 1e-5,
                      "%s: O[%zu] = %g", what, i, (double)o[i]);
        for (size_t i = 0; i < nl; i++)
            cr_expect(Tk == 0 ? (lse[i] == -INFINITY) : fabs(lse[i] - rl[i]) < 1e-5, "%s: LSE[%zu] = %g",
                      what, i, (double)lse[i]);
        cr_expect(util_gintact(o, what) && util_gintact(lse, what), "%s: guard zones", what);

        const sdpa_tensor too = util_cview(null_data && !no ? NULL : o, Hq, Tq, Dv);
        const sdpa_tensor tli = util_lse_view(null_data && !nl ? NULL : lse, Hq, Tq);
        const sdpa_tensor tdo = util_cview(null_data && !no ? NULL : dout, Hq, Tq, Dv);
        const sdpa_tensor_out tdq = util_cview_out(null_data && !nq ? NULL : dq, Hq, Tq, Dk);
        const sdpa_tensor_out tdk = util_cview_out(null_data && !nk ? NULL : dk, Hkv, Tk, Dk);
        const sdpa_tensor_out tdv = util_cview_out(null_data && !nv ? NULL : dv, Hkv, Tk, Dv);
        cr_expect_eq(sdpa_backward(&p, &tq, &tk, &tv, &too, &tli, &tdo, &tdq, &tdk, &tdv), SDPA_OK,
                     "%s: backward", what);
        /* With Tk = 0, Tq = 0 or Dv = 0, every gradient that exists is 0. */
        for (size_t i = 0; i < nq; i++)
            cr_expect(dq[i] == 0.0f, "%s: dQ[%zu] = %g", what, i, (double)dq[i]);
        for (size_t i = 0; i < nk; i++)
            cr_expect(dk[i] == 0.0f, "%s: dK[%zu] = %g", what, i, (double)dk[i]);
        for (size_t i = 0; i < nv; i++)
            cr_expect(dv[i] == 0.0f, "%s: dV[%zu] = %g", what, i, (double)dv[i]);
        cr_expect(util_gintact(dq, what) && util_gintact(dk, what) && util_gintact(dv, what),
                  "%s: gradient guard zones", what);
        util_gfree(o);
        util_gfree(lse);
        util_gfree(dq);
        util_gfree(dk);
        util_gfree(dv);
    }
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
    util_gfree(dout);
    free(ro);
    free(rl);
}

Test(api, zero_sized_problems)
{
    for (int null_data = 0; null_data <= 1; null_data++) {
        check_zero_sized("B = 0", util_problem(0, 2, 1, 5, 6, 4, 3), null_data);
        check_zero_sized("Hq = Hkv = 0", util_problem(2, 0, 0, 5, 6, 4, 3), null_data);
        check_zero_sized("Tq = 0", util_problem(2, 2, 1, 0, 6, 4, 3), null_data);
        check_zero_sized("Tk = 0", util_problem(2, 2, 1, 5, 0, 4, 3), null_data);
        check_zero_sized("Dv = 0", util_problem(2, 2, 1, 5, 6, 4, 0), null_data);
        check_zero_sized("Tq = Tk = 0", util_problem(1, 2, 2, 0, 0, 4, 3), null_data);
        check_zero_sized("Tk = 0, Dv = 0", util_problem(1, 2, 2, 3, 0, 4, 0), null_data);
    }
}

/* Dk = 0 with an explicit scale: every score is 0 (+ bias), P is uniform over
 * the allowed keys, dQ and dK are empty, dV = P^T dO. Checked against the
 * float64 reference. */
Test(api, explicit_scale_with_dk_zero)
{
    sdpa_problem p = util_problem(1, 2, 1, 4, 5, 0, 3);
    p.use_default_scale = 0;
    p.scale = 2.0f;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    const int64_t no = 2 * 4 * 3, nv = 5 * 3;
    util_rng r;
    util_rng_init(&r, 5);
    float *v = util_galloc(nv), *dout = util_galloc(no);
    util_fill_uniform(&r, v, nv, -1, 1);
    util_fill_uniform(&r, dout, no, -1, 1);
    double ro[24], rl[8], rdq[1], rdk[1], rdv[15];
    ref_forward(&p, NULL, NULL, v, ro, rl);
    ref_backward(&p, NULL, NULL, v, dout, rdq, rdk, rdv);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        p.isa = isas[ii];
        float *o = util_galloc(no), *lse = util_galloc(8), *dv = util_galloc(nv);
        const sdpa_tensor tq = util_cview(NULL, 2, 4, 0), tk = util_cview(NULL, 1, 5, 0);
        const sdpa_tensor tv = util_cview(v, 1, 5, 3);
        const sdpa_tensor_out to = util_cview_out(o, 2, 4, 3), tl = util_lse_view_out(lse, 2, 4);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
        util_expect_close("O (Dk = 0)", o, ro, (size_t)no, 1e-6, 1e-5, 0);
        util_expect_close("LSE (Dk = 0)", lse, rl, 8, 1e-6, 1e-5, 0);
        const sdpa_tensor too = util_cview(o, 2, 4, 3), tli = util_lse_view(lse, 2, 4),
                          tdo = util_cview(dout, 2, 4, 3);
        const sdpa_tensor_out tdq = util_cview_out(NULL, 2, 4, 0), tdk = util_cview_out(NULL, 1, 5, 0),
                              tdv = util_cview_out(dv, 1, 5, 3);
        cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &too, &tli, &tdo, &tdq, &tdk, &tdv), SDPA_OK);
        util_expect_close("dV (Dk = 0)", dv, rdv, (size_t)nv, 1e-6, 1e-5, 0);
        cr_expect(util_gintact(o, "O") && util_gintact(lse, "LSE") && util_gintact(dv, "dV"));
        util_gfree(o);
        util_gfree(lse);
        util_gfree(dv);
    }
    util_gfree(v);
    util_gfree(dout);
}

/* Scale 0 and negative scales are legal and computed as given (checked against
 * the float64 reference, forward and backward, on every ISA). */
Test(api, scale_zero_and_negative_are_computed)
{
    const float scales[] = {0.0f, -0.0f, -0.5f, -3.0f};
    sdpa_problem p = util_problem(1, 2, 1, 9, 11, 5, 4);
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    const size_t nq = 2 * 9 * 5, nk = 11 * 5, nv = 11 * 4, no = 2 * 9 * 4, nl = 2 * 9;
    util_rng r;
    util_rng_init(&r, 17);
    float *q = guniform(&r, nq), *k = guniform(&r, nk), *v = guniform(&r, nv), *dout = guniform(&r, no);
    double ro[72], rl[18], rdq[90], rdk[55], rdv[44];
    float no32[72], nl32[18], ndq[90], ndk[55], ndv[44];
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        p.use_default_scale = 0;
        p.scale = scales[si];
        ref_forward(&p, q, k, v, ro, rl);
        ref_backward(&p, q, k, v, dout, rdq, rdk, rdv);
        naive32_forward(&p, q, k, v, no32, nl32);
        naive32_backward(&p, q, k, v, dout, ndq, ndk, ndv);
        for (int ii = 0; ii < ni; ii++) {
            p.isa = isas[ii];
            float o[72], lse[18], dq[90], dk[55], dv[44];
            const sdpa_tensor tq = util_cview(q, 2, 9, 5), tk = util_cview(k, 1, 11, 5),
                              tv = util_cview(v, 1, 11, 4);
            const sdpa_tensor_out to = util_cview_out(o, 2, 9, 4), tl = util_lse_view_out(lse, 2, 9);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            char w[96];
            snprintf(w, sizeof w, "scale %g %s: O", (double)scales[si], sdpa_isa_name(isas[ii]));
            util_fa_expect(w, o, no32, ro, no, 2.0);
            snprintf(w, sizeof w, "scale %g %s: LSE", (double)scales[si], sdpa_isa_name(isas[ii]));
            util_fa_expect(w, lse, nl32, rl, nl, 2.0);
            const sdpa_tensor too = util_cview(o, 2, 9, 4), tli = util_lse_view(lse, 2, 9),
                              tdo = util_cview(dout, 2, 9, 4);
            const sdpa_tensor_out tdq = util_cview_out(dq, 2, 9, 5), tdk = util_cview_out(dk, 1, 11, 5),
                                  tdv = util_cview_out(dv, 1, 11, 4);
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &too, &tli, &tdo, &tdq, &tdk, &tdv), SDPA_OK);
            snprintf(w, sizeof w, "scale %g %s: dQ", (double)scales[si], sdpa_isa_name(isas[ii]));
            util_fa_expect(w, dq, ndq, rdq, nq, 3.0);
            snprintf(w, sizeof w, "scale %g %s: dK", (double)scales[si], sdpa_isa_name(isas[ii]));
            util_fa_expect(w, dk, ndk, rdk, nk, 3.0);
            snprintf(w, sizeof w, "scale %g %s: dV", (double)scales[si], sdpa_isa_name(isas[ii]));
            util_fa_expect(w, dv, ndv, rdv, nv, 3.0);
        }
    }
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
    util_gfree(dout);
}

/* ---------------------------------------------- many callers, one thread each */

/* An inference server calls the library from many threads at once, each call
 * with num_threads = 1. Every call must give the bits of a lone serial call
 * (no shared mutable state, no oversubscription needed). */
enum { CC_THREADS = 6, CC_B = 2, CC_H = 4, CC_HKV = 2, CC_T = 70, CC_D = 24 };
#define CC_NQ ((size_t)CC_B * CC_H * CC_T * CC_D)
#define CC_NK ((size_t)CC_B * CC_HKV * CC_T * CC_D)

typedef struct cc_job {
    const float *q, *k, *v, *dout;
    sdpa_isa isa;
    float o[CC_NQ], lse[CC_B * CC_H * CC_T], dq[CC_NQ], dk[CC_NK], dv[CC_NK];
    int status;
} cc_job;

static void cc_run(cc_job *j)
{
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = CC_B;
    p.q_heads = CC_H;
    p.kv_heads = CC_HKV;
    p.q_len = p.kv_len = CC_T;
    p.head_dim_qk = p.head_dim_v = CC_D;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    p.num_threads = 1;
    p.isa = j->isa;
    const sdpa_tensor tq = util_cview(j->q, CC_H, CC_T, CC_D), tk = util_cview(j->k, CC_HKV, CC_T, CC_D),
                      tv = util_cview(j->v, CC_HKV, CC_T, CC_D);
    const sdpa_tensor_out to = util_cview_out(j->o, CC_H, CC_T, CC_D), tl = util_lse_view_out(j->lse, CC_H, CC_T);
    j->status = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
    if (j->status != SDPA_OK)
        return;
    const sdpa_tensor too = util_cview(j->o, CC_H, CC_T, CC_D), tli = util_lse_view(j->lse, CC_H, CC_T),
                      tdo = util_cview(j->dout, CC_H, CC_T, CC_D);
    const sdpa_tensor_out tdq = util_cview_out(j->dq, CC_H, CC_T, CC_D),
                          tdk = util_cview_out(j->dk, CC_HKV, CC_T, CC_D),
                          tdv = util_cview_out(j->dv, CC_HKV, CC_T, CC_D);
    j->status = sdpa_backward(&p, &tq, &tk, &tv, &too, &tli, &tdo, &tdq, &tdk, &tdv);
}

static void *cc_thread(void *arg)
{
    for (int rep = 0; rep < 3; rep++)
        cc_run(arg);
    return NULL;
}

Test(api, concurrent_callers_single_thread_each, .timeout = 120)
{
    util_rng r;
    util_rng_seed(&r, "api/concurrent_callers", 77);
    float *q = malloc(sizeof(float) * CC_NQ), *dout = malloc(sizeof(float) * CC_NQ);
    float *k = malloc(sizeof(float) * CC_NK), *v = malloc(sizeof(float) * CC_NK);
    cr_assert(q && dout && k && v);
    for (size_t i = 0; i < CC_NQ; i++) {
        q[i] = (float)(util_rng_double(&r) * 2 - 1);
        dout[i] = (float)(util_rng_double(&r) * 2 - 1);
    }
    for (size_t i = 0; i < CC_NK; i++) {
        k[i] = (float)(util_rng_double(&r) * 2 - 1);
        v[i] = (float)(util_rng_double(&r) * 2 - 1);
    }
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        cc_job *serial = calloc(1, sizeof *serial);
        cc_job *jobs = calloc(CC_THREADS, sizeof *jobs);
        cr_assert(serial && jobs);
        *serial = (cc_job){.q = q, .k = k, .v = v, .dout = dout, .isa = isas[ii]};
        cc_run(serial);
        cr_assert_eq(serial->status, SDPA_OK);
        pthread_t th[CC_THREADS];
        for (int t = 0; t < CC_THREADS; t++) {
            jobs[t] = (cc_job){.q = q, .k = k, .v = v, .dout = dout, .isa = isas[ii]};
            cr_assert_eq(pthread_create(&th[t], NULL, cc_thread, &jobs[t]), 0);
        }
        for (int t = 0; t < CC_THREADS; t++)
            pthread_join(th[t], NULL);
        for (int t = 0; t < CC_THREADS; t++) {
            cr_assert_eq(jobs[t].status, SDPA_OK);
            cr_expect(memcmp(jobs[t].o, serial->o, sizeof serial->o) == 0, "%s: caller %d O differs", sdpa_isa_name(isas[ii]), t);
            cr_expect(memcmp(jobs[t].lse, serial->lse, sizeof serial->lse) == 0, "%s: caller %d LSE differs", sdpa_isa_name(isas[ii]), t);
            cr_expect(memcmp(jobs[t].dq, serial->dq, sizeof serial->dq) == 0, "%s: caller %d dQ differs", sdpa_isa_name(isas[ii]), t);
            cr_expect(memcmp(jobs[t].dk, serial->dk, sizeof serial->dk) == 0, "%s: caller %d dK differs", sdpa_isa_name(isas[ii]), t);
            cr_expect(memcmp(jobs[t].dv, serial->dv, sizeof serial->dv) == 0, "%s: caller %d dV differs", sdpa_isa_name(isas[ii]), t);
        }
        free(serial);
        free(jobs);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
}

/* ------------------------------------------ interleaved, disjoint outputs */

/* dQ, dK, dV written straight into one packed [B,T,3,H,D] buffer (and O into
 * the 4th slot of a packed [B,T,4,H,D] activation holding Q, K, V): the views
 * interleave but share no element, so they are accepted and give the bits of
 * separate buffers. One element of overlap is still refused. */
Test(api, packed_interleaved_outputs)
{
    enum { B = 2, T = 33, H = 4, D = 16 };
    const int64_t bs4 = (int64_t)T * 4 * H * D, ss4 = 4 * H * D; /* [B,T,4,H,D] */
    const int64_t bs3 = (int64_t)T * 3 * H * D, ss3 = 3 * H * D; /* [B,T,3,H,D] */
    float *act = calloc((size_t)B * bs4, sizeof(float));
    float *dqkv = calloc((size_t)B * bs3, sizeof(float));
    float *dout = calloc((size_t)B * T * H * D, sizeof(float));
    float *lse = calloc((size_t)B * H * T, sizeof(float));
    float *sep = calloc((size_t)3 * B * H * T * D, sizeof(float));
    cr_assert(act && dqkv && dout && lse && sep);
    util_rng r;
    util_rng_seed(&r, "api/packed_interleaved_outputs", 5);
    for (int64_t i = 0; i < B * bs4; i++)
        act[i] = (float)(util_rng_double(&r) * 2 - 1);
    for (int64_t i = 0; i < (int64_t)B * T * H * D; i++)
        dout[i] = (float)(util_rng_double(&r) * 2 - 1);
    sdpa_problem p = util_problem(B, H, H, T, T, D, D);
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    const sdpa_tensor q = {act, bs4, D, ss4}, k = {act + H * D, bs4, D, ss4}, v = {act + 2 * H * D, bs4, D, ss4};
    const sdpa_tensor_out o = {act + 3 * H * D, bs4, D, ss4}, l = {lse, (int64_t)H * T, T, 1};
    cr_assert_eq(sdpa_forward(&p, &q, &k, &v, &o, &l), SDPA_OK, "O in the 4th slot of packed QKVO refused");
    const sdpa_tensor oi = {act + 3 * H * D, bs4, D, ss4}, li = {lse, (int64_t)H * T, T, 1},
                      doi = {dout, (int64_t)T * H * D, D, (int64_t)H * D};
    const sdpa_tensor_out dq = {dqkv, bs3, D, ss3}, dk = {dqkv + H * D, bs3, D, ss3}, dv = {dqkv + 2 * H * D, bs3, D, ss3};
    cr_assert_eq(sdpa_backward(&p, &q, &k, &v, &oi, &li, &doi, &dq, &dk, &dv), SDPA_OK, "packed dQKV refused");
    /* the same into separate contiguous [B,T,H,D] buffers */
    float *sq = sep, *sk = sep + B * H * T * D, *sv = sep + 2 * B * H * T * D;
    const sdpa_tensor_out dq2 = {sq, (int64_t)T * H * D, D, (int64_t)H * D}, dk2 = {sk, (int64_t)T * H * D, D, (int64_t)H * D},
                          dv2 = {sv, (int64_t)T * H * D, D, (int64_t)H * D};
    cr_assert_eq(sdpa_backward(&p, &q, &k, &v, &oi, &li, &doi, &dq2, &dk2, &dv2), SDPA_OK);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int c = 0; c < D; c++) {
                    const int64_t pk = b * bs3 + t * ss3 + h * D + c, sp = ((int64_t)(b * T + t) * H + h) * D + c;
                    cr_assert(memcmp(&dqkv[pk], &sq[sp], 4) == 0 && memcmp(&dqkv[pk + H * D], &sk[sp], 4) == 0 &&
                                  memcmp(&dqkv[pk + 2 * H * D], &sv[sp], 4) == 0,
                              "packed and separate gradients differ at b=%d t=%d h=%d c=%d", b, t, h, c);
                }
    /* dK shifted by one element into dQ's rows: overlap, refused, nothing written */
    memset(dqkv, 0x7f, (size_t)B * bs3 * sizeof(float));
    const sdpa_tensor_out dk_bad = {dqkv + H * D - 1, bs3, D, ss3};
    cr_assert_eq(sdpa_backward(&p, &q, &k, &v, &oi, &li, &doi, &dq, &dk_bad, &dv), SDPA_ERR_ALIASING);
    for (int64_t i = 0; i < B * bs3; i++) {
        uint32_t bits;
        memcpy(&bits, &dqkv[i], 4);
        cr_assert_eq(bits, 0x7f7f7f7fu, "output written although the call was refused");
    }
    free(act);
    free(dqkv);
    free(dout);
    free(lse);
    free(sep);
}

typedef struct inv_env {
    float *q, *k, *v, *o, *l, *dq, *dk, *dv, *dO;
    float *snap[9];
} inv_env;

enum { IV_T = 4, IV_D = 3, IV_N = IV_T * IV_D };

static void inv_snap(inv_env *e)
{
    float *b[9] = {e->q, e->k, e->v, e->o, e->l, e->dq, e->dk, e->dv, e->dO};
    for (int i = 0; i < 9; i++)
        e->snap[i] = util_gdup(b[i], util_glen(b[i]));
}

static int inv_unchanged(const inv_env *e)
{
    const float *b[9] = {e->q, e->k, e->v, e->o, e->l, e->dq, e->dk, e->dv, e->dO};
    for (int i = 0; i < 9; i++) {
        const size_t n = util_glen(b[i]) + 2 * UTIL_GUARD_FLOATS;
        if (memcmp(b[i] - UTIL_GUARD_FLOATS, e->snap[i] - UTIL_GUARD_FLOATS, n * sizeof(float)) != 0)
            return 0;
    }
    return 1;
}

/* Each invalid call must return its status and write nothing (guards included). */
Test(api, invalid_arguments_write_nothing)
{
    inv_env e;
    e.q = util_galloc_fill(IV_N, 0.5f);
    e.k = util_galloc_fill(IV_N, 0.25f);
    e.v = util_galloc_fill(IV_N, 1.0f);
    e.dO = util_galloc_fill(IV_N, 1.0f);
    e.o = util_galloc(IV_N);
    e.l = util_galloc(IV_T);
    e.dq = util_galloc(IV_N);
    e.dk = util_galloc(IV_N);
    e.dv = util_galloc(IV_N);
    inv_snap(&e);
    float *kvbuf = util_galloc_fill(IV_N, 0.0f);
    const int32_t four = 4;
    memcpy(kvbuf + 5, &four, sizeof four);
    float *kvsnap = util_gdup(kvbuf, IV_N);
    int32_t kvl[2] = {4, 4}, kvl_bad[1] = {INT32_MIN};
    const sdpa_tensor q = {e.q, IV_N, IV_N, IV_D}, k = {e.k, IV_N, IV_N, IV_D}, v = {e.v, IV_N, IV_N, IV_D},
                      dO = {e.dO, IV_N, IV_N, IV_D}, oin = {e.v, IV_N, IV_N, IV_D}, lin = {e.q, IV_T, IV_T, 1};
    const sdpa_tensor_out o = {e.o, IV_N, IV_N, IV_D}, l = {e.l, IV_T, IV_T, 1}, dq = {e.dq, IV_N, IV_N, IV_D},
                          dk = {e.dk, IV_N, IV_N, IV_D}, dv = {e.dv, IV_N, IV_N, IV_D};
    struct {
        const char *name;
        sdpa_status want;
        sdpa_problem p;
        sdpa_tensor_out o, l, dq;
    } c[40];
    int n = 0;
#define CASE(nm, st, ...)                                                                                          \
    do {                                                                                                           \
        c[n].name = nm;                                                                                            \
        c[n].want = st;                                                                                            \
        c[n].p = util_problem(1, 1, 1, IV_T, IV_T, IV_D, IV_D);                                                            \
        c[n].o = o;                                                                                                \
        c[n].l = l;                                                                                                \
        c[n].dq = dq;                                                                                              \
        {                                                                                                          \
            sdpa_problem *PP = &c[n].p;                                                                             \
            (void)PP;                                                                                              \
            __VA_ARGS__;                                                                                           \
        }                                                                                                          \
        n++;                                                                                                       \
    } while (0)
    CASE("struct_size garbage", SDPA_ERR_BAD_DESCRIPTOR, PP->struct_size = 0xdeadbeef);
    CASE("struct_size one less", SDPA_ERR_BAD_DESCRIPTOR, PP->struct_size -= 1);
    CASE("diagonal_offset below the limit", SDPA_ERR_BAD_WINDOW, PP->diagonal_offset = -SDPA_MAX_DIAGONAL_OFFSET - 1);
    CASE("fpmath_mode", SDPA_ERR_BAD_DESCRIPTOR, PP->fpmath_mode = (sdpa_fpmath_mode)2);
    CASE("causal 3", SDPA_ERR_BAD_DESCRIPTOR, PP->causal = (sdpa_causal)3);
    CASE("causal -1", SDPA_ERR_BAD_DESCRIPTOR, PP->causal = (sdpa_causal)-1);
    CASE("alignment 2", SDPA_ERR_BAD_DESCRIPTOR, PP->window_alignment = (sdpa_alignment)2);
    CASE("use_default_scale 2", SDPA_ERR_BAD_DESCRIPTOR, PP->use_default_scale = 2);
    CASE("isa SDPA_ISA_COUNT", SDPA_ERR_BAD_DESCRIPTOR, PP->isa = (sdpa_isa)SDPA_ISA_COUNT);
    CASE("isa -2", SDPA_ERR_BAD_DESCRIPTOR, PP->isa = (sdpa_isa)-2);
    CASE("B INT64_MIN", SDPA_ERR_NEGATIVE_SIZE, PP->batch = INT64_MIN);
    CASE("Dv -1", SDPA_ERR_NEGATIVE_SIZE, PP->head_dim_v = -1);
    CASE("Hkv 0", SDPA_ERR_HEAD_GROUPING, PP->kv_heads = 0);
    CASE("Hq 3 Hkv 2", SDPA_ERR_HEAD_GROUPING, PP->q_heads = 3; PP->kv_heads = 2);
    CASE("scale NaN", SDPA_ERR_BAD_SCALE, PP->use_default_scale = 0; PP->scale = NAN);
    CASE("scale -inf", SDPA_ERR_BAD_SCALE, PP->use_default_scale = 0; PP->scale = -INFINITY);
    CASE("window_left INT64_MIN", SDPA_ERR_BAD_WINDOW, PP->window_left = INT64_MIN);
    CASE("window_right -2", SDPA_ERR_BAD_WINDOW, PP->window_right = -2);
    CASE("num_threads INT_MIN", SDPA_ERR_BAD_THREADS, PP->num_threads = INT32_MIN);
    CASE("block_q 513", SDPA_ERR_BAD_BLOCK_SIZE, PP->block_q = SDPA_MAX_BLOCK + 1);
    CASE("block_k INT_MIN", SDPA_ERR_BAD_BLOCK_SIZE, PP->block_k = INT32_MIN);
    CASE("Dk > INT32_MAX", SDPA_ERR_SIZE_OVERFLOW, PP->head_dim_qk = (int64_t)INT32_MAX + 1);
    CASE("kv_lengths INT32_MIN", SDPA_ERR_BAD_KV_LENGTH, PP->kv_lengths = kvl_bad);
    CASE("kv_lengths > Tk", SDPA_ERR_BAD_KV_LENGTH, PP->kv_len = 3; PP->kv_lengths = kvl);
    CASE("bool mask stride INT64_MIN", SDPA_ERR_BAD_STRIDE,
         PP->bool_mask = (sdpa_bool_mask){(const uint8_t *)e.q, 0, 0, 0, INT64_MIN});
    CASE("bias extent overflow", SDPA_ERR_SIZE_OVERFLOW, PP->bias = (sdpa_bias){e.q, 0, 0, INT64_MAX, INT64_MAX});
    CASE("Tq INT64_MAX (Q broadcast, O real)", SDPA_ERR_SIZE_OVERFLOW, PP->q_len = INT64_MAX);
    CASE("output overlaps the bias", SDPA_ERR_ALIASING, PP->bias = (sdpa_bias){e.o + 2, 0, 0, 0, 0});
    CASE("output overlaps kv_lengths", SDPA_ERR_ALIASING, c[n].o.data = kvbuf;
         PP->kv_lengths = (const int32_t *)(kvbuf + 5));
    CASE("output overlaps the bool mask", SDPA_ERR_ALIASING,
         PP->bool_mask = (sdpa_bool_mask){(const uint8_t *)e.o + 7, 0, 0, 0, 0});
    CASE("LSE inside O", SDPA_ERR_ALIASING, c[n].l.data = e.o + 1);
    CASE("O seq stride 0", SDPA_ERR_BAD_STRIDE, c[n].o.seq_stride = 0);
    CASE("O rows overlap (stride D-1)", SDPA_ERR_BAD_STRIDE, c[n].o.seq_stride = IV_D - 1);
    CASE("LSE stride -1", SDPA_ERR_BAD_STRIDE, c[n].l.seq_stride = -1);
    CASE("O stride INT64_MAX", SDPA_ERR_SIZE_OVERFLOW, c[n].o.seq_stride = INT64_MAX);
    CASE("NULL O data", SDPA_ERR_NULL_ARGUMENT, c[n].o.data = NULL);
    CASE("dQ overlaps the LSE input", SDPA_ERR_ALIASING, c[n].dq.data = e.q + 2);
#undef CASE
    for (int i = 0; i < n; i++) {
        const int bwd_only = strncmp(c[i].name, "dQ", 2) == 0;
        if (!bwd_only) {
            const sdpa_status st = sdpa_forward(&c[i].p, &q, &k, &v, &c[i].o, &c[i].l);
            cr_expect_eq(st, c[i].want, "forward, %s: status %d (%s), want %d", c[i].name, (int)st,
                         sdpa_status_string(st), (int)c[i].want);
            cr_expect(inv_unchanged(&e), "forward, %s: an output was written", c[i].name);
        }
        const int fwd_only = strncmp(c[i].name, "LSE", 3) == 0 || strncmp(c[i].name, "O ", 2) == 0 ||
                             strncmp(c[i].name, "NULL O", 6) == 0;
        if (!fwd_only) {
            sdpa_tensor_out dqo = c[i].dq;
            if (strncmp(c[i].name, "output overlaps", 15) == 0)
                dqo.data = c[i].o.data; /* the same overlap, through dQ */
            const sdpa_status st = sdpa_backward(&c[i].p, &q, &k, &v, &oin, &lin, &dO, &dqo, &dk, &dv);
            cr_expect_eq(st, c[i].want, "backward, %s: status %d (%s), want %d", c[i].name, (int)st,
                         sdpa_status_string(st), (int)c[i].want);
            cr_expect(inv_unchanged(&e), "backward, %s: an output was written", c[i].name);
        }
    }
    cr_expect(memcmp(kvbuf - UTIL_GUARD_FLOATS, kvsnap - UTIL_GUARD_FLOATS,
                     (IV_N + 2 * UTIL_GUARD_FLOATS) * sizeof(float)) == 0,
              "the buffer holding kv_lengths was written");
    util_gfree(kvbuf);
    util_gfree(kvsnap);
    float *all[9] = {e.q, e.k, e.v, e.o, e.l, e.dq, e.dk, e.dv, e.dO};
    for (int i = 0; i < 9; i++) {
        util_gfree(all[i]);
        util_gfree(e.snap[i]);
    }
}

/* A descriptor full of garbage is refused; a valid one whose enum and int
 * fields are garbage either fails without writing or computes the reference. */
Test(api, garbage_descriptors, .timeout = 120)
{
    util_rng r;
    util_rng_seed(&r, "adversarial.garbage_descriptors", 11);
    const int64_t T = 6, D = 3;
    float *q = util_galloc(T * D), *k = util_galloc(T * D), *v = util_galloc(T * D);
    util_fill_normal(&r, q, T * D, 1.0f);
    util_fill_normal(&r, k, T * D, 1.0f);
    util_fill_normal(&r, v, T * D, 1.0f);
    const sdpa_tensor tq = util_cview(q, 1, T, D), tk = util_cview(k, 1, T, D), tv = util_cview(v, 1, T, D);
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        sdpa_problem p;
        unsigned char *raw = (unsigned char *)&p;
        for (size_t i = 0; i < sizeof p; i++)
            raw[i] = (unsigned char)util_rng_u64(&r);
        float *o = util_galloc(T * D), *l = util_galloc(T);
        const sdpa_tensor_out to = util_cview_out(o, 1, T, D), tl = util_lse_view_out(l, 1, T);
        sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        if (p.struct_size != sizeof p && st != SDPA_ERR_BAD_DESCRIPTOR && bad++ < 5)
            cr_log_error("random bytes: status %d", (int)st);
        /* now a valid frame with garbage in the enums and integers */
        sdpa_problem g = p;
        sdpa_problem_init(&p);
        p.batch = p.q_heads = p.kv_heads = 1;
        p.q_len = p.kv_len = T;
        p.head_dim_qk = p.head_dim_v = D;
        const int pick_field = (int)util_rng_int(&r, 0, 9);
        const int64_t small_wins[] = {-3, -1, 0, 1, 2, 7, INT64_MAX, INT64_MIN, g.window_left, g.window_right};
        switch (pick_field) {
        case 0: p.causal = g.causal; break;
        case 1: p.window_alignment = g.window_alignment; p.window_left = small_wins[util_rng_int(&r, 0, 9)]; break;
        case 2: p.use_default_scale = g.use_default_scale; p.scale = g.scale; break;
        case 3: p.isa = g.isa; break;
        case 4: p.num_threads = g.num_threads < 0 || g.num_threads > 8 ? -abs(g.num_threads % 1000) - 1 : g.num_threads; break;
        case 5: p.block_q = g.block_q; p.block_k = (int)util_rng_int(&r, -2, 600); break;
        case 6: p.window_left = small_wins[util_rng_int(&r, 0, 9)]; p.window_right = small_wins[util_rng_int(&r, 0, 9)];
                p.causal = (sdpa_causal)util_rng_int(&r, 0, 2); break;
        case 7: p.reserved0 = g.reserved0; break;
        case 8: p.diagonal_offset = g.diagonal_offset; break;
        default: p.use_default_scale = 0; p.scale = g.scale; p.causal = (sdpa_causal)util_rng_int(&r, 0, 2); break;
        }
        util_gfree(o);
        util_gfree(l);
        o = util_galloc(T * D);
        l = util_galloc(T);
        const sdpa_tensor_out to2 = util_cview_out(o, 1, T, D), tl2 = util_lse_view_out(l, 1, T);
        st = sdpa_forward(&p, &tq, &tk, &tv, &to2, &tl2);
        if (st != SDPA_OK) {
            int written = 0;
            for (int64_t i = 0; i < T * D; i++)
                written |= !util_is_sentinel(o[i]);
            for (int64_t i = 0; i < T; i++)
                written |= !util_is_sentinel(l[i]);
            if (written && bad++ < 5)
                cr_log_error("field %d: status %d but outputs were written", pick_field, (int)st);
        } else if (p.use_default_scale || fabsf(p.scale) <= 10.0f) {
            double ro[3], rl;
            for (int64_t i = 0; i < T; i++) {
                ref_forward_row(&p, &tq, &tk, &tv, 0, 0, i, ro, &rl);
                int ok = util_close_tol(l[i], rl, 1e-4 * (1 + fabs(rl)));
                for (int c = 0; c < D; c++)
                    ok = ok && util_close_tol(o[i * D + c], ro[c], 1e-4 * (1 + fabs(ro[c])));
                if (!ok && bad++ < 5)
                    cr_log_error("field %d (causal %d wl %ld wr %ld scale %g): row %ld LSE %g vs %g", pick_field,
                                 (int)p.causal, (long)p.window_left, (long)p.window_right, (double)p.scale, (long)i,
                                 (double)l[i], rl);
            }
        }
        cr_expect(util_gintact(o, "O") && util_gintact(l, "LSE"));
        util_gfree(o);
        util_gfree(l);
    }
    cr_expect_eq(bad, 0, "%d garbage descriptor(s) mishandled", bad);
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
}

/* dQ, dK, dV as views of one buffer with random nested layouts (dimension order,
 * padding, room for interleaving) and random relative offsets. Against a
 * brute-force element overlap: any shared element must give SDPA_ERR_ALIASING
 * and leave the buffer untouched; views of one layout that share nothing must
 * be accepted (the aliasing test is exact for them) and give the bits of
 * separate buffers, touching nothing else. */
typedef struct lay {
    int64_t s[3]; /* batch, head, seq strides */
    int64_t extent;
} lay;

static lay random_layout(util_rng *r, const int64_t n[3], int64_t D)
{
    int order[3] = {0, 1, 2};
    for (int i = 2; i > 0; i--) {
        const int j = (int)util_rng_int(r, 0, i), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    lay L;
    int64_t E = D + util_rng_int(r, 0, 1); /* row length with optional padding */
    for (int i = 0; i < 3; i++) {          /* innermost first */
        const int d = order[i];
        L.s[d] = E * util_rng_int(r, 1, 3) + util_rng_int(r, 0, 1);
        E = L.s[d] * (n[d] - 1) + E;
    }
    L.extent = E;
    return L;
}

static void mark(uint8_t *m, int64_t off, const lay *L, const int64_t n[3], int64_t D)
{
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t h = 0; h < n[1]; h++)
            for (int64_t t = 0; t < n[2]; t++)
                for (int64_t c = 0; c < D; c++)
                    m[off + b * L->s[0] + h * L->s[1] + t * L->s[2] + c] = 1;
}

Test(api, interleaved_outputs_random_layouts, .timeout = 120)
{
    util_rng r;
    util_rng_seed(&r, "adversarial.interleaved", 21);
    int bad = 0, accepted = 0, refused = 0;
    for (int it = 0; it < 400 && bad < 5; it++) {
        const int64_t B = util_rng_int(&r, 1, 2), H = util_rng_int(&r, 1, 3), T = util_rng_int(&r, 1, 5),
                      D = util_rng_int(&r, 1, 4);
        const int64_t n[3] = {B, H, T};
        const int same = util_rng_int(&r, 0, 3) != 0;
        lay L[3];
        L[0] = random_layout(&r, n, D);
        for (int v = 1; v < 3; v++)
            L[v] = same ? L[0] : random_layout(&r, n, D);
        int64_t maxext = 0;
        for (int v = 0; v < 3; v++)
            maxext = L[v].extent > maxext ? L[v].extent : maxext;
        int64_t off[3];
        for (int v = 0; v < 3; v++) {
            /* a multiple of a stride or row length, plus a small jitter */
            const int64_t unit = util_rng_int(&r, 0, 1) ? L[0].s[util_rng_int(&r, 0, 2)] : D;
            off[v] = util_rng_int(&r, 0, 3) * unit + (util_rng_int(&r, 0, 4) == 0 ? util_rng_int(&r, 0, 2) : 0);
        }
        const int64_t size = off[0] + off[1] + off[2] + maxext + 1;
        uint8_t *m[3];
        int overlap = 0;
        for (int v = 0; v < 3; v++) {
            m[v] = calloc((size_t)size, 1);
            mark(m[v], off[v], &L[v], n, D);
        }
        for (int64_t e = 0; e < size; e++)
            overlap |= (m[0][e] + m[1][e] + m[2][e]) > 1;
        /* inputs: separate contiguous tensors */
        sdpa_problem p = util_problem(B, H, H, T, T, D, D);
        p.causal = (sdpa_causal)util_rng_int(&r, 0, 2);
        const size_t ne = (size_t)(B * H * T * D);
        float *q = malloc(ne * sizeof(float)), *k = malloc(ne * sizeof(float)), *vv = malloc(ne * sizeof(float)),
              *dO = malloc(ne * sizeof(float)), *o = malloc(ne * sizeof(float)), *l = malloc((size_t)(B * H * T) * sizeof(float));
        util_fill_normal(&r, q, ne, 1.0f);
        util_fill_normal(&r, k, ne, 1.0f);
        util_fill_normal(&r, vv, ne, 1.0f);
        util_fill_normal(&r, dO, ne, 1.0f);
        const sdpa_tensor tq = util_cview(q, H, T, D), tk = util_cview(k, H, T, D), tv = util_cview(vv, H, T, D),
                          tdo = util_cview(dO, H, T, D), to = util_cview(o, H, T, D), tl = util_lse_view(l, H, T);
        const sdpa_tensor_out wo = util_cview_out(o, H, T, D), wl = util_lse_view_out(l, H, T);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &wo, &wl), SDPA_OK);
        /* reference gradients into separate buffers */
        float *sep[3];
        for (int v = 0; v < 3; v++)
            sep[v] = malloc(ne * sizeof(float));
        const sdpa_tensor_out s0 = util_cview_out(sep[0], H, T, D), s1 = util_cview_out(sep[1], H, T, D),
                              s2 = util_cview_out(sep[2], H, T, D);
        cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &s0, &s1, &s2), SDPA_OK);
        float *buf = util_galloc((size_t)size);
        sdpa_tensor_out g[3];
        for (int v = 0; v < 3; v++)
            g[v] = (sdpa_tensor_out){buf + off[v], L[v].s[0], L[v].s[1], L[v].s[2]};
        const sdpa_status st = sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &g[0], &g[1], &g[2]);
        char what[200];
        snprintf(what, sizeof what, "it %d B=%ld H=%ld T=%ld D=%ld same=%d off=%ld,%ld,%ld overlap=%d", it, (long)B,
                 (long)H, (long)T, (long)D, same, (long)off[0], (long)off[1], (long)off[2], overlap);
        if (overlap || st != SDPA_OK) {
            refused += st == SDPA_ERR_ALIASING;
            int untouched = 1;
            for (int64_t e = 0; e < size; e++)
                untouched &= util_is_sentinel(buf[e]);
            if ((overlap && st != SDPA_ERR_ALIASING) || (!overlap && !(st == SDPA_ERR_ALIASING && !same)) || !untouched)
                if (bad++ < 5)
                    cr_log_error("status %d, untouched %d: %s", (int)st, untouched, what);
        } else {
            accepted++;
            int ok = 1;
            for (int v = 0; v < 3; v++)
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t t = 0; t < T; t++)
                            ok &= util_same_bits(buf + off[v] + b * L[v].s[0] + h * L[v].s[1] + t * L[v].s[2],
                                            sep[v] + ((b * H + h) * T + t) * D, (size_t)D);
            for (int64_t e = 0; e < size; e++)
                if (!m[0][e] && !m[1][e] && !m[2][e])
                    ok &= util_is_sentinel(buf[e]);
            ok &= util_gintact(buf, "packed gradients");
            if (!ok && bad++ < 5)
                cr_log_error("accepted but wrong or wrote outside the views: %s", what);
        }
        util_gfree(buf);
        for (int v = 0; v < 3; v++) {
            free(m[v]);
            free(sep[v]);
        }
        free(q);
        free(k);
        free(vv);
        free(dO);
        free(o);
        free(l);
    }
    cr_log_info("interleaved layouts: %d accepted, %d refused", accepted, refused);
    cr_expect_eq(bad, 0, "%d wrong aliasing decision(s)", bad);
    cr_expect_gt(accepted, 20);
    cr_expect_gt(refused, 20);
}

/* ============================================================ bugs ===== */

/* ------------------------------------------------------------------------
 * Issue 14 (hardening): overflow descriptors for both passes, NULL data views
 * with Dk = 0, and status strings that name their cause. Each test failed on
 * the tree before the fixes (eafc80f): see the comment on each. */

/* One descriptor near an integer limit. Inputs are stride-0 views of a small
 * buffer (O, LSE, dO, V, and Q, K when Dk > 0); Dk = 0 leaves Q, K, dQ, dK
 * without data. The outputs are guarded buffers that must stay untouched. */
typedef struct ovf_case {
    const char *what;
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int fwd; /* also run the forward (its O/LSE are bounded by the check that fails) */
    int64_t k_seq_stride;   /* 0: broadcast */
    int64_t bias_key_stride, mask_query_stride; /* -1: no bias / no mask */
} ovf_case;

static void ovf_run(const ovf_case *c, int threads)
{
    const int64_t P62 = (int64_t)1 << 62;
    (void)P62;
    sdpa_problem p = util_problem(c->B, c->Hq, c->Hkv, c->Tq, c->Tk, c->Dk, c->Dv);
    p.use_default_scale = 0;
    p.scale = 0.5f;
    p.num_threads = threads;
    float *in = util_galloc_fill(64, 0.25f);
    float *lse_in = util_galloc_fill(64, 1.0f);
    uint8_t mask[64];
    memset(mask, 1, sizeof mask);
    if (c->bias_key_stride >= 0) {
        p.bias.data = in;
        p.bias.key_stride = c->bias_key_stride;
    }
    if (c->mask_query_stride >= 0) {
        p.bool_mask.data = mask;
        p.bool_mask.query_stride = c->mask_query_stride;
        p.bool_mask.key_stride = 1;
    }
    const float *qk = c->Dk ? in : NULL;
    sdpa_tensor q = {qk, 0, 0, 0}, k = {qk, 0, 0, c->k_seq_stride}, v = {in, 0, 0, 0};
    sdpa_tensor o_in = {in, 0, 0, 0}, lse = {lse_in, 0, 0, 0}, dout = {in, 0, 0, 0};
    /* Outputs: dense [1,1,1,D] views where the sizes are 1, else dense strides
     * of the whole (huge) tensor, which the library must reject before writing. */
    float *dq_b = util_galloc(64), *dk_b = util_galloc(64), *dv_b = util_galloc(64);
    float *o_b = util_galloc(64), *l_b = util_galloc(64);
    const int64_t big = INT64_MAX / 4;
    sdpa_tensor_out dq = {c->Dk ? dq_b : NULL, big, big, c->Dk};
    sdpa_tensor_out dk = {c->Dk ? dk_b : NULL, big, big, c->Dk};
    sdpa_tensor_out dv = {dv_b, c->Hkv * c->Tk * c->Dv, c->Tk * c->Dv, c->Dv};
    if (c->Hkv <= 1 && c->Tk <= 1 && c->B <= 1)
        dv.batch_stride = dv.head_stride = c->Dv;
    sdpa_tensor_out o = {o_b, big, big, c->Dv}, lo = {l_b, big, big, 1};

    char w[256];
    snprintf(w, sizeof w, "%s (threads %d)", c->what, threads);
    sdpa_status st = sdpa_backward(&p, &q, &k, &v, &o_in, &lse, &dout, &dq, &dk, &dv);
    cr_expect(st == SDPA_ERR_SIZE_OVERFLOW || st == SDPA_ERR_OUT_OF_MEMORY,
              "%s: backward returned %d (%s), expected SIZE_OVERFLOW or OUT_OF_MEMORY", w, st,
              sdpa_status_string(st));
    if (c->fwd) {
        st = sdpa_forward(&p, &q, &k, &v, &o, &lo);
        cr_expect(st == SDPA_ERR_SIZE_OVERFLOW || st == SDPA_ERR_OUT_OF_MEMORY,
                  "%s: forward returned %d (%s), expected SIZE_OVERFLOW or OUT_OF_MEMORY", w, st,
                  sdpa_status_string(st));
    }
    float *outs[] = {dq_b, dk_b, dv_b, o_b, l_b};
    const char *names[] = {"dQ", "dK", "dV", "O", "LSE"};
    for (int i = 0; i < 5; i++) {
        cr_expect(util_gintact(outs[i], names[i]), "%s: %s guard zone written", w, names[i]);
        for (size_t j = 0; j < 64; j++)
            if (!util_is_sentinel(outs[i][j])) {
                cr_expect(0, "%s: %s[%zu] written on error", w, names[i], j);
                break;
            }
    }
    for (int i = 0; i < 5; i++)
        util_gfree(outs[i]);
    util_gfree(in);
    util_gfree(lse_in);
}

/* Defect 1 (issue 14): with Dk = 0 no output bounds B*Hq*Tq. Before the fix,
 * Hq = 2^60 made the backward's workspace size wrap and the D rows were written
 * past a small allocation (SIGSEGV: this test crashed); B = Hq = Tq = 2^21
 * overflowed int64 (UB) and came back as BAD_STRIDE. Sizes, strides near 2^31,
 * 2^62 and INT64_MAX, stride-0 inputs: SIZE_OVERFLOW or OUT_OF_MEMORY, nothing
 * written, never a crash. */
Test(api, overflow_descriptors_both_passes, .timeout = 120)
{
    const int64_t P31 = (int64_t)1 << 31, P21 = (int64_t)1 << 21, P62 = (int64_t)1 << 62;
    const int64_t P60 = (int64_t)1 << 60, MX = INT64_MAX;
    const ovf_case cases[] = {
        {"Hq = 2^60, Dk = 0 (workspace size wraps)", 1, P60, 1, 1, 1, 0, 1, 0, 0, -1, -1},
        {"B = Hq = Tq = 2^21 (B*Hq*Tq > INT64_MAX)", P21, P21, 1, P21, 1, 0, 1, 1, 0, -1, -1},
        {"Hq = Tq = 2^31, Dk = 0 (4 rows of D per query row wrap)", 1, P31, 1, P31, 1, 0, 1, 0, 0, -1, -1},
        {"Hq = INT64_MAX, Dk = 0", 1, MX, 1, 1, 1, 0, 1, 0, 0, -1, -1},
        {"Tq = INT64_MAX, Dk = 0", 1, 1, 1, MX, 1, 0, 1, 0, 0, -1, -1},
        {"Tq = 2^62, Dk = 0, Dv = 2", 1, 1, 1, P62, 1, 0, 2, 0, 0, -1, -1},
        {"B = 2, Hq = 2^62 (B*Hq overflows)", 2, P62, 1, 1, 1, 0, 1, 1, 0, -1, -1},
        {"B = 4, Hkv = Hq = 2^62, Tk = 1 (B*Hkv*Tk overflows)", 4, P62, P62, 1, 1, 0, 1, 1, 0, -1, -1},
        {"Tk = INT64_MAX, Dk = 0 (dV extent)", 1, 1, 1, 1, MX, 0, 1, 0, 0, -1, -1},
        {"Dk = 2^31 (head_dim > INT32_MAX)", 1, 1, 1, 1, 1, P31, 1, 1, 0, -1, -1},
        {"Dv = 2^31 (head_dim > INT32_MAX)", 1, 1, 1, 1, 1, 0, P31, 1, 0, -1, -1},
        {"K seq_stride = INT64_MAX / 2, Tk = 3", 1, 1, 1, 1, 3, 4, 1, 1, MX / 2, -1, -1},
        {"K seq_stride = 2^62, Tk = 3", 1, 1, 1, 1, 3, 4, 1, 1, P62, -1, -1},
        {"bias key_stride = 2^62, Tk = 2", 1, 1, 1, 1, 2, 0, 1, 1, 0, P62, -1},
        {"bias key_stride = INT64_MAX, Tk = 2", 1, 1, 1, 1, 2, 0, 1, 1, 0, MX, -1},
        {"bool mask query_stride = INT64_MAX, Tq = 2", 1, 1, 1, 2, 1, 0, 1, 1, 0, -1, MX},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int t = 1; t <= 2; t++)
            ovf_run(&cases[i], t);
}

/* Windows near 2^31, 2^62 and INT64_MAX (both alignments, causal) limit
 * nothing on a small problem: both passes give the bits of the unbounded
 * window (no overflow in i + d +- window). */
Test(api, huge_windows_equal_unbounded, .timeout = 60)
{
    const int64_t Tq = 5, Tk = 9, D = 8;
    util_rng r;
    util_rng_seed(&r, "huge_windows_equal_unbounded", 14);
    const size_t nq = (size_t)(Tq * D), nk = (size_t)(Tk * D);
    float *q = util_galloc(nq), *k = util_galloc(nk), *v = util_galloc(nk), *dO = util_galloc(nq);
    util_fill_normal(&r, q, nq, 1.0f);
    util_fill_normal(&r, k, nk, 1.0f);
    util_fill_normal(&r, v, nk, 1.0f);
    util_fill_normal(&r, dO, nq, 1.0f);
    const int64_t wins[] = {(int64_t)1 << 31, ((int64_t)1 << 31) - 1, (int64_t)1 << 62, INT64_MAX, INT64_MAX - 1};
    float o0[40], l0[5], dq0[40], dk0[72], dv0[72];
    for (int causal = 0; causal <= 2; causal++)
        for (int align = 0; align <= 1; align++) {
            sdpa_problem p = util_problem(1, 1, 1, Tq, Tk, D, D);
            p.causal = (sdpa_causal)causal;
            p.window_alignment = (sdpa_alignment)align;
            p.num_threads = 1;
            sdpa_tensor tq = util_cview(q, 1, Tq, D), tk = util_cview(k, 1, Tk, D), tv = util_cview(v, 1, Tk, D);
            sdpa_tensor_out to = util_cview_out(o0, 1, Tq, D), tl = util_lse_view_out(l0, 1, Tq);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            sdpa_tensor ti = util_cview(o0, 1, Tq, D), tli = util_lse_view(l0, 1, Tq), tdo = util_cview(dO, 1, Tq, D);
            sdpa_tensor_out tdq = util_cview_out(dq0, 1, Tq, D), tdk = util_cview_out(dk0, 1, Tk, D),
                            tdv = util_cview_out(dv0, 1, Tk, D);
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &ti, &tli, &tdo, &tdq, &tdk, &tdv), SDPA_OK);
            for (size_t wi = 0; wi < sizeof wins / sizeof wins[0]; wi++)
                for (int side = 0; side < 3; side++) {
                    float o[40], l[5], dq[40], dk[72], dv[72];
                    sdpa_problem pw = p;
                    if (side != 1)
                        pw.window_left = wins[wi];
                    if (side != 0)
                        pw.window_right = wins[wi];
                    sdpa_tensor_out wo = util_cview_out(o, 1, Tq, D), wl = util_lse_view_out(l, 1, Tq);
                    sdpa_tensor_out wdq = util_cview_out(dq, 1, Tq, D), wdk = util_cview_out(dk, 1, Tk, D),
                                    wdv = util_cview_out(dv, 1, Tk, D);
                    cr_assert_eq(sdpa_forward(&pw, &tq, &tk, &tv, &wo, &wl), SDPA_OK);
                    cr_assert_eq(sdpa_backward(&pw, &tq, &tk, &tv, &ti, &tli, &tdo, &wdq, &wdk, &wdv), SDPA_OK);
                    const int same = util_same_bits(o, o0, 40) && util_same_bits(l, l0, 5) &&
                                     util_same_bits(dq, dq0, 40) && util_same_bits(dk, dk0, 72) &&
                                     util_same_bits(dv, dv0, 72);
                    cr_expect(same, "causal %d align %d window %lld (side %d) differs from unbounded", causal, align,
                              (long long)wins[wi], side);
                }
        }
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
    util_gfree(dO);
}

/* Defect 3 (issue 14): B = H = 1, Tq = 2 (and 1: the decode backward), Tk = 3,
 * Dk = 0, Dv = 4, Q = K = dQ = dK = NULL (the header allows NULL data for empty
 * tensors). Every score is 0, so O is the mean of V, LSE = log(Tk) and dV_j =
 * sum_i dO_i / Tk. Before the fix the library did pointer arithmetic on the NULL
 * data (row_in, and gemm_nt's A + m*lda for the Dk = 0 decode backward): no
 * crash in a plain build, but clang's -fsanitize=undefined aborts on it
 * (tests/ub_cases.c is the same reproducer for the sanitizer builds of CI). */
Test(api, dk_zero_null_views_both_passes)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int64_t Tq = 1; Tq <= 2; Tq++)
        for (int ii = 0; ii < nisa; ii++)
            for (int t = 1; t <= 2; t++) {
                const int64_t Tk = 3, Dv = 4;
                sdpa_problem p = util_problem(1, 1, 1, Tq, Tk, 0, Dv);
                p.use_default_scale = 0;
                p.scale = 1.0f;
                p.isa = isas[ii];
                p.num_threads = t;
                float V[12], O[8], L[2], DO[8], DV[12];
                for (int i = 0; i < 12; i++)
                    V[i] = (float)i * 0.1f;
                for (int i = 0; i < 8; i++)
                    DO[i] = 1.0f + (float)i;
                sdpa_tensor q = {NULL, 0, 0, 0}, k = {NULL, 0, 0, 0}, tv = util_cview(V, 1, Tk, Dv);
                sdpa_tensor_out to = util_cview_out(O, 1, Tq, Dv), tl = util_lse_view_out(L, 1, Tq);
                sdpa_tensor_out dq = {NULL, 0, 0, 0}, dk = {NULL, 0, 0, 0}, tdv = util_cview_out(DV, 1, Tk, Dv);
                cr_assert_eq(sdpa_forward(&p, &q, &k, &tv, &to, &tl), SDPA_OK);
                for (int64_t i = 0; i < Tq; i++) {
                    cr_expect(fabsf(L[i] - logf(3.0f)) < 1e-6f, "LSE %g", (double)L[i]);
                    for (int d = 0; d < Dv; d++) {
                        const float mean = (V[d] + V[4 + d] + V[8 + d]) / 3.0f;
                        cr_expect(fabsf(O[i * Dv + d] - mean) < 1e-6f, "%s Tq %lld O[%lld][%d] = %g, expected %g",
                                  sdpa_isa_name(isas[ii]), (long long)Tq, (long long)i, d, (double)O[i * Dv + d],
                                  (double)mean);
                    }
                }
                sdpa_tensor ti = util_cview(O, 1, Tq, Dv), tli = util_lse_view(L, 1, Tq), tdo = util_cview(DO, 1, Tq, Dv);
                cr_assert_eq(sdpa_backward(&p, &q, &k, &tv, &ti, &tli, &tdo, &dq, &dk, &tdv), SDPA_OK);
                for (int j = 0; j < Tk; j++)
                    for (int d = 0; d < Dv; d++) {
                        float s = 0;
                        for (int64_t i = 0; i < Tq; i++)
                            s += DO[i * Dv + d];
                        cr_expect(fabsf(DV[j * Dv + d] - s / 3.0f) < 1e-5f, "%s Tq %lld dV[%d][%d] = %g, expected %g",
                                  sdpa_isa_name(isas[ii]), (long long)Tq, j, d, (double)DV[j * Dv + d],
                                  (double)(s / 3.0f));
                    }
            }
}

/* Defect 5 (issue 14): a caller who sets .scale but leaves use_default_scale
 * = 1 (the most natural mistake) gets SDPA_ERR_BAD_SCALE; its string must name
 * use_default_scale (it said "scale is not finite or head_dim_qk is 0"). Every
 * cause of a status is named: aliasing with a mask operand names the masks,
 * SIZE_OVERFLOW names B*Hq*Tq and the workspace. */
Test(api, status_strings_name_their_causes)
{
    float q[8] = {0}, o[8];
    sdpa_problem p = util_problem(1, 1, 1, 1, 1, 8, 8);
    p.scale = 0.125f; /* use_default_scale still 1 */
    sdpa_tensor tq = util_cview(q, 1, 1, 8);
    sdpa_tensor_out to = util_cview_out(o, 1, 1, 8);
    const sdpa_status st = sdpa_forward(&p, &tq, &tq, &tq, &to, NULL);
    cr_assert_eq(st, SDPA_ERR_BAD_SCALE);
    const char *s = sdpa_status_string(st);
    cr_expect(strstr(s, "use_default_scale") != NULL, "BAD_SCALE string does not name use_default_scale: %s", s);
    cr_expect(strstr(s, "NaN") != NULL || strstr(s, "finite") != NULL, "BAD_SCALE string: %s", s);
    cr_expect(strstr(s, "head_dim_qk") != NULL, "BAD_SCALE string: %s", s);
    s = sdpa_status_string(SDPA_ERR_ALIASING);
    cr_expect(strstr(s, "mask") != NULL, "ALIASING string does not name the mask operands: %s", s);
    s = sdpa_status_string(SDPA_ERR_SIZE_OVERFLOW);
    cr_expect(strstr(s, "B*Hq*Tq") != NULL && strstr(s, "workspace") != NULL && strstr(s, "head_dim") != NULL,
              "SIZE_OVERFLOW string does not name each cause: %s", s);
    for (int c = -1; c >= -14; c--) {
        s = sdpa_status_string((sdpa_status)c);
        cr_expect(s && strcmp(s, "unknown status") != 0 && strlen(s) > 8, "status %d: '%s'", c, s ? s : "(null)");
    }
}
