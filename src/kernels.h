/* SPDX-License-Identifier: MIT */
/* kernels.h - the per-ISA micro-kernel table used by the ISA-neutral driver.
 *
 * The driver (the src/ files listed in src/driver.h) does validation, masks, tiling and
 * threading once.
 * Everything that touches a whole tile of numbers goes through this table, which
 * holds one implementation per ISA (scalar in src/kernels_scalar.c, AVX2 and
 * AVX-512 in src/x86/, NEON in src/arm/).
 *
 * Layout convention ("transposed scores"): a score tile is stored as S^T, one row
 * per key and one column per query, so that everything per query (running max m,
 * running sum l, LSE, D) is a vector along the contiguous dimension. Row tiles
 * are at most SDPA_MAX_BLOCK long.
 *
 * Every kernel reads and writes exactly the elements its arguments describe
 * (tails are masked, never over-read), allocates nothing and uses no OpenMP.
 *
 * The masked sentinel: a masked score is -inf; the kernels turn it into the
 * probability -0.0 (negative zero, bit pattern 0x80000000), while every
 * probability computed by exp() is +0 or positive, and dS of an allowed entry
 * is never -0.0 (see bwd_dscores). So "-0.0" means "masked" and nothing else:
 * the SKIP flags skip exactly the masked terms (a NaN in a masked K/V row is
 * never read into a result), while a probability that underflowed to +0 still
 * multiplies its V or dO row (a NaN there propagates, whatever the tiling).
 */
#ifndef SDPA_KERNELS_H
#define SDPA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa.h"

/* gemm flags */
enum {
    SDPA_GEMM_ACCUMULATE = 1,  /* C += alpha*A*B (else C = alpha*A*B) */
    SDPA_GEMM_SKIP_ZERO_A = 2, /* a term whose A(m,k) is the masked sentinel -0.0 adds nothing,
                                  even if B(k,n) is NaN/Inf (+0.0 is an ordinary value) */
    SDPA_GEMM_SKIP_ZERO_B = 4, /* the same for B(k,n) == -0.0 */
    SDPA_GEMM_STREAM_C = 8     /* hint, without ACCUMULATE: C is written once and not read
                                  soon; an ISA may store it with non-temporal stores (the
                                  same values) */
};

/* C[M x N] (+)= alpha * A[M x K] * B[K x N]
 *   A(m,k) = A[m*rs_a + k*cs_a]   (any strides: A is read by scalar broadcasts)
 *   B(k,n) = B[k*ldb + n]          (unit stride along n: vector loads)
 *   C(m,n) = C[m*ldc + n]
 * With ACCUMULATE and c_row_scale non-NULL, each row of C is rescaled first:
 *   C(m,n) = c_row_scale[m] * C(m,n) + alpha * sum_k A(m,k) B(k,n)
 * (the SIMD kernels: one fused multiply-add of C, the factor and the rounded
 * alpha * sum; the scalar one unfused), which is the online softmax's
 * O = alpha O + P V in one pass; c_row_scale is ignored without ACCUMULATE.
 * K may be 0 (then C = 0, or unchanged when accumulating, or only rescaled).
 * Sums over k run in increasing k for every (m,n) in every implementation's
 * own fixed order, so a given ISA gives the same bits whatever the caller's
 * threading. */
typedef void (*sdpa_gemm_fn)(int M, int N, int K, float alpha, const float *A, ptrdiff_t rs_a,
                             ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C,
                             ptrdiff_t ldc, int flags, const float *c_row_scale);

/* Online-softmax update of one tile (FlashAttention-2 Alg. 1 lines 8-10).
 * S^T is M keys x N queries (row stride lds), holding scaled, masked scores
 * (-inf = masked). For each column n:
 *   mx       = max(m[n], max_k S[k][n])
 *   mu       = (mx == -inf) ? 0 : mx            (fully masked so far: no NaN)
 *   alpha[n] = exp(m[n] - mu)
 *   S[k][n]  = S[k][n] == -inf ? -0.0 : exp(S[k][n] - mu)   (now P^T; masked -> the sentinel)
 *   l[n]     = l[n] * alpha[n] + sum_k S[k][n]
 *   m[n]     = mx */
