/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx512.c - the AVX-512 kernels: src/simd_tmpl.h over the zmm layer.
 *
 * gemm register block 6 x 64 (6 x 4 zmm accumulators); tails through opmask
 * registers; the skip-zero products are masked FMAs; exp is
 * Sleef_expf16_u10avx512f; gemm_nt (decode scores) keeps 4 rows x 4 keys of zmm
 * dot-product accumulators. Built with the AVX-512 F/VL/BW/DQ flags only. */
#include "x86/vec_avx512.h"

#include "simd_tmpl.h"

void sdpa_kernels_init_avx512(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->name = "avx512";
    t->block_q = 64; /* one column block of 4 zmm */
    t->nt_max_cols = 16; /* decode (Tq=1, Hkv=8, Tk=2048, D=128) on Zen 4: the gemm_nt path is
                            1.2-1.9x faster than the transposed one for 8..16 columns */
    t->band_keys = 16;
    t->block_k = 128; /* measured best on Zen 4 (T=2048 D=128 causal): fewer per-tile passes */
}
