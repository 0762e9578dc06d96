/* SPDX-License-Identifier: MIT */
/* tools/cli_args.c - error messages, the option table, --help and option parsing
 * of `sdpa forward`, `sdpa backward` and `sdpa demo`. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ------------------------------------------------------------ messages */

void file_error(const char *path, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "sdpa: error: %s: ", path);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void plain_error(const char *fmt, ...)
{
    va_list ap;
    fputs("sdpa: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static const char *const usage_lines[] = {
    [CMD_FORWARD] = "usage: sdpa forward -q Q.npy -k K.npy -v V.npy -o O.npy [--lse LSE.npy] [--cu-seqlens-q CUQ.npy "
                    "(--cu-seqlens-k CUK.npy | --block-table BT.npy --seq-lens-k LK.npy)] [options]",
    [CMD_BACKWARD] = "usage: sdpa backward -q Q.npy -k K.npy -v V.npy --do dO.npy --dq dQ.npy --dk dK.npy "
                     "--dv dV.npy [-o O.npy --lse LSE.npy] [--dsinks dSINKS.npy] [--cu-seqlens-q CUQ.npy "
                     "--cu-seqlens-k CUK.npy] [options]",
    [CMD_DEMO] = "usage: sdpa demo [--data DIR] [--threads N] [--isa NAME]",
};

static const char *cmd_name(int cmd)
{
    return cmd == CMD_FORWARD ? "forward" : cmd == CMD_BACKWARD ? "backward" : "demo";
}

int usage_error(int cmd, const char *fmt, ...)
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

int library_error(sdpa_status st)
{
    plain_error("libsdpa: %s (status %d)", sdpa_status_string(st), (int)st);
    return EXIT_BAD;
}

/* ------------------------------------------------------------ the option table */

typedef enum opt_kind {
    K_PATH, K_SCALE, K_SOFTCAP, K_CAUSAL, K_ALIGN, K_WINDOW, K_OFFSET, K_THREADS, K_ISA, K_LAYOUT, K_PAGE_LAYOUT, K_DTYPE,
    K_FPMATH
} opt_kind;

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
    {"--query", "-q", K_PATH, OFF(q), FB, "Q, float32 or float16 (T, Dk), (Hq, T, Dk) or (B, Hq, Tq, Dk)"},
    {"--key", "-k", K_PATH, OFF(k), FB, "K, float32 or float16 (B, Hkv, Tk, Dk) in Q's rank"},
    {"--value", "-v", K_PATH, OFF(v), FB, "V, float32 or float16 (B, Hkv, Tk, Dv) in Q's rank"},
    {"--out", "-o", K_PATH, OFF(o), FB,
     "O (forward: written; backward: the forward's O, read, given with --lse)"},
    {"--lse", NULL, K_PATH, OFF(lse), FB,
     "logsumexp, float32 of shape Q.shape[:-1] (forward: written; backward: read)"},
    {"--do", NULL, K_PATH, OFF(dout), CMD_BACKWARD, "dO, float32 or float16 shaped like O (read)"},
    {"--dq", NULL, K_PATH, OFF(dq), CMD_BACKWARD, "dQ (written)"},
    {"--dk", NULL, K_PATH, OFF(dk), CMD_BACKWARD, "dK (written)"},
    {"--dv", NULL, K_PATH, OFF(dv), CMD_BACKWARD, "dV (written)"},
    {"--scale", NULL, K_SCALE, OFF(scale), FB, "S: logit scale (default 1/sqrt(Dk))"},
    {"--causal", NULL, K_CAUSAL, OFF(causal), FB,
     "none|top-left|bottom-right: causal mask aligned at the top-left or bottom-right corner (none: off)"},
    {"--window-left", NULL, K_WINDOW, OFF(window_left), FB,
     "N: keys at most N before the diagonal (-1: unbounded)"},
    {"--window-right", NULL, K_WINDOW, OFF(window_right), FB,
     "N: keys at most N after the diagonal (-1: unbounded)"},
    {"--window-align", NULL, K_ALIGN, OFF(align), FB,
     "top-left|bottom-right: diagonal of a window without --causal (default top-left)"},
    {"--diagonal-offset", NULL, K_OFFSET, OFF(diagonal_offset), FB,
     "N: moves the diagonal of causal, the window and ALiBi by N keys (default 0)"},
    {"--kv-len", NULL, K_PATH, OFF(kvlen), FB, "per-batch key lengths, int32 or int64 of shape (B,)"},
    {"--mask", NULL, K_PATH, OFF(mask), FB,
     "bool or uint8 mask (nonzero = may attend) broadcastable to (B, Hq, Tq, Tk)"},
    {"--bias", NULL, K_PATH, OFF(bias), FB,
     "float32 additive bias broadcastable to (B, Hq, Tq, Tk); -inf disallows a key"},
    {"--softcap", NULL, K_SOFTCAP, OFF(softcap), FB,
     "C: logit soft-cap, x -> C * tanh(x / C) (0: off, the default)"},
    {"--alibi-slopes", NULL, K_PATH, OFF(alibi), FB,
     "ALiBi slopes, float32 (Hq,), each finite (see below)"},
    {"--sinks", NULL, K_PATH, OFF(sinks), FB,
     "attention sinks, float32 (Hq,), each finite or -inf (see below)"},
    {"--dsinks", NULL, K_PATH, OFF(dsinks), CMD_BACKWARD,
     "dsinks, float32 (Hq,) (written; needs --sinks)"},
    {"--layout", NULL, K_LAYOUT, OFF(bshd), FB,
     "bhsd|bshd: dense 4-D files are (B, H, T, D) (default) or (B, T, H, D); LSE (B, H, T) or (B, T, H)"},
    {"--cu-seqlens-q", NULL, K_PATH, OFF(cuq), FB,
     "CUQ.npy: int32/int64 (B+1,) query offsets: Q (total_q, Hq, Dk) packed (see below)"},
    {"--cu-seqlens-k", NULL, K_PATH, OFF(cuk), FB, "CUK.npy: int32/int64 (B+1,) key offsets: K, V (total_k, Hkv, D)"},
    {"--block-table", NULL, K_PATH, OFF(btab), FB,
     "BT.npy: int32/int64 (B, M) page ids: K, V are paged caches (forward only)"},
    {"--seq-lens-k", NULL, K_PATH, OFF(lensk), FB, "LK.npy: int32/int64 (B,) keys of each sequence in the cache"},
    {"--page-layout", NULL, K_PAGE_LAYOUT, OFF(page_nhd), FB,
     "HND|NHD: caches (num_blocks, Hkv, block_size, D) (default) or (num_blocks, block_size, Hkv, D)"},
    {"--dtype", NULL, K_DTYPE, OFF(dtype), FB,
     "fp32|bf16|fp16: type Q and O are stored in (backward: dO, dQ too) (default fp32; see below)"},
    {"--kv-dtype", NULL, K_DTYPE, OFF(kv_dtype), FB,
     "fp32|bf16|fp16: type K and V are stored in (backward: dK, dV too) (default: --dtype's)"},
    {"--fpmath", NULL, K_FPMATH, OFF(fpmath), FB,
     "default|strict: strict rounds no intermediate to bf16 (sdpa_problem.fpmath_mode; default: the ISA's)"},
    {"--data", NULL, K_PATH, OFF(data_dir), CMD_DEMO, "DIR: the examples directory"},
    {"--threads", NULL, K_THREADS, OFF(threads), FB | CMD_DEMO, "N: OpenMP threads (0: OpenMP's default)"},
    {"--isa", NULL, K_ISA, OFF(isa), FB | CMD_DEMO, "NAME: scalar|avx2|avx512|amx|neon|auto"},
};
#undef FB
#define N_OPTS (sizeof opt_defs / sizeof opt_defs[0])

