/* SPDX-License-Identifier: MIT */
/* bench/ab.c - sdpa-ab: two builds (or two block configurations) of libsdpa timed
 * call by call in one process.
 *
 * On a shared machine whose speed drifts by tens of per cent between runs a minute
 * apart, two separate benchmark processes cannot tell a 5% change from the drift.
 * sdpa-ab loads the two shared libraries with dlopen (RTLD_LOCAL: each keeps its
 * own symbols and dispatch table) and alternates their calls round by round,
 * swapping which goes first every round, so that both see the same machine; it
 * reports each side's median time and the median and quartiles of the per-round
 * ratios time_A / time_B (above 1: B is faster). The same library may be given
 * twice with different --blocks-a / --blocks-b, and a library against itself
 * measures the harness's own spread.
 *
 *   sdpa-ab LIB_A LIB_B --shape B,Hq,Hkv,Tq,Tk,D [--causal] [--backward] [--isa NAME]
 *           [--threads N] [--rounds N] [--inner N] [--blocks-a BQ,BK] [--blocks-b BQ,BK]
 *           [--dtype fp32|bf16|fp16] [--kv-dtype fp32|bf16|fp16] [--flush]
 *
 * --flush evicts every buffer of the call from the caches before each timed call (untimed:
 * clflush on x86, dc civac on aarch64, each line of Q, K, V, O, LSE and, for the
 * backward, dQ, dK, dV), as `sdpa bench` does before its decode rows: the A/B of a
 * memory-bound call (decode) as it runs when its K/V come from memory; with it, --inner
 * must be 1.
 *
 * Inputs are uniform in [-0.5, 0.5), [B, H, T, D] contiguous, Dk = Dv = D, every
 * tensor but LSE stored in --dtype's type, K and V (and dK, dV) in --kv-dtype's where
 * given (a float32 model over a 16-bit cache; 16-bit values truncated from fp32); the
 * backward takes dO = Q's values and the forward's O and LSE. Both builds must take
 * this tree's sdpa_problem (a build with another layout refuses it: the error says
 * so). Buffers of more than half the machine's memory are refused. Exit status 0;
 * 1 on a library error, a library that does not load, or a shape too large; 2 on
 * bad arguments (with the reason and the usage text). */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sdpa.h"

#include "cache_flush.h"

typedef void (*init_fn)(sdpa_problem *);
typedef const char *(*status_fn)(sdpa_status);
typedef int (*isa_name_fn)(const char *, sdpa_isa *);
typedef sdpa_status (*fwd_fn)(const sdpa_problem *, const sdpa_tensor *, const sdpa_tensor *,
                              const sdpa_tensor *, const sdpa_tensor_out *, const sdpa_tensor_out *);
typedef sdpa_status (*bwd_fn)(const sdpa_problem *, const sdpa_tensor *, const sdpa_tensor *,
                              const sdpa_tensor *, const sdpa_tensor *, const sdpa_tensor *,
                              const sdpa_tensor *, const sdpa_tensor_out *, const sdpa_tensor_out *,
                              const sdpa_tensor_out *);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "sdpa-ab: %s\n", why);
    fprintf(stderr, "usage: sdpa-ab LIB_A LIB_B --shape B,Hq,Hkv,Tq,Tk,D [--causal] [--backward] [--threads N]\n"
                    "               [--isa NAME] [--rounds N] [--inner N] [--blocks-a BQ,BK] [--blocks-b BQ,BK]\n"
                    "               [--dtype fp32|bf16|fp16] [--kv-dtype fp32|bf16|fp16] [--flush]\n"
                    "  --isa NAME   both sides' calls on that ISA (scalar, avx2, avx512, amx, neon; default: each\n"
                    "               library's choice)\n"
                    "  --threads N  OpenMP threads per call, 0 = OpenMP's default (default 1)\n"
                    "  --rounds N   rounds, each timing A and B once, in alternating order (default 31, at most 100000)\n"
                    "  --inner N    calls per timing (default 1, at most 100000)\n"
                    "  --blocks-a / --blocks-b BQ,BK  block_q, block_k of A's / B's calls (default 0,0: the library's)\n"
                    "  --dtype T    fp32 (default), bf16 or fp16: the type of Q, O, dO, dQ, and of K, V,\n"
                    "               dK, dV unless --kv-dtype is given\n"
                    "  --kv-dtype T the type of K and V (and dK, dV) alone (default: --dtype's): a float32\n"
                    "               model over a bf16 or fp16 cache, or 16-bit queries over another cache type\n"
                    "  --flush      every buffer of the call evicted from the caches before each timed call\n"
                    "               (untimed; with --inner 1 only)\n");
    return 2;
}

