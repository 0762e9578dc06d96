/* SPDX-License-Identifier: MIT */
/* tests/checkasm.c - conformance of every ISA's micro-kernels (src/kernels.h) against C and float64.
 *
 * A plain C program (no Criterion, so it also runs in the aarch64 cross build
 * under qemu), in the spirit of dav1d's checkasm: for every ISA compiled in and
 * supported by this CPU, every entry of the kernel table is run over random
 * inputs with every tail (sizes around the vector length, the register blocks
 * and the ISA's own block sizes), both A layouts the driver uses, every gemm
 * flag combination, NaN/Inf hidden behind SKIP_ZERO_A / SKIP_ZERO_B, -inf
 * columns in the softmax and -inf LSE in the backward probabilities. Results
 * are compared with a float64 loop (gemm) or a float64 formula that uses the
 * same float-rounded exp arguments (softmax, probs), and with the scalar
 * table's entry; the tolerances follow the magnitude of the sum of |terms|.
 * Every buffer sits between guard zones, and every element a kernel may not
 * write (guards, row padding, inputs) must keep its bits.
 *
 * The attention variants' element-wise kernels (softcap, alibi_cols, alibi_rows,
 * bwd_softcap) are checked the same way over their own sizes (every tail of the
 * ISA's vectors, row strides longer than N) with their special values; their
 * tolerances, in ulps with the reasons, are at each check.
 *
 * The 16-bit storage conversions (widen_bf16, widen_f16, narrow_bf16,
 * narrow_f16) must give the scalar table's bits exactly, over every tail and
 * every 16-bit pattern, with crafted fp32 inputs for the roundings. The bf16 pair
 * products (gemm_bf16_pairs, pack_pairs_f32, pack_pairs_bf16, transpose_pairs, round_rows_bf16,
 * online_softmax_pairs, bwd_dscores_pairs; only where the CPU
 * has AVX512_BF16, AMX-BF16 or Arm BF16) against float64 and their bit definitions (test_pairs).
 *
 * Usage: checkasm [--test=NAME] [--bench] [--help] [seed] (dav1d's flags; see
 * usage()). Prints one line per ISA and kernel and ends with "N passed, N
 * failed" (counts of checked calls); exits 1 on any failure. --bench times
 * each kernel per ISA on one fixed shape instead (no checks). */
#include <float.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "kernels.h"
#include "sdpa.h"

#define GUARD 37 /* floats of canary before every buffer (and after, on odd calls) */
#define MAX_REPORTS 8

/* ------------------------------------------------------------ utilities */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd() >> 8) * (1.0f / 16777216.0f);
}

static int chance(int percent)
{
    return (int)(rnd() % 100) < percent;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#define CANARY_BITS 0x7fe5a5a5u /* a quiet NaN with a payload */

/* A buffer of `rows` rows of `cols` floats, row stride ld, between guard zones. */
typedef struct buf {
    float *mem, *snap, *p;
    size_t total, off;
    int rows, cols;
    ptrdiff_t ld;
} buf;

static int tail_guard_toggle;

static buf buf_new(int rows, int cols, ptrdiff_t ld)
{
    buf b;
    const size_t extent = (rows > 0 && cols > 0) ? (size_t)(rows - 1) * (size_t)ld + (size_t)cols : 0;
    /* Every other buffer ends exactly at its last element, so that AddressSanitizer
     * sees any read past it; the others have a canary zone behind. */
    tail_guard_toggle ^= 1;
    b.off = GUARD;
    b.total = GUARD + extent + (tail_guard_toggle ? GUARD : 0);
    b.mem = malloc(b.total * sizeof(float));
    b.snap = malloc(b.total * sizeof(float));
    if (!b.mem || !b.snap) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < b.total; i++)
        b.mem[i] = bits_float(CANARY_BITS);
    b.p = b.mem + b.off;
    b.rows = rows;
    b.cols = cols;
    b.ld = ld;
    return b;
}

static void buf_free(buf *b)
{
    free(b->mem);
    free(b->snap);
}

static float *at(const buf *b, int r, int c)
{
    return b->p + (ptrdiff_t)r * b->ld + c;
}

static void buf_fill(buf *b, float lo, float hi)
{
    for (int r = 0; r < b->rows; r++)
        for (int c = 0; c < b->cols; c++)
            *at(b, r, c) = frand(lo, hi);
}

static void buf_snap(buf *b)
{
    memcpy(b->snap, b->mem, b->total * sizeof(float));
}

/* A second buffer with the same layout and contents. */
static buf buf_clone(const buf *src)
{
    buf b = *src;
    b.mem = malloc(b.total * sizeof(float));
    b.snap = malloc(b.total * sizeof(float));
    if (!b.mem || !b.snap) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    memcpy(b.mem, src->mem, b.total * sizeof(float));
    b.p = b.mem + b.off;
    return b;
}

/* Elements outside the logical rows x cols (when `logical_may_change`) or all
 * elements (inputs) must have kept their bits. Returns the number changed. */
static long buf_changed(const buf *b, int logical_may_change)
{
    long bad = 0;
    for (size_t i = 0; i < b->total; i++) {
        if (logical_may_change && i >= b->off) {
            const size_t j = i - b->off;
            const size_t r = j / (size_t)b->ld, c = j % (size_t)b->ld;
            if ((int)r < b->rows && (int)c < b->cols)
                continue;
        }
        if (float_bits(b->mem[i]) != float_bits(b->snap[i]))
            bad++;
    }
    return bad;
}

/* ----------------------------------------------------------- accounting */

static long n_passed, n_failed;
static long k_checks, k_failed; /* the current (ISA, kernel) */
static int k_reports;
static const char *cur_isa, *cur_kernel;

static void kernel_begin(const char *isa, const char *kernel)
{
    cur_isa = isa;
    cur_kernel = kernel;
    k_checks = k_failed = 0;
    k_reports = 0;
}

static void kernel_end(void)
{
    printf("%-7s %-15s %6ld checks  %s\n", cur_isa, cur_kernel, k_checks,
           k_failed ? "FAILED" : "ok");
    if (k_failed)
        printf("%-7s %-15s %6ld failed\n", cur_isa, cur_kernel, k_failed);
    n_passed += k_checks - k_failed;
    n_failed += k_failed;
}

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void report(const char *fmt, ...)
{
    if (k_reports++ >= MAX_REPORTS)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("  FAIL %s %s: ", cur_isa, cur_kernel);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* One checked call: ok is 0 on any mismatch. */
static void record(int ok)
{
    k_checks++;
    if (!ok)
        k_failed++;
}

/* |got - ref| within tol; NaN must match NaN; infinities must match exactly. */
static int close_to(double got, double ref, double tol)
{
    if (isnan(ref))
        return isnan(got);
    if (isinf(ref))
        return got == ref;
    if (!isfinite(got))
        return 0;
    return fabs(got - ref) <= tol;
}

/* ------------------------------------------------------------ the sizes */

static int sizes[40];
static int n_sizes;

static void add_size(int s)
{
    if (s < 0 || s > SDPA_MAX_BLOCK + 1 || n_sizes >= (int)(sizeof sizes / sizeof sizes[0]))
        return;
    for (int i = 0; i < n_sizes; i++)
        if (sizes[i] == s)
            return;
    sizes[n_sizes++] = s;
}

/* A fixed spread of sizes, plus every vector shape of the table (one and two
 * vectors, the column alignment and its multiples, the decode step) and the
 * block sizes, each with its neighbours. */
static void make_sizes(const sdpa_kernels *kt)
{
    static const int base[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65};
    const int shapes[] = {kt->vec_floats, 2 * kt->vec_floats, kt->col_align, 2 * kt->col_align,
                          4 * kt->col_align, kt->nt_step, kt->block_q, kt->block_k};
    n_sizes = 0;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        add_size(base[i]);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int d = -1; d <= 1; d++)
            add_size(shapes[i] + d);
    for (int i = 1; i < n_sizes; i++) /* sort */
        for (int j = i; j > 0 && sizes[j] < sizes[j - 1]; j--) {
            const int t = sizes[j];
            sizes[j] = sizes[j - 1];
            sizes[j - 1] = t;
        }
}

/* ----------------------------------------------------------------- gemm */

/* layout 0: A(m,k) = A[m*rs + k] (K rows, dS^T, P^T in the driver);
 * layout 1: A(m,k) = A[m + k*cs] (V^T and dS in the driver). */
static void check_gemm(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N, int K,
                       int layout, int flags, int poison)
{
    const int skip_a = flags & SDPA_GEMM_SKIP_ZERO_A, skip_b = flags & SDPA_GEMM_SKIP_ZERO_B;
    const int accumulate = flags & SDPA_GEMM_ACCUMULATE;
    static const float alphas[] = {1.0f, 0.125f, -0.7f, 3.0f};
    const float alpha = alphas[rnd() % 4];
    const int pad_a = (int)(rnd() % 3) * 5, pad_b = (int)(rnd() % 3) * 3, pad_c = (int)(rnd() % 2) * 7;
    const ptrdiff_t rs_a = layout == 0 ? K + pad_a : 1, cs_a = layout == 0 ? 1 : M + pad_a;
    buf a = layout == 0 ? buf_new(M, K, rs_a > 0 ? rs_a : 1) : buf_new(K, M, cs_a > 0 ? cs_a : 1);
    buf b = buf_new(K, N, N + pad_b > 0 ? N + pad_b : 1);
    buf c = buf_new(M, N, N + pad_c > 0 ? N + pad_c : 1);
#define A_AT(m, k) (layout == 0 ? at(&a, (m), (k)) : at(&a, (k), (m)))
    buf_fill(&a, -1.0f, 1.0f);
    buf_fill(&b, -1.0f, 1.0f);
    if (accumulate)
        buf_fill(&c, -1.0f, 1.0f);
    else
        for (int m = 0; m < M; m++) /* must be overwritten without being read */
            for (int n = 0; n < N; n++)
                *at(&c, m, n) = NAN;

    /* Hidden poison: a k whose A column is the masked sentinel -0.0 carries
     * NaN/Inf in B (SKIP_ZERO_A), a k whose B row is -0.0 carries NaN/Inf in A
     * (SKIP_ZERO_B), like masked keys in the driver. A +0.0 is an ordinary
     * value (an underflowed probability): NaN behind it must propagate, so it
     * only appears away from the poison. Plus isolated zeros of both signs. */
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < K; k++) {
        const int r = (int)(rnd() % 100);
        if (skip_a && r < 20) {
            for (int m = 0; m < M; m++)
                *A_AT(m, k) = -0.0f;
            for (int n = 0; n < N; n++)
                if (chance(50))
                    *at(&b, k, n) = bad[rnd() % 3];
        } else if (skip_b && r >= 20 && r < 40) {
            for (int n = 0; n < N; n++)
                *at(&b, k, n) = -0.0f;
            for (int m = 0; m < M; m++)
                if (chance(50))
                    *A_AT(m, k) = bad[rnd() % 3];
        } else {
            for (int m = 0; m < M; m++)
                if (chance(8))
                    *A_AT(m, k) = 0.0f;
            for (int n = 0; n < N; n++)
                if (chance(8))
                    *at(&b, k, n) = -0.0f;
        }
    }
    /* Visible poison: NaN/Inf that no flag hides must propagate (the float64
     * loop applies the same skip rules, so it knows where). */
    if (poison && M > 0 && N > 0 && K > 0) {
        *A_AT((int)(rnd() % (unsigned)M), (int)(rnd() % (unsigned)K)) = bad[rnd() % 3];
        *at(&b, (int)(rnd() % (unsigned)K), (int)(rnd() % (unsigned)N)) = bad[rnd() % 3];
    }

    /* Row factors (the online softmax's rescale), for half of the calls (a call
     * without ACCUMULATE must ignore them): in [0, 1], some exactly 1 or 0. */
    buf rsc = buf_new(1, M, M > 0 ? M : 1);
    buf_fill(&rsc, 0.0f, 1.0f);
    for (int m = 0; m < M; m++)
        if (chance(6))
            rsc.p[m] = chance(2) ? 1.0f : 0.0f;
    const float *row_scale = chance(2) ? rsc.p : NULL;
    buf c2 = buf_clone(&c); /* for the scalar table's entry */
    buf_snap(&a);
    buf_snap(&b);
    buf_snap(&c);
    buf_snap(&rsc);
    kt->gemm(M, N, K, alpha, a.p, rs_a, cs_a, b.p, b.ld, c.p, c.ld, flags, row_scale);
    ref_kt->gemm(M, N, K, alpha, a.p, rs_a, cs_a, b.p, b.ld, c2.p, c2.ld, flags, row_scale);

    int ok = 1;
    const long ca = buf_changed(&a, 0), cb = buf_changed(&b, 0), cc = buf_changed(&c, 1) + buf_changed(&rsc, 0);
    if (ca || cb || cc) {
        ok = 0;
        report("M=%d N=%d K=%d layout=%d flags=%d: %ld/%ld/%ld elements outside the output changed (A/B/C)",
               M, N, K, layout, flags, ca, cb, cc);
    }
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            double s = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                const float av = *A_AT(m, k), bv = *at(&b, k, n);
                if ((skip_a && av == 0.0f && signbit(av)) || (skip_b && bv == 0.0f && signbit(bv)))
                    continue;
                s += (double)av * (double)bv;
                mag += fabs((double)av * (double)bv);
            }
            double c0 = accumulate ? (double)c.snap[c.off + (size_t)m * (size_t)c.ld + (size_t)n] : 0.0;
            if (accumulate && row_scale)
                c0 *= (double)row_scale[m];
            const double ref = (double)alpha * s + c0;
            mag = fabs((double)alpha) * mag + fabs(c0);
            const double tol = 4.0 * (K + 3) * FLT_EPSILON * mag + 1e-30;
            const float got = *at(&c, m, n), sc = *at(&c2, m, n);
            if (!close_to(got, ref, tol) || !close_to(got, sc, 2 * tol)) {
                ok = 0;
                report("M=%d N=%d K=%d layout=%d flags=%d alpha=%g row_scale=%d: C(%d,%d) = %.9g, float64 %.9g, "
                       "scalar %.9g (tol %.3g)",
                       M, N, K, layout, flags, (double)alpha, row_scale != NULL, m, n, (double)got, ref, (double)sc,
                       tol);
            }
        }
    record(ok);
#undef A_AT
    buf_free(&a);
    buf_free(&b);
    buf_free(&c);
    buf_free(&c2);
    buf_free(&rsc);
}

/* SDPA_GEMM_STREAM_C (non-temporal stores of C where C and ldc are aligned
 * for them) must store the very values of a plain call: C aligned to the
 * table's col_align floats with a row stride of a multiple of them, as the
 * driver's tiles are (streamed on x86), and one float off (plain stores),
 * against the same call without the flag; the padding between C's rows must
 * stay untouched. */
static void check_gemm_stream_c(const sdpa_kernels *kt, int M, int N, int K, int extra_flags)
{
    const int ca = kt->col_align;
    const ptrdiff_t ldc = (N + ca - 1) / ca * ca + ca;
    const size_t nc = (size_t)M * (size_t)ldc + (size_t)ca;
    float *a = malloc(((size_t)M * K + 1) * sizeof(float)), *b = malloc(((size_t)K * N + 1) * sizeof(float));
    float *c[3];
    for (int x = 0; x < 3; x++) /* nc + ca is a multiple of ca */
        c[x] = aligned_alloc((size_t)ca * sizeof(float), (nc + (size_t)ca) * sizeof(float));
    for (int i = 0; i < M * K; i++)
        a[i] = (extra_flags & SDPA_GEMM_SKIP_ZERO_A) && chance(5) ? -0.0f : frand(-1.0f, 1.0f);
    for (int i = 0; i < K * N; i++)
        b[i] = frand(-1.0f, 1.0f);
    for (int x = 0; x < 3; x++)
        for (size_t i = 0; i < nc + (size_t)ca; i++)
            c[x][i] = bits_float(CANARY_BITS);
    float *dst[3] = {c[0], c[1], c[2] + 1};
    const int flags[3] = {extra_flags, extra_flags | SDPA_GEMM_STREAM_C, extra_flags | SDPA_GEMM_STREAM_C};
    for (int x = 0; x < 3; x++)
        kt->gemm(M, N, K, 0.5f, a, K, 1, b, N, dst[x], ldc, flags[x], NULL);
    int ok = 1;
    for (int x = 1; x < 3 && ok; x++)
        for (int m = 0; m < M && ok; m++)
            for (ptrdiff_t n = 0; n < ldc && ok; n++) {
                const float got = dst[x][m * ldc + n], want = dst[0][m * ldc + n];
                if (memcmp(&got, &want, sizeof got) != 0) {
                    ok = 0;
                    report("M=%d N=%d K=%d flags=%d, C %s: element (%d,%td) = %.9g, plain stores %.9g", M, N, K,
                           flags[x], x == 1 ? "aligned (streamed)" : "one float off (plain)", m, n, (double)got,
                           (double)want);
                }
            }
    record(ok);
    free(a);
    free(b);
    for (int x = 0; x < 3; x++)
        free(c[x]);
}

/* The first index at which two float arrays differ in their bits (SIZE_MAX: none). */
static size_t buf_first_diff(const float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (float_bits(x[i]) != float_bits(y[i]))
            return i;
    return SIZE_MAX;
}

/* A row of C must not depend on how many rows the call has: M rows at once (for a
 * depth of at most 8, B's rows held in registers while A's rows stream past) and the
 * same rows one call each (the row-block micro-kernels) give the same bits, with the
 * default NaN (one payload: which of two payloads survives is not promised),
 * infinities, zeros of both signs and denormals among the inputs. */
static void check_gemm_row_bits(const sdpa_kernels *kt, int M, int N, int K, int layout, int flags, float alpha)
{
    const ptrdiff_t rs_a = layout == 0 ? K + 3 : 1, cs_a = layout == 0 ? 1 : M + 2;
    const size_t na = layout == 0 ? (size_t)M * (size_t)rs_a : (size_t)K * (size_t)cs_a;
    const ptrdiff_t ldc = (N + kt->col_align - 1) / kt->col_align * kt->col_align;
    const size_t nc = (size_t)M * (size_t)ldc + (size_t)kt->col_align;
    float *a = malloc((na + 1) * sizeof(float)), *b = malloc(((size_t)K * N + 1) * sizeof(float)), *c[2];
    static const float odd[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 3e38f};
    for (size_t i = 0; i < na; i++)
        a[i] = chance(4) ? odd[rnd() % 7] : frand(-1.0f, 1.0f);
    for (int i = 0; i < K * N; i++)
        b[i] = chance(4) ? odd[rnd() % 7] : frand(-1.0f, 1.0f);
    for (int x = 0; x < 2; x++) {
        c[x] = aligned_alloc((size_t)kt->col_align * sizeof(float), nc * sizeof(float));
        for (size_t i = 0; i < nc; i++)
            c[x][i] = (float)(i % 13) * 0.25f - 1.0f;
    }
    kt->gemm(M, N, K, alpha, a, rs_a, cs_a, b, N, c[0], ldc, flags, NULL);
    for (int m = 0; m < M; m++)
        kt->gemm(1, N, K, alpha, a + m * rs_a, rs_a, cs_a, b, N, c[1] + (ptrdiff_t)m * ldc, ldc, flags, NULL);
    const size_t bad = buf_first_diff(c[0], c[1], nc);
    if (bad != SIZE_MAX)
        report("M=%d N=%d K=%d layout=%d flags=%d alpha=%g: C[%zu] = %08x whole, %08x row by row", M, N, K, layout,
               flags, (double)alpha, bad, float_bits(c[0][bad]), float_bits(c[1][bad]));
    record(bad == SIZE_MAX);
    free(a);
    free(b);
    free(c[0]);
    free(c[1]);
}

static void test_gemm(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "gemm");
    int combo = 0;
    /* every M x N tail pair, a few depths, cycling through flags and layouts */
    static const int ks[] = {0, 1, 3, 17, 64};
    for (int i = 0; i < n_sizes; i++)
        for (int j = 0; j < n_sizes; j++)
            for (size_t q = 0; q < sizeof ks / sizeof ks[0]; q++, combo++)
                check_gemm(kt, ref_kt, sizes[i], sizes[j], ks[q], combo & 1, (combo >> 1) & 7, combo % 5 == 0);
    /* every depth, a few M x N, every flag combination and layout */
    static const int mn[][2] = {{1, 1}, {5, 13}, {7, 64}, {13, 17}, {65, 33}};
    for (int i = 0; i < n_sizes; i++)
        for (size_t q = 0; q < sizeof mn / sizeof mn[0]; q++)
            for (int f = 0; f < 16; f++)
                check_gemm(kt, ref_kt, mn[q][0], mn[q][1], sizes[i], f & 1, f >> 1, f == 3);
    /* the driver's shapes: S^T = K Q^T, O^T += V^T P^T, dV += P^T dO, dQ += dS K */
    const int bq = kt->block_q, bk = kt->block_k;
    const int shapes[][3] = {{bk, bq, 128}, {128, bq, bk}, {bk, 128, bq}, {bq, 128, bk}, {bk - 3, bq - 5, 80}};
    for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++)
        for (int f = 0; f < 16; f++)
            check_gemm(kt, ref_kt, shapes[q][0], shapes[q][1], shapes[q][2], f & 1, f >> 1, 0);
    /* the dK/dV shapes of a decode backward (keys x head_dim, inner = query columns) and tails */
    static const int st[][3] = {{1, 1, 1}, {6, 64, 17}, {13, 33, 5}, {128, 128, 4}, {7, 100, 3}, {64, 129, 8}};
    for (size_t q = 0; q < sizeof st / sizeof st[0]; q++)
        for (int f = 0; f < 2; f++)
            check_gemm_stream_c(kt, st[q][0], st[q][1], st[q][2], f ? SDPA_GEMM_SKIP_ZERO_A : 0);
    /* rows whole and one by one, the depths of few query columns and one past them */
    static const int rm[] = {6, 7, 13, 128}, rn_[] = {1, 17, 64, 100, 129};
    static const int rf[] = {0, SDPA_GEMM_ACCUMULATE, SDPA_GEMM_STREAM_C};
    for (int K = 1; K <= 9; K++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++)
                check_gemm_row_bits(kt, rm[i], rn_[j] == 64 ? kt->vec_floats * 4 : rn_[j], K, (i + j) % 2, rf[(K + j) % 3],
                                    (K + i) % 2 ? 1.0f : 0.125f);
    kernel_end();
}