void print_help(int cmd)
{
    printf("%s\n\n", usage_lines[cmd]);
    if (cmd == CMD_FORWARD)
        printf("Computes O = softmax(scale * Q K^T + bias, masked) V (and the logsumexp).\n");
    else if (cmd == CMD_BACKWARD)
        printf("Computes dQ, dK, dV given dO. O and LSE are recomputed when not given\n"
               "(give both or neither). With --sinks, --dsinks also writes the sinks' gradient.\n");
    else
        printf("Runs the textbook worked example (examples/worked_example) and a timed causal\n"
               "prefill B=1 H=8 T=1024 D=64, both checked against a float64 reference.\n"
               "Exit status 0 if both are within tolerance, else 1.\n");
    printf("\nOptions:\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_def *d = &opt_defs[i];
        char names[40];
        if (!(d->cmds & (unsigned)cmd))
            continue;
        if (cmd == CMD_BACKWARD && d->kind == K_PAGE_LAYOUT)
            continue; /* accepted only to refuse a paged backward with a clear message */
        if (cmd == CMD_BACKWARD && (d->offset == OFF(btab) || d->offset == OFF(lensk)))
            continue;
        snprintf(names, sizeof names, "%s%s%s", d->alias ? d->alias : "", d->alias ? ", " : "", d->name);
        printf("  %-20s %s\n", names, d->help);
    }
    if (cmd != CMD_DEMO)
        printf("\nAttention variants (Gemma 2 softcap, ALiBi, gpt-oss sinks): the logit of query i, key j of\n"
               "head h is x = scale * q.k, then C * tanh(x / C) (--softcap), then - slope[h] * |j - (i + d)|\n"
               "(--alibi-slopes; d: the diagonal of --causal / --window-align), then + bias and the masks.\n"
               "A sink s[h] joins every row's softmax denominator and carries no value.\n");
    if (cmd == CMD_FORWARD)
        printf("\nTypes (--dtype, --kv-dtype): Q, K and V may be float32 or float16 .npy files. Each tensor is\n"
               "stored in its type while libsdpa computes (products and sums accumulate in fp32): Q and O in\n"
               "--dtype's, K and V in --kv-dtype's (default: --dtype's; e.g. an fp32 model with a bf16 KV\n"
               "cache: --kv-dtype bf16). Inputs are rounded to nearest even into a 16-bit type (a float16\n"
               "file into fp16 is kept as is). O is written as float32 ('<f4'; bf16 widened exactly), or\n"
               "as float16 ('<f2') with --dtype fp16; LSE is always float32. Masks, bias, ALiBi slopes and\n"
               "sinks stay float32.\n");
    if (cmd == CMD_BACKWARD)
        printf("\nTypes (--dtype, --kv-dtype): Q, K, V, dO and the given O may be float32 or float16 .npy files\n"
               "(LSE: float32). Each tensor is stored in its type while libsdpa computes: Q, O, dO and dQ in\n"
               "--dtype's, K, V, dK and dV in --kv-dtype's (default: --dtype's), rounded to nearest even.\n"
               "Outputs are written as float32 ('<f4'), or as float16 ('<f2') when stored in fp16 (dQ with\n"
               "--dtype fp16, dK and dV with --kv-dtype fp16); dsinks is float32.\n");
    if (cmd != CMD_DEMO)
        printf("\nQ/K/V/O share one rank: 2 (T, D), 3 (H, T, D) or 4 (B, H, T, D), or with --layout bshd\n"
               "4 (B, T, H, D); outputs have the rank and layout of their input. GQA: Hq a multiple of\n"
               "Hkv. Outputs are written only if everything succeeds. Errors: one line on stderr, exit\n"
               "status 2.\n");
    if (cmd == CMD_FORWARD)
        printf("\nPacked sequences (serving; FlashAttention's cu_seqlens): with --cu-seqlens-q, B sequences\n"
               "are packed in token lists: Q (total_q, Hq, Dk), O (total_q, Hq, Dv), LSE (total_q, Hq),\n"
               "sequence b owning rows CUQ[b]..CUQ[b+1]-1 (CUQ[0] = 0, nondecreasing, CUQ[B] = total_q).\n"
               "K, V are either packed the same way with --cu-seqlens-k (total_k, Hkv, D), or paged\n"
               "caches with --block-table BT.npy (B, M) and --seq-lens-k LK.npy (B,): key j of sequence b\n"
               "is slot j %% block_size of page BT[b, j / block_size]; LK[b] keys; K, V are\n"
               "(num_blocks, Hkv, block_size, D) (--page-layout HND) or (num_blocks, block_size, Hkv, D)\n"
               "(NHD). Table entries past a sequence's last page are not read; pages may be shared.\n"
               "Causal, windows and the variants apply per sequence (bottom-right: each sequence's keys\n"
               "end at its last query); --mask, --bias and --kv-len are refused.\n");
    if (cmd == CMD_BACKWARD)
        printf("\nPacked sequences: --cu-seqlens-q CUQ.npy with --cu-seqlens-k CUK.npy (int32/int64 (B+1,)):\n"
               "Q, dO, dQ (total_q, Hq, D), K, V, dK, dV (total_k, Hkv, D), LSE (total_q, Hq). No paged\n"
               "backward; --mask, --bias and --kv-len are refused with them.\n");
}