/* The --dtype spelling of a type. */
static const char *dtype_name(sdpa_dtype d)
{
    return d == SDPA_DTYPE_BF16 ? "bf16" : d == SDPA_DTYPE_F16 ? "fp16" : "fp32";
}

/* A whole decimal integer in [lo, hi]; 0 when it is not. */
static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* "a,b,..." with exactly n whole integers in [lo, hi]; 0 when it is not. */
static int parse_list(const char *s, int n, long long lo, long long hi, long long *out)
{
    char buf[256];
    if (strlen(s) >= sizeof buf)
        return 0;
    strcpy(buf, s);
    char *save = NULL, *tok = strtok_r(buf, ",", &save);
    int k = 0;
    for (; tok; tok = strtok_r(NULL, ",", &save), k++)
        if (k >= n || !parse_int(tok, lo, hi, &out[k]))
            return 0;
    return k == n;
}

/* 64-byte aligned, as PyTorch's and NumPy's allocators give (the library's
 * non-temporal dK, dV stores need it; glibc's malloc of a large buffer is 16 bytes
 * off a line). */
static float *uniform(size_t n, unsigned *seed)
{
    float *p = aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) / 64 * 64);
    for (size_t i = 0; p && i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)(*seed >> 8) * 0x1p-24f - 0.5f;
    }
    return p;
}

/* x[0..n) rewritten in place as n 16-bit values (bf16: the top half of each fp32;
 * fp16: sign, exponent and the top 10 fraction bits, |x| < 2^-14 to zero): inputs to
 * time, not to check. */
