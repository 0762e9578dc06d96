/* SPDX-License-Identifier: MIT */
/* x86/kernels_amx.c - AMX-BF16 tile products for the bf16 prefill path (the "amx" ISA).
 *
 * The amx table is the AVX-512 table (every fp32 and fp16 kernel, the online softmax,
 * the masks, the AVX512-BF16 packs of kernels_avx512_bf16.c) with one entry replaced:
 * gemm_bf16_pairs runs on the tile unit. `tdpbf16ps` multiplies a 16 x 32 bf16 tile of
 * A by a 16 x (16 pairs) tile of B into a 16 x 16 fp32 tile: 16,384 FLOPs per
 * instruction, about 15x the AVX-512 FMA rate per core (docs/perf-notes.md, "AMX").
 *
 * Layout: the "pairs" of kernels.h are AMX's own. B's rows are pairs along the
 * reduction ([p][n] words: one tile row = 16 columns of one pair); A's tile rows must
 * hold their pairs side by side ([m][p]). A bf16 K row is that already (loaded in
 * place, any row stride); a packed P^T ([p][m], pairs down a column) is transposed
 * 16 x 16 words at a time into a stack panel first. Tails of M, N and P go through
 * zero-padded copies, so a tile never reads past its operand.
 *
 * Register use: 2 x 2 accumulator tiles (tmm0-3, a 32 x 32 block of C), two A tiles
 * (tmm4-5), two B tiles (tmm6-7); every tile 16 rows x 64 bytes. The driver loads
 * that configuration on each thread that calls gemm_bf16_pairs (tiles_begin) and
 * releases the tile state when the thread has finished its part of the library call
 * (tiles_end), so no tile state outlives a call or crosses into the caller's code (a
 * finished thread holds no 8 KiB of tile state in its context). A caller's own tile
 * configuration and data on that thread do not survive the call: AMX code that loads
 * its configuration before its tile instructions, as it must, keeps working.
 *
 * Arithmetic (Intel SDM, "TDPBF16PS"): bf16 inputs that are subnormal count as zero,
 * products of bf16 are exact in fp32, sums round to nearest even, subnormal results are
 * flushed to zero, MXCSR is not consulted: the contract of vdpbf16ps (docs/design.md,
 * "What is rounded"), but the order in which one instruction adds its 16 pairs' products
 * to an element is the instruction's own, so results can differ in the last bits from
 * the AVX512-BF16 kernel's. Per element of C the reduction runs over the pair chunks in
 * increasing order from +0, then C = alpha T (+ row_scale C_old), as
 * kernels_avx512_bf16.c does.
 *
 * Built with the AVX-512 F/VL/BW/DQ, BF16 and AMX-TILE/AMX-BF16 flags; installed only
 * when CPUID has AMX-TILE and AMX-BF16 (with AVX512_BF16), XCR0 enables the tile state
 * and Linux granted this process XTILEDATA (src/x86/cpu.c). */
#include <immintrin.h>
#include <string.h>

#include "kernels.h"
#include "x86/transpose_avx512.h"

#define TILE_ROWS 16  /* rows of every tile */
#define TILE_WORDS 16 /* 32-bit words per tile row (64 bytes): 16 pairs, or 16 fp32 */
#define PANEL_PAIRS 128 /* pairs of a packed A panel held on the stack (the driver's P V: ceil(block_k / 2)) */

typedef struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tiles_begin / tiles_end (kernels.h): the configuration every gemm_bf16_pairs call
 * of this file assumes, loaded once per thread and library call (ldtilecfg and
 * sttilecfg both wait for the tile unit to drain: per gemm call they cost more than
 * the products of a 32 x 32 block, docs/perf-notes.md), and the release. */
