/* SPDX-License-Identifier: MIT */
/* tests/test_cli_dtype.c - the sdpa CLI's storage types (issue 16, item 3):
 * --dtype fp32|bf16|fp16 and --kv-dtype, float16 ('<f2') .npy inputs, float16
 * outputs for --dtype fp16, `sdpa bench --dtype`.
 *
 * The tool runs as a child process (posix_spawn of SDPA_CLI_PATH) on .npy files
 * written here. Its results are compared bit for bit with the library called in
 * this test's process on the same inputs, rounded to the 16-bit types by the
 * conversions below (written here, independent of src/dtype.h and tools/), with
 * one thread and the same ISA choice (SDPA_ISA is inherited), and loosely
 * against a float64 reference (tests/ref.c) of the rounded inputs. No timing is
 * asserted. */
#include "sdpa.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ref.h"

#ifndef SDPA_CLI_PATH
#error "SDPA_CLI_PATH must name the built sdpa binary"
#endif

extern char **environ;

/* ------------------------------------------------------------ temp dir, running the tool */

static char g_dir[64];

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0)
            rm_tree(p);
    }
    closedir(d);
    rmdir(dir);
}

static void setup(void)
{
    strcpy(g_dir, "/tmp/sdpa-cli-dtype-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void teardown(void)
{
    rm_tree(g_dir);
}

TestSuite(cli_dtype, .init = setup, .fini = teardown, .timeout = 300);

/* A path in the test directory; the same name gives the same pointer. */
static const char *P(const char *name)
{
    static char paths[64][512];
    static int used;
    char want[512];
    snprintf(want, sizeof want, "%s/%s", g_dir, name);
    for (int i = 0; i < used; i++)
        if (strcmp(paths[i], want) == 0)
            return paths[i];
    cr_assert_lt(used, 64);
    strcpy(paths[used], want);
    return paths[used++];
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

typedef struct run_result {
    int status;
    char out[32768];
    char err[8192];
} run_result;

static void slurp(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "rb");
    size_t n = 0;
    if (f) {
        n = fread(buf, 1, len - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
}

/* Runs the tool with args (NULL-terminated, without argv[0]). */
static run_result *run(const char *const *args)
{
    static run_result r;
    const char *argv[64];
    char outp[128], errp[128];
    int n = 0;
    pid_t pid;
    posix_spawn_file_actions_t fa;
    argv[n++] = SDPA_CLI_PATH;
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(n, 62);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    snprintf(outp, sizeof outp, "%s/stdout", g_dir);
    snprintf(errp, sizeof errp, "%s/stderr", g_dir);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(posix_spawn(&pid, SDPA_CLI_PATH, &fa, NULL, (char *const *)argv, environ), 0, "cannot spawn %s",
                 SDPA_CLI_PATH);
    posix_spawn_file_actions_destroy(&fa);
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    slurp(outp, r.out, sizeof r.out);
    slurp(errp, r.err, sizeof r.err);
    unlink(outp);
    unlink(errp);
    return &r;
}

/* ------------------------------------------------------------ 16-bit conversions (independent of the library) */

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* bf16 of a finite float, round to nearest even (carry into the exponent included). */
static uint16_t to_bf16(float x)
{
    const uint32_t u = f32_bits(x);
    const uint32_t low = u & 0xffffu, hi = u >> 16;
    return (uint16_t)(hi + (low > 0x8000u || (low == 0x8000u && (hi & 1u))));
}

static float from_bf16(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

/* binary16 of a finite float below 65504 in magnitude, round to nearest even
 * (rint() in the default rounding mode), subnormals included. */
static uint16_t to_f16(float x)
{
    const uint16_t sign = signbit(x) ? 0x8000u : 0u;
    const double a = fabs((double)x);
    int e;
    if (a == 0.0)
        return sign;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int E = e - 1;
    if (E < -14) /* subnormal: units of 2^-24 (1024 units is the smallest normal, encoded alike) */
        return (uint16_t)(sign | (uint16_t)rint(a * 0x1p24));
    double q = rint(ldexp(a, 10 - E)); /* 1024..2048 */
    if (q == 2048.0)
        q = 1024.0, E++;
    cr_assert_leq(E, 15, "to_f16: %g is beyond fp16", (double)x);
    return (uint16_t)(sign | (uint16_t)((E + 15) << 10) | (uint16_t)((int)q - 1024));
}

static float from_f16(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (float)((h & 0x8000u) ? -v : v);
}

/* ------------------------------------------------------------ .npy files (independent of tools/npy.c) */

static void write_npy(const char *path, const char *descr, size_t elsize, int ndim, const int64_t *shape,
                      const void *data)
{
    char dict[256], sh[128];
    size_t n = (size_t)snprintf(sh, sizeof sh, "("), count = 1;
    for (int i = 0; i < ndim; i++) {
        n += (size_t)snprintf(sh + n, sizeof sh - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
        count *= (size_t)shape[i];
    }
    snprintf(sh + n, sizeof sh - n, ndim == 1 ? ",)" : ")");
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, sh);
    const size_t dlen = strlen(dict), total = (10 + dlen + 1 + 63) / 64 * 64, hl = total - 10;
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    cr_assert_eq(fwrite(pre, 1, 10, f), 10);
    cr_assert_eq(fwrite(dict, 1, dlen, f), dlen);
    for (size_t i = 10 + dlen; i + 1 < total; i++)
        fputc(' ', f);
    fputc('\n', f);
    cr_assert_eq(fwrite(data, elsize, count, f), count);
    cr_assert_eq(fclose(f), 0);
}

/* A .npy written by the tool (version 1.0): its descr (e.g. "<f4"), shape and data. */
typedef struct npy_file {
    char descr[16];
    int ndim;
    int64_t shape[8];
    size_t count;
    void *data;
} npy_file;

static void read_npy(const char *path, npy_file *a)
{
    FILE *f = fopen(path, "rb");
    unsigned char pre[10];
    memset(a, 0, sizeof *a);
    cr_assert_not_null(f, "cannot open %s", path);
    cr_assert_eq(fread(pre, 1, 10, f), 10);
    cr_assert(memcmp(pre, "\x93NUMPY\x01\x00", 8) == 0, "%s: not a version 1.0 .npy", path);
    const size_t hl = (size_t)pre[8] | (size_t)pre[9] << 8;
    char *hdr = calloc(1, hl + 1);
    cr_assert_eq(fread(hdr, 1, hl, f), hl);
    const char *d = strstr(hdr, "'descr': '");
    cr_assert_not_null(d, "%s: %s", path, hdr);
    d += strlen("'descr': '");
    size_t dl = strcspn(d, "'");
    cr_assert_lt(dl, sizeof a->descr);
    memcpy(a->descr, d, dl);
    cr_assert_not_null(strstr(hdr, "'fortran_order': False"));
    const char *s = strstr(hdr, "'shape': (");
    cr_assert_not_null(s);
    s += strlen("'shape': (");
    a->count = 1;
    while (*s != ')') {
        char *end;
        const long long v = strtoll(s, &end, 10);
        cr_assert(end != s && a->ndim < 8, "%s: bad shape in %s", path, hdr);
        a->shape[a->ndim++] = v;
        a->count *= (size_t)v;
        s = end;
        while (*s == ',' || *s == ' ')
            s++;
    }
    free(hdr);
    const size_t es = strcmp(a->descr, "<f2") == 0 ? 2 : 4;
    a->data = malloc(a->count * es + 1);
    cr_assert_eq(fread(a->data, es, a->count, f), a->count, "%s: short data", path);
    cr_assert_eq(fgetc(f), EOF, "%s: trailing bytes", path);
    fclose(f);
}

/* ------------------------------------------------------------ the problem */

/* Q (B, Hq, Tq, Dk), K (B, Hkv, Tk, Dk), V (B, Hkv, Tk, Dv), causal bottom-right. */
enum { B = 2, HQ = 4, HKV = 2, TQ = 5, TK = 9, DK = 16, DV = 8 };
enum { NQ = B * HQ * TQ * DK, NK = B * HKV * TK * DK, NV = B * HKV * TK * DV, NO = B * HQ * TQ * DV, NL = B * HQ * TQ };
static const int64_t SQ[4] = {B, HQ, TQ, DK}, SK[4] = {B, HKV, TK, DK}, SV[4] = {B, HKV, TK, DV},
                     SO[4] = {B, HQ, TQ, DV}, SL[3] = {B, HQ, TQ};

static uint64_t g_seed = 0x5eed16;

/* Uniform in [-2, 2): most values need more bits than bf16 or fp16 keep. */
static float frand(void)
{
    uint64_t z = (g_seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 4194304.0 - 2.0);
}

typedef struct inputs {
    float q[NQ], k[NK], v[NV];
} inputs;

static void make_inputs(inputs *in)
{
    for (int i = 0; i < NQ; i++)
        in->q[i] = frand();
    for (int i = 0; i < NK; i++)
        in->k[i] = frand();
    for (int i = 0; i < NV; i++)
        in->v[i] = frand();
}

static void write_f32_inputs(const inputs *in)
{
    write_npy(P("Q.npy"), "<f4", 4, 4, SQ, in->q);
    write_npy(P("K.npy"), "<f4", 4, 4, SK, in->k);
    write_npy(P("V.npy"), "<f4", 4, 4, SV, in->v);
}

/* n floats stored as dt (a new buffer). */
static void *store_as(const float *x, int n, sdpa_dtype dt)
{
    if (dt == SDPA_DTYPE_F32) {
        float *y = malloc((size_t)n * sizeof *y);
        memcpy(y, x, (size_t)n * sizeof *y);
        return y;
    }
    uint16_t *h = malloc((size_t)n * sizeof *h);
    for (int i = 0; i < n; i++)
        h[i] = dt == SDPA_DTYPE_BF16 ? to_bf16(x[i]) : to_f16(x[i]);
    return h;
}

/* n elements of type dt as floats (exact). */
static float *widen(const void *x, int n, sdpa_dtype dt)
{
    float *y = malloc((size_t)n * sizeof *y + 1);
    for (int i = 0; i < n; i++)
        y[i] = dt == SDPA_DTYPE_F32    ? ((const float *)x)[i]
               : dt == SDPA_DTYPE_BF16 ? from_bf16(((const uint16_t *)x)[i])
                                       : from_f16(((const uint16_t *)x)[i]);
    return y;
}

static sdpa_problem problem(sdpa_dtype qd, sdpa_dtype kvd)
{
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = B, p.q_heads = HQ, p.kv_heads = HKV, p.q_len = TQ, p.kv_len = TK;
    p.head_dim_qk = DK, p.head_dim_v = DV;
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.num_threads = 1;
    p.q_dtype = p.o_dtype = qd;
    p.kv_dtype = kvd;
    return p;
}

static sdpa_tensor view(const void *d, int64_t H, int64_t T, int64_t D)
{
    return (sdpa_tensor){d, H * T * D, T * D, D};
}

static sdpa_tensor_out view_out(void *d, int64_t H, int64_t T, int64_t D)
{
    return (sdpa_tensor_out){d, H * T * D, T * D, D};
}

/* The library's forward of the inputs rounded to (qd, kvd), in this process:
 * O as floats (widened exactly from qd) and LSE. */
static void library_forward(const inputs *in, sdpa_dtype qd, sdpa_dtype kvd, float *o, float *lse)
{
    const sdpa_problem p = problem(qd, kvd);
    void *q = store_as(in->q, NQ, qd), *k = store_as(in->k, NK, kvd), *v = store_as(in->v, NV, kvd);
    void *ot = malloc((size_t)NO * 4);
    const sdpa_tensor tq = view(q, HQ, TQ, DK), tk = view(k, HKV, TK, DK), tv = view(v, HKV, TK, DV);
    const sdpa_tensor_out to = view_out(ot, HQ, TQ, DV), tl = {lse, HQ * TQ, TQ, 1};
    const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
    cr_assert_eq(st, SDPA_OK, "sdpa_forward (q %d, kv %d): %s", (int)qd, (int)kvd, sdpa_status_string(st));
    float *w = widen(ot, NO, qd);
    memcpy(o, w, (size_t)NO * sizeof *o);
    free(w), free(ot), free(q), free(k), free(v);
}

/* The float64 reference of the inputs rounded to (qd, kvd), causal bottom-right. */
static void reference(const inputs *in, sdpa_dtype qd, sdpa_dtype kvd, double *o, double *lse)
{
    const sdpa_problem p = problem(SDPA_DTYPE_F32, SDPA_DTYPE_F32); /* of the widened values */
    void *q = store_as(in->q, NQ, qd), *k = store_as(in->k, NK, kvd), *v = store_as(in->v, NV, kvd);
    float *qf = widen(q, NQ, qd), *kf = widen(k, NK, kvd), *vf = widen(v, NV, kvd);
    ref_forward(&p, qf, kf, vf, o, lse);
    free(qf), free(kf), free(vf), free(q), free(k), free(v);
}

/* The tool's O file: its descr, shape (B, Hq, Tq, Dv) and values as floats. */
static void read_output(const char *path, const char *want_descr, float *o)
{
    npy_file a;
    read_npy(path, &a);
    cr_assert_str_eq(a.descr, want_descr, "%s: dtype '%s', expected '%s'", path, a.descr, want_descr);
    cr_assert_eq(a.ndim, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(a.shape[i], SO[i]);
    float *w = widen(a.data, NO, strcmp(want_descr, "<f2") == 0 ? SDPA_DTYPE_F16 : SDPA_DTYPE_F32);
    memcpy(o, w, (size_t)NO * sizeof *o);
    free(w);
    free(a.data);
}

static void read_lse(const char *path, float *lse)
{
    npy_file a;
    read_npy(path, &a);
    cr_assert_str_eq(a.descr, "<f4", "%s: LSE dtype '%s', expected '<f4'", path, a.descr);
    cr_assert_eq(a.ndim, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(a.shape[i], SL[i]);
    memcpy(lse, a.data, (size_t)NL * sizeof *lse);
    free(a.data);
}

static void expect_same_bits(const char *what, const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++)
        cr_assert(f32_bits(got[i]) == f32_bits(want[i]), "%s[%d]: the tool wrote %.9g, the library gives %.9g", what,
                  i, (double)got[i], (double)want[i]);
}

static void expect_near(const char *what, const float *got, const double *want, int n, double tol)
{
    for (int i = 0; i < n; i++)
        cr_assert(fabs((double)got[i] - want[i]) <= tol, "%s[%d] = %.9g, float64 reference %.9g (tol %g)", what, i,
                  (double)got[i], want[i], tol);
}

/* Runs `sdpa forward` on Q/K/V.npy with extra options; O.npy, LSE.npy written. */
static void tool_forward(const char *const *extra)
{
    const char *args[40] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                            "--lse", P("LSE.npy"), "--causal", "bottom-right", "--threads", "1"};
    int n = 15;
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "sdpa forward failed (%d): %s", r->status, r->err);
}

/* The tool's forward with (qd, kvd) equals the library's, bit for bit; LSE too. */
static void check_against_library(const inputs *in, sdpa_dtype qd, sdpa_dtype kvd, const char *o_descr,
                                  double tol)
{
    static float o[NO], lse[NL], lo[NO], llse[NL];
    static double ro[NO], rlse[NL];
    read_output(P("O.npy"), o_descr, o);
    read_lse(P("LSE.npy"), lse);
    library_forward(in, qd, kvd, lo, llse);
    expect_same_bits("O", o, lo, NO);
    expect_same_bits("LSE", lse, llse, NL);
    reference(in, qd, kvd, ro, rlse);
    expect_near("O", o, ro, NO, tol);
    expect_near("LSE", lse, rlse, NL, 1e-4);
}

/* ------------------------------------------------------------ forward */

/* --dtype bf16: Q, K, V rounded to bf16 (nearest even), O bf16 written as float32. */
Test(cli_dtype, bf16_forward_equals_library)
{
    static inputs in;
    make_inputs(&in);
    write_f32_inputs(&in);
    tool_forward((const char *const[]){"--dtype", "bf16", NULL});
    /* O is rounded to bf16 (half an ulp of |O| < 2: 2^-8) */
    check_against_library(&in, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, "<f4", 1.5e-2);
    /* and O really is a bf16 value */
    static float o[NO];
    read_output(P("O.npy"), "<f4", o);
    for (int i = 0; i < NO; i++)
        cr_assert_eq(f32_bits(o[i]) & 0xffffu, 0u, "O[%d] = %.9g is not a bf16 value", i, (double)o[i]);
}

/* --kv-dtype alone: K and V bf16, Q and O fp32 (O written as float32, not rounded). */
Test(cli_dtype, kv_dtype_alone)
{
    static inputs in;
    make_inputs(&in);
    write_f32_inputs(&in);
    tool_forward((const char *const[]){"--kv-dtype", "bf16", NULL});
    check_against_library(&in, SDPA_DTYPE_F32, SDPA_DTYPE_BF16, "<f4", 1e-5);
    /* K and V were rounded: the result differs from the all-fp32 one */
    static float o[NO], l32[NL];
    static float o32[NO];
    read_output(P("O.npy"), "<f4", o);
    library_forward(&in, SDPA_DTYPE_F32, SDPA_DTYPE_F32, o32, l32);
    int differ = 0;
    for (int i = 0; i < NO; i++)
        differ += f32_bits(o[i]) != f32_bits(o32[i]);
    cr_assert_gt(differ, 0, "--kv-dtype bf16 gave the fp32 result: K and V were not rounded");
    /* --kv-dtype fp16 with --dtype bf16: each its own type */
    tool_forward((const char *const[]){"--dtype", "bf16", "--kv-dtype", "fp16", NULL});
    check_against_library(&in, SDPA_DTYPE_BF16, SDPA_DTYPE_F16, "<f4", 1.5e-2);
}

/* --dtype fp16: O is written as float16 ('<f2'), LSE as float32. */
Test(cli_dtype, fp16_output_is_f2)
{
    static inputs in;
    make_inputs(&in);
    write_f32_inputs(&in);
    tool_forward((const char *const[]){"--dtype", "fp16", NULL});
    npy_file a;
    read_npy(P("O.npy"), &a);
    cr_assert_str_eq(a.descr, "<f2", "O of --dtype fp16 has dtype '%s'", a.descr);
    cr_assert_eq(a.count, (size_t)NO);
    free(a.data);
    read_npy(P("LSE.npy"), &a);
    cr_assert_str_eq(a.descr, "<f4", "LSE of --dtype fp16 has dtype '%s'", a.descr);
    free(a.data);
    /* O: the library's fp16 bits (half an ulp of |O| < 2: 2^-11) */
    check_against_library(&in, SDPA_DTYPE_F16, SDPA_DTYPE_F16, "<f2", 2e-3);
    /* --dtype fp16 --kv-dtype fp32: O still float16 */
    tool_forward((const char *const[]){"--dtype", "fp16", "--kv-dtype", "fp32", NULL});
    check_against_library(&in, SDPA_DTYPE_F16, SDPA_DTYPE_F32, "<f2", 2e-3);
}

/* float16 ('<f2') input files: read exactly, then stored in the type asked for. */
Test(cli_dtype, float16_npy_input_accepted)
{
    static inputs in, in16;
    static uint16_t q16[NQ], k16[NK], v16[NV];
    make_inputs(&in);
    /* the float16 files, and the float32 values they hold (exact) */
    for (int i = 0; i < NQ; i++)
        q16[i] = to_f16(in.q[i]), in16.q[i] = from_f16(q16[i]);
    for (int i = 0; i < NK; i++)
        k16[i] = to_f16(in.k[i]), in16.k[i] = from_f16(k16[i]);
    for (int i = 0; i < NV; i++)
        v16[i] = to_f16(in.v[i]), in16.v[i] = from_f16(v16[i]);
    write_npy(P("Q.npy"), "<f2", 2, 4, SQ, q16);
    write_npy(P("K.npy"), "<f2", 2, 4, SK, k16);
    write_npy(P("V.npy"), "<f2", 2, 4, SV, v16);

    /* default fp32: the float16 values widened */
    tool_forward(NULL);
    check_against_library(&in16, SDPA_DTYPE_F32, SDPA_DTYPE_F32, "<f4", 1e-5);
    /* fp16: the bits as they are */
    tool_forward((const char *const[]){"--dtype", "fp16", NULL});
    check_against_library(&in16, SDPA_DTYPE_F16, SDPA_DTYPE_F16, "<f2", 2e-3);
    /* bf16: float16 -> bf16, rounded to nearest even */
    tool_forward((const char *const[]){"--dtype", "bf16", NULL});
    check_against_library(&in16, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, "<f4", 1.5e-2);

    /* a float16 Q with float32 K and V is fine too */
    write_f32_inputs(&in16);
    write_npy(P("Q.npy"), "<f2", 2, 4, SQ, q16);
    tool_forward((const char *const[]){"--kv-dtype", "fp16", NULL});
    check_against_library(&in16, SDPA_DTYPE_F32, SDPA_DTYPE_F16, "<f4", 1e-5);
}

/* The default stays fp32: explicit --dtype fp32 gives the same bits as no option. */
Test(cli_dtype, fp32_default_unchanged)
{
    static inputs in;
    static float o1[NO], o2[NO];
    make_inputs(&in);
    write_f32_inputs(&in);
    tool_forward(NULL);
    read_output(P("O.npy"), "<f4", o1);
    tool_forward((const char *const[]){"--dtype", "fp32", "--kv-dtype", "fp32", NULL});
    read_output(P("O.npy"), "<f4", o2);
    expect_same_bits("O", o2, o1, NO);
    check_against_library(&in, SDPA_DTYPE_F32, SDPA_DTYPE_F32, "<f4", 1e-5);
}

/* ------------------------------------------------------------ errors */

static void expect_usage_error(const char *const *args, const char *msg)
{
    run_result *r = run(args);
    cr_assert_eq(r->status, 2, "exit status %d, expected 2; stderr: %s", r->status, r->err);
    cr_assert_not_null(strstr(r->err, msg), "stderr lacks \"%s\": %s", msg, r->err);
    cr_assert_not_null(strstr(r->err, "usage: sdpa"), "stderr lacks the usage line: %s", r->err);
    cr_assert(!exists(P("O.npy")), "an output was written");
}

Test(cli_dtype, bad_dtype_rejected)
{
    static inputs in;
    make_inputs(&in);
    write_f32_inputs(&in);
#define FWD "forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy")
    expect_usage_error((const char *const[]){FWD, "--dtype", "fp64", NULL},
                       "--dtype 'fp64': expected fp32, bf16 or fp16");
    expect_usage_error((const char *const[]){FWD, "--dtype", "float16", NULL},
                       "--dtype 'float16': expected fp32, bf16 or fp16");
    expect_usage_error((const char *const[]){FWD, "--dtype=", NULL}, "--dtype '': expected fp32, bf16 or fp16");
    expect_usage_error((const char *const[]){FWD, "--kv-dtype", "int8", NULL},
                       "--kv-dtype 'int8': expected fp32, bf16 or fp16");
    expect_usage_error((const char *const[]){FWD, "--dtype", "bf16", "--dtype", "fp16", NULL},
                       "option '--dtype' given twice");
    expect_usage_error((const char *const[]){FWD, "--dtype", NULL}, "option '--dtype' needs a value");
    run_result *r = run((const char *const[]){"demo", "--dtype", "bf16", NULL});
    cr_assert_eq(r->status, 2);
    cr_assert_not_null(strstr(r->err, "unknown option '--dtype' for 'sdpa demo'"), "%s", r->err);
    r = run((const char *const[]){"bench", "--dtype", "bf16", "--dtype", "fp16", NULL});
    cr_assert_eq(r->status, 2); /* regression (session 29): the last one silently won */
    cr_assert_not_null(strstr(r->err, "option '--dtype' given twice"), "%s", r->err);
    r = run((const char *const[]){"bench", "--dtype", "fp8", NULL});
    cr_assert_eq(r->status, 2);
    cr_assert_not_null(strstr(r->err, "--dtype 'fp8': expected fp32, bf16 or fp16"), "%s", r->err);
    r = run((const char *const[]){"bench", "--dtype", "bf16", "--serve", NULL});
    cr_assert_eq(r->status, 2);
    cr_assert_not_null(strstr(r->err, "--serve"), "%s", r->err);
#undef FWD
}

/* Other float types in a file are still refused, naming both accepted ones. */
Test(cli_dtype, float64_input_refused)
{
    static inputs in;
    static double q64[NQ];
    make_inputs(&in);
    write_f32_inputs(&in);
    for (int i = 0; i < NQ; i++)
        q64[i] = in.q[i];
    write_npy(P("Q.npy"), "<f8", 8, 4, SQ, q64);
    run_result *r = run((const char *const[]){"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o",
                                              P("O.npy"), "--dtype", "bf16", NULL});
    cr_assert_eq(r->status, 2);
    cr_assert_not_null(strstr(r->err, P("Q.npy")), "%s", r->err);
    cr_assert_not_null(strstr(r->err, "'<f2'"), "the message should name float16: %s", r->err);
    cr_assert(!exists(P("O.npy")));
}

/* The backward with a 16-bit type does what the library does: while libsdpa
 * refuses it (SDPA_ERR_UNSUPPORTED), the tool prints the library's status string
 * and exits 2, writing nothing; once it computes it, the tool succeeds. */
Test(cli_dtype, backward_16bit_follows_library)
{
    static inputs in;
    static float dout[NO];
    make_inputs(&in);
    write_f32_inputs(&in);
    for (int i = 0; i < NO; i++)
        dout[i] = frand();
    write_npy(P("dO.npy"), "<f4", 4, 4, SO, dout);

    /* what the library says to a bf16 backward */
    sdpa_problem p = problem(SDPA_DTYPE_BF16, SDPA_DTYPE_BF16);
    void *q = store_as(in.q, NQ, SDPA_DTYPE_BF16), *k = store_as(in.k, NK, SDPA_DTYPE_BF16),
         *v = store_as(in.v, NV, SDPA_DTYPE_BF16), *d = store_as(dout, NO, SDPA_DTYPE_BF16);
    void *o = calloc(NO, 2), *dq = calloc(NQ, 2), *dk = calloc(NK, 2), *dv = calloc(NV, 2);
    float *lse = calloc(NL, 4);
    const sdpa_tensor tq = view(q, HQ, TQ, DK), tk = view(k, HKV, TK, DK), tv = view(v, HKV, TK, DV),
                      tdo = view(d, HQ, TQ, DV), to = view(o, HQ, TQ, DV), tl = {lse, HQ * TQ, TQ, 1};
    const sdpa_tensor_out wo = view_out(o, HQ, TQ, DV), wl = {lse, HQ * TQ, TQ, 1},
                          odq = view_out(dq, HQ, TQ, DK), odk = view_out(dk, HKV, TK, DK),
                          odv = view_out(dv, HKV, TK, DV);
    cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &wo, &wl), SDPA_OK);
    const sdpa_status st = sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &odq, &odk, &odv);
    free(q), free(k), free(v), free(d), free(o), free(dq), free(dk), free(dv), free(lse);

    run_result *r = run((const char *const[]){"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"),
                                              "--do", P("dO.npy"), "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv",
                                              P("dV.npy"), "--causal", "bottom-right", "--threads", "1", "--dtype",
                                              "bf16", NULL});
    if (st == SDPA_OK) {
        cr_assert_eq(r->status, 0, "the library computes a bf16 backward but the tool failed: %s", r->err);
        cr_assert(exists(P("dQ.npy")) && exists(P("dK.npy")) && exists(P("dV.npy")));
        return;
    }
    cr_assert_eq(r->status, 2, "exit status %d: %s", r->status, r->err);
    cr_assert_not_null(strstr(r->err, "sdpa: error: libsdpa: "), "%s", r->err);
    cr_assert_not_null(strstr(r->err, sdpa_status_string(st)), "the library's status string is missing: %s", r->err);
    cr_assert(!exists(P("dQ.npy")) && !exists(P("dK.npy")) && !exists(P("dV.npy")), "an output was written");
}

