/* SPDX-License-Identifier: MIT */
/* simd_tmpl.h - every kernel of the table (src/kernels.h) written once over a small vector layer.
 *
 * libdeflate / ggml style: an ISA translation unit includes its vector layer
 * (src/x86/vec_avx2.h, src/x86/vec_avx512.h, src/arm/vec_neon.h) and then this
 * file, which includes one header per kernel family (src/simd/gemm.h,
 * softmax.h, decode.h, stream.h, attend.h, bwd_rows.h, transpose.h, variants.h, convert.h) and provides tmpl_fill_table(). Only
 * static (inline) definitions live in these headers, so nothing compiled with
 * one ISA's flags can leak into another translation unit. Every function they
 * instantiate carries the layer's name as a suffix (TMPL_FN(gemm) is gemm_avx2,
 * gemm_avx512 or gemm_neon), so that nm, perf and gdb tell the ISAs apart; the
 * always-inline building blocks (tmpl_*) never become symbols.
 *
 * What the vector layer provides:
 *   SDPA_VEC_ISA        the ISA's name (avx2, avx512, neon): the symbol suffix
 *   V_LANES             fp32 lanes per vector (VL)
 *   V_GEMM_MR, _NV      gemm register block: MR rows x NV vectors of accumulators
 *   V_GEMM_MR_SKIP      (optional) rows per pass in the SKIP_ZERO kernels, whose
 *                       predicates need registers too (default MR)
 *   V_TRANSPOSE_BLOCK   side of the square block that V_TRANSPOSE transposes
 *   V_COL_ALIGN         the table's col_align (floats; a multiple of V_LANES)
 *   V_NT_STEP           keys per step of the few-column (decode) path: the
 *                       table's nt_step, attend_rows' step, gemm_nt's key block
 *   V_ATTEND_MAX_ROWS   query rows attend_rows takes at most
 *   v_f32, v_mask       a vector, a per-lane predicate
 *   v_tail              a partial-vector descriptor for 1..VL leading lanes
 *   V_ZERO() V_SET1(x) V_LOAD(p) V_STORE(p,v) V_BCAST(p: one float to all lanes)
 *   V_TAIL_INIT(n) V_LOAD_T(p,t) V_STORE_T(p,v,t)   touch only the n leading
 *                       elements (the loaded vector's other lanes are 0)
 *   V_ADD V_SUB V_MUL V_DIV, V_FMA(a,b,c) = a*b + c (fused)
 *   V_PIN(x)            (optional) keeps the vector x in a register, so that a load that
 *                       feeds several FMAs is not repeated as each one's memory operand
 *   V_ABS(a)            a with its sign bit cleared (NaN stays NaN)
 *   V_MAX(a,b)          a > b ? a : b (so b when either is NaN, as x86 max)
 *   V_NEZ(a)            a != 0, true for NaN;  V_EQ, V_LT (ordered: false for NaN)
 *   V_ISMASKED(a), V_NOTMASKED(a)  a is / is not the masked sentinel -0.0 (bitwise)
 *   V_MAND(m1,m2)       and of predicates;  V_SEL(m,a,b) = m ? a : b
 *   V_ALL(m)            nonzero when the predicate holds in every lane
 *   either V_FMA_M(a,b,c,m) = m ? a*b + c : c (a masked FMA, AVX-512), or
 *   V_ZERO_UNLESS(v,m)  m ? v : +0 (a bitwise and, off the accumulator chain)
 *   V_EXP2(x)           SLEEF's u10 vector exp2f of this ISA
 *   V_TANH(x)           SLEEF's u35 vector tanhf of this ISA (3.5 ulp; +-inf gives +-1)
 *   V_TRANSPOSE(src,lds,dst,ldd)   one V_TRANSPOSE_BLOCK square block
 *   V_TRANSPOSE16(src,lds,dst,ldd) (optional) one 16 x 16 block
 *   V_NT_QREGS          vector registers for query rows (gemm_nt, attend_rows) and
 *                       for two output rows (gemm_stream): 8 or 16
 *   V_STREAM_HREGS      vector registers for one output row (gemm_stream): 1..24
 *   V_STREAM_PAIR_NV    (optional) gemm_stream's pair column chunk, see stream.h
 *   V_ATTEND_QUAD       (optional) attend_rows over a bf16 / fp16 cache takes query rows
 *                       four at a time where two fit V_NT_QREGS (simd/attend.h)
 *   V_STREAM(p,v), V_STREAM_ALIGN, V_STREAM_FENCE()  (optional) non-temporal stores
 *   V_REDUCE4(a0,a1,a2,a3,out)     out[j] = sum of the lanes of a_j (float out[4]), in
 *                       one fixed order that is the same for every j
 *   V_HMAX(a)           the largest lane of a (no lane is NaN where it is used)
 *   V_WIDEN_BF16(p) V_WIDEN_F16(p)        VL uint16 (bf16 / fp16 bits) at p to a v_f32
 *   V_NARROW_BF16(p,v) V_NARROW_F16(p,v)  v to VL uint16 at p; all four with the bits of
 *                       src/dtype.h for every input (simd/convert.h)
 *   V_WIDEN_BF16_EO(p,e,o), V_INTERLEAVE(e,o)  (optional) 2 VL bf16 at p in one load: e the
 *                       even elements widened, o the odd; V_INTERLEAVE puts such a pair of
 *                       vectors back in element order (e the first VL, o the next)
 *   V_WIDEN_BF16_T(p,t) V_WIDEN_F16_T(p,t) V_NARROW_BF16_T(p,v,t) V_NARROW_F16_T(p,v,t)
 *                       (optional) the same for the leading lanes of a V_TAIL_INIT tail
 *
 * Numerics: the gemm accumulates each C(m,n) with one fused multiply-add per k
 * in increasing k (the scalar kernel's order; it rounds each product, so the
 * last bits may differ), then C = alpha*acc, or C = fma(alpha, acc, C): the
 * same bits for any caller threading and any position of (m,n) in its block.
 * A skipped term (SKIP_ZERO_A/B) either leaves the accumulator alone
 * (masked FMA) or, without masked FMA, becomes fma(+0 or a, +0 or b, acc) with
 * the NaN/Inf side zeroed: the product is a zero, which leaves every acc
 * unchanged but -0 (an accumulator that starts at +0 is -0 only after an
 * underflow below the smallest denormal; then the zero's sign may differ).
 * gemm_nt keeps vector accumulators per (m,n): where the query rows fit in
 * registers (K <= V_NT_QREGS vectors), two, one for the even and one for the
 * odd vectors of k, added before the reduction; else one. Lane l sums the
 * products of its k (fused, in increasing k; the tail's missing lanes add +0
 * products), then V_REDUCE4 adds the lanes in its fixed tree and C =
 * alpha*sum. Each C(m,n) thus depends only on row m of A, row n of B, K and
 * alpha, not on M, N or where (m,n) falls in a block.
 * Streams (decode): the few-column kernels (gemm_nt, gemm_stream,
 * attend_rows) read each K and V row whole, front to back, and load full
 * vectors with plain loads; the masked forms are for real tails only (a row
 * order that reads several rows side by side, or masked loads of full
 * vectors, lose memory bandwidth: the hardware prefetchers do not follow
 * them; docs/perf-notes.md has the figures).
 * Softmax sums run in increasing k per column, as in the scalar kernel.
 * exp(x) is SLEEF's u10 2^y of y = x log2(e) rounded to float, as the scalar
 * kernels do it with libm's exp2f (SLEEF's exp2f is cheaper than its expf):
 * besides the ulp or so of u10, the rounding of y costs a relative error of at
 * most |x| (2^-24 + 1.4e-8) (the product, and log2(e) rounded to float), which
 * is below 1e-6 for the probabilities above e^-16 that carry weight (every x
 * here is a score minus its running maximum or LSE, so x <= 0 but for NaN).
 * Results below 2^SDPA_EXP_CUTOFF_LOG2 (kernels.h: y < -100) are flushed to +0,
 * as the scalar kernels do (XNNPACK cuts at FLT_MIN): they carry no weight next
 * to the row max, which always contributes exp(0) = 1, and their products with
 * values would be denormals, which are slow. */
