/* SPDX-License-Identifier: MIT */
/* arm/kernels_neon.c - the AArch64 Advanced SIMD kernels: src/simd_tmpl.h over the q-register layer.
 *
 * gemm register block 5 x 16 (5 x 4 q accumulators, 3 rows per pass in the
 * SKIP_ZERO kernels); tails through a small zero-padded buffer; a skipped term
 * (SKIP_ZERO_A/B) has its operands zeroed by a bitwise and before the FMA; exp
 * is Sleef_exp2f4_u10advsimd (2^y, see simd_tmpl.h); gemm_nt (decode scores)
 * keeps one query row of up to 16 q or two of up to 8 in registers and reads
 * each key row whole (see simd/decode.h). */
#include "arm/vec_neon.h"

#include "simd_tmpl.h"

void sdpa_kernels_init_neon(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->isa = SDPA_ISA_NEON;
    t->name = "neon";
    t->block_q = 64; /* 4 column blocks of 16 */
    t->block_k = 64;
    t->band_keys = 16;
    t->wide_prefetch = SDPA_PREFETCH_ALWAYS;
}
