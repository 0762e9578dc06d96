/* SPDX-License-Identifier: MIT */
/* bench/bench.c - `sdpa bench`: times libsdpa per ISA and thread count against this CPU's limits.
 *
 * For every shape (B, Hq, Hkv, Tq, Tk, Dk, Dv) and mask, every ISA the CPU can
 * run (forced per call through sdpa_problem.isa) and every thread count, the
 * forward and the backward pass are run --warmup times (default 1) and then
 * --reps times; the median wall time (clock_gettime(CLOCK_MONOTONIC)) is
 * reported. Long rows get fewer runs (about --max-time seconds per row); a
 * row whose warm-up run alone exceeds --max-time reports that run. The
 * backward rows of a shape all start from the O and LSE of one forward with
 * the default ISA. FLOPs: forward 2 P (Dk + Dv), backward 2 P (3 Dk + 2 Dv),
 * where P is the exact number of allowed (query, key) pairs of the mask
 * (design notes section 5); the naive rows use the same count, so every
 * GFLOP/s is "useful work per second" and comparable.
 *
 * The same run measures its own limits, in a forked child process so that the
 * large bandwidth buffer never shows in the parent's peak RSS:
 *   - the fp32 FMA peak per ISA and thread count: register-resident FMA chains
 *     (bench/peak_*.c; the scalar one chains non-vectorised a*b+c, as the scalar kernels do);
 *   - the memory read bandwidth of a buffer much larger than the last-level
 *     cache (256 MiB by default) per thread count.
 * "% of peak" divides by the peak of the row's ISA at the row's thread count
 * (naive-blas: the best ISA's). Decode-like shapes (Tq <= 16) also report
 * GB/s = bytes of K and V that some query may read (each once) / time, against
 * the measured bandwidth; their timed runs each start with the caches evicted
 * (every line of the row's buffers flushed, untimed), so that a K/V that would
 * fit in the L3 between repetitions is still read from memory, as in a real
 * decode step. With --bw-interleaved the decode rows also time the bandwidth
 * test's read of a --bw-mib buffer (flushed the same way) interleaved with
 * them, run by run: on a shared machine the bandwidth a process gets moves from
 * minute to minute, and the header's figure is measured once, before.
 *
 * "naive-blas" is the same problem done the way a NumPy user would: S = scale
 * Q K^T materialised with OpenBLAS cblas_sgemm per head, row softmax with the
 * mask, O = P V with cblas_sgemm; backward from the stored P: dV = P^T dO,
 * dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = scale dS K,
 * dK = scale dS^T Q (GQA: dK, dV summed over the group). All sdpa rows run
 * first, then all naive rows, so OpenBLAS's threads never compete with the
 * library's and the big S buffers do not raise the RSS reported for sdpa rows.
 * Shapes run in order of increasing memory footprint for the same reason:
 * rss_mb is the process high-water mark (getrusage ru_maxrss) after the row,
 * rss_increase_mb how much this shape raised it.
 * OpenBLAS is loaded with dlopen() only when these rows are wanted (bench/blas.h):
 * the `sdpa` program links no BLAS.
 *
 * Attention variants (--softcap C, --alibi, --sinks): each one given is timed
 * alone, and all of them together when more than one is given, next to the
 * plain kernel on the same shape, ISA and thread count: the runs of the plain
 * and the variant problems are interleaved (plain, variant 1, ..., plain, ...)
 * so that a change of the machine's load hits them alike, and every variant
 * row reports ratio_vs_plain = its median / the plain median of the same run.
 * ALiBi slopes are the usual geometric 2^(-8 (h + 1) / Hq); sinks are 0.5 for
 * every head; the backward of a sinks problem also writes dsinks. The backward
 * rows of a variant start from the O and LSE of a forward of that variant.
 * Without these options the output is exactly as before; with them every row
 * (table and JSON) also says which variant it is.
 *
 * Key padding as users pass it (issue 20 item 4): besides "padding" (the key
 * lengths as sdpa_problem.kv_lengths, Tk/2 for batch 0 up to Tk for the last),
 * --mask takes the same key padding given as a mask: "padding-bool", a uint8
 * bool_mask broadcast as (B,1,1,Tk) (head and query strides 0);
 * "padding-bool-4d", the same materialised as (B,1,Tq,Tk) (query stride Tk,
 * head stride 0); "padding-bias" and "padding-bias-4d", a 0/-inf fp32 bias of
 * those two shapes. Every one allows exactly the (query, key) pairs of
 * "padding", so FLOPs and GB/s count the same. Each form is timed as the
 * variants are: with the kv_lengths problem of the same shape, ISA, threads and
 * type, runs interleaved (kv_lengths, form 1, ..., kv_lengths, ...), its row
 * (JSON "mask" = the form's name) carrying ratio_vs_kv_lengths = its median /
 * the kv_lengths median of the same run; asking for a form alone still times
 * (and prints) the kv_lengths rows it is compared with. The forms run the plain
 * kernel (no variant), with their own O and LSE (the backward starts from a
 * forward of the form); the masks are made and filled before any timed run.
 * Without --mask, the default key-padding shape 8,12,12,128,128,64,64 (--quick:
 * 4,4,4,128,128,64,64) gets all four forms; no other default shape does.
 *
 * Types (--dtype fp32,bf16,fp16, issue 16): every shape is timed once per type
 * listed, with Q, K, V and O (and dO, dQ, dK, dV) stored in that type (inputs the
 * same random values, rounded to nearest even); LSE stays fp32. Decode GB/s count
 * the K and V bytes of that type. Every JSON row has "dtype" (the naive and
 * --serve rows, fp32 only, say "fp32"); the table has a dtype column when a type
 * other than fp32 is timed. A backward the library refuses for a 16-bit type
 * (SDPA_ERR_UNSUPPORTED) is skipped with a note in the table, no row and no failure.
 *
 * Output: a table on stdout; with --json, one JSON object per line on stdout
 * and the header and table on stderr. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "sdpa.h"

#include "bench.h"
#include "cache_flush.h"
#include "dtype.h" /* src/dtype.h: the library's exact fp32 -> bf16 / fp16 rounding */
#include "peak.h"

#if HAVE_OPENMP
#include <omp.h>
#define OMP(directive) _Pragma(#directive)
#else
#define OMP(directive)
#endif

#ifdef SDPA_BENCH_HAVE_OPENBLAS
#include "blas.h" /* OpenBLAS, loaded at run time only for the naive rows */
static bench_blas blas;
#endif

#define MAX_LIST 32
#define MAX_CASES 128
#define MAX_REPS 1000
#define NAIVE_MAX_S_BYTES ((int64_t)1 << 30)
#define DECODE_MAX_TQ 16
#define MAX_VARIANTS 4 /* softcap, alibi, sinks alone, and the ones given together */
#define SINK_VALUE 0.5f
#define N_DTYPES 3 /* SDPA_DTYPE_F32, _BF16, _F16 */

static const char *const dtype_names[N_DTYPES] = {"fp32", "bf16", "fp16"};

static size_t dtype_bytes(sdpa_dtype dt)
{
    return dt == SDPA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* ------------------------------------------------------------ shapes and masks */

/* MASK_PADDING is key padding given as kv_lengths; the four after it are the
 * same key padding given as a mask (see padding forms below). */
typedef enum bench_mask {
    MASK_NONE,
    MASK_CAUSAL,
    MASK_CAUSAL_BR,
    MASK_PADDING,
    MASK_PADDING_BOOL,    /* uint8 (B,1,1,Tk): head and query strides 0 */
    MASK_PADDING_BOOL_4D, /* uint8 (B,1,Tq,Tk) materialised: query stride Tk, head stride 0 */
    MASK_PADDING_BIAS,    /* fp32 0/-inf bias (B,1,1,Tk) */
    MASK_PADDING_BIAS_4D, /* fp32 0/-inf bias (B,1,Tq,Tk) */
    MASK_COUNT
} bench_mask;
static const char *const mask_names[MASK_COUNT] = {"none",         "causal",          "causal-bottom-right",
                                                   "padding",      "padding-bool",    "padding-bool-4d",
                                                   "padding-bias", "padding-bias-4d"};
#define FIRST_FORM MASK_PADDING_BOOL
#define N_FORMS (MASK_COUNT - FIRST_FORM)
/* problems timed together (interleaved): the plain one, the variants, the padding forms */
#define MAX_PROBLEMS (1 + MAX_VARIANTS + N_FORMS)
#define MAX_TIMED (MAX_PROBLEMS + 1) /* the problems of a row and the interleaved bandwidth read */

static int is_padding_form(int m)
{
    return m >= FIRST_FORM && m < MASK_COUNT;
}

typedef struct shape {
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
} shape;

/* A shape and its mask. A MASK_PADDING case also carries the padding forms to
 * time with it (bit f: mask FIRST_FORM + f), each interleaved with it and
 * compared with it (ratio_vs_kv_lengths); a case is never of a form's mask. */
typedef struct bcase {
    shape s;
    bench_mask mask;
    unsigned forms;
} bcase;

/* Key padding lengths: deterministic, from Tk/2 (batch 0) up to Tk (last batch). */
static int32_t padding_length(const shape *s, int64_t b)
{
    const int64_t half = s->Tk / 2;
    return (int32_t)(s->B > 1 ? half + b * (s->Tk - half) / (s->B - 1) : half);
}

/* Exclusive end of the allowed key interval of query i in batch b (the interval starts at 0). */
static int64_t row_hi(const bcase *c, int64_t b, int64_t i)
{
    const shape *s = &c->s;
    int64_t hi;
    switch (c->mask) {
    case MASK_CAUSAL: hi = i + 1; break;
    case MASK_CAUSAL_BR: hi = i + s->Tk - s->Tq + 1; break;
    case MASK_PADDING:
    case MASK_PADDING_BOOL:
    case MASK_PADDING_BOOL_4D:
    case MASK_PADDING_BIAS:
    case MASK_PADDING_BIAS_4D: hi = padding_length(s, b); break;
    default: hi = s->Tk; break;
    }
    return hi < 0 ? 0 : hi > s->Tk ? s->Tk : hi;
}

/* Allowed (query, key) pairs over all batches and query heads. */
static double allowed_pairs(const bcase *c)
{
    double p = 0.0;
    for (int64_t b = 0; b < c->s.B; b++)
        for (int64_t i = 0; i < c->s.Tq; i++)
            p += (double)row_hi(c, b, i);
    return p * (double)c->s.Hq;
}

/* Bytes of K and V (elements of kv_bytes bytes) that at least one query may
 * read, each counted once. */
static double kv_bytes_read(const bcase *c, size_t kv_bytes)
{
    double keys = 0.0;
    for (int64_t b = 0; b < c->s.B; b++) {
        int64_t mx = 0;
        for (int64_t i = 0; i < c->s.Tq; i++) {
            const int64_t hi = row_hi(c, b, i);
            mx = hi > mx ? hi : mx;
        }
        keys += (double)mx;
    }
    return keys * (double)c->s.Hkv * (double)(c->s.Dk + c->s.Dv) * (double)kv_bytes;
}

static double op_flops(const bcase *c, int backward)
{
    const double d = backward ? 3.0 * (double)c->s.Dk + 2.0 * (double)c->s.Dv
                              : (double)(c->s.Dk + c->s.Dv);
    return 2.0 * allowed_pairs(c) * d;
}

/* Bytes of the inputs and outputs the sdpa pass allocates. */
static double footprint(const bcase *c)
{
    const shape *s = &c->s;
    const double q = (double)(s->B * s->Hq * s->Tq), kv = (double)(s->B * s->Hkv * s->Tk);
    return 4.0 * (2.0 * q * (double)s->Dk + 2.0 * kv * (double)(s->Dk + s->Dv) +
                  3.0 * q * (double)s->Dv + q);
}

static int is_decode(const bcase *c)
{
    return c->s.Tq <= DECODE_MAX_TQ;
}

static const bcase default_cases[] = {
    {{1, 8, 8, 512, 512, 64, 64}, MASK_NONE, 0},
    {{1, 8, 8, 512, 512, 64, 64}, MASK_CAUSAL, 0},
    {{1, 8, 8, 2048, 2048, 128, 128}, MASK_CAUSAL, 0},
    {{1, 32, 8, 1, 4096, 128, 128}, MASK_NONE, 0},
    {{8, 12, 12, 128, 128, 64, 64}, MASK_PADDING, 0}, /* and, without --mask, every padding form */
};
static const bcase quick_cases[] = {
    {{1, 4, 4, 256, 256, 64, 64}, MASK_NONE, 0},
    {{1, 4, 4, 256, 256, 64, 64}, MASK_CAUSAL, 0},
    {{1, 4, 4, 512, 512, 128, 128}, MASK_CAUSAL, 0},
    {{1, 32, 8, 1, 1024, 128, 128}, MASK_NONE, 0},
    {{4, 4, 4, 128, 128, 64, 64}, MASK_PADDING, 0}, /* and, without --mask, every padding form */
};

/* ------------------------------------------------------------ attention variants */

typedef struct variant {
    float softcap; /* 0: off */
    int alibi, sinks;
    char name[48]; /* "plain", "softcap", "alibi", "sinks", "softcap+alibi+sinks" */
} variant;

static const variant plain_variant = {0.0f, 0, 0, "plain"};

/* ------------------------------------------------------------ options */

typedef struct options {
    int all_isas;
    sdpa_isa isas[SDPA_ISA_COUNT];
    int n_isas;
    int threads[MAX_LIST];
    int n_threads;
    shape shapes[MAX_LIST];
    int n_shapes;
    int mask_given[MASK_COUNT];
    int n_masks;
    int fwd, bwd;
    int reps, warmup;
    double max_time;
    int json, naive, quick, limits, limits_only;
    int bw_mib;
    bcase cases[MAX_CASES];
    int n_cases;
    int any_forms;     /* some case times padding forms: rows (table) get a /kv_lengths column */
    float softcap;     /* --softcap C (0: off) */
    int alibi, sinks;  /* --alibi, --sinks */
    variant variants[MAX_VARIANTS];
    int n_variants;    /* 0: no variant option given */
    int serve;         /* --serve: the continuous-batching step instead of the shapes */
    int huge_pages;    /* --huge-pages: --serve's K/V and the bandwidth buffer madvise(MADV_HUGEPAGE) */
    int bw_il;         /* --bw-interleaved: decode rows also time the bandwidth read beside them */
    sdpa_dtype dtypes[N_DTYPES]; /* --dtype: the types timed, in the order given (default fp32) */
    int n_dtypes;
    int show_dtype;    /* a type other than fp32 is timed: the table gets a dtype column */
} options;

static void print_help(void)
{
    printf(
        "usage: sdpa bench [options]\n"
        "\n"
        "Times sdpa_forward / sdpa_backward per ISA, thread count, shape and mask (median of\n"
        "--reps runs after a warm-up), next to this CPU's measured fp32 FMA peak and memory\n"
        "bandwidth and to the naive OpenBLAS way (materialise S = Q K^T, softmax, P V).\n"
        "\n"
        "options:\n"
        "  --isa NAME[,NAME..]|all   ISAs to time (default all the CPU supports; scalar first; amx\n"
        "                            only in bf16 rows, where it differs from avx512)\n"
        "  --threads N[,N..]         OpenMP thread counts (default 1 and the OpenMP maximum)\n"
        "  --shape B,Hq,Hkv,Tq,Tk,Dk,Dv  a problem shape (repeatable; replaces the defaults)\n"
        "  --mask M[,M..]            mask(s) for every shape (repeatable; default: none for --shape,\n"
        "                            the defaults' own): none, causal, causal-bottom-right, padding\n"
        "                            (key padding as kv_lengths: lengths Tk/2 .. Tk over the batch), or\n"
        "                            the same key padding as a mask: padding-bool (uint8 (B,1,1,Tk),\n"
        "                            head and query strides 0), padding-bool-4d (uint8 (B,1,Tq,Tk)),\n"
        "                            padding-bias (0/-inf fp32 bias (B,1,1,Tk)), padding-bias-4d.\n"
        "                            Each of these four is timed interleaved with padding (kv_lengths,\n"
        "                            whose rows are printed too) on the same shape, ISA, threads and\n"
        "                            type: its row has ratio_vs_kv_lengths (ms / kv_lengths ms of\n"
        "                            the same run); no attention variant is applied to them\n"
        "  --op forward|backward|both  passes to time (default both)\n"
        "  --reps N                  timed runs per row (default 5, --quick 3); rows whose\n"
        "                            warm-up exceeds --max-time / N get fewer (at least 1)\n"
        "  --warmup N                untimed runs first (default 1; the OpenMP threads are started\n"
        "                            before the first row whatever N)\n"
        "  --max-time S              seconds of timed runs per row, about (default 5, --quick 1)\n"
        "  --json                    JSON lines on stdout; header and table go to stderr\n"
        "  --naive / --no-naive      the naive OpenBLAS comparison (default on when OpenBLAS loads;\n"
        "                            skipped for shapes whose S would exceed 1 GiB)\n"
        "  --quick                   small shapes, fewer runs, short limit measurements\n"
        "  --no-limits               do not measure the FMA peak and bandwidth\n"
        "  --limits-only             only measure and print them (the header)\n"
        "  --bw-mib N                bandwidth buffer in MiB (default 256; keep it >> the LLC)\n"
        "  --dtype T[,T..]           storage types to time, each of fp32, bf16, fp16 (default fp32): every\n"
        "                            shape runs once per type with Q, K, V and O (dO, dQ, dK, dV) in it\n"
        "                            (LSE fp32); every JSON row has \"dtype\" (naive and --serve rows:\n"
        "                            \"fp32\"). A backward libsdpa refuses for a 16-bit type\n"
        "                            (SDPA_ERR_UNSUPPORTED) is skipped: a '# ... skipped' line in the\n"
        "                            table, no row, exit status unaffected\n"
        "  --softcap C               also time logit soft-capping with cap C (0: off)\n"
        "  --alibi                   also time ALiBi (slopes 2^(-8(h+1)/Hq))\n"
        "  --sinks                   also time attention sinks (0.5 per head; backward writes dsinks)\n"
        "  --serve                   instead of the shapes: one continuous-batching step (32 decode\n"
        "                            rows at contexts 256..8192 and two 512-token prefill chunks over\n"
        "                            2048 cached keys, Hq 32, Hkv 8, D 128, 16-key pages, shuffled):\n"
        "                            paged, the same on contiguous packed K/V, and gather-pages-then-\n"
        "                            dense per sequence; tokens/s, GB/s of K/V, %% of read bandwidth\n"
        "                            (the header's, measured before; the decode rows also time the\n"
        "                            bandwidth test's read interleaved with them: pct_bw_interleaved)\n"
        "  --bw-interleaved          decode rows (Tq <= 16) also time the bandwidth test's read of a\n"
        "                            --bw-mib buffer, flushed from the caches as the rows' K/V are,\n"
        "                            interleaved with them run by run: JSON bw_interleaved_gbps and\n"
        "                            pct_bw_interleaved, a '# read bandwidth ...' line in the table;\n"
        "                            the buffer then counts in the rows' rss_mb\n"
        "  --huge-pages              with --serve: allocate the K/V caches, their packed copy and the\n"
        "                            bandwidth buffer 2 MiB-aligned with madvise(MADV_HUGEPAGE), as a\n"
        "                            server that follows the README's advice does (Linux transparent\n"
        "                            huge pages in madvise or always mode); the header says how much\n"
        "                            was mapped in huge pages; --serve JSON rows have \"huge_pages\"\n"
        "                            Each variant given is timed alone (all together too when\n"
        "                            several are given), interleaved with the plain kernel on\n"
        "                            the same shape, ISA and threads: its row has ratio_vs_plain\n"
        "                            (variant ms / plain ms of the same run)\n"
        "\n"
        "default shapes: 1,8,8,512,512,64,64 (none and causal), 1,8,8,2048,2048,128,128 causal,\n"
        "decode 1,32,8,1,4096,128,128, 8,12,12,128,128,64,64 with key padding (kv lengths from\n"
        "Tk/2 to Tk) in all five forms (padding and the four mask forms; --quick: its\n"
        "4,4,4,128,128,64,64 likewise). FLOPs: forward 2P(Dk+Dv), backward 2P(3Dk+2Dv),\n"
        "P = allowed pairs.\n");
}

static int usage(const char *fmt, const char *arg)
{
    fputs("sdpa bench: error: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nusage: sdpa bench [options]\n(see 'sdpa bench --help')\n", stderr);
    return 2;
}

/* Parses "a,b,c" into at most max non-negative integers. Returns the count, or -1. */
static int parse_int_list(const char *s, int64_t *out, int max)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9') /* digits only: no sign, space or empty item (strtoll takes those) */
            return -1;
        const long long v = strtoll(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || n == max)
            return -1;
        out[n++] = (int64_t)v;
        if (*end == '\0')
            return n;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
}

