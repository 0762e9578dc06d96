/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx512_bf16.c - AVX512-BF16 pair products for the bf16 prefill path.
 *
 * `vdpbf16ps` multiplies 32 pairs of bf16 and adds each pair's two products to one
 * fp32 lane: twice the multiply-adds of an fp32 FMA per instruction. Zen 4 issues it
 * at its fp32 FMA rate (1 zmm per cycle), so it doubles the products' FLOP rate there
 * (docs/perf-notes.md, "Zen 4 again"); Emerald Rapids issues it at about half its FMA
 * rate, so the tuning table turns the path on per microarchitecture (bf16_dot).
 *
 * Layout ("pairs"): the reduction dimension runs in pairs of adjacent bf16, one
 * pair per 32-bit word (element 2p in the low half, 2p + 1 in the high half):
 *   - a bf16 K row is already pairs along head_dim; a Q^T or P^T tile (fp32, one row
 *     per reduction index) is packed two rows at a time by pack_pairs_f32;
 *   - V rows are interleaved two keys at a time by pack_pairs_bf16.
 * The pair product gemm_bf16_pairs broadcasts A's pairs (any strides) and loads B's
 * as vectors along N, a register block of 4 rows x 4 zmm (16 accumulators; vdpbf16ps's
 * latency of 6 cycles at one per cycle needs at least 6 in flight).
 *
 * Arithmetic (the instruction's, Intel SDM "VDPBF16PS"): bf16 inputs that are
 * subnormal count as zero, each lane adds its two exact products to the accumulator
 * with round to nearest even, and a subnormal result is flushed to zero; MXCSR is not
 * consulted. pack_pairs_f32 rounds to nearest even with `vcvtne2ps2bf16` (subnormal
 * inputs to zero, NaN stays NaN). Built with the AVX-512 F/VL/BW/DQ and BF16 flags;
 * installed into the AVX-512 table only when CPUID reports AVX512_BF16. */
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#include "kernels.h"
#include "x86/transpose_avx512.h"

#define PAIR_MR 4
#define PAIR_NV 4

static inline __m512i load_pair(const uint16_t *a)
{
    uint32_t x;
    memcpy(&x, a, sizeof x);
    return _mm512_set1_epi32((int)x);
}

static inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* One block of mr rows x nv vectors of C (the last vector's lanes: tail), over P
 * pairs. mr and nv are compile-time constants at every call (always inlined). */
static inline __attribute__((always_inline)) void pairs_block(const int mr, const int nv, __mmask16 tail, int P,
                                                              float alpha, const uint16_t *A, ptrdiff_t rs_a,
                                                              ptrdiff_t cs_a, const uint32_t *B, ptrdiff_t ldb,
                                                              float *C, ptrdiff_t ldc, int flags,
                                                              const float *c_row_scale)
{
    __m512 acc[PAIR_MR][PAIR_NV];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++)
            acc[i][v] = _mm512_setzero_ps();
    for (int p = 0; p < P; p++) {
        const uint32_t *b = B + (ptrdiff_t)p * ldb;
        __m512i bv[PAIR_NV];
        for (int v = 0; v < nv; v++)
            bv[v] = v == nv - 1 ? _mm512_maskz_loadu_epi32(tail, b + 16 * v) : _mm512_loadu_si512(b + 16 * v);
        for (int i = 0; i < mr; i++) {
            const __m512i a = load_pair(A + (ptrdiff_t)i * rs_a + (ptrdiff_t)p * cs_a);
            for (int v = 0; v < nv; v++)
                acc[i][v] = dot_pairs(acc[i][v], a, bv[v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha);
    for (int i = 0; i < mr; i++) {
        float *c = C + (ptrdiff_t)i * ldc;
        for (int v = 0; v < nv; v++) {
            const __mmask16 k = v == nv - 1 ? tail : (__mmask16)0xFFFF;
            __m512 out = _mm512_mul_ps(va, acc[i][v]);
            if (flags & SDPA_GEMM_ACCUMULATE) {
                const __m512 old = _mm512_maskz_loadu_ps(k, c + 16 * v);
                out = c_row_scale ? _mm512_fmadd_ps(old, _mm512_set1_ps(c_row_scale[i]), out)
                                  : _mm512_add_ps(old, out);
            }
            _mm512_mask_storeu_ps(c + 16 * v, k, out);
        }
    }
}

/* Rows [m0, m0 + mr) of C, all N columns: 4-vector column blocks, then one block of
 * the 1..4 vectors left (the last one partial). */
static inline __attribute__((always_inline)) void pairs_rows(const int mr, int N, int P, float alpha,
                                                             const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a,
                                                             const uint32_t *B, ptrdiff_t ldb, float *C,
                                                             ptrdiff_t ldc, int flags, const float *rs)
{
    int n = 0;
    for (; n + 16 * PAIR_NV <= N; n += 16 * PAIR_NV)
        pairs_block(mr, PAIR_NV, 0xFFFF, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs);
    if (n == N)
        return;
    const int left = N - n, nv = (left + 15) / 16;
    const __mmask16 tail = (__mmask16)(left % 16 ? (1u << (left % 16)) - 1 : 0xFFFF);
    switch (nv) {
    case 1: pairs_block(mr, 1, tail, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    case 2: pairs_block(mr, 2, tail, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    case 3: pairs_block(mr, 3, tail, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    default: pairs_block(mr, 4, tail, P, alpha, A, rs_a, cs_a, B + n, ldb, C + n, ldc, flags, rs); break;
    }
}

static void gemm_bf16_pairs(int M, int N, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a,
                            const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int flags,
                            const float *c_row_scale)
{
    if (!(flags & SDPA_GEMM_ACCUMULATE))
        c_row_scale = NULL;
    int m = 0;
    for (; m + PAIR_MR <= M; m += PAIR_MR)
        pairs_rows(PAIR_MR, N, P, alpha, A + (ptrdiff_t)m * rs_a, rs_a, cs_a, B, ldb, C + (ptrdiff_t)m * ldc, ldc,
                   flags, c_row_scale ? c_row_scale + m : NULL);
    for (; m < M; m++)
        pairs_rows(1, N, P, alpha, A + (ptrdiff_t)m * rs_a, rs_a, cs_a, B, ldb, C + (ptrdiff_t)m * ldc, ldc, flags,
                   c_row_scale ? c_row_scale + m : NULL);
}

/* out[n] = gemm_bf16_pairs(1, 1, P, 1.0f)'s sum for column n alone: one lane per column,
 * the pairs in increasing p, the same vdpbf16ps per step (kernels.h); four vectors of
 * columns at a time, so that four independent sums hide the instruction's latency. */
static void dot_pairs_cols(int P, int N, const uint32_t *A, ptrdiff_t lda, const uint32_t *B, ptrdiff_t ldb,
                           float *out)
{
    for (int n0 = 0; n0 < N; n0 += 64) {
        __mmask16 k[4];
        __m512 acc[4];
        for (int v = 0; v < 4; v++) {
            const int left = N - n0 - 16 * v;
            k[v] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1u) : (__mmask16)0;
            acc[v] = _mm512_setzero_ps();
        }
        for (int p = 0; p < P; p++)
            for (int v = 0; v < 4; v++) {
                const ptrdiff_t n = n0 + 16 * v;
                acc[v] = dot_pairs(acc[v], _mm512_maskz_loadu_epi32(k[v], A + (ptrdiff_t)p * lda + n),
                                   _mm512_maskz_loadu_epi32(k[v], B + (ptrdiff_t)p * ldb + n));
            }
        for (int v = 0; v < 4; v++)
            _mm512_mask_storeu_ps(out + n0 + 16 * v, k[v], _mm512_mul_ps(_mm512_set1_ps(1.0f), acc[v]));
    }
}

/* dst[p][c] = bf16(src[2p][c]) | bf16(src[2p + 1][c]) << 16 (a missing odd row: 0). */
static void pack_pairs_f32(int rows, int cols, const float *src, ptrdiff_t lds, uint32_t *dst, ptrdiff_t ldd)
{
    /* after vcvtne2ps2bf16: row 2p's 16 values in words 0..15, row 2p + 1's in 16..31 */
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int p = 0; 2 * p < rows; p++) {
        const float *r0 = src + (ptrdiff_t)(2 * p) * lds, *r1 = r0 + lds;
        const int has1 = 2 * p + 1 < rows;
        uint32_t *d = dst + (ptrdiff_t)p * ldd;
        for (int c = 0; c < cols; c += 16) {
            const __mmask16 k = (__mmask16)(cols - c >= 16 ? 0xFFFF : (1u << (cols - c)) - 1);
            const __m512 a = _mm512_maskz_loadu_ps(k, r0 + c);
            const __m512 b = has1 ? _mm512_maskz_loadu_ps(k, r1 + c) : _mm512_setzero_ps();
            const __m512i t = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            _mm512_mask_storeu_epi32(d + c, k, _mm512_permutexvar_epi16(interleave, t));
        }
    }
}

/* dst[p][c] = src[2p][c] | src[2p + 1][c] << 16 (bf16 bit patterns; a missing odd row: 0);
 * 1 when every value is finite (exponent field not all ones). 32 columns at a time: the
 * two rows' words interleaved within 128-bit lanes (vpunpck{l,h}wd), then the lanes put
 * back in column order; the largest |value| pattern kept to test finiteness once. */
static int pack_pairs_bf16(int rows, int cols, const uint16_t *src, ptrdiff_t lds, uint32_t *dst, ptrdiff_t ldd)
{
    const __m512i expo = _mm512_set1_epi16(0x7F80), magnitude = _mm512_set1_epi16(0x7FFF);
    const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), second = _mm512_set_epi64(15, 14, 7, 6, 13, 12,
                                                                                                 5, 4);
    __m512i top = _mm512_setzero_si512(); /* per word: the largest |pattern| seen */
    __mmask32 nonfinite = 0;
    for (int p = 0; 2 * p < rows; p++) {
        const uint16_t *r0 = src + (ptrdiff_t)(2 * p) * lds, *r1 = r0 + lds;
        const int has1 = 2 * p + 1 < rows;
        uint32_t *d = dst + (ptrdiff_t)p * ldd;
        int c = 0;
        for (; has1 && c + 32 <= cols; c += 32) {
            const __m512i a = _mm512_loadu_si512(r0 + c), b = _mm512_loadu_si512(r1 + c);
            top = _mm512_max_epu16(top, _mm512_max_epu16(_mm512_and_si512(a, magnitude),
                                                         _mm512_and_si512(b, magnitude)));
            /* lane L of lo: columns 8L .. 8L + 3 paired; of hi: 8L + 4 .. 8L + 7 */
            const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
            _mm512_storeu_si512(d + c, _mm512_permutex2var_epi64(lo, first, hi));
            _mm512_storeu_si512(d + c + 16, _mm512_permutex2var_epi64(lo, second, hi));
        }
        for (; c < cols; c += 16) {
            const __mmask16 k = (__mmask16)(cols - c >= 16 ? 0xFFFF : (1u << (cols - c)) - 1);
            const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, r0 + c));
            const __m512i b = has1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, r1 + c))
                                   : _mm512_setzero_si512();
            const __m512i pair = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
            nonfinite |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(pair, expo), expo);
            _mm512_mask_storeu_epi32(d + c, k, pair);
        }
    }
    nonfinite |= _mm512_cmpge_epu16_mask(top, expo);
    return nonfinite == 0;
}