static void to_half(float *x, size_t n, int bf16)
{
    uint16_t *h = (uint16_t *)(void *)x;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        const int e = (int)((u >> 23) & 0xff) - 127;
        h[i] = bf16 ? (uint16_t)(u >> 16)
                    : (uint16_t)(((u >> 16) & 0x8000u) | (e < -14 ? 0u : ((uint32_t)(e + 15) << 10) | ((u >> 13) & 0x3ffu)));
    }
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return usage(NULL);
    long long s[6] = {0}, num, blocks[2][2] = {{0, 0}, {0, 0}};
    int causal = 0, backward = 0, threads = 1, rounds = 31, inner = 1, have_shape = 0, flush = 0;
    sdpa_dtype dtype = SDPA_DTYPE_F32, kv_dtype = SDPA_DTYPE_F32;
    int have_kv_dtype = 0;
    const char *isa_name = NULL;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--causal")) {
            causal = 1;
        } else if (!strcmp(a, "--backward")) {
            backward = 1;
        } else if (!strcmp(a, "--flush")) {
            flush = 1;
        } else if (val && !strcmp(a, "--shape")) {
            if (!parse_list(val, 6, 1, 1 << 20, s))
                return usage("--shape: six whole numbers B,Hq,Hkv,Tq,Tk,D, each in 1..2^20 (Dk = Dv = D)");
            have_shape = 1, i++;
        } else if (val && (!strcmp(a, "--dtype") || !strcmp(a, "--kv-dtype"))) {
            const int kv = a[2] == 'k';
            sdpa_dtype *d = kv ? &kv_dtype : &dtype;
            if (!strcmp(val, "fp32"))
                *d = SDPA_DTYPE_F32;
            else if (!strcmp(val, "bf16"))
                *d = SDPA_DTYPE_BF16;
            else if (!strcmp(val, "fp16"))
                *d = SDPA_DTYPE_F16;
            else
                return usage(kv ? "--kv-dtype: fp32, bf16 or fp16" : "--dtype: fp32, bf16 or fp16");
            have_kv_dtype |= kv, i++;
        } else if (val && !strcmp(a, "--threads")) {
            if (!parse_int(val, 0, 4096, &num))
                return usage("--threads: a whole number in 0..4096");
            threads = (int)num, i++;
        } else if (val && !strcmp(a, "--isa")) {
            isa_name = val, i++;
        } else if (val && !strcmp(a, "--rounds")) {
            if (!parse_int(val, 1, 100000, &num))
                return usage("--rounds: a whole number in 1..100000");
            rounds = (int)num, i++;
        } else if (val && !strcmp(a, "--inner")) {
            if (!parse_int(val, 1, 100000, &num))
                return usage("--inner: a whole number in 1..100000");
            inner = (int)num, i++;
        } else if (val && (!strcmp(a, "--blocks-a") || !strcmp(a, "--blocks-b"))) {
            if (!parse_list(val, 2, 0, SDPA_MAX_BLOCK, blocks[a[9] == 'b']))
                return usage("--blocks-a / --blocks-b: BQ,BK, two whole numbers in [0, SDPA_MAX_BLOCK] "
                             "(0: the library's)");
            i++;
        } else {
            fprintf(stderr, "sdpa-ab: unknown or incomplete option '%s'\n", a);
            return usage(NULL);
        }
    }
    if (!have_shape)
        return usage("--shape is required");
    if (!have_kv_dtype)
        kv_dtype = dtype;
    if (flush && inner != 1)
        return usage("--flush times one call per timing: --inner must be 1");
    if (flush && !cache_flush_lines(0, NULL, NULL))
        return usage("--flush: this build has no cache-line flush for its CPU");
    if (s[1] % s[2])
        return usage("--shape: Hq must be a multiple of Hkv");
    /* the buffers: Q, O, dQ (B Hq Tq D each), K, V, dK, dV (B Hkv Tk D each), LSE (B Hq Tq) */
    const double floats = 3.0 * (double)s[0] * (double)s[1] * (double)s[3] * (double)s[5] +
                          4.0 * (double)s[0] * (double)s[2] * (double)s[4] * (double)s[5] +
                          (double)s[0] * (double)s[1] * (double)s[3];
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double mem = pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
    if (floats * sizeof(float) > 0x1p46 || (mem > 0.0 && floats * sizeof(float) > 0.5 * mem)) {
        fprintf(stderr, "sdpa-ab: the shape needs %.3g GiB of buffers (more than half of this machine's memory)\n",
                floats * sizeof(float) / 0x1p30);
        return 1;
    }

    init_fn init[2];
    fwd_fn fwd[2];
    bwd_fn bwd[2];
    status_fn why[2];
    isa_name_fn isa_of[2];
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "sdpa-ab: %s\n", dlerror());
            return 1;
        }
        init[i] = (init_fn)dlsym(h, "sdpa_problem_init");
        fwd[i] = (fwd_fn)dlsym(h, "sdpa_forward");
        bwd[i] = (bwd_fn)dlsym(h, "sdpa_backward");
        why[i] = (status_fn)dlsym(h, "sdpa_status_string");
        isa_of[i] = (isa_name_fn)dlsym(h, "sdpa_isa_from_name");
        if (!init[i] || !fwd[i] || !bwd[i] || !why[i] || !isa_of[i]) {
            fprintf(stderr, "sdpa-ab: %s is not libsdpa\n", argv[1 + i]);
            return 1;
        }
    }
    const long long B = s[0], Hq = s[1], Hkv = s[2], Tq = s[3], Tk = s[4], D = s[5];
    const size_t nq = (size_t)(B * Hq * Tq * D), nk = (size_t)(B * Hkv * Tk * D);
    unsigned seed = 1;
    float *q = uniform(nq, &seed), *k = uniform(nk, &seed), *v = uniform(nk, &seed), *o = uniform(nq, &seed),
          *dq = uniform(nq, &seed), *dk = uniform(nk, &seed), *dv = uniform(nk, &seed),
          *lse = uniform((size_t)(B * Hq * Tq), &seed);
    { /* a 16-bit buffer's first half now holds its values */
        float *const bufs[7] = {q, k, v, o, dq, dk, dv};
        const size_t lens[7] = {nq, nk, nk, nq, nq, nk, nk};
        for (int b = 0; b < 7; b++) {
            const sdpa_dtype d = (b == 1 || b == 2 || b == 5 || b == 6) ? kv_dtype : dtype;
            if (bufs[b] && d != SDPA_DTYPE_F32)
                to_half(bufs[b], lens[b], d == SDPA_DTYPE_BF16);
        }
    }
    double *t[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)},
           *ratio = malloc(sizeof(double) * (size_t)rounds);
    void *const owned[] = {q, k, v, o, dq, dk, dv, lse, t[0], t[1], ratio};