static int parse_mask(const char *name, bench_mask *m)
{
    for (int i = 0; i < MASK_COUNT; i++)
        if (strcmp(name, mask_names[i]) == 0) {
            *m = (bench_mask)i;
            return 0;
        }
    return -1;
}

/* 1 if a comma list has an empty item (a leading, trailing or doubled comma), which
 * strtok would skip. */
static int list_has_empty_item(const char *list)
{
    const size_t n = strlen(list);
    return n == 0 || list[0] == ',' || list[n - 1] == ',' || strstr(list, ",,") != NULL;
}

static int parse_masks(const char *list, options *o)
{
    char buf[256];
    if (strlen(list) >= sizeof buf || list_has_empty_item(list))
        return -1;
    strcpy(buf, list);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        bench_mask m;
        if (parse_mask(tok, &m) != 0)
            return -1;
        if (!o->mask_given[m])
            o->n_masks++;
        o->mask_given[m] = 1;
    }
    return 0;
}

static int parse_isas(const char *list, options *o)
{
    char buf[256];
    if (strcmp(list, "all") == 0) {
        o->all_isas = 1;
        return 0;
    }
    if (strlen(list) >= sizeof buf)
        return usage("--isa '%s': too long", list);
    if (list_has_empty_item(list))
        return usage("--isa '%s': an empty name in the list", list);
    strcpy(buf, list);
    o->all_isas = 0;
    o->n_isas = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        sdpa_isa isa;
        if (strcmp(tok, "all") == 0)
            return usage("--isa '%s': 'all' stands alone (every supported ISA), not in a list", list);
        if (sdpa_isa_from_name(tok, &isa) != 0)
            return usage("--isa '%s': expected scalar, avx2, avx512, amx, neon, auto or all", tok);
        if (isa == SDPA_ISA_AUTO)
            isa = sdpa_isa_active();
        if (!sdpa_isa_supported(isa))
            return usage("--isa '%s': not compiled in or not supported by this CPU", tok);
        int dup = 0;
        for (int i = 0; i < o->n_isas; i++)
            dup |= o->isas[i] == isa;
        if (!dup)
            o->isas[o->n_isas++] = isa;
    }
    if (o->n_isas == 0)
        return usage("--isa '%s': no ISA named", list);
    /* scalar first (the speed-up reference), then in enum order */
    for (int i = 1; i < o->n_isas; i++)
        for (int j = i; j > 0 && o->isas[j] < o->isas[j - 1]; j--) {
            const sdpa_isa t = o->isas[j];
            o->isas[j] = o->isas[j - 1];
            o->isas[j - 1] = t;
        }
    return 0;
}

/* --dtype fp32,bf16,fp16: each type once, in the order given. */
static int parse_dtypes(const char *list, options *o)
{
    char buf[64];
    if (strlen(list) >= sizeof buf || list_has_empty_item(list))
        return usage("--dtype '%s': expected fp32, bf16 or fp16, or a comma list of them", list);
    strcpy(buf, list);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int dt = -1;
        for (int i = 0; i < N_DTYPES; i++)
            if (strcmp(tok, dtype_names[i]) == 0)
                dt = i;
        if (dt < 0)
            return usage("--dtype '%s': expected fp32, bf16 or fp16, or a comma list of them", tok);
        int dup = 0;
        for (int i = 0; i < o->n_dtypes; i++)
            dup |= o->dtypes[i] == (sdpa_dtype)dt;
        if (!dup)
            o->dtypes[o->n_dtypes++] = (sdpa_dtype)dt;
    }
    if (o->n_dtypes == 0)
        return usage("--dtype '%s': no type named (expected fp32, bf16 or fp16)", list);
    return 0;
}

static int max_threads(void)
{
#if HAVE_OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int same_case(const bcase *a, const bcase *b)
{
    return a->mask == b->mask && memcmp(&a->s, &b->s, sizeof a->s) == 0;
}

/* A padding form m joins the shape's MASK_PADDING case (added if need be): it
 * is timed with, and compared with, that kv_lengths problem. */
static int add_case(options *o, const shape *s, bench_mask m)
{
    const unsigned forms = is_padding_form(m) ? 1u << (m - FIRST_FORM) : 0u;
    const bcase c = {*s, forms ? MASK_PADDING : m, forms};
    for (int i = 0; i < o->n_cases; i++)
        if (same_case(&o->cases[i], &c)) {
            o->cases[i].forms |= forms;
            return 0;
        }
    if (o->n_cases == MAX_CASES)
        return -1;
    o->cases[o->n_cases++] = c;
    return 0;
}

static int build_cases(options *o)
{
    const bcase *defs = o->quick ? quick_cases : default_cases;
    const int n_defs = (int)(o->quick ? sizeof quick_cases / sizeof quick_cases[0]
                                      : sizeof default_cases / sizeof default_cases[0]);
    o->n_cases = 0;
    if (o->n_shapes > 0) {
        for (int i = 0; i < o->n_shapes; i++)
            for (int m = 0; m < MASK_COUNT; m++)
                if ((o->n_masks == 0 && m == MASK_NONE) || o->mask_given[m])
                    if (add_case(o, &o->shapes[i], (bench_mask)m) != 0)
                        return -1;
    } else {
        for (int i = 0; i < n_defs; i++)
            for (int m = 0; m < MASK_COUNT; m++) {
                /* without --mask: the shape's own mask, and for key padding every form of it */
                const int own = m == (int)defs[i].mask || (defs[i].mask == MASK_PADDING && is_padding_form(m));
                if ((o->n_masks == 0 && own) || o->mask_given[m])
                    if (add_case(o, &defs[i].s, (bench_mask)m) != 0)
                        return -1;
            }
    }
    o->any_forms = 0;
    for (int i = 0; i < o->n_cases; i++)
        o->any_forms |= o->cases[i].forms != 0;
    /* stable sort by footprint: the big shapes last (rss_mb is a high-water mark) */
    for (int i = 1; i < o->n_cases; i++)
        for (int j = i; j > 0 && footprint(&o->cases[j]) < footprint(&o->cases[j - 1]); j--) {
            const bcase t = o->cases[j];
            o->cases[j] = o->cases[j - 1];
            o->cases[j - 1] = t;
        }
    return 0;
}

/* Each variant given alone, then all of them together when more than one is given. */
static void build_variants(options *o)
{
    const int given = (o->softcap != 0.0f) + o->alibi + o->sinks;
    variant all = {o->softcap, o->alibi, o->sinks, ""};
    o->n_variants = 0;
    if (o->softcap != 0.0f)
        o->variants[o->n_variants++] = (variant){o->softcap, 0, 0, "softcap"};
    if (o->alibi)
        o->variants[o->n_variants++] = (variant){0.0f, 1, 0, "alibi"};
    if (o->sinks)
        o->variants[o->n_variants++] = (variant){0.0f, 0, 1, "sinks"};
    if (given > 1) {
        snprintf(all.name, sizeof all.name, "%s%s%s%s%s", o->softcap != 0.0f ? "softcap" : "",
                 o->softcap != 0.0f && (o->alibi || o->sinks) ? "+" : "", o->alibi ? "alibi" : "",
                 o->alibi && o->sinks ? "+" : "", o->sinks ? "sinks" : "");
        o->variants[o->n_variants++] = all;
    }
}

static int parse_options(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->all_isas = 1;
    o->fwd = o->bwd = 1;
    o->reps = -1;
    o->warmup = 1;
    o->max_time = -1.0;
    o->naive = -1;
    o->limits = 1;
    o->bw_mib = 256;
    unsigned seen = 0; /* the value options given, by their index in valued[] */
    int naive_seen = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        char name[64];
        const char *val = NULL;
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0)
            return usage("unexpected argument '%s'", arg);
        if (eq) {
            if ((size_t)(eq - arg) >= sizeof name)
                return usage("unknown option '%s'", arg);
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            val = eq + 1;
        } else {
            if (strlen(arg) >= sizeof name)
                return usage("unknown option '%s'", arg);
            strcpy(name, arg);
        }
        static const char *const flags[] = {"--help", "--json", "--naive", "--no-naive", "--quick",
                                            "--no-limits", "--limits-only", "--alibi", "--sinks", "--serve",
                                            "--huge-pages", "--bw-interleaved"};
        static const char *const valued[] = {"--isa", "--threads", "--shape", "--mask", "--op",
                                             "--reps", "--warmup", "--bw-mib", "--max-time", "--softcap",
                                             "--dtype"};
        int is_flag = 0, is_valued = 0;
        for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++)
            is_flag |= strcmp(name, flags[f]) == 0;
        for (size_t f = 0; f < sizeof valued / sizeof valued[0]; f++)
            is_valued |= strcmp(name, valued[f]) == 0;
        if (!is_flag && !is_valued)
            return usage("unknown option '%s' for 'sdpa bench'", name);
        if (is_flag && val)
            return usage("option '%s' takes no value", name);
        if (!is_flag && !val) {
            if (i + 1 >= argc)
                return usage("option '%s' needs a value", name);
            val = argv[++i];
        }
        /* a value option given twice would replace the first silently: refused (a list
           goes in one value: --isa a,b; --shape and --mask add up) */
        if (is_valued && strcmp(name, "--shape") != 0 && strcmp(name, "--mask") != 0) {
            size_t f = 0;
            while (strcmp(name, valued[f]) != 0)
                f++;
            if (seen & (1u << f))
                return usage("option '%s' given twice (give one value; lists are comma-separated)", name);
            seen |= 1u << f;
        }
        if (strcmp(name, "--naive") == 0 || strcmp(name, "--no-naive") == 0) {
            if (naive_seen && o->naive != (strcmp(name, "--naive") == 0))
                return usage("%s", "--naive and --no-naive contradict each other");
            naive_seen = 1;
        }
        if (strcmp(name, "--help") == 0) {
            print_help();
            return 1;
        } else if (strcmp(name, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(name, "--naive") == 0) {
            o->naive = 1;
        } else if (strcmp(name, "--no-naive") == 0) {
            o->naive = 0;
        } else if (strcmp(name, "--quick") == 0) {
            o->quick = 1;
        } else if (strcmp(name, "--no-limits") == 0) {
            o->limits = 0;
        } else if (strcmp(name, "--limits-only") == 0) {
            o->limits_only = 1;
        } else if (strcmp(name, "--alibi") == 0) {
            o->alibi = 1;
        } else if (strcmp(name, "--sinks") == 0) {
            o->sinks = 1;
        } else if (strcmp(name, "--serve") == 0) {
            o->serve = 1;
        } else if (strcmp(name, "--huge-pages") == 0) {
            o->huge_pages = 1;
        } else if (strcmp(name, "--bw-interleaved") == 0) {
            o->bw_il = 1;
        } else if (strcmp(name, "--softcap") == 0) {
            char *end;
            errno = 0;
            const float v = strtof(val, &end);
            if (end == val || *end != '\0' || !isfinite(v) || v < 0.0f ||
                (errno == ERANGE && (fabsf(v) == HUGE_VALF || v == 0.0f)))
                return usage("--softcap '%s': expected a finite number C > 0 (or 0: off)", val);
            o->softcap = v == 0.0f ? 0.0f : v;
        } else if (strcmp(name, "--dtype") == 0) {
            const int rc = parse_dtypes(val, o);
            if (rc != 0)
                return rc;
        } else if (strcmp(name, "--isa") == 0) {
            const int rc = parse_isas(val, o);
            if (rc != 0)
                return rc;
        } else if (strcmp(name, "--threads") == 0) {
            int64_t t[MAX_LIST];
            const int n = parse_int_list(val, t, MAX_LIST);
            if (n <= 0)
                return usage("--threads '%s': expected N or N,N,... (at most 32 of them) with 1 <= N <= 4096",
                             val);
            o->n_threads = 0;
            for (int k = 0; k < n; k++) {
                if (t[k] < 1 || t[k] > 4096)
                    return usage("--threads '%s': expected N or N,N,... with 1 <= N <= 4096", val);
                int dup = 0;
                for (int j = 0; j < o->n_threads; j++)
                    dup |= o->threads[j] == (int)t[k];
                if (!dup)
                    o->threads[o->n_threads++] = (int)t[k];
            }
        } else if (strcmp(name, "--shape") == 0) {
            int64_t d[7];
            if (parse_int_list(val, d, 7) != 7)
                return usage("--shape '%s': expected B,Hq,Hkv,Tq,Tk,Dk,Dv (7 integers)", val);
            const shape s = {d[0], d[1], d[2], d[3], d[4], d[5], d[6]};
            if (s.B < 1 || s.Hq < 1 || s.Hkv < 1 || s.Tq < 1 || s.Tk < 1 || s.Dk < 1 || s.Dv < 1)
                return usage("--shape '%s': every size must be >= 1", val);
            if (s.Hq % s.Hkv != 0)
                return usage("--shape '%s': Hq must be a multiple of Hkv", val);
            /* every buffer's element count (Q, O, K, V, a (B, 1, Tq, Tk) mask) must fit
             * int64 with room for its bytes; the allocation then fails or succeeds cleanly */
            int64_t nq, nkv, nm;
            const int64_t dmax = s.Dk > s.Dv ? s.Dk : s.Dv;
            if (s.Tk > INT32_MAX || s.Dk > 65536 || s.Dv > 65536 || __builtin_mul_overflow(s.B, s.Hq, &nq) ||
                __builtin_mul_overflow(nq, s.Tq, &nq) || __builtin_mul_overflow(nq, dmax, &nq) ||
                __builtin_mul_overflow(s.B, s.Hkv, &nkv) || __builtin_mul_overflow(nkv, s.Tk, &nkv) ||
                __builtin_mul_overflow(nkv, dmax, &nkv) || __builtin_mul_overflow(s.B, s.Tq, &nm) ||
                __builtin_mul_overflow(nm, s.Tk, &nm) || nq > INT64_MAX / 16 || nkv > INT64_MAX / 16 ||
                nm > INT64_MAX / 16)
                return usage("--shape '%s': too large", val);
            if (o->n_shapes == MAX_LIST)
                return usage("too many --shape options (at most %s)", "32");
            o->shapes[o->n_shapes++] = s;
        } else if (strcmp(name, "--mask") == 0) {
            if (parse_masks(val, o) != 0)
                return usage("--mask '%s': expected none, causal, causal-bottom-right, padding, padding-bool, "
                             "padding-bool-4d, padding-bias or padding-bias-4d", val);
        } else if (strcmp(name, "--op") == 0) {
            if (strcmp(val, "forward") == 0)
                o->fwd = 1, o->bwd = 0;
            else if (strcmp(val, "backward") == 0)
                o->fwd = 0, o->bwd = 1;
            else if (strcmp(val, "both") == 0)
                o->fwd = o->bwd = 1;
            else
                return usage("--op '%s': expected forward, backward or both", val);
        } else if (strcmp(name, "--reps") == 0 || strcmp(name, "--warmup") == 0 ||
                   strcmp(name, "--bw-mib") == 0) {
            int64_t v;
            const int lo = strcmp(name, "--warmup") == 0 ? 0 : 1;
            const int64_t hi = strcmp(name, "--bw-mib") == 0 ? 65536 : MAX_REPS;
            if (parse_int_list(val, &v, 1) != 1 || v < lo || v > hi)
                return usage(strcmp(name, "--bw-mib") == 0 ? "--bw-mib '%s': expected 1..65536"
                             : lo ? "--reps '%s': expected 1..1000"
                                  : "--warmup '%s': expected 0..1000",
                             val);
            if (strcmp(name, "--reps") == 0)
                o->reps = (int)v;
            else if (strcmp(name, "--warmup") == 0)
                o->warmup = (int)v;
            else
                o->bw_mib = (int)v;
        } else if (strcmp(name, "--max-time") == 0) {
            char *end;
            const double v = strtod(val, &end);
            /* a decimal number: no space, sign, hex or inf/nan spelling (strtod takes those) */
            if (end == val || *end != '\0' || !(v > 0.0) || v > 1e6 || strspn(val, "0123456789.eE-") != strlen(val) ||
                !(val[0] == '.' || (val[0] >= '0' && val[0] <= '9')))
                return usage("--max-time '%s': expected a positive number of seconds", val);
            o->max_time = v;
        } else {
            return usage("unknown option '%s' for 'sdpa bench'", name);
        }
    }
    if (o->serve && (o->n_shapes || o->n_masks || o->softcap != 0.0f || o->alibi || o->sinks || !o->fwd))
        return usage("--serve times its own step (forward, no variants): %s", "drop --shape, --mask, "
                                                                            "--op backward, --softcap, --alibi and --sinks");
    if (o->huge_pages && !o->serve)
        return usage("--huge-pages applies to %s only", "--serve");
    if (o->limits_only && (!o->limits || o->json))
        return usage("--limits-only prints the limits as '#' lines: %s",
                     !o->limits ? "it contradicts --no-limits" : "--json has no rows to print with it");
    if (o->serve && (o->naive == 1 || o->bw_il))
        return usage("--serve has no %s (its step against its gather-then-dense way, nothing else)",
                     o->naive == 1 ? "naive-blas rows" : "--bw-interleaved rows");
    if (o->serve && !o->all_isas && o->n_isas > 1)
        return usage("--serve times one ISA: give one --isa (without --isa: the best of this CPU)%s", "");
    if (o->n_dtypes == 0)
        o->dtypes[o->n_dtypes++] = SDPA_DTYPE_F32;
    o->show_dtype = o->n_dtypes > 1 || o->dtypes[0] != SDPA_DTYPE_F32;
    if (o->serve && o->show_dtype)
        return usage("--serve times its fp32 step only: %s", "drop --dtype (or give --dtype fp32)");
    if (o->serve)
        o->naive = 0;
    if (o->reps < 0)
        o->reps = o->quick ? 3 : 5;
    if (o->max_time < 0.0)
        o->max_time = o->quick ? 1.0 : 5.0;
    if (o->all_isas) {
        o->n_isas = 0;
        for (int i = 0; i < SDPA_ISA_COUNT; i++)
            if (sdpa_isa_supported((sdpa_isa)i))
                o->isas[o->n_isas++] = (sdpa_isa)i;
    }
    if (o->serve && o->n_isas > 1) { /* --serve times the best ISA asked for */
        o->isas[0] = o->isas[o->n_isas - 1];
        o->n_isas = 1;
    }
    if (o->n_threads == 0) {
        o->threads[o->n_threads++] = 1;
        if (max_threads() > 1)
            o->threads[o->n_threads++] = max_threads();
    }