/* dst[p*ldd + r] = pair p of row r (src[r*lds + 2p] | src[r*lds + 2p + 1] << 16), for
 * r < rows, p < pairs: a bf16 Q tile to Q^T in pairs (once per query tile). */
static void transpose_pairs(int rows, int pairs, const uint16_t *src, ptrdiff_t lds, uint32_t *dst, ptrdiff_t ldd)
{
    /* 16 rows x 16 pairs at a time: a row's 16 words in one load, transposed in registers */
    for (int r0 = 0; r0 < rows; r0 += 16) {
        const int nr = rows - r0 < 16 ? rows - r0 : 16;
        const __mmask16 mr = (__mmask16)(nr == 16 ? 0xFFFF : (1u << nr) - 1);
        for (int p0 = 0; p0 < pairs; p0 += 16) {
            const int np = pairs - p0 < 16 ? pairs - p0 : 16;
            const __mmask16 mp = (__mmask16)(np == 16 ? 0xFFFF : (1u << np) - 1);
            __m512i v[16];
            for (int i = 0; i < 16; i++)
                v[i] = i < nr ? _mm512_maskz_loadu_epi32(mp, src + (ptrdiff_t)(r0 + i) * lds + 2 * p0)
                              : _mm512_setzero_si512();
            sdpa_transpose16x32(v);
            for (int i = 0; i < np; i++)
                _mm512_mask_storeu_epi32(dst + (ptrdiff_t)(p0 + i) * ldd + r0, mr, v[i]);
        }
    }
}