/* ------------------------------------------------------- online softmax */

static double ulp_tol(double ref, double ulps)
{
    /* plus the exp cut-off (kernels.h): a probability below it is exactly 0 */
    return ulps * FLT_EPSILON * fabs(ref) + ldexp(1.0, (int)SDPA_EXP_CUTOFF_LOG2);
}

/* Every ISA's exp(x) is 2^y of y = x log2(e) rounded to float (simd_tmpl.h):
 * exp_kernel is float64 2^y of that same float y, which SLEEF u10 and libm
 * exp2f must meet to a few ulp. Against float64 e^x, rounding y adds a
 * relative error of at most |x| (2^-24 + 1.4e-8) (the rounding of the
 * product, and log2(e) rounded to float); exp_close allows |x| 2^-23 for it
 * plus 4 ulp for the 2^y itself. Both checks must hold. (Before exp went
 * through exp2, the check was 4 ulp against e^x alone: the tolerance against
 * e^x is wider by that derived term, and the 4 ulp now bind 2^y of the
 * kernel's own argument.) */
static double exp_kernel(float x)
{
    return exp2((double)(x * 0x1.715476p+0f));
}

static int exp_close(float got, float x, double ref_kernel)
{
    const double e = exp((double)x);
    const double rounding = isfinite(x) ? fabs((double)x) * 0x1p-23 * e : 0.0; /* e^-inf = 0 exactly */
    return close_to(got, ref_kernel, ulp_tol(ref_kernel, 4)) && close_to(got, e, ulp_tol(e, 4) + rounding);
}

/* ------------------------------------------------------ exp denormal flush */

/* The cut-off every ISA applies to exp (kernels.h SDPA_EXP_CUTOFF_LOG2): where
 * exp's argument y = x log2(e), rounded to float, is below the cut-off, the
 * result is exactly +0; above it, at least 2^cut-off (never a denormal). */
static int exp_flush_ok(float got, float x)
{
    const float y = x * 0x1.715476p+0f;
    if (y < SDPA_EXP_CUTOFF_LOG2)
        return float_bits(got) == 0;
    return got >= ldexpf(1.0f, (int)SDPA_EXP_CUTOFF_LOG2) * 0.999f;
}

/* Fixed arguments (no rnd(), so the random stream of the other checks does not
 * move): a sweep of 24 around the cut-off x = SDPA_EXP_CUTOFF_LOG2 / log2(e), 16
 * consecutive floats around it, and far below it down to -FLT_MAX. */
#define N_FLUSH_ARGS 128
static void flush_args(float *x)
{
    int n = 0;
    const float cut = SDPA_EXP_CUTOFF_LOG2 / 0x1.715476p+0f;
    for (int i = 0; i < 96; i++)
        x[n++] = cut + 12.0f - 0.25f * (float)i;
    float b = cut;
    for (int i = 0; i < 8; i++)
        b = nextafterf(b, -INFINITY);
    for (int i = 0; i < 16; i++, b = nextafterf(b, 0.0f))
        x[n++] = b;
    for (int i = 0; i < 15; i++)
        x[n++] = -110.0f - 20.0f * (float)i;
    x[n++] = -FLT_MAX;
}

/* online_softmax (rows = 0) or online_softmax_rows (rows = 1) over statistics
 * whose tile maximum is 0 (so each exp argument is the score itself) and whose
 * other scores are flush_args; on odd statistics the running max m is one of
 * them too, so alpha = exp(m) must flush as well. */
static void check_softmax_flush(const sdpa_kernels *kt, int rows)
{
    float args[N_FLUSH_ARGS];
    flush_args(args);
    const int step = kt->nt_step > 0 ? kt->nt_step : 1;
    const int len = rows ? (N_FLUSH_ARGS + 1 + step - 1) / step * step : N_FLUSH_ARGS + 1;
    const int nstat = rows ? 5 : 2 * kt->vec_floats + 1;
    const int M = rows ? nstat : len, N = rows ? len : nstat;
    float *s = malloc((size_t)M * (size_t)N * sizeof(float)), *x = malloc((size_t)M * (size_t)N * sizeof(float));
    float m[64], l[64], al[64], m_in[64];
#define FL_AT(p, st, i) (rows ? &(p)[(size_t)(st) * (size_t)N + (size_t)(i)] : &(p)[(size_t)(i) * (size_t)N + (size_t)(st)])
    for (int st = 0; st < nstat; st++) {
        for (int i = 0; i < len; i++)
            *FL_AT(s, st, i) = i == 0 ? 0.0f : i <= N_FLUSH_ARGS ? args[(i - 1 + 7 * st) % N_FLUSH_ARGS] : -INFINITY;
        m_in[st] = m[st] = (st & 1) ? args[(13 * st) % N_FLUSH_ARGS] : -INFINITY;
        l[st] = 1.0f;
    }
    memcpy(x, s, (size_t)M * (size_t)N * sizeof(float));
    if (rows)
        kt->online_softmax_rows(M, N, s, N, m, l, al);
    else
        kt->online_softmax(M, N, s, N, m, l, al);
    int ok = 1;
    for (int st = 0; st < nstat && ok; st++) {
        for (int i = 1; i <= N_FLUSH_ARGS && ok; i++) {
            const float xi = *FL_AT(x, st, i), got = *FL_AT(s, st, i);
            if (!exp_flush_ok(got, xi)) {
                ok = 0;
                report("%sflush: exp(%.9g) = %a (0x%08x); below the cut-off it must be +0, above it normal",
                       rows ? "rows " : "", (double)xi, (double)got, (unsigned)float_bits(got));
            }
        }
        if (ok && m_in[st] != -INFINITY && !exp_flush_ok(al[st], m_in[st])) {
            ok = 0;
            report("%sflush: alpha = exp(%.9g) = %a; below the cut-off it must be +0", rows ? "rows " : "",
                   (double)m_in[st], (double)al[st]);
        }
    }
#undef FL_AT
    record(ok);
    free(s);
    free(x);
}

/* bwd_probs: P = exp(S - lse) with S - lse one of flush_args. */
static void check_probs_flush(const sdpa_kernels *kt)
{
    float args[N_FLUSH_ARGS];
    flush_args(args);
    const int M = N_FLUSH_ARGS, N = 2 * kt->vec_floats + 1;
    float *s = malloc((size_t)M * (size_t)N * sizeof(float)), *x = malloc((size_t)M * (size_t)N * sizeof(float));
    float lse[64];
    for (int n = 0; n < N; n++) {
        lse[n] = (n & 1) ? 0.5f : 0.0f;
        for (int k = 0; k < M; k++)
            s[(size_t)k * (size_t)N + (size_t)n] = args[(k + 7 * n) % N_FLUSH_ARGS] + lse[n];
    }
    memcpy(x, s, (size_t)M * (size_t)N * sizeof(float));
    kt->bwd_probs(M, N, s, N, lse);
    int ok = 1;
    for (int k = 0; k < M && ok; k++)
        for (int n = 0; n < N && ok; n++) {
            const float xi = x[(size_t)k * (size_t)N + (size_t)n] - lse[n], got = s[(size_t)k * (size_t)N + (size_t)n];
            if (!exp_flush_ok(got, xi)) {
                ok = 0;
                report("flush: exp(%.9g) = %a (0x%08x); below the cut-off it must be +0, above it normal", (double)xi,
                       (double)got, (unsigned)float_bits(got));
            }
        }
    record(ok);
    free(s);
    free(x);
}

/* online_softmax (rows = 0: S^T is M keys x N queries, one statistic per column)
 * and online_softmax_rows (rows = 1: S is M queries x N keys, one per row; N a
 * multiple of the table's nt_step, as the driver pads). nstat statistics, each over len scores. */
static void check_softmax_layout(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N, int rows)
{
    const int nstat = rows ? M : N, len = rows ? N : M;
    const ptrdiff_t lds = N + (int)(rnd() % 3) * (rows ? kt->nt_step : 4);
    buf s = buf_new(M, N, lds > 0 ? lds : 1);
    buf m = buf_new(1, nstat, nstat > 0 ? nstat : 1), l = buf_new(1, nstat, nstat > 0 ? nstat : 1),
        al = buf_new(1, nstat, nstat > 0 ? nstat : 1);
#define S_AT(b, st, i) (rows ? at((b), (st), (i)) : at((b), (i), (st)))
#define S_SNAP(st, i) (s.snap[s.off + (rows ? (size_t)(st) * (size_t)s.ld + (size_t)(i) : (size_t)(i) * (size_t)s.ld + (size_t)(st))])
    /* per statistic: 0 first tile (m = -inf), 1 running max above the tile, 2 below,
     * 3 fully masked so far and now, 4 finite m and a fully masked tile,
     * 5 wide range (denormal cut-off), 6 m = -inf and a fully masked tile then finite */
    for (int st = 0; st < nstat; st++) {
        const int kind = (int)(rnd() % 7);
        float lo = -4.0f, hi = 4.0f;
        if (kind == 5) {
            lo = -120.0f;
            hi = 10.0f;
        }
        for (int i = 0; i < len; i++)
            *S_AT(&s, st, i) = (kind == 3 || kind == 4 || kind == 6 || chance(15)) ? -INFINITY : frand(lo, hi);
        if (kind == 6 && len > 0)
            *S_AT(&s, st, (int)(rnd() % (unsigned)len)) = frand(-3.0f, 3.0f);
        float mo = -INFINITY;
        if (kind == 1)
            mo = frand(4.0f, 6.0f);
        else if (kind == 2 || kind == 4 || kind == 5)
            mo = frand(-6.0f, -4.0f);
        m.p[st] = mo;
        l.p[st] = mo == -INFINITY ? 0.0f : frand(0.5f, 40.0f);
        al.p[st] = NAN; /* write-only */
    }
    buf s2 = buf_clone(&s), m2 = buf_clone(&m), l2 = buf_clone(&l), al2 = buf_clone(&al);
    buf_snap(&s);
    buf_snap(&m);
    buf_snap(&l);
    buf_snap(&al);
    if (rows) {
        kt->online_softmax_rows(M, N, s.p, s.ld, m.p, l.p, al.p);
        ref_kt->online_softmax_rows(M, N, s2.p, s2.ld, m2.p, l2.p, al2.p);
    } else {
        kt->online_softmax(M, N, s.p, s.ld, m.p, l.p, al.p);
        ref_kt->online_softmax(M, N, s2.p, s2.ld, m2.p, l2.p, al2.p);
    }
    const char *what = rows ? "rows " : "";
    int ok = 1;
    const long bad = buf_changed(&s, 1) + buf_changed(&m, 1) + buf_changed(&l, 1) + buf_changed(&al, 1);
    if (bad) {
        ok = 0;
        report("%sM=%d N=%d: %ld elements outside the outputs changed", what, M, N, bad);
    }
    for (int st = 0; st < nstat && ok; st++) {
        const float mo = m.snap[m.off + (size_t)st], lo = l.snap[l.off + (size_t)st];
        float mx = mo;
        for (int i = 0; i < len; i++) {
            const float x = S_SNAP(st, i);
            mx = x > mx ? x : mx;
        }
        const float mu = mx == -INFINITY ? 0.0f : mx;
        const double a_ref = exp_kernel(mo - mu);
        double sum = 0.0;
        for (int i = 0; i < len && ok; i++) {
            const float x = S_SNAP(st, i);
            const double p_ref = exp_kernel(x - mu);
            const float got = *S_AT(&s, st, i), sc = *S_AT(&s2, st, i);
            sum += p_ref;
            /* masked (-inf): exactly the sentinel -0.0; anything else never -0.0 */
            if ((x == -INFINITY && !(got == 0.0f && signbit(got))) || (x != -INFINITY && got == 0.0f && signbit(got)) ||
                !exp_close(got, x - mu, p_ref) || !close_to(got, sc, ulp_tol(p_ref, 4))) {
                ok = 0;
                report("%sM=%d N=%d: P(stat %d, %d) = %.9g for s=%.9g mu=%.9g, float64 %.9g, scalar %.9g", what, M,
                       N, st, i, (double)got, (double)x, (double)mu, p_ref, (double)sc);
            }
        }
        if (!ok)
            break;
        const double l_ref = (double)lo * a_ref + sum;
        const double l_tol = 4.0 * (len + 3) * FLT_EPSILON * l_ref + FLT_MIN;
        if (float_bits(m.p[st]) != float_bits(mx) || m.p[st] != m2.p[st]) {
            ok = 0;
            report("%sM=%d N=%d: m[%d] = %.9g, expected %.9g (scalar %.9g)", what, M, N, st, (double)m.p[st],
                   (double)mx, (double)m2.p[st]);
        } else if ((mo == -INFINITY && al.p[st] != 0.0f) || !exp_close(al.p[st], mo - mu, a_ref) ||
                   !close_to(al.p[st], al2.p[st], ulp_tol(a_ref, 4))) {
            ok = 0;
            report("%sM=%d N=%d: alpha[%d] = %.9g, float64 %.9g, scalar %.9g", what, M, N, st, (double)al.p[st],
                   a_ref, (double)al2.p[st]);
        } else if (!close_to(l.p[st], l_ref, l_tol) || !close_to(l.p[st], l2.p[st], 2 * l_tol)) {
            ok = 0;
            report("%sM=%d N=%d: l[%d] = %.9g, float64 %.9g, scalar %.9g", what, M, N, st, (double)l.p[st], l_ref,
                   (double)l2.p[st]);
        }
    }
#undef S_AT
#undef S_SNAP
    record(ok);
    buf_free(&s);
    buf_free(&m);
    buf_free(&l);
    buf_free(&al);
    buf_free(&s2);
    buf_free(&m2);
    buf_free(&l2);
    buf_free(&al2);
}

static void check_softmax(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N)
{
    check_softmax_layout(kt, ref_kt, M, N, 0);
}

static void test_softmax(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "online_softmax");
    for (int i = 0; i < n_sizes; i++)
        for (int j = 0; j < n_sizes; j++)
            check_softmax(kt, ref_kt, sizes[i], sizes[j]);
    check_softmax_flush(kt, 0);
    kernel_end();
}


static void test_softmax_rows(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    static const int rows[] = {0, 1, 2, 3, 4, 5, 7, 8, 12, 16};
    static const int steps[] = {0, 1, 2, 3, 4, 8, 9, 16, 32}; /* widths in nt_step keys */
    kernel_begin(kt->name, "online_softmax_rows");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (size_t j = 0; j < sizeof steps / sizeof steps[0]; j++)
            for (int rep = 0; rep < 3; rep++)
                check_softmax_layout(kt, ref_kt, rows[i], steps[j] * kt->nt_step, 1);
    check_softmax_flush(kt, 1);
    kernel_end();
}

/* ----------------------------------------------------------- scale rows */

/* dst = src * alpha[row], in place or into another buffer; exact (one rounding of the
 * product), and an in-place row with factor 1 keeps its bits (NaN payloads included). */
static void check_scale(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N)
{
    const int in_place = chance(2);
    buf src = buf_new(M, N, N + (int)(rnd() % 3) * 5 + (N == 0));
    buf dst = buf_new(M, N, N + (int)(rnd() % 3) * 7 + (N == 0));
    buf al = buf_new(1, M, M > 0 ? M : 1);
    buf_fill(&src, -100.0f, 100.0f);
    buf_fill(&dst, -100.0f, 100.0f);
    buf_fill(&al, 0.0f, 1.0f);
    const int kind = (int)(rnd() % 3); /* 1: all factors 1; 2: mostly 1 */
    for (int m = 0; m < M; m++) {
        if (kind == 1 || (kind == 2 && !chance(5)))
            al.p[m] = 1.0f;
        else if (chance(10))
            al.p[m] = 0.0f;
    }
    buf *out = in_place ? &src : &dst;
    buf src2 = buf_clone(&src), dst2 = buf_clone(&dst);
    buf *out2 = in_place ? &src2 : &dst2;
    buf_snap(&src);
    buf_snap(&dst);
    buf_snap(&al);
    kt->scale_rows(M, N, src.p, src.ld, al.p, out->p, out->ld);
    ref_kt->scale_rows(M, N, src2.p, src2.ld, al.p, out2->p, out2->ld);
    int ok = 1;
    const long bad = buf_changed(&src, in_place) + buf_changed(&dst, !in_place) + buf_changed(&al, 0);
    if (bad) {
        ok = 0;
        report("M=%d N=%d in_place=%d: %ld elements outside the output changed", M, N, in_place, bad);
    }
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            const float x = src.snap[src.off + (size_t)m * (size_t)src.ld + (size_t)n];
            const float ref = (float)((double)x * (double)al.p[m]);
            if (float_bits(*at(out, m, n)) != float_bits(ref) || float_bits(*at(out, m, n)) != float_bits(*at(out2, m, n))) {
                ok = 0;
                report("M=%d N=%d in_place=%d: O(%d,%d) = %.9g, expected %.9g", M, N, in_place, m, n,
                       (double)*at(out, m, n), (double)ref);
            }
        }
    record(ok);
    buf_free(&src);
    buf_free(&dst);
    buf_free(&al);
    buf_free(&src2);
    buf_free(&dst2);
}

static void test_scale(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "scale_rows");
    for (int i = 0; i < n_sizes; i++)
        for (int j = 0; j < n_sizes; j++)
            check_scale(kt, ref_kt, sizes[i], sizes[j]);
    kernel_end();
}

/* ------------------------------------------------------------ bwd probs */

static void check_probs(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N)
{
    buf s = buf_new(M, N, N + (int)(rnd() % 2) * 9 + (N == 0));
    buf lse = buf_new(1, N, N > 0 ? N : 1);
    for (int n = 0; n < N; n++) {
        const int kind = (int)(rnd() % 5); /* 0: lse = -inf (row fully masked) */
        lse.p[n] = kind == 0 ? -INFINITY : frand(-2.0f, 6.0f);
        for (int k = 0; k < M; k++) {
            float x = kind == 4 ? frand(-110.0f, 2.0f) : frand(-6.0f, 4.0f);
            if (kind == 0 || chance(15))
                x = chance(70) ? -INFINITY : x;
            *at(&s, k, n) = x;
        }
    }
    buf s2 = buf_clone(&s);
    buf_snap(&s);
    buf_snap(&lse);
    kt->bwd_probs(M, N, s.p, s.ld, lse.p);
    ref_kt->bwd_probs(M, N, s2.p, s2.ld, lse.p);
    int ok = 1;
    const long bad = buf_changed(&s, 1) + buf_changed(&lse, 0);
    if (bad) {
        ok = 0;
        report("M=%d N=%d: %ld elements outside the output changed", M, N, bad);
    }
    for (int k = 0; k < M && ok; k++)
        for (int n = 0; n < N && ok; n++) {
            const float x = s.snap[s.off + (size_t)k * (size_t)s.ld + (size_t)n];
            const float sub = lse.p[n] == -INFINITY ? INFINITY : lse.p[n];
            const double ref = exp_kernel(x - sub);
            const float got = *at(&s, k, n);
            if (((lse.p[n] == -INFINITY || x == -INFINITY) && !(got == 0.0f && signbit(got))) ||
                (lse.p[n] != -INFINITY && x != -INFINITY && got == 0.0f && signbit(got)) || !exp_close(got, x - sub, ref) ||
                !close_to(got, *at(&s2, k, n), ulp_tol(ref, 4))) {
                ok = 0;
                report("M=%d N=%d: P(%d,%d) = %.9g for s=%.9g lse=%.9g, float64 %.9g, scalar %.9g", M, N, k, n,
                       (double)got, (double)x, (double)lse.p[n], ref, (double)*at(&s2, k, n));
            }
        }
    record(ok);
    buf_free(&s);
    buf_free(&lse);
    buf_free(&s2);
}

static void test_probs(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "bwd_probs");
    for (int i = 0; i < n_sizes; i++)
        for (int j = 0; j < n_sizes; j++)
            check_probs(kt, ref_kt, sizes[i], sizes[j]);
    check_probs_flush(kt);
    kernel_end();
}

/* ---------------------------------------------------------- bwd dscores */

static void check_dscores(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N)
{
    buf p = buf_new(M, N, N + (int)(rnd() % 2) * 3 + (N == 0));
    buf dp = buf_new(M, N, N + (int)(rnd() % 2) * 5 + (N == 0));
    buf d = buf_new(1, N, N > 0 ? N : 1);
    buf_fill(&d, -2.0f, 2.0f);
    for (int k = 0; k < M; k++)
        for (int n = 0; n < N; n++) {
            /* P: the masked sentinel -0.0, an underflowed +0, or a probability */
            const int masked = chance(30), under = !masked && chance(10);
            *at(&p, k, n) = masked ? -0.0f : under ? 0.0f : frand(0.0f, 1.0f);
            /* a masked V row gives NaN/Inf in dP exactly where P is masked; an
             * underflowed +0 times a NaN/Inf dP must stay NaN (it is allowed) */
            *at(&dp, k, n) = ((masked || under) && chance(50)) ? (chance(50) ? NAN : INFINITY) : frand(-3.0f, 3.0f);
        }
    buf dp2 = buf_clone(&dp);
    buf_snap(&p);
    buf_snap(&dp);
    buf_snap(&d);
    kt->bwd_dscores(M, N, p.p, p.ld, dp.p, dp.ld, d.p);
    ref_kt->bwd_dscores(M, N, p.p, p.ld, dp2.p, dp2.ld, d.p);
    int ok = 1;
    const long bad = buf_changed(&p, 0) + buf_changed(&dp, 1) + buf_changed(&d, 0);
    if (bad) {
        ok = 0;
        report("M=%d N=%d: %ld elements outside the output changed", M, N, bad);
    }
    for (int k = 0; k < M && ok; k++)
        for (int n = 0; n < N && ok; n++) {
            const float pv = *at(&p, k, n);
            const float x = dp.snap[dp.off + (size_t)k * (size_t)dp.ld + (size_t)n];
            const int pmasked = pv == 0.0f && signbit(pv);
            const double ref = pmasked ? 0.0 : (double)pv * (double)(x - d.p[n]);
            const float got = *at(&dp, k, n);
            int good;
            if (pmasked) /* the sentinel -0.0, whatever dP holds */
                good = got == 0.0f && signbit(got) && *at(&dp2, k, n) == 0.0f && signbit(*at(&dp2, k, n));
            else if (pv == 0.0f) /* +0 (underflow): NaN if dP is not finite, else +0 exactly, never -0 */
                good = isfinite(x) ? (got == 0.0f && !signbit(got)) : isnan(got);
            else {
                const double tol = 2.0 * FLT_EPSILON * fabs((double)pv) * (fabs((double)x) + fabs((double)d.p[n])) + 1e-37;
                good = close_to(got, ref, tol) && close_to(got, *at(&dp2, k, n), tol);
            }
            if (!good) {
                ok = 0;
                report("M=%d N=%d: dS(%d,%d) = %.9g, float64 %.9g, scalar %.9g", M, N, k, n, (double)got, ref,
                       (double)*at(&dp2, k, n));
            }
        }
    record(ok);
    buf_free(&p);
    buf_free(&dp);
    buf_free(&d);
    buf_free(&dp2);
}