static void tiles_begin(void)
{
    /* static: GCC 12 drops stores to a local that only _tile_loadconfig reads */
    static const tile_config cfg = {.palette = 1,
                                    .colsb = {TILE_WORDS * 4, TILE_WORDS * 4, TILE_WORDS * 4, TILE_WORDS * 4,
                                              TILE_WORDS * 4, TILE_WORDS * 4, TILE_WORDS * 4, TILE_WORDS * 4},
                                    .rows = {TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS, TILE_ROWS,
                                             TILE_ROWS, TILE_ROWS}};
    _tile_loadconfig(&cfg);
}

static void tiles_end(void)
{
    _tile_release();
}

/* A panel of rows [m0, m0 + rows) (rows <= 16) and pairs [p0, p0 + np), zero-padded to
 * 16 rows x ppad pairs: panel[r * ppad + p] = pair (m0 + r, p0 + p). */
static void pack_a_panel(int rows, int np, int ppad, const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a, int m0,
                         int p0, uint32_t *panel)
{
    if (rs_a == 2 && cs_a % 2 == 0) {
        /* pairs down a column: word (m, p) at W[m + p * ldw] */
        const uint32_t *W = (const uint32_t *)(const void *)A;
        const ptrdiff_t ldw = cs_a / 2;
        const __mmask16 mrow = (__mmask16)(rows == 16 ? 0xFFFF : (1u << rows) - 1);
        for (int p = 0; p < ppad; p += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = p + i < np ? _mm512_maskz_loadu_epi32(mrow, W + m0 + (ptrdiff_t)(p0 + p + i) * ldw)
                                  : _mm512_setzero_si512();
            sdpa_transpose16x32(r);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_si512(panel + (ptrdiff_t)i * ppad + p, r[i]);
        }
        return;
    }
    if (cs_a == 2) {
        /* pairs along a row (K rows, P packed by pack_pairs_f32_t): row copies */
        for (int r = 0; r < 16; r++)
            for (int p = 0; p < ppad; p += 16) {
                const int n = r < rows ? (np - p < 16 ? (np - p > 0 ? np - p : 0) : 16) : 0;
                const __mmask16 k = (__mmask16)(n == 16 ? 0xFFFF : (1u << n) - 1);
                const uint16_t *src = A + (ptrdiff_t)(m0 + r) * rs_a + 2 * (ptrdiff_t)(p0 + p);
                _mm512_storeu_si512(panel + (ptrdiff_t)r * ppad + p, _mm512_maskz_loadu_epi32(k, src));
            }
        return;
    }
    for (int r = 0; r < 16; r++)
        for (int p = 0; p < ppad; p++) {
            uint32_t x = 0;
            if (r < rows && p < np)
                memcpy(&x, A + (ptrdiff_t)(m0 + r) * rs_a + (ptrdiff_t)(p0 + p) * cs_a, sizeof x);
            panel[(ptrdiff_t)r * ppad + p] = x;
        }
}

/* B's 16 x 16 words at pairs [p0, p0 + np), columns [n0, n0 + cols), zero-padded. */
static void pack_b_tile(int np, int cols, const uint32_t *B, ptrdiff_t ldb, int p0, int n0, uint32_t *dst)
{
    const __mmask16 mcol = (__mmask16)(cols == 16 ? 0xFFFF : (1u << cols) - 1);
    for (int i = 0; i < 16; i++)
        _mm512_storeu_si512(dst + 16 * i, i < np ? _mm512_maskz_loadu_epi32(mcol, B + (ptrdiff_t)(p0 + i) * ldb + n0)
                                                 : _mm512_setzero_si512());
}

