/* SPDX-License-Identifier: MIT */
/* tests/test_backward_rows.c - backward rows that need care: rows
 * with |LSE| >= 256 (statistics recomputed, D = sum P dP), peaked rows at huge
 * logits, decode with streamed gradients, all-empty huge head counts, and the
 * thread count of the backward capped under an address-space limit. Against the
 * float64 reference with the FlashAttention rule, on every ISA. */
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

/* The FlashAttention rule: the largest error against float64 is at most 3x
 * that of a naive fp32 computation of the same gradient, plus 1e-6 of the
 * largest |value|. */
static void expect_flash_rule(sdpa_isa isa, const char *what, int threads, const char *name, const float *got,
                              const float *naive, const double *ref, size_t n)
{
    double mx = 0.0, err = 0.0, nerr = 0.0;
    for (size_t e = 0; e < n; e++)
        mx = fmax(mx, fabs(ref[e]));
    for (size_t e = 0; e < n; e++) {
        err = fmax(err, fabs((double)got[e] - ref[e]));
        nerr = fmax(nerr, fabs((double)naive[e] - ref[e]));
    }
    cr_expect(err <= 3.0 * nerr + 1e-6 * mx,
              "[%s] %s, %d thread(s): %s max error %.3g, naive fp32 %.3g (largest |value| %.3g)",
              sdpa_isa_name(isa), what, threads, name, err, nerr, mx);
}

/* Forward then backward of p (its ISA and threads as set) on contiguous
 * [1, H, T, D] arrays (B = 1, Dk = Dv), and the FlashAttention rule on dQ, dK,
 * dV against the float64 gradients r* and the naive fp32 ones n*. */
static void contig_fb_rule(const sdpa_problem *p, const float *q, const float *k, const float *v, const float *dO,
                           float *o, float *l, float *dq, float *dk, float *dv, const float *nq32, const float *nk32,
                           const float *nv32, const double *rdq, const double *rdk, const double *rdv,
                           const char *what)
{
    const int64_t Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len, D = p->head_dim_qk;
    const size_t nq = (size_t)(Hq * Tq * D), nk = (size_t)(Hkv * Tk * D);
    const sdpa_tensor tq = util_cview(q, Hq, Tq, D), tk = util_cview(k, Hkv, Tk, D), tv = util_cview(v, Hkv, Tk, D),
                      tdo = util_cview(dO, Hq, Tq, D), oi = util_cview(o, Hq, Tq, D), li = util_lse_view(l, Hq, Tq);
    const sdpa_tensor_out to = util_cview_out(o, Hq, Tq, D), tl = util_lse_view_out(l, Hq, Tq),
                          odq = util_cview_out(dq, Hq, Tq, D), odk = util_cview_out(dk, Hkv, Tk, D),
                          odv = util_cview_out(dv, Hkv, Tk, D);
    cr_assert_eq(sdpa_forward(p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
    cr_assert_eq(sdpa_backward(p, &tq, &tk, &tv, &oi, &li, &tdo, &odq, &odk, &odv), SDPA_OK);
    expect_flash_rule(p->isa, what, p->num_threads, "dQ", dq, nq32, rdq, nq);
    expect_flash_rule(p->isa, what, p->num_threads, "dK", dk, nk32, rdk, nk);
    expect_flash_rule(p->isa, what, p->num_threads, "dV", dv, nv32, rdv, nk);
}

/* Rows whose |LSE| is large: the float LSE keeps log(l) only to ulp(LSE)/2, so
 * the backward recomputes those rows' max and sum (sdpa.c, bwd_tile_stats).
 * Rows 0-3: every key has a bias of -3.4e38 (the finfo.min padding of other
 * libraries: LSE rounds to the max and used as it is, P would sum to Tk);
 * 4-7: -1e30 on every key; 8-11: biases spread over [0, 2000] (LSE ~ 2000);
 * the other rows: no bias. Against float64, with the FlashAttention rule
 * (at most 3x the error of a naive fp32 backward, plus 1e-6 of the largest
 * value), on every ISA, per-head path (1 thread) and waves (2 threads). */
Test(backward, rows_with_huge_lse_recompute_their_statistics, .timeout = 300)
{
    enum { TQ = 24, TK = 150, D = 16, H = 2 };
    const size_t nq = (size_t)H * TQ * D, nk = (size_t)H * TK * D, nl = (size_t)H * TQ;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float)),
          *dO = malloc(nq * sizeof(float)), *bias = malloc((size_t)TQ * TK * sizeof(float)),
          *o = malloc(nq * sizeof(float)), *l = malloc(nl * sizeof(float)), *dq = malloc(nq * sizeof(float)),
          *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float)), *nq32 = malloc(nq * sizeof(float)),
          *nk32 = malloc(nk * sizeof(float)), *nv32 = malloc(nk * sizeof(float));
    double *rdq = malloc(nq * sizeof(double)), *rdk = malloc(nk * sizeof(double)), *rdv = malloc(nk * sizeof(double));
    util_rng r;
    util_rng_init(&r, util_seed("backward/rows_with_huge_lse", 0x1e5));
    util_fill_normal(&r, q, nq, 1.0f);
    util_fill_normal(&r, k, nk, 1.0f);
    util_fill_normal(&r, v, nk, 1.0f);
    util_fill_normal(&r, dO, nq, 1.0f);
    for (int i = 0; i < TQ; i++)
        for (int j = 0; j < TK; j++) {
            float b = 0.0f;
            if (i < 4)
                b = -3.4e38f;
            else if (i < 8)
                b = -1e30f;
            else if (i < 12)
                b = (float)(2000.0 * util_rng_double(&r));
            bias[i * TK + j] = b;
        }
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int variant = 0; variant < 2; variant++) {
        sdpa_problem p = util_problem(1, H, H, TQ, TK, D, D);
        p.bias = (sdpa_bias){bias, 0, 0, TK, 1};
        p.causal = variant ? SDPA_CAUSAL_BOTTOM_RIGHT : SDPA_CAUSAL_NONE;
        p.block_k = 32;
        ref_backward(&p, q, k, v, dO, rdq, rdk, rdv);
        naive32_backward(&p, q, k, v, dO, nq32, nk32, nv32);
        for (int ii = 0; ii < ni; ii++)
            for (int threads = 1; threads <= 2; threads++) {
                p.isa = isas[ii];
                p.num_threads = threads;
                contig_fb_rule(&p, q, k, v, dO, o, l, dq, dk, dv, nq32, nk32, nv32, rdq, rdk, rdv,
                               variant ? "causal" : "no mask");
            }
    }
    free(q), free(k), free(v), free(dO), free(bias), free(o), free(l), free(dq), free(dk), free(dv);
    free(nq32), free(nk32), free(nv32), free(rdq), free(rdk), free(rdv);
}