static void test_dscores(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "bwd_dscores");
    for (int i = 0; i < n_sizes; i++)
        for (int j = 0; j < n_sizes; j++)
            check_dscores(kt, ref_kt, sizes[i], sizes[j]);
    kernel_end();
}

/* -------------------------------------------------------------- gemm_nt */

/* A buffer whose last row ends exactly at the end of its allocation (no canary
 * behind it), so that AddressSanitizer sees any read past the last element. */
static buf buf_new_exact(int rows, int cols, ptrdiff_t ld)
{
    tail_guard_toggle = 1; /* buf_new flips it to 0: no tail guard */
    return buf_new(rows, cols, ld);
}

/* C(m,n) = alpha sum_k A[m*lda+k] B[n*ldb+k] at C[m*rs_c + n*cs_c].
 * layout 0: rs_c = 1, cs_c = ld (S^T, as the driver stores it); layout 1: rs_c = ld, cs_c = 1.
 * Row padding of A and B holds NaN canaries (a kernel that used them would
 * show NaN); A and B end exactly at their last element. */
static void check_gemm_nt(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N, int K,
                          int layout, int poison)
{
    static const float alphas[] = {1.0f, 0.125f, -0.7f, 3.0f};
    const float alpha = alphas[rnd() % 4];
    const int pad_a = (int)(rnd() % 3) * 3, pad_b = (int)(rnd() % 4) * 5, pad_c = (int)(rnd() % 2) * 7;
    const ptrdiff_t lda = K + pad_a, ldb = K + pad_b;
    buf a = buf_new_exact(M, K, lda > 0 ? lda : 1);
    buf b = buf_new_exact(N, K, ldb > 0 ? ldb : 1);
    buf c = layout == 0 ? buf_new(N, M, M + pad_c > 0 ? M + pad_c : 1) : buf_new(M, N, N + pad_c > 0 ? N + pad_c : 1);
    const ptrdiff_t rs_c = layout == 0 ? 1 : c.ld, cs_c = layout == 0 ? c.ld : 1;
#define C_AT(cb, m, n) (layout == 0 ? at((cb), (n), (m)) : at((cb), (m), (n)))
    buf_fill(&a, -1.0f, 1.0f);
    buf_fill(&b, -1.0f, 1.0f);
    for (int m = 0; m < M; m++) /* zeros of both signs */
        for (int k = 0; k < K; k++)
            if (chance(5))
                *at(&a, m, k) = chance(50) ? 0.0f : -0.0f;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            if (chance(5))
                *at(&b, n, k) = chance(50) ? 0.0f : -0.0f;
    for (int m = 0; m < M; m++) /* must be overwritten without being read */
        for (int n = 0; n < N; n++)
            *C_AT(&c, m, n) = NAN;
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    if (poison && M > 0 && N > 0 && K > 0) { /* NaN/Inf must propagate */
        *at(&a, (int)(rnd() % (unsigned)M), (int)(rnd() % (unsigned)K)) = bad[rnd() % 3];
        *at(&b, (int)(rnd() % (unsigned)N), (int)(rnd() % (unsigned)K)) = bad[rnd() % 3];
    }

    buf c2 = buf_clone(&c); /* for the scalar table's entry */
    buf c4 = buf_clone(&c); /* for gemm_nt_rows4 */
    buf_snap(&a);
    buf_snap(&b);
    buf_snap(&c);
    buf_snap(&c4);
    kt->gemm_nt(M, N, K, alpha, a.p, lda, b.p, ldb, c.p, rs_c, cs_c);
    ref_kt->gemm_nt(M, N, K, alpha, a.p, lda, b.p, ldb, c2.p, rs_c, cs_c);
    kt->gemm_nt_rows4(M, N, K, alpha, a.p, lda, b.p, ldb, c4.p, rs_c, cs_c);

    int ok = 1;
    /* gemm_nt_rows4: gemm_nt's bits (NaN for NaN), and nothing else written */
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            const float x = *C_AT(&c, m, n), y = *C_AT(&c4, m, n);
            if (float_bits(x) != float_bits(y) && !(isnan(x) && isnan(y))) {
                ok = 0;
                report("M=%d N=%d K=%d layout=%d: gemm_nt_rows4 C(%d,%d) = %.9g, gemm_nt %.9g", M, N, K, layout, m,
                       n, (double)y, (double)x);
            }
        }
    if (ok && buf_changed(&c4, 1)) {
        ok = 0;
        report("M=%d N=%d K=%d layout=%d: gemm_nt_rows4 wrote outside C", M, N, K, layout);
    }
    const long ca = buf_changed(&a, 0), cb = buf_changed(&b, 0), cc = buf_changed(&c, 1);
    if (ca || cb || cc) {
        ok = 0;
        report("M=%d N=%d K=%d layout=%d: %ld/%ld/%ld elements outside the output changed (A/B/C)", M, N, K,
               layout, ca, cb, cc);
    }
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            double s = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                const double p = (double)*at(&a, m, k) * (double)*at(&b, n, k);
                s += p;
                mag += fabs(p);
            }
            const double ref = (double)alpha * s;
            const double tol = 4.0 * (K + 3) * FLT_EPSILON * fabs((double)alpha) * mag + 1e-30;
            const float got = *C_AT(&c, m, n), sc = *C_AT(&c2, m, n);
            if (!close_to(got, ref, tol) || !close_to(got, sc, 2 * tol)) {
                ok = 0;
                report("M=%d N=%d K=%d layout=%d alpha=%g lda=%td ldb=%td: C(%d,%d) = %.9g, float64 %.9g, scalar %.9g (tol %.3g)",
                       M, N, K, layout, (double)alpha, lda, ldb, m, n, (double)got, ref, (double)sc, tol);
            }
        }
    /* Fixed order: one element alone gives the same bits as inside the block. */
    if (ok && M > 0 && N > 0) {
        const int m = (int)(rnd() % (unsigned)M), n = (int)(rnd() % (unsigned)N);
        float one = NAN;
        kt->gemm_nt(1, 1, K, alpha, at(&a, m, 0), lda, at(&b, n, 0), ldb, &one, 1, 1);
        if (float_bits(one) != float_bits(*C_AT(&c, m, n)) && !(isnan(one) && isnan(*C_AT(&c, m, n)))) {
            ok = 0;
            report("M=%d N=%d K=%d layout=%d: C(%d,%d) = %.9g in the block, %.9g alone", M, N, K, layout, m, n,
                   (double)*C_AT(&c, m, n), (double)one);
        }
    }
    record(ok);
#undef C_AT
    buf_free(&a);
    buf_free(&b);
    buf_free(&c);
    buf_free(&c2);
    buf_free(&c4);
}

static void test_gemm_nt(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "gemm_nt");
    static const int ms[] = {0, 1, 2, 3, 4, 5, 7, 8};
    static const int ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 17, 63, 64, 65, 127, 128, 129};
    /* a spread of depths; the register budget's edges follow below */
    static const int ks[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300};
    int combo = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (size_t q = 0; q < sizeof ks / sizeof ks[0]; q++, combo++)
                check_gemm_nt(kt, ref_kt, ms[i], ns[j], ks[q], combo & 1, combo % 7 == 0);
    /* query rows in registers up to attend_max_vecs vectors (two rows up to half
     * of them), the blocked kernel above: every edge, for every ISA */
    const int qfl = kt->attend_max_vecs * kt->vec_floats;
    for (int h = 1; h <= 2 && qfl > 0; h++)
        for (int d = -1; d <= 1; d++)
            for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++, combo++)
                check_gemm_nt(kt, ref_kt, ms[i], ns[combo % (sizeof ns / sizeof ns[0])], qfl / h + d, combo & 1,
                              combo % 7 == 0);
    /* the driver's shapes: up to nt_max_cols query rows, a key tile, typical head_dims */
    const int mmax = kt->nt_max_cols > 1 ? kt->nt_max_cols : 1;
    static const int dks[] = {64, 80, 96, 128, 256};
    for (int m = 1; m <= mmax; m++)
        for (size_t q = 0; q < sizeof dks / sizeof dks[0]; q++)
            for (int layout = 0; layout < 2; layout++)
                check_gemm_nt(kt, ref_kt, m, kt->block_k - (int)(rnd() % 2), dks[q], layout, 0);
    kernel_end();
}

/* ---------------------------------------------------------- gemm_stream */

/* C = row_scale * C + A B (A: M x K, row stride lda; B: K x N; C: M x N), with
 * SKIP_ZERO_A semantics when skip: a k whose A column holds the sentinel -0.0
 * hides NaN/Inf in its B row; isolated -0.0 / +0.0 elsewhere are ordinary
 * (only skip hides anything). Compared with float64 and the scalar entry. */
static void check_gemm_stream(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N, int K,
                              int skip, int scaled, int poison)
{
    const int pad_a = (int)(rnd() % 3) * 3, pad_b = (int)(rnd() % 3) * 5, pad_c = (int)(rnd() % 2) * 7;
    buf a = buf_new_exact(M, K, K + pad_a > 0 ? K + pad_a : 1);
    buf b = buf_new_exact(K, N, N + pad_b > 0 ? N + pad_b : 1);
    buf c = buf_new(M, N, N + pad_c > 0 ? N + pad_c : 1);
    buf_fill(&a, 0.0f, 1.0f);
    buf_fill(&b, -1.0f, 1.0f);
    buf_fill(&c, -1.0f, 1.0f);
    float scale[32];
    for (int m = 0; m < M && m < 32; m++)
        scale[m] = chance(30) ? 1.0f : frand(0.0f, 1.0f);
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < K; k++) {
        const int r = (int)(rnd() % 100);
        if (skip && r < 20) { /* a masked key: every row's P is the sentinel */
            for (int m = 0; m < M; m++)
                *at(&a, m, k) = -0.0f;
            for (int n = 0; n < N; n++)
                if (chance(50))
                    *at(&b, k, n) = bad[rnd() % 3];
        } else if (skip && r < 30 && M > 1) { /* masked for some rows only */
            for (int m = 0; m < M; m++)
                if (chance(50))
                    *at(&a, m, k) = -0.0f;
        } else {
            for (int m = 0; m < M; m++)
                if (chance(8))
                    *at(&a, m, k) = 0.0f; /* an underflowed probability: ordinary */
        }
    }
    if (poison && M > 0 && N > 0 && K > 0) { /* visible: must propagate */
        int k = (int)(rnd() % (unsigned)K), m = (int)(rnd() % (unsigned)M);
        if (!(skip && float_bits(*at(&a, m, k)) == 0x80000000u))
            *at(&b, k, (int)(rnd() % (unsigned)N)) = bad[rnd() % 3];
    }
    buf c2 = buf_clone(&c);
    buf_snap(&a);
    buf_snap(&b);
    buf_snap(&c);
    kt->gemm_stream(M, N, K, a.p, a.ld, b.p, b.ld, c.p, c.ld, skip, scaled ? scale : NULL);
    ref_kt->gemm_stream(M, N, K, a.p, a.ld, b.p, b.ld, c2.p, c2.ld, skip, scaled ? scale : NULL);
    int ok = 1;
    const long ca = buf_changed(&a, 0), cb = buf_changed(&b, 0), cc = buf_changed(&c, 1);
    if (ca || cb || cc) {
        ok = 0;
        report("M=%d N=%d K=%d skip=%d: %ld/%ld/%ld elements outside the output changed (A/B/C)", M, N, K,
               skip, ca, cb, cc);
    }
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            const double c0 = (double)c.snap[c.off + (size_t)m * (size_t)c.ld + (size_t)n];
            const double sc = scaled ? (double)scale[m] : 1.0;
            double s = sc * c0, mag = fabs(sc * c0);
            for (int k = 0; k < K; k++) {
                const float av = *at(&a, m, k), bv = *at(&b, k, n);
                if (skip && float_bits(av) == 0x80000000u)
                    continue;
                s += (double)av * (double)bv;
                mag += fabs((double)av * (double)bv);
            }
            const double tol = 4.0 * (K + 3) * FLT_EPSILON * mag + 1e-30;
            const float got = *at(&c, m, n), ref_s = *at(&c2, m, n);
            if (!close_to(got, s, tol) || !close_to(got, ref_s, 2 * tol)) {
                ok = 0;
                report("M=%d N=%d K=%d skip=%d scaled=%d: C(%d,%d) = %.9g, float64 %.9g, scalar %.9g (tol %.3g)",
                       M, N, K, skip, scaled, m, n, (double)got, s, (double)ref_s, tol);
            }
        }
    record(ok);
    buf_free(&a);
    buf_free(&b);
    buf_free(&c);
    buf_free(&c2);
}

static void test_gemm_stream(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "gemm_stream");
    static const int ms[] = {0, 1, 2, 3, 4, 5, 7, 8, 16};
    /* head_dims around the vector length and the register budget (AVX-512: up to
     * 384 in registers for one row, 128 for two), above it (registers + an L1 buffer) and
     * above that plus 512 columns (L1 buffer, 512-column chunks) */
    static const int ns[] = {0, 1, 7, 8, 9, 15, 16, 17, 33, 64, 80, 97, 127, 128, 129, 255, 256, 257, 300, 385, 600, 1000};
    static const int ks[] = {0, 1, 2, 5, 16, 17, 32};
    int combo = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (size_t q = 0; q < sizeof ks / sizeof ks[0]; q++, combo++)
                check_gemm_stream(kt, ref_kt, ms[i], ns[j], ks[q], combo & 1, (combo >> 1) & 1, combo % 7 == 0);
    kernel_end();
}

/* ---------------------------------------------------------- attend_rows */

/* attend_rows over N keys from a fresh state (m = -inf, l = 0, O = 0), in two
 * calls when split > 0 (the state carries over): O / l must be softmax(scale
 * Q K^T) V and m + log l the logsumexp, against float64; a shape the ISA does
 * not take must return 0 and touch nothing. */
static void check_attend(const sdpa_kernels *kt, int M, int N, int Dk, int Dv, int split)
{
    const float scale = 1.0f / sqrtf((float)(Dk > 0 ? Dk : 1));
    buf q = buf_new_exact(M, Dk, Dk + 3), k = buf_new_exact(N, Dk, Dk + 5), v = buf_new_exact(N, Dv, Dv);
    buf o = buf_new(M, Dv, Dv + 2), st = buf_new(3, M, M);
    float *scratch = malloc((size_t)(kt->attend_scratch > 0 ? kt->attend_scratch : 1) * sizeof(float));
    buf_fill(&q, -2.0f, 2.0f);
    buf_fill(&k, -2.0f, 2.0f);
    buf_fill(&v, -1.0f, 1.0f);
    for (int r = 0; r < M; r++) {
        for (int c = 0; c < Dv; c++)
            *at(&o, r, c) = 0.0f;
        *at(&st, 0, r) = -INFINITY;
        *at(&st, 1, r) = 0.0f;
    }
    buf_snap(&q);
    buf_snap(&k);
    buf_snap(&v);
    buf_snap(&o);
    buf_snap(&st);
    const int n1 = split > 0 && split < N ? split : N;
    int done = kt->attend_rows(M, n1, Dk, Dv, scale, q.p, q.ld, k.p, k.ld, v.p, v.ld, at(&st, 0, 0),
                               at(&st, 1, 0), o.p, o.ld, scratch);
    if (done && n1 < N)
        done = kt->attend_rows(M, N - n1, Dk, Dv, scale, q.p, q.ld, at(&k, n1, 0), k.ld, at(&v, n1, 0), v.ld,
                               at(&st, 0, 0), at(&st, 1, 0), o.p, o.ld, scratch);
    int ok = 1;
    const long cq = buf_changed(&q, 0), ck = buf_changed(&k, 0), cv = buf_changed(&v, 0);
    const long co = buf_changed(&o, done), cs = buf_changed(&st, done);
    if (cq || ck || cv || co || cs) {
        ok = 0;
        report("M=%d N=%d Dk=%d Dv=%d: %ld/%ld/%ld/%ld/%ld elements outside the outputs changed (Q/K/V/O/m,l)",
               M, N, Dk, Dv, cq, ck, cv, co, cs);
    }
    const int vl = kt->vec_floats, regs = kt->attend_max_vecs;
    if (ok && !done && Dk > 0 && Dv > 0 && M <= kt->attend_max_rows && (Dk + vl - 1) / vl == (Dv + vl - 1) / vl &&
        (Dk + vl - 1) / vl <= regs) {
        ok = 0;
        report("M=%d N=%d Dk=%d Dv=%d: not handled", M, N, Dk, Dv);
    }
    for (int r = 0; r < M && ok && done && N > 0; r++) {
        double mx = -INFINITY, sum = 0.0;
        double *sc = malloc((size_t)N * sizeof(double));
        for (int j = 0; j < N; j++) {
            double d = 0.0;
            for (int c = 0; c < Dk; c++)
                d += (double)*at(&q, r, c) * (double)*at(&k, j, c);
            sc[j] = d * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int j = 0; j < N; j++)
            sum += exp(sc[j] - mx);
        const double lse = mx + log(sum);
        const double got_lse = (double)*at(&st, 0, r) + log((double)*at(&st, 1, r));
        if (!close_to(got_lse, lse, 1e-5 * (fabs(lse) + 1.0))) {
            ok = 0;
            report("M=%d N=%d Dk=%d Dv=%d: row %d lse %.9g, float64 %.9g", M, N, Dk, Dv, r, got_lse, lse);
        }
        for (int c = 0; c < Dv && ok; c++) {
            double ref = 0.0;
            for (int j = 0; j < N; j++)
                ref += exp(sc[j] - mx) / sum * (double)*at(&v, j, c);
            const double got = (double)*at(&o, r, c) / (double)*at(&st, 1, r);
            if (!close_to(got, ref, 1e-5 + 8.0 * (N + Dk) * FLT_EPSILON)) {
                ok = 0;
                report("M=%d N=%d Dk=%d Dv=%d split=%d: O(%d,%d) = %.9g, float64 %.9g", M, N, Dk, Dv, split, r, c,
                       got, ref);
            }
        }
        free(sc);
    }
    record(ok);
    buf_free(&q);
    buf_free(&k);
    buf_free(&v);
    buf_free(&o);
    buf_free(&st);
    free(scratch);
}

static void test_attend(const sdpa_kernels *kt)
{
    if (!kt->attend_rows)
        return;
    kernel_begin(kt->name, "attend_rows");
    const int mx = kt->attend_max_rows, st = kt->nt_step, qfl = kt->attend_max_vecs * kt->vec_floats;
    const int ms[] = {1, 2, 3, 4, 5, 8, mx, mx + 1};
    const int ns[] = {0, 1, 5, st - 1, st, st + 1, 2 * st + 1, 100};
    /* head_dims: a spread, and the register budget's edges (one and two rows) */
    const int ds[] = {1, 4, 7, 8, 15, 16, 17, 32, 33, 64, 80, 100, 128, 129, 200, 256, 257,
                      qfl / 2 - 1, qfl / 2 + 1, qfl - 1, qfl, qfl + 1};
    int combo = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (size_t d = 0; d < sizeof ds / sizeof ds[0]; d++, combo++)
                if (ds[d] > 0)
                    check_attend(kt, ms[i], ns[j], ds[d], combo % 11 == 0 ? ds[d] + kt->vec_floats : ds[d],
                                 combo % 3 ? 0 : ns[j] / 2 + 1);
    kernel_end();
}

/* attend_rows_bf16 / attend_rows_f16: a 16-bit K/V cache must give, bit for bit,
 * what attend_rows gives on the same rows widened (the return value included,
 * over two calls when split > 0), read nothing past its rows (the 16-bit
 * buffers are exact-sized allocations: ASan catches an over-read) and leave K
 * and V untouched. */
static void check_attend16(const sdpa_kernels *kt, int type, int M, int N, int Dk, int Dv, int split)
{
    const sdpa_attend_rows16_fn f = type == SDPA_DTYPE_BF16 ? kt->attend_rows_bf16 : kt->attend_rows_f16;
    const sdpa_narrow_rows_fn narrow = type == SDPA_DTYPE_BF16 ? kt->narrow_bf16 : kt->narrow_f16;
    const sdpa_widen_rows_fn widen = type == SDPA_DTYPE_BF16 ? kt->widen_bf16 : kt->widen_f16;
    const float scale = 1.0f / sqrtf((float)(Dk > 0 ? Dk : 1));
    const ptrdiff_t ldk = Dk + 3, ldv = Dv + 1, ldq = Dk + 2;
    const size_t nk = N > 0 ? (size_t)(N - 1) * ldk + Dk : 0, nv = N > 0 ? (size_t)(N - 1) * ldv + Dv : 0;
    uint16_t *k16 = malloc(nk * 2 + 2), *v16 = malloc(nv * 2 + 2), *k16c = malloc(nk * 2 + 2), *v16c = malloc(nv * 2 + 2);
    float *kf = malloc(nk * 4 + 4), *vf = malloc(nv * 4 + 4), *q = malloc((size_t)M * ldq * 4 + 4);
    float *o[2], *m[2], *l[2], *scratch[2];
    for (int i = 0; i < 2; i++) {
        o[i] = calloc((size_t)M * Dv + 1, 4);
        m[i] = malloc((size_t)M * 4 + 4);
        l[i] = calloc((size_t)M + 1, 4);
        scratch[i] = malloc((size_t)(kt->attend_scratch > 0 ? kt->attend_scratch : 1) * 4);
        for (int r = 0; r < M; r++)
            m[i][r] = -INFINITY;
    }
    for (size_t i = 0; i < nk; i++)
        kf[i] = (float)(rand() % 4001 - 2000) / 997.0f;
    for (size_t i = 0; i < nv; i++)
        vf[i] = (float)(rand() % 4001 - 2000) / 1999.0f;
    for (size_t i = 0; i < (size_t)M * ldq; i++)
        q[i] = (float)(rand() % 4001 - 2000) / 1013.0f;
    if (N > 0) {
        narrow(N, Dk, kf, ldk, k16, ldk);
        narrow(N, Dv, vf, ldv, v16, ldv);
        widen(N, Dk, k16, ldk, kf, ldk);
        widen(N, Dv, v16, ldv, vf, ldv);
    }
    memcpy(k16c, k16, nk * 2);
    memcpy(v16c, v16, nv * 2);
    const int n1 = split > 0 && split < N ? split : N;
    int d32 = kt->attend_rows(M, n1, Dk, Dv, scale, q, ldq, kf, ldk, vf, ldv, m[0], l[0], o[0], Dv, scratch[0]);
    int d16 = f(M, n1, Dk, Dv, scale, q, ldq, k16, ldk, v16, ldv, m[1], l[1], o[1], Dv, scratch[1]);
    if (d32 && n1 < N)
        d32 = kt->attend_rows(M, N - n1, Dk, Dv, scale, q, ldq, kf + n1 * ldk, ldk, vf + n1 * ldv, ldv, m[0], l[0],
                              o[0], Dv, scratch[0]);
    if (d16 && n1 < N)
        d16 = f(M, N - n1, Dk, Dv, scale, q, ldq, k16 + n1 * ldk, ldk, v16 + n1 * ldv, ldv, m[1], l[1], o[1], Dv,
                scratch[1]);
    int ok = d32 == d16 && memcmp(k16, k16c, nk * 2) == 0 && memcmp(v16, v16c, nv * 2) == 0 &&
             memcmp(o[0], o[1], (size_t)M * Dv * 4) == 0 && memcmp(m[0], m[1], (size_t)M * 4) == 0 &&
             memcmp(l[0], l[1], (size_t)M * 4) == 0;
    if (!ok)
        report("%s M=%d N=%d Dk=%d Dv=%d split=%d: done %d/%d, or O/m/l bits differ from attend_rows on the widened "
               "rows, or K/V written",
               type == SDPA_DTYPE_BF16 ? "bf16" : "fp16", M, N, Dk, Dv, split, d16, d32);
    record(ok);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(m[i]), free(l[i]), free(scratch[i]);
    free(k16), free(v16), free(k16c), free(v16c), free(kf), free(vf), free(q);
}

