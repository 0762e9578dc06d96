/* SPDX-License-Identifier: MIT */
/* tests/util.h - shared helpers of the Criterion suite: RNG, guarded buffers,
 * tensor layouts and views, the tolerance rules, ISA iteration, .npy reading.
 *
 * Everything here is plain C used from inside Criterion tests (each test runs in
 * its own forked process); nothing here calls the library at load time. Logging
 * goes through cr_log_info / cr_log_warn. Two files: tests/util.c (the helpers
 * that log or expect through Criterion) and tests/util_core.c (no Criterion, also
 * linked into the plain-C conformance program): the guarded buffers (util_galloc*,
 * util_glen, util_gcheck, util_gfree, util_gdup, the sentinel), the layouts and
 * views, util_gpack, util_problem, util_close / util_close_elem,
 * util_max_abs_finite, util_data_path,
 * util_read_file, util_outputs_free and util_same_bits. */
#ifndef SDPA_TEST_UTIL_H
#define SDPA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa.h"

/* ------------------------------------------------------------------ RNG -- */

/* Deterministic generator (splitmix64 seeding + xoshiro256**). Same seed, same
 * numbers, on every platform. */
typedef struct util_rng {
    uint64_t s[4];
} util_rng;

/* The seed of a test: the environment variable SDPA_TEST_SEED if set (decimal or
 * 0x hex), else `fallback`. Logs "<who>: seed = N (set SDPA_TEST_SEED=N to
 * reproduce)" with cr_log_info so a failing run can be replayed. */
