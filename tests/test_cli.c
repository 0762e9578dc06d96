/* SPDX-License-Identifier: MIT */
/* tests/test_cli.c - tests of the sdpa command-line tool, run as a child process.
 *
 * Each test writes .npy inputs from C into a fresh mkdtemp() directory, runs the
 * binary at SDPA_CLI_PATH with posix_spawn, and checks its exit status, its
 * stderr and the .npy files it wrote against the float64 reference of tests/ref.c
 * (independent of the library and of tools/npy.c). The library itself is
 * never called from this file, so no OpenMP runs in Criterion's processes. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
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
#ifndef SDPA_TEST_DATA_DIR
#error "SDPA_TEST_DATA_DIR must name tests/data in the source tree"
#endif
#define EXAMPLES_DIR SDPA_TEST_DATA_DIR "/../../examples"

extern char **environ;

/* ------------------------------------------------------------ temp dirs */

static char g_dir[64], g_io[64];

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
    strcpy(g_dir, "/tmp/sdpa-cli-XXXXXX");
    strcpy(g_io, "/tmp/sdpa-cli-io-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    cr_assert_not_null(mkdtemp(g_io));
}

static void teardown(void)
{
    rm_tree(g_dir);
    rm_tree(g_io);
}

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 300);

/* A path inside the test directory; the same name always gives the same
 * pointer, so argument arrays built early stay valid. */
static const char *P(const char *name)
{
    static char paths[128][512];
    static int used;
    char want[512];
    snprintf(want, sizeof want, "%s/%s", g_dir, name);
    for (int i = 0; i < used; i++)
        if (strcmp(paths[i], want) == 0)
            return paths[i];
    cr_assert_lt(used, 128, "too many distinct paths");
    strcpy(paths[used], want);
    return paths[used++];
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* ------------------------------------------------------------ running the tool */

typedef struct run_result {
    int status; /* exit status, or 128 + signal */
    char out[16384];
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

/* Runs SDPA_CLI_PATH with args (NULL-terminated, without argv[0]); env_add,
 * if not NULL, is one "NAME=value" added to the environment (SDPA_ISA from the
 * parent is kept otherwise). */
static run_result *run_env(const char *const *args, const char *env_add)
{
    static run_result r;
    const char *argv[64];
    char *envp[512];
    char outp[128], errp[128];
    int n = 0, ne = 0;
    pid_t pid;
    posix_spawn_file_actions_t fa;

    argv[n++] = SDPA_CLI_PATH;
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(n, 62);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    for (char **e = environ; *e && ne < 500; e++)
        if (!env_add || strncmp(*e, "SDPA_ISA=", 9) != 0)
            envp[ne++] = *e;
    if (env_add)
        envp[ne++] = (char *)env_add;
    envp[ne] = NULL;

    snprintf(outp, sizeof outp, "%s/stdout", g_io);
    snprintf(errp, sizeof errp, "%s/stderr", g_io);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(posix_spawn(&pid, SDPA_CLI_PATH, &fa, NULL, (char *const *)argv, envp), 0,
                 "cannot spawn %s", SDPA_CLI_PATH);
    posix_spawn_file_actions_destroy(&fa);
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    slurp(outp, r.out, sizeof r.out);
    slurp(errp, r.err, sizeof r.err);
    return &r;
}

static run_result *run(const char *const *args)
{
    return run_env(args, NULL);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* ------------------------------------------------------------ .npy files (independent of tools/npy.c) */

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* Writes a .npy with the given dict text (padding added) and format version. */
static void write_npy_raw(const char *path, int major, const char *dict, const void *data, size_t nbytes)
{
    size_t dlen = strlen(dict), pre = major == 1 ? 10 : 12;
    size_t total = (pre + dlen + 1 + 63) / 64 * 64, hl = total - pre;
    unsigned char *buf = malloc(total + nbytes + 1);
    cr_assert_not_null(buf);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    if (major == 1) {
        buf[8] = (unsigned char)(hl & 0xff);
        buf[9] = (unsigned char)(hl >> 8);
    } else {
        for (int i = 0; i < 4; i++)
            buf[8 + i] = (unsigned char)(hl >> (8 * i));
    }
    memcpy(buf + pre, dict, dlen);
    memset(buf + pre + dlen, ' ', total - pre - dlen - 1);
    buf[total - 1] = '\n';
    if (nbytes)
        memcpy(buf + total, data, nbytes);
    write_bytes(path, buf, total + nbytes);
    free(buf);
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    snprintf(buf + n, len - n, ndim == 1 ? ",)" : ")");
}

static size_t shape_count(int ndim, const int64_t *shape)
{
    size_t c = 1;
    for (int i = 0; i < ndim; i++)
        c *= (size_t)shape[i];
    return c;
}

static void write_typed(const char *path, const char *descr, size_t elsize, int ndim, const int64_t *shape,
                        const void *data, int major, int fortran)
{
    char sh[256], dict[512];
    shape_text(ndim, shape, sh, sizeof sh);
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
             fortran ? "True" : "False", sh);
    write_npy_raw(path, major, dict, data, shape_count(ndim, shape) * elsize);
}

static void write_f32(const char *path, int ndim, const int64_t *shape, const float *data)
{
    write_typed(path, "<f4", 4, ndim, shape, data, 1, 0);
}

/* Reads a '<f4' C-order .npy (version 1.0) written by the tool. */
static float *read_f32(const char *path, int *ndim, int64_t *shape)
{
    FILE *f = fopen(path, "rb");
    unsigned char pre[10];
    char *hdr, *s;
    size_t hl, count;
    float *data;
    cr_assert_not_null(f, "cannot open %s", path);
    cr_assert_eq(fread(pre, 1, 10, f), 10);
    cr_assert(memcmp(pre, "\x93NUMPY\x01\x00", 8) == 0, "%s: not a version 1.0 .npy", path);
    hl = (size_t)pre[8] | (size_t)pre[9] << 8;
    cr_assert_eq((10 + hl) % 64, 0, "%s: header not padded to 64 bytes", path);
    hdr = calloc(1, hl + 1);
    cr_assert_eq(fread(hdr, 1, hl, f), hl);
    cr_assert_eq(hdr[hl - 1], '\n');
    cr_assert_not_null(strstr(hdr, "'descr': '<f4'"), "%s: %s", path, hdr);
    cr_assert_not_null(strstr(hdr, "'fortran_order': False"));
    s = strstr(hdr, "'shape': (");
    cr_assert_not_null(s);
    s += strlen("'shape': (");
    *ndim = 0;
    while (*s != ')') {
        char *end;
        long long v = strtoll(s, &end, 10);
        cr_assert(end != s, "%s: bad shape in %s", path, hdr);
        shape[(*ndim)++] = v;
        s = end;
        while (*s == ',' || *s == ' ')
            s++;
    }
    free(hdr);
    count = shape_count(*ndim, shape);
    data = malloc(count * sizeof(float) + 1);
    cr_assert_eq(fread(data, sizeof(float), count, f), count, "%s: short data", path);
    cr_assert_eq(fgetc(f), EOF, "%s: trailing bytes", path);
    fclose(f);
    return data;
}

/* ------------------------------------------------------------ float64 reference */

typedef struct refp {
    int B, Hq, Hkv, Tq, Tk, Dk, Dv;
    double scale;   /* 0: the default 1/sqrt(Dk) */
    int causal;     /* 0 none, 1 top-left, 2 bottom-right */
    int align_br;   /* window alignment without causal */
    long wl, wr;    /* -1 unbounded */
    long off;       /* diagonal_offset */
    const int32_t *kvlen;
    const uint8_t *mask;
    long ms[4];
    const float *bias;
    long bs[4];
} refp;

/* The refp as the problem descriptor of the shared float64 reference (tests/ref.c).
 * Only its fields are read: the library is not called. */
static sdpa_problem ref_problem(const refp *p)
{
    sdpa_problem d;
    memset(&d, 0, sizeof d);
    d.batch = p->B;
    d.q_heads = p->Hq;
    d.kv_heads = p->Hkv;
    d.q_len = p->Tq;
    d.kv_len = p->Tk;
    d.head_dim_qk = p->Dk;
    d.head_dim_v = p->Dv;
    d.use_default_scale = p->scale == 0;
    d.scale = (float)p->scale;
    d.causal = p->causal == 1 ? SDPA_CAUSAL_TOP_LEFT : p->causal == 2 ? SDPA_CAUSAL_BOTTOM_RIGHT : SDPA_CAUSAL_NONE;
    d.window_alignment = p->align_br ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    d.window_left = p->wl >= 0 ? p->wl : SDPA_WINDOW_UNBOUNDED;
    d.window_right = p->wr >= 0 ? p->wr : SDPA_WINDOW_UNBOUNDED;
    d.diagonal_offset = p->off;
    d.kv_lengths = p->kvlen;
    d.bool_mask = (sdpa_bool_mask){p->mask, p->ms[0], p->ms[1], p->ms[2], p->ms[3]};
    d.bias = (sdpa_bias){p->bias, p->bs[0], p->bs[1], p->bs[2], p->bs[3]};
    return d;
}

static void refp_forward(const refp *p, const float *q, const float *k, const float *v, double *o, double *lse)
{
    const sdpa_problem d = ref_problem(p);
    ref_forward(&d, q, k, v, o, lse);
}

static void refp_backward(const refp *p, const float *q, const float *k, const float *v, const float *dout,
                          double *dq, double *dk, double *dv)
{
    const sdpa_problem d = ref_problem(p);
    ref_backward(&d, q, k, v, dout, dq, dk, dv);
}

/* ------------------------------------------------------------ data and comparisons */

static uint64_t g_seed = 12345;

static float frand(void)
{
    uint64_t z = (g_seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 8388608.0 - 1.0);
}

static float *rand_floats(size_t n)
{
    float *x = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++)
        x[i] = frand();
    return x;
}

/* The shape of a logical [b, h, t, d] tensor written in the given rank. */
static void shape_rank(int rank, int64_t b, int64_t h, int64_t t, int64_t d, int64_t *shape)
{
    const int64_t all[4] = {b, h, t, d};
    for (int i = 0; i < rank; i++)
        shape[i] = all[4 - rank + i];
}

static void expect_shape(int ndim, const int64_t *shape, int want_ndim, const int64_t *want)
{
    cr_assert_eq(ndim, want_ndim, "rank %d, expected %d", ndim, want_ndim);
    for (int i = 0; i < ndim; i++)
        cr_assert_eq(shape[i], want[i], "dim %d is %lld, expected %lld", i, (long long)shape[i],
                     (long long)want[i]);
}

static void expect_close(const char *what, const float *got, const double *want, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i])) {
            cr_assert(got[i] == (float)want[i], "%s[%zu] = %g, expected %g", what, i, got[i], want[i]);
            continue;
        }
        cr_assert(fabs((double)got[i] - want[i]) <= tol, "%s[%zu] = %.9g, expected %.9g (tol %g)", what, i,
                  got[i], want[i], tol);
    }
}

/* The standard inputs of a forward/backward case, written as Q/K/V.npy in rank `rank`. */
/* Runs the tool's forward `fa` (NULL-terminated; it must succeed, writing O.npy
 * and LSE.npy) and appends "-o O.npy --lse LSE.npy" to the backward's args at *n. */
