/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx2.c - the AVX2 + FMA kernels: src/simd_tmpl.h over the ymm layer.
 *
 * gemm register block 6 x 16 (6 x 2 ymm accumulators, 3 rows per pass in the
 * SKIP_ZERO kernels); tails through maskload/maskstore; a skipped term
 * (SKIP_ZERO_A/B) has its operands zeroed by a bitwise and before the FMA (no
 * blend on the accumulator chain); exp is Sleef_exp2f8_u10avx2 (2^y, see
 * simd_tmpl.h); gemm_nt (decode scores) keeps one query row of up to 8 ymm or
 * two of up to 4 in registers against 4 or 2 keys per reduction, and longer
 * rows from L1, up to 4 query rows per key; fp16 storage through F16C (every
 * AVX2 CPU has it; the dispatcher checks it with AVX2). Built with -mavx2 -mfma
 * -mf16c only. */
#include "x86/vec_avx2.h"

#include "simd_tmpl.h"

void sdpa_kernels_init_avx2(sdpa_kernels *t)
{
    tmpl_fill_table(t);
    t->isa = SDPA_ISA_AVX2;
    t->name = "avx2";
    t->block_q = 64;     /* 4 column blocks of 16 */
    t->block_k = 128;    /* fewer per-tile passes than 64 (docs/perf-notes.md) */
    t->band_keys = 16;
    t->wide_prefetch = SDPA_PREFETCH_ALWAYS;
    t->tile_pad = 16; /* tile rows 320 bytes apart, not 256 (docs/perf-notes.md) */
    t->nt_max_cols = 16; /* decode: up to 16 query columns take gemm_nt and gemm_stream
                            (docs/perf-notes.md) */
}