#if !HAVE_OPENMP
    for (int i = 0; i < o->n_threads; i++)
        if (o->threads[i] != 1)
            return usage("--threads: this build has no OpenMP; only %s thread is possible", "1");
#endif
#ifndef SDPA_BENCH_HAVE_OPENBLAS
    if (o->naive == 1)
        fputs("sdpa bench: note: built without OpenBLAS; no naive-blas rows\n", stderr);
    o->naive = 0;
#else
    if (o->naive != 0) {
        char why[600];
        o->naive = bench_blas_load(&blas, why, sizeof why) == 0;
        if (!o->naive)
            fprintf(stderr, "sdpa bench: note: %s; no naive-blas rows (Debian: apt install "
                            "libopenblas0-openmp)\n", why);
    }
#endif
    if (build_cases(o) != 0)
        return usage("too many shape and mask combinations (at most %s)", "128");
    build_variants(o);
    return 0;
}

/* ------------------------------------------------------------ utilities */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The process's peak resident set size so far, in MiB. */
static double peak_rss_mb(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1.0;
#ifdef __APPLE__
    return (double)ru.ru_maxrss / (1024.0 * 1024.0); /* bytes */
#else
    return (double)ru.ru_maxrss / 1024.0; /* KiB */
#endif
}

/* n elements of elem bytes each, 64-byte aligned (at least one element). */
static void *alloc_elems(int64_t n, size_t elem)
{
    if (n <= 0)
        n = 1;
    if ((uint64_t)n > (SIZE_MAX - 64) / elem)
        return NULL;
    size_t bytes = (size_t)n * elem;
    bytes = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes);
}

static float *alloc_floats(int64_t n)
{
    return alloc_elems(n, sizeof(float));
}

/* bytes, 64-byte aligned; with huge (--huge-pages) 2 MiB-aligned and rounded up,
 * marked madvise(MADV_HUGEPAGE) before anything touches it. A refused madvise
 * (transparent huge pages "never", not Linux) leaves ordinary pages: the caller
 * reports anon_huge_mib(), what the kernel really mapped. */
static void *alloc_big(size_t bytes, int huge)
{
#ifdef MADV_HUGEPAGE
    if (huge) {
        const size_t align = (size_t)2 << 20;
        if (bytes > SIZE_MAX - align)
            return NULL;
        bytes = (bytes + align - 1) & ~(align - 1);
        void *p = aligned_alloc(align, bytes);
        if (p)
            (void)madvise(p, bytes, MADV_HUGEPAGE);
        return p;
    }
#else
    (void)huge;
#endif
    if (bytes > SIZE_MAX - 64)
        return NULL;
    return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

/* MiB of this process's anonymous memory mapped in transparent huge pages
 * (/proc/self/smaps_rollup AnonHugePages); -1 where the file is not there. */
static double anon_huge_mib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f)
        return -1.0;
    char line[256];
    double kb = -1.0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %lf kB", &kb) == 1)
            break;
    fclose(f);
    return kb < 0.0 ? -1.0 : kb / 1024.0;
}

/* Deterministic uniform values in [-1, 1), stored as dt (rounded to nearest
 * even for bf16 / fp16: the same values in every type, up to that rounding). */
static void fill_random_as(void *x, int64_t n, uint64_t seed, sdpa_dtype dt)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const float v = (float)((double)(s >> 40) / (double)(1 << 23) - 1.0);
        if (dt == SDPA_DTYPE_F32)
            ((float *)x)[i] = v;
        else
            ((uint16_t *)x)[i] = dt == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(v) : sdpa_f32_to_f16(v);
    }
}

static void fill_random(float *x, int64_t n, uint64_t seed)
{
    fill_random_as(x, n, seed, SDPA_DTYPE_F32);
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef int (*run_fn)(void *ctx);

typedef struct timing {
    double median_s;
    int reps;
} timing;

/* The buffers of one row, to evict from the caches before each timed run. */
typedef struct evict_list {
    const void *p[12];
    size_t bytes[12];
    int n;
} evict_list;

static void evict_add(evict_list *e, const void *p, int64_t n, size_t elem)
{
    if (p && n > 0 && e->n < 12) {
        e->p[e->n] = p;
        e->bytes[e->n] = (size_t)n * elem;
        e->n++;
    }
}

/* Evicts a row's buffers from every cache level, untimed: clflush (x86) or
 * dc civac (aarch64) on each of their lines, so that the timed run reads them
 * from memory and the caches hold no dirty line of them; elsewhere, a read of
 * 256 MiB. Decode-like rows (their GB/s is compared with the memory read
 * bandwidth) call it before every run: K and V of the default decode shape
 * (33.5 MB) are about the size of a large L3, and evicting them by writing or
 * reading another buffer leaves part of them cached (the L3 keeps lines that
 * are reused) and, for a write, dirty lines to write back during the run. */
static void flush_caches(const evict_list *e)
{
#ifdef CACHE_FLUSH_LINE
    cache_flush_lines(e->n, e->p, e->bytes);
#else
    (void)e;
    enum { BYTES = 256 << 20 };
    static unsigned char *buf;
    static volatile unsigned sink;
    if (!buf) {
        if (!(buf = malloc(BYTES)))
            return; /* no eviction without memory: the row is then cache-warm */
        memset(buf, 1, BYTES);
    }
    unsigned x = 0;
    for (size_t i = 0; i < BYTES; i += 64)
        x += buf[i];
    sink = x;
#endif
}

/* Warm-up, then the median of up to o->reps timed runs (fewer when one run is
 * long: about o->max_time seconds per row, at least one run). When the last
 * warm-up run alone exceeds o->max_time it is the measurement (reps = 1): at
 * that length cold-start effects are negligible and the row costs half.
 * n problems (fns[i], ctxs[i]) are timed together, their runs interleaved
 * (0, 1, ..., n-1, 0, 1, ...: the plain kernel, its variants and the padding
 * forms of a kv_lengths problem see the same load), each its own row with its
 * own budget; n = 1 is one row on its own (n <= MAX_TIMED).
 * evicts[i]: buffers to evict from the caches before each timed run of problem
 * i (decode-like rows), or NULL. */
static int time_interleaved(int n, const run_fn *fns, void *const *ctxs, const options *o,
                            const evict_list *const *evicts, timing *t, int *failed_index)
{
    double last[MAX_TIMED] = {0}, longest = 0.0;
    for (int w = 0; w < o->warmup; w++)
        for (int k = 0; k < n; k++) {
            const double t0 = now_s();
            if (fns[k](ctxs[k]) != 0) {
                *failed_index = k;
                return -1;
            }
            last[k] = now_s() - t0;
        }
    for (int k = 0; k < n; k++)
        longest = last[k] > longest ? last[k] : longest;
    if (o->warmup > 0 && longest > o->max_time) {
        /* one run already takes longer than the row's budget: it is the measurement */
        for (int k = 0; k < n; k++) {
            t[k].median_s = last[k];
            t[k].reps = 1;
        }
        return 0;
    }
    int reps = o->reps;
    if (o->warmup > 0 && longest * reps > o->max_time)
        reps = longest > 0.0 ? (int)(o->max_time / longest) : reps;
    if (reps < 1)
        reps = 1;
    static double times[MAX_TIMED][MAX_REPS];
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < n; k++) {
            if (evicts && evicts[k])
                flush_caches(evicts[k]);
            const double t0 = now_s();
            if (fns[k](ctxs[k]) != 0) {
                *failed_index = k;
                return -1;
            }
            times[k][r] = now_s() - t0;
        }
    for (int k = 0; k < n; k++) {
        qsort(times[k], (size_t)reps, sizeof times[k][0], cmp_double);
        t[k].median_s = reps % 2 ? times[k][reps / 2] : 0.5 * (times[k][reps / 2 - 1] + times[k][reps / 2]);
        t[k].reps = reps;
    }
    return 0;
}

/* One problem on its own (see time_interleaved). */
static int time_runs(run_fn fn, void *ctx, const options *o, const evict_list *evict, timing *t)
{
    int failed = 0;
    return time_interleaved(1, &fn, &ctx, o, &evict, t, &failed);
}

/* ------------------------------------------------------------ limits */

typedef struct limits {
    int measured;
    double peak[SDPA_ISA_COUNT][MAX_LIST]; /* GFLOP/s per ISA and thread-count index */
    double bw[MAX_LIST];                   /* GB/s per thread-count index */
    double bw_mib;
    double bw_huge_mib;                    /* --huge-pages: of the buffer, MiB in huge pages */
} limits;

typedef double (*peak_fn)(int64_t iters, float seed, float *sink);
static double row_peak(const limits *L, sdpa_isa isa, sdpa_dtype dt, int backward, int decode, int ti);