/* attend_rows_bf16_pairs (AVX-512 with AVX512_BF16): bf16 query rows over a bf16 cache.
 * Shapes it takes (head_dim_qk = head_dim_v, a multiple of 32 up to 256, 1..attend_max_rows
 * rows): against float64 on the same bf16 values, LSE and O as attend_rows's check (its
 * sums run in another order than attend_rows_bf16's); every other shape: attend_rows_bf16's
 * bits. Over two calls when split > 0; K, V and Q untouched, nothing past the outputs. */
static void check_attend_pairs(const sdpa_kernels *kt, int M, int N, int D, int Dv, int split)
{
    const float scale = 1.0f / sqrtf((float)(D > 0 ? D : 1));
    const ptrdiff_t ldk = D + 5, ldv = Dv + 3, ldq = D + 2;
    const size_t nk = N > 0 ? (size_t)(N - 1) * ldk + D : 0, nv = N > 0 ? (size_t)(N - 1) * ldv + Dv : 0;
    const size_t nq = (size_t)M * ldq;
    uint16_t *k16 = malloc(nk * 2 + 2), *v16 = malloc(nv * 2 + 2), *q16 = malloc(nq * 2 + 2);
    uint16_t *k16c = malloc(nk * 2 + 2), *v16c = malloc(nv * 2 + 2);
    float *kf = malloc(nk * 4 + 4), *vf = malloc(nv * 4 + 4), *q = malloc(nq * 4 + 4), *qc = malloc(nq * 4 + 4);
    float *o[2], *m[2], *l[2], *scratch[2];
    for (int i = 0; i < 2; i++) {
        o[i] = calloc((size_t)M * Dv + 1, 4);
        m[i] = malloc((size_t)M * 4 + 4);
        l[i] = calloc((size_t)M + 1, 4);
        scratch[i] = malloc((size_t)(kt->attend_scratch > 0 ? kt->attend_scratch : 1) * 4);
        for (int r = 0; r < M; r++)
            m[i][r] = -INFINITY;
    }
    for (size_t i = 0; i < nk; i++)
        kf[i] = (float)(rand() % 4001 - 2000) / 997.0f;
    for (size_t i = 0; i < nv; i++)
        vf[i] = (float)(rand() % 4001 - 2000) / 1999.0f;
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)(rand() % 4001 - 2000) / 1013.0f;
    if (N > 0) {
        kt->narrow_bf16(N, D, kf, ldk, k16, ldk);
        kt->narrow_bf16(N, Dv, vf, ldv, v16, ldv);
        kt->widen_bf16(N, D, k16, ldk, kf, ldk);
        kt->widen_bf16(N, Dv, v16, ldv, vf, ldv);
    }
    kt->narrow_bf16(M, D, q, ldq, q16, ldq); /* bf16 query rows, as the driver passes them */
    kt->widen_bf16(M, D, q16, ldq, q, ldq);
    memcpy(k16c, k16, nk * 2);
    memcpy(v16c, v16, nv * 2);
    memcpy(qc, q, nq * 4);
    const int n1 = split > 0 && split < N ? split : N;
    int d[2];
    for (int i = 0; i < 2; i++) {
        const sdpa_attend_rows16_fn f = i ? kt->attend_rows_bf16_pairs : kt->attend_rows_bf16;
        d[i] = f(M, n1, D, Dv, scale, q, ldq, k16, ldk, v16, ldv, m[i], l[i], o[i], Dv, scratch[i]);
        if (d[i] && n1 < N)
            d[i] = f(M, N - n1, D, Dv, scale, q, ldq, k16 + n1 * ldk, ldk, v16 + n1 * ldv, ldv, m[i], l[i], o[i], Dv,
                     scratch[i]);
    }
    const int takes = D == Dv && D > 0 && D % 32 == 0 && D <= 256 && M >= 1 && M <= kt->attend_max_rows;
    int ok = memcmp(k16, k16c, nk * 2) == 0 && memcmp(v16, v16c, nv * 2) == 0 && memcmp(q, qc, nq * 4) == 0 &&
             d[1] == (takes ? 1 : d[0]);
    if (!ok)
        report("M=%d N=%d D=%d Dv=%d: done %d (attend_rows_bf16 %d), or Q/K/V written", M, N, D, Dv, d[1], d[0]);
    if (ok && !takes && (memcmp(o[0], o[1], (size_t)M * Dv * 4) || memcmp(m[0], m[1], (size_t)M * 4) ||
                         memcmp(l[0], l[1], (size_t)M * 4))) {
        ok = 0;
        report("M=%d N=%d D=%d Dv=%d: a shape it does not take, and not attend_rows_bf16's bits", M, N, D, Dv);
    }
    for (int r = 0; r < M && ok && takes && N > 0; r++) {
        double mx = -INFINITY, sum = 0.0;
        double *sc = malloc((size_t)N * sizeof(double));
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int c = 0; c < D; c++)
                acc += (double)q[(size_t)r * ldq + c] * (double)kf[(size_t)j * ldk + c];
            sc[j] = acc * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int j = 0; j < N; j++)
            sum += exp(sc[j] - mx);
        const double lse = mx + log(sum), got_lse = (double)m[1][r] + log((double)l[1][r]);
        if (!close_to(got_lse, lse, 1e-5 * (fabs(lse) + 1.0))) {
            ok = 0;
            report("M=%d N=%d D=%d: row %d lse %.9g, float64 %.9g", M, N, D, r, got_lse, lse);
        }
        for (int c = 0; c < Dv && ok; c++) {
            double ref = 0.0;
            for (int j = 0; j < N; j++)
                ref += exp(sc[j] - mx) / sum * (double)vf[(size_t)j * ldv + c];
            const double got = (double)o[1][(size_t)r * Dv + c] / (double)l[1][r];
            if (!close_to(got, ref, 1e-5 + 8.0 * (N + D) * FLT_EPSILON)) {
                ok = 0;
                report("M=%d N=%d D=%d split=%d: O(%d,%d) = %.9g, float64 %.9g", M, N, D, split, r, c, got, ref);
            }
        }
        free(sc);
    }
    record(ok);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(m[i]), free(l[i]), free(scratch[i]);
    free(k16), free(v16), free(q16), free(k16c), free(v16c), free(kf), free(vf), free(q), free(qc);
}

static void test_attend_pairs(const sdpa_kernels *kt)
{
    if (!kt->attend_rows_bf16_pairs || !kt->attend_rows_bf16)
        return;
    kernel_begin(kt->name, "attend_rows_bf16_pairs");
    const int mx = kt->attend_max_rows, st = kt->nt_step;
    const int ms[] = {1, 2, 3, 4, 5, 8, mx, mx + 1};
    const int ns[] = {0, 1, 5, st - 1, st, st + 1, 2 * st + 1, 100};
    const int ds[] = {16, 32, 48, 64, 96, 100, 128, 160, 192, 224, 256, 288};
    int combo = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (size_t d = 0; d < sizeof ds / sizeof ds[0]; d++, combo++)
                check_attend_pairs(kt, ms[i], ns[j], ds[d], combo % 9 == 0 ? ds[d] + 32 : ds[d],
                                   combo % 3 ? 0 : ns[j] / 2 + 1);
    kernel_end();
}

static void test_attend16(const sdpa_kernels *kt)
{
    for (int type = SDPA_DTYPE_BF16; type <= SDPA_DTYPE_F16; type++) {
        if (!kt->attend_rows || !(type == SDPA_DTYPE_BF16 ? kt->attend_rows_bf16 : kt->attend_rows_f16))
            continue;
        kernel_begin(kt->name, type == SDPA_DTYPE_BF16 ? "attend_rows_bf16" : "attend_rows_f16");
        const int mx = kt->attend_max_rows, st = kt->nt_step, qfl = kt->attend_max_vecs * kt->vec_floats;
        /* M 4 .. 7 and 8: rows four at a time, then pairs and one (V_ATTEND_QUAD); head_dims of
         * 2 .. 8 vectors, odd counts (uneven halves of O's columns) and partial tails */
        const int ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, mx, mx + 1};
        const int ns[] = {0, 1, 5, st - 1, st, st + 1, 2 * st + 1, 100};
        const int ds[] = {1, 7, 8, 15, 16, 17, 33, 48, 64, 96, 100, 128, 129, qfl / 2 + 1, qfl - 1, qfl, qfl + 1};
        const int vf = kt->vec_floats;
        int combo = 0;
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
                for (size_t d = 0; d < sizeof ds / sizeof ds[0]; d++, combo++) {
                    /* Dv: a vector more (another path), or one less in the same vector count (K's
                     * and V's last vectors partial in different ways), or Dk */
                    const int dk = ds[d];
                    const int dv = combo % 7 == 0 ? dk + vf : combo % 7 == 3 && dk > 1 && dk % vf != 1 ? dk - 1 : dk;
                    check_attend16(kt, type, ms[i], ns[j], dk, dv, combo % 3 ? 0 : ns[j] / 2 + 1);
                }
        kernel_end();
    }
}

/* ------------------------------------------------------------ transpose */

static void check_transpose(const sdpa_kernels *kt, int rows, int cols)
{
    buf src = buf_new(rows, cols, cols + (int)(rnd() % 3) * 3 + (cols == 0));
    buf dst = buf_new(cols, rows, rows + (int)(rnd() % 3) * 5 + (rows == 0));
    buf_fill(&src, -10.0f, 10.0f);
    buf_snap(&src);
    buf_snap(&dst);
    kt->transpose(rows, cols, src.p, src.ld, dst.p, dst.ld);
    int ok = 1;
    const long bad = buf_changed(&src, 0) + buf_changed(&dst, 1);
    if (bad) {
        ok = 0;
        report("rows=%d cols=%d: %ld elements outside the output changed", rows, cols, bad);
    }
    for (int r = 0; r < rows && ok; r++)
        for (int c = 0; c < cols && ok; c++)
            if (float_bits(*at(&dst, c, r)) != float_bits(*at(&src, r, c))) {
                ok = 0;
                report("rows=%d cols=%d: dst(%d,%d) = %.9g, expected %.9g", rows, cols, c, r,
                       (double)*at(&dst, c, r), (double)*at(&src, r, c));
            }
    record(ok);
    buf_free(&src);
    buf_free(&dst);
}

static void test_transpose(const sdpa_kernels *kt)
{
    kernel_begin(kt->name, "transpose");
    for (int i = 0; i < n_sizes; i++)
        for (int j = 0; j < n_sizes; j++)
            check_transpose(kt, sizes[i], sizes[j]);
    check_transpose(kt, 64, 128);
    check_transpose(kt, 128, 64);
    check_transpose(kt, 96, 80);
    kernel_end();
}

/* ------------------------------------------------- attention variants */

/* softcap, alibi_cols, alibi_rows, bwd_softcap over their own sizes: M around the
 * small counts and the block edges, N over every tail of the ISA's vectors (VL - 1,
 * VL, VL + 1, 2 VL + 3, ...); row strides mostly longer than N (padding between
 * rows must keep its bits), every buffer between guard zones. */
static int var_m[12], n_var_m, var_n[20], n_var_n;

static void var_add(int *list, int *n, int cap, int s)
{
    if (s < 0 || *n >= cap)
        return;
    for (int i = 0; i < *n; i++)
        if (list[i] == s)
            return;
    list[(*n)++] = s;
}

static void make_variant_sizes(const sdpa_kernels *kt)
{
    static const int ms[] = {0, 1, 2, 3, 7, 16, 17, 33, 64};
    const int vl = kt->vec_floats;
    const int ns[] = {0, 1, 2, 3, vl - 1, vl, vl + 1, 2 * vl - 1, 2 * vl, 2 * vl + 3, 3 * vl + 1, 4 * vl + 5, 64, 65};
    n_var_m = n_var_n = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        var_add(var_m, &n_var_m, (int)(sizeof var_m / sizeof var_m[0]), ms[i]);
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        var_add(var_n, &n_var_n, (int)(sizeof var_n / sizeof var_n[0]), ns[i]);
}

/* A row stride for N columns: N + 1..9 three times in four, else N (at least 1). */
static ptrdiff_t var_ld(int N)
{
    const int pad = chance(25) ? 0 : 1 + (int)(rnd() % 9);
    return N + pad > 0 ? N + pad : 1;
}

/* The value an element had before the call. */
static float snap_at(const buf *b, int r, int c)
{
    return b->snap[b->off + (size_t)r * (size_t)b->ld + (size_t)c];
}

/* NaN matches NaN (payloads may differ), else the same bits. */
static int same_value(float a, float b)
{
    return (isnan(a) && isnan(b)) || float_bits(a) == float_bits(b);
}

/* --- softcap
 * Tolerances, per element, with u = x / cap rounded to float (the kernels divide, as
 * the scalar kernel does) and t64 = tanh(u) in float64:
 *  The SIMD layers use SLEEF's u35 tanhf (documented maximum error 3.5 ulp: the u10
 *  one cost about as much as the score gemm of a tile, see docs/perf-notes.md); the
 *  scalar table libm's tanhf (glibc: 2 ulp). With T = TANH_ULP (3.5 on the SIMD ISAs,
 *  2 on scalar):
 *  S against cap * t64: T + 1 ulp of the result (tanhf: T; cap * t: 0.5; 0.5 of slack
 *    for measuring in ulps of the product instead of t); against float64
 *    cap * tanh(x / cap) with an exact quotient, 0.5 ulp more (the quotient's rounding
 *    moves tanh by at most tanh'(u) |u| 2^-24 <= |tanh(u)| 2^-24). Plus an absolute
 *    cap * FLT_MIN, where t is below FLT_MIN (denormal ulps are absolute).
 *  G against 1 - t64^2: 2^-23 (2 T t^2 + |G|) absolute (t's T ulp, doubled by the
 *    square, plus the fused 1 - t*t's rounding with room); against the exact quotient,
 *    2^-24 * 2 |t| G |u| more (dG/du = -2 t G).
 *  Against the scalar table (libm's tanhf, then cap*t and an unfused 1 - t*t): the sum
 *    of both sides' bounds, T + 4 ulp for S and 2^-23 ((2 T + 5) t^2 + 2 |G|) for G.
 *  Exact: NaN gives NaN (G too), +-inf gives +-cap bitwise and G = +0, a zero keeps its
 *    sign (tanh is odd) and G = 1. */
static float softcap_input(float cap)
{
    const float sign = chance(50) ? 1.0f : -1.0f;
    switch (rnd() % 24) {
    case 0:
        return sign * INFINITY;
    case 1:
        return NAN;
    case 2:
        return sign * 0.0f;
    case 3: /* large |x|: tanh is 1 in float from |u| ~ 9 on */
        return sign * powf(10.0f, frand(1.0f, 38.0f));
    case 4:
        return sign * FLT_MAX;
    case 5: /* tiny |x|, denormals included */
        return sign * powf(10.0f, frand(-44.0f, -20.0f));
    case 6: /* around the saturation of tanh */
        return sign * cap * frand(7.0f, 10.0f);
    default:
        return frand(-4.0f * cap, 4.0f * cap);
    }
}

static void check_softcap(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N)
{
    static const float caps[] = {0.25f, 1.0f, 5.0f, 30.0f, 50.0f, 1000.0f};
    const float cap = caps[rnd() % (sizeof caps / sizeof caps[0])];
    const int with_g = chance(60);
    buf s = buf_new(M, N, var_ld(N));
    buf g = buf_new(M, N, var_ld(N));
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            *at(&s, m, n) = softcap_input(cap);
            *at(&g, m, n) = NAN; /* must be overwritten without being read */
        }
    buf s2 = buf_clone(&s), g2 = buf_clone(&g);
    buf_snap(&s);
    buf_snap(&g);
    kt->softcap(M, N, s.p, s.ld, cap, with_g ? g.p : NULL, g.ld);
    ref_kt->softcap(M, N, s2.p, s2.ld, cap, with_g ? g2.p : NULL, g2.ld);
    int ok = 1;
    const long bad = buf_changed(&s, 1) + buf_changed(&g, with_g);
    if (bad) {
        ok = 0;
        report("M=%d N=%d cap=%g G=%s: %ld elements outside the output changed", M, N, (double)cap,
               with_g ? "yes" : "NULL", bad);
    }
    const double e = FLT_EPSILON;
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            const float x = snap_at(&s, m, n), got = *at(&s, m, n), sc = *at(&s2, m, n);
            const float gg = with_g ? *at(&g, m, n) : 0.0f, gs = with_g ? *at(&g2, m, n) : 0.0f;
            const float u = x / cap;
            const double T = kt->isa == SDPA_ISA_SCALAR ? 2.0 : 3.5; /* TANH_ULP, see above */
            const double t64 = tanh((double)u), tt = tanh((double)x / (double)cap);
            const double ref = (double)cap * t64, tru = (double)cap * tt;
            const double g64 = 1.0 - t64 * t64, gtru = 1.0 - tt * tt;
            int good_s, good_g = 1;
            if (isnan(x)) {
                good_s = isnan(got) && isnan(sc);
                good_g = !with_g || (isnan(gg) && isnan(gs));
            } else if (isinf(x)) {
                good_s = float_bits(got) == float_bits(copysignf(cap, x)) && same_value(got, sc);
                good_g = !with_g || (float_bits(gg) == 0 && float_bits(gs) == 0);
            } else if (x == 0.0f) {
                good_s = float_bits(got) == float_bits(x) && float_bits(sc) == float_bits(x);
                good_g = !with_g || (gg == 1.0f && gs == 1.0f);
            } else {
                const double floor_s = (double)cap * FLT_MIN;
                good_s = close_to(got, ref, (T + 1.0) * e * fabs(ref) + floor_s) &&
                         close_to(got, tru, (T + 1.5) * e * fabs(tru) + floor_s) &&
                         close_to(got, sc, (T + 4.0) * e * fabs(ref) + floor_s);
                if (with_g) {
                    const double tol = e * (2.0 * T * t64 * t64 + fabs(g64)) + FLT_MIN;
                    good_g = close_to(gg, g64, tol) &&
                             close_to(gg, gtru, tol + 0.5 * e * 2.0 * fabs(tt) * gtru * fabs((double)x / cap)) &&
                             close_to(gg, gs, e * ((2.0 * T + 5.0) * t64 * t64 + 2.0 * fabs(g64)) + FLT_MIN);
                }
            }
            if (!good_s || !good_g) {
                ok = 0;
                report("M=%d N=%d cap=%g: x(%d,%d) = %.9g: S %.9g (float64 %.9g, scalar %.9g), G %.9g (float64 "
                       "%.9g, scalar %.9g)",
                       M, N, (double)cap, m, n, (double)x, (double)got, ref, (double)sc, (double)gg, g64,
                       (double)gs);
            }
        }
    record(ok);
    buf_free(&s);
    buf_free(&g);
    buf_free(&s2);
    buf_free(&g2);
}

static void test_softcap(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "softcap");
    for (int i = 0; i < n_var_m; i++)
        for (int j = 0; j < n_var_n; j++)
            for (int rep = 0; rep < 2; rep++)
                check_softcap(kt, ref_kt, var_m[i], var_n[j]);
    kernel_end();
}

/* --- alibi_cols, alibi_rows
 * S - slope |i - pos| against float64: 2^-23 (|slope d| + |result| / 2) (the
 * difference i - pos is exact for the positions used here, then 1 ulp for the
 * product and half an ulp for the subtraction), and bitwise against the scalar
 * table (the same three roundings in the same order; NaN matches NaN). Positions:
 * negative, fractional (.5) and beyond the tile; slopes 0, -0, negative, tiny and
 * large; scores with -inf (masked) and NaN. */
static float alibi_pos(int extent)
{
    const float base = (float)((int)(rnd() % (unsigned)(2 * extent + 40)) - extent - 20);
    switch (rnd() % 4) {
    case 0:
        return base + 0.5f;
    case 1:
        return -base - 0.5f;
    default:
        return base;
    }
}

static float alibi_slope(void)
{
    switch (rnd() % 10) {
    case 0:
        return 0.0f;
    case 1:
        return -0.0f;
    case 2:
        return -frand(0.0f, 2.0f);
    case 3:
        return 0x1p-8f;
    case 4:
        return 1e6f;
    default:
        return frand(0.0f, 1.0f);
    }
}

static float alibi_score(void)
{
    const int r = (int)(rnd() % 100);
    return r < 10 ? -INFINITY : r < 12 ? NAN : r < 14 ? (chance(50) ? 0.0f : -0.0f) : frand(-20.0f, 20.0f);
}