/* Rows of fp32 rounded to bf16 rows with pack_pairs_f32's rounding: 32 values per
 * vcvtne2ps2bf16, a masked tail of 1..31 through vcvtneps2bf16. */
static void round_rows_bf16(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst, ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++) {
        const float *s = src + (ptrdiff_t)r * lds;
        uint16_t *d = dst + (ptrdiff_t)r * ldd;
        int c = 0;
        for (; c + 32 <= cols; c += 32) /* words 0..15 from s + c, 16..31 from s + c + 16 */
            _mm512_storeu_si512(d + c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + c + 16), _mm512_loadu_ps(s + c)));
        for (; c < cols; c += 16) {
            const int n = cols - c < 16 ? cols - c : 16;
            const __mmask16 m = (__mmask16)((1u << n) - 1);
            _mm256_mask_storeu_epi16(d + c, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + c)));
        }
    }
}

/* The AVX-512 table's exp (simd_tmpl.h tmpl_exp: x log2(e) rounded to float, the cut-off,
 * SLEEF's exp2), so that online_softmax_pairs gives online_softmax's bits; exp_arg is
 * the argument it gives SLEEF. */
static inline __m512 exp_arg(__m512 x)
{
    const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(0x1.715476p+0f));
    const __mmask16 low = _mm512_cmp_ps_mask(y, _mm512_set1_ps(SDPA_EXP_CUTOFF_LOG2), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(low, y, _mm512_set1_ps(-INFINITY));
}