static peak_fn peak_function(sdpa_isa isa)
{
    switch (isa) {
    case SDPA_ISA_SCALAR: return sdpa_bench_peak_scalar;
#ifdef SDPA_BENCH_PEAK_AVX2
    case SDPA_ISA_AVX2: return sdpa_bench_peak_avx2;
#endif
#ifdef SDPA_BENCH_PEAK_AVX512
    case SDPA_ISA_AVX512: return sdpa_bench_peak_avx512;
#endif
#ifdef SDPA_BENCH_PEAK_NEON
    case SDPA_ISA_NEON: return sdpa_bench_peak_neon;
#endif
#ifdef SDPA_BENCH_PEAK_AMX
    case SDPA_ISA_AMX: return sdpa_bench_peak_amx; /* bf16 tile products, not fp32 FMA */
#endif
    default: return NULL;
    }
}

static volatile float peak_sink;

/* Best GFLOP/s of `tries` runs of about target_s seconds on nt threads, each thread running the loop. */
static double measure_peak(peak_fn fn, int nt, double target_s, int tries)
{
    float sink = 0.0f;
    int64_t iters = 1024;
    double t = 0.0;
    for (;;) { /* calibrate on one thread */
        const double t0 = now_s();
        fn(iters, 1.0f, &sink);
        t = now_s() - t0;
        if (t >= 0.001 || iters > ((int64_t)1 << 40))
            break;
        iters *= 4;
    }
    for (int r = 0; r < 3; r++) { /* the fastest of a few: a preempted run would shrink the window */
        const double t0 = now_s();
        fn(iters, 1.0f, &sink);
        const double dt = now_s() - t0;
        t = dt < t ? dt : t;
    }
    iters = (int64_t)((double)iters * target_s / (t > 0.0 ? t : 1e-9)) + 1;
    double best = 0.0;
    for (int r = 0; r < tries; r++) {
        double flops = 0.0;
        const double t0 = now_s();
        OMP(omp parallel num_threads(nt) reduction(+ : flops))
        {
            float s = 0.0f;
            flops += fn(iters, 1.0f + 1e-3f * (float)r, &s);
            if (s == 12345.0f)
                peak_sink = s;
        }
        const double dt = now_s() - t0;
        const double g = flops / dt * 1e-9;
        best = g > best ? g : best;
    }
    peak_sink = sink;
    return best;
}

/* Best GB/s of reading the buffer on nt threads. */
/* One read of the n words of buf on nt threads (the bandwidth test's loop). */
static uint64_t read_all(const uint64_t *buf, int64_t n, int nt)
{
    uint64_t s = 0;
    OMP(omp parallel for num_threads(nt) schedule(static) reduction(+ : s))
    for (int64_t i = 0; i < n; i++)
        s += buf[i];
#if !HAVE_OPENMP
    (void)nt;
#endif
    return s;
}

/* The bandwidth test's read, timed as one more problem beside decode rows
 * (--bw-interleaved, and always beside --serve's decode rows). */
typedef struct read_ctx {
    const uint64_t *buf;
    int64_t n;
    int threads;
    uint64_t sum;
} read_ctx;

static int run_read(void *p)
{
    read_ctx *x = p;
    x->sum += read_all(x->buf, x->n, x->threads);
    return 0;
}

/* The --bw-mib buffer of the interleaved read (huge pages with --huge-pages),
 * its words first touched on all threads; NULL without memory. */
static uint64_t *alloc_read_buf(const options *o, int64_t *n)
{
    *n = (int64_t)o->bw_mib * 1024 * 1024 / (int64_t)sizeof(uint64_t);
    uint64_t *buf = alloc_big((size_t)*n * sizeof(uint64_t), o->huge_pages);
    if (buf) {
#if HAVE_OPENMP
        const int nt_max = max_threads();
#endif
        OMP(omp parallel for num_threads(nt_max) schedule(static))
        for (int64_t i = 0; i < *n; i++)
            buf[i] = (uint64_t)i;
    }
    return buf;
}

static double measure_bw(const uint64_t *buf, int64_t n, int nt, int tries)
{
    double best = 0.0;
    uint64_t total = 0;
    for (int r = 0; r < tries + 1; r++) { /* the first pass only warms up */
        const double t0 = now_s();
        const uint64_t s = read_all(buf, n, nt);
        const double dt = now_s() - t0;
        total += s;
        const double g = (double)n * sizeof(uint64_t) / dt * 1e-9;
        if (r > 0)
            best = g > best ? g : best;
    }
    if (total == 42)
        peak_sink = 1.0f;
    return best;
}

static void measure_limits_here(const options *o, limits *L)
{
    memset(L, 0, sizeof *L);
    /* Many short windows, keep the best: on a shared machine a 2 ms window often
     * falls inside one scheduler slice, a 20 ms one seldom does. */
    const double target = 0.002;
    const int tries = o->quick ? 40 : 80;
    for (int ti = 0; ti < o->n_threads; ti++)
        for (int i = 0; i < SDPA_ISA_COUNT; i++) {
            const peak_fn fn = peak_function((sdpa_isa)i);
            if (fn && sdpa_isa_supported((sdpa_isa)i))
                L->peak[i][ti] = measure_peak(fn, o->threads[ti], target, tries);
        }
    /* n threads on n free cores reach about n x the 1-thread peak; when far below,
     * other processes held cores: try again a few times. */
    double single[SDPA_ISA_COUNT] = {0};
    for (int i = 0; i < SDPA_ISA_COUNT; i++) {
        const peak_fn fn = peak_function((sdpa_isa)i);
        if (fn && sdpa_isa_supported((sdpa_isa)i))
            single[i] = measure_peak(fn, 1, target, tries / 4);
    }
    for (int ti = 0; ti < o->n_threads; ti++) {
        const int nt = o->threads[ti];
        if (nt <= 1 || nt > max_threads())
            continue;
        for (int i = 0; i < SDPA_ISA_COUNT; i++) {
            const peak_fn fn = peak_function((sdpa_isa)i);
            for (int retry = 0; retry < 4 && fn && L->peak[i][ti] < 0.8 * nt * single[i]; retry++) {
                const double p = measure_peak(fn, nt, target, tries);
                L->peak[i][ti] = p > L->peak[i][ti] ? p : L->peak[i][ti];
            }
        }
    }
    const int64_t n = (int64_t)o->bw_mib * 1024 * 1024 / (int64_t)sizeof(uint64_t);
    uint64_t *buf = alloc_big((size_t)n * sizeof(uint64_t), o->huge_pages);
    if (buf) {
#if HAVE_OPENMP
        const int nt_max = max_threads();
#endif
        OMP(omp parallel for num_threads(nt_max) schedule(static))
        for (int64_t i = 0; i < n; i++)
            buf[i] = (uint64_t)i; /* first touch, spread over the threads */
        L->bw_huge_mib = o->huge_pages ? anon_huge_mib() : 0.0;
        for (int ti = 0; ti < o->n_threads; ti++)
            L->bw[ti] = measure_bw(buf, n, o->threads[ti], o->quick ? 5 : 10);
        free(buf);
    }
    L->bw_mib = o->bw_mib;
    L->measured = 1;
}

/* Measures in a child process (the bandwidth buffer stays out of this process's
 * RSS, and no OpenMP team exists yet here); falls back to measuring in-process. */
static void measure_limits(const options *o, limits *L)
{
    int fd[2];
    fflush(stdout);
    fflush(stderr);
    if (pipe(fd) == 0) {
        const pid_t pid = fork();
        if (pid == 0) {
            limits tmp;
            close(fd[0]);
            measure_limits_here(o, &tmp);
            const char *p = (const char *)&tmp;
            size_t left = sizeof tmp;
            while (left > 0) {
                const ssize_t w = write(fd[1], p, left);
                if (w <= 0)
                    _exit(1);
                p += w;
                left -= (size_t)w;
            }
            _exit(0);
        }
        close(fd[1]);
        if (pid > 0) {
            char *p = (char *)L;
            size_t got = 0;
            while (got < sizeof *L) {
                const ssize_t r = read(fd[0], p + got, sizeof *L - got);
                if (r <= 0)
                    break;
                got += (size_t)r;
            }
            close(fd[0]);
            int status = 0;
            waitpid(pid, &status, 0);
            if (got == sizeof *L && WIFEXITED(status) && WEXITSTATUS(status) == 0)
                return;
        } else {
            close(fd[0]);
        }
    }
    measure_limits_here(o, L);
}

/* ------------------------------------------------------------ results */

typedef struct row {
    const char *impl, *isa, *op;
    sdpa_dtype dtype; /* of Q, K/V, O (naive-blas: fp32) */
    int threads, reps;
    const bcase *c;
    double ms, gflops, peak_gflops, gbps, peak_gbps, rss_mb, rss_increase_mb, speedup, pairs,
        max_abs_diff;
    const variant *var; /* the attention variant (plain when NULL); shown only with variant options */
    double ratio;       /* variant ms / plain ms of the same run, or < 0 (plain rows) */
    double ratio_kv;    /* padding form rows: ms / the kv_lengths ms of the same run; else < 0 */
    double bw_il_gbps;  /* decode rows with --bw-interleaved: the read timed beside them; else 0 */
} row;

typedef struct out_state {
    FILE *table;
    int header_done;
    const options *o;
} out_state;

static void fmt_shape(char *buf, size_t n, const shape *s)
{
    snprintf(buf, n, "%lld,%lld,%lld,%lld,%lld,%lld,%lld", (long long)s->B, (long long)s->Hq,
             (long long)s->Hkv, (long long)s->Tq, (long long)s->Tk, (long long)s->Dk, (long long)s->Dv);
}

static void json_num(const char *key, double v)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0) /* counts exactly (pairs) */
        printf(",\"%s\":%.0f", key, v);
    else if (isfinite(v))
        printf(",\"%s\":%.6g", key, v);
    else
        printf(",\"%s\":null", key);
}

static void emit_row(out_state *st, const row *r)
{
    const shape *s = &r->c->s;
    char sh[160];
    fmt_shape(sh, sizeof sh, s);
    const int variants = st->o->n_variants > 0;
    const variant *var = r->var ? r->var : &plain_variant;
    if (!st->header_done) {
        fprintf(st->table, "%-10s %-8s %3s  %-28s %-19s %-8s", "impl", "isa", "thr", "B,Hq,Hkv,Tq,Tk,Dk,Dv",
                "mask", "op");
        if (st->o->show_dtype)
            fprintf(st->table, " %-5s", "dtype");
        fprintf(st->table, " %10s %9s %6s %8s %8s %5s %8s", "ms", "GFLOP/s", "%peak", "xscalar", "GB/s", "%bw",
                "RSS MiB");
        if (variants)
            fprintf(st->table, "  %-19s %8s", "variant", "/plain");
        if (st->o->any_forms)
            fprintf(st->table, " %11s", "/kv_lengths");
        fputc('\n', st->table);
        st->header_done = 1;
    }
    char pk[16] = "-", sp[16] = "-", gb[16] = "", pb[16] = "";
    if (r->peak_gflops > 0.0)
        snprintf(pk, sizeof pk, "%.1f", 100.0 * r->gflops / r->peak_gflops);
    if (r->speedup > 0.0)
        snprintf(sp, sizeof sp, "%.2fx", r->speedup);
    if (is_decode(r->c)) {
        snprintf(gb, sizeof gb, "%.2f", r->gbps);
        snprintf(pb, sizeof pb, "-");
        if (r->peak_gbps > 0.0)
            snprintf(pb, sizeof pb, "%.1f", 100.0 * r->gbps / r->peak_gbps);
    }
    fprintf(st->table, "%-10s %-8s %3d  %-28s %-19s %-8s", r->impl, r->isa, r->threads, sh, mask_names[r->c->mask],
            r->op);
    if (st->o->show_dtype)
        fprintf(st->table, " %-5s", dtype_names[r->dtype]);
    fprintf(st->table, " %10.3f %9.2f %6s %8s %8s %5s %8.1f", r->ms, r->gflops, pk, sp, gb, pb, r->rss_mb);
    if (variants) {
        char vn[64] = "plain", ra[16] = "-";
        if (var->softcap != 0.0f && strcmp(var->name, "softcap") == 0)
            snprintf(vn, sizeof vn, "softcap=%g", (double)var->softcap);
        else
            snprintf(vn, sizeof vn, "%s", var->name);
        if (r->ratio > 0.0)
            snprintf(ra, sizeof ra, "%.3fx", r->ratio);
        fprintf(st->table, "  %-19s %8s", vn, ra);
    }
    if (st->o->any_forms) {
        char rk[16] = "-";
        if (r->ratio_kv > 0.0)
            snprintf(rk, sizeof rk, "%.3fx", r->ratio_kv);
        fprintf(st->table, " %11s", rk);
    }
    fputc('\n', st->table);
    fflush(st->table);
    if (!st->o->json)
        return;
    printf("{\"impl\":\"%s\",\"op\":\"%s\",\"isa\":\"%s\",\"threads\":%d", r->impl, r->op, r->isa,
           r->threads);
    printf(",\"B\":%lld,\"Hq\":%lld,\"Hkv\":%lld,\"Tq\":%lld,\"Tk\":%lld,\"Dk\":%lld,\"Dv\":%lld",
           (long long)s->B, (long long)s->Hq, (long long)s->Hkv, (long long)s->Tq, (long long)s->Tk,
           (long long)s->Dk, (long long)s->Dv);
    printf(",\"mask\":\"%s\",\"dtype\":\"%s\"", mask_names[r->c->mask], dtype_names[r->dtype]);
    json_num("ms", r->ms);
    json_num("gflops", r->gflops);
    json_num("peak_gflops", r->peak_gflops > 0.0 ? r->peak_gflops : NAN);
    if (is_decode(r->c)) {
        json_num("gbps", r->gbps);
        json_num("peak_gbps", r->peak_gbps > 0.0 ? r->peak_gbps : NAN);
        if (r->bw_il_gbps > 0.0) {
            json_num("bw_interleaved_gbps", r->bw_il_gbps);
            json_num("pct_bw_interleaved", 100.0 * r->gbps / r->bw_il_gbps);
        }
    }
    json_num("rss_mb", r->rss_mb);
    json_num("rss_increase_mb", r->rss_increase_mb);
    printf(",\"reps\":%d", r->reps);
    json_num("pairs", r->pairs);
    if (r->speedup > 0.0)
        json_num("speedup_vs_scalar", r->speedup);
    if (r->max_abs_diff >= 0.0)
        json_num("max_abs_diff_vs_sdpa", r->max_abs_diff);
    if (variants) {
        printf(",\"variant\":\"%s\"", var->name);
        json_num("softcap", var->softcap);
        printf(",\"alibi\":%s,\"sinks\":%s", var->alibi ? "true" : "false", var->sinks ? "true" : "false");
        if (r->ratio > 0.0)
            json_num("ratio_vs_plain", r->ratio);
    }
    if (r->ratio_kv > 0.0)
        json_num("ratio_vs_kv_lengths", r->ratio_kv);
    printf(",\"version\":\"%s\"}\n", sdpa_version());
    fflush(stdout);
}

static void fill_row(row *r, const bcase *c, int backward, sdpa_dtype dt, const timing *t, double peak_gflops,
                     double peak_gbps, double rss_before)
{
    r->c = c;
    r->dtype = dt;
    r->op = backward ? "backward" : "forward";
    r->reps = t->reps;
    r->ms = t->median_s * 1e3;
    r->pairs = allowed_pairs(c);
    r->gflops = op_flops(c, backward) / t->median_s * 1e-9;
    r->peak_gflops = peak_gflops;
    r->gbps = kv_bytes_read(c, dtype_bytes(dt)) / t->median_s * 1e-9;
    r->peak_gbps = peak_gbps;
    r->rss_mb = peak_rss_mb();
    r->rss_increase_mb = r->rss_mb - rss_before;
    r->speedup = -1.0;
    r->max_abs_diff = -1.0;
    r->var = NULL;
    r->ratio = -1.0;
    r->ratio_kv = -1.0;
}

/* ------------------------------------------------------------ problem buffers */

/* A shape's tensors, every one but LSE (fp32) of type dt. */
typedef struct bufs {
    sdpa_dtype dt;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
    int32_t *kvlen;
    int64_t nq, nk, nv, no, nl;
} bufs;