static void given_o_lse(const char *const *fa, const char **args, int *n)
{
    run_result *r = run(fa);
    cr_assert_eq(r->status, 0, "%s", r->err);
    args[(*n)++] = "-o";
    args[(*n)++] = P("O.npy");
    args[(*n)++] = "--lse";
    args[(*n)++] = P("LSE.npy");
}

typedef struct fixture {
    refp p;
    int rank;
    float *q, *k, *v;
} fixture;

static void fixture_make(fixture *f, int rank, int B, int Hq, int Hkv, int Tq, int Tk, int Dk, int Dv)
{
    int64_t s[4] = {0, 0, 0, 0};
    memset(f, 0, sizeof *f);
    f->p = (refp){B, Hq, Hkv, Tq, Tk, Dk, Dv, 0, 0, 0, -1, -1, 0, NULL, NULL, {0}, NULL, {0}};
    f->rank = rank;
    f->q = rand_floats((size_t)B * Hq * Tq * Dk);
    f->k = rand_floats((size_t)B * Hkv * Tk * Dk);
    f->v = rand_floats((size_t)B * Hkv * Tk * Dv);
    shape_rank(rank, B, Hq, Tq, Dk, s);
    write_f32(P("Q.npy"), rank, s, f->q);
    shape_rank(rank, B, Hkv, Tk, Dk, s);
    write_f32(P("K.npy"), rank, s, f->k);
    shape_rank(rank, B, Hkv, Tk, Dv, s);
    write_f32(P("V.npy"), rank, s, f->v);
}

static void fixture_free(fixture *f)
{
    free(f->q);
    free(f->k);
    free(f->v);
}

/* Runs forward with -o O.npy --lse LSE.npy plus extra args, checks both. */
static void check_forward(const fixture *f, const char *const *extra)
{
    const refp *p = &f->p;
    const char *args[48] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"),
                            "-o",      P("O.npy"), "--lse", P("LSE.npy")};
    int n = 11, nd;
    int64_t shape[8], want[4];
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "forward failed (%d): %s", r->status, r->err);
    cr_assert_str_empty(r->err, "stderr: %s", r->err);

    const size_t rows = (size_t)p->B * p->Hq * p->Tq;
    double *o = malloc(rows * p->Dv * sizeof(double) + 1), *lse = malloc(rows * sizeof(double) + 1);
    refp_forward(p, f->q, f->k, f->v, o, lse);
    float *go = read_f32(P("O.npy"), &nd, shape);
    shape_rank(f->rank, p->B, p->Hq, p->Tq, p->Dv, want);
    expect_shape(nd, shape, f->rank, want);
    expect_close("O", go, o, rows * p->Dv, 1e-5);
    float *gl = read_f32(P("LSE.npy"), &nd, shape);
    expect_shape(nd, shape, f->rank - 1, want);
    expect_close("LSE", gl, lse, rows, 1e-5);
    free(go);
    free(gl);
    free(o);
    free(lse);
}

/* ------------------------------------------------------------ info, help, demo */

Test(cli, info_reports_active_isa)
{
    const char *args[] = {"info", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    const char *a = strstr(r->out, "\nactive isa: ");
    cr_assert_not_null(a, "no 'active isa: ' line in:\n%s", r->out);
    a += strlen("\nactive isa: ");
    cr_assert(strncmp(a, "scalar\n", 7) == 0 || strncmp(a, "avx2\n", 5) == 0 ||
                  strncmp(a, "avx512\n", 7) == 0 || strncmp(a, "amx\n", 4) == 0 || strncmp(a, "neon\n", 5) == 0,
              "unexpected active isa line: %s", a);
    cr_assert_not_null(strstr(r->out, "cpu features:"));
    cr_assert_not_null(strstr(r->out, "isa compiled: scalar"));
    cr_assert_not_null(strstr(r->out, "isa supported: scalar"));
    cr_assert_not_null(strstr(r->out, "sdpa 0."));
}

Test(cli, info_scalar_env_and_rejected_env)
{
    const char *args[] = {"info", NULL};
    run_result *r = run_env(args, "SDPA_ISA=scalar");
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "\nactive isa: scalar\n"), "%s", r->out);
    r = run_env(args, "SDPA_ISA=bogus-isa");
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "'bogus-isa' rejected"), "%s", r->out);
    cr_assert_not_null(strstr(r->out, "\nactive isa: "));
}

Test(cli, info_tuning_and_sdpa_tune_env)
{
    const char *args[] = {"info", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "\ntuning: uarch "), "%s", r->out);
    cr_assert_not_null(strstr(r->out, "scalar block_q "), "%s", r->out);
    cr_assert_null(strstr(r->out, "SDPA_TUNE"), "%s", r->out);
    cr_assert_not_null(strstr(r->out, "\ntypes: fp32 "), "%s", r->out);
    cr_assert_not_null(strstr(r->out, "; bf16 "), "%s", r->out);
    r = run_env(args, "SDPA_TUNE=block_q=48,block_k=96,nt_max_cols=4");
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "scalar block_q 48 block_k 96 nt_max_cols 4 wide_prefetch "), "%s", r->out);
    r = run_env(args, "SDPA_TUNE=wide_prefetch=0");
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "scalar block_q 32 block_k 32 nt_max_cols 8 wide_prefetch never"), "%s", r->out);
    cr_assert_null(strstr(r->out, "wide_prefetch always"), "%s", r->out);
    r = run_env(args, "SDPA_TUNE=wide_prefetch=2");
    cr_assert_eq(r->status, 0);
    cr_assert_null(strstr(r->out, "wide_prefetch always"), "%s", r->out);
    cr_assert_not_null(strstr(r->out, "wide_prefetch streaming"), "%s", r->out);
    cr_assert_not_null(strstr(r->out, "' applied"), "%s", r->out);
    /* bf16_dot: printed for the ISAs that have the bf16 pair products (AVX-512 with
       AVX512_BF16), set by SDPA_TUNE for them only */
    r = run_env(args, "SDPA_TUNE=bf16_dot=0");
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "' applied"), "%s", r->out);
    cr_assert_null(strstr(r->out, " bf16_dot 1"), "%s", r->out);
    const int has_pairs = strstr(r->out, " bf16_dot 0") != NULL;
    cr_assert_eq(has_pairs, strstr(r->out, "avx512_bf16") != NULL && strstr(r->out, "avx512 block_q") != NULL,
                 "%s", r->out);
    r = run_env(args, "SDPA_TUNE=bf16_dot=1");
    cr_assert_eq(r->status, 0);
    cr_assert_eq(strstr(r->out, " bf16_dot 1") != NULL, has_pairs, "%s", r->out);
    cr_assert_null(strstr(r->out, "scalar block_q 32 block_k 32 nt_max_cols 8 wide_prefetch always bf16_dot"), "%s",
                   r->out);
    /* bwd_bf16_dot: printed beside bf16_dot, 1 on amx by default, set by SDPA_TUNE */
    r = run_env(args, "SDPA_TUNE=bwd_bf16_dot=0");
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "' applied"), "%s", r->out);
    cr_assert_null(strstr(r->out, "bwd_bf16_dot 1"), "%s", r->out);
    cr_assert_eq(strstr(r->out, "bwd_bf16_dot 0") != NULL, has_pairs, "%s", r->out);
    r = run_env(args, "SDPA_TUNE=bwd_bf16_dot=1");
    cr_assert_eq(r->status, 0);
    cr_assert_eq(strstr(r->out, "bwd_bf16_dot 1") != NULL, has_pairs, "%s", r->out);
    cr_assert_null(strstr(r->out, "bwd_bf16_dot 0"), "%s", r->out);
    /* tile_pad: printed for every ISA (16 on avx2, 0 elsewhere), set for all by SDPA_TUNE */
    r = run(args);
    cr_assert_not_null(strstr(r->out, "wide_prefetch always tile_pad 0"), "%s", r->out); /* scalar */
    cr_assert_eq(strstr(r->out, "avx2 block_q") != NULL, strstr(r->out, "wide_prefetch always tile_pad 16") != NULL, "%s",
                 r->out);
    r = run_env(args, "SDPA_TUNE=tile_pad=48");
    cr_assert_not_null(strstr(r->out, "' applied"), "%s", r->out);
    cr_assert_null(strstr(r->out, "tile_pad 0"), "%s", r->out);
    cr_assert_null(strstr(r->out, "tile_pad 16"), "%s", r->out);
    cr_assert_not_null(strstr(r->out, "tile_pad 48"), "%s", r->out);
    const char *bad[] = {"SDPA_TUNE=block_q=0", "SDPA_TUNE=block_k=513", "SDPA_TUNE=bogus=1", "SDPA_TUNE=block_q",
                         "SDPA_TUNE=block_q=12x", "SDPA_TUNE=wide_prefetch=3", "SDPA_TUNE=wide_prefetch=-1",
                         "SDPA_TUNE=bf16_dot=2", "SDPA_TUNE=bf16_dot=-1", "SDPA_TUNE=bwd_bf16_dot=2",
                         "SDPA_TUNE=tile_pad=8", "SDPA_TUNE=tile_pad=80", "SDPA_TUNE=tile_pad=-16",
                         /* regressions (session 29): strtol's space and sign, strtok's empty items */
                         "SDPA_TUNE=block_q= +32", "SDPA_TUNE=block_q=+32", "SDPA_TUNE=block_q=32,,,",
                         "SDPA_TUNE=block_q=32,", "SDPA_TUNE=,block_q=32", "SDPA_TUNE==32"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = run_env(args, bad[i]);
        cr_assert_eq(r->status, 0);
        cr_expect_not_null(strstr(r->out, "rejected (ignored)"), "%s: %s", bad[i], r->out);
        cr_expect_null(strstr(r->out, "block_q 0 "), "%s: %s", bad[i], r->out);
    }
    /* regression (session 29): a valid string of 128 bytes or more was rejected; 1023
     * bytes are taken, 1024 (every item valid) are not */
    char env[1100] = "SDPA_TUNE=";
    for (int i = 0; i < 92; i++)
        strcat(env, "block_q=48,"); /* 1012 bytes */
    strcat(env, "block_q=048");     /* 1023 */
    cr_assert_eq(strlen(env) - 10, 1023);
    r = run_env(args, env);
    cr_expect_not_null(strstr(r->out, "' applied"), "1023 bytes: %s", r->out);
    cr_expect_not_null(strstr(r->out, "block_q 48"), "%s", r->out);
    env[strlen(env) - 3] = '\0';
    strcat(env, "0048");            /* 1024 */
    cr_assert_eq(strlen(env) - 10, 1024);
    r = run_env(args, env);
    cr_expect_not_null(strstr(r->out, "rejected (ignored)"), "1024 bytes: %s", r->out);
}

/* Regressions (an adversarial review, session 29): sdpa bench took B, Hq, Hkv, Tq without
 * a bound (int64 overflow in its buffer sizes, an abort in the allocator), and list
 * options with an empty item; both are usage errors now (exit 2, nothing timed). */