typedef void (*sdpa_online_softmax_fn)(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                       float *alpha);

/* The same update for a score tile in natural layout (few-column tiles): S is
 * M queries x N keys (row stride lds, N a multiple of the table's nt_step; the caller fills keys
 * past the tile with -inf), and every statistic is per row m:
 *   mx = max(m[r], max_n S[r][n]), mu = (mx == -inf) ? 0 : mx, alpha[r] = exp(m[r] - mu),
 *   S[r][n] = S[r][n] == -inf ? -0.0 : exp(S[r][n] - mu),
 *   l[r] = l[r] * alpha[r] + sum_n S[r][n],  m[r] = mx.
 * Each ISA sums a row in its own fixed order. */
typedef void (*sdpa_online_softmax_rows_fn)(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                            float *alpha);

/* dst[m*ldd + n] = src[m*lds + n] * alpha[m] for m < M, n < N: the rescale of
 * the output accumulator O (natural layout, one row per query) by the online
 * softmax's alpha, and the final O / l. In place when dst == src (and
 * ldd == lds); an in-place row whose factor is exactly 1 is left as it is
 * (the same bits). */
typedef void (*sdpa_scale_rows_fn)(int M, int N, const float *src, ptrdiff_t lds, const float *alpha, float *dst,
                                   ptrdiff_t ldd);

/* Backward: S^T (M keys x N queries) -> P^T in place: S[k][n] = exp(S[k][n] - lse[n]);
 * masked entries (S = -inf) and whole columns with lse[n] == -inf (row fully
 * masked) become the masked sentinel -0.0. */
typedef void (*sdpa_bwd_probs_fn)(int M, int N, float *S, ptrdiff_t lds, const float *lse);

/* Backward: dS = P * (dP - D), in place in dP; masked entries stay the sentinel
 * whatever dP holds (a NaN in dP from a masked V row must not leak):
 *   dP[k][n] = (P[k][n] is -0.0) ? -0.0 : P[k][n] * (dP[k][n] - d[n]) + 0.0
 * (+ 0.0 turns an arithmetic -0 into +0, so -0.0 keeps meaning "masked"). */
typedef void (*sdpa_bwd_dscores_fn)(int M, int N, const float *P, ptrdiff_t ldp, float *dP,
                                    ptrdiff_t lddp, const float *d);

/* Dot-product form, for tiles with few queries (decode):
 *   C(m,n) = alpha * sum_k A[m*lda + k] * B[n*ldb + k],  stored at C[m*rs_c + n*cs_c]
 * (overwrites). A holds M query rows, B holds N key rows, both with K contiguous;
 * the forward stores S in natural layout (rs_c = nt_step, one step of keys; cs_c = 1),
 * the backward of few-column tiles S^T and dP^T (rs_c = 1, cs_c = the tile's ld).
 * K may be 0 (C = 0). Each ISA sums over k in its own fixed order. */
typedef void (*sdpa_gemm_nt_fn)(int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                                const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c,
                                ptrdiff_t cs_c);

/* P.V for few-column tiles (decode), with the online-softmax rescale:
 *   C[m*ldc + n] = C[m*ldc + n] * row_scale[m] + sum_k A[m*lda + k] * B[k*ldb + n]
 * for m < M, n < N (row_scale NULL: no rescale): the sum is accumulated from
 * zero in increasing k, then added to the scaled C (the SIMD kernels: one fused
 * multiply-add per term, and C = row_scale * C + sum as one more; the scalar
 * one: unfused, C scaled first). skip_masked: a term whose A(m,k) is the
 * masked sentinel -0.0 adds nothing even if B(k,n) is NaN/Inf, and a row of B
 * whose terms are all skipped is not read. Each row of B is read whole, front
 * to back, before the next (rows of C in registers, partly in an L1 buffer for
 * long rows), except for rows of C longer than the ISA's registers plus 512
 * columns, which are done in 512-column chunks: front-to-back rows are the
 * order the hardware prefetchers follow (a register-blocked gemm reads B in
 * column panels, which the prefetchers follow far less well: docs/perf-notes.md). On
 * ISAs that set V_STREAM_PAIR_NV, when two rows of C do not fit the registers,
 * only the first row reads B that way; the others go in pairs over column
 * chunks of B, which the first row's pass has brought into L1. K may be 0. */
