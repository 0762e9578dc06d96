/* SPDX-License-Identifier: MIT */
/* arm/kernels_neon.c - the AArch64 Advanced SIMD kernels: src/simd_tmpl.h over the q-register layer.
 *
 * gemm register block 5 x 16 (5 x 4 q accumulators); tails through a small
 * zero-padded buffer; a skipped term (SKIP_ZERO_A/B) has its operands zeroed by a
 * bitwise and before the FMA; exp is
 * Sleef_expf4_u10advsimd; gemm_nt (decode scores) keeps up to 2 query rows in
 * q registers and reads each key row whole (see simd_tmpl.h). */
#include "arm/vec_neon.h"

#include "simd_tmpl.h"

void sdpa_kernels_init_neon(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->name = "neon";
    t->block_q = 64; /* 4 column blocks of 16 */
    t->band_keys = 16;
    t->block_k = 64;
}