/* ------------------------------------------------------------ option values */

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

/* Whether a number strtof accepted is written as zero (its digits before the
 * exponent all 0): strtof and strtod both give 0 for 1e-400. */
static int written_as_zero(const char *val)
{
    const char *c = val + strspn(val, " \t\n\v\f\r+-");
    const int hex = c[0] == '0' && (c[1] == 'x' || c[1] == 'X');
    for (c += hex ? 2 : 0; *c && !strchr(hex ? "pP" : "eE", *c); c++)
        if (*c != '0' && *c != '.')
            return 0;
    return 1;
}

static int parse_scale(int cmd, const char *val, cli_opts *o)
{
    char *end;
    float s;
    errno = 0;
    s = strtof(val, &end);
    /* ERANGE on underflow to a denormal is fine; overflow is not */
    if (end == val || *end || !isfinite(s) || (errno == ERANGE && fabsf(s) == HUGE_VALF))
        return usage_error(cmd, "--scale '%s' is not a finite number", val);
    /* a nonzero value below float32's smallest denormal would silently become 0
       (uniform attention): refused, as --softcap does */
    if (s == 0.0f && !written_as_zero(val))
        return usage_error(cmd, "--scale '%s' underflows float32 to 0 (write 0 for a zero scale)", val);
    o->scale = s;
    o->have_scale = 1;
    return 0;
}