/* A row's inputs and outputs, for flush_caches. */
static void evict_bufs(evict_list *e, const bufs *b)
{
    const size_t es = dtype_bytes(b->dt);
    evict_add(e, b->q, b->nq, es), evict_add(e, b->k, b->nk, es), evict_add(e, b->v, b->nv, es);
    evict_add(e, b->o, b->no, es), evict_add(e, b->lse, b->nl, sizeof(float)), evict_add(e, b->dout, b->no, es);
    evict_add(e, b->dq, b->nq, es), evict_add(e, b->dk, b->nk, es), evict_add(e, b->dv, b->nv, es);
}

static void free_bufs(bufs *b)
{
    free(b->q), free(b->k), free(b->v), free(b->o), free(b->lse);
    free(b->dout), free(b->dq), free(b->dk), free(b->dv), free(b->kvlen);
    memset(b, 0, sizeof *b);
}

static int alloc_bufs(const bcase *c, int grads, sdpa_dtype dt, bufs *b)
{
    const shape *s = &c->s;
    const size_t es = dtype_bytes(dt);
    memset(b, 0, sizeof *b);
    b->dt = dt;
    b->nq = s->B * s->Hq * s->Tq * s->Dk;
    b->nk = s->B * s->Hkv * s->Tk * s->Dk;
    b->nv = s->B * s->Hkv * s->Tk * s->Dv;
    b->no = s->B * s->Hq * s->Tq * s->Dv;
    b->nl = s->B * s->Hq * s->Tq;
    b->q = alloc_elems(b->nq, es), b->k = alloc_elems(b->nk, es), b->v = alloc_elems(b->nv, es);
    b->o = alloc_elems(b->no, es), b->lse = alloc_floats(b->nl);
    b->kvlen = malloc((size_t)s->B * sizeof(int32_t));
    int ok = b->q && b->k && b->v && b->o && b->lse && b->kvlen;
    if (grads) {
        b->dout = alloc_elems(b->no, es), b->dq = alloc_elems(b->nq, es);
        b->dk = alloc_elems(b->nk, es), b->dv = alloc_elems(b->nv, es);
        ok = ok && b->dout && b->dq && b->dk && b->dv;
    }
    if (!ok) {
        free_bufs(b);
        return -1;
    }
    fill_random_as(b->q, b->nq, 1, dt);
    fill_random_as(b->k, b->nk, 2, dt);
    fill_random_as(b->v, b->nv, 3, dt);
    memset(b->o, 0, (size_t)b->no * es); /* all-zero bits are +0 in every type */
    memset(b->lse, 0, (size_t)b->nl * sizeof(float));
    if (grads) {
        fill_random_as(b->dout, b->no, 4, dt);
        memset(b->dq, 0, (size_t)b->nq * es);
        memset(b->dk, 0, (size_t)b->nk * es);
        memset(b->dv, 0, (size_t)b->nv * es);
    }
    for (int64_t i = 0; i < s->B; i++)
        b->kvlen[i] = padding_length(s, i);
    return 0;
}

typedef struct sdpa_ctx {
    sdpa_problem pb;
    sdpa_tensor q, k, v, o_in, lse_in, dout;
    sdpa_tensor_out o, lse, dq, dk, dv;
    sdpa_status st;
} sdpa_ctx;

static sdpa_tensor tin(const void *p, int64_t H, int64_t T, int64_t D)
{
    const sdpa_tensor t = {p, H * T * D, T * D, D};
    return t;
}

static sdpa_tensor_out tout(void *p, int64_t H, int64_t T, int64_t D)
{
    const sdpa_tensor_out t = {p, H * T * D, T * D, D};
    return t;
}

static void setup_sdpa(sdpa_ctx *x, const bcase *c, const bufs *b, sdpa_isa isa, int threads)
{
    const shape *s = &c->s;
    memset(x, 0, sizeof *x);
    sdpa_problem_init(&x->pb);
    x->pb.batch = s->B, x->pb.q_heads = s->Hq, x->pb.kv_heads = s->Hkv;
    x->pb.q_len = s->Tq, x->pb.kv_len = s->Tk, x->pb.head_dim_qk = s->Dk, x->pb.head_dim_v = s->Dv;
    x->pb.causal = c->mask == MASK_CAUSAL      ? SDPA_CAUSAL_TOP_LEFT
                   : c->mask == MASK_CAUSAL_BR ? SDPA_CAUSAL_BOTTOM_RIGHT
                                               : SDPA_CAUSAL_NONE;
    x->pb.kv_lengths = c->mask == MASK_PADDING ? b->kvlen : NULL;
    x->pb.num_threads = threads;
    x->pb.isa = isa;
    x->pb.q_dtype = x->pb.kv_dtype = x->pb.o_dtype = b->dt;
    x->q = tin(b->q, s->Hq, s->Tq, s->Dk);
    x->k = tin(b->k, s->Hkv, s->Tk, s->Dk);
    x->v = tin(b->v, s->Hkv, s->Tk, s->Dv);
    x->o = tout(b->o, s->Hq, s->Tq, s->Dv);
    x->lse = tout(b->lse, s->Hq, s->Tq, 1);
    x->lse.seq_stride = 1;
    x->o_in = tin(b->o, s->Hq, s->Tq, s->Dv);
    x->lse_in = tin(b->lse, s->Hq, s->Tq, 1);
    x->lse_in.seq_stride = 1;
    x->dout = tin(b->dout, s->Hq, s->Tq, s->Dv);
    x->dq = tout(b->dq, s->Hq, s->Tq, s->Dk);
    x->dk = tout(b->dk, s->Hkv, s->Tk, s->Dk);
    x->dv = tout(b->dv, s->Hkv, s->Tk, s->Dv);
}

static int run_sdpa_forward(void *p)
{
    sdpa_ctx *x = p;
    x->st = sdpa_forward(&x->pb, &x->q, &x->k, &x->v, &x->o, &x->lse);
    return x->st != SDPA_OK;
}

static int run_sdpa_backward(void *p)
{
    sdpa_ctx *x = p;
    x->st = sdpa_backward(&x->pb, &x->q, &x->k, &x->v, &x->o_in, &x->lse_in, &x->dout, &x->dq,
                          &x->dk, &x->dv);
    return x->st != SDPA_OK;
}

/* ------------------------------------------------------------ the sdpa pass */

/* The buffers of the attention variants of one shape: the slopes and sinks
 * (Hq each), and per variant its own O and LSE (written by its forward, read by
 * its backward) and dsinks. */
typedef struct variant_bufs {
    float *slopes, *sinks;
    void *o[MAX_VARIANTS]; /* of the shape's type */
    float *lse[MAX_VARIANTS], *dsinks[MAX_VARIANTS];
} variant_bufs;

static void free_variant_bufs(variant_bufs *vb)
{
    free(vb->slopes), free(vb->sinks);
    for (int i = 0; i < MAX_VARIANTS; i++)
        free(vb->o[i]), free(vb->lse[i]), free(vb->dsinks[i]);
    memset(vb, 0, sizeof *vb);
}

static int alloc_variant_bufs(const options *o, const bcase *c, const bufs *b, variant_bufs *vb)
{
    const int64_t Hq = c->s.Hq;
    memset(vb, 0, sizeof *vb);
    if (o->n_variants == 0)
        return 0;
    vb->slopes = alloc_floats(Hq), vb->sinks = alloc_floats(Hq);
    int ok = vb->slopes && vb->sinks;
    for (int i = 0; ok && i < o->n_variants; i++) {
        vb->o[i] = alloc_elems(b->no, dtype_bytes(b->dt)), vb->lse[i] = alloc_floats(b->nl);
        vb->dsinks[i] = alloc_floats(Hq);
        ok = vb->o[i] && vb->lse[i] && vb->dsinks[i];
        if (ok) {
            memset(vb->o[i], 0, (size_t)b->no * dtype_bytes(b->dt));
            memset(vb->lse[i], 0, (size_t)b->nl * sizeof(float));
        }
    }
    if (!ok) {
        free_variant_bufs(vb);
        return -1;
    }
    for (int64_t h = 0; h < Hq; h++) {
        vb->slopes[h] = (float)exp2(-8.0 * (double)(h + 1) / (double)Hq); /* Press et al. 2022 */
        vb->sinks[h] = SINK_VALUE;
    }
    return 0;
}

/* The problem of variant vi of the shape: setup_sdpa's, with the variant's
 * options and its own O, LSE and dsinks. */
static void setup_variant(sdpa_ctx *x, const bcase *c, const bufs *b, const variant_bufs *vb, const variant *v,
                          int vi, sdpa_isa isa, int threads)
{
    const shape *s = &c->s;
    setup_sdpa(x, c, b, isa, threads);
    x->pb.softcap = v->softcap;
    x->pb.alibi_slopes = v->alibi ? vb->slopes : NULL;
    x->pb.sinks = v->sinks ? vb->sinks : NULL;
    x->pb.dsinks = v->sinks ? vb->dsinks[vi] : NULL; /* sdpa_forward ignores it */
    x->o = tout(vb->o[vi], s->Hq, s->Tq, s->Dv);
    x->lse = tout(vb->lse[vi], s->Hq, s->Tq, 1);
    x->lse.seq_stride = 1;
    x->o_in = tin(vb->o[vi], s->Hq, s->Tq, s->Dv);
    x->lse_in = tin(vb->lse[vi], s->Hq, s->Tq, 1);
    x->lse_in.seq_stride = 1;
}

/* Index into scalar_ms of (type, case, op, thread index): the scalar time, the
 * reference of xscalar. */
static size_t scalar_index(sdpa_dtype dt, int ci, int op, int ti)
{
    return (((size_t)dt * MAX_CASES + (size_t)ci) * 2 + (size_t)op) * MAX_LIST + (size_t)ti;
}

/* A 16-bit type's backward, tried once with the default ISA: 1 (and a note in the
 * table) when the library refuses it as unsupported, so its rows are skipped. */
static int backward_unsupported(out_state *st, const bcase *c, const bufs *b)
{
    sdpa_ctx x;
    if (b->dt == SDPA_DTYPE_F32)
        return 0;
    setup_sdpa(&x, c, b, SDPA_ISA_AUTO, 0);
    if (run_sdpa_backward(&x) == 0 || x.st != SDPA_ERR_UNSUPPORTED)
        return 0; /* another error shows in the timed runs */
    char sh[160];
    fmt_shape(sh, sizeof sh, &c->s);
    fprintf(st->table, "# backward %s %s %s skipped: libsdpa: %s\n", sh, mask_names[c->mask], dtype_names[b->dt],
            sdpa_status_string(x.st));
    fflush(st->table);
    return 1;
}

/* ------------------------------------------------------------ key padding given as a mask */

/* The padding forms of a kv_lengths case: per form f (mask FIRST_FORM + f) in
 * c->forms, its mask operand with the same key lengths (b->kvlen: key j of
 * batch b allowed iff j < kvlen[b]), made and filled here, outside every timed
 * run, and its own O and LSE (written by its forward, read by its backward). */
typedef struct form_bufs {
    void *mask[N_FORMS];    /* uint8 (bool forms) or fp32 (bias forms) */
    int64_t n_mask[N_FORMS]; /* elements */
    void *o[N_FORMS];       /* of the shape's type */
    float *lse[N_FORMS];
} form_bufs;

static int form_is_bias(int f)
{
    return FIRST_FORM + f == MASK_PADDING_BIAS || FIRST_FORM + f == MASK_PADDING_BIAS_4D;
}

static int form_is_4d(int f)
{
    return FIRST_FORM + f == MASK_PADDING_BOOL_4D || FIRST_FORM + f == MASK_PADDING_BIAS_4D;
}

static void free_form_bufs(form_bufs *fb)
{
    for (int f = 0; f < N_FORMS; f++)
        free(fb->mask[f]), free(fb->o[f]), free(fb->lse[f]);
    memset(fb, 0, sizeof *fb);
}

static int alloc_form_bufs(const bcase *c, const bufs *b, form_bufs *fb)
{
    const shape *s = &c->s;
    memset(fb, 0, sizeof *fb);
    for (int f = 0; f < N_FORMS; f++) {
        if (!(c->forms >> f & 1u))
            continue;
        const int64_t rows = form_is_4d(f) ? s->Tq : 1; /* (B,1,Tq,Tk) or (B,1,1,Tk) */
        const size_t es = form_is_bias(f) ? sizeof(float) : sizeof(uint8_t);
        fb->n_mask[f] = s->B * rows * s->Tk;
        fb->mask[f] = alloc_elems(fb->n_mask[f], es);
        fb->o[f] = alloc_elems(b->no, dtype_bytes(b->dt));
        fb->lse[f] = alloc_floats(b->nl);
        if (!fb->mask[f] || !fb->o[f] || !fb->lse[f]) {
            free_form_bufs(fb);
            return -1;
        }
        memset(fb->o[f], 0, (size_t)b->no * dtype_bytes(b->dt));
        memset(fb->lse[f], 0, (size_t)b->nl * sizeof(float));
        for (int64_t bi = 0; bi < s->B; bi++)
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < s->Tk; j++) {
                    const int64_t e = (bi * rows + i) * s->Tk + j;
                    const int allowed = j < b->kvlen[bi];
                    if (form_is_bias(f))
                        ((float *)fb->mask[f])[e] = allowed ? 0.0f : -INFINITY;
                    else
                        ((uint8_t *)fb->mask[f])[e] = (uint8_t)allowed;
                }
    }
    return 0;
}

/* The problem of padding form f of the kv_lengths case c: setup_sdpa's without
 * kv_lengths, with the form's mask (batch stride rows*Tk, head stride 0, query
 * stride Tk for the 4-D forms and 0 for the broadcast ones, key stride 1) and
 * its own O and LSE. */
static void setup_form(sdpa_ctx *x, const bcase *c, const bufs *b, const form_bufs *fb, int f, sdpa_isa isa,
                       int threads)
{
    const shape *s = &c->s;
    setup_sdpa(x, c, b, isa, threads);
    x->pb.kv_lengths = NULL;
    const int64_t qs = form_is_4d(f) ? s->Tk : 0, bs = (form_is_4d(f) ? s->Tq : 1) * s->Tk;
    if (form_is_bias(f)) {
        const sdpa_bias m = {fb->mask[f], bs, 0, qs, 1};
        x->pb.bias = m;
    } else {
        const sdpa_bool_mask m = {fb->mask[f], bs, 0, qs, 1};
        x->pb.bool_mask = m;
    }
    x->o = tout(fb->o[f], s->Hq, s->Tq, s->Dv);
    x->lse = tout(fb->lse[f], s->Hq, s->Tq, 1);
    x->lse.seq_stride = 1;
    x->o_in = tin(fb->o[f], s->Hq, s->Tq, s->Dv);
    x->lse_in = tin(fb->lse[f], s->Hq, s->Tq, 1);
    x->lse_in.seq_stride = 1;
}

/* ------------------------------------------------------------ the problems of a case */

/* The problems of one case, timed together: 0 the plain one, 1..nv the
 * attention variants, then the padding forms form[0..nf-1] of a kv_lengths case
 * (with the plain kernel, no variant). */
typedef struct problem_set {
    const options *o;
    const bcase *c;
    const bufs *b;
    const variant_bufs *vb;
    const form_bufs *fb;
    int nv, nf, n;
    int form[N_FORMS];
} problem_set;

static void setup_problem(sdpa_ctx *x, const problem_set *ps, int k, sdpa_isa isa, int threads)
{
    if (k == 0)
        setup_sdpa(x, ps->c, ps->b, isa, threads);
    else if (k <= ps->nv)
        setup_variant(x, ps->c, ps->b, ps->vb, &ps->o->variants[k - 1], k - 1, isa, threads);
    else
        setup_form(x, ps->c, ps->b, ps->fb, ps->form[k - 1 - ps->nv], isa, threads);
}

/* " name" of problem k for an error message ("" for the plain one). */
static void problem_name(char *buf, size_t n, const problem_set *ps, int k)
{
    const char *name = k == 0          ? ""
                       : k <= ps->nv ? ps->o->variants[k - 1].name
                                     : mask_names[FIRST_FORM + ps->form[k - 1 - ps->nv]];
    snprintf(buf, n, "%s%s", k ? " " : "", name);
}