typedef void (*sdpa_gemm_stream_fn)(int M, int N, int K, const float *A, ptrdiff_t lda, const float *B,
                                    ptrdiff_t ldb, float *C, ptrdiff_t ldc, int skip_masked,
                                    const float *row_scale);

/* Few-column forward over N keys that are all allowed (decode; optional per ISA):
 * for steps of `nt_step` keys (the table's), S = scale Q K^T, the row-wise online
 * softmax update of m, l (as online_softmax_rows), then O = alpha O + P V (as
 * gemm_stream), with Q M x Dk (row stride ldq), K and V N rows (ldk, ldv), O M x Dv
 * (ldo), all in one call so that the per-step work stays in registers and K and V
 * are read row by row, interleaved one step at a time. scratch: the table's
 * attend_scratch floats. Query rows of at most attend_max_vecs vectors stay in
 * registers (Dk and Dv of the same vector count); longer query rows (any Dv) run
 * the steps the driver would compose from gemm_nt, online_softmax_rows and
 * gemm_stream, inside the call, with the same bits. Returns 0 and does nothing for a
 * shape the ISA does not take here (Dk or Dv 0, M outside 1..attend_max_rows, or
 * short query rows whose Dk and Dv differ in vector count): the caller then composes
 * the same steps from the kernels above. 1 when done. */
typedef int (*sdpa_attend_rows_fn)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                   const float *K, ptrdiff_t ldk, const float *V, ptrdiff_t ldv, float *m,
                                   float *l, float *O, ptrdiff_t ldo, float *scratch);

/* attend_rows over a bf16 or fp16 K/V cache (K, V: uint16 bit patterns, strides in
 * elements), each element widened as it is read: the bits of attend_rows on the
 * widened rows. Optional per ISA (NULL: the driver widens runs of keys into fp32
 * buffers first). */
typedef int (*sdpa_attend_rows16_fn)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                     const uint16_t *K, ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, float *m,
                                     float *l, float *O, ptrdiff_t ldo, float *scratch);

/* Few-row backward over N keys that every row allows (decode; optional per ISA): with
 * Q, O, dO M rows (fp32, row strides ldq, ldo, lddo), lse[M] (natural log; finite),
 * K, V N rows of the table entry's type (fp32, or bf16 / fp16 bit patterns; strides
 * in elements), and for m < M, j < N:
 *   D_m = sum_c dO[m][c] O[m][c]                 (the dot product that forms dP below)
 *   S_mj = scale sum_k Q[m][k] K[j][k],  P_mj = exp(S_mj - lse[m])
 *   dP_mj = sum_c dO[m][c] V[j][c],      dS_mj = P_mj (dP_mj - D_m)
 *   dV[j] = sum_m P_mj dO[m],  dK[j] = scale sum_m dS_mj Q[m]   (written, in K/V's type,
 *                                                                rounded to nearest even)
 *   dQ[m] = scale sum_j dS_mj K[j]                               (fp32, overwritten)
 * (FlashAttention-2's backward, Dao 2023, Algorithm 2, for one query tile.) One pass:
 * each step of nt_step keys is read once from memory, its dK and dV rows written once.
 * The dot products sum as gemm_nt's long-row path (one chain per (row, key), then
 * V_REDUCE4), dQ as gemm_stream per step, added step by step in increasing j, times
 * scale at the end; dK, dV in increasing m. Each output row thus depends only on the
 * inputs and N, not on threads. scratch: the table's bwd_rows_scratch floats. Returns
 * 0 and does nothing unless 0 < M <= bwd_rows_max_rows, Dk > 0, Dv > 0 and N >= 0;
 * 1 when done. */
