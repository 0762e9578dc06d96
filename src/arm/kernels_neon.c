/* SPDX-License-Identifier: MIT */
/* arm/kernels_neon.c - the AArch64 Advanced SIMD kernels: src/simd_tmpl.h over the q-register layer.
 *
 * gemm register block 5 x 16 (5 x 4 q accumulators, 3 rows per pass in the
 * SKIP_ZERO kernels); tails through a small zero-padded buffer; a skipped term
 * (SKIP_ZERO_A/B) has its operands zeroed by a bitwise and before the FMA; exp
 * is Sleef_exp2f4_u10advsimd (2^y, see simd_tmpl.h); gemm_nt (decode scores)
 * keeps one query row of up to 16 q or two of up to 8 in registers and reads
 * each key row whole (see simd/decode.h). */
#include "config.h"
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
    t->tile_pad = 0; /* not measured on Arm hardware */
}

#if HAVE_NEON_BF16
/* ------------------------------------------- the BF16 path's packs
 *
 * The pair layout of kernels.h ("bf16 pair products") for the BFMMLA / BFDOT gemm of
 * src/arm/kernels_neon_bf16.c. Integer work and this table's own online softmax, no
 * BF16 instruction, so built here with the base flags; installed only beside that
 * gemm (HWCAP2_BF16). Rounding of pack_pairs_f32 (kernels.h): nearest even, a
 * subnormal input to the zero of its sign, a NaN quiet. */

/* fp32 lanes to bf16 patterns with that rounding. */
static inline uint16x4_t pair_round(float32x4_t v)
{
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t sub = vceqq_u32(vandq_u32(u, vdupq_n_u32(0x7F800000u)), vdupq_n_u32(0));
    return neon_f32_to_bf16(vreinterpretq_f32_u32(vbslq_u32(sub, vandq_u32(u, vdupq_n_u32(0x80000000u)), u)));
}

/* Words bf16(lo) | bf16(hi) << 16. */
static inline uint32x4_t pair_words(float32x4_t lo, float32x4_t hi)
{
    return vorrq_u32(vmovl_u16(pair_round(lo)), vshll_n_u16(pair_round(hi), 16));
}

static inline void store_words(uint32_t *d, uint32x4_t w, int n)
{
    if (n == 4) {
        vst1q_u32(d, w);
        return;
    }
    uint32_t t[4];
    vst1q_u32(t, w);
    for (int i = 0; i < n; i++)
        d[i] = t[i];
}

static void pack_pairs_f32_neon(int rows, int cols, const float *src, ptrdiff_t lds, uint32_t *dst, ptrdiff_t ldd)
{
    for (int p = 0; 2 * p < rows; p++) {
        const float *r0 = src + (ptrdiff_t)(2 * p) * lds, *r1 = r0 + lds;
        const int has1 = 2 * p + 1 < rows;
        uint32_t *d = dst + (ptrdiff_t)p * ldd;
        for (int c = 0; c < cols; c += 4) {
            const int n = cols - c < 4 ? cols - c : 4;
            const float32x4_t a = n == 4 ? vld1q_f32(r0 + c) : neon_load_tail(r0 + c, n);
            const float32x4_t b = !has1 ? vdupq_n_f32(0.0f) : n == 4 ? vld1q_f32(r1 + c) : neon_load_tail(r1 + c, n);
            store_words(d + c, pair_words(a, b), n);
        }
    }
}

/* bf16 rows 2p and 2p + 1 interleaved (vzip); 1 when no pattern has an all-ones exponent. */
static int pack_pairs_bf16_neon(int rows, int cols, const uint16_t *src, ptrdiff_t lds, uint32_t *dst, ptrdiff_t ldd)
{
    const uint16x8_t magnitude = vdupq_n_u16(0x7FFF);
    uint16x8_t top = vdupq_n_u16(0); /* per lane: the largest |pattern| seen */
    int finite = 1;
    for (int p = 0; 2 * p < rows; p++) {
        const uint16_t *r0 = src + (ptrdiff_t)(2 * p) * lds, *r1 = r0 + lds;
        const int has1 = 2 * p + 1 < rows;
        uint32_t *d = dst + (ptrdiff_t)p * ldd;
        int c = 0;
        for (; c + 8 <= cols; c += 8) {
            const uint16x8_t a = vld1q_u16(r0 + c), b = has1 ? vld1q_u16(r1 + c) : vdupq_n_u16(0);
            top = vmaxq_u16(top, vmaxq_u16(vandq_u16(a, magnitude), vandq_u16(b, magnitude)));
            vst1q_u32(d + c, vreinterpretq_u32_u16(vzip1q_u16(a, b)));
            vst1q_u32(d + c + 4, vreinterpretq_u32_u16(vzip2q_u16(a, b)));
        }
        for (; c < cols; c++) {
            const uint16_t lo = r0[c], hi = has1 ? r1[c] : 0;
            finite &= (lo & 0x7F80u) != 0x7F80u && (hi & 0x7F80u) != 0x7F80u;
            d[c] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
    return finite && vmaxvq_u16(top) < 0x7F80u;
}

static void transpose_pairs_neon(int rows, int pairs, const uint16_t *src, ptrdiff_t lds, uint32_t *dst,
                                 ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < pairs; p++) {
            const uint16_t *s = src + (ptrdiff_t)r * lds + 2 * p;
            dst[(ptrdiff_t)p * ldd + r] = (uint32_t)s[0] | (uint32_t)s[1] << 16;
        }
}

static void round_rows_bf16_neon(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst, ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++) {
        const float *s = src + (ptrdiff_t)r * lds;
        uint16_t *d = dst + (ptrdiff_t)r * ldd;
        int c = 0;
        for (; c + 4 <= cols; c += 4)
            vst1_u16(d + c, pair_round(vld1q_f32(s + c)));
        if (c < cols) {
            uint16_t t[4];
            vst1_u16(t, pair_round(neon_load_tail(s + c, cols - c)));
            for (int i = 0; i < cols - c; i++)
                d[c + i] = t[i];
        }
    }
}