#ifndef SDPA_SIMD_TMPL_H
#define SDPA_SIMD_TMPL_H

#ifndef SDPA_VEC_ISA
#error "include a vector layer (x86/vec_avx2.h, x86/vec_avx512.h, arm/vec_neon.h) first"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* The ISA suffix of every instantiated function and table (libdeflate's
 * ADD_SUFFIX, XNNPACK's __avx2): TMPL_FN(gemm) -> gemm_avx2. */
#define TMPL_CAT2(a, b) a##_##b
#define TMPL_CAT(a, b) TMPL_CAT2(a, b)
#define TMPL_FN(name) TMPL_CAT(name, SDPA_VEC_ISA)

#define TMPL_VL V_LANES
#define TMPL_MR V_GEMM_MR
#define TMPL_NV V_GEMM_NV
#define TMPL_NB (V_GEMM_NV * V_LANES) /* columns per gemm register block */
#ifdef V_GEMM_MR_SKIP
#define TMPL_MR_SKIP V_GEMM_MR_SKIP
#else
#define TMPL_MR_SKIP V_GEMM_MR
#endif

/* The arity of V_REDUCE4: rows reduced together by online_softmax_rows, and
 * gemm_nt's (row, key) pairs per reduction. */
#define TMPL_REDUCE_N 4