static void check_alibi(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N, int rows)
{
    const int per = rows ? M : N; /* pos and slope per column (cols) or per row (rows) */
    buf s = buf_new(M, N, var_ld(N));
    buf pos = buf_new(1, per, per > 0 ? per : 1), slope = buf_new(1, per, per > 0 ? per : 1);
    for (int i = 0; i < per; i++) {
        pos.p[i] = alibi_pos(rows ? N : M);
        slope.p[i] = alibi_slope();
    }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            *at(&s, m, n) = alibi_score();
    buf s2 = buf_clone(&s);
    buf_snap(&s);
    buf_snap(&pos);
    buf_snap(&slope);
    if (rows) {
        kt->alibi_rows(M, N, s.p, s.ld, pos.p, slope.p);
        ref_kt->alibi_rows(M, N, s2.p, s2.ld, pos.p, slope.p);
    } else {
        kt->alibi_cols(M, N, s.p, s.ld, pos.p, slope.p);
        ref_kt->alibi_cols(M, N, s2.p, s2.ld, pos.p, slope.p);
    }
    int ok = 1;
    const long bad = buf_changed(&s, 1) + buf_changed(&pos, 0) + buf_changed(&slope, 0);
    if (bad) {
        ok = 0;
        report("M=%d N=%d: %ld elements outside the output changed", M, N, bad);
    }
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            const int i = rows ? n : m, j = rows ? m : n;
            const float x = snap_at(&s, m, n), got = *at(&s, m, n), sc = *at(&s2, m, n);
            const double p = (double)slope.p[j] * fabs((double)i - (double)pos.p[j]);
            const double ref = (double)x - p;
            const double tol = FLT_EPSILON * (fabs(p) + 0.5 * fabs(ref)) + FLT_MIN;
            if (!close_to(got, ref, tol) || !same_value(got, sc)) {
                ok = 0;
                report("M=%d N=%d: S(%d,%d) = %.9g for s=%.9g slope=%.9g pos=%.9g, float64 %.9g, scalar %.9g", M,
                       N, m, n, (double)got, (double)x, (double)slope.p[j], (double)pos.p[j], ref, (double)sc);
            }
        }
    record(ok);
    buf_free(&s);
    buf_free(&pos);
    buf_free(&slope);
    buf_free(&s2);
}

static void test_alibi(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int rows)
{
    kernel_begin(kt->name, rows ? "alibi_rows" : "alibi_cols");
    for (int i = 0; i < n_var_m; i++)
        for (int j = 0; j < n_var_n; j++)
            for (int rep = 0; rep < 2; rep++)
                check_alibi(kt, ref_kt, var_m[i], var_n[j], rows);
    kernel_end();
}

/* --- bwd_softcap
 * dS G + 0: one rounding (the product; + 0 only turns -0 into +0): half an ulp
 * against float64, and bitwise against the scalar table (the same two operations;
 * NaN matches NaN). Exact: the sentinel -0.0 stays -0.0 bitwise whatever G holds
 * there (NaN, Inf, 0), and an allowed entry whose product is zero (a +0 dS, a zero
 * G, an underflow) is +0, never -0. */
static void check_bwd_softcap(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int M, int N)
{
    buf d = buf_new(M, N, var_ld(N));
    buf g = buf_new(M, N, var_ld(N));
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const int r = (int)(rnd() % 100);
            float dv, gv = frand(0.0f, 1.0f);
            if (r < 30) { /* masked: the sentinel, and often a non-finite G behind it */
                dv = -0.0f;
                if (chance(50))
                    gv = bad[rnd() % 3];
            } else if (r < 40) {
                dv = 0.0f;
            } else if (r < 45) { /* products that underflow to +-0 or a denormal */
                dv = (chance(50) ? -1.0f : 1.0f) * powf(10.0f, frand(-45.0f, -30.0f));
                gv = frand(0.0f, 1e-8f);
            } else {
                dv = frand(-3.0f, 3.0f);
                const int q = (int)(rnd() % 100);
                gv = q < 8 ? 0.0f : q < 10 ? -0.0f : q < 12 ? NAN : gv;
            }
            *at(&d, m, n) = dv;
            *at(&g, m, n) = gv;
        }
    buf d2 = buf_clone(&d);
    buf_snap(&d);
    buf_snap(&g);
    kt->bwd_softcap(M, N, d.p, d.ld, g.p, g.ld);
    ref_kt->bwd_softcap(M, N, d2.p, d2.ld, g.p, g.ld);
    int ok = 1;
    const long nbad = buf_changed(&d, 1) + buf_changed(&g, 0);
    if (nbad) {
        ok = 0;
        report("M=%d N=%d: %ld elements outside the output changed", M, N, nbad);
    }
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            const float x = snap_at(&d, m, n), gv = *at(&g, m, n), got = *at(&d, m, n), sc = *at(&d2, m, n);
            const double ref = (double)x * (double)gv;
            int good;
            if (float_bits(x) == 0x80000000u) /* the sentinel, whatever G holds */
                good = float_bits(got) == 0x80000000u && float_bits(sc) == 0x80000000u;
            else if (isnan(ref))
                good = isnan(got) && isnan(sc);
            else if (fabs(ref) < FLT_MIN) /* zero or below the normals: +0 or a tiny value, never -0 */
                good = !(got == 0.0f && signbit(got)) && fabs((double)got) < FLT_MIN && same_value(got, sc);
            else
                good = close_to(got, ref, 0.5 * FLT_EPSILON * fabs(ref)) && same_value(got, sc);
            if (!good) {
                ok = 0;
                report("M=%d N=%d: dS(%d,%d) = %.9g (bits %08x) for dS=%.9g G=%.9g, float64 %.9g, scalar %.9g", M,
                       N, m, n, (double)got, (unsigned)float_bits(got), (double)x, (double)gv, ref, (double)sc);
            }
        }
    record(ok);
    buf_free(&d);
    buf_free(&g);
    buf_free(&d2);
}

static void test_bwd_softcap(const sdpa_kernels *kt, const sdpa_kernels *ref_kt)
{
    kernel_begin(kt->name, "bwd_softcap");
    for (int i = 0; i < n_var_m; i++)
        for (int j = 0; j < n_var_n; j++)
            for (int rep = 0; rep < 2; rep++)
                check_bwd_softcap(kt, ref_kt, var_m[i], var_n[j]);
    kernel_end();
}

/* ------------------------------------------ 16-bit storage (bf16, fp16) */

/* widen_bf16, widen_f16, narrow_bf16, narrow_f16: every ISA's bits against the
 * scalar table's (the definitions of src/dtype.h), bit for bit, NaN payloads
 * included, over 0..3 rows of every column count 0 .. 3 VL + 1 (every tail) and
 * some longer rows, with row strides mostly longer than the rows on both sides.
 * The widenings see every one of the 2^16 patterns (a counter runs through them
 * across the calls, and one call takes them all at once); the narrowings random
 * fp32 bits and crafted inputs (ties of both formats and their neighbours, fp32
 * denormals, the fp16 subnormal range and its boundaries, 65504 / 65520, FLT_MAX,
 * inf, NaNs with payloads, -0), plus one call per format over every fp32 upper
 * part (bf16: 16 bits, fp16: 19 bits) with the lower bits that decide its
 * rounding (0, tie - 1, tie, tie + 1, all ones, random). Guard zones around every
 * buffer and the padding between rows must keep their bits, and so must the
 * inputs. Checks that do not lean on the scalar table: widen_bf16 is the pattern
 * shifted left 16, widen_f16 the value of the fp16 fields (exact in double; a NaN
 * keeps its sign and payload, quiet), and the ISA's own narrowing of a widened
 * pattern gives the pattern back (quieted, for a NaN). */

#define CANARY16 0xa5a5u

typedef struct hbuf {
    uint16_t *mem, *snap, *p;
    size_t total, off;
    int rows, cols;
    ptrdiff_t ld;
} hbuf;

static hbuf hbuf_new(int rows, int cols, ptrdiff_t ld)
{
    hbuf b;
    const size_t extent = (rows > 0 && cols > 0) ? (size_t)(rows - 1) * (size_t)ld + (size_t)cols : 0;
    tail_guard_toggle ^= 1; /* as buf_new: every other buffer ends at its last element */
    b.off = GUARD;
    b.total = GUARD + extent + (tail_guard_toggle ? GUARD : 0);
    b.mem = malloc(b.total * sizeof(uint16_t));
    b.snap = malloc(b.total * sizeof(uint16_t));
    if (!b.mem || !b.snap) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < b.total; i++)
        b.mem[i] = CANARY16;
    b.p = b.mem + b.off;
    b.rows = rows;
    b.cols = cols;
    b.ld = ld;
    return b;
}

static void hbuf_free(hbuf *b)
{
    free(b->mem);
    free(b->snap);
}

static uint16_t *hat(const hbuf *b, int r, int c)
{
    return b->p + (ptrdiff_t)r * b->ld + c;
}

static void hbuf_snap(hbuf *b)
{
    memcpy(b->snap, b->mem, b->total * sizeof(uint16_t));
}

static hbuf hbuf_clone(const hbuf *src)
{
    hbuf b = *src;
    b.mem = malloc(b.total * sizeof(uint16_t));
    b.snap = malloc(b.total * sizeof(uint16_t));
    if (!b.mem || !b.snap) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    memcpy(b.mem, src->mem, b.total * sizeof(uint16_t));
    b.p = b.mem + b.off;
    return b;
}

/* As buf_changed, for 16-bit elements. */
static long hbuf_changed(const hbuf *b, int logical_may_change)
{
    long bad = 0;
    for (size_t i = 0; i < b->total; i++) {
        if (logical_may_change && i >= b->off) {
            const size_t j = i - b->off;
            const size_t r = j / (size_t)b->ld, c = j % (size_t)b->ld;
            if ((int)r < b->rows && (int)c < b->cols)
                continue;
        }
        if (b->mem[i] != b->snap[i])
            bad++;
    }
    return bad;
}

enum { CVT_WIDEN_BF16, CVT_WIDEN_F16, CVT_NARROW_BF16, CVT_NARROW_F16 };
static const char *const cvt_names[] = {"widen_bf16", "widen_f16", "narrow_bf16", "narrow_f16"};

static sdpa_widen_rows_fn widen_fn(const sdpa_kernels *kt, int f16)
{
    return f16 ? kt->widen_f16 : kt->widen_bf16;
}

static sdpa_narrow_rows_fn narrow_fn(const sdpa_kernels *kt, int f16)
{
    return f16 ? kt->narrow_f16 : kt->narrow_bf16;
}

static unsigned widen_counter; /* the next of the 2^16 patterns the widenings see */

static uint16_t widen_input(void)
{
    return chance(25) ? (uint16_t)rnd() : (uint16_t)(widen_counter++ & 0xffffu);
}

/* What the widening of h must give, from the format's fields alone. */
static int widen_ok(int f16, uint16_t h, float got)
{
    const uint32_t g = float_bits(got);
    if (!f16)
        return g == (uint32_t)h << 16;
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if ((g >> 31) != (uint32_t)(h >> 15))
        return 0;
    if (e == 0x1f && m) /* NaN: quiet, the payload in the top fraction bits */
        return isnan(got) && (g & 0x7fffffu) == (((uint32_t)m << 13) | 0x400000u);
    const double mag = e == 0x1f ? INFINITY : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return fabs((double)got) == mag;
}

/* The pattern narrowing a widened h must give back: h, or h quieted for a NaN. */
static uint16_t round_trip(int f16, uint16_t h)
{
    if (!f16)
        return (h & 0x7fffu) > 0x7f80u ? (uint16_t)(h | 0x0040u) : h;
    return (h & 0x7fffu) > 0x7c00u ? (uint16_t)(h | 0x0200u) : h;
}

static void check_widen(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int f16, int rows, int cols,
                        ptrdiff_t lds, ptrdiff_t ldd, int every_pattern)
{
    hbuf src = hbuf_new(rows, cols, lds);
    buf dst = buf_new(rows, cols, ldd);
    unsigned k = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            *hat(&src, r, c) = every_pattern ? (uint16_t)(k++ & 0xffffu) : widen_input();
    buf dst2 = buf_clone(&dst);
    hbuf_snap(&src);
    buf_snap(&dst);
    widen_fn(kt, f16)(rows, cols, src.p, src.ld, dst.p, dst.ld);
    widen_fn(ref_kt, f16)(rows, cols, src.p, src.ld, dst2.p, dst2.ld);
    int ok = 1;
    const long bad = hbuf_changed(&src, 0) + buf_changed(&dst, 1);
    if (bad) {
        ok = 0;
        report("rows=%d cols=%d lds=%td ldd=%td: %ld elements outside the output changed", rows, cols, lds, ldd,
               bad);
    }
    for (int r = 0; r < rows && ok; r++)
        for (int c = 0; c < cols && ok; c++) {
            const uint16_t h = *hat(&src, r, c);
            const float got = *at(&dst, r, c), sc = *at(&dst2, r, c);
            if (float_bits(got) != float_bits(sc) || !widen_ok(f16, h, got)) {
                ok = 0;
                report("rows=%d cols=%d lds=%td ldd=%td: (%d,%d) %04x -> %08x, scalar %08x", rows, cols, lds, ldd,
                       r, c, (unsigned)h, (unsigned)float_bits(got), (unsigned)float_bits(sc));
            }
        }
    /* back through the ISA's own narrowing (into a fresh buffer of the source's layout) */
    if (ok && rows > 0 && cols > 0) {
        hbuf back = hbuf_new(rows, cols, lds);
        hbuf_snap(&back);
        narrow_fn(kt, f16)(rows, cols, dst.p, dst.ld, back.p, back.ld);
        if (hbuf_changed(&back, 1)) {
            ok = 0;
            report("rows=%d cols=%d: the narrowing back wrote outside its output", rows, cols);
        }
        for (int r = 0; r < rows && ok; r++)
            for (int c = 0; c < cols && ok; c++) {
                const uint16_t h = *hat(&src, r, c), b = *hat(&back, r, c);
                if (b != round_trip(f16, h)) {
                    ok = 0;
                    report("rows=%d cols=%d: (%d,%d) %04x widened and narrowed gives %04x, expected %04x", rows,
                           cols, r, c, (unsigned)h, (unsigned)b, (unsigned)round_trip(f16, h));
                }
            }
        hbuf_free(&back);
    }
    record(ok);
    hbuf_free(&src);
    buf_free(&dst);
    buf_free(&dst2);
}

/* Crafted fp32 inputs for the narrowings, as bit patterns. */
static uint32_t narrow_input(void)
{
    static const uint32_t special[] = {
        0x00000000u, 0x00000001u, 0x00007fffu, 0x00008000u, 0x00008001u, 0x00018000u, /* zero, denormals: */
        0x007f8000u, 0x007fffffu, 0x00800000u, /* bf16 ties among them; FLT_MIN */
        0x32ffffffu, 0x33000000u, 0x33000001u, /* around 2^-25: the tie between 0 and fp16's smallest */
        0x337fffffu, 0x33800000u, 0x33a00000u, 0x33c00000u, 0x33e00000u, /* 2^-24 and 1.25, 1.5, 1.75 2^-24 */
        0x387fc000u, 0x387fdfffu, 0x387fe000u, 0x387fe001u, 0x387ff000u, 0x387fffffu, /* up to 2^-14 */
        0x38800000u, 0x38800fffu, 0x38801000u, 0x38801001u, 0x38803000u, /* fp16's smallest normal */
        0x3f800000u, 0x3f801000u, 0x3f803000u, 0x3f808000u, 0x3f818000u, /* 1 and ties above it */
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, /* 65504, 65520, 65536 */
        0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x7f800000u, /* bf16's largest, FLT_MAX, inf */
        0x7f800001u, 0x7f801fffu, 0x7f802000u, 0x7f80ffffu, 0x7f810000u, 0x7fa00000u, /* NaNs: signalling, */
        0x7fbfffffu, 0x7fc00000u, 0x7fc00001u, 0x7fe5a5a5u, 0x7fffffffu, /* payloads kept or cut, quiet */
    };
    const uint32_t sign = rnd() & 0x80000000u;
    const int r = (int)(rnd() % 100);
    if (r < 35) /* any bits */
        return rnd();
    if (r < 55)
        return sign | special[rnd() % (sizeof special / sizeof special[0])];
    if (r < 65) /* bf16 ties and their neighbours, any exponent */
        return (rnd() & 0xffff0000u) | (0x7fffu + rnd() % 3);
    if (r < 78) /* fp16 normal range (2^-14 .. 2^15): ties and their neighbours */
        return sign | (113u + rnd() % 30) << 23 | (rnd() & 0x7fe000u) | (0x0fffu + rnd() % 3);
    if (r < 88) { /* fp16 subnormal range: k 2^-25 (k odd: a tie) and its neighbours */
        const uint32_t u = float_bits((float)(rnd() % 2049) * 0x1p-25f);
        return sign | (u ? u + rnd() % 3 - 1 : u);
    }
    if (r < 94) /* NaN, any payload */
        return sign | 0x7f800000u | (1u + rnd() % 0x7fffffu);
    return sign | (rnd() & 0x007fffffu) >> (rnd() % 23); /* fp32 denormals */
}

/* sweep: the input is row r's lower bits under column c's upper part (see above). */
static void check_narrow(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int f16, int rows, int cols,
                         ptrdiff_t lds, ptrdiff_t ldd, int sweep)
{
    buf src = buf_new(rows, cols, lds);
    hbuf dst = hbuf_new(rows, cols, ldd);
    const int low_bits = f16 ? 13 : 16;
    const uint32_t tie = 1u << (low_bits - 1), low_mask = (1u << low_bits) - 1u;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const uint32_t lows[] = {0, tie - 1, tie, tie + 1, low_mask, rnd() & low_mask};
            *at(&src, r, c) = bits_float(sweep ? (uint32_t)c << low_bits | lows[r % 6] : narrow_input());
        }
    hbuf dst2 = hbuf_clone(&dst);
    buf_snap(&src);
    hbuf_snap(&dst);
    narrow_fn(kt, f16)(rows, cols, src.p, src.ld, dst.p, dst.ld);
    narrow_fn(ref_kt, f16)(rows, cols, src.p, src.ld, dst2.p, dst2.ld);
    int ok = 1;
    const long bad = buf_changed(&src, 0) + hbuf_changed(&dst, 1);
    if (bad) {
        ok = 0;
        report("rows=%d cols=%d lds=%td ldd=%td: %ld elements outside the output changed", rows, cols, lds, ldd,
               bad);
    }
    for (int r = 0; r < rows && ok; r++)
        for (int c = 0; c < cols && ok; c++) {
            const uint16_t got = *hat(&dst, r, c), sc = *hat(&dst2, r, c);
            if (got != sc) {
                ok = 0;
                report("rows=%d cols=%d lds=%td ldd=%td: (%d,%d) %08x (%.9g) -> %04x, scalar %04x", rows, cols, lds,
                       ldd, r, c, (unsigned)float_bits(*at(&src, r, c)), (double)*at(&src, r, c), (unsigned)got,
                       (unsigned)sc);
            }
        }
    record(ok);
    buf_free(&src);
    hbuf_free(&dst);
    hbuf_free(&dst2);
}

/* A row stride for cols elements: cols + 1..9 or + 37 mostly, else cols (at least 1). */
static ptrdiff_t cvt_ld(int cols)
{
    const int q = (int)(rnd() % 8);
    const int pad = q < 2 ? 0 : q < 7 ? 1 + (int)(rnd() % 9) : 37;
    return cols + pad > 0 ? cols + pad : 1;
}

static void test_cvt(const sdpa_kernels *kt, const sdpa_kernels *ref_kt, int which)
{
    const int narrow = which >= CVT_NARROW_BF16, f16 = which == CVT_WIDEN_F16 || which == CVT_NARROW_F16;
    const int vl = kt->vec_floats;
    kernel_begin(kt->name, cvt_names[which]);
    int cols_list[64], n_cols = 0;
    for (int c = 0; c <= 3 * vl + 1; c++)
        var_add(cols_list, &n_cols, 64, c);
    const int longer[] = {4 * vl + 5, 63, 64, 65, 127, 200};
    for (size_t i = 0; i < sizeof longer / sizeof longer[0]; i++)
        var_add(cols_list, &n_cols, 64, longer[i]);
    for (int rows = 0; rows <= 3; rows++)
        for (int i = 0; i < n_cols; i++)
            for (int rep = 0; rep < 3; rep++) {
                const int cols = cols_list[i];
                const ptrdiff_t lds = cvt_ld(cols), ldd = cvt_ld(cols);
                if (narrow)
                    check_narrow(kt, ref_kt, f16, rows, cols, lds, ldd, 0);
                else
                    check_widen(kt, ref_kt, f16, rows, cols, lds, ldd, 0);
            }
    if (narrow) /* every upper part, with a tail: 6 rows of 2^16 (bf16) or 2^19 (fp16) + 3 */
        check_narrow(kt, ref_kt, f16, 6, (1 << (f16 ? 19 : 16)) + 3, (1 << (f16 ? 19 : 16)) + 8,
                     (1 << (f16 ? 19 : 16)) + 5, 1);
    else /* every pattern in one call: 2 rows of 2^15, and again as 3 rows with a tail */
        for (int rep = 0; rep < 2; rep++) {
            const int rows = rep ? 3 : 2, cols = rep ? 21847 : 32768;
            check_widen(kt, ref_kt, f16, rows, cols, cols + 5, cols + 3, 1);
        }
    kernel_end();
}

/* ---------------------------------------------------------------- bench */

/* --bench: each kernel of each ISA on one fixed, representative shape (a score
 * tile of the forward, a decode step), the same shape for every ISA, so that
 * the figures compare ISAs and are reproducible from the tree. The in-place
 * kernels (the softmaxes, bwd_probs, bwd_dscores) run on their own output
 * after the first call; their cost does not depend on the values (no
 * denormals: exp flushes them). */

#define BENCH_BQ 64   /* query columns of a score tile */
#define BENCH_BK 128  /* keys of a score tile */
#define BENCH_D 128   /* head_dim of the products */
#define BENCH_DQ 4    /* query rows of a decode step (GQA group) */
#define BENCH_DK 256  /* keys of a decode step */
#define BENCH_DA 64   /* head_dim of attend_rows (every ISA takes it in registers) */
#define BENCH_PQ 128  /* query columns of a bf16 pair-product tile (amx's pairs_block_q) */
#define BENCH_PK 128  /* its keys */
#define BENCH_FLOATS (256 * 256)

