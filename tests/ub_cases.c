/* SPDX-License-Identifier: MIT */
/* tests/ub_cases.c - the reproducers of issue 14's defects 1 and 3 in plain C
 * (no Criterion, no forked children), for the sanitizer builds: CI runs it in
 * the clang ASan + UBSan build (-Dfuzzing=enabled), where clang's
 * -fsanitize=undefined reports pointer arithmetic on NULL (GCC 12's does not).
 *
 *   defect 1: Dk = 0 and huge B*Hq*Tq with stride-0 inputs. Before the fix the
 *             backward's workspace size wrapped (Hq = 2^60) and the D rows were
 *             written past it (ASan: heap-buffer-overflow WRITE), and
 *             B = Hq = Tq = 2^21 overflowed int64 (UBSan: signed overflow).
 *   defect 3: B = H = 1, Tq = 2 (and 1, the decode backward), Tk = 3, Dk = 0,
 *             Dv = 4, Q = K = dQ = dK = NULL. Before the fix row_in() offset the
 *             NULL data and the Dk = 0 decode backward passed Q = NULL to
 *             gemm_nt (A + m*lda): clang's UBSan "applying non-zero offset to
 *             null pointer".
 * `ub_cases 1` or `ub_cases 3` runs one defect's reproducers only.
 * Exit 0 when every status and value is right; 1 otherwise (a sanitizer stops
 * the program before that). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

static int g_fail;

static void expect_status(const char *what, sdpa_status got, sdpa_status a, sdpa_status b)
{
    if (got != a && got != b) {
        printf("ub_cases: FAIL: %s: %d (%s)\n", what, got, sdpa_status_string(got));
        g_fail++;
    }
}

/* A problem with Dk = 0 (one kv head, scale 1): the shape of both defects. */
static sdpa_problem dk0_problem(int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, int64_t Dv, sdpa_isa isa, int threads)
{
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = B;
    p.q_heads = Hq;
    p.kv_heads = 1;
    p.q_len = Tq;
    p.kv_len = Tk;
    p.head_dim_qk = 0;
    p.head_dim_v = Dv;
    p.use_default_scale = 0;
    p.scale = 1.0f;
    p.isa = isa;
    p.num_threads = threads;
    return p;
}

static void defect1(int threads)
{
    static const int64_t shapes[][3] = {
        {1, (int64_t)1 << 60, 1}, {(int64_t)1 << 21, (int64_t)1 << 21, (int64_t)1 << 21},
        {1, (int64_t)1 << 31, (int64_t)1 << 31}, {1, INT64_MAX, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const sdpa_problem p = dk0_problem(shapes[i][0], shapes[i][1], shapes[i][2], 1, 1, SDPA_ISA_AUTO, threads);
        float o[1] = {1}, l[1] = {0}, dO[1] = {1}, v[1] = {1}, dv[1] = {42};
        sdpa_tensor q = {NULL, 0, 0, 0}, k = {NULL, 0, 0, 0}, tv = {v, 0, 0, 0}, to = {o, 0, 0, 0},
                    tl = {l, 0, 0, 0}, td = {dO, 0, 0, 0};
        sdpa_tensor_out dq = {NULL, 0, 0, 0}, dk = {NULL, 0, 0, 0}, tdv = {dv, 1, 1, 1};
        const sdpa_status st = sdpa_backward(&p, &q, &k, &tv, &to, &tl, &td, &dq, &dk, &tdv);
        char what[128];
        snprintf(what, sizeof what, "defect 1: backward B %lld Hq %lld Tq %lld Dk 0, %d threads",
                 (long long)p.batch, (long long)p.q_heads, (long long)p.q_len, threads);
        expect_status(what, st, SDPA_ERR_SIZE_OVERFLOW, SDPA_ERR_OUT_OF_MEMORY);
        if (dv[0] != 42.0f) {
            printf("ub_cases: FAIL: %s: dV written on error\n", what);
            g_fail++;
        }
    }
}

static void defect3(sdpa_isa isa, int threads, int64_t Tq)
{
    const sdpa_problem p = dk0_problem(1, 1, Tq, 3, 4, isa, threads);
    float V[12], O[8], L[2], DO[8], DV[12];
    for (int i = 0; i < 12; i++)
        V[i] = (float)i * 0.1f;
    for (int i = 0; i < 8; i++)
        DO[i] = 1.0f;
    sdpa_tensor q = {NULL, 0, 0, 0}, k = {NULL, 0, 0, 0}, tv = {V, 12, 12, 4};
    sdpa_tensor_out to = {O, 8, 8, 4}, tl = {L, 2, 2, 1}, dq = {NULL, 0, 0, 0}, dk = {NULL, 0, 0, 0},
                    tdv = {DV, 12, 12, 4};
    char what[128];
    snprintf(what, sizeof what, "defect 3: %s Tq %lld Dk 0 NULL Q/K/dQ/dK, %d threads", sdpa_isa_name(isa),
             (long long)Tq, threads);
    sdpa_status st = sdpa_forward(&p, &q, &k, &tv, &to, &tl);
    expect_status(what, st, SDPA_OK, SDPA_OK);
    for (int d = 0; d < 4 && st == SDPA_OK; d++)
        if (fabsf(O[d] - (V[d] + V[4 + d] + V[8 + d]) / 3.0f) > 1e-6f) {
            printf("ub_cases: FAIL: %s: O[0][%d] = %g\n", what, d, (double)O[d]);
            g_fail++;
        }
    sdpa_tensor ti = {O, 8, 8, 4}, tli = {L, 2, 2, 1}, tdo = {DO, 8, 8, 4};
    st = sdpa_backward(&p, &q, &k, &tv, &ti, &tli, &tdo, &dq, &dk, &tdv);
    expect_status(what, st, SDPA_OK, SDPA_OK);
    for (int j = 0; j < 12 && st == SDPA_OK; j++)
        if (fabsf(DV[j] - (float)Tq / 3.0f) > 1e-5f) {
            printf("ub_cases: FAIL: %s: dV[%d] = %g\n", what, j, (double)DV[j]);
            g_fail++;
        }
}

int main(int argc, char **argv)
{
    /* ub_cases [1|3]: only that defect's reproducers (default: both). */
    const int only = argc > 1 ? atoi(argv[1]) : 0;
    int n = 0;
    for (int t = 1; t <= 2; t++) {
        if (only != 3) {
            defect1(t);
            n += 4;
        }
        if (only != 1)
            for (int isa = SDPA_ISA_SCALAR; isa < SDPA_ISA_COUNT; isa++)
            if (sdpa_isa_supported((sdpa_isa)isa))
                for (int64_t Tq = 1; Tq <= 2; Tq++, n++)
                    defect3((sdpa_isa)isa, t, Tq);
    }
    printf("ub_cases: %d reproducers of issue 14 defects 1 and 3, %d failures\n", n, g_fail);
    return g_fail ? 1 : 0;
}