#define TMPL_INLINE static inline __attribute__((always_inline))

#if defined(__clang__)
#define TMPL_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define TMPL_UNROLL _Pragma("GCC unroll 32") /* register blocks go up to 24 vectors */
#else
#define TMPL_UNROLL
#endif

/* The X-macro list behind every family of instantiations: TMPL_UPTO(n, X, ...)
 * is X(1, ...) X(2, ...) ... X(n, ...) for a literal n (after expansion) of
 * 1..24, e.g. one kernel per vector count up to the layer's register budget. */
#define TMPL_UPTO(n, X, ...) TMPL_CAT(TMPL_UPTO, n)(X, __VA_ARGS__)
#define TMPL_UPTO_1(X, ...) X(1, __VA_ARGS__)
#define TMPL_UPTO_2(X, ...) TMPL_UPTO_1(X, __VA_ARGS__) X(2, __VA_ARGS__)
#define TMPL_UPTO_3(X, ...) TMPL_UPTO_2(X, __VA_ARGS__) X(3, __VA_ARGS__)
#define TMPL_UPTO_4(X, ...) TMPL_UPTO_3(X, __VA_ARGS__) X(4, __VA_ARGS__)
#define TMPL_UPTO_5(X, ...) TMPL_UPTO_4(X, __VA_ARGS__) X(5, __VA_ARGS__)
#define TMPL_UPTO_6(X, ...) TMPL_UPTO_5(X, __VA_ARGS__) X(6, __VA_ARGS__)
#define TMPL_UPTO_7(X, ...) TMPL_UPTO_6(X, __VA_ARGS__) X(7, __VA_ARGS__)
#define TMPL_UPTO_8(X, ...) TMPL_UPTO_7(X, __VA_ARGS__) X(8, __VA_ARGS__)
#define TMPL_UPTO_9(X, ...) TMPL_UPTO_8(X, __VA_ARGS__) X(9, __VA_ARGS__)
#define TMPL_UPTO_10(X, ...) TMPL_UPTO_9(X, __VA_ARGS__) X(10, __VA_ARGS__)
#define TMPL_UPTO_11(X, ...) TMPL_UPTO_10(X, __VA_ARGS__) X(11, __VA_ARGS__)
#define TMPL_UPTO_12(X, ...) TMPL_UPTO_11(X, __VA_ARGS__) X(12, __VA_ARGS__)
#define TMPL_UPTO_13(X, ...) TMPL_UPTO_12(X, __VA_ARGS__) X(13, __VA_ARGS__)
#define TMPL_UPTO_14(X, ...) TMPL_UPTO_13(X, __VA_ARGS__) X(14, __VA_ARGS__)
#define TMPL_UPTO_15(X, ...) TMPL_UPTO_14(X, __VA_ARGS__) X(15, __VA_ARGS__)
#define TMPL_UPTO_16(X, ...) TMPL_UPTO_15(X, __VA_ARGS__) X(16, __VA_ARGS__)
#define TMPL_UPTO_17(X, ...) TMPL_UPTO_16(X, __VA_ARGS__) X(17, __VA_ARGS__)
#define TMPL_UPTO_18(X, ...) TMPL_UPTO_17(X, __VA_ARGS__) X(18, __VA_ARGS__)
#define TMPL_UPTO_19(X, ...) TMPL_UPTO_18(X, __VA_ARGS__) X(19, __VA_ARGS__)
#define TMPL_UPTO_20(X, ...) TMPL_UPTO_19(X, __VA_ARGS__) X(20, __VA_ARGS__)
#define TMPL_UPTO_21(X, ...) TMPL_UPTO_20(X, __VA_ARGS__) X(21, __VA_ARGS__)
#define TMPL_UPTO_22(X, ...) TMPL_UPTO_21(X, __VA_ARGS__) X(22, __VA_ARGS__)
#define TMPL_UPTO_23(X, ...) TMPL_UPTO_22(X, __VA_ARGS__) X(23, __VA_ARGS__)
#define TMPL_UPTO_24(X, ...) TMPL_UPTO_23(X, __VA_ARGS__) X(24, __VA_ARGS__)