Test(cli, bench_bad_lists_and_huge_shapes)
{
    const char *cases[][8] = {
        {"bench", "--no-limits", "--shape", "1,1,1,4611686018427387904,4,8,8", NULL},
        {"bench", "--no-limits", "--shape", "4611686018427387904,1,1,4,4,8,8", NULL},
        {"bench", "--no-limits", "--shape", "1,1,1,1152921504606846976,4,16,16", NULL},
        {"bench", "--no-limits", "--shape", "1,4611686018427387904,4611686018427387904,4,4,8,8", NULL},
        {"bench", "--no-limits", "--mask", "none,", NULL},
        {"bench", "--no-limits", "--dtype", "fp32,,bf16", NULL},
        {"bench", "--no-limits", "--isa", ",scalar", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_result *r = run(cases[i]);
        cr_expect_eq(r->status, 2, "%s %s: exit %d; stderr: %s", cases[i][2], cases[i][3], r->status, r->err);
        cr_expect_not_null(strstr(r->err, "sdpa bench: error:"), "%s: stderr: %s", cases[i][3], r->err);
        cr_expect_eq(r->out[0], '\0', "%s: stdout: %s", cases[i][3], r->out);
    }
}

/* The bytes of a file (NULL if it cannot be read); *len its size. */
static unsigned char *file_bytes(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    *len = 0;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        const long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n)) && fread(b, 1, (size_t)n, f) == (size_t)n)
            *len = (size_t)n;
    }
    if (f)
        fclose(f);
    return b;
}

/* tile_pad (SDPA_TUNE) moves the tile buffers' rows apart and nothing else: the
 * forward's O and LSE and the backward's dQ, dK, dV are the same bytes with 0 and
 * 64 floats of padding, on every ISA this CPU runs (tiles of 64 query columns, the
 * padded case, with partial tiles: Tq 150 = 2 x 64 + 22; Dv 64, whose V rows the
 * forward's wide tiles then copy with the padded stride). */
Test(cli, tile_pad_changes_no_bit)
{
    fixture f;
    fixture_make(&f, 4, 2, 4, 2, 150, 170, 40, 64);
    static const char *const isas[] = {"scalar", "avx2", "avx512", "amx", "neon"};
    static const char *const outs[] = {"O.npy", "LSE.npy", "dQ.npy", "dK.npy", "dV.npy"};
    int ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        sdpa_isa isa;
        if (sdpa_isa_from_name(isas[i], &isa) != 0 || !sdpa_isa_supported(isa))
            continue;
        unsigned char *first[5] = {NULL};
        size_t first_len[5] = {0};
        for (int pad = 0; pad <= 64; pad += 64) {
            char env[32];
            snprintf(env, sizeof env, "SDPA_TUNE=tile_pad=%d", pad);
            const char *fa[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                                "--lse", P("LSE.npy"), "--causal", "bottom-right", "--isa", isas[i], NULL};
            run_result *r = run_env(fa, env);
            cr_assert_eq(r->status, 0, "%s %s: %s", isas[i], env, r->err);
            const char *ba[] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                                "--lse", P("LSE.npy"), "--do", P("O.npy"), "--dq", P("dQ.npy"), "--dk", P("dK.npy"),
                                "--dv", P("dV.npy"), "--causal", "bottom-right", "--isa", isas[i], NULL};
            r = run_env(ba, env);
            cr_assert_eq(r->status, 0, "%s %s: %s", isas[i], env, r->err);
            for (int o = 0; o < 5; o++) {
                size_t len;
                unsigned char *b = file_bytes(P(outs[o]), &len);
                cr_assert(b && len > 0, "%s: %s not written", isas[i], outs[o]);
                if (!pad) {
                    first[o] = b, first_len[o] = len;
                    continue;
                }
                cr_expect(len == first_len[o] && !memcmp(b, first[o], len), "%s: %s differs with %s", isas[i],
                          outs[o], env);
                free(b);
                free(first[o]);
            }
        }
        ran++;
    }
    cr_assert_geq(ran, 1);
    fixture_free(&f);
}

Test(cli, help_and_usage)
{
    const char *h[] = {"--help", NULL}, *fh[] = {"forward", "--help", NULL}, *bh[] = {"backward", "--help", NULL},
               *none[] = {NULL}, *unk[] = {"frobnicate", NULL};
    run_result *r = run(h);
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "usage: sdpa"));
    r = run(fh);
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "--kv-len"));
    cr_assert_not_null(strstr(r->out, "--causal"));
    r = run(bh);
    cr_assert_eq(r->status, 0);
    cr_assert_not_null(strstr(r->out, "--dq"));
    r = run(none);
    cr_assert_eq(r->status, 2);
    cr_assert_not_null(strstr(r->err, "usage:"));
    r = run(unk);
    cr_assert_eq(r->status, 2);
    cr_assert_not_null(strstr(r->err, "unknown command"));
}

Test(cli, demo_exits_zero)
{
    const char *args[] = {"demo", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "demo failed (%d):\n%s\n%s", r->status, r->out, r->err);
    cr_assert_not_null(strstr(r->out, "demo: ok"));
    cr_assert_not_null(strstr(r->out, "GFLOP/s"));
    cr_assert_not_null(strstr(r->out, "6.154606"), "%s", r->out);
}

Test(cli, demo_bad_data_dir)
{
    const char *args[] = {"demo", "--data", P("nowhere"), NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 2);
    cr_assert_eq(count_lines(r->err), 1, "%s", r->err);
}

/* demo --data with Dv > 64: the float64 check runs (a review, session 30: it was
 * skipped above 64 columns and printed "= 0"). Random values: the float32 O differs
 * from float64 somewhere, so the printed error is not 0; O_expected is the float64 O. */
Test(cli, demo_data_checks_float64_beyond_64_columns)
{
    enum { TQ = 3, TK = 5, D = 4, DV = 70 };
    float q[TQ * D], k[TK * D], v[TK * DV], oe[TQ * DV];
    uint32_t x = 30;
    for (size_t i = 0; i < sizeof q / 4 + sizeof k / 4 + sizeof v / 4; i++) {
        x = x * 1664525u + 1013904223u;
        const float r = (float)(x >> 8) / 16777216.0f * 2.0f - 1.0f;
        if (i < TQ * D)
            q[i] = r;
        else if (i < TQ * D + TK * D)
            k[i - TQ * D] = r;
        else
            v[i - TQ * D - TK * D] = r;
    }
    for (int i = 0; i < TQ; i++) {
        double s[TK], m = -INFINITY, l = 0;
        for (int j = 0; j < TK; j++) {
            s[j] = 0;
            for (int d = 0; d < D; d++)
                s[j] += (double)q[i * D + d] * k[j * D + d];
            s[j] /= 2.0; /* 1 / sqrt(D) */
            m = s[j] > m ? s[j] : m;
        }
        for (int j = 0; j < TK; j++)
            l += exp(s[j] - m);
        for (int c = 0; c < DV; c++) {
            double a = 0;
            for (int j = 0; j < TK; j++)
                a += exp(s[j] - m) / l * v[j * DV + c];
            oe[i * DV + c] = (float)a;
        }
    }
    cr_assert_eq(mkdir(P("demo70"), 0755), 0);
    cr_assert_eq(mkdir(P("demo70/worked_example"), 0755), 0);
    const int64_t sq[2] = {TQ, D}, sk[2] = {TK, D}, sv[2] = {TK, DV}, so[2] = {TQ, DV};
    write_f32(P("demo70/worked_example/Q.npy"), 2, sq, q);
    write_f32(P("demo70/worked_example/K.npy"), 2, sk, k);
    write_f32(P("demo70/worked_example/V.npy"), 2, sv, v);
    write_f32(P("demo70/worked_example/O_expected.npy"), 2, so, oe);
    const char *args[] = {"demo", "--data", P("demo70"), "--threads", "1", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "%s\n%s", r->out, r->err);
    const char *line = strstr(r->out, "max |O - float64 reference| = ");
    cr_assert_not_null(line, "%s", r->out);
    const double e64 = strtod(line + strlen("max |O - float64 reference| = "), NULL);
    cr_expect(e64 > 0 && e64 <= 1e-6, "float64 error %g over 70 columns: %s", e64, line);
}

/* demo --data with an example of 0 query rows (or 0 output columns): exit 2, one line
 * (a review, session 31: it printed "ok", having compared nothing). */
Test(cli, demo_data_empty_example_refused)
{
    static const int64_t shapes[2][4][2] = {{{0, 4}, {5, 4}, {5, 3}, {0, 3}}, {{2, 4}, {5, 4}, {5, 0}, {2, 0}}};
    static const char *const names[4] = {"Q", "K", "V", "O_expected"};
    float zeros[64] = {0};
    for (int c = 0; c < 2; c++) {
        char dir[64], path[160];
        snprintf(dir, sizeof dir, "demo_empty%d", c);
        cr_assert_eq(mkdir(P(dir), 0755), 0);
        snprintf(path, sizeof path, "%s/worked_example", dir);
        cr_assert_eq(mkdir(P(path), 0755), 0);
        for (int i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "%s/worked_example/%s.npy", dir, names[i]);
            write_f32(P(path), 2, shapes[c][i], zeros);
        }
        const char *args[] = {"demo", "--data", P(dir), NULL};
        run_result *r = run(args);
        cr_expect_eq(r->status, 2, "%s: exit %d, %s", dir, r->status, r->out);
        cr_expect_eq(count_lines(r->err), 1, "%s", r->err);
    }
}

/* An ISA this machine cannot run is a bad value: one error line and the usage (README),
 * exit 2 (a review, session 30: the usage was missing, and the line said "not compiled
 * in on this machine"). */
Test(cli, unavailable_isa_is_a_usage_error)
{
    static const char *const isas[] = {"scalar", "avx2", "avx512", "amx", "neon"};
    int seen = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        sdpa_isa isa;
        if (sdpa_isa_from_name(isas[i], &isa) != 0 || sdpa_isa_supported(isa))
            continue;
        seen++;
        const char *args[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("o.npy"),
                              "--isa", isas[i], NULL};
        run_result *r = run(args);
        cr_expect_eq(r->status, 2, "%s", isas[i]);
        cr_expect_not_null(strstr(r->err, "not available here"), "%s: %s", isas[i], r->err);
        cr_expect_not_null(strstr(r->err, "usage:"), "%s: no usage: %s", isas[i], r->err);
    }
    cr_expect(seen > 0, "every ISA runs here: nothing checked (x86 cannot run neon, Arm cannot run avx2)");
}

/* ------------------------------------------------------------ worked example */