/* ------------------------------------------------------------ help and bench */

Test(cli_dtype, help_mentions_types)
{
    run_result *r = run((const char *const[]){"forward", "--help", NULL});
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "--dtype"));
    cr_assert_not_null(strstr(r->out, "--kv-dtype"));
    cr_assert_not_null(strstr(r->out, "fp32|bf16|fp16"));
    r = run((const char *const[]){"backward", "--help", NULL});
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "--kv-dtype"));
    r = run((const char *const[]){"bench", "--help", NULL});
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "--dtype"));
    r = run((const char *const[]){"--help", NULL});
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "--dtype"));
}

/* `sdpa bench --dtype fp32,bf16,fp16 --json`: every row has "dtype"; one forward
 * row per type; the backward rows of a 16-bit type only if the library computes
 * that backward. No timing is checked. */
Test(cli_dtype, bench_json_dtype_field)
{
    run_result *r = run((const char *const[]){"bench", "--no-limits", "--no-naive", "--isa", "scalar", "--threads",
                                              "1", "--shape", "1,2,1,8,9,4,3", "--mask", "causal", "--reps", "1",
                                              "--warmup", "0", "--json", "--dtype", "fp32,bf16,fp16", NULL});
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    int fwd[3] = {0}, bwd[3] = {0}, rows = 0;
    static const char *const names[3] = {"\"dtype\":\"fp32\"", "\"dtype\":\"bf16\"", "\"dtype\":\"fp16\""};
    for (const char *line = r->out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *end = strchr(line, '\n');
        const size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[2048];
        if (len == 0)
            continue;
        cr_assert_lt(len, sizeof buf);
        memcpy(buf, line, len);
        buf[len] = '\0';
        cr_assert(buf[0] == '{' && buf[len - 1] == '}', "not a JSON object line: %s", buf);
        int which = -1;
        for (int i = 0; i < 3; i++)
            if (strstr(buf, names[i]))
                which = i;
        cr_assert_geq(which, 0, "row without a dtype field: %s", buf);
        cr_assert_not_null(strstr(buf, "\"ms\":"), "%s", buf);
        fwd[which] += strstr(buf, "\"op\":\"forward\"") != NULL;
        bwd[which] += strstr(buf, "\"op\":\"backward\"") != NULL;
        rows++;
    }
    for (int i = 0; i < 3; i++)
        cr_expect_eq(fwd[i], 1, "%s: %d forward rows", names[i], fwd[i]);
    cr_expect_eq(bwd[0], 1, "fp32: %d backward rows", bwd[0]);
    for (int i = 1; i < 3; i++) {
        cr_expect_leq(bwd[i], 1);
        if (bwd[i] == 0) /* skipped: the table (stderr with --json) says why */
            cr_expect_not_null(strstr(r->err, i == 1 ? "bf16 skipped: libsdpa: " : "fp16 skipped: libsdpa: "),
                               "no note for the skipped %s backward: %s", names[i], r->err);
    }
    cr_expect_eq(rows, 3 + bwd[0] + bwd[1] + bwd[2], "rows: %d", rows);
    /* without --dtype: every row says fp32, and the table has no dtype column */
    r = run((const char *const[]){"bench", "--no-limits", "--no-naive", "--isa", "scalar", "--threads", "1",
                                  "--shape", "1,2,1,8,9,4,3", "--reps", "1", "--warmup", "0", "--op", "forward",
                                  "--json", NULL});
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    cr_assert_not_null(strstr(r->out, "\"dtype\":\"fp32\""), "%s", r->out);
    cr_assert_null(strstr(r->err, " dtype "), "the default table gained a dtype column: %s", r->err);
}