/* Peaked rows at huge logits: when a row's top key has P = 1 - eps, the true
 * dS of that key is P (dP - D) = sum over the other keys of P_i (dP_top - dP_i),
 * a few ulps of D. D = rowsum(dO * O) cannot give it: O rounds v_top + eps v to
 * v_top plus a few ulps, and dP_top - D came out as rounding noise (when every
 * row is that peaked: dQ off by 25% of its largest value at logits ~3e4, 5-10x
 * a naive fp32 backward at ~1e3). The rows with |LSE| >= 256 take
 * D = sum_j P_j dP_j from the backward's own P and dP instead (sdpa.c,
 * bwd_tile_stats). Every row here: scores ~20000, the runner-up 8..16 below
 * the top key (P = e^-8 .. e^-16), a third key 0..4 below that, the rest at
 * least 40 below. Integer Q, K and bias make every score exact in fp32
 * whatever the summation order, so the rule below does not depend on how each
 * ISA rounds Q K^T. head_dim and lengths off the vector widths, GQA, no mask
 * and causal, 1 and 2 threads, every ISA, against float64 with the
 * FlashAttention rule. */
Test(backward, peaked_rows_at_huge_logits_get_an_exact_row_sum, .timeout = 300)
{
    enum { TQ = 37, TK = 203, D = 67, HQ = 2, HKV = 1 };
    const size_t nq = (size_t)HQ * TQ * D, nk = (size_t)HKV * TK * D, nb = (size_t)HQ * TQ * TK;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float)),
          *dO = malloc(nq * sizeof(float)), *bias = malloc(nb * sizeof(float)), *o = malloc(nq * sizeof(float)),
          *l = malloc((size_t)HQ * TQ * sizeof(float)), *dq = malloc(nq * sizeof(float)),
          *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float)), *nq32 = malloc(nq * sizeof(float)),
          *nk32 = malloc(nk * sizeof(float)), *nv32 = malloc(nk * sizeof(float));
    double *rdq = malloc(nq * sizeof(double)), *rdk = malloc(nk * sizeof(double)), *rdv = malloc(nk * sizeof(double));
    util_rng r;
    util_rng_init(&r, util_seed("backward/peaked_rows_at_huge_logits", 0x9ea4));
    for (size_t e = 0; e < nq; e++)
        q[e] = (float)util_rng_int(&r, -3, 3);
    for (size_t e = 0; e < nk; e++)
        k[e] = (float)util_rng_int(&r, -3, 3);
    util_fill_normal(&r, v, nk, 1.0f);
    util_fill_normal(&r, dO, nq, 1.0f);
    /* bias = target score - Q K^T, all integers below 2^24: exact */
    for (int h = 0; h < HQ; h++)
        for (int i = 0; i < TQ; i++) {
            const int64_t top = util_rng_int(&r, 0, TK - TQ - 1), gap = util_rng_int(&r, 12, 20);
            const int64_t second = (top + 1 + util_rng_int(&r, 0, TK - TQ - 2)) % (TK - TQ);
            int64_t third = util_rng_int(&r, 0, TK - TQ - 1);
            if (third == top || third == second)
                third = (third + 1) % (TK - TQ) == top || (third + 1) % (TK - TQ) == second ? (third + 2) % (TK - TQ)
                                                                                          : (third + 1) % (TK - TQ);
            for (int j = 0; j < TK; j++) {
                int64_t target = 20000 - 40 - util_rng_int(&r, 0, 100), dot = 0;
                if (j == top)
                    target = 20000;
                else if (j == second)
                    target = 20000 - gap;
                else if (j == third)
                    target = 20000 - gap - util_rng_int(&r, 0, 4);
                for (int c = 0; c < D; c++)
                    dot += (int64_t)q[((size_t)h * TQ + i) * D + c] * (int64_t)k[(size_t)j * D + c];
                bias[((size_t)h * TQ + i) * TK + j] = (float)(target - dot);
            }
        }
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int variant = 0; variant < 2; variant++) {
        sdpa_problem p = util_problem(1, HQ, HKV, TQ, TK, D, D);
        p.use_default_scale = 0;
        p.scale = 1.0f;
        p.bias = (sdpa_bias){bias, 0, (int64_t)TQ * TK, TK, 1};
        p.causal = variant ? SDPA_CAUSAL_BOTTOM_RIGHT : SDPA_CAUSAL_NONE; /* the three keys stay visible */
        ref_backward(&p, q, k, v, dO, rdq, rdk, rdv);
        naive32_backward(&p, q, k, v, dO, nq32, nk32, nv32);
        for (int ii = 0; ii < ni; ii++)
            for (int threads = 1; threads <= 2; threads++) {
                p.isa = isas[ii];
                p.num_threads = threads;
                const char *what = variant ? "causal" : "no mask";
                contig_fb_rule(&p, q, k, v, dO, o, l, dq, dk, dv, nq32, nk32, nv32, rdq, rdk, rdv, what);
                /* the scores are exact, so with an exact row sum only the exp's and the
                 * products' roundings are left (measured: under 1e-6; a float D gave
                 * 2.6e-2, a naive fp32 backward 7e-3 and 1.5e-2) */
                for (int x = 0; x < 2; x++) {
                    const float *got = x ? dk : dq;
                    const double *ref = x ? rdk : rdq;
                    const size_t n = x ? nk : nq;
                    double mx = 0.0, err = 0.0;
                    for (size_t e = 0; e < n; e++) {
                        mx = fmax(mx, fabs(ref[e]));
                        err = fmax(err, fabs((double)got[e] - ref[e]));
                    }
                    cr_expect(err <= 1e-5 * mx, "[%s] %s, %d thread(s): %s max error %.3g of largest |value| %.3g",
                              sdpa_isa_name(isas[ii]), what, threads, x ? "dK" : "dQ", err, mx);
                }
            }
    }
    free(q), free(k), free(v), free(dO), free(bias), free(o), free(l), free(dq), free(dk), free(dv);
    free(nq32), free(nk32), free(nv32), free(rdq), free(rdk), free(rdv);
}