/* --softcap C: 0 (off) or a finite float32 > 0. A value that underflows to 0
 * is refused rather than silently turning the softcap off. */
static int parse_softcap(int cmd, const char *val, cli_opts *o)
{
    char *end;
    float c;
    errno = 0;
    c = strtof(val, &end);
    if (end == val || *end || isnan(c))
        return usage_error(cmd, "--softcap '%s' is not a number (expected C > 0, or 0: off)", val);
    if (!isfinite(c) || (errno == ERANGE && fabsf(c) == HUGE_VALF))
        return usage_error(cmd, "--softcap '%s' is not finite (expected C > 0, or 0: off)", val);
    if (c < 0.0f)
        return usage_error(cmd, "--softcap '%s' is negative (expected C > 0, or 0: off)", val);
    if (c == 0.0f && !written_as_zero(val))
        return usage_error(cmd, "--softcap '%s' underflows float32 to 0 (0 means off)", val);
    o->softcap = c == 0.0f ? 0.0f : c; /* -0 is off too */
    return 0;
}

static int parse_causal(int cmd, const char *val, cli_opts *o)
{
    if (strcmp(val, "top-left") == 0)
        o->causal = SDPA_CAUSAL_TOP_LEFT;
    else if (strcmp(val, "bottom-right") == 0)
        o->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    else if (strcmp(val, "none") == 0)
        o->causal = SDPA_CAUSAL_NONE;
    else
        return usage_error(cmd, "--causal '%s': expected top-left or bottom-right", val);
    return 0;
}

static int parse_align(int cmd, const char *val, cli_opts *o)
{
    if (strcmp(val, "top-left") == 0)
        o->align = SDPA_ALIGN_TOP_LEFT;
    else if (strcmp(val, "bottom-right") == 0)
        o->align = SDPA_ALIGN_BOTTOM_RIGHT;
    else
        return usage_error(cmd, "--window-align '%s': expected top-left or bottom-right", val);
    o->have_align = 1;
    return 0;
}

static int parse_dtype_opt(int cmd, const char *name, const char *val, sdpa_dtype *dt)
{
    if (dtype_parse(val, dt) != 0)
        return usage_error(cmd, "%s '%s': expected fp32, bf16 or fp16", name, val);
    return 0;
}