Test(cli, worked_example_forward)
{
    static const float Q[6] = {1, 0, 0, 1, 1, 1}, K[6] = {1, 0, 0, 1, 0.5f, 0.5f}, V[6] = {10, 0, 0, 10, 5, 5};
    const char *dir = EXAMPLES_DIR "/worked_example";
    char qp[512], kp[512], vp[512], ep[512];
    int nd;
    int64_t shape[8];
    snprintf(qp, sizeof qp, "%s/Q.npy", dir);
    snprintf(kp, sizeof kp, "%s/K.npy", dir);
    snprintf(vp, sizeof vp, "%s/V.npy", dir);
    snprintf(ep, sizeof ep, "%s/O_expected.npy", dir);
    /* The shipped inputs are the documented ones. */
    const char *paths[3] = {qp, kp, vp};
    const float *want_in[3] = {Q, K, V};
    for (int t = 0; t < 3; t++) {
        float *x = read_f32(paths[t], &nd, shape);
        cr_assert_eq(nd, 2);
        cr_assert(shape[0] == 3 && shape[1] == 2);
        cr_assert(memcmp(x, want_in[t], sizeof Q) == 0, "%s differs from the textbook values", paths[t]);
        free(x);
    }
    const char *args[] = {"forward", "-q", qp, "-k", kp, "-v", vp, "-o", P("O.npy"), NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    refp p = {1, 1, 1, 3, 3, 2, 2, 0, 0, 0, -1, -1, 0, NULL, NULL, {0}, NULL, {0}};
    double o[6], lse[3];
    refp_forward(&p, Q, K, V, o, lse);
    /* float64: O = [[6.1546, 3.8454], [3.8454, 6.1546], [5, 5]] */
    cr_assert(fabs(o[0] - 6.1546057) < 1e-6 && fabs(o[1] - 3.8453943) < 1e-6 && o[4] == 5.0);
    float *got = read_f32(P("O.npy"), &nd, shape);
    cr_assert(nd == 2 && shape[0] == 3 && shape[1] == 2);
    expect_close("O", got, o, 6, 1e-6);
    float *exp_o = read_f32(ep, &nd, shape);
    cr_assert(nd == 2 && shape[0] == 3 && shape[1] == 2);
    expect_close("O_expected.npy", exp_o, o, 6, 1e-6);
    free(got);
    free(exp_o);
}

/* ------------------------------------------------------------ forward round trips */

/* Forward round trips that differ only by shape, rank and options: the
 * descriptor fields the reference gets, and the flags that say the same to the tool. */
typedef struct forward_options {
    const char *name;
    int rank, B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int causal;         /* refp.causal */
    double scale;       /* refp.scale */
    int windowed;       /* 0: wl = wr = -1 (unbounded) */
    long wl, wr;
    int align_br;
    const char *extra[12]; /* the tool's flags, NULL-terminated */
} forward_options;

static const forward_options forward_options_cases[] = {
    {"rank 2", 2, 1, 1, 1, 7, 9, 16, 12, 0, 0, 0, 0, 0, 0, {NULL}},
    {"rank 3, causal top-left", 3, 1, 3, 3, 5, 5, 8, 8, 1, 0, 0, 0, 0, 0, {"--causal", "top-left", NULL}},
    {"rank 4, scale", 4, 2, 2, 2, 4, 6, 5, 3, 0, 0.3, 0, 0, 0, 0, {"--scale", "0.3", NULL}},
    {"negative scale, --scale=X form", 3, 1, 2, 2, 4, 6, 5, 3, 0, -1.5, 0, 0, 0, 0, {"--scale=-1.5", NULL}},
    {"GQA, rank 4", 4, 2, 6, 2, 5, 7, 8, 6, 0, 0, 0, 0, 0, 0, {NULL}},
    {"MQA, rank 3, causal bottom-right", 3, 1, 4, 1, 4, 9, 8, 4, 2, 0, 0, 0, 0, 0,
     {"--causal", "bottom-right", NULL}},
    {"window, bottom-right alignment", 4, 1, 2, 2, 6, 10, 4, 4, 0, 0, 1, 2, 1, 1,
     {"--window-left", "2", "--window-right", "1", "--window-align", "bottom-right", NULL}},
    {"causal + window", 2, 1, 1, 1, 9, 9, 4, 4, 1, 0, 1, 3, -1, 0,
     {"--causal", "top-left", "--window-left", "3", NULL}},
    {"empty keys (Tk = 0: every row fully masked)", 2, 1, 1, 1, 3, 0, 4, 5, 0, 0, 0, 0, 0, 0, {NULL}},
    {"--isa scalar, one thread", 4, 1, 2, 2, 33, 40, 16, 16, 1, 0, 0, 0, 0, 0,
     {"--isa", "scalar", "--threads", "1", "--causal", "top-left", NULL}},
};

#define N_FORWARD_OPTIONS (sizeof forward_options_cases / sizeof forward_options_cases[0])

/* Criterion copies the parameters into each test's own process, where pointers
 * into this one may not hold: the parameter is the index of the case. */
ParameterizedTestParameters(cli, forward_with_options)
{
    static size_t index[N_FORWARD_OPTIONS];
    for (size_t i = 0; i < N_FORWARD_OPTIONS; i++)
        index[i] = i;
    return cr_make_param_array(size_t, index, N_FORWARD_OPTIONS);
}

ParameterizedTest(size_t *index, cli, forward_with_options)
{
    const forward_options *c = &forward_options_cases[*index];
    fixture f;
    cr_log_info("cli/forward_with_options: %s", c->name);
    fixture_make(&f, c->rank, c->B, c->Hq, c->Hkv, c->Tq, c->Tk, c->Dk, c->Dv);
    f.p.causal = c->causal;
    f.p.scale = c->scale;
    if (c->windowed) {
        f.p.wl = c->wl;
        f.p.wr = c->wr;
    }
    f.p.align_br = c->align_br;
    check_forward(&f, c->extra);
    fixture_free(&f);
}

/* --diagonal-offset: causal and a window on a moved diagonal (queries later, then
 * earlier than the keys), against the float64 reference with the same offset. */
Test(cli, forward_diagonal_offset)
{
    static const long offs[] = {6, -3};
    for (int t = 0; t < 2; t++) {
        fixture f;
        fixture_make(&f, 4, 1, 2, 1, 7, 11, 8, 8);
        char off[16];
        snprintf(off, sizeof off, "%ld", offs[t]);
        f.p.off = offs[t];
        f.p.causal = t == 0;
        if (t == 1) {
            f.p.wl = 2;
            f.p.wr = 4;
        }
        const char *causal[] = {"--causal", "top-left", "--diagonal-offset", off, NULL};
        const char *window[] = {"--window-left", "2", "--window-right", "4", "--diagonal-offset", off, NULL};
        check_forward(&f, t == 0 ? causal : window);
        fixture_free(&f);
    }
}

/* check_forward with the boolean mask m (dtype descr, the given .npy shape) as
 * M.npy, read by the reference through the element strides ms (batch, head,
 * query, key). */
static void check_forward_mask(fixture *f, const char *descr, int ndim, const int64_t *shape, const uint8_t *m,
                               const long ms[4])
{
    write_typed(P("M.npy"), descr, 1, ndim, shape, m, 1, 0);
    f->p.mask = m;
    memcpy(f->p.ms, ms, sizeof f->p.ms);
    const char *extra[] = {"--mask", P("M.npy"), NULL};
    check_forward(f, extra);
}

Test(cli, forward_mask_keys_bool)
{
    fixture f;
    fixture_make(&f, 4, 2, 2, 1, 5, 7, 8, 6);
    uint8_t m[7] = {1, 0, 1, 1, 0, 0, 1};
    const int64_t s[1] = {7};
    check_forward_mask(&f, "|b1", 1, s, m, (const long[4]){0, 0, 0, 1});
    fixture_free(&f);
}

Test(cli, forward_mask_query_key_uint8)
{
    fixture f;
    fixture_make(&f, 3, 1, 3, 3, 5, 6, 8, 6);
    uint8_t m[30];
    for (int i = 0; i < 30; i++)
        m[i] = (uint8_t)((i * 7) % 3 == 0 ? 0 : (i % 2 ? 2 : 255)); /* any nonzero byte allows */
    const int64_t s[2] = {5, 6};
    check_forward_mask(&f, "|u1", 2, s, m, (const long[4]){0, 0, 6, 1});
    fixture_free(&f);
}

Test(cli, forward_mask_batch_1_q_k_with_empty_row)
{
    fixture f;
    fixture_make(&f, 4, 2, 2, 2, 4, 5, 8, 3);
    uint8_t m[2 * 4 * 5];
    for (int i = 0; i < 40; i++)
        m[i] = (uint8_t)((i % 3) != 1);
    for (int j = 0; j < 5; j++) /* batch 1, query 2: no key allowed -> O = 0, LSE = -inf */
        m[20 + 2 * 5 + j] = 0;
    const int64_t s[4] = {2, 1, 4, 5};
    check_forward_mask(&f, "|b1", 4, s, m, (const long[4]){20, 0, 5, 1});
    fixture_free(&f);
}

Test(cli, forward_bias_float_broadcast)
{
    fixture f;
    fixture_make(&f, 4, 2, 4, 2, 3, 6, 4, 4);
    /* bias of shape (Hq, 1, Tk): per head and key, broadcast over batch and queries */
    float bias[4 * 6];
    for (int i = 0; i < 24; i++)
        bias[i] = 2.0f * frand();
    bias[7] = -INFINITY;
    bias[15] = -1e30f; /* finite: does not mask */
    const int64_t s[3] = {4, 1, 6};
    write_f32(P("Bias.npy"), 3, s, bias);
    f.p.bias = bias;
    f.p.bs[1] = 6;
    f.p.bs[3] = 1;
    const char *extra[] = {"--bias", P("Bias.npy"), "--causal", "bottom-right", NULL};
    f.p.causal = 2;
    check_forward(&f, extra);
    fixture_free(&f);
}

Test(cli, forward_mask_and_bias_full_shape)
{
    fixture f;
    fixture_make(&f, 4, 1, 2, 2, 3, 4, 4, 4);
    float bias[24];
    uint8_t m[24];
    for (int i = 0; i < 24; i++) {
        bias[i] = frand();
        m[i] = (uint8_t)(i % 5 != 0);
    }
    const int64_t s[4] = {1, 2, 3, 4};
    write_f32(P("Bias.npy"), 4, s, bias);
    write_typed(P("M.npy"), "|b1", 1, 4, s, m, 1, 0);
    f.p.bias = bias;
    f.p.mask = m;
    f.p.bs[1] = f.p.ms[1] = 12;
    f.p.bs[2] = f.p.ms[2] = 4;
    f.p.bs[3] = f.p.ms[3] = 1;
    const char *extra[] = {"--bias", P("Bias.npy"), "--mask", P("M.npy"), NULL};
    check_forward(&f, extra);
    fixture_free(&f);
}

/* The per-batch key lengths lens[0..B) as L.npy in dtype descr ("<i4" or
 * "<i8"), and for the reference. */
static void write_kv_len(fixture *f, const int32_t *lens, const char *descr)
{
    const int64_t s[1] = {f->p.B};
    int64_t wide[16];
    cr_assert_leq(f->p.B, 16);
    for (int b = 0; b < f->p.B; b++)
        wide[b] = lens[b];
    if (strcmp(descr, "<i8") == 0)
        write_typed(P("L.npy"), descr, 8, 1, s, wide, 1, 0);
    else
        write_typed(P("L.npy"), descr, 4, 1, s, lens, 1, 0);
    f->p.kvlen = lens;
}

Test(cli, forward_kv_len_int32)
{
    fixture f;
    fixture_make(&f, 4, 3, 2, 2, 4, 6, 8, 5);
    int32_t lens[3] = {6, 3, 0};
    write_kv_len(&f, lens, "<i4");
    const char *extra[] = {"--kv-len", P("L.npy"), NULL};
    check_forward(&f, extra);
    fixture_free(&f);
}

Test(cli, forward_kv_len_int64_causal_bottom_right)
{
    fixture f;
    fixture_make(&f, 4, 2, 2, 1, 3, 8, 4, 4);
    int32_t lens[2] = {5, 8};
    write_kv_len(&f, lens, "<i8");
    f.p.causal = 2;
    const char *extra[] = {"--kv-len", P("L.npy"), "--causal", "bottom-right", NULL};
    check_forward(&f, extra);
    fixture_free(&f);
}

Test(cli, forward_npy_versions_2_and_3)
{
    fixture f;
    fixture_make(&f, 3, 1, 2, 2, 4, 5, 4, 3);
    int64_t s[3] = {2, 4, 4};
    write_typed(P("Q.npy"), "<f4", 4, 3, s, f.q, 2, 0);
    s[1] = 5;
    write_typed(P("K.npy"), "<f4", 4, 3, s, f.k, 3, 0);
    check_forward(&f, NULL);
    fixture_free(&f);
}

Test(cli, forward_replaces_existing_output)
{
    fixture f;
    fixture_make(&f, 2, 1, 1, 1, 3, 4, 4, 4);
    write_bytes(P("O.npy"), "old contents", 12);
    write_bytes(P("LSE.npy"), "old", 3);
    check_forward(&f, NULL);
    fixture_free(&f);
}

/* ------------------------------------------------------------ backward */

static void check_backward(const fixture *f, int give_o_lse, const char *const *extra)
{
    const refp *p = &f->p;
    int64_t s[4];
    int nd;
    int64_t shape[8];
    const size_t nq = (size_t)p->B * p->Hq * p->Tq, nk = (size_t)p->B * p->Hkv * p->Tk;
    float *dout = rand_floats(nq * p->Dv);
    shape_rank(f->rank, p->B, p->Hq, p->Tq, p->Dv, s);
    write_f32(P("dO.npy"), f->rank, s, dout);

    const char *args[64] = {"backward", "-q",   P("Q.npy"),  "-k",   P("K.npy"),  "-v",   P("V.npy"),
                            "--do",     P("dO.npy"), "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv",
                            P("dV.npy")};
    int n = 15;
    if (give_o_lse) {
        /* O and LSE from the tool's own forward */
        const char *fa[48] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"),
                              "-o",      P("O.npy"), "--lse", P("LSE.npy")};
        int m = 11;
        for (int i = 0; extra && extra[i]; i++)
            fa[m++] = extra[i];
        fa[m] = NULL;
        given_o_lse(fa, args, &n);
    }
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "backward failed (%d): %s", r->status, r->err);
    cr_assert_str_empty(r->err);

    double *dq = malloc(nq * p->Dk * sizeof(double) + 1), *dk = malloc(nk * p->Dk * sizeof(double) + 1),
           *dv = malloc(nk * p->Dv * sizeof(double) + 1);
    refp_backward(p, f->q, f->k, f->v, dout, dq, dk, dv);
    float *g = read_f32(P("dQ.npy"), &nd, shape);
    shape_rank(f->rank, p->B, p->Hq, p->Tq, p->Dk, s);
    expect_shape(nd, shape, f->rank, s);
    expect_close("dQ", g, dq, nq * p->Dk, 2e-5);
    free(g);
    g = read_f32(P("dK.npy"), &nd, shape);
    shape_rank(f->rank, p->B, p->Hkv, p->Tk, p->Dk, s);
    expect_shape(nd, shape, f->rank, s);
    expect_close("dK", g, dk, nk * p->Dk, 2e-5);
    free(g);
    g = read_f32(P("dV.npy"), &nd, shape);
    shape_rank(f->rank, p->B, p->Hkv, p->Tk, p->Dv, s);
    expect_shape(nd, shape, f->rank, s);
    expect_close("dV", g, dv, nk * p->Dv, 2e-5);
    free(g);
    free(dq);
    free(dk);
    free(dv);
    free(dout);
}