typedef int (*sdpa_bwd_rows_fn)(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                const float *O, ptrdiff_t ldo, const float *dO, ptrdiff_t lddo, const float *lse,
                                const void *K, ptrdiff_t ldk, const void *V, ptrdiff_t ldv, float *dQ,
                                ptrdiff_t lddq, void *dK, ptrdiff_t lddk, void *dV, ptrdiff_t lddv, float *scratch);

/* dst[c][r] = src[r][c] for r < rows, c < cols (src row stride lds, dst row stride ldd). */
typedef void (*sdpa_transpose_fn)(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                                  ptrdiff_t ldd);

/* Logit soft-capping (Gemma 2 report, 2024): for m < M, n < N,
 *   t = tanh(S[m*lds + n] / cap),  S[m*lds + n] = cap * t,
 * and with G non-NULL also G[m*ldg + n] = 1 - t*t (d capped / d uncapped, for the
 * backward). cap is finite and > 0. Elementwise: the layout does not matter.
 * tanh: libm's tanhf (scalar) or SLEEF's 3.5-ulp vector tanhf (each ISA's own
 * fixed order of operations; NaN stays NaN, +-inf gives +-cap). */
typedef void (*sdpa_softcap_fn)(int M, int N, float *S, ptrdiff_t lds, float cap, float *G, ptrdiff_t ldg);

/* ALiBi (Press et al. 2022, "Train Short, Test Long") on a transposed score tile
 * (one row per key, one column per query): for m < M, n < N,
 *   S[m*lds + n] -= slope[n] * |m - pos[n]|
 * where pos[n] is the column's aligned diagonal i + d minus the tile's first
 * key, as a float (exact while |pos| < 2^24), and slope[n] its head's slope. */
typedef void (*sdpa_alibi_cols_fn)(int M, int N, float *S, ptrdiff_t lds, const float *pos, const float *slope);

/* The same on a natural score tile (one row per query, one column per key):
 *   S[m*lds + n] -= slope[m] * |n - pos[m]|. */
typedef void (*sdpa_alibi_rows_fn)(int M, int N, float *S, ptrdiff_t lds, const float *pos, const float *slope);

/* Backward of the soft-cap: dS[m*ldd + n] = dS * G[m*ldg + n] + 0.0 for every entry
 * that is not the masked sentinel (-0.0), which stays as it is (so -0.0 keeps
 * meaning "masked"; an allowed entry becomes +0, never -0). */
typedef void (*sdpa_bwd_softcap_fn)(int M, int N, float *dS, ptrdiff_t ldd, const float *G, ptrdiff_t ldg);

/* Reduced-precision storage (src/dtype.h gives the exact scalar definitions):
 * rows of a bf16 or fp16 tensor to fp32, dst[r*ldd + c] = widen(src[r*lds + c])
 * (exact), and fp32 rows to bf16 or fp16, dst[r*ldd + c] = narrow(src[r*lds + c])
 * (round to nearest even, fp16 overflow to +-inf, NaN stays NaN): every ISA gives
 * the bits of dtype.h. Strides in elements; rows, cols >= 0. */
typedef void (*sdpa_widen_rows_fn)(int rows, int cols, const uint16_t *src, ptrdiff_t lds, float *dst,
                                   ptrdiff_t ldd);
typedef void (*sdpa_narrow_rows_fn)(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst,
                                    ptrdiff_t ldd);

/* bf16 pair products (AVX512-BF16 `vdpbf16ps`, AMX `tdpbf16ps`, NEON BFMMLA / BFDOT; optional per ISA, NULL:
 * not provided; where the table has tiles_begin, only between tiles_begin and
 * tiles_end on the calling thread).
 * The reduction dimension runs in pairs of adjacent bf16, one pair per 32-bit word
 * (element 2p in the low half, 2p + 1 in the high half):
 *   C(m,n) = alpha * sum_p dot2(A pair (m,p), B[p*ldb + n])            (C overwritten)
 *   C(m,n) = c_row_scale[m] * C(m,n) + alpha * sum_p dot2(...)         (SDPA_GEMM_ACCUMULATE;
 *            c_row_scale NULL: C(m,n) + alpha * sum), as sdpa_gemm_fn,
 * where A pair (m,p) is the two uint16 at A + m*rs_a + p*cs_a (strides in uint16
 * elements; any alignment) and dot2 adds the two products of a pair to the lane's
 * sum with the instruction's arithmetic: bf16 subnormals count as zero (so a
 * subnormal times inf is NaN), each step rounds (to nearest even on x86; to odd on
 * Arm's BFDOT and BFMMLA), a subnormal sum is flushed to zero (docs/design.md, "What is rounded"). Sums run over p in
 * increasing order (AMX: 16-pair steps in increasing order, each added in the
 * instruction's own order), one fixed order per (m,n), whatever the caller's threading.
 * Only SDPA_GEMM_ACCUMULATE is a valid flag (no masked sentinels in its inputs). */