typedef struct bench_bufs {
    float *a, *b, *c, *v1, *v2, *v3, *scratch, *g;
    uint16_t *h; /* bf16 / fp16 bits for the widenings, the narrowings' output */
} bench_bufs;

static void bench_fill(bench_bufs *w)
{
    for (int i = 0; i < BENCH_FLOATS; i++) {
        w->a[i] = frand(-1.0f, 1.0f);
        w->b[i] = frand(-1.0f, 1.0f);
        w->c[i] = frand(0.0f, 1.0f);
        w->g[i] = chance(50) ? 1.0f : -1.0f; /* bwd_softcap's G: dS keeps its magnitude call after call */
        w->h[i] = (uint16_t)(0x3c00u | (rnd() & 0x83ffu)); /* +-[1, 2) in both formats */
    }
    for (int i = 0; i < 256; i++) {
        w->v1[i] = -INFINITY; /* m: a first tile */
        w->v2[i] = 0.0f;      /* l */
        w->v3[i] = 2.0f;      /* alpha, lse, D */
    }
}

/* One call of a kernel on its bench shape; returns 0 when the ISA does not take it.
 * variant: softcap with G (1) or without (0); gemm: the P V product (1) or the scores (0). */
static int bench_call(const sdpa_kernels *kt, const char *name, int variant, bench_bufs *w)
{
    if (!strcmp(name, "gemm") && variant) /* O (+)= P V: A = P^T (keys x queries) read down its columns */
        kt->gemm(BENCH_BQ, BENCH_D, BENCH_BK, 1.0f, w->a, 1, BENCH_BQ, w->b, BENCH_D, w->c, BENCH_D, SDPA_GEMM_ACCUMULATE,
                 w->v3);
    else if (!strcmp(name, "gemm")) /* Q^T and S^T rows 80 floats apart, as avx2's tile_pad makes them (at 64 the
                                        16-column blocks evict their own panel: avx2 88-112 GFLOP/s instead of 110-114) */
        kt->gemm(BENCH_BK, BENCH_BQ, BENCH_D, 1.0f, w->a, BENCH_D, 1, w->b, BENCH_BQ + 16, w->c, BENCH_BQ + 16, 0, NULL);
    else if (!strcmp(name, "online_softmax"))
        kt->online_softmax(BENCH_BK, BENCH_BQ, w->c, BENCH_BQ, w->v1, w->v2, w->v3);
    else if (!strcmp(name, "online_softmax_rows"))
        kt->online_softmax_rows(BENCH_DQ, BENCH_DK, w->c, BENCH_DK, w->v1, w->v2, w->v3);
    else if (!strcmp(name, "scale_rows"))
        kt->scale_rows(BENCH_BQ, BENCH_D, w->a, BENCH_D, w->v3, w->c, BENCH_D);
    else if (!strcmp(name, "bwd_probs"))
        kt->bwd_probs(BENCH_BK, BENCH_BQ, w->c, BENCH_BQ, w->v3);
    else if (!strcmp(name, "bwd_dscores"))
        kt->bwd_dscores(BENCH_BK, BENCH_BQ, w->a, BENCH_BQ, w->c, BENCH_BQ, w->v3);
    else if (!strcmp(name, "transpose"))
        kt->transpose(BENCH_BK, BENCH_BQ, w->a, BENCH_BQ, w->c, BENCH_BK);
    else if (!strcmp(name, "gemm_nt"))
        kt->gemm_nt(BENCH_DQ, BENCH_DK, BENCH_D, 1.0f, w->a, BENCH_D, w->b, BENCH_D, w->c, BENCH_DK, 1);
    else if (!strcmp(name, "gemm_stream"))
        kt->gemm_stream(BENCH_DQ, BENCH_D, BENCH_DK, w->a, BENCH_DK, w->b, BENCH_D, w->c, BENCH_D, 0, NULL);
    else if (!strcmp(name, "attend_rows"))
        return kt->attend_rows && kt->attend_rows(BENCH_DQ, BENCH_DK, BENCH_DA, BENCH_DA, 0.125f, w->a, BENCH_DA, w->b,
                                                  BENCH_DA, w->b + BENCH_DK * BENCH_DA, BENCH_DA, w->v1, w->v2,
                                                  w->c, BENCH_DA, w->scratch);
    else if (!strcmp(name, "softcap"))
        kt->softcap(BENCH_BK, BENCH_BQ, w->c, BENCH_BQ, 30.0f, variant ? w->b : NULL, BENCH_BQ);
    else if (!strcmp(name, "alibi_cols"))
        kt->alibi_cols(BENCH_BK, BENCH_BQ, w->c, BENCH_BQ, w->v2, w->v3);
    else if (!strcmp(name, "alibi_rows"))
        kt->alibi_rows(BENCH_DQ, BENCH_DK, w->c, BENCH_DK, w->v2, w->v3);
    else if (!strcmp(name, "bwd_softcap"))
        kt->bwd_softcap(BENCH_BK, BENCH_BQ, w->a, BENCH_BQ, w->g, BENCH_BQ);
    else if (!strcmp(name, "widen_bf16") || !strcmp(name, "widen_f16"))
        (name[6] == 'f' ? kt->widen_f16 : kt->widen_bf16)(BENCH_BK, BENCH_D, w->h, BENCH_D, w->c, BENCH_D);
    else if (!strcmp(name, "narrow_bf16") || !strcmp(name, "narrow_f16"))
        (name[7] == 'f' ? kt->narrow_f16 : kt->narrow_bf16)(BENCH_BK, BENCH_D, w->a, BENCH_D, w->h, BENCH_D);
    else if (!strcmp(name, "gemm_bf16_pairs") && !kt->gemm_bf16_pairs)
        return 0;
    else if (!strcmp(name, "gemm_bf16_pairs") && variant == 1) /* O (+)= P V: A = P^T's pairs down its columns (the
                                                              softmax's layout), B = V's key pairs */
        kt->gemm_bf16_pairs(BENCH_PQ, BENCH_D, BENCH_PK / 2, 1.0f, w->h, 2, 2 * BENCH_PQ,
                            (const uint32_t *)(const void *)(w->h + BENCH_PK * BENCH_D), BENCH_D, w->c, BENCH_D,
                            SDPA_GEMM_ACCUMULATE, w->v3);
    else if (!strcmp(name, "gemm_bf16_pairs") && variant == 2) /* the same, P in rows (online_softmax_pairs_rows) */
        kt->gemm_bf16_pairs(BENCH_PQ, BENCH_D, BENCH_PK / 2, 1.0f, w->h, BENCH_PK, 2,
                            (const uint32_t *)(const void *)(w->h + BENCH_PK * BENCH_D), BENCH_D, w->c, BENCH_D,
                            SDPA_GEMM_ACCUMULATE, w->v3);
    else if (!strcmp(name, "gemm_bf16_pairs")) /* S^T = K Q^T: A = bf16 K rows in place, B = Q^T's pairs */
        kt->gemm_bf16_pairs(BENCH_PK, BENCH_PQ, BENCH_D / 2, 0.125f, w->h, BENCH_D, 2,
                            (const uint32_t *)(const void *)(w->h + BENCH_PK * BENCH_D), BENCH_PQ, w->c, BENCH_PQ, 0,
                            NULL);
    else if (!strcmp(name, "online_softmax_pairs_rows") && !kt->online_softmax_pairs_rows)
        return 0;
    else if (!strcmp(name, "online_softmax_pairs_rows"))
        kt->online_softmax_pairs_rows(BENCH_PK, BENCH_PQ, w->a, BENCH_PQ, 0.125f, w->v1, w->v2, w->v3,
                                      (uint32_t *)(void *)w->scratch, BENCH_PK / 2);
    else if (!strcmp(name, "online_softmax_pairs") && !kt->online_softmax_pairs)
        return 0;
    else if (!strcmp(name, "online_softmax_pairs")) /* S^T read, P^T's pairs written apart (S stays the same) */
        kt->online_softmax_pairs(BENCH_PK, BENCH_PQ, w->a, BENCH_PQ, 0.125f, w->v1, w->v2, w->v3,
                                 (uint32_t *)(void *)w->scratch, BENCH_PQ);
    return 1;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ns per call: the best of 5 batches of about 2 ms each (after a warm-up), or
 * -1 when the ISA does not take the shape. */
static double bench_time(const sdpa_kernels *kt, const char *name, int variant, bench_bufs *w)
{
    bench_fill(w);
    if (!bench_call(kt, name, variant, w))
        return -1.0;
    double t0 = now_ns();
    long n = 1;
    while (now_ns() - t0 < 2e5) { /* warm-up and calibration: 0.2 ms */
        bench_call(kt, name, variant, w);
        n++;
    }
    n = (long)(n * 10.0) + 1; /* about 2 ms per batch */
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            bench_call(kt, name, variant, w);
        const double t = (now_ns() - t0) / (double)n;
        best = t < best ? t : best;
    }
    return best;
}

typedef struct bench_case {
    const char *name, *shape;
    double flops; /* per call; 0: not a product */
    int variant;  /* softcap: 1 with G */
} bench_case;

static const bench_case bench_cases[] = {
    {"gemm", "128x64x128 (S^T tile)", 2.0 * BENCH_BK * BENCH_BQ * BENCH_D, 0},
    {"gemm", "64x128x128 (O += P V)", 2.0 * BENCH_BQ * BENCH_D * BENCH_BK, 1},
    {"online_softmax", "128x64", 0, 0},
    {"online_softmax_rows", "4x256", 0, 0},
    {"scale_rows", "64x128", 0, 0},
    {"bwd_probs", "128x64", 0, 0},
    {"bwd_dscores", "128x64", 0, 0},
    {"transpose", "128x64", 0, 0},
    {"gemm_nt", "4x256x128 (decode S)", 2.0 * BENCH_DQ * BENCH_DK * BENCH_D, 0},
    {"gemm_stream", "4x128x256 (decode PV)", 2.0 * BENCH_DQ * BENCH_D * BENCH_DK, 0},
    {"attend_rows", "4x256 D=64 (decode)", 2.0 * BENCH_DQ * BENCH_DK * (2 * BENCH_DA), 0},
    {"softcap", "128x64 cap=30", 0, 0},
    {"softcap", "128x64 cap=30 +G", 0, 1},
    {"alibi_cols", "128x64", 0, 0},
    {"alibi_rows", "4x256", 0, 0},
    {"bwd_softcap", "128x64", 0, 0},
    {"widen_bf16", "128x128", 0, 0},
    {"widen_f16", "128x128", 0, 0},
    {"narrow_bf16", "128x128", 0, 0},
    {"narrow_f16", "128x128", 0, 0},
    {"gemm_bf16_pairs", "128x128x64p (S^T tile)", 2.0 * BENCH_PK * BENCH_PQ * BENCH_D, 0},
    {"gemm_bf16_pairs", "128x128x64p (O += P V)", 2.0 * BENCH_PQ * BENCH_D * BENCH_PK, 1},
    {"gemm_bf16_pairs", "128x128x64p (O += P V, P rows)", 2.0 * BENCH_PQ * BENCH_D * BENCH_PK, 2},
    {"online_softmax_pairs", "128x128", 0, 0},
    {"online_softmax_pairs_rows", "128x128", 0, 0},
};

/* ----------------------------------------------------------------- main */

static const char *test_pattern; /* --test=NAME: only the kernels whose name matches */

static int selected(const char *kernel)
{
    return !test_pattern || fnmatch(test_pattern, kernel, 0) == 0;
}

static void usage(const char *argv0)
{
    printf("usage: %s [--test=NAME] [--bench] [--help] [seed]\n"
           "  checks every kernel of every ISA compiled in and supported here against float64\n"
           "  and the scalar table, and ends with \"N passed, N failed\" (exit 1 on a failure)\n"
           "  --test=NAME  only the kernels whose name matches NAME (a shell pattern: gemm,\n"
           "               online_softmax, 'gemm*', ...); kernels: gemm online_softmax\n"
           "               online_softmax_rows scale_rows bwd_probs bwd_dscores transpose gemm_nt\n"
           "               gemm_stream attend_rows softcap alibi_cols alibi_rows bwd_softcap\n"
           "               widen_bf16 widen_f16 narrow_bf16 narrow_f16 gemm_bf16_pairs pack_pairs_f32\n"
           "               pack_pairs_bf16 transpose_pairs round_rows_bf16 online_softmax_pairs\n"
           "               online_softmax_pairs_rows bwd_dscores_pairs dot_pairs_cols\n"
           "               attend_rows_bf16_pairs (the last ten where the ISA has them: AVX512_BF16,\n"
           "               AMX, Arm BF16; dot_pairs_cols not on AMX; online_softmax_pairs_rows on AMX\n"
           "               only; attend_rows_bf16_pairs on AVX-512 with AVX512_BF16 only)\n"
           "  --bench      no checks: time each (selected) kernel per ISA on one fixed shape and\n"
           "               print ns/call, GFLOP/s for the products, and the speed-up over scalar\n"
           "  --help       this text\n"
           "  seed         seeds the random inputs of the checks (default: a fixed seed)\n",
           argv0);
}

static void run_bench(void)
{
    static const sdpa_isa isas[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_AMX, SDPA_ISA_NEON};
    bench_bufs w;
    float **all[] = {&w.a, &w.b, &w.c, &w.v1, &w.v2, &w.v3, &w.scratch, &w.g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        *all[i] = aligned_alloc(64, BENCH_FLOATS * sizeof(float));
        if (!*all[i]) {
            fprintf(stderr, "checkasm: out of memory\n");
            exit(2);
        }
    }
    w.h = aligned_alloc(64, BENCH_FLOATS * sizeof(uint16_t));
    if (!w.h) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    printf("checkasm --bench: CPU features: %s\n", sdpa_cpu_features());
    printf("one thread, best of 5 batches of ~2 ms per kernel and ISA; the same shape for every ISA\n");
    printf("%-20s %-22s %-7s %12s %9s %9s\n", "kernel", "shape", "isa", "ns/call", "GFLOP/s", "vs scalar");
    for (size_t k = 0; k < sizeof bench_cases / sizeof bench_cases[0]; k++) {
        const bench_case *bc = &bench_cases[k];
        if (!selected(bc->name))
            continue;
        double t_scalar = -1.0;
        for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
            const sdpa_kernels *kt = sdpa_isa_supported(isas[i]) ? sdpa_kernels_get(isas[i]) : NULL;
            /* amx's table is avx512's but for the tile products: only those */
            if (!kt || (isas[i] == SDPA_ISA_AMX && strcmp(bc->name, "gemm_bf16_pairs") &&
                        strcmp(bc->name, "online_softmax_pairs_rows")))
                continue;
            if (kt->tiles_begin)
                kt->tiles_begin(); /* the driver's bracket (kernels.h) */
            const double t = bench_time(kt, bc->name, bc->variant, &w);
            if (kt->tiles_end)
                kt->tiles_end();
            if (isas[i] == SDPA_ISA_SCALAR)
                t_scalar = t;
            if (t < 0) {
                printf("%-20s %-22s %-7s %12s\n", bc->name, bc->shape, kt->name, "not taken");
                continue;
            }
            char gf[32] = "-", sp[32] = "-";
            if (bc->flops > 0)
                snprintf(gf, sizeof gf, "%.2f", bc->flops / t);
            if (t_scalar > 0)
                snprintf(sp, sizeof sp, "%.2fx", t_scalar / t);
            printf("%-20s %-22s %-7s %12.1f %9s %9s\n", bc->name, bc->shape, kt->name, t, gf, sp);
        }
    }
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(*all[i]);
    free(w.h);
}

/* ------------------------------------------------------ bf16 pair products */

/* gemm_bf16_pairs, pack_pairs_f32, pack_pairs_bf16 (AVX-512 with AVX512_BF16, amx, NEON
 * with BFDOT): the products against a float64 loop over the same bf16 values (each pair's
 * two products are exact in fp32, so only the fp32 additions may differ: at most
 * 2P + 2 roundings of the running sum, each within 1 ulp, FLT_EPSILON of the magnitude,
 * whether to nearest even or, BFDOT's, to odd), both A layouts the driver uses (K rows:
 * pairs along the row; packed P^T: pairs down a column), with and without
 * accumulation and row scale, over every tail of the 4 x 64 register block; C's
 * guards and padding keep their bits. The packs against their definitions, bit for
 * bit: bf16 round to nearest even (ties crafted), NaN stays NaN, inf and -0 as they
 * are, a missing odd row 0, the finiteness flag. (bf16 subnormals are not drawn: the
 * instructions count them as zero, kernels.h.) */
static uint16_t bf16_rne(float x)
{
    uint32_t u = float_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu))
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_value(uint16_t h)
{
    return bits_float((uint32_t)h << 16);
}

/* A random bf16 with a normal exponent. */
static uint16_t rand_bf16(void)
{
    return bf16_rne(frand(-2.0f, 2.0f) + (chance(50) ? 0.0f : 0.001f));
}

static void check_pairs_gemm(const sdpa_kernels *kt, int M, int N, int P, int layout, int flags, int row_scale,
                             float alpha)
{
    const ptrdiff_t ldb = N + (layout ? 3 : 0), ldc = N + (layout ? 0 : 5);
    /* layout 0: A pair (m,p) at A + m*rs + 2p (rs = 2P + 6); layout 1: at A + 2m + p*cs (cs = 2M + 4) */
    const ptrdiff_t rs = layout ? 2 : 2 * (ptrdiff_t)P + 6, cs = layout ? 2 * (ptrdiff_t)M + 4 : 2;
    const size_t na = M > 0 && P > 0 ? (size_t)((M - 1) * rs + (P - 1) * cs + 2) : 1;
    const size_t nb = P > 0 && N > 0 ? (size_t)((P - 1) * ldb + N) : 1;
    uint16_t *A = malloc(na * sizeof *A);
    uint32_t *B = malloc(nb * sizeof *B);
    float *scale = malloc((size_t)(M > 0 ? M : 1) * sizeof *scale);
    if (!A || !B || !scale) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < na; i++)
        A[i] = rand_bf16();
    for (size_t i = 0; i < nb; i++)
        B[i] = (uint32_t)rand_bf16() | (uint32_t)rand_bf16() << 16;
    for (int m = 0; m < M; m++)
        scale[m] = chance(20) ? 1.0f : frand(0.0f, 1.5f);
    buf c = buf_new(M, N, ldc);
    buf_fill(&c, -3.0f, 3.0f);
    buf c0 = buf_clone(&c);
    buf_snap(&c);
    const float *rsc = row_scale ? scale : NULL;
    kt->gemm_bf16_pairs(M, N, P, alpha, A, rs, cs, B, ldb, c.p, ldc, flags, rsc);
    int ok = 1;
    const long outside = buf_changed(&c, 1);
    if (outside) {
        ok = 0;
        report("M=%d N=%d P=%d layout=%d flags=%d alpha=%g: %ld elements outside C changed", M, N, P, layout, flags,
               (double)alpha, outside);
    }
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N; n++) {
            double sum = 0, mag = 0;
            for (int p = 0; p < P; p++) {
                const uint16_t *a = A + m * rs + p * cs;
                const uint32_t b = B[p * ldb + n];
                const double t0 = (double)bf16_value(a[0]) * bf16_value((uint16_t)b),
                             t1 = (double)bf16_value(a[1]) * bf16_value((uint16_t)(b >> 16));
                sum += t0 + t1;
                mag += fabs(t0) + fabs(t1);
            }
            double ref = alpha * sum, tol = (2.0 * P + 2.0) * FLT_EPSILON * fabs(alpha) * mag;
            if (flags & SDPA_GEMM_ACCUMULATE) {
                const double old = *at(&c0, m, n), f = rsc ? rsc[m] : 1.0;
                ref += f * old;
                tol += 2.0 * FLT_EPSILON * fabs(f * old);
            }
            if (!close_to(*at(&c, m, n), ref, tol + 1e-30)) {
                ok = 0;
                report("M=%d N=%d P=%d layout=%d flags=%d row_scale=%d alpha=%g: C(%d,%d) = %.9g, float64 %.9g, "
                       "tol %.3g",
                       M, N, P, layout, flags, row_scale, (double)alpha, m, n, (double)*at(&c, m, n), ref, tol);
                break;
            }
        }
    record(ok);
    buf_free(&c);
    buf_free(&c0);
    free(A), free(B), free(scale);
}

#if ARCH_AARCH64 && HAVE_NEON_BF16
/* A bf16 for the bit comparison below: mostly random normal values, sometimes a zero of
 * either sign, an inf, a NaN or a value large enough that sums overflow. */
static uint16_t rand_bf16_special(void)
{
    static const uint16_t special[] = {0x0000u, 0x8000u, 0x7F80u, 0xFF80u, 0x7FC1u, 0x7F7Fu, 0xFF7Fu};
    return chance(6) ? special[rnd() % (sizeof special / sizeof special[0])] : rand_bf16();
}

/* The table's gemm_bf16_pairs (BFMMLA for whole 8 x 8 blocks) against the BFDOT kernel,
 * bit for bit over all of C's buffer (padding included): BFMMLA is two BFDotAdd steps per
 * element, the lower pair first (Arm ARM), so the two must agree on every input, infs,
 * NaNs and overflow included (a NaN's payload aside, which the contract leaves open: GCC
 * may swap the operands of C's final vaddq_f32, and Arm returns the first NaN). layout 0:
 * pairs along A's rows (cs = 2), 1: down its columns (rs = 2), 2: neither (element-wise
 * loads); `shift` puts A's words off their 4-byte alignment; `specials` mixes zeros, infs,
 * NaNs and huge values into A, B and C (without it every input is finite, so that long
 * depths compare finite sums rather than NaNs). */