/* C rows [m0, m0 + rows), columns [n0, n0 + cols) from the 16 x 16 tile t. */
static void store_c(const float *t, int rows, int cols, float alpha, float *C, ptrdiff_t ldc, int flags,
                    const float *c_row_scale, int m0, int n0)
{
    const __mmask16 k = (__mmask16)(cols == 16 ? 0xFFFF : (1u << cols) - 1);
    const __m512 va = _mm512_set1_ps(alpha);
    for (int i = 0; i < rows; i++) {
        float *c = C + (ptrdiff_t)(m0 + i) * ldc + n0;
        __m512 out = _mm512_mul_ps(va, _mm512_loadu_ps(t + 16 * i));
        if (flags & SDPA_GEMM_ACCUMULATE) {
            const __m512 old = _mm512_maskz_loadu_ps(k, c);
            out = c_row_scale ? _mm512_fmadd_ps(old, _mm512_set1_ps(c_row_scale[m0 + i]), out)
                              : _mm512_add_ps(old, out);
        }
        _mm512_mask_storeu_ps(c, k, out);
    }
}

/* A full 32 x 32 block of C over P = 16 chunks pairs, A rows at a0 / a1 (byte stride
 * sa, 64 bytes per chunk), B at b (byte stride sb, 16 rows per chunk): no tails. The
 * four tiles go to out, or (out NULL) straight to the block at c (byte stride sc). */
static inline __attribute__((always_inline)) void block_full(int chunks, const char *a0, const char *a1,
                                                             ptrdiff_t sa, ptrdiff_t a_step, const char *b,
                                                             ptrdiff_t sb, float out[4][TILE_ROWS * TILE_WORDS],
                                                             float *c, ptrdiff_t sc)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int c = 0; c < chunks; c++) {
        _tile_loadd(4, a0, sa);
        _tile_loadd(6, b, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b + 64, sb);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1, sa);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        a0 += a_step;
        a1 += a_step;
        b += 16 * sb;
    }
    if (!out) {
        _tile_stored(0, c, sc);
        _tile_stored(1, c + 16, sc);
        _tile_stored(2, (char *)c + 16 * sc, sc);
        _tile_stored(3, (char *)c + 16 * sc + 64, sc);
        return;
    }
    _tile_stored(0, out[0], 64);
    _tile_stored(1, out[1], 64);
    _tile_stored(2, out[2], 64);
    _tile_stored(3, out[3], 64);
}

/* C rows [m0, m0 + 32), columns [n0, n0 + 32) from out (full tiles). */
static inline __attribute__((always_inline)) void store_c_full(float out[4][TILE_ROWS * TILE_WORDS], float alpha,
                                                               float *C, ptrdiff_t ldc, int flags,
                                                               const float *c_row_scale, int m0, int n0)
{
    const __m512 va = _mm512_set1_ps(alpha);
    for (int i = 0; i < 32; i++) {
        float *c = C + (ptrdiff_t)(m0 + i) * ldc + n0;
        __m512 lo = _mm512_mul_ps(va, _mm512_load_ps(out[i < 16 ? 0 : 2] + 16 * (i & 15)));
        __m512 hi = _mm512_mul_ps(va, _mm512_load_ps(out[i < 16 ? 1 : 3] + 16 * (i & 15)));
        if (flags & SDPA_GEMM_ACCUMULATE) {
            if (c_row_scale) {
                const __m512 f = _mm512_set1_ps(c_row_scale[m0 + i]);
                lo = _mm512_fmadd_ps(_mm512_loadu_ps(c), f, lo);
                hi = _mm512_fmadd_ps(_mm512_loadu_ps(c + 16), f, hi);
            } else {
                lo = _mm512_add_ps(_mm512_loadu_ps(c), lo);
                hi = _mm512_add_ps(_mm512_loadu_ps(c + 16), hi);
            }
        }
        _mm512_storeu_ps(c, lo);
        _mm512_storeu_ps(c + 16, hi);
    }
}

/* One A tile's source for pair chunk [p, p + 16): in place (K rows) or the panel. */
typedef struct a_src {
    const void *base;
    ptrdiff_t stride; /* bytes */
} a_src;