/* Loads/stores of a whole vector, or of a tail when the compile-time `tail` is set. */
#define TMPL_LOAD(tail, p, t) ((tail) ? V_LOAD_T((p), (t)) : V_LOAD(p))
#define TMPL_STORE(tail, p, v, t)                                                                  \
    do {                                                                                           \
        if (tail)                                                                                  \
            V_STORE_T((p), (v), (t));                                                              \
        else                                                                                       \
            V_STORE((p), (v));                                                                     \
    } while (0)

/* exp(x) = 2^y, y = x log2(e) rounded to float, with the cut-off of kernels.h:
 * y < SDPA_EXP_CUTOFF_LOG2 gives exactly 0 (so -inf gives 0), NaN stays NaN, and
 * SLEEF never sees an input that would make a denormal.
 * The cut-off maps such y to -inf before the call (SLEEF's 2^-inf is exactly
 * 0), so nothing has to live across the call. */
/* The argument tmpl_exp gives V_EXP2: x log2(e), -inf below the cut-off. */
TMPL_INLINE v_f32 tmpl_exp_arg(v_f32 x)
{
    const v_f32 y = V_MUL(x, V_SET1(0x1.715476p+0f)); /* log2(e) rounded to float */
    return V_SEL(V_LT(y, V_SET1(SDPA_EXP_CUTOFF_LOG2)), V_SET1(-INFINITY), y); /* NaN < c is false */
}

TMPL_INLINE v_f32 tmpl_exp(v_f32 x)
{
    return V_EXP2(tmpl_exp_arg(x));
}

/* Rows per chunk where a loop's exps run in a phase of their own (a loop of SLEEF calls
 * with nothing else live across them, so that nothing is spilled around each call):
 * the prefill's online softmax (for the backward's P it measured no faster). */
#define TMPL_EXP_CHUNK 32

#include "simd/gemm.h"
#include "simd/softmax.h"
#include "simd/decode.h"
#include "simd/stream.h"
#include "simd/attend.h"
#include "simd/bwd_rows.h"
#include "simd/transpose.h"
#include "simd/variants.h"
#include "simd/convert.h"

/* Installs every kernel of these headers and the vector shapes that go with
 * them; the ISA's init sets isa, name and block sizes. */
TMPL_INLINE void tmpl_fill_table(sdpa_kernels *t)
{
    t->vec_floats = V_LANES;
    t->col_align = V_COL_ALIGN;
    t->nt_step = V_NT_STEP;
    t->attend_max_rows = V_ATTEND_MAX_ROWS;
    t->attend_max_vecs = V_NT_QREGS;
    t->attend_scratch = TMPL_ATTEND_SCRATCH;
    t->gemm = TMPL_FN(gemm);
    t->online_softmax = TMPL_FN(online_softmax);
    t->scale_rows = TMPL_FN(scale_rows);
    t->bwd_probs = TMPL_FN(bwd_probs);
    t->bwd_dscores = TMPL_FN(bwd_dscores);
    t->transpose = TMPL_FN(transpose);
    t->gemm_nt = TMPL_FN(gemm_nt);
    t->gemm_nt_rows4 = TMPL_FN(gemm_nt_rows4);
    t->online_softmax_rows = TMPL_FN(online_softmax_rows);
    t->gemm_stream = TMPL_FN(gemm_stream);
    t->attend_rows = TMPL_FN(attend_rows);
    t->attend_rows_bf16 = TMPL_FN(attend_rows_bf16);
    t->attend_rows_f16 = TMPL_FN(attend_rows_f16);
    t->bwd_rows_max_rows = TMPL_BWD_ROWS_MAX;
    t->bwd_rows_scratch = TMPL_BWD_ROWS_SCRATCH;
    t->bwd_rows_f32 = TMPL_FN(bwd_rows_f32);
    t->bwd_rows_bf16 = TMPL_FN(bwd_rows_bf16);
    t->bwd_rows_f16 = TMPL_FN(bwd_rows_f16);
    t->softcap = TMPL_FN(softcap);
    t->alibi_cols = TMPL_FN(alibi_cols);
    t->alibi_rows = TMPL_FN(alibi_rows);
    t->bwd_softcap = TMPL_FN(bwd_softcap);
    t->widen_bf16 = TMPL_FN(widen_bf16);
    t->widen_f16 = TMPL_FN(widen_f16);
    t->narrow_bf16 = TMPL_FN(narrow_bf16);
    t->narrow_f16 = TMPL_FN(narrow_f16);
}

#endif /* SDPA_SIMD_TMPL_H */