/* The buffers problem k reads and writes, to evict before its timed runs. */
static void problem_evict(evict_list *e, const problem_set *ps, int k)
{
    bufs bk = *ps->b; /* a variant and a form have their own O and LSE */
    if (k > 0 && k <= ps->nv)
        bk.o = ps->vb->o[k - 1], bk.lse = ps->vb->lse[k - 1];
    memset(e, 0, sizeof *e);
    if (k > ps->nv) {
        const int f = ps->form[k - 1 - ps->nv];
        bk.o = ps->fb->o[f], bk.lse = ps->fb->lse[f];
        evict_add(e, ps->fb->mask[f], ps->fb->n_mask[f], form_is_bias(f) ? sizeof(float) : sizeof(uint8_t));
    }
    evict_bufs(e, &bk);
}

static int sdpa_pass(const options *o, const limits *L, out_state *st, double *scalar_ms)
{
    int failed = 0;
    int64_t n_read = 0;
    uint64_t *read_buf = NULL;
    evict_list read_ev = {0};
    if (o->bw_il) {
        int any_decode = 0;
        for (int i = 0; i < o->n_cases; i++)
            any_decode |= is_decode(&o->cases[i]);
        if (any_decode && !(read_buf = alloc_read_buf(o, &n_read)))
            fputs("sdpa bench: --bw-interleaved: no memory for the read buffer; decode rows without it\n",
                  stderr);
        evict_add(&read_ev, read_buf, n_read, sizeof(uint64_t));
    }
    for (int cd = 0; cd < o->n_cases * o->n_dtypes; cd++) { /* each case in each type */
        const int ci = cd / o->n_dtypes;
        const bcase *c = &o->cases[ci];
        const sdpa_dtype dt = o->dtypes[cd % o->n_dtypes];
        const double rss_before = peak_rss_mb();
        bufs b;
        variant_bufs vb;
        form_bufs fb;
        int ok = alloc_bufs(c, o->bwd, dt, &b) == 0;
        if (ok && alloc_variant_bufs(o, c, &b, &vb) != 0) {
            free_bufs(&b);
            ok = 0;
        }
        if (ok && alloc_form_bufs(c, &b, &fb) != 0) {
            free_variant_bufs(&vb);
            free_bufs(&b);
            ok = 0;
        }
        if (!ok) {
            char sh[160];
            fmt_shape(sh, sizeof sh, &c->s);
            fprintf(stderr, "sdpa bench: error: %s %s: out of memory; shape skipped\n", sh, dtype_names[dt]);
            failed = 1;
            continue;
        }
        problem_set ps = {o, c, &b, &vb, &fb, o->n_variants, 0, 0, {0}};
        bcase form_case[N_FORMS]; /* the case as each form's rows name it */
        for (int f = 0; f < N_FORMS; f++)
            if (c->forms >> f & 1u) {
                form_case[ps.nf] = *c;
                form_case[ps.nf].mask = (bench_mask)(FIRST_FORM + f);
                ps.form[ps.nf++] = f;
            }
        const int n = ps.n = 1 + ps.nv + ps.nf;
        for (int op = 0; op < 2; op++) {
            if ((op == 0 && !o->fwd) || (op == 1 && !o->bwd))
                continue;
            if (op == 1) { /* O and LSE for the backward: once, with the default ISA and threads */
                int bad = 0;
                for (int k = 0; k < n && !bad; k++) {
                    sdpa_ctx x;
                    setup_problem(&x, &ps, k, SDPA_ISA_AUTO, 0);
                    if (run_sdpa_forward(&x) != 0) {
                        char pn[64];
                        problem_name(pn, sizeof pn, &ps, k);
                        fprintf(stderr, "sdpa bench: error: forward %s%s: %s\n", dtype_names[dt], pn,
                                sdpa_status_string(x.st));
                        bad = 1;
                    }
                }
                if (bad) {
                    failed = 1;
                    continue;
                }
                if (backward_unsupported(st, c, &b))
                    continue;
            }
            double pscalar[MAX_PROBLEMS][MAX_LIST] = {{0}}; /* each variant's and form's scalar ms */
            for (int ti = 0; ti < o->n_threads; ti++)
                for (int ii = 0; ii < o->n_isas; ii++) {
                    const sdpa_isa isa = o->isas[ii];
                    /* --isa all: amx only where it differs from avx512 (bf16 rows) */
                    if (o->all_isas && isa == SDPA_ISA_AMX && dt != SDPA_DTYPE_BF16)
                        continue;
                    sdpa_ctx x[MAX_PROBLEMS];
                    run_fn fns[MAX_TIMED];
                    void *ctxs[MAX_TIMED];
                    evict_list ev[MAX_PROBLEMS];
                    const evict_list *evp[MAX_TIMED];
                    timing t[MAX_TIMED];
                    for (int k = 0; k < n; k++) {
                        setup_problem(&x[k], &ps, k, isa, o->threads[ti]);
                        fns[k] = op ? run_sdpa_backward : run_sdpa_forward;
                        ctxs[k] = &x[k];
                        problem_evict(&ev[k], &ps, k);
                        evp[k] = is_decode(c) ? &ev[k] : NULL;
                    }
                    read_ctx rd = {read_buf, n_read, o->threads[ti], 0};
                    const int with_read = read_buf && is_decode(c);
                    fns[n] = run_read, ctxs[n] = &rd, evp[n] = &read_ev;
                    int bad_k = 0;
                    if (time_interleaved(n + with_read, fns, ctxs, o, evp, t, &bad_k) != 0) {
                        char pn[64];
                        problem_name(pn, sizeof pn, &ps, bad_k);
                        fprintf(stderr, "sdpa bench: error: %s %s %s%s: %s\n", sdpa_isa_name(isa),
                                op ? "backward" : "forward", dtype_names[dt], pn, sdpa_status_string(x[bad_k].st));
                        failed = 1;
                        continue;
                    }
                    double plain_ms = 0.0;
                    for (int k = 0; k < n; k++) {
                        row r;
                        memset(&r, 0, sizeof r);
                        r.impl = "sdpa";
                        r.isa = sdpa_isa_name(isa);
                        r.threads = o->threads[ti];
                        fill_row(&r, k > ps.nv ? &form_case[k - 1 - ps.nv] : c, op, dt, &t[k],
                                 row_peak(L, isa, dt, op, c->s.Tq <= DECODE_MAX_TQ, ti), L->bw[ti], rss_before);
                        double *ref = k == 0 ? &scalar_ms[scalar_index(dt, ci, op, ti)] : &pscalar[k][ti];
                        if (isa == SDPA_ISA_SCALAR)
                            *ref = r.ms;
                        if (*ref > 0.0)
                            r.speedup = *ref / r.ms;
                        if (k == 0) {
                            plain_ms = r.ms;
                        } else if (k <= ps.nv) {
                            r.var = &o->variants[k - 1];
                            r.ratio = plain_ms > 0.0 ? r.ms / plain_ms : -1.0;
                        } else {
                            r.ratio_kv = plain_ms > 0.0 ? r.ms / plain_ms : -1.0; /* problem 0: kv_lengths */
                        }
                        if (with_read)
                            r.bw_il_gbps = (double)n_read * sizeof(uint64_t) / t[n].median_s * 1e-9;
                        emit_row(st, &r);
                    }
                    if (with_read)
                        fprintf(st->table, "# read bandwidth timed interleaved with these rows (median of %d flushed "
                                           "reads of %d MiB, %d thread%s): %.1f GB/s\n",
                                t[n].reps, o->bw_mib, o->threads[ti], o->threads[ti] > 1 ? "s" : "",
                                (double)n_read * sizeof(uint64_t) / t[n].median_s * 1e-9);
                    if (rd.sum == 42)
                        peak_sink = 1.0f;
                }
        }
        free_form_bufs(&fb);
        free_variant_bufs(&vb);
        free_bufs(&b);
    }
    free(read_buf);
    return failed;
}

/* ------------------------------------------------------------ the naive pass */

#ifdef SDPA_BENCH_HAVE_OPENBLAS

typedef struct naive_ctx {
    const bcase *c;
    const bufs *b;
    float scale;
    int threads;
    float *S, *dP;          /* [B, Hq, Tq, Tk]: P after the forward; dP then dS */
    float *o, *dq, *dk, *dv; /* naive outputs */
} naive_ctx;

static int run_naive_forward(void *p)
{
    naive_ctx *x = p;
    const shape *s = &x->c->s;
    const int64_t G = s->Hq / s->Hkv;
    const int Tq = (int)s->Tq, Tk = (int)s->Tk, Dk = (int)s->Dk, Dv = (int)s->Dv;
    const float *bq = x->b->q, *bk = x->b->k, *bv = x->b->v; /* fp32 (alloc_bufs in naive_pass) */
    for (int64_t bh = 0; bh < s->B * s->Hq; bh++) {
        const int64_t bg = (bh / s->Hq) * s->Hkv + (bh % s->Hq) / G;
        blas.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, Dk, x->scale,
                    bq + bh * s->Tq * s->Dk, Dk, bk + bg * s->Tk * s->Dk, Dk, 0.0f,
                    x->S + bh * s->Tq * s->Tk, Tk);
    }
    const int64_t rows = s->B * s->Hq * s->Tq;
    OMP(omp parallel for num_threads(x->threads) schedule(static))
    for (int64_t r = 0; r < rows; r++) {
        float *srow = x->S + r * s->Tk;
        const int64_t hi = row_hi(x->c, r / (s->Hq * s->Tq), r % s->Tq);
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < hi; j++)
            mx = srow[j] > mx ? srow[j] : mx;
        for (int64_t j = 0; j < hi; j++) {
            srow[j] = expf(srow[j] - mx);
            sum += srow[j];
        }
        const float inv = hi > 0 ? 1.0f / sum : 0.0f;
        for (int64_t j = 0; j < hi; j++)
            srow[j] *= inv;
        for (int64_t j = hi; j < s->Tk; j++)
            srow[j] = 0.0f;
    }
    for (int64_t bh = 0; bh < s->B * s->Hq; bh++) {
        const int64_t bg = (bh / s->Hq) * s->Hkv + (bh % s->Hq) / G;
        blas.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, Dv, Tk, 1.0f,
                    x->S + bh * s->Tq * s->Tk, Tk, bv + bg * s->Tk * s->Dv, Dv, 0.0f,
                    x->o + bh * s->Tq * s->Dv, Dv);
    }
    return 0;
}

/* Backward from the P the last forward left in S (what autograd would keep). */
static int run_naive_backward(void *p)
{
    naive_ctx *x = p;
    const shape *s = &x->c->s;
    const int64_t G = s->Hq / s->Hkv;
    const int Tq = (int)s->Tq, Tk = (int)s->Tk, Dk = (int)s->Dk, Dv = (int)s->Dv;
    const float *bq = x->b->q, *bk = x->b->k, *bv = x->b->v, *bdo = x->b->dout; /* fp32 */
    for (int64_t bh = 0; bh < s->B * s->Hq; bh++) {
        const int64_t bg = (bh / s->Hq) * s->Hkv + (bh % s->Hq) / G;
        const float beta = (bh % s->Hq) % G == 0 ? 0.0f : 1.0f; /* GQA: sum over the group */
        const float *P = x->S + bh * s->Tq * s->Tk, *dO = bdo + bh * s->Tq * s->Dv;
        blas.sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, Dv, Tq, 1.0f, P, Tk, dO, Dv, beta,
                    x->dv + bg * s->Tk * s->Dv, Dv);
        blas.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, Dv, 1.0f, dO, Dv,
                    bv + bg * s->Tk * s->Dv, Dv, 0.0f, x->dP + bh * s->Tq * s->Tk, Tk);
    }
    const int64_t rows = s->B * s->Hq * s->Tq;
    OMP(omp parallel for num_threads(x->threads) schedule(static))
    for (int64_t r = 0; r < rows; r++) {
        const float *prow = x->S + r * s->Tk;
        float *drow = x->dP + r * s->Tk;
        float d = 0.0f;
        for (int64_t j = 0; j < s->Tk; j++)
            d += prow[j] * drow[j];
        for (int64_t j = 0; j < s->Tk; j++)
            drow[j] = prow[j] * (drow[j] - d);
    }
    for (int64_t bh = 0; bh < s->B * s->Hq; bh++) {
        const int64_t bg = (bh / s->Hq) * s->Hkv + (bh % s->Hq) / G;
        const float beta = (bh % s->Hq) % G == 0 ? 0.0f : 1.0f;
        const float *dS = x->dP + bh * s->Tq * s->Tk;
        blas.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, Dk, Tk, x->scale, dS, Tk,
                    bk + bg * s->Tk * s->Dk, Dk, 0.0f, x->dq + bh * s->Tq * s->Dk, Dk);
        blas.sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, Dk, Tq, x->scale, dS, Tk,
                    bq + bh * s->Tq * s->Dk, Dk, beta, x->dk + bg * s->Tk * s->Dk, Dk);
    }
    return 0;
}

/* The peak a row is measured against: the ISA's own, but an amx row runs the AVX-512
 * kernels except in a bf16 prefill, forward or backward (its tile products; decode tiles
 * do not). */
static double row_peak(const limits *L, sdpa_isa isa, sdpa_dtype dt, int backward, int decode, int ti)
{
    (void)backward;
    if (isa == SDPA_ISA_AMX && (dt != SDPA_DTYPE_BF16 || decode))
        return L->peak[SDPA_ISA_AVX512][ti];
    return L->peak[isa][ti];
}

/* The best peak of any SIMD ISA at thread index ti (the machine's peak), or 0
 * if none was measured (the fmaf() chains are no measure of the hardware). */
static double best_peak(const limits *L, int ti)
{
    double b = 0.0;
    for (int i = SDPA_ISA_SCALAR + 1; i < SDPA_ISA_COUNT; i++)
        if (i != SDPA_ISA_AMX) /* fp32 FMA peaks only */
            b = L->peak[i][ti] > b ? L->peak[i][ti] : b;
    return b;
}

static double max_abs_diff(const float *a, const float *b, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d; /* NaN wins */
    }
    return m;
}

