/* SPDX-License-Identifier: MIT */
/* tests/test_edge_cases.c - the edge cases EC-01 .. EC-13 of tests/data/edge_cases.json
 * (see tests/data/edge-cases.md), forward and backward, on every ISA: a thin
 * Criterion wrapper over tests/ec_cases.c (the same checks also run in the
 * plain-C conformance program). One Criterion test per group; every failed check
 * is a failed expectation whose message names the sub-case, the variant and the
 * ISA. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
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