static void check_pairs_mmla_bits(const sdpa_kernels *kt, int M, int N, int P, int layout, int shift, int flags,
                                  int row_scale, int specials)
{
    const ptrdiff_t ldb = N + 3, ldc = N + 5;
    const ptrdiff_t rs = layout == 1 ? 2 : layout == 0 ? 2 * (ptrdiff_t)P + 6 : 4 * (ptrdiff_t)P + 2;
    const ptrdiff_t cs = layout == 1 ? 2 * (ptrdiff_t)M + 4 : layout == 0 ? 2 : 4;
    const size_t na = (M > 0 && P > 0 ? (size_t)((M - 1) * rs + (P - 1) * cs + 2) : 1) + 1;
    const size_t nb = P > 0 && N > 0 ? (size_t)((P - 1) * ldb + N) : 1;
    const size_t nc = (size_t)(M > 0 ? M : 1) * (size_t)ldc;
    uint16_t *A = malloc(na * sizeof *A);
    uint32_t *B = malloc(nb * sizeof *B);
    float *scale = malloc((size_t)(M > 0 ? M : 1) * sizeof *scale), *c1 = malloc(nc * sizeof *c1),
          *c2 = malloc(nc * sizeof *c2);
    if (!A || !B || !scale || !c1 || !c2) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < na; i++)
        A[i] = specials ? rand_bf16_special() : rand_bf16();
    for (size_t i = 0; i < nb; i++)
        B[i] = specials ? (uint32_t)rand_bf16_special() | (uint32_t)rand_bf16_special() << 16
                        : (uint32_t)rand_bf16() | (uint32_t)rand_bf16() << 16;
    for (int m = 0; m < M; m++)
        scale[m] = chance(20) ? 1.0f : frand(0.0f, 1.5f);
    for (size_t i = 0; i < nc; i++)
        c1[i] = c2[i] = specials && chance(3) ? bf16_value(rand_bf16_special()) : frand(-3.0f, 3.0f);
    const float alpha = layout == 0 ? 0.125f : layout == 1 ? 1.0f : 0.0883883f; /* 0.0883883 ~ 1/sqrt(128) */
    kt->gemm_bf16_pairs(M, N, P, alpha, A + shift, rs, cs, B, ldb, c1, ldc, flags, row_scale ? scale : NULL);
    sdpa_neon_gemm_bf16_pairs(M, N, P, alpha, A + shift, rs, cs, B, ldb, c2, ldc, flags, row_scale ? scale : NULL);
    int ok = 1;
    for (size_t i = 0; i < nc && ok; i++)
        if (float_bits(c1[i]) != float_bits(c2[i]) && !(isnan(c1[i]) && isnan(c2[i]))) {
            ok = 0;
            report("M=%d N=%d P=%d layout=%d shift=%d flags=%d row_scale=%d: C[%zu] = 0x%08x, BFDOT's 0x%08x", M, N, P,
                   layout, shift, flags, row_scale, i, (unsigned)float_bits(c1[i]), (unsigned)float_bits(c2[i]));
        }
    record(ok);
    free(A), free(B), free(scale), free(c1), free(c2);
}
#endif

static void check_pack_pairs(const sdpa_kernels *kt, int from_f32, int rows, int cols)
{
    const ptrdiff_t lds = cols + 2, ldd = cols + 1;
    const int half = (rows + 1) / 2;
    const size_t ns = rows > 0 && cols > 0 ? (size_t)((rows - 1) * lds + cols) : 1;
    const size_t nd = (size_t)(half > 0 ? half : 1) * (size_t)ldd;
    float *sf = malloc(ns * sizeof *sf);
    uint16_t *sh = malloc(ns * sizeof *sh);
    uint32_t *d = malloc(nd * sizeof *d);
    if (!sf || !sh || !d) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    int finite = 1;
    for (size_t i = 0; i < ns; i++) {
        float x = frand(-4.0f, 4.0f);
        const int pick = (int)(rnd() % 100);
        if (pick < 10) /* a tie: the 16 dropped bits exactly half */
            x = bits_float((float_bits(x) & 0xFFFF0000u) | 0x8000u);
        else if (pick < 12)
            x = bits_float(0x7FC00000u | (rnd() & 0x3FFFFFu)); /* NaN */
        else if (pick < 13)
            x = chance(50) ? INFINITY : -INFINITY;
        else if (pick < 14)
            x = -0.0f;
        else if (pick < 15)
            x = bits_float(0x7F7FFFFFu); /* rounds to inf */
        sf[i] = x;
        sh[i] = bf16_rne(x);
        const size_t r = i / (size_t)lds, c = i % (size_t)lds;
        if ((int)r < rows && (int)c < cols && (sh[i] & 0x7F80u) == 0x7F80u)
            finite = 0;
    }
    for (size_t i = 0; i < nd; i++)
        d[i] = 0xA5A5A5A5u;
    int ok = 1, flag = -1;
    if (from_f32)
        kt->pack_pairs_f32(rows, cols, sf, lds, d, ldd);
    else
        flag = kt->pack_pairs_bf16(rows, cols, sh, lds, d, ldd);
    for (int p = 0; p < half && ok; p++)
        for (int c = 0; c < (int)ldd; c++) {
            const uint32_t got = d[p * ldd + c];
            if (c >= cols) {
                if (got != 0xA5A5A5A5u) {
                    ok = 0;
                    report("rows=%d cols=%d: padding (%d,%d) written", rows, cols, p, c);
                }
                continue;
            }
            const uint16_t lo = sh[2 * p * lds + c], hi = 2 * p + 1 < rows ? sh[(2 * p + 1) * lds + c] : 0;
            const uint32_t want = (uint32_t)lo | (uint32_t)hi << 16;
            /* a NaN may come back with another payload; it must stay a NaN */
            const int lo_nan = (lo & 0x7F80u) == 0x7F80u && (lo & 0x7Fu);
            const int hi_nan = (hi & 0x7F80u) == 0x7F80u && (hi & 0x7Fu);
            const uint16_t glo = (uint16_t)got, ghi = (uint16_t)(got >> 16);
            const int glo_nan = (glo & 0x7F80u) == 0x7F80u && (glo & 0x7Fu);
            const int ghi_nan = (ghi & 0x7F80u) == 0x7F80u && (ghi & 0x7Fu);
            if ((lo_nan ? !glo_nan : glo != lo) || (hi_nan ? !ghi_nan : ghi != hi)) {
                ok = 0;
                report("rows=%d cols=%d: pair (%d,%d) = %08x, want %08x", rows, cols, p, c, got, want);
                break;
            }
        }
    if (!from_f32 && flag != finite) {
        ok = 0;
        report("rows=%d cols=%d: finiteness %d, want %d", rows, cols, flag, finite);
    }
    record(ok);
    free(sf), free(sh), free(d);
}

/* round_rows_bf16: dst row r = bf16 of src row r (nearest even, NaN stays a NaN; inf,
 * -0, ties and values that round to inf drawn), padding untouched. */
static void check_round_rows(const sdpa_kernels *kt, int rows, int cols)
{
    const ptrdiff_t lds = cols + 3, ldd = cols + 5;
    const size_t ns = (size_t)(rows > 0 ? rows : 1) * (size_t)lds, nd = (size_t)(rows > 0 ? rows : 1) * (size_t)ldd;
    float *s = malloc(ns * sizeof *s);
    uint16_t *d = malloc(nd * sizeof *d);
    if (!s || !d) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < ns; i++) {
        float x = frand(-4.0f, 4.0f);
        const int pick = (int)(rnd() % 100);
        if (pick < 10)
            x = bits_float((float_bits(x) & 0xFFFF0000u) | 0x8000u); /* a tie */
        else if (pick < 12)
            x = bits_float(0x7FC00000u | (rnd() & 0x3FFFFFu));
        else if (pick < 13)
            x = chance(50) ? INFINITY : -INFINITY;
        else if (pick < 14)
            x = -0.0f;
        else if (pick < 15)
            x = bits_float(0x7F7FFFFFu);
        s[i] = x;
    }
    for (size_t i = 0; i < nd; i++)
        d[i] = 0xA5A5u;
    kt->round_rows_bf16(rows, cols, s, lds, d, ldd);
    int ok = 1;
    for (int r = 0; r < rows && ok; r++)
        for (int c = 0; c < (int)ldd; c++) {
            const uint16_t got = d[r * ldd + c];
            if (c >= cols) {
                if (got != 0xA5A5u) {
                    ok = 0;
                    report("rows=%d cols=%d: padding (%d,%d) written", rows, cols, r, c);
                    break;
                }
                continue;
            }
            const uint16_t want = bf16_rne(s[r * lds + c]);
            const int want_nan = (want & 0x7F80u) == 0x7F80u && (want & 0x7Fu);
            const int got_nan = (got & 0x7F80u) == 0x7F80u && (got & 0x7Fu);
            if (want_nan ? !got_nan : got != want) {
                ok = 0;
                report("rows=%d cols=%d: (%d,%d) = %04x, want %04x", rows, cols, r, c, got, want);
                break;
            }
        }
    record(ok);
    free(s), free(d);
}

/* online_softmax_pairs: bit for bit the same table's online_softmax on the scores scale * S
 * (one fp32 product each; scale 1, positive, negative, 0 and one that overflows drawn) followed by
 * pack_pairs_f32 (dst words, padding included, m, l, alpha), S left as it was; masked (-inf) scores,
 * fully masked columns and a running state from -inf drawn; padding untouched. */
static void check_softmax_pairs(const sdpa_kernels *kt, int M, int N)
{
    const ptrdiff_t lds = N + 3, ldd = N + 2;
    const int half = (M + 1) / 2;
    const size_t ns = (size_t)(M > 0 ? M : 1) * (size_t)lds, nd = (size_t)(half > 0 ? half : 1) * (size_t)ldd;
    float *S = malloc(ns * sizeof *S), *S2 = malloc(ns * sizeof *S2), *S0 = malloc(ns * sizeof *S0),
          *st = malloc(6 * (size_t)N * sizeof *st);
    uint32_t *d = malloc(nd * sizeof *d), *d2 = malloc(nd * sizeof *d2);
    if (!S || !S2 || !S0 || !st || !d || !d2) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < ns; i++)
        S[i] = chance(15) ? -INFINITY : frand(-8.0f, 8.0f);
    const int dead = N > 2 ? (int)(rnd() % (unsigned)N) : -1; /* a column masked in every row */
    for (int r = 0; r < M && dead >= 0; r++)
        S[r * lds + dead] = -INFINITY;
    float *m = st, *l = st + N, *al = st + 2 * N, *m2 = st + 3 * N, *l2 = st + 4 * N, *al2 = st + 5 * N;
    float *m_in = malloc((size_t)N * sizeof *m_in), *l_in = malloc((size_t)N * sizeof *l_in);
    if (!m_in || !l_in) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (int c = 0; c < N; c++) {
        m[c] = m2[c] = m_in[c] = chance(30) ? -INFINITY : frand(-4.0f, 4.0f);
        l[c] = l2[c] = l_in[c] = m[c] == -INFINITY ? 0.0f : frand(0.5f, 20.0f);
        al[c] = al2[c] = 7.0f;
    }
    static const float scales[] = {1.0f, 1.0f, 0.125f, 0.08838834764831845f, 3.0f, -0.5f, 0.0f, 0x1p100f};
    const float scale = scales[rnd() % (sizeof scales / sizeof scales[0])];
    if (scale == 0x1p100f) /* products beyond fp32's range: +-inf scores */
        for (size_t i = 0; i < ns; i++)
            S[i] = S[i] == -INFINITY ? S[i] : S[i] * 0x1p30f;
    for (size_t i = 0; i < ns; i++) {
        volatile float prod = scale * S[i]; /* the gemm's alpha * T */
        S2[i] = prod;
    }
    memcpy(S0, S, ns * sizeof *S);
    for (size_t i = 0; i < nd; i++)
        d[i] = d2[i] = 0xA5A5A5A5u;
    kt->online_softmax_pairs(M, N, S, lds, scale, m, l, al, d, ldd);
    kt->online_softmax(M, N, S2, lds, m2, l2, al2);
    kt->pack_pairs_f32(M, N, S2, lds, d2, ldd);
    int ok = memcmp(d, d2, nd * sizeof *d) == 0;
    if (!ok)
        report("M=%d N=%d scale=%g: P pairs differ from online_softmax + pack_pairs_f32", M, N, (double)scale);
    if (ok && (memcmp(m, m2, (size_t)N * 4) || memcmp(l, l2, (size_t)N * 4) || memcmp(al, al2, (size_t)N * 4))) {
        ok = 0;
        report("M=%d N=%d scale=%g: m, l or alpha differ from online_softmax", M, N, (double)scale);
    }
    if (ok && memcmp(S, S0, ns * sizeof *S) != 0) {
        ok = 0;
        report("M=%d N=%d: S written", M, N);
    }
    if (ok && kt->online_softmax_pairs_rows) {
        /* the same words, each column's pairs in a row (ldr >= whole chunks of 16 pairs, 3 words
         * beyond them that must keep their guard), zeros from ceil(M / 2) to the chunk's end */
        const ptrdiff_t whole = (half + 15) / 16 * 16, ldr = whole + 3;
        uint32_t *rw = malloc((size_t)N * (size_t)ldr * sizeof *rw);
        float *st3 = malloc(3 * (size_t)N * sizeof *st3);
        if (!rw || !st3) {
            fprintf(stderr, "checkasm: out of memory\n");
            exit(2);
        }
        for (size_t i = 0; i < (size_t)N * (size_t)ldr; i++)
            rw[i] = 0xA5A5A5A5u;
        memcpy(S, S0, ns * sizeof *S);
        for (int c = 0; c < N; c++) { /* the running state before the calls */
            st3[c] = m_in[c];
            st3[N + c] = l_in[c];
            st3[2 * N + c] = 7.0f;
        }
        kt->online_softmax_pairs_rows(M, N, S, lds, scale, st3, st3 + N, st3 + 2 * N, rw, ldr);
        for (int c = 0; c < N && ok; c++)
            for (ptrdiff_t p = 0; p < ldr; p++) {
                const uint32_t want = p < half ? d2[p * ldd + c] : p < whole ? 0u : 0xA5A5A5A5u;
                if (rw[c * ldr + p] != want) {
                    ok = 0;
                    report("M=%d N=%d scale=%g: online_softmax_pairs_rows word (%d, %d) = %08x, want %08x", M, N,
                           (double)scale, c, (int)p, rw[c * ldr + p], want);
                    break;
                }
            }
        if (ok && (memcmp(st3, m2, (size_t)N * 4) || memcmp(st3 + N, l2, (size_t)N * 4) ||
                   memcmp(st3 + 2 * N, al2, (size_t)N * 4))) {
            ok = 0;
            report("M=%d N=%d scale=%g: online_softmax_pairs_rows' m, l or alpha differ", M, N, (double)scale);
        }
        if (ok && memcmp(S, S0, ns * sizeof *S) != 0) {
            ok = 0;
            report("M=%d N=%d: online_softmax_pairs_rows wrote S", M, N);
        }
        free(rw), free(st3);
    }
    record(ok);
    free(S), free(S2), free(S0), free(st), free(d), free(d2), free(m_in), free(l_in);
}

/* bwd_dscores_pairs: bit for bit the same table's bwd_dscores, then round_rows_bf16
 * (ds16) and pack_pairs_f32 (dsp) of its dS, padding untouched, P and dP only read;
 * masked sentinels in P, ties and zeros drawn. */
static void check_dscores_pairs(const sdpa_kernels *kt, int M, int N)
{
    const ptrdiff_t ld = N + 3, ld16 = N + 5, ldp = N + 1;
    const int half = (M + 1) / 2;
    const size_t ns = (size_t)(M > 0 ? M : 1) * (size_t)ld, n16 = (size_t)(M > 0 ? M : 1) * (size_t)ld16,
                 np = (size_t)(half > 0 ? half : 1) * (size_t)ldp;
    float *P = malloc(ns * 4), *dP = malloc(ns * 4), *dP2 = malloc(ns * 4), *dP0 = malloc(ns * 4),
          *D = malloc((size_t)N * 4);
    uint16_t *a16 = malloc(n16 * 2), *b16 = malloc(n16 * 2);
    uint32_t *ap = malloc(np * 4), *bp = malloc(np * 4);
    if (!P || !dP || !dP2 || !dP0 || !D || !a16 || !b16 || !ap || !bp) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < ns; i++) {
        P[i] = chance(15) ? SDPA_MASKED_SENTINEL : chance(5) ? 0.0f : frand(0.0f, 1.0f);
        dP[i] = frand(-3.0f, 3.0f);
    }
    for (int c = 0; c < N; c++)
        D[c] = chance(10) ? dP[c] : frand(-1.0f, 1.0f); /* dP - D exactly 0 in row 0 */
    memcpy(dP2, dP, ns * 4);
    memcpy(dP0, dP, ns * 4);
    for (size_t i = 0; i < n16; i++)
        a16[i] = b16[i] = 0xA5A5u;
    for (size_t i = 0; i < np; i++)
        ap[i] = bp[i] = 0xA5A5A5A5u;
    kt->bwd_dscores_pairs(M, N, P, ld, dP, ld, D, a16, ld16, ap, ldp);
    kt->bwd_dscores(M, N, P, ld, dP2, ld, D);
    kt->round_rows_bf16(M, N, dP2, ld, b16, ld16);
    kt->pack_pairs_f32(M, N, dP2, ld, bp, ldp);
    const int ok = !memcmp(a16, b16, n16 * 2) && !memcmp(ap, bp, np * 4) && !memcmp(dP, dP0, ns * 4);
    if (!ok)
        report("M=%d N=%d: dS rows, key pairs or dP differ from bwd_dscores + round_rows_bf16 + pack_pairs_f32", M,
               N);
    record(ok);
    free(P), free(dP), free(dP2), free(dP0), free(D), free(a16), free(b16), free(ap), free(bp);
}

/* transpose_pairs: dst[p][r] = pair p of row r, bit for bit; other words untouched. */
static void check_transpose_pairs(const sdpa_kernels *kt, int rows, int pairs)
{
    const ptrdiff_t lds = 2 * (ptrdiff_t)pairs + 3, ldd = rows + 5;
    const size_t ns = rows > 0 ? (size_t)((rows - 1) * lds + 2 * pairs) : 1;
    const size_t nd = (size_t)(pairs > 0 ? pairs : 1) * (size_t)ldd;
    uint16_t *src = malloc(ns * sizeof *src);
    uint32_t *d = malloc(nd * sizeof *d);
    if (!src || !d) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < ns; i++)
        src[i] = (uint16_t)rnd();
    for (size_t i = 0; i < nd; i++)
        d[i] = 0xA5A5A5A5u;
    kt->transpose_pairs(rows, pairs, src, lds, d, ldd);
    int ok = 1;
    for (int p = 0; p < pairs && ok; p++)
        for (int r = 0; r < (int)ldd; r++) {
            const uint32_t want = r < rows ? (uint32_t)src[r * lds + 2 * p] | (uint32_t)src[r * lds + 2 * p + 1] << 16
                                           : 0xA5A5A5A5u;
            if (d[p * ldd + r] != want) {
                ok = 0;
                report("rows=%d pairs=%d: (%d,%d) = %08x, want %08x", rows, pairs, p, r, d[p * ldd + r], want);
                break;
            }
        }
    record(ok);
    free(src), free(d);
}

/* dot_pairs_cols: each column's sum bit for bit that of gemm_bf16_pairs(1, 1, P, 1.0f)
 * on the same pairs (the same instruction, step by step; kernels.h), over every lane
 * tail and pair count, with subnormal, -0, large and cancelling pairs mixed in (the
 * backward's D must equal its dP exactly when O = V); nothing past out[N - 1] written. */
static void check_dot_pairs_cols(const sdpa_kernels *kt, int P, int N)
{
    const ptrdiff_t lda = N + 3, ldb = N + 7;
    const size_t na = (size_t)(P > 0 ? (P - 1) * lda + N : 1), nb = (size_t)(P > 0 ? (P - 1) * ldb + N : 1);
    uint32_t *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B);
    if (!A || !B) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < na; i++) {
        const int r = (int)(rnd() % 16);
        const uint16_t lo = r == 0 ? (uint16_t)(rnd() % 0x7F) /* subnormal */ : r == 1 ? 0x8000u
                            : r == 2 ? bf16_rne(frand(-3e30f, 3e30f)) : rand_bf16();
        A[i] = (uint32_t)lo | (uint32_t)rand_bf16() << 16;
    }
    for (size_t i = 0; i < nb; i++)
        B[i] = chance(10) && i < na ? A[i] ^ 0x80008000u /* cancels A's pair */
                                    : (uint32_t)rand_bf16() | (uint32_t)rand_bf16() << 16;
    buf out = buf_new(1, N, N);
    buf_snap(&out);
    kt->dot_pairs_cols(P, N, A, lda, B, ldb, out.p);
    int ok = 1;
    const long outside = buf_changed(&out, 1);
    if (outside) {
        ok = 0;
        report("P=%d N=%d: %ld elements outside out changed", P, N, outside);
    }
    uint16_t *col = malloc((size_t)(2 * (P > 0 ? P : 1)) * sizeof *col);
    uint32_t *bcol = malloc((size_t)(P > 0 ? P : 1) * sizeof *bcol);
    for (int n = 0; n < N && ok; n++) {
        for (int p = 0; p < P; p++) {
            const uint32_t a = A[(size_t)p * (size_t)lda + (size_t)n];
            col[2 * p] = (uint16_t)a;
            col[2 * p + 1] = (uint16_t)(a >> 16);
            bcol[p] = B[(size_t)p * (size_t)ldb + (size_t)n];
        }
        float want;
        kt->gemm_bf16_pairs(1, 1, P, 1.0f, col, 0, 2, bcol, 1, &want, 1, 0, NULL);
        if (float_bits(*at(&out, 0, n)) != float_bits(want)) {
            ok = 0;
            report("P=%d N=%d: column %d = %.9g (%08x), gemm_bf16_pairs %.9g (%08x)", P, N, n,
                   (double)*at(&out, 0, n), (unsigned)float_bits(*at(&out, 0, n)), (double)want,
                   (unsigned)float_bits(want));
        }
    }
    record(ok);
    free(col), free(bcol), free(A), free(B);
    buf_free(&out);
}

static void test_pairs(const sdpa_kernels *kt)
{
    if (!kt->gemm_bf16_pairs)
        return;
    static const int ms[] = {0, 1, 3, 4, 5, 7, 8, 63, 64, 65, 128};
    static const int ns[] = {1, 15, 16, 17, 33, 48, 63, 64, 65, 130};
    static const int ps[] = {0, 1, 2, 9, 17, 32, 64, 300}; /* 17, 300: the tile unit's pair tails and panel */
    kernel_begin(kt->name, "gemm_bf16_pairs");
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++)
                for (int layout = 0; layout < 2; layout++) {
                    /* alpha 1 without accumulation: amx stores whole tiles straight to C */
                    check_pairs_gemm(kt, ms[i], ns[j], ps[k], layout, 0, 0, layout ? 1.0f : 0.125f);
                    check_pairs_gemm(kt, ms[i], ns[j], ps[k], layout, 0, 0, layout ? 0.125f : 1.0f);
                    check_pairs_gemm(kt, ms[i], ns[j], ps[k], layout, SDPA_GEMM_ACCUMULATE, layout, layout ? 1.0f : 0.125f);
                }
    kernel_end();
