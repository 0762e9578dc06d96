/* SPDX-License-Identifier: MIT */
/* tools/sdpa.c - the sdpa command-line tool: attention forward/backward on .npy files.
 *
 *   sdpa info                       version, CPU features, ISAs, OpenMP threads
 *   sdpa forward  -q Q -k K -v V -o O [--lse LSE] [mask options]
 *   sdpa backward -q Q -k K -v V --do dO --dq dQ --dk dK --dv dV [-o O --lse LSE] [mask options]
 *   sdpa demo     [--data DIR]      the worked example, then a timed causal prefill
 *   sdpa bench    ...               the benchmark (when built with bench/bench.c)
 *
 * Every input is read and validated, and every output's temporary file is
 * created, before anything is computed; outputs are written to temporary files
 * in their own directory and renamed over the destination only after all of
 * them were written. So a bad input never creates or changes an output file.
 * Errors: one line "sdpa: error: <file>: <what>" on stderr and exit status 2. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "npy.h"
#include "sdpa.h"

#if HAVE_OPENMP
#include <omp.h>
#endif

#ifdef SDPA_HAVE_BENCH
#include "../bench/bench.h" /* int sdpa_bench_main(int argc, char **argv); argv[0] is "bench" */
#endif

#ifndef SDPA_EXAMPLES_DIR
#define SDPA_EXAMPLES_DIR "examples"
#endif
#ifndef SDPA_INSTALLED_EXAMPLES_DIR
#define SDPA_INSTALLED_EXAMPLES_DIR SDPA_EXAMPLES_DIR
#endif

enum { EXIT_BAD = 2 };

/* ------------------------------------------------------------ messages */

