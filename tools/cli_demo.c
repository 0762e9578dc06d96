/* SPDX-License-Identifier: MIT */
/* tools/cli_demo.c - `sdpa info` (version, CPU features, ISAs, threads) and
 * `sdpa demo` (the worked example, then a timed causal prefill, both checked
 * against a float64 reference). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "config.h"

#if HAVE_OPENMP
#include <omp.h>
#endif

#ifndef SDPA_EXAMPLES_DIR
#define SDPA_EXAMPLES_DIR "examples"
#endif
#ifndef SDPA_INSTALLED_EXAMPLES_DIR
#define SDPA_INSTALLED_EXAMPLES_DIR SDPA_EXAMPLES_DIR
#endif

/* ------------------------------------------------------------ info */

int max_threads(void)
{
#if HAVE_OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static void print_isas(const char *label, int (*has)(sdpa_isa))
{
    static const sdpa_isa isas[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_AMX, SDPA_ISA_NEON};
    printf("%s", label);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (has(isas[i]))
            printf(" %s", sdpa_isa_name(isas[i]));
}

int cmd_info(int argc, char **argv)
{
    const char *rej;
    if (argc > 1) {
        if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
            printf("usage: sdpa info\n\nPrints the version, the CPU features detected, the ISAs compiled in "
                   "and supported,\nthe active ISA and the OpenMP threads.\n");
            return 0;
        }
        plain_error("'sdpa info' takes no arguments (got '%s')", argv[1]);
        fprintf(stderr, "usage: sdpa info\n");
        return EXIT_BAD;
    }
    printf("sdpa %s (library %s, header %d.%d.%d)\n", SDPA_VERSION_STRING, sdpa_version(), SDPA_VERSION_MAJOR,
           SDPA_VERSION_MINOR, SDPA_VERSION_PATCH);
    printf("cpu features: %s\n", *sdpa_cpu_features() ? sdpa_cpu_features() : "(none)");
    printf("tuning: %s\n", sdpa_tuning());
    print_isas("isa compiled:", sdpa_isa_compiled);
    print_isas("\nisa supported:", sdpa_isa_supported);
    printf("\nactive isa: %s\n", sdpa_isa_name(sdpa_isa_active()));
    {
        /* the ISA that runs each storage type: fp32 and fp16 on the active ISA's vector
         * kernels (amx: AVX-512's), bf16 prefill tiles on bf16 pair products where the
         * tuning turns them on (docs/design.md, "Reduced precision") */
        const sdpa_isa a = sdpa_isa_active();
        const sdpa_isa vec = a == SDPA_ISA_AMX ? SDPA_ISA_AVX512 : a;
        const char *f16 = vec == SDPA_ISA_AVX2 || vec == SDPA_ISA_AVX512 ? "F16C"
                          : vec == SDPA_ISA_NEON                        ? "FCVTL/FCVTN"
                                                                        : "C";
        const int pairs = sdpa_isa_bf16_pairs(a), bwd = sdpa_isa_bf16_pairs_backward(a), used = pairs || bwd;
        const char *products = a == SDPA_ISA_AMX    ? "AMX tdpbf16ps tile products"
                               : a == SDPA_ISA_NEON ? "BFMMLA pair products (whole 8 x 8 blocks; BFDOT the rest)"
                                                    : "AVX512-BF16 vdpbf16ps pair products";
        const int arm = sdpa_isa_compiled(SDPA_ISA_NEON);
        const char *unused = arm ? (used ? NULL : "BFDOT and BFMMLA are")
                             : a == SDPA_ISA_AMX && used ? "AMX-FP16 is"
                             : used                      ? "AMX is"
                                                         : "AVX512-BF16 and AMX are";
        printf("types: fp32 %s; bf16 %s (%s%s%swidened by integer shifts, fp32 products); fp16 %s (widened by %s, "
               "fp32 products)%s%s%s%s%s%s\n",
               sdpa_isa_name(vec), sdpa_isa_name(pairs ? a : vec),
               pairs ? "bf16 K/V with a bf16 or fp32 Q, prefill tiles: " : "", pairs ? products : "",
               pairs ? (a == SDPA_ISA_AVX512 ? ", P and an fp32 Q rounded to bf16; decode tiles of a bf16 Q: "
                                               "scores on vdpbf16ps, exact products; otherwise "
                                             : ", P and an fp32 Q rounded to bf16; otherwise ")
                     : "",
               sdpa_isa_name(vec), f16,
               bwd ? "; bf16 backward (bf16 Q, K/V and O), prefill tiles: " : "", bwd ? products : "",
               bwd ? ", P and dS rounded to bf16" : "", unused ? "; " : "", unused ? unused : "",
               unused ? " not used" : "");
    }
    rej = sdpa_isa_env_rejected();
    if (rej)
        printf("SDPA_ISA: '%s' rejected (not an ISA name for this architecture; ignored)\n", rej);
    else if (getenv("SDPA_ISA") && *getenv("SDPA_ISA"))
        printf("SDPA_ISA: '%s' (caps the choice)\n", getenv("SDPA_ISA"));
    else if (getenv("SDPA_ISA"))
        printf("SDPA_ISA: empty (as if not set)\n");
    else
        printf("SDPA_ISA: not set\n");
#if HAVE_OPENMP
    printf("openmp threads: %d\n", max_threads());
#else
    printf("openmp: not built (1 thread)\n");
#endif
    return 0;
}

