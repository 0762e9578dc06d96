/* SPDX-License-Identifier: MIT */
/* tools/sdpa.c - the sdpa command-line tool: attention forward/backward on .npy files.
 *
 *   sdpa info                       version, CPU features, ISAs, OpenMP threads
 *   sdpa forward  -q Q -k K -v V -o O [--lse LSE] [mask and variant options]
 *   sdpa backward -q Q -k K -v V --do dO --dq dQ --dk dK --dv dV [-o O --lse LSE] [--dsinks dS]
 *                 [mask and variant options]
 *   (variants: --softcap C, --alibi-slopes SLOPES, --sinks SINKS; see 'sdpa forward --help')
 *   (types: --dtype fp32|bf16|fp16 for Q and O (dO, dQ), --kv-dtype for K and V (dK, dV):
 *    the tensors are stored in that type while libsdpa computes; float32 or float16 inputs)
 *   (packed sequences: --cu-seqlens-q CUQ with --cu-seqlens-k CUK, or, forward only, a paged
 *    K/V cache with --block-table BT --seq-lens-k LK [--page-layout HND|NHD]; dense 4-D files
 *    in (B, T, H, D) order: --layout bshd)
 *   sdpa demo     [--data DIR]      the worked example, then a timed causal prefill
 *   sdpa bench    ...               the benchmark (when built with bench/bench.c)
 *
 * Every input is read and validated, and every output's temporary file is
 * created, before anything is computed; outputs are written to temporary files
 * in their own directory and renamed over the destination only after all of
 * them were written. So a bad input never creates or changes an output file.
 * Errors: one line "sdpa: error: <file>: <what>" on stderr and exit status 2.
 *
 * The tool links libsdpa as any user does (the shared library, public API
 * only). Its files: tools/cli.h lists them and what each does. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#ifdef SDPA_HAVE_BENCH
#include "../bench/bench.h" /* int sdpa_bench_main(int argc, char **argv); argv[0] is "bench" */
#endif

static void print_main_help(FILE *f)
{
    fprintf(f, "usage: sdpa <command> [options]\n\n"
               "Scaled dot-product attention (FlashAttention-2) on .npy files: tensors stored in fp32,\n"
               "bf16 or fp16 (--dtype, --kv-dtype), products and sums accumulated in fp32.\n\n"
               "Commands:\n"
               "  info       version, CPU features, ISAs, active ISA, OpenMP threads\n"
               "  forward    O (and LSE) from Q, K, V and masks [--dtype fp32|bf16|fp16] [--kv-dtype ...]\n"
               "  backward   dQ, dK, dV from Q, K, V, dO (and O, LSE) [--dtype ...] [--kv-dtype ...]\n"
               "  demo       worked example and a timed causal prefill, checked against float64\n"
               "  bench      benchmark [--dtype fp32,bf16,fp16]%s\n\n"
               "'sdpa <command> --help' describes each command. The SDPA_ISA environment variable\n"
               "caps the ISA chosen at load (scalar, avx2, avx512, amx, neon).\n",
#ifdef SDPA_HAVE_BENCH
            ""
#else
            " (not built in this binary)"
#endif
    );
}

static int cmd_bench(int argc, char **argv)
{
#ifdef SDPA_HAVE_BENCH
    return sdpa_bench_main(argc, argv);
#else
    (void)argc, (void)argv;
    plain_error("bench: not built in this binary (bench/bench.c was absent when the build was configured)");
    return EXIT_BAD;
#endif
}

int main(int argc, char **argv)
{
    const char *cmd;
    if (argc < 2) {
        plain_error("no command given");
        print_main_help(stderr);
        return EXIT_BAD;
    }
    cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        print_main_help(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("sdpa %s\n", sdpa_version());
        return 0;
    }
    if (strcmp(cmd, "info") == 0)
        return cmd_info(argc - 1, argv + 1);
    install_signal_cleanup();
    if (strcmp(cmd, "forward") == 0)
        return cmd_forward(argc - 1, argv + 1);
    if (strcmp(cmd, "backward") == 0)
        return cmd_backward(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0)
        return cmd_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    plain_error("unknown command '%s'", cmd);
    fprintf(stderr, "usage: sdpa info|forward|backward|demo|bench [options] (see 'sdpa --help')\n");
    return EXIT_BAD;
}