static void file_error(const char *path, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "sdpa: error: %s: ", path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void plain_error(const char *fmt, ...)
{
    va_list ap;
    fputs("sdpa: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ------------------------------------------------------------ commands and options */

enum { CMD_FORWARD = 1, CMD_BACKWARD = 2, CMD_DEMO = 4 };

static const char *const usage_lines[] = {
    [CMD_FORWARD] = "usage: sdpa forward -q Q.npy -k K.npy -v V.npy -o O.npy [--lse LSE.npy] [options]",
    [CMD_BACKWARD] = "usage: sdpa backward -q Q.npy -k K.npy -v V.npy --do dO.npy --dq dQ.npy --dk dK.npy "
                     "--dv dV.npy [-o O.npy --lse LSE.npy] [options]",
    [CMD_DEMO] = "usage: sdpa demo [--data DIR] [--threads N] [--isa NAME]",
};

static const char *cmd_name(int cmd)
{
    return cmd == CMD_FORWARD ? "forward" : cmd == CMD_BACKWARD ? "backward" : "demo";
}

static int usage_error(int cmd, const char *fmt, ...)
{
    va_list ap;
    fputs("sdpa: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fprintf(stderr, "%s\n(see 'sdpa %s --help')\n", usage_lines[cmd], cmd_name(cmd));
    return EXIT_BAD;
}

typedef struct cli_opts {
    const char *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    const char *kvlen, *mask, *bias, *data_dir;
    int have_scale;
    float scale;
    sdpa_causal causal;
    int have_align;
    sdpa_alignment align;
    int64_t window_left, window_right;
    int threads;
    sdpa_isa isa;
} cli_opts;

typedef enum opt_kind { K_PATH, K_SCALE, K_CAUSAL, K_ALIGN, K_WINDOW, K_THREADS, K_ISA } opt_kind;

typedef struct opt_def {
    const char *name, *alias; /* "--name", optional short "-x" */
    opt_kind kind;
    size_t offset;            /* into cli_opts */
    unsigned cmds;
    const char *help;
} opt_def;

#define OFF(f) offsetof(cli_opts, f)
#define FB (CMD_FORWARD | CMD_BACKWARD)
static const opt_def opt_defs[] = {
    {"--query", "-q", K_PATH, OFF(q), FB, "Q, float32 (T, Dk), (Hq, T, Dk) or (B, Hq, Tq, Dk)"},
    {"--key", "-k", K_PATH, OFF(k), FB, "K, float32 (B, Hkv, Tk, Dk) in Q's rank"},
    {"--value", "-v", K_PATH, OFF(v), FB, "V, float32 (B, Hkv, Tk, Dv) in Q's rank"},
    {"--out", "-o", K_PATH, OFF(o), FB,
     "O (forward: written; backward: the forward's O, read, given with --lse)"},
    {"--lse", NULL, K_PATH, OFF(lse), FB,
     "logsumexp, float32 of shape Q.shape[:-1] (forward: written; backward: read)"},
    {"--do", NULL, K_PATH, OFF(dout), CMD_BACKWARD, "dO, float32 shaped like O (read)"},
    {"--dq", NULL, K_PATH, OFF(dq), CMD_BACKWARD, "dQ (written)"},
    {"--dk", NULL, K_PATH, OFF(dk), CMD_BACKWARD, "dK (written)"},
    {"--dv", NULL, K_PATH, OFF(dv), CMD_BACKWARD, "dV (written)"},
    {"--scale", NULL, K_SCALE, OFF(scale), FB, "S: logit scale (default 1/sqrt(Dk))"},
    {"--causal", NULL, K_CAUSAL, OFF(causal), FB,
     "top-left|bottom-right: causal mask aligned at the top-left or bottom-right corner"},
    {"--window-left", NULL, K_WINDOW, OFF(window_left), FB,
     "N: keys at most N before the diagonal (-1: unbounded)"},
    {"--window-right", NULL, K_WINDOW, OFF(window_right), FB,
     "N: keys at most N after the diagonal (-1: unbounded)"},
    {"--window-align", NULL, K_ALIGN, OFF(align), FB,
     "top-left|bottom-right: diagonal of a window without --causal (default top-left)"},
    {"--kv-len", NULL, K_PATH, OFF(kvlen), FB, "per-batch key lengths, int32 or int64 of shape (B,)"},
    {"--mask", NULL, K_PATH, OFF(mask), FB,
     "bool or uint8 mask (nonzero = may attend) broadcastable to (B, Hq, Tq, Tk)"},
    {"--bias", NULL, K_PATH, OFF(bias), FB,
     "float32 additive bias broadcastable to (B, Hq, Tq, Tk); -inf disallows a key"},
    {"--data", NULL, K_PATH, OFF(data_dir), CMD_DEMO, "DIR: the examples directory"},
    {"--threads", NULL, K_THREADS, OFF(threads), FB | CMD_DEMO, "N: OpenMP threads (0: OpenMP's default)"},
    {"--isa", NULL, K_ISA, OFF(isa), FB | CMD_DEMO, "NAME: scalar|avx2|avx512|neon|auto"},
};
#undef FB

static void print_help(int cmd)
{
    printf("%s\n\n", usage_lines[cmd]);
    if (cmd == CMD_FORWARD)
        printf("Computes O = softmax(scale * Q K^T + bias, masked) V (and the logsumexp).\n");
    else if (cmd == CMD_BACKWARD)
        printf("Computes dQ, dK, dV given dO. O and LSE are recomputed when not given\n"
               "(give both or neither).\n");
    else
        printf("Runs the textbook worked example (examples/worked_example) and a timed causal\n"
               "prefill B=1 H=8 T=1024 D=64, both checked against a float64 reference.\n"
               "Exit status 0 if both are within tolerance, else 1.\n");
    printf("\nOptions:\n");
    for (size_t i = 0; i < sizeof opt_defs / sizeof opt_defs[0]; i++) {
        const opt_def *d = &opt_defs[i];
        char names[40];
        if (!(d->cmds & (unsigned)cmd))
            continue;
        snprintf(names, sizeof names, "%s%s%s", d->alias ? d->alias : "", d->alias ? ", " : "", d->name);
        printf("  %-20s %s\n", names, d->help);
    }
    if (cmd != CMD_DEMO)
        printf("\nQ/K/V/O share one rank: 2 (T, D), 3 (H, T, D) or 4 (B, H, T, D); outputs have the\n"
               "rank of their input. GQA: Hq a multiple of Hkv. Outputs are written only if\n"
               "everything succeeds. Errors: one line on stderr, exit status 2.\n");
}

static int parse_int64(const char *s, int64_t *out)
{
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_options(int cmd, int argc, char **argv, cli_opts *o, int *help)
{
    unsigned char seen[sizeof opt_defs / sizeof opt_defs[0]] = {0};
    memset(o, 0, sizeof *o);
    o->causal = SDPA_CAUSAL_NONE;
    o->align = SDPA_ALIGN_TOP_LEFT;
    o->window_left = o->window_right = SDPA_WINDOW_UNBOUNDED;
    o->isa = SDPA_ISA_AUTO;
    *help = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL, *eq;
        char name[64];
        const opt_def *d = NULL;
        size_t di = 0;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *help = 1;
            return 0;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            return usage_error(cmd, "unexpected argument '%s'", arg);
        snprintf(name, sizeof name, "%s", arg);
        eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        if (eq) {
            size_t n = (size_t)(eq - arg);
            if (n >= sizeof name)
                n = sizeof name - 1;
            name[n] = '\0';
            val = eq + 1;
        }
        for (di = 0; di < sizeof opt_defs / sizeof opt_defs[0]; di++)
            if ((opt_defs[di].cmds & (unsigned)cmd) &&
                (strcmp(name, opt_defs[di].name) == 0 ||
                 (opt_defs[di].alias && strcmp(name, opt_defs[di].alias) == 0))) {
                d = &opt_defs[di];
                break;
            }
        if (!d)
            return usage_error(cmd, "unknown option '%s' for 'sdpa %s'", name, cmd_name(cmd));
        if (seen[di]++)
            return usage_error(cmd, "option '%s' given twice", d->name);
        if (!val) {
            if (i + 1 >= argc)
                return usage_error(cmd, "option '%s' needs a value", name);
            val = argv[++i];
        }
        char *field = (char *)o + d->offset;
        switch (d->kind) {
        case K_PATH:
            if (!*val)
                return usage_error(cmd, "option '%s' needs a file name", name);
            *(const char **)field = val;
            break;
        case K_SCALE: {
            char *end;
            float s;
            errno = 0;
            s = strtof(val, &end);
            /* ERANGE on underflow (a denormal or 0) is fine; only overflow is not */
            if (end == val || *end || !isfinite(s) || (errno == ERANGE && fabsf(s) == HUGE_VALF))
                return usage_error(cmd, "--scale '%s' is not a finite number", val);
            o->scale = s;
            o->have_scale = 1;
            break;
        }
        case K_CAUSAL:
            if (strcmp(val, "top-left") == 0)
                o->causal = SDPA_CAUSAL_TOP_LEFT;
            else if (strcmp(val, "bottom-right") == 0)
                o->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
            else if (strcmp(val, "none") == 0)
                o->causal = SDPA_CAUSAL_NONE;
            else
                return usage_error(cmd, "--causal '%s': expected top-left or bottom-right", val);
            break;
        case K_ALIGN:
            if (strcmp(val, "top-left") == 0)
                o->align = SDPA_ALIGN_TOP_LEFT;
            else if (strcmp(val, "bottom-right") == 0)
                o->align = SDPA_ALIGN_BOTTOM_RIGHT;
            else
                return usage_error(cmd, "--window-align '%s': expected top-left or bottom-right", val);
            o->have_align = 1;
            break;
        case K_WINDOW: {
            int64_t w;
            if (parse_int64(val, &w) != 0 || w < -1)
                return usage_error(cmd, "%s '%s': expected an integer >= 0 (or -1: unbounded)", name, val);
            *(int64_t *)field = w;
            break;
        }
        case K_THREADS: {
            int64_t t;
            if (parse_int64(val, &t) != 0 || t < 0 || t > 4096)
                return usage_error(cmd, "--threads '%s': expected an integer in [0, 4096]", val);
            o->threads = (int)t;
            break;
        }
        case K_ISA: {
            sdpa_isa isa;
            if (sdpa_isa_from_name(val, &isa) != 0)
                return usage_error(cmd, "--isa '%s': expected scalar, avx2, avx512, neon or auto", val);
            if (isa != SDPA_ISA_AUTO && !sdpa_isa_supported(isa)) {
                plain_error("--isa %s: %s on this machine", val,
                            sdpa_isa_compiled(isa) ? "not supported by the CPU/OS" : "not compiled in");
                return EXIT_BAD;
            }
            o->isa = isa;
            break;
        }
        }
    }
    if (o->have_align && o->causal != SDPA_CAUSAL_NONE)
        return usage_error(cmd, "--window-align applies only without --causal (a causal window follows "
                                "the causal alignment)");
    return 0;
}

/* ------------------------------------------------------------ tensors */

/* A float32 .npy of rank 2..4 viewed as [B, H, T, D]. */
typedef struct tensor {
    const char *path;
    npy_array a;
    int64_t b, h, t, d;
} tensor;

static int load_npy(const char *path, npy_array *a)
{
    char err[256];
    if (npy_read(path, a, err, sizeof err) != 0) {
        file_error(path, "%s", err);
        return EXIT_BAD;
    }
    return 0;
}

static int load_tensor(const char *path, const char *role, tensor *t)
{
    int rc;
    char sh[160];
    t->path = path;
    if ((rc = load_npy(path, &t->a)) != 0)
        return rc;
    if (t->a.dtype != NPY_F4) {
        file_error(path, "%s must be float32 ('<f4'), got %s ('%s')", role, npy_dtype_name(t->a.dtype),
                   npy_dtype_descr(t->a.dtype));
        return EXIT_BAD;
    }
    if (t->a.ndim < 2 || t->a.ndim > 4) {
        file_error(path, "%s must have rank 2 (T, D), 3 (H, T, D) or 4 (B, H, T, D), got shape %s", role,
                   npy_shape_str(t->a.shape, t->a.ndim, sh, sizeof sh));
        return EXIT_BAD;
    }
    const int64_t *s = t->a.shape;
    switch (t->a.ndim) {
    case 2: t->b = 1, t->h = 1, t->t = s[0], t->d = s[1]; break;
    case 3: t->b = 1, t->h = s[0], t->t = s[1], t->d = s[2]; break;
    default: t->b = s[0], t->h = s[1], t->t = s[2], t->d = s[3]; break;
    }
    return 0;
}

static sdpa_tensor tensor_view(const tensor *t)
{
    sdpa_tensor v = {(const float *)t->a.data, t->h * t->t * t->d, t->t * t->d, t->d};
    return v;
}

/* Shape of a tensor of logical dims (b, h, t, d) in the given rank. */
static void shape_in_rank(int rank, int64_t b, int64_t h, int64_t t, int64_t d, int64_t *shape)
{
    const int64_t all[4] = {b, h, t, d};
    for (int i = 0; i < rank; i++)
        shape[i] = all[4 - rank + i];
}

static int check_shape(const tensor *t, const char *role, int rank, int64_t b, int64_t h, int64_t tt,
                       int64_t d, const char *what)
{
    int64_t want[4];
    char s1[160], s2[160];
    shape_in_rank(rank, b, h, tt, d, want);
    if (t->a.ndim == rank && memcmp(want, t->a.shape, (size_t)rank * sizeof want[0]) == 0)
        return 0;
    file_error(t->path, "%s has shape %s, expected %s (%s)", role,
               npy_shape_str(t->a.shape, t->a.ndim, s1, sizeof s1), npy_shape_str(want, rank, s2, sizeof s2),
               what);
    return EXIT_BAD;
}

/* Strides (elements) mapping an array broadcastable to target[4] by NumPy's rules. */
static int broadcast_strides(const char *path, const char *role, const npy_array *a, const int64_t target[4],
                             int64_t strides[4])
{
    char s1[160], s2[160];
    int64_t cstride = 1;
    if (a->ndim > 4) {
        file_error(path, "%s has rank %d, more than 4 (B, Hq, Tq, Tk)", role, a->ndim);
        return EXIT_BAD;
    }
    for (int i = 0; i < 4; i++)
        strides[i] = 0;
    for (int i = a->ndim - 1; i >= 0; i--) {
        const int ti = 4 - a->ndim + i;
        if (a->shape[i] == target[ti])
            strides[ti] = target[ti] == 1 ? 0 : cstride;
        else if (a->shape[i] == 1)
            strides[ti] = 0;
        else {
            file_error(path, "%s of shape %s is not broadcastable to (B, Hq, Tq, Tk) = %s", role,
                       npy_shape_str(a->shape, a->ndim, s1, sizeof s1), npy_shape_str(target, 4, s2, sizeof s2));
            return EXIT_BAD;
        }
        cstride *= a->shape[i];
    }
    return 0;
}

/* ------------------------------------------------------------ outputs */

typedef struct out_file {
    const char *path;
    char *tmp;
    const float *data;
    int ndim;
    int64_t shape[4];
} out_file;

/* Temporary files alive right now, removed if SIGINT/SIGTERM/SIGHUP arrives
 * (unlink() is async-signal-safe), so an interrupted run leaves nothing. */
#define MAX_TEMPS 8
static char *volatile live_temps[MAX_TEMPS];

static void temps_track(char *tmp, int on)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (on ? live_temps[i] == NULL : live_temps[i] == tmp) {
            live_temps[i] = on ? tmp : NULL;
            return;
        }
}

static void on_fatal_signal(int sig)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (live_temps[i])
            unlink(live_temps[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_signal_cleanup(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

/* Creates the temporary file next to path (validates that it can be written). */
static int out_prepare(out_file *of)
{
    struct stat st;
    int fd;
    mode_t mask;
    if (stat(of->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        file_error(of->path, "is a directory");
        return EXIT_BAD;
    }
    /* Only regular files are replaced: renaming over a FIFO or a device node
     * (e.g. /dev/null, as root) would destroy it. */
    if (stat(of->path, &st) == 0 && !S_ISREG(st.st_mode)) {
        file_error(of->path, "exists and is not a regular file");
        return EXIT_BAD;
    }
    /* The temporary file lives in the output's directory (rename() stays on one
     * file system) under a short name, so long output names still fit. */
    const char *slash = strrchr(of->path, '/');
    const size_t dirlen = slash ? (size_t)(slash - of->path) + 1 : 0;
    const size_t n = dirlen + 32;
    of->tmp = malloc(n);
    if (!of->tmp) {
        file_error(of->path, "out of memory");
        return EXIT_BAD;
    }
    snprintf(of->tmp, n, "%.*s.sdpa-out.XXXXXX", (int)dirlen, of->path);
    temps_track(of->tmp, 1);
    fd = mkstemp(of->tmp);
    if (fd < 0) {
        file_error(of->path, "cannot create: %s", strerror(errno));
        temps_track(of->tmp, 0);
        free(of->tmp);
        of->tmp = NULL;
        return EXIT_BAD;
    }
    mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask);
    close(fd);
    return 0;
}

static void out_discard(out_file *outs, int n)
{
    for (int i = 0; i < n; i++)
        if (outs[i].tmp) {
            unlink(outs[i].tmp);
            temps_track(outs[i].tmp, 0);
            free(outs[i].tmp);
            outs[i].tmp = NULL;
        }
}

/* Writes every temporary file, then renames them all; on failure removes them. */
static int out_commit(out_file *outs, int n)
{
    char err[256];
    for (int i = 0; i < n; i++)
        if (npy_write_f32(outs[i].tmp, outs[i].data, outs[i].ndim, outs[i].shape, err, sizeof err) != 0) {
            file_error(outs[i].path, "%s", err);
            out_discard(outs, n);
            return EXIT_BAD;
        }
    for (int i = 0; i < n; i++) {
        if (rename(outs[i].tmp, outs[i].path) != 0) {
            file_error(outs[i].path, "cannot rename the finished output into place: %s", strerror(errno));
            out_discard(outs, n);
            return EXIT_BAD;
        }
        temps_track(outs[i].tmp, 0);
        free(outs[i].tmp);
        outs[i].tmp = NULL;
    }
    return 0;
}

/* Two paths name the same file: the same string, or the same existing file
 * (device and inode) reached by different names. */
/* Canonical form of a path that may not exist yet: realpath() of its directory
 * plus its last component. Returns 0 on success. */
static int canonical_path(const char *path, char *out, size_t cap)
{
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash) {
        const size_t len = slash == path ? 1 : (size_t)(slash - path);
        if (len >= sizeof dir)
            return -1;
        memcpy(dir, path, len);
        dir[len] = '\0';
    } else {
        strcpy(dir, ".");
    }
    if (!realpath(dir, real))
        return -1;
    if ((size_t)snprintf(out, cap, "%s/%s", real, base) >= cap)
        return -1;
    return 0;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    if (!a || !b)
        return 0;
    if (strcmp(a, b) == 0)
        return 1;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    /* one of them does not exist yet: compare the names they would have */
    return canonical_path(a, ca, sizeof ca) == 0 && canonical_path(b, cb, sizeof cb) == 0 && strcmp(ca, cb) == 0;
}

static int same_paths(const char *const *paths, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (same_file(paths[i], paths[j]))
                return 1;
    return 0;
}

/* The first output path that names one of the input files, or NULL (an output
 * must never replace an input by accident). */
static const char *output_clobbers_input(const cli_opts *o, const char *const *outs, int nout)
{
    const char *ins[] = {o->q, o->k, o->v, o->dout, o->kvlen, o->mask, o->bias};
    for (int i = 0; i < nout; i++)
        for (size_t j = 0; j < sizeof ins / sizeof ins[0]; j++)
            if (same_file(outs[i], ins[j]))
                return outs[i];
    return NULL;
}

/* ------------------------------------------------------------ forward / backward */

typedef struct job {
    cli_opts opt;
    tensor q, k, v, o, lse, dout;
    npy_array kvlen_raw, mask, bias;
    int32_t *kvlen;
    int have_o;
    sdpa_problem p;
} job;

static void job_free(job *j)
{
    npy_free(&j->q.a);
    npy_free(&j->k.a);
    npy_free(&j->v.a);
    npy_free(&j->o.a);
    npy_free(&j->lse.a);
    npy_free(&j->dout.a);
    npy_free(&j->kvlen_raw);
    npy_free(&j->mask);
    npy_free(&j->bias);
    free(j->kvlen);
}

/* Loads Q, K, V and the mask inputs, checks that they fit, fills j->p. */
static int load_common(job *j)
{
    const cli_opts *o = &j->opt;
    int rc;
    if ((rc = load_tensor(o->q, "Q", &j->q)) || (rc = load_tensor(o->k, "K", &j->k)) ||
        (rc = load_tensor(o->v, "V", &j->v)))
        return rc;
    const tensor *q = &j->q, *k = &j->k, *v = &j->v;
    const int r = q->a.ndim;
    if (k->a.ndim != r) {
        file_error(k->path, "K has rank %d but Q has rank %d (Q, K, V must have the same rank)", k->a.ndim, r);
        return EXIT_BAD;
    }
    if (v->a.ndim != r) {
        file_error(v->path, "V has rank %d but Q has rank %d (Q, K, V must have the same rank)", v->a.ndim, r);
        return EXIT_BAD;
    }
    if (k->b != q->b) {
        file_error(k->path, "K has batch %lld but Q has batch %lld", (long long)k->b, (long long)q->b);
        return EXIT_BAD;
    }
    if (k->d != q->d) {
        file_error(k->path, "K has head_dim %lld but Q has head_dim %lld (Q and K share head_dim)",
                   (long long)k->d, (long long)q->d);
        return EXIT_BAD;
    }
    if ((k->h == 0 && q->h > 0) || (k->h > 0 && q->h % k->h != 0)) {
        file_error(k->path, "K has %lld heads; Q's %lld heads are not a multiple of it (GQA)", (long long)k->h,
                   (long long)q->h);
        return EXIT_BAD;
    }
    if ((rc = check_shape(v, "V", r, k->b, k->h, k->t, v->d, "V must match K in batch, heads and length")))
        return rc;

    sdpa_problem *p = &j->p;
    sdpa_problem_init(p);
    p->batch = q->b;
    p->q_heads = q->h;
    p->kv_heads = k->h;
    p->q_len = q->t;
    p->kv_len = k->t;
    p->head_dim_qk = q->d;
    p->head_dim_v = v->d;
    if (o->have_scale) {
        p->use_default_scale = 0;
        p->scale = o->scale;
    }
    p->causal = o->causal;
    p->window_alignment = o->align;
    p->window_left = o->window_left;
    p->window_right = o->window_right;
    p->num_threads = o->threads;
    p->isa = o->isa;

    const int64_t target[4] = {q->b, q->h, q->t, k->t};
    if (o->mask) {
        int64_t s[4];
        if ((rc = load_npy(o->mask, &j->mask)))
            return rc;
        if (j->mask.dtype != NPY_B1 && j->mask.dtype != NPY_U1) {
            file_error(o->mask, "the mask must be bool ('|b1') or uint8 ('|u1'), got %s ('%s')",
                       npy_dtype_name(j->mask.dtype), npy_dtype_descr(j->mask.dtype));
            return EXIT_BAD;
        }
        if ((rc = broadcast_strides(o->mask, "the mask", &j->mask, target, s)))
            return rc;
        p->bool_mask.data = j->mask.data;
        p->bool_mask.batch_stride = s[0];
        p->bool_mask.head_stride = s[1];
        p->bool_mask.query_stride = s[2];
        p->bool_mask.key_stride = s[3];
    }
    if (o->bias) {
        int64_t s[4];
        if ((rc = load_npy(o->bias, &j->bias)))
            return rc;
        if (j->bias.dtype != NPY_F4) {
            file_error(o->bias, "the bias must be float32 ('<f4'), got %s ('%s')", npy_dtype_name(j->bias.dtype),
                       npy_dtype_descr(j->bias.dtype));
            return EXIT_BAD;
        }
        if ((rc = broadcast_strides(o->bias, "the bias", &j->bias, target, s)))
            return rc;
        p->bias.data = j->bias.data;
        p->bias.batch_stride = s[0];
        p->bias.head_stride = s[1];
        p->bias.query_stride = s[2];
        p->bias.key_stride = s[3];
    }
    if (o->kvlen) {
        npy_array *a = &j->kvlen_raw;
        char sh[160];
        if ((rc = load_npy(o->kvlen, a)))
            return rc;
        if (a->dtype != NPY_I4 && a->dtype != NPY_I8) {
            file_error(o->kvlen, "kv lengths must be int32 ('<i4') or int64 ('<i8'), got %s ('%s')",
                       npy_dtype_name(a->dtype), npy_dtype_descr(a->dtype));
            return EXIT_BAD;
        }
        if (a->ndim != 1 || a->shape[0] != q->b) {
            file_error(o->kvlen, "kv lengths have shape %s, expected (%lld,) (one per batch)",
                       npy_shape_str(a->shape, a->ndim, sh, sizeof sh), (long long)q->b);
            return EXIT_BAD;
        }
        j->kvlen = malloc(a->count ? a->count * sizeof(int32_t) : 1);
        if (!j->kvlen) {
            file_error(o->kvlen, "out of memory");
            return EXIT_BAD;
        }
        for (size_t i = 0; i < a->count; i++) {
            int64_t x;
            if (a->dtype == NPY_I4) {
                int32_t y;
                memcpy(&y, (const char *)a->data + 4 * i, 4);
                x = y;
            } else
                memcpy(&x, (const char *)a->data + 8 * i, 8);
            if (x < 0 || x > k->t || x > INT32_MAX) {
                file_error(o->kvlen, "kv length [%zu] = %lld is outside [0, min(Tk = %lld, 2^31 - 1)]", i,
                           (long long)x, (long long)k->t);
                return EXIT_BAD;
            }
            j->kvlen[i] = (int32_t)x;
        }
        p->kv_lengths = j->kvlen;
    }
    return 0;
}

static float *alloc_floats(int64_t n)
{
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float))
        return NULL;
    return malloc(n ? (size_t)n * sizeof(float) : 1);
}

static int library_error(sdpa_status st)
{
    plain_error("libsdpa: %s (status %d)", sdpa_status_string(st), (int)st);
    return EXIT_BAD;
}

static int cmd_forward(int argc, char **argv)
{
    job j;
    int rc, help;
    float *o = NULL, *lse = NULL;
    out_file outs[2];
    int nout = 0;
    memset(&j, 0, sizeof j);
    memset(outs, 0, sizeof outs);
    if ((rc = parse_options(CMD_FORWARD, argc, argv, &j.opt, &help)))
        return rc;
    if (help) {
        print_help(CMD_FORWARD);
        return 0;
    }
    if (!j.opt.q || !j.opt.k || !j.opt.v || !j.opt.o)
        return usage_error(CMD_FORWARD, "missing %s", !j.opt.q ? "-q Q.npy" : !j.opt.k ? "-k K.npy"
                                                       : !j.opt.v ? "-v V.npy" : "-o O.npy");
    {
        const char *outp[2] = {j.opt.o, j.opt.lse};
        if (same_paths(outp, 2))
            return usage_error(CMD_FORWARD, "-o and --lse name the same file");
        const char *clob = output_clobbers_input(&j.opt, outp, j.opt.lse ? 2 : 1);
        if (clob)
            return usage_error(CMD_FORWARD, "output %s is also an input", clob);
    }
    if ((rc = load_common(&j)))
        goto done;
    const sdpa_problem *p = &j.p;
    const int r = j.q.a.ndim;
    o = alloc_floats(p->batch * p->q_heads * p->q_len * p->head_dim_v);
    lse = j.opt.lse ? alloc_floats(p->batch * p->q_heads * p->q_len) : NULL;
    if (!o || (j.opt.lse && !lse)) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    outs[nout].path = j.opt.o;
    outs[nout].data = o;
    outs[nout].ndim = r;
    shape_in_rank(r, p->batch, p->q_heads, p->q_len, p->head_dim_v, outs[nout].shape);
    nout++;
    if (j.opt.lse) {
        outs[nout].path = j.opt.lse;
        outs[nout].data = lse;
        outs[nout].ndim = r - 1;
        memcpy(outs[nout].shape, j.q.a.shape, (size_t)(r - 1) * sizeof(int64_t));
        nout++;
    }
    for (int i = 0; i < nout; i++)
        if ((rc = out_prepare(&outs[i])))
            goto done;
    {
        const sdpa_tensor tq = tensor_view(&j.q), tk = tensor_view(&j.k), tv = tensor_view(&j.v);
        const sdpa_tensor_out to = {o, p->q_heads * p->q_len * p->head_dim_v, p->q_len * p->head_dim_v,
                                    p->head_dim_v};
        const sdpa_tensor_out tl = {lse, p->q_heads * p->q_len, p->q_len, 1};
        sdpa_status st = sdpa_forward(p, &tq, &tk, &tv, &to, lse ? &tl : NULL);
        if (st != SDPA_OK) {
            rc = library_error(st);
            goto done;
        }
    }
    rc = out_commit(outs, nout);
done:
    out_discard(outs, nout);
    free(o);
    free(lse);
    job_free(&j);
    return rc;
}

static int cmd_backward(int argc, char **argv)
{
    job j;
    int rc, help;
    float *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    out_file outs[3];
    memset(&j, 0, sizeof j);
    memset(outs, 0, sizeof outs);
    if ((rc = parse_options(CMD_BACKWARD, argc, argv, &j.opt, &help)))
        return rc;
    if (help) {
        print_help(CMD_BACKWARD);
        return 0;
    }
    const cli_opts *op = &j.opt;
    if (!op->q || !op->k || !op->v || !op->dout || !op->dq || !op->dk || !op->dv)
        return usage_error(CMD_BACKWARD, "missing %s",
                           !op->q ? "-q Q.npy" : !op->k ? "-k K.npy" : !op->v ? "-v V.npy"
                           : !op->dout ? "--do dO.npy" : !op->dq ? "--dq dQ.npy" : !op->dk ? "--dk dK.npy"
                                                                                           : "--dv dV.npy");
    if (!op->o != !op->lse)
        return usage_error(CMD_BACKWARD, "give both -o O.npy and --lse LSE.npy (the forward's outputs) or "
                                         "neither (they are then recomputed)");
    {
        const char *outp[3] = {op->dq, op->dk, op->dv};
        if (same_paths(outp, 3))
            return usage_error(CMD_BACKWARD, "--dq, --dk and --dv must name different files");
        const char *clob = output_clobbers_input(op, outp, 3);
        if (!clob && op->o && (same_file(op->o, op->dq) || same_file(op->o, op->dk) || same_file(op->o, op->dv)))
            clob = op->o;
        if (!clob && op->lse && (same_file(op->lse, op->dq) || same_file(op->lse, op->dk) || same_file(op->lse, op->dv)))
            clob = op->lse;
        if (clob)
            return usage_error(CMD_BACKWARD, "output %s is also an input", clob);
    }
    if ((rc = load_common(&j)))
        goto done;
    const sdpa_problem *p = &j.p;
    const int r = j.q.a.ndim;
    const int64_t B = p->batch, Hq = p->q_heads, Tq = p->q_len, Dv = p->head_dim_v;
    if ((rc = load_tensor(op->dout, "dO", &j.dout)) ||
        (rc = check_shape(&j.dout, "dO", r, B, Hq, Tq, Dv, "dO is shaped like O: (B, Hq, Tq, Dv)")))
        goto done;
    if (op->o) {
        char s1[160], s2[160];
        if ((rc = load_tensor(op->o, "O", &j.o)) ||
            (rc = check_shape(&j.o, "O", r, B, Hq, Tq, Dv, "the forward's O: (B, Hq, Tq, Dv)")))
            goto done;
        if ((rc = load_npy(op->lse, &j.lse.a)))
            goto done;
        j.lse.path = op->lse;
        if (j.lse.a.dtype != NPY_F4) {
            file_error(op->lse, "LSE must be float32 ('<f4'), got %s ('%s')", npy_dtype_name(j.lse.a.dtype),
                       npy_dtype_descr(j.lse.a.dtype));
            rc = EXIT_BAD;
            goto done;
        }
        if (j.lse.a.ndim != r - 1 || memcmp(j.lse.a.shape, j.q.a.shape, (size_t)(r - 1) * sizeof(int64_t))) {
            file_error(op->lse, "LSE has shape %s, expected Q.shape[:-1] = %s",
                       npy_shape_str(j.lse.a.shape, j.lse.a.ndim, s1, sizeof s1),
                       npy_shape_str(j.q.a.shape, r - 1, s2, sizeof s2));
            rc = EXIT_BAD;
            goto done;
        }
    }
    dq = alloc_floats((int64_t)j.q.a.count);
    dk = alloc_floats((int64_t)j.k.a.count);
    dv = alloc_floats((int64_t)j.v.a.count);
    if (!dq || !dk || !dv) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    outs[0] = (out_file){op->dq, NULL, dq, r, {0}};
    memcpy(outs[0].shape, j.q.a.shape, (size_t)r * sizeof(int64_t));
    outs[1] = (out_file){op->dk, NULL, dk, r, {0}};
    memcpy(outs[1].shape, j.k.a.shape, (size_t)r * sizeof(int64_t));
    outs[2] = (out_file){op->dv, NULL, dv, r, {0}};
    memcpy(outs[2].shape, j.v.a.shape, (size_t)r * sizeof(int64_t));
    for (int i = 0; i < 3; i++)
        if ((rc = out_prepare(&outs[i])))
            goto done;
    {
        const sdpa_tensor tq = tensor_view(&j.q), tk = tensor_view(&j.k), tv = tensor_view(&j.v),
                          tdo = tensor_view(&j.dout);
        sdpa_tensor to, tl;
        sdpa_status st;
        if (op->o) {
            to = tensor_view(&j.o);
        } else {
            o = alloc_floats(B * Hq * Tq * Dv);
            lse = alloc_floats(B * Hq * Tq);
            if (!o || !lse) {
                rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
                goto done;
            }
            const sdpa_tensor_out wo = {o, Hq * Tq * Dv, Tq * Dv, Dv}, wl = {lse, Hq * Tq, Tq, 1};
            if ((st = sdpa_forward(p, &tq, &tk, &tv, &wo, &wl)) != SDPA_OK) {
                rc = library_error(st);
                goto done;
            }
            to = (sdpa_tensor){o, Hq * Tq * Dv, Tq * Dv, Dv};
        }
        tl = (sdpa_tensor){op->o ? (const float *)j.lse.a.data : lse, Hq * Tq, Tq, 1};
        const sdpa_tensor_out odq = {dq, tq.batch_stride, tq.head_stride, tq.seq_stride},
                              odk = {dk, tk.batch_stride, tk.head_stride, tk.seq_stride},
                              odv = {dv, tv.batch_stride, tv.head_stride, tv.seq_stride};
        if ((st = sdpa_backward(p, &tq, &tk, &tv, &to, &tl, &tdo, &odq, &odk, &odv)) != SDPA_OK) {
            rc = library_error(st);
            goto done;
        }
    }
    rc = out_commit(outs, 3);
done:
    out_discard(outs, 3);
    free(o);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    job_free(&j);
    return rc;
}

/* ------------------------------------------------------------ info */

static int max_threads(void)
{
#if HAVE_OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int cmd_info(int argc, char **argv)
{
    static const sdpa_isa isas[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_NEON};
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
    printf("isa compiled:");
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (sdpa_isa_compiled(isas[i]))
            printf(" %s", sdpa_isa_name(isas[i]));
    printf("\nisa supported:");
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (sdpa_isa_supported(isas[i]))
            printf(" %s", sdpa_isa_name(isas[i]));
    printf("\nactive isa: %s\n", sdpa_isa_name(sdpa_isa_active()));
    rej = sdpa_isa_env_rejected();
    if (rej)
        printf("SDPA_ISA: '%s' rejected (not an ISA name for this architecture; ignored)\n", rej);
    else if (getenv("SDPA_ISA"))
        printf("SDPA_ISA: '%s' (caps the choice)\n", getenv("SDPA_ISA"));
    else
        printf("SDPA_ISA: not set\n");
#if HAVE_OPENMP
    printf("openmp threads: %d\n", max_threads());
#else
    printf("openmp: not built (1 thread)\n");
#endif
    return 0;
}

/* ------------------------------------------------------------ demo */

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

static int demo_worked(const char *dir, const cli_opts *opt, int *ok)
{
    char path[4][1024];
    static const char *const names[4] = {"Q", "K", "V", "O_expected"};
    tensor t[4];
    int rc = 0;
    float *o = NULL;
    double maxerr = 0, maxerr64 = 0;
    memset(t, 0, sizeof t);
    for (int i = 0; i < 4; i++) {
        snprintf(path[i], sizeof path[i], "%s/worked_example/%s.npy", dir, names[i]);
        if ((rc = load_tensor(path[i], names[i], &t[i])))
            goto done;
    }
    if (t[0].a.ndim != 2 || t[1].a.ndim != 2 || t[2].a.ndim != 2 || t[0].d != t[1].d || t[1].t != t[2].t ||
        t[3].t != t[0].t || t[3].d != t[2].d) {
        file_error(dir, "worked example files do not fit each other");
        rc = EXIT_BAD;
        goto done;
    }
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
    o = alloc_floats(Tq * Dv);
    if (!o) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    const sdpa_tensor tq = tensor_view(&t[0]), tk = tensor_view(&t[1]), tv = tensor_view(&t[2]);
    const sdpa_tensor_out to = {o, Tq * Dv, Tq * Dv, Dv};
    sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, NULL);
    if (st != SDPA_OK) {
        rc = library_error(st);
        goto done;
    }
    printf("== worked example (%s/worked_example): Tq=%lld Tk=%lld Dk=%lld Dv=%lld, scale 1/sqrt(%lld) ==\n",
           dir, (long long)Tq, (long long)Tk, (long long)D, (long long)Dv, (long long)D);
    printf("O =\n");
    for (int64_t i = 0; i < Tq; i++) {
        double ref[64], lse;
        printf("  [");
        for (int64_t c = 0; c < Dv; c++)
            printf(" %9.6f", o[i * Dv + c]);
        printf(" ]\n");
        for (int64_t c = 0; c < Dv; c++) {
            double e = fabs((double)o[i * Dv + c] - ((const float *)t[3].a.data)[i * Dv + c]);
            if (!(e <= maxerr))
                maxerr = e;
        }
        if (Dv <= 64) {
            ref_row(t[0].a.data, t[1].a.data, t[2].a.data, 1, 1, Tq, Tk, D, Dv, 1.0 / sqrt((double)D), 0, 0, 0, i,
                    ref, &lse);
            for (int64_t c = 0; c < Dv; c++) {
                double e = fabs((double)o[i * Dv + c] - ref[c]);
                if (!(e <= maxerr64))
                    maxerr64 = e;
            }
        }
    }
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

static int demo_prefill(const cli_opts *opt, int *ok)
{
    enum { B = 1, H = 8, T = 1024, D = 64, SAMPLES = 64, REPS = 3 };
    const size_t n = (size_t)B * H * T * D;
    float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    float *o = malloc(n * sizeof(float)), *lse = malloc((size_t)B * H * T * sizeof(float));
    uint64_t seed = 20240601;
    int rc = 0;
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
    /* A warm-up run (unless it is slow enough to be warm itself), then up to
     * REPS timed runs, stopping after about a second: the demo stays quick. */
    double best = INFINITY, total = 0;
    int timed = 0;
    for (int r = 0;; r++) {
        const double t0 = now_ms();
        sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        const double dt = now_ms() - t0;
        if (st != SDPA_OK) {
            rc = library_error(st);
            goto done;
        }
        if (r == 0 && dt < 250)
            continue;
        best = dt < best ? dt : best;
        total += dt;
        if (++timed >= REPS || total > 1000)
            break;
    }
    double maxerr = 0, maxlse = 0;
    for (int s = 0; s < SAMPLES; s++) {
        const int64_t h = s % H, i = (int64_t)s * (T - 1) / (SAMPLES - 1);
        double ref[D], rl;
        ref_row(q, k, v, H, H, T, T, D, D, 1.0 / sqrt((double)D), 1, 0, h, i, ref, &rl);
        for (int c = 0; c < D; c++) {
            double e = fabs((double)o[(h * T + i) * D + c] - ref[c]);
            if (!(e <= maxerr))
                maxerr = e;
        }
        double e = fabs((double)lse[h * T + i] - rl);
        if (!(e <= maxlse))
            maxlse = e;
    }
    const double pairs = (double)B * H * T * (T + 1) / 2.0;
    const double flops = 2.0 * pairs * (D + D);
    const int threads = opt->threads > 0 ? opt->threads : max_threads();
    const sdpa_isa isa = opt->isa == SDPA_ISA_AUTO ? sdpa_isa_active() : opt->isa;
    const double tol = 1e-4;
    const int good = maxerr <= tol && maxlse <= tol;
    printf("== causal prefill: B=%d H=%d T=%d D=%d (top-left), deterministic uniform inputs ==\n", B, H, T, D);
    printf("isa: %s, threads: %d\n", sdpa_isa_name(isa), threads);
    printf("max |O - float64 reference| over %d rows = %.3g, max |LSE - reference| = %.3g (tolerance %g): %s\n",
           SAMPLES, maxerr, maxlse, tol, good ? "ok" : "FAILED");
    printf("time: %.3f ms (best of %d), %.2f GFLOP/s (%.3f GFLOP = 2 * %.0f pairs * (Dk + Dv))\n", best, timed,
           flops / (best * 1e6), flops * 1e-9, pairs);
    if (!good)
        *ok = 0;
done:
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    return rc;
}

static int cmd_demo(int argc, char **argv)
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

/* ------------------------------------------------------------ main */

static void print_main_help(FILE *f)
{
    fprintf(f, "usage: sdpa <command> [options]\n\n"
               "Scaled dot-product attention (FlashAttention-2, fp32) on .npy files.\n\n"
               "Commands:\n"
               "  info       version, CPU features, ISAs, active ISA, OpenMP threads\n"
               "  forward    O (and LSE) from Q, K, V and masks\n"
               "  backward   dQ, dK, dV from Q, K, V, dO (and O, LSE)\n"
               "  demo       worked example and a timed causal prefill, checked against float64\n"
               "  bench      benchmark%s\n\n"
               "'sdpa <command> --help' describes each command. The SDPA_ISA environment variable\n"
               "caps the ISA chosen at load (scalar, avx2, avx512, neon).\n",
#ifdef SDPA_HAVE_BENCH
            ""
#else
            " (not built in this binary)"
#endif
    );
}

int main(int argc, char **argv)
{
    const char *cmd;
    if (argc < 2) {
        plain_error("no command given");
        print_main_help(stderr);
        return EXIT_BAD;
    }
    cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        print_main_help(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("sdpa %s\n", sdpa_version());
        return 0;
    }
    if (strcmp(cmd, "info") == 0)
        return cmd_info(argc - 1, argv + 1);
    install_signal_cleanup();
    if (strcmp(cmd, "forward") == 0)
        return cmd_forward(argc - 1, argv + 1);
    if (strcmp(cmd, "backward") == 0)
        return cmd_backward(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0)
        return cmd_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) {
#ifdef SDPA_HAVE_BENCH
        return sdpa_bench_main(argc - 1, argv + 1);
#else
        plain_error("bench: not built in this binary (bench/bench.c was absent when the build was configured)");
        return EXIT_BAD;
#endif
    }
    plain_error("unknown command '%s'", cmd);
    fprintf(stderr, "usage: sdpa info|forward|backward|demo|bench [options] (see 'sdpa --help')\n");
    return EXIT_BAD;
}