/* online_softmax (simd/softmax.h's tmpl_softmax_block, in the same order) over the scores
 * scale * S (one product per element, as the gemm's alpha) whose P^T goes to
 * pack_pairs_f32_neon's layout in dst; S is only read. */
static void online_softmax_pairs_neon(int M, int N, const float *S, ptrdiff_t lds, float scale, float *m, float *l,
                                      float *alpha, uint32_t *dst, ptrdiff_t ldd)
{
    const v_f32 vs = V_SET1(scale);
    for (int n0 = 0; n0 < N; n0 += TMPL_VL) {
        const int tail = N - n0 < TMPL_VL;
        const v_tail t = V_TAIL_INIT(tail ? N - n0 : TMPL_VL);
        const float *s = S + n0;
        const v_f32 m_old = TMPL_LOAD(tail, m + n0, t);
        v_f32 mx0 = m_old, mx1 = m_old;
        int k = 0;
        for (; k + 1 < M; k += 2) {
            mx0 = V_MAX(V_MUL(vs, TMPL_LOAD(tail, s + (ptrdiff_t)k * lds, t)), mx0);
            mx1 = V_MAX(V_MUL(vs, TMPL_LOAD(tail, s + (ptrdiff_t)(k + 1) * lds, t)), mx1);
        }
        if (k < M)
            mx0 = V_MAX(V_MUL(vs, TMPL_LOAD(tail, s + (ptrdiff_t)k * lds, t)), mx0);
        const v_f32 mx = V_MAX(mx1, mx0);
        const v_f32 mu = V_SEL(V_EQ(mx, V_SET1(-INFINITY)), V_ZERO(), mx);
        const v_f32 a = tmpl_exp(V_SUB(m_old, mu));
        v_f32 sum = V_ZERO();
        for (k = 0; k < M; k += 2) {
            const v_f32 s0 = V_MUL(vs, TMPL_LOAD(tail, s + (ptrdiff_t)k * lds, t));
            const v_f32 p0 = V_SEL(V_EQ(s0, V_SET1(-INFINITY)), V_SET1(SDPA_MASKED_SENTINEL), tmpl_exp(V_SUB(s0, mu)));
            sum = V_ADD(sum, p0);
            v_f32 p1 = V_ZERO();
            if (k + 1 < M) {
                const v_f32 s1 = V_MUL(vs, TMPL_LOAD(tail, s + (ptrdiff_t)(k + 1) * lds, t));
                p1 = V_SEL(V_EQ(s1, V_SET1(-INFINITY)), V_SET1(SDPA_MASKED_SENTINEL), tmpl_exp(V_SUB(s1, mu)));
                sum = V_ADD(sum, p1);
            }
            store_words(dst + (ptrdiff_t)(k / 2) * ldd + n0, pair_words(p0, p1), tail ? N - n0 : TMPL_VL);
        }
        TMPL_STORE(tail, alpha + n0, a, t);
        TMPL_STORE(tail, l + n0, V_ADD(V_MUL(TMPL_LOAD(tail, l + n0, t), a), sum), t);
        TMPL_STORE(tail, m + n0, mx, t);
    }
}

void sdpa_kernels_init_neon_bf16(sdpa_kernels *t)
{
    t->gemm_bf16_pairs = sdpa_neon_gemm_bf16_pairs_mmla;
    t->dot_pairs_cols = sdpa_neon_dot_pairs_cols;
    t->pack_pairs_f32 = pack_pairs_f32_neon;
    t->pack_pairs_bf16 = pack_pairs_bf16_neon;
    t->transpose_pairs = transpose_pairs_neon;
    t->round_rows_bf16 = round_rows_bf16_neon;
    t->online_softmax_pairs = online_softmax_pairs_neon;
    t->bf16_dot = 1;
}
#endif /* HAVE_NEON_BF16 */