/* Decode backward with large gradients: one query tile per kv head writes each
 * dK/dV row once, and when dK + dV reach 16 MiB (sdpa.c, BWD_STREAM_KV_BYTES)
 * the x86 ISAs store them with non-temporal stores, where the rows are aligned
 * for them. The same problem with dK and dV one float off that alignment
 * (plain stores) must give the same bits, and both must pass the FlashAttention
 * rule against float64: no key padding and key padding (the rows past a
 * batch's length are zeroed, not stored by the gemm), 1 thread (whole heads)
 * and 2 (waves), every ISA. */
Test(backward, decode_with_streamed_gradients_bitwise_and_accurate, .timeout = 600)
{
    enum { HQ = 4, HKV = 2, TK = 8200, D = 128 }; /* dK + dV: 2 x 2 x 8200 x 128 x 4 bytes = 16.8 MB */
    const size_t nq = (size_t)HQ * D, nk = (size_t)HKV * TK * D;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float)),
          *dO = malloc(nq * sizeof(float)), *o = malloc(nq * sizeof(float)), *l = malloc(HQ * sizeof(float)),
          *dq = malloc(nq * sizeof(float)), *nq32 = malloc(nq * sizeof(float)), *nk32 = malloc(nk * sizeof(float)),
          *nv32 = malloc(nk * sizeof(float));
    /* dK, dV 64-byte aligned (x[0]), and one float past that (x[1]) */
    float *grad[2][2], *base[2];
    for (int x = 0; x < 2; x++)
        base[x] = aligned_alloc(64, (2 * nk + 64) * sizeof(float)); /* nk is a multiple of 16 */
    grad[0][0] = base[0];
    grad[0][1] = base[0] + nk + 16;
    grad[1][0] = base[1] + 1;
    grad[1][1] = base[1] + nk + 17;
    double *rdq = malloc(nq * sizeof(double)), *rdk = malloc(nk * sizeof(double)), *rdv = malloc(nk * sizeof(double));
    util_rng r;
    util_rng_init(&r, util_seed("backward/decode_with_streamed_gradients", 0x57e));
    util_fill_uniform(&r, q, nq, -1.0f, 1.0f);
    util_fill_uniform(&r, k, nk, -1.0f, 1.0f);
    util_fill_uniform(&r, v, nk, -1.0f, 1.0f);
    util_fill_uniform(&r, dO, nq, -1.0f, 1.0f);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    const int32_t kv_len[1] = {7001};
    for (int variant = 0; variant < 2; variant++) {
        sdpa_problem p = util_problem(1, HQ, HKV, 1, TK, D, D);
        p.kv_lengths = variant ? kv_len : NULL;
        ref_backward(&p, q, k, v, dO, rdq, rdk, rdv);
        naive32_backward(&p, q, k, v, dO, nq32, nk32, nv32);
        for (int ii = 0; ii < ni; ii++)
            for (int threads = 1; threads <= 2; threads++) {
                p.isa = isas[ii];
                p.num_threads = threads;
                const char *what = variant ? "key padding" : "no mask";
                /* aligned dK, dV (streamed on x86), then one float off (plain stores) */
                contig_fb_rule(&p, q, k, v, dO, o, l, dq, grad[0][0], grad[0][1], nq32, nk32, nv32, rdq, rdk, rdv,
                               what);
                const sdpa_tensor tq = util_cview(q, HQ, 1, D), tk = util_cview(k, HKV, TK, D),
                                  tv = util_cview(v, HKV, TK, D), tdo = util_cview(dO, HQ, 1, D),
                                  oi = util_cview(o, HQ, 1, D), li = util_lse_view(l, HQ, 1);
                const sdpa_tensor_out odq = util_cview_out(dq, HQ, 1, D), odk = util_cview_out(grad[1][0], HKV, TK, D),
                                      odv = util_cview_out(grad[1][1], HKV, TK, D);
                cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &oi, &li, &tdo, &odq, &odk, &odv), SDPA_OK);
                cr_expect(util_same_bits(grad[0][0], grad[1][0], nk) && util_same_bits(grad[0][1], grad[1][1], nk),
                          "[%s] %s, %d thread(s): dK, dV differ between aligned and unaligned buffers",
                          sdpa_isa_name(isas[ii]), what, threads);
            }
    }
    free(q), free(k), free(v), free(dO), free(o), free(l), free(dq), free(nq32), free(nk32), free(nv32);
    free(base[0]), free(base[1]), free(rdq), free(rdk), free(rdv);
}