Test(cli, backward_rank3_recomputes_forward)
{
    fixture f;
    fixture_make(&f, 3, 1, 2, 2, 6, 9, 8, 5);
    f.p.causal = 2;
    const char *extra[] = {"--causal", "bottom-right", NULL};
    check_backward(&f, 0, extra);
    fixture_free(&f);
}

Test(cli, backward_rank4_gqa_given_o_lse)
{
    fixture f;
    fixture_make(&f, 4, 2, 4, 2, 5, 7, 6, 4);
    check_backward(&f, 1, NULL);
    fixture_free(&f);
}

Test(cli, backward_rank2_masks)
{
    fixture f;
    fixture_make(&f, 2, 1, 1, 1, 5, 6, 4, 3);
    uint8_t m[6] = {1, 1, 0, 1, 1, 1};
    float bias[30];
    int32_t lens[1] = {5};
    for (int i = 0; i < 30; i++)
        bias[i] = frand();
    const int64_t sm[1] = {6}, sb[2] = {5, 6}, sl[1] = {1};
    write_typed(P("M.npy"), "|u1", 1, 1, sm, m, 1, 0);
    write_f32(P("Bias.npy"), 2, sb, bias);
    write_typed(P("L.npy"), "<i4", 4, 1, sl, lens, 1, 0);
    f.p.mask = m;
    f.p.ms[3] = 1;
    f.p.bias = bias;
    f.p.bs[2] = 6;
    f.p.bs[3] = 1;
    f.p.kvlen = lens;
    f.p.causal = 1;
    f.p.scale = 0.7;
    const char *extra[] = {"--mask", P("M.npy"), "--bias", P("Bias.npy"), "--kv-len", P("L.npy"),
                           "--causal", "top-left", "--scale", "0.7", NULL};
    check_backward(&f, 1, extra);
    fixture_free(&f);
}

/* ------------------------------------------------------------ bad files */

static const char *const SENTINEL = "pre-existing output, must survive";

static void list_dir_check_no_temp(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *e;
    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL)
        cr_assert_null(strstr(e->d_name, ".tmp"), "temporary file left behind: %s", e->d_name);
    closedir(d);
}

/* Runs args twice: once with the outputs absent (they must stay absent), once
 * with them pre-existing (they must stay unchanged). Each run must exit 2 with
 * exactly one line "sdpa: error: <blame>: ..." on stderr (blame NULL: any
 * "sdpa: error: " line; usage: the error may be followed by usage lines). */
static void expect_failure(const char *const *args, const char *const *outputs, const char *blame, int usage)
{
    char want[600], buf[256];
    if (blame)
        snprintf(want, sizeof want, "sdpa: error: %s: ", blame);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; outputs[i]; i++) {
            unlink(outputs[i]);
            if (pass == 1)
                write_bytes(outputs[i], SENTINEL, strlen(SENTINEL));
        }
        run_result *r = run(args);
        cr_assert_eq(r->status, 2, "exit status %d, expected 2; stderr: %s", r->status, r->err);
        cr_assert_str_empty(r->out, "stdout: %s", r->out);
        cr_assert(strncmp(r->err, "sdpa: error: ", 13) == 0, "stderr: %s", r->err);
        if (usage)
            cr_assert_not_null(strstr(r->err, "usage:"), "stderr: %s", r->err);
        else
            cr_assert_eq(count_lines(r->err), 1, "expected one line on stderr, got:\n%s", r->err);
        if (blame)
            cr_assert(strncmp(r->err, want, strlen(want)) == 0, "expected '%s...', got: %s", want, r->err);
        for (int i = 0; outputs[i]; i++) {
            if (pass == 0) {
                cr_assert(!exists(outputs[i]), "%s was created", outputs[i]);
            } else {
                FILE *f = fopen(outputs[i], "rb");
                size_t n;
                cr_assert_not_null(f);
                n = fread(buf, 1, sizeof buf - 1, f);
                fclose(f);
                buf[n] = '\0';
                cr_assert_str_eq(buf, SENTINEL, "%s was modified", outputs[i]);
            }
        }
        list_dir_check_no_temp();
    }
}

/* Standard valid rank-4 inputs Q/K/V.npy (B=2, Hq=4, Hkv=2, Tq=5, Tk=7, Dk=8, Dv=6). */
static void valid_inputs(void)
{
    fixture f;
    fixture_make(&f, 4, 2, 4, 2, 5, 7, 8, 6);
    fixture_free(&f);
}

/* forward with Q/K/V replaced by `q`, `k`, `v` (NULL: the valid one) plus extra. */
static void expect_forward_failure(const char *q, const char *k, const char *v, const char *const *extra,
                                   const char *blame)
{
    const char *args[48] = {"forward", "-q", q ? q : P("Q.npy"), "-k", k ? k : P("K.npy"), "-v",
                            v ? v : P("V.npy"), "-o", P("O.npy"), "--lse", P("LSE.npy")};
    const char *outs[] = {P("O.npy"), P("LSE.npy"), NULL};
    int n = 11;
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    expect_failure(args, outs, blame, 0);
}

static void float_zeros_npy(const char *path, const char *descr, size_t elsize, int ndim, const int64_t *shape,
                            int major, int fortran)
{
    size_t n = shape_count(ndim, shape) * elsize;
    void *z = calloc(1, n + 1);
    write_typed(path, descr, elsize, ndim, shape, z, major, fortran);
    free(z);
}

/* Q.npy replaced by zeros of Q's valid shape (2, 4, 5, 8) stored as `descr`
 * (elsize bytes an element, Fortran order if fortran): forward must fail naming it. */
static void expect_bad_query_storage(const char *descr, size_t elsize, int fortran)
{
    valid_inputs();
    const int64_t s[4] = {2, 4, 5, 8};
    float_zeros_npy(P("bad.npy"), descr, elsize, 4, s, 1, fortran);
    expect_forward_failure(P("bad.npy"), NULL, NULL, NULL, P("bad.npy"));
}

Test(cli, bad_missing_file)
{
    valid_inputs();
    expect_forward_failure(P("nothere.npy"), NULL, NULL, NULL, P("nothere.npy"));
}

Test(cli, bad_magic)
{
    valid_inputs();
    static const char zip[] = "PK\x03\x04 this is a zip, not an npy file at all..........";
    write_bytes(P("bad.npy"), zip, sizeof zip - 1);
    expect_forward_failure(NULL, P("bad.npy"), NULL, NULL, P("bad.npy"));
}

Test(cli, bad_empty_file)
{
    valid_inputs();
    write_bytes(P("bad.npy"), "", 0);
    expect_forward_failure(NULL, NULL, P("bad.npy"), NULL, P("bad.npy"));
}

Test(cli, bad_version)
{
    valid_inputs();
    const int64_t s[4] = {2, 4, 5, 8};
    float_zeros_npy(P("bad.npy"), "<f4", 4, 4, s, 1, 0);
    FILE *f = fopen(P("bad.npy"), "r+b");
    fseek(f, 6, SEEK_SET);
    fputc(4, f); /* version 4.0 */
    fclose(f);
    expect_forward_failure(P("bad.npy"), NULL, NULL, NULL, P("bad.npy"));
}

Test(cli, bad_dtype_float64)
{
    expect_bad_query_storage("<f8", 8, 0);
}

Test(cli, bad_dtype_int32_for_query)
{
    expect_bad_query_storage("<i4", 4, 0);
}

Test(cli, bad_big_endian)
{
    valid_inputs();
    const int64_t s[4] = {2, 2, 7, 8};
    float_zeros_npy(P("bad.npy"), ">f4", 4, 4, s, 1, 0);
    expect_forward_failure(NULL, P("bad.npy"), NULL, NULL, P("bad.npy"));
    cr_assert_not_null(strstr(run((const char *const[]){"forward", "-q", P("Q.npy"), "-k", P("bad.npy"), "-v",
                                                         P("V.npy"), "-o", P("O.npy"), NULL})
                                  ->err,
                              "big-endian"));
}

Test(cli, bad_fortran_order)
{
    expect_bad_query_storage("<f4", 4, 1);
}

