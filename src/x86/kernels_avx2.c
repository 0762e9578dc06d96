/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx2.c - the AVX2 + FMA kernels: src/simd_tmpl.h over the ymm layer.
 *
 * gemm register block 6 x 16 (6 x 2 ymm accumulators); tails through
 * maskload/maskstore; a skipped term (SKIP_ZERO_A/B) has its operands zeroed by
 * a bitwise and before the FMA (no blend on the accumulator chain); exp is
 * Sleef_expf8_u10avx2. Built with -mavx2 -mfma only. */
#include "x86/vec_avx2.h"

#include "simd_tmpl.h"

void sdpa_kernels_init_avx2(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->name = "avx2";
    t->block_q = 64; /* 4 column blocks of 16 */
    t->block_k = 128; /* measured best on Zen 4 (T=2048 D=128 causal): fewer per-tile passes */
}
