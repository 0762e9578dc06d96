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
 * variants, see ec_cases.h); each of their checks counts. Ends with "N passed,
 * N failed".
 *
 *   conformance [edge_cases.json]   (default: SDPA_TEST_DATA_DIR/edge_cases.json)
 *
 * SDPA_TEST_REDUCED=1 runs a smaller random sweep (emulation); the edge cases
 * always run in full. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    ec_suite_free(ecs);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