Test(cli, bad_truncated_data)
{
    valid_inputs();
    float z[10] = {0};
    write_npy_raw(P("bad.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 7, 6), }", z,
                  sizeof z);
    expect_forward_failure(NULL, NULL, P("bad.npy"), NULL, P("bad.npy"));
}

Test(cli, bad_truncated_header)
{
    valid_inputs();
    write_bytes(P("bad.npy"), "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran", 35);
    expect_forward_failure(P("bad.npy"), NULL, NULL, NULL, P("bad.npy"));
}

Test(cli, bad_trailing_data)
{
    valid_inputs();
    float z[2 * 4 * 5 * 8 + 3] = {0};
    write_npy_raw(P("bad.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4, 5, 8), }", z,
                  sizeof z);
    expect_forward_failure(P("bad.npy"), NULL, NULL, NULL, P("bad.npy"));
}

Test(cli, bad_header_garbage)
{
    valid_inputs();
    static const char *const dicts[] = {
        "hello, world",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4, 5, 8), 'extra': 1}",
        "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 4, 5, 8)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -4, 5, 8)}",
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4, 5, 8)} trailing",
        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 4, 5, 8]}",
    };
    float z[2 * 4 * 5 * 8] = {0};
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
        write_npy_raw(P("bad.npy"), 1, dicts[i], z, sizeof z);
        expect_forward_failure(P("bad.npy"), NULL, NULL, NULL, P("bad.npy"));
    }
}

Test(cli, bad_query_rank)
{
    valid_inputs();
    const int64_t s1[1] = {8}, s5[5] = {1, 2, 4, 5, 8};
    float_zeros_npy(P("bad.npy"), "<f4", 4, 1, s1, 1, 0);
    expect_forward_failure(P("bad.npy"), NULL, NULL, NULL, P("bad.npy"));
    float_zeros_npy(P("bad.npy"), "<f4", 4, 5, s5, 1, 0);
    expect_forward_failure(P("bad.npy"), NULL, NULL, NULL, P("bad.npy"));
}

Test(cli, bad_shapes_do_not_fit)
{
    valid_inputs();
    const int64_t k_dim[4] = {2, 2, 7, 9}, k_rank[3] = {2, 7, 8}, k_batch[4] = {3, 2, 7, 8},
                  k_heads[4] = {2, 3, 7, 8}, v_len[4] = {2, 2, 6, 6}, v_heads[4] = {2, 1, 7, 6};
    float_zeros_npy(P("bad.npy"), "<f4", 4, 4, k_dim, 1, 0);
    expect_forward_failure(NULL, P("bad.npy"), NULL, NULL, P("bad.npy"));
    float_zeros_npy(P("bad.npy"), "<f4", 4, 3, k_rank, 1, 0);
    expect_forward_failure(NULL, P("bad.npy"), NULL, NULL, P("bad.npy"));
    float_zeros_npy(P("bad.npy"), "<f4", 4, 4, k_batch, 1, 0);
    expect_forward_failure(NULL, P("bad.npy"), NULL, NULL, P("bad.npy"));
    float_zeros_npy(P("bad.npy"), "<f4", 4, 4, k_heads, 1, 0); /* Hq = 4 not a multiple of 3 */
    expect_forward_failure(NULL, P("bad.npy"), NULL, NULL, P("bad.npy"));
    float_zeros_npy(P("bad.npy"), "<f4", 4, 4, v_len, 1, 0);
    expect_forward_failure(NULL, NULL, P("bad.npy"), NULL, P("bad.npy"));
    float_zeros_npy(P("bad.npy"), "<f4", 4, 4, v_heads, 1, 0);
    expect_forward_failure(NULL, NULL, P("bad.npy"), NULL, P("bad.npy"));
}

Test(cli, bad_mask)
{
    valid_inputs(); /* target (B, Hq, Tq, Tk) = (2, 4, 5, 7) */
    const int64_t not_bc[2] = {3, 7}, rank5[5] = {1, 2, 4, 5, 7}, heads[4] = {2, 2, 5, 7}, ok[1] = {7};
    const char *extra[] = {"--mask", P("M.npy"), NULL};
    float_zeros_npy(P("M.npy"), "|b1", 1, 2, not_bc, 1, 0);
    expect_forward_failure(NULL, NULL, NULL, extra, P("M.npy"));
    float_zeros_npy(P("M.npy"), "|b1", 1, 5, rank5, 1, 0);
    expect_forward_failure(NULL, NULL, NULL, extra, P("M.npy"));
    float_zeros_npy(P("M.npy"), "|u1", 1, 4, heads, 1, 0);
    expect_forward_failure(NULL, NULL, NULL, extra, P("M.npy"));
    float_zeros_npy(P("M.npy"), "<f4", 4, 1, ok, 1, 0); /* float mask: wrong dtype */
    expect_forward_failure(NULL, NULL, NULL, extra, P("M.npy"));
    const char *missing[] = {"--mask", P("nomask.npy"), NULL};
    expect_forward_failure(NULL, NULL, NULL, missing, P("nomask.npy"));
}

Test(cli, bad_bias)
{
    valid_inputs();
    const int64_t ok[2] = {5, 7}, not_bc[2] = {5, 6};
    const char *extra[] = {"--bias", P("B.npy"), NULL};
    float_zeros_npy(P("B.npy"), "|b1", 1, 2, ok, 1, 0);
    expect_forward_failure(NULL, NULL, NULL, extra, P("B.npy"));
    float_zeros_npy(P("B.npy"), "<f4", 4, 2, not_bc, 1, 0);
    expect_forward_failure(NULL, NULL, NULL, extra, P("B.npy"));
}

Test(cli, bad_kv_len)
{
    valid_inputs(); /* B = 2, Tk = 7 */
    const char *extra[] = {"--kv-len", P("L.npy"), NULL};
    const int64_t s3[1] = {3}, s2[1] = {2}, s12[2] = {1, 2};
    int32_t three[3] = {1, 2, 3}, too_long[2] = {7, 8}, negative[2] = {-1, 3};
    int64_t huge[2] = {3, (int64_t)1 << 40};
    float fl[2] = {3, 4};
    const struct {
        const char *descr;
        size_t elsize;
        int ndim;
        const int64_t *shape;
        const void *data;
    } bad[] = {
        {"<i4", 4, 1, s3, three},   {"<i4", 4, 2, s12, too_long}, {"<i4", 4, 1, s2, too_long},
        {"<i4", 4, 1, s2, negative}, {"<i8", 8, 1, s2, huge},      {"<f4", 4, 1, s2, fl},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_typed(P("L.npy"), bad[i].descr, bad[i].elsize, bad[i].ndim, bad[i].shape, bad[i].data, 1, 0);
        expect_forward_failure(NULL, NULL, NULL, extra, P("L.npy"));
    }
}

Test(cli, bad_output_directory)
{
    valid_inputs();
    const char *o = P("no/such/dir/O.npy");
    const char *args[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", o, NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 2);
    cr_assert_eq(count_lines(r->err), 1, "%s", r->err);
    cr_assert_not_null(strstr(r->err, o));
    /* the valid -o must not be created when --lse cannot be */
    const char *args2[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                           "--lse", o, NULL};
    const char *outs[] = {P("O.npy"), NULL};
    expect_failure(args2, outs, o, 0);
}

Test(cli, bad_backward_inputs)
{
    valid_inputs(); /* dO must be (2, 4, 5, 6); LSE (2, 4, 5) */
    const int64_t do_bad[4] = {2, 4, 5, 8}, do_ok[4] = {2, 4, 5, 6}, lse_bad[3] = {2, 4, 6}, lse_ok[3] = {2, 4, 5};
    const char *outs[] = {P("dQ.npy"), P("dK.npy"), P("dV.npy"), NULL};
    float_zeros_npy(P("dO.npy"), "<f4", 4, 4, do_bad, 1, 0);
    const char *a1[] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "--do", P("dO.npy"),
                        "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv", P("dV.npy"), NULL};
    expect_failure(a1, outs, P("dO.npy"), 0);

    float_zeros_npy(P("dO.npy"), "<f4", 4, 4, do_ok, 1, 0);
    float_zeros_npy(P("O.npy"), "<f4", 4, 4, do_ok, 1, 0);
    float_zeros_npy(P("LSE.npy"), "<f4", 4, 3, lse_bad, 1, 0);
    const char *a2[] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "--do", P("dO.npy"),
                        "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv", P("dV.npy"), "-o", P("O.npy"),
                        "--lse", P("LSE.npy"), NULL};
    expect_failure(a2, outs, P("LSE.npy"), 0);

    float_zeros_npy(P("LSE.npy"), "<f4", 4, 3, lse_ok, 1, 0);
    float_zeros_npy(P("O.npy"), "<f4", 4, 4, do_bad, 1, 0);
    expect_failure(a2, outs, P("O.npy"), 0);

    /* -o without --lse: a usage error, nothing written */
    const char *a3[] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "--do", P("dO.npy"),
                        "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv", P("dV.npy"), "-o", P("O.npy"), NULL};
    expect_failure(a3, outs, NULL, 1);
}

Test(cli, usage_errors)
{
    valid_inputs();
    const char *outs[] = {P("O.npy"), NULL};
    const char *no_o[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), NULL};
    const char *unknown[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                             "--frobnicate", NULL};
    const char *causal[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                            "--causal", "sideways", NULL};
    const char *threads[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                             "--threads", "many", NULL};
    const char *scale[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                           "--scale", "nan", NULL};
    const char *isa[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                         "--isa", "mmx", NULL};
    const char *noval[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                           "--window-left", NULL};
    const char *twice[] = {"forward", "-q", P("Q.npy"), "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"),
                           "-o", P("O.npy"), NULL};
    const char *const *all[] = {no_o, unknown, causal, threads, scale, isa, noval, twice};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        expect_failure(all[i], outs, NULL, 1);
}

/* ------------------------------------------------------------------ bench */

/* `sdpa bench --json` emits one JSON object per line with the documented
 * fields (an interface scripts depend on); a tiny shape keeps it quick. */
Test(cli, bench_json_fields)
{
    const char *args[] = {"bench", "--no-limits", "--no-naive", "--isa", "scalar", "--threads", "1",
                          "--shape", "1,2,1,8,9,4,3", "--mask", "causal", "--op", "both", "--reps", "1",
                          "--json", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    static const char *const fields[] = {"\"impl\":\"sdpa\"", "\"isa\":\"scalar\"", "\"threads\":1", "\"B\":1",
                                         "\"Hq\":2", "\"Hkv\":1", "\"Tq\":8", "\"Tk\":9", "\"Dk\":4", "\"Dv\":3",
                                         "\"mask\":\"causal\"", "\"ms\":", "\"gflops\":", "\"peak_gflops\":"};
    int rows = 0, fwd = 0, bwd = 0;
    for (const char *line = r->out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *end = strchr(line, '\n');
        const size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len == 0)
            continue;
        char buf[2048];
        cr_assert_lt(len, sizeof buf);
        memcpy(buf, line, len);
        buf[len] = '\0';
        cr_assert(buf[0] == '{' && buf[len - 1] == '}', "not a JSON object line: %s", buf);
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            cr_expect_not_null(strstr(buf, fields[f]), "field %s missing in: %s", fields[f], buf);
        fwd += strstr(buf, "\"op\":\"forward\"") != NULL;
        bwd += strstr(buf, "\"op\":\"backward\"") != NULL;
        rows++;
    }
    cr_expect_eq(rows, 2, "expected one forward and one backward row, got %d:\n%s", rows, r->out);
    cr_expect_eq(fwd, 1);
    cr_expect_eq(bwd, 1);
}

/* --bw-interleaved: a decode row (Tq <= 16) gets bw_interleaved_gbps > 0 and
 * pct_bw_interleaved = 100 gbps / bw_interleaved_gbps, plus a '# read bandwidth'
 * line in the table; a prefill row of the same run gets neither, and without the
 * flag no row has them. */