#define AB_RETURN(rc)                                                                              \
    do {                                                                                           \
        for (size_t b_ = 0; b_ < sizeof owned / sizeof owned[0]; b_++)                             \
            free(owned[b_]);                                                                       \
        return (rc);                                                                               \
    } while (0)
    if (!q || !k || !v || !o || !dq || !dk || !dv || !lse || !t[0] || !t[1] || !ratio) {
        fprintf(stderr, "sdpa-ab: out of memory\n");
        AB_RETURN(1);
    }
    const sdpa_tensor tq = {q, Hq * Tq * D, Tq * D, D}, tk = {k, Hkv * Tk * D, Tk * D, D},
                      tv = {v, Hkv * Tk * D, Tk * D, D}, co = {o, Hq * Tq * D, Tq * D, D},
                      cl = {lse, Hq * Tq, Tq, 1};
    const sdpa_tensor_out to = {o, Hq * Tq * D, Tq * D, D}, tl = {lse, Hq * Tq, Tq, 1},
                          tdq = {dq, Hq * Tq * D, Tq * D, D}, tdk = {dk, Hkv * Tk * D, Tk * D, D},
                          tdv = {dv, Hkv * Tk * D, Tk * D, D};
    sdpa_problem p[2];
    for (int i = 0; i < 2; i++) {
        init[i](&p[i]);
        p[i].batch = B, p[i].q_heads = Hq, p[i].kv_heads = Hkv, p[i].q_len = Tq, p[i].kv_len = Tk;
        p[i].head_dim_qk = p[i].head_dim_v = D;
        p[i].num_threads = threads;
        p[i].q_dtype = p[i].o_dtype = dtype;
        p[i].kv_dtype = kv_dtype;
        p[i].causal = causal ? SDPA_CAUSAL_TOP_LEFT : SDPA_CAUSAL_NONE;
        p[i].block_q = blocks[i][0], p[i].block_k = blocks[i][1];
        if (isa_name && isa_of[i](isa_name, &p[i].isa) != 0) {
            char why_isa[128];
            snprintf(why_isa, sizeof why_isa, "--isa '%.40s': not an ISA name (scalar, avx2, avx512, amx, neon)",
                     isa_name);
            usage(why_isa);
            AB_RETURN(2);
        }
        sdpa_status st = fwd[i](&p[i], &tq, &tk, &tv, &to, &tl); /* warm-up; O and LSE for the backward */
        if (st == SDPA_OK && backward)
            st = bwd[i](&p[i], &tq, &tk, &tv, &co, &cl, &tq, &tdq, &tdk, &tdv);
        if (st != SDPA_OK) {
            fprintf(stderr, "sdpa-ab: %s refused the problem: %s%s\n", argv[1 + i], why[i](st),
                    st == SDPA_ERR_BAD_DESCRIPTOR ? " (a build whose sdpa_problem differs from this tool's header?)" : "");
            AB_RETURN(1);
        }
    }
    /* what a call reads or writes, in bytes (16-bit buffers: their first half) */
    const size_t eb = dtype == SDPA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t),
                 ekv = kv_dtype == SDPA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    const void *const bufs[8] = {q, k, v, o, lse, dq, dk, dv};
    const size_t bytes[8] = {nq * eb, nk * ekv, nk * ekv, nq * eb, (size_t)(B * Hq * Tq) * sizeof(float),
                             nq * eb, nk * ekv, nk * ekv};
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < 2; j++) {
            const int i = (r & 1) ? 1 - j : j;
            if (flush)
                cache_flush_lines(backward ? 8 : 5, bufs, bytes);
            const double t0 = now();
            for (int n = 0; n < inner; n++)
                if (backward)
                    bwd[i](&p[i], &tq, &tk, &tv, &co, &cl, &tq, &tdq, &tdk, &tdv);
                else
                    fwd[i](&p[i], &tq, &tk, &tv, &to, NULL);
            t[i][r] = (now() - t0) / inner;
        }
    for (int r = 0; r < rounds; r++)
        ratio[r] = t[0][r] / t[1][r];
    qsort(ratio, (size_t)rounds, sizeof(double), cmp_double);
    qsort(t[0], (size_t)rounds, sizeof(double), cmp_double);
    qsort(t[1], (size_t)rounds, sizeof(double), cmp_double);
    double pairs = 0.0; /* allowed (query, key) pairs, as sdpa bench counts them */
    for (long long i = 0; i < Tq; i++)
        pairs += (double)(causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk);
    pairs *= (double)(B * Hq);
    const double flops = 2.0 * pairs * (double)D * (backward ? 5.0 : 2.0);
    printf("A %.4g ms (%.4g GFLOP/s)  B %.4g ms (%.4g GFLOP/s)  A/B per round: median %.3f [q1 %.3f, q3 %.3f], "
           "%d rounds, dtype %s, kv-dtype %s\n",
           t[0][rounds / 2] * 1e3, flops / t[0][rounds / 2] * 1e-9, t[1][rounds / 2] * 1e3,
           flops / t[1][rounds / 2] * 1e-9, ratio[rounds / 2], ratio[rounds / 4], ratio[3 * rounds / 4], rounds,
           dtype_name(dtype), dtype_name(kv_dtype));
    AB_RETURN(0);
#undef AB_RETURN
}