/* ------------------------------------------------------------ demo helpers */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static const char *find_examples(const char *given, char *buf, size_t len)
{
    const char *cands[] = {given, "examples", "../examples", SDPA_EXAMPLES_DIR, SDPA_INSTALLED_EXAMPLES_DIR};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        if (!cands[i])
            continue;
        snprintf(buf, len, "%s/worked_example/Q.npy", cands[i]);
        if (file_exists(buf))
            return cands[i];
        if (given) /* an explicit --data is the only place looked at */
            return NULL;
    }
    return NULL;
}

/* float64 attention for one query row (b, h, i) of contiguous [B, H, T, D]
 * tensors; causal top-left if causal. */
static void ref_row(const float *q, const float *k, const float *v, int64_t Hq, int64_t Hkv, int64_t Tq,
                    int64_t Tk, int64_t D, int64_t Dv, double scale, int causal, int64_t b, int64_t h, int64_t i,
                    double *out, double *lse)
{
    const int64_t hk = h / (Hq / Hkv);
    const float *qi = q + ((b * Hq + h) * Tq + i) * D;
    const float *kb = k + (b * Hkv + hk) * Tk * D, *vb = v + (b * Hkv + hk) * Tk * Dv;
    const int64_t n = causal ? (i + 1 < Tk ? i + 1 : Tk) : Tk;
    double m = -INFINITY, l = 0;
    for (int64_t c = 0; c < Dv; c++)
        out[c] = 0;
    for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t c = 0; c < D; c++)
            s += (double)qi[c] * kb[j * D + c];
        s *= scale;
        if (s > m)
            m = s;
    }
    for (int64_t j = 0; j < n; j++) {
        double s = 0, e;
        for (int64_t c = 0; c < D; c++)
            s += (double)qi[c] * kb[j * D + c];
        e = exp(s * scale - m);
        l += e;
        for (int64_t c = 0; c < Dv; c++)
            out[c] += e * vb[j * Dv + c];
    }
    for (int64_t c = 0; c < Dv; c++)
        out[c] = l > 0 ? out[c] / l : 0;
    *lse = l > 0 ? m + log(l) : -INFINITY;
}

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 40) * (2.0 / 16777216.0) - 1.0); /* [-1, 1) */
}

/* ------------------------------------------------------------ demo: the worked example */

/* Loads Q, K, V, O_expected (all rank 2) of dir/worked_example into t[0..3]. */
static int load_worked(const char *dir, char path[4][1024], tensor t[4])
{
    static const char *const names[4] = {"Q", "K", "V", "O_expected"};
    int rc;
    for (int i = 0; i < 4; i++) {
        snprintf(path[i], sizeof path[i], "%s/worked_example/%s.npy", dir, names[i]);
        if ((rc = load_tensor(path[i], names[i], &t[i])))
            return rc;
    }
    if (t[0].a.ndim != 2 || t[1].a.ndim != 2 || t[2].a.ndim != 2 || t[3].a.ndim != 2 || t[0].d != t[1].d ||
        t[1].t != t[2].t || t[3].t != t[0].t || t[3].d != t[2].d) {
        file_error(dir, "worked example files do not fit each other");
        return EXIT_BAD;
    }
    if (t[0].t == 0 || t[3].d == 0) { /* nothing to compare: an "ok" would check nothing */
        file_error(dir, "the worked example has no %s", t[0].t == 0 ? "query rows" : "output columns");
        return EXIT_BAD;
    }
    return 0;
}

/* Prints O row by row; returns the largest differences from O_expected and
 * from the float64 reference (any Dv: until session 30 only Dv <= 64 was checked, and
 * a larger one printed 0; a reference row that cannot be allocated counts as inf). */