/* ---------------------------------------------------------- masked rows -- */

/* REGRESSION (a bug found by the adversarial review, now fixed; it failed by timeout): a backward whose every
 * tensor is empty (Tq = Tk = 0) still loops over B * Hq and B * Hkv: src/sdpa.c
 * zero_rows() walks every (b, h) with an empty innermost loop, and the
 * per-head wave loop runs B * Hkv dynamic-schedule iterations with no wave in
 * them. B = Hq = Hkv = 2^20 is 2^40 iterations (hours); the forward returns at
 * once. (With B * Hkv past 2^63 the products also overflow.) */
Test(backward, bug_backward_all_empty_huge_heads_is_instant, .timeout = 15)
{
    float dummy[4] = {0};
    sdpa_problem p = util_problem((int64_t)1 << 20, (int64_t)1 << 20, (int64_t)1 << 20, 0, 0, 1, 1);
    p.num_threads = 1;
    const sdpa_tensor t = {dummy, 0, 0, 0};
    const sdpa_tensor_out a = {dummy + 1, 0, 0, 0}, b = {dummy + 2, 0, 0, 0}, c = {dummy + 3, 0, 0, 0};
    cr_assert_eq(sdpa_forward(&p, &t, &t, &t, &a, NULL), SDPA_OK);
    cr_assert_eq(sdpa_backward(&p, &t, &t, &t, &t, &t, &t, &a, &b, &c), SDPA_OK);
}