typedef void (*sdpa_gemm_bf16_pairs_fn)(int M, int N, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a,
                                        ptrdiff_t cs_a, const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                                        int flags, const float *c_row_scale);
/* Pairs from rows: dst[p*ldd + c] = low half bf16(src row 2p, column c), high half
 * bf16(src row 2p + 1, column c) (0 when rows is odd and 2p + 1 == rows), for
 * p < ceil(rows / 2), c < cols. pack_pairs_f32 rounds fp32 to nearest even (subnormal
 * inputs to zero, NaN stays NaN); pack_pairs_bf16 copies bf16 bit patterns and
 * returns 1 when every one of them is finite, 0 when one is an inf or NaN. Strides
 * in elements of each side's type. round_rows_bf16 (an sdpa_narrow_rows_fn): fp32
 * rows to bf16 rows with pack_pairs_f32's rounding, for an A operand whose pairs run
 * along its rows (the backward's P^T and dS^T) and K, V rows held as fp32. */
typedef void (*sdpa_pack_pairs_f32_fn)(int rows, int cols, const float *src, ptrdiff_t lds, uint32_t *dst,
                                       ptrdiff_t ldd);
typedef int (*sdpa_pack_pairs_bf16_fn)(int rows, int cols, const uint16_t *src, ptrdiff_t lds, uint32_t *dst,
                                       ptrdiff_t ldd);
/* Rows of bf16 to their transpose in pairs: dst[p*ldd + r] = src[r*lds + 2p] |
 * src[r*lds + 2p + 1] << 16 for r < rows, p < pairs (a bf16 Q tile to Q^T's pairs). */
typedef void (*sdpa_transpose_pairs_fn)(int rows, int pairs, const uint16_t *src, ptrdiff_t lds, uint32_t *dst,
                                        ptrdiff_t ldd);

/* sdpa_kernels.wide_prefetch */
enum { SDPA_PREFETCH_NEVER = 0, SDPA_PREFETCH_ALWAYS = 1, SDPA_PREFETCH_STREAMING = 2 };

/* One ISA's kernels and the shapes that go with them (BLIS keeps its block sizes
 * beside its micro-kernel pointers). The driver learns every vector width, step,
 * alignment and block size from here; no other file outside the ISA's own layer
 * writes them as literals. */
