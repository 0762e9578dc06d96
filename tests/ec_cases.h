/* SPDX-License-Identifier: MIT */
/* tests/ec_cases.h - the edge cases EC-01 .. EC-13 of tests/data/edge_cases.json
 * (see tests/data/edge-cases.md), forward and backward, as a plain-C module (no
 * Criterion; cJSON), shared by the Criterion suite (tests/test_edge_cases.c) and
 * the conformance program (tests/conformance.c, also run under qemu).
 *
 * The checks are organised in groups: one per EC number ("EC-01" .. "EC-13"),
 * each running every sub-case of that number plus the group's own variants (tile
 * sizes, layouts, broadcast strides), then "threads" (one mid-size case, same
 * bits with 1, 2 and 3 threads) and "coverage" (the file holds the 85 expected
 * cases, each in a group). Every check, passed or failed, goes through the
 * caller's report function; nothing is printed here. */
#ifndef SDPA_TEST_EC_CASES_H
#define SDPA_TEST_EC_CASES_H

#include <stddef.h>

#include "sdpa.h"

typedef enum ec_event {
    EC_PASS, /* one check passed; msg names it */
    EC_FAIL, /* one check failed; msg says which (sub-case, variant, ISA) and why */
    EC_INFO  /* a note, not a check (e.g. "recommended" level, not bitwise equal) */
} ec_event;

typedef void (*ec_report_fn)(void *ctx, ec_event ev, const char *msg);

/* The parsed JSON file. */
typedef struct ec_suite ec_suite;

/* Reads and parses json_path; NULL with a message in err on failure. */
ec_suite *ec_suite_load(const char *json_path, char *err, size_t errlen);
void ec_suite_free(ec_suite *s);
/* Number of cases in the file. */
int ec_suite_size(const ec_suite *s);

/* The groups, in order: "EC-01" .. "EC-13", "threads", "coverage". */
int ec_group_count(void);
const char *ec_group_name(int g);
/* Index of the group called name, -1 if none. */
int ec_group_index(const char *name);

/* Runs group g on one ISA (ignored by "coverage"); reports every check. Returns
 * the number of failed checks. */
int ec_run_group(const ec_suite *s, int g, sdpa_isa isa, ec_report_fn report, void *ctx);

/* Loads json_path and runs every group on isa. Returns the number of failed
 * checks (a file that cannot be loaded is one failed check). */
int ec_run_all(const char *json_path, sdpa_isa isa, ec_report_fn report, void *ctx);

#endif