static inline __m512 exp_cut(__m512 x)
{
    return Sleef_exp2f16_u10avx512f(exp_arg(x));
}

/* Rows of online_softmax_pairs per chunk of its exp phases (even: the row pairs stay whole). */
#define SOFTMAX_PAIRS_CHUNK 32

/* online_softmax (the AVX-512 template's arithmetic, simd/softmax.h, in the same order) over
 * the scores scale * S (one product per element, as the gemm's alpha)
 * whose probabilities go straight to pack_pairs_f32's layout in dst instead of back to S:
 * dst[p * ldd + c] = bf16(P row 2p, column c) | bf16(P row 2p + 1) << 16, 0 for a missing
 * odd row. l sums the unrounded P. */
static inline __attribute__((always_inline)) void softmax_pairs_body(const int query_major, int M, int N,
                                                                     const float *S, ptrdiff_t lds, float scale,
                                                                     float *m, float *l, float *alpha, uint32_t *dst,
                                                                     ptrdiff_t ldd)
{
    const __m512 vs = _mm512_set1_ps(scale);
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int n0 = 0; n0 < N; n0 += 16) {
        const int n = N - n0 < 16 ? N - n0 : 16;
        const __mmask16 k = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
        const float *s = S + n0;
        const __m512 m_old = _mm512_maskz_loadu_ps(k, m + n0);
        __m512 mx0 = m_old, mx1 = m_old;
        int r = 0;
        for (; r + 1 < M; r += 2) {
            mx0 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k, s + (ptrdiff_t)r * lds)), mx0);
            mx1 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k, s + (ptrdiff_t)(r + 1) * lds)), mx1);
        }
        if (r < M)
            mx0 = _mm512_max_ps(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k, s + (ptrdiff_t)r * lds)), mx0);
        const __m512 mx = _mm512_max_ps(mx1, mx0);
        const __mmask16 none = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
        const __m512 mu = _mm512_mask_blend_ps(none, mx, _mm512_setzero_ps());
        const __m512 a = exp_cut(_mm512_sub_ps(m_old, mu));
        __m512 sum = _mm512_setzero_ps();
        /* rows in chunks, each in three phases (per element the same operations as
         * online_softmax's P, in the same order): the exponent arguments, then SLEEF's exp2 alone in
         * a loop (nothing else live across its calls, so nothing spilled around them),
         * then the masked sentinel, the sum, the rounding and the packing */
        for (int r0 = 0; r0 < M; r0 += SOFTMAX_PAIRS_CHUNK) {
            const int rn = M - r0 < SOFTMAX_PAIRS_CHUNK ? M - r0 : SOFTMAX_PAIRS_CHUNK;
            __m512 y[SOFTMAX_PAIRS_CHUNK];
            __mmask16 masked[SOFTMAX_PAIRS_CHUNK];
            for (int q = 0; q < rn; q++) {
                const __m512 sv = _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(k, s + (ptrdiff_t)(r0 + q) * lds));
                masked[q] = _mm512_cmp_ps_mask(sv, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
                y[q] = exp_arg(_mm512_sub_ps(sv, mu));
            }
            for (int q = 0; q < rn; q++)
                y[q] = Sleef_exp2f16_u10avx512f(y[q]);
            __m512i words[SOFTMAX_PAIRS_CHUNK / 2];
            for (int q = 0; q < rn; q += 2) {
                const __m512 p0 = _mm512_mask_blend_ps(masked[q], y[q], _mm512_set1_ps(SDPA_MASKED_SENTINEL));
                sum = _mm512_add_ps(sum, p0);
                __m512 p1 = _mm512_setzero_ps();
                if (q + 1 < rn) {
                    p1 = _mm512_mask_blend_ps(masked[q + 1], y[q + 1], _mm512_set1_ps(SDPA_MASKED_SENTINEL));
                    sum = _mm512_add_ps(sum, p1);
                }
                const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(p1, p0); /* p0 in words 0..15, p1 in 16..31 */
                words[q / 2] = _mm512_permutexvar_epi16(interleave, h);
                if (!query_major)
                    _mm512_mask_storeu_epi32(dst + (ptrdiff_t)((r0 + q) / 2) * ldd + n0, k, words[q / 2]);
            }
            if (query_major) { /* the chunk's 16 pairs of each column: one transposition, one row each */
                for (int j = (rn + 1) / 2; j < SOFTMAX_PAIRS_CHUNK / 2; j++)
                    words[j] = _mm512_setzero_si512();
                sdpa_transpose16x32(words);
                for (int i = 0; i < n; i++)
                    _mm512_storeu_si512(dst + (ptrdiff_t)(n0 + i) * ldd + r0 / 2, words[i]);
            }
        }
        _mm512_mask_storeu_ps(alpha + n0, k, a);
        _mm512_mask_storeu_ps(l + n0, k, _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, l + n0), a), sum));
        _mm512_mask_storeu_ps(m + n0, k, mx);
    }
}