static void worked_errors(const tensor t[4], const float *o, double *maxerr, double *maxerr64)
{
    const int64_t Tq = t[0].t, Tk = t[1].t, D = t[0].d, Dv = t[2].d;
    const float *want = t[3].a.data;
    double *ref = malloc((size_t)(Dv > 0 ? Dv : 1) * sizeof *ref);
    if (!ref)
        *maxerr64 = INFINITY;
    printf("O =\n");
    for (int64_t i = 0; i < Tq; i++) {
        double lse;
        printf("  [");
        for (int64_t c = 0; c < Dv; c++)
            printf(" %9.6f", o[i * Dv + c]);
        printf(" ]\n");
        for (int64_t c = 0; c < Dv; c++) {
            double e = fabs((double)o[i * Dv + c] - want[i * Dv + c]);
            if (!(e <= *maxerr))
                *maxerr = e;
        }
        if (!ref)
            continue;
        ref_row(t[0].a.data, t[1].a.data, t[2].a.data, 1, 1, Tq, Tk, D, Dv, 1.0 / sqrt((double)D), 0, 0, 0, i,
                ref, &lse);
        for (int64_t c = 0; c < Dv; c++) {
            double e = fabs((double)o[i * Dv + c] - ref[c]);
            if (!(e <= *maxerr64))
                *maxerr64 = e;
        }
    }
    free(ref);
}

static int demo_worked(const char *dir, const cli_opts *opt, int *ok)
{
    char path[4][1024];
    tensor t[4];
    int rc;
    float *o = NULL;
    double maxerr = 0, maxerr64 = 0;
    memset(t, 0, sizeof t);
    if ((rc = load_worked(dir, path, t)))
        goto done;
    const int64_t Tq = t[0].t, Tk = t[1].t, D = t[0].d, Dv = t[2].d;
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = p.q_heads = p.kv_heads = 1;
    p.q_len = Tq;
    p.kv_len = Tk;
    p.head_dim_qk = D;
    p.head_dim_v = Dv;
    p.num_threads = opt->threads;
    p.isa = opt->isa;
    o = alloc_floats(t[3].size[0]); /* Tq * Dv, checked when O_expected was loaded */
    if (!o) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    const sdpa_tensor tq = tensor_view(&t[0]), tk = tensor_view(&t[1]), tv = tensor_view(&t[2]);
    const sdpa_tensor_out to = {o, t[3].size[0], t[3].size[0], Dv};
    sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, NULL);
    if (st != SDPA_OK) {
        rc = library_error(st);
        goto done;
    }
    printf("== worked example (%s/worked_example): Tq=%lld Tk=%lld Dk=%lld Dv=%lld, scale 1/sqrt(%lld) ==\n",
           dir, (long long)Tq, (long long)Tk, (long long)D, (long long)Dv, (long long)D);
    worked_errors(t, o, &maxerr, &maxerr64);
    const double tol = 1e-6;
    const int good = maxerr <= tol && maxerr64 <= tol;
    printf("max |O - O_expected.npy| = %.3g, max |O - float64 reference| = %.3g (tolerance %g): %s\n\n", maxerr,
           maxerr64, tol, good ? "ok" : "FAILED");
    if (!good)
        *ok = 0;
done:
    free(o);
    for (int i = 0; i < 4; i++)
        npy_free(&t[i].a);
    return rc;
}

/* ------------------------------------------------------------ demo: the causal prefill */

enum { PF_B = 1, PF_H = 8, PF_T = 1024, PF_D = 64, PF_SAMPLES = 64, PF_REPS = 3 };

/* A warm-up run (unless it is slow enough to be warm itself), then up to
 * PF_REPS timed runs, stopping after about a second: the demo stays quick. */
static sdpa_status time_prefill(const sdpa_problem *p, const sdpa_tensor *tq, const sdpa_tensor *tk,
                                const sdpa_tensor *tv, const sdpa_tensor_out *to, const sdpa_tensor_out *tl,
                                double *best, int *timed)
{
    double total = 0;
    *best = INFINITY;
    *timed = 0;
    for (int r = 0;; r++) {
        const double t0 = now_ms();
        const sdpa_status st = sdpa_forward(p, tq, tk, tv, to, tl);
        const double dt = now_ms() - t0;
        if (st != SDPA_OK)
            return st;
        if (r == 0 && dt < 250)
            continue;
        *best = dt < *best ? dt : *best;
        total += dt;
        if (++*timed >= PF_REPS || total > 1000)
            return SDPA_OK;
    }
}