#if ARCH_AARCH64 && HAVE_NEON_BF16
    if (kt->gemm_bf16_pairs == sdpa_neon_gemm_bf16_pairs_mmla) {
        static const int bm[] = {0, 1, 7, 8, 9, 16, 23, 64, 65};
        static const int bn[] = {0, 1, 7, 8, 9, 16, 17, 64, 130};
        static const int bp[] = {0, 1, 2, 3, 9, 64, 65};
        kernel_begin(kt->name, "gemm_bf16_pairs (BFMMLA against BFDOT, bits)");
        for (size_t i = 0; i < sizeof bm / sizeof bm[0]; i++)
            for (size_t j = 0; j < sizeof bn / sizeof bn[0]; j++)
                for (size_t k = 0; k < sizeof bp / sizeof bp[0]; k++)
                    for (int layout = 0; layout < 3; layout++) {
                        /* specials in 1,326 of the 3,402 calls: the others compare finite sums */
                        const int special = (int)(i + j + k + (size_t)layout) % 2 == 0;
                        check_pairs_mmla_bits(kt, bm[i], bn[j], bp[k], layout, (int)(i + j + k) % 2, 0, 0, special);
                        check_pairs_mmla_bits(kt, bm[i], bn[j], bp[k], layout, (int)(i + k) % 2,
                                              SDPA_GEMM_ACCUMULATE, (int)(j + k) % 2, special && (j % 2 == 0));
                    }
        kernel_end();
    }
#endif
    static const int rows[] = {0, 1, 2, 3, 16, 127, 128, 129};
    static const int cols[] = {1, 15, 16, 17, 40, 64, 65, 130};
    for (int f32 = 1; f32 >= 0; f32--) {
        kernel_begin(kt->name, f32 ? "pack_pairs_f32" : "pack_pairs_bf16");
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            for (size_t j = 0; j < sizeof cols / sizeof cols[0]; j++)
                for (int rep = 0; rep < 3; rep++)
                    check_pack_pairs(kt, f32, rows[i], cols[j]);
        kernel_end();
    }
    kernel_begin(kt->name, "transpose_pairs");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (size_t j = 0; j < sizeof cols / sizeof cols[0]; j++)
            check_transpose_pairs(kt, rows[i], cols[j] / 2);
    kernel_end();
    if (kt->bwd_dscores_pairs) {
        static const int dm[] = {0, 1, 2, 3, 64, 127, 128};
        static const int dn[] = {1, 15, 16, 17, 64, 130};
        kernel_begin(kt->name, "bwd_dscores_pairs");
        for (size_t i = 0; i < sizeof dm / sizeof dm[0]; i++)
            for (size_t j = 0; j < sizeof dn / sizeof dn[0]; j++)
                for (int rep = 0; rep < 3; rep++)
                    check_dscores_pairs(kt, dm[i], dn[j]);
        kernel_end();
    }
    if (kt->online_softmax_pairs) {
        static const int sm[] = {0, 1, 2, 3, 16, 63, 64, 127, 128};
        static const int sn[] = {1, 15, 16, 17, 40, 64, 130};
        kernel_begin(kt->name, "online_softmax_pairs");
        for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++)
            for (size_t j = 0; j < sizeof sn / sizeof sn[0]; j++)
                for (int rep = 0; rep < 3; rep++)
                    check_softmax_pairs(kt, sm[i], sn[j]);
        kernel_end();
    }
    if (kt->dot_pairs_cols) {
        static const int dp[] = {0, 1, 2, 3, 8, 16, 32, 64, 65};
        static const int dc[] = {1, 2, 3, 4, 5, 15, 16, 17, 33, 64, 130};
        kernel_begin(kt->name, "dot_pairs_cols");
        for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++)
            for (size_t j = 0; j < sizeof dc / sizeof dc[0]; j++)
                for (int rep = 0; rep < 3; rep++)
                    check_dot_pairs_cols(kt, dp[i], dc[j]);
        kernel_end();
    }
    static const int rcols[] = {0, 1, 15, 16, 17, 31, 32, 33, 48, 64, 65, 130};
    kernel_begin(kt->name, "round_rows_bf16");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (size_t j = 0; j < sizeof rcols / sizeof rcols[0]; j++)
            for (int rep = 0; rep < 2; rep++)
                check_round_rows(kt, rows[i], rcols[j]);
    kernel_end();
}

/* ------------------------------------------------------------- bwd_rows */

/* The value of fp16 bits h (finite). */
static double half_value(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double mag = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h >> 15 ? -mag : mag;
}

/* bwd_rows over K/V of type `type` (fp32, bf16, fp16): against float64 on the same
 * values (K, V exact in the type; Q, O, dO, LSE fp32; O and LSE those of the same rows,
 * so that D and P mean what they do in a backward), each output within 4 (M + N + Dk
 * + Dv) ulps of its terms' magnitude (their sum of absolute values, P's own error from
 * that of S included) plus the output type's rounding; then, for a 16-bit type, the
 * bits of the fp32 variant on the widened rows, dK and dV narrowed (with `tiny`, dO is
 * subnormal, and so are the gradients: the narrowing of subnormals). Every row length
 * and stride is padded: nothing outside dQ, dK, dV may change, nothing in Q, O, dO,
 * LSE, K, V. */
static void check_bwd_rows(const sdpa_kernels *kt, int type, int M, int N, int Dk, int Dv, int tiny)
{
    const sdpa_bwd_rows_fn f = type == SDPA_DTYPE_BF16 ? kt->bwd_rows_bf16
                               : type == SDPA_DTYPE_F16 ? kt->bwd_rows_f16
                                                        : kt->bwd_rows_f32;
    const int t16 = type != SDPA_DTYPE_F32, f16 = type == SDPA_DTYPE_F16;
    const float scale = 1.0f / sqrtf((float)Dk);
    buf q = buf_new(M, Dk, Dk + 3), o = buf_new(M, Dv, Dv + 1), dout = buf_new(M, Dv, Dv + 2), lse = buf_new(1, M, M);
    buf kf = buf_new(N, Dk, Dk + 5), vf = buf_new(N, Dv, Dv + 3), dq = buf_new(M, Dk, Dk + 1);
    buf dkf = buf_new(N, Dk, Dk + 2), dvf = buf_new(N, Dv, Dv + 4);
    hbuf k16 = hbuf_new(N, Dk, Dk + 5), v16 = hbuf_new(N, Dv, Dv + 3), dk16 = hbuf_new(N, Dk, Dk + 2),
         dv16 = hbuf_new(N, Dv, Dv + 4);
    float *scratch = malloc((size_t)(kt->bwd_rows_scratch > 0 ? kt->bwd_rows_scratch : 1) * sizeof(float));
    buf_fill(&q, -2.0f, 2.0f);
    buf_fill(&kf, -2.0f, 2.0f);
    buf_fill(&vf, -1.0f, 1.0f);
    buf_fill(&dout, -1.0f, 1.0f);
    for (int m = 0; m < M && tiny; m++) /* subnormal dO: subnormal gradients to narrow */
        for (int c = 0; c < Dv; c++)
            *at(&dout, m, c) *= 0x1p-130f;
    if (t16 && N > 0) { /* K, V exact in the type: narrowed, then widened back */
        narrow_fn(kt, f16)(N, Dk, kf.p, kf.ld, k16.p, k16.ld);
        narrow_fn(kt, f16)(N, Dv, vf.p, vf.ld, v16.p, v16.ld);
        widen_fn(kt, f16)(N, Dk, k16.p, k16.ld, kf.p, kf.ld);
        widen_fn(kt, f16)(N, Dv, v16.p, v16.ld, vf.p, vf.ld);
    }
    double *S = malloc((size_t)(M * N + 1) * sizeof(double)), *P = malloc((size_t)(M * N + 1) * sizeof(double));
    double *Sa = malloc((size_t)(M * N + 1) * sizeof(double)), *dS = malloc((size_t)(M * N + 1) * sizeof(double));
    double *dSa = malloc((size_t)(M * N + 1) * sizeof(double));
    for (int m = 0; m < M; m++) { /* the forward of row m: LSE and O */
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < N; j++) {
            double d = 0.0, a = 0.0;
            for (int c = 0; c < Dk; c++) {
                d += (double)*at(&q, m, c) * (double)*at(&kf, j, c);
                a += fabs((double)*at(&q, m, c) * (double)*at(&kf, j, c));
            }
            S[m * N + j] = d * scale;
            Sa[m * N + j] = a * scale;
            mx = S[m * N + j] > mx ? S[m * N + j] : mx;
        }
        for (int j = 0; j < N; j++)
            sum += exp(S[m * N + j] - mx);
        *at(&lse, 0, m) = N > 0 ? (float)(mx + log(sum)) : 0.0f;
        for (int c = 0; c < Dv; c++) {
            double acc = 0.0;
            for (int j = 0; j < N; j++)
                acc += exp(S[m * N + j] - mx) / sum * (double)*at(&vf, j, c);
            *at(&o, m, c) = (float)acc;
        }
    }
    for (int m = 0; m < M; m++) { /* P, dS on the fp32 LSE and O, and their magnitudes */
        double D = 0.0, Da = 0.0;
        for (int c = 0; c < Dv; c++) {
            D += (double)*at(&dout, m, c) * (double)*at(&o, m, c);
            Da += fabs((double)*at(&dout, m, c) * (double)*at(&o, m, c));
        }
        for (int j = 0; j < N; j++) {
            double dP = 0.0, dPa = 0.0;
            for (int c = 0; c < Dv; c++) {
                dP += (double)*at(&dout, m, c) * (double)*at(&vf, j, c);
                dPa += fabs((double)*at(&dout, m, c) * (double)*at(&vf, j, c));
            }
            const double p = exp(S[m * N + j] - (double)*at(&lse, 0, m));
            P[m * N + j] = p;
            dS[m * N + j] = p * (dP - D);
            /* P's relative error is about S's absolute one (Sa ulps), plus exp's */
            dSa[m * N + j] = p * (dPa + Da + fabs(dP - D) * (1.0 + Sa[m * N + j]));
            Sa[m * N + j] = p * (1.0 + Sa[m * N + j]); /* now P's magnitude, for dV */
        }
    }
    buf_snap(&q), buf_snap(&o), buf_snap(&dout), buf_snap(&lse), buf_snap(&kf), buf_snap(&vf);
    buf_snap(&dq), buf_snap(&dkf), buf_snap(&dvf);
    hbuf_snap(&k16), hbuf_snap(&v16), hbuf_snap(&dk16), hbuf_snap(&dv16);
    const void *K = t16 ? (const void *)k16.p : kf.p, *V = t16 ? (const void *)v16.p : vf.p;
    void *dK = t16 ? (void *)dk16.p : dkf.p, *dV = t16 ? (void *)dv16.p : dvf.p;
    const int done = f(M, N, Dk, Dv, scale, q.p, q.ld, o.p, o.ld, dout.p, dout.ld, lse.p, K, kf.ld, V, vf.ld, dq.p,
                       dq.ld, dK, dkf.ld, dV, dvf.ld, scratch);
    int ok = 1;
    const long cin = buf_changed(&q, 0) + buf_changed(&o, 0) + buf_changed(&dout, 0) + buf_changed(&lse, 0) +
                     buf_changed(&kf, 0) + buf_changed(&vf, 0) + hbuf_changed(&k16, 0) + hbuf_changed(&v16, 0);
    const long cout = buf_changed(&dq, done) + buf_changed(&dkf, done && !t16) + buf_changed(&dvf, done && !t16) +
                      hbuf_changed(&dk16, done && t16) + hbuf_changed(&dv16, done && t16);
    if (cin || cout) {
        ok = 0;
        report("M=%d N=%d Dk=%d Dv=%d: %ld input and %ld output elements changed that must not", M, N, Dk, Dv, cin,
               cout);
    }
    if (ok && done != (M <= kt->bwd_rows_max_rows)) {
        ok = 0;
        report("M=%d N=%d Dk=%d Dv=%d: returned %d", M, N, Dk, Dv, done);
    }
    const double rel_out = type == SDPA_DTYPE_BF16 ? 0x1p-8 : f16 ? 0x1p-11 : 0.0;
    const double ulps = 4.0 * (M + N + Dk + Dv) * FLT_EPSILON;
    /* absolute: the output type's subnormal spacing, and fp32's per operation */
    const double abs_tol = (type == SDPA_DTYPE_BF16 ? 0x1p-133 : f16 ? 0x1p-24 : 0.0) + (M + N + Dk + Dv) * 0x1p-149;
    for (int j = 0; j < N && ok && done; j++) { /* dK, dV */
        for (int w = 0; w < 2 && ok; w++) {
            const int len = w ? Dv : Dk;
            for (int c = 0; c < len && ok; c++) {
                double ref = 0.0, mag = 0.0;
                for (int m = 0; m < M; m++) {
                    const double x = w ? (double)*at(&dout, m, c) : (double)*at(&q, m, c);
                    ref += (w ? P[m * N + j] : scale * dS[m * N + j]) * x;
                    mag += (w ? Sa[m * N + j] : scale * dSa[m * N + j]) * fabs(x);
                }
                const double got = t16 ? (double)(f16 ? half_value(*hat(w ? &dv16 : &dk16, j, c))
                                                      : bits_float((uint32_t)*hat(w ? &dv16 : &dk16, j, c) << 16))
                                       : (double)*at(w ? &dvf : &dkf, j, c);
                if (!(fabs(got - ref) <= ulps * mag + rel_out * fabs(ref) + abs_tol)) {
                    ok = 0;
                    report("%s M=%d N=%d Dk=%d Dv=%d: %s(%d,%d) = %.9g, float64 %.9g (terms %.3g)",
                           t16 ? (f16 ? "fp16" : "bf16") : "fp32", M, N, Dk, Dv, w ? "dV" : "dK", j, c, got, ref,
                           mag);
                }
            }
        }
    }
    for (int m = 0; m < M && ok && done; m++)
        for (int c = 0; c < Dk && ok; c++) {
            double ref = 0.0, mag = 0.0;
            for (int j = 0; j < N; j++) {
                ref += scale * dS[m * N + j] * (double)*at(&kf, j, c);
                mag += scale * dSa[m * N + j] * fabs((double)*at(&kf, j, c));
            }
            if (!(fabs((double)*at(&dq, m, c) - ref) <= ulps * mag + abs_tol)) {
                ok = 0;
                report("M=%d N=%d Dk=%d Dv=%d: dQ(%d,%d) = %.9g, float64 %.9g (terms %.3g)", M, N, Dk, Dv, m, c,
                       (double)*at(&dq, m, c), ref, mag);
            }
        }
    if (ok && done && t16) { /* the fp32 variant's bits on the widened rows */
        buf dq2 = buf_new(M, Dk, Dk + 1), dk2 = buf_new(N, Dk, Dk + 2), dv2 = buf_new(N, Dv, Dv + 4);
        hbuf dkn = hbuf_new(N, Dk, Dk + 2), dvn = hbuf_new(N, Dv, Dv + 4);
        kt->bwd_rows_f32(M, N, Dk, Dv, scale, q.p, q.ld, o.p, o.ld, dout.p, dout.ld, lse.p, kf.p, kf.ld, vf.p, vf.ld,
                         dq2.p, dq2.ld, dk2.p, dk2.ld, dv2.p, dv2.ld, scratch);
        if (N > 0) {
            narrow_fn(kt, f16)(N, Dk, dk2.p, dk2.ld, dkn.p, dkn.ld);
            narrow_fn(kt, f16)(N, Dv, dv2.p, dv2.ld, dvn.p, dvn.ld);
        }
        for (int m = 0; m < M && ok; m++)
            ok = memcmp(at(&dq, m, 0), at(&dq2, m, 0), (size_t)Dk * sizeof(float)) == 0;
        for (int j = 0; j < N && ok; j++)
            ok = memcmp(hat(&dk16, j, 0), hat(&dkn, j, 0), (size_t)Dk * 2) == 0 &&
                 memcmp(hat(&dv16, j, 0), hat(&dvn, j, 0), (size_t)Dv * 2) == 0;
        if (!ok)
            report("%s M=%d N=%d Dk=%d Dv=%d: not the bits of bwd_rows_f32 on the widened rows",
                   f16 ? "fp16" : "bf16", M, N, Dk, Dv);
        buf_free(&dq2), buf_free(&dk2), buf_free(&dv2), hbuf_free(&dkn), hbuf_free(&dvn);
    }
    record(ok);
    free(S), free(P), free(Sa), free(dS), free(dSa), free(scratch);
    buf_free(&q), buf_free(&o), buf_free(&dout), buf_free(&lse), buf_free(&kf), buf_free(&vf), buf_free(&dq);
    buf_free(&dkf), buf_free(&dvf);
    hbuf_free(&k16), hbuf_free(&v16), hbuf_free(&dk16), hbuf_free(&dv16);
}

static void test_bwd_rows(const sdpa_kernels *kt)
{
    static const char *const names[] = {"bwd_rows_f32", "bwd_rows_bf16", "bwd_rows_f16"};
    const sdpa_bwd_rows_fn fns[] = {kt->bwd_rows_f32, kt->bwd_rows_bf16, kt->bwd_rows_f16};
    const int types[] = {SDPA_DTYPE_F32, SDPA_DTYPE_BF16, SDPA_DTYPE_F16};
    for (int t = 0; t < 3; t++) {
        if (!fns[t] || !selected(names[t]))
            continue;
        kernel_begin(kt->name, names[t]);
        const int mx = kt->bwd_rows_max_rows, st = kt->nt_step, vl = kt->vec_floats;
        const int ms[] = {1, 2, 3, 4, 5, 8, mx, mx + 1};
        const int ns[] = {0, 1, 5, st - 1, st, st + 1, 2 * st + 1, 100};
        const int ds[] = {1, 7, 8, 15, 16, 17, 33, 64, 100, 128, 129, 4 * vl + 1, 256};
        int combo = 0;
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
                for (size_t d = 0; d < sizeof ds / sizeof ds[0]; d++, combo++)
                    check_bwd_rows(kt, types[t], ms[i], ns[j], ds[d], combo % 5 == 0 ? ds[(d + 3) % 13] : ds[d],
                                   combo % 4 == 1);
        kernel_end();
    }
}

int main(int argc, char **argv)
{
    int bench = 0;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--test=", 7) && argv[i][7]) {
            test_pattern = argv[i] + 7;
        } else if (!strcmp(argv[i], "--bench")) {
            bench = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(argv[0]);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            fprintf(stderr, "checkasm: unknown option %s\n", argv[i]);
            usage(argv[0]);
            return 2;
        } else {
            rng_state = strtoull(argv[i], NULL, 0) * 0x9E3779B97F4A7C15ull + 1;
        }
    }
    if (bench) {
        run_bench();
        return 0;
    }
    const sdpa_kernels *ref_kt = sdpa_kernels_get(SDPA_ISA_SCALAR);
    if (!ref_kt) {
        printf("scalar kernels missing\n0 passed, 1 failed\n");
        return 1;
    }
    printf("checkasm: CPU features: %s\n", sdpa_cpu_features());
    static const sdpa_isa isas[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_AMX, SDPA_ISA_NEON};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        const sdpa_isa isa = isas[i];
        if (!sdpa_isa_compiled(isa)) {
            printf("%-7s skipped (not compiled in)\n", sdpa_isa_name(isa));
            continue;
        }
        const sdpa_kernels *kt = sdpa_kernels_get(isa);
        if (!sdpa_isa_supported(isa) || !kt) {
            printf("%-7s skipped (not supported by this CPU/OS)\n", sdpa_isa_name(isa));
            continue;
        }
        printf("%-7s table \"%s\", block_q %d, block_k %d\n", sdpa_isa_name(isa), kt->name, kt->block_q,
               kt->block_k);
        if (isa == SDPA_ISA_AMX) {
            /* the avx512 table's kernels but for the tile products and the softmax that feeds
             * them P's rows (test_pairs checks it beside online_softmax_pairs) */
            if (selected("gemm_bf16_pairs") || selected("online_softmax_pairs") ||
                selected("online_softmax_pairs_rows")) {
                kt->tiles_begin(); /* the driver's bracket (kernels.h) */
                test_pairs(kt);
                kt->tiles_end();
            }
            continue;
        }
        make_sizes(kt);
        if (selected("gemm"))
            test_gemm(kt, ref_kt);
        if (selected("online_softmax"))
            test_softmax(kt, ref_kt);
        if (selected("online_softmax_rows"))
            test_softmax_rows(kt, ref_kt);
        if (selected("scale_rows"))
            test_scale(kt, ref_kt);
        if (selected("bwd_probs"))
            test_probs(kt, ref_kt);
        if (selected("bwd_dscores"))
            test_dscores(kt, ref_kt);
        if (selected("transpose"))
            test_transpose(kt);
        if (selected("gemm_nt"))
            test_gemm_nt(kt, ref_kt);
        if (selected("gemm_stream"))
            test_gemm_stream(kt, ref_kt);
        if (selected("attend_rows"))
            test_attend(kt);
        if (selected("attend_rows_bf16") || selected("attend_rows_f16"))
            test_attend16(kt);
        if (selected("attend_rows_bf16_pairs"))
            test_attend_pairs(kt);
        test_bwd_rows(kt);
        make_variant_sizes(kt);
        if (selected("softcap"))
            test_softcap(kt, ref_kt);
        if (selected("alibi_cols"))
            test_alibi(kt, ref_kt, 0);
        if (selected("alibi_rows"))
            test_alibi(kt, ref_kt, 1);
        if (selected("bwd_softcap"))
            test_bwd_softcap(kt, ref_kt);
        for (int k = CVT_WIDEN_BF16; k <= CVT_NARROW_F16; k++)
            if (selected(cvt_names[k]))
                test_cvt(kt, ref_kt, k);
        if (selected("gemm_bf16_pairs") || selected("pack_pairs_f32") || selected("pack_pairs_bf16") ||
            selected("transpose_pairs") || selected("round_rows_bf16") || selected("online_softmax_pairs") ||
            selected("bwd_dscores_pairs") || selected("dot_pairs_cols"))
            test_pairs(kt);
    }
    printf("%ld passed, %ld failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
