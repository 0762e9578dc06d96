/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx512.c - the AVX-512 kernels: src/simd_tmpl.h over the zmm layer.
 *
 * gemm register block 6 x 64 (6 x 4 zmm accumulators); tails through opmask
 * registers; the skip-zero products are masked FMAs; exp is
 * Sleef_expf16_u10avx512f. Built with the AVX-512 F/VL/BW/DQ flags only. */
#include "x86/vec_avx512.h"

#include "simd_tmpl.h"

void sdpa_kernels_init_avx512(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->name = "avx512";
    t->block_q = 64; /* one column block of 4 zmm */
    t->block_k = 128; /* measured best on Zen 4 (T=2048 D=128 causal): fewer per-tile passes */
}