typedef struct sdpa_kernels {
    sdpa_isa isa;
    const char *name;
    /* vector shapes */
    int vec_floats;       /* floats per vector register */
    int col_align;        /* tile row strides (ld) and the column cut of a banded tile's
                             products are multiples of this many floats (a multiple of
                             vec_floats) */
    int nt_step;          /* keys per step of the few-column (decode) path: the N of
                             online_softmax_rows, the row stride of its S tile */
    int attend_max_rows;  /* attend_rows takes at most this many query rows */
    int attend_max_vecs;  /* ... query rows of at most this many vectors in registers */
    int attend_scratch;   /* floats of scratch attend_rows needs */
    int bwd_rows_max_rows; /* bwd_rows takes at most this many query rows (0: no bwd_rows) */
    int bwd_rows_scratch;  /* floats of scratch bwd_rows needs */
    /* block sizes */
    int block_q; /* query rows per tile (N of the score tile) */
    int block_k; /* key rows per tile (M of the score tile) */
    int band_keys; /* keys per band in the masked runs of a banded tile (driver's products) */
    int nt_max_cols; /* tiles of at most this many query columns use gemm_nt for S (natural
                        layout) and gemm_stream for P V (0: never) */
    int tile_pad; /* floats added to the row stride (ld) of the tile buffers when block_q rounded
                     up to col_align is a multiple of 256 bytes (0 or a multiple of col_align,
                     at most 64): the row stride then spreads a column block's rows over every
                     L1 set; 16 on avx2, whose 16-column gemm blocks read 128 such rows per
                     pass (driver.h, plan_ld) */
    int wide_prefetch; /* the wide (prefill) path's software prefetch of the next key tile's K
                          and V rows: SDPA_PREFETCH_NEVER, _ALWAYS, or _STREAMING (only where
                          little of K and V is reused: see forward.c) */
    int bf16_dot; /* 1: bf16 problems (Q and K/V bf16) run their prefill key tiles through the
                     pair products below (set per microarchitecture where they are faster than
                     the fp32 products on widened tiles; NEON: wherever the CPU has BF16
                     (BFMMLA, BFDOT), not yet measured on Arm hardware; 0 where the kernels
                     are NULL) */
    int bwd_bf16_dot; /* 1: a backward of bf16 Q, K/V and O runs the five products of its wide
                         tiles through the pair products (backward_tile.c): amx, where the tile
                         products pay for the extra packing, and Zen 4's avx512 (tuning.c);
                         SDPA_TUNE=bwd_bf16_dot=1 elsewhere */
    int bwd_pairs_block_q, bwd_pairs_block_k; /* 0, or the blocks of a backward on the pair
                                                 products (backward_typed.c, group_plan) */
    int pairs_block_q, pairs_block_k; /* 0, or the block sizes of a forward that runs the pair
                                         products (its fp32 work is smaller per tile there) */
    sdpa_gemm_fn gemm;
    sdpa_online_softmax_fn online_softmax;
    sdpa_scale_rows_fn scale_rows;
    sdpa_bwd_probs_fn bwd_probs;
    sdpa_bwd_dscores_fn bwd_dscores;
    sdpa_transpose_fn transpose;
    sdpa_gemm_nt_fn gemm_nt;
    /* gemm_nt with the same bits, query rows four at a time where two fit the registers:
     * each key row read once per four rows (the backward's few-column tiles, where the
     * products set the time; the forward's decode, whose K streams from memory, was
     * slower so: docs/perf-notes.md) */
    sdpa_gemm_nt_fn gemm_nt_rows4;
    sdpa_online_softmax_rows_fn online_softmax_rows;
    sdpa_gemm_stream_fn gemm_stream;
    sdpa_attend_rows_fn attend_rows; /* NULL: not provided */
    sdpa_attend_rows16_fn attend_rows_bf16, attend_rows_f16; /* NULL: not provided */
    /* NULL: not provided (the backward then widens runs of keys and composes the steps).
     * K/V of type bf16, fp16 (backward_typed.c's decode groups), fp32 (not used by the
     * driver, whose fp32 tiles are faster on fp32 K/V: docs/perf-notes.md; checkasm's
     * reference for the 16-bit variants' bits) */
    sdpa_bwd_rows_fn bwd_rows_f32, bwd_rows_bf16, bwd_rows_f16;
    /* NULL, or attend_rows_bf16 for query rows that hold bf16 values (a bf16 Q): where the
     * ISA takes the shape, the scores Q K^T on its bf16 pair products (AVX512-BF16
     * vdpbf16ps: products exact, summed in the kernel's own fixed order, bf16
     * subnormals as zero), the rest as attend_rows_bf16; other shapes attend_rows_bf16's
     * bits. Used where the table's bf16_dot is 1 (forward.c). */
    sdpa_attend_rows16_fn attend_rows_bf16_pairs;
    sdpa_softcap_fn softcap;
    sdpa_alibi_cols_fn alibi_cols;
    sdpa_alibi_rows_fn alibi_rows;
    sdpa_bwd_softcap_fn bwd_softcap;
    sdpa_widen_rows_fn widen_bf16, widen_f16;
    sdpa_narrow_rows_fn narrow_bf16, narrow_f16;
    sdpa_gemm_bf16_pairs_fn gemm_bf16_pairs;  /* NULL: not provided */
    sdpa_pack_pairs_f32_fn pack_pairs_f32;    /* with gemm_bf16_pairs */
    sdpa_pack_pairs_bf16_fn pack_pairs_bf16;  /* with gemm_bf16_pairs */
    sdpa_transpose_pairs_fn transpose_pairs;  /* with gemm_bf16_pairs */
    /* with gemm_bf16_pairs: online_softmax over the scores scale * S (each element one fp32
     * product, as gemm_bf16_pairs' alpha makes it: scale 1 reads S as it is) whose P^T goes to
     * pack_pairs_f32's layout in dst (the same bits as S scaled, online_softmax then
     * pack_pairs_f32; S is left as it was). The forward hands it the unscaled products of a
     * tile that nothing else touches, so the tile product stores them without an epilogue. */
    void (*online_softmax_pairs)(int M, int N, const float *S, ptrdiff_t lds, float scale, float *m, float *l,
                                 float *alpha, uint32_t *dst, ptrdiff_t ldd);
    /* NULL, or online_softmax_pairs whose P goes to gemm_bf16_pairs' A rows instead: each
     * column's pairs in a row, dst[c * ldd + p], the words from ceil(M / 2) to the next
     * multiple of 16 set to 0 (ldd at least that; the same words as online_softmax_pairs, so
     * the products over them give the same bits); amx, whose tile products load such rows in
     * place instead of transposing pairs down a column into panels */
    void (*online_softmax_pairs_rows)(int M, int N, const float *S, ptrdiff_t lds, float scale, float *m,
                                      float *l, float *alpha, uint32_t *dst, ptrdiff_t ldd);
    /* with gemm_bf16_pairs: bwd_dscores whose dS goes to round_rows_bf16's rows (ds16) and
     * pack_pairs_f32's key pairs (dsp) instead of back to dP (the same bits as those three) */
    void (*bwd_dscores_pairs)(int M, int N, const float *P, ptrdiff_t ldp, const float *dP, ptrdiff_t lddp,
                              const float *d, uint16_t *ds16, ptrdiff_t ld16, uint32_t *dsp, ptrdiff_t lddsp);
    sdpa_narrow_rows_fn round_rows_bf16;      /* with gemm_bf16_pairs: narrow_bf16's layout with
                                                 pack_pairs_f32's rounding (subnormals to 0) */
    /* with gemm_bf16_pairs, or NULL (amx, whose tile products sum in another order): for
     * n < N, out[n] = the bits of gemm_bf16_pairs(1, 1, P, 1.0f, ...) for column n alone,
     * A's pairs A[p*lda + n] and B's B[p*ldb + n] (both [P][columns] words): the backward's
     * D = rowsum(dO * O) summed exactly as its dP on the pair products (backward_tile.c) */
    void (*dot_pairs_cols)(int P, int N, const uint32_t *A, ptrdiff_t lda, const uint32_t *B, ptrdiff_t ldb,
                           float *out);
    /* NULL, or the bracket a thread puts around its gemm_bf16_pairs calls of one
     * library call (AMX: tiles_begin loads the tile configuration, ldtilecfg;
     * tiles_end releases the tile state, tilerelease), so that neither a tile
     * configuration nor tile data crosses into the caller's code. */
    void (*tiles_begin)(void);
    void (*tiles_end)(void);
} sdpa_kernels;