/* Largest differences of O and LSE from the float64 reference over PF_SAMPLES rows. */
static void prefill_errors(const float *q, const float *k, const float *v, const float *o, const float *lse,
                           double *maxerr, double *maxlse)
{
    enum { H = PF_H, T = PF_T, D = PF_D };
    *maxerr = *maxlse = 0;
    for (int s = 0; s < PF_SAMPLES; s++) {
        const int64_t h = s % H, i = (int64_t)s * (T - 1) / (PF_SAMPLES - 1);
        double ref[D], rl;
        ref_row(q, k, v, H, H, T, T, D, D, 1.0 / sqrt((double)D), 1, 0, h, i, ref, &rl);
        for (int c = 0; c < D; c++) {
            double e = fabs((double)o[(h * T + i) * D + c] - ref[c]);
            if (!(e <= *maxerr))
                *maxerr = e;
        }
        double e = fabs((double)lse[h * T + i] - rl);
        if (!(e <= *maxlse))
            *maxlse = e;
    }
}

static void prefill_report(const cli_opts *opt, double maxerr, double maxlse, double best, int timed, int *ok)
{
    enum { B = PF_B, H = PF_H, T = PF_T, D = PF_D };
    const double pairs = (double)B * H * T * (T + 1) / 2.0;
    const double flops = 2.0 * pairs * (D + D);
    const int threads = opt->threads > 0 ? opt->threads : max_threads();
    const sdpa_isa isa = opt->isa == SDPA_ISA_AUTO ? sdpa_isa_active() : opt->isa;
    const double tol = 1e-4;
    const int good = maxerr <= tol && maxlse <= tol;
    printf("== causal prefill: B=%d H=%d T=%d D=%d (top-left), deterministic uniform inputs ==\n", B, H, T, D);
    printf("isa: %s, threads: %d\n", sdpa_isa_name(isa), threads);
    printf("max |O - float64 reference| over %d rows = %.3g, max |LSE - reference| = %.3g (tolerance %g): %s\n",
           PF_SAMPLES, maxerr, maxlse, tol, good ? "ok" : "FAILED");
    printf("time: %.3f ms (best of %d), %.2f GFLOP/s (%.3f GFLOP = 2 * %.0f pairs * (Dk + Dv))\n", best, timed,
           flops / (best * 1e6), flops * 1e-9, pairs);
    if (!good)
        *ok = 0;
}

static int demo_prefill(const cli_opts *opt, int *ok)
{
    enum { B = PF_B, H = PF_H, T = PF_T, D = PF_D };
    const size_t n = (size_t)B * H * T * D;
    float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    float *o = malloc(n * sizeof(float)), *lse = malloc((size_t)B * H * T * sizeof(float));
    uint64_t seed = 20240601;
    int rc = 0, timed;
    double best, maxerr, maxlse;
    if (!q || !k || !v || !o || !lse) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        q[i] = rng_uniform(&seed);
        k[i] = rng_uniform(&seed);
        v[i] = rng_uniform(&seed);
    }
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = B;
    p.q_heads = p.kv_heads = H;
    p.q_len = p.kv_len = T;
    p.head_dim_qk = p.head_dim_v = D;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    p.num_threads = opt->threads;
    p.isa = opt->isa;
    const sdpa_tensor tq = {q, H * T * D, T * D, D}, tk = {k, H * T * D, T * D, D}, tv = {v, H * T * D, T * D, D};
    const sdpa_tensor_out to = {o, H * T * D, T * D, D}, tl = {lse, H * T, T, 1};
    const sdpa_status st = time_prefill(&p, &tq, &tk, &tv, &to, &tl, &best, &timed);
    if (st != SDPA_OK) {
        rc = library_error(st);
        goto done;
    }
    prefill_errors(q, k, v, o, lse, &maxerr, &maxlse);
    prefill_report(opt, maxerr, maxlse, best, timed, ok);
done:
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    return rc;
}

/* ------------------------------------------------------------ demo */

int cmd_demo(int argc, char **argv)
{
    cli_opts opt;
    int rc, help, ok = 1;
    char buf[1024];
    const char *dir;
    if ((rc = parse_options(CMD_DEMO, argc, argv, &opt, &help)))
        return rc;
    if (help) {
        print_help(CMD_DEMO);
        return 0;
    }
    dir = find_examples(opt.data_dir, buf, sizeof buf);
    if (!dir) {
        if (opt.data_dir)
            file_error(opt.data_dir, "no worked_example/Q.npy here");
        else
            plain_error("cannot find the examples directory (looked in ./examples, ../examples, %s, %s); "
                        "use --data DIR",
                        SDPA_EXAMPLES_DIR, SDPA_INSTALLED_EXAMPLES_DIR);
        return EXIT_BAD;
    }
    if (sdpa_isa_env_rejected())
        printf("note: SDPA_ISA='%s' is not an ISA name; ignored\n", sdpa_isa_env_rejected());
    if ((rc = demo_worked(dir, &opt, &ok)))
        return rc;
    if ((rc = demo_prefill(&opt, &ok)))
        return rc;
    printf("demo: %s\n", ok ? "ok" : "FAILED");
    fflush(stdout);
    return ok ? 0 : 1;
}
