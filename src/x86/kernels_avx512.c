/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx512.c - the AVX-512 kernels: src/simd_tmpl.h over the zmm layer.
 *
 * gemm register block 6 x 64 (6 x 4 zmm accumulators); tails through opmask
 * registers; the skip-zero products are masked FMAs; exp is
 * Sleef_exp2f16_u10avx512f (2^y, see simd_tmpl.h); gemm_nt (decode scores)
 * keeps one query row of up to 16 zmm or two of up to 8 in registers against 4
 * or 2 keys per reduction, and longer rows from L1, up to 4 query rows per key.
 * Built with the AVX-512 F/VL/BW/DQ flags only. It replaces every kernel of
 * the AVX2 rung (the whole template over zmm). */
#include "x86/vec_avx512.h"

#include "simd_tmpl.h"

#include "x86/attend_pairs_avx512.h"

void sdpa_kernels_init_avx512(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->isa = SDPA_ISA_AVX512;
    t->name = "avx512";
    t->block_q = 64;     /* one column block of 4 zmm */
    t->block_k = 128;    /* fewer per-tile passes than 64 (docs/perf-notes.md) */
    t->band_keys = 16;
    t->wide_prefetch = SDPA_PREFETCH_ALWAYS;
    t->tile_pad = 0; /* not avx2's: one 64-column block reads whole tile rows (docs/perf-notes.md) */
    t->nt_max_cols = 16; /* decode: up to 16 query columns take gemm_nt and gemm_stream
                            (docs/perf-notes.md) */
}