static int parse_isa(int cmd, const char *val, cli_opts *o)
{
    sdpa_isa isa;
    if (sdpa_isa_from_name(val, &isa) != 0)
        return usage_error(cmd, "--isa '%s': expected scalar, avx2, avx512, amx, neon or auto", val);
    if (isa != SDPA_ISA_AUTO && !sdpa_isa_supported(isa)) /* a bad value: the line and the usage */
        return usage_error(cmd, "--isa %s: not available here (%s)", val,
                           sdpa_isa_compiled(isa) ? "this CPU or OS cannot run it"
                                                  : "this build has no kernels for it");
    o->isa = isa;
    return 0;
}

/* Stores the value of option d (spelt name on the command line) into *o. */
static int parse_value(int cmd, const opt_def *d, const char *name, const char *val, cli_opts *o)
{
    char *field = (char *)o + d->offset;
    int64_t n;
    switch (d->kind) {
    case K_PATH:
        if (!*val)
            return usage_error(cmd, "option '%s' needs a file name", name);
        *(const char **)field = val;
        return 0;
    case K_SCALE: return parse_scale(cmd, val, o);
    case K_SOFTCAP: return parse_softcap(cmd, val, o);
    case K_CAUSAL: return parse_causal(cmd, val, o);
    case K_ALIGN: return parse_align(cmd, val, o);
    case K_WINDOW:
        if (parse_int64(val, &n) != 0 || n < -1)
            return usage_error(cmd, "%s '%s': expected an integer >= 0 (or -1: unbounded)", name, val);
        *(int64_t *)field = n;
        return 0;
    case K_OFFSET:
        if (parse_int64(val, &n) != 0 || n < -SDPA_MAX_DIAGONAL_OFFSET || n > SDPA_MAX_DIAGONAL_OFFSET)
            return usage_error(cmd, "%s '%s': expected an integer in [-2^48, 2^48]", name, val);
        *(int64_t *)field = n;
        return 0;
    case K_THREADS:
        if (parse_int64(val, &n) != 0 || n < 0 || n > 4096)
            return usage_error(cmd, "--threads '%s': expected an integer in [0, 4096]", val);
        o->threads = (int)n;
        return 0;
    case K_ISA: return parse_isa(cmd, val, o);
    case K_DTYPE:
        if (d->offset == OFF(kv_dtype))
            o->have_kv_dtype = 1;
        return parse_dtype_opt(cmd, d->name, val, (sdpa_dtype *)field);
    case K_FPMATH:
        if (strcmp(val, "default") != 0 && strcmp(val, "strict") != 0)
            return usage_error(cmd, "--fpmath '%s': expected default or strict", val);
        o->fpmath = strcmp(val, "strict") == 0 ? SDPA_FPMATH_STRICT : SDPA_FPMATH_DEFAULT;
        return 0;
    case K_LAYOUT:
        if (strcmp(val, "bhsd") != 0 && strcmp(val, "bshd") != 0)
            return usage_error(cmd, "--layout '%s': expected bhsd (B, H, T, D) or bshd (B, T, H, D)", val);
        o->bshd = strcmp(val, "bshd") == 0;
        o->have_layout = 1;
        return 0;
    case K_PAGE_LAYOUT:
        if (strcmp(val, "HND") != 0 && strcmp(val, "NHD") != 0)
            return usage_error(cmd,
                               "--page-layout '%s': expected HND (num_blocks, Hkv, block_size, D) or NHD "
                               "(num_blocks, block_size, Hkv, D)",
                               val);
        o->page_nhd = strcmp(val, "NHD") == 0;
        o->have_page_layout = 1;
        return 0;
    }
    return 0;
}

/* ------------------------------------------------------------ the command line */

