/* SPDX-License-Identifier: MIT */
/* tests/test_edge_cases.c - the edge cases EC-01 .. EC-13 of tests/data/edge_cases.json
 * (see tests/data/edge-cases.md), forward and backward, on every ISA: a thin
 * Criterion wrapper over tests/ec_cases.c (the same checks also run in the
 * plain-C conformance program). One Criterion test per group; every failed check
 * is a failed expectation whose message names the sub-case, the variant and the
 * ISA. After them, key lengths near INT64_MAX (overflow of the tile counts). */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ec_cases.h"
#include "util.h"

static void report(void *ctx, ec_event ev, const char *msg)
{
    (void)ctx;
    if (ev == EC_FAIL)
        cr_expect(0, "%s", msg);
    else if (ev == EC_INFO)
        cr_log_info("%s", msg);
}

/* Runs the group on every ISA this machine supports ("coverage" does not depend
 * on the ISA: once). */
static void run_group(const char *name)
{
    char path[1024], err[1200];
    util_data_path(path, sizeof path, "edge_cases.json");
    ec_suite *s = ec_suite_load(path, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    const int g = ec_group_index(name);
    cr_assert(g >= 0, "no edge-case group %s", name);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    const int nrun = strcmp(name, "coverage") ? nisa : 1;
    int failed = 0;
    for (int ii = 0; ii < nrun; ii++)
        failed += ec_run_group(s, g, isas[ii], report, NULL);
    ec_suite_free(s);
    cr_log_info("%s: %d ISA(s), %d failed check(s)", name, nrun, failed);
}

Test(edge_cases, ec01_fully_masked_row)
{
    run_group("EC-01");
}

Test(edge_cases, ec02_leading_blocks_masked, .timeout = 120)
{
    run_group("EC-02");
}

Test(edge_cases, ec03_masked_keys_no_influence)
{
    run_group("EC-03");
}

Test(edge_cases, ec04_causal_alignment)
{
    run_group("EC-04");
}

Test(edge_cases, ec05_tile_tails_negative_logits, .timeout = 120)
{
    run_group("EC-05");
}

Test(edge_cases, ec06_scale)
{
    run_group("EC-06");
}

Test(edge_cases, ec07_gqa_mapping)
{
    run_group("EC-07");
}

Test(edge_cases, ec08_strided_packed_broadcast)
{
    run_group("EC-08");
}

Test(edge_cases, ec09_key_padding_b_ne_h)
{
    run_group("EC-09");
}

Test(edge_cases, ec10_zero_sized)
{
    run_group("EC-10");
}

Test(edge_cases, ec11_gqa_backward_dk_ne_dv)
{
    run_group("EC-11");
}

Test(edge_cases, ec12_head_dim_tails)
{
    run_group("EC-12");
}

Test(edge_cases, ec13_dk_ne_dv_default_scale)
{
    run_group("EC-13");
}

Test(edge_cases, all_cases_covered)
{
    run_group("coverage");
}

Test(edge_cases, ec05_thread_count_bitwise)
{
    run_group("threads");
}

/* REGRESSION (a bug found by the adversarial review, now fixed): a huge Tk is legal with
 * broadcast K/V (seq_stride 0) and a small allowed range (kv_lengths, causal,
 * or a window), but src/sdpa.c fwd_make_layout computed
 * L.nkt = (Tk + bk - 1) / bk, which overflowed near INT64_MAX: the forward then saw no
 * key tile and returned O = 0, LSE = -inf for rows that have allowed keys. Since
 * session 29 kv_len is at most SDPA_MAX_SEQ_LEN (2^60; beyond: SDPA_ERR_SIZE_OVERFLOW,
 * as INT64_MAX is), where every such sum fits int64: the largest legal Tk computes. */
Test(edge_cases, bug_kv_len_int64_max_with_broadcast_keys)
{
    const float q[1] = {1.0f}, k[1] = {2.0f}, v[1] = {3.0f};
    int32_t kvl[1] = {3};
    for (int mode = 0; mode < 3; mode++) {
        sdpa_problem p = util_problem(1, 1, 1, 2, INT64_MAX, 1, 1);
        if (mode == 0) {
            float o[2] = {-7, -7};
            const sdpa_tensor t = {q, 0, 0, 0};
            const sdpa_tensor_out to = {o, 2, 2, 1};
            p.kv_lengths = kvl;
            cr_expect_eq(sdpa_forward(&p, &t, &t, &t, &to, NULL), SDPA_ERR_SIZE_OVERFLOW, "Tk INT64_MAX");
            cr_expect(o[0] == -7 && o[1] == -7);
        }
        p.kv_len = SDPA_MAX_SEQ_LEN;
        p.use_default_scale = 0;
        p.scale = 1.0f;
        p.isa = SDPA_ISA_SCALAR;
        if (mode == 0)
            p.kv_lengths = kvl; /* 3 keys: LSE = 2 + log 3 */
        else if (mode == 1)
            p.causal = SDPA_CAUSAL_TOP_LEFT; /* row i: i + 1 keys */
        else
            p.window_left = p.window_right = 0; /* one key per row */
        float o[2] = {-7, -7}, l[2] = {-7, -7};
        const sdpa_tensor tq = {q, 0, 0, 0}, tk = {k, 0, 0, 0}, tv = {v, 0, 0, 0};
        const sdpa_tensor_out to = {o, 2, 2, 1}, tl = {l, 2, 2, 1};
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
        const double want1 = mode == 0 ? 2.0 + log(3.0) : mode == 1 ? 2.0 + log(2.0) : 2.0;
        cr_expect(o[0] == 3.0f && o[1] == 3.0f && fabs(l[1] - want1) < 1e-5,
                  "mode %d: O = (%g, %g), LSE[1] = %g, want O = 3, LSE[1] = %g", mode, (double)o[0], (double)o[1],
                  (double)l[1], want1);
    }
}

/* REGRESSION (a bug found by the adversarial review, now fixed): with a huge but legal Tk (2^60, broadcast
 * K/V) and block_k = 1, src/sdpa.c fwd_item's `split * L->nkt / L->nsplit`
 * (and `(split + 1) * L->nkt`) overflows int64: splits then cover the same key
 * tiles several times and LSE counts keys twice or more (UBSan: signed integer
 * overflow at the kt_first / kt_end lines). */
Test(edge_cases, bug_huge_kv_len_small_block_k_split_overflow)
{
    const float q[1] = {1.0f}, k[1] = {2.0f}, v[1] = {3.0f};
    sdpa_problem p = util_problem(1, 1, 1, 2, (int64_t)1 << 60, 1, 1);
    p.use_default_scale = 0;
    p.scale = 1.0f;
    p.isa = SDPA_ISA_SCALAR;
    p.block_k = 1;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    float o[2] = {-7, -7}, l[2] = {-7, -7};
    const sdpa_tensor tq = {q, 0, 0, 0}, tk = {k, 0, 0, 0}, tv = {v, 0, 0, 0};
    const sdpa_tensor_out to = {o, 2, 2, 1}, tl = {l, 2, 2, 1};
    cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
    cr_expect(fabs(l[0] - 2.0) < 1e-5 && fabs(l[1] - (2.0 + log(2.0))) < 1e-5,
              "LSE = (%.7g, %.7g), want (2, %.7g)", (double)l[0], (double)l[1], 2.0 + log(2.0));
}