/* --fpmath strict (sdpa_problem.fpmath_mode): an fp32 Q over a bf16 cache in a prefill
 * (Tq 40 at G = 2: wide on every CPU's tuning) writes the bytes of the fp32 run on the
 * same (bf16-exact) values; the default differs where the CPU runs the bf16 pair
 * products; another value is a usage error. */
Test(cli_dtype, fpmath_strict_is_the_fp32_run)
{
    enum { T = 40, TKV = 48, D = 16 };
    static float q[2 * T * D], kv[TKV * D];
    for (int i = 0; i < 2 * T * D; i++)
        q[i] = frand();
    for (int i = 0; i < TKV * D; i++)
        kv[i] = from_bf16(to_bf16(frand())); /* exact in bf16: the fp32 run reads the same values */
    const int64_t sq[3] = {2, T, D}, skv[3] = {1, TKV, D};
    write_npy(P("fq.npy"), "<f4", 4, 3, sq, q);
    write_npy(P("fkv.npy"), "<f4", 4, 3, skv, kv);
    const char *const base[] = {"forward", "-q", P("fq.npy"), "-k", P("fkv.npy"), "-v", P("fkv.npy"), "--causal",
                                "bottom-right", NULL};
    static const char *const extra[3][5] = {{"-o", "f32.npy", NULL},
                                           {"-o", "strict.npy", "--kv-dtype", "bf16", NULL},
                                           {"-o", "default.npy", "--kv-dtype", "bf16", NULL}};
    for (int r = 0; r < 3; r++) {
        const char *args[20];
        int n = 0;
        for (int i = 0; base[i]; i++)
            args[n++] = base[i];
        for (int i = 0; extra[r][i]; i++)
            args[n++] = i == 1 ? P(extra[r][i]) : extra[r][i];
        if (r == 1)
            args[n++] = "--fpmath", args[n++] = "strict";
        args[n] = NULL;
        run_result *res = run(args);
        cr_assert_eq(res->status, 0, "run %d: exit %d", r, res->status);
    }
    static char f32[8192], strict[8192], deflt[8192];
    slurp(P("f32.npy"), f32, sizeof f32);
    slurp(P("strict.npy"), strict, sizeof strict);
    slurp(P("default.npy"), deflt, sizeof deflt);
    cr_expect(memcmp(f32, strict, sizeof f32) == 0, "--fpmath strict: O differs from the fp32 run's");
    if (sdpa_isa_bf16_pairs(SDPA_ISA_AUTO))
        cr_expect(memcmp(f32, deflt, sizeof f32) != 0, "the default rounded nothing on a pair-product ISA");
    run_result *bad = run((const char *const[]){"forward", "-q", P("fq.npy"), "-k", P("fkv.npy"), "-v",
                                                P("fkv.npy"), "-o", P("bad.npy"), "--fpmath", "fast", NULL});
    cr_expect_eq(bad->status, 2, "--fpmath fast: exit %d", bad->status);
    cr_expect(!exists(P("bad.npy")));
}