static double json_field(const char *line, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *p = strstr(line, key);
    return p ? strtod(p + strlen(key), NULL) : -1.0;
}

Test(cli, bench_bw_interleaved)
{
    const char *args[] = {"bench", "--no-limits", "--no-naive", "--isa", "scalar", "--threads", "1",
                          "--shape", "1,2,1,1,64,16,16", "--shape", "1,2,1,32,64,16,16", "--op", "forward",
                          "--reps", "3", "--bw-mib", "8", "--bw-interleaved", "--json", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    const char *dec = strstr(r->out, "\"Tq\":1,"), *pre = strstr(r->out, "\"Tq\":32,");
    cr_assert(dec && pre, "rows missing:\n%s", r->out);
    const char *dec_end = strchr(dec, '\n'), *pre_end = strchr(pre, '\n');
    cr_assert(dec_end && pre_end);
    char line[2048];
    cr_assert_lt((size_t)(dec_end - dec), sizeof line);
    memcpy(line, dec, (size_t)(dec_end - dec));
    line[dec_end - dec] = '\0';
    const double bw = json_field(line, "bw_interleaved_gbps"), pct = json_field(line, "pct_bw_interleaved"),
                 gbps = json_field(line, "gbps");
    cr_expect_gt(bw, 0.0, "%s", line);
    cr_expect_gt(gbps, 0.0, "%s", line);
    cr_expect_float_eq(pct, 100.0 * gbps / bw, 1e-3 * pct, "%s", line);
    cr_assert_lt((size_t)(pre_end - pre), sizeof line);
    memcpy(line, pre, (size_t)(pre_end - pre));
    line[pre_end - pre] = '\0';
    cr_expect_null(strstr(line, "interleaved"), "a prefill row with the interleaved read: %s", line);
    cr_expect_not_null(strstr(r->err, "# read bandwidth timed interleaved with these rows"), "%s", r->err);

    const char *plain[] = {"bench", "--no-limits", "--no-naive", "--isa", "scalar", "--threads", "1",
                           "--shape", "1,2,1,1,64,16,16", "--op", "forward", "--reps", "1", "--json", NULL};
    r = run(plain);
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    cr_expect_null(strstr(r->out, "interleaved"), "%s", r->out);
}

/* Key padding as a mask (issue 20 item 4): the rows of `sdpa bench --json` by
 * mask and op, each row checked: a padding form's row has ratio_vs_kv_lengths,
 * any other row has none; every row of one shape counts the same allowed pairs
 * (the forms carry padding's key lengths). Counts in n[mask][op]. */
static const char *const padding_forms[] = {"padding", "padding-bool", "padding-bool-4d", "padding-bias",
                                            "padding-bias-4d"};

static void count_padding_rows(const char *out, const char *shape_field, int n[5][2], int *other)
{
    char pairs[64] = "";
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *end = strchr(line, '\n');
        const size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len == 0)
            continue;
        char buf[2048];
        cr_assert_lt(len, sizeof buf);
        memcpy(buf, line, len);
        buf[len] = '\0';
        cr_assert(buf[0] == '{' && buf[len - 1] == '}', "not a JSON object line: %s", buf);
        int m = -1;
        for (int i = 0; i < 5; i++) {
            char want[64];
            snprintf(want, sizeof want, "\"mask\":\"%s\"", padding_forms[i]);
            if (strstr(buf, want))
                m = i;
        }
        const int has_ratio = strstr(buf, "\"ratio_vs_kv_lengths\":") != NULL;
        if (m < 0 || !strstr(buf, shape_field)) {
            cr_expect(!has_ratio, "ratio_vs_kv_lengths on a row that is no padding form: %s", buf);
            (*other)++;
            continue;
        }
        cr_expect_eq(has_ratio, m > 0, "ratio_vs_kv_lengths %s: %s", m > 0 ? "missing" : "unexpected", buf);
        if (has_ratio) {
            const double ratio = strtod(strstr(buf, "\"ratio_vs_kv_lengths\":") + 22, NULL);
            cr_expect(ratio > 0.0 && isfinite(ratio), "ratio_vs_kv_lengths not a positive number: %s", buf);
        }
        const char *pp = strstr(buf, "\"pairs\":");
        cr_assert_not_null(pp, "no pairs: %s", buf);
        char pv[64];
        snprintf(pv, sizeof pv, "%.*s", (int)strcspn(pp, ",}"), pp);
        if (!pairs[0])
            strcpy(pairs, pv);
        cr_expect_str_eq(pv, pairs, "a padding form counts other pairs than padding: %s", buf);
        n[m][strstr(buf, "\"op\":\"backward\"") != NULL]++;
    }
}

Test(cli, bench_json_padding_forms)
{
    /* Asked for on a tiny shape: each form once per op, and padding (kv_lengths) with them. */
    const char *args[] = {"bench", "--quick", "--no-limits", "--no-naive", "--isa", "scalar", "--threads", "1",
                          "--shape", "3,2,1,8,9,4,3", "--mask", "padding-bool,padding-bool-4d",
                          "--mask", "padding-bias,padding-bias-4d", "--op", "both", "--reps", "1", "--json", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    int n[5][2] = {{0}}, other = 0;
    count_padding_rows(r->out, "\"B\":3,\"Hq\":2,\"Hkv\":1,\"Tq\":8,\"Tk\":9,\"Dk\":4,\"Dv\":3", n, &other);
    for (int m = 0; m < 5; m++)
        for (int op = 0; op < 2; op++)
            cr_expect_eq(n[m][op], 1, "%s %s: %d rows\n%s", padding_forms[m], op ? "backward" : "forward", n[m][op],
                         r->out);
    cr_expect_eq(other, 0, "unexpected rows:\n%s", r->out);
    cr_expect_not_null(strstr(r->err, "/kv_lengths"), "no /kv_lengths column in the table: %s", r->err);

    /* Without --mask, the default key-padding shape (--quick: 4,4,4,128,128,64,64)
     * gets every form, and no other shape any. */
    const char *dargs[] = {"bench", "--quick", "--no-limits", "--no-naive", "--isa", "scalar", "--threads", "1",
                           "--op", "forward", "--reps", "1", "--warmup", "0", "--json", NULL};
    r = run(dargs);
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    memset(n, 0, sizeof n);
    other = 0;
    count_padding_rows(r->out, "\"B\":4,\"Hq\":4,\"Hkv\":4,\"Tq\":128,\"Tk\":128,\"Dk\":64,\"Dv\":64", n, &other);
    for (int m = 0; m < 5; m++)
        cr_expect_eq(n[m][0], 1, "%s: %d forward rows\n%s", padding_forms[m], n[m][0], r->out);
    cr_expect_gt(other, 0, "the other default shapes are missing:\n%s", r->out);

    /* An unknown form is a usage error. */
    const char *bad[] = {"bench", "--mask", "padding-bools", NULL};
    r = run(bad);
    cr_expect_eq(r->status, 2, "exit %d; stderr: %s", r->status, r->err);
    cr_expect_not_null(strstr(r->err, "padding-bias-4d"), "stderr: %s", r->err);
}

/* --huge-pages only changes how --serve allocates its cache: alone it is a usage
 * error (exit 2, nothing timed), and it is a flag, not an option with a value. */
Test(cli, bench_huge_pages_needs_serve)
{
    const char *alone[] = {"bench", "--no-limits", "--huge-pages", NULL};
    run_result *r = run(alone);
    cr_expect_eq(r->status, 2, "exit %d; stderr: %s", r->status, r->err);
    cr_expect_not_null(strstr(r->err, "--huge-pages applies to --serve only"), "stderr: %s", r->err);
    cr_expect_eq(r->out[0], '\0', "stdout: %s", r->out);
    const char *valued[] = {"bench", "--serve", "--huge-pages=1", NULL};
    r = run(valued);
    cr_expect_eq(r->status, 2, "exit %d; stderr: %s", r->status, r->err);
    cr_expect_not_null(strstr(r->err, "--huge-pages"), "stderr: %s", r->err);
}

/* An output that names an input file (directly or through another path to the
 * same file) is a usage error: the input is left as it was. */
Test(cli, output_names_an_input)
{
    valid_inputs();
    char before[256], after[256];
    FILE *f = fopen(P("K.npy"), "rb");
    cr_assert_not_null(f);
    const size_t nb = fread(before, 1, sizeof before, f);
    fclose(f);
    char alias[256];
    snprintf(alias, sizeof alias, "%s/./K.npy", g_dir);
    const char *args[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", alias, NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 2, "exit %d; stderr: %s", r->status, r->err);
    cr_assert_not_null(strstr(r->err, "is also an input"), "stderr: %s", r->err);
    f = fopen(P("K.npy"), "rb");
    cr_assert_not_null(f);
    const size_t na = fread(after, 1, sizeof after, f);
    fclose(f);
    cr_assert(na == nb && memcmp(before, after, nb) == 0, "K.npy was modified");
    const char *bargs[] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "--do", P("Q.npy"),
                           "--dq", P("dq.npy"), "--dk", P("dk.npy"), "--dv", P("V.npy"), NULL};
    r = run(bargs);
    cr_assert_eq(r->status, 2, "backward: exit %d; stderr: %s", r->status, r->err);
    cr_assert_not_null(strstr(r->err, "is also an input"), "stderr: %s", r->err);
}

/* ------------------------------------------------------------ attention variants (issue 15) */

/* The fixture's problem with the variants, as the shared float64 reference reads it. */
static sdpa_problem variant_problem(const fixture *f, float softcap, const float *slopes, const float *sinks)
{
    sdpa_problem d = ref_problem(&f->p);
    d.softcap = softcap;
    d.alibi_slopes = slopes;
    d.sinks = sinks;
    return d;
}

/* Q/K/V of a rank-4 fixture (B=2, Hq=4, Hkv=2, Tq=6, Tk=9, Dk=8, Dv=5), slopes and
 * sinks (one -inf) written as float32 (Hq,) .npy files; x in [-1, 1] times 3 for Q
 * so that a softcap of 1.5 bends the logits. */
static void variant_inputs(fixture *f, float *slopes, float *sinks)
{
    fixture_make(f, 4, 2, 4, 2, 6, 9, 8, 5);
    for (size_t i = 0; i < (size_t)2 * 4 * 6 * 8; i++)
        f->q[i] *= 3.0f;
    const int64_t s4[4] = {2, 4, 6, 8}, sh[1] = {4};
    write_f32(P("Q.npy"), 4, s4, f->q);
    const float sl[4] = {0.5f, 0.25f, 0.0f, -0.125f}, sk[4] = {0.5f, -INFINITY, 2.0f, -1.0f};
    memcpy(slopes, sl, sizeof sl);
    memcpy(sinks, sk, sizeof sk);
    write_f32(P("SL.npy"), 1, sh, slopes);
    write_f32(P("SK.npy"), 1, sh, sinks);
}

/* forward with extra args: O and LSE against the reference of d. */
static void check_variant_forward(const fixture *f, const sdpa_problem *d, const char *const *extra)
{
    const char *args[48] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"),
                            "-o",      P("O.npy"), "--lse", P("LSE.npy")};
    int n = 11, nd;
    int64_t shape[8];
    for (int i = 0; extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "forward failed (%d): %s", r->status, r->err);
    cr_assert_str_empty(r->err, "stderr: %s", r->err);
    const size_t rows = (size_t)f->p.B * f->p.Hq * f->p.Tq;
    double *o = malloc(rows * (size_t)f->p.Dv * sizeof(double)), *lse = malloc(rows * sizeof(double));
    ref_forward(d, f->q, f->k, f->v, o, lse);
    float *go = read_f32(P("O.npy"), &nd, shape);
    expect_close("O", go, o, rows * (size_t)f->p.Dv, 1e-5);
    float *gl = read_f32(P("LSE.npy"), &nd, shape);
    expect_close("LSE", gl, lse, rows, 1e-5);
    free(go);
    free(gl);
    free(o);
    free(lse);
}