/* Runs fn in a child process limited to `extra` bytes of address space beyond
 * what it maps now; returns the child's wait status. */
static int in_limited_child(void (*fn)(void), size_t extra)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        size_t vm = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (f) {
            unsigned long pages = 0;
            if (fscanf(f, "%lu", &pages) == 1)
                vm = (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
            fclose(f);
        }
        struct rlimit rl = {vm + extra, vm + extra};
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(100);
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static void backward_4000_threads_tiny(void)
{
    enum { T = 4, D = 4 };
    float q[T * D], o[T * D], l[T], dq[T * D], dk[T * D], dv[T * D];
    for (int i = 0; i < T * D; i++)
        q[i] = (float)(i % 5) * 0.25f;
    sdpa_problem p = util_problem(1, 1, 1, T, T, D, D);
    p.num_threads = 1;
    const sdpa_tensor tq = util_cview(q, 1, T, D), oi = util_cview(o, 1, T, D), li = util_lse_view(l, 1, T);
    const sdpa_tensor_out to = util_cview_out(o, 1, T, D), tl = util_lse_view_out(l, 1, T),
                          odq = util_cview_out(dq, 1, T, D), odk = util_cview_out(dk, 1, T, D),
                          odv = util_cview_out(dv, 1, T, D);
    if (sdpa_forward(&p, &tq, &tq, &tq, &to, &tl) != SDPA_OK)
        _exit(3);
    p.num_threads = 4000; /* far more than the one (batch, head) pair of work */
    const sdpa_status st = sdpa_backward(&p, &tq, &tq, &tq, &oi, &li, &tq, &odq, &odk, &odv);
    _exit(st == SDPA_OK || st == SDPA_ERR_OUT_OF_MEMORY ? 0 : 4);
}

/* REGRESSION (a bug found by the adversarial review, now fixed): sdpa_backward never caps num_threads
 * (sdpa_forward caps it at its work items): num_threads = 4000 on a problem
 * with one (batch, kv head) pair allocates 4000 workspaces and asks libgomp for
 * 4000 threads. Where they cannot be created (address-space or pid limits of a
 * container), libgomp prints "libgomp: Thread creation failed" and calls
 * exit(1): the library kills its caller. Here the child gets 512 MiB of
 * address space (about 60 default thread stacks). Skipped under ASan, which
 * cannot run with an address-space limit. */
Test(backward, bug_backward_thread_count_not_capped)
{
    if (UTIL_ASAN)
        cr_skip_test("RLIMIT_AS cannot be used under AddressSanitizer");
    const int status = in_limited_child(backward_4000_threads_tiny, (size_t)512 << 20);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child %s %d (libgomp exits the process when it cannot create the threads asked for)",
              WIFEXITED(status) ? "exited with" : "killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}