/* The cut-off of every ISA's exp (kernels_scalar.c, simd_tmpl.h): a probability
 * 2^y, y = x log2(e) rounded to float, with y below SDPA_EXP_CUTOFF_LOG2 is exactly
 * +0. The exponent x is a score minus the row's running max or LSE, so such a P is
 * at most 2^-100 of the row's largest and changes no fp32 row sum or product sum,
 * while its products with values, dP or K would reach the subnormal range, which
 * CPUs compute slowly (steep ALiBi slopes over long rows: docs/perf-notes.md).
 * The library never sets FTZ/DAZ: subnormal inputs keep their values. */
#define SDPA_EXP_CUTOFF_LOG2 (-100.0f)

/* The masked-entry sentinel (see the top of this file): the probability of a
 * masked score, -0.0 exactly. One definition for scalar, SIMD and driver code. */
#define SDPA_MASKED_SENTINEL (-0.0f)
static inline int sdpa_is_masked_sentinel(float x)
{
    return x == 0.0f && __builtin_signbit(x);
}

/* Fills the table for one ISA: scalar entries first, then the ISA's own
 * (entries an ISA does not provide stay scalar). Returns 0, or -1 if the ISA is
 * not compiled in. Does not check the CPU. */
int sdpa_kernels_init(sdpa_kernels *table, sdpa_isa isa);