Test(cli, forward_variants)
{
    fixture f;
    float slopes[4], sinks[4];
    variant_inputs(&f, slopes, sinks);
    f.p.causal = 2;
    const sdpa_problem cap = variant_problem(&f, 1.5f, NULL, NULL);
    const char *e1[] = {"--causal", "bottom-right", "--softcap", "1.5", NULL};
    check_variant_forward(&f, &cap, e1);
    const sdpa_problem al = variant_problem(&f, 0.0f, slopes, NULL);
    const char *e2[] = {"--causal", "bottom-right", "--alibi-slopes", P("SL.npy"), NULL};
    check_variant_forward(&f, &al, e2);
    const sdpa_problem sk = variant_problem(&f, 0.0f, NULL, sinks);
    const char *e3[] = {"--causal", "bottom-right", "--sinks", P("SK.npy"), NULL};
    check_variant_forward(&f, &sk, e3);
    const sdpa_problem all = variant_problem(&f, 1.5f, slopes, sinks);
    const char *e4[] = {"--causal", "bottom-right", "--softcap", "1.5", "--alibi-slopes", P("SL.npy"),
                        "--sinks", P("SK.npy"), NULL};
    check_variant_forward(&f, &all, e4);
    /* --softcap 0 is off */
    const sdpa_problem off = variant_problem(&f, 0.0f, NULL, NULL);
    const char *e5[] = {"--causal", "bottom-right", "--softcap", "0", NULL};
    check_variant_forward(&f, &off, e5);
    fixture_free(&f);
}

Test(cli, backward_variants_and_dsinks)
{
    fixture f;
    float slopes[4], sinks[4];
    variant_inputs(&f, slopes, sinks);
    const refp *p = &f.p;
    const size_t nq = (size_t)p->B * p->Hq * p->Tq, nk = (size_t)p->B * p->Hkv * p->Tk;
    float *dout = rand_floats(nq * (size_t)p->Dv);
    const int64_t sdo[4] = {2, 4, 6, 5};
    write_f32(P("dO.npy"), 4, sdo, dout);
    for (int given = 0; given <= 1; given++) {
        const char *args[64] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "--do",
                                P("dO.npy"), "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv", P("dV.npy"),
                                "--softcap", "1.5", "--alibi-slopes", P("SL.npy"), "--sinks", P("SK.npy"),
                                "--dsinks", P("dSK.npy")};
        int n = 23;
        if (given) { /* O and LSE from the tool's own forward with the same variants */
            const char *fa[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                                "--lse", P("LSE.npy"), "--softcap", "1.5", "--alibi-slopes", P("SL.npy"),
                                "--sinks", P("SK.npy"), NULL};
            given_o_lse(fa, args, &n);
        }
        args[n] = NULL;
        unlink(P("dSK.npy"));
        run_result *r = run(args);
        cr_assert_eq(r->status, 0, "backward failed (%d): %s", r->status, r->err);
        cr_assert_str_empty(r->err);
        const sdpa_problem d = variant_problem(&f, 1.5f, slopes, sinks);
        double *dq = malloc(nq * (size_t)p->Dk * sizeof(double)), *dk = malloc(nk * (size_t)p->Dk * sizeof(double)),
               *dv = malloc(nk * (size_t)p->Dv * sizeof(double)), ds[4];
        ref_backward_dsinks(&d, f.q, f.k, f.v, dout, dq, dk, dv, ds);
        int nd;
        int64_t shape[8];
        float *g = read_f32(P("dQ.npy"), &nd, shape);
        expect_close("dQ", g, dq, nq * (size_t)p->Dk, 2e-5);
        free(g);
        g = read_f32(P("dK.npy"), &nd, shape);
        expect_close("dK", g, dk, nk * (size_t)p->Dk, 2e-5);
        free(g);
        g = read_f32(P("dV.npy"), &nd, shape);
        expect_close("dV", g, dv, nk * (size_t)p->Dv, 2e-5);
        free(g);
        g = read_f32(P("dSK.npy"), &nd, shape);
        const int64_t want[1] = {4};
        expect_shape(nd, shape, 1, want); /* float32 (Hq,): read_f32 checks '<f4' */
        expect_close("dsinks", g, ds, 4, 2e-5);
        cr_expect(g[1] == 0.0f, "dsinks of the -inf sink: %g", (double)g[1]);
        free(g);
        free(dq);
        free(dk);
        free(dv);
    }
    free(dout);
    fixture_free(&f);
}

Test(cli, bad_variant_values)
{
    valid_inputs(); /* Hq = 4 */
    const char *fouts[] = {P("O.npy"), P("LSE.npy"), NULL};
    /* --softcap negative or not finite: usage errors */
    static const char *const caps[] = {"-1", "-0.5", "nan", "inf", "-inf", "1e-60"};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        const char *a[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                           "--lse", P("LSE.npy"), "--softcap", caps[i], NULL};
        expect_failure(a, fouts, NULL, 1);
    }
    /* slopes / sinks: float64, int32, shape (3,), shape (1, 4), non-finite values */
    const int64_t s3[1] = {3}, s14[2] = {1, 4}, s4[1] = {4};
    float_zeros_npy(P("f8.npy"), "<f8", 8, 1, s4, 1, 0);
    float_zeros_npy(P("i4.npy"), "<i4", 4, 1, s4, 1, 0);
    float_zeros_npy(P("n3.npy"), "<f4", 4, 1, s3, 1, 0);
    float_zeros_npy(P("n14.npy"), "<f4", 4, 2, s14, 1, 0);
    const float nanv[4] = {0.5f, NAN, 0.0f, 1.0f}, pinf[4] = {0.5f, INFINITY, 0.0f, 1.0f},
                ninf[4] = {0.5f, -INFINITY, 0.0f, 1.0f};
    write_f32(P("nan.npy"), 1, s4, nanv);
    write_f32(P("pinf.npy"), 1, s4, pinf);
    write_f32(P("ninf.npy"), 1, s4, ninf);
    static const char *const opts[2] = {"--alibi-slopes", "--sinks"};
    for (int o = 0; o < 2; o++) {
        const char *bad[] = {"f8.npy", "i4.npy", "n3.npy", "n14.npy", "nan.npy", "pinf.npy",
                             o == 0 ? "ninf.npy" : NULL}; /* -inf: a valid sink, not a valid slope */
        for (size_t i = 0; i < sizeof bad / sizeof bad[0] && bad[i]; i++) {
            char path[256];
            snprintf(path, sizeof path, "%s", P(bad[i]));
            const char *a[] = {"forward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "-o", P("O.npy"),
                               "--lse", P("LSE.npy"), opts[o], path, NULL};
            expect_failure(a, fouts, path, 0);
        }
    }
    /* --dsinks without --sinks: a usage error, nothing written */
    const int64_t dos[4] = {2, 4, 5, 6};
    float_zeros_npy(P("dO.npy"), "<f4", 4, 4, dos, 1, 0);
    const char *bouts[] = {P("dQ.npy"), P("dK.npy"), P("dV.npy"), P("dSK.npy"), NULL};
    const char *b1[] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "--do", P("dO.npy"),
                        "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv", P("dV.npy"), "--dsinks", P("dSK.npy"), NULL};
    expect_failure(b1, bouts, NULL, 1);
    /* a bad sinks file in the backward: nothing written, dsinks included */
    const char *b2[] = {"backward", "-q", P("Q.npy"), "-k", P("K.npy"), "-v", P("V.npy"), "--do", P("dO.npy"),
                        "--dq", P("dQ.npy"), "--dk", P("dK.npy"), "--dv", P("dV.npy"), "--sinks", P("pinf.npy"),
                        "--dsinks", P("dSK.npy"), NULL};
    expect_failure(b2, bouts, P("pinf.npy"), 0);
}

/* REGRESSION (session 31's review of the bench CLI): a value option given twice
 * replaced the first silently (`--isa scalar --isa avx2` timed avx2 alone, `--op
 * forward --op backward` backward alone), and contradicting flags were taken
 * (`--limits-only --no-limits` measured the limits, `--limits-only --json` printed
 * nothing, `--serve` dropped --naive and all but one ISA of a list): now each is a
 * usage error, exit 2, before anything is timed. And the JSON's counts are exact
 * integers (`"pairs":2.10022e+06` for 2100225 before). */
Test(cli, bench_refuses_repeated_and_conflicting_options)
{
    static const char *const cases[][12] = {
        {"bench", "--isa", "scalar", "--isa", "scalar", NULL},
        {"bench", "--threads", "1", "--threads", "1", NULL},
        {"bench", "--op", "forward", "--op", "backward", NULL},
        {"bench", "--reps", "1", "--reps", "2", NULL},
        {"bench", "--max-time", "1", "--max-time", "2", NULL},
        {"bench", "--softcap", "5", "--softcap", "6", NULL},
        {"bench", "--dtype", "fp32", "--dtype", "fp16", NULL},
        {"bench", "--naive", "--no-naive", NULL},
        {"bench", "--limits-only", "--no-limits", NULL},
        {"bench", "--limits-only", "--json", NULL},
        {"bench", "--serve", "--naive", NULL},
        {"bench", "--serve", "--bw-interleaved", NULL},
        /* numbers as written, digits only: no sign, space, empty item, hex or inf (session 33;
         * strtoll / strtod took " 2", "+2" and "0x1p1") */
        {"bench", "--threads", "+2", NULL},
        {"bench", "--threads", " 2", NULL},
        {"bench", "--threads", "1,,2", NULL},
        {"bench", "--reps", " 3", NULL},
        {"bench", "--shape", "1,2,+2,4,4,8,8", NULL},
        {"bench", "--max-time", "0x1p1", NULL},
        {"bench", "--max-time", " 1", NULL},
        {"bench", "--max-time", "+1", NULL},
        {"bench", "--max-time", "infinity", NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        run_result *r = run(cases[c]);
        cr_expect_eq(r->status, 2, "%s %s %s: exit %d", cases[c][1], cases[c][2] ? cases[c][2] : "",
                     cases[c][2] && cases[c][3] ? cases[c][3] : "", r->status);
        cr_expect(strstr(r->err, "sdpa bench: error: ") != NULL, "%s", r->err);
        /* the usage line follows the error, as forward's and backward's do */
        cr_expect(strstr(r->err, "\nusage: sdpa bench [options]\n") != NULL, "no usage line: %s", r->err);
    }
    const char *args[] = {"bench", "--no-limits", "--no-naive", "--isa", "scalar", "--threads", "1", "--shape",
                          "1,1,1,2049,2049,1,1", "--mask", "causal", "--op", "forward", "--reps", "1",
                          "--warmup", "0", "--json", NULL};
    run_result *r = run(args);
    cr_assert_eq(r->status, 0, "bench failed: %s", r->err);
    cr_expect(strstr(r->out, "\"pairs\":2100225") != NULL, "pairs not exact: %s", r->out);
}