static int naive_pass(const options *o, const limits *L, out_state *st, const double *scalar_ms)
{
    int failed = 0;
    for (int ci = 0; ci < o->n_cases; ci++) {
        const bcase *c = &o->cases[ci];
        const shape *s = &c->s;
        char sh[160];
        fmt_shape(sh, sizeof sh, s);
        const double s_bytes = 4.0 * (double)s->B * (double)s->Hq * (double)s->Tq * (double)s->Tk;
        if (s_bytes > (double)NAIVE_MAX_S_BYTES) {
            fprintf(st->table, "# naive-blas skipped for %s: S would take %.0f MiB\n", sh,
                    s_bytes / 1048576.0);
            continue;
        }
        const double rss_before = peak_rss_mb();
        bufs b;
        naive_ctx x;
        memset(&x, 0, sizeof x);
        const int64_t ns = s->B * s->Hq * s->Tq * s->Tk;
        int ok = alloc_bufs(c, o->bwd, SDPA_DTYPE_F32, &b) == 0; /* OpenBLAS: fp32 */
        if (ok) {
            x.S = alloc_floats(ns);
            x.o = alloc_floats(b.no);
            ok = x.S && x.o;
            if (o->bwd) {
                x.dP = alloc_floats(ns);
                x.dq = alloc_floats(b.nq), x.dk = alloc_floats(b.nk), x.dv = alloc_floats(b.nv);
                ok = ok && x.dP && x.dq && x.dk && x.dv;
            }
        }
        if (!ok) {
            fprintf(stderr, "sdpa bench: error: %s: out of memory for naive-blas; skipped\n", sh);
            failed = 1;
        } else {
            x.c = c;
            x.b = &b;
            x.scale = 1.0f / sqrtf((float)s->Dk);
            /* The reference: libsdpa with the default ISA and threads. */
            sdpa_ctx ref;
            setup_sdpa(&ref, c, &b, SDPA_ISA_AUTO, 0);
            double diff[2] = {-1.0, -1.0};
            x.threads = o->threads[o->n_threads - 1];
            blas.set_num_threads(x.threads);
            if (run_sdpa_forward(&ref) == 0) {
                run_naive_forward(&x);
                diff[0] = max_abs_diff(x.o, b.o, b.no);
                if (o->bwd && run_sdpa_backward(&ref) == 0) {
                    run_naive_backward(&x);
                    const double a = max_abs_diff(x.dq, b.dq, b.nq), bb = max_abs_diff(x.dk, b.dk, b.nk),
                                 cc = max_abs_diff(x.dv, b.dv, b.nv);
                    diff[1] = a > bb ? a : bb;
                    diff[1] = cc > diff[1] ? cc : diff[1];
                }
            }
            fprintf(st->table, "# check %s %s: naive-blas vs sdpa (%s) max |diff| forward O %.3g",
                    sh, mask_names[c->mask], sdpa_isa_name(sdpa_isa_active()), diff[0]);
            if (o->bwd)
                fprintf(st->table, ", backward dQ/dK/dV %.3g", diff[1]);
            fputc('\n', st->table);
            for (int op = 0; op < 2; op++) {
                if ((op == 0 && !o->fwd) || (op == 1 && !o->bwd))
                    continue;
                for (int ti = 0; ti < o->n_threads; ti++) {
                    x.threads = o->threads[ti];
                    blas.set_num_threads(x.threads);
                    timing t;
                    if (op == 1)
                        run_naive_forward(&x); /* P for the backward */
                    evict_list ev = {0};
                    evict_bufs(&ev, &b);
                    if (time_runs(op ? run_naive_backward : run_naive_forward, &x, o, is_decode(c) ? &ev : NULL,
                                  &t) != 0)
                        continue;
                    row r;
                    memset(&r, 0, sizeof r);
                    r.impl = "naive-blas";
                    r.isa = "openblas";
                    r.threads = x.threads;
                    fill_row(&r, c, op, SDPA_DTYPE_F32, &t, best_peak(L, ti), L->bw[ti], rss_before);
                    const double ref_ms = scalar_ms[scalar_index(SDPA_DTYPE_F32, ci, op, ti)];
                    if (ref_ms > 0.0)
                        r.speedup = ref_ms / r.ms;
                    r.max_abs_diff = diff[op];
                    emit_row(st, &r);
                }
            }
        }
        free(x.S), free(x.dP), free(x.o), free(x.dq), free(x.dk), free(x.dv);
        free_bufs(&b);
    }
    return failed;
}
#endif /* SDPA_BENCH_HAVE_OPENBLAS */

/* ------------------------------------------------------------ --serve: one continuous-batching step */

/* The step: SERVE_DECODE sequences decoding one token each at context lengths
 * spread evenly over 256..8192 (the new token included), then SERVE_PREFILL
 * chunks of SERVE_CHUNK new tokens over SERVE_PREFIX cached ones (bottom-right
 * causal), Hq = 32, Hkv = 8, D = 128, pages of 16 keys (HND cache), the pages
 * of all sequences shuffled over the cache. Three ways, runs interleaved:
 *   sdpa-paged   one sdpa_forward_with_workspace over the block table (no copy)
 *   sdpa-packed  the same call on contiguous packed K/V (cu_seqlens_k)
 *   gather-dense what an integrator does without paged support: per sequence,
 *                gather its pages into contiguous [Hkv, Tk, D] buffers (OpenMP
 *                over heads and pages), then a dense sdpa_forward
 * and the same three on the decode rows alone ("decode": 32 sequences, the
 * bandwidth-bound part). GB/s = bytes of K and V of every sequence, read once
 * (sum Tk_b * Hkv * (Dk + Dv) * 4) / time; the cache (over 1 GB) is far larger
 * than any last-level cache, so no eviction is needed between runs. */
#define SERVE_DECODE 32
#define SERVE_PREFILL 2
#define SERVE_CHUNK 512
#define SERVE_PREFIX 2048
#define SERVE_SEQS (SERVE_DECODE + SERVE_PREFILL)
#define SERVE_HQ 32
#define SERVE_HKV 8
#define SERVE_D 128
#define SERVE_BS 16

typedef struct serve_data {
    int32_t cuq[SERVE_SEQS + 1], cuk[SERVE_SEQS + 1], lk[SERVE_SEQS];
    int32_t *bt;                /* [SERVE_SEQS, M] */
    int64_t M, nb;              /* pages per table row, pages in the cache */
    float *q;                   /* [total_q, Hq, D] */
    float *kc, *vc;             /* paged caches [nb, Hkv, bs, D] */
    float *kp, *vp;             /* the same keys packed [total_k, Hkv, D] */
    float *o[3];                /* per way: [total_q, Hq, D] */
    float *gk, *gv;             /* gather buffers [Hkv, max Tk, D] */
} serve_data;

enum { SERVE_PAGED, SERVE_PACKED, SERVE_GATHER, SERVE_WAYS };
static const char *const serve_impl[SERVE_WAYS] = {"sdpa-paged", "sdpa-packed", "gather-dense"};

typedef struct serve_ctx {
    const serve_data *d;
    int way, nseq, threads;
    sdpa_isa isa;
    sdpa_problem pb;
    sdpa_seqs seqs;
    void *ws;
    size_t ws_bytes;
    sdpa_status st;
} serve_ctx;

static void serve_free(serve_data *d)
{
    free(d->bt), free(d->q), free(d->kc), free(d->vc), free(d->kp), free(d->vp);
    for (int i = 0; i < SERVE_WAYS; i++)
        free(d->o[i]);
    free(d->gk), free(d->gv);
    memset(d, 0, sizeof *d);
}

static int serve_alloc(serve_data *d, int huge)
{
    const int64_t H = SERVE_HKV, D = SERVE_D, bs = SERVE_BS;
    int64_t maxk = 0;
    memset(d, 0, sizeof *d);
    d->cuq[0] = d->cuk[0] = 0;
    for (int b = 0; b < SERVE_SEQS; b++) {
        const int dec = b < SERVE_DECODE;
        const int32_t tq = dec ? 1 : SERVE_CHUNK;
        d->lk[b] = dec ? (int32_t)(256 + ((int64_t)b * (8192 - 256) + (SERVE_DECODE - 1) / 2) / (SERVE_DECODE - 1))
                       : SERVE_PREFIX + SERVE_CHUNK;
        d->cuq[b + 1] = d->cuq[b] + tq;
        d->cuk[b + 1] = d->cuk[b] + d->lk[b];
        maxk = d->lk[b] > maxk ? d->lk[b] : maxk;
        const int64_t pages = (d->lk[b] + bs - 1) / bs;
        d->nb += pages;
        d->M = pages > d->M ? pages : d->M;
    }
    const int64_t tq = d->cuq[SERVE_SEQS], tk = d->cuk[SERVE_SEQS];
    d->bt = malloc((size_t)(SERVE_SEQS * d->M) * sizeof(int32_t));
    d->q = alloc_floats(tq * SERVE_HQ * D);
    const size_t cache_bytes = (size_t)(d->nb * H * bs * D) * sizeof(float);
    const size_t packed_bytes = (size_t)(tk * H * D) * sizeof(float);
    d->kc = alloc_big(cache_bytes, huge), d->vc = alloc_big(cache_bytes, huge);
    d->kp = alloc_big(packed_bytes, huge), d->vp = alloc_big(packed_bytes, huge);
    for (int i = 0; i < SERVE_WAYS; i++)
        d->o[i] = alloc_floats(tq * SERVE_HQ * D);
    d->gk = alloc_floats(H * maxk * D), d->gv = alloc_floats(H * maxk * D);
    int ok = d->bt && d->q && d->kc && d->vc && d->kp && d->vp && d->gk && d->gv;
    for (int i = 0; i < SERVE_WAYS; i++)
        ok = ok && d->o[i];
    if (!ok) {
        serve_free(d);
        return -1;
    }
    /* pages: a fixed shuffle of 0..nb-1 handed out in order; unused table entries -1 */
    int32_t *perm = (int32_t *)d->gk; /* scratch: H * maxk * D >= nb entries */
    uint64_t s = 0x5eed;
    for (int64_t i = 0; i < d->nb; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = d->nb - 1; i > 0; i--) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const int64_t j = (int64_t)(s % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int64_t next = 0;
    for (int b = 0; b < SERVE_SEQS; b++)
        for (int64_t p = 0; p < d->M; p++)
            d->bt[b * d->M + p] = p < (d->lk[b] + bs - 1) / bs ? perm[next++] : -1;
    fill_random(d->q, tq * SERVE_HQ * D, 11);
    fill_random(d->kc, d->nb * H * bs * D, 12);
    fill_random(d->vc, d->nb * H * bs * D, 13);
    /* the packed copy: key j of sequence b, head h = slot j % bs of its page */
    for (int b = 0; b < SERVE_SEQS; b++)
        for (int64_t j = 0; j < d->lk[b]; j++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t page = d->bt[b * d->M + j / bs];
                const size_t src = (size_t)(((page * H + h) * bs + j % bs) * D);
                const size_t dst = (size_t)(((d->cuk[b] + j) * H + h) * D);
                memcpy(d->kp + dst, d->kc + src, (size_t)D * sizeof(float));
                memcpy(d->vp + dst, d->vc + src, (size_t)D * sizeof(float));
            }
    return 0;
}

/* Keys read once, query tokens, allowed (query, key) pairs of the first nseq sequences. */
static void serve_counts(const serve_data *d, int nseq, double *keys, double *tokens, double *pairs)
{
    *keys = *tokens = *pairs = 0.0;
    for (int b = 0; b < nseq; b++) {
        const int64_t tq = d->cuq[b + 1] - d->cuq[b], tk = d->lk[b];
        *keys += (double)tk;
        *tokens += (double)tq;
        for (int64_t i = 0; i < tq; i++)
            *pairs += (double)(tk - tq + i + 1); /* bottom-right causal */
    }
    *pairs *= SERVE_HQ;
}

static void serve_problem(sdpa_problem *p, int64_t B, int64_t tq, int64_t tk, int threads, sdpa_isa isa)
{
    sdpa_problem_init(p);
    p->batch = B, p->q_heads = SERVE_HQ, p->kv_heads = SERVE_HKV;
    p->q_len = tq, p->kv_len = tk, p->head_dim_qk = p->head_dim_v = SERVE_D;
    p->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p->num_threads = threads;
    p->isa = isa;
}

static int serve_setup(serve_ctx *x, const serve_data *d, int way, int nseq, int threads, sdpa_isa isa)
{
    memset(x, 0, sizeof *x);
    x->d = d, x->way = way, x->nseq = nseq, x->threads = threads, x->isa = isa;
    if (way == SERVE_GATHER)
        return 0;
    serve_problem(&x->pb, nseq, d->cuq[nseq], way == SERVE_PACKED ? d->cuk[nseq] : 0, threads, isa);
    x->seqs.cu_seqlens_q = d->cuq;
    if (way == SERVE_PACKED) {
        x->seqs.cu_seqlens_k = d->cuk;
    } else {
        x->seqs.block_table = d->bt;
        x->seqs.max_blocks_per_seq = d->M;
        x->seqs.seq_lens_k = d->lk;
        x->seqs.block_size = SERVE_BS;
        x->seqs.num_blocks = d->nb;
    }
    x->pb.seqs = &x->seqs;
    x->st = sdpa_forward_workspace_size(&x->pb, &x->ws_bytes);
    if (x->st != SDPA_OK)
        return -1;
    x->ws = malloc(x->ws_bytes ? x->ws_bytes : 1);
    if (!x->ws) {
        x->st = SDPA_ERR_OUT_OF_MEMORY;
        return -1;
    }
    return 0;
}

static int run_serve(void *p)
{
    serve_ctx *x = p;
    const serve_data *d = x->d;
    const int64_t H = SERVE_HKV, D = SERVE_D, bs = SERVE_BS, rowq = SERVE_HQ * D;
    float *o = d->o[x->way];
    if (x->way != SERVE_GATHER) {
        const int paged = x->way == SERVE_PAGED;
        const sdpa_tensor q = {d->q, 0, D, rowq};
        const sdpa_tensor k = paged ? (sdpa_tensor){d->kc, H * bs * D, bs * D, D} : (sdpa_tensor){d->kp, 0, D, H * D};
        const sdpa_tensor v = paged ? (sdpa_tensor){d->vc, H * bs * D, bs * D, D} : (sdpa_tensor){d->vp, 0, D, H * D};
        const sdpa_tensor_out to = {o, 0, D, rowq};
        x->st = sdpa_forward_with_workspace(&x->pb, &q, &k, &v, &to, NULL, x->ws, x->ws_bytes);
        return x->st != SDPA_OK;
    }
    for (int b = 0; b < x->nseq; b++) {
        const int64_t tq = d->cuq[b + 1] - d->cuq[b], tk = d->lk[b], pages = (tk + bs - 1) / bs;
        const int32_t *row = d->bt + b * d->M;
        float *gk = d->gk, *gv = d->gv;
        const float *kc = d->kc, *vc = d->vc;
        OMP(omp parallel for num_threads(x->threads) collapse(2) schedule(static))
        for (int64_t h = 0; h < H; h++)
            for (int64_t pg = 0; pg < pages; pg++) {
                const int64_t n = tk - pg * bs < bs ? tk - pg * bs : bs;
                const size_t src = (size_t)((row[pg] * H + h) * bs * D), dst = (size_t)((h * tk + pg * bs) * D);
                memcpy(gk + dst, kc + src, (size_t)(n * D) * sizeof(float));
                memcpy(gv + dst, vc + src, (size_t)(n * D) * sizeof(float));
            }
        sdpa_problem pb;
        serve_problem(&pb, 1, tq, tk, x->threads, x->isa);
        const sdpa_tensor q = {d->q + d->cuq[b] * rowq, tq * rowq, D, rowq};
        const sdpa_tensor k = {gk, H * tk * D, tk * D, D}, v = {gv, H * tk * D, tk * D, D};
        const sdpa_tensor_out to = {o + d->cuq[b] * rowq, tq * rowq, D, rowq};
        x->st = sdpa_forward(&pb, &q, &k, &v, &to, NULL);
        if (x->st != SDPA_OK)
            return 1;
    }
    return 0;
}

typedef struct serve_row {
    const char *impl, *isa, *part;
    int threads, reps, nseq;
    int huge_pages;     /* --huge-pages given */
    double bw_il_gbps;  /* decode rows: the read bandwidth timed interleaved with them (0: none) */
    double ms, tokens, keys, pairs, tokens_per_s, gbps, peak_gbps, gflops, ratio, max_abs_diff, rss_mb;
} serve_row;

static void emit_serve_row(out_state *st, const serve_row *r)
{
    if (!st->header_done) {
        fprintf(st->table, "%-13s %-7s %3s  %-6s %4s %6s %8s %10s %11s %8s %6s %8s %9s %10s\n", "impl", "isa",
                "thr", "part", "seqs", "tokens", "kv_keys", "ms", "tokens/s", "GB/s", "%bw", "GFLOP/s", "/paged",
                "maxdiff");
        st->header_done = 1;
    }
    char pb[16] = "-", ra[16] = "-", md[16] = "-";
    if (r->peak_gbps > 0.0)
        snprintf(pb, sizeof pb, "%.1f", 100.0 * r->gbps / r->peak_gbps);
    if (r->ratio > 0.0)
        snprintf(ra, sizeof ra, "%.3fx", r->ratio);
    if (r->max_abs_diff >= 0.0)
        snprintf(md, sizeof md, "%.1e", r->max_abs_diff);
    fprintf(st->table, "%-13s %-7s %3d  %-6s %4d %6.0f %8.0f %10.3f %11.1f %8.2f %6s %8.2f %9s %10s\n", r->impl,
            r->isa, r->threads, r->part, r->nseq, r->tokens, r->keys, r->ms, r->tokens_per_s, r->gbps, pb, r->gflops,
            ra, md);
    fflush(st->table);
    if (!st->o->json)
        return;
    printf("{\"impl\":\"%s\",\"op\":\"forward\",\"isa\":\"%s\",\"threads\":%d,\"serve\":\"%s\",\"dtype\":\"fp32\"",
           r->impl, r->isa, r->threads, r->part);
    printf(",\"seqs\":%d,\"Hq\":%d,\"Hkv\":%d,\"Dk\":%d,\"Dv\":%d,\"block_size\":%d", r->nseq, SERVE_HQ, SERVE_HKV,
           SERVE_D, SERVE_D, SERVE_BS);
    json_num("tokens", r->tokens);
    json_num("kv_keys", r->keys);
    json_num("ms", r->ms);
    json_num("tokens_per_s", r->tokens_per_s);
    json_num("gbps", r->gbps);
    json_num("peak_gbps", r->peak_gbps > 0.0 ? r->peak_gbps : NAN);
    json_num("pct_bw", r->peak_gbps > 0.0 ? 100.0 * r->gbps / r->peak_gbps : NAN);
    json_num("gflops", r->gflops);
    json_num("pairs", r->pairs);
    if (r->ratio > 0.0)
        json_num("ratio_vs_paged", r->ratio);
    if (r->max_abs_diff >= 0.0)
        json_num("max_abs_diff_vs_paged", r->max_abs_diff);
    if (r->bw_il_gbps > 0.0) {
        json_num("bw_interleaved_gbps", r->bw_il_gbps);
        json_num("pct_bw_interleaved", 100.0 * r->gbps / r->bw_il_gbps);
    }
    json_num("rss_mb", r->rss_mb);
    printf(",\"huge_pages\":%s", r->huge_pages ? "true" : "false");
    printf(",\"reps\":%d,\"version\":\"%s\"}\n", r->reps, sdpa_version());
    fflush(stdout);
}

static double serve_max_diff(const float *a, const float *b, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= m))
            m = e; /* NaN wins */
    }
    return m;
}