/* The table for an ISA if it is compiled in and supported, else NULL.
 * SDPA_ISA_AUTO: the process-wide active table. Runs detection on first use. */
const sdpa_kernels *sdpa_kernels_get(sdpa_isa isa);

/* Per-ISA fill-ins (each ISA's file defines its own). */
void sdpa_kernels_init_scalar(sdpa_kernels *table);
void sdpa_kernels_init_avx2(sdpa_kernels *table);
void sdpa_kernels_init_avx512(sdpa_kernels *table);
void sdpa_kernels_init_neon(sdpa_kernels *table);
/* The AVX512-BF16 pair products, added to the AVX-512 table when CPUID has AVX512_BF16. */
void sdpa_kernels_init_avx512_bf16(sdpa_kernels *table);
/* attend_rows_bf16_pairs of the AVX-512 table (x86/attend_pairs_avx512.h, built into
 * kernels_avx512.c; issues vdpbf16ps: only where CPUID has AVX512_BF16). */
int sdpa_avx512_attend_rows_bf16_pairs(int M, int N, int Dk, int Dv, float scale, const float *Q, ptrdiff_t ldq,
                                       const uint16_t *K, ptrdiff_t ldk, const uint16_t *V, ptrdiff_t ldv, float *m,
                                       float *l, float *O, ptrdiff_t ldo, float *scratch);
/* bwd_rows_bf16 with dK, dV narrowed by vcvtneps2bf16 (x86/bwd_rows_avx512_bf16.c, the
 * same bits as the AVX-512 table's), installed by sdpa_kernels_init_avx512_bf16. */
sdpa_bwd_rows_fn sdpa_avx512_bf16_bwd_rows(void);
/* online_softmax_pairs_rows of the AVX512-BF16 kernels (x86/kernels_avx512_bf16.c), for amx. */
void sdpa_avx512_online_softmax_pairs_rows(int M, int N, const float *S, ptrdiff_t lds, float scale, float *m,
                                           float *l, float *alpha, uint32_t *dst, ptrdiff_t ldd);
/* The amx rung: the AVX512-BF16 packs, gemm_bf16_pairs on AMX tiles, bf16_dot on. */
void sdpa_kernels_init_amx(sdpa_kernels *table);
/* The BF16 pair products (src/arm/kernels_neon_bf16.c: BFMMLA for whole 8 x 8 blocks,
 * BFDOT for the rest) and their packs (src/arm/kernels_neon.c), added to the NEON table
 * when the OS reports BF16; bf16_dot on. */
void sdpa_kernels_init_neon_bf16(sdpa_kernels *table);
void sdpa_neon_gemm_bf16_pairs(int M, int N, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a,
                               const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int flags,
                               const float *c_row_scale);
/* The same products on BFMMLA (the table's gemm_bf16_pairs where the OS reports BF16),
 * the same bits as sdpa_neon_gemm_bf16_pairs (BFDOT) by the instructions' definitions. */
void sdpa_neon_gemm_bf16_pairs_mmla(int M, int N, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a,
                                    ptrdiff_t cs_a, const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                                    int flags, const float *c_row_scale);
void sdpa_neon_dot_pairs_cols(int P, int N, const uint32_t *A, ptrdiff_t lda, const uint32_t *B, ptrdiff_t ldb,
                              float *out);

#endif /* SDPA_KERNELS_H */