static void online_softmax_pairs(int M, int N, const float *S, ptrdiff_t lds, float scale, float *m, float *l,
                                 float *alpha, uint32_t *dst, ptrdiff_t ldd)
{
    softmax_pairs_body(0, M, N, S, lds, scale, m, l, alpha, dst, ldd);
}

/* The same, each column's pairs in a row: dst[c * ldd + p] (the amx tile products' A rows,
 * loaded in place), words from ceil(M / 2) to the next multiple of 16 set to 0. */
void sdpa_avx512_online_softmax_pairs_rows(int M, int N, const float *S, ptrdiff_t lds, float scale, float *m,
                                           float *l, float *alpha, uint32_t *dst, ptrdiff_t ldd)
{
    softmax_pairs_body(1, M, N, S, lds, scale, m, l, alpha, dst, ldd);
}

/* dS = P (dP - D) as the AVX-512 table's bwd_dscores computes it (simd/softmax.h: the
 * masked sentinel kept, + 0 turning an arithmetic -0 into +0). */
static inline __m512 dscore(__m512 p, __m512 dp, __m512 d)
{
    const __mmask16 masked = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(p), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_mask_blend_ps(masked, _mm512_add_ps(_mm512_mul_ps(p, _mm512_sub_ps(dp, d)), _mm512_setzero_ps()),
                                _mm512_set1_ps(SDPA_MASKED_SENTINEL));
}