/* The combinations of the packed / paged options (issue 17) and --layout. */
static int check_seq_options(int cmd, const cli_opts *o)
{
    if (cmd == CMD_DEMO)
        return 0;
    if (cmd == CMD_BACKWARD && (o->btab || o->lensk || o->have_page_layout))
        return usage_error(cmd, "%s: there is no paged backward (libsdpa computes the backward of packed K/V "
                                "only: give --cu-seqlens-q and --cu-seqlens-k)",
                           o->btab ? "--block-table" : o->lensk ? "--seq-lens-k" : "--page-layout");
    if (!o->cuq) {
        if (o->cuk || o->btab || o->lensk)
            return usage_error(cmd, "%s needs --cu-seqlens-q (the packed queries' offsets)",
                               o->cuk ? "--cu-seqlens-k" : o->btab ? "--block-table" : "--seq-lens-k");
        if (o->have_page_layout)
            return usage_error(cmd, "--page-layout applies only to paged caches (--block-table)");
        return 0;
    }
    if (o->mask || o->bias || o->kvlen)
        return usage_error(cmd, "%s cannot be used with --cu-seqlens-q (packed sequences take no mask, bias or "
                                "key lengths: each sequence's lengths come from the offsets)",
                           o->mask ? "--mask" : o->bias ? "--bias" : "--kv-len");
    if (o->have_layout && o->bshd)
        return usage_error(cmd, "--layout bshd applies to dense 4-D files; with --cu-seqlens-q the files are "
                                "token lists (total, H, D)");
    if (o->cuk && (o->btab || o->lensk))
        return usage_error(cmd, "give either --cu-seqlens-k (packed K/V) or --block-table with --seq-lens-k "
                                "(paged K/V), not both");
    if (!o->cuk && !o->btab && !o->lensk)
        return usage_error(cmd, "--cu-seqlens-q needs --cu-seqlens-k (packed K/V) or --block-table and "
                                "--seq-lens-k (paged K/V)");
    if (!o->cuk && (!o->btab || !o->lensk))
        return usage_error(cmd, "%s needs %s (paged K/V)", o->btab ? "--block-table" : "--seq-lens-k",
                           o->btab ? "--seq-lens-k" : "--block-table");
    if (o->have_page_layout && !o->btab)
        return usage_error(cmd, "--page-layout applies only to paged caches (--block-table)");
    return 0;
}

/* Index into opt_defs of the option called name for cmd, or -1. */
static int find_option(int cmd, const char *name)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if ((opt_defs[i].cmds & (unsigned)cmd) &&
            (strcmp(name, opt_defs[i].name) == 0 || (opt_defs[i].alias && strcmp(name, opt_defs[i].alias) == 0)))
            return (int)i;
    return -1;
}

static void default_options(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->causal = SDPA_CAUSAL_NONE;
    o->align = SDPA_ALIGN_TOP_LEFT;
    o->window_left = o->window_right = SDPA_WINDOW_UNBOUNDED;
    o->isa = SDPA_ISA_AUTO;
    o->dtype = o->kv_dtype = SDPA_DTYPE_F32;
}

int parse_options(int cmd, int argc, char **argv, cli_opts *o, int *help)
{
    unsigned char seen[N_OPTS] = {0};
    default_options(o);
    *help = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL, *eq;
        char name[64];
        int rc, di;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *help = 1;
            return 0;
        }
        if (arg[0] != '-' || arg[1] == '\0')
            return usage_error(cmd, "unexpected argument '%s'", arg);
        snprintf(name, sizeof name, "%s", arg);
        eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        if (eq) { /* --name=value */
            size_t n = (size_t)(eq - arg);
            name[n < sizeof name ? n : sizeof name - 1] = '\0';
            val = eq + 1;
        }
        if ((di = find_option(cmd, name)) < 0)
            return usage_error(cmd, "unknown option '%s' for 'sdpa %s'", name, cmd_name(cmd));
        if (seen[di]++)
            return usage_error(cmd, "option '%s' given twice", opt_defs[di].name);
        if (!val) {
            if (i + 1 >= argc)
                return usage_error(cmd, "option '%s' needs a value", name);
            val = argv[++i];
        }
        if ((rc = parse_value(cmd, &opt_defs[di], name, val, o)))
            return rc;
    }
    if (!o->have_kv_dtype)
        o->kv_dtype = o->dtype;
    if (o->dsinks && !o->sinks)
        return usage_error(cmd, "--dsinks needs --sinks (it is the gradient of the sinks)");
    if (o->have_align && o->causal != SDPA_CAUSAL_NONE)
        return usage_error(cmd, "--window-align applies only without --causal (a causal window follows "
                                "the causal alignment)");
    return check_seq_options(cmd, o);
}