uint64_t util_seed(const char *who, uint64_t fallback);
void util_rng_init(util_rng *r, uint64_t seed);
/* Shortcut: util_rng_init(r, util_seed(who, fallback)). */
void util_rng_seed(util_rng *r, const char *who, uint64_t fallback);
uint64_t util_rng_u64(util_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double util_rng_double(util_rng *r);
/* Uniform integer in [lo, hi] (inclusive). */
int64_t util_rng_int(util_rng *r, int64_t lo, int64_t hi);
/* Standard normal (Box-Muller, float64). */
double util_rng_normal(util_rng *r);
/* Fill x[0..n) with fp32(uniform[lo, hi)) / fp32(sigma * normal). */
void util_fill_uniform(util_rng *r, float *x, size_t n, float lo, float hi);
void util_fill_normal(util_rng *r, float *x, size_t n, float sigma);

/* ------------------------------------------------------ guarded buffers -- */

/* Floats per guard zone on each side of a guarded buffer. */
#define UTIL_GUARD_FLOATS 64
/* The bit pattern filling guard zones and (by default) the data: a quiet NaN with
 * a payload no arithmetic produces, so "still equal to it" means "never written". */
#define UTIL_SENTINEL_BITS 0x7fc5a17bu

float util_sentinel(void);
/* 1 if the float's bits are exactly UTIL_SENTINEL_BITS. */
int util_is_sentinel(float x);

/* A buffer of n floats (n may be 0) between two guard zones of
 * UTIL_GUARD_FLOATS sentinel floats; the data is filled with the sentinel too.
 * Never returns NULL (aborts on allocation failure). The data pointer
 * is 16-byte aligned (malloc's alignment plus a multiple of 64 bytes). */
float *util_galloc(size_t n);
/* Same, data filled with `value` instead of the sentinel. */
float *util_galloc_fill(size_t n, float value);
/* Number of floats of a util_galloc buffer. */
size_t util_glen(const float *p);
/* 1 if both guard zones still hold the sentinel bit pattern, else 0 (and a
 * cr_log_error naming `what` and the first damaged offset). NULL: 1. */
int util_gintact(const float *p, const char *what);
/* Same without Criterion: 1 if intact, else 0 with the first damage described in
 * msg[0..len). NULL: 1. */
int util_gcheck(const float *p, char *msg, size_t len);
/* Frees a util_galloc buffer (NULL is fine). */
void util_gfree(float *p);
/* Copies n floats into a guarded buffer of its own (for inputs). */
float *util_gdup(const float *src, size_t n);

/* ------------------------------------------------------------- layouts -- */

/* A [B, H, T, D] tensor stored with arbitrary element strides (D contiguous). */
typedef struct util_layout {
    int64_t B, H, T, D;
    int64_t sb, sh, st; /* batch, head, seq strides in elements */
} util_layout;

/* Contiguous [B, H, T, D]: st = D, sh = T*D, sb = H*T*D. */
util_layout util_contig(int64_t B, int64_t H, int64_t T, int64_t D);
/* Stored as [B, T, H, D] (e.g. a transformer's natural layout): st = H*D, sh = D, sb = T*H*D. */
util_layout util_bthd(int64_t B, int64_t H, int64_t T, int64_t D);
/* Contiguous but with row stride row_stride >= D (gaps between rows):
 * st = row_stride, sh = T*row_stride, sb = H*T*row_stride. */
util_layout util_padded(int64_t B, int64_t H, int64_t T, int64_t D, int64_t row_stride);
/* LSE [B, H, T] as a layout with D = 1: st = 1, sh = T, sb = H*T. */
util_layout util_lse_layout(int64_t B, int64_t H, int64_t T);
/* Number of floats an allocation must hold for the layout: 1 + the largest
 * offset touched (0 when the tensor is empty). */
size_t util_extent(const util_layout *l);
/* Number of logical elements B*H*T*D. */
size_t util_numel(const util_layout *l);
/* Offset of element (b, h, t, d). */
int64_t util_offset(const util_layout *l, int64_t b, int64_t h, int64_t t, int64_t d);
/* contiguous [B,H,T,D] `src` -> `dst` stored with layout l (only the elements of
 * the view are written). */
void util_pack(const util_layout *l, float *dst, const float *src);
/* `src` stored with layout l -> contiguous [B,H,T,D] `dst`. */
void util_unpack(const util_layout *l, float *dst, const float *src);
/* 1 if every float of buf[0..n) that is NOT an element of the view l is still the
 * sentinel (gaps of strided outputs untouched), else 0 with a cr_log_error. */
int util_gaps_intact(const util_layout *l, const float *buf, size_t n, const char *what);
/* Same without Criterion: 1 if intact, else 0 with the first written gap described
 * in msg[0..len). */
int util_gaps_check(const util_layout *l, const float *buf, size_t n, char *msg, size_t len);

/* A guarded buffer (util_galloc) holding the contiguous [B,H,T,D] `src` stored
 * with layout l (only the view's elements written; the gaps keep the sentinel). */
float *util_gpack(const util_layout *l, const float *src);

/* Views. */
sdpa_tensor util_view(const util_layout *l, const float *data);
sdpa_tensor_out util_view_out(const util_layout *l, float *data);
/* Contiguous views from sizes: [B, H, T, D] (batch count not needed). */
sdpa_tensor util_cview(const float *data, int64_t H, int64_t T, int64_t D);
sdpa_tensor_out util_cview_out(float *data, int64_t H, int64_t T, int64_t D);
/* Contiguous LSE [B, H, T] views. */
sdpa_tensor util_lse_view(const float *data, int64_t H, int64_t T);
sdpa_tensor_out util_lse_view_out(float *data, int64_t H, int64_t T);

/* Problem descriptor from sizes (sdpa_problem_init + the sizes; everything
 * else default). */
sdpa_problem util_problem(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dk,
                          int64_t Dv);

/* --------------------------------------------------------------- ISAs -- */

/* Fills out[] with every ISA this machine supports (sdpa_isa_supported), scalar
 * first; returns how many. Logs once per process (cr_log_info) every ISA that is
 * not supported, so a skipped ISA is never silent. util_isas leaves out amx, whose
 * fp32 and fp16 problems run the avx512 table's kernels with its shapes (checked
 * bitwise by dispatch/amx_fp32_is_avx512); util_isas_typed, for the tests that
 * run bf16 problems, includes it. */
int util_isas(sdpa_isa out[SDPA_ISA_COUNT]);
int util_isas_typed(sdpa_isa out[SDPA_ISA_COUNT]);

/* Whether the library may round P to bf16 before P V for a forward on isa with these
 * types and head_dims: K/V bf16, Q bf16 or fp32 (then rounded to bf16 too), Dk even and
 * > 0, Dv > 0, and the ISA runs the bf16 pair products (sdpa_isa_bf16_pairs;
 * docs/design.md, "What is rounded"). The accuracy rule's naive reference then rounds P
 * the same way (naive32_forward_bf16_p), on Q as util_pairs_q gives it. */
int util_rounds_p(sdpa_isa isa, sdpa_dtype q, sdpa_dtype kv, int64_t Dk, int64_t Dv);
/* Whether a backward with types ty (Q, K/V, O) on isa rounds P and dS to bf16 before
 * their products (the backward's bf16 pair products: every type bf16, even head
 * dims, sdpa_isa_bf16_pairs_backward, and tiles wider than the decode path's: Tq x G
 * query rows per kv head above the ISA's nt_max_cols in sdpa_tuning(), which with
 * block_q >= 2 nt_max_cols is the driver's test); the naive reference then rounds them
 * the same way (naive32_backward_o_bf16_p). Assumes finite operands (a group with an
 * inf or NaN keeps the fp32 products). */
int util_rounds_bwd(sdpa_isa isa, const sdpa_dtype ty[3], int64_t Dk, int64_t Dv, int64_t Tq, int64_t G);
/* Whether an fp32 Q over bf16 K/V is rounded to bf16 for the whole problem, forward and
 * backward (the driver's sdpa_rounds_q_bf16): util_rounds_p with Q fp32 and Tq x G query
 * rows per kv head above the ISA's nt_max_cols in sdpa_tuning() (the problem has wide
 * tiles). The references of such a problem read Q as util_pairs_q gives it. */
int util_rounds_q(sdpa_isa isa, sdpa_dtype q, sdpa_dtype kv, int64_t Dk, int64_t Dv, int64_t Tq, int64_t G);
/* A malloc'd copy of the n values of Q (fp32 values of type qt) as the bf16 pair
 * products read them: rounded to bf16 (nearest even) when qt is fp32, else as they are. */
float *util_pairs_q(const float *q, size_t n, sdpa_dtype qt);

/* ---------------------------------------------------------- tolerances -- */

/* The FlashAttention rule for one array: over the elements whose reference is
 * finite, max |got - ref| <= factor * max |naive - ref| + 1e-6 * max|ref| + 1e-7.
 * Elements whose reference is -inf / +inf must be bitwise that infinity in `got`;
 * a NaN in `got` where the reference is not NaN is always a failure (and a NaN
 * reference requires a NaN). `naive` may be NULL (then only the slack applies). */
typedef struct util_err {
    double err;       /* max |got - ref| over finite references */
    double naive_err; /* max |naive - ref| */
    double ref_max;   /* max |ref| over finite references */
    double bound;     /* the allowed error */
    size_t worst;     /* index of the largest |got - ref| */
    size_t nonfinite_bad; /* elements whose infinity / NaN status is wrong */
    size_t first_bad;     /* index of the first of those (if any) */
    int ok;
} util_err;
util_err util_fa_compare(const float *got, const float *naive, const double *ref, size_t n,
                         double factor);
/* Same with an explicit slack: bound = factor * naive_err + rel_slack * max|ref| + abs_slack. */
util_err util_fa_compare_slack(const float *got, const float *naive, const double *ref, size_t n,
                               double factor, double rel_slack, double abs_slack);
/* Checks with cr_expect and logs on failure: "<what>: ..." . Returns ok. */
int util_fa_expect(const char *what, const float *got, const float *naive, const double *ref,
                   size_t n, double factor);
int util_fa_expect_slack(const char *what, const float *got, const float *naive, const double *ref,
                         size_t n, double factor, double rel_slack, double abs_slack);

/* Elementwise rule of the edge cases: |got - ref| <= max(atol, rtol*|ref|);
 * infinities must match exactly; NaN never passes unless ref is NaN. */
int util_close(double got, double ref, double atol, double rtol);
/* One element of util_expect_close: exact != 0 requires bit-for-bit equality with
 * (float)ref (zero of either sign accepted, NaN matches NaN), else util_close. */
int util_close_elem(float got, double ref, double atol, double rtol, int exact);
/* Array version with cr_expect and a log of the first few failures; exact != 0
 * requires bit-for-bit equality with (float)ref (zero of either sign accepted).
 * Returns the number of failing elements. */
size_t util_expect_close(const char *what, const float *got, const double *ref, size_t n,
                         double atol, double rtol, int exact);
/* max |x[i]| over the finite elements of x[0..n) (0 when there are none). */
double util_max_abs_finite(const double *x, size_t n);
/* 1 if any element is NaN. */
int util_has_nan(const float *x, size_t n);

/* ------------------------------------------------------------ data dir -- */

/* SDPA_TEST_DATA_DIR "/" rel into buf. Returns buf. */
const char *util_data_path(char *buf, size_t len, const char *rel);
/* Reads a whole file (NUL-terminated); *len gets its size. NULL on error. */
char *util_read_file(const char *path, size_t *len);

/* ---------------------------------------------------------------- .npy -- */

typedef enum util_npy_type {
    UTIL_NPY_F32,
    UTIL_NPY_F16,
    UTIL_NPY_F64,
    UTIL_NPY_BOOL,
    UTIL_NPY_I64,
    UTIL_NPY_I32,
    UTIL_NPY_U8
} util_npy_type;

typedef struct util_npy {
    util_npy_type type;
    int ndim;
    int64_t shape[8];
    size_t count;     /* product of shape */
    void *data;       /* count elements, little-endian, C order (malloc'd) */
} util_npy;

/* Loads a version 1/2/3 .npy file (little-endian or 1-byte types, C order, no
 * objects). Returns 0, or -1 with a message in err. */
int util_npy_load(const char *path, util_npy *out, char *err, size_t errlen);
void util_npy_free(util_npy *a);
/* Element i converted to double (bool -> 0/1, fp16 -> exact value). */
double util_npy_get(const util_npy *a, size_t i);
/* Bytes of one element of type t (4 for fp32, 2 for bf16 / fp16). */
size_t util_dtype_bytes(sdpa_dtype t);
/* n floats stored as type t (rounded to nearest even, src/dtype.h) in a new malloc'd
 * buffer followed by `guard` elements of 0xA5 bytes (asserts the allocation). */
void *util_store_as(sdpa_dtype t, const float *x, size_t n, size_t guard);
/* Element i of a buffer of type t, widened (exact). */
float util_load_as(sdpa_dtype t, const void *buf, size_t i);
/* 1 if the bytes [from_byte, from_byte + bytes) of buf are all still 0xA5. */
int util_guard_intact(const void *buf, size_t from_byte, size_t bytes);
/* IEEE binary16 bits -> float (exact). */
float util_half_to_float(uint16_t h);

/* ------------------------------------------------------ small helpers -- */

/* 1 when built with AddressSanitizer (which cannot run under RLIMIT_AS), else 0. */
#if defined(__SANITIZE_ADDRESS__)
#define UTIL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UTIL_ASAN 1
#endif
#endif
#ifndef UTIL_ASAN
#define UTIL_ASAN 0
#endif

/* The five outputs of one forward + backward as contiguous arrays (malloc'd;
 * NULL where not produced). */
typedef struct util_outputs {
    float *o, *lse, *dq, *dk, *dv;
} util_outputs;
/* Frees the five arrays and zeroes the struct. */
void util_outputs_free(util_outputs *r);

/* The logical (contiguous) inputs of a problem: Q, K, V, dO (malloc'd) and the
 * element counts of Q, K, V, O (= dO) and LSE. util_inputs_free frees the four. */
typedef struct util_inputs {
    float *q, *k, *v, *dout;
    size_t nq, nk, nv, no, nl;
} util_inputs;
void util_inputs_free(util_inputs *in);

/* The float64 reference (o ... ds) and the naive fp32 yardstick (no ... nds) of a
 * forward + backward. util_refs_make: with dsinks != 0 also dsinks ([Hq], by
 * ref_backward_dsinks / naive32_backward_dsinks), else ds = nds = NULL. */
typedef struct util_refs {
    double *o, *lse, *dq, *dk, *dv, *ds;
    float *no, *nlse, *ndq, *ndk, *ndv, *nds;
} util_refs;
util_refs util_refs_make(const sdpa_problem *p, const util_inputs *in, int dsinks);
void util_refs_free(util_refs *R);
/* The FlashAttention rule (util_fa_expect) on the five outputs of res, 2x naive
 * for O and LSE, 3x for the gradients, and on ds[0..Hq) (3x) when ds != NULL;
 * messages "<what>: O" ... "<what>: dsinks". 1 if all pass. */
int util_refs_expect(const char *what, const util_outputs *res, const float *ds, const util_refs *R,
                     const util_inputs *in, size_t Hq);

/* 1 if a[0..n) and b[0..n) have the same bits (n = 0: 1). */
int util_same_bits(const float *a, const float *b, size_t n);
/* calloc of n (at least 1) floats / doubles, zero-filled; cr_assert on failure. */
float *util_falloc(size_t n);
double *util_dalloc(size_t n);
/* |got - ref| <= tol, NaN exactly where the reference is NaN, infinities equal. */
int util_close_tol(float got, double ref, double tol);
/* sdpa_forward of contiguous q, k, v into guarded o and lse with `isa` forced and
 * 2 threads; cr_assert that it returns SDPA_OK, cr_expect intact guards. */
void util_forward_contig(const sdpa_problem *p, sdpa_isa isa, const float *q, const float *k,
                         const float *v, float *o, float *lse);

/* sdpa_forward of contiguous q, k, v (sizes from p) into contiguous o and lse
 * as they are (no guards, p's ISA and threads); cr_assert that it returns SDPA_OK. */
void util_forward_plain(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                        float *lse);

/* A strided [B, H, T, D] buffer (guarded, util_galloc) with row stride D + pad,
 * the pad filled with `gap`: tb_in / tb_out view it, tb_at is row (b, h, i). */
typedef struct tbuf {
    int64_t B, H, T, D, pad;
    float *data;
    size_t n;
} tbuf;
tbuf tb_alloc(int64_t B, int64_t H, int64_t T, int64_t D, int64_t pad, float gap);
float *tb_at(const tbuf *t, int64_t b, int64_t h, int64_t i);
sdpa_tensor tb_in(const tbuf *t);
sdpa_tensor_out tb_out(const tbuf *t);
/* LSE as a [B, H, T] buffer with row stride 1 + pad. */
tbuf lse_alloc(int64_t B, int64_t H, int64_t T, int64_t pad, float gap);
/* 1 if every pad float of t still holds the bit pattern of `gap`. */
int tb_gaps_are(const tbuf *t, float gap);
void tb_free(tbuf *t);

#endif
