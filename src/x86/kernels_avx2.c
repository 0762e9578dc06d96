/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx2.c - the AVX2 + FMA kernels: src/simd_tmpl.h over the ymm layer.
 *
 * gemm register block 6 x 16 (6 x 2 ymm accumulators); tails through
 * maskload/maskstore; a skipped term (SKIP_ZERO_A/B) has its operands zeroed by
 * a bitwise and before the FMA (no blend on the accumulator chain); exp is
 * Sleef_expf8_u10avx2; gemm_nt (decode scores) keeps 3 rows x 4 keys of ymm
 * dot-product accumulators. Built with -mavx2 -mfma only. */
#include "x86/vec_avx2.h"

#include "simd_tmpl.h"

void sdpa_kernels_init_avx2(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->name = "avx2";
    t->block_q = 64; /* 4 column blocks of 16 */
    t->nt_max_cols = 16; /* decode (Tq=1, Hkv=8, Tk=2048, D=128) on Zen 4: the gemm_nt path is
                            1.2-1.9x faster than the transposed one for 8..16 columns */
    t->band_keys = 16;
    t->block_k = 128; /* measured best on Zen 4 (T=2048 D=128 causal): fewer per-tile passes */
}