/* bwd_dscores whose dS goes, rounded to bf16, to two layouts instead of back to dP:
 * rows (ds16[k * ld16 + n], round_rows_bf16's) and key pairs (dsp[p * lddsp + n],
 * pack_pairs_f32's: rows 2p and 2p + 1, 0 for a missing odd row); dP is only read. */
static void bwd_dscores_pairs(int M, int N, const float *P, ptrdiff_t ldp, const float *dP, ptrdiff_t lddp,
                              const float *d, uint16_t *ds16, ptrdiff_t ld16, uint32_t *dsp, ptrdiff_t lddsp)
{
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int k = 0; k < M; k += 2) {
        const int two = k + 1 < M;
        for (int n0 = 0; n0 < N; n0 += 16) {
            const int n = N - n0 < 16 ? N - n0 : 16;
            const __mmask16 m = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
            const __m512 dv = _mm512_maskz_loadu_ps(m, d + n0);
            const __m512 s0 = dscore(_mm512_maskz_loadu_ps(m, P + (ptrdiff_t)k * ldp + n0),
                                     _mm512_maskz_loadu_ps(m, dP + (ptrdiff_t)k * lddp + n0), dv);
            const __m512 s1 = two ? dscore(_mm512_maskz_loadu_ps(m, P + (ptrdiff_t)(k + 1) * ldp + n0),
                                           _mm512_maskz_loadu_ps(m, dP + (ptrdiff_t)(k + 1) * lddp + n0), dv)
                                  : _mm512_setzero_ps();
            const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(s1, s0); /* s0 in words 0..15, s1 in 16..31 */
            _mm256_mask_storeu_epi16(ds16 + (ptrdiff_t)k * ld16 + n0, m, _mm512_castsi512_si256(h));
            if (two)
                _mm256_mask_storeu_epi16(ds16 + (ptrdiff_t)(k + 1) * ld16 + n0, m, _mm512_extracti64x4_epi64(h, 1));
            _mm512_mask_storeu_epi32(dsp + (ptrdiff_t)(k / 2) * lddsp + n0, m, _mm512_permutexvar_epi16(interleave, h));
        }
    }
}

void sdpa_kernels_init_avx512_bf16(sdpa_kernels *t)
{
    t->bwd_dscores_pairs = bwd_dscores_pairs;
    t->online_softmax_pairs = online_softmax_pairs;
    t->round_rows_bf16 = round_rows_bf16;
    t->gemm_bf16_pairs = gemm_bf16_pairs;
    t->pack_pairs_f32 = pack_pairs_f32;
    t->pack_pairs_bf16 = pack_pairs_bf16;
    t->transpose_pairs = transpose_pairs;
    t->dot_pairs_cols = dot_pairs_cols;
    t->attend_rows_bf16_pairs = sdpa_avx512_attend_rows_bf16_pairs;
    t->bwd_rows_bf16 = sdpa_avx512_bf16_bwd_rows(); /* dK, dV narrowed by vcvtneps2bf16 */
}