static void gemm_bf16_pairs(int M, int N, int P, float alpha, const uint16_t *A, ptrdiff_t rs_a, ptrdiff_t cs_a,
                            const uint32_t *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int flags,
                            const float *c_row_scale)
{
    if (M <= 0 || N <= 0)
        return;
    static const float zero_tile[TILE_ROWS * TILE_WORDS];
    if (P <= 0) {
        for (int m = 0; m < M; m += 16)
            for (int n = 0; n < N; n += 16)
                store_c(zero_tile, M - m < 16 ? M - m : 16, N - n < 16 ? N - n : 16, alpha, C, ldc, flags,
                        c_row_scale, m, n);
        return;
    }
    /* A in place when its pairs lie side by side and P fills whole chunks */
    const int a_in_place = cs_a == 2 && P % 16 == 0;
    const int direct = alpha == 1.0f && !(flags & SDPA_GEMM_ACCUMULATE); /* full blocks skip the epilogue */
    const int ppad = (P + 15) / 16 * 16;
    const int panel_pairs = ppad < PANEL_PAIRS ? ppad : PANEL_PAIRS;
    uint32_t panel[2][TILE_ROWS * PANEL_PAIRS] __attribute__((aligned(64)));
    uint32_t bpack[2][TILE_ROWS * TILE_WORDS] __attribute__((aligned(64)));
    float out[4][TILE_ROWS * TILE_WORDS] __attribute__((aligned(64)));

    for (int m = 0; m < M; m += 32) {
        const int mt = M - m > 16 ? 2 : 1;
        const int rows0 = M - m < 16 ? M - m : 16, rows1 = mt == 2 ? (M - m - 16 < 16 ? M - m - 16 : 16) : 0;
        const int full_rows = rows0 == 16 && (mt == 1 || rows1 == 16);
        const int place = a_in_place && full_rows;
        /* the panel holds pairs [pp0, pp0 + panel_pairs); packed when first needed */
        int pp0 = -1;
        for (int n = 0; n < N; n += 32) {
            if (place && n + 32 <= N && m + 32 <= M) { /* place: P is whole chunks */
                const char *a0 = (const char *)(A + (ptrdiff_t)m * rs_a), *a1 = a0 + 32 * rs_a;
                if (direct) { /* C = T: the tiles go to C as they are (1 * T is T) */
                    block_full(P / 16, a0, a1, rs_a * 2, 64, (const char *)(B + n), ldb * 4, NULL, C + (ptrdiff_t)m * ldc + n,
                               ldc * 4);
                    continue;
                }
                block_full(P / 16, a0, a1, rs_a * 2, 64, (const char *)(B + n), ldb * 4, out, NULL, 0);
                store_c_full(out, alpha, C, ldc, flags, c_row_scale, m, n);
                continue;
            }
            if (!place && P <= panel_pairs && n + 32 <= N && m + 32 <= M) {
                if (pp0 != 0) {
                    pp0 = 0;
                    pack_a_panel(16, P, ppad, A, rs_a, cs_a, m, 0, panel[0]);
                    pack_a_panel(16, P, ppad, A, rs_a, cs_a, m + 16, 0, panel[1]);
                }
                if (P % 16 == 0) {
                    block_full(P / 16, (const char *)panel[0], (const char *)panel[1], (ptrdiff_t)ppad * 4, 64,
                               (const char *)(B + n), ldb * 4, out, NULL, 0);
                    store_c_full(out, alpha, C, ldc, flags, c_row_scale, m, n);
                    continue;
                }
            }
            const int nt = N - n > 16 ? 2 : 1;
            const int cols0 = N - n < 16 ? N - n : 16, cols1 = nt == 2 ? (N - n - 16 < 16 ? N - n - 16 : 16) : 0;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int p = 0; p < P; p += 16) {
                const int np = P - p < 16 ? P - p : 16;
                a_src a0, a1;
                if (place) {
                    a0.base = A + (ptrdiff_t)m * rs_a + 2 * (ptrdiff_t)p;
                    a1.base = A + (ptrdiff_t)(m + 16) * rs_a + 2 * (ptrdiff_t)p;
                    a0.stride = a1.stride = rs_a * 2;
                } else {
                    if (pp0 < 0 || p < pp0 || p >= pp0 + panel_pairs) {
                        pp0 = p;
                        const int npan = P - p < panel_pairs ? P - p : panel_pairs;
                        const int padp = (npan + 15) / 16 * 16;
                        pack_a_panel(rows0, npan, padp, A, rs_a, cs_a, m, p, panel[0]);
                        if (mt == 2)
                            pack_a_panel(rows1, npan, padp, A, rs_a, cs_a, m + 16, p, panel[1]);
                    }
                    const int padp = ((P - pp0 < panel_pairs ? P - pp0 : panel_pairs) + 15) / 16 * 16;
                    a0.base = panel[0] + (p - pp0);
                    a1.base = panel[1] + (p - pp0);
                    a0.stride = a1.stride = (ptrdiff_t)padp * 4;
                }
                const void *b0, *b1;
                ptrdiff_t bs0, bs1;
                if (np == 16 && cols0 == 16) {
                    b0 = B + (ptrdiff_t)p * ldb + n;
                    bs0 = ldb * 4;
                } else {
                    pack_b_tile(np, cols0, B, ldb, p, n, bpack[0]);
                    b0 = bpack[0];
                    bs0 = 64;
                }
                _tile_loadd(4, a0.base, a0.stride);
                _tile_loadd(6, b0, bs0);
                _tile_dpbf16ps(0, 4, 6);
                if (nt == 2) {
                    if (np == 16 && cols1 == 16) {
                        b1 = B + (ptrdiff_t)p * ldb + n + 16;
                        bs1 = ldb * 4;
                    } else {
                        pack_b_tile(np, cols1, B, ldb, p, n + 16, bpack[1]);
                        b1 = bpack[1];
                        bs1 = 64;
                    }
                    _tile_loadd(7, b1, bs1);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (mt == 2) {
                    _tile_loadd(5, a1.base, a1.stride);
                    _tile_dpbf16ps(2, 5, 6);
                    if (nt == 2)
                        _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, out[0], 64);
            _tile_stored(1, out[1], 64);
            _tile_stored(2, out[2], 64);
            _tile_stored(3, out[3], 64);
            store_c(out[0], rows0, cols0, alpha, C, ldc, flags, c_row_scale, m, n);
            if (nt == 2)
                store_c(out[1], rows0, cols1, alpha, C, ldc, flags, c_row_scale, m, n + 16);
            if (mt == 2) {
                store_c(out[2], rows1, cols0, alpha, C, ldc, flags, c_row_scale, m + 16, n);
                if (nt == 2)
                    store_c(out[3], rows1, cols1, alpha, C, ldc, flags, c_row_scale, m + 16, n + 16);
            }
        }
    }
}

void sdpa_kernels_init_amx(sdpa_kernels *t)
{
    sdpa_kernels_init_avx512_bf16(t);
    t->isa = SDPA_ISA_AMX;
    t->name = "amx";
    t->gemm_bf16_pairs = gemm_bf16_pairs;
    t->dot_pairs_cols = NULL; /* the tile products sum in their own order (kernels.h) */
    t->online_softmax_pairs_rows = sdpa_avx512_online_softmax_pairs_rows; /* P's A rows in place */
    /* decode scores stay on the fp32 FMAs: vdpbf16ps issues at half their rate on Intel's
     * server cores (docs/perf-notes.md, "vdpbf16ps on Emerald Rapids") */
    t->attend_rows_bf16_pairs = NULL;
    t->tiles_begin = tiles_begin;
    t->tiles_end = tiles_end;
    t->bf16_dot = 1;
    t->bwd_bf16_dot = 1;
    /* the tile products' share of a tile is small: larger tiles amortise the fp32 work
     * around them (docs/perf-notes.md, "AMX") */
    t->pairs_block_q = 128;
    t->pairs_block_k = 128;
    t->bwd_pairs_block_q = 128;
    t->bwd_pairs_block_k = 128;
}
