/* SPDX-License-Identifier: MIT */
/* bench/bench.h - entry point of `sdpa bench`, the benchmark compiled into the CLI. */
#ifndef SDPA_BENCH_H
#define SDPA_BENCH_H

/** Runs the benchmark. argv[0] is "bench"; the options are described by
 *  `sdpa bench --help`. Prints a table on stdout (or, with --json, one JSON
 *  object per line on stdout and the table on stderr).
 *  @return 0 on success, 1 if a measurement failed, 2 on a usage error. */
int sdpa_bench_main(int argc, char **argv);

#endif /* SDPA_BENCH_H */