static int serve_pass(const options *o, const limits *L, out_state *st)
{
    serve_data d;
    if (serve_alloc(&d, o->huge_pages) != 0) {
        fputs("sdpa bench: error: --serve: out of memory (the step needs about 2.5 GB)\n", stderr);
        return 1;
    }
    const sdpa_isa isa = o->isas[o->n_isas - 1]; /* the best ISA asked for */
    int failed = 0;
    /* The decode rows also time the bandwidth test's read of a --bw-mib buffer,
     * interleaved with them run by run: the header's bandwidth is measured once,
     * before, and on this kind of shared machine the bandwidth a process gets
     * moves from minute to minute. */
    int64_t n_read = 0;
    uint64_t *read_buf = alloc_read_buf(o, &n_read);
    evict_list read_ev = {0};
    evict_add(&read_ev, read_buf, n_read, sizeof(uint64_t));
    const evict_list *evp[SERVE_WAYS + 1] = {NULL, NULL, NULL, &read_ev};
    if (o->huge_pages) {
        const double kv_mib = (double)(2 * d.nb * SERVE_HKV * SERVE_BS * SERVE_D + 2 * (int64_t)d.cuk[SERVE_SEQS] *
                                                                                   SERVE_HKV * SERVE_D) *
                              sizeof(float) / (1024.0 * 1024.0);
        fprintf(st->table, "# --huge-pages: this process has %.0f MiB in transparent huge pages (AnonHugePages; "
                           "K/V caches and packed copy %.0f MiB)",
                anon_huge_mib(), kv_mib);
        if (L->measured)
            fprintf(st->table, "; bandwidth buffer %.0f of %.0f MiB", L->bw_huge_mib, L->bw_mib);
        fputc('\n', st->table);
    }
    for (int ti = 0; ti < o->n_threads; ti++)
        for (int part = 0; part < 2; part++) { /* the whole step, then its decode rows alone */
            const int nseq = part == 0 ? SERVE_SEQS : SERVE_DECODE;
            serve_ctx x[SERVE_WAYS];
            run_fn fns[SERVE_WAYS + 1];
            void *ctxs[SERVE_WAYS + 1];
            timing t[SERVE_WAYS + 1];
            int bad = 0, bad_k = 0;
            for (int w = 0; w < SERVE_WAYS; w++) {
                bad |= serve_setup(&x[w], &d, w, nseq, o->threads[ti], isa) != 0;
                fns[w] = run_serve;
                ctxs[w] = &x[w];
            }
            read_ctx rd = {read_buf, n_read, o->threads[ti], 0};
            const int with_read = part == 1 && read_buf;
            fns[SERVE_WAYS] = run_read, ctxs[SERVE_WAYS] = &rd;
            if (bad || time_interleaved(SERVE_WAYS + with_read, fns, ctxs, o, evp, t, &bad_k) != 0) {
                for (int w = 0; w < SERVE_WAYS; w++)
                    if (x[w].st != SDPA_OK)
                        fprintf(stderr, "sdpa bench: error: --serve %s: %s\n", serve_impl[w],
                                sdpa_status_string(x[w].st));
                failed = 1;
            } else {
                double keys, tokens, pairs;
                serve_counts(&d, nseq, &keys, &tokens, &pairs);
                const int64_t n_out = (int64_t)d.cuq[nseq] * SERVE_HQ * SERVE_D;
                for (int w = 0; w < SERVE_WAYS; w++) {
                    serve_row r;
                    memset(&r, 0, sizeof r);
                    r.impl = serve_impl[w], r.isa = sdpa_isa_name(isa), r.part = part ? "decode" : "step";
                    r.threads = o->threads[ti], r.reps = t[w].reps, r.nseq = nseq;
                    r.ms = t[w].median_s * 1e3;
                    r.tokens = tokens, r.keys = keys, r.pairs = pairs;
                    r.tokens_per_s = tokens / t[w].median_s;
                    r.gbps = keys * SERVE_HKV * 2.0 * SERVE_D * sizeof(float) / t[w].median_s * 1e-9;
                    r.peak_gbps = L->bw[ti];
                    r.gflops = 2.0 * pairs * 2.0 * SERVE_D / t[w].median_s * 1e-9;
                    r.ratio = w == 0 ? -1.0 : t[w].median_s / t[0].median_s;
                    r.max_abs_diff = w == 0 ? -1.0 : serve_max_diff(d.o[w], d.o[0], n_out);
                    r.rss_mb = peak_rss_mb();
                    r.huge_pages = o->huge_pages;
                    r.bw_il_gbps = with_read ? (double)n_read * sizeof(uint64_t) / t[SERVE_WAYS].median_s * 1e-9 : 0.0;
                    emit_serve_row(st, &r);
                }
                if (with_read) {
                    const double il = (double)n_read * sizeof(uint64_t) / t[SERVE_WAYS].median_s * 1e-9;
                    const double paged = keys * SERVE_HKV * 2.0 * SERVE_D * sizeof(float) / t[0].median_s * 1e-9;
                    fprintf(st->table, "# read bandwidth timed interleaved with these decode rows (median of %d "
                                       "flushed reads of %d MiB, %d thread%s): %.1f GB/s; sdpa-paged decode %.1f%% "
                                       "of it\n",
                            t[SERVE_WAYS].reps, o->bw_mib, o->threads[ti], o->threads[ti] > 1 ? "s" : "", il,
                            100.0 * paged / il);
                }
            }
            if (rd.sum == 42)
                peak_sink = 1.0f;
            for (int w = 0; w < SERVE_WAYS; w++)
                free(x[w].ws);
        }
    free(read_buf);
    serve_free(&d);
    return failed;
}

/* ------------------------------------------------------------ main */

static void print_header(FILE *f, const options *o, const limits *L)
{
    fprintf(f, "# sdpa bench: libsdpa %s, active ISA %s, OpenMP max threads %d%s\n", sdpa_version(),
            sdpa_isa_name(sdpa_isa_active()), max_threads(), HAVE_OPENMP ? "" : " (built without OpenMP)");
    fprintf(f, "# CPU features: %s\n", sdpa_cpu_features());
    const char *bind = getenv("OMP_PROC_BIND");
    fprintf(f, "# OpenMP thread binding: OMP_PROC_BIND=%s\n", bind ? bind : "(unset: the OS places the threads)");
    fprintf(f, "# ISAs timed:");
    for (int i = 0; i < o->n_isas; i++)
        fprintf(f, " %s", sdpa_isa_name(o->isas[i]));
    fprintf(f, "; threads:");
    for (int i = 0; i < o->n_threads; i++)
        fprintf(f, "%s%d", i ? "," : " ", o->threads[i]);
    fprintf(f, "; median of up to %d runs after %d warm-up (CLOCK_MONOTONIC), ~%.3g s per row\n",
            o->reps, o->warmup, o->max_time);
    fprintf(f, "# FLOPs: forward 2*P*(Dk+Dv), backward 2*P*(3*Dk+2*Dv), P = allowed (query,key) "
               "pairs; decode (Tq <= %d) GB/s = K and V bytes read once / time\n",
            DECODE_MAX_TQ);
    if (L->measured) {
        for (int ti = 0; ti < o->n_threads; ti++) {
            fprintf(f, "# limits, %d thread%s: fp32 FMA peak", o->threads[ti], o->threads[ti] > 1 ? "s" : "");
            for (int i = 0; i < SDPA_ISA_COUNT; i++)
                if (L->peak[i][ti] > 0.0 && i != SDPA_ISA_AMX)
                    fprintf(f, " %s %.1f", sdpa_isa_name((sdpa_isa)i), L->peak[i][ti]);
            fprintf(f, " GFLOP/s;");
            if (L->peak[SDPA_ISA_AMX][ti] > 0.0)
                fprintf(f, " AMX bf16 tile peak %.1f GFLOP/s;", L->peak[SDPA_ISA_AMX][ti]);
            if (L->bw[ti] > 0.0)
                fprintf(f, " memory read %.1f GB/s (%.0f MiB buffer%s)\n", L->bw[ti], L->bw_mib,
                        o->huge_pages ? ", MADV_HUGEPAGE" : "");
            else
                fprintf(f, " memory read not measured (a %.0f MiB buffer could not be allocated)\n", L->bw_mib);
        }
        fprintf(f, "# (peaks: best of many 2 ms register-resident FMA loops; the scalar one chains "
                   "non-vectorised a*b+c, as the scalar kernels do%s)\n",
                L->peak[SDPA_ISA_AMX][0] > 0.0 ? "; the AMX one 2 x 2 accumulator tiles of tdpbf16ps. %peak of an "
                                                 "amx row: of the AMX peak for a bf16 prefill, else of avx512's"
                                               : "");
        /* A multi-thread peak far below n x the 1-thread one means other processes held cores. */
        int ti1 = -1;
        for (int ti = 0; ti < o->n_threads; ti++)
            if (o->threads[ti] == 1)
                ti1 = ti;
        for (int ti = 0; ti1 >= 0 && ti < o->n_threads; ti++)
            for (int i = SDPA_ISA_SCALAR + 1; i < SDPA_ISA_COUNT; i++)
                if (o->threads[ti] > 1 && o->threads[ti] <= max_threads() && L->peak[i][ti1] > 0.0 &&
                    L->peak[i][ti] < 0.8 * o->threads[ti] * L->peak[i][ti1]) {
                    fprintf(f, "# note: the %d-thread %s peak is under 80%% of %d x the 1-thread one: "
                               "other processes were probably using the cores; %% of peak at %d "
                               "threads overstates\n",
                            o->threads[ti], sdpa_isa_name((sdpa_isa)i), o->threads[ti], o->threads[ti]);
                    break; /* one note per thread count */
                }
    } else {
        fprintf(f, "# limits not measured (--no-limits)\n");
    }
    if (o->show_dtype) {
        fprintf(f, "# types (--dtype):");
        for (int i = 0; i < o->n_dtypes; i++)
            fprintf(f, "%s %s", i ? "," : "", dtype_names[o->dtypes[i]]);
        fprintf(f, "; Q, K, V, O (dO, dQ, dK, dV) stored in the row's type, LSE fp32; decode GB/s count "
                   "K and V in that type; naive-blas rows are fp32\n");
    }
    if (o->serve)
        fprintf(f, "# --serve: one step of %d decode rows (contexts 256..8192) + %d prefill chunks of %d over %d "
                   "cached keys (causal bottom-right), Hq %d, Hkv %d, D %d, pages of %d keys (HND, shuffled); "
                   "ISA %s; step and decode-only, each way interleaved; GB/s = K and V of every sequence read "
                   "once / time; /paged = ms / sdpa-paged ms\n",
                SERVE_DECODE, SERVE_PREFILL, SERVE_CHUNK, SERVE_PREFIX, SERVE_HQ, SERVE_HKV, SERVE_D, SERVE_BS,
                sdpa_isa_name(o->isas[o->n_isas - 1]));
    if (o->any_forms && !o->serve)
        fprintf(f, "# key padding as a mask (padding-bool (B,1,1,Tk), padding-bool-4d (B,1,Tq,Tk) uint8; "
                   "padding-bias, padding-bias-4d 0/-inf fp32): the key lengths of padding, each timed "
                   "interleaved with padding (kv_lengths); /kv_lengths = ms / kv_lengths ms of the same run\n");
    if (o->n_variants > 0) {
        fprintf(f, "# attention variants:");
        for (int i = 0; i < o->n_variants; i++)
            fprintf(f, "%s %s", i ? "," : "", o->variants[i].name);
        if (o->softcap != 0.0f)
            fprintf(f, "; softcap C = %g", (double)o->softcap);
        if (o->alibi)
            fprintf(f, "; ALiBi slopes 2^(-8(h+1)/Hq)");
        if (o->sinks)
            fprintf(f, "; sinks %g per head (backward: with dsinks)", (double)SINK_VALUE);
        fprintf(f, "\n# each timed interleaved with the plain kernel (same shape, ISA, threads); "
                   "/plain = variant ms / plain ms of the same run\n");
    }
#ifdef SDPA_BENCH_HAVE_OPENBLAS
    if (o->naive) {
        const int par = blas.get_parallel(); /* 0 sequential, 1 its own pthreads, 2 OpenMP */
        fprintf(f, "# naive-blas: %s (core %s, threads: %s)\n", blas.get_config(), blas.get_corename(),
                par == 2 ? "OpenMP" : par == 1 ? "own pthread pool" : "none");
        if (par == 1)
            fprintf(f, "# note: this OpenBLAS runs its own thread pool, which spins when the library loads; "
                       "OpenMP threads started meanwhile may share one CPU for the whole process (seen: "
                       "2-thread rows 8x slower). Build with OpenBLAS on OpenMP (Debian: "
                       "libopenblas-openmp-dev), or set OPENBLAS_NUM_THREADS=1 or OMP_PROC_BIND=true\n");
    }
#endif
    fflush(f);
}

int sdpa_bench_main(int argc, char **argv)
{
    options *o = calloc(1, sizeof *o);
    double *scalar_ms = calloc((size_t)N_DTYPES * MAX_CASES * 2 * MAX_LIST, sizeof(double));
    limits L;
    if (!o || !scalar_ms) {
        free(o), free(scalar_ms);
        fputs("sdpa bench: error: out of memory\n", stderr);
        return 1;
    }
    int rc = parse_options(argc, argv, o);
    if (rc != 0) {
        free(o), free(scalar_ms);
        return rc == 1 ? 0 : rc; /* 1: --help */
    }
    memset(&L, 0, sizeof L);
    if (o->limits || o->limits_only)
        measure_limits(o, &L);
    out_state st = {o->json ? stderr : stdout, 0, o};
    print_header(st.table, o, &L);
    if (o->limits_only) {
        free(o);
        free(scalar_ms);
        return 0;
    }
    /* the OpenMP team of the largest thread count started before the first timed run, so
     * that no row (with --warmup 0 the first one) times the runtime creating its threads */
    int nt_max = 1;
    for (int i = 0; i < o->n_threads; i++)
        nt_max = o->threads[i] > nt_max ? o->threads[i] : nt_max;
    volatile int started = 0;
    OMP(omp parallel num_threads(nt_max))
    {
        OMP(omp atomic)
        started++;
    }
    (void)started;
    if (o->serve) {
        const int failed = serve_pass(o, &L, &st);
        free(o);
        free(scalar_ms);
        return failed ? 1 : 0;
    }
    int failed = sdpa_pass(o, &L, &st, scalar_ms);
#ifdef SDPA_BENCH_HAVE_OPENBLAS
    if (o->naive)
        failed |= naive_pass(o, &L, &st, scalar_ms);
#endif
    free(o);
    free(scalar_ms);
    return failed ? 1 : 0;
}
